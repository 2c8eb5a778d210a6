//! What one attention kind declares: [`AttentionKind`] on its config, [`AttentionMechanism`] on
//! its module. Both live in the kind's own file; one line in [`crate::registry`] enrols the kind
//! in the config enum, the module enum, `variorum zoo`, validation and the generic tests.

use burn::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use variorum_core::{AttentionMask, Capabilities, ConfigError};
use variorum_position::HeadShape;

use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::state::AttentionState;

/// What every attention kind's `build` receives: the model's width, the initialisation scales
/// and the layer's position scheme.
#[derive(Debug, Clone, Copy)]
pub struct LayerInit<'a> {
    /// The model's width.
    pub d_model: usize,
    /// std of the normal initialisation of the input projections.
    pub init_std: f64,
    /// std of the residual output projection (GPT-2: `init_std / √(2·n_layers)`).
    pub out_std: f64,
    /// The relative position scheme the layer is built with (absolute schemes: none).
    pub position: Positioning<'a>,
}

/// The settings a kind shares with full attention's heads, as one value
/// ([`AttentionKind::head_settings`]): how many query and key/value heads, their size, the
/// dropout on the attention weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadSettings {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (unset: `n_heads`).
    pub n_kv_heads: Option<usize>,
    /// Size of each head (unset: `d_model / n_heads`).
    pub head_dim: Option<usize>,
    /// Dropout on the attention weights.
    pub dropout: f64,
}

impl HeadSettings {
    /// Query heads and head size at width `d_model`.
    pub fn shape(&self, d_model: usize) -> HeadShape {
        HeadShape { d_model, n_heads: self.n_heads, head_dim: self.head_dim.unwrap_or(d_model / self.n_heads.max(1)) }
    }

    /// The settings with their derived defaults written out: `n_kv_heads` (`n_heads`) and
    /// `head_dim` (`d_model / n_heads`).
    pub fn expanded(&self, d_model: usize) -> Self {
        Self {
            n_kv_heads: Some(self.n_kv_heads.unwrap_or(self.n_heads)),
            head_dim: Some(self.shape(d_model).head_dim),
            ..*self
        }
    }
}

/// A tiny setting of a kind for the generic tests (leak, decode = forward, save/load, overfit),
/// declared beside the kind: the harness builds a 2-layer model around it.
#[derive(Debug, Clone)]
pub struct TestVariant<C> {
    /// Says what the variant exercises (`"dilated heads"`); the harness prefixes the kind.
    pub name: String,
    /// The kind's setting under test.
    pub config: C,
    /// Run with the masked (bidirectional) objective instead of next-token prediction.
    pub masked: bool,
    /// A position scheme to run it with (default: the harness's learned table).
    pub position: Option<variorum_position::PositionConfig>,
}

impl<C> TestVariant<C> {
    /// A causal variant with the harness's position scheme.
    pub fn new(name: impl Into<String>, config: C) -> Self {
        Self { name: name.into(), config, masked: false, position: None }
    }

    /// The same variant under the masked objective.
    pub fn masked(mut self) -> Self {
        self.masked = true;
        self
    }

    /// The same variant under the position scheme `position`.
    pub fn with_position(mut self, position: variorum_position::PositionConfig) -> Self {
        self.position = Some(position);
        self
    }
}

impl<C: Clone> TestVariant<C> {
    /// The variants of a kind on full attention's score path (talking heads, RealFormer,
    /// Lazyformer, …): `base` alone, `grouped` (`base` with two key/value heads, and whatever
    /// else the kind wants tried with them) under RoPE, `base` under ALiBi, and `base` under the
    /// masked objective.
    pub fn score_path_with(base: C, grouped: C) -> Vec<Self> {
        use variorum_position::{PositionConfig, RotaryConfig};
        vec![
            Self::new("", base.clone()),
            Self::new("grouped-query + position rope", grouped)
                .with_position(PositionConfig::Rope(RotaryConfig::default())),
            Self::new("position alibi", base.clone()).with_position(PositionConfig::Alibi(Default::default())),
            Self::new("bidirectional", base).masked(),
        ]
    }
}

impl<C: AttentionKind> TestVariant<C> {
    /// [`score_path_with`](Self::score_path_with) where the grouped variant is `base` with two
    /// key/value heads (its [`head_settings`](AttentionKind::head_settings) changed).
    pub fn score_path(base: C) -> Vec<Self> {
        let grouped = match base.head_settings() {
            Some(heads) => base.with_head_settings(&HeadSettings { n_kv_heads: Some(2), ..heads }),
            None => base.clone(),
        };
        Self::score_path_with(base, grouped)
    }
}

/// A kind's config (`model.attention` with `kind = "…"`): what it is, what it supports, how it
/// is checked and built. The name a config selects it by is given at registration.
pub trait AttentionKind:
    Clone + core::fmt::Debug + PartialEq + Default + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The initialised mechanism.
    type Module: AttentionMechanism + 'static;

    /// One line for `variorum zoo`.
    const SUMMARY: &'static str;
    /// Authors, year, title.
    const PAPER: &'static str;
    /// What the kind supports whatever its settings (the zoo row; validation reads
    /// [`capabilities`](Self::capabilities)).
    const CAPS: Capabilities;

    /// What this configured instance supports (a setting may take a capability away).
    fn capabilities(&self) -> Capabilities {
        Self::CAPS
    }

    /// Why a setting without a causal form has none, for the refusal of a next-token model.
    fn why_not_causal(&self) -> &'static str {
        "its outputs mix in positions after them"
    }

    /// Why this setting's causal outputs may change in their last bits (never in value) when
    /// only later tokens change, if they may. Default: they may not — the generic leak test
    /// asks for bit-identical outputs before the first changed token.
    fn inexact_causality(&self) -> Option<&'static str> {
        None
    }

    /// The settings this kind shares with full attention's heads, as one value (keys its table
    /// lacks at their defaults), if it has heads: the defaults of [`head_shape`](Self::head_shape),
    /// [`dropout`](Self::dropout) and [`expanded`](Self::expanded) read them. Kinds written
    /// with the crate's `attention_config!` get this and
    /// [`with_head_settings`](Self::with_head_settings) from one macro line. Default: none (one
    /// head of the model's width, no dropout on weights).
    fn head_settings(&self) -> Option<HeadSettings> {
        None
    }

    /// This config with `heads` written into the head fields its table has (what
    /// [`expanded_heads`](Self::expanded_heads) writes back). Default: unchanged.
    fn with_head_settings(&self, _heads: &HeadSettings) -> Self {
        self.clone()
    }

    /// The config with the heads' derived defaults written out (`n_kv_heads`, `head_dim`), the
    /// rest as it is.
    fn expanded_heads(&self, d_model: usize) -> Self {
        match self.head_settings() {
            Some(heads) => self.with_head_settings(&heads.expanded(d_model)),
            None => self.clone(),
        }
    }

    /// The same config with every derived default written out. Default: the heads'
    /// ([`expanded_heads`](Self::expanded_heads)); a kind whose own settings default from
    /// others writes those out too.
    fn expanded(&self, d_model: usize) -> Self {
        self.expanded_heads(d_model)
    }

    /// Checks the settings against the model width; errors name the key
    /// (`model.attention.…`) and what would work.
    fn validate(&self, d_model: usize) -> Result<(), ConfigError>;

    /// Refuses a sequence (or cross-attention source) of `len` positions the kind cannot take
    /// (fixed-length parameters). Default: any length.
    fn validate_len(&self, _len: usize) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The config a model of context `len` has: a fixed-length kind (Linformer) is built for
    /// that length (attention benchmarks over several lengths). Default: unchanged.
    fn for_length(&self, _len: usize) -> Self {
        self.clone()
    }

    /// Query heads and head size (what position schemes are built for). Default: the
    /// [`head_settings`](Self::head_settings)' shape, or one head of the model's width.
    fn head_shape(&self, d_model: usize) -> HeadShape {
        match self.head_settings() {
            Some(heads) => heads.shape(d_model),
            None => HeadShape { d_model, n_heads: 1, head_dim: d_model },
        }
    }

    /// Dropout on the attention weights. Default: the [`head_settings`](Self::head_settings)'
    /// dropout, or 0 (kinds without weights).
    fn dropout(&self) -> f64 {
        self.head_settings().map_or(0.0, |heads| heads.dropout)
    }

    /// Forward FLOPs per token (2 per multiply–add) for a context of `len_k` keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64;

    /// The config of layer `layer` (kinds with per-layer settings pick theirs).
    fn for_layer(&self, _layer: usize) -> Self {
        self.clone()
    }

    /// Layers with their own setting (0 = the same in every layer).
    fn per_layer(&self) -> usize {
        0
    }

    /// The key of the per-layer list (`sliding-window`'s `layer_windows`), for the error when
    /// its length does not match the model's layers; a kind that overrides
    /// [`per_layer`](Self::per_layer) names its key here.
    fn per_layer_key(&self) -> &'static str {
        "its per-layer list"
    }

    /// Whether every query is scored against every key (an L × L matrix per head), for memory
    /// estimates.
    fn scores_every_key(&self) -> bool {
        false
    }

    /// How many example tags the kind is conditioned on (ids `0..n`, read from
    /// `AttentionMask::tags`), when it is: the data must then be tagged (`data.tags`) with at
    /// most `n` tags. Default: the kind ignores tags.
    fn tags(&self) -> Option<usize> {
        None
    }

    /// Whether a trained layer of this setting has something to show of what it learned
    /// ([`AttentionMechanism::learned`]): `variorum inspect` asks before it loads the weights.
    /// Default: no.
    fn shows_what_it_learned(&self) -> bool {
        false
    }

    /// The initialised layer: this setting at `init`'s width, scales and position scheme.
    fn build(&self, init: &LayerInit, device: &Device) -> Self::Module;

    /// Tiny settings the generic harness runs (at least one per kind: a test fails otherwise).
    fn test_variants() -> Vec<TestVariant<Self>>;
}

/// An initialised attention mechanism: the attention contract, and the hooks a model or trainer
/// calls without knowing the kind.
pub trait AttentionMechanism: Module + burn::module::ModuleDisplay + core::fmt::Debug {
    /// Runs the mechanism; `state` carries its incremental-decoding state when decoding (the
    /// kind keeps its own type in it, see [`AttentionState::get_or_default`]).
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput;

    /// Appends what a forward would to the state (keys and values, recurrent sums) without
    /// needing the output: CALM's propagation to skipped blocks. Default: a forward.
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.forward(AttentionInput::self_attention(x, mask), Some(state));
    }

    /// Cross-attention over a source that stays the same from call to call (an encoder's output
    /// while the decoder generates one token at a time): `input.key_value` is the source, and
    /// `state`, fresh for each source, may keep what the kind derives from it (its projected
    /// keys and values) on the first call for the later ones. Must equal a stateless forward of
    /// the same input. Default: that forward (the source projected again on every call).
    fn cross_attention(&self, input: AttentionInput, _state: &mut AttentionState) -> AttentionOutput {
        self.forward(input, None)
    }

    /// Content-based attention of `query` over `key_value`, without mask or position scheme
    /// (the compressive memory's reconstruction loss). Default: a bidirectional cross-attention
    /// forward.
    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        let mask = AttentionMask::bidirectional();
        self.forward(AttentionInput::cross_attention(query, key_value, &mask), None).context
    }

    /// Whether the mechanism reads the dense `[len_q, len_k]` mask of
    /// [`AttentionInput::dense_mask`] (a model builds it only for those that do).
    fn uses_dense_mask(&self) -> bool {
        false
    }

    /// The segment length of a global input beside the sequence (ETC: one global token per
    /// segment), for the model that adds it.
    fn global_segment(&self) -> Option<usize> {
        None
    }

    /// Token ids that get global attention wherever they occur (Longformer).
    fn global_token_ids(&self) -> &[u32] {
        &[]
    }

    /// Called by the trainer after every optimizer step (`step` counts from 1): random features
    /// redrawn, centroids moved.
    fn after_optimizer_step(&mut self, _step: usize) {}

    /// Called after weights were loaded into a freshly built module that did not all find a
    /// match (`--init-from`): `fresh(field)` says whether parameters under that field kept their
    /// initialisation. A kind that initialises some parameters from others (Longformer's global
    /// projections from the window's) derives them again from the loaded ones.
    fn after_partial_load(&mut self, _fresh: &dyn Fn(&str) -> bool) {}
    /// Whether the mechanism keeps a memory of earlier segments in its state, which the model
    /// then carries from one training step to the next along ordered streams (and evaluation
    /// and generation along the text). The kind's config declares `Capabilities::remembers`.
    fn remembers(&self) -> bool {
        false
    }
    /// Rows `r` with `rows[r]` start a new document: what the state remembers of theirs is
    /// forgotten. Called by the trainer before a step whose rows do not all start over.
    fn reset_rows(&self, _state: &mut AttentionState, _rows: &[bool]) {}

    /// What this trained layer learned, for the run report and `variorum inspect` (adaptive
    /// span: the span of every head), where its config says it shows something
    /// ([`AttentionKind::shows_what_it_learned`]). Default: nothing.
    fn learned(&self) -> Option<Learned> {
        None
    }
}

/// One layer's view of what it learned ([`AttentionMechanism::learned`]): a heading, the same
/// for every layer of a model, and this layer's line.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// What is shown and in which unit (`learned span per head (positions, at most 64, …)`).
    pub title: String,
    /// This layer's values.
    pub line: String,
}

/// Refuses a dropout probability outside [0, 1) for `model.attention.dropout`.
pub fn check_dropout(dropout: f64) -> Result<(), ConfigError> {
    variorum_core::error::check((0.0..1.0).contains(&dropout), || {
        format!("model.attention.dropout = {dropout} must be in [0, 1)")
    })
}

/// Capability presets the kinds declare theirs from.
pub mod caps {
    use variorum_core::Capabilities;

    /// Forms a score matrix over keys at their absolute positions (full attention and its
    /// restrictions): causal and bidirectional, KV-cache decoding, any position scheme, a memory.
    pub const SCORES: Capabilities =
        Capabilities { score_bias: true, qk_rotation: true, absolute_scores: true, ..Capabilities::NEUTRAL };

    /// [`SCORES`] over every key of a source as well: cross-attention.
    pub const CROSS_SCORES: Capabilities = Capabilities { cross: true, ..SCORES };

    /// Forms scores block by block from relative offsets (band and strided patterns): any
    /// relative scheme, but none that scores absolute positions.
    pub const BLOCKED_SCORES: Capabilities = Capabilities { absolute_scores: false, ..SCORES };

    /// Gathers keys from anywhere (random blocks, summaries, permuted blocks): a score-acting
    /// scheme must act through the distance alone.
    pub const GATHERED_SCORES: Capabilities = Capabilities { gathers_keys: true, ..SCORES };

    /// No score matrix for a position scheme to act on (kernelised, content-sorted, pooled,
    /// query-prototype): causal and bidirectional, incremental decoding.
    pub const NO_SCORES: Capabilities = Capabilities::NEUTRAL;

    /// No causal form (every output mixes in later positions): bidirectional only, no
    /// incremental decoding, no score matrix; trained as a masked LM.
    pub const BIDIRECTIONAL_ONLY: Capabilities =
        Capabilities { causal: false, incremental: false, ..Capabilities::NEUTRAL };
}
