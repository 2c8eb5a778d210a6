//! CPU kernels for the hot path of training on Burn's flex backend: operations that Burn runs as
//! chains of primitive ops (each a pass over memory, each recorded by autodiff) written as one
//! kernel with a hand-written backward. Each is a `backend_extension` op for `Flex` and
//! `Autodiff<Flex>` (the AdamW step, which autodiff never sees, for `Flex` alone); its public
//! function computes the same thing with Burn's ops elsewhere, so the modules stay
//! backend-agnostic. Each is tested against the composed computation to 1e-5.
//! Where the time went and what each gave: docs/cpu-speed.md.
//!
//! The kernels are compiled only with the `flex` feature (the CLI turns it on): without it, this
//! crate and every library crate above it build against Burn with no backend at all, and every
//! function here is its composed fallback.
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::Distribution;
//!
//! // the fused LayerNorm computes what Burn's composed op computes
//! let device = Device::flex();
//! let x = Tensor::<2>::random([4, 16], Distribution::Normal(0.0, 1.0), &device);
//! let gamma = Tensor::<1>::random([16], Distribution::Normal(1.0, 0.1), &device);
//! let beta = Tensor::<1>::random([16], Distribution::Normal(0.0, 0.1), &device);
//! let fused = variorum_kernels::layer_norm::layer_norm(x.clone(), gamma.clone(), Some(beta.clone()), 1e-5);
//! let composed = burn::tensor::module::layer_norm(x, gamma, Some(beta), 1e-5);
//! assert!((fused - composed).abs().max().into_scalar::<f32>() < 1e-5);
//! ```

#![warn(missing_docs)]

pub mod adamw;
pub mod block_sparse;
pub mod causal_attention;
pub mod cross_entropy;
pub mod fast_math;
pub mod fourier;
pub mod gated;
pub mod gelu;
pub mod layer_norm;
pub mod linear;
pub mod linear_attention;
pub mod lora;
pub mod normalisers;
pub mod query_blocked;
pub mod rope;
pub mod sinkhorn;

use burn::prelude::*;

/// Whether `t`'s backend and float type have these kernels (flex, f32, and the crate built with
/// its `flex` feature) and they are on ([`without_kernels`]); every public function here falls
/// back to Burn's ops otherwise.
#[cfg(feature = "flex")]
pub fn has_kernel<const D: usize>(t: &Tensor<D>) -> bool {
    !KERNELS_OFF.get() && t.dtype() == burn::tensor::DType::F32 && t.device().inner() == Device::flex()
}

thread_local! {
    static KERNELS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every kernel here off on this thread, so each public function takes its
/// composed fallback: tests hold the two paths to each other, benchmarks measure what a kernel
/// gives.
pub fn without_kernels<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the setting, also when `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            KERNELS_OFF.set(self.0);
        }
    }
    let _restore = Restore(KERNELS_OFF.replace(true));
    f()
}

/// Without the `flex` feature no tensor has these kernels.
#[cfg(not(feature = "flex"))]
pub fn has_kernel<const D: usize>(_t: &Tensor<D>) -> bool {
    false
}

/// Hands each computed gradient to its parent, where autodiff tracks one (the tail of every
/// kernel's backward pass).
#[cfg(feature = "flex")]
fn register<const N: usize>(
    grads: &mut burn::backend::autodiff::grads::Gradients,
    parents: [Option<burn::backend::autodiff::NodeId>; N],
    computed: [Option<burn::backend::flex::FlexTensor>; N],
) {
    for (parent, g) in parents.into_iter().zip(computed) {
        if let (Some(id), Some(g)) = (parent, g) {
            grads.register::<burn::backend::Flex>(id, g);
        }
    }
}

/// Comparisons the kernels' tests share.
#[cfg(all(test, feature = "flex"))]
mod test_util {
    use burn::prelude::*;

    /// max |a − b|.
    pub fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// max |a − b| relative to the largest |b| (when that exceeds 1): sums over a hundred terms
    /// of values near 10 round differently in a different order.
    pub fn rel_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1.0);
        max_diff(a, b) / scale
    }
}
