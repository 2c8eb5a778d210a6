//! `variorum`: train, inspect, benchmark and list the Transformer variants of the zoo.
//!
//! This file parses the command line and hands each subcommand to its module's `run`: the
//! modules at the crate root (`eval`, `datastore`, …) and those under `commands/`.

mod attention;
mod bench_attention;
mod commands;
mod common;
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

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use commands::{
    bench, collaborate, decision, export, generate, import, inspect, pattern, prepare, report, runs, score, train, zoo,
};

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

// Each variant's doc comment is its subcommand's help (`about`); the arguments are the module's.
#[derive(Subcommand)]
enum Command {
    /// Train a model from a config file; writes a run directory.
    Train(train::TrainArgs),
    /// Continue a prompt with a trained run, streaming the text as it is produced; an
    /// encoder–decoder writes the target of a source (--source).
    Generate(generate::GenerateArgs),
    /// Per-token log-probabilities of a text under a trained run, and their total; for an
    /// encoder–decoder, of a target (the text, then its end token) given --source.
    Score(score::ScoreArgs),
    /// Record offline episodes of the key-to-door gridworld from behaviour policies of mixed
    /// quality (ε-greedy shortest paths), for a Decision Transformer's `data.trajectories`.
    Trajectories(decision::TrajectoriesArgs),
    /// Play a trained Decision Transformer in its environment, conditioned on target returns:
    /// return achieved against target (the paper's Figure 4), written to the run's rollouts.json.
    Rollout(decision::RolloutArgs),
    /// Loss, perplexity and bits per unit of a run on its validation split or a file, with
    /// sliding windows, for one or several context lengths; with several runs, a side-by-side
    /// table and one plot.
    Eval(eval::EvalArgs),
    /// kNN-LM datastores: build one over a text with a run's model, or describe one.
    Datastore(datastore::DatastoreArgs),
    /// CALM early exit on a run with `[model.exits]`: validation loss against mean blocks used
    /// for each confidence measure and threshold, the calibrated thresholds, and a plot.
    EarlyExit(early_exit::EarlyExitArgs),
    /// Write a run's weights in another format: safetensors (tensor names:
    /// crates/variorum-train/src/transfer.rs) or a Hugging Face model directory (docs/interop.md
    /// lists the architectures).
    Export(export::ExportArgs),
    /// Import a Hugging Face model directory (config.json, safetensors, tokenizer.json; eighteen
    /// model types, listed in docs/interop.md) as a run directory every command works on.
    Import(import::ImportArgs),
    /// Re-parameterise a run's full multi-head attention as collaborative heads (Cordonnier et
    /// al. 2020: shared query/key projections, a mixing vector per head); writes a new run.
    Collaborate(collaborate::CollaborateArgs),
    /// Draw the attention pattern of a config's kind (a query × key grid of what each query may
    /// attend to, per head), read from the real module; or of a trained run on a text.
    Pattern(pattern::PatternArgs),
    /// Draw a run's learned attention weights on a text as heatmaps with the tokens on the axes
    /// (a grid of heads per layer), with each head's entropy and mean attended distance.
    Attention(attention::AttentionArgs),
    /// One self-contained HTML page for one or several runs: config, curves (overlaid), auxiliary
    /// losses, throughput and memory, sample, attention pattern and learned heatmaps, recorded
    /// evaluations, and what adaptive models learned.
    Report(report::ReportArgs),
    /// A table of the run directories under a folder: model, steps done, best validation loss,
    /// tokens/s and status (finished / running / interrupted / failed).
    Runs(runs::RunsArgs),
    /// Tokenize a config's `[data] sources` (text files, directories, globs, JSON Lines, gzip or
    /// zstd, Parquet) once into token shards that `train` reads (`data.prepared`);
    /// resumes where an interrupted prepare stopped.
    Prepare(prepare::PrepareArgs),
    /// Print a config with every default expanded, its parameter count and FLOPs per token.
    Inspect(inspect::InspectArgs),
    /// Measure training tokens/s and peak memory (median of several runs, synthetic tokens).
    Bench(bench::BenchArgs),
    /// One attention layer alone, for each config's `[model.attention]`: forward + backward time
    /// and peak memory against the sequence length, decoding cost per token against the context.
    BenchAttention(bench_attention::BenchAttentionArgs),
    /// List every kind on every config axis, with its capabilities and source paper. Roles:
    /// "causal" kinds can be a decoder's self-attention, "bidir" ones an encoder's, "cross" ones
    /// attend over a source of another length (an encoder–decoder's cross-attention), "graph"
    /// ones read each example's graph (`data.graph`).
    Zoo(zoo::ZooArgs),
    /// How low-rank a run's attention matrices are: the normalised cumulative singular values of
    /// every head's probability matrix, per layer, over windows of the validation split
    /// (Linformer's Figure 1), and a plot.
    Spectrum(spectrum::SpectrumArgs),
    /// Performer's FAVOR+ against softmax attention: the error of the approximated attention
    /// matrix against the number of random features, i.i.d. and orthogonal (the paper's Figure 3).
    FavorError(favor_error::FavorErrorArgs),
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
        Command::BenchAttention(bench_attention::BenchAttentionArgs { point: Some(p), .. })
            if p.starts_with("need:") =>
        {
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

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Score(args) => score::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Trajectories(args) => decision::trajectories(args),
        Command::Rollout(args) => decision::rollout(args),
        Command::Datastore(args) => datastore::run(args),
        Command::EarlyExit(args) => early_exit::run(args),
        Command::Export(args) => export::run(args),
        Command::Import(args) => import::run(args),
        Command::Collaborate(args) => collaborate::run(args),
        Command::Pattern(args) => pattern::run(args),
        Command::Attention(args) => attention::run(args),
        Command::Report(args) => report::run(args),
        Command::Runs(args) => runs::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchAttention(args) => bench_attention::run(args),
        Command::Zoo(args) => zoo::run(args),
        Command::Spectrum(args) => spectrum::run(args),
        Command::FavorError(args) => favor_error::run(args),
    }
}
