//! The training loop: `variorum train`.
//!
//! Determinism: batch t is a pure function of (seed, t) and the device RNG (dropout) is reseeded
//! from (seed, t) before every step, so a resumed run replays exactly the steps an uninterrupted
//! run would have taken.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget};
use serde::Serialize;
use variorum_data::{
    Corpus, DocumentStreams, GraphBatches, OrderedStreams, RandomWindows, TokenBatch, Tokenizer, graph_eval_batches,
    spread_windows,
};
use variorum_model::{DecoderLm, DecoderState};

use crate::checkpoint::{self, TrainState, write_atomic};
use crate::config::{Batching, ExperimentConfig, TrainConfig};
use crate::eval::{evaluate, masked_batches, masking, stream_loss};
use crate::generate::{SampleConfig, generate};
use crate::listing::Status;
use crate::metrics::{MetricsLog, Row};
use crate::schedule::learning_rate;
use crate::step::{optimizer, train_step};

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
    pub steps: u64,
    /// Median over the metrics rows (the first one, which includes warm-up, excluded).
    pub tokens_per_sec: f64,
    pub final_train_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
    pub params: usize,
    pub flops_per_token: u64,
    pub device: String,
    pub train_seconds: f64,
    /// Peak resident set size of the training process, MiB (Linux).
    pub peak_rss_mib: Option<f64>,
}

pub enum Outcome {
    Finished(Summary),
    Interrupted { step: u64, checkpoint: PathBuf },
}

/// Mixes the run seed with a step number into a device seed.
fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

enum Batches {
    Random(RandomWindows),
    Ordered(OrderedStreams),
    Documents(DocumentStreams),
    Graph(GraphBatches),
    /// An encoder–decoder's pairs or corrupted windows.
    Examples(crate::seq2seq::ExampleBatches),
}

impl Batches {
    fn get(&self, index: u64) -> TokenBatch {
        match self {
            Self::Random(b) => b.batch(index),
            Self::Ordered(b) => b.batch(index),
            Self::Documents(b) => b.batch(index),
            Self::Graph(b) => b.batch(index),
            Self::Examples(b) => b.batch(index),
        }
    }
}

pub fn train(mut cfg: ExperimentConfig, opts: &TrainOptions) -> Result<Outcome> {
    if let Some(n) = opts.max_steps {
        if n == 0 {
            bail!("--max-steps must be at least 1");
        }
        cfg.train.steps = n;
    }
    cfg.validate()?;
    let run = &opts.run_dir;
    if opts.resume && opts.init_from.is_some() {
        bail!("--init-from starts a new run and --resume continues one: use one of them");
    }
    let checkpoints = checkpoint::all(run)?;
    match (opts.resume, checkpoints.first()) {
        (true, None) => bail!("nothing to resume: {} holds no checkpoint (start without --resume)", run.display()),
        (false, Some((dir, _))) => bail!(
            "{} already holds a run (checkpoint {}): pass --resume to continue it, or --out to start another",
            run.display(),
            dir.display()
        ),
        _ => {}
    }
    // the checkpoint resumed from, once one loads completely (below)
    let mut resume: Option<(PathBuf, TrainState)> = None;

    // --- data and tokenizer
    let tokenizer_path = run.join("tokenizer.json");
    let tokenizer = if opts.resume { Some(Tokenizer::load(&tokenizer_path)?) } else { None };
    if opts.resume {
        // The run continues with its own training settings, so its curve is the one an
        // uninterrupted run would have drawn; --max-steps may still extend it.
        let saved = check_same_run(run, &cfg)?;
        let ignoring_steps = |t: &TrainConfig| TrainConfig { steps: 0, ..t.clone() };
        if ignoring_steps(&saved.train) != ignoring_steps(&cfg.train) {
            eprintln!("note: [train] differs from the run's config.toml; resuming with the run's settings");
        }
        cfg.train = TrainConfig { steps: opts.max_steps.unwrap_or(saved.train.steps), ..saved.train };
    }
    let corpus = Corpus::load(&cfg.data, tokenizer)?;
    cfg.model.resolve(corpus.tokenizer.vocab_size())?;
    check_tags(&cfg, &corpus)?;
    // SPALM: every position's retrieved tokens, looked up by its place in the split; opened
    // before the run directory is written, so that a missing table leaves nothing behind
    let retrieved = match (&cfg.data.neighbours, &cfg.model.long_term_memory) {
        (Some(dir), Some(l)) => Some(crate::spalm::open_tables(dir, &corpus, cfg.model.vocab(), l.k)?),
        _ => None,
    };
    if let (true, Some(tables)) = (opts.resume, &retrieved) {
        crate::spalm::check_resumed_tables(run, tables)?;
    }
    fs::create_dir_all(run).with_context(|| format!("cannot create run directory {}", run.display()))?;
    // one training per run directory, held to the end, before anything in it is written (a
    // second one that got past the checks above is refused here)
    let _lock = crate::lock::RunLock::acquire(run)?;
    write_atomic(&run.join("config.toml"), cfg.to_toml().as_bytes())?;
    if !opts.resume {
        corpus.tokenizer.save(&tokenizer_path)?;
    }
    if let Some(tags) = &corpus.tags {
        let path = run.join(crate::run::TAGS_FILE);
        if opts.resume && path.is_file() {
            let saved: Vec<String> = serde_json::from_str(&fs::read_to_string(&path)?)
                .map_err(|e| anyhow::anyhow!("{} is not a JSON array of tag names: {e}", path.display()))?;
            if saved != tags.names {
                bail!(
                    "the data now gives {} tags where {} lists {}: the corpus or data.tags changed since the run started",
                    tags.names.len(),
                    path.display(),
                    saved.len()
                );
            }
        }
        write_atomic(&path, serde_json::to_string_pretty(&tags.names)?.as_bytes())?;
    }
    if let Some(tables) = &retrieved {
        crate::spalm::record_tables(run, tables)?;
    }

    let tc = cfg.train.clone();
    let seq_len = cfg.model.seq_len;
    let train_tokens = Arc::new(corpus.train.clone());
    let train_tags = corpus.tags.as_ref().map(|t| Arc::new(t.train.clone()));
    let examples = crate::seq2seq::training_examples(&cfg.model, &corpus, tc.batch_size, tc.seed)?;
    let batches = match (&corpus.graphs, tc.batching) {
        _ if examples.is_some() => Batches::Examples(examples.expect("checked")),
        (Some(g), _) => {
            Batches::Graph(GraphBatches::new(g.train.clone(), &corpus.path, seq_len, tc.batch_size, tc.seed)?)
        }
        (None, Batching::Random) => {
            let w = RandomWindows::new(train_tokens, seq_len, tc.batch_size, tc.seed)?;
            Batches::Random(match train_tags {
                Some(t) => w.with_tags(t),
                None => w,
            })
        }
        (None, Batching::Ordered) => {
            let s = OrderedStreams::new(train_tokens, seq_len, tc.batch_size)?;
            Batches::Ordered(match train_tags {
                Some(t) => s.with_tags(t),
                None => s,
            })
        }
        (None, Batching::Documents) => {
            let tags = train_tags.context("train.batching = \"documents\" needs data.tags")?;
            Batches::Documents(DocumentStreams::new(train_tokens, tags, seq_len, tc.batch_size)?)
        }
    };
    // document streams are scored as they are read: the first eval_batches batches of the
    // validation documents (one row each, up to batch_size rows, a row moving on to its next
    // document when one ends), each row's memory cleared at its documents' starts
    let document_eval = match (&batches, &corpus.tags) {
        (Batches::Documents(_), Some(t)) => {
            let rows = DocumentStreams::count(corpus.val.len(), &t.val).min(tc.batch_size);
            let s = DocumentStreams::new(Arc::new(corpus.val.clone()), Arc::new(t.val.clone()), seq_len, rows.max(1))
                .context("the validation split, read as documents")?;
            Some(s.one_pass().into_iter().take(tc.eval_batches.max(1)).collect::<Vec<_>>())
        }
        _ => None,
    };
    let val_tags = corpus.tags.as_ref().map(|t| &t.val);
    let eval_rows = tc.eval_batches * tc.batch_size;
    let examples = crate::seq2seq::validation_examples(&cfg.model, &corpus, eval_rows, tc.batch_size)?;
    let eval_set = match (&corpus.graphs, examples) {
        (_, Some(e)) => e,
        (Some(g), None) => graph_eval_batches(&g.val, &corpus.path, seq_len, eval_rows, tc.batch_size)?,
        (None, None) => spread_windows(&corpus.val, seq_len, eval_rows, tc.batch_size, val_tags)?,
    };
    // masked LM: the same hidden tokens at every evaluation, and in every run (seed 0)
    let mut eval_set = masked_batches(&cfg.model, eval_set, 0);
    if let Some((_, val)) = &retrieved {
        eval_set.iter_mut().for_each(|b| val.attach(b));
    }
    let masking = masking(&cfg.model);

    // --- model and optimizer
    let device = opts.device.clone().autodiff();
    device.seed(tc.seed);
    let mut model: DecoderLm = cfg.model.init(&device);
    let mut optim = optimizer(&tc);
    let mut state = TrainState::default();
    if opts.resume {
        let (m, o, dir, st) = newest_complete_checkpoint(&checkpoints, model, &tc)?;
        (model, optim, state) = (m, o, st.clone());
        resume = Some((dir, st));
        if state.step > tc.steps {
            bail!(
                "the run is already at step {}, past train.steps = {}: raise --max-steps to continue",
                state.step,
                tc.steps
            );
        }
    }
    let init_report = match (&opts.init_from, &resume) {
        (Some(source), None) => Some(crate::transfer::init_from(&mut model, source)?),
        _ => None,
    };
    let params = model.num_params();
    let metrics = MetricsLog::open(run, resume.as_ref().map(|(_, s)| s.step))?;

    let pb = if opts.progress { ProgressBar::new(tc.steps) } else { ProgressBar::hidden() };
    pb.set_draw_target(if opts.progress { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
    pb.set_style(crate::progress::style());
    pb.set_position(state.step);
    let say = |s: String| pb.suspend(|| eprintln!("{s}"));
    let per_step = match cfg.model.is_encoder_decoder() {
        true => format!("{} examples/step", tc.batch_size * tc.grad_accum),
        false => format!("{} tokens/step", tc.batch_size * seq_len * tc.grad_accum),
    };
    say(format!(
        "training {} parameters on {} ({per_step}), run directory {}{}",
        params,
        opts.device_name,
        run.display(),
        if state.step > 0 { format!(", resuming at step {}", state.step) } else { String::new() }
    ));

    if let Some(r) = &init_report {
        say(r.summary());
    }
    // positions each step processes, counted from its batches: an encoder–decoder's are its
    // target rows (as long as the batch's longest) and their sources
    let batch_tokens =
        |b: &TokenBatch| (b.batch_size * b.seq_len + b.sources.iter().map(|s| s.len()).sum::<usize>()) as f64;
    let mut interval_tokens = 0.0;
    let mut loss_acc: Option<Tensor<1>> = None;
    // auxiliary losses summed over the logging interval, on the device
    let mut aux_acc: variorum_core::AuxLosses = Vec::new();
    // a memory model carries its memory along the ordered streams; a checkpoint saves a
    // model.memory (not an attention's own memory, which starts afresh on resuming)
    let mut memory = model.has_memory().then(DecoderState::default);
    if let (Some((dir, st)), Some(m)) = (&resume, memory.as_mut())
        && let Some(layout) = &st.memory
    {
        *m = crate::snapshot::load_memory(layout, &dir.join("memory.bpk"), &device)?;
    }
    let mut last_norm: Option<Tensor<1>>;
    let mut interval_train_secs = 0.0;
    let mut interval_steps = 0u64;
    let mut last_train_loss = None;

    // Reads the interval's loss: the one host sync of the loop outside evaluation.
    let read_loss = |acc: &Option<Tensor<1>>, st: &TrainState| -> (f64, u64) {
        let dev_sum = acc.as_ref().map_or(0.0, |t| t.clone().into_scalar::<f32>() as f64);
        (st.loss_sum + dev_sum, st.loss_count)
    };

    while state.step < tc.steps {
        if opts.interrupt.load(Ordering::SeqCst) || opts.stop_at.is_some_and(|s| state.step >= s) {
            let (sum, _) = read_loss(&loss_acc, &state);
            ensure_finite(sum, &state, run)?;
            state.loss_sum = sum;
            let ckpt = save_checkpoint(run, &state, tc.keep_checkpoints, &model, &optim, memory.as_ref())?;
            pb.abandon();
            finish_plot(run, &metrics)?;
            let now = ReportState { model: &model, config: &cfg, corpus: &corpus, params };
            write_report(run, opts, Status::Interrupted, &now, |s| eprintln!("{s}"));
            return Ok(Outcome::Interrupted { step: state.step, checkpoint: ckpt });
        }
        let step = state.step;
        let lr = learning_rate(&tc, step);
        device.seed(step_seed(tc.seed, step));
        let micro: Vec<TokenBatch> = (0..tc.grad_accum as u64)
            .map(|m| {
                let i = step * tc.grad_accum as u64 + m;
                let mut b = batches.get(i);
                if let Some((train, _)) = &retrieved {
                    train.attach(&mut b);
                }
                match &masking {
                    Some(mask) => mask.apply(&b, step_seed(tc.seed, i)),
                    None => b,
                }
            })
            .collect();
        interval_tokens += micro.iter().map(batch_tokens).sum::<f64>();
        let t0 = Instant::now();
        let (m, res) = train_step(model, &mut optim, &tc, &micro, lr, &device, memory.as_mut());
        // the mechanisms' own updates between steps (random features redrawn, centroids moved),
        // drawn from the step's seeded stream, so a resumed run replays them
        model = m.after_optimizer_step(step as usize + 1);
        variorum_core::sum_aux_losses(&mut aux_acc, res.aux);
        loss_acc = Some(match loss_acc.take() {
            Some(a) => a + res.loss,
            None => res.loss,
        });
        last_norm = res.grad_norm;
        state.loss_count += 1;
        state.step += 1;
        interval_steps += 1;
        pb.set_position(state.step);

        let done = state.step == tc.steps;
        let eval_now = (tc.eval_interval > 0 && state.step % tc.eval_interval == 0) || done;
        let log_now = state.step % tc.log_interval == 0 || eval_now;
        let ckpt_now = (tc.checkpoint_interval > 0 && state.step % tc.checkpoint_interval == 0) || done;

        if log_now || ckpt_now {
            let (sum, count) = read_loss(&loss_acc, &state);
            loss_acc = None;
            ensure_finite(sum, &state, run)?;
            // the loss read above waited for the step's work: time it with the step
            let dt = t0.elapsed().as_secs_f64();
            interval_train_secs += dt;
            state.train_seconds += dt;
            if log_now {
                let train_loss = sum / count.max(1) as f64;
                last_train_loss = Some(train_loss);
                let tps = interval_tokens / interval_train_secs.max(1e-9);
                let val_loss = if eval_now {
                    let inner = device.clone().inner();
                    let val_retrieved = retrieved.as_ref().map(|(_, v)| v);
                    let v = if let Some(batches) = &document_eval {
                        {
                            // a model without memory reads each segment alone (a KV cache would grow
                            // past its context)
                            crate::eval::document_loss(&model.valid(), batches, model.has_memory(), &inner, None).0
                        }
                    } else if model.has_memory() {
                        // memory models are scored as they run: segments of ordered streams
                        let n = (tc.eval_batches * tc.batch_size * seq_len + 1).min(corpus.val.len());
                        match stream_loss(
                            &model.valid(),
                            &corpus.val[..n],
                            seq_len,
                            tc.batch_size,
                            true,
                            val_retrieved,
                            &inner,
                            None,
                        ) {
                            (_, 0) => evaluate(&model.valid(), &eval_set, &inner),
                            (v, _) => v,
                        }
                    } else {
                        evaluate(&model.valid(), &eval_set, &inner)
                    };
                    state.val_loss = Some(v);
                    Some(v)
                } else {
                    None
                };
                let grad_norm = last_norm.take().map(|n| n.into_scalar::<f32>() as f64);
                let aux: Vec<(String, f64)> = std::mem::take(&mut aux_acc)
                    .into_iter()
                    .map(|(n, t)| (n, t.into_scalar::<f32>() as f64 / interval_steps.max(1) as f64))
                    .collect();
                metrics.append(&Row {
                    step: state.step,
                    train_loss: Some(train_loss),
                    val_loss,
                    lr,
                    grad_norm,
                    tokens_per_sec: Some(tps),
                    elapsed_sec: state.train_seconds,
                    aux: aux.clone(),
                })?;
                pb.set_message(format!(
                    "loss {train_loss:.4}{} | {:.0} tok/s | lr {lr:.2e}",
                    state.val_loss.map(|v| format!(" | val {v:.4}")).unwrap_or_default(),
                    tps
                ));
                if let Some(v) = val_loss {
                    let aux: String = aux.iter().map(|(n, x)| format!("  {n} {x:.3e}")).collect();
                    say(format!("step {:>6}  train {train_loss:.4}  val {v:.4}  {tps:.0} tok/s{aux}", state.step));
                }
                state.loss_sum = 0.0;
                state.loss_count = 0;
                interval_steps = 0;
                interval_tokens = 0.0;
                interval_train_secs = 0.0;
            } else {
                state.loss_sum = sum;
            }
            if ckpt_now {
                save_checkpoint(run, &state, tc.keep_checkpoints, &model, &optim, memory.as_ref())?;
                // the last one is written at the end, after the peak memory is read
                if !done {
                    let now = ReportState { model: &model, config: &cfg, corpus: &corpus, params };
                    write_report(run, opts, Status::Running, &now, &say);
                }
            }
        } else {
            let dt = t0.elapsed().as_secs_f64();
            interval_train_secs += dt;
            state.train_seconds += dt;
        }
    }
    pb.finish_and_clear();

    // --- final artefacts
    let valid = model.valid();
    // written beside and renamed into place: a failed or cut-off write never leaves a truncated
    // model.bpk (which loading prefers to the checkpoints)
    let (tmp, weights) = (run.join(".model.tmp.bpk"), run.join("model.bpk"));
    valid.clone().save_file(&tmp).map_err(|e| {
        anyhow::anyhow!("cannot write {}: {e}; the checkpoints are intact (--resume finishes the run)", tmp.display())
    })?;
    fs::rename(&tmp, &weights).with_context(|| {
        format!("cannot move {} to {}; the checkpoints are intact", tmp.display(), weights.display())
    })?;
    finish_plot(run, &metrics)?;
    let inner = device.clone().inner();
    // text starts after a line break; graph examples have none: the first validation example's
    // first token (and the complete graph, as any generation)
    let first_example = corpus.graphs.as_ref().and_then(|g| g.val.first()).map(|e| e.tokens[..1].to_vec());
    let prompt = first_example
        .or_else(|| corpus.tokenizer.encode("\n").ok().filter(|p| !p.is_empty()))
        .unwrap_or_else(|| vec![0]);
    let sample_cfg = SampleConfig {
        max_new_tokens: tc.sample_tokens,
        temperature: tc.sample_temperature,
        top_k: 0,
        top_p: 1.0,
        seed: tc.seed,
        no_cache: false,
        // a tagged run samples under the tag of its first validation window
        tag: eval_set.first().and_then(|b| b.tags.first()).map(|&t| t as u32),
    };
    let text = match (valid.mask_token, eval_set.first()) {
        // a masked model does not generate: it fills in the hidden tokens of a validation window
        (Some(mask), Some(b)) => fill_in_sample(&valid, b, mask, &corpus.tokenizer, &inner),
        // an encoder–decoder writes the target of the first validation example
        (None, Some(b)) if !b.sources.is_empty() => {
            let vocab = valid.end_token.unwrap_or_default();
            let show = |t: &[u32]| crate::seq2seq::show(t, &corpus.tokenizer, vocab);
            // the first example's target, without its end token
            let mut target: Vec<u32> =
                b.targets[..b.seq_len].iter().take_while(|&&t| t >= 0).map(|&t| t as u32).collect();
            target.pop();
            let written = crate::seq2seq::generate_from(&valid, &b.sources[0], &sample_cfg, &inner, |_| {});
            format!("source: {}\ntarget: {}\nmodel:  {}\n", show(&b.sources[0]), show(&target), show(&written))
        }
        _ => {
            // a long-term memory retrieves as the sample grows; if its datastore cannot be read
            // now, the sample goes without (the run's artefacts matter more than its sample)
            let retrieving = cfg.model.long_term_memory.as_ref().map(|_| {
                let online = crate::spalm::OnlineNeighbours::open(&cfg, cfg.model.vocab(), &inner, 64)?;
                let retrieval = crate::generate::Retrieval { knn: None, neighbours: Some(&online) };
                crate::generate::generate_with(&valid, &prompt, &sample_cfg, retrieval, &inner, |_| {})
            });
            let sample = match retrieving {
                Some(Ok(sample)) => sample,
                Some(Err(e)) => {
                    eprintln!("note: the closing sample is written without retrieval: {e:#}");
                    generate(&valid, &prompt, &sample_cfg, &inner, |_| {})
                }
                None => generate(&valid, &prompt, &sample_cfg, &inner, |_| {}),
            };
            let mut text = corpus.tokenizer.decode(&prompt);
            text.push_str(&corpus.tokenizer.decode(&sample));
            text
        }
    };
    write_atomic(&run.join("sample.txt"), text.as_bytes())?;

    let rows = metrics.rows()?;
    let mut tps: Vec<f64> = rows.iter().skip(1).filter_map(|r| r.tokens_per_sec).collect();
    if tps.is_empty() {
        tps = rows.iter().filter_map(|r| r.tokens_per_sec).collect();
    }
    let summary = Summary {
        steps: state.step,
        tokens_per_sec: median(&mut tps),
        final_train_loss: last_train_loss.or_else(|| rows.iter().rev().find_map(|r| r.train_loss)),
        final_val_loss: state.val_loss,
        params,
        flops_per_token: cfg.model.flops_per_token(),
        device: opts.device_name.clone(),
        train_seconds: state.train_seconds,
        peak_rss_mib: crate::bench::peak_rss_mib(),
    };
    write_atomic(&run.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    let now = ReportState { model: &valid, config: &cfg, corpus: &corpus, params };
    write_report(run, opts, Status::Finished, &now, |s| eprintln!("{s}"));
    Ok(Outcome::Finished(summary))
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

fn ensure_finite(loss_sum: f64, state: &TrainState, run: &Path) -> Result<()> {
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
) -> Result<PathBuf> {
    let state = TrainState { memory: memory.map(crate::snapshot::MemoryLayout::of), ..state.clone() };
    checkpoint::save(run, &state, keep, |dir| {
        if let Some(m) = memory {
            crate::snapshot::save_memory(m, &dir.join("memory.bpk"))?;
        }
        model
            .clone()
            .save_file(dir.join("model.bpk"))
            .map_err(|e| anyhow::anyhow!("cannot write model checkpoint: {e}"))?;
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
        let live = crate::report::Live {
            status,
            model: &model,
            config: now.config,
            tokenizer: &now.corpus.tokenizer,
            validation: &now.corpus.val,
            params: now.params,
        };
        crate::report::write_live(run, &live, &opts.device)
    }));
    let out = run.join(crate::report::REPORT_FILE);
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

fn finish_plot(run: &Path, metrics: &MetricsLog) -> Result<()> {
    let rows = metrics.rows()?;
    let title = run.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !crate::plot::loss_curve(&rows, &run.join("loss.png"), &title)? {
        eprintln!("note: loss.png not drawn (no font found; install fonts-dejavu-core)");
    }
    Ok(())
}

/// The newest checkpoint that loads completely — state, weights and optimizer — with them; a
/// damaged newer one is skipped, and a note says which and why. Nothing is deleted here: the
/// damaged one stays for inspection, and the next save at its step replaces it.
fn newest_complete_checkpoint(
    checkpoints: &[(PathBuf, std::result::Result<TrainState, String>)],
    model: DecoderLm,
    tc: &TrainConfig,
) -> Result<(DecoderLm, burn::optim::ModuleOptimizer, PathBuf, TrainState)> {
    let (dir, (model, optim, state), skipped) = checkpoint::newest_that_loads(checkpoints, |dir, state| {
        let state = state.clone().map_err(|e| anyhow::anyhow!(e))?;
        let model = crate::weights::load_weights(model.clone(), &dir.join("model.bpk"), "checkpoint")?;
        // Burn 0.22.1 builds the reloaded moments on `Device::default()` (the BURN_DEVICE
        // backend; the CLI sets it from --device) and moves each to its parameter's device on
        // the next step.
        let path = dir.join("optim.bpk");
        let optim = checkpoint::without_panic(|| optimizer(tc).load(&path))
            .and_then(|loaded| loaded.map_err(|e| e.to_string()))
            .map_err(|e| anyhow::anyhow!("checkpoint {} cannot be loaded: {e}", path.display()))?;
        Ok((model, optim, state))
    })?;
    if !skipped.is_empty() {
        eprintln!(
            "note: resuming from {} (step {}); newer ones do not load: {}",
            dir.display(),
            state.step,
            skipped.join("; ")
        );
    }
    Ok((model, optim, dir, state))
}

/// Refuses to resume a run with a different model or data section; returns the run's config.
fn check_same_run(run: &Path, cfg: &ExperimentConfig) -> Result<ExperimentConfig> {
    let path = run.join("config.toml");
    let saved =
        ExperimentConfig::load(&path).with_context(|| format!("cannot read the run's config {}", path.display()))?;
    let mut model = cfg.model.expanded();
    model.vocab_size = saved.model.vocab_size;
    if model != saved.model.expanded() {
        bail!("[model] differs from the run's {}: resume with the config the run was started with", path.display());
    }
    if cfg.data != saved.data {
        bail!("[data] differs from the run's {}: resume with the config the run was started with", path.display());
    }
    Ok(saved)
}

/// The first row of a masked batch three times: as the model saw it (hidden tokens as `_`), with
/// the model's guesses in their place, and as written.
fn fill_in_sample(model: &DecoderLm, batch: &TokenBatch, mask: usize, tok: &Tokenizer, device: &Device) -> String {
    // a graph example's own tokens, not its padding
    let l = batch.graphs.first().map_or(batch.seq_len, |g| g.len().min(batch.seq_len));
    let (inputs, _) = crate::step::batch_tensors(batch, device);
    let rows = crate::step::batch_rows(batch, device);
    let guesses = model.forward_tagged(inputs, rows, None).logits.narrow(0, 0, 1).argmax(2);
    let guesses = guesses.into_data().convert::<i64>().try_into_vec::<i64>().unwrap_or_default();
    let (seen, targets) = (&batch.inputs[..l], &batch.targets[..l]);
    let piece = |t: i64| if t < 0 || t as usize >= mask { "_".to_string() } else { tok.decode(&[t as u32]) };
    let line = |pick: &dyn Fn(usize) -> String| (0..l).map(pick).collect::<String>();
    let hidden = |i: usize| targets[i] != mask as i64;
    let shown = line(&|i| if hidden(i) { "_".into() } else { piece(seen[i]) });
    let filled = line(&|i| if hidden(i) { piece(guesses.get(i).copied().unwrap_or(-1)) } else { piece(seen[i]) });
    let original = line(&|i| if hidden(i) { piece(targets[i]) } else { piece(seen[i]) });
    format!(
        "# masked language model: a validation window with its hidden tokens as _\nseen:     {shown}\nfilled:   {filled}\noriginal: {original}\n"
    )
}

/// A model conditioned on example tags (a task prior) needs tagged data with at most as many
/// tags as its table holds.
fn check_tags(cfg: &ExperimentConfig, corpus: &Corpus) -> Result<()> {
    let Some(capacity) = cfg.model.attention.tags() else { return Ok(()) };
    let kind = cfg.model.attention.kind();
    match &corpus.tags {
        None => bail!(
            "model.attention.kind = \"{kind}\" is conditioned on example tags, but the data is untagged: set \
             data.tags.section to a regular expression whose matches start the sections (e.g. the title \
             lines of a collection of works; configs/attention/full-tagged.toml has one for Complete Shakespeare)"
        ),
        Some(t) if t.names.len() > capacity => bail!(
            "data.tags finds {} tags in {} (untagged text included), more than model.attention.tasks = {capacity} \
             holds: raise model.attention.tasks to at least {}",
            t.names.len(),
            corpus.path.display(),
            t.names.len()
        ),
        Some(_) => Ok(()),
    }
}
