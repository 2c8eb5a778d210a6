//! `model.embedding_norm` (BLOOM, BERT), `model.head_bias` (GPT-J, Phi, BERT's MLM decoder) and
//! `model.head_transform` (BERT's prediction head).

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

/// `scale_head` (T5's tied head): the head reads the final state times 1/√d_model, so the
/// logits are the unscaled model's over √d_model, tied head or not.
#[test]
fn the_scaled_head_reads_the_stream_over_the_root_of_d_model() {
    let dev = Device::flex();
    for tied in [true, false] {
        let cfg = ModelConfig { scale_head: true, tie_embeddings: tied, ..zoo::tiny() };
        cfg.validate().unwrap();
        let mut model = cfg.init(&dev);
        let scaled = model.forward(tokens(&dev)).logits;
        model.head_scale = None;
        let plain = model.forward(tokens(&dev)).logits;
        assert!(plain.clone().abs().max().into_scalar::<f32>() > 1e-2, "the check needs logits away from 0");
        let diff = (scaled - plain.div_scalar((cfg.d_model as f64).sqrt())).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-6, "tied = {tied}: logits off the unscaled ones / √d by {diff}");
    }
}

#[test]
fn a_model_without_head_bias_has_none() {
    let model = zoo::tiny().init(&Device::flex());
    assert!(model.head_bias.is_none() && model.embedding_norm.is_none() && model.head_transform.is_none());
    assert!(model.embedding_projection.is_none() && model.head_scale.is_none());
}

#[test]
fn the_embedding_projection_is_a_dense_layer_after_the_embedding_norm() {
    let dev = Device::flex();
    let cfg = ModelConfig { embedding_norm: true, embedding_projection: true, init_std: 0.5, ..zoo::tiny() };
    cfg.validate().unwrap();
    let mut model = cfg.init(&dev);
    let projected = model.embed(tokens(&dev), 0);
    let projection = model.embedding_projection.take().expect("a projection");
    let normed = model.embed(tokens(&dev), 0);
    let want =
        normed.matmul(projection.weight.val().unsqueeze::<3>()) + projection.bias.unwrap().val().unsqueeze::<3>();
    let diff = (projected - want).abs().max().into_scalar::<f32>();
    assert!(diff < 1e-4, "embedding off (norm(x) W + b) by {diff}");
}

#[test]
fn the_head_transform_activates_with_the_feed_forward_kind() {
    use variorum_block::{FeedForwardConfig, FeedForwardKind};
    let feed_forward = FeedForwardConfig { kind: FeedForwardKind::GeluTanh, d_ff: Some(64), ..Default::default() };
    let cfg = ModelConfig { head_transform: true, feed_forward, ..zoo::tiny() };
    let model = cfg.init(&Device::flex());
    assert_eq!(model.head_transform.unwrap().activation, FeedForwardKind::GeluTanh);
}

#[test]
fn the_head_transform_is_dense_gelu_norm_before_the_tied_projection() {
    let dev = Device::flex();
    let cfg = ModelConfig { head_transform: true, head_bias: true, init_std: 0.5, ..zoo::tiny() };
    cfg.validate().unwrap();
    let mut model = cfg.init(&dev);
    let t = model.head_transform.clone().expect("a transform");
    // a norm away from its identity, so that leaving it out would show
    let d = cfg.d_model;
    let gamma = Tensor::<1>::random([d], Distribution::Uniform(0.5, 2.0), &dev);
    let beta = Tensor::<1>::random([d], Distribution::Uniform(-1.0, 1.0), &dev);
    model.head_transform = Some(variorum_model::HeadTransform {
        norm: variorum_block::Norm::Layer(variorum_block::norm::LayerNorm {
            gamma: Param::from_tensor(gamma.clone()),
            beta: Some(Param::from_tensor(beta.clone())),
            epsilon: 1e-5,
        }),
        ..t
    });
    let out = model.forward(tokens(&dev));
    // by hand: h W + b, erf GELU, LayerNorm, then Eᵀ and the head bias
    let dense = &model.head_transform.as_ref().unwrap().dense;
    let h =
        out.features.matmul(dense.weight.val().unsqueeze::<3>()) + dense.bias.as_ref().unwrap().val().unsqueeze::<3>();
    let h = burn::tensor::activation::gelu(h);
    let mean = h.clone().mean_dim(2);
    let centred = h - mean;
    let var = centred.clone().powf_scalar(2.0).mean_dim(2);
    let normed = centred / var.add_scalar(1e-5).sqrt();
    let normed = normed * gamma.unsqueeze::<3>() + beta.unsqueeze::<3>();
    let want = normed.matmul(model.token_embedding.weight.val().transpose().unsqueeze::<3>())
        + model.head_bias.as_ref().unwrap().val().unsqueeze::<3>();
    let diff = (out.logits - want).abs().max().into_scalar::<f32>();
    assert!(diff < 1e-3, "logits off Norm(GELU(h W + b)) Eᵀ + c by {diff}");
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
