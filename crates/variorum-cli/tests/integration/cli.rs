//! The binary as a user meets it: commands, run directories, and mistakes reported in one line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn variorum(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_variorum")).args(args).current_dir(cwd).output().expect("run variorum")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write_corpus(dir: &Path) -> PathBuf {
    let line = "Now is the winter of our discontent made glorious summer by this sun of York;\n";
    let path = dir.join("text.txt");
    std::fs::write(&path, line.repeat(120)).unwrap();
    path
}

fn write_config(dir: &Path, extra_model: &str) -> PathBuf {
    let corpus = write_corpus(dir);
    let cfg = format!(
        "[model]\nd_model = 32\nn_layers = 1\nseq_len = 16\n{extra_model}\n[model.attention]\nkind = \"full\"\nn_heads = 2\n\n[data]\npath = \"{}\"\n\n[train]\nsteps = 4\nbatch_size = 2\neval_interval = 2\neval_batches = 1\nlog_interval = 2\nsample_tokens = 10\n",
        corpus.display()
    );
    let path = dir.join("tiny.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

/// A user mistake: non-zero exit, one line on stderr, no panic or backtrace.
fn assert_clean_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "should fail: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked") && !err.contains("internal error") && !err.contains("RUST_BACKTRACE"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
}

#[test]
fn train_writes_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let out = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--device", "cpu"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    for f in [
        "config.toml",
        "metrics.csv",
        "loss.png",
        "sample.txt",
        "summary.json",
        "model.bpk",
        "tokenizer.json",
        "report.html",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let png = std::fs::read(out.join("loss.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    // continuing a finished run to a later step
    let o = variorum(
        &["train", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--resume", "--max-steps", "6"],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("done: 6 steps"));

    // generation and scoring from the run
    let run = out.to_str().unwrap();
    let o =
        variorum(&["generate", run, "--prompt", "Now is", "--max-new-tokens", "12", "--temperature", "0"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.starts_with("Now is") && text.trim_end().chars().count() == 6 + 12, "{text:?}");
    assert!(stderr(&o).contains("tokens/s"));
    let o = variorum(&["generate", run, "--prompt", "Now is", "--max-new-tokens", "5", "--beams", "3"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("beam search, 3 beams"));
    let o = variorum(&["score", run, "--prompt", "Now is the winter", "--format", "json"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), "Now is the winter".len() - 1);
    assert!(v["total_logprob"].as_f64().unwrap() < 0.0);
    assert_clean_error(&variorum(&["generate", run, "--prompt", ""], tmp.path()), "empty");
    assert_clean_error(&variorum(&["generate", run, "--prompt", "Zebra"], tmp.path()), "'Z'");
    assert_clean_error(&variorum(&["score", "no-such-run", "--prompt", "Now"], tmp.path()), "no-such-run");

    // export, then fine-tune a new run from the exported file
    let st = tmp.path().join("w.safetensors");
    let o = variorum(&["export", run, "--out", st.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "token_embedding.weight"));
    let run2 = tmp.path().join("run2");
    let o = variorum(
        &[
            "train",
            cfg.to_str().unwrap(),
            "--out",
            run2.to_str().unwrap(),
            "--init-from",
            st.to_str().unwrap(),
            "--max-steps",
            "2",
        ],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("tensors loaded, 0 new"), "{}", stderr(&o));
    let o = variorum(
        &["train", cfg.to_str().unwrap(), "--out", run2.to_str().unwrap(), "--init-from", run, "--resume"],
        tmp.path(),
    );
    assert_clean_error(&o, "--init-from");

    // evaluation at several context lengths, with a plot
    let o = variorum(&["eval", run, "--seq-len", "8,16", "--stride", "4"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(table.lines().filter(|l| !l.starts_with('#') && l.contains("      4 ")).count(), 2, "{table}");
    assert!(out.join("eval.png").exists());
    // the evaluations are kept for the run's report, which `variorum report` rewrites; two runs
    // share one page
    let recorded: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    assert_eq!(recorded.as_array().map(Vec::len), Some(2), "{recorded}");
    let o = variorum(&["report", run], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<section id=\"eval\">") && html.contains("<td>8</td><td>4</td>"), "the eval rows");
    let both = tmp.path().join("both.html");
    let o = variorum(&["report", run, run2.to_str().unwrap(), "--out", both.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&both).unwrap().contains("run2"));
    assert_clean_error(&variorum(&["report", "no-such-run"], tmp.path()), "no-such-run");
    assert_clean_error(&variorum(&["eval", run, "--seq-len", "64"], tmp.path()), "positions a learned table encodes");
    assert_clean_error(&variorum(&["eval", run, "--stride", "99"], tmp.path()), "--stride 99");

    // numeric flags out of range: one line naming the flag
    let c = cfg.to_str().unwrap();
    for (args, flag) in [
        (&["generate", run, "--prompt", "Now", "--beams", "0"][..], "--beams 0"),
        (&["generate", run, "--prompt", "Now", "--max-new-tokens", "0"][..], "--max-new-tokens 0"),
        (&["generate", run, "--prompt", "Now", "--temperature=-1"][..], "--temperature -1"),
        (&["generate", run, "--prompt", "Now", "--top-p", "1.5"][..], "--top-p 1.5"),
        (&["eval", run, "--seq-len", "0"][..], "--seq-len 0"),
        (&["eval", run, "--set", "model.memory"][..], "KEY=VALUE"),
        (&["bench", c, "--steps", "0"][..], "--steps 0"),
        (&["bench", c, "--runs", "0"][..], "--runs 0"),
        (&["bench-attention", c, "--lengths", "0"][..], "--lengths 0"),
        (&["bench-attention", c, "--reps", "0"][..], "--reps 0"),
        (&["train", c, "--out", "elsewhere", "--stop-at", "0"][..], "--stop-at 0"),
        (&["train", c, "--out", "elsewhere", "--max-steps", "0"][..], "--max-steps"),
        (&["spectrum", run, "--windows", "0"][..], "--windows"),
        (&["favor-error", "--features", "0"][..], "--features"),
        (&["favor-error", "--std=-1"][..], "--std"),
    ] {
        assert_clean_error(&variorum(args, tmp.path()), flag);
    }

    // one training per run directory: a held lock refuses a second one, naming the holder
    let lock = variorum_train::lock::RunLock::acquire(&out).unwrap();
    let o = variorum(&["train", c, "--out", run, "--resume", "--max-steps", "8"], tmp.path());
    assert_clean_error(&o, "in use by another training");
    drop(lock);
    let o = variorum(&["train", c, "--out", run, "--resume", "--max-steps", "8"], tmp.path());
    assert!(o.status.success(), "released, it trains: {}", stderr(&o));
}

#[test]
fn config_mistakes_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(write_config(tmp.path(), "")).unwrap();
    let cases = [
        (good.replace("n_heads = 2", "n_heads = 5"), "model.attention.n_heads = 5 does not divide model.d_model = 32"),
        (good.replace("n_heads = 2", "n_headz = 2"), "n_headz"),
        (good.replace("kind = \"full\"", "kind = \"nope\""), "nope"),
        (good.replace("d_model = 32", "d_model = \"wide\""), "model.d_model"),
        (good.replace("steps = 4", "steps = 0"), "train.steps"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let path = tmp.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let o =
            variorum(&["train", path.to_str().unwrap(), "--out", tmp.path().join("r").to_str().unwrap()], tmp.path());
        assert_clean_error(&o, needle);
    }
    let o = variorum(&["train", "does-not-exist.toml"], tmp.path());
    assert_clean_error(&o, "does-not-exist.toml");
    let o = variorum(&["train", tmp.path().join("bad0.toml").to_str().unwrap(), "--device", "tpu"], tmp.path());
    assert_clean_error(&o, "--device tpu");
}

#[test]
fn missing_and_empty_corpora_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    std::fs::write(tmp.path().join("text.txt"), "").unwrap();
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", tmp.path().join("r").to_str().unwrap()], tmp.path());
    assert_clean_error(&o, "text.txt");
    std::fs::remove_file(tmp.path().join("text.txt")).unwrap();
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", tmp.path().join("r").to_str().unwrap()], tmp.path());
    assert_clean_error(&o, "text.txt");
}

#[test]
fn pattern_draws_a_config_and_a_run_and_refuses_mistakes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let out = tmp.path().join("p.svg");
    let o = variorum(&["pattern", cfg.to_str().unwrap(), "--len", "12", "--out", out.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    // causal full attention: 78 of 144 entries per head
    assert!(s.contains("read from the weights") && s.contains("54.2 %"), "{s}");
    assert!(std::fs::read_to_string(&out).unwrap().contains("<svg"), "not an SVG");

    let o = variorum(&["pattern", cfg.to_str().unwrap(), "--len", "99"], tmp.path());
    assert_clean_error(&o, "--len 99");
    let o = variorum(&["pattern", cfg.to_str().unwrap(), "--head", "7"], tmp.path());
    assert_clean_error(&o, "--head 7");

    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap(), "--no-progress"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = variorum(&["pattern", run.to_str().unwrap()], tmp.path());
    assert_clean_error(&o, "--prompt");
    let png = tmp.path().join("run.png");
    let args = ["pattern", run.to_str().unwrap(), "--prompt", "Now is the winter", "--out", png.to_str().unwrap()];
    let o = variorum(&args, tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("16 positions"));
    assert!(std::fs::metadata(&png).unwrap().len() > 100);
}

#[test]
fn inspect_prints_the_expanded_config_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let o = variorum(&["inspect", cfg.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("n_kv_heads") || s.contains("tie_embeddings = true"), "defaults not expanded: {s}");
    assert!(s.contains("# parameters"), "{s}");
    assert!(s.contains("# FLOPs per token"), "{s}");
}

#[test]
fn collaborate_reparameterises_a_trained_run_that_evaluates_and_fine_tunes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap(), "--max-steps", "2"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let run = run.to_str().unwrap();

    // exact (shared width n_heads · head_dim = 32), then compressed 4×
    for (shared, exact) in [(None, true), (Some("8"), false)] {
        let out = tmp.path().join(format!("collab-{}", shared.unwrap_or("full")));
        let mut args = vec!["collaborate", run, "--out", out.to_str().unwrap()];
        args.extend(shared.map(|s| ["--shared-dim", s]).into_iter().flatten());
        let o = variorum(&args, tmp.path());
        assert!(o.status.success(), "{}", stderr(&o));
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(stdout.lines().any(|l| l.starts_with("layer   0:")), "{stdout}");
        assert!(stdout.contains("attention parameters"), "{stdout}");
        assert_eq!(stdout.contains("(exact)"), exact, "{stdout}");
        assert!(stderr(&o).contains("variorum eval"), "{}", stderr(&o));
        let o = variorum(&["eval", out.to_str().unwrap()], tmp.path());
        assert!(o.status.success(), "{}", stderr(&o));
    }

    // fine-tuning the re-parameterised run from its own config: every tensor fits
    let collab = tmp.path().join("collab-full");
    let o = variorum(
        &[
            "train",
            collab.join("config.toml").to_str().unwrap(),
            "--out",
            tmp.path().join("tuned").to_str().unwrap(),
            "--init-from",
            collab.to_str().unwrap(),
            "--max-steps",
            "2",
        ],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("tensors loaded, 0 new"), "{}", stderr(&o));

    // mistakes: one line each
    let elsewhere = tmp.path().join("elsewhere");
    let elsewhere = elsewhere.to_str().unwrap();
    assert_clean_error(&variorum(&["collaborate", run, "--out", run], tmp.path()), "not empty");
    assert_clean_error(
        &variorum(&["collaborate", run, "--out", elsewhere, "--shared-dim", "0"], tmp.path()),
        "--shared-dim 0",
    );
    assert_clean_error(
        &variorum(&["collaborate", run, "--out", elsewhere, "--shared-dim", "33"], tmp.path()),
        "1..=32",
    );
    let collab = collab.to_str().unwrap();
    assert_clean_error(&variorum(&["collaborate", collab, "--out", elsewhere], tmp.path()), "only `full`");
}

#[test]
fn zoo_lists_every_axis() {
    let o = variorum(&["zoo"], Path::new("."));
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    for needle in
        ["model.position", "model.attention", "model.block", "model.feed_forward", "swiglu", "post-ln", "Vaswani"]
    {
        assert!(s.contains(needle), "zoo lacks {needle}");
    }
}

#[test]
fn bench_reports_throughput() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let o = variorum(
        &["bench", cfg.to_str().unwrap(), "--steps", "3", "--warmup", "1", "--runs", "2", "--json"],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 2);
    assert!(v["median_tokens_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_memory_model_trains_on_streams_evaluates_with_and_without_memory_and_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let model = "[model.position]\nkind = \"transformer-xl\"\n[model.memory]\nkind = \"xl\"\nlength = 16\n";
    let cfg = write_config(tmp.path(), model);
    let text = std::fs::read_to_string(&cfg).unwrap();
    // random windows cannot carry a memory: refused before anything runs
    assert_clean_error(&variorum(&["train", cfg.to_str().unwrap()], tmp.path()), "train.batching = \"ordered\"");
    std::fs::write(&cfg, text.replace("[train]\n", "[train]\nbatching = \"ordered\"\n")).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(run.join("checkpoints").exists());
    let o = variorum(&["eval", run.to_str().unwrap(), "--seq-len", "16"], tmp.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("with memory") && out.contains("without"), "{out}{}", stderr(&o));
    // the evaluation is recorded: the report says what the memory is worth
    assert!(variorum(&["report", run.to_str().unwrap()], tmp.path()).status.success());
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(report.contains("what the memory is worth") && report.contains("segments of 16: loss"), "the memory view");
    let o = variorum(&["generate", run.to_str().unwrap(), "--prompt", "Now is", "--max-new-tokens", "40"], tmp.path());
    assert!(o.status.success() && stderr(&o).contains("memory carried"), "{}", stderr(&o));
    // an absolute position scheme with a memory is refused by name
    let absolute = write_config(tmp.path(), "[model.memory]\nkind = \"xl\"\n");
    let text = std::fs::read_to_string(&absolute).unwrap().replace("[train]\n", "[train]\nbatching = \"ordered\"\n");
    std::fs::write(&absolute, text).unwrap();
    assert_clean_error(
        &variorum(&["train", absolute.to_str().unwrap()], tmp.path()),
        "needs a relative position scheme",
    );
}

/// The Memorizing Transformer on document streams: refused on random windows and without
/// documents, trained with a memory per work, evaluated document by document with and without
/// its memory, and generating with the memory carried.
#[test]
fn a_memorizing_model_trains_on_documents_evaluates_and_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let works: String = (1..=4)
        .map(|i| {
            format!("THE WORK {i}\n\n{}", "Now is the winter of our discontent made glorious summer;\n".repeat(6 + i))
        })
        .collect();
    let corpus = tmp.path().join("works.txt");
    std::fs::write(&corpus, works).unwrap();
    let cfg = tmp.path().join("memorizing.toml");
    let write = |train: &str, tags: bool| {
        let tags = if tags { "[data.tags]\nsection = \"^THE WORK [0-9]+\"\nholdout = \"each-section\"\n" } else { "" };
        std::fs::write(
            &cfg,
            format!(
                "[model]\nd_model = 32\nn_layers = 2\nseq_len = 16\n[model.position]\nkind = \"alibi\"\n[model.attention]\nkind = \"memorizing\"\nn_heads = 2\nmemory_size = 64\ntop_k = 4\nmemory_layers = [false, true]\n\n[data]\npath = \"{}\"\n{tags}\n[train]\n{train}steps = 6\nbatch_size = 2\neval_interval = 3\neval_batches = 2\nlog_interval = 3\nsample_tokens = 10\n",
                corpus.display()
            ),
        )
        .unwrap();
    };
    write("", true);
    assert_clean_error(&variorum(&["train", cfg.to_str().unwrap()], tmp.path()), "train.batching = \"documents\"");
    write("batching = \"documents\"\n", false);
    assert_clean_error(&variorum(&["train", cfg.to_str().unwrap()], tmp.path()), "add a [data.tags]");
    write("batching = \"documents\"\n", true);
    // a model without memory trains on documents too, each segment scored alone (learned
    // positions: a state carried past the context would overflow their table)
    let text = std::fs::read_to_string(&cfg).unwrap();
    let plain = tmp.path().join("plain.toml");
    let memorizing = "kind = \"memorizing\"\nn_heads = 2\nmemory_size = 64\ntop_k = 4\nmemory_layers = [false, true]\n";
    std::fs::write(
        &plain,
        text.replace(memorizing, "kind = \"full\"\nn_heads = 2\n").replace("\"alibi\"", "\"learned\""),
    )
    .unwrap();
    let o =
        variorum(&["train", plain.to_str().unwrap(), "--out", tmp.path().join("plain").to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = variorum(&["eval", run.to_str().unwrap(), "--seq-len", "16"], tmp.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("rows of whole documents") && out.contains("with memory"),
        "{out}{}",
        stderr(&o)
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.trim_start().starts_with("16 "))
        .expect("the row of length 16")
        .split_whitespace()
        .collect();
    let (with, without): (f64, f64) = (row[2].parse().unwrap(), row[3].parse().unwrap());
    assert!(with.is_finite() && without.is_finite() && with > 0.0, "{out}");
    // documents start on whole contexts: a length that cuts one is refused
    assert_clean_error(
        &variorum(&["eval", run.to_str().unwrap(), "--seq-len", "8"], tmp.path()),
        "use a multiple of 16",
    );
    let o = variorum(&["generate", run.to_str().unwrap(), "--prompt", "Now is", "--max-new-tokens", "40"], tmp.path());
    assert!(o.status.success() && stderr(&o).contains("memory carried"), "{}", stderr(&o));
}

#[test]
fn inspect_shows_the_learned_spans_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "[model.position]\nkind = \"alibi\"\n");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "[model.attention]\nkind = \"full\"",
        "[model.attention]\nkind = \"adaptive-span\"\nmax_span = 32\ninit_span = 0.5",
    );
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = variorum(&["inspect", run.to_str().unwrap()], tmp.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("learned span per head") && out.contains("layer 0:"), "{out}");
    // its report shows the same view, and the run as finished
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(report.contains("learned span per head") && report.contains("<td>finished</td>"), "the report");
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(metrics.contains("adaptive_span="), "the span penalty is logged: {metrics}");
}

#[test]
fn eval_and_inspect_report_steps_per_token_of_an_act_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = "[model.position]\nkind = \"universal-timestep\"\n[model.depth]\nkind = \"universal\"\nact = true\n";
    let cfg = write_config(tmp.path(), &format!("scale_embeddings = true\n{model}"));
    let text = std::fs::read_to_string(&cfg).unwrap().replace("n_layers = 1", "n_layers = 3");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    for args in [vec!["eval", run.to_str().unwrap()], vec!["inspect", run.to_str().unwrap()]] {
        let o = variorum(&args, tmp.path());
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("adaptive computation time") && out.contains("steps/token"),
            "{out}"
        );
    }
}

#[test]
fn early_exit_draws_the_calm_curve_or_explains_why_not() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "[model.exits]\nkind = \"every-layer\"\npredictor = \"token-geometric\"\n");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("n_layers = 1", "n_layers = 3");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let o =
        variorum(&["early-exit", run.to_str().unwrap(), "--max-tokens", "200", "--thresholds", "1,0.5,0"], tmp.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && out.contains("softmax-response")
            && out.contains("calibrated saturation")
            && out.contains("exit predictor: token-geometric")
            && out.contains("LTT predictor"),
        "{out}{}",
        stderr(&o)
    );
    assert!(run.join("early-exit.png").exists());
    // the report written at the end draws the exit curve from decoded tokens
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        report.contains("early exit: loss against blocks used") && report.contains("threshold 0.0: 1.00 blocks"),
        "the exit view"
    );
    assert_clean_error(&variorum(&["early-exit", run.to_str().unwrap(), "--ltt-delta", "0"], tmp.path()), "(0, 1)");
    assert_clean_error(
        &variorum(&["early-exit", run.to_str().unwrap(), "--thresholds", "2"], tmp.path()),
        "not in [0, 1]",
    );
    // a run without exits
    let plain = write_config(tmp.path(), "");
    let other = tmp.path().join("plain");
    assert!(
        variorum(&["train", plain.to_str().unwrap(), "--out", other.to_str().unwrap()], tmp.path()).status.success()
    );
    assert_clean_error(&variorum(&["early-exit", other.to_str().unwrap()], tmp.path()), "has no early exits");
}

#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_output_without_a_panic() {
    use std::process::Stdio;
    // the reader goes away before the first line is printed (`variorum zoo | head -0`)
    let mut child = Command::new(env!("CARGO_BIN_EXE_variorum"))
        .arg("zoo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run variorum");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("internal error") && !err.contains("panicked"), "{err}");
}

#[test]
fn attention_draws_the_learned_weights_of_a_run_and_refuses_mistakes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("n_layers = 1", "n_layers = 2")
        .replace("\nsteps = 4", "\nsteps = 2");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap(), "--no-progress"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let r = run.to_str().unwrap();

    // every layer and head: one row each (2 layers × 2 heads)
    let svg = tmp.path().join("a.svg");
    let o = variorum(&["attention", r, "--prompt", "Now is the", "--out", svg.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(!picture.is_empty() && picture.contains("<svg"), "not an SVG");
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut lines = table.lines().filter(|l| !l.trim().is_empty());
    assert!(lines.next().is_some_and(|h| h.starts_with("layer") && h.contains("entropy")), "{table}");
    assert_eq!(lines.count(), 2 * 2, "{table}");
    assert!(stderr(&o).contains("a.svg"), "{}", stderr(&o));

    // one layer, one head, to the default picture
    let o = variorum(&["attention", r, "--prompt", "Now is", "--layer", "1", "--head", "0"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(table.lines().filter(|l| !l.trim().is_empty()).count(), 2, "{table}");
    assert!(std::fs::metadata(run.join("attention.png")).unwrap().len() > 100);

    assert_clean_error(&variorum(&["attention", r, "--prompt", "Now", "--layer", "2"], tmp.path()), "--layer 2");
    assert_clean_error(&variorum(&["attention", r, "--prompt", "Now", "--head", "9"], tmp.path()), "--head 9");
    assert_clean_error(&variorum(&["attention", r, "--prompt", ""], tmp.path()), "--prompt");
    assert_clean_error(&variorum(&["attention", r, "--prompt", "Now is the winter of"], tmp.path()), "--prompt");
    assert_clean_error(&variorum(&["attention", r, "--prompt", "Now", "--out", "x.jpg"], tmp.path()), "--out");
}

#[test]
fn bench_attention_measures_the_kernel_path_and_the_composed_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/attention/sliding-window.toml");
    let c = cfg.to_str().unwrap();
    let args = [
        "bench-attention",
        c,
        "--d-model",
        "16",
        "--lengths",
        "48",
        "--contexts",
        "16",
        "--reps",
        "1",
        "--tokens",
        "1",
    ];
    for composed in [false, true] {
        let mut all = args.to_vec();
        if composed {
            all.push("--composed");
        }
        let o = variorum(&all, tmp.path());
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(out.contains("kernels off"), composed, "{out}");
        assert!(out.contains("train     L =     48") && out.contains("ms"), "{out}");
    }
}

/// kNN-LM from the command line: a datastore built over the training split (its size announced
/// first), described by `datastore info`, scored with by `eval --knn` (the λ = 0 row is the LM's
/// loss) and sampled with by `generate --knn`; mistakes are one-line errors.
#[test]
fn a_knn_datastore_builds_scores_and_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let r = run.to_str().unwrap();
    let o = variorum(&["datastore", "build", r], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("# datastore of train split of"), "{out}");
    let store = run.join("datastore-train");
    let s = store.to_str().unwrap();
    let o = variorum(&["datastore", "info", s], tmp.path());
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("keys of 32 values"), "{}", stderr(&o));
    let o = variorum(&["eval", r, "--knn", s, "--knn-k", "1,4", "--knn-lambda", "0,0.5"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let loss = |k: &str, l: &str| -> String {
        let row =
            out.lines().find(|line| line.split_whitespace().take(2).eq([k, l])).unwrap_or_else(|| panic!("{out}"));
        row.split_whitespace().nth(3).unwrap().to_string()
    };
    assert_eq!(loss("1", "0"), loss("-", "0"), "λ = 0 is the LM alone: {out}");
    assert_eq!(loss("4", "0"), loss("-", "0"));
    let o = variorum(&["generate", r, "--prompt", "Now", "--max-new-tokens", "8", "--knn", s], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    // mistakes
    assert_clean_error(&variorum(&["eval", r, "--knn", "nowhere"], tmp.path()), "nowhere");
    assert_clean_error(&variorum(&["eval", r, "--knn", s, "--knn-lambda", "2"], tmp.path()), "--knn-lambda 2");
    assert_clean_error(&variorum(&["datastore", "info", r], tmp.path()), "not a datastore");
    std::fs::write(store.join("values.u32"), b"xx").unwrap();
    assert_clean_error(&variorum(&["eval", r, "--knn", s], tmp.path()), "values.u32");
    let o = variorum(&["datastore", "build", r, "--out", s, "--stride", "4"], tmp.path());
    assert_clean_error(&o, "built otherwise");
}

/// SPALM from the command line: neighbour tables searched in a run's datastore (each table's
/// size announced first), a model with a long-term memory trained on them, scored with and
/// without retrieval and sampled from; mistakes are one-line errors that leave nothing behind.
#[test]
fn spalm_searches_its_tables_trains_scores_and_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "");
    // words in a pseudo-random order: the repeated line of `write_corpus` makes the validation
    // split begin like the training split, which the tables refuse
    let words = ["now", "is", "the", "winter", "of", "our", "discontent", "made", "glorious", "summer"];
    let mut x: u64 = 7;
    let text: String = (0..1800)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            words[(x >> 33) as usize % words.len()]
        })
        .collect::<Vec<_>>()
        .join(" ");
    std::fs::write(tmp.path().join("text.txt"), text).unwrap();
    let run = tmp.path().join("run");
    let o = variorum(&["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap()], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let r = run.to_str().unwrap();
    assert!(variorum(&["datastore", "build", r], tmp.path()).status.success());
    let store = run.join("datastore-train");
    let s = store.to_str().unwrap();
    // a model whose tables were never searched is refused before anything is written
    let text = std::fs::read_to_string(&cfg).unwrap();
    let spalm_cfg = tmp.path().join("spalm.toml");
    let spalm = text.replace("[data]\n", &format!("[model.long_term_memory]\nk = 2\n\n[data]\nneighbours = \"{s}\"\n"));
    std::fs::write(&spalm_cfg, spalm).unwrap();
    let spalm_run = tmp.path().join("spalm");
    let train = ["train", spalm_cfg.to_str().unwrap(), "--out", spalm_run.to_str().unwrap()];
    assert_clean_error(
        &variorum(&train, tmp.path()),
        "has no train table: search it with `variorum datastore neighbours",
    );
    assert!(!spalm_run.exists(), "a refused run left its directory");
    let wide = ["datastore", "neighbours", s, "--exclude-radius", "65536"];
    assert_clean_error(&variorum(&wide, tmp.path()), "--exclude-radius 65536 leaves out more than half");
    let o = variorum(&["datastore", "neighbours", s, "--k", "4"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("# ") && out.contains("positions × 4 neighbours") && out.contains("no neighbour"), "{out}");
    let o = variorum(&train, tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let sr = spalm_run.to_str().unwrap();
    let o = variorum(&["eval", sr], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("with retrieval") && out.contains("2 of 4 neighbours per position"), "{out}");
    let o = variorum(&["generate", sr, "--prompt", "now", "--max-new-tokens", "8"], tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean_error(
        &variorum(&["generate", sr, "--prompt", "now", "--beams", "2"], tmp.path()),
        "beam search does not retrieve",
    );
    std::fs::write(tmp.path().join("other.txt"), "the summer of our winter is made now").unwrap();
    assert_clean_error(&variorum(&["eval", sr, "--data", "other.txt"], tmp.path()), "this text is neither");
    // the datastore's run lost its weights: its tables still train a model, generation cannot
    // query, and a training's closing sample goes without retrieval rather than failing the run
    std::fs::remove_file(run.join("model.bpk")).unwrap();
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    let again = ["train", spalm_cfg.to_str().unwrap(), "--out", "again"];
    let o = variorum(&again, tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: the closing sample is written without retrieval"), "{}", stderr(&o));
    assert!(tmp.path().join("again/summary.json").is_file());
    assert_clean_error(&variorum(&["generate", sr, "--prompt", "now"], tmp.path()), "the run that built");
}

#[test]
fn prepare_train_and_eval_a_corpus_of_many_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let line = "Now is the winter of our discontent made glorious summer by this sun of York;";
    let jsonl: String = (0..80)
        .map(|i| {
            format!(
                "{{\"text\": \"{} {i}\\n\"}}\n",
                line.split(' ').cycle().skip(i % 7).take(6 + i % 9).collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    std::fs::write(d.join("notes.jsonl"), jsonl).unwrap();
    std::fs::create_dir_all(d.join("plays")).unwrap();
    for i in 0..12 {
        std::fs::write(d.join(format!("plays/{i}.txt")), format!("{line}\n").repeat(3 + i)).unwrap();
    }
    let cfg = d.join("many.toml");
    std::fs::write(
        &cfg,
        "[model]\nd_model = 32\nn_layers = 1\nseq_len = 16\n[model.attention]\nkind = \"full\"\nn_heads = 2\n\n\
         [data]\nsources = [{ path = \"plays/\" }, { path = \"notes.jsonl\", text_field = \"text\" }]\nprepared = \"prepared\"\nval_fraction = 0.25\n\n\
         [train]\nsteps = 4\nbatch_size = 2\neval_interval = 2\neval_batches = 1\nlog_interval = 2\nsample_tokens = 10\n",
    )
    .unwrap();
    let o = variorum(&["prepare", "many.toml"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("prepared: prepared") && out.contains("source 1 notes.jsonl: 1 files, 80 documents"), "{out}");
    let o = variorum(&["prepare", "many.toml"], d);
    assert!(String::from_utf8_lossy(&o.stdout).contains("already prepared"));

    let o = variorum(&["train", "many.toml", "--out", "run", "--device", "cpu"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    // eval reads the held-out documents whole, each source on its own: every validation token
    // but each source's first is predicted once
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("prepared/index.json")).unwrap()).unwrap();
    let val: Vec<u64> =
        index["sources"].as_array().unwrap().iter().map(|s| s["val_tokens"].as_u64().unwrap()).collect();
    let o = variorum(&["eval", "run", "--device", "cpu"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let predicted: u64 = val.iter().map(|n| n - 1).sum();
    assert!(out.contains(&format!("# {} tokens of the validation split", val.iter().sum::<u64>())), "{out}");
    let row = out.lines().find(|l| l.trim_start().starts_with("16 ")).unwrap();
    assert_eq!(row.split_whitespace().nth(2).unwrap(), predicted.to_string(), "{out}");

    // a memory per document, trained on the prepared documents and scored on every held-out
    // document whole: each of its tokens but the first predicted once
    let memorizing = std::fs::read_to_string(&cfg).unwrap().replace(
        "[model.attention]\nkind = \"full\"\nn_heads = 2\n",
        "[model.position]\nkind = \"alibi\"\n[model.attention]\nkind = \"memorizing\"\nn_heads = 2\nmemory_size = 64\ntop_k = 4\n",
    ) + "batching = \"documents\"\n";
    std::fs::write(d.join("memorizing.toml"), memorizing).unwrap();
    let o = variorum(&["train", "memorizing.toml", "--out", "mem", "--device", "cpu"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = variorum(&["eval", "mem", "--device", "cpu"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let documents: u64 = index["shards"].as_array().unwrap().iter().map(|s| s["val_documents"].as_u64().unwrap()).sum();
    let row = out.lines().find(|l| l.trim_start().starts_with("16 ")).unwrap();
    let want = val.iter().sum::<u64>() - documents;
    assert_eq!(row.split_whitespace().nth(1).unwrap(), want.to_string(), "{out}");

    // a damaged shard stops the run before it reads it; a bad line is named
    let shard = d.join("prepared/shard-00000.train.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let o = variorum(&["train", "many.toml", "--out", "run2", "--device", "cpu"], d);
    assert_clean_error(&o, "does not match its checksum");
    std::fs::write(d.join("notes.jsonl"), "{\"text\": \"fine\"}\nnot json\n").unwrap();
    let o = variorum(&["prepare", "many.toml"], d);
    assert_clean_error(&o, "notes.jsonl, line 2: not JSON");
}

/// A disk that fills during `prepare` (a file-size limit, which fails a write as a full disk
/// does): one line naming the file, a non-zero exit, no index naming an unfinished shard, the
/// finished shards kept; run again with room, it finishes with the bytes of a prepare that was
/// never stopped.
#[cfg(unix)]
#[test]
fn a_disk_that_fills_during_prepare_loses_nothing_already_prepared() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let notes: String = (0..40).map(|i| format!("{{\"text\": \"note {i} of a small source\\n\"}}\n")).collect();
    std::fs::write(d.join("notes.jsonl"), notes).unwrap();
    let line = "Now is the winter of our discontent made glorious summer by this sun of York;\n";
    std::fs::write(d.join("book.txt"), line.repeat(4000)).unwrap();
    let config = |out: &str| {
        format!(
            "[model]\nd_model = 32\nn_layers = 1\nseq_len = 16\n[model.attention]\nkind = \"full\"\nn_heads = 2\n\n\
             [data]\nsources = [{{ path = \"notes.jsonl\", text_field = \"text\" }}, {{ path = \"book.txt\" }}]\n\
             prepared = \"{out}\"\nval_fraction = 0.25\n[data.prepare]\nshard_bytes = 65536\n"
        )
    };
    std::fs::write(d.join("full.toml"), config("full")).unwrap();
    std::fs::write(d.join("clean.toml"), config("clean")).unwrap();
    // the small source's shard (a few KiB) fits under 64 KiB; the book's (128 KiB of u16) does not
    let limited = Command::new("bash")
        .arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -f 64; exec {} prepare full.toml", env!("CARGO_BIN_EXE_variorum")))
        .current_dir(d)
        .output()
        .unwrap();
    assert_clean_error(&limited, "shard-00001.train.bin");
    let full = d.join("full");
    assert!(!full.join("index.json").exists(), "no index while a shard is missing");
    assert!(full.join("shard-00000.json").is_file(), "the finished shard is kept");
    assert!(!std::fs::read_dir(&full).unwrap().any(|e| e.unwrap().path().to_string_lossy().ends_with(".tmp")));

    let o = variorum(&["prepare", "full.toml"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 shards kept"), "{}", String::from_utf8_lossy(&o.stdout));
    let o = variorum(&["prepare", "clean.toml"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let files = |dir: &Path| -> std::collections::BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap() != "prepare.json")
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect()
    };
    let (a, b) = (files(&full), files(&d.join("clean")));
    assert!(a.len() > 10, "{:?}", a.keys());
    assert!(a == b, "the files differ from an uninterrupted prepare's");
}

#[test]
fn a_decision_transformer_is_recorded_trained_and_played_and_mistakes_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = variorum(&["trajectories", "--out", "t.jsonl", "--episodes", "20", "--epsilons", "0,1"], dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let listing = String::from_utf8_lossy(&o.stdout);
    assert!(listing.contains("20 episodes") && listing.contains("ε = 0 "), "{listing}");
    let cfg = "[model]\nkind = \"decision-transformer\"\nd_model = 16\nn_layers = 1\nseq_len = 12\n\
               [model.position]\nkind = \"none\"\n[model.attention]\nkind = \"full\"\nn_heads = 2\n\
               [data]\ntrajectories = \"t.jsonl\"\n[train]\nsteps = 3\nbatch_size = 4\neval_interval = 3\neval_batches = 1\n";
    std::fs::write(dir.join("dt.toml"), cfg).unwrap();
    let o = variorum(&["train", "dt.toml", "--out", "run", "--no-progress"], dir);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["config.toml", "trajectories.json", "metrics.csv", "model.bpk", "summary.json"] {
        assert!(dir.join("run").join(f).exists(), "{f} missing");
    }
    let o = variorum(&["rollout", "run", "--targets=-1,0.5", "--episodes", "3", "--greedy"], dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("-1.000") && table.contains("+0.500"), "{table}");
    let played: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run/rollouts.json")).unwrap()).unwrap();
    assert_eq!(played["targets"].as_array().unwrap().len(), 2);
    assert_eq!(played["targets"][0]["returns"].as_array().unwrap().len(), 3);

    // mistakes: no episodes, a bad ε, a run that reads text, a text command on this run
    assert_clean_error(&variorum(&["trajectories", "--out", "x.jsonl", "--episodes", "0"], dir), "--episodes 0");
    assert_clean_error(&variorum(&["trajectories", "--out", "x.jsonl", "--epsilons", "2"], dir), "ε = 2");
    assert_clean_error(&variorum(&["eval", "run"], dir), "variorum rollout");
    assert_clean_error(&variorum(&["rollout", "nowhere"], dir), "nowhere");
    let lm = write_config(dir, "");
    let o = variorum(&["train", lm.to_str().unwrap(), "--out", "lm"], dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean_error(&variorum(&["rollout", "lm"], dir), "not a Decision Transformer");
    std::fs::write(dir.join("t.jsonl"), "{}\n").unwrap();
    assert_clean_error(&variorum(&["train", "dt.toml", "--out", "run2"], dir), "line 1");
}
