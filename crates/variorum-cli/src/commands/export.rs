//! `variorum export`: write a run's weights in another format (safetensors; the tensor names are
//! those of crates/variorum-train/src/transfer.rs), listing the tensors written.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::run::Run;

use crate::device;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// A run directory.
    pub run: PathBuf,
    #[arg(long, value_enum, default_value = "safetensors")]
    pub format: ExportFormat,
    /// Output file. Default: RUN/model.safetensors.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ExportFormat {
    Safetensors,
}

pub fn run(args: ExportArgs) -> Result<ExitCode> {
    // the one format there is; another one would be a match here
    let ExportArgs { run, format: ExportFormat::Safetensors, out } = args;
    // the weights are only copied: no need for another device
    let (device, _) = device::select("cpu")?;
    let spinner = variorum_train::progress::spinner(&format!("loading {}", run.display()));
    let loaded = Run::load(&run, &device)?;
    let path = out.unwrap_or_else(|| run.join("model.safetensors"));
    spinner.set_message(format!("writing {}", path.display()));
    let names = variorum_train::transfer::export_safetensors(&loaded.model, &path)?;
    spinner.finish_and_clear();
    for n in &names {
        println!("{n}");
    }
    eprintln!("{} tensors written to {}", names.len(), path.display());
    Ok(ExitCode::SUCCESS)
}
