//! Transformer-XL relative position encoding (Dai et al. 2019):
//!
//! A^rel_ij = q_iᵀ k_j + q_iᵀ W_R r_{i−j} + uᵀ k_j + vᵀ W_R r_{i−j}
//!          = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_R r_{i−j},
//!
//! with q_i = W_q x_i, k_j = W_{E,k} x_j (the content key projection), r_{i−j} the sinusoid of the
//! distance (no position is added to the input), a separate key projection W_R for positions, and
//! global biases u, v per head that replace the query's position term.
//!
//! The position term needs, for every query i and key j, the entry for distance i − j. Instead of
//! gathering, (q_i + v)ᵀ W_R r is computed once for each of the W distinct distances of the block,
//! `[len_q, W]`, and row i is shifted left by `len_q − 1 − i` ([`relative_shift`], the paper's
//! appendix B): O(L·W·d) work and no L×L×d tensor. It is correct for keys longer than the queries
//! (a cache or a memory before them) because distances come from the absolute positions.
//!
//! Choices: u and v are per layer (`untie_r`, the Hugging Face default; the paper shares them);
//! queries arrive already scaled by 1/√d, so u and v live in the scaled space (a reparametrisation
//! of the same model).

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::ScoreLayout;
use crate::kind::{HeadShape, PositionKind, RelativeScheme, TermsFor};
use crate::layout::{entry_buckets, entry_index};
use variorum_core::Capabilities;
use variorum_kernels::block_sparse::{DistanceTable, DistanceTerms};

/// `model.position` with `kind = "transformer-xl"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XlRelativeConfig {
    /// Base of the sinusoid wavelengths. Default 10000.
    pub base: f64,
}

impl Default for XlRelativeConfig {
    fn default() -> Self {
        Self { base: 10_000.0 }
    }
}

impl XlRelativeConfig {
    /// Checks the settings against `d_model` (even); messages name the config key.
    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        check(d_model % 2 == 0, || {
            format!("model.position.kind = \"transformer-xl\" needs an even model.d_model, got {d_model}")
        })?;
        check(self.base > 1.0, || format!("model.position.base = {} must be > 1", self.base))
    }

    /// One layer's W_R, u and v, normal with std 0.02.
    pub fn init(&self, d_model: usize, n_heads: usize, head_dim: usize, device: &Device) -> XlRelative {
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        XlRelative {
            position_key: LinearConfig::new(d_model, n_heads * head_dim)
                .with_bias(false)
                .with_initializer(init.clone())
                .init(device),
            u: init.init([n_heads, head_dim], device),
            v: init.init([n_heads, head_dim], device),
            base: self.base,
            d_model,
        }
    }
}

/// Transformer-XL's position terms of one attention layer.
#[derive(Module, Debug)]
pub struct XlRelative {
    /// W_R: sinusoids of distances → per-head keys.
    pub position_key: Linear,
    /// Content bias u, `[n_heads, head_dim]`.
    pub u: Param<Tensor<2>>,
    /// Position bias v, `[n_heads, head_dim]`.
    pub v: Param<Tensor<2>>,
    /// Base of the sinusoid wavelengths.
    pub base: f64,
    /// Width of the sinusoids r (even).
    pub d_model: usize,
}

/// Row `i` of `x: [b, h, len_q, W]` shifted left by `len_q − 1 − i`, keeping `len_k ≤ W` columns:
/// `out[.., i, j] = x[.., i, j + len_q − 1 − i]`. Pad one zero column in front, view the rows as
/// one flat line of `len_q·(W + 1)`, drop the first `len_q` entries and re-cut it into rows of W.
pub fn relative_shift(x: Tensor<4>, len_k: usize) -> Tensor<4> {
    let [b, h, lq, w] = x.dims();
    assert!(len_k <= w, "relative_shift: {len_k} keys need at least as many distances, got {w}");
    let zero = Tensor::zeros([b, h, lq, 1], &x.device());
    let flat = Tensor::cat(vec![zero, x], 3).reshape([b, h, lq * (w + 1)]);
    flat.narrow(2, lq, lq * w).reshape([b, h, lq, w]).narrow(3, 0, len_k)
}

impl XlRelative {
    /// Sinusoids r_d for the distances `max, max−step, …`, `[count, d_model]`, laid out
    /// [sin | cos] as in the paper's code.
    fn sinusoids(&self, max: i64, count: usize, step: usize, device: &Device) -> Tensor<2> {
        let half = self.d_model / 2;
        let mut v = vec![0f32; count * self.d_model];
        for c in 0..count {
            let d = (max - (c * step) as i64) as f64;
            for k in 0..half {
                let a = d * self.base.powf(-(2.0 * k as f64) / self.d_model as f64);
                v[c * self.d_model + k] = a.sin() as f32;
                v[c * self.d_model + half + k] = a.cos() as f32;
            }
        }
        Tensor::from_data(TensorData::new(v, [count, self.d_model]), device)
    }

    /// Distances the block needs, largest first: all of them, or for causal blocks whose keys
    /// reach the last query's position only the len_k largest (every row's visible distances are
    /// among them; the others are masked, and the shift reads finite values into them).
    fn distance_count(layout: &ScoreLayout) -> usize {
        // a block whose keys end before its queries do (a global key column) needs them all
        let keys_reach_last_query = layout.distance(layout.len_q - 1, layout.len_k - 1) <= 0;
        if layout.causal && keys_reach_last_query { layout.len_k } else { layout.len_q + layout.len_k - 1 }
    }

    /// uᵀk_j + (q_i + v)ᵀ W_R r_{i−j} for scaled queries `q: [b, h, len_q, d_h]` and keys
    /// `k: [b, h_kv, len_k, d_h]` (grouped-query heads share keys): `[b, h, len_q, len_k]`.
    pub fn score_term(&self, q: Tensor<4>, k: Tensor<4>, layout: &ScoreLayout) -> Tensor<4> {
        let [b, h, _, dh] = q.dims();
        let [_, hkv, lk, _] = k.dims();
        let device = q.device();
        let w = Self::distance_count(layout);
        let r = self.position_key.forward(self.sinusoids(layout.max_distance(), w, layout.stride, &device));
        let r = r.reshape([w, h, dh]).swap_dims(0, 1).unsqueeze_dim::<4>(0); // [1, h, W, dh]
        let v = self.v.val().reshape([1, h, 1, dh]);
        let position = relative_shift((q + v).matmul(r.swap_dims(2, 3)), lk);

        // uᵀk_j: [b, h_kv, lk, g] for the g query heads of each K/V head, then [b, h, 1, lk]
        let g = h / hkv;
        let u = self.u.val().reshape([1, hkv, g, dh]).swap_dims(2, 3);
        let content = k.matmul(u).swap_dims(2, 3).reshape([b, h, 1, lk]);
        position + content
    }
}

impl PositionKind for XlRelativeConfig {
    const SUMMARY: &'static str =
        "sinusoidal relative encodings, position key projection, global biases u, v; relative shift";
    const PAPER: &'static str = "Dai et al. 2019, Transformer-XL";
    const CAPS: Capabilities = Capabilities { score_bias: true, ..Capabilities::NEUTRAL };

    fn validate(&self, heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        XlRelativeConfig::validate(self, heads.d_model)
    }

    fn init_relative(&self, heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.d_model, heads.n_heads, heads.head_dim, device).into())
    }
}

impl RelativeScheme for XlRelative {
    fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        k: Tensor<4>,
        layout: &ScoreLayout,
        _scale: f64,
    ) -> Tensor<4> {
        scores + self.score_term(q_scaled, k, layout)
    }

    fn has_distance_terms(&self) -> bool {
        true
    }

    /// The four terms apart: q_iᵀW_R r_{i−j} a query term with one table row per distance the
    /// call can score (up to its reach; for causal attention the non-negative ones, the others
    /// are hidden), uᵀk_j a key term of one row, vᵀW_R r_{i−j} a bias per head and distance.
    fn distance_terms(&self, at: TermsFor, device: &Device) -> Option<DistanceTerms> {
        let TermsFor { n_heads: h, len_k, reach, causal, .. } = at;
        let dh = self.u.dims()[1];
        let last = reach.min(len_k - 1) as i64;
        let count = if causal { last as usize + 1 } else { 2 * last as usize + 1 };
        let r = self.position_key.forward(self.sinusoids(last, count, 1, device));
        let rows = r.reshape([count, h, dh]).swap_dims(0, 1); // [h, count, dh]
        // row c is distance last − c; distances past the reach are never scored
        let row = |d: i64| (last - d).clamp(0, count as i64 - 1);
        let (bucket, index) = (entry_buckets(len_k, row), entry_index(len_k, row, device));
        let v_r = self.v.val().reshape([h, 1, dh]).matmul(rows.clone().swap_dims(1, 2)).reshape([h, count]);
        Some(DistanceTerms {
            queries: Some(DistanceTable { rows, bucket }),
            keys: Some(DistanceTable { rows: self.u.val().reshape([h, 1, dh]), bucket: entry_buckets(len_k, |_| 0) }),
            bias: Some(v_r.select(1, index)),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn random(shape: [usize; 4], dev: &Device) -> Tensor<4> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    /// The O(L²·d) definition: for every pair, (q_i + v)·W_R r_{i−j} + u·k_j.
    fn naive(xl: &XlRelative, q: Tensor<4>, k: Tensor<4>, layout: &ScoreLayout) -> Vec<f32> {
        let [_, h, lq, dh] = q.dims();
        let lk = k.dims()[2];
        let dev = q.device();
        let q = q.into_data().try_to_vec::<f32>().unwrap();
        let k = k.into_data().try_to_vec::<f32>().unwrap();
        let u = xl.u.val().into_data().try_to_vec::<f32>().unwrap();
        let v = xl.v.val().into_data().try_to_vec::<f32>().unwrap();
        let mut out = vec![0f32; h * lq * lk];
        for i in 0..lq {
            for j in 0..lk {
                let d = layout.distance(i, j);
                let r = xl.position_key.forward(xl.sinusoids(d, 1, 1, &dev)).into_data().try_to_vec::<f32>().unwrap();
                for head in 0..h {
                    let mut s = 0.0;
                    for c in 0..dh {
                        let qi = q[(head * lq + i) * dh + c];
                        s +=
                            (qi + v[head * dh + c]) * r[head * dh + c] + u[head * dh + c] * k[(head * lk + j) * dh + c];
                    }
                    out[(head * lq + i) * lk + j] = s;
                }
            }
        }
        out
    }

    #[test]
    fn relative_shift_equals_the_naive_computation() {
        let dev = Device::flex();
        let xl = XlRelativeConfig::default().init(8, 2, 4, &dev);
        // fresh self-attention, a cache step, a memory of 3 before 4 queries, bidirectional
        let layouts = [
            ScoreLayout::new(0, 0, 5, 5, true),
            ScoreLayout::new(6, 0, 1, 7, true),
            ScoreLayout::new(3, 0, 4, 7, true),
            ScoreLayout::new(3, 0, 4, 7, false),
            ScoreLayout::new(10, 12, 3, 2, false),
            // causal blocks whose keys end before the queries (a global key column) or after
            ScoreLayout::new(0, 3, 6, 1, true),
            ScoreLayout::new(0, 2, 6, 2, true),
            ScoreLayout::new(4, 0, 2, 9, true),
            // every 3rd position (a strided pattern's columns), causal and not
            ScoreLayout::new(2, 2, 4, 4, true).with_stride(3),
            ScoreLayout::new(2, 2, 4, 4, false).with_stride(3),
        ];
        for layout in layouts {
            let q = random([1, 2, layout.len_q, 4], &dev);
            let k = random([1, 2, layout.len_k, 4], &dev);
            let fast = xl.score_term(q.clone(), k.clone(), &layout).into_data().try_to_vec::<f32>().unwrap();
            let slow = naive(&xl, q, k, &layout);
            for (n, (a, b)) in fast.iter().zip(&slow).enumerate() {
                let (i, j) = ((n / layout.len_k) % layout.len_q, n % layout.len_k);
                let visible = !layout.causal || layout.distance(i, j) >= 0;
                assert!(!visible || (a - b).abs() < 1e-4, "{layout:?} at ({i}, {j}): {a} vs {b}");
            }
        }
    }
}
