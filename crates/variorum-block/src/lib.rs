//! Residual wiring and the pieces written once for every block: norms, feed-forward variants.

pub mod block;
pub mod compression;
pub mod feed_forward;
pub mod gtrxl;
pub mod memory;
pub mod norm;
pub mod reversible;
pub mod universal;

pub use block::{BlockConfig, BlockOutput, GtrxlConfig, LayerState, TransformerBlock};
pub use compression::{CompressionKind, Compressor};
pub use feed_forward::{FeedForward, FeedForwardConfig, FeedForwardKind};
pub use gtrxl::GtrxlGate;
pub use memory::{CompressiveMemoryConfig, LayerMemory, MemoryConfig, MemoryState, XlMemoryConfig};
pub use norm::{Norm, NormKind};
pub use reversible::{ReplayDropout, RevContext, Streams};
pub use universal::{Act, ActState, DepthConfig, UniversalConfig};
