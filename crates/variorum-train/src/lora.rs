//! Low-rank adaptation (Hu et al. 2021, LoRA), `[train.lora]`:
//!
//! W' = W + (α/r)·A·B,  A: `[d_in, r]`, B: `[r, d_out]`,
//!
//! W frozen, A drawn at random and B zero, so that the adapted model starts as the base model
//! and only A and B train. (Burn stores a linear layer's weight as `[d_in, d_out]`, x·W; PEFT's
//! `lora_A.weight` is our Aᵀ and `lora_B.weight` our Bᵀ.)
//!
//! The update is a [`LowRankUpdate`] (variorum-kernels) attached to the weight parameter. The
//! shared projections compute its product beside the frozen one, x·W + (α/r)·(drop(x)·A)·B, so
//! no weight-sized gradient is formed; code that reads a weight whole (`Param::val`) reads W',
//! so every attention and feed-forward kind with such projections is adapted without a line of
//! its own. One rank-r pair adapts each targeted block of a fused projection's output columns:
//! targeting `q` and `v` adapts the query and value columns apart, as PEFT's `q_proj`/`v_proj`.
//!
//! Every other parameter is frozen (`require_grad = false`): no gradient reaches it, and the
//! optimizer keeps state for the adapters alone.
//!
//! Choices where the paper is silent: A ~ U(−1/√d_in, 1/√d_in), PEFT's default (Kaiming-uniform
//! with a = √5, as `torch.nn.Linear`). Dropout acts on the adapter's input where the product is
//! computed beside the frozen one; a kind that reads a weight whole (Longformer's global
//! attention) takes the update on the weight, undropped.

use std::collections::BTreeSet;

use burn::module::{LoraAdapter, Param, Reparameterization, Reparameterizer};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};
use variorum_kernels::lora::{ColumnBlock, LowRankUpdate};
use variorum_model::{DecoderLm, ModelConfig};

/// `train.lora`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// r, the rank of each update. Default 8.
    pub rank: usize,
    /// α: the update is scaled by α/r. Default 16.
    pub alpha: f64,
    /// The probability of dropping each element of an adapter's input while training (LoRA's
    /// dropout, PEFT's `lora_dropout`). Default 0.
    pub dropout: f64,
    /// The projections adapted, by name (see [`LoraTarget`]). Default `["q", "v"]` (PEFT's for
    /// LLaMA-style models).
    pub targets: Vec<LoraTarget>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self { rank: 8, alpha: 16.0, dropout: 0.0, targets: vec![LoraTarget::Q, LoraTarget::V] }
    }
}

/// A projection LoRA can adapt. Attention's apply to self- and cross-attention alike (PEFT
/// matches T5's `q` in both by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoraTarget {
    /// The query columns of attention's fused q | k | v projection.
    Q,
    /// Its key columns.
    K,
    /// Its value columns.
    V,
    /// Attention's output projection.
    Out,
    /// The feed-forward layer's first projection (a gated kind's value half).
    Up,
    /// A gated feed-forward layer's gate half (GLU, GEGLU, SwiGLU).
    Gate,
    /// The feed-forward layer's second projection.
    Down,
}

impl LoraTarget {
    /// The name in configs (`q`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q => "q",
            Self::K => "k",
            Self::V => "v",
            Self::Out => "out",
            Self::Up => "up",
            Self::Gate => "gate",
            Self::Down => "down",
        }
    }
}

impl LoraConfig {
    /// Checks the settings; messages name the key (`train.lora.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.rank > 0, || "train.lora.rank = 0: the update needs a rank of at least 1".into())?;
        check(self.alpha.is_finite() && self.alpha > 0.0, || {
            format!("train.lora.alpha = {} must be a positive number", self.alpha)
        })?;
        check((0.0..1.0).contains(&self.dropout), || {
            format!("train.lora.dropout = {} must be at least 0 and below 1", self.dropout)
        })?;
        check(!self.targets.is_empty(), || {
            "train.lora.targets is empty: name the projections to adapt (q, k, v, out, up, gate, down)".into()
        })
    }
}

/// Attaches a [`LowRankUpdate`] to each targeted projection and freezes everything else.
struct Attach<'a> {
    lora: &'a LoraConfig,
    model: &'a ModelConfig,
    found: &'a mut Found,
}

/// What [`Attach`] met: the targets it adapted somewhere, and the first reason to refuse.
#[derive(Default)]
struct Found {
    matched: BTreeSet<LoraTarget>,
    refusals: Vec<String>,
}

/// The column blocks of the weight at `path` (`[d_in, width]`) of a model of `m`, if it is a
/// projection LoRA can adapt: attention's fused q | k | v (widths from the layer's head shape)
/// or output, a feed-forward layer's up (gate | value when gated) or down.
pub(crate) fn blocks_of(m: &ModelConfig, path: &[&str], width: usize) -> Option<Vec<(usize, LoraTarget)>> {
    let ends = |tail: &[&str]| path.ends_with(tail);
    let has = |s: &str| path.contains(&s);
    if has("attn") && ends(&["qkv", "qkv", "weight"]) {
        let layer = path.iter().position(|&s| s == "blocks").and_then(|b| path.get(b + 1)?.parse().ok())?;
        let attention = if path.first() == Some(&"encoder") {
            m.encoder_attention().for_layer(layer)
        } else if has("cross") {
            m.cross_attention()
        } else {
            m.attention.for_layer(layer)
        };
        let heads = attention.heads(m.d_model);
        let q = heads.n_heads * heads.head_dim;
        if q >= width || (width - q) % 2 != 0 {
            return None;
        }
        let kv = (width - q) / 2;
        return Some(vec![(q, LoraTarget::Q), (kv, LoraTarget::K), (kv, LoraTarget::V)]);
    }
    if has("attn") && ends(&["out", "weight"]) {
        return Some(vec![(width, LoraTarget::Out)]);
    }
    if has("ffn") && ends(&["up", "weight"]) {
        return Some(match m.feed_forward.kind.gated() {
            true => vec![(width / 2, LoraTarget::Gate), (width / 2, LoraTarget::Up)],
            false => vec![(width, LoraTarget::Up)],
        });
    }
    if has("ffn") && ends(&["down", "weight"]) {
        return Some(vec![(width, LoraTarget::Down)]);
    }
    None
}

impl Reparameterizer for Attach<'_> {
    type Reparam = LowRankUpdate;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LowRankUpdate>) {
        let param = param.set_require_grad(false);
        if D != 2 {
            return (param, None);
        }
        let dims = param.val().dims();
        let (d_in, width) = (dims[0], dims[1]);
        let segments: Vec<&str> = path.split('.').collect();
        let Some(blocks) = blocks_of(self.model, &segments, width) else { return (param, None) };
        let r = self.lora.rank;
        let device = param.val().device();
        let mut parts = Vec::new();
        let mut columns = Vec::new();
        for (w, target) in blocks {
            let part = self.lora.targets.contains(&target).then(|| {
                self.found.matched.insert(target);
                if r > d_in.min(w) {
                    self.found.refusals.push(format!(
                        "train.lora.rank = {r} exceeds {path}'s {} projection, {d_in} × {w}: a rank of at most {} adapts it",
                        target.name(),
                        d_in.min(w)
                    ));
                }
                let bound = 1.0 / (d_in as f64).sqrt();
                parts.push(LoraAdapter {
                    a: Param::from_tensor(Tensor::random([d_in, r], burn::tensor::Distribution::Uniform(-bound, bound), &device)),
                    b: Param::from_tensor(Tensor::zeros([r, w], &device)),
                    scale: self.lora.alpha / r as f64,
                });
                parts.len() - 1
            });
            columns.push(ColumnBlock { width: w, part });
        }
        if parts.is_empty() {
            return (param, None);
        }
        (param, Some(LowRankUpdate { parts, blocks: columns, dropout: self.lora.dropout }))
    }
}

/// `model` (of `model_cfg`) with `lora`'s adapters attached and every other parameter frozen;
/// the adapters' ids are their paths' ([`variorum_model::path_ids`]), their A drawn from the
/// device's generator. Refuses a target no projection of the model has, or a rank above a
/// targeted projection's width, by name.
pub fn attach(model: DecoderLm, model_cfg: &ModelConfig, lora: &LoraConfig) -> anyhow::Result<DecoderLm> {
    lora.validate()?;
    let mut found = Found::default();
    let model = model.apply_reparameterization(Attach { lora, model: model_cfg, found: &mut found });
    if let Some(first) = found.refusals.first() {
        anyhow::bail!("{first}");
    }
    if let Some(missing) = lora.targets.iter().find(|t| !found.matched.contains(t)) {
        let what = match missing {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::Out => {
                format!("model.attention.kind = \"{}\" has no such projection", model_cfg.attention.kind())
            }
            _ => format!("model.feed_forward.kind = \"{}\" has no such projection", model_cfg.feed_forward.kind.name()),
        };
        anyhow::bail!(
            "train.lora.targets names \"{}\", which no layer of this model has ({what}): adapt q, k, v, out, up, gate or down where the model has them",
            missing.name()
        );
    }
    Ok(variorum_model::path_ids(model))
}

/// The number of parameters the adapters hold (those under a `lora` update).
pub fn adapter_params(model: &DecoderLm) -> usize {
    #[derive(Default)]
    struct Count {
        path: Vec<String>,
        n: usize,
    }
    impl burn::module::ModuleVisitor for Count {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_owned());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.path.iter().any(|m| m == LowRankUpdate::NAME) {
                self.n += param.shape().num_elements();
            }
        }
    }
    let mut c = Count::default();
    model.visit(&mut c);
    c.n
}

/// Where a module visitor or mapper is, named as tensor files name it: enum variants left out
/// (`attn.qkv`, not `attn.Full.qkv`).
#[derive(Default)]
pub(crate) struct TensorPath(Vec<String>);

impl TensorPath {
    /// Entering module `name` (of type `container`).
    pub(crate) fn enter(&mut self, name: &str, container: &str) {
        if !container.starts_with("Enum:") {
            self.0.push(name.to_owned());
        }
    }

    /// Leaving a module of type `container`.
    pub(crate) fn exit(&mut self, container: &str) {
        if !container.starts_with("Enum:") {
            self.0.pop();
        }
    }

    /// The path, dotted.
    pub(crate) fn joined(&self) -> String {
        self.0.join(".")
    }

    /// Whether it is inside a weight's LoRA update.
    fn in_update(&self) -> bool {
        self.0.iter().any(|m| m == LowRankUpdate::NAME)
    }

    /// At an adapter factor, `<weight>.lora.parts.<i>.<a|b>`: the weight's path, `i`, and `a` or `b`.
    pub(crate) fn factor(&self) -> Option<(String, usize, &str)> {
        let at = self.0.iter().position(|m| m == LowRankUpdate::NAME)?;
        let part = self.0.get(at + 2)?.parse().ok()?;
        Some((self.0[..at].join("."), part, self.0.last()?.as_str()))
    }
}

/// One adapted weight of a model, with its factors' values: what adapter files in other
/// formats are written from.
pub(crate) struct Adapted {
    /// The weight's tensor path (`blocks.0.attn.qkv.qkv.weight`).
    pub path: String,
    /// Its input width.
    pub d_in: usize,
    /// Its output columns, block by block: the width, the projection, and the block's factors
    /// if it is adapted — A `[d_in, r]` and B `[r, width]`, row-major.
    pub blocks: Vec<(usize, LoraTarget, Option<(Vec<f32>, Vec<f32>)>)>,
}

/// The adapted weights of `model` (of `model_cfg`, adapted by `lora`), in the model's order.
pub(crate) fn adapters(model: &DecoderLm, model_cfg: &ModelConfig, lora: &LoraConfig) -> anyhow::Result<Vec<Adapted>> {
    /// Weight shapes, and the factors under each weight's update, by path.
    #[derive(Default)]
    struct Collect {
        path: TensorPath,
        weights: Vec<(String, [usize; 2])>,
        factors: std::collections::HashMap<(String, usize, String), Vec<f32>>,
    }
    impl burn::module::ModuleVisitor for Collect {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _: &str, container: &str) {
            self.path.exit(container);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = || param.val().into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default();
            if let Some((weight, i, factor)) = self.path.factor() {
                self.factors.insert((weight, i, factor.to_owned()), values());
            } else if D == 2 && !self.path.in_update() {
                let dims = param.shape().to_vec();
                self.weights.push((self.path.joined(), [dims[0], dims[1]]));
            }
        }
    }
    let mut c = Collect::default();
    model.visit(&mut c);
    let mut found = Vec::new();
    for (path, [d_in, width]) in c.weights {
        let segments: Vec<&str> = path.split('.').collect();
        let Some(columns) = blocks_of(model_cfg, &segments, width) else { continue };
        let mut part = 0;
        let mut adapted = Vec::new();
        for (w, target) in columns {
            let factors = match lora.targets.contains(&target) {
                true => {
                    let mut take = |f: &str| c.factors.remove(&(path.clone(), part, f.to_owned()));
                    let (a, b) = (take("a"), take("b"));
                    part += 1;
                    match (a, b) {
                        (Some(a), Some(b)) => Some((a, b)),
                        _ => anyhow::bail!("{path} has no adapter for its {} columns (a bug)", target.name()),
                    }
                }
                false => None,
            };
            adapted.push((w, target, factors));
        }
        if part > 0 {
            found.push(Adapted { path, d_in, blocks: adapted });
        }
    }
    Ok(found)
}

/// Tensor paths of the adapters (`….weight.lora.parts.<i>.a`/`.b`), the only ones a LoRA run's
/// weights files hold.
const ADAPTERS: &str = r"(^|\.)lora\.";

/// The file in a LoRA run's directory that names its base weights and their sha256.
pub const BASE_FILE: &str = "lora-base.json";

/// What a LoRA run was trained on: the weights file `--init-from` read, and its sha256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Base {
    /// The base's weights file (absolute).
    pub weights: std::path::PathBuf,
    /// Its sha256, hex.
    pub sha256: String,
}

/// sha256 of a file, hex, read in 1 MiB pieces.
pub fn sha256_file(path: &std::path::Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `run`'s [`BASE_FILE`] for the base weights file `weights`.
pub fn record_base(run: &std::path::Path, weights: &std::path::Path) -> anyhow::Result<Base> {
    let weights = std::fs::canonicalize(weights).unwrap_or_else(|_| weights.to_path_buf());
    let base = Base { sha256: sha256_file(&weights)?, weights };
    crate::checkpoint::write_atomic(&run.join(BASE_FILE), serde_json::to_string_pretty(&base)?.as_bytes())?;
    Ok(base)
}

/// `model` (fresh, without adapters) with the base weights `run`'s [`BASE_FILE`] names, after
/// checking they are the ones the adapters were trained on.
pub fn load_base(run: &std::path::Path, model: DecoderLm) -> anyhow::Result<DecoderLm> {
    let path = run.join(BASE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow::anyhow!("{}: a LoRA run keeps its adapters apart from the base they adapt, and this file naming the base cannot be read: {e}", path.display())
    })?;
    let base: Base = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a LoRA base record: {e}", path.display()))?;
    if !base.weights.is_file() {
        anyhow::bail!(
            "the base weights of this LoRA run, {}, are gone ({} names them): restore the file, or export the run merged before moving its base",
            base.weights.display(),
            path.display()
        );
    }
    let sha256 = sha256_file(&base.weights)?;
    if sha256 != base.sha256 {
        anyhow::bail!(
            "the base weights {} have changed since this LoRA run was trained on them (sha256 {}…, recorded {}…): the adapters belong to the old file",
            base.weights.display(),
            &sha256[..12],
            &base.sha256[..12.min(base.sha256.len())]
        );
    }
    let mut model = model;
    let report = crate::transfer::init_from(&mut model, &base.weights)?;
    check_whole(&report)?;
    Ok(model)
}

/// Refuses a base that leaves any of the model's tensors at their initialisation: the adapters
/// would then adapt weights no file holds.
pub fn check_whole(report: &crate::transfer::InitReport) -> anyhow::Result<()> {
    let left = report.new.iter().chain(&report.skipped_shape).collect::<Vec<_>>();
    if let Some(first) = left.first() {
        anyhow::bail!(
            "train.lora adapts the weights --init-from gives the model, and {} lacks {} of its tensors (first: {first}): start from a run of the same config, or fine-tune without LoRA",
            report.source.display(),
            left.len()
        );
    }
    Ok(())
}

/// Writes the adapters of `model` alone to `path` (a `.bpk` file).
pub fn save_adapters(model: &DecoderLm, path: &std::path::Path) -> anyhow::Result<()> {
    use burn::store::{BurnpackStore, ModuleSnapshot};
    let mut store = BurnpackStore::from_file(path).with_regex(ADAPTERS).overwrite(true);
    model.save_into(&mut store).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// `model` (the base with adapters attached) with the adapters of `path`; a file that lacks
/// one, or holds one of another shape, is refused in one line.
pub fn load_adapters(model: DecoderLm, path: &std::path::Path, what: &str) -> anyhow::Result<DecoderLm> {
    use burn::store::{BurnpackStore, ModuleSnapshot};
    let mut model = model;
    let mut store = BurnpackStore::from_file(path).with_regex(ADAPTERS).allow_partial(true);
    let result = model.load_from(&mut store).map_err(|e| {
        let e: String = e.to_string().replace('\n', " ").chars().take(300).collect();
        anyhow::anyhow!("{what} {} cannot be loaded: {e}", path.display())
    })?;
    if let Some(e) = result.errors.first() {
        anyhow::bail!("{what} {} does not fit the run's adapters: {e}", path.display());
    }
    // the base's tensors are the filter's to skip; Burn counts them missing as well
    let missing: Vec<&String> = result.missing.iter().map(|(p, _)| p).filter(|p| p.contains(".lora.")).collect();
    if let Some(first) = missing.first() {
        anyhow::bail!(
            "{what} {} lacks {} of the run's adapter tensors (first: {first}): written for another train.lora",
            path.display(),
            missing.len()
        );
    }
    Ok(model)
}

/// `run` as `export` writes it whole: with `merge`, a LoRA run's adapters merged into its base
/// (W + (α/r)·A·B, Burn's `materialize`), a model like any other. Without `merge` a LoRA run is
/// refused (only the Hugging Face format writes its adapters alone, as PEFT's files), and
/// `merge` on a run without adapters is refused too.
pub fn for_export(mut run: crate::run::Run, merge: bool) -> anyhow::Result<crate::run::Run> {
    match (run.config.train.lora.is_some(), merge) {
        (true, true) => {
            run.model = run.model.materialize();
            Ok(run)
        }
        (false, false) => Ok(run),
        (true, false) => anyhow::bail!(
            "{} is a LoRA run: --merge writes its base with the adapters merged in (W + (α/r)·A·B), and --format hf without --merge writes its adapters alone, in PEFT's files",
            run.dir.display()
        ),
        (false, true) => anyhow::bail!(
            "--merge merges a LoRA run's adapters into its base, and {} has none (its config has no [train.lora])",
            run.dir.display()
        ),
    }
}
