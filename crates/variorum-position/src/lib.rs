//! Position encodings.
//!
//! Absolute schemes are added to the token embeddings once, before the first block
//! ([`AbsolutePositionConfig`]). Relative schemes act inside attention (on q/k or on the score
//! matrix) and receive the absolute positions carried by the attention contract
//! (`variorum_core::AttentionMask::{q_start, k_start}`).

pub mod absolute;
pub mod learned;
pub mod sinusoidal;

pub use absolute::{AbsolutePosition, AbsolutePositionConfig};
pub use learned::{LearnedPosition, LearnedPositionConfig};
pub use sinusoidal::{SinusoidalPosition, SinusoidalPositionConfig};
