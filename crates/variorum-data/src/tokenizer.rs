//! Tokenizers: text ⇄ token ids.
//!
//! Three kinds, because they answer different questions in a comparison of
//! architectures: `char` (small vocabulary, long sequences, the classic
//! char-level Shakespeare setting), `byte` (no vocabulary to train, can encode
//! anything) and `bpe` (sub-word units as used by real LMs, trained here with the
//! Hugging Face `tokenizers` crate so the saved file is the standard format).
//!
//! A fourth, `file`, reads a tokenizer already made (an imported model's `tokenizer.json`).
//!
//! Every kind round-trips: `decode(encode(x)) == x` for any text it can encode.

use std::collections::{BTreeSet, HashMap};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};

use crate::error::{DataError, one_line};

fn default_bpe_vocab() -> usize {
    1024
}

fn default_min_freq() -> u64 {
    2
}

/// The smallest useful BPE vocabulary: the 256 byte symbols plus one merge.
const MIN_BPE_VOCAB: usize = 257;

/// An upper bound that catches typos (an extra zero or three) before the trainer
/// tries to reserve memory for them; real LM vocabularies are far below it.
const MAX_BPE_VOCAB: usize = 1 << 20;

/// Which tokenizer to build, as written in the `[data.tokenizer]` config section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TokenizerConfig {
    /// One token per Unicode scalar value; the vocabulary is the sorted set of
    /// distinct characters of the training text.
    Char,
    /// One token per UTF-8 byte: 256 symbols, nothing to train.
    Byte,
    /// Byte-level BPE trained on the training text.
    Bpe {
        /// Size of the vocabulary including the 256 byte symbols; the trainer
        /// stops earlier if no pair occurs `min_frequency` times any more.
        #[serde(default = "default_bpe_vocab")]
        vocab_size: usize,
        /// A pair is only merged if it occurs at least this often.
        #[serde(default = "default_min_freq")]
        min_frequency: u64,
    },
    /// A tokenizer already made: a Hugging Face `tokenizer.json` (what `variorum import`
    /// copies into a run, so that fine-tuning an imported model keeps its vocabulary) or a file
    /// [`Tokenizer::save`] wrote. Nothing is learnt from the corpus.
    File {
        /// The file; a relative path is read from the current directory, as `data.path` is.
        path: PathBuf,
    },
}

impl Default for TokenizerConfig {
    /// `char`: the simplest tokenizer and the one the classic small-LM
    /// experiments use, so bits-per-char numbers are comparable with them.
    fn default() -> Self {
        TokenizerConfig::Char
    }
}

impl TokenizerConfig {
    /// Checks the settings; messages name the config key (`data.tokenizer.*`).
    pub fn validate(&self) -> Result<(), DataError> {
        if let TokenizerConfig::File { path } = self {
            if path.as_os_str().is_empty() {
                return Err(DataError::Config(
                    "data.tokenizer.path is empty: name a tokenizer.json (a run's, or a Hugging Face model's)".into(),
                ));
            }
        }
        if let TokenizerConfig::Bpe { vocab_size, .. } = self {
            if *vocab_size < MIN_BPE_VOCAB {
                return Err(DataError::Config(format!(
                    "data.tokenizer.vocab_size = {vocab_size} must be at least {MIN_BPE_VOCAB} \
                     (the 256 byte symbols plus at least one merge), e.g. 1024"
                )));
            }
            if *vocab_size > MAX_BPE_VOCAB {
                return Err(DataError::Config(format!(
                    "data.tokenizer.vocab_size = {vocab_size} must be at most {MAX_BPE_VOCAB}, \
                     e.g. 1024"
                )));
            }
        }
        Ok(())
    }
}

/// Character-level tokenizer: token id = index of the character in `vocab`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharTokenizer {
    vocab: Vec<char>,
    index: HashMap<char, u32>,
}

impl CharTokenizer {
    /// Builds the vocabulary from the sorted distinct characters of `text`;
    /// sorting makes the ids independent of where characters first appear.
    pub fn from_text(text: &str) -> Result<Self, DataError> {
        if text.is_empty() {
            return Err(DataError::TooShort(
                "cannot train a char tokenizer on empty text: give it the corpus text".into(),
            ));
        }
        let distinct: BTreeSet<char> = text.chars().collect();
        Self::new(distinct.into_iter().collect())
    }

    /// Builds a tokenizer from an explicit vocabulary (id = position).
    pub fn new(vocab: Vec<char>) -> Result<Self, DataError> {
        if vocab.is_empty() {
            return Err(DataError::Config("a char tokenizer vocabulary must not be empty".into()));
        }
        if u32::try_from(vocab.len()).is_err() {
            return Err(DataError::Config(format!(
                "a char tokenizer vocabulary of {} characters is too large for u32 ids",
                vocab.len()
            )));
        }
        let mut index = HashMap::with_capacity(vocab.len());
        for (id, &ch) in (0u32..).zip(&vocab) {
            if index.insert(ch, id).is_some() {
                return Err(DataError::Config(format!(
                    "the char tokenizer vocabulary lists {ch:?} twice: each character must \
                     appear once"
                )));
            }
        }
        Ok(CharTokenizer { vocab, index })
    }

    /// The characters, in id order.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        let mut ids = Vec::with_capacity(text.len());
        for (offset, ch) in text.char_indices() {
            match self.index.get(&ch) {
                Some(&id) => ids.push(id),
                None => {
                    return Err(DataError::UnknownChar { ch, offset, context: String::new() });
                }
            }
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&id| {
                usize::try_from(id).ok().and_then(|i| self.vocab.get(i)).copied().unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect()
    }
}

/// A trained (or loaded) tokenizer of one of the three kinds.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// One token per character of its vocabulary.
    Char(CharTokenizer),
    /// One token per UTF-8 byte: 256 ids, nothing learnt.
    Byte,
    /// Boxed: the Hugging Face tokenizer is large and the other variants are tiny.
    Bpe(Box<tokenizers::Tokenizer>),
}

/// What `save` writes for the kinds that are not Hugging Face tokenizers.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum SavedTokenizer {
    Char { vocab: Vec<String> },
    Byte,
}

/// BPE work is done on pieces of about this many bytes: lets the `tokenizers`
/// crate spread it over threads and keeps its per-token bookkeeping small.
const BPE_CHUNK_BYTES: usize = 1 << 16;

/// GPT-2's byte-to-character map, which byte-level BPE vocabularies are written in: printable
/// bytes stand for themselves, the others for the characters from U+0100 on, in byte order.
/// (The `tokenizers` crate has this table but does not export it.)
fn gpt2_byte_char(b: u8) -> char {
    let printable = |x: u8| (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("below U+0200")
}

/// How many pieces are encoded per call, bounding the memory held at once.
const BPE_CHUNKS_PER_BATCH: usize = 64;

impl Tokenizer {
    /// Builds a tokenizer of kind `cfg` from `text` (for `byte` nothing is learnt; `file` reads
    /// its file).
    pub fn train(cfg: &TokenizerConfig, text: &str) -> Result<Tokenizer, DataError> {
        cfg.validate()?;
        match cfg {
            TokenizerConfig::Char => Ok(Tokenizer::Char(CharTokenizer::from_text(text)?)),
            TokenizerConfig::Byte => Ok(Tokenizer::Byte),
            TokenizerConfig::Bpe { vocab_size, min_frequency } => {
                train_bpe(text, *vocab_size, *min_frequency).map(|t| Tokenizer::Bpe(Box::new(t)))
            }
            TokenizerConfig::File { path } => {
                if !path.is_file() {
                    return Err(DataError::Config(format!(
                        "data.tokenizer.path = {:?} is not a file (a relative path is read from the current directory)",
                        path.display().to_string()
                    )));
                }
                Tokenizer::load(path)
            }
        }
    }

    /// Number of distinct token ids (ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(c) => c.vocab.len(),
            Tokenizer::Byte => 256,
            Tokenizer::Bpe(t) => t.get_vocab_size(true),
        }
    }

    /// Text → ids. Only the char tokenizer can fail (on a character outside its
    /// vocabulary); the error names the character and its byte offset.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Tokenizer::Char(c) => c.encode(text),
            Tokenizer::Byte => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Bpe(t) => encode_bpe(t, text),
        }
    }

    /// A prompt or a scored text → ids, with the special tokens the tokenizer's post-processor
    /// adds, as transformers' `tokenizer(text)` does (a Hugging Face tokenizer with a template,
    /// LLaMA's `<s> $A`, puts its BOS first); the same as [`encode`](Self::encode) for every
    /// other tokenizer.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Tokenizer::Bpe(t) => t
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| DataError::Bpe { action: "encode the text", message: one_line(e) }),
            other => other.encode(text),
        }
    }

    /// Ids → text. Never fails, because it is used on model samples: an id the
    /// tokenizer does not know, or bytes that are not valid UTF-8, become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Char(c) => c.decode(ids),
            Tokenizer::Byte => {
                let mut bytes = Vec::with_capacity(ids.len());
                let mut buf = [0u8; 4];
                for &id in ids {
                    match u8::try_from(id) {
                        Ok(b) => bytes.push(b),
                        Err(_) => bytes.extend_from_slice(char::REPLACEMENT_CHARACTER.encode_utf8(&mut buf).as_bytes()),
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Tokenizer::Bpe(t) => decode_bpe(t, ids),
        }
    }

    /// The end-of-text token a prepared corpus writes after every document (`prepared/`): for
    /// char and byte the character U+0003 END OF TEXT (ASCII's ETX, byte 3); otherwise `named`,
    /// or the first of `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>` the vocabulary has.
    /// `None`: the tokenizer has none of them (or not `named`).
    pub fn end_of_text(&self, named: Option<&str>) -> Option<u32> {
        match self {
            Tokenizer::Char(c) => c.index.get(&'\u{3}').copied(),
            Tokenizer::Byte => Some(3),
            Tokenizer::Bpe(t) => match named {
                Some(n) => t.token_to_id(n),
                None => ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"].iter().find_map(|n| t.token_to_id(n)),
            },
        }
    }

    /// A byte-level BPE tokenizer trained on `text` as [`Tokenizer::train`] trains one, with
    /// `<|endoftext|>` added after its vocabulary as a special token (what a corpus of many
    /// documents puts between them).
    pub fn train_bpe_with_end_of_text(text: &str, cfg: &TokenizerConfig) -> Result<Tokenizer, DataError> {
        let TokenizerConfig::Bpe { vocab_size, min_frequency } = cfg else {
            return Tokenizer::train(cfg, text);
        };
        cfg.validate()?;
        let mut t = train_bpe(text, vocab_size.saturating_sub(1).max(MIN_BPE_VOCAB), *min_frequency)?;
        t.add_special_tokens(&[tokenizers::AddedToken::from("<|endoftext|>", true)]);
        Ok(Tokenizer::Bpe(Box::new(t)))
    }

    /// The unit that bits-per-unit metrics count: `"char"`, `"byte"` or `"token"`.
    pub fn unit(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => "char",
            Tokenizer::Byte => "byte",
            Tokenizer::Bpe(_) => "token",
        }
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` that encodes every text to the same ids
    /// (what `variorum export --format hf` writes). BPE: the file itself. Char: a BPE model
    /// with no merges whose vocabulary is the characters, nothing around it, and a decoder that
    /// joins the pieces (`Fuse`). Byte: the same over GPT-2's byte-to-character alphabet, with
    /// its byte-level pre-tokenizer (no regex split: every byte is a token) and decoder.
    pub fn to_hf_json(&self) -> Result<String, DataError> {
        let bpe = |vocab: serde_json::Map<String, serde_json::Value>| {
            serde_json::json!({
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": []
            })
        };
        let json = match self {
            Tokenizer::Bpe(t) => return t.to_string(true).map_err(|e| DataError::Config(one_line(e))),
            Tokenizer::Char(c) => serde_json::json!({
                "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                "normalizer": null, "pre_tokenizer": null, "post_processor": null,
                "decoder": {"type": "Fuse"},
                "model": bpe(c.vocab.iter().enumerate().map(|(i, ch)| (ch.to_string(), i.into())).collect()),
            }),
            Tokenizer::Byte => {
                let byte_level = serde_json::json!({
                    "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
                });
                serde_json::json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                    "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
                    "decoder": byte_level,
                    "model": bpe((0..=255u8).map(|b| (gpt2_byte_char(b).to_string(), u32::from(b).into())).collect()),
                })
            }
        };
        serde_json::to_string_pretty(&json).map_err(|e| DataError::Config(one_line(e)))
    }

    /// SHA-256 (hex) of what [`save`](Self::save) writes: equal hashes, the same tokenizer.
    pub fn sha256(&self) -> Result<String, DataError> {
        use sha2::Digest;
        let json = self.saved_json().map_err(DataError::Config)?;
        Ok(sha2::Sha256::digest(json.as_bytes()).iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The text [`save`](Self::save) writes.
    fn saved_json(&self) -> Result<String, String> {
        let json: Result<String, String> = match self {
            Tokenizer::Char(c) => serde_json::to_string_pretty(&SavedTokenizer::Char {
                vocab: c.vocab.iter().map(|ch| ch.to_string()).collect(),
            })
            .map_err(one_line),
            Tokenizer::Byte => serde_json::to_string_pretty(&SavedTokenizer::Byte).map_err(one_line),
            Tokenizer::Bpe(t) => t.to_string(true).map_err(one_line),
        };
        json
    }

    /// Writes the tokenizer as JSON (BPE: the Hugging Face `tokenizer.json`
    /// format; char: `{"kind":"char","vocab":[...]}`; byte: `{"kind":"byte"}`).
    /// The file is written next to its final name and renamed into place, so an
    /// interrupted save never leaves a truncated tokenizer behind.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        let file_error = |problem: String| DataError::TokenizerFile { path: path.to_path_buf(), problem };
        let json = self.saved_json().map_err(|e| file_error(format!("could not be serialised: {e}")))?;

        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                file_error(format!("could not create its directory {}: {}", parent.display(), one_line(e)))
            })?;
        }
        let tmp = temp_path(path);
        std::fs::write(&tmp, json.as_bytes()).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            file_error(format!("could not be written: {}: check that the directory is writable", one_line(e)))
        })
    }

    /// Reads a file written by [`Tokenizer::save`] (or any Hugging Face
    /// `tokenizer.json`), telling the kinds apart by the `kind` key that only
    /// this crate's own formats have.
    pub fn load(path: &Path) -> Result<Tokenizer, DataError> {
        let file_error = |problem: String| DataError::TokenizerFile { path: path.to_path_buf(), problem };
        let content = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => file_error(
                "not found: each run writes tokenizer.json into its run directory when \
                 training starts; check the path"
                    .into(),
            ),
            _ => file_error(format!("could not be read: {}", one_line(e))),
        })?;
        let corrupt = |e: &dyn std::fmt::Display| {
            file_error(format!("is corrupt ({}): delete it and train again to re-create it", one_line(e)))
        };
        let value: serde_json::Value = serde_json::from_str(&content).map_err(|e| corrupt(&e))?;
        if value.get("kind").is_some() {
            let saved: SavedTokenizer = serde_json::from_value(value).map_err(|e| {
                file_error(format!(
                    "is not a tokenizer file ({}): expected {{\"kind\":\"char\",\"vocab\":[...]}}, \
                     {{\"kind\":\"byte\"}} or a Hugging Face tokenizer.json",
                    one_line(e)
                ))
            })?;
            match saved {
                SavedTokenizer::Byte => Ok(Tokenizer::Byte),
                SavedTokenizer::Char { vocab } => {
                    let mut chars = Vec::with_capacity(vocab.len());
                    for entry in &vocab {
                        let mut it = entry.chars();
                        match (it.next(), it.next()) {
                            (Some(ch), None) => chars.push(ch),
                            _ => {
                                return Err(corrupt(&format!("vocab entry {entry:?} is not a single character")));
                            }
                        }
                    }
                    CharTokenizer::new(chars).map(Tokenizer::Char).map_err(|e| corrupt(&e))
                }
            }
        } else {
            content.parse::<tokenizers::Tokenizer>().map(|t| Tokenizer::Bpe(Box::new(t))).map_err(|e| corrupt(&e))
        }
    }
}

/// `dir/name.json` → `dir/name.json.tmp`.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// A fresh byte-level BPE pipeline: no normaliser (so decoding gives back the
/// exact text), the GPT-2 byte-level pre-tokeniser without an added prefix space
/// (which would otherwise come back as a leading space), and the matching decoder.
fn bpe_pipeline() -> tokenizers::Tokenizer {
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, true)));
    tokenizer
}

fn train_bpe(text: &str, vocab_size: usize, min_frequency: u64) -> Result<tokenizers::Tokenizer, DataError> {
    // Seeding the alphabet with all 256 byte symbols means any text can be
    // encoded later, including bytes the training text never contained.
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(min_frequency)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut tokenizer = bpe_pipeline();
    tokenizer
        .train(&mut trainer, bpe_chunks(text, BPE_CHUNK_BYTES).into_iter())
        .map_err(|e| DataError::Bpe { action: "be trained", message: one_line(e) })?;
    Ok(tokenizer)
}

fn encode_bpe(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, DataError> {
    let chunks = bpe_chunks(text, BPE_CHUNK_BYTES);
    let mut ids = Vec::with_capacity(text.len() / 3);
    for group in chunks.chunks(BPE_CHUNKS_PER_BATCH) {
        let encodings = tokenizer
            .encode_batch_fast(group.to_vec(), false)
            .map_err(|e| DataError::Bpe { action: "encode the text", message: one_line(e) })?;
        for encoding in encodings {
            ids.extend_from_slice(encoding.get_ids());
        }
    }
    Ok(ids)
}

fn decode_bpe(tokenizer: &tokenizers::Tokenizer, ids: &[u32]) -> String {
    // The `tokenizers` crate silently drops unknown ids; decode the runs of
    // known ids and mark each unknown one, so a bad sample is visible.
    let mut out = String::new();
    let mut run: Vec<u32> = Vec::new();
    let flush = |run: &mut Vec<u32>, out: &mut String| {
        if !run.is_empty() {
            match tokenizer.decode(run, false) {
                Ok(s) => out.push_str(&s),
                Err(_) => out.push(char::REPLACEMENT_CHARACTER),
            }
            run.clear();
        }
    };
    for &id in ids {
        if tokenizer.id_to_token(id).is_some() {
            run.push(id);
        } else {
            flush(&mut run, &mut out);
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Cuts `text` into pieces of at least `target` bytes (except the last) such
/// that BPE-encoding the pieces and concatenating gives exactly the encoding of
/// the whole text.
///
/// A cut is made only after a `'\n'` that has a non-whitespace character on both
/// sides. The GPT-2 pre-tokeniser regex
/// (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`)
/// has no look-behind, none of its alternatives can span from a non-whitespace
/// character into a newline, and a lone `'\n'` between non-whitespace
/// characters is its own pre-token whether or not the text continues after it.
/// So the pre-tokens, and hence the BPE tokens, never cross such a cut.
fn bpe_chunks(text: &str, target: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    while text.len() - start > target {
        match safe_cut_after(text, start + target.max(1)) {
            Some(cut) => {
                pieces.push(&text[start..cut]);
                start = cut;
            }
            None => break,
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// The first safe cut position (see [`bpe_chunks`]) at or after byte `from`.
pub(crate) fn safe_cut_after(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // A '\n' byte is always a whole character in UTF-8, so `nl` and `nl + 1`
    // are character boundaries and the slices below are valid.
    (from.saturating_sub(1)..bytes.len())
        .filter(|&i| bytes[i] == b'\n' && i > 0)
        .find(|&nl| {
            let before = text[..nl].chars().next_back();
            let after = text[nl + 1..].chars().next();
            matches!((before, after), (Some(b), Some(a)) if !b.is_whitespace() && !a.is_whitespace())
        })
        .map(|nl| nl + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n\
        All:\nSpeak, speak — café, naïve, déjà vu; 1599 and 1600.\n  Indented  line \n\
        \tTabbed\r\nWindows line\nThe end é—é.\n";

    fn training_text() -> String {
        // Enough repetition for a few hundred merges to reach min_frequency 2.
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(SAMPLE);
            text.push_str(&format!("Line number {i}: the quick brown fox — jumps over é.\n"));
        }
        text
    }

    fn bpe(vocab_size: usize) -> Tokenizer {
        Tokenizer::train(&TokenizerConfig::Bpe { vocab_size, min_frequency: 2 }, &training_text()).expect("bpe trains")
    }

    #[test]
    fn char_round_trip_and_sorted_vocab() {
        let tok = Tokenizer::train(&TokenizerConfig::Char, SAMPLE).expect("char trains");
        let ids = tok.encode(SAMPLE).expect("encodes its own training text");
        assert_eq!(ids.len(), SAMPLE.chars().count());
        assert_eq!(tok.decode(&ids), SAMPLE);
        let Tokenizer::Char(c) = &tok else { panic!("expected a char tokenizer") };
        assert!(c.vocab().windows(2).all(|w| w[0] < w[1]), "vocab must be sorted");
        assert!(c.vocab().contains(&'é') && c.vocab().contains(&'—'));
        assert_eq!(tok.unit(), "char");
    }

    #[test]
    fn char_unknown_character_is_named_with_offset() {
        let tok = Tokenizer::train(&TokenizerConfig::Char, "abc").expect("char trains");
        let err = tok.encode("abé").expect_err("é is unknown");
        let msg = err.to_string();
        assert!(msg.contains("'é'"), "{msg}");
        assert!(msg.contains("byte offset 2"), "{msg}");
        // Control characters are escaped, not printed raw.
        let msg = tok.encode("a\u{7}").expect_err("BEL is unknown").to_string();
        assert!(msg.contains("'\\u{7}'"), "{msg}");
    }

    #[test]
    fn char_decode_marks_unknown_ids() {
        let tok = Tokenizer::train(&TokenizerConfig::Char, "ab").expect("char trains");
        assert_eq!(tok.decode(&[0, 99, 1]), "a\u{FFFD}b");
    }

    #[test]
    fn char_training_on_empty_text_fails() {
        assert!(Tokenizer::train(&TokenizerConfig::Char, "").is_err());
    }

    #[test]
    fn byte_round_trip() {
        let tok = Tokenizer::train(&TokenizerConfig::Byte, "ignored").expect("byte builds");
        let ids = tok.encode(SAMPLE).expect("bytes always encode");
        assert_eq!(ids.len(), SAMPLE.len());
        assert!(ids.iter().all(|&id| id < 256));
        assert_eq!(tok.decode(&ids), SAMPLE);
        assert_eq!(tok.vocab_size(), 256);
        assert_eq!(tok.unit(), "byte");
        // An unknown id and a cut-off multi-byte character both become U+FFFD.
        assert_eq!(tok.decode(&[97, 1000, 98]), "a\u{FFFD}b");
        assert_eq!(tok.decode(&[0xC3]), "\u{FFFD}");
    }

    #[test]
    fn bpe_round_trip_and_vocab_size() {
        let tok = bpe(300);
        let size = tok.vocab_size();
        assert!(size > 256 && size <= 300, "vocab size {size}");
        for text in [SAMPLE, "unseen: 日本語 ✓ \u{1F600}", " leading space", ""] {
            let ids = tok.encode(text).expect("bpe encodes anything");
            assert!(ids.iter().all(|&id| (id as usize) < size));
            assert_eq!(tok.decode(&ids), text);
        }
        // Merges happened: fewer tokens than bytes.
        let ids = tok.encode(SAMPLE).expect("encodes");
        assert!(ids.len() < SAMPLE.len(), "{} tokens for {} bytes", ids.len(), SAMPLE.len());
        assert_eq!(tok.unit(), "token");
    }

    #[test]
    fn bpe_training_is_deterministic() {
        let a = bpe(320).encode(SAMPLE).expect("encodes");
        let b = bpe(320).encode(SAMPLE).expect("encodes");
        assert_eq!(a, b);
    }

    #[test]
    fn bpe_decode_marks_unknown_ids() {
        let tok = bpe(300);
        let mut ids = tok.encode("ab").expect("encodes");
        ids.push(1_000_000);
        assert_eq!(tok.decode(&ids), "ab\u{FFFD}");
    }

    #[test]
    fn bpe_vocab_size_below_bytes_is_rejected() {
        let cfg = TokenizerConfig::Bpe { vocab_size: 100, min_frequency: 2 };
        let msg = Tokenizer::train(&cfg, "abc").expect_err("too small").to_string();
        assert!(msg.contains("data.tokenizer.vocab_size = 100"), "{msg}");
    }

    #[test]
    fn bpe_chunked_encoding_equals_whole_encoding() {
        let tok = bpe(400);
        let Tokenizer::Bpe(hf) = &tok else { panic!("expected bpe") };
        let text = format!("{}\n \nx\n\ny \n z\t\nw\n\u{a0}\nv\n", training_text());
        let whole = hf.encode(text.as_str(), false).expect("encodes").get_ids().to_vec();
        for target in [1, 2, 3, 7, 50, 1000] {
            let pieces = bpe_chunks(&text, target);
            assert!(pieces.len() > 1 || target >= text.len());
            assert_eq!(pieces.concat(), text);
            let mut ids = Vec::new();
            for piece in pieces {
                ids.extend_from_slice(hf.encode(piece, false).expect("encodes").get_ids());
            }
            assert_eq!(ids, whole, "chunk target {target}");
        }
        assert_eq!(encode_bpe(hf, &text).expect("encodes"), whole);
    }

    #[test]
    fn a_file_tokenizer_is_the_saved_one_and_a_missing_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "the cat sat on the mat; the cat sat on the hat. ".repeat(20);
        let bpe = Tokenizer::train(&TokenizerConfig::Bpe { vocab_size: 270, min_frequency: 2 }, &text).expect("trains");
        let path = dir.path().join("tokenizer.json");
        bpe.save(&path).expect("saves");
        let cfg = TokenizerConfig::File { path: path.clone() };
        // nothing learnt from the text it is given
        let loaded = Tokenizer::train(&cfg, "zzz").expect("loads");
        assert_eq!(loaded.vocab_size(), bpe.vocab_size());
        assert_eq!(loaded.encode(&text).unwrap(), bpe.encode(&text).unwrap());
        let missing = TokenizerConfig::File { path: dir.path().join("absent.json") };
        let err = Tokenizer::train(&missing, &text).unwrap_err().to_string();
        assert!(err.contains("data.tokenizer.path") && err.contains("absent.json"), "{err}");
        let empty = TokenizerConfig::File { path: PathBuf::new() };
        assert!(empty.validate().unwrap_err().to_string().contains("data.tokenizer.path is empty"));
        let parsed: TokenizerConfig =
            serde_json::from_str(r#"{"kind":"file","path":"a/tokenizer.json"}"#).expect("parses");
        assert_eq!(parsed, TokenizerConfig::File { path: "a/tokenizer.json".into() });
    }

    #[test]
    fn every_kind_is_written_as_a_hugging_face_tokenizer_that_encodes_the_same() {
        let text = "Hwæt! We Gardena in geardagum,\nþeodcyninga þrym gefrunon. ".repeat(8);
        let kinds =
            [TokenizerConfig::Char, TokenizerConfig::Byte, TokenizerConfig::Bpe { vocab_size: 300, min_frequency: 2 }];
        for cfg in kinds {
            let ours = Tokenizer::train(&cfg, &text).expect("trains");
            let json = ours.to_hf_json().expect("writes");
            let hf: tokenizers::Tokenizer = json.parse().expect("tokenizers reads it");
            let ids = ours.encode(&text).unwrap();
            assert_eq!(hf.encode(text.as_str(), false).unwrap().get_ids(), ids.as_slice(), "{cfg:?}");
            assert_eq!(hf.decode(&ids, false).unwrap(), text, "{cfg:?}");
            assert_eq!(hf.get_vocab_size(true), ours.vocab_size(), "{cfg:?}");
        }
        // the byte alphabet: 256 distinct characters, printable ASCII standing for itself
        let chars: BTreeSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!((gpt2_byte_char(b'A'), gpt2_byte_char(b' '), gpt2_byte_char(0)), ('A', '\u{0120}', '\u{0100}'));
    }

    #[test]
    fn save_load_round_trip_all_kinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokenizers = [Tokenizer::train(&TokenizerConfig::Char, SAMPLE).expect("char"), Tokenizer::Byte, bpe(300)];
        for (i, tok) in tokenizers.iter().enumerate() {
            let path = dir.path().join(format!("sub/{i}/tokenizer.json"));
            tok.save(&path).expect("saves");
            let loaded = Tokenizer::load(&path).expect("loads");
            assert_eq!(loaded.unit(), tok.unit());
            assert_eq!(loaded.vocab_size(), tok.vocab_size());
            assert_eq!(loaded.encode(SAMPLE).expect("e"), tok.encode(SAMPLE).expect("e"));
            let again = loaded.encode("naïve — déjà").expect("e");
            assert_eq!(loaded.decode(&again), "naïve — déjà");
        }
    }

    #[test]
    fn saved_formats_are_as_documented() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokenizer.json");
        Tokenizer::train(&TokenizerConfig::Char, "ba").expect("char").save(&path).expect("save");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(v, serde_json::json!({"kind": "char", "vocab": ["a", "b"]}));
        Tokenizer::Byte.save(&path).expect("save");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(v, serde_json::json!({"kind": "byte"}));
        bpe(300).save(&path).expect("save");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(v["model"]["type"], "BPE");
        assert_eq!(v["pre_tokenizer"]["type"], "ByteLevel");
        assert_eq!(v["decoder"]["type"], "ByteLevel");
    }

    #[test]
    fn load_errors_name_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.json");
        let msg = Tokenizer::load(&missing).expect_err("missing").to_string();
        assert!(msg.contains("missing.json") && msg.contains("not found"), "{msg}");

        let cases = [
            ("garbage.json", "{not json"),
            ("dup.json", r#"{"kind":"char","vocab":["a","a"]}"#),
            ("long.json", r#"{"kind":"char","vocab":["ab"]}"#),
            ("kind.json", r#"{"kind":"bogus"}"#),
            ("hf.json", r#"{"version":"1.0","model":{"type":"nonsense"}}"#),
        ];
        for (name, content) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write");
            let msg = Tokenizer::load(&path).expect_err(name).to_string();
            assert!(msg.contains(name), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[test]
    fn config_serde_defaults_and_unknown_fields() {
        let cfg: TokenizerConfig = serde_json::from_str(r#"{"kind":"bpe"}"#).expect("parses");
        assert_eq!(cfg, TokenizerConfig::Bpe { vocab_size: 1024, min_frequency: 2 });
        let cfg: TokenizerConfig = serde_json::from_str(r#"{"kind":"char"}"#).expect("parses");
        assert_eq!(cfg, TokenizerConfig::Char);
        assert!(serde_json::from_str::<TokenizerConfig>(r#"{"kind":"bpe","vocab":5}"#).is_err());
        assert!(serde_json::from_str::<TokenizerConfig>(r#"{"kind":"word"}"#).is_err());
        assert_eq!(TokenizerConfig::default(), TokenizerConfig::Char);
    }
}
