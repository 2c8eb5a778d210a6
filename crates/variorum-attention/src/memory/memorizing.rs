//! The Memorizing Transformer (Wu, Rabe, Hutchins, Szegedy 2022), the `memorizing` kind: a layer
//! that attends locally over its segment and the previous one and, by k-nearest-neighbour
//! lookup, over a non-differentiable memory of the (key, value) pairs its earlier segments
//! produced.
//!
//! For query q (per head), with k̂ = k/‖k‖ and q̂ = q/‖q‖ (normalised, so that keys written many
//! steps ago by older weights stay comparable: the paper's answer to stale keys):
//!
//!   V_c = softmax(τ q̂ K̂_cᵀ + B) V_c          local: the previous segment and this one so far,
//!                                             causal; B the position bias
//!   V_m = Σ_{i ∈ top-k(q̂ · K̂_m)} softmax_i(τ q̂ · k̂_i) v_i      memory: the k nearest keys
//!   V_a = g ⊙ V_m + (1 − g) ⊙ V_c,  g = σ(b_g)   (one learned gate per head)
//!
//! and the heads' V_a go through the output projection. The two results are mixed by the gate,
//! not by one softmax over local and retrieved keys together, as the paper does.
//!
//! The sequence is read in segments of `segment` positions (the model's context by default).
//! Local attention reads the segment and the previous one; when a segment is complete its
//! normalised keys and its values (detached) join each batch row's memory
//! ([`crate::memory::knn_memory`]), which keeps the last `memory_size` positions and is emptied at a document boundary (`reset_rows`: the trainer's
//! document batching starts every document on a segment boundary). A forward without a state
//! reads its input the same way with a fresh memory, so a forward over several segments equals
//! feeding them one by one, and token-by-token decoding equals both.
//!
//! Choices where the paper leaves one open, or where we depart from it:
//! - τ is learned per head (as ln τ, so it stays positive), starting at log₂(L² − L) for a
//!   segment of L (QKNorm's initial scale, Henry et al. 2020), shared by local and memory scores;
//!   the paper normalises keys and queries without saying how it scales them.
//! - b_g starts at 0 (g = ½). A row whose memory is empty (a document's first segment) takes the
//!   local result alone: the gate weighs nothing against nothing.
//! - Local attention reads the segment and, as in the paper, the previous segment of the same
//!   document (a detached Transformer-XL cache, in every layer; `xl_cache = false` leaves it
//!   out). It is the kind's own cache: `model.memory` is not combined with it.
//! - Search is exact over the whole memory (one GEMM per row and head; see
//!   [`crate::memory::knn_memory`] for why no approximate index), where the paper used approximate
//!   search on TPU.
//! - `memory_layers` chooses the layers with a memory (the paper: one, the 9th of 12); the
//!   others are `full` attention over their local keys (with its fast kernel when there is no
//!   XL cache).
//! - Position schemes that bias scores (ALiBi, T5: the paper's choice) act on the local scores;
//!   retrieved keys carry no position. Rotations (RoPE) are refused: a stored key would carry
//!   its absolute position into every later comparison.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::ScoreLayout;

use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::memory::knn_memory::KnnMemory;
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "memorizing"`.
    pub struct MemorizingConfig {
        /// Positions each batch row's memory keeps, per memory layer (the paper: up to 262,144).
        /// 0 keeps none: the layer is its local attention alone. Default 65,536.
        pub memory_size: usize = 65_536,
        /// k, the stored keys each query retrieves. Default 32 (the paper's).
        pub top_k: usize = 32,
        /// Positions per segment: local attention stays inside one, and a complete one joins the
        /// memory. 0 = the model's context (`model.seq_len`). Default 0.
        pub segment: usize = 0,
        /// Which layers have a memory, one entry per layer (`[false, true, false]`); empty = every
        /// layer. The others are `full` attention over the local keys. Default empty.
        pub memory_layers: Vec<bool> = Vec::new(),
        /// Local attention also reads the previous segment of the same document (detached, a
        /// Transformer-XL cache), in every layer, as in the paper. Default true.
        pub xl_cache: bool = true,
    }
}

impl MemorizingConfig {
    /// Whether the layer this config was made for has a memory (after
    /// [`for_layer`](AttentionKind::for_layer): its own entry; else the first layer's).
    fn remembers(&self) -> bool {
        self.memory_layers.first().copied().unwrap_or(true)
    }

    /// The layer for `d_model`: the heads, and on a memory layer the gate (b_g = 0) and ln τ
    /// (τ = log₂(L² − L) for a segment of L). `segment = 0` becomes the model's context.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> MemorizingAttention {
        let segment = if self.segment > 0 { self.segment } else { position.context.max(1) };
        let h = self.n_heads;
        let remembers = self.remembers();
        let l = segment as f64;
        let tau = (l * l - l).max(2.0).log2();
        MemorizingAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            memory: remembers.then(|| MemoryGate {
                bias: Param::from_tensor(Tensor::zeros([h], device)),
                log_scale: Param::from_tensor(Tensor::full([h], tau.ln(), device)),
            }),
            memory_size: self.memory_size,
            top_k: self.top_k,
            segment,
            xl_cache: self.xl_cache,
        }
    }
}

impl AttentionKind for MemorizingConfig {
    type Module = MemorizingAttention;
    const SUMMARY: &'static str = "Memorizing Transformer: local attention over the segment and the previous one plus k-nearest-neighbour attention over a per-document memory of earlier segments' (key, value) pairs, mixed by a learned gate per head; normalised keys and queries";
    const PAPER: &'static str = "Wu, Rabe, Hutchins, Szegedy 2022, Memorizing Transformers";
    const CAPS: Capabilities = Capabilities {
        bidirectional: false,
        qk_rotation: false,
        reads_memory: false,
        remembers: true,
        hides_padding: false,
        ..caps::SCORES
    };
    head_kind_items!();

    fn why_not_causal(&self) -> &'static str {
        "it is causal only"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.top_k >= 1, || "model.attention.top_k = 0 must be at least 1, e.g. 32".into())
    }

    /// Segments must tile the context, so that documents, which start on the context's
    /// boundaries, start on segment boundaries too.
    fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
        check(self.segment == 0 || len % self.segment == 0, || {
            format!(
                "model.attention.segment = {} must divide the context length {len}, so that every context (and every document, which starts on one) starts a segment",
                self.segment
            )
        })
    }

    fn for_layer(&self, layer: usize) -> Self {
        match self.memory_layers.get(layer) {
            Some(&m) => Self { memory_layers: vec![m], ..self.clone() },
            None => self.clone(),
        }
    }

    fn per_layer(&self) -> usize {
        self.memory_layers.len()
    }

    fn per_layer_key(&self) -> &'static str {
        "memory_layers"
    }

    /// Full attention's over the local keys (the segment, and the previous one with the XL
    /// cache), plus the search (a dot product with every stored key) and the attention over the
    /// k retrieved ones.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let segment = if self.segment > 0 { self.segment } else { len_k };
        let local = self.heads().flops_per_token(d_model, if self.xl_cache { 2 * segment } else { segment });
        if !self.remembers() {
            return local;
        }
        let hd = (self.n_heads * self.heads().head_dim(d_model)) as u64;
        local + 2 * hd * self.memory_size as u64 + 2 * 2 * hd * self.top_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    /// Segments of 4 in the harness's longer sequences, so its checks (no leak from the future,
    /// decoding equals the forward, save and load) run across segment boundaries with a memory
    /// that fills and overflows.
    fn test_variants() -> Vec<TestVariant<Self>> {
        use variorum_position::PositionConfig;
        let base = Self { memory_size: 6, top_k: 3, segment: 4, ..Self::default() };
        vec![
            TestVariant::new("position none", base.clone()).with_position(PositionConfig::None(Default::default())),
            TestVariant::new(
                "grouped-query + memory in layer 2 + position alibi",
                Self { n_kv_heads: Some(2), memory_layers: vec![false, true], ..base.clone() },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
            TestVariant::new(
                "no XL cache + memory in layer 2 + position t5",
                Self { memory_layers: vec![false, true], xl_cache: false, ..base.clone() },
            )
            .with_position(PositionConfig::T5(Default::default())),
            TestVariant::new("position t5", base).with_position(PositionConfig::T5(Default::default())),
        ]
    }
}

/// The Memorizing Transformer's layer: local attention over the segment and the previous one,
/// mixed per head with attention over the k keys nearest each query in its row's memory.
#[derive(Module, Debug)]
pub struct MemorizingAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// The gate and the score scale of a layer with a memory; none on the others.
    pub memory: Option<MemoryGate>,
    /// Positions each batch row's memory keeps; 0 keeps none.
    pub memory_size: usize,
    /// k, the stored keys each query retrieves.
    pub top_k: usize,
    /// Positions per segment (the config's 0 resolved to the model's context).
    pub segment: usize,
    /// Whether local attention also reads the previous segment (the Transformer-XL cache).
    pub xl_cache: bool,
}

/// A memory layer's own parameters, one per head (neither is weight-decayed: the trainer exempts
/// `bias` and `log_scale`).
#[derive(Module, Debug)]
pub struct MemoryGate {
    /// b_g, `[n_heads]`: g = σ(b_g).
    pub bias: Param<Tensor<1>>,
    /// ln τ, `[n_heads]`: τ = exp(ln τ) > 0 scales the cosine scores.
    pub log_scale: Param<Tensor<1>>,
}

/// What a layer carries from one call to the next (all detached): the raw keys and values of the
/// unfinished segment, `[b, n_kv_heads, held, d_h]`; the previous segment's (the XL cache), with
/// whether each row's belongs to its current document; and each row's memory.
#[derive(Debug, Clone, Default)]
pub struct MemorizingState {
    /// The unfinished segment's raw keys and values, `[b, n_kv_heads, held, d_h]`.
    pub local: Option<(Tensor<4>, Tensor<4>)>,
    /// The previous segment's raw keys and values (the XL cache), `[b, n_kv_heads, segment, d_h]`.
    pub previous: Option<(Tensor<4>, Tensor<4>)>,
    /// Per batch row, whether `previous` belongs to its current document (false: hidden).
    pub previous_rows: Vec<bool>,
    /// Each row's memory: the normalised keys and the values of its document's earlier segments.
    pub memory: KnnMemory,
}

impl MemorizingState {
    fn held(&self) -> usize {
        self.local.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    fn previous_len(&self) -> usize {
        self.previous.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    /// `[b, len_k]` hiding the previous segment of the rows that started a new document since,
    /// for `len_k` keys of which the previous segment comes first; none when every row reads it.
    fn previous_padding(&self, len_k: usize, device: &Device) -> Option<Tensor<2, Bool>> {
        let p = self.previous_len();
        if p == 0 || self.previous_rows.iter().all(|&r| r) {
            return None;
        }
        let b = self.previous_rows.len();
        let hidden: Vec<bool> =
            self.previous_rows.iter().flat_map(|&keep| (0..len_k).map(move |j| j < p && !keep)).collect();
        Some(Tensor::from_data(TensorData::new(hidden, [b, len_k]), device))
    }
}

/// x / ‖x‖ along the last axis.
fn unit(x: Tensor<4>) -> Tensor<4> {
    // ε inside the root: its gradient stays finite at a zero vector
    let norm = x.clone().powi_scalar(2).sum_dim(3).add_scalar(1e-12).sqrt();
    x / norm
}

impl MemorizingAttention {
    /// Runs the layer segment by segment, continuing `state` (its [`MemorizingState`]) when given
    /// and from a fresh memory otherwise. Causal self-attention only.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        assert!(input.key_value.is_none(), "memorizing attention has no cross-attention form");
        assert!(input.mask.causal, "memorizing attention is causal");
        let [b, len, _] = input.query.dims();
        let mut fresh = MemorizingState::default();
        let st = match state {
            Some(s) => s.get_or_default::<MemorizingState>(),
            None => &mut fresh,
        };
        let (heads, dh) = (self.attention.qkv.n_kv_heads, self.attention.qkv.head_dim);
        if !st.memory.fits(b, heads, dh, self.memory_size) {
            // another batch: nothing carried applies to it
            *st = MemorizingState { memory: KnnMemory::new(b, heads, dh, self.memory_size), ..Default::default() };
        }
        let mask = input.mask;
        let (mut contexts, mut weights) = (Vec::new(), Vec::new());
        let mut done = 0;
        while done < len {
            let n = (self.segment - st.held()).min(len - done);
            // the queries' positions, and the first key's: the previous segment's start, or the
            // unfinished segment's
            let q_start = mask.q_start + done;
            let back = st.previous_len() + st.held();
            let padding = st.previous_padding(back + n, &input.query.device());
            let at = AttentionMask { q_start, k_start: q_start - back, padding, ..mask.clone() };
            let x = if n == len { input.query.clone() } else { input.query.clone().narrow(1, done, n) };
            let (c, w) = self.segment_part(x, &at, st, input.need_weights);
            contexts.push(c);
            weights.push(w);
            done += n;
        }
        // weights of one call are one map; across a segment boundary they are two, and none
        let weights = if weights.len() == 1 { weights.pop().flatten() } else { None };
        AttentionOutput { context: Tensor::cat(contexts, 1), weights, aux_losses: Vec::new() }
    }

    /// Positions `x` (the next ones of the unfinished segment, not past its end).
    fn segment_part(
        &self,
        x: Tensor<3>,
        mask: &AttentionMask,
        st: &mut MemorizingState,
        need_weights: bool,
    ) -> (Tensor<3>, Option<Tensor<4>>) {
        let mha = &self.attention;
        let n = x.dims()[1];
        let Some(gate) = &self.memory else {
            // no memory: full attention over the local keys (a whole segment takes its fast path when
            // no XL cache needs its keys)
            if !self.xl_cache && st.local.is_none() && n == self.segment {
                let input = AttentionInput { need_weights, ..AttentionInput::self_attention(x, mask) };
                let (heads, w) = mha.attend_heads(input, None);
                return (variorum_kernels::linear::forward(&mha.out, heads), w);
            }
            let p = self.local_projection(x, mask, st);
            let probs = self.local_probs(&p, mask);
            let w = need_weights.then(|| probs.clone());
            self.finish_segment(st, false);
            return (mha.combine(mha.dropout.forward(probs), &p), w);
        };
        let p = self.local_projection(x, mask, st);
        let h = p.q_dims()[1];
        let tau = gate.log_scale.val().exp().reshape([1, h, 1, 1]);
        let q = unit(p.q());
        let local = Projected::new(q.clone() * tau.clone(), unit(p.k), p.v, p.layout, p.max_back);
        let probs = self.local_probs(&local, mask);
        let w = need_weights.then(|| probs.clone());
        let [b, _, _, dh] = q.dims();
        let local_heads = mha.combine_heads(mha.dropout.forward(probs), &local).reshape([b, n, h, dh]).swap_dims(1, 2);
        let filled: Vec<bool> = (0..b).map(|r| st.memory.len(r) > 0).collect();
        let heads = if self.top_k > 0 && filled.iter().any(|&f| f) {
            let memory = self.from_memory(q, tau, &st.memory);
            let device = local_heads.device();
            let rows: Vec<f32> = filled.iter().map(|&f| if f { 1.0 } else { 0.0 }).collect();
            let rows = Tensor::<1>::from_data(TensorData::new(rows, [b]), &device).reshape([b, 1, 1, 1]);
            let g = sigmoid(gate.bias.val()).reshape([1, h, 1, 1]) * rows;
            local_heads.clone() + g * (memory - local_heads)
        } else {
            local_heads
        };
        self.finish_segment(st, true);
        (mha.merge(heads), w)
    }

    /// Local attention weights over the keys of `p` (position scheme, causal mask and the
    /// hidden previous segment of rows that started a new document, in `mask`).
    fn local_probs(&self, p: &Projected, mask: &AttentionMask) -> Tensor<4> {
        let mha = &self.attention;
        mha.normalise(mha.mask_scores(mha.scores(p), mask, None, p))
    }

    /// Queries, keys and values of the new positions `x`, the keys and values joined after the
    /// previous segment's and the unfinished segment's (the state keeps the latter two), and
    /// where their scores sit.
    fn local_projection(&self, x: Tensor<3>, mask: &AttentionMask, st: &mut MemorizingState) -> Projected {
        let p = self.attention.project(x, None, mask, None);
        let (q, n, max_back) = (p.q(), p.q_dims()[2], p.max_back);
        let (k, v) = match st.local.take() {
            Some((k0, v0)) => (Tensor::cat(vec![k0, p.k], 2), Tensor::cat(vec![v0, p.v], 2)),
            None => (p.k, p.v),
        };
        // detached: a later call (the next token, the next step) must not reach this graph
        st.local = Some((k.clone().detach(), v.clone().detach()));
        let (k, v) = match &st.previous {
            Some((k0, v0)) => (Tensor::cat(vec![k0.clone(), k], 2), Tensor::cat(vec![v0.clone(), v], 2)),
            None => (k, v),
        };
        let layout = ScoreLayout::new(mask.q_start, mask.k_start, n, k.dims()[2], true);
        Projected::new(q, k, v, layout, max_back)
    }

    /// A complete segment leaves the local state; a memory layer (`store`) keeps it first.
    fn finish_segment(&self, st: &mut MemorizingState, store: bool) {
        if st.held() < self.segment {
            return;
        }
        let (k, v) = st.local.take().expect("a complete segment is held");
        if self.xl_cache {
            st.previous_rows = vec![true; k.dims()[0]];
            st.previous = Some((k.clone(), v.clone()));
        }
        if store && self.memory_size > 0 {
            let n = k.dims()[2];
            let host = |t: Tensor<4>| t.detach().into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 data");
            st.memory.push(&host(unit(k)), &host(v), n);
        }
    }

    /// V_m per head, `[b, h, n, d_h]`: each query's softmax over its k nearest stored keys,
    /// `q` normalised, `tau` `[1, h, 1, 1]`.
    fn from_memory(&self, q: Tensor<4>, tau: Tensor<4>, memory: &KnnMemory) -> Tensor<4> {
        let [b, h, n, dh] = q.dims();
        let device = q.device();
        let k = self.top_k;
        let host = q.clone().detach().into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 data");
        let found = memory.search(&host, h, n, k);
        let shape = [b, h, n, k, dh];
        let keys = Tensor::<5>::from_data(TensorData::new(found.keys, shape), &device);
        let values = Tensor::<5>::from_data(TensorData::new(found.values, shape), &device);
        let hidden = Tensor::<4, Bool>::from_data(
            TensorData::new(found.valid.iter().map(|v| !v).collect::<Vec<bool>>(), [b, h, n, k]),
            &device,
        );
        let scores = (q.unsqueeze_dim::<5>(3) * keys).sum_dim(4).reshape([b, h, n, k]) * tau;
        let probs = self.attention.dropout.forward(softmax(scores.mask_fill(hidden, MASKED_SCORE), 3));
        (probs.unsqueeze_dim::<5>(4) * values).sum_dim(3).reshape([b, h, n, dh])
    }
}

impl AttentionMechanism for MemorizingAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        Self::forward(self, input, state)
    }

    fn remembers(&self) -> bool {
        true
    }

    /// Rows starting a new document forget the old one. Documents start on segment boundaries
    /// (`validate_len`), so no unfinished segment is held.
    fn reset_rows(&self, state: &mut AttentionState, rows: &[bool]) {
        let st = state.get_or_default::<MemorizingState>();
        debug_assert_eq!(st.held(), 0, "a document starts on a segment boundary");
        for (r, _) in rows.iter().enumerate().filter(|(_, reset)| **reset) {
            if r < st.memory.rows() {
                st.memory.clear(r);
            }
            if let Some(keep) = st.previous_rows.get_mut(r) {
                *keep = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    const D: usize = 16;
    const SEGMENT: usize = 4;

    fn layer(device: &Device) -> MemorizingAttention {
        device.seed(5);
        let cfg = MemorizingConfig { memory_size: 32, top_k: 3, segment: SEGMENT, ..Default::default() };
        cfg.validate(D).unwrap();
        cfg.init(D, 0.2, 0.2, Positioning { context: SEGMENT, ..Positioning::NONE }, device)
    }

    /// The layer's output for `x` at positions `at…`, continuing `state`.
    fn run(attn: &MemorizingAttention, x: Tensor<3>, at: usize, state: &mut AttentionState) -> Tensor<3> {
        let mask = AttentionMask::causal().at(at, at);
        attn.forward(AttentionInput::self_attention(x, &mask), Some(state)).context
    }

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// With the gate at 0 the layer is its local attention: over a segment whose rows remember
    /// two earlier segments, the output equals, bit for bit, the same layer's with a memory of
    /// size 0 (the same local attention: the segment and the previous one). With the gate at its
    /// initial ½ the memory changes it (so the comparison can fail).
    #[test]
    fn a_closed_gate_reproduces_the_local_layer() {
        let device = Device::flex();
        let mut attn = layer(&device);
        let segments: Vec<Tensor<3>> =
            (0..3).map(|_| Tensor::random([2, SEGMENT, D], Distribution::Normal(0.0, 1.0), &device)).collect();
        let remembering = |attn: &MemorizingAttention| {
            let mut state = AttentionState::default();
            run(attn, segments[0].clone(), 0, &mut state);
            run(attn, segments[1].clone(), SEGMENT, &mut state);
            let remembered = state.get::<MemorizingState>().unwrap().memory.len(0);
            (remembered, run(attn, segments[2].clone(), 2 * SEGMENT, &mut state))
        };
        let mut local_only = attn.clone();
        local_only.memory_size = 0;
        let (none, local) = remembering(&local_only);
        let (two_segments, open) = remembering(&attn);
        assert_eq!((none, two_segments), (0, 2 * SEGMENT));
        assert!(max_diff(open, local.clone()) > 1e-3, "the open gate lets the memory in");
        let gate = attn.memory.as_mut().unwrap();
        gate.bias = Param::from_tensor(Tensor::full([4], -1.0e30, &device));
        assert_eq!(max_diff(remembering(&attn).1, local), 0.0);
    }

    /// A row whose document ends forgets it — its memory and its XL cache: after `reset_rows`,
    /// its outputs equal a fresh layer's on the new document, while the other row still reads
    /// both.
    #[test]
    fn a_reset_row_remembers_nothing_of_the_previous_document() {
        let device = Device::flex();
        let attn = layer(&device);
        let old = Tensor::random([2, 2 * SEGMENT, D], Distribution::Normal(0.0, 1.0), &device);
        let new = Tensor::random([2, SEGMENT, D], Distribution::Normal(0.0, 1.0), &device);
        let mut state = AttentionState::default();
        run(&attn, old, 0, &mut state);
        attn.reset_rows(&mut state, &[true, false]);
        let st = state.get::<MemorizingState>().unwrap();
        assert_eq!((st.memory.len(0), st.memory.len(1)), (0, 2 * SEGMENT));
        let continued = run(&attn, new.clone(), 2 * SEGMENT, &mut state);
        let fresh = run(&attn, new, 2 * SEGMENT, &mut AttentionState::default());
        let row = |t: &Tensor<3>, r: usize| t.clone().narrow(0, r, 1);
        // the hidden cache adds exact zeros, summed in another order: equal to rounding
        assert!(max_diff(row(&continued, 0), row(&fresh, 0)) < 1e-6);
        assert!(max_diff(row(&continued, 1), row(&fresh, 1)) > 1e-3, "row 1 kept its memory");
    }

    /// The XL cache: a layer without memory fed segment A, then B, gives on B what plain
    /// attention over A‖B gives on its last segment (A's keys at their positions: ALiBi makes a
    /// wrong position show). Without the cache it gives attention over B alone; a row reset in
    /// between reads B alone too, while the other row still reads A.
    #[test]
    fn local_attention_reads_the_previous_segment() {
        use variorum_position::PositionConfig;
        let device = Device::flex();
        let alibi = PositionConfig::Alibi(Default::default());
        device.seed(9);
        let cfg = MemorizingConfig { segment: SEGMENT, memory_layers: vec![false], ..Default::default() };
        let xl = cfg.init(D, 0.2, 0.2, Positioning { config: &alibi, context: SEGMENT }, &device);
        let mut plain = xl.clone();
        plain.xl_cache = false;
        let a = Tensor::random([2, SEGMENT, D], Distribution::Normal(0.0, 1.0), &device);
        let b = Tensor::random([2, SEGMENT, D], Distribution::Normal(0.0, 1.0), &device);
        let attend = |x: Tensor<3>, at: usize| {
            let mask = AttentionMask::causal().at(at, at);
            xl.attention.forward(AttentionInput::self_attention(x, &mask), None).context
        };
        let over_both = attend(Tensor::cat(vec![a.clone(), b.clone()], 1), 0).narrow(1, SEGMENT, SEGMENT);
        let over_b = attend(b.clone(), SEGMENT);
        let after_a = |attn: &MemorizingAttention, reset: bool| {
            let mut state = AttentionState::default();
            run(attn, a.clone(), 0, &mut state);
            if reset {
                attn.reset_rows(&mut state, &[true, false]);
            }
            run(attn, b.clone(), SEGMENT, &mut state)
        };
        assert!(max_diff(after_a(&xl, false), over_both.clone()) < 1e-5);
        assert!(max_diff(after_a(&plain, false), over_b.clone()) < 1e-5);
        assert!(max_diff(over_both.clone(), over_b.clone()) > 1e-3, "A changes B's outputs");
        let reset = after_a(&xl, true);
        let row = |t: &Tensor<3>, r: usize| t.clone().narrow(0, r, 1);
        assert!(max_diff(row(&reset, 0), row(&over_b, 0)) < 1e-5);
        assert!(max_diff(row(&reset, 1), row(&over_both, 1)) < 1e-5);
    }

    /// V_m against the paper's formula written out: for each head and query, the k stored keys
    /// with the largest q̂ · k̂, a softmax of τ q̂ · k̂ over those k alone, their values weighted by
    /// it. Another k, a softmax over every stored key, or a missing τ moves the result.
    #[test]
    fn the_memory_read_is_a_softmax_over_the_k_nearest_stored_keys() {
        let device = Device::flex();
        let attn = layer(&device);
        let (h, dh, k) = (attn.attention.qkv.n_kv_heads, attn.attention.qkv.head_dim, attn.top_k);
        let (stored, queries) = (7, 2);
        // fixed values, no generator; keys and queries unit per (head, position)
        let raw = |n: usize, s: f32| -> Vec<f32> {
            let v: Vec<f32> = (0..h * n * dh).map(|i| (1.3 * i as f32 + s).sin()).collect();
            v.chunks(dh)
                .flat_map(|c| {
                    let norm = c.iter().map(|x| x * x).sum::<f32>().sqrt();
                    c.iter().map(move |x| x / norm)
                })
                .collect()
        };
        let (keys, q) = (raw(stored, 0.0), raw(queries, 0.7));
        let values: Vec<f32> = (0..h * stored * dh).map(|i| (0.61 * i as f32).cos()).collect();
        let mut memory = KnnMemory::new(1, h, dh, 32);
        memory.push(&keys, &values, stored);
        let taus: Vec<f32> = (0..h).map(|i| 2.0 + i as f32).collect();
        let tau = Tensor::<1>::from_floats(taus.as_slice(), &device).reshape([1, h, 1, 1]);
        let q_t = Tensor::<4>::from_data(TensorData::new(q.clone(), [1, h, queries, dh]), &device);
        let got = attn.from_memory(q_t, tau, &memory).into_data().try_to_vec::<f32>().unwrap();
        for head in 0..h {
            for i in 0..queries {
                let qi = &q[(head * queries + i) * dh..][..dh];
                let dot =
                    |j: usize| -> f64 { (0..dh).map(|e| (qi[e] * keys[(head * stored + j) * dh + e]) as f64).sum() };
                let mut order: Vec<usize> = (0..stored).collect();
                order.sort_by(|&a, &b| dot(b).total_cmp(&dot(a)));
                let top = &order[..k];
                let w: Vec<f64> = top.iter().map(|&j| (taus[head] as f64 * dot(j)).exp()).collect();
                let total: f64 = w.iter().sum();
                for e in 0..dh {
                    let want: f64 =
                        top.iter().zip(&w).map(|(&j, w)| w / total * values[(head * stored + j) * dh + e] as f64).sum();
                    let have = got[(head * queries + i) * dh + e] as f64;
                    assert!((have - want).abs() < 1e-5, "head {head}, query {i}: {have} vs {want}");
                }
            }
        }
    }

    /// Stored keys are unit vectors (the paper's answer to keys gone stale), and a segment
    /// joins the memory only once complete: feeding it in two parts stores it once.
    #[test]
    fn complete_segments_join_the_memory_as_unit_keys() {
        let device = Device::flex();
        let attn = layer(&device);
        let x = Tensor::random([1, SEGMENT + 2, D], Distribution::Normal(0.0, 1.0), &device);
        let mut state = AttentionState::default();
        run(&attn, x.clone().narrow(1, 0, 3), 0, &mut state);
        assert_eq!(state.get::<MemorizingState>().unwrap().memory.len(0), 0);
        run(&attn, x.narrow(1, 3, 3), 3, &mut state);
        let st = state.get::<MemorizingState>().unwrap();
        assert_eq!((st.memory.len(0), st.held()), (SEGMENT, 2));
        let h = attn.attention.qkv.n_kv_heads;
        let q = Tensor::<4>::ones([1, h, 1, attn.attention.qkv.head_dim], &device);
        let found = st.memory.search(&q.into_data().try_into_vec::<f32>().unwrap(), h, 1, SEGMENT);
        for key in found.keys.chunks(attn.attention.qkv.head_dim) {
            let norm: f32 = key.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "a stored key of norm {norm}");
        }
    }
}
