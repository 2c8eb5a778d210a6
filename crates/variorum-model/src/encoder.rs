//! The encoder of an encoder–decoder model (`model.kind = "encoder-decoder"`; the Transformer of
//! Vaswani et al. 2017):
//!
//! source tokens → embedding (+ absolute positions) → N bidirectional blocks → (final norm) → the
//! encoded source, which every decoder block's cross-attention reads ([`variorum_block::cross`]).
//!
//! The encoder shares the decoder's token embedding and absolute position signal (one vocabulary
//! for source and target, as in T5 and Vaswani et al.'s shared BPE); its blocks have their own
//! attention (`model.encoder.attention`, by default `model.attention`) under a bidirectional mask
//! that hides the source's padding, with the model's relative position scheme inside (the rules
//! check the encoder's attention against it as they check the decoder's).
//!
//! The embedding gets one row after the text vocabulary, the end token (`</s>`): the decoder's
//! first input and the last target of every example, where generation stops. Span corruption
//! adds its sentinel tokens after it.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_attention::{AttentionConfig, CarriedMaps};
use variorum_block::{Norm, TransformerBlock};
use variorum_core::{AttentionMask, AuxLosses, ConfigError, EncodedSource, error::check};

use crate::ModelConfig;
use crate::exits::ExitConfig;

/// `model.kind`: what the blocks are composed into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A decoder-only language model (GPT, or BERT under the masked objective).
    #[default]
    Decoder,
    /// An encoder and a decoder with cross-attention (sequence-to-sequence, span corruption).
    EncoderDecoder,
    /// The Decision Transformer over (return-to-go, state, action) steps ([`crate::decision`]).
    DecisionTransformer,
}

/// `[model.encoder]` (encoder–decoder models).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderConfig {
    /// Encoder blocks. Default: `model.n_layers`.
    pub n_layers: Option<usize>,
    /// The encoder's self-attention, bidirectional. Default: `model.attention`.
    pub attention: Option<AttentionConfig>,
}

/// The source of each batch row: token ids `[batch, len]`, padded at the end, and where
/// (`[batch, len]`, true = padding; `None` when every row fills the length).
#[derive(Debug, Clone)]
pub struct Source {
    /// Token ids `[batch, len]`, padded at the end with 0.
    pub tokens: Tensor<2, Int>,
    /// `[batch, len]`, true at padding; `None` when every row fills the length.
    pub padding: Option<Tensor<2, Bool>>,
}

impl Source {
    /// Rows of token ids, padded at the end to the longest.
    pub fn from_rows(rows: &[Vec<u32>], device: &Device) -> Self {
        let (b, len) = (rows.len(), rows.iter().map(Vec::len).max().unwrap_or(1).max(1));
        let tokens: Vec<i64> =
            rows.iter().flat_map(|r| (0..len).map(move |j| r.get(j).map_or(0, |&t| i64::from(t)))).collect();
        let pad: Vec<bool> = rows.iter().flat_map(|r| (0..len).map(move |j| j >= r.len())).collect();
        let padded = pad.iter().any(|&p| p);
        Self {
            tokens: Tensor::from_data(TensorData::new(tokens, [b, len]), device),
            padding: padded.then(|| Tensor::from_data(TensorData::new(pad, [b, len]), device)),
        }
    }
}

/// The encoder of an encoder–decoder: bidirectional blocks over the embedded source (the
/// embedding is the decoder's).
#[derive(Module, Debug)]
pub struct Encoder {
    /// `model.encoder.n_layers` blocks, each with the encoder's attention.
    pub blocks: Vec<TransformerBlock>,
    /// Present for pre-LN stacks.
    pub final_norm: Option<Norm>,
}

impl Encoder {
    /// Runs the blocks over embedded source rows `x` `[batch, len, d]` under a bidirectional mask
    /// that hides `padding`.
    pub fn forward(&self, x: Tensor<3>, padding: Option<Tensor<2, Bool>>) -> (EncodedSource, AuxLosses) {
        let len = x.dims()[1];
        let mask = AttentionMask { padding: padding.clone(), ..AttentionMask::bidirectional() };
        let dense = if self.blocks[0].attn.uses_dense_mask() { mask.score_mask(len, len, &x.device()) } else { None };
        let mut carried = CarriedMaps::default();
        let mut aux = AuxLosses::new();
        let mut x = x;
        for block in &self.blocks {
            let out = block.forward(x, &mask, dense.clone(), None, Some(&mut carried), false);
            aux.extend(out.aux_losses);
            x = out.x;
        }
        let hidden = match &self.final_norm {
            Some(n) => n.forward(x),
            None => x,
        };
        (EncodedSource { hidden, padding }, aux)
    }
}

impl ModelConfig {
    /// Whether `kind = "encoder-decoder"`.
    pub fn is_encoder_decoder(&self) -> bool {
        self.kind == ModelKind::EncoderDecoder
    }

    /// The encoder's blocks (encoder–decoder models).
    pub fn encoder_layers(&self) -> usize {
        self.encoder.n_layers.unwrap_or(self.n_layers)
    }

    /// The encoder's attention (encoder–decoder models).
    pub fn encoder_attention(&self) -> AttentionConfig {
        self.encoder.attention.clone().unwrap_or_else(|| self.attention.clone())
    }

    /// The decoder's cross-attention (encoder–decoder models). Default: `full`.
    pub fn cross_attention(&self) -> AttentionConfig {
        self.cross_attention.clone().unwrap_or_default()
    }

    /// The end token `</s>` of an encoder–decoder: `model.end_token`, or the first row after the
    /// text vocabulary.
    pub fn end_token(&self) -> Option<usize> {
        self.is_encoder_decoder().then(|| self.end_token.unwrap_or(self.vocab_size.unwrap_or(256)))
    }

    /// The decoder's first input (encoder–decoder models): `model.start_token`, or the end token.
    pub fn start_token(&self) -> Option<usize> {
        if !self.is_encoder_decoder() {
            return None;
        }
        self.start_token.or(self.end_token())
    }

    /// `model.end_token` and `model.start_token` are tokens of the vocabulary (once it is known).
    pub(crate) fn check_sequence_tokens(&self) -> Result<(), ConfigError> {
        let Some(vocab) = self.vocab_size else { return Ok(()) };
        for (key, id) in [("end_token", self.end_token), ("start_token", self.start_token)] {
            if let Some(id) = id {
                check(id < vocab, || format!("model.{key} = {id} is not a token of the vocabulary ({vocab} tokens)"))?;
            }
        }
        Ok(())
    }

    /// Span corruption's sentinel tokens: how many, and the first's id (after the end token).
    pub fn sentinels(&self) -> Option<(usize, usize)> {
        let crate::ObjectiveConfig::SpanCorruption(c) = &self.objective else { return None };
        Some((c.noise(self.seq_len).1, self.vocab_size.unwrap_or(256) + 1))
    }

    /// The encoder–decoder's own rules (and, on a decoder, that its keys are absent), each
    /// refusal naming the key.
    pub(crate) fn validate_encoder_decoder(&self) -> Result<(), ConfigError> {
        if !self.is_encoder_decoder() {
            check(self.encoder == EncoderConfig::default(), || {
                "model.encoder is set, but model.kind = \"decoder\" has no encoder: set model.kind = \"encoder-decoder\" or remove it".into()
            })?;
            check(self.cross_attention.is_none(), || {
                "model.cross_attention is set, but model.kind = \"decoder\" has no encoder to attend to: set model.kind = \"encoder-decoder\" or remove it".into()
            })?;
            check(self.end_token.is_none() && self.start_token.is_none(), || {
                "model.end_token and model.start_token are an encoder–decoder's (model.kind = \"encoder-decoder\"): remove them".into()
            })?;
            return check(!matches!(self.objective, crate::ObjectiveConfig::SpanCorruption(_)), || {
                "model.objective.kind = \"span-corruption\" trains an encoder and a decoder: set model.kind = \"encoder-decoder\"".into()
            });
        }
        check(
            self.end_token.is_none() || !matches!(self.objective, crate::ObjectiveConfig::SpanCorruption(_)),
            || {
                "model.end_token cannot be used with model.objective.kind = \"span-corruption\", whose end token and sentinels are rows after the vocabulary: remove it".into()
            },
        )?;
        self.check_sequence_tokens()?;
        let layers = self.encoder_layers();
        check((1..=crate::config::MAX_LAYERS).contains(&layers), || {
            format!("model.encoder.n_layers = {layers} must be in 1..={}", crate::config::MAX_LAYERS)
        })?;
        let encoder = self.encoder_attention();
        encoder.validate(self.d_model).map_err(|e| ConfigError::new(format!("model.encoder.attention: {e}")))?;
        check(encoder.capabilities().bidirectional, || {
            format!(
                "model.encoder.attention.kind = \"{}\" has no bidirectional form, which the encoder needs: set model.encoder.attention to a kind that has one (full, linear, …)",
                encoder.kind()
            )
        })?;
        check(encoder.capabilities().hides_padding, || {
            format!(
                "model.encoder.attention.kind = \"{}\" does not hide padded keys, and the encoder reads batches of sources of different lengths, padded: set model.encoder.attention to a kind that does (full, linear, …)",
                encoder.kind()
            )
        })?;
        let cross = self.cross_attention();
        cross.validate(self.d_model).map_err(|e| ConfigError::new(format!("model.cross_attention: {e}")))?;
        check(cross.capabilities().cross, || {
            format!(
                "model.cross_attention.kind = \"{}\" has no cross-attention form (queries over a source of another length): use one that declares it (`variorum zoo` lists them; full by default)",
                cross.kind()
            )
        })?;
        let refuse = |what: &str, why: &str| -> Result<(), ConfigError> {
            Err(ConfigError::new(format!("{what} cannot be used with model.kind = \"encoder-decoder\": {why}")))
        };
        if matches!(self.objective, crate::ObjectiveConfig::Masked(_)) {
            return refuse("model.objective.kind = \"masked\"", "use \"causal\" (paired data) or \"span-corruption\"");
        }
        if !self.memory.is_none() {
            return refuse("model.memory", "a memory carries a stream's earlier segments, and an example is whole");
        }
        if !matches!(self.exits, ExitConfig::None) {
            return refuse("model.exits", "early exits are not wired to the cross-attention's state");
        }
        if self.block.reversible() {
            return refuse("a reversible model.block", "its backward inverts blocks without a second input");
        }
        if self.depth.shared() {
            return refuse("model.depth.kind = \"universal\"", "use a stack of distinct blocks");
        }
        for (key, a) in [("model.attention", &self.attention), ("model.encoder.attention", &encoder)] {
            if a.capabilities().global_input {
                return refuse(
                    &format!("{key}.kind = \"{}\"", a.kind()),
                    "its global input is not built for the encoder",
                );
            }
            if a.capabilities().cross_layer {
                return refuse(
                    &format!("{key}.kind = \"{}\"", a.kind()),
                    "it carries maps between layers of one stack",
                );
            }
        }
        if self.position.capabilities().per_layer {
            return refuse(
                &format!("model.position.kind = \"{}\"", self.position.kind()),
                "its per-layer signals are the decoder's; use an input or relative scheme",
            );
        }
        // the encoder as a model of its own: a bidirectional stack of its depth and attention,
        // under every rule a model's attention meets (its length, the position scheme it carries)
        let as_encoder = ModelConfig {
            kind: ModelKind::Decoder,
            encoder: EncoderConfig::default(),
            cross_attention: None,
            end_token: None,
            start_token: None,
            long_term_memory: None,
            attention: encoder,
            n_layers: layers,
            objective: crate::ObjectiveConfig::Masked(Default::default()),
            max_back: None,
            ..self.clone()
        };
        as_encoder.validate().map_err(|e| ConfigError::new(format!("the encoder (model.encoder): {e}")))
    }
}
