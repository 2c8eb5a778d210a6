//! Helpers several commands share: the check of a numeric flag, and Ctrl-C handling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

/// A flag set by the first Ctrl-C (announcing `first`: what the command does now); the second
/// ends the process at once with exit code 130 (saying `second`: what is kept).
pub fn on_interrupt(first: &'static str, second: &'static str) -> Result<Arc<AtomicBool>> {
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
pub fn at_least<T: PartialOrd + std::fmt::Display>(flag: &str, value: T, min: T) -> Result<()> {
    if value < min {
        anyhow::bail!("{flag} {value} must be at least {min}");
    }
    Ok(())
}
