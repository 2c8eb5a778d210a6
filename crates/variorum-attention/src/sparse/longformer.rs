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
//! pieces in the same softmax as the global columns ([`crate::engine::blocks::sparse`]); each distinct
//! dilation is one band pass over all heads (a position scheme's per-head parameters need every
//! head present), masked to its own heads. O(L·(w + B)·distinct dilations + L·g).
//!
//! Global attention has its own projections, as in the paper (§3.1: "two sets of projections,
//! Q_s, K_s, V_s for the sliding window and Q_g, K_g, V_g for the global attention"; their code
//! initialises Q_g, K_g, V_g from the local ones, and so do we): a global token's output is
//!
//! o_g = softmax(Q_g x_g · (K_g X)ᵀ / √d) V_g X    over every key (causal: keys ≤ g),
//!
//! while every other query scores the global keys with the local projections, in its window's
//! softmax (as the reference implementation does). They exist when the config names global
//! positions or token ids, or always with `global_projections = "separate"` (Longformer's
//! checkpoints carry them whether or not an input has global tokens: kept, a global position
//! named later uses them); `global_projections = "shared"` uses the local projections for both
//! (the form before this option, which also loads runs trained with it). The output projection
//! is shared. Global rows are computed one global position at a time over all keys: O(L·g).
//! Where nothing but the softmax acts on the scores (no position scheme inside attention, no
//! dropout or temperature; no padding, custom or graph mask, no `max_back`; keys at the input's
//! own positions, no cache, no weights asked for, and few enough global rows), a global row is
//! folded through the projections instead of projecting K_g and V_g at every position:
//! q_g·(W_k x_j + b_k) = (W_kᵀ q_g)·x_j + const, and Σ_j p_j (W_v x_j + b_v) = W_v (Σ_j p_j x_j) +
//! b_v — O(L·d) per global position and head, with no L × 3d projection kept for the backward.
//!
//! Decoding keeps the last (w − 1)·max δ + 1 keys, or every key once a global token is possible
//! (and, with separate projections, every position's K_g, V_g in a second cache); the positions
//! of global tokens chosen by id are remembered in the cache.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, XlRelativeConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::blocks::sparse;
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::{Projected, per_query_head};
use crate::engine::qkv::QkvProjection;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::{PatternCall, decode_runs, dense_pattern};
use crate::state::AttentionState;

/// Which projections Longformer's global attention uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GlobalProjections {
    /// Q_g, K_g, V_g of their own, initialised from the local ones (the paper's), kept even
    /// where no position is global.
    Separate,
    /// The sliding window's projections for global attention too.
    Shared,
}

attention_config! {
    /// `model.attention` with `kind = "longformer"`.
    pub struct LongformerConfig {
        /// w, keys each query sees back, its own included (δ apart on a dilated head). Default 256.
        pub window: usize = 256,
        /// Bidirectional only: keys seen ahead. Default w − 1 (symmetric; each layer's own w
        /// with `layer_windows`).
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
        /// `separate` (Q_g, K_g, V_g, the paper's) or `shared` with the window. Default:
        /// separate where some position is global, none otherwise.
        pub global_projections: Option<GlobalProjections> = None,
    }
}

impl LongformerConfig {
    /// Positions per block of the computation: `block`, or min(w, 128).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.window.min(128))
    }

    /// Keys seen ahead (bidirectional only): `look_ahead`, or w − 1.
    pub fn look_ahead(&self) -> usize {
        self.look_ahead.unwrap_or(self.window.saturating_sub(1))
    }

    /// δ of every head.
    pub fn head_dilations(&self) -> Vec<usize> {
        if self.dilations.is_empty() { vec![1; self.n_heads] } else { self.dilations.clone() }
    }

    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any. Q_g, K_g, V_g start as copies of the local ones.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> LongformerAttention {
        let attention = self.heads().init(d_model, init_std, out_std, position, device);
        let has_global = !self.global.is_empty() || !self.global_token_ids.is_empty();
        LongformerAttention {
            global_qkv: match self.global_projections {
                Some(GlobalProjections::Separate) => true,
                Some(GlobalProjections::Shared) => false,
                None => has_global,
            }
            .then(|| copy_of(&attention.qkv)),
            attention,
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
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self {
            // with a window per layer, each layer's own w − 1 unless one is given
            look_ahead: if self.layer_windows.is_empty() { Some(self.look_ahead()) } else { self.look_ahead },
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

    fn per_layer_key(&self) -> &'static str {
        if self.layer_windows.is_empty() { "layer_dilations" } else { "layer_windows" }
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

/// A copy of `qkv`'s values as new parameters (their own ids, so trained apart).
fn copy_of(qkv: &QkvProjection) -> QkvProjection {
    let fresh = |p: &Param<Tensor<2>>| Param::from_tensor(p.val().clone());
    let qkv_linear = Linear {
        weight: fresh(&qkv.qkv.weight),
        bias: qkv.qkv.bias.as_ref().map(|b| Param::from_tensor(b.val().clone())),
    };
    QkvProjection { qkv: qkv_linear, ..qkv.clone() }
}

/// Decoding state: the window's KV cache, and the global projections' keys and values of every
/// position (when separate).
#[derive(Debug, Clone, Default)]
pub struct LongformerCache {
    /// The window's keys and values (every key once global tokens are possible), and the
    /// positions of the global tokens chosen by id.
    pub local: KvCache,
    /// K_g and V_g of every position (separate global projections only).
    pub global: KvCache,
}

/// A Longformer layer ([`LongformerConfig`]): a (dilated) sliding window plus global
/// attention.
#[derive(Module, Debug)]
pub struct LongformerAttention {
    /// The sliding window's multi-head attention; its output projection serves global rows too.
    pub attention: MultiHeadAttention,
    /// Q_g, K_g, V_g, when global attention has its own projections.
    pub global_qkv: Option<QkvProjection>,
    /// Keys seen back, δ apart.
    pub back: usize,
    /// Bidirectional only: keys seen ahead, δ apart.
    pub look_ahead: usize,
    /// Positions per block of the computation.
    pub block: usize,
    /// δ per head.
    #[module(skip)]
    pub dilations: Vec<usize>,
    /// Positions with global attention.
    #[module(skip)]
    pub global: Vec<usize>,
    /// Token ids with global attention wherever they occur (the mask brings their positions).
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

    /// [`Self::forward_with`] without `dense`, `[b, len_q, d_model]`; `cache` holds the window's
    /// (and the global projections') keys and values when decoding.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut LongformerCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// Projects `x` into the caches and remembers its global tokens, without an output.
    pub fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, cache: &mut LongformerCache) {
        let batch = x.dims()[0];
        if let Some(g) = self.global_attention() {
            g.project(x.clone(), None, mask, Some(&mut cache.global));
        }
        self.attention.project(x, None, mask, Some(&mut cache.local));
        self.global_rows(batch, mask, Some(&mut cache.local));
        self.trim(&mut cache.local);
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(
        &self,
        input: AttentionInput,
        cache: Option<&mut LongformerCache>,
        dense: bool,
    ) -> AttentionOutput {
        let (mut cache, global_cache) = match cache {
            Some(c) => (Some(&mut c.local), Some(&mut c.global)),
            None => (None, None),
        };
        // the folded rows read the keys from the input's own positions
        let own_keys = input.key_value.is_none() && input.mask.q_start == input.mask.k_start;
        let unmasked = input.mask.custom.is_none() && input.mask.padding.is_none() && input.mask.graph.is_none();
        let plain = unmasked && input.mask.max_back.is_none() && !input.need_weights;
        let fold = global_cache.is_none() && !dense && own_keys && plain;
        let global_projected = self.global_attention().map(|g| {
            if fold && folds(&g, &input.query.device()) {
                return (g, GlobalRows::Folded(input.query.clone()));
            }
            let p = g.project(input.query.clone(), input.key_value.clone(), input.mask, global_cache);
            (g, GlobalRows::Projected(p))
        });
        let batch = input.query.dims()[0];
        let mask = input.mask;
        let call = PatternCall::new(&self.attention, input, cache.as_deref_mut(), dense);
        let (p, causal) = (&call.p, call.causal());
        let global = self.global_rows(batch, mask, cache.as_deref_mut());
        let row_of = |i: usize| p.rows(i..i + 1);
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
        match global_projected {
            Some((g, GlobalRows::Folded(x))) if folding_pays(&g, &x, mask.q_start, &global) => {
                let (q0, lq) = (mask.q_start, x.dims()[1]);
                let folded = FoldedProjections::new(&g);
                FOLDS.set(FOLDS.get() + 1);
                with_global_rows(out, (q0, lq), &global, |i, _| (folded.row(&g, &x, i, mask.causal), None))
            }
            Some((g, GlobalRows::Folded(x))) => {
                // so many global rows that projecting is cheaper (known once the rows are): as defined
                let gp = g.project(x, None, mask, None);
                with_projected_global_rows(out, &g, &gp, mask, &global)
            }
            Some((g, GlobalRows::Projected(gp))) => with_projected_global_rows(out, &g, &gp, mask, &global),
            None => out,
        }
    }

    /// Attention with the global projections (and the window's position scheme and output
    /// projection), when they are separate.
    fn global_attention(&self) -> Option<MultiHeadAttention> {
        self.global_qkv.as_ref().map(|qkv| MultiHeadAttention { qkv: qkv.clone(), ..self.attention.clone() })
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

thread_local! {
    static FOLDS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many calls on this thread folded their global rows (tests check the fold ran).
pub fn folds_run() -> usize {
    FOLDS.get()
}

/// How the global rows are computed: from the global projections of every position, or folded
/// through the projections from the layer's input ([`FoldedProjections::row`]).
enum GlobalRows {
    Projected(Projected),
    Folded(Tensor<3>),
}

/// Whether a global row of `g` may be folded through its projections: nothing but softmax acts
/// on the scores.
fn folds(g: &MultiHeadAttention, device: &Device) -> bool {
    let softmax = g.normaliser.row == variorum_kernels::normalisers::RowNormaliser::Softmax;
    let plain = !crate::engine::heads::drops(&g.dropout, device) && softmax && g.normaliser.query_factor().is_none();
    g.position.is_none() && plain
}

/// Whether folding the global rows costs less than projecting K_g and V_g at every position: a
/// folded row keeps O(b·h·(L + d)) for the backward and does O(b·h·d·L) work, the projection
/// O(b·L·3d) and O(b·L·3d²) once, so folding pays while (global rows) · h ≤ 3 d.
fn folding_pays(g: &MultiHeadAttention, x: &Tensor<3>, q0: usize, global: &[Vec<usize>]) -> bool {
    let [_, lq, d] = x.dims();
    let mut rows: Vec<usize> = global.iter().flatten().copied().filter(|&p| p >= q0 && p < q0 + lq).collect();
    rows.sort_unstable();
    rows.dedup();
    rows.len() * g.qkv.n_heads <= 3 * d
}

/// The global projections' key and value weights per query head, `[h, d, hd]` each, and the value
/// bias `[1, h, 1, hd]`: what every folded global row of a call reads.
struct FoldedProjections {
    w_k: Tensor<3>,
    w_v: Tensor<3>,
    b_v: Option<Tensor<4>>,
}

impl FoldedProjections {
    fn new(g: &MultiHeadAttention) -> Self {
        let qkv = &g.qkv;
        let (h, h_kv, hd) = (qkv.n_heads, qkv.n_kv_heads, qkv.head_dim);
        let weight = qkv.qkv.weight.val();
        let d = weight.dims()[0];
        // each query head reads its key/value head's columns
        let per_head = |from: usize| {
            per_query_head(weight.clone().narrow(1, from, h_kv * hd).reshape([d, h_kv, hd]), h).swap_dims(0, 1)
        };
        let b_v =
            qkv.qkv.bias.as_ref().map(|bias| {
                per_query_head(bias.val().narrow(0, (h + h_kv) * hd, h_kv * hd).reshape([1, h_kv, 1, hd]), h)
            });
        Self { w_k: per_head(h * hd), w_v: per_head((h + h_kv) * hd), b_v }
    }

    /// Global attention of the query at row `i` of `x: [b, L, d]` over the keys it sees (causal:
    /// rows ≤ i), folded through `g`'s projections: per head, the scores are x_j·(W_kᵀ q) (the key
    /// bias adds one constant per row, which softmax ignores) and the output W_v (Σ_j p_j x_j) + b_v
    /// (the weights sum to 1). `[b, 1, d]`, through the output projection.
    fn row(&self, g: &MultiHeadAttention, x: &Tensor<3>, i: usize, causal: bool) -> Tensor<3> {
        let [b, l, d] = x.dims();
        let (h, hd) = (g.qkv.n_heads, g.qkv.head_dim);
        let q = g.qkv.scaled_queries(x.clone().narrow(1, i, 1), g.scale);
        // u = W_kᵀ q per head: [b, h, d]
        let w_k = self.w_k.clone().swap_dims(1, 2).unsqueeze_dim::<4>(0).expand([b, h, hd, d]);
        let u = q.matmul(w_k).reshape([b, h, d]);
        let keys = x.clone().narrow(1, 0, if causal { i + 1 } else { l });
        let p = burn::tensor::activation::softmax(u.matmul(keys.clone().swap_dims(1, 2)), 2);
        // Σ_j p_j x_j, then W_v and b_v per head: [b, h, 1, hd]
        let mixed = p.matmul(keys).reshape([b, h, 1, d]);
        let out = mixed.matmul(self.w_v.clone().unsqueeze_dim::<4>(0).expand([b, h, d, hd]));
        g.merge(match &self.b_v {
            Some(b_v) => out + b_v.clone(),
            None => out,
        })
    }
}

/// [`with_global_rows`] with each row from the global projections `gp` of every position, as
/// defined (global attention over every key, one global position at a time).
fn with_projected_global_rows(
    out: AttentionOutput,
    g: &MultiHeadAttention,
    gp: &Projected,
    mask: &AttentionMask,
    global: &[Vec<usize>],
) -> AttentionOutput {
    let (q0, lq) = (gp.layout.q_start, gp.layout.len_q);
    with_global_rows(out, (q0, lq), global, |i, need_weights| {
        let pos = q0 + i;
        let layout = variorum_position::ScoreLayout::new(pos, gp.layout.k_start, 1, gp.layout.len_k, gp.layout.causal);
        let p = Projected::new(gp.q().narrow(2, i, 1), gp.k.clone(), gp.v.clone(), layout, gp.max_back);
        let row_mask =
            AttentionMask { q_start: pos, custom: mask.custom.clone().map(|c| c.narrow(1, i, 1)), ..mask.clone() };
        let row = dense_pattern(g, &p, &row_mask, need_weights, 1, |_, _, _, _| false);
        (row.context, row.weights)
    })
}

/// `out` with the rows of this call's global queries (the call's rows `q0..q0 + lq`) replaced
/// by `row(i, need_weights)` (context `[b, 1, d]`, weights `[b, h, 1, L]`), one global position
/// at a time; a position global in some batch rows only is replaced in those.
fn with_global_rows(
    out: AttentionOutput,
    (q0, lq): (usize, usize),
    global: &[Vec<usize>],
    row: impl Fn(usize, bool) -> (Tensor<3>, Option<Tensor<4>>),
) -> AttentionOutput {
    let mut positions: Vec<usize> = global.iter().flatten().copied().filter(|&p| p >= q0 && p < q0 + lq).collect();
    positions.sort_unstable();
    positions.dedup();
    let AttentionOutput { mut context, mut weights, aux_losses } = out;
    let [b, _, d] = context.dims();
    let device = context.device();
    for pos in positions {
        let i = pos - q0;
        let (row_context, row_weights) = row(i, weights.is_some());
        let here: Vec<f32> = global.iter().map(|rows| if rows.contains(&pos) { 1.0 } else { 0.0 }).collect();
        let all = here.iter().all(|&x| x == 1.0);
        let select = Tensor::<1>::from_data(TensorData::new(here, [b]), &device);
        let blend = |old: Tensor<3>, new: Tensor<3>| {
            if all { new } else { old.clone() + (new - old) * select.clone().reshape([b, 1, 1]) }
        };
        let old = context.clone().narrow(1, i, 1);
        context = context.slice_assign([0..b, i..i + 1, 0..d], blend(old, row_context));
        if let (Some(w), Some(rw)) = (weights.as_mut(), row_weights) {
            let [_, h, _, lk] = w.dims();
            let old = w.clone().narrow(2, i, 1);
            let new = if all { rw } else { old.clone() + (rw - old) * select.clone().reshape([b, 1, 1, 1]) };
            *w = w.clone().slice_assign([0..b, 0..h, i..i + 1, 0..lk], new);
        }
    }
    AttentionOutput { context, weights, aux_losses }
}

impl AttentionMechanism for LongformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LongformerAttention::forward(self, input, state.map(|s| s.get_or_default::<LongformerCache>()))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        LongformerAttention::extend_cache(self, x, mask, state.get_or_default());
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }

    fn global_token_ids(&self) -> &[u32] {
        &self.global_token_ids
    }

    /// Global projections that found nothing to load start again from the (loaded) window's.
    fn after_partial_load(&mut self, fresh: &dyn Fn(&str) -> bool) {
        if self.global_qkv.is_some() && fresh("global_qkv") {
            self.global_qkv = Some(copy_of(&self.attention.qkv));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bidirectionally each layer sees as far ahead as back (its own w − 1), unless `look_ahead`
    /// says otherwise (before, every layer read the base `window`'s: 255 keys ahead).
    #[test]
    fn each_layer_looks_ahead_by_its_own_window() {
        let config = LongformerConfig { layer_windows: vec![2, 5], ..Default::default() }.expanded(16);
        let ahead: Vec<usize> = (0..2).map(|i| config.for_layer(i).look_ahead()).collect();
        assert_eq!(ahead, [1, 4]);
        let given = LongformerConfig { layer_windows: vec![2, 5], look_ahead: Some(3), ..Default::default() };
        let ahead: Vec<usize> = (0..2).map(|i| given.expanded(16).for_layer(i).look_ahead()).collect();
        assert_eq!(ahead, [3, 3]);
        let uniform = LongformerConfig { window: 6, ..Default::default() }.expanded(16);
        assert_eq!(uniform.for_layer(1).look_ahead(), 5);
    }

    /// `global_projections = "separate"` keeps Q_g, K_g, V_g without global positions (a
    /// checkpoint's); unset, they exist only with global positions; `shared` never.
    #[test]
    fn global_projections_exist_as_configured() {
        let device = Device::default();
        let init = |c: LongformerConfig| {
            c.init(16, 0.02, 0.02, Positioning { config: &PositionConfig::default(), context: 16 }, &device)
                .global_qkv
                .is_some()
        };
        let base = LongformerConfig { n_heads: 2, window: 3, ..Default::default() };
        assert!(!init(base.clone()));
        assert!(init(LongformerConfig { global: vec![0], ..base.clone() }));
        assert!(init(LongformerConfig { global_projections: Some(GlobalProjections::Separate), ..base.clone() }));
        let shared = Some(GlobalProjections::Shared);
        assert!(!init(LongformerConfig { global: vec![0], global_projections: shared, ..base }));
    }
}
