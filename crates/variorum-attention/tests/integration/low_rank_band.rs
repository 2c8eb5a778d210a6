//! Low-rank-band attention: the gated sum of a low-rank attention (small key size, every key) and
//! a band attention, against the equation written densely here; with the low-rank module disabled
//! or weighted to nothing it is sliding-window attention; no output depends on a later input;
//! decoding equals the causal forward; bad configs are refused.

use crate::common;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::{sigmoid, softmax};
use variorum_attention::{
    Attention, AttentionConfig, AttentionInput, AttentionKind, AttentionState, LowRankBandAttention, LowRankBandConfig,
    LowRankBandState, Positioning,
};
use variorum_core::AttentionMask;

use common::D;

const HEADS: usize = 2;

fn build(rank: usize, band: usize, dev: &Device) -> LowRankBandAttention {
    let cfg = LowRankBandConfig { n_heads: HEADS, rank, band, ..Default::default() };
    cfg.validate(D).unwrap();
    let mut attn = cfg.init(D, 0.3, 0.3, dev);
    // uneven mixes per head, so that a swapped or ignored gate shows
    attn.gate = Param::from_tensor(Tensor::from_data(TensorData::new(vec![0.8f32, -1.1], [HEADS]), dev));
    attn
}

fn x(len: usize, dev: &Device) -> Tensor<3> {
    Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), dev)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn mask_of(hidden: impl Fn(usize, usize) -> bool, l: usize, dev: &Device) -> Tensor<4, Bool> {
    let m: Vec<bool> = (0..l).flat_map(|i| (0..l).map(move |j| (i, j))).map(|(i, j)| hidden(i, j)).collect();
    Tensor::<2, Bool>::from_data(TensorData::new(m, [l, l]), dev).reshape([1, 1, l, l])
}

/// The band module alone: softmax over |i − j| < w (i − w < j ≤ i when causal), as sliding-window
/// attention of width w.
fn band_probs(attn: &LowRankBandAttention, x: Tensor<3>, w: usize, causal: bool) -> (Tensor<4>, Tensor<4>) {
    let l = x.dims()[1];
    let (q, k, v) = attn.band_attention.qkv.self_attention(x);
    let scores = q.matmul(k.swap_dims(2, 3)).div_scalar(((D / HEADS) as f64).sqrt());
    let outside = mask_of(|i, j| if causal { j > i || i - j >= w } else { i.abs_diff(j) >= w }, l, &v.device());
    (softmax(scores.mask_fill(outside, -1e9), 3), v)
}

/// The paper's equation, densely: A = σ(γ) softmax(Q̃K̃ᵀ/√r + M) + (1 − σ(γ)) A_band, out = A V W_O.
fn reference(attn: &LowRankBandAttention, x: Tensor<3>, rank: usize, w: usize, causal: bool) -> Tensor<3> {
    let [b, l, _] = x.dims();
    let dev = x.device();
    let (band, v) = band_probs(attn, x.clone(), w, causal);
    let lr = attn.low_rank.as_ref().unwrap().forward(x); // [b, l, 2·h·r]: Q̃ heads, then K̃ heads
    let head = |part: usize, h: usize| lr.clone().narrow(2, (part * HEADS + h) * rank, rank).reshape([b, 1, l, rank]);
    let q = Tensor::cat((0..HEADS).map(|h| head(0, h)).collect(), 1);
    let k = Tensor::cat((0..HEADS).map(|h| head(1, h)).collect(), 1);
    let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((rank as f64).sqrt());
    let low = softmax(scores.mask_fill(mask_of(|i, j| causal && j > i, l, &dev), -1e9), 3);
    let g = sigmoid(attn.gate.val()).reshape([1, HEADS, 1, 1]);
    let a = low * g.clone() + band * (g.neg() + 1.0);
    attn.band_attention.merge(a.matmul(v))
}

fn run(attn: &LowRankBandAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    attn.forward(AttentionInput::self_attention(x, &mask), None).context
}

#[test]
fn equals_the_dense_equation() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(21);
    let input = x(19, &dev);
    for (rank, band) in [(2, 3), (1, 5), (4, 1), (3, 30)] {
        let attn = build(rank, band, &dev);
        for causal in [true, false] {
            let d = max_diff(run(&attn, input.clone(), causal), reference(&attn, input.clone(), rank, band, causal));
            assert!(d < 1e-5, "rank {rank} band {band} causal {causal}: {d}");
        }
    }
}

#[test]
fn without_the_low_rank_module_it_is_sliding_window_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(22);
    let input = x(15, &dev);
    for band in [1, 4, 6] {
        let disabled = build(0, band, &dev);
        assert!(disabled.low_rank.is_none());
        let mut silenced = build(3, band, &dev);
        silenced.band_attention = disabled.band_attention.clone();
        silenced.gate = Param::from_tensor(Tensor::full([HEADS], -40.0, &dev));
        for causal in [true, false] {
            let (probs, v) = band_probs(&disabled, input.clone(), band, causal);
            let window = disabled.band_attention.merge(probs.matmul(v));
            let d = max_diff(run(&disabled, input.clone(), causal), window.clone());
            assert!(d < 1e-5, "rank 0, band {band}, causal {causal}: {d}");
            let d = max_diff(run(&silenced, input.clone(), causal), window);
            assert!(d < 1e-5, "gate σ(−40), band {band}, causal {causal}: {d}");
        }
    }
}

#[test]
fn no_output_depends_on_a_later_input() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(23);
    let len = 13;
    let attn = build(2, 3, &dev);
    let a = x(len, &dev);
    for p in [1, 6, 12] {
        let noise = Tensor::random([2, len - p, D], Distribution::Normal(0.0, 1.0), &dev);
        let b = a.clone().slice_assign([0..2, p..len, 0..D], noise);
        let diff = (run(&attn, a.clone(), true) - run(&attn, b, true)).abs().max_dim(2).max_dim(0).reshape([len]);
        let diff = diff.into_data().try_to_vec::<f32>().unwrap();
        assert!(diff[..p].iter().all(|&e| e == 0.0), "changed from {p}: {diff:?}");
        assert!(diff[p] > 1e-4, "the changed position itself must change");
    }
}

/// A Transformer-XL memory arrives as `key_value = [memory; x]` under a causal mask whose keys
/// start before the queries: no query may see a later position of `x` there either.
#[test]
fn no_output_depends_on_a_later_input_after_a_memory() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(25);
    let (mem, len) = (5, 9);
    let attn = build(2, 3, &dev);
    let memory = x(mem, &dev);
    let a = x(len, &dev);
    let mask = AttentionMask::causal().at(mem, 0);
    let run_mem = |input: Tensor<3>| {
        let kv = Tensor::cat(vec![memory.clone(), input.clone()], 1);
        attn.forward(AttentionInput::cross_attention(input, kv, &mask), None).context
    };
    for p in [1, 4, 8] {
        let noise = Tensor::random([2, len - p, D], Distribution::Normal(0.0, 1.0), &dev);
        let b = a.clone().slice_assign([0..2, p..len, 0..D], noise);
        let diff = (run_mem(a.clone()) - run_mem(b)).abs().max_dim(2).max_dim(0).reshape([len]);
        let diff = diff.into_data().try_to_vec::<f32>().unwrap();
        assert!(diff[..p].iter().all(|&e| e == 0.0), "changed from {p}: {diff:?}");
        assert!(diff[p] > 1e-4, "the changed position itself must change");
    }
}

#[test]
fn decoding_equals_the_causal_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(24);
    let len = 15;
    for (rank, band) in [(2, 3), (0, 4), (3, 1), (1, 20)] {
        let attn = build(rank, band, &dev);
        let input = x(len, &dev);
        let full = run(&attn, input.clone(), true);
        let mut chunks = vec![(0, 4), (4, 1), (5, 3)];
        chunks.extend((8..len).map(|t| (t, 1)));
        let mut state = LowRankBandState::default();
        let parts: Vec<Tensor<3>> = chunks
            .iter()
            .map(|&(at, n)| {
                let m = AttentionMask::causal().at(at, 0);
                attn.forward(AttentionInput::self_attention(input.clone().narrow(1, at, n), &m), Some(&mut state))
                    .context
            })
            .collect();
        let d = max_diff(full, Tensor::cat(parts, 1));
        assert!(d < 1e-5, "rank {rank} band {band}: {d}");
        // low-rank keys of every position, band keys of the last w only
        assert_eq!(state.low_rank.len(), if rank > 0 { len } else { 0 });
        assert_eq!(state.band.len(), band.min(len));
    }
}

#[test]
fn the_registered_kind_decodes_through_the_attention_state() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(25);
    let cfg: AttentionConfig = toml::from_str("kind = \"low-rank-band\"\nn_heads = 2\nrank = 2\nband = 3").unwrap();
    assert_eq!(cfg.kind(), "low-rank-band");
    assert!(cfg.capabilities().causal && cfg.capabilities().incremental);
    cfg.validate(D).unwrap();
    let attn = cfg.init(D, 0.3, 0.3, Positioning::NONE, &dev);
    assert!(matches!(attn, Attention::LowRankBand(_)));
    let input = x(8, &dev);
    let full = attn.forward(AttentionInput::self_attention(input.clone(), &AttentionMask::causal()), None).context;
    let mut state = AttentionState::default();
    let parts: Vec<Tensor<3>> = std::iter::once((0, 3))
        .chain((3..8).map(|t| (t, 1)))
        .map(|(at, n)| {
            let m = AttentionMask::causal().at(at, 0);
            attn.forward(AttentionInput::self_attention(input.clone().narrow(1, at, n), &m), Some(&mut state)).context
        })
        .collect();
    let d = max_diff(full, Tensor::cat(parts, 1));
    assert!(d < 1e-5, "{d}");
    assert!(state.get::<LowRankBandState>().is_some());
}

#[test]
fn cross_attention_takes_a_source_of_another_length() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(26);
    let attn = build(2, 3, &dev);
    let mask = AttentionMask::bidirectional();
    let out = attn.forward(AttentionInput::cross_attention(x(4, &dev), x(9, &dev), &mask), None);
    assert_eq!(out.context.dims(), [2, 4, D]);
    assert!(!out.context.is_nan().any().into_scalar::<bool>());
}

#[test]
fn bad_configs_are_refused() {
    let bad = [
        (LowRankBandConfig { band: 0, ..Default::default() }, "band"),
        (LowRankBandConfig { rank: 5, ..Default::default() }, "rank"), // head size 16 / 4 = 4
        (LowRankBandConfig { n_heads: 3, ..Default::default() }, "n_heads"),
        (LowRankBandConfig { dropout: -0.1, ..Default::default() }, "dropout"),
    ];
    for (cfg, field) in bad {
        let err = cfg.validate(D).expect_err(field).to_string();
        assert!(err.contains(&format!("model.attention.{field}")), "{field}: {err}");
    }
    assert!(LowRankBandConfig::default().validate(D).is_ok());
    assert!(LowRankBandConfig { rank: 0, ..Default::default() }.validate(D).is_ok());
    let unknown: Result<AttentionConfig, _> = toml::from_str("kind = \"low-rank-band\"\nwindow = 2");
    assert!(unknown.is_err(), "unknown fields are refused");
}
