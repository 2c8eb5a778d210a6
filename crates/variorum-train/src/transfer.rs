//! Moving weights between runs and frameworks: export to safetensors, and initialising a model
//! (possibly of another config) from a run directory or a safetensors file.
//!
//! Tensor names are the module paths with enum variants left out, e.g.
//! `token_embedding.weight`, `position.table`, `blocks.0.attn.qkv.qkv.weight` (fused
//! `[d_model, (h + 2·h_kv)·head_dim]`, q then k then v, head-major), `blocks.0.attn.out.weight`,
//! `blocks.0.ffn.up.weight`, `blocks.0.ffn.down.weight`, `blocks.0.attn_norm.gamma`,
//! `final_norm.gamma`, `head.weight`. Linear weights are `[d_in, d_out]` (the transpose of
//! PyTorch's `nn.Linear.weight`).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use burn::store::{ApplyError, ApplyResult, BurnpackStore, KeyRemapper, ModuleSnapshot, ModuleStore, SafetensorsStore};
use variorum_model::DecoderLm;

use crate::checkpoint;

/// What `init_from` did with each tensor.
#[derive(Debug, Clone, Default)]
pub struct InitReport {
    /// The run directory or weights file read.
    pub source: PathBuf,
    /// Copied from the source.
    pub loaded: Vec<String>,
    /// In the model but not in the source: kept their fresh initialisation.
    pub new: Vec<String>,
    /// In both with different shapes: kept their fresh initialisation.
    pub skipped_shape: Vec<String>,
    /// In the source but not in the model.
    pub unused: Vec<String>,
}

impl InitReport {
    /// One line: the tensors loaded, new, skipped for shape and unused, naming all but the loaded.
    pub fn summary(&self) -> String {
        let list = |v: &[String]| if v.is_empty() { String::new() } else { format!(" ({})", v.join(", ")) };
        format!(
            "initialised from {}: {} tensors loaded, {} new{}, {} skipped for shape{}, {} unused{}",
            self.source.display(),
            self.loaded.len(),
            self.new.len(),
            list(&self.new),
            self.skipped_shape.len(),
            list(&self.skipped_shape),
            self.unused.len(),
            list(&self.unused)
        )
    }
}

/// Writes the model's weights to a safetensors file; returns the tensor names.
pub fn export_safetensors(model: &DecoderLm, path: &Path) -> Result<Vec<String>> {
    let mut store = SafetensorsStore::from_file(path).skip_enum_variants(true);
    model.save_into(&mut store).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    sort_metadata(path).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    let mut written = SafetensorsStore::from_file(path);
    let names = written
        .get_all_tensors()
        .map_err(|e| anyhow!("cannot read back {}: {e}", path.display()))?
        .keys()
        .cloned()
        .collect();
    Ok(names)
}

/// Rewrites a safetensors file's `__metadata__` with its keys in order, in place. burn-store
/// hands the safetensors crate its metadata (format, producer, version) as a `HashMap`, whose
/// order is random per process, so two exports of one model differed in their header's bytes;
/// the tensors themselves the crate already writes in a fixed order. The header keeps its
/// length (the same entries reordered, padded with spaces as the format allows).
fn sort_metadata(path: &Path) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)?;
    let n = usize::try_from(u64::from_le_bytes(len)).map_err(|_| invalid("header length"))?;
    let mut header = vec![0u8; n];
    file.read_exact(&mut header)?;
    let mut json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| invalid(&e.to_string()))?;
    let Some(serde_json::Value::Object(meta)) = json.remove("__metadata__") else { return Ok(()) };
    let sorted: std::collections::BTreeMap<String, serde_json::Value> = meta.into_iter().collect();
    // `__metadata__` first, as the crate writes it, then the tensors (each with its offsets)
    let mut out = format!("{{\"__metadata__\":{}", serde_json::to_string(&sorted)?).into_bytes();
    for (name, info) in &json {
        out.push(b',');
        out.extend(serde_json::to_string(name)?.into_bytes());
        out.push(b':');
        out.extend(serde_json::to_string(info)?.into_bytes());
    }
    out.push(b'}');
    if out.len() > n {
        return Err(invalid("the sorted header is longer than the written one"));
    }
    out.resize(n, b' ');
    file.seek(SeekFrom::Start(8))?;
    file.write_all(&out)
}

/// The weights file of a run directory (final, or the latest checkpoint's), or `path` itself.
pub fn weights_file(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        bail!("{} does not exist: give a run directory or a .safetensors file", path.display());
    }
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.join("model.bpk").is_file() {
        return Ok(path.join("model.bpk"));
    }
    match checkpoint::all(path)?.first() {
        Some((dir, _)) => Ok(dir.join("model.bpk")),
        None => bail!("{} has no weights (no model.bpk and no checkpoint)", path.display()),
    }
}

/// Loads what fits of `source` (a run directory, a `.bpk` or a `.safetensors` file) into `model`:
/// tensors with the same name and shape are copied, the rest keep their initialisation.
///
/// Names are matched as written first; then a tensor still missing takes an unused source
/// tensor whose name differs only in enum variants and in the wrappers kinds put around the
/// standard projections (`proj`: kernelised kinds; `attention`: patterns built on multi-head
/// attention). So a softmax model's `blocks.0.attn.qkv.qkv.weight` initialises a Performer's
/// `blocks.0.attn.proj.qkv.qkv.weight` — the same map (Performer's backward compatibility).
pub fn init_from(model: &mut DecoderLm, source: &Path) -> Result<InitReport> {
    let file = weights_file(source)?;
    let result = load_matching(model, &file, None)?;
    // the second pass: unused source names that match a missing one once normalised
    let missing: Vec<String> = result.missing.iter().map(|(p, _)| p.clone()).collect();
    let mut aliases = Vec::new();
    for m in &missing {
        if let Some(u) = result.unused.iter().find(|u| normalised(u) == normalised(m)) {
            aliases.push((u.clone(), m.clone()));
        }
    }
    let second = if aliases.is_empty() {
        None
    } else {
        let mut remapper = KeyRemapper::new();
        for (from, to) in &aliases {
            remapper = remapper
                .add_pattern(format!("^{}$", regex::escape(from)), to.as_str())
                .map_err(|e| anyhow!("cannot match {from}: {e}"))?;
        }
        Some(load_matching(model, &file, Some(remapper))?)
    };
    let mut report = InitReport { source: file.clone(), ..Default::default() };
    let aliased: Vec<&String> = aliases.iter().map(|(_, to)| to).collect();
    for r in std::iter::once(&result).chain(second.as_ref()) {
        for e in &r.errors {
            match e {
                ApplyError::ShapeMismatch { path, .. } => {
                    if !report.skipped_shape.contains(path) {
                        report.skipped_shape.push(path.clone())
                    }
                }
                other => bail!("{} cannot be loaded: {other}", file.display()),
            }
        }
    }
    report.loaded = result.applied.iter().filter(|p| !report.skipped_shape.contains(p)).cloned().collect();
    if let Some(r) = &second {
        let extra = r.applied.iter().filter(|p| aliased.contains(p) && !report.skipped_shape.contains(p));
        report.loaded.extend(extra.cloned());
    }
    let used_aliases: Vec<&String> =
        aliases.iter().filter(|(_, to)| report.loaded.contains(to)).map(|(f, _)| f).collect();
    report.unused = result.unused.iter().filter(|u| !used_aliases.contains(u)).cloned().collect();
    // a name that found its counterpart with another shape is reported as skipped, not new
    report.new =
        missing.into_iter().filter(|m| !report.loaded.contains(m) && !report.skipped_shape.contains(m)).collect();
    let model_now = std::mem::replace(model, model.clone());
    *model = model_now.after_partial_load(&report.new);
    Ok(report)
}

/// One loading pass of `file` into `model` (`remapper`: source names to rename first).
fn load_matching(model: &mut DecoderLm, file: &Path, remapper: Option<KeyRemapper>) -> Result<ApplyResult> {
    let safetensors = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
    let cannot = |e: &dyn std::fmt::Display| anyhow!("{} cannot be loaded: {e}", file.display());
    if safetensors {
        let mut store = SafetensorsStore::from_file(file).allow_partial(true).validate(false).skip_enum_variants(true);
        if let Some(r) = remapper {
            store = store.remap(r);
        }
        model.load_from(&mut store).map_err(|e| cannot(&e))
    } else {
        let mut store = BurnpackStore::from_file(file).allow_partial(true).validate(false);
        if let Some(r) = remapper {
            store = store.remap(r);
        }
        model.load_from(&mut store).map_err(|e| cannot(&e))
    }
}

/// A tensor name without enum variants (capitalised segments) and projection wrappers.
fn normalised(path: &str) -> Vec<&str> {
    path.split('.')
        .filter(|s| !s.starts_with(|c: char| c.is_ascii_uppercase()) && !matches!(*s, "proj" | "attention"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::prelude::*;

    #[test]
    fn an_export_is_a_function_of_the_weights() {
        let dir = tempfile::tempdir().unwrap();
        let model = variorum_model::zoo::tiny().init(&Device::flex());
        let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
        export_safetensors(&model, &a).unwrap();
        export_safetensors(&model, &b).unwrap();
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(a == b, "two exports of one model differ");
        // the metadata's keys in order (a HashMap's order before)
        let header = String::from_utf8_lossy(&a[8..200]);
        let at = |key: &str| header.find(key).unwrap_or_else(|| panic!("{key} missing from {header}"));
        assert!(at("\"format\"") < at("\"producer\"") && at("\"producer\"") < at("\"version\""), "{header}");
        // and the file still loads, every tensor in place
        let mut store = SafetensorsStore::from_file(dir.path().join("a.safetensors"));
        assert_eq!(
            store.get_all_tensors().unwrap().len(),
            export_safetensors(&model, &dir.path().join("c.safetensors")).unwrap().len()
        );
    }
}
