//! Position encodings, the `model.position` axis ([`PositionConfig`]).
//!
//! Absolute schemes are added to the token embeddings before the first block (or before every
//! block: per-layer learned tables, the Universal Transformer's timestep signal) —
//! [`AbsolutePosition`]. Relative schemes act inside attention, on q/k or on the score matrix,
//! and receive the absolute positions of the attention contract through a [`ScoreLayout`] —
//! [`RelativePosition`]. One file per scheme, its defining equation in the doc comment.
//!
//! ```
//! use burn::prelude::*;
//! use variorum_position::RotaryConfig;
//!
//! // RoPE: a rotated query and key score the same wherever they stand, as long as they stand
//! // as far apart
//! let device = Device::flex();
//! let rope = RotaryConfig::default().init(8);
//! let q = Tensor::<1>::from_floats([1.0, 0.5, -1.0, 2.0, 0.0, 1.5, 1.0, -0.5], &device).reshape([1, 1, 1, 8]);
//! let k = Tensor::<1>::from_floats([0.5, -1.0, 2.0, 0.0, 1.0, 1.0, -0.5, 3.0], &device).reshape([1, 1, 1, 8]);
//! let score = |at_q: usize, at_k: usize| {
//!     (rope.rotate(q.clone(), at_q) * rope.rotate(k.clone(), at_k)).sum().into_scalar::<f32>()
//! };
//! assert!((score(3, 1) - score(9, 7)).abs() < 1e-4);
//! assert!((score(3, 1) - score(3, 2)).abs() > 1e-3);
//! ```

#![warn(missing_docs)]

pub mod alibi;
pub mod axial;
pub mod deberta;
pub mod distance_aware;
pub mod kind;
pub mod layout;
pub mod learned;
pub mod multiplicative;
pub mod none;
pub mod registry;
pub mod rope;
pub mod shaw;
pub mod sinusoidal;
pub mod t5;
pub mod timestep;
pub mod transformer_xl;
pub mod untied;

pub use alibi::{AlibiBias, AlibiConfig, alibi_slopes};
pub use axial::{AxialPosition, AxialPositionConfig};
pub use deberta::{DebertaConfig, Disentangled, P2cDistance};
pub use distance_aware::{DistanceAware, DistanceAwareConfig};
pub use kind::{AbsoluteSignal, DistanceBias, HeadShape, PackedHeads, PositionKind, RelativeScheme, TermsFor};
pub use layout::{Distances, ScoreLayout};
pub use learned::{LearnedPosition, LearnedPositionConfig};
pub use multiplicative::{MultiplicativeConfig, MultiplicativePosition};
pub use none::NoPositionConfig;
pub use registry::{AbsolutePosition, PositionConfig, RelativePosition};
pub use rope::{RopeLayout, RotaryConfig, RotaryEmbedding};
pub use shaw::{ShawConfig, ShawRelative};
pub use sinusoidal::{SinusoidalPosition, SinusoidalPositionConfig};
pub use t5::{T5Bias, T5BiasConfig, t5_bucket};
pub use timestep::{TimestepConfig, TimestepEncoding};
pub use transformer_xl::{XlRelative, XlRelativeConfig, relative_shift};
pub use untied::{Untied, UntiedConfig};
