//! Evolving attention, the `evolving` kind (Wang, Yang, Bai, Zhang, Bai, Yu, Zhang, Huang, Tong
//! 2021, Evolving Attention with Residual Convolutions; the "Predictive Attention Transformer"
//! of the surveys): each layer's attention logits mix a 2-D convolution of the previous layer's
//! into its own, the heads being the convolution's channels:
//!
//! A_l^in = α_l · CNN(Â_{l−1}) + (1 − α_l) · S_l,   S_l = Q_l K_lᵀ/√d + B_l,
//! CNN(A) = A + Conv(A),   A_l = softmax(A_l^in + M),   head(l) = A_l V_l,
//!
//! where B_l is the position scheme's bias on the scores (if any), M the mask, Conv a k_q × k_k
//! convolution over the (query, key) plane with `n_heads` input and output channels, and Â_{l−1}
//! the previous layer's A^in with its hidden entries set to 0.
//!
//! Choices (the survey texts give only the convex combination with α and a 2-D convolution;
//! the paper is followed where they are silent):
//! - What travels: the previous layer's logits input A_{l−1}^in (not its probabilities, not its
//!   raw scores), so the maps evolve along the whole stack as in the paper. It is carried
//!   unmasked through [`CarriedMaps`]; gradients flow back through every layer's maps.
//! - α: one learned scalar per layer, α = σ(a), a initialised so that α starts at `alpha`
//!   (default 0.1: the layer starts close to its own scores). The reference texts give no
//!   value for α; learning it costs one parameter per layer. α weighs the convolved previous
//!   map, as in the paper's A^in = α·CNN(·) + (1 − α)·A_logit (the survey's sentence reads as if
//!   α went to the generated scores; the paper's form is followed).
//! - CNN: the paper's residual form A + Conv(A), one linear convolution without bias (a bias
//!   per output head adds the same constant to a whole row of logits, which the softmax
//!   ignores) and without activation; the kernel starts at zero, so the first step is
//!   α·Â_{l−1} + (1 − α)·S_l. The paper's kernel is 3 × 3 (`kernel = [3, 3]`).
//! - The first layer, and a layer run alone (nothing carried), is plain multi-head attention:
//!   A_1^in = S_1. A shared (Universal Transformer) block convolves the map of its previous
//!   application.
//! - Causality. Under a causal mask the kernel reads the query's own row and the k_q − 1 rows
//!   before it (its last row sits on the query's own row), and k_k columns centred on the key:
//!   rows after the query would carry later tokens (row i + 1 of the previous map depends on
//!   token i + 1). Entries of the previous map that this layer's mask hides (keys after their
//!   query, padding, keys beyond `max_back`) depend on later tokens, so they are set to 0 — a
//!   constant, not data, and not −1e9, which the convolution would mix into visible entries —
//!   before the convolution; the mask is applied again after mixing. Rows before the first
//!   query and columns outside the keys are zero padding. Every visible entry (i, j) of A_l^in
//!   then depends on tokens up to i alone, exactly (the leak test asks for identical bits).
//! - Under a bidirectional mask (masked LM) the kernel is centred along both axes (an even k_q
//!   reaches one row further back than ahead).
//! - Cached decoding: a new query's row needs the previous layer's rows of the k_q − 1 queries
//!   before it. The layer keeps them in its decoding state ([`EvolvingState`], beside its KV
//!   cache) as the convolution saw them (hidden entries 0), and widens them with zero columns as
//!   keys arrive (a new key is hidden from an older query, so 0 is what the full forward saw
//!   there): decoding equals the full forward. A block skipped by an early exit (CALM) fills its
//!   KV cache and records zero rows for the skipped positions (`extend_cache` is handed no
//!   previous map), so later tokens' convolutions see no previous map there.
//!   Under a bidirectional mask decoding cannot equal the full forward (later rows are needed),
//!   as for every bidirectional model.
//! - The convolution is Burn's `conv2d` (stride 1, no padding) on the map padded explicitly by
//!   concatenating zero rows and columns: one op on every backend, whose autodiff keeps only its
//!   input and kernel (a sum of shifted copies would keep k_q · k_k shifted L × L maps per
//!   layer), and the asymmetric (causal) padding is ours, not a backend option.
//! - The scores of every layer are needed, so the fused attention kernel does not apply: this
//!   kind takes the composed path, like RealFormer and talking heads.
//!
//! `form = "released-code"` is the mixing of the authors' released code
//! (github.com/pkuyym/EvolvingAttention, `EAAugmentedConv1d`), which differs from the paper's
//! equation: the current scores and the previous map are mixed first, then a convolution with a
//! bias and a LeakyReLU (slope 0.01) is added residually,
//!
//! M_l = (1 − β)·S_l + β·Â_{l−1},   A_l^in = α·LeakyReLU(Conv(M_l) + b) + (1 − α)·M_l,
//!
//! with α and β fixed numbers (hyperparameters there, not learned), the kernel and bias drawn as
//! PyTorch's `Conv2d` draws them (uniform in ±1/√(n_heads·k_q·k_k)), and Â_{l−1} the previous
//! layer's A^in as in the paper's form. Hidden entries of M are set to 0 before the convolution,
//! and decoding keeps M's last k_q − 1 rows (they hold this layer's own scores), so the
//! causality and cached-decoding properties above hold for it too.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::{leaky_relu, sigmoid};
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::{AttentionState, CarriedMaps};

attention_config! {
    /// `model.attention` with `kind = "evolving"`.
    pub struct EvolvingConfig [n_heads, n_kv_heads, head_dim, dropout, bias, normaliser] {
        /// `[k_q, k_k]`, the convolution's extent over the previous layer's map: k_q query rows
        /// (the query's own and the k_q − 1 before it under a causal mask, centred under a
        /// bidirectional one) and k_k key columns centred on the key (odd). Default `[3, 3]`,
        /// the paper's.
        pub kernel: [usize; 2] = [3, 3],
        /// `paper` (default): the paper's equation, α learned; `released-code`: the authors'
        /// code's mixing, β then a convolution with a bias and a LeakyReLU, α and β fixed.
        pub form: EvolvingForm = EvolvingForm::Paper,
        /// α: under `paper` its value at initialisation, in (0, 1), the share of the convolved
        /// previous map in the logits (learned per layer through a sigmoid); under
        /// `released-code` the fixed share of the activated convolution, in [0, 1]. Default 0.1.
        pub alpha: f64 = 0.1,
        /// `released-code` only: β, the previous map's share in M, in [0, 1]. Default 0.5 (the
        /// default argument in the authors' code).
        pub beta: f64 = 0.5,
    }
}

/// `model.attention.form` of the `evolving` kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvolvingForm {
    /// A^in = α·(Â + Conv(Â)) + (1 − α)·S, α learned: the paper's equation.
    #[default]
    Paper,
    /// M = (1 − β)·S + β·Â, A^in = α·LeakyReLU(Conv(M) + b) + (1 − α)·M, α and β fixed: the
    /// authors' released code.
    ReleasedCode,
}

impl EvolvingConfig {
    head_methods!();

    /// The layer for `d_model`: `full`'s heads, a zero kernel (the first step is α·Â + (1 − α)·S)
    /// and a = ln(α / (1 − α)) for the configured α.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> EvolvingAttention {
        let h = self.n_heads;
        let [kq, kk] = self.kernel;
        let attention = self.heads().init(d_model, init_std, out_std, position, device);
        match self.form {
            EvolvingForm::Paper => {
                // α = σ(a): a = ln(α / (1 − α))
                let logit = (self.alpha / (1.0 - self.alpha)).ln() as f32;
                EvolvingAttention {
                    attention,
                    conv: Param::from_tensor(Tensor::zeros([h, h, kq, kk], device)),
                    alpha: Some(Param::from_tensor(Tensor::from_data(TensorData::new(vec![logit], [1]), device))),
                    bias: None,
                    released_code: None,
                }
            }
            EvolvingForm::ReleasedCode => {
                // PyTorch's Conv2d default: weights and bias uniform in ±1/√fan_in
                let bound = 1.0 / ((h * kq * kk) as f64).sqrt();
                let uniform = Distribution::Uniform(-bound, bound);
                EvolvingAttention {
                    attention,
                    conv: Param::from_tensor(Tensor::random([h, h, kq, kk], uniform, device)),
                    alpha: None,
                    bias: Some(Param::from_tensor(Tensor::random([h], uniform, device))),
                    released_code: Some([self.alpha, self.beta]),
                }
            }
        }
    }
}

impl AttentionKind for EvolvingConfig {
    type Module = EvolvingAttention;
    const SUMMARY: &'static str = "evolving attention: each layer's logits mix a residual k_q × k_k convolution (heads as channels, causal along queries) of the previous layer's, A_in = α·(A + Conv(A))_prev + (1 − α)·QKᵀ/√d; KV cache";
    const PAPER: &'static str =
        "Wang, Yang, Bai, Zhang, Bai, Yu, Zhang, Huang, Tong 2021, Evolving Attention with Residual Convolutions";
    const CAPS: Capabilities = Capabilities { cross_layer: true, ..caps::SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        let [kq, kk] = self.kernel;
        check(kq >= 1 && !kk.is_multiple_of(2), || {
            format!(
                "model.attention.kernel = [{kq}, {kk}] must be [k_q, k_k] with k_q at least 1 and k_k odd (centred on the key): use e.g. [3, 3]"
            )
        })?;
        if self.form == EvolvingForm::ReleasedCode {
            for (key, v) in [("alpha", self.alpha), ("beta", self.beta)] {
                check((0.0..=1.0).contains(&v), || {
                    format!(
                        "model.attention.{key} = {v} must be in [0, 1] (a fixed share under form = \"released-code\")"
                    )
                })?;
            }
            return Ok(());
        }
        check(self.alpha > 0.0 && self.alpha < 1.0, || {
            format!(
                "model.attention.alpha = {} must be in (0, 1) (the initial share of the previous layer's map; default 0.1)",
                self.alpha
            )
        })
    }

    /// Full attention's, plus per head and key the convolution (h · k_q · k_k multiply–adds)
    /// and the residual and α mix.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.n_heads as u64;
        let [kq, kk] = self.kernel;
        let per_key = 2 * h * h * (kq * kk) as u64 + 4 * h;
        self.heads().flops_per_token(d_model, len_k) + per_key * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let mut variants = TestVariant::score_path(Self::default());
        variants.push(TestVariant::new(
            "the released code's form",
            Self { form: EvolvingForm::ReleasedCode, alpha: 0.5, ..Default::default() },
        ));
        variants
    }
}

/// Evolving attention: multi-head attention whose logits mix in a residual convolution of the
/// previous layer's, A^in = α·CNN(Â_{l−1}) + (1 − α)·S.
#[derive(Module, Debug)]
pub struct EvolvingAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// The convolution's kernel, `[n_heads (out), n_heads (in), k_q, k_k]` (zero at init under
    /// the paper's form).
    pub conv: Param<Tensor<4>>,
    /// a, `[1]`: α = σ(a) (the paper's form).
    pub alpha: Option<Param<Tensor<1>>>,
    /// The convolution's bias per head, `[n_heads]` (the released code's form).
    pub bias: Option<Param<Tensor<1>>>,
    /// `[α, β]`, fixed: the released code's form.
    pub released_code: Option<[f64; 2]>,
}

/// A_l^in, `[b, n_heads, len_q, len_k]`: the logits input one layer hands the next (unmasked).
#[derive(Debug, Clone)]
pub struct EvolvingMaps(pub Tensor<4>);

/// Decoding state of one layer: its KV cache and the previous layer's rows the next queries'
/// convolution reads.
#[derive(Debug, Clone, Default)]
pub struct EvolvingState {
    /// The layer's own keys and values.
    pub kv: KvCache,
    /// The previous layer's map (hidden entries 0) for the last k_q − 1 queries, as the
    /// convolution saw it, `[b, n_heads, k_q − 1, keys when stored]` (zero rows before the first
    /// query); `None` = all zeros.
    pub rows: Option<Tensor<4>>,
}

impl EvolvingAttention {
    /// α: σ(a) under the paper's form, the fixed one under the released code's.
    pub fn alpha(&self) -> Tensor<1> {
        match (&self.alpha, self.released_code) {
            (Some(a), _) => sigmoid(a.val()),
            (None, Some([alpha, _])) => {
                Tensor::from_data(TensorData::new(vec![alpha as f32], [1]), &self.conv.val().device())
            }
            (None, None) => unreachable!("an evolving layer has a learned or a fixed α"),
        }
    }

    /// The layer over `input`, mixing in the map `input.carried` brings from the previous layer
    /// (none: plain attention) and handing its own A^in on; `state` for decoding.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut EvolvingState>) -> AttentionOutput {
        let a = &self.attention;
        let (cache, rows) = match state {
            Some(EvolvingState { kv, rows }) => (Some(kv), Some(rows)),
            None => (None, None),
        };
        let causal = input.mask.causal;
        let p = a.project(input.query, input.key_value, input.mask, cache);
        let own = a.scores(&p);
        let hidden = hidden_entries(input.mask, input.dense_mask, &p, &own.device());
        let mut carried = input.carried;
        let previous = carried.as_deref_mut().and_then(|c| c.take::<EvolvingMaps>());
        let logits = match previous {
            None => own,
            Some(EvolvingMaps(prev)) => {
                let (want, got) = (own.dims(), prev.dims());
                assert_eq!(
                    want, got,
                    "evolving attention: the previous layer's map {got:?} does not cover this layer's scores {want:?}"
                );
                // what hidden entries hold depends on later tokens: a constant 0 instead
                let zero_hidden = |t: Tensor<4>| match hidden.clone() {
                    Some(m) => t.mask_fill(m, 0.0),
                    None => t,
                };
                let visible = zero_hidden(prev);
                match self.released_code {
                    None => {
                        let evolved = visible.clone() + self.convolve(visible, causal, rows);
                        let alpha = self.alpha().reshape([1, 1, 1, 1]);
                        evolved * alpha.clone() + own * (alpha.neg() + 1.0)
                    }
                    Some([alpha, beta]) => {
                        let mixed = zero_hidden(own.mul_scalar(1.0 - beta) + visible.mul_scalar(beta));
                        let mut conv = self.convolve(mixed.clone(), causal, rows);
                        if let Some(b) = &self.bias {
                            conv = conv + b.val().unsqueeze_dims::<4>(&[0, 2, 3]);
                        }
                        leaky_relu(conv, 0.01).mul_scalar(alpha) + mixed.mul_scalar(1.0 - alpha)
                    }
                }
            }
        };
        if let Some(c) = carried {
            c.put(EvolvingMaps(logits.clone()));
        }
        let scores = match hidden {
            Some(m) => logits.mask_fill(m, MASKED_SCORE),
            None => logits,
        };
        let probs = a.normalise(scores);
        let weights = input.need_weights.then(|| probs.clone());
        let context = a.combine(a.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }

    /// Conv(Â) for this call's rows: `visible` `[b, h, len_q, len_k]` (hidden entries 0), padded
    /// with the rows before it (`rows`, kept while decoding under a causal mask; zeros
    /// otherwise), zero rows after it (bidirectional) and zero columns on both sides. Stores the
    /// last k_q − 1 rows in `rows` for the next call.
    fn convolve(&self, visible: Tensor<4>, causal: bool, rows: Option<&mut Option<Tensor<4>>>) -> Tensor<4> {
        let weight = self.conv.val();
        let [_, _, kq, kk] = weight.dims();
        let [b, h, lq, lk] = visible.dims();
        let device = visible.device();
        // rows read before and after the query's own, columns left and right of the key
        let (back, ahead) = if causal { (kq - 1, 0) } else { (kq / 2, kq - 1 - kq / 2) };
        let (left, right) = (kk / 2, kk - 1 - kk / 2);
        // a bidirectional kernel would need later rows too: only causal decoding keeps rows
        let rows = if causal { rows } else { None };
        let mut window = Vec::with_capacity(3);
        if back > 0 {
            window.push(match rows.as_deref().cloned().flatten() {
                Some(r) => widen(r, lk),
                None => Tensor::zeros([b, h, back, lk], &device),
            });
        }
        window.push(visible);
        if ahead > 0 {
            window.push(Tensor::zeros([b, h, ahead, lk], &device));
        }
        let window = Tensor::cat(window, 2);
        if let Some(r) = rows
            && back > 0
        {
            // causal: the window is the `back` rows before and this call's `lq`
            *r = Some(window.clone().narrow(2, lq, back));
        }
        let height = back + lq + ahead;
        let mut columns = Vec::with_capacity(3);
        if left > 0 {
            columns.push(Tensor::zeros([b, h, height, left], &device));
        }
        columns.push(window);
        if right > 0 {
            columns.push(Tensor::zeros([b, h, height, right], &device));
        }
        let padded = Tensor::cat(columns, 3);
        // [b, h, back + lq + ahead, lk + kk − 1] → [b, h, lq, lk]
        conv2d(padded, weight, None, ConvOptions::new([1, 1], [0, 0], [1, 1], 1))
    }

    /// The forward of one layer given the previous layer's A^in (for tests and analysis):
    /// returns the output and this layer's A^in.
    pub fn forward_after(&self, input: AttentionInput, previous: Option<Tensor<4>>) -> (AttentionOutput, Tensor<4>) {
        let mut carried = CarriedMaps::default();
        if let Some(m) = previous {
            carried.put(EvolvingMaps(m));
        }
        let out = self.forward(input.with_carried(&mut carried), None);
        let maps = carried.take::<EvolvingMaps>().expect("the forward leaves its logits input").0;
        (out, maps)
    }
}

/// The entries of the scores the mask hides (`true`), broadcastable to `[b, h, len_q, len_k]`:
/// the model's dense mask where it covers these keys, built from `mask` otherwise (as
/// [`MultiHeadAttention::mask_scores`] does).
fn hidden_entries(
    mask: &AttentionMask,
    dense: Option<Tensor<4, Bool>>,
    p: &Projected,
    device: &Device,
) -> Option<Tensor<4, Bool>> {
    let (lq, lk) = (p.layout.len_q, p.layout.len_k);
    match (dense, p.layout.k_start == mask.k_start) {
        (Some(m), true) => Some(m),
        _ => AttentionMask { k_start: p.layout.k_start, ..mask.clone() }.score_mask(lq, lk, device),
    }
}

/// `rows` `[b, h, n, keys]` widened with zero columns to `len_k` keys (keys that arrived after
/// them, hidden from their queries).
fn widen(rows: Tensor<4>, len_k: usize) -> Tensor<4> {
    let [b, h, n, have] = rows.dims();
    if have >= len_k {
        return rows;
    }
    let device = rows.device();
    Tensor::cat(vec![rows, Tensor::zeros([b, h, n, len_k - have], &device)], 3)
}

impl AttentionMechanism for EvolvingAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        EvolvingAttention::forward(self, input, state.map(|s| s.get_or_default::<EvolvingState>()))
    }

    /// Keys and values of the skipped positions into the cache; their rows of the previous map
    /// are not handed over (no carried maps here) and are recorded as zeros.
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        let st = state.get_or_default::<EvolvingState>();
        let n = x.dims()[1];
        self.attention.project(x, None, mask, Some(&mut st.kv));
        if mask.causal
            && let Some(r) = st.rows.take()
        {
            let [b, h, back, _] = r.dims();
            let lk = st.kv.len();
            let device = r.device();
            let all = Tensor::cat(vec![widen(r, lk), Tensor::zeros([b, h, n, lk], &device)], 2);
            // `None` stands for zero rows
            st.rows = (n < back).then(|| all.narrow(2, n, back));
        }
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use burn::tensor::activation::softmax;

    fn setup(device: &Device) -> (EvolvingAttention, Tensor<3>) {
        device.seed(11);
        let attn = EvolvingConfig::default().init(16, 0.2, 0.2, Positioning::NONE, device);
        (attn, Tensor::random([2, 6, 16], Distribution::Normal(0.0, 1.0), device))
    }

    fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// Two layers from one config, with random kernels (the convolution reads other rows,
    /// columns and heads), α = 0.5, in `form`.
    fn chained_form(kernel: [usize; 2], form: EvolvingForm, device: &Device) -> Vec<EvolvingAttention> {
        device.seed(13);
        let cfg = EvolvingConfig { kernel, form, alpha: 0.5, ..Default::default() };
        (0..2)
            .map(|_| {
                let mut l = cfg.init(16, 0.3, 0.3, Positioning::NONE, device);
                let dims = l.conv.val().dims();
                l.conv = Param::from_tensor(Tensor::random(dims, Distribution::Normal(0.0, 0.3), device));
                if l.alpha.is_some() {
                    l.alpha = Some(Param::from_tensor(Tensor::zeros([1], device)));
                }
                l
            })
            .collect()
    }

    /// `x` through the layers with one carried slot, as the model's block loop runs them;
    /// `states` holds one decoding state per layer (none: the full forward).
    fn chain(
        layers: &[EvolvingAttention],
        x: Tensor<3>,
        mask: &AttentionMask,
        states: &mut [AttentionState],
    ) -> Tensor<3> {
        let mut slot = CarriedMaps::default();
        let mut h = x;
        for (i, layer) in layers.iter().enumerate() {
            let input = AttentionInput::self_attention(h, mask).with_carried(&mut slot);
            h = AttentionMechanism::forward(layer, input, states.get_mut(i)).context;
        }
        h
    }

    #[test]
    fn nothing_carried_is_plain_multi_head_attention_and_leaves_its_scores() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let alone = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let (first, maps) = attn.forward_after(AttentionInput::self_attention(x.clone(), &mask), None);
            for (name, out) in [("a layer alone", alone), ("a first layer", first.context)] {
                let diff = max_diff(out, plain.clone());
                assert!(diff < 1e-5, "{name} differs from full attention by {diff}");
            }
            // the first layer's A^in is its own scores
            let a = &attn.attention;
            let own = a.scores(&a.project(x.clone(), None, &mask, None));
            let diff = max_diff(maps, own);
            assert!(diff < 1e-6, "the first layer's carried map is not S (off by {diff})");
        }
    }

    #[test]
    fn with_the_kernel_at_zero_the_logits_are_alpha_previous_plus_one_minus_alpha_own() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let alpha = EvolvingConfig::default().alpha;
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let previous = Tensor::<4>::random([2, 4, 6, 6], Distribution::Normal(0.0, 2.0), &dev);
            let input = AttentionInput::self_attention(x.clone(), &mask).with_weights();
            let (out, maps) = attn.forward_after(input, Some(previous.clone()));
            let a = &attn.attention;
            let p = a.project(x.clone(), None, &mask, None);
            let own = a.scores(&p);
            let visible = match mask.score_mask(6, 6, &dev) {
                Some(m) => previous.mask_fill(m, 0.0),
                None => previous,
            };
            let expected = visible.mul_scalar(alpha) + own.mul_scalar(1.0 - alpha);
            let diff = max_diff(maps, expected.clone());
            assert!(diff < 1e-5, "the carried A^in is not α·Â_prev + (1 − α)·S (off by {diff})");
            let weights = softmax(a.mask_scores(expected, &mask, None, &p), 3);
            let diff = max_diff(out.weights.unwrap(), weights);
            assert!(diff < 1e-6, "weights differ from softmax(α·A_prev + (1 − α)·S + M) by {diff}");
        }
    }

    #[test]
    fn a_hand_set_kernel_reads_the_rows_columns_and_heads_it_points_at() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        let (h, kq, kk) = (4, 3, 3);
        // out head o: 1 × (head o, kernel row 1, centre column) + 0.5 × (head o + 1, row 2, column + 1)
        let mut w = vec![0.0f32; h * h * kq * kk];
        let at = |o: usize, i: usize, r: usize, c: usize| ((o * h + i) * kq + r) * kk + c;
        for o in 0..h {
            w[at(o, o, 1, 1)] = 1.0;
            w[at(o, (o + 1) % h, 2, 2)] = 0.5;
        }
        attn.conv = Param::from_tensor(Tensor::from_data(TensorData::new(w, [h, h, kq, kk]), &dev));
        attn.alpha = Some(Param::from_tensor(Tensor::zeros([1], &dev))); // α = 0.5
        let zeros_row = || Tensor::<4>::zeros([2, 4, 1, 6], &dev);
        let zeros_col = || Tensor::<4>::zeros([2, 4, 6, 1], &dev);
        // row i takes row i − 1 / i + 1, column j takes column j + 1, head o takes head o + 1
        let down = |t: Tensor<4>| Tensor::cat(vec![zeros_row(), t.narrow(2, 0, 5)], 2);
        let up = |t: Tensor<4>| Tensor::cat(vec![t.narrow(2, 1, 5), zeros_row()], 2);
        let next_key = |t: Tensor<4>| Tensor::cat(vec![t.narrow(3, 1, 5), zeros_col()], 3);
        let next_head = |t: Tensor<4>| Tensor::cat(vec![t.clone().narrow(1, 1, 3), t.narrow(1, 0, 1)], 1);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let previous = Tensor::<4>::random([2, 4, 6, 6], Distribution::Normal(0.0, 1.0), &dev);
            let (_, maps) =
                attn.forward_after(AttentionInput::self_attention(x.clone(), &mask), Some(previous.clone()));
            let visible = match mask.score_mask(6, 6, &dev) {
                Some(m) => previous.mask_fill(m, 0.0),
                None => previous,
            };
            // causal: kernel rows are offsets −2, −1, 0; bidirectional: −1, 0, +1
            let conv = if mask.causal {
                down(visible.clone()) + next_key(next_head(visible.clone())).mul_scalar(0.5)
            } else {
                visible.clone() + up(next_key(next_head(visible.clone()))).mul_scalar(0.5)
            };
            let a = &attn.attention;
            let own = a.scores(&a.project(x.clone(), None, &mask, None));
            let expected = (visible + conv).mul_scalar(0.5) + own.mul_scalar(0.5);
            let diff = max_diff(maps, expected);
            assert!(diff < 1e-5, "causal {}: A^in differs from the hand-computed convolution by {diff}", mask.causal);
        }
    }

    #[test]
    fn two_chained_layers_leak_nothing_from_a_later_token() {
        let dev = Device::flex();
        let forms = [EvolvingForm::Paper, EvolvingForm::ReleasedCode];
        for (kernel, form) in [[3, 3], [4, 5]].into_iter().flat_map(|k| forms.map(|f| (k, f))) {
            let l = chained_form(kernel, form, &dev);
            let x = Tensor::<3>::random([2, 7, 16], Distribution::Normal(0.0, 1.0), &dev);
            let mask = AttentionMask::causal();
            let before = chain(&l, x.clone(), &mask, &mut []);
            let changed =
                x.slice_assign([0..2, 3..4, 0..16], Tensor::random([2, 1, 16], Distribution::Normal(0.0, 1.0), &dev));
            let after = chain(&l, changed, &mask, &mut []);
            let moved = max_diff(after.clone().narrow(1, 3, 1), before.clone().narrow(1, 3, 1));
            assert!(moved > 1e-4, "kernel {kernel:?}: the changed position's output must move (moved {moved})");
            let leak = max_diff(after.narrow(1, 0, 3), before.narrow(1, 0, 3));
            assert_eq!(leak, 0.0, "kernel {kernel:?}: a later token changed an earlier output by {leak}");
        }
    }

    #[test]
    fn cached_decoding_through_two_layers_equals_the_full_forward() {
        let dev = Device::flex();
        let forms = [EvolvingForm::Paper, EvolvingForm::ReleasedCode];
        for (kernel, form) in [[3, 3], [4, 5], [1, 1]].into_iter().flat_map(|k| forms.map(|f| (k, f))) {
            let l = chained_form(kernel, form, &dev);
            let x = Tensor::<3>::random([2, 7, 16], Distribution::Normal(0.0, 1.0), &dev);
            let full = chain(&l, x.clone(), &AttentionMask::causal(), &mut []);
            let mut states = [AttentionState::default(), AttentionState::default()];
            let (mut parts, mut start) = (Vec::new(), 0);
            // a prompt of 3, then one token at a time
            for n in [3, 1, 1, 1, 1] {
                let mask = AttentionMask::causal().at(start, 0);
                parts.push(chain(&l, x.clone().narrow(1, start, n), &mask, &mut states));
                start += n;
            }
            let diff = max_diff(full, Tensor::cat(parts, 1));
            assert!(diff < 1e-5, "kernel {kernel:?}: cached decoding differs from the full forward by {diff}");
            let kept = states[1].get::<EvolvingState>().expect("the second layer keeps its state");
            assert_eq!(kept.kv.len(), 7);
            let rows = kept.rows.as_ref().map(|r| r.dims());
            assert_eq!(rows, (kernel[0] > 1).then_some([2, 4, kernel[0] - 1, 7]), "kernel {kernel:?}: the kept rows");
        }
    }

    #[test]
    fn the_released_codes_form_mixes_by_beta_then_adds_an_activated_convolution_by_alpha() {
        let dev = Device::flex();
        dev.seed(5);
        let cfg = EvolvingConfig {
            kernel: [1, 1],
            form: EvolvingForm::ReleasedCode,
            alpha: 0.3,
            beta: 0.6,
            ..Default::default()
        };
        let attn = cfg.init(16, 0.3, 0.3, Positioning::NONE, &dev);
        assert!(attn.alpha.is_none() && attn.bias.is_some());
        let x = Tensor::<3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &dev);
        let prev = Tensor::<4>::random([2, 4, 5, 5], Distribution::Normal(0.0, 2.0), &dev);
        let mask = AttentionMask::bidirectional();
        let (_, got) = attn.forward_after(AttentionInput::self_attention(x.clone(), &mask), Some(prev.clone()));
        // by hand, head by head: M = 0.4·S + 0.6·Â, out[h] = Σ_h' W[h, h']·M[h'] + b[h]
        let a = &attn.attention;
        let own = a.scores(&a.project(x, None, &mask, None));
        let m = own.mul_scalar(0.4) + prev.mul_scalar(0.6);
        let w = attn.conv.val().reshape([4, 4]);
        let b = attn.bias.as_ref().unwrap().val();
        let mut heads = Vec::new();
        for h in 0..4 {
            let mut acc = Tensor::<4>::zeros([2, 1, 5, 5], &dev) + b.clone().narrow(0, h, 1).reshape([1, 1, 1, 1]);
            for g in 0..4 {
                let wg = w.clone().narrow(0, h, 1).narrow(1, g, 1).reshape([1, 1, 1, 1]);
                acc = acc + m.clone().narrow(1, g, 1) * wg;
            }
            heads.push(acc);
        }
        let conv = Tensor::cat(heads, 1);
        let leaky = conv.clone().clamp_min(0.0) + conv.clamp_max(0.0).mul_scalar(0.01);
        let want = leaky.mul_scalar(0.3) + m.mul_scalar(0.7);
        let diff = max_diff(got, want);
        assert!(diff < 1e-5, "the released code's A^in differs from its formula by {diff}");
        // α and β are fixed: no parameter learns them
        let refused = EvolvingConfig { form: EvolvingForm::ReleasedCode, beta: 1.5, ..Default::default() };
        assert!(refused.validate(16).unwrap_err().to_string().contains("beta = 1.5"));
    }
}
