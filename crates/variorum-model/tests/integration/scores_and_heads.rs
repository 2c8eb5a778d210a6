//! The scores-and-heads kinds (docs/scores-and-heads.md) under every position scheme: a config
//! the rules accept builds and runs, and one they refuse is refused with a message — never a
//! panic at build time (collaborative heads, the Synthesizer and the cross-layer kinds accept
//! only some schemes).

use burn::prelude::*;
use variorum_attention::AttentionConfig;
use variorum_model::{ModelConfig, zoo};
use variorum_position::PositionConfig;

#[test]
fn every_accepted_position_scheme_builds_and_runs() {
    let kinds = ["collaborative", "synthesizer", "gaussian-prior", "realformer", "lazyformer", "evolving"];
    let dev = Device::flex();
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new((0..12).map(|i| i % 11).collect::<Vec<i64>>(), [1, 12]), &dev);
    let mut failures = Vec::new();
    let mut accepted = 0;
    for kind in kinds {
        let attention: AttentionConfig =
            toml::from_str(&format!("kind = \"{kind}\"\nn_heads = 4")).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for position in PositionConfig::every_kind() {
            let name = format!("{kind} + {}", position.kind());
            let cfg = ModelConfig { attention: attention.clone(), position, ..zoo::tiny() };
            if cfg.validate().is_err() {
                continue;
            }
            accepted += 1;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cfg.init(&dev).forward(tokens.clone())));
            if run.is_err() {
                failures.push(name);
            }
        }
    }
    assert!(failures.is_empty(), "accepted by the rules but panicked: {failures:?}");
    assert!(accepted >= 2 * kinds.len(), "only {accepted} combinations accepted");
}
