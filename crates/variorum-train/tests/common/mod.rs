//! Shared by the integration tests of this crate.

use std::path::{Path, PathBuf};

/// Burn's CPU backends seed one process-wide RNG: tests that rely on seeded initialisation or
/// dropout must not run concurrently with each other.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A small text with enough structure to learn from (~20 kB), written to `dir/corpus.txt`.
#[allow(dead_code)] // not every test binary trains
pub fn corpus(dir: &Path) -> PathBuf {
    let mut text = String::new();
    let words = ["to be", "or not", "that is", "the question", "whether", "'tis nobler", "in the mind", "to suffer"];
    for i in 0..1500 {
        text.push_str(words[(i * 7 + i / 3) % words.len()]);
        text.push(if i % 11 == 10 { '\n' } else { ' ' });
    }
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).unwrap();
    path
}
