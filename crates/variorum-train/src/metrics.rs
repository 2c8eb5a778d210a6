//! `metrics.csv`: one row per logging interval, validation loss on evaluation rows, and the
//! auxiliary losses (weighted, mean over the interval) as `name=value;name=value` in the last
//! column.
//!
//! Written by hand rather than with a CSV crate: every field is a number or a name without
//! commas, so there is nothing to quote or escape.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The first line of `metrics.csv`: its columns.
pub const HEADER: &str = "step,train_loss,val_loss,lr,grad_norm,tokens_per_sec,elapsed_sec,aux";

/// One line of `metrics.csv`: one logging interval. An empty field reads as `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// Optimizer steps done at the end of the interval.
    pub step: u64,
    /// Mean training loss over the interval, nats per token.
    pub train_loss: Option<f64>,
    /// Validation loss, on evaluation rows only.
    pub val_loss: Option<f64>,
    /// Learning rate of the interval's last step.
    pub lr: f64,
    /// Global gradient norm of the interval's last step, before clipping.
    pub grad_norm: Option<f64>,
    /// Training tokens per second over the interval (evaluation excluded).
    pub tokens_per_sec: Option<f64>,
    /// Training time so far, seconds (evaluation and checkpointing excluded).
    pub elapsed_sec: f64,
    /// Auxiliary losses by name.
    pub aux: Vec<(String, f64)>,
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.6}")).unwrap_or_default()
}

impl Row {
    fn to_line(&self) -> String {
        let aux: Vec<String> = self.aux.iter().map(|(n, v)| format!("{n}={v:.6e}")).collect();
        format!(
            "{},{},{},{:.6e},{},{},{:.3},{}",
            self.step,
            opt(self.train_loss),
            opt(self.val_loss),
            self.lr,
            opt(self.grad_norm),
            self.tokens_per_sec.map(|x| format!("{x:.1}")).unwrap_or_default(),
            self.elapsed_sec,
            aux.join(";")
        )
    }

    fn parse(line: &str) -> Option<Row> {
        let f: Vec<&str> = line.split(',').collect();
        // 7 fields: runs written before the aux column existed
        if f.len() != 7 && f.len() != 8 {
            return None;
        }
        // an empty field is a missing value; one that does not parse makes the row damaged
        let num = |s: &str| if s.is_empty() { Some(None) } else { s.parse::<f64>().ok().map(Some) };
        Some(Row {
            step: f[0].parse().ok()?,
            train_loss: num(f[1])?,
            val_loss: num(f[2])?,
            lr: num(f[3])?.unwrap_or(0.0),
            grad_norm: num(f[4])?,
            tokens_per_sec: num(f[5])?,
            elapsed_sec: num(f[6])?.unwrap_or(0.0),
            aux: f
                .get(7)
                .into_iter()
                .flat_map(|a| a.split(';'))
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect(),
        })
    }
}

/// A run's `metrics.csv`, written one row at a time.
pub struct MetricsLog {
    path: PathBuf,
}

impl MetricsLog {
    /// Starts a fresh log, or — when resuming from `resume_step` — keeps the rows up to that step
    /// and drops the ones written after it (they will be written again).
    pub fn open(run: &Path, resume_step: Option<u64>) -> Result<Self> {
        let path = run.join("metrics.csv");
        let kept: Vec<Row> = match resume_step {
            Some(step) if path.exists() => {
                // The log is a record, not training state: damaged rows are dropped, and a log
                // that cannot be read is started afresh — never a reason to refuse a resume.
                match read_counting(&path) {
                    Ok((rows, damaged)) => {
                        if damaged > 0 {
                            eprintln!("note: {}: {damaged} damaged row(s) dropped", path.display());
                        }
                        rows.into_iter().filter(|r| r.step <= step).collect()
                    }
                    Err(e) => {
                        eprintln!("note: {e:#}; the metrics log starts afresh");
                        Vec::new()
                    }
                }
            }
            _ => Vec::new(),
        };
        let mut text = format!("{HEADER}\n");
        for r in &kept {
            text.push_str(&r.to_line());
            text.push('\n');
        }
        crate::checkpoint::write_atomic(&path, text.as_bytes())?;
        Ok(Self { path })
    }

    /// Appends `row` to the file.
    pub fn append(&self, row: &Row) -> Result<()> {
        let mut f = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .with_context(|| format!("cannot append to {}", self.path.display()))?;
        writeln!(f, "{}", row.to_line())?;
        Ok(())
    }

    /// Every row written so far (damaged lines skipped).
    pub fn rows(&self) -> Result<Vec<Row>> {
        read(&self.path)
    }
}

/// The rows of a metrics log; lines that are not rows (damaged ones) are skipped.
pub fn read(path: &Path) -> Result<Vec<Row>> {
    Ok(read_counting(path)?.0)
}

/// The rows, and how many lines after the header are not rows.
fn read_counting(path: &Path) -> Result<(Vec<Row>, usize)> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().skip(1).filter(|l| !l.is_empty()).collect();
    let rows: Vec<Row> = lines.iter().filter_map(|l| Row::parse(l)).collect();
    let damaged = lines.len() - rows.len();
    Ok((rows, damaged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_rows_are_dropped_not_a_reason_to_stop() {
        // found by the property tests (hostile_files.rs): one byte of the header made invalid
        // UTF-8 stopped --resume
        let dir = tempfile::tempdir().unwrap();
        let log = MetricsLog::open(dir.path(), None).unwrap();
        for step in [10, 20, 30] {
            log.append(&Row { step, lr: 1e-3, ..Default::default() }).unwrap();
        }
        let path = dir.path().join("metrics.csv");
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] ^= 128;
        let row2 = bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(1).unwrap().0 + 1;
        bytes[row2] = 0xff; // the row of step 20
        // the row of step 30 with a field that is not a number
        let row3 = bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(2).unwrap().0 + 1;
        let comma = row3 + bytes[row3..].iter().position(|&b| b == b',').unwrap();
        bytes[comma + 1] = b'x';
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_counting(&path).unwrap().1, 2);
        let log = MetricsLog::open(dir.path(), Some(30)).unwrap();
        let steps: Vec<u64> = log.rows().unwrap().iter().map(|r| r.step).collect();
        assert_eq!(steps, [10]);
    }

    #[test]
    fn resume_drops_rows_after_the_checkpoint() {
        let run = tempfile::tempdir().unwrap();
        let log = MetricsLog::open(run.path(), None).unwrap();
        for step in [10, 20, 30] {
            let aux = vec![("ponder".to_string(), 0.5), ("span".to_string(), 2e-3)];
            log.append(&Row { step, train_loss: Some(1.0), lr: 1e-3, aux, ..Default::default() }).unwrap();
        }
        let log = MetricsLog::open(run.path(), Some(20)).unwrap();
        let steps: Vec<u64> = log.rows().unwrap().iter().map(|r| r.step).collect();
        assert_eq!(steps, vec![10, 20]);
        let r = &log.rows().unwrap()[0];
        assert_eq!(r.train_loss, Some(1.0));
        assert_eq!(r.val_loss, None);
        assert_eq!(r.aux, vec![("ponder".to_string(), 0.5), ("span".to_string(), 2e-3)]);
    }
}
