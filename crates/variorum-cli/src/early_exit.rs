//! `variorum early-exit`: a CALM quality/compute curve for a run with early exits — validation
//! loss against mean blocks used, per confidence measure and threshold — and the calibrated
//! threshold of each measure.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_train::early_exit::{Confidence, ExitPolicy, calibrate, exit_loss};
use variorum_train::run::Run;

use crate::device;

pub struct Args {
    pub run: PathBuf,
    pub thresholds: Vec<f64>,
    pub max_tokens: usize,
    pub tolerance: f64,
    pub plot: Option<PathBuf>,
    pub device: String,
}

pub fn early_exit(args: Args) -> Result<ExitCode> {
    let (device, _) = device::select(&args.device)?;
    let run = Run::load(&args.run, &device)?;
    if run.model.exits.is_none() {
        bail!("{} has no early exits: train it with [model.exits] kind = \"every-layer\"", args.run.display());
    }
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--thresholds: {t} is not in [0, 1]");
    }
    let mut ids = run.validation_tokens()?;
    ids.truncate(args.max_tokens);
    if ids.len() <= run.model.seq_len {
        bail!("{} validation tokens are not one window of {}", ids.len(), run.model.seq_len);
    }
    let depth = run.model.depth;
    let exits = run.model.exits.as_ref();
    println!("# {} validation tokens, windows of {}, {depth} blocks", ids.len(), run.model.seq_len);
    if let Some(p) = exits.and_then(|e| e.predictor.as_ref()) {
        println!("# exit predictor: {}, {:?} oracle, λ = {}, σ = {}", p.kind.name(), p.oracle, p.lambda, p.sigma);
    }
    println!("{:<18} {:>9} {:>9} {:>12}", "confidence", "threshold", "loss", "mean blocks");
    let mut series = Vec::new();
    let has_classifier = exits.is_some_and(|e| !e.classifiers.is_empty());
    let has_predictor = exits.is_some_and(|e| e.predictor.is_some());
    let measures: Vec<Confidence> = Confidence::ALL
        .into_iter()
        .filter(|c| match c {
            Confidence::Classifier => has_classifier,
            Confidence::Predictor => has_predictor,
            _ => true,
        })
        .collect();
    for (k, &confidence) in measures.iter().enumerate() {
        let mut points = Vec::new();
        for &threshold in &args.thresholds {
            let (loss, blocks) = exit_loss(&run.model, &ids, ExitPolicy { confidence, threshold }, &device);
            println!("{:<18} {threshold:>9.3} {loss:>9.4} {blocks:>12.3}", confidence.name());
            points.push((blocks, loss));
        }
        let (r, g, b) = Palette99::COLORS[k % Palette99::COLORS.len()];
        series.push((confidence.name(), points, RGBColor(r, g, b), true));
    }
    for &confidence in &measures {
        match calibrate(&run.model, &ids, confidence, args.tolerance, &args.thresholds, &device) {
            Some((t, loss, blocks)) => println!(
                "# calibrated {}: threshold {t} keeps the loss within {} of the full model ({loss:.4}, {blocks:.2} blocks)",
                confidence.name(),
                args.tolerance
            ),
            None => println!(
                "# calibrated {}: no threshold below 1 keeps the loss within {}",
                confidence.name(),
                args.tolerance
            ),
        }
    }
    let path = args.plot.unwrap_or_else(|| args.run.join("early-exit.png"));
    if variorum_train::plot::lines(
        &series,
        &path,
        "early exit: loss against compute",
        "mean blocks per token",
        "loss (nats/token)",
    )? {
        println!("# plot: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
