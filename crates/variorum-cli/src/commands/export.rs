//! `variorum export`: write a run's weights in another format: safetensors (the tensor names
//! are those of crates/variorum-train/src/transfer.rs, listed as written), or a Hugging Face
//! model directory that transformers loads (docs/interop.md).

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
    /// Output: a file for safetensors (default RUN/model.safetensors); a directory that does not
    /// exist yet for hf (default RUN/hf).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A LoRA run's adapters merged into its base (W + (α/r)·A·B): a whole model, in either
    /// format. Without it a LoRA run is written as its adapters alone, in PEFT's files
    /// (`--format hf`).
    #[arg(long)]
    pub merge: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ExportFormat {
    /// The weights alone, under variorum's tensor names.
    Safetensors,
    /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json) as GPT-2,
    /// LLaMA, GPT-NeoX, GPT-J, Phi, BLOOM or (a masked model) BERT, for transformers'
    /// `from_pretrained`.
    Hf,
}

pub fn run(args: ExportArgs) -> Result<ExitCode> {
    let ExportArgs { run, format, out, merge } = args;
    // the weights are only copied: no need for another device
    let (device, _) = device::select("cpu")?;
    match format {
        ExportFormat::Safetensors => {
            let spinner = variorum_train::progress::spinner(&format!("loading {}", run.display()));
            let loaded = variorum_train::lora::for_export(Run::load(&run, &device)?, merge)?;
            let path = out.unwrap_or_else(|| run.join("model.safetensors"));
            spinner.set_message(format!("writing {}", path.display()));
            let names = variorum_train::transfer::export_safetensors(&loaded.model, &path)?;
            spinner.finish_and_clear();
            for n in &names {
                println!("{n}");
            }
            eprintln!("{} tensors written to {}", names.len(), path.display());
        }
        ExportFormat::Hf => {
            let out = out.unwrap_or_else(|| run.join("hf"));
            let spinner = variorum_train::progress::spinner(&format!("exporting {}", run.display()));
            let done = variorum_train::hf::export_with(&run, &out, &device, merge)?;
            spinner.finish_and_clear();
            if done.adapters {
                eprintln!(
                    "{} written: LoRA adapters in PEFT's files ({} tensors, {} parameters), for the base exported as {}: peft's PeftModel.from_pretrained(base, {:?}) loads them",
                    done.out.display(),
                    done.tensors,
                    done.params,
                    done.class,
                    done.out.display().to_string()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let auto = match done.class {
                c if c.ends_with("ForMaskedLM") => "AutoModelForMaskedLM",
                c if c.ends_with("ForConditionalGeneration") => "AutoModelForSeq2SeqLM",
                _ => "AutoModelForCausalLM",
            };
            eprintln!(
                "{} written as {} ({} tensors, {} parameters): transformers' {auto}.from_pretrained({:?}) loads it",
                done.out.display(),
                done.class,
                done.tensors,
                done.params,
                done.out.display().to_string()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
