//! T5's span corruption (Raffel et al. 2020, §3.1.4): denoising pairs cut from any single
//! corpus, for an encoder–decoder (`model.objective.kind = "span-corruption"`).
//!
//! From a window of `n` tokens, `noise` tokens in `spans` spans are dropped: the window is split
//! into `spans` kept runs and `spans` dropped runs, alternating and starting with a kept one,
//! each run's length a uniformly random composition (T5's `random_spans_noise_mask`). The source
//! is the window with every dropped span replaced by its sentinel (`<s₀>`, `<s₁>`, … in order);
//! the target is each sentinel followed by the span it stands for, then the end token:
//!
//! ```text
//! window  Thank you for inviting me to your party last week
//! source  Thank you <s₀> me to your party <s₁> week
//! target  <s₀> for inviting <s₁> last </s>
//! ```
//!
//! Training draws `batch_size` windows at random per step (a pure function of the step);
//! evaluation corrupts windows spread over the validation text, the same ones every time.

use std::sync::Arc;

use rand::Rng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;

use crate::batch::TokenBatch;
use crate::error::DataError;
use crate::pairs::example_batch;

/// What a corruption needs to know: window length, dropped tokens and spans, the end token and
/// the first sentinel's id (the others follow it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanShape {
    /// Tokens per window, `n` (the model's `seq_len`).
    pub window: usize,
    /// Tokens dropped from each window.
    pub noise: usize,
    /// Spans the dropped tokens form, one sentinel each: `1 ≤ spans ≤ min(noise, window − noise)`.
    pub spans: usize,
    /// The end token `</s>` that closes every target.
    pub end: u32,
    /// The id of `<s₀>`; sentinel `i` is `first_sentinel + i`.
    pub first_sentinel: u32,
}

impl SpanShape {
    /// Source and target of `window` (`self.window` tokens), corrupted by draws from `rng`.
    pub fn corrupt(&self, window: &[u32], rng: &mut impl Rng) -> (Vec<u32>, Vec<u32>) {
        let (n, k) = (window.len(), self.spans);
        let dropped = composition(self.noise, k, rng);
        let kept = composition(n - self.noise, k, rng);
        let (mut source, mut target) = (Vec::with_capacity(n), Vec::with_capacity(self.noise + k));
        let mut at = 0;
        for (i, (&keep, &drop)) in kept.iter().zip(&dropped).enumerate() {
            let sentinel = self.first_sentinel + i as u32;
            source.extend_from_slice(&window[at..at + keep]);
            source.push(sentinel);
            target.push(sentinel);
            target.extend_from_slice(&window[at + keep..at + keep + drop]);
            at += keep + drop;
        }
        (source, target)
    }
}

/// `n ≥ k ≥ 1` split into `k` positive parts, uniformly among the compositions.
fn composition(n: usize, k: usize, rng: &mut impl Rng) -> Vec<usize> {
    let mut cuts: Vec<usize> = sample(rng, n - 1, k - 1).into_iter().map(|c| c + 1).collect();
    cuts.sort_unstable();
    cuts.push(n);
    let mut last = 0;
    cuts.into_iter()
        .map(|c| {
            let part = c - last;
            last = c;
            part
        })
        .collect()
}

/// Random corrupted windows of a token stream, `batch_size` per step.
#[derive(Debug, Clone)]
pub struct SpanCorruption {
    tokens: Arc<Vec<u32>>,
    shape: SpanShape,
    batch_size: usize,
    seed: u64,
}

impl SpanCorruption {
    /// Corrupted windows of `tokens`, `batch_size` per step, drawn from `seed`. Fails if `tokens`
    /// is shorter than one window or `batch_size` is 0.
    pub fn new(tokens: Arc<Vec<u32>>, shape: SpanShape, batch_size: usize, seed: u64) -> Result<Self, DataError> {
        check(&tokens, &shape, "training")?;
        if batch_size == 0 {
            return Err(DataError::Config("batch_size = 0 must be at least 1, e.g. 32".into()));
        }
        Ok(Self { tokens, shape, batch_size, seed })
    }

    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        let mut rng = rng(self.seed, step);
        let n = self.shape.window;
        let examples: Vec<(Vec<u32>, Vec<u32>)> = (0..self.batch_size)
            .map(|_| {
                let start = rng.random_range(0..=self.tokens.len() - n);
                self.shape.corrupt(&self.tokens[start..start + n], &mut rng)
            })
            .collect();
        batch(&examples, self.shape.end)
    }
}

/// Evaluation batches: `max_rows` windows spread evenly over `tokens` (fewer if they do not fit),
/// corrupted by seed 0, `batch_size` per batch.
pub fn span_eval_batches(
    tokens: &[u32],
    shape: SpanShape,
    max_rows: usize,
    batch_size: usize,
) -> Result<Vec<TokenBatch>, DataError> {
    check(tokens, &shape, "validation")?;
    let n = shape.window;
    let rows = max_rows.min(tokens.len() / n).max(1);
    let stride = if rows > 1 { (tokens.len() - n) / (rows - 1) } else { 0 };
    let mut rng = rng(0, 0);
    let examples: Vec<(Vec<u32>, Vec<u32>)> =
        (0..rows).map(|r| shape.corrupt(&tokens[r * stride..r * stride + n], &mut rng)).collect();
    Ok(examples.chunks(batch_size.max(1)).map(|c| batch(c, shape.end)).collect())
}

fn batch(examples: &[(Vec<u32>, Vec<u32>)], end: u32) -> TokenBatch {
    let rows: Vec<(&[u32], &[u32])> = examples.iter().map(|(s, t)| (s.as_slice(), t.as_slice())).collect();
    example_batch(&rows, crate::pairs::TargetTokens::same(end))
}

fn check(tokens: &[u32], shape: &SpanShape, split: &str) -> Result<(), DataError> {
    if tokens.len() < shape.window {
        return Err(DataError::TooShort(format!(
            "the {split} text is {} tokens, shorter than one span-corruption window (model.seq_len = {}): use a longer text or a shorter context",
            tokens.len(),
            shape.window
        )));
    }
    Ok(())
}

fn rng(seed: u64, step: u64) -> ChaCha8Rng {
    crate::batch::keyed_rng(b"variorum/span-corruption/v1", &[seed, step])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn sentinels_mark_the_dropped_spans_and_the_target_restores_them() {
        let shape = SpanShape { window: 40, noise: 6, spans: 2, end: 100, first_sentinel: 101 };
        let window: Vec<u32> = (0..40).collect();
        for seed in 0..50 {
            let (source, target) = shape.corrupt(&window, &mut ChaCha8Rng::seed_from_u64(seed));
            assert_eq!(source.len(), 40 - 6 + 2);
            assert_eq!(target.len(), 6 + 2);
            // filling each sentinel of the source with what follows it in the target restores
            // the window
            let mut restored = Vec::new();
            for &t in &source {
                if t >= 101 {
                    let at = target.iter().position(|&x| x == t).unwrap();
                    restored.extend(target[at + 1..].iter().take_while(|&&x| x < 101));
                } else {
                    restored.push(t);
                }
            }
            assert_eq!(restored, window, "seed {seed}");
            // sentinels in order, the first span after a kept run
            assert_eq!(target[0], 101);
            assert!(source[0] < 101);
            assert_eq!(source.iter().filter(|&&t| t >= 101).copied().collect::<Vec<_>>(), vec![101, 102]);
        }
    }

    #[test]
    fn compositions_are_positive_and_cover_every_split() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let c = composition(5, 3, &mut rng);
            assert_eq!(c.iter().sum::<usize>(), 5);
            assert!(c.iter().all(|&p| p > 0));
            seen.insert(c);
        }
        // C(4, 2) = 6 compositions of 5 into 3 positive parts
        assert_eq!(seen.len(), 6);
    }
}
