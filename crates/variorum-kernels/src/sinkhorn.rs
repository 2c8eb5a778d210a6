//! Sparse Sinkhorn attention's blocks (Tay et al. 2020) as one CPU kernel, forward and backward,
//! on the flex backend. The sequence is N blocks of m; block i's queries attend, in one softmax, to
//! its *sorted* block — a mixture of the key and value blocks by the soft permutation S — and to
//! its own block:
//!
//! K̃_i = Σ_j S_ij K_j,  Ṽ_i = Σ_j S_ij V_j,   O_i = softmax([q_i K̃_iᵀ, q_i K_iᵀ + M]) [Ṽ_i; V_i],
//!
//! M hiding the own block's keys after a query (causal) and padding keys (positions ≥ `len`).
//! Causally block i mixes only the blocks before it (S's entries on and above the diagonal are
//! not read, and their gradient is zero), and block 0 has no sorted block.
//!
//! Composed from Burn's ops (or with the sorted blocks handed to the block-sparse kernel), K̃ and
//! Ṽ are two more `[b, h, L, d_h]` tensors that autodiff keeps for the backward, the kernel's keys
//! a copy of them beside K (a `[2L]` key sequence), and their gradients two more: 81 MiB above
//! full attention at 16k positions (docs/sparse-attention.md). Here the mixtures are formed per
//! (batch, head) in scratch, in the forward and again in the backward, and never kept; the backward
//! is FlashAttention's (P recomputed from the saved log-sum-exp ℓ):
//!
//! dṼ_i = P̃ᵀ dO_i,  dV_i += P_ownᵀ dO_i,  dA = P ∘ (dP − D) (A the scores),
//! dq_i = dÃ K̃_i + dA_own K_i,  dK̃_i = dÃᵀ q_i,  dK_i += dA_ownᵀ q_i,  then for the sort
//! matrix  dS_ij = ⟨dK̃_i, K_j⟩ + ⟨dṼ_i, V_j⟩,  dK_j += Σ_i S_ij dK̃_i,  dV_j += Σ_i S_ij dṼ_i.
//!
//! The mixing is N² · m · d_h multiply–adds per head and direction — at 16k positions in blocks of
//! 64 four times the attention itself — so causally only the blocks before a row's chunk are
//! mixed (about half). Queries come scaled; the output has its heads merged, `[b, L, h · d_h]`.
//! [`sinkhorn_block_attention`] returns `None` where the kernel does not apply.

use burn::prelude::*;

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many calls of [`sinkhorn_block_attention`] this thread has run on the kernel (tests check
/// a layer took it).
pub fn calls() -> usize {
    CALLS.get()
}

/// The blocks of one call: m positions per block, `len` real positions (keys from `len` on are
/// padding, seen by no query), causal or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkhornBlocks {
    /// m, positions per block.
    pub block: usize,
    /// The real positions; keys from `len` on are padding.
    pub len: usize,
    /// Queries see no key after their own position, and block i mixes only the blocks before it.
    pub causal: bool,
}

/// Each block of queries against its sorted block and its own block, heads merged, `[b, N m,
/// h · d_h]`: `q: [b, h, N m, d_h]` (scaled), `k`, `v: [b, h, N m, d_h]` (padded with zeros past
/// `blocks.len`), `sort: [b, h, N, N]` the soft permutation. `None` on a backend or float type
/// without the kernel.
pub fn sinkhorn_block_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    sort: Tensor<4>,
    blocks: SinkhornBlocks,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if [&q, &k, &v, &sort].into_iter().all(crate::has_kernel) {
        CALLS.set(CALLS.get() + 1);
        let (q, k, v, sort) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), sort.into_dispatch());
        let d = burn::backend::Dispatch::sinkhorn_blocks(q, k, v, sort, blocks);
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, sort, blocks);
    None
}

#[cfg(feature = "flex")]
pub use flex::SinkhornBlockAttention;

#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::causal_attention::flex::{
        Heads, Shared, gemm, normalise_rows, readable, recompute_rows, score_gradients,
    };
    use crate::normalisers::RowNormaliser;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;

    /// Rows of S mixed by one GEMM (and the tasks the mixing is split into): causally a chunk of
    /// rows reads the blocks up to its last row, so smaller chunks skip more of the upper
    /// triangle (16: about 53 % of the square).
    const CHUNK: usize = 16;

    /// Sinkhorn's blocks on the backends that have a kernel for them.
    #[backend_extension(Flex, Autodiff)]
    pub trait SinkhornBlockAttention: Backend {
        /// [`sinkhorn_block_attention`].
        fn sinkhorn_blocks(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            sort: FloatTensor<Self>,
            blocks: SinkhornBlocks,
        ) -> FloatTensor<Self>;
    }

    /// The shapes of one call.
    #[derive(Clone, Copy)]
    struct Geometry {
        b: usize,
        h: usize,
        /// N blocks of m.
        n: usize,
        m: usize,
        dh: usize,
        len: usize,
        causal: bool,
    }

    impl Geometry {
        fn of(q: &Heads, k: &Heads, v: &Heads, sort: &FlexTensor, blocks: SinkhornBlocks) -> Self {
            let [b, h, l, dh] = q.dims;
            let m = blocks.block;
            assert!(m > 0 && l % m == 0, "{l} positions are not whole blocks of {m}");
            assert!(k.dims == q.dims && v.dims == q.dims, "q {:?}, k {:?}, v {:?} differ", q.dims, k.dims, v.dims);
            let n = l / m;
            assert_eq!(sort.layout().shape().to_vec(), [b, h, n, n], "the sort matrix does not fit {n} blocks");
            assert!(
                blocks.len > (n.max(1) - 1) * m && blocks.len <= l,
                "{} real positions in {n} blocks of {m}",
                blocks.len
            );
            Self { b, h, n, m, dh, len: blocks.len, causal: blocks.causal }
        }

        fn l(&self) -> usize {
            self.n * self.m
        }

        /// Whether block i has a sorted block (causally block 0 has none).
        fn mixes(&self, i: usize) -> bool {
            !(self.causal && i == 0)
        }

        /// Keys of its own block that row r of block i sees (at least one).
        fn own(&self, i: usize, r: usize) -> usize {
            let first = i * self.m;
            let end = if self.causal { first + r + 1 } else { first + self.m };
            end.min(self.len) - first
        }

        /// Scores per row of block i: the sorted block's m, then the own block's m.
        fn width(&self, i: usize) -> usize {
            if self.mixes(i) { 2 * self.m } else { self.m }
        }

        /// Row chunks of S, each with the blocks it mixes: rows [i0, i1) read S[i, ..kend].
        fn chunks(&self) -> Vec<(usize, usize, usize)> {
            (0..self.n)
                .step_by(CHUNK)
                .map(|i0| {
                    let i1 = (i0 + CHUNK).min(self.n);
                    (i0, i1, if self.causal { i1 } else { self.n })
                })
                .collect()
        }

        /// Merged-heads row stride of the output and its gradient.
        fn out_rs(&self) -> isize {
            (self.h * self.dh) as isize
        }
    }

    /// A matrix read through a pointer: its first element and (row, column) strides.
    #[derive(Clone, Copy)]
    struct View {
        ptr: Shared,
        rc: (isize, isize),
    }

    impl View {
        fn at(self, row: usize) -> *const f32 {
            self.element(row, 0)
        }

        fn element(self, row: usize, column: usize) -> *const f32 {
            self.ptr.0.wrapping_offset(row as isize * self.rc.0 + column as isize * self.rc.1).cast_const()
        }

        /// The view transposed.
        fn t(self) -> (isize, isize) {
            (self.rc.1, self.rc.0)
        }
    }

    /// One head's keys or values `[N m, d_h]` as a [`View`].
    fn head_view(x: &Heads, bi: usize, hi: usize) -> View {
        View { ptr: Shared(x.head(bi, hi).cast_mut()), rc: (x.rs(), x.cs()) }
    }

    /// A contiguous `[N m, d_h]` scratch as a [`View`].
    fn scratch_view(x: &[f32], dh: usize) -> View {
        View { ptr: Shared(x.as_ptr().cast_mut()), rc: (dh as isize, 1) }
    }

    /// S of head (bi, hi), contiguous `[N, N]`, causally with its entries on and above the diagonal
    /// zeroed (they are not part of the pattern).
    fn sort_of(sort: &[f32], g: &Geometry, bi: usize, hi: usize) -> Vec<f32> {
        let n = g.n;
        let mut s = sort[(bi * g.h + hi) * n * n..][..n * n].to_vec();
        if g.causal {
            for (i, row) in s.chunks_exact_mut(n).enumerate() {
                row[i..].fill(0.0);
            }
        }
        s
    }

    /// Head (bi, hi)'s S (as [`sort_of`] gives it) and its sorted blocks K̃ = S K, Ṽ = S V,
    /// contiguous `[N m, d_h]`: formed alike by the forward and again by the backward.
    fn mixtures(g: &Geometry, sort: &[f32], (k, v): (View, View), bi: usize, hi: usize) -> [Vec<f32>; 3] {
        let s = sort_of(sort, g, bi, hi);
        let (mut kt, mut vt) = (vec![0.0f32; g.l() * g.dh], vec![0.0f32; g.l() * g.dh]);
        mix(g, &s, k, &mut kt, false, false);
        mix(g, &s, v, &mut vt, false, false);
        [s, kt, vt]
    }

    /// dst[i, t, :] (+)= Σ_j S_ij src[j, t, :] for every position t of a block (`transpose`:
    /// Σ_i S_ij src[i, t, :] into row j), `dst` contiguous `[N m, d_h]`.
    fn mix(g: &Geometry, s: &[f32], src: View, dst: &mut [f32], transpose: bool, accumulate: bool) {
        let (n, m, dh) = (g.n, g.m, g.dh);
        let dst = Shared(dst.as_mut_ptr());
        let sp =
            View { ptr: Shared(s.as_ptr().cast_mut()), rc: if transpose { (1, n as isize) } else { (n as isize, 1) } };
        let chunks = g.chunks();
        let tasks: Vec<(usize, (usize, usize, usize))> =
            (0..m).flat_map(|t| chunks.iter().map(move |&c| (t, c))).collect();
        tasks.into_par_iter().for_each(|(t, (i0, i1, kend))| {
            // Sᵀ's rows [i0, i1) read S's rows i ≥ i0 (causally later blocks mix earlier ones)
            let (first, count) = if transpose && g.causal { (i0, n - i0) } else { (0, kend) };
            let lhs = sp.element(i0, first);
            let rhs = src.at(first * m + t);
            let out = dst.at((i0 * m + t) * dh);
            // SAFETY: rows [i0, i1) of S (or Sᵀ) against blocks [first, first + count) of src, row t
            // of each; the destination rows (i, t) for i in [i0, i1) are this task's alone
            unsafe {
                gemm(
                    (i1 - i0, dh, count),
                    out,
                    (m * dh) as isize,
                    accumulate,
                    lhs,
                    sp.rc,
                    rhs,
                    ((m as isize) * src.rc.0, src.rc.1),
                    1.0,
                )
            }
        });
    }

    /// dS_ij += Σ_t ⟨grad[i, t, :], x[j, t, :]⟩ into `ds` `[N, N]` (contiguous `grad`).
    fn mix_gradient(g: &Geometry, grad: &[f32], x: View, ds: &mut [f32]) {
        let (n, m, dh) = (g.n, g.m, g.dh);
        let (dsp, gv) = (Shared(ds.as_mut_ptr()), scratch_view(grad, dh));
        g.chunks().into_par_iter().for_each(|(i0, i1, kend)| {
            for t in 0..m {
                let lhs = gv.at(i0 * m + t);
                let rhs = x.at(t);
                // SAFETY: rows [i0, i1) of ds are this task's; rows (i, t) of grad and (j, t) of x
                unsafe {
                    gemm(
                        (i1 - i0, kend, dh),
                        dsp.at(i0 * n),
                        n as isize,
                        true,
                        lhs,
                        ((m * dh) as isize, 1),
                        rhs,
                        (x.rc.1, m as isize * x.rc.0),
                        1.0,
                    )
                }
            }
        });
    }

    /// Runs `f` for every (batch row, head): in parallel where the heads are many and short, one
    /// after another (each parallel inside) where the per-head scratch is large.
    fn for_each_head(g: &Geometry, f: impl Fn(usize, usize) + Sync) {
        let heads = g.b * g.h;
        if g.n < 4 * rayon::current_num_threads() {
            (0..heads).into_par_iter().for_each(|x| f(x / g.h, x % g.h));
        } else {
            (0..heads).for_each(|x| f(x / g.h, x % g.h));
        }
    }

    /// One block's scores into `s` (rows × width): against the sorted block `kt` (if it has one),
    /// then its own keys.
    fn block_scores(g: &Geometry, i: usize, q: View, kt: View, k: View, s: &mut [f32]) {
        let (m, dh, w) = (g.m, g.dh, g.width(i));
        let qb = q.at(i * m);
        let own = if g.mixes(i) {
            // SAFETY: rows of block i of q and kt, s m × w
            unsafe { gemm((m, m, dh), s.as_mut_ptr(), w as isize, false, qb, q.rc, kt.at(i * m), kt.t(), 1.0) };
            m
        } else {
            0
        };
        // SAFETY: as above, the own block of k into columns own..own + m
        unsafe { gemm((m, m, dh), s[own..].as_mut_ptr(), w as isize, false, qb, q.rc, k.at(i * m), k.t(), 1.0) };
    }

    /// Forward over views: the output `[b, N m, h · d_h]` and each row's log-sum-exp `[b, h, N m]`.
    fn forward_views(
        q: &Heads,
        k: &Heads,
        v: &Heads,
        sort: &FlexTensor,
        blocks: SinkhornBlocks,
    ) -> (FlexTensor, FlexTensor) {
        let g = Geometry::of(q, k, v, sort, blocks);
        let (l, m, dh) = (g.l(), g.m, g.dh);
        let sort = sort.to_contiguous();
        let mut out = vec![0.0f32; g.b * l * g.h * dh];
        let mut lse = vec![0.0f32; g.b * g.h * l];
        let (out_p, lse_p) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
        for_each_head(&g, |bi, hi| {
            let (kv, vv) = (head_view(k, bi, hi), head_view(v, bi, hi));
            let [_, kt, vt] = mixtures(&g, sort.storage::<f32>(), (kv, vv), bi, hi);
            let (ktv, vtv, qv) = (scratch_view(&kt, dh), scratch_view(&vt, dh), head_view(q, bi, hi));
            let buffers = || (vec![0.0f32; 2 * m * m], Vec::new());
            (0..g.n).into_par_iter().for_each_init(buffers, |(sc, scratch), i| {
                let w = g.width(i);
                let sc = &mut sc[..m * w];
                block_scores(&g, i, qv, ktv, kv, sc);
                let shift = w - m;
                // SAFETY: the rows of block i of this head's lse are this task's
                let ls = unsafe { std::slice::from_raw_parts_mut(lse_p.at((bi * g.h + hi) * l + i * m), m) };
                normalise_rows(RowNormaliser::Softmax, sc, w, |r| shift + g.own(i, r), ls, scratch);
                let o = out_p.at(((bi * l + i * m) * g.h + hi) * dh);
                // SAFETY: rows of block i, the columns of head hi: this task's
                unsafe {
                    if g.mixes(i) {
                        gemm(
                            (m, dh, m),
                            o,
                            g.out_rs(),
                            false,
                            sc.as_ptr(),
                            (w as isize, 1),
                            vtv.at(i * m),
                            vtv.rc,
                            1.0,
                        );
                    }
                    let own = sc[shift..].as_ptr();
                    gemm((m, dh, m), o, g.out_rs(), g.mixes(i), own, (w as isize, 1), vv.at(i * m), vv.rc, 1.0);
                }
            });
        });
        let data = |x: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(x, dims));
        (data(out, vec![g.b, l, g.h * dh]), data(lse, vec![g.b, g.h, l]))
    }

    /// Backward over views: dq, dk, dv `[b, h, N m, d_h]` and dS `[b, h, N, N]`, contiguous.
    fn backward_views(
        (q, k, v): (&Heads, &Heads, &Heads),
        sort: &FlexTensor,
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        blocks: SinkhornBlocks,
    ) -> [FlexTensor; 4] {
        let g = Geometry::of(q, k, v, sort, blocks);
        let (l, n, m, dh) = (g.l(), g.n, g.m, g.dh);
        let sort = sort.to_contiguous();
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        let (o, dout) = (out.storage::<f32>(), grad.storage::<f32>());
        let head = l * dh;
        let mut dq = vec![0.0f32; g.b * g.h * head];
        let mut dk = vec![0.0f32; g.b * g.h * head];
        let mut dv = vec![0.0f32; g.b * g.h * head];
        let mut ds = vec![0.0f32; g.b * g.h * n * n];
        let (dqp, dkp, dvp, dsp) =
            (Shared(dq.as_mut_ptr()), Shared(dk.as_mut_ptr()), Shared(dv.as_mut_ptr()), Shared(ds.as_mut_ptr()));
        for_each_head(&g, |bi, hi| {
            let at = (bi * g.h + hi) * head;
            let (qv, kv, vv) = (head_view(q, bi, hi), head_view(k, bi, hi), head_view(v, bi, hi));
            let [s, kt, vt] = mixtures(&g, sort.storage::<f32>(), (kv, vv), bi, hi);
            // block 0 of a causal call writes no sorted-block gradient: zeros
            let (mut dkt, mut dvt) = (vec![0.0f32; head], vec![0.0f32; head]);
            let (dktp, dvtp) = (Shared(dkt.as_mut_ptr()), Shared(dvt.as_mut_ptr()));
            let (ktv, vtv) = (scratch_view(&kt, dh), scratch_view(&vt, dh));
            let buffers = || (vec![0.0f32; 2 * m * m], vec![0.0f32; 2 * m * m]);
            (0..n).into_par_iter().for_each_init(buffers, |(p, da), i| {
                let w = g.width(i);
                let shift = w - m;
                let (p, da) = (&mut p[..m * w], &mut da[..m * w]);
                block_scores(&g, i, qv, ktv, kv, p);
                let ls = &lse[(bi * g.h + hi) * l + i * m..][..m];
                recompute_rows(RowNormaliser::Softmax, p, w, |r| shift + g.own(i, r), ls);
                let first = ((bi * l + i * m) * g.h + hi) * dh;
                let dob = dout[first..].as_ptr();
                let (do_rc, ws, pt) = ((g.out_rs(), 1), (w as isize, 1), (1, w as isize));
                let rows = |x: Shared, r: usize| x.at(at + r * dh);
                // SAFETY (every gemm below): rows of block i of this head — the own block's rows of
                // dq, dk, dv and the sorted block's of dkt, dvt are this task's alone
                unsafe {
                    // dP = dO [Ṽ_i; V_i]ᵀ
                    if g.mixes(i) {
                        gemm((m, m, dh), da.as_mut_ptr(), w as isize, false, dob, do_rc, vtv.at(i * m), vtv.t(), 1.0);
                    }
                    gemm(
                        (m, m, dh),
                        da[shift..].as_mut_ptr(),
                        w as isize,
                        false,
                        dob,
                        do_rc,
                        vv.at(i * m),
                        vv.t(),
                        1.0,
                    );
                }
                // dA = P ∘ (dP − D) in place of dP
                score_gradients(da, p, w, dout, o, first, g.out_rs() as usize, dh);
                let (pown, daown) = (p[shift..].as_ptr(), da[shift..].as_ptr());
                unsafe {
                    // dV_i += P_ownᵀ dO, dK_i += dA_ownᵀ q_i, dq_i = dA_own K_i (+ dÃ K̃_i)
                    gemm((m, dh, m), rows(dvp, i * m), dh as isize, true, pown, pt, dob, do_rc, 1.0);
                    gemm((m, dh, m), rows(dkp, i * m), dh as isize, true, daown, pt, qv.at(i * m), qv.rc, 1.0);
                    gemm((m, dh, m), rows(dqp, i * m), dh as isize, false, daown, ws, kv.at(i * m), kv.rc, 1.0);
                    if g.mixes(i) {
                        let (ps, das) = (p.as_ptr(), da.as_ptr());
                        gemm((m, dh, m), rows(dqp, i * m), dh as isize, true, das, ws, ktv.at(i * m), ktv.rc, 1.0);
                        // dṼ_i = P̃ᵀ dO, dK̃_i = dÃᵀ q_i
                        gemm((m, dh, m), dvtp.at(i * m * dh), dh as isize, false, ps, pt, dob, do_rc, 1.0);
                        gemm((m, dh, m), dktp.at(i * m * dh), dh as isize, false, das, pt, qv.at(i * m), qv.rc, 1.0);
                    }
                }
            });
            // the sort matrix's dS = dK̃ Kᵀ + dṼ Vᵀ over the blocks (causally its upper triangle
            // stays zero)
            // SAFETY: head (bi, hi)'s n × n of ds, and its rows of dk and dv, are this call's alone
            let dsh = unsafe { std::slice::from_raw_parts_mut(dsp.at((bi * g.h + hi) * n * n), n * n) };
            mix_gradient(&g, &dkt, kv, dsh);
            mix_gradient(&g, &dvt, vv, dsh);
            if g.causal {
                dsh.chunks_exact_mut(n).enumerate().for_each(|(i, row)| row[i..].fill(0.0));
            }
            // dK += Sᵀ dK̃, dV += Sᵀ dṼ
            let dkh = unsafe { std::slice::from_raw_parts_mut(dkp.at(at), head) };
            mix(&g, &s, scratch_view(&dkt, dh), dkh, true, true);
            let dvh = unsafe { std::slice::from_raw_parts_mut(dvp.at(at), head) };
            mix(&g, &s, scratch_view(&dvt, dh), dvh, true, true);
        });
        let data = |x: Vec<f32>, dims: [usize; 4]| FlexTensor::from_data(TensorData::new(x, dims));
        [data(dq, q.dims), data(dk, k.dims), data(dv, v.dims), data(ds, [g.b, g.h, n, n])]
    }

    fn forward_kernel(
        q: &FlexTensor,
        k: &FlexTensor,
        v: &FlexTensor,
        sort: &FlexTensor,
        blocks: SinkhornBlocks,
    ) -> (FlexTensor, FlexTensor) {
        let (q, k, v) = (readable(q), readable(k), readable(v));
        forward_views(&Heads::of(&q), &Heads::of(&k), &Heads::of(&v), sort, blocks)
    }

    impl SinkhornBlockAttention for Flex {
        fn sinkhorn_blocks(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            sort: FlexTensor,
            blocks: SinkhornBlocks,
        ) -> FlexTensor {
            forward_kernel(&q, &k, &v, &sort, blocks).0
        }
    }

    #[derive(Debug)]
    struct SinkhornBackward;

    /// The inputs (checkpointed), the output, each row's log-sum-exp, the blocks.
    #[derive(Debug, Clone)]
    struct Saved {
        inputs: [NodeId; 4],
        out: FlexTensor,
        lse: FlexTensor,
        blocks: SinkhornBlocks,
    }

    impl Backward<Flex, 4> for SinkhornBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let s = ops.state;
            let [q, k, v, sort]: [FlexTensor; 4] = s.inputs.map(|n| checkpointer.retrieve_node_output(n));
            let (q, k, v) = (readable(&q), readable(&k), readable(&v));
            let heads = (&Heads::of(&q), &Heads::of(&k), &Heads::of(&v));
            let g = backward_views(heads, &sort, &s.out, s.lse.storage::<f32>(), &grad, s.blocks);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), g.map(Some));
        }
    }

    impl<C: CheckpointStrategy> SinkhornBlockAttention for Autodiff<Flex, C> {
        fn sinkhorn_blocks(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            sort: FloatTensor<Self>,
            blocks: SinkhornBlocks,
        ) -> FloatTensor<Self> {
            let (out, lse) = forward_kernel(q.primitive(), k.primitive(), v.primitive(), sort.primitive(), blocks);
            let nodes = [q.node(), k.node(), v.node(), sort.node()];
            match SinkhornBackward.prepare::<C>(nodes).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let inputs = [&q, &k, &v, &sort].map(|t| prep.checkpoint(t));
                    prep.finish(Saved { inputs, out: out.clone(), lse, blocks }, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use crate::test_util::rel_diff;
    use burn::tensor::Distribution;
    use burn::tensor::activation::softmax;

    /// The same attention from Burn's ops: the sorted blocks S K and S V (causally S's lower
    /// triangle), scored beside the own block under the mask.
    fn composed(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, sort: Tensor<4>, blocks: SinkhornBlocks) -> Tensor<3> {
        let [b, h, l, dh] = q.dims();
        let m = blocks.block;
        let n = l / m;
        let device = q.device();
        let sort = if blocks.causal {
            // hides j ≥ i
            let hidden = Tensor::<2, Bool>::tril_mask([n, n], -1, &device);
            sort.mask_fill(hidden.reshape([1, 1, n, n]), 0.0)
        } else {
            sort
        };
        let sorted = |x: Tensor<4>| sort.clone().matmul(x.reshape([b, h, n, m * dh])).reshape([b * h, n, m, dh]);
        let blocks_of = |x: Tensor<4>| x.reshape([b * h, n, m, dh]);
        let keys = Tensor::cat(vec![sorted(k.clone()), blocks_of(k)], 2);
        let values = Tensor::cat(vec![sorted(v.clone()), blocks_of(v)], 2);
        let mut hidden = Vec::with_capacity(n * m * 2 * m);
        for i in 0..n {
            for t in 0..m {
                for j in 0..2 * m {
                    let own = j >= m;
                    let key = i * m + j - if own { m } else { 0 };
                    let p = i * m + t;
                    hidden.push(if own {
                        key >= blocks.len || (blocks.causal && key > p)
                    } else {
                        blocks.causal && i == 0
                    });
                }
            }
        }
        let hidden =
            Tensor::<3, Bool>::from_data(TensorData::new(hidden, [n, m, 2 * m]), &device).unsqueeze_dim::<4>(0);
        let scores = blocks_of(q).matmul(keys.swap_dims(2, 3)).mask_fill(hidden, -1.0e9);
        let out = softmax(scores, 3).matmul(values).reshape([b, h, l, dh]);
        out.swap_dims(1, 2).reshape([b, l, h * dh])
    }

    fn check(b: usize, h: usize, n: usize, m: usize, len: usize, causal: bool) {
        let device = Device::flex().autodiff();
        device.seed(5);
        let dh = 8;
        let l = n * m;
        // q, k, v as strided head views of one projection; keys and values zero past `len`
        let all: Tensor<4> = Tensor::random([b, l, 3 * h, dh], Distribution::Normal(0.0, 1.0), &device).swap_dims(1, 2);
        let real = Tensor::<1>::from_data(
            TensorData::new((0..l).map(|p| f32::from(u8::from(p < len))).collect::<Vec<_>>(), [l]),
            &device,
        )
        .reshape([1, 1, l, 1]);
        let q = all.clone().narrow(1, 0, h).mul_scalar(0.5);
        let k = all.clone().narrow(1, h, h) * real.clone();
        let v = all.narrow(1, 2 * h, h) * real;
        let sort = softmax(Tensor::<4>::random([b, h, n, n], Distribution::Normal(0.0, 2.0), &device), 3);
        let w: Tensor<3> = Tensor::random([b, l, h * dh], Distribution::Normal(0.0, 1.0), &device);
        let blocks = SinkhornBlocks { block: m, len, causal };
        let run = |kernel: bool| {
            let [q, k, v, sort] = [&q, &k, &v, &sort].map(|t| t.clone().require_grad());
            let y = if kernel {
                let before = calls();
                let y = sinkhorn_block_attention(q.clone(), k.clone(), v.clone(), sort.clone(), blocks).expect("flex");
                assert_eq!(calls(), before + 1);
                y
            } else {
                composed(q.clone(), k.clone(), v.clone(), sort.clone(), blocks)
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            let g = [&q, &k, &v, &sort].map(|t| t.grad(&grads).expect("a gradient"));
            (y, g)
        };
        let ((y1, g1), (y2, g2)) = (run(true), run(false));
        let case = format!("b {b}, h {h}, {n} blocks of {m}, len {len}, causal {causal}");
        let d = rel_diff(y1, y2);
        assert!(d < 1e-5, "forward, {case}: {d}");
        for ((a, e), name) in g1.into_iter().zip(g2).zip(["dq", "dk", "dv", "dS"]) {
            let d = rel_diff(a, e);
            assert!(d < 1e-5, "{name}, {case}: {d}");
        }
    }

    /// `f` on a pool of two threads: heads run in parallel below 8 blocks, one after another
    /// from 8 on, whatever the machine.
    fn on_two_threads(f: impl FnOnce() + Send) {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a thread pool").install(f)
    }

    #[test]
    fn equals_composed_sinkhorn_attention_with_its_gradients() {
        on_two_threads(|| {
            for causal in [false, true] {
                check(2, 3, 5, 4, 20, causal);
                // a padded last block
                check(1, 2, 4, 4, 14, causal);
            }
        })
    }

    #[test]
    fn more_blocks_than_a_chunk_of_the_sort_matrix() {
        // 40 blocks: three chunks of S, the heads one after another
        on_two_threads(|| {
            check(1, 2, 40, 2, 79, true);
            check(1, 1, 40, 2, 80, false);
        })
    }
}
