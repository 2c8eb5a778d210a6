//! Multi-head scaled dot-product attention (Vaswani et al. 2017), the `full` kind:
//!
//! Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,   head_i = Attention(X W_i^Q, X W_i^K, X W_i^V),
//! MultiHead(X) = [head_1; …; head_h] W^O,
//!
//! where M is −∞ on hidden entries (future keys, padding). Grouped-query attention shares each
//! K/V head among `n_heads / n_kv_heads` query heads: the queries of a group are stacked along
//! the length so one batched GEMM serves the group and K/V are never copied.
//!
//! A relative position scheme (`model.position`) lives inside: it rotates new queries and keys
//! (RoPE), acts on the scaled scores with their absolute positions (bias, multiplier or extra
//! q/k terms), and may add a term to the context (Shaw's value vectors).

use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check, error::divisors};
use variorum_position::{HeadShape, PackedHeads, PositionConfig, RelativePosition, ScoreLayout};

use crate::band::{Band, banded};
use crate::head_losses::{self, Disagreement, DiversityConfig, GuidanceConfig};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps, kernel_takes};
use crate::normaliser::{Normaliser, ScoreNormaliser};
use crate::{AttentionInput, AttentionOutput, AttentionState, KvCache, QkvProjection, QkvProjectionConfig};

/// Value written into hidden score entries. Finite, so a row whose keys are all hidden (a fully
/// padded row) gives a uniform distribution instead of NaN.
pub const MASKED_SCORE: f32 = -1.0e9;

/// The [`MultiHeadAttentionConfig`] of a kind's table that repeats its head fields (`n_heads`,
/// `n_kv_heads`, `head_dim`, `dropout`, `bias`, `normaliser`): every kind spells its own table,
/// because serde's `flatten` does not combine with `deny_unknown_fields`.
#[macro_export]
macro_rules! head_fields {
    ($c:expr) => {
        $crate::MultiHeadAttentionConfig {
            n_heads: $c.n_heads,
            n_kv_heads: $c.n_kv_heads,
            head_dim: $c.head_dim,
            dropout: $c.dropout,
            bias: $c.bias,
            normaliser: $c.normaliser,
            head_temperature: $c.head_temperature,
            diversity: None,
            guidance: None,
        }
    };
}

/// `heads()` and `expanded_heads()` of a kind's config with the five head
/// fields (the derived defaults of the heads written out; kinds with more add theirs).
#[macro_export]
macro_rules! head_methods {
    () => {
        pub fn heads(&self) -> $crate::MultiHeadAttentionConfig {
            $crate::head_fields!(self)
        }

        /// The config with the heads' derived defaults written out.
        pub fn expanded_heads(&self, d_model: usize) -> Self {
            let h = $crate::AttentionKind::expanded(&self.heads(), d_model);
            Self { n_kv_heads: h.n_kv_heads, head_dim: h.head_dim, ..self.clone() }
        }
    };
}

/// Writes a kind's config struct whose table begins with `full`'s five head fields: the head
/// fields with their docs and defaults (written here once), then the kind's own fields, each
/// with its default after `=`; plus `Default`, `heads()` and `expanded_heads()`
/// ([`head_methods!`]). A kind with only some of the head fields names them after the struct's
/// name, in its table's order (`pub struct PerformerConfig [n_heads, head_dim, bias] { … }`),
/// and gets the struct and `Default`. A field-by-field struct rather than `#[serde(flatten)]`, because serde's
/// `flatten` does not combine with `deny_unknown_fields`; the keys and their order in a
/// written-out config are what a hand-written struct with these fields gives.
///
/// ```ignore
/// variorum_attention::attention_config! {
///     /// `model.attention` with `kind = "sliding-window"`.
///     pub struct SlidingWindowConfig {
///         /// w, keys each query sees back, its own included. Default 256.
///         pub window: usize = 256,
///     }
/// }
/// ```
#[macro_export]
macro_rules! attention_config {
    // The five head fields of `full`, in its order, and `heads()` / `expanded_heads()`.
    (
        $(#[$meta:meta])*
        pub struct $name:ident $own:tt
    ) => {
        $crate::attention_config! {
            @fields [$(#[$meta])*] $name [n_heads n_kv_heads head_dim dropout bias normaliser] [] [] $own
        }

        impl $name {
            $crate::head_methods!();
        }
    };
    // A subset of the head fields, in the order given (kinds without weights have no dropout,
    // kernelised ones no grouped keys); the kind writes its own head checks.
    (
        $(#[$meta:meta])*
        pub struct $name:ident [$($head:ident),+] $own:tt
    ) => {
        $crate::attention_config! { @fields [$(#[$meta])*] $name [$($head)+] [] [] $own }
    };
    // One head field at a time: its declaration and its default, written here once.
    (@fields $meta:tt $name:ident [n_heads $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Query heads. Default 4."] pub n_heads: usize,]
            [$($init)* n_heads: 4,] $own }
    };
    (@fields $meta:tt $name:ident [n_kv_heads $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)*
                #[doc = " Key/value heads: `n_heads` (default) is multi-head, 1 is multi-query, anything"]
                #[doc = " dividing `n_heads` is grouped-query attention."]
                pub n_kv_heads: Option<usize>,]
            [$($init)* n_kv_heads: None,] $own }
    };
    (@fields $meta:tt $name:ident [head_dim $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Size of each head. Default `d_model / n_heads`."] pub head_dim: Option<usize>,]
            [$($init)* head_dim: None,] $own }
    };
    (@fields $meta:tt $name:ident [dropout $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Dropout on the attention probabilities. Default 0."] pub dropout: f64,]
            [$($init)* dropout: 0.0,] $own }
    };
    (@fields $meta:tt $name:ident [bias $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Biases in the q/k/v and output projections. Default true."] pub bias: bool,]
            [$($init)* bias: true,] $own }
    };
    // `normaliser` is two fields: the row function and the per-head temperature.
    (@fields $meta:tt $name:ident [normaliser $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] $own:tt) => {
        $crate::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)*
                #[doc = " How each row of scores becomes weights: \"softmax\" (default), \"relu\", \"sigmoid\","]
                #[doc = " \"sparsemax\" or \"entmax-1.5\" ([`Normaliser`](crate::Normaliser))."]
                pub normaliser: $crate::Normaliser,
                #[doc = " A learned temperature per head dividing its scores. Default false."]
                pub head_temperature: bool,]
            [$($init)* normaliser: $crate::Normaliser::Softmax, head_temperature: false,] $own }
    };
    // Every head field written: the struct, then `Default`.
    (
        @fields [$(#[$meta:meta])*] $name:ident [] [$($decl:tt)*] [$($init:tt)*]
        { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty = $default:expr ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $($decl)*
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($init)*
                    $( $field: $default, )*
                }
            }
        }
    };
}

/// The two [`AttentionMechanism`] hooks of a kind whose module keeps `full`'s KV cache through
/// its `attention: MultiHeadAttention` field: `forward` hands the kind's inherent
/// `forward(input, Option<&mut KvCache>)` the state's cache, and `extend_cache` projects new
/// positions into it without an output. Invoked inside the kind's `impl AttentionMechanism`.
#[macro_export]
macro_rules! kv_cache_hooks {
    () => {
        fn forward(
            &self,
            input: $crate::AttentionInput,
            state: Option<&mut $crate::AttentionState>,
        ) -> $crate::AttentionOutput {
            Self::forward(self, input, state.map($crate::AttentionState::kv_mut))
        }

        fn extend_cache(
            &self,
            x: burn::prelude::Tensor<3>,
            mask: &variorum_core::AttentionMask,
            state: &mut $crate::AttentionState,
        ) {
            self.attention.project(x, None, mask, Some(state.kv_mut()));
        }
    };
}

/// The [`AttentionKind`] items every kind written with [`attention_config!`] shares: the head
/// shape and the weight dropout from its head fields, and `build` through its inherent `init`
/// (`init(d_model, init_std, out_std, position, device)`). Invoked inside the kind's
/// `impl AttentionKind`.
#[macro_export]
macro_rules! head_kind_items {
    () => {
        fn head_shape(&self, d_model: usize) -> variorum_position::HeadShape {
            self.heads().heads(d_model)
        }

        fn dropout(&self) -> f64 {
            self.dropout
        }

        fn build(&self, init: &$crate::LayerInit, device: &burn::prelude::Device) -> Self::Module {
            self.init(init.d_model, init.init_std, init.out_std, init.position, device)
        }
    };
}

/// `model.attention` with `kind = "full"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiHeadAttentionConfig {
    /// Query heads. Default 4.
    pub n_heads: usize,
    /// Key/value heads: `n_heads` (default) is multi-head, 1 is multi-query, anything dividing
    /// `n_heads` is grouped-query attention.
    pub n_kv_heads: Option<usize>,
    /// Size of each head. Default `d_model / n_heads`.
    pub head_dim: Option<usize>,
    /// Dropout on the attention probabilities. Default 0.
    pub dropout: f64,
    /// Biases in the q/k/v and output projections. Default true.
    pub bias: bool,
    /// How each row of scores becomes weights: "softmax" (default), "relu", "sigmoid",
    /// "sparsemax" or "entmax-1.5" ([`Normaliser`]).
    pub normaliser: Normaliser,
    /// A learned temperature per head dividing its scores before the normaliser. Default false.
    pub head_temperature: bool,
    /// Disagreement regularisation of the heads (`{ on = "subspace" | "positions" | "outputs",
    /// weight = 0.1 }`, [`head_losses`](crate::head_losses)). Default none.
    pub diversity: Option<DiversityConfig>,
    /// Heads pulled toward fixed patterns (`{ patterns = ["previous", "first", …], weight = 0.1 }`,
    /// [`head_losses`](crate::head_losses)). Default none.
    pub guidance: Option<GuidanceConfig>,
}

impl Default for MultiHeadAttentionConfig {
    fn default() -> Self {
        Self {
            n_heads: 4,
            n_kv_heads: None,
            head_dim: None,
            dropout: 0.0,
            bias: true,
            normaliser: Normaliser::Softmax,
            head_temperature: false,
            diversity: None,
            guidance: None,
        }
    }
}

impl MultiHeadAttentionConfig {
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    pub fn head_dim(&self, d_model: usize) -> usize {
        self.head_dim.unwrap_or(d_model / self.n_heads.max(1))
    }

    /// Query heads and head size (the shape every kind with these head fields reports).
    pub fn heads(&self, d_model: usize) -> HeadShape {
        HeadShape { d_model, n_heads: self.n_heads, head_dim: self.head_dim(d_model) }
    }

    /// `init_std` for q/k/v; `out_std` for the output projection (GPT-2 scales residual
    /// projections by 1/√(2·n_layers)); `position` supplies the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> MultiHeadAttention {
        let head_dim = self.head_dim(d_model);
        MultiHeadAttention {
            position: position.config.init_relative(self.heads(d_model), position.context, device),
            qkv: QkvProjectionConfig::new(d_model, self.n_heads, self.kv_heads(), head_dim)
                .with_bias(self.bias)
                .with_init_std(init_std)
                .init(device),
            out: LinearConfig::new(self.n_heads * head_dim, d_model)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
                .init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            normaliser: self.normaliser.init(self.n_heads, self.head_temperature, position.context, device),
            losses: HeadLosses { diversity: self.diversity.clone(), guidance: self.guidance.clone() },
            scale: position.config.content_scale() / (head_dim as f64).sqrt(),
        }
    }
}

impl AttentionKind for MultiHeadAttentionConfig {
    type Module = MultiHeadAttention;
    const SUMMARY: &'static str = "multi-head scaled dot-product attention; grouped-/multi-query K/V heads; KV cache";
    const PAPER: &'static str =
        "Vaswani et al. 2017, Attention Is All You Need; Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA)";
    // the graph mask acts through the dense score mask
    const CAPS: Capabilities = Capabilities { graph: true, ..caps::CROSS_SCORES };

    /// The same config with the derived defaults written out.
    fn expanded(&self, d_model: usize) -> Self {
        Self { n_kv_heads: Some(self.kv_heads()), head_dim: Some(self.head_dim(d_model)), ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        check(self.n_heads > 0, || "model.attention.n_heads must be at least 1".into())?;
        if self.head_dim.is_none() {
            check(d_model % self.n_heads == 0, || {
                format!(
                    "model.attention.n_heads = {} does not divide model.d_model = {d_model}: use one of {:?} or set model.attention.head_dim",
                    self.n_heads,
                    divisors(d_model)
                )
            })?;
        }
        check(self.head_dim != Some(0), || "model.attention.head_dim must be at least 1".into())?;
        let kv = self.kv_heads();
        check(kv > 0 && self.n_heads % kv == 0, || {
            format!(
                "model.attention.n_kv_heads = {kv} does not divide model.attention.n_heads = {}: use one of {:?}",
                self.n_heads,
                divisors(self.n_heads)
            )
        })?;
        crate::kind::check_dropout(self.dropout)?;
        head_losses::validate(self.diversity.as_ref(), self.guidance.as_ref(), self.n_heads)
    }

    fn capabilities(&self) -> Capabilities {
        // the head losses are defined on self-attention maps
        let losses = self.diversity.is_some() || self.guidance.is_some();
        Capabilities { aux_losses: losses, cross: Self::CAPS.cross && !losses, ..Self::CAPS }
    }

    fn head_shape(&self, d_model: usize) -> HeadShape {
        self.heads(d_model)
    }

    fn dropout(&self) -> f64 {
        self.dropout
    }

    /// Multiply–adds per token of the score-forming part, for a context of `len_k` keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let hd = (self.n_heads * self.head_dim(d_model)) as u64;
        let kvd = (self.kv_heads() * self.head_dim(d_model)) as u64;
        let d = d_model as u64;
        // projections + QKᵀ + AV, 2 FLOPs per multiply–add
        2 * (d * (hd + 2 * kvd) + hd * d) + 2 * 2 * hd * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> MultiHeadAttention {
        self.init(init.d_model, init.init_std, init.out_std, init.position, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let heads = |n_heads, n_kv_heads| Self { n_heads, n_kv_heads, ..Default::default() };
        vec![
            TestVariant::new("grouped-query", heads(4, Some(2))),
            TestVariant::new("multi-query", heads(4, Some(1))),
            TestVariant::new(
                "head_dim 24, no bias",
                Self { n_heads: 2, head_dim: Some(24), bias: false, ..Default::default() },
            ),
            // every normaliser through the fused kernel (training) and the composed path (decoding)
            TestVariant::new("relu", Self { normaliser: Normaliser::Relu, ..Default::default() }),
            TestVariant::new("sigmoid", Self { normaliser: Normaliser::Sigmoid, ..Default::default() }),
            TestVariant::new("sparsemax", Self { normaliser: Normaliser::Sparsemax, ..Default::default() }),
            TestVariant::new(
                "entmax-1.5, grouped-query",
                Self { normaliser: Normaliser::Entmax15, ..heads(4, Some(2)) },
            ),
            TestVariant::new("head temperature", Self { head_temperature: true, ..Default::default() }).masked(),
            TestVariant::new(
                "sparsemax + head temperature + position alibi",
                Self { normaliser: Normaliser::Sparsemax, head_temperature: true, ..Default::default() },
            )
            .with_position(PositionConfig::Alibi(Default::default())),
            // auxiliary losses on the heads (Li et al. 2018; Deshpande & Narasimhan 2020)
            TestVariant::new(
                "diversity on outputs",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Outputs, weight: 0.1 }),
                    ..Default::default()
                },
            ),
            TestVariant::new(
                "diversity on positions, grouped-query",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Positions, weight: 0.1 }),
                    ..heads(4, Some(2))
                },
            ),
            TestVariant::new(
                "diversity on subspace",
                Self {
                    diversity: Some(DiversityConfig { on: Disagreement::Subspace, weight: 0.1 }),
                    ..Default::default()
                },
            ),
            TestVariant::new(
                "guidance previous, first",
                Self {
                    guidance: Some(GuidanceConfig {
                        patterns: vec![head_losses::Pattern::Previous, head_losses::Pattern::First],
                        weight: 0.1,
                    }),
                    ..Default::default()
                },
            ),
        ]
        .into_iter()
        .chain(
            // relative schemes with grouped-query heads (keys shared by several query heads)
            [
                PositionConfig::TransformerXl(Default::default()),
                PositionConfig::Deberta(variorum_position::DebertaConfig { max_distance: 4 }),
                PositionConfig::Rope(Default::default()),
            ]
            .map(|p| {
                TestVariant::new(format!("grouped-query + position {}", p.kind()), heads(4, Some(2))).with_position(p)
            }),
        )
        .collect()
    }
}

/// The position scheme a mechanism is built with, and the model's context length (the size of
/// learned position tables).
#[derive(Debug, Clone, Copy)]
pub struct Positioning<'a> {
    pub config: &'a PositionConfig,
    pub context: usize,
}

impl Positioning<'_> {
    /// No relative scheme (absolute positions, or none).
    pub const NONE: Positioning<'static> =
        Positioning { config: &PositionConfig::None(variorum_position::NoPositionConfig {}), context: 0 };
}

#[derive(Module, Debug)]
pub struct MultiHeadAttention {
    pub qkv: QkvProjection,
    pub position: Option<RelativePosition>,
    pub out: Linear,
    pub dropout: Dropout,
    /// Scores to weights (softmax unless the config says otherwise).
    pub normaliser: ScoreNormaliser,
    /// Auxiliary losses on the heads (`full` only; none by default).
    #[module(skip)]
    pub losses: HeadLosses,
    pub scale: f64,
}

/// The auxiliary losses a `full` layer adds ([`head_losses`](crate::head_losses)).
#[derive(Debug, Clone, Default)]
pub struct HeadLosses {
    pub diversity: Option<DiversityConfig>,
    pub guidance: Option<GuidanceConfig>,
}

/// Queries (scaled), keys and values of one forward, and where their scores sit.
pub struct Projected {
    /// `scale · q`, `[b, n_heads, len_q, head_dim]` ([`Projected::q`]).
    q: Queries,
    /// `[b, n_kv_heads, len_k, head_dim]`, the cache included.
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    pub layout: ScoreLayout,
    /// No key more than this many positions before its query (`AttentionMask::max_back`).
    pub max_back: Option<usize>,
    /// The fused projection's output `[b, L, (h + 2 h_kv) · d_h]` when q (before its scale), k
    /// and v are exactly its views — self-attention without a cache, a rotation or appended
    /// position vectors, where a kernel may take the call (flex, no dropout) — so a kernel can
    /// read them in place and hand back one gradient. Private: a `Projected` whose q, k or v
    /// were changed is built anew ([`Projected::new`]) and has none.
    packed: Option<Tensor<3>>,
}

/// The scaled queries, or the queries and their scale where q is a view of the packed
/// projection: a kernel reading that scales q itself, and the product would be a strided,
/// single-threaded pass over the view (19 ms of a 160 ms sliding-window step at 16k), so it is
/// formed on first use.
enum Queries {
    Scaled(Tensor<4>),
    OnUse { unscaled: Tensor<4>, scale: f64, scaled: std::cell::OnceCell<Tensor<4>> },
}

impl Projected {
    /// Projections formed elsewhere (no packed projection behind them); `q` already scaled.
    pub fn new(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, layout: ScoreLayout, max_back: Option<usize>) -> Self {
        Self { q: Queries::Scaled(q), k, v, layout, max_back, packed: None }
    }

    /// The scaled queries `scale · q`, `[b, n_heads, len_q, head_dim]`.
    pub fn q(&self) -> Tensor<4> {
        match &self.q {
            Queries::Scaled(q) => q.clone(),
            Queries::OnUse { unscaled, scale, scaled } => {
                scaled.get_or_init(|| unscaled.clone().mul_scalar(*scale)).clone()
            }
        }
    }

    /// The queries' shape `[b, n_heads, len_q, head_dim]`, without forming them.
    pub fn q_dims(&self) -> [usize; 4] {
        match &self.q {
            Queries::Scaled(q) | Queries::OnUse { unscaled: q, .. } => q.dims(),
        }
    }

    /// The device the projections live on.
    pub fn device(&self) -> Device {
        self.k.device()
    }

    /// The fused projection q, k and v are views of, where a kernel may read it (see the
    /// field).
    pub fn packed(&self) -> Option<&Tensor<3>> {
        self.packed.as_ref()
    }

    /// The same projections for rows `rows` of the batch (no packed projection).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        let pick = |x: &Tensor<4>| x.clone().narrow(0, rows.start, rows.len());
        Self::new(pick(&self.q()), pick(&self.k), pick(&self.v), self.layout, self.max_back)
    }
}

impl MultiHeadAttention {
    /// The three steps of [`forward`](Self::forward), for mechanisms that change what happens
    /// between them (adaptive span). Step 1: project, rotate (RoPE), append to the cache. Keys
    /// sit from `mask.k_start` (plus whatever the cache has dropped from its front).
    pub fn project(
        &self,
        query: Tensor<3>,
        key_value: Option<Tensor<3>>,
        mask: &AttentionMask,
        cache: Option<&mut KvCache>,
    ) -> Projected {
        let [_, lq, _] = query.dims();
        // rotated q and k are no views of the product, and a product term (TUPE) off the packed
        // kernel goes to the separate one: packing would only cost its views' backward
        let changed = self.position.as_ref().is_some_and(|p| p.rotates() || p.has_position_products());
        let (packed, (q, k, v)) = match key_value {
            // the fused kernels read q, k, v in place from one product; other paths take one
            // product per part, whose backward is cheaper than views' (`self_attention`)
            None if cache.is_none() && !changed && kernel_takes(&self.dropout, &query) => {
                let (all, qkv) = self.qkv.self_attention_packed(query);
                (Some(all), qkv)
            }
            // q comes scaled: the scale on the smaller of its weight slice and its product
            // (`QkvProjection::scaled_queries`)
            source => {
                let (k, v) = self.qkv.keys_values(source.unwrap_or_else(|| query.clone()));
                (None, (self.qkv.scaled_queries(query, self.scale), k, v))
            }
        };
        let (cached, dropped) = cache.as_ref().map_or((0, 0), |c| (c.len(), c.start));
        let k_start = mask.k_start + dropped;
        let (q, k) = match &self.position {
            // new keys follow the cached ones
            Some(p) => (p.rotate(q, mask.q_start), p.rotate(k, k_start + cached)),
            None => (q, k),
        };
        let (k, v) = match cache {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        let layout = ScoreLayout::new(mask.q_start, k_start, lq, k.dims()[2], mask.causal);
        let q = if packed.is_some() {
            // q is a view of the packed projection, which a kernel scales as it reads
            Queries::OnUse { unscaled: q, scale: self.scale, scaled: Default::default() }
        } else {
            Queries::Scaled(q)
        };
        Projected { q, k, v, layout, max_back: mask.max_back, packed }
    }

    /// Step 2: scaled scores `[b, n_heads, len_q, len_k]` with the position scheme applied, not
    /// masked.
    pub fn scores(&self, p: &Projected) -> Tensor<4> {
        let [b, h, lq, dh] = p.q_dims();
        let hkv = p.k.dims()[1];
        let (g, lk) = (h / hkv, p.layout.len_k);
        // queries of a group stacked along the length: [b, hkv, g·lq, dh] @ [b, hkv, dh, lk]
        let q = if g == 1 { p.q() } else { p.q().reshape([b, hkv, g * lq, dh]) };
        let scores = q.matmul(p.k.clone().swap_dims(2, 3)).reshape([b, h, lq, lk]);
        match &self.position {
            Some(pos) => pos.scores(scores, p.q(), p.k.clone(), &p.layout, self.scale),
            None => scores,
        }
    }

    /// Step 2b: `scores` with the mask applied (`dense`, the model's precomputed mask, where it
    /// covers these keys; built from `mask` otherwise), ready for the softmax.
    pub fn mask_scores(
        &self,
        scores: Tensor<4>,
        mask: &AttentionMask,
        dense: Option<Tensor<4, Bool>>,
        p: &Projected,
    ) -> Tensor<4> {
        let (lq, lk) = (p.layout.len_q, p.layout.len_k);
        let hidden = match (dense, p.layout.k_start == mask.k_start) {
            (Some(m), true) => Some(m),
            _ => AttentionMask { k_start: p.layout.k_start, ..mask.clone() }.score_mask(lq, lk, &scores.device()),
        };
        match hidden {
            Some(m) => scores.mask_fill(m, MASKED_SCORE),
            None => scores,
        }
    }

    /// Step 2c: weights from masked scores `[b, n_heads, len_q, len_k]` (heads on axis 1, keys
    /// on axis 3), by the configured normaliser.
    pub fn normalise(&self, scores: Tensor<4>) -> Tensor<4> {
        self.normaliser.forward(scores)
    }

    /// The composed forward with `bias(&projected)` added to the scaled scores before the mask
    /// and the normaliser (a prior on the scores: the Gaussian prior, the task prior). `bias`
    /// broadcasts against `[b, n_heads, len_q, len_k]`.
    pub fn forward_with_score_bias(
        &self,
        input: AttentionInput,
        cache: Option<&mut KvCache>,
        bias: impl FnOnce(&Projected) -> Tensor<4>,
    ) -> AttentionOutput {
        let p = self.project(input.query, input.key_value, input.mask, cache);
        let scores = self.scores(&p) + bias(&p);
        let probs = self.normalise(self.mask_scores(scores, input.mask, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        let context = self.combine(self.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }

    /// Step 3: the output `[b, len_q, d_model]` from probabilities `[b, n_heads, len_q, len_k]`.
    pub fn combine(&self, probs: Tensor<4>, p: &Projected) -> Tensor<3> {
        variorum_kernels::linear::forward(&self.out, self.combine_heads(probs, p))
    }

    /// Step 3 without the output projection: the heads' contexts side by side,
    /// `[b, len_q, n_heads · d_h]`.
    pub fn combine_heads(&self, probs: Tensor<4>, p: &Projected) -> Tensor<3> {
        let [b, h, lq, lk] = probs.dims();
        let [_, hkv, _, dh] = p.v.dims();
        let g = h / hkv;
        let extra = self.position.as_ref().and_then(|pos| pos.context(probs.clone(), &p.layout));
        let probs = if g == 1 { probs } else { probs.reshape([b, hkv, g * lq, lk]) };
        let context = probs.matmul(p.v.clone()).reshape([b, h, lq, dh]);
        let context = match extra {
            Some(e) => context + e,
            None => context,
        };
        concat_heads(context)
    }

    /// The output projection of per-head contexts `[b, n_heads, len_q, d_h]`.
    pub fn merge(&self, context: Tensor<4>) -> Tensor<3> {
        variorum_kernels::linear::forward(&self.out, concat_heads(context))
    }

    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let HeadLosses { diversity, guidance } = &self.losses;
        if diversity.is_none() && guidance.is_none() {
            let (heads, weights) = self.attend_heads(input, cache);
            let context = variorum_kernels::linear::forward(&self.out, heads);
            return AttentionOutput { context, weights, aux_losses: Vec::new() };
        }
        self.forward_with_losses(input, cache)
    }

    /// [`forward`](Self::forward) with the heads' auxiliary losses: the weights are formed where a
    /// loss reads them (the composed path), the values projected once more for the subspace one.
    fn forward_with_losses(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let HeadLosses { diversity, guidance } = &self.losses;
        let asked = input.need_weights;
        let reads_weights = guidance.is_some() || diversity.as_ref().is_some_and(|d| d.on == Disagreement::Positions);
        let values = diversity.as_ref().filter(|d| d.on == Disagreement::Subspace).map(|_| {
            let (_, _, v) = match &input.key_value {
                Some(src) => self.qkv.cross_attention(input.query.clone(), src.clone()),
                None => self.qkv.self_attention(input.query.clone()),
            };
            v
        });
        let mask = input.mask;
        let k_start = mask.k_start + cache.as_ref().map_or(0, |c| c.start);
        let (q_start, causal) = (mask.q_start, mask.causal);
        let input = AttentionInput { need_weights: asked || reads_weights, ..input };
        let (heads, weights) = self.attend_heads(input, cache);
        let mut aux_losses = Vec::new();
        if let Some(d) = diversity {
            let loss = match d.on {
                Disagreement::Subspace => head_losses::cosine_agreement(values.expect("projected above"), d.weight),
                Disagreement::Outputs => {
                    let [b, l, _] = heads.dims();
                    let (h, dh) = (self.qkv.n_heads, self.qkv.head_dim);
                    head_losses::cosine_agreement(heads.clone().reshape([b, l, h, dh]).swap_dims(1, 2), d.weight)
                }
                Disagreement::Positions => {
                    head_losses::position_agreement(weights.clone().expect("weights asked for"), d.weight)
                }
            };
            aux_losses.push(("head_disagreement".to_string(), loss));
        }
        if let Some(g) = guidance {
            let w = weights.clone().expect("weights asked for");
            let [_, _, lq, lk] = w.dims();
            let layout = ScoreLayout::new(q_start, k_start, lq, lk, causal);
            aux_losses.push(("head_guidance".to_string(), head_losses::pattern_loss(w, &layout, g)));
        }
        let context = variorum_kernels::linear::forward(&self.out, heads);
        AttentionOutput { context, weights: weights.filter(|_| asked), aux_losses }
    }

    /// [`forward`](Self::forward) up to the output projection: the heads' contexts side by side,
    /// `[b, len_q, n_heads · d_h]`, and the weights where asked for. Kinds that combine heads
    /// otherwise (capsule routing) start here, on the same fast paths.
    pub fn attend_heads(
        &self,
        input: AttentionInput,
        mut cache: Option<&mut KvCache>,
    ) -> (Tensor<3>, Option<Tensor<4>>) {
        if cache.is_none()
            && let Some(context) = self.fused_self_attention(&input)
        {
            return (context, None);
        }
        let p = self.project(input.query, input.key_value, input.mask, cache.as_deref_mut());
        if let Some(n) = p.max_back {
            // at most n back: the keys before that never matter again
            if let Some(c) = cache {
                c.drop_front(c.len().saturating_sub(n));
            }
            let m = input.mask;
            let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
            if aligned && m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && !input.need_weights {
                // a band, computed by blocks: no L × L matrix
                let l = p.layout.len_q;
                let ahead = if m.causal { 0 } else { l };
                let band = Band { back: n, ahead, block: n.clamp(1, 128), query_blocks: false, causal: m.causal };
                return (concat_heads(banded(self, &p, &[band], &[])), None);
            }
        }
        if let Some(context) = self.fused(&p, input.mask, input.need_weights) {
            return (context, None);
        }
        if self.on_the_sparse_kernel(&p, input.mask, input.need_weights) {
            // what the causal kernel does not take — every key both ways, a distance-only bias
            // (ALiBi, T5), terms per distance (Transformer-XL, Shaw, …) — the block-sparse
            // kernel takes, over a band that reaches every key
            let (l, m) = (p.layout.len_q, input.mask);
            let ahead = if m.causal { 0 } else { l };
            let band = Band { back: l, ahead, block: l.clamp(1, 128), query_blocks: false, causal: m.causal };
            return (concat_heads(banded(self, &p, &[band], &[])), None);
        }
        let scores = self.mask_scores(self.scores(&p), input.mask, input.dense_mask, &p);
        let probs = self.normalise(scores);
        let weights = input.need_weights.then(|| probs.clone());
        (self.combine_heads(self.dropout.forward(probs), &p), weights)
    }
}

/// A source's projected keys and values, `[b, n_kv_heads, len_source, head_dim]` each, kept in
/// the cross-attention's state while a decoder generates over it.
#[derive(Debug, Clone, Default)]
pub struct SourceKv(Option<(Tensor<4>, Tensor<4>)>);

/// Key heads `[b, h_kv, …]` repeated for the query heads of their group: `[b, h, …]` (query
/// head i reads key head i / (h / h_kv), as in full attention).
pub fn per_query_head<const D: usize>(x: Tensor<D>, h: usize) -> Tensor<D> {
    let dims = x.dims();
    let hkv = dims[1];
    if hkv == h {
        return x;
    }
    // any rank: the axes after the heads flattened, each key head's block repeated
    let rest: usize = dims[2..].iter().product();
    let mut out = dims;
    out[1] = h;
    x.reshape([dims[0], hkv, 1, rest]).expand([dims[0], hkv, h / hkv, rest]).reshape(out)
}

/// Per-head contexts `[b, n_heads, len_q, d_h]` side by side, `[b, len_q, n_heads · d_h]`.
pub fn concat_heads(context: Tensor<4>) -> Tensor<3> {
    let [b, h, lq, dh] = context.dims();
    context.swap_dims(1, 2).reshape([b, lq, h * dh])
}

impl MultiHeadAttention {
    /// The heads' merged context by the fused causal kernel ([`variorum_kernels::causal_attention`]), where it
    /// computes exactly what the composed path would: a causal mask and nothing else (no padding,
    /// custom pattern or reach limit), no position term on the scores or the context but a
    /// product of per-position vectors (TUPE, which the kernel adds; RoPE acts before), no dropout
    /// on the probabilities and no weights asked for; `None` otherwise, or on a backend without
    /// the kernel.
    fn fused(&self, p: &Projected, m: &AttentionMask, need_weights: bool) -> Option<Tensor<3>> {
        // a scheme that acts by rotating q and k alone has done so in the projection; one that
        // adds a product of per-position vectors (TUPE) hands them to the kernel below
        let products = self.position.as_ref().is_some_and(|pos| pos.has_position_products() && !pos.rotates());
        let plain_position = self.position.as_ref().is_none_or(RelativePosition::rotates_packed) || products;
        let offset = p.layout.q_start.checked_sub(p.layout.k_start)?;
        // one query (cached decoding): the kernel's GEMM would pack every key for a single row,
        // slower than the composed matrix–vector products (2,350 vs 2,830 tokens/s at context 1024)
        let one_query = p.layout.len_q == 1;
        if !self.kernel_computes(m, need_weights, &p.device()) || !plain_position || one_query {
            return None;
        }
        let norm = self.normaliser.row;
        // a head's temperature scales its scores, so its queries (and a product term's query
        // side): s/τ = (q/τ)·k + (a/τ)·b
        let factor = self.normaliser.query_factor();
        let q = match &factor {
            Some(f) => p.q() * f.clone(),
            None => p.q(),
        };
        let (k, v) = (p.k.clone(), p.v.clone());
        if !products {
            return variorum_kernels::causal_attention::causal_attention(q, k, v, offset, norm);
        }
        // a scheme that says it has products and gives none keeps the composed path
        let (a, b) = self.position.as_ref()?.position_products(&p.layout, self.scale)?;
        let a = match factor {
            Some(f) => a * f.squeeze_dim::<3>(0),
            None => a,
        };
        variorum_kernels::causal_attention::causal_attention_with_products((q, k, v), (a, b), offset, norm)
    }

    /// Whether the call is plain attention over a fresh sequence (causal or both ways; no
    /// padding, custom or graph mask, weights or dropout) that [`Self::fused`] did not take, and
    /// whose position scheme is none, a rotation (done in the projection), a score by distance
    /// alone, or terms per distance: the block-sparse kernel computes it over a band that
    /// reaches every key, with its distance-bias table or `DistanceTerms`, where the kernels are
    /// on. Bidirectional full attention (an encoder, a masked LM) is this call.
    fn on_the_sparse_kernel(&self, p: &Projected, m: &AttentionMask, need_weights: bool) -> bool {
        let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
        let drops = crate::kind::drops(&self.dropout, &p.device());
        let plain = m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && !need_weights && !drops;
        // terms per distance scale with a head temperature: that keeps the composed path
        let scheme_ok = self.position.as_ref().is_none_or(|pos| {
            pos.works_on_gathered_keys() || (pos.has_distance_terms() && self.normaliser.query_factor().is_none())
        });
        aligned && plain && scheme_ok && variorum_kernels::has_kernel(&p.k)
    }

    /// What both kernel paths share: a causal mask and nothing else, no dropout on the
    /// probabilities (on `device`), no weights asked for.
    fn kernel_computes(&self, m: &AttentionMask, need_weights: bool, device: &Device) -> bool {
        let plain_mask =
            m.causal && m.padding.is_none() && m.custom.is_none() && m.graph.is_none() && m.max_back.is_none();
        plain_mask && !need_weights && !crate::kind::drops(&self.dropout, device)
    }

    /// Self-attention without a cache, by the fused kernel straight from the QKV projection's
    /// output ([`variorum_kernels::causal_attention::causal_self_attention`]: no head split,
    /// scaling or merge recorded): the training path of a GPT, and of a LLaMA-style model, whose
    /// RoPE rotates the packed projection by a kernel too
    /// ([`RelativePosition::rotate_packed`]). The heads' contexts side by side, before the output
    /// projection; `None` where it does not apply (the conditions of [`Self::fused`], no keys from
    /// elsewhere, no position scheme but one that rotates packed or adds a product of
    /// per-position vectors, TUPE, which the kernel adds itself at any offset and with
    /// grouped-query heads).
    fn fused_self_attention(&self, input: &AttentionInput) -> Option<Tensor<3>> {
        let m = input.mask;
        let offset = m.q_start.checked_sub(m.k_start)?;
        let learned_temperature = self.normaliser.log_temperature.is_some();
        let device = input.query.device();
        if !self.kernel_computes(m, input.need_weights, &device) || input.key_value.is_some() || learned_temperature {
            return None;
        }
        if !variorum_kernels::has_kernel(&input.query) {
            return None;
        }
        // a rotation needs one position per row: queries and keys of the same positions; a
        // product of per-position vectors (TUPE) the kernel adds to every score itself
        let products = self.position.as_ref().is_some_and(|p| p.has_position_products() && !p.rotates());
        if let Some(p) = &self.position
            && !products
            && (!p.rotates_packed() || offset != 0)
        {
            return None;
        }
        let qkv = &self.qkv;
        let (h, h_kv, norm) = (qkv.n_heads, qkv.n_kv_heads, self.normaliser.row);
        let position_products = match &self.position {
            Some(p) if products => {
                let len = input.query.dims()[1];
                let layout = ScoreLayout::new(m.q_start, m.k_start, len, len, m.causal);
                // a scheme that says it has products and gives none keeps the composed path
                Some(p.position_products(&layout, self.scale)?)
            }
            _ => None,
        };
        let all = variorum_kernels::linear::forward(&qkv.qkv, input.query.clone());
        if let Some((a, b)) = position_products {
            let scale = self.scale;
            return variorum_kernels::causal_attention::causal_self_attention_with_products(
                all, a, b, h, h_kv, scale, offset, norm,
            );
        }
        let all = match &self.position {
            Some(p) => {
                let heads = PackedHeads { n_heads: h, n_kv_heads: h_kv, head_dim: qkv.head_dim };
                p.rotate_packed(all, heads, m.q_start)?
            }
            None => all,
        };
        variorum_kernels::causal_attention::causal_self_attention(all, h, h_kv, self.scale, offset, norm)
    }

    /// softmax(q kᵀ/√d) v with the output projection, queries from `query`, keys and values from
    /// `key_value`, no mask and no position scheme: content-based attention, as the Compressive
    /// Transformer's attention-reconstruction loss compares it over memories.
    pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.out.forward(self.content_only_heads(query, key_value))
    }

    /// [`content_only`](Self::content_only) before the output projection: the heads' contexts
    /// side by side, `[b, len_q, n_heads · d_h]`.
    pub fn content_only_heads(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        let [b, lq, _] = query.dims();
        let (h, hkv, dh) = (self.qkv.n_heads, self.qkv.n_kv_heads, self.qkv.head_dim);
        let (k, v) = self.qkv.keys_values(key_value);
        let q = self.qkv.scaled_queries(query, 1.0 / (dh as f64).sqrt());
        let (g, lk) = (h / hkv, k.dims()[2]);
        let q = q.reshape([b, hkv, g * lq, dh]);
        let probs = self.normalise(q.matmul(k.swap_dims(2, 3)).reshape([b, h, lq, lk]));
        concat_heads(probs.reshape([b, hkv, g * lq, lk]).matmul(v).reshape([b, h, lq, dh]))
    }
}

impl AttentionMechanism for MultiHeadAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        MultiHeadAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.project(x, None, mask, Some(state.kv_mut()));
    }

    /// The source's keys and values projected on the first call and kept ([`SourceKv`]): each
    /// later call projects its queries only.
    fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput {
        let kept = state.get_or_default::<SourceKv>();
        let (k, v) = match &kept.0 {
            Some(kv) => kv.clone(),
            None => {
                let source = input.key_value.expect("cross-attention reads a source");
                kept.0.get_or_insert(self.qkv.keys_values(source)).clone()
            }
        };
        let q = self.qkv.scaled_queries(input.query, self.scale);
        let m = input.mask;
        let layout = ScoreLayout::new(m.q_start, m.k_start, q.dims()[2], k.dims()[2], m.causal);
        let p = Projected::new(q, k, v, layout, m.max_back);
        let probs = self.normalise(self.mask_scores(self.scores(&p), m, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        AttentionOutput { context: self.combine(self.dropout.forward(probs), &p), weights, aux_losses: Vec::new() }
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        MultiHeadAttention::content_only(self, query, key_value)
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    fn attention(n_heads: usize, n_kv_heads: usize, device: &Device) -> MultiHeadAttention {
        let cfg = MultiHeadAttentionConfig { n_heads, n_kv_heads: Some(n_kv_heads), ..Default::default() };
        cfg.validate(16).unwrap();
        cfg.init(16, 0.2, 0.2, Positioning::NONE, device)
    }

    fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    #[test]
    fn cross_attention_takes_keys_of_another_length() {
        let dev = Device::flex();
        let attn = attention(4, 2, &dev);
        let mask = AttentionMask::bidirectional();
        let out = attn.forward(
            AttentionInput::cross_attention(random([2, 3, 16], &dev), random([2, 7, 16], &dev), &mask).with_weights(),
            None,
        );
        assert_eq!(out.context.dims(), [2, 3, 16]);
        let w = out.weights.unwrap();
        assert_eq!(w.dims(), [2, 4, 3, 7]);
        let row_sums = w.sum_dim(3).sub_scalar(1.0).abs().max().into_scalar::<f32>();
        assert!(row_sums < 1e-5, "attention rows must sum to 1");
    }

    #[test]
    fn padded_keys_are_invisible() {
        let dev = Device::flex();
        let attn = attention(4, 4, &dev);
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![false, false, false, true, true], [1, 5]), &dev);
        let mask = AttentionMask::bidirectional().with_padding(pad);
        let q = random([1, 2, 16], &dev);
        let kv = random([1, 5, 16], &dev);
        let changed = kv.clone().slice_assign([0..1, 3..5, 0..16], random([1, 2, 16], &dev));
        let a = attn.forward(AttentionInput::cross_attention(q.clone(), kv.clone(), &mask), None).context;
        let b = attn.forward(AttentionInput::cross_attention(q.clone(), changed.clone(), &mask), None).context;
        assert!((a - b).abs().max().into_scalar::<f32>() < 1e-6);
        let open = AttentionMask::bidirectional();
        let c = attn.forward(AttentionInput::cross_attention(q.clone(), kv, &open), None).context;
        let d = attn.forward(AttentionInput::cross_attention(q, changed, &open), None).context;
        assert!((c - d).abs().max().into_scalar::<f32>() > 1e-4, "without the mask the change must show");
    }

    #[test]
    fn grouped_query_heads_share_keys_and_values() {
        // multi-query: four query heads served by one K/V head, through one fused projection
        // of (4 + 2·1)·head_dim columns
        let dev = Device::flex();
        let attn = attention(4, 1, &dev);
        let mask = AttentionMask::causal();
        let out = attn.forward(AttentionInput::self_attention(random([1, 5, 16], &dev), &mask).with_weights(), None);
        assert_eq!(out.weights.unwrap().dims(), [1, 4, 5, 5]);
        assert_eq!(attn.qkv.qkv.weight.val().dims(), [16, (4 + 2) * 4]);
    }

    /// The losses leave the output alone, and minimising them does what they say: the guided head
    /// moves its weight onto the previous token, the disagreeing heads' outputs turn apart.
    #[test]
    fn head_losses_guide_and_spread_the_heads_they_name() {
        use burn::optim::{AdamWConfig, GradientsParams};
        let dev = Device::flex().autodiff();
        dev.seed(8);
        let x = random([2, 8, 16], &dev);
        let mask = AttentionMask::causal();
        let plain = attention(4, 4, &dev);
        let guided = MultiHeadAttention {
            losses: HeadLosses {
                guidance: Some(GuidanceConfig { patterns: vec![head_losses::Pattern::Previous], weight: 1.0 }),
                diversity: Some(DiversityConfig { on: Disagreement::Outputs, weight: 1.0 }),
            },
            ..plain.clone()
        };
        let same = guided.forward(AttentionInput::self_attention(x.clone(), &mask), None);
        let base = plain.forward(AttentionInput::self_attention(x.clone(), &mask), None);
        assert!((same.context.clone() - base.context).abs().max().into_scalar::<f32>() < 1e-6);
        assert!(same.weights.is_none(), "weights formed for the loss are not handed out unasked");
        let losses = |m: &MultiHeadAttention| -> Vec<f32> {
            let out = m.forward(AttentionInput::self_attention(x.clone(), &mask), None);
            out.aux_losses.iter().map(|(_, l)| l.clone().into_scalar::<f32>()).collect()
        };
        let before = losses(&guided);
        let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
        let mut layer = guided;
        for _ in 0..80 {
            let out = layer.forward(AttentionInput::self_attention(x.clone(), &mask), None);
            let loss = out.aux_losses.into_iter().map(|(_, l)| l).reduce(|a, b| a + b).unwrap();
            let grads = GradientsParams::from_grads(loss.backward(), &layer);
            layer = optim.step(1e-2, layer, grads);
        }
        let after = losses(&layer);
        // [disagreement, guidance]
        assert!(after[0] < before[0] - 0.05, "outputs did not turn apart: {before:?} → {after:?}");
        assert!(after[1] < 0.1 * before[1], "the guided head did not move: {before:?} → {after:?}");
        let w = layer.forward(AttentionInput::self_attention(x, &mask).with_weights(), None).weights.unwrap();
        let head0 = w.narrow(1, 0, 1).reshape([2, 8, 8]).into_data().try_to_vec::<f32>().unwrap();
        for b in 0..2 {
            for i in 1..8 {
                let p = head0[(b * 8 + i) * 8 + i - 1];
                assert!(p > 0.8, "head 0, query {i}: {p} on the previous token");
            }
        }
    }

    /// Every normaliser, with and without a learned temperature, computes the same outputs and
    /// gradients on the fast path (the fused kernel, taken when no weights are asked for) as on
    /// the composed path (asking for the weights forces it).
    #[test]
    fn every_normaliser_takes_the_fast_path_to_the_same_result() {
        let dev = Device::flex().autodiff();
        dev.seed(21);
        let x = random([2, 9, 16], &dev);
        for normaliser in
            [Normaliser::Softmax, Normaliser::Relu, Normaliser::Sigmoid, Normaliser::Sparsemax, Normaliser::Entmax15]
        {
            for head_temperature in [false, true] {
                let cfg = MultiHeadAttentionConfig { normaliser, head_temperature, ..Default::default() };
                let mut attn = cfg.init(16, 0.4, 0.4, Positioning { context: 16, ..Positioning::NONE }, &dev);
                if head_temperature {
                    let t = Tensor::<1>::from_floats([0.7f32, 1.3, 1.0, 0.4], &dev).log();
                    attn.normaliser.log_temperature = Some(Param::from_tensor(t));
                }
                // causal: the fused causal kernel; both ways: the block-sparse kernel over every key
                for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                    let run = |weights: bool| {
                        let x = x.clone().require_grad();
                        let input = AttentionInput {
                            need_weights: weights,
                            ..AttentionInput::self_attention(x.clone(), &mask)
                        };
                        let out = attn.forward(input, None);
                        assert_eq!(out.weights.is_some(), weights);
                        let grads = out.context.clone().powf_scalar(2.0).sum().backward();
                        (out.context.inner(), x.grad(&grads).unwrap())
                    };
                    let ((fast, g_fast), (composed, g_composed)) = (run(false), run(true));
                    let what =
                        format!("{} (temperature {head_temperature}, causal {})", normaliser.name(), mask.causal);
                    let d = (fast - composed).abs().max().into_scalar::<f32>();
                    assert!(d < 1e-5, "{what}: outputs differ by {d}");
                    // relative to the gradient's size: sums of dozens of terms of either sign
                    let size = g_composed.clone().abs().max().into_scalar::<f32>().max(1.0);
                    let d = (g_fast - g_composed).abs().max().into_scalar::<f32>() / size;
                    assert!(d < 1e-5, "{what}: input gradients differ by {d} of their largest ({size})");
                }
            }
        }
    }
}
