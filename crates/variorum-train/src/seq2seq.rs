//! Generation from a source (encoder–decoder models): the encoder runs once, its output and each
//! decoder layer's cross-attention keys and values stay in the state ([`DecoderState::source`],
//! `LayerState::cross`), and the decoder writes the target token by token after the start token
//! (the end token, unless the model names another) until it writes the end token or fills the
//! context.

use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use variorum_core::EncodedSource;
use variorum_data::{
    Corpus, DataError, PairBatches, SpanCorruption, SpanShape, TargetTokens, TokenBatch, Tokenizer, pair_eval_batches,
    span_eval_batches,
};
use variorum_model::{DecoderLm, DecoderState, ModelConfig, Rows, Source};

use crate::generate::{SampleConfig, pick, tags};

/// How span corruption cuts `model`'s windows, when it trains by span corruption.
pub fn span_shape(model: &ModelConfig) -> Option<SpanShape> {
    let variorum_model::ObjectiveConfig::SpanCorruption(c) = &model.objective else { return None };
    let (noise, spans) = c.noise(model.seq_len);
    let (_, first) = model.sentinels()?;
    let end = model.end_token()? as u32;
    Some(SpanShape { window: model.seq_len, noise, spans, end, first_sentinel: first as u32 })
}

/// The tokens that frame an encoder–decoder's targets (`None` for a decoder).
pub fn target_tokens(model: &ModelConfig) -> Option<TargetTokens> {
    Some(TargetTokens { start: model.start_token()? as u32, end: model.end_token()? as u32 })
}

/// An encoder–decoder's training batches: random pairs (`data.pairs`) or corrupted windows of
/// the training text. `None` for a decoder.
pub fn training_examples(
    model: &ModelConfig,
    corpus: &Corpus,
    batch_size: usize,
    seed: u64,
) -> Result<Option<ExampleBatches>, DataError> {
    let Some(tokens) = target_tokens(model) else { return Ok(None) };
    if corpus.prepared.is_some() {
        return Err(DataError::Config(
            "an encoder–decoder does not read a prepared corpus (data.sources / data.prepared) yet: use data.path"
                .into(),
        ));
    }
    Ok(Some(match (&corpus.pairs, span_shape(model)) {
        (Some(p), _) => ExampleBatches::Pairs(PairBatches::new(
            p.train.clone(),
            &corpus.path,
            model.seq_len,
            tokens,
            batch_size,
            seed,
        )?),
        (None, Some(shape)) => ExampleBatches::Spans(SpanCorruption::new(
            std::sync::Arc::new(corpus.train.clone()),
            shape,
            batch_size,
            seed,
        )?),
        (None, None) => return Err(DataError::Config("an encoder–decoder needs data.pairs or span corruption".into())),
    }))
}

/// An encoder–decoder's validation batches: the first `max_rows` validation pairs, or as many
/// corrupted windows spread over the validation text (the same every time). `None` for a decoder.
pub fn validation_examples(
    model: &ModelConfig,
    corpus: &Corpus,
    max_rows: usize,
    batch_size: usize,
) -> Result<Option<Vec<TokenBatch>>, DataError> {
    let Some(tokens) = target_tokens(model) else { return Ok(None) };
    Ok(Some(match (&corpus.pairs, span_shape(model)) {
        (Some(p), _) => pair_eval_batches(&p.val, &corpus.path, model.seq_len, tokens, max_rows, batch_size)?,
        (None, Some(shape)) => span_eval_batches(&corpus.val, shape, max_rows, batch_size)?,
        (None, None) => return Err(DataError::Config("an encoder–decoder needs data.pairs or span corruption".into())),
    }))
}

/// An encoder–decoder's training examples, one kind or the other.
#[derive(Debug, Clone)]
pub enum ExampleBatches {
    /// Random source–target pairs (`data.pairs`).
    Pairs(PairBatches),
    /// Span-corrupted windows of a plain text (T5).
    Spans(SpanCorruption),
}

impl ExampleBatches {
    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        match self {
            Self::Pairs(b) => b.batch(step),
            Self::Spans(b) => b.batch(step),
        }
    }
}

/// Token ids as text, the special tokens past the text vocabulary (`vocab`) by name: `</s>`,
/// and span corruption's sentinels `<s0>`, `<s1>`, ….
pub fn show(tokens: &[u32], tokenizer: &Tokenizer, vocab: usize) -> String {
    text_with(tokens, tokenizer, vocab, |i| match i {
        0 => "</s>".into(),
        i => format!("<s{}>", i - 1),
    })
}

/// Token ids as the text chrF compares: special tokens as a space (which chrF removes), so that
/// sentinels written in the right places earn nothing by their names.
pub fn text_only(tokens: &[u32], tokenizer: &Tokenizer, vocab: usize) -> String {
    text_with(tokens, tokenizer, vocab, |_| " ".into())
}

fn text_with(tokens: &[u32], tokenizer: &Tokenizer, vocab: usize, special: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    let mut run = Vec::new();
    for &t in tokens {
        if (t as usize) < vocab {
            run.push(t);
            continue;
        }
        out.push_str(&tokenizer.decode(&run));
        run.clear();
        out.push_str(&special(t as usize - vocab));
    }
    out.push_str(&tokenizer.decode(&run));
    out
}

/// What `variorum eval` measures of an encoder–decoder on its validation examples.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleScores {
    /// Examples scored, and the target tokens predicted (each target and its end token).
    pub examples: usize,
    /// Target tokens predicted: every target's tokens and its end token.
    pub target_tokens: usize,
    /// Mean loss per target token, nats.
    pub loss: f64,
    /// Examples decoded, and the corpus chrF (sacreBLEU's chrF2, [`crate::chrf`]) of what the
    /// model wrote for them against their targets.
    pub decoded: usize,
    /// Their corpus chrF, 0 to 100.
    pub chrf: f64,
}

/// The loss per target token of `model` over `batches` (examples with their sources), and the
/// chrF of the targets it writes for the first `decode` of them from their sources alone:
/// greedy, or beam search with `beams` > 1. Special tokens are left out of the comparison
/// ([`text_only`]). `on_decoded` is called after each decoded example.
pub fn score_examples(
    model: &DecoderLm,
    batches: &[TokenBatch],
    tokenizer: &Tokenizer,
    vocab: usize,
    beams: usize,
    decode: usize,
    device: &Device,
    mut on_decoded: impl FnMut(),
) -> ExampleScores {
    let loss = crate::eval::evaluate(model, batches, device);
    let target_tokens = batches.iter().map(|b| crate::eval::predicted(model, b)).sum();
    let examples = batches.iter().map(|b| b.batch_size).sum();
    let greedy = SampleConfig::greedy(model.seq_len);
    let (mut written, mut wanted) = (Vec::new(), Vec::new());
    'all: for b in batches {
        for (r, source) in b.sources.iter().enumerate() {
            if written.len() >= decode {
                break 'all;
            }
            let row = &b.targets[r * b.seq_len..(r + 1) * b.seq_len];
            // the target without its end token
            let target: Vec<u32> = row.iter().take_while(|&&t| t >= 0).map(|&t| t as u32).collect();
            let target = &target[..target.len().saturating_sub(1)];
            let out = if beams > 1 {
                beam_search_from(model, source, beams, model.seq_len, device)
            } else {
                generate_from(model, source, &greedy, device, |_| {})
            };
            written.push(text_only(&out, tokenizer, vocab));
            wanted.push(text_only(target, tokenizer, vocab));
            on_decoded();
        }
    }
    let (w, t): (Vec<&str>, Vec<&str>) =
        (written.iter().map(String::as_str).collect(), wanted.iter().map(String::as_str).collect());
    let chrf = crate::chrf::Chrf::default().corpus(&w, &t);
    ExampleScores { examples, target_tokens, loss, decoded: written.len(), chrf }
}

/// The longest target the model writes: its context less the start token.
fn max_target(model: &DecoderLm, asked: usize) -> usize {
    asked.min(model.seq_len.saturating_sub(1))
}

/// The target for `source` (token ids) by sampling `cfg` (temperature 0: greedy), without the
/// end token. `on_token` sees each token as it is produced. `cfg.no_cache` runs the encoder and
/// the whole prefix again for every token (for comparison).
pub fn generate_from(
    model: &DecoderLm,
    source: &[u32],
    cfg: &SampleConfig,
    device: &Device,
    mut on_token: impl FnMut(u32),
) -> Vec<u32> {
    let end = model.end_token.expect("an encoder–decoder model") as u32;
    let start = model.start_token.expect("an encoder–decoder model") as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let source = Source::from_rows(&[source.to_vec()], device);
    let mut written: Vec<u32> = vec![start];
    let mut state = DecoderState::default();
    let mut fresh = true;
    let mut out = Vec::new();
    for _ in 0..max_target(model, cfg.max_new_tokens) {
        if cfg.no_cache {
            (state, fresh) = (DecoderState::default(), true);
        }
        let new = &written[state.position..];
        let rows = Rows { tags: tags(cfg.tag, 1, device), source: fresh.then(|| source.clone()), ..Default::default() };
        let logits = model.forward_tagged(ids(&[new.to_vec()], device), rows, Some(&mut state)).logits;
        fresh = false;
        let [_, n, v] = logits.dims();
        let last = logits.slice([0..1, n - 1..n, 0..v]).into_data().try_to_vec::<f32>().unwrap_or_default();
        let next = pick(&last, cfg, &mut rng);
        if next == end {
            break;
        }
        on_token(next);
        out.push(next);
        written.push(next);
    }
    out
}

/// Beam search from `source`: keeps the `beams` prefixes of highest total log-probability; a
/// prefix that writes the end token is finished. Stops when `beams` are finished (or none is
/// left alive, or the target is `max_new_tokens` long) and returns the finished target of
/// highest log-probability per token (a length penalty of 1, fairseq's default; an unfinished
/// prefix competes when nothing finished), without the end token. The encoder runs once; each
/// step runs every alive prefix in one batch from scratch over the kept encoder output.
pub fn beam_search_from(
    model: &DecoderLm,
    source: &[u32],
    beams: usize,
    max_new_tokens: usize,
    device: &Device,
) -> Vec<u32> {
    let end = model.end_token.expect("an encoder–decoder model") as u32;
    let start = model.start_token.expect("an encoder–decoder model") as u32;
    let beams = beams.max(1);
    let (encoded, _) = model.encode(&Source::from_rows(&[source.to_vec()], device));
    // (target so far after the start token, total log-probability)
    let mut alive: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
    let mut finished: Vec<(Vec<u32>, f64)> = Vec::new();
    for _ in 0..max_target(model, max_new_tokens) {
        let b = alive.len();
        let rows: Vec<Vec<u32>> =
            alive.iter().map(|(t, _)| std::iter::once(start).chain(t.iter().copied()).collect()).collect();
        let len = rows[0].len();
        let mut state = DecoderState { source: Some(repeat(&encoded, b)), ..Default::default() };
        let logits = model.forward_tagged(ids(&rows, device), None, Some(&mut state)).logits;
        let v = logits.dims()[2];
        let logp = burn::tensor::activation::log_softmax(logits.slice([0..b, len - 1..len, 0..v]), 2);
        let logp: Vec<f32> = logp.into_data().try_to_vec::<f32>().unwrap_or_default();
        let mut candidates: Vec<(usize, u32, f64)> = Vec::with_capacity(b * v);
        for (i, (_, score)) in alive.iter().enumerate() {
            candidates.extend((0..v).map(|t| (i, t as u32, score + f64::from(logp[i * v + t]))));
        }
        candidates.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        let mut next = Vec::with_capacity(beams);
        for (i, t, score) in candidates.into_iter().take(beams) {
            let target = alive[i].0.clone();
            if t == end {
                finished.push((target, score));
            } else {
                let mut target = target;
                target.push(t);
                next.push((target, score));
            }
        }
        alive = next;
        if finished.len() >= beams || alive.is_empty() {
            break;
        }
    }
    // log-probability per token, the end token counted for finished targets
    let per_token = |(t, s): &(Vec<u32>, f64), done: bool| s / (t.len() + usize::from(done)).max(1) as f64;
    let best_done = finished.iter().max_by(|a, b| per_token(a, true).total_cmp(&per_token(b, true)));
    match best_done {
        Some((t, _)) => t.clone(),
        None => alive.into_iter().next().map(|(t, _)| t).unwrap_or_default(),
    }
}

fn repeat(e: &EncodedSource, n: usize) -> EncodedSource {
    let [_, l, d] = e.hidden.dims();
    EncodedSource {
        hidden: e.hidden.clone().expand([n, l, d]),
        padding: e.padding.clone().map(|p| p.int().expand([n, l]).equal_elem(1)),
    }
}

fn ids(rows: &[Vec<u32>], device: &Device) -> Tensor<2, Int> {
    let (b, n) = (rows.len(), rows[0].len());
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().map(|&t| i64::from(t))).collect();
    Tensor::from_data(TensorData::new(flat, [b, n]), device)
}
