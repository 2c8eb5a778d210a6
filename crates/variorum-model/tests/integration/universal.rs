//! The Universal Transformer: shared weights over depth, and Adaptive Computation Time.

use burn::module::Module;
use burn::prelude::*;
use variorum_block::{DepthConfig, UniversalConfig};
use variorum_model::{ModelConfig, zoo};
use variorum_position::PositionConfig;

fn tokens(batch: usize, len: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..batch * len).map(|i| ((i * 5 + i / 4) % vocab) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, len]), device)
}

fn ut(act: bool) -> ModelConfig {
    ModelConfig {
        n_layers: 3,
        position: PositionConfig::UniversalTimestep(Default::default()),
        depth: DepthConfig::Universal(UniversalConfig { act, halting_bias: -1.0, ..Default::default() }),
        ..zoo::tiny()
    }
}

#[test]
fn without_act_it_equals_a_stack_with_tied_weights() {
    let dev = Device::flex();
    let universal = ut(false).init(&dev);
    assert_eq!(universal.blocks.len(), 1, "one shared block");
    let stack_cfg = ModelConfig { depth: DepthConfig::Stack, ..ut(false) };
    let mut stack = stack_cfg.init(&dev);
    // tie: every block of the stack is the universal block; embeddings copied too
    stack.blocks = vec![universal.blocks[0].clone(); 3];
    stack.token_embedding = universal.token_embedding.clone();
    stack.final_norm = universal.final_norm.clone();
    let toks = tokens(2, 9, 11, &dev);
    let a = universal.forward(toks.clone()).logits;
    let b = stack.forward(toks).logits;
    assert!((a - b).abs().max().into_scalar::<f32>() < 1e-5);
    assert!(stack.num_params() > universal.num_params(), "the universal model shares its block");
}

#[test]
fn act_reports_steps_within_the_maximum_and_a_ponder_cost() {
    let dev = Device::flex();
    let model = ut(true).init(&dev);
    let out = model.forward(tokens(2, 9, 11, &dev));
    let steps = out.steps.expect("ACT reports steps").into_data().try_to_vec::<f32>().unwrap();
    assert!(steps.iter().all(|&s| (1.0..=3.0).contains(&s)), "{steps:?}");
    let (name, ponder) = out.aux_losses.last().unwrap();
    assert_eq!(name, "ponder");
    let p = ponder.clone().into_scalar::<f32>();
    // τ · mean(N + R) with N ≥ 1 and R ∈ (0, 1]
    assert!(p > 0.01 && p <= 0.01 * 4.0 + 1e-6, "{p}");
}
