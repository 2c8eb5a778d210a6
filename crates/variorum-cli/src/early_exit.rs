//! `variorum early-exit`: a CALM quality/compute curve for a run with early exits — validation
//! loss against mean blocks used, per confidence measure and threshold — and the calibrated
//! threshold of each measure.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_train::early_exit::{Confidence, calibrate, calibrate_ltt, sweep};
use variorum_train::run::Run;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct EarlyExitArgs {
    pub run: PathBuf,
    /// Thresholds to try, comma-separated (1 = the full model).
    #[arg(long, value_delimiter = ',', default_value = "1,0.995,0.99,0.95,0.9,0.8,0.6,0.4,0.2,0")]
    pub thresholds: Vec<f64>,
    /// Validation tokens to decode (token by token, so keep it modest).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Loss increase allowed by the calibration, nats.
    #[arg(long, default_value_t = 0.02)]
    pub tolerance: f64,
    /// Learn-then-Test calibration: the largest fraction of tokens whose prediction may change.
    #[arg(long, default_value_t = 0.1)]
    pub ltt_delta: f64,
    /// Learn-then-Test calibration: the test's level (1 − confidence).
    #[arg(long, default_value_t = 0.05)]
    pub ltt_epsilon: f64,
    /// Where to draw the curve (default RUN/early-exit.png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: EarlyExitArgs) -> Result<ExitCode> {
    if !(args.tolerance >= 0.0 && args.tolerance.is_finite()) {
        bail!("--tolerance {} must be >= 0 (nats of loss above the full model)", args.tolerance);
    }
    let (device, _) = args.device.select()?;
    let run = Run::load(&args.run, &device)?;
    if run.model.exits.is_none() {
        bail!("{} has no early exits: train it with [model.exits] kind = \"every-layer\"", args.run.display());
    }
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--thresholds: {t} is not in [0, 1]");
    }
    for (name, v) in [("--ltt-delta", args.ltt_delta), ("--ltt-epsilon", args.ltt_epsilon)] {
        if !(v > 0.0 && v < 1.0) {
            bail!("{name} = {v} must be in (0, 1)");
        }
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
    println!("{:<18} {:>9} {:>9} {:>12} {:>10}", "confidence", "threshold", "loss", "mean blocks", "changed %");
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
    let mut calibrated = Vec::new();
    for (k, &confidence) in measures.iter().enumerate() {
        let points = sweep(&run.model, &ids, confidence, &args.thresholds, &device);
        let full = &points[0];
        for p in &points {
            println!(
                "{:<18} {:>9.3} {:>9.4} {:>12.3} {:>10.2}",
                confidence.name(),
                p.threshold,
                p.loss(),
                p.blocks(),
                100.0 * p.changed(full)
            );
        }
        let name = confidence.name();
        calibrated.push(match calibrate(&points, args.tolerance) {
            Some(p) => format!(
                "# calibrated {name}: threshold {} keeps the loss within {} of the full model ({:.4}, {:.2} blocks)",
                p.threshold,
                args.tolerance,
                p.loss(),
                p.blocks()
            ),
            None => format!("# calibrated {name}: no threshold below 1 keeps the loss within {}", args.tolerance),
        });
        let (delta, epsilon) = (args.ltt_delta, args.ltt_epsilon);
        calibrated.push(match calibrate_ltt(&points, delta, epsilon) {
            Some(p) => format!(
                "# LTT {name}: threshold {}: {:.1} % of predictions change, ≤ {:.0} % at level {epsilon} ({:.2} blocks)",
                p.threshold,
                100.0 * p.changed(full),
                100.0 * delta,
                p.blocks()
            ),
            None => format!(
                "# LTT {name}: no threshold below 1 keeps the changed predictions under {:.0} % at level {epsilon}",
                100.0 * delta
            ),
        });
        let (r, g, b) = Palette99::COLORS[k % Palette99::COLORS.len()];
        series.push((name, points.iter().map(|p| (p.blocks(), p.loss())).collect(), RGBColor(r, g, b), true));
    }
    for line in calibrated {
        println!("{line}");
    }
    let path = args.plot.unwrap_or_else(|| args.run.join("early-exit.png"));
    if variorum_train::pictures::plot::lines(
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
