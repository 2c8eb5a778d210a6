//! [`BandAttention`]: multi-head attention restricted to a band, the module of the
//! `sliding-window`, `local` and `multi-scale` kinds — blocks for a fresh sequence, the dense
//! masked computation when the keys are not the queries (a KV cache, a memory) or when weights
//! are asked for.

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::blocks::{banded, sparse};
use crate::engine::heads::MultiHeadAttention;
use crate::kind::AttentionMechanism;
use crate::pattern::adjacent_chunks::{ChunkItems, adjacent_chunk_attention};
use crate::pattern::call::dense_pattern;
use crate::state::AttentionState;
use burn::prelude::*;
use variorum_core::AttentionMask;

/// Multi-head attention restricted to a band of keys around each query (the module of
/// `sliding-window`, `local` and `multi-scale`).
#[derive(Module, Debug)]
pub struct BandAttention {
    /// The engine the band restricts: projections, scores, normaliser, output projection.
    pub attention: MultiHeadAttention,
    /// Keys seen back (from the query, or from its block's start).
    pub back: usize,
    /// Bidirectional only: keys seen ahead (of the query, or of its block's end).
    pub look_ahead: usize,
    /// Positions per block of the computation (and, with `query_blocks`, of the query blocks
    /// reach is measured from).
    pub block: usize,
    /// Reach measured from the query's block (local attention) rather than the query.
    pub query_blocks: bool,
    /// Per-head reach back (Multi-Scale Transformer; keys ahead the same when bidirectional);
    /// empty = `back` for every head.
    #[module(skip)]
    pub head_back: Vec<usize>,
    /// Positions with global attention (they see every key, every query sees them).
    #[module(skip)]
    pub global: Vec<usize>,
    /// δ per head (Longformer's dilated window: keys δ apart, reach counted in keys); empty = 1.
    #[module(skip)]
    pub dilations: Vec<usize>,
    /// Bidirectional local attention whose chunks wrap around (the `local` kind's `wrap`).
    #[module(skip)]
    pub wrap: Option<Wrap>,
}

/// Local attention over chunks that wrap around, as transformers' Reformer computes it
/// bidirectionally: the sequence, padded with hidden keys to a multiple of `pad_to`, is cut into
/// chunks of `block`, and chunk c sees chunks c − before … c + after modulo their number (the
/// first chunk's previous one is the last). A sequence of at most `block` positions (as given,
/// no padding) is attended to in full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wrap {
    /// Chunks before the query's.
    pub before: usize,
    /// Chunks after it.
    pub after: usize,
    /// Longer sequences are padded to a multiple of this (a multiple of the chunk).
    pub pad_to: usize,
}

impl BandAttention {
    /// The band of every head (one entry when all heads share it).
    pub fn bands(&self, causal: bool) -> Vec<Band> {
        let band = |back: usize, ahead: usize| Band {
            back,
            ahead: if causal { 0 } else { ahead },
            block: self.block,
            query_blocks: self.query_blocks,
            causal,
        };
        if self.head_back.is_empty() {
            vec![band(self.back, self.look_ahead)]
        } else {
            self.head_back.iter().map(|&w| band(w, w)).collect()
        }
    }

    /// Drops cached keys no later query can see (none when there are global positions: every
    /// later query sees them, and the cache keeps one contiguous range).
    pub fn trim(&self, cache: &mut KvCache) {
        if !self.global.is_empty() {
            return;
        }
        let widest = self.dilations.iter().copied().max().unwrap_or(1);
        let keep = self.bands(true).iter().map(|b| (b.keep() - 1) * widest + 1).max().unwrap_or(0);
        cache.drop_front(cache.len().saturating_sub(keep));
    }

    /// Attention within the band, keys appended to `cache` where given; by blocks where the
    /// keys are the queries, dense and masked otherwise.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// Whether this call's pattern is full attention: self-attention over a fresh sequence
    /// (no keys from elsewhere) that every band covers, no global positions, no dilation.
    fn is_full_attention(&self, input: &AttentionInput) -> bool {
        let len = input.query.dims()[1];
        let fresh = input.key_value.is_none() && input.mask.q_start == input.mask.k_start;
        fresh
            && self.global.is_empty()
            && self.dilations.iter().all(|&d| d == 1)
            && self.bands(input.mask.causal).iter().all(|b| b.covers(len))
    }

    /// With `dense`, always scores every key under the band mask (the definition; for tests).
    pub fn forward_with(&self, input: AttentionInput, mut cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        let mask = input.mask;
        if let Some(wrap) = self.wrap.filter(|_| !mask.causal && input.key_value.is_none() && cache.is_none()) {
            return self.wrapped(input, wrap);
        }
        let plain = mask.padding.is_none() && mask.custom.is_none() && !input.need_weights;
        if plain && !dense && cache.is_none() && self.is_full_attention(&input) {
            // the band reaches every key (a window at least the context, as at a short one):
            // full attention computes the same, on its fused fast path
            return self.attention.forward(input, None);
        }
        let p = self.attention.project(input.query, input.key_value, mask, cache.as_deref_mut());
        let bands = self.bands(mask.causal);
        let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
        let out = if aligned && plain && !dense {
            let context = if self.dilations.iter().all(|&d| d == 1) {
                banded(&self.attention, &p, &bands, &self.global)
            } else {
                let parts = BandPart::per_dilation(bands[0], &self.dilations);
                sparse(
                    &self.attention,
                    &p,
                    &Pattern { block: self.block, bands: &parts, global: &self.global, extra: None },
                )
            };
            AttentionOutput { context: self.attention.merge(context), weights: None, aux_losses: Vec::new() }
        } else {
            dense_pattern(&self.attention, &p, mask, input.need_weights, 1, |_, head, q, k| {
                let band = &bands[if bands.len() == 1 { 0 } else { head }];
                let global = (self.global.contains(&q) || self.global.contains(&k)) && (!mask.causal || k <= q);
                let dilation = self.dilations.get(head).copied().unwrap_or(1);
                !(global || band.sees_dilated(q as i64, k as i64, dilation))
            })
        };
        if let Some(c) = cache {
            self.trim(c);
        }
        out
    }
}

impl BandAttention {
    /// Bidirectional chunks that wrap around ([`Wrap`]), on [`adjacent_chunk_attention`]:
    /// O(L · block · (1 + before + after)) scores.
    fn wrapped(&self, input: AttentionInput, wrap: Wrap) -> AttentionOutput {
        let mask = input.mask;
        let p = self.attention.project(input.query, None, mask, None);
        let [b, h, len, _] = p.q_dims();
        let device = p.device();
        // every query head its K/V head: a group's query heads are consecutive
        let per_head = |t: Tensor<4>| {
            let [_, kv, _, w] = t.dims();
            t.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, len, w]).reshape([b, h, len, w])
        };
        let (q, k, v) = (p.q(), per_head(p.k.clone()), per_head(p.v.clone()));
        let (n, chunk, before, after) = match len <= self.block {
            true => (len, len, 0, 0),
            false => (len.next_multiple_of(wrap.pad_to), self.block, wrap.before, wrap.after),
        };
        let pad = |t: Tensor<4>| match n - len {
            0 => t,
            extra => {
                let w = t.dims()[3];
                Tensor::cat(vec![t, Tensor::zeros([b, h, extra, w], &device)], 2)
            }
        };
        let position: Tensor<3, Int> = Tensor::arange(0..n as i64, &device).reshape([1, 1, n]).expand([b, h, n]);
        let padded = position.clone().greater_equal_elem(len as i64);
        let hidden = match &mask.padding {
            Some(pad_keys) => {
                let given = Tensor::cat(vec![pad_keys.clone().int(), Tensor::zeros([b, n - len], &device)], 1);
                Some(padded.bool_or(given.equal_elem(1).unsqueeze_dim::<3>(1).expand([b, h, n])))
            }
            None => (n > len).then_some(padded),
        };
        let items = ChunkItems { q: pad(q), k: pad(k), v: pad(v), position, hidden };
        let result = adjacent_chunk_attention(
            items,
            chunk,
            before,
            after,
            false,
            None,
            &self.attention.dropout,
            input.need_weights,
        );
        let weights = result.weights.map(|w| w.narrow(2, 0, len).narrow(3, 0, len));
        let context = result.out.narrow(2, 0, len);
        AttentionOutput { context: self.attention.merge(context), weights, aux_losses: Vec::new() }
    }
}

/// The mechanism of the `sliding-window`, `local` and `multi-scale` kinds: a KV cache trimmed to
/// what a later query can still see.
impl AttentionMechanism for BandAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        BandAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.attention.project(x, None, mask, Some(state.kv_mut()));
        self.trim(state.kv_mut());
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
