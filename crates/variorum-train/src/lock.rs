//! One training per run directory: `RUN/.lock`, held with an exclusive advisory lock for as long
//! as the training runs. The operating system drops the lock when the process ends, however it
//! ends, so a killed run leaves nothing that blocks `--resume`; a second training into the same
//! directory is refused with the holder's process id. (std's `File::try_lock`: flock on Unix,
//! LockFileEx on Windows; no crate needed.)

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Held while a training writes into a run directory; dropping it releases the directory.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes `run/.lock` (the directory must exist), or says who holds it.
    pub fn acquire(run: &Path) -> Result<Self> {
        let path = run.join(".lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() { "another process".to_string() } else { holder.to_string() };
                bail!(
                    "{} is in use by another training ({holder}): wait for it to finish, or train into another --out",
                    run.display()
                );
            }
            Err(TryLockError::Error(e)) => bail!("cannot lock {}: {e}", path.display()),
        }
        // who holds it, for the message a second training prints
        file.set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "process {}", std::process::id()))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path()).unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("in use by another training"), "{err}");
        assert!(err.contains(&format!("process {}", std::process::id())), "names the holder: {err}");
        assert!(!err.contains('\n'));
        drop(first);
        // released: a later training (or --resume after a kill) takes it
        let again = RunLock::acquire(dir.path());
        assert!(again.is_ok(), "{again:?}");
    }
}
