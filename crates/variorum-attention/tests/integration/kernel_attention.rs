//! The kernelised kinds (linear, performer, rfa, average): the recurrent form decodes what the
//! parallel form computes, and random features converge to the softmax attention they estimate.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{Attention, AttentionConfig, AttentionInput, AttentionState, Positioning};
use variorum_attention::{Features, KernelState, MIN_NORMALISER, kernel_bidirectional};
use variorum_core::AttentionMask;

// the lock every test of this binary that seeds the process-wide generator holds (a lock of
// its own here let these tests draw while others had seeded it)
use crate::common::seeded;

fn kinds() -> Vec<AttentionConfig> {
    kinds_in_chunks(3)
}

fn kinds_in_chunks(chunk: usize) -> Vec<AttentionConfig> {
    let toml = [
        r#"kind = "linear""#,
        r#"kind = "performer""#,
        "kind = \"performer\"\nkernel = \"relu\"",
        // enough frequencies that the sine/cosine normaliser stays well away from 0
        "kind = \"rfa\"\nfeatures = 64",
        "kind = \"rfa\"\nfeatures = 64\ngate = true",
        r#"kind = "average""#,
    ];
    toml.iter().map(|t| toml::from_str(&format!("{t}\nchunk = {chunk}")).unwrap()).collect()
}

fn build(cfg: &AttentionConfig, dev: &Device) -> Attention {
    cfg.validate(16).unwrap();
    cfg.init(16, 0.3, 0.3, Positioning::NONE, dev)
}

#[test]
fn token_by_token_decoding_equals_the_parallel_forward() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(5);
    for cfg in kinds() {
        let attn = build(&cfg, &dev);
        let x: Tensor<3> = Tensor::random([2, 10, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let full = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let mut state = AttentionState::default();
        let mut parts = Vec::new();
        // a 4-token prompt, then one token at a time
        for (s, n) in [(0, 4), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)] {
            let m = AttentionMask::causal().at(s, 0);
            let out = attn.forward(AttentionInput::self_attention(x.clone().narrow(1, s, n), &m), Some(&mut state));
            parts.push(out.context);
        }
        let d = (full - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>();
        assert!(d < 1e-4, "{cfg:?}: {d}");
        // the state does not grow with the context: one [features, d_v + 1] matrix per head
        let Some(Some(s)) = state.get::<Option<KernelState>>() else { panic!("{cfg:?}: no recurrent state") };
        assert_eq!(s.s.dims()[0..2], [2, if cfg.kind() == "average" { 1 } else { 4 }]);
    }
}

#[test]
fn causal_outputs_ignore_later_tokens_and_bidirectional_ones_do_not() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(6);
    for cfg in kinds() {
        let attn = build(&cfg, &dev);
        let x: Tensor<3> = Tensor::random([1, 8, 16], Distribution::Normal(0.0, 1.0), &dev);
        let later = Tensor::random([1, 2, 16], Distribution::Normal(0.0, 1.0), &dev);
        let y = x.clone().slice_assign([0..1, 6..8, 0..16], later.clone());
        let run = |m: &AttentionMask, x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, m), None).context;
        let causal = AttentionMask::causal();
        // bit-identical, also when a later key's exponents lie far above the earlier ones (a
        // stabiliser taken over every key would underflow the early ones)
        let z = x.clone().slice_assign([0..1, 6..8, 0..16], later.mul_scalar(40.0));
        let before = run(&causal, x.clone()).narrow(1, 0, 6).into_data();
        for other in [y.clone(), z] {
            let after = run(&causal, other).narrow(1, 0, 6).into_data();
            assert_eq!(before, after, "{cfg:?} lets the future into the past");
        }
        let open = AttentionMask::bidirectional();
        let d = (run(&open, x) - run(&open, y)).narrow(1, 0, 6).abs().max().into_scalar::<f32>();
        assert!(d > 1e-4, "{cfg:?}: bidirectional outputs must see later tokens");
    }
}

/// Mean |approx − exact| of the attention outputs over a few draws of W.
fn mean_error(kind: &str, features: usize, dev: &Device) -> f64 {
    let (h, l, d) = (2, 24, 16);
    let mut total = 0.0;
    let draws = 6;
    for _ in 0..draws {
        let q: Tensor<4> = Tensor::random([1, h, l, d], Distribution::Normal(0.0, 0.5), dev);
        let k: Tensor<4> = Tensor::random([1, h, l, d], Distribution::Normal(0.0, 0.5), dev);
        let v: Tensor<4> = Tensor::random([1, h, l, d], Distribution::Normal(0.0, 1.0), dev);
        let (approx, exact) = match kind {
            "performer" => {
                let cfg: AttentionConfig =
                    toml::from_str(&format!("kind = \"performer\"\nn_heads = {h}\nfeatures = {features}")).unwrap();
                let Attention::Performer(p) = cfg.init(h * d, 0.02, 0.02, Positioning::NONE, dev) else {
                    unreachable!()
                };
                let (fq, fk, shift) = p.features(q.clone(), k.clone());
                let f = Features {
                    q: fq,
                    k: fk,
                    v: v.clone(),
                    k_shift: Some(shift),
                    gate: None,
                    rescale: false,
                    min_normaliser: 1e-30,
                };
                let exact = softmax(q.matmul(k.swap_dims(2, 3)).div_scalar((d as f64).sqrt()), 3).matmul(v);
                (kernel_bidirectional(f), exact)
            }
            _ => {
                let sigma = 0.7;
                let cfg: AttentionConfig =
                    toml::from_str(&format!("kind = \"rfa\"\nn_heads = {h}\nfeatures = {features}\nsigma = {sigma}"))
                        .unwrap();
                let Attention::Rfa(r) = cfg.init(h * d, 0.02, 0.02, Positioning::NONE, dev) else { unreachable!() };
                let f = Features {
                    q: r.features(q.clone()),
                    k: r.features(k.clone()),
                    v: v.clone(),
                    k_shift: None,
                    gate: None,
                    rescale: false,
                    min_normaliser: MIN_NORMALISER,
                };
                let unit = |x: Tensor<4>| x.clone() / x.powf_scalar(2.0).sum_dim(3).sqrt();
                let scores = unit(q).matmul(unit(k).swap_dims(2, 3)).div_scalar(sigma * sigma);
                (kernel_bidirectional(f), softmax(scores, 3).matmul(v))
            }
        };
        total += (approx - exact).abs().mean().into_scalar::<f32>() as f64;
    }
    total / draws as f64
}

#[test]
fn random_features_converge_to_softmax_attention() {
    let _guard = seeded();
    let dev = Device::flex();
    for kind in ["performer", "rfa"] {
        dev.seed(7);
        let errors: Vec<f64> = [16, 64, 256].iter().map(|&m| mean_error(kind, m, &dev)).collect();
        assert!(errors[0] > errors[1] && errors[1] > errors[2], "{kind}: {errors:?}");
        assert!(errors[2] < 0.5 * errors[0], "{kind}: 16 → 256 features must at least halve the error: {errors:?}");
    }
}

#[test]
fn redrawing_changes_the_features_but_not_their_parameter() {
    let _guard = seeded();
    let dev = Device::flex();
    let cfg: AttentionConfig = toml::from_str("kind = \"performer\"").unwrap();
    let Attention::Performer(mut p) = build(&cfg, &dev) else { unreachable!() };
    let (id, before) = (p.projection.id, p.projection.val());
    p.redraw();
    assert_eq!(p.projection.id, id);
    assert!((p.projection.val() - before).abs().max().into_scalar::<f32>() > 1e-3);
}

#[test]
fn random_features_are_redrawn_every_redraw_interval_optimizer_steps() {
    let _guard = seeded();
    let dev = Device::flex();
    for kind in ["performer", "rfa"] {
        let cfg: AttentionConfig = toml::from_str(&format!("kind = \"{kind}\"\nredraw_interval = 3")).unwrap();
        let mut attn = build(&cfg, &dev);
        let w = |a: &Attention| match a {
            Attention::Performer(p) => p.projection.val(),
            Attention::Rfa(r) => r.projection.val(),
            _ => unreachable!(),
        };
        let moved = |a: Tensor<2>, b: Tensor<2>| (a - b).abs().max().into_scalar::<f32>() > 1e-3;
        let start = w(&attn);
        for step in [1, 2] {
            attn.after_optimizer_step(step);
            assert!(!moved(w(&attn), start.clone()), "{kind}: redrawn after step {step}");
        }
        attn.after_optimizer_step(3);
        assert!(moved(w(&attn), start), "{kind}: not redrawn after step 3");
    }
    // RFA's default: every step (the paper resamples during training); interval 0: never
    for (interval, redrawn) in [("", true), ("redraw_interval = 0", false)] {
        let cfg: AttentionConfig = toml::from_str(&format!("kind = \"rfa\"\n{interval}")).unwrap();
        let Attention::Rfa(mut r) = build(&cfg, &dev) else { unreachable!() };
        for step in 1..5 {
            let before = r.projection.val();
            variorum_attention::AttentionMechanism::after_optimizer_step(&mut r, step);
            let moved = (r.projection.val() - before).abs().max().into_scalar::<f32>() > 0.0;
            assert_eq!(moved, redrawn, "'{interval}', step {step}");
        }
    }
}

/// RFA's paper form: a learned frequency scale per head and dimension, starting at 1/σ and
/// trained by the loss, and one draw of ε per head; the fixed form shares one W = ε/σ.
#[test]
fn rfa_learns_the_frequency_scale_and_draws_per_head() {
    let _guard = seeded();
    let ad = Device::flex().autodiff();
    let (h, d) = (2, 8);
    let cfg = |extra: &str| -> AttentionConfig {
        toml::from_str(&format!("kind = \"rfa\"\nn_heads = {h}\nsigma = 0.5\nfeatures = 16\n{extra}")).unwrap()
    };
    let Attention::Rfa(r) = cfg("").init(h * d, 0.02, 0.02, Positioning::NONE, &ad) else { unreachable!() };
    let scale = r.frequency_scale.clone().expect("learned by default");
    assert_eq!(scale.val().dims(), [h, d]);
    assert_eq!(scale.val().into_data().try_to_vec::<f32>().unwrap(), vec![2.0; h * d]);
    assert_eq!(r.projection.val().dims(), [h * 16, d]);
    // one vector in both heads: different features per head
    let x = Tensor::<4>::random([1, 1, 3, d], Distribution::Normal(0.0, 1.0), &ad).repeat_dim(1, h);
    let per_head = |r: &variorum_attention::RfaAttention| {
        let f = r.features(x.clone());
        (f.clone().narrow(1, 0, 1) - f.narrow(1, 1, 1)).abs().max().into_scalar::<f32>()
    };
    assert!(per_head(&r) > 1e-3);
    // the loss reaches the scale (Σ φ, not Σ φ²: sin² + cos² = 1 whatever the scale)
    let grads = r.features(x.clone()).sum().backward();
    let g = scale.val().grad(&grads).expect("a gradient for the frequency scale");
    assert!(g.abs().sum().into_scalar::<f32>() > 0.0);

    let fixed = "learn_sigma = false\nshared_features = true";
    let Attention::Rfa(f) = cfg(fixed).init(h * d, 0.02, 0.02, Positioning::NONE, &ad) else { unreachable!() };
    assert!(f.frequency_scale.is_none());
    assert_eq!(f.projection.val().dims(), [16, d]);
    assert_eq!(per_head(&f), 0.0);
}

/// max |a − b| relative to the largest |b| (when that exceeds 10⁻³).
fn rel_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-3);
    (a - b).abs().max().into_scalar::<f32>() / scale
}

#[test]
fn the_fused_kernel_and_the_composed_chunks_agree_with_their_gradients() {
    // several chunks of 16 with a short last one; linear, performer and rfa read the packed
    // projection with φ inside the kernel, average hands its features over
    let _guard = seeded();
    let dev = Device::flex().autodiff();
    dev.seed(6);
    let x0: Tensor<3> = Tensor::random([2, 75, 16], Distribution::Normal(0.0, 1.0), &dev);
    let w: Tensor<3> = Tensor::random([2, 75, 16], Distribution::Normal(0.0, 1.0), &dev);
    // (RFA learns its frequencies' scale by default: W's gradient is held too)
    for cfg in kinds_in_chunks(16) {
        let attn = build(&cfg, &dev);
        let run = |kernels: bool| {
            let f = || {
                let x = x0.clone().require_grad();
                let y = attn.forward(AttentionInput::self_attention(x.clone(), &AttentionMask::causal()), None).context;
                let grads = (y.clone() * w.clone()).sum().backward();
                let mut visitor = common::ParamGrads::new(&grads);
                attn.visit(&mut visitor);
                (y, x.grad(&grads).unwrap(), visitor.grads())
            };
            if kernels { f() } else { variorum_kernels::without_kernels(f) }
        };
        let (before, packed) =
            (variorum_kernels::linear_attention::calls(), variorum_kernels::linear_attention::packed_calls());
        let ((y1, g1, p1), (y2, g2, p2)) = (run(true), run(false));
        let kind = cfg.kind();
        assert!(variorum_kernels::linear_attention::calls() > before, "{kind}: the kernel did not run");
        if kind != "average" {
            assert!(
                variorum_kernels::linear_attention::packed_calls() > packed,
                "{kind}: the packed kernel did not run"
            );
        }
        let d = rel_diff(y1, y2);
        assert!(d < 1e-5, "{kind}: outputs differ by {d}");
        let d = rel_diff(g1, g2);
        assert!(d < 1e-4, "{kind}: input gradients differ by {d}");
        assert_eq!(p1.len(), p2.len(), "{kind}: the same parameters have gradients");
        assert!(!p1.is_empty(), "{kind}: parameters have gradients");
        for (i, (a, b)) in p1.into_iter().zip(p2).enumerate() {
            let d = rel_diff(a, b);
            assert!(d < 1e-4, "{kind}: gradient of parameter {i} differs by {d}");
        }
    }
}
