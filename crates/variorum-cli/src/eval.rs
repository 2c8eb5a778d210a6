//! `variorum eval`: loss of one or several runs at one or several context lengths.
//!
//! With several runs it is the side-by-side comparison: one row per run, one column per length,
//! `n/a` where a run cannot encode that length (a learned position table), and one plot with a
//! line per run. A memory model is read as ordered streams carrying its memory (and, alone,
//! also without it, at the same segment length).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_data::SplitTags;
use variorum_train::eval_record::{self, EvalRow};
use variorum_train::progress;
use variorum_train::run::Run;

use crate::common::at_least;
use crate::datastore::KnnArgs;
use crate::device::DeviceArgs;

/// `--decode`'s default: validation examples an encoder–decoder decodes for chrF.
pub const DEFAULT_DECODE: usize = 200;

// The clap arguments of `variorum eval` are what the evaluation reads.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Run directories.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// A UTF-8 text file to evaluate instead of the validation split.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Context lengths, comma-separated (default: the model's).
    #[arg(long, value_delimiter = ',')]
    pub seq_len: Vec<usize>,
    /// Tokens between window starts; each window counts only its last `stride` predictions
    /// (default: the context length, i.e. disjoint windows).
    #[arg(long)]
    pub stride: Option<usize>,
    /// Evaluate only the first N tokens.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Where to draw loss against context length (with several lengths); default RUN/eval.png,
    /// or ./eval.png when comparing runs.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Evaluate under another setting of the run's config, KEY=VALUE (repeatable), e.g.
    /// `--set model.memory.length=256` for a longer memory than in training.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Encoder–decoder runs: beams of the decoding chrF is measured on (1 = greedy).
    #[arg(long, default_value_t = 1)]
    pub beams: usize,
    /// Encoder–decoder runs: validation examples decoded for chrF (the loss reads them all).
    #[arg(long, default_value_t = DEFAULT_DECODE)]
    pub decode: usize,
    // `--knn DIR` and its settings: scoring with a kNN-LM datastore too (help text on the fields)
    #[command(flatten)]
    pub retrieval: KnnArgs,
}

/// The token ids to evaluate `run` on, where they come from and, for the run's tagged
/// validation split, where its example tags change; and how `eval.json` names what was read.
fn tokens(run: &Run, args: &EvalArgs) -> Result<(Vec<u32>, String, Option<SplitTags>, String)> {
    let (mut ids, source, tags) = match &args.data {
        Some(path) => {
            let text = variorum_data::read_text(path)?;
            let ids = run.tokenizer.encode(&text).with_context(|| format!("{} cannot be encoded", path.display()))?;
            if run.config.model.attention.tags().is_some() {
                eprintln!("note: {} is read untagged (tag 0) by a model conditioned on example tags", path.display());
            }
            (ids, path.display().to_string(), None)
        }
        None => {
            let (ids, tags) = run.validation_split()?;
            (ids, "the validation split".to_string(), tags)
        }
    };
    // the same file however its path is written
    let mut label = match &args.data {
        Some(path) => path.canonicalize().unwrap_or_else(|_| path.clone()).display().to_string(),
        None => source.clone(),
    };
    if let Some(n) = args.max_tokens
        && n < ids.len()
    {
        ids.truncate(n);
        label += &format!(", first {n} tokens");
    }
    if ids.len() < 2 {
        bail!("{source} has {} tokens: nothing to evaluate", ids.len());
    }
    Ok((ids, source, tags, label))
}

fn check_lengths(lengths: &[usize], stride: Option<usize>) -> Result<()> {
    for &len in lengths {
        if len == 0 {
            bail!("--seq-len 0: a context needs at least one token");
        }
        let stride = stride.unwrap_or(len);
        if stride == 0 || stride > len {
            bail!("--stride {stride} must be in 1..={len} (the context length)");
        }
    }
    Ok(())
}

/// A run's name in tables and progress messages: its directory's last component.
fn run_name(dir: &Path) -> String {
    dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Windows (batch rows) read by the sliding-window evaluation of `n` tokens: the progress unit.
fn sliding_windows(n: usize, len: usize, stride: usize) -> u64 {
    variorum_train::eval::sliding_windows(n, len, stride).len() as u64
}

/// Windows read by the masked evaluation of `n` tokens (disjoint, as `variorum_data::eval_batches`).
fn masked_windows(n: usize, len: usize) -> u64 {
    (n.saturating_sub(1) / len.max(1)) as u64
}

/// Windows read by one memory evaluation of `n` tokens: [`STREAMS`] per segment.
fn stream_windows(n: usize, len: usize) -> u64 {
    (STREAMS * (n.saturating_sub(1) / STREAMS / len.max(1))) as u64
}

fn draw(series: &[(String, Vec<(f64, f64)>)], path: PathBuf) -> Result<()> {
    let colours = series.iter().enumerate().map(|(i, _)| {
        let (r, g, b) = Palette99::COLORS[i % Palette99::COLORS.len()];
        RGBColor(r, g, b)
    });
    let series: Vec<_> = series.iter().zip(colours).map(|((n, p), c)| (n.as_str(), p.clone(), c, true)).collect();
    if variorum_train::pictures::plot::lines(
        &series,
        &path,
        "loss against context length",
        "context length (tokens)",
        "loss (nats/token)",
    )? {
        println!("# plot: {}", path.display());
    }
    Ok(())
}

pub fn run(args: EvalArgs) -> Result<ExitCode> {
    at_least("--beams", args.beams, 1)?;
    check_lengths(&args.seq_len, args.stride)?;
    let (device, _) = args.device.select()?;
    if !args.settings.is_empty() {
        println!("# with {}", args.settings.join(", "));
    }
    if args.runs.len() == 1 {
        return eval_one(&args, &device);
    }
    if args.retrieval.knn.is_some() {
        bail!("--knn scores one run with its datastore: give one run");
    }
    if args.seq_len.is_empty() {
        bail!("comparing several runs needs --seq-len (the lengths to compare at)");
    }
    print!("{:<28}", "run");
    for len in &args.seq_len {
        print!(" {:>9}", format!("L={len}"));
    }
    println!();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    // counted in windows; a run's count is known once it is loaded, so the runs still to load are
    // taken to read as many as this one (exact when they share the validation text)
    let pb = progress::bar(0, "");
    for (i, dir) in args.runs.iter().enumerate() {
        let name = run_name(dir);
        // loading may print notes to stderr: the bar steps aside meanwhile
        let (run, ids, tags, label, retrieved) = pb.suspend(|| -> Result<_> {
            let run = Run::load_with(dir, &device, &args.settings)?;
            if run.config.data.graph.is_some() {
                bail!(
                    "{} was trained on graph examples (data.graph), which are scored whole, not at context lengths: evaluate it alone",
                    dir.display()
                );
            }
            if run.config.model.is_encoder_decoder() {
                bail!(
                    "{} is an encoder–decoder, scored on its examples (loss per target token, chrF), not at context lengths: evaluate it alone",
                    dir.display()
                );
            }
            let (ids, _, tags, label) = tokens(&run, &args)?;
            let retrieved = match run.model.long_term_memory {
                Some(_) => Some(retrieved_for(&run, &ids)?),
                None => None,
            };
            Ok((run, ids, tags, label, retrieved))
        })?;
        let windows = |len: usize| {
            if run.model.mask_token.is_some() {
                masked_windows(ids.len(), len)
            } else if run.model.has_memory() || run.model.long_term_memory.is_some() {
                stream_windows(ids.len(), len)
            } else {
                sliding_windows(ids.len(), len, args.stride.unwrap_or(len))
            }
        };
        let this: u64 = args.seq_len.iter().filter(|&&len| run.check_len(len).is_ok()).map(|&len| windows(len)).sum();
        pb.set_length(pb.position() + this * (args.runs.len() - i) as u64);
        // the row is printed whole, so that it does not share a line with the bar
        let mut row = format!("{name:<28}");
        let mut rows = Vec::new();
        let mut points = Vec::new();
        for &len in &args.seq_len {
            if let Err(e) = run.check_len(len) {
                row += &format!(" {:>9}", "n/a");
                notes.push(format!("{name} at {len}: {e}"));
                continue;
            }
            pb.set_message(format!("{name} L={len}"));
            let stride = args.stride.unwrap_or(len);
            let bar = Some(&pb);
            let (loss, n) = if run.model.mask_token.is_some() {
                let (loss, n) = variorum_train::eval::masked_loss(
                    &run.model,
                    &run.config.model,
                    &ids,
                    tags.as_ref(),
                    len,
                    &device,
                    bar,
                );
                rows.push(eval_row(len, Some(len), Some("masked"), n, loss));
                (loss, n)
            } else if let Some(retrieved) = &retrieved {
                let (loss, n) = variorum_train::eval::stream_loss(
                    &run.model,
                    &ids,
                    len,
                    STREAMS,
                    run.model.has_memory(),
                    Some(retrieved),
                    &device,
                    bar,
                );
                rows.push(eval_row(len, None, Some("with retrieval"), n, loss));
                (loss, n)
            } else if run.model.has_memory() {
                let (loss, n) =
                    variorum_train::eval::stream_loss(&run.model, &ids, len, STREAMS, true, None, &device, bar);
                rows.push(eval_row(len, None, Some("with memory"), n, loss));
                (loss, n)
            } else {
                let (loss, n) =
                    variorum_train::eval::sliding_loss(&run.model, &ids, tags.as_ref(), len, stride, &device, bar);
                rows.push(eval_row(len.min(ids.len() - 1), Some(stride), None, n, loss));
                (loss, n)
            };
            // nothing scored is not a loss to keep
            if n == 0 {
                rows.pop();
            }
            row += &format!(" {loss:>9.4}");
            points.push((len as f64, loss));
        }
        pb.suspend(|| println!("{row}"));
        record(&run, &args, &label, rows);
        series.push((name, points));
    }
    pb.finish_and_clear();
    for n in notes {
        println!("# n/a: {n}");
    }
    let path = args.plot.clone().unwrap_or_else(|| PathBuf::from("eval.png"));
    draw(&series, path)?;
    Ok(ExitCode::SUCCESS)
}

/// Streams read in parallel by the memory evaluation (each carries its own memory).
const STREAMS: usize = 16;

/// The table both memory evaluations print: for each length, the loss carrying the state from
/// segment to segment and with each segment from nothing. `lengths` pairs each length with the
/// progress steps one reading of it takes; `score(len, carry, bar)` reads it and returns (mean
/// loss, predictions), or fails when nothing can be scored.
fn with_and_without(
    name: &str,
    what: &str,
    lengths: &[(usize, u64)],
    mut score: impl FnMut(usize, bool, &progress::ProgressBar) -> Result<(f64, usize)>,
) -> Result<Vec<EvalRow>> {
    let (with_what, without_what) = (format!("with {what}"), format!("without {what}"));
    println!("{:>8} {:>10} {:>16} {:>16} {:>10}", "segment", "tokens", with_what, "without", "gain");
    // each length is read twice: with the memory and without
    let pb = progress::bar(lengths.iter().map(|&(_, steps)| 2 * steps).sum(), name);
    let mut rows = Vec::new();
    for &(len, _) in lengths {
        pb.set_message(format!("{name} L={len} {with_what}"));
        let (with, n) = score(len, true, &pb)?;
        pb.set_message(format!("{name} L={len} {without_what}"));
        let (without, _) = score(len, false, &pb)?;
        pb.suspend(|| println!("{len:>8} {n:>10} {with:>16.4} {without:>16.4} {:>10.4}", without - with));
        for (reading, loss) in [(&with_what, with), (&without_what, without)] {
            rows.push(eval_row(len, None, Some(reading), n, loss));
        }
    }
    pb.finish_and_clear();
    Ok(rows)
}

/// A memory model: the same segments scored carrying the memory from segment to segment, and
/// each from nothing.
fn eval_memory(
    run: &Run,
    name: &str,
    ids: &[u32],
    lengths: &[usize],
    device: &burn::prelude::Device,
) -> Result<Vec<EvalRow>> {
    println!("# {STREAMS} streams read segment by segment; memory = {}", run.config.model.memory.kind());
    let lengths: Vec<(usize, u64)> = lengths.iter().map(|&len| (len, stream_windows(ids.len(), len))).collect();
    with_and_without(name, "memory", &lengths, |len, carry, pb| streams(run, ids, len, carry, None, device, pb))
}

/// [`STREAMS`] ordered streams of `ids` read in segments of `len` ([`stream_loss`]), or an
/// error when the text is too short for one segment each.
///
/// [`stream_loss`]: variorum_train::eval::stream_loss
fn streams(
    run: &Run,
    ids: &[u32],
    len: usize,
    carry: bool,
    retrieved: Option<&variorum_train::retrieval::spalm::Retrieved>,
    device: &burn::prelude::Device,
    pb: &progress::ProgressBar,
) -> Result<(f64, usize)> {
    let (loss, n) =
        variorum_train::eval::stream_loss(&run.model, ids, len, STREAMS, carry, retrieved, device, Some(pb));
    if n == 0 {
        bail!("{} tokens are fewer than {STREAMS} streams of one {len}-token segment", ids.len());
    }
    Ok((loss, n))
}

/// The neighbour table of `ids` among those of `run`'s datastore (`data.neighbours`): its
/// validation or training split's, when `ids` is that split or begins it.
fn retrieved_for(run: &Run, ids: &[u32]) -> Result<variorum_train::retrieval::spalm::Retrieved> {
    let (Some(dir), Some(l)) = (&run.config.data.neighbours, &run.config.model.long_term_memory) else {
        bail!("{} has no long-term memory", run.dir.display());
    };
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone()))?;
    let (train, val) = variorum_train::retrieval::spalm::open_tables(dir, &corpus, run.model.vocab_size, l.k)?;
    // a split or its first tokens (--max-tokens): the table's rows from the start
    let starts = |split: &[u32]| ids.len() <= split.len() && split[..ids.len()] == *ids;
    match (starts(&corpus.val), starts(&corpus.train)) {
        (true, _) => Ok(val),
        (false, true) => Ok(train),
        _ => bail!(
            "{} retrieves from neighbour tables searched for its own splits, and this text is neither: evaluate its validation split (without --data)",
            run.dir.display()
        ),
    }
}

/// A model with a long-term memory (SPALM): the same segments scored with each position's
/// retrieved tokens and without them, as ordered streams (carrying a `model.memory` from
/// segment to segment).
fn eval_long_term(
    run: &Run,
    name: &str,
    ids: &[u32],
    lengths: &[usize],
    device: &burn::prelude::Device,
) -> Result<Vec<EvalRow>> {
    let retrieved = retrieved_for(run, ids)?;
    let o = &retrieved.table.meta.origin;
    println!(
        "# {STREAMS} streams read segment by segment; memory = {}; {} of {} neighbours per position from {}",
        run.config.model.memory.kind(),
        retrieved.k,
        o.k,
        o.datastore
    );
    let lengths: Vec<(usize, u64)> = lengths.iter().map(|&len| (len, stream_windows(ids.len(), len))).collect();
    let carry = run.model.has_memory();
    with_and_without(name, "retrieval", &lengths, |len, retrieve, pb| {
        streams(run, ids, len, carry, retrieve.then_some(&retrieved), device, pb)
    })
}

/// A model with a memory per document (`train.batching = "documents"`): the split's documents
/// (its `data.tags` sections) read as the run was trained, one row per document up to
/// STREAMS, each row's memory cleared at its documents' starts; then the same segments each
/// from nothing.
fn eval_documents(
    run: &Run,
    name: &str,
    ids: &[u32],
    tags: &SplitTags,
    lengths: &[usize],
    device: &burn::prelude::Device,
) -> Result<Vec<EvalRow>> {
    check_document_lengths(run, lengths)?;
    let rows = variorum_data::DocumentStreams::count(ids.len(), tags).min(STREAMS);
    if rows == 0 {
        bail!("the validation split holds no document of two tokens or more");
    }
    let (ids, tags) = (std::sync::Arc::new(ids.to_vec()), std::sync::Arc::new(tags.clone()));
    let passes: Vec<Vec<variorum_data::TokenBatch>> = lengths
        .iter()
        .map(|&len| Ok(variorum_data::DocumentStreams::new(ids.clone(), tags.clone(), len, rows)?.one_pass()))
        .collect::<Result<_>>()?;
    println!(
        "# {rows} rows of whole documents read segment by segment; each row's memory cleared at its documents' starts"
    );
    let sized: Vec<(usize, u64)> = lengths.iter().zip(&passes).map(|(&len, p)| (len, p.len() as u64)).collect();
    with_and_without(name, "memory", &sized, |len, carry, pb| {
        let batches = &passes[lengths.iter().position(|&l| l == len).expect("one of the lengths")];
        let read = batches.iter().map(Ok::<_, anyhow::Error>);
        variorum_train::eval::document_loss(&run.model, read, carry, device, Some(pb))
    })
}

/// A model with a memory per document reads documents in whole contexts (its segments tile
/// them): every length must be a multiple of its own.
fn check_document_lengths(run: &Run, lengths: &[usize]) -> Result<()> {
    let context = run.config.model.seq_len;
    match lengths.iter().find(|&&len| len % context != 0) {
        Some(len) => bail!(
            "--seq-len {len}: a model with a memory per document reads documents in whole contexts of {context} tokens (its segments tile them); use a multiple of {context}"
        ),
        None => Ok(()),
    }
}

/// A masked language model: the loss on the hidden tokens of disjoint windows (the same hidden
/// tokens as the run's own validation, the same for every run).
fn eval_masked(
    run: &Run,
    name: &str,
    ids: &[u32],
    tags: Option<&SplitTags>,
    lengths: &[usize],
    device: &burn::prelude::Device,
) -> Result<Vec<EvalRow>> {
    println!("# masked language model: loss on the hidden tokens of disjoint windows");
    println!("{:>8} {:>8} {:>10} {:>10} {:>12}", "seq_len", "stride", "hidden", "loss", "perplexity");
    let pb = progress::bar(lengths.iter().map(|&len| masked_windows(ids.len(), len)).sum(), name);
    let mut rows = Vec::new();
    for &len in lengths {
        pb.set_message(format!("{name} L={len}"));
        let (loss, n) =
            variorum_train::eval::masked_loss(&run.model, &run.config.model, ids, tags, len, device, Some(&pb));
        if n == 0 {
            bail!("{} tokens are fewer than one {len}-token window", ids.len());
        }
        pb.suspend(|| println!("{len:>8} {len:>8} {n:>10} {loss:>10.4} {:>12.3}", loss.exp()));
        rows.push(eval_row(len, Some(len), Some("masked"), n, loss));
    }
    pb.finish_and_clear();
    Ok(rows)
}

fn eval_row(seq_len: usize, stride: Option<usize>, reading: Option<&str>, tokens: usize, loss: f64) -> EvalRow {
    EvalRow {
        data: String::new(),
        seq_len,
        stride,
        reading: reading.map(str::to_string),
        tokens,
        loss,
        chrf: None,
        weights: None,
    }
}

/// Keeps the losses in the run's `eval.json`, for its report — not those of a config changed
/// by `--set`, which are not the run's.
fn record(run: &Run, args: &EvalArgs, data: &str, rows: Vec<EvalRow>) {
    if !args.settings.is_empty() || rows.is_empty() {
        return;
    }
    // a running or interrupted run is measured with a checkpoint's weights: say which
    let weights = run.weights.strip_prefix(&run.dir).unwrap_or(&run.weights).display().to_string();
    let rows: Vec<EvalRow> =
        rows.into_iter().map(|r| EvalRow { data: data.to_string(), weights: Some(weights.clone()), ..r }).collect();
    if let Err(e) = eval_record::record(&run.dir, &rows) {
        eprintln!("note: {} not updated: {e:#}", run.dir.join(eval_record::EVAL_FILE).display());
    }
}

/// A run scored on whole validation examples (`is`: what it is): `--data` is refused, and the
/// window options are noted as unused for these `examples`.
fn read_whole(run: &Run, args: &EvalArgs, is: &str, examples: &str) -> Result<()> {
    if let Some(path) = &args.data {
        bail!("{} {is}; --data {} would be read as plain text", run.dir.display(), path.display());
    }
    if !args.seq_len.is_empty() || args.stride.is_some() || args.max_tokens.is_some() {
        eprintln!("note: {examples} are read whole: --seq-len, --stride and --max-tokens are not used");
    }
    Ok(())
}

/// A run trained on graph examples (`data.graph`): the loss over every validation example, each
/// read whole with its graph, in training's validation batches (training reads the first
/// `train.eval_batches · batch_size` of them).
fn eval_graph(run: &Run, args: &EvalArgs, device: &burn::prelude::Device) -> Result<ExitCode> {
    read_whole(
        run,
        args,
        "was trained on graph examples (data.graph) and is scored on its validation examples with their graphs",
        "graph examples",
    )?;
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone()))?;
    let Some(graphs) = corpus.graphs else { bail!("{} holds no graph examples", corpus.path.display()) };
    let seq_len = run.config.model.seq_len;
    // training's batches (its masks are seeded by batch and row), over every example rather
    // than its first train.eval_batches · batch_size
    let batch_size = run.config.train.batch_size;
    let batches = variorum_data::graph_eval_batches(&graphs.val, &corpus.path, seq_len, usize::MAX, batch_size)?;
    // the masked objective hides what the run's own validation hid in the examples both read
    let batches = variorum_train::eval::masked_batches(&run.config.model, batches, 0);
    let predicted: usize = batches.iter().map(|b| variorum_train::eval::predicted(&run.model, b)).sum();
    let loss = variorum_train::eval::evaluate(&run.model, &batches, device);
    println!("# {} validation examples of {} with their graphs", graphs.val.len(), corpus.path.display());
    println!("{:>10} {:>10} {:>10} {:>12}", "examples", "predicted", "loss", "perplexity");
    println!("{:>10} {predicted:>10} {loss:>10.4} {:>12.3}", graphs.val.len(), loss.exp());
    let reading = if run.model.mask_token.is_some() { "graph, masked" } else { "graph" };
    record(run, args, "the validation examples", vec![eval_row(seq_len, None, Some(reading), predicted, loss)]);
    Ok(ExitCode::SUCCESS)
}

/// An encoder–decoder (`model.kind = "encoder-decoder"`): the loss per target token over its
/// validation examples (every pair, or training's corrupted validation windows), and the chrF
/// of the targets it writes from the sources of the first `--decode` of them.
fn eval_examples(run: &Run, args: &EvalArgs, device: &burn::prelude::Device) -> Result<ExitCode> {
    read_whole(run, args, "is an encoder–decoder, scored on its validation examples", "examples")?;
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone()))?;
    let m = &run.config.model;
    // every validation pair; corrupted windows as many as training evaluates
    let rows =
        if corpus.pairs.is_some() { usize::MAX } else { run.config.train.eval_batches * run.config.train.batch_size };
    let batch_size = run.config.train.batch_size;
    let Some(batches) = variorum_train::seq2seq::validation_examples(m, &corpus, rows, batch_size)? else {
        bail!("{} is not an encoder–decoder", run.dir.display());
    };
    let n: usize = batches.iter().map(|b| b.batch_size).sum();
    let decode = args.decode.min(n);
    let pb = progress::bar(decode as u64, &run_name(&args.runs[0]));
    // the special tokens the config adds start after the text vocabulary
    let vocab = run.model.text_vocab;
    let s = variorum_train::seq2seq::score_examples(
        &run.model,
        &batches,
        &run.tokenizer,
        vocab,
        args.beams,
        decode,
        device,
        || pb.inc(1),
    );
    pb.finish_and_clear();
    let what = if corpus.pairs.is_some() { "validation pairs" } else { "corrupted validation windows" };
    println!("# {} {what} of {}", s.examples, corpus.path.display());
    let how = if args.beams > 1 { format!("{} beams", args.beams) } else { "greedy".into() };
    println!(
        "{:>10} {:>14} {:>10} {:>12} {:>10} {:>8}",
        "examples", "target tokens", "loss", "perplexity", "decoded", "chrF"
    );
    println!(
        "{:>10} {:>14} {:>10.4} {:>12.3} {:>10} {:>8.2}   ({how})",
        s.examples,
        s.target_tokens,
        s.loss,
        s.loss.exp(),
        s.decoded,
        s.chrf
    );
    let reading = format!("encoder-decoder, chrF of {} decoded ({how})", s.decoded);
    let row = EvalRow { chrf: Some(s.chrf), ..eval_row(m.seq_len, None, Some(&reading), s.target_tokens, s.loss) };
    record(run, args, &format!("the {what}"), vec![row]);
    Ok(ExitCode::SUCCESS)
}

fn eval_one(args: &EvalArgs, device: &burn::prelude::Device) -> Result<ExitCode> {
    let run = Run::load_with(&args.runs[0], device, &args.settings)?;
    if args.retrieval.knn.is_some() {
        variorum_train::retrieval::knn_lm::check_run(&run)?;
    }
    if run.config.data.graph.is_some() {
        return eval_graph(&run, args, device);
    }
    if run.config.model.is_encoder_decoder() {
        return eval_examples(&run, args, device);
    }
    if args.beams != 1 || args.decode != DEFAULT_DECODE {
        eprintln!("note: --beams and --decode measure an encoder–decoder's decoding; this run is a decoder");
    }
    if let Some(corpus) = prepared_to_score(&run, args)? {
        return eval_prepared(&run, args, corpus, device);
    }
    let (ids, source, tags, label) = tokens(&run, args)?;
    let lengths = if args.seq_len.is_empty() { vec![run.model.seq_len] } else { args.seq_len.clone() };
    check_lengths(&lengths, args.stride)?;
    for &len in &lengths {
        run.check_len(len)?;
    }
    println!("# {} tokens of {source}", ids.len());
    if let Some(dir) = &args.retrieval.knn {
        let [len] = lengths[..] else { bail!("--knn scores at one context length: give one --seq-len") };
        let rows = crate::datastore::eval_knn(&run, dir, &args.retrieval, &ids, len, args.stride.unwrap_or(len))?;
        record(&run, args, &label, rows);
        return Ok(ExitCode::SUCCESS);
    }
    let name = run_name(&args.runs[0]);
    if run.model.has_memory() && run.config.train.batching == variorum_train::config::Batching::Documents {
        let tags = tags.context("the run reads documents (train.batching = \"documents\"), which --data does not mark: evaluate its validation split")?;
        let rows = eval_documents(&run, &name, &ids, &tags, &lengths, device)?;
        record(&run, args, &label, rows);
        return Ok(ExitCode::SUCCESS);
    }
    if run.model.long_term_memory.is_some() {
        let rows = eval_long_term(&run, &name, &ids, &lengths, device)?;
        record(&run, args, &label, rows);
        return Ok(ExitCode::SUCCESS);
    }
    if run.model.has_memory() {
        let rows = eval_memory(&run, &name, &ids, &lengths, device)?;
        record(&run, args, &label, rows);
        return Ok(ExitCode::SUCCESS);
    }
    if run.model.mask_token.is_some() {
        let rows = eval_masked(&run, &name, &ids, tags.as_ref(), &lengths, device)?;
        record(&run, args, &label, rows);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", table_header(run.tokenizer.unit()));
    let mut points = Vec::new();
    let mut rows = Vec::new();
    let total: u64 = lengths.iter().map(|&len| sliding_windows(ids.len(), len, args.stride.unwrap_or(len))).sum();
    let pb = progress::bar(total, &name);
    for len in lengths {
        pb.set_message(format!("{name} L={len}"));
        let stride = args.stride.unwrap_or(len);
        let (loss, n) =
            variorum_train::eval::sliding_loss(&run.model, &ids, tags.as_ref(), len, stride, device, Some(&pb));
        pb.suspend(|| println!("{}", table_row(len, stride, n, loss)));
        points.push((len as f64, loss));
        // a text shorter than the window is read in one window of all its tokens
        rows.push(eval_row(len.min(ids.len() - 1), Some(stride), None, n, loss));
    }
    pb.finish_and_clear();
    record(&run, args, &label, rows);
    if let Some((mean, shares)) = variorum_train::eval::steps_per_token(&run.model, &ids, run.model.seq_len, device) {
        println!("# adaptive computation time: {}", variorum_train::eval::format_steps(mean, &shares));
    }
    if points.len() > 1 {
        let path = args.plot.clone().unwrap_or_else(|| run.dir.join("eval.png"));
        draw(&[("validation loss".to_string(), points)], path)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Tokens of a prepared corpus's validation split scored at a time (`eval_prepared`).
const PREPARED_CHUNK: usize = 1 << 20;

/// The prepared corpus whose validation split `eval` scores whole: `--data DIR` naming one, or
/// the run's own (`data.prepared`) without `--data`. A retrieving model (SPALM, `--knn`) reads
/// the first validation tokens the run holds ([`variorum_data::PREPARED_VAL_TOKENS`]) instead.
fn prepared_to_score(run: &Run, args: &EvalArgs) -> Result<Option<variorum_data::PreparedCorpus>> {
    let dir = match &args.data {
        Some(d) if d.join("index.json").is_file() => d.clone(),
        Some(d) if d.is_dir() => {
            bail!("--data {} is a directory without index.json: give a text file or a prepared corpus", d.display())
        }
        Some(_) => return Ok(None),
        None if run.config.data.is_prepared() => match &run.config.data.prepared {
            Some(d) => d.clone(),
            None => return Ok(None),
        },
        None => return Ok(None),
    };
    if run.model.long_term_memory.is_some() || args.retrieval.knn.is_some() {
        if args.data.is_some() {
            bail!("--data {}: a retrieving model does not read a prepared corpus", dir.display());
        }
        eprintln!(
            "note: the first {} validation tokens are read (a retrieving model)",
            variorum_data::PREPARED_VAL_TOKENS
        );
        return Ok(None);
    }
    let corpus = variorum_data::PreparedCorpus::open(&dir)?;
    if run.tokenizer.sha256()? != corpus.index.tokenizer.sha256 {
        bail!(
            "{} was prepared with another tokenizer than {}'s: its ids mean other tokens to this model",
            dir.display(),
            run.dir.display()
        );
    }
    Ok(Some(corpus))
}

/// The lengths of the pieces [`variorum_data::PreparedCorpus::val_chunks`] cuts sources of
/// `per_source` tokens into, the last cut to `cap` predictions in all (as [`prepared_pieces`]).
fn piece_lengths(per_source: &[u64], chunk: usize, cap: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut read = 0usize;
    for &n in per_source {
        let n = n as usize;
        for i in 0..n.saturating_sub(1).div_ceil(chunk) {
            if read >= cap {
                return out;
            }
            let len = ((i + 1) * chunk + 1).min(n) - i * chunk;
            let len = len.min((cap - read).saturating_add(1));
            read += len - 1;
            out.push(len);
        }
    }
    out
}

/// The validation split's pieces for contexts of `len` (pieces of a multiple of `len` tokens,
/// so that disjoint windows fall where they would over the split read whole), `cap`
/// predictions in all.
fn prepared_pieces(
    corpus: &variorum_data::PreparedCorpus,
    len: usize,
    cap: usize,
) -> impl Iterator<Item = Result<Vec<u32>>> + '_ {
    let chunk = PREPARED_CHUNK.div_ceil(len) * len;
    let mut read = 0usize;
    corpus.val_chunks(chunk).map_while(move |piece| {
        if read >= cap {
            return None;
        }
        Some(piece.map_err(anyhow::Error::from).map(|mut p| {
            p.truncate((cap - read).saturating_add(1));
            read += p.len() - 1;
            p
        }))
    })
}

/// Adds piece scores `(mean loss, predictions)` into one mean.
#[derive(Default)]
struct Mean {
    sum: f64,
    count: usize,
}

impl Mean {
    fn add(&mut self, (loss, n): (f64, usize)) {
        if n > 0 {
            self.sum += loss * n as f64;
            self.count += n;
        }
    }

    fn get(&self) -> (f64, usize) {
        (self.sum / self.count.max(1) as f64, self.count)
    }
}

/// A prepared corpus's validation split, scored whole, streaming: a plain decoder's sliding
/// windows and a masked model's hidden tokens in pieces of [`PREPARED_CHUNK`] tokens, each
/// source on its own; a memory model's ordered streams piece by piece, each piece's streams
/// starting from nothing; a model with a memory per document reads the held-out documents as
/// it was trained, one row of documents per stream. Memory holds one piece (or one batch).
/// With disjoint windows (the default stride) the windows are those of the split read whole;
/// with a shorter stride, each piece's first window scores all its predictions, with less
/// context than it would have had.
fn eval_prepared(
    run: &Run,
    args: &EvalArgs,
    corpus: variorum_data::PreparedCorpus,
    device: &burn::prelude::Device,
) -> Result<ExitCode> {
    let lengths = if args.seq_len.is_empty() { vec![run.model.seq_len] } else { args.seq_len.clone() };
    check_lengths(&lengths, args.stride)?;
    for &len in &lengths {
        run.check_len(len)?;
    }
    let per_source = corpus.val_tokens();
    let cap = args.max_tokens.unwrap_or(usize::MAX);
    let total: u64 = per_source.iter().sum::<u64>().min(cap as u64);
    println!(
        "# {total} tokens of the validation split of {} ({} sources, read in pieces)",
        corpus.dir.display(),
        per_source.len()
    );
    let name = run_name(&args.runs[0]);
    let mut label = format!(
        "the validation split of {}",
        corpus.dir.canonicalize().unwrap_or_else(|_| corpus.dir.clone()).display()
    );
    if let Some(n) = args.max_tokens {
        label += &format!(", first {n} tokens");
    }
    let pieces = |len: usize| piece_lengths(&per_source, PREPARED_CHUNK.div_ceil(len) * len, cap);
    let m = &run.model;
    let rows = if m.has_memory() && run.config.train.batching == variorum_train::config::Batching::Documents {
        eval_prepared_documents(run, &name, std::sync::Arc::new(corpus), &lengths, cap, device)?
    } else if m.has_memory() {
        println!("# {STREAMS} streams per piece read segment by segment; memory = {}", run.config.model.memory.kind());
        let sized: Vec<(usize, u64)> =
            lengths.iter().map(|&len| (len, pieces(len).iter().map(|&n| stream_windows(n, len)).sum())).collect();
        with_and_without(&name, "memory", &sized, |len, carry, pb| {
            let mut mean = Mean::default();
            for piece in prepared_pieces(&corpus, len, cap) {
                let piece = piece?;
                mean.add(variorum_train::eval::stream_loss(m, &piece, len, STREAMS, carry, None, device, Some(pb)));
            }
            match mean.get() {
                (_, 0) => {
                    bail!("{} has no validation piece of {STREAMS} streams of {len} tokens", corpus.dir.display())
                }
                got => Ok(got),
            }
        })?
    } else if m.mask_token.is_some() {
        println!("# masked language model: loss on the hidden tokens of disjoint windows, piece by piece");
        println!("{:>8} {:>8} {:>10} {:>10} {:>12}", "seq_len", "stride", "hidden", "loss", "perplexity");
        let steps = lengths.iter().map(|&len| pieces(len).iter().map(|&n| masked_windows(n, len)).sum::<u64>());
        let pb = progress::bar(steps.sum(), &name);
        let mut rows = Vec::new();
        for &len in &lengths {
            pb.set_message(format!("{name} L={len}"));
            let mut mean = Mean::default();
            for piece in prepared_pieces(&corpus, len, cap) {
                let piece = piece?;
                mean.add(variorum_train::eval::masked_loss(m, &run.config.model, &piece, None, len, device, Some(&pb)));
            }
            let (loss, n) = mean.get();
            if n == 0 {
                bail!("{} has no validation window of {} tokens", corpus.dir.display(), len + 1);
            }
            pb.suspend(|| println!("{len:>8} {len:>8} {n:>10} {loss:>10.4} {:>12.3}", loss.exp()));
            rows.push(eval_row(len, Some(len), Some("masked"), n, loss));
        }
        pb.finish_and_clear();
        rows
    } else {
        return eval_prepared_plain(run, args, &corpus, &lengths, &label, device);
    };
    record(run, args, &label, rows);
    Ok(ExitCode::SUCCESS)
}

/// A plain decoder on a prepared corpus's validation split: sliding windows, piece by piece.
fn eval_prepared_plain(
    run: &Run,
    args: &EvalArgs,
    corpus: &variorum_data::PreparedCorpus,
    lengths: &[usize],
    label: &str,
    device: &burn::prelude::Device,
) -> Result<ExitCode> {
    let cap = args.max_tokens.unwrap_or(usize::MAX);
    println!("{}", table_header(run.tokenizer.unit()));
    let name = run_name(&args.runs[0]);
    let windows: u64 = lengths
        .iter()
        .map(|&len| {
            let chunk = PREPARED_CHUNK.div_ceil(len) * len;
            let stride = args.stride.unwrap_or(len);
            piece_lengths(&corpus.val_tokens(), chunk, cap)
                .iter()
                .map(|&n| sliding_windows(n, len, stride))
                .sum::<u64>()
        })
        .sum();
    let pb = progress::bar(windows, &name);
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for &len in lengths {
        pb.set_message(format!("{name} L={len}"));
        let stride = args.stride.unwrap_or(len);
        let mut mean = Mean::default();
        for piece in prepared_pieces(corpus, len, cap) {
            let piece = piece?;
            mean.add(variorum_train::eval::sliding_loss(&run.model, &piece, None, len, stride, device, Some(&pb)));
        }
        let (loss, count) = mean.get();
        if count == 0 {
            bail!("{} has no validation window of {} tokens", corpus.dir.display(), len + 1);
        }
        pb.suspend(|| println!("{}", table_row(len, stride, count, loss)));
        points.push((len as f64, loss));
        rows.push(eval_row(len, Some(stride), None, count, loss));
    }
    pb.finish_and_clear();
    record(run, args, label, rows);
    if points.len() > 1 {
        let path = args.plot.clone().unwrap_or_else(|| run.dir.join("eval.png"));
        draw(&[("validation loss".to_string(), points)], path)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A model with a memory per document on a prepared corpus: the held-out documents read as
/// document streams ([`variorum_data::PreparedDocumentStreams`], one pass, up to [`STREAMS`]
/// rows), each row's memory cleared where its next document starts; then the same segments
/// each from nothing. Batches are read as they are scored; `cap` stops the pass once it has
/// scored that many predictions.
fn eval_prepared_documents(
    run: &Run,
    name: &str,
    corpus: std::sync::Arc<variorum_data::PreparedCorpus>,
    lengths: &[usize],
    cap: usize,
    device: &burn::prelude::Device,
) -> Result<Vec<EvalRow>> {
    use variorum_data::{PreparedDocumentStreams, Split};
    check_document_lengths(run, lengths)?;
    let documents = corpus.documents(Split::Validation);
    let rows = (documents as usize).min(STREAMS);
    if rows == 0 {
        bail!("{} holds no validation document", corpus.dir.display());
    }
    let streams: Vec<PreparedDocumentStreams> = lengths
        .iter()
        .map(|&len| PreparedDocumentStreams::new(corpus.clone(), Split::Validation, len, rows))
        .collect::<Result<_, _>>()?;
    println!(
        "# {rows} rows of whole documents read segment by segment; each row's memory cleared at its documents' starts"
    );
    let sized: Vec<(usize, u64)> =
        lengths.iter().zip(&streams).map(|(&len, s)| (len, s.segments_per_epoch())).collect();
    with_and_without(name, "memory", &sized, |len, carry, pb| {
        let s = &streams[lengths.iter().position(|&l| l == len).expect("one of the lengths")];
        let mut scored = 0usize;
        let batches = (0..s.segments_per_epoch()).map_while(|i| {
            if scored >= cap {
                return None;
            }
            let b = s.pass_batch(i);
            if let Ok(b) = &b {
                scored += b.targets.iter().filter(|&&t| t != variorum_data::NO_TARGET).count();
            }
            Some(b)
        });
        Ok(variorum_train::eval::document_loss(&run.model, batches, carry, device, Some(pb))?)
    })
}

/// The header of the plain loss table (`eval_one`, `eval_prepared`).
fn table_header(unit: &str) -> String {
    format!(
        "{:>8} {:>8} {:>10} {:>10} {:>12} {:>12}",
        "seq_len",
        "stride",
        "tokens",
        "loss",
        "perplexity",
        format!("bits/{unit}")
    )
}

/// One row of it: the mean loss over `n` predictions, as perplexity and bits per unit too.
fn table_row(len: usize, stride: usize, n: usize, loss: f64) -> String {
    format!("{len:>8} {stride:>8} {n:>10} {loss:>10.4} {:>12.3} {:>12.4}", loss.exp(), loss / std::f64::consts::LN_2)
}
