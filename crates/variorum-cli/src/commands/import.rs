//! `variorum import`: a Hugging Face model directory (config.json, safetensors weights,
//! tokenizer.json) as a run directory (variorum_train::hf).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::device;

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A Hugging Face model directory, as `save_pretrained` writes it.
    pub src: PathBuf,
    /// The run directory to write (must not exist). Default: runs/<name of SRC>.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: ImportArgs) -> Result<ExitCode> {
    let ImportArgs { src, out } = args;
    let out = match out {
        Some(out) => out,
        None => {
            let name = src.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_owned()));
            let name = name.ok_or_else(|| anyhow::anyhow!("{} names no directory: give --out", src.display()))?;
            PathBuf::from("runs").join(name)
        }
    };
    // the weights are only converted and copied
    let (device, _) = device::select("cpu")?;
    let spinner = variorum_train::progress::spinner(&format!("importing {}", src.display()));
    let imported = variorum_train::hf::import(&src, &out, &device)?;
    spinner.finish_and_clear();
    println!(
        "{}: {} ({} tensors, {} parameters)",
        imported.out.display(),
        imported.class,
        imported.tensors,
        imported.params
    );
    Ok(ExitCode::SUCCESS)
}
