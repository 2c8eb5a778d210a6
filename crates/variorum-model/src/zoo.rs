//! Every kind on every axis: the rows of `variorum zoo`, and the tiny model variants the generic
//! tests run. Adding a kind to an axis's `zoo()` and to [`variants`] enrols it in both.

use variorum_attention::{
    AdaptiveSpanConfig, AttentionConfig, AverageAttentionConfig, BigBirdConfig, BlockwiseConfig, ClusteredConfig,
    EtcConfig, FixedConfig, InducingMode, InducingPointsConfig, LinearAttentionConfig, LinformerConfig, LinformerShare,
    Local2dConfig, LocalAttentionConfig, LongformerConfig, LowRankBandConfig, LshConfig, MemoryCompressedConfig,
    MultiHeadAttentionConfig, MultiScaleConfig, NystromConfig, PerformerConfig, PerformerKernel, PoolKind,
    PoolingformerConfig, ProbSparseConfig, RfaConfig, RoutingConfig, SinkhornConfig, SlidingWindowConfig,
    StridedCombine, StridedConfig,
};
use variorum_block::{
    BlockConfig, CompressionKind, CompressiveMemoryConfig, DepthConfig, FeedForwardConfig, FeedForwardKind,
    GtrxlConfig, MemoryConfig, NormKind, UniversalConfig, XlMemoryConfig, block::ResidualConfig,
};
use variorum_core::KindInfo;
use variorum_position::{
    DebertaConfig, LearnedPositionConfig, MultiplicativeConfig, PositionConfig, RopeLayout, RotaryConfig, ShawConfig,
    SinusoidalPositionConfig, T5BiasConfig, UntiedConfig, XlRelativeConfig,
};

use crate::ModelConfig;
use crate::exit_predictor::{Oracle, PredictorKind};
use crate::exits::{EveryLayerConfig, ExitConfig};
use crate::objective::{MaskedConfig, ObjectiveConfig};

/// All declared kinds, axis by axis.
pub fn kinds() -> Vec<KindInfo> {
    let mut all = PositionConfig::zoo();
    all.extend(AttentionConfig::zoo());
    all.extend(BlockConfig::zoo());
    all.extend(FeedForwardConfig::zoo());
    all.extend(MemoryConfig::zoo());
    all.extend(DepthConfig::zoo());
    all.extend(ExitConfig::zoo());
    all
}

/// A tiny base model for tests: 2 layers, d_model 32, 4 heads, context 16, 11 symbols.
pub fn tiny() -> ModelConfig {
    ModelConfig {
        vocab_size: Some(11),
        d_model: 32,
        n_layers: 2,
        seq_len: 16,
        attention: AttentionConfig::Full(MultiHeadAttentionConfig { n_heads: 4, ..Default::default() }),
        feed_forward: FeedForwardConfig { d_ff: Some(64), ..Default::default() },
        ..Default::default()
    }
}

/// One tiny model per kind on every axis (each differs from [`tiny`] on one axis), named.
pub fn variants() -> Vec<(String, ModelConfig)> {
    let mut out = vec![("base (learned, full, pre-ln, gelu)".to_string(), tiny())];
    // relative schemes use small clipping distances so that a context of 16 reaches past them
    let positions = [
        PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
        PositionConfig::Sinusoidal(SinusoidalPositionConfig { learnable: true, ..Default::default() }),
        PositionConfig::Learned(LearnedPositionConfig { max_len: Some(32), per_layer: false }),
        PositionConfig::Learned(LearnedPositionConfig { max_len: None, per_layer: true }),
        PositionConfig::None,
        PositionConfig::Shaw(ShawConfig { max_distance: 4, values: true }),
        PositionConfig::Shaw(ShawConfig { max_distance: 4, values: false }),
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 12 }),
        PositionConfig::Alibi,
        PositionConfig::Rope(RotaryConfig::default()),
        PositionConfig::Rope(RotaryConfig { layout: RopeLayout::Interleaved, rotary_dim: Some(4), base: 500.0 }),
        PositionConfig::Da,
        PositionConfig::Multiplicative(MultiplicativeConfig { max_distance: 6 }),
        PositionConfig::Untied(UntiedConfig::default()),
        PositionConfig::Deberta(DebertaConfig { max_distance: 4 }),
        PositionConfig::UniversalTimestep,
    ];
    for p in positions {
        out.push((format!("position {p:?}"), ModelConfig { position: p, ..tiny() }));
    }
    let attentions = [
        MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(2), ..Default::default() },
        MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(1), ..Default::default() },
        MultiHeadAttentionConfig { n_heads: 2, head_dim: Some(24), bias: false, ..Default::default() },
    ];
    for a in attentions {
        out.push((format!("attention {a:?}"), ModelConfig { attention: AttentionConfig::Full(a), ..tiny() }));
    }
    for norm in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let r = ResidualConfig { norm, ..Default::default() };
        out.push((format!("block post-ln {norm:?}"), ModelConfig { block: BlockConfig::PostLn(r.clone()), ..tiny() }));
        out.push((format!("block pre-ln {norm:?}"), ModelConfig { block: BlockConfig::PreLn(r), ..tiny() }));
    }
    for kind in FeedForwardKind::ALL {
        out.push((
            format!("feed_forward {}", kind.name()),
            ModelConfig { feed_forward: FeedForwardConfig { kind, d_ff: Some(48), ..Default::default() }, ..tiny() },
        ));
    }
    out.push(("untied head".into(), ModelConfig { tie_embeddings: false, ..tiny() }));
    out.push((
        "scaled embeddings + sinusoidal".into(),
        ModelConfig {
            scale_embeddings: true,
            position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
            ..tiny()
        },
    ));
    // adaptive span: spans shorter than the sequence, so trimming and the soft mask both act
    for dynamic in [false, true] {
        let span = AdaptiveSpanConfig { max_span: 6, ramp: 2, init_span: 0.5, dynamic, ..Default::default() };
        out.push((
            format!("attention adaptive-span dynamic={dynamic}"),
            ModelConfig {
                attention: AttentionConfig::AdaptiveSpan(span),
                position: PositionConfig::Rope(RotaryConfig::default()),
                ..tiny()
            },
        ));
    }
    out.push((
        "attention adaptive-span + xl memory".into(),
        ModelConfig {
            seq_len: 4,
            attention: AttentionConfig::AdaptiveSpan(AdaptiveSpanConfig {
                max_span: 8,
                ramp: 2,
                init_span: 0.5,
                ..Default::default()
            }),
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: PositionConfig::Alibi,
            ..tiny()
        },
    ));
    // memories: XL over segments of 4 with a memory long enough that token-by-token decoding
    // across segment boundaries still sees every earlier token; compressive with each function
    let xl = PositionConfig::TransformerXl(XlRelativeConfig::default());
    out.push((
        "memory xl".into(),
        ModelConfig {
            seq_len: 4,
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: xl.clone(),
            ..tiny()
        },
    ));
    for compression in
        [CompressionKind::Conv, CompressionKind::MaxPool, CompressionKind::DilatedConv, CompressionKind::MostUsed]
    {
        let memory = MemoryConfig::Compressive(CompressiveMemoryConfig {
            length: 4,
            compressed_length: 4,
            rate: 2,
            compression,
            autoencoding_weight: 0.5,
            ..Default::default()
        });
        out.push((
            format!("memory compressive {}", compression.name()),
            ModelConfig { memory, position: PositionConfig::Alibi, ..tiny() },
        ));
    }
    let reversible = BlockConfig::Reversible(Default::default());
    out.push(("block reversible".into(), ModelConfig { block: reversible.clone(), n_layers: 3, ..tiny() }));
    out.push((
        "block reversible + alibi + sliding-window".into(),
        ModelConfig {
            block: reversible,
            position: PositionConfig::Alibi,
            attention: AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 4, ..Default::default() }),
            ..tiny()
        },
    ));
    out.push(("block gtrxl".into(), ModelConfig { block: BlockConfig::Gtrxl(GtrxlConfig::default()), ..tiny() }));
    out.push((
        "block gtrxl + xl memory".into(),
        ModelConfig {
            seq_len: 4,
            block: BlockConfig::Gtrxl(GtrxlConfig::default()),
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: PositionConfig::Rope(RotaryConfig::default()),
            ..tiny()
        },
    ));
    // Universal Transformer: 3 steps of one block, with and without ACT, pre- and post-LN
    let ut = |act: bool, block: BlockConfig| ModelConfig {
        n_layers: 3,
        position: PositionConfig::UniversalTimestep,
        depth: DepthConfig::Universal(UniversalConfig { act, halting_bias: -1.0, ..Default::default() }),
        block,
        ..tiny()
    };
    out.push(("depth universal".into(), ut(false, BlockConfig::default())));
    out.push(("depth universal + act".into(), ut(true, BlockConfig::default())));
    out.push(("depth universal + act, post-ln".into(), ut(true, BlockConfig::PostLn(ResidualConfig::default()))));
    let sepconv = FeedForwardConfig { kind: FeedForwardKind::SeparableConv, d_ff: Some(48), ..Default::default() };
    out.push((
        "depth universal + act, separable-conv transition".into(),
        ModelConfig { feed_forward: sepconv, ..ut(true, BlockConfig::default()) },
    ));
    // early exits: shared head, and one classifier per block
    for shared in [true, false] {
        let exits = ExitConfig::EveryLayer(EveryLayerConfig { shared, classifier: shared, ..Default::default() });
        out.push((format!("exits every-layer shared={shared}"), ModelConfig { n_layers: 3, exits, ..tiny() }));
    }
    // the Depth-Adaptive Transformer's exit predictors, with both oracles
    for (predictor, oracle) in [
        (PredictorKind::Sequence, Oracle::Likelihood),
        (PredictorKind::TokenMultinomial, Oracle::Correctness),
        (PredictorKind::TokenGeometric, Oracle::Likelihood),
    ] {
        let exits = ExitConfig::EveryLayer(EveryLayerConfig { predictor, oracle, ..Default::default() });
        out.push((
            format!("exits predictor {} ({oracle:?})", predictor.name()),
            ModelConfig { n_layers: 3, exits, ..tiny() },
        ));
    }
    // sliding window (block-by-block band), with absolute and relative positions and GQA
    for position in [
        PositionConfig::default(),
        PositionConfig::Alibi,
        PositionConfig::Rope(RotaryConfig::default()),
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
    ] {
        let attention = AttentionConfig::SlidingWindow(SlidingWindowConfig {
            window: 5,
            block: Some(3),
            n_kv_heads: Some(2),
            ..Default::default()
        });
        out.push((
            format!("attention sliding-window + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // Image Transformer local blocks
    for position in [PositionConfig::default(), PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16 })] {
        let attention = AttentionConfig::Local(LocalAttentionConfig { block: 3, memory: 2, ..Default::default() });
        out.push((
            format!("attention local + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // Longformer's global positions, with a relative scheme
    let attention = AttentionConfig::SlidingWindow(SlidingWindowConfig {
        window: 3,
        block: Some(4),
        global: vec![0, 6],
        ..Default::default()
    });
    out.push((
        "attention sliding-window, global positions + position transformer-xl".into(),
        ModelConfig { attention, position: PositionConfig::TransformerXl(XlRelativeConfig::default()), ..tiny() },
    ));
    // windows growing from the bottom layer to the top (Longformer), and per-layer head widths
    let attention = AttentionConfig::SlidingWindow(SlidingWindowConfig {
        layer_windows: vec![2, 6],
        block: Some(4),
        ..Default::default()
    });
    out.push(("attention sliding-window, per-layer windows".into(), ModelConfig { attention, ..tiny() }));
    let attention = AttentionConfig::SlidingWindow(SlidingWindowConfig {
        window: 3,
        block: Some(2),
        dilations: vec![1, 2, 1, 3],
        ..Default::default()
    });
    out.push((
        "attention sliding-window, dilated heads + position alibi".into(),
        ModelConfig { attention, position: PositionConfig::Alibi, ..tiny() },
    ));
    let attention = AttentionConfig::MultiScale(MultiScaleConfig {
        windows: vec![1, 1, 1, 1],
        layer_windows: vec![vec![1, 2, 3, 4], vec![2, 4, 6, 8]],
        block: Some(4),
        ..Default::default()
    });
    out.push(("attention multi-scale, per-layer windows".into(), ModelConfig { attention, ..tiny() }));
    // Sparse Transformer strided patterns, the three ways of combining them
    for (combine, position) in [
        (StridedCombine::Union, PositionConfig::Alibi),
        (StridedCombine::Heads, PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16 })),
        (StridedCombine::Alternate, PositionConfig::Rope(RotaryConfig::default())),
    ] {
        let attention = AttentionConfig::Strided(StridedConfig { stride: 4, combine, ..Default::default() });
        out.push((
            format!("attention strided {combine:?} + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // BigBird: blocked window, global tokens, random blocks (the harness's sequences span several
    // blocks, so random blocks exist past the window)
    for (position, global_tokens) in
        [(PositionConfig::Alibi, 2), (PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16 }), 0)]
    {
        let attention = AttentionConfig::Bigbird(BigBirdConfig {
            block: 2,
            window_blocks: 1,
            random_blocks: 2,
            global_tokens,
            n_kv_heads: Some(2),
            ..Default::default()
        });
        out.push((
            format!("attention bigbird, {global_tokens} global + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // Longformer: dilated heads with per-layer windows and dilations (undilated at the bottom);
    // global attention for a token id (vocabulary 11: id 3 occurs in the harness's sequences)
    let attention = AttentionConfig::Longformer(LongformerConfig {
        block: Some(2),
        layer_windows: vec![2, 3],
        layer_dilations: vec![vec![1, 1, 1, 1], vec![1, 2, 1, 3]],
        n_kv_heads: Some(2),
        ..Default::default()
    });
    out.push((
        "attention longformer, dilated heads + position transformer-xl".into(),
        ModelConfig { attention, position: PositionConfig::TransformerXl(XlRelativeConfig::default()), ..tiny() },
    ));
    let attention = AttentionConfig::Longformer(LongformerConfig {
        window: 2,
        block: Some(4),
        global_token_ids: vec![3],
        dilations: vec![1, 1, 2, 2],
        ..Default::default()
    });
    out.push((
        "attention longformer, global token id + position alibi".into(),
        ModelConfig { attention, position: PositionConfig::Alibi, ..tiny() },
    ));
    // Sparse Transformer fixed pattern (own block + summaries), the three combinations
    for (combine, position) in [
        (StridedCombine::Union, PositionConfig::Alibi),
        (StridedCombine::Heads, PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16 })),
        (StridedCombine::Alternate, PositionConfig::Rope(RotaryConfig::default())),
    ] {
        let attention = AttentionConfig::Fixed(FixedConfig { stride: 4, summary: 2, combine, ..Default::default() });
        out.push((
            format!("attention fixed {combine:?} + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // blockwise: own block plus a permuted (shifted) block per head
    let attention = AttentionConfig::Blockwise(BlockwiseConfig { block: 3, n_kv_heads: Some(2), ..Default::default() });
    out.push((
        "attention blockwise + position alibi".into(),
        ModelConfig { attention, position: PositionConfig::Alibi, ..tiny() },
    ));
    // "attend at most N back" on full attention (a band computed by blocks, a trimmed cache) and
    // on a sparse kind
    out.push((
        "max_back 3, attention full + position alibi".into(),
        ModelConfig { max_back: Some(3), position: PositionConfig::Alibi, ..tiny() },
    ));
    let attention = AttentionConfig::Strided(StridedConfig { stride: 4, ..Default::default() });
    out.push(("max_back 5, attention strided".into(), ModelConfig { max_back: Some(5), attention, ..tiny() }));
    // Image Transformer 2D local attention over a 4-wide raster
    let attention = AttentionConfig::Local2d(Local2dConfig {
        width: 4,
        query_rows: 2,
        query_cols: 2,
        memory_rows: 1,
        memory_cols: 1,
        ..Default::default()
    });
    out.push((
        "attention local-2d + position alibi".into(),
        ModelConfig { attention, position: PositionConfig::Alibi, ..tiny() },
    ));
    // ETC: a global token per segment of 3 beside the sequence, a window of 2 (relative
    // positions on the local part)
    for position in [PositionConfig::default(), PositionConfig::TransformerXl(XlRelativeConfig::default())] {
        let attention = AttentionConfig::Etc(EtcConfig {
            window: 2,
            segment: 3,
            block: Some(2),
            n_kv_heads: Some(2),
            ..Default::default()
        });
        out.push((
            format!("attention etc + position {}", position.kind()),
            ModelConfig { attention, position, ..tiny() },
        ));
    }
    // Multi-Scale Transformer: one window per head
    let attention = AttentionConfig::MultiScale(MultiScaleConfig {
        windows: vec![1, 2, 4, 7],
        block: Some(3),
        ..Default::default()
    });
    out.push((
        "attention multi-scale + position alibi".into(),
        ModelConfig { attention, position: PositionConfig::Alibi, ..tiny() },
    ));
    // memory-compressed (strided-convolution keys plus the own block), alone and without `local`
    for (stride, local) in [(3, true), (2, false)] {
        let attention =
            AttentionConfig::MemoryCompressed(MemoryCompressedConfig { stride, local, ..Default::default() });
        out.push((format!("attention memory-compressed stride {stride}"), ModelConfig { attention, ..tiny() }));
    }
    // kernelised attention (linear time, recurrent decoding); small chunks so the chunked causal
    // form and its carried sums are exercised at the harness's lengths
    let performer = PerformerConfig { chunk: 3, features: Some(16), ..Default::default() };
    let rfa = RfaConfig { chunk: 3, features: Some(32), ..Default::default() };
    for (name, attention) in [
        ("linear", AttentionConfig::Linear(LinearAttentionConfig { chunk: 3, ..Default::default() })),
        ("performer", AttentionConfig::Performer(performer.clone())),
        ("performer relu", AttentionConfig::Performer(PerformerConfig { kernel: PerformerKernel::Relu, ..performer })),
        ("rfa", AttentionConfig::Rfa(rfa.clone())),
        ("rfa gate", AttentionConfig::Rfa(RfaConfig { gate: true, gate_bias: 0.0, ..rfa })),
        ("average", AttentionConfig::Average(AverageAttentionConfig { chunk: 3, ..Default::default() })),
        // several chunks and buckets at the harness's lengths
        ("lsh", AttentionConfig::Lsh(LshConfig { buckets: 4, rounds: 2, chunk: 3, ..Default::default() })),
        ("routing", AttentionConfig::Routing(RoutingConfig { clusters: 3, window: 2, ..Default::default() })),
        ("sinkhorn", AttentionConfig::Sinkhorn(SinkhornConfig { block: 3, ..Default::default() })),
        (
            "poolingformer max",
            AttentionConfig::Poolingformer(PoolingformerConfig { window: 3, pool_size: 2, ..Default::default() }),
        ),
        (
            "poolingformer mean, level-2 window",
            AttentionConfig::Poolingformer(PoolingformerConfig {
                window: 2,
                pool: PoolKind::Mean,
                pool_size: 3,
                level2_window: Some(9),
                ..Default::default()
            }),
        ),
        ("low-rank-band", AttentionConfig::LowRankBand(LowRankBandConfig { rank: 2, band: 3, ..Default::default() })),
        // few active queries at the harness's lengths (u = ⌈ln(t + 1)⌉ by prefix rank)
        ("prob-sparse", AttentionConfig::ProbSparse(ProbSparseConfig { factor: 1.0, ..Default::default() })),
        (
            "routing + local heads",
            AttentionConfig::Routing(RoutingConfig { clusters: 2, window: 3, local_heads: 2, ..Default::default() }),
        ),
    ] {
        out.push((format!("attention {name}"), ModelConfig { attention, ..tiny() }));
    }
    // the masked objective (bidirectional attention): full attention, a
    // causal-capable sparse kind run bidirectionally, a reversible stack
    let masked = || ObjectiveConfig::Masked(MaskedConfig::default());
    for (name, cfg) in [
        ("masked lm", ModelConfig { objective: masked(), ..tiny() }),
        (
            "masked lm + position sinusoidal",
            ModelConfig {
                objective: masked(),
                position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
                ..tiny()
            },
        ),
        (
            "masked lm + sliding-window",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 3, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "masked lm + inducing-points isab",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::InducingPoints(InducingPointsConfig { slots: 4, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "masked lm + inducing-points luna",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::InducingPoints(InducingPointsConfig {
                    slots: 4,
                    mode: InducingMode::Luna,
                    ..Default::default()
                }),
                ..tiny()
            },
        ),
        (
            "masked lm + linformer",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::Linformer(LinformerConfig { max_len: 32, k: 4, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "masked lm + linformer unshared",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::Linformer(LinformerConfig {
                    max_len: 32,
                    k: 4,
                    share: LinformerShare::None,
                    ..Default::default()
                }),
                ..tiny()
            },
        ),
        (
            "masked lm + nystrom",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::Nystrom(NystromConfig {
                    landmarks: 4,
                    conv_kernel: Some(3),
                    ..Default::default()
                }),
                ..tiny()
            },
        ),
        (
            "masked lm + clustered",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::Clustered(ClusteredConfig {
                    clusters: 4,
                    iterations: 3,
                    ..Default::default()
                }),
                ..tiny()
            },
        ),
        (
            "masked lm + clustered top-k",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::Clustered(ClusteredConfig {
                    clusters: 3,
                    top_k: Some(4),
                    ..Default::default()
                }),
                ..tiny()
            },
        ),
        (
            "masked lm + prob-sparse",
            ModelConfig {
                objective: masked(),
                attention: AttentionConfig::ProbSparse(ProbSparseConfig { factor: 1.0, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "masked lm + reversible",
            ModelConfig { objective: masked(), block: BlockConfig::Reversible(Default::default()), ..tiny() },
        ),
    ] {
        out.push((name.into(), cfg));
    }
    // relative schemes with grouped-query heads (keys shared by several query heads)
    let gqa = AttentionConfig::Full(MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(2), ..Default::default() });
    for p in [
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::Deberta(DebertaConfig { max_distance: 4 }),
        PositionConfig::Rope(RotaryConfig::default()),
    ] {
        out.push((
            format!("gqa + position {}", p.kind()),
            ModelConfig { position: p, attention: gqa.clone(), ..tiny() },
        ));
    }
    out
}
