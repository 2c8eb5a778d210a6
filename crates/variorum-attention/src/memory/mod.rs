//! Attention over a memory of earlier segments read by nearest neighbours (docs/memory.md).

pub(crate) mod knn_memory;
pub(crate) mod memorizing;
