//! Which keys a query sees in a band (back, ahead, by blocks), and a sparse pattern made of
//! bands, global positions and gathered keys: the geometry `blocks.rs` computes.

use crate::engine::gathered::KeySet;

/// Which keys a query sees, relative to its own position (or to its block's), and the block size
/// of the computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    /// Keys up to this many positions back (0 = only itself).
    pub back: usize,
    /// Keys up to this many positions ahead (0 for causal attention).
    pub ahead: usize,
    /// Positions per block.
    pub block: usize,
    /// Reach is measured from the query's block rather than the query (Image Transformer local
    /// attention): `back` positions before the block's start, through the block's end plus
    /// `ahead` (the query itself when causal).
    pub query_blocks: bool,
    /// Causal: never a key after the query.
    pub causal: bool,
}

impl Band {
    /// Whether the query at position `q` sees the key at `k`.
    pub fn sees(&self, q: i64, k: i64) -> bool {
        let (first, last) = if self.query_blocks {
            let start = q - q.rem_euclid(self.block as i64);
            (start, start + self.block as i64 - 1)
        } else {
            (q, q)
        };
        let last = if self.causal { q } else { last + self.ahead as i64 };
        k >= first - self.back as i64 && k <= last
    }

    /// Whether every query of a fresh sequence of `len` sees every key causality allows: the
    /// pattern is then plain (causal) full attention. The reach is monotone in the query (a
    /// later query's block starts no earlier), so the farthest pairs decide.
    pub fn covers(&self, len: usize) -> bool {
        let last = len.saturating_sub(1) as i64;
        self.sees(last, 0) && (self.causal || self.sees(0, last))
    }

    /// [`sees`](Self::sees) with keys every `dilation` positions, reach counted in keys.
    pub fn sees_dilated(&self, q: i64, k: i64, dilation: usize) -> bool {
        let d = dilation as i64;
        (q - k) % d == 0 && self.sees(q.div_euclid(d), q.div_euclid(d) - (q - k) / d)
    }

    /// Cached keys a later query may still need: the last this many.
    pub fn keep(&self) -> usize {
        self.back + 1 + if self.query_blocks { self.block - 1 } else { 0 }
    }
}

/// A sparse pattern, all of it in one softmax per query: bands, global positions, and keys
/// gathered per block of queries.
pub struct Pattern<'a> {
    /// Queries per block of the gathered keys (`extra` and global columns).
    pub block: usize,
    /// Bands (several when heads differ in dilation), or none.
    pub bands: &'a [BandPart],
    /// Positions with global attention (Longformer, BigBird): every query also scores the global
    /// keys (as extra columns; the bands leave them out, and `extra` must, so none counts twice),
    /// and each global query's row is computed over all keys it may see: O(L·g) + O(g·L).
    pub global: &'a [usize],
    /// Further keys per block (random blocks, summaries, permuted blocks).
    pub extra: Option<&'a KeySet>,
}

/// One band of a [`Pattern`].
#[derive(Debug, Clone)]
pub struct BandPart {
    /// One band for every head, or one per head (same block).
    pub bands: Vec<Band>,
    /// δ: keys every δ positions (reach counted in keys).
    pub dilation: usize,
    /// The heads that use this band (empty = all).
    pub heads: Vec<bool>,
}

impl BandPart {
    /// One band per distinct dilation among `dilations` (one per head), each masked to its
    /// heads; every distinct δ is one pass over all heads (a position scheme's per-head
    /// parameters need every head present).
    pub fn per_dilation(band: Band, dilations: &[usize]) -> Vec<BandPart> {
        let mut distinct = dilations.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let one = distinct.len() <= 1;
        distinct
            .iter()
            .map(|&d| BandPart {
                bands: vec![band],
                dilation: d,
                heads: if one { Vec::new() } else { dilations.iter().map(|&x| x == d).collect() },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Band;

    #[test]
    fn a_band_covers_a_sequence_exactly_when_its_farthest_pairs_are_seen() {
        let band = |back, ahead, block, query_blocks, causal| Band { back, ahead, block, query_blocks, causal };
        // a window of w keys back (own included): back = w − 1 covers w positions, not w + 1
        assert!(band(9, 0, 4, false, true).covers(10));
        assert!(!band(9, 0, 4, false, true).covers(11));
        // bidirectional: the first query must reach the last key too
        assert!(band(9, 9, 4, false, false).covers(10));
        assert!(!band(9, 8, 4, false, false).covers(10));
        // query blocks of 4 with 3 back: the last block of 8 (4..8) starts at 4 and reaches 1
        assert!(!band(3, 0, 4, true, true).covers(8));
        assert!(band(4, 0, 4, true, true).covers(8));
        // bidirectional query blocks: the first block ends at 3 and reaches 3 + ahead
        assert!(band(4, 4, 4, true, false).covers(8));
        assert!(!band(4, 3, 4, true, false).covers(8));
        // one position is always covered
        assert!(band(0, 0, 1, false, true).covers(1));
    }
}
