//! A Hugging Face `config.json`, read key by key. Every key an architecture reads is marked;
//! what is left at the end must be one that does not change the computation (metadata,
//! generation defaults, ids), or the import is refused naming it: a setting variorum does not
//! understand is never silently dropped.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use serde_json::{Map, Value};

/// Keys of transformers' `PretrainedConfig` and of the hub's files that say nothing about the
/// computation of a forward pass.
const HARMLESS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "use_cache",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "initializer_range",
    "id2label",
    "label2id",
    "problem_type",
    "task_specific_params",
    "tokenizer_class",
    "prefix",
    "finetuning_task",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "diversity_penalty",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "output_scores",
    "return_dict_in_generate",
    "tf_legacy_loss",
    "use_bfloat16",
    "chunk_size_feed_forward",
    "_attn_implementation_autoset",
    // older transformers' names: `use_cache`'s, and a training-memory switch (T5, XLM-R, …)
    "output_past",
    "gradient_checkpointing",
];

/// Rotary positions as a `config.json` sets them.
pub(crate) struct Rope {
    /// The base θ of the frequencies.
    pub(crate) theta: f64,
    /// The part of each head's dimensions rotated (transformers' `partial_rotary_factor`).
    pub(crate) fraction: f64,
}

impl Rope {
    /// The dimensions of a `head_dim`-wide head that rotate, as transformers counts them
    /// (`int(head_dim * partial_rotary_factor)`), refused unless they pair up.
    pub(crate) fn rotary_dim(&self, head_dim: usize, path: &Path) -> Result<usize> {
        let r = (head_dim as f64 * self.fraction) as usize;
        if r == 0 || !r.is_multiple_of(2) || r > head_dim {
            bail!("{}: a rotary part of {r} of each head's {head_dim} dimensions cannot be paired", path.display());
        }
        Ok(r)
    }
}

/// `config.json`, its keys taken as they are read.
pub(crate) struct HfConfig {
    path: PathBuf,
    map: Map<String, Value>,
    read: Vec<String>,
    /// The mask token's id when the tokenizer files are not beside `config.json` yet (an
    /// export, whose tokenizer is written with the weights).
    mask_token: Option<usize>,
}

impl HfConfig {
    /// Reads `dir/config.json`.
    pub(crate) fn load(dir: &Path) -> Result<HfConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                anyhow!("{} not found: {} is not a Hugging Face model directory", path.display(), dir.display())
            }
            _ => anyhow!("{} cannot be read: {e}", path.display()),
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{} is not JSON: {e}", path.display()))?;
        let Value::Object(map) = value else { bail!("{} is not a JSON object", path.display()) };
        Ok(HfConfig { path, map, read: Vec::new(), mask_token: None })
    }

    /// A `config.json` made in memory (by `export`, to read it back as the import would);
    /// `path` is where it is to be written, for messages; `mask_token`, a masked model's.
    pub(crate) fn from_map(path: PathBuf, map: Map<String, Value>, mask_token: Option<usize>) -> HfConfig {
        HfConfig { path, map, read: Vec::new(), mask_token }
    }

    /// The mask token's id given by [`from_map`](Self::from_map), if any.
    pub(crate) fn mask_token(&self) -> Option<usize> {
        self.mask_token
    }

    /// The file, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn get(&mut self, key: &str) -> Option<&Value> {
        self.read.push(key.to_string());
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, want: &str) -> anyhow::Error {
        anyhow!("{}: {key} = {} is not {want}", self.path.display(), self.map[key])
    }

    /// `model_type`.
    pub(crate) fn model_type(&mut self) -> Result<String> {
        match self.get("model_type").cloned() {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.wrong("model_type", "a string")),
            None => bail!("{} has no model_type", self.path.display()),
        }
    }

    /// A positive integer the architecture needs.
    pub(crate) fn usize(&mut self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| anyhow!("{} has no {key}", self.path.display()))
    }

    /// A positive integer, if present (`null` counts as absent).
    pub(crate) fn opt_usize(&mut self, key: &str) -> Result<Option<usize>> {
        match self.get(key).map(Value::as_u64) {
            None => Ok(None),
            Some(Some(n)) if n > 0 => Ok(Some(n as usize)),
            Some(_) => Err(self.wrong(key, "a positive integer")),
        }
    }

    /// A token id or other index (0 allowed), or `default` when absent.
    pub(crate) fn index_or(&mut self, key: &str, default: usize) -> Result<usize> {
        match self.get(key).map(Value::as_u64) {
            None => Ok(default),
            Some(Some(n)) => Ok(n as usize),
            Some(None) => Err(self.wrong(key, "an integer ≥ 0")),
        }
    }

    /// A signed integer where the architecture writes −1 for "unset" (DeBERTa's
    /// `position_buckets`), or `default` when absent.
    pub(crate) fn int_or(&mut self, key: &str, default: i64) -> Result<i64> {
        match self.get(key).map(Value::as_i64) {
            None => Ok(default),
            Some(Some(n)) => Ok(n),
            Some(None) => Err(self.wrong(key, "an integer")),
        }
    }

    /// A list of names, written as an array of strings or as one string joined by `|`
    /// (DeBERTa's `pos_att_type` and `norm_rel_ebd`), trimmed and lowercased as transformers
    /// reads them; `None` when absent.
    pub(crate) fn names(&mut self, key: &str) -> Result<Option<Vec<String>>> {
        let clean = |s: &str| s.trim().to_lowercase();
        match self.get(key).cloned() {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.split('|').map(clean).collect())),
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                Ok(Some(a.iter().filter_map(Value::as_str).map(clean).collect()))
            }
            Some(_) => Err(self.wrong(key, "a name or a list of names")),
        }
    }

    /// A number, or `default` when absent.
    pub(crate) fn f64_or(&mut self, key: &str, default: f64) -> Result<f64> {
        match self.get(key).map(Value::as_f64) {
            None => Ok(default),
            Some(Some(x)) => Ok(x),
            Some(None) => Err(self.wrong(key, "a number")),
        }
    }

    /// A boolean, or `default` when absent.
    pub(crate) fn bool_or(&mut self, key: &str, default: bool) -> Result<bool> {
        Ok(self.opt_bool(key)?.unwrap_or(default))
    }

    /// A boolean, if present.
    pub(crate) fn opt_bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.get(key).map(Value::as_bool) {
            None => Ok(None),
            Some(Some(b)) => Ok(Some(b)),
            Some(None) => Err(self.wrong(key, "true or false")),
        }
    }

    /// A string, or `default` when absent.
    pub(crate) fn str_or(&mut self, key: &str, default: &str) -> Result<String> {
        match self.get(key).map(|v| v.as_str().map(str::to_owned)) {
            None => Ok(default.to_string()),
            Some(Some(s)) => Ok(s),
            Some(None) => Err(self.wrong(key, "a string")),
        }
    }

    /// The feed-forward kind of the activation named by `key` (`default` when absent): the
    /// two-layer FFN's activations variorum has, under transformers' names.
    pub(crate) fn activation(&mut self, key: &str, default: &str) -> Result<&'static str> {
        match self.str_or(key, default)?.as_str() {
            "gelu_new" | "gelu_fast" | "gelu_pytorch_tanh" => Ok("gelu-tanh"),
            "gelu" => Ok("gelu"),
            "relu" => Ok("relu"),
            other => bail!("{}: {key} = {other:?} is not supported (gelu, gelu_new, relu)", self.path.display()),
        }
    }

    /// An object, if present.
    pub(crate) fn object(&mut self, key: &str) -> Result<Option<Map<String, Value>>> {
        match self.get(key).cloned() {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }

    /// An array, if present.
    pub(crate) fn array(&mut self, key: &str) -> Result<Option<Vec<Value>>> {
        match self.get(key).cloned() {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(self.wrong(key, "an array")),
        }
    }

    /// A setting variorum has only one way of computing: absent, `null`, or `value`; anything
    /// else is refused as `what`.
    pub(crate) fn require(&mut self, key: &str, value: Value, what: &str) -> Result<()> {
        match self.get(key).cloned() {
            None => Ok(()),
            Some(v) if v == value => Ok(()),
            Some(v) => {
                bail!("{}: {key} = {v} is not supported: {what}", self.path.display())
            }
        }
    }

    /// The rotary settings, from the keys earlier transformers write (`theta_keys`, then
    /// `rope_theta`; `rotary_pct`, then `partial_rotary_factor`) or from the one object
    /// transformers 5 writes and then reads (`rope_parameters`: keys beside it are kept in the
    /// file but not used). Any frequency scaling is refused.
    pub(crate) fn rope(&mut self, theta_keys: &[&str], fraction: f64) -> Result<Rope> {
        let mut rope = Rope { theta: 10_000.0, fraction };
        for key in theta_keys.iter().chain(&["rope_theta"]) {
            rope.theta = self.f64_or(key, rope.theta)?;
        }
        rope.fraction = self.f64_or("rotary_pct", rope.fraction)?;
        rope.fraction = self.f64_or("partial_rotary_factor", rope.fraction)?;
        let no_scaling = "variorum's rope has no frequency scaling (linear, dynamic, yarn, llama3)";
        self.require("rope_scaling", Value::Null, no_scaling)?;
        let path = self.path.display().to_string();
        for (key, value) in self.object("rope_parameters")?.unwrap_or_default() {
            let number =
                || value.as_f64().ok_or_else(|| anyhow!("{path}: rope_parameters.{key} = {value} is not a number"));
            match key.as_str() {
                "rope_theta" => rope.theta = number()?,
                "partial_rotary_factor" => rope.fraction = number()?,
                "rope_type" if value.as_str() == Some("default") => {}
                _ => bail!("{path}: rope_parameters.{key} = {value} is not supported: {no_scaling}"),
            }
        }
        Ok(rope)
    }

    /// Marks keys the architecture knows and that need no mapping (e.g. GPT-2's
    /// `summary_*`, which only its classification heads read).
    pub(crate) fn ignore(&mut self, keys: &[&str]) {
        self.read.extend(keys.iter().map(|k| k.to_string()));
    }

    /// Refuses the first key no one read that is not harmless.
    pub(crate) fn finish(self, architecture: &str) -> Result<()> {
        let unread: Vec<&String> =
            self.map.keys().filter(|k| !self.read.iter().any(|r| r == *k) && !HARMLESS.contains(&k.as_str())).collect();
        if let Some(key) = unread.first() {
            bail!(
                "{}: {key} = {} is a setting variorum's {architecture} mapping does not know; it may change the \
                 computation, so the import stops here{}",
                self.path.display(),
                self.map[key.as_str()],
                if unread.len() > 1 { format!(" ({} such keys)", unread.len()) } else { String::new() }
            );
        }
        Ok(())
    }
}
