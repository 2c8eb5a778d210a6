//! `variorum import`: a Hugging Face model directory (config.json, safetensors weights,
//! tokenizer.json) as a run directory (variorum_train::hf); or a PEFT LoRA adapter directory
//! (adapter_config.json, adapter_model.safetensors) onto a base run, as a LoRA run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::device;

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A Hugging Face model directory, as `save_pretrained` writes it; or a PEFT LoRA adapter
    /// directory (with --base).
    pub src: PathBuf,
    /// For a PEFT adapter: the run it adapts (imported, or trained here), which the LoRA run
    /// written names by hash as its base.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The run directory to write (must not exist). Default: runs/<name of SRC>.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: ImportArgs) -> Result<ExitCode> {
    let ImportArgs { src, out, base } = args;
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
    let adapter = src.join("adapter_config.json").is_file();
    match (adapter, base) {
        (true, Some(base)) => {
            let spinner = variorum_train::progress::spinner(&format!("importing {}", src.display()));
            let imported = variorum_train::hf::import_adapters(&src, &base, &out, &device)?;
            spinner.finish_and_clear();
            let targets: Vec<&str> = imported.targets.iter().map(|t| t.name()).collect();
            println!(
                "{}: LoRA adapters on {} (rank {}, {}; {} parameters)",
                imported.out.display(),
                base.display(),
                imported.rank,
                targets.join(", "),
                imported.params
            );
            return Ok(ExitCode::SUCCESS);
        }
        (true, None) => anyhow::bail!(
            "{} is a PEFT adapter: give the run it adapts with --base (a model imported with `variorum import`)",
            src.display()
        ),
        (false, Some(_)) => anyhow::bail!(
            "--base is for a PEFT adapter directory (adapter_config.json), and {} has none",
            src.display()
        ),
        (false, None) => {}
    }
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
