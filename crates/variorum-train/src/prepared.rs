//! Preparing a corpus of many sources (`variorum prepare`, and `train` before it reads one),
//! with a progress bar.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use variorum_data::{DataConfig, PrepareProgress, Prepared};

/// Prepares `data.sources` into `out` (default `data.prepared`); nothing is done when the
/// directory already holds them unchanged. The bar shows bytes read, bytes/s, documents/s and
/// the ETA.
pub fn prepare_corpus(data: &DataConfig, out: Option<&Path>) -> Result<Prepared> {
    let pb = crate::progress::prepare_bar();
    let start = Instant::now();
    let tell = |p: &PrepareProgress| {
        pb.set_length(p.bytes_total);
        pb.set_position(p.bytes_read);
        let secs = start.elapsed().as_secs_f64().max(1e-3);
        let what = if p.phase == "tokenizer" { "learning the tokenizer" } else { "shards" };
        pb.set_message(format!(
            "{what}: {} documents ({:.0}/s), {} shards",
            p.documents,
            p.documents as f64 / secs,
            p.shards
        ));
    };
    let prepared = variorum_data::prepare(data, out, &tell)?;
    pb.finish_and_clear();
    Ok(prepared)
}
