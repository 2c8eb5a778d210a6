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

/// A tiny full-attention model (2 layers, d_model 32, context 16) training 20 steps on `corpus`,
/// evaluating and checkpointing every 5.
#[allow(dead_code)] // not every test binary trains
pub fn tiny_config(corpus: &Path, dropout: f64) -> variorum_train::ExperimentConfig {
    let text = format!(
        r#"
[model]
d_model = 32
n_layers = 2
seq_len = 16
dropout = {dropout}
[model.attention]
kind = "full"
n_heads = 4
[data]
path = "{}"
[train]
steps = 20
batch_size = 4
warmup_steps = 4
lr = 3e-3
eval_interval = 5
eval_batches = 2
log_interval = 5
checkpoint_interval = 5
sample_tokens = 20
"#,
        corpus.display()
    );
    variorum_train::ExperimentConfig::parse(&text, false).unwrap()
}
