//! Neighbour tables: for every position of a text, the values (next tokens) of its `k` nearest
//! entries in a datastore, searched once and kept on disk. SPALM (Yogatama et al. 2021) reads
//! them while it trains and is scored: its keys and queries come from a pretrained model and stay
//! fixed, so what a position retrieves depends on the text alone.
//!
//! A table is a directory of two files (little-endian):
//!
//! | file | contents |
//! |---|---|
//! | `neighbours.json` | [`TableMeta`]: format and version, what was searched ([`TableOrigin`]), rows committed, whether complete |
//! | `neighbours.u32` | `positions × k` u32: row `p` holds, nearest first, the values of the entries nearest to the context ending at token `p` of the text; [`NONE`] where fewer were found |
//!
//! Row `p` serves the prediction of token `p + 1`, as entry `p` of a datastore does. Writing
//! resumes as a datastore's does: rows are appended in groups, each synced before
//! `neighbours.json` (replaced atomically) counts it, and a restart truncates the file to the
//! count. Reading maps the rows into memory.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::datastore::{check_format, short, write_json};
use crate::error::{Result, RetrievalError};

/// The table's description, [`TableMeta`] as JSON.
pub const TABLE_META: &str = "neighbours.json";
/// The rows: `positions × k` u32, nearest first, [`NONE`] where fewer were found.
pub const TABLE_FILE: &str = "neighbours.u32";
/// A slot with no neighbour.
pub const NONE: u32 = u32::MAX;
const FORMAT: &str = "variorum-neighbours";
const VERSION: u32 = 1;

/// What a table was searched from: two searches with the same origin write the same table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableOrigin {
    /// The datastore searched (where it was; moving it changes nothing).
    pub datastore: String,
    /// SHA-256 of the datastore's text, which identifies it with its run's weights.
    pub datastore_text_sha256: String,
    /// SHA-256 of the weights that computed the datastore's keys and the queries.
    pub weights_sha256: String,
    /// The text whose positions the rows follow, in words (`val split of data/…`).
    pub text: String,
    /// SHA-256 of its token ids (u32 little-endian).
    pub text_sha256: String,
    /// Rows: one per predicted position of the text (its tokens − 1).
    pub positions: u64,
    /// Values per row.
    pub k: usize,
    /// When the text is the datastore's own: entries within this many positions of a row's own
    /// are never retrieved for it (its own entry, which holds the token it predicts, among
    /// them). `None` for any other text.
    pub exclude_radius: Option<u64>,
    /// Candidates the HNSW search explored per query.
    pub ef: usize,
}

/// `neighbours.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableMeta {
    /// `variorum-neighbours`.
    pub format: String,
    /// Version of the format; a reader refuses any other.
    pub version: u32,
    /// What was searched.
    pub origin: TableOrigin,
    /// Rows written to `neighbours.u32` (synced).
    pub done: u64,
    /// Every position has its row.
    pub complete: bool,
}

impl TableMeta {
    fn read(dir: &Path) -> Result<Option<TableMeta>> {
        let path = dir.join(TABLE_META);
        if !path.is_file() {
            return Ok(None);
        }
        let text = fs::read_to_string(&path).map_err(RetrievalError::io(&path))?;
        let meta: TableMeta = serde_json::from_str(&text).map_err(|e| {
            RetrievalError::invalid(&path, format!("is not a neighbour table description ({e}): the table is damaged"))
        })?;
        check_format(&path, (&meta.format, meta.version), (FORMAT, VERSION))?;
        Ok(Some(meta))
    }

    fn bytes(&self, rows: u64, path: &Path) -> Result<u64> {
        rows.checked_mul(self.origin.k as u64).and_then(|x| x.checked_mul(4)).ok_or_else(|| {
            RetrievalError::invalid(path, "describes more rows than a file can hold: the table is damaged")
        })
    }
}

/// Writes a neighbour table, or continues one an interrupted search left.
pub struct TableWriter {
    dir: PathBuf,
    meta: TableMeta,
    file: File,
}

impl TableWriter {
    /// Opens `dir` for a table of `origin`: a new one in an absent or empty directory, or the
    /// one an earlier search of the same origin left there. Anything else is refused.
    pub fn create_or_resume(dir: &Path, origin: TableOrigin) -> Result<Self> {
        fs::create_dir_all(dir).map_err(RetrievalError::io(dir))?;
        let meta = match TableMeta::read(dir)? {
            // the same datastore moved elsewhere is still the same (its text and weights say so)
            Some(meta) if meta.origin == TableOrigin { datastore: meta.origin.datastore.clone(), ..origin.clone() } => {
                meta
            }
            Some(meta) => {
                let describe = |o: &TableOrigin| {
                    format!(
                        "{} ({} positions, text sha256 {}), k {}, exclusion {:?}, ef {}, datastore text sha256 {}",
                        o.text,
                        o.positions,
                        short(&o.text_sha256),
                        o.k,
                        o.exclude_radius,
                        o.ef,
                        short(&o.datastore_text_sha256)
                    )
                };
                return Err(RetrievalError::invalid(
                    dir,
                    format!(
                        "holds a neighbour table of {}; this search is of {}: remove it to search again",
                        describe(&meta.origin),
                        describe(&origin)
                    ),
                ));
            }
            None => {
                if fs::read_dir(dir).map_err(RetrievalError::io(dir))?.next().is_some() {
                    return Err(RetrievalError::invalid(
                        dir,
                        format!("is not empty and has no {TABLE_META}: it is not a neighbour table"),
                    ));
                }
                let meta = TableMeta { format: FORMAT.into(), version: VERSION, origin, done: 0, complete: false };
                write_json(dir, TABLE_META, &meta)?;
                meta
            }
        };
        let path = dir.join(TABLE_FILE);
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(RetrievalError::io(&path))?;
        let want = meta.bytes(meta.done, &path)?;
        let on_disk = file.metadata().map_err(RetrievalError::io(&path))?.len();
        if on_disk < want {
            return Err(RetrievalError::invalid(
                &path,
                format!("holds {on_disk} bytes where {TABLE_META} counts {want}: the table is damaged; remove it"),
            ));
        }
        // the group being written when the search stopped was never counted
        file.set_len(want).map_err(RetrievalError::io(&path))?;
        Ok(Self { dir: dir.to_path_buf(), meta, file })
    }

    /// The description, as committed so far.
    pub fn meta(&self) -> &TableMeta {
        &self.meta
    }

    /// Rows committed: the search continues with row `done()`.
    pub fn done(&self) -> u64 {
        self.meta.done
    }

    /// Appends a group of rows (`k` values each) and commits them; the table is complete once
    /// every position has its row.
    pub fn append(&mut self, rows: &[u32]) -> Result<()> {
        let k = self.meta.origin.k;
        assert_eq!(rows.len() % k, 0, "rows of {k} values");
        let n = (rows.len() / k) as u64;
        assert!(self.meta.done + n <= self.meta.origin.positions, "more rows than positions");
        let path = self.dir.join(TABLE_FILE);
        self.file.write_all(bytemuck::cast_slice(rows)).map_err(RetrievalError::io(&path))?;
        self.file.sync_data().map_err(RetrievalError::io(&path))?;
        self.meta.done += n;
        self.meta.complete = self.meta.done == self.meta.origin.positions;
        write_json(&self.dir, TABLE_META, &self.meta)
    }
}

/// A complete neighbour table, memory-mapped.
pub struct NeighbourTable {
    /// The directory it was opened from.
    pub dir: PathBuf,
    /// Its description (`neighbours.json`).
    pub meta: TableMeta,
    rows: Mmap,
}

impl NeighbourTable {
    /// Opens the table in `dir`, checking its file against its description and every value
    /// against `vocab_size`.
    pub fn open(dir: &Path, vocab_size: usize) -> Result<Self> {
        let meta = TableMeta::read(dir)?.ok_or_else(|| {
            RetrievalError::invalid(dir, "holds no neighbour table (search one with `variorum datastore neighbours`)")
        })?;
        if !meta.complete {
            return Err(RetrievalError::invalid(
                dir,
                format!(
                    "is an unfinished neighbour table ({} of {} rows): run the same `variorum datastore neighbours` again to finish it",
                    meta.done, meta.origin.positions
                ),
            ));
        }
        let path = dir.join(TABLE_FILE);
        let file = File::open(&path).map_err(RetrievalError::io(&path))?;
        let len = file.metadata().map_err(RetrievalError::io(&path))?.len();
        let want = meta.bytes(meta.origin.positions, &path)?;
        if len != want {
            return Err(RetrievalError::invalid(
                &path,
                format!(
                    "holds {len} bytes where {TABLE_META}'s {} rows need {want}: the table is damaged; remove it and search again",
                    meta.origin.positions
                ),
            ));
        }
        // SAFETY: read-only mapping of a finished table, which nothing writes any more.
        let rows = unsafe { Mmap::map(&file) }.map_err(RetrievalError::io(&path))?;
        let table = Self { dir: dir.to_path_buf(), meta, rows };
        if let Some(i) = table.values().iter().position(|&v| v != NONE && v as usize >= vocab_size) {
            return Err(RetrievalError::invalid(
                &path,
                format!(
                    "row {} holds token {} past the vocabulary of {vocab_size}: the table is damaged, or was searched for another model",
                    i / table.k(),
                    table.values()[i]
                ),
            ));
        }
        Ok(table)
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.meta.origin.k
    }

    /// Rows: the text's predicted positions.
    pub fn positions(&self) -> usize {
        self.meta.origin.positions as usize
    }

    fn values(&self) -> &[u32] {
        bytemuck::cast_slice(&self.rows[..])
    }

    /// Rows `from..from + n`, `k` values each, nearest first.
    pub fn rows(&self, from: usize, n: usize) -> &[u32] {
        let k = self.k();
        &self.values()[from * k..(from + n) * k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(positions: u64, k: usize) -> TableOrigin {
        TableOrigin {
            datastore: "ds".into(),
            datastore_text_sha256: "a".into(),
            weights_sha256: "b".into(),
            text: "val split".into(),
            text_sha256: "c".into(),
            positions,
            k,
            exclude_radius: None,
            ef: 64,
        }
    }

    #[test]
    fn a_table_resumes_where_it_was_committed_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("t");
        let mut w = TableWriter::create_or_resume(&d, origin(5, 2)).unwrap();
        w.append(&[1, 2, 3, NONE]).unwrap();
        // a group written but not counted (the search stopped mid-group) is dropped
        OpenOptions::new().append(true).open(d.join(TABLE_FILE)).unwrap().write_all(&[9u8; 8]).unwrap();
        drop(w);
        let e = NeighbourTable::open(&d, 10).err().unwrap().to_string();
        assert!(e.contains("unfinished neighbour table (2 of 5 rows)"), "{e}");
        let mut w = TableWriter::create_or_resume(&d, origin(5, 2)).unwrap();
        assert_eq!(w.done(), 2);
        w.append(&[4, 5, 6, 7, 8, 9]).unwrap();
        assert!(w.meta().complete);
        let t = NeighbourTable::open(&d, 10).unwrap();
        assert_eq!(t.rows(0, 5), &[1, 2, 3, NONE, 4, 5, 6, 7, 8, 9]);
        assert_eq!(t.rows(3, 1), &[6, 7]);
        // another model's vocabulary, another search's settings, a damaged file: refused
        let e = NeighbourTable::open(&d, 9).err().unwrap().to_string();
        assert!(e.contains("row 4 holds token 9 past the vocabulary of 9"), "{e}");
        let e = TableWriter::create_or_resume(&d, origin(5, 3)).err().unwrap().to_string();
        assert!(e.contains("k 2, exclusion None") && e.contains("this search is of val split (5 positions"), "{e}");
        OpenOptions::new().append(true).open(d.join(TABLE_FILE)).unwrap().write_all(&[0u8; 4]).unwrap();
        let e = NeighbourTable::open(&d, 10).err().unwrap().to_string();
        assert!(e.contains("holds 44 bytes where neighbours.json's 5 rows need 40"), "{e}");
    }
}
