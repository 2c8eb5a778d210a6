//! The Sparse Transformer's fixed pattern (Child et al. 2019), the `fixed` kind:
//!
//! A⁽¹⁾_i = { j : ⌊j/ℓ⌋ = ⌊i/ℓ⌋ }   (the query's own block of ℓ positions),
//! A⁽²⁾_i = { j : j mod ℓ ∈ {ℓ − c, …, ℓ − 1} }   (the last c "summary" positions of every block),
//!
//! both cut at the query when causal. Combined as for `strided`: `union` (every head sees
//! A⁽¹⁾ ∪ A⁽²⁾), `heads` (the first half of the heads A⁽¹⁾, the others A⁽²⁾), `alternate` (even
//! layers A⁽¹⁾, odd layers A⁽²⁾). A head on A⁽²⁾ alone also sees the query itself, so that no
//! causal row is empty (the first block's queries precede every summary); that is our choice,
//! the paper leaves it open.
//!
//! Computed by blocks of ℓ: on the block-sparse kernel, each block scores its own block and the
//! summaries of the blocks it may see (before it, when causal) as runs of its layout; off the
//! kernel, A⁽¹⁾ as a band over the query's block and the summaries as keys gathered for every
//! block (c·L/ℓ of them). One softmax: O(L·(ℓ + c·L/ℓ)) scores, O(L·√(cL)) with ℓ ≈ √(cL). Summary keys are gathered, so the position schemes are those acting through the
//! distance (none, absolute, RoPE, ALiBi, T5). Decoding keeps every key (summaries reach back
//! to 0) and scores a new token's own block and, as c views with a step of ℓ, the summaries.

use std::ops::Range;

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, RotaryConfig, T5BiasConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::blocks::sparse;
use crate::engine::gathered::KeySet;
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::{PatternCall, decode_runs};
use crate::sparse::strided::StridedCombine;

attention_config! {
    /// `model.attention` with `kind = "fixed"`.
    pub struct FixedConfig {
        /// ℓ, positions per block. Default 128 (the paper's).
        pub stride: usize = 128,
        /// c, summary positions at the end of each block. Default 8 (the paper's c ∈ {8, 16, 32}).
        pub summary: usize = 8,
        /// `union` (default), `heads` or `alternate`.
        pub combine: StridedCombine = StridedCombine::Union,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]); `alternate`
        /// reads it.
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

/// What one head sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sees {
    Both,
    Block,
    Summaries,
}

impl FixedConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> FixedAttention {
        let h = self.n_heads;
        let sees: Vec<Sees> = (0..h)
            .map(|head| match self.combine {
                StridedCombine::Union => Sees::Both,
                StridedCombine::Heads if head < h / 2 => Sees::Block,
                StridedCombine::Heads => Sees::Summaries,
                StridedCombine::Alternate if self.layer % 2 == 0 => Sees::Block,
                StridedCombine::Alternate => Sees::Summaries,
            })
            .collect();
        FixedAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            stride: self.stride,
            summary: self.summary,
            head_sees: sees,
        }
    }
}

impl AttentionKind for FixedConfig {
    type Module = FixedAttention;
    const SUMMARY: &'static str = "Sparse Transformer fixed pattern: the own block of ℓ and the last c positions of every block (union, split heads or alternating layers)";
    const PAPER: &'static str = "Child et al. 2019, Generating Long Sequences with Sparse Transformers";
    const CAPS: Capabilities = caps::GATHERED_SCORES;
    head_kind_items!();

    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.stride >= 1, || "model.attention.stride must be at least 1".into())?;
        check(self.summary >= 1 && self.summary <= self.stride, || {
            format!("model.attention.summary = {} must be between 1 and stride = {}", self.summary, self.stride)
        })?;
        check(self.combine != StridedCombine::Heads || self.n_heads >= 2, || {
            "model.attention.combine = \"heads\" splits the heads between the two patterns: it needs n_heads >= 2"
                .into()
        })
    }

    /// Multiply–adds per token: its block and c summaries per block.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let keys = self.stride + self.summary * len_k.div_ceil(self.stride.max(1));
        self.heads().flops_per_token(d_model, keys.min(len_k))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // own block + summaries, the three combinations
        [
            (StridedCombine::Union, PositionConfig::Alibi(Default::default())),
            (
                StridedCombine::Heads,
                PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16, shared: false }),
            ),
            (StridedCombine::Alternate, PositionConfig::Rope(RotaryConfig::default())),
        ]
        .into_iter()
        .map(|(combine, position)| {
            let cfg = Self { stride: 4, summary: 2, combine, ..Default::default() };
            TestVariant::new(format!("{combine:?} + position {}", position.kind()), cfg).with_position(position)
        })
        .collect()
    }
}

/// A Sparse Transformer fixed-pattern layer ([`FixedConfig`]): own block and every block's
/// summaries.
#[derive(Module, Debug)]
pub struct FixedAttention {
    /// The multi-head attention the pattern restricts: projections, position scheme, normaliser.
    pub attention: MultiHeadAttention,
    /// ℓ, positions per block.
    pub stride: usize,
    /// c, summary positions at the end of each block.
    pub summary: usize,
    /// What each head sees.
    #[module(skip)]
    pub head_sees: Vec<Sees>,
}

impl FixedAttention {
    fn sees_of(&self, head: usize) -> Sees {
        self.head_sees[head]
    }

    fn is_summary(&self, k: usize) -> bool {
        k % self.stride >= self.stride - self.summary
    }

    /// Whether head `head` at position `q` sees position `k`.
    pub fn sees(&self, head: usize, q: usize, k: usize, causal: bool) -> bool {
        if causal && k > q {
            return false;
        }
        let block = q / self.stride == k / self.stride;
        match self.sees_of(head) {
            Sees::Both => block || self.is_summary(k),
            Sees::Block => block,
            Sees::Summaries => self.is_summary(k) || k == q,
        }
    }

    /// [`Self::forward_with`] without `dense`, `[b, len_q, d_model]`; `cache` holds the earlier
    /// positions' keys and values when decoding.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(&self, input: AttentionInput, cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        let call = PatternCall::new(&self.attention, input, cache, dense);
        let (p, causal) = (&call.p, call.causal());
        if call.decoding() {
            // one new token: its own block, and the summaries before it as c stepped views
            let (q, s) = (p.layout.q_start, self.stride);
            let own = q - q % s;
            let summaries: Vec<_> = (s - self.summary..s).map(|r| (r..own, s)).collect();
            let context = decode_runs(&self.attention, p, &[own..q + 1], &summaries, |head, k| {
                !self.sees(head, q, k, true) || p.max_back.is_some_and(|n| q - k > n)
            });
            return PatternCall::output(&self.attention, context);
        }
        if !call.fresh() {
            return call.dense(&self.attention, 1, |_, head, q, k| !self.sees(head, q, k, causal));
        }
        let (len, s, h) = (p.layout.len_q, self.stride, self.head_sees.len());
        // the band: the own block (heads on A(1)), or the query itself (heads on A(2) alone)
        let own_block = Band { back: 0, ahead: 0, block: s, query_blocks: true, causal };
        let itself = Band { back: 0, ahead: 0, block: s, query_blocks: false, causal };
        let bands: Vec<Band> =
            (0..h).map(|head| if self.sees_of(head) == Sees::Summaries { itself } else { own_block }).collect();
        let bands = if bands.iter().all(|b| *b == bands[0]) { vec![bands[0]] } else { bands };
        let band = BandPart { bands, dilation: 1, heads: Vec::new() };
        // the summaries of every block, each block's own left to the band (and to the query itself)
        let n = len.div_ceil(s);
        let c = self.summary;
        let summaries = |_, _, slot: usize| Some((slot / c) * s + s - c + slot % c);
        let summary_heads = (0..h).any(|head| self.sees_of(head) != Sees::Block);
        let per_head = self.head_sees.iter().any(|&x| x != self.head_sees[0]);
        let groups = if per_head { h } else { 1 };
        let sees = |g: usize| self.sees_of(if per_head { g } else { 0 });
        // on the kernel, the pattern as it is: each block of ℓ queries scores its own block and
        // the summaries of the blocks it may see (when causal, those before it only), with no
        // key set built over every (query, summary) pair
        let summaries_of = |j: usize| j * s + s - c..((j + 1) * s).min(len);
        let runs = |g: usize, i: usize| {
            let mut runs = vec![i * s..((i + 1) * s).min(len)];
            if sees(g) != Sees::Block {
                runs.extend((0..if causal { i } else { n }).filter(|&j| j != i).map(summaries_of));
            }
            runs
        };
        let visible = |g: usize, q: usize, out: &mut Vec<Range<usize>>| {
            let own = q - q % s..(q - q % s + s).min(len);
            match sees(g) {
                Sees::Block => out.push(own),
                Sees::Both => {
                    out.push(own);
                    out.extend((0..n).map(summaries_of));
                }
                Sees::Summaries => {
                    out.push(q..q + 1);
                    out.extend((0..n).map(summaries_of));
                }
            }
        };
        if let Some(context) =
            crate::engine::sparse_kernel::layout_context(&self.attention, p, s, groups, runs, visible)
        {
            return PatternCall::output(&self.attention, context);
        }
        let context = if summary_heads {
            let keys = KeySet::new(groups, len, s, n * c, summaries, |g, q, k| {
                let head = if per_head { g } else { 0 };
                match self.sees_of(head) {
                    Sees::Block => false,
                    Sees::Both => q / s != k / s && (!causal || k <= q),
                    Sees::Summaries => k != q && (!causal || k <= q),
                }
            });
            sparse(&self.attention, p, &Pattern { block: s, bands: &[band], global: &[], extra: Some(&keys) })
        } else {
            sparse(&self.attention, p, &Pattern { block: s, bands: &[band], global: &[], extra: None })
        };
        PatternCall::output(&self.attention, context)
    }
}

impl AttentionMechanism for FixedAttention {
    // The cache grows with every position (the summaries reach back to 0).
    kv_cache_hooks!();

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
