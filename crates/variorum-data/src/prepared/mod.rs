//! Prepared corpora: many sources tokenized once into token shards that training reads
//! window by window (positioned reads through the page cache), so that neither start-up time
//! nor resident memory grows with the corpus.
//!
//! `variorum prepare` ([`prepare`]) reads the `[data] sources` — text files, directories and
//! globs of them, JSON Lines with a text field, Parquet with a text column, gzip- or
//! zstd-compressed where they end in `.gz` or `.zst` — as
//! a stream of documents, holds out a fraction of the documents for validation (by a hash of
//! (seed, source, document number), so the choice is the same whatever else changes), and
//! writes, per piece of about `data.prepare.shard_bytes` of text:
//!
//! - `shard-NNNNN.train.bin` / `.val.bin`: the token ids, little-endian `u16` when the
//!   vocabulary fits and `u32` otherwise, every document followed by the end-of-text token;
//! - `shard-NNNNN.train.docs` / `.val.docs`: where each document starts (`u64`, little-endian),
//!   so document boundaries survive;
//! - `shard-NNNNN.json`: the shard's counts and CRC-32 checksums, written last: a shard is
//!   finished exactly when this file exists, which is how an interrupted prepare resumes.
//!
//! and at the end `index.json` ([`Index`]) and `tokenizer.json`. A shard never mixes sources,
//! so a mixture can draw each source at its own weight ([`MixtureWindows`]).
//!
//! Nothing here is hand-written that a maintained crate does: `flate2` and `zstd` decompress,
//! `glob` expands patterns, `parquet` reads Parquet, `crc32fast` checks, `rayon` spreads tokenization
//! over the cores.

mod build;
mod index;
mod sources;
mod streams;
mod windows;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::DataError;

pub use build::{PrepareProgress, Prepared, prepare};
pub use index::{Index, PreparedCorpus, ShardRecord, SourceRecord, TokenizerRecord, fingerprint};
pub use streams::{PreparedDocumentStreams, PreparedOrderedStreams, Split};
pub use windows::MixtureWindows;

/// One entry of `data.sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// A file, a directory (every file under it, recursively, in name order) or a glob
    /// (`web/*.jsonl.zst`). A relative path is read from the current directory. Files ending
    /// in `.gz` or `.zst` are decompressed as they are read.
    pub path: String,
    /// JSON Lines: the field of each line's object that holds the document's text; for files
    /// ending in `.parquet`, the column of each row. Absent: every file is plain UTF-8 text and
    /// one document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_field: Option<String>,
    /// The source's share of the training rows. Absent on every source: each source is drawn
    /// in proportion to its tokens (the corpus read as one concatenation). Given on every
    /// source: source s is drawn with probability weight_s / Σ weight, whatever its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// What to do with a document that is not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InvalidUtf8 {
    /// Leave it out and count it (the count is in `index.json`, per source).
    #[default]
    Skip,
    /// Stop, naming the file and the line.
    Refuse,
}

fn default_shard_bytes() -> u64 {
    64 << 20
}

fn default_sample_bytes() -> u64 {
    16 << 20
}

/// `[data.prepare]`: how `variorum prepare` cuts and tokenizes the sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareConfig {
    /// Text bytes per shard (64 MiB). Memory held while preparing is about three shards'
    /// text and tokens, whatever the corpus size.
    #[serde(default = "default_shard_bytes")]
    pub shard_bytes: u64,
    /// Bytes of training text a BPE tokenizer is trained on (16 MiB), taken from the start of
    /// each source in equal parts. A char tokenizer reads every document instead (a character
    /// it never saw could not be encoded at all); byte and file tokenizers learn nothing.
    #[serde(default = "default_sample_bytes")]
    pub tokenizer_sample_bytes: u64,
    /// Which documents are held out for validation: a document is when a hash of (seed,
    /// source, document number) falls below `data.val_fraction`.
    #[serde(default)]
    pub seed: u64,
    /// Hold out this many documents of each source, instead of `data.val_fraction` of them:
    /// the ones whose hash of (seed, source, document number) is smallest, so the choice is as
    /// deterministic as the fraction's. Costs one more reading pass over the sources (no
    /// tokenizing) to count their documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_documents: Option<u64>,
    /// Documents that are not UTF-8: skipped and counted (default), or refused.
    #[serde(default)]
    pub invalid_utf8: InvalidUtf8,
    /// The end-of-text token written after every document, for a tokenizer file (absent: the
    /// first of `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>` it has). The tokenizers
    /// variorum trains have their own: U+0003 END OF TEXT for char and byte, `<|endoftext|>`
    /// for BPE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eot: Option<String>,
}

impl Default for PrepareConfig {
    fn default() -> Self {
        PrepareConfig {
            shard_bytes: default_shard_bytes(),
            tokenizer_sample_bytes: default_sample_bytes(),
            seed: 0,
            val_documents: None,
            invalid_utf8: InvalidUtf8::default(),
            eot: None,
        }
    }
}

impl PrepareConfig {
    /// Whether the section equals its defaults (then it is left out of a written config).
    pub fn is_default(&self) -> bool {
        *self == PrepareConfig::default()
    }

    pub(crate) fn validate(&self) -> Result<(), DataError> {
        if self.shard_bytes < 1024 {
            return Err(DataError::Config(format!(
                "data.prepare.shard_bytes = {} is below 1024: use e.g. 67108864 (64 MiB)",
                self.shard_bytes
            )));
        }
        if self.tokenizer_sample_bytes == 0 {
            return Err(DataError::Config(
                "data.prepare.tokenizer_sample_bytes = 0: a BPE tokenizer needs text to learn from, e.g. 16777216"
                    .into(),
            ));
        }
        if matches!(&self.eot, Some(e) if e.is_empty()) {
            return Err(DataError::Config(
                "data.prepare.eot is empty: name a token of the tokenizer, e.g. \"<|endoftext|>\"".into(),
            ));
        }
        Ok(())
    }
}

/// Checks `data.sources`: each path non-empty, a weight on every source or on none, each
/// weight finite and positive.
pub(crate) fn validate_sources(sources: &[SourceConfig]) -> Result<(), DataError> {
    for (i, s) in sources.iter().enumerate() {
        if s.path.is_empty() {
            return Err(DataError::Config(format!("data.sources[{i}].path is empty: name a file, directory or glob")));
        }
        if matches!(&s.text_field, Some(f) if f.is_empty()) {
            return Err(DataError::Config(format!(
                "data.sources[{i}].text_field is empty: name the JSON field holding the text, e.g. \"text\""
            )));
        }
        if let Some(w) = s.weight
            && !(w.is_finite() && w > 0.0)
        {
            return Err(DataError::Config(format!(
                "data.sources[{i}].weight = {w} must be a positive number, e.g. 1.0"
            )));
        }
    }
    let weighted = sources.iter().filter(|s| s.weight.is_some()).count();
    if weighted != 0 && weighted != sources.len() {
        return Err(DataError::Config(format!(
            "data.sources: {weighted} of {} sources have a weight: give every source a weight (the mixture's \
             proportions), or none (each source drawn in proportion to its tokens)",
            sources.len()
        )));
    }
    Ok(())
}

/// Where a prepared corpus lives: `data.prepared`, else an error naming what to set.
pub(crate) fn prepared_dir(prepared: Option<&PathBuf>) -> Result<PathBuf, DataError> {
    match prepared {
        Some(p) if !p.as_os_str().is_empty() => Ok(p.clone()),
        _ => Err(DataError::Config(
            "data.sources needs data.prepared = \"DIR\", the directory its shards are written to and read from".into(),
        )),
    }
}
