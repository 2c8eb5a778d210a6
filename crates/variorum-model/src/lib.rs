//! The zoo: models composed from the axes of a config: the transformer language model, trained
//! left to right (next token) or as a masked language model (bidirectional).

#![warn(missing_docs)]

pub mod config;
pub mod decoder;
pub mod encoder;
pub mod exit_predictor;
pub mod exits;
pub mod harness;
pub mod long_term_memory;
pub mod objective;
mod param_ids;
pub mod reversible_grads;
pub mod rules;
pub mod zoo;

pub use config::ModelConfig;
pub use decoder::{DecoderLm, DecoderState, LmOutput, Rows};
pub use encoder::{Encoder, EncoderConfig, ModelKind, Source};
pub use exit_predictor::{ExitPredictor, Oracle, PredictorKind};
pub use exits::{EveryLayerConfig, ExitConfig, ExitWeighting};
pub use long_term_memory::{LongTermMemory, LongTermMemoryConfig};
pub use objective::{MaskedConfig, ObjectiveConfig, SpanCorruptionConfig};
