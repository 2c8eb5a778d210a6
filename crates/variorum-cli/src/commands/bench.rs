//! `variorum bench`: training tokens/s, GFLOP/s and peak memory of a config on synthetic tokens
//! (the median of several runs).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::ExperimentConfig;

use crate::common::at_least;
use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    pub config: PathBuf,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Timed steps per run.
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    /// Untimed steps before each run.
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BenchArgs) -> Result<ExitCode> {
    let BenchArgs { config, device, steps, warmup, runs, json } = args;
    at_least("--steps", steps, 1)?;
    at_least("--runs", runs, 1)?;
    let (device, name) = device.select()?;
    let cfg = ExperimentConfig::load(&config)?;
    let r = variorum_train::bench::bench(&cfg, &device, warmup, steps, runs)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("config            {}", config.display());
        println!("device            {name}");
        println!("parameters        {}", r.params);
        println!("tokens/step       {}", r.tokens_per_step);
        println!("runs (tokens/s)   {}", r.runs.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", "));
        println!("median tokens/s   {:.0}", r.median_tokens_per_sec);
        println!("median GFLOP/s    {:.2}", r.median_gflops);
        println!("peak RSS          {}", r.peak_rss_mib.map(|m| format!("{m:.0} MiB")).unwrap_or_else(|| "n/a".into()));
    }
    Ok(ExitCode::SUCCESS)
}
