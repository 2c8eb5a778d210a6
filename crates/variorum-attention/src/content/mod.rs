//! Content-based sparsity (docs/reformer.md): keys and queries sorted into buckets, clusters
//! or blocks by what they contain.

pub(crate) mod lsh;
pub(crate) mod routing;
pub(crate) mod sinkhorn;
