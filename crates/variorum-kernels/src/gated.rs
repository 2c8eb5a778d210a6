//! The gate of a gated linear unit as one vectorised flex op, forward and backward:
//!
//! y = σ(a) ∘ b,   [a | b] = h (the two halves of the fused up-projection's output),
//!
//! ∂L/∂a = ∂L/∂y ∘ b ∘ σ′(a),   ∂L/∂b = ∂L/∂y ∘ σ(a),
//!
//! with σ the sigmoid (GLU), the exact GELU (GEGLU) or Swish / SiLU, a·sigmoid(a) (SwiGLU).
//! Burn records the two halves' slices, the activation (SiLU alone is four ops: a negation, an
//! exponential, a reciprocal and a product) and the product, each a pass over the hidden layer
//! forward and backward; here it is one pass each way, and the gradient comes back in h's layout
//! (no slice gradients padded and summed). [`gated`] chooses: the kernel on flex, Burn's ops
//! elsewhere.

use burn::prelude::*;

/// σ of [`gated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// σ(a) = 1 / (1 + e^{−a}) (GLU).
    Sigmoid,
    /// The exact GELU, a Φ(a) (GEGLU).
    Gelu,
    /// Swish₁ / SiLU, a · sigmoid(a) (SwiGLU).
    Silu,
}

impl Gate {
    /// σ by Burn's ops.
    fn composed<const D: usize>(self, a: Tensor<D>) -> Tensor<D> {
        use burn::tensor::activation::{gelu, sigmoid, silu};
        match self {
            Gate::Sigmoid => sigmoid(a),
            Gate::Gelu => gelu(a),
            Gate::Silu => silu(a),
        }
    }
}

/// σ(a) ∘ b of `h = [.., 2 F]` (a its first F features, b the last F): `[.., F]`.
pub fn gated<const D: usize>(h: Tensor<D>, gate: Gate) -> Tensor<D> {
    let w = h.dims()[D - 1];
    assert!(w % 2 == 0, "a gated unit's input has a gate and a value half: width {w} is odd");
    #[cfg(feature = "flex")]
    if crate::has_kernel(&h) {
        return Tensor::from_dispatch(burn::backend::Dispatch::gated_unit(h.into_dispatch(), gate));
    }
    let a = h.clone().narrow(D - 1, 0, w / 2);
    gate.composed(a) * h.narrow(D - 1, w / 2, w / 2)
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::{exp_neg, written_by};
    use crate::gelu::cdf_pdf;
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

    /// The fused gate of the backends that have it.
    #[backend_extension(Flex, Autodiff)]
    pub trait GatedUnit: Backend {
        /// σ(a) ∘ b of `h = [.., 2 F]` (a its first F features, b the last F): `[.., F]`.
        fn gated_unit(h: FloatTensor<Self>, gate: Gate) -> FloatTensor<Self>;
    }

    /// Rows per task (of F outputs each): a baby model's 768 rows in 12 pieces.
    const ROWS: usize = 64;

    /// sigmoid(a), branch-free: e^{−|a|} is at most 1.
    #[inline(always)]
    fn sigmoid(a: f32) -> f32 {
        let e = exp_neg(-a.abs());
        let s = 1.0 / (1.0 + e);
        if a >= 0.0 { s } else { e * s }
    }

    /// σ(a) and σ′(a).
    #[inline(always)]
    fn activation(gate: Gate, a: f32) -> (f32, f32) {
        match gate {
            Gate::Sigmoid => {
                let s = sigmoid(a);
                (s, s * (1.0 - s))
            }
            Gate::Gelu => {
                let (cdf, pdf) = cdf_pdf(a);
                (a * cdf, cdf + a * pdf)
            }
            Gate::Silu => {
                let s = sigmoid(a);
                (a * s, s * (1.0 + a * (1.0 - s)))
            }
        }
    }

    crate::wide_vectors! {
        /// y = σ(a) ∘ b, row by row (`h` rows of 2F, `out` rows of F); one loop per σ, so each
        /// vectorises with its activation inlined.
        fn forward_rows(out: &mut [MaybeUninit<f32>], h: &[f32], f: usize, gate: Gate) {
            for (o, h) in out.chunks_exact_mut(f).zip(h.chunks_exact(2 * f)) {
                let (a, b) = h.split_at(f);
                match gate {
                    Gate::Sigmoid => forward_row(Gate::Sigmoid, o, a, b),
                    Gate::Gelu => forward_row(Gate::Gelu, o, a, b),
                    Gate::Silu => forward_row(Gate::Silu, o, a, b),
                }
            }
        }
    }

    /// σ(a) ∘ b of one row (inlined per σ, as [`backward_row`]; a `for` loop, not `for_each`,
    /// whose closure was compiled out of line, without the wrapper's AVX2).
    #[inline(always)]
    fn forward_row(gate: Gate, out: &mut [MaybeUninit<f32>], a: &[f32], b: &[f32]) {
        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
            o.write(activation(gate, a).0 * b);
        }
    }

    /// ∂L/∂a and ∂L/∂b of one row; `#[inline(always)]` so that each σ's copy vectorises inside
    /// the wide_vectors wrapper (a closure there is not reliably inlined, and ran on SSE2).
    #[inline(always)]
    fn backward_row(
        gate: Gate,
        da: &mut [MaybeUninit<f32>],
        db: &mut [MaybeUninit<f32>],
        a: &[f32],
        b: &[f32],
        dy: &[f32],
    ) {
        for ((((da, db), &a), &b), &g) in da.iter_mut().zip(db.iter_mut()).zip(a).zip(b).zip(dy) {
            let (s, ds) = activation(gate, a);
            da.write(g * b * ds);
            db.write(g * s);
        }
    }

    crate::wide_vectors! {
        /// [∂L/∂a | ∂L/∂b] row by row (`dh`, `h` rows of 2F, `dy` rows of F).
        fn backward_rows(dh: &mut [MaybeUninit<f32>], h: &[f32], dy: &[f32], f: usize, gate: Gate) {
            for ((d, h), dy) in dh.chunks_exact_mut(2 * f).zip(h.chunks_exact(2 * f)).zip(dy.chunks_exact(f)) {
                let (da, db) = d.split_at_mut(f);
                let (a, b) = h.split_at(f);
                match gate {
                    Gate::Sigmoid => backward_row(Gate::Sigmoid, da, db, a, b, dy),
                    Gate::Gelu => backward_row(Gate::Gelu, da, db, a, b, dy),
                    Gate::Silu => backward_row(Gate::Silu, da, db, a, b, dy),
                }
            }
        }
    }

    /// y from h `[.., 2F]`.
    fn forward_kernel(h: &FlexTensor, gate: Gate) -> FlexTensor {
        let h = h.to_contiguous();
        let mut dims = h.layout().shape().to_vec();
        let w = *dims.last().expect("a gated unit's input has a feature axis");
        let f = w / 2;
        let hs = h.storage::<f32>();
        // SAFETY: the tasks' chunks cover the output, and each row of F is written whole
        let out = unsafe {
            written_by(hs.len() / 2, |out| {
                out.par_chunks_mut(ROWS * f).zip(hs.par_chunks(ROWS * w)).for_each(|(o, h)| forward_rows(o, h, f, gate))
            })
        };
        *dims.last_mut().expect("checked") = f;
        FlexTensor::from_data(TensorData::new(out, dims))
    }

    /// ∂L/∂h from h and ∂L/∂y.
    fn backward_kernel(h: &FlexTensor, grad: &FlexTensor, gate: Gate) -> FlexTensor {
        let (h, grad) = (h.to_contiguous(), grad.to_contiguous());
        let dims = h.layout().shape().to_vec();
        let w = *dims.last().expect("checked in the forward");
        let f = w / 2;
        let (hs, dy) = (h.storage::<f32>(), grad.storage::<f32>());
        // the zips below would stop early on a mismatch and leave the output unwritten
        assert_eq!(2 * dy.len(), hs.len(), "the gate's gradient is half its input's width");
        // SAFETY: as in the forward, both halves of every row written
        let dh = unsafe {
            written_by(hs.len(), |dh| {
                dh.par_chunks_mut(ROWS * w)
                    .zip(hs.par_chunks(ROWS * w).zip(dy.par_chunks(ROWS * f)))
                    .for_each(|(d, (h, dy))| backward_rows(d, h, dy, f, gate))
            })
        };
        FlexTensor::from_data(TensorData::new(dh, dims))
    }

    impl GatedUnit for Flex {
        fn gated_unit(h: FlexTensor, gate: Gate) -> FlexTensor {
            forward_kernel(&h, gate)
        }
    }

    #[derive(Debug)]
    struct GatedBackward(Gate);

    impl Backward<Flex, 1> for GatedBackward {
        /// The input, checkpointed.
        type State = NodeId;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<Flex>(&ops.node);
            let h: FlexTensor = checkpointer.retrieve_node_output(ops.state);
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, backward_kernel(&h, &grad, self.0));
            }
        }
    }

    impl<C: CheckpointStrategy> GatedUnit for Autodiff<Flex, C> {
        fn gated_unit(h: FloatTensor<Self>, gate: Gate) -> FloatTensor<Self> {
            let output = forward_kernel(h.primitive(), gate);
            match GatedBackward(gate).prepare::<C>([h.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = prep.checkpoint(&h);
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
        fn equals_burns_composed_gate_with_its_gradient() {
            let device = Device::flex().autodiff();
            device.seed(11);
            // wide values (both tails, where e^{−|a|} underflows), a strided input, more rows than
            // one task, an odd half width
            let h: Tensor<3> = Tensor::random([3, 2 * 37, 70], Distribution::Normal(0.0, 6.0), &device).swap_dims(1, 2);
            let up: Tensor<3> = Tensor::random([3, 70, 37], Distribution::Normal(0.0, 1.0), &device);
            for gate in [Gate::Sigmoid, Gate::Gelu, Gate::Silu] {
                let run = || {
                    let h = h.clone().require_grad();
                    let y = gated(h.clone(), gate);
                    let grads = (y.clone() * up.clone()).sum().backward();
                    (y, h.grad(&grads).unwrap())
                };
                let (y1, dh1) = run();
                let (y2, dh2) = crate::without_kernels(run);
                assert!(max_diff(y1, y2) < 1e-5, "{gate:?} forward");
                assert!(max_diff(dh1, dh2) < 1e-5, "{gate:?} backward");
            }
        }
    }
}
