//! Training, evaluation and sampling for variorum models: the experiment config, the training loop
//! with atomic checkpoints and exact resume, metrics, evaluation, generation and the benchmarks.
//! Two groups read a run without training it: [`pictures`] (the HTML report, charts, heatmaps,
//! patterns) and [`retrieval`] (kNN-LM and SPALM over a trained run).

#![warn(missing_docs)]

pub mod adamw;
pub mod allocator;
pub mod attention_bench;
pub mod bench;
pub mod checkpoint;
pub mod chrf;
pub mod clip;
pub mod collaborate;
pub mod config;
pub mod decision;
pub mod early_exit;
pub mod eval;
pub mod eval_record;
pub mod freeze;
pub mod generate;
pub mod hf;
pub mod listing;
pub mod lock;
pub mod lora;
pub mod metrics;
pub mod pictures;
pub mod prepared;
pub mod progress;
pub mod retrieval;
pub mod run;
pub mod schedule;
pub mod seq2seq;
pub mod snapshot;
pub mod step;
pub mod threads;
pub mod trainer;
pub mod transfer;
pub mod weights;

pub use config::{ExperimentConfig, TrainConfig};
pub use trainer::{Outcome, Summary, TrainOptions, train};
