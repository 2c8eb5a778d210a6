//! Pattern machinery the sparse and content-based kinds share: one forward of a pattern
//! (blocks, decoded runs, the dense definition), band attention, and sorted chunks with their kernel.

pub(crate) mod adjacent_chunks;
pub(crate) mod band_attention;
pub(crate) mod call;
pub(crate) mod sorted_chunks;
pub(crate) mod sorted_kernel;
