//! What one position scheme declares: [`PositionKind`] on its config, and [`RelativeScheme`] or
//! [`AbsoluteSignal`] on the module it builds. All three live in the scheme's own file; one line
//! in [`crate::registry`] enrols it in `model.position`, the module enums, `variorum zoo` and
//! the generic tests.

use burn::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use variorum_core::{Capabilities, ConfigError};

use crate::{AbsolutePosition, Distances, RelativePosition, ScoreLayout};
use variorum_kernels::block_sparse::DistanceTerms;

/// The head geometry a relative scheme is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
}

/// A scheme's config (`model.position` with `kind = "…"`): what it is, how it is checked, what
/// it builds. Every builder defaults to nothing, so a scheme writes only the ones it has: an
/// absolute scheme [`init_input`](Self::init_input) or [`init_layer`](Self::init_layer), a
/// relative one [`init_relative`](Self::init_relative).
pub trait PositionKind:
    Clone + core::fmt::Debug + PartialEq + Default + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// One line for `variorum zoo`.
    const SUMMARY: &'static str;
    /// Authors, year, title.
    const PAPER: &'static str;
    /// What the scheme needs and gives whatever its settings (the zoo row).
    const CAPS: Capabilities;

    /// What this configured instance declares (a setting may add or take away a capability).
    fn capabilities(&self) -> Capabilities {
        Self::CAPS
    }

    /// Whether every layer of a stack reads the first layer's relative parameters (T5's one
    /// table per stack) rather than its own. Each layer still holds its copy, the same tensor:
    /// gradients from every layer meet in it, and whoever trains the model keeps the copies one
    /// (`variorum_model::DecoderLm::tie_positions`, which the trainer calls around every step).
    fn tied_across_layers(&self) -> bool {
        false
    }

    /// The same config with derived defaults written out; `context` is `model.seq_len`.
    fn expanded(&self, _context: usize) -> Self {
        self.clone()
    }

    /// Checks the settings against the head geometry and the context; errors name the key.
    fn validate(&self, _heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        Ok(())
    }

    /// What is added to the embeddings before the first block.
    fn init_input(&self, _d_model: usize, _context: usize, _device: &Device) -> Option<AbsolutePosition> {
        None
    }

    /// What is added to the input of block `layer` (0-based).
    fn init_layer(
        &self,
        _layer: usize,
        _d_model: usize,
        _context: usize,
        _device: &Device,
    ) -> Option<AbsolutePosition> {
        None
    }

    /// The scheme's part inside one attention layer.
    fn init_relative(&self, _heads: HeadShape, _context: usize, _device: &Device) -> Option<RelativePosition> {
        None
    }

    /// Factor on the content scores' 1/√d_h (schemes that add score terms of the same size).
    fn content_scale(&self) -> f64 {
        1.0
    }

    /// Longest position the scheme can encode, if it is bounded.
    fn max_len(&self, _context: usize) -> Option<usize> {
        None
    }

    /// Tiny settings the generic tests run (a 2-layer model of context 16), each with what it
    /// exercises. Default: the scheme's defaults, unnamed.
    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("", Self::default())]
    }
}

/// The head counts and size of a fused QKV projection ([`RelativeScheme::rotate_packed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedHeads {
    /// h, the query heads.
    pub n_heads: usize,
    /// h_kv, the key and value heads.
    pub n_kv_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
}

/// A relative scheme as it acts inside attention. A score-forming mechanism calls, in order,
/// [`rotate`](Self::rotate) on new queries and keys, [`scores`](Self::scores) on each block of
/// scaled scores it forms (with that block's [`ScoreLayout`]), and [`context`](Self::context) on
/// the probabilities. Every hook reads positions from the layout only, so caches, memories and
/// score blocks need nothing else.
pub trait RelativeScheme {
    /// Rotates `x: [b, heads, len, d_h]` whose rows sit at positions `start..` (RoPE).
    /// Default: the identity.
    fn rotate(&self, x: Tensor<4>, _start: usize) -> Tensor<4> {
        x
    }

    /// Whether the scheme acts through [`rotate`](Self::rotate) alone (nothing on the scores or
    /// the context) and has [`rotate_packed`](Self::rotate_packed). Default: no.
    fn rotates_packed(&self) -> bool {
        false
    }

    /// A fused projection's output `qkv: [b, L, (h + 2 h_kv) · d_h]` (queries, keys, values side
    /// by side, as a fused attention kernel reads it) with [`rotate`](Self::rotate) applied to
    /// its query and key heads, rows at positions `start..`, by a kernel that keeps it packed;
    /// `None` where no kernel applies (or the scheme has none,
    /// [`rotates_packed`](Self::rotates_packed)): the layer then splits the heads and takes the
    /// separate path. Default: `None`.
    fn rotate_packed(&self, _qkv: Tensor<3>, _heads: PackedHeads, _start: usize) -> Option<Tensor<3>> {
        None
    }

    /// Whether [`rotate`](Self::rotate) changes q and k (RoPE). Default: no.
    fn rotates(&self) -> bool {
        false
    }

    /// The scheme applied to a block of scores `[b, h, len_q, len_k]` that were formed as
    /// `scale · q kᵀ` from queries `q_scaled = scale · q: [b, h, len_q, d_h]` and keys
    /// `k: [b, h_kv, len_k, d_h]`.
    fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        k: Tensor<4>,
        layout: &ScoreLayout,
        scale: f64,
    ) -> Tensor<4>;

    /// Whether the scheme reaches scores through the query–key distance alone, or not at all,
    /// so it applies to keys gathered from anywhere ([`bias_at`](Self::bias_at)). Default: no.
    fn works_on_gathered_keys(&self) -> bool {
        false
    }

    /// The additive term of gathered keys at distances `[groups, n, len_q, len_k]`:
    /// `[n_heads, n, len_q, len_k]`, or `None` when the scheme adds nothing there.
    ///
    /// # Panics
    ///
    /// By default: a scheme without [`works_on_gathered_keys`](Self::works_on_gathered_keys),
    /// which configs refuse before a model is built.
    fn bias_at(&self, _d: &Distances, _device: &Device) -> Option<Tensor<4>> {
        panic!("this position scheme needs a score layout, not gathered distances")
    }

    /// A term added to the attention output `[b, h, len_q, d_h]` from the probabilities (Shaw's
    /// value vectors). Default: none.
    fn context(&self, _probs: Tensor<4>, _layout: &ScoreLayout) -> Option<Tensor<4>> {
        None
    }

    /// Whether the scheme has [`distance_terms`](Self::distance_terms). Default: no.
    fn has_distance_terms(&self) -> bool {
        false
    }

    /// What [`scores`](Self::scores) and [`context`](Self::context) do, said per distance for the
    /// block-sparse kernel, which applies it to whatever pairs a block scores: [`DistanceTerms`]
    /// for the call `at` describes, whose query term reads the scaled queries and key term the
    /// keys. Default: `None` (the composed path only).
    fn distance_terms(&self, _at: TermsFor, _device: &Device) -> Option<DistanceTerms> {
        None
    }

    /// Where the whole of what [`scores`](Self::scores) adds is a product of per-position
    /// vectors, s_ij += a_i · b_j (TUPE's position–position term), and nothing acts through
    /// [`context`](Self::context): `a` for the queries at `layout.q_start..` (`[n_heads, len_q,
    /// d']`, scaled by `scale`) and `b` for the keys at `layout.k_start..` (`[n_heads, len_k,
    /// d']`), which the causal kernels add to every block's scores by one more GEMM. Default:
    /// `None`.
    fn position_products(&self, _layout: &ScoreLayout, _scale: f64) -> Option<(Tensor<3>, Tensor<3>)> {
        None
    }

    /// Whether the scheme has [`position_products`](Self::position_products). Default: no.
    fn has_position_products(&self) -> bool {
        false
    }
}

/// A scheme whose whole effect is a bias on the scores read from the query–key distance alone
/// (ALiBi, T5): its [`RelativeScheme`] follows — the bias added to each block of scores, and the
/// same bias at the distances of gathered keys.
pub trait DistanceBias {
    /// The additive bias `[1, n_heads, len_q, len_k]` of a block of scores at `layout`.
    fn bias(&self, layout: &ScoreLayout, device: &Device) -> Tensor<4>;

    /// The bias of gathered keys, `[h, n, len_q, len_k]` for distances `[groups, n, len_q, len_k]`.
    fn bias_at(&self, d: &Distances, device: &Device) -> Tensor<4>;
}

impl<T: DistanceBias> RelativeScheme for T {
    fn scores(&self, scores: Tensor<4>, _q: Tensor<4>, _k: Tensor<4>, layout: &ScoreLayout, _scale: f64) -> Tensor<4> {
        let device = scores.device();
        scores + DistanceBias::bias(self, layout, &device)
    }

    fn works_on_gathered_keys(&self) -> bool {
        true
    }

    fn bias_at(&self, d: &Distances, device: &Device) -> Option<Tensor<4>> {
        Some(DistanceBias::bias_at(self, d, device))
    }
}

/// The call a scheme's [`RelativeScheme::distance_terms`] are for: `n_heads` query heads over
/// `len_k` keys (the queries the last of their positions), no scored pair further apart than
/// `reach` positions either way (a window's reach; `len_k − 1` for every key), causal or not, and
/// the score scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TermsFor {
    /// Query heads.
    pub n_heads: usize,
    /// Keys; the queries are the last of their positions.
    pub len_k: usize,
    /// The largest distance of a scored pair, either way (`len_k − 1` for every key).
    pub reach: usize,
    /// No query sees a key after its own position.
    pub causal: bool,
    /// The score scale.
    pub scale: f64,
}

/// An absolute signal: vectors added to the residual stream.
pub trait AbsoluteSignal {
    /// Position vectors for positions `start..start + len`, shape `[len, d_model]`.
    fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2>;
}
