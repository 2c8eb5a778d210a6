//! 2D local attention of the Image Transformer (Parmar et al. 2018), the `local-2d` kind: the
//! sequence is an image in raster order, `width` positions per row (the last row may be
//! partial). Queries are cut into rectangles of `query_rows` × `query_cols`; every query of a
//! rectangle attends to its memory rectangle — the query rectangle extended `memory_rows` rows
//! up and `memory_cols` columns left and right — cut at the query in raster order when causal.
//! Bidirectionally the memory also extends `memory_rows` rows down (our choice: the paper
//! defines the masked, generative case).
//!
//! Computed by rectangles: each rectangle's queries are gathered into one block and score the
//! keys of its memory rectangle, gathered likewise ([`crate::engine::gathered`]), one batched GEMM of
//! `[h_q·w_q, d] × [d, (h_q + h_m)·(w_q + 2w_m)]`: O(L·(h_q + h_m)(w_q + 2w_m)) scores. Gathered
//! keys take the position schemes that act through the distance (none, absolute, RoPE, ALiBi,
//! T5; distances are raster distances) — the paper used absolute positions.

use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::PositionConfig;

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::gathered::{KeySet, gathered_scores};
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::PatternCall;
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "local-2d"`.
    pub struct Local2dConfig {
        /// W, positions per image row. Default 32.
        pub width: usize = 32,
        /// h_q, rows per query rectangle. Default 8.
        pub query_rows: usize = 8,
        /// w_q, columns per query rectangle. Default 8.
        pub query_cols: usize = 8,
        /// h_m, memory rows above the rectangle (and below, bidirectionally). Default 8.
        pub memory_rows: usize = 8,
        /// w_m, memory columns left and right of the rectangle. Default 8.
        pub memory_cols: usize = 8,
    }
}

impl Local2dConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> Local2dAttention {
        Local2dAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            width: self.width,
            query_rows: self.query_rows,
            query_cols: self.query_cols.min(self.width),
            memory_rows: self.memory_rows,
            memory_cols: self.memory_cols,
        }
    }
}

impl AttentionKind for Local2dConfig {
    type Module = Local2dAttention;
    const SUMMARY: &'static str = "Image Transformer 2D local attention: the sequence is a raster image of `width` columns; query rectangles see their memory rectangle (rows above, columns either side); computed rectangle by rectangle";
    const PAPER: &'static str = "Parmar et al. 2018, Image Transformer";
    const CAPS: Capabilities = caps::GATHERED_SCORES;
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.width >= 1 && self.query_rows >= 1 && self.query_cols >= 1, || {
            "model.attention.width, query_rows and query_cols must be at least 1".into()
        })
    }

    /// Multiply–adds per token: its memory rectangle.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let keys = (self.query_rows + 2 * self.memory_rows) * (self.query_cols + 2 * self.memory_cols);
        self.heads().flops_per_token(d_model, keys.min(len_k))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // a 4-wide raster
        let cfg = Self { width: 4, query_rows: 2, query_cols: 2, memory_rows: 1, memory_cols: 1, ..Default::default() };
        vec![
            TestVariant::new("+ position alibi", cfg.clone()).with_position(PositionConfig::Alibi(Default::default())),
            TestVariant::new(
                "sparsemax + head temperature",
                Self { normaliser: crate::engine::normaliser::Normaliser::Sparsemax, head_temperature: true, ..cfg },
            ),
        ]
    }
}

/// A 2D local attention layer ([`Local2dConfig`]): query rectangles of a raster image see
/// their memory rectangles.
#[derive(Module, Debug)]
pub struct Local2dAttention {
    /// The multi-head attention the pattern restricts: projections, position scheme, normaliser.
    pub attention: MultiHeadAttention,
    /// W, positions per image row.
    pub width: usize,
    /// h_q, rows per query rectangle.
    pub query_rows: usize,
    /// w_q, columns per query rectangle (at most W).
    pub query_cols: usize,
    /// h_m, memory rows above the rectangle (and below, bidirectionally).
    pub memory_rows: usize,
    /// w_m, memory columns left and right of the rectangle.
    pub memory_cols: usize,
}

impl Local2dAttention {
    /// Rows `[first, end)` and columns `[first, end)` of the memory of the rectangle holding `q`.
    fn memory(&self, q: usize, causal: bool) -> ([i64; 2], [i64; 2]) {
        let (row, col) = ((q / self.width) as i64, (q % self.width) as i64);
        let (hq, wq) = (self.query_rows as i64, self.query_cols as i64);
        let (r0, c0) = (row - row.rem_euclid(hq), col - col.rem_euclid(wq));
        let below = if causal { 0 } else { self.memory_rows as i64 };
        let (hm, wm) = (self.memory_rows as i64, self.memory_cols as i64);
        ([r0 - hm, r0 + hq + below], [c0 - wm, c0 + wq + wm])
    }

    /// Whether position `q` sees position `k`.
    pub fn sees(&self, q: usize, k: usize, causal: bool) -> bool {
        let ([r0, r1], [c0, c1]) = self.memory(q, causal);
        let (row, col) = ((k / self.width) as i64, (k % self.width) as i64);
        (!causal || k <= q) && (r0..r1).contains(&row) && (c0..c1).contains(&col)
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
        let out = if call.fresh() {
            let mha = &self.attention;
            let [b, h, l, dh] = p.q_dims();
            let device = p.device();
            let set = self.rectangles(l, causal).limited(p.max_back);
            let (scores, v) = gathered_scores(mha, p, &set);
            let [_, nb, bs, w] = scores.dims();
            // heads back on axis 1 for the normaliser (a temperature per head)
            let probs = mha.normalise(scores.reshape([b, h, nb * bs, w])).reshape([b * h, nb, bs, w]);
            let probs = mha.dropout.forward(probs);
            let rows = probs.matmul(v).reshape([b, h, set.blocks * set.block, dh]);
            // back to raster order: each real query row to its position
            let queries = set.queries.as_deref().unwrap_or_default();
            let (from, to): (Vec<i64>, Vec<i64>) =
                queries.iter().enumerate().filter_map(|(i, q)| q.map(|q| (i as i64, q as i64))).unzip();
            let n = from.len();
            let from = Tensor::<1, Int>::from_data(TensorData::new(from, [n]), &device);
            let to = Tensor::<1, Int>::from_data(TensorData::new(to, [n]), &device);
            let context =
                Tensor::zeros([b, h, l, dh], &device).select_assign(2, to, rows.select(2, from), IndexingUpdateOp::Add);
            PatternCall::output(mha, context)
        } else {
            call.dense(&self.attention, 1, |_, _, q, k| !self.sees(q, k, causal))
        };
        if let Some(c) = cache {
            // a later query's memory starts at most h_q − 1 + h_m rows above its own
            let end = c.start + c.len();
            let first_row = (end / self.width).saturating_sub(self.query_rows - 1 + self.memory_rows);
            c.drop_front((first_row * self.width).saturating_sub(c.start));
        }
        out
    }

    /// The query rectangles of a sequence of `len` positions and their memory rectangles.
    fn rectangles(&self, len: usize, causal: bool) -> KeySet {
        let (w, hq, wq) = (self.width, self.query_rows, self.query_cols);
        let rows = len.div_ceil(w);
        let (row_blocks, col_blocks) = (rows.div_ceil(hq), w.div_ceil(wq));
        let block = hq * wq;
        // rectangle (br, bc) as consecutive query rows, `None` past the image or the sequence
        let queries: Vec<Option<usize>> = (0..row_blocks)
            .flat_map(|br| (0..col_blocks).map(move |bc| (br, bc)))
            .flat_map(|(br, bc)| (0..hq).flat_map(move |r| (0..wq).map(move |c| (br * hq + r, bc * wq + c))))
            .map(|(row, col)| (col < w && row * w + col < len).then_some(row * w + col))
            .collect();
        let below = if causal { 0 } else { self.memory_rows };
        let (mem_rows, mem_cols) = (self.memory_rows + hq + below, self.memory_cols * 2 + wq);
        let slot = |i: usize, s: usize| {
            let (br, bc) = (i / col_blocks, i % col_blocks);
            let row = (br * hq + s / mem_cols) as i64 - self.memory_rows as i64;
            let col = (bc * wq + s % mem_cols) as i64 - self.memory_cols as i64;
            (row >= 0 && col >= 0 && col < w as i64).then(|| row as usize * w + col as usize)
        };
        KeySet::for_queries(queries, block, mem_rows * mem_cols, len, slot, |q, k| self.sees(q, k, causal))
    }
}

impl AttentionMechanism for Local2dAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        Local2dAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
