//! The macros the kinds are written with: a config's head fields written once
//! ([`attention_config!`]), the [`AttentionKind`](crate::kind::AttentionKind) items that read
//! them as one value ([`head_settings_hooks!`], [`head_kind_items!`]) and the KV-cache hooks of
//! a kind built on the engine ([`kv_cache_hooks!`]). Crate-internal.

/// The [`MultiHeadAttentionConfig`](crate::engine::config::MultiHeadAttentionConfig) of a kind's table that repeats its head fields (`n_heads`,
/// `n_kv_heads`, `head_dim`, `dropout`, `bias`, `normaliser`): every kind spells its own table,
/// because serde's `flatten` does not combine with `deny_unknown_fields`.
macro_rules! head_fields {
    ($c:expr) => {
        $crate::engine::config::MultiHeadAttentionConfig {
            n_heads: $c.n_heads,
            n_kv_heads: $c.n_kv_heads,
            head_dim: $c.head_dim,
            dropout: $c.dropout,
            bias: $c.bias,
            normaliser: $c.normaliser,
            head_temperature: $c.head_temperature,
            scaled: true,
            diversity: None,
            guidance: None,
        }
    };
}

/// `heads()` of a kind's config with `full`'s head fields: the engine's config they build.
macro_rules! head_methods {
    () => {
        /// The engine's config from the head fields (`full`'s table, no head losses).
        pub fn heads(&self) -> $crate::engine::config::MultiHeadAttentionConfig {
            $crate::macros::head_fields!(self)
        }
    };
}

/// Writes a kind's config struct whose table begins with `full`'s five head fields: the head
/// fields with their docs and defaults (written here once), then the kind's own fields, each
/// with its default after `=`; plus `Default`, `heads()` ([`head_methods!`]) and the two
/// private methods that read and write the head fields as one
/// [`HeadSettings`](crate::kind::HeadSettings) (`head_fields`, `with_head_fields`, which
/// [`head_settings_hooks!`] hands to the trait). A kind with only some of the head fields names
/// them after the struct's name, in its table's order
/// (`pub struct PerformerConfig [n_heads, head_dim, bias] { … }`), and gets all but `heads()`. A field-by-field struct rather than `#[serde(flatten)]`, because serde's
/// `flatten` does not combine with `deny_unknown_fields`; the keys and their order in a
/// written-out config are what a hand-written struct with these fields gives. Crate-internal
/// (not exported): invoked by name in this crate's kind modules.
///
/// ```ignore
/// attention_config! {
///     /// `model.attention` with `kind = "sliding-window"`.
///     pub struct SlidingWindowConfig {
///         /// w, keys each query sees back, its own included. Default 256.
///         pub window: usize = 256,
///     }
/// }
/// ```
macro_rules! attention_config {
    // The five head fields of `full`, in its order, and `heads()`.
    (
        $(#[$meta:meta])*
        pub struct $name:ident $own:tt
    ) => {
        $crate::macros::attention_config! {
            @fields [$(#[$meta])*] $name [n_heads n_kv_heads head_dim dropout bias normaliser] [] [] [] $own
        }

        impl $name {
            $crate::macros::head_methods!();
        }
    };
    // A subset of the head fields, in the order given (kinds without weights have no dropout,
    // kernelised ones no grouped keys); the kind writes its own head checks.
    (
        $(#[$meta:meta])*
        pub struct $name:ident [$($head:ident),+] $own:tt
    ) => {
        $crate::macros::attention_config! { @fields [$(#[$meta])*] $name [$($head)+] [] [] [] $own }
    };
    // One head field at a time: its declaration and its default, written here once.
    (@fields $meta:tt $name:ident [n_heads $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Query heads. Default 4."] pub n_heads: usize,]
            [$($init)* n_heads: 4,] [$($copy)* n_heads] $own }
    };
    (@fields $meta:tt $name:ident [n_kv_heads $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)*
                #[doc = " Key/value heads: `n_heads` (default) is multi-head, 1 is multi-query, anything"]
                #[doc = " dividing `n_heads` is grouped-query attention."]
                pub n_kv_heads: Option<usize>,]
            [$($init)* n_kv_heads: None,] [$($copy)* n_kv_heads] $own }
    };
    (@fields $meta:tt $name:ident [head_dim $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Size of each head. Default `d_model / n_heads`."] pub head_dim: Option<usize>,]
            [$($init)* head_dim: None,] [$($copy)* head_dim] $own }
    };
    (@fields $meta:tt $name:ident [dropout $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Dropout on the attention probabilities. Default 0."] pub dropout: f64,]
            [$($init)* dropout: 0.0,] [$($copy)* dropout] $own }
    };
    (@fields $meta:tt $name:ident [bias $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)* #[doc = " Biases in the q/k/v and output projections. Default true."] pub bias: bool,]
            [$($init)* bias: true,] [$($copy)*] $own }
    };
    // `normaliser` is two fields: the row function and the per-head temperature.
    (@fields $meta:tt $name:ident [normaliser $($rest:ident)*] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*] $own:tt) => {
        $crate::macros::attention_config! { @fields $meta $name [$($rest)*]
            [$($decl)*
                #[doc = " How each row of scores becomes weights: \"softmax\" (default), \"relu\", \"sigmoid\","]
                #[doc = " \"sparsemax\" or \"entmax-1.5\" ([`Normaliser`](crate::engine::normaliser::Normaliser))."]
                pub normaliser: $crate::engine::normaliser::Normaliser,
                #[doc = " A learned temperature per head dividing its scores. Default false."]
                pub head_temperature: bool,]
            [$($init)* normaliser: $crate::engine::normaliser::Normaliser::Softmax, head_temperature: false,] [$($copy)*] $own }
    };
    // Every head field written: the struct, then `Default`.
    (
        @fields [$(#[$meta:meta])*] $name:ident [] [$($decl:tt)*] [$($init:tt)*] [$($copy:ident)*]
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

        impl $name {
            /// The head fields of this table as one value (a key it lacks at its default).
            fn head_fields(&self) -> $crate::kind::HeadSettings {
                #[allow(unused_mut)]
                let mut heads = $crate::kind::HeadSettings { n_heads: 4, n_kv_heads: None, head_dim: None, dropout: 0.0 };
                $( heads.$copy = self.$copy; )*
                heads
            }

            /// This config with `heads` written into its head fields.
            fn with_head_fields(&self, heads: &$crate::kind::HeadSettings) -> Self {
                Self { $( $copy: heads.$copy, )* ..self.clone() }
            }
        }
    };
}

/// The two [`AttentionMechanism`](crate::kind::AttentionMechanism) hooks of a kind whose module keeps `full`'s KV cache through
/// its `attention: MultiHeadAttention` field: `forward` hands the kind's inherent
/// `forward(input, Option<&mut KvCache>)` the state's cache, and `extend_cache` projects new
/// positions into it without an output. Invoked inside the kind's `impl AttentionMechanism`.
macro_rules! kv_cache_hooks {
    () => {
        fn forward(
            &self,
            input: $crate::contract::AttentionInput,
            state: Option<&mut $crate::state::AttentionState>,
        ) -> $crate::contract::AttentionOutput {
            Self::forward(self, input, state.map($crate::state::AttentionState::kv_mut))
        }

        fn extend_cache(
            &self,
            x: burn::prelude::Tensor<3>,
            mask: &variorum_core::AttentionMask,
            state: &mut $crate::state::AttentionState,
        ) {
            self.attention.project(x, None, mask, Some(state.kv_mut()));
        }
    };
}

/// The [`AttentionKind`](crate::kind::AttentionKind) hooks that read a kind's head fields as one
/// value: `head_settings` and `with_head_settings` from the fields [`attention_config!`] wrote
/// (`head_shape`, `dropout` and `expanded` then come from the trait's defaults). Invoked inside
/// the kind's `impl AttentionKind`.
macro_rules! head_settings_hooks {
    () => {
        fn head_settings(&self) -> Option<$crate::kind::HeadSettings> {
            Some(self.head_fields())
        }

        fn with_head_settings(&self, heads: &$crate::kind::HeadSettings) -> Self {
            self.with_head_fields(heads)
        }
    };
}

/// The [`AttentionKind`](crate::kind::AttentionKind) items every kind written with
/// [`attention_config!`] and built on the engine shares: its head settings
/// ([`head_settings_hooks!`]) and `build` through its inherent `init`
/// (`init(d_model, init_std, out_std, position, device)`). Invoked inside the kind's
/// `impl AttentionKind`.
macro_rules! head_kind_items {
    () => {
        $crate::macros::head_settings_hooks!();

        fn build(&self, init: &$crate::kind::LayerInit, device: &burn::prelude::Device) -> Self::Module {
            self.init(init.d_model, init.init_std, init.out_std, init.position, device)
        }
    };
}

pub(crate) use {attention_config, head_fields, head_methods, head_settings_hooks};
