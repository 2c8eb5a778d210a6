//! The attention kinds' integration tests, one module per kind or mechanism, built as one test
//! binary (one link of Burn instead of one per file).

mod common;

mod band_attention;
mod clustered;
mod cross;
mod etc;
mod gathered_patterns;
mod inducing_points;
mod kernel_attention;
mod linformer;
mod longformer;
mod low_rank_band;
mod lsh;
mod max_back;
mod memory_compressed;
mod nystrom;
mod poolingformer;
mod prob_sparse;
mod relative_position;
mod routing;
mod sinkhorn;
