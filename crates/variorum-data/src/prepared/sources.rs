//! Reading one source as a stream of documents: its files found, decompressed, and cut into
//! pieces of bounded size, each piece knowing whether it starts or ends a document and which
//! split its document belongs to.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{InvalidUtf8, SourceConfig};
use crate::error::{DataError, one_line};

/// One file of a source, as `index.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The file, as found.
    pub path: PathBuf,
    /// Its size on disk.
    pub bytes: u64,
    /// SHA-256 of its bytes on disk (hex).
    pub sha256: String,
}

/// The files of `data.sources[i]`, in the order they are read: a glob's matches and a
/// directory's files (recursively) sorted by path. No file, or only empty ones, is an error.
pub(crate) fn expand(i: usize, source: &SourceConfig) -> Result<Vec<PathBuf>, DataError> {
    let what = |problem: String| DataError::Config(format!("data.sources[{i}].path = {:?} {problem}", source.path));
    let path = Path::new(&source.path);
    let mut files = Vec::new();
    if source.path.contains(['*', '?', '[']) {
        let matches = glob::glob(&source.path).map_err(|e| what(format!("is not a valid glob: {}", one_line(e))))?;
        for m in matches {
            let p = m.map_err(|e| what(format!("could not be searched: {}", one_line(e))))?;
            if p.is_file() {
                files.push(p);
            }
        }
    } else if path.is_dir() {
        walk(path, &mut files).map_err(|e| what(format!("could not be listed: {}", one_line(e))))?;
    } else if path.is_file() {
        files.push(path.to_path_buf());
    } else {
        return Err(what("is neither a file, a directory nor a glob that exists: check the path (a relative path is read from the current directory)".into()));
    }
    files.sort();
    let sizes = files.iter().map(|f| f.metadata().map(|m| m.len()).unwrap_or(0)).sum::<u64>();
    if files.is_empty() || sizes == 0 {
        return Err(what(match files.len() {
            0 => "matches no file".into(),
            n => format!("matches {n} file(s), all empty"),
        }));
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

/// A piece of one document's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub text: String,
    pub starts_doc: bool,
    pub ends_doc: bool,
    /// The document is held out for validation.
    pub val: bool,
}

/// Counts the bytes of a file read from disk (for the progress bar) and hashes them (for
/// `index.json`), handing its count and hash to `out` when dropped (the decoders own it).
struct Tally {
    inner: File,
    read: Arc<AtomicU64>,
    bytes: u64,
    hash: Sha256,
    out: Arc<std::sync::Mutex<Option<(u64, Sha256)>>>,
}

impl Read for Tally {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let hash = std::mem::take(&mut self.hash);
        *self.out.lock().expect("not poisoned") = Some((self.bytes, hash));
    }
}

/// What one source's reader is set to do.
pub(crate) struct ReadSettings {
    pub source: usize,
    pub text_field: Option<String>,
    pub invalid_utf8: InvalidUtf8,
    /// Pieces are cut at about this many bytes.
    pub piece_bytes: usize,
    pub seed: u64,
    pub holdout: Holdout,
}

/// Which of a source's documents are held out for validation.
#[derive(Debug, Clone)]
pub(crate) enum Holdout {
    /// Those whose [`holdout_hash`] falls below this fraction of 2⁶⁴ (`data.val_fraction`).
    Fraction(f64),
    /// These document numbers (`data.prepare.val_documents`: [`chosen`]).
    Chosen(Arc<std::collections::HashSet<u64>>),
}

/// The file being read and where in it the reader is.
struct Open {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    tally: Arc<std::sync::Mutex<Option<(u64, Sha256)>>>,
    line: usize,
    /// A Parquet file's rows (its text column only); `reader` is then empty.
    rows: Option<parquet::record::reader::RowIter<'static>>,
    /// Text read but not yet given out (plain text files).
    pending: String,
    /// The first bytes of a character the last read cut (plain text files).
    carry: Vec<u8>,
    started: bool,
    val: bool,
}

/// A source's documents, piece by piece, file after file.
pub(crate) struct DocumentReader {
    settings: ReadSettings,
    files: std::vec::IntoIter<PathBuf>,
    open: Option<Open>,
    /// Bytes read from disk so far, all sources together (shared with the progress bar).
    pub read: Arc<AtomicU64>,
    /// Documents given out so far (their numbers decide the holdout).
    pub documents: u64,
    /// Documents left out because they are not UTF-8.
    pub skipped_invalid: u64,
    /// The files read to their end, with their sizes and hashes.
    pub finished: Vec<FileRecord>,
}

/// The first 8 bytes of SHA-256("variorum/holdout/v1", seed, source, number): what decides
/// whether document `number` of source `source` is held out.
pub(crate) fn holdout_hash(seed: u64, source: usize, number: u64) -> u64 {
    let h = Sha256::new()
        .chain_update(b"variorum/holdout/v1")
        .chain_update(seed.to_le_bytes())
        .chain_update((source as u64).to_le_bytes())
        .chain_update(number.to_le_bytes())
        .finalize();
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}

/// Whether document `number` of source `source` is held out by a fraction: its
/// [`holdout_hash`] read as a fraction of 2⁶⁴ is below `val_fraction`.
pub(crate) fn held_out(seed: u64, source: usize, number: u64, val_fraction: f64) -> bool {
    (holdout_hash(seed, source, number) as f64) < val_fraction * 18_446_744_073_709_551_616.0
}

/// The `n` of a source's `documents` document numbers whose [`holdout_hash`] is smallest (ties
/// to the lower number): a held-out count, as deterministic as the fraction. Memory: `n`.
pub(crate) fn chosen(seed: u64, source: usize, documents: u64, n: u64) -> std::collections::HashSet<u64> {
    let mut heap = std::collections::BinaryHeap::with_capacity(n as usize + 1);
    for number in 0..documents {
        heap.push((holdout_hash(seed, source, number), number));
        if heap.len() as u64 > n {
            heap.pop();
        }
    }
    heap.into_iter().map(|(_, number)| number).collect()
}

impl DocumentReader {
    pub(crate) fn new(settings: ReadSettings, files: Vec<PathBuf>, read: Arc<AtomicU64>) -> Self {
        DocumentReader {
            settings,
            files: files.into_iter(),
            open: None,
            read,
            documents: 0,
            skipped_invalid: 0,
            finished: Vec::new(),
        }
    }

    fn open_next(&mut self) -> Result<bool, DataError> {
        let Some(path) = self.files.next() else { return Ok(false) };
        let file = File::open(&path).map_err(|e| DataError::CorpusRead { path: path.clone(), message: one_line(e) })?;
        let tally = Arc::new(std::sync::Mutex::new(None));
        let counted = Tally { inner: file, read: self.read.clone(), bytes: 0, hash: Sha256::new(), out: tally.clone() };
        let name = path.to_string_lossy();
        if name.ends_with(".parquet") {
            // counted and hashed in one pass of its own, then read by the Parquet reader
            let mut counted = counted;
            std::io::copy(&mut counted, &mut std::io::sink())
                .map_err(|e| DataError::CorpusRead { path: path.clone(), message: one_line(e) })?;
            drop(counted);
            let rows = parquet_rows(&path, self.settings.text_field.as_deref(), self.settings.source)?;
            let reader = Box::new(BufReader::new(std::io::empty()));
            self.open = Some(Open {
                path,
                reader,
                tally,
                line: 0,
                rows: Some(rows),
                pending: String::new(),
                carry: Vec::new(),
                started: false,
                val: false,
            });
            return Ok(true);
        }
        let reader: Box<dyn BufRead + Send> = if name.ends_with(".gz") {
            Box::new(BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(counted)))
        } else if name.ends_with(".zst") {
            let z = zstd::stream::read::Decoder::new(counted)
                .map_err(|e| DataError::CorpusRead { path: path.clone(), message: one_line(e) })?;
            Box::new(BufReader::with_capacity(1 << 16, z))
        } else {
            Box::new(BufReader::with_capacity(1 << 16, counted))
        };
        self.open = Some(Open {
            path,
            reader,
            tally,
            line: 0,
            rows: None,
            pending: String::new(),
            carry: Vec::new(),
            started: false,
            val: false,
        });
        Ok(true)
    }

    /// The file just read to its end: its size and hash recorded, the next one opened.
    fn close(&mut self) {
        if let Some(open) = self.open.take() {
            // the decoders may not have read the file's last bytes (a gzip trailer): finish it
            let Open { path, mut reader, tally, .. } = open;
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            drop(reader);
            let (bytes, hash) = tally.lock().expect("not poisoned").take().unwrap_or((0, Sha256::new()));
            self.finished.push(FileRecord { path, bytes, sha256: hex(&hash.finalize()) });
        }
    }

    fn new_document(&mut self) -> bool {
        let n = self.documents;
        self.documents += 1;
        match &self.settings.holdout {
            Holdout::Fraction(f) => held_out(self.settings.seed, self.settings.source, n, *f),
            Holdout::Chosen(set) => set.contains(&n),
        }
    }

    /// The next piece, or `None` after the last file's end.
    pub(crate) fn next_piece(&mut self) -> Result<Option<Piece>, DataError> {
        loop {
            if self.open.is_none() && !self.open_next()? {
                return Ok(None);
            }
            let parquet = self.open.as_ref().is_some_and(|o| o.rows.is_some());
            let piece = match self.settings.text_field.clone() {
                Some(_) if parquet => self.next_row()?,
                Some(field) => self.next_line(&field)?,
                None => self.next_text()?,
            };
            match piece {
                Some(p) => return Ok(Some(p)),
                None => self.close(),
            }
        }
    }

    fn invalid(&mut self, path: &Path, line: Option<usize>, offset: usize) -> Result<(), DataError> {
        match self.settings.invalid_utf8 {
            InvalidUtf8::Skip => {
                self.skipped_invalid += 1;
                Ok(())
            }
            InvalidUtf8::Refuse => Err(DataError::Config(format!(
                "{}{}: not UTF-8 (byte {offset}): convert it, or set data.prepare.invalid_utf8 = \"skip\"",
                path.display(),
                line.map(|l| format!(", line {l}")).unwrap_or_default()
            ))),
        }
    }

    /// JSON Lines: the next document of the open file, or `None` at its end.
    fn next_line(&mut self, field: &str) -> Result<Option<Piece>, DataError> {
        let mut buf = Vec::new();
        loop {
            let open = self.open.as_mut().expect("a file is open");
            buf.clear();
            let n = open
                .reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| DataError::CorpusRead { path: open.path.clone(), message: one_line(e) })?;
            if n == 0 {
                return Ok(None);
            }
            open.line += 1;
            let (path, line) = (open.path.clone(), open.line);
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if let Err(e) = std::str::from_utf8(&buf) {
                self.invalid(&path, Some(line), e.valid_up_to())?;
                continue;
            }
            let at = || format!("{}, line {line}", path.display());
            let value: serde_json::Value = serde_json::from_slice(&buf)
                .map_err(|e| DataError::Config(format!("{}: not JSON ({})", at(), one_line(e))))?;
            let text = match value.get(field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(_) => return Err(DataError::Config(format!("{}: field {field:?} is not a string", at()))),
                None => {
                    return Err(DataError::Config(format!(
                        "{}: no field {field:?} (data.sources[{}].text_field)",
                        at(),
                        self.settings.source
                    )));
                }
            };
            if text.is_empty() {
                continue;
            }
            let val = self.new_document();
            return Ok(Some(Piece { text, starts_doc: true, ends_doc: true, val }));
        }
    }

    /// Parquet: the next document of the open file (its row's text column), or `None` at its
    /// end. A null or empty value is no document.
    fn next_row(&mut self) -> Result<Option<Piece>, DataError> {
        use parquet::record::Field;
        loop {
            let open = self.open.as_mut().expect("a file is open");
            let rows = open.rows.as_mut().expect("a Parquet file");
            let Some(row) = rows.next() else { return Ok(None) };
            open.line += 1;
            let (path, line) = (open.path.clone(), open.line);
            let at = || format!("{}, row {line}", path.display());
            let row = row.map_err(|e| DataError::Config(format!("{}: {}", at(), one_line(e))))?;
            let text = match row.get_column_iter().next().map(|(_, f)| f) {
                Some(Field::Str(s)) => s.clone(),
                Some(Field::Bytes(b)) => match std::str::from_utf8(b.data()) {
                    Ok(s) => s.to_string(),
                    Err(e) => {
                        self.invalid(&path, Some(line), e.valid_up_to())?;
                        continue;
                    }
                },
                Some(Field::Null) | None => continue,
                Some(other) => {
                    return Err(DataError::Config(format!("{}: the text column holds {other}, not text", at())));
                }
            };
            if text.is_empty() {
                continue;
            }
            let val = self.new_document();
            return Ok(Some(Piece { text, starts_doc: true, ends_doc: true, val }));
        }
    }

    /// Plain text: the next piece of the open file (the file is one document), or `None` at
    /// its end. Pieces are cut where BPE tokens cannot cross ([`crate::tokenizer::safe_cut_after`]).
    fn next_text(&mut self) -> Result<Option<Piece>, DataError> {
        let target = self.settings.piece_bytes;
        loop {
            let open = self.open.as_mut().expect("a file is open");
            // a cut that BPE cannot cross, once there is enough text; without a newline for
            // four pieces' length, a cut at a character boundary (BPE may then differ there)
            if open.pending.len() >= target {
                let cut = crate::tokenizer::safe_cut_after(&open.pending, target).or_else(|| {
                    (open.pending.len() >= 4 * target).then(|| {
                        (target..=open.pending.len()).find(|&i| open.pending.is_char_boundary(i)).expect("end is one")
                    })
                });
                if let Some(cut) = cut {
                    let rest = open.pending.split_off(cut);
                    let text = std::mem::replace(&mut open.pending, rest);
                    let starts_doc = !open.started;
                    open.started = true;
                    if starts_doc {
                        let val = self.new_document();
                        self.open.as_mut().expect("open").val = val;
                    }
                    let val = self.open.as_ref().expect("open").val;
                    return Ok(Some(Piece { text, starts_doc, ends_doc: false, val }));
                }
            }
            // the reader's own buffer, appended to a character the last read cut, if any
            let n = match open.reader.fill_buf() {
                Ok(bytes) => {
                    open.carry.extend_from_slice(bytes);
                    bytes.len()
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(DataError::CorpusRead { path: open.path.clone(), message: one_line(e) }),
            };
            open.reader.consume(n);
            if n == 0 {
                let open = self.open.as_mut().expect("a file is open");
                if !open.carry.is_empty() {
                    let (path, offset) = (open.path.clone(), open.pending.len());
                    open.pending.clear();
                    return self.abandon(&path, offset);
                }
                if open.pending.is_empty() {
                    if open.started {
                        // the last piece was given out just as the file ended
                        open.started = false;
                        return Ok(Some(Piece {
                            text: String::new(),
                            starts_doc: false,
                            ends_doc: true,
                            val: open.val,
                        }));
                    }
                    return Ok(None);
                }
                let text = std::mem::take(&mut open.pending);
                let starts_doc = !open.started;
                open.started = false;
                let val = if starts_doc { self.new_document() } else { self.open.as_ref().expect("open").val };
                return Ok(Some(Piece { text, starts_doc, ends_doc: true, val }));
            }
            let carry = &mut open.carry;
            match std::str::from_utf8(carry) {
                Ok(s) => {
                    open.pending.push_str(s);
                    carry.clear();
                }
                // a character cut by the read: keep its first bytes for the next
                Err(e) if e.error_len().is_none() => {
                    let ok = e.valid_up_to();
                    open.pending.push_str(std::str::from_utf8(&carry[..ok]).expect("valid prefix"));
                    carry.drain(..ok);
                }
                Err(e) => {
                    let (path, offset) = (open.path.clone(), open.pending.len() + e.valid_up_to());
                    open.pending.clear();
                    return self.abandon(&path, offset);
                }
            }
        }
    }

    /// A text file that is not UTF-8 at `offset`: refused, or the rest of it skipped (the
    /// document ends where the valid text did).
    fn abandon(&mut self, path: &Path, offset: usize) -> Result<Option<Piece>, DataError> {
        self.invalid(path, None, offset)?;
        let open = self.open.as_mut().expect("a file is open");
        open.carry.clear();
        let _ = std::io::copy(&mut open.reader, &mut std::io::sink());
        if open.started {
            open.started = false;
            return Ok(Some(Piece { text: String::new(), starts_doc: false, ends_doc: true, val: open.val }));
        }
        Ok(None)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The rows of a Parquet file, projected on its column `column` (which must be a top-level
/// column). `text_field` names it, as it names a JSON Lines field.
fn parquet_rows(
    path: &Path,
    column: Option<&str>,
    source: usize,
) -> Result<parquet::record::reader::RowIter<'static>, DataError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let bad = |problem: String| DataError::Config(format!("{}: {problem}", path.display()));
    let Some(column) = column else {
        return Err(bad(format!(
            "a Parquet file needs data.sources[{source}].text_field, the column holding the text"
        )));
    };
    let file =
        File::open(path).map_err(|e| DataError::CorpusRead { path: path.to_path_buf(), message: one_line(e) })?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(format!("not a Parquet file ({})", one_line(e))))?;
    let schema = reader.metadata().file_metadata().schema();
    let fields = schema.get_fields();
    let Some(field) = fields.iter().find(|f| f.name() == column) else {
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        return Err(bad(format!(
            "no column {column:?} (it has {}); set data.sources[{source}].text_field",
            names.join(", ")
        )));
    };
    let projection = parquet::schema::types::Type::group_type_builder(schema.name())
        .with_fields(vec![field.clone()])
        .build()
        .map_err(|e| bad(one_line(e)))?;
    parquet::record::reader::RowIter::from_file_into(Box::new(reader))
        .project(Some(projection))
        .map_err(|e| bad(format!("its column {column:?} cannot be read ({})", one_line(e))))
}
