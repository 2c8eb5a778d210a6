//! Localness modelling with a learned Gaussian prior, the `gaussian-prior` kind (Yang, Tu, Wong,
//! Meng, Chao, Zhang 2018, Modeling Localness for Self-Attention Networks): multi-head attention
//! whose scores get a Gaussian bias G around a centre and a window predicted from each query,
//!
//!   P_i = I·sigmoid(v_pᵀ tanh(W_p Q_i)),   D_i = I·sigmoid(v_dᵀ tanh(W_p Q_i)),   σ_i = D_i / 2,
//!   G_ij = −(j − P_i)² / 2σ_i²,   Attention(Q, K, V) = softmax(Q Kᵀ/√d + G + M) V,
//!
//! with I the sequence length and M the mask. A wide window leaves plain attention; a narrow one
//! turns each query into a soft window around its own predicted centre.
//!
//! The paper models localness in the lower layers only, keeping the upper ones global for
//! long-distance dependencies (its best setting: layers 1–3 of a 6-layer encoder). So does this
//! kind: `lower_layers` (default 3) layers from the bottom have the prior; the layers above are
//! plain multi-head attention, without the prior's parameters. `lower_layers` at or above the
//! model's depth puts it in every layer.
//!
//! Choices where the paper leaves one open:
//! - Per head: every query head predicts its own P and D from its own query (`Q_i` is the head's
//!   query, `[head_dim]`). W_p (`head_dim × head_dim`, no bias, as in the paper) is shared by the
//!   heads; the read-out vectors v_p, v_d are per head and get a bias each (b_p, b_d, not in the
//!   paper) so that every head has its own starting centre and window. With grouped-query
//!   attention the prior belongs to the query heads; keys are shared as in `full`.
//! - The query the prior reads is the one the scores use: after the position scheme's rotation
//!   (RoPE), with the 1/√d scale taken off. The prior costs no second query projection; under
//!   RoPE its input depends on the position, as the paper's queries do through the sinusoidal
//!   signal added to the input.
//! - The range I: the keys query i may see, from `first` (the first key, or `max_back` before the
//!   query) to `last` (the query itself under a causal mask — a causal model does not know the
//!   sequence length; the last key bidirectionally). The centre stays inside it,
//!   P_i = first + (last − first)·sigmoid(·), and the window scales with the number of keys in it,
//!   D_i = (last − first + 1)·sigmoid(·)·`window_scale` (at least one key, so the first token of
//!   a causal sequence has a window too). Positions are absolute (`ScoreLayout`), so a cached
//!   query gets the row the full forward gives it. Padding inside the range is not taken out.
//! - Initialisation: b_d = 4 (sigmoid ≈ 0.98, σ ≈ half the visible length, the widest window the
//!   paper's form allows) and b_p = 0 (the middle of the range): G starts within [−0.52, 0], so
//!   training starts near plain attention and narrows the windows it needs. W_p ~ N(0, 1/d_h)
//!   keeps tanh off its flat tails; v ~ N(0, init_std²) starts small.
//! - `window_scale` (default 1, the paper's) multiplies D_i: above 1 a head can flatten its prior
//!   further towards plain attention (σ up to `window_scale`·I/2).
//! - 2σ² is floored at 10⁻⁶: G stays finite where a window collapses, and the nearest visible key
//!   still scores above a hidden one.
//!
//! The causal form and cached decoding are `full`'s (a KV cache; G depends only on the query and
//! the positions). G needs every score, so the fused attention kernel does not apply: this kind
//! always takes the composed path (`project`, `scores`, + G, `mask_scores`, softmax, `combine`).

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::sigmoid;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::ScoreLayout;

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};

/// b_p at initialisation: sigmoid(0) = 1/2, the centre in the middle of the visible range.
const CENTRE_BIAS: f32 = 0.0;
/// b_d at initialisation: sigmoid(4) ≈ 0.98, the window about the whole visible range.
const WINDOW_BIAS: f32 = 4.0;
/// Floor of 2σ²: a collapsed window keeps G finite and its nearest key above `MASKED_SCORE`
/// (−0.5² / 10⁻⁶ = −2.5·10⁵ > −10⁹).
const MIN_TWO_SIGMA_SQ: f64 = 1e-6;

attention_config! {
    /// `model.attention` with `kind = "gaussian-prior"`.
    pub struct GaussianPriorConfig {
        /// Multiplies every predicted window D_i. Default 1, the paper's D_i = I·sigmoid(·);
        /// larger lets a head flatten its prior further towards plain attention.
        pub window_scale: f64 = 1.0,
        /// How many layers, from the bottom, have the prior; the layers above are plain
        /// multi-head attention. Default 3, the paper's (layers 1–3 of 6); the model's depth or
        /// more: every layer; 0: none.
        pub lower_layers: usize = 3,
    }
}

impl GaussianPriorConfig {
    /// The layer for `d_model`: `full`'s heads, and where this config has the prior (any layer
    /// unless [`for_layer`](AttentionKind::for_layer) put it above `lower_layers`), W_p ~
    /// N(0, 1/d_h), v ~ N(0, init_std²), b_p = 0 and b_d = 4 (every window about the whole
    /// visible range).
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> GaussianPriorAttention {
        let (h, dh) = (self.n_heads, self.heads().head_dim(d_model));
        let biases: Vec<f32> = (0..h).flat_map(|_| [CENTRE_BIAS, WINDOW_BIAS]).collect();
        let prior = (self.lower_layers > 0).then(|| LocalnessPrior {
            hidden: normal_linear(dh, dh, false, 1.0 / (dh as f64).sqrt(), device),
            readout: Param::from_tensor(Tensor::random([h, dh, 2], Distribution::Normal(0.0, init_std), device)),
            readout_bias: Param::from_tensor(Tensor::<1>::from_floats(biases.as_slice(), device).reshape([h, 2])),
            window_scale: self.window_scale,
        });
        GaussianPriorAttention { attention: self.heads().init(d_model, init_std, out_std, position, device), prior }
    }
}

impl AttentionKind for GaussianPriorConfig {
    type Module = GaussianPriorAttention;
    const SUMMARY: &'static str = "Gaussian prior: full attention plus −(j − P_i)²/2σ_i² on the scores, the centre P_i and window 2σ_i predicted from each query (wide at init); KV cache";
    const PAPER: &'static str =
        "Yang, Tu, Wong, Meng, Chao, Zhang 2018, Modeling Localness for Self-Attention Networks";
    // no `cross`: the predicted centre and width scale with the source's length, padding included
    const CAPS: Capabilities = Capabilities { hides_padding: false, ..caps::SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        // the head checks of `full`, dropout included
        self.heads().validate(d_model)?;
        check(self.window_scale > 0.0 && self.window_scale.is_finite(), || {
            format!(
                "model.attention.window_scale = {} must be a positive number (1 is the paper's window)",
                self.window_scale
            )
        })
    }

    /// Full attention's, plus the prior: W_p (d_h × d_h) and the two read-out dot products per
    /// head, and one multiply–add per head and key for G.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let heads = self.heads();
        let (h, dh) = (self.n_heads as u64, heads.head_dim(d_model) as u64);
        let prior = if self.lower_layers > 0 { 2 * h * (dh * dh + 2 * dh + len_k as u64) } else { 0 };
        heads.flops_per_token(d_model, len_k) + prior
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    /// Layer `layer`'s config: with the prior below `lower_layers` (written as "every layer",
    /// `usize::MAX`), plain multi-head attention from there up (0).
    fn for_layer(&self, layer: usize) -> Self {
        let lower_layers = if layer < self.lower_layers { usize::MAX } else { 0 };
        Self { lower_layers, ..self.clone() }
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        TestVariant::score_path(Self::default())
    }
}

/// Multi-head attention plus a Gaussian prior G on the scores, its centre and window predicted
/// from each query (in the lower layers; plain multi-head attention above them).
#[derive(Module, Debug)]
pub struct GaussianPriorAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// The prior's parameters; `None` in a layer above `lower_layers`.
    pub prior: Option<LocalnessPrior>,
}

/// The prior's parameters: what predicts each query's centre and window.
#[derive(Module, Debug)]
pub struct LocalnessPrior {
    /// W_p, `[head_dim, head_dim]`, shared by the heads.
    pub hidden: Linear,
    /// (v_p, v_d) per head, `[n_heads, head_dim, 2]`: column 0 reads the centre, column 1 the
    /// window out of tanh(W_p Q_i).
    pub readout: Param<Tensor<3>>,
    /// (b_p, b_d) per head, `[n_heads, 2]`.
    pub readout_bias: Param<Tensor<2>>,
    /// Multiplies every window D_i (`window_scale`).
    pub window_scale: f64,
}

/// The keys query `i` of `layout` may see, as key indices `(first, last)`: from the first key (or
/// `max_back` positions before the query) to the query itself (causal) or the last key.
fn visible(layout: &ScoreLayout, max_back: Option<usize>, i: usize) -> (usize, usize) {
    let position = layout.q_start + i;
    let last_key = layout.k_start + layout.len_k.saturating_sub(1);
    let last = if layout.causal { position.min(last_key) } else { last_key };
    let first = max_back.map_or(layout.k_start, |n| layout.k_start.max(position.saturating_sub(n)));
    let first = first.saturating_sub(layout.k_start);
    (first, last.saturating_sub(layout.k_start).max(first))
}

impl LocalnessPrior {
    /// sigmoid(v_pᵀ tanh(W_p q) + b_p) and sigmoid(v_dᵀ tanh(W_p q) + b_d) of queries
    /// `q: [b, n_heads, len_q, head_dim]` (unscaled): the centre's and the window's fractions of
    /// the visible range, `[b, n_heads, len_q, 1]` each.
    pub fn fractions(&self, q: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let [b, h, _, dh] = q.dims();
        let hidden = self.hidden.forward(q).tanh();
        let readout = self.readout.val().unsqueeze_dim::<4>(0).expand([b, h, dh, 2]);
        let logits = hidden.matmul(readout) + self.readout_bias.val().reshape([1, h, 1, 2]);
        let f = sigmoid(logits);
        (f.clone().narrow(3, 0, 1), f.narrow(3, 1, 1))
    }

    /// Each query's centre P_i and window D_i, `[b, n_heads, len_q, 1]` each, in key indices
    /// (key j of `p.k` at j); `scale` is the score scale the projected queries carry.
    pub fn centre_and_window(&self, p: &Projected, scale: f64) -> (Tensor<4>, Tensor<4>) {
        let l = &p.layout;
        let device = p.device();
        let (mut first, mut reach) = (Vec::with_capacity(l.len_q), Vec::with_capacity(l.len_q));
        for i in 0..l.len_q {
            let (a, z) = visible(l, p.max_back, i);
            first.push(a as f32);
            reach.push((z - a) as f32);
        }
        let column = |v: Vec<f32>| Tensor::<1>::from_floats(v.as_slice(), &device).reshape([1, 1, l.len_q, 1]);
        let (first, reach) = (column(first), column(reach));
        let (c, w) = self.fractions(p.q().div_scalar(scale));
        let centre = c * reach.clone() + first;
        let window = w * reach.add_scalar(1.0).mul_scalar(self.window_scale);
        (centre, window)
    }

    /// G, `[b, n_heads, len_q, len_k]`: −(j − P_i)² / 2σ_i² with σ_i = D_i / 2.
    pub fn bias(&self, p: &Projected, scale: f64) -> Tensor<4> {
        let (centre, window) = self.centre_and_window(p, scale);
        let lk = p.layout.len_k;
        let keys = Tensor::<1, Int>::arange(0..lk as i64, &p.device()).float().reshape([1, 1, 1, lk]);
        // 2σ² = D² / 2
        let two_sigma_sq = window.powi_scalar(2).mul_scalar(0.5).clamp_min(MIN_TWO_SIGMA_SQ);
        (keys - centre).powi_scalar(2).div(two_sigma_sq).neg()
    }
}

impl GaussianPriorAttention {
    /// `full`'s forward (keys after `cache`'s) with G added to the scaled scores before the mask;
    /// without the prior (a layer above `lower_layers`), `full`'s forward.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        match &self.prior {
            Some(prior) => {
                let scale = self.attention.scale;
                self.attention.forward_with_score_bias(input, cache, |p| prior.bias(p, scale))
            }
            None => self.attention.forward(input, cache),
        }
    }
}

impl AttentionMechanism for GaussianPriorAttention {
    kv_cache_hooks!();

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::softmax;
    use variorum_core::AttentionMask;

    const L: usize = 7;

    fn setup(device: &Device) -> (GaussianPriorAttention, Tensor<3>) {
        device.seed(7);
        let cfg = GaussianPriorConfig::default();
        cfg.validate(16).unwrap();
        let attn = cfg.init(16, 0.2, 0.2, Positioning::NONE, device);
        (attn, Tensor::random([2, L, 16], Distribution::Normal(0.0, 1.0), device))
    }

    fn prior(attn: &mut GaussianPriorAttention) -> &mut LocalnessPrior {
        attn.prior.as_mut().expect("a layer with the prior")
    }

    fn output(attn: &GaussianPriorAttention, x: Tensor<3>, mask: &AttentionMask) -> AttentionOutput {
        GaussianPriorAttention::forward(attn, AttentionInput::self_attention(x, mask).with_weights(), None)
    }

    fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn an_unbounded_window_is_plain_multi_head_attention() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            // the initial window is wide, but still a prior
            prior(&mut attn).window_scale = 1.0;
            let moved = max_diff(output(&attn, x.clone(), &mask).context, plain.clone());
            assert!(moved > 1e-4, "the initial prior must act (moved the output by {moved})");
            // σ → ∞: G → 0
            prior(&mut attn).window_scale = 1e9;
            let diff = max_diff(output(&attn, x.clone(), &mask).context, plain);
            assert!(diff < 1e-5, "an unbounded window differs from full attention by {diff}");
        }
    }

    #[test]
    fn the_prior_is_the_closed_form_gaussian_of_the_predicted_centre_and_width() {
        // read-out vectors 0: tanh(W_p q) drops out, and each head's fractions are the sigmoids of
        // its biases: centres 1/2, 3/4, 1/4, 1/2 and windows 1/2, 1/2, 3/4, 1/4 of the range
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        let ln3 = 3f32.ln();
        let (centre_logit, window_logit) = ([0.0, ln3, -ln3, 0.0], [0.0, 0.0, ln3, -ln3]);
        let (fc, fw) = ([0.5f64, 0.75, 0.25, 0.5], [0.5f64, 0.5, 0.75, 0.25]);
        prior(&mut attn).readout = Param::from_tensor(Tensor::zeros([4, 4, 2], &dev));
        let biases: Vec<f32> = (0..4).flat_map(|h| [centre_logit[h], window_logit[h]]).collect();
        prior(&mut attn).readout_bias =
            Param::from_tensor(Tensor::<1>::from_floats(biases.as_slice(), &dev).reshape([4, 2]));
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            // query i sees keys 0..=last (i causal, L − 1 otherwise): P = last·c, D = (last + 1)·w
            let mut g = vec![0.0f32; 4 * L * L];
            for h in 0..4 {
                for i in 0..L {
                    let last = if mask.causal { i } else { L - 1 };
                    let centre = last as f64 * fc[h];
                    let sigma = (last + 1) as f64 * fw[h] / 2.0;
                    for j in 0..L {
                        g[(h * L + i) * L + j] = (-(j as f64 - centre).powi(2) / (2.0 * sigma * sigma)) as f32;
                    }
                }
            }
            let g = Tensor::<1>::from_floats(g.as_slice(), &dev).reshape([1, 4, L, L]);
            let a = &attn.attention;
            let p = a.project(x.clone(), None, &mask, None);
            let want = softmax(a.mask_scores(a.scores(&p) + g, &mask, None, &p), 3);
            let got = output(&attn, x.clone(), &mask).weights.unwrap();
            let diff = max_diff(got, want);
            assert!(diff < 1e-5, "causal {}: weights differ from softmax(QKᵀ/√d + G) by {diff}", mask.causal);
        }
    }

    /// The whole prior written out per head and query from the layer's own parameters, read-outs
    /// non-zero: P and D through sigmoid(vᵀ tanh(W_p q) + b), W_p shared by the centre and the
    /// window, v and b per head — dropping tanh, swapping the centre's and the window's read-outs
    /// or reading another query moves the weights.
    #[test]
    fn the_prior_follows_the_paper_formula_through_tanh_and_the_read_outs() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        dev.seed(11);
        prior(&mut attn).readout = Param::from_tensor(Tensor::random([4, 4, 2], Distribution::Normal(0.0, 1.5), &dev));
        prior(&mut attn).readout_bias =
            Param::from_tensor(Tensor::random([4, 2], Distribution::Normal(0.0, 0.5), &dev));
        let host = |t: Tensor<4>| t.into_data().convert::<f64>().try_to_vec::<f64>().unwrap();
        let pr = prior(&mut attn);
        let w = pr.hidden.weight.val().into_data().convert::<f64>().try_to_vec::<f64>().unwrap(); // [in, out]
        let v = pr.readout.val().into_data().convert::<f64>().try_to_vec::<f64>().unwrap(); // [h, dh, 2]
        let b = pr.readout_bias.val().into_data().convert::<f64>().try_to_vec::<f64>().unwrap(); // [h, 2]
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        let dh = 4;
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let a = &attn.attention;
            let p = a.project(x.clone(), None, &mask, None);
            let q = host(p.q().div_scalar(a.scale)); // [2, h, L, dh], unscaled
            let mut g = vec![0.0f32; 2 * 4 * L * L];
            for row in 0..2 {
                for h in 0..4 {
                    for i in 0..L {
                        let qi = &q[((row * 4 + h) * L + i) * dh..][..dh];
                        let hidden: Vec<f64> =
                            (0..dh).map(|o| (0..dh).map(|k| qi[k] * w[k * dh + o]).sum::<f64>().tanh()).collect();
                        let read = |c: usize| {
                            sigmoid((0..dh).map(|k| hidden[k] * v[(h * dh + k) * 2 + c]).sum::<f64>() + b[h * 2 + c])
                        };
                        let last = if mask.causal { i } else { L - 1 };
                        let centre = last as f64 * read(0);
                        let sigma = (last + 1) as f64 * read(1) / 2.0;
                        for j in 0..L {
                            let at = ((row * 4 + h) * L + i) * L + j;
                            g[at] = (-(j as f64 - centre).powi(2) / (2.0 * sigma * sigma).max(1e-6)) as f32;
                        }
                    }
                }
            }
            let g = Tensor::<1>::from_floats(g.as_slice(), &dev).reshape([2, 4, L, L]);
            let want = softmax(a.mask_scores(a.scores(&p) + g, &mask, None, &p), 3);
            let got = output(&attn, x.clone(), &mask).weights.unwrap();
            let diff = max_diff(got, want);
            assert!(diff < 1e-5, "causal {}: weights differ from the paper's prior by {diff}", mask.causal);
        }
    }

    #[test]
    fn without_content_scores_every_row_peaks_at_its_predicted_centre() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        // keys zeroed (their columns of the fused projection, weights and bias): every q·k is 0
        // and each row's weights are softmax(G) alone
        let qkv = attn.attention.qkv.qkv.clone();
        let w = qkv.weight.val();
        let [d, _] = w.dims();
        attn.attention.qkv.qkv.weight =
            Param::from_tensor(w.slice_assign([0..d, 16..32], Tensor::zeros([d, 16], &dev)));
        if let Some(b) = qkv.bias {
            attn.attention.qkv.qkv.bias =
                Some(Param::from_tensor(b.val().slice_assign([16..32], Tensor::zeros([16], &dev))));
        }
        // centres that move with the query
        prior(&mut attn).readout = Param::from_tensor(Tensor::random([4, 4, 2], Distribution::Normal(0.0, 2.0), &dev));
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let p = attn.attention.project(x.clone(), None, &mask, None);
            let (centre, _) = attn.prior.as_ref().unwrap().centre_and_window(&p, attn.attention.scale);
            let want: Vec<i64> =
                centre.into_data().try_to_vec::<f32>().unwrap().iter().map(|c| c.round() as i64).collect();
            let weights = output(&attn, x.clone(), &mask).weights.unwrap();
            let got = weights.argmax(3).into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
            assert_eq!(got, want, "causal {}: a row's largest weight is not at the key nearest P_i", mask.causal);
            let distinct: std::collections::BTreeSet<i64> = want.iter().copied().collect();
            assert!(distinct.len() > 3, "the centres should differ between queries: {distinct:?}");
        }
    }

    #[test]
    fn a_later_token_changes_no_earlier_output() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let mask = AttentionMask::causal();
        let before = output(&attn, x.clone(), &mask);
        // no weight on a future key in any head
        let past = Tensor::<2, Bool>::tril_mask([L, L], 0, &dev).bool_not().unsqueeze::<4>().expand([2, 4, L, L]);
        let on_future = before.weights.clone().unwrap().mask_fill(past, 0.0);
        assert_eq!(on_future.abs().max().into_scalar::<f32>(), 0.0, "weight on a future key");
        let changed =
            x.slice_assign([0..2, L - 1..L, 0..16], Tensor::random([2, 1, 16], Distribution::Normal(0.0, 1.0), &dev));
        let after = output(&attn, changed, &mask);
        let leak = max_diff(after.context.clone().narrow(1, 0, L - 1), before.context.clone().narrow(1, 0, L - 1));
        assert!(leak < 1e-6, "a later position changed an earlier output by {leak}");
        let moved = max_diff(after.context.narrow(1, L - 1, 1), before.context.narrow(1, L - 1, 1));
        assert!(moved > 1e-4, "the changed position's own output must move (moved {moved})");
    }

    #[test]
    fn cached_decoding_equals_the_full_forward() {
        // a prompt of 3, then one token at a time: each cached query gets its absolute position
        // and the cached keys theirs
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let causal = AttentionMask::causal();
        let full = output(&attn, x.clone(), &causal).context;
        let mut cache = KvCache::default();
        let prompt = AttentionInput::self_attention(x.clone().narrow(1, 0, 3), &causal);
        let mut steps = vec![GaussianPriorAttention::forward(&attn, prompt, Some(&mut cache)).context];
        for t in 3..L {
            let mask = AttentionMask::causal().at(t, 0);
            let input = AttentionInput::self_attention(x.clone().narrow(1, t, 1), &mask);
            steps.push(GaussianPriorAttention::forward(&attn, input, Some(&mut cache)).context);
        }
        let diff = max_diff(Tensor::cat(steps, 1), full);
        assert!(diff < 1e-5, "cached decoding differs from the full forward by {diff}");
    }

    #[test]
    fn the_prior_parameters_learn_from_the_output() {
        let dev = Device::flex().autodiff();
        let (attn, x) = setup(&dev);
        let causal = AttentionMask::causal();
        let out = GaussianPriorAttention::forward(&attn, AttentionInput::self_attention(x, &causal), None);
        let grads = out.context.powf_scalar(2.0).sum().backward();
        let norm = |g: Option<f32>| g.expect("a gradient");
        let pr = attn.prior.as_ref().unwrap();
        let w_p = norm(pr.hidden.weight.grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>()));
        let v = norm(pr.readout.grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>()));
        let b = norm(pr.readout_bias.grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>()));
        assert!(w_p > 0.0 && v > 0.0 && b > 0.0, "no gradient into the prior: W_p {w_p}, v {v}, b {b}");
    }

    /// The paper's layers: the prior in the lowest `lower_layers` (3 by default), plain
    /// multi-head attention above them, with the same weights computing exactly `full`'s output
    /// and no prior parameters.
    #[test]
    fn only_the_lower_layers_have_the_prior() {
        let dev = Device::flex();
        let cfg = GaussianPriorConfig::default();
        assert_eq!(cfg.lower_layers, 3, "the paper's layers 1–3");
        let has_prior = |c: &GaussianPriorConfig, layer| {
            c.for_layer(layer).init(16, 0.2, 0.2, Positioning::NONE, &dev).prior.is_some()
        };
        assert_eq!((0..5).map(|l| has_prior(&cfg, l)).collect::<Vec<_>>(), [true, true, true, false, false]);
        let one = GaussianPriorConfig { lower_layers: 1, ..cfg.clone() };
        assert_eq!((0..3).map(|l| has_prior(&one, l)).collect::<Vec<_>>(), [true, false, false]);
        assert!(cfg.for_layer(3).flops_per_token(16, 8) < cfg.for_layer(0).flops_per_token(16, 8));
        // above them: multi-head attention itself
        let (mut attn, x) = setup(&dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            assert!(max_diff(output(&attn, x.clone(), &mask).context, plain.clone()) > 1e-4, "the prior acts");
            let upper = GaussianPriorAttention { attention: attn.attention.clone(), prior: None };
            // (`output` asks for the weights, which takes the composed path: rounding apart)
            assert!(max_diff(output(&upper, x.clone(), &mask).context, plain) < 1e-6);
        }
        attn.prior = None;
        assert_eq!(
            attn.num_params(),
            GaussianPriorConfig::default().heads().init(16, 0.2, 0.2, Positioning::NONE, &dev).num_params()
        );
    }
}
