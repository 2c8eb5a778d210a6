//! Shared vocabulary of variorum: the attention contract (inputs, masks, outputs), capability
//! declarations read by validation, `variorum zoo` and the generic tests, and config errors.
//!
//! Nothing here depends on a backend: every crate of the workspace is written against Burn's
//! runtime `Device` and `Tensor<D, K>`; the binary picks the backend.

pub mod capability;
pub mod error;
pub mod mask;

pub use capability::{Capabilities, KindInfo};
pub use error::ConfigError;
pub use mask::{AttentionMask, GlobalLocal};

/// Named auxiliary losses a forward pass adds to the language-model loss (already weighted).
pub type AuxLosses = Vec<(String, burn::Tensor<1>)>;
