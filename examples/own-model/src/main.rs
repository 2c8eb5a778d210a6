//! variorum's blocks inside your own Burn model, trained by your own loop, on the backend you pick.
//!
//! `Classifier` is an ordinary Burn module: a token embedding, two of variorum's
//! `TransformerBlock`s (the attention kind and position scheme chosen from a TOML snippet, as a
//! user would from their own config), a norm and a linear head. Its task: say whether token 1
//! occurs more often than token 2 in a sequence, read from the *last* position under a causal mask,
//! so everything the head sees has come through attention from earlier positions.
//!
//! Run: `cargo run --release -p variorum-example-own-model -- [ATTENTION_TOML]`, e.g.
//! `-- 'kind = "linear"'` or `-- 'kind = "lsh"'`. With `--features wgpu` it trains on the GPU.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use variorum_attention::{AttentionConfig, CarriedMaps, Positioning};
use variorum_block::block::BlockParts;
use variorum_block::{BlockConfig, FeedForwardConfig, MemoryConfig, TransformerBlock};
use variorum_core::AttentionMask;
use variorum_position::{PositionConfig, RotaryConfig};

const VOCAB: usize = 8;
const LEN: usize = 16;
const D: usize = 32;

/// A user's model: variorum provides the blocks, the user everything around them.
#[derive(Module, Debug)]
pub struct Classifier {
    embedding: Embedding,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Linear,
}

impl Classifier {
    /// `attention` is any registered attention kind; `position` a relative scheme it applies
    /// inside (RoPE), or none.
    pub fn new(attention: &AttentionConfig, position: &PositionConfig, device: &Device) -> Self {
        let parts = BlockParts {
            d_model: D,
            attention,
            position: Positioning { config: position, context: LEN },
            feed_forward: &FeedForwardConfig::default(),
            memory: &MemoryConfig::None(Default::default()),
            cross: None,
            dropout: 0.0,
            init_std: 0.02,
            out_std: 0.02 / 2.0,
        };
        Self {
            embedding: EmbeddingConfig::new(VOCAB, D).init(device),
            blocks: (0..2)
                .map(|layer| {
                    BlockConfig::default().init(&BlockParts { attention: &attention.for_layer(layer), ..parts }, device)
                })
                .collect(),
            norm: LayerNormConfig::new(D).init(device),
            head: LinearConfig::new(D, 2).init(device),
        }
    }

    /// Logits `[batch, 2]` for tokens `[batch, LEN]`.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<2> {
        let mask = AttentionMask::causal();
        let mut x = self.embedding.forward(tokens);
        // the slot in which blocks hand attention maps to the next (RealFormer, Lazyformer)
        let mut carried = CarriedMaps::default();
        for block in &self.blocks {
            x = block.forward(x, &mask, None, None, Some(&mut carried), false).x;
        }
        let [batch, len, d] = x.dims();
        let last = x.slice([0..batch, len - 1..len, 0..d]).reshape([batch, d]);
        self.head.forward(self.norm.forward(last))
    }
}

/// A batch of sequences and their labels (1: more 1s than 2s), from a seeded generator.
pub fn batch(seed: u64, size: usize, device: &Device) -> (Tensor<2, Int>, Tensor<1, Int>) {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut tokens = Vec::with_capacity(size * LEN);
    let mut labels = Vec::with_capacity(size);
    for _ in 0..size {
        let row: Vec<i64> = (0..LEN).map(|_| (next() % VOCAB) as i64).collect();
        let count = |t: i64| row.iter().filter(|&&x| x == t).count();
        labels.push(i64::from(count(1) > count(2)));
        tokens.extend(row);
    }
    (
        Tensor::from_data(TensorData::new(tokens, [size, LEN]), device),
        Tensor::from_data(TensorData::new(labels, [size]), device),
    )
}

/// The position scheme the example pairs with `attention`: RoPE where the kind rotates queries
/// and keys, none otherwise (counting needs no positions).
pub fn position_for(attention: &AttentionConfig) -> PositionConfig {
    if attention.capabilities().qk_rotation {
        PositionConfig::Rope(RotaryConfig::default())
    } else {
        PositionConfig::None(Default::default())
    }
}

/// Trains `steps` steps of AdamW on fresh batches; returns the model and the held-out accuracy.
pub fn train(attention: &AttentionConfig, steps: usize, device: &Device) -> (Classifier, f32) {
    let device = device.clone().autodiff();
    let mut model = Classifier::new(attention, &position_for(attention), &device);
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for step in 0..steps {
        let (x, y) = batch(step as u64, 32, &device);
        let loss = loss_fn.forward(model.forward(x), y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    let valid = model.valid();
    let (x, y) = batch(1 << 40, 512, &device.clone().without_autodiff());
    let correct = valid.forward(x).argmax(1).reshape([512]).equal(y).int().sum().into_scalar::<i64>();
    (model, correct as f32 / 512.0)
}

fn main() {
    let attention: AttentionConfig = match std::env::args().nth(1) {
        Some(text) => match toml::from_str(&text) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: the attention table: {e}");
                std::process::exit(2);
            }
        },
        None => AttentionConfig::default(),
    };
    if let Err(e) = attention.validate(D) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    #[cfg(feature = "wgpu")]
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    #[cfg(not(feature = "wgpu"))]
    let device = Device::flex();
    let (_, accuracy) = train(&attention, 300, &device);
    println!("attention {}: held-out accuracy {:.1} %", attention.kind(), 100.0 * accuracy);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocks_learn_the_task_in_a_users_own_loop() {
        let device = Device::flex();
        device.seed(1);
        for toml_text in ["kind = \"full\"\nn_kv_heads = 1", "kind = \"linear\""] {
            let attention: AttentionConfig = toml::from_str(toml_text).unwrap();
            let (_, accuracy) = train(&attention, 250, &device);
            assert!(accuracy > 0.9, "{toml_text}: held-out accuracy {accuracy}");
        }
    }
}
