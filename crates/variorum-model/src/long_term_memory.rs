//! SPALM's long-term memory (Yogatama et al. 2021, *Adaptive semiparametric language models*):
//! before the output head, each position mixes its own state with the tokens that followed the
//! contexts most like it in a large datastore.
//!
//! For position t with final hidden state h_t (after the last norm of a pre-LN stack) and the
//! k retrieved next tokens v_1 … v_k, whose embeddings y_i = E\[v_i\] are rows of the model's
//! own token embedding:
//!
//! ```text
//! m_t = Σ_i softmax_i(y_iᵀ h_t) · y_i
//! g_t = σ(w_gᵀ h_t + b_g)
//! z_t = (1 − g_t) · m_t + g_t · h_t
//! p(x_{t+1} | x_≤t) = softmax(W z_t)
//! ```
//!
//! The short-term memory of the paper is Transformer-XL's (`model.memory`), which the rest of
//! the stack provides. Retrieval itself is not here: the neighbours arrive with the batch
//! ([`crate::Rows::neighbours`]), looked up by the trainer in a table searched once with a
//! pretrained model's keys, which stay fixed while the model trains (the paper's choice). What
//! trains end to end is the aggregation, the gate and, through y_i, the token embedding: the
//! paper's "value encoder is the word embedding matrix, updated with the LM".
//!
//! Choices where the paper leaves room:
//! - **g_t is a scalar per position** (w_g is a vector, as the equation writes it), with a bias.
//!   The gate's weights start at 0 and its bias at `gate_bias`, so the model starts from a
//!   fixed mix.
//! - **y_i reads the input embedding** E, which is also the output matrix W of a model with tied
//!   embeddings (the paper's setting); an untied model keeps a separate W.
//! - **A position with no neighbour** (none found, or a batch without neighbours) has g_t = 1
//!   exactly, so z_t = h_t and the model is the LM alone, to the bit.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

/// `[model.long_term_memory]`: SPALM's gated long-term memory before the output head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LongTermMemoryConfig {
    /// Neighbours read per position: the first `k` of the neighbour table's (which may hold
    /// more). Default 4.
    pub k: usize,
    /// The gate's starting bias b_g: σ(b_g) is the share of h_t at the start. Default 0 (an
    /// even mix).
    pub gate_bias: f64,
}

impl Default for LongTermMemoryConfig {
    fn default() -> Self {
        Self { k: 4, gate_bias: 0.0 }
    }
}

/// The most neighbours per position a model reads.
pub const MAX_NEIGHBOURS: usize = 1024;

impl LongTermMemoryConfig {
    /// Checks `k` and `gate_bias`; messages name the config key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check((1..=MAX_NEIGHBOURS).contains(&self.k), || {
            format!("model.long_term_memory.k = {} must be in 1..={MAX_NEIGHBOURS}", self.k)
        })?;
        check(self.gate_bias.is_finite(), || {
            format!("model.long_term_memory.gate_bias = {} must be a finite number", self.gate_bias)
        })
    }

    /// The memory for a residual stream of width `d_model`: gate weights 0, gate bias `gate_bias`.
    pub fn init(&self, d_model: usize, device: &Device) -> LongTermMemory {
        let gate = LinearConfig::new(d_model, 1).with_initializer(Initializer::Constant { value: 0.0 }).init(device);
        let bias = Tensor::<1>::full([1], self.gate_bias, device);
        let gate = Linear { bias: gate.bias.map(|b| b.map(|_| bias)), ..gate };
        LongTermMemory { gate, k: self.k }
    }
}

/// SPALM's gate between a position's state and its retrieved tokens ([module docs](self)).
#[derive(Module, Debug)]
pub struct LongTermMemory {
    /// w_g and b_g: `d_model → 1`.
    pub gate: Linear,
    /// Neighbours read per position.
    pub k: usize,
}

impl LongTermMemory {
    /// z (`[batch, len, d_model]`) from the final states `h` (same shape), the retrieved
    /// tokens `neighbours` (`[batch, len, ≥ k]`, negative = none; the first `k` are read) and
    /// the token embedding `embedding` (`[vocab, d_model]`).
    pub fn forward(&self, h: Tensor<3>, neighbours: Tensor<3, Int>, embedding: Tensor<2>) -> Tensor<3> {
        let [b, len, d] = h.dims();
        let [nb, nl, available] = neighbours.dims();
        assert!(nb == b && nl == len, "neighbours [{nb}, {nl}, _] for states [{b}, {len}, _]");
        assert!(available >= self.k, "{available} neighbours per position, the model reads {}", self.k);
        let k = self.k;
        let neighbours = if available > k { neighbours.slice([0..b, 0..len, 0..k]) } else { neighbours };
        let present = neighbours.clone().greater_equal_elem(0);
        let ids = neighbours.clamp_min(0).reshape([b * len * k]);
        let y = embedding.select(0, ids).reshape([b, len, k, d]);
        // y_iᵀ h_t, without scaling (the paper's equation); absent neighbours weigh nothing
        let scores = (y.clone() * h.clone().unsqueeze_dim::<4>(2)).sum_dim(3).squeeze_dim::<3>(3);
        let scores = scores.mask_fill(present.clone().bool_not(), -1.0e30);
        let weights = softmax(scores, 2);
        let m = (weights.unsqueeze_dim::<4>(3) * y).sum_dim(2).squeeze_dim::<3>(2);
        // no neighbour at all: the gate is 1, z = h exactly
        let none = present.bool_not().all_dim(2);
        let g = self.gate_values(h.clone()).unsqueeze_dim::<3>(2).mask_fill(none, 1.0);
        h * g.clone() + m * g.neg().add_scalar(1.0)
    }

    /// The gate g_t at every position of `h` (`[batch, len]`).
    pub fn gate_values(&self, h: Tensor<3>) -> Tensor<2> {
        sigmoid(self.gate.forward(h)).squeeze_dim::<2>(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn setup() -> (Device, LongTermMemory, Tensor<3>, Tensor<2>) {
        let device = Device::flex();
        device.seed(7);
        let cfg = LongTermMemoryConfig { k: 3, gate_bias: 0.3 };
        let mut ltm = cfg.init(8, &device);
        // a gate that depends on h
        ltm.gate.weight = ltm.gate.weight.map(|w| w.random_like(Distribution::Normal(0.0, 0.5)));
        let h = Tensor::<3>::random([2, 4, 8], Distribution::Normal(0.0, 1.0), &device);
        let e = Tensor::<2>::random([11, 8], Distribution::Normal(0.0, 1.0), &device);
        (device, ltm, h, e)
    }

    /// z_t against the equations, computed by hand on the host for every position.
    #[test]
    fn mixes_the_attended_neighbours_by_the_gate() {
        let (device, ltm, h, e) = setup();
        let ids: Vec<i64> = vec![1, 2, 3, 4, 4, -1, 0, 10, 5, -1, -1, 7, 9, 9, 9, 2, 3, 1, 6, 6, 6, 8, 0, 1];
        let nb = Tensor::<3, Int>::from_data(TensorData::new(ids.clone(), [2, 4, 3]), &device);
        let z = ltm.forward(h.clone(), nb, e.clone()).into_data().try_to_vec::<f32>().unwrap();
        let hv = h.clone().into_data().try_to_vec::<f32>().unwrap();
        let ev = e.into_data().try_to_vec::<f32>().unwrap();
        let g = ltm.gate_values(h).into_data().try_to_vec::<f32>().unwrap();
        for t in 0..8 {
            let ht = &hv[t * 8..(t + 1) * 8];
            let ys: Vec<&[f32]> =
                ids[t * 3..(t + 1) * 3].iter().filter(|&&i| i >= 0).map(|&i| &ev[i as usize * 8..][..8]).collect();
            let s: Vec<f32> = ys.iter().map(|y| y.iter().zip(ht).map(|(a, b)| a * b).sum()).collect();
            let top = s.iter().cloned().fold(f32::MIN, f32::max);
            let w: Vec<f32> = s.iter().map(|x| (x - top).exp()).collect();
            let total: f32 = w.iter().sum();
            for j in 0..8 {
                let m: f32 = ys.iter().zip(&w).map(|(y, wi)| y[j] * wi / total).sum();
                let want = (1.0 - g[t]) * m + g[t] * ht[j];
                assert!((z[t * 8 + j] - want).abs() < 1e-5, "position {t}, {j}: {} vs {want}", z[t * 8 + j]);
            }
        }
    }

    /// A position without neighbours is the LM's own state, to the bit; the others are not.
    #[test]
    fn no_neighbours_leaves_the_state_unchanged() {
        let (device, ltm, h, e) = setup();
        let none = Tensor::<3, Int>::full([2, 4, 3], -1, &device);
        let z = ltm.forward(h.clone(), none, e.clone());
        assert_eq!(z.into_data().try_to_vec::<f32>().unwrap(), h.clone().into_data().try_to_vec::<f32>().unwrap());
        let some = Tensor::<3, Int>::full([2, 4, 3], 2, &device);
        let z = ltm.forward(h.clone(), some, e);
        assert!((z - h).abs().max().into_scalar::<f32>() > 1e-3);
    }

    /// Each position reads its own neighbours only: changing position 2's changes z at 2 alone.
    #[test]
    fn a_position_reads_only_its_own_neighbours() {
        let (device, ltm, h, e) = setup();
        let mut ids = vec![3i64; 2 * 4 * 3];
        let a = ltm.forward(h.clone(), Tensor::from_data(TensorData::new(ids.clone(), [2, 4, 3]), &device), e.clone());
        ids[2 * 3] = 9; // row 0, position 2, first neighbour
        let b = ltm.forward(h, Tensor::from_data(TensorData::new(ids, [2, 4, 3]), &device), e);
        let diff = (a - b).abs().sum_dim(2).squeeze_dim::<2>(2).into_data().try_to_vec::<f32>().unwrap();
        for (i, d) in diff.iter().enumerate() {
            assert_eq!(*d > 0.0, i == 2, "position {i} changed by {d}");
        }
    }

    /// The first `k` of a wider table are read; the rest are ignored.
    #[test]
    fn reads_the_first_k_of_a_wider_table() {
        let (device, ltm, h, e) = setup();
        let narrow = Tensor::<3, Int>::full([2, 4, 3], 5, &device);
        let wide = Tensor::cat(vec![narrow.clone(), Tensor::<3, Int>::full([2, 4, 2], 1, &device)], 2);
        let a = ltm.forward(h.clone(), narrow, e.clone()).into_data().try_to_vec::<f32>().unwrap();
        let b = ltm.forward(h, wide, e).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(a, b);
    }

    /// Training reaches the gate and, through the retrieved embeddings, the embedding rows of the
    /// neighbours (the value encoder), and no other row.
    #[test]
    fn gradients_reach_the_gate_and_the_retrieved_embeddings() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let ltm = LongTermMemoryConfig::default().init(8, &device);
        let h = Tensor::<3>::random([1, 2, 8], Distribution::Normal(0.0, 1.0), &device);
        let e = Tensor::<2>::random([6, 8], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let nb = Tensor::<3, Int>::from_data(TensorData::new(vec![1i64, 2, -1, -1, 4, 4, 4, 4], [1, 2, 4]), &device);
        let grads = ltm.forward(h, nb, e.clone()).powi_scalar(2).sum().backward();
        let ge = e.grad(&grads).unwrap().abs().sum_dim(1).into_data().try_to_vec::<f32>().unwrap();
        for (row, g) in ge.iter().enumerate() {
            assert_eq!(*g > 0.0, [1, 2, 4].contains(&row), "embedding row {row}: gradient {g}");
        }
        let gw = ltm.gate.weight.grad(&grads).unwrap().abs().sum().into_scalar::<f32>();
        assert!(gw > 0.0);
    }

    #[test]
    fn refuses_a_bad_k() {
        assert!(LongTermMemoryConfig { k: 0, ..Default::default() }.validate().is_err());
        assert!(LongTermMemoryConfig { k: MAX_NEIGHBOURS + 1, ..Default::default() }.validate().is_err());
        assert!(LongTermMemoryConfig { gate_bias: f64::NAN, ..Default::default() }.validate().is_err());
        assert!(LongTermMemoryConfig::default().validate().is_ok());
    }
}
