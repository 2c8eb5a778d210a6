//! Lazyformer, the `lazyformer` kind (Ying, Ke, He, Liu 2021, LazyFormer: Self Attention with
//! Lazy Update): the stack is cut into lazy blocks of `group` layers. The first layer of a block
//! computes its attention probabilities; the next `group − 1` layers reuse them and only
//! project values:
//!
//! A_l = softmax(Q_l K_lᵀ/√d + B_l + M)   if l mod group = 0,   A_l = A_{l−1} otherwise,
//! head(l) = A_l V_l,   V_l = x_l W_V^l,   output = concat(heads) W_O^l.
//!
//! Choices:
//! - A reusing layer has no query or key projection at all (no parameters, no score GEMM): the
//!   saving the paper is after. It keeps its own values, output projection and dropout.
//! - The probabilities are carried through [`CarriedMaps`] before dropout; each layer drops out
//!   its own copy. Gradients from the reusing layers flow back into the computing layer's
//!   scores, as in the paper.
//! - A position scheme acts in the computing layers only (on their scores or q/k). A scheme
//!   that also adds a term to the context (Shaw's value-side relative embeddings) adds it there
//!   alone: reusing layers have no position parameters.
//! - `group = 1` is plain multi-head attention in every layer, on its fast path.
//! - Cached decoding: the computing layer caches keys and values as `full` does; a reusing
//!   layer caches its values (in a [`KvCache`] whose keys are one zero column: it has none) and
//!   keeps as many as the computing layer's probabilities cover. Under a reach limit
//!   (`max_back`) neither drops old keys from its cache (the mask hides them; `full` drops
//!   them), so the caches grow until the generator restarts its window.
//! - A reusing layer cannot run alone: without its block's computing layer before it (nothing
//!   carried) it has no probabilities, and its forward panics naming the cause. A model's
//!   block loop always runs the computing layer first; the rules refuse a shared block.

use burn::nn::Linear;
use burn::prelude::*;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::qkv::{normal_linear, split_heads};
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "lazyformer"`.
    pub struct LazyformerConfig [n_heads, n_kv_heads, head_dim, dropout, bias, normaliser] {
        /// Layers per lazy block: the first computes the attention probabilities, the next
        /// `group − 1` reuse them. Default 2 (the paper's best trade-off on GLUE was blocks of
        /// two layers); 1 is plain multi-head attention.
        pub group: usize = 2,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]).
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

impl LazyformerConfig {
    head_methods!();

    /// Whether layer [`layer`](Self::layer) computes its probabilities (the first of its block).
    pub fn computes(&self) -> bool {
        self.layer.is_multiple_of(self.group.max(1))
    }

    /// The layer for `d_model`: plain multi-head attention in a computing layer, only values and
    /// an output projection in a reusing one.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> LazyAttention {
        if self.computes() {
            let attention = self.heads().init(d_model, init_std, out_std, position, device);
            return LazyAttention { attention: Some(attention), reuse: None, publish: self.group > 1 };
        }
        let heads = self.heads().heads(d_model);
        let (kv, dh) = (self.heads().kv_heads(), heads.head_dim);
        let reuse = ReusedMaps {
            value: normal_linear(d_model, kv * dh, self.bias, init_std, device),
            out: normal_linear(heads.n_heads * dh, d_model, self.bias, out_std, device),
            dropout: burn::nn::DropoutConfig::new(self.dropout).init(),
            n_heads: heads.n_heads,
            n_kv_heads: kv,
            head_dim: dh,
        };
        LazyAttention { attention: None, reuse: Some(reuse), publish: false }
    }
}

impl AttentionKind for LazyformerConfig {
    type Module = LazyAttention;
    const SUMMARY: &'static str = "Lazyformer: attention probabilities computed in the first layer of each block of `group` layers and reused by the rest (no Q/K there); KV cache";
    const PAPER: &'static str = "Ying, Ke, He, Liu 2021, LazyFormer: Self Attention with Lazy Update";
    const CAPS: Capabilities = Capabilities { cross_layer: true, distinct_layers: true, ..caps::SCORES };

    /// `group = 1` is plain attention in every layer: nothing carried, no roles.
    fn capabilities(&self) -> Capabilities {
        if self.group == 1 { caps::SCORES } else { Self::CAPS }
    }

    head_kind_items!();

    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.group >= 1, || {
            "model.attention.group must be at least 1 (1 = every layer computes its attention)".into()
        })
    }

    /// A computing layer: full attention's. A reusing layer: the value and output projections
    /// and the weighted sum over `len_k` values.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        if self.computes() {
            return self.heads().flops_per_token(d_model, len_k);
        }
        let h = self.heads().heads(d_model);
        let (d, hd, kvd) =
            (d_model as u64, (h.n_heads * h.head_dim) as u64, (self.heads().kv_heads() * h.head_dim) as u64);
        2 * (d * kvd + hd * d) + 2 * hd * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        TestVariant::score_path(Self::default())
    }
}

/// A reusing layer: values and output only.
#[derive(Module, Debug)]
pub struct ReusedMaps {
    /// W_V, `[d_model, n_kv_heads · head_dim]`.
    pub value: Linear,
    /// W_O, `[n_heads · head_dim, d_model]`.
    pub out: Linear,
    /// Dropout on the reused probabilities: this layer's own draw.
    pub dropout: burn::nn::Dropout,
    /// Query heads, as many as the probabilities carry.
    pub n_heads: usize,
    /// Value heads, each serving n_heads / n_kv_heads query heads.
    pub n_kv_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
}

/// A Lazyformer layer: a computing layer (plain attention that hands on its probabilities), or a
/// reusing one (the carried probabilities over its own values).
#[derive(Module, Debug)]
pub struct LazyAttention {
    /// A computing layer: plain multi-head attention (`None` in a reusing layer).
    pub attention: Option<MultiHeadAttention>,
    /// A reusing layer's values and output (`None` in a computing layer).
    pub reuse: Option<ReusedMaps>,
    /// Whether a computing layer leaves its probabilities for the next (`group > 1`).
    pub publish: bool,
}

/// A_l, `[b, n_heads, len_q, len_k]`: the probabilities a computing layer hands the next.
#[derive(Debug, Clone)]
pub struct LazyMaps(pub Tensor<4>);

impl LazyAttention {
    /// The layer over `input`, keys or values after `cache`'s. A computing layer puts its
    /// probabilities in `input.carried`; a reusing one reads them there, and panics without them.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        match (&self.attention, &self.reuse) {
            (Some(a), _) if !self.publish => a.forward(input, cache),
            (Some(a), _) => {
                let p = a.project(input.query, input.key_value, input.mask, cache);
                let probs = a.normalise(a.mask_scores(a.scores(&p), input.mask, input.dense_mask, &p));
                if let Some(carried) = input.carried {
                    carried.put(LazyMaps(probs.clone()));
                }
                let weights = input.need_weights.then(|| probs.clone());
                let context = a.combine(a.dropout.forward(probs), &p);
                AttentionOutput { context, weights, aux_losses: Vec::new() }
            }
            (None, Some(r)) => {
                let probs = input.carried.and_then(|c| c.get::<LazyMaps>()).map(|m| m.0.clone()).expect(
                    "a Lazyformer layer that reuses attention maps ran without its block's first layer before it",
                );
                let source = input.key_value.unwrap_or(input.query);
                let v = r.values(source, probs.dims()[3], cache);
                let weights = input.need_weights.then(|| probs.clone());
                AttentionOutput { context: r.combine(r.dropout.forward(probs), v), weights, aux_losses: Vec::new() }
            }
            (None, None) => unreachable!("a Lazyformer layer is built computing or reusing"),
        }
    }
}

impl ReusedMaps {
    /// The values of `source` `[b, n_kv_heads, len, head_dim]`, after the cached ones, keeping
    /// the last `len_k` (the keys the computing layer's probabilities cover).
    fn values(&self, source: Tensor<3>, len_k: usize, cache: Option<&mut KvCache>) -> Tensor<4> {
        let v = split_heads(self.value.forward(source), 1, self.n_kv_heads, self.head_dim).remove(0);
        let Some(c) = cache else { return v };
        // no keys here: one zero column stands in for them in the shared cache type
        let [b, h, n, _] = v.dims();
        let (_, v) = c.append(Tensor::zeros([b, h, n, 1], &v.device()), v);
        let extra = c.len().saturating_sub(len_k);
        c.drop_front(extra);
        v.narrow(2, extra, c.len())
    }

    /// The merged, projected context of `probs` `[b, n_heads, len_q, len_k]` over `v`.
    fn combine(&self, probs: Tensor<4>, v: Tensor<4>) -> Tensor<3> {
        let [b, h, lq, lk] = probs.dims();
        let g = h / self.n_kv_heads;
        let probs = if g == 1 { probs } else { probs.reshape([b, self.n_kv_heads, g * lq, lk]) };
        let context = probs.matmul(v).reshape([b, h, lq, self.head_dim]);
        self.out.forward(context.swap_dims(1, 2).reshape([b, lq, h * self.head_dim]))
    }
}

impl AttentionMechanism for LazyAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LazyAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        match (&self.attention, &self.reuse) {
            (Some(a), _) => {
                a.project(x, None, mask, Some(state.kv_mut()));
            }
            (None, Some(r)) => {
                let cached = state.kv_mut().len();
                let n = x.dims()[1];
                r.values(x, cached + n, Some(state.kv_mut()));
            }
            (None, None) => {}
        }
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::CarriedMaps;
    use burn::module::Module;
    use burn::tensor::Distribution;

    fn layers(group: usize, device: &Device) -> Vec<LazyAttention> {
        device.seed(5);
        let cfg = LazyformerConfig { group, ..Default::default() };
        (0..3).map(|i| cfg.for_layer(i).init(16, 0.2, 0.2, Positioning::NONE, device)).collect()
    }

    #[test]
    fn reusing_layers_have_no_query_or_key_and_form_no_scores() {
        let dev = Device::flex();
        let l = layers(3, &dev);
        assert!(l[0].attention.is_some() && l[1].attention.is_none() && l[2].attention.is_none());
        // parameters: a computing layer has q, k, v and out (with biases); a reusing one v and out
        let count = |m: &LazyAttention| m.num_params();
        assert_eq!(count(&l[0]), 4 * (16 * 16 + 16));
        assert_eq!(count(&l[1]), 2 * (16 * 16 + 16));
        // the FLOPs the model counts per layer: a reusing layer runs no score GEMM over the keys
        let cfg = LazyformerConfig { group: 3, ..Default::default() };
        let (full, reused) = (cfg.for_layer(0).flops_per_token(16, 64), cfg.for_layer(1).flops_per_token(16, 64));
        assert_eq!(full - reused, 2 * (2 * 16 * 16) + 2 * 16 * 64, "a reusing layer saves q, k and QKᵀ");
    }

    #[test]
    fn a_reusing_layer_applies_the_carried_probabilities_to_its_own_values() {
        let dev = Device::flex();
        let l = layers(2, &dev);
        let x = Tensor::<3>::random([2, 6, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let mut carried = CarriedMaps::default();
        let first = l[0]
            .forward(AttentionInput::self_attention(x.clone(), &mask).with_weights().with_carried(&mut carried), None);
        let probs = first.weights.unwrap();
        let plain = l[0].attention.as_ref().unwrap().forward(AttentionInput::self_attention(x.clone(), &mask), None);
        let diff = (first.context - plain.context).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "the computing layer is plain attention (off by {diff})");
        let second = l[1]
            .forward(AttentionInput::self_attention(x.clone(), &mask).with_weights().with_carried(&mut carried), None);
        let reused = (second.weights.unwrap() - probs.clone()).abs().max().into_scalar::<f32>();
        assert_eq!(reused, 0.0, "the reusing layer's weights are the computing layer's");
        // closed form: A · (x W_V) W_O per head
        let r = l[1].reuse.as_ref().unwrap();
        let v = split_heads(r.value.forward(x), 1, 4, 4).remove(0);
        let expected = r.out.forward(probs.matmul(v).swap_dims(1, 2).reshape([2, 6, 16]));
        let diff = (second.context - expected).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "reusing layer differs from A V W_O by {diff}");
        // group 2: layer 2 starts the next block
        assert!(l[2].attention.is_some());
    }

    #[test]
    fn group_one_is_plain_attention_in_every_layer() {
        let dev = Device::flex();
        let l = layers(1, &dev);
        assert!(l.iter().all(|m| m.attention.is_some() && !m.publish));
    }
}
