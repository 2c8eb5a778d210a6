//! Structured attention (docs/structured-attention.md): trees of spans, graphs, and learned
//! sparse edges.

pub(crate) mod bpt;
pub(crate) mod graph;
pub(crate) mod sac;
