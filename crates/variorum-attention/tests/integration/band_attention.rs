//! Sliding-window, local, multi-scale and strided attention: the block-by-block computation
//! equals dense attention under the pattern's mask, causal and bidirectional, with every relative
//! position scheme, for lengths that are not a multiple of the block; and the masks are the
//! patterns.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use common::{D, decoding_gap, masks_and_paths, schemes, with_kernels};
use variorum_attention::Band;
use variorum_attention::{
    AttentionConfig, AttentionInput, AttentionKind, BandAttention, LocalAttentionConfig, MultiScaleConfig, Positioning,
    SlidingWindowConfig,
};
use variorum_core::AttentionMask;
use variorum_position::PositionConfig;

/// (name, config) of sliding windows and local blocks of several shapes, with GQA.
fn patterns() -> Vec<(String, AttentionConfig)> {
    let mut out = Vec::new();
    for (window, block, look_ahead, kv_heads) in
        // the last reaches every key of the 11 positions the tests use: full attention's path
        [(3, 2, None, 4), (5, 3, Some(2), 2), (1, 4, Some(0), 4), (4, 4, None, 1), (16, 4, None, 2)]
    {
        let cfg = SlidingWindowConfig {
            window,
            block: Some(block),
            look_ahead,
            n_kv_heads: Some(kv_heads),
            ..Default::default()
        };
        out.push((format!("sliding-window w {window} block {block}"), AttentionConfig::SlidingWindow(cfg)));
    }
    // Longformer's global positions (one inside the first block, one further on)
    for (window, block, global) in [(3, 2, vec![0, 5]), (2, 4, vec![7])] {
        let cfg = SlidingWindowConfig {
            window,
            block: Some(block),
            global: global.clone(),
            n_kv_heads: Some(2),
            ..Default::default()
        };
        out.push((format!("sliding-window w {window} global {global:?}"), AttentionConfig::SlidingWindow(cfg)));
    }
    // dilated heads (Longformer): keys δ apart, with and without global positions
    for (window, block, dilations, global) in [(3, 2, vec![1, 2, 1, 3], vec![]), (2, 3, vec![2, 2, 3, 3], vec![4])] {
        let cfg = SlidingWindowConfig {
            window,
            block: Some(block),
            dilations: dilations.clone(),
            global,
            n_kv_heads: Some(2),
            ..Default::default()
        };
        out.push((format!("sliding-window w {window} dilations {dilations:?}"), AttentionConfig::SlidingWindow(cfg)));
    }
    // (8, 8): every key of 11 positions, as full attention
    for (block, memory, look_ahead, kv_heads) in
        [(4, 2, None, 4), (3, 5, Some(1), 2), (2, 0, Some(0), 1), (8, 8, None, 2)]
    {
        let cfg = LocalAttentionConfig { block, memory, look_ahead, n_kv_heads: Some(kv_heads), ..Default::default() };
        out.push((format!("local block {block} memory {memory}"), AttentionConfig::Local(cfg)));
    }
    for (windows, block) in [(vec![1, 2, 4, 7], 3), (vec![5, 3, 5, 2], 4)] {
        let cfg = MultiScaleConfig {
            windows: windows.clone(),
            block: Some(block),
            n_kv_heads: Some(2),
            ..Default::default()
        };
        out.push((format!("multi-scale {windows:?} block {block}"), AttentionConfig::MultiScale(cfg)));
    }
    out
}

fn band(cfg: &AttentionConfig, position: &PositionConfig, dev: &Device) -> BandAttention {
    cfg.validate(D).unwrap();
    match cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 32 }, dev) {
        variorum_attention::Attention::SlidingWindow(a)
        | variorum_attention::Attention::Local(a)
        | variorum_attention::Attention::MultiScale(a) => a,
        _ => unreachable!("band kinds only"),
    }
}

#[test]
fn blocks_equal_dense_attention_under_the_band_mask() {
    let dev = Device::flex();
    for position in schemes() {
        for (name, cfg) in patterns() {
            let attn = band(&cfg, &position, &dev);
            let x: Tensor<3> = Tensor::random([2, 11, D], Distribution::Normal(0.0, 1.0), &dev);
            for (mask, kernels) in masks_and_paths() {
                let run =
                    |dense| attn.forward_with(AttentionInput::self_attention(x.clone(), &mask), None, dense).context;
                let d = (with_kernels(kernels, || run(false)) - run(true)).abs().max().into_scalar::<f32>();
                let causal = mask.causal;
                assert!(
                    d < 1e-5,
                    "{} {name} causal {causal} kernels {kernels}: blocks differ from dense by {d}",
                    position.kind()
                );
            }
        }
    }
}

/// Which of 12 causal queries change when position `p` changes.
fn reached_by(attn: &BandAttention, p: usize, dev: &Device) -> Vec<usize> {
    let x: Tensor<3> = Tensor::random([1, 12, D], Distribution::Normal(0.0, 1.0), dev);
    let y =
        x.clone().slice_assign([0..1, p..p + 1, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), dev));
    let mask = AttentionMask::causal();
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    let diff = (run(x) - run(y)).abs().max_dim(2).reshape([12]).into_data().try_to_vec::<f32>().unwrap();
    diff.iter().enumerate().filter(|(_, d)| **d > 1e-6).map(|(i, _)| i).collect()
}

#[test]
fn local_blocks_share_their_reach() {
    // blocks of 4 with a memory of 2: block 1 (4..7) sees 2..=its query, block 2 (8..11) 6..
    let dev = Device::flex();
    let cfg = AttentionConfig::Local(LocalAttentionConfig { block: 4, memory: 2, ..Default::default() });
    let attn = band(&cfg, &PositionConfig::None(Default::default()), &dev);
    assert_eq!(reached_by(&attn, 1, &dev), vec![1, 2, 3]);
    assert_eq!(reached_by(&attn, 3, &dev), vec![3, 4, 5, 6, 7]);
    assert_eq!(reached_by(&attn, 6, &dev), vec![6, 7, 8, 9, 10, 11]);
}

#[test]
fn the_band_mask_is_the_band() {
    let band = Band { back: 2, ahead: 1, block: 4, query_blocks: false, causal: false };
    let hidden: Vec<bool> = (3..5).flat_map(|q| (1..7).map(move |k| !band.sees(q, k))).collect();
    // queries at 3, 4; keys at 1..7: query 3 sees 1..4, query 4 sees 2..5
    #[rustfmt::skip]
    let want = vec![false, false, false, false, true, true,
                    true, false, false, false, false, true];
    assert_eq!(hidden, want);
}

#[test]
fn far_keys_do_not_reach_a_query_and_near_ones_do() {
    // a window of 4: position 2 is seen by queries 2..=5 only
    let dev = Device::flex();
    let cfg = AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 4, block: Some(3), ..Default::default() });
    let attn = band(&cfg, &PositionConfig::None(Default::default()), &dev);
    assert_eq!(reached_by(&attn, 2, &dev), vec![2, 3, 4, 5]);
}

#[test]
fn each_head_keeps_its_own_window() {
    // head 0 sees 1 key (itself), head 3 sees 6: with the value of position 2 changed, head
    // 0's context changes at query 2 only, head 3's at queries 2..=7
    let dev = Device::flex();
    let cfg = AttentionConfig::MultiScale(MultiScaleConfig {
        windows: vec![1, 2, 3, 6],
        block: Some(4),
        ..Default::default()
    });
    let attn = band(&cfg, &PositionConfig::None(Default::default()), &dev);
    let x: Tensor<3> = Tensor::random([1, 12, D], Distribution::Normal(0.0, 1.0), &dev);
    let y = x.clone().slice_assign([0..1, 2..3, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), &dev));
    let mask = AttentionMask::causal();
    let heads = |x: Tensor<3>| {
        let p = attn.attention.project(x, None, &mask, None);
        variorum_attention::banded(&attn.attention, &p, &attn.bands(true), &[])
    };
    let diff = (heads(x) - heads(y)).abs().max_dim(3).reshape([4, 12]).into_data().try_to_vec::<f32>().unwrap();
    for (h, w) in [1usize, 2, 3, 6].iter().enumerate() {
        let changed: Vec<usize> = (0..12).filter(|&i| diff[h * 12 + i] > 1e-6).collect();
        assert_eq!(changed, (2..2 + w).collect::<Vec<_>>(), "head {h}");
    }
}

#[test]
fn global_positions_see_everything_and_are_seen_by_everyone() {
    // window 2 with position 1 global: a change at 1 reaches every later query; a change at 6
    // reaches 6 and 7 only, and global query 1 is not reached by it (causal)
    let dev = Device::flex();
    let cfg = AttentionConfig::SlidingWindow(SlidingWindowConfig {
        window: 2,
        block: Some(4),
        global: vec![1],
        ..Default::default()
    });
    let attn = band(&cfg, &PositionConfig::None(Default::default()), &dev);
    assert_eq!(reached_by(&attn, 1, &dev), (1..12).collect::<Vec<_>>());
    assert_eq!(reached_by(&attn, 6, &dev), vec![6, 7]);
    // bidirectionally the global query 1 sees position 9 too
    let x: Tensor<3> = Tensor::random([1, 12, D], Distribution::Normal(0.0, 1.0), &dev);
    let y =
        x.clone().slice_assign([0..1, 9..10, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), &dev));
    let open = AttentionMask::bidirectional();
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &open), None).context;
    let diff = (run(x) - run(y)).abs().max_dim(2).reshape([12]).into_data().try_to_vec::<f32>().unwrap();
    let changed: Vec<usize> = (0..12).filter(|&i| diff[i] > 1e-6).collect();
    assert_eq!(changed, vec![1, 8, 9, 10]);
}

#[test]
fn strided_patterns_equal_dense_attention_under_their_mask() {
    use variorum_attention::{StridedCombine, StridedConfig};
    let dev = Device::flex();
    for position in schemes() {
        for (stride, combine, layer, len) in [
            (3, StridedCombine::Union, 0, 11),
            (4, StridedCombine::Heads, 0, 11),
            (3, StridedCombine::Alternate, 0, 10),
            (3, StridedCombine::Alternate, 1, 10),
            (5, StridedCombine::Union, 0, 3),
        ] {
            let cfg = StridedConfig { stride, combine, n_kv_heads: Some(2), ..Default::default() }.for_layer(layer);
            cfg.validate(D).unwrap();
            let attn = cfg.init(D, 0.3, 0.3, Positioning { config: &position, context: 32 }, &dev);
            let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
            for (mask, kernels) in masks_and_paths() {
                let run =
                    |dense| attn.forward_with(AttentionInput::self_attention(x.clone(), &mask), None, dense).context;
                let d = (with_kernels(kernels, || run(false)) - run(true)).abs().max().into_scalar::<f32>();
                let causal = mask.causal;
                assert!(
                    d < 1e-5,
                    "{} stride {stride} {combine:?} layer {layer} causal {causal} kernels {kernels}: {d}",
                    position.kind()
                );
            }
        }
    }
}

#[test]
fn strided_union_reaches_its_window_and_every_stride_back() {
    use variorum_attention::{StridedAttention, StridedConfig};
    let dev = Device::flex();
    let attn: StridedAttention =
        StridedConfig { stride: 3, ..Default::default() }.init(D, 0.3, 0.3, Positioning::NONE, &dev);
    let x: Tensor<3> = Tensor::random([1, 12, D], Distribution::Normal(0.0, 1.0), &dev);
    let y = x.clone().slice_assign([0..1, 1..2, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), &dev));
    let mask = AttentionMask::causal();
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    let diff = (run(x) - run(y)).abs().max_dim(2).reshape([12]).into_data().try_to_vec::<f32>().unwrap();
    let changed: Vec<usize> = (0..12).filter(|&i| diff[i] > 1e-6).collect();
    // position 1: the next two positions (window 3) and every 3rd one after it
    assert_eq!(changed, vec![1, 2, 3, 4, 7, 10]);
}

#[test]
fn strided_decoding_gathers_what_the_parallel_forward_sees() {
    use variorum_attention::{StridedCombine, StridedConfig};
    let dev = Device::flex();
    for position in schemes() {
        for (combine, layer) in [(StridedCombine::Union, 0), (StridedCombine::Heads, 0), (StridedCombine::Alternate, 1)]
        {
            let cfg = StridedConfig { stride: 3, combine, n_kv_heads: Some(2), ..Default::default() }.for_layer(layer);
            let attn = cfg.init(D, 0.3, 0.3, Positioning { config: &position, context: 32 }, &dev);
            let x: Tensor<3> = Tensor::random([2, 13, D], Distribution::Normal(0.0, 1.0), &dev);
            let d = decoding_gap(|i, c| attn.forward(i, c), &x, 4);
            assert!(d < 1e-4, "{} {combine:?}: {d}", position.kind());
        }
    }
}

/// The kinds on the block-sparse kernel against their composed path over several query blocks,
/// output and the input's gradient (the packed projection's backward, the distance-bias table's
/// gradient for T5, temperatures folded into q), causal and bidirectional.
#[test]
fn the_kernel_path_and_the_composed_path_agree_with_their_gradients() {
    use variorum_attention::{BigBirdConfig, FixedConfig, StridedCombine, StridedConfig};
    let dev = Device::flex().autodiff();
    dev.seed(5);
    let kinds = [
        (
            "sliding-window",
            AttentionConfig::SlidingWindow(SlidingWindowConfig {
                window: 20,
                n_kv_heads: Some(2),
                ..Default::default()
            }),
        ),
        ("local", AttentionConfig::Local(LocalAttentionConfig { block: 16, memory: 24, ..Default::default() })),
        ("strided union", AttentionConfig::Strided(StridedConfig { stride: 12, ..Default::default() })),
        (
            "strided heads",
            AttentionConfig::Strided(StridedConfig { stride: 9, combine: StridedCombine::Heads, ..Default::default() }),
        ),
        (
            "bigbird",
            AttentionConfig::Bigbird(BigBirdConfig {
                block: 16,
                random_blocks: 2,
                global_tokens: 16,
                ..Default::default()
            }),
        ),
        // the fixed pattern's layout given directly: own block and summaries, split heads, and
        // the odd layer of `alternate` (summaries and the query itself); a partial last block
        ("fixed union", AttentionConfig::Fixed(FixedConfig { stride: 16, summary: 4, ..Default::default() })),
        (
            "fixed heads",
            AttentionConfig::Fixed(FixedConfig {
                stride: 12,
                summary: 3,
                combine: StridedCombine::Heads,
                ..Default::default()
            }),
        ),
        (
            "fixed alternate, odd layer",
            AttentionConfig::Fixed(FixedConfig {
                stride: 20,
                summary: 2,
                combine: StridedCombine::Alternate,
                ..Default::default()
            })
            .for_layer(1),
        ),
    ];
    let x0: Tensor<3> = Tensor::random([2, 150, D], Distribution::Normal(0.0, 1.0), &dev);
    let w: Tensor<3> = Tensor::random([2, 150, D], Distribution::Normal(0.0, 1.0), &dev);
    for position in common::distance_schemes() {
        for (name, cfg) in &kinds {
            cfg.validate(D).unwrap();
            let attn = cfg.init(D, 0.3, 0.3, Positioning { config: &position, context: 160 }, &dev);
            for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                let run = |kernels: bool| {
                    with_kernels(kernels, || {
                        let x = x0.clone().require_grad();
                        let y = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                        let grads = (y.clone() * w.clone()).sum().backward();
                        (y, x.grad(&grads).unwrap())
                    })
                };
                let before = variorum_kernels::block_sparse::calls();
                let ((y1, g1), (y2, g2)) = (run(true), run(false));
                let what = format!("{} {name} causal {}", position.kind(), mask.causal);
                assert!(variorum_kernels::block_sparse::calls() > before, "{what}: the kernel did not run");
                let d = (y1 - y2).abs().max().into_scalar::<f32>();
                assert!(d < 1e-5, "{what}: outputs differ by {d}");
                let d = (g1 - g2).abs().max().into_scalar::<f32>();
                assert!(d < 1e-4, "{what}: input gradients differ by {d}");
            }
        }
    }
}

/// Attention dropout drops nothing off an autodiff device (evaluation, generation), so there a
/// kind with dropout takes its kernel and computes what the composed path does; while training
/// (autodiff) it keeps the composed path, which applies the dropout.
#[test]
fn dropout_keeps_the_kernel_where_it_drops_nothing() {
    let _guard = common::seeded();
    let cfg = AttentionConfig::SlidingWindow(SlidingWindowConfig {
        window: 3,
        block: Some(2),
        dropout: 0.2,
        ..Default::default()
    });
    cfg.validate(D).unwrap();
    let none = PositionConfig::None(Default::default());
    for training in [false, true] {
        let dev = if training { Device::flex().autodiff() } else { Device::flex() };
        let attn = cfg.init(D, 0.3, 0.3, Positioning { config: &none, context: 32 }, &dev);
        let x: Tensor<3> = Tensor::random([2, 13, D], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let before = variorum_kernels::block_sparse::calls();
        let y = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let on_kernel = variorum_kernels::block_sparse::calls() > before;
        assert_eq!(on_kernel, !training, "training {training}: the kernel ran {on_kernel}");
        if !training {
            let composed = with_kernels(false, || attn.forward(AttentionInput::self_attention(x, &mask), None).context);
            let d = (y - composed).abs().max().into_scalar::<f32>();
            assert!(d < 1e-5, "evaluation with dropout: kernel and composed paths differ by {d}");
        }
    }
}
