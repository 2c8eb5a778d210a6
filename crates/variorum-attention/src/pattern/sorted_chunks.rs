//! Attention within buckets over a sorted sequence, the machinery content-based kinds share
//! (`lsh`, `routing`): items are sorted by a key (bucket first), cut into chunks of m, and every
//! chunk attends to itself and the chunk before it, only to items of the query's bucket —
//! O(n·m) scores for n items, plus the sort.
//!
//! Causal: a chunk boundary depends on how many later items sort into lower buckets, which would
//! leak the future into the keys a query sees. Causally an item sees the m items before it *in
//! the sorted order* instead — within its bucket those are its latest predecessors, which depend
//! on the past alone (the sort key orders a bucket's items by position).
//!
//! An item may be a query, a key, or both: its query bucket and key bucket are separate
//! (−2 / −1 mark "not a query" / "not a key"), so a row whose bucket has no visible key returns
//! zero rather than an average of masked values.

use burn::nn::Dropout;
use burn::prelude::*;

use crate::cache::KvCache;

/// A score below any real one: masked pairs.
const MASKED: f32 = -1e9;

/// The items of one attention call, `[batch, heads, n, …]`.
pub struct SortedItems {
    pub q: Tensor<4>,
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    /// Sort key per item, distinct within a row; items are visited in ascending order.
    pub sort_key: Tensor<3, Int>,
    /// Bucket of the item as a query (−2: not a query), and as a key (−1: not a key).
    pub query_bucket: Tensor<3>,
    pub key_bucket: Tensor<3>,
    /// Where every item lies in each of several hash rounds (this call's included), for
    /// Reformer's duplicate correction: a pair's score loses log N, N the number of these rounds
    /// in which the key is among what the query sees. Empty: no correction (one round, routing).
    pub rounds: Vec<RoundLayout>,
}

/// An item's bucket and its index in the sorted order of one hash round, `[batch, heads, n]`
/// each (LSH: queries and keys are the same items, so one bucket serves both).
#[derive(Clone)]
pub struct RoundLayout {
    pub bucket: Tensor<3, Int>,
    pub rank: Tensor<3, Int>,
}

impl RoundLayout {
    /// The layout of a round sorted by `sort_key` (distinct within a row), buckets `bucket`.
    pub fn new(bucket: Tensor<3, Int>, sort_key: Tensor<3, Int>) -> Self {
        Self { bucket, rank: sort_key.argsort(2).argsort(2) }
    }
}

/// Outputs `[b, h, n, d_v]` and log-normalisers log Σ exp(scores) `[b, h, n, 1]`, in item order.
/// `self_score`: an item's score against itself (Reformer: −10⁵, "only if nothing else").
pub fn sorted_chunk_attention(
    items: SortedItems,
    chunk: usize,
    causal: bool,
    self_score: Option<f32>,
    dropout: &Dropout,
) -> (Tensor<4>, Tensor<4>) {
    let [b, h, n, hd] = items.q.dims();
    let dv = items.v.dims()[3];
    let device = items.q.device();
    let m = chunk.min(n);
    let chunks = n.div_ceil(m);
    let padded = chunks * m;

    let (_, order) = items.sort_key.sort_with_indices(2);
    let pick = |t: Tensor<4>, w: usize| t.gather(2, order.clone().unsqueeze_dim::<4>(3).expand([b, h, n, w]));
    // padding sorts last; it is neither a query nor a key
    let pad = |t: Tensor<4>, w: usize, fill: f32| {
        if padded == n { t } else { Tensor::cat(vec![t, Tensor::full([b, h, padded - n, w], fill, &device)], 2) }
    };
    let chunked = |t: Tensor<4>, w: usize, fill: f32| pad(t, w, fill).reshape([b * h, chunks, m, w]);
    let sq = chunked(pick(items.q, hd), hd, 0.0);
    let sk = chunked(pick(items.k, hd), hd, 0.0);
    let sv = chunked(pick(items.v, dv), dv, 0.0);
    let qb = chunked(pick(items.query_bucket.unsqueeze_dim::<4>(3), 1), 1, -2.0);
    let kb = chunked(pick(items.key_bucket.unsqueeze_dim::<4>(3), 1), 1, -1.0);

    // keys of a chunk: the chunk before it (the first wraps to the last, as in Reformer), then
    // its own; one chunk: its own only
    let with_previous = |t: Tensor<4>, w: usize| {
        if chunks == 1 {
            return t;
        }
        let previous = Tensor::cat(vec![t.clone().narrow(1, chunks - 1, 1), t.clone().narrow(1, 0, chunks - 1)], 1);
        Tensor::cat(vec![previous, t], 2).reshape([b * h, chunks, 2 * m, w])
    };
    let (ck, cv) = (with_previous(sk, hd), with_previous(sv, dv));
    let kb = with_previous(kb, 1).swap_dims(2, 3);
    let n_keys = ck.dims()[2];
    let full = [b * h, chunks, m, n_keys];
    // per round, a query's and a key's bucket, sorted index and chunk: [bh, chunks, m, 3] and
    // [bh, chunks, 3, keys]
    let layouts: Vec<(Tensor<4>, Tensor<4>)> = items
        .rounds
        .iter()
        .map(|round| {
            let chunk_of = round.rank.clone().div_scalar(m as i64);
            let parts = [round.bucket.clone(), round.rank.clone(), chunk_of].map(|t| t.float().unsqueeze_dim::<4>(3));
            let place = chunked(pick(Tensor::cat(parts.to_vec(), 3), 3), 3, -1.0);
            (place.clone(), with_previous(place, 3).swap_dims(2, 3))
        })
        .collect();

    let scores = sq.matmul(ck.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
    let (is_self, outside) = chunk_masks(chunks, m, n_keys, causal, &device);
    let lift = |t: Tensor<3, Bool>| t.unsqueeze_dim::<4>(0).expand(full);
    let scores = match self_score {
        Some(s) => scores.mask_fill(lift(is_self), s),
        None => scores,
    };
    let scores = match layouts.is_empty() {
        true => scores,
        false => scores - met_in_rounds(layouts, m, chunks, causal).clamp_min(1.0).log(),
    };
    let hidden = (qb - kb).abs().greater_elem(0.5).expand(full).bool_or(lift(outside));
    let scores = scores.mask_fill(hidden.clone(), MASKED);
    let z = log_sum_exp(scores.clone()); // [bh, chunks, m, 1]
    // a row with nothing visible gets zero weights, not a uniform average of hidden keys
    let probs = (scores - z.clone()).exp() * hidden.bool_not().float();
    let out = dropout.forward(probs).matmul(cv).reshape([b, h, padded, dv]).narrow(2, 0, n);
    let z = z.reshape([b, h, padded, 1]).narrow(2, 0, n);

    // back to item order: the inverse permutation is the sort of the permutation
    let inverse = order.argsort(2).unsqueeze_dim::<4>(3);
    (out.gather(2, inverse.clone().expand([b, h, n, dv])), z.gather(2, inverse))
}

/// N_ij, the number of rounds in which key j is among what query i sees, `[bh, chunks, m, keys]`
/// from each round's query places `[bh, chunks, m, 3]` and key places `[bh, chunks, 3, keys]`
/// (bucket, sorted index, chunk). Seen means: the same bucket, and causally at most m sorted
/// items back (self included), otherwise in the query's chunk or the one before it (the first
/// chunk's "before" wraps to the last, as [`sorted_chunk_attention`] arranges the keys).
fn met_in_rounds(layouts: Vec<(Tensor<4>, Tensor<4>)>, m: usize, chunks: usize, causal: bool) -> Tensor<4> {
    let field = |t: &Tensor<4>, f: usize, dim: usize| t.clone().narrow(dim, f, 1);
    layouts
        .into_iter()
        .map(|(q, k)| {
            // small integers in f32: exact, so these comparisons are too
            let same_bucket = (field(&q, 0, 3) - field(&k, 0, 2)).abs().lower_elem(0.5);
            let seen = if causal {
                let back = field(&q, 1, 3) - field(&k, 1, 2);
                back.clone().greater_elem(-0.5).bool_and(back.lower_elem(m as f32 + 0.5))
            } else {
                // chunk distance 0 (own), 1 (the one before) or −(chunks − 1) (the wrap)
                let back = field(&q, 2, 3) - field(&k, 2, 2);
                let near = |t: f32| back.clone().sub_scalar(t).abs().lower_elem(0.5);
                near(0.0).bool_or(near(1.0)).bool_or(near(1.0 - chunks as f32))
            };
            same_bucket.bool_and(seen).float()
        })
        .reduce(|a, c| a + c)
        .expect("at least one round")
}

/// Which (query, key) pairs of a chunk are the same sorted item, and which lie outside what a
/// query may see: `[chunks, m, keys]` each. Causal: sorted offsets 0…m back.
fn chunk_masks(
    chunks: usize,
    m: usize,
    keys: usize,
    causal: bool,
    device: &Device,
) -> (Tensor<3, Bool>, Tensor<3, Bool>) {
    let (mut is_self, mut outside) = (Vec::new(), Vec::new());
    for c in 0..chunks {
        for s in c * m..(c + 1) * m {
            for j in 0..keys {
                // sorted index of key j: the chunk before, then the own chunk
                let t = match keys == m {
                    true => c * m + j,
                    false if j < m => ((c + chunks - 1) % chunks) * m + j,
                    false => c * m + j - m,
                };
                is_self.push(t == s);
                outside.push(causal && (t > s || s - t > m));
            }
        }
    }
    let mk = |v: Vec<bool>| Tensor::from_data(TensorData::new(v, [chunks, m, keys]), device);
    (mk(is_self), mk(outside))
}

/// One new query `[b, h, 1, hd]` against the cached keys it picks. `picks[b·h]` lists positions
/// `0..len` of the cache (at most `width`; fewer are padded as hidden); the keys are the first
/// `hd` features of the cache's key entries. `self_score` gives position `len − 1`, the query's
/// own, that score; keys are unit-normalised first when `unit_keys` (LSH's shared-QK keys).
/// `met[b·h][j]`, when given, is how many hash rounds pick `picks[b·h][j]` (Reformer's duplicate
/// correction: the score loses its log). Returns the output `[b, h, 1, d_v]` and the
/// log-normaliser `[b, h, 1, 1]`, as [`sorted_chunk_attention`] gives them for that query.
pub fn attend_picked(
    q: Tensor<4>,
    cache: &KvCache,
    picks: &[Vec<i64>],
    width: usize,
    self_score: Option<f32>,
    unit_keys: bool,
    met: Option<&[Vec<usize>]>,
) -> (Tensor<4>, Tensor<4>) {
    let [b, h, _, hd] = q.dims();
    let (k, v, offset) = cache.buffers().expect("a token was appended");
    let (kw, dv) = (k.dims()[3], v.dims()[3]);
    let last = cache.len() as i64 - 1;
    let device = q.device();
    let mut index = Vec::with_capacity(b * h * width);
    let (mut hidden, mut is_self) = (Vec::with_capacity(b * h * width), Vec::with_capacity(b * h * width));
    let mut log_met = Vec::with_capacity(b * h * width);
    for (r, row) in picks.iter().enumerate() {
        for j in 0..width {
            let at = row.get(j).copied();
            index.push(at.unwrap_or(0) + offset as i64);
            hidden.push(at.is_none());
            is_self.push(at == Some(last));
            log_met.push(met.and_then(|m| m[r].get(j)).map_or(0.0, |&n| (n.max(1) as f32).ln()));
        }
    }
    let index = Tensor::<3, Int>::from_data(TensorData::new(index, [b, h, width]), &device).unsqueeze_dim::<4>(3);
    let keys = k.gather(2, index.clone().expand([b, h, width, kw])).narrow(3, 0, hd);
    let keys = if unit_keys { keys.clone() / (keys.powf_scalar(2.0).sum_dim(3).sqrt() + 1e-6) } else { keys };
    let values = v.gather(2, index.expand([b, h, width, dv]));
    let mask = |m: Vec<bool>| Tensor::<4, Bool>::from_data(TensorData::new(m, [b, h, 1, width]), &device);
    let hidden = mask(hidden);
    let scores = q.matmul(keys.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
    let scores = match self_score {
        Some(s) => scores.mask_fill(mask(is_self), s),
        None => scores,
    };
    let scores = match met {
        Some(_) => scores - Tensor::<4>::from_data(TensorData::new(log_met, [b, h, 1, width]), &device),
        None => scores,
    };
    let scores = scores.mask_fill(hidden.clone(), MASKED);
    let z = log_sum_exp(scores.clone());
    let probs = (scores - z.clone()).exp() * hidden.bool_not().float();
    (probs.matmul(values), z)
}

/// log Σ exp over the last dimension (kept), stable.
pub fn log_sum_exp(t: Tensor<4>) -> Tensor<4> {
    let max = t.clone().max_dim(3).detach();
    (t - max.clone()).exp().sum_dim(3).log() + max
}

/// An integer tensor's values, row-major (the labels decoding keeps on the host).
pub fn host(t: Tensor<3, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_into_vec::<i64>().unwrap_or_default()
}
