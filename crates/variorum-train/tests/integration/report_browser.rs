//! The HTML report in a real browser: two tiny runs are trained, `report::write` renders them to one
//! file, and a headless Chromium driven over the DevTools protocol loads it. The page must load
//! without a console error or warning, an exception or an error log entry, fetch nothing but
//! itself (it is self-contained), have every section of `report::SECTIONS` in order, show every
//! picture, and name both runs.
//!
//! The browser: `$VARIORUM_CHROMIUM`, else Debian's `chromium-headless-shell` or `chromium`, else
//! the first Chromium on the PATH. Without one the test fails and says how to install one.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::common;

use anyhow::{Context, anyhow};
use burn::prelude::Device;
use common::{corpus, seeded};
use headless_chrome::protocol::cdp::types::Event;
use headless_chrome::protocol::cdp::{Log, Network, Page as CdpPage, Runtime};
use headless_chrome::{Browser, LaunchOptions};
use serde::Deserialize;
use serde_json::Value;
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

/// Console errors and warnings, exceptions, error and warning log entries, and requested URLs, as
/// the DevTools protocol reported them while the page loaded.
#[derive(Debug, Default)]
struct Recorded {
    problems: Vec<String>,
    requests: Vec<String>,
}

impl Recorded {
    /// Reads the events' parameters as the protocol's JSON (their field names there are the
    /// protocol's own, not the generated Rust ones).
    fn record(&mut self, event: &Event) {
        match event {
            Event::RuntimeConsoleAPICalled(e) => {
                let p = as_json(&e.params);
                let kind = p["type"].as_str().unwrap_or_default();
                if matches!(kind, "error" | "warning" | "assert") {
                    let args: Vec<String> = p["args"].as_array().into_iter().flatten().map(remote_text).collect();
                    self.problems.push(format!("console.{kind}: {}", args.join(" ")));
                }
            }
            Event::RuntimeExceptionThrown(e) => {
                let p = as_json(&e.params);
                let d = &p["exceptionDetails"];
                self.problems.push(format!(
                    "uncaught exception: {} {} (at {}:{})",
                    d["text"].as_str().unwrap_or_default(),
                    d["exception"]["description"].as_str().unwrap_or_default(),
                    d["url"].as_str().unwrap_or("?"),
                    d["lineNumber"],
                ));
            }
            Event::LogEntryAdded(e) => {
                let p = as_json(&e.params);
                let entry = &p["entry"];
                let level = entry["level"].as_str().unwrap_or_default();
                if matches!(level, "error" | "warning") {
                    self.problems.push(format!(
                        "log {level} ({}): {} {}",
                        entry["source"].as_str().unwrap_or("?"),
                        entry["text"].as_str().unwrap_or_default(),
                        entry["url"].as_str().unwrap_or_default(),
                    ));
                }
            }
            Event::NetworkRequestWillBeSent(e) => {
                let p = as_json(&e.params);
                self.requests.push(p["request"]["url"].as_str().unwrap_or("(no url)").to_string());
            }
            _ => {}
        }
    }
}

fn as_json<T: serde::Serialize>(params: &T) -> Value {
    serde_json::to_value(params).unwrap_or_default()
}

/// A console argument (a `Runtime.RemoteObject`) as text.
fn remote_text(object: &Value) -> String {
    match (&object["value"], object["description"].as_str()) {
        (Value::String(s), _) => s.clone(),
        (Value::Null, Some(description)) => description.to_string(),
        (Value::Null, None) => object["type"].to_string(),
        (value, _) => value.to_string(),
    }
}

/// Installed before the page's own scripts: the same problems seen from inside the page, in case
/// an event of a newer Chromium does not parse with this crate's protocol and never reaches
/// `Recorded` (the crate drops such events silently). Capturing `error` also catches a picture
/// that fails to load.
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

/// Opens every `<details>` first (a reader can), so that collapsed plots are laid out and measured.
const PROBE: &str = r#"JSON.stringify((() => {
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
  return {
    href: location.href,
    sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
    images,
    svgs,
    text: body.textContent,
    problems: window.__variorumProblems || ['the in-page recorder did not run'],
    resources: performance.getEntriesByType('resource').map(e => e.name),
  };
})())"#;

/// What was recorded while the report loaded, and what the page says about itself afterwards.
#[derive(Debug)]
struct Page {
    /// The `file://` URL navigated to.
    url: String,
    recorded: Recorded,
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

/// Launches `chromium` headless, loads `html` with the Runtime, Log and Network domains recording,
/// probes the page, and closes the browser.
fn load(chromium: &Path, html: &Path) -> anyhow::Result<Page> {
    let options = LaunchOptions::default_builder()
        .path(Some(chromium.to_path_buf()))
        .headless(true)
        .sandbox(false) // CI runs as root, where Chromium refuses to start sandboxed
        .window_size(Some((1280, 1024)))
        .args(vec![OsStr::new("--hide-scrollbars")])
        .idle_browser_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| anyhow!("launch options: {e}"))?;
    let browser = Browser::new(options).context("launching the browser")?;
    let tab = browser.new_tab()?;
    tab.set_default_timeout(Duration::from_secs(20));

    // listening and recording before anything is enabled or loaded
    let recorded = Arc::new(Mutex::new(Recorded::default()));
    let sink = Arc::clone(&recorded);
    tab.add_event_listener(Arc::new(move |event: &Event| {
        sink.lock().unwrap_or_else(PoisonError::into_inner).record(event)
    }))?;
    tab.call_method(Runtime::Enable(None))?;
    tab.call_method(Log::Enable(None))?;
    tab.call_method(Network::Enable {
        max_total_buffer_size: None,
        max_resource_buffer_size: None,
        max_post_data_size: None,
        report_direct_socket_traffic: None,
        enable_durable_messages: None,
    })?;
    tab.call_method(CdpPage::AddScriptToEvaluateOnNewDocument {
        source: RECORDER.to_string(),
        world_name: None,
        include_command_line_api: None,
        run_immediately: None,
    })?;

    let url = file_url(html)?;
    tab.navigate_to(&url)?.wait_until_navigated().context("waiting for the navigation")?;
    // the report's load event (not about:blank's): every picture decoded, or failed
    let loaded = "location.protocol === 'file:' && document.readyState === 'complete'";
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = tab.evaluate(loaded, false)?.value;
        if state == Some(Value::Bool(true)) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the report did not finish loading in 15 s ({loaded}: {state:?})");
        std::thread::sleep(Duration::from_millis(100));
    }
    // events still on their way to the listener's thread
    std::thread::sleep(Duration::from_millis(300));

    let probe = tab.evaluate(PROBE, false)?.value.ok_or_else(|| anyhow!("the probe returned nothing"))?;
    let probe = probe.as_str().ok_or_else(|| anyhow!("the probe returned {probe}, not a JSON string"))?;
    let dom: Dom = serde_json::from_str(probe).context("the probe's JSON")?;
    let recorded = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    drop(tab);
    drop(browser); // kills the browser process
    Ok(Page { url, recorded, dom })
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

    let problems = &page.recorded.problems;
    assert!(
        problems.is_empty(),
        "the browser reported problems while loading the report:\n  {}",
        problems.join("\n  ")
    );
    assert!(page.dom.problems.is_empty(), "the page saw problems while loading:\n  {}", page.dom.problems.join("\n  "));

    let itself = |u: &String| *u == page.url || *u == page.dom.href;
    assert!(
        page.recorded.requests.iter().any(itself),
        "Network.requestWillBeSent was not seen for the report itself ({}), so the request check below means nothing; seen: {:?}",
        page.url,
        page.recorded.requests
    );
    let foreign: Vec<&String> = (page.recorded.requests.iter().chain(&page.dom.resources))
        .filter(|&u| !itself(u) && !u.starts_with("data:"))
        .collect();
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
