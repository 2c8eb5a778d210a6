//! `variorum report RUN... [--out report.html]`: a run — or several side by side — on one
//! self-contained HTML page.
//!
//! The page holds the expanded config, the loss curves (train and validation, learning rate,
//! gradient norm; one colour per run, overlaid), the auxiliary losses, throughput and memory,
//! the sample, the attention pattern and the learned attention of each run, the evaluations
//! `variorum eval` recorded, and the views of what adaptive models learned (spans per head,
//! steps per token, the early-exit curve). Nothing is fetched: styles are inlined, line charts
//! are inline SVG and the grids (patterns, heatmaps) are PNG data URIs, so the file can be
//! mailed or archived as it is. `variorum train` writes `report.html` into the run directory at
//! each checkpoint and at the end.
//!
//! The HTML is laid out by a template (`report.html` beside this file, rendered by minijinja,
//! which escapes every string); this module only gathers the figures.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use base64::Engine;
use burn::prelude::*;
use plotters::style::{Palette, Palette99, RGBColor};
use serde::Serialize;

use crate::checkpoint::write_atomic;
use crate::config::ExperimentConfig;
use crate::eval_record::{self, EvalRow};
use crate::listing::{self, Status};
use crate::metrics::{self, Row};
use crate::run::Run;
use variorum_data::Tokenizer;
use variorum_model::DecoderLm;

/// The `id`s of the page's `<section>`s, in order. Every report has all of them; a section with
/// nothing to show says why.
pub const SECTIONS: &[&str] =
    &["summary", "config", "curves", "aux", "throughput", "sample", "pattern", "attention", "eval", "learned"];

/// The file `variorum train` writes into a run directory.
pub const REPORT_FILE: &str = "report.html";

const TEMPLATE: &str = include_str!("report.html");

/// Positions drawn in the pattern picture, and tokens in the learned heatmaps (at most).
const PATTERN_LEN: usize = 64;
const HEATMAP_LEN: usize = 32;
/// Layers of learned heatmaps shown (the first ones).
const HEATMAP_LAYERS: usize = 4;
/// Validation tokens read for the adaptive-depth views.
const STEPS_TOKENS: usize = 4096;
const EXIT_TOKENS: usize = 256;

/// What a training hands the report of its own run: the state in memory, where the files of
/// the run directory may be stale (a finished run resumed to more steps keeps its old
/// `model.bpk`, `summary.json` and `sample.txt` until it ends) or busy (its lock is held).
pub struct Live<'a> {
    /// Where the run stands now.
    pub status: Status,
    /// The model now, in inference mode.
    pub model: &'a DecoderLm,
    /// The run's config.
    pub config: &'a ExperimentConfig,
    /// The run's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The validation split's tokens.
    pub validation: &'a [u32],
    /// Parameters of the model.
    pub params: usize,
}

/// Renders and writes the report of `runs` to `out`, atomically.
pub fn write(runs: &[PathBuf], out: &Path, device: &Device) -> Result<()> {
    let html = render(runs, device)?;
    write_atomic(out, html.as_bytes())
}

/// The report of a training's own run `dir`, from its state in memory, written to
/// `dir/report.html`.
pub fn write_live(dir: &Path, live: &Live, device: &Device) -> Result<()> {
    let html = render_with(&[dir.to_path_buf()], Some(live), device)?;
    write_atomic(&dir.join(REPORT_FILE), html.as_bytes())
}

/// The report of `runs` (run directories) as one HTML document.
pub fn render(runs: &[PathBuf], device: &Device) -> Result<String> {
    render_with(runs, None, device)
}

fn render_with(runs: &[PathBuf], live: Option<&Live>, device: &Device) -> Result<String> {
    if runs.is_empty() {
        bail!("no run directory given");
    }
    for dir in runs {
        if !dir.join("config.toml").is_file() {
            bail!("{} is not a run directory (it has no config.toml)", dir.display());
        }
    }
    let names = names(runs);
    let mut pages = Vec::with_capacity(runs.len());
    let mut histories = Vec::with_capacity(runs.len());
    for (i, (dir, name)) in runs.iter().zip(&names).enumerate() {
        let (rows, note) = match read_metrics(dir) {
            Ok(rows) => (rows, None),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        };
        pages.push(run_page(dir, name, colour(i), note, live, device));
        histories.push((name.as_str(), colour(i), rows));
    }
    let title = if runs.len() == 1 {
        format!("variorum report: {}", names[0])
    } else {
        format!("variorum report: {} runs", runs.len())
    };
    let page = Page {
        title,
        sections: SECTIONS,
        curves: curves(&histories),
        aux: aux_curves(&histories),
        throughput: throughput_curve(&histories),
        runs: pages,
    };
    let mut env = minijinja::Environment::new();
    env.add_template("report.html", TEMPLATE).context("the report template does not parse")?;
    let html = env
        .get_template("report.html")
        .and_then(|t| t.render(minijinja::value::Serde(&page)))
        .map_err(|e| anyhow::anyhow!("cannot lay out the report: {e:#}"))?;
    Ok(html)
}

#[derive(Serialize)]
struct Page {
    title: String,
    sections: &'static [&'static str],
    curves: Vec<Figure>,
    aux: Vec<Figure>,
    throughput: Figure,
    runs: Vec<RunPage>,
}

/// A picture, or why there is none.
#[derive(Serialize, Default)]
struct Figure {
    title: String,
    /// An SVG document, inlined.
    svg: Option<String>,
    /// A PNG, base64.
    png: Option<String>,
    missing: Option<String>,
}

impl Figure {
    fn missing(title: &str, why: impl Into<String>) -> Self {
        Figure { title: title.into(), missing: Some(why.into()), ..Default::default() }
    }

    fn from_svg(title: &str, drawn: Result<Option<String>>) -> Self {
        match drawn {
            Ok(Some(svg)) => Figure { title: title.into(), svg: Some(svg), ..Default::default() },
            Ok(None) => Self::missing(title, "nothing to draw yet (or no font installed: Debian fonts-dejavu-core)"),
            Err(e) => Self::missing(title, format!("{e:#}")),
        }
    }

    /// A picture drawn by `draw` into a PNG file, read back and encoded.
    fn from_png(title: &str, draw: impl FnOnce(&Path) -> Result<()>) -> Self {
        let drawn = (|| -> Result<Vec<u8>> {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("figure.png");
            draw(&path)?;
            Ok(std::fs::read(&path)?)
        })();
        match drawn {
            Ok(bytes) => Figure {
                title: title.into(),
                png: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                ..Default::default()
            },
            Err(e) => Self::missing(title, format!("{e:#}")),
        }
    }
}

#[derive(Serialize, Default)]
struct RunPage {
    name: String,
    dir: String,
    /// CSS colour of the run's lines.
    colour: String,
    model: String,
    status: String,
    steps: String,
    best_val_loss: String,
    final_train_loss: String,
    tokens_per_sec: String,
    params: String,
    flops_per_token: String,
    /// Achieved training GFLOP/s (3 × forward FLOPs per token × tokens/s).
    gflops: String,
    train_time: String,
    device: String,
    peak_memory: String,
    /// Weights and AdamW's two moments, fp32.
    state_memory: String,
    config: String,
    metrics_note: Option<String>,
    sample: Option<String>,
    pattern: Figure,
    attention: Figure,
    /// The text the learned attention was read on.
    attention_text: Option<String>,
    head_stats: Vec<HeadRow>,
    eval: Vec<EvalLine>,
    eval_note: Option<String>,
    learned: Vec<Learned>,
}

#[derive(Serialize)]
struct HeadRow {
    layer: usize,
    head: usize,
    entropy: String,
    distance: String,
}

#[derive(Serialize)]
struct EvalLine {
    data: String,
    reading: String,
    seq_len: usize,
    stride: String,
    tokens: usize,
    loss: String,
    perplexity: String,
    weights: String,
    #[serde(skip)]
    value: f64,
}

/// One view of what an adaptive model learned.
#[derive(Serialize)]
struct Learned {
    title: String,
    lines: Vec<String>,
    figure: Option<Figure>,
}

/// Each run's name on the page: its directory's name, or its path when two share a name.
fn names(runs: &[PathBuf]) -> Vec<String> {
    let short: Vec<String> = runs
        .iter()
        .map(|d| d.file_name().map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into_owned()))
        .collect();
    short
        .iter()
        .zip(runs)
        .map(|(s, d)| if short.iter().filter(|t| *t == s).count() > 1 { d.display().to_string() } else { s.clone() })
        .collect()
}

fn colour(i: usize) -> RGBColor {
    let (r, g, b) = Palette99::COLORS[i % Palette99::COLORS.len()];
    RGBColor(r, g, b)
}

fn css(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

fn read_metrics(dir: &Path) -> Result<Vec<Row>> {
    let path = dir.join("metrics.csv");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    metrics::read(&path)
}

fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.filter(|v| v.is_finite()).map_or_else(|| "–".to_string(), |v| format!("{v:.decimals$}"))
}

fn run_page(
    dir: &Path,
    name: &str,
    colour: RGBColor,
    metrics_note: Option<String>,
    live: Option<&Live>,
    device: &Device,
) -> RunPage {
    let mut row = listing::row(dir);
    if let Some(live) = live {
        row.status = live.status;
    }
    // the files of the end of a run: stale while a resumed run goes on
    let ended = live.is_none_or(|l| l.status == Status::Finished);
    let summary: Option<serde_json::Value> = ended
        .then(|| std::fs::read_to_string(dir.join("summary.json")).ok())
        .flatten()
        .and_then(|s| serde_json::from_str(&s).ok());
    let number = |key: &str| summary.as_ref().and_then(|s| s.get(key)).and_then(|v| v.as_f64());
    let config = std::fs::read_to_string(dir.join("config.toml")).unwrap_or_else(|e| format!("# cannot read: {e}"));
    let parsed = ExperimentConfig::load(&dir.join("config.toml")).ok();
    let flops = parsed.as_ref().map(|c| c.model.flops_per_token() as f64).or_else(|| number("flops_per_token"));
    let tokens_per_sec = number("tokens_per_sec").or(row.tokens_per_sec);
    let params = number("params").or(live.map(|l| l.params as f64));
    let mut page = RunPage {
        name: name.to_string(),
        dir: dir.display().to_string(),
        colour: css(colour),
        model: row.model.clone(),
        status: serde_json::to_value(row.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        steps: format!("{} of {}", row.steps_done, row.steps),
        best_val_loss: fixed(row.best_val_loss, 4),
        final_train_loss: fixed(number("final_train_loss"), 4),
        tokens_per_sec: fixed(tokens_per_sec, 0),
        params: params.map_or_else(|| "–".into(), |p| format!("{:.3} M", p / 1e6)),
        state_memory: params.map_or_else(|| "–".into(), state_memory),
        flops_per_token: flops.map_or_else(|| "–".into(), |f| format!("{:.2} M forward", f / 1e6)),
        gflops: fixed(flops.zip(tokens_per_sec).map(|(f, t)| 3.0 * f * t / 1e9), 1),
        train_time: number("train_seconds").map_or_else(|| "–".into(), |s| format!("{s:.0} s")),
        device: summary.as_ref().and_then(|s| s.get("device")).and_then(|d| d.as_str()).unwrap_or("–").to_string(),
        peak_memory: number("peak_rss_mib").map_or_else(
            || "not recorded (written by train at the end of a run)".into(),
            |m| format!("{m:.0} MiB (peak resident set of the training process)"),
        ),
        config,
        metrics_note,
        sample: ended.then(|| std::fs::read_to_string(dir.join("sample.txt")).ok()).flatten(),
        ..Default::default()
    };
    match eval_record::read(dir) {
        Ok(rows) => page.eval = rows.iter().map(eval_line).collect(),
        Err(e) => page.eval_note = Some(format!("{e:#}")),
    }
    model_views(dir, &mut page, live, device);
    page
}

/// The fp32 weights and AdamW's two moments: 12 bytes per parameter.
fn state_memory(params: f64) -> String {
    format!("{:.1} MiB", params * 12.0 / (1 << 20) as f64)
}

fn eval_line(r: &EvalRow) -> EvalLine {
    EvalLine {
        data: r.data.clone(),
        reading: match (r.reading.clone().unwrap_or_else(|| "windows".into()), r.chrf) {
            (reading, Some(chrf)) => format!("{reading}: {chrf:.2}"),
            (reading, None) => reading,
        },
        seq_len: r.seq_len,
        stride: r.stride.map_or_else(|| "–".into(), |s| s.to_string()),
        tokens: r.tokens,
        loss: format!("{:.4}", r.loss),
        perplexity: format!("{:.3}", r.loss.exp()),
        weights: r.weights.clone().unwrap_or_else(|| "–".into()),
        value: r.loss,
    }
}

/// The views read from the model itself: its pattern, its learned attention, and what adaptive
/// models learned — from the training's model when it is `live`, else from the run's weights.
/// Each says why it is missing instead of failing the page.
fn model_views(dir: &Path, page: &mut RunPage, live: Option<&Live>, device: &Device) {
    let loaded;
    let (model, config, tokenizer, validation) = match live {
        Some(l) => (l.model, l.config, l.tokenizer, Ok(l.validation.to_vec())),
        None => match Run::load(dir, device) {
            Ok(run) => {
                loaded = run;
                (&loaded.model, &loaded.config, &loaded.tokenizer, loaded.validation_tokens())
            }
            Err(e) => {
                let why = format!("the model cannot be loaded: {e:#}");
                page.pattern = Figure::missing("pattern", why.clone());
                page.attention = Figure::missing("learned attention", why);
                return;
            }
        },
    };
    if page.params == "–" {
        let params = model.num_params() as f64;
        page.params = format!("{:.3} M", params / 1e6);
        page.state_memory = state_memory(params);
    }
    // the text read: the start of the validation split, or the sample when the corpus is gone
    let text: Result<Vec<u32>> = validation
        .and_then(|ids| if ids.len() < 2 { bail!("the validation split has {} tokens", ids.len()) } else { Ok(ids) });
    let text = text.or_else(|e| {
        let sample = page.sample.as_deref().unwrap_or_default();
        let ids = tokenizer.encode(sample).unwrap_or_default();
        if ids.len() >= 2 { Ok(ids) } else { Err(e) }
    });
    let ids = match text {
        Ok(ids) => ids,
        Err(e) => {
            let why = format!("no text to read the model on: {e:#}");
            page.pattern = Figure::missing("pattern", why.clone());
            page.attention = Figure::missing("learned attention", why);
            return;
        }
    };
    let unread = match (&config.data.graph, config.model.is_encoder_decoder()) {
        (Some(_), _) => Some("a graph run (data.graph) reads each example with its edges, not a stretch of text"),
        (None, true) => Some("an encoder–decoder reads a target beside its source, not a stretch of text"),
        (None, false) => None,
    };
    if let Some(why) = unread {
        // these pictures read a stretch of text
        let why = why.to_string();
        page.pattern = Figure::missing("pattern", why.clone());
        page.attention = Figure::missing("learned attention", why);
        return;
    }
    let cfg = &config.model;
    let kind = cfg.attention.kind().to_string();
    // a model conditioned on example tags reads this text under tag 0, as `variorum attention` does
    let untagged = if cfg.attention.tags().is_some() { ", read untagged (tag 0)" } else { "" };

    let len = PATTERN_LEN.min(cfg.seq_len).min(ids.len());
    let title = format!("pattern of {kind}, layer 0, on the first {len} validation tokens{untagged}");
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new(ids[..len].iter().map(|&t| t as i64).collect(), [1, len]), device);
    page.pattern = match crate::pictures::pattern::read(model, cfg, tokens, 0, None) {
        Ok(p) => Figure::from_png(&title, |path| crate::pictures::pattern::draw(&p, path)),
        Err(e) => Figure::missing(&title, format!("{e:#}")),
    };

    let len = HEATMAP_LEN.min(cfg.seq_len).min(ids.len());
    let title = format!("learned attention of {kind} on {len} validation tokens{untagged}");
    let labels = crate::pictures::heatmap::token_labels(tokenizer, &ids[..len]);
    match crate::pictures::heatmap::read(model, cfg, &ids[..len], labels, None, None, device) {
        Ok(mut maps) => {
            page.head_stats = maps
                .stats()
                .into_iter()
                .map(|(layer, head, s)| HeadRow {
                    layer,
                    head,
                    entropy: format!("{:.3}", s.entropy),
                    distance: format!("{:.2}", s.mean_distance),
                })
                .collect();
            let shown = maps.layers.len().min(HEATMAP_LAYERS);
            let title = if shown < maps.layers.len() {
                format!("{title} (layers {} of {}; every head in the table)", shown, maps.layers.len())
            } else {
                title
            };
            maps.layers.truncate(shown);
            page.attention = Figure::from_png(&title, |path| crate::pictures::heatmap::draw(&maps, path));
            page.attention_text = Some(tokenizer.decode(&ids[..len]));
        }
        Err(e) => page.attention = Figure::missing(&title, format!("{e:#}")),
    }
    page.learned = learned(model, config, dir, &ids, &page.eval, device);
}

/// Spans per head (adaptive span), steps per token (ACT), the exit curve (early exits), and what
/// a memory is worth (from the recorded evaluations with and without it).
fn learned(
    model: &DecoderLm,
    config: &ExperimentConfig,
    dir: &Path,
    ids: &[u32],
    eval: &[EvalLine],
    device: &Device,
) -> Vec<Learned> {
    let mut views = Vec::new();
    // the recorded evaluations "with X" and "without X", side by side
    let worth = |what: &str, the: &str| -> Vec<String> {
        let mut lines: Vec<String> = eval
            .iter()
            .filter(|w| w.reading == format!("with {what}"))
            .filter_map(|w| {
                // the same weights: a later evaluation of one reading alone replaces that row only
                let without = eval.iter().find(|o| {
                    o.reading == format!("without {what}")
                        && o.seq_len == w.seq_len
                        && o.data == w.data
                        && o.weights == w.weights
                })?;
                Some(format!(
                    "segments of {}: loss {} with {the}, {} without, gain {:.4} nats/token ({})",
                    w.seq_len,
                    w.loss,
                    without.loss,
                    without.value - w.value,
                    w.data
                ))
            })
            .collect();
        if lines.is_empty() {
            lines.push(format!(
                "not measured yet: `variorum eval {} --seq-len …` reads the validation split with and without {the}",
                dir.display()
            ));
        }
        lines
    };
    if let Some(l) = &config.model.long_term_memory {
        // its evaluation carries any model.memory both times and measures the retrieval
        views.push(Learned {
            title: format!("what retrieval is worth (model.long_term_memory, k = {})", l.k),
            lines: worth("retrieval", "the retrieved tokens"),
            figure: None,
        });
    } else if model.has_memory() {
        let kind = config.model.memory.kind();
        views.push(Learned {
            title: format!("what the memory is worth (model.memory.kind = \"{kind}\")"),
            lines: worth("memory", "the memory"),
            figure: None,
        });
    }
    // what each layer's attention says it learned (adaptive span: its spans), one view per title
    let mut layers: Vec<(String, Vec<String>)> = Vec::new();
    for (i, block) in model.blocks.iter().enumerate() {
        let Some(l) = block.attn.learned() else { continue };
        let line = format!("layer {i}: {}", l.line);
        match layers.iter_mut().find(|(title, _)| *title == l.title) {
            Some((_, lines)) => lines.push(line),
            None => layers.push((l.title, vec![line])),
        }
    }
    views.extend(layers.into_iter().map(|(title, lines)| Learned { title, lines, figure: None }));
    let read = &ids[..ids.len().min(STEPS_TOKENS)];
    // (text windows: not what a graph run reads)
    let steps = match config.data.graph {
        None => crate::eval::steps_per_token(model, read, model.seq_len, device),
        Some(_) => None,
    };
    if let Some((mean, shares)) = steps {
        views.push(Learned {
            title: format!("adaptive computation time: steps per token ({} validation tokens)", read.len()),
            lines: vec![crate::eval::format_steps(mean, &shares)],
            figure: None,
        });
    }
    if model.exits.is_some() {
        use crate::early_exit::{Confidence, sweep};
        // decoding scores whole windows of seq_len + 1 tokens
        let read = &ids[..ids.len().min(EXIT_TOKENS.max(model.seq_len + 1))];
        let points = sweep(model, read, Confidence::SoftmaxResponse, &[0.9, 0.7, 0.5, 0.3, 0.1, 0.0], device);
        let scored = points.first().map_or(0, |p| p.tokens.len());
        let title = format!("early exit: loss against blocks used (softmax response, {scored} validation tokens)");
        if scored == 0 {
            let why = format!("{} validation tokens are not one window of {} to decode", read.len(), model.seq_len + 1);
            views.push(Learned { title: title.clone(), lines: Vec::new(), figure: Some(Figure::missing(&title, why)) });
        } else {
            let curve: Vec<(f64, f64)> = points.iter().map(|p| (p.blocks(), p.loss())).collect();
            let lines = points
                .iter()
                .map(|p| format!("threshold {:.1}: {:.2} blocks, loss {:.4}", p.threshold, p.blocks(), p.loss()))
                .collect();
            let svg = crate::pictures::plot::lines_svg(
                &[("exits", curve, RGBColor(30, 60, 140), true)],
                (720, 420),
                &title,
                "mean blocks per token",
                "loss (nats/token)",
            );
            views.push(Learned { title: title.clone(), lines, figure: Some(Figure::from_svg(&title, svg)) });
        }
    }
    views
}

/// What an adaptive model learned, as text (`variorum inspect RUN`): each view's title and
/// lines, read on the run's validation split.
pub fn learned_text(run: &Run, device: &Device) -> Result<Vec<(String, Vec<String>)>> {
    let ids = run.validation_tokens()?;
    let eval: Vec<EvalLine> = eval_record::read(&run.dir).unwrap_or_default().iter().map(eval_line).collect();
    let views = learned(&run.model, &run.config, &run.dir, &ids, &eval, device);
    Ok(views.into_iter().map(|v| (v.title, v.lines)).collect())
}

type History<'a> = (&'a str, RGBColor, Vec<Row>);

fn series(histories: &[History], value: impl Fn(&Row) -> Option<f64>) -> Vec<(String, Vec<(f64, f64)>, RGBColor)> {
    histories
        .iter()
        .map(|(name, c, rows)| {
            let points =
                rows.iter().filter_map(|r| Some((r.step as f64, value(r).filter(|v| v.is_finite())?))).collect();
            (name.to_string(), points, *c)
        })
        .collect()
}

fn chart(title: &str, y: &str, lines: &[(String, Vec<(f64, f64)>, RGBColor, bool)]) -> Figure {
    let borrowed: Vec<(&str, Vec<(f64, f64)>, RGBColor, bool)> =
        lines.iter().map(|(n, p, c, m)| (n.as_str(), p.clone(), *c, *m)).collect();
    Figure::from_svg(title, crate::pictures::plot::lines_svg(&borrowed, (900, 480), title, "step", y))
}

/// Loss (train thin, validation marked), learning rate and gradient norm, every run overlaid.
fn curves(histories: &[History]) -> Vec<Figure> {
    let several = histories.len() > 1;
    let label = |name: &str, what: &str| if several { format!("{name} {what}") } else { what.to_string() };
    let mut loss = Vec::new();
    for (name, points, c) in series(histories, |r| r.train_loss) {
        loss.push((label(&name, "train"), points, c, false));
    }
    for (name, points, c) in series(histories, |r| r.val_loss) {
        loss.push((label(&name, "validation"), points, c, true));
    }
    let plain = |what: &str, v: fn(&Row) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>, RGBColor, bool)> {
        series(histories, v).into_iter().map(|(n, p, c)| (label(&n, what), p, c, false)).collect()
    };
    vec![
        chart("loss", "loss (nats/token)", &loss),
        chart("learning rate", "learning rate", &plain("learning rate", |r| Some(r.lr))),
        chart("gradient norm", "global gradient norm (before clipping)", &plain("gradient norm", |r| r.grad_norm)),
    ]
}

/// One chart per auxiliary loss, a line per run that has it.
fn aux_curves(histories: &[History]) -> Vec<Figure> {
    let mut names: Vec<String> =
        histories.iter().flat_map(|h| h.2.iter().flat_map(|r| r.aux.iter().map(|a| a.0.clone()))).collect();
    names.sort();
    names.dedup();
    names
        .iter()
        .map(|aux| {
            let lines: Vec<_> = series(histories, |r| r.aux.iter().find(|a| &a.0 == aux).map(|a| a.1))
                .into_iter()
                .filter(|s| !s.1.is_empty())
                .map(|(n, p, c)| (n, p, c, false))
                .collect();
            chart(&format!("auxiliary loss: {aux}"), "weighted loss, mean over the interval", &lines)
        })
        .collect()
}

/// Training tokens per second over the run (the first interval, with its warm-up, left out).
fn throughput_curve(histories: &[History]) -> Figure {
    let lines: Vec<_> = histories
        .iter()
        .map(|(name, c, rows)| {
            let points = rows.iter().skip(1).filter_map(|r| Some((r.step as f64, r.tokens_per_sec?))).collect();
            (name.to_string(), points, *c, false)
        })
        .collect();
    chart("training throughput", "tokens/s", &lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_named_by_directory_and_by_path_when_names_clash() {
        let runs = [PathBuf::from("a/x"), PathBuf::from("b/x"), PathBuf::from("c/y")];
        assert_eq!(names(&runs), ["a/x", "b/x", "y"]);
    }

    /// A run directory with an untrained adaptive-span model, two metrics rows (one with an
    /// auxiliary loss), a recorded evaluation and a sample that looks like markup.
    fn hand_made_run(dir: &Path, device: &Device) -> PathBuf {
        use variorum_data::{Tokenizer, TokenizerConfig};
        let text = "the cat sat on a mat; a dog ate the <hat>.\n".repeat(20);
        let corpus = dir.join("text.txt");
        std::fs::write(&corpus, &text).unwrap();
        let toml = format!(
            "[model]\nd_model = 16\nn_layers = 2\nseq_len = 16\n[model.attention]\nkind = \"adaptive-span\"\nn_heads = 2\nmax_span = 16\n[data]\npath = \"{}\"\n",
            corpus.display()
        );
        let mut cfg = crate::config::ExperimentConfig::parse(&toml, false).unwrap();
        let tokenizer = Tokenizer::train(&TokenizerConfig::Char, &text).unwrap();
        cfg.model.resolve(tokenizer.vocab_size()).unwrap();
        let run = dir.join("span-run");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("config.toml"), cfg.to_toml()).unwrap();
        tokenizer.save(&run.join("tokenizer.json")).unwrap();
        cfg.model.init(device).save_file(run.join("model.bpk")).unwrap();
        std::fs::write(
            run.join("metrics.csv"),
            format!("{}\n10,3.1,,1e-3,0.9,1000,1,span=2e-3\n20,2.9,3.0,1e-3,0.8,1100,2,span=1e-3\n", metrics::HEADER),
        )
        .unwrap();
        std::fs::write(run.join("sample.txt"), "<script>alert(1)</script>").unwrap();
        let row = EvalRow {
            data: "the validation split".into(),
            seq_len: 16,
            stride: Some(16),
            reading: None,
            tokens: 99,
            loss: 2.5,
            chrf: None,
            weights: Some("model.bpk".into()),
        };
        eval_record::record(&run, &[row]).unwrap();
        run
    }

    #[test]
    fn a_run_has_every_section_with_its_own_views_and_its_text_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let device = Device::flex();
        let run = hand_made_run(dir.path(), &device);
        let html = render(&[run], &device).unwrap();
        let mut at = 0;
        for id in SECTIONS {
            let found = html[at..]
                .find(&format!("<section id=\"{id}\">"))
                .unwrap_or_else(|| panic!("no section {id} after byte {at}"));
            at += found;
        }
        // the sample is text, never markup
        let sample = html.find("alert(1)").map(|i| &html[i.saturating_sub(40)..i + 40]);
        assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;") && !html.contains("<script"), "{sample:?}");
        // the adaptive span's own view, its auxiliary loss, the recorded evaluation
        assert!(html.contains("learned span per head"), "no span view");
        assert!(html.contains("auxiliary loss: span"), "no auxiliary-loss chart");
        assert!(
            html.contains(
                "<td>16</td><td>16</td><td>99</td><td>2.5000</td><td>12.182</td><td class=\"text\">model.bpk</td>"
            ),
            "no evaluation row"
        );
        // the pattern and the heatmaps are pictures, the curves inline SVG
        assert_eq!(html.matches("src=\"data:image/png;base64,").count(), 2, "pattern and heatmap PNGs");
        if crate::pictures::plot::has_font() {
            assert!(
                html.matches("<svg").count() >= 4,
                "loss, learning rate, gradient norm, span and throughput charts"
            );
        }
    }

    #[test]
    fn a_directory_that_is_not_a_run_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let e = render(&[dir.path().to_path_buf()], &Device::flex()).unwrap_err().to_string();
        assert!(e.contains("not a run directory") && e.contains(&dir.path().display().to_string()), "{e}");
        assert!(render(&[], &Device::flex()).is_err());
    }
}
