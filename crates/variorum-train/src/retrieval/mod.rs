//! Retrieval over a trained run: the kNN-LM's datastore and interpolation, and SPALM's neighbour
//! tables for a model with a long-term memory.

pub mod knn_lm;
pub mod spalm;
