//! Offline trajectories for the Decision Transformer: the file `variorum trajectories` writes
//! and training reads, and the behaviour policies that fill it.
//!
//! A trajectory file is JSON Lines. The first line is a [`TrajectoryHeader`] (the format, the
//! environment the episodes come from, the state width and the action space); each further
//! line is one [`Trajectory`]: its behaviour policy, its layout seed, and per step the state
//! seen, the action taken and the reward received.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::key_door::{ACTIONS, KeyDoor, KeyDoorConfig};
use crate::DataError;
use crate::batch::keyed_rng;

/// The first line's `format`.
pub const FORMAT: &str = "variorum-trajectories/1";

/// The environment a trajectory file's episodes come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EnvConfig {
    /// The key-to-door gridworld ([`KeyDoor`]).
    KeyDoor(KeyDoorConfig),
    /// None the project can run: episodes recorded elsewhere (training only, no rollouts).
    External,
}

/// What an action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum ActionSpace {
    /// One of n choices (cross-entropy).
    Discrete(usize),
    /// A vector of n numbers in [−1, 1] (squared error, tanh head).
    Continuous(usize),
}

impl ActionSpace {
    /// Width of an action as the model embeds it (one-hot for discrete actions).
    pub fn dim(&self) -> usize {
        match *self {
            Self::Discrete(n) | Self::Continuous(n) => n,
        }
    }
}

/// The first line of a trajectory file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectoryHeader {
    /// [`FORMAT`].
    pub format: String,
    /// Where the episodes come from.
    pub env: EnvConfig,
    /// Length of every state vector.
    pub state_dim: usize,
    /// The actions' space.
    pub actions: ActionSpace,
}

/// The actions of one episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Actions {
    /// Choice numbers.
    Discrete(Vec<u32>),
    /// Vectors.
    Continuous(Vec<Vec<f32>>),
}

impl Actions {
    /// Steps recorded.
    pub fn len(&self) -> usize {
        match self {
            Self::Discrete(a) => a.len(),
            Self::Continuous(a) => a.len(),
        }
    }

    /// No steps.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One episode: the state seen, the action taken and the reward received at each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// The behaviour policy that acted (e.g. `epsilon=0.25`).
    pub policy: String,
    /// The environment's layout seed.
    pub seed: u64,
    /// `[steps][state_dim]`.
    pub states: Vec<Vec<f32>>,
    /// `[steps]` (or `[steps][n]`).
    pub actions: Actions,
    /// `[steps]`.
    pub rewards: Vec<f32>,
}

impl Trajectory {
    /// Steps in the episode.
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// No steps.
    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }

    /// The episode's return, Σ r.
    pub fn total_return(&self) -> f64 {
        self.rewards.iter().map(|&r| r as f64).sum()
    }

    /// The returns-to-go R̂_t = Σ_{t' ≥ t} r_{t'} (Chen et al. 2021, §3), summed from the end.
    pub fn returns_to_go(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        let mut acc = 0.0f64;
        for t in (0..self.len()).rev() {
            acc += self.rewards[t] as f64;
            out[t] = acc as f32;
        }
        out
    }
}

/// A trajectory file read whole.
#[derive(Debug, Clone)]
pub struct TrajectorySet {
    /// Its first line.
    pub header: TrajectoryHeader,
    /// Its episodes, in file order.
    pub episodes: Vec<Trajectory>,
}

/// `variorum trajectories`: episodes of the key-to-door gridworld from ε-greedy versions of the
/// shortest-path oracle, ε from `epsilons` in turn — behaviour of mixed quality, from expert
/// (ε = 0) to random (ε = 1).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    /// The gridworld.
    pub env: KeyDoorConfig,
    /// Episodes to record.
    pub episodes: usize,
    /// The behaviour policies' ε, episode i acting with `epsilons[i mod len]`.
    pub epsilons: Vec<f64>,
    /// Seeds the layouts and the policies' draws.
    pub seed: u64,
}

/// Which layouts a seed draws: the data's and the evaluation's differ in their lowest bit, so
/// no rollout replays a layout the data holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSplit {
    /// Layouts of recorded episodes.
    Data,
    /// Layouts of evaluation rollouts.
    Evaluation,
}

/// The layout seed of episode `index` of `split` under `seed`.
pub fn layout_seed(split: LayoutSplit, seed: u64, index: u64) -> u64 {
    let h: u64 = keyed_rng(b"key-door episode", &[seed, index]).random();
    (h & !1) | (split == LayoutSplit::Evaluation) as u64
}

impl GenerateConfig {
    /// Checks the settings; messages name the option.
    pub fn validate(&self) -> Result<(), String> {
        self.env.validate()?;
        if self.episodes == 0 {
            return Err("--episodes 0 records nothing: ask for at least one episode".into());
        }
        if self.epsilons.is_empty() {
            return Err("--epsilons is empty: give at least one ε in [0, 1]".into());
        }
        if let Some(e) = self.epsilons.iter().find(|e| !(0.0..=1.0).contains(*e)) {
            return Err(format!("--epsilons: ε = {e} is not a probability in [0, 1]"));
        }
        Ok(())
    }
}

/// Records `cfg.episodes` episodes (see [`GenerateConfig`]); a function of the config.
pub fn generate(cfg: &GenerateConfig) -> TrajectorySet {
    let episodes = (0..cfg.episodes as u64)
        .map(|i| {
            let epsilon = cfg.epsilons[i as usize % cfg.epsilons.len()];
            let seed = layout_seed(LayoutSplit::Data, cfg.seed, i);
            let mut rng = keyed_rng(b"key-door behaviour", &[cfg.seed, i]);
            let mut env = KeyDoor::new(cfg.env, seed);
            let (mut states, mut actions, mut rewards) = (Vec::new(), Vec::new(), Vec::new());
            let mut state = env.state();
            loop {
                let explore = rng.random::<f64>() < epsilon;
                let a = match env.oracle_action() {
                    Some(a) if !explore => a,
                    _ => rng.random_range(0..ACTIONS),
                };
                let step = env.step(a);
                states.push(std::mem::replace(&mut state, step.state));
                actions.push(a as u32);
                rewards.push(step.reward);
                if step.done {
                    break;
                }
            }
            Trajectory {
                policy: format!("epsilon={epsilon}"),
                seed,
                states,
                actions: Actions::Discrete(actions),
                rewards,
            }
        })
        .collect();
    TrajectorySet {
        header: TrajectoryHeader {
            format: FORMAT.into(),
            env: EnvConfig::KeyDoor(cfg.env),
            state_dim: cfg.env.state_dim(),
            actions: ActionSpace::Discrete(ACTIONS),
        },
        episodes,
    }
}

impl TrajectorySet {
    /// Reads and checks a trajectory file: errors name the file and line.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let file = fs::File::open(path).map_err(|e| io_error(path, e))?;
        let bad = |line: usize, why: String| DataError::Config(format!("{} line {line}: {why}", path.display()));
        let mut lines = BufReader::new(file).lines().enumerate();
        let header: TrajectoryHeader = match lines.next() {
            None => return Err(bad(1, "the file is empty: write one with `variorum trajectories`".into())),
            Some((_, line)) => {
                let line = line.map_err(|e| io_error(path, e))?;
                serde_json::from_str(&line).map_err(|e| bad(1, format!("not a trajectory header: {e}")))?
            }
        };
        if header.format != FORMAT {
            return Err(bad(1, format!("format {:?} is not {FORMAT:?}", header.format)));
        }
        let mut episodes = Vec::new();
        for (i, line) in lines {
            let line = line.map_err(|e| io_error(path, e))?;
            if line.trim().is_empty() {
                continue;
            }
            let ep: Trajectory = serde_json::from_str(&line).map_err(|e| bad(i + 1, format!("not an episode: {e}")))?;
            header.check(&ep).map_err(|why| bad(i + 1, why))?;
            episodes.push(ep);
        }
        if episodes.is_empty() {
            return Err(DataError::Config(format!("{}: no episodes after the header", path.display())));
        }
        Ok(Self { header, episodes })
    }

    /// Writes the set to `path`: a temporary file beside it, synced, then renamed into place.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(fs::File::create(&tmp)?);
            serde_json::to_writer(&mut f, &self.header)?;
            f.write_all(b"\n")?;
            for ep in &self.episodes {
                serde_json::to_writer(&mut f, ep)?;
                f.write_all(b"\n")?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            fs::remove_file(&tmp).ok();
            io_error(path, e)
        })
    }
}

/// A file that cannot be read or written, in one line naming it.
fn io_error(path: &Path, e: std::io::Error) -> DataError {
    match e.kind() {
        std::io::ErrorKind::NotFound => DataError::Config(format!(
            "trajectory file {} not found: write one with `variorum trajectories --out {}`",
            path.display(),
            path.display()
        )),
        _ => DataError::Config(format!("trajectory file {}: {e}", path.display())),
    }
}

impl TrajectoryHeader {
    /// Checks one episode against the header: lengths, widths, action range, finite numbers.
    pub fn check(&self, ep: &Trajectory) -> Result<(), String> {
        let n = ep.len();
        if n == 0 {
            return Err("an episode with no steps".into());
        }
        if ep.states.len() != n || ep.actions.len() != n {
            return Err(format!(
                "{} states, {} actions and {n} rewards: an episode has one of each per step",
                ep.states.len(),
                ep.actions.len()
            ));
        }
        if let Some(s) = ep.states.iter().find(|s| s.len() != self.state_dim) {
            return Err(format!("a state of {} numbers; the header's state_dim is {}", s.len(), self.state_dim));
        }
        match (&ep.actions, self.actions) {
            (Actions::Discrete(a), ActionSpace::Discrete(k)) => {
                if let Some(x) = a.iter().find(|&&x| x as usize >= k) {
                    return Err(format!("action {x} is not one of the header's {k} choices"));
                }
            }
            (Actions::Continuous(a), ActionSpace::Continuous(k)) => {
                if let Some(x) = a.iter().find(|x| x.len() != k) {
                    return Err(format!("an action of {} numbers; the header's actions have {k}", x.len()));
                }
            }
            (_, space) => return Err(format!("the actions are not of the header's space {space:?}")),
        }
        let numbers = ep.states.iter().flatten().chain(&ep.rewards);
        let numbers = numbers.chain(match &ep.actions {
            Actions::Continuous(a) => a.iter().flatten().collect::<Vec<_>>(),
            Actions::Discrete(_) => Vec::new(),
        });
        if numbers.into_iter().any(|x| !x.is_finite()) {
            return Err("a state, action or reward that is not a finite number".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> GenerateConfig {
        GenerateConfig { env: KeyDoorConfig::default(), episodes: 40, epsilons: vec![0.0, 0.5, 1.0], seed: 7 }
    }

    #[test]
    fn returns_to_go_sum_the_rewards_from_each_step_on() {
        let ep = Trajectory {
            policy: "x".into(),
            seed: 0,
            states: vec![vec![0.0]; 4],
            actions: Actions::Discrete(vec![0; 4]),
            rewards: vec![1.0, -2.0, 0.5, 3.0],
        };
        assert_eq!(ep.returns_to_go(), vec![2.5, 1.5, 3.5, 3.0]);
        assert_eq!(ep.total_return(), 2.5);
    }

    #[test]
    fn the_behaviour_policies_are_of_mixed_quality_and_replay_their_layouts() {
        let set = generate(&small());
        assert_eq!(set.episodes.len(), 40);
        let mean = |eps: &str| {
            let r: Vec<f64> = set
                .episodes
                .iter()
                .filter(|e| e.policy == format!("epsilon={eps}"))
                .map(|e| e.total_return())
                .collect();
            r.iter().sum::<f64>() / r.len() as f64
        };
        // the oracle always succeeds; random play mostly does not
        assert!(set.episodes.iter().filter(|e| e.policy == "epsilon=0").all(|e| e.total_return() > 0.0));
        assert!(mean("0") > mean("0.5") && mean("0.5") > mean("1"), "{} {} {}", mean("0"), mean("0.5"), mean("1"));
        for ep in &set.episodes {
            assert!(set.header.check(ep).is_ok());
            // the recorded first state is the layout's
            assert_eq!(ep.states[0], KeyDoor::new(KeyDoorConfig::default(), ep.seed).state());
            assert_eq!(ep.seed & 1, 0, "data layouts are even");
        }
        assert_eq!(layout_seed(LayoutSplit::Evaluation, 7, 3) & 1, 1);
        assert_eq!(generate(&small()).episodes, set.episodes);
    }

    #[test]
    fn a_file_round_trips_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let set = generate(&GenerateConfig { episodes: 5, ..small() });
        set.save(&path).unwrap();
        let back = TrajectorySet::load(&path).unwrap();
        assert_eq!((back.header, back.episodes), (set.header.clone(), set.episodes.clone()));
        let text = fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        lines[3] = lines[3].replacen("\"actions\":[", "\"actions\":[9,", 1);
        fs::write(&path, lines.join("\n")).unwrap();
        let e = TrajectorySet::load(&path).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("actions"), "{e}");
        fs::write(&path, "").unwrap();
        assert!(TrajectorySet::load(&path).unwrap_err().to_string().contains("empty"));
        fs::write(&path, text.lines().next().unwrap()).unwrap();
        assert!(TrajectorySet::load(&path).unwrap_err().to_string().contains("no episodes"));
    }
}
