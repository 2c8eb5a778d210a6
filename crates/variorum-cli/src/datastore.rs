//! `variorum datastore build|neighbours|info` and `variorum eval --knn`: the kNN-LM's datastore
//! (`variorum_train::retrieval::knn_lm`, format in `variorum_retrieval::datastore`) and SPALM's neighbour
//! tables (`variorum_train::retrieval::spalm`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail};
use variorum_retrieval::search::HnswParams;
use variorum_retrieval::{Datastore, SearchMode};
use variorum_train::progress;
use variorum_train::retrieval::knn_lm::{self, BuildSettings, Built, KnnEval};
use variorum_train::retrieval::spalm;
use variorum_train::run::Run;

use crate::common::on_interrupt;
use crate::device::DeviceArgs;

// `variorum datastore`: its subcommand is all it takes.
#[derive(clap::Args, Debug)]
pub struct DatastoreArgs {
    #[command(subcommand)]
    pub command: DatastoreCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DatastoreCommand {
    /// Store (key, next token) for every position of a text, keyed by a run's states, with an
    /// HNSW index; prints its size first, and resumes where an interrupted build stopped.
    Build {
        /// A run directory (a plain decoder).
        run: PathBuf,
        /// Which split of the run's data to store.
        #[arg(long, value_enum, default_value = "train", conflicts_with = "data")]
        split: Split,
        /// A UTF-8 text file to store instead of a split.
        #[arg(long)]
        data: Option<PathBuf>,
        /// The datastore directory. Default: RUN/datastore-<split>, or RUN/datastore-file with --data.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Window length the keys are computed with (default: the model's context).
        #[arg(long)]
        window: Option<usize>,
        /// Tokens between window starts (default: the window: disjoint windows, as `variorum eval`).
        #[arg(long)]
        stride: Option<usize>,
        /// Store only the first N tokens.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// HNSW links per node (M).
        #[arg(long, default_value_t = HnswParams::default().connectivity)]
        connectivity: usize,
        /// HNSW candidates explored per insertion (efConstruction).
        #[arg(long, default_value_t = HnswParams::default().expansion_add)]
        expansion_add: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// SPALM's neighbour tables: for every position of the training and validation splits of
    /// the datastore's run, the next tokens of its k nearest entries, searched once with the
    /// datastore's model and kept in DIR/neighbours-train and DIR/neighbours-val; resumes where
    /// an interrupted search stopped.
    Neighbours {
        /// A datastore over its run's training split (`variorum datastore build RUN`).
        dir: PathBuf,
        /// Neighbours per position (a model reads its `model.long_term_memory.k` first ones).
        #[arg(long, default_value_t = 8)]
        k: usize,
        /// In the datastore's own text, skip the entries within this many positions of the
        /// query's; 0 skips its own entry alone, which holds the token it predicts.
        #[arg(long, default_value_t = 0)]
        exclude_radius: u64,
        /// HNSW candidates explored per query.
        #[arg(long, default_value_t = 64)]
        ef: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// What a datastore holds and what built it.
    Info { dir: PathBuf },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Split {
    Train,
    Valid,
}

// `variorum eval RUN --knn DIR` and its settings (flattened into `eval`'s arguments; `generate
// --knn` fills one in with a single k and λ). No `///` on the struct: it would become help text.
#[derive(clap::Args, Debug)]
pub struct KnnArgs {
    /// Also score with this kNN-LM datastore (`variorum datastore build`): the loss with the
    /// LM alone and mixed with retrieval, p = λ p_kNN + (1 − λ) p_LM, for each k and λ.
    #[arg(long)]
    pub knn: Option<PathBuf>,
    /// Neighbours retrieved, comma-separated (one search with the largest).
    #[arg(long, value_delimiter = ',', default_value = "64", requires = "knn")]
    pub knn_k: Vec<usize>,
    /// Weights λ of the kNN distribution, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.25", requires = "knn")]
    pub knn_lambda: Vec<f64>,
    /// Temperature T of p_kNN ∝ exp(−distance / T).
    #[arg(long, default_value_t = 1.0, requires = "knn")]
    pub knn_temperature: f64,
    /// Search every key (exact) instead of the HNSW index.
    #[arg(long, requires = "knn")]
    pub knn_exact: bool,
    /// HNSW candidates explored per query (at least k).
    #[arg(long, default_value_t = 128, requires = "knn")]
    pub knn_ef: usize,
    /// Also search N queries, spread over the text, exactly and print the index's recall@k.
    #[arg(long, default_value_t = 0, requires = "knn")]
    pub knn_recall: usize,
}

impl KnnArgs {
    pub fn check(&self) -> Result<()> {
        if self.knn_k.is_empty() || self.knn_k.contains(&0) {
            bail!("--knn-k needs neighbour counts of at least 1");
        }
        if let Some(l) = self.knn_lambda.iter().find(|l| !(0.0..=1.0).contains(*l)) {
            bail!("--knn-lambda {l} must be in [0, 1]");
        }
        if !(self.knn_temperature > 0.0 && self.knn_temperature.is_finite()) {
            bail!("--knn-temperature {} must be > 0", self.knn_temperature);
        }
        Ok(())
    }

    pub fn mode(&self) -> SearchMode {
        if self.knn_exact { SearchMode::Exact } else { SearchMode::Approximate { ef: self.knn_ef } }
    }
}

pub fn run(args: DatastoreArgs) -> Result<ExitCode> {
    match args.command {
        DatastoreCommand::Build {
            run,
            split,
            data,
            out,
            window,
            stride,
            max_tokens,
            connectivity,
            expansion_add,
            device,
        } => {
            let (device, _) = device.select()?;
            let run = Run::load(&run, &device)?;
            knn_lm::check_run(&run)?;
            let (mut ids, text, default_out) = match &data {
                Some(path) => {
                    let t = variorum_data::read_text(path)?;
                    let ids =
                        run.tokenizer.encode(&t).with_context(|| format!("{} cannot be encoded", path.display()))?;
                    let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
                    (ids, canonical.display().to_string(), "datastore-file")
                }
                None => {
                    let corpus =
                        in_memory(variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone()))?)?;
                    let (ids, name) = match split {
                        Split::Train => (corpus.train, "train"),
                        Split::Valid => (corpus.val, "valid"),
                    };
                    let out = if name == "train" { "datastore-train" } else { "datastore-valid" };
                    (ids, format!("{name} split of {}", corpus.path.display()), out)
                }
            };
            let mut text = text;
            if let Some(n) = max_tokens
                && n < ids.len()
            {
                ids.truncate(n);
                text += &format!(", first {n} tokens");
            }
            let window = window.unwrap_or(run.model.seq_len);
            if window == 0 {
                bail!("--window 0: a context needs at least one token");
            }
            let stride = stride.unwrap_or(window);
            if stride == 0 || stride > window {
                bail!("--stride {stride} must be in 1..={window} (the window)");
            }
            if connectivity < 2 || expansion_add < 1 {
                bail!("--connectivity must be at least 2 and --expansion-add at least 1");
            }
            let settings = BuildSettings { window, stride, index: HnswParams { connectivity, expansion_add } };
            let out = out.unwrap_or_else(|| run.dir.join(default_out));
            build(&run, &ids, &text, &out, &settings)
        }
        DatastoreCommand::Neighbours { dir, k, exclude_radius, ef, device } => {
            let (device, _) = device.select()?;
            let store = Datastore::open(&dir)?;
            let run = Run::load(Path::new(&store.meta.origin.run), &device)
                .with_context(|| format!("the run that built {}", dir.display()))?;
            knn_lm::check_datastore(&run, &store)?;
            if k == 0 || ef == 0 {
                bail!("--k and --ef must be at least 1");
            }
            let corpus = in_memory(variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone()))?)?;
            if store.meta.origin.text_sha256 != knn_lm::ids_sha256(&corpus.train) {
                bail!(
                    "{} holds {}, not the whole training split of {}: neighbour tables are searched in a datastore over it (`variorum datastore build RUN`, without --data or --max-tokens)",
                    dir.display(),
                    store.meta.origin.text,
                    run.dir.display()
                );
            }
            let interrupt =
                on_interrupt("committing and stopping (Ctrl-C again to stop at once)", "what was committed is kept")?;
            let settings = spalm::SearchSettings { k, exclude_radius, ef, chunk: spalm::CHUNK };
            for (split, ids) in [("train", &corpus.train), ("val", &corpus.val)] {
                let out = spalm::table_dir(&dir, split);
                let text = format!("{split} split of {}", corpus.path.display());
                let positions = ids.len().saturating_sub(1) as u64;
                println!(
                    "# {}: {positions} positions × {k} neighbours ({}), ef {ef}",
                    out.display(),
                    mib(positions * k as u64 * 4)
                );
                let pb = progress::bar(positions, split);
                let start = std::time::Instant::now();
                let done = spalm::search_table(
                    &store,
                    &run,
                    ids,
                    &text,
                    &out,
                    settings,
                    |done, total| {
                        pb.set_length(total);
                        pb.set_position(done);
                    },
                    &|| interrupt.load(Ordering::SeqCst),
                )?;
                pb.finish_and_clear();
                if !done {
                    eprintln!("stopped in {}: run the same command again to resume", out.display());
                    return Ok(ExitCode::from(130));
                }
                let table = variorum_retrieval::NeighbourTable::open(&out, run.model.vocab_size)?;
                let slots = table.rows(0, table.positions());
                let empty = slots.iter().filter(|&&v| v == variorum_retrieval::neighbours::NONE).count();
                println!(
                    "# {}: done in {:.1} s; {:.2} % of the slots found no neighbour",
                    out.display(),
                    start.elapsed().as_secs_f64(),
                    100.0 * empty as f64 / slots.len().max(1) as f64
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DatastoreCommand::Info { dir } => {
            let store = Datastore::open(&dir)?;
            let m = &store.meta;
            let o = &m.origin;
            println!("{}", dir.display());
            println!("  entries      {} keys of {} values ({})", m.entries, m.dim, o.key);
            let short = variorum_retrieval::datastore::short;
            println!("  text         {} ({} tokens, sha256 {})", o.text, o.tokens, short(&o.text_sha256));
            println!("  run          {} (weights sha256 {})", o.run, short(&o.weights_sha256));
            println!("  windows      {} tokens every {}", o.window, o.stride);
            println!(
                "  index        {} ({}), connectivity {}, expansion_add {}",
                m.index.kind, m.index.library, m.index.params.connectivity, m.index.params.expansion_add
            );
            println!("  on disk      {}", mib(dir_bytes(&dir)));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

/// Memory the kernel says is available (`MemAvailable`), when it says.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn build(run: &Run, ids: &[u32], text: &str, out: &Path, settings: &BuildSettings) -> Result<ExitCode> {
    let planned = knn_lm::planned_entries(ids.len(), settings);
    let dim = run.config.model.d_model;
    let index_memory = settings.index.memory_estimate(planned, dim);
    println!(
        "# datastore of {text}: {planned} entries × {dim} values — keys {}, values {}, index ≈ {} (about {} on disk)",
        mib(planned * dim as u64 * 4),
        mib(planned * 4),
        mib(index_memory),
        mib(variorum_retrieval::datastore::disk_estimate(planned, dim, &settings.index))
    );
    // the index is built in memory (searching maps it from disk): refuse what cannot fit
    if let Some(avail) = available_memory()
        && index_memory > avail
    {
        bail!(
            "building the index of {planned} entries needs about {} of memory and {} is available: store fewer tokens (--max-tokens) or build on a larger machine",
            mib(index_memory),
            mib(avail)
        );
    }
    let interrupt =
        on_interrupt("committing and stopping (Ctrl-C again to stop at once)", "what was committed is kept")?;
    let pb = progress::bar(planned, "keys");
    let start = std::time::Instant::now();
    let mut stage_start = (String::from("keys"), start);
    let mut times: Vec<(String, f64)> = Vec::new();
    let outcome = knn_lm::build_datastore(
        run,
        ids,
        text,
        out,
        settings,
        |stage, done, total| {
            if stage != stage_start.0 {
                times.push((stage_start.0.clone(), stage_start.1.elapsed().as_secs_f64()));
                stage_start = (stage.to_string(), std::time::Instant::now());
                pb.set_message(stage.to_string());
            }
            pb.set_length(total);
            pb.set_position(done);
        },
        &|| interrupt.load(Ordering::SeqCst),
    )?;
    times.push((stage_start.0.clone(), stage_start.1.elapsed().as_secs_f64()));
    pb.finish_and_clear();
    match outcome {
        Built::Complete => {
            let parts: Vec<String> = times.iter().map(|(s, t)| format!("{s} {t:.1} s")).collect();
            println!("# {}: {planned} entries, {} on disk ({})", out.display(), mib(dir_bytes(out)), parts.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        Built::Interrupted { entries, indexed } => {
            eprintln!(
                "stopped with {entries} of {planned} entries written and {indexed} indexed in {}: run the same command again to resume",
                out.display()
            );
            Ok(ExitCode::from(130))
        }
    }
}

/// `variorum eval RUN --knn DIR`: the loss with the LM alone and mixed with retrieval, for each
/// k and λ, at the run's context (or the one --seq-len given) with the eval's stride.
pub fn eval_knn(
    run: &Run,
    dir: &Path,
    knn: &KnnArgs,
    ids: &[u32],
    len: usize,
    stride: usize,
) -> Result<Vec<variorum_train::eval_record::EvalRow>> {
    knn.check()?;
    let store = Datastore::open(dir)?;
    let settings = KnnEval {
        window: len,
        stride,
        ks: knn.knn_k.clone(),
        lambdas: knn.knn_lambda.clone(),
        temperature: knn.knn_temperature,
        mode: knn.mode(),
        recall_queries: knn.knn_recall,
    };
    let windows = variorum_train::eval::sliding_windows(ids.len(), len, stride).len() as u64;
    let pb = progress::bar(windows, "kNN-LM");
    let scores = knn_lm::knn_loss(run, &store, ids, &settings, Some(&pb))?;
    pb.finish_and_clear();
    let o = &store.meta.origin;
    println!("# datastore {}: {} entries of {} values from {}", store.dir.display(), store.len(), store.dim(), o.text);
    println!(
        "# search: {}, T = {}; {:.3} ms per query over {} queries",
        match settings.mode {
            SearchMode::Exact => "exact".to_string(),
            SearchMode::Approximate { ef } => format!("HNSW, ef {ef}"),
        },
        settings.temperature,
        1e3 * scores.search_seconds / scores.tokens.max(1) as f64,
        scores.tokens
    );
    if let Some((recall, n)) = scores.recall {
        println!(
            "# HNSW recall@{} against exact search: {recall:.4} over {n} queries",
            knn.knn_k.iter().max().unwrap_or(&0)
        );
    }
    if scores.causal {
        println!("# the datastore holds this text: each position retrieves only the entries before its own");
    }
    println!("{:>8} {:>8} {:>10} {:>10} {:>12}", "k", "lambda", "tokens", "loss", "perplexity");
    println!("{:>8} {:>8} {:>10} {:>10.4} {:>12.3}", "-", "0", scores.tokens, scores.lm, scores.lm.exp());
    let mut rows = vec![variorum_train::eval_record::EvalRow {
        data: String::new(),
        seq_len: len.min(ids.len() - 1),
        stride: Some(stride),
        reading: None,
        tokens: scores.tokens,
        loss: scores.lm,
        chrf: None,
        weights: None,
    }];
    let best = scores.mixed.iter().cloned().min_by(|a, b| a.2.total_cmp(&b.2));
    for &(k, lambda, loss) in &scores.mixed {
        println!("{k:>8} {lambda:>8} {:>10} {loss:>10.4} {:>12.3}", scores.tokens, loss.exp());
        rows.push(variorum_train::eval_record::EvalRow {
            reading: Some(format!("kNN-LM k={k} λ={lambda} T={} ({})", settings.temperature, store.dir.display())),
            loss,
            ..rows[0].clone()
        });
    }
    if let Some((k, lambda, loss)) = best {
        println!(
            "# best: k = {k}, λ = {lambda}: {loss:.4} against {:.4} without retrieval (perplexity {:.3} → {:.3})",
            scores.lm,
            scores.lm.exp(),
            loss.exp()
        );
    }
    Ok(rows)
}

/// A datastore holds every position of a split in memory: a prepared corpus's splits are read
/// from its shards instead, and are refused here.
fn in_memory(corpus: variorum_data::Corpus) -> Result<variorum_data::Corpus> {
    if corpus.prepared.is_some() {
        bail!(
            "{} is a prepared corpus: a datastore is built from a text file's splits (data.path), not from shards yet",
            corpus.path.display()
        );
    }
    Ok(corpus)
}
