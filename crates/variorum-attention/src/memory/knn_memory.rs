//! The Memorizing Transformer's external memory ([`crate::memory::memorizing`]): per batch row and per
//! key/value head, the (key, value) pairs of earlier segments, oldest evicted first, searched
//! for each query's k nearest keys by exact inner product.
//!
//! It lives on the host, outside autodiff: the paper's memory is non-differentiable, and a row's
//! memory is cleared on its own (a new document) while the other rows keep theirs.
//!
//! Why exact search and not the HNSW index the kNN-LM uses (`variorum-retrieval`): this memory
//! changes every segment (a segment's keys go in, the oldest go out, a document start empties
//! it), and an HNSW insert costs about as much as scoring a query against 10k keys (usearch
//! inserted 13k entries/s on this machine, docs/retrieval.md); at the sizes a CPU trains with
//! (≤ 256k per row) the scan needs no index to maintain. It runs on `gemm` (no hand-written
//! matrix product), per (row, head), over chunks of 2,048 keys, keeping the k best per query as
//! it goes.

use rayon::prelude::*;

/// Keys scored per GEMM: the score block stays in cache.
const CHUNK: usize = 2048;

/// One batch row's memory: per head, `len` keys and values of `dim` floats in a ring whose next
/// write goes to slot `next`.
#[derive(Clone, Default)]
struct RowMemory {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    next: usize,
}

/// The memories of a batch: `rows` rows of `heads` heads, at most `capacity` entries each.
#[derive(Clone, Default)]
pub struct KnnMemory {
    heads: usize,
    dim: usize,
    capacity: usize,
    rows: Vec<RowMemory>,
}

impl core::fmt::Debug for KnnMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let lens: Vec<usize> = self.rows.iter().map(|r| r.len).collect();
        write!(
            f,
            "KnnMemory {{ heads: {}, dim: {}, capacity: {}, entries per row: {lens:?} }}",
            self.heads, self.dim, self.capacity
        )
    }
}

/// What a search found for each query: its k nearest keys and their values, `[…, k, dim]`, and
/// whether each of the k slots holds an entry (a memory with fewer than k entries fills the rest
/// with zeros marked invalid).
pub struct Retrieved {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub valid: Vec<bool>,
}

impl KnnMemory {
    /// An empty memory: `rows` batch rows of `heads` heads, each keeping at most `capacity`
    /// entries of `dim` floats.
    pub fn new(rows: usize, heads: usize, dim: usize, capacity: usize) -> Self {
        let row = RowMemory { keys: vec![Vec::new(); heads], values: vec![Vec::new(); heads], len: 0, next: 0 };
        Self { heads, dim, capacity, rows: vec![row; rows] }
    }

    /// The batch rows it holds a memory for.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Whether the memory was made for this shape.
    pub fn fits(&self, rows: usize, heads: usize, dim: usize, capacity: usize) -> bool {
        (self.rows.len(), self.heads, self.dim, self.capacity) == (rows, heads, dim, capacity)
    }

    /// Entries in row `row`'s memory.
    pub fn len(&self, row: usize) -> usize {
        self.rows[row].len
    }

    /// Empties row `row` (its document ended).
    pub fn clear(&mut self, row: usize) {
        let r = &mut self.rows[row];
        r.keys.iter_mut().chain(r.values.iter_mut()).for_each(Vec::clear);
        (r.len, r.next) = (0, 0);
    }

    /// Adds `n` entries to every row: `keys` and `values` are `[rows, heads, n, dim]`. A full
    /// memory drops its oldest entries.
    pub fn push(&mut self, keys: &[f32], values: &[f32], n: usize) {
        let (heads, dim, capacity) = (self.heads, self.dim, self.capacity);
        assert_eq!(keys.len(), self.rows.len() * heads * n * dim, "keys are [rows, heads, n, dim]");
        assert_eq!(values.len(), keys.len(), "values are [rows, heads, n, dim]");
        if capacity == 0 {
            return;
        }
        // of more than `capacity` new entries only the last `capacity` stay
        let skip = n.saturating_sub(capacity);
        for (r, row) in self.rows.iter_mut().enumerate() {
            for h in 0..heads {
                let at = (r * heads + h) * n * dim;
                let mut next = row.next;
                for i in skip..n {
                    let (k, v) = (&keys[at + i * dim..][..dim], &values[at + i * dim..][..dim]);
                    if row.keys[h].len() < capacity * dim {
                        row.keys[h].extend_from_slice(k);
                        row.values[h].extend_from_slice(v);
                    } else {
                        row.keys[h][next * dim..][..dim].copy_from_slice(k);
                        row.values[h][next * dim..][..dim].copy_from_slice(v);
                    }
                    next = (next + 1) % capacity;
                }
            }
            // every head wrote the same slots
            row.next = (row.next + n - skip) % capacity;
            row.len = (row.len + n - skip).min(capacity);
        }
    }

    /// The `k` keys of largest inner product with each query, and their values. `queries` is
    /// `[rows, q_heads, n, dim]`, `q_heads` a multiple of the memory's heads (query heads
    /// `j·g … j·g + g − 1` read head `j`, as grouped-query attention shares them). Returns
    /// `[rows, q_heads, n, k, dim]` keys and values and `[rows, q_heads, n, k]` validity; the
    /// entries of one query come in no particular order.
    pub fn search(&self, queries: &[f32], q_heads: usize, n: usize, k: usize) -> Retrieved {
        let (dim, rows) = (self.dim, self.rows.len());
        assert_eq!(queries.len(), rows * q_heads * n * dim, "queries are [rows, q_heads, n, dim]");
        assert!(self.heads > 0 && q_heads % self.heads == 0, "query heads share the memory's heads");
        let g = q_heads / self.heads;
        let per_head = g * n; // queries of one (row, memory head)
        // the best ids of every query, searched per (row, memory head) on the rayon pool
        let found: Vec<Vec<Vec<u32>>> = (0..rows * self.heads)
            .into_par_iter()
            .map(|rh| {
                let (r, h) = (rh / self.heads, rh % self.heads);
                let q = &queries[rh * per_head * dim..][..per_head * dim];
                top_k(q, &self.rows[r].keys[h], dim, per_head, self.rows[r].len, k)
            })
            .collect();
        let mut out = Retrieved {
            keys: vec![0.0; rows * q_heads * n * k * dim],
            values: vec![0.0; rows * q_heads * n * k * dim],
            valid: vec![false; rows * q_heads * n * k],
        };
        for (rh, ids) in found.iter().enumerate() {
            let (r, h) = (rh / self.heads, rh % self.heads);
            let (keys, values) = (&self.rows[r].keys[h], &self.rows[r].values[h]);
            for (qi, best) in ids.iter().enumerate() {
                // query qi of this group is query (head j·g + qi / n, position qi % n)
                let slot = (rh * per_head + qi) * k;
                for (s, &id) in best.iter().enumerate() {
                    let (from, to) = (id as usize * dim, (slot + s) * dim);
                    out.keys[to..to + dim].copy_from_slice(&keys[from..from + dim]);
                    out.values[to..to + dim].copy_from_slice(&values[from..from + dim]);
                    out.valid[slot + s] = true;
                }
            }
        }
        out
    }
}

/// Ids of the (at most) `k` keys among `keys[..len · dim]` of largest inner product with each of
/// the `m` queries `q` (`[m, dim]`).
fn top_k(q: &[f32], keys: &[f32], dim: usize, m: usize, len: usize, k: usize) -> Vec<Vec<u32>> {
    let k = k.min(len);
    let mut best: Vec<Vec<(f32, u32)>> = vec![Vec::with_capacity(k); m];
    if k == 0 {
        return vec![Vec::new(); m];
    }
    let mut scores = vec![0.0f32; m * CHUNK];
    for start in (0..len).step_by(CHUNK) {
        let c = CHUNK.min(len - start);
        let block = &keys[start * dim..(start + c) * dim];
        // scores[i, j] = q_i · key_{start + j}: [m, dim] × [dim, c], keys read transposed
        // SAFETY: the strides describe `q` as m × dim and `block` (c × dim, row-major) as its
        // transpose, dim × c; `scores` holds m × c at row stride c. All three are in bounds.
        unsafe {
            gemm::gemm(
                m,
                c,
                dim,
                scores.as_mut_ptr(),
                1,
                c as isize,
                false,
                q.as_ptr(),
                1,
                dim as isize,
                block.as_ptr(),
                dim as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        for (i, b) in best.iter_mut().enumerate() {
            let row = &scores[i * c..(i + 1) * c];
            // the first k fill the list; then a score must beat the weakest kept one (`floor`)
            let filled = (k - b.len()).min(c);
            b.extend(row[..filled].iter().enumerate().map(|(j, &s)| (s, (start + j) as u32)));
            if b.len() < k {
                continue;
            }
            let mut floor = weakest(b).1;
            for (g, group) in row[filled..].chunks(16).enumerate() {
                // most groups hold no score above the floor: one branch-free pass tells
                if !group.iter().fold(false, |any, &s| any | (s > floor)) {
                    continue;
                }
                for (j, &s) in group.iter().enumerate() {
                    if s > floor {
                        let (w, _) = weakest(b);
                        b[w] = (s, (start + filled + g * 16 + j) as u32);
                        floor = weakest(b).1;
                    }
                }
            }
        }
    }
    best.into_iter().map(|b| b.into_iter().map(|(_, id)| id).collect()).collect()
}

/// Index and score of the lowest-scoring entry.
fn weakest(b: &[(f32, u32)]) -> (usize, f32) {
    b.iter().enumerate().fold((0, f32::INFINITY), |acc, (i, &(s, _))| if s < acc.1 { (i, s) } else { acc })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// The search returns exactly the brute-force k best keys (as sets, with their values),
    /// across chunk boundaries, grouped query heads and rows with fewer than k entries.
    #[test]
    fn search_finds_the_brute_force_neighbours() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (rows, heads, q_heads, dim, n, k) = (2, 2, 4, 8, 5, 7);
        let mut mem = KnnMemory::new(rows, heads, dim, 5000);
        // two pushes: row memory spans more than one GEMM chunk
        for _ in 0..2 {
            let keys = random(rows * heads * 1500 * dim, &mut rng);
            let values: Vec<f32> = keys.iter().map(|x| x * 2.0).collect();
            mem.push(&keys, &values, 1500);
        }
        mem.clear(1);
        mem.push(&random(rows * heads * 3 * dim, &mut rng), &random(rows * heads * 3 * dim, &mut rng), 3);
        assert_eq!((mem.len(0), mem.len(1)), (3003, 3));
        let queries = random(rows * q_heads * n * dim, &mut rng);
        let got = mem.search(&queries, q_heads, n, k);
        for r in 0..rows {
            for qh in 0..q_heads {
                let h = qh / (q_heads / heads);
                let keys = &mem.rows[r].keys[h];
                for i in 0..n {
                    let q = &queries[((r * q_heads + qh) * n + i) * dim..][..dim];
                    let dot = |id: usize| keys[id * dim..][..dim].iter().zip(q).map(|(a, b)| a * b).sum::<f32>();
                    let mut all: Vec<(f32, usize)> = (0..mem.len(r)).map(|id| (dot(id), id)).collect();
                    all.sort_by(|a, b| b.0.total_cmp(&a.0));
                    let slot = ((r * q_heads + qh) * n + i) * k;
                    let want = k.min(mem.len(r));
                    assert_eq!(got.valid[slot..slot + k].iter().filter(|&&v| v).count(), want);
                    let mut found: Vec<f32> = (0..want)
                        .map(|s| got.keys[(slot + s) * dim..][..dim].iter().zip(q).map(|(a, b)| a * b).sum())
                        .collect();
                    found.sort_by(|a, b| b.total_cmp(a));
                    for (f, (w, _)) in found.iter().zip(&all) {
                        assert!((f - w).abs() < 1e-4, "row {r} head {qh} query {i}: {f} against {w}");
                    }
                }
            }
        }
    }

    /// A full memory keeps the newest `capacity` entries.
    #[test]
    fn a_full_memory_evicts_the_oldest_entries() {
        let mut mem = KnnMemory::new(1, 1, 1, 4);
        let push = |mem: &mut KnnMemory, from: usize, n: usize| {
            let keys: Vec<f32> = (from..from + n).map(|i| i as f32).collect();
            mem.push(&keys, &keys, n);
        };
        push(&mut mem, 0, 3);
        push(&mut mem, 3, 3);
        let mut kept = mem.rows[0].keys[0].clone();
        kept.sort_by(f32::total_cmp);
        assert_eq!(kept, vec![2.0, 3.0, 4.0, 5.0]);
        push(&mut mem, 6, 9);
        let mut kept = mem.rows[0].keys[0].clone();
        kept.sort_by(f32::total_cmp);
        assert_eq!(kept, vec![11.0, 12.0, 13.0, 14.0]);
        assert_eq!(mem.len(0), 4);
    }
}
