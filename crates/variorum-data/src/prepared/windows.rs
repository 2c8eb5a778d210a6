//! Training windows drawn from a prepared corpus, each source at its share.

use std::sync::Arc;

use rand::Rng;

use super::index::PreparedCorpus;
use crate::batch::{TokenBatch, check_shape, keyed_rng};
use crate::error::DataError;

/// Random windows over a prepared corpus's training split, read from its shard files. Row r
/// of batch `step` draws, from a generator keyed by (seed, step, r) alone, first a source —
/// source s with probability weight_s / Σ weight when the sources have weights, else in
/// proportion to its tokens — then a start uniform over that source's training tokens. So
/// every batch is a pure function of (seed, step), as [`crate::RandomWindows`]' are, and a
/// resumed run reads what the uninterrupted one would have. A window may run over the
/// end-of-text token into the next document of its source (as nanoGPT's do), never into
/// another source.
#[derive(Debug, Clone)]
pub struct MixtureWindows {
    corpus: Arc<PreparedCorpus>,
    seq_len: usize,
    batch_size: usize,
    seed: u64,
    /// Cumulative probabilities of the sources (the last is 1).
    cumulative: Vec<f64>,
}

impl MixtureWindows {
    /// Fails when no source can hold a window of `seq_len + 1` tokens, or a weighted one cannot.
    pub fn new(corpus: Arc<PreparedCorpus>, seq_len: usize, batch_size: usize, seed: u64) -> Result<Self, DataError> {
        check_shape(seq_len, batch_size)?;
        let lens = corpus.train_tokens();
        let weights: Vec<Option<f64>> = corpus.index.sources.iter().map(|s| s.config.weight).collect();
        let mut shares = Vec::with_capacity(lens.len());
        for (i, (&len, w)) in lens.iter().zip(&weights).enumerate() {
            let fits = len > seq_len as u64;
            if let (Some(_), false) = (w, fits) {
                return Err(DataError::TooShort(format!(
                    "data.sources[{i}] has {len} training tokens, fewer than seq_len + 1 = {}: it cannot be drawn at its \
                     weight; remove it, or use a shorter model.seq_len",
                    seq_len + 1
                )));
            }
            shares.push(if fits { w.unwrap_or(len as f64) } else { 0.0 });
        }
        let total: f64 = shares.iter().sum();
        if total <= 0.0 {
            return Err(DataError::TooShort(format!(
                "no source of {} has seq_len + 1 = {} training tokens: use a shorter model.seq_len",
                corpus.dir.display(),
                seq_len + 1
            )));
        }
        let mut acc = 0.0;
        let cumulative = shares
            .iter()
            .map(|s| {
                acc += s / total;
                acc
            })
            .collect::<Vec<_>>();
        Ok(MixtureWindows { corpus, seq_len, batch_size, seed, cumulative })
    }

    /// Tokens per row.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Each source's probability of being drawn for a row.
    pub fn intended(&self) -> Vec<f64> {
        let mut prev = 0.0;
        self.cumulative
            .iter()
            .map(|&c| {
                let p = c - prev;
                prev = c;
                p
            })
            .collect()
    }

    /// The source and start of row `row` of batch `step`.
    fn draw(&self, step: u64, row: usize) -> (usize, u64) {
        let mut rng = keyed_rng(b"variorum/mixture-windows/v1", &[self.seed, step, row as u64]);
        let u: f64 = rng.random();
        let source = self
            .cumulative
            .iter()
            .position(|&c| u < c)
            .unwrap_or_else(|| self.cumulative.iter().rposition(|&c| c > 0.0).expect("one source has a share"));
        let max_start = self.corpus.train[source].len - self.seq_len as u64 - 1;
        (source, rng.random_range(0..=max_start))
    }

    /// The batch for training step `step`; an error only when a shard cannot be read.
    pub fn batch(&self, step: u64) -> Result<TokenBatch, DataError> {
        let mut batch = TokenBatch::with_capacity(self.batch_size, self.seq_len);
        let mut window = vec![0u32; self.seq_len + 1];
        for row in 0..self.batch_size {
            let (source, start) = self.draw(step, row);
            self.corpus.train[source]
                .read(start, &mut window, self.corpus.index.width)
                .map_err(|e| self.corpus.read_error(e))?;
            batch.push_row(&window, 0, true, None);
            *batch.starts.last_mut().expect("a row was pushed") = start as usize;
        }
        Ok(batch)
    }

    /// The fraction of rows each source supplied over steps `0..steps`: what the mixture
    /// actually drew, beside [`intended`](Self::intended).
    pub fn drawn(&self, steps: u64) -> Vec<f64> {
        let mut counts = vec![0u64; self.cumulative.len()];
        for step in 0..steps {
            for row in 0..self.batch_size {
                counts[self.draw(step, row).0] += 1;
            }
        }
        let total = (steps * self.batch_size as u64).max(1) as f64;
        counts.iter().map(|&c| c as f64 / total).collect()
    }
}
