//! `eval.json`: the losses `variorum eval` measured for a run, kept in the run directory so its
//! report shows the table at every length evaluated. One row per (data, length, stride); a new
//! measurement replaces the old one of the same key.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomic;

/// The file of a run directory holding its evaluations.
pub const EVAL_FILE: &str = "eval.json";

/// One measured loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    /// What was read: "the validation split" or a file's path.
    pub data: String,
    /// Window length: the tokens of context a window reads.
    pub seq_len: usize,
    /// Tokens between window starts (`seq_len` for disjoint windows); absent for readings without
    /// windows (memory models read as streams).
    pub stride: Option<usize>,
    /// How the model was read when not plainly ("masked", "with memory", "without memory").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reading: Option<String>,
    /// Tokens scored.
    pub tokens: usize,
    /// Mean loss per token, nats.
    pub loss: f64,
    /// An encoder–decoder's chrF (sacreBLEU's chrF2) on the validation examples it decoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrf: Option<f64>,
    /// The weights measured, relative to the run directory (`model.bpk`, or a checkpoint's for
    /// a run still training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
}

impl EvalRow {
    fn key(&self) -> (&str, usize, Option<usize>, Option<&str>) {
        (&self.data, self.seq_len, self.stride, self.reading.as_deref())
    }
}

/// The rows recorded for the run in `dir` (none when it was never evaluated).
pub fn read(dir: &Path) -> Result<Vec<EvalRow>> {
    let path = dir.join(EVAL_FILE);
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not an evaluation record", path.display()))
}

/// Adds `rows` to the record of `dir`, replacing rows measured with the same data, length,
/// stride and reading; sorted by data, then length. Written atomically. A damaged record is
/// replaced (it only caches measurements).
pub fn record(dir: &Path, rows: &[EvalRow]) -> Result<()> {
    let mut all = read(dir).unwrap_or_default();
    all.retain(|old| rows.iter().all(|new| new.key() != old.key()));
    all.extend(rows.iter().cloned());
    all.sort_by(|a, b| {
        (&a.data, a.reading.as_deref(), a.seq_len, a.stride).cmp(&(&b.data, b.reading.as_deref(), b.seq_len, b.stride))
    });
    write_atomic(&dir.join(EVAL_FILE), serde_json::to_string_pretty(&all)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq_len: usize, loss: f64) -> EvalRow {
        EvalRow {
            data: "the validation split".into(),
            seq_len,
            stride: Some(seq_len),
            reading: None,
            tokens: 100,
            loss,
            chrf: None,
            weights: Some("model.bpk".into()),
        }
    }

    #[test]
    fn a_new_measurement_replaces_the_old_one_of_its_length() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        record(dir.path(), &[row(64, 2.0), row(32, 2.5)]).unwrap();
        record(dir.path(), &[row(64, 1.5)]).unwrap();
        assert_eq!(read(dir.path()).unwrap(), vec![row(32, 2.5), row(64, 1.5)]);
        std::fs::write(dir.path().join(EVAL_FILE), "{not json").unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains("not an evaluation record"));
        record(dir.path(), &[row(16, 3.0)]).unwrap();
        assert_eq!(read(dir.path()).unwrap(), vec![row(16, 3.0)]);
    }
}
