//! Key-to-door: a two-room gridworld whose reward needs a key picked up earlier — the kind of
//! task the Decision Transformer paper uses to test long-term credit assignment (Chen et al.
//! 2021, §5.4: "Key-to-Door", three rooms; ours has two, and a step cost so that returns
//! grade how fast the goal was reached).
//!
//! The grid is `size × size`. Column `size / 2` is a wall with one door; the agent and the key
//! start in the left room, the goal lies in the right room. Stepping on the key picks it up;
//! the door lets the agent through only with the key. Every step costs `1 / horizon`; reaching
//! the goal gives 1 and ends the episode, which otherwise ends after `horizon` steps. So an
//! episode that reaches the goal in T steps returns 1 − T/horizon, and one that does not
//! returns −1.
//!
//! The observation shows the agent, the key's square, the door and the goal, each coordinate
//! one-hot (`7 · size` numbers), but not whether the key has been picked up: the key stays
//! drawn where it lay. Acting well therefore needs the memory of having passed the key — what
//! a longer context gives a Decision Transformer (the paper's claim that context matters).
//!
//! Each episode's layout is drawn from its seed alone, so an episode replays exactly.

use std::collections::VecDeque;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::batch::keyed_rng;

/// Moves: up, down, left, right.
pub const ACTIONS: usize = 4;

/// `[env]` of a trajectory file: the key-to-door gridworld's size and episode length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyDoorConfig {
    /// Side of the square grid (at least 5). Default 7.
    pub size: usize,
    /// Steps before an episode ends unrewarded (at least 5 · size). Default 40.
    pub horizon: usize,
}

impl Default for KeyDoorConfig {
    fn default() -> Self {
        Self { size: 7, horizon: 40 }
    }
}

impl KeyDoorConfig {
    /// Checks the sizes; messages name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.size < 5 {
            return Err(format!("env.size = {} is too small: the two rooms need at least 5 columns", self.size));
        }
        // a shortest solution is at most 1.5·size to the key and 3·size from it to the goal
        if self.horizon < 5 * self.size {
            return Err(format!(
                "env.horizon = {} leaves some layouts unsolvable in time: use at least {} (5 · size)",
                self.horizon,
                5 * self.size
            ));
        }
        Ok(())
    }

    /// Length of an observation: seven one-hot coordinates.
    pub fn state_dim(&self) -> usize {
        7 * self.size
    }
}

/// One episode of the gridworld.
#[derive(Debug, Clone)]
pub struct KeyDoor {
    cfg: KeyDoorConfig,
    agent: (usize, usize),
    key: (usize, usize),
    door_row: usize,
    goal: (usize, usize),
    has_key: bool,
    steps: usize,
    done: bool,
}

/// What a step returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The observation after the move.
    pub state: Vec<f32>,
    /// The step's reward.
    pub reward: f32,
    /// The episode has ended (goal reached or horizon spent).
    pub done: bool,
}

impl KeyDoor {
    /// The episode drawn from `seed`: door row, agent and key (distinct squares of the left
    /// room) and goal (right room), uniformly.
    pub fn new(cfg: KeyDoorConfig, seed: u64) -> Self {
        let mut rng = keyed_rng(b"key-door layout", &[seed]);
        let n = cfg.size;
        let wall = n / 2;
        let mut left = || (rng.random_range(0..wall), rng.random_range(0..n));
        let agent = left();
        let mut key = left();
        while key == agent {
            key = left();
        }
        let goal = (rng.random_range(wall + 1..n), rng.random_range(0..n));
        let door_row = rng.random_range(0..n);
        Self { cfg, agent, key, door_row, goal, has_key: false, steps: 0, done: false }
    }

    /// The observation: one-hot agent x, agent y, key x, key y, door y, goal x, goal y.
    pub fn state(&self) -> Vec<f32> {
        let n = self.cfg.size;
        let mut s = vec![0.0; 7 * n];
        let coords = [self.agent.0, self.agent.1, self.key.0, self.key.1, self.door_row, self.goal.0, self.goal.1];
        for (i, c) in coords.into_iter().enumerate() {
            s[i * n + c] = 1.0;
        }
        s
    }

    /// Whether the agent holds the key (not part of the observation).
    pub fn has_key(&self) -> bool {
        self.has_key
    }

    /// Steps taken so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Whether `(x, y)` can be stepped on now.
    fn open(&self, (x, y): (usize, usize), has_key: bool) -> bool {
        x != self.cfg.size / 2 || (y == self.door_row && has_key)
    }

    fn moved(&self, from: (usize, usize), action: usize, has_key: bool) -> (usize, usize) {
        let n = self.cfg.size;
        let (x, y) = from;
        let to = match action {
            0 if y > 0 => (x, y - 1),
            1 if y + 1 < n => (x, y + 1),
            2 if x > 0 => (x - 1, y),
            3 if x + 1 < n => (x + 1, y),
            _ => from,
        };
        if self.open(to, has_key) { to } else { from }
    }

    /// Takes `action` (0 up, 1 down, 2 left, 3 right; a move into the wall, a closed door or
    /// off the grid stays put).
    pub fn step(&mut self, action: usize) -> Step {
        assert!(!self.done, "the episode has ended");
        assert!(action < ACTIONS, "action {action} is not one of the {ACTIONS} moves");
        self.agent = self.moved(self.agent, action, self.has_key);
        self.has_key |= self.agent == self.key;
        self.steps += 1;
        let mut reward = -1.0 / self.cfg.horizon as f32;
        if self.agent == self.goal {
            reward += 1.0;
            self.done = true;
        }
        self.done |= self.steps == self.cfg.horizon;
        Step { state: self.state(), reward, done: self.done }
    }

    /// The first move of a shortest path to the key (without it) or the goal (with it), by
    /// breadth-first search; ties go to the lower action number. `None` once at the goal.
    pub fn oracle_action(&self) -> Option<usize> {
        let target = if self.has_key { self.goal } else { self.key };
        let n = self.cfg.size;
        let mut first = vec![None; n * n];
        let mut queue = VecDeque::from([self.agent]);
        let index = |(x, y): (usize, usize)| y * n + x;
        let mut seen = vec![false; n * n];
        seen[index(self.agent)] = true;
        while let Some(p) = queue.pop_front() {
            if p == target {
                return first[index(p)];
            }
            for a in 0..ACTIONS {
                let q = self.moved(p, a, self.has_key);
                if !seen[index(q)] {
                    seen[index(q)] = true;
                    first[index(q)] = first[index(p)].or(Some(a));
                    queue.push_back(q);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_oracle(env: &mut KeyDoor) -> (f32, usize) {
        let mut ret = 0.0;
        loop {
            let a = env.oracle_action().expect("the goal is reachable");
            let s = env.step(a);
            ret += s.reward;
            if s.done {
                return (ret, env.steps());
            }
        }
    }

    #[test]
    fn the_oracle_fetches_the_key_then_reaches_the_goal_within_the_horizon() {
        let cfg = KeyDoorConfig::default();
        for seed in 0..200 {
            let mut env = KeyDoor::new(cfg, seed);
            let (ret, steps) = run_oracle(&mut env);
            assert!(env.has_key(), "seed {seed}");
            assert_eq!(env.agent, env.goal, "seed {seed}");
            // 1 for the goal, 1/horizon per step
            assert!((ret - (1.0 - steps as f32 / cfg.horizon as f32)).abs() < 1e-5, "seed {seed}: {ret}");
            // never longer than key → door → goal across the grid
            assert!(steps <= 3 * 2 * cfg.size, "seed {seed}: {steps}");
        }
    }

    #[test]
    fn the_door_is_shut_without_the_key_and_the_observation_hides_the_key_held() {
        let cfg = KeyDoorConfig::default();
        let mut env = KeyDoor::new(cfg, 3);
        // walk to the wall's door square without the key: it does not open
        env.agent = (cfg.size / 2 - 1, env.door_row);
        let before = env.state();
        env.step(3);
        assert_eq!(env.agent, (cfg.size / 2 - 1, env.door_row));
        assert_eq!(env.state(), before);
        // with the key it does, and the observation cannot tell the key was taken
        env.has_key = true;
        env.step(3);
        assert_eq!(env.agent, (cfg.size / 2, env.door_row));
        let mut without = env.clone();
        without.has_key = false;
        assert_eq!(env.state(), without.state());
        // off the grid stays put
        env.agent = (0, 0);
        env.step(0);
        env.step(2);
        assert_eq!(env.agent, (0, 0));
    }

    #[test]
    fn an_unfinished_episode_ends_at_the_horizon_with_return_minus_one() {
        let cfg = KeyDoorConfig { size: 5, horizon: 25 };
        let mut env = KeyDoor::new(cfg, 1);
        env.agent = (0, 0);
        env.key = (1, 4);
        let mut ret = 0.0;
        for t in 0..25 {
            let s = env.step(0);
            ret += s.reward;
            assert_eq!(s.done, t == 24);
        }
        assert!((ret + 1.0).abs() < 1e-5);
    }

    #[test]
    fn a_layout_is_a_function_of_its_seed() {
        let cfg = KeyDoorConfig::default();
        let states: Vec<Vec<f32>> = (0..20).map(|s| KeyDoor::new(cfg, s).state()).collect();
        for (s, st) in states.iter().enumerate() {
            assert_eq!(&KeyDoor::new(cfg, s as u64).state(), st);
            assert_eq!(st.iter().filter(|&&v| v == 1.0).count(), 7);
        }
        let distinct: std::collections::HashSet<Vec<u32>> =
            states.iter().map(|s| s.iter().map(|v| v.to_bits()).collect()).collect();
        assert!(distinct.len() > 15);
    }
}
