//! Training batches of a Decision Transformer: windows of K consecutive steps cut from the
//! episodes, each step's return-to-go, state, action and timestep.
//!
//! As in the authors' code, an episode is drawn with probability proportional to its length
//! and a window starts at a uniformly drawn step, so every step is equally likely to start a
//! window. A window that runs past the episode's end is padded at the end and its padded steps
//! marked invalid (the authors pad at the front and hide the padding from attention; padding
//! at the end leaves every valid step's causal context the same, so no padding mask is
//! needed).

use std::sync::Arc;

use rand::Rng;

use super::trajectories::{ActionSpace, Actions, Trajectory};
use crate::batch::keyed_rng;

/// The actions of a batch, `[batch · K]` choices or `[batch · K · n]` numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchActions {
    /// Choice numbers (0 on padding).
    Discrete(Vec<i64>),
    /// Vectors (0 on padding).
    Continuous(Vec<f32>),
}

/// `batch_size` windows of `context` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBatch {
    /// Rows.
    pub batch_size: usize,
    /// Steps per row (K).
    pub context: usize,
    /// `[batch · K]` returns-to-go R̂_t, unscaled.
    pub returns_to_go: Vec<f32>,
    /// `[batch · K · state_dim]`.
    pub states: Vec<f32>,
    /// The actions taken.
    pub actions: BatchActions,
    /// `[batch · K]` the step's number within its episode (0 on padding).
    pub timesteps: Vec<i64>,
    /// `[batch · K]` false on padding.
    pub valid: Vec<bool>,
}

impl StepBatch {
    /// Valid steps in the batch.
    pub fn steps(&self) -> usize {
        self.valid.iter().filter(|&&v| v).count()
    }
}

/// Windows over a set of episodes, batch `i` a function of (seed, i).
#[derive(Debug, Clone)]
pub struct StepWindows {
    episodes: Arc<Vec<Trajectory>>,
    returns_to_go: Vec<Vec<f32>>,
    /// Cumulative episode lengths: a uniform step number picks the episode by length.
    ends: Vec<usize>,
    state_dim: usize,
    space: ActionSpace,
    context: usize,
    batch_size: usize,
    seed: u64,
}

impl StepWindows {
    /// Windows of `context` steps from `episodes` (non-empty, each checked against its
    /// header), `batch_size` per batch.
    pub fn new(
        episodes: Arc<Vec<Trajectory>>,
        state_dim: usize,
        space: ActionSpace,
        context: usize,
        batch_size: usize,
        seed: u64,
    ) -> Self {
        assert!(!episodes.is_empty() && context > 0 && batch_size > 0);
        let returns_to_go = episodes.iter().map(Trajectory::returns_to_go).collect();
        let ends = episodes
            .iter()
            .scan(0, |acc, e| {
                *acc += e.len();
                Some(*acc)
            })
            .collect();
        Self { episodes, returns_to_go, ends, state_dim, space, context, batch_size, seed }
    }

    /// Steps in all episodes.
    pub fn total_steps(&self) -> usize {
        *self.ends.last().expect("non-empty")
    }

    /// Batch `i`: each row a window from a uniformly drawn step.
    pub fn batch(&self, i: u64) -> StepBatch {
        let mut rng = keyed_rng(b"decision windows", &[self.seed, i]);
        let starts: Vec<(usize, usize)> = (0..self.batch_size)
            .map(|_| {
                let step = rng.random_range(0..self.total_steps());
                let e = self.ends.partition_point(|&end| end <= step);
                (e, step - (self.ends[e] - self.episodes[e].len()))
            })
            .collect();
        self.windows(&starts)
    }

    /// Up to `n` batches covering the episodes in order, each window starting where the last
    /// ended: validation batches, the same at every evaluation.
    pub fn in_order(&self, n: usize) -> Vec<StepBatch> {
        let starts: Vec<(usize, usize)> = self
            .episodes
            .iter()
            .enumerate()
            .flat_map(|(e, ep)| (0..ep.len()).step_by(self.context).map(move |t| (e, t)))
            .take(n.saturating_mul(self.batch_size))
            .collect();
        starts.chunks(self.batch_size).map(|c| self.windows(c)).collect()
    }

    /// The windows starting at `(episode, step)`, one row each.
    fn windows(&self, starts: &[(usize, usize)]) -> StepBatch {
        let (k, s, rows) = (self.context, self.state_dim, starts.len());
        let mut b = StepBatch {
            batch_size: rows,
            context: k,
            returns_to_go: vec![0.0; rows * k],
            states: vec![0.0; rows * k * s],
            actions: match self.space {
                ActionSpace::Discrete(_) => BatchActions::Discrete(vec![0; rows * k]),
                ActionSpace::Continuous(n) => BatchActions::Continuous(vec![0.0; rows * k * n]),
            },
            timesteps: vec![0; rows * k],
            valid: vec![false; rows * k],
        };
        for (r, &(e, start)) in starts.iter().enumerate() {
            let ep = &self.episodes[e];
            for (j, t) in (start..ep.len().min(start + k)).enumerate() {
                let at = r * k + j;
                b.returns_to_go[at] = self.returns_to_go[e][t];
                b.states[at * s..(at + 1) * s].copy_from_slice(&ep.states[t]);
                match (&mut b.actions, &ep.actions) {
                    (BatchActions::Discrete(out), Actions::Discrete(a)) => out[at] = a[t] as i64,
                    (BatchActions::Continuous(out), Actions::Continuous(a)) => {
                        let n = a[t].len();
                        out[at * n..(at + 1) * n].copy_from_slice(&a[t]);
                    }
                    _ => unreachable!("episodes are checked against their header's action space"),
                }
                b.timesteps[at] = t as i64;
                b.valid[at] = true;
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{GenerateConfig, KeyDoorConfig, generate};

    fn windows(context: usize) -> (StepWindows, Arc<Vec<Trajectory>>) {
        let set = generate(&GenerateConfig {
            env: KeyDoorConfig::default(),
            episodes: 12,
            epsilons: vec![0.0, 1.0],
            seed: 3,
        });
        let eps = Arc::new(set.episodes);
        (StepWindows::new(eps.clone(), set.header.state_dim, set.header.actions, context, 16, 9), eps)
    }

    #[test]
    fn a_window_is_consecutive_steps_of_one_episode_with_their_returns_to_go() {
        let (w, eps) = windows(5);
        let s = 49;
        for i in 0..20 {
            let b = w.batch(i);
            assert_eq!(b, w.batch(i), "a function of the step");
            let BatchActions::Discrete(actions) = &b.actions else { panic!() };
            for r in 0..b.batch_size {
                // find the episode and step by the first state and timestep
                let at = r * 5;
                let t0 = b.timesteps[at] as usize;
                let (e, ep) = eps
                    .iter()
                    .enumerate()
                    .find(|(_, ep)| ep.len() > t0 && ep.states[t0] == b.states[at * s..(at + 1) * s])
                    .expect("a window starts at a recorded step");
                let rtg = ep.returns_to_go();
                for j in 0..5 {
                    let t = t0 + j;
                    assert_eq!(b.valid[at + j], t < ep.len(), "episode {e}");
                    if t < ep.len() {
                        assert_eq!(b.timesteps[at + j], t as i64);
                        assert_eq!(b.returns_to_go[at + j], rtg[t]);
                        let Actions::Discrete(a) = &ep.actions else { panic!() };
                        assert_eq!(actions[at + j], a[t] as i64);
                    } else {
                        assert_eq!(b.returns_to_go[at + j], 0.0);
                    }
                }
            }
        }
    }

    #[test]
    fn every_step_can_start_a_window_and_in_order_batches_cover_the_episodes() {
        let (w, eps) = windows(4);
        let mut seen = std::collections::HashSet::new();
        for i in 0..400 {
            let b = w.batch(i);
            for r in 0..b.batch_size {
                seen.insert((
                    b.states[r * 4 * 49..(r * 4 + 1) * 49].to_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.timesteps[r * 4],
                ));
            }
        }
        let distinct_steps: std::collections::HashSet<_> = eps
            .iter()
            .flat_map(|ep| {
                ep.states.iter().enumerate().map(|(t, s)| (s.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), t as i64))
            })
            .collect();
        assert_eq!(seen, distinct_steps);
        let all = w.in_order(usize::MAX);
        let covered: usize = all.iter().map(StepBatch::steps).sum();
        assert_eq!(covered, w.total_steps());
    }
}
