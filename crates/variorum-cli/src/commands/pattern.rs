//! `variorum pattern`: draw which keys each query may attend to, per head, as read from the real
//! attention module of a config's kind, or of a trained run on a text (`--prompt`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::ExperimentConfig;
use variorum_train::pictures::pattern;
use variorum_train::run::Run;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct PatternArgs {
    /// A config file, or a run directory (then --prompt gives the text).
    pub source: PathBuf,
    /// Positions drawn (a config; at most model.seq_len, which is also the default up to 64).
    #[arg(long)]
    pub len: Option<usize>,
    /// The block application drawn.
    #[arg(long, default_value_t = 0)]
    pub layer: usize,
    /// Draw this head only.
    #[arg(long)]
    pub head: Option<usize>,
    /// The text a run reads (data-dependent kinds draw the pattern of their input).
    #[arg(long)]
    pub prompt: Option<String>,
    /// PNG or SVG, by extension.
    #[arg(long, default_value = "pattern.png")]
    pub out: PathBuf,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: PatternArgs) -> Result<ExitCode> {
    let PatternArgs { source, len, layer, head, prompt, out, device } = args;
    let (device, _) = device.select()?;
    let mut p = if source.is_dir() {
        let Some(text) = prompt else {
            anyhow::bail!("{} is a run: give the text it reads with --prompt", source.display())
        };
        let run = Run::load(&source, &device)?;
        let ids = run.encode_prompt(&text)?;
        let most = len.unwrap_or(run.model.seq_len).min(run.model.seq_len);
        if most == 0 || most > 512 {
            anyhow::bail!("--len {most} must be in 1..=512 (a picture of at most 512 × 512 positions)");
        }
        let ids: Vec<i64> = ids.iter().take(most).map(|&t| i64::from(t)).collect();
        let n = ids.len();
        let tokens = burn::prelude::Tensor::<2, burn::prelude::Int>::from_data(
            burn::prelude::TensorData::new(ids, [1, n]),
            &device,
        );
        pattern::read(&run.model, &run.config.model, tokens, layer, None)?
    } else {
        if prompt.is_some() {
            anyhow::bail!("--prompt is read through a trained run: give a run directory, not a config");
        }
        let cfg = ExperimentConfig::load(&source)?;
        pattern::of_config(&cfg.model, len.unwrap_or(cfg.model.seq_len.min(64)), layer, &device)?
    };
    if let Some(h) = head {
        if p.reading == pattern::Reading::Gradient {
            anyhow::bail!(
                "--head {h}: {} forms no weights, so its pattern is read for the whole layer (the output projection mixes the heads)",
                p.kind
            );
        }
        if h >= p.grids.len() {
            anyhow::bail!(
                "--head {h}: {} has {} grid(s) here (heads are drawn apart only from weights)",
                p.kind,
                p.grids.len()
            );
        }
        p.grids = vec![p.grids.swap_remove(h)];
    }
    pattern::draw(&p, &out)?;
    let densities: Vec<String> = p.densities().iter().map(|d| format!("{:.1} %", 100.0 * d)).collect();
    println!(
        "{}, layer {}, {} positions, read from {}: reachable {} — {}",
        p.kind,
        p.layer,
        p.len,
        match p.reading {
            pattern::Reading::Weights => "the weights",
            pattern::Reading::Gradient => "gradients",
        },
        densities.join(", "),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
