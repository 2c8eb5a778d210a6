//! `variorum score`: per-token log-probabilities of a text under a trained run, and their total
//! (for an encoder–decoder, of a target given `--source`), as TSV or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use variorum_train::run::Run;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct ScoreArgs {
    /// A run directory.
    pub run: PathBuf,
    /// A UTF-8 text file to score.
    #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
    pub text: Option<PathBuf>,
    /// A text given on the command line.
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long, value_enum, default_value = "tsv")]
    pub format: ScoreFormat,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Score under this example tag (a run trained on tagged data; names in its tags.json).
    #[arg(long)]
    pub tag: Option<String>,
    /// The source the text is the target of (encoder–decoder runs).
    #[arg(long)]
    pub source: Option<String>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ScoreFormat {
    Tsv,
    Json,
}

pub fn run(args: ScoreArgs) -> Result<ExitCode> {
    let ScoreArgs { run, text, prompt, format, device, tag, source } = args;
    let (device, _) = device.select()?;
    let run = Run::load(&run, &device)?;
    let text = match (text, prompt) {
        (Some(path), _) => variorum_data::read_text(&path)?,
        (None, Some(p)) => p,
        (None, None) => anyhow::bail!("give --text FILE or --prompt TEXT"),
    };
    if run.model.long_term_memory.is_some() {
        eprintln!(
            "note: {}'s long-term memory reads the neighbour tables of its own splits; this text is scored without retrieval (the LM alone; `variorum eval` scores the validation split with it)",
            run.dir.display()
        );
    }
    let scores = match source {
        // the source with the tokenizer's special tokens (T5's `</s>`), as sources are trained
        // on; the target without them: the end token is scored after it
        Some(source) => {
            let source = run.tokenizer.encode_prompt(&source).context("the source cannot be encoded")?;
            let target = run.tokenizer.encode(&text).context("the target cannot be encoded")?;
            run.score_from(&source, &target)?
        }
        None => {
            let ids = run.encode_prompt(&text)?;
            let tag = tag.map(|name| run.tag_id(&name)).transpose()?;
            run.score_tagged(&ids, tag)?
        }
    };
    match format {
        ScoreFormat::Json => println!("{}", serde_json::to_string_pretty(&scores)?),
        ScoreFormat::Tsv => {
            println!("position\ttoken\ttext\tlogprob");
            for t in &scores.tokens {
                println!("{}\t{}\t{}\t{:.6}", t.position, t.token, t.text.escape_default(), t.logprob);
            }
            let n = scores.tokens.len() as f64;
            println!(
                "# total\t{:.4} nats over {} {}s: {:.4} nats/{u}, {:.4} bits/{u}",
                scores.total_logprob,
                scores.tokens.len(),
                scores.unit,
                -scores.total_logprob / n,
                -scores.total_logprob / n / std::f64::consts::LN_2,
                u = scores.unit
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
