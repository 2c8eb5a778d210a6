//! What several attention test files share.
#![allow(dead_code)]

use variorum_position::{
    DebertaConfig, MultiplicativeConfig, PositionConfig, RotaryConfig, ShawConfig, T5BiasConfig, XlRelativeConfig,
};

/// Model width of the attention tests.
pub const D: usize = 16;

/// Every position scheme a score-forming kind takes inside attention, with clipping distances
/// short enough for the tests' lengths.
pub fn schemes() -> Vec<PositionConfig> {
    let mut all = distance_schemes();
    all.extend([
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::Shaw(ShawConfig { max_distance: 3, values: true }),
        PositionConfig::Deberta(DebertaConfig { max_distance: 3 }),
        PositionConfig::Da,
        PositionConfig::Multiplicative(MultiplicativeConfig { max_distance: 4 }),
    ]);
    all
}

/// The schemes that act through the query–key distance alone (or on q and k): those patterns
/// with gathered keys take.
pub fn distance_schemes() -> Vec<PositionConfig> {
    vec![
        PositionConfig::None,
        PositionConfig::Alibi,
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 10 }),
        PositionConfig::Rope(RotaryConfig::default()),
    ]
}
