//! Block-sparse attention as one CPU kernel, forward and backward, on the flex backend: the fused
//! causal kernel ([`crate::causal_attention`]) generalised from "the keys up to the diagonal" to
//! any pattern given as a [`SparseLayout`]:
//!
//! O_i = Σ_{j ∈ A(i)} norm_j(q_i·k_j + b_h(i − j)) v_j,
//!
//! where A(i), the keys query i sees, lies inside the key runs of i's block of queries. Each block
//! of the layout's queries scores only its runs — contiguous ranges of keys, read in
//! place as strided views, one GEMM per run — so a pattern costs O(Σ_blocks B · |runs| · d) and
//! keeps a block × |runs| scratch, never L × L. Inside the runs a bit per (query, key) keeps the
//! exact pattern. The backward is the causal kernel's (FlashAttention's): the probabilities are
//! recomputed from the saved log-sum-exp (or the sparse normalisers' threshold τ), nothing per
//! pair is stored.
//!
//! b_h is an optional table of one additive score per head and query − key distance (ALiBi, T5's
//! buckets: the relative schemes that act through the distance alone), with its gradient; RoPE
//! acts on q and k before. The schemes that read content by distance (Transformer-XL, Shaw,
//! DeBERTa, DA, multiplicative) hand [`DistanceTerms`] instead: per-head tables of vectors by
//! distance bucket, scored against a query-side vector or the keys, added to the values, or a
//! multiplier after an activation — each one GEMM per run against the buckets the run reaches
//! (`terms.rs`), with every gradient. Queries must come scaled. The output has its heads merged,
//! `[b, Lq, h · d_h]`.
//!
//! A pattern that no one ordering of the positions turns into runs (the Sparse Transformer's
//! strided pattern) is a union of layouts over different [`Slots`] — positions, or residue classes
//! read as strided views — merged by log-sum-exp into one softmax ([`block_sparse_union`]). A
//! pattern chosen by content (LSH's buckets, routing's clusters) is a band in a sorted order that
//! differs per head and batch row: a piece over a [`Permutation`], whose blocks gather their
//! queries, keys and values into scratch (one GEMM per block) and write their results back at
//! the positions.
//!
//! The sparse kinds (sliding-window, local, multi-scale, BigBird, Longformer, the fixed and
//! blockwise patterns, strided) hand their patterns here through `variorum_attention`'s
//! `sparse_kernel`, LSH and routing through its `sorted_kernel`; full attention (with a distance
//! scheme, or both ways), Poolingformer's pooled segments (fewer keys than queries) and
//! ProbSparse's active queries build their own layouts; Sinkhorn's blocks, whose sorted keys
//! are mixtures that exist nowhere in memory, have their own kernel ([`crate::sinkhorn`]). Every entry point returns `None` off flex, and the caller
//! composes Burn's ops instead.

use std::ops::Range;
use std::sync::Arc;

use crate::normalisers::RowNormaliser;
use burn::prelude::*;

#[cfg(feature = "flex")]
mod terms;

/// Which keys each block of queries scores (runs of consecutive keys) and, inside those, which
/// keys each query sees. Query row r stands at position r + (len_k − len_q) (the queries are the
/// last of the keys' positions, as in a cache); key slot j at position j. With fewer keys than
/// queries (keys that summarise the positions, as Poolingformer's pooled segments) row r is
/// position r and the key slots are the layout's own; no distance term then applies.
#[derive(Debug, Clone)]
pub struct SparseLayout {
    len_q: usize,
    len_k: usize,
    block: usize,
    groups: usize,
    /// `runs[runs_at[c]..runs_at[c + 1]]` are cell c's runs, c = group · blocks + block.
    runs_at: Vec<usize>,
    runs: Vec<(u32, u32)>,
    /// Cell c's width (keys scored per row), and where its rows' masks start.
    width: Vec<usize>,
    masks: Vec<CellMask>,
    /// Row r of a cell whose masks are bits at `at`: `bits[at + r · ⌈width/64⌉ ..]`, bit s set
    /// when the row sees the run slot s.
    bits: Vec<u64>,
    /// Row r of a cell whose masks are spans at `at`: `spans[at + r]`, the run slots the row sees.
    spans: Vec<(u32, u32)>,
    seen: usize,
}

/// Where a cell's rows' masks are: bits, or, where every row sees one contiguous stretch of the
/// cell's slots (a band, or a pattern that reaches every key), one span per row — 8 bytes a row
/// where bits take width / 8 (32 MiB at 16k positions for full attention both ways).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))] // only the kernel reads the masks
enum CellMask {
    Bits(usize),
    Spans(usize),
}

/// What one row of a cell sees ([`SparseLayout::row_mask`]).
#[cfg(feature = "flex")]
enum RowMask<'a> {
    Bits(&'a [u64]),
    Span(usize, usize),
}

impl SparseLayout {
    /// The layout of `len_q` queries over `len_k` keys in blocks of `block` queries, one pattern
    /// for every head (`groups` = 1) or one per head (`groups` = heads; a permuted piece may also
    /// have one per head and batch row): `runs(g, i)` lists the key ranges block i scores for
    /// group g (merged and clipped here); `visible(g, q, out)` pushes the key ranges query q sees
    /// (in any order, overlapping or not; the parts outside its block's runs are not scored).
    /// Queries and keys are positions, or the slots of the piece the layout belongs to.
    pub fn new(
        len_q: usize,
        len_k: usize,
        block: usize,
        groups: usize,
        runs: impl Fn(usize, usize) -> Vec<Range<usize>> + Sync,
        visible: impl Fn(usize, usize, &mut Vec<Range<usize>>) + Sync,
    ) -> Self {
        assert!(block > 0 && groups > 0, "a sparse layout needs blocks and groups");
        let blocks = len_q.div_ceil(block);
        let offset = len_k.saturating_sub(len_q);
        // one cell (group, query block): its merged runs, its rows' bits, the pairs it sees
        let cell = |c: usize| -> (Vec<Range<usize>>, Mask, usize) {
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
            let mask = match bits.chunks_exact(words.max(1)).take(rows).map(span_of).collect::<Option<Vec<_>>>() {
                Some(spans) if words > 1 => Mask::Spans(spans),
                _ => Mask::Bits(bits),
            };
            (merged, mask, seen)
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
            masks: Vec::new(),
            bits: Vec::new(),
            spans: Vec::new(),
            seen: 0,
        };
        for (merged, mask, seen) in cells {
            layout.masks.push(match mask {
                Mask::Bits(bits) => {
                    let at = layout.bits.len();
                    layout.bits.extend(bits);
                    CellMask::Bits(at)
                }
                Mask::Spans(spans) => {
                    let at = layout.spans.len();
                    layout.spans.extend(spans);
                    CellMask::Spans(at)
                }
            });
            layout.width.push(merged.iter().map(|r| r.len()).sum());
            layout.runs.extend(merged.iter().map(|r| (r.start as u32, r.end as u32)));
            layout.runs_at.push(layout.runs.len());
            layout.seen += seen;
        }
        layout
    }

    /// Query blocks.
    pub fn blocks(&self) -> usize {
        self.len_q.div_ceil(self.block)
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

    /// The largest distance, either way, between a query and a key its block scores: no term by
    /// distance is read further out (`len_k − 1` for a layout that reaches every key; 0 with
    /// fewer keys than queries, where no term by distance applies).
    pub fn reach(&self) -> usize {
        if self.len_k < self.len_q {
            return 0;
        }
        let (blocks, offset) = (self.blocks(), self.len_k.saturating_sub(self.len_q));
        let mut reach = 0;
        for c in 0..self.groups * blocks {
            let i = c % blocks;
            let (q0, q_last) = (offset + i * self.block, offset + ((i + 1) * self.block).min(self.len_q) - 1);
            for &(k0, k1) in &self.runs[self.runs_at[c]..self.runs_at[c + 1]] {
                let (k0, k_last) = (k0 as usize, k1 as usize - 1);
                reach = reach.max(q_last.saturating_sub(k0)).max(k_last.saturating_sub(q0));
            }
        }
        reach
    }

    /// Entries of a distance bias table: one per query − key distance, −(len_k − 1) …
    /// len_k − 1 (the table's index is distance + len_k − 1).
    pub fn bias_width(&self) -> usize {
        (2 * self.len_k).saturating_sub(1)
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
    fn row_mask(&self, c: usize, r: usize) -> RowMask<'_> {
        match self.masks[c] {
            CellMask::Bits(at) => {
                let words = self.width[c].div_ceil(64);
                RowMask::Bits(&self.bits[at + r * words..][..words])
            }
            CellMask::Spans(at) => {
                let (a, b) = self.spans[at + r];
                RowMask::Span(a as usize, b as usize)
            }
        }
    }

    #[cfg(feature = "flex")]
    fn max_width(&self) -> usize {
        self.width.iter().copied().max().unwrap_or(0)
    }
}

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many block-sparse forwards this thread has run (tests check a kind took the kernel).
pub fn calls() -> usize {
    CALLS.get()
}

/// A cell's rows' masks while the layout is built.
enum Mask {
    Bits(Vec<u64>),
    Spans(Vec<(u32, u32)>),
}

/// The one stretch of slots a row's bits set, `None` where they set two or more (no bit set:
/// the empty stretch).
fn span_of(row: &[u64]) -> Option<(u32, u32)> {
    let first = row.iter().position(|&w| w != 0);
    let Some(first) = first else { return Some((0, 0)) };
    let a = first * 64 + row[first].trailing_zeros() as usize;
    let last = row.iter().rposition(|&w| w != 0).expect("a set word");
    let b = last * 64 + 64 - row[last].leading_zeros() as usize;
    let ones: usize = row.iter().map(|w| w.count_ones() as usize).sum();
    (ones == b - a).then_some((a as u32, b as u32))
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
    let (lens, groups) = (layout.lens(), layout.groups);
    separate([q, k, v], DistanceTerms { bias, ..Default::default() }, SparsePiece::only(layout), norm, |h, lq, lk| {
        assert_eq!(lens, (lq, lk), "the sparse layout was built for other lengths");
        assert!(groups == 1 || groups == h, "a sparse layout has one pattern or one per head");
    })
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
    let (lens, groups) = (layout.lens(), layout.groups);
    let heads = PackedHeads { n_heads, n_kv_heads, scale };
    packed(qkv, heads, DistanceTerms { bias, ..Default::default() }, SparsePiece::only(layout), norm, |l| {
        assert_eq!(lens, (l, l), "the sparse layout was built for another length");
        assert!(groups == 1 || groups == n_heads, "a sparse layout has one pattern or one per head");
    })
}

/// One layout of a union ([`block_sparse_union`]) and the positions its slots stand for: by
/// `slots`, or, where no stride gives the order, by a [`Permutation`] (then `slots` is
/// [`Slots::Positions`]).
#[derive(Debug, Clone)]
pub struct SparsePiece {
    /// The pattern: which key slots each block of query slots scores, and which each query sees.
    pub layout: Arc<SparseLayout>,
    /// The position each slot stands for.
    pub slots: Slots,
    /// The slots' positions where no stride gives them (then `slots` is `Positions`).
    pub order: Option<Arc<Permutation>>,
}

/// The position each query slot and each key slot of a piece stands for, per pattern of its
/// layout (`queries[g · L + s]`, `keys[g · L + s]`: for each pattern g a permutation of the L
/// positions). A permuted piece's layout may have one pattern per head and batch row
/// (`groups` = b · h, pattern bi · h + hi), since an order computed from the content differs
/// between rows.
/// A block's queries and keys are gathered into scratch and its results scattered back, so any
/// order works — LSH's hash rounds, where each head sorts its positions by bucket, so that what a
/// query sees is a band of slots. Softmax or the other row normalisers; no distance bias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    /// The position of each query slot, `[g · L + s]`.
    pub queries: Vec<u32>,
    /// The position of each key slot, `[g · L + s]`.
    pub keys: Vec<u32>,
}

/// Which position each slot of a layout stands for. Slots are read in place (a residue class is
/// a strided view of the sequence), so no piece over slots copies q, k or v (a piece over a
/// [`Permutation`] gathers a block at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// Slot s is position s (the queries: row s).
    Positions,
    /// The residue classes of `stride`, each `per_class` slots long: slot c · per_class + i is
    /// position i · stride + c, or padding (seen by nothing) past the end of the sequence. The
    /// layout's blocks and runs must not cross from one class into the next (`per_class` a
    /// multiple of the block).
    Classes {
        /// The stride: class c holds positions c, c + stride, c + 2 · stride, …
        stride: usize,
        /// Slots per class (a multiple of the layout's block).
        per_class: usize,
    },
}

impl Slots {
    /// The position slot `s` stands for in a sequence of `len` (`None`: padding).
    pub fn position(self, s: usize, len: usize) -> Option<usize> {
        match self {
            Slots::Positions => Some(s),
            Slots::Classes { stride, per_class } => {
                let at = (s % per_class) * stride + s / per_class;
                (at < len).then_some(at)
            }
        }
    }

    /// Positions between consecutive slots of a block or a run.
    pub fn step(self) -> usize {
        match self {
            Slots::Positions => 1,
            Slots::Classes { stride, .. } => stride,
        }
    }
}

/// The layouts of one call.
pub type Pieces = Arc<Vec<SparsePiece>>;

impl SparsePiece {
    /// One layout over the positions in order: the whole pattern.
    pub fn only(layout: Arc<SparseLayout>) -> Pieces {
        Arc::new(vec![Self::over(layout, Slots::Positions)])
    }

    /// A layout over `slots`.
    pub fn over(layout: Arc<SparseLayout>, slots: Slots) -> Self {
        Self { layout, slots, order: None }
    }

    /// A layout over the slots of `order`.
    pub fn permuted(layout: Arc<SparseLayout>, order: Arc<Permutation>) -> Self {
        Self { layout, slots: Slots::Positions, order: Some(order) }
    }
}

/// Softmax attention over the union of several patterns, each over its own slots of the
/// positions: where no one ordering makes every query's keys a few runs (the Sparse Transformer's
/// strided pattern is a band in position order and a band inside each residue class), each piece
/// is scored block by block over its slots, and the pieces' results are merged by their
/// log-sum-exps, ℓ = log Σ_p e^{ℓ_p}, O = Σ_p e^{ℓ_p − ℓ} O_p — one softmax over the union. The
/// backward recomputes each piece's probabilities against the merged ℓ. The pieces must not share
/// a (query, key) pair; self-attention over L positions; the distance bias `[h, 2 L − 1]` is by
/// position, whatever a piece's slots (a permuted piece takes none). Inputs as for
/// [`block_sparse_attention`] (`None` with a packed projection: see
/// [`block_sparse_union_self_attention`]).
pub fn block_sparse_union(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Option<Tensor<2>>,
    pieces: Pieces,
) -> Option<Tensor<3>> {
    let check = pieces.clone();
    separate(
        [q, k, v],
        DistanceTerms { bias, ..Default::default() },
        pieces,
        RowNormaliser::Softmax,
        move |h, l, lk| {
            assert_eq!(lk, l, "a union is self-attention: as many keys as queries");
            check_pieces(&check, h, l);
        },
    )
}

/// [`block_sparse_union`] straight from a fused projection's output, as
/// [`block_sparse_self_attention`] takes it.
pub fn block_sparse_union_self_attention(
    qkv: Tensor<3>,
    (n_heads, n_kv_heads): (usize, usize),
    scale: f64,
    bias: Option<Tensor<2>>,
    pieces: Pieces,
) -> Option<Tensor<3>> {
    let check = pieces.clone();
    let heads = PackedHeads { n_heads, n_kv_heads, scale };
    let terms = DistanceTerms { bias, ..Default::default() };
    packed(qkv, heads, terms, pieces, RowNormaliser::Softmax, move |l| check_pieces(&check, n_heads, l))
}

/// The op over separate q, k, v (q scaled) with `terms` (a distance bias alone, content terms, or
/// none) where the kernel applies (`check(h, Lq, Lk)` first), `None` elsewhere.
fn separate(
    [q, k, v]: [Tensor<4>; 3],
    terms: DistanceTerms,
    pieces: Pieces,
    norm: RowNormaliser,
    check: impl FnOnce(usize, usize, usize),
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if [&q, &k, &v].into_iter().all(|t| crate::has_kernel(t)) && terms_on_kernel(&terms) {
        let [_, h, lq, dh] = q.dims();
        let lk = k.dims()[2];
        check(h, lq, lk);
        assert!(
            terms.is_empty() || lk >= lq,
            "terms by distance need the queries to be the last of the keys' positions"
        );
        use burn::backend::Dispatch;
        CALLS.set(CALLS.get() + 1);
        let device = q.device();
        let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
        let d = if terms.is_empty() {
            Dispatch::block_sparse(q, k, v, pieces, norm)
        } else {
            let (spec, tables, bias, multiplier) = term_inputs(terms, (h, dh, lk), &device);
            let (tables, bias, multiplier) = (tables.into_dispatch(), bias.into_dispatch(), multiplier.into_dispatch());
            Dispatch::block_sparse_terms(q, k, v, tables, bias, multiplier, spec, pieces, norm)
        };
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (q, k, v, terms, pieces, norm, check);
    None
}

/// The op over a packed projection with `terms` where the kernel applies (`check(L)` first),
/// `None` elsewhere.
fn packed(
    qkv: Tensor<3>,
    heads: PackedHeads,
    terms: DistanceTerms,
    pieces: Pieces,
    norm: RowNormaliser,
    check: impl FnOnce(usize),
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) && terms_on_kernel(&terms) {
        let [_, l, width] = qkv.dims();
        let h = heads.n_heads;
        assert_eq!(width % (h + 2 * heads.n_kv_heads), 0, "the projection is not (h + 2 h_kv) heads wide");
        check(l);
        use burn::backend::Dispatch;
        CALLS.set(CALLS.get() + 1);
        let device = qkv.device();
        let qkv = qkv.into_dispatch();
        let d = if terms.is_empty() {
            Dispatch::block_sparse_packed(qkv, heads, pieces, norm)
        } else {
            let dh = width / (h + 2 * heads.n_kv_heads);
            let (spec, tables, bias, multiplier) = term_inputs(terms, (h, dh, l), &device);
            let (tables, bias, multiplier) = (tables.into_dispatch(), bias.into_dispatch(), multiplier.into_dispatch());
            Dispatch::block_sparse_packed_terms(qkv, tables, bias, multiplier, heads, spec, pieces, norm)
        };
        return Some(Tensor::from_dispatch(d));
    }
    let _ = (qkv, heads, terms, pieces, norm, check);
    None
}

/// Every piece covers L positions with one pattern or one per head.
fn check_pieces(pieces: &[SparsePiece], h: usize, l: usize) {
    assert!(!pieces.is_empty(), "a union of no patterns");
    for piece in pieces {
        let (lq, lk) = piece.layout.lens();
        assert!(lq == lk, "a union's pieces are self-attention");
        match piece.slots {
            Slots::Classes { stride, per_class } => assert!(
                stride * per_class >= l && per_class % piece.layout.block == 0 && lq == stride * per_class,
                "a piece over residue classes has stride · per_class ≥ L slots, classes a whole number of blocks"
            ),
            Slots::Positions => assert!(lq == l, "a piece in position order covers the L positions"),
        }
        let groups = piece.layout.groups;
        if let Some(order) = &piece.order {
            let n = groups * l;
            assert!(
                piece.slots == Slots::Positions && order.queries.len() == n && order.keys.len() == n,
                "a permutation lists every position per pattern, over slots in position order"
            );
            let ok = |v: &[u32]| v.iter().all(|&p| (p as usize) < l);
            assert!(ok(&order.queries) && ok(&order.keys), "a permutation lists positions below L");
            assert!(
                groups % h == 0 || groups == 1,
                "a permuted layout has one pattern, one per head or per head and row"
            );
        } else {
            assert!(groups == 1 || groups == h, "a sparse layout has one pattern or one per head");
        }
    }
}

/// Relative position terms that read content, for the schemes a distance bias alone cannot say
/// (Transformer-XL, Shaw, DeBERTa, the multiplicative ones). With e = query position − key
/// position + Lk − 1 (the index of a distance-bias table) and B(e) a table's bucket of it:
///
/// s_ij = act(q_i·k_j + q_i·Q[B_Q(e)] + k_j·K[B_K(e)] + b_h(e)) · m_h(e),
/// O_i = Σ_j p_ij (v_j + V[B_V(e)]),
///
/// each part where it is given (act and m only with a multiplier); q are the scaled queries. Q,
/// K, V are per-head tables `[h, buckets, d_h]`, b and m `[h, 2 Lk − 1]`. Every tensor gets its
/// gradient.
#[derive(Debug, Clone, Default)]
pub struct DistanceTerms {
    /// Q, scored against the queries.
    pub queries: Option<DistanceTable>,
    /// K, scored against the keys.
    pub keys: Option<DistanceTable>,
    /// V, added to the values.
    pub values: Option<DistanceTable>,
    /// b, added to the scores.
    pub bias: Option<Tensor<2>>,
    /// m and the activation before it.
    pub multiplier: Option<(Tensor<2>, ScoreActivation)>,
}

/// One table of [`DistanceTerms`]: `rows: [h, buckets, d_h]`, and for each distance entry e
/// (`2 Lk − 1` of them) its bucket.
#[derive(Debug, Clone)]
pub struct DistanceTable {
    /// The table's rows, `[h, buckets, d_h]`.
    pub rows: Tensor<3>,
    /// Each distance entry's bucket (`2 Lk − 1` entries).
    pub bucket: Arc<Vec<u32>>,
}

/// What acts on the scores before a [`DistanceTerms`] multiplier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreActivation {
    /// The scores as they are.
    Identity,
    /// DA-Transformer's ReLU.
    Relu,
}

/// Where each table of a [`DistanceTerms`] call sits in the tables handed to the kernel (one
/// `[h, rows, d_h]` tensor), whether a bias comes, and the multiplier's activation.
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub struct TermSpec {
    query: Option<Bucketed>,
    key: Option<Bucketed>,
    value: Option<Bucketed>,
    biased: bool,
    activation: Option<ScoreActivation>,
}

impl DistanceTerms {
    /// Whether no term is given.
    pub fn is_empty(&self) -> bool {
        let tables = self.queries.is_none() && self.keys.is_none() && self.values.is_none();
        tables && self.bias.is_none() && self.multiplier.is_none()
    }
}

impl TermSpec {
    /// Whether a table or a multiplier comes (not a bias alone).
    #[cfg(feature = "flex")]
    fn has_content(&self) -> bool {
        self.query.is_some() || self.key.is_some() || self.value.is_some() || self.activation.is_some()
    }
}

/// A table's first row in the tables handed to the kernel, its bucket map, and for each entry
/// the first entry of the longest stretch ending there whose buckets step by one slope in
/// {−1, 0, 1} (`starts[e] ≤ e`).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
struct Bucketed {
    first: usize,
    bucket: Arc<Vec<u32>>,
    starts: Arc<Vec<u32>>,
}

/// [`DistanceTerms`] as the kernel takes them: the spec and the tables side by side, the bias and
/// the multiplier (constant placeholders where absent: no gradient reaches them), after checking
/// their shapes against `h` heads of `dh` over `lk` keys.
#[cfg(feature = "flex")]
fn term_inputs(
    terms: DistanceTerms,
    (h, dh, lk): (usize, usize, usize),
    device: &Device,
) -> (TermSpec, Tensor<3>, Tensor<2>, Tensor<2>) {
    let width = 2 * lk - 1;
    let mut spec = TermSpec::default();
    let mut rows = Vec::new();
    let mut first = 0;
    let mut add = |table: DistanceTable| {
        let [th, n, tdh] = table.rows.dims();
        assert!(th == h && tdh == dh, "a distance table is [heads, buckets, d_h]");
        assert_eq!(table.bucket.len(), width, "a bucket map has one bucket per distance entry (2 Lk − 1)");
        assert!(table.bucket.iter().all(|&x| (x as usize) < n), "a bucket beyond its table");
        // the longest stretch ending at each entry whose buckets step by one slope in {−1, 0, 1}
        let (b, mut starts) = (&table.bucket, vec![0u32; width]);
        for e in 1..width {
            let slope = b[e] as i64 - b[e - 1] as i64;
            let open = starts[e - 1] as usize == e - 1 || b[e - 1] as i64 - b[e - 2] as i64 == slope;
            starts[e] = match (slope.abs() <= 1, open) {
                (false, _) => e as u32,
                (true, true) => starts[e - 1],
                (true, false) => e as u32 - 1,
            };
        }
        let at = Bucketed { first, bucket: table.bucket, starts: Arc::new(starts) };
        first += n;
        rows.push(table.rows);
        at
    };
    spec.query = terms.queries.map(&mut add);
    spec.key = terms.keys.map(&mut add);
    spec.value = terms.values.map(&mut add);
    let tables = if rows.is_empty() { Tensor::zeros([h, 1, dh], device) } else { Tensor::cat(rows, 1) };
    let table_2d = |t: Option<Tensor<2>>, what: &str| match t {
        Some(t) => {
            assert_eq!(t.dims(), [h, width], "the {what} is [heads, 2 Lk − 1]");
            t
        }
        None => Tensor::zeros([1, 1], device),
    };
    spec.biased = terms.bias.is_some();
    let bias = table_2d(terms.bias, "distance bias");
    spec.activation = terms.multiplier.as_ref().map(|(_, act)| *act);
    let multiplier = table_2d(terms.multiplier.map(|(m, _)| m), "multiplier");
    (spec, tables, bias, multiplier)
}

/// Whether every tensor of `terms` is on a backend with the kernel.
#[cfg(feature = "flex")]
fn terms_on_kernel(terms: &DistanceTerms) -> bool {
    let tables = [terms.queries.as_ref(), terms.keys.as_ref(), terms.values.as_ref()];
    tables.into_iter().flatten().all(|t| crate::has_kernel(&t.rows))
        && terms.bias.as_ref().is_none_or(crate::has_kernel)
        && terms.multiplier.as_ref().is_none_or(|(m, _)| crate::has_kernel(m))
}

/// [`block_sparse_union`] (one piece or several, none permuted) with [`DistanceTerms`], over
/// separate q (scaled), k and v. `None` on a backend without the kernel.
pub fn block_sparse_with_terms(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    terms: DistanceTerms,
    pieces: Pieces,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    let check = pieces.clone();
    separate([q, k, v], terms, pieces, norm, move |h, lq, lk| check_term_pieces(&check, norm, (h, lq, lk)))
}

/// [`block_sparse_with_terms`] straight from a fused projection's output, as
/// [`block_sparse_self_attention`] takes it.
pub fn block_sparse_self_attention_with_terms(
    qkv: Tensor<3>,
    (n_heads, n_kv_heads): (usize, usize),
    scale: f64,
    terms: DistanceTerms,
    pieces: Pieces,
    norm: RowNormaliser,
) -> Option<Tensor<3>> {
    let (check, heads) = (pieces.clone(), PackedHeads { n_heads, n_kv_heads, scale });
    packed(qkv, heads, terms, pieces, norm, move |l| check_term_pieces(&check, norm, (n_heads, l, l)))
}

/// The pieces of a call with terms against its shape: none permuted; one layout in position
/// order built for these lengths with one pattern or one per head, or a union as
/// [`block_sparse_union`] takes it (softmax, self-attention).
fn check_term_pieces(pieces: &[SparsePiece], norm: RowNormaliser, (h, lq, lk): (usize, usize, usize)) {
    assert!(pieces.iter().all(|piece| piece.order.is_none()), "a permuted piece takes no distance terms");
    match pieces {
        [piece] if piece.slots == Slots::Positions => {
            assert_eq!(piece.layout.lens(), (lq, lk), "the sparse layout was built for other lengths");
            let groups = piece.layout.groups;
            assert!(groups == 1 || groups == h, "a sparse layout has one pattern or one per head");
        }
        _ => {
            assert!(pieces.len() == 1 || norm == RowNormaliser::Softmax, "a union of patterns is softmax");
            assert_eq!(lq, lk, "pieces over residue classes or a union are self-attention");
            check_pieces(pieces, h, lq);
        }
    }
}

/// The head counts and score scale of a packed projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackedHeads {
    /// h, the query heads.
    pub n_heads: usize,
    /// h_kv, the key and value heads.
    pub n_kv_heads: usize,
    /// The factor of the scores, `scale · q kᵀ`.
    pub scale: f64,
}

#[cfg(feature = "flex")]
pub use flex::*;

#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use super::terms::{Content, Entries, HeadTerms, Terms};
    use crate::causal_attention::flex::{
        Dest, Heads, Shared, gemm, normalise_rows, normaliser_gradients, packed_views, readable, readable_packed,
        recompute_rows, score_gradients,
    };
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

        /// [`block_sparse_self_attention`] without a bias.
        fn block_sparse_packed(
            qkv: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`block_sparse_with_terms`]: the tables side by side, the bias and the multiplier
        /// (placeholders where `spec` has no such part).
        #[allow(clippy::too_many_arguments)]
        fn block_sparse_terms(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            tables: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            multiplier: FloatTensor<Self>,
            spec: TermSpec,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self>;

        /// [`block_sparse_self_attention_with_terms`], the terms as for [`Self::block_sparse_terms`].
        #[allow(clippy::too_many_arguments)]
        fn block_sparse_packed_terms(
            qkv: FloatTensor<Self>,
            tables: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            multiplier: FloatTensor<Self>,
            heads: PackedHeads,
            spec: TermSpec,
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
            assert!(k.dims[0] == b && k.dims[3] == dh, "keys {:?} do not fit queries {:?}", k.dims, q.dims);
            Self { b, h, h_kv, lq, dh }
        }

        fn out_rs(&self) -> isize {
            (self.h * self.dh) as isize
        }
    }

    /// Where one block of a piece sits: its first query's position, its rows that stand for
    /// positions, and the position step between consecutive slots.
    #[derive(Clone, Copy)]
    struct Place {
        first: usize,
        rows: usize,
        step: usize,
    }

    /// Where a block starting at slot `q0` with `rows` slots sits (`None`: all padding).
    fn place(slots: Slots, len: usize, q0: usize, rows: usize) -> Option<Place> {
        let first = slots.position(q0, len)?;
        let valid = (0..rows).take_while(|&r| slots.position(q0 + r, len).is_some()).count();
        Some(Place { first, rows: valid, step: slots.step() })
    }

    /// The runs of cell `c` as (first column, first position, keys): the pieces a strided view
    /// reads, a run split where it crosses from one residue class into the next, padding left
    /// out (its columns are hidden: no layout sees a padding slot).
    fn views(layout: &SparseLayout, c: usize, slots: Slots, len: usize) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut col = 0;
        for &(k0, k1) in layout.runs(c) {
            let (k0, k1) = (k0 as usize, k1 as usize);
            let mut k = k0;
            while k < k1 {
                let end = match slots {
                    Slots::Positions => k1,
                    Slots::Classes { per_class, .. } => k1.min((k / per_class + 1) * per_class),
                };
                if let Some(first) = slots.position(k, len) {
                    let n = (k..end).take_while(|&s| slots.position(s, len).is_some()).count();
                    out.push((col + k - k0, first, n));
                }
                k = end;
            }
            col += k1 - k0;
        }
        out
    }

    /// One block's scores against its runs into `s` (rows × width), the terms added (the scores
    /// before a multiplier kept in `raw`, where given) and the hidden pairs at [`HIDDEN`].
    #[allow(clippy::too_many_arguments)]
    fn block_scores(
        (layout, slots, len): (&SparseLayout, Slots, usize),
        (c, e): (usize, &Entries),
        (qb, qrc): (*const f32, (isize, isize)),
        (kp, krc): (*const f32, (isize, isize)),
        (dh, scale): (usize, f32),
        terms: &HeadTerms,
        s: &mut [f32],
        (m, raw): (&mut Vec<f32>, Option<&mut [f32]>),
    ) {
        let (width, rows) = (layout.width[c], e.rows);
        let runs = views(layout, c, slots, len);
        for &(col, k0, n) in &runs {
            let kr = kp.wrapping_offset(k0 as isize * krc.0);
            let krs = krc.0 * slots.step() as isize;
            // SAFETY: the block's query rows and the run's keys lie inside their tensors; the
            // destination is columns col..col + n of `s`'s rows
            unsafe {
                gemm((rows, n, dh), s.as_mut_ptr().add(col), width as isize, false, qb, qrc, kr, (krc.1, krs), scale)
            };
        }
        if let Some(content) = &terms.content {
            content.add_scores(e, &runs, (qb, qrc), (kp, krc), s, width, m);
        }
        if let Some(bias) = terms.bias {
            e.entries(&runs, |r, col, at| s[r * width + col] += bias[at]);
        }
        if let Some(content) = &terms.content {
            content.multiply(e, &runs, s, width, raw);
        }
        for (r, row) in s.chunks_exact_mut(width).enumerate() {
            for_hidden(layout.row_mask(c, r), row, |x| *x = HIDDEN);
        }
    }

    /// Where block `q0` of `rows` slots sits against the distance entries (index q − k + keys − 1,
    /// keys: the key tensor's length).
    fn entries((layout, slots, len): (&SparseLayout, Slots, usize), q0: usize, rows: usize) -> Entries {
        let (q, keys) = match slots {
            // (fewer keys than queries: no term by distance reads this)
            Slots::Positions => ((q0 + layout.len_k).saturating_sub(layout.len_q), layout.len_k),
            Slots::Classes { .. } => (slots.position(q0, len).expect("a scored row stands for a position"), len),
        };
        Entries { first: q + keys - 1, step: slots.step(), rows }
    }

    /// `f` on each entry of `row` the row does not see (with bits, whole words of visible keys
    /// skipped).
    #[inline]
    fn for_hidden(mask: RowMask, row: &mut [f32], f: impl Fn(&mut f32)) {
        match mask {
            RowMask::Bits(bits) => {
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
            RowMask::Span(a, b) => {
                let (before, rest) = row.split_at_mut(a);
                before.iter_mut().chain(&mut rest[b - a..]).for_each(f);
            }
        }
    }

    /// Softmax's score gradients dS = P ∘ (dP − D) with D_i = Σ_j P_ij dP_ij from the block's own
    /// weights, where the block holds its rows' whole softmax (one piece): equal to dO·O_i, but
    /// exactly 0 for a row with one key, where dO·O_i leaves a rounding residue.
    fn softmax_gradients(ds: &mut [f32], p: &[f32], width: usize) {
        for (dsr, pr) in ds.chunks_exact_mut(width).zip(p.chunks_exact(width)) {
            let d = fast_math::dot(pr, dsr);
            dsr.iter_mut().zip(pr).for_each(|(x, &pv)| *x = pv * (*x - d));
        }
    }

    /// The weights of the hidden pairs to exactly 0.
    fn clear_hidden(layout: &SparseLayout, c: usize, p: &mut [f32]) {
        let width = layout.width[c];
        for (r, row) in p.chunks_exact_mut(width).enumerate() {
            for_hidden(layout.row_mask(c, r), row, |x| *x = 0.0);
        }
    }

    /// The blocks head (or, in a permuted layout, pattern) `hi` scores something in: (first slot,
    /// cell, width, place).
    fn scored_blocks(
        (layout, slots, len): (&SparseLayout, Slots, usize),
        hi: usize,
    ) -> impl Iterator<Item = (usize, usize, usize, Place)> + '_ {
        let bs = layout.block;
        (0..layout.blocks()).filter_map(move |blk| {
            let (q0, c) = (blk * bs, cell(layout, hi, blk));
            let at = place(slots, len, q0, bs.min(layout.len_q - q0))?;
            (layout.width[c] > 0 && at.rows > 0).then_some((q0, c, layout.width[c], at))
        })
    }

    /// The cell (group's pattern, query block) of head (or permuted pattern) `hi`.
    fn cell(layout: &SparseLayout, hi: usize, block: usize) -> usize {
        layout.cell(if layout.groups == 1 { 0 } else { hi }, block)
    }

    /// One piece's forward over views: the output `[b, L, h · d_h]` (positions no slot stands
    /// for, and rows that see nothing: zeros) and each row's saved slot `[b, h, L]` (−∞ where a
    /// row sees nothing).
    fn forward_views(
        [q, k, v]: [&Heads; 3],
        scale: f32,
        terms: &Terms,
        (layout, slots): (&SparseLayout, Slots),
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let sh = Shape::of(q, k, v);
        let (g, dh, bs, len) = (sh.h / sh.h_kv, sh.dh, layout.block, sh.lq);
        let n_out = sh.b * len * sh.h * dh;
        let mut out = vec![0.0f32; n_out];
        let mut lse = vec![f32::NEG_INFINITY; sh.b * sh.h * len];
        let (out_ptr, lse_ptr) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
        let width_bias = (2 * k.dims[2]).saturating_sub(1);
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (k.head(bi, kv), v.head(bi, kv));
            let mut s = vec![0.0f32; bs * layout.max_width()];
            let mut l = vec![0.0f32; bs];
            let mut m = Vec::new();
            let mut scratch: Vec<f32> = Vec::with_capacity(if norm.needs_threshold() { layout.max_width() } else { 0 });
            for hi in kv * g..(kv + 1) * g {
                let qp = q.head(bi, hi);
                let ht = terms.head(hi, width_bias, dh);
                for (q0, c, width, at) in scored_blocks((layout, slots, len), hi) {
                    let rows = at.rows;
                    let e = entries((layout, slots, len), q0, rows);
                    let (s, l) = (&mut s[..rows * width], &mut l[..rows]);
                    let qb = qp.wrapping_offset(at.first as isize * q.rs());
                    let qrc = (q.rs() * at.step as isize, q.cs());
                    let keys = (kp, (k.rs(), k.cs()));
                    let geometry = (layout, slots, len);
                    block_scores(geometry, (c, &e), (qb, qrc), keys, (dh, scale), &ht, s, (&mut m, None));
                    normalise_rows(norm, s, width, |_| width, l, &mut scratch);
                    clear_hidden(layout, c, s);
                    for (r, &x) in l.iter().enumerate() {
                        // SAFETY: row (bi, hi, position) of lse belongs to this task
                        unsafe { *lse_ptr.at((bi * sh.h + hi) * len + at.first + r * at.step) = x };
                    }
                    let o = out_ptr.at((bi * len + at.first) * sh.h * dh + hi * dh);
                    let o_rs = sh.out_rs() * at.step as isize;
                    let runs = views(layout, c, slots, len);
                    for &(col, k0, n) in &runs {
                        let vr = vp.wrapping_offset(k0 as isize * v.rs());
                        let vrc = (v.rs() * at.step as isize, v.cs());
                        // SAFETY: the block's rows, columns of head hi: this task's; the
                        // run's values lie inside their tensor
                        unsafe {
                            gemm((rows, dh, n), o, o_rs, true, s.as_ptr().add(col), (width as isize, 1), vr, vrc, 1.0)
                        };
                    }
                    if let Some(content) = &ht.content {
                        content.add_values(&e, &runs, s, width, (o, o_rs), &mut m);
                    }
                }
            }
        });
        let lse = FlexTensor::from_data(TensorData::new(lse, [sh.b, sh.h, len]));
        (FlexTensor::from_data(TensorData::new(out, [sh.b, len, sh.h * dh])), lse)
    }

    /// The gradients of the terms of one call (each `[h, ·]` flattened), where it has them.
    #[derive(Default)]
    struct TermGrads {
        bias: Option<Vec<f32>>,
        tables: Option<Vec<f32>>,
        multiplier: Option<Vec<f32>>,
    }

    impl TermGrads {
        /// Sums `other` in.
        fn add(&mut self, other: TermGrads) {
            let sum = |a: &mut Option<Vec<f32>>, b: Option<Vec<f32>>| match (a.as_mut(), b) {
                (Some(a), Some(b)) => a.iter_mut().zip(b).for_each(|(x, y)| *x += y),
                (None, b) => *a = b,
                _ => {}
            };
            sum(&mut self.bias, other.bias);
            sum(&mut self.tables, other.tables);
            sum(&mut self.multiplier, other.multiplier);
        }
    }

    /// Per-task buffers (task = batch row · h_kv + key/value head; each holds its `g` query
    /// heads' entries) summed into one buffer over every head.
    fn by_heads<'a>(parts: impl Iterator<Item = &'a [f32]>, h_kv: usize) -> Option<Vec<f32>> {
        let mut total: Option<Vec<f32>> = None;
        for (task, part) in parts.enumerate() {
            let (kv, per) = (task % h_kv, part.len());
            let t = total.get_or_insert_with(|| vec![0.0f32; per * h_kv]);
            t[kv * per..(kv + 1) * per].iter_mut().zip(part).for_each(|(x, &y)| *x += y);
        }
        total
    }

    /// One piece's backward over views into `dq`, `dk`, `dv` (accumulated into), against the
    /// whole output `out` and each row's saved `lse` (of the union, where there are several
    /// pieces); the terms' gradients.
    #[allow(clippy::too_many_arguments)]
    fn backward_views(
        [qh, kh, vh]: [&Heads; 3],
        scale: f32,
        terms: &Terms,
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        (layout, slots, own_rows): (&SparseLayout, Slots, bool),
        norm: RowNormaliser,
        [dq, dk, dv]: [Dest; 3],
    ) -> TermGrads {
        let sh = Shape::of(qh, kh, vh);
        let (g, dh, bs, len) = (sh.h / sh.h_kv, sh.dh, layout.block, sh.lq);
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        let (o, dout) = (out.storage::<f32>(), grad.storage::<f32>());
        let width_bias = (2 * kh.dims[2]).saturating_sub(1);
        let table_rows = terms.content.map_or(0, |c| c.rows);
        let multiplied = terms.content.is_some_and(|c| c.multiplier.is_some());
        let per_task: Vec<[Vec<f32>; 3]> = (0..sh.b * sh.h_kv)
            .into_par_iter()
            .map(|task| {
                let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
                let (kp, vp) = (kh.head(bi, kv), vh.head(bi, kv));
                let (dkp, dvp) = (dk.head(bi, kv), dv.head(bi, kv));
                let mut p = vec![0.0f32; bs * layout.max_width()];
                let mut ds = vec![0.0f32; bs * layout.max_width()];
                let mut raw = vec![0.0f32; if multiplied { bs * layout.max_width() } else { 0 }];
                let mut l = vec![0.0f32; bs];
                let (mut m1, mut m2) = (Vec::new(), Vec::new());
                let mut dbias = vec![0.0f32; if terms.bias.is_some() { g * width_bias } else { 0 }];
                let mut dtables = vec![0.0f32; g * table_rows * dh];
                let mut dmult = vec![0.0f32; if multiplied { g * width_bias } else { 0 }];
                for hi in kv * g..(kv + 1) * g {
                    let qp = qh.head(bi, hi);
                    let ht = terms.head(hi, width_bias, dh);
                    let gh = hi - kv * g;
                    for (q0, c, width, at) in scored_blocks((layout, slots, len), hi) {
                        let (rows, step) = (at.rows, at.step as isize);
                        let e = entries((layout, slots, len), q0, rows);
                        let (p, ds, l) = (&mut p[..rows * width], &mut ds[..rows * width], &mut l[..rows]);
                        let qb = qp.wrapping_offset(at.first as isize * qh.rs());
                        let qrc = (qh.rs() * step, qh.cs());
                        let first = (bi * len + at.first) * sh.h * dh + hi * dh;
                        let out_rs = sh.out_rs() * step;
                        let dob = dout[first..].as_ptr();
                        for (r, x) in l.iter_mut().enumerate() {
                            *x = lse[(bi * sh.h + hi) * len + at.first + r * at.step];
                        }
                        let keys = (kp, (kh.rs(), kh.cs()));
                        let raw_block = multiplied.then(|| &mut raw[..rows * width]);
                        let geometry = (layout, slots, len);
                        block_scores(geometry, (c, &e), (qb, qrc), keys, (dh, scale), &ht, p, (&mut m1, raw_block));
                        recompute_rows(norm, p, width, |_| width, l);
                        clear_hidden(layout, c, p);
                        let pt = (1, width as isize);
                        let runs = views(layout, c, slots, len);
                        // SAFETY (every gemm below): the block's query rows and the runs' keys lie
                        // inside their tensors; the dk/dv rows written are this task's key/value
                        // head, the dq rows this task's query head
                        for &(col, k0, n) in &runs {
                            let vr = vp.wrapping_offset(k0 as isize * vh.rs());
                            let dvr = dvp.wrapping_add(k0 * dv.strides[2]);
                            let dv_rs = dv.rs() * step;
                            // dV += Pᵀ dO
                            unsafe {
                                gemm((n, dh, rows), dvr, dv_rs, true, p.as_ptr().add(col), pt, dob, (out_rs, 1), 1.0)
                            };
                            // dP = dO Vᵀ
                            let vt = (vh.cs(), vh.rs() * step);
                            unsafe {
                                gemm(
                                    (rows, n, dh),
                                    ds.as_mut_ptr().add(col),
                                    width as isize,
                                    false,
                                    dob,
                                    (out_rs, 1),
                                    vr,
                                    vt,
                                    1.0,
                                )
                            };
                        }
                        let dtables_h = &mut dtables[gh * table_rows * dh..(gh + 1) * table_rows * dh];
                        if let Some(content) = &ht.content {
                            let m = (&mut m1, &mut m2);
                            content.values_backward(&e, &runs, p, ds, width, (dob, out_rs), dtables_h, m);
                        }
                        match norm {
                            RowNormaliser::Softmax if own_rows => softmax_gradients(ds, p, width),
                            RowNormaliser::Softmax => {
                                score_gradients(ds, p, width, dout, o, first, out_rs as usize, dh)
                            }
                            _ => normaliser_gradients(norm, ds, p, width, |_| width),
                        }
                        if let (Some(content), true) = (&ht.content, multiplied) {
                            let dm = &mut dmult[gh * width_bias..][..width_bias];
                            content.multiplier_backward(&e, &runs, &raw[..rows * width], ds, width, dm);
                        }
                        if terms.bias.is_some() {
                            let db = &mut dbias[gh * width_bias..][..width_bias];
                            e.entries(&runs, |r, col, at| db[at] += ds[r * width + col]);
                        }
                        let dqb = dq.head(bi, hi).wrapping_add(at.first * dq.strides[2]);
                        let dq_rs = dq.rs() * step;
                        if let Some(content) = &ht.content {
                            let queries = ((qb, qrc), (dqb, dq_rs));
                            let keys = ((kp, (kh.rs(), kh.cs())), (dkp, dk.rs()));
                            content.scores_backward(&e, &runs, ds, width, queries, keys, dtables_h, &mut m1);
                        }
                        for &(col, k0, n) in &runs {
                            let kr = kp.wrapping_offset(k0 as isize * kh.rs());
                            let krc = (kh.rs() * step, kh.cs());
                            let dkr = dkp.wrapping_add(k0 * dk.strides[2]);
                            let dk_rs = dk.rs() * step;
                            let dsb = unsafe { ds.as_ptr().add(col) };
                            // dQ += scale · dS K
                            unsafe { gemm((rows, dh, n), dqb, dq_rs, true, dsb, (width as isize, 1), kr, krc, scale) };
                            // dK += scale · dSᵀ Q
                            unsafe { gemm((n, dh, rows), dkr, dk_rs, true, dsb, pt, qb, qrc, scale) };
                        }
                    }
                }
                [dbias, dtables, dmult]
            })
            .collect();
        let part = |i: usize| per_task.iter().map(move |parts| parts[i].as_slice());
        TermGrads {
            bias: terms.bias.and_then(|_| by_heads(part(0), sh.h_kv)),
            tables: terms.content.and_then(|_| by_heads(part(1), sh.h_kv)),
            multiplier: multiplied.then(|| by_heads(part(2), sh.h_kv)).flatten(),
        }
    }

    /// One piece's forward: over views, or gathered through its permutation.
    fn forward_piece(
        views: [&Heads; 3],
        scale: f32,
        terms: &Terms,
        piece: &SparsePiece,
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        match &piece.order {
            None => forward_views(views, scale, terms, (&piece.layout, piece.slots), norm),
            Some(order) => {
                assert!(terms.bias.is_none() && terms.content.is_none(), "a permuted piece takes no distance terms");
                forward_permuted(views, scale, (&piece.layout, order), norm)
            }
        }
    }

    /// Copies rows `positions` of a head (`base`, strides (row, column)) into `dst`, `dh` each.
    ///
    /// # Safety
    /// Every position is a row of the head (checked for a permutation by [`check_permutations`]).
    unsafe fn gather_rows(base: *const f32, (rs, cs): (isize, isize), positions: &[usize], dh: usize, dst: &mut [f32]) {
        for (&pos, row) in positions.iter().zip(dst.chunks_exact_mut(dh)) {
            let at = base.wrapping_offset(pos as isize * rs);
            // SAFETY: `pos` is a row of the head (the caller's contract): its dh entries lie inside
            row.iter_mut().enumerate().for_each(|(d, x)| *x = unsafe { *at.wrapping_offset(d as isize * cs) });
        }
    }

    /// Adds `src`'s rows (`dh` each) into rows `positions` of a destination head (`base`, row
    /// stride `rs`, columns contiguous).
    ///
    /// # Safety
    /// Every position is a row of the head, and no other thread writes those rows meanwhile.
    unsafe fn scatter_add_rows(base: *mut f32, rs: isize, positions: &[usize], dh: usize, src: &[f32]) {
        for (&pos, row) in positions.iter().zip(src.chunks_exact(dh)) {
            let at = base.wrapping_offset(pos as isize * rs);
            // SAFETY: the caller's contract
            row.iter().enumerate().for_each(|(d, &x)| unsafe { *at.add(d) += x });
        }
    }

    /// The pattern of a permuted layout that head `hi` of batch row `bi` uses.
    fn pattern(layout: &SparseLayout, sh: &Shape, bi: usize, hi: usize) -> usize {
        match layout.groups {
            1 => 0,
            g if g == sh.h => hi,
            g => {
                assert_eq!(g, sh.b * sh.h, "a permuted layout has one pattern, one per head or per head and row");
                bi * sh.h + hi
            }
        }
    }

    /// The positions of a permuted piece's cell: its query rows (block `q0`, `rows` of them) and
    /// its keys (the runs' slots in column order), for pattern `pat`.
    fn permuted_positions(
        layout: &SparseLayout,
        order: &Permutation,
        (pat, c): (usize, usize),
        (q0, rows): (usize, usize),
        (qpos, kpos): (&mut Vec<usize>, &mut Vec<usize>),
    ) {
        let l = layout.len_q;
        qpos.clear();
        qpos.extend(order.queries[pat * l + q0..][..rows].iter().map(|&p| p as usize));
        kpos.clear();
        for &(k0, k1) in layout.runs(c) {
            kpos.extend(order.keys[pat * l + k0 as usize..pat * l + k1 as usize].iter().map(|&p| p as usize));
        }
    }

    /// One block's scores against its gathered keys into `s` (rows × width), hidden pairs at
    /// [`HIDDEN`]: by one GEMM, for the backward, whose probabilities are recomputed against the
    /// forward's log-sum-exp. The forward scores a permuted block's pairs one by one instead
    /// ([`attend_visible`]): a GEMM's kernel is chosen by the block's shape (the gemm crate's
    /// horizontal kernel, which sums by lanes, below 256 entries), and a permuted block's width
    /// depends on later positions. The two can differ in the last bit of a score; the weights
    /// recomputed here differ from the forward's by as little, and no output depends on them.
    fn gathered_scores(
        layout: &SparseLayout,
        c: usize,
        qs: &[f32],
        ks: &[f32],
        (rows, width, dh): (usize, usize, usize),
        scale: f32,
        s: &mut [f32],
    ) {
        // SAFETY: qs holds rows × dh, ks width × dh, s rows × width
        unsafe {
            gemm(
                (rows, width, dh),
                s.as_mut_ptr(),
                width as isize,
                false,
                qs.as_ptr(),
                (dh as isize, 1),
                ks.as_ptr(),
                (1, dh as isize),
                scale,
            )
        };
        for (r, row) in s.chunks_exact_mut(width).enumerate() {
            for_hidden(layout.row_mask(c, r), row, |x| *x = HIDDEN);
        }
    }

    /// The columns of `row` (a cell's row of `width` slots) the row sees, in column order.
    fn visible_columns(mask: RowMask, width: usize, out: &mut Vec<usize>) {
        out.clear();
        match mask {
            RowMask::Bits(bits) => {
                for (w, &word) in bits.iter().enumerate() {
                    let mut rest = word;
                    while rest != 0 {
                        let s = w * 64 + rest.trailing_zeros() as usize;
                        if s < width {
                            out.push(s);
                        }
                        rest &= rest - 1;
                    }
                }
            }
            RowMask::Span(a, b) => out.extend(a..b),
        }
    }

    crate::wide_vectors! {
        /// `scale · q·k_j` for each column j of `cols` (rows of `ks`, `q.len()` wide), in that
        /// order, into `out`.
        fn seen_scores(q: &[f32], ks: &[f32], cols: &[usize], scale: f32, out: &mut Vec<f32>) {
            let dh = q.len();
            out.clear();
            out.extend(cols.iter().map(|&j| scale * fast_math::dot(q, &ks[j * dh..][..dh])));
        }
    }

    crate::wide_vectors! {
        /// `o = Σ p_j v_j` over the columns j of `cols` (rows of `vs`, `o.len()` wide), added in
        /// that order.
        fn weighted_values(p: &[f32], vs: &[f32], cols: &[usize], o: &mut [f32]) {
            let dh = o.len();
            o.fill(0.0);
            for (&j, &w) in cols.iter().zip(p) {
                if w != 0.0 {
                    o.iter_mut().zip(&vs[j * dh..][..dh]).for_each(|(o, &v)| *o += w * v);
                }
            }
        }
    }

    /// A permuted block's weights and outputs (gathered queries `qs`, keys `ks`, values `vs`):
    /// each row scored against the keys it sees alone, taken in column order, normalised over
    /// them, and its output summed over them in that order. Where a block sits in a sorted order
    /// depends on every position's bucket or cluster, later ones included, so the column a key
    /// lands in and the block's width do too; the keys a causal row sees, in column order, are the
    /// keys of its bucket before it in position order, which later positions do not move. Summing
    /// the whole row (the hidden columns are exact zeros, but a sum of 16 lanes gives each column
    /// its lane by its index) or multiplying P by V over every column let later tokens change the
    /// last bits of earlier outputs. A row that sees nothing: output 0, slot [`HIDDEN`].
    #[allow(clippy::too_many_arguments)]
    fn attend_visible(
        (layout, c): (&SparseLayout, usize),
        norm: RowNormaliser,
        [qs, ks, vs]: [&[f32]; 3],
        scale: f32,
        (rows, width, dh): (usize, usize, usize),
        (l, os): (&mut [f32], &mut [f32]),
        (seen, cols, scratch): (&mut Vec<f32>, &mut Vec<usize>, &mut Vec<f32>),
    ) {
        for r in 0..rows {
            let o = &mut os[r * dh..][..dh];
            visible_columns(layout.row_mask(c, r), width, cols);
            if cols.is_empty() {
                o.fill(0.0);
                l[r] = HIDDEN;
                continue;
            }
            seen_scores(&qs[r * dh..][..dh], ks, cols, scale, seen);
            let n = seen.len();
            normalise_rows(norm, seen, n, |_| n, &mut l[r..r + 1], scratch);
            weighted_values(seen, vs, cols, o);
        }
    }

    /// [`forward_views`] for a piece over a [`Permutation`]: per block, the query rows and the
    /// keys and values of its runs are gathered into scratch, each row attends over the keys it
    /// sees ([`attend_visible`]), and the output rows and log-sum-exps are written at the
    /// queries' positions.
    fn forward_permuted(
        [q, k, v]: [&Heads; 3],
        scale: f32,
        (layout, order): (&SparseLayout, &Permutation),
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let sh = Shape::of(q, k, v);
        let (g, dh, bs, len) = (sh.h / sh.h_kv, sh.dh, layout.block, sh.lq);
        let mut out = vec![0.0f32; sh.b * len * sh.h * dh];
        let mut lse = vec![f32::NEG_INFINITY; sh.b * sh.h * len];
        let (out_ptr, lse_ptr) = (Shared(out.as_mut_ptr()), Shared(lse.as_mut_ptr()));
        let wmax = layout.max_width();
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (k.head(bi, kv), v.head(bi, kv));
            let (mut qs, mut os) = (vec![0.0f32; bs * dh], vec![0.0f32; bs * dh]);
            let (mut ks, mut vs) = (vec![0.0f32; wmax * dh], vec![0.0f32; wmax * dh]);
            let mut l = vec![0.0f32; bs];
            let mut scratch: Vec<f32> = Vec::with_capacity(if norm.needs_threshold() { wmax } else { 0 });
            let (mut seen, mut cols) = (Vec::with_capacity(wmax), Vec::with_capacity(wmax));
            let (mut qpos, mut kpos) = (Vec::with_capacity(bs), Vec::with_capacity(wmax));
            for hi in kv * g..(kv + 1) * g {
                let (qp, pat) = (q.head(bi, hi), pattern(layout, &sh, bi, hi));
                for (q0, c, width, at) in scored_blocks((layout, Slots::Positions, len), pat) {
                    let rows = at.rows;
                    permuted_positions(layout, order, (pat, c), (q0, rows), (&mut qpos, &mut kpos));
                    let (qs, os) = (&mut qs[..rows * dh], &mut os[..rows * dh]);
                    let (ks, vs) = (&mut ks[..width * dh], &mut vs[..width * dh]);
                    let l = &mut l[..rows];
                    // SAFETY: the permutation's positions are rows of these heads (checked)
                    unsafe {
                        gather_rows(qp, (q.rs(), q.cs()), &qpos, dh, qs);
                        gather_rows(kp, (k.rs(), k.cs()), &kpos, dh, ks);
                        gather_rows(vp, (v.rs(), v.cs()), &kpos, dh, vs);
                    }
                    let (qs, ks, vs) = (&*qs, &*ks, &*vs);
                    let sizes = (rows, width, dh);
                    attend_visible(
                        (layout, c),
                        norm,
                        [qs, ks, vs],
                        scale,
                        sizes,
                        (l, os),
                        (&mut seen, &mut cols, &mut scratch),
                    );
                    for (r, &pos) in qpos.iter().enumerate() {
                        // SAFETY: row (bi, pos) of head hi, in out and lse, belongs to this task
                        unsafe {
                            *lse_ptr.at((bi * sh.h + hi) * len + pos) = l[r];
                            let o = out_ptr.at((bi * len + pos) * sh.h * dh + hi * dh);
                            std::ptr::copy_nonoverlapping(os[r * dh..].as_ptr(), o, dh);
                        }
                    }
                }
            }
        });
        let lse = FlexTensor::from_data(TensorData::new(lse, [sh.b, sh.h, len]));
        (FlexTensor::from_data(TensorData::new(out, [sh.b, len, sh.h * dh])), lse)
    }

    /// [`backward_views`] for a piece over a [`Permutation`] (no bias), gathering as
    /// [`forward_permuted`] does and adding the gradients back at the positions.
    fn backward_permuted(
        [qh, kh, vh]: [&Heads; 3],
        scale: f32,
        (out, lse, grad): (&FlexTensor, &[f32], &FlexTensor),
        (layout, order, own_rows): (&SparseLayout, &Permutation, bool),
        norm: RowNormaliser,
        [dq, dk, dv]: [Dest; 3],
    ) {
        let sh = Shape::of(qh, kh, vh);
        let (g, dh, bs, len) = (sh.h / sh.h_kv, sh.dh, layout.block, sh.lq);
        let (out, grad) = (out.to_contiguous(), grad.to_contiguous());
        let (o, dout) = (out.storage::<f32>(), grad.storage::<f32>());
        let wmax = layout.max_width();
        let (dhs, out_rs) = (dh as isize, (sh.h * dh) as isize);
        (0..sh.b * sh.h_kv).into_par_iter().for_each(|task| {
            let (bi, kv) = (task / sh.h_kv, task % sh.h_kv);
            let (kp, vp) = (kh.head(bi, kv), vh.head(bi, kv));
            let (dkp, dvp) = (dk.head(bi, kv), dv.head(bi, kv));
            let [mut qs, mut os, mut dos, mut dqs] = std::array::from_fn(|_| vec![0.0f32; bs * dh]);
            let [mut ks, mut vs, mut dks, mut dvs] = std::array::from_fn(|_| vec![0.0f32; wmax * dh]);
            let (mut p, mut ds, mut l) = (vec![0.0f32; bs * wmax], vec![0.0f32; bs * wmax], vec![0.0f32; bs]);
            let (mut qpos, mut kpos) = (Vec::with_capacity(bs), Vec::with_capacity(wmax));
            for hi in kv * g..(kv + 1) * g {
                let (qp, pat) = (qh.head(bi, hi), pattern(layout, &sh, bi, hi));
                let (o_h, dout_h) =
                    (o[bi * len * sh.h * dh + hi * dh..].as_ptr(), dout[bi * len * sh.h * dh + hi * dh..].as_ptr());
                for (q0, c, width, at) in scored_blocks((layout, Slots::Positions, len), pat) {
                    let rows = at.rows;
                    permuted_positions(layout, order, (pat, c), (q0, rows), (&mut qpos, &mut kpos));
                    let (qs, os, dos, dqs) =
                        (&mut qs[..rows * dh], &mut os[..rows * dh], &mut dos[..rows * dh], &mut dqs[..rows * dh]);
                    let (ks, vs) = (&mut ks[..width * dh], &mut vs[..width * dh]);
                    let (dks, dvs) = (&mut dks[..width * dh], &mut dvs[..width * dh]);
                    let (p, ds, l) = (&mut p[..rows * width], &mut ds[..rows * width], &mut l[..rows]);
                    // SAFETY: the permutation's positions are rows of these heads (checked)
                    unsafe {
                        gather_rows(qp, (qh.rs(), qh.cs()), &qpos, dh, qs);
                        gather_rows(kp, (kh.rs(), kh.cs()), &kpos, dh, ks);
                        gather_rows(vp, (vh.rs(), vh.cs()), &kpos, dh, vs);
                        gather_rows(dout_h, (out_rs, 1), &qpos, dh, dos);
                        // the output only where D = dO·O is read (a union's rows)
                        if !own_rows && norm == RowNormaliser::Softmax {
                            gather_rows(o_h, (out_rs, 1), &qpos, dh, os);
                        }
                    }
                    for (x, &pos) in l.iter_mut().zip(&qpos) {
                        *x = lse[(bi * sh.h + hi) * len + pos];
                    }
                    gathered_scores(layout, c, qs, ks, (rows, width, dh), scale, p);
                    recompute_rows(norm, p, width, |_| width, l);
                    clear_hidden(layout, c, p);
                    let ws = width as isize;
                    // SAFETY (every gemm below): the scratch buffers hold the sizes named
                    // dV = Pᵀ dO, dP = dO Vᵀ
                    unsafe {
                        gemm(
                            (width, dh, rows),
                            dvs.as_mut_ptr(),
                            dhs,
                            false,
                            p.as_ptr(),
                            (1, ws),
                            dos.as_ptr(),
                            (dhs, 1),
                            1.0,
                        );
                        gemm(
                            (rows, width, dh),
                            ds.as_mut_ptr(),
                            ws,
                            false,
                            dos.as_ptr(),
                            (dhs, 1),
                            vs.as_ptr(),
                            (1, dhs),
                            1.0,
                        );
                    }
                    match norm {
                        RowNormaliser::Softmax if own_rows => softmax_gradients(ds, p, width),
                        RowNormaliser::Softmax => score_gradients(ds, p, width, dos, os, 0, dh, dh),
                        _ => normaliser_gradients(norm, ds, p, width, |_| width),
                    }
                    // dQ = scale · dS K, dK = scale · dSᵀ Q
                    unsafe {
                        gemm(
                            (rows, dh, width),
                            dqs.as_mut_ptr(),
                            dhs,
                            false,
                            ds.as_ptr(),
                            (ws, 1),
                            ks.as_ptr(),
                            (dhs, 1),
                            scale,
                        );
                        gemm(
                            (width, dh, rows),
                            dks.as_mut_ptr(),
                            dhs,
                            false,
                            ds.as_ptr(),
                            (1, ws),
                            qs.as_ptr(),
                            (dhs, 1),
                            scale,
                        );
                    }
                    // SAFETY: rows of this task's heads (checked positions; a permutation lists each
                    // position once per block)
                    unsafe {
                        scatter_add_rows(dq.head(bi, hi), dq.rs(), &qpos, dh, dqs);
                        scatter_add_rows(dkp, dk.rs(), &kpos, dh, dks);
                        scatter_add_rows(dvp, dv.rs(), &kpos, dh, dvs);
                    }
                }
            }
        });
    }

    /// `pieces` over views: one piece is [`forward_views`]; a union is each piece on its own,
    /// merged by log-sum-exp (softmax).
    fn attend(
        views: [&Heads; 3],
        scale: f32,
        terms: &Terms,
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let [b, h, l, _] = views[0].dims;
        if pieces.iter().any(|piece| piece.order.is_some()) {
            assert_eq!(views[1].dims[2], l, "a permuted piece is self-attention: as many keys as queries");
            check_permutations(pieces, (b, h, l));
        }
        if let [piece] = pieces {
            return forward_piece(views, scale, terms, piece, norm);
        }
        assert!(norm == RowNormaliser::Softmax, "a union of patterns is softmax");
        let dh = views[0].dims[3];
        let (mut out, mut lse) = (vec![0.0f32; b * l * h * dh], vec![f32::NEG_INFINITY; b * h * l]);
        for piece in pieces {
            let (part, part_lse) = forward_piece(views, scale, terms, piece, norm);
            let (part, part_lse) = (part.storage::<f32>(), part_lse.storage::<f32>());
            for bi in 0..b {
                for pos in 0..l {
                    for hi in 0..h {
                        let at = (bi * h + hi) * l + pos;
                        let (was, new) = (lse[at], part_lse[at]);
                        let m = was.max(new);
                        if m == f32::NEG_INFINITY {
                            continue;
                        }
                        let (ea, eb) = ((was - m).exp(), (new - m).exp());
                        let total = ea + eb;
                        let (wa, wb) = (ea / total, eb / total);
                        let row = (bi * l + pos) * h * dh + hi * dh;
                        let (row, row_part) = (&mut out[row..row + dh], &part[row..row + dh]);
                        row.iter_mut().zip(row_part).for_each(|(o, &x)| *o = wa * *o + wb * x);
                        lse[at] = m + total.ln();
                    }
                }
            }
        }
        let out = FlexTensor::from_data(TensorData::new(out, [b, l, h * dh]));
        (out, FlexTensor::from_data(TensorData::new(lse, [b, h, l])))
    }

    /// The backward of [`attend`] into `dests` (zeroed; accumulated into); the terms' gradients.
    /// Each piece recomputes its probabilities against the union's log-sum-exp and output.
    fn attend_backward(
        views: [&Heads; 3],
        scale: f32,
        terms: &Terms,
        (out, lse, grad): (&FlexTensor, &[f32], &FlexTensor),
        pieces: &[SparsePiece],
        norm: RowNormaliser,
        dests: [Dest; 3],
    ) -> TermGrads {
        let mut grads = TermGrads::default();
        // one piece holds each row's whole softmax
        let own_rows = pieces.len() == 1;
        for piece in pieces {
            match &piece.order {
                None => {
                    let at = (&*piece.layout, piece.slots, own_rows);
                    grads.add(backward_views(views, scale, terms, out, lse, grad, at, norm, dests));
                }
                Some(order) => {
                    assert!(
                        terms.bias.is_none() && terms.content.is_none(),
                        "a permuted piece takes no distance terms"
                    );
                    let at = (&*piece.layout, &**order, own_rows);
                    backward_permuted(views, scale, (out, lse, grad), at, norm, dests);
                }
            }
        }
        grads
    }

    /// Every permuted piece against the call's shape: its layout's patterns one, one per head or
    /// one per head and batch row, over the L positions, and each list a permutation of them (the
    /// gathers and scatters rely on it).
    fn check_permutations(pieces: &[SparsePiece], (b, h, l): (usize, usize, usize)) {
        for piece in pieces {
            let Some(order) = &piece.order else { continue };
            let (layout, groups) = (&piece.layout, piece.layout.groups);
            assert!(
                layout.lens() == (l, l) && (groups == 1 || groups == h || groups == b * h),
                "a permuted layout covers the L positions with one pattern, one per head or one per head and row"
            );
            for list in [&order.queries, &order.keys] {
                assert_eq!(list.len(), groups * l, "a permutation lists every position per pattern");
                for pattern in list.chunks_exact(l) {
                    let mut seen = vec![false; l];
                    for &p in pattern {
                        let p = p as usize;
                        assert!(p < l && !seen[p], "a permutation lists each of the L positions once");
                        seen[p] = true;
                    }
                }
            }
        }
    }

    /// What a call adds to q·k: nothing, or [`DistanceTerms`] (three tensors after the inputs:
    /// the tables, the bias, the multiplier; placeholders where `spec` has no such part).
    #[derive(Debug, Clone)]
    enum Added {
        Nothing,
        Terms(TermSpec),
    }

    impl Added {
        /// The tensors it brings after the inputs.
        fn count(&self) -> usize {
            match self {
                Added::Nothing => 0,
                Added::Terms(_) => 3,
            }
        }
    }

    /// The [`Terms`] of a call from its added tensors (contiguous) and the factor on its queries.
    fn terms_of<'a>(added: &'a Added, owned: &'a [FlexTensor], scale: f32) -> Terms<'a> {
        match added {
            Added::Nothing => Terms::default(),
            Added::Terms(spec) => Terms {
                bias: spec.biased.then(|| owned[1].storage::<f32>()),
                // a bias alone (ALiBi, T5) reads no table
                content: spec.has_content().then(|| Content {
                    spec,
                    tables: owned[0].storage::<f32>(),
                    rows: owned[0].layout().shape()[1],
                    multiplier: spec.activation.map(|_| owned[2].storage::<f32>()),
                    scale,
                }),
            },
        }
    }

    /// The factor on the queries as the kernel reads them.
    fn query_scale(inputs: Inputs) -> f32 {
        match inputs {
            Inputs::Separate => 1.0,
            Inputs::Packed(heads) => heads.scale as f32,
        }
    }

    /// The forward: the output `[b, L, h · d_h]` and each row's saved slot.
    fn forward_kernel(
        inputs: Inputs,
        tensors: &[&FlexTensor],
        (added, extra): (&Added, &[&FlexTensor]),
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (FlexTensor, FlexTensor) {
        let owned: Vec<FlexTensor> = extra.iter().map(|t| t.to_contiguous()).collect();
        let terms = terms_of(added, &owned, query_scale(inputs));
        match inputs {
            Inputs::Separate => {
                let (q, k, v) = (readable(tensors[0]), readable(tensors[1]), readable(tensors[2]));
                attend([&Heads::of(&q), &Heads::of(&k), &Heads::of(&v)], 1.0, &terms, pieces, norm)
            }
            Inputs::Packed(heads) => {
                let qkv = readable_packed(tensors[0]);
                let [q, k, v] = packed_views(&qkv, heads.n_heads, heads.n_kv_heads);
                attend([&q, &k, &v], heads.scale as f32, &terms, pieces, norm)
            }
        }
    }

    /// The backward: the gradients of `tensors` (q, k, v, or the packed projection, contiguous,
    /// in their shapes) and of the added tensors (`None` where a part is absent).
    #[allow(clippy::too_many_arguments)]
    fn backward_kernel(
        inputs: Inputs,
        tensors: &[&FlexTensor],
        (added, extra): (&Added, &[&FlexTensor]),
        out: &FlexTensor,
        lse: &[f32],
        grad: &FlexTensor,
        pieces: &[SparsePiece],
        norm: RowNormaliser,
    ) -> (Vec<FlexTensor>, Vec<Option<FlexTensor>>) {
        let owned: Vec<FlexTensor> = extra.iter().map(|t| t.to_contiguous()).collect();
        let terms = terms_of(added, &owned, query_scale(inputs));
        let data = |x: Vec<f32>, dims: &[usize]| FlexTensor::from_data(TensorData::new(x, dims.to_vec()));
        let (grads, term_grads) = match inputs {
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
                let term_grads = attend_backward(views, 1.0, &terms, (out, lse, grad), pieces, norm, dests);
                (vec![data(dq, &qh.dims), data(dk, &kh.dims), data(dv, &vh.dims)], term_grads)
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
                let term_grads = attend_backward([&q, &k, &v], scale, &terms, (out, lse, grad), pieces, norm, dests);
                (vec![data(d, &[b, len, width])], term_grads)
            }
        };
        let shaped = |g: Option<Vec<f32>>, t: &FlexTensor| g.map(|g| data(g, t.layout().shape()));
        let extra_grads = match added {
            Added::Nothing => Vec::new(),
            Added::Terms(_) => vec![
                shaped(term_grads.tables, &owned[0]),
                shaped(term_grads.bias, &owned[1]),
                shaped(term_grads.multiplier, &owned[2]),
            ],
        };
        (grads, extra_grads)
    }

    impl BlockSparseAttention for Flex {
        fn block_sparse(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            forward_kernel(Inputs::Separate, &[&q, &k, &v], (&Added::Nothing, &[]), &pieces, norm).0
        }

        fn block_sparse_packed(qkv: FlexTensor, heads: PackedHeads, pieces: Pieces, norm: RowNormaliser) -> FlexTensor {
            forward_kernel(Inputs::Packed(heads), &[&qkv], (&Added::Nothing, &[]), &pieces, norm).0
        }

        #[allow(clippy::too_many_arguments)]
        fn block_sparse_terms(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            tables: FlexTensor,
            bias: FlexTensor,
            multiplier: FlexTensor,
            spec: TermSpec,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            let added = (&Added::Terms(spec), &[&tables, &bias, &multiplier][..]);
            forward_kernel(Inputs::Separate, &[&q, &k, &v], added, &pieces, norm).0
        }

        #[allow(clippy::too_many_arguments)]
        fn block_sparse_packed_terms(
            qkv: FlexTensor,
            tables: FlexTensor,
            bias: FlexTensor,
            multiplier: FlexTensor,
            heads: PackedHeads,
            spec: TermSpec,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FlexTensor {
            let added = (&Added::Terms(spec), &[&tables, &bias, &multiplier][..]);
            forward_kernel(Inputs::Packed(heads), &[&qkv], added, &pieces, norm).0
        }
    }

    /// The backward of every op: N parents, the inputs (q, k, v or the packed projection) then the
    /// added tensors.
    #[derive(Debug)]
    struct SparseBackward<const N: usize>;

    /// The inputs (checkpointed), the output, each row's log-sum-exp or threshold, the layout.
    #[derive(Debug, Clone)]
    struct Saved {
        inputs: Inputs,
        nodes: Vec<NodeId>,
        added: Added,
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
            let saved: Vec<FlexTensor> = s.nodes.iter().map(|&id| checkpointer.retrieve_node_output(id)).collect();
            let tensors: Vec<&FlexTensor> = saved.iter().collect();
            let (main, extra) = tensors.split_at(N - s.added.count());
            let lse = s.lse.storage::<f32>();
            let (computed, extra_grads) =
                backward_kernel(s.inputs, main, (&s.added, extra), &s.out, lse, &grad, &s.pieces, s.norm);
            let mut computed = computed.into_iter().map(Some).chain(extra_grads);
            let computed: [Option<FlexTensor>; N] = std::array::from_fn(|_| computed.next().flatten());
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), computed);
        }
    }

    /// Runs the forward and records the backward for the tracked inputs: `tensors` (q, k, v, or
    /// the projection) followed by what `added` brings.
    fn tracked<C: CheckpointStrategy, const N: usize>(
        inputs: Inputs,
        tensors: [FloatTensor<Autodiff<Flex, C>>; N],
        added: Added,
        pieces: Pieces,
        norm: RowNormaliser,
    ) -> FloatTensor<Autodiff<Flex, C>> {
        let primitives: Vec<&FlexTensor> = tensors.iter().map(|t| t.primitive()).collect();
        let (main, extra) = primitives.split_at(N - added.count());
        let (out, lse) = forward_kernel(inputs, main, (&added, extra), &pieces, norm);
        let nodes = tensors.each_ref().map(|t| t.node());
        match SparseBackward::<N>.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let nodes: Vec<NodeId> = tensors.iter().map(|t| prep.checkpoint(t)).collect();
                prep.finish(Saved { inputs, nodes, added, out: out.clone(), lse, pieces, norm }, out)
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
            tracked::<C, 3>(Inputs::Separate, [q, k, v], Added::Nothing, pieces, norm)
        }

        fn block_sparse_packed(
            qkv: FloatTensor<Self>,
            heads: PackedHeads,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            tracked::<C, 1>(Inputs::Packed(heads), [qkv], Added::Nothing, pieces, norm)
        }

        #[allow(clippy::too_many_arguments)]
        fn block_sparse_terms(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            tables: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            multiplier: FloatTensor<Self>,
            spec: TermSpec,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let tensors = [q, k, v, tables, bias, multiplier];
            tracked::<C, 6>(Inputs::Separate, tensors, Added::Terms(spec), pieces, norm)
        }

        #[allow(clippy::too_many_arguments)]
        fn block_sparse_packed_terms(
            qkv: FloatTensor<Self>,
            tables: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            multiplier: FloatTensor<Self>,
            heads: PackedHeads,
            spec: TermSpec,
            pieces: Pieces,
            norm: RowNormaliser,
        ) -> FloatTensor<Self> {
            let tensors = [qkv, tables, bias, multiplier];
            tracked::<C, 4>(Inputs::Packed(heads), tensors, Added::Terms(spec), pieces, norm)
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
            let offset = layout.len_k.saturating_sub(layout.len_q);
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
            let offset = lk.saturating_sub(lq);
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
                    return match layout.row_mask(c, i % layout.block) {
                        RowMask::Bits(bits) => bits[s / 64] >> (s % 64) & 1 == 1,
                        RowMask::Span(a, b) => (a..b).contains(&s),
                    };
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
            let len = lq.max(lk);
            let all: Tensor<4> =
                Tensor::random([b, len, h + 2 * h_kv, dh], Distribution::Normal(0.0, 1.5), &device).swap_dims(1, 2);
            let q = all.clone().narrow(1, 0, h).narrow(2, len - lq, lq).mul_scalar(0.7);
            let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
            let (k, v) = (k.narrow(2, len - lk, lk), v.narrow(2, len - lk, lk));
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
            let per_class = len.div_ceil(stride).div_ceil(block) * block;
            let classes = Slots::Classes { stride, per_class };
            let slots = stride * per_class;
            let columns = SparseLayout::new(
                slots,
                slots,
                block,
                1,
                |_, i| {
                    let c = i * block / per_class;
                    vec![c * per_class..(i + 1) * block]
                },
                |_, slot, out| {
                    if classes.position(slot, len).is_some() {
                        out.push(slot - slot % per_class..slot);
                    }
                },
            );
            Arc::new(vec![
                SparsePiece::over(Arc::new(local), Slots::Positions),
                SparsePiece::over(Arc::new(columns), classes),
            ])
        }

        fn check_union(
            len: usize,
            stride: usize,
            block: usize,
            (h, h_kv): (usize, usize),
            packed: bool,
            with_bias: bool,
        ) {
            let device = Device::flex().autodiff();
            device.seed(23);
            let (b, dh, scale) = (2, 8, 0.35);
            let pieces = strided_pieces(len, stride, block);
            let qkv: Tensor<3> = Tensor::random([b, len, (h + 2 * h_kv) * dh], Distribution::Normal(0.0, 1.5), &device);
            let bias: Tensor<2> = Tensor::random([h, 2 * len - 1], Distribution::Normal(0.0, 1.0), &device);
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let strided = |_: usize, q: usize, k: usize| k <= q && (q - k < stride || (q - k) % stride == 0);
            let run = |fused: bool| {
                let (x, bias) = (qkv.clone().require_grad(), bias.clone().require_grad());
                let bias_in = with_bias.then(|| bias.clone());
                let all = x.clone().reshape([b, len, h + 2 * h_kv, dh]).swap_dims(1, 2);
                let q = all.clone().narrow(1, 0, h).mul_scalar(scale);
                let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                let y = match (fused, packed) {
                    (true, true) => {
                        block_sparse_union_self_attention(x.clone(), (h, h_kv), scale, bias_in, pieces.clone())
                    }
                    (true, false) => block_sparse_union(q, k, v, bias_in, pieces.clone()),
                    (false, _) => Some(composed_with(q, k, v, bias_in, strided, RowNormaliser::Softmax)),
                }
                .expect("flex has the kernel");
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).unwrap(), with_bias.then(|| bias.grad(&grads).unwrap()))
            };
            let ((y1, g1, b1), (y2, g2, b2)) = (run(true), run(false));
            let what =
                format!("L {len}, stride {stride}, block {block}, h {h}/{h_kv}, packed {packed}, bias {with_bias}");
            let d = rel_diff(y1, y2);
            assert!(d < 1e-5, "forward, {what}: {d}");
            let d = rel_diff(g1, g2);
            assert!(d < 1e-5, "d qkv, {what}: {d}");
            if let (Some(b1), Some(b2)) = (b1, b2) {
                let d = rel_diff(b1, b2);
                assert!(d < 1e-5, "d bias, {what}: {d}");
            }
        }

        #[test]
        fn a_union_of_orders_is_one_softmax_over_both_patterns() {
            // 23 positions in classes of 4 (three of them one short: padding), classes of 1 or 2 blocks
            check_union(23, 4, 4, (2, 2), false, false);
            check_union(23, 4, 4, (4, 2), true, true);
            check_union(40, 8, 3, (2, 1), true, false);
            check_union(40, 8, 3, (2, 2), false, true);
        }

        /// [`composed_with`] with [`DistanceTerms`], from their definition: each pair's entry
        /// e = query position − key + Lk − 1 looked up per pair.
        fn composed_terms(
            [q, k, v]: [Tensor<4>; 3],
            terms: &DistanceTerms,
            seen: impl Fn(usize, usize, usize) -> bool,
            norm: RowNormaliser,
        ) -> Tensor<3> {
            let [b, h, lq, dh] = q.dims();
            let [_, h_kv, lk, _] = k.dims();
            let (g, device) = (h / h_kv, q.device());
            let entry = |i: usize, j: usize| i + (lk - lq) + lk - 1 - j;
            let by_head = |x: Tensor<4>| x.unsqueeze_dim::<5>(2).expand([b, h_kv, g, lk, dh]).reshape([b, h, lk, dh]);
            let (k, v) = (by_head(k), by_head(v));
            let pairs = |f: &dyn Fn(usize, usize) -> i64, rows: usize, cols: usize| {
                let at: Vec<i64> =
                    (0..rows).flat_map(|i| (0..cols).map(move |j| (i, j))).map(|(i, j)| f(i, j)).collect();
                Tensor::<1, Int>::from_data(TensorData::new(at, [rows * cols]), &device)
            };
            let per_bucket =
                |x: Tensor<4>, t: &DistanceTable| x.matmul(t.rows.clone().swap_dims(1, 2).unsqueeze_dim(0));
            let mut scores = q.clone().matmul(k.clone().swap_dims(2, 3));
            if let Some(t) = &terms.queries {
                let at = pairs(&|i, j| t.bucket[entry(i, j)] as i64, lq, lk).reshape([1, 1, lq, lk]);
                scores = scores + per_bucket(q.clone(), t).gather(3, at.expand([b, h, lq, lk]));
            }
            if let Some(t) = &terms.keys {
                let at = pairs(&|j, i| t.bucket[entry(i, j)] as i64, lk, lq).reshape([1, 1, lk, lq]);
                scores = scores + per_bucket(k.clone(), t).gather(3, at.expand([b, h, lk, lq])).swap_dims(2, 3);
            }
            if let Some(bias) = &terms.bias {
                let at = pairs(&|i, j| entry(i, j) as i64, lq, lk);
                scores = scores + bias.clone().select(1, at).reshape([1, h, lq, lk]);
            }
            if let Some((m, act)) = &terms.multiplier {
                let at = pairs(&|i, j| entry(i, j) as i64, lq, lk);
                let m = m.clone().select(1, at).reshape([1, h, lq, lk]);
                let base = if *act == ScoreActivation::Relu { burn::tensor::activation::relu(scores) } else { scores };
                scores = base * m;
            }
            let hidden: Vec<bool> = (0..h)
                .flat_map(|hi| (0..lq).flat_map(move |i| (0..lk).map(move |j| (hi, i, j))))
                .map(|(hi, i, j)| !seen(hi, i + lk - lq, j))
                .collect();
            let hidden = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [1, h, lq, lk]), &device);
            let probs = normalise_scores(scores.mask_fill(hidden.clone(), -1.0e9), norm).mask_fill(hidden, 0.0);
            let mut out = probs.clone().matmul(v);
            if let Some(t) = &terms.values {
                let at = pairs(&|i, j| t.bucket[entry(i, j)] as i64, lq, lk);
                let rows = t.rows.clone().select(1, at).reshape([1, h, lq, lk, dh]);
                out = out + (probs.unsqueeze_dim::<5>(4) * rows).sum_dim(3).reshape([b, h, lq, dh]);
            }
            out.swap_dims(1, 2).reshape([b, lq, h * dh])
        }

        /// Which terms a check gives.
        #[derive(Clone, Copy, Debug)]
        struct Parts {
            queries: Option<Buckets>,
            keys: bool,
            values: bool,
            bias: bool,
            multiplier: Option<ScoreActivation>,
            /// Clipped maps in the other direction (buckets falling with the distance for the
            /// queries, rising for the keys and values): both slopes of every term.
            flipped: bool,
        }

        /// A bucket map: clipped distances (Shaw, DeBERTa) or one bucket per distance
        /// (Transformer-XL).
        #[derive(Clone, Copy, Debug)]
        enum Buckets {
            Clipped,
            Each,
        }

        /// `(rows, bucket of each entry)` over `lk` keys.
        fn buckets(kind: Buckets, lk: usize, flip: bool) -> (usize, Arc<Vec<u32>>) {
            let c = 3i64;
            let map: Vec<u32> = (0..2 * lk - 1)
                .map(|e| {
                    let d = e as i64 - (lk as i64 - 1);
                    match kind {
                        Buckets::Each => e as u32,
                        Buckets::Clipped => ((if flip { -d } else { d }) + c).clamp(0, 2 * c) as u32,
                    }
                })
                .collect();
            let rows = match kind {
                Buckets::Each => 2 * lk - 1,
                Buckets::Clipped => 2 * c as usize + 1,
            };
            (rows, Arc::new(map))
        }

        /// The kernel with `parts` against [`composed_terms`], over separate q, k, v or (`packed`,
        /// self-attention) one fused projection: output and the gradient of the inputs, every
        /// table, the bias and the multiplier.
        fn check_terms(
            pieces: Pieces,
            (lq, lk): (usize, usize),
            seen: impl Fn(usize, usize, usize) -> bool + Copy,
            (h, h_kv, packed): (usize, usize, bool),
            parts: Parts,
            norm: RowNormaliser,
        ) {
            let device = Device::flex().autodiff();
            device.seed(26);
            let (b, dh, scale) = (2, 8, 0.35);
            let normal = |s: f64| Distribution::Normal(0.0, s);
            let qkv: Tensor<3> = Tensor::random([b, lk, (h + 2 * h_kv) * dh], normal(1.0), &device);
            let table = |(rows, bucket): (usize, Arc<Vec<u32>>)| DistanceTable {
                rows: Tensor::random([h, rows, dh], normal(0.5), &device),
                bucket,
            };
            let flip = parts.flipped;
            let qt = parts.queries.map(|kind| table(buckets(kind, lk, flip)));
            let kt = parts.keys.then(|| table(buckets(Buckets::Clipped, lk, !flip)));
            let vt = parts.values.then(|| table(buckets(Buckets::Clipped, lk, !flip)));
            let bias: Tensor<2> = Tensor::random([h, 2 * lk - 1], normal(1.0), &device);
            let m: Tensor<2> = Tensor::random([h, 2 * lk - 1], Distribution::Uniform(0.5, 1.5), &device);
            let w: Tensor<3> = Tensor::random([b, lq, h * dh], normal(1.0), &device);
            let run = |fused: bool| {
                let track = |t: &DistanceTable| DistanceTable { rows: t.rows.clone().require_grad(), ..t.clone() };
                let (x, bias, m) = (qkv.clone().require_grad(), bias.clone().require_grad(), m.clone().require_grad());
                let (qt, kt, vt) = (qt.as_ref().map(track), kt.as_ref().map(track), vt.as_ref().map(track));
                let terms = DistanceTerms {
                    queries: qt.clone(),
                    keys: kt.clone(),
                    values: vt.clone(),
                    bias: parts.bias.then(|| bias.clone()),
                    multiplier: parts.multiplier.map(|act| (m.clone(), act)),
                };
                let all = x.clone().reshape([b, lk, h + 2 * h_kv, dh]).swap_dims(1, 2);
                let q = all.clone().narrow(1, 0, h).narrow(2, lk - lq, lq).mul_scalar(scale);
                let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
                let y = match (fused, packed) {
                    (true, true) => {
                        block_sparse_self_attention_with_terms(x.clone(), (h, h_kv), scale, terms, pieces.clone(), norm)
                    }
                    (true, false) => block_sparse_with_terms(q, k, v, terms, pieces.clone(), norm),
                    (false, _) => Some(composed_terms([q, k, v], &terms, seen, norm)),
                }
                .expect("flex has the kernel");
                let grads = (y.clone() * w.clone()).sum().backward();
                let flat = |t: Tensor<4>| t.reshape([1, 1, 1, -1]);
                let mut g = vec![flat(x.grad(&grads).unwrap().unsqueeze())];
                for t in [&qt, &kt, &vt].into_iter().flatten() {
                    g.push(flat(t.rows.grad(&grads).unwrap().unsqueeze()));
                }
                if parts.bias {
                    g.push(flat(bias.grad(&grads).unwrap().unsqueeze()));
                }
                if parts.multiplier.is_some() {
                    g.push(flat(m.grad(&grads).unwrap().unsqueeze()));
                }
                (y, g)
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let what =
                format!("{parts:?}, {norm:?}, h {h}/{h_kv}, L {lq}/{lk}, {} pieces, packed {packed}", pieces.len());
            let tol = if norm == RowNormaliser::Softmax { 2e-5 } else { 1e-4 };
            let d = rel_diff(y1, y2);
            assert!(d < tol, "forward, {what}: {d}");
            for (n, (a, e)) in g1.into_iter().zip(g2).enumerate() {
                let d = rel_diff(a, e);
                assert!(d < tol, "gradient {n} (inputs, tables, bias, m), {what}: {d}");
            }
        }

        /// Every term of [`DistanceTerms`], alone and together, on a band (queries and keys
        /// aligned, and queries after a cache of keys), on a union over residue classes, with
        /// grouped-query heads, a packed projection and the sparse normalisers: the kernel equals
        /// the definition, output and every gradient.
        #[test]
        fn distance_terms_equal_their_definition() {
            let none =
                Parts { queries: None, keys: false, values: false, bias: false, multiplier: None, flipped: false };
            let shaw = Parts { queries: Some(Buckets::Clipped), values: true, ..none };
            let xl = Parts { queries: Some(Buckets::Each), keys: true, bias: true, ..none };
            let deberta = Parts { queries: Some(Buckets::Clipped), keys: true, ..none };
            let da = Parts { multiplier: Some(ScoreActivation::Relu), ..none };
            let all = Parts {
                queries: Some(Buckets::Each),
                keys: true,
                values: true,
                bias: true,
                multiplier: Some(ScoreActivation::Identity),
                flipped: false,
            };
            let flipped = Parts { flipped: true, ..all };
            let back = 5;
            let banded = move |_: usize, q: usize, k: usize| k <= q && q - k <= back;
            for parts in [shaw, xl, deberta, da, all, flipped] {
                let pieces = SparsePiece::only(Arc::new(band(23, 4, back)));
                check_terms(pieces.clone(), (23, 23), banded, (4, 2, false), parts, RowNormaliser::Softmax);
                check_terms(pieces.clone(), (23, 23), banded, (4, 2, true), parts, RowNormaliser::Softmax);
                check_terms(pieces, (23, 23), banded, (2, 2, false), parts, RowNormaliser::Sparsemax);
                // seven queries after sixteen cached keys, each seeing every key up to itself
                let cached =
                    SparseLayout::new(7, 23, 4, 1, |_, i| vec![0..16 + (i + 1) * 4], |_, q, out| out.push(0..q + 1));
                let causal = |_: usize, q: usize, k: usize| k <= q;
                let pieces = SparsePiece::only(Arc::new(cached));
                check_terms(pieces, (7, 23), causal, (2, 1, false), parts, RowNormaliser::Softmax);
                // a band both ways
                let both = SparseLayout::new(
                    23,
                    23,
                    4,
                    1,
                    |_, i| vec![(i * 4).saturating_sub(back)..(i + 1) * 4 + back],
                    |_, q, out| out.push(q.saturating_sub(back)..q + back + 1),
                );
                let near = move |_: usize, q: usize, k: usize| q.abs_diff(k) <= back;
                let pieces = SparsePiece::only(Arc::new(both));
                check_terms(pieces, (23, 23), near, (4, 2, true), parts, RowNormaliser::Softmax);
                let stride = 4;
                let strided = move |_: usize, q: usize, k: usize| k <= q && (q - k < stride || (q - k) % stride == 0);
                let pieces = strided_pieces(23, stride, 4);
                check_terms(pieces.clone(), (23, 23), strided, (4, 2, false), parts, RowNormaliser::Softmax);
                check_terms(pieces, (23, 23), strided, (2, 2, true), parts, RowNormaliser::Softmax);
            }
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

        /// A deterministic shuffle of 0..n per pattern (an LCG), as a permutation's lists.
        fn shuffles(patterns: usize, n: usize, seed: u64) -> Vec<u32> {
            let mut state = seed;
            (0..patterns)
                .flat_map(|_| {
                    let mut order: Vec<u32> = (0..n as u32).collect();
                    for i in (1..n).rev() {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        order.swap(i, (state >> 33) as usize % (i + 1));
                    }
                    order
                })
                .collect()
        }

        /// Pieces over permutations (one pattern, one per head, one per head and batch row;
        /// queries and keys in different orders) against dense attention under the same mask: each
        /// normaliser on one piece, and a softmax union of two pieces whose second hides the pairs
        /// of the first — output and every input gradient, grouped-query heads, a partial last
        /// block, query slots that see nothing.
        #[test]
        fn permuted_pieces_equal_dense_masked_attention() {
            for per in ["layout", "head", "head and row"] {
                permuted_pieces(per);
            }
        }

        fn permuted_pieces(per: &str) {
            let device = Device::flex().autodiff();
            device.seed(25);
            let (b, h, h_kv, len, dh, block) = (2, 4, 2, 29, 8, 4);
            let patterns = match per {
                "layout" => 1,
                "head" => h,
                _ => b * h,
            };
            let pat = |bi: usize, hi: usize| match patterns {
                1 => 0,
                p if p == h => hi,
                _ => bi * h + hi,
            };
            let rank = |order: &[u32]| {
                let mut rank = vec![0; order.len()];
                order.iter().enumerate().for_each(|(s, &p)| rank[p as usize] = s);
                rank
            };
            // piece A: query slot s sees key slots s − 5 … s (key order differs from query order),
            // slots 3, 10, 17, … nothing
            let a = Arc::new(Permutation { queries: shuffles(patterns, len, 1), keys: shuffles(patterns, len, 2) });
            let (qa, ka): (Vec<_>, Vec<_>) =
                (0..patterns).map(|g| (rank(&a.queries[g * len..][..len]), rank(&a.keys[g * len..][..len]))).unzip();
            let in_a =
                |g: usize, i: usize, j: usize| qa[g][i] % 7 != 3 && ka[g][j] <= qa[g][i] && qa[g][i] - ka[g][j] <= 5;
            let layout_a = Arc::new(SparseLayout::new(
                len,
                len,
                block,
                patterns,
                |_, i| vec![(i * block).saturating_sub(5)..(i + 1) * block],
                |_, s, out| {
                    if s % 7 != 3 {
                        out.push(s.saturating_sub(5)..s + 1)
                    }
                },
            ));
            // piece B: one order for queries and keys, slots s − 3 … s + 3, minus A's pairs
            let bo = shuffles(patterns, len, 3);
            let rb: Vec<Vec<usize>> = (0..patterns).map(|g| rank(&bo[g * len..][..len])).collect();
            let in_b = |g: usize, i: usize, j: usize| rb[g][i].abs_diff(rb[g][j]) <= 3 && !in_a(g, i, j);
            let layout_b = Arc::new(SparseLayout::new(
                len,
                len,
                block,
                patterns,
                |_, i| vec![(i * block).saturating_sub(3)..(i + 1) * block + 3],
                |g, s, out| {
                    let i = bo[g * len + s] as usize;
                    let near = s.saturating_sub(3)..(s + 4).min(len);
                    out.extend(near.filter(|&t| !in_a(g, i, bo[g * len + t] as usize)).map(|t| t..t + 1));
                },
            ));
            let piece_a = SparsePiece::permuted(layout_a, a.clone());
            let piece_b =
                SparsePiece::permuted(layout_b, Arc::new(Permutation { queries: bo.clone(), keys: bo.clone() }));
            let all: Tensor<4> =
                Tensor::random([b, len, h + 2 * h_kv, dh], Distribution::Normal(0.0, 1.5), &device).swap_dims(1, 2);
            let q = all.clone().narrow(1, 0, h).mul_scalar(0.7);
            let (k, v) = (all.clone().narrow(1, h, h_kv), all.narrow(1, h + h_kv, h_kv));
            let w: Tensor<3> = Tensor::random([b, len, h * dh], Distribution::Normal(0.0, 1.0), &device);
            let cases: Vec<(Pieces, RowNormaliser, bool)> = normalisers()
                .into_iter()
                .map(|norm| (Arc::new(vec![piece_a.clone()]), norm, false))
                .chain([(Arc::new(vec![piece_a.clone(), piece_b.clone()]), RowNormaliser::Softmax, true)])
                .collect();
            for (pieces, norm, union) in cases {
                let run = |fused: bool| {
                    let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
                    let y = if fused {
                        match union {
                            true => block_sparse_union(q.clone(), k.clone(), v.clone(), None, pieces.clone()),
                            false => Some(Tensor::from_dispatch(burn::backend::Dispatch::block_sparse(
                                q.clone().into_dispatch(),
                                k.clone().into_dispatch(),
                                v.clone().into_dispatch(),
                                pieces.clone(),
                                norm,
                            ))),
                        }
                        .expect("flex has the kernel")
                    } else {
                        let rows = (0..b).map(|bi| {
                            let one = |t: &Tensor<4>| t.clone().narrow(0, bi, 1);
                            let seen = |hi: usize, i: usize, j: usize| {
                                in_a(pat(bi, hi), i, j) || (union && in_b(pat(bi, hi), i, j))
                            };
                            composed_with(one(&q), one(&k), one(&v), None, seen, norm)
                        });
                        Tensor::cat(rows.collect(), 0)
                    };
                    let grads = (y.clone() * w.clone()).sum().backward();
                    (y, [q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()])
                };
                let ((y1, g1), (y2, g2)) = (run(true), run(false));
                let what = format!("{norm:?}, union {union}, a pattern per {per}");
                let tol = if norm == RowNormaliser::Softmax { 1e-5 } else { 1e-4 };
                let d = rel_diff(y1, y2);
                assert!(d < tol, "forward, {what}: {d}");
                for ((a, e), name) in g1.into_iter().zip(g2).zip(["dq", "dk", "dv"]) {
                    let d = rel_diff(a, e);
                    assert!(d < tol, "{name}, {what}: {d}");
                }
            }
        }

        /// Rows that each see one stretch of their cell's slots keep a span per row instead of
        /// bits (cells wider than one word); rows with holes keep bits. Both against the dense
        /// computation.
        #[test]
        fn rows_of_one_stretch_keep_spans_and_rows_with_holes_bits() {
            let (len, bs) = (150, 64);
            let runs = |_: usize, i: usize| vec![(i * bs).saturating_sub(100)..((i + 1) * bs).min(len)];
            let band = from_predicate((len, len, bs, 1), runs, |_, q, k| k <= q && q - k < 100);
            // the first block scores one word's width: bits either way
            assert!(band.bits.len() == bs && band.spans.len() == len - bs, "a band keeps spans");
            let holes = from_predicate((len, len, bs, 1), runs, |_, q, k| k <= q && q - k < 100 && k % 5 != 1);
            assert!(holes.spans.is_empty(), "a row with holes keeps bits");
            assert_eq!(
                band.seen(),
                holes.seen()
                    + (0..len).map(|q| (q.saturating_sub(99)..=q).filter(|k| k % 5 == 1).count()).sum::<usize>()
            );
            // read back, the masks are the predicates (the kernel test compares against them)
            for (q, k) in (0..len).flat_map(|q| (0..len).map(move |k| (q, k))) {
                assert_eq!(sees(&band, 0, q, k), k <= q && q - k < 100, "band ({q}, {k})");
                assert_eq!(sees(&holes, 0, q, k), k <= q && q - k < 100 && k % 5 != 1, "holes ({q}, {k})");
            }
            for norm in normalisers() {
                check(band.clone(), 2, 1, true, norm);
                check(holes.clone(), 2, 1, false, norm);
            }
        }

        #[test]
        fn span_of_a_row() {
            let mut row = vec![0u64; 3];
            assert_eq!(span_of(&row), Some((0, 0)));
            set_bits(&mut row, 60, 130);
            assert_eq!(span_of(&row), Some((60, 130)));
            set_bits(&mut row, 140, 141);
            assert_eq!(span_of(&row), None);
            // ending on a word boundary, starting in a later word, a single bit
            for (a, b) in [(0, 128), (64, 192), (70, 71)] {
                let mut row = vec![0u64; 3];
                set_bits(&mut row, a, b);
                assert_eq!(span_of(&row), Some((a as u32, b as u32)), "{a}..{b}");
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
        fn fewer_keys_than_queries_summarising_segments() {
            // 13 queries over 4 keys, each key a finished segment of 3 positions (Poolingformer's
            // pooled level): query q sees segment j once it is complete, 3j + 2 ≤ q, within the
            // last 7 positions; rows 0 and 1 see nothing
            let (len, s, keys) = (13, 3, 4);
            let layout = from_predicate(
                (len, keys, 4, 1),
                |_, i| vec![(i * 4).saturating_sub(8) / s..(i * 4 + 3) / s + 1],
                |_, q, j| s * j + s - 1 <= q && s * j + 7 > q,
            );
            for norm in [RowNormaliser::Softmax, RowNormaliser::Sparsemax] {
                check(layout.clone(), 2, 1, false, norm);
            }
            // wider cells (more than 64 segments in reach of a block of 16), bidirectional
            let (len, s, keys, w) = (300, 3, 100, 120);
            let layout = from_predicate(
                (len, keys, 16, 1),
                |_, i| vec![(i * 16).saturating_sub(w) / s..((i + 1) * 16 + w) / s + 1],
                |_, q, j| s * j + w > q && q + w > s * j + s - 1,
            );
            check(layout, 2, 2, false, RowNormaliser::Softmax);
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
