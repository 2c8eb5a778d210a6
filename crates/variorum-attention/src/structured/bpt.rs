//! BP-Transformer (Ye et al. 2019, "BP-Transformer: Modelling Long-Range Context via Binary
//! Partitioning"), the `bpt` kind. The sequence is partitioned by a binary tree: level 0 holds the
//! tokens, and node v of level j is the span [v·2^j, (v+1)·2^j). Each token attends, fine to
//! coarse, to its own node and to k nodes on each side per level:
//!
//! ```text
//! level 0: the k tokens before it (and after it)
//! level j: the k spans of 2^j next to what the finer levels cover,
//! ```
//!
//! so its neighbourhood partitions the visible sequence — [0, i] causally, [0, L) otherwise —
//! into O(k · log(L/k)) nodes, near positions seen one by one and far ones as ever larger spans.
//! Where the covered range does not start (end) on a multiple of 2^j, the level's first node is
//! the uncovered half of the parent — the reference code's "overlap" rule — so the nodes never
//! overlap. Attention over the neighbourhood N(i), with the paper's relative position
//! representations (Shaw et al.) on the edges:
//!
//! ```text
//! head_i = Σ_{u ∈ N(i)} softmax_u( q_i · (k_u + a_{r(i,u)}) / √d_h ) v_u,
//! ```
//!
//! r(i, u) = 1 + 2k · min(level, `clip_levels`) + (2t on the left, 2t + 1 on the right) for the
//! t-th node of its level and side, 0 for the token's own node; a_r ∈ ℝ^{d_h} is learned and
//! shared by the heads (as in the reference code; initialised N(0, init_std²)). The reference
//! numbers the token-to-ancestor ("affiliated") edges among these; they have no counterpart here
//! (next paragraph), so their types are left out.
//!
//! Choice where our blocks and the paper's graph differ: in the paper the span nodes are graph
//! nodes of their own, zero-initialised and updated layer by layer from their tokens (the
//! "affiliated" edges). A block here carries the token sequence only, so a span node's key and
//! value are recomputed in every layer as the mean of its tokens' keys and values — what the
//! paper's first layer computes for a zero-state span node, whose query is zero and whose
//! attention over its tokens is therefore uniform. This costs no parameters and keeps the layer
//! a drop-in replacement for attention; it gives up the span nodes' own residual stream.
//!
//! Computed by blocks of [`QUERY_BLOCK`] queries: each block gathers the union of its queries'
//! neighbourhoods (O(block + k·log L) nodes, since near tokens share all but their finest nodes)
//! and scores only those; the span means are a pyramid of pairwise sums, O(L·d) per layer. No
//! L × L matrix exists. Padding keys are hidden and left out of the span means (a span of padding
//! alone is hidden). Causal decoding keeps, per level, the sums over the complete nodes so far
//! ([`BptState`]), adds the nodes each call completes and attends over O(k·log L) nodes; with
//! padding or bidirectionally it recomputes the means from the KV cache (O(L·d) per call).
//! Queries must be the last `len_q` of the keys (self-attention, with or without a cache).
//!
//! Positions: the relative representations are the scheme (no score bias or rotation of
//! another scheme applies; absolute schemes on the input do). No memory of earlier segments, no
//! custom attention masks (only padding and causality), no cross-attention.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::{Projected, per_query_head};
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::AttentionState;

/// Queries per block: each block gathers the union of its queries' nodes once.
pub const QUERY_BLOCK: usize = 32;

attention_config! {
    /// `model.attention` with `kind = "bpt"`.
    pub struct BptConfig {
        /// k, nodes per side at every level. Default 4 (the paper sweeps 1–64; its character
        /// language models use 64 at 1,024–8,192 tokens).
        pub k: usize = 4,
        /// Levels above this one share their relative position representations (the
        /// reference code's `clip_dist`). Default 3 (its language-model setting).
        pub clip_levels: usize = 3,
    }
}

impl BptConfig {
    /// Edge types: the own node, then 2k per level up to `clip_levels`.
    pub fn edge_types(&self) -> usize {
        1 + 2 * self.k * (self.clip_levels + 1)
    }

    /// The layer for `d_model`: `full`'s heads and a_r ~ N(0, init_std²) for every edge type.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> BptAttention {
        let attention = self.heads().init(d_model, init_std, out_std, position, device);
        let dh = attention.qkv.head_dim;
        let relative = Tensor::random([self.edge_types(), dh], Distribution::Normal(0.0, init_std), device);
        BptAttention { attention, relative: Param::from_tensor(relative), k: self.k, clip_levels: self.clip_levels }
    }
}

impl AttentionKind for BptConfig {
    type Module = BptAttention;
    const SUMMARY: &'static str = "BP-Transformer: each token attends fine to coarse to k binary-partition nodes per side and level (tokens near, ever larger spans far, a span's key and value the mean of its tokens'), with relative representations per edge; O(k log L) nodes per token";
    const PAPER: &'static str = "Ye et al. 2019, BP-Transformer: Modelling Long-Range Context via Binary Partitioning";
    // its own relative representations: no other scheme's bias or rotation acts on the scores
    const CAPS: Capabilities = Capabilities { reads_memory: false, ..caps::NO_SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.k >= 1, || "model.attention.k must be at least 1 (nodes per side and level)".into())
    }

    /// Settings past what a context of `len` can use would only size the relative table: k
    /// beyond `len` nodes per side, `clip_levels` beyond the partition's ⌈log₂ len⌉ levels.
    fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
        let levels = len.max(1).next_power_of_two().trailing_zeros() as usize;
        check(self.k <= len, || {
            format!(
                "model.attention.k = {} is more than the context of {len}: no level has more than {len} nodes on a side; use at most {len}",
                self.k
            )
        })?;
        check(self.clip_levels <= levels, || {
            format!(
                "model.attention.clip_levels = {} is more than the {levels} levels a context of {len} partitions into; use at most {levels}",
                self.clip_levels
            )
        })
    }

    /// Multiply–adds per token over both sides' nodes (a causal layer scores about half), and
    /// the relative terms: q · a_r for every edge type and head.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let levels = len_k.max(2).next_power_of_two().trailing_zeros() as usize + 1;
        let nodes = (1 + 2 * self.k * levels).min(len_k.max(1));
        let shape = self.heads().heads(d_model);
        self.heads().flops_per_token(d_model, nodes) + (2 * shape.n_heads * shape.head_dim * self.edge_types()) as u64
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // the harness's sequences are a few dozen tokens: k = 1 and 2 reach several levels
        vec![
            TestVariant::new("k 1", Self { k: 1, clip_levels: 2, ..Default::default() }),
            TestVariant::new("k 2, grouped keys", Self { k: 2, n_kv_heads: Some(2), ..Default::default() }),
            TestVariant::new("k 1, bidirectional", Self { k: 1, ..Default::default() }).masked(),
        ]
    }
}

/// Node `index` of `level`: positions [index · 2^level, (index + 1) · 2^level), cut at the end
/// of the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub level: usize,
    pub index: usize,
}

impl Node {
    /// The positions it covers in a sequence of `len`.
    pub fn span(&self, len: usize) -> Range<usize> {
        let start = self.index << self.level;
        start..((self.index + 1) << self.level).min(len)
    }
}

/// Token `i`'s neighbourhood in a sequence of `len` (fine to coarse): `(node, edge type)`, its
/// own node first (type 0), then per level the nodes on the left (and right, unless `causal`),
/// alternating, at most `k` per side and level.
pub fn neighbourhood(i: usize, len: usize, k: usize, causal: bool, clip_levels: usize) -> Vec<(Node, usize)> {
    let mut nodes = vec![(Node { level: 0, index: i }, 0)];
    // what is covered so far: [lo, hi)
    let (mut lo, mut hi) = (i, i + 1);
    let mut level = 0;
    // the node of 2^level starting (ending) at `at` if `at` is a multiple of it, else the
    // uncovered half of that node's parent (one level finer)
    let node_at = |at: usize, level: usize, left: bool| {
        let fine = if at.is_multiple_of(1 << level) { level } else { level - 1 };
        let index = if left { (at >> fine) - 1 } else { at >> fine };
        Node { level: fine, index }
    };
    while lo > 0 || (!causal && hi < len) {
        let base = 1 + 2 * k * level.min(clip_levels);
        for t in 0..k {
            if lo > 0 {
                let node = node_at(lo, level, true);
                lo -= 1 << node.level;
                nodes.push((node, base + 2 * t));
            }
            if !causal && hi < len {
                let node = node_at(hi, level, false);
                hi += 1 << node.level;
                nodes.push((node, base + 2 * t + 1));
            }
        }
        level += 1;
    }
    nodes
}

/// Where each level's nodes start in the concatenated pyramid of `len` positions and how many
/// it has — every node (`ceil(len / 2^j)` at level j, the last one cut at the end) or only the
/// complete ones (`floor(len / 2^j)`, the nodes a causal query can reach) — up to the top level.
fn level_sizes(len: usize, complete: bool) -> Vec<usize> {
    let mut sizes = vec![len];
    let mut n = len;
    while n > 1 {
        n = if complete { n / 2 } else { n.div_ceil(2) };
        if n == 0 {
            break;
        }
        sizes.push(n);
    }
    sizes
}

/// Each level's first node in the concatenated pyramid, then the total.
fn offsets(sizes: &[usize]) -> Vec<usize> {
    let mut at = vec![0];
    for &n in sizes {
        at.push(at.last().expect("one at least") + n);
    }
    at
}

/// For each block of queries: the nodes it gathers and, per query and slot, the edge type or
/// whether it is hidden.
struct Table {
    blocks: usize,
    slots: usize,
    /// `[blocks · slots]` node ids into the pyramid (the total = the zero row of an empty slot).
    nodes: Vec<i64>,
    /// `[blocks · QUERY_BLOCK · slots]`.
    types: Vec<i64>,
    hidden: Vec<bool>,
}

impl Table {
    /// Queries at positions `queries` over keys `0..len`, whose nodes start at `offsets` (one
    /// per level, then the total) in the pyramid.
    fn new(
        att: &BptAttention,
        queries: Range<usize>,
        len: usize,
        offsets: &[usize],
        causal: bool,
        max_back: Option<usize>,
    ) -> Self {
        let total = *offsets.last().expect("the total");
        let id = |n: Node| offsets[n.level] + n.index;
        let bs = QUERY_BLOCK;
        let blocks = queries.len().div_ceil(bs);
        let rows: Vec<Vec<(usize, usize)>> = queries
            .clone()
            .map(|q| {
                neighbourhood(q, len, att.k, causal, att.clip_levels)
                    .into_iter()
                    .filter(|(n, _)| max_back.is_none_or(|m| q.saturating_sub(n.span(len).start) <= m))
                    .map(|(n, t)| (id(n), t))
                    .collect()
            })
            .collect();
        let sets: Vec<Vec<usize>> = rows
            .chunks(bs)
            .map(|block| block.iter().flatten().map(|&(n, _)| n).collect::<BTreeSet<_>>().into_iter().collect())
            .collect();
        let slots = sets.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut nodes = vec![total as i64; blocks * slots];
        let mut types = vec![0i64; blocks * bs * slots];
        let mut hidden = vec![true; blocks * bs * slots];
        for (b, set) in sets.iter().enumerate() {
            for (s, &n) in set.iter().enumerate() {
                nodes[b * slots + s] = n as i64;
            }
            for (r, row) in rows[b * bs..((b + 1) * bs).min(rows.len())].iter().enumerate() {
                for &(n, t) in row {
                    let s = set.binary_search(&n).expect("the block's set holds its rows' nodes");
                    let at = (b * bs + r) * slots + s;
                    types[at] = t as i64;
                    hidden[at] = false;
                }
            }
        }
        Self { blocks, slots, nodes, types, hidden }
    }
}

/// The nodes' keys and values, level by level, where each level starts in the pyramid's
/// numbering, and which nodes hold padding alone.
struct Nodes {
    /// Per level: keys and values `[b, h_kv, ·, d_h]`, what divides them once selected (1 for
    /// means, 2^j for the decoding state's sums), and the row of the level's first node (the
    /// state's buffers are read in place).
    levels: Vec<(Tensor<4>, Tensor<4>, f64, usize)>,
    /// Each level's first node, then the total.
    offsets: Vec<usize>,
    /// `[b, total]`, true for a node of padding alone.
    empty: Option<Tensor<2, Bool>>,
    /// The levels are the whole pyramid as computed (training): one gather reads it; otherwise
    /// the decoding state's buffers, read level by level.
    whole: bool,
}

impl Nodes {
    /// Every node of `p`'s keys, padding left out of the means.
    fn all(p: &Projected, padding: Option<&Tensor<2, Bool>>) -> Self {
        let [b, _, lk, _] = p.k.dims();
        let visible = match padding {
            Some(pad) => pad.clone().bool_not().float().reshape([b, 1, lk, 1]),
            None => Tensor::ones([1, 1, lk, 1], &p.k.device()),
        };
        let counts = pyramid_sums(visible.clone());
        let (ks, vs) = (pyramid_sums(p.k.clone() * visible.clone()), pyramid_sums(p.v.clone() * visible));
        let levels: Vec<(Tensor<4>, Tensor<4>, f64, usize)> = ks
            .into_iter()
            .zip(vs)
            .zip(&counts)
            .map(|((k, v), c)| {
                let c = c.clone().clamp_min(1.0);
                (k / c.clone(), v / c, 1.0, 0)
            })
            .collect();
        let empty = padding.map(|_| {
            let flat: Vec<Tensor<2>> = counts.iter().map(|c| c.clone().reshape([b, c.dims()[2]])).collect();
            Tensor::cat(flat, 1).lower_equal_elem(0.0)
        });
        Self { levels, offsets: offsets(&level_sizes(lk, false)), empty, whole: true }
    }

    /// The keys and values of nodes `ids` (pyramid numbering; the total stands for an empty
    /// slot, a zero row): `[b, h_kv, ids.len(), d_h]`. Each level gives its distinct nodes once,
    /// so the work is the number of distinct nodes, not the pyramid's size.
    fn select(&self, ids: &[i64]) -> (Tensor<4>, Tensor<4>) {
        let (k0, _, _, _) = &self.levels[0];
        let [b, hkv, _, dh] = k0.dims();
        let device = k0.device();
        let total = *self.offsets.last().expect("the total");
        if self.whole {
            // the whole pyramid (training): one gather from it
            let at = Tensor::<1, Int>::from_data(TensorData::new(ids.to_vec(), [ids.len()]), &device);
            let whole = |x: Vec<Tensor<4>>| {
                let mut x = x;
                x.push(Tensor::zeros([b, hkv, 1, dh], &device));
                Tensor::cat(x, 2).select(2, at.clone())
            };
            return (
                whole(self.levels.iter().map(|l| l.0.clone()).collect()),
                whole(self.levels.iter().map(|l| l.1.clone()).collect()),
            );
        }
        // decoding: the few nodes asked for, read in place from each level's buffer
        // each distinct node: its level and its row among that level's picks
        let mut row: HashMap<usize, (usize, u32)> = HashMap::new();
        let mut picks: Vec<Vec<i64>> = vec![Vec::new(); self.levels.len()];
        for &id in ids {
            let id = id as usize;
            if id < total && !row.contains_key(&id) {
                let level = self.offsets.partition_point(|&o| o <= id) - 1;
                row.insert(id, (level, picks[level].len() as u32));
                picks[level].push((id - self.offsets[level]) as i64);
            }
        }
        let (mut ks, mut vs, mut base) = (Vec::new(), Vec::new(), vec![0u32; self.levels.len()]);
        let mut rows = 0u32;
        for (j, ((k, v, div, first), pick)) in self.levels.iter().zip(&picks).enumerate() {
            base[j] = rows;
            if pick.is_empty() {
                continue;
            }
            let pick: Vec<i64> = pick.iter().map(|&i| i + *first as i64).collect();
            let at = Tensor::<1, Int>::from_data(TensorData::new(pick.clone(), [pick.len()]), &device);
            let (k, v) = (k.clone().select(2, at.clone()), v.clone().select(2, at));
            let (k, v) = if *div == 1.0 { (k, v) } else { (k / *div, v / *div) };
            ks.push(k);
            vs.push(v);
            rows += pick.len() as u32;
        }
        ks.push(Tensor::zeros([b, hkv, 1, dh], &device));
        vs.push(Tensor::zeros([b, hkv, 1, dh], &device));
        let order: Vec<i64> = ids
            .iter()
            .map(|&id| match row.get(&(id as usize)) {
                Some(&(level, r)) => i64::from(base[level] + r),
                None => i64::from(rows),
            })
            .collect();
        let order = Tensor::<1, Int>::from_data(TensorData::new(order, [ids.len()]), &device);
        (Tensor::cat(ks, 2).select(2, order.clone()), Tensor::cat(vs, 2).select(2, order))
    }
}

/// `x` `[b, h, n, d]` summed over every node of the binary partition, level by level (pairs of
/// the level below, a zero row after an odd count), in [`level_sizes`] order.
fn pyramid_sums(x: Tensor<4>) -> Vec<Tensor<4>> {
    let mut levels = vec![x.clone()];
    let mut cur = x;
    while cur.dims()[2] > 1 {
        cur = pair_sums(cur);
        levels.push(cur.clone());
    }
    levels
}

/// Sums of consecutive pairs along dim 2 (a zero row completes an odd count).
fn pair_sums(x: Tensor<4>) -> Tensor<4> {
    let [b, h, n, d] = x.dims();
    let x =
        if n.is_multiple_of(2) { x } else { Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, 1, d], &x.device())], 2) };
    let n = n.div_ceil(2);
    x.reshape([b, h, n, 2, d]).sum_dim(3).reshape([b, h, n, d])
}

/// Decoding state: the KV cache and, per level above the tokens, the sums of keys and values
/// over the complete nodes so far (each level a [`KvCache`]: buffers that grow by doubling) —
/// extended by the nodes each new token completes, and read in place, so a token costs
/// O(d · log L) besides its O(k log L) scores.
#[derive(Debug, Clone, Default)]
pub struct BptState {
    pub kv: KvCache,
    /// Level j + 1's complete nodes: key sums and value sums.
    levels: Vec<KvCache>,
}

impl BptState {
    /// Completes the node sums up to the cache's length (`k`, `v`: the whole cache, this call's
    /// tokens appended) and returns the complete nodes (a causal query reaches no other).
    fn nodes(&mut self, k: &Tensor<4>, v: &Tensor<4>) -> Nodes {
        let sizes = level_sizes(k.dims()[2], true);
        for (j, &n) in sizes.iter().enumerate().skip(1) {
            if self.levels.len() < j {
                self.levels.push(KvCache::default());
            }
            let have = self.levels[j - 1].len();
            if n > have {
                // the children of nodes have..n, two by two
                let (below_k, below_v) = match j {
                    1 => (k.clone(), v.clone()),
                    _ => self.levels[j - 2].get().expect("the level below was filled first"),
                };
                let children = |x: Tensor<4>| pair_sums(x.narrow(2, 2 * have, 2 * (n - have)));
                self.levels[j - 1].append(children(below_k), children(below_v));
            }
        }
        let (k0, v0, at) = self.kv.buffers().expect("the call appended its tokens");
        let mut levels = vec![(k0, v0, 1.0, at)];
        for (j, level) in self.levels.iter().enumerate().take(sizes.len() - 1) {
            let (sk, sv, at) = level.buffers().expect("filled above");
            levels.push((sk, sv, (1u64 << (j + 1)) as f64, at));
        }
        Nodes { levels, offsets: offsets(&sizes), empty: None, whole: false }
    }
}

/// BP-Transformer: each token attends to its binary-partition neighbourhood (k nodes per side and
/// level), with a relative representation on each edge.
#[derive(Module, Debug)]
pub struct BptAttention {
    /// Projections and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// a_r, `[edge types, d_h]`: the relative representation of each edge type.
    pub relative: Param<Tensor<2>>,
    /// k, nodes per side at every level.
    pub k: usize,
    /// Levels above this one share their relative representations.
    pub clip_levels: usize,
}

impl BptAttention {
    /// The layer over `input`'s own sequence; no weights (no dense map exists). Causal and
    /// unpadded, `state` keeps the node sums; otherwise the span means come from its KV cache.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut BptState>) -> AttentionOutput {
        let mask = input.mask;
        assert!(
            input.key_value.is_none() && mask.custom.is_none(),
            "bpt attends over its own sequence's binary partition: no cross-attention or custom mask"
        );
        let (p, nodes) = match state {
            // causal queries reach complete nodes only: those the state keeps
            Some(st) if mask.causal && mask.padding.is_none() => {
                let p = self.attention.project(input.query, None, mask, Some(&mut st.kv));
                let nodes = st.nodes(&p.k, &p.v);
                (p, nodes)
            }
            state => {
                let p = self.attention.project(input.query, None, mask, state.map(|s| &mut s.kv));
                let nodes = Nodes::all(&p, mask.padding.as_ref());
                (p, nodes)
            }
        };
        let context = self.attend(&p, &nodes);
        AttentionOutput { context: self.attention.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// Per-head contexts `[b, h, len_q, d_h]` of `p`'s queries over `nodes`.
    fn attend(&self, p: &Projected, nodes: &Nodes) -> Tensor<4> {
        let [b, h, lq, dh] = p.q_dims();
        let lk = p.k.dims()[2];
        let device = p.device();
        let (q0, k0) = (p.layout.q_start, p.layout.k_start);
        assert!(
            q0 >= k0 && q0 - k0 + lq == lk,
            "bpt: the queries must be the last {lq} of its {lk} keys (self-attention, with or without a cache)"
        );
        // positions count from the first key (a cache starts at 0)
        let table = Table::new(self, q0 - k0..q0 - k0 + lq, lk, &nodes.offsets, p.layout.causal, p.max_back);
        let (nb, m, bs) = (table.blocks, table.slots, QUERY_BLOCK);
        let slot_nodes = || Tensor::<1, Int>::from_data(TensorData::new(table.nodes.clone(), [nb * m]), &device);
        let per_head = |x: Tensor<4>| per_query_head(x, h).reshape([b * h, nb, m, dh]);
        let (k, v) = nodes.select(&table.nodes);
        let (k, v) = (per_head(k), per_head(v));

        let pad = nb * bs - lq;
        let q = if pad == 0 { p.q() } else { Tensor::cat(vec![p.q(), Tensor::zeros([b, h, pad, dh], &device)], 2) };
        // q · a_r for every edge type, then each slot's own
        let types = self.relative.val().dims()[0];
        let a = self.relative.val().transpose().unsqueeze_dim::<3>(0).unsqueeze_dim::<4>(0);
        let per_type = q.clone().matmul(a.expand([b, h, dh, types]));
        let at =
            Tensor::<3, Int>::from_data(TensorData::new(table.types, [1, nb * bs, m]), &device).repeat_dim(0, b * h);
        let relative = per_type.reshape([b * h, nb * bs, types]).gather(2, at).reshape([b * h, nb, bs, m]);
        let scores = q.reshape([b * h, nb, bs, dh]).matmul(k.swap_dims(2, 3)) + relative;

        let mut hidden = Tensor::<3, Bool>::from_data(TensorData::new(table.hidden, [nb, bs, m]), &device)
            .unsqueeze_dim::<4>(0)
            .expand([b * h, nb, bs, m]);
        if let Some(empty) = &nodes.empty {
            // a span of padding alone (the empty slot's zero row is hidden already)
            let empty = Tensor::cat(
                vec![empty.clone(), Tensor::<2, Bool>::from_data(TensorData::new(vec![true; b], [b, 1]), &device)],
                1,
            );
            let empty = empty.select(1, slot_nodes()).reshape([b, 1, nb, 1, m]).expand([b, h, nb, bs, m]).reshape([
                b * h,
                nb,
                bs,
                m,
            ]);
            hidden = hidden.bool_or(empty);
        }
        let probs = self.attention.normalise(scores.mask_fill(hidden, MASKED_SCORE).reshape([b, h, nb * bs, m]));
        let probs = self.attention.dropout.forward(probs).reshape([b * h, nb, bs, m]);
        probs.matmul(v).reshape([b, h, nb * bs, dh]).narrow(2, 0, lq)
    }
}

impl AttentionMechanism for BptAttention {
    /// Decoding state: `BptState`.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        BptAttention::forward(self, input, state.map(|s| s.get_or_default::<BptState>()))
    }

    /// Keys and values only (CALM's skipped blocks): the span sums catch up at the next forward.
    fn extend_cache(&self, x: Tensor<3>, mask: &variorum_core::AttentionMask, state: &mut AttentionState) {
        self.attention.project(x, None, mask, Some(&mut state.get_or_default::<BptState>().kv));
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::softmax;
    use variorum_core::AttentionMask;

    fn device() -> Device {
        Device::default()
    }

    /// The defining property: every token's nodes partition what it may see — [0, i] causally,
    /// [0, len) otherwise — fine to coarse, with at most k nodes per side and level.
    #[test]
    fn nodes_partition_each_tokens_context() {
        for len in [1, 2, 3, 7, 8, 13, 37, 64, 100] {
            for k in [1, 2, 3] {
                for causal in [true, false] {
                    for i in 0..len {
                        let nodes = neighbourhood(i, len, k, causal, 3);
                        let mut covered = vec![0u8; len];
                        for (n, _) in &nodes {
                            let span = n.span(len);
                            assert!(!span.is_empty(), "empty node {n:?} for token {i} of {len}");
                            for p in span {
                                covered[p] += 1;
                            }
                        }
                        let want = |p: usize| u8::from(!causal || p <= i);
                        assert!(
                            (0..len).all(|p| covered[p] == want(p)),
                            "len {len} k {k} causal {causal} token {i}: coverage {covered:?}"
                        );
                        // fine to coarse: on each side, no node smaller than one nearer the token
                        for left in [true, false] {
                            let mut side: Vec<Node> = nodes[1..]
                                .iter()
                                .map(|(n, _)| *n)
                                .filter(|n| (n.span(len).start < i) == left)
                                .collect();
                            side.sort_by_key(|n| n.span(len).start.abs_diff(i));
                            assert!(side.windows(2).all(|w| w[0].level <= w[1].level), "{side:?}");
                            for level in 0..8 {
                                let at = nodes[1..]
                                    .iter()
                                    .filter(|(n, t)| {
                                        (n.span(len).start < i) == left && (t - 1) / (2 * k) == level.min(3)
                                    })
                                    .count();
                                assert!(level >= 3 || at <= k, "{at} nodes at level {level}");
                            }
                        }
                        let levels = usize::BITS - len.leading_zeros();
                        assert!(nodes.len() <= 1 + 2 * k * levels as usize);
                    }
                }
            }
        }
    }

    #[test]
    fn the_reference_rule_for_a_small_case() {
        // token 5 of 16 with k = 1: 4 and 6, then [2,4) and [6,8)... written out from the rule
        let got: Vec<(usize, usize, usize)> =
            neighbourhood(5, 16, 1, false, 3).into_iter().map(|(n, t)| (n.level, n.index, t)).collect();
        // level 0: tokens 4 and 6; level 1: lo = 4 is even → [2,4) = (1,1); hi = 7 is odd → the
        // finer token 7; level 2: lo = 2 is not a multiple of 4 → (1,0) = [0,2); hi = 8 → (2,2) = [8,12);
        // level 3: lo = 0; hi = 12 is not a multiple of 8 → (2,3) = [12,16)
        // types: 1 + 2k·level + (0 left, 1 right) for the level's first node
        assert_eq!(got, vec![(0, 5, 0), (0, 4, 1), (0, 6, 2), (1, 1, 3), (0, 7, 4), (1, 0, 5), (2, 2, 6), (2, 3, 8)]);
    }

    #[test]
    fn settings_past_the_context_are_refused_by_key() {
        let cfg = BptConfig { k: 65, ..Default::default() };
        let e = cfg.validate_len(64).unwrap_err().0;
        assert!(e.contains("model.attention.k = 65") && e.contains("at most 64"), "{e}");
        let cfg = BptConfig { clip_levels: 7, ..Default::default() };
        let e = cfg.validate_len(64).unwrap_err().0;
        assert!(e.contains("model.attention.clip_levels = 7") && e.contains("at most 6"), "{e}");
        assert!(BptConfig { k: 64, clip_levels: 6, ..Default::default() }.validate_len(64).is_ok());
        assert!(BptConfig::default().validate_len(65).is_ok());
    }

    fn attention(k: usize, n_kv_heads: Option<usize>) -> BptAttention {
        let cfg = BptConfig { k, n_kv_heads, ..Default::default() };
        cfg.init(16, 0.3, 0.3, Positioning::NONE, &device())
    }

    /// The blocked computation against the definition written out one query at a time: node
    /// keys and values as explicit means of their tokens', softmax over the neighbourhood.
    #[test]
    fn blocked_equals_one_query_at_a_time() {
        let dev = device();
        for (k, len, causal, hkv) in [(1, 37, true, None), (2, 45, false, Some(2)), (1, 70, false, None)] {
            let att = attention(k, hkv);
            let x = Tensor::<3>::random([2, len, 16], Distribution::Normal(0.0, 1.0), &dev);
            let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let p = att.attention.project(x, None, &mask, None);
            let got = att.attend(&p, &Nodes::all(&p, None));
            let [b, h, _, dh] = p.q_dims();
            let hkv = p.k.dims()[1];
            let a = att.relative.val();
            let mut rows = Vec::new();
            for i in 0..len {
                let nodes = neighbourhood(i, len, k, causal, att.clip_levels);
                let mut heads = Vec::new();
                for head in 0..h {
                    let kv = head / (h / hkv);
                    let q = p.q().narrow(1, head, 1).narrow(2, i, 1).reshape([b, dh]);
                    let (mut scores, mut values) = (Vec::new(), Vec::new());
                    for (n, t) in &nodes {
                        let span = n.span(len);
                        let mean = |x: &Tensor<4>| {
                            x.clone().narrow(1, kv, 1).narrow(2, span.start, span.len()).mean_dim(2).reshape([b, dh])
                        };
                        let key = mean(&p.k) + a.clone().narrow(0, *t, 1);
                        scores.push((q.clone() * key).sum_dim(1));
                        values.push(mean(&p.v).unsqueeze_dim::<3>(1));
                    }
                    let w = softmax(Tensor::cat(scores, 1), 1);
                    let ctx = (w.unsqueeze_dim::<3>(2) * Tensor::cat(values, 1)).sum_dim(1);
                    heads.push(ctx.reshape([b, 1, 1, dh]));
                }
                rows.push(Tensor::cat(heads, 1));
            }
            let want = Tensor::cat(rows, 2);
            let diff = (got - want).abs().max().into_scalar::<f32>() as f64;
            assert!(diff < 1e-5, "k {k} len {len} causal {causal}: {diff}");
        }
    }

    /// Decoding from the state — a prefill, chunks, single tokens — equals the forward over the
    /// whole sequence (the node sums grow by the nodes each call completes).
    #[test]
    fn decoding_equals_the_forward() {
        let dev = device();
        let att = attention(2, Some(2));
        let len = 45;
        let x = Tensor::<3>::random([2, len, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let whole = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let mut state = BptState::default();
        let (mut at, mut parts) = (0, Vec::new());
        for step in [1, 4, 1, 1, 9, 1, 16, 1, 1, 10] {
            let m = AttentionMask { q_start: at, ..AttentionMask::causal() };
            let chunk = x.clone().narrow(1, at, step);
            parts.push(att.forward(AttentionInput::self_attention(chunk, &m), Some(&mut state)).context);
            at += step;
        }
        assert_eq!(at, len);
        let diff = (Tensor::cat(parts, 1) - whole).abs().max().into_scalar::<f32>() as f64;
        assert!(diff < 1e-5, "{diff}");
    }

    /// Keys appended without a forward (CALM's skipped blocks) are summed into the spans by the
    /// next forward: decoding after `extend_cache` equals the forward.
    #[test]
    fn extended_cache_catches_up() {
        let dev = device();
        let att = attention(1, None);
        let len = 29;
        let x = Tensor::<3>::random([1, len, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let whole = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let mut state = AttentionState::default();
        AttentionMechanism::extend_cache(&att, x.clone().narrow(1, 0, 20), &mask, &mut state);
        let mut parts = Vec::new();
        for at in 20..len {
            let m = AttentionMask { q_start: at, ..AttentionMask::causal() };
            let input = AttentionInput::self_attention(x.clone().narrow(1, at, 1), &m);
            parts.push(AttentionMechanism::forward(&att, input, Some(&mut state)).context);
        }
        let diff = (Tensor::cat(parts, 1) - whole.narrow(1, 20, len - 20)).abs().max().into_scalar::<f32>() as f64;
        assert!(diff < 1e-5, "{diff}");
    }

    /// Right padding is invisible to a bidirectional layer (causal queries never reach it):
    /// each row of a batch padded to different lengths equals its unpadded self — spans of
    /// padding alone hidden, partly padded ones averaged over their tokens.
    #[test]
    fn padding_changes_nothing() {
        let dev = device();
        let att = attention(1, None);
        let (total, lens) = (32, [21, 13]);
        let x = Tensor::<3>::random([2, total, 16], Distribution::Normal(0.0, 1.0), &dev);
        let open = AttentionMask::bidirectional();
        let pad: Vec<bool> = lens.iter().flat_map(|&n| (0..total).map(move |i| i >= n)).collect();
        let padded =
            AttentionMask { padding: Some(Tensor::from_data(TensorData::new(pad, [2, total]), &dev)), ..open.clone() };
        let long = att.forward(AttentionInput::self_attention(x.clone(), &padded), None).context;
        for (row, &n) in lens.iter().enumerate() {
            let alone = x.clone().narrow(0, row, 1).narrow(1, 0, n);
            let short = att.forward(AttentionInput::self_attention(alone, &open), None).context;
            let diff = (short - long.clone().narrow(0, row, 1).narrow(1, 0, n)).abs().max().into_scalar::<f32>() as f64;
            assert!(diff < 1e-5, "row {row} ({n} tokens): {diff}");
        }
    }

    /// A token's output depends on each node through the edge type's representation: moving a_r
    /// for one type changes exactly the queries that have an edge of that type.
    #[test]
    fn relative_representations_act_per_edge_type() {
        let dev = device();
        let mut att = attention(1, None);
        let len = 20;
        let x = Tensor::<3>::random([1, len, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let before = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        // type 1 + 2·2: the first left node at level 2
        let t = 1 + 2 * 2;
        let bump = Tensor::<2>::zeros([att.relative.val().dims()[0], att.relative.val().dims()[1]], &dev)
            .slice_assign([t..t + 1, 0..4], Tensor::ones([1, 4], &dev) * 5.0);
        att.relative = Param::from_tensor(att.relative.val() + bump);
        let after = att.forward(AttentionInput::self_attention(x, &mask), None).context;
        for i in 0..len {
            let uses = neighbourhood(i, len, 1, true, att.clip_levels).iter().any(|&(_, ty)| ty == t);
            let moved =
                (after.clone().narrow(1, i, 1) - before.clone().narrow(1, i, 1)).abs().max().into_scalar::<f32>()
                    as f64;
            assert_eq!(moved > 1e-6, uses, "token {i}: moved {moved}, has the edge: {uses}");
        }
    }
}
