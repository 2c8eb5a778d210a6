//! Causal scaled dot-product attention as one CPU kernel, forward and backward, on the flex
//! backend — what FlashAttention (Dao et al. 2022) does on a GPU, for two CPU cores:
//!
//! O = softmax(Q Kᵀ + M) V,   M_ij = −∞ where key j comes after query i (j > i + offset),
//!
//! with the backward of the same paper (P recomputed from the saved log-sum-exp ℓ, never stored):
//!
//! P = exp(Q Kᵀ − ℓ),  dV = Pᵀ dO,  dP = dO Vᵀ,  D_i = Σ_d dO_id O_id,  dS = P ∘ (dP − D),
//! dQ = dS K,  dK = dSᵀ Q.
//!
//! The row normaliser is softmax by default; ReLU, sigmoid, sparsemax and entmax-1.5
//! ([`RowNormaliser`]) use the same blocks, saving the row's threshold τ in place of the
//! log-sum-exp where they have one (sparsemax, entmax-1.5), and their own score gradients in place
//! of P ∘ (dP − D).
//!
//! Composed from Burn's ops, attention forms the masked scores, the probabilities and their
//! gradients as `[batch, heads, L, L]` tensors — eight passes over 100 MiB per layer for the small
//! GPT (docs/cpu-speed.md) — and autodiff keeps two of them per layer for the backward pass. Here
//! each (batch, key/value head) is one task on rayon's pool; a task walks its query heads in blocks
//! of `QUERY_BLOCK` rows, scores a block against the keys it can see (the causal half: blocks
//! past the diagonal are never formed), and keeps only a block × L scratch. Matrix products go to
//! the `gemm` crate (flex's own GEMM) on strided views, so the head split of the fused QKV
//! projection is read in place; the output comes back with its heads already merged,
//! `[batch, L, heads · d_h]`, ready for the output projection.
//!
//! Queries must come scaled (`scale · q`); grouped-query attention maps query head h to key/value
//! head h / (n_heads / n_kv_heads). It reaches Burn through the `backend_extension` mechanism:
//! `FusedAttention` for `Flex` and for `Autodiff<Flex>` with the hand-written backward.
//! [`causal_attention`] returns `None` where the kernel does not apply (another backend or float
//! type), and the caller composes the ops instead.

use crate::normalisers::RowNormaliser;
use burn::prelude::*;

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many calls of [`causal_attention`] (separate q, k, v) and of the two ops with products
/// ([`causal_attention_with_products`], [`causal_self_attention_with_products`]) this thread has
/// run on the kernel (tests check a layer took it).
pub fn calls() -> usize {
    CALLS.get()
}

/// `norm`(q kᵀ + causal mask) v with the heads merged, `[b, Lq, h · d_h]`, by the fused kernel;
/// `None` on a backend or float type without it.
pub fn causal_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    offset: usize,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&q) && crate::has_kernel(&k) && crate::has_kernel(&v) {
        CALLS.set(CALLS.get() + 1);
        let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
        let d = burn::backend::Dispatch::causal_attention(q, k, v, offset, norm);
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, offset, norm);
    None
}

/// `FusedAttention::causal_self_attention` of the fused projection `qkv`, on flex (f32); `None`
/// elsewhere. Keys j ≤ i + `offset` are visible to query i; `norm` maps each row of scores to
/// weights.
pub fn causal_self_attention(
    qkv: Tensor<3>,
    n_heads: usize,
    n_kv_heads: usize,
    scale: f64,
    offset: usize,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) {
        let qkv = qkv.into_dispatch();
        let d = burn::backend::Dispatch::causal_self_attention(qkv, n_heads, n_kv_heads, scale, offset, norm);
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (qkv, n_heads, n_kv_heads, scale, offset, norm);
    None
}

/// `FusedAttention::causal_attention_with_products`: [`causal_attention`] with s_ij += a_i·b_j
/// (`a: [h, Lq, d']`, `b: [h, Lk, d']` per query head, shared by the batch rows), on flex (f32);
/// `None` elsewhere.
pub fn causal_attention_with_products(
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    (a, b): (Tensor<3>, Tensor<3>),
    offset: usize,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if [&q, &k, &v].into_iter().all(crate::has_kernel) && crate::has_kernel(&a) && crate::has_kernel(&b) {
        CALLS.set(CALLS.get() + 1);
        let (q, k, v, a, b) =
            (q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), a.into_dispatch(), b.into_dispatch());
        let d = burn::backend::Dispatch::causal_attention_with_products(q, k, v, a, b, offset, norm);
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, a, b, offset, norm);
    None
}

/// `FusedAttention::causal_self_attention_with_products` of the fused projection `qkv` and the
/// per-position vectors `a: [h, L, d']`, `b: [h, L, d']` (s_ij = scale · q_i·k_j + a_i·b_j), on
/// flex (f32); `None` elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn causal_self_attention_with_products(
    qkv: Tensor<3>,
    a: Tensor<3>,
    b: Tensor<3>,
    n_heads: usize,
    n_kv_heads: usize,
    scale: f64,
    offset: usize,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) && crate::has_kernel(&a) && crate::has_kernel(&b) {
        CALLS.set(CALLS.get() + 1);
        let (qkv, a, b) = (qkv.into_dispatch(), a.into_dispatch(), b.into_dispatch());
        let d = burn::backend::Dispatch::causal_self_attention_with_products(
            qkv, a, b, n_heads, n_kv_heads, scale, offset, norm,
        );
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (qkv, a, b, n_heads, n_kv_heads, scale, offset, norm);
    None
}

#[cfg(feature = "flex")]
pub use flex::*;

/// The kernels themselves, compiled with the `flex` feature.
#[cfg(feature = "flex")]
pub(crate) mod flex {
    use super::*;

    use crate::fast_math;
    use crate::normalisers::{entmax15_threshold, sparsemax_threshold};
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;

    /// Query rows scored together: a block × L score row set stays in L2 (64 × 1,024 floats is
    /// 256 KiB), and the causal saving is lost only inside the diagonal block.
    pub const QUERY_BLOCK: usize = 64;

    /// Causal attention of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait FusedAttention: Backend {
        /// `q: [b, h, Lq, d_h]` (scaled), `k`, `v: [b, h_kv, Lk, d_h]` → `[b, Lq, h · d_h]`; key j
        /// is visible to query i when j ≤ i + `offset`; `norm` maps each row of scores to weights.
        fn causal_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// Self-attention straight from a fused projection's output `qkv: [b, L, (h + 2 h_kv) · d_h]`
        /// (queries, keys, values side by side, unscaled) → `[b, L, h · d_h]`, scores
        /// `scale · q kᵀ`; its gradient comes back in the projection's layout, so no head split,
        /// scaling or merge is recorded, forward or backward.
        fn causal_self_attention(
            qkv: FloatTensor<Self>,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`causal_attention`](Self::causal_attention) with a product of per-position vectors
        /// added to every score, s_ij = q_i·k_j + a_i·b_j: `a: [h, Lq, d']`, `b: [h, Lk, d']` per
        /// query head, the same for every batch row (gradients summed over them).
        #[allow(clippy::too_many_arguments)]
        fn causal_attention_with_products(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            a: FloatTensor<Self>,
            b: FloatTensor<Self>,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`causal_self_attention`](Self::causal_self_attention) with a product of per-position
        /// vectors added to every score, s_ij = scale · q_i·k_j + a_i·b_j: `a: [h, L, d']` and
        /// `b: [h, L, d']` per query head, the same for every batch row (gradients summed over
        /// them).
        #[allow(clippy::too_many_arguments)]
        fn causal_self_attention_with_products(
            qkv: FloatTensor<Self>,
            a: FloatTensor<Self>,
            b: FloatTensor<Self>,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;
    }

    /// A `[b, heads, L, d_h]` tensor read in place: its storage and the element strides of each axis.
    pub(crate) struct Heads<'a> {
        data: &'a [f32],
        start: usize,
        pub(crate) dims: [usize; 4],
        strides: [isize; 4],
    }

    impl<'a> Heads<'a> {
        /// The view of `t` as it is stored (callers make negative strides contiguous first: `readable`).
        pub(crate) fn of(t: &'a FlexTensor) -> Self {
            let l = t.layout();
            let dims: [usize; 4] = l.shape().to_vec().try_into().expect("a 4-D tensor");
            let strides: [isize; 4] = l.strides().try_into().expect("a 4-D tensor");
            Self { data: t.storage::<f32>(), start: l.start_offset(), dims, strides }
        }

        /// Pointer to row 0 of head (`b`, `h`).
        pub(crate) fn head(&self, b: usize, h: usize) -> *const f32 {
            let off = self.start as isize + b as isize * self.strides[0] + h as isize * self.strides[1];
            // SAFETY: (b, h) is within dims, so the offset is inside the tensor's storage
            unsafe { self.data.as_ptr().offset(off) }
        }

        pub(crate) fn rs(&self) -> isize {
            self.strides[2]
        }

        pub(crate) fn cs(&self) -> isize {
            self.strides[3]
        }
    }

    pub(crate) fn readable(t: &FlexTensor) -> FlexTensor {
        if t.layout().strides().iter().all(|&s| s >= 0) { t.clone() } else { t.to_contiguous() }
    }

    /// A pointer shared by tasks that write disjoint parts of one buffer.
    #[derive(Clone, Copy)]
    pub(crate) struct Shared(pub(crate) *mut f32);

    // SAFETY: every task writes only the rows of its own (batch, key/value head)
    unsafe impl Send for Shared {}

    unsafe impl Sync for Shared {}

    impl Shared {
        /// The pointer (a method, so closures capture the `Send` wrapper and not its field).
        pub(crate) fn at(self, i: usize) -> *mut f32 {
            self.0.wrapping_add(i)
        }
    }

    /// Per-position vectors whose products add to the scores, shared by every batch row:
    /// s_ij += a_i · b_j, `a: [h, Lq, d]` for the queries and `b: [h, Lk, d]` for the keys, per
    /// query head, contiguous (TUPE's position–position term, `RelativeScheme::position_products`).
    pub(crate) struct Products<'a> {
        a: &'a [f32],
        b: &'a [f32],
        d: usize,
    }

    impl<'a> Products<'a> {
        /// `a` and `b` contiguous (from offset 0), checked against the call's heads and lengths:
        /// the GEMMs read them through pointers.
        fn of(a: &'a FlexTensor, b: &'a FlexTensor, (h, lq, lk): (usize, usize, usize)) -> Self {
            let (da, db) = (a.layout().shape().to_vec(), b.layout().shape().to_vec());
            let d = da.get(2).copied().unwrap_or(0);
            assert!(
                da == [h, lq, d] && db == [h, lk, d] && d > 0,
                "position products a {da:?} and b {db:?} do not fit {h} query heads over {lq} queries and {lk} keys"
            );
            Self { a: a.storage::<f32>(), b: b.storage::<f32>(), d }
        }

        /// s (rows × kend) += a[hi, q0..q0 + rows] · b[hi, ..kend]ᵀ.
        fn add_scores(&self, sh: &Shape, hi: usize, q0: usize, rows: usize, kend: usize, s: &mut [f32]) {
            let d = self.d;
            let a = self.a[(hi * sh.lq + q0) * d..].as_ptr();
            let b = self.b[hi * sh.lk * d..].as_ptr();
            // SAFETY: rows q0.. of head hi of a, keys 0..kend of head hi of b, s rows × kend
            unsafe {
                gemm((rows, kend, d), s.as_mut_ptr(), kend as isize, true, a, (d as isize, 1), b, (1, d as isize), 1.0)
            }
        }
    }

    /// Where the backward of [`Products`] writes, per batch row (summed over rows afterwards):
    /// da `[b, h, Lq, d]`, written once per element, and db `[b, h, Lk, d]`, accumulated into.
    #[derive(Clone, Copy)]
    struct ProductGrads {
        da: Shared,
        db: Shared,
    }

    /// `(a, b)` contiguous, as [`Products`] reads them.
    fn contiguous(products: Option<(&FlexTensor, &FlexTensor)>) -> Option<(FlexTensor, FlexTensor)> {
        products.map(|(a, b)| (a.to_contiguous(), b.to_contiguous()))
    }

    /// Runs a backward (`run`) with [`Products`] `(a, b)` of a call over `batch` rows of `h` query
    /// heads, `lq` queries and `lk` keys, and their gradients' per-row buffers; returns da and db
    /// summed over the rows (`None` without products).
    fn with_product_grads(
        products: Option<(&FlexTensor, &FlexTensor)>,
        (batch, h, lq, lk): (usize, usize, usize, usize),
        run: impl FnOnce(Option<(&Products, ProductGrads)>),
    ) -> Option<[FlexTensor; 2]> {
        let Some((a, b)) = contiguous(products) else {
            run(None);
            return None;
        };
        let pr = Products::of(&a, &b, (h, lq, lk));
        // every row of da is written, db accumulates
        let mut da = vec![0.0f32; batch * h * lq * pr.d];
        let mut db = vec![0.0f32; batch * h * lk * pr.d];
        run(Some((&pr, ProductGrads { da: Shared(da.as_mut_ptr()), db: Shared(db.as_mut_ptr()) })));
        let batch_sum = |x: Vec<f32>, len: usize| {
            let n = h * len * pr.d;
            let mut total = x[..n].to_vec();
            for row in x[n..].chunks_exact(n) {
                total.iter_mut().zip(row).for_each(|(t, &r)| *t += r);
            }
            FlexTensor::from_data(TensorData::new(total, [h, len, pr.d]))
        };
        Some([batch_sum(da, lq), batch_sum(db, lk)])
    }

    /// dst (m × n) := [dst +] factor · lhs (m × k) · rhs (k × n); strides in elements, (row, column).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm(
        (m, n, k): (usize, usize, usize),
        dst: *mut f32,
        dst_rs: isize,
        accumulate: bool,
        lhs: *const f32,
        (lhs_rs, lhs_cs): (isize, isize),
        rhs: *const f32,
        (rhs_rs, rhs_cs): (isize, isize),
        factor: f32,
    ) {
        // SAFETY: the caller's pointers and strides describe matrices of these sizes
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst,
                1,
                dst_rs,
                accumulate,
                lhs,
                lhs_cs,
                lhs_rs,
                rhs,
                rhs_cs,
                rhs_rs,
                if accumulate { 1.0 } else { 0.0 },
                factor,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }

    /// The shapes of one call.
    #[derive(Debug, Clone, Copy)]
    struct Shape {
        b: usize,
        h: usize,
        h_kv: usize,
        lq: usize,
        lk: usize,
        dh: usize,
        offset: usize,
    }

    impl Shape {
        fn of(q: &Heads, k: &Heads, v: &Heads, offset: usize) -> Self {
            let [b, h, lq, dh] = q.dims;
            let [_, h_kv, lk, _] = k.dims;
            assert!(h_kv > 0 && h % h_kv == 0, "query heads {h} are not a multiple of key/value heads {h_kv}");
            assert_eq!(k.dims, v.dims, "keys and values differ in shape");
            assert!(lk > 0 && k.dims[0] == b && k.dims[3] == dh, "keys {:?} do not fit queries {:?}", k.dims, q.dims);
            Self { b, h, h_kv, lq, lk, dh, offset }
        }

        fn group(&self) -> usize {
            self.h / self.h_kv
        }

        /// Query blocks: (first row, rows, keys the block's last row sees).
        fn blocks(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
            (0..self.lq).step_by(QUERY_BLOCK).map(|q0| {
                let rows = QUERY_BLOCK.min(self.lq - q0);
                (q0, rows, self.lk.min(q0 + rows + self.offset))
            })
        }

        /// Keys visible to query `i`.
        fn visible(&self, i: usize) -> usize {
            self.lk.min(i + self.offset + 1)
        }

        /// Merged-heads row stride of the output and its gradient.
        fn out_rs(&self) -> isize {
            (self.h * self.dh) as isize
        }
    }

    /// `factor` · scores of a query block against the first `kend` keys into `s` (rows × kend).
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores(
        sh: &Shape,
        q: *const f32,
        q_rc: (isize, isize),
        k: *const f32,
        k_rc: (isize, isize),
        rows: usize,
        kend: usize,
        s: &mut [f32],
        factor: f32,
    ) {
        // Kᵀ as a (d_h × kend) matrix: element (d, j) is K[j, d]
        unsafe { gemm((rows, kend, sh.dh), s.as_mut_ptr(), kend as isize, false, q, q_rc, k, (k_rc.1, k_rc.0), factor) }
    }

    crate::wide_vectors! {
        /// Rows of `s` (`kend` scores each) to probabilities over their first `visible(r)` entries,
        /// zeros after; each row's log-sum-exp into `lse`.
        fn softmax_rows(s: &mut [f32], kend: usize, visible: impl Fn(usize) -> usize, lse: &mut [f32]) {
            for ((r, row), l) in s.chunks_exact_mut(kend).enumerate().zip(lse) {
                let (seen, hidden) = row.split_at_mut(visible(r));
                let m = fast_math::max(seen);
                seen.iter_mut().for_each(|x| *x = fast_math::exp_neg(*x - m));
                let total = fast_math::sum(seen);
                let inv = 1.0 / total;
                seen.iter_mut().for_each(|x| *x *= inv);
                hidden.fill(0.0);
                *l = m + total.ln();
            }
        }
    }

    crate::wide_vectors! {
        /// Scores to the probabilities of the forward pass, P = exp(S − ℓ), zeros past `visible(r)`.
        fn probabilities(s: &mut [f32], kend: usize, visible: impl Fn(usize) -> usize, lse: &[f32]) {
            for ((r, row), &l) in s.chunks_exact_mut(kend).enumerate().zip(lse) {
                let (seen, hidden) = row.split_at_mut(visible(r));
                seen.iter_mut().for_each(|x| *x = fast_math::exp_neg(*x - l));
                hidden.fill(0.0);
            }
        }
    }

    crate::wide_vectors! {
        /// dS = P ∘ (dP − D) in place of dP, D_r = Σ_d dO_rd O_rd from the rows of `dout` and `o`
        /// (row stride `out_rs`, from element `first`).
        pub(crate) fn score_gradients(ds: &mut [f32], p: &[f32], kend: usize, dout: &[f32], o: &[f32], first: usize, out_rs: usize, dh: usize) {
            for (r, (dsr, pr)) in ds.chunks_exact_mut(kend).zip(p.chunks_exact(kend)).enumerate() {
                let at = first + r * out_rs;
                let d = fast_math::dot(&dout[at..at + dh], &o[at..at + dh]);
                dsr.iter_mut().zip(pr).for_each(|(x, &pv)| *x = pv * (*x - d));
            }
        }
    }

    /// The logistic sigmoid σ(t) = 1 / (1 + e^{−t}), from e^{−|t|} (which never overflows):
    /// 1 / (1 + e^{−t}) for t ≥ 0, e^t / (1 + e^t) below.
    #[inline(always)]
    fn logistic(t: f32) -> f32 {
        let e = fast_math::exp_neg(-t.abs());
        let r = 1.0 / (1.0 + e);
        if t >= 0.0 { r } else { e * r }
    }

    /// A row's visible scores to its weights in place, given the row's saved slot `t`: softmax
    /// exp(S − ℓ) (`t` its log-sum-exp), ReLU scale · max(S, 0), sigmoid σ(S + bias), sparsemax
    /// max(S − τ, 0), entmax-1.5 max(S/2 − τ, 0)² (`t` the threshold τ; unused by ReLU and sigmoid).
    #[inline(always)]
    fn row_probabilities(norm: RowNormaliser, seen: &mut [f32], t: f32) {
        match norm {
            RowNormaliser::Softmax => seen.iter_mut().for_each(|x| *x = fast_math::exp_neg(*x - t)),
            RowNormaliser::Relu { scale } => seen.iter_mut().for_each(|x| *x = scale * x.max(0.0)),
            RowNormaliser::Sigmoid { bias } => seen.iter_mut().for_each(|x| *x = logistic(*x + bias)),
            RowNormaliser::Sparsemax => seen.iter_mut().for_each(|x| *x = (*x - t).max(0.0)),
            RowNormaliser::Entmax15 => seen.iter_mut().for_each(|x| {
                let y = (0.5 * *x - t).max(0.0);
                *x = y * y;
            }),
        }
    }

    crate::wide_vectors! {
        /// [`softmax_rows`] for the other normalisers (softmax's ℓ needs the row's max and sum
        /// first): each row's threshold τ into `slot` (sparsemax, entmax-1.5; 0 for ReLU and
        /// sigmoid), `scratch` the sort's buffer.
        fn normaliser_rows(
            norm: RowNormaliser,
            s: &mut [f32],
            kend: usize,
            visible: impl Fn(usize) -> usize,
            slot: &mut [f32],
            scratch: &mut Vec<f32>,
        ) {
            for ((r, row), t) in s.chunks_exact_mut(kend).enumerate().zip(slot) {
                let (seen, hidden) = row.split_at_mut(visible(r));
                *t = match norm {
                    RowNormaliser::Sparsemax => sparsemax_threshold(seen, scratch),
                    RowNormaliser::Entmax15 => entmax15_threshold(seen, scratch),
                    _ => 0.0,
                };
                row_probabilities(norm, seen, *t);
                hidden.fill(0.0);
            }
        }
    }

    /// Rows of `s` to `norm`'s weights over their first `visible(r)` entries, zeros after; each
    /// row's log-sum-exp (softmax) or threshold τ (sparsemax, entmax-1.5) into `slot`, 0 otherwise.
    pub(crate) fn normalise_rows(
        norm: RowNormaliser,
        s: &mut [f32],
        kend: usize,
        visible: impl Fn(usize) -> usize,
        slot: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        match norm {
            RowNormaliser::Softmax => softmax_rows(s, kend, visible, slot),
            _ => normaliser_rows(norm, s, kend, visible, slot, scratch),
        }
    }

    crate::wide_vectors! {
        /// [`probabilities`] for the other normalisers, from each row's saved slot.
        fn normaliser_probabilities(
            norm: RowNormaliser,
            s: &mut [f32],
            kend: usize,
            visible: impl Fn(usize) -> usize,
            slot: &[f32],
        ) {
            for ((r, row), &t) in s.chunks_exact_mut(kend).enumerate().zip(slot) {
                let (seen, hidden) = row.split_at_mut(visible(r));
                row_probabilities(norm, seen, t);
                hidden.fill(0.0);
            }
        }
    }

    /// Scores to the weights of the forward pass (zeros past `visible(r)`), from each row's saved
    /// log-sum-exp or threshold.
    pub(crate) fn recompute_rows(
        norm: RowNormaliser,
        s: &mut [f32],
        kend: usize,
        visible: impl Fn(usize) -> usize,
        slot: &[f32],
    ) {
        match norm {
            RowNormaliser::Softmax => probabilities(s, kend, visible, slot),
            _ => normaliser_probabilities(norm, s, kend, visible, slot),
        }
    }

    crate::wide_vectors! {
        /// dS in place of dP for the normalisers other than softmax ([`score_gradients`]), from the
        /// rows of P; zeros past `visible(r)`. On a row, with J = {j : P_j > 0}:
        ///
        /// ReLU: dS_j = scale · dP_j on J.   Sigmoid: dS_j = dP_j · P_j (1 − P_j).
        /// Sparsemax: dS_j = dP_j − Σ_{i∈J} dP_i / |J| on J.
        /// Entmax-1.5: with g = √P (= S/2 − τ on J, the derivative of P by S),
        /// dS_j = g_j dP_j − g_j · Σ_i g_i dP_i / Σ_i g_i.
        ///
        /// Off J the sparse ones and ReLU give 0.
        pub(crate) fn normaliser_gradients(
            norm: RowNormaliser,
            ds: &mut [f32],
            p: &[f32],
            kend: usize,
            visible: impl Fn(usize) -> usize,
        ) {
            for (r, (dsr, pr)) in ds.chunks_exact_mut(kend).zip(p.chunks_exact(kend)).enumerate() {
                let (seen, hidden) = dsr.split_at_mut(visible(r));
                let pr = &pr[..seen.len()];
                match norm {
                    RowNormaliser::Softmax => unreachable!("softmax's score gradients are score_gradients"),
                    RowNormaliser::Relu { scale } => {
                        seen.iter_mut().zip(pr).for_each(|(x, &pv)| *x = if pv != 0.0 { scale * *x } else { 0.0 })
                    }
                    RowNormaliser::Sigmoid { .. } => seen.iter_mut().zip(pr).for_each(|(x, &pv)| *x *= pv * (1.0 - pv)),
                    RowNormaliser::Sparsemax => {
                        let (mut total, mut count) = (0.0f32, 0.0f32);
                        for (&x, &pv) in seen.iter().zip(pr) {
                            if pv > 0.0 {
                                total += x;
                                count += 1.0;
                            }
                        }
                        // the row's largest score is always in the support: count ≥ 1
                        let mean = total / count.max(1.0);
                        seen.iter_mut().zip(pr).for_each(|(x, &pv)| *x = if pv > 0.0 { *x - mean } else { 0.0 });
                    }
                    RowNormaliser::Entmax15 => {
                        let (mut gdp, mut gsum) = (0.0f32, 0.0f32);
                        for (&x, &pv) in seen.iter().zip(pr) {
                            let g = pv.sqrt();
                            gdp += g * x;
                            gsum += g;
                        }
                        // Σ g ≥ Σ P = 1 (√P ≥ P below 1); the guard is for a row of NaNs
                        let c = if gsum > 0.0 { gdp / gsum } else { 0.0 };
                        seen.iter_mut().zip(pr).for_each(|(x, &pv)| *x = pv.sqrt() * (*x - c));
                    }
                }
                hidden.fill(0.0);
            }
        }
    }

    /// Forward over views: the output `[b, Lq, h · d_h]` (heads merged) and each row's saved slot,
    /// `[b, h, Lq]`: the row's log-sum-exp, or its threshold τ (sparsemax, entmax-1.5; 0 for ReLU
    /// and sigmoid); scores are `scale · q kᵀ`, weights `norm` of them.
    fn forward_views(
        q: &Heads,
        k: &Heads,
        v: &Heads,
        scale: f32,
        products: Option<&Products>,
        offset: usize,
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let sh = Shape::of(q, k, v, offset);
        let (g, dh) = (sh.group(), sh.dh);
        // written only by the GEMMs below, through pointers, each element once: no zero fill
        let n_out = sh.b * sh.lq * sh.h * dh;
        let mut out: Vec<f32> = Vec::with_capacity(n_out);
        let mut lse = vec![0.0f32; sh.b * sh.h * sh.lq];
        let (out_ptr, lse_ptr) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (k.head(bi, kv), v.head(bi, kv));
            let mut s = vec![0.0f32; QUERY_BLOCK * sh.lk];
            // the sort buffer of the thresholds, one row at a time
            let mut scratch: Vec<f32> = Vec::with_capacity(if norm.needs_threshold() { sh.lk } else { 0 });
            for hi in kv * g..(kv + 1) * g {
                let qp = q.head(bi, hi);
                for (q0, rows, kend) in sh.blocks() {
                    let s = &mut s[..rows * kend];
                    let qb = qp.wrapping_offset(q0 as isize * q.rs());
                    // SAFETY: row q0.. of this head, keys 0..kend ≤ Lk
                    unsafe { scores(&sh, qb, (q.rs(), q.cs()), kp, (k.rs(), k.cs()), rows, kend, s, scale) };
                    if let Some(pr) = products {
                        pr.add_scores(&sh, hi, q0, rows, kend, s);
                    }
                    // SAFETY: rows (bi, hi, q0..q0 + rows) of lse belong to this task
                    let l = unsafe { std::slice::from_raw_parts_mut(lse_ptr.at((bi * sh.h + hi) * sh.lq + q0), rows) };
                    normalise_rows(norm, s, kend, |r| sh.visible(q0 + r), l, &mut scratch);
                    let o = out_ptr.at((bi * sh.lq + q0) * sh.h * dh + hi * dh);
                    // SAFETY: rows q0..q0+rows, columns of head hi: this task's
                    unsafe {
                        gemm(
                            (rows, dh, kend),
                            o,
                            sh.out_rs(),
                            false,
                            s.as_ptr(),
                            (kend as isize, 1),
                            vp,
                            (v.rs(), v.cs()),
                            1.0,
                        )
                    };
                }
            }
        });
        // SAFETY: each task wrote the rows of its (batch, key/value head) for every query block
        unsafe { out.set_len(n_out) };
        let lse = FlexTensor::from_data(TensorData::new(lse, [sh.b, sh.h, sh.lq]));
        (FlexTensor::from_data(TensorData::new(out, [sh.b, sh.lq, sh.h * dh])), lse)
    }

    /// Where the backward writes one of dq, dk, dv: element (b, head, row, d) at
    /// `ptr + b·strides[0] + head·strides[1] + row·strides[2] + d`.
    #[derive(Clone, Copy)]
    pub(crate) struct Dest {
        pub(crate) ptr: Shared,
        pub(crate) strides: [usize; 3],
    }

    impl Dest {
        pub(crate) fn head(self, b: usize, h: usize) -> *mut f32 {
            self.ptr.at(b * self.strides[0] + h * self.strides[1])
        }

        pub(crate) fn rs(self) -> isize {
            self.strides[2] as isize
        }
    }

    /// Backward over views, into `dq` (written once per element) and `dk`, `dv` (accumulated into:
    /// they must start at zero).
    #[allow(clippy::too_many_arguments)]
    fn backward_views(
        (qh, kh, vh): (&Heads, &Heads, &Heads),
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        scale: f32,
        products: Option<(&Products, ProductGrads)>,
        offset: usize,
        norm: RowNormaliser,
        [dq, dk, dv]: [Dest; 3],
    ) {
        let sh = Shape::of(qh, kh, vh, offset);
        let (g, dh) = (sh.group(), sh.dh);
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        let (o, dout) = (out.storage::<f32>(), grad.storage::<f32>());
        let out_rs = sh.out_rs();
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (kh.head(bi, kv), vh.head(bi, kv));
            let (dkp, dvp) = (dk.head(bi, kv), dv.head(bi, kv));
            let mut p = vec![0.0f32; QUERY_BLOCK * sh.lk];
            let mut ds = vec![0.0f32; QUERY_BLOCK * sh.lk];
            for hi in kv * g..(kv + 1) * g {
                let qp = qh.head(bi, hi);
                for (q0, rows, kend) in sh.blocks() {
                    let (p, ds) = (&mut p[..rows * kend], &mut ds[..rows * kend]);
                    let qb = qp.wrapping_offset(q0 as isize * qh.rs());
                    let first = (bi * sh.lq + q0) * sh.h * dh + hi * dh;
                    let dob = dout[first..].as_ptr();
                    let (qrc, krc, vrc) = ((qh.rs(), qh.cs()), (kh.rs(), kh.cs()), (vh.rs(), vh.cs()));
                    // SAFETY (all gemm calls below): rows q0.. of head hi and keys 0..kend, inside
                    // their tensors; dq/dk/dv rows written are this task's
                    unsafe { scores(&sh, qb, qrc, kp, krc, rows, kend, p, scale) };
                    if let Some((pr, _)) = products {
                        pr.add_scores(&sh, hi, q0, rows, kend, p);
                    }
                    let l = &lse[(bi * sh.h + hi) * sh.lq + q0..];
                    recompute_rows(norm, p, kend, |r| sh.visible(q0 + r), l);
                    let pt = (1, kend as isize);
                    // dV += Pᵀ dO
                    unsafe { gemm((kend, dh, rows), dvp, dv.rs(), true, p.as_ptr(), pt, dob, (out_rs, 1), 1.0) };
                    // dP = dO Vᵀ
                    let vt = (vrc.1, vrc.0);
                    unsafe {
                        gemm((rows, kend, dh), ds.as_mut_ptr(), kend as isize, false, dob, (out_rs, 1), vp, vt, 1.0)
                    };
                    // dS = P ∘ (dP − D) for softmax, each other normaliser's own otherwise
                    match norm {
                        RowNormaliser::Softmax => score_gradients(ds, p, kend, dout, o, first, out_rs as usize, dh),
                        _ => normaliser_gradients(norm, ds, p, kend, |r| sh.visible(q0 + r)),
                    }
                    // dQ = scale · dS K
                    let dqb = dq.head(bi, hi).wrapping_add(q0 * dq.strides[2]);
                    let dsr = (kend as isize, 1);
                    unsafe { gemm((rows, dh, kend), dqb, dq.rs(), false, ds.as_ptr(), dsr, kp, krc, scale) };
                    // dK += scale · dSᵀ Q
                    unsafe { gemm((kend, dh, rows), dkp, dk.rs(), true, ds.as_ptr(), pt, qb, qrc, scale) };
                    if let Some((pr, grads)) = products {
                        // this batch row's da = dS b, db += dSᵀ a (rows of head hi: this task's)
                        let d = pr.d as isize;
                        let da = grads.da.at(((bi * sh.h + hi) * sh.lq + q0) * pr.d);
                        let db = grads.db.at((bi * sh.h + hi) * sh.lk * pr.d);
                        let (a, b) = (pr.a[(hi * sh.lq + q0) * pr.d..].as_ptr(), pr.b[hi * sh.lk * pr.d..].as_ptr());
                        unsafe { gemm((rows, pr.d, kend), da, d, false, ds.as_ptr(), dsr, b, (d, 1), 1.0) };
                        unsafe { gemm((kend, pr.d, rows), db, d, true, ds.as_ptr(), pt, a, (d, 1), 1.0) };
                    }
                }
            }
        });
    }

    /// Forward of [`FusedAttention::causal_attention`].
    fn forward_kernel(
        q: &FlexTensor,
        k: &FlexTensor,
        v: &FlexTensor,
        products: Option<(&FlexTensor, &FlexTensor)>,
        offset: usize,
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let (q, k, v) = (readable(q), readable(k), readable(v));
        let (qh, kh, vh) = (Heads::of(&q), Heads::of(&k), Heads::of(&v));
        let products = contiguous(products);
        let products = products.as_ref().map(|(a, b)| Products::of(a, b, (qh.dims[1], qh.dims[2], kh.dims[2])));
        forward_views(&qh, &kh, &vh, 1.0, products.as_ref(), offset, norm)
    }

    /// Backward of [`FusedAttention::causal_attention`]: (dq, dk, dv), contiguous, in the shapes of
    /// q, k, v. `lse` holds each row's log-sum-exp, or its threshold τ.
    #[allow(clippy::too_many_arguments)]
    fn backward_kernel(
        (q, k, v): (&FlexTensor, &FlexTensor, &FlexTensor),
        products: Option<(&FlexTensor, &FlexTensor)>,
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        offset: usize,
        norm: RowNormaliser,
    ) -> ([FlexTensor; 3], Option<[FlexTensor; 2]>) {
        let (q, k, v) = (readable(q), readable(k), readable(v));
        let (qh, kh, vh) = (Heads::of(&q), Heads::of(&k), Heads::of(&v));
        let ([b, h, lq, dh], [_, h_kv, lk, _]) = (qh.dims, kh.dims);
        // dq is written once by GEMMs (no zero fill); dk and dv accumulate
        let n_dq = b * h * lq * dh;
        let mut dq: Vec<f32> = Vec::with_capacity(n_dq);
        let mut dk = vec![0.0f32; b * h_kv * lk * dh];
        let mut dv = vec![0.0f32; b * h_kv * lk * dh];
        let dest = |ptr: *mut f32, heads: usize, len: usize| Dest {
            ptr: Shared(ptr),
            strides: [heads * len * dh, len * dh, dh],
        };
        let dests = [dest(dq.as_mut_ptr(), h, lq), dest(dk.as_mut_ptr(), h_kv, lk), dest(dv.as_mut_ptr(), h_kv, lk)];
        let dab = with_product_grads(products, (b, h, lq, lk), |pr| {
            backward_views((&qh, &kh, &vh), out, lse, grad, 1.0, pr, offset, norm, dests)
        });
        // SAFETY: every query block of every head was written by its task
        unsafe { dq.set_len(n_dq) };
        let data = |x: Vec<f32>, dims: [usize; 4]| FlexTensor::from_data(TensorData::new(x, dims));
        ([data(dq, qh.dims), data(dk, kh.dims), data(dv, vh.dims)], dab)
    }

    /// The query, key and value heads of a fused projection's output `[b, L, (h + 2 h_kv) · d_h]`,
    /// read in place.
    pub(crate) fn packed_views(qkv: &FlexTensor, n_heads: usize, n_kv_heads: usize) -> [Heads<'_>; 3] {
        let l = qkv.layout();
        let [b, len, width]: [usize; 3] = l.shape().to_vec().try_into().expect("a 3-D projection");
        let dh = width / (n_heads + 2 * n_kv_heads);
        let view = |first: usize, heads: usize| Heads {
            data: qkv.storage::<f32>(),
            start: l.start_offset() + first * dh,
            dims: [b, heads, len, dh],
            strides: [(len * width) as isize, dh as isize, width as isize, 1],
        };
        [view(0, n_heads), view(n_heads, n_kv_heads), view(n_heads + n_kv_heads, n_kv_heads)]
    }

    /// Forward of [`FusedAttention::causal_self_attention`].
    fn packed_forward(
        qkv: &FlexTensor,
        products: Option<(&FlexTensor, &FlexTensor)>,
        heads: (usize, usize),
        scale: f64,
        offset: usize,
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let qkv = readable_packed(qkv);
        let [q, k, v] = packed_views(&qkv, heads.0, heads.1);
        let products = contiguous(products);
        let (h, len) = (q.dims[1], q.dims[2]);
        let products = products.as_ref().map(|(a, b)| Products::of(a, b, (h, len, len)));
        forward_views(&q, &k, &v, scale as f32, products.as_ref(), offset, norm)
    }

    /// The projection contiguous in its last axis (how `packed_views` reads it).
    pub(crate) fn readable_packed(t: &FlexTensor) -> FlexTensor {
        let l = t.layout();
        let s = l.strides();
        let dims = l.shape().to_vec();
        let dense = s.len() == 3 && s[2] == 1 && s[1] == dims[2] as isize && s[0] == (dims[1] * dims[2]) as isize;
        if dense { t.clone() } else { t.to_contiguous() }
    }

    /// Backward of [`FusedAttention::causal_self_attention`]: the gradient of `qkv`, in its
    /// layout, and with [`Products`] `(a, b)` theirs, summed over the batch. `lse` holds each
    /// row's log-sum-exp, or its threshold τ.
    #[allow(clippy::too_many_arguments)]
    fn packed_backward(
        qkv: &FlexTensor,
        products: Option<(&FlexTensor, &FlexTensor)>,
        (n_heads, n_kv_heads): (usize, usize),
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        scale: f64,
        offset: usize,
        norm: RowNormaliser,
    ) -> (FlexTensor, Option<[FlexTensor; 2]>) {
        let qkv = readable_packed(qkv);
        let [q, k, v] = packed_views(&qkv, n_heads, n_kv_heads);
        let [b, _, len, dh] = q.dims;
        let width = (n_heads + 2 * n_kv_heads) * dh;
        // zeros: dk and dv accumulate over query blocks and the heads of a group
        let mut d = vec![0.0f32; b * len * width];
        let base = d.as_mut_ptr();
        let dest =
            |first: usize| Dest { ptr: Shared(base.wrapping_add(first * dh)), strides: [len * width, dh, width] };
        let dests = [dest(0), dest(n_heads), dest(n_heads + n_kv_heads)];
        let dab = with_product_grads(products, (b, n_heads, len, len), |pr| {
            backward_views((&q, &k, &v), out, lse, grad, scale as f32, pr, offset, norm, dests)
        });
        (FlexTensor::from_data(TensorData::new(d, [b, len, width])), dab)
    }

    impl FusedAttention for Flex {
        fn causal_attention(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            offset: usize,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(&q, &k, &v, None, offset, norm).0
        }

        fn causal_attention_with_products(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            a: FlexTensor,
            b: FlexTensor,
            offset: usize,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(&q, &k, &v, Some((&a, &b)), offset, norm).0
        }

        fn causal_self_attention(
            qkv: FlexTensor,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FlexTensor {
            packed_forward(&qkv, None, (n_heads, n_kv_heads), scale, offset, norm).0
        }

        fn causal_self_attention_with_products(
            qkv: FlexTensor,
            a: FlexTensor,
            b: FlexTensor,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FlexTensor {
            packed_forward(&qkv, Some((&a, &b)), (n_heads, n_kv_heads), scale, offset, norm).0
        }
    }

    #[derive(Debug)]
    struct CausalAttentionBackward;

    /// What the backward pass needs: the inputs (checkpointed), the output, each row's log-sum-exp
    /// or threshold τ, and the call's constants.
    #[derive(Debug, Clone)]
    struct Saved {
        q: NodeId,
        k: NodeId,
        v: NodeId,
        out: FlexTensor,
        lse: FlexTensor,
        offset: usize,
        norm: RowNormaliser,
    }

    impl Backward<Flex, 3> for CausalAttentionBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let s = ops.state;
            let q: FlexTensor = checkpointer.retrieve_node_output(s.q);
            let k: FlexTensor = checkpointer.retrieve_node_output(s.k);
            let v: FlexTensor = checkpointer.retrieve_node_output(s.v);
            let (g, _) = backward_kernel((&q, &k, &v), None, &s.out, s.lse.storage::<f32>(), &grad, s.offset, s.norm);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), g.map(Some));
        }
    }

    #[derive(Debug)]
    struct SeparateProductsBackward;

    /// What an op's backward saves ([`Saved`], [`SavedPacked`]) and its per-position vectors
    /// (checkpointed).
    #[derive(Debug, Clone)]
    struct WithProducts<S> {
        saved: S,
        a: NodeId,
        b: NodeId,
    }

    impl Backward<Flex, 5> for SeparateProductsBackward {
        type State = WithProducts<Saved>;

        fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let WithProducts { saved: s, a, b } = ops.state;
            let [q, k, v, a, b]: [FlexTensor; 5] = [s.q, s.k, s.v, a, b].map(|n| checkpointer.retrieve_node_output(n));
            let lse = s.lse.storage::<f32>();
            let ([dq, dk, dv], dab) =
                backward_kernel((&q, &k, &v), Some((&a, &b)), &s.out, lse, &grad, s.offset, s.norm);
            let [da, db] = dab.expect("products given, their gradients come back");
            let g = [dq, dk, dv, da, db].map(Some);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), g);
        }
    }

    #[derive(Debug)]
    struct SelfAttentionBackward;

    /// The projection (checkpointed), the output, each row's log-sum-exp or threshold τ, and the
    /// call's constants.
    #[derive(Debug, Clone)]
    struct SavedPacked {
        qkv: NodeId,
        out: FlexTensor,
        lse: FlexTensor,
        heads: (usize, usize),
        scale: f64,
        offset: usize,
        norm: RowNormaliser,
    }

    impl Backward<Flex, 1> for SelfAttentionBackward {
        type State = SavedPacked;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let s = ops.state;
            let qkv: FlexTensor = checkpointer.retrieve_node_output(s.qkv);
            let lse = s.lse.storage::<f32>();
            let (g, _) = packed_backward(&qkv, None, s.heads, &s.out, lse, &grad, s.scale, s.offset, s.norm);
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), [Some(g)]);
        }
    }

    #[derive(Debug)]
    struct ProductsBackward;

    impl Backward<Flex, 3> for ProductsBackward {
        type State = WithProducts<SavedPacked>;

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let WithProducts { saved: s, a, b } = ops.state;
            let [qkv, a, b]: [FlexTensor; 3] = [s.qkv, a, b].map(|n| checkpointer.retrieve_node_output(n));
            let lse = s.lse.storage::<f32>();
            let (dqkv, dab) =
                packed_backward(&qkv, Some((&a, &b)), s.heads, &s.out, lse, &grad, s.scale, s.offset, s.norm);
            let [da, db] = dab.expect("products given, their gradients come back");
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), [Some(dqkv), Some(da), Some(db)]);
        }
    }

    impl<C: CheckpointStrategy> FusedAttention for Autodiff<Flex, C> {
        fn causal_attention_with_products(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            a: FloatTensor<Self>,
            b: FloatTensor<Self>,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let products = Some((a.primitive(), b.primitive()));
            let (out, lse) = forward_kernel(q.primitive(), k.primitive(), v.primitive(), products, offset, norm);
            let nodes = [q.node(), k.node(), v.node(), a.node(), b.node()];
            match SeparateProductsBackward.prepare::<C>(nodes).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let [qs, ks, vs, as_, bs] = [&q, &k, &v, &a, &b].map(|t| prep.checkpoint(t));
                    let separate = Saved { q: qs, k: ks, v: vs, out: out.clone(), lse, offset, norm };
                    prep.finish(WithProducts { saved: separate, a: as_, b: bs }, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }

        fn causal_self_attention_with_products(
            qkv: FloatTensor<Self>,
            a: FloatTensor<Self>,
            b: FloatTensor<Self>,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let heads = (n_heads, n_kv_heads);
            let products = Some((a.primitive(), b.primitive()));
            let (out, lse) = packed_forward(qkv.primitive(), products, heads, scale, offset, norm);
            match ProductsBackward.prepare::<C>([qkv.node(), a.node(), b.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let (qs, as_, bs) = (prep.checkpoint(&qkv), prep.checkpoint(&a), prep.checkpoint(&b));
                    let packed = SavedPacked { qkv: qs, out: out.clone(), lse, heads, scale, offset, norm };
                    prep.finish(WithProducts { saved: packed, a: as_, b: bs }, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }

        fn causal_self_attention(
            qkv: FloatTensor<Self>,
            n_heads: usize,
            n_kv_heads: usize,
            scale: f64,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let heads = (n_heads, n_kv_heads);
            let (out, lse) = packed_forward(qkv.primitive(), None, heads, scale, offset, norm);
            match SelfAttentionBackward.prepare::<C>([qkv.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let node = prep.checkpoint(&qkv);
                    let state = SavedPacked { qkv: node, out: out.clone(), lse, heads, scale, offset, norm };
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }

        fn causal_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            offset: usize,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let (out, lse) = forward_kernel(q.primitive(), k.primitive(), v.primitive(), None, offset, norm);
            match CausalAttentionBackward.prepare::<C>([q.node(), k.node(), v.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let (qs, ks, vs) = (prep.checkpoint(&q), prep.checkpoint(&k), prep.checkpoint(&v));
                    prep.finish(Saved { q: qs, k: ks, v: vs, out: out.clone(), lse, offset, norm }, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::normalisers::normalise_scores;
        use crate::test_util::{max_diff, rel_diff};
        use burn::tensor::Distribution;

        /// The same attention from Burn's ops, as `MultiHeadAttention` composes it (softmax), with
        /// `norm` over the keys.
        fn composed(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, offset: usize, norm: RowNormaliser) -> Tensor<3> {
            let [b, h, lq, dh] = q.dims();
            let [_, h_kv, lk, _] = k.dims();
            let g = h / h_kv;
            let scores = q.reshape([b, h_kv, g * lq, dh]).matmul(k.swap_dims(2, 3)).reshape([b, h, lq, lk]);
            let hidden =
                Tensor::<2, Bool>::tril_mask([lq, lk], offset as i64, &scores.device()).reshape([1, 1, lq, lk]);
            let probs = normalise_scores(scores.mask_fill(hidden, -1.0e9), norm).reshape([b, h_kv, g * lq, lk]);
            probs.matmul(v).reshape([b, h, lq, dh]).swap_dims(1, 2).reshape([b, lq, h * dh])
        }

        /// The normalisers besides softmax, as a model with 16 keys would configure them.
        fn normalisers() -> [RowNormaliser; 4] {
            [
                RowNormaliser::Relu { scale: 1.0 / 16.0 },
                RowNormaliser::Sigmoid { bias: -(16.0f32).ln() },
                RowNormaliser::Sparsemax,
                RowNormaliser::Entmax15,
            ]
        }

        /// How close the kernel must come to the composed ops: 1e-5 for softmax; 1e-4 for the others,
        /// whose references sum their thresholds over the row in f32 in another order (the kernel
        /// in f64) and whose sigmoid is libm's exp (the kernel's a polynomial).
        fn tolerance(norm: RowNormaliser) -> f32 {
            if norm == RowNormaliser::Softmax { 1e-5 } else { 1e-4 }
        }

        /// q, k, v as the fused projection hands them over: strided views of one `[b, L, heads, d_h]`
        /// tensor (scaled queries: a separate op, as in the model).
        fn views(b: usize, h: usize, h_kv: usize, lq: usize, lk: usize, dh: usize, device: &Device) -> [Tensor<4>; 3] {
            let heads = h + 2 * h_kv;
            let all: Tensor<4> =
                Tensor::random([b, lk, heads, dh], Distribution::Normal(0.0, 1.5), device).swap_dims(1, 2);
            let q = all.clone().narrow(1, 0, h).narrow(2, lk - lq, lq).mul_scalar(0.7);
            [q, all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv)]
        }

        fn check(norm: RowNormaliser, b: usize, h: usize, h_kv: usize, lq: usize, lk: usize, dh: usize) {
            let device = Device::flex().autodiff();
            device.seed(11);
            let [q, k, v] = views(b, h, h_kv, lq, lk, dh, &device);
            let w: Tensor<3> = Tensor::random([b, lq, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let offset = lk - lq;
            let run = |fused: bool| {
                let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
                let y = if fused {
                    causal_attention(q.clone(), k.clone(), v.clone(), offset, norm).expect("flex has the kernel")
                } else {
                    composed(q.clone(), k.clone(), v.clone(), offset, norm)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, [q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()])
            };
            let (y1, g1) = run(true);
            let (y2, g2) = run(false);
            let (shape, tol) = (format!("{norm:?}, b {b}, h {h}/{h_kv}, Lq {lq}, Lk {lk}, d_h {dh}"), tolerance(norm));
            let d = rel_diff(y1, y2);
            assert!(d < tol, "forward, {shape}: {d}");
            for ((a, e), name) in g1.into_iter().zip(g2).zip(["dq", "dk", "dv"]) {
                let d = rel_diff(a, e);
                assert!(d < tol, "{name}, {shape}: {d}");
            }
        }

        #[test]
        fn equals_composed_attention_with_its_gradients() {
            check(RowNormaliser::Softmax, 2, 3, 3, 10, 10, 8);
        }

        #[test]
        fn query_blocks_and_the_diagonal() {
            // three query blocks, the last one short
            check(RowNormaliser::Softmax, 1, 2, 2, 2 * QUERY_BLOCK + 22, 2 * QUERY_BLOCK + 22, 4);
        }

        #[test]
        fn grouped_queries_and_cached_keys() {
            // two query heads per key/value head; 5 new queries after 4 cached keys
            check(RowNormaliser::Softmax, 2, 4, 2, 5, 9, 8);
            check(RowNormaliser::Softmax, 1, 4, 1, 1, 70, 16);
        }

        #[test]
        fn every_normaliser_equals_composed_attention_with_its_gradients() {
            // ties at a sparse support's boundary, where the two could disagree, have probability 0
            for norm in normalisers() {
                check(norm, 2, 3, 3, 10, 10, 8);
                check(norm, 1, 2, 2, 2 * QUERY_BLOCK + 22, 2 * QUERY_BLOCK + 22, 4);
                check(norm, 2, 4, 2, 5, 9, 8);
                check(norm, 1, 4, 1, 1, 70, 16);
            }
        }

        /// The packed op against the same computation from Burn's ops: split, scale, attend.
        fn check_packed(norm: RowNormaliser, h: usize, h_kv: usize, len: usize, offset: usize) {
            let device = Device::flex().autodiff();
            device.seed(12);
            let (b, dh, scale) = (2, 8, 0.35);
            let width = (h + 2 * h_kv) * dh;
            let qkv: Tensor<3> = Tensor::random([b, len, width], Distribution::Normal(0.0, 1.5), &device);
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let x = qkv.clone().require_grad();
                let y = if fused {
                    causal_self_attention(x.clone(), h, h_kv, scale, offset, norm).expect("flex has the kernel")
                } else {
                    let all = x.clone().reshape([b, len, h + 2 * h_kv, dh]).swap_dims(1, 2);
                    let q = all.clone().narrow(1, 0, h).mul_scalar(scale);
                    let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                    composed(q, k, v, offset, norm)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).unwrap())
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let tol = tolerance(norm);
            let d = rel_diff(y1, y2);
            assert!(d < tol, "forward, {norm:?}, h {h}/{h_kv}, L {len}: {d}");
            let d = rel_diff(g1, g2);
            assert!(d < tol, "d qkv, {norm:?}, h {h}/{h_kv}, L {len}: {d}");
        }

        #[test]
        fn packed_self_attention_equals_composed_attention() {
            check_packed(RowNormaliser::Softmax, 3, 3, 10, 0);
            check_packed(RowNormaliser::Softmax, 4, 2, QUERY_BLOCK + 9, 0);
            check_packed(RowNormaliser::Softmax, 2, 1, 6, 3);
        }

        /// Per-position products on the packed op and on the separate one (q split and scaled)
        /// against Burn's ops: scores scale · q kᵀ + a bᵀ (a, b shared by the batch rows), output
        /// and the gradients of the projection, a and b.
        fn check_products(norm: RowNormaliser, h: usize, h_kv: usize, len: usize, offset: usize) {
            let device = Device::flex().autodiff();
            device.seed(21);
            let (b, dh, d2, scale) = (2, 8, 5, 0.35);
            let (width, g) = ((h + 2 * h_kv) * dh, h / h_kv);
            let qkv: Tensor<3> = Tensor::random([b, len, width], Distribution::Normal(0.0, 1.5), &device);
            let pa: Tensor<3> = Tensor::random([h, len, d2], Distribution::Normal(0.0, 1.0), &device);
            let pb: Tensor<3> = Tensor::random([h, len, d2], Distribution::Normal(0.0, 1.0), &device);
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            #[derive(PartialEq)]
            enum Path {
                Packed,
                Separate,
                Composed,
            }
            let run = |path: Path| {
                let (x, a, bb) = (qkv.clone().require_grad(), pa.clone().require_grad(), pb.clone().require_grad());
                let all = x.clone().reshape([b, len, h + 2 * h_kv, dh]).swap_dims(1, 2);
                let q = all.clone().narrow(1, 0, h).mul_scalar(scale);
                let y = if path == Path::Packed {
                    causal_self_attention_with_products(x.clone(), a.clone(), bb.clone(), h, h_kv, scale, offset, norm)
                        .expect("flex has the kernel")
                } else if path == Path::Separate {
                    let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                    causal_attention_with_products((q, k, v), (a.clone(), bb.clone()), offset, norm)
                        .expect("flex has the kernel")
                } else {
                    let group =
                        |t: Tensor<4>| t.unsqueeze_dim::<5>(2).expand([b, h_kv, g, len, dh]).reshape([b, h, len, dh]);
                    let (k, v) = (group(all.clone().narrow(1, h, h_kv)), group(all.narrow(1, h + h_kv, h_kv)));
                    let products = a.clone().matmul(bb.clone().swap_dims(1, 2)).unsqueeze_dim::<4>(0);
                    let scores = q.matmul(k.swap_dims(2, 3)) + products;
                    let hidden =
                        Tensor::<2, Bool>::tril_mask([len, len], offset as i64, &device).reshape([1, 1, len, len]);
                    let probs = normalise_scores(scores.mask_fill(hidden, -1.0e9), norm);
                    probs.matmul(v).swap_dims(1, 2).reshape([b, len, h * dh])
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, [x.grad(&grads).unwrap(), a.grad(&grads).unwrap(), bb.grad(&grads).unwrap()])
            };
            let tol = tolerance(norm);
            let (want, want_grads) = run(Path::Composed);
            for path in [Path::Packed, Path::Separate] {
                let op = if path == Path::Packed { "packed" } else { "separate" };
                let (got, grads) = run(path);
                let d = rel_diff(got, want.clone());
                assert!(d < tol, "{op} forward, {norm:?}, h {h}/{h_kv}, L {len}: {d}");
                for (name, (g, w)) in ["qkv", "a", "b"].iter().zip(grads.into_iter().zip(want_grads.clone())) {
                    let d = rel_diff(g, w);
                    assert!(d < tol, "{op} d {name}, {norm:?}, h {h}/{h_kv}, L {len}: {d}");
                }
            }
        }

        /// Vectors that do not fit the call's heads or length are refused before any GEMM reads
        /// them through a pointer.
        #[test]
        #[should_panic(expected = "position products")]
        fn position_products_of_the_wrong_shape_are_refused() {
            let device = Device::flex();
            let (h, len, dh) = (2, 6, 4);
            let qkv = Tensor::<3>::zeros([1, len, 3 * h * dh], &device);
            let a = Tensor::<3>::zeros([h, len - 1, 3], &device);
            let b = Tensor::<3>::zeros([h, len, 3], &device);
            let _ = causal_self_attention_with_products(qkv, a, b, h, h, 1.0, 0, RowNormaliser::Softmax);
        }

        #[test]
        fn position_products_equal_composed_attention() {
            check_products(RowNormaliser::Softmax, 3, 3, 10, 0);
            check_products(RowNormaliser::Softmax, 4, 2, QUERY_BLOCK + 9, 0);
            check_products(RowNormaliser::Softmax, 2, 1, 6, 3);
            for norm in normalisers() {
                check_products(norm, 2, 2, 12, 0);
            }
        }

        #[test]
        fn every_normaliser_packed_equals_composed_attention() {
            for norm in normalisers() {
                check_packed(norm, 3, 3, 10, 0);
                check_packed(norm, 4, 2, QUERY_BLOCK + 9, 0);
                check_packed(norm, 2, 1, 6, 3);
            }
        }

        #[test]
        fn inference_backend_takes_the_same_kernel() {
            let device = Device::flex();
            device.seed(3);
            let [q, k, v] = views(2, 2, 1, 7, 7, 8, &device);
            for norm in [RowNormaliser::Softmax].into_iter().chain(normalisers()) {
                let fused = causal_attention(q.clone(), k.clone(), v.clone(), 0, norm).unwrap();
                let d = max_diff(fused, composed(q.clone(), k.clone(), v.clone(), 0, norm));
                assert!(d < tolerance(norm), "{norm:?}: {d}");
            }
        }

        #[test]
        fn no_query_sees_a_later_key() {
            let device = Device::flex();
            device.seed(4);
            let [q, k, v] = views(1, 2, 2, 12, 12, 8, &device);
            let a = causal_attention(q.clone(), k.clone(), v.clone(), 0, RowNormaliser::Softmax).unwrap();
            let later = Tensor::random([1, 2, 4, 8], Distribution::Normal(0.0, 1.0), &device);
            let (k2, v2) = (
                k.slice_assign([0..1, 0..2, 8..12, 0..8], later.clone()),
                v.slice_assign([0..1, 0..2, 8..12, 0..8], later),
            );
            let b = causal_attention(q, k2, v2, 0, RowNormaliser::Softmax).unwrap();
            let (first, rest) = (a.clone().narrow(1, 0, 8), b.clone().narrow(1, 0, 8));
            assert!(max_diff(first, rest) < 1e-6, "rows 0..8 must not see keys 8..12");
            assert!(max_diff(a.narrow(1, 8, 4), b.narrow(1, 8, 4)) > 1e-3, "rows 8.. must see them");
        }
    }
}
