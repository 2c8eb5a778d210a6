//! Multi-head scaled dot-product attention (Vaswani et al. 2017), the `full` kind:
//!
//! Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,   head_i = Attention(X W_i^Q, X W_i^K, X W_i^V),
//! MultiHead(X) = [head_1; …; head_h] W^O,
//!
//! where M is −∞ on hidden entries (future keys, padding). Grouped-query attention shares each
//! K/V head among `n_heads / n_kv_heads` query heads: the queries of a group are stacked along
//! the length so one batched GEMM serves the group and K/V are never copied.
//!
//! A relative position scheme (`model.position`) lives inside: it rotates new queries and keys
//! (RoPE), acts on the scaled scores with their absolute positions (bias, multiplier or extra
//! q/k terms), and may add a term to the context (Shaw's value vectors).
//!
//! The kind is the engine ([`MultiHeadAttention`]) with nothing changed: its table is the
//! engine's settings ([`MultiHeadAttentionConfig`]).

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::head_losses::{self, Disagreement, DiversityConfig, GuidanceConfig};
use crate::engine::heads::{MultiHeadAttention, Projected};
use crate::engine::normaliser::Normaliser;
use crate::kind::{AttentionKind, AttentionMechanism, HeadSettings, LayerInit, TestVariant, caps};
use crate::state::AttentionState;
use burn::prelude::*;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check, error::divisors};
use variorum_position::{PositionConfig, ScoreLayout};

impl AttentionKind for MultiHeadAttentionConfig {
    type Module = MultiHeadAttention;
    const SUMMARY: &'static str = "multi-head scaled dot-product attention; grouped-/multi-query K/V heads; KV cache";
    const PAPER: &'static str =
        "Vaswani et al. 2017, Attention Is All You Need; Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA)";
    // the graph mask acts through the dense score mask
    const CAPS: Capabilities = Capabilities { graph: true, ..caps::CROSS_SCORES };

    fn head_settings(&self) -> Option<HeadSettings> {
        let Self { n_heads, n_kv_heads, head_dim, dropout, .. } = *self;
        Some(HeadSettings { n_heads, n_kv_heads, head_dim, dropout })
    }

    fn with_head_settings(&self, heads: &HeadSettings) -> Self {
        let HeadSettings { n_heads, n_kv_heads, head_dim, dropout } = *heads;
        Self { n_heads, n_kv_heads, head_dim, dropout, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        check(self.n_heads > 0, || "model.attention.n_heads must be at least 1".into())?;
        if self.head_dim.is_none() {
            check(d_model % self.n_heads == 0, || {
                format!(
                    "model.attention.n_heads = {} does not divide model.d_model = {d_model}: use one of {:?} or set model.attention.head_dim",
                    self.n_heads,
                    divisors(d_model)
                )
            })?;
        }
        check(self.head_dim != Some(0), || "model.attention.head_dim must be at least 1".into())?;
        let kv = self.kv_heads();
        check(kv > 0 && self.n_heads % kv == 0, || {
            format!(
                "model.attention.n_kv_heads = {kv} does not divide model.attention.n_heads = {}: use one of {:?}",
                self.n_heads,
                divisors(self.n_heads)
            )
        })?;
        crate::kind::check_dropout(self.dropout)?;
        head_losses::validate(self.diversity.as_ref(), self.guidance.as_ref(), self.n_heads)
    }

    fn capabilities(&self) -> Capabilities {
        // the head losses are defined on self-attention maps
        let losses = self.diversity.is_some() || self.guidance.is_some();
        Capabilities { aux_losses: losses, cross: Self::CAPS.cross && !losses, ..Self::CAPS }
    }

    /// Multiply–adds per token of the score-forming part, for a context of `len_k` keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let hd = (self.n_heads * self.head_dim(d_model)) as u64;
        let kvd = (self.kv_heads() * self.head_dim(d_model)) as u64;
        let d = d_model as u64;
        // projections + QKᵀ + AV, 2 FLOPs per multiply–add
        2 * (d * (hd + 2 * kvd) + hd * d) + 2 * 2 * hd * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> MultiHeadAttention {
        self.init(init.d_model, init.init_std, init.out_std, init.position, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let heads = |n_heads, n_kv_heads| Self { n_heads, n_kv_heads, ..Default::default() };
        vec![
            TestVariant::new("grouped-query", heads(4, Some(2))),
            TestVariant::new("multi-query", heads(4, Some(1))),
            TestVariant::new(
                "head_dim 24, no bias",
                Self { n_heads: 2, head_dim: Some(24), bias: false, ..Default::default() },
            ),
            // every normaliser through the fused kernel (training) and the composed path (decoding)
            TestVariant::new("relu", Self { normaliser: Normaliser::Relu, ..Default::default() }),
            TestVariant::new("sigmoid", Self { normaliser: Normaliser::Sigmoid, ..Default::default() }),
            TestVariant::new("sparsemax", Self { normaliser: Normaliser::Sparsemax, ..Default::default() }),
            TestVariant::new(
                "entmax-1.5, grouped-query",
                Self { normaliser: Normaliser::Entmax15, ..heads(4, Some(2)) },
            ),
            TestVariant::new("head temperature", Self { head_temperature: true, ..Default::default() }).masked(),
            // T5's attention: unscaled scores, no biases, its bucketed bias
            TestVariant::new(
                "unscaled, no bias + position t5",
                Self { scaled: false, bias: false, ..Default::default() },
            )
            .with_position(PositionConfig::T5(Default::default())),
            TestVariant::new(
                "sparsemax + head temperature + position alibi",
                Self { normaliser: Normaliser::Sparsemax, head_temperature: true, ..Default::default() },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
            // auxiliary losses on the heads (Li et al. 2018; Deshpande & Narasimhan 2020)
            TestVariant::new(
                "diversity on outputs",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Outputs, weight: 0.1 }),
                    ..Default::default()
                },
            ),
            TestVariant::new(
                "diversity on positions, grouped-query",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Positions, weight: 0.1 }),
                    ..heads(4, Some(2))
                },
            ),
            TestVariant::new(
                "diversity on subspace",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Subspace, weight: 0.1 }),
                    ..Default::default()
                },
            ),
            TestVariant::new(
                "guidance previous, first",
                Self {
                    guidance: Some(GuidanceConfig {
                        patterns: vec![head_losses::Pattern::Previous, head_losses::Pattern::First],
                        weight: 0.1,
                    }),
                    ..Default::default()
                },
            ),
        ]
        .into_iter()
        .chain(
            // relative schemes with grouped-query heads (keys shared by several query heads)
            [
                PositionConfig::TransformerXl(Default::default()),
                PositionConfig::Deberta(variorum_position::DebertaConfig { max_distance: 4, ..Default::default() }),
                PositionConfig::Rope(Default::default()),
            ]
            .map(|p| {
                TestVariant::new(format!("grouped-query + position {}", p.kind()), heads(4, Some(2))).with_position(p)
            }),
        )
        .collect()
    }
}

/// A source's projected keys and values, `[b, n_kv_heads, len_source, head_dim]` each, kept in
/// the cross-attention's state while a decoder generates over it.
#[derive(Debug, Clone, Default)]
pub struct SourceKv(Option<(Tensor<4>, Tensor<4>)>);

impl AttentionMechanism for MultiHeadAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        MultiHeadAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.project(x, None, mask, Some(state.kv_mut()));
    }

    /// The source's keys and values projected on the first call and kept (`SourceKv`): each
    /// later call projects its queries only.
    fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput {
        let kept = state.get_or_default::<SourceKv>();
        let (k, v) = match &kept.0 {
            Some(kv) => kv.clone(),
            None => {
                let source = input.key_value.expect("cross-attention reads a source");
                kept.0.get_or_insert(self.qkv.keys_values(source)).clone()
            }
        };
        let q = self.qkv.scaled_queries(input.query, self.scale);
        let m = input.mask;
        let layout = ScoreLayout::new(m.q_start, m.k_start, q.dims()[2], k.dims()[2], m.causal);
        let p = Projected::new(q, k, v, layout, m.max_back);
        let probs = self.normalise(self.mask_scores(self.scores(&p), m, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        AttentionOutput { context: self.combine(self.dropout.forward(probs), &p), weights, aux_losses: Vec::new() }
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        MultiHeadAttention::content_only(self, query, key_value)
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Positioning;
    use crate::engine::heads::HeadLosses;
    use burn::module::Param;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    fn attention(n_heads: usize, n_kv_heads: usize, device: &Device) -> MultiHeadAttention {
        let cfg = MultiHeadAttentionConfig { n_heads, n_kv_heads: Some(n_kv_heads), ..Default::default() };
        cfg.validate(16).unwrap();
        cfg.init(16, 0.2, 0.2, Positioning::NONE, device)
    }

    fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    #[test]
    fn cross_attention_takes_keys_of_another_length() {
        let dev = Device::flex();
        let attn = attention(4, 2, &dev);
        let mask = AttentionMask::bidirectional();
        let out = attn.forward(
            AttentionInput::cross_attention(random([2, 3, 16], &dev), random([2, 7, 16], &dev), &mask).with_weights(),
            None,
        );
        assert_eq!(out.context.dims(), [2, 3, 16]);
        let w = out.weights.unwrap();
        assert_eq!(w.dims(), [2, 4, 3, 7]);
        let row_sums = w.sum_dim(3).sub_scalar(1.0).abs().max().into_scalar::<f32>();
        assert!(row_sums < 1e-5, "attention rows must sum to 1");
    }

    /// `scaled = false` drops the 1/√d_h and nothing else: with queries multiplied by 1/√d_h
    /// (T5's initialisation does it) the unscaled attention is the scaled one.
    #[test]
    fn unscaled_attention_is_scaled_attention_with_queries_times_the_scale() {
        let dev = Device::flex();
        let scaled = attention(4, 2, &dev);
        let cfg = MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(2), scaled: false, ..Default::default() };
        let mut unscaled = cfg.init(16, 0.2, 0.2, Positioning::NONE, &dev);
        unscaled.out = scaled.out.clone();
        let mask = AttentionMask::causal();
        let x = random([2, 5, 16], &dev);
        let run = |a: &MultiHeadAttention| a.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        // the same weights: a different function (scores √d_h = 2 times larger)
        unscaled.qkv = scaled.qkv.clone();
        let apart = (run(&scaled) - run(&unscaled)).abs().max().into_scalar::<f32>();
        assert!(apart > 1e-3, "unscaled scores must change the output ({apart})");
        // the q columns (the first 4 heads × 4) and their bias halved
        let (w, b) = (scaled.qkv.qkv.weight.val(), scaled.qkv.qkv.bias.as_ref().unwrap().val());
        let half =
            |t: Tensor<2>| t.clone().slice_assign([0..t.dims()[0], 0..16], t.slice([0..16, 0..16]).mul_scalar(0.5));
        unscaled.qkv.qkv.weight = Param::from_tensor(half(w));
        let b2 = b.clone().unsqueeze::<2>();
        unscaled.qkv.qkv.bias = Some(Param::from_tensor(
            b2.clone().slice_assign([0..1, 0..16], b2.slice([0..1, 0..16]).mul_scalar(0.5)).squeeze_dim(0),
        ));
        let same = (run(&scaled) - run(&unscaled)).abs().max().into_scalar::<f32>();
        assert!(same < 1e-5, "unscaled attention of queries / √d_h must be scaled attention ({same})");
    }

    #[test]
    fn padded_keys_are_invisible() {
        let dev = Device::flex();
        let attn = attention(4, 4, &dev);
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![false, false, false, true, true], [1, 5]), &dev);
        let mask = AttentionMask::bidirectional().with_padding(pad);
        let q = random([1, 2, 16], &dev);
        let kv = random([1, 5, 16], &dev);
        let changed = kv.clone().slice_assign([0..1, 3..5, 0..16], random([1, 2, 16], &dev));
        let a = attn.forward(AttentionInput::cross_attention(q.clone(), kv.clone(), &mask), None).context;
        let b = attn.forward(AttentionInput::cross_attention(q.clone(), changed.clone(), &mask), None).context;
        assert!((a - b).abs().max().into_scalar::<f32>() < 1e-6);
        let open = AttentionMask::bidirectional();
        let c = attn.forward(AttentionInput::cross_attention(q.clone(), kv, &open), None).context;
        let d = attn.forward(AttentionInput::cross_attention(q, changed, &open), None).context;
        assert!((c - d).abs().max().into_scalar::<f32>() > 1e-4, "without the mask the change must show");
    }

    #[test]
    fn grouped_query_heads_share_keys_and_values() {
        // multi-query: four query heads served by one K/V head, through one fused projection
        // of (4 + 2·1)·head_dim columns
        let dev = Device::flex();
        let attn = attention(4, 1, &dev);
        let mask = AttentionMask::causal();
        let out = attn.forward(AttentionInput::self_attention(random([1, 5, 16], &dev), &mask).with_weights(), None);
        assert_eq!(out.weights.unwrap().dims(), [1, 4, 5, 5]);
        assert_eq!(attn.qkv.qkv.weight.val().dims(), [16, (4 + 2) * 4]);
    }

    /// Grouped-query attention is multi-head attention whose query heads g·h/h_kv … (g+1)·h/h_kv − 1
    /// all read K/V head g (consecutive groups, as LLaMA's): the same layer with every K/V head
    /// copied to the query heads of its group gives the same output, causal and bidirectional,
    /// on the fused kernels and the composed path. Another grouping (head i reading K/V head
    /// i mod h_kv) does not.
    #[test]
    fn grouped_query_heads_are_multi_head_attention_with_each_kv_head_copied_to_its_group() {
        let dev = Device::flex();
        dev.seed(4);
        let grouped = attention(4, 2, &dev);
        let (dh, h, hkv) = (4, 4, 2);
        // the fused projection's columns: q (h·dh) | k (h_kv·dh) | v (h_kv·dh)
        let copy_groups = |t: Tensor<2>, group_of: &dyn Fn(usize) -> usize| {
            let rows = t.dims()[0];
            let q = t.clone().slice([0..rows, 0..h * dh]);
            let part = |base: usize| -> Vec<Tensor<2>> {
                (0..h)
                    .map(|i| t.clone().slice([0..rows, base + group_of(i) * dh..base + (group_of(i) + 1) * dh]))
                    .collect()
            };
            let mut all = vec![q];
            all.extend(part(h * dh));
            all.extend(part(h * dh + hkv * dh));
            Tensor::cat(all, 1)
        };
        let expanded = |group_of: &dyn Fn(usize) -> usize| {
            let mut full = attention(4, 4, &dev);
            full.qkv.qkv.weight = Param::from_tensor(copy_groups(grouped.qkv.qkv.weight.val(), group_of));
            let bias = grouped.qkv.qkv.bias.as_ref().unwrap().val().unsqueeze::<2>();
            full.qkv.qkv.bias = Some(Param::from_tensor(copy_groups(bias, group_of).squeeze_dim(0)));
            full.out = grouped.out.clone();
            full
        };
        let consecutive = expanded(&|i| i / (h / hkv));
        let interleaved = expanded(&|i| i % hkv);
        let x = random([2, 7, 16], &dev);
        for (mask, kernels) in
            [(AttentionMask::causal(), true), (AttentionMask::causal(), false), (AttentionMask::bidirectional(), false)]
        {
            let run = |a: &MultiHeadAttention| {
                let go = || a.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                if kernels { go() } else { variorum_kernels::without_kernels(go) }
            };
            let same = (run(&grouped) - run(&consecutive)).abs().max().into_scalar::<f32>();
            assert!(same < 1e-5, "causal {} kernels {kernels}: {same}", mask.causal);
            let other = (run(&grouped) - run(&interleaved)).abs().max().into_scalar::<f32>();
            assert!(other > 1e-3, "another grouping must give another output ({other})");
        }
    }

    /// The losses leave the output alone, and minimising them does what they say: the guided head
    /// moves its weight onto the previous token, the disagreeing heads' outputs turn apart.
    /// Draws of xorshift64 uniform in ±√3·std (std `std`), from `state`: numbers no other test
    /// running at the same time can change, as they can Burn's one process-wide generator.
    fn fixed_uniform(state: &mut u64, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                ((*state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0) * 3f32.sqrt() * std
            })
            .collect()
    }

    /// Every parameter of a module redrawn by [`fixed_uniform`] with std `std`.
    struct Fixed(u64, f32);

    impl burn::module::ModuleMapper for Fixed {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            param.map(|t| {
                let shape = t.shape();
                let values = fixed_uniform(&mut self.0, shape.num_elements(), self.1);
                let fresh = Tensor::from_data(TensorData::new(values, shape), &t.device());
                if t.is_require_grad() { fresh.require_grad() } else { fresh }
            })
        }
    }

    #[test]
    fn head_losses_guide_and_spread_the_heads_they_name() {
        use burn::optim::{AdamWConfig, GradientsParams};
        let dev = Device::flex().autodiff();
        // inputs and weights from a generator of the test's own: other tests seed and draw
        // from Burn's shared one concurrently
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let x = Tensor::from_data(TensorData::new(fixed_uniform(&mut state, 2 * 8 * 16, 1.0), [2, 8, 16]), &dev);
        let mask = AttentionMask::causal();
        let plain = attention(4, 4, &dev).map(&mut Fixed(state, 0.2));
        let guided = MultiHeadAttention {
            losses: HeadLosses {
                guidance: Some(GuidanceConfig { patterns: vec![head_losses::Pattern::Previous], weight: 1.0 }),
                diversity: Some(DiversityConfig { on: Disagreement::Outputs, weight: 1.0 }),
            },
            ..plain.clone()
        };
        let same = guided.forward(AttentionInput::self_attention(x.clone(), &mask), None);
        let base = plain.forward(AttentionInput::self_attention(x.clone(), &mask), None);
        assert!((same.context.clone() - base.context).abs().max().into_scalar::<f32>() < 1e-6);
        assert!(same.weights.is_none(), "weights formed for the loss are not handed out unasked");
        let losses = |m: &MultiHeadAttention| -> Vec<f32> {
            let out = m.forward(AttentionInput::self_attention(x.clone(), &mask), None);
            out.aux_losses.iter().map(|(_, l)| l.clone().into_scalar::<f32>()).collect()
        };
        let before = losses(&guided);
        let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
        let mut layer = guided;
        for _ in 0..80 {
            let out = layer.forward(AttentionInput::self_attention(x.clone(), &mask), None);
            let loss = out.aux_losses.into_iter().map(|(_, l)| l).reduce(|a, b| a + b).unwrap();
            let grads = GradientsParams::from_grads(loss.backward(), &layer);
            layer = optim.step(1e-2, layer, grads);
        }
        let after = losses(&layer);
        // [disagreement, guidance]
        assert!(after[0] < before[0] - 0.05, "outputs did not turn apart: {before:?} → {after:?}");
        assert!(after[1] < 0.1 * before[1], "the guided head did not move: {before:?} → {after:?}");
        let w = layer.forward(AttentionInput::self_attention(x, &mask).with_weights(), None).weights.unwrap();
        let head0 = w.narrow(1, 0, 1).reshape([2, 8, 8]).into_data().try_to_vec::<f32>().unwrap();
        for b in 0..2 {
            for i in 1..8 {
                let p = head0[(b * 8 + i) * 8 + i - 1];
                assert!(p > 0.8, "head 0, query {i}: {p} on the previous token");
            }
        }
    }

    /// Every normaliser, with and without a learned temperature, computes the same outputs and
    /// gradients on the fast path (the fused kernel, taken when no weights are asked for) as on
    /// the composed path (asking for the weights forces it).
    #[test]
    fn every_normaliser_takes_the_fast_path_to_the_same_result() {
        let dev = Device::flex().autodiff();
        dev.seed(21);
        let x = random([2, 9, 16], &dev);
        for normaliser in
            [Normaliser::Softmax, Normaliser::Relu, Normaliser::Sigmoid, Normaliser::Sparsemax, Normaliser::Entmax15]
        {
            for head_temperature in [false, true] {
                let cfg = MultiHeadAttentionConfig { normaliser, head_temperature, ..Default::default() };
                let mut attn = cfg.init(16, 0.4, 0.4, Positioning { context: 16, ..Positioning::NONE }, &dev);
                if head_temperature {
                    let t = Tensor::<1>::from_floats([0.7f32, 1.3, 1.0, 0.4], &dev).log();
                    attn.normaliser.log_temperature = Some(Param::from_tensor(t));
                }
                // causal: the fused causal kernel; both ways: the block-sparse kernel over every key
                for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                    let run = |weights: bool| {
                        let x = x.clone().require_grad();
                        let input = AttentionInput {
                            need_weights: weights,
                            ..AttentionInput::self_attention(x.clone(), &mask)
                        };
                        let out = attn.forward(input, None);
                        assert_eq!(out.weights.is_some(), weights);
                        let grads = out.context.clone().powf_scalar(2.0).sum().backward();
                        (out.context.inner(), x.grad(&grads).unwrap())
                    };
                    let ((fast, g_fast), (composed, g_composed)) = (run(false), run(true));
                    let what =
                        format!("{} (temperature {head_temperature}, causal {})", normaliser.name(), mask.causal);
                    // relative to the outputs' size, as the gradients below: the weights are drawn
                    // from the device's generator, which tests running beside this one also draw from
                    let size = composed.clone().abs().max().into_scalar::<f32>().max(1.0);
                    let d = (fast - composed).abs().max().into_scalar::<f32>() / size;
                    assert!(d < 1e-5, "{what}: outputs differ by {d} of their largest ({size})");
                    // relative to the gradient's size: sums of dozens of terms of either sign
                    let size = g_composed.clone().abs().max().into_scalar::<f32>().max(1.0);
                    let d = (g_fast - g_composed).abs().max().into_scalar::<f32>() / size;
                    assert!(d < 1e-5, "{what}: input gradients differ by {d} of their largest ({size})");
                }
            }
        }
    }
}
