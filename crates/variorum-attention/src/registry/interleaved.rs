//! Different attention kinds in different layers, the `interleaved` kind: layer i runs
//! `layers[i mod n]`,
//!
//! ```toml
//! [model.attention]
//! kind = "interleaved"
//! [[model.attention.layers]]
//! kind = "local"
//! block = 64
//! [[model.attention.layers]]
//! kind = "lsh"
//! ```
//!
//! GPT-3 alternates dense and locally banded layers (Brown et al. 2020, after the Sparse
//! Transformer); transformers' Reformer alternates local and LSH layers (`attn_layers`). Nothing
//! is built for the list itself: [`AttentionConfig::for_layer`] hands each layer its entry, so
//! every layer is an ordinary layer of its kind and its weights keep their kind's names. The
//! list is read as a model reads one kind: what every entry can do ([`Capabilities::together`]),
//! each entry validated, the same head shape everywhere (the position scheme is built once per
//! shape).

use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::kind::TestVariant;
use crate::registry::AttentionConfig;
use crate::sparse::sliding_window::SlidingWindowConfig;

/// `model.attention` with `kind = "interleaved"`: one attention setting per layer, cycled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterleavedConfig {
    /// The settings, layer i taking entry i mod n. At least one; none of them `interleaved`.
    pub layers: Vec<AttentionConfig>,
}

/// How `kind = "interleaved"` is written: the tag, then the list.
#[derive(Serialize)]
pub(crate) struct Tagged<'a> {
    kind: &'static str,
    layers: &'a [AttentionConfig],
}

impl InterleavedConfig {
    /// The config's `kind` value.
    pub const KIND: &'static str = "interleaved";
    /// Its `variorum zoo` row.
    pub const SUMMARY: &'static str = "different kinds in different layers: layer i runs layers[i mod n] (what it supports is what every entry supports)";
    /// Where alternating layers come from.
    pub const PAPER: &'static str =
        "Brown et al. 2020, Language Models are Few-Shot Learners (alternating dense and banded layers)";

    /// The generic harness's settings: full and banded layers in turn, causal and masked.
    pub(crate) fn test_variants() -> Vec<TestVariant<AttentionConfig>> {
        let pair = || Self {
            layers: vec![
                AttentionConfig::Full(Default::default()),
                AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 3, ..Default::default() }),
            ],
        };
        let variant = |what: &str| {
            TestVariant::new(format!("attention {} {what}", Self::KIND), AttentionConfig::Interleaved(pair()))
        };
        vec![variant("full, sliding-window"), variant("full, sliding-window, masked").masked()]
    }

    pub(crate) fn tagged(&self) -> Tagged<'_> {
        Tagged { kind: Self::KIND, layers: &self.layers }
    }

    /// The entry layer `layer` runs (not yet specialised for the layer).
    pub fn entry(&self, layer: usize) -> &AttentionConfig {
        &self.layers[layer % self.layers.len()]
    }

    /// What every entry supports, and what any of them does; with two entries or more the
    /// layers differ by index, which one shared block cannot carry (`distinct_layers`).
    pub fn capabilities(&self) -> Capabilities {
        let mut all = self.layers.iter().map(AttentionConfig::capabilities);
        let first = all.next().unwrap_or(Capabilities::NEUTRAL);
        let caps = all.fold(first, Capabilities::together);
        Capabilities { distinct_layers: caps.distinct_layers || self.layers.len() > 1, ..caps }
    }

    /// The first entry without a causal form says why.
    pub fn why_not_causal(&self) -> &'static str {
        self.layers.iter().find(|c| !c.capabilities().causal).map_or("", AttentionConfig::why_not_causal)
    }

    /// Each entry, a non-empty list, no nested `interleaved`, no per-layer lists inside (the
    /// list is already per layer), one head shape.
    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        check(!self.layers.is_empty(), || {
            "model.attention.layers is empty: give one attention table per layer of the cycle".into()
        })?;
        for (i, c) in self.layers.iter().enumerate() {
            check(!matches!(c, AttentionConfig::Interleaved(_)), || {
                format!("model.attention.layers[{i}] is interleaved itself: list the kinds directly")
            })?;
            check(c.per_layer() == 0, || {
                format!(
                    "model.attention.layers[{i}] sets {} per layer: inside an interleaved list give each layer its own entry instead",
                    c.per_layer_key()
                )
            })?;
            c.validate(d_model).map_err(|e| ConfigError::new(format!("model.attention.layers[{i}]: {e}")))?;
            let (first, this) = (self.layers[0].heads(d_model), c.heads(d_model));
            check((first.n_heads, first.head_dim) == (this.n_heads, this.head_dim), || {
                format!(
                    "model.attention.layers[{i}] has {} heads of {} but layers[0] has {} of {}: interleaved kinds share one head shape",
                    this.n_heads, this.head_dim, first.n_heads, first.head_dim
                )
            })?;
        }
        Ok(())
    }

    /// Each entry checks the length.
    pub fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
        self.layers.iter().try_for_each(|c| c.validate_len(len))
    }

    /// Every entry with `f` applied.
    pub fn map(&self, f: impl Fn(&AttentionConfig) -> AttentionConfig) -> Self {
        Self { layers: self.layers.iter().map(f).collect() }
    }

    /// The mean over one cycle.
    pub fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let total: u64 = self.layers.iter().map(|c| c.flops_per_token(d_model, len_k)).sum();
        total / self.layers.len().max(1) as u64
    }

    /// The largest entry's.
    pub fn dropout(&self) -> f64 {
        self.layers.iter().map(AttentionConfig::dropout).fold(0.0, f64::max)
    }
}
