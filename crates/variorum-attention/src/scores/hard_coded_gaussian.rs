//! Hard-coded Gaussian attention (You et al. 2020), the `hard-coded-gaussian` kind: no queries
//! or keys. Head h attends with fixed weights, a Gaussian over key positions centred on the
//! query's position shifted by the head's offset o_h,
//!
//!   w_ij = exp(−(p_j − (p_i + o_h))² / 2σ²) / (σ√(2π))   over the keys query i may see,
//!   head_h(i) = Σ_j w_ij v_j,   v = x W_v (per head),   output = [head_1; …; head_H] W_o.
//!
//! Only the value and output projections are learned.
//!
//! Choices:
//! - Offsets: the paper's heads are centred on the previous, the current and the next token
//!   (o ∈ {−1, 0, +1}), cycled over the heads. Under a causal mask the next token is out of
//!   reach (a head centred on it would see only the half of its Gaussian at or before the
//!   current token), so causal heads cycle over {−1, 0}.
//! - σ = `std`, 1 by default as in the paper. The weights are the Gaussian's density at the
//!   key positions, as the paper's N(·, σ²) and the authors' code (`get_attn_cache` in
//!   github.com/fallcat/stupidNMT) have them: hidden keys (causal, padding, a custom pattern,
//!   `max_back`) weigh 0 and the rest are not renormalised, so a row whose Gaussian the mask cuts
//!   (a causal head centred on the current token sees half of it; the first rows) sums to less
//!   than 1. With σ = 1 an uncut row sums to 1 within 1e-8. `normalise = true` renormalises every
//!   row over its visible keys instead (a softmax of the log-density), the form this kind had
//!   before.
//! - The weights are O(L²) per head like full attention's, but depend only on positions: one
//!   `[heads, len_q, len_k]` matrix serves the whole batch, and no score GEMM is run.
//! - Decoding caches the values; a new token's weights are its own row of the same formula.

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::softmax;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::qkv::{normal_linear, split_heads};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "hard-coded-gaussian"`.
    pub struct HardCodedGaussianConfig [n_heads, head_dim, bias] {
        /// σ, the width of every head's Gaussian, in positions. Default 1 (the paper's).
        pub std: f64 = 1.0,
        /// Renormalise each row of weights over the keys it may see, instead of the Gaussian's
        /// density itself (the paper's and its code's). Default false.
        pub normalise: bool = false,
    }
}

impl HardCodedGaussianConfig {
    /// The layer for `d_model`: W_v ~ N(0, init_std²) and W_o ~ N(0, out_std²), its only
    /// parameters (the weights are fixed).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> HardCodedGaussianAttention {
        let h = self.head_shape(d_model);
        let width = h.n_heads * h.head_dim;
        HardCodedGaussianAttention {
            value: normal_linear(d_model, width, self.bias, init_std, device),
            out: normal_linear(width, d_model, self.bias, out_std, device),
            n_heads: h.n_heads,
            head_dim: h.head_dim,
            std: self.std,
            normalise: self.normalise,
        }
    }
}

impl AttentionKind for HardCodedGaussianConfig {
    type Module = HardCodedGaussianAttention;
    const SUMMARY: &'static str = "fixed Gaussian weights centred on the previous, current (and, bidirectionally, next) token; no queries or keys, only values learned";
    const PAPER: &'static str = "You et al. 2020, Hard-Coded Gaussian Attention for Neural Machine Translation";
    // weights from positions alone: no score matrix for a position scheme to act on
    const CAPS: Capabilities = Capabilities { reads_memory: false, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.std > 0.0 && self.std.is_finite(), || {
            format!("model.attention.std = {} must be a positive number of positions", self.std)
        })
    }

    head_settings_hooks!();

    /// Multiply–adds per token: the value and output projections, and the weighted sum over
    /// `len_k` values (the weights themselves are shared by the batch).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        2 * (2 * d * hd) + 2 * hd * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> HardCodedGaussianAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new(
                "σ 2, 3 heads of 8",
                Self { n_heads: 3, head_dim: Some(8), std: 2.0, ..Default::default() },
            ),
            TestVariant::new("with the next token", Self::default()).masked(),
            TestVariant::new("rows normalised", Self { normalise: true, ..Default::default() }),
        ]
    }
}

/// Hard-coded Gaussian attention: fixed weights over key positions around each query's, per head,
/// applied to learned values.
#[derive(Module, Debug)]
pub struct HardCodedGaussianAttention {
    /// W_v, `[d_model, n_heads · head_dim]`.
    pub value: Linear,
    /// W_o, `[n_heads · head_dim, d_model]`.
    pub out: Linear,
    /// H, heads (their offsets cycle over −1, 0 and, bidirectionally, +1).
    pub n_heads: usize,
    /// d_h, the size of each head's values.
    pub head_dim: usize,
    /// σ, every head's Gaussian width, in positions.
    pub std: f64,
    /// Rows renormalised over their visible keys (`normalise`), else the density itself.
    pub normalise: bool,
}

/// Decoding state: the values of every position so far, `[b, n_heads, len, head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct GaussianCache {
    /// The values so far, `[b, n_heads, len, head_dim]`; `None` before the first call.
    pub values: Option<Tensor<4>>,
}

impl HardCodedGaussianAttention {
    /// The centre offset of head `h`: previous, current (and next, without a causal mask).
    pub fn offset(&self, h: usize, causal: bool) -> i64 {
        let offsets: &[i64] = if causal { &[-1, 0] } else { &[-1, 0, 1] };
        offsets[h % offsets.len()]
    }

    /// The weights `[1 or batch, n_heads, len_q, len_k]` of queries at `mask.q_start…` over keys
    /// at `mask.k_start…`.
    pub fn weights(&self, mask: &AttentionMask, len_q: usize, len_k: usize, device: &Device) -> Tensor<4> {
        let positions =
            |start: usize, len: usize| Tensor::<1, Int>::arange(start as i64..(start + len) as i64, device).float();
        let q = positions(mask.q_start, len_q).reshape([1, 1, len_q, 1]);
        let k = positions(mask.k_start, len_k).reshape([1, 1, 1, len_k]);
        let offsets: Vec<f32> = (0..self.n_heads).map(|h| self.offset(h, mask.causal) as f32).collect();
        let centres = q + Tensor::<1>::from_floats(offsets.as_slice(), device).reshape([1, self.n_heads, 1, 1]);
        let distance = k - centres; // [1, h, len_q, len_k]
        let scores = distance.powi_scalar(2).mul_scalar(-0.5 / (self.std * self.std));
        let hidden = mask.score_mask(len_q, len_k, device);
        let hide = |t: Tensor<4>, value: f64| match &hidden {
            Some(hidden) => {
                let shape = [hidden.dims()[0], self.n_heads, len_q, len_k];
                t.expand(shape).mask_fill(hidden.clone().expand(shape), value)
            }
            None => t,
        };
        if self.normalise {
            return softmax(hide(scores, MASKED_SCORE as f64), 3);
        }
        let density = scores.exp().div_scalar(self.std * (2.0 * std::f64::consts::PI).sqrt());
        hide(density, 0.0)
    }

    /// The heads' Gaussian-weighted values of `input.key_value` (else of `input.query`), after
    /// those kept in `state`, through W_o; weights `[b, n_heads, len_q, len_k]` when asked for.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut GaussianCache>) -> AttentionOutput {
        let [b, lq, _] = input.query.dims();
        let source = input.key_value.unwrap_or(input.query);
        let v = split_heads(self.value.forward(source), 1, self.n_heads, self.head_dim).remove(0);
        let v = match state {
            Some(cache) => {
                let all = match cache.values.take() {
                    Some(old) => Tensor::cat(vec![old, v], 2),
                    None => v,
                };
                cache.values = Some(all.clone());
                all
            }
            None => v,
        };
        let lk = v.dims()[2];
        let device = v.device();
        let weights = self.weights(input.mask, lq, lk, &device);
        let wb = weights.dims()[0];
        let context = if wb == 1 {
            // one matrix for the whole batch: [h, lq, lk] @ [h, lk, b·d_h]
            let v = v.swap_dims(0, 1).swap_dims(1, 2).reshape([self.n_heads, lk, b * self.head_dim]);
            let c = weights.clone().reshape([self.n_heads, lq, lk]).matmul(v);
            c.reshape([self.n_heads, lq, b, self.head_dim]).swap_dims(1, 2).swap_dims(0, 1)
        } else {
            weights.clone().matmul(v)
        };
        let context = context.swap_dims(1, 2).reshape([b, lq, self.n_heads * self.head_dim]);
        let weights = input.need_weights.then(|| weights.expand([b, self.n_heads, lq, lk]));
        AttentionOutput { context: self.out.forward(context), weights, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for HardCodedGaussianAttention {
    /// Decoding state: [`GaussianCache`] in the layer's state.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        HardCodedGaussianAttention::forward(self, input, state.map(|s| s.get_or_default::<GaussianCache>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn layer(n_heads: usize, std: f64, dev: &Device) -> HardCodedGaussianAttention {
        layer_of(n_heads, std, false, dev)
    }

    fn layer_of(n_heads: usize, std: f64, normalise: bool, dev: &Device) -> HardCodedGaussianAttention {
        HardCodedGaussianConfig { n_heads, head_dim: Some(4), std, normalise, ..Default::default() }
            .init(8, 0.2, 0.2, dev)
    }

    fn weights_of(att: &HardCodedGaussianAttention, x: Tensor<3>, mask: &AttentionMask) -> Tensor<4> {
        att.forward(AttentionInput::self_attention(x, mask).with_weights(), None).weights.unwrap()
    }

    fn head(w: &Tensor<4>, h: usize, l: usize) -> Tensor<2> {
        w.clone().slice([0..1, h..h + 1, 0..l, 0..l]).reshape([l, l])
    }

    fn max_diff(a: Tensor<2>, b: Tensor<2>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn weights_are_the_gaussian_density_at_the_visible_keys_and_ignore_the_input() {
        let dev = Device::flex();
        let att = layer(2, 1.5, &dev);
        let mask = AttentionMask::causal();
        let x = || Tensor::<3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let (a, b) = (weights_of(&att, x(), &mask), weights_of(&att, x(), &mask));
        assert_eq!((a.clone() - b).abs().max().into_scalar::<f32>(), 0.0, "the weights moved with the input");
        // head h is centred on i + o_h (o = −1, 0): w_ij = exp(−(j − i − o)² / 2σ²) / (σ√(2π)) for
        // j ≤ i, 0 after, not renormalised (a row sums to less than 1 where the mask cuts it)
        for (h, o) in [(0, -1.0), (1, 0.0)] {
            let mut want = vec![0.0f32; 25];
            for i in 0..5 {
                for j in 0..=i {
                    let d = j as f64 - (i as f64 + o);
                    want[i * 5 + j] =
                        ((-d * d / (2.0 * 1.5 * 1.5)).exp() / (1.5 * (2.0 * std::f64::consts::PI).sqrt())) as f32;
                }
            }
            let want = Tensor::<1>::from_floats(want.as_slice(), &dev).reshape([5, 5]);
            let diff = max_diff(head(&a, h, 5), want);
            assert!(diff < 1e-6, "head {h} differs from the density by {diff}");
        }
    }

    #[test]
    fn normalised_weights_are_the_gaussian_renormalised_over_the_visible_keys() {
        let dev = Device::flex();
        let att = layer_of(2, 1.0, true, &dev);
        let mask = AttentionMask::causal();
        let x = || Tensor::<3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let (a, b) = (weights_of(&att, x(), &mask), weights_of(&att, x(), &mask));
        assert_eq!((a.clone() - b).abs().max().into_scalar::<f32>(), 0.0, "the weights moved with the input");
        // head 0 is centred on the previous token: row i ∝ exp(−(j − (i − 1))² / 2) over j ≤ i
        let mut want = vec![0.0f32; 25];
        for i in 0..5 {
            let raw: Vec<f64> = (0..=i).map(|j| (-((j as f64 - (i as f64 - 1.0)).powi(2)) / 2.0).exp()).collect();
            let z: f64 = raw.iter().sum();
            for j in 0..=i {
                want[i * 5 + j] = (raw[j] / z) as f32;
            }
        }
        let want = Tensor::<1>::from_floats(want.as_slice(), &dev).reshape([5, 5]);
        let diff = max_diff(head(&a, 0, 5), want);
        assert!(diff < 1e-6, "head 0 differs from the closed form by {diff}");
    }

    #[test]
    fn bidirectional_heads_centre_on_the_previous_current_and_next_token() {
        let dev = Device::flex();
        let att = layer(3, 0.3, &dev);
        let w = weights_of(&att, Tensor::zeros([1, 6, 8], &dev), &AttentionMask::bidirectional());
        let best = |h: usize| -> Vec<i64> {
            head(&w, h, 6).argmax(1).reshape([6]).into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
        };
        assert_eq!(best(0), [0, 0, 1, 2, 3, 4], "previous");
        assert_eq!(best(1), [0, 1, 2, 3, 4, 5], "current");
        assert_eq!(best(2), [1, 2, 3, 4, 5, 5], "next");
    }

    #[test]
    fn a_narrow_gaussian_copies_the_previous_and_the_own_value() {
        // σ → 0, rows normalised: head 0 weighs the token before (the first token itself), head
        // 1 the token
        let dev = Device::flex();
        let att = layer_of(2, 0.05, true, &dev);
        let x = Tensor::<3>::random([1, 4, 8], Distribution::Normal(0.0, 1.0), &dev);
        let w = weights_of(&att, x, &AttentionMask::causal());
        let previous = Tensor::<2>::from_floats(
            [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]],
            &dev,
        );
        assert!(max_diff(head(&w, 0, 4), previous) < 1e-6);
        assert!(max_diff(head(&w, 1, 4), Tensor::<2>::eye(4, &dev)) < 1e-6);
    }
}
