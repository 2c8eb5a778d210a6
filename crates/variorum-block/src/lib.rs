//! Residual wiring and the pieces written once for every block: norms, feed-forward variants.

pub mod block;
pub mod feed_forward;
pub mod norm;

pub use block::{BlockConfig, BlockOutput, TransformerBlock};
pub use feed_forward::{FeedForward, FeedForwardConfig, FeedForwardKind};
pub use norm::{Norm, NormKind};
