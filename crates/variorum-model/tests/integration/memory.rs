//! Memories carried in the model state: Transformer-XL's defining equivalence, the stop-gradient,
//! and the Compressive Transformer's losses.

use burn::prelude::*;
use variorum_block::{CompressionKind, CompressiveMemoryConfig, MemoryConfig, XlMemoryConfig};
use variorum_model::{DecoderState, ModelConfig, zoo};
use variorum_position::{PositionConfig, XlRelativeConfig};

static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

fn tokens(batch: usize, len: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..batch * len).map(|i| ((i * 7 + i / 3) % vocab) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, len]), device)
}

fn xl_model(position: PositionConfig) -> ModelConfig {
    ModelConfig { seq_len: 6, position, memory: MemoryConfig::Xl(XlMemoryConfig { length: 6 }), ..zoo::tiny() }
}

#[test]
fn segment_two_with_memory_equals_the_tail_of_the_concatenated_input() {
    let _guard = seeded();
    let dev = Device::flex();
    for position in [
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::Rope(Default::default()),
        PositionConfig::Alibi(Default::default()),
        PositionConfig::T5(Default::default()),
    ] {
        let cfg = xl_model(position.clone());
        cfg.validate().unwrap();
        dev.seed(3);
        let model = cfg.init(&dev);
        let toks = tokens(2, 12, cfg.vocab(), &dev);
        let full = model.forward(toks.clone()).logits.slice([0..2, 6..12]);
        let mut state = DecoderState::default();
        model.forward_with(toks.clone().slice([0..2, 0..6]), Some(&mut state));
        assert_eq!(state.context_len(), 6, "segment 1 is the memory");
        let second = model.forward_with(toks.slice([0..2, 6..12]), Some(&mut state)).logits;
        let diff = (full - second).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-4, "{}: segment 2 with memory differs by {diff}", position.kind());
    }
}

#[test]
fn no_gradient_flows_into_the_memory() {
    let _guard = seeded();
    let dev = Device::flex().autodiff();
    let cfg = xl_model(PositionConfig::TransformerXl(XlRelativeConfig::default()));
    dev.seed(5);
    let model = cfg.init(&dev);
    let toks = tokens(1, 12, cfg.vocab(), &dev);
    let mut state = DecoderState::default();
    model.forward_with(toks.clone().slice([0..1, 0..6]), Some(&mut state));
    // the gradient of segment 2's loss is the same whether the memory is the state left by
    // segment 1 or a plain constant copy of it
    let grad_of = |state: &mut DecoderState| {
        let (loss, _) =
            model.loss_with(toks.clone().slice([0..1, 6..12]), toks.clone().slice([0..1, 6..12]), None, Some(state));
        let grads = loss.backward();
        model.token_embedding.weight.grad(&grads).unwrap()
    };
    let mut copy = state.clone();
    for layer in &mut copy.layers {
        let m = layer.memory.memory.take().unwrap();
        layer.memory.memory = Some(Tensor::from_data(m.into_data(), &dev));
    }
    let a = grad_of(&mut state);
    let b = grad_of(&mut copy);
    assert!((a - b).abs().max().into_scalar::<f32>() < 1e-7);
}

fn compressive(rate: usize, compression: CompressionKind) -> ModelConfig {
    let memory = MemoryConfig::Compressive(CompressiveMemoryConfig {
        length: 4,
        compressed_length: 4,
        rate,
        compression,
        reconstruction_weight: 1.0,
        autoencoding_weight: 1.0,
    });
    ModelConfig { seq_len: 4, memory, position: PositionConfig::Alibi(Default::default()), ..zoo::tiny() }
}

/// Aux losses of three segments of 4 (the second and third evict 4 states each).
fn aux_losses(cfg: &ModelConfig, dev: &Device) -> (variorum_model::DecoderLm, Vec<(String, Tensor<1>)>) {
    dev.seed(8);
    let model = cfg.init(dev);
    let toks = tokens(2, 12, cfg.vocab(), dev);
    let mut state = DecoderState::default();
    let mut out = Vec::new();
    for s in 0..3 {
        let seg = toks.clone().slice([0..2, 4 * s..4 * s + 4]);
        out.extend(model.forward_with(seg, Some(&mut state)).aux_losses);
    }
    let MemoryConfig::Compressive(c) = &cfg.memory else { unreachable!() };
    assert_eq!(
        state.layers[0].memory.lengths(),
        ((8 / c.rate).min(4), 4),
        "8 evicted states compressed by c, at most 4 kept"
    );
    (model, out)
}

#[test]
fn compression_losses_vanish_for_the_identity_and_train_the_compressor() {
    let _guard = seeded();
    let dev = Device::flex().autodiff();
    // c = 1 with the convolution at its initial value (the identity): both losses are zero
    let (_, losses) = aux_losses(&compressive(1, CompressionKind::Conv), &dev);
    let names: Vec<&str> = losses.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"attention_reconstruction") && names.contains(&"autoencoding"), "{names:?}");
    for (name, l) in &losses {
        assert!(l.clone().into_scalar::<f32>().abs() < 1e-10, "{name} should vanish for the identity");
    }
    // c = 2: positive losses whose gradient reaches the convolution
    for kind in [CompressionKind::Conv, CompressionKind::DilatedConv] {
        let (model, losses) = aux_losses(&compressive(2, kind), &dev);
        let (_, recon) = losses.iter().find(|(n, _)| n == "attention_reconstruction").unwrap();
        assert!(recon.clone().into_scalar::<f32>() > 0.0);
        let grads = recon.backward();
        let conv = model.blocks[0].memory.as_ref().unwrap().compressor.as_ref().unwrap().conv.as_ref().unwrap();
        let g = conv.weight.grad(&grads).expect("the reconstruction loss reaches the compression network");
        assert!(g.abs().max().into_scalar::<f32>() > 0.0);
        // and nothing else: the attention it compares through is held fixed
        let variorum_attention::Attention::Full(attn) = &model.blocks[0].attn else { unreachable!() };
        assert!(attn.qkv.qkv.weight.grad(&grads).is_none(), "the attention must not learn from it");
    }
    // pooling and most-used have nothing to learn: no losses
    for kind in [CompressionKind::MeanPool, CompressionKind::MaxPool, CompressionKind::MostUsed] {
        assert!(aux_losses(&compressive(2, kind), &dev).1.is_empty(), "{}", kind.name());
    }
}
