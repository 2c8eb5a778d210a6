//! The shared multi-head engine: settings, projections, scores, masking, normalisers, the
//! heads' auxiliary losses, and the paths that compute a forward (fused kernel, blocks, composed).

pub(crate) mod band;
pub(crate) mod blocks;
pub(crate) mod config;
pub(crate) mod forward;
pub(crate) mod gathered;
pub(crate) mod head_losses;
pub(crate) mod heads;
pub(crate) mod normaliser;
pub(crate) mod projections;
pub(crate) mod qkv;
pub(crate) mod sparse_kernel;
