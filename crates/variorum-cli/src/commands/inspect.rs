//! `variorum inspect`: print a config (or a run's) with every default expanded, its parameter
//! count and FLOPs per token; for a run of an adaptive model, also what it learned.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use variorum_data::Corpus;
use variorum_train::ExperimentConfig;
use variorum_train::run::Run;

use crate::device;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A config file, or a run directory.
    pub config: PathBuf,
}

pub fn run(args: InspectArgs) -> Result<ExitCode> {
    let path = args.config.as_path();
    let (mut cfg, source) = if path.is_dir() {
        (ExperimentConfig::load(&path.join("config.toml"))?, "run")
    } else {
        (ExperimentConfig::load(path)?, "config")
    };
    if cfg.model.kind == variorum_model::ModelKind::DecisionTransformer {
        return inspect_decision(cfg, path, source);
    }
    let vocab_note = if cfg.model.vocab_size.is_some() {
        String::new()
    } else {
        match Corpus::load(&cfg.data, None) {
            Ok(c) => {
                cfg.model.resolve(c.tokenizer.vocab_size())?;
                format!("  (from the {} tokenizer of {})", c.tokenizer.unit(), c.path.display())
            }
            Err(e) => {
                cfg.model.vocab_size = Some(256);
                format!("  (assumed: the corpus could not be read: {e})")
            }
        }
    };
    print!("{}", cfg.to_toml());
    let model = cfg.model.init(&device::select("cpu")?.0);
    let params = burn::module::Module::num_params(&model);
    let embed = cfg.model.vocab() * cfg.model.d_model;
    let fwd = cfg.model.flops_per_token();
    println!();
    println!("# {source} {}", path.display());
    println!("# vocabulary        {}{vocab_note}", cfg.model.vocab());
    println!(
        "# parameters        {params} ({:.2} M; {:.2} M without the token embedding)",
        params as f64 / 1e6,
        (params - embed) as f64 / 1e6
    );
    println!(
        "# FLOPs per token   {:.2} M forward, {:.2} M training (3×), at context {}",
        fwd as f64 / 1e6,
        3.0 * fwd as f64 / 1e6,
        cfg.model.seq_len
    );
    if path.is_dir() {
        // the config above is what inspect is for: a run without final weights (still training)
        // or without its corpus only loses these extra lines
        if learns(&cfg)
            && let Err(e) = learned_behaviour(path)
        {
            println!("# (learned spans / steps not shown: {e:#})");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A Decision Transformer's config: its state and action sizes come from its trajectory file.
fn inspect_decision(mut cfg: ExperimentConfig, path: &Path, source: &str) -> Result<ExitCode> {
    let data = cfg.data.trajectories.clone().expect("validated: a Decision Transformer reads trajectories");
    let set = variorum_data::decision::TrajectorySet::load(&data);
    let note = match &set {
        Ok(set) => {
            variorum_train::decision::resolve(&mut cfg.model, set, &data)?;
            format!("from {}", data.display())
        }
        Err(e) => format!("not counted: {e}"),
    };
    print!("{}", cfg.to_toml());
    println!();
    println!("# {source} {}", path.display());
    match set {
        Ok(_) => {
            let model = cfg.model.init_decision(&device::select("cpu")?.0);
            println!(
                "# parameters        {} (state and action sizes {note})",
                burn::module::Module::num_params(&model)
            );
        }
        Err(_) => println!("# parameters        {note}"),
    }
    let d = cfg.model.decision.clone().unwrap_or_default();
    println!("# context           {} steps of {} tokens", cfg.model.seq_len / d.tokens_per_step(), d.tokens_per_step());
    let fwd = cfg.model.flops_per_token();
    println!("# FLOPs per token   {:.2} M forward, {:.2} M training (3×)", fwd as f64 / 1e6, 3.0 * fwd as f64 / 1e6);
    Ok(ExitCode::SUCCESS)
}

/// Whether the run's model learns something its report shows as text (`learned_behaviour`): its
/// attention says so, or its depth does (ACT's steps per token).
fn learns(cfg: &ExperimentConfig) -> bool {
    cfg.model.attention.shows_what_it_learned() || cfg.model.depth.shows_what_it_learned()
}

/// What an adaptive-span or ACT run learned (the views of its report, as text): the span of
/// every head, the steps per token on the validation split.
fn learned_behaviour(run: &Path) -> Result<()> {
    let (device, _) = device::select("cpu")?;
    let loaded = Run::load(run, &device)?;
    for (title, lines) in variorum_train::pictures::report::learned_text(&loaded, &device)? {
        println!("# {title}");
        for line in lines {
            println!("#   {line}");
        }
    }
    Ok(())
}
