//! Mask descriptions of the attention contract.
//!
//! Positions are absolute: query i sits at `q_start + i`, key j at `k_start + j`. With a KV cache
//! or a Transformer-XL memory the keys start earlier than the queries, and causality is
//! `key position <= query position`, whatever the lengths.

use std::sync::Arc;

use burn::prelude::*;

/// What may attend to what. Built once per forward pass and shared by every layer.
#[derive(Debug, Clone)]
pub struct AttentionMask {
    /// Keys after the query's own position are hidden.
    pub causal: bool,
    /// Absolute position of the first query.
    pub q_start: usize,
    /// Absolute position of the first key.
    pub k_start: usize,
    /// `[batch, len_k]`, `true` = padding key (hidden from every query).
    pub padding: Option<Tensor<2, Bool>>,
    /// `[batch or 1, len_q, len_k]`, `true` = hidden: any extra pattern a model wants.
    pub custom: Option<Tensor<3, Bool>>,
    /// Per batch row, the absolute positions of this call's queries that hold a global token
    /// (chosen by token id, Longformer): mechanisms with global attention let them see every
    /// key and be seen by every query; the others ignore them.
    pub global: Option<Vec<Vec<usize>>>,
    /// A query sees no key more than this many positions before it ("attend at most N back",
    /// `model.max_back`).
    pub max_back: Option<usize>,
    /// ETC's two inputs in this call (set by a model whose attention is global–local); `None`
    /// = long tokens only.
    pub global_local: Option<GlobalLocal>,
    /// `[batch]`: each row's example tag (`data.tags`: the play or corpus a window comes from),
    /// for kinds conditioned on it (the task prior). `None` = untagged, tag 0 for every row.
    /// Not a restriction like the fields above, but like them a fact about this forward's rows
    /// that every layer reads.
    pub tags: Option<Tensor<1, Int>>,
    /// Each row's graph (`data.graph`: edges given with the example): a position reads only its
    /// neighbours and itself. Set on a fresh forward over whole examples (positions from 0, no
    /// cache or memory); [`Self::score_mask`] hides every non-edge, and kinds that read the
    /// neighbour lists (`graph`) gather them instead.
    pub graph: Option<GraphMask>,
    /// An encoder–decoder's encoded source: what every decoder block's cross-attention reads
    /// (queries from the decoder, keys and values from these rows). Like the tags, a fact about
    /// this forward's rows that every layer reads; self-attention ignores it.
    pub source: Option<EncodedSource>,
}

/// The encoder's output for each batch row, `[batch, len_source, d_model]`, with the source's
/// padding (`[batch, len_source]`, true = a padded position, hidden from cross-attention).
#[derive(Debug, Clone)]
pub struct EncodedSource {
    /// The encoder's output, `[batch, len_source, d_model]`.
    pub hidden: Tensor<3>,
    /// `[batch, len_source]`, `true` = a padded source position.
    pub padding: Option<Tensor<2, Bool>>,
}

impl EncodedSource {
    /// The mask cross-attention reads it under: every query sees every source row but padding.
    pub fn mask(&self) -> AttentionMask {
        AttentionMask { padding: self.padding.clone(), ..AttentionMask::bidirectional() }
    }
}

/// The per-example graphs of a batch (`data.graph`): for every row and position, the positions
/// it reads besides itself (ascending). A position always reads itself (GAT's Â = A + I);
/// positions past a row's example (padding) read only themselves and are read by none.
#[derive(Clone)]
pub struct GraphMask {
    rows: Vec<Arc<Vec<Vec<u32>>>>,
}

impl std::fmt::Debug for GraphMask {
    /// Its shape, not every adjacency list.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lens: Vec<usize> = self.rows.iter().map(|r| r.len()).collect();
        f.debug_struct("GraphMask").field("row_lengths", &lens).finish()
    }
}

impl GraphMask {
    /// One adjacency list per batch row: `rows[r][i]` = what position i of row r reads.
    pub fn new(rows: Vec<Arc<Vec<Vec<u32>>>>) -> Self {
        Self { rows }
    }

    /// The adjacency lists, one per batch row (as given to [`new`](Self::new)).
    pub fn rows(&self) -> &[Arc<Vec<Vec<u32>>>] {
        &self.rows
    }

    /// What position `i` of row `r` reads in a sequence of `len`: itself, then its neighbours
    /// (`causal`: those not after it; `max_back`: those at most that far back).
    pub fn reads(&self, r: usize, i: usize, len: usize, causal: bool, max_back: Option<usize>) -> Vec<u32> {
        let mut out = vec![i as u32];
        if let Some(list) = self.rows[r].get(i) {
            out.extend(list.iter().copied().filter(|&j| {
                let j = j as usize;
                j != i && j < len && !(causal && j > i) && max_back.is_none_or(|m| j + m >= i)
            }));
        }
        out
    }

    /// `[batch, len, degree]` neighbour slots (each position's [`reads`](Self::reads), padded)
    /// and `[batch, len, degree]`, true for an empty slot.
    pub fn neighbours(
        &self,
        len: usize,
        causal: bool,
        max_back: Option<usize>,
        device: &Device,
    ) -> (Tensor<3, Int>, Tensor<3, Bool>) {
        let b = self.rows.len();
        let lists: Vec<Vec<u32>> = (0..b)
            .flat_map(|r| (0..len).map(move |i| (r, i)))
            .map(|(r, i)| self.reads(r, i, len, causal, max_back))
            .collect();
        let degree = lists.iter().map(Vec::len).max().unwrap_or(1);
        let mut at = vec![0i64; b * len * degree];
        let mut empty = vec![true; b * len * degree];
        for (q, list) in lists.iter().enumerate() {
            for (s, &j) in list.iter().enumerate() {
                at[q * degree + s] = i64::from(j);
                empty[q * degree + s] = false;
            }
        }
        (
            Tensor::from_data(TensorData::new(at, [b, len, degree]), device),
            Tensor::from_data(TensorData::new(empty, [b, len, degree]), device),
        )
    }

    /// `[batch, len, len]`, true where position i does not read position j (the dense form).
    pub fn hidden(&self, len: usize, device: &Device) -> Tensor<3, Bool> {
        let b = self.rows.len();
        let mut hidden = vec![true; b * len * len];
        for r in 0..b {
            for i in 0..len {
                for j in self.reads(r, i, len, false, None) {
                    hidden[(r * len + i) * len + j as usize] = false;
                }
            }
        }
        Tensor::from_data(TensorData::new(hidden, [b, len, len]), device)
    }
}

/// Where ETC's global (auxiliary) tokens are in a call's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalLocal {
    /// `globals` auxiliary tokens, one per segment from the first, in front of the long tokens.
    Prefixed {
        /// How many auxiliary tokens lead the input.
        globals: usize,
    },
    /// The auxiliary token of `segment` alone (decoding, once the segment is complete).
    Auxiliary {
        /// The segment's index (from 0).
        segment: usize,
    },
}

impl AttentionMask {
    /// Causal self-attention over a fresh sequence.
    pub fn causal() -> Self {
        Self {
            causal: true,
            q_start: 0,
            k_start: 0,
            padding: None,
            custom: None,
            global: None,
            max_back: None,
            global_local: None,
            tags: None,
            graph: None,
            source: None,
        }
    }

    /// No restriction (encoders, cross-attention).
    pub fn bidirectional() -> Self {
        Self {
            causal: false,
            q_start: 0,
            k_start: 0,
            padding: None,
            custom: None,
            global: None,
            max_back: None,
            global_local: None,
            tags: None,
            graph: None,
            source: None,
        }
    }

    /// Queries start at absolute position `q_start`, keys at `k_start`.
    pub fn at(mut self, q_start: usize, k_start: usize) -> Self {
        self.q_start = q_start;
        self.k_start = k_start;
        self
    }

    /// Padding keys (see [`Self::padding`]).
    pub fn with_padding(mut self, padding: Tensor<2, Bool>) -> Self {
        self.padding = Some(padding);
        self
    }

    /// An extra pattern of hidden entries (see [`Self::custom`]).
    pub fn with_custom(mut self, custom: Tensor<3, Bool>) -> Self {
        self.custom = Some(custom);
        self
    }

    /// At most `n` positions back (see [`Self::max_back`]).
    pub fn with_max_back(mut self, n: Option<usize>) -> Self {
        self.max_back = n;
        self
    }

    /// Each row's example tag (see [`Self::tags`]).
    pub fn with_tags(mut self, tags: Option<Tensor<1, Int>>) -> Self {
        self.tags = tags;
        self
    }

    /// Each row's graph (see [`Self::graph`]).
    pub fn with_graph(mut self, graph: Option<GraphMask>) -> Self {
        self.graph = graph;
        self
    }

    /// Global-token positions per batch row (see [`Self::global`]).
    pub fn with_global(mut self, global: Vec<Vec<usize>>) -> Self {
        self.global = Some(global);
        self
    }

    /// The hidden entries of a `[batch, heads, len_q, len_k]` score matrix as a broadcastable
    /// `[batch or 1, 1, len_q, len_k]` boolean tensor (`true` = hidden), or `None` when nothing
    /// is hidden.
    pub fn score_mask(&self, len_q: usize, len_k: usize, device: &Device) -> Option<Tensor<4, Bool>> {
        let mut mask: Option<Tensor<3, Bool>> = None;
        if self.causal && self.k_start + len_k > self.q_start + 1 {
            // hidden where k_start + j > q_start + i, i.e. j - i > q_start - k_start
            let offset = self.q_start as i64 - self.k_start as i64;
            let m = Tensor::<2, Bool>::tril_mask([len_q, len_k], offset, device);
            mask = Some(m.unsqueeze_dim(0));
        }
        if let Some(n) = self.max_back
            && len_q > 0
            && (self.q_start + len_q - 1) as i64 - self.k_start as i64 > n as i64
        {
            // hidden where (q_start + i) − (k_start + j) > n, i.e. j − i < q_start − k_start − n
            let offset = self.q_start as i64 - self.k_start as i64 - n as i64;
            let far = Tensor::<2, Bool>::triu_mask([len_q, len_k], offset, device).unsqueeze_dim::<3>(0);
            mask = Some(match mask {
                Some(m) => m.bool_or(far),
                None => far,
            });
        }
        if let Some(pad) = &self.padding {
            let [b, lk] = pad.dims();
            debug_assert_eq!(lk, len_k, "padding mask length");
            let p = pad.clone().reshape([b, 1, lk]).expand([b, len_q, lk]);
            mask = Some(match mask {
                Some(m) => m.expand([b, len_q, len_k]).bool_or(p),
                None => p,
            });
        }
        if let Some(c) = &self.custom {
            mask = Some(match mask {
                Some(m) => {
                    let b = m.dims()[0].max(c.dims()[0]);
                    m.expand([b, len_q, len_k]).bool_or(c.clone().expand([b, len_q, len_k]))
                }
                None => c.clone(),
            });
        }
        if let Some(g) = &self.graph {
            assert!(
                self.q_start == 0 && self.k_start == 0 && len_q == len_k,
                "a graph mask covers whole examples from position 0 (no cache or memory)"
            );
            let h = g.hidden(len_q, device);
            mask = Some(match mask {
                Some(m) => {
                    let b = m.dims()[0].max(h.dims()[0]);
                    m.expand([b, len_q, len_k]).bool_or(h.expand([b, len_q, len_k]))
                }
                None => h,
            });
        }
        mask.map(|m| m.unsqueeze_dim(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hidden(m: Tensor<4, Bool>) -> Vec<bool> {
        m.into_data().try_to_vec::<bool>().unwrap()
    }

    #[test]
    fn causal_hides_future_keys_only() {
        let dev = Device::flex();
        let m = AttentionMask::causal().score_mask(3, 3, &dev).unwrap();
        #[rustfmt::skip]
        let want = vec![false, true, true,
                        false, false, true,
                        false, false, false];
        assert_eq!(hidden(m), want);
    }

    #[test]
    fn causal_with_longer_keys_uses_absolute_positions() {
        // two cached keys at positions 0,1; queries at 2,3; keys 0..4
        let dev = Device::flex();
        let m = AttentionMask::causal().at(2, 0).score_mask(2, 4, &dev).unwrap();
        #[rustfmt::skip]
        let want = vec![false, false, false, true,
                        false, false, false, false];
        assert_eq!(hidden(m), want);
        // one query at the end of the keys sees everything: no mask at all
        assert!(AttentionMask::causal().at(3, 0).score_mask(1, 4, &dev).is_none());
    }

    #[test]
    fn max_back_hides_keys_further_back() {
        // queries at 3, 4 over keys 1..6, at most 2 back: query 3 sees 1..=3, query 4 sees 2..=4
        let dev = Device::flex();
        let m = AttentionMask::causal().at(3, 1).with_max_back(Some(2)).score_mask(2, 5, &dev).unwrap();
        #[rustfmt::skip]
        let want = vec![false, false, false, true, true,
                        true, false, false, false, true];
        assert_eq!(hidden(m), want);
        let m = AttentionMask::bidirectional().with_max_back(Some(1)).score_mask(3, 3, &dev).unwrap();
        #[rustfmt::skip]
        let want = vec![false, false, false,
                        false, false, false,
                        true, false, false];
        assert_eq!(hidden(m), want);
    }

    #[test]
    fn graph_hides_non_edges_and_lists_neighbours() {
        // row 0: 0 reads 2, 2 reads 0 and 1; row 1 is one token long (position 1, 2 padding)
        let dev = Device::flex();
        let g = GraphMask::new(vec![Arc::new(vec![vec![2], vec![], vec![0, 1]]), Arc::new(vec![vec![]])]);
        let m = AttentionMask::causal().with_graph(Some(g.clone())).score_mask(3, 3, &dev).unwrap();
        #[rustfmt::skip]
        let want = vec![false, true, true,    // 0 reads 2 only in the future: hidden
                        true, false, true,
                        false, false, false,
                        false, true, true,
                        true, false, true,    // padding reads itself only
                        true, true, false];
        assert_eq!(hidden(m), want);
        let (at, empty) = g.neighbours(3, false, None, &dev);
        assert_eq!(at.dims(), [2, 3, 3]);
        let at = at.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        let empty = empty.into_data().try_to_vec::<bool>().unwrap();
        let slots: Vec<Vec<i64>> =
            (0..6).map(|q| (0..3).filter(|&s| !empty[q * 3 + s]).map(|s| at[q * 3 + s]).collect()).collect();
        assert_eq!(slots, vec![vec![0, 2], vec![1], vec![2, 0, 1], vec![0], vec![1], vec![2]]);
        assert_eq!(g.reads(0, 2, 3, false, Some(1)), vec![2, 1], "max_back 1 drops position 0");
    }

    #[test]
    fn padding_combines_with_causal() {
        let dev = Device::flex();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![true, false], [1, 2]), &dev);
        let m = AttentionMask::causal().with_padding(pad).score_mask(2, 2, &dev).unwrap();
        assert_eq!(hidden(m), vec![true, true, true, false]);
    }
}
