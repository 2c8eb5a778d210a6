//! One AdamW step of one parameter tensor (Loshchilov & Hutter 2019) as one pass over memory:
//!
//! m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²,
//! θ ← θ (1 − η λ) − η · (m / c₁) / (√(v / c₂) + ε),   c_i = 1 − β_iᵗ.
//!
//! Burn's `AdamW` runs this as about fifteen tensor ops per parameter, each a pass over memory
//! and a fresh buffer — 3.6 % of a baby-GPT step in `scalar_op` alone, on one core while the
//! other waits (docs/cpu-speed.md). Here θ, g, m and v are read once and θ, m, v written once,
//! in parallel chunks. The arithmetic is Burn's, operation for operation (decay applied to θ
//! before the update is subtracted, bias corrections in f32), so a run resumed from a checkpoint
//! written with either is the same run.

use burn::prelude::*;

/// The constants of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// η.
    pub lr: f32,
    /// β₁, the first moment's decay.
    pub beta_1: f32,
    /// β₂, the second moment's decay.
    pub beta_2: f32,
    /// ε, added to the denominator √(v / c₂).
    pub epsilon: f32,
    /// λ (decoupled: scaled by η).
    pub weight_decay: f32,
    /// t, from 1 at the first step.
    pub time: i32,
}

/// One step of `param` with its gradient and moments (`None` before the first step: zeros);
/// returns the parameter and the moments after it. The kernel on flex (f32), Burn's tensor ops
/// elsewhere.
pub fn step<const D: usize>(
    param: Tensor<D>,
    grad: Tensor<D>,
    moments: Option<(Tensor<D>, Tensor<D>)>,
    s: AdamWStep,
) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    let c1 = 1.0 - s.beta_1.powi(s.time);
    let c2 = 1.0 - s.beta_2.powi(s.time);
    // Burn's AdamW: decay rate η·λ in f64, then as an f32 factor
    let keep = (1.0 - s.lr as f64 * s.weight_decay as f64) as f32;
    let (m, v) = moments.unwrap_or_else(|| (grad.zeros_like(), grad.zeros_like()));
    #[cfg(feature = "flex")]
    if crate::has_kernel(&param) && crate::has_kernel(&grad) && crate::has_kernel(&m) && crate::has_kernel(&v) {
        let constants = [s.lr, s.beta_1, s.beta_2, s.epsilon, keep, c1, c2];
        let (p, m, v) = burn::backend::Dispatch::adamw_step(
            param.into_dispatch(),
            grad.into_dispatch(),
            m.into_dispatch(),
            v.into_dispatch(),
            constants,
        );
        return (Tensor::from_dispatch(p), Tensor::from_dispatch(m), Tensor::from_dispatch(v));
    }
    let m = m.mul_scalar(s.beta_1).add(grad.clone().mul_scalar(1.0 - s.beta_1));
    let v = v.mul_scalar(s.beta_2).add(grad.square().mul_scalar(1.0 - s.beta_2));
    let delta = m.clone().div_scalar(c1).div(v.clone().div_scalar(c2).sqrt().add_scalar(s.epsilon));
    let param = param.mul_scalar(keep) - delta.mul_scalar(s.lr);
    (param, m, v)
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::written_by;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, Flex, backend_extension};
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    /// The AdamW step of the backends that have a kernel for it.
    #[backend_extension(Flex)]
    pub trait FusedAdamW: Backend {
        /// `(θ, g, m, v, [η, β₁, β₂, ε, λ, c₁, c₂])` → `(θ, m, v)` after the step.
        fn adamw_step(
            param: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            moment_1: FloatTensor<Self>,
            moment_2: FloatTensor<Self>,
            constants: [f32; 7],
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }

    /// Elements per parallel task: enough to amortise a task, few enough that the baby GPT's
    /// 65 536-element matrices use both threads.
    const CHUNK: usize = 16_384;

    crate::wide_vectors! {
        /// The step over one chunk; outputs are (θ, m, v).
        fn step_chunk(
            out: &mut [MaybeUninit<f32>],
            m_out: &mut [MaybeUninit<f32>],
            v_out: &mut [MaybeUninit<f32>],
            p: &[f32],
            g: &[f32],
            m: &[f32],
            v: &[f32],
            c: &[f32; 7],
        ) {
            let [lr, b1, b2, eps, keep, c1, c2] = *c;
            let outputs = out.iter_mut().zip(m_out.iter_mut()).zip(v_out.iter_mut());
            let inputs = p.iter().zip(g).zip(m.iter().zip(v));
            for (((o, mo), vo), ((&p, &g), (&m, &v))) in outputs.zip(inputs) {
                let m = m * b1 + g * (1.0 - b1);
                let v = v * b2 + g * g * (1.0 - b2);
                let delta = (m / c1) / ((v / c2).sqrt() + eps);
                o.write(p * keep - delta * lr);
                mo.write(m);
                vo.write(v);
            }
        }
    }

    impl FusedAdamW for Flex {
        fn adamw_step(
            param: FlexTensor,
            grad: FlexTensor,
            moment_1: FlexTensor,
            moment_2: FlexTensor,
            constants: [f32; 7],
        ) -> (FlexTensor, FlexTensor, FlexTensor) {
            let dims = param.layout().shape().to_vec();
            let [p, g, m, v] = [&param, &grad, &moment_1, &moment_2].map(|t| t.to_contiguous());
            let (p, g, m, v) = (p.storage::<f32>(), g.storage::<f32>(), m.storage::<f32>(), v.storage::<f32>());
            let n = p.len();
            assert!(g.len() == n && m.len() == n && v.len() == n, "parameter, gradient and moments differ in size");
            let (mut m_out, mut v_out) = (Vec::with_capacity(n), Vec::with_capacity(n));
            // SAFETY: the chunks cover all n elements, and `step_chunk` writes each of its chunk's
            // elements in all three outputs
            let out = unsafe {
                written_by(n, |out| {
                    let m_out = &mut m_out.spare_capacity_mut()[..n];
                    let v_out = &mut v_out.spare_capacity_mut()[..n];
                    out.par_chunks_mut(CHUNK)
                        .zip(m_out.par_chunks_mut(CHUNK))
                        .zip(v_out.par_chunks_mut(CHUNK))
                        .enumerate()
                        .for_each(|(i, ((o, mo), vo))| {
                            let r = i * CHUNK..(i * CHUNK + o.len());
                            step_chunk(o, mo, vo, &p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r], &constants);
                        });
                })
            };
            // SAFETY: every element of both moments was written above
            unsafe {
                m_out.set_len(n);
                v_out.set_len(n);
            }
            let data = |v: Vec<f32>| FlexTensor::from_data(TensorData::new(v, dims.clone()));
            (data(out), data(m_out), data(v_out))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;

        /// Three steps on a tensor spanning several chunks (and a ragged last one), against the same
        /// steps composed of Burn's ops, and against the definition written out on the host.
        #[test]
        fn equals_the_composed_step_and_the_definition() {
            let device = Device::flex();
            device.seed(11);
            let shape = [3, 2 * CHUNK / 3 + 5];
            let normal = Distribution::Normal(0.0, 1.0);
            let theta: Tensor<2> = Tensor::random(shape, normal, &device);
            let grads: Vec<Tensor<2>> = (0..3).map(|_| Tensor::random(shape, normal, &device)).collect();
            let s = |time| AdamWStep { lr: 3e-3, beta_1: 0.9, beta_2: 0.99, epsilon: 1e-8, weight_decay: 0.1, time };
            // the composed path: the same function on a tensor that is not f32
            let run = |as_f64: bool| {
                let mut p = if as_f64 { theta.clone().cast(burn::tensor::DType::F64) } else { theta.clone() };
                let mut moments = None;
                for (t, g) in grads.iter().enumerate() {
                    let g = if as_f64 { g.clone().cast(burn::tensor::DType::F64) } else { g.clone() };
                    let (np, m, v) = step(p, g, moments, s(t as i32 + 1));
                    p = np;
                    moments = Some((m, v));
                }
                let (m, v) = moments.unwrap();
                [p, m, v].map(|t| t.cast(burn::tensor::DType::F32))
            };
            let fused = run(false);
            let composed = run(true);
            for (name, (a, e)) in ["θ", "m", "v"].iter().zip(fused.iter().zip(&composed)) {
                assert!(rel_diff(a.clone(), e.clone()) < 1e-5, "{name}: kernel and composed ops differ");
            }
            // the definition, element by element, in f64
            let host = |t: &Tensor<2>| t.to_data().try_to_vec::<f32>().unwrap();
            let (mut p, g) = (host(&theta), grads.iter().map(host).collect::<Vec<_>>());
            let (mut m, mut v) = (vec![0.0f64; p.len()], vec![0.0f64; p.len()]);
            let mut p64: Vec<f64> = p.drain(..).map(f64::from).collect();
            for (t, g) in g.iter().enumerate() {
                let t = t as i32 + 1;
                for i in 0..p64.len() {
                    let gi = g[i] as f64;
                    m[i] = 0.9 * m[i] + 0.1 * gi;
                    v[i] = 0.99 * v[i] + 0.01 * gi * gi;
                    let delta = (m[i] / (1.0 - 0.9f64.powi(t))) / ((v[i] / (1.0 - 0.99f64.powi(t))).sqrt() + 1e-8);
                    p64[i] = p64[i] * (1.0 - 3e-3 * 0.1) - 3e-3 * delta;
                }
            }
            let expected =
                Tensor::<2>::from_data(TensorData::new(p64.iter().map(|&x| x as f32).collect(), shape), &device);
            assert!(rel_diff(fused[0].clone(), expected) < 1e-5, "θ differs from the definition");
        }
    }
}
