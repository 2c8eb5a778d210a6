//! Every relative position scheme, inside multi-head attention: the attention pattern depends on
//! positions only through their differences (shifting every position by a constant changes
//! nothing), also with keys longer than the queries (a cache or a memory), and the scheme
//! actually changes the pattern.

use crate::common;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_attention::{AttentionInput, MultiHeadAttention, MultiHeadAttentionConfig, Positioning};
use variorum_core::AttentionMask;
use variorum_position::{
    DebertaConfig, MultiplicativeConfig, PositionConfig, RelativePosition, RopeLayout, RotaryConfig, ShawConfig,
    T5BiasConfig, XlRelativeConfig,
};

const D: usize = 16;

fn random<const N: usize>(shape: [usize; N], dev: &Device) -> Tensor<N> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
}

/// The relative schemes (TUPE's `untied` is absolute by design and left out).
fn schemes() -> Vec<PositionConfig> {
    vec![
        PositionConfig::Shaw(ShawConfig { max_distance: 3, values: true }),
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 10, shared: false }),
        PositionConfig::Alibi(Default::default()),
        PositionConfig::Rope(RotaryConfig::default()),
        PositionConfig::Rope(RotaryConfig {
            layout: RopeLayout::Interleaved,
            rotary_dim: Some(2),
            ..Default::default()
        }),
        PositionConfig::Da(Default::default()),
        PositionConfig::Multiplicative(MultiplicativeConfig { max_distance: 4 }),
        PositionConfig::Deberta(DebertaConfig { max_distance: 3, ..Default::default() }),
    ]
}

fn attention(position: &PositionConfig, n_kv_heads: usize, dev: &Device) -> MultiHeadAttention {
    let cfg = MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(n_kv_heads), ..Default::default() };
    let mut attn = cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 64 }, dev);
    randomise(&mut attn.position, dev);
    attn
}

/// Parameters that start neutral (the multiplicative scalars start at 1, T5's table at 0) set to
/// random values, so that a position-dependence would show.
fn randomise(position: &mut Option<RelativePosition>, dev: &Device) {
    if let Some(RelativePosition::Multiplicative(m)) = position {
        let n = m.scale.dims()[0];
        m.scale = Param::from_tensor(random([n], dev).add_scalar(1.0));
    }
    if let Some(RelativePosition::T5(t)) = position {
        t.table = Param::from_tensor(random(t.table.dims(), dev));
    }
}

/// The output, the input gradient and every parameter's gradient of `attn` over `x0` (weighted
/// by `w`) under `mask`, with the kernels on or off.
fn output_and_gradients(
    attn: &variorum_attention::Attention,
    (x0, w): (&Tensor<3>, &Tensor<3>),
    mask: &AttentionMask,
    kernels: bool,
) -> (Tensor<3>, Tensor<3>, Vec<Tensor<1>>) {
    let f = || {
        let x = x0.clone().require_grad();
        let y = attn.forward(AttentionInput::self_attention(x.clone(), mask), None).context;
        let grads = (y.clone() * w.clone()).sum().backward();
        let mut visitor = common::ParamGrads::new(&grads);
        attn.visit(&mut visitor);
        (y, x.grad(&grads).unwrap(), visitor.grads())
    };
    if kernels { f() } else { variorum_kernels::without_kernels(f) }
}

/// Two paths' outputs agree to 1e-5 and their gradients to `tol` (relative to the largest entry).
fn assert_agree(
    what: &str,
    a: (Tensor<3>, Tensor<3>, Vec<Tensor<1>>),
    b: (Tensor<3>, Tensor<3>, Vec<Tensor<1>>),
    tol: f32,
) {
    fn rel<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let s = b.clone().abs().max().into_scalar::<f32>().max(1e-3);
        (a - b).abs().max().into_scalar::<f32>() / s
    }
    let ((y1, g1, p1), (y2, g2, p2)) = (a, b);
    assert!(rel(y1, y2) < 1e-5, "{what}: outputs differ");
    let dg = rel(g1, g2);
    assert!(dg < tol, "{what}: input gradients differ by {dg}");
    assert_eq!(p1.len(), p2.len(), "{what}: the same parameters have gradients");
    for (i, (a, b)) in p1.into_iter().zip(p2).enumerate() {
        // a gradient that is zero in exact arithmetic (DeBERTa's W_{k,r} bias shifts each query's
        // scores by a constant, which the softmax cancels) is rounding noise on both paths
        let noise = |g: &Tensor<1>| g.clone().abs().max().into_scalar::<f32>() < 1e-5;
        if noise(&a) && noise(&b) {
            continue;
        }
        let d = rel(a, b);
        assert!(d < tol, "{what}: gradient of parameter {i} differs by {d}");
    }
}

fn weights(attn: &MultiHeadAttention, q: Tensor<3>, kv: Tensor<3>, mask: &AttentionMask) -> Tensor<4> {
    attn.forward(AttentionInput::cross_attention(q, kv, mask).with_weights(), None).weights.unwrap()
}

fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn scores_are_invariant_to_shifting_all_positions() {
    let dev = Device::flex();
    for scheme in schemes() {
        for n_kv_heads in [4, 2] {
            let attn = attention(&scheme, n_kv_heads, &dev);
            // 3 queries after 2 earlier keys (a cache or memory), causal; and a bidirectional block
            for (causal, lq, lk) in [(true, 3, 5), (false, 4, 4)] {
                let (q, kv) = (random([2, lq, D], &dev), random([2, lk, D], &dev));
                let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                let at = |shift: usize| base.clone().at(lk - lq + shift, shift);
                let w0 = weights(&attn, q.clone(), kv.clone(), &at(0));
                let w9 = weights(&attn, q.clone(), kv.clone(), &at(9));
                let kind = scheme.kind();
                assert!(
                    max_diff(w0.clone(), w9) < 1e-5,
                    "{kind} (kv heads {n_kv_heads}, causal {causal}): shifting every position changed the attention"
                );
                // and the scheme does see positions: moving the queries relative to the keys
                // (bidirectional, so the mask stays the same) changes the attention
                if !causal {
                    let moved = weights(&attn, q.clone(), kv.clone(), &base.clone().at(3, 0));
                    assert!(
                        max_diff(w0, moved) > 1e-4,
                        "{kind}: moving the queries relative to the keys must change the attention"
                    );
                }
            }
        }
    }
}

#[test]
fn every_scheme_on_the_kernels_equals_the_composed_path_with_the_gradients() {
    // full and capsule-heads attention without a scheme, and with RoPE (both layouts, partial,
    // grouped-query heads) rotate the fused projection by a kernel and read it packed (causal)
    // or take the block-sparse kernel over every key (both ways); with ALiBi or T5 full attention
    // hands its distance bias to the block-sparse kernel, with Transformer-XL, Shaw, DeBERTa, DA
    // or the multiplicative scalars its terms per distance, and so do a sliding window with a
    // global position and the strided union; the composed path splits the heads, rotates or
    // scores with Burn's ops: the same output and every gradient (every scheme's parameters too)
    let dev = Device::flex().autodiff();
    dev.seed(12);
    // longer than one block of the kernels (64 queries): several query blocks and key runs
    let x0: Tensor<3> = random([2, 70, D], &dev);
    let w: Tensor<3> = random([2, 70, D], &dev);
    let schemes = [
        "kind = \"none\"",
        "kind = \"rope\"",
        "kind = \"rope\"\nlayout = \"interleaved\"\nrotary_dim = 2",
        "kind = \"alibi\"",
        "kind = \"t5\"\nnum_buckets = 8\nmax_distance = 16",
        "kind = \"transformer-xl\"",
        "kind = \"shaw\"\nmax_distance = 5",
        "kind = \"deberta\"\nmax_distance = 5",
        "kind = \"deberta\"\nmax_distance = 6\nlog_buckets = 11\nbias = true\nnorm = true\np2c_distance = \"query-minus-key\"",
        "kind = \"da\"",
        "kind = \"multiplicative\"\nmax_distance = 9",
    ];
    let kinds = [
        "kind = \"full\"\nn_heads = 4\nn_kv_heads = 2",
        "kind = \"capsule-heads\"\nn_heads = 4\nn_kv_heads = 2\nrouting = \"em\"",
        "kind = \"sliding-window\"\nn_heads = 4\nn_kv_heads = 2\nwindow = 20\nglobal = [3]",
        "kind = \"strided\"\nn_heads = 2\nstride = 8",
    ];
    let content = ["transformer-xl", "shaw", "deberta", "da", "multiplicative"];
    let cases = schemes.iter().flat_map(|s| kinds.iter().map(move |k| (s, k)));
    for ((scheme, kind), causal) in cases.flat_map(|c| [(c, true), (c, false)]) {
        let position: PositionConfig = toml::from_str(scheme).unwrap();
        let sparse_kind = kind.contains("window") || kind.contains("strided");
        if sparse_kind && !content.contains(&position.kind()) {
            continue; // the band tests hold those
        }
        let cfg: variorum_attention::AttentionConfig = toml::from_str(kind).unwrap();
        cfg.validate(D).unwrap();
        let mut attn = cfg.init(D, 0.3, 0.3, Positioning { config: &position, context: 64 }, &dev);
        use variorum_attention::Attention;
        match &mut attn {
            Attention::Full(a) => randomise(&mut a.position, &dev),
            Attention::SlidingWindow(a) => randomise(&mut a.attention.position, &dev),
            Attention::Strided(a) => randomise(&mut a.attention.position, &dev),
            Attention::CapsuleHeads(a) => randomise(&mut a.attention.position, &dev),
            _ => unreachable!("the kinds listed above"),
        }
        let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
        let run = |kernels: bool| output_and_gradients(&attn, (&x0, &w), &mask, kernels);
        let (rotations, sparse) = (variorum_kernels::rope::calls(), variorum_kernels::block_sparse::calls());
        let (on, off) = (run(true), run(false));
        // (the packed rotation and the fused causal kernel serve the causal training path; the
        // block-sparse kernel every key both ways, and a bias or terms with any mask)
        let sparse_calls = variorum_kernels::block_sparse::calls() - sparse;
        let ran = match position.kind() {
            "rope" => {
                variorum_kernels::rope::calls() == rotations + usize::from(causal)
                    && sparse_calls == usize::from(!causal)
            }
            "none" => sparse_calls == usize::from(!causal),
            _ => sparse_calls == 1,
        };
        assert!(ran, "{kind} with {scheme}, causal {causal}: the kernel ran as expected");
        let what = format!("{kind} with {scheme}, causal {causal}");
        // EM routing amplifies rounding: a 1e-6 change of the input moves capsule heads'
        // composed input gradient by 1e-4 (relative) with Transformer-XL, so the two paths'
        // different summation orders are held to 1e-3 there
        let tol = if kind.contains("capsule") { 1e-3 } else { 1e-4 };
        assert_agree(&what, on, off, tol);
    }
}

/// TUPE's position–position term (`untied`) on the fused causal kernel — added by the packed
/// kernel itself (`causal_self_attention_with_products`), or, with a head temperature, by the
/// separate one (`causal_attention_with_products`) — the same output and every gradient (the table
/// and U^Q, U^K too) as the composed path, causal, with queries after the keys and further into
/// the table, and with grouped-query heads (with and without a temperature).
#[test]
fn tupe_on_the_causal_kernel_equals_the_composed_path_with_the_gradients() {
    let dev = Device::flex().autodiff();
    dev.seed(13);
    let x0: Tensor<3> = random([2, 70, D], &dev);
    let w: Tensor<3> = random([2, 70, D], &dev);
    let position: PositionConfig = toml::from_str("kind = \"untied\"\nmax_len = 80").unwrap();
    let kinds = [
        "kind = \"full\"\nn_heads = 4",
        "kind = \"full\"\nn_heads = 4\nhead_temperature = true",
        "kind = \"full\"\nn_heads = 4\nn_kv_heads = 2",
        "kind = \"full\"\nn_heads = 4\nn_kv_heads = 2\nhead_temperature = true",
    ];
    for kind in kinds {
        // queries and keys from 0, both from 7 (rows further into the table), and queries 7
        // positions after the keys (offset 7)
        for (q_start, k_start) in [(0, 0), (7, 7), (7, 0)] {
            let cfg: variorum_attention::AttentionConfig = toml::from_str(kind).unwrap();
            cfg.validate(D).unwrap();
            let mut attn = cfg.init(D, 0.3, 0.3, Positioning { config: &position, context: 80 }, &dev);
            // a position term as large as the content scores, and temperatures away from 1
            if let variorum_attention::Attention::Full(a) = &mut attn {
                if let Some(RelativePosition::Untied(u)) = &mut a.position {
                    u.table = Param::from_tensor(random(u.table.dims(), &dev));
                }
                if let Some(theta) = &mut a.normaliser.log_temperature {
                    *theta = Param::from_tensor(random(theta.dims(), &dev).mul_scalar(0.5));
                }
            }
            let mask = AttentionMask::causal().at(q_start, k_start);
            let run = |kernels: bool| output_and_gradients(&attn, (&x0, &w), &mask, kernels);
            let before = variorum_kernels::causal_attention::calls();
            let (on, off) = (run(true), run(false));
            let what = format!("{kind}, queries from {q_start}, keys from {k_start}");
            assert_eq!(variorum_kernels::causal_attention::calls() - before, 1, "{what}: kernel use");
            assert_agree(&what, on, off, 1e-4);
        }
    }
}
