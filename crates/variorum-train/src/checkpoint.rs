//! Checkpoints, written atomically.
//!
//! A checkpoint is a directory `checkpoints/step-00000500/` holding `model.bpk`, `optim.bpk`,
//! `state.json` (and `memory.bpk` for a memory model). It is written under a temporary name and renamed into place, then the
//! `checkpoints/latest` pointer is replaced by rename too: a crash at any moment leaves the previous
//! checkpoint and pointer intact.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Everything besides weights and optimizer moments that resuming needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps completed.
    pub step: u64,
    /// Sum and count of the training losses since the last metrics row.
    pub loss_sum: f64,
    /// Steps whose losses `loss_sum` holds.
    pub loss_count: u64,
    /// Last validation loss, if any.
    pub val_loss: Option<f64>,
    /// Training time so far (excluding evaluation and checkpointing), seconds.
    pub train_seconds: f64,
    /// A memory model's memories, saved beside the weights in `memory.bpk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::snapshot::MemoryLayout>,
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(bytes).with_context(|| format!("cannot write {}", tmp.path().display()))?;
    // NamedTempFile creates owner-only files; a run's files are ordinary documents.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(fs::Permissions::from_mode(0o644)).ok();
    }
    tmp.as_file().sync_all().ok();
    tmp.persist(path).map_err(|e| anyhow::anyhow!("cannot write {}: {}", path.display(), e.error))?;
    Ok(())
}

/// The directory of `run`'s checkpoints, `run/checkpoints`.
pub fn checkpoints_dir(run: &Path) -> PathBuf {
    run.join("checkpoints")
}

fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// Saves a checkpoint for `state.step`. `write` fills a directory with `model.bpk` and
/// `optim.bpk`; this function adds `state.json`, renames it into place, updates `latest` and
/// removes checkpoints beyond the `keep` newest.
pub fn save(run: &Path, state: &TrainState, keep: usize, write: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let dir = checkpoints_dir(run);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = step_dir_name(state.step);
    let tmp = dir.join(format!(".{name}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove stale {}", tmp.display()))?;
    }
    fs::create_dir_all(&tmp)?;
    write(&tmp)?;
    fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(state)?)?;
    let target = dir.join(&name);
    if target.exists() {
        fs::remove_dir_all(&target).with_context(|| format!("cannot replace {}", target.display()))?;
    }
    fs::rename(&tmp, &target).with_context(|| format!("cannot move checkpoint into {}", target.display()))?;
    write_atomic(&dir.join("latest"), name.as_bytes())?;
    prune(&dir, keep, &name)?;
    Ok(target)
}

/// Writes the optimizer's state to `path` (burnpack) with its tensors in name order. Burn's
/// `ModuleOptimizer::save` lays them out in the order of a `HashMap` of parameters, which is
/// random per process: two runs of one seed wrote the same numbers in different orders, so their
/// checkpoints differed byte for byte. The names are the parameters' ids with the state's
/// fields, and the ids come from the parameters' paths (`ModelConfig::init`), so the file is a
/// function of the state. Loading reads tensors by name, so `ModuleOptimizer::load` reads it
/// as it reads Burn's own.
pub fn save_optimizer(optim: &burn::optim::ModuleOptimizer, path: &Path) -> Result<()> {
    let bytes = optim.into_bytes().map_err(|e| anyhow::anyhow!("{e}"))?;
    let reader = burn_pack::Reader::from_bytes(bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (scalars, metadata) = (reader.scalars().clone(), reader.metadata().clone());
    let mut tensors = reader.into_tensors().map_err(|e| anyhow::anyhow!("{e}"))?;
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut writer = burn_pack::Writer::new(tensors).auto_extension(false);
    for (key, value) in &scalars {
        writer = writer.with_scalar(key, *value);
    }
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    writer.write_to_file(path).map_err(|e| anyhow::anyhow!("{e}"))
}

fn prune(dir: &Path, keep: usize, latest: &str) -> Result<()> {
    let mut steps: Vec<String> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    steps.sort();
    let excess = steps.len().saturating_sub(keep);
    for name in steps.into_iter().take(excess).filter(|n| n != latest) {
        fs::remove_dir_all(dir.join(&name)).ok();
    }
    Ok(())
}

/// Every checkpoint of a run, newest first (by step, whatever `latest` says or whether it
/// exists), each with its state or why that cannot be read — what resuming chooses from.
pub fn all(run: &Path) -> Result<Vec<(PathBuf, Result<TrainState, String>)>> {
    let dir = checkpoints_dir(run);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names
        .into_iter()
        .map(|n| {
            let step = dir.join(n);
            let path = step.join("state.json");
            let state = fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("{} is corrupt: {e}", path.display())));
            (step, state)
        })
        .collect())
}

/// The newest of `checkpoints` (as [`all`] lists them) for which `load` succeeds: its
/// directory, what `load` made of it, and why each newer one was skipped. An error lists why
/// every one failed.
pub fn newest_that_loads<T>(
    checkpoints: &[(PathBuf, Result<TrainState, String>)],
    mut load: impl FnMut(&Path, &Result<TrainState, String>) -> Result<T>,
) -> Result<(PathBuf, T, Vec<String>)> {
    let mut skipped = Vec::new();
    for (dir, state) in checkpoints {
        match load(dir, state) {
            Ok(loaded) => return Ok((dir.clone(), loaded, skipped)),
            Err(e) => skipped.push(format!("{e:#}")),
        }
    }
    bail!("no checkpoint loads: {}", skipped.join("; "))
}

/// `f`, with a panic inside it returned as its message: Burn's optimizer record loader panics on
/// some damaged files (a tensor whose declared rank and data disagree) where it could return an
/// error. The panic hook is silenced meanwhile (a load runs before training starts its threads).
pub fn without_panic<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    out.map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("it could not be read");
        // one line, and short: Burn's message spans several
        let msg: String = msg.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(300).collect();
        format!("damaged ({msg})")
    })
}

/// The latest checkpoint of a run, if there is one: its directory and state.
pub fn latest(run: &Path) -> Result<Option<(PathBuf, TrainState)>> {
    let pointer = checkpoints_dir(run).join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = fs::read_to_string(&pointer).with_context(|| format!("cannot read {}", pointer.display()))?;
    let dir = checkpoints_dir(run).join(name.trim());
    if !dir.is_dir() {
        bail!(
            "{} points to {}, which does not exist: the checkpoint directory is damaged",
            pointer.display(),
            dir.display()
        );
    }
    let state_path = dir.join("state.json");
    let text = fs::read_to_string(&state_path).with_context(|| format!("cannot read {}", state_path.display()))?;
    let state: TrainState =
        serde_json::from_str(&text).with_context(|| format!("checkpoint state {} is corrupt", state_path.display()))?;
    Ok(Some((dir, state)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_loading_is_an_error_with_its_message() {
        assert_eq!(without_panic(|| 3), Ok(3));
        let e = without_panic(|| -> u8 { panic!("rank 7,\n  given [48]") }).unwrap_err();
        assert_eq!(e, "damaged (rank 7, given [48])");
    }

    #[test]
    fn keeps_the_newest_and_points_latest_at_the_last() {
        let run = tempfile::tempdir().unwrap();
        for step in [10, 20, 30] {
            let st = TrainState { step, ..Default::default() };
            save(run.path(), &st, 2, |d| Ok(fs::write(d.join("model.bpk"), b"w")?)).unwrap();
        }
        let (dir, st) = latest(run.path()).unwrap().unwrap();
        assert_eq!(st.step, 30);
        assert!(dir.ends_with("step-00000030"));
        assert!(!checkpoints_dir(run.path()).join("step-00000010").exists());
        assert!(checkpoints_dir(run.path()).join("step-00000020").exists());
    }

    #[test]
    fn a_failed_write_leaves_the_previous_checkpoint() {
        let run = tempfile::tempdir().unwrap();
        let st = TrainState { step: 5, ..Default::default() };
        save(run.path(), &st, 2, |d| Ok(fs::write(d.join("model.bpk"), b"w")?)).unwrap();
        let st2 = TrainState { step: 6, ..Default::default() };
        assert!(save(run.path(), &st2, 2, |_| bail!("disk full")).is_err());
        let (_, st) = latest(run.path()).unwrap().unwrap();
        assert_eq!(st.step, 5);
    }

    #[test]
    fn corrupt_state_is_a_clear_error() {
        let run = tempfile::tempdir().unwrap();
        let st = TrainState { step: 5, ..Default::default() };
        let dir = save(run.path(), &st, 2, |_| Ok(())).unwrap();
        fs::write(dir.join("state.json"), b"{not json").unwrap();
        let e = format!("{:#}", latest(run.path()).unwrap_err());
        assert!(e.contains("corrupt") && e.contains("state.json"), "{e}");
    }
}
