//! CALM early exit at decoding time (Schuster et al. 2022) for models with `model.exits`.
//!
//! Each new token runs block by block; after block n < N its exit's confidence c_n is compared
//! with the threshold λ and the token leaves with that exit's prediction when c_n ≥ λ:
//!
//! - `softmax-response`: p_(1) − p_(2), the gap between the two most likely tokens at exit n;
//! - `saturation`: (1 + cos(h^n, h^{n−1})) / 2, how little block n changed the state (the cosine
//!   mapped to [0, 1] like the other measure, so that λ = 0 always exits);
//! - `classifier`: CALM's learned exit classifier σ(w_n·h^n + b_n) (`model.exits.classifier`);
//!   a model without one is never confident by it.
//! - `predictor`: the Depth-Adaptive Transformer's exit predictor (`model.exits.predictor`): the
//!   halting probability X^n of the geometric kind, or Σ_{m≤n} q(m), the predicted probability that
//!   the token should have left by block n, of the multinomial kinds (q is computed once, after
//!   the first block). Never confident without a predictor.
//!
//! The blocks a token skips still need its keys and values for later tokens: CALM propagates
//! the exited state h^n to them, and each skipped block projects it into its cache. λ ≥ 1 never
//! exits (the full model); λ = 0 exits every token at the first exit.
//!
//! [`calibrate`] picks, on validation text, the smallest threshold whose early-exit loss stays
//! within a tolerance of the full model's (a grid search, as Elbayad et al. do); [`calibrate_ltt`]
//! is CALM's Learn-then-Test calibration, with a (approximate) statistical guarantee on the
//! fraction of tokens whose prediction changes.

use burn::prelude::*;
use burn::tensor::activation::{log_softmax, softmax};
use serde::{Deserialize, Serialize};
use variorum_model::decoder::Flow;
use variorum_model::{DecoderLm, DecoderState, PredictorKind};

/// How confident an exit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    /// p₍₁₎ − p₍₂₎: the gap between the exit's two most likely tokens.
    SoftmaxResponse,
    /// (1 + cos(hⁿ, hⁿ⁻¹)) / 2: how little the block changed the state.
    Saturation,
    /// CALM's learned exit classifier (`model.exits.classifier`).
    Classifier,
    /// The Depth-Adaptive Transformer's exit predictor (`model.exits.predictor`).
    Predictor,
}

impl Confidence {
    /// Every measure.
    pub const ALL: [Confidence; 4] =
        [Confidence::SoftmaxResponse, Confidence::Saturation, Confidence::Classifier, Confidence::Predictor];

    /// Its kebab-case name (`"softmax-response"`, …), as serde writes it and reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::SoftmaxResponse => "softmax-response",
            Self::Saturation => "saturation",
            Self::Classifier => "classifier",
            Self::Predictor => "predictor",
        }
    }
}

/// When to exit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExitPolicy {
    /// The measure compared with the threshold.
    pub confidence: Confidence,
    /// Exit when the confidence reaches this; 1 or more never exits.
    pub threshold: f64,
}

/// Runs one new token through the model, exiting early when the policy says so. Returns the
/// log-probabilities of its prediction `[vocab]` and the number of blocks it used.
pub fn step(
    model: &DecoderLm,
    token: u32,
    state: &mut DecoderState,
    policy: ExitPolicy,
    device: &Device,
) -> (Vec<f32>, usize) {
    let input = Tensor::<2, Int>::from_data(TensorData::new(vec![token as i64], [1, 1]), device);
    let (mask, dense) = model.mask(1, Some(state), device);
    state.layers.resize_with(model.depth, Default::default);
    let x = model.embed(input, state.position);
    let mut used = model.depth;
    let mut logits = None;
    let predictor = model.exits.as_ref().and_then(|e| e.predictor.as_ref());
    // the multinomial predictors' cumulative q over the exits, known after the first block
    let mut exited_by = Vec::new();
    let position = state.position;
    let summary = &mut state.exit_summary;
    let (x, _, ran) = model.run_blocks(x, &mask, dense, Some(&mut state.layers), |i, before, x| {
        if i == 0
            && let Some(p) = predictor
            && p.kind != PredictorKind::TokenGeometric
        {
            let input = if p.kind == PredictorKind::Sequence {
                let sum = match summary.take() {
                    Some(s) => s + x.clone(),
                    None => x.clone(),
                };
                *summary = Some(sum.clone());
                sum.div_scalar((position + 1) as f64)
            } else {
                x.clone()
            };
            exited_by = p.exit_log_probs(input).exp().cumsum(2).into_data().try_to_vec::<f32>().unwrap_or_default();
        }
        if i + 1 == model.depth {
            logits = Some(model.exit_logits(i, x.clone()));
            return Flow::Stop;
        }
        if policy.threshold >= 1.0 {
            return Flow::Continue;
        }
        let exit_logits = model.exit_logits(i, x.clone());
        let c = match policy.confidence {
            Confidence::SoftmaxResponse => {
                let top =
                    softmax(exit_logits.clone(), 2).topk(2, 2).into_data().try_to_vec::<f32>().unwrap_or_default();
                (top[0] - top.get(1).copied().unwrap_or(0.0)) as f64
            }
            Confidence::Saturation => (1.0 + cosine(before, x.clone())) / 2.0,
            Confidence::Classifier => match model.exits.as_ref().and_then(|e| e.confidence(i, x.clone())) {
                Some(c) => c.into_scalar::<f32>() as f64,
                None => f64::NEG_INFINITY,
            },
            Confidence::Predictor => match predictor {
                Some(p) if p.kind == PredictorKind::TokenGeometric => {
                    p.halting(i, x.clone()).into_scalar::<f32>() as f64
                }
                _ => exited_by.get(i).map_or(f64::NEG_INFINITY, |&c| c as f64),
            },
        };
        if c >= policy.threshold {
            used = i + 1;
            logits = Some(exit_logits);
            return Flow::Stop;
        }
        Flow::Continue
    });
    // the blocks the token skipped still need its keys and values for later tokens
    for j in ran..model.depth {
        model.propagate(j, x.clone(), &mask, &mut state.layers[j]);
    }
    state.position += 1;
    let logits = logits.expect("the last block always gives logits");
    (log_softmax(logits, 2).into_data().try_to_vec::<f32>().unwrap_or_default(), used)
}

fn cosine(a: Tensor<3>, b: Tensor<3>) -> f64 {
    let dot = (a.clone() * b.clone()).sum().into_scalar::<f32>() as f64;
    let na = a.powf_scalar(2.0).sum().sqrt().into_scalar::<f32>() as f64;
    let nb = b.powf_scalar(2.0).sum().sqrt().into_scalar::<f32>() as f64;
    dot / (na * nb).max(1e-12)
}

/// Greedy early-exit generation after `prompt` (read through every block): the new tokens and
/// the blocks each used. Windows restart like [`crate::generate::generate`]'s when full.
pub fn generate(
    model: &DecoderLm,
    prompt: &[u32],
    new_tokens: usize,
    policy: ExitPolicy,
    device: &Device,
) -> (Vec<u32>, Vec<usize>) {
    let full = ExitPolicy { threshold: 1.0, ..policy };
    let context = model.seq_len.max(2);
    let mut all = prompt.to_vec();
    let mut state = DecoderState::default();
    let mut window = all.len().saturating_sub(context);
    let (mut out, mut used) = (Vec::new(), Vec::new());
    let mut last = Vec::new();
    for _ in 0..new_tokens {
        if all.len() - window > context {
            window = all.len() - (context * 3 / 4).max(1);
            state = DecoderState::default();
        }
        // the prompt (or a restarted window) goes through every block; the newest token exits early
        while window + state.position < all.len() {
            let t = all[window + state.position];
            let is_newest = window + state.position + 1 == all.len() && !out.is_empty();
            let (lp, n) = step(model, t, &mut state, if is_newest { policy } else { full }, device);
            if is_newest {
                used.push(n);
            }
            last = lp;
        }
        let next = last.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
            as u32;
        out.push(next);
        all.push(next);
    }
    (out, used)
}

/// One predicted token of teacher-forced early exit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenExit {
    /// −log p(next token)
    pub loss: f64,
    /// Blocks it ran through: where it exited, or N when it did not.
    pub blocks: usize,
    /// The predicted top token.
    pub top: usize,
}

/// Teacher-forced early exit over disjoint windows of `model.seq_len` tokens from `ids`.
pub fn decode(model: &DecoderLm, ids: &[u32], policy: ExitPolicy, device: &Device) -> Vec<TokenExit> {
    let len = model.seq_len.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start + len < ids.len() {
        let mut state = DecoderState::default();
        for t in start..start + len {
            let (lp, blocks) = step(model, ids[t], &mut state, policy, device);
            let top = lp.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
            out.push(TokenExit { loss: -lp[ids[t + 1] as usize] as f64, blocks, top: top.0 });
        }
        start += len;
    }
    out
}

/// One threshold's decoding.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// The threshold decoded with.
    pub threshold: f64,
    /// Every predicted token's exit, in text order.
    pub tokens: Vec<TokenExit>,
}

impl SweepPoint {
    /// Mean loss per token.
    pub fn loss(&self) -> f64 {
        self.tokens.iter().map(|t| t.loss).sum::<f64>() / self.tokens.len().max(1) as f64
    }

    /// Mean blocks per token.
    pub fn blocks(&self) -> f64 {
        self.tokens.iter().map(|t| t.blocks as f64).sum::<f64>() / self.tokens.len().max(1) as f64
    }

    /// Fraction of tokens whose top prediction differs from `full`'s.
    pub fn changed(&self, full: &SweepPoint) -> f64 {
        let n = self.tokens.len().max(1) as f64;
        self.tokens.iter().zip(&full.tokens).filter(|(a, b)| a.top != b.top).count() as f64 / n
    }
}

/// Mean loss of the exited predictions and mean blocks used per token.
pub fn exit_loss(model: &DecoderLm, ids: &[u32], policy: ExitPolicy, device: &Device) -> (f64, f64) {
    let p = SweepPoint { threshold: policy.threshold, tokens: decode(model, ids, policy, device) };
    (p.loss(), p.blocks())
}

/// Decodes `ids` at every threshold of `grid` and at 1 (the full model), largest first.
pub fn sweep(model: &DecoderLm, ids: &[u32], confidence: Confidence, grid: &[f64], device: &Device) -> Vec<SweepPoint> {
    let mut grid: Vec<f64> = grid.iter().map(|t| t.min(1.0)).collect();
    grid.push(1.0);
    grid.sort_by(|a, b| b.total_cmp(a));
    grid.dedup();
    grid.into_iter()
        .map(|threshold| SweepPoint {
            threshold,
            tokens: decode(model, ids, ExitPolicy { confidence, threshold }, device),
        })
        .collect()
}

/// The smallest threshold of a [`sweep`] whose loss is within `tolerance` nats of the full
/// model's, going down from the largest and stopping at the first that is not.
pub fn calibrate(sweep: &[SweepPoint], tolerance: f64) -> Option<&SweepPoint> {
    let full = sweep.first()?.loss();
    sweep.iter().skip(1).take_while(|p| p.loss() <= full + tolerance).last()
}

/// Learn then Test (Angelopoulos et al. 2021), as CALM calibrates: the smallest threshold of a
/// [`sweep`] whose risk R(λ) — the fraction of tokens whose exited top prediction differs from
/// the full model's (token-level consistency) — is shown to be at most `delta` at level
/// `epsilon`. Each λ gets Hoeffding's p-value p = exp(−2n(δ − R̂)²) (1 when R̂ ≥ δ); fixed-sequence
/// testing goes from the largest λ down and stops at the first it cannot reject. The guarantee
/// P(R(λ) ≤ δ) ≥ 1 − ε assumes independent calibration tokens; tokens of one text are not, so
/// read it as approximate.
pub fn calibrate_ltt(sweep: &[SweepPoint], delta: f64, epsilon: f64) -> Option<&SweepPoint> {
    let full = sweep.first()?;
    sweep
        .iter()
        .skip(1)
        .take_while(|p| hoeffding_p_value(p.changed(full), delta, p.tokens.len() as f64) <= epsilon)
        .last()
}

/// Hoeffding's p-value for H₀: R > δ given the mean R̂ of n losses in [0, 1].
pub fn hoeffding_p_value(risk: f64, delta: f64, n: f64) -> f64 {
    if risk >= delta { 1.0 } else { (-2.0 * n * (delta - risk).powi(2)).exp() }
}
