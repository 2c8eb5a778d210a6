//! `variorum favor-error`: how well Performer's FAVOR+ features approximate softmax attention
//! as the number of random features m grows, with i.i.d. and with orthogonal random features
//! (Choromanski et al. 2021, Figure 3: the error falls with m, and orthogonal features give a
//! lower error than i.i.d. ones). The error is the mean squared difference between the
//! normalised attention matrix from the features and softmax(q kᵀ/√d), over random q, k.

use std::process::ExitCode;

use anyhow::{Result, bail};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use plotters::style::{BLUE, RED};
use variorum_attention::PerformerConfig;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct FavorErrorArgs {
    /// Random feature counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
    pub features: Vec<usize>,
    /// Sequence length of the random queries and keys.
    #[arg(long, default_value_t = 256)]
    pub len: usize,
    /// Head size d.
    #[arg(long, default_value_t = 16)]
    pub head_dim: usize,
    /// Standard deviation of the queries' and keys' entries.
    #[arg(long, default_value_t = 1.0)]
    pub std: f64,
    /// Draws of the features (and of q, k) averaged per point.
    #[arg(long, default_value_t = 20)]
    pub draws: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to draw the curves (log–log).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Mean squared error of the FAVOR+ attention matrix with `m` features over `draws` draws of
/// the features and of q, k ~ N(0, std²) `[1, 1, len, d]`.
fn error(m: usize, orthogonal: bool, args: &FavorErrorArgs, device: &Device) -> f64 {
    let d = args.head_dim;
    let cfg = PerformerConfig { n_heads: 1, head_dim: Some(d), features: Some(m), orthogonal, ..Default::default() };
    let mut total = 0.0;
    for _ in 0..args.draws {
        let performer = cfg.init(d, 0.02, 0.02, device);
        let draw = || Tensor::<4>::random([1, 1, args.len, d], Distribution::Normal(0.0, args.std), device);
        let (q, k) = (draw(), draw());
        let exact = softmax(q.clone().matmul(k.clone().swap_dims(2, 3)).div_scalar((d as f64).sqrt()), 3);
        let (fq, fk, _) = performer.features(q, k);
        let scores = fq.matmul(fk.swap_dims(2, 3));
        let approx = scores.clone() / scores.sum_dim(3).clamp_min(1e-30);
        total += (approx - exact).powf_scalar(2.0).mean().into_scalar::<f32>() as f64;
    }
    total / args.draws as f64
}

pub fn run(args: FavorErrorArgs) -> Result<ExitCode> {
    if args.features.is_empty() || args.features.contains(&0) {
        bail!("--features: give feature counts of at least 1, e.g. 8,16,32,64,128,256");
    }
    for (name, v) in [("--len", args.len), ("--head-dim", args.head_dim), ("--draws", args.draws)] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if !(args.std > 0.0 && args.std.is_finite()) {
        bail!("--std = {} must be positive", args.std);
    }
    let (device, _) = args.device.select()?;
    device.seed(args.seed);
    println!(
        "# FAVOR+ vs softmax attention: MSE of the attention matrix, L = {}, d = {}, q, k ~ N(0, {}²), {} draws",
        args.len, args.head_dim, args.std, args.draws
    );
    println!("{:>9} {:>12} {:>12} {:>10}", "features", "iid", "orthogonal", "orth/iid");
    let (mut iid, mut orth) = (Vec::new(), Vec::new());
    for &m in &args.features {
        let (a, b) = (error(m, false, &args, &device), error(m, true, &args, &device));
        println!("{m:>9} {a:>12.4e} {b:>12.4e} {:>10.3}", b / a);
        iid.push((m as f64, a));
        orth.push((m as f64, b));
    }
    if let Some(path) = &args.plot {
        let series = [("iid", iid, BLUE, true), ("orthogonal", orth, RED, true)];
        let title = "FAVOR+ approximation error";
        if variorum_train::pictures::plot::log_lines(
            &series,
            path,
            title,
            "random features m",
            "MSE of the attention matrix",
        )? {
            println!("# plot: {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
