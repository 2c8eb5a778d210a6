//! Ordered and document streams over a prepared corpus: what `train.batching = "ordered"` and
//! `"documents"` read when the corpus is in shards, with the meaning they have over one text
//! ([`crate::OrderedStreams`], [`crate::DocumentStreams`]), read from the shard files with
//! positioned reads, so that memory does not grow with the corpus.
//!
//! Both read every source in index order, as one concatenation; a mixture's weights (which
//! only random windows can honour) are refused by the caller.

use std::sync::Arc;

use super::index::{PreparedCorpus, SplitFiles};
use crate::batch::{TokenBatch, check_shape};
use crate::error::DataError;
use crate::graph::NO_TARGET;

/// Which split of a prepared corpus a stream reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training documents.
    Train,
    /// The held-out documents.
    Validation,
}

impl Split {
    fn name(self) -> &'static str {
        match self {
            Split::Train => "training",
            Split::Validation => "validation",
        }
    }
}

impl PreparedCorpus {
    fn split(&self, which: Split) -> &[SplitFiles] {
        match which {
            Split::Train => &self.train,
            Split::Validation => &self.val,
        }
    }

    /// Documents in a split, every source's.
    pub fn documents(&self, which: Split) -> u64 {
        self.split(which).iter().map(|s| s.documents).sum()
    }

    /// Copies tokens `pos..pos + out.len()` of the split's sources read one after another.
    fn read_concatenated(&self, which: Split, mut pos: u64, out: &mut [u32]) -> Result<(), DataError> {
        let mut filled = 0;
        for s in self.split(which) {
            if filled == out.len() {
                break;
            }
            if pos >= s.len {
                pos -= s.len;
                continue;
            }
            let take = ((s.len - pos) as usize).min(out.len() - filled);
            s.read(pos, &mut out[filled..filled + take], self.index.width).map_err(|e| self.read_error(e))?;
            filled += take;
            pos = 0;
        }
        Ok(())
    }
}

/// Ordered streams over a prepared split: its tokens (every source, in order) cut into
/// `batch_size` contiguous streams; batch i holds segment i of every stream, so row r of batch
/// i + 1 continues row r of batch i, and after the last whole segment every row starts again
/// with `reset = true` — [`crate::OrderedStreams`]' layout, read from the shards.
#[derive(Debug, Clone)]
pub struct PreparedOrderedStreams {
    corpus: Arc<PreparedCorpus>,
    split: Split,
    seq_len: usize,
    batch_size: usize,
    stream_len: u64,
    segments: u64,
}

impl PreparedOrderedStreams {
    /// Fails when a stream would be shorter than one segment.
    pub fn new(
        corpus: Arc<PreparedCorpus>,
        split: Split,
        seq_len: usize,
        batch_size: usize,
    ) -> Result<Self, DataError> {
        check_shape(seq_len, batch_size)?;
        let len: u64 = corpus.split(split).iter().map(|s| s.len).sum();
        let stream_len = len.saturating_sub(1) / batch_size as u64;
        let segments = stream_len / seq_len as u64;
        if segments == 0 {
            return Err(DataError::TooShort(format!(
                "the {} split of {} has {len} tokens, fewer than batch_size * seq_len + 1 = {} needed for \
                 {batch_size} streams of one segment each: use a smaller batch_size or a shorter model.seq_len",
                split.name(),
                corpus.dir.display(),
                batch_size.saturating_mul(seq_len).saturating_add(1)
            )));
        }
        Ok(PreparedOrderedStreams { corpus, split, seq_len, batch_size, stream_len, segments })
    }

    /// Batches per pass over the streams.
    pub fn segments_per_epoch(&self) -> u64 {
        self.segments
    }

    /// The batch for step `step` (segment `step mod segments_per_epoch()` of every stream); an
    /// error only when a shard cannot be read.
    pub fn batch(&self, step: u64) -> Result<TokenBatch, DataError> {
        let segment = step % self.segments;
        let mut batch = TokenBatch::with_capacity(self.batch_size, self.seq_len);
        let mut window = vec![0u32; self.seq_len + 1];
        for row in 0..self.batch_size as u64 {
            let start = row * self.stream_len + segment * self.seq_len as u64;
            self.corpus.read_concatenated(self.split, start, &mut window)?;
            batch.push_row(&window, 0, segment == 0, None);
            *batch.starts.last_mut().expect("a row was pushed") = start as usize;
        }
        Ok(batch)
    }
}

/// Documents per checkpoint of a row's running segment count: a row keeps one `u64` per this
/// many documents, and finding a segment reads at most this many document starts.
const BLOCK: u64 = 1024;

/// One row of document streams: a run of consecutive documents.
#[derive(Debug, Clone)]
struct Row {
    /// Its first document's number among the split's (sources in order).
    first: u64,
    documents: u64,
    /// `checkpoints[b]`: the row's segments before its document `b · BLOCK`.
    checkpoints: Vec<u64>,
    segments: u64,
}

/// One segment of a row: `len` predictions from token `start` of source `source`.
#[derive(Debug, Clone, Copy)]
struct Segment {
    source: usize,
    start: u64,
    len: usize,
    first: bool,
}

/// Document streams over a prepared split, [`crate::DocumentStreams`]' meaning read from the
/// shards: every row reads whole documents one after another, segment by segment, each
/// document from a new segment with `reset = true` (the model forgets the previous one), its
/// last segment padded (targets [`NO_TARGET`]); a row at the end of its documents starts them
/// over. The documents are those the corpus was prepared with (each ends with its end-of-text
/// token, which is predicted).
///
/// Row r reads documents `r·D/B .. (r + 1)·D/B` of the split's D (consecutive, rather than
/// dealt one by one as over a text, so that a row is found from a few numbers): building the
/// streams reads every document start once and keeps, per row, one count per 1,024
/// documents; `batch(step)` reads at most 1,024 starts per row. So a batch is a pure
/// function of the step, memory stays small for any corpus, and resuming needs no position.
#[derive(Debug, Clone)]
pub struct PreparedDocumentStreams {
    corpus: Arc<PreparedCorpus>,
    split: Split,
    seq_len: usize,
    rows: Vec<Row>,
    /// Per source: the number of its first document (the last entry: every document).
    first_documents: Vec<u64>,
}

impl PreparedDocumentStreams {
    /// The split's documents dealt to `batch_size` rows. Fails when a row would have no
    /// document of two tokens or more.
    pub fn new(
        corpus: Arc<PreparedCorpus>,
        split: Split,
        seq_len: usize,
        batch_size: usize,
    ) -> Result<Self, DataError> {
        check_shape(seq_len, batch_size)?;
        let mut first_documents = vec![0];
        for s in corpus.split(split) {
            first_documents.push(first_documents.last().expect("one entry") + s.documents);
        }
        let total = *first_documents.last().expect("one entry");
        let mut streams = PreparedDocumentStreams { corpus, split, seq_len, rows: Vec::new(), first_documents };
        let b = batch_size as u128;
        let mut ranges = Vec::new();
        for r in 0..b {
            let first = (r * u128::from(total) / b) as u64;
            let end = ((r + 1) * u128::from(total) / b) as u64;
            let mut row = Row { first, documents: end - first, checkpoints: Vec::new(), segments: 0 };
            for block in (first..end).step_by(BLOCK as usize) {
                row.checkpoints.push(row.segments);
                ranges.resize((BLOCK.min(end - block)) as usize, (0, 0, 0));
                streams.ranges(block, &mut ranges)?;
                row.segments += ranges.iter().map(|&(_, s, e)| streams.segments_of(s, e)).sum::<u64>();
            }
            if row.segments == 0 {
                return Err(DataError::TooShort(format!(
                    "the {} split of {} has {total} documents, too few of two tokens or more for the {batch_size} \
                     rows of a batch: train.batching = \"documents\" gives each row its own documents; use a smaller \
                     train.batch_size",
                    streams.split.name(),
                    streams.corpus.dir.display()
                )));
            }
            streams.rows.push(row);
        }
        Ok(streams)
    }

    /// Segments a document of tokens `start..end` is read in: one per `seq_len` predictions.
    fn segments_of(&self, start: u64, end: u64) -> u64 {
        (end - start).saturating_sub(1).div_ceil(self.seq_len as u64)
    }

    /// `(source, start, end)` of documents `first..first + out.len()` (numbered across sources).
    fn ranges(&self, mut first: u64, out: &mut [(usize, u64, u64)]) -> Result<(), DataError> {
        let mut filled = 0;
        let mut buf = Vec::new();
        while filled < out.len() {
            let source = self.first_documents.partition_point(|&d| d <= first) - 1;
            let local = first - self.first_documents[source];
            let split = &self.corpus.split(self.split)[source];
            let take = ((split.documents - local) as usize).min(out.len() - filled);
            buf.resize(take, (0, 0));
            split.document_ranges(local, &mut buf).map_err(|e| self.corpus.read_error(e))?;
            for (o, &(s, e)) in out[filled..filled + take].iter_mut().zip(&buf) {
                *o = (source, s, e);
            }
            filled += take;
            first += take as u64;
        }
        Ok(())
    }

    /// Segment `k` (below the row's count) of row `row`.
    fn segment(&self, row: &Row, k: u64) -> Result<Segment, DataError> {
        let block = row.checkpoints.partition_point(|&c| c <= k) - 1;
        let from = block as u64 * BLOCK;
        let mut docs = vec![(0, 0, 0); BLOCK.min(row.documents - from) as usize];
        self.ranges(row.first + from, &mut docs)?;
        let mut before = row.checkpoints[block];
        for (source, start, end) in docs {
            let n = self.segments_of(start, end);
            if k < before + n {
                let i = k - before;
                let offset = i * self.seq_len as u64;
                let len = (end - start - 1 - offset).min(self.seq_len as u64) as usize;
                return Ok(Segment { source, start: start + offset, len, first: i == 0 });
            }
            before += n;
        }
        // the checkpoints counted this block's segments when the streams were opened: a `.docs`
        // file that reads otherwise now changed under the run
        Err(self.corpus.read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a .docs file changed since the corpus was opened",
        )))
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
    pub fn segments_per_epoch(&self) -> u64 {
        self.rows.iter().map(|r| r.segments).max().unwrap_or(0)
    }

    /// The batch for training step `step`: segment `step mod n_r` of each row `r`.
    pub fn batch(&self, step: u64) -> Result<TokenBatch, DataError> {
        self.assemble(|row| Some(step % row.segments))
    }

    /// Batch `i` of one pass over every row's documents (evaluation; `i` below
    /// [`segments_per_epoch`](Self::segments_per_epoch)): segment `i` of each row, and nothing
    /// (every target [`NO_TARGET`], `reset`) from a row that has finished.
    pub fn pass_batch(&self, i: u64) -> Result<TokenBatch, DataError> {
        self.assemble(|row| (i < row.segments).then_some(i))
    }

    fn assemble(&self, pick: impl Fn(&Row) -> Option<u64>) -> Result<TokenBatch, DataError> {
        let l = self.seq_len;
        let mut batch = TokenBatch::with_capacity(self.rows.len(), l);
        let mut tokens = vec![0u32; l + 1];
        for row in &self.rows {
            let seg = pick(row).map(|k| self.segment(row, k)).transpose()?;
            let (len, first) = seg.map_or((0, true), |s| (s.len, s.first));
            if let Some(s) = seg {
                self.corpus.split(self.split)[s.source]
                    .read(s.start, &mut tokens[..=s.len], self.corpus.index.width)
                    .map_err(|e| self.corpus.read_error(e))?;
            }
            batch.inputs.extend((0..l).map(|i| if i < len { i64::from(tokens[i]) } else { 0 }));
            batch.targets.extend((0..l).map(|i| if i < len { i64::from(tokens[i + 1]) } else { NO_TARGET }));
            batch.reset.push(first);
            batch.batch_size += 1;
        }
        Ok(batch)
    }
}
