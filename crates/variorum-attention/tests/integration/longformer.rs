//! Longformer: dilated heads and global tokens (by position or by token id) computed by blocks
//! equal dense attention under the pattern's mask, for every relative position scheme; a dilated
//! head reaches every δ-th position; global tokens see everything; decoding token by token with
//! global tokens chosen by id equals the full forward; global attention has its own projections.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use common::{D, schemes};
use variorum_attention::{AttentionInput, AttentionKind, LongformerAttention, LongformerConfig, Positioning};
use variorum_attention::{GlobalProjections, LongformerCache};
use variorum_core::AttentionMask;
use variorum_position::{PositionConfig, XlRelativeConfig};

fn longformer(cfg: &LongformerConfig, position: &PositionConfig, dev: &Device) -> LongformerAttention {
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 32 }, dev)
}

fn configs() -> Vec<LongformerConfig> {
    vec![
        LongformerConfig { window: 3, block: Some(2), dilations: vec![1, 2, 1, 3], ..Default::default() },
        LongformerConfig {
            window: 2,
            block: Some(3),
            look_ahead: Some(1),
            dilations: vec![2, 2, 2, 2],
            global: vec![0, 7],
            n_kv_heads: Some(2),
            ..Default::default()
        },
        LongformerConfig { window: 4, block: Some(4), global: vec![5], n_kv_heads: Some(1), ..Default::default() },
    ]
}

#[test]
fn dilated_heads_and_global_tokens_equal_dense_attention() {
    let dev = Device::flex();
    for position in schemes() {
        for cfg in configs() {
            let attn = longformer(&cfg, &position, &dev);
            for len in [2, 11, 12] {
                let x: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
                // the same global tokens in both rows, then different ones per row (by token id)
                for by_id in [vec![vec![3], vec![3]], vec![vec![2, 9], vec![]]] {
                    for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                        let mask = mask.with_global(by_id.clone());
                        let run = |dense| {
                            attn.forward_with(AttentionInput::self_attention(x.clone(), &mask), None, dense).context
                        };
                        let d = (run(false) - run(true)).abs().max().into_scalar::<f32>();
                        assert!(
                            d < 1e-5,
                            "{} {:?} len {len} by id {by_id:?} causal {}: {d}",
                            position.kind(),
                            cfg.dilations,
                            mask.causal
                        );
                    }
                }
            }
        }
    }
}

/// Which of 16 outputs change when position `p` changes.
fn reached_by(attn: &LongformerAttention, mask: &AttentionMask, p: usize, dev: &Device) -> Vec<usize> {
    let x: Tensor<3> = Tensor::random([1, 16, D], Distribution::Normal(0.0, 1.0), dev);
    let y =
        x.clone().slice_assign([0..1, p..p + 1, 0..D], Tensor::random([1, 1, D], Distribution::Normal(0.0, 1.0), dev));
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, mask), None).context;
    let diff = (run(x) - run(y)).abs().max_dim(2).reshape([16]).into_data().try_to_vec::<f32>().unwrap();
    (0..16).filter(|&i| diff[i] > 1e-6).collect()
}

#[test]
fn a_dilated_window_reaches_every_delta_th_position() {
    let dev = Device::flex();
    let cfg = LongformerConfig { window: 3, block: Some(4), dilations: vec![3; 4], ..Default::default() };
    let attn = longformer(&cfg, &PositionConfig::None(Default::default()), &dev);
    // w = 3 keys, δ = 3 apart: position 2 reaches 2, 5, 8 and no other query
    assert_eq!(reached_by(&attn, &AttentionMask::causal(), 2, &dev), vec![2, 5, 8]);
    // a global token by id at 4 reaches everything after it; a far change reaches 4 too when
    // bidirectional
    let by_id = AttentionMask::causal().with_global(vec![vec![4]]);
    assert_eq!(reached_by(&attn, &by_id, 4, &dev), (4..16).collect::<Vec<_>>());
    let open = AttentionMask::bidirectional().with_global(vec![vec![4]]);
    assert_eq!(reached_by(&attn, &open, 14, &dev), vec![4, 8, 11, 14]);
}

#[test]
fn decoding_with_global_tokens_by_id_equals_the_full_forward() {
    let dev = Device::flex();
    for position in
        [PositionConfig::Alibi(Default::default()), PositionConfig::TransformerXl(XlRelativeConfig::default())]
    {
        // with ids configured the mask brings the global positions and the cache keeps every key;
        // without, the cache keeps the reach of the widest dilated window: (2 − 1)·2 + 1 keys
        for ids in [vec![7], vec![]] {
            let cfg = LongformerConfig {
                window: 2,
                block: Some(2),
                dilations: vec![1, 2, 1, 2],
                global_token_ids: ids.clone(),
                ..Default::default()
            };
            let attn = longformer(&cfg, &position, &dev);
            let x: Tensor<3> = Tensor::random([2, 12, D], Distribution::Normal(0.0, 1.0), &dev);
            let by_id = if ids.is_empty() { vec![vec![], vec![]] } else { vec![vec![1, 6], vec![3]] };
            let full_mask = AttentionMask::causal().with_global(by_id.clone());
            let full = attn.forward(AttentionInput::self_attention(x.clone(), &full_mask), None).context;
            let mut cache = LongformerCache::default();
            let mut parts = Vec::new();
            for (s, n) in [(0, 3)].into_iter().chain((3..12).map(|t| (t, 1))) {
                let here: Vec<Vec<usize>> =
                    by_id.iter().map(|row| row.iter().copied().filter(|&g| g >= s && g < s + n).collect()).collect();
                let m = AttentionMask::causal().at(s, 0).with_global(here);
                parts.push(
                    attn.forward(AttentionInput::self_attention(x.clone().narrow(1, s, n), &m), Some(&mut cache))
                        .context,
                );
            }
            let d = (full - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>();
            assert!(d < 1e-4, "{} ids {ids:?}: {d}", position.kind());
            assert_eq!(cache.local.len(), if ids.is_empty() { 3 } else { 12 });
            // the global projections' keys of every position, when there are global tokens
            assert_eq!(cache.global.len(), if ids.is_empty() { 0 } else { 12 });
        }
    }
}

/// The paper's separate Q_g, K_g, V_g: a global token's output is attention over every key with
/// them; every other output scores the global keys with the window's projections, so the global
/// projections change the global rows only. They start as copies of the window's: a fresh layer
/// equals the shared form.
#[test]
fn global_attention_has_its_own_projections() {
    let dev = Device::flex();
    let cfg = LongformerConfig { window: 3, block: Some(2), global: vec![2, 9], ..Default::default() };
    let global_rows = [2, 9];
    // only a layer with global tokens has them; `shared` keeps the window's
    let none = PositionConfig::None(Default::default());
    assert!(longformer(&LongformerConfig::default(), &none, &dev).global_qkv.is_none());
    let shared_cfg = LongformerConfig { global_projections: Some(GlobalProjections::Shared), ..cfg.clone() };
    assert!(longformer(&shared_cfg, &none, &dev).global_qkv.is_none());
    for position in schemes() {
        let fresh = longformer(&cfg, &position, &dev);
        let shared = LongformerAttention { global_qkv: None, ..fresh.clone() };
        // trained apart: other values in Q_g, K_g, V_g
        let other = longformer(&cfg, &position, &dev).global_qkv;
        let separate = LongformerAttention { global_qkv: other.clone(), ..fresh.clone() };
        // the shared form of the global projections: its global rows are the definition
        let by_global = LongformerAttention { global_qkv: None, ..fresh.clone() };
        let by_global = LongformerAttention {
            attention: variorum_attention::MultiHeadAttention { qkv: other.unwrap(), ..by_global.attention.clone() },
            ..by_global
        };
        let x: Tensor<3> = Tensor::random([2, 12, D], Distribution::Normal(0.0, 1.0), &dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let run =
                |a: &LongformerAttention| a.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let row = |t: &Tensor<3>, i: usize| t.clone().narrow(1, i, 1);
            let gap = |a: Tensor<3>, b: Tensor<3>| (a - b).abs().max().into_scalar::<f32>();
            let what = format!("{} causal {}", position.kind(), mask.causal);
            assert!(gap(run(&fresh), run(&shared)) < 1e-5, "{what}: a fresh layer is the shared form");
            let (sep, sh, def) = (run(&separate), run(&shared), run(&by_global));
            for i in 0..12 {
                if global_rows.contains(&i) {
                    assert!(gap(row(&sep, i), row(&def, i)) < 1e-5, "{what}: global row {i}");
                    assert!(gap(row(&sep, i), row(&sh, i)) > 1e-3, "{what}: global row {i} unchanged");
                } else {
                    assert_eq!(gap(row(&sep, i), row(&sh, i)), 0.0, "{what}: row {i}");
                }
            }
        }
    }
}

/// With nothing but softmax on the scores, a global row is folded through the global projections
/// (no K_g, V_g at every position): its output, the input's gradient and the global projection's
/// gradient equal the definition's, causal and bidirectional, grouped-query heads; with padding
/// the rows are not folded and still hide the padded keys.
#[test]
fn folded_global_rows_equal_the_definition_with_gradients() {
    let dev = Device::flex().autodiff();
    let none = PositionConfig::None(Default::default());
    for n_kv_heads in [Some(2), None] {
        let cfg = LongformerConfig { window: 3, block: Some(2), global: vec![0, 5], n_kv_heads, ..Default::default() };
        let attn = longformer(&cfg, &none, &dev);
        let x: Tensor<3> = Tensor::random([2, 11, D], Distribution::Normal(0.0, 1.0), &dev);
        let w: Tensor<3> = Tensor::random([2, 11, D], Distribution::Normal(0.0, 1.0), &dev);
        // the second row's last three positions are padding: the global rows must not read them
        let pad: Vec<bool> = (0..2 * 11).map(|t| t >= 11 + 8).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, 11]), &dev);
        let padded = AttentionMask::bidirectional().with_padding(pad);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional(), padded] {
            let run = |dense: bool| {
                let x = x.clone().require_grad();
                let y = attn.forward_with(AttentionInput::self_attention(x.clone(), &mask), None, dense).context;
                let grads = (y.clone() * w.clone()).sum().backward();
                let dg = attn.global_qkv.as_ref().unwrap().qkv.weight.grad(&grads).unwrap();
                (y, x.grad(&grads).unwrap(), dg)
            };
            let before = variorum_attention::folds_run();
            let (y1, dx1, dg1) = run(false);
            let folded = variorum_attention::folds_run() - before;
            let (y2, dx2, dg2) = run(true);
            let gap = |a: Tensor<3>, b: Tensor<3>| (a - b).abs().max().into_scalar::<f32>();
            let what = format!("kv heads {n_kv_heads:?}, causal {}, padding {}", mask.causal, mask.padding.is_some());
            assert_eq!(folded, usize::from(mask.padding.is_none()), "{what}: the rows folded where they may");
            assert!(gap(y1, y2) < 1e-5, "{what}: output");
            assert!(gap(dx1, dx2) < 1e-4, "{what}: input gradient");
            assert!(gap(dg1.unsqueeze(), dg2.unsqueeze()) < 1e-4, "{what}: global projection gradient");
        }
    }
}
