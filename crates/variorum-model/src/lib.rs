//! The zoo: models composed from the axes of a config. For now the decoder-only language model.

pub mod config;
pub mod decoder;
pub mod exit_predictor;
pub mod exits;
pub mod zoo;

pub use config::ModelConfig;
pub use decoder::{DecoderLm, DecoderState, LmOutput};
pub use exit_predictor::{ExitPredictor, Oracle, PredictorKind};
pub use exits::{EveryLayerConfig, ExitConfig};
