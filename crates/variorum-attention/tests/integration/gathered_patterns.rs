//! Patterns with keys gathered from anywhere in the sequence (BigBird's random blocks, the fixed
//! pattern's summaries, blockwise permutations): the block-by-block computation equals dense
//! attention under the pattern's mask, causal and bidirectional, with the position schemes that
//! act through the distance, for ragged lengths; and the pattern is what the paper says.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use common::{D, decoding_gap, distance_schemes as schemes, masks_and_paths, with_kernels};
use variorum_attention::{
    AttentionConfig, AttentionInput, AttentionKind, AttentionOutput, BigBirdAttention, BigBirdConfig,
    BlockwiseAttention, BlockwiseConfig, FixedAttention, FixedConfig, Local2dAttention, Local2dConfig, Positioning,
    RandomDraw, StridedCombine,
};
use variorum_core::AttentionMask;
use variorum_position::PositionConfig;

fn bigbird(cfg: &BigBirdConfig, position: &PositionConfig, dev: &Device) -> BigBirdAttention {
    let cfg = AttentionConfig::Bigbird(cfg.clone());
    cfg.validate(D).unwrap();
    match cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 64 }, dev) {
        variorum_attention::Attention::Bigbird(a) => a,
        _ => unreachable!(),
    }
}

fn bigbirds() -> Vec<BigBirdConfig> {
    let mut out = Vec::new();
    for (block, window_blocks, random_blocks, global_tokens, kv) in
        [(2, 1, 2, 0, 4), (3, 0, 1, 1, 2), (2, 0, 3, 3, 1), (4, 1, 1, 2, 4)]
    {
        out.push(BigBirdConfig {
            block,
            window_blocks,
            random_blocks,
            global_tokens,
            n_kv_heads: Some(kv),
            seed: 7,
            ..Default::default()
        });
    }
    out
}

fn run(f: impl Fn(AttentionInput) -> AttentionOutput, x: &Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
    f(AttentionInput::self_attention(x.clone(), mask)).context
}

#[test]
fn bigbird_blocks_equal_dense_attention_under_its_mask() {
    let dev = Device::flex();
    for position in schemes() {
        for cfg in bigbirds() {
            let attn = bigbird(&cfg, &position, &dev);
            for len in [3, 13, 16] {
                let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
                for (mask, kernels) in masks_and_paths() {
                    let blocked = with_kernels(kernels, || run(|i| attn.forward_with(i, None, false), &x, &mask));
                    let dense = run(|i| attn.forward_with(i, None, true), &x, &mask);
                    let d = (blocked - dense).abs().max().into_scalar::<f32>();
                    let causal = mask.causal;
                    assert!(d < 1e-5, "{} {cfg:?} len {len} causal {causal} kernels {kernels}: {d}", position.kind());
                }
            }
        }
    }
}

#[test]
fn random_blocks_are_fixed_by_the_seed_and_lie_outside_the_window() {
    let dev = Device::flex();
    let cfg = BigBirdConfig { block: 2, window_blocks: 1, random_blocks: 3, global_tokens: 2, ..Default::default() };
    let a = bigbird(&cfg, &PositionConfig::None(Default::default()), &dev);
    let again = bigbird(&cfg, &PositionConfig::None(Default::default()), &dev);
    let other_layer = bigbird(&cfg.clone().with_layer(1), &PositionConfig::None(Default::default()), &dev);
    let mut differs = false;
    for causal in [true, false] {
        for t in 0..40 {
            let picked = a.random_blocks(t, 40, causal);
            assert_eq!(picked, again.random_blocks(t, 40, causal));
            differs |= picked != other_layer.random_blocks(t, 40, causal);
            // r blocks whenever there are r candidates: outside the window, not block 0 (global),
            // before the query's block when causal
            let candidates = (0..if causal { t } else { 40 }).filter(|&v| v.abs_diff(t) > 1 && v > 0).count();
            assert_eq!(picked.len(), candidates.min(3), "block {t}");
            assert!(picked.iter().all(|&v| v.abs_diff(t) > 1 && v > 0 && (!causal || v < t)));
            if causal {
                // the causal pattern does not depend on the sequence length (decoding sees it too)
                assert_eq!(picked, a.random_blocks(t, 80, true));
            }
        }
    }
    assert!(differs, "another layer draws other random blocks");
}

/// Which of `len` outputs change when position `p` changes.
fn reached_by(attn: &BigBirdAttention, len: usize, p: usize, causal: bool, dev: &Device) -> Vec<usize> {
    let x: Tensor<3> = Tensor::random([1, len, D], Distribution::Normal(0.0, 1.0), dev);
    let y =
        x.clone().slice_assign([0..1, p..p + 1, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), dev));
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    let go = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    let diff = (go(x) - go(y)).abs().max_dim(2).reshape([len]).into_data().try_to_vec::<f32>().unwrap();
    diff.iter().enumerate().filter(|(_, d)| **d > 1e-6).map(|(i, _)| i).collect()
}

#[test]
fn global_tokens_see_everything_and_others_only_their_pattern() {
    let dev = Device::flex();
    let cfg = BigBirdConfig { block: 4, window_blocks: 1, random_blocks: 1, global_tokens: 2, ..Default::default() };
    let attn = bigbird(&cfg, &PositionConfig::Alibi(Default::default()), &dev);
    let len = 80;
    for causal in [true, false] {
        // a far position reaches the global queries 0 and 1 (bidirectional), its window, and the
        // query blocks that drew its block at random — nothing else
        let p = 60;
        let reached = reached_by(&attn, len, p, causal, &dev);
        let blocks = len / 4;
        let want: Vec<usize> = (0..len)
            .filter(|&q| {
                let (bq, bk) = (q / 4, p / 4);
                let sees = q < 2 || bq.abs_diff(bk) <= 1 || attn.random_blocks(bq, blocks, causal).contains(&bk);
                sees && (!causal || p <= q)
            })
            .collect();
        assert_eq!(reached, want, "causal {causal}");
        if !causal {
            assert!(reached.contains(&0) && reached.contains(&1), "global queries see position 60");
        }
        assert!(want.len() < len / 2, "the pattern is sparse");
        // a global position reaches every query after it
        let reached = reached_by(&attn, len, 1, causal, &dev);
        assert_eq!(reached, (if causal { 1 } else { 0 }..len).collect::<Vec<_>>());
    }
}

/// transformers' BigBird layout: the first and the last block global, no random draw (block 0
/// counted once per random block) or a seeded one.
fn transformers_bigbirds() -> Vec<BigBirdConfig> {
    [RandomDraw::FirstBlock, RandomDraw::Seeded]
        .into_iter()
        .flat_map(|random_draw| {
            [(2, 2, 4), (3, 1, 2)].map(|(block, random_blocks, kv)| BigBirdConfig {
                block,
                window_blocks: 1,
                random_blocks,
                global_tokens: block,
                global_last_block: true,
                random_draw,
                n_kv_heads: Some(kv),
                seed: 3,
                ..Default::default()
            })
        })
        .collect()
}

#[test]
fn transformers_bigbird_blocks_equal_its_dense_definition() {
    let dev = Device::flex();
    for position in schemes() {
        for cfg in transformers_bigbirds() {
            let attn = bigbird(&cfg, &position, &dev);
            for len in [5, 13, 18] {
                let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
                let mask = AttentionMask::bidirectional();
                for kernels in [true, false] {
                    let blocked = with_kernels(kernels, || run(|i| attn.forward_with(i, None, false), &x, &mask));
                    let dense = run(|i| attn.forward_with(i, None, true), &x, &mask);
                    let d = (blocked - dense).abs().max().into_scalar::<f32>();
                    assert!(d < 1e-5, "{} {cfg:?} len {len} kernels {kernels}: {d}", position.kind());
                }
            }
        }
    }
}

#[test]
fn the_first_block_drawn_r_times_weighs_as_its_keys_with_ln_1_plus_r_added() {
    // under `first-block`, a non-global query's softmax holds block 0's keys 1 + r times: the same
    // as a pattern without random blocks whose block-0 scores are raised by ln(1 + r). Check it
    // on weights built by hand from the same projections: one head, no position scheme.
    let dev = Device::flex();
    let (block, r, len) = (2, 3, 12);
    let cfg = BigBirdConfig {
        n_heads: 1,
        block,
        window_blocks: 1,
        random_blocks: r,
        global_tokens: block,
        global_last_block: true,
        random_draw: RandomDraw::FirstBlock,
        ..Default::default()
    };
    let attn = bigbird(&cfg, &PositionConfig::None(Default::default()), &dev);
    let x: Tensor<3> = Tensor::random([1, len, D], Distribution::Normal(0.0, 1.0), &dev);
    let mask = AttentionMask::bidirectional();
    let got = run(|i| attn.forward(i, None), &x, &mask);
    let qkv = attn.attention.qkv.qkv.forward(x.clone()); // [1, len, 3·D]
    let (q, k, v) = (qkv.clone().narrow(2, 0, D), qkv.clone().narrow(2, D, D), qkv.narrow(2, 2 * D, D));
    let scores = q.matmul(k.swap_dims(1, 2)).div_scalar((D as f32).sqrt()); // [1, len, len]
    let scores = scores.into_data().try_to_vec::<f32>().unwrap();
    let last = (len.div_ceil(block) - 1) * block;
    let mut context = vec![0f32; len * D];
    let v_rows = v.clone().into_data().try_to_vec::<f32>().unwrap();
    for i in 0..len {
        let global_q = i < block || i >= last;
        let weight = |j: usize| -> f64 {
            let s = scores[i * len + j] as f64;
            if global_q {
                return s.exp();
            }
            let near = (i / block).abs_diff(j / block) <= 1;
            let (first, last_block) = (j < block, j >= last);
            let count = match (first, last_block || near) {
                (true, _) => 1 + r,
                (false, true) => 1,
                (false, false) => 0,
            };
            count as f64 * s.exp()
        };
        let w: Vec<f64> = (0..len).map(weight).collect();
        let z: f64 = w.iter().sum();
        for (j, wj) in w.iter().enumerate() {
            for c in 0..D {
                context[i * D + c] += (wj / z) as f32 * v_rows[j * D + c];
            }
        }
    }
    let want = attn.attention.out.forward(Tensor::<3>::from_data(TensorData::new(context, [1, len, D]), &dev));
    let d = (got - want).abs().max().into_scalar::<f32>();
    assert!(d < 1e-5, "{d}");
}

#[test]
fn the_last_block_is_global_and_short_sequences_get_full_attention() {
    let dev = Device::flex();
    let cfg = BigBirdConfig {
        block: 2,
        window_blocks: 1,
        random_blocks: 1,
        global_tokens: 2,
        global_last_block: true,
        random_draw: RandomDraw::FirstBlock,
        full_up_to: 14,
        ..Default::default()
    };
    let attn = bigbird(&cfg, &PositionConfig::None(Default::default()), &dev);
    // 21 positions in 11 blocks, the last (position 20) alone: it reaches every query, and a
    // change in the middle reaches its window, the first block and the last
    assert_eq!(reached_by(&attn, 21, 20, false, &dev), (0..21).collect::<Vec<_>>());
    assert_eq!(reached_by(&attn, 21, 10, false, &dev), vec![0, 1, 8, 9, 10, 11, 12, 13, 20]);
    // at 14 positions and fewer, full attention: every query reached
    assert_eq!(reached_by(&attn, 14, 7, false, &dev), (0..14).collect::<Vec<_>>());
    assert_eq!(reached_by(&attn, 15, 7, false, &dev).len(), 2 + 6 + 1);
}

#[test]
fn settings_that_read_the_sequence_end_have_no_causal_form() {
    for cfg in [
        BigBirdConfig { global_last_block: true, ..Default::default() },
        BigBirdConfig { random_draw: RandomDraw::FirstBlock, ..Default::default() },
        BigBirdConfig { full_up_to: 64, ..Default::default() },
    ] {
        let caps = cfg.capabilities();
        assert!(!caps.causal && !caps.incremental && caps.bidirectional, "{cfg:?}");
    }
    assert!(BigBirdConfig::default().capabilities().causal);
    let bad = BigBirdConfig {
        random_draw: RandomDraw::FirstBlock,
        normaliser: variorum_attention::Normaliser::Relu,
        ..Default::default()
    };
    assert!(bad.validate(D).unwrap_err().to_string().contains("random_draw"));
}

fn fixed(cfg: &FixedConfig, position: &PositionConfig, dev: &Device) -> FixedAttention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 64 }, dev)
}

fn blockwise(cfg: &BlockwiseConfig, position: &PositionConfig, dev: &Device) -> BlockwiseAttention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 64 }, dev)
}

#[test]
fn fixed_and_blockwise_blocks_equal_dense_attention_under_their_masks() {
    let dev = Device::flex();
    for position in schemes() {
        let mut runs: Vec<(String, Box<dyn Fn(AttentionInput, bool) -> AttentionOutput>)> = Vec::new();
        for (stride, summary, combine, layer) in [
            (4, 1, StridedCombine::Union, 0),
            (3, 2, StridedCombine::Heads, 0),
            (4, 2, StridedCombine::Alternate, 0),
            (4, 2, StridedCombine::Alternate, 1),
        ] {
            let cfg =
                FixedConfig { stride, summary, combine, n_kv_heads: Some(2), ..Default::default() }.for_layer(layer);
            let attn = fixed(&cfg, &position, &dev);
            runs.push((
                format!("fixed {stride}/{summary} {combine:?} layer {layer}"),
                Box::new(move |i: AttentionInput, d| attn.forward_with(i, None, d)),
            ));
        }
        for (block, shifts) in [(3, vec![0, 1, 2, 3]), (2, vec![2, 2, 1, 1]), (4, vec![])] {
            let cfg = BlockwiseConfig { block, shifts: shifts.clone(), n_kv_heads: Some(2), ..Default::default() };
            let attn = blockwise(&cfg, &position, &dev);
            runs.push((
                format!("blockwise {block} {shifts:?}"),
                Box::new(move |i: AttentionInput, d| attn.forward_with(i, None, d)),
            ));
        }
        for (name, f) in &runs {
            for len in [3, 13, 16] {
                let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
                for (mask, kernels) in masks_and_paths() {
                    let blocked = with_kernels(kernels, || run(|i: AttentionInput| f(i, false), &x, &mask));
                    let dense = run(|i: AttentionInput| f(i, true), &x, &mask);
                    let d = (blocked - dense).abs().max().into_scalar::<f32>();
                    let causal = mask.causal;
                    assert!(d < 1e-5, "{} {name} len {len} causal {causal} kernels {kernels}: {d}", position.kind());
                }
            }
        }
    }
}

/// Which of `len` outputs change when position `p` changes, for any attention.
fn reach(
    f: impl Fn(AttentionInput) -> AttentionOutput,
    len: usize,
    p: usize,
    causal: bool,
    dev: &Device,
) -> Vec<usize> {
    let x: Tensor<3> = Tensor::random([1, len, D], Distribution::Normal(0.0, 1.0), dev);
    let y =
        x.clone().slice_assign([0..1, p..p + 1, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), dev));
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    let go = |x: Tensor<3>| f(AttentionInput::self_attention(x, &mask)).context;
    let diff = (go(x) - go(y)).abs().max_dim(2).reshape([len]).into_data().try_to_vec::<f32>().unwrap();
    diff.iter().enumerate().filter(|(_, d)| **d > 1e-6).map(|(i, _)| i).collect()
}

#[test]
fn fixed_summaries_reach_every_later_block_and_others_only_their_own() {
    let dev = Device::flex();
    let attn = fixed(
        &FixedConfig { stride: 4, summary: 1, ..Default::default() },
        &PositionConfig::None(Default::default()),
        &dev,
    );
    let f = |i: AttentionInput| attn.forward(i, None);
    // position 3 is block 0's summary: every later query sees it
    assert_eq!(reach(&f, 16, 3, true, &dev), (3..16).collect::<Vec<_>>());
    // position 5 is not: its block (4..8) from 5 on, nothing else
    assert_eq!(reach(&f, 16, 5, true, &dev), vec![5, 6, 7]);
    assert_eq!(reach(&f, 16, 5, false, &dev), vec![4, 5, 6, 7]);
}

#[test]
fn blockwise_heads_read_their_permuted_block() {
    let dev = Device::flex();
    // every head shifted by 1: block t reads block t + 1 (mod 4) — position 5 (block 1) reaches
    // block 0's queries, and its own output through its query only; causally a shift of 2 reads two blocks back, so position 5 reaches
    // its own block from 5 on and block 3
    let cfg = BlockwiseConfig { block: 4, shifts: vec![1; 4], ..Default::default() };
    let attn = blockwise(&cfg, &PositionConfig::Alibi(Default::default()), &dev);
    assert_eq!(reach(|i: AttentionInput| attn.forward(i, None), 16, 5, false, &dev), vec![0, 1, 2, 3, 5]);
    let cfg = BlockwiseConfig { block: 4, shifts: vec![2; 4], ..Default::default() };
    let attn = blockwise(&cfg, &PositionConfig::Alibi(Default::default()), &dev);
    assert_eq!(reach(|i: AttentionInput| attn.forward(i, None), 16, 5, true, &dev), vec![5, 6, 7, 12, 13, 14, 15]);
}

fn local_2d(cfg: &Local2dConfig, position: &PositionConfig, dev: &Device) -> Local2dAttention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 64 }, dev)
}

#[test]
fn local_2d_rectangles_equal_dense_attention_under_their_mask() {
    let dev = Device::flex();
    for position in schemes() {
        for (width, query_rows, query_cols, memory_rows, memory_cols, kv) in
            [(5, 2, 2, 1, 1, 4), (4, 1, 4, 2, 0, 2), (6, 2, 3, 0, 2, 1), (3, 3, 2, 1, 1, 4)]
        {
            let cfg = Local2dConfig {
                width,
                query_rows,
                query_cols,
                memory_rows,
                memory_cols,
                n_kv_heads: Some(kv),
                ..Default::default()
            };
            let attn = local_2d(&cfg, &position, &dev);
            // a last row that is partial, and one that is full
            for len in [2, 23, 24] {
                let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
                for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                    let blocked = run(|i: AttentionInput| attn.forward_with(i, None, false), &x, &mask);
                    let dense = run(|i: AttentionInput| attn.forward_with(i, None, true), &x, &mask);
                    let d = (blocked - dense).abs().max().into_scalar::<f32>();
                    assert!(d < 1e-5, "{} {cfg:?} len {len} causal {}: {d}", position.kind(), mask.causal);
                }
            }
        }
    }
}

#[test]
fn a_2d_query_sees_its_memory_rectangle() {
    // an 8-wide image, rectangles of 2 × 4, memory 1 row up and 2 columns either side: position
    // 19 (row 2, column 3) sits in the rectangle of rows 2–3, columns 0–3; its memory is rows 1–3,
    // columns 0–5 (causal: up to itself)
    let dev = Device::flex();
    let cfg =
        Local2dConfig { width: 8, query_rows: 2, query_cols: 4, memory_rows: 1, memory_cols: 2, ..Default::default() };
    let attn = local_2d(&cfg, &PositionConfig::None(Default::default()), &dev);
    let seen: Vec<usize> = (0..32).filter(|&k| attn.sees(19, k, true)).collect();
    assert_eq!(seen, vec![8, 9, 10, 11, 12, 13, 16, 17, 18, 19]);
    // reach: position 9 (row 1, column 1) is seen by its own rectangle from 9 on and by the
    // rectangle below it (rows 2–3, columns 0–3); the rectangles of columns 4–7 reach back only
    // to column 2
    let f = |i: AttentionInput| attn.forward(i, None);
    assert_eq!(reach(&f, 32, 9, true, &dev), vec![9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]);
}

#[test]
fn bigbird_decoding_gathers_what_the_full_forward_sees() {
    let dev = Device::flex();
    for position in schemes() {
        for cfg in bigbirds() {
            let attn = bigbird(&cfg, &position, &dev);
            let x: Tensor<3> = Tensor::random([2, 21, D], Distribution::Normal(0.0, 1.0), &dev);
            let d = decoding_gap(|i, c| attn.forward(i, c), &x, 5);
            assert!(d < 1e-4, "{} {cfg:?}: {d}", position.kind());
        }
    }
}

#[test]
fn fixed_decoding_reads_its_block_and_the_summaries() {
    let dev = Device::flex();
    for position in schemes() {
        for (combine, layer) in [(StridedCombine::Union, 0), (StridedCombine::Heads, 0), (StridedCombine::Alternate, 1)]
        {
            let cfg = FixedConfig { stride: 4, summary: 2, combine, n_kv_heads: Some(2), ..Default::default() }
                .for_layer(layer);
            let attn = fixed(&cfg, &position, &dev);
            let x: Tensor<3> = Tensor::random([2, 19, D], Distribution::Normal(0.0, 1.0), &dev);
            let d = decoding_gap(|i, c| attn.forward(i, c), &x, 3);
            assert!(d < 1e-4, "{} {combine:?}: {d}", position.kind());
        }
    }
}
