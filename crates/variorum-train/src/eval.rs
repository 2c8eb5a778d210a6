//! Validation loss on a fixed set of windows (`variorum_data::spread_windows`).

use burn::prelude::*;
use variorum_data::TokenBatch;
use variorum_model::{DecoderLm, decoder::cross_entropy};

use crate::step::batch_tensors;

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
