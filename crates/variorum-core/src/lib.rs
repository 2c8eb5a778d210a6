//! Shared vocabulary of variorum: the attention contract (inputs, masks, outputs), capability
//! declarations read by validation, `variorum zoo` and the generic tests, and config errors.
//!
//! Nothing here depends on a backend: every crate of the workspace is written against Burn's
//! runtime `Device` and `Tensor<D, K>`; the binary picks the backend.

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
