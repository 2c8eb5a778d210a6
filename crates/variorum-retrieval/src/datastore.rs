//! The datastore: (key, next token) pairs over a text, on disk, with their HNSW index.
//!
//! A datastore is a directory of four files (little-endian throughout):
//!
//! | file | contents |
//! |---|---|
//! | `datastore.json` | [`Meta`]: format and version, key width, entry count, what built it ([`Origin`]), the index's settings and progress |
//! | `keys.f32` | `entries × dim` f32: entry `i`'s key in row `i` |
//! | `values.u32` | `entries` u32: entry `i`'s value, the token that followed its context |
//! | `index.usearch` | the HNSW graph over the keys, usearch's own format (it holds a copy of the vectors); labels are entry ids |
//!
//! Entry ids follow the text: entry `i` is the context ending at token `i` of the text, and its
//! value is token `i + 1`. Scoring that same text, a causal search admits only entries whose
//! value the scorer has already read ([`crate::search`]).
//!
//! Writing is resumable: keys and values are appended in groups, each group synced before
//! `datastore.json` (replaced atomically) counts it; a restart truncates the files to the count
//! and continues. The index is saved to `index.usearch.partial` at checkpoints while it is
//! built, and renamed to `index.usearch` when complete. Reading maps the keys, values and index
//! into memory ([`memmap2`] and usearch's `view`): a datastore larger than memory is paged in
//! as it is searched.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RetrievalError};
use crate::search::{self, HnswParams, Neighbour, SearchMode};

/// The datastore's description, [`Meta`] as JSON.
pub const META_FILE: &str = "datastore.json";
/// The keys: `entries × dim` f32, entry `i`'s in row `i`.
pub const KEYS_FILE: &str = "keys.f32";
/// The values: `entries` u32, the token that followed each entry's context.
pub const VALUES_FILE: &str = "values.u32";
/// The complete HNSW index over the keys, in usearch's format.
pub const INDEX_FILE: &str = "index.usearch";
const PARTIAL_INDEX_FILE: &str = "index.usearch.partial";
const FORMAT: &str = "variorum-datastore";
const VERSION: u32 = 1;

#[cfg(not(target_endian = "little"))]
compile_error!(
    "the datastore's files are little-endian and read by mapping them: a big-endian target would need a converting reader"
);

/// What a datastore was built from. Two builds with the same origin write the same datastore,
/// so a build that finds one resumes it; a different origin is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The run directory whose model computed the keys.
    pub run: String,
    /// SHA-256 of the weights file the keys were computed with.
    pub weights_sha256: String,
    /// What a key is (`head-input`: the vector the output head reads).
    pub key: String,
    /// The text the entries come from, in words (`train split of data/…`).
    pub text: String,
    /// SHA-256 of the text's token ids (u32 little-endian), to recognise it when scoring.
    pub text_sha256: String,
    /// Tokens in the text.
    pub tokens: u64,
    /// The model's vocabulary: every value is below it.
    pub vocab_size: u32,
    /// Windows of `window` tokens every `stride` tokens computed the keys.
    pub window: usize,
    /// Tokens between window starts.
    pub stride: usize,
}

impl Origin {
    /// The fields in which `other` differs, in words.
    pub fn differences(&self, other: &Origin) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name} {a} ≠ {b}"));
            }
        };
        field("run", self.run.clone(), other.run.clone());
        field("weights sha256", short(&self.weights_sha256), short(&other.weights_sha256));
        field("key", self.key.clone(), other.key.clone());
        field("text", self.text.clone(), other.text.clone());
        field("text sha256", short(&self.text_sha256), short(&other.text_sha256));
        field("tokens", self.tokens.to_string(), other.tokens.to_string());
        field("vocabulary", self.vocab_size.to_string(), other.vocab_size.to_string());
        field("window", self.window.to_string(), other.window.to_string());
        field("stride", self.stride.to_string(), other.stride.to_string());
        out
    }
}

/// The first 12 characters of a hash, for messages.
pub fn short(hash: &str) -> String {
    let cut: String = hash.chars().take(12).collect();
    if cut.len() < hash.len() { format!("{cut}…") } else { cut }
}

/// Progress and settings of the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexMeta {
    /// `hnsw`.
    pub kind: String,
    /// The library and version that wrote `index.usearch`.
    pub library: String,
    /// The index's build settings (written flat, beside the other fields).
    #[serde(flatten)]
    pub params: HnswParams,
    /// Entries in the index so far (all of them once the datastore is complete).
    pub indexed: u64,
}

/// `datastore.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// `variorum-datastore`.
    pub format: String,
    /// Version of the format; a reader refuses any other.
    pub version: u32,
    /// Values per key.
    pub dim: usize,
    /// Entries written to `keys.f32` and `values.u32` (synced).
    pub entries: u64,
    /// Entries when every key is written.
    pub planned: u64,
    /// Keys written and the index built.
    pub complete: bool,
    /// What the datastore was built from.
    pub origin: Origin,
    /// The index's settings and progress.
    pub index: IndexMeta,
}

impl Meta {
    fn read(dir: &Path) -> Result<Option<Meta>> {
        let path = dir.join(META_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = fs::read_to_string(&path).map_err(RetrievalError::io(&path))?;
        let meta: Meta = serde_json::from_str(&text).map_err(|e| {
            RetrievalError::invalid(&path, format!("is not a datastore description ({e}): the datastore is damaged"))
        })?;
        check_format(&path, (&meta.format, meta.version), (FORMAT, VERSION))?;
        Ok(Some(meta))
    }

    fn write(&self, dir: &Path) -> Result<()> {
        write_json(dir, META_FILE, self)
    }
}

/// Refuses a description of another format or version than this build reads.
pub(crate) fn check_format(path: &Path, found: (&str, u32), reads: (&str, u32)) -> Result<()> {
    if found != reads {
        return Err(RetrievalError::invalid(
            path,
            format!(
                "format {:?} version {}, where this build reads {:?} version {}",
                found.0, found.1, reads.0, reads.1
            ),
        ));
    }
    Ok(())
}

/// Writes `value` as `dir/name` atomically: a temporary file, synced, renamed, the directory
/// synced.
pub(crate) fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<()> {
    let path = dir.join(name);
    let json = serde_json::to_string_pretty(value).expect("the description serialises");
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(RetrievalError::io(dir))?;
    tmp.write_all(json.as_bytes()).map_err(RetrievalError::io(tmp.path()))?;
    // NamedTempFile creates owner-only files; a datastore is an ordinary document
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(fs::Permissions::from_mode(0o644)).ok();
    }
    tmp.as_file().sync_all().map_err(RetrievalError::io(tmp.path()))?;
    tmp.persist(&path).map_err(|e| RetrievalError::Io { path: path.clone(), source: e.error })?;
    sync_dir(dir)
}

/// Bytes a datastore of `n` keys of `dim` values takes on disk (keys, values and index).
pub fn disk_estimate(n: u64, dim: usize, params: &HnswParams) -> u64 {
    n * (dim as u64 * 4 + 4) + params.memory_estimate(n, dim)
}

/// Writes a datastore, or continues one an interrupted build left.
pub struct DatastoreWriter {
    dir: PathBuf,
    meta: Meta,
    keys: File,
    values: File,
    /// How often the index is saved while it is built (5 minutes: each save writes the whole
    /// index so far, so saving often costs more I/O than the work it protects).
    pub checkpoint_every: Duration,
}

impl DatastoreWriter {
    /// Opens `dir` for a datastore of `planned` keys of `dim` values from `origin`: a new one in
    /// an absent or empty directory, or the one an earlier build of the same origin left there
    /// (its files truncated to what `datastore.json` counts). A datastore of another origin, or
    /// a directory holding something else, is refused.
    pub fn create_or_resume(dir: &Path, origin: Origin, dim: usize, planned: u64, params: HnswParams) -> Result<Self> {
        fs::create_dir_all(dir).map_err(RetrievalError::io(dir))?;
        let meta = match Meta::read(dir)? {
            Some(meta) => {
                let mut differ = meta.origin.differences(&origin);
                if meta.dim != dim {
                    differ.push(format!("key width {} ≠ {dim}", meta.dim));
                }
                if meta.index.params != params {
                    differ.push(format!("index settings {:?} ≠ {params:?}", meta.index.params));
                }
                if differ.is_empty() && meta.planned != planned {
                    differ.push(format!("entries {} ≠ {planned}", meta.planned));
                }
                if !differ.is_empty() {
                    return Err(RetrievalError::invalid(
                        dir,
                        format!(
                            "holds a datastore of {} built otherwise ({}): give another --out, or remove it",
                            meta.origin.text,
                            differ.join("; ")
                        ),
                    ));
                }
                let mut meta = meta;
                if meta.complete && !index_is_whole(dir, &meta) {
                    // the description outlived its index (removed, damaged): build the index again
                    meta.complete = false;
                    meta.index.indexed = 0;
                    meta.write(dir)?;
                }
                meta
            }
            None => {
                let mut entries = fs::read_dir(dir).map_err(RetrievalError::io(dir))?;
                if entries.next().is_some() {
                    return Err(RetrievalError::invalid(
                        dir,
                        format!("is not empty and has no {META_FILE}: it is not a datastore; give another --out"),
                    ));
                }
                let meta = Meta {
                    format: FORMAT.into(),
                    version: VERSION,
                    dim,
                    entries: 0,
                    planned,
                    complete: false,
                    origin,
                    index: IndexMeta {
                        kind: "hnsw".into(),
                        library: format!("usearch {}", usearch::version()),
                        params,
                        indexed: 0,
                    },
                };
                meta.write(dir)?;
                meta
            }
        };
        let open = |name: &str, len: u64| -> Result<File> {
            let path = dir.join(name);
            let f = OpenOptions::new().create(true).append(true).open(&path).map_err(RetrievalError::io(&path))?;
            let on_disk = f.metadata().map_err(RetrievalError::io(&path))?.len();
            if on_disk < len {
                return Err(RetrievalError::invalid(
                    &path,
                    format!(
                        "holds {on_disk} bytes where {META_FILE} counts {len}: the datastore is damaged; remove it and build again"
                    ),
                ));
            }
            // the group being written when the build stopped was never counted
            f.set_len(len).map_err(RetrievalError::io(&path))?;
            Ok(f)
        };
        let mp = dir.join(META_FILE);
        let keys = open(KEYS_FILE, bytes(&mp, meta.entries, dim as u64, 4)?)?;
        let values = open(VALUES_FILE, bytes(&mp, meta.entries, 1, 4)?)?;
        Ok(Self { dir: dir.to_path_buf(), meta, keys, values, checkpoint_every: Duration::from_secs(300) })
    }

    /// The description, as committed so far.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Entries written so far: the build continues with entry `entries()`.
    pub fn entries(&self) -> u64 {
        self.meta.entries
    }

    /// Appends a group of entries (`keys`: rows of `dim`) and commits them.
    pub fn append(&mut self, keys: &[f32], values: &[u32]) -> Result<()> {
        let dim = self.meta.dim;
        assert_eq!(keys.len(), values.len() * dim, "one key of {dim} values per value");
        let kp = self.dir.join(KEYS_FILE);
        let vp = self.dir.join(VALUES_FILE);
        self.keys.write_all(bytemuck::cast_slice(keys)).map_err(RetrievalError::io(&kp))?;
        self.values.write_all(bytemuck::cast_slice(values)).map_err(RetrievalError::io(&vp))?;
        self.keys.sync_data().map_err(RetrievalError::io(&kp))?;
        self.values.sync_data().map_err(RetrievalError::io(&vp))?;
        self.meta.entries += values.len() as u64;
        self.meta.write(&self.dir)
    }

    /// Builds the index over every key written, continuing from the last checkpoint, on the
    /// current rayon pool. `progress` hears how many entries are indexed; `stop` is asked between
    /// chunks and ends the build early with a checkpoint (returns `false`). Returns `true` once
    /// the datastore is complete.
    pub fn build_index(&mut self, mut progress: impl FnMut(u64), stop: &dyn Fn() -> bool) -> Result<bool> {
        if self.meta.complete {
            return Ok(true);
        }
        let dim = self.meta.dim;
        let n = self.meta.entries;
        let keys_path = self.dir.join(KEYS_FILE);
        let file = File::open(&keys_path).map_err(RetrievalError::io(&keys_path))?;
        // SAFETY: the file is ours and not written while mapped (the writer appends no more).
        let map = unsafe { Mmap::map(&file) }.map_err(RetrievalError::io(&keys_path))?;
        let keys: &[f32] = bytemuck::cast_slice(&map[..n as usize * dim * 4]);
        let partial = self.dir.join(PARTIAL_INDEX_FILE);
        let index = usearch::Index::new(&self.meta.index.params.options(dim))
            .map_err(|e| RetrievalError::index(&partial, e))?;
        let mut done = 0u64;
        if self.meta.index.indexed > 0 && partial.is_file() {
            index.load(&path_str(&partial)?).map_err(|e| RetrievalError::index(&partial, e))?;
            done = index.size() as u64;
            if done != self.meta.index.indexed {
                // an index saved after the description was: start it again rather than guess
                index.reset().map_err(|e| RetrievalError::index(&partial, e))?;
                done = 0;
            }
        }
        index
            .reserve_capacity_and_threads(n as usize, rayon::current_num_threads())
            .map_err(|e| RetrievalError::index(&partial, e))?;
        progress(done);
        let mut saved = Instant::now();
        const CHUNK: u64 = 4096;
        while done < n {
            let end = (done + CHUNK).min(n);
            (done..end).into_par_iter().try_for_each(|i| {
                let i = i as usize;
                index.add(i as u64, &keys[i * dim..(i + 1) * dim]).map_err(|e| RetrievalError::index(&partial, e))
            })?;
            done = end;
            progress(done);
            let stopping = stop();
            if done < n && (stopping || saved.elapsed() >= self.checkpoint_every) {
                self.save_partial(&index, done)?;
                saved = Instant::now();
            }
            if stopping && done < n {
                return Ok(false);
            }
        }
        self.save_index(&index, INDEX_FILE)?;
        self.meta.index.indexed = n;
        self.meta.complete = true;
        self.meta.write(&self.dir)?;
        fs::remove_file(&partial).ok();
        Ok(true)
    }

    fn save_partial(&mut self, index: &usearch::Index, done: u64) -> Result<()> {
        self.save_index(index, PARTIAL_INDEX_FILE)?;
        self.meta.index.indexed = done;
        self.meta.write(&self.dir)
    }

    /// Saves `index` as `name` atomically: a temporary file, synced, renamed, the directory synced.
    fn save_index(&self, index: &usearch::Index, name: &str) -> Result<()> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        index.save(&path_str(&tmp)?).map_err(|e| RetrievalError::index(&tmp, e))?;
        File::open(&tmp).and_then(|f| f.sync_all()).map_err(RetrievalError::io(&tmp))?;
        fs::rename(&tmp, &path).map_err(RetrievalError::io(&path))?;
        sync_dir(&self.dir)
    }
}

/// What the index returned as neighbours, every id checked against the `n` entries.
fn found_entries(found: usearch::ffi::Matches, n: u64, index: &Path) -> Result<Vec<Neighbour>> {
    if let Some(bad) = found.keys.iter().find(|&&id| id >= n) {
        return Err(RetrievalError::invalid(
            index,
            format!(
                "returned entry {bad} of a datastore of {n}: the index is damaged; remove the datastore and build it again"
            ),
        ));
    }
    Ok(found.keys.into_iter().zip(found.distances).map(|(id, distance)| Neighbour { id, distance }).collect())
}

/// Makes the renames in `dir` durable (a rename is an entry of the directory).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(RetrievalError::io(dir))
}

/// `a · b · c` bytes, or an error naming `path` when a damaged description makes it overflow.
fn bytes(path: &Path, a: u64, b: u64, c: u64) -> Result<u64> {
    a.checked_mul(b).and_then(|x| x.checked_mul(c)).ok_or_else(|| {
        RetrievalError::invalid(path, "describes more entries than a file can hold: the datastore is damaged")
    })
}

fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(str::to_owned).ok_or_else(|| RetrievalError::invalid(p, "the index library needs a UTF-8 path"))
}

/// A complete datastore, memory-mapped for searching.
pub struct Datastore {
    /// The directory it was opened from.
    pub dir: PathBuf,
    /// Its description (`datastore.json`).
    pub meta: Meta,
    keys: Mmap,
    values: Mmap,
    index: usearch::Index,
    /// usearch keeps `ef` in the index, shared by every search: one batch sets it at a time.
    search_lock: std::sync::Mutex<()>,
}

/// Whether `dir`'s index file opens and holds every entry of `meta`.
fn index_is_whole(dir: &Path, meta: &Meta) -> bool {
    let ip = dir.join(INDEX_FILE);
    let (Ok(path), Ok(index)) = (path_str(&ip), usearch::Index::new(&meta.index.params.options(meta.dim))) else {
        return false;
    };
    ip.is_file() && index.view(&path).is_ok() && index.size() as u64 == meta.entries && index.dimensions() == meta.dim
}

impl Datastore {
    /// Opens the datastore in `dir`, checking its description against its files.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(RetrievalError::invalid(dir, "does not exist (build one with `variorum datastore build`)"));
        }
        let meta = Meta::read(dir)?
            .ok_or_else(|| RetrievalError::invalid(dir, format!("has no {META_FILE}: it is not a datastore")))?;
        if !meta.complete {
            let stage = if meta.entries < meta.planned {
                format!("{} of {} entries written", meta.entries, meta.planned)
            } else {
                format!("{} of {} entries indexed", meta.index.indexed, meta.entries)
            };
            return Err(RetrievalError::invalid(
                dir,
                format!(
                    "is an unfinished datastore ({stage}): run the same `variorum datastore build` again to finish it"
                ),
            ));
        }
        let map = |name: &str, want: u64| -> Result<Mmap> {
            let path = dir.join(name);
            let file = File::open(&path).map_err(RetrievalError::io(&path))?;
            let len = file.metadata().map_err(RetrievalError::io(&path))?.len();
            if len != want {
                return Err(RetrievalError::invalid(
                    &path,
                    format!(
                        "holds {len} bytes where {META_FILE}'s {} entries need {want}: the datastore is damaged; remove it and build it again",
                        meta.entries
                    ),
                ));
            }
            // SAFETY: read-only mapping of a finished datastore, which nothing writes any more.
            unsafe { Mmap::map(&file) }.map_err(RetrievalError::io(&path))
        };
        let mp = dir.join(META_FILE);
        let keys = map(KEYS_FILE, bytes(&mp, meta.entries, meta.dim as u64, 4)?)?;
        let values = map(VALUES_FILE, bytes(&mp, meta.entries, 1, 4)?)?;
        let vp = dir.join(VALUES_FILE);
        let vals: &[u32] = bytemuck::cast_slice(&values[..]);
        if let Some(i) = vals.iter().position(|&v| v >= meta.origin.vocab_size) {
            return Err(RetrievalError::invalid(
                &vp,
                format!(
                    "entry {i} holds token {} past the vocabulary of {}: the datastore is damaged",
                    vals[i], meta.origin.vocab_size
                ),
            ));
        }
        let ip = dir.join(INDEX_FILE);
        if !ip.is_file() {
            return Err(RetrievalError::invalid(
                &ip,
                "is missing: run `variorum datastore build` again to rebuild the index",
            ));
        }
        let index =
            usearch::Index::new(&meta.index.params.options(meta.dim)).map_err(|e| RetrievalError::index(&ip, e))?;
        index.view(&path_str(&ip)?).map_err(|e| {
            RetrievalError::index(
                &ip,
                format!("{e} (damaged: run `variorum datastore build` again to rebuild the index)"),
            )
        })?;
        if index.size() as u64 != meta.entries || index.dimensions() != meta.dim {
            return Err(RetrievalError::invalid(
                &ip,
                format!(
                    "holds {} keys of {} values where {META_FILE} describes {} of {}: run `variorum datastore build` again to rebuild the index",
                    index.size(),
                    index.dimensions(),
                    meta.entries,
                    meta.dim
                ),
            ));
        }
        // `view` prepares one search context per hardware thread; the rayon pool may have more
        index
            .reserve_capacity_and_threads(index.size(), rayon::current_num_threads().max(1))
            .map_err(|e| RetrievalError::index(&ip, e))?;
        Ok(Self { dir: dir.to_path_buf(), meta, keys, values, index, search_lock: Default::default() })
    }

    /// Entries in the datastore.
    pub fn len(&self) -> usize {
        self.meta.entries as usize
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.meta.entries == 0
    }

    /// Key width: f32 values per key.
    pub fn dim(&self) -> usize {
        self.meta.dim
    }

    /// Every key, rows of [`dim`](Self::dim).
    pub fn keys(&self) -> &[f32] {
        bytemuck::cast_slice(&self.keys[..])
    }

    /// Every value (entry `i`'s next token).
    pub fn values(&self) -> &[u32] {
        bytemuck::cast_slice(&self.values[..])
    }

    /// Sets the index's `ef` for one batch of searches (usearch keeps it in the index: the
    /// guard holds it until the batch ends), and returns how few admitted entries make a
    /// filtered query scan them instead: a filter that admits few makes HNSW walk much of the
    /// graph (it explores until `ef` candidates pass), and below √(ef · M · N) scanning costs
    /// less.
    fn begin_search(&self, ef: usize) -> (std::sync::MutexGuard<'_, ()>, u64) {
        let guard = self.search_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.index.change_expansion_search(ef);
        let m = self.meta.index.params.connectivity;
        (guard, ((ef * m) as f64 * self.meta.entries as f64).sqrt() as u64)
    }

    /// The `k` nearest entries of each query (rows of [`dim`](Self::dim)), nearest first,
    /// leaving out the entries in `exclude[i]` for query `i` (an empty range, or no range,
    /// leaves out none): a query from the datastore's own text skips the entries around its
    /// position. Runs on the current rayon pool.
    pub fn search_excluding(
        &self,
        queries: &[f32],
        k: usize,
        mode: SearchMode,
        exclude: &[std::ops::Range<u64>],
    ) -> Result<Vec<Vec<Neighbour>>> {
        let n = self.meta.entries;
        let band = |i: usize| exclude.get(i).filter(|r| !r.is_empty());
        let admit = |i: usize, id: u64| band(i).is_none_or(|r| !r.contains(&id));
        self.search_where(
            queries,
            k,
            mode,
            |i| band(i).map(|r| n - (r.end.min(n) - r.start.min(n))),
            admit,
            |qs, k| search::exact_where(self.keys(), self.dim(), qs, k, admit),
            |i, q, k| search::exact_where(self.keys(), self.dim(), q, k, |_, id| admit(i, id)),
        )
    }

    /// The `k` nearest entries of each query (rows of [`dim`](Self::dim)), nearest first;
    /// query `i` sees only entries with id `< before[i]` where given (empty: no bound). Runs
    /// on the current rayon pool.
    pub fn search(
        &self,
        queries: &[f32],
        k: usize,
        mode: SearchMode,
        before: &[Option<u64>],
    ) -> Result<Vec<Vec<Neighbour>>> {
        let bound = |i: usize| before.get(i).copied().flatten();
        self.search_where(
            queries,
            k,
            mode,
            |i| bound(i).map(|b| b.min(self.meta.entries)),
            |i, id| bound(i).is_none_or(|b| id < b),
            |qs, k| search::exact(self.keys(), self.dim(), qs, k, before),
            // the admitted entries are a prefix: scan it alone
            |i, q, k| {
                let b = bound(i).map_or(self.len(), |b| (b as usize).min(self.len()));
                search::exact(&self.keys()[..b * self.dim()], self.dim(), q, k, &[])
            },
        )
    }

    /// The searches' shared body. Query `i` admits `admitted(i)` entries (`None`: every entry,
    /// unfiltered), those with `admit(i, id)`. Exact mode is `scan_all(queries, k)` (which
    /// compares blocks of queries with each key at once); the index's mode searches a query
    /// that admits few by `scan(i, query, k)` instead.
    fn search_where(
        &self,
        queries: &[f32],
        k: usize,
        mode: SearchMode,
        admitted: impl Fn(usize) -> Option<u64> + Sync,
        admit: impl Fn(usize, u64) -> bool + Sync,
        scan_all: impl FnOnce(&[f32], usize) -> Vec<Vec<Neighbour>>,
        scan: impl Fn(usize, &[f32], usize) -> Vec<Vec<Neighbour>> + Sync,
    ) -> Result<Vec<Vec<Neighbour>>> {
        let dim = self.dim();
        assert_eq!(queries.len() % dim, 0, "queries of {dim} values");
        let k = k.min(self.len());
        let ef = match mode {
            SearchMode::Exact => return Ok(scan_all(queries, k)),
            SearchMode::Approximate { ef } => ef.max(k),
        };
        let (_one_batch, exact_below) = self.begin_search(ef);
        let ip = self.dir.join(INDEX_FILE);
        let n = self.meta.entries;
        queries
            .par_chunks(dim)
            .enumerate()
            .map(|(i, q)| {
                let found = match admitted(i) {
                    Some(a) if a < exact_below => return Ok(scan(i, q, k).swap_remove(0)),
                    Some(_) => self.index.filtered_search(q, k, |id| admit(i, id)),
                    None => self.index.search(q, k),
                }
                .map_err(|e| RetrievalError::index(&ip, e))?;
                found_entries(found, n, &ip)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn origin() -> Origin {
        Origin {
            run: "runs/test".into(),
            weights_sha256: "00".into(),
            key: "head-input".into(),
            text: "test text".into(),
            text_sha256: "11".into(),
            tokens: 0,
            vocab_size: 50,
            window: 8,
            stride: 8,
        }
    }

    fn entries(n: usize, dim: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let keys = (0..n * dim).map(|_| r.random::<f32>() * 2.0 - 1.0).collect();
        let values = (0..n).map(|_| r.random_range(0..50u32)).collect();
        (keys, values)
    }

    fn build(dir: &Path, keys: &[f32], values: &[u32], dim: usize) -> Datastore {
        let mut w =
            DatastoreWriter::create_or_resume(dir, origin(), dim, values.len() as u64, HnswParams::default()).unwrap();
        for (k, v) in keys.chunks(dim * 100).zip(values.chunks(100)) {
            w.append(k, v).unwrap();
        }
        assert!(w.build_index(|_| {}, &|| false).unwrap());
        Datastore::open(dir).unwrap()
    }

    #[test]
    fn approximate_search_recalls_the_exact_neighbours() {
        let (n, dim, k) = (20_000, 16, 8);
        let (keys, values) = entries(n, dim, 5);
        let tmp = tempfile::tempdir().unwrap();
        let store = build(tmp.path(), &keys, &values, dim);
        assert_eq!(store.len(), n);
        assert_eq!(store.values(), &values[..]);
        let (queries, _) = entries(300, dim, 6);
        let exact = store.search(&queries, k, SearchMode::Exact, &[]).unwrap();
        let approx = store.search(&queries, k, SearchMode::Approximate { ef: 64 }, &[]).unwrap();
        let r = search::recall(&exact, &approx);
        // measured 0.997 on this data; a broken index scores near 0
        assert!(r >= 0.9, "recall@{k} {r:.3} on uniform random data");
        // the causal bound holds for the index too
        let before: Vec<Option<u64>> = (0..300).map(|i| Some(i as u64 * 50)).collect();
        let bounded = store.search(&queries, k, SearchMode::Approximate { ef: 64 }, &before).unwrap();
        for (i, found) in bounded.iter().enumerate() {
            assert!(found.iter().all(|nb| nb.id < i as u64 * 50), "query {i} retrieved an entry past its bound");
        }
        let exact_bounded = store.search(&queries, k, SearchMode::Exact, &before).unwrap();
        assert!(search::recall(&exact_bounded[20..], &bounded[20..]) >= 0.8);
    }

    /// A query that is an entry's own key finds that entry first; excluding a band around it,
    /// neither search returns anything in the band, and the index finds what exact search does.
    #[test]
    fn excluded_entries_are_never_retrieved() {
        let (n, dim, k) = (5_000, 16, 8);
        let (keys, values) = entries(n, dim, 11);
        let tmp = tempfile::tempdir().unwrap();
        let store = build(tmp.path(), &keys, &values, dim);
        let at: Vec<u64> = (0..200).map(|i| i * 25).collect();
        let queries: Vec<f32> = at.iter().flat_map(|&p| keys[p as usize * dim..][..dim].to_vec()).collect();
        let own = store.search_excluding(&queries, k, SearchMode::Exact, &[]).unwrap();
        assert!(own.iter().zip(&at).all(|(f, &p)| f[0].id == p && f[0].distance == 0.0));
        let band: Vec<std::ops::Range<u64>> = at.iter().map(|&p| p.saturating_sub(300)..p + 301).collect();
        let exact = store.search_excluding(&queries, k, SearchMode::Exact, &band).unwrap();
        let approx = store.search_excluding(&queries, k, SearchMode::Approximate { ef: 64 }, &band).unwrap();
        for (found, r) in exact.iter().chain(&approx).zip(band.iter().cycle()) {
            assert_eq!(found.len(), k);
            assert!(found.iter().all(|nb| !r.contains(&nb.id)), "retrieved an entry in {r:?}: {found:?}");
        }
        // exact search with the band is a plain exact search over the other keys
        for (q, found) in exact.iter().enumerate() {
            let kept: Vec<u64> = (0..n as u64).filter(|id| !band[q].contains(id)).collect();
            let rest: Vec<f32> = kept.iter().flat_map(|&id| keys[id as usize * dim..][..dim].to_vec()).collect();
            let plain = search::exact(&rest, dim, &queries[q * dim..(q + 1) * dim], k, &[]).swap_remove(0);
            let ids: Vec<u64> = plain.iter().map(|nb| kept[nb.id as usize]).collect();
            assert_eq!(found.iter().map(|nb| nb.id).collect::<Vec<_>>(), ids, "query {q}");
        }
        assert!(search::recall(&exact, &approx) >= 0.9);
        // a band that leaves few entries is scanned exactly: still k found, none in the band
        let wide = vec![100..(n as u64 - 20); at.len()];
        let few = store.search_excluding(&queries, k, SearchMode::Approximate { ef: 64 }, &wide).unwrap();
        assert!(few.iter().all(|f| f.len() == k && f.iter().all(|nb| !wide[0].contains(&nb.id))));
    }

    #[test]
    fn an_interrupted_build_resumes_to_the_same_datastore() {
        let (n, dim) = (3000, 8);
        let (keys, values) = entries(n, dim, 7);
        let whole = tempfile::tempdir().unwrap();
        let reference = build(whole.path(), &keys, &values, dim);

        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        {
            let mut w =
                DatastoreWriter::create_or_resume(&dir, origin(), dim, n as u64, HnswParams::default()).unwrap();
            w.append(&keys[..1000 * dim], &values[..1000]).unwrap();
            // a group written but never counted: the crash came before datastore.json
            w.keys.write_all(bytemuck::cast_slice(&keys[1000 * dim..1500 * dim])).unwrap();
        }
        assert!(Datastore::open(&dir).err().unwrap().to_string().contains("1000 of 3000 entries written"));
        let mut w = DatastoreWriter::create_or_resume(&dir, origin(), dim, n as u64, HnswParams::default()).unwrap();
        assert_eq!(w.entries(), 1000, "resumes after the last committed group");
        w.append(&keys[1000 * dim..], &values[1000..]).unwrap();
        assert!(w.build_index(|_| {}, &|| false).unwrap());
        let store = Datastore::open(&dir).unwrap();
        assert_eq!(store.keys(), reference.keys());
        assert_eq!(store.values(), reference.values());
        // reopening a complete datastore writes nothing more
        let mut again =
            DatastoreWriter::create_or_resume(&dir, origin(), dim, n as u64, HnswParams::default()).unwrap();
        assert!(again.meta().complete && again.build_index(|_| {}, &|| false).unwrap());
    }

    #[test]
    fn an_interrupted_index_build_resumes_from_its_checkpoint() {
        let (n, dim) = (10_000, 8);
        let (keys, values) = entries(n, dim, 8);
        let tmp = tempfile::tempdir().unwrap();
        let mut w =
            DatastoreWriter::create_or_resume(tmp.path(), origin(), dim, n as u64, HnswParams::default()).unwrap();
        w.append(&keys, &values).unwrap();
        w.checkpoint_every = Duration::ZERO;
        assert!(!w.build_index(|_| {}, &|| true).unwrap());
        assert_eq!(w.meta().index.indexed, 4096);
        drop(w);
        let mut w =
            DatastoreWriter::create_or_resume(tmp.path(), origin(), dim, n as u64, HnswParams::default()).unwrap();
        let mut first = None;
        assert!(
            w.build_index(
                |d| {
                    first.get_or_insert(d);
                },
                &|| false
            )
            .unwrap()
        );
        assert_eq!(first, Some(4096), "continues from the checkpoint, not from nothing");
        let store = Datastore::open(tmp.path()).unwrap();
        let found = store.search(&keys[..dim * 50], 1, SearchMode::Approximate { ef: 64 }, &[]).unwrap();
        assert!(found.iter().enumerate().filter(|(i, f)| f[0].id == *i as u64).count() >= 48, "each key finds itself");
    }

    #[test]
    fn a_lost_index_is_rebuilt_by_the_same_build() {
        let (n, dim) = (800, 8);
        let (keys, values) = entries(n, dim, 10);
        let tmp = tempfile::tempdir().unwrap();
        build(tmp.path(), &keys, &values, dim);
        fs::remove_file(tmp.path().join(INDEX_FILE)).unwrap();
        let err = Datastore::open(tmp.path()).err().unwrap().to_string();
        assert!(err.contains("index.usearch") && err.contains("datastore build"), "{err}");
        let mut w =
            DatastoreWriter::create_or_resume(tmp.path(), origin(), dim, n as u64, HnswParams::default()).unwrap();
        assert!(!w.meta().complete, "the description no longer claims an index");
        assert_eq!(w.entries(), n as u64, "the keys are kept");
        assert!(w.build_index(|_| {}, &|| false).unwrap());
        assert_eq!(Datastore::open(tmp.path()).unwrap().len(), n);
    }

    #[test]
    fn mismatches_and_damage_are_refused_by_name() {
        let (n, dim) = (500, 8);
        let (keys, values) = entries(n, dim, 9);
        let tmp = tempfile::tempdir().unwrap();
        build(tmp.path(), &keys, &values, dim);
        let mut other = origin();
        other.text = "another text".into();
        let err =
            DatastoreWriter::create_or_resume(tmp.path(), other, dim, n as u64, HnswParams::default()).err().unwrap();
        assert!(
            err.to_string().contains("holds a datastore of test text built otherwise (text test text ≠ another text)"),
            "{err}"
        );
        // a truncated key file
        let kp = tmp.path().join(KEYS_FILE);
        let f = OpenOptions::new().write(true).open(&kp).unwrap();
        f.set_len(100).unwrap();
        let err = Datastore::open(tmp.path()).err().unwrap().to_string();
        assert!(err.contains("keys.f32") && err.contains("damaged"), "{err}");
        // not a datastore at all
        let junk = tempfile::tempdir().unwrap();
        fs::write(junk.path().join("notes.txt"), "x").unwrap();
        let err =
            DatastoreWriter::create_or_resume(junk.path(), origin(), dim, 1, HnswParams::default()).err().unwrap();
        assert!(err.to_string().contains("not a datastore"), "{err}");
        fs::write(junk.path().join(META_FILE), "{ not json").unwrap();
        assert!(Datastore::open(junk.path()).err().unwrap().to_string().contains("damaged"));
    }
}
