//! Nearest-neighbour memories for language models, free of any tensor backend.
//!
//! - [`datastore`]: the on-disk datastore of (key, next token) pairs a kNN-LM retrieves from —
//!   its documented format, a writer that resumes after an interruption, a memory-mapped reader.
//! - [`search`]: exact search (the reference) and the HNSW index (`usearch`) over a datastore's
//!   keys, both with a causal filter.
//! - [`knn`]: the kNN-LM distribution and its interpolation with the LM (Khandelwal et al. 2020).
//! - [`neighbours`]: neighbour tables, a text's retrieved next tokens searched once and kept on
//!   disk, which SPALM (Yogatama et al. 2021) reads while it trains.
//!
//! ```
//! use variorum_retrieval::{knn_distribution, mix_logprob, search};
//!
//! // three stored keys of dimension 2, each with the token that followed it
//! let keys = [0.0, 0.0, 1.0, 0.0, 5.0, 5.0];
//! let next_token = [7u32, 7, 9];
//! let nearest = search::exact(&keys, 2, &[0.2, 0.0], 2, &[]);
//! assert_eq!(nearest[0].iter().map(|n| n.id).collect::<Vec<_>>(), [0, 1]);
//! // both neighbours say token 7: p_kNN(7) = 1, and λ = 0.25 mixes it into the LM's
//! let p = knn_distribution(&nearest[0], 1.0, |id| next_token[id as usize]);
//! assert_eq!(p, [(7, 1.0)]);
//! let mixed = mix_logprob(0.5f64.ln(), Some(1.0), 0.25);
//! assert!((mixed - (0.75 * 0.5 + 0.25f64).ln()).abs() < 1e-12);
//! ```

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
