//! `variorum eval`: loss of one or several runs at one or several context lengths.
//!
//! With several runs it is the side-by-side comparison: one row per run, one column per length,
//! `n/a` where a run cannot encode that length (a learned position table), and one plot with a
//! line per run. A memory model is read as ordered streams carrying its memory (and, alone,
//! also without it, at the same segment length).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_data::SplitTags;
use variorum_train::run::Run;

use crate::device;

pub struct EvalArgs {
    pub runs: Vec<PathBuf>,
    pub data: Option<PathBuf>,
    pub seq_len: Vec<usize>,
    pub stride: Option<usize>,
    pub max_tokens: Option<usize>,
    pub plot: Option<PathBuf>,
    /// `key=value` settings applied to every run's config before loading (`--set`).
    pub settings: Vec<String>,
    pub device: String,
}

/// The token ids to evaluate `run` on, where they come from and, for the run's tagged
/// validation split, where its example tags change.
fn tokens(run: &Run, args: &EvalArgs) -> Result<(Vec<u32>, String, Option<SplitTags>)> {
    let (mut ids, source, tags) = match &args.data {
        Some(path) => {
            let text = variorum_data::read_text(path)?;
            let ids = run.tokenizer.encode(&text).with_context(|| format!("{} cannot be encoded", path.display()))?;
            if run.config.model.attention.tags().is_some() {
                eprintln!("note: {} is read untagged (tag 0) by a model conditioned on example tags", path.display());
            }
            (ids, path.display().to_string(), None)
        }
        None => {
            let (ids, tags) = run.validation_split()?;
            (ids, "the validation split".to_string(), tags)
        }
    };
    if let Some(n) = args.max_tokens {
        ids.truncate(n);
    }
    if ids.len() < 2 {
        bail!("{source} has {} tokens: nothing to evaluate", ids.len());
    }
    Ok((ids, source, tags))
}

fn check_lengths(lengths: &[usize], stride: Option<usize>) -> Result<()> {
    for &len in lengths {
        if len == 0 {
            bail!("--seq-len 0: a context needs at least one token");
        }
        let stride = stride.unwrap_or(len);
        if stride == 0 || stride > len {
            bail!("--stride {stride} must be in 1..={len} (the context length)");
        }
    }
    Ok(())
}

fn draw(series: &[(String, Vec<(f64, f64)>)], path: PathBuf) -> Result<()> {
    let colours = series.iter().enumerate().map(|(i, _)| {
        let (r, g, b) = Palette99::COLORS[i % Palette99::COLORS.len()];
        RGBColor(r, g, b)
    });
    let series: Vec<_> = series.iter().zip(colours).map(|((n, p), c)| (n.as_str(), p.clone(), c, true)).collect();
    if variorum_train::plot::lines(
        &series,
        &path,
        "loss against context length",
        "context length (tokens)",
        "loss (nats/token)",
    )? {
        println!("# plot: {}", path.display());
    }
    Ok(())
}

pub fn eval(args: EvalArgs) -> Result<ExitCode> {
    check_lengths(&args.seq_len, args.stride)?;
    let (device, _) = device::select(&args.device)?;
    if !args.settings.is_empty() {
        println!("# with {}", args.settings.join(", "));
    }
    if args.runs.len() == 1 {
        return eval_one(&args, &device);
    }
    if args.seq_len.is_empty() {
        bail!("comparing several runs needs --seq-len (the lengths to compare at)");
    }
    print!("{:<28}", "run");
    for len in &args.seq_len {
        print!(" {:>9}", format!("L={len}"));
    }
    println!();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    for dir in &args.runs {
        let run = Run::load_with(dir, &device, &args.settings)?;
        let (ids, _, tags) = tokens(&run, &args)?;
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        print!("{name:<28}");
        let mut points = Vec::new();
        for &len in &args.seq_len {
            if let Err(e) = run.check_len(len) {
                print!(" {:>9}", "n/a");
                notes.push(format!("{name} at {len}: {e}"));
                continue;
            }
            let stride = args.stride.unwrap_or(len);
            let (loss, _) = if run.model.mask_token.is_some() {
                variorum_train::eval::masked_loss(&run.model, &run.config.model, &ids, tags.as_ref(), len, &device)
            } else if run.model.has_memory() {
                variorum_train::eval::stream_loss(&run.model, &ids, len, STREAMS, true, &device)
            } else {
                variorum_train::eval::sliding_loss(&run.model, &ids, tags.as_ref(), len, stride, &device)
            };
            print!(" {loss:>9.4}");
            std::io::Write::flush(&mut std::io::stdout())?;
            points.push((len as f64, loss));
        }
        println!();
        series.push((name, points));
    }
    for n in notes {
        println!("# n/a: {n}");
    }
    let path = args.plot.clone().unwrap_or_else(|| PathBuf::from("eval.png"));
    draw(&series, path)?;
    Ok(ExitCode::SUCCESS)
}

/// Streams read in parallel by the memory evaluation (each carries its own memory).
const STREAMS: usize = 16;

/// A memory model: the same segments scored carrying the memory from segment to segment, and
/// each from nothing.
fn eval_memory(run: &Run, ids: &[u32], lengths: &[usize], device: &burn::prelude::Device) -> Result<ExitCode> {
    println!("# {STREAMS} streams read segment by segment; memory = {}", run.config.model.memory.kind());
    println!("{:>8} {:>10} {:>14} {:>14} {:>10}", "segment", "tokens", "with memory", "without", "gain");
    for &len in lengths {
        let (with, n) = variorum_train::eval::stream_loss(&run.model, ids, len, STREAMS, true, device);
        let (without, _) = variorum_train::eval::stream_loss(&run.model, ids, len, STREAMS, false, device);
        if n == 0 {
            bail!("{} tokens are fewer than {STREAMS} streams of one {len}-token segment", ids.len());
        }
        println!("{len:>8} {n:>10} {with:>14.4} {without:>14.4} {:>10.4}", without - with);
    }
    Ok(ExitCode::SUCCESS)
}

/// A masked language model: the loss on the hidden tokens of disjoint windows (the same hidden
/// tokens as the run's own validation, the same for every run).
fn eval_masked(
    run: &Run,
    ids: &[u32],
    tags: Option<&SplitTags>,
    lengths: &[usize],
    device: &burn::prelude::Device,
) -> Result<ExitCode> {
    println!("# masked language model: loss on the hidden tokens of disjoint windows");
    println!("{:>8} {:>8} {:>10} {:>10} {:>12}", "seq_len", "stride", "hidden", "loss", "perplexity");
    for &len in lengths {
        let (loss, n) = variorum_train::eval::masked_loss(&run.model, &run.config.model, ids, tags, len, device);
        if n == 0 {
            bail!("{} tokens are fewer than one {len}-token window", ids.len());
        }
        println!("{len:>8} {len:>8} {n:>10} {loss:>10.4} {:>12.3}", loss.exp());
    }
    Ok(ExitCode::SUCCESS)
}

fn eval_one(args: &EvalArgs, device: &burn::prelude::Device) -> Result<ExitCode> {
    let run = Run::load_with(&args.runs[0], device, &args.settings)?;
    let (ids, source, tags) = tokens(&run, args)?;
    let lengths = if args.seq_len.is_empty() { vec![run.model.seq_len] } else { args.seq_len.clone() };
    check_lengths(&lengths, args.stride)?;
    for &len in &lengths {
        run.check_len(len)?;
    }
    println!("# {} tokens of {source}", ids.len());
    if run.model.has_memory() {
        return eval_memory(&run, &ids, &lengths, device);
    }
    if run.model.mask_token.is_some() {
        return eval_masked(&run, &ids, tags.as_ref(), &lengths, device);
    }
    let unit = run.tokenizer.unit();
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>12} {:>12}",
        "seq_len",
        "stride",
        "tokens",
        "loss",
        "perplexity",
        format!("bits/{unit}")
    );
    let mut points = Vec::new();
    for len in lengths {
        let stride = args.stride.unwrap_or(len);
        let (loss, n) = variorum_train::eval::sliding_loss(&run.model, &ids, tags.as_ref(), len, stride, device);
        println!(
            "{len:>8} {stride:>8} {n:>10} {loss:>10.4} {:>12.3} {:>12.4}",
            loss.exp(),
            loss / std::f64::consts::LN_2
        );
        points.push((len as f64, loss));
    }
    if let Some((mean, shares)) = variorum_train::eval::steps_per_token(&run.model, &ids, run.model.seq_len, device) {
        println!("# adaptive computation time: {}", variorum_train::eval::format_steps(mean, &shares));
    }
    if points.len() > 1 {
        let path = args.plot.clone().unwrap_or_else(|| run.dir.join("eval.png"));
        draw(&[("validation loss".to_string(), points)], path)?;
    }
    Ok(ExitCode::SUCCESS)
}
