//! Paired text (`[data.pairs]`): examples of a source and its target, for sequence-to-sequence
//! training of an encoder–decoder. Two layouts:
//!
//! - one file (`data.path`) of tab-separated lines, `source<TAB>target`;
//! - two line-aligned files: `data.path` holds the sources, `data.pairs.target_path` the targets
//!   (line i of one is paired with line i of the other).
//!
//! Blank lines (on both sides) are skipped; a line without its other half, an empty side or a
//! tab inside a target is refused with its line number. The last `val_fraction` of the pairs
//! are the validation split.
//!
//! A batch is `batch_size` pairs, drawn at random per step (a pure function of the step, as for
//! text windows). Its rows are the targets, after the start token (the end token `</s>` itself
//! unless the model names another: T5 starts from `<pad>`) and padded to the batch's longest:
//! the decoder reads `[start, t₁, …, t_n]` and predicts `[t₁, …, t_n, </s>]`, then
//! [`NO_TARGET`](crate::NO_TARGET) over the padding. Each row's source rides beside it
//! ([`TokenBatch::sources`]).
//!
//! A source is tokenized as a prompt is, with the special tokens the tokenizer's post-processor
//! adds (T5's appends `</s>`, as transformers' `tokenizer(source)` does); a target without them,
//! the batches adding the end token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::NO_TARGET;
use crate::batch::TokenBatch;
use crate::error::DataError;
use crate::tokenizer::Tokenizer;

/// `[data.pairs]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PairsConfig {
    /// The targets, one per line, aligned with the sources in `data.path`. Default: none, and
    /// `data.path` holds `source<TAB>target` lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_path: Option<PathBuf>,
}

/// The tokens that frame every target: the decoder's first input and the token that ends the
/// target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetTokens {
    /// The decoder's first input.
    pub start: u32,
    /// The last token of every target, where generation stops.
    pub end: u32,
}

impl TargetTokens {
    /// One token `</s>` that starts and ends (variorum's own encoder–decoders).
    pub fn same(end: u32) -> Self {
        Self { start: end, end }
    }
}

/// One pair: the line it came from and the tokens of each side.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// The line of the file it comes from (1-based), for messages.
    pub line: usize,
    /// The source's tokens: what the encoder reads.
    pub source: Vec<u32>,
    /// The target's tokens, without the end token the batches add.
    pub target: Vec<u32>,
}

/// The pairs of each split.
#[derive(Debug, Clone)]
pub struct PairSplits {
    /// The training pairs: all but the last `val_fraction` of them.
    pub train: Arc<Vec<Pair>>,
    /// The validation pairs: the last `val_fraction` of them.
    pub val: Arc<Vec<Pair>>,
}

/// `(line, source, target)` of every non-blank line: `text` is the TSV file, or the sources
/// when `targets` (the aligned file's text) is given. `path` and `target_path` name them in
/// messages.
pub(crate) fn parse<'a>(
    text: &'a str,
    targets: Option<(&'a str, &Path)>,
    path: &Path,
) -> Result<Vec<(usize, &'a str, &'a str)>, DataError> {
    let at = |line: usize, what: String| DataError::Pairs(format!("{} line {line}: {what}", path.display()));
    let mut out = Vec::new();
    match targets {
        None => {
            for (i, raw) in text.lines().enumerate() {
                let line = raw.strip_suffix('\r').unwrap_or(raw);
                if line.trim().is_empty() {
                    continue;
                }
                let Some((source, target)) = line.split_once('\t') else {
                    return Err(at(i + 1, "no tab between a source and its target (source<TAB>target)".into()));
                };
                if target.contains('\t') {
                    return Err(at(i + 1, "more than one tab: a line is source<TAB>target".into()));
                }
                out.push((i + 1, source, target));
            }
        }
        Some((target_text, target_path)) => {
            let (sources, targets): (Vec<&str>, Vec<&str>) = (text.lines().collect(), target_text.lines().collect());
            if sources.len() != targets.len() {
                return Err(DataError::Pairs(format!(
                    "{} has {} lines and {} has {}: aligned files pair line i with line i",
                    path.display(),
                    sources.len(),
                    target_path.display(),
                    targets.len()
                )));
            }
            for (i, (s, t)) in sources.into_iter().zip(targets).enumerate() {
                let (s, t) = (s.strip_suffix('\r').unwrap_or(s), t.strip_suffix('\r').unwrap_or(t));
                if s.trim().is_empty() && t.trim().is_empty() {
                    continue;
                }
                out.push((i + 1, s, t));
            }
        }
    }
    for &(line, s, t) in &out {
        if s.trim().is_empty() || t.trim().is_empty() {
            let side = if s.trim().is_empty() { "source" } else { "target" };
            return Err(at(line, format!("the {side} is empty")));
        }
    }
    Ok(out)
}

/// Tokenizes one pair.
pub(crate) fn pair(line: usize, source: &str, target: &str, tokenizer: &Tokenizer) -> Result<Pair, DataError> {
    Ok(Pair { line, source: tokenizer.encode_prompt(source)?, target: tokenizer.encode(target)? })
}

/// Fails, naming the file and line, if a pair does not fit `seq_len`: its source, or its target
/// with the end token.
pub fn check_pair_lengths(pairs: &[Pair], path: &Path, seq_len: usize) -> Result<(), DataError> {
    for p in pairs {
        let (s, t) = (p.source.len(), p.target.len() + 1);
        if s > seq_len || t > seq_len {
            let (side, n) = if s > seq_len { ("source", s) } else { ("target and its end token", t) };
            return Err(DataError::Pairs(format!(
                "{} line {}: the {side} is {n} tokens long, more than model.seq_len = {seq_len}: raise model.seq_len or shorten the pair",
                path.display(),
                p.line
            )));
        }
    }
    Ok(())
}

/// Random pairs, `batch_size` per step.
#[derive(Debug, Clone)]
pub struct PairBatches {
    pairs: Arc<Vec<Pair>>,
    tokens: TargetTokens,
    batch_size: usize,
    seed: u64,
}

impl PairBatches {
    /// `tokens` frame each target. Fails if a pair is longer than `seq_len` or there is none.
    pub fn new(
        pairs: Arc<Vec<Pair>>,
        path: &Path,
        seq_len: usize,
        tokens: TargetTokens,
        batch_size: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        check_pair_lengths(&pairs, path, seq_len)?;
        if pairs.is_empty() {
            return Err(DataError::Pairs(format!("{}: no training pairs", path.display())));
        }
        if batch_size == 0 {
            return Err(DataError::Config("batch_size = 0 must be at least 1, e.g. 32".into()));
        }
        Ok(Self { pairs, tokens, batch_size, seed })
    }

    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        let mut rng = step_rng(self.seed, step);
        let picks: Vec<(&[u32], &[u32])> = (0..self.batch_size)
            .map(|_| {
                let p = &self.pairs[rng.random_range(0..self.pairs.len())];
                (p.source.as_slice(), p.target.as_slice())
            })
            .collect();
        example_batch(&picks, self.tokens)
    }
}

/// Evaluation batches: the first `max_rows` pairs (all, if fewer), in order, `batch_size` per
/// batch (the last may be smaller).
pub fn pair_eval_batches(
    pairs: &[Pair],
    path: &Path,
    seq_len: usize,
    tokens: TargetTokens,
    max_rows: usize,
    batch_size: usize,
) -> Result<Vec<TokenBatch>, DataError> {
    check_pair_lengths(pairs, path, seq_len)?;
    let take = &pairs[..pairs.len().min(max_rows)];
    Ok(take
        .chunks(batch_size.max(1))
        .map(|c| {
            let rows: Vec<(&[u32], &[u32])> = c.iter().map(|p| (p.source.as_slice(), p.target.as_slice())).collect();
            example_batch(&rows, tokens)
        })
        .collect())
}

/// A batch of (source, target) examples: rows `[start, target…]` → `[target…, </s>]`, padded
/// to the longest with `</s>` inputs and [`NO_TARGET`] targets; the sources beside them.
pub fn example_batch(examples: &[(&[u32], &[u32])], tokens: TargetTokens) -> TokenBatch {
    let TargetTokens { start, end } = tokens;
    let b = examples.len();
    let len = examples.iter().map(|(_, t)| t.len() + 1).max().unwrap_or(1);
    let mut inputs = vec![i64::from(end); b * len];
    let mut targets = vec![NO_TARGET; b * len];
    for (r, (_, t)) in examples.iter().enumerate() {
        inputs[r * len] = i64::from(start);
        for (i, &id) in t.iter().enumerate() {
            inputs[r * len + i + 1] = i64::from(id);
            targets[r * len + i] = i64::from(id);
        }
        targets[r * len + t.len()] = i64::from(end);
    }
    TokenBatch {
        inputs,
        targets,
        batch_size: b,
        seq_len: len,
        reset: vec![true; b],
        tags: Vec::new(),
        graphs: Vec::new(),
        sources: examples.iter().map(|(s, _)| Arc::new(s.to_vec())).collect(),
        starts: Vec::new(),
        neighbours: Vec::new(),
        hidden: Vec::new(),
    }
}

fn step_rng(seed: u64, step: u64) -> ChaCha8Rng {
    crate::batch::keyed_rng(b"variorum/pairs/v1", &[seed, step])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsv_and_aligned_files_give_the_same_pairs_and_bad_lines_are_named() {
        let tsv = "ab\tba\n\nabc\tcba\r\n";
        let got = parse(tsv, None, Path::new("p.tsv")).unwrap();
        assert_eq!(got, vec![(1, "ab", "ba"), (3, "abc", "cba")]);
        let aligned = parse("ab\n\nabc\n", Some(("ba\n\ncba\n", Path::new("t.txt"))), Path::new("s.txt")).unwrap();
        assert_eq!(aligned, got);
        let err = |r: Result<Vec<(usize, &str, &str)>, DataError>| r.unwrap_err().to_string();
        assert_eq!(
            err(parse("ab\tba\nabc\n", None, Path::new("p.tsv"))),
            "p.tsv line 2: no tab between a source and its target (source<TAB>target)"
        );
        assert!(err(parse("a\tb\tc\n", None, Path::new("p.tsv"))).contains("line 1: more than one tab"));
        assert!(err(parse("a\t \n", None, Path::new("p.tsv"))).contains("line 1: the target is empty"));
        assert!(
            err(parse("a\nb\n", Some(("x\n", Path::new("t.txt"))), Path::new("s.txt")))
                .contains("s.txt has 2 lines and t.txt has 1")
        );
        assert!(
            err(parse("a\n\n", Some(("x\ny\n", Path::new("t.txt"))), Path::new("s.txt")))
                .contains("s.txt line 2: the source is empty")
        );
    }

    #[test]
    fn a_batch_reads_the_end_token_first_and_predicts_the_target_then_the_end() {
        let examples = [(&[7, 8][..], &[1, 2, 3][..]), (&[9][..], &[4][..])];
        let b = example_batch(&examples, TargetTokens::same(50));
        assert_eq!(b.seq_len, 4);
        assert_eq!(b.inputs, vec![50, 1, 2, 3, 50, 4, 50, 50]);
        assert_eq!(b.targets, vec![1, 2, 3, 50, 4, 50, NO_TARGET, NO_TARGET]);
        assert_eq!(b.sources.iter().map(|s| s.as_slice().to_vec()).collect::<Vec<_>>(), vec![vec![7, 8], vec![9]]);
        // T5's: every row starts from its own start token, ends with the end token
        let t5 = example_batch(&examples, TargetTokens { start: 0, end: 1 });
        assert_eq!(t5.inputs, vec![0, 1, 2, 3, 0, 4, 1, 1]);
        assert_eq!(t5.targets, vec![1, 2, 3, 1, 4, 1, NO_TARGET, NO_TARGET]);
    }

    #[test]
    fn pairs_longer_than_the_context_are_refused_by_line() {
        let p = vec![Pair { line: 4, source: vec![1; 3], target: vec![2; 3] }];
        assert!(check_pair_lengths(&p, Path::new("p.tsv"), 4).is_ok());
        let e = check_pair_lengths(&p, Path::new("p.tsv"), 3).unwrap_err().to_string();
        assert!(e.starts_with("p.tsv line 4: the target and its end token is 4 tokens long"), "{e}");
    }
}
