//! The HTML report in a real browser: two tiny runs are trained, `report::write` renders them to one
//! file, and a headless Chromium loads it (`--dump-dom`, with a recorder and a probe put first in
//! the page). The page must load without a console message, an exception or a picture that fails,
//! fetch nothing but itself (it is self-contained), have every section of `report::SECTIONS` in
//! order, show every picture, and name both runs.
//!
//! The browser: `$VARIORUM_CHROMIUM`, else Debian's `chromium-headless-shell` or `chromium`, else
//! the first Chromium on the PATH. Without one the test fails and says how to install one.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use anyhow::{Context, anyhow};
use burn::prelude::Device;
use common::{corpus, seeded};
use serde::Deserialize;
use variorum_train::pictures::report;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, metrics, train};

const NO_BROWSER: &str =
    "no headless Chromium: run scripts/system-deps.sh (Debian: chromium-headless-shell) or set VARIORUM_CHROMIUM";

/// The Chromium to drive: `$VARIORUM_CHROMIUM`, Debian's two packages, then the PATH.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("VARIORUM_CHROMIUM") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "VARIORUM_CHROMIUM = {} is not a file; {NO_BROWSER}", path.display());
        return path;
    }
    for path in ["/usr/bin/chromium-headless-shell", "/usr/bin/chromium"] {
        if Path::new(path).is_file() {
            return path.into();
        }
    }
    let names = ["chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome"];
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        for name in names {
            if dir.join(name).is_file() {
                return dir.join(name);
            }
        }
    }
    panic!("{NO_BROWSER}");
}

/// A few steps with training rows, two evaluations and two checkpoints.
fn tiny_config(corpus: &Path, seed: u64) -> ExperimentConfig {
    let mut cfg = common::tiny_config(corpus, 0.0);
    let t = &mut cfg.train;
    (t.steps, t.warmup_steps, t.eval_interval, t.eval_batches) = (8, 2, 4, 1);
    (t.log_interval, t.checkpoint_interval, t.sample_tokens, t.seed) = (2, 4, 8, seed);
    cfg
}

/// Installed first in the page's `<head>`, before anything of the report: what goes wrong while it
/// loads, seen from inside. Capturing `error` also catches a picture that fails to load.
const RECORDER: &str = r#"(() => {
  const seen = window.__variorumProblems = [];
  addEventListener('error', e => {
    const t = e.target;
    seen.push(t instanceof Element
      ? `<${t.localName}> failed to load ${String(t.getAttribute('src') || t.getAttribute('href') || '').slice(0, 80)}`
      : `uncaught: ${e.message} (${e.filename}:${e.lineno})`);
  }, true);
  addEventListener('unhandledrejection', e => seen.push(`unhandled rejection: ${e.reason}`));
  for (const level of ['error', 'warn']) {
    const original = console[level];
    console[level] = function (...args) {
      seen.push(`console.${level}: ${args.join(' ')}`);
      return original.apply(this, args);
    };
  }
})();"#;

/// What the loaded page says about itself (`PROBE`'s result).
#[derive(Debug, Deserialize)]
struct Dom {
    href: String,
    /// The navigation's own Resource Timing entry: the page as the browser fetched it.
    navigation: Vec<String>,
    /// The ids of the `<section id>` elements, in document order.
    sections: Vec<String>,
    images: Vec<Picture>,
    /// Inline `<svg>` elements not inside another `<svg>`.
    svgs: Vec<Picture>,
    /// The body's text, without scripts and styles (SVG text included).
    text: String,
    /// What `RECORDER` saw.
    problems: Vec<String>,
    /// Resource Timing's entries: every resource the page fetched.
    resources: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Picture {
    name: String,
    ok: bool,
    detail: String,
}

/// The id of the element `PROBE` writes its JSON into.
const PROBE_ID: &str = "variorum-probe";

/// Run at the page's load event (every picture decoded, or failed): opens every `<details>` first
/// (a reader can), so that collapsed plots are laid out and measured, then appends its findings as
/// a JSON `<script>` element, which `--dump-dom` prints as it is (`<` escaped, so that no text
/// of the page can close the element early).
const PROBE: &str = r#"addEventListener('load', () => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const images = [...document.images].map((im, i) => ({
    name: `<img> ${i} (alt: ${im.getAttribute('alt') || 'none'})`,
    ok: im.complete && im.naturalWidth > 0 && im.naturalHeight > 0,
    detail: `complete ${im.complete}, natural size ${im.naturalWidth}x${im.naturalHeight}`,
  }));
  const svgs = [...document.querySelectorAll('svg')]
    .filter(s => !(s.parentElement && s.parentElement.closest('svg')))
    .map((s, i) => {
      const r = s.getBoundingClientRect();
      const title = s.querySelector('title');
      const label = s.getAttribute('aria-label') || (title && title.textContent) || 'no label';
      return { name: `<svg> ${i} (${label})`, ok: r.width > 0 && r.height > 0, detail: `laid out ${r.width}x${r.height}` };
    });
  const body = document.body.cloneNode(true);
  body.querySelectorAll('script, style').forEach(e => e.remove());
  const found = {
    href: location.href,
    navigation: performance.getEntriesByType('navigation').map(e => e.name),
    sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
    images,
    svgs,
    text: body.textContent,
    problems: window.__variorumProblems || ['the in-page recorder did not run'],
    resources: performance.getEntriesByType('resource').map(e => e.name),
  };
  const out = document.createElement('script');
  out.type = 'application/json';
  out.id = 'variorum-probe';
  out.textContent = JSON.stringify(found).replace(/</g, '\\u003c');
  document.body.appendChild(out);
});"#;

/// What the browser printed while the report loaded, and what the page says about itself.
#[derive(Debug)]
struct Page {
    /// The `file://` URL loaded.
    url: String,
    /// The browser's console lines (`--enable-logging=stderr`): every console message and uncaught
    /// exception, whatever its level. The report has no script of its own, so each is a problem.
    console: Vec<String>,
    dom: Dom,
}

/// `path` as a `file://` URL, percent-encoded.
fn file_url(path: &Path) -> anyhow::Result<String> {
    let path = path.canonicalize().with_context(|| format!("{}", path.display()))?;
    let mut url = String::from("file://");
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(url)
}

/// Loads a copy of `html` with `RECORDER` and `PROBE` put first in its `<head>` in headless
/// `chromium`, which prints the DOM once the page has loaded (`--dump-dom`) and its console on
/// stderr. The browser is run as a plain process (no DevTools client: that crate alone cost the
/// first build 270 CPU-seconds, docs/build-time.md) and killed if it takes longer than a minute.
fn load(chromium: &Path, html: &Path) -> anyhow::Result<Page> {
    let report = std::fs::read_to_string(html)?;
    let head = report.find("<head>").ok_or_else(|| anyhow!("the report has no <head>"))? + "<head>".len();
    let probed = html.with_file_name("report.probed.html");
    let scripts = format!("<script>{RECORDER}</script><script>{PROBE}</script>");
    std::fs::write(&probed, format!("{}{scripts}{}", &report[..head], &report[head..]))?;
    let url = file_url(&probed)?;

    let mut child = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1024"])
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"]) // CI runs as root: no sandbox
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("launching the browser")?;
    // both pipes drained while the browser runs, so that neither fills and blocks it
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            anyhow::bail!("the browser did not finish loading the report in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let dom = out.join().map_err(|_| anyhow!("stdout reader panicked"))??;
    let log = err.join().map_err(|_| anyhow!("stderr reader panicked"))??;
    anyhow::ensure!(status.success(), "the browser exited with {status}:\n{log}");

    let open = format!(r#"<script type="application/json" id="{PROBE_ID}">"#);
    let start =
        dom.find(&open).ok_or_else(|| anyhow!("the probe wrote nothing (no {open} in the DOM); stderr:\n{log}"))?;
    let json = &dom[start + open.len()..];
    let json = &json[..json.find("</script>").ok_or_else(|| anyhow!("the probe's element is not closed"))?];
    let dom: Dom = serde_json::from_str(json).context("the probe's JSON")?;
    // "[…:INFO:CONSOLE:3] "message", source: file:///… (3)"
    let console = log.lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    Ok(Page { url, console, dom })
}

/// The `src`/`href` attributes of `html` that are neither `data:` URLs nor `#` anchors, and any CSS
/// `url(...)` or `@import` that reaches out: everything a self-contained page must not have.
fn outside_references(html: &str) -> Vec<String> {
    let attribute = regex::Regex::new(r#"(src|href)[ \t\r\n]*=[ \t\r\n]*("([^"]*)"|'([^']*)')"#).unwrap();
    let mut found: Vec<String> = attribute
        .captures_iter(html)
        .filter_map(|c| {
            let value = c.get(3).or_else(|| c.get(4)).map_or("", |m| m.as_str()).trim();
            (!value.starts_with("data:") && !value.starts_with('#')).then(|| c[0].chars().take(120).collect::<String>())
        })
        .collect();
    let css = regex::Regex::new(r#"url\([ \t\r\n]*['"]?[ \t\r\n]*([a-zA-Z][a-zA-Z0-9+.-]*:|//)|@import"#).unwrap();
    found
        .extend(css.find_iter(html).map(|m| m.as_str()).filter(|m| !m.ends_with("data:")).map(|m| format!("CSS {m}…")));
    found
}

#[test]
fn the_report_of_two_runs_loads_cleanly_in_a_headless_browser() {
    let chromium = chromium(); // before training: without a browser there is nothing to test
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("report.html");
    let runs: Vec<PathBuf> = {
        // report::write loads the runs' models too: the seeded RNG stays ours until it is done
        let _guard = seeded();
        let text = corpus(tmp.path());
        let runs: Vec<PathBuf> = [("run-alpha", 1), ("run-beta", 2)]
            .into_iter()
            .map(|(name, seed)| {
                let run = tmp.path().join(name);
                let opts = TrainOptions::new(run.clone(), Device::flex(), "flex");
                let Outcome::Finished(_) = train(tiny_config(&text, seed), &opts).unwrap() else {
                    panic!("{name}: training was interrupted")
                };
                let rows = metrics::read(&run.join("metrics.csv")).unwrap();
                assert!(
                    rows.iter().any(|r| r.train_loss.is_some()) && rows.iter().any(|r| r.val_loss.is_some()),
                    "{name}: metrics.csv should have training and validation rows"
                );
                assert!(run.join("checkpoints/latest").exists(), "{name}: no checkpoint");
                run
            })
            .collect();
        report::write(&runs, &out, &Device::flex()).unwrap_or_else(|e| panic!("report::write: {e:#}"));
        runs
    };

    let html = std::fs::read_to_string(&out).unwrap();
    let outside = outside_references(&html);
    assert!(
        outside.is_empty(),
        "the report refers to things outside itself (only data: URLs and #anchors may appear in src/href):\n  {}",
        outside.join("\n  ")
    );

    let started = Instant::now();
    let page = load(&chromium, &out).unwrap_or_else(|e| panic!("loading the report in {}: {e:#}", chromium.display()));
    eprintln!("browser: {:.1} s", started.elapsed().as_secs_f64());

    assert!(
        page.console.is_empty(),
        "the browser's console while loading the report (the report has no script, so any line is a problem):\n  {}",
        page.console.join("\n  ")
    );
    assert!(page.dom.problems.is_empty(), "the page saw problems while loading:\n  {}", page.dom.problems.join("\n  "));

    assert_eq!(page.dom.href, page.url, "the page the probe ran in");
    assert_eq!(
        page.dom.navigation,
        [page.url.clone()],
        "Resource Timing should hold the report's own navigation, or the resource check below means nothing"
    );
    let foreign: Vec<&String> = page.dom.resources.iter().filter(|u| !u.starts_with("data:")).collect();
    assert!(foreign.is_empty(), "the report fetched other resources (it must be self-contained): {foreign:?}");

    assert_eq!(
        page.dom.sections,
        report::SECTIONS.to_vec(),
        "the ids of the page's <section> elements, in order, should be report::SECTIONS"
    );

    let pictures: Vec<&Picture> = page.dom.images.iter().chain(&page.dom.svgs).collect();
    assert!(!pictures.is_empty(), "the report shows no picture (no <img>, no inline <svg>)");
    let broken: Vec<String> = pictures.iter().filter(|p| !p.ok).map(|p| format!("{}: {}", p.name, p.detail)).collect();
    assert!(broken.is_empty(), "pictures that did not render:\n  {}", broken.join("\n  "));

    for run in &runs {
        let name = run.file_name().unwrap().to_string_lossy();
        assert!(page.dom.text.contains(&*name), "the page's text does not name the run {name}");
    }
}
