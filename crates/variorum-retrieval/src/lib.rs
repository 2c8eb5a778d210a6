//! Nearest-neighbour memories for language models, free of any tensor backend.
//!
//! - [`datastore`]: the on-disk datastore of (key, next token) pairs a kNN-LM retrieves from —
//!   its documented format, a writer that resumes after an interruption, a memory-mapped reader.
//! - [`search`]: exact search (the reference) and the HNSW index (`usearch`) over a datastore's
//!   keys, both with a causal filter.
//! - [`knn`]: the kNN-LM distribution and its interpolation with the LM (Khandelwal et al. 2020).
//! - [`neighbours`]: neighbour tables, a text's retrieved next tokens searched once and kept on
//!   disk, which SPALM (Yogatama et al. 2021) reads while it trains.

#![warn(missing_docs)]

pub mod datastore;
/// The crate's error type, [`RetrievalError`], and its [`Result`](error::Result).
pub mod error;
pub mod knn;
pub mod neighbours;
pub mod search;

pub use datastore::{Datastore, DatastoreWriter, Meta, Origin};
pub use error::RetrievalError;
pub use knn::{KnnConfig, knn_distribution, mix_logprob, mix_logprobs};
pub use neighbours::{NeighbourTable, TableOrigin, TableWriter};
pub use search::{Neighbour, SearchMode};
