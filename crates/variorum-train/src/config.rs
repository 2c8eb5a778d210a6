//! The experiment file: `[model]`, `[data]`, `[train]`, in TOML or JSON.
//!
//! Unknown keys are refused and every error names the key path, e.g.
//! `configs/x.toml: model.attention.n_headz: unknown field `n_headz`, expected one of …`.
//!
//! A TOML config may start from another: `extends = "base.toml"` (relative to the file) loads the
//! base and overrides it key by key. A table that names a `kind` replaces the base's table for
//! that axis whole (another variant has other fields); other tables merge recursively. So a
//! family of variants is one base plus a few lines each (`configs/positions/`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};
use variorum_data::DataConfig;
use variorum_model::{ModelConfig, ObjectiveConfig};

/// An experiment file: the model, its data and its training, checked together by
/// [`ExperimentConfig::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// `[model]`: what is trained.
    #[serde(default)]
    pub model: ModelConfig,
    /// `[data]`: the corpus, its tokenizer and split. Required.
    pub data: DataConfig,
    /// `[train]`: the optimizer, schedule, batching, evaluation and checkpoints.
    #[serde(default)]
    pub train: TrainConfig,
}

/// How training batches are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Batching {
    /// Random windows of `seq_len + 1` tokens (the usual LM training).
    #[default]
    Random,
    /// Contiguous streams: row r of batch t+1 continues row r of batch t (recurrent models).
    Ordered,
    /// Whole documents (the sections of `data.tags`), each row reading its own documents one
    /// after another, each from a segment boundary: models whose memory is per document
    /// (`variorum_data::DocumentStreams`).
    Documents,
}

/// Learning-rate schedule after the linear warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decay {
    /// Cosine from `lr` to `min_lr` at the last step (Loshchilov & Hutter 2017).
    #[default]
    Cosine,
    /// Linear from `lr` to `min_lr`.
    Linear,
    /// Stay at `lr`.
    Constant,
}

/// `[train]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer steps. Default 2000.
    pub steps: u64,
    /// Sequences per micro-batch. Default 12.
    pub batch_size: usize,
    /// Micro-batches per optimizer step. Default 1.
    pub grad_accum: usize,
    /// Peak learning rate. Default 1e-3.
    pub lr: f64,
    /// Final learning rate of the decay. Default 1e-4.
    pub min_lr: f64,
    /// Linear warmup from 0 to `lr`. Default 100.
    pub warmup_steps: u64,
    /// Schedule after the warmup: `cosine` (default), `linear` or `constant`.
    pub decay: Decay,
    /// AdamW decoupled weight decay, applied to matrices and embeddings only (not to biases,
    /// norms or position frequencies). Default 0.1.
    pub weight_decay: f64,
    /// Default 0.9.
    pub beta1: f64,
    /// Default 0.99.
    pub beta2: f64,
    /// Default 1e-8.
    pub eps: f64,
    /// Clip the global gradient norm (over all parameters, as PyTorch's `clip_grad_norm_`) to
    /// this value; 0 = off. Default 1.0.
    pub grad_clip: f64,
    /// Evaluate on the validation split every N steps (and at the end); 0 = only at the end. Default 250.
    pub eval_interval: u64,
    /// Validation batches per evaluation. Default 20.
    pub eval_batches: usize,
    /// Write a checkpoint every N steps (and at the end); 0 = only at the end. Default 500.
    pub checkpoint_interval: u64,
    /// Checkpoints kept on disk. Default 2.
    pub keep_checkpoints: usize,
    /// Write a metrics row every N steps. Default 10.
    pub log_interval: u64,
    /// Seeds initialisation, batches and dropout. Default 1337.
    pub seed: u64,
    /// How batches are drawn: `random` (default), `ordered` or `documents`.
    pub batching: Batching,
    /// Length of the sample generated at the end. Default 500.
    pub sample_tokens: usize,
    /// Sampling temperature of that sample. Default 0.8.
    pub sample_temperature: f64,
    /// Parameter groups left untouched by training (fine-tuning).
    pub freeze: crate::freeze::FreezeConfig,
    /// Low-rank adapters on the projections, every other parameter frozen (fine-tuning;
    /// [`crate::lora`]). Default: none.
    pub lora: Option<crate::lora::LoraConfig>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 2000,
            batch_size: 12,
            grad_accum: 1,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            decay: Decay::Cosine,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            grad_clip: 1.0,
            eval_interval: 250,
            eval_batches: 20,
            checkpoint_interval: 500,
            keep_checkpoints: 2,
            log_interval: 10,
            seed: 1337,
            batching: Batching::Random,
            sample_tokens: 500,
            sample_temperature: 0.8,
            freeze: Default::default(),
            lora: None,
        }
    }
}

impl TrainConfig {
    /// Checks every setting's range; messages name the key (`train.*`) and what works.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.steps > 0, || "train.steps must be at least 1".into())?;
        check(self.batch_size > 0, || "train.batch_size must be at least 1".into())?;
        check(self.grad_accum > 0, || "train.grad_accum must be at least 1".into())?;
        check(self.lr > 0.0 && self.lr.is_finite(), || format!("train.lr = {} must be > 0", self.lr))?;
        check(self.min_lr >= 0.0 && self.min_lr <= self.lr, || {
            format!("train.min_lr = {} must be in [0, train.lr = {}]", self.min_lr, self.lr)
        })?;
        check(self.weight_decay >= 0.0, || format!("train.weight_decay = {} must be >= 0", self.weight_decay))?;
        for (k, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            check((0.0..1.0).contains(&v), || format!("train.{k} = {v} must be in [0, 1)"))?;
        }
        check(self.eps > 0.0, || format!("train.eps = {} must be > 0", self.eps))?;
        check(self.grad_clip >= 0.0, || format!("train.grad_clip = {} must be >= 0 (0 = off)", self.grad_clip))?;
        check(self.eval_batches > 0, || "train.eval_batches must be at least 1".into())?;
        check(self.keep_checkpoints > 0, || "train.keep_checkpoints must be at least 1".into())?;
        check(self.log_interval > 0, || "train.log_interval must be at least 1".into())?;
        check(self.sample_temperature >= 0.0, || {
            format!("train.sample_temperature = {} must be >= 0 (0 = greedy)", self.sample_temperature)
        })
    }
}

/// Graph data (`data.graph`) needs an attention kind that reads the graph, a model whose
/// forward covers whole examples at once (random batches, no memory, exits, reversible stack or
/// global input), and no other path between positions (a convolution in the feed-forward).
fn check_graph(cfg: &ExperimentConfig) -> Result<(), ConfigError> {
    if cfg.data.graph.is_none() {
        return Ok(());
    }
    let m = &cfg.model;
    check(m.attention.capabilities().graph, || {
        format!(
            "data.graph gives every example a graph, but model.attention.kind = \"{}\" does not read one: use \"graph\" (gathered neighbours, dot or additive scores) or \"full\" (masked densely)",
            m.attention.kind()
        )
    })?;
    let refused = [
        (
            cfg.train.batching != Batching::Random,
            "train.batching = \"ordered\" or \"documents\" (graph examples are drawn whole)",
        ),
        (!m.memory.is_none(), "a memory (model.memory)"),
        (!matches!(m.exits, variorum_model::ExitConfig::None), "early exits (model.exits)"),
        (m.block.reversible(), "a reversible stack"),
        (m.attention.capabilities().global_input, "a global input"),
        (
            !m.feed_forward.kind.capabilities().position_wise,
            "a feed-forward that reads earlier positions (model.feed_forward.kind), past the edges",
        ),
    ];
    match refused.iter().find(|(on, _)| *on) {
        Some((_, what)) => Err(ConfigError::new(format!(
            "data.graph covers whole examples in one forward, which rules out {what}: remove it or use text data"
        ))),
        None => Ok(()),
    }
}

/// An encoder–decoder trains on examples with a source: paired text (`data.pairs`, under the
/// causal objective) or span corruption of a plain text; and only an encoder–decoder reads them.
fn check_encoder_decoder(cfg: &ExperimentConfig) -> Result<(), ConfigError> {
    let m = &cfg.model;
    let (pairs, spans) = (cfg.data.pairs.is_some(), matches!(m.objective, ObjectiveConfig::SpanCorruption(_)));
    if !m.is_encoder_decoder() {
        return check(!pairs, || {
            "data.pairs gives every example a source, which only an encoder reads: set model.kind = \"encoder-decoder\""
                .into()
        });
    }
    check(pairs || spans, || {
        "model.kind = \"encoder-decoder\" reads a source with every example: set data.pairs (paired text) or model.objective.kind = \"span-corruption\" (denoising a plain text)".into()
    })?;
    check(!(pairs && spans), || {
        "data.pairs and model.objective.kind = \"span-corruption\" are both set: paired text brings its own targets; use model.objective.kind = \"causal\" with it".into()
    })?;
    check(cfg.data.graph.is_none() && cfg.data.tags.is_none(), || {
        "model.kind = \"encoder-decoder\" reads paired or corrupted examples, not data.graph or data.tags: remove them"
            .into()
    })?;
    check(cfg.train.batching == Batching::Random, || {
        "model.kind = \"encoder-decoder\" draws whole examples: use train.batching = \"random\"".into()
    })?;
    if let ObjectiveConfig::SpanCorruption(c) = &m.objective {
        let (noise, spans) = c.noise(m.seq_len);
        check(noise + spans < m.seq_len, || {
            format!(
                "model.seq_len = {} is too short for span corruption: its target ({noise} dropped tokens, {spans} sentinels and the end token) would not fit; use a longer context",
                m.seq_len
            )
        })?;
    }
    Ok(())
}

impl ExperimentConfig {
    /// Parses a config file (`.toml`, or `.json`), then validates it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let text = if json { read_config(path)? } else { toml_with_extends(path, 0)?.to_string() };
        let cfg = Self::parse(&text, json).map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        cfg.validate().map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        Ok(cfg)
    }

    /// Parses TOML (or JSON) text; errors name the key path.
    pub fn parse(text: &str, json: bool) -> Result<Self, ConfigError> {
        if json {
            let de = &mut serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| ConfigError::new(format!("{}: {}", e.path(), e.inner())))
        } else {
            let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::new(one_line(&e.to_string())))?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let inner = one_line(&e.inner().to_string());
                ConfigError::new(format!("{}: {inner}", e.path()))
            })
        }
    }

    /// Checks each section and the combinations across them (a memory needs ordered batches, an
    /// encoder–decoder paired or corrupted examples, …); messages name the keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        let decision = self.model.kind == variorum_model::ModelKind::DecisionTransformer;
        check(decision == self.data.trajectories.is_some(), || {
            match decision {
            true => "model.kind = \"decision-transformer\" trains on episodes: set data.trajectories to a file written by `variorum trajectories`".into(),
            false => "data.trajectories holds episodes, which only model.kind = \"decision-transformer\" reads: set it, or use text data".into(),
        }
        })?;
        if decision {
            check(self.train.batching == Batching::Random, || {
                "train.batching: the Decision Transformer draws random windows of steps; remove the setting".into()
            })?;
            check(self.train.lora.is_none() && self.train.freeze.is_empty(), || {
                "train.lora and train.freeze adapt a language model; the Decision Transformer trains all of its weights"
                    .into()
            })?;
            self.data.validate().map_err(|e| ConfigError::new(e.to_string()))?;
            return self.train.validate();
        }
        check(self.model.memory.is_none() || self.train.batching == Batching::Ordered, || {
            format!(
                "model.memory.kind = \"{}\" carries memory from one segment to the next, which needs train.batching = \"ordered\" (random windows are unrelated; document streams would reset its rows one at a time, which its memory does not do)",
                self.model.memory.kind()
            )
        })?;
        check(!self.model.attention.capabilities().remembers || self.train.batching != Batching::Random, || {
            format!(
                "model.attention.kind = \"{}\" remembers earlier segments, which needs train.batching = \"documents\" (a memory per document: data.tags' sections, or a prepared corpus's documents) or \"ordered\" (random windows are unrelated)",
                self.model.attention.kind()
            )
        })?;
        check(
            self.train.batching != Batching::Documents || self.data.tags.is_some() || self.data.is_prepared(),
            || {
                "train.batching = \"documents\" reads the sections of data.tags as documents: add a [data.tags] section pattern (e.g. section = \"^(.+)\\n\\nby William Shakespeare\"), or prepare the text's documents (data.sources)".into()
            },
        )?;
        check(self.train.batching == Batching::Random || self.data.sources.iter().all(|s| s.weight.is_none()), || {
            "data.sources' weights draw random windows from each source at its share, but ordered and document streams read every source in turn: remove the weights or use train.batching = \"random\"".into()
        })?;
        check(self.model.long_term_memory.is_some() == self.data.neighbours.is_some(), || {
            match self.model.long_term_memory {
                Some(_) => "model.long_term_memory reads each position's retrieved tokens, which data.neighbours gives: set it to a datastore directory whose neighbour tables `variorum datastore neighbours` searched".into(),
                None => "data.neighbours gives retrieved tokens, which only a model with a long-term memory reads: add [model.long_term_memory] or remove data.neighbours".into(),
            }
        })?;
        check(self.model.long_term_memory.is_none() || self.data.graph.is_none(), || {
            "model.long_term_memory looks up each position's neighbours in a text, and data.graph gives examples: use it on plain text".into()
        })?;
        check(self.model.long_term_memory.is_none() || self.train.batching != Batching::Documents, || {
            "model.long_term_memory looks up each row's neighbours by its place in the text, which document streams (padded segments) do not keep: use train.batching = \"ordered\" or \"random\"".into()
        })?;
        check(!self.model.attention.capabilities().policy || self.train.batch_size >= 2, || {
            format!(
                "model.attention.kind = \"{}\" trains a discrete choice by REINFORCE, each batch row against the others, which train.batch_size = 1 does not have: use train.batch_size ≥ 2 (or policy_weight = 0)",
                self.model.attention.kind()
            )
        })?;
        check_graph(self)?;
        check_encoder_decoder(self)?;
        self.train.freeze.validate(self.model.n_layers, self.model.tie_embeddings)?;
        if let Some(lora) = &self.train.lora {
            lora.validate()?;
            check(self.train.freeze.is_empty(), || {
                "train.freeze with train.lora: LoRA freezes every parameter but its adapters already; remove [train.freeze]".into()
            })?;
            check(!self.model.block.reversible(), || {
                "train.lora with model.block.kind = \"reversible\": a reversible stack's backward recomputes each block from its weights' values, not through their adapters; fine-tune it without LoRA".into()
            })?;
        }
        self.data.validate().map_err(|e| ConfigError::new(e.to_string()))?;
        self.train.validate()
    }

    /// The config with `key = value` settings applied (`model.memory.length=256`: a dotted key,
    /// a TOML value, or else a string), validated again. For evaluating a trained run under
    /// another setting that needs no other weights (a longer memory, a longer context).
    pub fn with_settings(&self, settings: &[String]) -> Result<Self, ConfigError> {
        if settings.is_empty() {
            return Ok(self.clone());
        }
        let mut root = toml::Value::try_from(self).map_err(|e| ConfigError::new(one_line(&e.to_string())))?;
        for setting in settings {
            let Some((key, text)) = setting.split_once('=') else {
                return Err(ConfigError::new(format!(
                    "--set {setting}: expected KEY=VALUE, e.g. model.memory.length=256"
                )));
            };
            let (key, text) = (key.trim(), text.trim());
            let value = toml::from_str::<toml::Table>(&format!("v = {text}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(text.to_string()));
            let mut parts: Vec<&str> = key.split('.').collect();
            let last = parts
                .pop()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| ConfigError::new(format!("--set {setting}: empty key")))?;
            let mut table = root.as_table_mut().expect("a config is a table");
            for (i, part) in parts.iter().enumerate() {
                table = match table.get_mut(*part).and_then(toml::Value::as_table_mut) {
                    Some(t) => t,
                    None => {
                        let at = parts[..=i].join(".");
                        return Err(ConfigError::new(format!("--set {setting}: the config has no table {at}")));
                    }
                };
            }
            table.insert(last.to_string(), value);
        }
        let text = toml::to_string(&root).map_err(|e| ConfigError::new(one_line(&e.to_string())))?;
        let cfg = Self::parse(&text, false).map_err(|e| ConfigError::new(format!("--set: {e}")))?;
        cfg.validate().map_err(|e| ConfigError::new(format!("--set: {e}")))?;
        Ok(cfg)
    }

    /// The config with every default written out.
    pub fn to_toml(&self) -> String {
        let expanded = Self { model: self.model.expanded(), ..self.clone() };
        toml::to_string_pretty(&expanded).unwrap_or_else(|e| format!("# could not serialise config: {e}\n"))
    }
}

/// toml's messages span several lines (with a source excerpt); keep the first useful line.
fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::new(format!("cannot read config {}: {e}", path.display())))
}

/// The TOML table of `path` with its `extends` chain resolved.
fn toml_with_extends(path: &Path, depth: usize) -> Result<toml::Table, ConfigError> {
    let text = read_config(path)?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::new(format!("{}: {}", path.display(), one_line(&e.to_string()))))?;
    let Some(base) = table.remove("extends") else { return Ok(table) };
    let where_ = path.display();
    let toml::Value::String(base) = base else {
        return Err(ConfigError::new(format!("{where_}: extends must be a file name, e.g. extends = \"base.toml\"")));
    };
    check(depth < 8, || format!("{where_}: extends = \"{base}\" goes more than 8 files deep (a cycle?)"))?;
    let base_path = path.parent().unwrap_or(Path::new(".")).join(&base);
    let mut merged = toml_with_extends(&base_path, depth + 1)
        .map_err(|e| ConfigError::new(format!("{where_}: extends = \"{base}\": {e}")))?;
    merge(&mut merged, table);
    Ok(merged)
}

/// Overrides `base` with `over`: tables merge key by key unless the override names a `kind` (a
/// tagged axis table, replaced whole). `[model]` itself always merges: its `kind` (decoder or
/// encoder–decoder) is one setting among the model's, not the tag of a table.
fn merge(base: &mut toml::Table, over: toml::Table) {
    merge_at(base, over, true)
}

/// Keys of `[data]` of which a config holds one: an extending file that sets one of them
/// replaces the base's (a fine-tuning config that sets `data.path` over an imported run's
/// `data.dataset`).
const DATA_SOURCES: [&str; 2] = ["dataset", "path"];

fn merge_at(base: &mut toml::Table, over: toml::Table, root: bool) {
    for (key, value) in over {
        let tagged = |o: &toml::Table| o.contains_key("kind") && !(root && key == "model");
        if let (true, Some(toml::Value::Table(b)), toml::Value::Table(o)) =
            (root && key == "data", base.get_mut(&key), &value)
        {
            if DATA_SOURCES.iter().any(|k| o.contains_key(*k)) {
                b.retain(|k, _| !DATA_SOURCES.iter().any(|s| *s == k));
            }
        }
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) if !tagged(&o) => merge_at(b, o, false),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// A TOML error in one short line: the message and where (line, column), without the excerpt
/// of the source that toml quotes under it (a gutter `|`, the offending line whole, a caret) —
/// one line of a 200 KB config would otherwise be the error — and cut to [`MAX_ERROR`] characters.
fn one_line(msg: &str) -> String {
    let excerpt = |l: &str| {
        let t = l.trim_start();
        t.starts_with('|')
            || t.split_once('|')
                .is_some_and(|(n, _)| !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit()))
    };
    let line = msg.lines().filter(|l| !l.trim().is_empty() && !excerpt(l)).collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_ERROR) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// The longest config error printed, in characters.
const MAX_ERROR: usize = 300;

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
[model]
d_model = 64
[model.attention]
kind = "full"
n_heads = 4
[data]
path = "x.txt"
"#;

    #[test]
    fn a_parse_error_is_one_short_line_that_names_where() {
        // a 200 KB config on one line, broken near its end
        let long = format!("x = \"{}\" y", "a".repeat(200_000));
        let err = ExperimentConfig::parse(&long, false).unwrap_err().to_string();
        assert!(err.len() < 400, "{} characters: {}", err.len(), &err[..400.min(err.len())]);
        assert!(err.contains("line 1") && err.contains("column"), "{err}");
        assert!(!err.contains("aaaa"), "{err}");
        // a short one keeps its message whole
        let err = ExperimentConfig::parse("[model\nd_model = 1", false).unwrap_err().to_string();
        assert!(err.contains("line 1") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn extends_overrides_a_base_and_a_kind_replaces_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let base = OK.replace("[data]", "[model.position]\nkind = \"learned\"\nmax_len = 128\n[data]");
        std::fs::write(dir.path().join("base.toml"), base).unwrap();
        std::fs::create_dir(dir.path().join("v")).unwrap();
        let variant = "extends = \"../base.toml\"\n[model]\nn_layers = 2\n[model.position]\nkind = \"alibi\"\n";
        std::fs::write(dir.path().join("v/alibi.toml"), variant).unwrap();
        let c = ExperimentConfig::load(&dir.path().join("v/alibi.toml")).unwrap();
        assert_eq!((c.model.d_model, c.model.n_layers), (64, 2), "kept from the base, overridden");
        assert_eq!(
            c.model.position,
            variorum_position::PositionConfig::Alibi(Default::default()),
            "max_len of the base's learned table is gone"
        );
        // [model] merges even when it names the model's kind
        let over = "extends = \"../base.toml\"\n[model]\nkind = \"decoder\"\nn_layers = 3\n";
        std::fs::write(dir.path().join("v/kind.toml"), over).unwrap();
        let c = ExperimentConfig::load(&dir.path().join("v/kind.toml")).unwrap();
        assert_eq!((c.model.d_model, c.model.n_layers), (64, 3));
        assert_eq!(c.model.position.kind(), "learned", "the base's position table is kept");
        // data.path in an extending file replaces the base's data.dataset, and the reverse
        std::fs::write(dir.path().join("v/file.toml"), "extends = \"../base.toml\"\n[data]\npath = \"my.txt\"\n")
            .unwrap();
        let c = ExperimentConfig::load(&dir.path().join("v/file.toml")).unwrap();
        assert_eq!((c.data.dataset.as_deref(), c.data.path.as_deref()), (None, Some(Path::new("my.txt"))));
        std::fs::write(dir.path().join("v/back.toml"), "extends = \"file.toml\"\n[data]\ndataset = \"shakespeare\"\n")
            .unwrap();
        let c = ExperimentConfig::load(&dir.path().join("v/back.toml")).unwrap();
        assert_eq!((c.data.dataset.as_deref(), c.data.path.as_deref()), (Some("shakespeare"), None));
        std::fs::write(dir.path().join("v/again.toml"), "extends = \"back.toml\"\n[data]\npath = \"a.txt\"\n").unwrap();
        let c = ExperimentConfig::load(&dir.path().join("v/again.toml")).unwrap();
        assert_eq!((c.data.dataset.as_deref(), c.data.path.as_deref()), (None, Some(Path::new("a.txt"))));
        // a missing base and a cycle are clear errors
        std::fs::write(dir.path().join("a.toml"), "extends = \"b.toml\"").unwrap();
        std::fs::write(dir.path().join("b.toml"), "extends = \"a.toml\"").unwrap();
        let e = ExperimentConfig::load(&dir.path().join("a.toml")).unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
        std::fs::write(dir.path().join("c.toml"), "extends = \"nope.toml\"").unwrap();
        let e = ExperimentConfig::load(&dir.path().join("c.toml")).unwrap_err().to_string();
        assert!(e.contains("nope.toml") && e.contains("cannot read"), "{e}");
    }

    #[test]
    fn parses_and_fills_defaults() {
        let c = ExperimentConfig::parse(OK, false).unwrap();
        assert_eq!(c.model.d_model, 64);
        assert_eq!(c.train.steps, 2000);
        // the expanded form parses back to the same value, derived defaults written out
        let expanded = ExperimentConfig::parse(&c.to_toml(), false).unwrap();
        assert_eq!(expanded.model, c.model.expanded());
        assert_eq!(expanded.model.expanded(), expanded.model, "expanding is idempotent");
        assert!(c.to_toml().contains("n_kv_heads = 4") && c.to_toml().contains("d_ff = 256"), "{}", c.to_toml());
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(ExperimentConfig::parse(&json, true).unwrap(), c);
    }

    #[test]
    fn unknown_key_names_its_path() {
        let bad = OK.replace("n_heads = 4", "n_headz = 4");
        let e = ExperimentConfig::parse(&bad, false).unwrap_err().to_string();
        assert!(e.starts_with("model.attention"), "{e}");
        assert!(e.contains("n_headz"), "{e}");
    }

    #[test]
    fn unknown_kind_is_refused() {
        let bad = OK.replace("kind = \"full\"", "kind = \"fulll\"");
        let e = ExperimentConfig::parse(&bad, false).unwrap_err().to_string();
        assert!(e.contains("fulll") && e.contains("model.attention"), "{e}");
    }

    #[test]
    fn impossible_head_count_names_both_keys() {
        let bad = OK.replace("n_heads = 4", "n_heads = 5");
        let c = ExperimentConfig::parse(&bad, false).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("model.attention.n_heads = 5 does not divide model.d_model = 64"), "{e}");
    }

    #[test]
    fn an_absurd_size_is_refused_before_anything_is_built() {
        let refused = |from: &str, to: &str, says: &str| {
            let e = ExperimentConfig::parse(&OK.replace(from, to), false).unwrap().validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        };
        refused("d_model = 64", "d_model = 64\nn_layers = 100000000", "model.n_layers = 100000000 is more than 10000");
        refused("d_model = 64", "d_model = 1048576", "model.d_model = 1048576 is more than 131072");
        refused(
            "n_heads = 4",
            "n_heads = 4\nhead_dim = 1000000",
            "4 heads of 1000000 (4000000 in all) are more than 131072",
        );
        refused(
            "[data]",
            "[model.position]\nkind = \"multiplicative\"\nmax_distance = 18446744073709551615\n[data]",
            "max_distance = 18446744073709551615 must be below 2^24",
        );
        let at_the_limits = OK.replace("d_model = 64", "d_model = 131072\nn_layers = 10000");
        assert!(ExperimentConfig::parse(&at_the_limits, false).unwrap().validate().is_ok());
    }

    #[test]
    fn a_long_term_memory_needs_its_neighbours_and_windows_of_one_text() {
        let check = |model: &str, data: &str| {
            let text = OK.replace("[data]", &format!("{model}[data]")) + data;
            ExperimentConfig::parse(&text, false).unwrap().validate().err().map(|e| e.to_string()).unwrap_or_default()
        };
        let ltm = "[model.long_term_memory]\nk = 4\n";
        assert!(
            check(ltm, "")
                .contains("model.long_term_memory reads each position's retrieved tokens, which data.neighbours gives")
        );
        assert!(check("", "neighbours = \"ds\"\n").contains("only a model with a long-term memory reads"));
        assert_eq!(check(ltm, "neighbours = \"ds\"\n"), "");
        let e = check(ltm, "neighbours = \"ds\"\ntags = { section = \"^x\" }\n[train]\nbatching = \"documents\"\n");
        assert!(e.contains("document streams (padded segments) do not keep"), "{e}");
        let e = check(&format!("{ltm}[model.exits]\nkind = \"every-layer\"\n"), "neighbours = \"ds\"\n");
        assert!(e.contains("model.long_term_memory mixes retrieved tokens into the final state"), "{e}");
        assert!(
            check("[model.long_term_memory]\nk = 0\n", "neighbours = \"ds\"\n").contains("k = 0 must be in 1..=1024")
        );
    }

    #[test]
    fn a_convolutional_transition_with_exits_is_refused_by_name() {
        let bad = OK.replace(
            "[data]",
            "[model.feed_forward]\nkind = \"separable-conv\"\n[model.exits]\nkind = \"every-layer\"\npredictor = \"token-geometric\"\n[data]",
        );
        let c = ExperimentConfig::parse(&bad, false).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("separable-conv") && e.contains("model.exits.kind = \"every-layer\""), "{e}");
        assert!(ExperimentConfig::parse(&bad.replace("separable-conv", "relu"), false).unwrap().validate().is_ok());
    }

    #[test]
    fn absolute_scores_with_blocked_attention_are_refused_by_name() {
        let bad = OK
            .replace("kind = \"full\"", "kind = \"local\"")
            .replace("[data]", "[model.position]\nkind = \"untied\"\n[data]");
        let e = ExperimentConfig::parse(&bad, false).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("untied") && e.contains("\"local\""), "{e}");
        let ok = bad.replace("untied", "alibi");
        assert!(ExperimentConfig::parse(&ok, false).unwrap().validate().is_ok());
    }

    #[test]
    fn content_based_kinds_refuse_a_memory_a_relative_scheme_and_a_causal_sortcut() {
        let lsh = OK.replace("kind = \"full\"", "kind = \"lsh\"");
        assert!(ExperimentConfig::parse(&lsh, false).unwrap().validate().is_ok());
        let memory = lsh.replace("[data]", "[model.position]\nkind = \"none\"\n[model.memory]\nkind = \"xl\"\n[data]");
        let e = ExperimentConfig::parse(&memory, false).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("\"lsh\" cannot read a memory"), "{e}");
        let alibi = lsh.replace("[data]", "[model.position]\nkind = \"alibi\"\n[data]");
        let e = ExperimentConfig::parse(&alibi, false).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("alibi") && e.contains("\"lsh\""), "{e}");
        let sortcut = OK.replace("kind = \"full\"", "kind = \"sinkhorn\"\nsortcut = 2");
        let e = ExperimentConfig::parse(&sortcut, false).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("model.attention.sortcut") && e.contains("bidirectional"), "{e}");
        assert!(ExperimentConfig::parse(&sortcut.replace("sortcut = 2", ""), false).unwrap().validate().is_ok());
    }

    #[test]
    fn settings_change_one_key_and_are_checked_like_a_config() {
        let base = ExperimentConfig::parse(&OK.replace("[data]", "[model.position]\nkind = \"alibi\"\n[model.memory]\nkind = \"xl\"\n[train]\nbatching = \"ordered\"\n[data]"), false).unwrap();
        let set = |s: &[&str]| base.with_settings(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        let c = set(&["model.memory.length=256", "model.attention.n_heads = 2"]).unwrap();
        assert_eq!(c.model.memory, variorum_block::MemoryConfig::Xl(variorum_block::XlMemoryConfig { length: 256 }));
        assert!(c.to_toml().contains("n_heads = 2"));
        assert_eq!(set(&[]).unwrap(), base);
        for (bad, names) in [
            (&["model.memory.lenght=3"][..], "unknown field `lenght`"),
            (&["model.nothing.x=1"][..], "no table model.nothing"),
            (&["model.memory.length"][..], "KEY=VALUE"),
            (&["model.attention.n_heads=3"][..], "n_heads"),
        ] {
            let e = set(bad).unwrap_err().to_string();
            assert!(e.contains(names) && !e.contains('\n'), "{bad:?}: {e}");
        }
    }
}
