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
        PositionConfig::Deberta(DebertaConfig { max_distance: 3 }),
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
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 10 }),
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
