//! Segment-level memories, the `model.memory` axis: what a block's attention sees of the past
//! beyond the current segment.
//!
//! Each kind is its own file and one line in [`MemoryConfig`]'s list: [`crate::xl_memory`]
//! (Transformer-XL's segment recurrence), [`crate::compressive`] (the Compressive
//! Transformer's second, compressed FIFO). This file holds what they share: the per-layer FIFO
//! ([`LayerMemory`]) and its state.
//!
//! The memory lives in the model state ([`MemoryState`], one per layer), never in the module: a
//! model trained with memory runs on ordered streams, and evaluation and generation carry it the
//! same way. States are added as they are computed; a full segment (`model.seq_len` states) is
//! committed to the memory at once, so generating token by token builds the same memory as a
//! forward over whole segments.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, Declared};

use crate::compression::{CompressionKind, Compressor};
use crate::compressive::CompressiveMemoryConfig;
use crate::xl_memory::XlMemoryConfig;

/// A memory kind's config: how it is checked, what each layer builds. Its file implements
/// this and [`Declared`]; one line in [`MemoryConfig`]'s list registers it.
pub trait MemoryKind {
    /// `segment` is the model's segment length (`model.seq_len`).
    fn validate(&self, _segment: usize) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The per-layer part (sizes; a compression network for `compressive`), or none.
    fn init(&self, d_model: usize, segment: usize, device: &Device) -> Option<LayerMemory>;
}

variorum_core::kind_enum! {
    /// `model.memory`, chosen by `kind`.
    pub enum MemoryConfig: dyn MemoryKind, axis "model.memory" {
        /// No memory: every sequence starts from nothing.
        "none" => None(NoMemoryConfig),
        /// Transformer-XL segment recurrence.
        "xl" => Xl(XlMemoryConfig),
        /// Compressive Transformer: memory plus compressed memory.
        "compressive" => Compressive(CompressiveMemoryConfig),
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self::None(NoMemoryConfig {})
    }
}

impl MemoryConfig {
    /// Whether the kind is `none`: no memory.
    pub fn is_none(&self) -> bool {
        matches!(self, Self::None(_))
    }

    /// `segment` is the model's segment length (`model.seq_len`).
    pub fn validate(&self, segment: usize) -> Result<(), ConfigError> {
        self.spec().validate(segment)
    }

    /// The per-layer part, if the kind has one.
    pub fn init(&self, d_model: usize, segment: usize, device: &Device) -> Option<LayerMemory> {
        self.spec().init(d_model, segment, device)
    }
}

/// `model.memory` with `kind = "none"`: no settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoMemoryConfig {}

impl Declared for NoMemoryConfig {
    const SUMMARY: &'static str = "no memory beyond the current context";
    const PAPER: &'static str = "";
    const CAPS: Capabilities = Capabilities::NEUTRAL;
}

impl MemoryKind for NoMemoryConfig {
    fn init(&self, _d_model: usize, _segment: usize, _device: &Device) -> Option<LayerMemory> {
        None
    }
}

/// One layer's memory state: detached past inputs of that layer.
#[derive(Debug, Clone, Default)]
pub struct MemoryState {
    /// Compressed memory `[b, ≤ n_cm, d]`, oldest first.
    pub compressed: Option<Tensor<3>>,
    /// FIFO memory `[b, ≤ n_m, d]`, oldest first.
    pub memory: Option<Tensor<3>>,
    /// Inputs of the current, unfinished segment `[b, < segment, d]` (token-by-token decoding).
    pub pending: Option<Tensor<3>>,
    /// Attention each memory slot has received, `[b, memory length]` (most-used compression).
    pub usage: Option<Tensor<2>>,
}

fn cat(parts: Vec<Option<Tensor<3>>>) -> Option<Tensor<3>> {
    let parts: Vec<Tensor<3>> = parts.into_iter().flatten().collect();
    match parts.len() {
        0 => None,
        1 => parts.into_iter().next(),
        _ => Some(Tensor::cat(parts, 1)),
    }
}

fn len(t: &Option<Tensor<3>>) -> usize {
    t.as_ref().map_or(0, |t| t.dims()[1])
}

impl MemoryState {
    /// What the current segment's queries attend to before themselves:
    /// [compressed; memory; pending], oldest first.
    pub fn context(&self) -> Option<Tensor<3>> {
        cat(vec![self.compressed.clone(), self.memory.clone(), self.pending.clone()])
    }

    /// Length of [`context`](Self::context).
    pub fn context_len(&self) -> usize {
        len(&self.compressed) + len(&self.memory) + len(&self.pending)
    }

    /// (compressed, memory) lengths.
    pub fn lengths(&self) -> (usize, usize) {
        (len(&self.compressed), len(&self.memory))
    }

    /// Adds the attention weights `[b, heads, len_q, context_len + len_q]` of a forward to the
    /// usage of each memory slot.
    pub fn record_usage(&mut self, weights: Tensor<4>) {
        let (c, m) = self.lengths();
        if m == 0 {
            return;
        }
        let b = weights.dims()[0];
        let used = weights.narrow(3, c, m).sum_dim(1).sum_dim(2).reshape([b, m]).detach();
        self.usage = Some(match self.usage.take() {
            Some(u) if u.dims() == [b, m] => u + used,
            _ => used,
        });
    }
}

/// The per-layer part of a memory: sizes, and the compression network when there is one.
#[derive(Module, Debug)]
pub struct LayerMemory {
    /// n_m, the states the FIFO memory keeps.
    pub length: usize,
    /// n_cm, the states the compressed memory keeps (0 without one).
    pub compressed_length: usize,
    /// Segment length: states are committed to the memory a segment at a time.
    pub segment: usize,
    /// f_c for the states the FIFO evicts (compressive memory); none: they are dropped.
    pub compressor: Option<Compressor>,
    /// Weight of the attention-reconstruction loss (0 = off).
    pub reconstruction_weight: f64,
    /// Weight of the auto-encoding loss (0 = off).
    pub autoencoding_weight: f64,
}

/// States evicted from the FIFO memory by a commit, for the compression losses.
pub struct Evicted {
    /// The evicted states `[b, n, d]` (detached).
    pub states: Tensor<3>,
    /// Their compression `[b, n / c, d]`, still attached to the compression network.
    pub compressed: Tensor<3>,
}

impl LayerMemory {
    /// Whether the compression reads how much attention each memory slot received.
    pub fn tracks_usage(&self) -> bool {
        self.compressor.as_ref().is_some_and(|c| c.kind == CompressionKind::MostUsed)
    }

    /// Adds this forward's layer inputs `x: [b, len, d]` to the state; whole segments move into
    /// the memory (oldest states out, into the compressed memory if there is one). Returns the
    /// evicted states and their compression, if a compressive memory evicted any.
    pub fn update(&self, state: &mut MemoryState, x: Tensor<3>) -> Option<Evicted> {
        let pending = cat(vec![state.pending.take(), Some(x.detach())]).expect("x is there");
        let n = pending.dims()[1];
        let full = n - n % self.segment;
        if full < n {
            state.pending = Some(pending.clone().narrow(1, full, n - full));
        }
        if full == 0 {
            return None;
        }
        self.commit(state, pending.narrow(1, 0, full))
    }

    fn commit(&self, state: &mut MemoryState, new: Tensor<3>) -> Option<Evicted> {
        let [b, n_new, _] = new.dims();
        let device = new.device();
        let memory = cat(vec![state.memory.take(), Some(new)]).expect("new is there");
        let total = memory.dims()[1];
        let usage = state.usage.take().map(|u| Tensor::cat(vec![u, Tensor::zeros([b, n_new], &device)], 1));
        if total <= self.length {
            state.memory = Some(memory);
            state.usage = usage;
            return None;
        }
        let out = total - self.length;
        state.memory = Some(memory.clone().narrow(1, out, self.length));
        state.usage = usage.clone().map(|u| u.narrow(1, out, self.length));
        let compressor = self.compressor.as_ref()?;
        let evicted = memory.narrow(1, 0, out);
        let evicted_usage = usage.map(|u| u.narrow(1, 0, out));
        let compressed = compressor.compress(evicted.clone(), evicted_usage);
        let all = cat(vec![state.compressed.take(), Some(compressed.clone().detach())]).expect("compressed is there");
        let kept = all.dims()[1].min(self.compressed_length);
        state.compressed = Some(all.clone().narrow(1, all.dims()[1] - kept, kept));
        Some(Evicted { states: evicted, compressed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(from: usize, n: usize, dev: &Device) -> Tensor<3> {
        // state t is the constant vector t, so positions can be read back
        Tensor::<1, Int>::arange(from as i64..(from + n) as i64, dev).float().reshape([1, n, 1]).expand([1, n, 2])
    }

    fn firsts(t: &Option<Tensor<3>>) -> Vec<f32> {
        let t = t.clone().unwrap();
        let [_, n, _] = t.dims();
        t.narrow(2, 0, 1).reshape([n]).into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn xl_memory_keeps_the_last_states_of_whole_segments() {
        let dev = Device::flex();
        let mem = MemoryConfig::Xl(XlMemoryConfig { length: 6 }).init(2, 4, &dev).unwrap();
        let mut s = MemoryState::default();
        mem.update(&mut s, states(0, 4, &dev));
        assert_eq!(firsts(&s.memory), vec![0., 1., 2., 3.]);
        // token by token: nothing moves until the segment is complete
        for t in 4..7 {
            mem.update(&mut s, states(t, 1, &dev));
            assert_eq!(s.context_len(), t + 1);
            assert_eq!(firsts(&s.memory), vec![0., 1., 2., 3.]);
        }
        mem.update(&mut s, states(7, 1, &dev));
        assert!(s.pending.is_none());
        assert_eq!(firsts(&s.memory), vec![2., 3., 4., 5., 6., 7.]);
    }

    #[test]
    fn compressive_memory_compresses_the_oldest_states_first() {
        let dev = Device::flex();
        let cfg = CompressiveMemoryConfig {
            length: 4,
            compressed_length: 3,
            rate: 2,
            compression: CompressionKind::MeanPool,
            ..Default::default()
        };
        let mem = MemoryConfig::Compressive(cfg).init(2, 4, &dev).unwrap();
        let mut s = MemoryState::default();
        assert!(mem.update(&mut s, states(0, 4, &dev)).is_none());
        let ev = mem.update(&mut s, states(4, 4, &dev)).expect("four states evicted");
        assert_eq!(ev.states.dims(), [1, 4, 2]);
        assert_eq!(firsts(&s.memory), vec![4., 5., 6., 7.]);
        assert_eq!(firsts(&s.compressed), vec![0.5, 2.5]);
        mem.update(&mut s, states(8, 4, &dev));
        // n_cm = 3: the oldest compressed state is dropped
        assert_eq!(firsts(&s.compressed), vec![2.5, 4.5, 6.5]);
        assert_eq!(firsts(&s.memory), vec![8., 9., 10., 11.]);
        assert_eq!(firsts(&s.context()), vec![2.5, 4.5, 6.5, 8., 9., 10., 11.]);
    }
}
