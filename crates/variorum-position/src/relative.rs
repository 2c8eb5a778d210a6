//! Relative schemes as they act inside attention: on q and k before the scores (RoPE), on the
//! score matrix (additive: Shaw, Transformer-XL, T5, ALiBi, TUPE, DeBERTa; multiplicative: DA,
//! `multiplicative`), or on the context (Shaw's value vectors).
//!
//! A score-forming mechanism owns one [`RelativePosition`] per layer and calls, in order:
//! [`rotate`](RelativePosition::rotate) on new queries and keys, [`scores`](RelativePosition::scores)
//! on each block of scaled scores it forms (with that block's [`ScoreLayout`]), and
//! [`context`](RelativePosition::context) on the probabilities. Every hook reads positions from the
//! layout only, so caches, memories and score blocks need nothing else.

use burn::prelude::*;

use crate::{
    AlibiBias, Disentangled, DistanceAware, MultiplicativePosition, RotaryEmbedding, ScoreLayout, ShawRelative, T5Bias,
    Untied, XlRelative,
};

/// The head geometry a relative scheme is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub d_model: usize,
    pub n_heads: usize,
    pub head_dim: usize,
}

/// One layer's relative position scheme.
#[derive(Module, Debug)]
pub enum RelativePosition {
    Shaw(ShawRelative),
    TransformerXl(XlRelative),
    T5(T5Bias),
    Alibi(AlibiBias),
    Rope(RotaryEmbedding),
    DistanceAware(DistanceAware),
    Multiplicative(MultiplicativePosition),
    Untied(Untied),
    Deberta(Disentangled),
}

impl RelativePosition {
    /// Rotates `x: [b, heads, len, d_h]` whose rows sit at positions `start..` (RoPE); the
    /// identity for every other scheme.
    pub fn rotate(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        match self {
            Self::Rope(r) => r.rotate(x, start),
            _ => x,
        }
    }

    /// The scheme applied to a block of scores `[b, h, len_q, len_k]` that were formed as
    /// `scale · q kᵀ` from queries `q_scaled = scale · q: [b, h, len_q, d_h]` and keys
    /// `k: [b, h_kv, len_k, d_h]`.
    pub fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        k: Tensor<4>,
        layout: &ScoreLayout,
        scale: f64,
    ) -> Tensor<4> {
        let device = scores.device();
        match self {
            Self::Rope(_) => scores,
            Self::Shaw(s) => scores + s.score_term(q_scaled, layout),
            Self::TransformerXl(x) => scores + x.score_term(q_scaled, k, layout),
            Self::T5(t) => scores + t.bias(layout, &device),
            Self::Alibi(a) => scores + a.bias(layout, &device),
            Self::DistanceAware(d) => d.apply(scores, layout),
            Self::Multiplicative(m) => scores * m.factors(layout, &device),
            Self::Untied(u) => scores + u.score_term(layout, scale),
            Self::Deberta(d) => scores + d.score_term(q_scaled, k, layout, scale),
        }
    }

    /// A term added to the attention output `[b, h, len_q, d_h]` from the probabilities (Shaw's
    /// value vectors), if the scheme has one.
    pub fn context(&self, probs: Tensor<4>, layout: &ScoreLayout) -> Option<Tensor<4>> {
        match self {
            Self::Shaw(s) => s.context_term(probs, layout),
            _ => None,
        }
    }
}
