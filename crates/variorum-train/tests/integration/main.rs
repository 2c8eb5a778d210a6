//! The trainer's integration tests (training, checkpoints, inference, retrieval, the report in a
//! browser, hostile files, …), one module per file, built as one test binary.

mod common;

mod decision;
mod early_exit;
mod encoder_decoder;
mod graph;
mod hf_export;
mod hf_import;
mod hostile_files;
mod inference;
mod knn_lm;
mod lora;
mod memorizing;
mod peft;
mod prepared;
mod report_browser;
mod reversible;
mod sac;
mod spalm;
mod training;
