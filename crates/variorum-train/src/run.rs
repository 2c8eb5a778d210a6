//! A trained run as a library object: load a run directory, generate, score.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use variorum_train::generate::SampleConfig;
//! let device = burn::prelude::Device::flex();
//! let run = variorum_train::run::Run::load("runs/gpt-baby-shakespeare-char".as_ref(), &device)?;
//! let prompt = run.encode_prompt("ROMEO:")?;
//! let cfg = SampleConfig { max_new_tokens: 100, temperature: 0.8, top_k: 0, top_p: 1.0, seed: 1, no_cache: false, tag: None };
//! let text = run.tokenizer.decode(&run.generate(&prompt, &cfg, |_| {}));
//! let scores = run.score(&run.encode_prompt("To be, or not to be")?)?;
//! println!("{text}\n{} nats", -scores.total_logprob);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use serde::Serialize;
use variorum_data::Tokenizer;
use variorum_model::DecoderLm;

use crate::checkpoint;
use crate::config::ExperimentConfig;
use crate::generate::{SampleConfig, generate};

/// A run directory loaded for inference.
pub struct Run {
    /// The run directory.
    pub dir: PathBuf,
    /// Its config (`config.toml`), with any settings of [`Run::load_with`] applied.
    pub config: ExperimentConfig,
    /// Its tokenizer (`tokenizer.json`).
    pub tokenizer: Tokenizer,
    /// In inference mode (no autodiff, dropout off).
    pub model: DecoderLm,
    /// Where the weights came from (`model.bpk` or a checkpoint's).
    pub weights: PathBuf,
    /// The device the model is on.
    pub device: Device,
    /// The example tags the run was trained with (`tags.json`, index = tag id, 0 = untagged);
    /// empty for untagged data.
    pub tags: Vec<String>,
}

/// The file of a run directory naming its example tags (a JSON array, index = tag id).
pub const TAGS_FILE: &str = "tags.json";

/// Log-probability of one token given everything before it (within the model's context).
#[derive(Debug, Clone, Serialize)]
pub struct TokenScore {
    /// Index of the token in the scored sequence.
    pub position: usize,
    /// The token's id.
    pub token: u32,
    /// The token's text (`</s>` for an encoder–decoder's end token).
    pub text: String,
    /// Natural log.
    pub logprob: f64,
}

/// The log-probability of every token of a sequence ([`Run::score`]).
#[derive(Debug, Clone, Serialize)]
pub struct Scores {
    /// Every token but the first (which has nothing to be predicted from).
    pub tokens: Vec<TokenScore>,
    /// Sum of the log-probabilities, in nats.
    pub total_logprob: f64,
    /// `char`, `byte` or `token`.
    pub unit: &'static str,
}

impl Run {
    /// Loads `dir`: its expanded config, its tokenizer, and the final weights (`model.bpk`) or,
    /// for an unfinished run, the latest checkpoint's.
    pub fn load(dir: &Path, device: &Device) -> Result<Run> {
        Self::load_with(dir, device, &[])
    }

    /// [`load`](Self::load) with `settings` (`key=value`, see
    /// [`ExperimentConfig::with_settings`]) applied to the run's config first; the weights must
    /// still fit it.
    pub fn load_with(dir: &Path, device: &Device, settings: &[String]) -> Result<Run> {
        if !dir.is_dir() {
            bail!("run directory {} does not exist", dir.display());
        }
        let config_path = dir.join("config.toml");
        if !config_path.is_file() {
            bail!("{} is not a run directory (it has no config.toml)", dir.display());
        }
        let config = ExperimentConfig::load(&config_path)?.with_settings(settings)?;
        if config.model.kind == variorum_model::ModelKind::DecisionTransformer {
            bail!(
                "{} is a Decision Transformer's run: it acts rather than reads text (variorum rollout {})",
                dir.display(),
                dir.display()
            );
        }
        let tokenizer = Tokenizer::load(&dir.join("tokenizer.json"))?;
        let mut model_cfg = config.model.clone();
        model_cfg.resolve(tokenizer.vocab_size())?;
        // a LoRA run's weights files hold its adapters alone, for the base lora-base.json names
        let load = |file: &Path, what: &str| -> Result<DecoderLm> {
            match &config.train.lora {
                Some(lora) => {
                    let base = crate::lora::load_base(dir, model_cfg.init(device))?;
                    crate::lora::load_adapters(crate::lora::attach(base, &model_cfg, lora)?, file, what)
                }
                None => crate::weights::load_weights(model_cfg.init(device), file, what),
            }
        };
        let (model, weights) = if dir.join("model.bpk").is_file() {
            let weights = dir.join("model.bpk");
            (load(&weights, "weights")?, weights)
        } else {
            // an unfinished run: the newest checkpoint whose weights load (by step; the `latest`
            // pointer is not needed)
            let checkpoints = checkpoint::all(dir)?;
            if checkpoints.is_empty() {
                bail!("{} has no weights yet (no model.bpk and no checkpoint)", dir.display());
            }
            let (ckpt, model, skipped) =
                checkpoint::newest_that_loads(&checkpoints, |ckpt, _| load(&ckpt.join("model.bpk"), "checkpoint"))
                    .map_err(|e| anyhow::anyhow!("{}: {e:#}", dir.display()))?;
            let weights = ckpt.join("model.bpk");
            if !skipped.is_empty() {
                eprintln!("note: using {}; newer ones do not load: {}", weights.display(), skipped.join("; "));
            }
            (model, weights)
        };
        let tags = read_tags(dir)?;
        if let Some(capacity) = config.model.attention.tags()
            && tags.len() > capacity
        {
            bail!(
                "{} names {} tags, more than model.attention.tasks = {capacity} in {}: the files do not belong together",
                dir.join(TAGS_FILE).display(),
                tags.len(),
                config_path.display()
            );
        }
        Ok(Run { dir: dir.to_path_buf(), config, tokenizer, model, weights, device: device.clone(), tags })
    }

    /// The id of the example tag `name` (`--tag`), refused by name when the run has no such tag.
    pub fn tag_id(&self, name: &str) -> Result<u32> {
        if self.tags.is_empty() {
            bail!("{} was trained on untagged data (no {TAGS_FILE}): --tag {name:?} names nothing", self.dir.display());
        }
        match self.tags.iter().position(|t| t == name) {
            Some(i) => Ok(i as u32),
            None => {
                let some: Vec<&str> = self.tags.iter().skip(1).take(6).map(String::as_str).collect();
                bail!(
                    "{} has no tag {name:?}: it has {} tags, e.g. {:?} (all in {})",
                    self.dir.display(),
                    self.tags.len(),
                    some,
                    self.dir.join(TAGS_FILE).display()
                )
            }
        }
    }

    /// Token ids of a prompt, with the special tokens its tokenizer adds (an imported LLaMA's
    /// BOS); an empty prompt is refused where that leaves no token.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let ids = self.tokenizer.encode_prompt(text).context("the prompt cannot be encoded")?;
        if ids.is_empty() {
            bail!("the prompt is empty and the model has no beginning-of-sequence token: give at least one character");
        }
        Ok(ids)
    }

    /// The token ids of the run's validation split.
    pub fn validation_tokens(&self) -> Result<Vec<u32>> {
        Ok(self.validation_split()?.0)
    }

    /// The token ids of the run's validation split and, for tagged data, where its tags change.
    /// The tags found must be those the run was trained with (`tags.json`), or the ids would
    /// name other sections.
    pub fn validation_split(&self) -> Result<(Vec<u32>, Option<variorum_data::SplitTags>)> {
        let corpus = variorum_data::Corpus::load(&self.config.data, Some(self.tokenizer.clone()))?;
        let found = corpus.tags.as_ref().map_or(&[][..], |t| t.names.as_slice());
        if found != self.tags.as_slice() {
            bail!(
                "the data now gives {} tags where {} lists {}: the corpus or data.tags changed since training",
                found.len(),
                self.dir.join(TAGS_FILE).display(),
                self.tags.len()
            );
        }
        Ok((corpus.val, corpus.tags.map(|t| t.val)))
    }

    /// Checks that windows of `len` tokens can be encoded (a learned table, axial too, is bounded).
    pub fn check_len(&self, len: usize) -> Result<()> {
        let m = &self.config.model;
        match m.position.max_len(m.seq_len) {
            Some(max) if len > max => bail!(
                "a context of {len} tokens exceeds the {max} positions a learned table encodes (model.position.kind = \"{}\"): use at most {max}",
                m.position.kind()
            ),
            _ => {}
        }
        // a fixed-length attention (Linformer's projections) has no columns past its length
        m.attention.validate_len(len).map_err(|e| anyhow::anyhow!("a context of {len} tokens: {e}"))?;
        // and the entries of fixed-length parameters past the trained context were never trained
        // (Linformer's columns past seq_len; the Synthesizer's tables are seq_len long)
        if !m.attention.capabilities().variable_length && len > m.seq_len {
            bail!(
                "a context of {len} tokens exceeds model.seq_len = {}, the length model.attention.kind = \"{}\" trained its fixed-length parameters for: use at most {}",
                m.seq_len,
                m.attention.kind(),
                m.seq_len
            );
        }
        Ok(())
    }

    /// Continues `prompt`, calling `on_token` with every new token as it is produced.
    pub fn generate(&self, prompt: &[u32], cfg: &SampleConfig, on_token: impl FnMut(u32)) -> Vec<u32> {
        generate(&self.model, prompt, cfg, &self.device, on_token)
    }

    /// Log-probability of every token after the first. The text is cut into windows of
    /// `seq_len + 1` tokens overlapping by one (stride `seq_len`), so each token is predicted
    /// exactly once, from the tokens before it in its window — the windows `eval_batches` uses.
    pub fn score(&self, ids: &[u32]) -> Result<Scores> {
        self.score_tagged(ids, None)
    }

    /// An encoder–decoder's log-probability of every token of `target`, and of the end token
    /// after it, given `source`: one forward over the target after the start token.
    pub fn score_from(&self, source: &[u32], target: &[u32]) -> Result<Scores> {
        let Some(end) = self.model.end_token else {
            bail!("{} is not an encoder–decoder: score a text without --source", self.dir.display());
        };
        let l = self.model.seq_len;
        if source.is_empty() {
            bail!("the source is empty: an encoder–decoder reads 1 to model.seq_len = {l} tokens");
        }
        if source.len() > l || target.len() + 1 > l {
            bail!(
                "the source ({} tokens) and the target with its end token ({}) must each fit model.seq_len = {l}",
                source.len(),
                target.len() + 1
            );
        }
        let start = self.model.start_token.unwrap_or(end);
        let inputs: Vec<i64> = std::iter::once(start as i64).chain(target.iter().map(|&t| t as i64)).collect();
        let n = inputs.len();
        let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [1, n]), &self.device);
        let wanted: Vec<u32> = target.iter().copied().chain(std::iter::once(end as u32)).collect();
        let t = Tensor::<3, Int>::from_data(
            TensorData::new(wanted.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, n, 1]),
            &self.device,
        );
        let source = variorum_model::Source::from_rows(&[source.to_vec()], &self.device);
        let logp = log_softmax(self.model.forward_tagged(x, source, None).logits, 2).gather(2, t);
        let values = logp.into_data().try_to_vec::<f32>().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let tokens = values
            .into_iter()
            .zip(&wanted)
            .enumerate()
            .map(|(i, (lp, &token))| TokenScore {
                position: i,
                token,
                text: if token == end as u32 { "</s>".into() } else { self.tokenizer.decode(&[token]) },
                logprob: lp as f64,
            })
            .collect::<Vec<_>>();
        let total_logprob = tokens.iter().map(|t| t.logprob).sum();
        Ok(Scores { tokens, total_logprob, unit: self.tokenizer.unit() })
    }

    /// [`score`](Self::score) under the example tag `tag` ([`tag_id`](Self::tag_id); `None`:
    /// untagged).
    pub fn score_tagged(&self, ids: &[u32], tag: Option<u32>) -> Result<Scores> {
        if self.model.encoder.is_some() {
            bail!("{} is an encoder–decoder: it scores a target given its source; pass --source", self.dir.display());
        }
        if ids.len() < 2 {
            bail!("scoring needs at least two tokens (the first has nothing to be predicted from)");
        }
        if self.model.mask_token.is_some() {
            bail!(
                "{} is a masked language model (model.objective.kind = \"masked\"): it has no next-token probabilities to score; use `variorum eval`",
                self.dir.display()
            );
        }
        let l = self.model.seq_len;
        let mut tokens = Vec::with_capacity(ids.len() - 1);
        let mut start = 0;
        while start + 1 < ids.len() {
            let end = (start + l + 1).min(ids.len());
            let inputs: Vec<i64> = ids[start..end - 1].iter().map(|&t| t as i64).collect();
            let n = inputs.len();
            let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [1, n]), &self.device);
            let targets: Vec<i64> = ids[start + 1..end].iter().map(|&t| t as i64).collect();
            let t = Tensor::<3, Int>::from_data(TensorData::new(targets, [1, n, 1]), &self.device);
            let tags = tag.map(|t| Tensor::<1, Int>::from_data(TensorData::new(vec![i64::from(t)], [1]), &self.device));
            let logp = log_softmax(self.model.forward_tagged(x, tags, None).logits, 2).gather(2, t);
            let values = logp.into_data().try_to_vec::<f32>().map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for (i, lp) in values.into_iter().enumerate() {
                let token = ids[start + 1 + i];
                tokens.push(TokenScore {
                    position: start + 1 + i,
                    token,
                    text: self.tokenizer.decode(&[token]),
                    logprob: lp as f64,
                });
            }
            start += l;
        }
        let total_logprob = tokens.iter().map(|t| t.logprob).sum();
        Ok(Scores { tokens, total_logprob, unit: self.tokenizer.unit() })
    }
}

/// The tag names in `dir/tags.json`; none when the file is absent (untagged data).
fn read_tags(dir: &Path) -> Result<Vec<String>> {
    let path = dir.join(TAGS_FILE);
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is not a JSON array of tag names: {e}", path.display()))
}
