//! Nearest neighbours by squared Euclidean distance: exact search over all keys (the reference
//! every index is measured against), and the HNSW index's options.
//!
//! Both take a causal bound per query: `before = Some(b)` admits only entries with id `< b`, so a
//! datastore built over the text being scored never hands a position its own continuation or
//! anything after it (entry ids follow the text's order).

use rayon::prelude::*;

/// One retrieved entry: its id (its row in the datastore) and squared L2 distance to the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    /// The entry's id: its row in the datastore.
    pub id: u64,
    /// Squared L2 distance to the query.
    pub distance: f32,
}

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    /// Every key is compared: the true nearest neighbours.
    Exact,
    /// The HNSW index, exploring `ef` candidates per query (usearch's `expansion_search`; at
    /// least `k` are explored).
    Approximate {
        /// Candidates explored per query.
        ef: usize,
    },
}

/// Squared Euclidean distance.
#[inline]
pub fn l2sq(a: &[f32], b: &[f32]) -> f32 {
    // eight partial sums: the compiler vectorises this loop; a single running sum it cannot
    let mut acc = [0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for i in 0..8 {
            let d = x[i] - y[i];
            acc[i] += d * d;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += (x - y) * (x - y);
    }
    s
}

/// The `k` nearest of a growing stream of candidates, kept sorted by (distance, id).
struct TopK {
    k: usize,
    items: Vec<Neighbour>,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self { k, items: Vec::with_capacity(k + 1) }
    }

    #[inline]
    fn worst(&self) -> f32 {
        if self.items.len() < self.k { f32::INFINITY } else { self.items[self.k - 1].distance }
    }

    #[inline]
    fn offer(&mut self, id: u64, distance: f32) {
        if self.k == 0 || distance > self.worst() {
            return;
        }
        let at = self.items.partition_point(|n| (n.distance, n.id) < (distance, id));
        if at < self.k {
            self.items.insert(at, Neighbour { id, distance });
            self.items.truncate(self.k);
        }
    }
}

/// Queries compared against the keys together, so that each key is read once per block.
const QUERY_BLOCK: usize = 16;

/// Exact `k` nearest neighbours of each query (`queries`: rows of `dim`) among `keys` (rows of
/// `dim`; entry id = row), nearest first, ties broken by id. `before[i]` bounds query `i`'s ids
/// (empty: no bound). Runs on the current rayon pool.
pub fn exact(keys: &[f32], dim: usize, queries: &[f32], k: usize, before: &[Option<u64>]) -> Vec<Vec<Neighbour>> {
    let bound = |q: usize| before.get(q).copied().flatten().unwrap_or(u64::MAX);
    exact_where(keys, dim, queries, k, |q, id| id < bound(q))
}

/// [`exact`] admitting, for query `q`, the entries `id` with `admit(q, id)`.
pub fn exact_where(
    keys: &[f32],
    dim: usize,
    queries: &[f32],
    k: usize,
    admit: impl Fn(usize, u64) -> bool + Sync,
) -> Vec<Vec<Neighbour>> {
    assert!(dim > 0 && keys.len() % dim == 0 && queries.len() % dim == 0, "rows of {dim} values");
    let n = queries.len() / dim;
    let blocks: Vec<Vec<Vec<Neighbour>>> = (0..n.div_ceil(QUERY_BLOCK))
        .into_par_iter()
        .map(|b| {
            let qs = b * QUERY_BLOCK..((b + 1) * QUERY_BLOCK).min(n);
            let mut tops: Vec<TopK> = qs.clone().map(|_| TopK::new(k)).collect();
            for (id, key) in keys.chunks_exact(dim).enumerate() {
                let id = id as u64;
                for (top, q) in tops.iter_mut().zip(qs.clone()) {
                    if admit(q, id) {
                        top.offer(id, l2sq(key, &queries[q * dim..(q + 1) * dim]));
                    }
                }
            }
            tops.into_iter().map(|t| t.items).collect()
        })
        .collect();
    blocks.into_iter().flatten().collect()
}

/// The HNSW index's build settings (usearch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HnswParams {
    /// Links per node (HNSW's M).
    pub connectivity: usize,
    /// Candidates explored while inserting (HNSW's efConstruction).
    pub expansion_add: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        // usearch's defaults; docs/retrieval.md measures recall with them
        Self { connectivity: 16, expansion_add: 128 }
    }
}

impl HnswParams {
    pub(crate) fn options(&self, dim: usize) -> usearch::IndexOptions {
        usearch::IndexOptions {
            dimensions: dim,
            metric: usearch::MetricKind::L2sq,
            quantization: usearch::ScalarKind::F32,
            connectivity: self.connectivity,
            expansion_add: self.expansion_add,
            expansion_search: 64,
            multi: false,
        }
    }

    /// Bytes the index takes in memory for `n` keys of `dim` values (vectors, the base layer's
    /// links, the upper layers' share and usearch's per-node header), an upper bound used to
    /// refuse a build that cannot fit.
    pub fn memory_estimate(&self, n: u64, dim: usize) -> u64 {
        n * (dim as u64 * 4 + self.connectivity as u64 * 2 * 4 * 5 / 4 + 32)
    }
}

/// Recall@k of `found` against the exact `truth`: the share of the true k nearest that were
/// found, where a found entry as near as the k-th true one counts (entries at equal distance are
/// interchangeable: identical contexts give identical keys, and exact search breaks the tie by
/// id where an index breaks it any way). Distances are compared with a relative tolerance of
/// 1e-4, since the index computes them with its own kernels.
pub fn recall(truth: &[Vec<Neighbour>], found: &[Vec<Neighbour>]) -> f64 {
    let (mut hit, mut total) = (0usize, 0usize);
    for (t, f) in truth.iter().zip(found) {
        let Some(kth) = t.last() else { continue };
        let limit = kth.distance + 1e-4 * kth.distance.abs() + 1e-6;
        total += t.len();
        hit += f.iter().filter(|n| n.distance <= limit).count().min(t.len());
    }
    if total == 0 { 1.0 } else { hit as f64 / total as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        (0..n * dim).map(|_| r.random::<f32>() * 2.0 - 1.0).collect()
    }

    /// The definition, one query at a time, in f64: every distance, sorted.
    fn brute_force(keys: &[f32], dim: usize, q: &[f32], k: usize, before: u64) -> Vec<u64> {
        let mut all: Vec<(f64, u64)> = keys
            .chunks(dim)
            .enumerate()
            .filter(|(i, _)| (*i as u64) < before)
            .map(|(i, x)| (x.iter().zip(q).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum(), i as u64))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        all.into_iter().take(k).map(|x| x.1).collect()
    }

    #[test]
    fn exact_search_equals_brute_force() {
        let (n, dim, k) = (3000, 24, 10);
        let keys = random(n, dim, 1);
        let queries = random(70, dim, 2);
        let before: Vec<Option<u64>> = (0..70).map(|i| (i % 3 == 0).then_some(i as u64 * 40)).collect();
        let got = exact(&keys, dim, &queries, k, &before);
        for (i, q) in queries.chunks(dim).enumerate() {
            let want = brute_force(&keys, dim, q, k, before[i].unwrap_or(u64::MAX));
            let ids: Vec<u64> = got[i].iter().map(|n| n.id).collect();
            assert_eq!(ids, want, "query {i}");
            for n in &got[i] {
                let d = l2sq(&keys[n.id as usize * dim..(n.id as usize + 1) * dim], q);
                assert_eq!(n.distance, d);
            }
        }
        // the bound admits only earlier entries, and fewer than k where there are fewer
        assert!(got[0].is_empty(), "query 0 may see nothing before entry 0");
        assert_eq!(got[3].len(), k);
        assert!(got[3].iter().all(|n| n.id < 120));
    }

    #[test]
    fn recall_counts_ties_and_misses() {
        let nb = |id, distance| Neighbour { id, distance };
        let truth = vec![vec![nb(0, 1.0), nb(1, 2.0), nb(2, 2.0)]];
        // entry 5 ties with the third true neighbour: as good a result
        assert_eq!(recall(&truth, &[vec![nb(0, 1.0), nb(1, 2.0), nb(5, 2.0)]]), 1.0);
        // entry 6 is farther: a miss
        assert!((recall(&truth, &[vec![nb(0, 1.0), nb(1, 2.0), nb(6, 2.5)]]) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(recall(&truth, &[vec![]]), 0.0);
    }

    #[test]
    fn l2sq_is_the_squared_distance() {
        for dim in [1, 7, 8, 9, 33] {
            let a = random(1, dim, 3);
            let b = random(1, dim, 4);
            let want: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
            assert!((l2sq(&a, &b) - want).abs() <= 1e-5 * want.max(1.0), "dim {dim}");
        }
    }
}
