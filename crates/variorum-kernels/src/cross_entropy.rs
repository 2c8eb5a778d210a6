//! The language-model loss as one op: the mean over rows of −log softmax(z)_t,
//!
//! ℓ = (1/N) Σᵢ (lseᵢ − z_{i,tᵢ}),   lseᵢ = log Σⱼ e^{z_ij},
//! ∂ℓ/∂z_ij = (softmax(zᵢ)_j − [j = tᵢ]) / N.
//!
//! Burn's `CrossEntropyLoss` records log-softmax (max, subtract, exp, sum, log, subtract), a
//! gather, a reshape and a mean, each an op over the `[N, vocab]` logits with its own backward;
//! libm's scalar `expf` alone was 1.4 % of a baby-GPT step (docs/cpu-speed.md). Here the forward
//! keeps one log-sum-exp per row and the backward writes the gradient in one pass.

use burn::nn::loss::CrossEntropyLossConfig;

use burn::prelude::*;

/// Mean cross-entropy of `[n, vocab]` logits against `[n]` class indices: the kernel on flex
/// (f32), Burn's `CrossEntropyLoss` elsewhere.
///
/// # Panics
/// On a target outside `0..vocab` (as Burn's loss does).
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&logits) && targets.device().inner() == Device::flex() {
        return Tensor::from_dispatch(burn::backend::Dispatch::cross_entropy_mean(
            logits.into_dispatch(),
            targets.into_dispatch(),
        ));
    }
    let device = logits.device();
    CrossEntropyLossConfig::new().init(&device).forward(logits, targets)
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::{exp_neg, max, sum_of, written_by};
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::{FloatTensor, IntTensor};
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    /// The mean cross-entropy of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FusedCrossEntropy: Backend {
        /// `logits: [n, vocab]`, `targets: [n]` → `[1]`.
        fn cross_entropy_mean(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self>;
    }

    /// Rows per parallel task.
    const ROWS: usize = 64;

    /// The targets as indices into a row of `vocab`.
    fn indices(targets: &FlexTensor, vocab: usize) -> Vec<usize> {
        let data = targets.clone().into_data().convert::<i64>();
        let values = data.as_slice::<i64>().expect("converted to i64");
        values
            .iter()
            .map(|&t| {
                assert!(
                    (0..vocab as i64).contains(&t),
                    "cross-entropy target {t} is outside the vocabulary 0..{vocab}"
                );
                t as usize
            })
            .collect()
    }

    crate::wide_vectors! {
        /// log Σⱼ e^{z_j} of each `vocab`-wide row.
        fn log_sum_exp_rows(lse: &mut [MaybeUninit<f32>], z: &[f32], vocab: usize) {
            for (l, row) in lse.iter_mut().zip(z.chunks_exact(vocab)) {
                let m = max(row);
                let total = sum_of(row, |x| exp_neg(x - m));
                l.write(m + total.ln());
            }
        }
    }

    crate::wide_vectors! {
        /// e^{z − lse} · scale for each `vocab`-wide row.
        fn scaled_softmax_rows(out: &mut [MaybeUninit<f32>], z: &[f32], lse: &[f32], vocab: usize, scale: f32) {
            for ((o, row), &l) in out.chunks_exact_mut(vocab).zip(z.chunks_exact(vocab)).zip(lse) {
                o.iter_mut().zip(row).for_each(|(o, &x)| {
                    o.write(exp_neg(x - l) * scale);
                });
            }
        }
    }

    /// The mean loss `[1]` and each row's log-sum-exp.
    fn forward_kernel(logits: &FlexTensor, targets: &FlexTensor) -> (FlexTensor, FlexTensor) {
        let z = logits.to_contiguous();
        let [n, vocab]: [usize; 2] = z.layout().shape().to_vec().try_into().expect("[n, vocab] logits");
        let t = indices(targets, vocab);
        assert_eq!(t.len(), n, "{n} rows of logits, {} targets", t.len());
        let zs = z.storage::<f32>();
        // SAFETY: each chunk of rows writes one log-sum-exp per row
        let lse = unsafe {
            written_by(n, |lse| {
                lse.par_chunks_mut(ROWS)
                    .zip(zs.par_chunks(ROWS * vocab))
                    .for_each(|(l, z)| log_sum_exp_rows(l, z, vocab))
            })
        };
        let total: f64 = lse.iter().zip(&t).enumerate().map(|(i, (&l, &t))| (l - zs[i * vocab + t]) as f64).sum();
        let loss = if n == 0 { f32::NAN } else { (total / n as f64) as f32 };
        (FlexTensor::from_data(TensorData::new(vec![loss], [1])), FlexTensor::from_data(TensorData::new(lse, [n])))
    }

    /// ∂ℓ/∂z for an upstream gradient `grad` (`[1]`).
    fn backward_kernel(logits: &FlexTensor, targets: &FlexTensor, lse: &FlexTensor, grad: &FlexTensor) -> FlexTensor {
        let z = logits.to_contiguous();
        let [n, vocab]: [usize; 2] = z.layout().shape().to_vec().try_into().expect("[n, vocab] logits");
        let t = indices(targets, vocab);
        let lse = lse.to_contiguous();
        let (zs, ls) = (z.storage::<f32>(), lse.storage::<f32>());
        let scale = grad.to_contiguous().storage::<f32>()[0] / n as f32;
        // SAFETY: each chunk of rows writes every element of its rows
        let mut out = unsafe {
            written_by(n * vocab, |out| {
                out.par_chunks_mut(ROWS * vocab)
                    .zip(zs.par_chunks(ROWS * vocab))
                    .zip(ls.par_chunks(ROWS))
                    .for_each(|((o, z), l)| scaled_softmax_rows(o, z, l, vocab, scale))
            })
        };
        for (i, &t) in t.iter().enumerate() {
            out[i * vocab + t] -= scale;
        }
        FlexTensor::from_data(TensorData::new(out, [n, vocab]))
    }

    impl FusedCrossEntropy for Flex {
        fn cross_entropy_mean(logits: FlexTensor, targets: FlexTensor) -> FlexTensor {
            forward_kernel(&logits, &targets).0
        }
    }

    #[derive(Debug)]
    struct CrossEntropyBackward;

    /// The logits (checkpointed), the targets and each row's log-sum-exp.
    #[derive(Debug, Clone)]
    struct Saved {
        logits: NodeId,
        targets: FlexTensor,
        lse: FlexTensor,
    }

    impl Backward<Flex, 1> for CrossEntropyBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let logits: FlexTensor = checkpointer.retrieve_node_output(ops.state.logits);
            let dz = backward_kernel(&logits, &ops.state.targets, &ops.state.lse, &grad);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), [Some(dz)]);
        }
    }

    impl<C: CheckpointStrategy> FusedCrossEntropy for Autodiff<Flex, C> {
        fn cross_entropy_mean(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
            let (loss, lse) = forward_kernel(logits.primitive(), &targets);
            match CrossEntropyBackward.prepare::<C>([logits.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = Saved { logits: prep.checkpoint(&logits), targets, lse };
                    prep.finish(state, loss)
                }
                OpsKind::UnTracked(prep) => prep.finish(loss),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;

        /// Loss and gradient equal Burn's `CrossEntropyLoss` on more rows than one task, logits far
        /// from zero (the max subtraction), strided (transposed) logits.
        #[test]
        fn equals_burns_cross_entropy_with_its_gradient() {
            let device = Device::flex().autodiff();
            device.seed(3);
            let (n, vocab) = (150, 37);
            let z: Tensor<2> =
                Tensor::random([vocab, n], Distribution::Normal(0.0, 4.0), &device).transpose().add_scalar(30.0);
            let targets: Tensor<1, Int> = Tensor::random([n], Distribution::Uniform(0.0, vocab as f64), &device);
            // an upstream gradient of n · 0.7 keeps ∂ℓ/∂z of order one, so 1e-5 is relative
            let up: Tensor<1> = Tensor::from_floats([0.7 * n as f32], &device);
            let run = |fused: bool| {
                let z = z.clone().require_grad();
                let loss = if fused {
                    cross_entropy(z.clone(), targets.clone())
                } else {
                    CrossEntropyLossConfig::new().init(&device).forward(z.clone(), targets.clone())
                };
                let grads = (loss.clone() * up.clone()).sum().backward();
                (loss, z.grad(&grads).unwrap())
            };
            let ((l1, g1), (l2, g2)) = (run(true), run(false));
            assert!(rel_diff(l1.inner(), l2.inner()) < 1e-5, "loss");
            assert!(g2.clone().abs().max().into_scalar::<f32>() > 0.5, "the gradient is of order one");
            assert!(rel_diff(g1, g2) < 1e-5, "gradient");
        }

        #[test]
        #[should_panic(expected = "outside the vocabulary")]
        fn a_target_past_the_vocabulary_is_refused() {
            let device = Device::flex();
            let z: Tensor<2> = Tensor::zeros([2, 5], &device);
            cross_entropy(z, Tensor::from_ints([1, 5], &device));
        }
    }
}
