//! Band attention computed by blocks: query i sees keys j with i − back ≤ j ≤ i + ahead (in
//! absolute positions), and only those pairs are ever scored.
//!
//! The sequence is cut into blocks of B positions (the last padded, invisibly). Block i's queries
//! score the keys of blocks i − ⌈back/B⌉ … i + ⌈ahead/B⌉, gathered into one span of S keys by
//! stacking shifted views of the blocked keys, so all blocks are one batched GEMM of
//! `[B, d] × [d, S]`: O(L·S·d) work and O(L·S) memory instead of O(L²). Inside the span a small
//! constant mask keeps the exact band (and hides the padding).
//!
//! [`BandAttention`](crate::pattern::band_attention::BandAttention) is multi-head attention restricted to a band, the module of the
//! `sliding-window`, `local` and `multi-scale` kinds: blocks for a fresh sequence, the dense
//! masked computation when the keys are not the queries (a KV cache, a memory) or when weights
//! are asked for.
//!
//! Every block has the same geometry (its keys start ⌈back/B⌉·B before its queries), so a
//! relative position scheme gets one [`ScoreLayout`] for all of them: relative schemes are
//! functions of query − key distance only.

use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::gathered::{KeySet, gathered_scores};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use variorum_position::{Distances, ScoreLayout};

/// Masked band scores of aligned queries and keys, block by block.
pub struct BandScores {
    /// `[b·δ·h, nb, B, span]`, the position scheme applied, hidden entries at [`MASKED_SCORE`].
    pub scores: Tensor<4>,
    /// The value spans, `[b·δ·h, nb, span, d_h]`.
    pub v: Tensor<4>,
    /// The layout every block shares.
    pub layout: ScoreLayout,
    /// `[b·δ, h, nb, B, span, d_h]`.
    pub dims: [usize; 6],
    /// δ: the band runs over every δ-th position (1 = contiguous).
    pub dilation: usize,
}

impl BandScores {
    /// Block-form `[b·δ·h, nb, B, w]` (or a context `[b·δ, h, nb·B, w]`) → rows in position
    /// order, `[b, h, len, w]`.
    pub fn to_rows(&self, x: Tensor<4>, len: usize) -> Tensor<4> {
        let [bb, h, nb, bs, _, _] = self.dims;
        let (d, w) = (self.dilation, x.dims()[3]);
        x.reshape([bb / d, d, h, nb * bs, w])
            .permute([0, 2, 3, 1, 4])
            .reshape([bb / d, h, nb * bs * d, w])
            .narrow(2, 0, len)
    }

    /// The inverse of [`to_rows`](Self::to_rows) for `[b, h, len, w]`: `[b·δ·h, nb, B, w]`.
    pub fn from_rows(&self, x: Tensor<4>) -> Tensor<4> {
        let [bb, h, nb, bs, _, _] = self.dims;
        let d = self.dilation;
        let [b, _, len, w] = x.dims();
        pad_len(x, nb * bs * d - len).reshape([b, h, nb * bs, d, w]).permute([0, 3, 1, 2, 4]).reshape([
            bb * h,
            nb,
            bs,
            w,
        ])
    }
}

/// The scores of [`banded`] before the softmax (global keys left out of the band).
pub fn band_scores(mha: &MultiHeadAttention, p: &Projected, bands: &[Band], global: &[usize]) -> BandScores {
    dilated_band_scores(mha, p, bands, 1, global)
}

/// Band scores over every δ-th position (Longformer's dilated window; δ = 1 is the plain band):
/// the sequence is split into its δ residue classes (positions r, r + δ, r + 2δ, …), each an
/// ordinary band problem whose reach `back`/`ahead` counts keys δ positions apart. One score
/// layout (with stride δ) still serves every block, so every relative scheme applies.
pub fn dilated_band_scores(
    mha: &MultiHeadAttention,
    p: &Projected,
    bands: &[Band],
    dilation: usize,
    global: &[usize],
) -> BandScores {
    let [b, h, l, dh] = p.q_dims();
    let hkv = p.k.dims()[1];
    let device = p.device();
    let dil = dilation.max(1);
    let n = l.div_ceil(dil);
    // residue classes: [b, heads, L, d] → [b·δ, heads, n, d]
    let residues = |x: Tensor<4>| {
        if dil == 1 {
            return x;
        }
        let [b, heads, _, d] = x.dims();
        pad_len(x, n * dil - l).reshape([b, heads, n, dil, d]).permute([0, 3, 1, 2, 4]).reshape([b * dil, heads, n, d])
    };
    let bb = b * dil;
    let bs = bands[0].block.clamp(1, n.max(1));
    let nb = n.div_ceil(bs);
    let pad = nb * bs - n;
    let before = bands.iter().map(|band| band.back.div_ceil(bs)).max().unwrap_or(0);
    let after = bands.iter().map(|band| if band.causal { 0 } else { band.ahead.div_ceil(bs) }).max().unwrap_or(0);
    let span = (before + 1 + after) * bs;

    // keys and values: one copy per query head (GQA shares them; the span stacking copies anyway)
    let expand = |x: Tensor<4>| {
        if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([bb, hkv, h / hkv, n, dh]).reshape([bb, h, n, dh]) }
    };
    let per_head = |x: Tensor<4>| {
        let x = expand(residues(x));
        // [b·h, nb, B, d] with `before` empty blocks in front and `after` behind
        let x = pad_len(x, pad).reshape([bb * h, nb, bs, dh]);
        let front = Tensor::zeros([bb * h, before, bs, dh], &device);
        let back = Tensor::zeros([bb * h, after, bs, dh], &device);
        let x = Tensor::cat(vec![front, x, back], 1);
        // block i's span: blocks i … i + before + after of the padded sequence
        let views: Vec<Tensor<4>> = (0..before + 1 + after).map(|s| x.clone().narrow(1, s, nb)).collect();
        Tensor::cat(views, 2) // [b·h, nb, span, d]
    };
    let k = per_head(p.k.clone());
    let v = per_head(p.v.clone());
    let q = pad_len(residues(p.q()), pad).reshape([bb * h, nb, bs, dh]);
    let mut scores = q.clone().matmul(k.clone().swap_dims(2, 3)); // [b·h, nb, B, span]
    // one layout for every block: its keys start `before` blocks before its queries
    let layout = ScoreLayout::new(before * bs * dil, 0, bs, span, p.layout.causal).with_stride(dil);

    if let Some(pos) = &mha.position {
        let by_block =
            |x: Tensor<4>, w: usize| x.reshape([bb, h, nb, bs, w]).swap_dims(1, 2).reshape([bb * nb, h, bs, w]);
        let s = by_block(scores, span);
        let qb = by_block(q, dh);
        let kb = k.clone().reshape([bb, h, nb, span, dh]).swap_dims(1, 2).reshape([bb * nb, h, span, dh]);
        let s = pos.scores(s, qb, kb, &layout, mha.scale);
        scores = s.reshape([bb, nb, h, bs, span]).swap_dims(1, 2).reshape([bb * h, nb, bs, span]);
    }

    let mut is_global = vec![false; l];
    for &g in global.iter().filter(|&&g| g < l) {
        is_global[g] = true;
    }
    let far = p.max_back.map_or(i64::MAX, |n| n as i64);
    let mask = span_mask(bands, &is_global, dil, bs, nb, before, span, far, &device); // [δ, bands, nb, B, span]
    let mask = if dil == 1 && bands.len() == 1 {
        // one band, undilated: broadcast over batch and heads rather than copied
        mask.reshape([1, nb, bs, span])
    } else {
        mask.unsqueeze_dim::<6>(0).expand([b, dil, h, nb, bs, span]).reshape([bb * h, nb, bs, span])
    };
    let scores = scores.mask_fill(mask, MASKED_SCORE);
    BandScores { scores, v, layout, dims: [bb, h, nb, bs, span, dh], dilation: dil }
}

/// The band attention of aligned queries and keys (`p.layout.q_start == p.layout.k_start`, equal
/// lengths): the per-head context `[b, h, len, d_h]`, before the output projection. `bands` is
/// one band for every head, or one per head (all with the same block; the span covers the widest).
/// `global` positions as in the engine's `Pattern`.
pub fn banded(mha: &MultiHeadAttention, p: &Projected, bands: &[Band], global: &[usize]) -> Tensor<4> {
    let part = BandPart { bands: bands.to_vec(), dilation: 1, heads: Vec::new() };
    sparse(mha, p, &Pattern { block: bands[0].block, bands: &[part], global, extra: None })
}

/// How the probabilities of one piece of the softmax become context.
enum Piece {
    Band(BandScores),
    /// Values in block form `[b·h, nb, w, d_h]`.
    Gathered(Tensor<4>),
    /// Global columns scored one by one (position schemes that need a layout): their values
    /// `[b, h, g, d_h]` and positions.
    Columns(Tensor<4>, Vec<usize>),
}

/// The context `[b, h, len, d_h]` of aligned queries and keys under `pattern`.
pub fn sparse(mha: &MultiHeadAttention, p: &Projected, pattern: &Pattern) -> Tensor<4> {
    let [b, h, l, dh] = p.q_dims();
    let hkv = p.k.dims()[1];
    let device = p.device();
    let causal = p.layout.causal;
    // the callers' key sets are laid out in blocks of exactly `pattern.block` (a sequence shorter
    // than one block is one padded block)
    let bs = pattern.block.max(1);
    let nb = l.div_ceil(bs);
    let pad = nb * bs - l;
    let mut global: Vec<usize> = pattern.global.iter().copied().filter(|&g| g < l).collect();
    global.sort_unstable();
    global.dedup();
    if let Some(context) = crate::engine::sparse_kernel::context(mha, p, pattern, &global) {
        return context;
    }
    let gathered_ok = mha.position.as_ref().is_none_or(|pos| pos.works_on_gathered_keys());
    let expand = |x: Tensor<4>| {
        if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, l, dh]).reshape([b, h, l, dh]) }
    };
    let block_rows = |x: Tensor<4>| {
        let w = x.dims()[3];
        x.reshape([b, h, nb * bs, w]).narrow(2, 0, l)
    };
    let rows_block = |x: Tensor<4>| {
        let w = x.dims()[3];
        pad_len(x, pad).reshape([b * h, nb, bs, w])
    };

    // each piece's scores as rows in position order, [b, h, L, w]
    let mut pieces: Vec<(Tensor<4>, Piece)> = Vec::new();
    for part in pattern.bands {
        let band = dilated_band_scores(mha, p, &part.bands, part.dilation, &global);
        let mut rows = band.to_rows(band.scores.clone(), l);
        if !part.heads.is_empty() {
            let off: Vec<bool> = part.heads.iter().map(|on| !on).collect();
            let off = Tensor::<1, Bool>::from_data(TensorData::new(off, [h]), &device).reshape([1, h, 1, 1]);
            let w = rows.dims()[3];
            rows = rows.mask_fill(off.expand([b, h, l, w]), MASKED_SCORE);
        }
        pieces.push((rows, Piece::Band(band)));
    }
    if let Some(set) = pattern.extra {
        let (scores, v) = gathered_scores(mha, p, &set.limited(p.max_back));
        pieces.push((block_rows(scores), Piece::Gathered(v)));
    }
    if !global.is_empty() {
        if gathered_ok {
            let columns = KeySet::columns(l, bs, &global, causal).limited(p.max_back);
            let (scores, v) = gathered_scores(mha, p, &columns);
            pieces.push((block_rows(scores), Piece::Gathered(v)));
        } else {
            let (scores, v) = global_columns(mha, p, &global);
            pieces.push((scores, Piece::Columns(v, global.clone())));
        }
    }

    let widths: Vec<usize> = pieces.iter().map(|(s, _)| s.dims()[3]).collect();
    let scores: Vec<Tensor<4>> = pieces.iter().map(|(s, _)| s.clone()).collect();
    let probs = mha.dropout.forward(mha.normalise(Tensor::cat(scores, 3)));
    let mut out: Tensor<4> = Tensor::zeros([b, h, l, dh], &device);
    let mut at = 0;
    for ((_, piece), w) in pieces.into_iter().zip(widths) {
        let pr = probs.clone().narrow(3, at, w);
        at += w;
        out = out
            + match piece {
                Piece::Band(band) => {
                    let context = band_context(mha, band.from_rows(pr), band.v.clone(), &band.layout, band.dims);
                    band.to_rows(context, l)
                }
                Piece::Gathered(v) => block_rows(rows_block(pr).matmul(v)),
                Piece::Columns(v, positions) => {
                    let mut context = pr.clone().matmul(v);
                    if let Some(pos) = &mha.position {
                        for (j, &pos_j) in positions.iter().enumerate() {
                            let layout = ScoreLayout::new(0, pos_j, l, 1, causal);
                            if let Some(extra) = pos.context(pr.clone().narrow(3, j, 1), &layout) {
                                context = context + extra;
                            }
                        }
                    }
                    context
                }
            };
    }
    if global.is_empty() {
        return out;
    }

    // global queries: their rows replaced by a full row each, over every key they may see
    let (k_all, v_all) = (expand(p.k.clone()), expand(p.v.clone()));
    let g = global.len();
    let at = Tensor::<1, Int>::from_data(TensorData::new(global.iter().map(|&x| x as i64).collect(), [g]), &device);
    let rows = if gathered_ok {
        let qg = p.q().select(2, at.clone());
        let mut scores = qg.matmul(k_all.swap_dims(2, 3)); // [b, h, g, L]
        if let Some(pos) = &mha.position {
            let values = global.iter().flat_map(|&i| (0..l).map(move |j| i as i64 - j as i64)).collect();
            if let Some(bias) = pos.bias_at(&Distances { dims: [1, 1, g, l], values, causal }, &device) {
                scores = scores + bias.reshape([1, h, g, l]);
            }
        }
        if causal || p.max_back.is_some() {
            let far = p.max_back.unwrap_or(usize::MAX);
            let hidden: Vec<bool> = global
                .iter()
                .flat_map(|&i| (0..l).map(move |j| (causal && j > i) || i.saturating_sub(j) > far))
                .collect();
            let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [g, l]), &device);
            scores = scores.mask_fill(hidden.unsqueeze::<4>().expand([b, h, g, l]), MASKED_SCORE);
        }
        mha.dropout.forward(mha.normalise(scores)).matmul(v_all)
    } else {
        let rows = global
            .iter()
            .map(|&pos_i| {
                let qi = p.q().narrow(2, pos_i, 1);
                let first = p.max_back.map_or(0, |m| pos_i.saturating_sub(m));
                let n = if causal { pos_i + 1 } else { l } - first;
                let (k, v) = (k_all.clone().narrow(2, first, n), v_all.clone().narrow(2, first, n));
                let row_layout = ScoreLayout::new(pos_i, first, 1, n, causal);
                let row = qi.clone().matmul(k.clone().swap_dims(2, 3));
                let row = match &mha.position {
                    Some(pos) => pos.scores(row, qi, k, &row_layout, mha.scale),
                    None => row,
                };
                let probs = mha.dropout.forward(mha.normalise(row));
                let mut value = probs.clone().matmul(v);
                if let Some(extra) = mha.position.as_ref().and_then(|pos| pos.context(probs, &row_layout)) {
                    value = value + extra;
                }
                value
            })
            .collect();
        Tensor::cat(rows, 2)
    };
    let current = out.clone().select(2, at.clone());
    out.select_assign(2, at, rows - current, IndexingUpdateOp::Add)
}

/// Every query's scores against each global key, one layout per column: `[b, h, L, g]`, and
/// the global values `[b, h, g, d_h]`.
fn global_columns(mha: &MultiHeadAttention, p: &Projected, global: &[usize]) -> (Tensor<4>, Tensor<4>) {
    let [b, h, l, dh] = p.q_dims();
    let hkv = p.k.dims()[1];
    let device = p.device();
    let expand = |x: Tensor<4>| {
        let n = x.dims()[2];
        if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, n, dh]).reshape([b, h, n, dh]) }
    };
    let at = Tensor::<1, Int>::from_data(
        TensorData::new(global.iter().map(|&x| x as i64).collect::<Vec<_>>(), [global.len()]),
        &device,
    );
    let (kg, vg) = (expand(p.k.clone().select(2, at.clone())), expand(p.v.clone().select(2, at)));
    let columns: Vec<Tensor<4>> = global
        .iter()
        .enumerate()
        .map(|(j, &pos_j)| {
            let kj = kg.clone().narrow(2, j, 1);
            let col = p.q().matmul(kj.clone().swap_dims(2, 3)); // [b, h, L, 1]
            let col = match &mha.position {
                Some(pos) => pos.scores(col, p.q(), kj, &ScoreLayout::new(0, pos_j, l, 1, p.layout.causal), mha.scale),
                None => col,
            };
            if p.layout.causal || p.max_back.is_some() {
                let far = p.max_back.unwrap_or(usize::MAX);
                let hidden: Vec<bool> =
                    (0..l).map(|i| (p.layout.causal && pos_j > i) || i.saturating_sub(pos_j) > far).collect();
                col.mask_fill(
                    Tensor::<1, Bool>::from_data(TensorData::new(hidden, [l]), &device).reshape([1, 1, l, 1]),
                    MASKED_SCORE,
                )
            } else {
                col
            }
        })
        .collect();
    (Tensor::cat(columns, 3), vg)
}

/// probs `[b·h, nb, B, span]` × the value spans, plus a position scheme's context term:
/// `[b, h, nb·B, d]`.
pub fn band_context(
    mha: &MultiHeadAttention,
    probs: Tensor<4>,
    v: Tensor<4>,
    layout: &ScoreLayout,
    [b, h, nb, bs, span, dh]: [usize; 6],
) -> Tensor<4> {
    let mut context = probs.clone().matmul(v); // [b·h, nb, B, d]
    if let Some(pos) = &mha.position {
        let pb = probs.reshape([b, h, nb, bs, span]).swap_dims(1, 2).reshape([b * nb, h, bs, span]);
        if let Some(extra) = pos.context(pb, layout) {
            let extra = extra.reshape([b, nb, h, bs, dh]).swap_dims(1, 2).reshape([b * h, nb, bs, dh]);
            context = context + extra;
        }
    }
    context.reshape([b, h, nb * bs, dh])
}

/// `[δ, bands, nb, B, span]`, true where block i's query r of residue class c must not see span
/// key s under each band: outside it, before position 0, past the end, more than `max_back`
/// positions back, or a global key (scored in its own column). Indices count within the residue
/// class; `is_global` is by position.
#[allow(clippy::too_many_arguments)]
fn span_mask(
    bands: &[Band],
    is_global: &[bool],
    dilation: usize,
    bs: usize,
    nb: usize,
    before: usize,
    span: usize,
    max_back: i64,
    device: &Device,
) -> Tensor<5, Bool> {
    let len = is_global.len() as i64;
    let mut hidden = Vec::with_capacity(dilation * bands.len() * nb * bs * span);
    for c in 0..dilation as i64 {
        for band in bands {
            for i in 0..nb {
                for r in 0..bs {
                    let q = (i * bs + r) as i64;
                    for s in 0..span {
                        let k = (i * bs + s) as i64 - (before * bs) as i64;
                        let at = c + k * dilation as i64;
                        let far = (q - k) * dilation as i64 > max_back;
                        hidden.push(k < 0 || at >= len || far || is_global[at as usize] || !band.sees(q, k));
                    }
                }
            }
        }
    }
    Tensor::from_data(TensorData::new(hidden, [dilation, bands.len(), nb, bs, span]), device)
}

fn pad_len(x: Tensor<4>, pad: usize) -> Tensor<4> {
    if pad == 0 {
        return x;
    }
    let [b, h, _, d] = x.dims();
    Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, pad, d], &x.device())], 2)
}
