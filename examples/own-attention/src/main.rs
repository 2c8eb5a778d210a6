//! A user's own attention kind, without forking variorum: `QkNormConfig` / `QkNormAttention`
//! (`qk_norm.rs`) implement variorum's `AttentionKind` / `AttentionMechanism` in this crate, one
//! call registers them under `kind = "qk-norm"`, and from then on a TOML config selects the kind
//! by name, variorum's trainer trains it (checkpoints, evaluation, sampling, summary), and the
//! generic harness checks it — no leak from the future, cached decoding = full forward,
//! save → load bit-identical, a tiny batch overfit — with one call.
//!
//! Run: `cargo run --release -p variorum-example-own-attention -- [STEPS]` (default 200): it
//! trains a 2-layer model with qk-norm attention on a small generated text and prints the
//! summary.

mod qk_norm;

use std::process::ExitCode;

use burn::prelude::*;
use qk_norm::QkNormConfig;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

/// Makes `kind = "qk-norm"` select this crate's kind (idempotent).
pub fn register() {
    variorum_attention::register::<QkNormConfig>("qk-norm").expect("\"qk-norm\" is not a built-in kind");
}

/// A config as a user would write it: the attention table names the registered kind.
pub fn config(corpus: &std::path::Path, steps: u64) -> String {
    format!(
        r#"
[model]
d_model = 64
n_layers = 2
seq_len = 32

[model.position]
kind = "rope"

[model.attention]
kind = "qk-norm"
n_heads = 4
n_kv_heads = 2

[data]
path = "{}"

[train]
steps = {steps}
batch_size = 8
warmup_steps = 20
lr = 3e-3
eval_interval = 50
eval_batches = 4
checkpoint_interval = 100
sample_tokens = 40
"#,
        corpus.display()
    )
}

/// A small text with structure to learn: ~24 kB of recurring phrases.
pub fn write_corpus(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let words = ["to be", "or not", "that is", "the question", "whether", "'tis nobler", "in the mind", "to suffer"];
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(words[(i * 7 + i / 3) % words.len()]);
        text.push(if i % 11 == 10 { '\n' } else { ' ' });
    }
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn run(steps: u64) -> Result<(), String> {
    register();
    let dir = std::env::temp_dir().join(format!("variorum-own-attention-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let corpus = write_corpus(&dir).map_err(|e| format!("writing the corpus: {e}"))?;
    let cfg = ExperimentConfig::parse(&config(&corpus, steps), false).map_err(|e| e.to_string())?;
    cfg.validate().map_err(|e| e.to_string())?;
    println!(
        "{}",
        cfg.to_toml()
            .lines()
            .skip_while(|l| !l.starts_with("[model.attention]"))
            .take(6)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let run_dir = dir.join("run");
    let outcome = train(cfg, &TrainOptions::new(&run_dir, Device::flex(), "flex")).map_err(|e| format!("{e:#}"))?;
    match outcome {
        Outcome::Finished(s) => println!(
            "qk-norm: {} steps, train loss {:.3}, validation loss {:.3}, {:.0} tokens/s; run directory {}",
            s.steps,
            s.final_train_loss.unwrap_or(f64::NAN),
            s.final_val_loss.unwrap_or(f64::NAN),
            s.tokens_per_sec,
            run_dir.display()
        ),
        Outcome::Interrupted { step, checkpoint } => println!("stopped at step {step}: {}", checkpoint.display()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let steps = match std::env::args().nth(1).map(|s| s.parse::<u64>()) {
        None => 200,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("error: STEPS must be a positive integer");
            return ExitCode::from(2);
        }
    };
    match run(steps) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use variorum_model::{harness, zoo};

    /// Burn's CPU backend has one process-wide RNG, which the trainer reseeds every step: the
    /// harness's seeded initialisations must not interleave with a training run.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_registered_kind_passes_the_generic_harness() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        register();
        let variants = zoo::attention_variants_of("qk-norm");
        assert_eq!(variants.len(), 3, "the kind's three test variants");
        let device = Device::flex();
        if let Err(failures) = harness::check_all(&variants, &device, &device.clone().autodiff()) {
            panic!("{}", failures.join("\n"));
        }
        // and the zoo lists it
        assert!(zoo::kinds().iter().any(|k| k.kind == "qk-norm"));
    }

    #[test]
    fn a_toml_config_selects_it_by_name_and_the_trainer_trains_it() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        register();
        let dir = std::env::temp_dir().join(format!("variorum-own-attention-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let corpus = write_corpus(&dir).unwrap();
        let cfg = ExperimentConfig::parse(&config(&corpus, 60), false).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.model.attention.kind(), "qk-norm");
        // the expanded config names the kind and parses back to the same value
        let again = ExperimentConfig::parse(&cfg.to_toml(), false).unwrap();
        assert_eq!(again.model, cfg.model.expanded());
        let Outcome::Finished(s) = train(cfg, &TrainOptions::new(dir.join("run"), Device::flex(), "flex")).unwrap()
        else {
            panic!("not interrupted")
        };
        let loss = s.final_val_loss.unwrap();
        // a uniform guess over the ~20 characters is ln 20 ≈ 3.0 nats
        assert!(loss < 2.0, "validation loss {loss} after 60 steps");
        // an unknown key in the user's table is refused with the key named
        let bad = config(&corpus, 60).replace("n_kv_heads = 2", "n_kv_headz = 2");
        let e = ExperimentConfig::parse(&bad, false).unwrap_err().to_string();
        assert!(e.contains("n_kv_headz") && e.contains("model.attention"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_built_in_name_cannot_be_taken() {
        assert!(variorum_attention::register::<QkNormConfig>("full").is_err());
    }
}
