//! Position-wise feed-forward networks, the `model.feed_forward` axis: the layers every kind
//! shares,
//!
//! FFN(x) = φ(x W₁ + b₁) W₂ + b₂,   or, gated,   FFN(x) = (φ(x W) ⊗ x V) W₂,
//!
//! with the kind deciding φ, the gating and an optional convolution over time first. Each kind
//! is its own file and one line in [`FeedForwardKind`]'s list: [`crate::dense_ffn`] (relu,
//! gelu, gelu-tanh), [`crate::glu`] (glu, geglu, swiglu), [`crate::separable_conv`]. The gated kinds
//! compute x W and x V with one fused GEMM and split the result.
//!
//! `chunks = c` (Reformer §3, "chunking"): the position-wise part runs on c slices of the
//! sequence one after another, so the `[batch, len, d_ff]` hidden layer exists one slice at a
//! time; the result is the same (positions are independent). It saves memory where no graph
//! keeps the slices alive: inference, and the forward of a reversible stack.

use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, Declared, KindInfo, error::check};
use variorum_kernels::linear;

use crate::dense_ffn::{GeluFfn, GeluTanhFfn, ReluFfn};
use crate::glu::{GegluFfn, GegluTanhFfn, GluFfn, SwigluFfn};
use crate::separable_conv::SeparableConvFfn;

/// What a feed-forward kind changes in the shared layers: its nonlinearity, whether the
/// up-projection is a gate and a value, whether a convolution over time comes first. A kind is a
/// unit type implementing this and [`Declared`] in its own file, and one line in
/// [`FeedForwardKind`]'s list.
pub trait FeedForwardActivation: Sync {
    /// The up-projection yields a gate and a value (2·d_ff wide), joined as φ(gate) ⊗ value.
    /// Default: no.
    fn gated(&self) -> bool {
        false
    }

    /// A causal depthwise filter over time (`kernel_size` wide) runs before the position-wise
    /// layers; the layer then keeps a window of earlier inputs as decoding state. Default: no.
    fn mixes_time(&self) -> bool {
        false
    }

    /// φ on the hidden layer (on the gate, for a gated kind).
    fn activate(&self, h: Tensor<3>) -> Tensor<3>;

    /// A gated kind's φ(x W) ⊗ x V from the fused projection's output `[x W | x V]`: by default
    /// the two halves sliced and φ applied by [`activate`](Self::activate); a kind with a fused
    /// kernel for it overrides.
    fn gate(&self, h: Tensor<3>) -> Tensor<3> {
        let w = h.dims()[2];
        let gate = h.clone().narrow(2, 0, w / 2);
        self.activate(gate) * h.narrow(2, w / 2, w / 2)
    }
}

/// Writes [`FeedForwardKind`] (the `kind` key: one unit variant per registered kind) and its
/// dispatch from `"kind" => Variant(Type),` lines.
macro_rules! feed_forward_kinds {
    ($( $(#[$doc:meta])* $kind:literal => $variant:ident($ty:ident), )+) => {
        /// `model.feed_forward.kind`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub enum FeedForwardKind {
            $( $(#[$doc])* #[serde(rename = $kind)] $variant, )+
        }

        impl FeedForwardKind {
            /// Every registered kind, in zoo order.
            pub const ALL: &'static [FeedForwardKind] = &[ $( Self::$variant, )+ ];

            /// The name in a config.
            pub fn name(self) -> &'static str {
                match self { $( Self::$variant => $kind, )+ }
            }

            /// The kind's definition.
            pub fn spec(self) -> &'static dyn FeedForwardActivation {
                match self { $( Self::$variant => &$ty, )+ }
            }

            /// Summary, paper and capabilities.
            fn declared(self) -> (&'static str, &'static str, Capabilities) {
                match self { $( Self::$variant => (<$ty as Declared>::SUMMARY, <$ty as Declared>::PAPER, <$ty as Declared>::CAPS), )+ }
            }
        }
    };
}

feed_forward_kinds! {
    /// φ = ReLU (Vaswani et al. 2017).
    "relu" => Relu(ReluFfn),
    /// φ = GELU, the exact erf form (Hendrycks & Gimpel 2016; GPT). The default.
    "gelu" => Gelu(GeluFfn),
    /// φ = GELU's tanh approximation (GPT-2's `gelu_new`).
    "gelu-tanh" => GeluTanh(GeluTanhFfn),
    /// Gated, φ = sigmoid (Dauphin et al. 2017).
    "glu" => Glu(GluFfn),
    /// Gated, φ = GELU (Shazeer 2020).
    "geglu" => Geglu(GegluFfn),
    /// Gated, φ = GELU's tanh approximation (T5 v1.1's `gated-gelu`).
    "geglu-tanh" => GegluTanh(GegluTanhFfn),
    /// Gated, φ = Swish (Shazeer 2020).
    "swiglu" => Swiglu(SwigluFfn),
    /// A causal depthwise filter over time, then φ = ReLU (the Universal Transformer's
    /// transition).
    "separable-conv" => SeparableConv(SeparableConvFfn),
}

impl Default for FeedForwardKind {
    fn default() -> Self {
        Self::Gelu
    }
}

impl FeedForwardKind {
    /// The up-projection yields a gate and a value (2·d_ff wide).
    pub fn gated(self) -> bool {
        self.spec().gated()
    }

    /// What the kind declares it supports.
    pub fn capabilities(self) -> Capabilities {
        self.declared().2
    }
}

/// `model.feed_forward`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeedForwardConfig {
    /// `relu`, `gelu` (exact erf form; default), `gelu-tanh`, `glu`, `geglu`, `geglu-tanh`,
    /// `swiglu`, `separable-conv`.
    pub kind: FeedForwardKind,
    /// Hidden width. Default `4 · d_model`.
    pub d_ff: Option<usize>,
    /// Biases in both projections. Default true.
    pub bias: bool,
    /// `separable-conv` only: width k of the depthwise filter over time. Default 3.
    pub kernel_size: usize,
    /// Run the position-wise layers on this many slices of the sequence, one at a time. Default 1.
    pub chunks: usize,
}

impl Default for FeedForwardConfig {
    fn default() -> Self {
        Self { kind: FeedForwardKind::Gelu, d_ff: None, bias: true, kernel_size: 3, chunks: 1 }
    }
}

impl FeedForwardConfig {
    /// The hidden width: `d_ff`, or 4 · `d_model` when unset.
    pub fn d_ff(&self, d_model: usize) -> usize {
        self.d_ff.unwrap_or(4 * d_model)
    }

    /// The same config with the hidden width written out.
    pub fn expanded(&self, d_model: usize) -> Self {
        Self { d_ff: Some(self.d_ff(d_model)), ..self.clone() }
    }

    /// Checks the settings; messages name the config key (`model.feed_forward.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.d_ff != Some(0), || "model.feed_forward.d_ff must be at least 1".into())?;
        check(self.kernel_size >= 1, || "model.feed_forward.kernel_size must be at least 1".into())?;
        check(self.chunks >= 1, || "model.feed_forward.chunks must be at least 1".into())
    }

    /// The layer: `init_std` for the up-projection, `out_std` for the down-projection, `dropout`
    /// on the hidden layer.
    pub fn init(&self, d_model: usize, dropout: f64, init_std: f64, out_std: f64, device: &Device) -> FeedForward {
        let d_ff = self.d_ff(d_model);
        let up_width = if self.kind.gated() { 2 * d_ff } else { d_ff };
        FeedForward {
            up: LinearConfig::new(d_model, up_width)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                .init(device),
            down: LinearConfig::new(d_ff, d_model)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
                .init(device),
            dropout: DropoutConfig::new(dropout).init(),
            kind: self.kind,
            chunks: self.chunks,
            depthwise: self
                .kind
                .spec()
                .mixes_time()
                .then(|| Conv1dConfig::new(d_model, d_model, self.kernel_size).with_groups(d_model).init(device)),
        }
    }

    /// Forward FLOPs per token (2 per multiply–add): both projections and the depthwise filter.
    pub fn flops_per_token(&self, d_model: usize) -> u64 {
        let d_ff = self.d_ff(d_model) as u64;
        let up = if self.kind.gated() { 2 * d_ff } else { d_ff };
        let depthwise = if self.kind.spec().mixes_time() { self.kernel_size as u64 } else { 0 };
        2 * (d_model as u64 * (up + depthwise) + d_ff * d_model as u64)
    }

    /// The `variorum zoo` rows.
    pub fn zoo() -> Vec<KindInfo> {
        FeedForwardKind::ALL
            .iter()
            .map(|k| {
                let (summary, paper, caps) = k.declared();
                KindInfo { axis: "model.feed_forward", kind: k.name(), summary, paper, caps }
            })
            .collect()
    }
}

/// A position-wise feed-forward layer (a depthwise filter over time first for
/// `separable-conv`).
#[derive(Module, Debug)]
pub struct FeedForward {
    /// W₁ and b₁, `d_model` → d_ff; for a gated kind the fused [W | V], `d_model` → 2·d_ff.
    pub up: Linear,
    /// W₂ and b₂, d_ff → `d_model`.
    pub down: Linear,
    /// Dropout on the hidden layer.
    pub dropout: Dropout,
    /// The kind: φ, gating, convolution.
    #[module(skip)]
    pub kind: FeedForwardKind,
    /// Slices of the sequence the position-wise part runs on, one after another.
    #[module(skip)]
    pub chunks: usize,
    /// `separable-conv`: the per-channel filter over time.
    pub depthwise: Option<Conv1d>,
}

impl FeedForward {
    /// FFN(x) for `x: [b, len, d_model]`, without decoding state.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.forward_with(x, None)
    }

    /// With `window` (incremental decoding), a convolution continues from the inputs it holds —
    /// the last k−1 before `x` — and keeps the last k−1 after; position-wise kinds ignore it.
    pub fn forward_with(&self, x: Tensor<3>, window: Option<&mut Option<Tensor<3>>>) -> Tensor<3> {
        let x = match &self.depthwise {
            Some(conv) => crate::separable_conv::causal_depthwise(conv, x, window),
            None => x,
        };
        let len = x.dims()[1];
        if self.chunks <= 1 || len <= 1 {
            return self.position_wise(x);
        }
        let size = len.div_ceil(self.chunks);
        let parts = (0..len).step_by(size).map(|s| self.position_wise(x.clone().narrow(1, s, size.min(len - s))));
        Tensor::cat(parts.collect(), 1)
    }

    /// φ(x W₁ + b₁) W₂ + b₂ (or its gated form), position by position.
    fn position_wise(&self, x: Tensor<3>) -> Tensor<3> {
        let h = linear::forward(&self.up, x);
        let kind = self.kind.spec();
        let h = if kind.gated() { kind.gate(h) } else { kind.activate(h) };
        linear::forward(&self.down, self.dropout.forward(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::separable_conv::causal_depthwise;
    use burn::tensor::Distribution;

    fn sepconv(k: usize, dev: &Device) -> FeedForward {
        let cfg = FeedForwardConfig { kind: FeedForwardKind::SeparableConv, kernel_size: k, ..Default::default() };
        cfg.init(4, 0.0, 0.5, 0.5, dev)
    }

    #[test]
    fn depthwise_filter_is_the_causal_per_channel_sum() {
        let dev = Device::flex();
        let ffn = sepconv(3, &dev);
        let conv = ffn.depthwise.as_ref().unwrap();
        let x: Tensor<3> = Tensor::random([2, 5, 4], Distribution::Normal(0.0, 1.0), &dev);
        let got = causal_depthwise(conv, x.clone(), None).into_data().try_to_vec::<f32>().unwrap();
        let w = conv.weight.val().into_data().try_to_vec::<f32>().unwrap(); // [d, 1, k]
        let bias = conv.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        let xv = x.into_data().try_to_vec::<f32>().unwrap();
        for (i, g) in got.iter().enumerate() {
            let (bi, t, c) = (i / 20, (i / 4) % 5, i % 4);
            // cross-correlation over the left-padded input: tap j reads x_{t−(k−1)+j}
            let mut want = bias[c];
            for j in 0..3 {
                let s = t as i64 - 2 + j as i64;
                if s >= 0 {
                    want += w[c * 3 + j] * xv[bi * 20 + s as usize * 4 + c];
                }
            }
            assert!((g - want).abs() < 1e-5, "{i}: {g} vs {want}");
        }
    }

    #[test]
    fn chunks_give_the_unchunked_output() {
        let dev = Device::flex();
        for kind in [FeedForwardKind::Gelu, FeedForwardKind::Swiglu, FeedForwardKind::SeparableConv] {
            let whole = FeedForwardConfig { kind, ..Default::default() }.init(4, 0.0, 0.5, 0.5, &dev);
            let x: Tensor<3> = Tensor::random([2, 7, 4], Distribution::Normal(0.0, 1.0), &dev);
            let want = whole.forward(x.clone());
            for chunks in [2, 3, 7, 10] {
                let chunked = FeedForward { chunks, ..whole.clone() };
                let diff = (chunked.forward(x.clone()) - want.clone()).abs().max().into_scalar::<f32>();
                assert!(diff < 1e-6, "{} in {chunks} chunks: {diff}", kind.name());
            }
        }
    }

    #[test]
    fn window_continues_the_convolution_token_by_token() {
        let dev = Device::flex();
        for k in [1, 3, 4] {
            let ffn = sepconv(k, &dev);
            let x: Tensor<3> = Tensor::random([2, 7, 4], Distribution::Normal(0.0, 1.0), &dev);
            let full = ffn.forward(x.clone());
            let mut window = None;
            let parts: Vec<Tensor<3>> = [(0, 3), (3, 1), (4, 3)]
                .iter()
                .map(|&(s, n)| ffn.forward_with(x.clone().narrow(1, s, n), Some(&mut window)))
                .collect();
            let diff = (full - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "k = {k}: {diff}");
        }
    }
}
