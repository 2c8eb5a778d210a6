//! LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019) over the last axis, each as one
//! flex op with its own backward:
//!
//! LayerNorm: y = x̂ γ + β,   x̂ = (x − μ) · r,   μ = mean(x),   r = 1 / √(var(x) + ε)   (biased variance),
//!
//! ∂L/∂x = r · (g − mean(g) − x̂ · mean(g x̂)),  g = γ ∘ ∂L/∂y;   ∂L/∂γ = Σ_rows ∂L/∂y ∘ x̂,
//! ∂L/∂β = Σ_rows ∂L/∂y;
//!
//! RMSNorm is the same without centring and without β: x̂ = x · r, r = 1 / √(mean(x²) + ε), and
//! ∂L/∂x = r · (g − x̂ · mean(g x̂)).
//!
//! Burn's autodiff runs either as a chain of primitive ops (means, differences, squares, a square
//! root, a division, the affine), each a pass over the activations and a node of the graph,
//! forward and backward. Here each is one pass per direction, rows split over the rayon pool; the
//! forward saves μ and r per row (the input is checkpointed), the backward recomputes x̂ from them.

use burn::prelude::*;

/// LayerNorm of `x` over its last axis: the kernel on flex (f32, with β), Burn's `layer_norm`
/// elsewhere.
pub fn layer_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, beta: Option<Tensor<1>>, epsilon: f64) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if let Some(b) = &beta
        && crate::has_kernel(&x)
        && crate::has_kernel(&gamma)
        && crate::has_kernel(b)
    {
        let b = b.clone();
        return Tensor::from_dispatch(burn::backend::Dispatch::layer_norm_affine(
            x.into_dispatch(),
            gamma.into_dispatch(),
            b.into_dispatch(),
            epsilon,
        ));
    }
    burn::tensor::module::layer_norm(x, gamma, beta, epsilon)
}

/// RMSNorm of `x` over its last axis, x / √(mean(x²) + ε) · γ: the kernel on flex (f32), Burn's
/// composed ops elsewhere (as `burn::nn::RmsNorm` computes it).
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f64) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&x) && crate::has_kernel(&gamma) {
        return Tensor::from_dispatch(burn::backend::Dispatch::rms_norm_scaled(
            x.into_dispatch(),
            gamma.into_dispatch(),
            epsilon,
        ));
    }
    // the mean square in f32 whatever the float type, as Burn's module takes it
    let dtype = x.dtype();
    let rms = (x.clone().cast(burn::tensor::DType::F32).square().mean_dim(D - 1) + epsilon).sqrt();
    (x / rms.cast(dtype)) * gamma.unsqueeze()
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;

    /// LayerNorm of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FusedLayerNorm: Backend {
        /// `x: [.., d]`, `gamma`, `beta: [d]`.
        fn layer_norm_affine(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> FloatTensor<Self>;

        /// `x: [.., d]`, `gamma: [d]`.
        fn rms_norm_scaled(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self>;
    }

    /// Rows per task.
    const ROWS: usize = 64;

    crate::wide_vectors! {
        /// Normalises `x` (rows of `d`) into `out`, writing each row's mean and 1/σ; `beta`
        /// `None` is RMSNorm (no centring, the mean written as 0, no shift).
        #[allow(clippy::too_many_arguments)]
        fn forward_rows(out: &mut [f32], x: &[f32], gamma: &[f32], beta: Option<&[f32]>, mean: &mut [f32], rstd: &mut [f32], eps: f32) {
            let d = gamma.len();
            for (((o, x), m), r) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(mean).zip(rstd) {
                let mu = if beta.is_some() { fast_math::sum(x) / d as f32 } else { 0.0 };
                o.iter_mut().zip(x).for_each(|(o, &v)| *o = v - mu);
                let var = fast_math::dot(o, o) / d as f32;
                let rs = 1.0 / (var + eps).sqrt();
                match beta {
                    Some(beta) => o.iter_mut().zip(gamma).zip(beta).for_each(|((o, &g), &b)| *o = *o * rs * g + b),
                    None => o.iter_mut().zip(gamma).for_each(|(o, &g)| *o *= rs * g),
                }
                (*m, *r) = (mu, rs);
            }
        }
    }

    crate::wide_vectors! {
        /// ∂L/∂x of rows of `d` into `dx`; adds Σ dy ∘ x̂ and Σ dy into `dgamma`, `dbeta`. Not
        /// `centred` (RMSNorm): no −mean(g) term (`dbeta` is then not needed, and summed anyway).
        #[allow(clippy::too_many_arguments)]
        fn backward_rows(dx: &mut [f32], x: &[f32], dy: &[f32], gamma: &[f32], mean: &[f32], rstd: &[f32], dgamma: &mut [f32], dbeta: &mut [f32], centred: bool) {
            let d = gamma.len();
            let rows = dx.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(dy.chunks_exact(d));
            for (((dx, x), dy), (&mu, &rs)) in rows.zip(mean.iter().zip(rstd)) {
                // x̂ into dx for now
                dx.iter_mut().zip(x).for_each(|(h, &v)| *h = (v - mu) * rs);
                let mut g_sum = 0.0;
                let mut gh_sum = 0.0;
                for ((((&h, &g), &dyv), dg), db) in dx.iter().zip(gamma).zip(dy).zip(dgamma.iter_mut()).zip(dbeta.iter_mut()) {
                    let gv = g * dyv;
                    g_sum += gv;
                    gh_sum += gv * h;
                    *dg += dyv * h;
                    *db += dyv;
                }
                let g_mean = if centred { g_sum / d as f32 } else { 0.0 };
                let gh_mean = gh_sum / d as f32;
                dx.iter_mut().zip(gamma).zip(dy).for_each(|((h, &g), &dyv)| *h = rs * (g * dyv - g_mean - *h * gh_mean));
            }
        }
    }

    fn contiguous_f32(t: &FlexTensor) -> FlexTensor {
        t.to_contiguous()
    }

    /// Forward: y, and the per-row mean and 1/σ; `beta` `None` is RMSNorm.
    fn forward_kernel(
        x: &FlexTensor,
        gamma: &FlexTensor,
        beta: Option<&FlexTensor>,
        eps: f64,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let (x, gamma, beta) = (contiguous_f32(x), contiguous_f32(gamma), beta.map(contiguous_f32));
        let dims = x.layout().shape().to_vec();
        let (xs, g, b) = (x.storage::<f32>(), gamma.storage::<f32>(), beta.as_ref().map(|b| b.storage::<f32>()));
        let d = g.len();
        assert_eq!(dims.last(), Some(&d), "LayerNorm of width {d} on input {dims:?}");
        let rows = xs.len() / d.max(1);
        let mut out = vec![0.0f32; xs.len()];
        let (mut mean, mut rstd) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        out.par_chunks_mut(ROWS * d)
            .zip(xs.par_chunks(ROWS * d))
            .zip(mean.par_chunks_mut(ROWS).zip(rstd.par_chunks_mut(ROWS)))
            .for_each(|((o, x), (m, r))| forward_rows(o, x, g, b, m, r, eps as f32));
        let t = |v: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(v, dims));
        (t(out, dims), t(mean, vec![rows]), t(rstd, vec![rows]))
    }

    /// Backward: ∂L/∂x, ∂L/∂γ, ∂L/∂β (of a `centred` norm; RMSNorm's is not).
    fn backward_kernel(
        x: &FlexTensor,
        gamma: &FlexTensor,
        saved: &Saved,
        grad: &FlexTensor,
        centred: bool,
    ) -> [FlexTensor; 3] {
        let (x, gamma, grad) = (contiguous_f32(x), contiguous_f32(gamma), contiguous_f32(grad));
        let dims = x.layout().shape().to_vec();
        let (xs, g, dy) = (x.storage::<f32>(), gamma.storage::<f32>(), grad.storage::<f32>());
        let (mean, rstd) = (saved.mean.storage::<f32>(), saved.rstd.storage::<f32>());
        let d = g.len();
        let mut dx = vec![0.0f32; xs.len()];
        // Each chunk of ROWS rows sums its own part of ∂L/∂γ and ∂L/∂β; the parts are then added
        // in chunk order on this thread. A fold/reduce would add them in the order rayon's work
        // stealing split the rows, so two runs of one seed could differ in the last bit (and
        // runs on another number of threads always would); this order is fixed by the data.
        let parts: Vec<(Vec<f32>, Vec<f32>)> = dx
            .par_chunks_mut(ROWS * d)
            .zip(xs.par_chunks(ROWS * d).zip(dy.par_chunks(ROWS * d)))
            .zip(mean.par_chunks(ROWS).zip(rstd.par_chunks(ROWS)))
            .map(|((dx, (x, dy)), (m, r))| {
                let (mut dg, mut db) = (vec![0.0f32; d], vec![0.0f32; d]);
                backward_rows(dx, x, dy, g, m, r, &mut dg, &mut db, centred);
                (dg, db)
            })
            .collect();
        let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
        for (dg, db) in &parts {
            dgamma.iter_mut().zip(dg).for_each(|(a, b)| *a += b);
            dbeta.iter_mut().zip(db).for_each(|(a, b)| *a += b);
        }
        let t = |v: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(v, dims));
        [t(dx, dims), t(dgamma, vec![d]), t(dbeta, vec![d])]
    }

    impl FusedLayerNorm for Flex {
        fn layer_norm_affine(x: FlexTensor, gamma: FlexTensor, beta: FlexTensor, epsilon: f64) -> FlexTensor {
            forward_kernel(&x, &gamma, Some(&beta), epsilon).0
        }

        fn rms_norm_scaled(x: FlexTensor, gamma: FlexTensor, epsilon: f64) -> FlexTensor {
            forward_kernel(&x, &gamma, None, epsilon).0
        }
    }

    #[derive(Debug)]
    struct LayerNormBackward;

    /// The input and γ (checkpointed) and the per-row statistics.
    #[derive(Debug, Clone)]
    struct Saved {
        x: NodeId,
        gamma: NodeId,
        mean: FlexTensor,
        rstd: FlexTensor,
    }

    impl Backward<Flex, 3> for LayerNormBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let x: FlexTensor = checkpointer.retrieve_node_output(ops.state.x);
            let gamma: FlexTensor = checkpointer.retrieve_node_output(ops.state.gamma);
            let computed = backward_kernel(&x, &gamma, &ops.state, &grad, true);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), computed.map(Some));
        }
    }

    #[derive(Debug)]
    struct RmsNormBackward;

    impl Backward<Flex, 2> for RmsNormBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let x: FlexTensor = checkpointer.retrieve_node_output(ops.state.x);
            let gamma: FlexTensor = checkpointer.retrieve_node_output(ops.state.gamma);
            let [dx, dgamma, _] = backward_kernel(&x, &gamma, &ops.state, &grad, false);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), [Some(dx), Some(dgamma)]);
        }
    }

    impl<C: CheckpointStrategy> FusedLayerNorm for Autodiff<Flex, C> {
        fn layer_norm_affine(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> FloatTensor<Self> {
            let (out, mean, rstd) = forward_kernel(x.primitive(), gamma.primitive(), Some(beta.primitive()), epsilon);
            match LayerNormBackward.prepare::<C>([x.node(), gamma.node(), beta.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = Saved { x: prep.checkpoint(&x), gamma: prep.checkpoint(&gamma), mean, rstd };
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }

        fn rms_norm_scaled(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
            let (out, mean, rstd) = forward_kernel(x.primitive(), gamma.primitive(), None, epsilon);
            match RmsNormBackward.prepare::<C>([x.node(), gamma.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = Saved { x: prep.checkpoint(&x), gamma: prep.checkpoint(&gamma), mean, rstd };
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;

        #[test]
        fn equals_burns_layer_norm_with_its_gradients() {
            let device = Device::flex().autodiff();
            device.seed(9);
            // a strided input with an offset mean and scale; more rows than one task; odd width
            let x: Tensor<3> = Tensor::random([3, 37, 70], Distribution::Normal(2.0, 3.0), &device).swap_dims(1, 2);
            let gamma: Tensor<1> = Tensor::random([37], Distribution::Normal(1.0, 0.5), &device);
            let beta: Tensor<1> = Tensor::random([37], Distribution::Normal(0.0, 0.5), &device);
            let up: Tensor<3> = Tensor::random([3, 70, 37], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let (x, g, b) = (x.clone().require_grad(), gamma.clone().require_grad(), beta.clone().require_grad());
                let y = if fused {
                    layer_norm(x.clone(), g.clone(), Some(b.clone()), 1e-5)
                } else {
                    burn::tensor::module::layer_norm(x.clone(), g.clone(), Some(b.clone()), 1e-5)
                };
                let grads = (y.clone() * up.clone()).sum().backward();
                (y, [x.grad(&grads).unwrap().reshape([-1]), g.grad(&grads).unwrap(), b.grad(&grads).unwrap()])
            };
            let (y1, g1) = run(true);
            let (y2, g2) = run(false);
            assert!(rel_diff(y1, y2) < 1e-5, "forward");
            for ((a, e), name) in g1.into_iter().zip(g2).zip(["dx", "dgamma", "dbeta"]) {
                let d = rel_diff(a, e);
                assert!(d < 1e-5, "{name}: {d}");
            }
        }

        #[test]
        fn equals_burns_rms_norm_with_its_gradients() {
            let device = Device::flex().autodiff();
            device.seed(10);
            let x: Tensor<3> = Tensor::random([3, 37, 70], Distribution::Normal(2.0, 3.0), &device).swap_dims(1, 2);
            let gamma: Tensor<1> = Tensor::random([37], Distribution::Normal(1.0, 0.5), &device);
            let up: Tensor<3> = Tensor::random([3, 70, 37], Distribution::Normal(0.0, 1.0), &device);
            let run = || {
                let (x, g) = (x.clone().require_grad(), gamma.clone().require_grad());
                let y = rms_norm(x.clone(), g.clone(), 1e-5);
                let grads = (y.clone() * up.clone()).sum().backward();
                (y, [x.grad(&grads).unwrap().reshape([-1]), g.grad(&grads).unwrap()])
            };
            let (y1, g1) = run();
            let (y2, g2) = crate::without_kernels(run);
            // the fallback is burn::nn::RmsNorm's formula
            let burns = burn::nn::RmsNormConfig::new(37).with_epsilon(1e-5).init(&device);
            let burns = burn::nn::RmsNorm { gamma: burn::module::Param::from_tensor(gamma.clone()), ..burns };
            assert!(rel_diff(burns.forward(x.clone()), y2.clone()) < 1e-6, "fallback");
            assert!(rel_diff(y1, y2) < 1e-5, "forward");
            for ((a, e), name) in g1.into_iter().zip(g2).zip(["dx", "dgamma"]) {
                let d = rel_diff(a, e);
                assert!(d < 1e-5, "{name}: {d}");
            }
        }
    }
}
