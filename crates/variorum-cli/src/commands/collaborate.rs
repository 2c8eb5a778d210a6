//! `variorum collaborate`: re-parameterise a run's full multi-head attention as collaborative
//! heads (Cordonnier et al. 2020: shared query/key projections, a mixing vector per head) and
//! write it as a new run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::run::Run;

use crate::common::at_least;
use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct CollaborateArgs {
    /// A run directory with model.attention.kind = "full".
    pub run: PathBuf,
    /// The new run directory (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Width of the shared query/key projections. Default n_heads · head_dim (exact); less
    /// compresses them by a CP decomposition whose relative error is printed per layer.
    #[arg(long)]
    pub shared_dim: Option<usize>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: CollaborateArgs) -> Result<ExitCode> {
    let CollaborateArgs { run, out, shared_dim, device } = args;
    if let Some(n) = shared_dim {
        at_least("--shared-dim", n, 1)?;
    }
    let (device, _) = device.select()?;
    let loaded = Run::load(&run, &device)?;
    let r = variorum_train::collaborate::collaborate(&loaded, shared_dim, &out)?;
    println!(
        "{} heads of {}: shared query/key width {} of {}{}",
        r.n_heads,
        r.head_dim,
        r.shared_dim,
        r.full_width,
        if r.shared_dim == r.full_width { " (exact)" } else { "" }
    );
    for (i, e) in r.layer_errors.iter().enumerate() {
        println!("layer {i:>3}: relative error of the query-key products {e:.6}");
    }
    let change = |before: usize, after: usize| 100.0 * (after as f64 - before as f64) / (before.max(1) as f64);
    println!(
        "attention parameters {} -> {} ({:+.1}%)",
        r.attention_params_before,
        r.attention_params_after,
        change(r.attention_params_before, r.attention_params_after)
    );
    println!(
        "model parameters     {} -> {} ({:+.1}%)",
        r.model_params_before,
        r.model_params_after,
        change(r.model_params_before, r.model_params_after)
    );
    for note in &r.notes {
        eprintln!("note: {note}");
    }
    eprintln!(
        "run written to {}; evaluate with `variorum eval {}`, fine-tune with `variorum train {} --init-from {} --out DIR`",
        out.display(),
        out.display(),
        out.join("config.toml").display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
