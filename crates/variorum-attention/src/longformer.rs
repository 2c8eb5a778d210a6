//! Longformer attention (Beltagy et al. 2020), the `longformer` kind: a sliding window whose
//! heads may be dilated, plus global attention.
//!
//! Head h with dilation δ_h sees the keys q, q − δ_h, …, q − (w − 1)·δ_h (and, bidirectionally,
//! q + δ_h, … up to `look_ahead` keys ahead): w keys spread over a reach of (w − 1)·δ_h + 1
//! positions. Global positions — listed in `global`, or wherever a token of `global_token_ids`
//! occurs — see every key and are seen by every query (causality permitting). Windows may grow
//! from the bottom layer to the top (`layer_windows`), dilations may differ per layer
//! (`layer_dilations`: the paper keeps the bottom layers undilated and dilates two heads at the
//! top).
//!
//! A dilated band is an ordinary band over each residue class of positions (r, r + δ, r + 2δ,
//! …), so it is computed by blocks like the sliding window, with one score layout of stride δ:
//! every relative position scheme applies. Heads with different dilations are separate band
//! pieces in the same softmax as the global columns ([`crate::band::sparse`]); each distinct
//! dilation is one band pass over all heads (a position scheme's per-head parameters need every
//! head present), masked to its own heads. O(L·(w + B)·distinct dilations + L·g).
//!
//! Decoding keeps the last (w − 1)·max δ + 1 keys, or every key once a global token is possible;
//! the positions of global tokens chosen by id are remembered in the cache.

use burn::prelude::*;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, XlRelativeConfig};

use crate::band::{Band, BandPart, Pattern, PatternCall, decode_runs, sparse};
use crate::full::{Positioning, Projected};
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::{AttentionInput, AttentionOutput, AttentionState, KvCache, MultiHeadAttention};

crate::attention_config! {
    /// `model.attention` with `kind = "longformer"`.
    pub struct LongformerConfig {
        /// w, keys each query sees back, its own included (δ apart on a dilated head). Default 256.
        pub window: usize = 256,
        /// Bidirectional only: keys seen ahead. Default w − 1 (symmetric).
        pub look_ahead: Option<usize> = None,
        /// Positions per block of the computation. Default min(w, 128).
        pub block: Option<usize> = None,
        /// One window per layer, bottom first; empty = `window` everywhere.
        pub layer_windows: Vec<usize> = Vec::new(),
        /// δ per head; empty = 1 for every head.
        pub dilations: Vec<usize> = Vec::new(),
        /// δ per head per layer, bottom first; empty = `dilations` everywhere.
        pub layer_dilations: Vec<Vec<usize>> = Vec::new(),
        /// Positions with global attention. Default none.
        pub global: Vec<usize> = Vec::new(),
        /// Token ids with global attention wherever they occur (e.g. a separator). Default none.
        pub global_token_ids: Vec<u32> = Vec::new(),
    }
}

impl LongformerConfig {
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.window.min(128))
    }

    pub fn look_ahead(&self) -> usize {
        self.look_ahead.unwrap_or(self.window.saturating_sub(1))
    }

    /// δ of every head.
    pub fn head_dilations(&self) -> Vec<usize> {
        if self.dilations.is_empty() { vec![1; self.n_heads] } else { self.dilations.clone() }
    }

    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> LongformerAttention {
        LongformerAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            back: self.window - 1,
            look_ahead: self.look_ahead(),
            block: self.block(),
            dilations: self.head_dilations(),
            global: self.global.clone(),
            global_token_ids: self.global_token_ids.clone(),
        }
    }
}

impl AttentionKind for LongformerConfig {
    type Module = LongformerAttention;
    const SUMMARY: &'static str = "Longformer: sliding window with per-head dilation, global attention for chosen positions or token ids, per-layer windows and dilations; computed block by block";
    const PAPER: &'static str = "Beltagy et al. 2020, Longformer: The Long-Document Transformer";
    const CAPS: Capabilities = caps::BLOCKED_SCORES;

    /// Global positions chosen by token id come from the whole sequence: a later global token
    /// adds a (fully masked) column to the earlier query blocks' softmax and matmuls, whose
    /// different width can change the summation order — last bits only, its weight is exactly 0.
    fn inexact_causality(&self) -> Option<&'static str> {
        (!self.global_token_ids.is_empty())
            .then_some("global positions chosen by token id widen every query block's (masked) global columns")
    }
    crate::head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self {
            look_ahead: Some(self.look_ahead()),
            block: Some(self.block()),
            dilations: self.head_dilations(),
            ..self.expanded_heads(d_model)
        }
    }

    /// The config of layer `i` (its window and dilations from the per-layer lists).
    fn for_layer(&self, i: usize) -> Self {
        let mut c = Self { layer_windows: Vec::new(), layer_dilations: Vec::new(), ..self.clone() };
        if let Some(&window) = self.layer_windows.get(i) {
            c.window = window;
        }
        if let Some(d) = self.layer_dilations.get(i) {
            c.dilations = d.clone();
        }
        c
    }

    /// Layers with their own setting (0 = the same in every layer).
    fn per_layer(&self) -> usize {
        self.layer_windows.len().max(self.layer_dilations.len())
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.window >= 1 && self.layer_windows.iter().all(|&w| w >= 1), || {
            "model.attention.window and layer_windows must be at least 1".into()
        })?;
        check(self.block() >= 1, || "model.attention.block must be at least 1".into())?;
        let lists = std::iter::once(&self.dilations).chain(&self.layer_dilations).filter(|d| !d.is_empty());
        for d in lists {
            check(d.len() == self.n_heads && d.iter().all(|&x| x >= 1), || {
                format!(
                    "model.attention.dilations {d:?}: give one dilation (at least 1) per head, {} of them",
                    self.n_heads
                )
            })?;
        }
        check(
            self.layer_windows.is_empty()
                || self.layer_dilations.is_empty()
                || self.layer_windows.len() == self.layer_dilations.len(),
            || {
                format!(
                    "model.attention.layer_windows ({}) and layer_dilations ({}) must list the same layers",
                    self.layer_windows.len(),
                    self.layer_dilations.len()
                )
            },
        )
    }

    /// Multiply–adds per token: the window (plus the block's slack) and the global positions.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let keys = self.window + self.block() + self.global.len();
        self.heads().flops_per_token(d_model, len_k.min(keys))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            // dilated heads with per-layer windows and dilations (undilated at the bottom)
            TestVariant::new(
                "dilated heads + position transformer-xl",
                Self {
                    block: Some(2),
                    layer_windows: vec![2, 3],
                    layer_dilations: vec![vec![1, 1, 1, 1], vec![1, 2, 1, 3]],
                    n_kv_heads: Some(2),
                    ..Default::default()
                },
            )
            .with_position(PositionConfig::TransformerXl(XlRelativeConfig::default())),
            // global attention for a token id (vocabulary 11: id 3 occurs in the harness's sequences)
            TestVariant::new(
                "global token id + position alibi",
                Self {
                    window: 2,
                    block: Some(4),
                    global_token_ids: vec![3],
                    dilations: vec![1, 1, 2, 2],
                    ..Default::default()
                },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
        ]
    }
}

#[derive(Module, Debug)]
pub struct LongformerAttention {
    pub attention: MultiHeadAttention,
    /// Keys seen back, δ apart.
    pub back: usize,
    /// Bidirectional only: keys seen ahead, δ apart.
    pub look_ahead: usize,
    pub block: usize,
    /// δ per head.
    #[module(skip)]
    pub dilations: Vec<usize>,
    #[module(skip)]
    pub global: Vec<usize>,
    #[module(skip)]
    pub global_token_ids: Vec<u32>,
}

impl LongformerAttention {
    /// Whether head `head` at position `q` sees position `k` through its (dilated) window.
    pub fn window_sees(&self, head: usize, q: usize, k: usize, causal: bool) -> bool {
        let (d, dil) = (q as i64 - k as i64, self.dilations[head] as i64);
        let ahead = if causal { 0 } else { self.look_ahead as i64 };
        d % dil == 0 && d / dil <= self.back as i64 && d / dil >= -ahead
    }

    /// Whether global tokens can occur (then the cache keeps every key).
    fn has_global(&self) -> bool {
        !self.global.is_empty() || !self.global_token_ids.is_empty()
    }

    /// The global positions of each batch row: the configured ones, those the mask brings (by
    /// token id), and those remembered in the cache; the new ones are remembered.
    fn global_rows(&self, batch: usize, mask: &AttentionMask, cache: Option<&mut KvCache>) -> Vec<Vec<usize>> {
        let mut rows: Vec<Vec<usize>> = (0..batch)
            .map(|i| {
                let mut g = self.global.clone();
                if let Some(by_id) = mask.global.as_ref().and_then(|m| m.get(i)) {
                    g.extend(by_id);
                }
                g
            })
            .collect();
        if let Some(c) = cache {
            c.marked.resize_with(batch, Vec::new);
            for (row, marked) in rows.iter_mut().zip(c.marked.iter_mut()) {
                marked.extend(row.iter().copied());
                marked.sort_unstable();
                marked.dedup();
                row.clone_from(marked);
            }
        }
        for row in &mut rows {
            row.sort_unstable();
            row.dedup();
        }
        rows
    }

    /// Drops cached keys no later query can see (none once global tokens are possible).
    pub fn trim(&self, cache: &mut KvCache) {
        if self.has_global() {
            return;
        }
        let reach = self.back * self.dilations.iter().copied().max().unwrap_or(1) + 1;
        cache.drop_front(cache.len().saturating_sub(reach));
    }

    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// Projects `x` into the cache and remembers its global tokens, without an output.
    pub fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, cache: &mut KvCache) {
        let batch = x.dims()[0];
        self.attention.project(x, None, mask, Some(&mut *cache));
        self.global_rows(batch, mask, Some(&mut *cache));
        self.trim(cache);
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(&self, input: AttentionInput, mut cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        let batch = input.query.dims()[0];
        let mask = input.mask;
        let call = PatternCall::new(&self.attention, input, cache.as_deref_mut(), dense);
        let (p, causal) = (&call.p, call.causal());
        let global = self.global_rows(batch, mask, cache.as_deref_mut());
        let row = |x: &Tensor<4>, i: usize| x.clone().narrow(0, i, 1);
        let row_of = |i: usize| Projected { q: row(&p.q, i), k: row(&p.k, i), v: row(&p.v, i), ..*p };
        let same = global.iter().all(|g| *g == global[0]);
        let out = if call.fresh() {
            let context = if same {
                self.blocked(p, &global[0])
            } else {
                // rows with their own global tokens: one pass each
                Tensor::cat((0..batch).map(|i| self.blocked(&row_of(i), &global[i])).collect(), 0)
            };
            PatternCall::output(&self.attention, context)
        } else if call.decoding() && global.iter().all(|g| g.binary_search(&p.layout.q_start).is_err()) {
            // one new, non-global token: its window and the global keys, each row its own
            let rows = (0..batch).map(|i| self.decode(&row_of(i), &global[i])).collect();
            PatternCall::output(&self.attention, Tensor::cat(rows, 0))
        } else {
            call.dense(&self.attention, if same { 1 } else { batch }, |row, head, q, k| {
                let g = &global[row];
                let global = (g.binary_search(&q).is_ok() || g.binary_search(&k).is_ok()) && (!causal || k <= q);
                !(global || self.window_sees(head, q, k, causal))
            })
        };
        if let Some(c) = cache {
            self.trim(c);
        }
        out
    }

    /// One new query over its (dilated) window and the global keys: `[1, h, 1, d_h]`.
    fn decode(&self, p: &Projected, global: &[usize]) -> Tensor<4> {
        let q = p.layout.q_start;
        let reach = self.back * self.dilations.iter().copied().max().unwrap_or(1);
        let mut runs = vec![q.saturating_sub(reach)..q + 1];
        runs.extend(global.iter().map(|&g| g..g + 1));
        decode_runs(&self.attention, p, &runs, &[], |head, k| {
            let far = p.max_back.is_some_and(|n| q - k > n);
            far || !(global.binary_search(&k).is_ok() || self.window_sees(head, q, k, true))
        })
    }

    /// One band piece per distinct dilation, with the global positions, in one softmax.
    fn blocked(&self, p: &Projected, global: &[usize]) -> Tensor<4> {
        let causal = p.layout.causal;
        let band = Band {
            back: self.back,
            ahead: if causal { 0 } else { self.look_ahead },
            block: self.block,
            query_blocks: false,
            causal,
        };
        let parts = BandPart::per_dilation(band, &self.dilations);
        sparse(&self.attention, p, &Pattern { block: self.block, bands: &parts, global, extra: None })
    }
}

impl AttentionMechanism for LongformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LongformerAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        LongformerAttention::extend_cache(self, x, mask, state.kv_mut());
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }

    fn global_token_ids(&self) -> &[u32] {
        &self.global_token_ids
    }
}
