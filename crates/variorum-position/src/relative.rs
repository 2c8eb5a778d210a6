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
    AlibiBias, Disentangled, DistanceAware, Distances, MultiplicativePosition, RotaryEmbedding, ScoreLayout,
    ShawRelative, T5Bias, Untied, XlRelative,
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

    /// Whether the scheme reaches scores through the query–key distance alone (T5, ALiBi) or not
    /// at all (RoPE acts on q and k), so it applies to keys gathered from anywhere
    /// ([`bias_at`](Self::bias_at)). Schemes with content–position terms or value vectors
    /// need a [`ScoreLayout`].
    pub fn works_on_gathered_keys(&self) -> bool {
        matches!(self, Self::Rope(_) | Self::T5(_) | Self::Alibi(_))
    }

    /// The additive term of gathered keys at distances `[groups, n, len_q, len_k]`:
    /// `[n_heads, n, len_q, len_k]`, or `None` when the scheme adds nothing there (RoPE).
    ///
    /// # Panics
    ///
    /// For a scheme without [`works_on_gathered_keys`](Self::works_on_gathered_keys), which
    /// configs refuse before a model is built.
    pub fn bias_at(&self, d: &Distances, device: &Device) -> Option<Tensor<4>> {
        match self {
            Self::Rope(_) => None,
            Self::T5(t) => Some(t.bias_at(d, device)),
            Self::Alibi(a) => Some(a.bias_at(d, device)),
            _ => panic!("this position scheme needs a score layout, not gathered distances"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PositionConfig, T5BiasConfig};

    /// On keys that do form a layout, the gathered bias is the layout's: the same distances, the
    /// same numbers, per-head distances included.
    #[test]
    fn gathered_bias_equals_the_layout_bias() {
        let dev = Device::flex();
        let heads = HeadShape { d_model: 8, n_heads: 2, head_dim: 4 };
        for config in [PositionConfig::Alibi, PositionConfig::T5(T5BiasConfig { num_buckets: 6, max_distance: 9 })] {
            let pos = config.init_relative(heads, 32, &dev).unwrap();
            assert!(pos.works_on_gathered_keys());
            for causal in [true, false] {
                let layout = ScoreLayout::new(7, 2, 3, 5, causal);
                let zeros = Tensor::<4>::zeros([1, 2, 3, 5], &dev);
                let q = Tensor::<4>::zeros([1, 2, 3, 4], &dev);
                let k = Tensor::<4>::zeros([1, 2, 5, 4], &dev);
                let want = pos.scores(zeros, q, k, &layout, 1.0);
                let values: Vec<i64> = (0..3).flat_map(|i| (0..5).map(move |j| layout.distance(i, j))).collect();
                let shared = Distances { dims: [1, 1, 3, 5], values: values.clone(), causal };
                let got = pos.bias_at(&shared, &dev).unwrap().reshape([1, 2, 3, 5]);
                assert!((got - want.clone()).abs().max().into_scalar::<f32>() < 1e-6, "{}", config.kind());
                // one distance table per head: head 1 gets the distances of head 0 shifted by 4
                let shifted: Vec<i64> = values.iter().copied().chain(values.iter().map(|d| d + 4)).collect();
                let per_head = Distances { dims: [2, 1, 3, 5], values: shifted, causal };
                let got = pos.bias_at(&per_head, &dev).unwrap().reshape([1, 2, 3, 5]);
                let head0 = got.clone().narrow(1, 0, 1);
                assert!((head0 - want.narrow(1, 0, 1)).abs().max().into_scalar::<f32>() < 1e-6);
                let layout1 = ScoreLayout::new(11, 2, 3, 5, causal);
                let zeros = Tensor::<4>::zeros([1, 2, 3, 5], &dev);
                let want1 = pos.scores(
                    zeros,
                    Tensor::zeros([1, 2, 3, 4], &dev),
                    Tensor::zeros([1, 2, 5, 4], &dev),
                    &layout1,
                    1.0,
                );
                let d = (got.narrow(1, 1, 1) - want1.narrow(1, 1, 1)).abs().max().into_scalar::<f32>();
                assert!(d < 1e-6, "{} per-head distances: {d}", config.kind());
            }
        }
    }
}
