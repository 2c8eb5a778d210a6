//! Sliding-window attention, the `sliding-window` kind (local band attention; Beltagy et al.
//! 2020, Longformer; the "attend at most N back" restriction of the reference):
//!
//! Attention(Q, K, V)_i = softmax_{j ∈ [i − w + 1, i + a]} (q_i·k_j/√d + M_ij) v_j,
//!
//! with w = `window` keys back (the query's own position included) and a = 0 for causal
//! attention, `look_ahead` (default w − 1: a symmetric window) for bidirectional attention.
//!
//! A forward over a fresh sequence is computed by blocks ([`crate::pattern::band_attention::BandAttention`]):
//! O(L·(w + B)) scores, never L × L. Decoding keeps only the last w keys and values in the cache
//! and scores the new tokens against them directly; with a memory in front of the keys the same
//! dense path is used. Any relative position scheme applies (one score layout serves every block).

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, RotaryConfig, XlRelativeConfig};

use crate::contract::Positioning;
use crate::kind::{AttentionKind, TestVariant, caps};
use crate::pattern::band_attention::BandAttention;

attention_config! {
    /// `model.attention` with `kind = "sliding-window"`.
    pub struct SlidingWindowConfig {
        /// w, keys each query sees back, its own included. Default 256.
        pub window: usize = 256,
        /// Bidirectional only: keys seen ahead. Default w − 1 (symmetric).
        pub look_ahead: Option<usize> = None,
        /// Positions per block of the computation. Default min(w, 128).
        pub block: Option<usize> = None,
        /// One window per layer, bottom first (Longformer grows them towards the top); empty =
        /// `window` everywhere.
        pub layer_windows: Vec<usize> = Vec::new(),
        /// Positions with global attention (Longformer): they attend to every key and every query
        /// attends to them, causality permitting. Decoding then keeps the whole cache. Default none.
        pub global: Vec<usize> = Vec::new(),
        /// δ per head (Longformer's dilated window: w keys δ apart); empty = 1 for every head.
        pub dilations: Vec<usize> = Vec::new(),
    }
}

impl SlidingWindowConfig {
    /// Positions per block of the computation: `block`, or min(w, 128).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.window.min(128))
    }

    /// Keys seen ahead (bidirectional only): `look_ahead`, or w − 1.
    pub fn look_ahead(&self) -> usize {
        self.look_ahead.unwrap_or(self.window.saturating_sub(1))
    }

    /// The layer, a [`BandAttention`]: `init_std` for q/k/v, `out_std` for the output projection;
    /// `position` supplies the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> BandAttention {
        BandAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            back: self.window - 1,
            look_ahead: self.look_ahead(),
            block: self.block(),
            query_blocks: false,
            head_back: Vec::new(),
            global: self.global.clone(),
            dilations: self.dilations.clone(),
            wrap: None,
        }
    }
}

impl AttentionKind for SlidingWindowConfig {
    type Module = BandAttention;
    const SUMMARY: &'static str = "band attention over the last `window` keys (look-ahead when bidirectional), computed block by block; KV cache trimmed to the window";
    const PAPER: &'static str = "Beltagy et al. 2020, Longformer; Child et al. 2019 (local attention)";
    const CAPS: Capabilities = caps::BLOCKED_SCORES;
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self { look_ahead: Some(self.look_ahead()), block: Some(self.block()), ..self.expanded_heads(d_model) }
    }

    /// The config of layer `i` (its window from `layer_windows`).
    fn for_layer(&self, i: usize) -> Self {
        match self.layer_windows.get(i) {
            Some(&window) => Self { window, layer_windows: Vec::new(), ..self.clone() },
            None => self.clone(),
        }
    }

    fn per_layer(&self) -> usize {
        self.layer_windows.len()
    }

    fn per_layer_key(&self) -> &'static str {
        "layer_windows"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.window >= 1 && self.layer_windows.iter().all(|&w| w >= 1), || {
            "model.attention.window and layer_windows must be at least 1".into()
        })?;
        check(self.block() >= 1, || "model.attention.block must be at least 1".into())?;
        check(
            self.dilations.is_empty()
                || (self.dilations.len() == self.n_heads && self.dilations.iter().all(|&d| d >= 1)),
            || {
                format!(
                    "model.attention.dilations {:?}: give one dilation (at least 1) per head, {} of them",
                    self.dilations, self.n_heads
                )
            },
        )
    }

    /// Multiply–adds per token: at most w keys (plus the block's slack).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k.min(self.window + self.block()))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // block-by-block band with absolute and relative positions and GQA
        let mut out: Vec<TestVariant<Self>> = [
            PositionConfig::default(),
            PositionConfig::Alibi(Default::default()),
            PositionConfig::Rope(RotaryConfig::default()),
            PositionConfig::TransformerXl(XlRelativeConfig::default()),
        ]
        .into_iter()
        .map(|position| {
            let cfg = Self { window: 5, block: Some(3), n_kv_heads: Some(2), ..Default::default() };
            TestVariant::new(format!("+ position {}", position.kind()), cfg).with_position(position)
        })
        .collect();
        // Longformer's global positions, with a relative scheme
        out.push(
            TestVariant::new(
                "global positions + position transformer-xl",
                Self { window: 3, block: Some(4), global: vec![0, 6], ..Default::default() },
            )
            .with_position(PositionConfig::TransformerXl(XlRelativeConfig::default())),
        );
        // windows growing from the bottom layer to the top (Longformer)
        out.push(TestVariant::new(
            "per-layer windows",
            Self { layer_windows: vec![2, 6], block: Some(4), ..Default::default() },
        ));
        out.push(
            TestVariant::new(
                "dilated heads + position alibi",
                Self { window: 3, block: Some(2), dilations: vec![1, 2, 1, 3], ..Default::default() },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
        );
        // run bidirectionally under the masked objective
        out.push(TestVariant::new("masked lm", Self { window: 3, ..Default::default() }).masked());
        // other normalisers on the block-by-block band
        out.push(TestVariant::new(
            "entmax-1.5 + head temperature",
            Self {
                window: 5,
                block: Some(3),
                normaliser: crate::engine::normaliser::Normaliser::Entmax15,
                head_temperature: true,
                ..Default::default()
            },
        ));
        out.push(TestVariant::new(
            "relu",
            Self {
                window: 5,
                block: Some(3),
                normaliser: crate::engine::normaliser::Normaliser::Relu,
                ..Default::default()
            },
        ));
        out
    }
}
