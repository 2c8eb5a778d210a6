//! The affine map of a linear layer, y = x W + b (W: `[d_in, d_out]`, Burn's layout), as one flex
//! op with its own backward:
//!
//! ∂L/∂x = ∂L/∂y Wᵀ,   ∂L/∂W = xᵀ ∂L/∂y,   ∂L/∂b = Σ_rows ∂L/∂y.
//!
//! Burn's flex backend runs it as a matmul and a broadcast add, and allocates each matmul output
//! as a zero-filled byte vector that it then copies once more into an aligned buffer
//! (`FlexTensor::empty` → `Bytes::from_bytes_vec`): with the bias add that is four passes over the
//! output besides the GEMM — 7.6 % memmove and 7.8 % memset of a baby-GPT training step
//! (docs/cpu-speed.md). Here the output starts as the bias rows and the GEMM accumulates into
//! it; the gradients are written by their GEMMs into fresh buffers, read in place from strided
//! operands (the transposes are strides, not copies); the bias gradient is one pass of column
//! sums.

use burn::prelude::*;

/// `x w (+ b)` over the last axis of `x`: the kernel on flex (f32), Burn's `linear` elsewhere.
pub fn linear<const D: usize>(x: Tensor<D>, w: Tensor<2>, b: Option<Tensor<1>>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if D >= 2 && crate::has_kernel(&x) && crate::has_kernel(&w) && b.as_ref().is_none_or(crate::has_kernel) {
        let d = match b {
            Some(b) => burn::backend::Dispatch::affine(x.into_dispatch(), w.into_dispatch(), b.into_dispatch()),
            None => burn::backend::Dispatch::matmul_rows(x.into_dispatch(), w.into_dispatch()),
        };
        return Tensor::from_dispatch(d);
    }
    burn::tensor::module::linear(x, w, b)
}

/// [`burn::nn::Linear::forward`] through [`linear`]; a weight carrying a LoRA update has the
/// update's product added beside the frozen one ([`crate::lora::LowRankUpdate::beside`]).
pub fn forward<const D: usize>(layer: &burn::nn::Linear, x: Tensor<D>) -> Tensor<D> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    if let Some(update) = layer.weight.reparameterization::<crate::lora::LowRankUpdate>() {
        let base = layer.weight.base();
        let width = base.dims()[1];
        return update.beside(base, bias, x, 0..width);
    }
    linear(x, layer.weight.val(), bias)
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::written_by;
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

    /// The affine map of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FusedLinear: Backend {
        /// `x: [.., d_in]`, `w: [d_in, d_out]`, `b: [d_out]` → `x w + b: [.., d_out]`.
        fn affine(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
        /// `x w` without a bias.
        fn matmul_rows(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    /// A matrix read in place: storage, first element, (row, column) strides in elements.
    #[derive(Clone, Copy)]
    struct Matrix<'a> {
        data: &'a [f32],
        start: usize,
        rs: isize,
        cs: isize,
    }

    impl<'a> Matrix<'a> {
        /// `t` seen as `[rows, last]` (its leading axes folded; `t` must then be contiguous, which
        /// the callers ensure) — or, for a 2-D tensor, with any non-negative strides.
        fn of(t: &'a FlexTensor) -> Self {
            let l = t.layout();
            let s = l.strides();
            let (rs, cs) = if s.len() == 2 { (s[0], s[1]) } else { (*l.shape().to_vec().last().unwrap() as isize, 1) };
            Self { data: t.storage::<f32>(), start: l.start_offset(), rs, cs }
        }

        fn ptr(&self) -> *const f32 {
            self.data[self.start..].as_ptr()
        }
    }

    /// A 2-D tensor with non-negative strides as is, anything else contiguous.
    fn matrix_view(t: &FlexTensor) -> FlexTensor {
        let l = t.layout();
        if l.num_dims() == 2 && l.strides().iter().all(|&s| s >= 0) { t.clone() } else { t.to_contiguous() }
    }

    /// Below 192³ multiply–adds (flex's matmul rule) one thread beats two.
    fn worth_two_threads(m: usize, n: usize, k: usize) -> bool {
        m.saturating_mul(n).saturating_mul(k) >= 192 * 192 * 192
    }

    /// From 2³⁰ multiply–adds (the small GPT's products, not the baby's) the gemm crate's own split
    /// of one product across both threads, which shares the packed operands, beat two independent
    /// halves: 3,541–3,608 against 3,374–3,391 small-GPT tokens/s (docs/cpu-speed.md).
    fn splits_itself(m: usize, n: usize, k: usize) -> bool {
        m.saturating_mul(n).saturating_mul(k) >= 1 << 30
    }

    /// dst (m × n, rows `n` apart) := [dst +] lhs (m × k) · rhs (k × n), on the calling thread —
    /// or across the pool for the largest products ([`splits_itself`]).
    ///
    /// # Safety
    /// `dst` holds m · n floats; `lhs` and `rhs` describe matrices of these sizes in their storage.
    unsafe fn gemm(m: usize, n: usize, k: usize, dst: *mut f32, accumulate: bool, lhs: &Matrix, rhs: &Matrix) {
        let parallelism = if splits_itself(m, n, k) { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
        // SAFETY: as the caller guarantees
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst,
                1,
                n as isize,
                accumulate,
                lhs.ptr(),
                lhs.cs,
                lhs.rs,
                rhs.ptr(),
                rhs.cs,
                rhs.rs,
                if accumulate { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    }

    /// [`gemm`] with the rows of `dst` and `lhs` split in two halves run at once, for products
    /// large enough to pay for a second thread but below [`splits_itself`]: on the baby GPT's
    /// products two independent halves beat the gemm crate's split of one product, which
    /// synchronises its threads block by block (baby ×1.04, docs/cpu-speed.md, change 11).
    ///
    /// # Safety
    /// As for [`gemm`].
    unsafe fn gemm_rows_split(
        m: usize,
        n: usize,
        k: usize,
        dst: *mut f32,
        accumulate: bool,
        lhs: &Matrix,
        rhs: &Matrix,
    ) {
        if m < 2 || !worth_two_threads(m, n, k) || splits_itself(m, n, k) {
            // SAFETY: as the caller guarantees
            return unsafe { gemm(m, n, k, dst, accumulate, lhs, rhs) };
        }
        let top = m / 2;
        let lower = Matrix { start: (lhs.start as isize + top as isize * lhs.rs) as usize, ..*lhs };
        // raw pointers are not Send; the two halves of dst are disjoint
        let (dst_top, dst_lower) = (dst as usize, dst as usize + top * n * size_of::<f32>());
        rayon::join(
            // SAFETY: rows [0, top) of dst and lhs, as the caller guarantees for all m
            || unsafe { gemm(top, n, k, dst_top as *mut f32, accumulate, lhs, rhs) },
            // SAFETY: rows [top, m): `lower` starts at row `top` of lhs, dst_lower at row `top` of dst
            || unsafe { gemm(m - top, n, k, dst_lower as *mut f32, accumulate, &lower, rhs) },
        );
    }

    /// A new m × n matrix written entirely by one GEMM (split by rows when `split`): no zero fill
    /// first.
    fn gemm_new(m: usize, n: usize, k: usize, lhs: &Matrix, rhs: &Matrix, split: bool) -> Vec<f32> {
        if k == 0 {
            return vec![0.0; m * n];
        }
        let mut out = Vec::with_capacity(m * n);
        // SAFETY: the buffer has room for m · n floats; with k ≥ 1 and `accumulate` false the GEMM
        // writes every one of them without reading any, after which they are initialised
        unsafe {
            if split {
                gemm_rows_split(m, n, k, out.as_mut_ptr(), false, lhs, rhs);
            } else {
                gemm(m, n, k, out.as_mut_ptr(), false, lhs, rhs);
            }
            out.set_len(m * n);
        }
        out
    }

    /// Leading dims of `x` with the last replaced by `last`.
    fn with_last(dims: &[usize], last: usize) -> Vec<usize> {
        let mut d = dims.to_vec();
        *d.last_mut().expect("at least one axis") = last;
        d
    }

    fn forward_kernel(x: &FlexTensor, w: &FlexTensor, b: Option<&FlexTensor>) -> FlexTensor {
        let x = x.to_contiguous();
        let w = matrix_view(w);
        let dims = x.layout().shape().to_vec();
        let [d_in, d_out]: [usize; 2] = w.layout().shape().to_vec().try_into().expect("a 2-D weight");
        assert_eq!(dims.last(), Some(&d_in), "input {dims:?} does not fit weight [{d_in}, {d_out}]");
        let rows = x.layout().num_elements() / d_in.max(1);
        let out = match b {
            Some(b) => {
                let b = b.to_contiguous();
                let bias = b.storage::<f32>();
                let rows_of_bias = |c: &mut [MaybeUninit<f32>]| {
                    c.chunks_exact_mut(d_out).for_each(|r| {
                        r.iter_mut().zip(bias).for_each(|(o, &b)| {
                            o.write(b);
                        })
                    })
                };
                // SAFETY: every row of every chunk gets the bias
                let mut out =
                    unsafe { written_by(rows * d_out, |o| o.par_chunks_mut(d_out * 64).for_each(rows_of_bias)) };
                if d_in > 0 {
                    // SAFETY: out is rows × d_out; x is contiguous rows × d_in; w is d_in × d_out
                    unsafe {
                        gemm_rows_split(rows, d_out, d_in, out.as_mut_ptr(), true, &Matrix::of(&x), &Matrix::of(&w))
                    };
                }
                out
            }
            None => gemm_new(rows, d_out, d_in, &Matrix::of(&x), &Matrix::of(&w), true),
        };
        FlexTensor::from_data(TensorData::new(out, with_last(&dims, d_out)))
    }

    crate::wide_vectors! {
        /// Adds each `acc.len()`-wide row of `rows` into `acc`.
        fn add_rows(acc: &mut [f32], rows: &[f32]) {
            for r in rows.chunks_exact(acc.len()) {
                acc.iter_mut().zip(r).for_each(|(a, v)| *a += v);
            }
        }
    }

    /// Σ over rows of a contiguous `[rows, n]` gradient, two halves in parallel.
    fn column_sums(g: &[f32], n: usize) -> Vec<f32> {
        let rows = g.len() / n.max(1);
        let half = rows.div_ceil(2) * n;
        let (a, b) = rayon::join(
            || {
                let mut acc = vec![0.0f32; n];
                add_rows(&mut acc, &g[..half.min(g.len())]);
                acc
            },
            || {
                let mut acc = vec![0.0f32; n];
                add_rows(&mut acc, &g[half.min(g.len())..]);
                acc
            },
        );
        a.into_iter().zip(b).map(|(x, y)| x + y).collect()
    }

    /// The gradients of x, w and b that are asked for.
    fn backward_kernel(
        x: &FlexTensor,
        w: &FlexTensor,
        grad: &FlexTensor,
        [want_x, want_w, want_b]: [bool; 3],
    ) -> [Option<FlexTensor>; 3] {
        let grad = grad.to_contiguous();
        let w = matrix_view(w);
        let [d_in, d_out]: [usize; 2] = w.layout().shape().to_vec().try_into().expect("a 2-D weight");
        let x_dims = x.layout().shape().to_vec();
        let rows = grad.layout().num_elements() / d_out.max(1);
        let g = Matrix::of(&grad);
        let data = |v: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(v, dims));
        // ∂L/∂x and ∂L/∂W take the same number of multiply–adds: one thread each when both are
        // wanted (below the size where one product splits itself), else each split by rows
        let both = want_x && want_w && worth_two_threads(rows, d_in, d_out) && !splits_itself(rows, d_in, d_out);
        let dx = || {
            want_x.then(|| {
                let wm = Matrix::of(&w);
                let wt = Matrix { rs: wm.cs, cs: wm.rs, ..wm };
                data(gemm_new(rows, d_in, d_out, &g, &wt, !both), x_dims.clone())
            })
        };
        let dw_db = || {
            let dw = want_w.then(|| {
                let x = x.to_contiguous();
                let xm = Matrix::of(&x);
                let xt = Matrix { rs: xm.cs, cs: xm.rs, ..xm };
                data(gemm_new(d_in, d_out, rows, &xt, &g, !both), vec![d_in, d_out])
            });
            let db = want_b.then(|| data(column_sums(grad.storage::<f32>(), d_out), vec![d_out]));
            (dw, db)
        };
        let (dx, (dw, db)) = if both { rayon::join(dx, dw_db) } else { (dx(), dw_db()) };
        [dx, dw, db]
    }

    impl FusedLinear for Flex {
        fn affine(x: FlexTensor, w: FlexTensor, b: FlexTensor) -> FlexTensor {
            forward_kernel(&x, &w, Some(&b))
        }

        fn matmul_rows(x: FlexTensor, w: FlexTensor) -> FlexTensor {
            forward_kernel(&x, &w, None)
        }
    }

    /// The backward of [`FusedLinear::affine`] (`N = 3`: x, w, b) and of `matmul_rows` (`N = 2`).
    #[derive(Debug)]
    struct LinearBackward;

    /// The input and the weight, checkpointed.
    type Saved = (NodeId, NodeId);

    fn backward_step<const N: usize>(ops: Ops<Saved, N>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let x: FlexTensor = checkpointer.retrieve_node_output(ops.state.0);
        let w: FlexTensor = checkpointer.retrieve_node_output(ops.state.1);
        let want = std::array::from_fn(|i| ops.parents.get(i).is_some_and(Option::is_some));
        let computed = backward_kernel(&x, &w, &grad, want);
        for (parent, g) in ops.parents.into_iter().zip(computed) {
            if let (Some(node), Some(g)) = (parent, g) {
                grads.register::<Flex>(node.id, g);
            }
        }
    }

    impl Backward<Flex, 3> for LinearBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            backward_step(ops, grads, checkpointer);
        }
    }

    impl Backward<Flex, 2> for LinearBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            backward_step(ops, grads, checkpointer);
        }
    }

    impl<C: CheckpointStrategy> FusedLinear for Autodiff<Flex, C> {
        fn affine(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
            let out = forward_kernel(x.primitive(), w.primitive(), Some(b.primitive()));
            match LinearBackward.prepare::<C>([x.node(), w.node(), b.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = (prep.checkpoint(&x), prep.checkpoint(&w));
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }

        fn matmul_rows(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
            let out = forward_kernel(x.primitive(), w.primitive(), None);
            match LinearBackward.prepare::<C>([x.node(), w.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let state = (prep.checkpoint(&x), prep.checkpoint(&w));
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

        /// `[3, seq, d_in] → [3, seq, d_out]` against Burn's linear.
        fn check_shape(bias: bool, transposed_weight: bool, [seq, d_in, d_out]: [usize; 3]) {
            let device = Device::flex().autodiff();
            device.seed(7);
            let normal = Distribution::Normal(0.0, 1.0);
            // a strided input (swapped axes)
            let x: Tensor<3> = Tensor::random([3, d_in, seq], normal, &device).swap_dims(1, 2);
            let w: Tensor<2> = if transposed_weight {
                // the tied output embedding: a transposed view
                Tensor::random([d_out, d_in], normal, &device).transpose()
            } else {
                Tensor::random([d_in, d_out], normal, &device)
            };
            let b: Tensor<1> = Tensor::random([d_out], normal, &device);
            let up: Tensor<3> = Tensor::random([3, seq, d_out], normal, &device);
            let run = |fused: bool| {
                let (x, w, b) = (x.clone().require_grad(), w.clone().require_grad(), b.clone().require_grad());
                let bias = bias.then(|| b.clone());
                let y = if fused {
                    linear(x.clone(), w.clone(), bias)
                } else {
                    burn::tensor::module::linear(x.clone(), w.clone(), bias)
                };
                let grads = (y.clone() * up.clone()).sum().backward();
                (y, x.grad(&grads).unwrap(), w.grad(&grads).unwrap(), b.grad(&grads))
            };
            let (y1, dx1, dw1, db1) = run(true);
            let (y2, dx2, dw2, db2) = run(false);
            let what = format!("bias {bias}, transposed weight {transposed_weight}, [{seq}, {d_in}, {d_out}]");
            assert!(rel_diff(y1, y2) < 1e-5, "forward, {what}");
            assert!(rel_diff(dx1, dx2) < 1e-5, "dx, {what}");
            assert!(rel_diff(dw1, dw2) < 1e-5, "dw, {what}");
            match (db1, db2) {
                (Some(a), Some(e)) => assert!(rel_diff(a, e) < 1e-5, "db, {what}"),
                (None, None) => assert!(!bias),
                _ => panic!("bias gradient on one side only, {what}"),
            }
        }

        /// More rows than one GEMM tile, odd widths: one thread per product.
        fn check(bias: bool, transposed_weight: bool) {
            check_shape(bias, transposed_weight, [50, 37, 29]);
        }

        /// Products past both thresholds: rows split in two halves and ∂L/∂x beside ∂L/∂W (≥ 192³
        /// multiply–adds), and one product split by the gemm crate itself (≥ 2³⁰).
        #[test]
        fn threaded_products_equal_burns_linear() {
            assert!(worth_two_threads(3 * 250, 100, 130) && !splits_itself(3 * 250, 100, 130));
            check_shape(true, false, [250, 100, 130]);
            check_shape(false, true, [251, 100, 130]);
            assert!(splits_itself(3 * 350, 1024, 1024));
            check_shape(true, false, [350, 1024, 1024]);
        }

        #[test]
        fn equals_burns_linear_with_its_gradients() {
            check(true, false);
            check(false, false);
            check(true, true);
            check(false, true);
        }

        #[test]
        fn frozen_weights_get_no_gradient_and_inference_takes_the_kernel() {
            let device = Device::flex().autodiff();
            device.seed(8);
            let x: Tensor<2> = Tensor::random([70, 16], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let w: Tensor<2> = Tensor::random([16, 8], Distribution::Normal(0.0, 1.0), &device);
            let grads = linear(x.clone(), w.clone(), None).sum().backward();
            assert!(w.grad(&grads).is_none(), "a constant weight has no gradient");
            // y = x w summed: every row of ∂L/∂x is the row sums of w
            let expected = w.clone().inner().sum_dim(1).reshape([1, 16]).expand([70, 16]);
            assert!(rel_diff(x.grad(&grads).unwrap(), expected) < 1e-5);
            let (xi, wi) = (x.inner(), w.inner());
            assert!(rel_diff(linear(xi.clone(), wi.clone(), None), xi.matmul(wi)) < 1e-5);
        }
    }
}
