//! BigBird attention (Zaheer et al. 2020), the `bigbird` kind: every query block of b positions
//! attends to
//!
//! - its **window**: the `window_blocks` blocks on each side and its own (BigBird's blocked sliding
//!   window; causal: the blocks before it and itself up to the query),
//! - the **global** tokens (BigBird-ITC: the first `global_tokens` positions attend to every key
//!   and every query attends to them),
//! - r **random** blocks (`random_blocks`) chosen among the blocks outside its window.
//!
//! The random blocks of query block t are drawn from a ChaCha stream seeded by (`seed`, layer, t):
//! the pattern is fixed per layer, reproducible, and saved with the model (the seed is part of
//! the config a checkpoint carries). Causally, t's candidates are the blocks before its window,
//! so its pattern does not depend on the sequence length and cached decoding sees what the full
//! forward saw. Bidirectionally the candidates are all blocks outside the window.
//!
//! transformers' BigBird (the authors' ITC layout) is three settings of the kind: the last block
//! global too (`global_last_block`, with `global_tokens = block`: two global blocks), no random
//! draw outside training (`random_draw = "first-block"`: each random block is block 0, counted once
//! more per copy) and full attention for sequences of at most (5 + 2r)·b positions (`full_up_to`,
//! where its block layout does not fit). All three depend on where the sequence ends, so they
//! are bidirectional only.
//!
//! Computed by blocks: the window as a band ([`crate::engine::blocks`]), the random blocks as keys gathered
//! per query block ([`crate::engine::gathered`]), the global columns and rows, all in one softmax per
//! query: O(L·b·(2·window_blocks + 1 + r) + L·g) scores. Random keys are gathered, so position
//! schemes are limited to those acting through the distance (none, absolute, RoPE, ALiBi, T5).

use burn::prelude::*;
use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, T5BiasConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::{Band, BandPart, Pattern};
use crate::engine::blocks::sparse;
use crate::engine::gathered::KeySet;
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::{PatternCall, decode_runs};

attention_config! {
    /// `model.attention` with `kind = "bigbird"`.
    pub struct BigBirdConfig {
        /// b, positions per block. Default 64 (the paper's).
        pub block: usize = 64,
        /// Window blocks on each side of the query's block. Default 1 (3 blocks, as in the paper).
        pub window_blocks: usize = 1,
        /// r, random key blocks per query block. Default 3 (the paper's ITC setting).
        pub random_blocks: usize = 3,
        /// g, the first g positions are global. Default 64 (one block, as BigBird-ITC's first).
        pub global_tokens: usize = 64,
        /// Seed of the random blocks (mixed with the layer index). Default 0.
        pub seed: u64 = 0,
        /// The last block global too: positions (⌈L/b⌉ − 1)·b … L − 1 attend to every key and every
        /// query attends to them, as BigBird-ITC's second global block (the authors' code and
        /// transformers have the first and the last; with `global_tokens = block`). Bidirectional
        /// only: which block is last depends on the length. Default false.
        #[serde(skip_serializing_if = "is_false")]
        pub global_last_block: bool = false,
        /// Where the r random blocks come from ([`RandomDraw`]). Default `"seeded"`.
        #[serde(skip_serializing_if = "RandomDraw::is_seeded")]
        pub random_draw: RandomDraw = RandomDraw::Seeded,
        /// Sequences of at most this many positions get full attention: transformers' BigBird
        /// switches to full attention up to (5 + 2r)·b positions, where its block layout does not
        /// fit. Bidirectional only. Default 0 (never).
        #[serde(skip_serializing_if = "is_zero")]
        pub full_up_to: usize = 0,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]).
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

/// Where BigBird's random key blocks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RandomDraw {
    /// r blocks per query block drawn outside its window and the global blocks, fixed per layer
    /// by `seed` (the paper's: a fixed random pattern).
    #[default]
    Seeded,
    /// No draw: each of the r random blocks is block 0. What transformers' BigBird computes
    /// outside training (its draw returns zeros in eval mode): block 0's keys, already global, are
    /// then counted 1 + r times in every non-global query's softmax — the same as one copy with
    /// ln(1 + r) added to their scores. Bidirectional only, softmax without head temperatures.
    FirstBlock,
}

impl RandomDraw {
    fn is_seeded(&self) -> bool {
        *self == Self::Seeded
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl BigBirdConfig {
    /// Whether a setting ties the pattern to where the sequence ends (no causal form).
    fn needs_the_whole_sequence(&self) -> bool {
        self.global_last_block || self.random_draw == RandomDraw::FirstBlock || self.full_up_to > 0
    }

    /// This config as layer `i`'s (owned; [`AttentionKind::for_layer`]).
    pub fn with_layer(self, i: usize) -> Self {
        Self { layer: i, ..self }
    }

    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> BigBirdAttention {
        BigBirdAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            block: self.block,
            window_blocks: self.window_blocks,
            random_blocks: self.random_blocks,
            global_tokens: self.global_tokens,
            seed: self.seed,
            layer: self.layer,
            global_last_block: self.global_last_block,
            random_draw: self.random_draw,
            full_up_to: self.full_up_to,
        }
    }
}

impl AttentionKind for BigBirdConfig {
    type Module = BigBirdAttention;
    const SUMMARY: &'static str = "BigBird: blocked sliding window, global tokens (the first g positions) and r random blocks per query block, fixed per layer by a seed; computed block by block";
    const PAPER: &'static str = "Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences";
    const CAPS: Capabilities = Capabilities { gathers_keys: true, hides_padding: false, ..caps::BLOCKED_SCORES };
    head_kind_items!();

    fn capabilities(&self) -> Capabilities {
        match self.needs_the_whole_sequence() {
            true => Capabilities { causal: false, incremental: false, ..Self::CAPS },
            false => Self::CAPS,
        }
    }

    fn why_not_causal(&self) -> &'static str {
        "global_last_block, random_draw = \"first-block\" and full_up_to depend on where the sequence ends"
    }

    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.block >= 1, || "model.attention.block must be at least 1".into())?;
        check(
            self.random_draw == RandomDraw::Seeded
                || (self.normaliser == crate::engine::normaliser::Normaliser::Softmax && !self.head_temperature),
            || {
                "model.attention.random_draw = \"first-block\" counts block 0's keys again in a softmax: \
                 it needs normaliser = \"softmax\" and no head_temperature"
                    .into()
            },
        )
    }

    /// Multiply–adds per token: the window and random blocks, the global tokens.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let keys = self.block * (2 * self.window_blocks + 1 + self.random_blocks) + self.global_tokens;
        self.heads().flops_per_token(d_model, keys.min(len_k))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // the harness's sequences span several blocks, so random blocks exist past the window
        [
            (PositionConfig::Alibi(Default::default()), 2),
            (PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16, shared: false }), 0),
        ]
        .into_iter()
        .map(|(position, global_tokens)| {
            let cfg = Self {
                block: 2,
                window_blocks: 1,
                random_blocks: 2,
                global_tokens,
                n_kv_heads: Some(2),
                ..Default::default()
            };
            TestVariant::new(format!("{global_tokens} global + position {}", position.kind()), cfg)
                .with_position(position)
        })
        .collect()
    }
}

/// A BigBird layer ([`BigBirdConfig`]): blocked window, global tokens and random blocks.
#[derive(Module, Debug)]
pub struct BigBirdAttention {
    /// The multi-head attention the pattern restricts: projections, position scheme, normaliser.
    pub attention: MultiHeadAttention,
    /// b, positions per block.
    pub block: usize,
    /// Window blocks on each side of the query's block.
    pub window_blocks: usize,
    /// r, random key blocks per query block.
    pub random_blocks: usize,
    /// g: the first g positions are global.
    pub global_tokens: usize,
    /// Seed of the random blocks, mixed with `layer`.
    pub seed: u64,
    /// The layer's index, mixed into the random blocks' seed so each layer draws its own.
    pub layer: usize,
    /// The last block global too.
    pub global_last_block: bool,
    /// Where the random blocks come from.
    #[module(skip)]
    pub random_draw: RandomDraw,
    /// Full attention up to this many positions.
    pub full_up_to: usize,
}

impl BigBirdAttention {
    /// The random key blocks of query block `t` (sorted), with `blocks` blocks in the sequence.
    pub fn random_blocks(&self, t: usize, blocks: usize, causal: bool) -> Vec<usize> {
        if self.random_draw == RandomDraw::FirstBlock {
            return vec![0; self.random_blocks];
        }
        let b = self.block;
        let last = self.global_last_block.then(|| blocks.saturating_sub(1));
        let candidates: Vec<usize> = (0..if causal { t } else { blocks })
            .filter(|&v| v.abs_diff(t) > self.window_blocks && (v + 1) * b > self.global_tokens && Some(v) != last)
            .collect();
        let stream = self.seed ^ (self.layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (t as u64) << 20;
        let mut rng = ChaCha8Rng::seed_from_u64(stream);
        let mut picked: Vec<usize> = candidates.choose_multiple(&mut rng, self.random_blocks).copied().collect();
        picked.sort_unstable();
        picked
    }

    /// The global positions of a sequence of `len`: the first `global_tokens`, and the last
    /// block's with `global_last_block`.
    fn global(&self, len: usize) -> Vec<usize> {
        let mut global: Vec<usize> = (0..self.global_tokens.min(len)).collect();
        if self.global_last_block && len > 0 {
            let from = (len.div_ceil(self.block) - 1) * self.block;
            global.extend((from..len).filter(|&k| k >= self.global_tokens));
        }
        global
    }

    /// How many times query `q` scores key `k` in a sequence of `len` (`random`: the random
    /// blocks of `q`'s block): 0 where it does not see it, 1 + r for block 0's keys under
    /// [`RandomDraw::FirstBlock`] (a copy per random block), else 1.
    fn visits(&self, q: usize, k: usize, len: usize, random: &[usize], causal: bool) -> usize {
        if causal && k > q {
            return 0;
        }
        let global = |pos: usize| {
            pos < self.global_tokens || (self.global_last_block && pos / self.block == len.div_ceil(self.block) - 1)
        };
        if global(q) {
            return 1;
        }
        let (bq, bk) = (q / self.block, k / self.block);
        let seen = global(k) || bq.abs_diff(bk) <= self.window_blocks;
        match self.random_draw {
            RandomDraw::FirstBlock => usize::from(seen) + if bk == 0 { self.random_blocks } else { 0 },
            RandomDraw::Seeded => usize::from(seen || random.binary_search(&bk).is_ok()),
        }
    }

    fn window(&self, causal: bool) -> Band {
        let reach = self.window_blocks * self.block;
        Band { back: reach, ahead: reach, block: self.block, query_blocks: true, causal }
    }

    /// [`Self::forward_with`] without `dense`, `[b, len_q, d_model]`; `cache` holds the earlier
    /// positions' keys and values when decoding.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(&self, input: AttentionInput, cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        // a sequence the block layout does not fit: full attention, on the engine's own path
        let cached = cache.as_ref().map_or(0, |c| c.len());
        let keys = input.key_value.as_ref().unwrap_or(&input.query).dims()[1];
        if input.mask.k_start + cached + keys <= self.full_up_to {
            return self.attention.forward(input, cache);
        }
        let call = PatternCall::new(&self.attention, input, cache, dense);
        let (p, causal) = (&call.p, call.causal());
        let len = p.layout.k_start + p.layout.len_k;
        let blocks = len.max(p.layout.q_start + p.layout.len_q).div_ceil(self.block);
        let b = self.block;
        if call.decoding() {
            // one new token: its window blocks, its random blocks and the global tokens (only
            // its own block's random draw is needed; the settings that read the sequence's end
            // have no causal form)
            let q = p.layout.q_start;
            let t = q / b;
            let random = self.random_blocks(t, blocks, true);
            let mut runs = vec![t.saturating_sub(self.window_blocks) * b..q + 1, 0..self.global_tokens];
            runs.extend(random.iter().map(|&v| v * b..(v + 1) * b));
            let context = decode_runs(&self.attention, p, &runs, &[], |_, k| {
                self.visits(q, k, len, &random, true) == 0 || p.max_back.is_some_and(|n| q - k > n)
            });
            return PatternCall::output(&self.attention, context);
        }
        let random: Vec<Vec<usize>> = (0..blocks).map(|t| self.random_blocks(t, blocks, causal)).collect();
        let global = self.global(len);
        if call.fresh() {
            // seeded random blocks lie outside the window and the global blocks; block 0's
            // copies under `first-block` are counted again on purpose
            let again = self.random_draw == RandomDraw::FirstBlock;
            let mut keys = KeySet::new(
                1,
                len,
                b,
                self.random_blocks * b,
                |_, t, s| random[t].get(s / b).map(|&v| v * b + s % b),
                |_, q, k| (again || global.binary_search(&k).is_err()) && (!causal || k <= q),
            );
            keys.repeats = again;
            let window = BandPart { bands: vec![self.window(causal)], dilation: 1, heads: Vec::new() };
            let pattern = Pattern { block: b, bands: &[window], global: &global, extra: Some(&keys) };
            PatternCall::output(&self.attention, sparse(&self.attention, p, &pattern))
        } else {
            let visits = |q: usize, k: usize| self.visits(q, k, len, &random[q / b], causal);
            match self.random_draw {
                RandomDraw::Seeded => call.dense(&self.attention, 1, |_, _, q, k| visits(q, k) == 0),
                RandomDraw::FirstBlock => call.dense_counted(&self.attention, |q, k| visits(q, k)),
            }
        }
    }
}

impl AttentionMechanism for BigBirdAttention {
    // The cache grows with every position (global tokens and random blocks reach back to 0).
    kv_cache_hooks!();

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
