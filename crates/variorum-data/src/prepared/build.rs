//! `variorum prepare`: sources → tokenizer → shards → `index.json`, resumable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::index::{FORMAT, Index, ShardRecord, SourceRecord, TokenizerRecord, fingerprint};
use super::sources::{DocumentReader, Holdout, Piece, ReadSettings, chosen, expand};
use super::{SourceConfig, prepared_dir};
use crate::corpus::DataConfig;
use crate::error::{DataError, one_line};
use crate::tokenizer::{CharTokenizer, Tokenizer, TokenizerConfig, temp_path};

/// Where a prepare stands, for a progress bar.
#[derive(Debug, Clone, Default)]
pub struct PrepareProgress {
    /// `"tokenizer"` while the tokenizer is learnt, `"shards"` while shards are written.
    pub phase: &'static str,
    /// Bytes of the source files read so far (on disk, so compressed where they are).
    pub bytes_read: u64,
    /// The source files' sizes on disk, summed.
    pub bytes_total: u64,
    /// Documents read so far in this phase.
    pub documents: u64,
    /// Shards finished, those kept from an interrupted prepare included.
    pub shards: usize,
}

/// What [`prepare`] did.
#[derive(Debug)]
pub struct Prepared {
    /// The directory.
    pub dir: PathBuf,
    /// Its index.
    pub index: Index,
    /// False when the directory already held this corpus (nothing was done).
    pub written: bool,
    /// Shards kept from an interrupted prepare of the same corpus.
    pub kept: usize,
}

/// `prepare.json`: what an unfinished prepare was making, so that one started again with the
/// same fingerprint keeps its finished shards.
#[derive(Serialize, Deserialize)]
struct InProgress {
    format: String,
    fingerprint: String,
}

/// Prepares the corpus of `cfg.data.sources` into `out` (default `data.prepared`), unless
/// `out/index.json` already has the same [`fingerprint`]. Finished shards of an interrupted
/// prepare of the same corpus are kept; the result is the same bytes either way.
pub fn prepare(
    cfg: &DataConfig,
    out: Option<&Path>,
    progress: &(dyn Fn(&PrepareProgress) + Sync),
) -> Result<Prepared, DataError> {
    if cfg.sources.is_empty() {
        return Err(DataError::Config(
            "data.sources is empty: list the files to prepare, e.g. sources = [{ path = \"books/\" }]".into(),
        ));
    }
    // the whole section: val_fraction in (0, 1), no layout prepared corpora cannot take, …
    cfg.validate()?;
    let dir = match out {
        Some(d) => d.to_path_buf(),
        None => prepared_dir(cfg.prepared.as_ref())?,
    };
    let sources: Vec<(SourceConfig, Vec<PathBuf>)> = cfg
        .sources
        .iter()
        .enumerate()
        .map(|(i, s)| Ok((s.clone(), expand(i, s)?)))
        .collect::<Result<_, DataError>>()?;
    let fp = fingerprint(&sources, &cfg.prepare, cfg.val_fraction, &cfg.tokenizer)?;
    let state_path = dir.join("prepare.json");
    let state = InProgress { format: FORMAT.into(), fingerprint: fp.clone() };
    if let Ok(index) = Index::read(&dir)
        && index.fingerprint == fp
    {
        if index.shards.iter().all(|s| shard_intact(&dir, s, index.width, false)) {
            return Ok(Prepared { dir, index, written: false, kept: 0 });
        }
        // a shard damaged or deleted since: prepared again, the intact shards kept
        write_atomic(&state_path, &serde_json::to_vec_pretty(&state).expect("serialisable"))?;
        let _ = std::fs::remove_file(dir.join("index.json"));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| DataError::CorpusRead { path, message: one_line(e) }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    // the same corpus, interrupted: keep its shards; anything else here is replaced
    let resuming = std::fs::read(&state_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<InProgress>(&b).ok())
        .is_some_and(|s| s.format == FORMAT && s.fingerprint == fp);
    if !resuming {
        clear(&dir)?;
        write_atomic(&state_path, &serde_json::to_vec_pretty(&state).expect("serialisable"))?;
    }

    let bytes_total: u64 =
        sources.iter().flat_map(|(_, f)| f).map(|f| f.metadata().map(|m| m.len()).unwrap_or(0)).sum();
    let read = Arc::new(AtomicU64::new(0));
    let holdout = holdouts(cfg, &sources, &read, bytes_total, progress)?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = match (resuming, tok_path.is_file()) {
        (true, true) => Tokenizer::load(&tok_path)?,
        _ => {
            let t = learn_tokenizer(cfg, &sources, &holdout, &read, bytes_total, progress)?;
            t.save(&tok_path)?;
            t
        }
    };
    let eot = tokenizer.end_of_text(cfg.prepare.eot.as_deref()).ok_or_else(|| {
        DataError::Config(match &cfg.prepare.eot {
            Some(n) => format!("data.prepare.eot = {n:?} is not a token of the tokenizer: name one it has"),
            None => "the tokenizer has no end-of-text token (<|endoftext|>, <|end_of_text|>, </s>, <eos>): name one with data.prepare.eot".into(),
        })
    })?;
    let vocab_size = tokenizer.vocab_size();
    let width: u8 = if vocab_size <= 1 << 16 { 2 } else { 4 };
    let tokenizer_sha = tokenizer.sha256()?;

    // the shards: one reader thread cutting pieces into shards' worth, tokenization on every core
    read.store(0, Ordering::Relaxed);
    let piece_bytes = (cfg.prepare.shard_bytes / 8).clamp(1024, 1 << 20) as usize;
    let mut shards: Vec<ShardRecord> = Vec::new();
    let mut records: Vec<SourceRecord> = Vec::new();
    let mut kept = 0;
    let mut documents_before = 0;
    for (si, (source, files)) in sources.iter().enumerate() {
        let settings = read_settings(cfg, si, source, piece_bytes, &holdout);
        let mut reader = DocumentReader::new(settings, files.clone(), read.clone());
        let first_shard = shards.len();
        let shard_bytes = cfg.prepare.shard_bytes as usize;
        let reading = &mut reader;
        let result: Result<(), DataError> = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Piece>>(1);
            let producer = scope.spawn(move || -> Result<(), DataError> {
                let reader = reading;
                let mut chunk: Vec<Piece> = Vec::new();
                let mut bytes = 0;
                while let Some(p) = reader.next_piece()? {
                    bytes += p.text.len();
                    chunk.push(p);
                    if bytes >= shard_bytes {
                        if tx.send(std::mem::take(&mut chunk)).is_err() {
                            return Ok(());
                        }
                        bytes = 0;
                    }
                }
                if !chunk.is_empty() {
                    let _ = tx.send(chunk);
                }
                Ok(())
            });
            let mut consumed: Result<(), DataError> = Ok(());
            for chunk in rx.iter() {
                let name = format!("shard-{:05}", shards.len());
                let done = dir.join(format!("{name}.json"));
                let kept_record = resuming
                    .then(|| std::fs::read(&done).ok())
                    .flatten()
                    .and_then(|b| serde_json::from_slice::<ShardRecord>(&b).ok())
                    .filter(|r| r.name == name && r.source == si && shard_intact(&dir, r, width, true));
                let record = match kept_record {
                    Some(r) => {
                        kept += 1;
                        r
                    }
                    _ => match write_shard(&dir, &name, si, &chunk, &tokenizer, eot, width) {
                        Ok(r) => r,
                        Err(e) => {
                            consumed = Err(e);
                            break;
                        }
                    },
                };
                shards.push(record);
                progress(&PrepareProgress {
                    phase: "shards",
                    bytes_read: read.load(Ordering::Relaxed),
                    bytes_total,
                    documents: documents_before
                        + shards.iter().map(|s| s.train_documents + s.val_documents).sum::<u64>(),
                    shards: shards.len(),
                });
            }
            drop(rx);
            let produced = producer.join().expect("the reader does not panic");
            consumed.and(produced)
        });
        result?;
        let mine = &shards[first_shard..];
        documents_before += mine.iter().map(|s| s.train_documents + s.val_documents).sum::<u64>();
        records.push(SourceRecord {
            config: source.clone(),
            files: std::mem::take(&mut reader.finished),
            documents: reader.documents,
            skipped_invalid: reader.skipped_invalid,
            train_tokens: mine.iter().map(|s| s.train_tokens).sum(),
            val_tokens: mine.iter().map(|s| s.val_tokens).sum(),
        });
    }
    let documents: u64 = records.iter().map(|r| r.documents).sum();
    let (train_docs, val_docs): (u64, u64) =
        shards.iter().fold((0, 0), |(t, v), s| (t + s.train_documents, v + s.val_documents));
    if train_docs == 0 || val_docs == 0 {
        return Err(DataError::TooShort(format!(
            "{documents} document(s) read, {val_docs} held out by {}: both splits need at least one; \
             use more documents or hold out another share (documents are held out whole)",
            match cfg.prepare.val_documents {
                Some(n) => format!("data.prepare.val_documents = {n}"),
                None => format!("data.val_fraction = {}", cfg.val_fraction),
            }
        )));
    }
    let index = Index {
        format: FORMAT.into(),
        fingerprint: fp,
        tokenizer: TokenizerRecord { config: cfg.tokenizer.clone(), sha256: tokenizer_sha, vocab_size, eot },
        width,
        val_fraction: cfg.val_fraction,
        prepare: cfg.prepare.clone(),
        sources: records,
        shards,
    };
    write_atomic(&dir.join("index.json"), &serde_json::to_vec_pretty(&index).expect("serialisable"))?;
    let _ = std::fs::remove_file(&state_path);
    Ok(Prepared { dir, index, written: true, kept })
}

/// Whether shard `r`'s files are there at the lengths it records, and with `checksums`, its
/// CRC-32s too (what a kept shard of an interrupted prepare must pass; a finished corpus is
/// checked by length only here, and fully when a run opens it).
fn shard_intact(dir: &Path, r: &ShardRecord, width: u8, checksums: bool) -> bool {
    let file = |split: &str, ext: &str| dir.join(format!("{}.{split}.{ext}", r.name));
    let len = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).ok();
    [("train", r.train_tokens, r.train_documents, r.train_crc32), ("val", r.val_tokens, r.val_documents, r.val_crc32)]
        .into_iter()
        .all(|(split, tokens, documents, crc)| {
            len(file(split, "bin")) == Some(tokens * u64::from(width))
                && len(file(split, "docs")) == Some(documents * 8)
                && (!checksums || std::fs::read(file(split, "bin")).is_ok_and(|b| crc32fast::hash(&b) == crc))
        })
}

/// How source `si` is read: its text field, the holdout settings, pieces of `piece_bytes`.
fn read_settings(
    cfg: &DataConfig,
    si: usize,
    source: &SourceConfig,
    piece_bytes: usize,
    holdout: &[Holdout],
) -> ReadSettings {
    ReadSettings {
        source: si,
        text_field: source.text_field.clone(),
        invalid_utf8: cfg.prepare.invalid_utf8,
        piece_bytes,
        seed: cfg.prepare.seed,
        holdout: holdout.get(si).cloned().unwrap_or(Holdout::Fraction(cfg.val_fraction)),
    }
}

/// Each source's holdout: `data.val_fraction`, or with `data.prepare.val_documents = n`, the
/// `n` documents [`chosen`] among those a first pass over the source counts.
fn holdouts(
    cfg: &DataConfig,
    sources: &[(SourceConfig, Vec<PathBuf>)],
    read: &Arc<AtomicU64>,
    bytes_total: u64,
    progress: &(dyn Fn(&PrepareProgress) + Sync),
) -> Result<Vec<Holdout>, DataError> {
    let Some(n) = cfg.prepare.val_documents else {
        return Ok(vec![Holdout::Fraction(cfg.val_fraction); sources.len()]);
    };
    if n == 0 {
        return Err(DataError::Config(
            "data.prepare.val_documents = 0 holds out nothing to validate on: give a count of at least 1, or remove it to hold out data.val_fraction".into(),
        ));
    }
    let mut out = Vec::with_capacity(sources.len());
    let mut counted = 0;
    for (si, (s, files)) in sources.iter().enumerate() {
        let settings = read_settings(cfg, si, s, 1 << 20, &[Holdout::Fraction(0.0)]);
        let mut reader = DocumentReader::new(settings, files.clone(), read.clone());
        while reader.next_piece()?.is_some() {
            progress(&PrepareProgress {
                phase: "counting",
                bytes_read: read.load(Ordering::Relaxed),
                bytes_total,
                documents: counted + reader.documents,
                shards: 0,
            });
        }
        counted += reader.documents;
        if n >= reader.documents {
            return Err(DataError::TooShort(format!(
                "data.sources[{si}] ({}) has {} documents: holding out data.prepare.val_documents = {n} of them leaves none to train on; hold out fewer",
                s.path, reader.documents
            )));
        }
        out.push(Holdout::Chosen(Arc::new(chosen(cfg.prepare.seed, si, reader.documents, n))));
    }
    read.store(0, Ordering::Relaxed);
    Ok(out)
}

/// Removes what an earlier prepare of another corpus left in `dir`.
fn clear(dir: &Path) -> Result<(), DataError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| DataError::CorpusRead { path: dir.to_path_buf(), message: one_line(e) })?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours =
            name.starts_with("shard-") || ["index.json", "tokenizer.json", "prepare.json"].contains(&name.as_str());
        if ours {
            std::fs::remove_file(entry.path())
                .map_err(|e| DataError::CorpusRead { path: entry.path(), message: one_line(e) })?;
        }
    }
    Ok(())
}

/// The tokenizer of `data.tokenizer`: char from every character of every document (and
/// U+0003, the end of text); BPE from the first `tokenizer_sample_bytes / sources` bytes of
/// each source's training documents; byte and file as they are.
fn learn_tokenizer(
    cfg: &DataConfig,
    sources: &[(SourceConfig, Vec<PathBuf>)],
    holdout: &[Holdout],
    read: &Arc<AtomicU64>,
    bytes_total: u64,
    progress: &(dyn Fn(&PrepareProgress) + Sync),
) -> Result<Tokenizer, DataError> {
    let readers = || {
        sources.iter().enumerate().map(|(si, (s, files))| {
            DocumentReader::new(read_settings(cfg, si, s, 1 << 20, holdout), files.clone(), read.clone())
        })
    };
    let tell = |documents| {
        progress(&PrepareProgress {
            phase: "tokenizer",
            bytes_read: read.load(Ordering::Relaxed),
            bytes_total,
            documents,
            shards: 0,
        })
    };
    match &cfg.tokenizer {
        TokenizerConfig::Char => {
            // one flag per Unicode scalar value (1.1 MB): a set lookup per character would be
            // the slowest part of the pass
            let mut seen = vec![false; 0x11_0000];
            seen[3] = true;
            let mut documents = 0;
            for mut reader in readers() {
                while let Some(p) = reader.next_piece()? {
                    documents += u64::from(p.starts_doc);
                    p.text.chars().for_each(|c| seen[c as usize] = true);
                    tell(documents);
                }
            }
            let vocab = (0..0x11_0000u32).filter(|&c| seen[c as usize]).filter_map(char::from_u32).collect();
            Ok(Tokenizer::Char(CharTokenizer::new(vocab)?))
        }
        TokenizerConfig::Bpe { .. } => {
            let per_source = (cfg.prepare.tokenizer_sample_bytes / sources.len() as u64).max(1) as usize;
            let mut sample = String::new();
            for mut reader in readers() {
                let mut taken = 0;
                while taken < per_source
                    && let Some(p) = reader.next_piece()?
                {
                    if p.val {
                        continue;
                    }
                    let end = (per_source - taken).min(p.text.len());
                    let end = (end..=p.text.len()).find(|&i| p.text.is_char_boundary(i)).unwrap_or(p.text.len());
                    sample.push_str(&p.text[..end]);
                    if p.ends_doc || end < p.text.len() {
                        sample.push('\n');
                    }
                    taken += end;
                    tell(reader.documents);
                }
            }
            Tokenizer::train_bpe_with_end_of_text(&sample, &cfg.tokenizer)
        }
        other => Tokenizer::train(other, ""),
    }
}

/// Tokenizes one shard's pieces on every core and writes its files, the record last. Each
/// piece is encoded straight to the shard's width (its `u32` ids live only while it is
/// encoded) and the pieces are written one after another, never joined: what the shard holds
/// at once is its text and its tokens at their width.
fn write_shard(
    dir: &Path,
    name: &str,
    source: usize,
    pieces: &[Piece],
    tokenizer: &Tokenizer,
    eot: u32,
    width: u8,
) -> Result<ShardRecord, DataError> {
    let encoded = pieces
        .par_iter()
        .map(|p| {
            let ids = tokenizer.encode(&p.text)?;
            let mut bytes = Vec::with_capacity((ids.len() + 1) * usize::from(width));
            for id in ids.into_iter().chain(p.ends_doc.then_some(eot)) {
                match width {
                    2 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
                    _ => bytes.extend_from_slice(&id.to_le_bytes()),
                }
            }
            Ok((bytes, p.text.chars().count() as u64))
        })
        .collect::<Result<Vec<_>, DataError>>()?;
    #[derive(Default)]
    struct Split {
        crc: crc32fast::Hasher,
        tokens: u64,
        docs: Vec<u8>,
        documents: u64,
        chars: u64,
    }
    let mut splits = [Split::default(), Split::default()];
    for (p, (bytes, chars)) in pieces.iter().zip(&encoded) {
        let s = &mut splits[usize::from(p.val)];
        if p.starts_doc {
            s.docs.extend_from_slice(&s.tokens.to_le_bytes());
            s.documents += 1;
        }
        s.chars += chars;
        s.crc.update(bytes);
        s.tokens += (bytes.len() / usize::from(width)) as u64;
    }
    for (split, val) in [("train", false), ("val", true)] {
        let parts = pieces.iter().zip(&encoded).filter(|(p, _)| p.val == val).map(|(_, (b, _))| &b[..]);
        write_atomic_parts(&dir.join(format!("{name}.{split}.bin")), parts)?;
        write_atomic(&dir.join(format!("{name}.{split}.docs")), &splits[usize::from(val)].docs)?;
    }
    let [train, val] = splits;
    let record = ShardRecord {
        name: name.into(),
        source,
        train_tokens: train.tokens,
        val_tokens: val.tokens,
        train_documents: train.documents,
        val_documents: val.documents,
        train_chars: train.chars,
        val_chars: val.chars,
        train_crc32: train.crc.finalize(),
        val_crc32: val.crc.finalize(),
    };
    write_atomic(&dir.join(format!("{name}.json")), &serde_json::to_vec_pretty(&record).expect("serialisable"))?;
    Ok(record)
}

/// Writes `bytes` beside `path` and renames the file into place, so that a reader (or a
/// prepare started again after a kill) never sees a partial file; a failed write (a full disk)
/// removes its temporary file and names the path.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    write_atomic_parts(path, std::iter::once(bytes))
}

/// [`write_atomic`] of `parts` written one after another.
fn write_atomic_parts<'a>(path: &Path, parts: impl Iterator<Item = &'a [u8]>) -> Result<(), DataError> {
    use std::io::Write;
    let tmp = temp_path(path);
    let written = std::fs::File::create(&tmp)
        .and_then(|file| {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            for part in parts {
                out.write_all(part)?;
            }
            out.into_inner().map_err(std::io::IntoInnerError::into_error)?.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        DataError::Write { path: path.to_path_buf(), message: one_line(e) }
    })
}
