//! The zoo: models composed from the axes of a config: the transformer language model, trained
//! left to right (next token) or as a masked language model (bidirectional).
//!
//! A model from the `[model]` table of an experiment file, checked, built and run on token ids:
//!
//! ```
//! use burn::prelude::*;
//! use variorum_model::ModelConfig;
//!
//! let config: ModelConfig = toml::from_str(
//!     "vocab_size = 11\nd_model = 32\nn_layers = 2\nseq_len = 16\n\
//!      [attention]\nkind = \"full\"\nn_heads = 4\n[position]\nkind = \"rope\"",
//! )
//! .unwrap();
//! config.validate().unwrap();
//! let device = Device::flex();
//! let model = config.init(&device);
//! let tokens = Tensor::<2, Int>::zeros([1, 16], &device);
//! assert_eq!(model.forward(tokens).logits.dims(), [1, 16, 11]);
//! ```

#![warn(missing_docs)]

pub mod config;
pub mod cpc;
pub mod decision;
pub mod decoder;
pub mod encoder;
pub mod exit_predictor;
pub mod exits;
pub mod harness;
mod head_transform;
pub mod long_term_memory;
pub mod objective;
mod param_ids;
pub mod reversible_grads;
pub mod rules;
mod tied_positions;
pub mod zoo;

pub use config::ModelConfig;
pub use cpc::{Cpc, HiddenSegments};
pub use decision::{ActionInputs, ActionKind, DecisionConfig, DecisionOutput, DecisionTransformer, StepInputs};
pub use decoder::{DecoderLm, DecoderState, LmOutput, Rows};
pub use encoder::{Encoder, EncoderConfig, ModelKind, Source};
pub use exit_predictor::{ExitPredictor, Oracle, PredictorKind};
pub use exits::{EveryLayerConfig, ExitConfig, ExitTraining, ExitWeighting};
pub use head_transform::HeadTransform;
pub use long_term_memory::{LongTermMemory, LongTermMemoryConfig};
pub use objective::{CpcConfig, MaskedConfig, ObjectiveConfig, SpanCorruptionConfig};
pub use param_ids::path_ids;
