//! Lightweight and dynamic convolutions (Wu, Fan, Baevski, Dauphin, Auli 2019), the
//! `lightweight-conv` and `dynamic-conv` kinds: self-attention replaced by a depthwise
//! convolution over time whose kernels are softmax-normalised and shared by groups of channels
//! (§3). With y the layer's input `[L, d]`,
//!
//!   x = GLU(y W_I + b_I),   GLU([a; g]) = a ⊙ σ(g)            (W_I: d → 2d, so x has d channels),
//!   LightConv(x, W)_{i,c} = Σ_{j=0}^{k−1} softmax(W_{h(c)})_j · x_{i−p+j, c},   h(c) = ⌊c·H/d⌋,
//!   DynamicConv(x)_{i,c} = LightConv(x, W(x_i))_{i,c},   W(x_i) = x_i W_P ∈ ℝ^{H×k},
//!   output = conv W_O + b_O                                   (W_O: d → d),
//!
//! with p = k − 1 causally and ⌊k/2⌋ bidirectionally (see below), and rows outside the sequence
//! read as zeros. LightConv learns one kernel W_h ∈ ℝ^k per head; DynamicConv predicts every
//! position's H kernels from that position alone (a linear map of x_i, reshaped to `[H, k]`,
//! softmax over the k taps), so its cost stays linear in L.
//!
//! Choices where the paper leaves one open:
//! - Causal form (next-token models): p = k − 1, the taps cover i − k + 1 … i. Bidirectional
//!   (masked objective): the centred taps of the paper's DepthwiseConv, i − ⌊k/2⌋ … i + ⌈k/2⌉ − 1,
//!   so an even k reaches one position further back than ahead (fairseq's encoder pads an even
//!   k the other way round; for odd k both agree).
//! - The GLU input projection and the d → d output projection are §3's; `bias` gives them their
//!   biases. The weight predictor is linear without a bias, as the paper's
//!   f(X_i)_{h,j} = Σ_c W_{h,j,c} X_{i,c} (and fairseq's).
//! - H need not divide d: channel c takes head ⌊c·H/d⌋'s kernel, so the groups differ in size
//!   by at most one (the paper and fairseq take H dividing d, where this is c ÷ (d/H)).
//! - Initialisation: W_I and W_P normal with `init_std`, W_O with `out_std` (as every kind's
//!   projections here), so predicted kernels start close to uniform; LightConv's kernels
//!   Xavier-uniform over `[H, k]` (fan in k, fan out H·k), as fairseq's.
//! - DropConnect (`weight_dropout`): dropout on the normalised weights, one draw per head and
//!   tap (a head's channels share it), scaled by 1/(1 − weight_dropout) as dropout is and not renormalised
//!   (fairseq does not either); active only while training on an autodiff device.
//! - Padding: rows of x at padded positions are zeroed before the convolution, so a padded key
//!   contributes nothing (outputs at padded positions themselves are meaningless, as with any
//!   kind). Custom masks and global tokens are ignored; `max_back` is refused by the model's
//!   rules (no per-key scores), the kernel's k taps being the only reach.
//! - No cross form: a convolution mixes neighbouring positions of one sequence, so
//!   `key_value = Some` is refused, and no memory is read (`reads_memory: false`).
//!
//! The convolution is k shifted slices of the padded input, out = Σ_j w_j ⊙ x_pad[j .. j + L]:
//! O(L·d·k), never an L × L matrix. Decoding keeps the last k − 1 rows of x (zeros before the
//! first token) and prepends them instead of the zeros, so a call with one new row or several
//! (a prefill) runs the same arithmetic as the full forward; O(k·d) per token.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::prelude::*;
use burn::tensor::activation::{glu, softmax};
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::HeadShape;

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

const WU_2019: &str = "Wu et al. 2019, Pay Less Attention with Lightweight and Dynamic Convolutions";

/// No score matrix for a position scheme to act on, and no memory: the taps read the segment's
/// own rows (and no cross form: `cross: false`, `key_value` is refused).
const CONV_CAPS: Capabilities = Capabilities { reads_memory: false, ..caps::NO_SCORES };

/// Which of the two convolutions a [`ConvConfig`] is: the kinds differ in this alone.
pub trait Convolution: Clone + Copy + core::fmt::Debug + PartialEq + Default + Send + Sync + 'static {
    /// Kernels predicted from each position (DynamicConv) rather than learned once (LightConv).
    const DYNAMIC: bool;
    /// The zoo line.
    const SUMMARY: &'static str;
}

/// LightConv: one softmax-normalised kernel learned per head.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Lightweight;

impl Convolution for Lightweight {
    const DYNAMIC: bool = false;
    const SUMMARY: &'static str = "softmax-normalised depthwise convolution over k positions (the last k, centred when bidirectional), one kernel per channel group, after a GLU; O(k·d) per token, no scores";
}

/// DynamicConv: every position's kernels predicted from it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Dynamic;

impl Convolution for Dynamic {
    const DYNAMIC: bool = true;
    const SUMMARY: &'static str = "convolution over k positions whose softmax-normalised kernels each position predicts from itself (a linear map), one per channel group, after a GLU; O(k·d) per token";
}

/// `model.attention` with `kind = "lightweight-conv"` ([`LightweightConvConfig`]) or
/// `kind = "dynamic-conv"` ([`DynamicConvConfig`]): one table, the kind chosen by `C`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, bound = "")]
pub struct ConvConfig<C: Convolution> {
    /// H, kernels (learned, or predicted per position): channel c uses kernel ⌊c·H/d_model⌋
    /// (between 1 and `d_model`; it need not divide `d_model`). Default 4.
    pub n_heads: usize,
    /// k, taps of every kernel (positions each output mixes). Default 7.
    pub kernel_size: usize,
    /// One kernel size per layer, bottom first (the paper's decoder: 3, 7, 15, 31, 31, 31, 31);
    /// empty = `kernel_size` in every layer. Default empty.
    pub kernel_sizes: Vec<usize>,
    /// DropConnect: dropout on the softmax-normalised kernel weights while training. Default 0.
    pub weight_dropout: f64,
    /// Biases in the input and output projections (the weight predictor has none, as the
    /// paper's). Default true.
    pub bias: bool,
    /// Which convolution (no key of its own: the kind's name chooses it).
    #[serde(skip)]
    pub convolution: core::marker::PhantomData<C>,
}

/// `model.attention` with `kind = "lightweight-conv"`.
pub type LightweightConvConfig = ConvConfig<Lightweight>;

/// `model.attention` with `kind = "dynamic-conv"`.
pub type DynamicConvConfig = ConvConfig<Dynamic>;

impl<C: Convolution> Default for ConvConfig<C> {
    fn default() -> Self {
        Self {
            n_heads: 4,
            kernel_size: 7,
            kernel_sizes: Vec::new(),
            weight_dropout: 0.0,
            bias: true,
            convolution: core::marker::PhantomData,
        }
    }
}

/// What either kind's settings decide for one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvSettings {
    /// H, kernels (learned, or predicted per position); channel c uses kernel ⌊c·H/d_model⌋.
    pub n_heads: usize,
    /// k, taps of every kernel (this layer's, after `kernel_sizes`).
    pub kernel_size: usize,
    /// DropConnect: dropout on the softmax-normalised kernel weights while training.
    pub weight_dropout: f64,
    /// Biases in the input and output projections (the weight predictor has none).
    pub bias: bool,
    /// Kernels predicted from each position (DynamicConv) rather than learned once (LightConv).
    pub dynamic: bool,
}

impl ConvSettings {
    fn validate(&self, kernel_sizes: &[usize], d_model: usize) -> Result<(), ConfigError> {
        check(self.n_heads >= 1 && self.n_heads <= d_model, || {
            format!(
                "model.attention.n_heads = {} must be between 1 and d_model = {d_model}: the kernels share the d_model channels in groups",
                self.n_heads
            )
        })?;
        check(self.kernel_size >= 1, || {
            format!("model.attention.kernel_size = {} must be at least 1", self.kernel_size)
        })?;
        if let Some(i) = kernel_sizes.iter().position(|&k| k == 0) {
            return Err(ConfigError(format!("model.attention.kernel_sizes[{i}] = 0 must be at least 1")));
        }
        check((0.0..1.0).contains(&self.weight_dropout), || {
            format!("model.attention.weight_dropout = {} must be in [0, 1)", self.weight_dropout)
        })
    }

    /// H heads of the widest channel group. Called before validation too, so H = 0 is read as 1.
    fn head_shape(&self, d_model: usize) -> HeadShape {
        let n_heads = self.n_heads.max(1);
        HeadShape { d_model, n_heads, head_dim: d_model.div_ceil(n_heads) }
    }

    /// Multiply–adds per token: the projections (d → 2d, d → d), k taps per channel, and for
    /// DynamicConv the predictor (d → H·k).
    fn flops_per_token(&self, d_model: usize) -> u64 {
        let (d, h, k) = (d_model as u64, self.n_heads as u64, self.kernel_size as u64);
        let predictor = if self.dynamic { d * h * k } else { 0 };
        2 * (2 * d * d + d * d + d * k + predictor)
    }

    /// The layer: `init_std` for the input projection and the predictor, `out_std` for the output;
    /// LightConv's kernels Xavier-uniform.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> ConvolutionAttention {
        let (h, k) = (self.n_heads, self.kernel_size);
        let kernels = (!self.dynamic)
            .then(|| Initializer::XavierUniform { gain: 1.0 }.init_with::<2, _>([h, k], Some(k), Some(h * k), device));
        // the paper's predictor is linear without a bias (fairseq's `weight_linear` too)
        let predictor = self.dynamic.then(|| normal_linear(d_model, h * k, false, init_std, device));
        ConvolutionAttention {
            input: normal_linear(d_model, 2 * d_model, self.bias, init_std, device),
            kernels,
            predictor,
            output: normal_linear(d_model, d_model, self.bias, out_std, device),
            weight_dropout: DropoutConfig::new(self.weight_dropout).init(),
            n_heads: h,
            kernel_size: k,
        }
    }
}

impl<C: Convolution> ConvConfig<C> {
    /// The settings of one layer.
    pub fn settings(&self) -> ConvSettings {
        ConvSettings {
            n_heads: self.n_heads,
            kernel_size: self.kernel_size,
            weight_dropout: self.weight_dropout,
            bias: self.bias,
            dynamic: C::DYNAMIC,
        }
    }

    /// The layer: `init_std` for the input projection and the predictor, `out_std` for the output.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> ConvolutionAttention {
        self.settings().init(d_model, init_std, out_std, device)
    }
}

impl<C: Convolution> AttentionKind for ConvConfig<C> {
    type Module = ConvolutionAttention;
    const SUMMARY: &'static str = C::SUMMARY;
    const PAPER: &'static str = WU_2019;
    const CAPS: Capabilities = CONV_CAPS;

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.settings().validate(&self.kernel_sizes, d_model)
    }

    fn head_shape(&self, d_model: usize) -> HeadShape {
        self.settings().head_shape(d_model)
    }

    fn dropout(&self) -> f64 {
        self.weight_dropout
    }

    /// Whatever `len_k`: k taps per channel (and DynamicConv's predictor).
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        self.settings().flops_per_token(d_model)
    }

    /// The config of layer `i` (its kernel size from `kernel_sizes`).
    fn for_layer(&self, i: usize) -> Self {
        match self.kernel_sizes.get(i) {
            Some(&kernel_size) => Self { kernel_size, kernel_sizes: Vec::new(), ..self.clone() },
            None => self.clone(),
        }
    }

    fn per_layer(&self) -> usize {
        self.kernel_sizes.len()
    }

    fn per_layer_key(&self) -> &'static str {
        "kernel_sizes"
    }

    fn build(&self, init: &LayerInit, device: &Device) -> ConvolutionAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// The harness's sequences are 10 to 17 positions: k = 20 pads past the start throughout.
    /// The two kinds run different per-layer sizes and an odd and an even bidirectional k.
    fn test_variants() -> Vec<TestVariant<Self>> {
        let (per_layer, bidirectional) = if C::DYNAMIC { (vec![4, 2], 5) } else { (vec![2, 5], 4) };
        vec![
            TestVariant::new("k 3", Self { kernel_size: 3, ..Default::default() }),
            TestVariant::new(
                "k 20 beyond the sequence, 3 heads over 32 channels",
                Self { kernel_size: 20, n_heads: 3, ..Default::default() },
            ),
            TestVariant::new("per-layer kernels", Self { kernel_sizes: per_layer, ..Default::default() }),
            TestVariant::new(
                format!("bidirectional k {bidirectional}"),
                Self { kernel_size: bidirectional, ..Default::default() },
            )
            .masked(),
        ]
    }
}

/// LightConv or DynamicConv (which one: whether `kernels` or `predictor` is set).
#[derive(Module, Debug)]
pub struct ConvolutionAttention {
    /// W_I, b_I, `[d, 2d]`: halved by the GLU.
    pub input: Linear,
    /// LightConv's kernels W, `[H, k]`, normalised at use; `None` for DynamicConv.
    pub kernels: Option<Param<Tensor<2>>>,
    /// DynamicConv's W_P (no bias), `[d, H·k]` (head-major: head h's taps at h·k … h·k + k − 1);
    /// `None` for LightConv.
    pub predictor: Option<Linear>,
    /// W_O, b_O, `[d, d]`.
    pub output: Linear,
    /// DropConnect on the normalised kernel weights.
    pub weight_dropout: Dropout,
    /// H.
    pub n_heads: usize,
    /// k.
    pub kernel_size: usize,
}

/// Decoding state: the last k − 1 rows of the convolution's input x (after the GLU, padding
/// zeroed), zeros before the first token, `[b, k − 1, d]`; `None` before the first call (and
/// always for k = 1).
#[derive(Debug, Clone, Default)]
pub struct ConvolutionState {
    /// The last k − 1 rows of x, `[b, k − 1, d]`; `None` before the first call and for k = 1.
    pub rows: Option<Tensor<3>>,
}

impl ConvolutionAttention {
    /// Rows the taps reach before and after a position: (k − 1, 0) causally, the paper's
    /// centred (⌊k/2⌋, ⌈k/2⌉ − 1) bidirectionally.
    pub fn reach(&self, causal: bool) -> (usize, usize) {
        let k = self.kernel_size;
        if causal { (k - 1, 0) } else { (k / 2, k - 1 - k / 2) }
    }

    /// x: GLU of the input projection, with the rows of padded positions zeroed.
    fn conv_input(&self, y: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        let x = glu(self.input.forward(y), 2);
        let [b, l, d] = x.dims();
        match &mask.padding {
            None => x,
            Some(pad) => {
                let [pb, lk] = pad.dims();
                // a mask that also covers cached keys ends with this call's rows
                assert!(lk >= l, "a padding mask of {lk} keys for {l} new positions");
                let hidden = pad.clone().narrow(1, lk - l, l).reshape([pb, l, 1]).expand([b, l, d]);
                x.mask_fill(hidden, 0.0)
            }
        }
    }

    /// x with the rows the taps read around it: the state's cached rows (or zeros) before it,
    /// zeros after it for the look-ahead. A causal call with a state stores its last k − 1 rows.
    fn padded(&self, x: Tensor<3>, causal: bool, state: Option<&mut ConvolutionState>) -> Tensor<3> {
        let [b, _, d] = x.dims();
        let device = x.device();
        let (before, after) = self.reach(causal);
        // a bidirectional output reads positions not yet decoded: no state to keep
        let mut state = if causal { state } else { None };
        let mut parts = Vec::with_capacity(3);
        if before > 0 {
            let cached = state.as_mut().and_then(|s| s.rows.take());
            parts.push(cached.unwrap_or_else(|| Tensor::zeros([b, before, d], &device)));
        }
        parts.push(x);
        if after > 0 {
            parts.push(Tensor::zeros([b, after, d], &device));
        }
        let padded = if parts.len() == 1 { parts.remove(0) } else { Tensor::cat(parts, 1) };
        if let Some(s) = state
            && before > 0
        {
            let n = padded.dims()[1];
            s.rows = Some(padded.clone().narrow(1, n - before, before));
        }
        padded
    }

    /// Channel c's kernel, ⌊c·H/d⌋, for every channel: `[d]`.
    fn channel_heads(&self, d: usize, device: &Device) -> Tensor<1, Int> {
        let heads: Vec<i64> = (0..d).map(|c| (c * self.n_heads / d) as i64).collect();
        Tensor::from_data(TensorData::new(heads, [d]), device)
    }

    /// The normalised (and dropped) kernel weights of every head: `[1, 1, H, k]` for LightConv,
    /// `[b, l, H, k]` (each position its own) for DynamicConv.
    fn weights(&self, x: &Tensor<3>) -> Tensor<4> {
        let [b, l, _] = x.dims();
        let (h, k) = (self.n_heads, self.kernel_size);
        let per_head = match (&self.kernels, &self.predictor) {
            (Some(w), _) => w.val().reshape([1, 1, h, k]),
            (None, Some(p)) => p.forward(x.clone()).reshape([b, l, h, k]),
            (None, None) => unreachable!("a convolution is built with learned or predicted kernels"),
        };
        // softmax over the taps, then DropConnect on the normalised weights (not renormalised),
        // one draw per head shared by its channels
        self.weight_dropout.forward(softmax(per_head, 3))
    }

    /// The convolution of `input.query`'s GLU, through the output projection; no weights (there
    /// are no scores). A causal call with `state` continues from and updates its cached rows.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut ConvolutionState>) -> AttentionOutput {
        assert!(
            input.key_value.is_none(),
            "lightweight and dynamic convolutions are self-attention only: a convolution has no cross form"
        );
        let x = self.conv_input(input.query, input.mask);
        let l = x.dims()[1];
        let weights = self.weights(&x);
        let padded = self.padded(x, input.mask.causal, state);
        let context = self.output.forward(self.convolve(padded, weights, l));
        AttentionOutput { context, weights: None, aux_losses: Vec::new() }
    }
}

impl ConvolutionAttention {
    /// out[i, c] = Σ_j w[i, h(c), j] · padded[i + j, c], as k shifted slices of `padded`
    /// `[b, l + k − 1, d]` (weights `[1 or b, 1 or l, H, k]`). When H divides d the channels are
    /// viewed as `[H, d/H]` and each tap multiplies by its `[.., H, 1]` weights, broadcast over
    /// the group; otherwise the weights are spread to the d channels first (a gather of
    /// `[.., d, k]`, k times more memory traffic per tap).
    fn convolve(&self, padded: Tensor<3>, weights: Tensor<4>, l: usize) -> Tensor<3> {
        let [b, _, d] = padded.dims();
        let [wb, wl, h, k] = weights.dims();
        // tap-major, so that each tap's weights are one contiguous block
        let taps = weights.clone().permute([3, 0, 1, 2]);
        let terms: Vec<Tensor<3>> = if d % h == 0 {
            let g = d / h;
            (0..k)
                .map(|j| {
                    let w = taps.clone().narrow(0, j, 1).reshape([wb, wl, h, 1]);
                    (padded.clone().narrow(1, j, l).reshape([b, l, h, g]) * w).reshape([b, l, d])
                })
                .collect()
        } else {
            let channels = weights.select(2, self.channel_heads(d, &padded.device())).permute([3, 0, 1, 2]);
            (0..k)
                .map(|j| padded.clone().narrow(1, j, l) * channels.clone().narrow(0, j, 1).reshape([wb, wl, d]))
                .collect()
        };
        terms.into_iter().reduce(|sum, t| sum + t).expect("a kernel has at least one tap")
    }
}

impl AttentionMechanism for ConvolutionAttention {
    /// Decoding state: [`ConvolutionState`] in the layer's state.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        ConvolutionAttention::forward(self, input, state.map(|s| s.get_or_default::<ConvolutionState>()))
    }

    /// Only the rows a later token reads: the GLU of the input, no convolution or output.
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        if mask.causal {
            let x = self.conv_input(x, mask);
            self.padded(x, true, Some(state.get_or_default::<ConvolutionState>()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn light(n_heads: usize, kernel_size: usize, d: usize, dev: &Device) -> ConvolutionAttention {
        let cfg = LightweightConvConfig { n_heads, kernel_size, ..Default::default() };
        cfg.validate(d).unwrap();
        cfg.init(d, 0.5, 0.5, dev)
    }

    fn dynamic(n_heads: usize, kernel_size: usize, d: usize, dev: &Device) -> ConvolutionAttention {
        let cfg = DynamicConvConfig { n_heads, kernel_size, ..Default::default() };
        cfg.validate(d).unwrap();
        cfg.init(d, 0.5, 0.5, dev)
    }

    fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn run(layer: &ConvolutionAttention, x: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        layer.forward(AttentionInput::self_attention(x, mask), None).context
    }

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn dynamic_with_a_constant_predictor_is_the_lightweight_convolution() {
        let dev = Device::flex();
        dev.seed(1);
        let (h, k, d) = (2, 3, 6);
        let light = light(h, k, d, &dev);
        let w = light.kernels.as_ref().unwrap().val();
        // W(x_i) = x_i · 0 + vec(W): every position predicts LightConv's kernels
        let constant = Linear {
            weight: Param::from_tensor(Tensor::zeros([d, h * k], &dev)),
            bias: Some(Param::from_tensor(w.clone().reshape([h * k]))),
        };
        let dynamic = ConvolutionAttention { kernels: None, predictor: Some(constant), ..light.clone() };
        // the check can fail: the two heads' kernels differ, so a wrong layout would show
        let rows = floats(w);
        assert!(rows[..k].iter().zip(&rows[k..]).any(|(a, b)| (a - b).abs() > 1e-3), "{rows:?}");
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let x = random([2, 7, d], &dev);
            let diff = max_diff(run(&light, x.clone(), &mask), run(&dynamic, x, &mask));
            assert!(diff < 1e-6, "causal {}: dynamic with constant kernels differs by {diff}", mask.causal);
        }
    }

    /// Position i's output is the lightweight convolution whose kernels are the ones predicted
    /// from x_i (the GLU input at i), read at i: each position convolves with its own kernels.
    #[test]
    fn each_position_convolves_with_the_kernels_predicted_from_it() {
        let dev = Device::flex();
        dev.seed(9);
        let (h, k, d, l) = (2, 3, 6, 5);
        let layer = dynamic(h, k, d, &dev);
        let y = random([1, l, d], &dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let out = run(&layer, y.clone(), &mask);
            let x = glu(layer.input.forward(y.clone()), 2);
            let predicted = layer.predictor.as_ref().unwrap().forward(x); // [1, l, h·k]
            let mut differs = false;
            for i in 0..l {
                let kernels = predicted.clone().narrow(1, i, 1).reshape([h, k]);
                let own = ConvolutionAttention {
                    kernels: Some(Param::from_tensor(kernels)),
                    predictor: None,
                    ..layer.clone()
                };
                let expected = run(&own, y.clone(), &mask);
                let diff = max_diff(out.clone().narrow(1, i, 1), expected.clone().narrow(1, i, 1));
                assert!(diff < 1e-5, "causal {}: position {i} differs by {diff}", mask.causal);
                // the test can fail: another position's kernels give another output at i
                if i > 0 {
                    let other = predicted.clone().narrow(1, 0, 1).reshape([h, k]);
                    let first = ConvolutionAttention {
                        kernels: Some(Param::from_tensor(other)),
                        predictor: None,
                        ..layer.clone()
                    };
                    differs |= max_diff(run(&first, y.clone(), &mask).narrow(1, i, 1), expected.narrow(1, i, 1)) > 1e-4;
                }
            }
            assert!(differs, "the predicted kernels do not depend on the position");
        }
    }

    /// The convolution written out element by element (in f64) from the layer's own GLU input
    /// and raw kernels, then the layer's output projection.
    fn naive(layer: &ConvolutionAttention, y: Tensor<3>, causal: bool, dev: &Device) -> Tensor<3> {
        let x = glu(layer.input.forward(y), 2);
        let [b, l, d] = x.dims();
        let xs = floats(x);
        let (h, k) = (layer.n_heads, layer.kernel_size);
        let raw = floats(layer.kernels.as_ref().unwrap().val());
        let mut soft = vec![0.0f64; h * k];
        for head in 0..h {
            let z: f64 = (0..k).map(|j| (raw[head * k + j] as f64).exp()).sum();
            for j in 0..k {
                soft[head * k + j] = (raw[head * k + j] as f64).exp() / z;
            }
        }
        // first tap: i − k + 1 causally, i − ⌊k/2⌋ bidirectionally
        let back = (if causal { k - 1 } else { k / 2 }) as i64;
        let mut out = vec![0.0f32; b * l * d];
        for bi in 0..b {
            for i in 0..l {
                for c in 0..d {
                    let head = c * h / d;
                    let mut sum = 0.0f64;
                    for j in 0..k {
                        let at = i as i64 - back + j as i64;
                        if (0..l as i64).contains(&at) {
                            sum += soft[head * k + j] * xs[(bi * l + at as usize) * d + c] as f64;
                        }
                    }
                    out[(bi * l + i) * d + c] = sum as f32;
                }
            }
        }
        layer.output.forward(Tensor::from_data(TensorData::new(out, [b, l, d]), dev))
    }

    #[test]
    fn lightweight_convolution_equals_the_loop_over_taps() {
        // 2 heads over 5 channels: channels 0–2 take kernel 0, channels 3–4 kernel 1
        let dev = Device::flex();
        dev.seed(2);
        for (k, causal) in [(3, true), (3, false), (4, false)] {
            let layer = light(2, k, 5, &dev);
            let x = random([2, 6, 5], &dev);
            let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let diff = max_diff(run(&layer, x.clone(), &mask), naive(&layer, x, causal, &dev));
            assert!(diff < 1e-5, "k {k}, causal {causal}: differs from the loop by {diff}");
        }
    }

    #[test]
    fn causal_outputs_ignore_later_rows() {
        let dev = Device::flex();
        dev.seed(3);
        let (l, d, t) = (8, 6, 4);
        for layer in [light(2, 3, d, &dev), dynamic(3, 3, d, &dev), dynamic(2, 11, d, &dev)] {
            let mask = AttentionMask::causal();
            let x = random([2, l, d], &dev);
            let changed = x.clone().slice_assign([0..2, t..t + 1, 0..d], random([2, 1, d], &dev));
            let (a, b) = (run(&layer, x, &mask), run(&layer, changed, &mask));
            let before = |o: Tensor<3>| o.slice([0..2, 0..t, 0..d]).into_data();
            assert_eq!(before(a.clone()), before(b.clone()), "k {}: outputs before t moved", layer.kernel_size);
            let at = |o: Tensor<3>| o.slice([0..2, t..t + 1, 0..d]);
            assert!(max_diff(at(a), at(b)) > 1e-4, "k {}: the output at t ignored its row", layer.kernel_size);
        }
    }

    /// Decodes `x` through the state in calls of `sizes` rows.
    fn decode(layer: &ConvolutionAttention, x: Tensor<3>, sizes: &[usize]) -> Tensor<3> {
        let mut state = ConvolutionState::default();
        let mut start = 0;
        let mut parts = Vec::new();
        for &n in sizes {
            let mask = AttentionMask::causal().at(start, 0);
            let rows = x.clone().narrow(1, start, n);
            parts.push(layer.forward(AttentionInput::self_attention(rows, &mask), Some(&mut state)).context);
            start += n;
        }
        Tensor::cat(parts, 1)
    }

    #[test]
    fn decoding_through_the_state_equals_the_full_forward() {
        let dev = Device::flex();
        dev.seed(4);
        let (l, d) = (7, 6);
        let layers = [light(2, 3, d, &dev), light(3, 9, d, &dev), dynamic(2, 3, d, &dev), dynamic(3, 9, d, &dev)];
        for layer in layers {
            let x = random([2, l, d], &dev);
            let full = run(&layer, x.clone(), &AttentionMask::causal());
            for sizes in [vec![1; l], vec![3, 1, 1, 1, 1], vec![2, 4, 1]] {
                let diff = max_diff(full.clone(), decode(&layer, x.clone(), &sizes));
                assert!(diff < 1e-5, "k {}, calls {sizes:?}: decoding differs by {diff}", layer.kernel_size);
            }
        }
    }

    #[test]
    fn a_padded_key_changes_no_other_output() {
        let dev = Device::flex();
        dev.seed(5);
        let (l, d, p) = (6, 6, 2);
        // row 0 has a padded position p; row 1 none
        let hidden: Vec<bool> = (0..2 * l).map(|i| i == p).collect();
        let padding = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [2, l]), &dev);
        let at_p = padding.clone().reshape([2, l, 1]).expand([2, l, d]);
        for layer in [light(2, 3, d, &dev), dynamic(2, 3, d, &dev)] {
            for plain in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                let masked = plain.clone().with_padding(padding.clone());
                let x = random([2, l, d], &dev);
                let changed = x.clone().slice_assign([0..1, p..p + 1, 0..d], random([1, 1, d], &dev));
                let others = |o: Tensor<3>| o.mask_fill(at_p.clone(), 0.0);
                let out = |x: Tensor<3>, mask: &AttentionMask| others(run(&layer, x, mask));
                let diff = max_diff(out(x.clone(), &masked), out(changed.clone(), &masked));
                assert!(diff < 1e-6, "causal {}: a padded key moved other outputs by {diff}", plain.causal);
                // without the mask the same change reaches its neighbours: the check can fail
                let seen = max_diff(out(x, &plain), out(changed, &plain));
                assert!(seen > 1e-4, "causal {}: the unpadded key reached no output", plain.causal);
            }
        }
    }

    #[test]
    fn settings_are_checked_by_name() {
        let err = |cfg: LightweightConvConfig| cfg.validate(8).unwrap_err().to_string();
        assert!(err(LightweightConvConfig { kernel_size: 0, ..Default::default() }).contains("kernel_size = 0"));
        assert!(err(LightweightConvConfig { n_heads: 9, ..Default::default() }).contains("model.attention.n_heads"));
        assert!(err(LightweightConvConfig { n_heads: 0, ..Default::default() }).contains("model.attention.n_heads"));
        let zero_in_layer = LightweightConvConfig { kernel_sizes: vec![3, 0], ..Default::default() };
        assert!(err(zero_in_layer).contains("kernel_sizes[1] = 0"));
        let layered = DynamicConvConfig { kernel_sizes: vec![3, 15], ..Default::default() };
        assert_eq!((layered.for_layer(1).kernel_size, layered.per_layer()), (15, 2));
    }
}
