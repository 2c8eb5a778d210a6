//! `variorum bench-attention`: each config's attention layer alone, forward + backward time and
//! peak memory against the sequence length, and decoding cost per token against the context.
//! Every point runs in a child process (this binary with `--point`), so its peak memory is its
//! own and running out of memory ends the child, which is reported, not the benchmark.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use plotters::style::{Palette, Palette99, RGBColor};
use variorum_train::ExperimentConfig;
use variorum_train::attention_bench::{self, AttentionPoint};
use variorum_train::progress;

use crate::common::at_least;
use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct BenchAttentionArgs {
    /// Experiment configs (only `model.attention` and `model.position` are used).
    pub configs: Vec<PathBuf>,
    /// Sequence lengths of the forward + backward, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096,8192,16384")]
    pub lengths: Vec<usize>,
    /// Context lengths after which one token is decoded, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    pub contexts: Vec<usize>,
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    /// Timed forward + backward runs per point (after one untimed).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Decoded tokens timed per context.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Directory for the tables (markdown, JSON) and plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// With the CPU kernels off: each kind's composed path (what a kernel gives is the
    /// difference).
    #[arg(long)]
    pub composed: bool,
    /// Measure one point ("train:LEN", "need:LEN": its memory with freed pages handed back, or
    /// "generate:CONTEXT") in this process.
    #[arg(long, hide = true)]
    pub point: Option<String>,
    /// Put a seeded random graph on the mask, each position reading this many others, for
    /// the kinds that read a graph (`graph`, `full`; data.graph in training).
    #[arg(long)]
    pub graph_degree: Option<usize>,
}

/// A point's outcome: measured, or why not.
type Outcome = std::result::Result<AttentionPoint, String>;

pub fn run(args: BenchAttentionArgs) -> Result<ExitCode> {
    for &n in &args.lengths {
        at_least("--lengths", n, 1)?;
    }
    for &n in &args.contexts {
        at_least("--contexts", n, 1)?;
    }
    at_least("--d-model", args.d_model, 1)?;
    at_least("--reps", args.reps, 1)?;
    at_least("--tokens", args.tokens, 1)?;
    if args.configs.is_empty() {
        bail!("give at least one config (its [model.attention] is measured)");
    }
    let mut kinds = Vec::new();
    for path in &args.configs {
        let cfg = ExperimentConfig::load(path)?;
        cfg.model
            .attention
            .validate(args.d_model)
            .with_context(|| format!("{} at --d-model {}", path.display(), args.d_model))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        kinds.push((name, path.clone(), cfg));
    }
    // the same file name in two families (configs/attention/x, configs/masked/x): name both rows
    // by family too
    let stems: Vec<String> = kinds.iter().map(|k| k.0.clone()).collect();
    for (name, path, _) in &mut kinds {
        if stems.iter().filter(|s| *s == name).count() > 1
            && let Some(family) = path.parent().and_then(|p| p.file_name())
        {
            *name = format!("{}/{name}", family.to_string_lossy());
        }
    }
    if let Some(point) = &args.point {
        return measure_here(&kinds[0].2, point, &args);
    }
    let path = if args.composed { ", kernels off (composed ops)" } else { "" };
    println!("# one attention layer, batch 1, d_model {}, device {}{path}", args.d_model, args.device.device);
    let mut train = Vec::new();
    let mut generate = Vec::new();
    // one step per point, here in the parent only: a child (`--point`) returned above, and its
    // stderr is a pipe, where no bar draws
    let pb = progress::bar((kinds.len() * (args.lengths.len() + args.contexts.len())) as u64, "");
    for (name, path, cfg) in &kinds {
        for &len in &args.lengths {
            pb.set_message(format!("{name} train L = {len}"));
            let o = if let Some(why) = too_big(cfg, args.d_model, len) {
                Err(why)
            } else {
                // and what its tensors need, in a process that hands freed pages back at once; where
                // that measurement fails, the line says why
                let needed = match child(path, &format!("need:{len}"), &args) {
                    Ok(p) => p.peak_mib,
                    Err(why) => {
                        pb.suspend(|| println!("{name:<22} needs     L = {len:>6}  not measured: {why}"));
                        None
                    }
                };
                child(path, &format!("train:{len}"), &args).map(|p| AttentionPoint { needed_mib: needed, ..p })
            };
            pb.suspend(|| println!("{name:<22} train     L = {len:>6}  {}", describe(&o, 1e3, "ms")));
            pb.inc(1);
            train.push((name.clone(), len, o));
        }
        for &ctx in &args.contexts {
            pb.set_message(format!("{name} generate context {ctx}"));
            let o = if causal(cfg) && cfg.model.attention.capabilities().incremental {
                child(path, &format!("generate:{ctx}"), &args)
            } else {
                Err("does not generate (bidirectional)".into())
            };
            pb.suspend(|| println!("{name:<22} generate  context {ctx:>6}  {}", describe(&o, 1e3, "ms/token")));
            pb.inc(1);
            generate.push((name.clone(), ctx, o));
        }
    }
    pb.finish_and_clear();
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        write_outputs(dir, &kinds.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), &train, &generate, &args)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the layer runs causally as its config trains it: a next-token model (and a kind with a
/// causal form); a masked LM runs it bidirectionally.
fn causal(cfg: &ExperimentConfig) -> bool {
    cfg.model.objective.is_causal() && cfg.model.attention.capabilities().causal
}

/// Full attention's score matrices at `len` when they cannot fit in the memory left.
fn too_big(cfg: &ExperimentConfig, d_model: usize, len: usize) -> Option<String> {
    let bytes = attention_bench::score_bytes(&cfg.model.attention, d_model, len)? as f64 / (1 << 20) as f64;
    let available = attention_bench::available_mib()?;
    (bytes > 0.8 * available).then(|| {
        format!(
            "out of memory: its score matrices need ≈ {:.1} GiB, {:.1} GiB available",
            bytes / 1024.0,
            available / 1024.0
        )
    })
}

fn measure_here(cfg: &ExperimentConfig, point: &str, args: &BenchAttentionArgs) -> Result<ExitCode> {
    let (device, _) = args.device.select()?;
    let (mode, n) = point.split_once(':').context("--point is mode:length")?;
    let n: usize = n.parse().context("--point length")?;
    let (attn, pos) = (&cfg.model.attention, &cfg.model.position);
    let measure = || match mode {
        "train" | "need" => {
            // a `need` process hands freed pages back at once (set in main): one step measures it
            let reps = if mode == "need" { 1 } else { args.reps.max(1) };
            let graph =
                args.graph_degree.filter(|_| attn.capabilities().graph).map(|d| attention_bench::random_graph(n, d, 0));
            Ok(attention_bench::training(attn, pos, args.d_model, n, reps, causal(cfg), graph, &device))
        }
        "generate" => Ok(attention_bench::generation(attn, pos, args.d_model, n, args.tokens.max(1), &device)),
        other => bail!("--point mode {other:?} is not train, need or generate"),
    };
    let mut p = if args.composed { variorum_kernels::without_kernels(measure)? } else { measure()? };
    // on a GPU, what Burn's pools hold on it after the runs: their peak, as pools keep pages
    if ["wgpu", "cuda"].contains(&args.device.device.as_str()) {
        p.device_mib = device.memory_pool_usage().map(|u| u.bytes_reserved as f64 / (1 << 20) as f64);
    }
    println!("{}", serde_json::to_string(&p)?);
    Ok(ExitCode::SUCCESS)
}

fn child(config: &Path, point: &str, args: &BenchAttentionArgs) -> Outcome {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let out = Command::new(exe)
        .arg("bench-attention")
        .arg(config)
        .args(["--point", point, "--device", &args.device.device])
        .args(["--d-model", &args.d_model.to_string(), "--reps", &args.reps.to_string()])
        .args(["--tokens", &args.tokens.to_string()])
        .args(args.composed.then_some("--composed"))
        .args(args.graph_degree.map(|d| format!("--graph-degree={d}")))
        .output()
        .map_err(|e| format!("cannot start a measurement: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        // killed by a signal (the kernel's OOM killer sends SIGKILL), or an allocation failure
        return Err(match out.status.code() {
            None => "out of memory (the measurement was killed)".into(),
            Some(_) if last.contains("memory allocation") || last.contains("alloc") => "out of memory".into(),
            Some(c) => format!("failed (exit {c}): {last}"),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("unreadable measurement {line:?}: {e}"))
}

fn describe(o: &Outcome, scale: f64, unit: &str) -> String {
    match o {
        Ok(p) => format!(
            "{:>10.2} {unit}  peak {}{}{}",
            p.seconds * scale,
            p.peak_mib.map_or("n/a".into(), |m| format!("{m:.0} MiB")),
            p.needed_mib.map_or(String::new(), |m| format!(" (needs {m:.0})")),
            p.device_mib.map_or(String::new(), |m| format!(", device {m:.0} MiB"))
        ),
        Err(why) => why.clone(),
    }
}

type Rows = [(String, usize, Outcome)];

fn write_outputs(dir: &Path, names: &[String], train: &Rows, generate: &Rows, args: &BenchAttentionArgs) -> Result<()> {
    let cell = |rows: &Rows, name: &str, n: usize, f: &dyn Fn(&AttentionPoint) -> String| {
        rows.iter()
            .find(|r| r.0 == name && r.1 == n)
            .map(|r| match &r.2 {
                Ok(p) => f(p),
                Err(why) if why.starts_with("out of memory") => "OOM".into(),
                Err(why) if why.starts_with("does not generate") => "—".into(),
                Err(_) => "failed".into(),
            })
            .unwrap_or_default()
    };
    let path = if args.composed { ", CPU kernels off (`--composed`)" } else { "" };
    let graph = match args.graph_degree {
        Some(d) => format!(", a random graph of {d} reads per position for the kinds that read one"),
        None => String::new(),
    };
    let mut md = format!(
        "One attention layer, batch 1, d_model {}, causal (bidirectional for masked-LM configs), device {}{path}{graph} (`variorum bench-attention`).\n\n",
        args.d_model, args.device.device
    );
    let header = |first: &str, ns: &[usize]| {
        let mut s = format!("| {first} |");
        for n in ns {
            s += &format!(" {n} |");
        }
        s += "\n|---|";
        s += &"---|".repeat(ns.len());
        s + "\n"
    };
    let table = |title: &str, rows: &Rows, ns: &[usize], f: &dyn Fn(&AttentionPoint) -> String| {
        let mut s = format!("### {title}\n\n") + &header("kind", ns);
        for name in names {
            s += &format!("| {name} |");
            for &n in ns {
                s += &format!(" {} |", cell(rows, name, n, f));
            }
            s += "\n";
        }
        s + "\n"
    };
    let mib = |p: &AttentionPoint| p.peak_mib.map_or("n/a".into(), |m| format!("{m:.0}"));
    md += &table("Forward + backward, ms (median)", train, &args.lengths, &|p| format!("{:.1}", p.seconds * 1e3));
    md += &table("Forward + backward, peak memory above the start, MiB", train, &args.lengths, &mib);
    md += "The peak above is resident memory as training runs it, where the allocator keeps freed \
           pages for reuse (pages kept from earlier tensors of other sizes count). Below, the same \
           layer in a process that hands freed pages back at once: what its tensors need.\n\n";
    let needed = |p: &AttentionPoint| p.needed_mib.map_or("n/a".into(), |m| format!("{m:.0}"));
    md += &table("Forward + backward, memory needed (freed pages returned), MiB", train, &args.lengths, &needed);
    md += &table("Decoding one token after the context, ms (median)", generate, &args.contexts, &|p| {
        format!("{:.3}", p.seconds * 1e3)
    });
    std::fs::write(dir.join("attention-bench.md"), md)?;
    let json: Vec<_> = train
        .iter()
        .map(|r| ("train", r))
        .chain(generate.iter().map(|r| ("generate", r)))
        .map(|(mode, (name, n, o))| {
            serde_json::json!({"kind": name, "mode": mode, "n": n,
                "seconds": o.as_ref().ok().map(|p| p.seconds),
                "peak_mib": o.as_ref().ok().and_then(|p| p.peak_mib),
                "needed_mib": o.as_ref().ok().and_then(|p| p.needed_mib),
                "device_mib": o.as_ref().ok().and_then(|p| p.device_mib),
                "error": o.as_ref().err()})
        })
        .collect();
    std::fs::write(dir.join("attention-bench.json"), serde_json::to_string_pretty(&json)?)?;
    let series = |rows: &Rows, f: &dyn Fn(&AttentionPoint) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        names
            .iter()
            .map(|name| {
                let pts = rows
                    .iter()
                    .filter(|r| &r.0 == name)
                    .filter_map(|r| Some((r.1 as f64, f(r.2.as_ref().ok()?)?)))
                    .collect();
                (name.clone(), pts)
            })
            .collect()
    };
    let draw = |file: &str, s: Vec<(String, Vec<(f64, f64)>)>, title: &str, x: &str, y: &str| -> Result<()> {
        let coloured: Vec<(&str, Vec<(f64, f64)>, RGBColor, bool)> = s
            .iter()
            .enumerate()
            .map(|(k, (n, p))| {
                let (r, g, b) = Palette99::COLORS[k % Palette99::COLORS.len()];
                (n.as_str(), p.clone(), RGBColor(r, g, b), true)
            })
            .collect();
        variorum_train::pictures::plot::log_lines(&coloured, &dir.join(file), title, x, y)?;
        Ok(())
    };
    draw(
        "attention-train-time.png",
        series(train, &|p| Some(p.seconds * 1e3)),
        "forward + backward time",
        "sequence length",
        "ms",
    )?;
    draw(
        "attention-train-memory.png",
        series(train, &|p| p.peak_mib.filter(|m| *m > 0.0)),
        "forward + backward peak memory",
        "sequence length",
        "MiB",
    )?;
    draw(
        "attention-train-needed.png",
        series(train, &|p| p.needed_mib.filter(|m| *m > 0.0)),
        "forward + backward memory needed (freed pages returned)",
        "sequence length",
        "MiB",
    )?;
    draw(
        "attention-generation.png",
        series(generate, &|p| Some(p.seconds * 1e3)),
        "decoding cost per token",
        "context length",
        "ms / token",
    )?;
    println!("# wrote {}", dir.join("attention-bench.md").display());
    Ok(())
}
