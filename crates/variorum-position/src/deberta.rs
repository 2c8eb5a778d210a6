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
//!
//! DeBERTa v2 and v3 (as Microsoft's code and Hugging Face's `DebertaV2` compute them) add three
//! settings: biases on W_{q,r} and W_{k,r} (`bias`); a LayerNorm on P before both projections
//! (`norm`, v2's `norm_rel_ebd = "layer_norm"`); and logarithmic buckets (`log_buckets` = M, v3's
//! `max_relative_positions`, with `position_buckets` = k): with m = ⌊k/2⌋, a distance d with
//! |d| ≤ m keeps its own row, a longer one shares the row
//! sign(d)·(m + ⌈ln(|d|/m) / ln((M − 1)/m) · (m − 1)⌉), which reaches k − 1 at |d| = M − 1 and
//! is clipped as before. The logarithm is taken in f32, as DeBERTa takes it, so that the rows
//! at the buckets' edges are DeBERTa's.
//!
//! The paper's equation reads the position→content term at δ(j, i), the key's offset from the
//! query; Microsoft's released code (and transformers, and so every DeBERTa checkpoint) reads it
//! at δ(i, j), the same row as content→position (`p2c_distance = "query-minus-key"`). The paper's
//! is the default.

use burn::module::Param;
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
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
    /// Offsets are clipped to [−k, k) (DeBERTa's k, its `att_span`). Default 32.
    pub max_distance: usize,
    /// M: distances beyond k/2 share logarithmic buckets that reach the last row at M − 1
    /// (DeBERTa v3's `max_relative_positions`, with `position_buckets` = k). Unset (the
    /// default): each distance within k has its own row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_buckets: Option<usize>,
    /// Biases on W_{q,r} and W_{k,r} (DeBERTa v2's have them). Default false.
    #[serde(skip_serializing_if = "is_false")]
    pub bias: bool,
    /// A LayerNorm on P before the projections (v2's `norm_rel_ebd = "layer_norm"`). Default false.
    #[serde(skip_serializing_if = "is_false")]
    pub norm: bool,
    /// That LayerNorm's ε. Default 1e-7 (DeBERTa's `layer_norm_eps`).
    #[serde(skip_serializing_if = "is_default_eps")]
    pub norm_eps: f64,
    /// The offset the position→content term reads: `key-minus-query` (δ(j, i), the paper's
    /// equation; default) or `query-minus-key` (δ(i, j), the authors' code and transformers).
    #[serde(skip_serializing_if = "P2cDistance::is_paper")]
    pub p2c_distance: P2cDistance,
}

/// Which offset DeBERTa's position→content term reads for query i and key j.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum P2cDistance {
    /// δ(j, i) = clamp(j − i + k): the paper's equation 4.
    #[default]
    KeyMinusQuery,
    /// δ(i, j) = clamp(i − j + k): Microsoft's code and transformers' `DebertaV2`.
    QueryMinusKey,
}

impl P2cDistance {
    fn is_paper(&self) -> bool {
        *self == P2cDistance::KeyMinusQuery
    }
}

const DEFAULT_EPS: f64 = 1e-7;

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default_eps(eps: &f64) -> bool {
    *eps == DEFAULT_EPS
}

impl Default for DebertaConfig {
    fn default() -> Self {
        Self {
            max_distance: 32,
            log_buckets: None,
            bias: false,
            norm: false,
            norm_eps: DEFAULT_EPS,
            p2c_distance: P2cDistance::KeyMinusQuery,
        }
    }
}

impl DebertaConfig {
    /// Checks the settings; messages name the config key (`model.position.max_distance`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.max_distance > 0, || "model.position.max_distance must be at least 1".into())?;
        check(self.norm_eps > 0.0, || "model.position.norm_eps must be positive".into())?;
        match self.log_buckets {
            Some(m) => {
                let mid = self.max_distance / 2;
                check(mid >= 2, || {
                    format!(
                        "model.position.log_buckets needs max_distance of at least 4 (half of it is exact), not {}",
                        self.max_distance
                    )
                })?;
                check(m > mid + 1, || {
                    format!("model.position.log_buckets = {m} must exceed max_distance / 2 + 1 = {}", mid + 1)
                })
            }
            None => Ok(()),
        }
    }

    /// One layer's position terms; P, W_{q,r} and W_{k,r} start normal with std 0.02.
    pub fn init(&self, d_model: usize, n_heads: usize, head_dim: usize, device: &Device) -> Disentangled {
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let proj = || {
            LinearConfig::new(d_model, n_heads * head_dim)
                .with_bias(self.bias)
                .with_initializer(init.clone())
                .init(device)
        };
        Disentangled {
            relative: init.init([2 * self.max_distance, d_model], device),
            norm: self.norm.then(|| LayerNormConfig::new(d_model).with_epsilon(self.norm_eps).init(device)),
            position_query: proj(),
            position_key: proj(),
            max_distance: self.max_distance,
            log_buckets: self.log_buckets.unwrap_or(0),
            p2c_sign: match self.p2c_distance {
                P2cDistance::KeyMinusQuery => 1,
                P2cDistance::QueryMinusKey => -1,
            },
            n_heads,
        }
    }
}

/// DeBERTa's content→position and position→content terms of one attention layer.
#[derive(Module, Debug)]
pub struct Disentangled {
    /// P, `[2k, d_model]`.
    pub relative: Param<Tensor<2>>,
    /// The LayerNorm on P, if any.
    pub norm: Option<LayerNorm>,
    /// W_{q,r}
    pub position_query: Linear,
    /// W_{k,r}
    pub position_key: Linear,
    /// k: offsets are clipped to [−k, k).
    pub max_distance: usize,
    /// M of the logarithmic buckets; 0: none.
    pub log_buckets: usize,
    /// 1: position→content reads δ(j, i); −1: δ(i, j).
    pub p2c_sign: i64,
    /// Query heads h.
    pub n_heads: usize,
}

impl Disentangled {
    /// DeBERTa's δ for a distance: clamp(bucket(d) + k, 0, 2k − 1).
    fn delta(&self, d: i64) -> i64 {
        let k = self.max_distance as i64;
        (self.bucket(d) + k).clamp(0, 2 * k - 1)
    }

    /// The row position→content reads for a key at `d` = key − query positions from the query.
    fn p2c_delta(&self, d: i64) -> i64 {
        self.delta(self.p2c_sign * d)
    }

    /// The distance itself, or its logarithmic bucket (v3's `make_log_bucket_position`).
    fn bucket(&self, d: i64) -> i64 {
        let mid = (self.max_distance / 2) as i64;
        if self.log_buckets == 0 || d.abs() <= mid {
            return d;
        }
        // in f32 as DeBERTa computes it; (M − 1)/m is formed in f64 first, as there
        let ratio = ((self.log_buckets - 1) as f64 / mid as f64) as f32;
        let scaled = (d.abs() as f32 / mid as f32).ln() / ratio.ln() * (mid - 1) as f32;
        d.signum() * (scaled.ceil() as i64 + mid)
    }

    /// `[1, h, 2k, d_h]`
    fn project(&self, proj: &Linear) -> Tensor<4> {
        let relative = self.relative.val();
        let relative = match &self.norm {
            Some(norm) => norm.forward(relative),
            None => relative,
        };
        let p = proj.forward(relative);
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

        // position→content: k_j · Q^r_{δ(j,i)}, δ(j, i) = clamp(j − i + k) (or the code's δ(i, j))
        let k = if hkv == h {
            k
        } else {
            k.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, lk, dh]).reshape([b, h, lk, dh])
        };
        let p2c = k.matmul(self.project(&self.position_query).swap_dims(2, 3)).mul_scalar(scale);
        let transposed =
            ScoreLayout { q_start: layout.k_start, k_start: layout.q_start, len_q: lk, len_k: layout.len_q, ..*layout };
        let p2c = gather_buckets(p2c, transposed.index(|d| self.p2c_delta(d), &device)).swap_dims(2, 3);
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
        vec![
            ("to 4", Self { max_distance: 4, ..Self::default() }),
            (
                "v3: log buckets, biases, normed, the code's p2c",
                Self {
                    max_distance: 4,
                    log_buckets: Some(9),
                    bias: true,
                    norm: true,
                    norm_eps: 1e-5,
                    p2c_distance: P2cDistance::QueryMinusKey,
                },
            ),
        ]
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
            bucket: entry_buckets(len_k, |d| self.p2c_delta(-d)),
        };
        Some(DistanceTerms { queries: Some(c2p), keys: Some(p2c), ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn device() -> Device {
        Device::default()
    }

    #[test]
    fn log_buckets_are_debertas() {
        // transformers 5.24.0's make_log_bucket_position over the distances −40..=40, for
        // position_buckets 8 with max_relative_positions 20 and 16 with 64
        let k8: [i64; 81] = [
            -9, -9, -9, -9, -9, -9, -9, -9, -9, -8, -8, -8, -8, -8, -8, -8, -8, -8, -8, -8, -8, -7, -7, -7, -7, -7, -7,
            -7, -7, -6, -6, -6, -6, -6, -5, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 5, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7,
            7, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9,
        ];
        let k16: [i64; 81] = [
            -14, -14, -14, -14, -14, -14, -13, -13, -13, -13, -13, -13, -13, -13, -12, -12, -12, -12, -12, -12, -12,
            -11, -11, -11, -11, -11, -10, -10, -10, -10, -9, -9, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6,
            7, 8, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11, 11, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
            14, 14, 14, 14, 14, 14,
        ];
        for (k, m, expected) in [(8, 20, k8), (16, 64, k16)] {
            let config = DebertaConfig { max_distance: k, log_buckets: Some(m), ..DebertaConfig::default() };
            config.validate().unwrap();
            let position = config.init(8, 2, 4, &device());
            for (d, want) in (-40i64..=40).zip(expected) {
                assert_eq!(position.bucket(d), want, "k = {k}, M = {m}, distance {d}");
                assert_eq!(position.delta(d), (want + k as i64).clamp(0, 2 * k as i64 - 1));
            }
        }
        // without log buckets every distance within k is its own
        let plain = DebertaConfig { max_distance: 8, ..DebertaConfig::default() }.init(8, 2, 4, &device());
        assert_eq!((-10..=10).map(|d| plain.delta(d)).collect::<Vec<_>>(), {
            let mut v = vec![0, 0];
            v.extend(0..16);
            v.extend([15, 15, 15]);
            v
        });
    }

    /// c2p and p2c of every pair, by hand from the weights: q_i · K^r_{δ(i,j)} and
    /// k_j · Q^r_{δ(j,i)}, with K^r = LN(P) W_{k,r} + b_{k,r}, Q^r = LN(P) W_{q,r} + b_{q,r}.
    #[test]
    fn score_terms_are_the_disentangled_formula() {
        let dev = device();
        let (d_model, heads, dh, k) = (8usize, 2usize, 3usize, 4usize);
        for p2c_distance in [P2cDistance::KeyMinusQuery, P2cDistance::QueryMinusKey] {
            let config = DebertaConfig {
                max_distance: k,
                log_buckets: Some(9),
                bias: true,
                norm: true,
                norm_eps: 1e-5,
                p2c_distance,
            };
            config.validate().unwrap();
            let mut position = config.init(d_model, heads, dh, &dev);
            let random = |shape: Vec<usize>| {
                Tensor::<1>::random([shape.iter().product::<usize>()], Distribution::Normal(0.0, 1.0), &dev)
            };
            let norm = position.norm.as_mut().unwrap();
            norm.gamma = Param::from_tensor(random(vec![d_model]));
            norm.beta = Some(Param::from_tensor(random(vec![d_model])));
            position.relative = Param::from_tensor(random(vec![2 * k, d_model]).reshape([2 * k, d_model]));
            for proj in [&mut position.position_query, &mut position.position_key] {
                proj.weight = Param::from_tensor(random(vec![d_model, heads * dh]).reshape([d_model, heads * dh]));
                proj.bias = Some(Param::from_tensor(random(vec![heads * dh])));
            }
            let (len_q, len_k, q_start) = (5usize, 12usize, 7usize);
            let q = Tensor::<1>::random([heads * len_q * dh], Distribution::Normal(0.0, 1.0), &dev)
                .reshape([1, heads, len_q, dh]);
            let keys = Tensor::<1>::random([heads * len_k * dh], Distribution::Normal(0.0, 1.0), &dev)
                .reshape([1, heads, len_k, dh]);
            let scale = 0.37;
            let layout = ScoreLayout::new(q_start, 0, len_q, len_k, false);
            let got: Vec<f32> =
                position.score_term(q.clone(), keys.clone(), &layout, scale).into_data().try_to_vec::<f32>().unwrap();

            let values = |t: Tensor<2>| -> Vec<f32> { t.into_data().try_to_vec::<f32>().unwrap() };
            let p = values(position.relative.val());
            let gamma = values(position.norm.as_ref().unwrap().gamma.val().unsqueeze());
            let beta = values(position.norm.as_ref().unwrap().beta.as_ref().unwrap().val().unsqueeze());
            let normed: Vec<Vec<f32>> = p
                .chunks(d_model)
                .map(|row| {
                    let mean = row.iter().sum::<f32>() / d_model as f32;
                    let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / d_model as f32;
                    row.iter().enumerate().map(|(c, x)| (x - mean) / (var + 1e-5).sqrt() * gamma[c] + beta[c]).collect()
                })
                .collect();
            let project = |proj: &Linear| -> Vec<Vec<f32>> {
                let (w, b) = (values(proj.weight.val()), values(proj.bias.as_ref().unwrap().val().unsqueeze()));
                normed
                    .iter()
                    .map(|row| {
                        (0..heads * dh)
                            .map(|o| b[o] + (0..d_model).map(|c| row[c] * w[c * heads * dh + o]).sum::<f32>())
                            .collect()
                    })
                    .collect()
            };
            let (kr, qr) = (project(&position.position_key), project(&position.position_query));
            let (qv, kv): (Vec<f32>, Vec<f32>) =
                (q.into_data().try_to_vec::<f32>().unwrap(), keys.into_data().try_to_vec::<f32>().unwrap());
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
            for h in 0..heads {
                for i in 0..len_q {
                    for j in 0..len_k {
                        let d = (q_start + i) as i64 - j as i64;
                        let qi = &qv[(h * len_q + i) * dh..][..dh];
                        let kj = &kv[(h * len_k + j) * dh..][..dh];
                        let c2p = dot(qi, &kr[position.delta(d) as usize][h * dh..][..dh]);
                        // the paper's δ(j, i), or the code's δ(i, j)
                        let row = match p2c_distance {
                            P2cDistance::KeyMinusQuery => position.delta(-d),
                            P2cDistance::QueryMinusKey => position.delta(d),
                        };
                        let p2c = scale as f32 * dot(kj, &qr[row as usize][h * dh..][..dh]);
                        let g = got[(h * len_q + i) * len_k + j];
                        assert!(
                            (g - c2p - p2c).abs() < 1e-4,
                            "{p2c_distance:?}, head {h}, query {i}, key {j}: {g} vs {}",
                            c2p + p2c
                        );
                    }
                }
            }
        }
    }
}
