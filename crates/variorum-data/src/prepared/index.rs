//! `index.json` and the shards it names, opened and checked.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::sources::{FileRecord, hex};
use super::{PrepareConfig, SourceConfig};
use crate::error::{DataError, one_line};
use crate::tokenizer::{Tokenizer, TokenizerConfig};

/// The format `index.json` is written in; a directory in another is prepared again.
pub(crate) const FORMAT: &str = "variorum-prepared/1";

/// The tokenizer a corpus was prepared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizerRecord {
    /// `data.tokenizer` as it was.
    pub config: TokenizerConfig,
    /// [`Tokenizer::sha256`] of the `tokenizer.json` written beside the index.
    pub sha256: String,
    /// Token ids are `0..vocab_size`.
    pub vocab_size: usize,
    /// The id written after every document.
    pub eot: u32,
}

/// One shard: the tokens of one piece of one source, both splits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// `shard-NNNNN`: its files are `NAME.train.bin`, `NAME.train.docs`, `NAME.val.bin`, …
    pub name: String,
    /// Which `data.sources` entry it holds.
    pub source: usize,
    /// Tokens in each split.
    pub train_tokens: u64,
    /// Tokens in the validation split.
    pub val_tokens: u64,
    /// Documents starting in each split.
    pub train_documents: u64,
    /// Documents starting in the validation split.
    pub val_documents: u64,
    /// Characters of text each split holds (its end-of-text tokens not counted).
    pub train_chars: u64,
    /// Characters of the validation split's text.
    pub val_chars: u64,
    /// CRC-32 of `NAME.train.bin` and of `NAME.val.bin`.
    pub train_crc32: u32,
    /// CRC-32 of `NAME.val.bin`.
    pub val_crc32: u32,
}

/// One source, summed over its shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// The entry of `data.sources`.
    pub config: SourceConfig,
    /// Its files, with sizes and SHA-256.
    pub files: Vec<FileRecord>,
    /// Documents read.
    pub documents: u64,
    /// Documents left out: not UTF-8.
    pub skipped_invalid: u64,
    /// Training tokens (end-of-text tokens included).
    pub train_tokens: u64,
    /// Validation tokens.
    pub val_tokens: u64,
}

/// `index.json`: everything a run needs to know about a prepared corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// The format written, `variorum-prepared/1`.
    pub format: String,
    /// [`fingerprint`] of the settings and sources it was made from.
    pub fingerprint: String,
    /// The tokenizer.
    pub tokenizer: TokenizerRecord,
    /// Bytes per token in the shards: 2 (`u16`) or 4 (`u32`).
    pub width: u8,
    /// `data.val_fraction`: the fraction of documents held out.
    pub val_fraction: f64,
    /// `[data.prepare]`.
    pub prepare: PrepareConfig,
    /// Per source.
    pub sources: Vec<SourceRecord>,
    /// Every shard, in order.
    pub shards: Vec<ShardRecord>,
}

impl Index {
    /// Reads `dir/index.json`; a missing or unreadable one is an error naming the directory.
    pub fn read(dir: &Path) -> Result<Index, DataError> {
        let path = dir.join("index.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            DataError::Config(match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "{} is not a prepared corpus (no index.json): run `variorum prepare CONFIG` first",
                    dir.display()
                ),
                _ => format!("{}: {}", path.display(), one_line(e)),
            })
        })?;
        let index: Index = serde_json::from_str(&text).map_err(|e| {
            DataError::Config(format!("{} is corrupt ({}): prepare the corpus again", path.display(), one_line(e)))
        })?;
        if index.format != FORMAT {
            return Err(DataError::Config(format!(
                "{} is in format {:?}, this variorum reads {FORMAT:?}: prepare the corpus again",
                path.display(),
                index.format
            )));
        }
        Ok(index)
    }

    /// Training tokens of every source (end-of-text tokens included).
    pub fn train_tokens(&self) -> u64 {
        self.shards.iter().map(|s| s.train_tokens).sum()
    }

    /// Validation tokens.
    pub fn val_tokens(&self) -> u64 {
        self.shards.iter().map(|s| s.val_tokens).sum()
    }
}

/// SHA-256 (hex) of everything a prepared corpus depends on: the format, the sources as
/// configured and the files they name (path, size, modification time), `[data.prepare]`,
/// the holdout fraction and the tokenizer settings (with a tokenizer file's own hash). Equal
/// fingerprints: the shards on disk are the ones a prepare would write now.
pub fn fingerprint(
    sources: &[(SourceConfig, Vec<PathBuf>)],
    prepare: &PrepareConfig,
    val_fraction: f64,
    tokenizer: &TokenizerConfig,
) -> Result<String, DataError> {
    let mut files = Vec::new();
    for (_, paths) in sources {
        for p in paths {
            let m = p.metadata().map_err(|e| DataError::CorpusRead { path: p.clone(), message: one_line(e) })?;
            let mtime =
                m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos());
            files.push(serde_json::json!([p, m.len(), mtime.map(|t| t.to_string())]));
        }
    }
    let tokenizer_file = match tokenizer {
        TokenizerConfig::File { path } => Some(hex(&Sha256::digest(
            std::fs::read(path).map_err(|e| DataError::CorpusRead { path: path.clone(), message: one_line(e) })?,
        ))),
        _ => None,
    };
    let what = serde_json::json!({
        "format": FORMAT,
        "sources": sources.iter().map(|(s, _)| s).collect::<Vec<_>>(),
        "files": files,
        "prepare": prepare,
        "val_fraction": val_fraction,
        "tokenizer": tokenizer,
        "tokenizer_file": tokenizer_file,
    });
    Ok(hex(&Sha256::digest(what.to_string().as_bytes())))
}

/// One split of one shard: its token file and its document-start file, open.
#[derive(Debug)]
pub(crate) struct ShardFile {
    pub file: Option<std::fs::File>,
    pub tokens: u64,
    /// `NAME.SPLIT.docs`: where each document starting in this shard starts (`u64`, from the
    /// shard's first token); `None` when none starts here.
    pub docs: Option<std::fs::File>,
    pub documents: u64,
}

/// The training or validation tokens of one source: its shards' files of that split, in order.
#[derive(Debug, Default)]
pub(crate) struct SplitFiles {
    pub shards: Vec<ShardFile>,
    /// `starts[i]`: the position of shard i's first token in the split.
    pub starts: Vec<u64>,
    pub len: u64,
    /// `first_documents[i]`: the number of the first document starting in shard i.
    pub first_documents: Vec<u64>,
    /// Documents in the split.
    pub documents: u64,
}

impl SplitFiles {
    /// Copies tokens `start..start + out.len()` of the split into `out`, across shards.
    ///
    /// Positioned reads, not a memory map: a map's pages stay in the process's resident set
    /// once read, and the kernel maps 64 KiB around each faulting page, so random windows over
    /// a 1 GB corpus grew a run's peak RSS from 290 to 548 MiB in 200 steps (docs/data.md);
    /// `pread` goes through the same page cache and leaves the resident set alone.
    pub(crate) fn read(&self, start: u64, out: &mut [u32], width: u8) -> std::io::Result<()> {
        if out.is_empty() {
            // nothing to read, and a split with no shard has no `starts` to search
            return Ok(());
        }
        let w = width as usize;
        let mut pos = start;
        let mut filled = 0;
        let mut i = self.starts.partition_point(|&s| s <= pos) - 1;
        let mut bytes = Vec::new();
        while filled < out.len() {
            let shard = &self.shards[i];
            let from = pos - self.starts[i];
            let take = ((shard.tokens - from) as usize).min(out.len() - filled);
            bytes.resize(take * w, 0);
            if let Some(file) = &shard.file {
                read_at(file, &mut bytes, from * w as u64)?;
            }
            for (o, b) in out[filled..filled + take].iter_mut().zip(bytes.chunks_exact(w)) {
                *o = if w == 2 {
                    u32::from(u16::from_le_bytes([b[0], b[1]]))
                } else {
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                };
            }
            filled += take;
            pos += take as u64;
            i += 1;
        }
        Ok(())
    }
}

impl SplitFiles {
    /// The token ranges `(start, end)` of documents `first..first + out.len()` of the split
    /// (a document ends where the next starts, the last at the split's end), read from the
    /// shards' `.docs` files. A start out of order or past the split is a damaged file.
    pub(crate) fn document_ranges(&self, first: u64, out: &mut [(u64, u64)]) -> std::io::Result<()> {
        let n = out.len() as u64;
        if n == 0 {
            return Ok(());
        }
        // one start more than asked for, the end of the last, unless it is the split's end
        let wanted = (n + 1).min(self.documents - first);
        let mut starts = Vec::with_capacity(wanted as usize + 1);
        let mut g = first;
        let mut i = self.first_documents.partition_point(|&d| d <= g) - 1;
        let mut bytes = Vec::new();
        while (starts.len() as u64) < wanted {
            let shard = &self.shards[i];
            let local = g - self.first_documents[i];
            let take = (shard.documents - local).min(wanted - starts.len() as u64) as usize;
            if take > 0 {
                bytes.resize(take * 8, 0);
                let file = shard.docs.as_ref().ok_or_else(|| damaged("a .docs file is missing"))?;
                read_at(file, &mut bytes, local * 8)?;
                for b in bytes.chunks_exact(8) {
                    let at = u64::from_le_bytes(b.try_into().expect("eight bytes"));
                    if at >= shard.tokens {
                        return Err(damaged("a .docs file names a start past its shard"));
                    }
                    starts.push(self.starts[i] + at);
                }
                g += take as u64;
            }
            i += 1;
        }
        if (starts.len() as u64) == n {
            starts.push(self.len);
        }
        for (o, w) in out.iter_mut().zip(starts.windows(2)) {
            if w[1] <= w[0] {
                return Err(damaged("a .docs file holds starts out of order"));
            }
            *o = (w[0], w[1]);
        }
        Ok(())
    }
}

fn damaged(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

#[cfg(unix)]
fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &std::fs::File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// A prepared corpus opened for training: every shard's files open, after their lengths and
/// checksums were checked against the index.
#[derive(Debug)]
pub struct PreparedCorpus {
    /// The directory.
    pub dir: PathBuf,
    /// Its index.
    pub index: Index,
    /// Per source: its training split.
    pub(crate) train: Vec<SplitFiles>,
    /// Per source: its validation split.
    pub(crate) val: Vec<SplitFiles>,
}

impl PreparedCorpus {
    /// Opens `dir`: reads the index, opens every shard, and checks each one's length and
    /// CRC-32 (in parallel; a few GB/s) so that a truncated or altered shard is found before
    /// training reads it.
    pub fn open(dir: &Path) -> Result<PreparedCorpus, DataError> {
        let index = Index::read(dir)?;
        let width = index.width;
        let jobs: Vec<(usize, &ShardRecord, &str, u64, u32)> = index
            .shards
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                [(i, s, "train", s.train_tokens, s.train_crc32), (i, s, "val", s.val_tokens, s.val_crc32)]
            })
            .collect();
        let files = jobs
            .par_iter()
            .map(|&(_, s, split, tokens, crc)| {
                let documents = if split == "train" { s.train_documents } else { s.val_documents };
                Ok((open_checked(dir, &s.name, split, tokens, crc, width)?, open_docs(dir, &s.name, split, documents)?))
            })
            .collect::<Result<Vec<_>, DataError>>()?;
        let n = index.sources.len();
        let mut train: Vec<SplitFiles> = (0..n).map(|_| SplitFiles::default()).collect();
        let mut val: Vec<SplitFiles> = (0..n).map(|_| SplitFiles::default()).collect();
        for ((_, s, split, tokens, _), (file, docs)) in jobs.iter().zip(files) {
            let target = if *split == "train" { &mut train } else { &mut val };
            let Some(m) = target.get_mut(s.source) else {
                return Err(DataError::Config(format!(
                    "{}: shard {} names source {} of {n}: prepare the corpus again",
                    dir.join("index.json").display(),
                    s.name,
                    s.source
                )));
            };
            if *tokens > 0 {
                let documents = if *split == "train" { s.train_documents } else { s.val_documents };
                m.starts.push(m.len);
                m.len += tokens;
                m.first_documents.push(m.documents);
                m.documents += documents;
                m.shards.push(ShardFile { file, tokens: *tokens, docs, documents });
            }
        }
        Ok(PreparedCorpus { dir: dir.to_path_buf(), index, train, val })
    }

    /// The tokenizer it was prepared with, checked against the index's hash.
    pub fn tokenizer(&self) -> Result<Tokenizer, DataError> {
        let path = self.dir.join("tokenizer.json");
        let tokenizer = Tokenizer::load(&path)?;
        if tokenizer.sha256()? != self.index.tokenizer.sha256 {
            return Err(DataError::Config(format!(
                "{} is not the tokenizer index.json records (its SHA-256 differs): prepare the corpus again",
                path.display()
            )));
        }
        Ok(tokenizer)
    }

    /// Training tokens per source.
    pub fn train_tokens(&self) -> Vec<u64> {
        self.train.iter().map(|s| s.len).collect()
    }

    /// The validation split read in pieces, each source on its own: piece i of a source holds
    /// its tokens `i·chunk ..= (i + 1)·chunk` (one token of overlap, so that every token but
    /// each source's first is predicted in exactly one piece). Memory: one piece at a time.
    pub fn val_chunks(&self, chunk: usize) -> impl Iterator<Item = Result<Vec<u32>, DataError>> + '_ {
        let chunk = chunk.max(1) as u64;
        self.val.iter().flat_map(move |split| {
            let pieces = split.len.saturating_sub(1).div_ceil(chunk);
            (0..pieces).map(move |i| {
                let start = i * chunk;
                let end = ((i + 1) * chunk + 1).min(split.len);
                let mut out = vec![0u32; (end - start) as usize];
                split.read(start, &mut out, self.index.width).map_err(|e| self.read_error(e))?;
                Ok(out)
            })
        })
    }

    /// Validation tokens per source.
    pub fn val_tokens(&self) -> Vec<u64> {
        self.val.iter().map(|s| s.len).collect()
    }

    /// The first `n` validation tokens (fewer if there are not so many), sources in order:
    /// what a run's periodic evaluation reads.
    pub fn val_prefix(&self, n: usize) -> Result<Vec<u32>, DataError> {
        let mut out = Vec::with_capacity(n.min(self.index.val_tokens() as usize));
        for split in &self.val {
            let take = (n - out.len()).min(split.len as usize);
            let at = out.len();
            out.resize(at + take, 0);
            split.read(0, &mut out[at..], self.index.width).map_err(|e| self.read_error(e))?;
            if out.len() == n {
                break;
            }
        }
        Ok(out)
    }

    /// A shard that could not be read after it was opened (a disk gone, a file truncated since).
    pub(crate) fn read_error(&self, e: std::io::Error) -> DataError {
        DataError::CorpusRead { path: self.dir.clone(), message: format!("a shard could not be read: {}", one_line(e)) }
    }
}

/// Opens `dir/NAME.SPLIT.docs`, checking that it holds `documents` starts.
fn open_docs(dir: &Path, name: &str, split: &str, documents: u64) -> Result<Option<std::fs::File>, DataError> {
    let path = dir.join(format!("{name}.{split}.docs"));
    let bad = |problem: String| {
        DataError::Config(format!(
            "{} {problem}: the shard is damaged: delete it and run `variorum prepare` again",
            path.display()
        ))
    };
    let file = std::fs::File::open(&path).map_err(|e| bad(format!("cannot be opened ({})", one_line(e))))?;
    let len = file.metadata().map_err(|e| bad(one_line(e)))?.len();
    if len != documents * 8 {
        return Err(bad(format!("holds {len} bytes where index.json records {documents} document starts of 8 bytes")));
    }
    Ok((documents > 0).then_some(file))
}

/// Opens `dir/NAME.SPLIT.bin`, checking its length against `tokens` and its CRC-32.
fn open_checked(
    dir: &Path,
    name: &str,
    split: &str,
    tokens: u64,
    crc: u32,
    width: u8,
) -> Result<Option<std::fs::File>, DataError> {
    let path = dir.join(format!("{name}.{split}.bin"));
    let bad = |problem: String| {
        DataError::Config(format!(
            "{} {problem}: the shard is damaged: delete it and run `variorum prepare` again",
            path.display()
        ))
    };
    let mut file = std::fs::File::open(&path).map_err(|e| bad(format!("cannot be opened ({})", one_line(e))))?;
    let len = file.metadata().map_err(|e| bad(one_line(e)))?.len();
    if len != tokens * u64::from(width) {
        return Err(bad(format!("holds {len} bytes where index.json records {tokens} tokens of {width} bytes")));
    }
    if len == 0 {
        return Ok(None);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut file, &mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(bad(format!("cannot be read ({})", one_line(e)))),
        }
    }
    if hasher.finalize() != crc {
        return Err(bad("does not match its checksum in index.json".into()));
    }
    Ok(Some(file))
}
