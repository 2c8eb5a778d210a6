//! Keys at explicit positions, per block of queries: the part of a sparse pattern that is not a
//! band — BigBird's random blocks, the fixed pattern's summary columns, a blockwise permutation,
//! global columns.
//!
//! Block i's B queries score the m keys listed for it (`[b·h, nb, B, m]`, one batched GEMM after
//! one `select` of the keys), so the work is O(L·m·d) and no L × L matrix exists. The listed keys
//! are at no common offset from their queries, so no [`ScoreLayout`](variorum_position::ScoreLayout)
//! describes them: a position scheme enters through the explicit distances
//! ([`RelativePosition::bias_at`](variorum_position::RelativePosition::bias_at)), which is why the
//! patterns built on key sets accept only the schemes that act through the distance alone
//! (none, the absolute ones, RoPE, ALiBi, T5).

use burn::prelude::*;
use variorum_position::Distances;

use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;

/// For each block of queries, the positions of the keys it may score, and which of its queries see
/// which of them.
#[derive(Debug, Clone)]
pub struct KeySet {
    /// 1 (every head sees the same keys) or one set per query head.
    pub groups: usize,
    /// Query blocks.
    pub blocks: usize,
    /// Queries per block.
    pub block: usize,
    /// Key slots per block.
    pub keys: usize,
    /// `[groups, blocks, keys]`; `None` is an empty slot (never seen).
    pub positions: Vec<Option<usize>>,
    /// `[groups, blocks, block, keys]`, true where the query must not see the key.
    pub hidden: Vec<bool>,
    /// `[blocks, block]`, the position of each query row when the blocks are not consecutive
    /// runs of the sequence (2D local attention's rectangles); `None` = row i·B + r is position
    /// i·B + r. An empty entry is a padding row.
    pub queries: Option<Vec<Option<usize>>>,
    /// The listed keys may also be in the pattern's band or global columns and are then scored
    /// again, each copy counted in the softmax (BigBird's `random_draw = "first-block"`). The
    /// block-sparse kernel keeps one bit per (query, key), so such a set keeps the composed path.
    pub repeats: bool,
}

impl KeySet {
    /// `slot(g, i, s)` lists the keys of block i for group g; `sees(g, q, k)` says whether query
    /// position q sees key position k. Queries past `len` (block padding) see nothing.
    pub fn new(
        groups: usize,
        len: usize,
        block: usize,
        keys: usize,
        slot: impl Fn(usize, usize, usize) -> Option<usize>,
        sees: impl Fn(usize, usize, usize) -> bool,
    ) -> Self {
        let blocks = len.div_ceil(block);
        let positions: Vec<Option<usize>> = (0..groups)
            .flat_map(|g| (0..blocks).flat_map(move |i| (0..keys).map(move |s| (g, i, s))))
            .map(|(g, i, s)| slot(g, i, s).filter(|&k| k < len))
            .collect();
        let mut hidden = Vec::with_capacity(groups * blocks * block * keys);
        for g in 0..groups {
            for i in 0..blocks {
                for r in 0..block {
                    let q = i * block + r;
                    for s in 0..keys {
                        let k = positions[(g * blocks + i) * keys + s];
                        hidden.push(q >= len || k.is_none_or(|k| !sees(g, q, k)));
                    }
                }
            }
        }
        Self { groups, blocks, block, keys, positions, hidden, queries: None, repeats: false }
    }

    /// Query blocks made of the listed positions (`queries[i·B + r]`, `None` for padding), one
    /// group of keys for all heads: `slot(i, s)` lists block i's keys, `sees(q, k)` the pattern.
    pub fn for_queries(
        queries: Vec<Option<usize>>,
        block: usize,
        keys: usize,
        len: usize,
        slot: impl Fn(usize, usize) -> Option<usize>,
        sees: impl Fn(usize, usize) -> bool,
    ) -> Self {
        let blocks = queries.len() / block;
        let positions: Vec<Option<usize>> = (0..blocks)
            .flat_map(|i| (0..keys).map(move |s| (i, s)))
            .map(|(i, s)| slot(i, s).filter(|&k| k < len))
            .collect();
        let mut hidden = Vec::with_capacity(blocks * block * keys);
        for i in 0..blocks {
            for r in 0..block {
                for s in 0..keys {
                    let (q, k) = (queries[i * block + r], positions[i * keys + s]);
                    hidden.push(match (q, k) {
                        (Some(q), Some(k)) => !sees(q, k),
                        _ => true,
                    });
                }
            }
        }
        Self { groups: 1, blocks, block, keys, positions, hidden, queries: Some(queries), repeats: false }
    }

    /// The position of query row `r` of block `i`.
    fn query(&self, i: usize, r: usize) -> usize {
        match &self.queries {
            Some(q) => q[i * self.block + r].unwrap_or(0),
            None => i * self.block + r,
        }
    }

    /// The same keys with those more than `max_back` positions before their query hidden.
    pub fn limited(&self, max_back: Option<usize>) -> Self {
        let mut set = self.clone();
        let Some(n) = max_back else { return set };
        let (nb, bs, m) = (self.blocks, self.block, self.keys);
        for g in 0..self.groups {
            for i in 0..nb {
                for r in 0..bs {
                    for s in 0..m {
                        if let Some(k) = self.positions[(g * nb + i) * m + s]
                            && self.query(i, r).saturating_sub(k) > n
                        {
                            set.hidden[((g * nb + i) * bs + r) * m + s] = true;
                        }
                    }
                }
            }
        }
        set
    }

    /// The same keys for every block (global columns).
    pub fn columns(len: usize, block: usize, positions: &[usize], causal: bool) -> Self {
        Self::new(1, len, block, positions.len(), |_, _, s| Some(positions[s]), |_, q, k| !causal || k <= q)
    }
}

/// The scores of a [`KeySet`], `[b·h, nb, B, m]` (position scheme applied, hidden entries at
/// [`MASKED_SCORE`]), and the gathered values `[b·h, nb, m, d_h]`.
pub fn gathered_scores(mha: &MultiHeadAttention, p: &Projected, set: &KeySet) -> (Tensor<4>, Tensor<4>) {
    let [b, h, l, dh] = p.q_dims();
    let hkv = p.k.dims()[1];
    let device = p.device();
    let KeySet { groups, blocks: nb, block: bs, keys: m, .. } = *set;
    // one zero row at position l stands in for empty slots
    let per_head = |x: Tensor<4>| {
        let x =
            if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, l, dh]).reshape([b, h, l, dh]) };
        Tensor::cat(vec![x, Tensor::zeros([b, h, 1, dh], &device)], 2)
    };
    let index = |g: usize| {
        let at: Vec<i64> = set.positions[g * nb * m..(g + 1) * nb * m].iter().map(|k| k.unwrap_or(l) as i64).collect();
        Tensor::<1, Int>::from_data(TensorData::new(at, [nb * m]), &device)
    };
    let gather = |x: Tensor<4>| {
        let x = per_head(x);
        let x = if groups == 1 {
            x.select(2, index(0))
        } else {
            Tensor::cat((0..h).map(|g| x.clone().narrow(1, g, 1).select(2, index(g))).collect(), 1)
        };
        x.reshape([b * h, nb, m, dh])
    };
    let (k, v) = (gather(p.k.clone()), gather(p.v.clone()));
    let q = match &set.queries {
        // rows gathered into their blocks, a zero row for padding
        Some(rows) => {
            let at: Vec<i64> = rows.iter().map(|r| r.unwrap_or(l) as i64).collect();
            let at = Tensor::<1, Int>::from_data(TensorData::new(at, [nb * bs]), &device);
            Tensor::cat(vec![p.q(), Tensor::zeros([b, h, 1, dh], &device)], 2).select(2, at)
        }
        None => {
            let pad = nb * bs - l;
            if pad == 0 { p.q() } else { Tensor::cat(vec![p.q(), Tensor::zeros([b, h, pad, dh], &device)], 2) }
        }
    };
    let mut scores = q.reshape([b * h, nb, bs, dh]).matmul(k.swap_dims(2, 3));

    if let Some(pos) = &mha.position {
        let values: Vec<i64> = (0..groups)
            .flat_map(|g| (0..nb).flat_map(move |i| (0..bs).flat_map(move |r| (0..m).map(move |s| (g, i, r, s)))))
            .map(|(g, i, r, s)| {
                let k = set.positions[(g * nb + i) * m + s].unwrap_or(0);
                set.query(i, r) as i64 - k as i64
            })
            .collect();
        let distances = Distances { dims: [groups, nb, bs, m], values, causal: p.layout.causal };
        if let Some(bias) = pos.bias_at(&distances, &device) {
            scores = scores + bias.unsqueeze_dim::<5>(0).expand([b, h, nb, bs, m]).reshape([b * h, nb, bs, m]);
        }
    }
    let hidden = Tensor::<4, Bool>::from_data(TensorData::new(set.hidden.clone(), [groups, nb, bs, m]), &device)
        .unsqueeze_dim::<5>(0)
        .expand([b, h, nb, bs, m])
        .reshape([b * h, nb, bs, m]);
    (scores.mask_fill(hidden, MASKED_SCORE), v)
}
