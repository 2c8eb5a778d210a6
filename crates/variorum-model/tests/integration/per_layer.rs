//! Per-layer attention settings: each block gets its own window, and a list that does not match
//! the layers is refused by name.

use burn::prelude::*;
use variorum_attention::{Attention, AttentionConfig, MultiScaleConfig, SlidingWindowConfig};
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
