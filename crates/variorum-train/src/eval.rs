//! Validation loss on a fixed set of windows (`variorum_data::spread_windows`).

use burn::prelude::*;
use indicatif::ProgressBar;
use variorum_data::{Masking, SplitTags, TokenBatch};
use variorum_model::{
    DecoderLm, DecoderState, ModelConfig, ObjectiveConfig, Rows, decoder::cross_entropy, decoder::padded_cross_entropy,
};

use crate::step::{batch_rows, batch_tensors};

/// Mean loss (nats per predicted token) of `model` over `batches`; run it on `model.valid()`.
/// Next-token batches predict every position (graph and encoder–decoder batches every position
/// up to an example's end, not its padding); masked batches ([`masked_batches`]) their hidden positions only; each
/// batch weighs by how many it predicts.
pub fn evaluate(model: &DecoderLm, batches: &[TokenBatch], device: &Device) -> f64 {
    evaluate_with(model, batches, device, None)
}

/// [`evaluate`], advancing `progress` by each batch's rows.
fn evaluate_with(model: &DecoderLm, batches: &[TokenBatch], device: &Device, progress: Option<&ProgressBar>) -> f64 {
    let mut sum = 0.0;
    let mut count = 0usize;
    for b in batches {
        let predicted = predicted(model, b);
        let (inputs, targets) = batch_tensors(b, device);
        let logits = model.forward_tagged(inputs, batch_rows(b, device), None).logits;
        let padded = !b.graphs.is_empty() || !b.sources.is_empty();
        let loss = model.rows_loss(logits, targets, padded).into_scalar::<f32>() as f64;
        sum += loss * predicted as f64;
        count += predicted;
        if let Some(pb) = progress {
            pb.inc(b.batch_size as u64);
        }
    }
    sum / count.max(1) as f64
}

/// How many positions of `batch` `model` is scored on: the hidden ones under the masked
/// objective, every one with a target otherwise (graph rows: not past an example's end).
pub fn predicted(model: &DecoderLm, batch: &TokenBatch) -> usize {
    match model.mask_token {
        Some(m) => batch.targets.iter().filter(|&&t| t != m as i64).count(),
        None => batch.targets.iter().filter(|&&t| t >= 0).count(),
    }
}

/// The masked objective's corruption of `cfg`, `None` for next-token prediction.
pub fn masking(cfg: &ModelConfig) -> Option<Masking> {
    match &cfg.objective {
        ObjectiveConfig::Causal | ObjectiveConfig::SpanCorruption(_) => None,
        ObjectiveConfig::Masked(m) => Some(Masking {
            prob: m.mask_prob,
            mask_token: m.mask_token_prob,
            random_token: m.random_token_prob,
            mask_id: cfg.mask_token().unwrap_or_default() as u32,
            vocab: cfg.vocab_size.unwrap_or_default() as u32,
            whole: None,
        }),
    }
}

/// The training corruption of `cfg`: [`masking`], plus the segments ETC's CPC hides whole
/// (`model.objective.cpc`). Evaluation leaves them out, so a masked model's validation loss
/// reads the same windows with or without CPC.
pub fn training_masking(cfg: &ModelConfig) -> Option<Masking> {
    let cpc = cfg.objective.cpc();
    let segment = cfg.attention.global_segment();
    masking(cfg).map(|m| Masking {
        whole: cpc.zip(segment).map(|(c, len)| variorum_data::WholeSegments { len, per_row: c.segments }),
        ..m
    })
}

/// Evaluation batches as the model is scored: unchanged for next-token prediction, corrupted
/// with fixed seeds (batch i: `seed + i`) under the masked objective, so every evaluation of a
/// run hides the same tokens.
pub fn masked_batches(cfg: &ModelConfig, batches: Vec<TokenBatch>, seed: u64) -> Vec<TokenBatch> {
    match masking(cfg) {
        None => batches,
        Some(m) => batches.iter().enumerate().map(|(i, b)| m.apply(b, seed.wrapping_add(i as u64))).collect(),
    }
}

/// One window of a sliding-window evaluation: inputs `ids[start..start + len]`, and only the
/// predictions from offset `from` on are counted (the earlier ones were counted by a previous
/// window, with less context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Index in the text of the window's first input token.
    pub start: usize,
    /// Offset in the window of the first prediction counted.
    pub from: usize,
}

/// Windows of `len` inputs every `stride` tokens over `n` tokens, so that each of the `n − 1`
/// predictions is counted exactly once, each with at least `len − stride` tokens of context
/// (except near the start). A last window aligned with the end picks up the remainder.
pub fn sliding_windows(n: usize, len: usize, stride: usize) -> Vec<Window> {
    let mut out = Vec::new();
    if n < 2 || len == 0 || stride == 0 {
        return out;
    }
    let len = len.min(n - 1);
    let mut covered: usize = 0; // predictions counted so far: targets 1..=covered
    let mut start = 0;
    while start + len < n {
        let end = start + len; // targets start+1 ..= end
        out.push(Window { start, from: covered.saturating_sub(start) });
        covered = end;
        start += stride;
    }
    if covered < n - 1 {
        let start = n - 1 - len;
        out.push(Window { start, from: covered - start });
    }
    out
}

/// Loss in nats per predicted token of `ids` under `model`, evaluated with windows of `len`
/// tokens every `stride` tokens ([`sliding_windows`]), each window tagged by `tags` when the
/// text is tagged. `progress` advances by one per window. Returns (mean loss, tokens counted).
pub fn sliding_loss(
    model: &DecoderLm,
    ids: &[u32],
    tags: Option<&SplitTags>,
    len: usize,
    stride: usize,
    device: &Device,
    progress: Option<&ProgressBar>,
) -> (f64, usize) {
    let windows = sliding_windows(ids.len(), len, stride);
    let len = len.min(ids.len().saturating_sub(1));
    let mut sum = 0.0;
    let mut count = 0usize;
    for group in windows.chunks(16) {
        let b = group.len();
        let inputs: Vec<i64> =
            group.iter().flat_map(|w| ids[w.start..w.start + len].iter().map(|&t| t as i64)).collect();
        let targets: Vec<i64> =
            group.iter().flat_map(|w| ids[w.start + 1..w.start + len + 1].iter().map(|&t| t as i64)).collect();
        let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, len]), device);
        let t = Tensor::<3, Int>::from_data(TensorData::new(targets, [b, len, 1]), device);
        let rows = tags.map(|tags| {
            let ids: Vec<i64> = group.iter().map(|w| i64::from(tags.window_tag(w.start, len))).collect();
            Tensor::<1, Int>::from_data(TensorData::new(ids, [b]), device)
        });
        let logits = model.forward_tagged(x, rows, None).logits;
        let logp = burn::tensor::activation::log_softmax(logits, 2).gather(2, t);
        let values = logp.into_data().try_to_vec::<f32>().unwrap_or_default();
        for (w, row) in group.iter().zip(values.chunks(len)) {
            for lp in &row[w.from..] {
                sum -= *lp as f64;
                count += 1;
            }
        }
        if let Some(pb) = progress {
            pb.inc(b as u64);
        }
    }
    (sum / count.max(1) as f64, count)
}

/// Masked-LM loss of `ids` under `model` (trained with `cfg`'s masked objective): disjoint windows
/// of `len` tokens, corrupted with fixed seeds ([`masked_batches`]), scored on the hidden tokens.
/// `progress` advances by one per window. Returns (mean loss, hidden tokens counted).
pub fn masked_loss(
    model: &DecoderLm,
    cfg: &ModelConfig,
    ids: &[u32],
    tags: Option<&SplitTags>,
    len: usize,
    device: &Device,
    progress: Option<&ProgressBar>,
) -> (f64, usize) {
    let Ok(windows) = variorum_data::eval_batches(ids, len, 16, None, tags) else { return (f64::NAN, 0) };
    let batches = masked_batches(cfg, windows, 0);
    let mask = model.mask_token.unwrap_or(usize::MAX) as i64;
    let hidden = batches.iter().map(|b| b.targets.iter().filter(|&&t| t != mask).count()).sum();
    (evaluate_with(model, &batches, device, progress), hidden)
}

/// Adaptive Computation Time's steps per token over disjoint windows of `len` tokens of `ids`:
/// the mean, and the share of tokens that took each number of steps (1, 2, …). `None` for a model
/// without ACT.
pub fn steps_per_token(model: &DecoderLm, ids: &[u32], len: usize, device: &Device) -> Option<(f64, Vec<f64>)> {
    model.act.as_ref()?;
    let len = len.min(ids.len()).max(1);
    let mut counts = vec![0usize; model.depth + 1];
    for chunk in ids.chunks_exact(len).collect::<Vec<_>>().chunks(16) {
        let flat: Vec<i64> = chunk.iter().flat_map(|w| w.iter().map(|&t| t as i64)).collect();
        let x = Tensor::<2, Int>::from_data(TensorData::new(flat, [chunk.len(), len]), device);
        let steps = model.forward(x).steps?.into_data().try_to_vec::<f32>().unwrap_or_default();
        for s in steps {
            counts[(s.round() as usize).min(model.depth)] += 1;
        }
    }
    let total: usize = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let mean = counts.iter().enumerate().map(|(n, c)| n * c).sum::<usize>() as f64 / total as f64;
    Some((mean, counts[1..].iter().map(|&c| c as f64 / total as f64).collect()))
}

/// One line: `mean 2.31 steps/token; 1: 12.0 %, 2: 45.1 %, 3: 42.9 %`.
pub fn format_steps(mean: f64, shares: &[f64]) -> String {
    let parts: Vec<String> = shares.iter().enumerate().map(|(i, s)| format!("{}: {:.1} %", i + 1, 100.0 * s)).collect();
    format!("mean {mean:.2} steps/token; {}", parts.join(", "))
}

/// Loss of a model read as `streams` contiguous streams of `ids`, segment by segment (`seg_len`
/// tokens): with `carry_memory` each segment continues from the state the previous one left
/// (Transformer-XL evaluation), without it every segment starts from nothing. Both read the same
/// segments, so the difference is what the memory is worth. `progress` advances by `streams` per
/// segment (one per window read). A model with a long-term memory reads each position's
/// neighbours from `retrieved` (the table of `ids`), when given. Returns (mean loss, tokens
/// counted).
#[allow(clippy::too_many_arguments)]
pub fn stream_loss(
    model: &DecoderLm,
    ids: &[u32],
    seg_len: usize,
    streams: usize,
    carry_memory: bool,
    retrieved: Option<&crate::retrieval::spalm::Retrieved>,
    device: &Device,
    progress: Option<&ProgressBar>,
) -> (f64, usize) {
    let streams = streams.max(1);
    let stream_len = ids.len().saturating_sub(1) / streams;
    let segments = stream_len / seg_len.max(1);
    let mut state = DecoderState::default();
    let (mut sum, mut count) = (0.0, 0usize);
    for seg in 0..segments {
        let rows = |offset: usize| -> Vec<i64> {
            (0..streams)
                .flat_map(|r| {
                    let start = r * stream_len + seg * seg_len + offset;
                    ids[start..start + seg_len].iter().map(|&t| t as i64)
                })
                .collect()
        };
        let x = Tensor::<2, Int>::from_data(TensorData::new(rows(0), [streams, seg_len]), device);
        let t = Tensor::<2, Int>::from_data(TensorData::new(rows(1), [streams, seg_len]), device);
        let starts: Vec<usize> = (0..streams).map(|r| r * stream_len + seg * seg_len).collect();
        let rows = Rows { neighbours: retrieved.map(|r| r.tensor(&starts, seg_len, device)), ..Default::default() };
        let state = if carry_memory { Some(&mut state) } else { None };
        let logits = model.forward_tagged(x, rows, state).logits;
        sum += cross_entropy(logits, t).into_scalar::<f32>() as f64 * (streams * seg_len) as f64;
        count += streams * seg_len;
        if let Some(pb) = progress {
            pb.inc(streams as u64);
        }
    }
    (sum / count.max(1) as f64, count)
}

/// Loss of a model read as document streams (`variorum_data::DocumentStreams::one_pass`): the
/// batches in order, one state carried from each to the next, a row's memory cleared where its
/// next document starts (`reset`), the padding after a document's end (`NO_TARGET`) not
/// counted. Without `carry_memory` every segment starts from nothing (what the memory is worth
/// is the difference). `progress` advances by one per batch. Returns (mean loss, predictions
/// counted), or the first error of a batch that could not be read (a prepared corpus's
/// batches are read as they are scored: `batches.iter().map(Ok)` for batches in memory).
pub fn document_loss<B: std::borrow::Borrow<TokenBatch>, E>(
    model: &DecoderLm,
    batches: impl IntoIterator<Item = Result<B, E>>,
    carry_memory: bool,
    device: &Device,
    progress: Option<&ProgressBar>,
) -> Result<(f64, usize), E> {
    let mut state = DecoderState::default();
    let (mut sum, mut count) = (0.0, 0usize);
    for batch in batches {
        let batch = batch?;
        let batch = batch.borrow();
        if batch.reset.iter().all(|&r| r) {
            state = DecoderState::default();
        } else if batch.reset.iter().any(|&r| r) {
            model.reset_rows(&mut state, &batch.reset);
        }
        let n = batch.targets.iter().filter(|&&t| t != variorum_data::NO_TARGET).count();
        let (x, t) = batch_tensors(batch, device);
        let logits =
            if carry_memory { model.forward_with(x, Some(&mut state)).logits } else { model.forward(x).logits };
        if n > 0 {
            sum += padded_cross_entropy(logits, t).into_scalar::<f32>() as f64 * n as f64;
            count += n;
        }
        if let Some(pb) = progress {
            pb.inc(1);
        }
    }
    Ok((sum / count.max(1) as f64, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_windows_count_every_prediction_once() {
        for n in [2, 3, 10, 17, 64, 100] {
            for len in [1, 4, 16, 32] {
                for stride in 1..=len {
                    let mut counted = vec![0u32; n];
                    let ws = sliding_windows(n, len, stride);
                    let l = len.min(n - 1);
                    for w in &ws {
                        assert!(w.start + l < n, "window past the end");
                        for target in w.start + 1 + w.from..=w.start + l {
                            counted[target] += 1;
                        }
                    }
                    assert!(counted[1..].iter().all(|&c| c == 1), "n {n} len {len} stride {stride}: {counted:?}");
                }
            }
        }
    }

    #[test]
    fn stride_equal_to_length_gives_disjoint_windows() {
        let ws = sliding_windows(49, 16, 16);
        assert_eq!(
            ws,
            vec![Window { start: 0, from: 0 }, Window { start: 16, from: 0 }, Window { start: 32, from: 0 }]
        );
    }
}
