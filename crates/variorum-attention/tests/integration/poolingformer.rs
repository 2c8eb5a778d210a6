//! Poolingformer: the two levels against a naive dense reference written here (window keys, pooled
//! segments, each level one masked softmax, level 2 reading level 1's output); with pool size 1 and
//! windows over everything it is full attention; no output depends on a later input; decoding
//! equals the causal forward; max and mean pooling differ; dynamic pooling weighs each segment by
//! the softmax of the kernel its last position predicts; bad configs are refused.

use crate::common;

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{
    Attention, AttentionConfig, AttentionInput, AttentionKind, AttentionState, MultiHeadAttention, PoolKind,
    PoolingState, PoolingformerAttention, PoolingformerConfig, Positioning,
};
use variorum_core::AttentionMask;

use common::D;

fn config(window: usize, pool: PoolKind, pool_size: usize, level2_window: Option<usize>) -> PoolingformerConfig {
    PoolingformerConfig { n_heads: 2, window, pool, pool_size, level2_window, ..Default::default() }
}

fn build(cfg: &PoolingformerConfig, dev: &Device) -> PoolingformerAttention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.2, 0.2, dev)
}

fn x(len: usize, dev: &Device) -> Tensor<3> {
    Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), dev)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

/// softmax(q kᵀ/√d + M) v per head with `hidden[i][j]` = masked; rows with every key hidden give 0.
fn masked_attention(
    mha: &MultiHeadAttention,
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    hidden: &[Vec<bool>],
) -> Tensor<3> {
    let (lq, lk) = (hidden.len(), hidden[0].len());
    let dev = q.device();
    let flat: Vec<bool> = hidden.iter().flatten().copied().collect();
    let m = Tensor::<2, Bool>::from_data(TensorData::new(flat, [lq, lk]), &dev).reshape([1, 1, lq, lk]);
    let scores = q.mul_scalar(mha.scale).matmul(k.swap_dims(2, 3)).mask_fill(m, -1e9);
    let any: Vec<f32> = hidden.iter().map(|row| if row.iter().all(|&h| h) { 0.0 } else { 1.0 }).collect();
    let any = Tensor::<1>::from_data(TensorData::new(any, [lq]), &dev).reshape([1, 1, lq, 1]);
    mha.merge(softmax(scores, 3).matmul(v) * any)
}

/// Level 2's segments, pooled naively one by one: segment j = positions js … js+s−1 (cut at L;
/// causal: complete ones only); dynamic pooling weighs the segment's r positions by the softmax
/// of the first r taps of W_δ y_e + b_δ, y_e the input at its last position e.
fn pool_naive(
    x: &Tensor<4>,
    s: usize,
    pool: PoolKind,
    y: (&Tensor<3>, Option<&Linear>),
    causal: bool,
) -> (Tensor<4>, Vec<(usize, usize)>) {
    let [b, h, l, _] = x.dims();
    let n = if causal { l / s } else { l.div_ceil(s) };
    let mut parts = Vec::new();
    let mut ranges = Vec::new();
    for j in 0..n {
        let (a, e) = (j * s, ((j + 1) * s).min(l));
        let seg = x.clone().narrow(2, a, e - a);
        parts.push(match pool {
            PoolKind::Max => seg.max_dim(2),
            PoolKind::Mean => seg.mean_dim(2),
            PoolKind::Dynamic => {
                let taps = y.1.unwrap().forward(y.0.clone().narrow(1, e - 1, 1)).reshape([b, h, 1, s]);
                softmax(taps.narrow(3, 0, e - a), 3).matmul(seg)
            }
        });
        ranges.push((a, e - 1));
    }
    (Tensor::cat(parts, 2), ranges)
}

/// The layer written out: Y = window attention over x, Z = attention of Y's level-2 queries over
/// the pooled segments in reach (finished ones when causal), output Y + Z.
fn reference(attn: &PoolingformerAttention, cfg: &PoolingformerConfig, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let l = x.dims()[1];
    let w = cfg.window as i64;
    let (q, k, v) = attn.level1.qkv.self_attention(x);
    let hidden1: Vec<Vec<bool>> = (0..l as i64)
        .map(|i| (0..l as i64).map(|j| if causal { j > i || i - j >= w } else { (i - j).abs() >= w }).collect())
        .collect();
    let y = masked_attention(&attn.level1, q, k, v, &hidden1);
    let (q2, k2, v2) = attn.level2.qkv.self_attention(y.clone());
    let s = cfg.pool_size;
    if l / s == 0 && causal {
        let zero = q2.zeros_like();
        return y + attn.level2.merge(zero);
    }
    let (kp, ranges) = pool_naive(&k2, s, cfg.pool, (&y, attn.dynamic.as_ref()), causal);
    let (vp, _) = pool_naive(&v2, s, cfg.pool, (&y, attn.dynamic.as_ref()), causal);
    let hidden2: Vec<Vec<bool>> = (0..l)
        .map(|i| {
            ranges
                .iter()
                .map(|&(first, last)| {
                    let in_reach = cfg
                        .level2_window
                        .is_none_or(|w2| first as i64 >= i as i64 - w2 as i64 + 1 && (causal || last + 1 <= i + w2));
                    !(in_reach && (!causal || last <= i))
                })
                .collect()
        })
        .collect();
    y + masked_attention(&attn.level2, q2, kp, vp, &hidden2)
}

fn run(attn: &PoolingformerAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    attn.forward(AttentionInput::self_attention(x, &mask), None).context
}

/// Plain softmax attention of `mha` over all keys (the future hidden when causal).
fn full_attention(mha: &MultiHeadAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let l = x.dims()[1];
    let (q, k, v) = mha.qkv.self_attention(x);
    let hidden: Vec<Vec<bool>> = (0..l).map(|i| (0..l).map(|j| causal && j > i).collect()).collect();
    masked_attention(mha, q, k, v, &hidden)
}

#[test]
fn pool_size_one_and_windows_over_everything_is_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(11);
    let cfg = config(16, PoolKind::Max, 1, None);
    let mut attn = build(&cfg, &dev);
    let input = x(9, &dev);
    for causal in [true, false] {
        // both levels: two stacked full attentions, summed
        let y = full_attention(&attn.level1, input.clone(), causal);
        let want = y.clone() + full_attention(&attn.level2, y, causal);
        let d = max_diff(run(&attn, input.clone(), causal), want);
        assert!(d < 1e-5, "causal {causal}: {d}");
    }
    // level 2 silenced: exactly full attention
    let out = &mut attn.level2.out;
    out.weight = Param::from_tensor(out.weight.val().zeros_like());
    out.bias = out.bias.take().map(|b| Param::from_tensor(b.val().zeros_like()));
    for causal in [true, false] {
        let d = max_diff(run(&attn, input.clone(), causal), full_attention(&attn.level1, input.clone(), causal));
        assert!(d < 1e-5, "causal {causal}: {d}");
    }
}

#[test]
fn both_levels_equal_the_dense_reference() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(12);
    let input = x(17, &dev);
    for pool in [PoolKind::Max, PoolKind::Mean, PoolKind::Dynamic] {
        for (window, s, w2) in [(3, 3, None), (4, 3, Some(7)), (2, 4, Some(4)), (5, 2, Some(9)), (40, 5, None)] {
            let cfg = config(window, pool, s, w2);
            let attn = build(&cfg, &dev);
            for causal in [true, false] {
                let got = run(&attn, input.clone(), causal);
                let scale = got.clone().abs().max().into_scalar::<f32>();
                let d = max_diff(got, reference(&attn, &cfg, input.clone(), causal));
                assert!(d < 1e-5, "{cfg:?} causal {causal}: {d}");
                assert!(scale > 0.1);
            }
        }
    }
}

#[test]
fn no_output_depends_on_a_later_input() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(13);
    let len = 14;
    for (w2, pool) in [(None, PoolKind::Max), (Some(6), PoolKind::Max), (Some(6), PoolKind::Dynamic)] {
        let attn = build(&config(3, pool, 3, w2), &dev);
        let a = x(len, &dev);
        for p in [2, 5, 9, 13] {
            let noise = Tensor::random([2, len - p, D], Distribution::Normal(0.0, 1.0), &dev);
            let b = a.clone().slice_assign([0..2, p..len, 0..D], noise);
            let diff = (run(&attn, a.clone(), true) - run(&attn, b, true)).abs().max_dim(2).max_dim(0).reshape([len]);
            let diff = diff.into_data().try_to_vec::<f32>().unwrap();
            assert!(diff[..p].iter().all(|&e| e == 0.0), "{pool:?}, w2 {w2:?}, changed from {p}: {diff:?}");
            assert!(diff[p] > 1e-4, "the changed position itself must change");
        }
    }
}

#[test]
fn decoding_equals_the_causal_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(14);
    let len = 19;
    for (window, s, w2, pool) in [
        (4, 3, None, PoolKind::Max),
        (3, 3, Some(6), PoolKind::Mean),
        (5, 2, Some(5), PoolKind::Max),
        (2, 4, None, PoolKind::Mean),
        (3, 3, Some(6), PoolKind::Dynamic),
        (2, 4, None, PoolKind::Dynamic),
    ] {
        let cfg = config(window, pool, s, w2);
        let attn = build(&cfg, &dev);
        let input = x(len, &dev);
        let full = run(&attn, input.clone(), true);
        // a prompt (shorter than a segment when s > 2), a chunk, one token, a chunk of 4, then one
        // at a time: several segments complete
        let mut chunks = if s > 2 { vec![(0, 2), (2, 3), (5, 1), (6, 4)] } else { vec![(0, 5), (5, 1), (6, 4)] };
        chunks.extend((10..len).map(|t| (t, 1)));
        let mut state = PoolingState::default();
        let parts: Vec<Tensor<3>> = chunks
            .iter()
            .map(|&(at, n)| {
                let m = AttentionMask::causal().at(at, 0);
                attn.forward(AttentionInput::self_attention(input.clone().narrow(1, at, n), &m), Some(&mut state))
                    .context
            })
            .collect();
        let d = max_diff(full, Tensor::cat(parts, 1));
        assert!(d < 1e-5, "{cfg:?}: {d}");
        // decoding keeps the window and the segments in reach only
        assert!(state.window.len() <= window, "{}", state.window.len());
        if let Some(w2) = w2 {
            assert!(state.pooled.len() <= w2.div_ceil(s), "{} pooled segments kept", state.pooled.len());
        } else {
            assert_eq!(state.pooled.len(), len / s);
        }
    }
}

#[test]
fn the_registered_kind_decodes_through_the_attention_state() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(15);
    let cfg: AttentionConfig = toml::from_str(
        "kind = \"poolingformer\"\nn_heads = 2\nwindow = 3\npool = \"mean\"\npool_size = 2\nlevel2_window = 6",
    )
    .unwrap();
    assert_eq!(cfg.kind(), "poolingformer");
    assert!(cfg.capabilities().causal && cfg.capabilities().incremental);
    cfg.validate(D).unwrap();
    let attn = cfg.init(D, 0.4, 0.4, Positioning::NONE, &dev);
    assert!(matches!(attn, Attention::Poolingformer(_)));
    let input = x(9, &dev);
    let full = attn.forward(AttentionInput::self_attention(input.clone(), &AttentionMask::causal()), None).context;
    let mut state = AttentionState::default();
    let parts: Vec<Tensor<3>> = std::iter::once((0, 3))
        .chain((3..9).map(|t| (t, 1)))
        .map(|(at, n)| {
            let m = AttentionMask::causal().at(at, 0);
            attn.forward(AttentionInput::self_attention(input.clone().narrow(1, at, n), &m), Some(&mut state)).context
        })
        .collect();
    // relative: the forward scales q' on its weights, decoding on its one row (rounding differs)
    let scale = full.clone().abs().max().into_scalar::<f32>();
    let d = max_diff(full, Tensor::cat(parts, 1)) / scale;
    assert!(d < 1e-5, "{d}");
    assert!(state.get::<PoolingState>().is_some());
}

#[test]
fn max_and_mean_pooling_differ() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(16);
    let max = build(&config(2, PoolKind::Max, 3, None), &dev);
    let mut mean = build(&config(2, PoolKind::Mean, 3, None), &dev);
    mean.level1 = max.level1.clone();
    mean.level2 = max.level2.clone();
    let input = x(12, &dev);
    for causal in [true, false] {
        let d = max_diff(run(&max, input.clone(), causal), run(&mean, input.clone(), causal));
        assert!(d > 1e-3, "causal {causal}: {d}");
    }
    // the first two positions see no finished segment (s = 3): identical there when causal
    let head = |a: &PoolingformerAttention| run(a, input.clone(), true).narrow(1, 0, 2);
    assert!(max_diff(head(&max), head(&mean)) < 1e-6);
}

/// With W_δ = 0 and b_δ = 0 every tap weighs 1/r: dynamic pooling is then the mean, a partial
/// segment's included (the softmax runs over its own taps only).
#[test]
fn dynamic_pooling_with_a_flat_kernel_is_the_mean_and_a_learned_one_is_not() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(18);
    let mean = build(&config(2, PoolKind::Mean, 3, None), &dev);
    let mut dynamic = build(&config(2, PoolKind::Dynamic, 3, None), &dev);
    dynamic.level1 = mean.level1.clone();
    dynamic.level2 = mean.level2.clone();
    {
        let kernel = dynamic.dynamic.as_mut().expect("a kernel");
        let zero = |p: &Param<Tensor<1>>| Param::from_tensor(p.val().zeros_like());
        kernel.weight = Param::from_tensor(kernel.weight.val().zeros_like());
        kernel.bias = kernel.bias.as_ref().map(zero);
    }
    let input = x(11, &dev);
    for causal in [true, false] {
        let d = max_diff(run(&mean, input.clone(), causal), run(&dynamic, input.clone(), causal));
        assert!(d < 1e-5, "flat kernel, causal {causal}: {d}");
    }
    // any other kernel is not the mean
    let bias = Tensor::random([6], Distribution::Normal(0.0, 2.0), &dev);
    dynamic.dynamic.as_mut().unwrap().bias = Some(Param::from_tensor(bias));
    let d = max_diff(run(&dynamic, input.clone(), false), run(&mean, input, false));
    assert!(d > 1e-3, "a learned kernel is not the mean: {d}");
}

#[test]
fn cross_attention_pools_the_source() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(17);
    let attn = build(&config(3, PoolKind::Max, 3, Some(6)), &dev);
    let mask = AttentionMask::bidirectional();
    let out = attn.forward(AttentionInput::cross_attention(x(4, &dev), x(10, &dev), &mask), None);
    assert_eq!(out.context.dims(), [2, 4, D]);
    assert!(!out.context.is_nan().any().into_scalar::<bool>());
}

#[test]
fn bad_configs_are_refused() {
    let bad = [
        (PoolingformerConfig { window: 0, ..Default::default() }, "window"),
        (PoolingformerConfig { pool_size: 0, ..Default::default() }, "pool_size"),
        (PoolingformerConfig { pool_size: 4, level2_window: Some(3), ..Default::default() }, "level2_window"),
        (PoolingformerConfig { n_heads: 3, ..Default::default() }, "n_heads"),
        (PoolingformerConfig { dropout: 1.0, ..Default::default() }, "dropout"),
    ];
    for (cfg, field) in bad {
        let err = cfg.validate(D).expect_err(field).to_string();
        assert!(err.contains(&format!("model.attention.{field}")), "{field}: {err}");
    }
    assert!(PoolingformerConfig::default().validate(D).is_ok());
    let unknown: Result<AttentionConfig, _> = toml::from_str("kind = \"poolingformer\"\nstride = 2");
    assert!(unknown.is_err(), "unknown fields are refused");
    let pool: Result<AttentionConfig, _> = toml::from_str("kind = \"poolingformer\"\npool = \"sum\"");
    assert!(pool.is_err(), "only max, mean and dynamic pooling");
    let dynamic: AttentionConfig = toml::from_str("kind = \"poolingformer\"\npool = \"dynamic\"").unwrap();
    assert!(matches!(dynamic, AttentionConfig::Poolingformer(PoolingformerConfig { pool: PoolKind::Dynamic, .. })));
}

/// On flex (no dropout) level 2 attends to the pooled segments on the block-sparse kernel: equal
/// to the composed path with the kernels off — output, input gradient and level 2's projection
/// gradient — causal and bidirectional, max and mean pooling, a level-2 window or none, a partial
/// last segment, more than one block of queries.
#[test]
fn level_two_on_the_kernel_equals_the_composed_path_with_gradients() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    dev.seed(14);
    let cases = [
        (3, PoolKind::Max, 3, Some(7), 17),
        (4, PoolKind::Mean, 4, None, 70),
        (5, PoolKind::Max, 2, Some(9), 130),
        (3, PoolKind::Dynamic, 3, Some(7), 70),
    ];
    for (window, pool, s, w2, len) in cases {
        let cfg = config(window, pool, s, w2);
        let attn = build(&cfg, &dev);
        let input = x(len, &dev);
        let w: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
        for causal in [true, false] {
            let what = format!("{cfg:?}, len {len}, causal {causal}");
            let weight = |g: &burn::tensor::Gradients| attn.level2.qkv.qkv.weight.grad(g).unwrap();
            common::assert_kernel_matches_composed(&what, &input, &w, |x| run(&attn, x, causal), weight);
            // both levels on the kernel: level 1's band and level 2's segments
            let before = variorum_kernels::block_sparse::calls();
            run(&attn, input.clone(), causal);
            assert_eq!(variorum_kernels::block_sparse::calls() - before, 2, "{what}: two kernel calls");
        }
    }
}
