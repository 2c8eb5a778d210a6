//! The attention contract shared by every mechanism.

use burn::prelude::*;
use variorum_core::{AttentionMask, AuxLosses};

use crate::KvCache;
use crate::etc::EtcState;
use crate::kernel::KernelState;
use crate::low_rank_band::LowRankBandState;
use crate::memory_compressed::CompressedState;
use crate::poolingformer::PoolingState;
use crate::prob_sparse::ProbSparseState;

/// What every attention mechanism receives.
#[derive(Debug)]
pub struct AttentionInput<'a> {
    /// Hidden states the queries come from, `[batch, len_q, d_model]`.
    pub query: Tensor<3>,
    /// Hidden states keys and values come from, `[batch, len_k, d_model]`; `None` = self-attention.
    pub key_value: Option<Tensor<3>>,
    /// Causality, padding and absolute positions of both sides.
    pub mask: &'a AttentionMask,
    /// Precomputed dense mask of `mask` for `[len_q, len_k]` (built once per forward and shared by
    /// every layer); mechanisms that need it and find `None` build it themselves.
    pub dense_mask: Option<Tensor<4, Bool>>,
    /// Return the attention weights (for inspection).
    pub need_weights: bool,
}

impl<'a> AttentionInput<'a> {
    pub fn self_attention(query: Tensor<3>, mask: &'a AttentionMask) -> Self {
        Self { query, key_value: None, mask, dense_mask: None, need_weights: false }
    }

    pub fn cross_attention(query: Tensor<3>, key_value: Tensor<3>, mask: &'a AttentionMask) -> Self {
        Self { query, key_value: Some(key_value), mask, dense_mask: None, need_weights: false }
    }

    pub fn with_dense_mask(mut self, m: Option<Tensor<4, Bool>>) -> Self {
        self.dense_mask = m;
        self
    }

    pub fn with_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }
}

/// What every attention mechanism returns.
#[derive(Debug)]
pub struct AttentionOutput {
    /// `[batch, len_q, d_model]`
    pub context: Tensor<3>,
    /// `[batch, n_heads, len_q, len_k]` when asked for and when the mechanism forms them.
    pub weights: Option<Tensor<4>>,
    /// Extra losses (already weighted).
    pub aux_losses: AuxLosses,
}

/// Incremental-decoding state of one attention layer. Mechanisms without state ignore it.
#[derive(Debug, Clone, Default)]
pub enum AttentionState {
    #[default]
    Empty,
    Kv(KvCache),
    /// The carried sums of a kernelised (recurrent) attention.
    Kernel(Option<KernelState>),
    /// Compressed and open-block keys of memory-compressed attention.
    Compressed(CompressedState),
    /// Keys, values, past sparsity measures and the running value sum of ProbSparse attention.
    ProbSparse(ProbSparseState),
    /// The long and the global caches of ETC's global–local attention.
    Etc(EtcState),
    /// Poolingformer's level-1 window, pooled segments and open segment.
    Pooling(PoolingState),
    /// The low-rank keys of every position and the band keys of the last w (low-rank-band).
    LowRankBand(LowRankBandState),
}

impl AttentionState {
    /// The KV cache, created on first use.
    pub fn kv_mut(&mut self) -> &mut KvCache {
        if let AttentionState::Empty = self {
            *self = AttentionState::Kv(KvCache::default());
        }
        match self {
            AttentionState::Kv(c) => c,
            _ => unreachable!("replaced just above; one layer keeps one kind of state"),
        }
    }

    /// The state of memory-compressed attention, created on first use.
    pub fn compressed_mut(&mut self) -> &mut CompressedState {
        if !matches!(self, AttentionState::Compressed(_)) {
            *self = AttentionState::Compressed(CompressedState::default());
        }
        match self {
            AttentionState::Compressed(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }

    /// Poolingformer's state, created on first use.
    pub fn pooling_mut(&mut self) -> &mut PoolingState {
        if !matches!(self, AttentionState::Pooling(_)) {
            *self = AttentionState::Pooling(PoolingState::default());
        }
        match self {
            AttentionState::Pooling(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }

    /// Low-rank-band's caches, created on first use.
    pub fn low_rank_band_mut(&mut self) -> &mut LowRankBandState {
        if !matches!(self, AttentionState::LowRankBand(_)) {
            *self = AttentionState::LowRankBand(LowRankBandState::default());
        }
        match self {
            AttentionState::LowRankBand(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }

    /// The state of ProbSparse attention, created on first use.
    pub fn prob_sparse_mut(&mut self) -> &mut ProbSparseState {
        if !matches!(self, AttentionState::ProbSparse(_)) {
            *self = AttentionState::ProbSparse(ProbSparseState::default());
        }
        match self {
            AttentionState::ProbSparse(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }

    /// ETC's caches, created on first use.
    pub fn etc_mut(&mut self) -> &mut EtcState {
        if !matches!(self, AttentionState::Etc(_)) {
            *self = AttentionState::Etc(EtcState::default());
        }
        match self {
            AttentionState::Etc(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }

    /// The recurrent sums of a kernelised attention, created on first use.
    pub fn kernel_mut(&mut self) -> &mut Option<KernelState> {
        if !matches!(self, AttentionState::Kernel(_)) {
            *self = AttentionState::Kernel(None);
        }
        match self {
            AttentionState::Kernel(s) => s,
            _ => unreachable!("replaced just above"),
        }
    }
}
