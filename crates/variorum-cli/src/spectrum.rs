//! `variorum spectrum`: how low-rank a trained model's attention matrices are — the
//! normalised cumulative singular values of every head's probability matrix P, per layer, over
//! windows of the validation split (Wang et al. 2020, Linformer, Figure 1: the spectrum
//! concentrates in the first singular values, so P ≈ a rank-k matrix with k ≪ n).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use burn::prelude::*;
use nalgebra::DMatrix;
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_train::run::Run;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct SpectrumArgs {
    /// Run directory (a plain stack whose attention forms probabilities).
    pub run: PathBuf,
    /// Windows of the model's context, spread over the validation split.
    #[arg(long, default_value_t = 16)]
    pub windows: usize,
    /// Where to draw the curves (default RUN/spectrum.png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: SpectrumArgs) -> Result<ExitCode> {
    let (device, _) = args.device.select()?;
    let run = Run::load(&args.run, &device)?;
    if args.windows == 0 {
        bail!("--windows must be at least 1");
    }
    if run.config.data.graph.is_some() {
        bail!(
            "{} trained on graph examples (data.graph): the spectrum reads windows of text, which its attention never saw",
            args.run.display()
        );
    }
    if run.config.model.is_encoder_decoder() {
        bail!(
            "{} is an encoder–decoder: the spectrum reads a decoder stack's self-attention over windows of text",
            args.run.display()
        );
    }
    let len = run.config.model.seq_len;
    let ids = run.validation_tokens()?;
    if ids.len() < args.windows * len {
        bail!("the validation split has {} tokens, fewer than {} windows of {len}", ids.len(), args.windows);
    }
    // windows spread over the split
    let step = ids.len() / args.windows;
    let rows: Vec<i64> =
        (0..args.windows).flat_map(|w| ids[w * step..w * step + len].iter().map(|&t| t as i64)).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(rows, [args.windows, len]), &device);
    let maps = run.model.attention_maps(tokens).map_err(|e| anyhow::anyhow!("{}: {e}", args.run.display()))?;
    println!("# normalised cumulative singular values of P (n = {len}), mean over heads and {} windows", args.windows);
    println!("{:>6} {:>8} {:>8} {:>8} {:>8} {:>10}", "layer", "k=1", "k=n/8", "k=n/4", "k=n/2", "k(90%)");
    let mut series = Vec::new();
    for (layer, map) in maps.into_iter().enumerate() {
        let Some(map) = map else {
            bail!("layer {layer}'s attention ({}) forms no probability matrix", run.config.model.attention.kind());
        };
        let [b, h, n, _] = map.dims();
        let values: Vec<f32> = map.into_data().convert::<f32>().try_into_vec::<f32>().unwrap_or_default();
        let mut mean = vec![0f64; n];
        for m in 0..b * h {
            let p = DMatrix::from_row_slice(n, n, &values[m * n * n..(m + 1) * n * n]).map(f64::from);
            let mut s: Vec<f64> = p.singular_values().iter().copied().collect();
            s.sort_by(|a, b| b.total_cmp(a));
            let total: f64 = s.iter().sum::<f64>().max(f64::MIN_POSITIVE);
            let mut acc = 0.0;
            for (k, v) in s.iter().enumerate() {
                acc += v;
                mean[k] += acc / total / (b * h) as f64;
            }
        }
        let at = |k: usize| mean[k.clamp(1, n) - 1];
        let k90 = mean.iter().position(|&c| c >= 0.9).map_or(n, |k| k + 1);
        println!("{layer:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>10}", at(1), at(n / 8), at(n / 4), at(n / 2), k90);
        let (r, g, b) = Palette99::COLORS[layer % Palette99::COLORS.len()];
        let points: Vec<(f64, f64)> = mean.iter().enumerate().map(|(k, &c)| ((k + 1) as f64, c)).collect();
        series.push((format!("layer {layer}"), points, RGBColor(r, g, b)));
    }
    let path = args.plot.unwrap_or_else(|| args.run.join("spectrum.png"));
    let named: Vec<(&str, Vec<(f64, f64)>, RGBColor, bool)> =
        series.iter().map(|(n, p, c)| (n.as_str(), p.clone(), *c, false)).collect();
    let title = "attention matrices: cumulative singular values";
    if variorum_train::pictures::plot::lines(&named, &path, title, "singular value index", "normalised cumulative sum")?
    {
        println!("# plot: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
