//! Text data for variorum: reading a corpus, tokenizing it (char, byte or BPE),
//! and cutting the token ids into training and evaluation batches, optionally
//! tagged with the section of the text each example comes from.
//!
//! Nothing here depends on the tensor library: batches are plain `Vec<i64>`,
//! so this crate is quick to build and test, and the index arithmetic that
//! decides what a model sees is checked on its own.
//!
//! ```
//! use std::sync::Arc;
//! use variorum_data::{RandomWindows, Tokenizer, TokenizerConfig};
//!
//! let text = "to be, or not to be, that is the question";
//! let tokenizer = Tokenizer::train(&TokenizerConfig::Char, text).unwrap();
//! let ids = tokenizer.encode(text).unwrap();
//! assert_eq!(tokenizer.decode(&ids), text);
//! // two windows of 8 tokens per batch, each with the 8 tokens that follow: step 0 is the same
//! // batch for the same seed
//! let windows = RandomWindows::new(Arc::new(ids), 8, 2, 7).unwrap();
//! let batch = windows.batch(0);
//! assert_eq!((batch.batch_size, batch.seq_len, batch.inputs.len()), (2, 8, 16));
//! assert_eq!(batch.inputs[1..8], batch.targets[0..7]);
//! assert_eq!(batch.inputs, windows.batch(0).inputs);
//! ```

#![warn(missing_docs)]

mod batch;
mod corpus;
pub mod decision;
mod documents;
mod error;
mod graph;
mod masking;
mod pairs;
mod prepared;
mod span_corruption;
mod tags;
mod tokenizer;

pub use batch::{OrderedStreams, RandomWindows, TokenBatch, eval_batches, spread_windows};
pub use corpus::{Corpus, DATA_DIR_ENV, DEFAULT_DATA_DIR, DataConfig, PREPARED_VAL_TOKENS, data_dir, read_text};
pub use documents::DocumentStreams;
pub use error::DataError;
pub use graph::{GraphBatches, GraphDataConfig, GraphExample, GraphSplits, NO_TARGET, graph_eval_batches};
pub use masking::{HiddenSegment, Masking, WholeSegments};
pub use pairs::{
    Pair, PairBatches, PairSplits, PairsConfig, TargetTokens, check_pair_lengths, example_batch, pair_eval_batches,
};
pub use prepared::{
    Index, InvalidUtf8, MixtureWindows, PrepareConfig, PrepareProgress, Prepared, PreparedCorpus,
    PreparedDocumentStreams, PreparedOrderedStreams, ShardRecord, SourceConfig, SourceRecord, Split, TokenizerRecord,
    fingerprint, prepare,
};
pub use span_corruption::{SpanCorruption, SpanShape, span_eval_batches};
pub use tags::{Holdout, SplitTags, TagConfig, TagSections, UNTAGGED};
pub use tokenizer::{CharTokenizer, Tokenizer, TokenizerConfig};
