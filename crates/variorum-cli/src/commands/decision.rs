//! The Decision Transformer's two commands besides `train`: `variorum trajectories` records
//! offline episodes of behaviour policies, `variorum rollout` plays a trained run conditioned on
//! target returns.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use variorum_data::decision::{EnvConfig, GenerateConfig, KeyDoorConfig, generate};
use variorum_train::checkpoint::write_atomic;
use variorum_train::decision::{load_run, rollouts};

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct TrajectoriesArgs {
    /// The trajectory file to write (JSON Lines; `data.trajectories` reads it).
    #[arg(long)]
    pub out: PathBuf,
    /// Episodes to record.
    #[arg(long, default_value_t = 2000)]
    pub episodes: usize,
    /// The behaviour policies: ε-greedy shortest-path oracles, episode i acting with the
    /// (i mod n)-th ε (0 = expert, 1 = random).
    #[arg(long, value_delimiter = ',', default_value = "0,0.25,0.5,0.75,1")]
    pub epsilons: Vec<f64>,
    /// Side of the key-to-door grid.
    #[arg(long, default_value_t = 7)]
    pub size: usize,
    /// Steps before an episode ends unrewarded.
    #[arg(long, default_value_t = 40)]
    pub horizon: usize,
    /// Seeds the layouts and the policies' choices.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn trajectories(args: TrajectoriesArgs) -> Result<ExitCode> {
    let cfg = GenerateConfig {
        env: KeyDoorConfig { size: args.size, horizon: args.horizon },
        episodes: args.episodes,
        epsilons: args.epsilons,
        seed: args.seed,
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    let set = generate(&cfg);
    set.save(&args.out)?;
    let steps: usize = set.episodes.iter().map(|e| e.len()).sum();
    println!("{} episodes, {steps} steps, written to {}", set.episodes.len(), args.out.display());
    for eps in &cfg.epsilons {
        let name = format!("epsilon={eps}");
        let r: Vec<f64> = set.episodes.iter().filter(|e| e.policy == name).map(|e| e.total_return()).collect();
        if !r.is_empty() {
            println!(
                "  ε = {eps:<5} {:>5} episodes, mean return {:+.3}",
                r.len(),
                r.iter().sum::<f64>() / r.len() as f64
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    /// The run directory of a trained Decision Transformer.
    pub run: PathBuf,
    /// Target returns to condition on (ignored by a model without returns).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, default_value = "-1,-0.5,0,0.25,0.5,0.75,1")]
    pub targets: Vec<f64>,
    /// Episodes per target (evaluation layouts, never the data's).
    #[arg(long, default_value_t = 200)]
    pub episodes: usize,
    /// Seeds the layouts and the sampled actions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Take the most likely action instead of sampling one.
    #[arg(long)]
    pub greedy: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn rollout(args: RolloutArgs) -> Result<ExitCode> {
    if args.episodes == 0 {
        bail!("--episodes 0 plays nothing: ask for at least one");
    }
    if let Some(t) = args.targets.iter().find(|t| !t.is_finite()) {
        bail!("--targets: {t} is not a number");
    }
    let (device, _) = args.device.select()?;
    let run = load_run(&args.run, &device)?;
    let EnvConfig::KeyDoor(env) = run.header.env else {
        bail!(
            "{} was trained on episodes recorded elsewhere (env external): there is no environment to act in",
            args.run.display()
        );
    };
    let result = rollouts(&run.model, env, &args.targets, args.episodes, args.seed, args.greedy, &device);
    println!("{:>8}  {:>8}  {:>6}  {:>7}", "target", "return", "std", "success");
    for t in &result.targets {
        let target = t.target.map_or("-".to_string(), |x| format!("{x:+.3}"));
        println!("{target:>8}  {:>+8.3}  {:>6.3}  {:>6.1}%", t.mean, t.std, 100.0 * t.success);
    }
    let path = args.run.join("rollouts.json");
    write_atomic(&path, serde_json::to_string_pretty(&result)?.as_bytes())?;
    println!("written to {}", path.display());
    Ok(ExitCode::SUCCESS)
}
