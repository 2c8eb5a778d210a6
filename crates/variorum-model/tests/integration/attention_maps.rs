//! `DecoderLm::attention_maps`: one map per block application, each a causal distribution over
//! the keys, from the same blocks the forward runs; kinds without weights give none.

use burn::prelude::*;
use variorum_model::ModelConfig;

fn model(extra: &str) -> variorum_model::DecoderLm {
    let cfg: ModelConfig =
        toml::from_str(&format!("vocab_size = 11\nd_model = 32\nn_layers = 3\nseq_len = 16\n{extra}"))
            .unwrap_or_else(|e| panic!("{e}"));
    cfg.validate().unwrap();
    cfg.init(&Device::flex())
}

fn tokens(dev: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..2 * 12).map(|i| (i * 7 % 11) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [2, 12]), dev)
}

#[test]
fn every_block_gives_a_causal_distribution_over_the_keys() {
    let dev = Device::flex();
    let m = model("");
    let maps = m.attention_maps(tokens(&dev)).unwrap();
    assert_eq!(maps.len(), 3);
    for (i, map) in maps.into_iter().enumerate() {
        let map = map.unwrap_or_else(|| panic!("block {i} gave no weights"));
        assert_eq!(map.dims(), [2, 4, 12, 12]);
        let rows = (map.clone().sum_dim(3) - 1.0).abs().max().into_scalar::<f32>();
        assert!(rows < 1e-5, "block {i}: rows sum to 1 ± {rows}");
        let future = map.triu(1).abs().max().into_scalar::<f32>();
        assert_eq!(future, 0.0, "block {i} attends to the future");
    }
    // the maps of another block differ (each block's own attention, not one map repeated)
    let maps = m.attention_maps(tokens(&dev)).unwrap();
    let gap = (maps[0].clone().unwrap() - maps[2].clone().unwrap()).abs().max().into_scalar::<f32>();
    assert!(gap > 1e-4);
}

#[test]
fn kinds_without_weights_give_none_and_other_schedules_are_refused() {
    let dev = Device::flex();
    let linear = model("[attention]\nkind = \"linear\"\n[position]\nkind = \"learned\"");
    assert!(linear.attention_maps(tokens(&dev)).unwrap().iter().all(Option::is_none));
    let act = model("[depth]\nkind = \"universal\"\nact = true\n[position]\nkind = \"learned\"");
    assert!(act.attention_maps(tokens(&dev)).is_err());
}
