//! Autoregressive sampling with the model's incremental state (KV cache).

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use variorum_model::{DecoderLm, DecoderState, Rows};

use crate::retrieval::knn_lm::Retriever;

/// Sampling settings.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    /// The most tokens generated.
    pub max_new_tokens: usize,
    /// 0 = greedy.
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep only the smallest set of most likely tokens whose probability reaches p (1 = all).
    pub top_p: f64,
    /// Recompute the whole window for every token instead of using the KV cache (for comparison).
    pub no_cache: bool,
    /// Seeds the draws of sampling.
    pub seed: u64,
    /// The example tag to generate under (`data.tags`: e.g. the play), for a model conditioned
    /// on one; `None` = untagged (tag 0).
    pub tag: Option<u32>,
}

impl SampleConfig {
    /// Greedy decoding of up to `max_new_tokens` tokens, with the cache, untagged.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { max_new_tokens, temperature: 0.0, top_k: 0, top_p: 1.0, no_cache: false, seed: 0, tag: None }
    }
}

/// `rows` copies of `tag`, the rows' tags for the model (`None` stays untagged).
pub(crate) fn tags(tag: Option<u32>, rows: usize, device: &Device) -> Option<Tensor<1, Int>> {
    tag.map(|t| Tensor::from_data(TensorData::new(vec![i64::from(t); rows], [rows]), device))
}

/// Continues `prompt` by up to `max_new_tokens` tokens; `on_token` sees each new token as it is
/// produced (for streaming). When the context (`model.seq_len`) is full, the window jumps to the
/// last three quarters of it and the cache is rebuilt, so positions stay within what the model
/// was trained on. `no_cache` recomputes the same window from scratch for every token, so both
/// paths see exactly the same context.
pub fn generate(
    model: &DecoderLm,
    prompt: &[u32],
    cfg: &SampleConfig,
    device: &Device,
    on_token: impl FnMut(u32),
) -> Vec<u32> {
    match generate_with(model, prompt, cfg, Retrieval::default(), device, on_token) {
        Ok(tokens) => tokens,
        Err(e) => unreachable!("generation without retrieval cannot fail: {e}"),
    }
}

/// What generation retrieves, when anything.
#[derive(Clone, Copy, Default)]
pub struct Retrieval<'a> {
    /// A kNN-LM datastore: each token is drawn from its mixture with the LM ([`crate::retrieval::knn_lm`]).
    pub knn: Option<&'a Retriever<'a>>,
    /// A long-term memory's neighbours (SPALM): every position fed reads its own, searched as
    /// the text grows ([`crate::retrieval::spalm::OnlineNeighbours`]).
    pub neighbours: Option<&'a crate::retrieval::spalm::OnlineNeighbours>,
}

/// [`generate`] with `retrieval`; fails only when a datastore's index does.
pub fn generate_with(
    model: &DecoderLm,
    prompt: &[u32],
    cfg: &SampleConfig,
    retrieval: Retrieval,
    device: &Device,
    mut on_token: impl FnMut(u32),
) -> anyhow::Result<Vec<u32>> {
    let next = |last: Last| -> anyhow::Result<Vec<f32>> {
        match retrieval.knn {
            Some(r) => r.next_logprobs(&last.logits, &last.features),
            None => Ok(last.logits),
        }
    };
    // positions `from..` of `all` through the model from `state`
    let feed = |all: &[u32], from: usize, state: &mut DecoderState| -> anyhow::Result<Last> {
        let neighbours = match retrieval.neighbours {
            Some(n) => Some(n.tensor(all, from..all.len(), device)?),
            None => None,
        };
        Ok(feed(model, &all[from..], cfg.tag, neighbours, state, retrieval.knn.is_some(), device))
    };
    if model.has_memory() {
        return generate_with_memory(model, prompt, cfg, feed, next, on_token);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let context = model.seq_len.max(2);
    let mut all: Vec<u32> = prompt.to_vec();
    // The model sees all[window..]; the cache holds the part of it already processed.
    let mut window = all.len().saturating_sub(context);
    let mut state = DecoderState::default();
    for _ in 0..cfg.max_new_tokens {
        if all.len() - window > context {
            window = all.len() - (context * 3 / 4).max(1);
            state = DecoderState::default();
        }
        if cfg.no_cache {
            state = DecoderState::default();
        }
        let last = feed(&all, window + state.position, &mut state)?;
        let token = pick(&next(last)?, cfg, &mut rng);
        on_token(token);
        all.push(token);
    }
    Ok(all.split_off(prompt.len()))
}

/// The model's output at the last position fed: its logits and, when asked for, the vector
/// the head read.
#[derive(Default)]
struct Last {
    logits: Vec<f32>,
    features: Vec<f32>,
}

/// Runs `tokens` (tagged `tag`, with their retrieved `neighbours` when given) through the model
/// from `state` and returns its output after the last one (with the features when `features`).
fn feed(
    model: &DecoderLm,
    tokens: &[u32],
    tag: Option<u32>,
    neighbours: Option<Tensor<3, Int>>,
    state: &mut DecoderState,
    features: bool,
    device: &Device,
) -> Last {
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let n = ids.len();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), device);
    let rows = Rows { tags: tags(tag, 1, device), neighbours, ..Default::default() };
    let out = model.forward_tagged(input, rows, Some(state));
    let last = |t: Tensor<3>| {
        let w = t.dims()[2];
        t.slice([0..1, n - 1..n, 0..w]).into_data().try_to_vec::<f32>().unwrap_or_default()
    };
    Last { logits: last(out.logits), features: if features { last(out.features) } else { Vec::new() } }
}

/// Generation for a memory model: the prompt is read segment by segment and every new token
/// continues the state, so the memory carries the whole history (nothing slides or restarts).
/// The memory holds layer inputs, not keys and values, so there is no separate cache.
fn generate_with_memory(
    model: &DecoderLm,
    prompt: &[u32],
    cfg: &SampleConfig,
    feed: impl Fn(&[u32], usize, &mut DecoderState) -> anyhow::Result<Last>,
    next: impl Fn(Last) -> anyhow::Result<Vec<f32>>,
    mut on_token: impl FnMut(u32),
) -> anyhow::Result<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let segment = model.seq_len.max(1);
    let mut all: Vec<u32> = prompt.to_vec();
    let mut state = DecoderState::default();
    let mut last = Last::default();
    for _ in 0..cfg.max_new_tokens {
        // feed what the state has not seen, never past the end of the current segment
        while state.position < all.len() {
            let room = segment - state.position % segment;
            let end = all.len().min(state.position + room);
            last = feed(&all[..end], state.position, &mut state)?;
        }
        let token = pick(&next(std::mem::take(&mut last))?, cfg, &mut rng);
        on_token(token);
        all.push(token);
    }
    Ok(all.split_off(prompt.len()))
}

/// Beam search: keeps the `beams` continuations of highest total log-probability and returns the
/// best after `max_new_tokens` tokens. All beams run as one batch; each step recomputes the last
/// `model.seq_len` tokens (no cache: reordering caches between beams is not worth it at these
/// sizes). `tag`: as [`SampleConfig::tag`].
pub fn beam_search(
    model: &DecoderLm,
    prompt: &[u32],
    beams: usize,
    max_new_tokens: usize,
    tag: Option<u32>,
    device: &Device,
) -> Vec<u32> {
    let context = model.seq_len.max(1);
    let beams = beams.max(1);
    // (tokens, total log-probability)
    let mut alive: Vec<(Vec<u32>, f64)> = vec![(prompt.to_vec(), 0.0)];
    for _ in 0..max_new_tokens {
        let len = alive[0].0.len().min(context);
        let ids: Vec<i64> = alive.iter().flat_map(|(t, _)| t[t.len() - len..].iter().map(|&x| x as i64)).collect();
        let b = alive.len();
        let x = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, len]), device);
        let logits = model.forward_tagged(x, tags(tag, b, device), None).logits;
        let v = logits.dims()[2];
        let logp = burn::tensor::activation::log_softmax(logits.slice([0..b, len - 1..len, 0..v]), 2);
        let logp: Vec<f32> = logp.into_data().try_to_vec::<f32>().unwrap_or_default();
        let mut candidates: Vec<(usize, u32, f64)> = Vec::with_capacity(b * v);
        for (i, (_, score)) in alive.iter().enumerate() {
            for t in 0..v {
                candidates.push((i, t as u32, score + logp[i * v + t] as f64));
            }
        }
        candidates.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        candidates.truncate(beams);
        alive = candidates
            .into_iter()
            .map(|(i, t, score)| {
                let mut tokens = alive[i].0.clone();
                tokens.push(t);
                (tokens, score)
            })
            .collect();
    }
    let mut best = alive.swap_remove(0).0;
    best.split_off(prompt.len())
}

/// Samples a token id from `logits` with the temperature, top-k and top-p of `cfg`.
pub fn pick(logits: &[f32], cfg: &SampleConfig, rng: &mut impl Rng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if cfg.temperature <= 0.0 || order.is_empty() {
        return order.first().copied().unwrap_or(0) as u32;
    }
    if cfg.top_k > 0 {
        order.truncate(cfg.top_k);
    }
    let max = logits[order[0]] as f64;
    let mut weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - max) / cfg.temperature).exp()).collect();
    if cfg.top_p < 1.0 {
        // nucleus: the shortest prefix of the sorted distribution whose mass reaches top_p
        let total: f64 = weights.iter().sum();
        let mut mass = 0.0;
        let mut keep = weights.len();
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= cfg.top_p {
                keep = i + 1;
                break;
            }
        }
        order.truncate(keep);
        weights.truncate(keep);
    }
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

    fn cfg(temperature: f64, top_k: usize, top_p: f64) -> SampleConfig {
        SampleConfig { max_new_tokens: 1, temperature, top_k, top_p, seed: 0, no_cache: false, tag: None }
    }

    impl SampleConfig {
        fn with_tokens(mut self, n: usize) -> Self {
            self.max_new_tokens = n;
            self
        }
    }

    #[test]
    fn beam_search_finds_at_least_the_greedy_probability() {
        let dev = Device::flex();
        dev.seed(8);
        let model = variorum_model::zoo::tiny().init(&dev);
        let prompt = [3u32, 1, 4];
        let greedy = generate(&model, &prompt, &cfg(0.0, 0, 1.0).with_tokens(10), &dev, |_| {});
        assert_eq!(beam_search(&model, &prompt, 1, 10, None, &dev), greedy, "one beam is greedy decoding");
        let beam = beam_search(&model, &prompt, 4, 10, None, &dev);
        let logprob = |cont: &[u32]| {
            let all: Vec<i64> = prompt.iter().chain(cont).map(|&t| t as i64).collect();
            let n = all.len();
            let x = Tensor::<2, Int>::from_data(TensorData::new(all[..n - 1].to_vec(), [1, n - 1]), &dev);
            let t = Tensor::<3, Int>::from_data(TensorData::new(all[1..].to_vec(), [1, n - 1, 1]), &dev);
            let lp = burn::tensor::activation::log_softmax(model.forward(x).logits, 2).gather(2, t);
            lp.slice([0..1, prompt.len() - 1..n - 1, 0..1]).sum().into_scalar::<f32>()
        };
        assert!(logprob(&beam) >= logprob(&greedy) - 1e-4, "beam {} < greedy {}", logprob(&beam), logprob(&greedy));
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(pick(&[0.1, 3.0, -1.0], &cfg(0.0, 0, 1.0), &mut rng), 1);
    }

    #[test]
    fn top_k_never_leaves_the_top_k() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let logits = [1.0, 0.9, 0.8, 0.7, 0.6];
        let mut seen = [false; 5];
        for _ in 0..500 {
            let t = pick(&logits, &cfg(2.0, 2, 1.0), &mut rng) as usize;
            assert!(t < 2, "top-2 emitted token {t}");
            seen[t] = true;
        }
        assert!(seen[0] && seen[1], "both of the top 2 must be reachable");
    }

    #[test]
    fn top_p_never_leaves_the_nucleus() {
        // probabilities ≈ 0.64, 0.24, 0.09, 0.03: the 0.8-nucleus is {0, 1}
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut seen = [false; 4];
        for _ in 0..500 {
            let t = pick(&logits, &cfg(1.0, 0, 0.8), &mut rng) as usize;
            assert!(t < 2, "the 0.8-nucleus emitted token {t}");
            seen[t] = true;
        }
        assert!(seen[0] && seen[1]);
        // without top_p every token appears
        let mut all = [false; 4];
        for _ in 0..2000 {
            all[pick(&logits, &cfg(1.0, 0, 1.0), &mut rng) as usize] = true;
        }
        assert!(all.iter().all(|&x| x));
    }
}
