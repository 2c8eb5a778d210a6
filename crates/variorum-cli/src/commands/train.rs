//! `variorum train`: train a model from a config file into a run directory; Ctrl-C checkpoints
//! and stops, `--resume` continues.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions};

use crate::common::{at_least, on_interrupt};
use crate::device;

// `--device` is a field of its own here, not `DeviceArgs`: its help lists the backends.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Experiment config (.toml or .json).
    pub config: PathBuf,
    /// cpu (the fastest CPU backend), flex, wgpu; ndarray and cuda when built with them.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Run directory. Default: runs/<config name>.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Train for this many steps (overrides train.steps).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Continue the run in --out from its latest checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Checkpoint and stop after this many steps, keeping the schedule of train.steps.
    #[arg(long)]
    pub stop_at: Option<u64>,
    /// Start from the weights of a run directory or a .safetensors/.bpk file (what fits by
    /// name and shape; the rest is freshly initialised).
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// No progress bar (log lines only).
    #[arg(long)]
    pub no_progress: bool,
    /// Do not write report.html into the run directory (at each checkpoint and at the end).
    #[arg(long)]
    pub no_report: bool,
}

pub fn run(args: TrainArgs) -> Result<ExitCode> {
    let TrainArgs { config, device, out, max_steps, resume, stop_at, init_from, no_progress, no_report } = args;
    if let Some(n) = stop_at {
        at_least("--stop-at", n, 1)?;
    }
    let (device, device_name) = device::select(&device)?;
    let cfg = ExperimentConfig::load(&config)?;
    let run_dir = out.unwrap_or_else(|| {
        PathBuf::from("runs")
            .join(config.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into()))
    });
    let interrupt = on_interrupt(
        "saving a checkpoint after this step (Ctrl-C again to stop at once)",
        "the last checkpoint is intact",
    )?;
    let opts = TrainOptions {
        run_dir: run_dir.clone(),
        max_steps,
        resume,
        stop_at,
        init_from,
        device,
        init_device: Some(device::host()),
        device_name,
        progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        interrupt,
        report: !no_report,
    };
    match variorum_train::train(cfg, &opts)? {
        Outcome::Finished(s) => {
            println!(
                "done: {} steps, train loss {}, validation loss {}, {:.0} tokens/s; run in {}",
                s.steps,
                fmt_opt(s.final_train_loss),
                fmt_opt(s.final_val_loss),
                s.tokens_per_sec,
                run_dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Interrupted { step, checkpoint } => {
            println!(
                "interrupted at step {step}; checkpoint {}; continue with: variorum train {} --out {} --resume",
                checkpoint.display(),
                config.display(),
                run_dir.display()
            );
            Ok(ExitCode::from(130))
        }
    }
}

/// A loss to 4 decimals, or "n/a" where there is none (no step or no validation yet).
fn fmt_opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "n/a".into())
}
