//! A sparse [`Pattern`] handed to the block-sparse kernel
//! ([`variorum_kernels::block_sparse`]): each block of queries scores the runs of keys its
//! pattern can reach — its band(s), the global keys, its gathered keys, every key for a block
//! holding a global query — and a bit per (query, key) keeps the exact pattern. One kernel serves
//! every kind built on [`sparse`](crate::engine::blocks::sparse): sliding-window, local, multi-scale,
//! BigBird, Longformer, the fixed and blockwise patterns; [`union_context`] serves strided
//! attention.
//!
//! It applies where it computes exactly what the composed path does: no dropout on the
//! probabilities, query blocks at consecutive positions, and a position scheme that acts on q and
//! k (RoPE), through the distance alone (ALiBi, T5: one bias per head and distance, learned
//! through the kernel's bias gradient), through terms per distance that read the content
//! (Transformer-XL, Shaw, DeBERTa, DA, multiplicative: the kernel's `DistanceTerms`, every table
//! learned through its gradient; not with a head temperature), or none. A dilated band is scored
//! over the whole range its keys span (δ × its keys); TUPE's untied absolute term keeps the
//! composed path.

use std::ops::Range;
use std::sync::Arc;

use burn::prelude::*;
use variorum_kernels::block_sparse::{
    Pieces, Slots, SparseLayout, SparsePiece, block_sparse_attention, block_sparse_self_attention,
    block_sparse_self_attention_with_terms, block_sparse_union, block_sparse_union_self_attention,
    block_sparse_with_terms,
};
use variorum_kernels::normalisers::RowNormaliser;
use variorum_position::{Distances, TermsFor};

use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;

/// The context `[b, h, len, d_h]` of `pattern` over aligned queries and keys, by the kernel;
/// `None` where it does not apply (see the module) or off flex. `global`: the pattern's global
/// positions inside the sequence, sorted.
pub fn context(mha: &MultiHeadAttention, p: &Projected, pattern: &Pattern, global: &[usize]) -> Option<Tensor<4>> {
    // gathered query rows, or keys counted twice: the composed path
    let composed_only = pattern.extra.is_some_and(|set| set.queries.is_some() || set.repeats);
    let position_ok = position_ok(mha);
    if !applies(mha, p) || composed_only || !position_ok {
        return None;
    }
    let [_, h, l, _] = p.q_dims();
    let bs = pattern.block.max(1);
    if pattern.extra.is_some_and(|set| set.block != bs || set.blocks != l.div_ceil(bs)) {
        return None;
    }
    on_layout(mha, p, layout(pattern, global, h, l, p.layout.causal, p.max_back))
}

/// Whether the position scheme has a form the kernel takes: none, a rotation (done before), a
/// bias by distance alone, or terms per distance ([`with_terms`]).
fn position_ok(mha: &MultiHeadAttention) -> bool {
    mha.position.as_ref().is_none_or(|pos| pos.works_on_gathered_keys() || pos.has_distance_terms())
}

/// The kernel over one layout, with the position scheme's distance bias or terms.
fn on_layout(mha: &MultiHeadAttention, p: &Projected, layout: SparseLayout) -> Option<Tensor<4>> {
    let (layout, norm) = (Arc::new(layout), mha.normaliser.row);
    if has_terms(mha) {
        return with_terms(mha, p, SparsePiece::only(layout), norm);
    }
    let bias = distance_bias(mha, p);
    run(
        mha,
        p,
        bias,
        |qkv, heads, scale, bias| block_sparse_self_attention(qkv, heads, scale, bias, layout.clone(), norm),
        |q, bias| block_sparse_attention(q, p.k.clone(), p.v.clone(), bias, layout.clone(), norm),
    )
}

/// The context `[b, h, len, d_h]` of a pattern given as the kernel's layout directly, for a kind
/// whose pattern is simplest said that way: for each group of heads and block of `block` queries
/// the `runs` of keys it scores, and the keys each query of a group sees (`visible`, which may
/// reach past the query: the causal cut and `max_back` are applied here). `None` where the kernel
/// does not apply (the conditions of [`context`]) or off flex.
pub fn layout_context(
    mha: &MultiHeadAttention,
    p: &Projected,
    block: usize,
    groups: usize,
    runs: impl Fn(usize, usize) -> Vec<Range<usize>> + Sync,
    visible: impl Fn(usize, usize, &mut Vec<Range<usize>>) + Sync,
) -> Option<Tensor<4>> {
    let position_ok = position_ok(mha);
    if !applies(mha, p) || !position_ok {
        return None;
    }
    let l = p.q_dims()[2];
    let (causal, far) = (p.layout.causal, p.max_back.unwrap_or(usize::MAX));
    let clipped = |g: usize, q: usize, out: &mut Vec<Range<usize>>| {
        let from = out.len();
        visible(g, q, out);
        let (lo, hi) = (q.saturating_sub(far), if causal { q + 1 } else { l });
        for r in &mut out[from..] {
            *r = r.start.max(lo)..r.end.min(hi);
        }
    };
    on_layout(mha, p, SparseLayout::new(l, l, block.max(1), groups, runs, clipped))
}

/// The context `[b, h, len, d_h]` of the union of `pieces` ([`block_sparse_union`]: patterns
/// over different slots of the positions, one softmax) by the kernel; `None` where it does not
/// apply — the conditions of [`context`] and softmax — or off flex.
pub fn union_context(mha: &MultiHeadAttention, p: &Projected, pieces: impl FnOnce() -> Pieces) -> Option<Tensor<4>> {
    let position_ok = position_ok(mha);
    if !applies(mha, p) || mha.normaliser.row != RowNormaliser::Softmax || !position_ok {
        return None;
    }
    if has_terms(mha) {
        return with_terms(mha, p, pieces(), RowNormaliser::Softmax);
    }
    let (bias, pieces) = (distance_bias(mha, p), pieces());
    run(
        mha,
        p,
        bias,
        |qkv, heads, scale, bias| block_sparse_union_self_attention(qkv, heads, scale, bias, pieces.clone()),
        |q, bias| block_sparse_union(q, p.k.clone(), p.v.clone(), bias, pieces.clone()),
    )
}

/// The kernel on `p`, as per-head contexts `[b, h, L, d_h]`: read in place from the fused
/// projection where there is one and no temperature (`packed(qkv, heads, scale, bias)`: its
/// gradient handed back whole), on the scaled queries otherwise, a head's temperature folded into
/// them and the bias (`separate(q, bias)`).
fn run(
    mha: &MultiHeadAttention,
    p: &Projected,
    bias: Option<Tensor<2>>,
    packed: impl FnOnce(Tensor<3>, (usize, usize), f64, Option<Tensor<2>>) -> Option<Tensor<3>>,
    separate: impl FnOnce(Tensor<4>, Option<Tensor<2>>) -> Option<Tensor<3>>,
) -> Option<Tensor<4>> {
    let heads = (p.q_dims()[1], p.k.dims()[1]);
    let out = match (mha.normaliser.query_factor(), p.packed()) {
        (None, Some(qkv)) => packed(qkv.clone(), heads, mha.scale, bias)?,
        (factor, _) => {
            let (q, bias) = with_temperature(p.q(), bias, factor);
            separate(q, bias)?
        }
    };
    Some(by_head(out, heads.0))
}

/// Whether the position scheme acts through terms per distance (Transformer-XL, Shaw, DeBERTa,
/// DA, multiplicative).
fn has_terms(mha: &MultiHeadAttention) -> bool {
    mha.position.as_ref().is_some_and(|pos| pos.has_distance_terms())
}

/// The kernel with the position scheme's [`DistanceTerms`](variorum_kernels::block_sparse::DistanceTerms),
/// read in place from the fused projection where there is one. A head temperature, which would
/// scale every term, keeps the composed path.
fn with_terms(mha: &MultiHeadAttention, p: &Projected, pieces: Pieces, norm: RowNormaliser) -> Option<Tensor<4>> {
    let pos = mha.position.as_ref()?;
    if mha.normaliser.query_factor().is_some() {
        return None;
    }
    let [_, h, _, _] = p.q_dims();
    let len_k = p.k.dims()[2];
    // a piece in position order says how far its pairs reach; a union's slots stand elsewhere
    let reach = match &pieces[..] {
        [piece] if piece.slots == Slots::Positions && piece.order.is_none() => piece.layout.reach(),
        _ => len_k - 1,
    };
    let at = TermsFor { n_heads: h, len_k, reach, causal: p.layout.causal, scale: mha.scale };
    let terms = pos.distance_terms(at, &p.device())?;
    let out = match p.packed() {
        Some(qkv) => {
            let heads = (h, p.k.dims()[1]);
            block_sparse_self_attention_with_terms(qkv.clone(), heads, mha.scale, terms, pieces, norm)?
        }
        None => block_sparse_with_terms(p.q(), p.k.clone(), p.v.clone(), terms, pieces, norm)?,
    };
    Some(by_head(out, h))
}

/// What every kernel path needs: flex, no dropout on the probabilities, keys aligned with the
/// queries.
fn applies(mha: &MultiHeadAttention, p: &Projected) -> bool {
    let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
    crate::engine::heads::kernel_takes(&mha.dropout, &p.k) && aligned
}

/// The position scheme's additive score by distance, `[h, 2 L − 1]` (entry t is distance
/// t − (L − 1)), where it adds one.
fn distance_bias(mha: &MultiHeadAttention, p: &Projected) -> Option<Tensor<2>> {
    let pos = mha.position.as_ref()?;
    let [_, h, l, _] = p.q_dims();
    let width = 2 * l - 1;
    let values = (0..width).map(|t| t as i64 - (l as i64 - 1)).collect();
    let distances = Distances { dims: [1, 1, 1, width], values, causal: p.layout.causal };
    pos.bias_at(&distances, &p.device()).map(|bias| bias.reshape([h, width]))
}

/// A head's temperature scales its whole score, s/τ = (q/τ)·k + b/τ.
fn with_temperature(
    q: Tensor<4>,
    bias: Option<Tensor<2>>,
    factor: Option<Tensor<4>>,
) -> (Tensor<4>, Option<Tensor<2>>) {
    match factor {
        Some(f) => {
            let h = f.dims()[1];
            (q * f.clone(), bias.map(|b| b * f.reshape([h, 1])))
        }
        None => (q, bias),
    }
}

/// The kernel's merged heads `[b, L, h · d_h]` as per-head contexts `[b, h, L, d_h]`.
fn by_head(out: Tensor<3>, h: usize) -> Tensor<4> {
    let [b, l, width] = out.dims();
    out.reshape([b, l, h, width / h]).swap_dims(1, 2)
}

/// Query rows per block of the kernel when the pattern has no gathered keys (whose lists are per
/// block of the pattern): a band's block scores its rows' reach plus the block, so smaller blocks
/// waste less (a window of 256 scores 319 keys per row at 64, 383 at 128) while the GEMMs stay
/// efficient.
const BAND_BLOCK: usize = 64;

/// The kernel's layout of `pattern` for `h` heads over `l` positions.
fn layout(
    pattern: &Pattern,
    global: &[usize],
    h: usize,
    l: usize,
    causal: bool,
    max_back: Option<usize>,
) -> SparseLayout {
    let bs = if pattern.extra.is_some() { pattern.block.max(1) } else { BAND_BLOCK };
    let per_head = pattern.bands.iter().any(|part| part.bands.len() > 1 || !part.heads.is_empty())
        || pattern.extra.is_some_and(|set| set.groups > 1);
    let groups = if per_head { h } else { 1 };
    let far = max_back.unwrap_or(usize::MAX);
    let mut is_global = vec![false; l];
    for &g in global {
        is_global[g] = true;
    }
    let extra_cell =
        |g: usize, i: usize| pattern.extra.map(|set| (if set.groups == 1 { 0 } else { g }) * set.blocks + i);
    let extra_keys = |cell: usize| {
        let set = pattern.extra.expect("a cell of gathered keys");
        set.positions[cell * set.keys..(cell + 1) * set.keys].iter().enumerate().filter_map(|(s, k)| k.map(|k| (s, k)))
    };
    let runs = |g: usize, i: usize| -> Vec<Range<usize>> {
        let (q0, q_last) = (i * bs, ((i + 1) * bs).min(l) - 1);
        let mut runs = Vec::new();
        for part in pattern.bands {
            if let Some(band) = band_of(part, g) {
                let reach = (q0..=q_last).map(|q| key_reach(&band, part.dilation, q));
                let lo = reach.clone().map(|r| r.start).min().unwrap_or(0);
                let hi = reach.map(|r| r.end).max().unwrap_or(0);
                runs.push(lo..hi);
            }
        }
        runs.extend(global.iter().filter(|&&k| !causal || k <= q_last).map(|&k| k..k + 1));
        if is_global[q0..=q_last].iter().any(|&x| x) {
            runs.push(0..if causal { q_last + 1 } else { l });
        }
        // gathered keys come per block of the pattern, which is then the kernel's block too
        if let Some(cell) = extra_cell(g, i) {
            runs.extend(extra_keys(cell).map(|(_, k)| k..k + 1));
        }
        runs
    };
    let visible = |g: usize, q: usize, out: &mut Vec<Range<usize>>| {
        // no key after the query when causal, none more than `far` before it
        let lo = q.saturating_sub(far);
        let clip = |r: Range<usize>, causal: bool| r.start.max(lo)..r.end.min(if causal { q + 1 } else { l });
        if is_global[q] {
            out.push(clip(0..l, causal));
            return;
        }
        out.extend(global.iter().map(|&k| clip(k..k + 1, causal)));
        for part in pattern.bands {
            let Some(band) = band_of(part, g) else { continue };
            match part.dilation {
                0 | 1 => out.push(clip(key_reach(&band, 1, q), band.causal)),
                d => {
                    // the band over q's residue class: class positions qi − back … qi + ahead
                    let class = key_reach(&band, 1, q / d);
                    out.extend(class.map(|ki| ki * d + q % d).map(|k| clip(k..k + 1, band.causal)));
                }
            }
        }
        if let (Some(set), Some(cell)) = (pattern.extra, extra_cell(g, q / bs)) {
            let row = (cell * set.block + q % bs) * set.keys;
            out.extend(extra_keys(cell).filter(|&(s, _)| !set.hidden[row + s]).map(|(_, k)| clip(k..k + 1, false)));
        }
    };
    SparseLayout::new(l, l, bs, groups, runs, visible)
}

/// The band of `part` that head (or group) `g` uses, if it uses one.
fn band_of(part: &BandPart, g: usize) -> Option<Band> {
    if !part.heads.is_empty() && !part.heads[g] {
        return None;
    }
    Some(if part.bands.len() == 1 { part.bands[0] } else { part.bands[g] })
}

/// The keys `band` (over every `dilation`-th position) can reach from query `q`: from its
/// reach back (counted from the query's block when the band reaches from blocks) to its reach
/// ahead (none when causal), in positions.
fn key_reach(band: &Band, dilation: usize, q: usize) -> Range<usize> {
    let d = dilation.max(1);
    let qi = q / d;
    let within = if band.query_blocks { qi % band.block } else { 0 };
    let back = (within + band.back).min(qi);
    let ahead =
        if band.causal { 0 } else { (if band.query_blocks { band.block - 1 - within } else { 0 }) + band.ahead };
    q - back * d..q + ahead * d + 1
}
