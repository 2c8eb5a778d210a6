//! What every registered kind declares, and the macro that turns one line per kind into an
//! axis's config enum.
//!
//! Attention and position have their own registries (their modules are enums too, see
//! `variorum_attention`'s `registry/mod.rs`, `variorum_position::registry`); the other config axes
//! (`model.block`, `model.memory`) use `kind_enum!`: each kind's file implements
//! [`Declared`] and the axis's own object-safe trait on its config, and one line per kind in
//! the axis's registry writes the serde enum, its `kind()`, the zoo rows, the test variants and
//! a `spec()` that hands out the config as the axis trait, so the axis's methods are written
//! once as calls on it.

use crate::Capabilities;

/// What a kind says about itself: the `variorum zoo` row and the generic tests' settings.
pub trait Declared: Sized {
    /// One line for `variorum zoo`.
    const SUMMARY: &'static str;
    /// Authors, year, title (empty for a kind that is no mechanism, like "none").
    const PAPER: &'static str;
    /// What the kind supports whatever its settings.
    const CAPS: Capabilities;

    /// Tiny settings the generic tests run, each with what it exercises (at least one: a test
    /// fails otherwise). Default: the kind's defaults, unnamed.
    fn test_variants() -> Vec<(&'static str, Self)>
    where
        Self: Default,
    {
        vec![("", Self::default())]
    }
}

/// Writes a config axis from one line per kind:
///
/// ```ignore
/// kind_enum! {
///     /// `model.memory`, chosen by `kind`.
///     pub enum MemoryConfig: dyn MemoryKind, axis "model.memory" {
///         /// No memory.
///         "none" => None(NoMemoryConfig),
///         "xl" => Xl(XlMemoryConfig),
///     }
/// }
/// ```
///
/// gives the serde enum (tagged by `kind`, unknown keys refused by each kind's struct),
/// `kind()`, `every_kind()`, `zoo()`, `test_variants()`, `From<Config>` for each kind, and
/// `spec() -> &dyn Trait`. Each config type implements [`Declared`], `Default` and the trait.
#[macro_export]
macro_rules! kind_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident: dyn $tr:path, axis $axis:literal {
        $( $(#[$doc:meta])* $kind:literal => $variant:ident($config:ty), )+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(tag = "kind")]
        $vis enum $name {
            $( $(#[$doc])* #[serde(rename = $kind)] $variant($config), )+
        }

        $( impl From<$config> for $name {
            fn from(c: $config) -> Self {
                Self::$variant(c)
            }
        } )+

        impl $name {
            /// The `kind = "…"` value.
            pub fn kind(&self) -> &'static str {
                match self { $( Self::$variant(_) => $kind, )+ }
            }

            /// The config as the axis's trait: every method of the axis is a call on it.
            pub fn spec(&self) -> &dyn $tr {
                match self { $( Self::$variant(c) => c as &dyn $tr, )+ }
            }

            /// One config of every kind (its defaults), in zoo order.
            pub fn every_kind() -> Vec<Self> {
                vec![ $( Self::$variant(<$config>::default()), )+ ]
            }

            /// The `variorum zoo` rows.
            pub fn zoo() -> Vec<$crate::KindInfo> {
                vec![ $( $crate::KindInfo {
                    axis: $axis,
                    kind: $kind,
                    summary: <$config as $crate::Declared>::SUMMARY,
                    paper: <$config as $crate::Declared>::PAPER,
                    caps: <$config as $crate::Declared>::CAPS,
                }, )+ ]
            }

            /// Every kind's test variants, named `"<kind> <what it exercises>"`.
            pub fn test_variants() -> Vec<(String, Self)> {
                let mut out = Vec::new();
                $( for (what, c) in <$config as $crate::Declared>::test_variants() {
                    out.push((format!("{} {}", $kind, what).trim_end().to_string(), Self::$variant(c)));
                } )+
                out
            }
        }
    };
}
