//! `model.embedding_norm` (BLOOM, BERT) and `model.head_bias` (GPT-J, Phi, BERT's MLM decoder).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_block::{BlockConfig, NormKind, PreLnConfig};
use variorum_model::{ModelConfig, zoo};

fn tokens(dev: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new((0..12).map(|i| (i * 7) % 11).collect::<Vec<i64>>(), [1, 12]), dev)
}

#[test]
fn the_head_bias_is_added_to_every_positions_logits_tied_or_not() {
    let dev = Device::flex();
    for tied in [true, false] {
        let cfg = ModelConfig { head_bias: true, tie_embeddings: tied, ..zoo::tiny() };
        cfg.validate().unwrap();
        let mut model = cfg.init(&dev);
        let vocab = model.vocab_size;
        let bias = Tensor::<1>::random([vocab], Distribution::Normal(0.0, 3.0), &dev);
        model.head_bias = Some(Param::from_tensor(bias.clone()));
        let with = model.forward(tokens(&dev)).logits;
        model.head_bias = None;
        let without = model.forward(tokens(&dev)).logits;
        let diff = (with - without - bias.unsqueeze::<3>()).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-4, "tied = {tied}: logits − bias off the unbiased logits by {diff}");
    }
}

#[test]
fn a_model_without_head_bias_has_none() {
    let model = zoo::tiny().init(&Device::flex());
    assert!(model.head_bias.is_none() && model.embedding_norm.is_none());
}

#[test]
fn the_embedding_norm_normalises_tokens_plus_positions_with_the_blocks_norm() {
    let dev = Device::flex();
    for (norm, eps) in [(NormKind::LayerNorm, 1e-5), (NormKind::RmsNorm, 1e-6)] {
        let block = BlockConfig::PreLn(PreLnConfig { norm, norm_eps: eps, ..Default::default() });
        // a large init, so that unnormed embeddings would be far from unit scale
        let cfg = ModelConfig { embedding_norm: true, block, init_std: 2.0, ..zoo::tiny() };
        cfg.validate().unwrap();
        let model = cfg.init(&dev);
        let d = cfg.d_model as f64;
        let x = model.embed(tokens(&dev), 0);
        let mean = x.clone().mean_dim(2);
        let square = x.clone().powf_scalar(2.0).mean_dim(2);
        let spread = match norm {
            // LayerNorm: zero mean, unit variance per position
            NormKind::LayerNorm => {
                assert!(mean.clone().abs().max().into_scalar::<f32>() < 1e-4);
                (square - mean.powf_scalar(2.0)).sub_scalar(1.0).abs().max().into_scalar::<f32>()
            }
            // RMSNorm: unit mean square
            NormKind::RmsNorm => square.sub_scalar(1.0).abs().max().into_scalar::<f32>(),
        };
        assert!(spread < 1e-3, "{norm:?}: per-position scale off 1 by {spread} (d = {d})");
        let unnormed = ModelConfig { embedding_norm: false, ..cfg.clone() }.init(&dev).embed(tokens(&dev), 0);
        let raw = unnormed.powf_scalar(2.0).mean_dim(2).sub_scalar(1.0).abs().max().into_scalar::<f32>();
        assert!(raw > 0.5, "{norm:?}: the unnormed embeddings are already unit scale ({raw}): the test shows nothing");
    }
}
