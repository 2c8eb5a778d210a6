//! The shared core of kernelised ("linear") attention (Katharopoulos et al. 2020). With a feature
//! map φ standing in for exp(q·k):
//!
//! V'_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j),
//!
//! over all j (bidirectional) or j ≤ i (causal). Both sums are carried as one matrix
//! S = Σ_j w_j φ(k_j) [v_j; 1]ᵀ `[features, d_v + 1]`, whose last column is the normaliser z. With
//! a gate (RFA-Gate, Peng et al. 2021) the sums decay: S_t = g_t S_{t−1} + (1 − g_t) φ(k_t)[v_t; 1]ᵀ;
//! a running rescale (Performer's causal stabiliser) is the same scan with S_t = g_t S_{t−1} +
//! φ(k_t)[v_t; 1]ᵀ.
//!
//! Causal outputs depend on the keys at or before them only, in their rounding too: the carried
//! sums are exclusive prefix sums, and no scale is taken from later keys.
//!
//! The causal form runs in chunks of C positions: inside a chunk the C × C products
//! φ(q_i)·φ(k_j), j ≤ i, are formed directly; across chunks only S is carried (a prefix sum over
//! the chunks' contributions, or a scan when gated). Cost O(L·C·m + L·m·d_v) and memory linear in
//! L — no L × L matrix. Decoding a token is the same computation with L = 1 on the carried S: O(1)
//! in the context length ([`KernelState`]).

use burn::prelude::*;
pub use variorum_kernels::linear_attention::FeatureMap;
use variorum_kernels::linear_attention::{LinearSpec, causal_linear_attention, causal_linear_self_attention};
use variorum_position::HeadShape;

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::projections::HeadProjections;

/// Forward FLOPs per token of a kernelised attention: the four projections plus the chunked
/// kernel sums (`features` per head, chunks of `chunk`), 2 FLOPs per multiply–add.
pub fn kernel_flops(h: HeadShape, features: usize, chunk: usize) -> u64 {
    let (d, hd) = (h.d_model as u64, (h.n_heads * h.head_dim) as u64);
    let (m, n) = (features as u64, h.n_heads as u64);
    2 * (4 * d * hd) + 2 * n * (2 * m * (h.head_dim as u64 + 1) + chunk as u64 * (m + h.head_dim as u64 + 1))
}

/// Smallest normaliser φ(q)ᵀz allowed by default (sine/cosine features can make it tiny or
/// negative; elu + 1 keeps it well above).
pub const MIN_NORMALISER: f64 = 1e-6;

/// The carried sums of a causal kernelised attention: S·exp(shift) = Σ_j w_j φ(k_j)[v_j; 1]ᵀ,
/// `s: [batch, heads, features, d_v + 1]`, `shift: [batch, heads]` (a log-scale that keeps
/// exponential feature maps finite; 0 for the others).
#[derive(Debug, Clone)]
pub struct KernelState {
    /// S, `[batch, heads, features, d_v + 1]`: the sums over exp(shift); the last column is z.
    pub s: Tensor<4>,
    /// The sums' log-scale, `[batch, heads]` (0 unless the feature map is exponential).
    pub shift: Tensor<2>,
}

/// Queries, keys and values after the feature map, plus what the sums need.
pub struct Features {
    /// φ(q), `[b, h, len_q, m]`.
    pub q: Tensor<4>,
    /// φ(k) · exp(−k_shift), `[b, h, len_k, m]` (with a running rescale: φ(k_j) · exp(−M_j), each
    /// key at its own running scale).
    pub k: Tensor<4>,
    /// `[b, h, len_k, d_v]`.
    pub v: Tensor<4>,
    /// The per-head log-scale taken out of φ(k), `[b, h]` (zeros when none); with a running
    /// rescale, the scale the carried sums start at (M before the first key).
    pub k_shift: Option<Tensor<2>>,
    /// g_t ∈ (0, 1] per key, `[b, h, len_k]`: the sums decay by g_t before key t joins them.
    pub gate: Option<Tensor<3>>,
    /// How a gated key joins the sums: weighted by 1 − g_t (false: RFA-Gate), or by 1 (true: a
    /// running rescale, g_t = exp(M_{t−1} − M_t) for a log-scale M that only grows, which
    /// moves the carried shift to M; Performer's prefix stabiliser).
    pub rescale: bool,
    /// The normaliser is clamped below at this ([`MIN_NORMALISER`] unless a kind knows better).
    pub min_normaliser: f64,
}

/// φ(q)ᵀS / φ(q)ᵀz for a full sum S (bidirectional).
pub fn bidirectional(f: Features) -> Tensor<4> {
    let s = f.k.swap_dims(2, 3).matmul(with_ones(f.v));
    normalise(f.q.matmul(s), f.min_normaliser)
}

/// Causal kernelised attention of `len_q` queries over `len_k ≥ len_q` keys, the last `len_q` of
/// which sit at the queries' positions (the first ones are visible to every query: a memory
/// context). Continues from `state` and leaves the sums after the last key in it.
pub fn causal(f: Features, state: Option<&mut Option<KernelState>>, chunk: usize) -> Tensor<4> {
    let [b, h, lq, m] = f.q.dims();
    let [_, _, lk, dv] = f.v.dims();
    let device = f.q.device();
    let shift = f.k_shift.unwrap_or_else(|| Tensor::zeros([b, h], &device));
    // the sums so far, rescaled to this call's shift
    let mut s0: Tensor<4> = Tensor::zeros([b, h, m, dv + 1], &device);
    if let Some(Some(st)) = state.as_deref() {
        s0 = st.s.clone() * (st.shift.clone() - shift.clone()).exp().reshape([b, h, 1, 1]);
    }
    // g = 0 would make log g = −∞ (a sigmoid can underflow to it; a rescale by more than 69
    // nats leaves nothing of the earlier sums in f32 anyway)
    let floor = if f.rescale { 1e-30 } else { GATE_FLOOR };
    let gate = f.gate.map(|g| g.clamp_min(floor));
    // a running rescale leaves the sums at the scale the decays moved them to
    let end_shift = match (&gate, f.rescale) {
        (Some(g), true) => shift.clone() - g.clone().log().sum_dim(2).reshape([b, h]),
        _ => shift.clone(),
    };
    // the kernel from empty sums; a prefill's state (below) by one product where nothing decays
    // (with decays, the chunk scan keeps each sum within a chunk, and its rounding small)
    let fresh = state.as_deref().is_none_or(|s| s.is_none()) && (state.is_none() || gate.is_none());
    let on_kernel = [&f.q, &f.k, &f.v].into_iter().all(variorum_kernels::has_kernel)
        && gate.as_ref().is_none_or(variorum_kernels::has_kernel);
    if fresh && lk == lq && on_kernel {
        return fused(f.q, f.k, f.v, gate, f.rescale, f.min_normaliser, chunk, state.map(|s| (s, end_shift)));
    }
    let (mut k, mut v1, mut gate) = (f.k, with_ones(f.v), gate);
    // keys in front of the queries: every query sees them
    if lk > lq {
        let front = lk - lq;
        let (kf, vf) = (k.clone().narrow(2, 0, front), v1.clone().narrow(2, 0, front));
        let decay = gate.as_ref().map(|g| g.clone().narrow(2, 0, front));
        s0 = fold_into(s0, kf, vf, decay, f.rescale);
        k = k.narrow(2, front, lq);
        v1 = v1.narrow(2, front, lq);
        gate = gate.map(|g| g.narrow(2, front, lq));
    }
    let c = chunk.clamp(1, lq.max(1));
    let n = lq.div_ceil(c);
    let pad = n * c - lq;
    let (q, k, v1) = (pad_len(f.q, pad), pad_len(k, pad), pad_len(v1, pad));
    let bh = b * h;
    let q = q.reshape([bh, n, c, m]);
    let k = k.reshape([bh, n, c, m]);
    let v1 = v1.reshape([bh, n, c, dv + 1]);
    let s0 = s0.reshape([bh, m, dv + 1]);
    // true above the diagonal (keys after the query): what `tril_mask` hides
    let future = Tensor::<2, Bool>::tril_mask([c, c], 0, &device).reshape([1, 1, c, c]);
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)); // [bh, n, c, c]

    let (out, last) = match gate {
        None => {
            let intra = scores.mask_fill(future, 0.0).matmul(v1.clone());
            let u = k.swap_dims(2, 3).matmul(v1); // each chunk's Σ φ(k)[v; 1]ᵀ, [bh, n, m, dv+1]
            // the chunks strictly before each one (not "up to it, minus it", whose rounding would
            // depend on the chunk's later keys)
            let before = exclusive_cumsum(u.clone(), 1);
            let last = before.clone().narrow(1, n - 1, 1).reshape([bh, m, dv + 1])
                + u.narrow(1, n - 1, 1).reshape([bh, m, dv + 1])
                + s0.clone();
            let before = before + s0.unsqueeze_dim::<4>(1);
            (intra + q.matmul(before), last)
        }
        Some(g) => {
            // log decays; padded keys get g = 1 (no decay), and weight 1 − g = 0 or φ(k) = 0
            let g = pad_gate(g, pad).reshape([bh, n, c]);
            let a = g.clone().log();
            let cum = a.cumsum(2); // G_i = Σ_{r ≤ i} log g_r within the chunk
            let weight = key_weight(g, f.rescale);
            // key j's contribution at query i ≥ j: exp(G_i − G_j)(1 − g_j)
            let diff = cum.clone().unsqueeze_dim::<4>(3) - cum.clone().unsqueeze_dim::<4>(2);
            let decay = diff.mask_fill(future, f32::NEG_INFINITY).exp() * weight.clone().unsqueeze_dim::<4>(2);
            let intra = (scores * decay).matmul(v1.clone());
            // at the chunk's end: exp(G_C − G_j)(1 − g_j); the carried sum decays by exp(G_C)
            let total = cum.clone().narrow(2, c - 1, 1); // [bh, n, 1]
            let to_end = (total.clone() - cum.clone()).exp() * weight;
            let u = (k * to_end.unsqueeze_dim::<4>(3)).swap_dims(2, 3).matmul(v1); // [bh, n, m, dv+1]
            let chunk_decay = total.exp(); // [bh, n, 1]
            let mut carried = s0;
            let mut before = Vec::with_capacity(n);
            for i in 0..n {
                before.push(carried.clone());
                let d = chunk_decay.clone().narrow(1, i, 1).reshape([bh, 1, 1]);
                carried = carried * d + u.clone().narrow(1, i, 1).reshape([bh, m, dv + 1]);
            }
            let before = Tensor::stack::<4>(before, 1);
            let q_decayed = q * cum.exp().unsqueeze_dim::<4>(3);
            (intra + q_decayed.matmul(before), carried)
        }
    };
    if let Some(st) = state {
        *st = Some(KernelState { s: last.reshape([b, h, m, dv + 1]), shift: end_shift });
    }
    let out = out.reshape([b, h, n * c, dv + 1]).narrow(2, 0, lq);
    normalise(out, f.min_normaliser)
}

/// The smallest RFA-Gate-style decay g (a sigmoid can underflow to 0, whose log is −∞).
const GATE_FLOOR: f64 = 1e-6;

/// The layer's output by causal kernelised self-attention with φ applied inside the fused kernel
/// (`variorum_kernels::linear_attention`), read straight from the fused projection: φ(q) and φ(k)
/// are never stored, no head split is recorded, and the context comes back with its heads merged
/// into the output projection. Where that applies: causal self-attention without padding, outside
/// decoding (`decoding` false), on flex; `None` elsewhere, and the caller applies φ with Burn's
/// ops and takes [`causal`]. A `gate` g `[b, h, L]` decays the sums and weighs each key by 1 − g
/// (RFA-Gate).
#[allow(clippy::too_many_arguments)]
pub fn fused_self_attention(
    proj: &HeadProjections,
    input: &AttentionInput,
    features: FeatureMap,
    projection: Option<Tensor<3>>,
    gate: Option<Tensor<3>>,
    chunk: usize,
    min_normaliser: f64,
    decoding: bool,
) -> Option<AttentionOutput> {
    let m = input.mask;
    let applies = m.causal && !decoding && m.padding.is_none() && input.key_value.is_none();
    if !applies || !variorum_kernels::has_kernel(&input.query) {
        return None;
    }
    let (packed, _) = proj.qkv.self_attention_packed(input.query.clone());
    let spec = LinearSpec { gated_keys: gate.is_some(), ..LinearSpec::new(chunk, min_normaliser as f32, features) };
    let log_gate = gate.map(|g| g.clamp_min(GATE_FLOOR).log());
    let context = causal_linear_self_attention(packed, proj.qkv.n_heads, log_gate, projection, spec)?;
    Some(AttentionOutput { context: proj.out.forward(context), weights: None, aux_losses: Vec::new() })
}

/// [`causal`] by the fused kernel (`variorum_kernels::linear_attention`), from empty sums: the
/// decay handed over as log g, with each key's weight 1 − g unless the gates are a running
/// rescale. Leaves the sums after the last key in `state` (a prefill without decays) when one is
/// given.
#[allow(clippy::too_many_arguments)]
fn fused(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    gate: Option<Tensor<3>>,
    rescale: bool,
    min_normaliser: f64,
    chunk: usize,
    state: Option<(&mut Option<KernelState>, Tensor<2>)>,
) -> Tensor<4> {
    let spec = LinearSpec {
        gated_keys: gate.is_some() && !rescale,
        ..LinearSpec::new(chunk, min_normaliser as f32, FeatureMap::Given)
    };
    let log_gate = gate.clone().map(|g| g.log());
    let [b, h, l, dv] = v.dims();
    let out = causal_linear_attention(q, k.clone(), v.clone(), log_gate, None, spec)
        .expect("the caller checked for the kernel")
        .reshape([b, l, h, dv])
        .swap_dims(1, 2);
    if let Some((st, shift)) = state {
        let s = k.swap_dims(2, 3).matmul(with_ones(v));
        *st = Some(KernelState { s, shift });
    }
    out
}

/// s + Σ_j w_j φ(k_j)[v_j; 1]ᵀ over keys seen by everyone, with decays applied in order.
fn fold_into(s: Tensor<4>, k: Tensor<4>, v1: Tensor<4>, gate: Option<Tensor<3>>, rescale: bool) -> Tensor<4> {
    match gate {
        None => s + k.swap_dims(2, 3).matmul(v1),
        Some(g) => {
            let a = g.clone().log();
            let total = a.clone().sum_dim(2); // [b, h, 1]
            let to_end = (total.clone() - a.cumsum(2)).exp() * key_weight(g, rescale);
            s * total.exp().unsqueeze_dim::<4>(3) + (k * to_end.unsqueeze_dim::<4>(3)).swap_dims(2, 3).matmul(v1)
        }
    }
}

/// The weight a gated key joins the sums with: 1 − g (RFA-Gate) or 1 (a running rescale).
fn key_weight(g: Tensor<3>, rescale: bool) -> Tensor<3> {
    if rescale { g.ones_like() } else { g.neg().add_scalar(1.0) }
}

/// Σ_{j < i} x_j along `dim` (0 at i = 0): each entry depends on the earlier ones only, also in
/// its rounding.
pub fn exclusive_cumsum<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    let n = x.dims()[dim];
    if n <= 1 {
        return x.zeros_like();
    }
    let mut zero = x.dims();
    zero[dim] = 1;
    let zeros = Tensor::zeros(zero, &x.device());
    Tensor::cat(vec![zeros, x.narrow(dim, 0, n - 1)], dim).cumsum(dim)
}

fn with_ones(v: Tensor<4>) -> Tensor<4> {
    let [b, h, l, _] = v.dims();
    let ones = Tensor::ones([b, h, l, 1], &v.device());
    Tensor::cat(vec![v, ones], 3)
}

fn normalise(num_den: Tensor<4>, min: f64) -> Tensor<4> {
    let w = num_den.dims()[3];
    let num = num_den.clone().narrow(3, 0, w - 1);
    let den = num_den.narrow(3, w - 1, 1).clamp_min(min);
    num / den
}

fn pad_len(x: Tensor<4>, pad: usize) -> Tensor<4> {
    if pad == 0 {
        return x;
    }
    let [b, h, _, w] = x.dims();
    let zeros = Tensor::zeros([b, h, pad, w], &x.device());
    Tensor::cat(vec![x, zeros], 2)
}

fn pad_gate(g: Tensor<3>, pad: usize) -> Tensor<3> {
    if pad == 0 {
        return g;
    }
    let [b, h, _] = g.dims();
    let ones = Tensor::ones([b, h, pad], &g.device());
    Tensor::cat(vec![g, ones], 2)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burn::tensor::Distribution;

    pub fn positive(shape: [usize; 4], dev: &Device) -> Tensor<4> {
        Tensor::random(shape, Distribution::Uniform(0.1, 1.0), dev)
    }

    /// The defining sums computed naively, position by position.
    fn naive(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, gate: Option<&Tensor<3>>, causal: bool) -> Tensor<4> {
        let [b, h, l, _] = q.dims();
        let dv = v.dims()[3];
        let mut rows = Vec::new();
        for i in 0..l {
            let mut num: Tensor<4> = Tensor::zeros([b, h, 1, dv], &q.device());
            let mut den: Tensor<4> = Tensor::zeros([b, h, 1, 1], &q.device());
            let qi = q.clone().narrow(2, i, 1);
            let upto = if causal { i + 1 } else { l };
            for j in 0..upto {
                let mut w = (qi.clone() * k.clone().narrow(2, j, 1)).sum_dim(3); // [b, h, 1, 1]
                if let Some(g) = gate {
                    // (1 − g_j) Π_{j < r ≤ i} g_r
                    let gj = g.clone().narrow(2, j, 1).reshape([b, h, 1, 1]);
                    w = w * gj.neg().add_scalar(1.0);
                    for r in j + 1..=i {
                        w = w * g.clone().narrow(2, r, 1).reshape([b, h, 1, 1]);
                    }
                }
                num = num + w.clone() * v.clone().narrow(2, j, 1);
                den = den + w;
            }
            rows.push(num / den.clamp_min(MIN_NORMALISER));
        }
        Tensor::cat(rows, 2)
    }

    fn features(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, gate: Option<&Tensor<3>>) -> Features {
        Features {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            k_shift: None,
            gate: gate.cloned(),
            rescale: false,
            min_normaliser: MIN_NORMALISER,
        }
    }

    fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn chunked_causal_equals_the_naive_sums_with_and_without_gates() {
        let dev = Device::flex();
        let (q, k) = (positive([2, 3, 11, 5], &dev), positive([2, 3, 11, 5], &dev));
        let v: Tensor<4> = Tensor::random([2, 3, 11, 4], Distribution::Normal(0.0, 1.0), &dev);
        let g: Tensor<3> = Tensor::random([2, 3, 11], Distribution::Uniform(0.5, 0.99), &dev);
        for gate in [None, Some(&g)] {
            let want = naive(&q, &k, &v, gate, true);
            for chunk in [1, 3, 4, 11, 64] {
                // the fused kernel, and the composed chunks
                let got = causal(features(&q, &k, &v, gate), None, chunk);
                let composed = variorum_kernels::without_kernels(|| causal(features(&q, &k, &v, gate), None, chunk));
                for (path, got) in [("kernel", got), ("composed", composed)] {
                    let d = max_diff(got, want.clone());
                    assert!(d < 1e-4, "{path}, gate {}, chunk {chunk}: {d}", gate.is_some());
                }
            }
        }
        let want = naive(&q, &k, &v, None, false);
        assert!(max_diff(bidirectional(features(&q, &k, &v, None)), want) < 1e-4);
    }

    #[test]
    fn the_carried_state_continues_the_sums() {
        // one call = a prefix call, then token-by-token calls on the carried state
        let dev = Device::flex();
        let (q, k) = (positive([1, 2, 9, 4], &dev), positive([1, 2, 9, 4], &dev));
        let v: Tensor<4> = Tensor::random([1, 2, 9, 3], Distribution::Normal(0.0, 1.0), &dev);
        let g: Tensor<3> = Tensor::random([1, 2, 9], Distribution::Uniform(0.5, 0.99), &dev);
        for gate in [None, Some(&g)] {
            let full = causal(features(&q, &k, &v, gate), None, 4);
            let mut state = None;
            let mut parts = Vec::new();
            for (s, n) in [(0, 5), (5, 1), (6, 1), (7, 2)] {
                let f = Features {
                    q: q.clone().narrow(2, s, n),
                    k: k.clone().narrow(2, s, n),
                    v: v.clone().narrow(2, s, n),
                    k_shift: None,
                    gate: gate.map(|g| g.clone().narrow(2, s, n)),
                    rescale: false,
                    min_normaliser: MIN_NORMALISER,
                };
                parts.push(causal(f, Some(&mut state), 4));
            }
            let d = max_diff(full, Tensor::cat(parts, 2));
            assert!(d < 1e-4, "gate {}: {d}", gate.is_some());
        }
    }

    #[test]
    fn keys_in_front_are_seen_by_every_query() {
        // a context of 3 keys before 4 queries = the last 4 rows of the causal run over all 7
        let dev = Device::flex();
        let (q, k) = (positive([1, 2, 7, 4], &dev), positive([1, 2, 7, 4], &dev));
        let v: Tensor<4> = Tensor::random([1, 2, 7, 3], Distribution::Normal(0.0, 1.0), &dev);
        let g: Tensor<3> = Tensor::random([1, 2, 7], Distribution::Uniform(0.5, 0.99), &dev);
        for gate in [None, Some(&g)] {
            let all = causal(features(&q, &k, &v, gate), None, 2).narrow(2, 3, 4);
            let f = Features { q: q.clone().narrow(2, 3, 4), ..features(&q, &k, &v, gate) };
            let d = max_diff(causal(f, None, 2), all);
            assert!(d < 1e-4, "gate {}: {d}", gate.is_some());
        }
    }
}
