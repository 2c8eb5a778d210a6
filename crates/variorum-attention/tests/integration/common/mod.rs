//! What several attention test files share.
#![allow(dead_code)]

use burn::prelude::*;
use variorum_attention::{AttentionInput, AttentionOutput, KvCache};
use variorum_core::AttentionMask;
use variorum_position::{
    DebertaConfig, MultiplicativeConfig, PositionConfig, RotaryConfig, ShawConfig, T5BiasConfig, XlRelativeConfig,
};

/// `f` with the CPU kernels on (`true`) or off: a kind's fast path and its composed path.
pub fn with_kernels<R>(on: bool, f: impl FnOnce() -> R) -> R {
    if on { f() } else { variorum_kernels::without_kernels(f) }
}

/// Holds a layer's kernel path (block-sparse or Sinkhorn's blocks) to its composed path (the kernels off): `run(x)` the
/// layer's output, `weight(grads)` the gradient of one of its parameters; the output, the input
/// gradient and that gradient must agree (relative to their largest entries), and the kernel must
/// run on the first path only.
pub fn assert_kernel_matches_composed(
    what: &str,
    x: &Tensor<3>,
    w: &Tensor<3>,
    run: impl Fn(Tensor<3>) -> Tensor<3>,
    weight: impl Fn(&burn::tensor::Gradients) -> Tensor<2>,
) {
    let grads_of = |kernels: bool| {
        let x = x.clone().require_grad();
        let before = kernel_calls();
        let y = with_kernels(kernels, || run(x.clone()));
        assert_eq!(kernel_calls() > before, kernels, "{what}: kernel use");
        let grads = (y.clone() * w.clone()).sum().backward();
        (y, x.grad(&grads).unwrap(), weight(&grads))
    };
    let ((y1, dx1, dw1), (y2, dx2, dw2)) = (grads_of(true), grads_of(false));
    let rel = |a: Tensor<3>, b: Tensor<3>| {
        (a.clone() - b).abs().max().into_scalar::<f32>() / a.abs().max().into_scalar::<f32>().max(1e-6)
    };
    assert!(rel(y1, y2) < 1e-5, "output, {what}");
    assert!(rel(dx1, dx2) < 1e-4, "input gradient, {what}");
    assert!(rel(dw1.unsqueeze(), dw2.unsqueeze()) < 1e-4, "parameter gradient, {what}");
}

/// Calls of the attention kernels the layers here reach (block-sparse, Sinkhorn's blocks).
pub fn kernel_calls() -> usize {
    variorum_kernels::block_sparse::calls() + variorum_kernels::sinkhorn::calls()
}

/// Causal and bidirectional masks, each with the kernels on and off.
pub fn masks_and_paths() -> Vec<(AttentionMask, bool)> {
    let masks = [AttentionMask::causal(), AttentionMask::bidirectional()];
    masks.into_iter().flat_map(|m| [(m.clone(), true), (m, false)]).collect()
}

/// Model width of the attention tests.
pub const D: usize = 16;

/// Every position scheme a score-forming kind takes inside attention, with clipping distances
/// short enough for the tests' lengths.
pub fn schemes() -> Vec<PositionConfig> {
    let mut all = distance_schemes();
    all.extend([
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::Shaw(ShawConfig { max_distance: 3, values: true }),
        PositionConfig::Deberta(DebertaConfig { max_distance: 3, ..Default::default() }),
        PositionConfig::Da(Default::default()),
        PositionConfig::Multiplicative(MultiplicativeConfig { max_distance: 4 }),
    ]);
    all
}

/// The schemes that act through the query–key distance alone (or on q and k): those patterns
/// with gathered keys take.
pub fn distance_schemes() -> Vec<PositionConfig> {
    vec![
        PositionConfig::None(Default::default()),
        PositionConfig::Alibi(Default::default()),
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 10, shared: false }),
        PositionConfig::Rope(RotaryConfig::default()),
    ]
}

/// Largest difference between the causal forward of `x: [b, len, D]` and decoding it with a KV
/// cache: a prompt of `prompt` tokens, then one token at a time.
pub fn decoding_gap(
    forward: impl Fn(AttentionInput, Option<&mut KvCache>) -> AttentionOutput,
    x: &Tensor<3>,
    prompt: usize,
) -> f32 {
    let len = x.dims()[1];
    let full = forward(AttentionInput::self_attention(x.clone(), &AttentionMask::causal()), None).context;
    let mut cache = KvCache::default();
    let parts: Vec<Tensor<3>> = std::iter::once((0, prompt))
        .chain((prompt..len).map(|t| (t, 1)))
        .map(|(s, n)| {
            let m = AttentionMask::causal().at(s, 0);
            forward(AttentionInput::self_attention(x.clone().narrow(1, s, n), &m), Some(&mut cache)).context
        })
        .collect();
    (full - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>()
}

/// Burn's CPU backends seed one process-wide generator: tests that seed it and draw from it
/// (inputs, lazily initialised parameters) hold this lock so that they draw what they seeded.
pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every parameter's gradient in a module, flattened, in visiting order (`module.visit(&mut
/// visitor)`, then [`ParamGrads::grads`]).
pub struct ParamGrads<'a> {
    grads: &'a burn::tensor::Gradients,
    out: Vec<Tensor<1>>,
}

impl<'a> ParamGrads<'a> {
    pub fn new(grads: &'a burn::tensor::Gradients) -> Self {
        Self { grads, out: Vec::new() }
    }

    pub fn grads(self) -> Vec<Tensor<1>> {
        self.out
    }
}

impl burn::module::ModuleVisitor for ParamGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
        if let Some(g) = param.val().grad(self.grads) {
            let n = g.shape().num_elements();
            self.out.push(g.reshape([n]));
        }
    }
}
