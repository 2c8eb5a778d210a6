//! Phase one of `train`: everything built once, before the first step.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget};
use variorum_data::{
    Corpus, DocumentStreams, GraphBatches, Masking, OrderedStreams, RandomWindows, TokenBatch, Tokenizer,
    graph_eval_batches, spread_windows,
};
use variorum_model::{DecoderLm, DecoderState};

use super::{Batches, Session, TrainOptions};
use crate::checkpoint::{self, TrainState, write_atomic};
use crate::config::{Batching, ExperimentConfig, TrainConfig};
use crate::eval::{masked_batches, training_masking};
use crate::lock::RunLock;
use crate::metrics::MetricsLog;
use crate::retrieval::spalm::Retrieved;
use crate::step::optimizer;
use crate::transfer::InitReport;

/// A run's checkpoints, newest first, each with its state or why that does not load.
type Checkpoints = Vec<(PathBuf, std::result::Result<TrainState, String>)>;

/// Phase one: checks the request, opens the run directory (its lock held from here to the end),
/// builds the data, the model and optimizer (from the newest checkpoint that loads, when
/// resuming), the metrics log and the progress bar. All of it happens once and is where a run
/// is refused; the split falls before the first step, so `Session::step` holds only per-step
/// work. The order is the one `train` always had: nothing is written into the run directory
/// before the checks that can refuse it, and the metrics log is reopened only once the
/// checkpoint it continues from has loaded.
pub(super) fn prepare(mut cfg: ExperimentConfig, opts: &TrainOptions) -> Result<Session<'_>> {
    let checkpoints = check_request(&mut cfg, opts)?;
    let run = &opts.run_dir;
    let (corpus, retrieved, lock) = open_run(&mut cfg, opts)?;
    let tc = &cfg.train;
    let Data { batches, document_eval, eval_set, masking } = data(&cfg, tc, &corpus, retrieved.as_ref())?;

    // --- model and optimizer
    let device = opts.device.clone().autodiff();
    device.seed(tc.seed);
    // drawn where `init_device` says, every parameter at once in the module's order (Burn would
    // draw each on first use, on whatever device it had been moved to by then), then moved
    let host = opts.init_device.clone().unwrap_or_else(|| opts.device.clone()).autodiff();
    host.seed(tc.seed);
    let mut model: DecoderLm = cfg.model.init(&host);
    model.visit(&mut DrawNow);
    if host != device {
        model = model.fork(&device);
    }
    // a resumed LoRA run's checkpoint holds the adapters alone: the base it names loads, and
    // the adapters exist, before it does
    if let (Some(lora), true) = (&tc.lora, opts.resume) {
        model = crate::lora::attach(crate::lora::load_base(run, model)?, &cfg.model, lora)?;
    }
    let mut optim = optimizer(tc);
    let mut state = TrainState::default();
    // the checkpoint resumed from, once one loads completely
    let mut resume: Option<(PathBuf, TrainState)> = None;
    if opts.resume {
        let (m, o, dir, st) = newest_complete_checkpoint(&checkpoints, model, tc, tc.lora.is_some())?;
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
    // a new LoRA run: the adapters go onto the weights it starts from, all of them from the
    // file it names (checked and recorded by hash: its checkpoints hold the adapters alone)
    if let (Some(lora), None) = (&tc.lora, &resume) {
        let Some(report) = &init_report else {
            bail!("train.lora adapts the weights of another run: give the run (or its weights file) with --init-from");
        };
        crate::lora::check_whole(report)?;
        model = crate::lora::attach(model, &cfg.model, lora)?;
        crate::lora::record_base(run, &report.source)?;
    }
    let params = model.num_params();
    let metrics = MetricsLog::open(run, resume.as_ref().map(|(_, s)| s.step))?;
    let adapters = tc.lora.as_ref().map(|_| crate::lora::adapter_params(&model));
    let pb = progress_bar(opts, &cfg, tc, (params, adapters), &state, init_report.as_ref());
    let memory = resumed_memory(&model, resume.as_ref(), &device)?;

    Ok(Session {
        opts,
        run: run.as_path(),
        cfg,
        corpus,
        retrieved,
        batches,
        document_eval,
        eval_set,
        masking,
        device,
        model,
        optim,
        state,
        params,
        metrics,
        pb,
        memory,
        interval_tokens: 0.0,
        loss_acc: None,
        aux_acc: Vec::new(),
        last_norm: None,
        interval_train_secs: 0.0,
        interval_steps: 0,
        last_train_loss: None,
        _lock: lock,
    })
}

/// Draws every lazily initialised parameter of a module where it stands.
pub(crate) struct DrawNow;

impl burn::module::ModuleVisitor for DrawNow {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
        let _ = param.val();
    }

    fn visit_int<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D, Int>>) {
        let _ = param.val();
    }

    fn visit_bool<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D, Bool>>) {
        let _ = param.val();
    }
}

/// `--max-steps` applied, the config validated, and the run directory's checkpoints read: a
/// fresh run needs none, `--resume` at least one. Returns them, newest first.
pub(crate) fn check_request(cfg: &mut ExperimentConfig, opts: &TrainOptions) -> Result<Checkpoints> {
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
    Ok(checkpoints)
}

/// Loads the corpus and tokenizer (the run's own when resuming, with the run's `[train]`),
/// resolves the model config, opens SPALM's tables, then creates the run directory, takes its
/// lock and writes `config.toml`, the tokenizer, the tag names and the tables' record.
fn open_run(
    cfg: &mut ExperimentConfig,
    opts: &TrainOptions,
) -> Result<(Corpus, Option<(Retrieved, Retrieved)>, RunLock)> {
    let run = &opts.run_dir;
    // --- data and tokenizer
    let tokenizer_path = run.join("tokenizer.json");
    let tokenizer = if opts.resume { Some(Tokenizer::load(&tokenizer_path)?) } else { None };
    if opts.resume {
        // The run continues with its own training settings, so its curve is the one an
        // uninterrupted run would have drawn; --max-steps may still extend it.
        let saved = check_same_run(run, cfg)?;
        let ignoring_steps = |t: &TrainConfig| TrainConfig { steps: 0, ..t.clone() };
        if ignoring_steps(&saved.train) != ignoring_steps(&cfg.train) {
            eprintln!("note: [train] differs from the run's config.toml; resuming with the run's settings");
        }
        cfg.train = TrainConfig { steps: opts.max_steps.unwrap_or(saved.train.steps), ..saved.train };
    }
    if !cfg.data.sources.is_empty() {
        // prepared first when the sources changed (nothing is done when they did not)
        crate::prepared::prepare_corpus(&cfg.data, None)?;
    }
    let corpus = Corpus::load(&cfg.data, tokenizer)?;
    cfg.model.resolve(corpus.tokenizer.vocab_size())?;
    check_tags(cfg, &corpus)?;
    // SPALM: every position's retrieved tokens, looked up by its place in the split; opened
    // before the run directory is written, so that a missing table leaves nothing behind
    let retrieved = match (&cfg.data.neighbours, &cfg.model.long_term_memory) {
        (Some(dir), Some(l)) => Some(crate::retrieval::spalm::open_tables(dir, &corpus, cfg.model.vocab(), l.k)?),
        _ => None,
    };
    if let (true, Some(tables)) = (opts.resume, &retrieved) {
        crate::retrieval::spalm::check_resumed_tables(run, tables)?;
    }
    fs::create_dir_all(run).with_context(|| format!("cannot create run directory {}", run.display()))?;
    // one training per run directory, held to the end, before anything in it is written (a
    // second one that got past the checks above is refused here)
    let lock = RunLock::acquire(run)?;
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
        crate::retrieval::spalm::record_tables(run, tables)?;
    }
    Ok((corpus, retrieved, lock))
}

/// What [`data`] builds.
struct Data {
    batches: Batches,
    document_eval: Option<Vec<TokenBatch>>,
    eval_set: Vec<TokenBatch>,
    masking: Option<Masking>,
}

/// The training batches, the validation batches (document streams', or the fixed evaluation
/// set) and the masked objective's corruption.
fn data(
    cfg: &ExperimentConfig,
    tc: &TrainConfig,
    corpus: &Corpus,
    retrieved: Option<&(Retrieved, Retrieved)>,
) -> Result<Data> {
    let seq_len = cfg.model.seq_len;
    let train_tokens = Arc::new(corpus.train.clone());
    let train_tags = corpus.tags.as_ref().map(|t| Arc::new(t.train.clone()));
    let examples = crate::seq2seq::training_examples(&cfg.model, corpus, tc.batch_size, tc.seed)?;
    let batches = match (&corpus.graphs, tc.batching) {
        _ if examples.is_some() => Batches::Examples(examples.expect("checked")),
        _ if corpus.prepared.is_some() => {
            use variorum_data::{PreparedDocumentStreams, PreparedOrderedStreams, Split};
            let p = corpus.prepared.clone().expect("checked");
            match tc.batching {
                Batching::Random => {
                    Batches::Mixture(variorum_data::MixtureWindows::new(p, seq_len, tc.batch_size, tc.seed)?)
                }
                Batching::Ordered => {
                    Batches::PreparedOrdered(PreparedOrderedStreams::new(p, Split::Train, seq_len, tc.batch_size)?)
                }
                Batching::Documents => {
                    Batches::PreparedDocuments(PreparedDocumentStreams::new(p, Split::Train, seq_len, tc.batch_size)?)
                }
            }
        }
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
        (Batches::PreparedDocuments(_), _) => {
            let p = corpus.prepared.clone().expect("prepared documents read a prepared corpus");
            let documents = p.documents(variorum_data::Split::Validation);
            let rows = (documents as usize).clamp(1, tc.batch_size);
            let s = variorum_data::PreparedDocumentStreams::new(p, variorum_data::Split::Validation, seq_len, rows)
                .context("the validation split, read as documents")?;
            let n = s.segments_per_epoch().min(tc.eval_batches.max(1) as u64);
            Some((0..n).map(|i| s.pass_batch(i)).collect::<Result<Vec<_>, _>>()?)
        }
        _ => None,
    };
    let val_tags = corpus.tags.as_ref().map(|t| &t.val);
    let eval_rows = tc.eval_batches * tc.batch_size;
    let examples = crate::seq2seq::validation_examples(&cfg.model, corpus, eval_rows, tc.batch_size)?;
    let eval_set = match (&corpus.graphs, examples) {
        (_, Some(e)) => e,
        (Some(g), None) => graph_eval_batches(&g.val, &corpus.path, seq_len, eval_rows, tc.batch_size)?,
        (None, None) => spread_windows(&corpus.val, seq_len, eval_rows, tc.batch_size, val_tags)?,
    };
    // masked LM: the same hidden tokens at every evaluation, and in every run (seed 0)
    let mut eval_set = masked_batches(&cfg.model, eval_set, 0);
    if let Some((_, val)) = retrieved {
        eval_set.iter_mut().for_each(|b| val.attach(b));
    }
    let masking = training_masking(&cfg.model);
    Ok(Data { batches, document_eval, eval_set, masking })
}

/// The progress bar (drawn with `opts.progress`), at the step the run starts from, and the
/// run's opening lines above it.
fn progress_bar(
    opts: &TrainOptions,
    cfg: &ExperimentConfig,
    tc: &TrainConfig,
    (params, adapters): (usize, Option<usize>),
    state: &TrainState,
    init_report: Option<&InitReport>,
) -> ProgressBar {
    let run = &opts.run_dir;
    let seq_len = cfg.model.seq_len;
    let pb = if opts.progress { ProgressBar::new(tc.steps) } else { ProgressBar::hidden() };
    pb.set_draw_target(if opts.progress { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
    pb.set_style(crate::progress::style());
    pb.set_position(state.step);
    let say = |s: String| pb.suspend(|| eprintln!("{s}"));
    let per_step = match cfg.model.is_encoder_decoder() {
        true => format!("{} examples/step", tc.batch_size * tc.grad_accum),
        false => format!("{} tokens/step", tc.batch_size * seq_len * tc.grad_accum),
    };
    let trained = match adapters {
        Some(a) => format!("{a} LoRA adapter parameters ({params} in all, the rest frozen)"),
        None => format!("{params} parameters"),
    };
    say(format!(
        "training {trained} on {} ({per_step}), run directory {}{}",
        opts.device_name,
        run.display(),
        if state.step > 0 { format!(", resuming at step {}", state.step) } else { String::new() }
    ));

    if let Some(r) = init_report {
        say(r.summary());
    }
    pb
}

/// A memory model's memory (a model.memory, not an attention's own memory, which starts afresh
/// on resuming), as the checkpoint resumed from saved it.
fn resumed_memory(
    model: &DecoderLm,
    resume: Option<&(PathBuf, TrainState)>,
    device: &Device,
) -> Result<Option<DecoderState>> {
    // a memory model carries its memory along the ordered streams; a checkpoint saves a
    // model.memory (not an attention's own memory, which starts afresh on resuming)
    let mut memory = model.has_memory().then(DecoderState::default);
    if let (Some((dir, st)), Some(m)) = (resume, memory.as_mut())
        && let Some(layout) = &st.memory
    {
        *m = crate::snapshot::load_memory(layout, &dir.join("memory.bpk"), device)?;
    }
    Ok(memory)
}

/// The newest checkpoint that loads completely — state, weights and optimizer — with them; a
/// damaged newer one is skipped, and a note says which and why. Nothing is deleted here: the
/// damaged one stays for inspection, and the next save at its step replaces it.
fn newest_complete_checkpoint(
    checkpoints: &[(PathBuf, std::result::Result<TrainState, String>)],
    model: DecoderLm,
    tc: &TrainConfig,
    adapters_only: bool,
) -> Result<(DecoderLm, burn::optim::ModuleOptimizer, PathBuf, TrainState)> {
    let (dir, (model, optim, state), skipped) = checkpoint::newest_that_loads(checkpoints, |dir, state| {
        let state = state.clone().map_err(|e| anyhow::anyhow!(e))?;
        let file = dir.join("model.bpk");
        let model = match adapters_only {
            true => crate::lora::load_adapters(model.clone(), &file, "checkpoint")?,
            false => crate::weights::load_weights(model.clone(), &file, "checkpoint")?,
        };
        // Burn 0.22.1 builds the reloaded moments on `Device::default()` (the BURN_DEVICE
        // backend; the CLI sets it from --device) and moves each to its parameter's device on
        // the next step.
        Ok((model, crate::step::load_optimizer(tc, dir)?, state))
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
pub(crate) fn check_same_run(run: &Path, cfg: &ExperimentConfig) -> Result<ExperimentConfig> {
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
