//! `variorum`: train, inspect, benchmark and list the Transformer variants of the zoo.

mod attention;
mod bench_attention;
mod datastore;
mod device;
mod early_exit;
mod eval;
mod favor_error;
mod spectrum;

/// Tensor buffers are allocated and freed at a high rate; glibc's malloc returns large ones to the
/// kernel each time (mmap/munmap, then page zeroing on the next touch). mimalloc keeps and reuses
/// them: 6,300 → 6,800–7,600 training tokens/s on the baby GPT (flex, 2 cores).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;

use variorum_data::Corpus;
use variorum_train::generate::SampleConfig;
use variorum_train::run::Run;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions};

#[derive(Parser)]
#[command(
    name = "variorum",
    version,
    about = "Transformer variants as composable Burn modules: train, inspect, benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model from a config file; writes a run directory.
    Train {
        /// Experiment config (.toml or .json).
        config: PathBuf,
        /// cpu (the fastest CPU backend), flex, ndarray, wgpu, cuda (when built with it).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Run directory. Default: runs/<config name>.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Train for this many steps (overrides train.steps).
        #[arg(long)]
        max_steps: Option<u64>,
        /// Continue the run in --out from its latest checkpoint.
        #[arg(long)]
        resume: bool,
        /// Checkpoint and stop after this many steps, keeping the schedule of train.steps.
        #[arg(long)]
        stop_at: Option<u64>,
        /// Start from the weights of a run directory or a .safetensors/.bpk file (what fits by
        /// name and shape; the rest is freshly initialised).
        #[arg(long)]
        init_from: Option<PathBuf>,
        /// No progress bar (log lines only).
        #[arg(long)]
        no_progress: bool,
        /// Do not write report.html into the run directory (at each checkpoint and at the end).
        #[arg(long)]
        no_report: bool,
    },
    /// Continue a prompt with a trained run, streaming the text as it is produced; an
    /// encoder–decoder writes the target of a source (--source).
    Generate {
        /// A run directory.
        run: PathBuf,
        #[arg(long, required_unless_present = "source")]
        prompt: Option<String>,
        /// The source an encoder–decoder writes a target for (the encoder runs once; the
        /// decoder stops at its end token or its context).
        #[arg(long, conflicts_with = "prompt")]
        source: Option<String>,
        #[arg(long, default_value_t = 200)]
        max_new_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        /// Sample among the k most likely tokens only (0 = all).
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// Sample within the smallest set of tokens whose probability reaches p.
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Recompute the whole context for every token instead of using the KV cache.
        #[arg(long)]
        no_cache: bool,
        /// Beam search with this many beams (deterministic; ignores the sampling options).
        #[arg(long, default_value_t = 1)]
        beams: usize,
        /// Generate under this example tag (a run trained on tagged data: the names are in its
        /// tags.json, e.g. "HAMLET, PRINCE OF DENMARK").
        #[arg(long)]
        tag: Option<String>,
        /// Draw each token from the kNN-LM mixture with this datastore (`variorum datastore build`).
        #[arg(long, conflicts_with_all = ["source", "beams"])]
        knn: Option<PathBuf>,
        /// Neighbours retrieved per token.
        #[arg(long, default_value_t = 64, requires = "knn")]
        knn_k: usize,
        /// Weight λ of the kNN distribution.
        #[arg(long, default_value_t = 0.25, requires = "knn")]
        knn_lambda: f64,
        /// Temperature T of p_kNN ∝ exp(−distance / T).
        #[arg(long, default_value_t = 1.0, requires = "knn")]
        knn_temperature: f64,
    },
    /// Per-token log-probabilities of a text under a trained run, and their total; for an
    /// encoder–decoder, of a target (the text, then its end token) given --source.
    Score {
        /// A run directory.
        run: PathBuf,
        /// A UTF-8 text file to score.
        #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
        text: Option<PathBuf>,
        /// A text given on the command line.
        #[arg(long)]
        prompt: Option<String>,
        #[arg(long, value_enum, default_value = "tsv")]
        format: ScoreFormat,
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Score under this example tag (a run trained on tagged data; names in its tags.json).
        #[arg(long)]
        tag: Option<String>,
        /// The source the text is the target of (encoder–decoder runs).
        #[arg(long)]
        source: Option<String>,
    },
    /// Loss, perplexity and bits per unit of a run on its validation split or a file, with
    /// sliding windows, for one or several context lengths; with several runs, a side-by-side
    /// table and one plot.
    Eval {
        /// Run directories.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// A UTF-8 text file to evaluate instead of the validation split.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Context lengths, comma-separated (default: the model's).
        #[arg(long, value_delimiter = ',')]
        seq_len: Vec<usize>,
        /// Tokens between window starts; each window counts only its last `stride` predictions
        /// (default: the context length, i.e. disjoint windows).
        #[arg(long)]
        stride: Option<usize>,
        /// Evaluate only the first N tokens.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Where to draw loss against context length (with several lengths); default RUN/eval.png,
        /// or ./eval.png when comparing runs.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Evaluate under another setting of the run's config, KEY=VALUE (repeatable), e.g.
        /// `--set model.memory.length=256` for a longer memory than in training.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        settings: Vec<String>,
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Encoder–decoder runs: beams of the decoding chrF is measured on (1 = greedy).
        #[arg(long, default_value_t = 1)]
        beams: usize,
        /// Encoder–decoder runs: validation examples decoded for chrF (the loss reads them all).
        #[arg(long, default_value_t = eval::DEFAULT_DECODE)]
        decode: usize,
        /// Also score with this kNN-LM datastore (`variorum datastore build`): the loss with the
        /// LM alone and mixed with retrieval, p = λ p_kNN + (1 − λ) p_LM, for each k and λ.
        #[arg(long)]
        knn: Option<PathBuf>,
        /// Neighbours retrieved, comma-separated (one search with the largest).
        #[arg(long, value_delimiter = ',', default_value = "64", requires = "knn")]
        knn_k: Vec<usize>,
        /// Weights λ of the kNN distribution, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0.25", requires = "knn")]
        knn_lambda: Vec<f64>,
        /// Temperature T of p_kNN ∝ exp(−distance / T).
        #[arg(long, default_value_t = 1.0, requires = "knn")]
        knn_temperature: f64,
        /// Search every key (exact) instead of the HNSW index.
        #[arg(long, requires = "knn")]
        knn_exact: bool,
        /// HNSW candidates explored per query (at least k).
        #[arg(long, default_value_t = 128, requires = "knn")]
        knn_ef: usize,
        /// Also search N queries, spread over the text, exactly and print the index's recall@k.
        #[arg(long, default_value_t = 0, requires = "knn")]
        knn_recall: usize,
    },
    /// kNN-LM datastores: build one over a text with a run's model, or describe one.
    Datastore {
        #[command(subcommand)]
        command: datastore::DatastoreCommand,
    },
    /// CALM early exit on a run with `[model.exits]`: validation loss against mean blocks used
    /// for each confidence measure and threshold, the calibrated thresholds, and a plot.
    EarlyExit {
        run: PathBuf,
        /// Thresholds to try, comma-separated (1 = the full model).
        #[arg(long, value_delimiter = ',', default_value = "1,0.995,0.99,0.95,0.9,0.8,0.6,0.4,0.2,0")]
        thresholds: Vec<f64>,
        /// Validation tokens to decode (token by token, so keep it modest).
        #[arg(long, default_value_t = 4096)]
        max_tokens: usize,
        /// Loss increase allowed by the calibration, nats.
        #[arg(long, default_value_t = 0.02)]
        tolerance: f64,
        /// Learn-then-Test calibration: the largest fraction of tokens whose prediction may change.
        #[arg(long, default_value_t = 0.1)]
        ltt_delta: f64,
        /// Learn-then-Test calibration: the test's level (1 − confidence).
        #[arg(long, default_value_t = 0.05)]
        ltt_epsilon: f64,
        /// Where to draw the curve (default RUN/early-exit.png).
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Write a run's weights in another format (tensor names: crates/variorum-train/src/transfer.rs).
    Export {
        /// A run directory.
        run: PathBuf,
        #[arg(long, value_enum, default_value = "safetensors")]
        format: ExportFormat,
        /// Output file. Default: RUN/model.safetensors.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Re-parameterise a run's full multi-head attention as collaborative heads (Cordonnier et
    /// al. 2020: shared query/key projections, a mixing vector per head); writes a new run.
    Collaborate {
        /// A run directory with model.attention.kind = "full".
        run: PathBuf,
        /// The new run directory (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Width of the shared query/key projections. Default n_heads · head_dim (exact); less
        /// compresses them by a CP decomposition whose relative error is printed per layer.
        #[arg(long)]
        shared_dim: Option<usize>,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Draw the attention pattern of a config's kind (a query × key grid of what each query may
    /// attend to, per head), read from the real module; or of a trained run on a text.
    Pattern {
        /// A config file, or a run directory (then --prompt gives the text).
        source: PathBuf,
        /// Positions drawn (a config; at most model.seq_len, which is also the default up to 64).
        #[arg(long)]
        len: Option<usize>,
        /// The block application drawn.
        #[arg(long, default_value_t = 0)]
        layer: usize,
        /// Draw this head only.
        #[arg(long)]
        head: Option<usize>,
        /// The text a run reads (data-dependent kinds draw the pattern of their input).
        #[arg(long)]
        prompt: Option<String>,
        /// PNG or SVG, by extension.
        #[arg(long, default_value = "pattern.png")]
        out: PathBuf,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Draw a run's learned attention weights on a text as heatmaps with the tokens on the axes
    /// (a grid of heads per layer), with each head's entropy and mean attended distance.
    Attention(attention::AttentionArgs),
    /// One self-contained HTML page for one or several runs: config, curves (overlaid), auxiliary
    /// losses, throughput and memory, sample, attention pattern and learned heatmaps, recorded
    /// evaluations, and what adaptive models learned.
    Report {
        /// Run directories.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Default: RUN/report.html for one run, report.html for several.
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// A table of the run directories under a folder: model, steps done, best validation loss,
    /// tokens/s and status (finished / running / interrupted / failed).
    Runs {
        /// Default: runs.
        dir: Option<PathBuf>,
        /// One JSON object per run instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Print a config with every default expanded, its parameter count and FLOPs per token.
    Inspect {
        /// A config file, or a run directory.
        config: PathBuf,
    },
    /// Measure training tokens/s and peak memory (median of several runs, synthetic tokens).
    Bench {
        config: PathBuf,
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Timed steps per run.
        #[arg(long, default_value_t = 30)]
        steps: u64,
        /// Untimed steps before each run.
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One attention layer alone, for each config's `[model.attention]`: forward + backward time
    /// and peak memory against the sequence length, decoding cost per token against the context.
    BenchAttention {
        /// Experiment configs (only `model.attention` and `model.position` are used).
        configs: Vec<PathBuf>,
        /// Sequence lengths of the forward + backward, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096,8192,16384")]
        lengths: Vec<usize>,
        /// Context lengths after which one token is decoded, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
        contexts: Vec<usize>,
        #[arg(long, default_value_t = 256)]
        d_model: usize,
        /// Timed forward + backward runs per point (after one untimed).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Decoded tokens timed per context.
        #[arg(long, default_value_t = 16)]
        tokens: usize,
        /// Directory for the tables (markdown, JSON) and plots.
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        device: String,
        /// With the CPU kernels off: each kind's composed path (what a kernel gives is the
        /// difference).
        #[arg(long)]
        composed: bool,
        /// Measure one point ("train:LEN", "need:LEN": its memory with freed pages handed back, or
        /// "generate:CONTEXT") in this process.
        #[arg(long, hide = true)]
        point: Option<String>,
        /// Put a seeded random graph on the mask, each position reading this many others, for
        /// the kinds that read a graph (`graph`, `full`; data.graph in training).
        #[arg(long)]
        graph_degree: Option<usize>,
    },
    /// List every kind on every config axis, with its capabilities and source paper. Roles:
    /// "causal" kinds can be a decoder's self-attention, "bidir" ones an encoder's, "cross" ones
    /// attend over a source of another length (an encoder–decoder's cross-attention), "graph"
    /// ones read each example's graph (`data.graph`).
    Zoo {
        #[arg(long)]
        json: bool,
    },
    /// How low-rank a run's attention matrices are: the normalised cumulative singular values of
    /// every head's probability matrix, per layer, over windows of the validation split
    /// (Linformer's Figure 1), and a plot.
    Spectrum {
        /// Run directory (a plain stack whose attention forms probabilities).
        run: PathBuf,
        /// Windows of the model's context, spread over the validation split.
        #[arg(long, default_value_t = 16)]
        windows: usize,
        /// Where to draw the curves (default RUN/spectrum.png).
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Performer's FAVOR+ against softmax attention: the error of the approximated attention
    /// matrix against the number of random features, i.i.d. and orthogonal (the paper's Figure 3).
    FavorError {
        /// Random feature counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
        features: Vec<usize>,
        /// Sequence length of the random queries and keys.
        #[arg(long, default_value_t = 256)]
        len: usize,
        /// Head size d.
        #[arg(long, default_value_t = 16)]
        head_dim: usize,
        /// Standard deviation of the queries' and keys' entries.
        #[arg(long, default_value_t = 1.0)]
        std: f64,
        /// Draws of the features (and of q, k) averaged per point.
        #[arg(long, default_value_t = 20)]
        draws: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where to draw the curves (log–log).
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ExportFormat {
    Safetensors,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ScoreFormat {
    Tsv,
    Json,
}

fn main() -> ExitCode {
    // A closed pipe (`variorum eval … | head`) ends the process as it ends other Unix tools,
    // by SIGPIPE, instead of a failed print that Rust turns into a panic: Rust ignores SIGPIPE by
    // default, and std has no safe way to restore it (hence libc).
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread starts; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // Set before any other thread starts: a `bench-attention` child measuring what a layer needs
    // hands freed pages back at once; every other process keeps them for reuse.
    match &cli.command {
        Command::BenchAttention { point: Some(p), .. } if p.starts_with("need:") => {
            variorum_train::allocator::return_freed_pages()
        }
        _ => variorum_train::allocator::keep_freed_pages(),
    }
    variorum_train::threads::join_compute_pool();
    // A panic is a bug in variorum, not a user mistake: one line, no backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("variorum: internal error: {info}");
    }));
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A flag set by the first Ctrl-C (announcing `first`: what the command does now); the second
/// ends the process at once with exit code 130 (saying `second`: what is kept).
fn on_interrupt(first: &'static str, second: &'static str) -> Result<Arc<AtomicBool>> {
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\nsecond interrupt: stopping now ({second})");
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: {first}");
    })
    .context("cannot install the Ctrl-C handler")?;
    Ok(interrupt)
}

/// A numeric flag below its least sensible value: a one-line error naming the flag.
fn at_least<T: PartialOrd + std::fmt::Display>(flag: &str, value: T, min: T) -> Result<()> {
    if value < min {
        anyhow::bail!("{flag} {value} must be at least {min}");
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Train { config, device, out, max_steps, resume, stop_at, init_from, no_progress, no_report } => {
            if let Some(n) = stop_at {
                at_least("--stop-at", n, 1)?;
            }
            let (device, device_name) = device::select(&device)?;
            let cfg = ExperimentConfig::load(&config)?;
            let run_dir = out.unwrap_or_else(|| {
                PathBuf::from("runs")
                    .join(config.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into()))
            });
            let interrupt = on_interrupt(
                "saving a checkpoint after this step (Ctrl-C again to stop at once)",
                "the last checkpoint is intact",
            )?;
            let opts = TrainOptions {
                run_dir: run_dir.clone(),
                max_steps,
                resume,
                stop_at,
                init_from,
                device,
                device_name,
                progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
                interrupt,
                report: !no_report,
            };
            match variorum_train::train(cfg, &opts)? {
                Outcome::Finished(s) => {
                    println!(
                        "done: {} steps, train loss {}, validation loss {}, {:.0} tokens/s; run in {}",
                        s.steps,
                        fmt_opt(s.final_train_loss),
                        fmt_opt(s.final_val_loss),
                        s.tokens_per_sec,
                        run_dir.display()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Outcome::Interrupted { step, checkpoint } => {
                    println!(
                        "interrupted at step {step}; checkpoint {}; continue with: variorum train {} --out {} --resume",
                        checkpoint.display(),
                        config.display(),
                        run_dir.display()
                    );
                    Ok(ExitCode::from(130))
                }
            }
        }
        Command::Generate {
            run,
            prompt,
            source,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            device,
            no_cache,
            beams,
            tag,
            knn,
            knn_k,
            knn_lambda,
            knn_temperature,
        } => {
            at_least("--beams", beams, 1)?;
            at_least("--max-new-tokens", max_new_tokens, 1)?;
            if !(temperature >= 0.0 && temperature.is_finite()) {
                anyhow::bail!("--temperature {temperature} must be >= 0 (0 = greedy)");
            }
            if !(top_p > 0.0 && top_p <= 1.0) {
                anyhow::bail!("--top-p {top_p} must be in (0, 1]");
            }
            let (device, _) = device::select(&device)?;
            let run = Run::load(&run, &device)?;
            if run.model.mask_token.is_some() {
                anyhow::bail!(
                    "{} was trained with model.objective.kind = \"masked\" (bidirectional attention): it fills in hidden tokens and cannot generate left to right; see its sample.txt, or score it with `variorum eval`",
                    run.dir.display()
                );
            }
            if run.model.encoder.is_some() || source.is_some() {
                let Some(source) = source else {
                    anyhow::bail!(
                        "{} is an encoder–decoder: it writes the target of a source; pass --source TEXT",
                        run.dir.display()
                    );
                };
                if run.model.encoder.is_none() {
                    anyhow::bail!(
                        "{} is a decoder-only model: it continues a prompt (--prompt), it has no encoder to read --source",
                        run.dir.display()
                    );
                }
                if tag.is_some() {
                    anyhow::bail!("--tag: an encoder–decoder is not conditioned on example tags");
                }
                if no_cache && beams > 1 {
                    eprintln!("note: beam search recomputes its beams every step; --no-cache changes nothing");
                }
                if max_new_tokens >= run.model.seq_len {
                    eprintln!(
                        "note: the target stops at {} tokens, model.seq_len less the end token it starts from",
                        run.model.seq_len - 1
                    );
                }
                let cfg = SampleConfig { max_new_tokens, temperature, top_k, top_p, seed, no_cache, tag: None };
                return generate_from_source(&run, &source, &cfg, beams, &device);
            }
            let prompt = prompt.unwrap_or_default();
            let prompt_ids = run.encode_prompt(&prompt)?;
            let tag = tag.map(|name| run.tag_id(&name)).transpose()?;
            if tag.is_none() && run.config.model.attention.tags().is_some() && !run.tags.is_empty() {
                eprintln!(
                    "note: generating untagged (tag 0); pass --tag with one of the {} tags in {}",
                    run.tags.len() - 1,
                    run.dir.join(variorum_train::run::TAGS_FILE).display()
                );
            }
            let cfg = SampleConfig { max_new_tokens, temperature, top_k, top_p, seed, no_cache, tag };
            let mut out = std::io::stdout();
            write!(out, "{prompt}")?;
            out.flush()?;
            // decode the whole continuation each time and print what is new, so multi-byte
            // characters split over byte-level tokens come out whole
            let mut generated: Vec<u32> = Vec::new();
            let mut printed = 0usize;
            let start = std::time::Instant::now();
            if beams > 1 && run.model.long_term_memory.is_some() {
                anyhow::bail!(
                    "--beams: beam search does not retrieve for a long-term memory; sample without --beams (greedy with --temperature 0)"
                );
            }
            if beams > 1 {
                let best =
                    variorum_train::generate::beam_search(&run.model, &prompt_ids, beams, max_new_tokens, tag, &device);
                let secs = start.elapsed().as_secs_f64();
                writeln!(out, "{}", run.tokenizer.decode(&best))?;
                eprintln!(
                    "{} tokens in {secs:.2} s: {:.1} tokens/s (beam search, {beams} beams)",
                    best.len(),
                    best.len() as f64 / secs.max(1e-9)
                );
                return Ok(ExitCode::SUCCESS);
            }
            let store = match &knn {
                Some(dir) => {
                    let args = datastore::KnnArgs {
                        dir: dir.clone(),
                        ks: vec![knn_k],
                        lambdas: vec![knn_lambda],
                        temperature: knn_temperature,
                        exact: false,
                        ef: 128,
                        recall: 0,
                    };
                    args.check()?;
                    variorum_train::knn_lm::check_run(&run)?;
                    let store = variorum_retrieval::Datastore::open(dir)?;
                    variorum_train::knn_lm::check_datastore(&run, &store)?;
                    Some((store, args))
                }
                None => None,
            };
            let retriever = store.as_ref().map(|(store, args)| variorum_train::knn_lm::Retriever {
                store,
                knn: variorum_retrieval::KnnConfig { k: knn_k, lambda: knn_lambda, temperature: knn_temperature },
                mode: args.mode(),
            });
            // a long-term memory retrieves for every position as the text grows
            let neighbours = match run.config.model.long_term_memory {
                Some(_) => {
                    Some(variorum_train::spalm::OnlineNeighbours::open(&run.config, run.model.vocab_size, &device, 64)?)
                }
                None => None,
            };
            let retrieval =
                variorum_train::generate::Retrieval { knn: retriever.as_ref(), neighbours: neighbours.as_ref() };
            variorum_train::generate::generate_with(&run.model, &prompt_ids, &cfg, retrieval, &device, |t| {
                generated.push(t);
                let text = run.tokenizer.decode(&generated);
                let text = text.trim_end_matches('\u{FFFD}');
                if text.len() > printed && text.is_char_boundary(printed) {
                    let _ = write!(out, "{}", &text[printed..]);
                    let _ = out.flush();
                    printed = text.len();
                }
            })?;
            let secs = start.elapsed().as_secs_f64();
            let text = run.tokenizer.decode(&generated);
            if text.len() > printed && text.is_char_boundary(printed) {
                write!(out, "{}", &text[printed..])?;
            }
            writeln!(out)?;
            eprintln!(
                "{} tokens in {secs:.2} s: {:.1} tokens/s ({})",
                generated.len(),
                generated.len() as f64 / secs.max(1e-9),
                if run.model.has_memory() {
                    "memory carried"
                } else if knn.is_some() && no_cache {
                    "no cache, kNN-LM"
                } else if knn.is_some() {
                    "KV cache, kNN-LM"
                } else if no_cache {
                    "no cache"
                } else {
                    "KV cache"
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Score { run, text, prompt, format, device, tag, source } => {
            let (device, _) = device::select(&device)?;
            let run = Run::load(&run, &device)?;
            let text = match (text, prompt) {
                (Some(path), _) => variorum_data::read_text(&path)?,
                (None, Some(p)) => p,
                (None, None) => anyhow::bail!("give --text FILE or --prompt TEXT"),
            };
            let ids = run.encode_prompt(&text)?;
            if run.model.long_term_memory.is_some() {
                eprintln!(
                    "note: {}'s long-term memory reads the neighbour tables of its own splits; this text is scored without retrieval (the LM alone; `variorum eval` scores the validation split with it)",
                    run.dir.display()
                );
            }
            let scores = match source {
                Some(source) => {
                    let source = run.tokenizer.encode(&source).context("the source cannot be encoded")?;
                    run.score_from(&source, &ids)?
                }
                None => {
                    let tag = tag.map(|name| run.tag_id(&name)).transpose()?;
                    run.score_tagged(&ids, tag)?
                }
            };
            match format {
                ScoreFormat::Json => println!("{}", serde_json::to_string_pretty(&scores)?),
                ScoreFormat::Tsv => {
                    println!("position\ttoken\ttext\tlogprob");
                    for t in &scores.tokens {
                        println!("{}\t{}\t{}\t{:.6}", t.position, t.token, t.text.escape_default(), t.logprob);
                    }
                    let n = scores.tokens.len() as f64;
                    println!(
                        "# total\t{:.4} nats over {} {}s: {:.4} nats/{u}, {:.4} bits/{u}",
                        scores.total_logprob,
                        scores.tokens.len(),
                        scores.unit,
                        -scores.total_logprob / n,
                        -scores.total_logprob / n / std::f64::consts::LN_2,
                        u = scores.unit
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Datastore { command } => datastore::run(command),
        Command::Eval {
            runs,
            data,
            seq_len,
            stride,
            max_tokens,
            plot,
            settings,
            device,
            beams,
            decode,
            knn,
            knn_k,
            knn_lambda,
            knn_temperature,
            knn_exact,
            knn_ef,
            knn_recall,
        } => {
            at_least("--beams", beams, 1)?;
            let knn = knn.map(|dir| datastore::KnnArgs {
                dir,
                ks: knn_k,
                lambdas: knn_lambda,
                temperature: knn_temperature,
                exact: knn_exact,
                ef: knn_ef,
                recall: knn_recall,
            });
            eval::eval(eval::EvalArgs {
                runs,
                data,
                seq_len,
                stride,
                max_tokens,
                plot,
                settings,
                device,
                beams,
                decode,
                knn,
            })
        }
        Command::EarlyExit { run, thresholds, max_tokens, tolerance, ltt_delta, ltt_epsilon, plot, device } => {
            if !(tolerance >= 0.0 && tolerance.is_finite()) {
                anyhow::bail!("--tolerance {tolerance} must be >= 0 (nats of loss above the full model)");
            }
            early_exit::early_exit(early_exit::Args {
                run,
                thresholds,
                max_tokens,
                tolerance,
                ltt_delta,
                ltt_epsilon,
                plot,
                device,
            })
        }
        Command::Export { run, format: ExportFormat::Safetensors, out } => {
            let (device, _) = device::select("cpu")?;
            let spinner = variorum_train::progress::spinner(&format!("loading {}", run.display()));
            let loaded = Run::load(&run, &device)?;
            let path = out.unwrap_or_else(|| run.join("model.safetensors"));
            spinner.set_message(format!("writing {}", path.display()));
            let names = variorum_train::transfer::export_safetensors(&loaded.model, &path)?;
            spinner.finish_and_clear();
            for n in &names {
                println!("{n}");
            }
            eprintln!("{} tensors written to {}", names.len(), path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Collaborate { run, out, shared_dim, device } => {
            if let Some(n) = shared_dim {
                at_least("--shared-dim", n, 1)?;
            }
            let (device, _) = device::select(&device)?;
            let loaded = Run::load(&run, &device)?;
            let r = variorum_train::collaborate::collaborate(&loaded, shared_dim, &out)?;
            println!(
                "{} heads of {}: shared query/key width {} of {}{}",
                r.n_heads,
                r.head_dim,
                r.shared_dim,
                r.full_width,
                if r.shared_dim == r.full_width { " (exact)" } else { "" }
            );
            for (i, e) in r.layer_errors.iter().enumerate() {
                println!("layer {i:>3}: relative error of the query-key products {e:.6}");
            }
            let change = |before: usize, after: usize| 100.0 * (after as f64 - before as f64) / (before.max(1) as f64);
            println!(
                "attention parameters {} -> {} ({:+.1}%)",
                r.attention_params_before,
                r.attention_params_after,
                change(r.attention_params_before, r.attention_params_after)
            );
            println!(
                "model parameters     {} -> {} ({:+.1}%)",
                r.model_params_before,
                r.model_params_after,
                change(r.model_params_before, r.model_params_after)
            );
            for note in &r.notes {
                eprintln!("note: {note}");
            }
            eprintln!(
                "run written to {}; evaluate with `variorum eval {}`, fine-tune with `variorum train {} --init-from {} --out DIR`",
                out.display(),
                out.display(),
                out.join("config.toml").display(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { config } => inspect(&config),
        Command::Attention(args) => attention::run(args),
        Command::Report { runs, out, device } => {
            let (device, _) = device::select(&device)?;
            let out = match (out, runs.as_slice()) {
                (Some(out), _) => out,
                (None, [one]) => one.join(variorum_train::report::REPORT_FILE),
                (None, _) => PathBuf::from(variorum_train::report::REPORT_FILE),
            };
            let pb = variorum_train::progress::spinner(&format!("reading {} run(s)", runs.len()));
            let written = variorum_train::report::write(&runs, &out, &device);
            pb.finish_and_clear();
            written?;
            eprintln!("report written to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs { dir, json } => {
            let root = dir.unwrap_or_else(|| PathBuf::from("runs"));
            let rows = variorum_train::listing::list(&root)?;
            let mut table = String::new();
            if json {
                table = serde_json::to_string_pretty(&rows)? + "\n";
            } else {
                let name = |d: &Path| d.strip_prefix(&root).unwrap_or(d).display().to_string();
                let width = rows.iter().map(|r| name(&r.dir).len()).max().unwrap_or(3).max(3);
                let head = ("run", "model", "steps", "best val", "tokens/s");
                table += &format!(
                    "{:<width$}  {:<36}  {:>11}  {:>8}  {:>9}  status\n",
                    head.0, head.1, head.2, head.3, head.4
                );
                for r in &rows {
                    let steps = format!("{}/{}", r.steps_done, r.steps);
                    let val = r.best_val_loss.map_or("-".to_string(), |v| format!("{v:.4}"));
                    let speed = r.tokens_per_sec.map_or("-".to_string(), |v| format!("{v:.0}"));
                    let status = serde_json::to_value(r.status)?.as_str().unwrap_or("?").to_string();
                    let model: String = r.model.chars().take(36).collect();
                    let run = name(&r.dir);
                    table += &format!("{run:<width$}  {model:<36}  {steps:>11}  {val:>8}  {speed:>9}  {status}\n");
                }
                if rows.is_empty() {
                    table += &format!("# no run directories under {}\n", root.display());
                }
            }
            // a reader that stops early (`| head`) ends the table, not the program
            match std::io::stdout().lock().write_all(table.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Pattern { source, len, layer, head, prompt, out, device } => {
            use variorum_train::pattern;
            let (device, _) = device::select(&device)?;
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
        Command::Bench { config, device, steps, warmup, runs, json } => {
            at_least("--steps", steps, 1)?;
            at_least("--runs", runs, 1)?;
            let (device, name) = device::select(&device)?;
            let cfg = ExperimentConfig::load(&config)?;
            let r = variorum_train::bench::bench(&cfg, &device, warmup, steps, runs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("config            {}", config.display());
                println!("device            {name}");
                println!("parameters        {}", r.params);
                println!("tokens/step       {}", r.tokens_per_step);
                println!(
                    "runs (tokens/s)   {}",
                    r.runs.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ")
                );
                println!("median tokens/s   {:.0}", r.median_tokens_per_sec);
                println!("median GFLOP/s    {:.2}", r.median_gflops);
                println!(
                    "peak RSS          {}",
                    r.peak_rss_mib.map(|m| format!("{m:.0} MiB")).unwrap_or_else(|| "n/a".into())
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchAttention {
            configs,
            lengths,
            contexts,
            d_model,
            reps,
            tokens,
            out,
            device,
            composed,
            point,
            graph_degree,
        } => {
            for &n in &lengths {
                at_least("--lengths", n, 1)?;
            }
            for &n in &contexts {
                at_least("--contexts", n, 1)?;
            }
            at_least("--d-model", d_model, 1)?;
            at_least("--reps", reps, 1)?;
            at_least("--tokens", tokens, 1)?;
            bench_attention::bench_attention(bench_attention::Args {
                configs,
                lengths,
                contexts,
                d_model,
                reps,
                tokens,
                out,
                device,
                composed,
                point,
                graph_degree,
            })
        }
        Command::Spectrum { run, windows, plot, device } => {
            spectrum::spectrum(spectrum::Args { run, windows, plot, device })
        }
        Command::FavorError { features, len, head_dim, std, draws, seed, plot, device } => {
            favor_error::favor_error(favor_error::Args { features, len, head_dim, std, draws, seed, plot, device })
        }
        Command::Zoo { json } => {
            let kinds = variorum_model::zoo::kinds();
            if json {
                println!("{}", serde_json::to_string_pretty(&kinds)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<20} {:<18} {:<64} {}", "axis", "kind", "supports", "paper");
            for k in kinds {
                let c = k.caps;
                // an attention kind's roles in an encoder–decoder: the encoder's self-attention
                // (bidirectional over padded sources), the decoder's (causal), cross-attention
                let attention = k.axis == "model.attention";
                let flags: Vec<&str> = [
                    (c.causal, "causal"),
                    (c.bidirectional, "bidir"),
                    (c.incremental, "cache"),
                    (c.score_bias, "bias"),
                    (c.qk_rotation, "rot"),
                    (c.aux_losses, "aux"),
                    (c.variable_length, "varlen"),
                    (c.graph, "graph"),
                    (attention && c.bidirectional && c.hides_padding, "encoder"),
                    (attention && c.causal, "decoder"),
                    (attention && c.cross, "cross"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, n)| *n)
                .collect();
                println!("{:<20} {:<18} {:<64} {}", k.axis, k.kind, flags.join(","), k.paper);
                println!("{:<20} {:<18} {}", "", "", k.summary);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `variorum generate --source`: an encoder–decoder's target for `source`, streamed (sampling)
/// or printed whole (beam search).
fn generate_from_source(
    run: &Run,
    source: &str,
    cfg: &SampleConfig,
    beams: usize,
    device: &burn::prelude::Device,
) -> Result<ExitCode> {
    let ids = run.tokenizer.encode(source).context("the source cannot be encoded")?;
    if ids.is_empty() || ids.len() > run.model.seq_len {
        anyhow::bail!(
            "the source is {} tokens: an encoder–decoder reads 1 to model.seq_len = {} tokens",
            ids.len(),
            run.model.seq_len
        );
    }
    // the special tokens start at the end token
    let vocab = run.model.end_token.unwrap_or_default();
    let start = std::time::Instant::now();
    let mut out = std::io::stdout();
    let written = if beams > 1 {
        let best = variorum_train::seq2seq::beam_search_from(&run.model, &ids, beams, cfg.max_new_tokens, device);
        writeln!(out, "{}", variorum_train::seq2seq::show(&best, &run.tokenizer, vocab))?;
        best
    } else {
        let mut so_far = Vec::new();
        let mut printed = 0usize;
        let best = variorum_train::seq2seq::generate_from(&run.model, &ids, cfg, device, |t| {
            so_far.push(t);
            let text = variorum_train::seq2seq::show(&so_far, &run.tokenizer, vocab);
            let text = text.trim_end_matches('\u{FFFD}');
            if text.len() > printed && text.is_char_boundary(printed) {
                let _ = write!(out, "{}", &text[printed..]);
                let _ = out.flush();
                printed = text.len();
            }
        });
        let text = variorum_train::seq2seq::show(&best, &run.tokenizer, vocab);
        if text.len() > printed && text.is_char_boundary(printed) {
            write!(out, "{}", &text[printed..])?;
        }
        writeln!(out)?;
        best
    };
    let secs = start.elapsed().as_secs_f64();
    let how = match (beams > 1, cfg.no_cache) {
        (true, _) => format!("beam search, {beams} beams"),
        (false, true) => "no cache: the source and the prefix read again for every token".into(),
        (false, false) => "source encoded once, KV cache".into(),
    };
    eprintln!("{} tokens in {secs:.2} s: {:.1} tokens/s ({how})", written.len(), written.len() as f64 / secs.max(1e-9));
    Ok(ExitCode::SUCCESS)
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "n/a".into())
}

fn inspect(path: &Path) -> Result<ExitCode> {
    let (mut cfg, source) = if path.is_dir() {
        (ExperimentConfig::load(&path.join("config.toml"))?, "run")
    } else {
        (ExperimentConfig::load(path)?, "config")
    };
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
        let learns = cfg.model.attention.kind() == "adaptive-span"
            || matches!(&cfg.model.depth, variorum_block::DepthConfig::Universal(u) if u.act);
        if learns && let Err(e) = learned_behaviour(path) {
            println!("# (learned spans / steps not shown: {e:#})");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What an adaptive-span or ACT run learned (the views of its report, as text): the span of
/// every head, the steps per token on the validation split.
fn learned_behaviour(run: &Path) -> Result<()> {
    let (device, _) = device::select("cpu")?;
    let loaded = Run::load(run, &device)?;
    for (title, lines) in variorum_train::report::learned_text(&loaded, &device)? {
        println!("# {title}");
        for line in lines {
            println!("#   {line}");
        }
    }
    Ok(())
}
