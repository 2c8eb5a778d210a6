//! The training loop: `variorum train`.
//!
//! Determinism: batch t is a pure function of (seed, t) and the device RNG (dropout) is reseeded
//! from (seed, t) before every step, so a resumed run replays exactly the steps an uninterrupted
//! run would have taken.
//!
//! [`train`] runs in three phases, each in its own file: `prepare` (the checks, the run
//! directory, data, model, optimizer and resume, once), `Session::step` (one optimizer step and
//! what falls due after it: metrics, evaluation, checkpoint, report) and `Session::finish` (the
//! final weights, sample, summary and report; `Session::interrupt` when asked to stop early).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use indicatif::ProgressBar;
use serde::Serialize;
use variorum_data::{Corpus, DocumentStreams, GraphBatches, Masking, OrderedStreams, RandomWindows, TokenBatch};
use variorum_model::{DecoderLm, DecoderState};

use crate::checkpoint::{self, TrainState};
use crate::config::ExperimentConfig;
use crate::listing::Status;
use crate::lock::RunLock;
use crate::metrics::MetricsLog;
use crate::retrieval::spalm::Retrieved;

mod finish;
pub(crate) mod prepare;
mod step;

use prepare::prepare;

/// How `train` runs.
pub struct TrainOptions {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Overrides `train.steps`.
    pub max_steps: Option<u64>,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Initialise the model from this run directory, `.bpk` or `.safetensors` file (fine-tuning):
    /// what fits by name and shape is loaded, the rest keeps its fresh initialisation.
    pub init_from: Option<PathBuf>,
    /// Save a checkpoint and stop once this many steps are done, as Ctrl-C would (the schedule
    /// still runs to `train.steps`; `--resume` continues).
    pub stop_at: Option<u64>,
    /// The device (without autodiff; training adds it).
    pub device: Device,
    /// Where a fresh model's weights are drawn (from `train.seed`) before they move to `device`:
    /// the CLI names the CPU, so that a config and seed give the same weights, and so the same
    /// run, on every backend (each backend's generator draws its own numbers). `None`: on
    /// `device`.
    pub init_device: Option<Device>,
    /// Name of the device, for the summary.
    pub device_name: String,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Set by a Ctrl-C handler: save and stop after the current step.
    pub interrupt: Arc<AtomicBool>,
    /// Write `report.html` into the run directory at each checkpoint and at the end.
    pub report: bool,
}

impl TrainOptions {
    /// Options for a fresh run in `run_dir`, no progress bar, no step limit.
    pub fn new(run_dir: impl Into<PathBuf>, device: Device, device_name: impl Into<String>) -> Self {
        Self {
            run_dir: run_dir.into(),
            max_steps: None,
            resume: false,
            stop_at: None,
            init_from: None,
            device,
            init_device: None,
            device_name: device_name.into(),
            progress: false,
            interrupt: Arc::new(AtomicBool::new(false)),
            report: false,
        }
    }
}

/// Final figures of a run, also written to `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Optimizer steps done.
    pub steps: u64,
    /// Median over the metrics rows (the first one, which includes warm-up, excluded).
    pub tokens_per_sec: f64,
    /// Training loss of the last logging interval, nats per token.
    pub final_train_loss: Option<f64>,
    /// The last validation loss, nats per token.
    pub final_val_loss: Option<f64>,
    /// Parameters of the model.
    pub params: usize,
    /// Forward FLOPs per token, as the model config counts them (`flops_per_token`).
    pub flops_per_token: u64,
    /// Name of the device trained on.
    pub device: String,
    /// Training time, seconds (evaluation and checkpointing excluded).
    pub train_seconds: f64,
    /// Peak resident set size of the training process, MiB (Linux).
    pub peak_rss_mib: Option<f64>,
    /// A prepared corpus of several sources: each source's share of the training rows, meant
    /// and drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mixture: Option<Vec<MixtureShare>>,
}

/// One source of a prepared corpus in a run's [`Summary`].
#[derive(Debug, Clone, Serialize)]
pub struct MixtureShare {
    /// `data.sources[i].path`.
    pub source: String,
    /// Its probability of supplying a row.
    pub intended: f64,
    /// The fraction of the run's rows it supplied.
    pub drawn: f64,
}

/// How a training ended.
pub enum Outcome {
    /// It reached its last step.
    Finished(Summary),
    /// Stopped between two steps (Ctrl-C, `--stop-at`); `--resume` continues from the checkpoint.
    Interrupted {
        /// Optimizer steps done.
        step: u64,
        /// The checkpoint written at the stop.
        checkpoint: PathBuf,
    },
}

/// Mixes the run seed with a step number into a device seed.
pub(crate) fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

enum Batches {
    Random(RandomWindows),
    /// Random windows of a prepared corpus, each source at its share.
    Mixture(variorum_data::MixtureWindows),
    Ordered(OrderedStreams),
    /// Ordered streams over a prepared corpus's shards.
    PreparedOrdered(variorum_data::PreparedOrderedStreams),
    Documents(DocumentStreams),
    /// Document streams over a prepared corpus's documents.
    PreparedDocuments(variorum_data::PreparedDocumentStreams),
    Graph(GraphBatches),
    /// An encoder–decoder's pairs or corrupted windows.
    Examples(crate::seq2seq::ExampleBatches),
}

impl Batches {
    fn get(&self, index: u64) -> Result<TokenBatch> {
        Ok(match self {
            Self::Random(b) => b.batch(index),
            Self::Mixture(b) => b.batch(index)?,
            Self::Ordered(b) => b.batch(index),
            Self::PreparedOrdered(b) => b.batch(index)?,
            Self::Documents(b) => b.batch(index),
            Self::PreparedDocuments(b) => b.batch(index)?,
            Self::Graph(b) => b.batch(index),
            Self::Examples(b) => b.batch(index),
        })
    }
}

/// Trains `cfg` into `opts.run_dir`, or continues the run there (`opts.resume`). The three phases:
/// `prepare` builds everything once, `Session::step` takes one optimizer step (stopping with a
/// checkpoint first when Ctrl-C or `--stop-at` asks), and `Session::finish` writes the artefacts.
pub fn train(cfg: ExperimentConfig, opts: &TrainOptions) -> Result<Outcome> {
    if cfg.model.kind == variorum_model::ModelKind::DecisionTransformer {
        return crate::decision::train(cfg, opts);
    }
    let mut session = prepare(cfg, opts)?;
    while session.state.step < session.cfg.train.steps {
        if session.stop_requested() {
            return session.interrupt();
        }
        session = session.step()?;
    }
    session.finish()
}

/// Everything the loop works with, built by `prepare`, advanced by `Session::step` and consumed
/// by `Session::finish` (or `Session::interrupt`). The run directory's lock is the last field, so
/// it is released after everything else is dropped, as when it was the first local of `train`.
struct Session<'a> {
    opts: &'a TrainOptions,
    /// The run directory, `opts.run_dir`.
    run: &'a Path,
    /// The config as resolved (the run's own `[train]` when resuming, the vocabulary filled in).
    cfg: ExperimentConfig,
    corpus: Corpus,
    /// SPALM's retrieved tokens, (training split, validation split).
    retrieved: Option<(Retrieved, Retrieved)>,
    batches: Batches,
    /// Document streams' validation batches, scored as they are read.
    document_eval: Option<Vec<TokenBatch>>,
    eval_set: Vec<TokenBatch>,
    /// The masked objective's corruption of the training batches.
    masking: Option<Masking>,
    /// The training device (with autodiff).
    device: Device,
    model: DecoderLm,
    optim: ModuleOptimizer,
    state: TrainState,
    params: usize,
    metrics: MetricsLog,
    pb: ProgressBar,
    /// A memory model's memory, carried along the ordered streams.
    memory: Option<DecoderState>,
    // the logging interval, on the device until it is read
    interval_tokens: f64,
    loss_acc: Option<Tensor<1>>,
    /// Auxiliary losses summed over the logging interval, on the device.
    aux_acc: variorum_core::AuxLosses,
    /// The last step's gradient norm (replaced every step, read when a row is written).
    last_norm: Option<Tensor<1>>,
    interval_train_secs: f64,
    interval_steps: u64,
    last_train_loss: Option<f64>,
    /// One training per run directory, held to the end.
    _lock: RunLock,
}

impl Session<'_> {
    /// Prints a line above the progress bar.
    fn say(&self, s: String) {
        self.pb.suspend(|| eprintln!("{s}"));
    }

    /// Writes a checkpoint of the session's state, model, optimizer and memory
    /// ([`save_checkpoint`]: atomically, the oldest beyond `train.keep_checkpoints` removed).
    fn save(&self) -> Result<PathBuf> {
        save_checkpoint(
            self.run,
            &self.state,
            self.cfg.train.keep_checkpoints,
            &self.model,
            &self.optim,
            self.memory.as_ref(),
            self.cfg.train.lora.is_some(),
        )
    }

    /// Writes the run's report of `model` (the training model, or the final one for inference):
    /// [`write_report`] with this run's config, corpus and size.
    fn report(&self, status: Status, model: &DecoderLm, say: impl Fn(String)) {
        let now = ReportState { model, config: &self.cfg, corpus: &self.corpus, params: self.params };
        write_report(self.run, self.opts, status, &now, say);
    }
}

/// Median (0 for an empty slice).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

pub(crate) fn ensure_finite(loss_sum: f64, state: &TrainState, run: &Path) -> Result<()> {
    if loss_sum.is_finite() {
        return Ok(());
    }
    let last = checkpoint::latest(run).ok().flatten();
    let kept = match last {
        Some((dir, st)) => format!("the last good checkpoint is {} (step {})", dir.display(), st.step),
        None => "no checkpoint was written yet".to_string(),
    };
    bail!(
        "the training loss became {loss_sum} before step {}: stopped; {kept}. Lower train.lr, or set train.grad_clip, and resume with --resume",
        state.step
    )
}

fn save_checkpoint(
    run: &Path,
    state: &TrainState,
    keep: usize,
    model: &DecoderLm,
    optim: &burn::optim::ModuleOptimizer,
    memory: Option<&DecoderState>,
    adapters_only: bool,
) -> Result<PathBuf> {
    let state = TrainState { memory: memory.map(crate::snapshot::MemoryLayout::of), ..state.clone() };
    checkpoint::save(run, &state, keep, |dir| {
        if let Some(m) = memory {
            crate::snapshot::save_memory(m, &dir.join("memory.bpk"))?;
        }
        // a LoRA run's adapters alone: its base is the file lora-base.json names
        if adapters_only {
            crate::lora::save_adapters(model, &dir.join("model.bpk"))?;
        } else {
            model
                .clone()
                .save_file(dir.join("model.bpk"))
                .map_err(|e| anyhow::anyhow!("cannot write model checkpoint: {e}"))?;
        }
        checkpoint::save_optimizer(optim, &dir.join("optim.bpk"))
            .map_err(|e| anyhow::anyhow!("cannot write optimizer checkpoint: {e}"))?;
        Ok(())
    })
}

/// Writes the run's report from the training's state in memory (`--no-report` turns it off). A
/// report that cannot be drawn — an error, or a panic such as a device out of memory — is a
/// note, never a reason to stop training: the checkpoint is written before it.
fn write_report(run: &Path, opts: &TrainOptions, status: Status, now: &ReportState, say: impl Fn(String)) {
    if !opts.report {
        return;
    }
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let model = now.model.valid();
        let live = crate::pictures::report::Live {
            status,
            model: &model,
            config: now.config,
            tokenizer: &now.corpus.tokenizer,
            validation: &now.corpus.val,
            params: now.params,
        };
        crate::pictures::report::write_live(run, &live, &opts.device)
    }));
    let out = run.join(crate::pictures::report::REPORT_FILE);
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => say(format!("note: {} not written: {e:#}", out.display())),
        Err(_) => say(format!("note: {} not written: drawing it panicked (above)", out.display())),
    }
}

/// What the report of a training reads, borrowed from the loop.
struct ReportState<'a> {
    model: &'a DecoderLm,
    config: &'a ExperimentConfig,
    corpus: &'a Corpus,
    params: usize,
}

pub(crate) fn finish_plot(run: &Path, metrics: &MetricsLog) -> Result<()> {
    let rows = metrics.rows()?;
    let title = run.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !crate::pictures::plot::loss_curve(&rows, &run.join("loss.png"), &title)? {
        eprintln!("note: loss.png not drawn (no font found; install fonts-dejavu-core)");
    }
    Ok(())
}
