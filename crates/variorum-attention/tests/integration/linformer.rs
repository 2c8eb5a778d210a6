//! Linformer against its equation head_i = softmax(Q_i (E K_i)ᵀ/√d)(F V_i), written per batch row
//! and head with 2-D matrices: identity projections give full attention, shorter sequences equal
//! zero-padded keys and values, padding keys equal a shorter sequence, configs are checked; the
//! paper's general projections (mean and max pooling, a convolution with kernel and stride n/k)
//! against windows written out by hand, and its non-uniform k per layer.

use crate::common;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{
    Attention, AttentionConfig, AttentionInput, AttentionKind, LinformerAttention, LinformerConfig,
    LinformerProjection, LinformerShare, Positioning,
};
use variorum_core::AttentionMask;

const D: usize = 16;
const SHARES: [LinformerShare; 3] = [LinformerShare::None, LinformerShare::Headwise, LinformerShare::KeyValue];

fn config(max_len: usize, k: usize, share: LinformerShare) -> LinformerConfig {
    LinformerConfig { n_heads: 2, max_len, k, share, ..Default::default() }
}

fn layer(max_len: usize, k: usize, share: LinformerShare, dev: &Device) -> LinformerAttention {
    let cfg = config(max_len, k, share);
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, dev)
}

fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
}

fn run(attn: &LinformerAttention, x: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
    attn.forward(AttentionInput::self_attention(x, mask), None).context
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

/// The equation per batch row and head, with the first `len_k` columns of E and F.
fn reference(attn: &LinformerAttention, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let [b, h, lq, dh] = q.dims();
    let lk = k.dims()[2];
    let e = attn.e.as_ref().expect("a learned E").val();
    let f = attn.f.as_ref().map(|f| f.val()).unwrap_or_else(|| e.clone());
    let [rows, kk, n] = e.dims();
    let mut out = Vec::new();
    for bi in 0..b {
        for hi in 0..h {
            let pick = |t: &Tensor<4>, len| t.clone().narrow(0, bi, 1).narrow(1, hi, 1).reshape([len, dh]);
            let proj = |p: &Tensor<3>| p.clone().narrow(0, if rows == 1 { 0 } else { hi }, 1).reshape([kk, n]);
            let (e2, f2) = (proj(&e).narrow(1, 0, lk), proj(&f).narrow(1, 0, lk));
            let scores = pick(&q, lq).matmul(e2.matmul(pick(&k, lk)).transpose()).div_scalar((dh as f64).sqrt());
            out.push(softmax(scores, 1).matmul(f2.matmul(pick(&v, lk))).reshape([1, 1, lq, dh]));
        }
    }
    Tensor::cat(out, 0).reshape([b, h, lq, dh])
}

/// `[b, h, len, d]` with `pad` zero rows appended along the length.
fn zero_pad(x: Tensor<4>, pad: usize) -> Tensor<4> {
    let [b, h, _, d] = x.dims();
    Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, pad, d], &x.device())], 2)
}

#[test]
fn identity_projections_with_k_equal_n_equal_l_are_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(11);
    for share in SHARES {
        let mut attn = layer(7, 7, share, &dev);
        let rows = attn.e.as_ref().unwrap().val().dims()[0];
        assert_eq!(rows, if share == LinformerShare::None { 2 } else { 1 }, "{share:?}");
        assert_eq!(attn.f.is_none(), share == LinformerShare::KeyValue, "{share:?}");
        let eye = Tensor::<2>::eye(7, &dev).unsqueeze_dim::<3>(0).repeat_dim(0, rows);
        attn.e = Some(Param::from_tensor(eye.clone()));
        attn.f = attn.f.take().map(|_| Param::from_tensor(eye));
        let x = random([2, 7, D], &dev);
        let got = run(&attn, x.clone(), &AttentionMask::bidirectional());
        let (q, k, v) = attn.proj.split(x, None);
        let full = softmax(q.matmul(k.swap_dims(2, 3)).div_scalar((D as f64 / 2.0).sqrt()), 3).matmul(v);
        let d = max_diff(got, attn.proj.merge(full));
        assert!(d < 1e-5, "{share:?}: {d}");
    }
}

#[test]
fn random_projections_follow_the_equation() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(12);
    for share in SHARES {
        let mut attn = layer(9, 4, share, &dev);
        // well away from the initial scale, so that a wrong column or head would show
        let rows = attn.e.as_ref().unwrap().val().dims()[0];
        attn.e = Some(Param::from_tensor(Tensor::random([rows, 4, 9], Distribution::Normal(0.0, 0.5), &dev)));
        let fresh = Tensor::random([rows, 4, 9], Distribution::Normal(0.0, 0.5), &dev);
        attn.f = attn.f.take().map(|_| Param::from_tensor(fresh));
        let x = random([2, 9, D], &dev);
        let got = run(&attn, x.clone(), &AttentionMask::bidirectional());
        let (q, k, v) = attn.proj.split(x, None);
        let d = max_diff(got, attn.proj.merge(reference(&attn, q, k, v)));
        assert!(d < 1e-5, "{share:?}: {d}");
    }
}

#[test]
fn a_shorter_sequence_equals_zero_padded_keys_and_values() {
    // L = 5 < n = 9: E[:, :5] K = E [K; 0]; the same holds through a padding mask on a longer input
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(13);
    for share in SHARES {
        let attn = layer(9, 4, share, &dev);
        let x = random([2, 9, D], &dev);
        let short = x.clone().narrow(1, 0, 5);
        let got = run(&attn, short.clone(), &AttentionMask::bidirectional());
        let (q, k, v) = attn.proj.split(short, None);
        let want = attn.proj.merge(reference(&attn, q, zero_pad(k, 4), zero_pad(v, 4)));
        let d = max_diff(got.clone(), want);
        assert!(d < 1e-5, "{share:?}: {d}");
        let pad: Vec<bool> = (0..2).flat_map(|_| (0..9).map(|i| i >= 5)).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, 9]), &dev);
        let masked = run(&attn, x, &AttentionMask::bidirectional().with_padding(pad)).narrow(1, 0, 5);
        let d = max_diff(got, masked);
        assert!(d < 1e-5, "{share:?} with padding: {d}");
    }
}

#[test]
fn cross_attention_projects_the_source() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(14);
    let attn = layer(8, 3, LinformerShare::None, &dev);
    let (x, src) = (random([2, 11, D], &dev), random([2, 6, D], &dev));
    let mask = AttentionMask::bidirectional();
    let got = attn.forward(AttentionInput::cross_attention(x.clone(), src.clone(), &mask), None).context;
    assert_eq!(got.dims(), [2, 11, D]);
    let (q, k, v) = attn.proj.split(x, Some(src));
    let d = max_diff(got, attn.proj.merge(reference(&attn, q, k, v)));
    assert!(d < 1e-5, "{d}");
}

#[test]
fn configs_are_checked() {
    let err = |c: LinformerConfig| c.validate(D).unwrap_err().to_string();
    assert!(err(LinformerConfig::default()).contains("model.attention.max_len"));
    assert!(err(config(8, 0, LinformerShare::Headwise)).contains("model.attention.k"));
    assert!(err(config(8, 9, LinformerShare::Headwise)).contains("model.attention.max_len"));
    assert!(err(LinformerConfig { dropout: 1.0, ..config(8, 4, LinformerShare::None) }).contains("dropout"));
    assert!(err(LinformerConfig { n_heads: 3, ..config(8, 4, LinformerShare::None) }).contains("n_heads"));
    assert!(config(8, 8, LinformerShare::KeyValue).validate(D).is_ok());
    let cfg = config(8, 4, LinformerShare::Headwise);
    assert!(cfg.validate_len(8).is_ok());
    let msg = cfg.validate_len(9).unwrap_err().to_string();
    assert!(msg.contains("model.attention.max_len") && msg.contains("model.seq_len"), "{msg}");
    let axis = AttentionConfig::Linformer(cfg);
    assert!(axis.validate_len(9).is_err() && axis.validate_len(3).is_ok());
    assert!(AttentionConfig::default().validate_len(100_000).is_ok());
    let caps = axis.capabilities();
    assert!(!caps.causal && caps.bidirectional && !caps.incremental && !caps.variable_length);
}

#[test]
fn the_toml_names_parse() {
    let cfg: AttentionConfig =
        toml::from_str("kind = \"linformer\"\nmax_len = 64\nk = 16\nshare = \"key-value\"").unwrap();
    assert_eq!(
        cfg,
        AttentionConfig::Linformer(LinformerConfig {
            max_len: 64,
            k: 16,
            share: LinformerShare::KeyValue,
            ..Default::default()
        })
    );
    assert!(toml::from_str::<AttentionConfig>("kind = \"linformer\"\nshare = \"layerwise\"").is_err());
}

#[test]
fn the_axis_builds_it_and_gradients_reach_e_and_f() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    dev.seed(15);
    let cfg = AttentionConfig::Linformer(config(10, 4, LinformerShare::None));
    cfg.validate(D).unwrap();
    let attn = cfg.init(D, 0.3, 0.3, Positioning::NONE, &dev);
    let x = random([2, 10, D], &dev);
    let mask = AttentionMask::bidirectional();
    let out = attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    assert_eq!(out.dims(), [2, 10, D]);
    let grads = out.powf_scalar(2.0).sum().backward();
    let Attention::Linformer(l) = &attn else { panic!("built {}", cfg.kind()) };
    for p in [l.e.as_ref().unwrap(), l.f.as_ref().unwrap()] {
        let g = p.val().grad(&grads).expect("a gradient");
        assert!(g.abs().max().into_scalar::<f32>() > 0.0);
    }
}

/// A layer projecting by `projection` over n = 12 in windows of s = 3 (k = 4).
fn general(projection: LinformerProjection, share: LinformerShare, dev: &Device) -> LinformerAttention {
    let cfg = LinformerConfig { n_heads: 2, max_len: 12, k: 4, share, projection, ..Default::default() };
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, dev)
}

/// The general projections per batch row and head, window by window with 2-D matrices: the
/// keys and values of positions js … js + s − 1 (those below `len` and not in `padded`) become
/// one by their mean, their maximum, or Σ_i k_{js+i} W_i; softmax over the windows holding a
/// real position.
fn general_reference(
    attn: &LinformerAttention,
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    padded: &[usize],
) -> Tensor<4> {
    let [b, h, lq, dh] = q.dims();
    let lk = k.dims()[2];
    let s = attn.window;
    let mut out = Vec::new();
    for bi in 0..b {
        for hi in 0..h {
            let pick = |t: &Tensor<4>, len| t.clone().narrow(0, bi, 1).narrow(1, hi, 1).reshape([len, dh]);
            let (kk, vv) = (pick(&k, lk), pick(&v, lk));
            let weights = |p: &Option<Param<Tensor<3>>>| {
                p.as_ref().map(|w| {
                    let w = w.val();
                    let row = if w.dims()[0] == 1 { 0 } else { hi };
                    w.narrow(0, row, 1).reshape([s * dh, dh])
                })
            };
            let (we, wf) = (weights(&attn.e), weights(&attn.f).or_else(|| weights(&attn.e)));
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for j in 0..lk.div_ceil(s) {
                let real: Vec<usize> = (j * s..(j * s + s).min(lk)).filter(|i| !padded.contains(i)).collect();
                if real.is_empty() {
                    continue;
                }
                let one = |x: &Tensor<2>, w: &Option<Tensor<2>>| -> Tensor<2> {
                    match attn.projection {
                        LinformerProjection::MeanPool => {
                            let rows: Vec<Tensor<2>> = real.iter().map(|&i| x.clone().narrow(0, i, 1)).collect();
                            Tensor::cat(rows, 0).mean_dim(0)
                        }
                        LinformerProjection::MaxPool => {
                            let rows: Vec<Tensor<2>> = real.iter().map(|&i| x.clone().narrow(0, i, 1)).collect();
                            Tensor::cat(rows, 0).max_dim(0)
                        }
                        _ => {
                            let w = w.clone().unwrap();
                            let mut acc = Tensor::<2>::zeros([1, dh], &x.device());
                            for i in 0..s {
                                let p = j * s + i;
                                if p < lk && !padded.contains(&p) {
                                    acc = acc + x.clone().narrow(0, p, 1).matmul(w.clone().narrow(0, i * dh, dh));
                                }
                            }
                            acc
                        }
                    }
                };
                keys.push(one(&kk, &we));
                values.push(one(&vv, &wf));
            }
            let (kp, vp) = (Tensor::cat(keys, 0), Tensor::cat(values, 0));
            let scores = pick(&q, lq).matmul(kp.transpose()).div_scalar((dh as f64).sqrt());
            out.push(softmax(scores, 1).matmul(vp).reshape([1, 1, lq, dh]));
        }
    }
    Tensor::cat(out, 0).reshape([b, h, lq, dh])
}

const GENERAL: [(LinformerProjection, LinformerShare); 5] = [
    (LinformerProjection::MeanPool, LinformerShare::Headwise),
    (LinformerProjection::MaxPool, LinformerShare::Headwise),
    (LinformerProjection::Conv, LinformerShare::Headwise),
    (LinformerProjection::Conv, LinformerShare::None),
    (LinformerProjection::Conv, LinformerShare::KeyValue),
];

#[test]
fn pooling_and_convolution_follow_their_windows_written_by_hand() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(16);
    for (projection, share) in GENERAL {
        let attn = general(projection, share, &dev);
        assert_eq!(attn.window, 3);
        let params = [attn.e.is_some(), attn.f.is_some()];
        let want = match (projection, share) {
            (LinformerProjection::Conv, LinformerShare::KeyValue) => [true, false],
            (LinformerProjection::Conv, _) => [true, true],
            _ => [false, false],
        };
        assert_eq!(params, want, "{projection:?} {share:?}");
        // the full length (4 windows), a partial last window (L = 10: ⌈10/3⌉ = 4, the last of one
        // position) and one of two positions (L = 8)
        for len in [12, 10, 8] {
            let x = random([2, len, D], &dev);
            let got = run(&attn, x.clone(), &AttentionMask::bidirectional());
            let qkv = attn.proj.split(x, None);
            let d = max_diff(got, attn.proj.merge(general_reference(&attn, qkv, &[])));
            assert!(d < 1e-5, "{projection:?} {share:?} L = {len}: {d}");
        }
    }
}

#[test]
fn a_padded_tail_equals_the_shorter_sequence_under_every_projection() {
    // padding from position 7 of 12: window 2 (positions 6, 7, 8) keeps one real key, window 3
    // none (hidden from the softmax)
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(17);
    for (projection, share) in GENERAL {
        let attn = general(projection, share, &dev);
        let x = random([2, 12, D], &dev);
        let short = run(&attn, x.clone().narrow(1, 0, 7), &AttentionMask::bidirectional());
        let pad: Vec<bool> = (0..2).flat_map(|_| (0..12).map(|i| i >= 7)).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, 12]), &dev);
        let masked = run(&attn, x.clone(), &AttentionMask::bidirectional().with_padding(pad)).narrow(1, 0, 7);
        let d = max_diff(short, masked.clone());
        assert!(d < 1e-5, "{projection:?} {share:?}: {d}");
        // and both are the hand-written windows over the real keys
        let qkv = attn.proj.split(x, None);
        let padded: Vec<usize> = (7..12).collect();
        let want = attn.proj.merge(general_reference(&attn, qkv, &padded)).narrow(1, 0, 7);
        let d = max_diff(masked, want);
        assert!(d < 1e-5, "{projection:?} {share:?} by hand: {d}");
    }
}

#[test]
fn each_layer_takes_its_own_k() {
    let dev = Device::flex();
    for projection in [LinformerProjection::Learned, LinformerProjection::Conv, LinformerProjection::MeanPool] {
        let cfg = LinformerConfig { max_len: 12, k: 6, layer_k: vec![6, 3, 2], projection, ..Default::default() };
        cfg.validate(D).unwrap();
        assert_eq!(cfg.per_layer(), 3);
        let layers: Vec<LinformerAttention> = (0..3).map(|i| cfg.for_layer(i).init(D, 0.3, 0.3, &dev)).collect();
        // k' = n / s projected keys: windows of 2, 4 and 6 positions
        assert_eq!(layers.iter().map(|l| l.window).collect::<Vec<_>>(), [2, 4, 6], "{projection:?}");
        if projection == LinformerProjection::Learned {
            let rows: Vec<usize> = layers.iter().map(|l| l.e.as_ref().unwrap().val().dims()[1]).collect();
            assert_eq!(rows, [6, 3, 2]);
        }
        let flops: Vec<u64> = (0..3).map(|i| cfg.for_layer(i).flops_per_token(D, 12)).collect();
        assert!(flops[0] > flops[1] && flops[1] > flops[2], "{projection:?}: {flops:?}");
    }
}

#[test]
fn general_projections_that_cannot_work_are_refused() {
    let err = |c: LinformerConfig| c.validate(D).unwrap_err().to_string();
    let base = LinformerConfig { max_len: 12, k: 4, ..Default::default() };
    let conv = LinformerConfig { projection: LinformerProjection::Conv, ..base.clone() };
    let e = err(LinformerConfig { k: 5, ..conv.clone() });
    assert!(e.contains("model.attention.k = 5 must divide model.attention.max_len = 12"), "{e}");
    let e = err(LinformerConfig { layer_k: vec![4, 5], ..conv.clone() });
    assert!(e.contains("model.attention.layer_k = 5 must divide"), "{e}");
    let e = err(LinformerConfig { layer_k: vec![4, 0], ..base.clone() });
    assert!(e.contains("model.attention.layer_k must be at least 1"), "{e}");
    let e = err(LinformerConfig { layer_k: vec![13], ..base.clone() });
    assert!(e.contains("layer_k = 13 must be at most"), "{e}");
    let pool =
        LinformerConfig { projection: LinformerProjection::MaxPool, share: LinformerShare::None, ..base.clone() };
    assert!(err(pool).contains("no parameters to share"));
    // the learned E takes any k ≤ n
    assert!(LinformerConfig { k: 5, ..base.clone() }.validate(D).is_ok());
    let cfg: AttentionConfig =
        toml::from_str("kind = \"linformer\"\nmax_len = 64\nk = 16\nprojection = \"max-pool\"\nlayer_k = [16, 8]")
            .unwrap();
    let AttentionConfig::Linformer(l) = cfg else { panic!() };
    assert_eq!((l.projection, l.layer_k), (LinformerProjection::MaxPool, vec![16, 8]));
}
