//! Progress bars on stderr for the commands that take a while (`train`, `eval`, `bench-attention`,
//! `export`).
//!
//! They draw only when stderr is a terminal: `ProgressDrawTarget::stderr()` is
//! `ProgressDrawTarget::term(Term::buffered_stderr(), 20)`, and `term` returns a hidden target when
//! `!term.is_term() || is_dumb()` (indicatif 0.18, `src/draw_target.rs`). So piped or redirected
//! output, tests and CI see nothing, and stdout is never written to. Print to stdout through
//! [`ProgressBar::suspend`] while a bar is up, so a row does not land on the bar's line.
//!
//! A bar dropped unfinished (an early return on an error) clears itself: `ProgressFinish::AndClear`
//! is indicatif's default finish.

use std::time::Duration;

pub use indicatif::ProgressBar;
use indicatif::{ProgressDrawTarget, ProgressStyle};

/// The bar's layout, the same for every command.
pub const TEMPLATE: &str = "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}";

/// The bar style of [`TEMPLATE`].
pub fn style() -> ProgressStyle {
    ProgressStyle::with_template(TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// A bar of `len` steps on stderr with the message `what` (change it with `set_message`); it
/// ticks on its own, so the clock moves during a long step.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        .with_style(style())
        .with_message(what.to_string());
    steady(&pb);
    pb
}

/// A spinner on stderr with the message `what`, for work that cannot be counted.
pub fn spinner(what: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_style(style)
        .with_message(what.to_string());
    steady(&pb);
    pb
}

/// Redraws `pb` ten times a second; no ticker thread for a hidden bar.
fn steady(pb: &ProgressBar) {
    if !pb.is_hidden() {
        pb.enable_steady_tick(Duration::from_millis(100));
    }
}

/// `variorum prepare`'s bar (also drawn when `train` prepares its sources first): bytes of
/// the sources read, with bytes/s, documents/s and the ETA.
pub fn prepare_bar() -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {msg} ETA {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr()).with_style(style);
    steady(&pb);
    pb
}
