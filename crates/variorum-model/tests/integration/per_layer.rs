//! Per-layer attention settings: each block gets its own window, and a list that does not match
//! the layers is refused by name.

use burn::prelude::*;
use variorum_attention::{Attention, AttentionConfig, InterleavedConfig, MultiScaleConfig, SlidingWindowConfig};
use variorum_model::{ModelConfig, zoo};

#[test]
fn each_block_gets_its_layers_window() {
    let dev = Device::flex();
    let attention =
        AttentionConfig::SlidingWindow(SlidingWindowConfig { layer_windows: vec![3, 9], ..Default::default() });
    let cfg = ModelConfig { attention, ..zoo::tiny() };
    cfg.validate().unwrap();
    let m = cfg.init(&dev);
    let backs: Vec<usize> = m
        .blocks
        .iter()
        .map(|b| match &b.attn {
            Attention::SlidingWindow(a) => a.back,
            _ => unreachable!("a sliding-window model"),
        })
        .collect();
    assert_eq!(backs, vec![2, 8]);

    let attention = AttentionConfig::MultiScale(MultiScaleConfig {
        layer_windows: vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]],
        ..Default::default()
    });
    let m = ModelConfig { attention, ..zoo::tiny() }.init(&dev);
    let Attention::MultiScale(top) = &m.blocks[1].attn else { unreachable!() };
    assert_eq!(top.head_back, vec![4, 5, 6, 7]);
}

#[test]
fn a_list_for_the_wrong_number_of_layers_is_refused() {
    let attention =
        AttentionConfig::SlidingWindow(SlidingWindowConfig { layer_windows: vec![3, 9, 27], ..Default::default() });
    let e = ModelConfig { attention, ..zoo::tiny() }.validate().unwrap_err().to_string();
    assert!(e.contains("layer_windows has 3 entries for model.n_layers = 2"), "{e}");
    let attention = AttentionConfig::MultiScale(MultiScaleConfig {
        layer_windows: vec![vec![1, 2], vec![5, 6, 7, 8]],
        ..Default::default()
    });
    let e = ModelConfig { attention, ..zoo::tiny() }.validate().unwrap_err().to_string();
    assert!(e.contains("give one per head"), "{e}");
}

/// `kind = "interleaved"`: layer i runs entry i mod n, each an ordinary layer of its kind, read
/// from TOML as a user writes it; what the model may do is what every entry can.
#[test]
fn interleaved_layers_cycle_through_their_kinds() {
    let dev = Device::flex();
    let text = r#"
        kind = "interleaved"
        [[layers]]
        kind = "full"
        [[layers]]
        kind = "sliding-window"
        window = 3
        [[layers]]
        kind = "linformer"
        k = 4
    "#;
    let attention: AttentionConfig = toml::from_str(text).unwrap();
    let AttentionConfig::Interleaved(list) = &attention else { panic!("{attention:?}") };
    assert_eq!(list.layers.len(), 3);
    // written back, it reads the same
    let again: AttentionConfig = toml::from_str(&toml::to_string(&attention).unwrap()).unwrap();
    assert_eq!(again, attention);
    let caps = attention.capabilities();
    assert!(!caps.causal && caps.bidirectional && caps.distinct_layers, "linformer has no causal form");

    let attention = AttentionConfig::Interleaved(InterleavedConfig { layers: list.layers[..2].to_vec() });
    let cfg = ModelConfig { attention, n_layers: 5, ..zoo::tiny() };
    cfg.validate().unwrap();
    let kinds: Vec<&str> = cfg
        .init(&dev)
        .blocks
        .iter()
        .map(|b| match &b.attn {
            Attention::Full(_) => "full",
            Attention::SlidingWindow(a) => {
                assert_eq!(a.back, 2);
                "sliding-window"
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["full", "sliding-window", "full", "sliding-window", "full"]);
}

#[test]
fn interleaved_lists_that_cannot_work_are_refused() {
    let refused = |layers: Vec<AttentionConfig>, says: &str| {
        let attention = AttentionConfig::Interleaved(InterleavedConfig { layers });
        let e = ModelConfig { attention, ..zoo::tiny() }.validate().unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    };
    refused(vec![], "model.attention.layers is empty");
    let nested = AttentionConfig::Interleaved(InterleavedConfig { layers: vec![AttentionConfig::default()] });
    refused(vec![AttentionConfig::default(), nested], "layers[1] is interleaved itself");
    let windows = SlidingWindowConfig { layer_windows: vec![3, 9], ..Default::default() };
    refused(vec![AttentionConfig::SlidingWindow(windows)], "layers[0] sets layer_windows per layer");
    let heads = SlidingWindowConfig { n_heads: 2, window: 3, ..Default::default() };
    refused(vec![AttentionConfig::default(), AttentionConfig::SlidingWindow(heads)], "share one head shape");
    // a shared (universal) block cannot be two kinds
    let attention = AttentionConfig::Interleaved(InterleavedConfig {
        layers: vec![AttentionConfig::default(), AttentionConfig::SlidingWindow(Default::default())],
    });
    let depth = toml::from_str("kind = \"universal\"").unwrap();
    let e = ModelConfig { attention, depth, ..zoo::tiny() }.validate().unwrap_err().to_string();
    assert!(e.contains("different roles by index"), "{e}");
}
