//! Residual wiring of a Transformer block, the `model.block` axis.
//!
//! post-LN (Vaswani et al. 2017):  x = LN(x + Attn(x));      x = LN(x + FFN(x))
//! pre-LN  (Xiong et al. 2020; GPT-2): x = x + Attn(LN(x));  x = x + FFN(LN(x))
//! parallel pre-LN (GPT-J, GPT-NeoX): x = x + Attn(LN₁(x)) + FFN(LN₂(x))
//! GTrXL (Parisotto et al. 2020):   x = g₁(x, ReLU(Attn(LN(x))));  x = g₂(x, ReLU(FFN(LN(x))))
//!
//! with g the GRU-style gate of [`crate::gtrxl`]. Dropout (`model.dropout`) is applied to each
//! branch before it joins the stream.
//!
//! With a memory (`model.memory`), the attention's keys and values come from
//! [memory context; x] — the stop-gradient inputs of this block for earlier positions — while the
//! queries come from x; after the forward, x joins the memory ([`crate::memory`]).

use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::activation::relu;
use serde::{Deserialize, Serialize};
use variorum_attention::{Attention, AttentionConfig, AttentionInput, AttentionState, CarriedMaps, Positioning};
use variorum_core::{AttentionMask, AuxLosses, ConfigError, error::check};

use crate::cross::CrossAttention;
use crate::gtrxl::GtrxlConfig;
use crate::gtrxl::GtrxlGate;
use crate::memory::{Evicted, LayerMemory, MemoryConfig, MemoryState};
use crate::placement::{PostLnConfig, PreLnConfig};
use crate::reversible::ReversibleConfig;
use crate::{FeedForward, FeedForwardConfig, Norm, NormKind};

/// The norm settings every block kind has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResidualConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
}

impl Default for ResidualConfig {
    fn default() -> Self {
        Self { norm: NormKind::LayerNorm, norm_eps: 1e-5 }
    }
}

/// A block kind's config: the residual wiring it asks of [`TransformerBlock`]. Its file
/// implements this and [`variorum_core::Declared`]; one line in [`BlockConfig`]'s list
/// registers it.
pub trait BlockKind {
    /// The norm settings.
    fn residual(&self) -> ResidualConfig;

    /// Norms on the branch inputs (and one after the stack), rather than after each sum.
    /// Default: yes.
    fn pre_norm(&self) -> bool {
        true
    }

    /// Two streams whose blocks are inverted in the backward instead of storing activations
    /// (the depth loop and the gradients take the reversible path). Default: no.
    fn reversible(&self) -> bool {
        false
    }

    /// Attention and feed-forward read the same input and join the stream together. Default:
    /// no, one after the other.
    fn parallel(&self) -> bool {
        false
    }

    /// The parallel branches read one norm's output (GPT-J, Phi), so the block has no
    /// feed-forward norm of its own. Default: no.
    fn shared_norm(&self) -> bool {
        false
    }

    /// Gates replacing the two residual sums (attention, feed-forward). Default: none, sums.
    fn gates(&self, _d_model: usize, _init_std: f64, _device: &Device) -> Vec<GtrxlGate> {
        Vec::new()
    }

    /// Checks the settings; messages name the config key. Default: `norm_eps` in (0, 1).
    fn validate(&self) -> Result<(), ConfigError> {
        check_norm_eps(&self.residual())
    }
}

/// `model.block.norm_eps` in (0, 1): the check every kind's `validate` starts with.
pub(crate) fn check_norm_eps(residual: &ResidualConfig) -> Result<(), ConfigError> {
    let eps = residual.norm_eps;
    check(eps > 0.0 && eps < 1.0, || format!("model.block.norm_eps = {eps} must be in (0, 1)"))
}

variorum_core::kind_enum! {
    /// `model.block`, chosen by `kind`.
    pub enum BlockConfig: dyn BlockKind, axis "model.block" {
        /// Norm after each residual sum (the original Transformer).
        "post-ln" => PostLn(PostLnConfig),
        /// Norm at the start of each residual branch, final norm after the stack.
        "pre-ln" => PreLn(PreLnConfig),
        /// GRU-style gates instead of residual sums.
        "gtrxl" => Gtrxl(GtrxlConfig),
        /// Reversible residual pairs ([`crate::reversible`]): pre-LN branches, no stored activations.
        "reversible" => Reversible(ReversibleConfig),
    }
}

impl Default for BlockConfig {
    fn default() -> Self {
        Self::PreLn(PreLnConfig::default())
    }
}

/// Everything a block is built from.
pub struct BlockParts<'a> {
    /// Width of the residual stream.
    pub d_model: usize,
    /// The self-attention (`model.attention`).
    pub attention: &'a AttentionConfig,
    /// The model's position scheme (its relative part lives in the attention).
    pub position: Positioning<'a>,
    /// `model.feed_forward`.
    pub feed_forward: &'a FeedForwardConfig,
    /// `model.memory`.
    pub memory: &'a MemoryConfig,
    /// An encoder–decoder's cross-attention (decoder blocks only).
    pub cross: Option<&'a AttentionConfig>,
    /// Dropout probability on the branches and the FFN hidden layer (`model.dropout`).
    pub dropout: f64,
    /// std of the normal initialisation of the other weights (GPT-2: 0.02).
    pub init_std: f64,
    /// std of the residual output projections (GPT-2: init_std / √(2·n_layers)).
    pub out_std: f64,
}

impl BlockConfig {
    /// The norm settings.
    pub fn residual(&self) -> ResidualConfig {
        self.spec().residual()
    }

    /// Norms on the branch inputs (and one after the stack), rather than after each sum.
    pub fn pre_norm(&self) -> bool {
        self.spec().pre_norm()
    }

    /// Two streams whose blocks are inverted in the backward instead of storing activations.
    pub fn reversible(&self) -> bool {
        self.spec().reversible()
    }

    /// Attention and feed-forward read the same input and join the stream together.
    pub fn parallel(&self) -> bool {
        self.spec().parallel()
    }

    /// Width of the stack's output (the final norm's and the head's input): d_model, or both
    /// streams of a reversible stack that concatenates them.
    pub fn output_width(&self, d_model: usize) -> usize {
        self.stream_merge().width(d_model)
    }

    /// How a reversible stack joins its streams (the mean for any other block).
    pub fn stream_merge(&self) -> crate::reversible::StreamMerge {
        match self {
            Self::Reversible(r) => r.merge,
            _ => crate::reversible::StreamMerge::Mean,
        }
    }

    /// Checks the settings; messages name the config key (`model.block.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.spec().validate()
    }

    /// One block of this wiring from `parts`. A reversible block's dropouts are 0 here: it drops
    /// out its branch outputs with replayed masks instead ([`crate::reversible`]).
    pub fn init(&self, parts: &BlockParts, device: &Device) -> TransformerBlock {
        let r = self.residual();
        let d = parts.d_model;
        // a reversible block drops out its branch outputs with replayed masks (crate::reversible)
        let dropout = if self.reversible() { 0.0 } else { parts.dropout };
        TransformerBlock {
            attn_norm: r.norm.init(d, r.norm_eps, device),
            attn: parts.attention.init(d, parts.init_std, parts.out_std, parts.position, device),
            ffn_norm: (!self.spec().shared_norm()).then(|| r.norm.init(d, r.norm_eps, device)),
            ffn: parts.feed_forward.init(d, dropout, parts.init_std, parts.out_std, device),
            dropout: DropoutConfig::new(dropout).init(),
            pre_norm: self.pre_norm(),
            parallel: self.parallel(),
            gates: self.spec().gates(d, parts.init_std, device),
            memory: parts.memory.init(d, parts.position.context, device),
            cross: parts.cross.map(|c| CrossAttention::new(c, &r, d, parts.init_std, parts.out_std, device)),
        }
    }
}

/// One layer's incremental state: the attention's (KV cache), the memory's, and a convolutional
/// transition's window of recent inputs.
#[derive(Debug, Clone, Default)]
pub struct LayerState {
    /// The attention's incremental state (its KV cache, without a memory).
    pub attention: AttentionState,
    /// The memory's state: this layer's detached past inputs.
    pub memory: MemoryState,
    /// A convolutional feed-forward's last k−1 inputs `[b, k−1, d]` (`separable-conv`).
    pub transition: Option<Tensor<3>>,
    /// The cross-attention's state over the current source (an encoder–decoder's decoder).
    pub cross: AttentionState,
}

/// One Transformer layer: an attention branch and a feed-forward branch joined to the residual
/// stream by the config's wiring, with an optional memory and cross-attention.
#[derive(Module, Debug)]
pub struct TransformerBlock {
    /// The attention branch's norm: on its input (pre-norm) or after its sum (post-norm).
    pub attn_norm: Norm,
    /// The self-attention (`model.attention`).
    pub attn: Attention,
    /// The feed-forward branch's norm, placed as `attn_norm`; `None` when the parallel branches
    /// share `attn_norm` (GPT-J, Phi).
    pub ffn_norm: Option<Norm>,
    /// The position-wise feed-forward layer (`model.feed_forward`).
    pub ffn: FeedForward,
    /// Dropout on each branch's output before it joins the stream.
    pub dropout: Dropout,
    /// Norms on the branch inputs (and one after the stack), rather than after each sum.
    pub pre_norm: bool,
    /// Both branches read the block's input and join the stream together (pre-norm only).
    pub parallel: bool,
    /// GTrXL: the gates replacing the two residual sums (empty otherwise).
    pub gates: Vec<GtrxlGate>,
    /// The layer's part of `model.memory` (sizes, compression network), if the kind has one.
    pub memory: Option<LayerMemory>,
    /// An encoder–decoder's decoder block: cross-attention over the encoded source between the
    /// self-attention and the feed-forward layer ([`crate::cross`]).
    pub cross: Option<CrossAttention>,
}

/// Output of one block.
pub struct BlockOutput {
    /// The stream after the block, `[b, len_q, d_model]`.
    pub x: Tensor<3>,
    /// The attention's auxiliary losses and the compressive memory's, by name.
    pub aux_losses: AuxLosses,
    /// The self-attention's weights `[b, n_heads, len_q, len_k]`, when asked for and formed.
    pub weights: Option<Tensor<4>>,
}

impl TransformerBlock {
    /// `mask` describes queries `x` and keys [memory context; x] (the decoder sets `k_start`
    /// before `q_start` by the context length). Without a memory, `state` holds the KV cache.
    /// `carried` is the slot the previous block application left its attention maps in
    /// ([`CarriedMaps`]), passed on to the attention.
    pub fn forward(
        &self,
        x: Tensor<3>,
        mask: &AttentionMask,
        dense_mask: Option<Tensor<4, Bool>>,
        state: Option<&mut LayerState>,
        carried: Option<&mut CarriedMaps>,
        need_weights: bool,
    ) -> BlockOutput {
        let [_, lq, _] = x.dims();
        let incremental = state.is_some();
        let mut empty = LayerState::default();
        let state = state.unwrap_or(&mut empty);
        let context = self.memory.as_ref().and_then(|_| state.memory.context());
        let track_usage = self.memory.as_ref().is_some_and(|m| m.tracks_usage());
        let norm_in = |h: Tensor<3>| if self.pre_norm { self.attn_norm.forward(h) } else { h };

        // queries from x; keys and values from [context; x]
        let (query, key_value) = match &context {
            Some(c) => {
                let all = norm_in(Tensor::cat(vec![c.clone(), x.clone()], 1));
                let n = all.dims()[1];
                (all.clone().narrow(1, n - lq, lq), Some(all))
            }
            None => (norm_in(x.clone()), None),
        };
        let weights = need_weights || track_usage;
        // the parallel branches of a shared norm both read the normed input
        let shared = (self.parallel && self.ffn_norm.is_none()).then(|| query.clone());
        let input = AttentionInput { query, key_value, mask, dense_mask, need_weights: weights, carried };
        // a memory model keeps layer inputs, not keys and values
        let cache = if self.memory.is_none() && incremental { Some(&mut state.attention) } else { None };
        let a = self.attn.forward(input, cache);
        let mut aux_losses = a.aux_losses;
        if track_usage && let Some(w) = &a.weights {
            state.memory.record_usage(w.clone());
        }

        let y = if self.pre_norm {
            self.join(0, x.clone(), a.context)
        } else {
            self.attn_norm.forward(x.clone() + self.dropout.forward(a.context))
        };
        let y = match &self.cross {
            Some(cross) => {
                let (c, aux) = cross.branch(y.clone(), mask, self.pre_norm, incremental.then_some(&mut state.cross));
                aux_losses.extend(aux);
                let y = y + self.dropout.forward(c);
                if self.pre_norm { y } else { cross.norm.forward(y) }
            }
            None => y,
        };
        let window = incremental.then_some(&mut state.transition);
        let y = if self.parallel {
            // the feed-forward branch reads the block's input, not the attention's sum
            let input = shared.unwrap_or_else(|| self.norm_ffn_input(x.clone()));
            y + self.dropout.forward(self.ffn.forward_with(input, window))
        } else if self.pre_norm {
            self.join(1, y.clone(), self.ffn.forward_with(self.norm_ffn_input(y), window))
        } else {
            self.norm_ffn_input(y.clone() + self.dropout.forward(self.ffn.forward_with(y, window)))
        };

        if let Some(memory) = &self.memory
            && incremental
            && let Some(evicted) = memory.update(&mut state.memory, x.clone())
        {
            aux_losses.extend(self.compression_losses(memory, x, evicted));
        }
        BlockOutput { x: y, aux_losses, weights: if need_weights { a.weights } else { None } }
    }

    /// Appends the keys and values this block's attention would compute for inputs `x` to its
    /// cache, without running the block (CALM's propagation for blocks a token skipped).
    pub fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut LayerState) {
        let x = if self.pre_norm { self.attn_norm.forward(x) } else { x };
        self.attn.extend_cache(x, mask, &mut state.attention);
    }

    /// The feed-forward branch's norm of `x`: its own, or the shared `attn_norm`.
    pub fn norm_ffn_input(&self, x: Tensor<3>) -> Tensor<3> {
        self.ffn_norm.as_ref().unwrap_or(&self.attn_norm).forward(x)
    }

    /// Joins branch output `y` to the stream `x`: a residual sum, or GTrXL's gate `which`.
    fn join(&self, which: usize, x: Tensor<3>, y: Tensor<3>) -> Tensor<3> {
        let y = self.dropout.forward(y);
        match self.gates.get(which) {
            Some(gate) => gate.forward(x, relu(y)),
            None => x + y,
        }
    }

    /// The Compressive Transformer's losses on the states a commit evicted, with the queries of
    /// this forward. Only the compression network (and the auto-encoder's decoder) learn from
    /// them: queries, evicted states, norm and attention are held fixed.
    fn compression_losses(&self, memory: &LayerMemory, x: Tensor<3>, evicted: Evicted) -> AuxLosses {
        let mut out = AuxLosses::new();
        let Some(compressor) = &memory.compressor else { return out };
        // only while training, and only a compression with parameters (not pooling, most-used)
        if !x.is_autodiff() || compressor.conv.is_none() {
            return out;
        }
        if memory.reconstruction_weight > 0.0 {
            let norm = self.attn_norm.clone().no_grad();
            let attn = self.attn.clone().no_grad();
            let prep = |h: Tensor<3>| if self.pre_norm { norm.forward(h) } else { h };
            let q = prep(x.detach()).detach();
            let target = attn.content_only(q.clone(), prep(evicted.states.clone())).detach();
            let rebuilt = attn.content_only(q, prep(evicted.compressed.clone()));
            let loss = (target - rebuilt).powf_scalar(2.0).mean().mul_scalar(memory.reconstruction_weight);
            out.push(("attention_reconstruction".into(), loss));
        }
        if memory.autoencoding_weight > 0.0
            && let Some(decoded) = compressor.decode(evicted.compressed)
        {
            let n = decoded.dims()[1];
            let target = evicted.states.narrow(1, 0, n);
            let loss = (target - decoded).powf_scalar(2.0).mean().mul_scalar(memory.autoencoding_weight);
            out.push(("autoencoding".into(), loss));
        }
        out
    }
}

/// A block of `cfg` 16 wide over a context of 8, with default attention and feed-forward and
/// large random weights (std 0.3), for the block kinds' tests.
#[cfg(test)]
pub(crate) fn tiny_block(cfg: BlockConfig, device: &Device) -> TransformerBlock {
    let (attention, ffn, memory, position) = (
        AttentionConfig::default(),
        FeedForwardConfig::default(),
        MemoryConfig::None(Default::default()),
        variorum_position::PositionConfig::default(),
    );
    let parts = BlockParts {
        d_model: 16,
        attention: &attention,
        position: Positioning { config: &position, context: 8 },
        feed_forward: &ffn,
        memory: &memory,
        cross: None,
        dropout: 0.0,
        init_std: 0.3,
        out_std: 0.3,
    };
    cfg.init(&parts, device)
}
