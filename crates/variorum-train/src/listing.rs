//! `variorum runs`: one row per run directory under a folder, so a user with forty runs can find
//! theirs — what it trains, how far it got, its best validation loss, its speed, and whether it
//! finished.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::checkpoint;
use crate::config::ExperimentConfig;
use crate::metrics;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// `summary.json` written: the run reached its last step.
    Finished,
    /// A training holds the run's lock now.
    Running,
    /// Stopped before its last step with a checkpoint to `--resume` from.
    Interrupted,
    /// Stopped with no checkpoint, or its last logged loss is not finite.
    Failed,
    /// Weights written without training in this directory (`variorum collaborate`).
    Converted,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// The run directory.
    pub dir: PathBuf,
    /// `attention kind / position kind`, `d_model × n_layers`.
    pub model: String,
    /// The step of the last metrics row.
    pub steps_done: u64,
    /// Steps the run trains for (`train.steps`; 0 when its config does not parse).
    pub steps: u64,
    /// The lowest finite validation loss logged, nats per token.
    pub best_val_loss: Option<f64>,
    /// The last logged training throughput.
    pub tokens_per_sec: Option<f64>,
    /// Where the run stands.
    pub status: Status,
}

/// Every run directory (one holding `config.toml`) under `root`, at most three levels down,
/// sorted by path. A directory whose config does not parse is listed as failed, its message in
/// place of the model.
pub fn list(root: &Path) -> Result<Vec<RunRow>> {
    if !root.is_dir() {
        bail!(
            "{} is not a directory of runs (train with `variorum train CONFIG --out {}/NAME`)",
            root.display(),
            root.display()
        );
    }
    let mut dirs = Vec::new();
    find(root, 0, &mut dirs);
    dirs.sort();
    Ok(dirs.into_iter().map(|d| row(&d)).collect())
}

fn find(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if dir.join("config.toml").is_file() {
        out.push(dir.to_path_buf());
        return;
    }
    if depth >= 3 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let hidden = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
        if p.is_dir() && !hidden {
            find(&p, depth + 1, out);
        }
    }
}

/// Whether another process holds the run's lock (a training is writing into it). The probe
/// takes the lock for an instant when it is free.
fn locked(dir: &Path) -> bool {
    let Ok(file) = File::options().read(true).write(true).open(dir.join(".lock")) else { return false };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => false,
    }
}

/// The row of one run directory.
pub fn row(dir: &Path) -> RunRow {
    let rows = metrics::read(&dir.join("metrics.csv")).unwrap_or_default();
    let steps_done = rows.last().map_or(0, |r| r.step);
    let best_val_loss = rows.iter().filter_map(|r| r.val_loss).filter(|v| v.is_finite()).reduce(f64::min);
    let tokens_per_sec = rows.iter().rev().find_map(|r| r.tokens_per_sec);
    let diverged = rows.last().and_then(|r| r.train_loss).is_some_and(|l| !l.is_finite());
    let (model, steps) = match ExperimentConfig::load(&dir.join("config.toml")) {
        Ok(c) => {
            let m = &c.model;
            (format!("{} / {}, {} × {}", m.attention.kind(), m.position.kind(), m.d_model, m.n_layers), c.train.steps)
        }
        Err(e) => (format!("config: {e:#}"), 0),
    };
    let finished = dir.join("summary.json").is_file();
    let has_checkpoint = checkpoint::all(dir).map(|c| !c.is_empty()).unwrap_or(false);
    let status = if locked(dir) {
        Status::Running
    } else if diverged || steps == 0 {
        Status::Failed
    } else if finished {
        Status::Finished
    } else if has_checkpoint {
        Status::Interrupted
    } else if rows.is_empty() && dir.join("model.bpk").is_file() {
        Status::Converted
    } else {
        Status::Failed
    };
    RunRow { dir: dir.to_path_buf(), model, steps_done, steps, best_val_loss, tokens_per_sec, status }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_run(dir: &Path, metrics: &str, summary: bool, checkpoint_step: Option<u64>) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("config.toml"),
            "[model]\nd_model = 32\nn_layers = 2\n[data]\ndataset = \"shakespeare\"\n[train]\nsteps = 20\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("metrics.csv"),
            format!("step,train_loss,val_loss,lr,grad_norm,tokens_per_sec,elapsed_sec,aux\n{metrics}"),
        )
        .unwrap();
        if summary {
            std::fs::write(dir.join("summary.json"), "{}").unwrap();
        }
        if let Some(step) = checkpoint_step {
            let st = checkpoint::TrainState { step, ..Default::default() };
            checkpoint::save(dir, &st, 2, |d| Ok(std::fs::write(d.join("model.bpk"), b"w")?)).unwrap();
        }
    }

    #[test]
    fn each_run_gets_its_status_best_loss_and_speed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write_run(&root.join("a/done"), "10,2.5,2.4,0.001,,900,1,\n20,2.1,2.2,0.001,,1000,2,\n", true, Some(20));
        write_run(&root.join("b"), "10,2.5,2.3,0.001,,800,1,\n", false, Some(10));
        write_run(&root.join("c"), "", false, None);
        write_run(&root.join("d"), "10,2.5,2.6,0.001,,800,1,\n15,NaN,,0.001,,800,1,\n", false, Some(10));
        std::fs::create_dir_all(root.join("not-a-run/deeper")).unwrap();
        let rows = list(root).unwrap();
        let names: Vec<String> = rows.iter().map(|r| r.dir.strip_prefix(root).unwrap().display().to_string()).collect();
        assert_eq!(names, ["a/done", "b", "c", "d"]);
        let status: Vec<Status> = rows.iter().map(|r| r.status).collect();
        assert_eq!(status, [Status::Finished, Status::Interrupted, Status::Failed, Status::Failed], "{rows:?}");
        assert_eq!((rows[0].steps_done, rows[0].steps), (20, 20));
        assert_eq!(rows[0].best_val_loss, Some(2.2));
        assert_eq!(rows[0].tokens_per_sec, Some(1000.0));
        assert_eq!(rows[1].best_val_loss, Some(2.3));
        assert_eq!(rows[3].best_val_loss, Some(2.6));
        assert!(rows[0].model.contains("full") && rows[0].model.contains("32 × 2"), "{}", rows[0].model);

        // a training holding the lock is running, whatever else the directory holds
        let _held = crate::lock::RunLock::acquire(&root.join("b")).unwrap();
        // (the lock is per open file description: a second open in this process still sees it)
        assert_eq!(list(root).unwrap()[1].status, Status::Running);

        let e = list(&root.join("nope")).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("not a directory of runs"), "{e}");
    }
}
