//! Residual wiring and the pieces written once for every block: norms, feed-forward variants.
//!
//! ```
//! use burn::prelude::*;
//! use variorum_block::{FeedForwardConfig, FeedForwardKind, NormKind};
//!
//! // a pre-norm residual feed-forward: x + SwiGLU(RMSNorm(x))
//! let config = FeedForwardConfig { kind: FeedForwardKind::Swiglu, d_ff: Some(32), ..Default::default() };
//! config.validate().unwrap();
//! let device = Device::flex();
//! let ffn = config.init(16, 0.0, 0.02, 0.02, &device);
//! let norm = NormKind::RmsNorm.init(16, 1e-5, &device);
//! let x = Tensor::<3>::ones([2, 5, 16], &device);
//! let y = x.clone() + ffn.forward(norm.forward(x));
//! assert_eq!(y.dims(), [2, 5, 16]);
//! ```

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
pub use reversible::{ReplayDropout, RevContext, ReversibleConfig, StreamMerge, Streams};
pub use universal::{Act, ActState, DepthConfig, UniversalConfig};
pub use xl_memory::XlMemoryConfig;
