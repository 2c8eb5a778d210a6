//! FNet (Lee-Thorp, Ainslie, Eckstein, Ontañón 2021, "FNet: Mixing Tokens with Fourier
//! Transforms", eq. (3)), the `fnet` kind: the attention sublayer replaced by the real part of a
//! two-dimensional discrete Fourier transform, along the hidden dimension and along the sequence,
//!
//! y = ℜ(F_seq(F_hidden(x))),
//!
//! with no parameters at all ([`variorum_kernels::fourier`]: FFTs on the CPU, two real matrix
//! products elsewhere).
//!
//! Choices where the paper leaves one open:
//! - No causal form: every output frequency sums every position, so a next-token model is refused
//!   by name and FNet trains with the masked objective, as the paper's encoder does.
//! - Padding: padded positions are zeroed before the transform (they contribute nothing; the
//!   transform's length stays the padded one).
//! - The paper's FNet block is this mixing, then LayerNorm(x + mixing), then the feed-forward
//!   layer: the block kinds here wrap it the same way (post-LN) or pre-LN.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// `model.attention` with `kind = "fnet"`: no settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FnetConfig {}

impl AttentionKind for FnetConfig {
    type Module = FourierMixing;
    const SUMMARY: &'static str = "FNet: the real part of a 2D discrete Fourier transform (along the sequence and the hidden dimension) instead of attention; no parameters, FFT on the CPU; bidirectional only";
    const PAPER: &'static str =
        "Lee-Thorp, Ainslie, Eckstein, Ontañón 2021, FNet: Mixing Tokens with Fourier Transforms";
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::BIDIRECTIONAL_ONLY };

    fn why_not_causal(&self) -> &'static str {
        "every Fourier coefficient sums every position, so there is no causal form: train FNet with model.objective = { kind = \"masked\" }"
    }

    fn validate(&self, _d_model: usize) -> Result<(), ConfigError> {
        Ok(())
    }

    /// A complex FFT of length n costs about 5 n log₂ n real operations: per token, its share
    /// of the d-long transform of its row and of the d transforms of length `len_k`.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let lg = |n: usize| (n.max(2) as f64).log2();
        (5.0 * d_model as f64 * (lg(d_model) + lg(len_k))).round() as u64
    }

    fn build(&self, init: &LayerInit, _device: &Device) -> FourierMixing {
        FourierMixing { d_model: init.d_model }
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![TestVariant::new("", Self {}).masked()]
    }
}

/// FNet's mixing: no parameters.
#[derive(Module, Debug)]
pub struct FourierMixing {
    /// d, the model width (recorded only: the transforms take their lengths from the input).
    pub d_model: usize,
}

impl AttentionMechanism for FourierMixing {
    /// No decoding state: FNet has no causal form.
    fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let x = crate::engine::projections::zero_padding(input.query, input.mask.padding.as_ref());
        AttentionOutput { context: variorum_kernels::fourier::fourier_mix(x), weights: None, aux_losses: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    /// A padded position changes nothing in the output.
    #[test]
    fn padding_contributes_nothing() {
        let dev = Device::flex();
        dev.seed(2);
        let layer = FourierMixing { d_model: 6 };
        let x = Tensor::<3>::random([1, 5, 6], Distribution::Normal(0.0, 1.0), &dev);
        let changed = x.clone().slice_assign([0..1, 4..5, 0..6], Tensor::ones([1, 1, 6], &dev));
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![false, false, false, false, true], [1, 5]), &dev);
        let mask = AttentionMask { padding: Some(pad), ..AttentionMask::bidirectional() };
        let run = |x: Tensor<3>| layer.forward(AttentionInput::self_attention(x, &mask), None).context;
        let diff = (run(x.clone()) - run(changed.clone())).abs().max().into_scalar::<f32>();
        assert_eq!(diff, 0.0);
        // and unpadded, the same change shows everywhere
        let open = AttentionMask::bidirectional();
        let run = |x: Tensor<3>| layer.forward(AttentionInput::self_attention(x, &open), None).context;
        assert!((run(x) - run(changed)).abs().max().into_scalar::<f32>() > 0.1);
    }
}
