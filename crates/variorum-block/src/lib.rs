//! Residual wiring and the pieces written once for every block: norms, feed-forward variants.

#![warn(missing_docs)]

pub mod block;
pub mod compression;
pub mod compressive;
pub mod cross;
pub mod dense_ffn;
pub mod feed_forward;
pub mod glu;
pub mod gtrxl;
pub mod memory;
pub mod norm;
pub mod placement;
pub mod reversible;
pub mod separable_conv;
pub mod universal;
pub mod xl_memory;

pub use block::{BlockConfig, BlockKind, BlockOutput, LayerState, ResidualConfig, TransformerBlock};
pub use compression::{CompressionKind, Compressor};
pub use compressive::CompressiveMemoryConfig;
pub use cross::CrossAttention;
pub use feed_forward::{FeedForward, FeedForwardActivation, FeedForwardConfig, FeedForwardKind};
pub use gtrxl::{GtrxlConfig, GtrxlGate};
pub use memory::{LayerMemory, MemoryConfig, MemoryKind, MemoryState, NoMemoryConfig};
pub use norm::{Norm, NormKind};
pub use placement::{PostLnConfig, PreLnConfig};
pub use reversible::{ReplayDropout, RevContext, ReversibleConfig, Streams};
pub use universal::{Act, ActState, DepthConfig, UniversalConfig};
pub use xl_memory::XlMemoryConfig;
