//! ETC's contrastive predictive coding (Ainslie et al. 2020, §3.3, after Oord et al. 2018), the
//! `cpc` loss of a masked ETC model (`model.objective.cpc`). ETC hides every token of some
//! sentences, keeps their global (summary) tokens, and trains "the hidden representation of the
//! global sentence summary tokens for the masked sentences" to match that of "a global summary
//! token that can see the unmasked sentence and nothing else", with Oord et al.'s noise
//! contrastive (InfoNCE) loss. With ĉ_i the final state of hidden segment i's global token in
//! the corrupted window and z_j that of the global token of segment j encoded alone,
//!
//! L_CPC = −(1/m) Σ_i log( exp(ĉ_iᵀ W z_i) / Σ_j exp(ĉ_iᵀ W z_j) ),
//!
//! over the m hidden segments of the batch.
//!
//! Choices where the paper leaves one open (its pre-training code is not released):
//! - Sentences are the attention's segments (`segment` positions, one global token each): the
//!   global input carries one summary token per segment.
//! - The score is Oord et al.'s log-bilinear ĉᵀ W z, W learned from I/√d_model (so unrelated
//!   states score about N(0, 1) at the start).
//! - The negatives are the other hidden segments of the batch (in-batch negatives, as Oord et
//!   al. draw theirs from the minibatch); a batch with one hidden segment has no negative and no
//!   loss.
//! - The segment read alone is the same model over the segment's original tokens as a window
//!   of its own (positions from 0, one global token, bidirectional), and gradients flow through
//!   both sides, as in Oord et al.
//! - Hidden segments are not masked-LM targets (the paper does not say); the other positions are
//!   corrupted as BERT's, and evaluation hides no segment, so validation losses compare with a
//!   model trained without CPC.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::log_softmax;

/// The bilinear score W and the weight of ETC's CPC loss ([module docs](self)).
#[derive(Module, Debug)]
pub struct Cpc {
    /// W of the score ĉᵀ W z, `[d_model, d_model]`, I/√d_model at the start.
    pub bilinear: Param<Tensor<2>>,
    /// `model.objective.cpc.weight`.
    pub weight: f64,
}

impl Cpc {
    /// W = I/√d for a model `d` wide; the loss weighted by `weight`.
    pub fn new(d: usize, weight: f64, device: &Device) -> Self {
        let eye = Tensor::<2>::eye(d, device).div_scalar((d as f64).sqrt());
        Self { bilinear: Param::from_tensor(eye), weight }
    }

    /// The scores ĉ_iᵀ W z_j, `[m, m]`, of `predicted` ĉ `[m, d]` against `encoded` z `[m, d]`.
    pub fn scores(&self, predicted: Tensor<2>, encoded: Tensor<2>) -> Tensor<2> {
        predicted.matmul(self.bilinear.val()).matmul(encoded.transpose())
    }

    /// The weighted InfoNCE loss `[1]` of row i of `predicted` against row i of `encoded`, the
    /// other rows its negatives; `None` with fewer than two rows.
    pub fn loss(&self, predicted: Tensor<2>, encoded: Tensor<2>) -> Option<Tensor<1>> {
        let m = predicted.dims()[0];
        if m < 2 {
            return None;
        }
        let device = predicted.device();
        let log_p = log_softmax(self.scores(predicted, encoded), 1);
        let own = Tensor::<1, Int>::arange(0..m as i64, &device).reshape([m, 1]);
        Some(log_p.gather(1, own).mean().neg().mul_scalar(self.weight))
    }
}

/// The segments of a batch hidden whole for CPC: for each, its row, its index among the row's
/// segments, and its original tokens (`tokens`, `[m, segment]`).
#[derive(Debug, Clone)]
pub struct HiddenSegments {
    /// The batch row of each hidden segment.
    pub rows: Vec<usize>,
    /// Its index among the row's segments.
    pub segments: Vec<usize>,
    /// Its tokens before they were hidden, `[m, segment]`.
    pub tokens: Tensor<2, Int>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    #[test]
    fn the_loss_is_the_cross_entropy_of_each_prediction_against_every_encoding_by_hand() {
        let device = Device::flex();
        let (m, d) = (4, 3);
        let mut cpc = Cpc::new(d, 0.5, &device);
        // a W that is not symmetric, so ĉᵀWz and zᵀWĉ differ
        cpc.bilinear = Param::from_tensor(Tensor::random([d, d], Distribution::Normal(0.0, 1.0), &device));
        let c = Tensor::<2>::random([m, d], Distribution::Normal(0.0, 1.0), &device);
        let z = Tensor::<2>::random([m, d], Distribution::Normal(0.0, 1.0), &device);
        let got = cpc.loss(c.clone(), z.clone()).unwrap().into_scalar::<f32>();
        let rows = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let (w, c, z) = (rows(cpc.bilinear.val()), rows(c), rows(z));
        let score = |i: usize, j: usize| {
            let mut s = 0.0f64;
            for a in 0..d {
                for b in 0..d {
                    s += (c[i * d + a] * w[a * d + b] * z[j * d + b]) as f64;
                }
            }
            s
        };
        let mut want = 0.0;
        for i in 0..m {
            let norm: f64 = (0..m).map(|j| score(i, j).exp()).sum();
            want -= (score(i, i).exp() / norm).ln();
        }
        let want = 0.5 * want / m as f64;
        assert!((got as f64 - want).abs() < 1e-4, "{got} vs {want}");
        assert!(cpc.loss(Tensor::zeros([1, d], &device), Tensor::zeros([1, d], &device)).is_none());
    }

    /// A tiny masked ETC model with CPC: context 12, segments of 3 (four global tokens).
    fn etc_model(device: &Device) -> crate::DecoderLm {
        use crate::objective::{CpcConfig, MaskedConfig, ObjectiveConfig};
        let attention = variorum_attention::AttentionConfig::Etc(variorum_attention::EtcConfig {
            window: 2,
            segment: 3,
            block: Some(2),
            ..Default::default()
        });
        let objective = ObjectiveConfig::Masked(MaskedConfig { cpc: Some(CpcConfig::default()), ..Default::default() });
        let cfg = crate::ModelConfig { attention, objective, seq_len: 12, ..crate::zoo::tiny() };
        cfg.validate().unwrap();
        let mut model = cfg.init(device);
        let cpc = model.cpc.as_mut().unwrap();
        // an asymmetric W, so a score read transposed differs
        cpc.bilinear = Param::from_tensor(Tensor::random([32, 32], Distribution::Normal(0.0, 0.2), device));
        model
    }

    #[test]
    fn the_cpc_loss_reads_each_hidden_segments_global_token_against_the_segment_encoded_alone() {
        let device = Device::flex();
        let model = etc_model(&device);
        let mask = model.mask_token.unwrap() as i64;
        let original: Vec<i64> = (0..24).map(|i| (i * 7 % 11) as i64).collect();
        // row 0 hides its segment 1, row 1 its segments 0 and 3
        let hidden = [(0usize, 1usize), (1, 0), (1, 3)];
        let mut corrupted = original.clone();
        for &(r, s) in &hidden {
            corrupted[r * 12 + s * 3..r * 12 + s * 3 + 3].iter_mut().for_each(|t| *t = mask);
        }
        let seg = |r: usize, s: usize| original[r * 12 + s * 3..r * 12 + s * 3 + 3].to_vec();
        let tokens = |v: Vec<i64>, b: usize| {
            let len = v.len() / b;
            Tensor::<2, Int>::from_data(TensorData::new(v, [b, len]), &device)
        };
        let rows = crate::Rows {
            hidden: Some(HiddenSegments {
                rows: hidden.iter().map(|h| h.0).collect(),
                segments: hidden.iter().map(|h| h.1).collect(),
                tokens: Tensor::from_data(
                    TensorData::new(hidden.iter().flat_map(|&(r, s)| seg(r, s)).collect::<Vec<_>>(), [3, 3]),
                    &device,
                ),
            }),
            ..Default::default()
        };
        let targets = Tensor::<2, Int>::from_data(TensorData::new(vec![mask; 24], [2, 12]), &device);
        let (_, aux) = model.loss_with(tokens(corrupted.clone(), 2), targets, rows, None);
        let got = aux.iter().find(|(n, _)| n == "cpc").expect("a cpc loss").1.clone().into_scalar::<f32>() as f64;

        // by hand: ĉ = the final-normed global token (r, s) of the corrupted windows; z = the
        // global token of the segment as a window of its own, one at a time
        let global = model.global_embedding.as_ref().unwrap().val();
        let final_state = |x: Tensor<3>| model.final_norm.as_ref().unwrap().forward(x);
        let (x, globals, _) = model.global_local_blocks(tokens(corrupted, 2), None, global.clone(), 3, None);
        assert_eq!(globals, 4, "one global token per segment, bidirectionally");
        let x = final_state(x);
        let vec_of = |t: Tensor<3>| t.into_data().try_to_vec::<f32>().unwrap();
        let c: Vec<Vec<f32>> =
            hidden.iter().map(|&(r, s)| vec_of(x.clone().slice([r..r + 1, s..s + 1, 0..32]))).collect();
        let z: Vec<Vec<f32>> = hidden
            .iter()
            .map(|&(r, s)| {
                let (alone, n, _) = model.global_local_blocks(tokens(seg(r, s), 1), None, global.clone(), 3, None);
                assert_eq!(n, 1);
                vec_of(final_state(alone).slice([0..1, 0..1, 0..32]))
            })
            .collect();
        let w = model.cpc.as_ref().unwrap().bilinear.val().into_data().try_to_vec::<f32>().unwrap();
        let score = |i: usize, j: usize| {
            let mut s = 0.0f64;
            for a in 0..32 {
                for b in 0..32 {
                    s += c[i][a] as f64 * w[a * 32 + b] as f64 * z[j][b] as f64;
                }
            }
            s
        };
        let want = (0..3)
            .map(|i| {
                let norm: f64 = (0..3).map(|j| score(i, j).exp()).sum();
                -(score(i, i).exp() / norm).ln()
            })
            .sum::<f64>()
            / 3.0;
        assert!((got - want).abs() < 1e-4, "{got} vs {want}");
    }

    #[test]
    fn matching_encodings_score_lower_than_shuffled_ones() {
        let device = Device::flex();
        let cpc = Cpc::new(16, 1.0, &device);
        let z = Tensor::<2>::random([8, 16], Distribution::Normal(0.0, 1.0), &device).mul_scalar(3.0);
        let matched = cpc.loss(z.clone(), z.clone()).unwrap().into_scalar::<f32>();
        let shifted = Tensor::cat(vec![z.clone().narrow(0, 1, 7), z.clone().narrow(0, 0, 1)], 0);
        let wrong = cpc.loss(z, shifted).unwrap().into_scalar::<f32>();
        assert!(matched < 0.5 && wrong > 3.0, "{matched} {wrong}");
    }
}
