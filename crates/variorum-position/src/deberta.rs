//! DeBERTa disentangled attention (He et al. 2021):
//!
//! Ã_ij = Q^c_i K^c_jᵀ + Q^c_i K^r_{δ(i,j)}ᵀ + K^c_j Q^r_{δ(j,i)}ᵀ,   scaled by 1/√(3d),
//! Q^r = P W_{q,r},  K^r = P W_{k,r},  δ(i, j) = clamp(i − j + k, 0, 2k − 1),
//!
//! content→content, content→position and position→content, with relative embeddings P of the 2k
//! clipped offsets. Each position term is computed for the 2k offsets (`[len, 2k]` per head) and
//! gathered per pair, so nothing of size L×L×d is formed.
//!
//! Choices: P is per layer (DeBERTa shares it across layers); the enhanced mask decoder
//! (absolute positions before the softmax layer) is an MLM detail, left out of the decoder LM.

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::ScoreLayout;
use crate::kind::{HeadShape, PositionKind, RelativeScheme, TermsFor};
use crate::layout::{entry_buckets, gather_buckets};
use variorum_core::Capabilities;
use variorum_kernels::block_sparse::{DistanceTable, DistanceTerms};

/// `model.position` with `kind = "deberta"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DebertaConfig {
    /// Offsets are clipped to [−k, k) (DeBERTa's k). Default 32.
    pub max_distance: usize,
}

impl Default for DebertaConfig {
    fn default() -> Self {
        Self { max_distance: 32 }
    }
}

impl DebertaConfig {
    /// Checks the settings; messages name the config key (`model.position.max_distance`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.max_distance > 0, || "model.position.max_distance must be at least 1".into())
    }

    /// One layer's position terms; P, W_{q,r} and W_{k,r} start normal with std 0.02.
    pub fn init(&self, d_model: usize, n_heads: usize, head_dim: usize, device: &Device) -> Disentangled {
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let proj = || {
            LinearConfig::new(d_model, n_heads * head_dim).with_bias(false).with_initializer(init.clone()).init(device)
        };
        Disentangled {
            relative: init.init([2 * self.max_distance, d_model], device),
            position_query: proj(),
            position_key: proj(),
            max_distance: self.max_distance,
            n_heads,
        }
    }
}

/// DeBERTa's content→position and position→content terms of one attention layer.
#[derive(Module, Debug)]
pub struct Disentangled {
    /// P, `[2k, d_model]`.
    pub relative: Param<Tensor<2>>,
    /// W_{q,r}
    pub position_query: Linear,
    /// W_{k,r}
    pub position_key: Linear,
    /// k: offsets are clipped to [−k, k).
    pub max_distance: usize,
    /// Query heads h.
    pub n_heads: usize,
}

impl Disentangled {
    /// DeBERTa's δ for a distance: clamp(d + k, 0, 2k − 1).
    fn delta(&self, d: i64) -> i64 {
        let k = self.max_distance as i64;
        (d + k).clamp(0, 2 * k - 1)
    }

    /// `[1, h, 2k, d_h]`
    fn project(&self, proj: &Linear) -> Tensor<4> {
        let p = proj.forward(self.relative.val());
        let [rows, hd] = p.dims();
        p.reshape([rows, self.n_heads, hd / self.n_heads]).swap_dims(0, 1).unsqueeze_dim(0)
    }

    /// c2p + p2c for scaled queries `q: [b, h, len_q, d_h]` and keys `k: [b, h_kv, len_k, d_h]`
    /// (each K/V head serves `h / h_kv` query heads); `scale` is the score scale 1/√(3d).
    pub fn score_term(&self, q: Tensor<4>, k: Tensor<4>, layout: &ScoreLayout, scale: f64) -> Tensor<4> {
        let [b, h, _, dh] = q.dims();
        let [_, hkv, lk, _] = k.dims();
        let device = q.device();
        let delta = |d: i64| self.delta(d);

        // content→position: q_i · K^r_{δ(i,j)}
        let c2p = q.matmul(self.project(&self.position_key).swap_dims(2, 3));
        let c2p = gather_buckets(c2p, layout.index(delta, &device));

        // position→content: k_j · Q^r_{δ(j,i)}, δ(j, i) = clamp(j − i + k) = clamp(−d + k)
        let k = if hkv == h {
            k
        } else {
            k.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, lk, dh]).reshape([b, h, lk, dh])
        };
        let p2c = k.matmul(self.project(&self.position_query).swap_dims(2, 3)).mul_scalar(scale);
        let transposed =
            ScoreLayout { q_start: layout.k_start, k_start: layout.q_start, len_q: lk, len_k: layout.len_q, ..*layout };
        let p2c = gather_buckets(p2c, transposed.index(delta, &device)).swap_dims(2, 3);
        c2p + p2c
    }
}

impl PositionKind for DebertaConfig {
    const SUMMARY: &'static str = "disentangled attention: content→content + content→position + position→content";
    const PAPER: &'static str = "He et al. 2021, DeBERTa";
    const CAPS: Capabilities = Capabilities { score_bias: true, ..Capabilities::NEUTRAL };

    fn validate(&self, _heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        DebertaConfig::validate(self)
    }

    fn init_relative(&self, heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.d_model, heads.n_heads, heads.head_dim, device).into())
    }

    /// DeBERTa divides the scores by √(3d): its two position terms are of the content term's size.
    fn content_scale(&self) -> f64 {
        (1.0f64 / 3.0).sqrt()
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("to 4", Self { max_distance: 4 })]
    }
}

impl RelativeScheme for Disentangled {
    fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        k: Tensor<4>,
        layout: &ScoreLayout,
        scale: f64,
    ) -> Tensor<4> {
        scores + self.score_term(q_scaled, k, layout, scale)
    }

    fn has_distance_terms(&self) -> bool {
        true
    }

    /// c2p as a query term over δ(i, j), p2c as a key term over δ(j, i) (its table scaled, since
    /// the kernel's keys are not).
    fn distance_terms(&self, at: TermsFor, _: &Device) -> Option<DistanceTerms> {
        let TermsFor { len_k, scale, .. } = at;
        let per_head = |proj: &Linear| {
            let rows = self.project(proj);
            let [_, h, n, dh] = rows.dims();
            rows.reshape([h, n, dh])
        };
        let c2p = DistanceTable { rows: per_head(&self.position_key), bucket: entry_buckets(len_k, |d| self.delta(d)) };
        let p2c = DistanceTable {
            rows: per_head(&self.position_query).mul_scalar(scale),
            bucket: entry_buckets(len_k, |d| self.delta(-d)),
        };
        Some(DistanceTerms { queries: Some(c2p), keys: Some(p2c), ..Default::default() })
    }
}
