//! Autoregressive sampling with the model's incremental state (KV cache).

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use variorum_model::{DecoderLm, DecoderState};

/// Sampling settings.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    pub max_new_tokens: usize,
    /// 0 = greedy.
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    pub seed: u64,
}

/// Continues `prompt` by up to `max_new_tokens` tokens; `on_token` sees each new token as it is
/// produced (for streaming). When the context (`model.seq_len`) is full, the state is rebuilt from
/// the last three quarters of the context, so positions stay within what the model was trained on.
pub fn generate(
    model: &DecoderLm,
    prompt: &[u32],
    cfg: &SampleConfig,
    device: &Device,
    mut on_token: impl FnMut(u32),
) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let context = model.seq_len.max(2);
    let mut all: Vec<u32> = prompt.to_vec();
    let mut state = DecoderState::default();
    let start = all.len().saturating_sub(context);
    let mut pending: Vec<u32> = all[start..].to_vec();
    for _ in 0..cfg.max_new_tokens {
        if state.position + pending.len() > context {
            let keep = (context * 3 / 4).max(1);
            state = DecoderState::default();
            pending = all[all.len().saturating_sub(keep)..].to_vec();
        }
        let ids: Vec<i64> = pending.iter().map(|&t| t as i64).collect();
        let n = ids.len();
        let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), device);
        let logits = model.forward_with(input, Some(&mut state)).logits;
        let v = logits.dims()[2];
        let last: Vec<f32> = logits.slice([0..1, n - 1..n, 0..v]).into_data().try_to_vec::<f32>().unwrap_or_default();
        let next = pick(&last, cfg.temperature, cfg.top_k, &mut rng);
        on_token(next);
        all.push(next);
        pending = vec![next];
    }
    all.split_off(prompt.len())
}

/// Samples a token id from `logits`.
pub fn pick(logits: &[f32], temperature: f64, top_k: usize, rng: &mut impl Rng) -> u32 {
    let argmax = || {
        logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
    };
    if temperature <= 0.0 || logits.is_empty() {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let max = logits[order[0]] as f64;
    let weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - max) / temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut r = rng.random::<f64>() * total;
    for (w, &i) in weights.iter().zip(&order) {
        if r < *w {
            return i as u32;
        }
        r -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_top_k_restricts() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(pick(&[0.1, 3.0, -1.0], 0.0, 0, &mut rng), 1);
        for _ in 0..50 {
            let t = pick(&[1.0, 0.9, 0.8, -5.0], 1.0, 2, &mut rng);
            assert!(t == 0 || t == 1);
        }
    }
}
