//! Rotary position embedding (Su et al. 2021) applied to a fused projection's output as one flex
//! op, forward and backward:
//!
//! f(x, m)_{(i, j)} = [[cos mθ_k, −sin mθ_k], [sin mθ_k, cos mθ_k]] · (x_i, x_j),   θ_k = base^(−2k/r),
//!
//! on every query and key head of `qkv: [b, L, (h + 2 h_kv) · d_h]` (values pass through), the
//! pair (i, j) being (k, k + r/2) (rotate-half) or (2k, 2k + 1) (interleaved), dimensions from r
//! on unrotated. The map is a rotation, so its backward is the rotation by −mθ. Burn records the
//! head split, the halves' slices, four products, a sum, a difference and a concatenation per
//! tensor, forward and backward, and the attention then needs q and k as separate heads; here
//! the projection stays packed, so the fused attention kernel reads it in place
//! ([`crate::causal_attention::causal_self_attention`]). `variorum_position`'s
//! `RotaryEmbedding` is the composed form (and the reference of the tests).

use burn::prelude::*;

/// What [`rotate_packed`] rotates, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotation {
    /// Query heads, key/value heads and the head size of the packed projection.
    pub n_heads: usize,
    /// h_kv, the key and value heads.
    pub n_kv_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// r, the rotated dimensions per head (even, at most `head_dim`).
    pub rotary_dim: usize,
    /// Base of the wavelengths.
    pub base: f64,
    /// (x_{2k}, x_{2k+1}) pairs rather than (x_k, x_{k + r/2}).
    pub interleaved: bool,
    /// Position of the first row.
    pub start: usize,
}

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many packed rotations this thread has run (tests check a layer took the kernel).
pub fn calls() -> usize {
    CALLS.get()
}

/// cos and sin of m·θ_k, θ_k = base^(−2k/r), for the positions `start..start + len`, `[len, r/2]`
/// each, row-major; in f64 before rounding, so that large positions keep their precision. The one
/// table of both RoPE forms (this kernel and `variorum_position`'s composed rotation).
pub fn angles(base: f64, rotary_dim: usize, start: usize, len: usize) -> (Vec<f32>, Vec<f32>) {
    let half = rotary_dim / 2;
    let freq: Vec<f64> = (0..half).map(|k| base.powf(-(2.0 * k as f64) / rotary_dim as f64)).collect();
    let (mut c, mut s) = (Vec::with_capacity(len * half), Vec::with_capacity(len * half));
    for m in start..start + len {
        for f in &freq {
            let (sin, cos) = (m as f64 * f).sin_cos();
            c.push(cos as f32);
            s.push(sin as f32);
        }
    }
    (c, s)
}

/// `qkv: [b, L, (h + 2 h_kv) · d_h]` with its query and key heads rotated by the rows' positions
/// `start..start + L`; `None` on a backend or float type without the kernel (the caller then
/// splits the heads and rotates them with Burn's ops).
pub fn rotate_packed(qkv: Tensor<3>, rotation: Rotation) -> Option<Tensor<3>> {
    let width = (rotation.n_heads + 2 * rotation.n_kv_heads) * rotation.head_dim;
    assert_eq!(qkv.dims()[2], width, "the projection is not (h + 2 h_kv) · d_h wide");
    assert!(
        rotation.rotary_dim % 2 == 0 && rotation.rotary_dim > 0 && rotation.rotary_dim <= rotation.head_dim,
        "rope rotates an even number of dimensions, at least 2 and at most the head size"
    );
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) {
        CALLS.set(CALLS.get() + 1);
        return Some(Tensor::from_dispatch(burn::backend::Dispatch::rope_packed(qkv.into_dispatch(), rotation)));
    }
    let _ = qkv;
    None
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::fast_math::written_by;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    /// RoPE on a packed projection, for the backends that have it.
    #[backend_extension(Flex, Autodiff)]
    pub trait PackedRope: Backend {
        /// `qkv: [b, L, (h + 2 h_kv) · d_h]` with its query and key heads rotated by `rotation`.
        fn rope_packed(qkv: FloatTensor<Self>, rotation: Rotation) -> FloatTensor<Self>;
    }

    /// Rows (positions) per task.
    const ROWS: usize = 16;

    crate::wide_vectors! {
        /// Rotates the first `heads` head slots of each row of `x` (rows of `width`) into `out`,
        /// copying the rest; `sign` −1 rotates by −mθ (the backward). `cos`, `sin`: the rows'
        /// tables, `half` = r/2 per row.
        #[allow(clippy::too_many_arguments)]
        fn rotate_rows(out: &mut [MaybeUninit<f32>], x: &[f32], cos: &[f32], sin: &[f32], width: usize, half: usize, heads: usize, head_dim: usize, interleaved: bool, sign: f32) {
            debug_assert_eq!(cos.len(), x.len() / width * half);
            let rows = out.chunks_exact_mut(width).zip(x.chunks_exact(width));
            for ((o, x), (c, s)) in rows.zip(cos.chunks_exact(half).zip(sin.chunks_exact(half))) {
                copy_into(&mut o[heads * head_dim..], &x[heads * head_dim..]);
                for (o, x) in o[..heads * head_dim].chunks_exact_mut(head_dim).zip(x.chunks_exact(head_dim)) {
                    copy_into(&mut o[2 * half..], &x[2 * half..]);
                    if interleaved {
                        let pairs = o[..2 * half].chunks_exact_mut(2).zip(x[..2 * half].chunks_exact(2));
                        for ((o, x), (&c, &s)) in pairs.zip(c.iter().zip(s)) {
                            let s = sign * s;
                            o[0].write(x[0] * c - x[1] * s);
                            o[1].write(x[1] * c + x[0] * s);
                        }
                    } else {
                        let (x0, x1) = x[..2 * half].split_at(half);
                        let (o0, o1) = o[..2 * half].split_at_mut(half);
                        for ((((o0, o1), &a), &b), (&c, &s)) in o0.iter_mut().zip(o1).zip(x0).zip(x1).zip(c.iter().zip(s)) {
                            let s = sign * s;
                            o0.write(a * c - b * s);
                            o1.write(b * c + a * s);
                        }
                    }
                }
            }
        }
    }

    /// `x` into `out`.
    #[inline(always)]
    fn copy_into(out: &mut [MaybeUninit<f32>], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            o.write(v);
        }
    }

    /// `x` `[b, L, width]` rotated by +mθ (`sign` 1) or −mθ (−1).
    fn kernel(x: &FlexTensor, rotation: &Rotation, sign: f32) -> FlexTensor {
        let x = x.to_contiguous();
        let dims = x.layout().shape().to_vec();
        let [_, len, width] = dims[..] else { panic!("rope on a packed projection takes [b, L, width], got {dims:?}") };
        let (cos, sin) = angles(rotation.base, rotation.rotary_dim, rotation.start, len);
        let half = rotation.rotary_dim / 2;
        let heads = rotation.n_heads + rotation.n_kv_heads;
        let xs = x.storage::<f32>();
        // SAFETY: the tasks cover every row of every sequence, and rotate_rows writes each whole
        let out = unsafe {
            written_by(xs.len(), |out| {
                // tasks of ROWS positions, never across a sequence (so each reads its table rows)
                out.par_chunks_mut(len * width).zip(xs.par_chunks(len * width)).for_each(|(o, x)| {
                    o.par_chunks_mut(ROWS * width).zip(x.par_chunks(ROWS * width)).enumerate().for_each(
                        |(t, (o, x))| {
                            let rows = ROWS * t..(ROWS * t + x.len() / width);
                            let (c, s) =
                                (&cos[rows.start * half..rows.end * half], &sin[rows.start * half..rows.end * half]);
                            let (dh, interleaved) = (rotation.head_dim, rotation.interleaved);
                            rotate_rows(o, x, c, s, width, half, heads, dh, interleaved, sign);
                        },
                    )
                })
            })
        };
        FlexTensor::from_data(TensorData::new(out, dims))
    }

    impl PackedRope for Flex {
        fn rope_packed(qkv: FlexTensor, rotation: Rotation) -> FlexTensor {
            kernel(&qkv, &rotation, 1.0)
        }
    }

    #[derive(Debug)]
    struct RopeBackward;

    impl Backward<Flex, 1> for RopeBackward {
        /// The rotation: a linear map needs nothing of its input.
        type State = Rotation;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<Flex>(&ops.node);
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, kernel(&grad, &ops.state, -1.0));
            }
        }
    }

    impl<C: CheckpointStrategy> PackedRope for Autodiff<Flex, C> {
        fn rope_packed(qkv: FloatTensor<Self>, rotation: Rotation) -> FloatTensor<Self> {
            let output = kernel(qkv.primitive(), &rotation, 1.0);
            match RopeBackward.prepare::<C>([qkv.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish(rotation, output),
                OpsKind::UnTracked(prep) => prep.finish(output),
            }
        }
    }
}
