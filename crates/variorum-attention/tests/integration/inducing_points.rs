//! Inducing-point attention (Set Transformer ISAB, Luna pack/unpack): the forward equals the two
//! softmax attentions written out naively with the module's own weights; it is permutation
//! equivariant; the output depends on the keys only through the m packed slots; cross-attention
//! and padding work; impossible configs are refused.

use crate::common;

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;
use common::{D, seeded};
use variorum_attention::{
    Attention, AttentionConfig, AttentionInput, AttentionKind, InducingMode, InducingPointsAttention,
    InducingPointsConfig, Positioning,
};
use variorum_core::AttentionMask;

const B: usize = 2;

fn configs() -> Vec<InducingPointsConfig> {
    let base = InducingPointsConfig { slots: 5, ..Default::default() };
    vec![
        base.clone(),
        InducingPointsConfig { slot_mab: false, ..base.clone() },
        InducingPointsConfig { tie_kv: true, n_heads: 2, ..base.clone() },
        InducingPointsConfig { mode: InducingMode::Luna, ..base.clone() },
        InducingPointsConfig { mode: InducingMode::Luna, tie_kv: true, head_dim: Some(3), ..base.clone() },
        InducingPointsConfig { slots: 1, n_heads: 1, ..base },
    ]
}

fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
}

fn random_norm(norm: &mut LayerNorm, dev: &Device) {
    let d = norm.gamma.dims()[0];
    norm.gamma = Param::from_tensor(Tensor::random([d], Distribution::Uniform(0.5, 1.5), dev));
    norm.beta = Some(Param::from_tensor(Tensor::random([d], Distribution::Normal(0.0, 0.3), dev)));
}

/// A layer with random slots, weights and (non-trivial) LayerNorm gains.
fn build(cfg: &InducingPointsConfig, dev: &Device) -> InducingPointsAttention {
    cfg.validate(D).unwrap();
    let mut a = cfg.init(D, 0.3, 0.3, dev);
    a.slots = Param::from_tensor(Tensor::random([cfg.slots, D], Distribution::Normal(0.0, 1.0), dev));
    for norm in [&mut a.slot_norm, &mut a.slot_ff_norm].into_iter().flatten() {
        random_norm(norm, dev);
    }
    a
}

// ---- the naive reference: plain matrices, one head at a time, per batch row ----

/// x W + b for `x: [n, in]`.
fn linear(x: Tensor<2>, l: &Linear) -> Tensor<2> {
    let y = x.matmul(l.weight.val());
    match &l.bias {
        Some(b) => y + b.val().unsqueeze_dim(0),
        None => y,
    }
}

fn softmax_rows(s: Tensor<2>) -> Tensor<2> {
    let e = (s.clone() - s.max_dim(1)).exp();
    e.clone() / e.sum_dim(1)
}

fn layer_norm(x: Tensor<2>, n: &LayerNorm) -> Tensor<2> {
    let d = x.dims()[1] as f64;
    let mean = x.clone().sum_dim(1).div_scalar(d);
    let centred = x - mean;
    let var = centred.clone().powf_scalar(2.0).sum_dim(1).div_scalar(d);
    let y = centred / var.add_scalar(1e-5).sqrt();
    y * n.gamma.val().unsqueeze_dim(0) + n.beta.as_ref().unwrap().val().unsqueeze_dim(0)
}

/// Multi-head softmax attention of `q_src: [n, *]` over `kv_src: [s, *]` (hidden keys masked),
/// the heads concatenated (no output projection).
fn naive_attention(
    a: &InducingPointsAttention,
    q_src: Tensor<2>,
    kv_src: Tensor<2>,
    wq: &Linear,
    wkv: &Linear,
    hidden: Option<Vec<bool>>,
) -> Tensor<2> {
    let (h, dh) = (a.n_heads, a.head_dim);
    let w = h * dh;
    let q = linear(q_src, wq);
    let kv = linear(kv_src, wkv);
    let (k, v) = if a.tie_kv { (kv.clone(), kv) } else { (kv.clone().narrow(1, 0, w), kv.narrow(1, w, w)) };
    let heads: Vec<Tensor<2>> = (0..h)
        .map(|i| {
            let (qi, ki, vi) =
                (q.clone().narrow(1, i * dh, dh), k.clone().narrow(1, i * dh, dh), v.clone().narrow(1, i * dh, dh));
            let mut s = qi.matmul(ki.transpose()).div_scalar((dh as f64).sqrt());
            if let Some(hidden) = &hidden {
                let n = s.dims()[0];
                let keep: Vec<f32> = hidden.iter().map(|&x| if x { 0.0 } else { 1.0 }).collect();
                let keep =
                    Tensor::<1>::from_floats(keep.as_slice(), &s.device()).unsqueeze_dim::<2>(0).repeat_dim(0, n);
                // exp(−∞) = 0: drop hidden keys from the naive softmax
                s = s.clone() + keep.log();
            }
            softmax_rows(s).matmul(vi)
        })
        .collect();
    Tensor::cat(heads, 1)
}

/// The packed slots and the output of one batch row, naively.
fn naive(
    a: &InducingPointsAttention,
    query: Tensor<2>,
    source: Tensor<2>,
    hidden: Option<Vec<bool>>,
) -> (Tensor<2>, Tensor<2>) {
    let slots = a.slots.val();
    let mut packed = naive_attention(a, slots.clone(), source, &a.pack_q, &a.pack_kv, hidden);
    if let Some(out) = &a.pack_out {
        packed = linear(packed, out);
        if let (Some(n1), Some(ff), Some(n2)) = (&a.slot_norm, &a.slot_ff, &a.slot_ff_norm) {
            let h = layer_norm(slots + packed, n1);
            packed = layer_norm(h.clone() + linear(h, ff).clamp_min(0.0), n2);
        }
    }
    let y = naive_attention(a, query, packed.clone(), &a.unpack_q, &a.unpack_kv, None);
    (packed, linear(y, &a.out))
}

fn row(x: &Tensor<3>, i: usize) -> Tensor<2> {
    let [_, l, d] = x.dims();
    x.clone().narrow(0, i, 1).reshape([l, d])
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn run(a: &InducingPointsAttention, query: Tensor<3>, key_value: Option<Tensor<3>>, mask: &AttentionMask) -> Tensor<3> {
    let input = AttentionInput { query, key_value, mask, dense_mask: None, need_weights: false, carried: None };
    a.forward(input, None).context
}

#[test]
fn forward_equals_the_naive_pack_and_unpack() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(11);
    let mask = AttentionMask::bidirectional();
    for cfg in configs() {
        let a = build(&cfg, &dev);
        let x = random([B, 9, D], &dev);
        let got = run(&a, x.clone(), None, &mask);
        assert_eq!(got.dims(), [B, 9, D]);
        let packed = a.pack(x.clone(), None);
        let width = if cfg.mode == InducingMode::Isab { D } else { a.n_heads * a.head_dim };
        assert_eq!(packed.dims(), [B, cfg.slots, width], "{cfg:?}");
        for i in 0..B {
            let (want_packed, want) = naive(&a, row(&x, i), row(&x, i), None);
            let d = max_diff(row(&got, i).unsqueeze_dim(0), want.unsqueeze_dim(0));
            assert!(d < 1e-5, "{cfg:?}: output off by {d}");
            let d = max_diff(row(&packed, i).unsqueeze_dim(0), want_packed.unsqueeze_dim(0));
            assert!(d < 1e-5, "{cfg:?}: packed slots off by {d}");
        }
        // one slot: the unpack's softmax over one key is 1, every position reads the same packed
        // value (a learned pooling); more slots: the outputs differ by position
        let spread = (got.clone() - got.narrow(1, 0, 1)).abs().max().into_scalar::<f32>();
        if cfg.slots == 1 {
            assert!(spread < 1e-6, "{cfg:?}: one slot, yet positions differ by {spread}");
        } else {
            assert!(spread > 1e-3, "{cfg:?}: every position got the same output");
        }
    }
}

#[test]
fn permuting_the_inputs_permutes_the_outputs() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(12);
    let mask = AttentionMask::bidirectional();
    let perm: Vec<i64> = vec![6, 2, 9, 0, 4, 10, 1, 8, 3, 7, 5];
    let index = Tensor::<1, Int>::from_ints(perm.as_slice(), &dev);
    for cfg in configs() {
        let a = build(&cfg, &dev);
        let x = random([B, 11, D], &dev);
        let out = run(&a, x.clone(), None, &mask);
        let out_of_permuted = run(&a, x.select(1, index.clone()), None, &mask);
        let d = max_diff(out_of_permuted.clone(), out.clone().select(1, index.clone()));
        assert!(d < 1e-5, "{cfg:?}: not equivariant, {d}");
        // and not trivially so: the permuted output differs from the unpermuted one (with one
        // slot every position has the same output)
        if cfg.slots > 1 {
            assert!(max_diff(out_of_permuted, out) > 1e-3, "{cfg:?}");
        }
    }
}

#[test]
fn the_output_depends_on_the_keys_only_through_the_packed_slots() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(13);
    let mask = AttentionMask::bidirectional();
    for cfg in configs() {
        let a = build(&cfg, &dev);
        let q = random([B, 6, D], &dev);
        let kv = random([B, 7, D], &dev);
        let out = run(&a, q.clone(), Some(kv.clone()), &mask);
        // another source with the same packed slots: every key twice (length 14, not 7) — each
        // slot's softmax weights halve and its sums stay — gives the same output
        let doubled = Tensor::cat(vec![kv.clone(), kv.clone()], 1);
        let d = max_diff(a.pack(doubled.clone(), None), a.pack(kv.clone(), None));
        assert!(d < 1e-5, "{cfg:?}: packed slots differ, {d}");
        let d = max_diff(run(&a, q.clone(), Some(doubled), &mask), out.clone());
        assert!(d < 1e-5, "{cfg:?}: same packed slots, different output, {d}");
        // a source with other packed slots changes the output
        let other = random([B, 7, D], &dev);
        assert!(max_diff(run(&a, q, Some(other), &mask), out) > 1e-4);
    }
}

#[test]
fn cross_attention_over_a_source_of_another_length() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(14);
    let mask = AttentionMask::bidirectional();
    for cfg in configs() {
        let a = build(&cfg, &dev);
        let q = random([B, 4, D], &dev);
        let kv = random([B, 13, D], &dev);
        let got = run(&a, q.clone(), Some(kv.clone()), &mask);
        assert_eq!(got.dims(), [B, 4, D]);
        for i in 0..B {
            let (_, want) = naive(&a, row(&q, i), row(&kv, i), None);
            let d = max_diff(row(&got, i).unsqueeze_dim(0), want.unsqueeze_dim(0));
            assert!(d < 1e-5, "{cfg:?}: {d}");
        }
    }
}

#[test]
fn padded_keys_are_not_packed() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(15);
    for cfg in configs() {
        let a = build(&cfg, &dev);
        let q = random([B, 5, D], &dev);
        let kv = random([B, 8, D], &dev);
        // row 0: last 3 keys are padding; row 1: keys 1 and 4
        let hidden = [
            vec![false, false, false, false, false, true, true, true],
            vec![false, true, false, false, true, false, false, false],
        ];
        let flat: Vec<bool> = hidden.iter().flatten().copied().collect();
        let padding = Tensor::<2, Bool>::from_data(TensorData::new(flat, [B, 8]), &dev);
        let mask = AttentionMask::bidirectional().with_padding(padding);
        let got = run(&a, q.clone(), Some(kv.clone()), &mask);
        for (i, h) in hidden.iter().enumerate() {
            let (_, want) = naive(&a, row(&q, i), row(&kv, i), Some(h.clone()));
            let d = max_diff(row(&got, i).unsqueeze_dim(0), want.unsqueeze_dim(0));
            assert!(d < 1e-5, "{cfg:?} row {i}: {d}");
        }
        // row 0 without its padded keys gives the same output
        let trimmed = run(&a, q.clone().narrow(0, 0, 1), Some(kv.clone().narrow(0, 0, 1).narrow(1, 0, 5)), &{
            AttentionMask::bidirectional()
        });
        assert!(max_diff(trimmed, got.narrow(0, 0, 1)) < 1e-5);
    }
}

#[test]
fn registered_as_a_bidirectional_kind() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(16);
    let cfg: AttentionConfig =
        toml::from_str("kind = \"inducing-points\"\nslots = 3\nmode = \"luna\"\ntie_kv = true").unwrap();
    assert_eq!(cfg.kind(), "inducing-points");
    let AttentionConfig::InducingPoints(c) = &cfg else { panic!("parsed as {cfg:?}") };
    assert_eq!((c.slots, c.mode, c.tie_kv, c.n_heads), (3, InducingMode::Luna, true, 4));
    let caps = cfg.capabilities();
    assert!(!caps.causal && caps.bidirectional && !caps.incremental && !caps.score_bias && !caps.qk_rotation);
    assert_eq!(
        cfg.expanded(D),
        AttentionConfig::InducingPoints(InducingPointsConfig { head_dim: Some(4), ..c.clone() })
    );
    cfg.validate(D).unwrap();
    let attn = cfg.init(D, 0.3, 0.3, Positioning::NONE, &dev);
    let Attention::InducingPoints(inner) = &attn else { panic!("built {attn:?}") };
    let x = random([B, 6, D], &dev);
    let mask = AttentionMask::bidirectional();
    let got = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
    assert!(max_diff(got, run(inner, x, None, &mask)) < 1e-6);
    // linear in the length: the cost per token does not grow with the context (the slot side is
    // amortised over it)
    let f = |l| cfg.flops_per_token(D, l);
    assert!(f(4096) <= f(64) && f(64) > 0);
    assert!(toml::from_str::<AttentionConfig>("kind = \"inducing-points\"\nmode = \"nystrom\"").is_err());
    assert!(toml::from_str::<AttentionConfig>("kind = \"inducing-points\"\nlandmarks = 4").is_err());
}

#[test]
fn impossible_configs_are_refused() {
    let ok = InducingPointsConfig::default();
    ok.validate(D).unwrap();
    let refused = |cfg: InducingPointsConfig, field: &str| {
        let err = cfg.validate(D).expect_err(field).to_string();
        assert!(err.contains(&format!("model.attention.{field}")), "{field}: {err}");
    };
    refused(InducingPointsConfig { slots: 0, ..ok.clone() }, "slots");
    refused(InducingPointsConfig { dropout: 1.0, ..ok.clone() }, "dropout");
    refused(InducingPointsConfig { dropout: -0.1, ..ok.clone() }, "dropout");
    refused(InducingPointsConfig { n_heads: 0, ..ok.clone() }, "n_heads");
    refused(InducingPointsConfig { n_heads: 3, ..ok.clone() }, "n_heads");
    refused(InducingPointsConfig { head_dim: Some(0), ..ok.clone() }, "head_dim");
    // an explicit head size need not divide d_model
    InducingPointsConfig { n_heads: 3, head_dim: Some(5), ..ok }.validate(D).unwrap();
}
