//! Criterion micro-benchmarks of the training hot path at the baby GPT's shapes (batch 12,
//! context 64, d_model 128, 4 heads; configs/gpt-baby-shakespeare-char.toml): causal attention,
//! the GELU feed-forward and LayerNorm, each forward + backward, and one full training step
//! (forward, backward, global-norm clipping, AdamW). `cargo bench -p variorum-train`.
//! Whole-model figures against PyTorch: scripts/compare-pytorch.sh, docs/cpu-speed.md.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::Distribution;
use criterion::{Criterion, criterion_group, criterion_main};
use variorum_attention::{AttentionInput, MultiHeadAttentionConfig, Positioning};
use variorum_block::{FeedForwardConfig, NormKind};
use variorum_core::AttentionMask;
use variorum_data::TokenBatch;
use variorum_train::ExperimentConfig;
use variorum_train::step::{optimizer, train_step};

/// The binary's allocator and its setting (crates/variorum-cli/src/main.rs): freed pages stay
/// with the process.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 12;
const LEN: usize = 64;
const D: usize = 128;

/// A fresh leaf of the same values each time: drawing 98,304 normal numbers costs more than a
/// LayerNorm, so they are drawn once, outside the timed loop.
fn input(x: &Tensor<3>) -> Tensor<3> {
    x.clone().detach().require_grad()
}

/// Forward, backward of the sum, and a read of one gradient value (the backend runs eagerly;
/// the read keeps the work from being dropped).
fn forward_backward(x: Tensor<3>, f: impl Fn(Tensor<3>) -> Tensor<3>) {
    let grads = f(x.clone()).sum().backward();
    let g = x.grad(&grads).expect("the input takes part");
    let _ = g.slice([0..1, 0..1, 0..1]).into_scalar::<f32>();
}

fn components(c: &mut Criterion) {
    variorum_train::allocator::keep_freed_pages();
    variorum_train::threads::join_compute_pool();
    let device = Device::flex().autodiff();
    device.seed(0);
    let x: Tensor<3> = Tensor::random([BATCH, LEN, D], Distribution::Normal(0.0, 1.0), &device);

    let attn = MultiHeadAttentionConfig::default().init(D, 0.02, 0.02, Positioning::NONE, &device);
    let mask = AttentionMask::causal();
    c.bench_function("attention/full causal 12x64x128, 4 heads, fwd+bwd", |b| {
        b.iter(|| forward_backward(input(&x), |x| attn.forward(AttentionInput::self_attention(x, &mask), None).context))
    });

    let ffn = FeedForwardConfig::default().init(D, 0.0, 0.02, 0.02, &device);
    c.bench_function("ffn/gelu 128-512-128 on 12x64, fwd+bwd", |b| {
        b.iter(|| forward_backward(input(&x), |x| ffn.forward(x)))
    });

    let relu = FeedForwardConfig { kind: variorum_block::FeedForwardKind::Relu, ..Default::default() }
        .init(D, 0.0, 0.02, 0.02, &device);
    c.bench_function("ffn/relu 128-512-128 on 12x64, fwd+bwd", |b| {
        b.iter(|| forward_backward(input(&x), |x| relu.forward(x)))
    });

    // the floor under the three above: a leaf, one cheap op, the backward of a sum, one read
    c.bench_function("floor/x * 2 on 12x64x128, fwd+bwd", |b| {
        b.iter(|| forward_backward(input(&x), |x| x.mul_scalar(2.0)))
    });

    let norm = NormKind::LayerNorm.init(D, 1e-5, &device);
    c.bench_function("norm/layer-norm 12x64x128, fwd+bwd", |b| {
        b.iter(|| forward_backward(input(&x), |x| norm.forward(x)))
    });

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/gpt-baby-shakespeare-char.toml");
    let mut cfg = ExperimentConfig::load(&root).expect("the baby config loads");
    cfg.model.vocab_size = Some(84);
    let tc = cfg.train.clone();
    let mut model = Some(cfg.model.init(&device));
    let mut optim = optimizer(&tc);
    let ids: Vec<i64> = (0..BATCH * (LEN + 1)).map(|i| (i * 7919 % 84) as i64).collect();
    let (inputs, targets): (Vec<_>, Vec<_>) = (0..BATCH)
        .map(|r| {
            (ids[r * (LEN + 1)..r * (LEN + 1) + LEN].to_vec(), ids[r * (LEN + 1) + 1..(r + 1) * (LEN + 1)].to_vec())
        })
        .unzip();
    let batch = TokenBatch {
        inputs: inputs.concat(),
        targets: targets.concat(),
        batch_size: BATCH,
        seq_len: LEN,
        reset: vec![false; BATCH],
        tags: vec![],
        graphs: vec![],
        sources: vec![],
        starts: vec![],
        neighbours: vec![],
        hidden: vec![],
    };
    c.bench_function("step/baby GPT training step (768 tokens)", |b| {
        b.iter(|| {
            let (m, res) =
                train_step(model.take().unwrap(), &mut optim, &tc, std::slice::from_ref(&batch), tc.lr, &device, None);
            model = Some(m);
            let _ = res.loss.into_scalar::<f32>();
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = components
}
criterion_main!(benches);
