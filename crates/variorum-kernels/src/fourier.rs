//! FNet's Fourier mixing (Lee-Thorp, Ainslie, Eckstein, Ontañón 2021, eq. (3)): the real part of
//! the two-dimensional discrete Fourier transform of each example's `[L, d]` hidden states,
//!
//! y = ℜ(F_seq(F_hidden(x))),   (F_n x)_k = Σ_{j<n} x_j e^{−2πi jk/n},
//!
//! by FFT on the flex CPU backend (the `rustfft` crate: O(L·d·(log L + log d))), and by two
//! real matrix products elsewhere. Writing F_n = C_n − i S_n (C_n[j, k] = cos 2πjk/n,
//! S_n[j, k] = sin 2πjk/n, both symmetric) and x real,
//!
//! y = C_L x C_d − S_L x S_d,
//!
//! which is the composed form here (O(L²d + Ld²)) and shows that the map is self-adjoint:
//! ∂L/∂x = C_L g C_d − S_L g S_d = the same map applied to the incoming gradient g. The kernel's
//! backward is therefore its forward, with nothing saved.

use burn::prelude::*;

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many FFT mixings this thread has run (tests check a layer took the kernel).
pub fn calls() -> usize {
    CALLS.get()
}

/// ℜ(F_seq(F_hidden(x))) of `x: [batch, L, d]`: FFTs on flex (f32), the composed real products
/// elsewhere.
pub fn fourier_mix(x: Tensor<3>) -> Tensor<3> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&x) {
        CALLS.set(CALLS.get() + 1);
        return Tensor::from_dispatch(burn::backend::Dispatch::fourier_mix(x.into_dispatch()));
    }
    composed(x)
}

/// C_n and S_n, `[n, n]` each: cos and sin of 2πjk/n, the angle reduced mod n in integers so
/// that large n keeps its precision.
pub fn dft_matrices(n: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let (mut c, mut s) = (Vec::with_capacity(n * n), Vec::with_capacity(n * n));
    for j in 0..n {
        for k in 0..n {
            let angle = 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
            let (sin, cos) = angle.sin_cos();
            c.push(cos as f32);
            s.push(sin as f32);
        }
    }
    let t = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [n, n]), device);
    (t(c), t(s))
}

/// C_L x C_d − S_L x S_d with Burn's ops (autodiff records it like any other product).
pub fn composed(x: Tensor<3>) -> Tensor<3> {
    let [_, l, d] = x.dims();
    let device = x.device();
    let (cl, sl) = dft_matrices(l, &device);
    let (cd, sd) = dft_matrices(d, &device);
    let cl = cl.unsqueeze_dim::<3>(0);
    let sl = sl.unsqueeze_dim::<3>(0);
    cl.matmul(x.clone()).matmul(cd.unsqueeze_dim(0)) - sl.matmul(x).matmul(sd.unsqueeze_dim(0))
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernel, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;
    use rustfft::FftPlanner;
    use rustfft::num_complex::Complex;

    /// FNet's mixing on the backends that have it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FourierMix: Backend {
        /// ℜ(F_seq(F_hidden(x))) of `x: [batch, L, d]`, by FFT in f32.
        fn fourier_mix(x: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    /// ℜ(F_L(F_d(x))) per example of a contiguous `[b, L, d]` tensor. The transforms run in f32
    /// (rustfft's error grows as ε·log n, 1e-6 relative at the lengths trained here); one plan
    /// per length serves every example.
    fn mix(x: &FlexTensor) -> FlexTensor {
        let x = x.to_contiguous();
        let dims = x.layout().shape().to_vec();
        let (l, d) = (dims[1], dims[2]);
        let xs = x.as_slice::<f32>().expect("f32, checked by `fourier_mix`");
        let mut planner = FftPlanner::<f32>::new();
        let (row_fft, column_fft) = (planner.plan_fft_forward(d), planner.plan_fft_forward(l));
        let mut out = vec![0.0f32; xs.len()];
        if l * d > 0 {
            out.par_chunks_mut(l * d).zip(xs.par_chunks(l * d)).for_each(|(out, x)| {
                // along the hidden dimension: the L rows, each d long, in one buffer
                let mut rows: Vec<Complex<f32>> = x.iter().map(|&v| Complex::new(v, 0.0)).collect();
                row_fft.process(&mut rows);
                // along the sequence: the d columns, each L long, transposed into one buffer
                let mut columns = vec![Complex::new(0.0, 0.0); l * d];
                for (i, row) in rows.chunks(d).enumerate() {
                    for (j, &z) in row.iter().enumerate() {
                        columns[j * l + i] = z;
                    }
                }
                column_fft.process(&mut columns);
                for (j, column) in columns.chunks(l).enumerate() {
                    for (i, z) in column.iter().enumerate() {
                        out[i * d + j] = z.re;
                    }
                }
            });
        }
        FlexTensor::from_data(TensorData::new(out, dims))
    }

    impl FourierMix for Flex {
        fn fourier_mix(x: FlexTensor) -> FlexTensor {
            mix(&x)
        }
    }

    /// Self-adjoint: the gradient is the same mixing of the incoming gradient.
    #[derive(Debug)]
    struct FourierBackward;

    impl Backward<Flex, 1> for FourierBackward {
        type State = ();

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let [parent] = ops.parents.map(|p| p.map(|node| node.id));
            crate::register(grads, [parent], [parent.map(|_| mix(&grad))]);
        }
    }

    impl<C: CheckpointStrategy> FourierMix for Autodiff<Flex, C> {
        fn fourier_mix(x: FloatTensor<Self>) -> FloatTensor<Self> {
            let output = mix(x.primitive());
            FourierBackward.prepare::<C>([x.node()]).compute_bound().stateless(output)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;

        /// ℜ of the 2D DFT, by its definition in f64.
        fn dft_real(x: &[f32], l: usize, d: usize) -> Vec<f64> {
            let tau = 2.0 * std::f64::consts::PI;
            let mut y = vec![0.0; l * d];
            for k in 0..l {
                for m in 0..d {
                    let mut re = 0.0;
                    for j in 0..l {
                        for n in 0..d {
                            let angle = tau * ((j * k) as f64 / l as f64 + (n * m) as f64 / d as f64);
                            re += x[j * d + n] as f64 * angle.cos();
                        }
                    }
                    y[k * d + m] = re;
                }
            }
            y
        }

        #[test]
        fn equals_the_real_part_of_the_2d_dft() {
            let device = Device::flex();
            device.seed(3);
            // lengths with odd and prime factors (rustfft's mixed-radix and Bluestein paths)
            for (l, d) in [(8, 16), (7, 12), (13, 10)] {
                let x: Tensor<3> = Tensor::random([2, l, d], Distribution::Normal(0.0, 1.0), &device);
                let data = x.to_data().try_to_vec::<f32>().unwrap();
                let before = calls();
                let y = fourier_mix(x).to_data().try_to_vec::<f32>().unwrap();
                assert_eq!(calls(), before + 1, "the kernel ran");
                for b in 0..2 {
                    let expected = dft_real(&data[b * l * d..(b + 1) * l * d], l, d);
                    for (i, (&got, want)) in y[b * l * d..(b + 1) * l * d].iter().zip(expected).enumerate() {
                        assert!(
                            (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "[{b}, {l}×{d}] {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }

        #[test]
        fn kernel_equals_the_composed_products_with_its_gradient() {
            let device = Device::flex().autodiff();
            device.seed(4);
            // a strided input, a length that is not a power of two
            let x: Tensor<3> = Tensor::random([3, 12, 10], Distribution::Normal(0.0, 1.0), &device).swap_dims(1, 2);
            let w: Tensor<3> = Tensor::random([3, 10, 12], Distribution::Normal(0.0, 1.0), &device);
            let run = |fast: bool| {
                let x = x.clone().require_grad();
                let y = if fast { fourier_mix(x.clone()) } else { composed(x.clone()) };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).unwrap())
            };
            let (y1, dx1) = run(true);
            let (y2, dx2) = run(false);
            assert!(rel_diff(y1, y2) < 1e-5, "forward");
            assert!(rel_diff(dx1, dx2) < 1e-5, "backward");
        }
    }
}
