//! Decoder-only language model (GPT; Radford et al. 2018), read top to bottom:
//!
//! tokens → embedding (+ absolute positions) → dropout → N blocks → (final norm, pre-LN) → logits
//!
//! Per-layer position signals (per-layer learned tables, the Universal Transformer's timestep
//! signal) are added to each block's input; relative schemes live inside each block's attention.
//!
//! Logits use the token embedding transposed when `tie_embeddings` (Press & Wolf 2017).

use burn::module::Param;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::log_softmax;
use variorum_attention::{CarriedMaps, Positioning};
use variorum_block::{
    Act, BlockOutput, LayerState, Norm, ReplayDropout, RevContext, Streams, TransformerBlock, block::BlockParts,
};
use variorum_core::{AttentionMask, AuxLosses, EncodedSource, GlobalLocal, GraphMask, REINFORCE_PREFIX};
use variorum_position::AbsolutePosition;

use crate::ModelConfig;
use crate::encoder::{Encoder, Source};
use crate::exit_predictor::ExitScores;
use crate::exits::{ExitConfig, ExitHeads};

/// Output of a forward pass.
#[derive(Debug)]
pub struct LmOutput {
    /// `[batch, len, vocab]`
    pub logits: Tensor<3>,
    /// Named auxiliary losses of the blocks (and ACT's `ponder` cost), already weighted
    /// ([`AuxLosses`]).
    pub aux_losses: AuxLosses,
    /// Steps each position took, `[batch, len]`, when Adaptive Computation Time decides.
    pub steps: Option<Tensor<2>>,
    /// Outputs of the blocks before the last, when the model has early exits.
    pub hidden: Vec<Tensor<3>>,
    /// `[batch, len, d_model]`: the vectors the output head read (the last block's output,
    /// after the final norm of a pre-LN stack): kNN-LM's keys.
    pub features: Tensor<3>,
}

/// What the caller of [`DecoderLm::run_blocks`] answers after each block.
// one value per block, moved at once: boxing the tensor would buy nothing
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Flow {
    /// Run the next block.
    Continue,
    /// Stop here (an early exit).
    Stop,
    /// Run the next block on this instead of the block's output (mixed training's copied
    /// states).
    ContinueWith(Tensor<3>),
}

/// The state a forward continues from and updates: the position of the next token, each
/// layer's KV cache or memory (and cross-attention state), and an encoder–decoder's encoded
/// source.
#[derive(Debug, Clone, Default)]
pub struct DecoderState {
    /// Position of the next token: the tokens run so far.
    pub position: usize,
    /// Per block application, its KV cache or memory and cross-attention state; empty until the
    /// first call.
    pub layers: Vec<LayerState>,
    /// Sum of the first block's outputs over the tokens so far `[batch, 1, d]`, kept by early-exit
    /// decoding for the sequence exit predictor (its input is their running mean).
    pub exit_summary: Option<Tensor<3>>,
    /// ETC: global tokens computed so far (one per completed segment).
    pub globals: usize,
    /// An encoder–decoder's encoded source, kept from the first call (the encoder runs once).
    pub source: Option<EncodedSource>,
}

impl DecoderState {
    /// Length of the memory context in front of the next tokens (0 without a memory).
    pub fn context_len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.memory.context_len())
    }
}

/// The language model a [`ModelConfig`] describes: embedding, blocks, output head, and whatever
/// the config adds (early exits, an encoder, SPALM's long-term memory).
#[derive(Module, Debug)]
pub struct DecoderLm {
    /// The token embedding `[vocab_size, d_model]`; also the output projection when tied.
    pub token_embedding: Embedding,
    /// The absolute position signal added to the embedded tokens; `None` for relative schemes.
    pub position: Option<AbsolutePosition>,
    /// Empty, or one signal per block added to its input.
    pub layer_positions: Vec<AbsolutePosition>,
    /// The norm of the embedded input (`model.embedding_norm`: BLOOM, BERT).
    pub embedding_norm: Option<Norm>,
    /// The dense layer after it (`model.embedding_projection`: FNet).
    pub embedding_projection: Option<Linear>,
    /// Dropout on the embedded input (`model.dropout`).
    pub embedding_dropout: Dropout,
    /// `depth` distinct blocks, or one shared block (Universal Transformer).
    pub blocks: Vec<TransformerBlock>,
    /// Block applications per forward (`model.n_layers`).
    pub depth: usize,
    /// Adaptive Computation Time's halting unit (Universal Transformer with ACT).
    pub act: Option<Act>,
    /// Present for pre-LN stacks, whose residual stream is never normalised otherwise.
    pub final_norm: Option<Norm>,
    /// Present when the output embedding is not tied.
    pub head: Option<Linear>,
    /// BERT's dense + activation + norm before the head (`model.head_transform`).
    pub head_transform: Option<crate::HeadTransform>,
    /// The logits' bias `[vocab_size]` (`model.head_bias`), tied head or not.
    pub head_bias: Option<Param<Tensor<1>>>,
    /// Rows of the embedding and width of the logits: the text vocabulary plus the special tokens
    /// ([`ModelConfig::vocab`]).
    pub vocab_size: usize,
    /// The context length trained on (`model.seq_len`).
    pub seq_len: usize,
    /// `model.max_back`: no query scores a key further back.
    pub max_back: Option<usize>,
    /// The auxiliary global token `[1, d_model]` (one per segment of the positions the
    /// attention's `global_segment` says), present when it declares a global input (ETC).
    pub global_embedding: Option<Param<Tensor<2>>>,
    /// ETC's contrastive predictive coding on the global tokens (`model.objective.cpc`).
    pub cpc: Option<crate::cpc::Cpc>,
    /// √d_model when `scale_embeddings`.
    pub embedding_scale: Option<f64>,
    /// Early exits: classifiers after the blocks before the last.
    pub exits: Option<ExitHeads>,
    /// A reversible stack ([`variorum_block::reversible`]), with this branch-output dropout.
    pub reversible: Option<f64>,
    /// How a reversible stack joins its two output streams for the head.
    #[module(skip)]
    pub stream_merge: variorum_block::StreamMerge,
    /// The masked objective's mask token (the last embedding row): attention is bidirectional and
    /// the loss ignores targets equal to it. `None`: next-token prediction, causal attention.
    pub mask_token: Option<usize>,
    /// An encoder–decoder's encoder ([`crate::encoder`]); its decoder blocks cross-attend to it.
    pub encoder: Option<Encoder>,
    /// An encoder–decoder's end token: where a target ends.
    pub end_token: Option<usize>,
    /// An encoder–decoder's start token: the decoder's first input (the end token unless
    /// `model.start_token` says otherwise).
    pub start_token: Option<usize>,
    /// The text vocabulary: embedding rows from here on are the special tokens the config adds
    /// (the mask token, an encoder–decoder's end token, sentinels).
    pub text_vocab: usize,
    /// 1/√d_model on the vector the head reads (`model.scale_head`: T5's tied head).
    pub head_scale: Option<f64>,
    /// SPALM's long-term memory before the head ([`crate::long_term_memory`]).
    pub long_term_memory: Option<crate::LongTermMemory>,
    /// Every layer of a stack reads the first layer's relative position parameters
    /// (`model.position`'s `shared`), kept so by [`tie_positions`](Self::tie_positions).
    pub tied_positions: bool,
}

impl DecoderLm {
    /// A freshly initialised model of `cfg` (validated and resolved): weights drawn from
    /// N(0, `init_std`²), residual output projections with std `init_std / √(2·n_layers)` (GPT-2).
    pub fn new(cfg: &ModelConfig, device: &Device) -> Self {
        let (d, vocab) = (cfg.d_model, cfg.vocab());
        let width = cfg.block.output_width(d);
        let init = Initializer::Normal { mean: 0.0, std: cfg.init_std };
        let out_std = cfg.init_std / (2.0 * cfg.n_layers as f64).sqrt();
        let parts = BlockParts {
            d_model: d,
            attention: &cfg.attention,
            position: Positioning { config: &cfg.position, context: cfg.seq_len },
            feed_forward: &cfg.feed_forward,
            memory: &cfg.memory,
            cross: None,
            dropout: cfg.dropout,
            init_std: cfg.init_std,
            out_std,
        };
        let norm = cfg.block.residual();
        let cross = cfg.is_encoder_decoder().then(|| cfg.cross_attention());
        let encoder = cfg.is_encoder_decoder().then(|| {
            let attention = cfg.encoder_attention();
            Encoder {
                blocks: (0..cfg.encoder_layers())
                    .map(|i| cfg.block.init(&BlockParts { attention: &attention.for_layer(i), ..parts }, device))
                    .collect(),
                final_norm: cfg.block.pre_norm().then(|| norm.norm.init(d, norm.norm_eps, device)),
            }
        });
        Self {
            token_embedding: EmbeddingConfig::new(vocab, d).with_initializer(init.clone()).init(device),
            position: cfg.position.init_input(d, cfg.seq_len, device),
            layer_positions: (0..cfg.n_layers)
                .filter_map(|i| cfg.position.init_layer(i, d, cfg.seq_len, device))
                .collect(),
            embedding_norm: cfg.embedding_norm.then(|| norm.norm.init(d, norm.norm_eps, device)),
            embedding_projection: cfg
                .embedding_projection
                .then(|| LinearConfig::new(d, d).with_initializer(init.clone()).init(device)),
            embedding_dropout: DropoutConfig::new(cfg.dropout).init(),
            blocks: (0..if cfg.depth.shared() { 1 } else { cfg.n_layers })
                .map(|i| {
                    let attention = cfg.attention.for_layer(i);
                    cfg.block.init(&BlockParts { attention: &attention, cross: cross.as_ref(), ..parts }, device)
                })
                .collect(),
            depth: cfg.n_layers,
            act: cfg.depth.init_act(d, cfg.init_std, device),
            // the stack's output: d_model wide, or both streams of a reversible one
            final_norm: cfg.block.pre_norm().then(|| norm.norm.init(width, norm.norm_eps, device)),
            head: (!cfg.tie_embeddings)
                .then(|| LinearConfig::new(width, vocab).with_bias(false).with_initializer(init).init(device)),
            head_transform: cfg
                .head_transform
                .then(|| crate::HeadTransform::new(d, &norm, cfg.feed_forward.kind, cfg.init_std, device)),
            head_bias: cfg.head_bias.then(|| Initializer::Zeros.init([vocab], device)),
            vocab_size: vocab,
            seq_len: cfg.seq_len,
            max_back: cfg.max_back,
            global_embedding: cfg
                .attention
                .capabilities()
                .global_input
                .then(|| Param::from_tensor(Tensor::random([1, d], Distribution::Normal(0.0, cfg.init_std), device))),
            cpc: cfg.objective.cpc().map(|c| crate::cpc::Cpc::new(d, c.weight, device)),
            embedding_scale: cfg.scale_embeddings.then(|| (d as f64).sqrt()),
            reversible: cfg.block.reversible().then_some(cfg.dropout),
            stream_merge: cfg.block.stream_merge(),
            mask_token: cfg.mask_token(),
            encoder,
            end_token: cfg.end_token(),
            start_token: cfg.start_token(),
            text_vocab: cfg.vocab_size.unwrap_or(256),
            head_scale: cfg.scale_head.then(|| 1.0 / (d as f64).sqrt()),
            long_term_memory: cfg.long_term_memory.as_ref().map(|l| l.init(d, device)),
            tied_positions: cfg.position.tied_across_layers(),
            exits: match &cfg.exits {
                ExitConfig::None => None,
                ExitConfig::EveryLayer(e) => Some(ExitHeads::new(
                    e,
                    cfg.n_layers,
                    d,
                    vocab,
                    cfg.init_std,
                    || norm.norm.init(d, norm.norm_eps, device),
                    device,
                )),
            },
        }
    }

    /// Full forward over fresh sequences `[batch, len]`.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> LmOutput {
        self.forward_with(tokens, None)
    }

    /// The attention probabilities of every block application over fresh sequences
    /// `[batch, len]`: one `[batch, heads, len, len]` per application, `None` where the kind
    /// forms no weights (kernelised, sorted-bucket kinds). Global tokens by id (Longformer) are
    /// marked as in the forward. A reversible stack, ACT, ETC's global input and encoder–decoders
    /// are refused (their blocks run under another schedule, or read a source).
    pub fn attention_maps(&self, tokens: Tensor<2, Int>) -> Result<Vec<Option<Tensor<4>>>, String> {
        if self.reversible.is_some() || self.act.is_some() || self.global_embedding.is_some() || self.encoder.is_some()
        {
            return Err(
                "attention maps are read from plain decoder stacks (not reversible, ACT, ETC or encoder–decoder models)"
                    .into(),
            );
        }
        let len = tokens.dims()[1];
        let ids = self.blocks[0].attn.global_token_ids();
        let global = (!ids.is_empty()).then(|| global_positions(&tokens, ids, 0));
        let mut x = self.embed(tokens, 0);
        let (mut mask, dense) = self.mask(len, None, &x.device());
        mask.global = global;
        let mut maps = Vec::with_capacity(self.depth);
        let mut carried = CarriedMaps::default();
        for i in 0..self.depth {
            let input = match self.layer_positions.get(i) {
                Some(p) => p.forward(x, mask.q_start),
                None => x,
            };
            let out =
                self.blocks[i % self.blocks.len()].forward(input, &mask, dense.clone(), None, Some(&mut carried), true);
            maps.push(out.weights);
            x = out.x;
        }
        Ok(maps)
    }

    /// Token embeddings of `tokens` at positions `start..`, with the input position signal.
    pub fn embed(&self, tokens: Tensor<2, Int>, start: usize) -> Tensor<3> {
        let mut x = self.token_embedding.forward(tokens);
        if let Some(scale) = self.embedding_scale {
            x = x.mul_scalar(scale);
        }
        if let Some(p) = &self.position {
            x = p.forward(x, start);
        }
        if let Some(norm) = &self.embedding_norm {
            x = norm.forward(x);
        }
        if let Some(projection) = &self.embedding_projection {
            x = variorum_kernels::linear::forward(projection, x);
        }
        self.embedding_dropout.forward(x)
    }

    /// The mask of `len` new positions continuing `state` (shared by every block): causal over
    /// absolute positions (bidirectional under the masked objective), keys from 0 (a KV cache) or from the start of the memory context.
    pub fn mask(
        &self,
        len: usize,
        state: Option<&DecoderState>,
        device: &Device,
    ) -> (AttentionMask, Option<Tensor<4, Bool>>) {
        self.mask_with(len, state, None, device)
    }

    /// [`mask`](Self::mask) with each row's graph on it (the dense mask hides its non-edges).
    pub fn mask_with(
        &self,
        len: usize,
        state: Option<&DecoderState>,
        graph: Option<GraphMask>,
        device: &Device,
    ) -> (AttentionMask, Option<Tensor<4, Bool>>) {
        let start = state.map_or(0, |s| s.position);
        let keys_before = if self.has_memory() { state.map_or(0, |s| s.context_len()) } else { start };
        let mask = if self.mask_token.is_some() { AttentionMask::bidirectional() } else { AttentionMask::causal() };
        let mask = mask.at(start, start - keys_before).with_max_back(self.max_back).with_graph(graph);
        // built once for every block, and only for mechanisms that score every key
        let dense = if self.blocks.first().is_some_and(|b| b.attn.uses_dense_mask()) {
            mask.score_mask(len, keys_before + len, device)
        } else {
            None
        };
        (mask, dense)
    }

    /// Block application `i` (its position signal, then the block) on `x`, reading and leaving
    /// attention maps in `carried` (the slot the loop passes from one application to the next).
    pub fn layer(
        &self,
        i: usize,
        x: Tensor<3>,
        mask: &AttentionMask,
        dense: Option<Tensor<4, Bool>>,
        state: Option<&mut LayerState>,
        carried: &mut CarriedMaps,
    ) -> BlockOutput {
        let x = match self.layer_positions.get(i) {
            Some(p) => p.forward(x, mask.q_start),
            None => x,
        };
        // a shared block keeps one state per application (its keys differ at every step)
        self.blocks[i % self.blocks.len()].forward(x, mask, dense, state, Some(carried), false)
    }

    /// The block loop every forward runs: block application `i` (its position signal, then the
    /// block) on the output of application `i − 1`, from `x` on, for `depth` applications — or
    /// through the two streams of a reversible stack. After each application `after(i, input,
    /// output)` lets the caller act (ACT's halting update, the exits' hiddens, an early-exit
    /// decision) and stop the loop; a reversible stack has no per-block output to hand over
    /// (the rules refuse exits and shared blocks with it) and is not stopped. `layers` holds one
    /// state per application when decoding. Returns the last output, the auxiliary losses and
    /// how many applications ran.
    pub fn run_blocks(
        &self,
        mut x: Tensor<3>,
        mask: &AttentionMask,
        dense: Option<Tensor<4, Bool>>,
        mut layers: Option<&mut [LayerState]>,
        mut after: impl FnMut(usize, Tensor<3>, &Tensor<3>) -> Flow,
    ) -> (Tensor<3>, AuxLosses, usize) {
        let mut aux_losses = Vec::new();
        if self.reversible.is_some() {
            let dropout = self.replay_dropout(&x.device());
            let mut streams = Streams::split(x);
            for i in 0..self.depth {
                let cx = RevContext { mask, dense_mask: dense.as_ref(), dropout, layer: i };
                let (s, aux) =
                    self.blocks[i].reversible_forward(streams, &cx, layers.as_deref_mut().map(|l| &mut l[i]));
                aux_losses.extend(aux);
                streams = s;
            }
            return (streams.merge(self.stream_merge), aux_losses, self.depth);
        }
        // the attention maps each application hands the next (cross-layer kinds)
        let mut carried = CarriedMaps::default();
        for i in 0..self.depth {
            let input = x.clone();
            let out = self.layer(i, x, mask, dense.clone(), layers.as_deref_mut().map(|l| &mut l[i]), &mut carried);
            x = out.x;
            aux_losses.extend(out.aux_losses);
            match after(i, input, &x) {
                Flow::Stop => return (x, aux_losses, i + 1),
                Flow::ContinueWith(next) => x = next,
                Flow::Continue => {}
            }
        }
        (x, aux_losses, self.depth)
    }

    /// The blocks and the final norm over inputs the caller embedded (`[batch, len, d_model]`,
    /// position signal included): a model whose inputs are not tokens, such as the Decision
    /// Transformer's (returns, states, actions). Causal, continuing `state` when given (and
    /// updating it). Returns the normalised last hidden states and the auxiliary losses. No
    /// ACT, exits, encoder, global input or tags: the Decision Transformer's rules refuse them.
    pub fn forward_embedded(&self, x: Tensor<3>, mut state: Option<&mut DecoderState>) -> (Tensor<3>, AuxLosses) {
        let len = x.dims()[1];
        let (mask, dense) = self.mask(len, state.as_deref(), &x.device());
        if let Some(s) = state.as_deref_mut() {
            s.layers.resize_with(self.depth, Default::default);
        }
        let layers = state.as_deref_mut().map(|s| s.layers.as_mut_slice());
        let (x, aux, _) = self.run_blocks(x, &mask, dense, layers, |_, _, _| Flow::Continue);
        if let Some(s) = state {
            s.position += len;
        }
        let h = match &self.final_norm {
            Some(n) => n.forward(x),
            None => x,
        };
        (h, aux)
    }

    /// Forward that continues from `state` (KV caches) when given, and updates it.
    pub fn forward_with(&self, tokens: Tensor<2, Int>, state: Option<&mut DecoderState>) -> LmOutput {
        self.forward_tagged(tokens, None, state)
    }

    /// [`forward_with`](Self::forward_with) of rows described by `rows`: their tags (`[batch]`,
    /// `data.tags`: the play or corpus each row comes from; a tensor of them, or `None`, converts
    /// into [`Rows`]), which every block's attention reads from the mask (kinds conditioned on a
    /// task; the others ignore it), their graphs (`data.graph`), which the mask carries to
    /// every block (a fresh forward over whole examples: no `state`), and an encoder–decoder's
    /// sources: given, the encoder runs on them (and `state` keeps its output and starts fresh
    /// cross-attention states); absent, the state's encoded source is read again.
    pub fn forward_tagged(
        &self,
        tokens: Tensor<2, Int>,
        rows: impl Into<Rows>,
        state: Option<&mut DecoderState>,
    ) -> LmOutput {
        self.forward_on_path(tokens, rows.into(), state, None)
    }

    /// [`forward_tagged`](Self::forward_tagged), each token leaving the stack at its exit in
    /// `exits` (`[batch, len]`, 0-based blocks) when given: block i computes every position, and
    /// a token whose exit is below i keeps its state from its exit (mixed training's copied
    /// states, [`crate::exits`]); the output is each token's state at its exit, and `hidden`
    /// holds those states before the final norm (what an exit's own classifier reads).
    pub(crate) fn forward_on_path(
        &self,
        tokens: Tensor<2, Int>,
        rows: Rows,
        mut state: Option<&mut DecoderState>,
        exits: Option<&Tensor<2, Int>>,
    ) -> LmOutput {
        let Rows { tags, graph, source, neighbours, hidden, .. } = rows;
        assert!(
            graph.is_none() || (state.is_none() && self.global_embedding.is_none()),
            "a graph covers whole examples: no decoding state, memory or global input"
        );
        // the encoder runs once per source; decoding keeps its output in the state
        let (encoded, encoder_losses) = match source {
            Some(s) => {
                let (e, aux) = self.encode(&s);
                if let Some(st) = state.as_deref_mut() {
                    st.source = Some(e.clone());
                    st.layers.iter_mut().for_each(|l| l.cross = Default::default());
                }
                (Some(e), aux)
            }
            None => (state.as_ref().and_then(|s| s.source.clone()), Vec::new()),
        };
        assert!(self.encoder.is_none() || encoded.is_some(), "an encoder–decoder reads a source");
        if let (Some(g), Some(segment)) = (&self.global_embedding, self.blocks[0].attn.global_segment()) {
            return self.forward_global_local(tokens, tags, state, g.val(), segment, hidden);
        }
        let [b, len] = tokens.dims();
        let device = tokens.device();
        let start = state.as_ref().map_or(0, |s| s.position);
        let ids = self.blocks[0].attn.global_token_ids();
        let global = (!ids.is_empty()).then(|| global_positions(&tokens, ids, start));
        let x = self.embed(tokens, start);
        let (mut mask, dense) = self.mask_with(len, state.as_deref(), graph, &device);
        mask.global = global;
        mask.tags = tags;
        mask.source = encoded;
        if let Some(s) = state.as_deref_mut() {
            s.layers.resize_with(self.depth, Default::default);
        }
        let mut hidden = Vec::new();
        let mut act = self.act.as_ref().map(|a| a.start(b, len, &device));
        let layers = state.as_deref_mut().map(|s| s.layers.as_mut_slice());
        let (mut x, mut aux_losses, _) = self.run_blocks(x, &mask, dense, layers, |i, input, out| {
            if let Some(exits) = exits {
                // tokens that left below block i keep their state (exits come without ACT: the
                // rules refuse a universal depth with them)
                let [b, l] = exits.dims();
                let left = exits.clone().lower_elem(i as i64).reshape([b, l, 1]).expand([b, l, out.dims()[2]]);
                return Flow::ContinueWith(out.clone().mask_where(left, input));
            }
            if let (Some(a), Some(st)) = (&self.act, act.as_mut()) {
                let input = match self.layer_positions.get(i) {
                    Some(p) => p.forward(input, start),
                    None => input,
                };
                a.step(st, input, out.clone(), i + 1 == self.depth);
            }
            if self.exits.is_some() && i + 1 < self.depth {
                hidden.push(out.clone());
            }
            Flow::Continue
        });
        aux_losses.extend(encoder_losses);
        if exits.is_some() {
            hidden = vec![x.clone()];
        }
        let mut steps = None;
        if let (Some(a), Some(st)) = (&self.act, act) {
            // graph rows: the examples' positions, not their padding
            let counted = mask.graph.as_ref().map(|g| {
                let flags: Vec<f32> =
                    g.rows().iter().flat_map(|r| (0..len).map(move |i| if i < r.len() { 1.0 } else { 0.0 })).collect();
                Tensor::<2>::from_data(TensorData::new(flags, [b, len]), &device)
            });
            aux_losses.push(("ponder".into(), a.ponder_cost(&st, counted)));
            steps = Some(st.n_updates.clone());
            x = st.output.expect("at least one step");
        }
        if let Some(s) = state {
            s.position += len;
        }
        let (features, logits) = self.head_output_with(x, neighbours);
        LmOutput { logits, aux_losses, steps, hidden, features }
    }

    /// Forward of an ETC model: the global input (one auxiliary token per segment) runs through
    /// every block beside the sequence. A fresh forward puts the global tokens in front of the
    /// long tokens (the blocks are position-wise, the attention tells the two apart): causally
    /// those of the segments completed before the last position, bidirectionally one per
    /// segment, the last one partial or not. Continuing from `state`, tokens go one at a time,
    /// and each segment's global token is run through the blocks once the segment is complete,
    /// before the first token that may see it. `hidden`: the segments hidden whole for ETC's
    /// CPC ([`crate::cpc`]), whose loss joins the auxiliary ones.
    fn forward_global_local(
        &self,
        tokens: Tensor<2, Int>,
        tags: Option<Tensor<1, Int>>,
        mut state: Option<&mut DecoderState>,
        global: Tensor<2>,
        segment: usize,
        hidden: Option<crate::cpc::HiddenSegments>,
    ) -> LmOutput {
        let [b, len] = tokens.dims();
        let device = tokens.device();
        let d = global.dims()[1];
        let global_input = |n: usize| global.clone().unsqueeze_dim::<3>(0).expand([b, n, d]);
        let mut aux_losses = Vec::new();
        let start = state.as_ref().map_or(0, |s| s.position);
        if let Some(s) = state.as_deref_mut() {
            s.layers.resize_with(self.depth, Default::default);
        }
        if start == 0 {
            let layers = state.as_deref_mut().map(|s| s.layers.as_mut_slice());
            let (x, globals, aux) = self.global_local_blocks(tokens, tags.clone(), global.clone(), segment, layers);
            aux_losses.extend(aux);
            if let Some(s) = state {
                s.position = len;
                s.globals = globals;
            }
            if let (Some(cpc), Some(h)) = (&self.cpc, hidden) {
                let (cpc_loss, aux) = self.cpc_loss(cpc, x.clone().narrow(1, 0, globals), h, tags, global, segment);
                aux_losses.extend(aux);
                aux_losses.extend(cpc_loss.map(|l| ("cpc".to_string(), l)));
            }
            let (features, logits) = self.head_output(x.narrow(1, globals, len));
            return LmOutput { logits, aux_losses, steps: None, hidden: Vec::new(), features };
        }
        let s = state.expect("continuing needs a state");
        let (mut logits, mut features) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for t in 0..len {
            let at = s.position;
            while s.globals < at / segment {
                let mask = AttentionMask {
                    global_local: Some(GlobalLocal::Auxiliary { segment: s.globals }),
                    tags: tags.clone(),
                    ..AttentionMask::causal().at(at, 0)
                };
                self.run_blocks(global_input(1), &mask, None, Some(&mut s.layers), |_, _, _| Flow::Continue);
                s.globals += 1;
            }
            let (mask, _) = self.mask(1, Some(s), &device);
            let mask =
                AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals: 0 }), tags: tags.clone(), ..mask };
            let x = self.embed(tokens.clone().narrow(1, t, 1), at);
            let (x, aux, _) = self.run_blocks(x, &mask, None, Some(&mut s.layers), |_, _, _| Flow::Continue);
            aux_losses.extend(aux);
            let (f, l) = self.head_output(x);
            logits.push(l);
            features.push(f);
            s.position += 1;
        }
        LmOutput {
            logits: Tensor::cat(logits, 1),
            aux_losses,
            steps: None,
            hidden: Vec::new(),
            features: Tensor::cat(features, 1),
        }
    }

    /// The blocks over a fresh window of `tokens` with its global tokens in front
    /// ([`forward_global_local`](Self::forward_global_local)): the last block's output
    /// `[b, globals + len, d]`, the number of global tokens and the auxiliary losses.
    pub(crate) fn global_local_blocks(
        &self,
        tokens: Tensor<2, Int>,
        tags: Option<Tensor<1, Int>>,
        global: Tensor<2>,
        segment: usize,
        layers: Option<&mut [LayerState]>,
    ) -> (Tensor<3>, usize, AuxLosses) {
        let [b, len] = tokens.dims();
        let d = global.dims()[1];
        let (mask, _) = self.mask(len, None, &tokens.device());
        // a global token summarises its segment: causally only completed ones are seen by a
        // later position, so the last (current) segment's is left out
        let globals = if mask.causal { len.saturating_sub(1) / segment } else { len.div_ceil(segment) };
        let long = self.embed(tokens, 0);
        let x = match globals {
            0 => long,
            n => Tensor::cat(vec![global.unsqueeze_dim::<3>(0).expand([b, n, d]), long], 1),
        };
        let mask = AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), tags, ..mask };
        let (x, aux, _) = self.run_blocks(x, &mask, None, layers, |_, _, _| Flow::Continue);
        (x, globals, aux)
    }

    /// ETC's CPC loss ([`crate::cpc`]): the final states of the `hidden` segments' global tokens
    /// among `globals` (`[b, n_g, d]`, the corrupted windows' global outputs) against those of
    /// the same segments' original tokens encoded alone; with the second pass's auxiliary losses.
    fn cpc_loss(
        &self,
        cpc: &crate::cpc::Cpc,
        globals: Tensor<3>,
        hidden: crate::cpc::HiddenSegments,
        tags: Option<Tensor<1, Int>>,
        global: Tensor<2>,
        segment: usize,
    ) -> (Option<Tensor<1>>, AuxLosses) {
        let [b, n_g, d] = globals.dims();
        let device = globals.device();
        let norm = |x: Tensor<2>| match &self.final_norm {
            Some(n) => n.forward(x.unsqueeze::<3>()).squeeze_dim::<2>(0),
            None => x,
        };
        let m = hidden.rows.len();
        let at: Vec<i64> = hidden.rows.iter().zip(&hidden.segments).map(|(&r, &s)| (r * n_g + s) as i64).collect();
        let at = Tensor::<1, Int>::from_data(TensorData::new(at, [m]), &device);
        let predicted = norm(globals.reshape([b * n_g, d]).select(0, at));
        let rows = Tensor::<1, Int>::from_data(
            TensorData::new(hidden.rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [m]),
            &device,
        );
        let tags = tags.map(|t| t.select(0, rows));
        let (alone, _, aux) = self.global_local_blocks(hidden.tokens, tags, global, segment, None);
        let encoded = norm(alone.narrow(1, 0, 1).squeeze_dim::<2>(1));
        (cpc.loss(predicted, encoded), aux)
    }

    /// Logits read from the output `h` of block `i`: the model's head after the last block, an
    /// early exit's classifier before it.
    pub fn exit_logits(&self, i: usize, h: Tensor<3>) -> Tensor<3> {
        if i + 1 < self.depth
            && let Some(e) = &self.exits
            && let (Some(norm), Some(head)) = (e.norms.get(i), e.heads.get(i))
        {
            return head.forward(norm.forward(h));
        }
        self.head_output(h).1
    }

    /// The output head on the last block's output `x`: the vector it reads (after the final
    /// norm of a pre-LN stack) and the logits.
    pub fn head_output(&self, x: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        self.head_output_with(x, None)
    }

    /// [`head_output`](Self::head_output) of a model with a long-term memory, which mixes in
    /// each position's retrieved `neighbours` (`[batch, len, k]`, negative = none) first; without
    /// them, or without the memory, the head reads the final state as it is.
    pub fn head_output_with(&self, x: Tensor<3>, neighbours: Option<Tensor<3, Int>>) -> (Tensor<3>, Tensor<3>) {
        let h = match &self.final_norm {
            Some(n) => n.forward(x),
            None => x,
        };
        let h = match (&self.long_term_memory, neighbours) {
            (Some(l), Some(n)) => l.forward(h, n, self.token_embedding.weight.val()),
            _ => h,
        };
        (h.clone(), self.logits(h))
    }

    /// The encoder's output over `source` (an encoder–decoder), and its auxiliary losses.
    pub fn encode(&self, source: &Source) -> (EncodedSource, AuxLosses) {
        let encoder = self.encoder.as_ref().expect("an encoder–decoder model");
        encoder.forward(self.embed(source.tokens.clone(), 0), source.padding.clone())
    }

    /// Fills block `i`'s KV cache for `h` (the output of an earlier block the token exited at)
    /// without running the block: CALM's state propagation for skipped blocks.
    pub fn propagate(&self, i: usize, h: Tensor<3>, mask: &AttentionMask, state: &mut LayerState) {
        let h = match self.layer_positions.get(i) {
            Some(p) => p.forward(h, mask.q_start),
            None => h,
        };
        self.blocks[i % self.blocks.len()].extend_cache(h, mask, state);
    }

    /// Every attention module with its parameter path's prefix: each block's self-attention, its
    /// cross-attention, and an encoder's blocks' attention.
    fn attention_modules(&mut self) -> Vec<(String, &mut variorum_attention::Attention)> {
        let mut out = Vec::new();
        for (i, block) in self.blocks.iter_mut().enumerate() {
            out.push((format!("blocks.{i}.attn."), &mut block.attn));
            if let Some(c) = block.cross.as_mut() {
                out.push((format!("blocks.{i}.cross.attn."), &mut c.attn));
            }
        }
        if let Some(e) = self.encoder.as_mut() {
            for (i, block) in e.blocks.iter_mut().enumerate() {
                out.push((format!("encoder.blocks.{i}.attn."), &mut block.attn));
            }
        }
        out
    }

    /// What the mechanisms do between optimizer steps (random features redrawn, centroids
    /// moved), in every attention module, an encoder's and the cross-attention included; the
    /// trainer calls it after every step, `step` counting completed steps from 1.
    pub fn after_optimizer_step(mut self, step: usize) -> Self {
        for (_, attn) in self.attention_modules() {
            attn.after_optimizer_step(step);
        }
        self
    }

    /// After a partial load (`--init-from`): `fresh` lists the parameter paths that kept their
    /// initialisation; each attention module derives again what it initialises from others.
    pub fn after_partial_load(mut self, fresh: &[String]) -> Self {
        for (prefix, attn) in self.attention_modules() {
            let under = |field: &str| {
                fresh.iter().any(|p| p.strip_prefix(&prefix).is_some_and(|rest| rest.split('.').any(|s| s == field)))
            };
            attn.after_partial_load(&under);
        }
        self
    }

    /// The branch dropout of a reversible stack while training (on an autodiff `device`), with a
    /// base seed drawn from the device generator; `None` otherwise.
    pub fn replay_dropout(&self, device: &Device) -> Option<ReplayDropout> {
        let prob = self.reversible.filter(|&p| p > 0.0 && device.is_autodiff())?;
        let draw = Tensor::<1, Int>::random([1], Distribution::Uniform(0.0, 1e9), device);
        Some(ReplayDropout { prob, seed: draw.into_scalar::<i64>() as u64 })
    }

    /// Whether blocks keep a memory of earlier segments in the state: a `model.memory`, or an
    /// attention that remembers (`AttentionMechanism::remembers`).
    pub fn has_memory(&self) -> bool {
        self.blocks.first().is_some_and(|b| b.memory.is_some() || b.attn.remembers())
    }

    /// Rows `r` with `rows[r]` start a new document: every layer's attention forgets what it
    /// remembers of theirs (the other rows keep their memories).
    pub fn reset_rows(&self, state: &mut DecoderState, rows: &[bool]) {
        for (i, layer) in state.layers.iter_mut().enumerate() {
            self.blocks[i % self.blocks.len()].attn.reset_rows(&mut layer.attention, rows);
        }
    }

    fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = match self.head_scale {
            Some(s) => x.mul_scalar(s),
            None => x,
        };
        let x = match &self.head_transform {
            Some(t) => t.forward(x),
            None => x,
        };
        // the head is built without a bias of its own: `head_bias` serves tied heads too
        let weight = match &self.head {
            Some(head) => head.weight.val(),
            None => self.token_embedding.weight.val().transpose(),
        };
        variorum_kernels::linear::linear(x, weight, self.head_bias.as_ref().map(|b| b.val()))
    }

    /// Mean cross-entropy of `targets` under `tokens` ([`token_loss`](Self::token_loss)), plus the
    /// auxiliary losses.
    pub fn loss(&self, tokens: Tensor<2, Int>, targets: Tensor<2, Int>) -> (Tensor<1>, AuxLosses) {
        self.loss_with(tokens, targets, None, None)
    }

    /// The loss of `tokens` → `targets` (detached), the auxiliary losses (detached) and the
    /// gradients of `(loss + Σ aux) / micro_batches` with respect to every parameter, on an autodiff
    /// device: the one call a training step makes, whatever the model. `tags`: each row's example
    /// tag, when the data is tagged ([`forward_tagged`](Self::forward_tagged)). A reversible stack keeps
    /// no activations and computes its gradients block by block ([`crate::reversible_grads`]);
    /// every other model back-propagates its graph, continuing `state` for a memory model.
    pub fn loss_and_grads(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        rows: impl Into<Rows>,
        state: Option<&mut DecoderState>,
        micro_batches: usize,
    ) -> (Tensor<1>, AuxLosses, burn::optim::GradientsParams) {
        let rows = rows.into();
        if self.reversible.is_some() {
            assert!(rows.graph.is_none(), "a reversible stack takes no graph");
            let scale = 1.0 / micro_batches as f64;
            return crate::reversible_grads::reversible_grads(self, tokens, targets, rows.tags, scale);
        }
        let (loss, aux) = self.loss_with(tokens, targets, rows, state);
        let total = aux.iter().fold(loss.clone(), |t, (_, l)| t + l.clone());
        let total = if micro_batches > 1 { total.div_scalar(micro_batches as f64) } else { total };
        let grads = burn::optim::GradientsParams::from_grads(total.backward(), self);
        (loss.detach(), aux.into_iter().map(|(n, l)| (n, l.detach())).collect(), grads)
    }

    /// [`loss`](Self::loss) of rows tagged `tags`, continuing from (and updating) `state`: a
    /// memory model trained on ordered streams carries its memory from one segment to the next
    /// this way.
    pub fn loss_with(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        rows: impl Into<Rows>,
        state: Option<&mut DecoderState>,
    ) -> (Tensor<1>, AuxLosses) {
        let rows = rows.into();
        let padded = rows.padded || rows.graph.is_some() || rows.source.is_some();
        if let Some(e) = &self.exits
            && e.mixed_paths > 0
        {
            assert!(state.is_none(), "exits train without a memory (the rules refuse one)");
            return self.mixed_paths_loss(tokens, targets, rows, padded, e.mixed_paths);
        }
        let out = self.forward_tagged(tokens, rows, state);
        let mut aux = out.aux_losses;
        if let Some(e) = &self.exits
            && !out.hidden.is_empty()
        {
            let final_top = out.logits.clone().argmax(2);
            let mut exit_losses = Vec::new();
            let mut classifier_losses = Vec::new();
            // per-exit log-likelihoods and correctness, for the exit predictor's oracle
            let mut scores = (Vec::new(), Vec::new());
            let mut score = |logits: &Tensor<3>| {
                let logits = logits.clone().detach();
                let target = targets.clone().unsqueeze_dim::<3>(2);
                scores.0.push(log_softmax(logits.clone(), 2).gather(2, target.clone()));
                scores.1.push(logits.argmax(2).equal(target).float());
            };
            for (i, h) in out.hidden.iter().cloned().enumerate() {
                let logits = self.exit_logits(i, h.clone());
                if e.predictor.is_some() {
                    score(&logits);
                }
                if let Some(c) = e.confidence(i, h.detach()) {
                    // consistency oracle: does exit i already give the last block's top token?
                    let agree = logits.clone().argmax(2).equal(final_top.clone()).float().squeeze_dim::<2>(2);
                    let c = c.clamp(1e-6, 1.0 - 1e-6);
                    let on = agree.clone() * c.clone().log();
                    let off = agree.neg().add_scalar(1.0) * c.neg().add_scalar(1.0).log();
                    classifier_losses.push((on + off).mean().neg());
                }
                exit_losses.push(cross_entropy(logits, targets.clone()));
            }
            let mean = |v: Vec<Tensor<1>>| {
                let k = v.len() as f64;
                v.into_iter().reduce(|a, b| a + b).map(|t| t.div_scalar(k))
            };
            let depth = exit_losses.len() + 1;
            let weighted =
                exit_losses.into_iter().enumerate().map(|(i, l)| l.mul_scalar(e.weighting.weight(i + 1, depth)));
            if let Some(sum) = weighted.reduce(|a, b| a + b) {
                aux.push(("early_exits".into(), sum.mul_scalar(e.weight)));
            }
            if let Some(m) = mean(classifier_losses) {
                aux.push(("exit_classifier".into(), m));
            }
            if let Some(p) = &e.predictor {
                score(&out.logits);
                let scores = ExitScores { log_likelihood: Tensor::cat(scores.0, 2), correct: Tensor::cat(scores.1, 2) };
                aux.push(("exit_predictor".into(), p.loss(&out.hidden, &scores)));
            }
        }
        let aux = self.reinforce(aux, &out.logits, &targets, padded);
        (self.rows_loss(out.logits, targets, padded), aux)
    }

    /// Mixed training's loss (Elbayad et al. 2020, [`crate::exits`]): over `paths` exit sequences
    /// drawn uniformly per token from the device's generator, [`loss_on_paths`](Self::loss_on_paths).
    fn mixed_paths_loss(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        rows: Rows,
        padded: bool,
        paths: usize,
    ) -> (Tensor<1>, AuxLosses) {
        let [b, l] = tokens.dims();
        let device = tokens.device();
        let draw = || {
            let u = Tensor::<2>::random([b, l], burn::tensor::Distribution::Uniform(0.0, self.depth as f64), &device);
            u.floor().int().clamp(0, self.depth as i64 - 1)
        };
        let exits: Vec<Tensor<2, Int>> = (0..paths).map(|_| draw()).collect();
        self.loss_on_paths(tokens, targets, rows, padded, &exits)
    }

    /// The mean over `paths` (each `[batch, len]`, every token's exit block, 0-based) of the
    /// cross-entropy of each token read at its exit, the states above every exit copied from it
    /// ([`forward_on_path`](Self::forward_on_path)); auxiliary losses averaged over the paths.
    pub(crate) fn loss_on_paths(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        rows: Rows,
        padded: bool,
        paths: &[Tensor<2, Int>],
    ) -> (Tensor<1>, AuxLosses) {
        let mut losses = Vec::with_capacity(paths.len());
        let mut aux: AuxLosses = Vec::new();
        for exits in paths {
            let out = self.forward_on_path(tokens.clone(), rows.clone(), None, Some(exits));
            // every token read by its own exit's classifier: the model's head for the last
            // block and for shared exits, else each exit's logits where the token left there
            let logits = match self.exits.as_ref().is_some_and(|e| !e.heads.is_empty()) {
                false => out.logits,
                true => (0..self.depth)
                    .map(|i| {
                        let here = exits.clone().equal_elem(i as i64).float().unsqueeze_dim::<3>(2);
                        let logits = if i + 1 == self.depth {
                            out.logits.clone()
                        } else {
                            self.exit_logits(i, out.hidden[0].clone())
                        };
                        logits * here
                    })
                    .reduce(|a, c| a + c)
                    .expect("at least one block"),
            };
            losses.push(self.rows_loss(logits, targets.clone(), padded));
            for (name, loss) in out.aux_losses {
                match aux.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, sum)) => *sum = sum.clone() + loss,
                    None => aux.push((name, loss)),
                }
            }
        }
        let mean = |t: Tensor<1>| t.div_scalar(paths.len() as f64);
        let loss = losses.into_iter().reduce(|a, c| a + c).map(mean).expect("at least one path");
        (loss, aux.into_iter().map(|(n, l)| (n, mean(l))).collect())
    }

    /// The policies' log-probabilities among `aux` (named [`REINFORCE_PREFIX`]…, `[batch]`) as
    /// one REINFORCE surrogate each: mean_r(A_r · log π_r), the advantage A_r of each row (its
    /// loss against the mean of the batch's other rows, detached) weighing its log-probability,
    /// so that a descent step makes the draws of the rows that did better more likely.
    fn reinforce(&self, aux: AuxLosses, logits: &Tensor<3>, targets: &Tensor<2, Int>, padded: bool) -> AuxLosses {
        if !aux.iter().any(|(n, _)| n.starts_with(REINFORCE_PREFIX)) {
            return aux;
        }
        let losses = self.row_losses(logits.clone().detach(), targets.clone(), padded);
        // leave-one-out baseline: each row against the mean of the others (unbiased; one row
        // alone has no baseline and no advantage, so its policy does not move)
        let b = losses.dims()[0];
        let advantage = if b > 1 {
            let others = (losses.clone().sum() - losses.clone()).div_scalar((b - 1) as f64);
            losses - others
        } else {
            losses.zeros_like()
        };
        let mut out: AuxLosses = Vec::new();
        let mut policies: AuxLosses = Vec::new();
        for (name, t) in aux {
            match name.strip_prefix(REINFORCE_PREFIX) {
                Some(policy) => variorum_core::sum_aux_losses(&mut policies, vec![(policy.to_string(), t)]),
                None => out.push((name, t)),
            }
        }
        out.extend(policies.into_iter().map(|(n, log_pi)| (n, (log_pi * advantage.clone()).mean())));
        out
    }

    /// Each row's mean loss over the positions it predicts, `[batch]` (under the masked
    /// objective its hidden positions; with `padded` rows — graph examples, an
    /// encoder–decoder's targets — those whose target is not `NO_TARGET`).
    pub fn row_losses(&self, logits: Tensor<3>, targets: Tensor<2, Int>, padded: bool) -> Tensor<1> {
        let [b, l, _] = logits.dims();
        let counted = match self.mask_token {
            Some(m) => targets.clone().not_equal_elem(m as i64).float(),
            None if padded => targets.clone().greater_equal_elem(0).float(),
            None => Tensor::ones([b, l], &logits.device()),
        };
        let picked = log_softmax(logits, 2).gather(2, targets.clamp_min(0).reshape([b, l, 1])).reshape([b, l]);
        let total = (picked * counted.clone()).sum_dim(1).neg().reshape([b]);
        total / counted.sum_dim(1).clamp_min(1.0).reshape([b])
    }

    /// [`token_loss`](Self::token_loss), or with `padded` rows (graph examples, an
    /// encoder–decoder's targets, which end with `variorum_data::NO_TARGET`, −1) next-token
    /// cross-entropy over the targets ≥ 0.
    pub fn rows_loss(&self, logits: Tensor<3>, targets: Tensor<2, Int>, padded: bool) -> Tensor<1> {
        match (padded, self.mask_token) {
            (true, None) => padded_cross_entropy(logits, targets),
            _ => self.token_loss(logits, targets),
        }
    }

    /// Mean cross-entropy of the logits against the targets; under the masked objective, over the
    /// hidden positions only (the other targets are the mask token).
    pub fn token_loss(&self, logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
        match self.mask_token {
            None => cross_entropy(logits, targets),
            Some(ignore) => {
                let [b, l, v] = logits.dims();
                let device = logits.device();
                CrossEntropyLossConfig::new()
                    .with_pad_tokens(Some(vec![ignore]))
                    .init(&device)
                    .forward(logits.reshape([b * l, v]), targets.reshape([b * l]))
            }
        }
    }
}

/// Mean cross-entropy of `[batch, len, vocab]` logits against `[batch, len]` targets.
pub fn cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, l, v] = logits.dims();
    variorum_kernels::cross_entropy::cross_entropy(logits.reshape([b * l, v]), targets.reshape([b * l]))
}

/// Mean cross-entropy of `[batch, len, vocab]` logits over the targets ≥ 0 of `[batch, len]`
/// (a negative target predicts nothing: padding, an example's end).
pub fn padded_cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, l, v] = logits.dims();
    let targets = targets.reshape([b * l]);
    let counted = targets.clone().greater_equal_elem(0).float();
    let picked = log_softmax(logits.reshape([b * l, v]), 1).gather(1, targets.clamp_min(0).reshape([b * l, 1]));
    (picked.reshape([b * l]) * counted.clone()).sum().neg() / counted.sum().clamp_min(1.0)
}

/// What the data says about each row of a batch besides its tokens: its example tag
/// (`data.tags`), its graph (`data.graph`) and, for an encoder–decoder, its source (whose
/// example's targets end with `NO_TARGET`, as graph rows' do). A tensor of tags, or `None`,
/// converts into it.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    /// `[batch]`, each row's tag; `None` = untagged.
    pub tags: Option<Tensor<1, Int>>,
    /// Each row's graph; `None` = plain text.
    pub graph: Option<GraphMask>,
    /// Each row's source (encoder–decoder models).
    pub source: Option<Source>,
    /// Some targets are `NO_TARGET` (the padded end of a document's last segment), which the
    /// loss skips, as it does a graph's or a source's padding.
    pub padded: bool,
    /// `[batch, len, k]`: the tokens retrieved for each position (negative = none), which a
    /// model with a long-term memory reads before its head; `None` = no retrieval.
    pub neighbours: Option<Tensor<3, Int>>,
    /// The segments hidden whole for ETC's CPC, with their original tokens; `None` = none.
    pub hidden: Option<crate::cpc::HiddenSegments>,
}

impl From<Option<Tensor<1, Int>>> for Rows {
    fn from(tags: Option<Tensor<1, Int>>) -> Self {
        Self { tags, ..Default::default() }
    }
}

impl From<Source> for Rows {
    fn from(source: Source) -> Self {
        Self { source: Some(source), ..Default::default() }
    }
}

/// Per batch row, the absolute positions (from `start`) of the tokens in `ids`.
fn global_positions(tokens: &Tensor<2, Int>, ids: &[u32], start: usize) -> Vec<Vec<usize>> {
    let [b, len] = tokens.dims();
    let values = tokens.clone().into_data().convert::<i64>().try_into_vec::<i64>().unwrap_or_default();
    (0..b)
        .map(|i| {
            (0..len).filter(|&j| ids.iter().any(|&id| id as i64 == values[i * len + j])).map(|j| start + j).collect()
        })
        .collect()
}
