//! "Attend at most N back" on every score-forming kind: no query is reached by a key more than N
//! positions before it; the blocked computations equal the dense ones under the same mask; and
//! a limit beyond the sequence changes nothing.

use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_attention::{
    Attention, AttentionConfig, AttentionInput, AttentionOutput, BigBirdConfig, BlockwiseConfig, FixedConfig,
    Local2dConfig, LocalAttentionConfig, LongformerConfig, MultiHeadAttentionConfig, MultiScaleConfig, Positioning,
    SlidingWindowConfig, StridedCombine, StridedConfig,
};
use variorum_core::AttentionMask;
use variorum_position::PositionConfig;

const D: usize = 16;
const L: usize = 14;

fn kinds() -> Vec<AttentionConfig> {
    vec![
        AttentionConfig::Full(MultiHeadAttentionConfig { n_kv_heads: Some(2), ..Default::default() }),
        AttentionConfig::SlidingWindow(SlidingWindowConfig {
            window: 6,
            block: Some(3),
            global: vec![1],
            ..Default::default()
        }),
        AttentionConfig::Local(LocalAttentionConfig { block: 4, memory: 4, ..Default::default() }),
        AttentionConfig::MultiScale(MultiScaleConfig {
            windows: vec![2, 4, 6, 8],
            block: Some(3),
            ..Default::default()
        }),
        AttentionConfig::Strided(StridedConfig { stride: 3, ..Default::default() }),
        AttentionConfig::Strided(StridedConfig { stride: 3, combine: StridedCombine::Heads, ..Default::default() }),
        AttentionConfig::Bigbird(BigBirdConfig { block: 2, random_blocks: 2, global_tokens: 1, ..Default::default() }),
        AttentionConfig::Longformer(LongformerConfig {
            window: 4,
            block: Some(2),
            dilations: vec![1, 2, 1, 2],
            global: vec![2],
            ..Default::default()
        }),
        AttentionConfig::Fixed(FixedConfig { stride: 4, summary: 1, ..Default::default() }),
        AttentionConfig::Blockwise(BlockwiseConfig { block: 3, ..Default::default() }),
        AttentionConfig::Local2d(Local2dConfig { width: 4, query_rows: 2, query_cols: 2, ..Default::default() }),
    ]
}

/// Causal and bidirectional — except bidirectional blockwise, where a head's permuted block can lie
/// wholly beyond the limit and leave a query nothing to attend to (no defined output).
fn masks(cfg: &AttentionConfig) -> Vec<AttentionMask> {
    if cfg.kind() == "blockwise" {
        vec![AttentionMask::causal()]
    } else {
        vec![AttentionMask::causal(), AttentionMask::bidirectional()]
    }
}

fn init(cfg: &AttentionConfig, dev: &Device) -> Attention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, Positioning { config: &PositionConfig::Alibi(Default::default()), context: 32 }, dev)
}

/// The mechanism's own dense computation under its pattern and the mask (for the kinds that have
/// one), else the forward with the limit as a custom mask (full attention's definition).
fn dense(attn: &Attention, x: Tensor<3>, mask: &AttentionMask) -> AttentionOutput {
    let input = AttentionInput::self_attention(x, mask);
    match attn {
        Attention::SlidingWindow(a) | Attention::Local(a) | Attention::MultiScale(a) => {
            a.forward_with(input, None, true)
        }
        Attention::Strided(a) => a.forward_with(input, None, true),
        Attention::Bigbird(a) => a.forward_with(input, None, true),
        Attention::Longformer(a) => a.forward_with(input, None, true),
        Attention::Fixed(a) => a.forward_with(input, None, true),
        Attention::Blockwise(a) => a.forward_with(input, None, true),
        Attention::Local2d(a) => a.forward_with(input, None, true),
        other => {
            let dev = mask.clone().with_max_back(None);
            let n = mask.max_back.unwrap();
            let far: Vec<bool> = (0..L).flat_map(|i| (0..L).map(move |j| i > j + n)).collect();
            let custom = Tensor::<2, Bool>::from_data(TensorData::new(far, [L, L]), &Device::flex()).unsqueeze::<3>();
            let m = dev.with_custom(custom);
            other.forward(AttentionInput::self_attention(input.query, &m), None)
        }
    }
}

#[test]
fn blocked_computations_honour_the_limit_like_the_dense_ones() {
    let dev = Device::flex();
    for cfg in kinds() {
        let attn = init(&cfg, &dev);
        let x: Tensor<3> = Tensor::random([2, L, D], Distribution::Normal(0.0, 1.0), &dev);
        for base in masks(&cfg) {
            for n in [0, 3, 5] {
                let mask = base.clone().with_max_back(Some(n));
                let blocked = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let d = (blocked - dense(&attn, x.clone(), &mask).context).abs().max().into_scalar::<f32>();
                assert!(d < 1e-5, "{} max_back {n} causal {}: {d}", cfg.kind(), base.causal);
            }
            // a limit past the sequence is no limit
            let free = attn.forward(AttentionInput::self_attention(x.clone(), &base), None).context;
            let limited = base.clone().with_max_back(Some(L));
            let capped = attn.forward(AttentionInput::self_attention(x.clone(), &limited), None).context;
            let d = (free - capped).abs().max().into_scalar::<f32>();
            assert!(d < 1e-5, "{} max_back {L} changes the output by {d}", cfg.kind());
        }
    }
}

#[test]
fn no_key_reaches_a_query_more_than_n_back() {
    let dev = Device::flex();
    let n = 3;
    for cfg in kinds() {
        let attn = init(&cfg, &dev);
        let x: Tensor<3> = Tensor::random([1, L, D], Distribution::Normal(0.0, 1.0), &dev);
        let p = 2;
        let y = x
            .clone()
            .slice_assign([0..1, p..p + 1, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), &dev));
        for base in masks(&cfg) {
            let mask = base.with_max_back(Some(n));
            let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
            let diff = (run(x.clone()) - run(y.clone())).abs().max_dim(2).reshape([L]).into_data();
            let diff = diff.try_to_vec::<f32>().unwrap();
            let reached: Vec<usize> = (0..L).filter(|&i| diff[i] > 1e-6).collect();
            assert!(reached.iter().all(|&q| q <= p + n), "{} causal {}: {reached:?}", cfg.kind(), mask.causal);
            assert!(reached.contains(&p), "{}: the changed position's own output", cfg.kind());
        }
    }
}
