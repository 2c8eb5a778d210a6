//! Document streams (`train.batching = "documents"`): every batch row reads whole documents,
//! one after another, segment by segment, each document starting on a segment boundary — what a
//! model with a per-document memory (the Memorizing Transformer) trains on. The documents are
//! the sections `data.tags` cuts the text into.
//!
//! A document of m tokens gives m − 1 predictions, ⌈(m − 1) / seq_len⌉ segments; the last is
//! padded (inputs 0, targets `NO_TARGET`, which the loss skips). A row's first segment of a
//! document has `reset = true`: the model forgets the previous document there. Documents go to
//! rows in order, each to the row with the fewest segments so far; a row that reaches the end
//! of its documents starts them over (`reset` again), so `batch(step)` is a pure function of
//! the step and resuming needs no saved position.

use std::sync::Arc;

use crate::batch::TokenBatch;
use crate::error::DataError;
use crate::graph::NO_TARGET;
use crate::tags::SplitTags;

/// One segment of a row: `len` predictions from token `start`, the first of a document or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: usize,
    len: usize,
    first: bool,
}

/// Batches whose rows read whole documents (the sections `data.tags` finds), segment by
/// segment, each document from a new segment with `reset = true`; a pure function of the step.
#[derive(Debug, Clone)]
pub struct DocumentStreams {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
    rows: Vec<Vec<Segment>>,
    tags: Arc<SplitTags>,
}

impl DocumentStreams {
    /// The documents of `tags` (its sections) over `tokens` (the same split), dealt to
    /// `batch_size` rows. Fails if there are fewer documents than rows.
    pub fn new(
        tokens: Arc<Vec<u32>>,
        tags: Arc<SplitTags>,
        seq_len: usize,
        batch_size: usize,
    ) -> Result<Self, DataError> {
        if seq_len == 0 || batch_size == 0 {
            return Err(DataError::Config("document streams need seq_len and batch_size of at least 1".into()));
        }
        let documents = documents(tokens.len(), &tags);
        if documents.len() < batch_size {
            return Err(DataError::TooShort(format!(
                "data.tags finds {} documents of at least two tokens in this split, fewer than the {batch_size} \
                 rows of a batch: train.batching = \"documents\" gives each row its own documents; use a \
                 smaller train.batch_size or a section pattern that finds more documents",
                documents.len()
            )));
        }
        let mut rows: Vec<Vec<Segment>> = vec![Vec::new(); batch_size];
        for (s, e) in documents {
            let row = (0..batch_size).min_by_key(|&r| (rows[r].len(), r)).expect("at least one row");
            let predictions = e - s - 1;
            for (i, from) in (0..predictions).step_by(seq_len).enumerate() {
                rows[row].push(Segment { start: s + from, len: seq_len.min(predictions - from), first: i == 0 });
            }
        }
        Ok(Self { tokens, seq_len, rows, tags })
    }

    /// How many documents (of at least two tokens) `tags` finds in a split of `len` tokens: the
    /// most rows document streams over it can have.
    pub fn count(len: usize, tags: &SplitTags) -> usize {
        documents(len, tags).len()
    }

    /// Predictions per segment, the row length.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.rows.len()
    }

    /// Steps until the longest row has read all its documents once.
    pub fn segments_per_epoch(&self) -> usize {
        self.rows.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The batch for training step `step`: segment `step mod n_r` of each row `r`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        self.assemble(|row| Some(row[(step % row.len() as u64) as usize]))
    }

    /// One pass over every row's documents (evaluation): batch `i` holds segment `i` of each
    /// row; a row that has finished reads nothing (all targets `NO_TARGET`, `reset`).
    pub fn one_pass(&self) -> Vec<TokenBatch> {
        (0..self.segments_per_epoch()).map(|i| self.assemble(|row| row.get(i).copied())).collect()
    }

    fn assemble(&self, pick: impl Fn(&[Segment]) -> Option<Segment>) -> TokenBatch {
        let l = self.seq_len;
        let mut batch = TokenBatch::with_capacity(self.rows.len(), l);
        for row in &self.rows {
            let seg = pick(row);
            let (start, len, first) = seg.map_or((0, 0, true), |s| (s.start, s.len, s.first));
            let tokens = &self.tokens[start..start + len + usize::from(len > 0)];
            batch.inputs.extend((0..l).map(|i| if i < len { i64::from(tokens[i]) } else { 0 }));
            batch.targets.extend((0..l).map(|i| if i < len { i64::from(tokens[i + 1]) } else { NO_TARGET }));
            batch.reset.push(first);
            batch.tags.push(i64::from(self.tags.window_tag(start, len.max(1))));
            batch.batch_size += 1;
        }
        batch
    }
}

/// `(start, end)` token ranges of the sections of `tags` within `len` tokens, those with at
/// least one prediction.
fn documents(len: usize, tags: &SplitTags) -> Vec<(usize, usize)> {
    let mut bounds: Vec<usize> = tags.starts().iter().copied().filter(|&s| s < len).collect();
    bounds.push(len);
    bounds.windows(2).map(|w| (w[0], w[1])).filter(|(s, e)| e - s >= 2).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three documents of 10, 5 and 7 tokens (ids = positions), segments of 4, two rows.
    fn streams() -> DocumentStreams {
        let tokens: Vec<u32> = (0..22).collect();
        let tags = SplitTags::new(vec![0, 10, 15], vec![1, 2, 3]).unwrap();
        DocumentStreams::new(Arc::new(tokens), Arc::new(tags), 4, 2).unwrap()
    }

    #[test]
    fn every_row_reads_whole_documents_from_a_segment_boundary() {
        let s = streams();
        // row 0: document 0 (9 predictions: 3 segments); row 1: documents 1 (4: 1) and 2 (6: 2)
        assert_eq!(s.segments_per_epoch(), 3);
        let b = s.batch(0);
        assert_eq!(b.reset, vec![true, true]);
        assert_eq!(&b.inputs[..4], &[0, 1, 2, 3]);
        assert_eq!(&b.inputs[4..], &[10, 11, 12, 13]);
        assert_eq!(&b.targets[4..], &[11, 12, 13, 14]);
        let b = s.batch(1);
        assert_eq!(b.reset, vec![false, true]);
        assert_eq!(&b.inputs[4..], &[15, 16, 17, 18]);
        let b = s.batch(2);
        // the last segment of each document is padded; no target crosses into the next one
        assert_eq!(&b.inputs[..4], &[8, 0, 0, 0]);
        assert_eq!(&b.targets[..4], &[9, NO_TARGET, NO_TARGET, NO_TARGET]);
        assert_eq!(&b.targets[4..], &[20, 21, NO_TARGET, NO_TARGET]);
        assert_eq!(b.tags, vec![1, 3]);
        // rows start over at their own ends
        assert_eq!(s.batch(3).reset, vec![true, true]);
        assert_eq!(s.batch(3).inputs, s.batch(0).inputs);
    }

    #[test]
    fn one_pass_pads_the_rows_that_finished() {
        let s = DocumentStreams::new(
            Arc::new((0..22).collect()),
            Arc::new(SplitTags::new(vec![0, 10, 15], vec![1, 2, 3]).unwrap()),
            8,
            2,
        )
        .unwrap();
        // row 0: document 0 (2 segments); row 1: documents 1 and 2 (1 segment each)
        let pass = s.one_pass();
        assert_eq!(pass.len(), 2);
        let counted: usize = pass.iter().map(|b| b.targets.iter().filter(|&&t| t != NO_TARGET).count()).sum();
        assert_eq!(counted, 9 + 4 + 6, "every prediction of every document once");
    }

    #[test]
    fn fewer_documents_than_rows_is_refused() {
        let tags = Arc::new(SplitTags::new(vec![0, 10], vec![1, 2]).unwrap());
        let err = DocumentStreams::new(Arc::new((0..22).collect()), tags, 4, 3).unwrap_err();
        assert!(err.to_string().contains("fewer than the 3 rows"), "{err}");
    }
}
