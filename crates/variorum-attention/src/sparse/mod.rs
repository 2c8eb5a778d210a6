//! Fixed sparse patterns (docs/sparse-attention.md): windows, blocks, strides, global tokens,
//! random blocks, spans.

pub(crate) mod adaptive_span;
pub(crate) mod bigbird;
pub(crate) mod blockwise;
pub(crate) mod etc;
pub(crate) mod fixed;
pub(crate) mod local;
pub(crate) mod local_2d;
pub(crate) mod longformer;
pub(crate) mod multi_scale;
pub(crate) mod sliding_window;
pub(crate) mod strided;
