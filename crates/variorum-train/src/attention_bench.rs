//! `variorum bench-attention`: one attention layer on its own, as the efficiency papers measure
//! it — forward + backward time and peak memory against the sequence length, and the cost of
//! decoding one more token against the length of the context already decoded.
//!
//! Each figure is taken in a fresh process (the CLI runs itself once per point), so the peak
//! resident memory is that point's alone and an allocation the machine cannot give ends that
//! process, not the benchmark.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use serde::{Deserialize, Serialize};
use variorum_attention::{Attention, AttentionConfig, AttentionInput, AttentionState, Positioning};
use variorum_core::{AttentionMask, GlobalLocal, GraphMask};
use variorum_position::PositionConfig;

use crate::bench::peak_rss_mib;
use crate::trainer::median;

/// One measured point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttentionPoint {
    /// Median seconds: of a forward + backward (training), or per decoded token (generation).
    pub seconds: f64,
    /// Peak resident memory of the measuring process above what it held before the first run,
    /// MiB, with freed pages kept for reuse as training keeps them ([`crate::allocator`]): what
    /// the allocator kept from earlier tensors of other sizes counts.
    pub peak_mib: Option<f64>,
    /// The same measured in a process that hands freed pages back at once
    /// ([`crate::allocator::return_freed_pages`]): what the layer's tensors need at their peak
    /// (training points; filled in by the caller).
    #[serde(default)]
    pub needed_mib: Option<f64>,
    /// On a GPU: the bytes Burn's memory pools hold on the device after the runs, MiB — their
    /// peak, as pools keep the pages they took for reuse (filled in by the caller, which knows
    /// whether the device is one). `None` on the CPU.
    #[serde(default)]
    pub device_mib: Option<f64>,
}

/// The layer a model of context `len` would have: a fixed-length kind (Linformer) is built for
/// that length.
fn layer(cfg: &AttentionConfig, position: &PositionConfig, d_model: usize, len: usize, device: &Device) -> Attention {
    cfg.for_length(len).init(d_model, 0.02, 0.02, Positioning { config: position, context: len }, device)
}

fn current_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

/// Resets the peak-RSS watermark (Linux: writing 5 to clear_refs); false where it cannot.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A seeded random graph over `len` positions in which each position reads `degree` others
/// (drawn uniformly, repeats merged), for the kinds that read a graph (`data.graph`).
pub fn random_graph(len: usize, degree: usize, seed: u64) -> GraphMask {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let lists = (0..len)
        .map(|i| {
            let mut l: Vec<u32> =
                (0..degree).map(|_| rng.random_range(0..len) as u32).filter(|&j| j as usize != i).collect();
            l.sort_unstable();
            l.dedup();
            l
        })
        .collect();
    GraphMask::new(vec![std::sync::Arc::new(lists)])
}

/// Forward + backward of a self-attention layer (causal or bidirectional) over `[1, len, d_model]`: median seconds
/// of `reps` runs, after one untimed run. `graph`: a graph on the mask (kinds that read one).
#[allow(clippy::too_many_arguments)]
pub fn training(
    cfg: &AttentionConfig,
    position: &PositionConfig,
    d_model: usize,
    len: usize,
    reps: usize,
    causal: bool,
    graph: Option<GraphMask>,
    device: &Device,
) -> AttentionPoint {
    let device = device.clone().autodiff();
    let attn = layer(cfg, position, d_model, len, &device);
    // ETC: the global tokens of the finished segments in front, as its model puts them
    let globals = attn.global_segment().map_or(0, |s| len.saturating_sub(1) / s);
    let x: Tensor<3> =
        Tensor::random([1, globals + len, d_model], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    let mask = match attn.global_segment() {
        Some(_) => AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), ..mask },
        None => mask,
    };
    // with a graph, the dense mask a model builds once for every layer (its non-edges among it)
    let dense = match &graph {
        Some(_) if attn.uses_dense_mask() => mask.clone().with_graph(graph.clone()).score_mask(len, len, &device),
        _ => None,
    };
    let mask = mask.with_graph(graph);
    let base = current_rss_mib();
    reset_peak();
    let mut times = Vec::new();
    for i in 0..reps + 1 {
        let t0 = Instant::now();
        let input = AttentionInput::self_attention(x.clone(), &mask).with_dense_mask(dense.clone());
        let out = attn.forward(input, None).context;
        let grads = out.sum().backward();
        // the gradient of the input is where the whole backward ends: reading it waits for it
        let _ = x.grad(&grads).map(|g| g.sum().into_scalar::<f32>());
        if i > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    AttentionPoint { seconds: median(&mut times), peak_mib: peak_above(base), needed_mib: None, device_mib: None }
}

/// Peak resident memory since the last [`reset_peak`] above `base`, MiB.
fn peak_above(base: Option<f64>) -> Option<f64> {
    peak_rss_mib().zip(base).map(|(p, b)| (p - b).max(0.0))
}

/// Decoding after `context` tokens (fed in chunks of at most 1024): median seconds per new
/// token over `tokens` single-token steps, with the layer's incremental state (KV cache or
/// recurrent sums).
pub fn generation(
    cfg: &AttentionConfig,
    position: &PositionConfig,
    d_model: usize,
    context: usize,
    tokens: usize,
    device: &Device,
) -> AttentionPoint {
    let attn = layer(cfg, position, d_model, context + tokens, device);
    let mut state = AttentionState::default();
    let base = current_rss_mib();
    reset_peak();
    let mut fed = 0;
    // ETC: the context in one fresh call with its finished segments' global tokens in front
    let mut globals = 0;
    if let Some(s) = attn.global_segment().filter(|_| context > 0) {
        globals = (context - 1) / s;
        let x: Tensor<3> = Tensor::random([1, globals + context, d_model], Distribution::Normal(0.0, 1.0), device);
        let mask = AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), ..AttentionMask::causal() };
        let out = attn.forward(AttentionInput::self_attention(x, &mask), Some(&mut state)).context;
        let _ = out.sum().into_scalar::<f32>();
        fed = context;
    }
    while fed < context {
        let n = (context - fed).min(1024);
        let x: Tensor<3> = Tensor::random([1, n, d_model], Distribution::Normal(0.0, 1.0), device);
        let mask = AttentionMask::causal().at(fed, 0);
        let out = attn.forward(AttentionInput::self_attention(x, &mask), Some(&mut state)).context;
        let _ = out.sum().into_scalar::<f32>();
        fed += n;
    }
    // ETC: each finished segment's global token, as its model runs them while decoding
    let mut finish_segments = |state: &mut AttentionState, at: usize| {
        while attn.global_segment().is_some_and(|s| globals < at / s) {
            let x: Tensor<3> = Tensor::random([1, 1, d_model], Distribution::Normal(0.0, 1.0), device);
            let mask = AttentionMask {
                global_local: Some(GlobalLocal::Auxiliary { segment: globals }),
                ..AttentionMask::causal().at(at, 0)
            };
            let _ = attn.forward(AttentionInput::self_attention(x, &mask), Some(state)).context;
            globals += 1;
        }
    };
    let mut times = Vec::new();
    for t in 0..tokens {
        let x: Tensor<3> = Tensor::random([1, 1, d_model], Distribution::Normal(0.0, 1.0), device);
        let mask = AttentionMask::causal().at(context + t, 0);
        finish_segments(&mut state, context + t);
        let t0 = Instant::now();
        let out = attn.forward(AttentionInput::self_attention(x, &mask), Some(&mut state)).context;
        let _ = out.sum().into_scalar::<f32>();
        times.push(t0.elapsed().as_secs_f64());
    }
    AttentionPoint { seconds: median(&mut times), peak_mib: peak_above(base), needed_mib: None, device_mib: None }
}

/// Bytes a forward + backward of full attention needs for its `len × len` score matrices
/// (scores, probabilities and their gradients, per head), or `None` for kinds that never form
/// one (sparse kinds score a band, kernelised kinds nothing).
pub fn score_bytes(cfg: &AttentionConfig, d_model: usize, len: usize) -> Option<u64> {
    if !cfg.scores_every_key() {
        return None;
    }
    let heads = cfg.heads(d_model).n_heads as u64;
    Some(4 * heads * (len as u64).pow(2) * 4)
}

/// Memory the system could still give, MiB (Linux `MemAvailable`).
pub fn available_mib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_measurements_run_for_a_linear_and_a_full_layer() {
        let dev = Device::flex();
        for cfg in [AttentionConfig::default(), toml::from_str("kind = \"linear\"").unwrap()] {
            let t = training(&cfg, &PositionConfig::None(Default::default()), 16, 32, 1, true, None, &dev);
            assert!(t.seconds > 0.0);
            let g = generation(&cfg, &PositionConfig::None(Default::default()), 16, 40, 3, &dev);
            assert!(g.seconds > 0.0);
        }
        assert!(score_bytes(&AttentionConfig::default(), 256, 1024).unwrap() > 0);
        assert!(score_bytes(&toml::from_str("kind = \"performer\"").unwrap(), 256, 1024).is_none());
        // a sparse kind forms scores, but never the L × L matrix
        assert!(score_bytes(&toml::from_str("kind = \"sliding-window\"").unwrap(), 256, 1024).is_none());
    }
}
