//! The engine's forward and which path computes it: the fused causal kernel straight from the
//! packed projection, the block-sparse kernel over a band that reaches every key, blocks for a
//! reach limit, or the composed definition (scores, mask, normaliser, values) — each taken only
//! where it computes exactly what the composed path would.

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::Band;
use crate::engine::blocks::banded;
use crate::engine::head_losses::{self, Disagreement};
use crate::engine::heads::{HeadLosses, MultiHeadAttention, Projected, concat_heads};
use burn::prelude::*;
use variorum_core::AttentionMask;
use variorum_position::{PackedHeads, RelativePosition, ScoreLayout};

impl MultiHeadAttention {
    /// Attention of `input`'s queries over its keys and values (appended to `cache`, where
    /// given), by the fastest path that computes exactly the composed definition.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let HeadLosses { diversity, guidance } = &self.losses;
        if diversity.is_none() && guidance.is_none() {
            let (heads, weights) = self.attend_heads(input, cache);
            let context = variorum_kernels::linear::forward(&self.out, heads);
            return AttentionOutput { context, weights, aux_losses: Vec::new() };
        }
        self.forward_with_losses(input, cache)
    }

    /// [`forward`](Self::forward) with the heads' auxiliary losses: the weights are formed where a
    /// loss reads them (the composed path), the values projected once more for the subspace one.
    fn forward_with_losses(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let HeadLosses { diversity, guidance } = &self.losses;
        let asked = input.need_weights;
        let reads_weights = guidance.is_some() || diversity.as_ref().is_some_and(|d| d.on == Disagreement::Positions);
        let values = diversity.as_ref().filter(|d| d.on == Disagreement::Subspace).map(|_| {
            let (_, _, v) = match &input.key_value {
                Some(src) => self.qkv.cross_attention(input.query.clone(), src.clone()),
                None => self.qkv.self_attention(input.query.clone()),
            };
            v
        });
        let mask = input.mask;
        let k_start = mask.k_start + cache.as_ref().map_or(0, |c| c.start);
        let (q_start, causal) = (mask.q_start, mask.causal);
        let input = AttentionInput { need_weights: asked || reads_weights, ..input };
        let (heads, weights) = self.attend_heads(input, cache);
        let mut aux_losses = Vec::new();
        if let Some(d) = diversity {
            let loss = match d.on {
                Disagreement::Subspace => head_losses::cosine_agreement(values.expect("projected above"), d.weight),
                Disagreement::Outputs => {
                    let [b, l, _] = heads.dims();
                    let (h, dh) = (self.qkv.n_heads, self.qkv.head_dim);
                    head_losses::cosine_agreement(heads.clone().reshape([b, l, h, dh]).swap_dims(1, 2), d.weight)
                }
                Disagreement::Positions => {
                    head_losses::position_agreement(weights.clone().expect("weights asked for"), d.weight)
                }
            };
            aux_losses.push(("head_disagreement".to_string(), loss));
        }
        if let Some(g) = guidance {
            let w = weights.clone().expect("weights asked for");
            let [_, _, lq, lk] = w.dims();
            let layout = ScoreLayout::new(q_start, k_start, lq, lk, causal);
            aux_losses.push(("head_guidance".to_string(), head_losses::pattern_loss(w, &layout, g)));
        }
        let context = variorum_kernels::linear::forward(&self.out, heads);
        AttentionOutput { context, weights: weights.filter(|_| asked), aux_losses }
    }

    /// [`forward`](Self::forward) up to the output projection: the heads' contexts side by side,
    /// `[b, len_q, n_heads · d_h]`, and the weights where asked for. Kinds that combine heads
    /// otherwise (capsule routing) start here, on the same fast paths.
    pub fn attend_heads(
        &self,
        input: AttentionInput,
        mut cache: Option<&mut KvCache>,
    ) -> (Tensor<3>, Option<Tensor<4>>) {
        if cache.is_none()
            && let Some(context) = self.fused_self_attention(&input)
        {
            return (context, None);
        }
        let p = self.project(input.query, input.key_value, input.mask, cache.as_deref_mut());
        if let Some(n) = p.max_back {
            // at most n back: the keys before that never matter again
            if let Some(c) = cache {
                c.drop_front(c.len().saturating_sub(n));
            }
            let m = input.mask;
            let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
            if aligned && m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && !input.need_weights {
                // a band, computed by blocks: no L × L matrix
                let l = p.layout.len_q;
                let ahead = if m.causal { 0 } else { l };
                let band = Band { back: n, ahead, block: n.clamp(1, 128), query_blocks: false, causal: m.causal };
                return (concat_heads(banded(self, &p, &[band], &[])), None);
            }
        }
        if let Some(context) = self.fused(&p, input.mask, input.need_weights) {
            return (context, None);
        }
        if self.on_the_sparse_kernel(&p, input.mask, input.need_weights) {
            // what the causal kernel does not take — every key both ways, a distance-only bias
            // (ALiBi, T5), terms per distance (Transformer-XL, Shaw, …) — the block-sparse
            // kernel takes, over a band that reaches every key
            let (l, m) = (p.layout.len_q, input.mask);
            let ahead = if m.causal { 0 } else { l };
            let band = Band { back: l, ahead, block: l.clamp(1, 128), query_blocks: false, causal: m.causal };
            return (concat_heads(banded(self, &p, &[band], &[])), None);
        }
        let scores = self.mask_scores(self.scores(&p), input.mask, input.dense_mask, &p);
        let probs = self.normalise(scores);
        let weights = input.need_weights.then(|| probs.clone());
        (self.combine_heads(self.dropout.forward(probs), &p), weights)
    }

    /// The heads' merged context by the fused causal kernel ([`variorum_kernels::causal_attention`]), where it
    /// computes exactly what the composed path would: a causal mask and nothing else (no padding,
    /// custom pattern or reach limit), no position term on the scores or the context but a
    /// product of per-position vectors (TUPE, which the kernel adds; RoPE acts before), no dropout
    /// on the probabilities and no weights asked for; `None` otherwise, or on a backend without
    /// the kernel.
    fn fused(&self, p: &Projected, m: &AttentionMask, need_weights: bool) -> Option<Tensor<3>> {
        // a scheme that acts by rotating q and k alone has done so in the projection; one that
        // adds a product of per-position vectors (TUPE) hands them to the kernel below
        let products = self.position.as_ref().is_some_and(|pos| pos.has_position_products() && !pos.rotates());
        let plain_position = self.position.as_ref().is_none_or(RelativePosition::rotates_packed) || products;
        let offset = p.layout.q_start.checked_sub(p.layout.k_start)?;
        // one query (cached decoding): the kernel's GEMM would pack every key for a single row,
        // slower than the composed matrix–vector products (2,350 vs 2,830 tokens/s at context 1024)
        let one_query = p.layout.len_q == 1;
        if !self.kernel_computes(m, need_weights, &p.device()) || !plain_position || one_query {
            return None;
        }
        let norm = self.normaliser.row;
        // a head's temperature scales its scores, so its queries (and a product term's query
        // side): s/τ = (q/τ)·k + (a/τ)·b
        let factor = self.normaliser.query_factor();
        let q = match &factor {
            Some(f) => p.q() * f.clone(),
            None => p.q(),
        };
        let (k, v) = (p.k.clone(), p.v.clone());
        if !products {
            return variorum_kernels::causal_attention::causal_attention(q, k, v, offset, norm);
        }
        // a scheme that says it has products and gives none keeps the composed path
        let (a, b) = self.position.as_ref()?.position_products(&p.layout, self.scale)?;
        let a = match factor {
            Some(f) => a * f.squeeze_dim::<3>(0),
            None => a,
        };
        variorum_kernels::causal_attention::causal_attention_with_products((q, k, v), (a, b), offset, norm)
    }

    /// Whether the call is plain attention over a fresh sequence (causal or both ways; no
    /// padding, custom or graph mask, weights or dropout) that [`Self::fused`] did not take, and
    /// whose position scheme is none, a rotation (done in the projection), a score by distance
    /// alone, or terms per distance: the block-sparse kernel computes it over a band that
    /// reaches every key, with its distance-bias table or `DistanceTerms`, where the kernels are
    /// on. Bidirectional full attention (an encoder, a masked LM) is this call.
    fn on_the_sparse_kernel(&self, p: &Projected, m: &AttentionMask, need_weights: bool) -> bool {
        let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
        let drops = crate::engine::heads::drops(&self.dropout, &p.device());
        let plain = m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && !need_weights && !drops;
        // terms per distance scale with a head temperature: that keeps the composed path
        let scheme_ok = self.position.as_ref().is_none_or(|pos| {
            pos.works_on_gathered_keys() || (pos.has_distance_terms() && self.normaliser.query_factor().is_none())
        });
        aligned && plain && scheme_ok && variorum_kernels::has_kernel(&p.k)
    }

    /// What both kernel paths share: a causal mask and nothing else, no dropout on the
    /// probabilities (on `device`), no weights asked for.
    fn kernel_computes(&self, m: &AttentionMask, need_weights: bool, device: &Device) -> bool {
        let plain_mask =
            m.causal && m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && m.max_back.is_none();
        plain_mask && !need_weights && !crate::engine::heads::drops(&self.dropout, device)
    }

    /// Self-attention without a cache, by the fused kernel straight from the QKV projection's
    /// output ([`variorum_kernels::causal_attention::causal_self_attention`]: no head split,
    /// scaling or merge recorded): the training path of a GPT, and of a LLaMA-style model, whose
    /// RoPE rotates the packed projection by a kernel too
    /// ([`RelativePosition::rotate_packed`]). The heads' contexts side by side, before the output
    /// projection; `None` where it does not apply (the conditions of [`Self::fused`], no keys from
    /// elsewhere, no position scheme but one that rotates packed or adds a product of
    /// per-position vectors, TUPE, which the kernel adds itself at any offset and with
    /// grouped-query heads).
    fn fused_self_attention(&self, input: &AttentionInput) -> Option<Tensor<3>> {
        let m = input.mask;
        let offset = m.q_start.checked_sub(m.k_start)?;
        let learned_temperature = self.normaliser.log_temperature.is_some();
        let device = input.query.device();
        if !self.kernel_computes(m, input.need_weights, &device) || input.key_value.is_some() || learned_temperature {
            return None;
        }
        if !variorum_kernels::has_kernel(&input.query) {
            return None;
        }
        // a rotation needs one position per row: queries and keys of the same positions; a
        // product of per-position vectors (TUPE) the kernel adds to every score itself
        let products = self.position.as_ref().is_some_and(|p| p.has_position_products() && !p.rotates());
        if let Some(p) = &self.position
            && !products
            && (!p.rotates_packed() || offset != 0)
        {
            return None;
        }
        let qkv = &self.qkv;
        let (h, h_kv, norm) = (qkv.n_heads, qkv.n_kv_heads, self.normaliser.row);
        let position_products = match &self.position {
            Some(p) if products => {
                let len = input.query.dims()[1];
                let layout = ScoreLayout::new(m.q_start, m.k_start, len, len, m.causal);
                // a scheme that says it has products and gives none keeps the composed path
                Some(p.position_products(&layout, self.scale)?)
            }
            _ => None,
        };
        let all = variorum_kernels::linear::forward(&qkv.qkv, input.query.clone());
        if let Some((a, b)) = position_products {
            let scale = self.scale;
            return variorum_kernels::causal_attention::causal_self_attention_with_products(
                all, a, b, h, h_kv, scale, offset, norm,
            );
        }
        let all = match &self.position {
            Some(p) => {
                let heads = PackedHeads { n_heads: h, n_kv_heads: h_kv, head_dim: qkv.head_dim };
                p.rotate_packed(all, heads, m.q_start)?
            }
            None => all,
        };
        variorum_kernels::causal_attention::causal_self_attention(all, h, h_kv, self.scale, offset, norm)
    }
}
