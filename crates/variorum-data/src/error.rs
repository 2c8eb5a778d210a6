//! The one error type of this crate.
//!
//! Every message is a single line that says what went wrong, where (a path, a
//! config key, a byte offset) and what would work instead, because these
//! messages end up in front of a person at a terminal, not in a log parser.

use std::path::PathBuf;

/// Everything that can go wrong while reading a corpus, building a tokenizer or
/// cutting token sequences into batches.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A setting in the `[data]` section (or a batching argument) is out of range
    /// or contradicts another; the message names the key and a value that works.
    #[error("{0}")]
    Config(String),

    /// A graph data file (`data.graph`) holds a line that is not an example, or an example that
    /// does not fit; the message names the file and line.
    #[error("{0}")]
    Graph(String),

    /// A paired-text file (`data.pairs`) holds a line that is not a pair, or a pair that does not
    /// fit; the message names the file and line.
    #[error("{0}")]
    Pairs(String),

    /// The corpus file does not exist; `hint` says how to get it.
    #[error("corpus {} not found: {hint}", path.display())]
    CorpusNotFound {
        /// The path looked for.
        path: PathBuf,
        /// How to get the corpus: the dataset's fetch recipe, or setting `data.path`.
        hint: String,
    },

    /// The corpus file exists but could not be read.
    #[error("could not read corpus {}: {message}", path.display())]
    CorpusRead {
        /// The corpus file.
        path: PathBuf,
        /// The reader's error, on one line.
        message: String,
    },

    /// The corpus file is not UTF-8; `offset` is the byte offset of the first
    /// invalid byte.
    #[error(
        "corpus {} is not valid UTF-8: the first invalid byte is at byte offset {offset}: \
         convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)",
        path.display()
    )]
    CorpusNotUtf8 {
        /// The corpus file.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },

    /// A file of a prepared corpus could not be written (a full disk, a read-only directory).
    #[error("could not write {}: {message}: check the space and permissions there", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The writer's error, on one line.
        message: String,
    },

    /// The corpus file is empty.
    #[error("corpus {} is empty: point data.path at a non-empty UTF-8 text file", path.display())]
    CorpusEmpty {
        /// The corpus file.
        path: PathBuf,
    },

    /// The corpus is too short for what was asked of it (a train/validation split,
    /// a window of `seq_len + 1` tokens, ...).
    #[error("{0}")]
    TooShort(String),

    /// The char tokenizer met a character that is not in its vocabulary.
    /// `offset` is a byte offset into the text being encoded; `context` names that
    /// text when known (e.g. " of the validation split of corpus data/x.txt").
    #[error(
        "character {ch:?} at byte offset {offset}{context} is not in the char tokenizer's \
         vocabulary: train the tokenizer on text that contains it, or use data.tokenizer \
         kind = \"byte\" or \"bpe\", which can encode any text"
    )]
    UnknownChar {
        /// The character.
        ch: char,
        /// Its byte offset in the text being encoded.
        offset: usize,
        /// What that text is, as a phrase appended to the offset (e.g. " of the validation
        /// split of corpus data/x.txt"); empty when unknown.
        context: String,
    },

    /// Training or running the BPE tokenizer (the `tokenizers` crate) failed.
    #[error("BPE tokenizer could not {action}: {message}")]
    Bpe {
        /// What the tokenizer could not do, as a verb phrase ("be trained", "encode the text").
        action: &'static str,
        /// The `tokenizers` crate's error, on one line.
        message: String,
    },

    /// A tokenizer file is missing, unreadable, corrupt, or could not be written.
    #[error("tokenizer file {}: {problem}", path.display())]
    TokenizerFile {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
}

/// Flattens a foreign error message to one line (some errors from dependencies
/// span several lines, which would break the one-line rule).
pub(crate) fn one_line(message: impl std::fmt::Display) -> String {
    message.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_removes_newlines() {
        assert_eq!(one_line("a\n  b\r\nc"), "a b c");
    }

    #[test]
    fn messages_are_one_line() {
        let errors = [
            DataError::CorpusNotUtf8 { path: "x.txt".into(), offset: 3 },
            DataError::UnknownChar { ch: '\n', offset: 0, context: String::new() },
            DataError::CorpusEmpty { path: "x.txt".into() },
        ];
        for e in errors {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line message: {msg}");
        }
    }
}
