//! Validation loss on a fixed set of windows.

use burn::prelude::*;
use variorum_data::TokenBatch;
use variorum_model::{DecoderLm, decoder::cross_entropy};

use crate::step::batch_tensors;

/// `n` windows of `seq_len + 1` tokens spread evenly over `tokens` (window i starts at
/// ⌊i·(len − seq_len − 1)/(n − 1)⌋), grouped into batches of `batch_size`. Deterministic, and it
/// covers the whole split rather than its beginning; the PyTorch reference uses the same rule.
pub fn spread_windows(tokens: &[u32], seq_len: usize, n: usize, batch_size: usize) -> Vec<TokenBatch> {
    let span = tokens.len().saturating_sub(seq_len + 1);
    let starts: Vec<usize> = (0..n).map(|i| if n > 1 { i * span / (n - 1) } else { 0 }).collect();
    starts
        .chunks(batch_size.max(1))
        .map(|chunk| {
            let mut inputs = Vec::with_capacity(chunk.len() * seq_len);
            let mut targets = Vec::with_capacity(chunk.len() * seq_len);
            for &s in chunk {
                inputs.extend(tokens[s..s + seq_len].iter().map(|&t| t as i64));
                targets.extend(tokens[s + 1..s + seq_len + 1].iter().map(|&t| t as i64));
            }
            TokenBatch { inputs, targets, batch_size: chunk.len(), seq_len, reset: vec![true; chunk.len()] }
        })
        .collect()
}

/// Mean next-token loss (nats per token) of `model` over `batches`; run it on `model.valid()`.
pub fn evaluate(model: &DecoderLm, batches: &[TokenBatch], device: &Device) -> f64 {
    let mut sum = 0.0;
    let mut count = 0usize;
    for b in batches {
        let (inputs, targets) = batch_tensors(b, device);
        let loss = cross_entropy(model.forward(inputs).logits, targets).into_scalar::<f32>() as f64;
        sum += loss * b.batch_size as f64;
        count += b.batch_size;
    }
    sum / count.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_windows_cover_the_split_end_to_end() {
        let tokens: Vec<u32> = (0..100).collect();
        let b = spread_windows(&tokens, 9, 5, 2);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].inputs[0], 0);
        assert_eq!(b[2].inputs[0], 90, "last window ends at the last token");
        assert_eq!(*b[2].targets.last().unwrap(), 99);
        assert_eq!(b[0].targets[0], 1);
    }
}
