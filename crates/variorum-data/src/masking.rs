//! BERT's masked-language-model corruption (Devlin et al. 2019, §3.1): of every window, a share
//! `prob` of the positions is chosen for prediction; a chosen token is replaced by the mask token
//! with probability `mask_token`, by a random token with probability `random_token`, and kept
//! otherwise. The targets are the original tokens at the chosen positions and the mask id
//! everywhere else, which the loss ignores (the mask token is not a text token — an extra
//! embedding row, or a tokenizer's special `[MASK]` — so it is not a real target).
//!
//! With `whole` set (ETC's contrastive predictive coding, Ainslie et al. 2020, §3.3), a number of
//! each row's segments are hidden whole first: every one of their tokens becomes the mask token,
//! none of them is a masked-LM target, and the batch keeps their original tokens
//! ([`HiddenSegment`]) for the model to encode apart. The masked-LM choice is made among the other
//! positions.
//!
//! Choices: positions are chosen independently (Bernoulli(`prob`)), not as an exact count; a row
//! where none was chosen gets one chosen position, so that every row has a loss. The window is the
//! batch's `inputs` row (its `targets`, the next-token shift, are not used). Every draw comes from
//! a ChaCha8 stream seeded by `(seed, row)`, so a batch's corruption is a pure function of its
//! seed: a resumed run and every evaluation see the same masks.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::TokenBatch;

/// What a masked-LM batch hides and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Masking {
    /// Share of positions chosen for prediction (BERT: 0.15).
    pub prob: f64,
    /// Of the chosen positions, the share replaced by the mask token (BERT: 0.8).
    pub mask_token: f64,
    /// Of the chosen positions, the share replaced by a random text token (BERT: 0.1).
    pub random_token: f64,
    /// Id of the mask token: `vocab` (an extra row), or one of the vocabulary's (BERT's `[MASK]`).
    pub mask_id: u32,
    /// Text tokens are `0..vocab`; a random replacement is one of them other than the mask token.
    pub vocab: u32,
    /// Segments hidden whole in every row (ETC's CPC); `None` = none.
    pub whole: Option<WholeSegments>,
}

/// ETC's CPC corruption: `per_row` of the complete segments of `len` positions in every row,
/// chosen uniformly without replacement, are hidden whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeSegments {
    /// Positions per segment.
    pub len: usize,
    /// Segments hidden per row.
    pub per_row: usize,
}

/// A segment hidden whole ([`WholeSegments`]): its row, its first position in the row and its
/// original tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenSegment {
    /// The batch row.
    pub row: usize,
    /// The segment's first position in the row.
    pub start: usize,
    /// Its tokens before they were hidden.
    pub tokens: Vec<i64>,
}

impl Masking {
    /// `batch` with its inputs corrupted and its targets the hidden tokens (the mask id elsewhere).
    pub fn apply(&self, batch: &TokenBatch, seed: u64) -> TokenBatch {
        let (b, l) = (batch.batch_size, batch.seq_len);
        let ignore = i64::from(self.mask_id);
        let mut inputs = batch.inputs.clone();
        let mut targets = vec![ignore; b * l];
        let mut hidden = Vec::new();
        for r in 0..b {
            let mut rng = row_rng(seed, r as u64);
            // graph rows: the example's positions only, not its padding
            let len = batch.graphs.get(r).map_or(l, |g| g.len().min(l));
            let row = r * l..r * l + len;
            let mut whole = vec![false; len];
            if let Some(w) = self.whole {
                let complete = len / w.len.max(1);
                let mut picked = rand::seq::index::sample(&mut rng, complete, w.per_row.min(complete)).into_vec();
                picked.sort_unstable();
                for s in picked {
                    let start = s * w.len;
                    let span = r * l + start..r * l + start + w.len;
                    hidden.push(HiddenSegment { row: r, start, tokens: batch.inputs[span.clone()].to_vec() });
                    inputs[span].iter_mut().for_each(|t| *t = ignore);
                    whole[start..start + w.len].iter_mut().for_each(|h| *h = true);
                }
            }
            let mut chosen: Vec<usize> =
                row.clone().filter(|&i| !whole[i - r * l] && rng.random_bool(self.prob)).collect();
            let open: Vec<usize> = (0..len).filter(|&i| !whole[i]).collect();
            if chosen.is_empty() && !open.is_empty() {
                chosen.push(r * l + open[rng.random_range(0..open.len())]);
            }
            for i in chosen {
                targets[i] = batch.inputs[i];
                let u: f64 = rng.random();
                if u < self.mask_token {
                    inputs[i] = ignore;
                } else if u < self.mask_token + self.random_token
                    && let Some(token) = self.random_token(&mut rng)
                {
                    inputs[i] = i64::from(token);
                }
            }
        }
        TokenBatch {
            inputs,
            targets,
            batch_size: b,
            seq_len: l,
            reset: batch.reset.clone(),
            tags: batch.tags.clone(),
            graphs: batch.graphs.clone(),
            sources: batch.sources.clone(),
            starts: batch.starts.clone(),
            neighbours: batch.neighbours.clone(),
            hidden,
        }
    }
}

impl Masking {
    /// A text token other than the mask token, uniformly; `None` when there is none.
    fn random_token(&self, rng: &mut ChaCha8Rng) -> Option<u32> {
        // the mask token among the vocabulary: draw from the others, skipping over it
        let inside = self.mask_id < self.vocab;
        let choices = self.vocab - u32::from(inside);
        if choices == 0 {
            return None;
        }
        let t = rng.random_range(0..choices);
        Some(if inside && t >= self.mask_id { t + 1 } else { t })
    }
}

fn row_rng(seed: u64, row: u64) -> ChaCha8Rng {
    let digest = Sha256::new()
        .chain_update(b"variorum/masked-lm/v1")
        .chain_update(seed.to_le_bytes())
        .chain_update(row.to_le_bytes())
        .finalize();
    ChaCha8Rng::from_seed(digest.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(b: usize, l: usize) -> TokenBatch {
        let inputs: Vec<i64> = (0..b * l).map(|i| (i % 7) as i64).collect();
        TokenBatch {
            targets: inputs.clone(),
            inputs,
            batch_size: b,
            seq_len: l,
            reset: vec![true; b],
            tags: vec![],
            graphs: vec![],
            sources: vec![],
            starts: vec![],
            neighbours: vec![],
            hidden: vec![],
        }
    }

    const BERT: Masking = Masking { prob: 0.15, mask_token: 0.8, random_token: 0.1, mask_id: 7, vocab: 7, whole: None };

    #[test]
    fn hidden_positions_are_the_targets_and_the_rest_is_ignored() {
        let src = batch(256, 128);
        let m = BERT.apply(&src, 3);
        let chosen: Vec<usize> = (0..m.targets.len()).filter(|&i| m.targets[i] != 7).collect();
        let share = chosen.len() as f64 / m.targets.len() as f64;
        assert!((share - 0.15).abs() < 0.01, "{share}");
        // targets are the original tokens; unchosen inputs are untouched
        for i in 0..m.targets.len() {
            if m.targets[i] == 7 {
                assert_eq!(m.inputs[i], src.inputs[i]);
            } else {
                assert_eq!(m.targets[i], src.inputs[i]);
            }
        }
        let masked = chosen.iter().filter(|&&i| m.inputs[i] == 7).count() as f64 / chosen.len() as f64;
        let kept = chosen.iter().filter(|&&i| m.inputs[i] == src.inputs[i]).count() as f64 / chosen.len() as f64;
        assert!((masked - 0.8).abs() < 0.02, "{masked}");
        // kept = 10% kept + random draws that hit the same token (1/7 of 10%)
        assert!((kept - (0.1 + 0.1 / 7.0)).abs() < 0.02, "{kept}");
        assert!(m.inputs.iter().all(|&t| (0..=7).contains(&t)));
    }

    #[test]
    fn a_mask_token_inside_the_vocabulary_is_never_a_random_replacement() {
        // BERT's [MASK] is id 3 of 7 text ids; replace every chosen token by a random one
        let m = Masking { prob: 0.5, mask_token: 0.0, random_token: 1.0, mask_id: 3, vocab: 7, whole: None };
        let src = batch(64, 64);
        let out = m.apply(&src, 11);
        let mut seen = [0usize; 7];
        for i in 0..out.targets.len() {
            if out.targets[i] != 3 {
                seen[out.inputs[i] as usize] += 1;
            }
        }
        assert_eq!(seen[3], 0, "the mask token drawn as a random token: {seen:?}");
        assert!(seen.iter().enumerate().all(|(t, &n)| t == 3 || n > 100), "every other token drawn: {seen:?}");
    }

    #[test]
    fn whole_segments_are_hidden_kept_apart_and_left_out_of_the_masked_lm() {
        // rows of 12 = 4 segments of 3; two hidden whole per row
        let m = Masking { whole: Some(WholeSegments { len: 3, per_row: 2 }), ..BERT };
        let src = batch(200, 12);
        let out = m.apply(&src, 5);
        assert_eq!(out.hidden.len(), 400);
        let mut starts_seen = [0usize; 4];
        for (r, pair) in out.hidden.chunks(2).enumerate() {
            assert!(pair.iter().all(|h| h.row == r) && pair[0].start < pair[1].start, "{pair:?}");
            for h in pair {
                assert_eq!(h.start % 3, 0);
                starts_seen[h.start / 3] += 1;
                let span = r * 12 + h.start..r * 12 + h.start + 3;
                assert_eq!(h.tokens, src.inputs[span.clone()], "the originals are kept");
                assert!(out.inputs[span.clone()].iter().all(|&t| t == 7), "hidden whole");
                assert!(out.targets[span].iter().all(|&t| t == 7), "no masked-LM target inside");
            }
            // every row still has a masked-LM target, outside its hidden segments
            assert!(out.targets[r * 12..(r + 1) * 12].iter().any(|&t| t != 7), "row {r}");
        }
        // each of the four segments is picked about half the time (100 of 400 picks)
        assert!(starts_seen.iter().all(|&n| (70..130).contains(&n)), "{starts_seen:?}");
        // without whole segments the corruption is what it was
        assert_eq!(BERT.apply(&src, 5).inputs, Masking { whole: None, ..m }.apply(&src, 5).inputs);
        assert!(BERT.apply(&src, 5).hidden.is_empty());
    }

    #[test]
    fn graph_rows_hide_their_example_never_its_padding() {
        // rows of 3 and 7 tokens padded to 10
        let mut src = batch(2, 10);
        src.graphs = vec![std::sync::Arc::new(vec![vec![]; 3]), std::sync::Arc::new(vec![vec![]; 7])];
        for seed in 0..200 {
            let m = BERT.apply(&src, seed);
            for (r, len) in [(0, 3), (1, 7)] {
                let row = &m.targets[r * 10..(r + 1) * 10];
                assert!(row[len..].iter().all(|&t| t == i64::from(BERT.mask_id)), "seed {seed} row {r}: {row:?}");
                assert!(row[..len].iter().any(|&t| t != i64::from(BERT.mask_id)), "row {r} has no target");
            }
        }
    }

    #[test]
    fn masks_are_a_pure_function_of_the_seed_and_every_row_has_a_target() {
        let src = batch(50, 3);
        assert_eq!(BERT.apply(&src, 5), BERT.apply(&src, 5));
        assert_ne!(BERT.apply(&src, 5), BERT.apply(&src, 6));
        let m = BERT.apply(&src, 5);
        for row in m.targets.chunks(3) {
            assert!(row.iter().any(|&t| t != 7), "a row without a target: {row:?}");
        }
    }
}
