//! ProbSparse attention against its definition: the measure max − mean over the layer's sampled
//! keys, the top-u (bidirectional) or prefix-ranked (causal) queries attend, the others get the
//! (cumulative) mean of the values; full attention when every key is sampled and every query
//! active; strictly causal; decoding equals the parallel forward.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::top_count;
use variorum_attention::{
    AttentionConfig, AttentionInput, AttentionKind, AttentionState, Positioning, ProbSparseAttention, ProbSparseConfig,
    ProbSparseState,
};
use variorum_core::AttentionMask;

const D: usize = 16;

fn config(factor: f64) -> ProbSparseConfig {
    ProbSparseConfig { n_heads: 2, factor, seed: 7, ..Default::default() }
}

fn build(factor: f64, dev: &Device) -> ProbSparseAttention {
    let cfg = config(factor);
    cfg.validate(D).unwrap();
    cfg.init(D, 0.5, 0.5, dev)
}

fn x(len: usize, dev: &Device) -> Tensor<3> {
    Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), dev)
}

fn host(t: Tensor<4>) -> (Vec<f32>, [usize; 4]) {
    let dims = t.dims();
    (t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap(), dims)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn a_large_factor_is_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(11);
    // c = 100: ⌈c·ln n⌉ ≥ n for every n ≤ 12, so every key is sampled and every query active
    let attn = build(100.0, &dev);
    let input = x(12, &dev);
    for causal in [false, true] {
        let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
        let got = attn.forward(AttentionInput::self_attention(input.clone(), &mask), None).context;
        let (q, k, v) = attn.proj.split(input.clone(), None);
        let mut scores = q.matmul(k.swap_dims(2, 3)).div_scalar((D as f64 / 2.0).sqrt());
        if causal {
            scores = scores.mask_fill(Tensor::<2, Bool>::tril_mask([12, 12], 0, &dev).reshape([1, 1, 12, 12]), -1e9);
        }
        let want = attn.proj.merge(softmax(scores, 3).matmul(v));
        let d = max_diff(got, want);
        assert!(d < 1e-5, "causal {causal}: {d}");
    }
}

/// The definition written naively on the host: per batch row and head, each query's measure
/// over the layer's sampled keys, the active set, and softmax or mean outputs.
#[test]
fn outputs_and_active_set_match_the_naive_definition() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(12);
    let factor = 1.0;
    let attn = build(factor, &dev);
    let l = 24;
    let input = x(l, &dev);
    let (q, k, v) = attn.proj.split(input, None);
    let ((qh, [b, h, _, dh]), (kh, _), (vh, _)) = (host(q.clone()), host(k.clone()), host(v.clone()));
    let at = |t: &[f32], r: usize, i: usize| t[(r * l + i) * dh..(r * l + i + 1) * dh].to_vec();
    let dot = |a: &[f32], c: &[f32]| a.iter().zip(c).map(|(x, y)| x * y).sum::<f32>() / (dh as f32).sqrt();
    let ceil_ln = |n: usize| ((factor * (n as f64).ln()).ceil() as usize).clamp(1, n);
    for causal in [false, true] {
        let (got, selection) = attn.attend(q.clone(), k.clone(), v.clone(), causal, 0, None);
        let (got, _) = host(got);
        let mut lazy_seen = 0;
        for r in 0..b * h {
            // the measure of every query over its sampled keys
            let measures: Vec<f32> = (0..l)
                .map(|i| {
                    let keys = if causal { attn.causal_keys(i) } else { attn.bidirectional_keys(i, l) };
                    assert_eq!(keys.len(), ceil_ln(if causal { i + 1 } else { l }));
                    let s: Vec<f32> = keys.iter().map(|&j| dot(&at(&qh, r, i), &at(&kh, r, j))).collect();
                    s.iter().cloned().fold(f32::MIN, f32::max) - s.iter().sum::<f32>() / s.len() as f32
                })
                .collect();
            for i in 0..l {
                assert!((measures[i] - selection.measures[r][i]).abs() < 1e-5, "measure {r} {i}");
            }
            let active: Vec<usize> = if causal {
                (0..l).filter(|&i| (0..i).filter(|&j| measures[j] >= measures[i]).count() < ceil_ln(i + 1)).collect()
            } else {
                let mut order: Vec<usize> = (0..l).collect();
                order.sort_by(|&a, &c| measures[c].partial_cmp(&measures[a]).unwrap().then(a.cmp(&c)));
                let mut top = order[..ceil_ln(l)].to_vec();
                top.sort();
                top
            };
            assert_eq!(active, selection.active[r], "row {r}, causal {causal}");
            for i in 0..l {
                let visible = if causal { i + 1 } else { l };
                let want: Vec<f32> = if active.contains(&i) {
                    let s: Vec<f32> = (0..visible).map(|j| dot(&at(&qh, r, i), &at(&kh, r, j))).collect();
                    let m = s.iter().cloned().fold(f32::MIN, f32::max);
                    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    (0..dh).map(|c| (0..visible).map(|j| e[j] / z * at(&vh, r, j)[c]).sum()).collect()
                } else {
                    // a lazy query: the (cumulative) mean of the values
                    lazy_seen += 1;
                    (0..dh).map(|c| (0..visible).map(|j| at(&vh, r, j)[c]).sum::<f32>() / visible as f32).collect()
                };
                let out = &got[(r * l + i) * dh..(r * l + i + 1) * dh];
                let d = want.iter().zip(out).map(|(a, c)| (a - c).abs()).fold(0.0, f32::max);
                assert!(d < 1e-5, "row {r} query {i} (causal {causal}, active {}): {d}", active.contains(&i));
            }
        }
        assert!(lazy_seen > b * h * l / 2, "most queries should be lazy at c = 1: {lazy_seen}");
    }
}

#[test]
fn causal_outputs_do_not_depend_on_later_tokens() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(13);
    let attn = build(1.0, &dev);
    let a = x(20, &dev);
    let mask = AttentionMask::causal();
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    let base = run(a.clone());
    for t in [3, 11, 19] {
        let noise = Tensor::random([2, 1, D], Distribution::Normal(0.0, 3.0), &dev);
        let b = a.clone().slice_assign([0..2, t..t + 1, 0..D], noise);
        let out = run(b);
        let before = max_diff(base.clone().narrow(1, 0, t), out.clone().narrow(1, 0, t));
        assert!(before < 1e-6, "position {t} changed earlier outputs by {before}");
        assert!(max_diff(base.clone().narrow(1, t, 20 - t), out.narrow(1, t, 20 - t)) > 1e-4);
    }
    // and a prefix alone gives the same outputs: samples and ranking do not depend on L
    let prefix = run(a.narrow(1, 0, 12));
    let d = max_diff(prefix, base.narrow(1, 0, 12));
    assert!(d < 1e-5, "{d}");
}

#[test]
fn decoding_equals_the_causal_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(14);
    for factor in [1.0, 2.5] {
        let attn = build(factor, &dev);
        let input = x(23, &dev);
        let full = attn.forward(AttentionInput::self_attention(input.clone(), &AttentionMask::causal()), None).context;
        let mut state = ProbSparseState::default();
        let mut parts = Vec::new();
        let steps = std::iter::once((0, 5)).chain([(5, 1), (6, 3)]).chain((9..23).map(|s| (s, 1)));
        for (s, n) in steps {
            let m = AttentionMask::causal().at(s, 0);
            let out = attn.forward(AttentionInput::self_attention(input.clone().narrow(1, s, n), &m), Some(&mut state));
            parts.push(out.context);
        }
        let d = max_diff(full, Tensor::cat(parts, 1));
        assert!(d < 1e-5, "factor {factor}: {d}");
        assert_eq!(state.measures.len(), 4);
        assert!(state.measures.iter().all(|row| row.len() == 23));
    }
}

#[test]
fn decoding_through_the_attention_enum() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(15);
    let cfg = AttentionConfig::ProbSparse(config(1.0));
    cfg.validate(D).unwrap();
    assert!(cfg.capabilities().causal && cfg.capabilities().incremental);
    let attn = cfg.init(D, 0.5, 0.5, Positioning::NONE, &dev);
    let input = x(14, &dev);
    let full = attn.forward(AttentionInput::self_attention(input.clone(), &AttentionMask::causal()), None).context;
    let mut state = AttentionState::default();
    let parts: Vec<Tensor<3>> = std::iter::once((0, 4))
        .chain((4..14).map(|s| (s, 1)))
        .map(|(s, n)| {
            let m = AttentionMask::causal().at(s, 0);
            attn.forward(AttentionInput::self_attention(input.clone().narrow(1, s, n), &m), Some(&mut state)).context
        })
        .collect();
    let d = max_diff(full, Tensor::cat(parts, 1));
    assert!(d < 1e-5, "{d}");
    assert!(state.get::<ProbSparseState>().is_some());
}

#[test]
fn sampled_keys_are_fixed_and_causal_ones_independent_of_the_length() {
    let dev = Device::flex();
    let attn = build(2.0, &dev);
    let again = build(2.0, &dev);
    let other_layer = config(2.0).for_layer(1).init(D, 0.5, 0.5, &dev);
    let mut differs = false;
    for t in 0..60 {
        let keys = attn.causal_keys(t);
        assert_eq!(keys.len(), top_count(2.0, t + 1));
        assert!(keys.iter().all(|&j| j <= t), "query {t} samples a later key: {keys:?}");
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "distinct keys");
        assert_eq!(keys, attn.causal_keys(t));
        assert_eq!(keys, again.causal_keys(t));
        differs |= keys != other_layer.causal_keys(t);
        // bidirectional: drawn among all keys
        let bi = attn.bidirectional_keys(t, 50);
        assert!(bi.len() == top_count(2.0, 50) && bi.iter().all(|&j| j < 50));
    }
    assert!(differs, "another layer draws other keys");
    // U ≥ n: every key exactly once
    let mut all = build(100.0, &dev).causal_keys(9);
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
}

#[test]
fn padding_keys_are_neither_attended_nor_averaged() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(16);
    // all keys sampled, c large: the active softmax and the lazy mean both skip the padding
    for factor in [100.0, 0.3] {
        let attn = build(factor, &dev);
        let (q, k, v) = attn.proj.split(x(10, &dev), None);
        let pad: Vec<bool> = (0..20).map(|i| i % 10 >= 7).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, 10]), &dev);
        let (got, sel) = attn.attend(q.clone(), k.clone(), v.clone(), false, 0, Some(&pad));
        let keep = |t: Tensor<4>| t.narrow(2, 0, 7);
        let (want, _) = attn.attend(q.clone(), keep(k.clone()), keep(v.clone()), false, 0, None);
        if factor > 1.0 {
            let d = (got.clone() - want).abs().max().into_scalar::<f32>();
            assert!(d < 1e-5, "{d}");
        }
        // lazy queries: the mean of the 7 real values
        let mean = keep(v.clone()).mean_dim(2);
        let (got_h, [_, h, l, dh]) = host(got);
        let (mean_h, _) = host(mean);
        for (r, active) in sel.active.iter().enumerate() {
            for i in (0..l).filter(|i| !active.contains(i)) {
                for c in 0..dh {
                    let d = (got_h[(r * l + i) * dh + c] - mean_h[r * dh + c]).abs();
                    assert!(d < 1e-5, "row {r} query {i}: {d}");
                }
            }
        }
        let _ = h;
    }
}

#[test]
fn refusals() {
    let ok = config(5.0);
    ok.validate(D).unwrap();
    for (bad, field) in [
        (ProbSparseConfig { factor: 0.0, ..ok.clone() }, "model.attention.factor"),
        (ProbSparseConfig { factor: -1.0, ..ok.clone() }, "model.attention.factor"),
        (ProbSparseConfig { factor: f64::NAN, ..ok.clone() }, "model.attention.factor"),
        (ProbSparseConfig { factor: f64::INFINITY, ..ok.clone() }, "model.attention.factor"),
        (ProbSparseConfig { dropout: 1.0, ..ok.clone() }, "model.attention.dropout"),
        (ProbSparseConfig { n_heads: 3, ..ok.clone() }, "n_heads"),
        (ProbSparseConfig { n_heads: 0, ..ok.clone() }, "n_heads"),
    ] {
        let e = bad.validate(D).unwrap_err().to_string();
        assert!(e.contains(field), "{bad:?}: {e}");
    }
    let parsed: AttentionConfig = toml::from_str("kind = \"prob-sparse\"\nfactor = 3.0\nseed = 2").unwrap();
    assert_eq!(parsed, AttentionConfig::ProbSparse(ProbSparseConfig { factor: 3.0, seed: 2, ..Default::default() }));
    assert!(toml::from_str::<AttentionConfig>("kind = \"prob-sparse\"\nfactr = 3.0").is_err());
}

/// On flex (no dropout, no padding) the active queries attend on the block-sparse kernel: equal
/// to the composed path with the kernels off — output, input gradient and the projection's
/// gradient — causal and bidirectional, with more active queries than one kernel block of 64.
#[test]
fn active_queries_on_the_kernel_equal_the_composed_path_with_gradients() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    dev.seed(15);
    let attn = build(5.0, &dev);
    let len = 200;
    let input = x(len, &dev);
    let w: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
    for causal in [true, false] {
        let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
        let (q, k, v) = attn.proj.split(input.clone(), None);
        let (_, selection) = attn.attend(q, k, v, causal, 0, None);
        let most = selection.active.iter().map(Vec::len).max().unwrap();
        assert!(most < len && (!causal || most > 64), "causal {causal}: {most} active queries");
        let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
        let weight = |g: &burn::tensor::Gradients| attn.proj.qkv.qkv.weight.grad(g).unwrap();
        common::assert_kernel_matches_composed(&format!("causal {causal}"), &input, &w, run, weight);
    }
    // causal queries after a prefix of keys (the last 120 of 200 positions), and queries standing
    // 3 positions before the first key (the first 3 see none: their lazy output, 0, both ways)
    for (lq, offset) in [(120, 80), (len, -3)] {
        let run = |x: Tensor<3>| {
            let (q, k, v) = attn.proj.split(x, None);
            let q = q.narrow(2, len - lq, lq);
            let out = attn.attend(q, k, v, true, offset, None).0;
            let out = attn.proj.merge(out);
            // zeros in front for the rows without a query, so that the weights `w` apply
            Tensor::cat(vec![Tensor::zeros([2, len - lq, D], &out.device()), out], 1)
        };
        let weight = |g: &burn::tensor::Gradients| attn.proj.qkv.qkv.weight.grad(g).unwrap();
        common::assert_kernel_matches_composed(&format!("offset {offset}"), &input, &w, run, weight);
    }
}
