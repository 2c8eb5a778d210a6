//! Key/value cache for incremental decoding with score-forming attention.

use burn::prelude::*;

/// Keys and values of every position seen so far, `[batch, n_kv_heads, len, head_dim]` — or of
/// the positions since `start`, when a mechanism that never looks further back (adaptive span)
/// has dropped the older ones.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub k: Option<Tensor<4>>,
    pub v: Option<Tensor<4>>,
    /// Entries dropped from the front: the first cached key sits at position `start`.
    pub start: usize,
    /// Per batch row, positions a mechanism keeps flagged across calls (Longformer's global
    /// tokens chosen by id: later queries must still see them).
    pub marked: Vec<Vec<usize>>,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dims()[2])
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the `n` oldest entries (at most all of them).
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == 0 {
            return;
        }
        let keep = self.len() - n;
        self.k = self.k.take().map(|k| k.narrow(2, n, keep));
        self.v = self.v.take().map(|v| v.narrow(2, n, keep));
        self.start += n;
    }

    /// Appends the new keys/values and returns all of them.
    pub fn append(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let k = match self.k.take() {
            Some(old) => Tensor::cat(vec![old, k], 2),
            None => k,
        };
        let v = match self.v.take() {
            Some(old) => Tensor::cat(vec![old, v], 2),
            None => v,
        };
        self.k = Some(k.clone());
        self.v = Some(v.clone());
        (k, v)
    }
}
