//! `[model]`: one value per axis, validated before anything is built.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_attention::AttentionConfig;
use variorum_block::{BlockConfig, DepthConfig, FeedForwardConfig, MemoryConfig};
use variorum_core::{ConfigError, error::check};
use variorum_position::PositionConfig;

use crate::DecoderLm;
use crate::decision::DecisionConfig;
use crate::encoder::{EncoderConfig, ModelKind};
use crate::exits::ExitConfig;
use crate::long_term_memory::LongTermMemoryConfig;
use crate::objective::ObjectiveConfig;

/// `[model]`: one value per axis (position, attention, block, feed-forward, memory, depth, …)
/// and the sizes; [`ModelConfig::validate`] checks it before anything is built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// `decoder` (default): a decoder-only language model; `encoder-decoder`: an encoder over a
    /// source and a decoder that reads it by cross-attention ([`crate::encoder`]).
    pub kind: ModelKind,
    /// Vocabulary size. Default: the tokenizer's; a smaller value is refused.
    pub vocab_size: Option<usize>,
    /// Width of the residual stream. Default 128.
    pub d_model: usize,
    /// Number of blocks. Default 4.
    pub n_layers: usize,
    /// Context length the model is trained on. Default 64.
    pub seq_len: usize,
    /// Dropout on embeddings, residual branches and the FFN hidden layer. Default 0.
    pub dropout: f64,
    /// Share the token embedding with the output projection (Press & Wolf 2017). Default true.
    pub tie_embeddings: bool,
    /// Multiply the token embeddings by √d_model before adding positions (Vaswani et al. §3.4),
    /// so that a fixed sinusoidal signal of amplitude 1 does not drown tokens embedded with a
    /// small `init_std`. Default false (GPT).
    pub scale_embeddings: bool,
    /// Normalise the embedded input (tokens plus absolute positions) with the blocks' norm kind
    /// and ε before the first block: BLOOM's `word_embeddings_layernorm`, BERT's embedding
    /// LayerNorm. Default false.
    pub embedding_norm: bool,
    /// A dense layer (`d_model` → `d_model`, with a bias) on the embedded input, after
    /// `embedding_norm`: FNet's embedding projection. Default false.
    pub embedding_projection: bool,
    /// The output head adds a learned bias per vocabulary entry to the logits, tied
    /// embeddings or not (GPT-J's and Phi's `lm_head`, BERT's MLM decoder). Default false.
    pub head_bias: bool,
    /// A dense layer, the feed-forward kind's activation and the blocks' norm before the output
    /// head: BERT's, RoBERTa's and FNet's masked-LM prediction head ([`crate::HeadTransform`]).
    /// Default false.
    pub head_transform: bool,
    /// Multiply the vector the output head reads by 1/√d_model: T5's tied head (Mesh
    /// TensorFlow), which reads the embedding matrix at the scale of the model's stream.
    /// Default false.
    pub scale_head: bool,
    /// std of the normal initialisation of weights (GPT-2: 0.02); residual output
    /// projections get `init_std / √(2·n_layers)`. Default 0.02.
    pub init_std: f64,
    /// Position scheme: absolute (added to the input) or relative (inside every attention layer).
    pub position: PositionConfig,
    /// The self-attention, chosen by `kind`. Default `full` (multi-head scaled dot-product).
    pub attention: AttentionConfig,
    /// Attend at most this many positions back, whatever the attention kind (score-forming
    /// kinds only): a hard limit on top of the kind's own pattern. Full attention then runs as
    /// a band computed by blocks, and KV caches keep only the last `max_back` keys. Default none.
    pub max_back: Option<usize>,
    /// The block's residual wiring and norms, chosen by `kind`. Default `pre-ln`.
    pub block: BlockConfig,
    /// The position-wise feed-forward network. Default GELU, `d_ff = 4 · d_model`.
    pub feed_forward: FeedForwardConfig,
    /// Memory of earlier segments (Transformer-XL, Compressive). Default none.
    pub memory: MemoryConfig,
    /// `stack` (default): n_layers distinct blocks; `universal`: one block applied n_layers
    /// times, with Adaptive Computation Time.
    pub depth: DepthConfig,
    /// Early exits after every block (Depth-Adaptive Transformer, CALM). Default none.
    pub exits: ExitConfig,
    /// `causal` (default): next-token prediction; `masked`: BERT's masked language model under
    /// bidirectional attention; `span-corruption`: T5's denoising (encoder–decoder models).
    pub objective: ObjectiveConfig,
    /// Encoder–decoder models: the encoder's depth and attention (default: the decoder's).
    pub encoder: EncoderConfig,
    /// Encoder–decoder models: the decoder's cross-attention over the source. Default `full`.
    pub cross_attention: Option<AttentionConfig>,
    /// Encoder–decoder models: a token of the vocabulary that ends every target (T5's `</s>`,
    /// id 1) instead of an embedding row of its own after the vocabulary. Default: the extra row.
    pub end_token: Option<usize>,
    /// Encoder–decoder models: the decoder's first input (T5's `<pad>`, id 0). Default: the end
    /// token.
    pub start_token: Option<usize>,
    /// SPALM's gated long-term memory before the output head, reading neighbours retrieved
    /// from a datastore (`data.neighbours`). Default none.
    pub long_term_memory: Option<LongTermMemoryConfig>,
    /// `[model.decision]`: the Decision Transformer's settings (`kind = "decision-transformer"`;
    /// [`crate::decision`]). Default: its defaults there, absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionConfig>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::Decoder,
            vocab_size: None,
            d_model: 128,
            n_layers: 4,
            seq_len: 64,
            dropout: 0.0,
            tie_embeddings: true,
            scale_embeddings: false,
            embedding_norm: false,
            embedding_projection: false,
            head_bias: false,
            head_transform: false,
            scale_head: false,
            init_std: 0.02,
            position: PositionConfig::default(),
            attention: AttentionConfig::default(),
            max_back: None,
            block: BlockConfig::default(),
            feed_forward: FeedForwardConfig::default(),
            memory: MemoryConfig::None(Default::default()),
            depth: DepthConfig::Stack,
            exits: ExitConfig::None,
            objective: ObjectiveConfig::Causal,
            encoder: EncoderConfig::default(),
            cross_attention: None,
            end_token: None,
            start_token: None,
            long_term_memory: None,
            decision: None,
        }
    }
}

/// The most layers [`ModelConfig::validate`] accepts.
pub const MAX_LAYERS: usize = 10_000;
/// The widest residual stream (`d_model`), and the most query width (`n_heads × head_dim`), it
/// accepts.
pub const MAX_WIDTH: usize = 1 << 17;

impl ModelConfig {
    /// Checks every axis, the sizes and the rules between the axes ([`crate::rules`]); messages
    /// name the config key and a value that works.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.d_model > 0, || "model.d_model must be at least 1".into())?;
        check(self.n_layers > 0, || "model.n_layers must be at least 1".into())?;
        // A model is built before weights are read into it: each layer's modules cost memory even
        // while its parameters are still lazy (≈ 23 KiB), and a few small tensors sized by a width
        // are built at once. A config from elsewhere with an absurd depth or width would exhaust
        // memory before the weights could refuse it. DeepNet's 1,000 layers and PaLM's 18,432
        // wide stream are the largest trained; the limits are well beyond them.
        check(self.n_layers <= MAX_LAYERS, || {
            format!("model.n_layers = {} is more than {MAX_LAYERS}, the deepest model variorum builds", self.n_layers)
        })?;
        check(self.d_model <= MAX_WIDTH, || {
            format!("model.d_model = {} is more than {MAX_WIDTH}, the widest model variorum builds", self.d_model)
        })?;
        let h = self.attention.heads(self.d_model);
        check(h.n_heads.saturating_mul(h.head_dim) <= MAX_WIDTH, || {
            format!(
                "model.attention: {} heads of {} ({} in all) are more than {MAX_WIDTH}, the widest attention variorum builds",
                h.n_heads,
                h.head_dim,
                h.n_heads.saturating_mul(h.head_dim)
            )
        })?;
        check(self.seq_len > 0, || "model.seq_len must be at least 1".into())?;
        check(self.vocab_size != Some(0), || "model.vocab_size must be at least 1".into())?;
        check((0.0..1.0).contains(&self.dropout), || format!("model.dropout = {} must be in [0, 1)", self.dropout))?;
        check(self.init_std > 0.0, || format!("model.init_std = {} must be > 0", self.init_std))?;
        self.attention.validate(self.d_model)?;
        self.attention.validate_len(self.seq_len)?;
        self.position.validate(self.attention.heads(self.d_model), self.seq_len)?;
        self.objective.validate()?;
        if !self.objective.is_causal() {
            self.validate_masked()?;
        }
        self.block.validate()?;
        self.memory.validate(self.seq_len)?;
        self.depth.validate()?;
        self.exits.validate()?;
        self.validate_encoder_decoder()?;
        match (self.kind, &self.decision) {
            (ModelKind::DecisionTransformer, d) => d.clone().unwrap_or_default().validate(self)?,
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    "model.decision is set, but model.kind is not \"decision-transformer\": set it, or remove [model.decision]",
                ));
            }
            (_, None) => {}
        }
        if let Some(l) = &self.long_term_memory {
            l.validate()?;
        }
        crate::rules::check_rules(self)?;
        self.feed_forward.validate()
    }

    /// The same config with every derived default written out (head counts and sizes, FFN width,
    /// position table size), as saved in a run directory and shown by `variorum inspect`.
    pub fn expanded(&self) -> Self {
        let (encoder, cross_attention) = match self.is_encoder_decoder() {
            true => (
                EncoderConfig {
                    n_layers: Some(self.encoder_layers()),
                    attention: Some(self.encoder_attention().expanded(self.d_model)),
                },
                Some(self.cross_attention().expanded(self.d_model)),
            ),
            false => (self.encoder.clone(), self.cross_attention.clone()),
        };
        Self {
            position: self.position.expanded(self.seq_len),
            attention: self.attention.expanded(self.d_model),
            feed_forward: self.feed_forward.expanded(self.d_model),
            encoder,
            cross_attention,
            ..self.clone()
        }
    }

    /// Fills in what the data decides (the vocabulary size) and checks it.
    pub fn resolve(&mut self, tokenizer_vocab: usize) -> Result<(), ConfigError> {
        match self.vocab_size {
            Some(v) => check(v >= tokenizer_vocab, || {
                format!(
                    "model.vocab_size = {v} is smaller than the tokenizer's vocabulary ({tokenizer_vocab}): remove the key or raise it"
                )
            })?,
            None => self.vocab_size = Some(tokenizer_vocab),
        }
        self.check_mask_token()?;
        self.check_sequence_tokens()
    }

    /// A mask token of the vocabulary's own is one of its tokens.
    fn check_mask_token(&self) -> Result<(), ConfigError> {
        if let (ObjectiveConfig::Masked(m), Some(vocab)) = (&self.objective, self.vocab_size)
            && let Some(id) = m.mask_token
        {
            check(id < vocab, || {
                format!("model.objective.mask_token = {id} is not a token of the vocabulary ({vocab} tokens)")
            })?;
        }
        Ok(())
    }

    /// Rows of the embedding: the text vocabulary, plus the mask token of the masked objective
    /// (unless the vocabulary has its own), or an encoder–decoder's end token and span
    /// corruption's sentinels.
    pub fn vocab(&self) -> usize {
        let end_row = self.is_encoder_decoder() && self.end_token.is_none();
        let special = usize::from(end_row) + self.sentinels().map_or(0, |s| s.0);
        let extra_mask = matches!(&self.objective, ObjectiveConfig::Masked(m) if m.mask_token.is_none());
        self.vocab_size.unwrap_or(256) + usize::from(extra_mask) + special
    }

    /// The mask token's id under the masked objective: the vocabulary's own, or the last
    /// embedding row.
    pub fn mask_token(&self) -> Option<usize> {
        match &self.objective {
            ObjectiveConfig::Masked(m) => Some(m.mask_token.unwrap_or(self.vocab_size.unwrap_or(256))),
            _ => None,
        }
    }

    /// What the masked objective needs: bidirectional attention, and none of the pieces that only
    /// make sense left to right.
    fn validate_masked(&self) -> Result<(), ConfigError> {
        let refuse = |what: &str, why: &str| {
            Err(ConfigError::new(format!("{what} cannot be used with model.objective.kind = \"masked\": {why}")))
        };
        if !self.memory.is_none() {
            return refuse("model.memory", "a memory carries earlier segments of a left-to-right stream");
        }
        if !matches!(self.exits, ExitConfig::None) {
            return refuse("model.exits", "early exits are decided token by token while generating");
        }
        if self.max_back.is_some() {
            return refuse("model.max_back", "it limits how far back a causal query reaches");
        }
        self.check_mask_token()
    }

    /// Builds the model. Call [`validate`](Self::validate) (and [`resolve`](Self::resolve)) first.
    /// Its parameters' ids come from their paths in the model, so two models of one config
    /// write byte-identical weights and optimizer files when their numbers agree. Position
    /// parameters shared by a stack start as the first layer's ([`DecoderLm::tie_positions`]).
    pub fn init(&self, device: &Device) -> DecoderLm {
        DecoderLm::new(self, device).map(&mut crate::param_ids::PathIds::default()).tie_positions()
    }

    /// Forward FLOPs per token (2 per multiply–add), with every query attending over the full
    /// `seq_len` keys (the usual estimate; causal masking does not shrink dense attention's work).
    /// Training costs about three times this (forward + backward).
    /// Layers with their own settings count their own (Lazyformer's reusing layers form no
    /// scores).
    pub fn flops_per_token(&self) -> u64 {
        let layer = |i: usize| {
            let attention = self.attention.for_layer(if self.depth.shared() { 0 } else { i });
            attention.flops_per_token(self.d_model, self.seq_len) + self.feed_forward.flops_per_token(self.d_model)
        };
        let layers = (0..self.n_layers).map(layer).sum::<u64>();
        if self.kind == ModelKind::DecisionTransformer {
            return layers + self.decision.clone().unwrap_or_default().flops_per_token(self.d_model);
        }
        let decoder = layers + 2 * (self.d_model * self.vocab()) as u64;
        if !self.is_encoder_decoder() {
            return decoder;
        }
        // a source token through the encoder, and each target token's cross-attention over a
        // source as long as the context
        let (encoder, cross) = (self.encoder_attention(), self.cross_attention());
        let encoder = (0..self.encoder_layers())
            .map(|i| {
                encoder.for_layer(i).flops_per_token(self.d_model, self.seq_len)
                    + self.feed_forward.flops_per_token(self.d_model)
            })
            .sum::<u64>();
        decoder + encoder + self.n_layers as u64 * cross.flops_per_token(self.d_model, self.seq_len)
    }
}
