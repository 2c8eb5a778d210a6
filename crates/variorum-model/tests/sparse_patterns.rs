//! Model-level rules of the sparse patterns that gather keys: each layer draws its own random
//! blocks, and position schemes that need contiguous keys are refused by name.

use burn::prelude::*;
use variorum_attention::{Attention, AttentionConfig, BigBirdConfig};
use variorum_model::{ModelConfig, zoo};
use variorum_position::{PositionConfig, RotaryConfig, ShawConfig, T5BiasConfig, XlRelativeConfig};

fn gathering() -> Vec<AttentionConfig> {
    vec![AttentionConfig::Bigbird(BigBirdConfig { block: 2, global_tokens: 1, ..Default::default() })]
}

#[test]
fn each_layer_draws_its_own_random_blocks() {
    let dev = Device::flex();
    for attention in gathering() {
        let m = ModelConfig { attention, ..zoo::tiny() }.init(&dev);
        let layers: Vec<usize> = m
            .blocks
            .iter()
            .map(|b| match &b.attn {
                Attention::Bigbird(a) => a.layer,
                _ => unreachable!("a bigbird model"),
            })
            .collect();
        assert_eq!(layers, vec![0, 1]);
    }
}

#[test]
fn schemes_that_need_contiguous_keys_are_refused() {
    for attention in gathering() {
        for position in
            [PositionConfig::TransformerXl(XlRelativeConfig::default()), PositionConfig::Shaw(ShawConfig::default())]
        {
            let kind = position.kind();
            let e = ModelConfig { attention: attention.clone(), position, ..zoo::tiny() }.validate().unwrap_err();
            let e = e.to_string();
            assert!(e.contains(&format!("model.position.kind = \"{kind}\" needs contiguous keys")), "{e}");
        }
        for position in [
            PositionConfig::Alibi,
            PositionConfig::T5(T5BiasConfig::default()),
            PositionConfig::Rope(RotaryConfig::default()),
            PositionConfig::default(),
        ] {
            ModelConfig { attention: attention.clone(), position, ..zoo::tiny() }.validate().unwrap();
        }
    }
}
