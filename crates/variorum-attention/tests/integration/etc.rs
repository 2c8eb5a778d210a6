//! ETC's global–local attention equals full attention over [global tokens; long tokens] under
//! the four pieces' masks (g2g, g2l, l2g, l2l), causal and bidirectional, for lengths that do and
//! do not end a segment.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use common::D;
use variorum_attention::{AttentionInput, AttentionKind, EtcConfig, Positioning};
use variorum_core::{AttentionMask, GlobalLocal};
use variorum_position::PositionConfig;

/// `true` where row `i` must not see column `j` of the concatenated sequence.
fn hidden(i: usize, j: usize, globals: usize, window: usize, segment: usize, causal: bool) -> bool {
    let visible = match (i < globals, j < globals) {
        // g2g
        (true, true) => !causal || j <= i,
        // g2l: the own segment
        (true, false) => (j - globals) / segment == i,
        // l2g: completed segments (causal)
        (false, true) => !causal || (j + 1) * segment <= i - globals,
        // l2l: the window
        (false, false) => {
            let d = (i - globals) as i64 - (j - globals) as i64;
            d < window as i64 && (if causal { d >= 0 } else { -d < window as i64 })
        }
    };
    !visible
}

#[test]
fn global_local_pieces_equal_masked_full_attention() {
    let dev = Device::flex();
    for (window, segment, kv) in [(2, 3, 4), (3, 4, 2), (1, 2, 1)] {
        let cfg = EtcConfig { window, segment, block: Some(2), n_kv_heads: Some(kv), ..Default::default() };
        cfg.validate(D).unwrap();
        let etc =
            cfg.init(D, 0.3, 0.3, Positioning { config: &PositionConfig::None(Default::default()), context: 64 }, &dev);
        for len in [7, 9, 12] {
            for causal in [true, false] {
                let globals = if causal { (len - 1) / segment } else { len.div_ceil(segment) };
                let x: Tensor<3> = Tensor::random([2, globals + len, D], Distribution::Normal(0.0, 1.0), &dev);
                let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                let mask = AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), ..base };
                let got = etc.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let n = globals + len;
                let m: Vec<bool> =
                    (0..n).flat_map(|i| (0..n).map(move |j| hidden(i, j, globals, window, segment, causal))).collect();
                let custom = Tensor::<2, Bool>::from_data(TensorData::new(m, [n, n]), &dev).unsqueeze::<3>();
                let dense_mask = AttentionMask::bidirectional().with_custom(custom);
                let want = etc.attention.forward(AttentionInput::self_attention(x, &dense_mask), None).context;
                let d = (got - want).abs().max().into_scalar::<f32>();
                assert!(d < 1e-5, "window {window} segment {segment} len {len} causal {causal}: {d}");
            }
        }
    }
}

/// ETC's relative labels on the global pieces (`global_positions = k`, the released code's):
/// g2g the clipped distance between segments, l2g own or other segment, g2l own; the l2l piece
/// none here (no position scheme).
fn label(i: usize, j: usize, globals: usize, segment: usize, k: i64) -> Option<usize> {
    match (i < globals, j < globals) {
        (true, true) => Some(((j as i64 - i as i64).clamp(-k, k) + k) as usize),
        (false, true) => Some(if (i - globals) / segment == j { 2 * k as usize + 1 } else { 2 * k as usize + 2 }),
        (true, false) => Some(2 * k as usize + 3),
        (false, false) => None,
    }
}

/// With global positions, the layer is full attention over [global; long] under the pieces'
/// masks plus q_i·a_{label(i, j)}/√d_h on every global piece, written out here: scores by
/// hand, one masked softmax per row.
#[test]
fn global_relative_positions_add_their_labels_key_vectors_to_the_scores() {
    let dev = Device::flex();
    for (window, segment, k) in [(2, 3, 1), (3, 2, 2)] {
        let cfg =
            EtcConfig { window, segment, block: Some(2), n_heads: 2, global_positions: Some(k), ..Default::default() };
        cfg.validate(D).unwrap();
        let etc =
            cfg.init(D, 0.3, 0.3, Positioning { config: &PositionConfig::None(Default::default()), context: 64 }, &dev);
        let a = etc.global_relative.as_ref().expect("label vectors").val();
        assert_eq!(a.dims(), [2 * k + 4, D / 2]);
        for (len, causal) in [(9, true), (10, false), (12, true)] {
            let globals = if causal { (len - 1) / segment } else { len.div_ceil(segment) };
            let n = globals + len;
            let x: Tensor<3> = Tensor::random([1, n, D], Distribution::Normal(0.0, 1.0), &dev);
            let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let mask = AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), ..base };
            let got = etc.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            // by hand, per head: q·kᵀ/√d + q·a/√d, hidden keys out, softmax, times v
            let (q, kk, v) = etc.attention.qkv.self_attention(x);
            let scale = 1.0 / ((D / 2) as f64).sqrt();
            let mut heads = Vec::new();
            for hd in 0..2 {
                let pick = |t: &Tensor<4>| t.clone().narrow(1, hd, 1).reshape([n, D / 2]);
                let (qh, kh, vh) = (pick(&q).mul_scalar(scale), pick(&kk), pick(&v));
                let content = qh.clone().matmul(kh.transpose()).into_data().try_to_vec::<f32>().unwrap();
                let qa = qh.matmul(a.clone().transpose()).into_data().try_to_vec::<f32>().unwrap();
                let mut scores = vec![0.0f32; n * n];
                for i in 0..n {
                    for j in 0..n {
                        scores[i * n + j] = if hidden(i, j, globals, window, segment, causal) {
                            -1e9
                        } else {
                            let pos =
                                label(i, j, globals, segment, k as i64).map_or(0.0, |id| qa[i * (2 * k + 4) + id]);
                            content[i * n + j] + pos
                        };
                    }
                }
                let scores = Tensor::<2>::from_data(TensorData::new(scores, [n, n]), &dev);
                heads.push(burn::tensor::activation::softmax(scores, 1).matmul(vh).reshape([1, 1, n, D / 2]));
            }
            let want = etc.attention.merge(Tensor::cat(heads, 1));
            let d = (got - want).abs().max().into_scalar::<f32>();
            assert!(d < 1e-5, "window {window} segment {segment} k {k} len {len} causal {causal}: {d}");
        }
    }
}
