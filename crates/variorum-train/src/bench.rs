//! `variorum bench`: training throughput and peak memory of a config, median of several runs.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use burn::prelude::*;
use serde::Serialize;
use variorum_data::TokenBatch;
use variorum_model::DecoderState;

use crate::config::ExperimentConfig;
use crate::step::{optimizer, train_step};
use crate::trainer::median;

/// What [`bench()`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Parameters of the model.
    pub params: usize,
    /// Training tokens per optimizer step: `batch_size × seq_len × grad_accum`.
    pub tokens_per_step: usize,
    /// Training tokens per second of each run.
    pub runs: Vec<f64>,
    /// The median of `runs`.
    pub median_tokens_per_sec: f64,
    /// Training FLOP/s at the median (3 × forward FLOPs per token).
    pub median_gflops: f64,
    /// Peak resident memory of the process (Linux `VmHWM`), MiB.
    pub peak_rss_mib: Option<f64>,
}

/// Trains on synthetic tokens (the data pipeline is not what is measured; an encoder–decoder
/// reads a source of `seq_len` random tokens beside each row): `warmup` steps, then
/// `steps` timed steps, `runs` times with a fresh model each time.
pub fn bench(cfg: &ExperimentConfig, device: &Device, warmup: u64, steps: u64, runs: usize) -> Result<BenchReport> {
    if cfg.data.graph.is_some() {
        bail!(
            "variorum bench times windows of text, and this config trains on graph examples (data.graph): its training reports tokens/s, and `variorum bench-attention --graph-degree N` times its layer with a graph"
        );
    }
    let mut cfg = cfg.clone();
    if cfg.model.vocab_size.is_none() {
        cfg.model.vocab_size = Some(256);
    }
    let tc = &cfg.train;
    let (b, l, v) = (tc.batch_size, cfg.model.seq_len, cfg.model.vocab_size.unwrap_or(256));
    let device = device.clone().autodiff();
    let masking = crate::eval::training_masking(&cfg.model);
    let batch = |i: u64| {
        let mut s = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % v as u64) as i64
        };
        let ids: Vec<i64> = (0..b * (l + 1)).map(|_| next()).collect();
        let mut inputs = Vec::with_capacity(b * l);
        let mut targets = Vec::with_capacity(b * l);
        for r in 0..b {
            inputs.extend_from_slice(&ids[r * (l + 1)..r * (l + 1) + l]);
            targets.extend_from_slice(&ids[r * (l + 1) + 1..(r + 1) * (l + 1)]);
        }
        let batch = TokenBatch {
            inputs,
            targets,
            batch_size: b,
            seq_len: l,
            reset: vec![false; b],
            tags: vec![],
            graphs: vec![],
            starts: vec![],
            // a long-term memory reads k retrieved tokens per position: the text's own, as stand-ins
            neighbours: cfg
                .model
                .long_term_memory
                .as_ref()
                .map_or(vec![], |m| (0..b * l * m.k).map(|i| ids[i % ids.len()]).collect()),
            // an encoder–decoder reads a source as long as the context (the targets' own tokens)
            sources: match cfg.model.is_encoder_decoder() {
                true => (0..b)
                    .map(|r| Arc::new(ids[r * (l + 1)..r * (l + 1) + l].iter().map(|&t| t as u32).collect()))
                    .collect(),
                false => vec![],
            },
            hidden: vec![],
        };
        match &masking {
            Some(m) => m.apply(&batch, i),
            None => batch,
        }
    };
    let mut results = Vec::new();
    let mut params = 0;
    for run in 0..runs {
        device.seed(tc.seed + run as u64);
        let mut model = cfg.model.init(&device);
        params = model.num_params();
        let mut optim = optimizer(tc);
        let mut t0 = Instant::now();
        let mut last_loss: Option<Tensor<1>> = None;
        // a memory model carries its memory from step to step, as in training
        let mut memory = model.has_memory().then(DecoderState::default);
        for i in 0..warmup + steps {
            if i == warmup {
                if let Some(l) = last_loss.take() {
                    let _ = l.into_scalar::<f32>();
                }
                t0 = Instant::now();
            }
            let micro: Vec<TokenBatch> = (0..tc.grad_accum as u64).map(|m| batch(i * 16 + m)).collect();
            let (m, res) = train_step(model, &mut optim, tc, &micro, tc.lr, &device, memory.as_mut());
            model = m.after_optimizer_step(i as usize + 1);
            last_loss = Some(res.loss);
        }
        // the trainer reads the loss once per logging interval; here once per run
        if let Some(l) = last_loss.take() {
            let _ = l.into_scalar::<f32>();
        }
        let secs = t0.elapsed().as_secs_f64();
        results.push((steps as usize * b * l * tc.grad_accum) as f64 / secs.max(1e-9));
    }
    let mut sorted = results.clone();
    let med = median(&mut sorted);
    Ok(BenchReport {
        params,
        tokens_per_step: b * l * tc.grad_accum,
        runs: results,
        median_tokens_per_sec: med,
        median_gflops: med * 3.0 * cfg.model.flops_per_token() as f64 / 1e9,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Peak resident set size of this process in MiB (Linux only).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
