//! Mask descriptions of the attention contract.
//!
//! Positions are absolute: query i sits at `q_start + i`, key j at `k_start + j`. With a KV cache
//! or a Transformer-XL memory the keys start earlier than the queries, and causality is
//! `key position <= query position`, whatever the lengths.

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
}

/// Where ETC's global (auxiliary) tokens are in a call's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalLocal {
    /// `globals` auxiliary tokens, one per segment from the first, in front of the long tokens.
    Prefixed { globals: usize },
    /// The auxiliary token of `segment` alone (decoding, once the segment is complete).
    Auxiliary { segment: usize },
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
        }
    }

    /// Queries start at absolute position `q_start`, keys at `k_start`.
    pub fn at(mut self, q_start: usize, k_start: usize) -> Self {
        self.q_start = q_start;
        self.k_start = k_start;
        self
    }

    pub fn with_padding(mut self, padding: Tensor<2, Bool>) -> Self {
        self.padding = Some(padding);
        self
    }

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
    fn padding_combines_with_causal() {
        let dev = Device::flex();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![true, false], [1, 2]), &dev);
        let m = AttentionMask::causal().with_padding(pad).score_mask(2, 2, &dev).unwrap();
        assert_eq!(hidden(m), vec![true, true, true, false]);
    }
}
