//! The exact GELU (Hendrycks & Gimpel 2016) as one vectorised kernel, forward and backward, on
//! the flex CPU backend:
//!
//! GELU(x) = x · Φ(x) = ½ · x · (1 + erf(x / √2)),   GELU′(x) = Φ(x) + x · φ(x),  φ(x) = e^{−x²/2} / √(2π)
//!
//! Burn's flex backend evaluates erf and exp with one scalar libm call per element, forward and
//! backward: 3.8 ms of the 12.6 ms a baby-GPT feed-forward takes forward + backward
//! (docs/cpu-speed.md). Here erf is Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5 · 10⁻⁷) and exp a
//! range-reduced polynomial, both branch-free so the loops vectorise; the result is the exact
//! GELU to f32 rounding (equal to Burn's, and its gradient, to 1e-5 in the tests), not the tanh
//! approximation. It reaches Burn through the `backend_extension` mechanism: `FastGelu` for `Flex` and for
//! `Autodiff<Flex>` with the hand-written backward. Other backends and float types take Burn's
//! own `gelu`; [`gelu`] chooses.

use burn::prelude::*;

/// The exact GELU: the vectorised kernel on flex (f32), Burn's `gelu` elsewhere.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&x) {
        return Tensor::from_dispatch(burn::backend::Dispatch::fast_gelu(x.into_dispatch()));
    }
    burn::tensor::activation::gelu(x)
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::{exp_neg, written_by};
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    /// The fast exact GELU of the backends that have it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FastGelu: Backend {
        /// The exact GELU of `x`, element by element (f32).
        fn fast_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    /// Φ(x) = ½ (1 + erf(x/√2)) and φ(x), by Abramowitz & Stegun 7.1.26.
    #[inline(always)]
    pub(crate) fn cdf_pdf(x: f32) -> (f32, f32) {
        let z = x * std::f32::consts::FRAC_1_SQRT_2;
        let a = z.abs();
        let t = 1.0 / (1.0 + 0.327_591_1 * a);
        let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
        let g = exp_neg(-a * a); // e^{−x²/2}
        let erf_abs = 1.0 - poly * g;
        let erf = erf_abs.copysign(z);
        (0.5 * (1.0 + erf), g * 0.398_942_3)
    }

    fn contiguous(t: &FlexTensor) -> (FlexTensor, Vec<usize>) {
        let t = t.to_contiguous();
        let dims = t.layout().shape().to_vec();
        (t, dims)
    }

    /// Elements per task: two cores share a 768 × 512 activation in 48 pieces.
    const CHUNK: usize = 8192;

    crate::wide_vectors! {
        fn gelu_into(out: &mut [MaybeUninit<f32>], x: &[f32]) {
            out.iter_mut().zip(x).for_each(|(o, &v)| {
                o.write(v * cdf_pdf(v).0);
            })
        }
    }

    crate::wide_vectors! {
        fn gelu_backward_into(out: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(dy) {
                let (cdf, pdf) = cdf_pdf(v);
                o.write(g * (cdf + v * pdf));
            }
        }
    }

    fn forward_kernel(x: &FlexTensor) -> FlexTensor {
        let (x, dims) = contiguous(x);
        let xs = x.as_slice::<f32>().expect("f32, checked by `gelu`");
        // SAFETY: the chunks cover the output, and gelu_into writes each element of its chunk
        let out = unsafe {
            written_by(xs.len(), |out| {
                out.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK)).for_each(|(o, x)| gelu_into(o, x))
            })
        };
        FlexTensor::from_data(TensorData::new(out, dims))
    }

    /// ∂L/∂x = ∂L/∂y · (Φ(x) + x φ(x)).
    fn backward_kernel(x: &FlexTensor, grad: &FlexTensor) -> FlexTensor {
        let (x, dims) = contiguous(x);
        let (grad, _) = contiguous(grad);
        let (xs, dy) = (x.as_slice::<f32>().expect("f32"), grad.as_slice::<f32>().expect("f32"));
        let chunks = xs.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK));
        // SAFETY: as in the forward
        let out = unsafe {
            written_by(xs.len(), |out| {
                out.par_chunks_mut(CHUNK).zip(chunks).for_each(|(o, (x, dy))| gelu_backward_into(o, x, dy))
            })
        };
        FlexTensor::from_data(TensorData::new(out, dims))
    }

    impl FastGelu for Flex {
        fn fast_gelu(x: FlexTensor) -> FlexTensor {
            forward_kernel(&x)
        }
    }

    #[derive(Debug)]
    struct GeluBackward;

    impl Backward<Flex, 1> for GeluBackward {
        /// The input, checkpointed.
        type State = NodeId;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<Flex>(&ops.node);
            let x: FlexTensor = checkpointer.retrieve_node_output(ops.state);
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, backward_kernel(&x, &grad));
            }
        }
    }

    impl<C: CheckpointStrategy> FastGelu for Autodiff<Flex, C> {
        fn fast_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
            let output = forward_kernel(x.primitive());
            match GeluBackward.prepare::<C>([x.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = prep.checkpoint(&x);
                    prep.finish(state, output)
                }
                OpsKind::UnTracked(prep) => prep.finish(output),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::max_diff;
        use burn::tensor::Distribution;

        #[test]
        fn equals_burns_exact_gelu_with_its_gradient() {
            let device = Device::flex().autodiff();
            device.seed(5);
            // wide values (tails, 0, large magnitudes where e^{−x²/2} underflows), strided input
            let x: Tensor<3> = Tensor::random([3, 40, 9], Distribution::Normal(0.0, 4.0), &device).swap_dims(1, 2);
            let w: Tensor<3> = Tensor::random([3, 9, 40], Distribution::Normal(0.0, 1.0), &device);
            let run = |fast: bool| {
                let x = x.clone().require_grad();
                let y = if fast { gelu(x.clone()) } else { burn::tensor::activation::gelu(x.clone()) };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).unwrap())
            };
            let (y1, dx1) = run(true);
            let (y2, dx2) = run(false);
            assert!(max_diff(y1, y2) < 1e-5, "forward");
            assert!(max_diff(dx1, dx2) < 1e-5, "backward");
        }

        #[test]
        fn erf_holds_its_accuracy() {
            for i in -4000..=4000 {
                let x = i as f32 / 400.0;
                let (cdf, _) = cdf_pdf(x);
                let exact = 0.5 * (1.0 + libm_erf(x as f64 / std::f64::consts::SQRT_2));
                assert!((cdf as f64 - exact).abs() < 3e-7, "Φ({x}) = {cdf}, exact {exact}");
            }
        }

        /// erf in f64 by its Taylor series (|x| ≤ 7.1 here; enough terms for 1e-12).
        fn libm_erf(x: f64) -> f64 {
            if x.abs() > 5.0 {
                return x.signum();
            }
            let (mut term, mut sum, mut n) = (x, x, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -x * x / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
    }
}
