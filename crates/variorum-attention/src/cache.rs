//! Key/value cache for incremental decoding with score-forming attention.
//!
//! Keys and values live in buffers with room to grow (capacity doubling), and new entries are
//! written in place: appending one token costs O(its size), not a copy of the whole cache as
//! concatenation would (at 16k cached tokens that copy dominated decoding for every kind that
//! keeps its cache). Burn's CPU backends write a `slice_assign` in place when the buffer is
//! uniquely owned, which it is again once the previous step's views are dropped. Dropped
//! entries only move the start of the live range; the buffer is compacted when the dead front
//! outgrows the live part.

use burn::prelude::*;

/// Keys and values of every position seen so far, `[batch, n_kv_heads, len, head_dim]` — or of
/// the positions since `start`, when a mechanism that never looks further back (a window, a
/// span) has dropped the older ones.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// `[batch, n_kv_heads, capacity, head_dim]`; live entries at `offset..offset + len`.
    k: Option<Tensor<4>>,
    v: Option<Tensor<4>>,
    offset: usize,
    len: usize,
    /// Entries dropped from the front: the first cached key sits at position `start`.
    pub start: usize,
    /// Per batch row, positions a mechanism keeps flagged across calls (Longformer's global
    /// tokens chosen by id: later queries must still see them).
    pub marked: Vec<Vec<usize>>,
    /// Per cached position, host-side labels a mechanism decodes from (LSH buckets, routing
    /// clusters), flattened over batch rows and heads.
    pub tags: Vec<Vec<i64>>,
    /// Keys and values a mechanism derived for one block and reuses for its every token
    /// (Sinkhorn's sorted block), with that block's index.
    pub block_keys: Option<(usize, Tensor<4>, Tensor<4>)>,
}

impl KvCache {
    /// The number of live entries (cached and not dropped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the `n` oldest entries (at most all of them).
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.offset += n;
        self.len -= n;
        self.start += n;
    }

    /// The live keys and values, `[batch, n_kv_heads, len, head_dim]` (views of the buffers).
    pub fn get(&self) -> Option<(Tensor<4>, Tensor<4>)> {
        let (k, v) = (self.k.as_ref()?, self.v.as_ref()?);
        Some((k.clone().narrow(2, self.offset, self.len), v.clone().narrow(2, self.offset, self.len)))
    }

    /// The whole buffers `[batch, n_kv_heads, capacity, ·]` and the index of the first live
    /// entry: a gather of a few entries reads them in place, where a gather from the live views
    /// of [`get`](Self::get) would first copy the whole cache into one contiguous block.
    pub fn buffers(&self) -> Option<(Tensor<4>, Tensor<4>, usize)> {
        Some((self.k.clone()?, self.v.clone()?, self.offset))
    }

    /// Appends the new keys/values and returns all of them.
    pub fn append(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let n = k.dims()[2];
        let needed = self.len + n;
        let capacity = self.k.as_ref().map_or(0, |b| b.dims()[2]);
        if self.offset + needed > capacity {
            // grow to twice what is needed, the live entries moved to the front
            let (live, offset) = (self.len, self.offset);
            let grow = |buffer: Option<Tensor<4>>, like: &Tensor<4>| {
                let [b, h, _, d] = like.dims();
                let fresh = Tensor::zeros([b, h, (2 * needed).max(16), d], &like.device());
                match buffer {
                    Some(old) if live > 0 => {
                        fresh.slice_assign([0..b, 0..h, 0..live, 0..d], old.narrow(2, offset, live))
                    }
                    _ => fresh,
                }
            };
            self.k = Some(grow(self.k.take(), &k));
            self.v = Some(grow(self.v.take(), &v));
            self.offset = 0;
        }
        let at = self.offset + self.len;
        // keys and values may differ in their last size (low-rank keys)
        let write = |buffer: Option<Tensor<4>>, x: Tensor<4>| {
            let [b, h, _, d] = x.dims();
            buffer.map(|buffer| buffer.slice_assign([0..b, 0..h, at..at + n, 0..d], x))
        };
        self.k = write(self.k.take(), k);
        self.v = write(self.v.take(), v);
        self.len = needed;
        self.get().expect("buffers exist after an append")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// Appends in chunks of several sizes, with drops from the front in between, give what
    /// concatenating and narrowing give.
    #[test]
    fn appends_and_drops_equal_concatenation() {
        let dev = Device::flex();
        let x: Tensor<4> = Tensor::random([2, 3, 100, 4], Distribution::Normal(0.0, 1.0), &dev);
        let mut cache = KvCache::default();
        let (mut at, mut first) = (0, 0);
        for (step, n) in [5, 1, 1, 17, 1, 30, 2, 1, 40].into_iter().enumerate() {
            let chunk = x.clone().narrow(2, at, n);
            let (k, v) = cache.append(chunk.clone(), chunk.mul_scalar(2.0));
            at += n;
            let want = x.clone().narrow(2, first, at - first);
            assert_eq!(k.dims()[2], at - first);
            assert!((k - want.clone()).abs().max().into_scalar::<f32>() == 0.0, "step {step}");
            assert!((v - want.mul_scalar(2.0)).abs().max().into_scalar::<f32>() == 0.0, "step {step}");
            if step % 3 == 2 {
                let drop = cache.len() / 2;
                cache.drop_front(drop);
                first += drop;
                assert_eq!(cache.start, first);
            }
        }
        assert_eq!(cache.len(), at - first);
    }
}
