//! One optimizer step: forward, backward over `grad_accum` micro-batches, global-norm clipping,
//! AdamW. Shared by the trainer and the benchmark, so both measure the same thing.

use burn::module::ParamGroup;
use burn::optim::ModuleOptimizer;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use variorum_core::AuxLosses;
use variorum_data::TokenBatch;
use variorum_model::{DecoderLm, DecoderState, Rows, Source};

use crate::adamw::FusedAdamW;
use crate::clip::clip_global_norm;
use crate::config::TrainConfig;

/// Parameters that get no weight decay: biases (GTrXL's learned gate bias among them: decay
/// would pull it to 0 and open the gate), norm gains/shifts, sinusoid frequencies, and the
/// per-head or per-distance scalars of position schemes and adaptive spans (DA's α/β, the
/// multiplicative scalars that start at 1, the span fractions, whose L1 penalty is their own
/// regulariser, RFA's learned frequency scale, which decay would flatten). nanoGPT's rule
/// otherwise: decay every matrix, embeddings included.
const NO_DECAY: &str = r"(^|\.)(bias|learned_bias|gamma|beta|frequencies|frequency_scale|alpha|scale|log_scale|span)$";

/// AdamW with decoupled weight decay on matrices only ([`FusedAdamW`]: one kernel per
/// parameter, Burn's AdamW state).
pub fn optimizer(cfg: &TrainConfig) -> ModuleOptimizer {
    let base = FusedAdamW {
        beta_1: cfg.beta1 as f32,
        beta_2: cfg.beta2 as f32,
        epsilon: cfg.eps as f32,
        weight_decay: cfg.weight_decay as f32,
    };
    let no_decay = ParamGroup::from_regex(NO_DECAY).expect("constant regex is valid");
    ModuleOptimizer::from(base).with_group(no_decay, FusedAdamW { weight_decay: 0.0, ..base }, None)
}

/// The optimizer state a checkpoint directory holds (`optim.bpk`), for `cfg`'s optimizer; a
/// file that does not load (or makes Burn panic) is an error naming it.
pub fn load_optimizer(cfg: &TrainConfig, dir: &std::path::Path) -> anyhow::Result<ModuleOptimizer> {
    let path = dir.join("optim.bpk");
    crate::checkpoint::without_panic(|| optimizer(cfg).load(&path))
        .and_then(|loaded| loaded.map_err(|e| e.to_string()))
        .map_err(|e| anyhow::anyhow!("checkpoint {} cannot be loaded: {e}", path.display()))
}

/// A batch as tensors on `device`.
pub fn batch_tensors(batch: &TokenBatch, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let shape = [batch.batch_size, batch.seq_len];
    (
        Tensor::from_data(TensorData::new(batch.inputs.clone(), shape), device),
        Tensor::from_data(TensorData::new(batch.targets.clone(), shape), device),
    )
}

/// Each row's example tag (`[batch]`), when the data is tagged (`data.tags`).
pub fn batch_tags(batch: &TokenBatch, device: &Device) -> Option<Tensor<1, Int>> {
    (!batch.tags.is_empty()).then(|| Tensor::from_data(TensorData::new(batch.tags.clone(), [batch.tags.len()]), device))
}

/// What the data says about each row besides its tokens: its tag (`data.tags`), its graph
/// (`data.graph`), its source (an encoder–decoder's examples) and its positions' retrieved
/// tokens (`data.neighbours`).
pub fn batch_rows(batch: &TokenBatch, device: &Device) -> Rows {
    let sources: Vec<Vec<u32>> = batch.sources.iter().map(|s| s.as_slice().to_vec()).collect();
    Rows {
        tags: batch_tags(batch, device),
        graph: (!batch.graphs.is_empty()).then(|| variorum_core::GraphMask::new(batch.graphs.clone())),
        source: (!sources.is_empty()).then(|| Source::from_rows(&sources, device)),
        padded: batch.targets.contains(&variorum_data::NO_TARGET),
        neighbours: (!batch.neighbours.is_empty()).then(|| {
            let shape = [batch.batch_size, batch.seq_len, batch.neighbours.len() / (batch.batch_size * batch.seq_len)];
            Tensor::from_data(TensorData::new(batch.neighbours.clone(), shape), device)
        }),
        hidden: hidden_segments(batch, device),
    }
}

/// The segments the batch hides whole for ETC's CPC, as the model reads them.
fn hidden_segments(batch: &TokenBatch, device: &Device) -> Option<variorum_model::HiddenSegments> {
    let first = batch.hidden.first()?;
    let (m, len) = (batch.hidden.len(), first.tokens.len());
    let tokens: Vec<i64> = batch.hidden.iter().flat_map(|h| h.tokens.iter().copied()).collect();
    Some(variorum_model::HiddenSegments {
        rows: batch.hidden.iter().map(|h| h.row).collect(),
        segments: batch.hidden.iter().map(|h| h.start / len).collect(),
        tokens: Tensor::from_data(TensorData::new(tokens, [m, len]), device),
    })
}

/// Result of a step, kept on the device (no host sync).
pub struct StepResult {
    /// Mean loss over the micro-batches (detached), `[1]`.
    pub loss: Tensor<1>,
    /// Global gradient norm before clipping, `[1]`.
    pub grad_norm: Option<Tensor<1>>,
    /// Each auxiliary loss (weighted, detached), mean over the micro-batches.
    pub aux: AuxLosses,
}

/// One optimizer step of `model` over `micro_batches` (`train.grad_accum` of them, gradients
/// averaged): frozen gradients dropped, the global norm clipped (`grad_clip`), AdamW at rate `lr`.
/// `memory` is a memory model's state, carried across steps and reset where a row says so.
pub fn train_step(
    model: DecoderLm,
    optim: &mut ModuleOptimizer,
    cfg: &TrainConfig,
    micro_batches: &[TokenBatch],
    lr: f64,
    device: &Device,
    mut memory: Option<&mut DecoderState>,
) -> (DecoderLm, StepResult) {
    // position parameters a stack shares are one tensor while the gradients are taken (a model
    // loaded from a checkpoint holds equal copies that are separate tensors until tied), and
    // the stepped one is every layer's afterwards
    let model = model.tie_positions();
    let n = micro_batches.len().max(1);
    let mut loss_sum: Option<Tensor<1>> = None;
    let mut acc = GradientsAccumulator::<DecoderLm>::new();
    let mut single: Option<GradientsParams> = None;
    let mut aux_sums: AuxLosses = Vec::new();
    for batch in micro_batches {
        let (inputs, targets) = batch_tensors(batch, device);
        // a memory model on ordered streams: rows start over together at the streams' start;
        // on document streams each row at its own document's start
        if let Some(m) = memory.as_deref_mut() {
            if batch.reset.iter().all(|&r| r) {
                *m = DecoderState::default();
            } else if batch.reset.iter().any(|&r| r) {
                model.reset_rows(m, &batch.reset);
            }
        }
        let (loss, aux, grads) =
            model.loss_and_grads(inputs, targets, batch_rows(batch, device), memory.as_deref_mut(), n);
        variorum_core::sum_aux_losses(&mut aux_sums, aux);
        if n == 1 {
            single = Some(grads);
        } else {
            acc.accumulate(&model, grads);
        }
        let l = loss.detach();
        loss_sum = Some(match loss_sum {
            Some(s) => s + l,
            None => l,
        });
    }
    let mut grads = single.unwrap_or_else(|| acc.grads());
    crate::freeze::drop_frozen_grads(&model, &mut grads, &cfg.freeze);
    let grad_norm = if cfg.grad_clip > 0.0 {
        clip_global_norm(&model, &mut grads, cfg.grad_clip)
    } else {
        crate::clip::global_norm(&model, &grads)
    };
    let model = optim.step(lr, model, grads).tie_positions();
    let loss = loss_sum.expect("at least one micro-batch").div_scalar(n as f64);
    let aux = aux_sums.into_iter().map(|(name, s)| (name, s.div_scalar(n as f64))).collect();
    (model, StepResult { loss, grad_norm, aux })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::{ModuleVisitor, Param};
    use variorum_attention::{AdaptiveSpanConfig, AttentionConfig};
    use variorum_position::{MultiplicativeConfig, PositionConfig};

    /// Every parameter's path, e.g. `blocks.0.attn.span`, and whether it is decayed.
    struct Paths {
        stack: Vec<String>,
        group: ParamGroup,
        found: Vec<(String, bool)>,
    }

    impl ModuleVisitor for Paths {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.stack.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.stack.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let path = self.stack.join(".");
            let exempt = self.group.matches(&param.id, Some(&path));
            self.found.push((path, !exempt));
        }
    }

    fn decayed(position: PositionConfig, attention: AttentionConfig) -> Vec<(String, bool)> {
        decayed_with(variorum_model::ModelConfig { position, attention, ..variorum_model::zoo::tiny() })
    }

    fn decayed_with(cfg: variorum_model::ModelConfig) -> Vec<(String, bool)> {
        let model = cfg.init(&Device::flex());
        let mut v = Paths { stack: Vec::new(), group: ParamGroup::from_regex(NO_DECAY).unwrap(), found: Vec::new() };
        model.visit(&mut v);
        v.found
    }

    #[test]
    fn weight_decay_falls_on_matrices_only() {
        let span = AttentionConfig::AdaptiveSpan(AdaptiveSpanConfig::default());
        let mut all = decayed(PositionConfig::Multiplicative(MultiplicativeConfig::default()), span);
        all.extend(decayed(PositionConfig::Da(Default::default()), AttentionConfig::default()));
        // GTrXL's learned gate bias, RFA's learned frequency scale
        all.extend(decayed_with(variorum_model::ModelConfig {
            position: PositionConfig::Learned(Default::default()),
            attention: AttentionConfig::Rfa(Default::default()),
            block: variorum_block::BlockConfig::Gtrxl(Default::default()),
            ..variorum_model::zoo::tiny()
        }));
        let is = |suffix: &str, want: bool| {
            let hits: Vec<_> = all.iter().filter(|(p, _)| p.ends_with(suffix)).collect();
            assert!(!hits.is_empty(), "no parameter ends with {suffix}: {all:?}");
            assert!(hits.iter().all(|(_, d)| *d == want), "{suffix}: {hits:?}");
        };
        for exempt in [".span", ".scale", ".alpha", ".beta", ".bias", ".gamma", ".learned_bias", ".frequency_scale"] {
            is(exempt, false);
        }
        for matrix in ["qkv.weight", "token_embedding.weight", "out.weight"] {
            is(matrix, true);
        }
    }
}
