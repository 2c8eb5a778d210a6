//! Cutting a token sequence into batches of `(inputs, targets)` windows.
//!
//! Pure index bookkeeping with no tensor library, so it is cheap to test and
//! shared by every model. Ids are `i64` because that is what the tensor
//! library's integer tensors take. Every batch is a pure function of its step
//! number: resuming a run at step k needs no saved sampler state.
//!
//! Given the [`SplitTags`] of their split, the samplers also tag every row with
//! the section its window comes from; without them, `TokenBatch::tags` is empty.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::error::DataError;
use crate::tags::SplitTags;

/// `batch_size` rows of `seq_len` tokens, row-major: row `r` is
/// `inputs[r * seq_len..(r + 1) * seq_len]`, and `targets[t]` is the token
/// that follows `inputs[t]` in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Input token ids, `batch_size × seq_len`, row-major.
    pub inputs: Vec<i64>,
    /// Target token ids, the same shape: the token after each input, or `NO_TARGET` where a row
    /// predicts nothing (padding).
    pub targets: Vec<i64>,
    /// Rows in this batch (the last evaluation batch can hold fewer than asked for).
    pub batch_size: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Per row: true if this row starts a new stream (recurrent state must be reset).
    pub reset: Vec<bool>,
    /// Per row, when the data is tagged: the tag of the row's input window (the
    /// tag holding most of its tokens, [`SplitTags::window_tag`]). Empty when
    /// the data is not tagged.
    pub tags: Vec<i64>,
    /// Per row, with graph data (`data.graph`): the example's graph, what each of its positions
    /// reads besides itself; the row's example is this long, the rest is padding. Empty for text.
    pub graphs: Vec<std::sync::Arc<Vec<Vec<u32>>>>,
    /// Per row, for an encoder–decoder (`data.pairs`, span corruption): the row's source tokens;
    /// the row is its target after the end token, padded with `NO_TARGET` targets. Empty for
    /// text.
    pub sources: Vec<std::sync::Arc<Vec<u32>>>,
    /// Per row, for windows cut from one text (random windows, ordered streams, evaluation
    /// windows): where the row's first input token sits in its split. Empty otherwise.
    pub starts: Vec<usize>,
    /// `batch_size × seq_len × k`, row-major, when retrieval is on: the tokens retrieved for
    /// each position (negative = none), which SPALM's long-term memory reads. Empty otherwise.
    pub neighbours: Vec<i64>,
    /// Under ETC's CPC corruption ([`crate::Masking`]), the segments hidden whole, with their
    /// original tokens. Empty otherwise.
    pub hidden: Vec<crate::HiddenSegment>,
}

impl TokenBatch {
    pub(crate) fn with_capacity(batch_size: usize, seq_len: usize) -> Self {
        TokenBatch {
            inputs: Vec::with_capacity(batch_size * seq_len),
            targets: Vec::with_capacity(batch_size * seq_len),
            batch_size: 0,
            seq_len,
            reset: Vec::with_capacity(batch_size),
            tags: Vec::new(),
            graphs: Vec::new(),
            sources: Vec::new(),
            starts: Vec::with_capacity(batch_size),
            neighbours: Vec::new(),
            hidden: Vec::new(),
        }
    }

    /// Appends the window `tokens[start..=start + seq_len]` as one row, tagged
    /// with the tag of its input window when `tags` are given.
    pub(crate) fn push_row(&mut self, tokens: &[u32], start: usize, reset: bool, tags: Option<&SplitTags>) {
        let window = &tokens[start..start + self.seq_len + 1];
        self.inputs.extend(window[..self.seq_len].iter().map(|&t| i64::from(t)));
        self.targets.extend(window[1..].iter().map(|&t| i64::from(t)));
        self.reset.push(reset);
        self.starts.push(start);
        if let Some(tags) = tags {
            self.tags.push(i64::from(tags.window_tag(start, self.seq_len)));
        }
        self.batch_size += 1;
    }
}

pub(crate) fn check_shape(seq_len: usize, batch_size: usize) -> Result<(), DataError> {
    if seq_len == 0 {
        return Err(DataError::Config("seq_len = 0 must be at least 1, e.g. 256".into()));
    }
    if batch_size == 0 {
        return Err(DataError::Config("batch_size = 0 must be at least 1, e.g. 32".into()));
    }
    Ok(())
}

/// Random windows: row `r` of batch `step` starts at an offset drawn from a
/// ChaCha8 RNG seeded by a hash of `(seed, step, r)` — so `batch(step)` is a
/// pure function: resuming at step k needs no saved RNG state. Every row is an
/// independent window, so every row has `reset = true`.
#[derive(Debug, Clone)]
pub struct RandomWindows {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
    batch_size: usize,
    seed: u64,
    tags: Option<Arc<SplitTags>>,
}

impl RandomWindows {
    /// Fails if `tokens` cannot hold one window of `seq_len + 1` tokens.
    pub fn new(tokens: Arc<Vec<u32>>, seq_len: usize, batch_size: usize, seed: u64) -> Result<Self, DataError> {
        check_shape(seq_len, batch_size)?;
        if tokens.len() <= seq_len {
            return Err(DataError::TooShort(format!(
                "the training split has {} tokens, fewer than seq_len + 1 = {}: use a longer \
                 corpus or a shorter model.seq_len",
                tokens.len(),
                seq_len.saturating_add(1)
            )));
        }
        Ok(RandomWindows { tokens, seq_len, batch_size, seed, tags: None })
    }

    /// Tags every row with [`SplitTags::window_tag`] of its input window. `tags`
    /// must describe the same split as the tokens (e.g. `corpus.tags.train` for
    /// `corpus.train`). The windows drawn do not change.
    pub fn with_tags(self, tags: Arc<SplitTags>) -> Self {
        RandomWindows { tags: Some(tags), ..self }
    }

    /// Tokens per row.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        let max_start = self.tokens.len() - self.seq_len - 1;
        let mut batch = TokenBatch::with_capacity(self.batch_size, self.seq_len);
        for row in 0..self.batch_size {
            let start = row_rng(self.seed, step, row as u64).random_range(0..=max_start);
            batch.push_row(&self.tokens, start, true, self.tags.as_deref());
        }
        batch
    }
}

/// An RNG for one row of one step. SHA-256 of the triple (with a domain tag)
/// gives well-mixed, platform-independent seeds, so neighbouring steps or rows
/// do not get correlated streams.
fn row_rng(seed: u64, step: u64, row: u64) -> ChaCha8Rng {
    keyed_rng(b"variorum/random-windows/v1", &[seed, step, row])
}

/// A generator that is a pure function of `domain` (which sampler draws: each has its own, so
/// that two samplers never share a stream) and `keys` (the seed, the step, …): what makes every
/// batch a function of (seed, step) alone.
pub(crate) fn keyed_rng(domain: &[u8], keys: &[u64]) -> ChaCha8Rng {
    let mut hash = Sha256::new().chain_update(domain);
    for k in keys {
        hash = hash.chain_update(k.to_le_bytes());
    }
    ChaCha8Rng::from_seed(hash.finalize().into())
}

/// Ordered streams (for recurrent models): the token sequence is cut into
/// `batch_size` contiguous streams; batch i holds segment i of every stream, so
/// row r of batch i+1 continues row r of batch i. After the last full segment
/// it starts again (`reset = true` on every row).
///
/// Each stream is `(len - 1) / batch_size` tokens long (the `- 1` leaves room
/// for the last target); the part of a stream shorter than a whole segment, at
/// most `seq_len - 1` tokens, is not used.
#[derive(Debug, Clone)]
pub struct OrderedStreams {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
    batch_size: usize,
    stream_len: usize,
    segments: usize,
    tags: Option<Arc<SplitTags>>,
}

impl OrderedStreams {
    /// Fails if a stream would be shorter than one segment of `seq_len` tokens.
    pub fn new(tokens: Arc<Vec<u32>>, seq_len: usize, batch_size: usize) -> Result<Self, DataError> {
        check_shape(seq_len, batch_size)?;
        let stream_len = tokens.len().saturating_sub(1) / batch_size;
        let segments = stream_len / seq_len;
        if segments == 0 {
            return Err(DataError::TooShort(format!(
                "the training split has {} tokens, fewer than batch_size * seq_len + 1 = {} \
                 needed for {batch_size} streams of one segment each: use a longer corpus, a \
                 smaller batch_size or a shorter model.seq_len",
                tokens.len(),
                batch_size.saturating_mul(seq_len).saturating_add(1)
            )));
        }
        Ok(OrderedStreams { tokens, seq_len, batch_size, stream_len, segments, tags: None })
    }

    /// Tags every row with [`SplitTags::window_tag`] of its input window (the
    /// row's current segment). `tags` must describe the same split as the tokens
    /// (e.g. `corpus.tags.train` for `corpus.train`). The streams do not change.
    pub fn with_tags(self, tags: Arc<SplitTags>) -> Self {
        OrderedStreams { tags: Some(tags), ..self }
    }

    /// Batches per pass over the streams; step `k` uses segment `k % segments_per_epoch()`.
    pub fn segments_per_epoch(&self) -> usize {
        self.segments
    }

    /// Tokens per row: the length of one segment.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Rows per batch: the number of streams.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        // `segments` fits in u64 and the remainder is below it, so both casts are exact.
        let segment = (step % self.segments as u64) as usize;
        let mut batch = TokenBatch::with_capacity(self.batch_size, self.seq_len);
        for row in 0..self.batch_size {
            let start = row * self.stream_len + segment * self.seq_len;
            batch.push_row(&self.tokens, start, segment == 0, self.tags.as_deref());
        }
        batch
    }
}

/// Deterministic evaluation windows: non-overlapping windows of `seq_len + 1`
/// tokens (stride `seq_len`, so every token but the first is predicted exactly
/// once) from the start of `tokens`, grouped in batches, at most `max_batches`
/// batches (`None` = all; `Some(0)` = none). The last partial batch is kept
/// (smaller `batch_size`). Every row has `reset = true`. With `tags` (those of
/// the same split), every row is tagged with the tag of its input window.
pub fn eval_batches(
    tokens: &[u32],
    seq_len: usize,
    batch_size: usize,
    max_batches: Option<usize>,
    tags: Option<&SplitTags>,
) -> Result<Vec<TokenBatch>, DataError> {
    check_shape(seq_len, batch_size)?;
    let windows = tokens.len().saturating_sub(1) / seq_len;
    if windows == 0 {
        return Err(DataError::TooShort(format!(
            "evaluation needs at least seq_len + 1 = {} tokens but the split has {}: use a \
             larger data.val_fraction, a longer corpus or a shorter model.seq_len",
            seq_len.saturating_add(1),
            tokens.len()
        )));
    }
    let starts: Vec<usize> =
        (0..windows).map(|w| w * seq_len).take(max_batches.unwrap_or(usize::MAX).saturating_mul(batch_size)).collect();
    Ok(batches_from_starts(tokens, &starts, seq_len, batch_size, tags))
}

/// `n` windows of `seq_len + 1` tokens spread evenly over `tokens` — window i starts at
/// ⌊i·(len − seq_len − 1)/(n − 1)⌋, so the first starts at the first token and the last ends at
/// the last — grouped into batches of `batch_size`. Deterministic, and it samples the whole split
/// rather than its beginning; the PyTorch reference (scripts/reference) uses the same rule.
/// With `tags` (those of the same split), every row is tagged with the tag of its input window.
pub fn spread_windows(
    tokens: &[u32],
    seq_len: usize,
    n: usize,
    batch_size: usize,
    tags: Option<&SplitTags>,
) -> Result<Vec<TokenBatch>, DataError> {
    check_shape(seq_len, batch_size)?;
    if tokens.len() <= seq_len {
        return Err(DataError::TooShort(format!(
            "evaluation needs at least seq_len + 1 = {} tokens but the split has {}: use a \
             larger data.val_fraction, a longer corpus or a shorter model.seq_len",
            seq_len.saturating_add(1),
            tokens.len()
        )));
    }
    let span = tokens.len() - seq_len - 1;
    let starts: Vec<usize> = (0..n).map(|i| if n > 1 { i * span / (n - 1) } else { 0 }).collect();
    Ok(batches_from_starts(tokens, &starts, seq_len, batch_size, tags))
}

fn batches_from_starts(
    tokens: &[u32],
    starts: &[usize],
    seq_len: usize,
    batch_size: usize,
    tags: Option<&SplitTags>,
) -> Vec<TokenBatch> {
    starts
        .chunks(batch_size)
        .map(|chunk| {
            let mut batch = TokenBatch::with_capacity(chunk.len(), seq_len);
            for &start in chunk {
                batch.push_row(tokens, start, true, tags);
            }
            batch
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Corpus, DataConfig};
    use crate::tags::{Holdout, TagConfig};
    use crate::tokenizer::TokenizerConfig;

    /// Token id = position, so windows can be checked by arithmetic.
    fn counting(n: u32) -> Arc<Vec<u32>> {
        Arc::new((0..n).collect())
    }

    fn assert_well_formed(b: &TokenBatch) {
        assert_eq!(b.inputs.len(), b.batch_size * b.seq_len);
        assert_eq!(b.targets.len(), b.batch_size * b.seq_len);
        assert_eq!(b.reset.len(), b.batch_size);
        for r in 0..b.batch_size {
            let row = r * b.seq_len..(r + 1) * b.seq_len;
            // Targets are inputs shifted by one; with counting tokens, consecutive.
            assert_eq!(b.inputs[row.start + 1..row.end], b.targets[row.start..row.end - 1]);
            for t in row {
                assert_eq!(b.targets[t], b.inputs[t] + 1);
            }
        }
    }

    #[test]
    fn random_windows_are_a_pure_function_of_seed_and_step() {
        let a = RandomWindows::new(counting(1000), 16, 8, 42).expect("long enough");
        let b = RandomWindows::new(counting(1000), 16, 8, 42).expect("long enough");
        let other_seed = RandomWindows::new(counting(1000), 16, 8, 43).expect("long enough");
        for step in [0, 1, 7, 123_456] {
            let batch = a.batch(step);
            assert_well_formed(&batch);
            assert_eq!(batch, b.batch(step));
            assert_eq!(batch, a.batch(step), "same instance, asked twice");
            assert_ne!(batch, a.batch(step + 1));
            assert_ne!(batch, other_seed.batch(step));
            assert!(batch.reset.iter().all(|&r| r));
        }
        // Rows within a batch differ too.
        let batch = a.batch(0);
        assert_ne!(batch.inputs[..16], batch.inputs[16..32]);
    }

    #[test]
    fn random_windows_reach_both_ends() {
        // 5 tokens, seq_len 4: only start 0 fits; 6 tokens: starts 0 and 1.
        let one = RandomWindows::new(counting(5), 4, 3, 0).expect("exactly enough");
        assert_eq!(one.batch(9).inputs, [0, 1, 2, 3].repeat(3));
        let two = RandomWindows::new(counting(6), 4, 1, 0).expect("enough");
        let starts: std::collections::BTreeSet<i64> = (0..200).map(|s| two.batch(s).inputs[0]).collect();
        assert_eq!(starts.into_iter().collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn random_windows_too_short() {
        let msg = RandomWindows::new(counting(4), 4, 2, 0).expect_err("too short").to_string();
        assert!(msg.contains("has 4 tokens, fewer than seq_len + 1 = 5"), "{msg}");
        assert!(RandomWindows::new(counting(10), 0, 2, 0).is_err());
        assert!(RandomWindows::new(counting(10), 2, 0, 0).is_err());
    }

    #[test]
    fn ordered_streams_continue_row_by_row() {
        let tokens = counting(1001);
        let s = OrderedStreams::new(tokens, 7, 4).expect("long enough");
        // stream_len = 1000 / 4 = 250, segments = 250 / 7 = 35.
        assert_eq!(s.segments_per_epoch(), 35);
        let n = s.segments_per_epoch() as u64;
        for step in 0..2 * n {
            let b = s.batch(step);
            assert_well_formed(&b);
            let epoch_start = step % n == 0;
            assert!(b.reset.iter().all(|&r| r == epoch_start), "step {step}");
            let next = s.batch(step + 1);
            if (step + 1) % n != 0 {
                for r in 0..4 {
                    let last_target = b.targets[r * 7 + 6];
                    assert_eq!(next.inputs[r * 7], last_target, "row {r} step {step}");
                }
            }
        }
        // Row r of the first batch starts at the beginning of stream r.
        let first = s.batch(0);
        assert_eq!((0..4).map(|r| first.inputs[r * 7]).collect::<Vec<_>>(), [0, 250, 500, 750]);
        // After an epoch, the same batches again.
        assert_eq!(s.batch(3), s.batch(3 + n));
    }

    #[test]
    fn ordered_streams_use_the_last_token_as_a_target() {
        // 9 tokens, 2 streams of (9 - 1) / 2 = 4, seq_len 4: one segment each.
        let s = OrderedStreams::new(counting(9), 4, 2).expect("exactly enough");
        let b = s.batch(0);
        assert_eq!(b.targets.last(), Some(&8));
        let msg = OrderedStreams::new(counting(8), 4, 2).expect_err("one short").to_string();
        assert!(msg.contains("has 8 tokens") && msg.contains("= 9"), "{msg}");
    }

    #[test]
    fn eval_batches_cover_windows_in_order() {
        // 23 tokens, seq_len 5: windows start at 0, 5, 10, 15 (15 + 5 = 20 <= 22).
        let tokens: Vec<u32> = (0..23).collect();
        let batches = eval_batches(&tokens, 5, 3, None, None).expect("long enough");
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].batch_size, 3);
        assert_eq!(batches[1].batch_size, 1, "last partial batch kept");
        let starts: Vec<i64> = batches.iter().flat_map(|b| (0..b.batch_size).map(move |r| b.inputs[r * 5])).collect();
        assert_eq!(starts, [0, 5, 10, 15]);
        let predicted: Vec<i64> = batches.iter().flat_map(|b| b.targets.clone()).collect();
        assert_eq!(predicted, (1..21).collect::<Vec<i64>>(), "each token predicted once");
        for b in &batches {
            assert_well_formed(b);
            assert!(b.reset.iter().all(|&r| r));
        }

        let limited = eval_batches(&tokens, 5, 3, Some(1), None).expect("long enough");
        assert_eq!(limited, batches[..1]);
        assert!(eval_batches(&tokens, 5, 3, Some(0), None).expect("ok").is_empty());
    }

    #[test]
    fn eval_batches_too_short() {
        let msg = eval_batches(&[1, 2, 3], 3, 2, None, None).expect_err("too short").to_string();
        assert!(msg.contains("seq_len + 1 = 4") && msg.contains("has 3"), "{msg}");
        assert_eq!(eval_batches(&[1, 2, 3, 4], 3, 2, None, None).expect("exactly enough").len(), 1);
    }

    #[test]
    fn spread_windows_cover_the_split_end_to_end() {
        let tokens: Vec<u32> = (0..100).collect();
        let b = spread_windows(&tokens, 9, 5, 2, None).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].inputs[0], 0);
        assert_eq!(b[0].targets[0], 1);
        assert_eq!(b[2].inputs[0], 90, "the last window ends at the last token");
        assert_eq!(*b[2].targets.last().unwrap(), 99);
        assert!(spread_windows(&tokens[..9], 9, 5, 2, None).is_err());
    }

    /// A corpus whose sections are told apart by their chars: section `X` is
    /// `X` then a run of `x`; the untagged prefix is a run of `z`.
    fn lettered(holdout: Holdout) -> Corpus {
        let runs = [('z', 11), ('A', 20), ('B', 7), ('A', 9), ('C', 30), ('B', 25), ('D', 9), ('C', 40), ('E', 30)];
        let section = |c: char, n: usize| match c {
            'z' => "z".repeat(n),
            _ => format!("{c}{}", c.to_ascii_lowercase().to_string().repeat(n)),
        };
        let text: String = runs.iter().map(|&(c, n)| section(c, n)).collect();
        let cfg = DataConfig {
            dataset: None,
            path: Some("letters.txt".into()),
            tokenizer: TokenizerConfig::Char,
            val_fraction: 0.3,
            tags: Some(TagConfig { section: "[A-Z]".into(), holdout }),
            graph: None,
            pairs: None,
            neighbours: None,
            ..Default::default()
        };
        Corpus::from_text(&text, &cfg, None, "letters.txt".into()).expect("loads")
    }

    /// The tag a row should carry, from its chars alone: the section with most
    /// of them, ties to the one that appears last.
    fn expected_tag(corpus: &Corpus, batch: &TokenBatch, row: usize) -> i64 {
        let tags = corpus.tags.as_ref().expect("tagged");
        let inputs = &batch.inputs[row * batch.seq_len..(row + 1) * batch.seq_len];
        let ids: Vec<u32> = inputs.iter().map(|&t| u32::try_from(t).expect("a token id")).collect();
        // (tag, chars, last position)
        let mut counts: Vec<(u32, usize, usize)> = Vec::new();
        for (pos, c) in corpus.tokenizer.decode(&ids).chars().enumerate() {
            let name = if c == 'z' { "(untagged)".to_string() } else { c.to_ascii_uppercase().to_string() };
            let tag = tags.id(&name).expect("a section");
            match counts.iter_mut().find(|e| e.0 == tag) {
                Some(e) => *e = (tag, e.1 + 1, pos),
                None => counts.push((tag, 1, pos)),
            }
        }
        i64::from(counts.into_iter().max_by_key(|&(_, n, last)| (n, last)).expect("a window").0)
    }

    #[test]
    fn rows_carry_the_tag_of_their_window() {
        for holdout in [Holdout::End, Holdout::EachSection] {
            let c = lettered(holdout);
            let tags = c.tags.clone().expect("tagged");
            let train = Arc::new(c.train.clone());
            let (seq_len, batch_size) = (6, 4);

            let plain = RandomWindows::new(train.clone(), seq_len, batch_size, 5).expect("long enough");
            let tagged = plain.clone().with_tags(Arc::new(tags.train.clone()));
            let mut seen = std::collections::BTreeSet::new();
            for step in 0..300 {
                let (p, b) = (plain.batch(step), tagged.batch(step));
                assert!(p.tags.is_empty(), "no tags without with_tags");
                assert_eq!((&b.inputs, &b.targets, &b.reset), (&p.inputs, &p.targets, &p.reset), "same windows");
                assert_eq!(b.tags.len(), batch_size);
                for r in 0..batch_size {
                    assert_eq!(b.tags[r], expected_tag(&c, &b, r), "{holdout:?} step {step} row {r}");
                    seen.insert(b.tags[r]);
                }
            }
            assert!(seen.len() >= 5, "windows from most sections: {seen:?}");

            let streams = OrderedStreams::new(train, seq_len, 3).expect("long enough");
            let tagged = streams.clone().with_tags(Arc::new(tags.train.clone()));
            for step in 0..tagged.segments_per_epoch() as u64 {
                let b = tagged.batch(step);
                assert_eq!(b.inputs, streams.batch(step).inputs);
                for r in 0..3 {
                    assert_eq!(b.tags[r], expected_tag(&c, &b, r), "{holdout:?} stream step {step} row {r}");
                }
            }

            let plain = eval_batches(&c.val, seq_len, batch_size, None, None).expect("long enough");
            let evals = eval_batches(&c.val, seq_len, batch_size, None, Some(&tags.val)).expect("long enough");
            let spread = spread_windows(&c.val, seq_len, 9, batch_size, Some(&tags.val)).expect("long enough");
            assert!(plain.iter().all(|b| b.tags.is_empty()));
            for b in evals.iter().chain(&spread) {
                assert_eq!(b.tags.len(), b.batch_size);
                for r in 0..b.batch_size {
                    assert_eq!(b.tags[r], expected_tag(&c, b, r), "{holdout:?} eval row {r}");
                }
            }
            if holdout == Holdout::EachSection {
                // Every section is validated on: short eval windows see every tag.
                let short = eval_batches(&c.val, 2, batch_size, None, Some(&tags.val)).expect("long enough");
                let seen: std::collections::BTreeSet<i64> = short.iter().flat_map(|b| b.tags.clone()).collect();
                assert_eq!(seen.len(), tags.len(), "{seen:?}");
            }
        }
    }
}
