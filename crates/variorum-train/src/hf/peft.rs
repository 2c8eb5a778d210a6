//! A LoRA run's adapters in Hugging Face PEFT's files: `adapter_config.json` and
//! `adapter_model.safetensors`, which `peft.PeftModel.from_pretrained` loads onto the base model
//! (the run's base, exported by `variorum export --format hf`).
//!
//! PEFT adapts a module of the transformers model, `y = x·Wᵀ + (α/r)·lora_B(lora_A(drop(x)))`
//! with `lora_A.weight` `[r, d_in]` and `lora_B.weight` `[d_out, r]`: our Aᵀ and Bᵀ. Which
//! module holds which of our columns is read off the mapping `export` writes the base with
//! ([`Recipe`]): LLaMA's q | k | v are three modules, each with its own pair as here. Where one
//! module holds several of our adapted blocks (GPT-2's `c_attn` is q | k | v), its pair is
//! theirs side by side — A's rows stacked, B block-diagonal — of rank r times the number of
//! blocks, and `rank_pattern`/`alpha_pattern` give that module rank and α in the same ratio, so
//! the scale α/r is unchanged: exactly the same update.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use super::Mapping;
use super::export::{RotaryPairs, rotate_half_order};
use super::recipe::Recipe;
use crate::lora::{Adapted, LoraConfig};
use crate::run::Run;

/// The prefix PEFT gives the base model's module names in its files.
const PREFIX: &str = "base_model.model.";

/// A stored tensor a weight of ours is made from, column by column: its name, whether it is
/// stored `[d_out, d_in]` (`nn.Linear`; GPT-2's `Conv1D` stores `[d_in, d_out]`), and for each of
/// its output columns the one of ours it holds.
struct Leaf {
    name: String,
    transposed: bool,
    columns: Vec<usize>,
}

/// The stored tensors `recipe` makes a weight `width` columns wide from.
fn leaves(recipe: &Recipe, width: usize, path: &str) -> Result<Vec<Leaf>> {
    Ok(match recipe {
        Recipe::Copy(name) => vec![Leaf { name: name.clone(), transposed: false, columns: (0..width).collect() }],
        Recipe::Transpose(name) => vec![Leaf { name: name.clone(), transposed: true, columns: (0..width).collect() }],
        Recipe::Join(parts) => {
            let mut out = Vec::new();
            let mut offset = 0;
            for (part, w) in parts {
                for mut leaf in leaves(part, *w, path)? {
                    leaf.columns.iter_mut().for_each(|c| *c += offset);
                    out.push(leaf);
                }
                offset += w;
            }
            out
        }
        // column i of ours is column order[i] of the stored one
        Recipe::Permute(inner, order) => {
            let mut ours = vec![0; order.len()];
            for (i, &stored) in order.iter().enumerate() {
                ours[stored] = i;
            }
            let mut inner = leaves(inner, width, path)?;
            for leaf in &mut inner {
                leaf.columns.iter_mut().for_each(|c| *c = ours[*c]);
            }
            inner
        }
        other => bail!("{path} is written as {other:?}, which PEFT's adapters of whole modules cannot express"),
    })
}

/// Writes `run`'s adapters (the run's `[train.lora]`) into `dir` in PEFT's files, for its base
/// written by `mapping` (with `rotary` features reordered); returns the tensors and parameters
/// written.
pub(super) fn write(dir: &Path, run: &Run, mapping: &Mapping, rotary: Option<&RotaryPairs>) -> Result<(usize, usize)> {
    let lora = run.config.train.lora.as_ref().ok_or_else(|| anyhow!("{} has no [train.lora]", run.dir.display()))?;
    let recipes: HashMap<&str, &Recipe> = mapping.tensors.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut targets = BTreeSet::new();
    let (mut rank_pattern, mut alpha_pattern) = (BTreeMap::new(), BTreeMap::new());
    let mut layouts = BTreeSet::new();
    for adapted in crate::lora::adapters(&run.model, &run.config.model, lora)? {
        let recipe = recipes.get(adapted.path.as_str()).ok_or_else(|| {
            anyhow!("the {} mapping has no place for {} (a bug of the mapping)", mapping.class, adapted.path)
        })?;
        for module in modules(&adapted, recipe, rotary)? {
            let rank = module.a.len() / adapted.d_in;
            let name = &module.name;
            if rank != lora.rank {
                rank_pattern.insert(name.clone(), rank);
                alpha_pattern.insert(name.clone(), lora.alpha * rank as f64 / lora.rank as f64);
            }
            // PEFT matches a module by the end of its name: the last two parts
            // (`self_attn.q_proj`, `attn.c_proj` apart from `mlp.c_proj`)
            let parts: Vec<&str> = name.rsplitn(3, '.').collect();
            targets.insert(match parts.as_slice() {
                [last, parent, _] | [last, parent] => format!("{parent}.{last}"),
                _ => name.clone(),
            });
            layouts.insert(module.transposed);
            tensors.push((format!("{PREFIX}{name}.lora_A.weight"), vec![rank, adapted.d_in], module.a));
            tensors.push((format!("{PREFIX}{name}.lora_B.weight"), vec![module.width, rank], module.b));
        }
    }
    if tensors.is_empty() {
        bail!("{} has no adapters to write", run.dir.display());
    }
    if layouts.len() > 1 {
        bail!(
            "{} adapts modules stored both ways ([in, out] and [out, in]): PEFT's fan_in_fan_out is one setting",
            run.dir.display()
        );
    }
    let task = match mapping.class {
        c if c.ends_with("ForCausalLM") || c.ends_with("LMHeadModel") => Value::from("CAUSAL_LM"),
        c if c.ends_with("ForConditionalGeneration") => Value::from("SEQ_2_SEQ_LM"),
        _ => Value::Null,
    };
    let config = config_json(lora, &targets, &rank_pattern, &alpha_pattern, layouts.contains(&false), task, run);
    std::fs::write(dir.join("adapter_config.json"), serde_json::to_string_pretty(&config)? + "\n")?;
    let params = tensors.iter().map(|(_, _, v)| v.len()).sum();
    let count = tensors.len();
    super::export::write_safetensors(&dir.join("adapter_model.safetensors"), tensors)?;
    Ok((count, params))
}

/// `adapter_config.json`: PEFT's `LoraConfig`.
fn config_json(
    lora: &LoraConfig,
    targets: &BTreeSet<String>,
    rank_pattern: &BTreeMap<String, usize>,
    alpha_pattern: &BTreeMap<String, f64>,
    fan_in_fan_out: bool,
    task: Value,
    run: &Run,
) -> Value {
    let base = run.dir.join(crate::lora::BASE_FILE);
    let base = std::fs::read_to_string(&base)
        .ok()
        .and_then(|t| serde_json::from_str::<crate::lora::Base>(&t).ok())
        .and_then(|b| b.weights.parent().map(|p| p.display().to_string()));
    json!({
        "peft_type": "LORA",
        "task_type": task,
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "fan_in_fan_out": fan_in_fan_out,
        "bias": "none",
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
    })
}

/// For the weight at `path`, `width` columns wide: export writes a fused q | k | v with its
/// rotary features reordered, so column c of what its recipe is given is column `order[c]` of
/// ours (the identity elsewhere).
fn column_order(path: &str, width: usize, rotary: Option<&RotaryPairs>) -> Result<Vec<usize>> {
    match rotary.filter(|_| path.ends_with(".attn.qkv.qkv.weight")) {
        Some(r) => {
            let index: Vec<f32> = (0..width).map(|c| c as f32).collect();
            Ok(rotate_half_order(&index, r)?.into_iter().map(|c| c as usize).collect())
        }
        None => Ok((0..width).collect()),
    }
}

/// One PEFT module's pair: its name, `lora_A.weight` `[R, d_in]` and `lora_B.weight`
/// `[width, R]` row-major, and how the base stores the module's weight.
struct Module {
    name: String,
    width: usize,
    transposed: bool,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// The PEFT modules `adapted` (made by `recipe`) is written as: one per stored tensor that
/// holds adapted columns, each adapted block wholly inside one.
fn modules(adapted: &Adapted, recipe: &Recipe, rotary: Option<&RotaryPairs>) -> Result<Vec<Module>> {
    let width: usize = adapted.blocks.iter().map(|b| b.0).sum();
    let order = column_order(&adapted.path, width, rotary)?;
    let mut out = Vec::new();
    for leaf in leaves(recipe, width, &adapted.path)? {
        let columns: Vec<usize> = leaf.columns.iter().map(|&c| order[c]).collect();
        let held: BTreeSet<usize> = columns.iter().copied().collect();
        // the adapted blocks in this stored tensor: (first column, width, A, B, rank offset)
        let mut inside = Vec::new();
        let (mut start, mut rank) = (0, 0);
        for (w, target, factors) in &adapted.blocks {
            let range = start..start + w;
            start += w;
            let Some((a, b)) = factors else { continue };
            let count = range.clone().filter(|c| held.contains(c)).count();
            if count == 0 {
                continue;
            }
            if count != *w {
                bail!(
                    "{}'s {} columns are split between stored tensors ({} holds {count} of {w}): PEFT adapts whole modules",
                    adapted.path,
                    target.name(),
                    leaf.name
                );
            }
            let r = a.len() / adapted.d_in;
            inside.push((range.start, *w, a, b, rank, r));
            rank += r;
        }
        if inside.is_empty() {
            continue;
        }
        let Some(name) = leaf.name.strip_suffix(".weight") else {
            bail!("{} is stored as {}, not a module's weight: PEFT cannot adapt it", adapted.path, leaf.name)
        };
        // lora_A: each block's Aᵀ, stacked
        let d_in = adapted.d_in;
        let mut a_t = vec![0.0; rank * d_in];
        for &(_, _, a, _, offset, r) in &inside {
            for i in 0..d_in {
                for k in 0..r {
                    a_t[(offset + k) * d_in + i] = a[i * r + k];
                }
            }
        }
        // lora_B: row s (the stored column s) holds the Bᵀ row of the block its column is in
        let mut b_t = vec![0.0; columns.len() * rank];
        for (s, &c) in columns.iter().enumerate() {
            if let Some(&(first, w, _, b, offset, r)) = inside.iter().find(|(f, w, ..)| (*f..f + w).contains(&c)) {
                for k in 0..r {
                    b_t[s * rank + offset + k] = b[k * w + (c - first)];
                }
            }
        }
        out.push(Module { name: name.to_owned(), width: columns.len(), transposed: leaf.transposed, a: a_t, b: b_t });
    }
    Ok(out)
}

/// A PEFT adapter's settings that decide what it computes (`adapter_config.json`).
#[derive(serde::Deserialize)]
struct PeftConfig {
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    #[serde(default)]
    rank_pattern: HashMap<String, usize>,
    #[serde(default)]
    alpha_pattern: HashMap<String, f64>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
}

impl PeftConfig {
    /// The scale of module `name`'s update of rank `rank`: α/r (α/√r under rsLoRA), α from
    /// `alpha_pattern` where it names the module.
    fn scale(&self, name: &str, rank: usize) -> f64 {
        let alpha = pattern(&self.alpha_pattern, name).copied().unwrap_or(self.lora_alpha);
        match self.use_rslora {
            true => alpha / (rank as f64).sqrt(),
            false => alpha / rank as f64,
        }
    }
}

/// The entry of a PEFT pattern (`rank_pattern`, `alpha_pattern`) naming module `name`: a key
/// matching the end of the name, at a dot, as a regular expression (PEFT's rule).
fn pattern<'a, T>(patterns: &'a HashMap<String, T>, name: &str) -> Option<&'a T> {
    patterns.iter().find_map(|(key, v)| {
        let re = regex::Regex::new(&format!(r"^(.*\.)?({key})$")).ok()?;
        re.is_match(name).then_some(v)
    })
}

/// What [`import`] wrote.
#[derive(Debug, Clone)]
pub struct ImportedAdapters {
    /// The run directory.
    pub out: std::path::PathBuf,
    /// The projections adapted, as `train.lora.targets` names them.
    pub targets: Vec<crate::lora::LoraTarget>,
    /// The rank of each update.
    pub rank: usize,
    /// Adapter parameters.
    pub params: usize,
}

/// Reads the PEFT adapter directory `src` (`adapter_config.json`, `adapter_model.safetensors`)
/// onto the run `base` (a model `export` writes as a Hugging Face architecture: one imported,
/// or trained here) and writes the LoRA run `out`, which must not exist: `base`'s config with
/// `[train.lora]`, the adapters as its weights, `base`'s weights by hash as its base — a run
/// that evaluates, generates, fine-tunes further (`--init-from` is not needed) and exports.
pub fn import(src: &Path, base: &Path, out: &Path, device: &burn::prelude::Device) -> Result<ImportedAdapters> {
    use crate::lora::blocks_of;
    use burn::store::ModuleSnapshot as _;
    if out.exists() {
        bail!("{} exists: give --out a directory that does not exist yet", out.display());
    }
    let config_path = src.join("adapter_config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    let peft: PeftConfig = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is not a PEFT adapter config: {e}", config_path.display()))?;
    let refuse = |what: &str| anyhow!("{}: {what}, which variorum's LoRA does not compute", config_path.display());
    match () {
        _ if peft.peft_type.as_deref().is_some_and(|t| t != "LORA") => {
            return Err(refuse(&format!("peft_type = {:?}", peft.peft_type.unwrap())));
        }
        _ if peft.use_dora => return Err(refuse("use_dora = true (weight-decomposed LoRA)")),
        _ if peft.bias.as_deref().is_some_and(|b| b != "none") => {
            return Err(refuse(&format!("bias = {:?} (trained biases)", peft.bias.unwrap())));
        }
        _ if peft.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) => {
            return Err(refuse("modules_to_save (whole modules trained beside the adapters)"));
        }
        _ => {}
    }
    if peft.r == 0 {
        bail!("{}: r = 0", config_path.display());
    }
    let run = Run::load(base, device)?;
    if run.config.train.lora.is_some() {
        bail!("{} is itself a LoRA run: give its base, or export it merged and import that", base.display());
    }
    let (mapping, rotary) = super::export::mapping_of(&run, base)?;
    let tensors = super::checkpoint::Checkpoint::open_file(&src.join("adapter_model.safetensors")).map_err(|e| {
        match src.join("adapter_model.bin").is_file() {
            true => anyhow!(
                "{} holds adapter_model.bin, a pickle: variorum reads safetensors only (PEFT writes them by default)",
                src.display()
            ),
            false => e,
        }
    })?;
    // module name -> (lora_A [R, d_in], lora_B [d_out, R]), shapes checked below
    let mut pairs: BTreeMap<String, [Option<String>; 2]> = BTreeMap::new();
    for name in tensors.names() {
        let stem = name.strip_prefix(PREFIX).unwrap_or(name);
        let (module, which) = match (stem.strip_suffix(".lora_A.weight"), stem.strip_suffix(".lora_B.weight")) {
            (Some(m), _) => (m, 0),
            (_, Some(m)) => (m, 1),
            _ => bail!("{}: tensor {name} is not a LoRA factor (lora_A or lora_B)", src.display()),
        };
        pairs.entry(module.to_owned()).or_default()[which] = Some(name.clone());
    }

    let mut model_cfg = run.config.model.clone();
    model_cfg.resolve(run.tokenizer.vocab_size())?;
    let shapes: HashMap<String, Vec<usize>> =
        run.model.collect(None, None, true).into_iter().map(|t| (t.name.clone(), t.shape.to_vec())).collect();
    // our weight path -> block index -> (A [d_in, R], B [R, w] scaled to α/r = scale of the module)
    let mut found: BTreeMap<String, BTreeMap<usize, Pair>> = BTreeMap::new();
    let mut used = BTreeSet::new();
    let mut targets = BTreeSet::new();
    for (path, recipe) in &mapping.tensors {
        let Some(shape) = shapes.get(path).filter(|s| s.len() == 2) else { continue };
        let (d_in, width) = (shape[0], shape[1]);
        let segments: Vec<&str> = path.split('.').collect();
        let Some(columns) = blocks_of(&model_cfg, &segments, width) else { continue };
        let order = column_order(path, width, rotary.as_ref())?;
        for leaf in leaves(recipe, width, path)? {
            let Some(module) = leaf.name.strip_suffix(".weight") else { continue };
            let Some([a_name, b_name]) = pairs.get(module) else { continue };
            let (Some(a_name), Some(b_name)) = (a_name, b_name) else {
                bail!("{}: {module} has one LoRA factor without the other", src.display());
            };
            used.insert(module.to_owned());
            let (a_shape, b_shape) = (tensors.shape(a_name)?, tensors.shape(b_name)?);
            let rank = a_shape.first().copied().unwrap_or(0);
            if rank == 0 || a_shape != [rank, d_in] || b_shape != [leaf.columns.len(), rank] {
                bail!(
                    "{}: {module}'s factors are {a_shape:?} and {b_shape:?}; the base's module is {d_in} → {} wide",
                    src.display(),
                    leaf.columns.len()
                );
            }
            if let Some(&r) = pattern(&peft.rank_pattern, module).filter(|&&r| r != rank) {
                bail!("{}: rank_pattern gives {module} rank {r}, its factors have {rank}", src.display());
            }
            let scale = peft.scale(module, rank);
            let (a, b) = (tensors.values(a_name)?, tensors.values(b_name)?);
            // our column c is the module's output s
            let mut stored = vec![usize::MAX; width];
            for (s, &c) in leaf.columns.iter().enumerate() {
                stored[order[c]] = s;
            }
            let mut start = 0;
            for (index, (w, target)) in columns.iter().enumerate() {
                let range = start..start + w;
                start += w;
                let inside = range.clone().filter(|&c| stored[c] != usize::MAX).count();
                if inside == 0 {
                    continue;
                }
                if inside != *w {
                    bail!(
                        "{}: {module} holds part of {path}'s {} columns: variorum adapts them whole",
                        src.display(),
                        target.name()
                    );
                }
                // Bᵀ's rows for these columns, as B [R, w]
                let mut block_b = vec![0.0; rank * w];
                for (j, c) in range.clone().enumerate() {
                    for k in 0..rank {
                        block_b[k * w + j] = b[stored[c] * rank + k];
                    }
                }
                // a module several of our blocks share (GPT-2's c_attn) may leave some of them
                // without an update (all zeros): those stay unadapted, unless nothing moved at all
                let any = block_b.iter().any(|&x| x != 0.0);
                let a_t: Vec<f32> = (0..d_in * rank).map(|i| a[(i % rank) * d_in + i / rank]).collect();
                found.entry(path.clone()).or_default().insert(index, (a_t, block_b, rank, scale));
                if any {
                    targets.insert(*target);
                }
            }
        }
    }
    if let Some(unused) = pairs.keys().find(|m| !used.contains(*m)) {
        bail!(
            "{}: {unused} is no projection of {} as variorum exports it ({}): variorum adapts attention's q, k, v, output and the feed-forward layers",
            src.display(),
            base.display(),
            mapping.class
        );
    }
    if found.is_empty() {
        bail!("{} holds no LoRA factors", src.join("adapter_model.safetensors").display());
    }
    if targets.is_empty() {
        // every B zero (a fresh adapter): every block the file covers
        targets = found
            .iter()
            .flat_map(|(path, blocks)| {
                let width = shapes[path][1];
                let columns = blocks_of(&model_cfg, &path.split('.').collect::<Vec<_>>(), width).unwrap_or_default();
                blocks.keys().map(move |&i| columns[i].1).collect::<Vec<_>>()
            })
            .collect();
    }
    let lora = fit(&peft, &mut found, &targets, &model_cfg, &shapes)?;
    let params = found.values().flat_map(|b| b.values()).map(|(a, b, ..)| a.len() + b.len()).sum();
    write_run(&run, base, out, &lora, &found, &shapes)?;
    Ok(ImportedAdapters { out: out.to_path_buf(), targets: lora.targets.clone(), rank: lora.rank, params })
}

/// One adapted block read from a PEFT file: A `[d_in, R]`, B `[R, w]`, R, and the scale.
type Pair = (Vec<f32>, Vec<f32>, usize, f64);

/// The `[train.lora]` the pairs `found` are read as, and `found` made to fit it: rank `peft.r`,
/// α/r the first pair's scale (every B rescaled to it). Blocks of a projection `targets` does not
/// name are dropped (their B is zero). A pair of higher rank whose B has at most r rows that are
/// not zero (a fused module's block-diagonal pair, as `export` writes GPT-2's `c_attn`) is cut
/// to those rows; one of lower rank is padded with zero rows.
fn fit(
    peft: &PeftConfig,
    found: &mut BTreeMap<String, BTreeMap<usize, Pair>>,
    targets: &BTreeSet<crate::lora::LoraTarget>,
    model_cfg: &variorum_model::ModelConfig,
    widths: &HashMap<String, Vec<usize>>,
) -> Result<LoraConfig> {
    let r = peft.r;
    let first_scale = found.values().flat_map(|b| b.values()).map(|p| p.3).next().unwrap_or(1.0);
    for (path, blocks) in found.iter_mut() {
        let columns = crate::lora::blocks_of(model_cfg, &path.split('.').collect::<Vec<_>>(), widths[path][1])
            .unwrap_or_default();
        blocks.retain(|&i, _| columns.get(i).is_some_and(|(_, t)| targets.contains(t)));
        for (a, b, rank, scale) in blocks.values_mut() {
            let d_in = a.len() / *rank;
            let w = b.len() / *rank;
            let moved = |k: &usize| b[k * w..(k + 1) * w].iter().any(|&x| x != 0.0);
            let mut rows: Vec<Option<usize>> = (0..*rank).filter(moved).map(Some).collect();
            if rows.len() > r {
                bail!(
                    "{path}: an update of rank {} where the adapter's r is {r}: variorum gives every projection one rank",
                    rows.len()
                );
            }
            // rows of B that are zero, their A rows kept (training moves them), then zeros
            let idle: Vec<Option<usize>> = (0..*rank).filter(|k| !moved(k)).map(Some).collect();
            rows.extend(idle.into_iter().chain(std::iter::repeat(None)).take(r - rows.len()));
            let ratio = (*scale / first_scale) as f32;
            let (a_old, b_old) = (&*a, &*b);
            let r_old = *rank;
            let a_at = |i: usize, k: Option<usize>| k.map_or(0.0, |k| a_old[i * r_old + k]);
            let new_a: Vec<f32> = (0..d_in).flat_map(|i| rows.iter().map(move |&k| a_at(i, k))).collect();
            let new_b: Vec<f32> =
                rows.iter().flat_map(|&k| (0..w).map(move |j| k.map_or(0.0, |k| b_old[k * w + j] * ratio))).collect();
            (*a, *b, *rank, *scale) = (new_a, new_b, r, first_scale);
        }
    }
    found.retain(|_, blocks| !blocks.is_empty());
    Ok(LoraConfig {
        rank: r,
        alpha: first_scale * r as f64,
        dropout: peft.lora_dropout,
        targets: targets.iter().copied().collect(),
    })
}

/// Writes the LoRA run `out` on the base run `base` (loaded as `run`): its config with `lora`,
/// its tokenizer files, the base's weights by hash, and the adapters `found` (others at their
/// start: B = 0) as its weights. Written under a temporary name and renamed into place.
fn write_run(
    run: &Run,
    base: &Path,
    out: &Path,
    lora: &LoraConfig,
    found: &BTreeMap<String, BTreeMap<usize, Pair>>,
    shapes: &HashMap<String, Vec<usize>>,
) -> Result<()> {
    let mut model_cfg = run.config.model.clone();
    model_cfg.resolve(run.tokenizer.vocab_size())?;
    let model = crate::lora::attach(run.model.clone(), &model_cfg, lora)?;
    // block index -> part index: the parts are the targeted blocks, in column order
    let mut values: HashMap<(String, usize), (Vec<f32>, Vec<f32>)> = HashMap::new();
    for (path, blocks) in found {
        let width = shapes[path][1];
        let columns =
            crate::lora::blocks_of(&model_cfg, &path.split('.').collect::<Vec<_>>(), width).unwrap_or_default();
        let mut part = 0;
        for (i, (_, target)) in columns.iter().enumerate() {
            if !lora.targets.contains(target) {
                continue;
            }
            if let Some((a, b, ..)) = blocks.get(&i) {
                values.insert((path.clone(), part), (a.clone(), b.clone()));
            }
            part += 1;
        }
    }
    use burn::module::Module as _;
    let model = model.map(&mut SetFactors { path: Default::default(), values });
    let staging = super::staging_dir(out, "importing")?;
    let written = (|| -> Result<()> {
        let mut cfg = run.config.clone();
        cfg.train.lora = Some(lora.clone());
        crate::checkpoint::write_atomic(&staging.join("config.toml"), cfg.to_toml().as_bytes())?;
        for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"] {
            if base.join(file).is_file() {
                std::fs::copy(base.join(file), staging.join(file))?;
            }
        }
        crate::lora::record_base(&staging, &base.join("model.bpk"))?;
        crate::lora::save_adapters(&model, &staging.join("model.bpk"))
    })();
    match written.and_then(|()| {
        std::fs::rename(&staging, out)
            .map_err(|e| anyhow!("cannot move {} to {}: {e}", staging.display(), out.display()))
    }) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Gives the adapters' factors the values read (`<weight>.lora.parts.<i>.a`/`.b`, by weight
/// path and part), keeping whether they train.
struct SetFactors {
    path: crate::lora::TensorPath,
    values: HashMap<(String, usize), (Vec<f32>, Vec<f32>)>,
}

impl burn::module::ModuleMapper for SetFactors {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name, container);
    }
    fn exit_module(&mut self, _: &str, container: &str) {
        self.path.exit(container);
    }
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::prelude::Tensor<D>>,
    ) -> burn::module::Param<burn::prelude::Tensor<D>> {
        use burn::prelude::*;
        let Some((weight, part, factor)) = self.path.factor() else { return param };
        let Some((a, b)) = self.values.get(&(weight, part)) else { return param };
        let v = if factor == "a" { a.clone() } else { b.clone() };
        param.map(|t| {
            let moved = Tensor::from_data(TensorData::new(v, t.shape()), &t.device());
            if t.is_require_grad() { moved.require_grad() } else { moved }
        })
    }
}
