//! Multi-scale attention (Guo et al. 2019, "Multi-Scale Self-Attention for Text
//! Classification"), the `multi-scale` kind: each head h attends over its own window of w_h
//! positions (small windows for local structure, large ones for long-range), e.g. 16, 32, 64, 128.
//!
//! Computed by blocks like `sliding-window` ([`crate::pattern::band_attention::BandAttention`]) with one band per
//! head; every head's scores cover the widest window's span, its own band masked in it (choice:
//! one batched GEMM for all heads, at most max w / w_h more scores for the narrow heads than they
//! need, still linear in L). The same window per head in every layer (per-layer widths are not
//! implemented).

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::PositionConfig;

use crate::contract::Positioning;
use crate::kind::{AttentionKind, TestVariant, caps};
use crate::pattern::band_attention::BandAttention;

attention_config! {
    /// `model.attention` with `kind = "multi-scale"`.
    pub struct MultiScaleConfig {
        /// w_h, keys each head sees back (its own position included; as many ahead when
        /// bidirectional), one per head. Default 16, 32, 64, 128.
        pub windows: Vec<usize> = vec![16, 32, 64, 128],
        /// Positions per block of the computation. Default min(max w, 128).
        pub block: Option<usize> = None,
        /// One list of head windows per layer, bottom first; empty = `windows` everywhere.
        pub layer_windows: Vec<Vec<usize>> = Vec::new(),
    }
}

impl MultiScaleConfig {
    fn widest(&self) -> usize {
        self.windows.iter().copied().max().unwrap_or(1)
    }

    /// Positions per block of the computation: `block`, or min(max w, 128).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.widest().min(128))
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
        let widest = self.widest();
        BandAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            back: widest - 1,
            look_ahead: widest - 1,
            block: self.block(),
            query_blocks: false,
            head_back: self.windows.iter().map(|w| w - 1).collect(),
            global: Vec::new(),
            dilations: Vec::new(),
            wrap: None,
        }
    }
}

impl AttentionKind for MultiScaleConfig {
    type Module = BandAttention;
    const SUMMARY: &'static str =
        "band attention with its own window width per head (`windows`), computed block by block";
    const PAPER: &'static str = "Guo et al. 2019, Multi-Scale Self-Attention for Text Classification";
    const CAPS: Capabilities = caps::BLOCKED_SCORES;
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self { block: Some(self.block()), ..self.expanded_heads(d_model) }
    }

    /// The config of layer `i` (its head windows from `layer_windows`).
    fn for_layer(&self, i: usize) -> Self {
        match self.layer_windows.get(i) {
            Some(windows) => Self { windows: windows.clone(), layer_windows: Vec::new(), ..self.clone() },
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
        for windows in std::iter::once(&self.windows).chain(&self.layer_windows) {
            check(windows.len() == self.n_heads, || {
                format!(
                    "model.attention: {windows:?} has {} widths for model.attention.n_heads = {}: give one per head",
                    windows.len(),
                    self.n_heads
                )
            })?;
            check(windows.iter().all(|&w| w >= 1), || "model.attention windows must all be at least 1".into())?;
        }
        check(self.block() >= 1, || "model.attention.block must be at least 1".into())
    }

    /// Multiply–adds per token: the widest window's span for every head.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k.min(self.widest() + self.block()))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new(
                "per-layer windows",
                Self {
                    windows: vec![1, 1, 1, 1],
                    layer_windows: vec![vec![1, 2, 3, 4], vec![2, 4, 6, 8]],
                    block: Some(4),
                    ..Default::default()
                },
            ),
            // one window per head
            TestVariant::new(
                "+ position alibi",
                Self { windows: vec![1, 2, 4, 7], block: Some(3), ..Default::default() },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
        ]
    }
}
