//! Shared vocabulary of variorum: the attention contract (inputs, masks, outputs), capability
//! declarations read by validation, `variorum zoo` and the generic tests, and config errors.
//!
//! Nothing here depends on a backend: every crate of the workspace is written against Burn's
//! runtime `Device` and `Tensor<D, K>`; the binary picks the backend.
//!
//! ```
//! use burn::prelude::*;
//! use variorum_core::AttentionMask;
//!
//! // a causal mask hides every key after its query: the strict upper triangle of the scores
//! let device = Device::flex();
//! let hidden = AttentionMask::causal().score_mask(3, 3, &device).unwrap();
//! let hidden = hidden.into_data().try_to_vec::<bool>().unwrap();
//! assert_eq!(hidden, [false, true, true, false, false, true, false, false, false]);
//! // a bidirectional layer sees every key: no mask at all
//! assert!(AttentionMask::bidirectional().score_mask(3, 3, &device).is_none());
//! ```

#![warn(missing_docs)]

pub mod capability;
pub mod error;
pub mod kind;
pub mod mask;

pub use capability::{Capabilities, KindInfo};
pub use error::ConfigError;
pub use kind::Declared;
pub use mask::{AttentionMask, EncodedSource, GlobalLocal, GraphMask};

/// Named auxiliary losses a forward pass adds to the language-model loss (already weighted).
/// Between an attention layer and the model's loss they may also hold a policy's per-row
/// log-probabilities ([`REINFORCE_PREFIX`]); what leaves `DecoderLm::loss_with` holds losses only.
pub type AuxLosses = Vec<(String, burn::Tensor<1>)>;

/// An auxiliary term whose name starts with this is no loss but a policy's log-probability per
/// batch row (`[batch]`, e.g. SAC's edge predictor): the model, which knows each row's loss,
/// turns the terms into the REINFORCE surrogate mean_r((L_r − mean L) · Σ log π_r) (the
/// advantage detached) under the name that follows the prefix.
pub const REINFORCE_PREFIX: &str = "reinforce:";

/// Adds `losses` to `sums` by name (a name not yet in `sums` is appended).
pub fn sum_aux_losses(sums: &mut AuxLosses, losses: AuxLosses) {
    for (name, l) in losses {
        match sums.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => *s = s.clone() + l,
            None => sums.push((name, l)),
        }
    }
}

/// Flex sums a whole tensor of this many elements or more across rayon's pool, adding the
/// pieces in the order work stealing split them ([`ordered_sum`]).
const PARALLEL_SUM: usize = 1 << 22;

/// Σ of every element of `t`, `[1]`, in an order fixed by its size alone. Burn's flex backend
/// sums a tensor of 4 Mi elements or more (a large embedding's gradient, attention weights of
/// long rows) in parallel pieces added in the order the threads' work split them, so two runs
/// of one seed could differ in the last bit; here such a tensor is summed in rows of 4,096
/// first (each row's sum, and then the rows', in one fixed order), so no sum is that long.
/// Below that size it is `t.sum()` itself, bit for bit.
pub fn ordered_sum<const D: usize>(t: burn::Tensor<D>) -> burn::Tensor<1> {
    const ROW: usize = 1 << 12;
    let n = t.shape().num_elements();
    let flat: burn::Tensor<1> = t.reshape([n]);
    if n < PARALLEL_SUM {
        return flat.sum();
    }
    let rows = n / ROW;
    let head = flat.clone().slice([0..rows * ROW]).reshape([rows, ROW]).sum_dim(1).reshape([rows]).sum();
    if rows * ROW == n { head } else { head + flat.slice([rows * ROW..n]).sum() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::prelude::*;

    #[test]
    fn an_ordered_sum_is_the_sum_below_the_parallel_size_and_close_to_it_above() {
        let device = Device::flex();
        let small = Tensor::<2>::random([300, 7], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        assert_eq!(ordered_sum(small.clone()).into_data(), small.sum().into_data());
        // 4 Mi + 3 elements: rows of 4,096 and a tail
        let n = PARALLEL_SUM + 3;
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
        let exact: f64 = values.iter().map(|&v| v as f64).sum();
        let big = Tensor::<1>::from_data(TensorData::new(values, [n]), &device);
        let got = ordered_sum(big.clone()).into_scalar::<f32>() as f64;
        assert!((got - exact).abs() / exact < 1e-5, "{got} against {exact}");
    }
}
