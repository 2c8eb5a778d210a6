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
use variorum_kernels::normalisers::RowNormaliser;
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
        if let Some(context) = self.query_blocked(&p, input.mask, input.need_weights) {
            return (context, None);
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

    /// Plain softmax attention whose scores would not fit the budget
    /// ([`variorum_kernels::query_blocked::block_rows`]), by blocks of queries with a backward
    /// that recomputes them ([`variorum_kernels::query_blocked`]): the GPU backends' path for
    /// long sequences, where the composed scores are an `[b, h, L, L]` buffer (4 GiB at 16k)
    /// that autodiff would keep. Causal or both ways, a rotation done in the projection, a head
    /// temperature folded into q; no padding, custom pattern, reach limit, dropout on the
    /// probabilities or weights asked for. `None` otherwise, or where the scores fit.
    fn query_blocked(&self, p: &Projected, m: &AttentionMask, need_weights: bool) -> Option<Tensor<3>> {
        use variorum_kernels::query_blocked;
        let plain = m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && m.max_back.is_none();
        let drops = crate::engine::heads::drops(&self.dropout, &p.device());
        let position = self.position.as_ref().is_none_or(RelativePosition::rotates_packed);
        let softmax = self.normaliser.row == RowNormaliser::Softmax;
        if !plain || need_weights || drops || !position || !softmax || !query_blocked::available(&p.k) {
            return None;
        }
        let offset = if m.causal { p.layout.q_start.checked_sub(p.layout.k_start)? } else { 0 };
        let [b, h, lq, _] = p.q_dims();
        let block = query_blocked::block_rows(b, h, lq, p.layout.len_k)?;
        let q = match self.normaliser.query_factor() {
            Some(f) => p.q() * f,
            None => p.q(),
        };
        let heads = query_blocked::attention(q, p.k.clone(), p.v.clone(), m.causal, offset, block)?;
        Some(concat_heads(heads))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Positioning;
    use crate::engine::config::MultiHeadAttentionConfig;
    use burn::tensor::Distribution;
    use variorum_kernels::query_blocked;

    /// Cross-attention both ways (which no fused CPU kernel takes) whose scores exceed the budget
    /// goes by query blocks, with grouped-query heads and a learned temperature, and gives the
    /// composed output and gradients; within the budget it stays composed.
    #[test]
    fn scores_over_the_budget_go_by_query_blocks_with_the_same_result() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let cfg =
            MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(2), head_temperature: true, ..Default::default() };
        let attn = cfg.init(16, 0.3, 0.3, Positioning::NONE, &device);
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<3>::random([2, 40, 16], normal, &device).require_grad();
        let memory = Tensor::<3>::random([2, 23, 16], normal, &device).require_grad();
        let mask = AttentionMask::bidirectional();
        let run = |budget: usize| {
            let before = query_blocked::calls();
            let out = query_blocked::with_score_budget(budget, || {
                attn.forward(AttentionInput::cross_attention(x.clone(), memory.clone(), &mask), None).context
            });
            let blocked = query_blocked::calls() > before;
            let grads = out.clone().powi_scalar(2).sum().backward();
            let temperature = attn.normaliser.log_temperature.as_ref().unwrap().grad(&grads).unwrap();
            let g = [x.grad(&grads).unwrap(), memory.grad(&grads).unwrap()];
            (blocked, out.inner(), g, temperature)
        };
        let (blocked, out, [dx, dm], dt) = run(1);
        let (composed, out_c, [dx_c, dm_c], dt_c) = run(usize::MAX);
        assert!(blocked && !composed, "blocked {blocked}, composed {composed}");
        let diff = |a: Tensor<3>, b: Tensor<3>| (a - b).abs().max().into_scalar::<f32>();
        assert!(diff(out, out_c) < 1e-5);
        assert!(diff(dx, dx_c) < 1e-4 && diff(dm, dm_c) < 1e-4);
        // the temperature's gradient sums over every score: compared relative to its size (the
        // draws are not locked against other tests, so its size varies from run to run)
        let (gap, size) = ((dt - dt_c.clone()).abs().max().into_scalar::<f32>(), dt_c.abs().max().into_scalar::<f32>());
        assert!(gap <= 1e-4 * size.max(1.0), "temperature gradient off by {gap} of {size}");
    }
}
