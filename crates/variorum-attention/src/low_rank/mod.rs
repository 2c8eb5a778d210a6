//! Low-rank and summarising kinds (docs/low-rank.md): keys and values projected, pooled,
//! clustered or compressed along the length, or only some queries attending.

pub(crate) mod clustered;
pub(crate) mod inducing_points;
pub(crate) mod linformer;
pub(crate) mod low_rank_band;
pub(crate) mod memory_compressed;
pub(crate) mod nystrom;
pub(crate) mod poolingformer;
pub(crate) mod prob_sparse;
