//! The corpus: one UTF-8 text file, split by position into a training part and
//! a validation part, tokenized.
//!
//! Splitting by position (the validation text is the end of the file) rather
//! than by random lines keeps the validation text unseen in a meaningful way:
//! with random lines, near-duplicate neighbouring lines would leak into training.
//!
//! With `[data.tags]` the text is also cut into named sections (see `tags.rs`),
//! and each split carries the tag of every token.

use std::borrow::Cow;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{DataError, one_line};
use crate::graph::{self, GraphDataConfig, GraphSplits};
use crate::pairs::{self, Pair, PairSplits, PairsConfig};
use crate::prepared::{PrepareConfig, PreparedCorpus, SourceConfig, prepared_dir, validate_sources};
use crate::tags::{Holdout, Piece, SplitPieces, SplitTags, TagConfig, TagSections};
use crate::tokenizer::{Tokenizer, TokenizerConfig};

/// Environment variable naming the directory where named datasets live
/// (`<dir>/<name>/input.txt`); when unset, `data` relative to the current directory.
pub const DATA_DIR_ENV: &str = "VARIORUM_DATA";

/// The data directory used when [`DATA_DIR_ENV`] is unset or empty.
pub const DEFAULT_DATA_DIR: &str = "data";

fn default_val_fraction() -> f64 {
    0.1
}

/// The `[data]` section of a run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Either a named dataset (a recipe in `datasets/<name>/`, fetched to
    /// `<data dir>/<name>/input.txt`) ...
    #[serde(default)]
    pub dataset: Option<String>,
    /// ... or any UTF-8 text file.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// How the text is cut into tokens.
    #[serde(default)]
    pub tokenizer: TokenizerConfig,
    /// Fraction of the text (by position, at the end) held out for validation.
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
    /// Tag every example with the section of the text it comes from (off by
    /// default). Left out of the serialized config when off, so configs written
    /// before tags existed read and write back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<TagConfig>,
    /// The file is graph examples, JSON lines of nodes and edges (see `graph.rs`), for
    /// graph-masked attention; absent = plain text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphDataConfig>,
    /// The file is paired text, a source and its target per example (see `pairs.rs`), for an
    /// encoder–decoder; absent = plain text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<PairsConfig>,
    /// A datastore (`variorum datastore build`) whose neighbour tables
    /// (`variorum datastore neighbours`) give every position of both splits its retrieved
    /// tokens, for a model with a long-term memory (`model.long_term_memory`). Absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbours: Option<PathBuf>,
    /// Many sources — files, directories, globs, JSON Lines, compressed or not — prepared
    /// once into token shards (`variorum prepare`, see `prepared/`) in `prepared`; training
    /// prepares them first when they changed. Empty = none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceConfig>,
    /// A prepared corpus's directory: where `sources` are prepared to, or, alone, one
    /// prepared earlier to train from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared: Option<PathBuf>,
    /// How `sources` are prepared (`[data.prepare]`).
    #[serde(default, skip_serializing_if = "PrepareConfig::is_default")]
    pub prepare: PrepareConfig,
    /// Episodes for a Decision Transformer (`model.kind = "decision-transformer"`): a
    /// trajectory file written by `variorum trajectories` (`variorum_data::decision`). Its last
    /// `val_fraction` of episodes are held out. Absent = text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectories: Option<PathBuf>,
}

impl Default for DataConfig {
    /// The `shakespeare` dataset, char tokenizer, 10% held out: the setting the
    /// project's reference results use.
    fn default() -> Self {
        DataConfig {
            dataset: Some("shakespeare".into()),
            path: None,
            tokenizer: TokenizerConfig::default(),
            val_fraction: default_val_fraction(),
            tags: None,
            graph: None,
            pairs: None,
            neighbours: None,
            sources: Vec::new(),
            prepared: None,
            prepare: PrepareConfig::default(),
            trajectories: None,
        }
    }
}

/// Where the text comes from, once the config has been checked.
enum Source<'a> {
    Dataset(&'a str),
    Path(&'a Path),
    /// `sources` and/or `prepared`.
    Prepared,
}

/// The directory holding named datasets: `$VARIORUM_DATA`, or `data`.
pub fn data_dir() -> PathBuf {
    match std::env::var_os(DATA_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_DATA_DIR),
    }
}

impl DataConfig {
    /// Whether the corpus is a prepared one (`sources` or `prepared` set).
    pub fn is_prepared(&self) -> bool {
        !self.sources.is_empty() || self.prepared.is_some()
    }

    fn source(&self) -> Result<Source<'_>, DataError> {
        if self.is_prepared() {
            let other = match (&self.dataset, &self.path) {
                (Some(_), _) => Some("data.dataset"),
                (_, Some(_)) => Some("data.path"),
                _ => None,
            };
            let what = if self.sources.is_empty() { "data.prepared" } else { "data.sources" };
            if let Some(other) = other {
                return Err(DataError::Config(format!("{what} and {other} are both set: keep only one")));
            }
            if self.tags.is_some() {
                return Err(DataError::Config(format!(
                    "data.tags cuts one text into sections, and a prepared corpus ({what}) keeps its documents already (train.batching = \"documents\" reads them): remove data.tags, or use data.path"
                )));
            }
            let layout = [
                ("data.graph", self.graph.is_some()),
                ("data.pairs", self.pairs.is_some()),
                ("data.neighbours", self.neighbours.is_some()),
            ];
            if let Some((key, _)) = layout.iter().find(|(_, on)| *on) {
                return Err(DataError::Config(format!(
                    "{key} does not work with a prepared corpus ({what}) yet: use data.path for it"
                )));
            }
            return Ok(Source::Prepared);
        }
        match (&self.dataset, &self.path) {
            (Some(name), None) => {
                let ok = !name.is_empty()
                    && name != "."
                    && name != ".."
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
                if ok {
                    Ok(Source::Dataset(name))
                } else {
                    Err(DataError::Config(format!(
                        "data.dataset = {name:?} is not a dataset name: use the name of a folder \
                         in datasets/ (letters, digits, '-', '_', '.'), e.g. \"shakespeare\", or \
                         set data.path to a text file instead"
                    )))
                }
            }
            (None, Some(path)) if path.as_os_str().is_empty() => {
                Err(DataError::Config("data.path is empty: set it to a UTF-8 text file, or use data.dataset".into()))
            }
            (None, Some(path)) => Ok(Source::Path(path)),
            (Some(name), Some(path)) => Err(DataError::Config(format!(
                "data.dataset = {name:?} and data.path = {:?} are both set: keep only one",
                path.display().to_string()
            ))),
            (None, None) => Err(DataError::Config(
                "neither data.dataset nor data.path is set: set data.dataset = \"shakespeare\" \
                 (a named dataset) or data.path = \"some/file.txt\" (any UTF-8 text file)"
                    .into(),
            )),
        }
    }

    /// Checks the section: exactly one of `dataset`/`path`, `0 < val_fraction < 1`,
    /// the tag expression and the tokenizer settings. Messages name the key, e.g.
    /// `data.val_fraction = 1.5 must be in (0, 1)`.
    pub fn validate(&self) -> Result<(), DataError> {
        if let Some(t) = &self.trajectories {
            let others = [
                ("data.dataset", self.dataset.is_some()),
                ("data.path", self.path.is_some()),
                ("data.sources", !self.sources.is_empty()),
                ("data.prepared", self.prepared.is_some()),
                ("data.tags", self.tags.is_some()),
                ("data.graph", self.graph.is_some()),
                ("data.pairs", self.pairs.is_some()),
                ("data.neighbours", self.neighbours.is_some()),
            ];
            if let Some((key, _)) = others.iter().find(|(_, on)| *on) {
                return Err(DataError::Config(format!(
                    "data.trajectories and {key} are both set: a Decision Transformer reads episodes, not text; keep only data.trajectories"
                )));
            }
            if t.as_os_str().is_empty() {
                return Err(DataError::Config(
                    "data.trajectories is empty: name a file written by `variorum trajectories`".into(),
                ));
            }
            let v = self.val_fraction;
            if !(v > 0.0 && v < 1.0) {
                return Err(DataError::Config(format!(
                    "data.val_fraction = {v} must be in (0, 1): the fraction of episodes held out"
                )));
            }
            return Ok(());
        }
        if let Source::Prepared = self.source()? {
            validate_sources(&self.sources)?;
            self.prepare.validate()?;
        }
        let v = self.val_fraction;
        // Written so that NaN fails too.
        if !(v > 0.0 && v < 1.0) {
            return Err(DataError::Config(format!(
                "data.val_fraction = {v} must be in (0, 1), e.g. 0.1 to hold out the last 10% \
                 of the text"
            )));
        }
        let layouts = [
            ("data.tags", self.tags.is_some()),
            ("data.graph", self.graph.is_some()),
            ("data.pairs", self.pairs.is_some()),
        ];
        let set: Vec<&str> = layouts.iter().filter(|(_, on)| *on).map(|(k, _)| *k).collect();
        if set.len() > 1 && self.pairs.is_some() {
            return Err(DataError::Config(format!(
                "{} are both set: paired text is one example of a source and its target per line; use one",
                set.join(" and ")
            )));
        }
        if let Some(PairsConfig { target_path: Some(t) }) = &self.pairs
            && t.as_os_str().is_empty()
        {
            return Err(DataError::Config(
                "data.pairs.target_path is empty: name the file of targets aligned with data.path, or remove it for a TSV file".into(),
            ));
        }
        if let Some(tags) = &self.tags {
            tags.validate()?;
            if self.graph.is_some() {
                return Err(DataError::Config(
                    "data.tags and data.graph are both set: tags cut a text into sections, and graph data is one example per line; use one".into(),
                ));
            }
        }
        self.tokenizer.validate()
    }

    /// The text file to read: `data.path`, or `<data dir>/<dataset>/input.txt`
    /// where the data dir is `$VARIORUM_DATA` or `data`.
    pub fn text_path(&self) -> Result<PathBuf, DataError> {
        self.text_path_in(&data_dir())
    }

    fn text_path_in(&self, data_dir: &Path) -> Result<PathBuf, DataError> {
        Ok(match self.source()? {
            Source::Dataset(name) => data_dir.join(name).join("input.txt"),
            Source::Path(path) => path.to_path_buf(),
            Source::Prepared => prepared_dir(self.prepared.as_ref())?,
        })
    }
}

/// Reads a whole corpus file as UTF-8. A missing file, an unreadable one, one
/// that is not UTF-8 (the message gives the byte offset of the first invalid
/// byte) and an empty one each get their own error.
pub fn read_text(path: &Path) -> Result<String, DataError> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => DataError::CorpusNotFound {
            path: path.to_path_buf(),
            hint: match std::env::current_dir() {
                Ok(cwd) if path.is_relative() => {
                    format!("check data.path (a relative path is read from the current directory, {})", cwd.display())
                }
                _ => "check data.path".into(),
            },
        },
        _ => DataError::CorpusRead { path: path.to_path_buf(), message: one_line(e) },
    })?;
    if bytes.is_empty() {
        return Err(DataError::CorpusEmpty { path: path.to_path_buf() });
    }
    String::from_utf8(bytes)
        .map_err(|e| DataError::CorpusNotUtf8 { path: path.to_path_buf(), offset: e.utf8_error().valid_up_to() })
}

/// How to get a named dataset that is missing.
fn dataset_hint(name: &str) -> String {
    let recipe = Path::new("datasets").join(name).join("fetch.sh");
    if recipe.is_file() {
        format!("run scripts/setup.sh to fetch the '{name}' dataset (or bash {})", recipe.display())
    } else {
        format!(
            "run scripts/setup.sh to fetch the '{name}' dataset (there is no recipe {} here: \
             check the name against the folders in datasets/, run from the repository root, \
             or set data.path to a text file)",
            recipe.display()
        )
    }
}

/// How many of `n ≥ 2` units (chars, examples) `val_fraction` holds out: at least one on each
/// side, however extreme the fraction.
fn held_out(n: usize, val_fraction: f64) -> usize {
    ((n as f64) * val_fraction).round().clamp(1.0, (n - 1) as f64) as usize
}

/// A tokenized corpus, ready to be cut into batches.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// The tokenizer that made the ids: the one given, or one trained as
    /// [`Corpus::from_text`] says.
    pub tokenizer: Tokenizer,
    /// Token ids of the training part (the first `1 - val_fraction` of the chars;
    /// with `holdout = "each-section"`, the first part of every section).
    pub train: Vec<u32>,
    /// Token ids of the validation part (the rest).
    pub val: Vec<u32>,
    /// The tag names and, per split, the tag of every token: `Some` exactly when
    /// `data.tags` is set.
    pub tags: Option<TagSections>,
    /// With `data.graph`: the examples of each split (`train` and `val` then hold their tokens
    /// end to end).
    pub graphs: Option<GraphSplits>,
    /// With `data.pairs`: the pairs of each split (`train` and `val` then hold their sources'
    /// and targets' tokens end to end).
    pub pairs: Option<PairSplits>,
    /// The file the text came from.
    pub path: PathBuf,
    /// Characters in the training part: with `train.len()` this converts
    /// per-token losses into bits per character, comparable across tokenizers.
    pub train_chars: usize,
    /// Characters in the validation part.
    pub val_chars: usize,
    /// A prepared corpus (`data.sources` / `data.prepared`): its training tokens are read
    /// from here, read from its shard files as windows are drawn, so `train` is empty; `val` holds the first
    /// [`PREPARED_VAL_TOKENS`] of its validation documents, what a run's evaluation reads.
    pub prepared: Option<Arc<PreparedCorpus>>,
}

/// The validation tokens of a prepared corpus a run holds in memory (4 Mi, 16 MiB): a run's
/// periodic evaluation spreads its windows over them.
pub const PREPARED_VAL_TOKENS: usize = 1 << 22;

impl Corpus {
    /// Reads the text named by `cfg`, splits it by position and tokenizes it
    /// (see [`Corpus::from_text`]). Pass `tokenizer` to reuse one (resuming or
    /// evaluating a run) instead of training a new one.
    pub fn load(cfg: &DataConfig, tokenizer: Option<Tokenizer>) -> Result<Corpus, DataError> {
        Self::load_from(cfg, tokenizer, &data_dir())
    }

    fn load_from(cfg: &DataConfig, tokenizer: Option<Tokenizer>, data_dir: &Path) -> Result<Corpus, DataError> {
        cfg.validate()?;
        if cfg.is_prepared() {
            return Self::from_prepared(cfg, tokenizer);
        }
        let path = cfg.text_path_in(data_dir)?;
        let text = read_text(&path).map_err(|e| match (e, &cfg.dataset) {
            (DataError::CorpusNotFound { path, .. }, Some(name)) => {
                DataError::CorpusNotFound { path, hint: dataset_hint(name) }
            }
            (e, _) => e,
        })?;
        Corpus::from_text(&text, cfg, tokenizer, path)
    }

    /// Splits `text` by position — the first `1 - val_fraction` of its chars
    /// are the training part, the rest (at least one char each) the validation
    /// part — and tokenizes both. `path` only labels the corpus in messages.
    ///
    /// With `data.tags` the text is cut into sections, the split is the end of
    /// the text or the end of every section (`data.tags.holdout`), and every
    /// piece of a section is tokenized on its own, so that section starts fall
    /// on token boundaries and their token offsets are exact (with BPE, the
    /// tokens at a section boundary can differ from those of the untagged text;
    /// with char and byte they are the same).
    ///
    /// Without a given tokenizer one is trained: BPE on the training part only
    /// (so validation measures generalisation of the learnt merges too); byte
    /// needs no training; char on the *whole* text, because a char-level model
    /// cannot represent a character outside its vocabulary at all, and the only
    /// thing the validation part could leak is the set of distinct characters.
    pub fn from_text(
        text: &str,
        cfg: &DataConfig,
        tokenizer: Option<Tokenizer>,
        path: PathBuf,
    ) -> Result<Corpus, DataError> {
        cfg.validate()?;
        if let Some(g) = &cfg.graph {
            return Self::from_graph_text(text, cfg, g, tokenizer, path);
        }
        if let Some(p) = &cfg.pairs {
            return Self::from_pairs_text(text, cfg, p, tokenizer, path);
        }
        let n_chars = text.chars().count();
        if n_chars < 2 {
            return Err(DataError::TooShort(format!(
                "corpus {} has {n_chars} character(s), too few to split into a training and a \
                 validation part: use a longer text",
                path.display()
            )));
        }
        // (`held_out`: at least one char on each side, however extreme val_fraction is)
        let n_val = held_out(n_chars, cfg.val_fraction);
        let n_train = n_chars - n_val;
        let split = text.char_indices().nth(n_train).map_or(text.len(), |(i, _)| i);
        let (train_text, val_text) = text.split_at(split);

        // Tagged: the sections on each side of the split, and the tag names.
        let tagged: Option<(Vec<String>, SplitPieces)> = match &cfg.tags {
            None => None,
            Some(tc) => {
                let sections = tc.sections(text, &path)?;
                let pieces = match tc.holdout {
                    Holdout::End => sections.split_at(split, n_train, n_val),
                    Holdout::EachSection => sections.split_each_section(text, cfg.val_fraction),
                };
                if pieces.val.is_empty() {
                    return Err(DataError::TooShort(format!(
                        "corpus {}: every section that data.tags.section = {:?} finds is one \
                         character long, so data.tags.holdout = \"each-section\" leaves nothing \
                         for validation: use an expression that matches fewer places, or \
                         holdout = \"end\"",
                        path.display(),
                        tc.section
                    )));
                }
                Some((sections.names, pieces))
            }
        };
        let (train_chars, val_chars) = tagged.as_ref().map_or((n_train, n_val), |(_, p)| (p.train_chars, p.val_chars));

        let tokenizer = match tokenizer {
            Some(t) => t,
            None => match &cfg.tokenizer {
                TokenizerConfig::Char => Tokenizer::train(&cfg.tokenizer, text)?,
                other => {
                    // With each-section holdout the training text is not one stretch of the file.
                    let train_text = tagged.as_ref().map_or(Cow::Borrowed(train_text), |(_, p)| p.train_text(text));
                    Tokenizer::train(other, &train_text)?
                }
            },
        };
        let in_corpus = |offset_base: usize| {
            let path = &path;
            move |e: DataError| match e {
                DataError::UnknownChar { ch, offset, .. } => DataError::UnknownChar {
                    ch,
                    offset: offset + offset_base,
                    context: format!(" of corpus {}", path.display()),
                },
                e => e,
            }
        };
        let (train, val, tags) = match tagged {
            None => (
                tokenizer.encode(train_text).map_err(in_corpus(0))?,
                tokenizer.encode(val_text).map_err(in_corpus(split))?,
                None,
            ),
            Some((names, pieces)) => {
                // Piece by piece, recording the token offset where each piece starts.
                let encode = |pieces: &[Piece]| -> Result<(Vec<u32>, SplitTags), DataError> {
                    let mut ids: Vec<u32> = Vec::new();
                    let mut marks = Vec::with_capacity(pieces.len());
                    for p in pieces {
                        marks.push((ids.len(), p.tag));
                        ids.extend(tokenizer.encode(&text[p.bytes.clone()]).map_err(in_corpus(p.bytes.start))?);
                    }
                    let tags = SplitTags::from_marks(marks, ids.len());
                    Ok((ids, tags))
                };
                let (train, train_tags) = encode(&pieces.train)?;
                let (val, val_tags) = encode(&pieces.val)?;
                (train, val, Some(TagSections { names, train: train_tags, val: val_tags }))
            }
        };
        Ok(Corpus {
            tokenizer,
            train,
            val,
            tags,
            graphs: None,
            pairs: None,
            path,
            train_chars,
            val_chars,
            prepared: None,
        })
    }

    /// Graph examples, one per line (`graph.rs`): the last `val_fraction` of them (at least one
    /// on each side) are the validation split. The tokenizer is trained as for text — char on
    /// every node, the others on the training examples' nodes — each node on its own line.
    fn from_graph_text(
        text: &str,
        cfg: &DataConfig,
        g: &GraphDataConfig,
        tokenizer: Option<Tokenizer>,
        path: PathBuf,
    ) -> Result<Corpus, DataError> {
        let records = graph::parse(text, &path)?;
        let n = records.len();
        if n < 2 {
            return Err(DataError::TooShort(format!(
                "graph data {} holds 1 example, too few to split into a training and a validation part",
                path.display()
            )));
        }
        let n_val = held_out(n, cfg.val_fraction);
        let n_train = n - n_val;
        let tokenizer = match tokenizer {
            Some(t) => t,
            None => {
                let from = if cfg.tokenizer == TokenizerConfig::Char { n } else { n_train };
                let nodes: Vec<&str> = records[..from].iter().flat_map(|r| r.1.iter().map(String::as_str)).collect();
                Tokenizer::train(&cfg.tokenizer, &nodes.join("\n"))?
            }
        };
        let examples = records
            .iter()
            .map(|(line, nodes, edges)| graph::example(*line, nodes, edges, g, &tokenizer, &path))
            .collect::<Result<Vec<_>, _>>()?;
        let chars = |r: &[(usize, Vec<String>, Vec<[usize; 2]>)]| {
            r.iter().flat_map(|x| x.1.iter()).map(|s| s.chars().count()).sum::<usize>()
        };
        let (train_chars, val_chars) = (chars(&records[..n_train]), chars(&records[n_train..]));
        let mut examples = examples;
        let val = examples.split_off(n_train);
        let tokens = |e: &[graph::GraphExample]| e.iter().flat_map(|x| x.tokens.iter().copied()).collect::<Vec<u32>>();
        Ok(Corpus {
            tokenizer,
            train: tokens(&examples),
            val: tokens(&val),
            tags: None,
            graphs: Some(GraphSplits { train: std::sync::Arc::new(examples), val: std::sync::Arc::new(val) }),
            pairs: None,
            path,
            train_chars,
            val_chars,
            prepared: None,
        })
    }
}

impl Corpus {
    /// A prepared corpus (`data.prepared`), opened and checked (`PreparedCorpus::open`). Its
    /// tokenizer must be the run's (`tokenizer`, when resuming or evaluating a run) and its
    /// settings the config's: otherwise the index belongs to another corpus, and the error
    /// says which part differs.
    fn from_prepared(cfg: &DataConfig, tokenizer: Option<Tokenizer>) -> Result<Corpus, DataError> {
        let dir = prepared_dir(cfg.prepared.as_ref())?;
        let prepared = PreparedCorpus::open(&dir)?;
        let index = &prepared.index;
        if index.tokenizer.config != cfg.tokenizer {
            return Err(DataError::Config(format!(
                "{} was prepared with data.tokenizer = {} but the config asks for {}: set data.tokenizer to match, or prepare again",
                dir.display(),
                serde_json::to_string(&index.tokenizer.config).unwrap_or_default(),
                serde_json::to_string(&cfg.tokenizer).unwrap_or_default()
            )));
        }
        let tokenizer = match tokenizer {
            Some(t) => {
                if t.sha256()? != index.tokenizer.sha256 {
                    return Err(DataError::Config(format!(
                        "{} was prepared with another tokenizer than the run's tokenizer.json: a run reads only the corpus its \
                         tokenizer made; prepare it again with that tokenizer (data.tokenizer.kind = \"file\")",
                        dir.display()
                    )));
                }
                t
            }
            None => prepared.tokenizer()?,
        };
        let val = prepared.val_prefix(PREPARED_VAL_TOKENS)?;
        let chars = |f: fn(&crate::prepared::ShardRecord) -> u64| index.shards.iter().map(f).sum::<u64>();
        let (train_chars, all_val_chars) = (chars(|s| s.train_chars), chars(|s| s.val_chars));
        // the held prefix's characters, in proportion (exact when it is the whole split)
        let val_chars = (all_val_chars as f64 * val.len() as f64 / index.val_tokens().max(1) as f64).round();
        Ok(Corpus {
            tokenizer,
            train: Vec::new(),
            val,
            tags: None,
            graphs: None,
            pairs: None,
            path: dir,
            train_chars: train_chars as usize,
            val_chars: val_chars as usize,
            prepared: Some(Arc::new(prepared)),
        })
    }

    /// Paired text (`pairs.rs`): a TSV file, or `text` as the sources and
    /// `data.pairs.target_path` as the targets. The last `val_fraction` of the pairs (at least
    /// one on each side) are the validation split. The tokenizer is trained as for text, on
    /// sources and targets alike (one vocabulary for both, as the encoder and decoder share
    /// their embedding).
    fn from_pairs_text(
        text: &str,
        cfg: &DataConfig,
        p: &PairsConfig,
        tokenizer: Option<Tokenizer>,
        path: PathBuf,
    ) -> Result<Corpus, DataError> {
        let target_text = p
            .target_path
            .as_deref()
            .map(|t| {
                read_text(t).map_err(|e| match e {
                    DataError::CorpusNotFound { path, .. } => DataError::CorpusNotFound {
                        path,
                        hint: "check data.pairs.target_path (the targets, aligned line by line with data.path)".into(),
                    },
                    e => e,
                })
            })
            .transpose()?;
        let targets = target_text.as_deref().zip(p.target_path.as_deref());
        let records = pairs::parse(text, targets, &path)?;
        let n = records.len();
        if n < 2 {
            return Err(DataError::TooShort(format!(
                "paired data {} holds {n} pair(s), too few to split into a training and a validation part",
                path.display()
            )));
        }
        let n_train = n - held_out(n, cfg.val_fraction);
        let tokenizer = match tokenizer {
            Some(t) => t,
            None => {
                let from = if cfg.tokenizer == TokenizerConfig::Char { n } else { n_train };
                let sides: Vec<&str> = records[..from].iter().flat_map(|r| [r.1, r.2]).collect();
                Tokenizer::train(&cfg.tokenizer, &sides.join("\n"))?
            }
        };
        let mut all =
            records.iter().map(|&(line, s, t)| pairs::pair(line, s, t, &tokenizer)).collect::<Result<Vec<_>, _>>()?;
        let chars =
            |r: &[(usize, &str, &str)]| r.iter().map(|x| x.1.chars().count() + x.2.chars().count()).sum::<usize>();
        let (train_chars, val_chars) = (chars(&records[..n_train]), chars(&records[n_train..]));
        let val = all.split_off(n_train);
        let tokens =
            |e: &[Pair]| e.iter().flat_map(|x| x.source.iter().chain(&x.target).copied()).collect::<Vec<u32>>();
        Ok(Corpus {
            tokenizer,
            train: tokens(&all),
            val: tokens(&val),
            tags: None,
            graphs: None,
            pairs: Some(PairSplits { train: std::sync::Arc::new(all), val: std::sync::Arc::new(val) }),
            path,
            train_chars,
            val_chars,
            prepared: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_path(path: &Path) -> DataConfig {
        DataConfig {
            dataset: None,
            path: Some(path.to_path_buf()),
            tokenizer: TokenizerConfig::Char,
            val_fraction: 0.1,
            tags: None,
            graph: None,
            pairs: None,
            neighbours: None,
            ..Default::default()
        }
    }

    fn text_cfg() -> DataConfig {
        cfg_path(Path::new("mem.txt"))
    }

    const TEXT: &str = "Ô — first line, café\nsecond line é—é\nthird line: naïve déjà vu\n";

    #[test]
    fn split_covers_the_whole_text_at_a_char_boundary() {
        for val_fraction in [0.05, 0.1, 0.37, 0.5, 0.9, 0.99] {
            let cfg = DataConfig { val_fraction, ..text_cfg() };
            let c = Corpus::from_text(TEXT, &cfg, None, "mem.txt".into()).expect("loads");
            let joined = c.tokenizer.decode(&c.train) + &c.tokenizer.decode(&c.val);
            assert_eq!(joined, TEXT);
            let n = TEXT.chars().count();
            assert_eq!(c.train_chars + c.val_chars, n);
            assert_eq!(c.val_chars, ((n as f64) * val_fraction).round().max(1.0) as usize);
            assert_eq!(c.val.len(), c.val_chars);
        }
    }

    #[test]
    fn char_vocab_covers_chars_only_in_validation() {
        // 'Z' only occurs in the last 10%.
        let text = format!("{}Z", "abc ".repeat(20));
        let c = Corpus::from_text(&text, &text_cfg(), None, "mem.txt".into()).expect("loads");
        assert_eq!(c.tokenizer.decode(&c.val).chars().last(), Some('Z'));
    }

    #[test]
    fn given_tokenizer_is_used_and_errors_name_the_corpus() {
        let tok = Tokenizer::train(&TokenizerConfig::Char, "abc ").expect("trains");
        let text = "abc abc abc abc abc abc abc abc abc abcé";
        let err = Corpus::from_text(text, &text_cfg(), Some(tok.clone()), "x/in.txt".into())
            .expect_err("é is unknown to the given tokenizer");
        let msg = err.to_string();
        let offset = text.find('é').expect("has é");
        assert!(msg.contains(&format!("byte offset {offset} of corpus x/in.txt")), "{msg}");
        let c = Corpus::from_text("abcabc abc", &text_cfg(), Some(tok), "m".into()).expect("ok");
        assert_eq!(c.tokenizer.vocab_size(), 4);
    }

    #[test]
    fn bpe_and_byte_corpora_round_trip() {
        let text = TEXT.repeat(30);
        for tokenizer in [TokenizerConfig::Byte, TokenizerConfig::Bpe { vocab_size: 300, min_frequency: 2 }] {
            let cfg = DataConfig { tokenizer, ..text_cfg() };
            let c = Corpus::from_text(&text, &cfg, None, "m".into()).expect("loads");
            let joined = c.tokenizer.decode(&c.train) + &c.tokenizer.decode(&c.val);
            assert_eq!(joined, text);
        }
    }

    #[test]
    fn load_reads_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("input.txt");
        std::fs::write(&path, TEXT).expect("write");
        let c = Corpus::load(&cfg_path(&path), None).expect("loads");
        assert_eq!(c.path, path);
        assert_eq!(c.train.len() + c.val.len(), TEXT.chars().count());
    }

    #[test]
    fn named_dataset_lives_in_the_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = DataConfig { dataset: Some("tiny".into()), path: None, ..text_cfg() };
        let expected = dir.path().join("tiny").join("input.txt");
        assert_eq!(cfg.text_path_in(dir.path()).expect("valid"), expected);

        let msg = Corpus::load_from(&cfg, None, dir.path()).expect_err("missing").to_string();
        assert!(msg.contains(&expected.display().to_string()), "{msg}");
        assert!(msg.contains("scripts/setup.sh") && msg.contains("'tiny'"), "{msg}");

        std::fs::create_dir_all(expected.parent().expect("parent")).expect("mkdir");
        std::fs::write(&expected, TEXT).expect("write");
        let c = Corpus::load_from(&cfg, None, dir.path()).expect("loads");
        assert_eq!(c.path, expected);

        if std::env::var_os(DATA_DIR_ENV).is_none() {
            assert_eq!(cfg.text_path().expect("valid"), Path::new("data/tiny/input.txt"));
        }
    }

    #[test]
    fn read_text_errors() {
        let dir = tempfile::tempdir().expect("tempdir");

        let missing = dir.path().join("nope.txt");
        let msg = read_text(&missing).expect_err("missing").to_string();
        assert!(msg.contains("nope.txt") && msg.contains("not found"), "{msg}");

        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "").expect("write");
        let msg = read_text(&empty).expect_err("empty").to_string();
        assert!(msg.contains("empty.txt") && msg.contains("is empty"), "{msg}");

        let latin1 = dir.path().join("latin1.txt");
        std::fs::write(&latin1, b"ab\xc3\xa9c\xe9d").expect("write");
        let err = read_text(&latin1).expect_err("not utf-8");
        assert!(matches!(err, DataError::CorpusNotUtf8 { offset: 5, .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("latin1.txt") && msg.contains("byte offset 5"), "{msg}");

        let msg = read_text(dir.path()).expect_err("a directory").to_string();
        assert!(msg.contains("could not read corpus"), "{msg}");
    }

    #[test]
    fn config_errors_name_the_key() {
        let both = DataConfig { dataset: Some("shakespeare".into()), ..text_cfg() };
        let msg = both.validate().expect_err("both").to_string();
        assert!(msg.contains("both set") && msg.contains("data.dataset"), "{msg}");

        let neither = DataConfig { path: None, ..text_cfg() };
        let msg = neither.validate().expect_err("neither").to_string();
        assert!(msg.contains("neither data.dataset nor data.path"), "{msg}");

        let bad_name = DataConfig { dataset: Some("../etc".into()), path: None, ..text_cfg() };
        assert!(bad_name.validate().is_err());

        for v in [1.5, 1.0, 0.0, -0.1, f64::NAN] {
            let cfg = DataConfig { val_fraction: v, ..text_cfg() };
            let msg = cfg.validate().expect_err("out of range").to_string();
            assert!(msg.contains(&format!("data.val_fraction = {v} must be in (0, 1)")), "{msg}");
            assert!(Corpus::from_text(TEXT, &cfg, None, "m".into()).is_err());
        }

        let small = DataConfig { tokenizer: TokenizerConfig::Bpe { vocab_size: 256, min_frequency: 2 }, ..text_cfg() };
        let msg = small.validate().expect_err("too small").to_string();
        assert!(msg.contains("data.tokenizer.vocab_size = 256"), "{msg}");
        assert!(DataConfig::default().validate().is_ok());
    }

    #[test]
    fn too_short_corpus() {
        let msg = Corpus::from_text("x", &text_cfg(), None, "one.txt".into()).expect_err("one char").to_string();
        assert!(msg.contains("one.txt") && msg.contains("1 character"), "{msg}");
        // Two chars is the minimum: one each side.
        let c = Corpus::from_text("xy", &text_cfg(), None, "two.txt".into()).expect("splits");
        assert_eq!((c.train.len(), c.val.len()), (1, 1));
    }

    /// A small play as (tag name, section) parts; `^ACT ([IVX]+)$` finds its sections.
    const PLAY: [(&str, &str); 5] = [
        ("(untagged)", "Prologue: ünder the stars\n"),
        ("I", "ACT I\nfirst act text, café\nmore of it\n"),
        ("II", "ACT II\nsecond act — text\n"),
        ("I", "ACT I\nback to one\n"),
        ("III", "ACT III\nthe end, naïve déjà vu\n"),
    ];

    /// The text of [`PLAY`], and the tag name of every char.
    fn play() -> (String, Vec<&'static str>) {
        let text = PLAY.iter().map(|p| p.1).collect();
        let names = PLAY.iter().flat_map(|&(name, s)| std::iter::repeat_n(name, s.chars().count())).collect();
        (text, names)
    }

    fn tagged_cfg(holdout: Holdout) -> DataConfig {
        DataConfig { tags: Some(TagConfig { section: "^ACT ([IVX]+)$".into(), holdout }), ..text_cfg() }
    }

    /// The tag name of every token of a split, by [`SplitTags::tag_at`].
    fn token_names<'a>(tags: &'a TagSections, split: &SplitTags, len: usize) -> Vec<&'a str> {
        (0..len).map(|i| tags.name(split.tag_at(i)).expect("a known tag")).collect()
    }

    #[test]
    fn end_holdout_keeps_the_untagged_split_and_tags_every_token() {
        let (text, names) = play();
        for val_fraction in [0.05, 0.1, 0.3, 0.5, 0.9] {
            let plain =
                Corpus::from_text(&text, &DataConfig { val_fraction, ..text_cfg() }, None, "m".into()).expect("loads");
            let cfg = DataConfig { val_fraction, ..tagged_cfg(Holdout::End) };
            let c = Corpus::from_text(&text, &cfg, None, "m".into()).expect("loads");
            assert!(plain.tags.is_none());
            assert_eq!((&c.train, &c.val), (&plain.train, &plain.val), "val_fraction {val_fraction}");
            assert_eq!((c.train_chars, c.val_chars), (plain.train_chars, plain.val_chars));
            let vocab: Vec<u32> = (0..plain.tokenizer.vocab_size() as u32).collect();
            assert_eq!(c.tokenizer.decode(&vocab), plain.tokenizer.decode(&vocab), "the same vocabulary");
            let tags = c.tags.as_ref().expect("tagged");
            assert_eq!(tags.names, ["(untagged)", "I", "II", "III"]);
            assert_eq!(token_names(tags, &tags.train, c.train.len()), names[..c.train_chars]);
            assert_eq!(token_names(tags, &tags.val, c.val.len()), names[c.train_chars..]);
        }
    }

    #[test]
    fn each_section_holdout_puts_every_tag_in_both_splits() {
        let (text, names) = play();
        let cfg = DataConfig { val_fraction: 0.2, ..tagged_cfg(Holdout::EachSection) };
        let c = Corpus::from_text(&text, &cfg, None, "m".into()).expect("loads");
        assert_eq!(c.train_chars + c.val_chars, text.chars().count());
        assert_eq!((c.train.len(), c.val.len()), (c.train_chars, c.val_chars), "char tokens");
        let tags = c.tags.as_ref().expect("tagged");
        let train_names = token_names(tags, &tags.train, c.train.len());
        let val_names = token_names(tags, &tags.val, c.val.len());
        for name in ["(untagged)", "I", "II", "III"] {
            assert!(train_names.contains(&name) && val_names.contains(&name), "{name}");
        }
        // Both splits are the sections' parts in text order, and together hold every char once.
        let (train, val) = (c.tokenizer.decode(&c.train), c.tokenizer.decode(&c.val));
        assert!(train.starts_with("Prologue") && train.contains("ACT II\nsecond") && !train.ends_with('\n'), "{train}");
        assert!(val.ends_with("jà vu\n"), "{val}");
        let mut all: Vec<char> = (train + &val).chars().collect();
        let mut expected: Vec<char> = text.chars().collect();
        all.sort_unstable();
        expected.sort_unstable();
        assert_eq!(all, expected);
        // Every token's tag is that of its char in the text.
        let mut text_names = names.iter();
        let mut train_it = train_names.iter();
        let mut val_it = val_names.iter();
        for (section, piece) in PLAY {
            let n = piece.chars().count();
            let n_val = ((n as f64) * 0.2).round() as usize;
            for _ in 0..n - n_val {
                assert_eq!((train_it.next(), text_names.next()), (Some(&section), Some(&section)));
            }
            for _ in 0..n_val {
                assert_eq!((val_it.next(), text_names.next()), (Some(&section), Some(&section)));
            }
        }
        assert_eq!((train_it.next(), val_it.next(), text_names.next()), (None, None, None));
    }

    #[test]
    fn tagged_bpe_trains_on_the_training_sections() {
        let (text, _) = play();
        let text = text.repeat(20);
        let tokenizer = TokenizerConfig::Bpe { vocab_size: 300, min_frequency: 2 };
        for holdout in [Holdout::End, Holdout::EachSection] {
            let cfg = DataConfig { tokenizer: tokenizer.clone(), ..tagged_cfg(holdout) };
            let c = Corpus::from_text(&text, &cfg, None, "m".into()).expect("loads");
            let tags = c.tags.as_ref().expect("tagged");
            assert_eq!(tags.len(), 4);
            let joined = c.tokenizer.decode(&c.train) + &c.tokenizer.decode(&c.val);
            assert_eq!(joined.len(), text.len());
            assert_eq!(c.train_chars + c.val_chars, text.chars().count());
            // Section starts are token boundaries: the token at a start decodes to the header.
            for (&start, &tag) in tags.train.starts().iter().zip(tags.train.tags()).skip(1) {
                let header = format!("ACT {}", tags.name(tag).expect("named"));
                let rest = c.tokenizer.decode(&c.train[start..]);
                assert!(rest.starts_with(&header), "{header}: {}", rest.chars().take(20).collect::<String>());
            }
        }
    }

    #[test]
    fn tag_errors_name_the_key() {
        let (text, _) = play();
        let bad = DataConfig { tags: Some(TagConfig { section: "ACT (".into(), holdout: Holdout::End }), ..text_cfg() };
        let msg = bad.validate().expect_err("bad regex").to_string();
        assert!(msg.contains("data.tags.section = \"ACT (\""), "{msg}");
        assert!(Corpus::from_text(&text, &bad, None, "m".into()).is_err());

        let empty =
            DataConfig { tags: Some(TagConfig { section: "(ACT)?".into(), holdout: Holdout::End }), ..text_cfg() };
        let msg = empty.validate().expect_err("matches the empty string").to_string();
        assert!(msg.contains("data.tags.section") && msg.contains("empty string"), "{msg}");

        let nowhere =
            DataConfig { tags: Some(TagConfig { section: "^SCENE".into(), holdout: Holdout::End }), ..text_cfg() };
        assert!(nowhere.validate().is_ok(), "only the text can tell");
        let msg = Corpus::from_text(&text, &nowhere, None, "x/play.txt".into()).expect_err("no match").to_string();
        assert!(msg.contains("data.tags.section = \"^SCENE\" matches nowhere in corpus x/play.txt"), "{msg}");

        let tiny =
            DataConfig { tags: Some(TagConfig { section: ".".into(), holdout: Holdout::EachSection }), ..text_cfg() };
        let msg = Corpus::from_text("ab", &tiny, None, "m".into()).expect_err("nothing held out").to_string();
        assert!(msg.contains("leaves nothing for validation"), "{msg}");
    }

    #[test]
    fn config_serde() {
        let cfg: DataConfig = serde_json::from_str(r#"{"dataset":"shakespeare"}"#).expect("ok");
        assert_eq!(cfg, DataConfig::default());
        let cfg: DataConfig =
            serde_json::from_str(r#"{"path":"a.txt","val_fraction":0.2,"tokenizer":{"kind":"bpe","vocab_size":512}}"#)
                .expect("ok");
        assert_eq!(cfg.tokenizer, TokenizerConfig::Bpe { vocab_size: 512, min_frequency: 2 });
        assert!(serde_json::from_str::<DataConfig>(r#"{"dataset":"x","valfraction":0.2}"#).is_err());

        let cfg: DataConfig =
            serde_json::from_str(r#"{"path":"a.txt","tags":{"section":"^ACT ([IVX]+)$","holdout":"each-section"}}"#)
                .expect("ok");
        assert_eq!(cfg.tags, Some(TagConfig { section: "^ACT ([IVX]+)$".into(), holdout: Holdout::EachSection }));
        let json = serde_json::to_string(&cfg).expect("serializes");
        assert_eq!(serde_json::from_str::<DataConfig>(&json).expect("round trip"), cfg);
        assert!(serde_json::from_str::<DataConfig>(r#"{"path":"a.txt","tags":{"section":"x","every":1}}"#).is_err());
        assert!(serde_json::from_str::<DataConfig>(r#"{"path":"a.txt","tags":{"holdout":"end"}}"#).is_err());
        let untagged = serde_json::to_string(&DataConfig::default()).expect("serializes");
        assert!(!untagged.contains("tags"), "untagged configs serialize as before: {untagged}");
    }
}
