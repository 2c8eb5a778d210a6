//! The weights of a Hugging Face model directory: `model.safetensors`, or the shards an index
//! (`model.safetensors.index.json`) lists. Files are memory-mapped and only their headers read
//! up front; a tensor's values are read, and widened to f32 from bf16 or f16, when asked for.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, anyhow, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// Where one tensor lies: its file, dtype, shape and byte range in the file.
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: (usize, usize),
}

/// A model directory's tensors, by name.
pub(crate) struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    entries: BTreeMap<String, Entry>,
    /// The names a mapping has asked for (to find what no mapping used).
    taken: Mutex<BTreeSet<String>>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or the shards `dir/model.safetensors.index.json` lists.
    pub(crate) fn open(dir: &Path) -> Result<Checkpoint> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let paths = if index.is_file() {
            shards(&index)?.into_iter().map(|name| dir.join(name)).collect()
        } else if single.is_file() {
            vec![single]
        } else if dir.join("pytorch_model.bin").is_file() {
            bail!(
                "{} holds pytorch_model.bin, a pickle: variorum reads safetensors only (transformers \
                 writes them with save_pretrained(dir, safe_serialization=True))",
                dir.display()
            )
        } else {
            bail!("{} has no model.safetensors and no model.safetensors.index.json", dir.display())
        };
        Self::from_files(paths)
    }

    /// One safetensors file (a PEFT adapter's `adapter_model.safetensors`).
    pub(crate) fn open_file(path: &Path) -> Result<Checkpoint> {
        if !path.is_file() {
            bail!("{} not found", path.display());
        }
        Self::from_files(vec![path.to_path_buf()])
    }

    /// The tensors of `paths`, each name in one file only.
    fn from_files(paths: Vec<PathBuf>) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut entries = BTreeMap::new();
        for path in paths {
            let file = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow!("{} is listed in the index but absent", path.display()),
                _ => anyhow!("{} cannot be read: {e}", path.display()),
            })?;
            // SAFETY: the file is only read; a file changed under the map while importing could
            // give wrong values, never unsafety in this process's own memory.
            let map = unsafe { Mmap::map(&file) }.with_context(|| format!("{} cannot be mapped", path.display()))?;
            // checks the header and that every tensor's bytes lie inside the file
            let st = SafeTensors::deserialize(&map).map_err(|e| {
                anyhow!("{} is not a complete safetensors file (truncated or corrupt): {e}", path.display())
            })?;
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
                let entry = Entry {
                    file: files.len(),
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: (start, start + view.data().len()),
                };
                if entries.insert(name.clone(), entry).is_some() {
                    bail!("tensor {name} is stored twice (again in {})", path.display());
                }
            }
            drop(st);
            files.push((path, map));
        }
        Ok(Checkpoint { files, entries, taken: Mutex::new(BTreeSet::new()) })
    }

    /// Every tensor's name, in order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// A checkpoint with no tensors: what a mapping is given when it is run to be inverted
    /// (`export`), so that it names the tensors as transformers' own classes save them.
    pub(crate) fn empty() -> Checkpoint {
        Checkpoint { files: Vec::new(), entries: BTreeMap::new(), taken: Mutex::new(BTreeSet::new()) }
    }

    /// Whether the checkpoint has `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| anyhow!("the weights have no tensor {name}"))
    }

    /// The shape of `name`, marking it used; refuses a dtype [`values`](Self::values) cannot read.
    pub(crate) fn shape(&self, name: &str) -> Result<Vec<usize>> {
        let entry = self.entry(name)?;
        if !matches!(entry.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64) {
            let path = &self.files[entry.file].0;
            bail!("tensor {name} in {} is {:?}: expected f32, bf16, f16 or f64 weights", path.display(), entry.dtype);
        }
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        Ok(entry.shape.clone())
    }

    /// The values of `name` as f32 (from f32, bf16, f16 or f64), row-major.
    pub(crate) fn values(&self, name: &str) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        let (path, map) = &self.files[entry.file];
        let bytes = &map[entry.bytes.0..entry.bytes.1];
        let pairs = |n: usize| bytes.chunks_exact(n);
        let values = match entry.dtype {
            Dtype::F32 => pairs(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => pairs(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => pairs(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F64 => pairs(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32).collect(),
            other => bail!("tensor {name} in {} is {other:?}: expected f32, bf16, f16 or f64 weights", path.display()),
        };
        // The pages just read are not needed again: let them go, so that an import holds one
        // copy of the weights (the model's), not a second one in the mapping. Advice only: an
        // error leaves the pages where they are.
        // SAFETY: the mapping is read-only and shared with its file; dropped pages are read from
        // the file again if touched, so no data this process wrote can be lost.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, entry.bytes.0, entry.bytes.1 - entry.bytes.0)
        };
        Ok(values)
    }

    /// Tensors no mapping asked for.
    pub(crate) fn unused(&self) -> Vec<String> {
        let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        self.entries.keys().filter(|n| !taken.contains(*n)).cloned().collect()
    }
}

/// The shard files an index names, in order, each once.
fn shards(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).with_context(|| format!("{} cannot be read", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow!("{} is not JSON: {e}", index.display()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| anyhow!("{} has no weight_map object", index.display()))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file =
            file.as_str().ok_or_else(|| anyhow!("{}: weight_map.{tensor} is not a file name", index.display()))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            bail!("{}: weight_map.{tensor} = {file:?} is not a file beside the index", index.display());
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files)
}
