//! Softmax attention by blocks of queries, forward and backward, for the backends without a fused
//! kernel (wgpu, CUDA: Burn's cubecl backends): the FlashAttention-2 scheme (Dao 2023) at the
//! granularity of Burn's own ops, so no `[b, h, L, L]` tensor is ever formed or kept.
//!
//! For each block of `n` queries, with the keys it can see (all of them, or the causal prefix):
//!
//! S = Q_b Kᵀ + M,  ℓ_b = log Σ_j exp S_bj,  O_b = exp(S − ℓ_b) V,
//!
//! and only O and ℓ are kept for the backward, which recomputes each block's probabilities:
//!
//! P = exp(S − ℓ),  D = rowsum(dO ∘ O),  dV += Pᵀ dO_b,  dS = P ∘ (dO_b Vᵀ − D),
//! dQ_b = dS K,  dK += dSᵀ Q_b.
//!
//! Composed, autodiff keeps the probabilities of every layer (`[b, h, L, L]`: 4 GiB for 4 heads
//! at 16k, more than wgpu allocates in one buffer); here the largest tensor is one block's scores,
//! `[b, h, n, L]`, freed before the next block, and what is kept is the output and one number per
//! row. Each block is a handful of large matrix products, which is what a GPU runs well; causal
//! blocks score only the keys up to their last query (half the work of the full square).
//!
//! Queries come scaled (`scale · q`, `[b, h, L_q, d_h]`); keys and values have `h_kv` heads
//! (`h_kv` divides `h`; grouped-query heads read their group's keys in place). With `causal`,
//! query i sees keys j ≤ i + `offset`. It reaches Burn through the `backend_extension` mechanism
//! (`QueryBlocked` for `Cube`, `Flex`, and `Autodiff` of either with the backward above); the ops
//! themselves are Burn's, so one source serves every backend. [`attention`] returns `None` on a
//! backend that was not compiled in, and the caller composes the ops instead.

use burn::prelude::*;

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many calls of [`attention`] this thread has run blocked (tests check a layer took it).
pub fn calls() -> usize {
    CALLS.get()
}

/// The elements of one block's scores the engine aims for, `b · h · n · L_k`: 32 Mi floats
/// (128 MiB), a few of which live at once in the backward (one layer at 32k took 689 MiB of an
/// H200's memory, docs/gpu.md). At 32k on an H200 its 256-row blocks were too small to keep the
/// GPU busy (5.8× the 16k time); a budget scaled to the device's memory is not written yet.
pub const SCORE_BUDGET: usize = 1 << 25;

thread_local! {
    static BUDGET: std::cell::Cell<usize> = const { std::cell::Cell::new(SCORE_BUDGET) };
}

/// Runs `f` with the score budget set to `elements` on this thread ([`block_rows`]): tests
/// send short sequences down the blocked path.
pub fn with_score_budget<R>(elements: usize, f: impl FnOnce() -> R) -> R {
    /// Restores the budget, also when `f` panics.
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            BUDGET.set(self.0);
        }
    }
    let _restore = Restore(BUDGET.replace(elements.max(1)));
    f()
}

/// Where the blocked path runs: a float tensor on a backend this crate was built for (flex with
/// the `flex` feature, the cubecl backends with `wgpu` or `cuda`), kernels not turned off
/// ([`crate::without_kernels`]).
pub fn available<const D: usize>(t: &Tensor<D>) -> bool {
    if crate::KERNELS_OFF.get() || !t.dtype().is_float() {
        return false;
    }
    #[allow(unused_variables)]
    let device = t.device().inner();
    #[cfg(feature = "flex")]
    if device == Device::flex() {
        return true;
    }
    #[cfg(cube_backend)]
    if matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_)) {
        return true;
    }
    false
}

/// The query rows per block that keep one block's scores within the budget (32 Mi elements,
/// [`SCORE_BUDGET`]; at least 16 rows), where the whole `[b, h, L_q, L_k]` would exceed it;
/// `None` where it fits (the composed path keeps it, with no recomputation).
pub fn block_rows(batch: usize, heads: usize, len_q: usize, len_k: usize) -> Option<usize> {
    let row = batch * heads * len_k;
    let budget = BUDGET.get();
    (row.saturating_mul(len_q) > budget).then(|| (budget / row.max(1)).max(16))
}

/// softmax(q kᵀ + causal mask) v, `[b, h, L_q, d_h]`, computed `block` query rows at a time with
/// the backward above; `None` where [`available`] says no (the caller composes the ops).
pub fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    causal: bool,
    offset: usize,
    block: usize,
) -> Option<Tensor<4>> {
    let ([b, h, _, dh], [bk, hkv, _, dhk]) = (q.dims(), k.dims());
    assert!(
        bk == b && dhk == dh && v.dims() == k.dims(),
        "q {:?}, k {:?}, v {:?} do not fit",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert!(hkv > 0 && h % hkv == 0, "{h} query heads cannot share {hkv} key/value heads");
    assert!(block > 0, "a block has at least one query");
    #[cfg(any(feature = "flex", cube_backend))]
    if available(&q) && available(&k) && available(&v) {
        CALLS.set(CALLS.get() + 1);
        let blocking = Blocking { causal, offset, block };
        let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
        let out = burn::backend::Dispatch::query_blocked_attention(q, k, v, blocking);
        return Some(Tensor::from_dispatch(out));
    }
    let _ = (q, k, v, causal, offset, block);
    None
}

/// The call's constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// Query i sees keys j ≤ i + `offset` only.
    pub causal: bool,
    /// Where the first query sits after the first key (causal).
    pub offset: usize,
    /// Query rows per block.
    pub block: usize,
}

#[cfg(any(feature = "flex", cube_backend))]
impl Blocking {
    /// Each block's query rows and the keys they see, `(i0, i1, key_end)`.
    fn blocks(self, lq: usize, lk: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        (0..lq).step_by(self.block).map(move |i0| {
            let i1 = (i0 + self.block).min(lq);
            let key_end = if self.causal { (i1 + self.offset).min(lk) } else { lk };
            (i0, i1, key_end)
        })
    }
}

/// The computation in Burn's ops on tensors without autodiff, for any backend: what the
/// extension's implementations call on their primitives.
#[cfg(any(feature = "flex", cube_backend))]
mod blocks {
    use super::Blocking;
    use burn::prelude::*;

    /// Queries grouped by the key/value head they read: `[b, h_kv, g, L, d_h]`.
    pub fn grouped(q: Tensor<4>, hkv: usize) -> Tensor<5> {
        let [b, h, l, dh] = q.dims();
        q.reshape([b, hkv, h / hkv, l, dh])
    }

    /// One block's scaled scores `[b, h_kv, g, n, key_end]` with the causal mask added.
    fn scores(q: &Tensor<5>, k: &Tensor<4>, (i0, i1, key_end): (usize, usize, usize), c: Blocking) -> Tensor<5> {
        let [b, hkv, g, _, dh] = q.dims();
        let n = i1 - i0;
        let qb = q.clone().slice_dim(3, i0..i1).reshape([b, hkv, g * n, dh]);
        let kt = k.clone().slice_dim(2, 0..key_end).swap_dims(2, 3);
        let s = qb.matmul(kt).reshape([b, hkv, g, n, key_end]);
        // keys past the block's first query's reach are hidden from some of its rows
        if !c.causal || i0 + c.offset + 1 >= key_end {
            return s;
        }
        let device = s.device();
        let keys = Tensor::<1, Int>::arange(0..key_end as i64, &device).reshape([1, key_end]).expand([n, key_end]);
        let reach = Tensor::<1, Int>::arange((i0 + c.offset) as i64..(i1 + c.offset) as i64, &device);
        let hidden = keys.greater(reach.reshape([n, 1]).expand([n, key_end]));
        let mask = Tensor::<2>::zeros([n, key_end], &device).mask_fill(hidden, f32::NEG_INFINITY);
        s + mask.reshape([1, 1, 1, n, key_end])
    }

    /// The output `[b, h, L_q, d_h]` and each row's log-sum-exp `[b, h_kv, g, L_q, 1]`.
    pub fn forward(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, c: Blocking) -> (Tensor<4>, Tensor<5>) {
        let [b, h, lq, dh] = q.dims();
        let [_, hkv, lk, _] = k.dims();
        let q = grouped(q, hkv);
        let g = h / hkv;
        let (mut outs, mut lses) = (Vec::new(), Vec::new());
        for (i0, i1, key_end) in c.blocks(lq, lk) {
            let n = i1 - i0;
            let s = scores(&q, &k, (i0, i1, key_end), c);
            let max = s.clone().max_dim(4);
            let p = (s - max.clone()).exp();
            let sum = p.clone().sum_dim(4);
            let vb = v.clone().slice_dim(2, 0..key_end);
            let o = p.reshape([b, hkv, g * n, key_end]).matmul(vb).reshape([b, hkv, g, n, dh]);
            outs.push(o / sum.clone());
            lses.push(max + sum.log());
        }
        (Tensor::cat(outs, 3).reshape([b, h, lq, dh]), Tensor::cat(lses, 3))
    }

    /// The gradients of q, k and v from the output's `grad`.
    pub fn backward(
        (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
        out: Tensor<4>,
        lse: Tensor<5>,
        grad: Tensor<4>,
        c: Blocking,
    ) -> [Tensor<4>; 3] {
        let [b, h, lq, dh] = q.dims();
        let [_, hkv, lk, _] = k.dims();
        let g = h / hkv;
        let q = grouped(q, hkv);
        let grad = grouped(grad, hkv);
        let d = (grad.clone() * grouped(out, hkv)).sum_dim(4);
        let device = q.device();
        let mut dk = Tensor::<4>::zeros([b, hkv, lk, dh], &device);
        let mut dv = Tensor::<4>::zeros([b, hkv, lk, dh], &device);
        let mut dqs = Vec::new();
        for (i0, i1, key_end) in c.blocks(lq, lk) {
            let n = i1 - i0;
            let rows = |t: &Tensor<5>| t.clone().slice_dim(3, i0..i1);
            let p = (scores(&q, &k, (i0, i1, key_end), c) - rows(&lse)).exp();
            let go = rows(&grad).reshape([b, hkv, g * n, dh]);
            let (kb, vb) = (k.clone().slice_dim(2, 0..key_end), v.clone().slice_dim(2, 0..key_end));
            let keys = [0..b, 0..hkv, 0..key_end, 0..dh];
            let p2 = p.clone().reshape([b, hkv, g * n, key_end]);
            dv = dv.clone().slice_assign(keys.clone(), dv.slice(keys.clone()) + p2.swap_dims(2, 3).matmul(go.clone()));
            let dp = go.matmul(vb.swap_dims(2, 3)).reshape([b, hkv, g, n, key_end]);
            let ds = (p * (dp - rows(&d))).reshape([b, hkv, g * n, key_end]);
            dqs.push(ds.clone().matmul(kb).reshape([b, hkv, g, n, dh]));
            let qb = rows(&q).reshape([b, hkv, g * n, dh]);
            dk = dk.clone().slice_assign(keys.clone(), dk.slice(keys) + ds.swap_dims(2, 3).matmul(qb));
        }
        [Tensor::cat(dqs, 3).reshape([b, h, lq, dh]), dk, dv]
    }
}

#[cfg(any(feature = "flex", cube_backend))]
pub use extension::QueryBlocked;

/// The extension: the blocks above on each backend's primitives, and autodiff's backward.
#[cfg(any(feature = "flex", cube_backend))]
mod extension {
    use super::{Blocking, blocks};
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, BackendTensor, DispatchKindConversion, DispatchTensor, backend_extension};
    use burn::prelude::*;

    /// Softmax attention by query blocks, for the backends that have it.
    #[backend_extension(Cube, Flex, Autodiff)]
    pub trait QueryBlocked: Backend {
        /// softmax(q kᵀ + causal mask) v by blocks of queries ([`super::attention`]).
        fn query_blocked_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            blocking: Blocking,
        ) -> FloatTensor<Self>;
    }

    /// A backend's primitive as a tensor without autodiff, on which Burn's ops run.
    fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<D>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        Tensor::from_dispatch(<DispatchTensor as DispatchKindConversion<B>>::from_backend(BackendTensor::Float(t)))
    }

    /// The primitive back from such a tensor.
    fn primitive<B: Backend, const D: usize>(t: Tensor<D>) -> FloatTensor<B>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        let t = <DispatchTensor as DispatchKindConversion<B>>::try_into_backend(t.into_dispatch());
        t.expect("a tensor made on this backend comes back from it").float()
    }

    /// The forward on one backend's primitives: the output and the rows' log-sum-exp.
    fn forward<B: Backend>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        c: Blocking,
    ) -> (FloatTensor<B>, FloatTensor<B>)
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        let (out, lse) = blocks::forward(tensor(q), tensor(k), tensor(v), c);
        (primitive(out), primitive(lse))
    }

    /// The forward alone on each backend the crate was built for (no autodiff: nothing kept).
    macro_rules! forward_on {
        ($($cfg:meta => $backend:ty),*) => {$(
            #[$cfg]
            impl QueryBlocked for $backend {
                fn query_blocked_attention(
                    q: FloatTensor<Self>,
                    k: FloatTensor<Self>,
                    v: FloatTensor<Self>,
                    c: Blocking,
                ) -> FloatTensor<Self> {
                    forward::<Self>(q, k, v, c).0
                }
            }
        )*};
    }
    forward_on!(cfg(feature = "flex") => burn::backend::Flex, cfg(cube_backend) => burn::backend::Cube);

    #[derive(Debug)]
    struct QueryBlockedBackward;

    /// What the backward needs: the inputs (checkpointed), the output and the rows' log-sum-exp.
    #[derive(Debug, Clone)]
    struct Saved<B: Backend> {
        inputs: [NodeId; 3],
        out: FloatTensor<B>,
        lse: FloatTensor<B>,
        blocking: Blocking,
    }

    impl<B: Backend> Backward<B, 3> for QueryBlockedBackward
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        type State = Saved<B>;

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = tensor::<B, 4>(grads.consume::<B>(&ops.node));
            let s = ops.state;
            let [q, k, v] = s.inputs.map(|n| tensor::<B, 4>(checkpointer.retrieve_node_output::<FloatTensor<B>>(n)));
            let (out, lse) = (tensor::<B, 4>(s.out), tensor::<B, 5>(s.lse));
            let computed = blocks::backward((q, k, v), out, lse, grad, s.blocking);
            for (parent, g) in ops.parents.into_iter().zip(computed) {
                if let Some(node) = parent {
                    grads.register::<B>(node.id, primitive(g));
                }
            }
        }
    }

    impl<B: Backend, C: CheckpointStrategy> QueryBlocked for Autodiff<B, C>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        fn query_blocked_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            c: Blocking,
        ) -> FloatTensor<Self> {
            let (out, lse) = forward::<B>(q.primitive().clone(), k.primitive().clone(), v.primitive().clone(), c);
            match QueryBlockedBackward.prepare::<C>([q.node(), k.node(), v.node()]).compute_bound().stateful() {
                OpsKind::Tracked(mut prep) => {
                    let inputs = [&q, &k, &v].map(|t| prep.checkpoint(t));
                    prep.finish(Saved { inputs, out: out.clone(), lse, blocking: c }, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use crate::test_util::max_diff;
    use burn::tensor::Distribution;

    /// softmax(q kᵀ + mask) v by Burn's ops, the whole score matrix at once.
    fn composed(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, causal: bool, offset: usize) -> Tensor<4> {
        let ([b, h, lq, dh], hkv, lk) = (q.dims(), k.dims()[1], k.dims()[2]);
        let g = h / hkv;
        let (k, v) = if g == 1 {
            (k, v)
        } else {
            let spread = |t: Tensor<4>| t.unsqueeze_dim::<5>(2).expand([b, hkv, g, lk, dh]).reshape([b, h, lk, dh]);
            (spread(k), spread(v))
        };
        let mut s = q.matmul(k.swap_dims(2, 3));
        if causal {
            let device = s.device();
            let keys = Tensor::<1, Int>::arange(0..lk as i64, &device).reshape([1, lk]).expand([lq, lk]);
            let reach = Tensor::<1, Int>::arange(offset as i64..(lq + offset) as i64, &device).reshape([lq, 1]);
            let hidden = keys.greater(reach.expand([lq, lk]));
            s = s.mask_fill(hidden.reshape([1, 1, lq, lk]).expand([b, h, lq, lk]), -1.0e9);
        }
        burn::tensor::activation::softmax(s, 3).matmul(v)
    }

    /// Outputs and the gradients of q, k and v (through a loss weighting every output) of both.
    fn check(h: usize, hkv: usize, lq: usize, lk: usize, causal: bool, offset: usize, block: usize) {
        let device = Device::flex().autodiff();
        device.seed(7);
        let dh = 8;
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([2, h, lq, dh], normal, &device);
        let k = Tensor::<4>::random([2, hkv, lk, dh], normal, &device);
        let v = Tensor::<4>::random([2, hkv, lk, dh], normal, &device);
        let w = Tensor::<4>::random([2, h, lq, dh], normal, &device);
        let run = |blocked: bool| {
            let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
            let before = calls();
            let out = if blocked {
                attention(q.clone(), k.clone(), v.clone(), causal, offset, block).expect("flex has the blocked path")
            } else {
                composed(q.clone(), k.clone(), v.clone(), causal, offset)
            };
            assert_eq!(calls() - before, usize::from(blocked));
            let grads = (out.clone() * w.clone()).sum().backward();
            let g = |t: &Tensor<4>| t.grad(&grads).expect("a gradient reaches every input");
            [out.without_autodiff(), g(&q), g(&k), g(&v)]
        };
        let (blocked, reference) = (run(true), run(false));
        for (name, (a, b)) in ["output", "dq", "dk", "dv"].iter().zip(blocked.into_iter().zip(reference)) {
            let d = max_diff(a, b);
            assert!(d < 2e-5, "{name}: {d} (h {h}/{hkv}, {lq}×{lk}, causal {causal}, offset {offset}, block {block})");
        }
    }

    #[test]
    fn causal_blocks_equal_the_composed_attention_and_its_gradients() {
        // blocks that divide the length, a short last block, one block, one row per block
        check(2, 2, 24, 24, true, 0, 8);
        check(2, 2, 23, 23, true, 0, 5);
        check(2, 2, 23, 23, true, 0, 64);
        check(2, 2, 9, 9, true, 0, 1);
    }

    #[test]
    fn bidirectional_and_offset_blocks_equal_the_composed_attention() {
        check(2, 2, 21, 21, false, 0, 4);
        // queries after a prefix of keys (a prefill after a cache), and cross-attention lengths
        check(2, 2, 7, 19, true, 12, 3);
        check(2, 2, 7, 19, false, 0, 3);
    }

    #[test]
    fn grouped_query_heads_read_their_groups_keys() {
        check(4, 2, 19, 19, true, 0, 6);
        check(6, 1, 10, 10, false, 0, 4);
    }

    #[test]
    fn no_autodiff_gives_the_output_alone() {
        let device = Device::flex();
        device.seed(1);
        let normal = Distribution::Normal(0.0, 1.0);
        let [q, k, v] = [0; 3].map(|_| Tensor::<4>::random([1, 2, 13, 4], normal, &device));
        let blocked = attention(q.clone(), k.clone(), v.clone(), true, 0, 4).unwrap();
        assert!(max_diff(blocked, composed(q, k, v, true, 0)) < 1e-5);
    }

    #[test]
    fn turned_off_it_hands_the_call_back() {
        let q = Tensor::<4>::zeros([1, 1, 4, 2], &Device::flex());
        assert!(crate::without_kernels(|| attention(q.clone(), q.clone(), q.clone(), true, 0, 2)).is_none());
        assert_eq!(block_rows(1, 4, 16384, 16384), Some(512));
        assert_eq!(block_rows(64, 64, 1 << 20, 1 << 20), Some(16));
        assert_eq!(block_rows(1, 4, 1024, 1024), None);
        assert_eq!(with_score_budget(100, || block_rows(1, 2, 10, 10)), Some(16));
    }
}
