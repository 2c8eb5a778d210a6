//! Attention between adjacent chunks of a sequence of items, as trax and transformers' Reformer
//! compute it: the n items are cut into chunks of m, and chunk c's queries score every key of
//! chunks c − before … c + after, the indices taken modulo the number of chunks — so the first
//! chunk's "before" is the last chunk (the sequence wraps around), and a key reached twice (fewer
//! chunks than the span) counts twice. O(n · m · (1 + before + after)) scores, no n × n matrix.
//!
//! Used by the `local` kind with `wrap = true` (items = positions) and by the `lsh` kind's
//! transformers layout (items = the positions sorted by bucket, every hash round after the
//! other, so a round's first chunk sees the previous round's last).

use burn::nn::Dropout;
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;

use crate::pattern::sorted_chunks::log_sum_exp;

/// transformers' masked score (−10⁹ in f32): exp underflows to 0 against any real score.
pub const HIDDEN: f32 = -1e9;

/// The items of one call, `[b, h, n, ·]`, n a multiple of the chunk.
pub struct ChunkItems {
    /// Queries, scaled as the scores need.
    pub q: Tensor<4>,
    /// Keys, scaled or normalised as the scores need.
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    /// Each item's position in the sequence, `[b, h, n]`: causal and self masks compare these.
    pub position: Tensor<3, Int>,
    /// Items that are no key (padding), `[b, h, n]`; `None`: every item is one.
    pub hidden: Option<Tensor<3, Bool>>,
}

/// What [`adjacent_chunk_attention`] computed, in item order.
pub struct ChunkOutput {
    /// `[b, h, n, d_v]`.
    pub out: Tensor<4>,
    /// log Σ exp(scores), `[b, h, n, 1]`.
    pub log_normaliser: Tensor<4>,
    /// With `weights`: the probabilities as `[b, h, n, n]`, row = item, column = key position
    /// (a key reached twice has its two weights summed) — for pictures, where items are the
    /// positions in order.
    pub weights: Option<Tensor<4>>,
}

/// Each chunk's queries over its neighbours' keys. A hidden key (padding), or causally a later
/// position, scores [`HIDDEN`]; then a query's own position scores `self_score` when given
/// (Reformer's shared-QK: −10⁵, "only if nothing else").
#[allow(clippy::too_many_arguments)]
pub fn adjacent_chunk_attention(
    items: ChunkItems,
    chunk: usize,
    before: usize,
    after: usize,
    causal: bool,
    self_score: Option<f32>,
    dropout: &Dropout,
    weights: bool,
) -> ChunkOutput {
    let [b, h, n, hd] = items.q.dims();
    let dv = items.v.dims()[3];
    assert!(n % chunk == 0, "{n} items in chunks of {chunk}");
    let chunks = n / chunk;
    let split = |t: Tensor<4>, w: usize| t.reshape([b * h, chunks, chunk, w]);
    // chunk c's keys: chunks c + i for i = −before … after, each rolled into place
    let adjacent = |t: Tensor<4>, w: usize| {
        let shifted = (-(before as i64)..=after as i64)
            .map(|i| {
                let at = i.rem_euclid(chunks as i64) as usize;
                match at {
                    0 => t.clone(),
                    _ => Tensor::cat(vec![t.clone().narrow(1, at, chunks - at), t.clone().narrow(1, 0, at)], 1),
                }
            })
            .collect();
        Tensor::cat(shifted, 2).reshape([b * h, chunks, chunk * (1 + before + after), w])
    };
    let q = split(items.q, hd);
    let k = adjacent(split(items.k, hd), hd);
    let v = adjacent(split(items.v, dv), dv);
    let q_pos = split(items.position.clone().float().unsqueeze_dim::<4>(3), 1);
    let k_pos = adjacent(split(items.position.float().unsqueeze_dim::<4>(3), 1), 1).swap_dims(2, 3);
    let keys = k.dims()[2];
    let full = [b * h, chunks, chunk, keys];

    let mut scores = q.matmul(k.swap_dims(2, 3));
    if let Some(hidden) = items.hidden {
        let hidden = adjacent(split(hidden.float().unsqueeze_dim::<4>(3), 1), 1).swap_dims(2, 3);
        scores = scores.mask_fill(hidden.greater_elem(0.5).expand(full), HIDDEN);
    }
    // positions are small integers in f32: the comparisons are exact
    let ahead = k_pos.clone() - q_pos.clone();
    if causal {
        scores = scores.mask_fill(ahead.clone().greater_elem(0.5).expand(full), HIDDEN);
    }
    if let Some(s) = self_score {
        scores = scores.mask_fill(ahead.abs().lower_elem(0.5).expand(full), s);
    }
    let z = log_sum_exp(scores.clone());
    let probs = dropout.forward((scores - z.clone()).exp());
    let weights = weights.then(|| {
        let columns = k_pos.int().expand(full).reshape([b, h, n, keys]);
        let dense: Tensor<4> = Tensor::zeros([b, h, n, n], &probs.device());
        dense.scatter(3, columns, probs.clone().reshape([b, h, n, keys]), IndexingUpdateOp::Add)
    });
    ChunkOutput { out: probs.matmul(v).reshape([b, h, n, dv]), log_normaliser: z.reshape([b, h, n, 1]), weights }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::DropoutConfig;

    /// Against a dense softmax over the keys each chunk reaches, written out per query: the wrap,
    /// a key reached twice counted twice, padding hidden, the self score.
    #[test]
    fn each_chunk_attends_to_its_neighbours_modulo_the_chunks() {
        let dev = Device::flex();
        let (n, m, d) = (6, 2, 3);
        // fixed values, no generator: sin of distinct arguments
        let r = |s: f32| {
            let values: Vec<f32> = (0..n * d).map(|i| (1.7 * i as f32 + s).sin() * 2.0).collect();
            Tensor::<4>::from_data(TensorData::new(values, [1, 1, n, d]), &dev)
        };
        let (q, k, v) = (r(0.0), r(0.5), r(1.0));
        let flat = |t: &Tensor<4>| t.clone().into_data().try_to_vec::<f32>().unwrap();
        let (qs, ks, vs) = (flat(&q), flat(&k), flat(&v));
        let position: Tensor<3, Int> = Tensor::arange(0..n as i64, &dev).reshape([1, 1, n]);
        let dropout = DropoutConfig::new(0.0).init();
        // 3 chunks, two before: chunk 0 sees chunks 1, 2 (wrapped) and 0; position 5 is padding
        let hidden = Tensor::<1, Int>::from_data([0, 0, 0, 0, 0, 1], &dev).equal_elem(1).reshape([1, 1, n]);
        for (before, after, self_score) in [(1, 0, None), (2, 0, Some(-1e5f32)), (1, 2, None)] {
            let items = ChunkItems {
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                position: position.clone(),
                hidden: Some(hidden.clone()),
            };
            let result = adjacent_chunk_attention(items, m, before, after, false, self_score, &dropout, true);
            let out = flat(&result.out);
            let weights = flat(&result.weights.unwrap());
            for i in 0..n {
                let c = i / m;
                let reached: Vec<usize> = (-(before as i64)..=after as i64)
                    .flat_map(|s| {
                        let cc = (c as i64 + s).rem_euclid(3) as usize;
                        (cc * m..cc * m + m).collect::<Vec<_>>()
                    })
                    .collect();
                let score = |j: usize| -> f64 {
                    if j == 5 {
                        return -1e9;
                    }
                    if j == i && self_score.is_some() {
                        return -1e5;
                    }
                    (0..d).map(|e| (qs[i * d + e] * ks[j * d + e]) as f64).sum()
                };
                let max = reached.iter().map(|&j| score(j)).fold(f64::MIN, f64::max);
                let w: Vec<f64> = reached.iter().map(|&j| (score(j) - max).exp()).collect();
                let total: f64 = w.iter().sum();
                for e in 0..d {
                    let want: f64 = reached.iter().zip(&w).map(|(&j, w)| w / total * vs[j * d + e] as f64).sum();
                    let got = out[i * d + e] as f64;
                    assert!((got - want).abs() < 1e-5, "before {before} after {after}: item {i}: {got} vs {want}");
                }
                // the dense weights: a key reached twice holds both its weights
                for j in 0..n {
                    let want: f64 = reached.iter().zip(&w).filter(|(r, _)| **r == j).map(|(_, w)| w / total).sum();
                    let got = weights[i * n + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "before {before} after {after}: weight ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
