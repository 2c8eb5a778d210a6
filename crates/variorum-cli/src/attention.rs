//! `variorum attention`: the attention weights a trained run gives a text, drawn as heatmaps
//! with the tokens on the axes (one per layer and head), and per head the entropy of a query's
//! weights and the mean distance to the keys it weighs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use variorum_train::pictures::heatmap;
use variorum_train::run::Run;

use crate::device;

/// The most tokens a picture shows.
const MOST_TOKENS: usize = 128;

#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    /// A run directory.
    pub run: PathBuf,
    /// The text whose attention is drawn (at most model.seq_len tokens, and at most 128 for a picture).
    #[arg(long)]
    pub prompt: String,
    /// Draw this block application only (0 = nearest the embeddings).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Draw this head only.
    #[arg(long)]
    pub head: Option<usize>,
    /// Output picture, PNG or SVG by extension. Default: RUN/attention.png
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: AttentionArgs) -> Result<ExitCode> {
    let out = args.out.clone().unwrap_or_else(|| args.run.join("attention.png"));
    let extension = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(extension.as_deref(), Some("png" | "svg")) {
        bail!("--out {}: the picture is written as PNG or SVG, by its extension (.png or .svg)", out.display());
    }
    let (device, _) = device::select("cpu")?;
    let run = Run::load(&args.run, &device)?;
    let most = run.model.seq_len.min(MOST_TOKENS);
    if args.prompt.is_empty() {
        bail!("--prompt is empty: give a text of 1 to {most} tokens");
    }
    let ids = run.encode_prompt(&args.prompt)?;
    if ids.len() > most {
        bail!(
            "--prompt is {} tokens long: at most {most} are drawn (model.seq_len = {}, and at most {MOST_TOKENS} for a picture)",
            ids.len(),
            run.model.seq_len
        );
    }
    run.check_len(ids.len())?;
    let labels = heatmap::token_labels(&run.tokenizer, &ids);
    let maps = heatmap::read(&run.model, &run.config.model, &ids, labels, args.layer, args.head, &device)?;
    heatmap::draw(&maps, &out)?;
    println!("layer  head  entropy (nats)  mean distance (tokens)");
    for (layer, head, s) in maps.stats() {
        println!("{layer:>5}  {head:>4}  {:>14.3}  {:>22.2}", s.entropy, s.mean_distance);
    }
    eprintln!("attention weights of {} over {} tokens: {}", maps.kind, maps.len(), out.display());
    Ok(ExitCode::SUCCESS)
}
