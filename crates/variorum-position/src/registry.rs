//! Every position scheme, registered once. One line names a scheme (its `kind = "…"` value),
//! the config variant and type ([`PositionKind`]), and the module it builds inside attention
//! (`relative Variant(Module)`, a [`RelativeScheme`]) or on the residual stream
//! (`absolute Variant(Module)`, an [`AbsoluteSignal`]). `position_kinds!` writes from the list
//! the config enum [`PositionConfig`], the module enums [`RelativePosition`] and
//! [`AbsolutePosition`], and their dispatch. Adding a scheme is its file plus one line here.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo};

use crate::kind::{AbsoluteSignal, HeadShape, PositionKind, RelativeScheme};
use crate::*;

/// Writes the config enum, the two module enums and their dispatch from a list of
/// `"kind" => Variant(Config) [relative Variant(Module)] [absolute Variant(Module)],` lines.
/// Every method forwards to the scheme's trait impl; no per-scheme logic lives here.
macro_rules! position_kinds {
    ($( $(#[$doc:meta])* $kind:literal => $variant:ident($config:ty)
        $(relative $rv:ident($rm:ty))? $(absolute $av:ident($am:ty))?, )+) => {
        /// `model.position`, chosen by `kind`.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", deny_unknown_fields)]
        pub enum PositionConfig {
            $( $(#[$doc])* #[serde(rename = $kind)] $variant($config), )+
        }

        /// One layer's relative position scheme.
        #[derive(Module, Debug)]
        pub enum RelativePosition {
            $( $(
                #[doc = concat!("`", $kind, "`: the scheme's part inside one attention layer.")]
                $rv($rm),
            )? )+
        }

        /// An initialised absolute scheme (added before the first block, or before one block).
        #[derive(Module, Debug)]
        pub enum AbsolutePosition {
            $( $(
                #[doc = concat!("`", $kind, "`: the scheme's signal on the residual stream.")]
                $av($am),
            )? )+
        }

        $( $( impl From<$rm> for RelativePosition {
            fn from(m: $rm) -> Self {
                Self::$rv(m)
            }
        } )? )+

        $( $( impl From<$am> for AbsolutePosition {
            fn from(m: $am) -> Self {
                Self::$av(m)
            }
        } )? )+

        $( impl From<$config> for PositionConfig {
            fn from(c: $config) -> Self {
                Self::$variant(c)
            }
        } )+

        impl PositionConfig {
            /// The name in a config (the `kind` key).
            pub fn kind(&self) -> &'static str {
                match self { $( Self::$variant(_) => $kind, )+ }
            }

            /// One config of every scheme (its defaults), in zoo order.
            pub fn every_kind() -> Vec<Self> {
                vec![ $( Self::$variant(<$config>::default()), )+ ]
            }

            /// The `variorum zoo` rows: `score_bias` means the scheme acts on the score matrix,
            /// so the attention must form one; `qk_rotation`, that it rotates q and k.
            pub fn zoo() -> Vec<KindInfo> {
                vec![ $( KindInfo {
                    axis: "model.position",
                    kind: $kind,
                    summary: <$config as PositionKind>::SUMMARY,
                    paper: <$config as PositionKind>::PAPER,
                    caps: <$config as PositionKind>::CAPS,
                }, )+ ]
            }

            /// Every scheme's test variants, named `"<kind> <what it exercises>"`.
            pub fn test_variants() -> Vec<(String, Self)> {
                let mut out = Vec::new();
                $( for (what, c) in <$config as PositionKind>::test_variants() {
                    out.push((format!("{} {}", $kind, what).trim_end().to_string(), Self::$variant(c)));
                } )+
                out
            }

            /// What this configured scheme declares.
            pub fn capabilities(&self) -> Capabilities {
                match self { $( Self::$variant(c) => <$config as PositionKind>::capabilities(c), )+ }
            }

            /// Whether every layer of a stack reads the first layer's relative parameters.
            pub fn tied_across_layers(&self) -> bool {
                match self { $( Self::$variant(c) => <$config as PositionKind>::tied_across_layers(c), )+ }
            }

            /// The same config with derived defaults written out.
            pub fn expanded(&self, context: usize) -> Self {
                match self { $( Self::$variant(c) => Self::$variant(<$config as PositionKind>::expanded(c, context)), )+ }
            }

            /// `context` is the model's context length (`model.seq_len`).
            pub fn validate(&self, heads: HeadShape, context: usize) -> Result<(), ConfigError> {
                match self { $( Self::$variant(c) => <$config as PositionKind>::validate(c, heads, context), )+ }
            }

            /// What is added to the embeddings before the first block, if anything.
            pub fn init_input(&self, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
                match self { $( Self::$variant(c) => <$config as PositionKind>::init_input(c, d_model, context, device), )+ }
            }

            /// What is added to the input of block `layer` (0-based), if anything.
            pub fn init_layer(
                &self,
                layer: usize,
                d_model: usize,
                context: usize,
                device: &Device,
            ) -> Option<AbsolutePosition> {
                match self { $( Self::$variant(c) => <$config as PositionKind>::init_layer(c, layer, d_model, context, device), )+ }
            }

            /// The scheme's part inside one attention layer, if it has one.
            pub fn init_relative(&self, heads: HeadShape, context: usize, device: &Device) -> Option<RelativePosition> {
                match self { $( Self::$variant(c) => <$config as PositionKind>::init_relative(c, heads, context, device), )+ }
            }

            /// Factor on the content scores' 1/√d_h.
            pub fn content_scale(&self) -> f64 {
                match self { $( Self::$variant(c) => <$config as PositionKind>::content_scale(c), )+ }
            }

            /// Longest position the scheme can encode, if it is bounded (a learned table).
            pub fn max_len(&self, context: usize) -> Option<usize> {
                match self { $( Self::$variant(c) => <$config as PositionKind>::max_len(c, context), )+ }
            }
        }

        impl RelativePosition {
            fn scheme(&self) -> &dyn RelativeScheme {
                match self { $( $( Self::$rv(m) => m as &dyn RelativeScheme, )? )+ }
            }
        }

        impl AbsolutePosition {
            fn signal(&self) -> &dyn AbsoluteSignal {
                match self { $( $( Self::$av(m) => m, )? )+ }
            }
        }
    };
}

position_kinds! {
    /// Fixed sin/cos of the position added to the embeddings.
    "sinusoidal" => Sinusoidal(SinusoidalPositionConfig) absolute Sinusoidal(SinusoidalPosition),
    /// A learned table added to the embeddings (or before every block).
    "learned" => Learned(LearnedPositionConfig) absolute Learned(LearnedPosition),
    /// Reformer's axial positions: per-axis learned tables over a grid of positions, concatenated.
    "axial" => Axial(AxialPositionConfig) absolute Axial(AxialPosition),
    /// No position signal at all (NoPE).
    "none" => None(NoPositionConfig),
    /// Shaw et al. 2018: learned relative key (and value) vectors, offsets clipped to ±k.
    "shaw" => Shaw(ShawConfig) relative Shaw(ShawRelative),
    /// Transformer-XL: sinusoidal relative encodings with their own key projection and biases u, v.
    "transformer-xl" => TransformerXl(XlRelativeConfig) relative TransformerXl(XlRelative),
    /// T5: a learned scalar per head and log-spaced distance bucket.
    "t5" => T5(T5BiasConfig) relative T5(T5Bias),
    /// ALiBi: a fixed linear distance penalty per head.
    "alibi" => Alibi(AlibiConfig) relative Alibi(AlibiBias),
    /// RoPE: q and k rotated by their positions.
    "rope" => Rope(RotaryConfig) relative Rope(RotaryEmbedding),
    /// DA-Transformer: rectified scores scaled by a learned function of distance per head.
    "da" => Da(DistanceAwareConfig) relative DistanceAware(DistanceAware),
    /// A learned scalar per |i − j| multiplying the scores.
    "multiplicative" => Multiplicative(MultiplicativeConfig) relative Multiplicative(MultiplicativePosition),
    /// TUPE: a separately projected position–position term.
    "untied" => Untied(UntiedConfig) relative Untied(Untied),
    /// DeBERTa: content→position and position→content terms with relative embeddings.
    "deberta" => Deberta(DebertaConfig) relative Deberta(Disentangled),
    /// The Universal Transformer's position ⊕ step signal, added before every block.
    "universal-timestep" => UniversalTimestep(TimestepConfig) absolute Timestep(TimestepEncoding),
}

impl Default for PositionConfig {
    fn default() -> Self {
        Self::Learned(LearnedPositionConfig::default())
    }
}

impl RelativePosition {
    /// Rotates `x: [b, heads, len, d_h]` whose rows sit at positions `start..` (RoPE); the
    /// identity for every other scheme.
    pub fn rotate(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        self.scheme().rotate(x, start)
    }

    /// Whether the scheme acts by rotating q and k alone, packed ([`RelativeScheme::rotates_packed`]).
    pub fn rotates_packed(&self) -> bool {
        self.scheme().rotates_packed()
    }

    /// The fused projection with its queries and keys rotated by a kernel
    /// ([`RelativeScheme::rotate_packed`]); `None`: take the separate path.
    pub fn rotate_packed(&self, qkv: Tensor<3>, heads: crate::kind::PackedHeads, start: usize) -> Option<Tensor<3>> {
        self.scheme().rotate_packed(qkv, heads, start)
    }

    /// Whether [`rotate`](Self::rotate) changes q and k ([`RelativeScheme::rotates`]).
    pub fn rotates(&self) -> bool {
        self.scheme().rotates()
    }

    /// The scheme applied to a block of scaled scores ([`RelativeScheme::scores`]).
    pub fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        k: Tensor<4>,
        layout: &ScoreLayout,
        scale: f64,
    ) -> Tensor<4> {
        self.scheme().scores(scores, q_scaled, k, layout, scale)
    }

    /// Whether the scheme applies to keys gathered from anywhere
    /// ([`RelativeScheme::works_on_gathered_keys`]).
    pub fn works_on_gathered_keys(&self) -> bool {
        self.scheme().works_on_gathered_keys()
    }

    /// The additive term of gathered keys ([`RelativeScheme::bias_at`]).
    pub fn bias_at(&self, d: &Distances, device: &Device) -> Option<Tensor<4>> {
        self.scheme().bias_at(d, device)
    }

    /// A term added to the attention output from the probabilities ([`RelativeScheme::context`]).
    pub fn context(&self, probs: Tensor<4>, layout: &ScoreLayout) -> Option<Tensor<4>> {
        self.scheme().context(probs, layout)
    }

    /// Whether the scheme has terms for the block-sparse kernel
    /// ([`RelativeScheme::has_distance_terms`]).
    pub fn has_distance_terms(&self) -> bool {
        self.scheme().has_distance_terms()
    }

    /// The block-sparse kernel's terms ([`RelativeScheme::distance_terms`]).
    pub fn distance_terms(
        &self,
        at: crate::kind::TermsFor,
        device: &Device,
    ) -> Option<variorum_kernels::block_sparse::DistanceTerms> {
        self.scheme().distance_terms(at, device)
    }

    /// Whether the scheme adds a product of per-position vectors
    /// ([`RelativeScheme::has_position_products`]).
    pub fn has_position_products(&self) -> bool {
        self.scheme().has_position_products()
    }

    /// The per-position vectors of a product term ([`RelativeScheme::position_products`]).
    pub fn position_products(&self, layout: &ScoreLayout, scale: f64) -> Option<(Tensor<3>, Tensor<3>)> {
        self.scheme().position_products(layout, scale)
    }
}

impl AbsolutePosition {
    /// Position vectors for positions `start..start+len`, shape `[len, d_model]`.
    pub fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        self.signal().encode(start, len, device)
    }

    /// `x + P[start..start+len]` for `x: [batch, len, d_model]`.
    pub fn forward(&self, x: Tensor<3>, start: usize) -> Tensor<3> {
        let [_, len, _] = x.dims();
        let p = self.encode(start, len, &x.device());
        x + p.unsqueeze_dim(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On keys that do form a layout, the gathered bias is the layout's: the same distances, the
    /// same numbers, per-head distances included.
    #[test]
    fn gathered_bias_equals_the_layout_bias() {
        let dev = Device::flex();
        let heads = HeadShape { d_model: 8, n_heads: 2, head_dim: 4 };
        let t5 = T5BiasConfig { num_buckets: 6, max_distance: 9, shared: false };
        for config in [PositionConfig::Alibi(AlibiConfig {}), PositionConfig::T5(t5)] {
            let pos = config.init_relative(heads, 32, &dev).unwrap();
            assert!(pos.works_on_gathered_keys());
            for causal in [true, false] {
                let layout = ScoreLayout::new(7, 2, 3, 5, causal);
                let zeros = Tensor::<4>::zeros([1, 2, 3, 5], &dev);
                let q = Tensor::<4>::zeros([1, 2, 3, 4], &dev);
                let k = Tensor::<4>::zeros([1, 2, 5, 4], &dev);
                let want = pos.scores(zeros, q, k, &layout, 1.0);
                let values: Vec<i64> = (0..3).flat_map(|i| (0..5).map(move |j| layout.distance(i, j))).collect();
                let shared = Distances { dims: [1, 1, 3, 5], values: values.clone(), causal };
                let got = pos.bias_at(&shared, &dev).unwrap().reshape([1, 2, 3, 5]);
                assert!((got - want.clone()).abs().max().into_scalar::<f32>() < 1e-6, "{}", config.kind());
                // one distance table per head: head 1 gets the distances of head 0 shifted by 4
                let shifted: Vec<i64> = values.iter().copied().chain(values.iter().map(|d| d + 4)).collect();
                let per_head = Distances { dims: [2, 1, 3, 5], values: shifted, causal };
                let got = pos.bias_at(&per_head, &dev).unwrap().reshape([1, 2, 3, 5]);
                let head0 = got.clone().narrow(1, 0, 1);
                assert!((head0 - want.narrow(1, 0, 1)).abs().max().into_scalar::<f32>() < 1e-6);
                let layout1 = ScoreLayout::new(11, 2, 3, 5, causal);
                let zeros = Tensor::<4>::zeros([1, 2, 3, 5], &dev);
                let want1 = pos.scores(
                    zeros,
                    Tensor::zeros([1, 2, 3, 4], &dev),
                    Tensor::zeros([1, 2, 5, 4], &dev),
                    &layout1,
                    1.0,
                );
                let d = (got.narrow(1, 1, 1) - want1.narrow(1, 1, 1)).abs().max().into_scalar::<f32>();
                assert!(d < 1e-6, "{} per-head distances: {d}", config.kind());
            }
        }
    }

    /// Every scheme's defaults round-trip through TOML unchanged, and the tables without
    /// settings (`none`, `alibi`, `da`, `universal-timestep`) still refuse unknown keys.
    #[test]
    fn every_kind_round_trips_and_refuses_unknown_keys() {
        #[derive(Serialize, Deserialize)]
        struct Wrap {
            position: PositionConfig,
        }
        for config in PositionConfig::every_kind() {
            let text = toml::to_string(&Wrap { position: config.clone() }).unwrap();
            let back: Wrap = toml::from_str(&text).unwrap();
            assert_eq!(back.position, config, "{text}");
            let bad = format!("{text}nonsense = 1\n");
            let err = toml::from_str::<Wrap>(&bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("nonsense"), "{} accepted an unknown key: {err}", config.kind());
        }
    }
}
