//! Talking-heads attention, the `talking-heads` kind (Shazeer, Lan, Cheng, Ding, Hou 2020,
//! Talking-Heads Attention): multi-head attention whose heads exchange information through two
//! learned h × h mixes, one on the logits before the softmax and one on the weights after it:
//!
//! J_h = Q_h K_hᵀ/√d,   J'_i = Σ_h P_l[i, h] J_h,   W_i = softmax(J'_i + M),
//! W'_j = Σ_i P_w[j, i] W_i,   O = concat_j(W'_j V_j) W_O.
//!
//! Choices where the paper leaves one open: the paper allows different numbers of logit, softmax
//! and value heads (h_k, h, h_v); here all three are `n_heads`, so P_l and P_w are square. Both
//! mixes start at the identity, so training starts from plain multi-head attention (the equations
//! do not prescribe an initialisation). The mask M is applied after the logit mix: a hidden
//! (query, key) pair is hidden in every head, so mixing across heads moves nothing across
//! positions, and the weight mix is a per-position combination of rows that are already zero
//! there. The causal form and cached decoding are those of `full` (a KV cache; the mixes act per
//! (query, key) pair). The mixes need the scores of every head, so the fused attention kernel does
//! not apply: this kind always takes the composed path.

use burn::module::Param;
use burn::prelude::*;
use variorum_core::ConfigError;

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};

attention_config! {
    /// `model.attention` with `kind = "talking-heads"`.
    pub struct TalkingHeadsConfig [n_heads, n_kv_heads, head_dim, dropout, bias, normaliser] {
    }
}

impl TalkingHeadsConfig {
    head_methods!();

    /// The layer for `d_model`: `full`'s heads and both mixes at the identity, so that it starts
    /// as plain attention.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> TalkingHeadsAttention {
        let identity = || Param::from_tensor(Tensor::eye(self.n_heads, device));
        TalkingHeadsAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            logits_mix: identity(),
            weights_mix: identity(),
        }
    }
}

impl AttentionKind for TalkingHeadsConfig {
    type Module = TalkingHeadsAttention;
    const SUMMARY: &'static str = "talking heads: learned h × h mixes across heads on the logits before the softmax and on the weights after it (identity at init); KV cache";
    const PAPER: &'static str = "Shazeer, Lan, Cheng, Ding, Hou 2020, Talking-Heads Attention";
    const CAPS: variorum_core::Capabilities = caps::CROSS_SCORES;
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        // the head checks of `full`, dropout included
        self.heads().validate(d_model)
    }

    /// Full attention's, plus the two mixes: h multiply–adds per head and key, twice.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.n_heads as u64;
        self.heads().flops_per_token(d_model, len_k) + 2 * 2 * h * h * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        TestVariant::score_path(Self::default())
    }
}

/// Talking-heads attention: multi-head attention with learned mixes across heads on the logits and
/// on the weights.
#[derive(Module, Debug)]
pub struct TalkingHeadsAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// P_l, `[n_heads, n_heads]`: row i mixes the heads' logits into softmax head i.
    pub logits_mix: Param<Tensor<2>>,
    /// P_w, `[n_heads, n_heads]`: row j mixes the softmax heads' weights into value head j.
    pub weights_mix: Param<Tensor<2>>,
}

/// Σ_h mix[i, h] · x[:, h] for `x: [b, h, len_q, len_k]`.
fn mix_heads(mix: &Param<Tensor<2>>, x: Tensor<4>) -> Tensor<4> {
    let [b, h, lq, lk] = x.dims();
    let mix = mix.val().unsqueeze_dim::<3>(0).expand([b, h, h]);
    mix.matmul(x.reshape([b, h, lq * lk])).reshape([b, h, lq, lk])
}

impl TalkingHeadsAttention {
    /// The layer over `input` (keys after `cache`'s); the weights it returns are the mixed ones
    /// (W', after the weight mix).
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let a = &self.attention;
        let p = a.project(input.query, input.key_value, input.mask, cache);
        let logits = mix_heads(&self.logits_mix, a.scores(&p));
        let probs = a.normalise(a.mask_scores(logits, input.mask, input.dense_mask, &p));
        let weights = mix_heads(&self.weights_mix, probs);
        let returned = input.need_weights.then(|| weights.clone());
        let context = a.combine(a.dropout.forward(weights), &p);
        AttentionOutput { context, weights: returned, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for TalkingHeadsAttention {
    kv_cache_hooks!();

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    fn setup(device: &Device) -> (TalkingHeadsAttention, Tensor<3>) {
        device.seed(7);
        let attn = TalkingHeadsConfig::default().init(16, 0.2, 0.2, Positioning::NONE, device);
        (attn, Tensor::random([2, 6, 16], Distribution::Normal(0.0, 1.0), device))
    }

    #[test]
    fn identity_mixes_are_plain_multi_head_attention() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let talking = TalkingHeadsAttention::forward(&attn, AttentionInput::self_attention(x.clone(), &mask), None);
            let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None);
            let diff = (talking.context - plain.context).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "identity mixes differ from full attention by {diff}");
        }
    }

    /// The paper's equations written out entry by entry, with two different non-symmetric mixes:
    /// J_h = Q_h K_hᵀ/√d, J'_i = Σ_h P_l[i, h] J_h, W_i = softmax(J'_i + M), W'_j = Σ_i P_w[j, i] W_i,
    /// O = concat_j(W'_j V_j) W_O. Swapping the mixes, transposing either, or mixing after the
    /// mask's softmax in the wrong order gives another output.
    #[test]
    fn the_output_is_the_papers_equations_by_hand() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        let (b, l, h, dh) = (2, 6, 4, 4);
        let host = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let pl_t = Tensor::<2>::random([h, h], Distribution::Normal(0.0, 1.0), &dev);
        let pw_t = Tensor::<2>::random([h, h], Distribution::Normal(0.0, 1.0), &dev);
        let (pl, pw) = (host(pl_t.clone()), host(pw_t.clone()));
        attn.logits_mix = Param::from_tensor(pl_t);
        attn.weights_mix = Param::from_tensor(pw_t);
        let mask = AttentionMask::causal();
        let got = TalkingHeadsAttention::forward(&attn, AttentionInput::self_attention(x.clone(), &mask), None).context;

        // q | k | v of every position, [b·l, 3·16]
        let qkv = host(attn.attention.qkv.qkv.forward(x).reshape([b * l, 3 * h * dh]));
        let at = |part: usize, bi: usize, t: usize, head: usize, c: usize| {
            qkv[(bi * l + t) * 3 * h * dh + part * h * dh + head * dh + c] as f64
        };
        let mut concat = vec![0f32; b * l * h * dh];
        for bi in 0..b {
            for i in 0..l {
                // J_h[i, j] for every head and (causal) key
                let j_h: Vec<Vec<f64>> = (0..h)
                    .map(|hd| {
                        (0..=i)
                            .map(|j| {
                                (0..dh).map(|c| at(0, bi, i, hd, c) * at(1, bi, j, hd, c)).sum::<f64>()
                                    / (dh as f64).sqrt()
                            })
                            .collect()
                    })
                    .collect();
                // softmax heads: W_s = softmax_j(Σ_h P_l[s, h] J_h)
                let w: Vec<Vec<f64>> = (0..h)
                    .map(|s| {
                        let mixed: Vec<f64> =
                            (0..=i).map(|j| (0..h).map(|hd| pl[s * h + hd] as f64 * j_h[hd][j]).sum()).collect();
                        let top = mixed.iter().cloned().fold(f64::MIN, f64::max);
                        let z: f64 = mixed.iter().map(|m| (m - top).exp()).sum();
                        mixed.iter().map(|m| (m - top).exp() / z).collect()
                    })
                    .collect();
                // value heads: W'_v = Σ_s P_w[v, s] W_s, then W'_v V_v
                for v in 0..h {
                    for c in 0..dh {
                        let value: f64 = (0..=i)
                            .map(|j| (0..h).map(|s| pw[v * h + s] as f64 * w[s][j]).sum::<f64>() * at(2, bi, j, v, c))
                            .sum();
                        concat[(bi * l + i) * h * dh + v * dh + c] = value as f32;
                    }
                }
            }
        }
        let concat = Tensor::<3>::from_data(TensorData::new(concat, [b, l, h * dh]), &dev);
        let want = attn.attention.out.forward(concat);
        let diff = (got - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-4, "talking heads differ from the equations by {diff}");
    }

    #[test]
    fn the_mixes_exchange_information_between_heads_and_nothing_across_positions() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        let mask = AttentionMask::causal();
        let before = TalkingHeadsAttention::forward(&attn, AttentionInput::self_attention(x.clone(), &mask), None);
        let mixed = Tensor::random([4, 4], Distribution::Normal(0.0, 1.0), &dev);
        attn.logits_mix = Param::from_tensor(mixed.clone());
        attn.weights_mix = Param::from_tensor(mixed.transpose());
        let out = TalkingHeadsAttention::forward(
            &attn,
            AttentionInput::self_attention(x.clone(), &mask).with_weights(),
            None,
        );
        let moved = (out.context.clone() - before.context).abs().max().into_scalar::<f32>();
        assert!(moved > 1e-3, "non-identity mixes must change the output (moved {moved})");
        // still causal: the weights on later keys are exactly zero in every head
        let w = out.weights.unwrap();
        let past = Tensor::<2, Bool>::tril_mask([6, 6], 0, &dev).bool_not().unsqueeze::<4>().expand([2, 4, 6, 6]);
        let future = w.mask_fill(past, 0.0);
        assert_eq!(future.abs().max().into_scalar::<f32>(), 0.0, "weight on a future key");
        // and changing the last position moves no earlier output
        let changed = x
            .clone()
            .slice_assign([0..2, 5..6, 0..16], Tensor::random([2, 1, 16], Distribution::Normal(0.0, 1.0), &dev));
        let again = TalkingHeadsAttention::forward(&attn, AttentionInput::self_attention(changed, &mask), None);
        let leak = (again.context.narrow(1, 0, 5) - out.context.narrow(1, 0, 5)).abs().max().into_scalar::<f32>();
        assert!(leak < 1e-6, "a later position changed an earlier output by {leak}");
    }
}
