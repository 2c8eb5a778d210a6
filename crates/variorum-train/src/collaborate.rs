//! A trained run's full multi-head attention re-parameterised as collaborative heads
//! (Cordonnier, Loukas, Jaggi 2020): every layer's heads become one shared query and key
//! projection of width D̃ (`shared_dim`) with a mixing vector per head
//! ([`variorum_attention::CollaborativeAttention::from_heads`]), everything else is copied, and the result is written
//! as a new run directory that [`Run::load`] reads, `variorum eval` evaluates and
//! `variorum train CONFIG --init-from DIR` fine-tunes.
//!
//! D̃ = n_heads · head_dim (the default) is exact: the new run computes the same logits, to
//! rounding. A smaller D̃ compresses the query/key projections by a rank-D̃ CP decomposition of
//! each layer's stacked per-head products W_Q^h W_K^hᵀ, whose relative error is reported per
//! layer.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! let device = burn::prelude::Device::flex();
//! let run = variorum_train::run::Run::load("runs/gpt".as_ref(), &device)?;
//! let report = variorum_train::collaborate::collaborate(&run, Some(64), "runs/gpt-collab".as_ref())?;
//! println!("{:?}", report.layer_errors);
//! # Ok(()) }
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use serde::Serialize;

use crate::checkpoint::write_atomic;
use crate::config::ExperimentConfig;
use crate::run::Run;

/// What [`collaborate`] did.
#[derive(Debug, Clone, Serialize)]
pub struct CollaborateReport {
    /// The run re-parameterised.
    pub source: PathBuf,
    /// The run directory written.
    pub out: PathBuf,
    /// Heads per layer.
    pub n_heads: usize,
    /// Width of each head's queries and keys.
    pub head_dim: usize,
    /// D̃, the width of the shared query/key projections.
    pub shared_dim: usize,
    /// n_heads · head_dim: the width at which the re-parameterisation is exact.
    pub full_width: usize,
    /// ‖T − T̂‖_F / ‖T‖_F of the query–key products, per block (0 = exact). One entry per
    /// distinct block: a Universal Transformer's shared block is one.
    pub layer_errors: Vec<f64>,
    /// Parameters of the attention layers (all blocks), before and after.
    pub attention_params_before: usize,
    /// Parameters of the attention layers after.
    pub attention_params_after: usize,
    /// Parameters of the whole model, before and after.
    pub model_params_before: usize,
    /// Parameters of the whole model after.
    pub model_params_after: usize,
    /// Settings of the run that the collaborative form does not carry (said, not refused).
    pub notes: Vec<String>,
}

/// Re-parameterises `run`'s attention as collaborative heads of width `shared_dim` (default
/// n_heads · head_dim: exact) and writes the result to `out` as a run directory: `config.toml`
/// (the run's config with `model.attention` replaced by a `collaborative` one of the same heads,
/// dropout, bias and normaliser), `tokenizer.json` (copied), `model.bpk` and
/// `collaborate.json` (this report). The directory is assembled beside `out` and renamed into
/// place, so `out` is either absent or complete.
///
/// Refused, with a one-line error: a run whose attention is not `full`, a `shared_dim` outside
/// 1..=n_heads · head_dim, a config the collaborative kind does not take (the configuration
/// rules decide: e.g. RoPE or a per-head relative scheme), and an `out` that exists and is not
/// an empty directory.
pub fn collaborate(run: &Run, shared_dim: Option<usize>, out: &Path) -> Result<CollaborateReport> {
    let source = run.dir.display();
    let model_cfg = &run.config.model;
    if model_cfg.is_encoder_decoder() {
        bail!("{source} is an encoder–decoder: collaborate re-parameterises a decoder stack's self-attention only");
    }
    let heads = model_cfg.attention.heads(model_cfg.d_model);
    let (n_heads, head_dim) = (heads.n_heads, heads.head_dim);
    let width = n_heads * head_dim;
    let shared = shared_dim.unwrap_or(width);
    // the run's config with collaborative heads of the same shape; its rules decide the rest
    // (position schemes that read per-head queries and keys, RoPE, …)
    let (attention, notes) = model_cfg
        .attention
        .as_collaborative(model_cfg.d_model, shared)
        .map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    if !(1..=width).contains(&shared) {
        bail!(
            "--shared-dim {shared} does not fit {source}: it must be in 1..={width} (n_heads · head_dim = {n_heads} · {head_dim}; {width} is exact, less compresses the query/key projections)"
        );
    }
    let mut config = run.config.clone();
    config.model.attention = attention;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("{source} cannot be re-parameterised into collaborative heads: {e}"))?;

    check_out(out)?;

    // the run's model with only the attention replaced: every other module is built from the
    // same config values (checked below by loading the result into the new config's model)
    let mut model = run.model.clone();
    let mut layer_errors = Vec::with_capacity(model.blocks.len());
    let mut attention_params_before = 0;
    let mut attention_params_after = 0;
    for (i, block) in model.blocks.iter_mut().enumerate() {
        attention_params_before += block.attn.num_params();
        let (layer, error) = block
            .attn
            .as_collaborative(shared, &run.device)
            .map_err(|e| anyhow::anyhow!("{source}: block {i}: {e}"))?;
        block.attn = layer;
        attention_params_after += block.attn.num_params();
        layer_errors.push(error);
    }

    let report = CollaborateReport {
        source: run.dir.clone(),
        out: out.to_path_buf(),
        n_heads,
        head_dim,
        shared_dim: shared,
        full_width: width,
        layer_errors,
        attention_params_before,
        attention_params_after,
        model_params_before: run.model.num_params(),
        model_params_after: model.num_params(),
        notes,
    };
    write_run(run, &config, model, &report, out)?;
    Ok(report)
}

/// `out` must not exist, or be an empty directory.
fn check_out(out: &Path) -> Result<()> {
    if out.file_name().is_none() {
        bail!("{}: give the new run directory a name (e.g. runs/my-run-collaborative)", out.display());
    }
    if out.exists() {
        if !out.is_dir() {
            bail!("{} exists and is not a directory: choose another output directory", out.display());
        }
        let mut entries = fs::read_dir(out).with_context(|| format!("cannot read {}", out.display()))?;
        if entries.next().is_some() {
            bail!("{} already exists and is not empty: choose another output directory", out.display());
        }
    }
    Ok(())
}

/// Writes the run directory beside `out` and renames it into place.
fn write_run(
    run: &Run,
    config: &ExperimentConfig,
    model: variorum_model::DecoderLm,
    report: &CollaborateReport,
    out: &Path,
) -> Result<()> {
    let name = out.file_name().expect("checked by check_out").to_string_lossy().into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    // a fresh staging directory of its own beside `out` (two conversions never share one), removed
    // when dropped, on an error or a panic alike, unless it has been moved into place
    let stage = tempfile::Builder::new()
        .prefix(&format!(".{name}.collaborate."))
        .tempdir_in(&parent)
        .with_context(|| format!("cannot create a staging directory in {}", parent.display()))?;
    fill(run, config, model, report, stage.path())?;
    // rename replaces an empty directory (check_out refused any other) in one step
    fs::rename(stage.path(), out)
        .with_context(|| format!("cannot move {} to {}", stage.path().display(), out.display()))?;
    // the staging path is gone: nothing left for the guard to remove
    let _ = stage.keep();
    if let Ok(dir) = fs::File::open(&parent) {
        dir.sync_all().ok();
    }
    Ok(())
}

/// The files of the new run, in `dir`; the weights are read back into the new config's model,
/// exactly as [`Run::load`] will, before anything is renamed into place.
fn fill(
    run: &Run,
    config: &ExperimentConfig,
    model: variorum_model::DecoderLm,
    report: &CollaborateReport,
    dir: &Path,
) -> Result<()> {
    let tokenizer = run.dir.join("tokenizer.json");
    let bytes = fs::read(&tokenizer).with_context(|| format!("cannot read {}", tokenizer.display()))?;
    write_atomic(&dir.join("tokenizer.json"), &bytes)?;
    let tags = run.dir.join(crate::run::TAGS_FILE);
    if tags.is_file() {
        let bytes = fs::read(&tags).with_context(|| format!("cannot read {}", tags.display()))?;
        write_atomic(&dir.join(crate::run::TAGS_FILE), &bytes)?;
    }
    let weights = dir.join("model.bpk");
    model.save_file(&weights).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", weights.display()))?;
    let mut model_cfg = config.model.clone();
    model_cfg.resolve(run.tokenizer.vocab_size())?;
    crate::weights::load_weights(model_cfg.init(&run.device), &weights, "re-parameterised weights").map_err(|e| {
        anyhow::anyhow!("the re-parameterised model does not fit its config (a bug in variorum): {e:#}")
    })?;
    write_atomic(&dir.join("collaborate.json"), serde_json::to_string_pretty(report)?.as_bytes())?;
    // last: without config.toml the directory is not a run
    write_atomic(&dir.join("config.toml"), config.to_toml().as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use variorum_attention::Attention;
    use variorum_data::{Tokenizer, TokenizerConfig};

    /// A run directory `dir/name` with a tiny untrained model of `attention` and `position` (TOML
    /// table bodies), weights N(0, 0.2²) so that attention moves the logits.
    fn tiny_run(dir: &Path, name: &str, attention: &str, position: &str, device: &Device) -> PathBuf {
        let text = "the cat sat on a mat; a dog ate the hat.\n".repeat(20);
        let corpus = dir.join("text.txt");
        fs::write(&corpus, &text).unwrap();
        let toml = format!(
            "[model]\nd_model = 16\nn_layers = 2\nseq_len = 8\ninit_std = 0.2\n[model.position]\n{position}\n[model.attention]\n{attention}\n[data]\npath = \"{}\"\n",
            corpus.display()
        );
        let mut cfg = ExperimentConfig::parse(&toml, false).unwrap();
        cfg.validate().unwrap();
        let tokenizer = Tokenizer::train(&TokenizerConfig::Char, &text).unwrap();
        cfg.model.resolve(tokenizer.vocab_size()).unwrap();
        let run = dir.join(name);
        fs::create_dir_all(&run).unwrap();
        fs::write(run.join("config.toml"), cfg.to_toml()).unwrap();
        tokenizer.save(&run.join("tokenizer.json")).unwrap();
        cfg.model.init(device).valid().save_file(run.join("model.bpk")).unwrap();
        run
    }

    const FULL: &str = "kind = \"full\"\nn_heads = 2";
    const LEARNED: &str = "kind = \"learned\"";

    /// Two rows of 8 token ids spread over the vocabulary.
    fn tokens(vocab: usize, device: &Device) -> Tensor<2, Int> {
        let ids: Vec<i64> = (0..16).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
        Tensor::from_data(TensorData::new(ids, [2, 8]), device)
    }

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn full_width_reproduces_the_logits() {
        let dev = Device::flex();
        // absolute positions, and a distance-only score scheme carried into every layer
        for (i, position) in [LEARNED, "kind = \"alibi\""].into_iter().enumerate() {
            let tmp = tempfile::tempdir().unwrap();
            let original = Run::load(&tiny_run(tmp.path(), "run", FULL, position, &dev), &dev).unwrap();
            let out = tmp.path().join("collab");
            let report = collaborate(&original, None, &out).unwrap();
            assert_eq!(report.shared_dim, 16);
            assert_eq!(report.layer_errors, vec![0.0, 0.0]);
            assert!(report.attention_params_before > 0 && report.attention_params_after > 0);

            let collab = Run::load(&out, &dev).unwrap();
            assert_eq!(collab.config.model.attention.kind(), "collaborative");
            assert!(matches!(collab.model.blocks[0].attn, Attention::Collaborative(_)));
            let x = tokens(original.tokenizer.vocab_size(), &dev);
            let diff = max_diff(original.model.forward(x.clone()).logits, collab.model.forward(x).logits);
            assert!(diff < 1e-4, "case {i}: the exact re-parameterisation moved the logits by {diff}");
            assert!(!tmp.path().join(".collab.collaborate.tmp").exists(), "the staging directory is left behind");
        }
    }

    #[test]
    fn a_smaller_shared_dim_reports_its_error_and_loads() {
        let dev = Device::flex();
        let tmp = tempfile::tempdir().unwrap();
        let original = Run::load(&tiny_run(tmp.path(), "run", FULL, LEARNED, &dev), &dev).unwrap();
        // an empty output directory is fine
        let out = tmp.path().join("collab");
        fs::create_dir(&out).unwrap();
        let report = collaborate(&original, Some(4), &out).unwrap();
        assert_eq!(report.layer_errors.len(), 2);
        for e in &report.layer_errors {
            assert!(*e > 0.0 && *e <= 1.0, "relative error {e} of a rank-4 fit of random heads");
        }
        assert!(
            report.attention_params_after < report.attention_params_before,
            "{} → {}: a 4× narrower query/key projection has fewer parameters",
            report.attention_params_before,
            report.attention_params_after
        );
        let collab = Run::load(&out, &dev).unwrap();
        let Attention::Collaborative(a) = &collab.model.blocks[1].attn else { panic!("not collaborative") };
        assert_eq!(a.shared_dim, 4);
        let logits = collab.model.forward(tokens(collab.tokenizer.vocab_size(), &dev)).logits;
        let values = logits.into_data().try_to_vec::<f32>().unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "the compressed run's logits are not finite");
        assert!(out.join("collaborate.json").is_file());
    }

    #[test]
    fn other_kinds_and_bad_widths_are_refused() {
        let dev = Device::flex();
        let tmp = tempfile::tempdir().unwrap();
        let attention = "kind = \"collaborative\"\nn_heads = 2";
        let already = Run::load(&tiny_run(tmp.path(), "c", attention, LEARNED, &dev), &dev).unwrap();
        let e = collaborate(&already, None, &tmp.path().join("out")).unwrap_err().to_string();
        assert!(e.contains("\"collaborative\"") && e.contains("only `full`"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(!tmp.path().join("out").exists());

        let full = Run::load(&tiny_run(tmp.path(), "f", FULL, LEARNED, &dev), &dev).unwrap();
        for bad in [0, 17] {
            let e = collaborate(&full, Some(bad), &tmp.path().join("out")).unwrap_err().to_string();
            assert!(e.contains(&format!("--shared-dim {bad}")) && e.contains("1..=16"), "{e}");
        }
        assert!(!tmp.path().join("out").exists());
    }

    #[test]
    fn rope_is_refused_by_the_rules() {
        let dev = Device::flex();
        let tmp = tempfile::tempdir().unwrap();
        let rope = Run::load(&tiny_run(tmp.path(), "r", FULL, "kind = \"rope\"", &dev), &dev).unwrap();
        let e = collaborate(&rope, None, &tmp.path().join("out")).unwrap_err().to_string();
        assert!(e.contains("rope") && e.contains("cannot be re-parameterised"), "{e}");
        assert!(!tmp.path().join("out").exists());
    }

    #[test]
    fn an_existing_output_is_refused() {
        let dev = Device::flex();
        let tmp = tempfile::tempdir().unwrap();
        let full = Run::load(&tiny_run(tmp.path(), "run", FULL, LEARNED, &dev), &dev).unwrap();
        let out = tmp.path().join("taken");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("notes.txt"), "mine").unwrap();
        let e = collaborate(&full, None, &out).unwrap_err().to_string();
        assert!(e.contains("not empty") && e.contains("taken"), "{e}");
        assert_eq!(fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
        // the run itself is refused as its own output
        let e = collaborate(&full, None, &full.dir).unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
    }
}
