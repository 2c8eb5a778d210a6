//! Acting: episodes of the environment played by a trained Decision Transformer, each
//! conditioned on a target return (Chen et al. 2021, Algorithm 1): R̂_1 is the target, and
//! each reward received is subtracted from it before the next step.
//!
//! The episodes of one target run side by side as the rows of one batch, in lockstep; a row
//! whose episode has ended keeps being fed its last step and is not read. Each step's action
//! comes from one forward of the new tokens through the KV caches while the episode fits the
//! context, and from the last `context` steps run whole after that (the paper's window).
//! Layouts are the evaluation split's ([`LayoutSplit::Evaluation`]), never one of the data's.

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use variorum_data::decision::{KeyDoor, KeyDoorConfig, LayoutSplit, layout_seed};
use variorum_model::{ActionInputs, DecisionTransformer, DecoderState, StepInputs};

/// The episodes played at one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetResult {
    /// The target return R̂_1 (none for a model without returns: behaviour cloning).
    pub target: Option<f64>,
    /// Mean return achieved.
    pub mean: f64,
    /// Standard deviation of the returns over the episodes.
    pub std: f64,
    /// Fraction of the episodes that reached the goal.
    pub success: f64,
    /// Every episode's return, in layout order.
    pub returns: Vec<f64>,
}

/// `variorum rollout`'s result, also written to the run's `rollouts.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollouts {
    /// Episodes per target.
    pub episodes: usize,
    /// Seeds the evaluation layouts and the sampled actions.
    pub seed: u64,
    /// Actions taken as the most likely (true) or sampled from the model's distribution.
    pub greedy: bool,
    /// One entry per target.
    pub targets: Vec<TargetResult>,
}

/// Plays `episodes` evaluation layouts of `env` at each of `targets` (once, without a target,
/// for a model without returns), actions sampled from the model's distribution (seeded) or
/// taken greedily.
pub fn rollouts(
    model: &DecisionTransformer,
    env: KeyDoorConfig,
    targets: &[f64],
    episodes: usize,
    seed: u64,
    greedy: bool,
    device: &Device,
) -> Rollouts {
    let targets: Vec<Option<f64>> = match model.embed_return {
        Some(_) => targets.iter().copied().map(Some).collect(),
        None => vec![None],
    };
    let results = targets.into_iter().map(|t| play(model, env, t, episodes, seed, greedy, device)).collect();
    Rollouts { episodes, seed, greedy, targets: results }
}

fn play(
    model: &DecisionTransformer,
    cfg: KeyDoorConfig,
    target: Option<f64>,
    episodes: usize,
    seed: u64,
    greedy: bool,
    device: &Device,
) -> TargetResult {
    let mut envs: Vec<KeyDoor> =
        (0..episodes as u64).map(|i| KeyDoor::new(cfg, layout_seed(LayoutSplit::Evaluation, seed, i))).collect();
    let s = cfg.state_dim();
    let a_dim = model.predict_action.weight.dims()[1];
    // a step past the timestep table reads its last row (a table sized by the horizon has none)
    let last_row = model.embed_timestep.weight.dims()[0] as i64 - 1;
    // per row, per step so far: return-to-go, state, action
    let mut rtg: Vec<Vec<f32>> = vec![vec![target.unwrap_or(0.0) as f32]; episodes];
    let mut states: Vec<Vec<Vec<f32>>> = envs.iter().map(|e| vec![e.state()]).collect();
    let mut actions: Vec<Vec<i64>> = vec![Vec::new(); episodes];
    let mut returns = vec![0.0f64; episodes];
    let mut done = vec![false; episodes];
    let mut reached = vec![false; episodes];
    let mut cache = DecoderState::default();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for t in 0..cfg.horizon {
        let from = (t + 1).saturating_sub(model.context);
        let n = t + 1 - from;
        let flat = |f: &dyn Fn(usize, usize) -> Vec<f32>| -> Vec<f32> {
            (0..episodes).flat_map(|r| (from..=t).flat_map(move |j| f(r, j))).collect()
        };
        let window = StepInputs {
            returns_to_go: Tensor::from_data(TensorData::new(flat(&|r, j| vec![rtg[r][j]]), [episodes, n]), device),
            states: Tensor::from_data(TensorData::new(flat(&|r, j| states[r][j].clone()), [episodes, n, s]), device),
            actions: ActionInputs::Discrete(Tensor::from_data(
                TensorData::new(
                    (0..episodes)
                        .flat_map(|r| (from..=t).map(|j| actions[r].get(j).copied().unwrap_or(0)).collect::<Vec<_>>())
                        .collect::<Vec<i64>>(),
                    [episodes, n],
                ),
                device,
            )),
            timesteps: Tensor::from_data(
                TensorData::new(
                    (0..episodes).flat_map(|_| (from..=t).map(|j| (j as i64).min(last_row))).collect::<Vec<i64>>(),
                    [episodes, n],
                ),
                device,
            ),
        };
        let logits = model.next_action(&window, Some(&mut cache));
        let logits: Vec<f32> = logits.into_data().convert::<f32>().try_into_vec().expect("f32 logits");
        for r in 0..episodes {
            if done[r] {
                actions[r].push(0);
                let (last_rtg, last_state) = (rtg[r][t], states[r][t].clone());
                rtg[r].push(last_rtg);
                states[r].push(last_state);
                continue;
            }
            let row = &logits[r * a_dim..(r + 1) * a_dim];
            let a = if greedy { argmax(row) } else { sample(row, rng.random::<f64>()) };
            let step = envs[r].step(a);
            returns[r] += step.reward as f64;
            actions[r].push(a as i64);
            let next = rtg[r][t] - step.reward;
            rtg[r].push(next);
            states[r].push(step.state);
            done[r] = step.done;
            // the goal's reward is the only positive one
            reached[r] = step.reward > 0.0;
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    let mean = returns.iter().sum::<f64>() / episodes as f64;
    let std = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / episodes as f64).sqrt();
    let success = reached.iter().filter(|&&r| r).count() as f64 / episodes as f64;
    TargetResult { target, mean, std, success, returns }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// The choice whose cumulative softmax probability first exceeds `u` ∈ [0, 1).
fn sample(row: &[f32], u: f64) -> usize {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = row.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    for (i, wi) in w.iter().enumerate() {
        acc += wi / total;
        if u < acc {
            return i;
        }
    }
    row.len() - 1
}
