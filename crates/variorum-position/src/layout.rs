//! Where a block of attention scores sits in the sequence, and the index tensors relative
//! schemes build from it.
//!
//! Query row `i` is at absolute position `q_start + i`, key column `j` at `k_start + j`
//! (the positions of the attention contract, `variorum_core::AttentionMask`). With a KV cache or
//! a memory the keys start before the queries; a sparse mechanism passes the layout of each
//! block it computes. Every relative scheme is a function of the distance
//! `query position − key position` only, which is what makes it shift-invariant.

use burn::prelude::*;

/// Where a block of scores `[len_q, len_k]` sits: its rows' and columns' absolute positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreLayout {
    /// Absolute position of the first query row.
    pub q_start: usize,
    /// Absolute position of the first key column.
    pub k_start: usize,
    /// Query rows.
    pub len_q: usize,
    /// Key columns.
    pub len_k: usize,
    /// The scores belong to causal attention (T5 then uses its one-sided buckets).
    pub causal: bool,
    /// Positions advance by this much per row and per column (1; a strided pattern's column
    /// attention, whose rows and keys are every `stride`-th position, uses its stride).
    pub stride: usize,
}

impl ScoreLayout {
    /// A block of consecutive positions (stride 1).
    pub fn new(q_start: usize, k_start: usize, len_q: usize, len_k: usize, causal: bool) -> Self {
        Self { q_start, k_start, len_q, len_k, causal, stride: 1 }
    }

    /// The same block with rows and keys `stride` positions apart.
    pub fn with_stride(self, stride: usize) -> Self {
        Self { stride, ..self }
    }

    /// `query position − key position` of row `i`, column `j`.
    pub fn distance(&self, i: usize, j: usize) -> i64 {
        (self.q_start + i * self.stride) as i64 - (self.k_start + j * self.stride) as i64
    }

    /// Largest distance in the block (first key, last query).
    pub fn max_distance(&self) -> i64 {
        self.distance(self.len_q - 1, 0)
    }

    /// Smallest distance (last key, first query).
    pub fn min_distance(&self) -> i64 {
        self.distance(0, self.len_k - 1)
    }

    /// `f(query position − key position)` for every pair, row-major.
    fn map<T>(&self, f: impl Fn(i64) -> T) -> Vec<T> {
        (0..self.len_q)
            .flat_map(|i| (0..self.len_k).map(move |j| (i, j)))
            .map(|(i, j)| f(self.distance(i, j)))
            .collect()
    }

    /// `[len_q, len_k]` integer tensor of `f(query position − key position)`.
    pub fn index(&self, f: impl Fn(i64) -> i64, device: &Device) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(self.map(f), [self.len_q, self.len_k]), device)
    }

    /// `[len_q, len_k]` float tensor of `f(query position − key position)`.
    pub fn values(&self, f: impl Fn(i64) -> f32, device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(self.map(f), [self.len_q, self.len_k]), device)
    }
}

/// Query − key distances of score blocks whose keys are gathered from anywhere in the sequence
/// (BigBird's random blocks, the fixed pattern's summary columns, a blockwise permutation), where
/// no [`ScoreLayout`] describes them: one distance per `[groups, n, len_q, len_k]` entry, with
/// `groups` = 1 (every head alike) or one per head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distances {
    /// `[groups, n, len_q, len_k]`.
    pub dims: [usize; 4],
    /// Row-major `query position − key position`.
    pub values: Vec<i64>,
    /// The scores belong to causal attention (T5's one-sided buckets).
    pub causal: bool,
}

impl Distances {
    /// `[groups, n·len_q·len_k]` integer tensor of `f(distance)`.
    pub fn index(&self, f: impl Fn(i64) -> i64, device: &Device) -> Tensor<2, Int> {
        let [g, n, lq, lk] = self.dims;
        let v: Vec<i64> = self.values.iter().map(|&d| f(d)).collect();
        Tensor::from_data(TensorData::new(v, [g, n * lq * lk]), device)
    }

    /// `[groups, n, len_q, len_k]` float tensor of `f(distance)`.
    pub fn values(&self, f: impl Fn(i64) -> f32, device: &Device) -> Tensor<4> {
        let v: Vec<f32> = self.values.iter().map(|&d| f(d)).collect();
        Tensor::from_data(TensorData::new(v, self.dims), device)
    }
}

/// A bucket map of the block-sparse kernel's distance entries over `len_k` keys
/// ([`variorum_kernels::block_sparse::DistanceTable`]): entry e is distance e − (len_k − 1), its
/// bucket `f(distance)`.
pub fn entry_buckets(len_k: usize, f: impl Fn(i64) -> i64) -> std::sync::Arc<Vec<u32>> {
    let last = len_k as i64 - 1;
    std::sync::Arc::new((0..2 * last + 1).map(|e| f(e - last) as u32).collect())
}

/// `f(distance)` for each of the block-sparse kernel's distance entries over `len_k` keys (entry e
/// is distance e − (len_k − 1)), as an index tensor `[2 len_k − 1]`.
pub fn entry_index(len_k: usize, f: impl Fn(i64) -> i64, device: &Device) -> Tensor<1, Int> {
    let last = len_k as i64 - 1;
    let index: Vec<i64> = (-last..=last).map(f).collect();
    Tensor::from_data(TensorData::new(index, [2 * len_k - 1]), device)
}

/// [`entry_index`] of floats.
pub fn entry_values(len_k: usize, f: impl Fn(i64) -> f32, device: &Device) -> Tensor<1> {
    let last = len_k as i64 - 1;
    let values: Vec<f32> = (-last..=last).map(f).collect();
    Tensor::from_data(TensorData::new(values, [2 * len_k - 1]), device)
}

/// `[1, h, len_q, len_k]` from a per-head table `[h, buckets]` and a bucket index `[len_q, len_k]`.
pub fn per_head_bias(table: Tensor<2>, index: Tensor<2, Int>) -> Tensor<4> {
    let [h, _] = table.dims();
    let [lq, lk] = index.dims();
    table.select(1, index.reshape([lq * lk])).reshape([1, h, lq, lk])
}

/// `out[.., i, j] = x[.., i, index[i, j]]`: picks, for every query/key pair, the entry of its
/// distance bucket from `x: [b, h, len_q, buckets]`.
pub fn gather_buckets(x: Tensor<4>, index: Tensor<2, Int>) -> Tensor<4> {
    let [b, h, _, _] = x.dims();
    let [lq, lk] = index.dims();
    x.gather(3, index.reshape([1, 1, lq, lk]).expand([b, h, lq, lk]))
}

/// The adjoint of [`gather_buckets`]: sums `p: [b, h, len_q, len_k]` into `[b, h, len_q, buckets]`
/// by the bucket of each pair.
pub fn scatter_buckets(p: Tensor<4>, index: Tensor<2, Int>, buckets: usize) -> Tensor<4> {
    let [b, h, lq, lk] = p.dims();
    let device = p.device();
    Tensor::zeros([b, h, lq, buckets], &device).scatter(
        3,
        index.reshape([1, 1, lq, lk]).expand([b, h, lq, lk]),
        p,
        burn::tensor::IndexingUpdateOp::Add,
    )
}
