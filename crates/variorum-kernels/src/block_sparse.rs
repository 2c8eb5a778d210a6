//! Block-sparse attention as one CPU kernel, forward and backward, on the flex backend: the fused
//! causal kernel ([`crate::causal_attention`]) generalised from "the keys up to the diagonal" to
//! any pattern given as a [`SparseLayout`]:
//!
//! O_i = Σ_{j ∈ A(i)} norm_j(q_i·k_j + b_h(i − j)) v_j,
//!
//! where A(i), the keys query i sees, lies inside the key runs of i's block of queries. Each block
//! of [`SparseLayout::block`] queries scores only its runs — contiguous ranges of keys, read in
//! place as strided views, one GEMM per run — so a pattern costs O(Σ_blocks B · |runs| · d) and
//! keeps a block × |runs| scratch, never L × L. Inside the runs a bit per (query, key) keeps the
//! exact pattern. The backward is the causal kernel's (FlashAttention's): the probabilities are
//! recomputed from the saved log-sum-exp (or the sparse normalisers' threshold τ), nothing per
//! pair is stored.
//!
//! b_h is an optional table of one additive score per head and query − key distance (ALiBi, T5's
//! buckets: the relative schemes that act through the distance alone), with its gradient; RoPE
//! acts on q and k before. Queries must come scaled. The output has its heads merged,
//! `[b, Lq, h · d_h]`.
//!
//! The sparse kinds (sliding-window, local, BigBird, Longformer, the fixed and blockwise patterns)
//! hand their patterns here through `variorum_attention::band::sparse`; [`block_sparse_attention`]
//! returns `None` off flex, and the caller composes Burn's ops instead.

use std::ops::Range;
use std::sync::Arc;

use crate::normalisers::RowNormaliser;
use burn::prelude::*;

/// Which keys each block of queries scores (runs of consecutive keys) and, inside those, which
/// keys each query sees. Query row r stands at position r + (len_k − len_q) (the queries are the
/// last of the keys' positions, as in a cache); key slot j at position j.
#[derive(Debug, Clone)]
pub struct SparseLayout {
    len_q: usize,
    len_k: usize,
    block: usize,
    groups: usize,
    /// `runs[runs_at[c]..runs_at[c + 1]]` are cell c's runs, c = group · blocks + block.
    runs_at: Vec<usize>,
    runs: Vec<(u32, u32)>,
    /// Cell c's width (keys scored per row), and where its rows' bits start.
    width: Vec<usize>,
    bits_at: Vec<usize>,
    /// Row r of cell c: `bits[bits_at[c] + r · ⌈width/64⌉ ..]`, bit s set when the row sees the
    /// run slot s.
    bits: Vec<u64>,
    seen: usize,
}

impl SparseLayout {
    /// The layout of `len_q` queries over `len_k` keys in blocks of `block` queries, one pattern
    /// for every head (`groups` = 1) or one per head (`groups` = heads): `runs(g, i)` lists the
    /// key ranges block i scores for group g (merged and clipped here); `visible(g, q, out)` pushes
    /// the key ranges query position q sees (in any order, overlapping or not; the parts outside
    /// its block's runs are not scored).
    pub fn new(
        len_q: usize,
        len_k: usize,
        block: usize,
        groups: usize,
        runs: impl Fn(usize, usize) -> Vec<Range<usize>> + Sync,
        visible: impl Fn(usize, usize, &mut Vec<Range<usize>>) + Sync,
    ) -> Self {
        assert!(block > 0 && groups > 0 && len_q <= len_k, "a sparse layout needs blocks, groups and len_q ≤ len_k");
        let blocks = len_q.div_ceil(block);
        let offset = len_k - len_q;
        // one cell (group, query block): its merged runs, its rows' bits, the pairs it sees
        let cell = |c: usize| -> (Vec<Range<usize>>, Vec<u64>, usize) {
            let (g, i) = (c / blocks, c % blocks);
            let mut listed: Vec<Range<usize>> =
                runs(g, i).into_iter().map(|r| r.start..r.end.min(len_k)).filter(|r| !r.is_empty()).collect();
            listed.sort_unstable_by_key(|r| r.start);
            let mut merged: Vec<Range<usize>> = Vec::with_capacity(listed.len());
            for r in listed {
                match merged.last_mut() {
                    Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                    _ => merged.push(r),
                }
            }
            // each run's first column
            let columns: Vec<usize> = merged
                .iter()
                .scan(0, |col, r| {
                    let at = *col;
                    *col += r.len();
                    Some(at)
                })
                .collect();
            let width: usize = merged.iter().map(|r| r.len()).sum();
            let words = width.div_ceil(64);
            let rows = block.min(len_q - i * block);
            let mut bits = vec![0u64; rows * words];
            let mut ranges = Vec::new();
            for (r, row) in bits.chunks_exact_mut(words.max(1)).take(rows).enumerate() {
                ranges.clear();
                visible(g, offset + i * block + r, &mut ranges);
                for seen in &ranges {
                    // the runs it overlaps: from the last one starting at or before it
                    let first = merged.partition_point(|run| run.end <= seen.start);
                    for (run, &col) in merged[first..].iter().zip(&columns[first..]) {
                        if run.start >= seen.end {
                            break;
                        }
                        let (a, b) = (seen.start.max(run.start), seen.end.min(run.end));
                        set_bits(row, col + a - run.start, col + b - run.start);
                    }
                }
            }
            let seen = bits.iter().map(|w| w.count_ones() as usize).sum();
            (merged, bits, seen)
        };
        #[cfg(feature = "flex")]
        let cells: Vec<_> = {
            use rayon::prelude::*;
            (0..groups * blocks).into_par_iter().map(cell).collect()
        };
        #[cfg(not(feature = "flex"))]
        let cells: Vec<_> = (0..groups * blocks).map(cell).collect();
        let mut layout = Self {
            len_q,
            len_k,
            block,
            groups,
            runs_at: vec![0],
            runs: Vec::new(),
            width: Vec::new(),
            bits_at: Vec::new(),
            bits: Vec::new(),
            seen: 0,
        };
        for (merged, bits, seen) in cells {
            layout.bits_at.push(layout.bits.len());
            layout.bits.extend(bits);
            layout.width.push(merged.iter().map(|r| r.len()).sum());
            layout.runs.extend(merged.iter().map(|r| (r.start as u32, r.end as u32)));
            layout.runs_at.push(layout.runs.len());
            layout.seen += seen;
        }
        layout
    }

    /// Queries per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Query blocks.
    pub fn blocks(&self) -> usize {
        self.len_q.div_ceil(self.block)
    }

    /// 1 (one pattern for every head) or the number of heads.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// (queries, keys).
    pub fn lens(&self) -> (usize, usize) {
        (self.len_q, self.len_k)
    }

    /// (query, key) pairs scored, over every group: the work of the kernel.
    pub fn scored(&self) -> usize {
        (0..self.groups * self.blocks())
            .map(|c| self.width[c] * self.block.min(self.len_q - (c % self.blocks()) * self.block))
            .sum()
    }

    /// (query, key) pairs seen, over every group.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Entries of a distance bias table: one per query − key distance, −(len_k − 1) …
    /// len_k − 1 (the table's index is distance + len_k − 1).
    pub fn bias_width(&self) -> usize {
        2 * self.len_k - 1
    }

    #[cfg(feature = "flex")]
    fn cell(&self, group: usize, block: usize) -> usize {
        group * self.blocks() + block
    }

    #[cfg(feature = "flex")]
    fn runs(&self, c: usize) -> &[(u32, u32)] {
        &self.runs[self.runs_at[c]..self.runs_at[c + 1]]
    }

    #[cfg(feature = "flex")]
    fn row_bits(&self, c: usize, r: usize) -> &[u64] {
        let words = self.width[c].div_ceil(64);
        &self.bits[self.bits_at[c] + r * words..][..words]
    }

    #[cfg(feature = "flex")]
    fn max_width(&self) -> usize {
        self.width.iter().copied().max().unwrap_or(0)
    }
}

/// Sets bits `a..b` of `row`.
fn set_bits(row: &mut [u64], a: usize, b: usize) {
    let mut s = a;
    while s < b {
        let (w, bit) = (s / 64, s % 64);
        let n = (64 - bit).min(b - s);
        let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << bit };
        row[w] |= mask;
        s += n;
    }
}

/// `norm`(q kᵀ + bias) v over the pattern of `layout`, heads merged, `[b, Lq, h · d_h]`, by the
/// block-sparse kernel: `q: [b, h, Lq, d_h]` (scaled), `k`, `v: [b, h_kv, Lk, d_h]`, `bias`
/// `[h, 2 Lk − 1]` by query − key distance ([`SparseLayout::bias_width`]). `None` on a backend or
/// float type without the kernel.
pub fn block_sparse_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Option<Tensor<2>>,
    layout: Arc<SparseLayout>,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&q)
        && crate::has_kernel(&k)
        && crate::has_kernel(&v)
        && bias.as_ref().is_none_or(crate::has_kernel)
    {
        let [_, h, lq, _] = q.dims();
        let lk = k.dims()[2];
        assert_eq!(layout.lens(), (lq, lk), "the sparse layout was built for other lengths");
        assert!(layout.groups == 1 || layout.groups == h, "a sparse layout has one pattern or one per head");
        use burn::backend::Dispatch;
        let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
        let d = match bias {
            Some(bias) => {
                assert_eq!(bias.dims(), [h, layout.bias_width()], "the distance bias is [heads, 2 Lk − 1]");
                Dispatch::block_sparse_biased(q, k, v, bias.into_dispatch(), SparsePiece::only(layout), norm)
            }
            None => Dispatch::block_sparse(q, k, v, SparsePiece::only(layout), norm),
        };
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, bias, layout, norm);
    None
}

/// [`block_sparse_attention`] straight from a fused projection's output `qkv: [b, L, (h + 2 h_kv)
/// · d_h]` (queries, keys, values side by side, unscaled; scores `scale · q kᵀ`), as the fused
/// causal kernel takes it: the gradient comes back in the projection's layout, so no head split
/// or scaling is recorded, forward or backward. `None` off flex.
pub fn block_sparse_self_attention(
    qkv: Tensor<3>,
    (n_heads, n_kv_heads): (usize, usize),
    scale: f64,
    bias: Option<Tensor<2>>,
    layout: Arc<SparseLayout>,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) && bias.as_ref().is_none_or(crate::has_kernel) {
        let [_, l, width] = qkv.dims();
        assert_eq!(width % (n_heads + 2 * n_kv_heads), 0, "the projection is not (h + 2 h_kv) heads wide");
        assert_eq!(layout.lens(), (l, l), "the sparse layout was built for another length");
        assert!(layout.groups == 1 || layout.groups == n_heads, "a sparse layout has one pattern or one per head");
        use burn::backend::Dispatch;
        let (qkv, heads) = (qkv.into_dispatch(), PackedHeads { n_heads, n_kv_heads, scale });
        let d = match bias {
            Some(bias) => {
                assert_eq!(bias.dims(), [n_heads, layout.bias_width()], "the distance bias is [heads, 2 L − 1]");
                Dispatch::block_sparse_packed_biased(qkv, bias.into_dispatch(), heads, SparsePiece::only(layout), norm)
            }
            None => Dispatch::block_sparse_packed(qkv, heads, SparsePiece::only(layout), norm),
        };
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (qkv, n_heads, n_kv_heads, scale, bias, layout, norm);
    None
}

/// One layout of a union ([`block_sparse_union`]): slot s of its layout stands for position
/// `order[s]` ([`PADDING`]: a zero row, seen by nothing); without an order, slot s is position s.
#[derive(Debug, Clone)]
pub struct SparsePiece {
    pub layout: Arc<SparseLayout>,
    pub order: Option<Vec<u32>>,
}

/// A slot of a [`SparsePiece`]'s order that stands for no position.
pub const PADDING: u32 = u32::MAX;

/// The layouts of one call.
pub type Pieces = Arc<Vec<SparsePiece>>;

impl SparsePiece {
    /// One layout over the positions in order: the whole pattern.
    pub fn only(layout: Arc<SparseLayout>) -> Pieces {
        Arc::new(vec![Self { layout, order: None }])
    }
}

/// Softmax attention over the union of several patterns, each over its own ordering of the
/// positions: where no one ordering makes every query's keys a few runs (the Sparse Transformer's
/// strided pattern is a band in position order and a band inside each residue class), each piece
/// is scored block by block in its own order, and the pieces' results are merged by their
/// log-sum-exps, ℓ = log Σ_p e^{ℓ_p}, O = Σ_p e^{ℓ_p − ℓ} O_p — one softmax over the union. The
/// backward recomputes each piece's probabilities against the merged ℓ. The pieces must not share
/// a (query, key) pair; self-attention over L positions, no bias. Inputs as for
/// [`block_sparse_attention`] (`None` with a packed projection: see
/// [`block_sparse_union_self_attention`]).
pub fn block_sparse_union(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, pieces: Pieces) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&q) && crate::has_kernel(&k) && crate::has_kernel(&v) {
        let [_, h, l, _] = q.dims();
        check_pieces(&pieces, h, l);
        use burn::backend::Dispatch;
        let d = Dispatch::block_sparse(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            pieces,
            RowNormaliser::Softmax,
        );
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, pieces);
    None
}

/// [`block_sparse_union`] straight from a fused projection's output, as
/// [`block_sparse_self_attention`] takes it.
pub fn block_sparse_union_self_attention(
    qkv: Tensor<3>,
    (n_heads, n_kv_heads): (usize, usize),
    scale: f64,
    pieces: Pieces,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) {
        check_pieces(&pieces, n_heads, qkv.dims()[1]);
        use burn::backend::Dispatch;
        let heads = PackedHeads { n_heads, n_kv_heads, scale };
        let d = Dispatch::block_sparse_packed(qkv.into_dispatch(), heads, pieces, RowNormaliser::Softmax);
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (qkv, n_heads, n_kv_heads, scale, pieces);
    None
}

/// Every piece covers L positions with one pattern or one per head.
#[cfg(feature = "flex")]
fn check_pieces(pieces: &[SparsePiece], h: usize, l: usize) {
    assert!(!pieces.is_empty(), "a union of no patterns");
    for piece in pieces {
        let (lq, lk) = piece.layout.lens();
        assert!(lq == lk, "a union's pieces are self-attention");
        match &piece.order {
            Some(order) => assert!(order.len() == lq, "a piece's order lists one position per slot"),
            None => assert!(lq == l, "a piece in position order covers the L positions"),
        }
        assert!(
            piece.layout.groups == 1 || piece.layout.groups == h,
            "a sparse layout has one pattern or one per head"
        );
    }
}

/// The head counts and score scale of a packed projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackedHeads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub scale: f64,
}

#[cfg(feature = "flex")]
pub use flex::*;

#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::causal_attention::flex::{
        Dest, Heads, Shared, gemm, normalise_rows, normaliser_gradients, packed_views, readable, readable_packed,
        recompute_rows, score_gradients,
    };
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;

    /// A hidden pair's score before the normaliser (as the composed path masks); its weight is
    /// then set to exactly 0.
    const HIDDEN: f32 = -1.0e9;

    /// Block-sparse attention of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait BlockSparseAttention: Backend {
        /// [`block_sparse_attention`] without a bias.
        fn block_sparse(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`block_sparse_attention`] with a distance bias `[h, 2 Lk − 1]`.
        fn block_sparse_biased(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`block_sparse_self_attention`] without a bias.
        fn block_sparse_packed(
            qkv: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`block_sparse_self_attention`] with a distance bias `[h, 2 L − 1]`.
        fn block_sparse_packed_biased(
            qkv: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;
    }

    /// How the inputs arrive: q, k, v as `[b, heads, L, d_h]` tensors (q scaled), or one packed
    /// projection.
    #[derive(Debug, Clone, Copy)]
    enum Inputs {
        Separate,
        Packed(PackedHeads),
    }

    /// The shapes of one call.
    struct Shape {
        b: usize,
        h: usize,
        h_kv: usize,
        lq: usize,
        dh: usize,
    }

    impl Shape {
        fn of(q: &Heads, k: &Heads, v: &Heads) -> Self {
            let [b, h, lq, dh] = q.dims;
            let h_kv = k.dims[1];
            assert!(h_kv > 0 && h % h_kv == 0, "query heads {h} are not a multiple of key/value heads {h_kv}");
            assert_eq!(k.dims, v.dims, "keys and values differ in shape");
            Self { b, h, h_kv, lq, dh }
        }

        fn out_rs(&self) -> isize {
            (self.h * self.dh) as isize
        }
    }

    /// One block's scores against its runs into `s` (rows × width), the bias added and the
    /// hidden pairs at [`HIDDEN`].
    #[allow(clippy::too_many_arguments)]
    fn block_scores(
        layout: &SparseLayout,
        c: usize,
        (q0, rows): (usize, usize),
        (qb, qrc): (*const f32, (isize, isize)),
        (kp, krc): (*const f32, (isize, isize)),
        (dh, scale): (usize, f32),
        bias: Option<&[f32]>,
        s: &mut [f32],
    ) {
        let width = layout.width[c];
        let mut col = 0;
        for &(k0, k1) in layout.runs(c) {
            let (k0, n) = (k0 as usize, (k1 - k0) as usize);
            let kr = kp.wrapping_offset(k0 as isize * krc.0);
            // SAFETY: rows q0.. of the query head and keys k0..k1 lie inside their tensors; the
            // destination is columns col..col + n of `s`'s rows
            unsafe {
                gemm((rows, n, dh), s.as_mut_ptr().add(col), width as isize, false, qb, qrc, kr, (krc.1, krc.0), scale)
            };
            col += n;
        }
        let offset = layout.len_k - layout.len_q;
        for (r, row) in s.chunks_exact_mut(width).enumerate() {
            let bits = layout.row_bits(c, r);
            if let Some(bias) = bias {
                // distance q − k + Lk − 1: the run's entries of the table, backwards
                let at = offset + q0 + r + layout.len_k - 1;
                let mut col = 0;
                for &(k0, k1) in layout.runs(c) {
                    for (x, kk) in row[col..].iter_mut().zip(k0 as usize..k1 as usize) {
                        *x += bias[at - kk];
                    }
                    col += (k1 - k0) as usize;
                }
            }
            for_hidden(bits, row, |x| *x = HIDDEN);
        }
    }

    /// `f` on each entry of `row` whose bit is clear (whole words of visible keys skipped).
    #[inline]
    fn for_hidden(bits: &[u64], row: &mut [f32], f: impl Fn(&mut f32)) {
        for (w, &word) in bits.iter().enumerate() {
            if word != u64::MAX {
                for (s, x) in row[w * 64..].iter_mut().take(64).enumerate() {
                    if word >> s & 1 == 0 {
                        f(x);
                    }
                }
            }
        }
    }

    /// The weights of the hidden pairs to exactly 0.
    fn clear_hidden(layout: &SparseLayout, c: usize, p: &mut [f32]) {
        let width = layout.width[c];
        for (r, row) in p.chunks_exact_mut(width).enumerate() {
            for_hidden(layout.row_bits(c, r), row, |x| *x = 0.0);
        }
    }

    /// The cell (group's pattern, query block) of head `hi`.
    fn cell(layout: &SparseLayout, hi: usize, block: usize) -> usize {
        layout.cell(if layout.groups == 1 { 0 } else { hi }, block)
    }

    /// Forward over views: the output `[b, Lq, h · d_h]` and each row's saved slot `[b, h, Lq]`.
    fn forward_views(
        [q, k, v]: [&Heads; 3],
        scale: f32,
        bias: Option<&[f32]>,
        layout: &SparseLayout,
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let sh = Shape::of(q, k, v);
        let (g, dh, bs) = (sh.h / sh.h_kv, sh.dh, layout.block);
        let n_out = sh.b * sh.lq * sh.h * dh;
        // rows that see no key are written as zeros; every other element by a GEMM below
        let mut out: Vec<f32> = Vec::with_capacity(n_out);
        let mut lse = vec![0.0f32; sh.b * sh.h * sh.lq];
        let (out_ptr, lse_ptr) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
        let width_bias = layout.bias_width();
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (k.head(bi, kv), v.head(bi, kv));
            let mut s = vec![0.0f32; bs * layout.max_width()];
            let mut scratch: Vec<f32> = Vec::with_capacity(if norm.needs_threshold() { layout.max_width() } else { 0 });
            for hi in kv * g..(kv + 1) * g {
                let qp = q.head(bi, hi);
                let bias_h = bias.map(|t| &t[hi * width_bias..(hi + 1) * width_bias]);
                for blk in 0..layout.blocks() {
                    let (q0, c) = (blk * bs, cell(layout, hi, blk));
                    let (rows, width) = (bs.min(sh.lq - q0), layout.width[c]);
                    let o = out_ptr.at((bi * sh.lq + q0) * sh.h * dh + hi * dh);
                    if width == 0 {
                        for r in 0..rows {
                            // SAFETY: row q0 + r, columns of head hi, and its lse: this task's
                            unsafe {
                                std::ptr::write_bytes(o.add(r * sh.h * dh), 0, dh);
                                *lse_ptr.at((bi * sh.h + hi) * sh.lq + q0 + r) = f32::NEG_INFINITY;
                            }
                        }
                        continue;
                    }
                    let s = &mut s[..rows * width];
                    let qb = qp.wrapping_offset(q0 as isize * q.rs());
                    block_scores(
                        layout,
                        c,
                        (q0, rows),
                        (qb, (q.rs(), q.cs())),
                        (kp, (k.rs(), k.cs())),
                        (dh, scale),
                        bias_h,
                        s,
                    );
                    // SAFETY: rows (bi, hi, q0..q0 + rows) of lse belong to this task
                    let l = unsafe { std::slice::from_raw_parts_mut(lse_ptr.at((bi * sh.h + hi) * sh.lq + q0), rows) };
                    normalise_rows(norm, s, width, |_| width, l, &mut scratch);
                    clear_hidden(layout, c, s);
                    let mut col = 0;
                    for &(k0, k1) in layout.runs(c) {
                        let n = (k1 - k0) as usize;
                        let vr = vp.wrapping_offset(k0 as isize * v.rs());
                        // SAFETY: rows q0..q0 + rows, columns of head hi: this task's; values k0..k1
                        unsafe {
                            gemm(
                                (rows, dh, n),
                                o,
                                sh.out_rs(),
                                col > 0,
                                s.as_ptr().add(col),
                                (width as isize, 1),
                                vr,
                                (v.rs(), v.cs()),
                                1.0,
                            )
                        };
                        col += n;
                    }
                }
            }
        });
        // SAFETY: each task wrote the rows of its (batch, key/value head) for every query block
        unsafe { out.set_len(n_out) };
        let lse = FlexTensor::from_data(TensorData::new(lse, [sh.b, sh.h, sh.lq]));
        (FlexTensor::from_data(TensorData::new(out, [sh.b, sh.lq, sh.h * dh])), lse)
    }

    /// Backward over views into `dq`, `dk`, `dv` (zeroed; accumulated into); the bias gradient
    /// `[h, 2 Lk − 1]` where there is a bias.
    #[allow(clippy::too_many_arguments)]
    fn backward_views(
        [qh, kh, vh]: [&Heads; 3],
        scale: f32,
        bias: Option<&[f32]>,
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        layout: &SparseLayout,
        norm: RowNormaliser,
        [dq, dk, dv]: [Dest; 3],
    ) -> Option<Vec<f32>> {
        let sh = Shape::of(qh, kh, vh);
        let (g, dh, bs) = (sh.h / sh.h_kv, sh.dh, layout.block);
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        let (o, dout) = (out.storage::<f32>(), grad.storage::<f32>());
        let out_rs = sh.out_rs();
        let width_bias = layout.bias_width();
        let offset = layout.len_k - layout.len_q;
        let (qrc, krc, vrc) = ((qh.rs(), qh.cs()), (kh.rs(), kh.cs()), (vh.rs(), vh.cs()));
        let per_task: Vec<Vec<f32>> = (0..sh.b * sh.h_kv)
            .into_par_iter()
            .map(|task| {
                let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
                let (kp, vp) = (kh.head(bi, kv), vh.head(bi, kv));
                let (dkp, dvp) = (dk.head(bi, kv), dv.head(bi, kv));
                let mut p = vec![0.0f32; bs * layout.max_width()];
                let mut ds = vec![0.0f32; bs * layout.max_width()];
                let mut dbias = vec![0.0f32; if bias.is_some() { g * width_bias } else { 0 }];
                for hi in kv * g..(kv + 1) * g {
                    let qp = qh.head(bi, hi);
                    let bias_h = bias.map(|t| &t[hi * width_bias..(hi + 1) * width_bias]);
                    for blk in 0..layout.blocks() {
                        let (q0, c) = (blk * bs, cell(layout, hi, blk));
                        let (rows, width) = (bs.min(sh.lq - q0), layout.width[c]);
                        if width == 0 {
                            continue;
                        }
                        let (p, ds) = (&mut p[..rows * width], &mut ds[..rows * width]);
                        let qb = qp.wrapping_offset(q0 as isize * qh.rs());
                        let first = (bi * sh.lq + q0) * sh.h * dh + hi * dh;
                        let dob = dout[first..].as_ptr();
                        block_scores(layout, c, (q0, rows), (qb, qrc), (kp, krc), (dh, scale), bias_h, p);
                        recompute_rows(norm, p, width, |_| width, &lse[(bi * sh.h + hi) * sh.lq + q0..]);
                        clear_hidden(layout, c, p);
                        let pt = (1, width as isize);
                        // SAFETY (every gemm below): query rows q0.. of head hi and keys of the
                        // cell's runs lie inside their tensors; the dk/dv rows written are this
                        // task's key/value head, the dq rows this task's query head
                        let mut col = 0;
                        for &(k0, k1) in layout.runs(c) {
                            let (k0, n) = (k0 as usize, (k1 - k0) as usize);
                            let vr = vp.wrapping_offset(k0 as isize * vh.rs());
                            let dvr = dvp.wrapping_add(k0 * dv.strides[2]);
                            // dV += Pᵀ dO
                            unsafe {
                                gemm((n, dh, rows), dvr, dv.rs(), true, p.as_ptr().add(col), pt, dob, (out_rs, 1), 1.0)
                            };
                            // dP = dO Vᵀ
                            unsafe {
                                gemm(
                                    (rows, n, dh),
                                    ds.as_mut_ptr().add(col),
                                    width as isize,
                                    false,
                                    dob,
                                    (out_rs, 1),
                                    vr,
                                    (vrc.1, vrc.0),
                                    1.0,
                                )
                            };
                            col += n;
                        }
                        match norm {
                            RowNormaliser::Softmax => {
                                score_gradients(ds, p, width, dout, o, first, out_rs as usize, dh)
                            }
                            _ => normaliser_gradients(norm, ds, p, width, |_| width),
                        }
                        if bias.is_some() {
                            let db = &mut dbias[(hi - kv * g) * width_bias..][..width_bias];
                            for (r, row) in ds.chunks_exact(width).enumerate() {
                                let at = offset + q0 + r + layout.len_k - 1;
                                let mut col = 0;
                                for &(k0, k1) in layout.runs(c) {
                                    for (&x, kk) in row[col..].iter().zip(k0 as usize..k1 as usize) {
                                        db[at - kk] += x;
                                    }
                                    col += (k1 - k0) as usize;
                                }
                            }
                        }
                        let dqb = dq.head(bi, hi).wrapping_add(q0 * dq.strides[2]);
                        let mut col = 0;
                        for &(k0, k1) in layout.runs(c) {
                            let (k0, n) = (k0 as usize, (k1 - k0) as usize);
                            let kr = kp.wrapping_offset(k0 as isize * kh.rs());
                            let dkr = dkp.wrapping_add(k0 * dk.strides[2]);
                            let dsb = unsafe { ds.as_ptr().add(col) };
                            // dQ += scale · dS K
                            unsafe {
                                gemm((rows, dh, n), dqb, dq.rs(), true, dsb, (width as isize, 1), kr, krc, scale)
                            };
                            // dK += scale · dSᵀ Q
                            unsafe { gemm((n, dh, rows), dkr, dk.rs(), true, dsb, pt, qb, qrc, scale) };
                            col += n;
                        }
                    }
                }
                dbias
            })
            .collect();
        bias?;
        let mut total = vec![0.0f32; sh.h * width_bias];
        for (task, part) in per_task.iter().enumerate() {
            let kv = task % sh.h_kv;
            let head_rows = &mut total[kv * g * width_bias..(kv + 1) * g * width_bias];
            head_rows.iter_mut().zip(part).for_each(|(t, &x)| *t += x);
        }
        Some(total)
    }

    /// `pieces` over views: one piece in position order is [`forward_views`]; a union is each
    /// piece in its order, merged by log-sum-exp (softmax, no bias).
    fn attend(
        views: [&Heads; 3],
        scale: f32,
        bias: Option<&[f32]>,
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        if let [piece] = pieces
            && piece.order.is_none()
        {
            return forward_views(views, scale, bias, &piece.layout, norm);
        }
        assert!(bias.is_none() && norm == RowNormaliser::Softmax, "a union of patterns is softmax without a bias");
        let [b, h, l, dh] = views[0].dims;
        let width = h * dh;
        let mut out = vec![0.0f32; b * l * width];
        let mut lse = vec![f32::NEG_INFINITY; b * h * l];
        for piece in pieces {
            let (part, part_lse) = match &piece.order {
                None => forward_views(views, scale, None, &piece.layout, norm),
                Some(order) => {
                    let gathered = views.map(|x| gather_rows(x, order));
                    let dims = |x: &Heads| [x.dims[0], x.dims[1], order.len(), x.dims[3]];
                    let [q, k, v] = [0, 1, 2].map(|i| Heads::contiguous(&gathered[i], dims(views[i])));
                    forward_views([&q, &k, &v], scale, None, &piece.layout, norm)
                }
            };
            let (part, part_lse) = (part.storage::<f32>(), part_lse.storage::<f32>());
            let n = piece.layout.len_q;
            for bi in 0..b {
                for slot in 0..n {
                    let Some(pos) = position(&piece.order, slot) else { continue };
                    for hi in 0..h {
                        let (at, at_part) = ((bi * h + hi) * l + pos, (bi * h + hi) * n + slot);
                        let (was, new) = (lse[at], part_lse[at_part]);
                        let m = was.max(new);
                        if m == f32::NEG_INFINITY {
                            continue;
                        }
                        let (ea, eb) = ((was - m).exp(), (new - m).exp());
                        let total = ea + eb;
                        let (wa, wb) = (ea / total, eb / total);
                        let row = &mut out[(bi * l + pos) * width + hi * dh..][..dh];
                        let row_part = &part[(bi * n + slot) * width + hi * dh..][..dh];
                        row.iter_mut().zip(row_part).for_each(|(o, &x)| *o = wa * *o + wb * x);
                        lse[at] = m + total.ln();
                    }
                }
            }
        }
        let out = FlexTensor::from_data(TensorData::new(out, [b, l, width]));
        (out, FlexTensor::from_data(TensorData::new(lse, [b, h, l])))
    }

    /// The position slot `slot` of a piece stands for (`None`: padding).
    fn position(order: &Option<Vec<u32>>, slot: usize) -> Option<usize> {
        match order {
            None => Some(slot),
            Some(order) => (order[slot] != PADDING).then_some(order[slot] as usize),
        }
    }

    /// Rows of `x: [b, heads, L, d_h]` in `order`, contiguous `[b, heads, order.len(), d_h]`
    /// (zeros for padding).
    fn gather_rows(x: &Heads, order: &[u32]) -> Vec<f32> {
        let [b, h, _, dh] = x.dims;
        let mut out = vec![0.0f32; b * h * order.len() * dh];
        for bi in 0..b {
            for hi in 0..h {
                let head = x.head(bi, hi);
                for (slot, &pos) in order.iter().enumerate().filter(|(_, p)| **p != PADDING) {
                    let dst = &mut out[((bi * h + hi) * order.len() + slot) * dh..][..dh];
                    for (d, y) in dst.iter_mut().enumerate() {
                        // SAFETY: (bi, hi, pos, d) lies inside the viewed tensor
                        *y = unsafe { *head.offset(pos as isize * x.rs() + d as isize * x.cs()) };
                    }
                }
            }
        }
        out
    }

    /// Rows `[b, L, w]` of a position-order tensor in a piece's slot order (zeros for padding).
    fn rows_in_order(x: &[f32], (b, l, w): (usize, usize, usize), order: &[u32]) -> Vec<f32> {
        let mut out = vec![0.0f32; b * order.len() * w];
        for bi in 0..b {
            for (slot, &pos) in order.iter().enumerate().filter(|(_, p)| **p != PADDING) {
                out[(bi * order.len() + slot) * w..][..w].copy_from_slice(&x[(bi * l + pos as usize) * w..][..w]);
            }
        }
        out
    }

    /// The backward of [`attend`] into `dests` (zeroed; accumulated into); the bias gradient for
    /// one piece with a bias.
    fn attend_backward(
        views: [&Heads; 3],
        scale: f32,
        bias: Option<&[f32]>,
        (out, lse, grad): (&FlexTensor, &[f32], &FlexTensor),
        pieces: &[SparsePiece],
        norm: RowNormaliser,
        dests: [Dest; 3],
    ) -> Option<Vec<f32>> {
        if let [piece] = pieces
            && piece.order.is_none()
        {
            return backward_views(views, scale, bias, out, lse, grad, &piece.layout, norm, dests);
        }
        let [b, h, l, dh] = views[0].dims;
        let width = h * dh;
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        for piece in pieces {
            let Some(order) = &piece.order else {
                backward_views(views, scale, None, &out, lse, &grad, &piece.layout, norm, dests);
                continue;
            };
            let n = order.len();
            let gathered = views.map(|x| gather_rows(x, order));
            let dims = |x: &Heads| [x.dims[0], x.dims[1], n, x.dims[3]];
            let [q, k, v] = [0, 1, 2].map(|i| Heads::contiguous(&gathered[i], dims(views[i])));
            let rows = |x: &FlexTensor| {
                let x = rows_in_order(x.storage::<f32>(), (b, l, width), order);
                FlexTensor::from_data(TensorData::new(x, [b, n, width]))
            };
            let (out_p, grad_p) = (rows(&out), rows(&grad));
            let lse_p = rows_in_order(lse, (b * h, l, 1), order);
            // each piece's gradients in its slot order, then added at their positions
            let mut parts = [0, 1, 2].map(|i| vec![0.0f32; gathered[i].len()]);
            let part_dests = [0, 1, 2].map(|i| {
                let [_, heads, _, _] = dims(views[i]);
                Dest { ptr: Shared(parts[i].as_mut_ptr()), strides: [heads * n * dh, n * dh, dh] }
            });
            backward_views([&q, &k, &v], scale, None, &out_p, &lse_p, &grad_p, &piece.layout, norm, part_dests);
            for ((part, dest), view) in parts.iter_mut().zip(dests).zip(views) {
                let heads = view.dims[1];
                for bi in 0..b {
                    for hi in 0..heads {
                        let to = dest.head(bi, hi);
                        for (slot, &pos) in order.iter().enumerate().filter(|(_, p)| **p != PADDING) {
                            let from = &part[((bi * heads + hi) * n + slot) * dh..][..dh];
                            for (d, &x) in from.iter().enumerate() {
                                // SAFETY: (bi, hi, pos, d) lies inside the destination
                                unsafe { *to.add(pos as usize * dest.strides[2] + d) += x };
                            }
                        }
                    }
                }
            }
        }
        None
    }

    /// The forward: the output `[b, L, h · d_h]` and each row's saved slot.
    fn forward_kernel(
        inputs: Inputs,
        tensors: &[&FlexTensor],
        bias: Option<&FlexTensor>,
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let bias = bias.map(|b| b.to_contiguous());
        let bias = bias.as_ref().map(|b| b.storage::<f32>());
        match inputs {
            Inputs::Separate => {
                let (q, k, v) = (readable(tensors[0]), readable(tensors[1]), readable(tensors[2]));
                attend([&Heads::of(&q), &Heads::of(&k), &Heads::of(&v)], 1.0, bias, pieces, norm)
            }
            Inputs::Packed(heads) => {
                let qkv = readable_packed(tensors[0]);
                let [q, k, v] = packed_views(&qkv, heads.n_heads, heads.n_kv_heads);
                attend([&q, &k, &v], heads.scale as f32, bias, pieces, norm)
            }
        }
    }

    /// The backward: the gradients of `tensors` (q, k, v, or the packed projection, contiguous,
    /// in their shapes) and of the bias where there is one.
    #[allow(clippy::too_many_arguments)]
    fn backward_kernel(
        inputs: Inputs,
        tensors: &[&FlexTensor],
        bias: Option<&FlexTensor>,
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (Vec<FlexTensor>, Option<FlexTensor>) {
        let bias = bias.map(|b| b.to_contiguous());
        let bias_data = bias.as_ref().map(|b| b.storage::<f32>());
        let data = |x: Vec<f32>, dims: &[usize]| FlexTensor::from_data(TensorData::new(x, dims.to_vec()));
        let (grads, dbias) = match inputs {
            Inputs::Separate => {
                let (q, k, v) = (readable(tensors[0]), readable(tensors[1]), readable(tensors[2]));
                let (qh, kh, vh) = (Heads::of(&q), Heads::of(&k), Heads::of(&v));
                let ([b, h, lq, dh], [_, h_kv, lk, _]) = (qh.dims, kh.dims);
                let mut dq = vec![0.0f32; b * h * lq * dh];
                let mut dk = vec![0.0f32; b * h_kv * lk * dh];
                let mut dv = vec![0.0f32; b * h_kv * lk * dh];
                let dest = |ptr: *mut f32, heads: usize, len: usize| Dest {
                    ptr: Shared(ptr),
                    strides: [heads * len * dh, len * dh, dh],
                };
                let dests =
                    [dest(dq.as_mut_ptr(), h, lq), dest(dk.as_mut_ptr(), h_kv, lk), dest(dv.as_mut_ptr(), h_kv, lk)];
                let views = [&qh, &kh, &vh];
                let dbias = attend_backward(views, 1.0, bias_data, (out, lse, grad), pieces, norm, dests);
                (vec![data(dq, &qh.dims), data(dk, &kh.dims), data(dv, &vh.dims)], dbias)
            }
            Inputs::Packed(heads) => {
                let qkv = readable_packed(tensors[0]);
                let [q, k, v] = packed_views(&qkv, heads.n_heads, heads.n_kv_heads);
                let [b, _, len, dh] = q.dims;
                let width = (heads.n_heads + 2 * heads.n_kv_heads) * dh;
                let mut d = vec![0.0f32; b * len * width];
                let base = d.as_mut_ptr();
                let dest = |first: usize| Dest {
                    ptr: Shared(base.wrapping_add(first * dh)),
                    strides: [len * width, dh, width],
                };
                let dests = [dest(0), dest(heads.n_heads), dest(heads.n_heads + heads.n_kv_heads)];
                let scale = heads.scale as f32;
                let dbias = attend_backward([&q, &k, &v], scale, bias_data, (out, lse, grad), pieces, norm, dests);
                (vec![data(d, &[b, len, width])], dbias)
            }
        };
        let h = layout_heads(inputs, tensors);
        (grads, dbias.map(|d| data(d, &[h, pieces[0].layout.bias_width()])))
    }

    /// The number of query heads of a call.
    fn layout_heads(inputs: Inputs, tensors: &[&FlexTensor]) -> usize {
        match inputs {
            Inputs::Separate => tensors[0].layout().shape()[1],
            Inputs::Packed(heads) => heads.n_heads,
        }
    }

    impl BlockSparseAttention for Flex {
        fn block_sparse(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(Inputs::Separate, &[&q, &k, &v], None, &pieces, norm).0
        }

        fn block_sparse_biased(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            bias: FlexTensor,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(Inputs::Separate, &[&q, &k, &v], Some(&bias), &pieces, norm).0
        }

        fn block_sparse_packed(qkv: FlexTensor, heads: PackedHeads, pieces: Pieces, norm: RowNormaliser) -> FlexTensor {
            forward_kernel(Inputs::Packed(heads), &[&qkv], None, &pieces, norm).0
        }

        fn block_sparse_packed_biased(
            qkv: FlexTensor,
            bias: FlexTensor,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(Inputs::Packed(heads), &[&qkv], Some(&bias), &pieces, norm).0
        }
    }

    /// The backward of every op: N parents, the inputs (q, k, v or the packed projection) then the
    /// bias where there is one.
    #[derive(Debug)]
    struct SparseBackward<const N: usize>;

    /// The inputs (checkpointed), the output, each row's log-sum-exp or threshold, the layout.
    #[derive(Debug, Clone)]
    struct Saved {
        inputs: Inputs,
        nodes: Vec<NodeId>,
        biased: bool,
        out: FlexTensor,
        lse: FlexTensor,
        pieces: Pieces,
        norm: RowNormaliser,
    }

    impl<const N: usize> Backward<Flex, N> for SparseBackward<N> {
        type State = Saved;

        fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let s = ops.state;
            let mut saved: Vec<FlexTensor> = s.nodes.iter().map(|&id| checkpointer.retrieve_node_output(id)).collect();
            let bias = if s.biased { saved.pop() } else { None };
            let tensors: Vec<&FlexTensor> = saved.iter().collect();
            let lse = s.lse.storage::<f32>();
            let (computed, dbias) =
                backward_kernel(s.inputs, &tensors, bias.as_ref(), &s.out, lse, &grad, &s.pieces, s.norm);
            let mut computed = computed.into_iter().map(Some).chain(std::iter::once(dbias));
            let computed: [Option<FlexTensor>; N] = std::array::from_fn(|_| computed.next().flatten());
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), computed);
        }
    }

    /// Runs the forward and records the backward for the tracked inputs: `tensors` (q, k, v, or
    /// the projection) followed by the bias when `biased`.
    fn tracked<C: CheckpointStrategy, const N: usize>(
        inputs: Inputs,
        tensors: [FloatTensor<Autodiff<Flex, C>>; N],
        biased: bool,
        pieces: Pieces,
        norm: RowNormaliser,
    ) -> FloatTensor<Autodiff<Flex, C>> {
        let primitives: Vec<&FlexTensor> = tensors.iter().map(|t| t.primitive()).collect();
        let (main, bias) =
            if biased { (&primitives[..N - 1], primitives.last().copied()) } else { (&primitives[..], None) };
        let (out, lse) = forward_kernel(inputs, main, bias, &pieces, norm);
        let nodes = tensors.each_ref().map(|t| t.node());
        match SparseBackward::<N>.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let nodes: Vec<NodeId> = tensors.iter().map(|t| prep.checkpoint(t)).collect();
                prep.finish(Saved { inputs, nodes, biased, out: out.clone(), lse, pieces, norm }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    impl<C: CheckpointStrategy> BlockSparseAttention for Autodiff<Flex, C> {
        fn block_sparse(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            tracked::<C, 3>(Inputs::Separate, [q, k, v], false, pieces, norm)
        }

        fn block_sparse_biased(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            tracked::<C, 4>(Inputs::Separate, [q, k, v, bias], true, pieces, norm)
        }

        fn block_sparse_packed(
            qkv: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            tracked::<C, 1>(Inputs::Packed(heads), [qkv], false, pieces, norm)
        }

        fn block_sparse_packed_biased(
            qkv: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            tracked::<C, 2>(Inputs::Packed(heads), [qkv, bias], true, pieces, norm)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::normalisers::normalise_scores;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;

        /// The same attention from Burn's ops over the dense L × L matrix: `hidden[h][i][j]`
        /// masked, the bias gathered by distance.
        fn composed(
            q: Tensor<4>,
            k: Tensor<4>,
            v: Tensor<4>,
            bias: Option<Tensor<2>>,
            layout: &SparseLayout,
            norm: RowNormaliser,
        ) -> Tensor<3> {
            let offset = layout.len_k - layout.len_q;
            composed_with(q, k, v, bias, |hi, i, j| sees(layout, hi, i - offset, j), norm)
        }

        /// [`composed`] with the pattern as a predicate `seen(head, query position, key)`.
        fn composed_with(
            q: Tensor<4>,
            k: Tensor<4>,
            v: Tensor<4>,
            bias: Option<Tensor<2>>,
            seen: impl Fn(usize, usize, usize) -> bool,
            norm: RowNormaliser,
        ) -> Tensor<3> {
            let [b, h, lq, dh] = q.dims();
            let [_, h_kv, lk, _] = k.dims();
            let g = h / h_kv;
            let device = q.device();
            let mut scores = q.reshape([b, h_kv, g * lq, dh]).matmul(k.swap_dims(2, 3)).reshape([b, h, lq, lk]);
            let offset = lk - lq;
            if let Some(bias) = bias {
                let at: Vec<i64> =
                    (0..lq).flat_map(|i| (0..lk).map(move |j| (i + offset + lk - 1 - j) as i64)).collect();
                let at = Tensor::<1, Int>::from_data(TensorData::new(at, [lq * lk]), &device);
                scores = scores + bias.select(1, at).reshape([1, h, lq, lk]);
            }
            let hidden: Vec<bool> = (0..h)
                .flat_map(|hi| (0..lq).flat_map(move |i| (0..lk).map(move |j| (hi, i, j))))
                .map(|(hi, i, j)| !seen(hi, i + offset, j))
                .collect();
            let hidden = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [1, h, lq, lk]), &device);
            let probs = normalise_scores(scores.mask_fill(hidden.clone(), -1.0e9), norm);
            let probs = probs.mask_fill(hidden, 0.0).reshape([b, h_kv, g * lq, lk]);
            probs.matmul(v).reshape([b, h, lq, dh]).swap_dims(1, 2).reshape([b, lq, h * dh])
        }

        /// Whether row i of head hi sees key j in `layout` (read back from its runs and bits).
        fn sees(layout: &SparseLayout, hi: usize, i: usize, j: usize) -> bool {
            let c = cell(layout, hi, i / layout.block);
            let mut col = 0;
            for &(k0, k1) in layout.runs(c) {
                if (k0 as usize..k1 as usize).contains(&j) {
                    let s = col + j - k0 as usize;
                    return layout.row_bits(c, i % layout.block)[s / 64] >> (s % 64) & 1 == 1;
                }
                col += (k1 - k0) as usize;
            }
            false
        }

        fn normalisers() -> [RowNormaliser; 5] {
            [
                RowNormaliser::Softmax,
                RowNormaliser::Relu { scale: 1.0 / 16.0 },
                RowNormaliser::Sigmoid { bias: -(16.0f32).ln() },
                RowNormaliser::Sparsemax,
                RowNormaliser::Entmax15,
            ]
        }

        fn check(layout: SparseLayout, h: usize, h_kv: usize, with_bias: bool, norm: RowNormaliser) {
            let device = Device::flex().autodiff();
            device.seed(21);
            let (b, dh) = (2, 8);
            let (lq, lk) = layout.lens();
            let layout = Arc::new(layout);
            let all: Tensor<4> =
                Tensor::random([b, lk, h + 2 * h_kv, dh], Distribution::Normal(0.0, 1.5), &device).swap_dims(1, 2);
            let q = all.clone().narrow(1, 0, h).narrow(2, lk - lq, lq).mul_scalar(0.7);
            let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
            let bias: Tensor<2> = Tensor::random([h, layout.bias_width()], Distribution::Normal(0.0, 1.0), &device);
            let w: Tensor<3> = Tensor::random([b, lq, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let (q, k, v, bias) = (
                    q.clone().require_grad(),
                    k.clone().require_grad(),
                    v.clone().require_grad(),
                    bias.clone().require_grad(),
                );
                let bias_in = with_bias.then(|| bias.clone());
                let y = if fused {
                    block_sparse_attention(q.clone(), k.clone(), v.clone(), bias_in, layout.clone(), norm)
                        .expect("flex has the kernel")
                } else {
                    composed(q.clone(), k.clone(), v.clone(), bias_in, &layout, norm)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let mut g = vec![q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()];
                if with_bias {
                    g.push(bias.grad(&grads).unwrap().reshape([1, 1, h, layout.bias_width()]));
                }
                (y, g)
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let what = format!("{norm:?}, h {h}/{h_kv}, L {lq}/{lk}, bias {with_bias}");
            let tol = if norm == RowNormaliser::Softmax { 1e-5 } else { 1e-4 };
            let d = rel_diff(y1, y2);
            assert!(d < tol, "forward, {what}: {d}");
            for ((a, e), name) in g1.into_iter().zip(g2).zip(["dq", "dk", "dv", "dbias"]) {
                let d = rel_diff(a, e);
                assert!(d < tol, "{name}, {what}: {d}");
            }
        }

        /// The packed op against the same computation from Burn's ops: split, scale, attend.
        fn check_packed(layout: SparseLayout, h: usize, h_kv: usize, with_bias: bool, norm: RowNormaliser) {
            let device = Device::flex().autodiff();
            device.seed(22);
            let (b, dh, scale) = (2, 8, 0.35);
            let len = layout.lens().0;
            let layout = Arc::new(layout);
            let qkv: Tensor<3> = Tensor::random([b, len, (h + 2 * h_kv) * dh], Distribution::Normal(0.0, 1.5), &device);
            let bias: Tensor<2> = Tensor::random([h, layout.bias_width()], Distribution::Normal(0.0, 1.0), &device);
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let (x, bias) = (qkv.clone().require_grad(), bias.clone().require_grad());
                let bias_in = with_bias.then(|| bias.clone());
                let y = if fused {
                    block_sparse_self_attention(x.clone(), (h, h_kv), scale, bias_in, layout.clone(), norm)
                        .expect("flex has the kernel")
                } else {
                    let all = x.clone().reshape([b, len, h + 2 * h_kv, dh]).swap_dims(1, 2);
                    let q = all.clone().narrow(1, 0, h).mul_scalar(scale);
                    let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                    composed(q, k, v, bias_in, &layout, norm)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let db = with_bias.then(|| bias.grad(&grads).unwrap());
                (y, x.grad(&grads).unwrap(), db)
            };
            let ((y1, g1, b1), (y2, g2, b2)) = (run(true), run(false));
            let what = format!("packed, {norm:?}, h {h}/{h_kv}, L {len}, bias {with_bias}");
            let tol = if norm == RowNormaliser::Softmax { 1e-5 } else { 1e-4 };
            let d = rel_diff(y1, y2);
            assert!(d < tol, "forward, {what}: {d}");
            let d = rel_diff(g1, g2);
            assert!(d < tol, "d qkv, {what}: {d}");
            if let (Some(b1), Some(b2)) = (b1, b2) {
                let d = rel_diff(b1, b2);
                assert!(d < tol, "d bias, {what}: {d}");
            }
        }

        #[test]
        fn packed_projection_equals_dense_masked_attention() {
            for norm in normalisers() {
                check_packed(band(23, 4, 5), 3, 3, false, norm);
                check_packed(band(23, 4, 5), 4, 2, true, norm);
            }
        }

        /// The Sparse Transformer's strided pattern with stride `stride` over `len` positions as
        /// two pieces: the previous `stride` positions (position order), and every `stride`-th
        /// earlier one (inside each residue class, the classes laid end to end).
        fn strided_pieces(len: usize, stride: usize, block: usize) -> Pieces {
            let local = SparseLayout::new(
                len,
                len,
                block,
                1,
                |_, i| vec![(i * block).saturating_sub(stride - 1)..(i + 1) * block],
                |_, q, out| out.push(q.saturating_sub(stride - 1)..q + 1),
            );
            let n = len.div_ceil(stride);
            let order: Vec<u32> = (0..stride)
                .flat_map(|c| (0..n).map(move |i| i * stride + c))
                .map(|p| if p < len { p as u32 } else { PADDING })
                .collect();
            let slots = order.len();
            let columns = SparseLayout::new(
                slots,
                slots,
                block,
                1,
                |_, i| {
                    let (first, last) = (i * block, ((i + 1) * block).min(slots) - 1);
                    (first / n..=last / n).map(|c| c * n..(c + 1) * n).collect()
                },
                |_, slot, out| {
                    let (c, i) = (slot / n, slot % n);
                    if i * stride + c < len {
                        out.push(c * n..c * n + i);
                    }
                },
            );
            Arc::new(vec![
                SparsePiece { layout: Arc::new(local), order: None },
                SparsePiece { layout: Arc::new(columns), order: Some(order) },
            ])
        }

        fn check_union(len: usize, stride: usize, block: usize, (h, h_kv): (usize, usize), packed: bool) {
            let device = Device::flex().autodiff();
            device.seed(23);
            let (b, dh, scale) = (2, 8, 0.35);
            let pieces = strided_pieces(len, stride, block);
            let qkv: Tensor<3> = Tensor::random([b, len, (h + 2 * h_kv) * dh], Distribution::Normal(0.0, 1.5), &device);
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let strided = |_: usize, q: usize, k: usize| k <= q && (q - k < stride || (q - k) % stride == 0);
            let run = |fused: bool| {
                let x = qkv.clone().require_grad();
                let all = x.clone().reshape([b, len, h + 2 * h_kv, dh]).swap_dims(1, 2);
                let q = all.clone().narrow(1, 0, h).mul_scalar(scale);
                let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                let y = match (fused, packed) {
                    (true, true) => block_sparse_union_self_attention(x.clone(), (h, h_kv), scale, pieces.clone()),
                    (true, false) => block_sparse_union(q, k, v, pieces.clone()),
                    (false, _) => Some(composed_with(q, k, v, None, strided, RowNormaliser::Softmax)),
                }
                .expect("flex has the kernel");
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).unwrap())
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let what = format!("L {len}, stride {stride}, block {block}, h {h}/{h_kv}, packed {packed}");
            let d = rel_diff(y1, y2);
            assert!(d < 1e-5, "forward, {what}: {d}");
            let d = rel_diff(g1, g2);
            assert!(d < 1e-5, "d qkv, {what}: {d}");
        }

        #[test]
        fn a_union_of_orders_is_one_softmax_over_both_patterns() {
            // 23 positions in classes of 4 (the last class one short: padding), blocks across classes
            check_union(23, 4, 4, (2, 2), false);
            check_union(23, 4, 4, (4, 2), true);
            check_union(40, 8, 3, (2, 1), true);
        }

        /// A layout from a predicate `sees(g, q, k)`, one key at a time.
        fn from_predicate(
            (len_q, len_k, block, groups): (usize, usize, usize, usize),
            runs: impl Fn(usize, usize) -> Vec<Range<usize>> + Sync,
            sees: impl Fn(usize, usize, usize) -> bool + Sync,
        ) -> SparseLayout {
            SparseLayout::new(len_q, len_k, block, groups, runs, |g, q, out| {
                out.extend((0..len_k).filter(|&k| sees(g, q, k)).map(|k| k..k + 1))
            })
        }

        /// A causal band: each query sees itself and `back` keys before it.
        fn band(len: usize, block: usize, back: usize) -> SparseLayout {
            SparseLayout::new(
                len,
                len,
                block,
                1,
                |_, i| vec![(i * block).saturating_sub(back)..(i + 1) * block],
                |_, q, out| out.push(q.saturating_sub(back)..q + 1),
            )
        }

        #[test]
        fn a_band_equals_dense_masked_attention_with_its_gradients() {
            for norm in normalisers() {
                check(band(23, 4, 5), 3, 3, false, norm);
                check(band(23, 4, 5), 4, 2, true, norm);
            }
        }

        #[test]
        fn scattered_runs_per_head_and_global_keys() {
            // per head: a band, two "random" key blocks per query block, global keys 0 and 1,
            // and a global query at 9 that sees everything before it (BigBird's ingredients)
            let (len, bs) = (29, 4);
            let layout = from_predicate(
                (len, len, bs, 2),
                |g, i| {
                    let q0 = i * bs;
                    let mut runs =
                        vec![0..2, q0.saturating_sub(3)..q0 + bs, (7 * i + 4 * g) % len..(7 * i + 4 * g) % len + 3];
                    if (q0..q0 + bs).contains(&9) {
                        runs.push(0..len);
                    }
                    runs
                },
                |g, q, k| {
                    let random = (7 * (q / bs) + 4 * g) % len;
                    k <= q && (k < 2 || q - k <= 3 || q == 9 || (random..random + 3).contains(&k))
                },
            );
            for norm in normalisers() {
                check(layout.clone(), 2, 1, true, norm);
            }
        }

        #[test]
        fn queries_after_cached_keys_and_rows_that_see_nothing() {
            // 6 queries after 5 earlier keys, bidirectional band of 2; row 3 (position 8) sees nothing
            let layout = from_predicate(
                (6, 11, 4, 1),
                |_, i| vec![(5 + i * 4).saturating_sub(2)..5 + i * 4 + 6],
                |_, q, k| q != 8 && q.abs_diff(k) <= 2,
            );
            check(layout, 2, 2, true, RowNormaliser::Softmax);
        }

        #[test]
        fn the_layout_counts_its_work() {
            let l = band(256, 64, 63);
            assert_eq!(l.seen(), (0..256).map(|i: usize| i.min(63) + 1).sum::<usize>());
            // block 0 scores 64 keys, the others 127
            assert_eq!(l.scored(), 64 * 64 + 3 * 64 * 127);
            // ranges spilling past the runs keep only what the runs hold
            let l = SparseLayout::new(8, 8, 4, 1, |_, i| vec![i * 4..i * 4 + 2], |_, _, out| out.push(0..8));
            assert_eq!(l.seen(), 4 * 2 + 4 * 2);
        }

        #[test]
        fn bits_are_set_across_words() {
            let mut row = [0u64; 3];
            set_bits(&mut row, 60, 130);
            assert_eq!(row, [0xF << 60, u64::MAX, 0b11]);
            let mut row = [0u64; 1];
            set_bits(&mut row, 0, 64);
            set_bits(&mut row, 3, 3);
            assert_eq!(row, [u64::MAX]);
        }
    }
}
