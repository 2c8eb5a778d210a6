//! A model state's memories on disk, so that a memory model's training resumes exactly: the
//! memory at step k is a function of every segment of its streams before k, so it is saved with
//! the checkpoint rather than rebuilt. The tensors go into a burnpack file (through a small module
//! holding them), their shapes into the checkpoint's `state.json`.
//!
//! What is saved is `model.memory` (each layer's `MemoryState`). An attention kind's own memory
//! (the Memorizing Transformer's kNN memory, in the layer's `AttentionState`: up to hundreds of
//! MiB per layer) is not: a resumed run starts those memories afresh, mid-document.

use std::path::Path;

use burn::module::Param;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_block::LayerState;

use variorum_model::DecoderState;

/// Shapes of one layer's memory tensors (absent ones are `None`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerShapes {
    /// The compressed memory, `[b, ≤ n_cm, d]`.
    pub compressed: Option<[usize; 3]>,
    /// The FIFO memory, `[b, ≤ n_m, d]`.
    pub memory: Option<[usize; 3]>,
    /// The unfinished segment's inputs, `[b, < segment, d]`.
    pub pending: Option<[usize; 3]>,
    /// The attention each memory slot has received, `[b, memory length]`.
    pub usage: Option<[usize; 2]>,
}

/// What `state.json` records of a saved memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryLayout {
    /// The state's position: the tokens run so far.
    pub position: usize,
    /// Per block application, the shapes of its memory.
    pub layers: Vec<LayerShapes>,
}

/// The tensors, in layer order (compressed, memory, pending of each layer where present).
#[derive(Module, Debug)]
struct MemoryTensors {
    states: Vec<Param<Tensor<3>>>,
    usage: Vec<Param<Tensor<2>>>,
}

impl MemoryLayout {
    /// The layout of `state`'s memories.
    pub fn of(state: &DecoderState) -> Self {
        let dims3 = |t: &Option<Tensor<3>>| t.as_ref().map(|t| t.dims());
        let layers = state
            .layers
            .iter()
            .map(|l| LayerShapes {
                compressed: dims3(&l.memory.compressed),
                memory: dims3(&l.memory.memory),
                pending: dims3(&l.memory.pending),
                usage: l.memory.usage.as_ref().map(|u| u.dims()),
            })
            .collect();
        Self { position: state.position, layers }
    }
}

fn param<const D: usize>(t: Tensor<D>) -> Param<Tensor<D>> {
    Param::from_tensor(t).set_require_grad(false)
}

/// Writes the memories of `state` to `path` and returns their layout.
pub fn save_memory(state: &DecoderState, path: &Path) -> anyhow::Result<MemoryLayout> {
    let mut states = Vec::new();
    let mut usage = Vec::new();
    for l in &state.layers {
        let m = &l.memory;
        for t in [&m.compressed, &m.memory, &m.pending].into_iter().flatten() {
            states.push(param(t.clone().detach()));
        }
        if let Some(u) = &m.usage {
            usage.push(param(u.clone().detach()));
        }
    }
    MemoryTensors { states, usage }
        .save_file(path)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(MemoryLayout::of(state))
}

/// Reads memories written by [`save_memory`] back into a state on `device`.
pub fn load_memory(layout: &MemoryLayout, path: &Path, device: &Device) -> anyhow::Result<DecoderState> {
    let zeros3 = |s: &Option<[usize; 3]>| s.map(|s| param(Tensor::<3>::zeros(s, device)));
    let mut template = MemoryTensors { states: Vec::new(), usage: Vec::new() };
    for l in &layout.layers {
        template.states.extend([zeros3(&l.compressed), zeros3(&l.memory), zeros3(&l.pending)].into_iter().flatten());
        template.usage.extend(l.usage.map(|s| param(Tensor::<2>::zeros(s, device))));
    }
    let loaded = crate::weights::load_weights(template, path, "memory checkpoint")?;
    let mut states = loaded.states.into_iter().map(|p| p.val());
    let mut usage = loaded.usage.into_iter().map(|p| p.val());
    let mut out = DecoderState { position: layout.position, ..Default::default() };
    for l in &layout.layers {
        let mut layer = LayerState::default();
        let m = &mut layer.memory;
        m.compressed = l.compressed.and_then(|_| states.next());
        m.memory = l.memory.and_then(|_| states.next());
        m.pending = l.pending.and_then(|_| states.next());
        m.usage = l.usage.and_then(|_| usage.next());
        out.layers.push(layer);
    }
    Ok(out)
}
