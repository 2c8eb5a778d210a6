//! Blockwise attention (Qiu et al. 2019, BlockBERT), the `blockwise` kind: the sequence is cut
//! into n blocks of B positions and head h's queries of block t attend to the keys of block
//! π_h(t) only — an n × n block pattern with one nonzero block per block row,
//!
//! Attention_h(Q, K, V)_t = softmax(Q_t K_{π_h(t)}ᵀ / √d) V_{π_h(t)}.
//!
//! The permutations are shifts: π_h(t) = (t + s_h) mod n with s_h from `shifts` (default
//! s_h = h, so the heads together cover n blocks of every block row when n ≤ heads). With
//! s_h = 0 a head is block-local.
//!
//! Causally a block ahead cannot be read, so we define the causal variant as: head h sees its own
//! block up to the query and the whole block s_h before it (t − s_h, when it exists and s_h > 0)
//! — our choice; BlockBERT is bidirectional.
//!
//! Computed by blocks: the permuted blocks are keys gathered per query block (B per block, one
//! set per head) — O(L·B) scores — plus, causally, the own block as a band. Gathered keys take
//! the position schemes that act through the distance (none, absolute, RoPE, ALiBi, T5).

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::PositionConfig;

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::blocks::sparse;
use crate::engine::gathered::KeySet;
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::PatternCall;
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "blockwise"`.
    pub struct BlockwiseConfig {
        /// B, positions per block. Default 64.
        pub block: usize = 64,
        /// s_h per head, the block shift of its permutation; empty = 0, 1, …, h − 1.
        pub shifts: Vec<usize> = Vec::new(),
    }
}

impl BlockwiseConfig {
    /// s_h of every head: `shifts`, or 0, 1, …, h − 1.
    pub fn head_shifts(&self) -> Vec<usize> {
        if self.shifts.is_empty() { (0..self.n_heads).collect() } else { self.shifts.clone() }
    }

    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> BlockwiseAttention {
        BlockwiseAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            block: self.block,
            shifts: self.head_shifts(),
        }
    }
}

impl AttentionKind for BlockwiseConfig {
    type Module = BlockwiseAttention;
    const SUMMARY: &'static str = "blockwise attention: head h's query block t sees key block (t + s_h) mod n; causal: its own block and the block s_h before";
    const PAPER: &'static str = "Qiu et al. 2019, Blockwise Self-Attention for Long Document Understanding";
    const CAPS: Capabilities = Capabilities { hides_padding: false, ..caps::GATHERED_SCORES };
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self { shifts: self.head_shifts(), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.block >= 1, || "model.attention.block must be at least 1".into())?;
        check(self.shifts.is_empty() || self.shifts.len() == self.n_heads, || {
            format!("model.attention.shifts {:?}: give one shift per head, {} of them", self.shifts, self.n_heads)
        })
    }

    /// Multiply–adds per token: one block (two when causal).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, (2 * self.block).min(len_k))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // own block plus a permuted (shifted) block per head
        vec![
            TestVariant::new("+ position alibi", Self { block: 3, n_kv_heads: Some(2), ..Default::default() })
                .with_position(PositionConfig::Alibi(Default::default())),
        ]
    }
}

/// A blockwise (BlockBERT) layer ([`BlockwiseConfig`]): each head's query block sees one
/// shifted key block.
#[derive(Module, Debug)]
pub struct BlockwiseAttention {
    /// The multi-head attention the pattern restricts: projections, position scheme, normaliser.
    pub attention: MultiHeadAttention,
    /// B, positions per block.
    pub block: usize,
    /// s_h per head, the block shift of its permutation.
    #[module(skip)]
    pub shifts: Vec<usize>,
}

impl BlockwiseAttention {
    /// The key block of head `head` for query block `t` of `blocks` (causal: the block before).
    fn partner(&self, head: usize, t: usize, blocks: usize, causal: bool) -> Option<usize> {
        let s = self.shifts[head];
        if causal { (s > 0 && t >= s).then(|| t - s) } else { Some((t + s) % blocks) }
    }

    /// Whether head `head` at position `q` sees position `k` in a sequence of `blocks` blocks.
    pub fn sees(&self, head: usize, q: usize, k: usize, blocks: usize, causal: bool) -> bool {
        let (bq, bk) = (q / self.block, k / self.block);
        let own = causal && bq == bk && k <= q;
        own || self.partner(head, bq, blocks, causal) == Some(bk)
    }

    /// [`Self::forward_with`] without `dense`, `[b, len_q, d_model]`; `cache` holds the earlier
    /// positions' keys and values when decoding.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(&self, input: AttentionInput, mut cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        let call = PatternCall::new(&self.attention, input, cache.as_deref_mut(), dense);
        let (p, causal) = (&call.p, call.causal());
        let len = (p.layout.k_start + p.layout.len_k).max(p.layout.q_start + p.layout.len_q);
        let blocks = len.div_ceil(self.block);
        let out = if call.fresh() {
            let (b, h) = (self.block, self.shifts.len());
            let keys = KeySet::new(
                h,
                len,
                b,
                b,
                |head, t, s| self.partner(head, t, blocks, causal).map(|v| v * b + s),
                |_, _, _| true,
            );
            let own = BandPart {
                bands: vec![Band { back: 0, ahead: 0, block: b, query_blocks: true, causal }],
                dilation: 1,
                heads: Vec::new(),
            };
            let bands = if causal { vec![own] } else { Vec::new() };
            let pattern = Pattern { block: b, bands: &bands, global: &[], extra: Some(&keys) };
            PatternCall::output(&self.attention, sparse(&self.attention, p, &pattern))
        } else {
            call.dense(&self.attention, 1, |_, head, q, k| !self.sees(head, q, k, blocks, causal))
        };
        // causal decoding needs the current block and the widest shift's block
        if let Some(c) = cache {
            let keep_blocks = self.shifts.iter().copied().max().unwrap_or(0) + 1;
            let first = (len / self.block).saturating_sub(keep_blocks - 1) * self.block;
            c.drop_front(first.saturating_sub(c.start));
        }
        out
    }
}

impl AttentionMechanism for BlockwiseAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        BlockwiseAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
