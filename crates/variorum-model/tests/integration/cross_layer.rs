//! Attention maps carried from one block application to the next (`CarriedMaps`): the model's
//! block loop hands each layer what the previous one left, for every kind that declares
//! `cross_layer`, and the rules keep those kinds out of stacks that cannot carry them.

use burn::prelude::*;
use variorum_attention::CarriedMaps;
use variorum_core::AttentionMask;
use variorum_model::ModelConfig;

fn config(extra: &str) -> ModelConfig {
    toml::from_str(&format!("vocab_size = 11\nd_model = 32\nn_layers = 4\nseq_len = 16\n{extra}"))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tokens(dev: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..2 * 12).map(|i| (i * 7 % 11) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [2, 12]), dev)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn lazyformer_layers_reuse_the_map_of_their_blocks_first_layer() {
    let dev = Device::flex();
    dev.seed(3);
    let cfg = config("[attention]\nkind = \"lazyformer\"\ngroup = 2");
    cfg.validate().unwrap();
    let maps = cfg.init(&dev).attention_maps(tokens(&dev)).unwrap();
    let map = |i: usize| maps[i].clone().unwrap_or_else(|| panic!("layer {i} gave no weights"));
    assert_eq!((map(1) - map(0)).abs().max().into_scalar::<f32>(), 0.0, "layer 1 reuses layer 0's map");
    assert_eq!((map(3) - map(2)).abs().max().into_scalar::<f32>(), 0.0, "layer 3 reuses layer 2's map");
    let fresh = (map(2) - map(0)).abs().max().into_scalar::<f32>();
    assert!(fresh > 1e-4, "layer 2 computes a map of its own (differs by {fresh})");
}

#[test]
fn realformer_layers_read_the_scores_the_loop_carries() {
    let dev = Device::flex();
    dev.seed(4);
    let cfg = config("[attention]\nkind = \"realformer\"");
    cfg.validate().unwrap();
    let m = cfg.init(&dev);
    let x = m.embed(tokens(&dev), 0);
    let mask = AttentionMask::causal();
    let (forward, _, _) = m.run_blocks(x.clone(), &mask, None, None, |_, _, _| variorum_model::decoder::Flow::Continue);
    // the same layers by hand: one slot through all of them, or a fresh one for each
    let (mut carried, mut alone) = (x.clone(), x);
    let mut slot = CarriedMaps::default();
    for i in 0..4 {
        carried = m.layer(i, carried, &mask, None, None, &mut slot).x;
        alone = m.layer(i, alone, &mask, None, None, &mut CarriedMaps::default()).x;
    }
    assert_eq!(max_diff(forward.clone(), carried), 0.0, "the block loop carries the scores as by hand");
    let gap = max_diff(forward, alone);
    assert!(gap > 1e-4, "without the previous layers' scores the output must differ (differs by {gap})");
}

#[test]
fn kinds_that_read_the_previous_layer_are_refused_where_it_is_not_carried() {
    for kind in ["realformer", "lazyformer", "evolving"] {
        for (setting, needle) in
            [("[block]\nkind = \"reversible\"", "reversible"), ("[memory]\nkind = \"xl\"\nlength = 8", "model.memory")]
        {
            let e = config(&format!("[attention]\nkind = \"{kind}\"\n{setting}")).validate().unwrap_err().to_string();
            assert!(e.contains("previous layer's attention maps") && e.contains(needle), "{kind} with {setting}: {e}");
        }
    }
    // one shared block cannot be both a computing and a reusing Lazyformer layer
    let shared = "[attention]\nkind = \"lazyformer\"\n[depth]\nkind = \"universal\"\n[position]\nkind = \"learned\"";
    let e = config(shared).validate().unwrap_err().to_string();
    assert!(e.contains("different roles by index"), "{e}");
    config(&shared.replace("kind = \"lazyformer\"", "kind = \"lazyformer\"\ngroup = 1")).validate().unwrap();
    config("[attention]\nkind = \"realformer\"\n[depth]\nkind = \"universal\"\n[position]\nkind = \"learned\"")
        .validate()
        .unwrap();
}
