//! MLP-Mixer's token-mixing MLP (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for
//! Vision", eq. (1)), the `mlp-mixer` kind: every channel c of the layer's input X ∈ ℝ^{ℓ×d} goes
//! through one MLP along the positions, shared by the channels,
//!
//! Y_{·,c} = W₂ GELU(W₁ X_{·,c} + b₁) + b₂,   W₁ ∈ ℝ^{D_S×ℓ}, W₂ ∈ ℝ^{ℓ×D_S},
//!
//! while the block's feed-forward layer is the paper's channel-mixing MLP.
//!
//! Choices where the paper leaves one open (it has no causal form: images have no order):
//! - Causal form, by masked weights as in MADE (Germain, Gregor, Murray, Larochelle 2015): hidden
//!   unit k gets the degree m(k) = ⌊k·ℓ/D_S⌋; W₁[k, j] is kept only for positions j ≤ m(k) and
//!   W₂[i, k] only for m(k) ≤ i. Output i then depends on inputs at positions ≤ i alone, and
//!   with D_S ≥ ℓ (the default D_S = ℓ) on every one of them: each position has a unit of its own
//!   degree. With D_S < ℓ some degrees have no unit, and output i reads only the positions up to
//!   the largest degree ≤ i: it misses its latest inputs, the ones a next-token model needs
//!   most, so keep D_S ≥ ℓ for next-token models (MADE's own trade-off, accepted, not refused).
//! - D_S = `d_token`, the model's context ℓ by default.
//! - Positions are absolute (columns of W₁, rows of W₂: `variable_length: false`); a shorter
//!   sequence uses the first columns and rows, as if padded with zeros to ℓ. Padded positions
//!   are zeroed before the MLP; a custom mask pattern cannot be expressed by an MLP over
//!   positions and is not read. Positions past ℓ read the last row and column (only a library
//!   user running the module past the model's context reaches them).
//! - Initialisation: W₁, W₂ normal with the model's scales (W₂ with the residual output's), zero
//!   biases.
//! - Decoding keeps W₁X, the hidden units' sums over the positions so far ([`MixerState`]):
//!   each new position adds its column and reads the complete units, O(D_S·d) per token.

use burn::module::Param;
use burn::nn::Initializer;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::projections::take;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// `model.attention` with `kind = "mlp-mixer"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MlpMixerConfig {
    /// D_S, the hidden width of the token-mixing MLP. Default: the model's context ℓ.
    pub d_token: Option<usize>,
}

impl Default for MlpMixerConfig {
    fn default() -> Self {
        Self { d_token: None }
    }
}

impl MlpMixerConfig {
    /// D_S for a context of ℓ = `context` positions: the config's, else ℓ.
    pub fn d_token(&self, context: usize) -> usize {
        self.d_token.unwrap_or(context.max(1))
    }

    /// `context` is ℓ, the positions the MLP spans (the model's context).
    pub fn init(&self, init_std: f64, out_std: f64, context: usize, device: &Device) -> MlpMixerAttention {
        let context = context.max(1);
        let hidden = self.d_token(context);
        let normal = |shape: [usize; 2], std| Initializer::Normal { mean: 0.0, std }.init(shape, device);
        MlpMixerAttention {
            token_in: normal([hidden, context], init_std),
            token_in_bias: Param::from_tensor(Tensor::zeros([hidden], device)),
            token_out: normal([context, hidden], out_std),
            token_out_bias: Param::from_tensor(Tensor::zeros([context], device)),
        }
    }
}

impl AttentionKind for MlpMixerConfig {
    type Module = MlpMixerAttention;
    const SUMMARY: &'static str = "MLP-Mixer's token-mixing MLP: W₂ GELU(W₁ X + b₁) + b₂ along the positions, shared by the channels; causal by MADE-masked weights (hidden unit k of degree m(k) reads positions ≤ m(k), feeds positions ≥ m(k))";
    const PAPER: &'static str = "Tolstikhin et al. 2021, MLP-Mixer: An all-MLP Architecture for Vision";
    // weights over absolute positions: no relative scheme, no memory, contexts up to ℓ
    const CAPS: Capabilities = Capabilities { reads_memory: false, variable_length: false, ..caps::NO_SCORES };

    fn validate(&self, _d_model: usize) -> Result<(), ConfigError> {
        check(self.d_token != Some(0), || "model.attention.d_token must be at least 1".into())
    }

    /// Both layers of the MLP, per channel: D_S hidden units over `len_k` positions (the model's
    /// context when `d_token` is unset).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let hidden = self.d_token(len_k) as u64;
        // W₁ X costs D_S·ℓ·d for ℓ tokens, W₂ H ℓ·D_S·d: 2·D_S·d multiply–adds per token
        2 * 2 * hidden * d_model as u64
    }

    fn build(&self, init: &LayerInit, device: &Device) -> MlpMixerAttention {
        self.init(init.init_std, init.out_std, init.position.context, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new("fewer hidden units than positions", Self { d_token: Some(3) }),
            TestVariant::new("bidirectional", Self::default()).masked(),
        ]
    }
}

/// MLP-Mixer's token-mixing MLP, W₂ GELU(W₁ X + b₁) + b₂ along the positions, shared by the
/// channels; MADE-masked when causal.
#[derive(Module, Debug)]
pub struct MlpMixerAttention {
    /// W₁, `[D_S, ℓ]`.
    pub token_in: Param<Tensor<2>>,
    /// b₁, `[D_S]`.
    pub token_in_bias: Param<Tensor<1>>,
    /// W₂, `[ℓ, D_S]`.
    pub token_out: Param<Tensor<2>>,
    /// b₂, `[ℓ]`.
    pub token_out_bias: Param<Tensor<1>>,
}

/// m(k) = ⌊k·ℓ/D_S⌋, the last position hidden unit k reads and the first it feeds.
fn degrees(hidden: usize, context: usize) -> Vec<usize> {
    (0..hidden).map(|k| k * context / hidden).collect()
}

/// Decoding state: W₁ X of the positions so far, `[b, D_S, d]` (before b₁ and the GELU). A
/// hidden unit of degree m(k) is complete once position m(k) has arrived, and only the outputs
/// at positions ≥ m(k) read it, so each new position adds its column and reads the sums:
/// O(D_S·d) per token, whatever the context.
#[derive(Debug, Clone, Default)]
pub struct MixerState {
    /// W₁ X of the positions so far, `[b, D_S, d]`; `None` before the first call.
    pub sums: Option<Tensor<3>>,
}

impl MlpMixerAttention {
    /// Decoding: the new rows' columns added to `state`'s sums, the new rows' outputs read from
    /// them (the rows are those of a causal self-attention call, at `mask.q_start`).
    pub fn forward(&self, input: AttentionInput, state: Option<&mut MixerState>) -> AttentionOutput {
        let AttentionInput { query: x, mask, .. } = input;
        let lq = x.dims()[1];
        let device = x.device();
        let [hidden, context] = self.token_in.val().dims();
        // decoding reads only this call's rows (the sums hold the earlier ones), at the queries'
        // positions; padding, when given, covers every key so far and ends with them
        let x = match (&mask.padding, &state) {
            (Some(pad), Some(_)) => {
                let n = pad.dims()[1];
                crate::engine::projections::zero_padding(x, Some(&pad.clone().narrow(1, n - lq, lq)))
            }
            (pad, _) => crate::engine::projections::zero_padding(x, pad.as_ref()),
        };
        let lk = x.dims()[1];
        let q_start = mask.q_start;
        let k_start = if state.is_some() { q_start } else { mask.k_start };
        let mut w1 = take(self.token_in.val(), 1, k_start, lk); // [D_S, lk]
        let mut w2 = take(self.token_out.val(), 0, q_start, lq); // [lq, D_S]
        if mask.causal {
            let m: Vec<i64> = degrees(hidden, context).into_iter().map(|m| m as i64).collect();
            let m = Tensor::<1, Int>::from_data(TensorData::new(m, [hidden]), &device);
            let positions =
                |start: usize, len: usize| Tensor::<1, Int>::arange(start as i64..(start + len) as i64, &device);
            // W₁[k, j] reads no key after m(k); W₂[i, k] feeds no query before m(k)
            let after = positions(k_start, lk).unsqueeze_dim::<2>(0).expand([hidden, lk]);
            w1 = w1.mask_fill(after.greater(m.clone().unsqueeze_dim::<2>(1).expand([hidden, lk])), 0.0);
            let before = positions(q_start, lq).unsqueeze_dim::<2>(1).expand([lq, hidden]);
            w2 = w2.mask_fill(m.unsqueeze_dim::<2>(0).expand([lq, hidden]).greater(before), 0.0);
        }
        let mut sums = w1.unsqueeze_dim::<3>(0).matmul(x); // [b, D_S, d]
        if let Some(s) = state {
            if let Some(earlier) = s.sums.take() {
                sums = sums + earlier;
            }
            s.sums = Some(sums.clone());
        }
        let h = variorum_kernels::gelu::gelu(sums + self.token_in_bias.val().reshape([1, hidden, 1]));
        let y =
            w2.unsqueeze_dim::<3>(0).matmul(h) + take(self.token_out_bias.val(), 0, q_start, lq).reshape([1, lq, 1]);
        AttentionOutput { context: y, weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for MlpMixerAttention {
    /// Decoding state: [`MixerState`].
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        MlpMixerAttention::forward(self, input, state.map(|s| s.get_or_default::<MixerState>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    const D: usize = 4;
    const CONTEXT: usize = 7;

    fn layer(cfg: MlpMixerConfig, dev: &Device) -> MlpMixerAttention {
        dev.seed(11);
        cfg.init(0.5, 0.5, CONTEXT, dev)
    }

    /// Eq. (1) written out entry by entry, Y[i, c] = Σ_k W₂[i, k] GELU(Σ_j W₁[k, j] X[j, c] + b₁[k]) + b₂[i],
    /// with biases away from zero: bidirectionally over every (j, k, i), causally over the MADE
    /// masks' (j ≤ m(k) ≤ i, m(k) = ⌊k·ℓ/D_S⌋; 3 units of degrees 0, 2, 4). The GELU is burn's
    /// (erf), not the layer's kernel.
    #[test]
    fn the_token_mixing_mlp_is_equation_one_by_hand() {
        let dev = Device::flex();
        for (d_token, causal) in [(None, false), (Some(3), true), (None, true)] {
            let mut l = layer(MlpMixerConfig { d_token }, &dev);
            let hidden = MlpMixerConfig { d_token }.d_token(CONTEXT);
            l.token_in_bias = Param::from_tensor(Tensor::random([hidden], Distribution::Normal(0.0, 1.0), &dev));
            l.token_out_bias = Param::from_tensor(Tensor::random([CONTEXT], Distribution::Normal(0.0, 1.0), &dev));
            let host1 = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
            let host2 = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
            let (w1, w2) = (host2(l.token_in.val()), host2(l.token_out.val()));
            let (b1, b2) = (host1(l.token_in_bias.val()), host1(l.token_out_bias.val()));
            let x = Tensor::<3>::random([1, CONTEXT, D], Distribution::Normal(0.0, 1.0), &dev);
            let xs = x.clone().into_data().try_to_vec::<f32>().unwrap();
            let m = degrees(hidden, CONTEXT);
            let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let got = l.forward(AttentionInput::self_attention(x, &mask), None).context;
            // the pre-activations by hand, then burn's GELU, then the second layer by hand
            let mut pre = vec![0f32; hidden * D];
            for k in 0..hidden {
                for c in 0..D {
                    let visible = (0..CONTEXT).filter(|&j| !causal || j <= m[k]);
                    pre[k * D + c] = visible.map(|j| w1[k * CONTEXT + j] * xs[j * D + c]).sum::<f32>() + b1[k];
                }
            }
            let h = burn::tensor::activation::gelu(Tensor::<2>::from_data(TensorData::new(pre, [hidden, D]), &dev));
            let h = host2(h);
            let mut want = vec![0f32; CONTEXT * D];
            for i in 0..CONTEXT {
                for c in 0..D {
                    let feeding = (0..hidden).filter(|&k| !causal || m[k] <= i);
                    want[i * D + c] = feeding.map(|k| w2[i * hidden + k] * h[k * D + c]).sum::<f32>() + b2[i];
                }
            }
            let want = Tensor::<3>::from_data(TensorData::new(want, [1, CONTEXT, D]), &dev);
            let diff = (got - want).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-4, "d_token {d_token:?} causal {causal}: off eq. (1) by {diff}");
        }
    }

    /// ∂y_i/∂x_j ≠ 0 exactly for j ≤ i (causal, with D_S = ℓ and with fewer units), and for
    /// every j bidirectionally: the masks cut every path from the future and no other.
    #[test]
    fn outputs_read_exactly_the_visible_positions() {
        let dev = Device::flex().autodiff();
        for (d_token, causal) in [(None, true), (Some(3), true), (None, false)] {
            let l = layer(MlpMixerConfig { d_token }, &dev);
            let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let x = Tensor::<3>::random([1, CONTEXT, D], Distribution::Normal(0.0, 1.0), &dev).require_grad();
            let hidden = MlpMixerConfig { d_token }.d_token(CONTEXT);
            let m = degrees(hidden, CONTEXT);
            for i in 0..CONTEXT {
                // one forward per backward: the tape is consumed
                let y = l.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let grads = y.narrow(1, i, 1).sum().backward();
                let g = x.grad(&grads).unwrap().abs().sum_dim(2).to_data().try_to_vec::<f32>().unwrap();
                for (j, &gj) in g.iter().enumerate() {
                    // a path j → k → i exists when j ≤ m(k) ≤ i for some unit k
                    let connected = !causal || m.iter().any(|&mk| j <= mk && mk <= i);
                    assert_eq!(gj > 0.0, connected, "d_token {d_token:?} causal {causal}: ∂y_{i}/∂x_{j} = {gj}");
                    if causal && d_token.is_none() {
                        assert_eq!(connected, j <= i);
                    }
                }
            }
        }
    }

    /// Decoding one position at a time equals the full forward.
    #[test]
    fn decoding_equals_the_forward() {
        let dev = Device::flex();
        let l = layer(MlpMixerConfig { d_token: Some(5) }, &dev);
        let x = Tensor::<3>::random([2, CONTEXT, D], Distribution::Normal(0.0, 1.0), &dev);
        let full = l.forward(AttentionInput::self_attention(x.clone(), &AttentionMask::causal()), None).context;
        let mut cache = MixerState::default();
        for i in 0..CONTEXT {
            let mask = AttentionMask { q_start: i, ..AttentionMask::causal() };
            let y =
                l.forward(AttentionInput::self_attention(x.clone().narrow(1, i, 1), &mask), Some(&mut cache)).context;
            let diff = (y - full.clone().narrow(1, i, 1)).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "position {i}: {diff}");
        }
    }

    /// Prefills of several rows, then single rows, equal the full forward (the MADE masks at a
    /// call's offset).
    #[test]
    fn decoding_in_chunks_equals_the_forward() {
        let dev = Device::flex();
        let l = layer(MlpMixerConfig::default(), &dev);
        let x = Tensor::<3>::random([2, CONTEXT, D], Distribution::Normal(0.0, 1.0), &dev);
        let full = l.forward(AttentionInput::self_attention(x.clone(), &AttentionMask::causal()), None).context;
        let mut cache = MixerState::default();
        let mut at = 0;
        for n in [3, 1, 2, 1] {
            let mask = AttentionMask { q_start: at, ..AttentionMask::causal() };
            let y =
                l.forward(AttentionInput::self_attention(x.clone().narrow(1, at, n), &mask), Some(&mut cache)).context;
            let diff = (y - full.clone().narrow(1, at, n)).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "rows {at}..{}: {diff}", at + n);
            at += n;
        }
    }

    /// A padded position changes no other output; unpadded, the same change does.
    #[test]
    fn a_padded_position_changes_no_other_output() {
        let dev = Device::flex();
        let l = layer(MlpMixerConfig::default(), &dev);
        let x = Tensor::<3>::random([1, CONTEXT, D], Distribution::Normal(0.0, 1.0), &dev);
        let changed = x.clone().slice_assign([0..1, 2..3, 0..D], Tensor::ones([1, 1, D], &dev));
        let pad: Vec<bool> = (0..CONTEXT).map(|i| i == 2).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [1, CONTEXT]), &dev);
        let others = |y: Tensor<3>| Tensor::cat(vec![y.clone().narrow(1, 0, 2), y.narrow(1, 3, CONTEXT - 3)], 1);
        for open in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let padded = AttentionMask { padding: Some(pad.clone()), ..open.clone() };
            let diff = |mask: &AttentionMask| {
                let run = |x: Tensor<3>| l.forward(AttentionInput::self_attention(x, mask), None).context;
                (others(run(x.clone())) - others(run(changed.clone()))).abs().max().into_scalar::<f32>()
            };
            assert_eq!(diff(&padded), 0.0, "causal {}", open.causal);
            assert!(diff(&open) > 1e-3, "causal {}: the change must show without padding", open.causal);
        }
    }

    #[test]
    fn settings_are_checked_by_key() {
        let e = MlpMixerConfig { d_token: Some(0) }.validate(8).unwrap_err().0;
        assert!(e.contains("model.attention.d_token"), "{e}");
    }
}
