//! What a prepared corpus must keep: every document, whole, in the split its hash chose; the
//! same bytes after an interrupted prepare; windows that are a function of (seed, step) and
//! draw each source at its share; a damaged shard found before it is read.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::sources::{DocumentReader, Holdout, ReadSettings, held_out, holdout_hash};
use super::*;
use crate::corpus::DataConfig;
use crate::tokenizer::{Tokenizer, TokenizerConfig};

fn quiet(_: &PrepareProgress) {}

/// Documents of varied length and alphabet, numbered so that each is unique.
fn doc(i: usize) -> String {
    let words = ["tyger", "burning", "bright", "forests", "night", "immortal", "hand", "eye", "fearful", "symmetry"];
    (0..(3 + i * 7 % 23)).map(|k| words[(i + k * 3) % words.len()]).collect::<Vec<_>>().join(" ") + &format!(" #{i}\n")
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn jsonl(docs: &[String]) -> Vec<u8> {
    docs.iter().map(|d| serde_json::json!({ "id": 1, "text": d }).to_string() + "\n").collect::<String>().into_bytes()
}

/// Every piece of `files` read as source 0 (half held out), and the reader after its last.
fn read_pieces(
    files: Vec<PathBuf>,
    text_field: Option<&str>,
    invalid_utf8: InvalidUtf8,
    piece_bytes: usize,
) -> (Vec<super::sources::Piece>, DocumentReader) {
    let settings = ReadSettings {
        source: 0,
        text_field: text_field.map(Into::into),
        invalid_utf8,
        piece_bytes,
        seed: 0,
        holdout: Holdout::Fraction(0.5),
    };
    let mut reader = DocumentReader::new(settings, files, Arc::new(AtomicU64::new(0)));
    let mut pieces = Vec::new();
    while let Some(p) = reader.next_piece().unwrap() {
        pieces.push(p);
    }
    (pieces, reader)
}

/// A corpus of three sources: a directory of text files (one document each), gzipped JSON
/// Lines and zstd JSON Lines. Returns its config and every document per source, in order.
fn corpus(root: &Path, shard_bytes: u64) -> (DataConfig, Vec<Vec<String>>) {
    let books: Vec<String> = (0..6).map(doc).collect();
    for (i, d) in books.iter().enumerate() {
        write(&root.join(format!("books/b{i}.txt")), d.as_bytes());
    }
    let web: Vec<String> = (6..46).map(doc).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&jsonl(&web)).unwrap();
    write(&root.join("web/part-0.jsonl.gz"), &gz.finish().unwrap());
    let more: Vec<String> = (46..86).map(doc).collect();
    write(&root.join("more/a.jsonl.zst"), &zstd::encode_all(&jsonl(&more)[..], 3).unwrap());
    let src =
        |path: String, field: Option<&str>| SourceConfig { path, text_field: field.map(Into::into), weight: None };
    let cfg = DataConfig {
        dataset: None,
        sources: vec![
            src(root.join("books").display().to_string(), None),
            src(root.join("web/*.jsonl.gz").display().to_string(), Some("text")),
            src(root.join("more/a.jsonl.zst").display().to_string(), Some("text")),
        ],
        prepared: Some(root.join("prepared")),
        prepare: PrepareConfig { shard_bytes, ..PrepareConfig::default() },
        val_fraction: 0.25,
        ..DataConfig::default()
    };
    (cfg, vec![books, web, more])
}

/// Every document of a split of a prepared corpus, per source, read back from its shards
/// and `.docs` files and decoded.
fn read_back(dir: &Path, split: &str) -> Vec<Vec<String>> {
    let index = Index::read(dir).unwrap();
    let tokenizer = Tokenizer::load(&dir.join("tokenizer.json")).unwrap();
    let mut out = vec![Vec::new(); index.sources.len()];
    for s in &index.shards {
        let bytes = std::fs::read(dir.join(format!("{}.{split}.bin", s.name))).unwrap();
        let ids: Vec<u32> = match index.width {
            2 => bytes.chunks(2).map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))).collect(),
            _ => bytes.chunks(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        };
        let starts: Vec<usize> = std::fs::read(dir.join(format!("{}.{split}.docs", s.name)))
            .unwrap()
            .chunks(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize)
            .collect();
        for (k, &a) in starts.iter().enumerate() {
            let b = starts.get(k + 1).copied().unwrap_or(ids.len());
            assert_eq!(ids[b - 1], index.tokenizer.eot, "every document ends with the end-of-text token");
            out[s.source].push(tokenizer.decode(&ids[a..b - 1]));
        }
    }
    out
}

#[test]
fn every_document_survives_whole_in_the_split_its_hash_chose() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, docs) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    assert!(p.written);
    assert!(p.index.shards.len() > 3, "small shards: several per source ({})", p.index.shards.len());
    let (train, val) = (read_back(&p.dir, "train"), read_back(&p.dir, "val"));
    for (s, docs) in docs.iter().enumerate() {
        let want = |v: bool| -> Vec<String> {
            docs.iter()
                .enumerate()
                .filter(|(n, _)| held_out(0, s, *n as u64, 0.25) == v)
                .map(|(_, d)| d.clone())
                .collect()
        };
        assert_eq!(train[s], want(false), "source {s}: training documents, in order");
        assert_eq!(val[s], want(true), "source {s}: held-out documents, in order");
        assert_eq!(p.index.sources[s].documents, docs.len() as u64);
    }
    let held: usize = val.iter().map(Vec::len).sum();
    assert!((10..=35).contains(&held), "about a quarter of 86 documents held out: {held}");
    // recorded files: their sizes and hashes
    let f = &p.index.sources[1].files[0];
    assert_eq!(f.bytes, std::fs::metadata(&f.path).unwrap().len());
    assert_eq!(f.sha256, super::sources::hex(&sha2::Sha256::digest(std::fs::read(&f.path).unwrap())));
    // opening checks it; the validation prefix is the held-out tokens
    let opened = PreparedCorpus::open(&p.dir).unwrap();
    assert_eq!(opened.val_prefix(usize::MAX >> 8).unwrap().len() as u64, p.index.val_tokens());
    assert_eq!(opened.train_tokens().iter().sum::<u64>(), p.index.train_tokens());
    use sha2::Digest;
}

#[test]
fn a_prepare_started_again_keeps_finished_shards_and_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let snapshot = |dir: &Path| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&f).unwrap()))
            .collect()
    };
    let before = snapshot(&p.dir);
    // killed after shard 3: no index, later shards gone or half written, the state file left
    let n = p.index.shards.len();
    std::fs::remove_file(p.dir.join("index.json")).unwrap();
    for s in &p.index.shards[4..] {
        for ext in ["json", "train.bin", "train.docs", "val.bin", "val.docs"] {
            let _ = std::fs::remove_file(p.dir.join(format!("{}.{ext}", s.name)));
        }
    }
    std::fs::write(p.dir.join(format!("{}.train.bin.tmp", p.index.shards[4].name)), b"partial").unwrap();
    let state = serde_json::json!({ "format": super::index::FORMAT, "fingerprint": p.index.fingerprint });
    std::fs::write(p.dir.join("prepare.json"), state.to_string()).unwrap();
    let again = prepare(&cfg, None, &quiet).unwrap();
    assert_eq!((again.written, again.kept), (true, 4), "{n} shards");
    let mut after = snapshot(&p.dir);
    after.retain(|k, _| !k.ends_with(".tmp"));
    assert_eq!(after, before, "the same files, byte for byte");
    // unchanged sources: nothing to do; a changed source: prepared again
    assert!(!prepare(&cfg, None, &quiet).unwrap().written);
    std::fs::write(tmp.path().join("books/b0.txt"), "a changed book\n").unwrap();
    assert!(prepare(&cfg, None, &quiet).unwrap().written);
}

#[test]
fn a_text_file_read_in_pieces_encodes_as_the_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let text: String = (0..400).map(doc).collect();
    let path = tmp.path().join("big.txt");
    write(&path, text.as_bytes());
    let (pieces, _) = read_pieces(vec![path], None, InvalidUtf8::Skip, 1024);
    assert!(pieces.len() > 10, "cut into pieces: {}", pieces.len());
    assert!(pieces[0].starts_doc && pieces.last().unwrap().ends_doc);
    assert_eq!(pieces.iter().filter(|p| p.starts_doc).count(), 1, "one document");
    assert!(pieces.iter().all(|p| p.val == pieces[0].val), "a document stays in one split");
    assert_eq!(pieces.iter().map(|p| p.text.as_str()).collect::<String>(), text);
    let bpe = Tokenizer::train(&TokenizerConfig::Bpe { vocab_size: 400, min_frequency: 2 }, &text).unwrap();
    let by_piece: Vec<u32> = pieces.iter().flat_map(|p| bpe.encode(&p.text).unwrap()).collect();
    assert_eq!(by_piece, bpe.encode(&text).unwrap(), "cut where BPE tokens cannot cross");
}

#[test]
fn mixture_windows_draw_each_source_at_its_weight_and_never_mix_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = |c: char| (0..40).map(|i| format!("{}\n", c.to_string().repeat(30 + i))).collect::<Vec<_>>();
    write(&tmp.path().join("a.jsonl"), &jsonl(&docs('a')));
    write(&tmp.path().join("b.jsonl"), &jsonl(&docs('b')));
    let src = |n: &str, w| SourceConfig {
        path: tmp.path().join(n).display().to_string(),
        text_field: Some("text".into()),
        weight: w,
    };
    let mut cfg = DataConfig {
        dataset: None,
        sources: vec![src("a.jsonl", Some(3.0)), src("b.jsonl", Some(1.0))],
        prepared: Some(tmp.path().join("p")),
        ..DataConfig::default()
    };
    let p = prepare(&cfg, None, &quiet).unwrap();
    let corpus = Arc::new(PreparedCorpus::open(&p.dir).unwrap());
    let tok = corpus.tokenizer().unwrap();
    let w = MixtureWindows::new(corpus.clone(), 16, 8, 5).unwrap();
    assert_eq!(w.batch(7).unwrap(), w.batch(7).unwrap(), "a function of (seed, step)");
    assert_ne!(w.batch(7).unwrap().inputs, w.batch(8).unwrap().inputs);
    for step in 0..50 {
        let b = w.batch(step).unwrap();
        for row in 0..8 {
            let text = tok.decode(&b.inputs[row * 16..(row + 1) * 16].iter().map(|&t| t as u32).collect::<Vec<_>>());
            assert!(!(text.contains('a') && text.contains('b')), "one source per window: {text:?}");
            assert_eq!(b.inputs[row * 16 + 1..(row + 1) * 16], b.targets[row * 16..(row + 1) * 16 - 1]);
        }
    }
    let drawn = w.drawn(500);
    assert_eq!(w.intended(), vec![0.75, 0.25]);
    assert!((drawn[0] - 0.75).abs() < 0.03, "drawn {drawn:?}");
    // without weights: in proportion to the tokens
    cfg.sources.iter_mut().for_each(|s| s.weight = None);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let tokens = p.index.sources.iter().map(|s| s.train_tokens as f64).collect::<Vec<_>>();
    let w = MixtureWindows::new(Arc::new(PreparedCorpus::open(&p.dir).unwrap()), 16, 8, 5).unwrap();
    assert!((w.intended()[0] - tokens[0] / (tokens[0] + tokens[1])).abs() < 1e-12);
}

#[test]
fn a_vocabulary_past_u16_is_stored_as_u32() {
    let tmp = tempfile::tempdir().unwrap();
    // 70,000 distinct characters (CJK ideographs, Hangul, CJK extension B) over 40 documents
    let chars: Vec<char> = (0x4E00..0x9FFF)
        .chain(0xAC00..0xD7A3)
        .chain(0x20000..0x2A6DF)
        .filter_map(char::from_u32)
        .take(70_000)
        .collect();
    let docs: Vec<String> = chars.chunks(1750).map(|c| c.iter().collect()).collect();
    write(&tmp.path().join("wide.jsonl"), &jsonl(&docs));
    let cfg = DataConfig {
        dataset: None,
        sources: vec![SourceConfig {
            path: tmp.path().join("wide.jsonl").display().to_string(),
            text_field: Some("text".into()),
            weight: None,
        }],
        prepared: Some(tmp.path().join("p")),
        val_fraction: 0.2,
        ..DataConfig::default()
    };
    let p = prepare(&cfg, None, &quiet).unwrap();
    assert_eq!((p.index.width, p.index.tokenizer.vocab_size), (4, 70_001));
    let back: Vec<String> =
        read_back(&p.dir, "train").concat().into_iter().chain(read_back(&p.dir, "val").concat()).collect();
    let mut want = docs.clone();
    let mut got = back;
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

fn one_source(root: &Path, name: &str, bytes: &[u8], field: Option<&str>) -> DataConfig {
    write(&root.join(name), bytes);
    DataConfig {
        dataset: None,
        sources: vec![SourceConfig {
            path: root.join(name).display().to_string(),
            text_field: field.map(Into::into),
            weight: None,
        }],
        prepared: Some(root.join("p")),
        val_fraction: 0.3,
        ..DataConfig::default()
    }
}

fn error(cfg: &DataConfig) -> String {
    let e = prepare(cfg, None, &quiet).unwrap_err().to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn bad_sources_are_named_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let good: Vec<String> = (0..20).map(doc).collect();
    let mut lines = jsonl(&good);
    lines.extend_from_slice(b"{\"text\": \"no end\n");
    let e = error(&one_source(tmp.path(), "bad.jsonl", &lines, Some("text")));
    assert!(e.contains("bad.jsonl, line 21") && e.contains("not JSON"), "{e}");
    let e = error(&one_source(tmp.path(), "nofield.jsonl", &jsonl(&good), Some("body")));
    assert!(e.contains("nofield.jsonl, line 1") && e.contains("no field \"body\""), "{e}");
    // not UTF-8: skipped and counted, or refused
    let mut latin = jsonl(&good);
    latin.extend_from_slice(b"{\"text\": \"caf\xe9\"}\n");
    let mut cfg = one_source(tmp.path(), "latin.jsonl", &latin, Some("text"));
    let p = prepare(&cfg, None, &quiet).unwrap();
    assert_eq!((p.index.sources[0].skipped_invalid, p.index.sources[0].documents), (1, 20));
    cfg.prepare.invalid_utf8 = InvalidUtf8::Refuse;
    let e = error(&cfg);
    assert!(e.contains("latin.jsonl, line 21") && e.contains("not UTF-8"), "{e}");
    // nothing there, or nothing in it
    let e = error(&one_source(tmp.path(), "empty.txt", b"", None));
    assert!(e.contains("empty.txt") && e.contains("all empty"), "{e}");
    let mut cfg = one_source(tmp.path(), "x.txt", b"x", None);
    cfg.sources[0].path = tmp.path().join("none/*.jsonl").display().to_string();
    assert!(error(&cfg).contains("matches no file"));
    // a weight on some sources only
    let mut cfg = one_source(tmp.path(), "a.jsonl", &jsonl(&good), Some("text"));
    cfg.sources.push(SourceConfig { weight: Some(1.0), ..cfg.sources[0].clone() });
    assert!(error(&cfg).contains("1 of 2 sources have a weight"));
    // a tokenizer file without an end-of-text token, or with none of the name given
    let mut cfg = one_source(tmp.path(), "a.jsonl", &jsonl(&good), Some("text"));
    let bpe = Tokenizer::train(&TokenizerConfig::Bpe { vocab_size: 300, min_frequency: 2 }, &good.concat()).unwrap();
    bpe.save(&tmp.path().join("tok.json")).unwrap();
    cfg.tokenizer = TokenizerConfig::File { path: tmp.path().join("tok.json") };
    assert!(error(&cfg).contains("no end-of-text token"));
}

#[test]
fn a_damaged_shard_is_found_before_training_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let shard: PathBuf = p.dir.join(format!("{}.train.bin", p.index.shards[1].name));
    let bytes = std::fs::read(&shard).unwrap();
    let mut flipped = bytes.clone();
    flipped[3] ^= 1;
    std::fs::write(&shard, &flipped).unwrap();
    let e = PreparedCorpus::open(&p.dir).unwrap_err().to_string();
    assert!(e.contains(&shard.display().to_string()) && e.contains("checksum"), "{e}");
    // as the message says: deleted and prepared again, it is rewritten, the others kept
    assert!(e.contains("delete it and run `variorum prepare` again"), "{e}");
    std::fs::remove_file(&shard).unwrap();
    let again = prepare(&cfg, None, &quiet).unwrap();
    assert_eq!((again.written, again.kept), (true, p.index.shards.len() - 1));
    assert_eq!(std::fs::read(&shard).unwrap(), bytes);
    std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
    let e = PreparedCorpus::open(&p.dir).unwrap_err().to_string();
    assert!(e.contains("holds") && e.contains("bytes where index.json records"), "{e}");
    assert!(prepare(&cfg, None, &quiet).unwrap().written, "a truncated shard is found by its length");
    PreparedCorpus::open(&p.dir).unwrap();
}

/// A Parquet file as pandas writes one: an `id` column and a nullable UTF-8 `column`,
/// Snappy-compressed, in two row groups.
fn write_parquet(path: &Path, docs: &[Option<String>], column: &str) {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = format!("message doc {{ required int64 id; optional binary {column} (UTF8); }}");
    let schema = Arc::new(parquet::schema::parser::parse_message_type(&schema).unwrap());
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    for group in docs.chunks(docs.len().div_ceil(2)) {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let ids: Vec<i64> = (0..group.len() as i64).collect();
        col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group.iter().flatten().map(|d| ByteArray::from(d.as_str())).collect();
        let defined: Vec<i16> = group.iter().map(|d| i16::from(d.is_some())).collect();
        col.typed::<ByteArrayType>().write_batch(&values, Some(&defined), None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn parquet_rows_are_documents_of_their_text_column() {
    let tmp = tempfile::tempdir().unwrap();
    let mut docs: Vec<Option<String>> = (0..30).map(|i| Some(doc(i))).collect();
    docs[7] = None; // a null is no document
    write_parquet(&tmp.path().join("t.parquet"), &docs, "content");
    let mut cfg = one_source(tmp.path(), "x.txt", b"x", Some("content"));
    cfg.sources[0].path = tmp.path().join("*.parquet").display().to_string();
    let p = prepare(&cfg, None, &quiet).unwrap();
    assert_eq!(p.index.sources[0].documents, 29);
    let mut back: Vec<String> = read_back(&p.dir, "train").concat();
    back.extend(read_back(&p.dir, "val").concat());
    let mut want: Vec<String> = docs.into_iter().flatten().collect();
    back.sort();
    want.sort();
    assert_eq!(back, want);
    cfg.sources[0].text_field = Some("text".into());
    let e = error(&cfg);
    assert!(e.contains("t.parquet") && e.contains("no column \"text\" (it has id, content)"), "{e}");
}

#[test]
fn validation_chunks_cover_each_source_once_with_one_token_of_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let corpus = PreparedCorpus::open(&p.dir).unwrap();
    let per_source: Vec<Vec<u32>> = corpus
        .val
        .iter()
        .map(|split| {
            let mut all = vec![0u32; split.len as usize];
            split.read(0, &mut all, corpus.index.width).unwrap();
            all
        })
        .collect();
    assert_eq!(per_source.concat(), corpus.val_prefix(usize::MAX >> 8).unwrap());
    for chunk in [1, 7, 100, 1 << 20] {
        let want: Vec<Vec<u32>> = per_source
            .iter()
            .flat_map(|t| {
                let n = t.len().saturating_sub(1).div_ceil(chunk);
                (0..n).map(move |i| t[i * chunk..((i + 1) * chunk + 1).min(t.len())].to_vec())
            })
            .collect();
        let got: Vec<Vec<u32>> = corpus.val_chunks(chunk).map(Result::unwrap).collect();
        assert_eq!(got, want, "chunk {chunk}");
        let predicted: usize = got.iter().map(|p| p.len() - 1).sum();
        assert_eq!(predicted, per_source.iter().map(|t| t.len() - 1).sum::<usize>(), "each prediction once");
    }
}

#[test]
fn a_text_file_of_many_byte_characters_survives_reads_that_cut_them() {
    let tmp = tempfile::tempdir().unwrap();
    // two-, three- and four-byte characters throughout: the 64 KiB reads cut some of them
    let text: String = (0..6000).map(|i| format!("ça va {i} 東京 𝄞\n")).collect();
    let path = tmp.path().join("wide.txt");
    write(&path, text.as_bytes());
    let (pieces, reader) = read_pieces(vec![path], None, InvalidUtf8::Refuse, 1024);
    let joined: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(joined, text);
    assert_eq!(reader.skipped_invalid, 0);
    // a text file with a byte that is not UTF-8 is skipped, and counted once
    let bad = tmp.path().join("latin.txt");
    write(&bad, b"caf\xe9 au lait\n");
    let (pieces, reader) = read_pieces(vec![bad, tmp.path().join("wide.txt")], None, InvalidUtf8::Skip, 1024);
    let joined: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!((joined == text, reader.skipped_invalid, reader.documents), (true, 1, 1));
}

/// Per source of a split: its tokens, shards concatenated, and where its documents start,
/// read straight from the files.
fn split_files(dir: &Path, split: &str) -> Vec<(Vec<u32>, Vec<usize>)> {
    let index = Index::read(dir).unwrap();
    let mut out = vec![(Vec::new(), Vec::new()); index.sources.len()];
    for s in &index.shards {
        let (ids, starts) = &mut out[s.source];
        let at = ids.len();
        let bytes = std::fs::read(dir.join(format!("{}.{split}.bin", s.name))).unwrap();
        ids.extend(bytes.chunks(index.width as usize).map(|b| match b.len() {
            2 => u32::from(u16::from_le_bytes([b[0], b[1]])),
            _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }));
        let docs = std::fs::read(dir.join(format!("{}.{split}.docs", s.name))).unwrap();
        starts.extend(docs.chunks(8).map(|b| at + u64::from_le_bytes(b.try_into().unwrap()) as usize));
    }
    out
}

#[test]
fn ordered_streams_of_shards_are_those_of_the_concatenated_split() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let corpus = Arc::new(PreparedCorpus::open(&p.dir).unwrap());
    for (split, name) in [(Split::Train, "train"), (Split::Validation, "val")] {
        let all: Vec<u32> = split_files(&p.dir, name).into_iter().flat_map(|(ids, _)| ids).collect();
        let want = crate::OrderedStreams::new(Arc::new(all), 7, 3).unwrap();
        let got = PreparedOrderedStreams::new(corpus.clone(), split, 7, 3).unwrap();
        assert_eq!(got.segments_per_epoch(), want.segments_per_epoch() as u64);
        for step in (0..got.segments_per_epoch() + 3).chain([1_000_003]) {
            let (g, w) = (got.batch(step).unwrap(), want.batch(step));
            assert_eq!((&g.inputs, &g.targets, &g.reset), (&w.inputs, &w.targets, &w.reset), "{name} step {step}");
        }
    }
    let too_many = PreparedOrderedStreams::new(corpus, Split::Validation, 1 << 20, 2).unwrap_err().to_string();
    assert!(too_many.contains("validation split") && !too_many.contains('\n'), "{too_many}");
}

/// Document streams as their definition says, over tokens and starts held whole: row r reads
/// documents r·D/B .. (r + 1)·D/B in segments of `len` predictions, each document from a new
/// segment. Returns every row's segments as (source, start, predictions, first).
fn document_segments(
    sources: &[(Vec<u32>, Vec<usize>)],
    len: usize,
    rows: usize,
) -> Vec<Vec<(usize, usize, usize, bool)>> {
    let docs: Vec<(usize, usize, usize)> = sources
        .iter()
        .enumerate()
        .flat_map(|(s, (ids, starts))| {
            starts.iter().enumerate().map(move |(k, &a)| (s, a, starts.get(k + 1).copied().unwrap_or(ids.len())))
        })
        .collect();
    (0..rows)
        .map(|r| {
            let span = docs.len() * r / rows..docs.len() * (r + 1) / rows;
            docs[span]
                .iter()
                .flat_map(|&(s, a, b)| {
                    (0..b - a - 1).step_by(len).map(move |o| (s, a + o, len.min(b - a - 1 - o), o == 0))
                })
                .collect()
        })
        .collect()
}

#[test]
fn document_streams_of_shards_read_every_document_whole_from_a_segment_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    // 3,000 short documents, some empty, and one book longer than a shard
    let short: Vec<String> = (0..3000).map(|i| "ab".repeat(i * 7 % 11)).collect();
    write(&tmp.path().join("short.jsonl"), &jsonl(&short));
    write(&tmp.path().join("book.txt"), (0..200).map(doc).collect::<String>().as_bytes());
    let src = |n: &str, field: Option<&str>| SourceConfig {
        path: tmp.path().join(n).display().to_string(),
        text_field: field.map(Into::into),
        weight: None,
    };
    let cfg = DataConfig {
        dataset: None,
        sources: vec![src("short.jsonl", Some("text")), src("book.txt", None)],
        prepared: Some(tmp.path().join("p")),
        prepare: PrepareConfig { shard_bytes: 2048, ..PrepareConfig::default() },
        val_fraction: 0.1,
        ..DataConfig::default()
    };
    let p = prepare(&cfg, None, &quiet).unwrap();
    let corpus = Arc::new(PreparedCorpus::open(&p.dir).unwrap());
    let files = split_files(&p.dir, "train");
    let book = &files[1];
    assert_eq!(book.1, vec![0], "the book is one document");
    assert!(p.index.shards.iter().filter(|s| s.source == 1).count() > 2, "over several shards");
    let (len, rows) = (5, 2);
    let want = document_segments(&files, len, rows);
    assert!(want[0].len() > 1024, "a row of more than one block of documents");
    let got = PreparedDocumentStreams::new(corpus.clone(), Split::Train, len, rows).unwrap();
    assert_eq!(got.segments_per_epoch(), want.iter().map(Vec::len).max().unwrap() as u64);
    let expect_row = |segs: &Vec<(usize, usize, usize, bool)>, k: Option<usize>| {
        let mut inputs = vec![0i64; len];
        let mut targets = vec![crate::NO_TARGET; len];
        let mut reset = true;
        if let Some(&(s, a, n, first)) = k.map(|k| &segs[k]) {
            for i in 0..n {
                inputs[i] = i64::from(files[s].0[a + i]);
                targets[i] = i64::from(files[s].0[a + i + 1]);
            }
            reset = first;
        }
        (inputs, targets, reset)
    };
    let steps = (0..40u64).chain([1023, 1024, 1025, 2047, 2048, 2600, got.segments_per_epoch() - 1, 99_999]);
    for step in steps {
        let b = got.batch(step).unwrap();
        for (r, segs) in want.iter().enumerate() {
            let (i, t, reset) = expect_row(segs, Some(step as usize % segs.len()));
            assert_eq!(&b.inputs[r * len..(r + 1) * len], &i[..], "step {step} row {r}");
            assert_eq!(&b.targets[r * len..(r + 1) * len], &t[..], "step {step} row {r}");
            assert_eq!(b.reset[r], reset, "step {step} row {r}");
        }
    }
    // one pass: a row that has finished reads nothing
    let last = got.segments_per_epoch() - 1;
    let b = got.pass_batch(last).unwrap();
    for (r, segs) in want.iter().enumerate() {
        let k = (last as usize) < segs.len();
        let (i, t, reset) = expect_row(segs, k.then_some(last as usize));
        assert_eq!((&b.inputs[r * len..(r + 1) * len], &b.targets[r * len..(r + 1) * len]), (&i[..], &t[..]));
        assert_eq!(b.reset[r], reset);
    }
    // more rows than documents: refused in one line
    let val_docs = p.index.shards.iter().map(|s| s.val_documents).sum::<u64>() as usize;
    let e = PreparedDocumentStreams::new(corpus, Split::Validation, len, val_docs + 1).unwrap_err().to_string();
    assert!(e.contains("validation split") && !e.contains('\n'), "{e}");
}

#[test]
fn a_damaged_document_start_file_is_found_when_the_corpus_is_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = corpus(tmp.path(), 1024);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let docs = p.dir.join(format!("{}.train.docs", p.index.shards[0].name));
    let mut bytes = std::fs::read(&docs).unwrap();
    bytes.pop();
    std::fs::write(&docs, bytes).unwrap();
    let e = PreparedCorpus::open(&p.dir).unwrap_err().to_string();
    assert!(e.contains(".train.docs") && e.contains("document starts") && !e.contains('\n'), "{e}");
}

#[test]
fn a_held_out_count_holds_out_that_many_documents_of_each_source_chosen_by_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut cfg, docs) = corpus(tmp.path(), 1024);
    cfg.prepare.val_documents = Some(4);
    let p = prepare(&cfg, None, &quiet).unwrap();
    let val = read_back(&p.dir, "val");
    for (s, docs) in docs.iter().enumerate() {
        // the four of smallest hash, in document order
        let mut by_hash: Vec<usize> = (0..docs.len()).collect();
        by_hash.sort_by_key(|&n| (holdout_hash(0, s, n as u64), n));
        let mut four = by_hash[..4].to_vec();
        four.sort();
        assert_eq!(val[s], four.iter().map(|&n| docs[n].clone()).collect::<Vec<_>>(), "source {s}");
    }
    // the count is part of what the corpus was prepared with
    cfg.prepare.val_documents = Some(5);
    assert!(prepare(&cfg, None, &quiet).unwrap().written);
    // as many as a source has, or none: refused in one line
    for (n, needle) in [(6, "data.sources[0]"), (0, "val_documents = 0")] {
        cfg.prepare.val_documents = Some(n);
        let e = prepare(&cfg, None, &quiet).unwrap_err().to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{e}");
    }
}

/// Parquet files written by pyarrow (`scripts/reference/make_parquet_fixtures.py`): snappy and
/// dictionary pages, zstd pages v2 with `large_string` text, gzip format 1.0; a struct column
/// beside the text; nulls and an empty string. Each is read as the documents pyarrow reads.
#[test]
fn parquet_files_written_by_pyarrow_are_read_as_pyarrow_reads_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parquet");
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let want: Vec<String> =
        expected["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_owned()).collect();
    assert!(want.iter().any(|d| d.contains('🔥')) && want.len() > 30, "{want:?}");
    for name in ["snappy-dictionary", "zstd-plain-large-string", "gzip-v1"] {
        let path = dir.join(format!("{name}.parquet"));
        let (pieces, _) = read_pieces(vec![path], Some("text"), InvalidUtf8::Refuse, 1 << 20);
        assert!(pieces.iter().all(|p| p.starts_doc && p.ends_doc), "{name}: a row is one document");
        let got: Vec<String> = pieces.into_iter().map(|p| p.text).collect();
        assert_eq!(got, want, "{name}");
    }
}
