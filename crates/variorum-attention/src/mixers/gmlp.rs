//! gMLP's spatial gating unit (Liu, Dai, So, Le 2021, "Pay Attention to MLPs"), the `gmlp` kind:
//! a token mixer without attention. With the layer's input x (the block's normed residual
//! stream):
//!
//! Z = GELU(x U),   [Z₁; Z₂] = Z split along the channels,
//! s(Z) = Z₁ ⊙ (W · LayerNorm(Z₂) + b),   W ∈ ℝ^{ℓ×ℓ}, b ∈ ℝ^ℓ (one row and one bias per position),
//! y = s(Z) V,
//!
//! where W mixes positions (the spatial projection) and ℓ is the model's context. aMLP
//! (`tiny_attention = d_attn`, the paper's §4.3) adds a tiny single-head attention of x to the
//! gate: s(Z) = Z₁ ⊙ (W · LayerNorm(Z₂) + b + softmax(q kᵀ/√d_attn + M) v W_o), with
//! [q; k; v] = x W_qkv ∈ ℝ^{3·d_attn} and W_o: d_attn → d_ffn/2.
//!
//! Choices where the paper leaves one open:
//! - Causal form (the paper's §5 language models): W is masked like attention scores — entries
//!   W_ij with key j after query i (and padded keys, custom patterns) are zeroed, so the mixer is
//!   lower-triangular. The tiny attention is masked the same way.
//! - Placement: the layer sits in a block's attention slot, inside its residual and norm; the
//!   paper's gMLP block has no separate feed-forward layer (U and V are its channel MLP), so a
//!   config that wants the paper's block keeps the block's FFN small or compares per parameter.
//!   The tiny attention reads the same normed x as U (the paper draws it from the block input).
//! - Width: d_ffn = `d_ffn`, 2·d_model by default (the paper uses 6·d_model with no other FFN);
//!   Z₁ and Z₂ are d_ffn/2 wide each (d_ffn must be even).
//! - Initialisation: the paper asks W "near zero" and b = 1, so s(Z) ≈ Z₁ and each layer starts
//!   as a plain channel MLP; W ~ U(−ε, ε) with ε = 10⁻³/ℓ is our choice of "near zero" (as a
//!   widely used reimplementation has it). U, V, W_qkv, W_o normal with the model's scales.
//! - Positions: W is a table of absolute positions (`variable_length: false`): a relative scheme
//!   has no scores to act on, a memory no rows before the segment. Positions past ℓ read the
//!   table's last row and column (only a library user running the module past the model's
//!   context reaches them; a run refuses such a length).
//! - Decoding keeps LayerNorm(Z₂) of every position so far (and the tiny attention's keys and
//!   values); each new position forms its row of W over them: O(ℓ·d_ffn) per token, as a KV cache.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections::take;
use crate::engine::qkv::{normal_linear, split_heads};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// `model.attention` with `kind = "gmlp"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GmlpConfig {
    /// d_ffn, the width of U's output (Z₁ and Z₂ are half of it each); even. Default
    /// 2·d_model.
    pub d_ffn: Option<usize>,
    /// aMLP: the width d_attn of a tiny single-head attention added to the gate (the paper
    /// uses 64). Default none (gMLP).
    pub tiny_attention: Option<usize>,
    /// Biases in U, V and the tiny attention's projections. Default true.
    pub bias: bool,
}

impl Default for GmlpConfig {
    fn default() -> Self {
        Self { d_ffn: None, tiny_attention: None, bias: true }
    }
}

impl GmlpConfig {
    /// d_ffn for a model of width `d_model`: the config's, else 2·d_model.
    pub fn d_ffn(&self, d_model: usize) -> usize {
        self.d_ffn.unwrap_or(2 * d_model)
    }

    /// `context` is ℓ, the positions the spatial projection covers (the model's context).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, context: usize, device: &Device) -> GmlpAttention {
        let d_ffn = self.d_ffn(d_model);
        let half = d_ffn / 2;
        let context = context.max(1);
        let eps = 1e-3 / context as f64;
        let tiny = self.tiny_attention.map(|d_attn| TinyAttention {
            qkv: normal_linear(d_model, 3 * d_attn, self.bias, init_std, device),
            out: normal_linear(d_attn, half, self.bias, out_std, device),
            d_attn,
        });
        GmlpAttention {
            up: normal_linear(d_model, d_ffn, self.bias, init_std, device),
            norm_gamma: Param::from_tensor(Tensor::ones([half], device)),
            norm_beta: Param::from_tensor(Tensor::zeros([half], device)),
            spatial: Param::from_tensor(Tensor::random([context, context], Distribution::Uniform(-eps, eps), device)),
            spatial_bias: Param::from_tensor(Tensor::ones([context], device)),
            tiny,
            down: normal_linear(half, d_model, self.bias, out_std, device),
        }
    }
}

impl AttentionKind for GmlpConfig {
    type Module = GmlpAttention;
    const SUMMARY: &'static str = "gMLP's spatial gating unit: Z₁ ⊙ (W·LayerNorm(Z₂) + b) with a learned ℓ × ℓ position-mixing W (lower-triangular when causal), no attention; aMLP adds a tiny single-head attention to the gate";
    const PAPER: &'static str = "Liu, Dai, So, Le 2021, Pay Attention to MLPs";
    // a table of absolute positions: no relative scheme, no memory, contexts up to ℓ
    const CAPS: Capabilities = Capabilities { reads_memory: false, variable_length: false, ..caps::NO_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { d_ffn: Some(self.d_ffn(d_model)), ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        let d_ffn = self.d_ffn(d_model);
        check(d_ffn >= 2 && d_ffn % 2 == 0, || {
            format!("model.attention.d_ffn = {d_ffn} must be even and at least 2 (Z₁ and Z₂ are half of it each)")
        })?;
        check(self.tiny_attention != Some(0), || "model.attention.tiny_attention must be at least 1".into())
    }

    /// This call's `[len_q, len_k]` block of W (and aMLP's scores).
    fn scores_every_key(&self) -> bool {
        true
    }

    /// U, V, the spatial row over `len_k` positions and the tiny attention.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let (d, f, l) = (d_model as u64, self.d_ffn(d_model) as u64, len_k as u64);
        let tiny = self.tiny_attention.map_or(0, |a| {
            let a = a as u64;
            3 * d * a + 2 * a * l + a * f / 2
        });
        2 * (d * f + f / 2 * d + f / 2 * l + tiny)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> GmlpAttention {
        self.init(init.d_model, init.init_std, init.out_std, init.position.context, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let amlp = Self { tiny_attention: Some(8), ..Default::default() };
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new("amlp", amlp.clone()),
            TestVariant::new("amlp bidirectional", amlp).masked(),
        ]
    }
}

/// aMLP's single-head attention, added to the spatial gate.
#[derive(Module, Debug)]
pub struct TinyAttention {
    /// W_qkv, `[d_model, 3 · d_attn]`.
    pub qkv: Linear,
    /// W_o, `[d_attn, d_ffn / 2]`.
    pub out: Linear,
    /// d_attn, the width of the single head.
    pub d_attn: usize,
}

impl TinyAttention {
    /// softmax(q kᵀ/√d_attn + M) v W_o for queries `x: [b, len_q, d_model]`, keys and values
    /// after `cache`'s, hidden where `hidden` says.
    fn forward(&self, x: Tensor<3>, hidden: Option<Tensor<3, Bool>>, cache: Option<&mut KvCache>) -> Tensor<3> {
        let [b, lq, _] = x.dims();
        let mut qkv = split_heads(self.qkv.forward(x), 3, 1, self.d_attn);
        let (v, k, q) = (qkv.remove(2), qkv.remove(1), qkv.remove(0));
        let (k, v) = match cache {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(1.0 / (self.d_attn as f64).sqrt());
        let scores = match hidden {
            Some(m) => {
                let shape = scores.dims();
                scores.mask_fill(m.unsqueeze_dim::<4>(1).expand(shape), MASKED_SCORE)
            }
            None => scores,
        };
        self.out.forward(softmax(scores, 3).matmul(v).reshape([b, lq, self.d_attn]))
    }
}

/// gMLP's spatial gating unit, y = s(Z) V; with aMLP's tiny attention added to the gate when set.
#[derive(Module, Debug)]
pub struct GmlpAttention {
    /// U, `[d_model, d_ffn]`.
    pub up: Linear,
    /// LayerNorm(Z₂)'s γ and β, `[d_ffn / 2]`.
    pub norm_gamma: Param<Tensor<1>>,
    /// β, `[d_ffn / 2]` (starts at 0).
    pub norm_beta: Param<Tensor<1>>,
    /// W, `[ℓ, ℓ]` (query position, key position).
    pub spatial: Param<Tensor<2>>,
    /// b, `[ℓ]` (per query position).
    pub spatial_bias: Param<Tensor<1>>,
    /// aMLP's tiny attention.
    pub tiny: Option<TinyAttention>,
    /// V, `[d_ffn / 2, d_model]`.
    pub down: Linear,
}

/// Decoding state: LayerNorm(Z₂) of every position so far (in the values of a [`KvCache`],
/// whose keys are a one-column placeholder) and the tiny attention's keys and values.
#[derive(Debug, Clone, Default)]
pub struct GmlpState {
    /// LayerNorm(Z₂) of every position so far, the values `[b, 1, len, d_ffn / 2]`.
    pub gate: KvCache,
    /// The tiny attention's keys and values, `[b, 1, len, d_attn]`; empty without aMLP.
    pub tiny: KvCache,
}

impl GmlpAttention {
    /// ℓ, the positions W covers.
    pub fn context(&self) -> usize {
        self.spatial_bias.val().dims()[0]
    }

    /// The unit over `input.query`, W masked like scores by `input.mask`; no weights. With `state`
    /// the new positions' rows of W also read the positions it keeps, and it keeps theirs.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut GmlpState>) -> AttentionOutput {
        let AttentionInput { query: x, mask, .. } = input;
        let [b, lq, _] = x.dims();
        let device = x.device();
        let z = variorum_kernels::gelu::gelu(self.up.forward(x.clone()));
        let half = z.dims()[2] / 2;
        let z1 = z.clone().narrow(2, 0, half);
        let z2 = variorum_kernels::layer_norm::layer_norm(
            z.narrow(2, half, half),
            self.norm_gamma.val(),
            Some(self.norm_beta.val()),
            1e-5,
        );
        let (mut gate_cache, mut tiny_cache) = match state {
            Some(s) => (Some(&mut s.gate), Some(&mut s.tiny)),
            None => (None, None),
        };
        let dropped = gate_cache.as_ref().map_or(0, |c| c.start);
        let z2 = match gate_cache.as_deref_mut() {
            Some(c) => c.append(Tensor::zeros([b, 1, lq, 1], &device), z2.unsqueeze_dim(1)).1.squeeze_dim::<3>(1),
            None => z2,
        };
        let lk = z2.dims()[1];
        let mask = AttentionMask { k_start: mask.k_start + dropped, ..mask.clone() };
        let hidden = mask.score_mask(lq, lk, &device).map(|m| m.squeeze_dim::<3>(1));
        // this call's block of W: rows at the queries' positions, columns at the keys'
        let w = take(take(self.spatial.val(), 0, mask.q_start, lq), 1, mask.k_start, lk).unsqueeze_dim::<3>(0);
        let w = match &hidden {
            Some(m) => {
                let shape = [m.dims()[0], lq, lk];
                w.expand(shape).mask_fill(m.clone(), 0.0)
            }
            None => w,
        };
        let w = if w.dims()[0] == b { w } else { w.expand([b, lq, lk]) };
        let bias = take(self.spatial_bias.val(), 0, mask.q_start, lq).reshape([1, lq, 1]);
        let mut gate = w.matmul(z2) + bias;
        if let Some(tiny) = &self.tiny {
            gate = gate + tiny.forward(x, hidden, tiny_cache.as_deref_mut());
        }
        AttentionOutput { context: self.down.forward(z1 * gate), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for GmlpAttention {
    /// Decoding state: [`GmlpState`].
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        GmlpAttention::forward(self, input, state.map(|s| s.get_or_default::<GmlpState>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::gelu;

    const D: usize = 8;
    const CONTEXT: usize = 6;

    fn layer(cfg: &GmlpConfig, dev: &Device) -> GmlpAttention {
        cfg.validate(D).unwrap();
        dev.seed(7);
        cfg.init(D, 0.3, 0.3, CONTEXT, dev)
    }

    fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn run(layer: &GmlpAttention, x: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        layer.forward(AttentionInput::self_attention(x, mask), None).context
    }

    /// With W = 0 and b = 1 (the paper's initialisation, exactly), s(Z) = Z₁: the layer is the
    /// channel MLP GELU(x U)₁ V of each position alone.
    #[test]
    fn zero_spatial_weights_leave_a_channel_mlp() {
        let dev = Device::flex();
        let mut l = layer(&GmlpConfig::default(), &dev);
        l.spatial = Param::from_tensor(Tensor::zeros([CONTEXT, CONTEXT], &dev));
        let x = random([2, CONTEXT, D], &dev);
        let y = run(&l, x.clone(), &AttentionMask::bidirectional());
        let z1 = gelu(l.up.forward(x)).narrow(2, 0, D);
        let expected = l.down.forward(z1);
        assert!((y - expected).abs().max().into_scalar::<f32>() < 1e-5);
    }

    /// Row i of the output is V(Z₁ᵢ ⊙ (Σ_{j ≤ i} W_ij LN(Z₂)ⱼ + bᵢ)): the causal mixing written
    /// out one query at a time.
    #[test]
    fn causal_mixing_is_the_lower_triangle_of_w() {
        let dev = Device::flex();
        let mut l = layer(&GmlpConfig::default(), &dev);
        l.spatial = Param::from_tensor(Tensor::random([CONTEXT, CONTEXT], Distribution::Normal(0.0, 1.0), &dev));
        let x = random([1, CONTEXT, D], &dev);
        let y = run(&l, x.clone(), &AttentionMask::causal());
        let z = gelu(l.up.forward(x));
        let z2 = variorum_kernels::layer_norm::layer_norm(
            z.clone().narrow(2, D, D),
            l.norm_gamma.val(),
            Some(l.norm_beta.val()),
            1e-5,
        );
        let w = l.spatial.val();
        for i in 0..CONTEXT {
            let row = w.clone().narrow(0, i, 1).narrow(1, 0, i + 1).unsqueeze_dim::<3>(0); // [1, 1, i + 1]
            let mixed =
                row.matmul(z2.clone().narrow(1, 0, i + 1)) + l.spatial_bias.val().narrow(0, i, 1).reshape([1, 1, 1]);
            let expected = l.down.forward(z.clone().narrow(1, i, 1).narrow(2, 0, D) * mixed);
            let got = y.clone().narrow(1, i, 1);
            assert!((got - expected).abs().max().into_scalar::<f32>() < 1e-5, "row {i}");
        }
    }

    /// aMLP's gate written out one query at a time: s(Z)ᵢ = Z₁ᵢ ⊙ (Σ_{j ≤ i} W_ij LN(Z₂)ⱼ + bᵢ +
    /// Σ_{j ≤ i} softmax_j(qᵢ·kⱼ/√d_attn) vⱼ W_o), with [q; k; v] = x W_qkv in that order.
    #[test]
    fn the_tiny_attention_adds_a_causal_single_head_softmax_to_the_gate() {
        let dev = Device::flex();
        let d_attn = 4;
        let mut l = layer(&GmlpConfig { tiny_attention: Some(d_attn), ..Default::default() }, &dev);
        l.spatial = Param::from_tensor(Tensor::random([CONTEXT, CONTEXT], Distribution::Normal(0.0, 1.0), &dev));
        let x = random([1, CONTEXT, D], &dev);
        let y = run(&l, x.clone(), &AttentionMask::causal());
        let z = gelu(l.up.forward(x.clone()));
        let z2 = variorum_kernels::layer_norm::layer_norm(
            z.clone().narrow(2, D, D),
            l.norm_gamma.val(),
            Some(l.norm_beta.val()),
            1e-5,
        );
        let tiny = l.tiny.as_ref().unwrap();
        let qkv = tiny.qkv.forward(x);
        let part = |p: usize, i: usize| qkv.clone().narrow(1, i, 1).narrow(2, p * d_attn, d_attn).reshape([d_attn]);
        for i in 0..CONTEXT {
            let scores: Vec<f32> = (0..=i)
                .map(|j| (part(0, i) * part(1, j)).sum().into_scalar::<f32>() / (d_attn as f32).sqrt())
                .collect();
            let top = scores.iter().copied().fold(f32::MIN, f32::max);
            let total: f32 = scores.iter().map(|s| (s - top).exp()).sum();
            let read =
                (0..=i).map(|j| part(2, j).mul_scalar((scores[j] - top).exp() / total)).reduce(|a, b| a + b).unwrap();
            let attended = tiny.out.forward(read.reshape([1, 1, d_attn]));
            let row = l.spatial.val().narrow(0, i, 1).narrow(1, 0, i + 1).unsqueeze_dim::<3>(0);
            let mixed =
                row.matmul(z2.clone().narrow(1, 0, i + 1)) + l.spatial_bias.val().narrow(0, i, 1).reshape([1, 1, 1]);
            let expected = l.down.forward(z.clone().narrow(1, i, 1).narrow(2, 0, D) * (mixed + attended));
            let got = y.clone().narrow(1, i, 1);
            assert!((got - expected).abs().max().into_scalar::<f32>() < 1e-5, "row {i}");
        }
    }

    /// Decoding one position at a time (aMLP, so both caches are used) equals the full forward.
    #[test]
    fn decoding_equals_the_forward() {
        let dev = Device::flex();
        let l = layer(&GmlpConfig { tiny_attention: Some(4), ..Default::default() }, &dev);
        let x = random([2, CONTEXT, D], &dev);
        let full = run(&l, x.clone(), &AttentionMask::causal());
        let mut state = GmlpState::default();
        for i in 0..CONTEXT {
            let mask = AttentionMask { q_start: i, ..AttentionMask::causal() };
            let y =
                l.forward(AttentionInput::self_attention(x.clone().narrow(1, i, 1), &mask), Some(&mut state)).context;
            let diff = (y - full.clone().narrow(1, i, 1)).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "position {i}: {diff}");
        }
    }

    #[test]
    fn settings_are_checked_by_key() {
        let odd = GmlpConfig { d_ffn: Some(7), ..Default::default() }.validate(D).unwrap_err().0;
        assert!(odd.contains("model.attention.d_ffn = 7"), "{odd}");
        let tiny = GmlpConfig { tiny_attention: Some(0), ..Default::default() }.validate(D).unwrap_err().0;
        assert!(tiny.contains("model.attention.tiny_attention"), "{tiny}");
    }

    /// A padded position changes no other output (through W or the tiny attention); unpadded,
    /// the same change does.
    #[test]
    fn a_padded_position_changes_no_other_output() {
        let dev = Device::flex();
        let mut l = layer(&GmlpConfig { tiny_attention: Some(4), ..Default::default() }, &dev);
        l.spatial = Param::from_tensor(Tensor::random([CONTEXT, CONTEXT], Distribution::Normal(0.0, 1.0), &dev));
        let x = random([1, CONTEXT, D], &dev);
        let changed = x.clone().slice_assign([0..1, 2..3, 0..D], Tensor::ones([1, 1, D], &dev));
        let pad: Vec<bool> = (0..CONTEXT).map(|i| i == 2).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [1, CONTEXT]), &dev);
        let others = |y: Tensor<3>| Tensor::cat(vec![y.clone().narrow(1, 0, 2), y.narrow(1, 3, CONTEXT - 3)], 1);
        for causal in [false, true] {
            let open = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let padded = AttentionMask { padding: Some(pad.clone()), ..open.clone() };
            let diff = |mask: &AttentionMask| {
                let (a, b) = (run(&l, x.clone(), mask), run(&l, changed.clone(), mask));
                (others(a) - others(b)).abs().max().into_scalar::<f32>()
            };
            assert_eq!(diff(&padded), 0.0, "causal {causal}");
            assert!(diff(&open) > 1e-3, "causal {causal}: the change must show without padding");
        }
    }
}
