//! Text data for variorum: reading a corpus, tokenizing it (char, byte or BPE),
//! and cutting the token ids into training and evaluation batches, optionally
//! tagged with the section of the text each example comes from.
//!
//! Nothing here depends on the tensor library: batches are plain `Vec<i64>`,
//! so this crate is quick to build and test, and the index arithmetic that
//! decides what a model sees is checked on its own.

#![warn(missing_docs)]

mod batch;
mod corpus;
mod documents;
mod error;
mod graph;
mod masking;
mod pairs;
mod span_corruption;
mod tags;
mod tokenizer;

pub use batch::{OrderedStreams, RandomWindows, TokenBatch, eval_batches, spread_windows};
pub use corpus::{Corpus, DATA_DIR_ENV, DEFAULT_DATA_DIR, DataConfig, data_dir, read_text};
pub use documents::DocumentStreams;
pub use error::DataError;
pub use graph::{GraphBatches, GraphDataConfig, GraphExample, GraphSplits, NO_TARGET, graph_eval_batches};
pub use masking::Masking;
pub use pairs::{Pair, PairBatches, PairSplits, PairsConfig, check_pair_lengths, example_batch, pair_eval_batches};
pub use span_corruption::{SpanCorruption, SpanShape, span_eval_batches};
pub use tags::{Holdout, SplitTags, TagConfig, TagSections, UNTAGGED};
pub use tokenizer::{CharTokenizer, Tokenizer, TokenizerConfig};
