//! Sorted-chunk attention ([`crate::pattern::sorted_chunks`]) on the block-sparse kernel
//! ([`variorum_kernels::block_sparse`]): LSH's shared-QK positions ([`hash_rounds`]) and routing's
//! queries and keys ([`routed`]). For LSH, each hash round is one piece of a kernel union over a
//! [`Permutation`]: the round's sorted order, in which what an item sees — the m items before it
//! (causal), or its chunk and the one before — cut to its bucket, is a band of slots. The kernel gathers each block's items
//! through the permutation, scores only the band and writes the results back at the positions:
//! no sorted copy of q, k or v, no `[chunks, m, 2m]` score, mask or duplicate-count tensor, and
//! the backward recomputes the probabilities.
//!
//! Several rounds are one softmax over the union of what they see, as Reformer's duplicate
//! correction makes them (a key met in r rounds counts once): a pair already seen in an earlier
//! round is hidden in the later ones, and the kernel merges the rounds by their log-sum-exps. An
//! item sees itself only when no round offers it anything else — the composed path's self score
//! of −10⁵ gives it no weight otherwise, so the two paths agree.

use std::ops::Range;
use std::sync::Arc;

use burn::prelude::*;
use variorum_kernels::block_sparse::{
    Permutation, SparseLayout, SparsePiece, block_sparse_union, block_sparse_union_self_attention,
};

/// Query rows per block of the kernel.
const BLOCK: usize = 64;

/// One hash round of one (batch row, head): items sorted by (bucket, position).
struct Round {
    /// The item at each sorted slot, and each item's slot.
    order: Vec<usize>,
    rank: Vec<usize>,
    /// The slots of the bucket of the item at each slot.
    bucket: Vec<Range<usize>>,
}

impl Round {
    fn new(bucket: &[i64]) -> Self {
        let n = bucket.len();
        let mut order: Vec<usize> = (0..n).collect();
        // (bucket, item) is distinct per item: the unstable sort gives the one order
        order.sort_unstable_by_key(|&i| (bucket[i], i));
        let mut rank = vec![0; n];
        for (s, &i) in order.iter().enumerate() {
            rank[i] = s;
        }
        let mut ranges = vec![0..0; n];
        let mut start = 0;
        for s in 1..=n {
            if s == n || bucket[order[s]] != bucket[order[start]] {
                ranges[start..s].fill(start..s);
                start = s;
            }
        }
        Self { order, rank, bucket: ranges }
    }
}

/// What a slot may see before the bucket cut: causal, the m slots before it and itself; otherwise
/// its chunk of m and the one before (the first chunk's wraps to the last, as in Reformer).
#[derive(Clone, Copy)]
struct Windows {
    n: usize,
    m: usize,
    causal: bool,
}

impl Windows {
    fn chunks(self) -> usize {
        self.n.div_ceil(self.m)
    }

    fn chunk(self, c: usize) -> Range<usize> {
        c * self.m..((c + 1) * self.m).min(self.n)
    }

    /// The slot ranges slot `s` may see (the second empty where there is one).
    fn of(self, s: usize) -> [Range<usize>; 2] {
        if self.causal {
            return [s.saturating_sub(self.m)..s + 1, 0..0];
        }
        let c = s / self.m;
        let before = if self.chunks() > 1 { self.chunk((c + self.chunks() - 1) % self.chunks()) } else { 0..0 };
        [self.chunk(c), before]
    }

    /// [`Windows::of`] cut to `cut` (a bucket's slots).
    fn within(self, s: usize, cut: &Range<usize>) -> [Range<usize>; 2] {
        self.of(s).map(|w| w.start.max(cut.start)..w.end.min(cut.end))
    }

    /// Whether the item at slot `s` sees the one at slot `t` of the same bucket.
    fn near(self, s: usize, t: usize) -> bool {
        if self.causal {
            return t <= s && s - t <= self.m;
        }
        let (cs, ct, chunks) = (s / self.m, t / self.m, self.chunks());
        cs == ct || (cs + chunks - 1) % chunks == ct
    }
}

/// Sorted-chunk attention over `buckets.len()` hash rounds by the kernel: items `q`, `k`, `v`
/// `[b, h, n, ·]` (scores q·k: the caller folds the scale into one of them), `buckets[r]` each
/// item's bucket in round r, row major over `[b, h, n]`. Returns the context with its heads
/// merged, `[b, n, h · d_v]`, in item order: one softmax over the union of the rounds' keys.
/// `None` off flex.
pub fn hash_rounds(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    buckets: &[Vec<i64>],
    chunk: usize,
    causal: bool,
) -> Option<Tensor<3>> {
    let [b, h, n, _] = q.dims();
    // (an empty sequence has no block to lay out)
    if !variorum_kernels::has_kernel(&q) || n == 0 {
        return None;
    }
    let (rows, r_count) = (b * h, buckets.len());
    let windows = Windows { n, m: chunk.min(n).max(1), causal };
    // rounds[row][r]
    let rounds: Vec<Vec<Round>> =
        (0..rows).map(|row| buckets.iter().map(|all| Round::new(&all[row * n..(row + 1) * n])).collect()).collect();
    let sees = |round: &Round, i: usize, j: usize| {
        let (s, t) = (round.rank[i], round.rank[j]);
        round.bucket[s].contains(&t) && windows.near(s, t)
    };
    // items no round offers anything but themselves: they see themselves
    let alone: Vec<Vec<bool>> = rounds
        .iter()
        .map(|row| {
            (0..n)
                .map(|i| {
                    row.iter().all(|round| {
                        let s = round.rank[i];
                        windows.within(s, &round.bucket[s]).into_iter().all(|mut w| w.all(|t| t == s))
                    })
                })
                .collect()
        })
        .collect();

    // one layout per round, over groups g = bi · h + hi (batch rows folded into the heads)
    let block = BLOCK.min(n);
    let layout = |r: usize| {
        let runs = |g: usize, blk: usize| {
            let round = &rounds[g][r];
            let (q0, q1) = (blk * block, ((blk + 1) * block).min(n));
            let mut out = Vec::new();
            if causal {
                out.push(q0.saturating_sub(windows.m).max(round.bucket[q0].start)..q1);
            } else {
                // only keys of the block's buckets are seen: cut the chunks to their span
                let span = round.bucket[q0].start..round.bucket[q1 - 1].end;
                for c in q0 / windows.m..=(q1 - 1) / windows.m {
                    out.extend(windows.within(c * windows.m, &span));
                }
            }
            out
        };
        let visible = |g: usize, s: usize, out: &mut Vec<Range<usize>>| {
            let round = &rounds[g][r];
            let i = round.order[s];
            if alone[g][i] {
                if r == 0 {
                    out.push(s..s + 1);
                }
                return;
            }
            for slots in windows.within(s, &round.bucket[s]) {
                // not itself, and not what an earlier round already saw; consecutive slots as one range
                let fresh = |t: usize| t != s && rounds[g][..r].iter().all(|early| !sees(early, i, round.order[t]));
                let mut from = None;
                for t in slots.clone() {
                    match (fresh(t), from) {
                        (true, None) => from = Some(t),
                        (false, Some(a)) => {
                            out.push(a..t);
                            from = None;
                        }
                        _ => {}
                    }
                }
                if let Some(a) = from {
                    out.push(a..slots.end);
                }
            }
        };
        Arc::new(SparseLayout::new(n, n, block, rows, runs, visible))
    };
    let pieces: Vec<SparsePiece> = (0..r_count)
        .map(|r| {
            let order: Vec<u32> = rounds.iter().flat_map(|row| row[r].order.iter().map(|&i| i as u32)).collect();
            SparsePiece::permuted(layout(r), Arc::new(Permutation { queries: order.clone(), keys: order }))
        })
        .collect();
    block_sparse_union(q, k, v, None, Arc::new(pieces))
}

/// Routing attention's sorted chunks by the kernel: queries `q` and keys `k` `[b, h, l, ·]` are 2l
/// routing items sorted by (cluster, position, key before query) — `query_cluster` and
/// `key_cluster` row major over `[b, h, l]` — and a query sees the keys of its cluster among the
/// `span` items before it (causal), or in its chunk of `span` items and the one before. In the
/// sorted order of the keys alone those are one or two ranges of slots, so the kernel takes one
/// piece whose query slots follow the queries' sorted order and whose key slots the keys'. A query
/// that sees no key gets 0. Returns `[b, l, h · d_h]`; `None` off flex.
pub fn routed(
    items: RoutingItems,
    (query_cluster, key_cluster): (&[i64], &[i64]),
    span: usize,
    causal: bool,
) -> Option<Tensor<3>> {
    let (b, h, l) = match &items {
        RoutingItems::Packed { qkv, heads, .. } => (qkv.dims()[0], *heads, qkv.dims()[1]),
        RoutingItems::Heads([q, ..]) => (q.dims()[0], q.dims()[1], q.dims()[2]),
    };
    if !match &items {
        RoutingItems::Packed { qkv, .. } => variorum_kernels::has_kernel(qkv),
        RoutingItems::Heads([q, ..]) => variorum_kernels::has_kernel(q),
    } || l == 0
    {
        return None;
    }
    let rows = b * h;
    let windows = Windows { n: 2 * l, m: span.min(2 * l).max(1), causal };
    // per row: item 2p is position p's key, 2p + 1 its query, so sorting by (cluster, item)
    // sorts by (cluster, position, key first); keys_before[t]: keys among combined slots < t
    let sorted: Vec<(Round, Vec<usize>, Vec<usize>)> = (0..rows)
        .map(|row| {
            let at = |p: usize| row * l + p;
            let cluster: Vec<i64> =
                (0..2 * l).map(|i| if i % 2 == 0 { key_cluster } else { query_cluster }[at(i / 2)]).collect();
            let round = Round::new(&cluster);
            let mut keys_before = Vec::with_capacity(2 * l + 1);
            keys_before.push(0);
            for &item in &round.order {
                keys_before.push(keys_before.last().copied().unwrap_or(0) + usize::from(item % 2 == 0));
            }
            let queries = round.order.iter().filter(|&&i| i % 2 == 1).map(|&i| i / 2).collect();
            (round, keys_before, queries)
        })
        .collect();
    // the key slots query slot `s` of row g sees
    let seen_keys = |g: usize, s: usize, out: &mut Vec<Range<usize>>| {
        let (round, keys_before, queries) = &sorted[g];
        // query slot s: the s-th query of the combined order, at combined slot `at`
        let at = round.rank[2 * queries[s] + 1];
        for w in windows.within(at, &round.bucket[at]) {
            if w.start < w.end && keys_before[w.start] < keys_before[w.end] {
                out.push(keys_before[w.start]..keys_before[w.end]);
            }
        }
    };
    let block = BLOCK.min(l);
    let runs = |g: usize, blk: usize| {
        let mut out = Vec::new();
        for s in blk * block..((blk + 1) * block).min(l) {
            seen_keys(g, s, &mut out);
        }
        out
    };
    let layout = Arc::new(SparseLayout::new(l, l, block, rows, runs, seen_keys));
    let keys =
        sorted.iter().flat_map(|(round, _, _)| round.order.iter().filter(|&&i| i % 2 == 0).map(|&i| (i / 2) as u32));
    let queries = sorted.iter().flat_map(|(_, _, queries)| queries.iter().map(|&p| p as u32));
    let order = Permutation { queries: queries.collect(), keys: keys.collect() };
    let pieces = Arc::new(vec![SparsePiece::permuted(layout, Arc::new(order))]);
    match items {
        RoutingItems::Packed { qkv, heads, scale } => {
            block_sparse_union_self_attention(qkv, (heads, heads), scale, None, pieces)
        }
        RoutingItems::Heads([q, k, v]) => block_sparse_union(q, k, v, None, pieces),
    }
}

/// What [`routed`] reads: the fused projection `[b, l, 3 · h · d_h]`, in place (its gradient
/// handed back whole; scores `scale` · q·k), or separate heads `[b, h, l, d_h]` with the queries
/// scaled (a cache's keys and values).
pub enum RoutingItems {
    Packed { qkv: Tensor<3>, heads: usize, scale: f64 },
    Heads([Tensor<4>; 3]),
}
