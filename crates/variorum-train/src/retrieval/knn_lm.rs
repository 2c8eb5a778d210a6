//! The kNN-LM over a trained run (Khandelwal et al. 2020): a datastore of (context vector, next
//! token) built with the run's model over a text, and the run scored and sampled with
//! p = λ p_kNN + (1 − λ) p_LM ([`variorum_retrieval::knn`]).
//!
//! A key is the vector the output head reads at a position (the last block's output after the
//! final norm of a pre-LN stack). Khandelwal et al. take the last block's feed-forward input
//! after its layer norm, which they found slightly better; the head's input needs no hook into
//! the blocks and works for every block kind. Keys come from sliding windows of the text
//! ([`crate::eval::sliding_windows`]), the same windows `variorum eval` scores with, so each
//! key sees the context its position is scored with.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use sha2::{Digest, Sha256};
use variorum_model::DecoderLm;
use variorum_retrieval::search::HnswParams;
use variorum_retrieval::{Datastore, DatastoreWriter, KnnConfig, Neighbour, Origin, SearchMode};

use crate::eval::{Window, sliding_windows};
use crate::run::Run;

/// What a key is, recorded in the datastore.
pub const KEY_KIND: &str = "head-input";

/// Windows per forward (and per committed group of entries while building).
const GROUP: usize = 16;

/// Refuses runs kNN-LM cannot read with windows of plain next-token prediction.
pub fn check_run(run: &Run) -> Result<()> {
    let m = &run.config.model;
    let why = if m.is_encoder_decoder() {
        Some("an encoder–decoder (its predictions depend on a source)")
    } else if run.model.mask_token.is_some() {
        Some("trained with the masked objective (it predicts hidden tokens, not the next one)")
    } else if run.model.has_memory() {
        Some("a memory model (its states depend on the segments before the window)")
    } else if m.long_term_memory.is_some() {
        Some("a model with a long-term memory (it reads its own neighbour tables)")
    } else if run.config.data.graph.is_some() {
        Some("trained on graph examples")
    } else if m.attention.tags().is_some() {
        Some("conditioned on example tags")
    } else {
        None
    };
    match why {
        Some(why) => bail!("{} is {why}: kNN-LM reads plain decoder runs", run.dir.display()),
        None => Ok(()),
    }
}

/// SHA-256 of a file, hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(hex(&Sha256::digest(&bytes)))
}

/// SHA-256 of token ids (u32 little-endian), hex.
pub fn ids_sha256(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_le_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The model on one group of windows: its features (`b·len` rows of `d_model`) and its
/// log-probabilities of the targets (`b·len`).
pub(crate) struct GroupOutput {
    pub(crate) features: Vec<f32>,
    pub(crate) logprobs: Vec<f32>,
}

pub(crate) fn forward_group(
    model: &DecoderLm,
    ids: &[u32],
    group: &[Window],
    len: usize,
    device: &Device,
) -> Result<GroupOutput> {
    let b = group.len();
    let inputs: Vec<i64> = group.iter().flat_map(|w| ids[w.start..w.start + len].iter().map(|&t| t as i64)).collect();
    let targets: Vec<i64> =
        group.iter().flat_map(|w| ids[w.start + 1..w.start + len + 1].iter().map(|&t| t as i64)).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, len]), device);
    let t = Tensor::<3, Int>::from_data(TensorData::new(targets, [b, len, 1]), device);
    let out = model.forward_tagged(x, None, None);
    // the same arithmetic as `eval::sliding_loss`, so λ = 0 reproduces its loss to the bit
    let floats = |t: Tensor<3>| {
        t.into_data().try_to_vec::<f32>().map_err(|e| anyhow::anyhow!("the model's output is not f32: {e:?}"))
    };
    let logprobs = floats(log_softmax(out.logits, 2).gather(2, t))?;
    Ok(GroupOutput { features: floats(out.features)?, logprobs })
}

/// Settings of a datastore build.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    /// Window length (default: the model's context).
    pub window: usize,
    /// Tokens between window starts.
    pub stride: usize,
    /// The HNSW index's build settings.
    pub index: HnswParams,
}

/// How a build ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Built {
    /// Every entry written and the index built.
    Complete,
    /// Stopped on request with everything so far committed: the same build resumes.
    Interrupted {
        /// Entries committed.
        entries: u64,
        /// Entries in the index so far.
        indexed: u64,
    },
}

/// Entries (one per predicted position) and the key width of a datastore over `n` tokens.
pub fn planned_entries(n: usize, settings: &BuildSettings) -> u64 {
    let len = settings.window.min(n.saturating_sub(1));
    sliding_windows(n, settings.window, settings.stride).iter().map(|w| (len - w.from) as u64).sum()
}

/// Builds (or finishes) the datastore in `out` over `ids` (described as `text`) with `run`'s
/// model: keys and values first, committed group by group, then the index. `progress(stage,
/// done, total)` hears both stages (`"keys"`, `"index"`); `stop` is asked between groups.
pub fn build_datastore(
    run: &Run,
    ids: &[u32],
    text: &str,
    out: &Path,
    settings: &BuildSettings,
    mut progress: impl FnMut(&str, u64, u64),
    stop: &dyn Fn() -> bool,
) -> Result<Built> {
    check_run(run)?;
    if ids.len() < 2 {
        bail!("{text} has {} tokens: nothing to store", ids.len());
    }
    run.check_len(settings.window)?;
    // entry ids must be positions of the text: windows that tile it, every prediction once
    if settings.window == 0 || settings.stride == 0 || settings.stride > settings.window {
        bail!("a stride of {} must be in 1..={} (the window)", settings.stride, settings.window);
    }
    let origin = Origin {
        // the same run however its path is written, so that a build resumes from anywhere
        run: run.dir.canonicalize().unwrap_or_else(|_| run.dir.clone()).display().to_string(),
        weights_sha256: file_sha256(&run.weights)?,
        key: KEY_KIND.into(),
        text: text.into(),
        text_sha256: ids_sha256(ids),
        tokens: ids.len() as u64,
        vocab_size: run.model.vocab_size as u32,
        window: settings.window,
        stride: settings.stride,
    };
    let dim = run.config.model.d_model;
    let planned = planned_entries(ids.len(), settings);
    let mut writer = DatastoreWriter::create_or_resume(out, origin, dim, planned, settings.index)?;
    let windows = sliding_windows(ids.len(), settings.window, settings.stride);
    let len = settings.window.min(ids.len() - 1);
    let mut entry = 0u64;
    progress("keys", writer.entries(), planned);
    for group in windows.chunks(GROUP) {
        let n: u64 = group.iter().map(|w| (len - w.from) as u64).sum();
        if entry + n <= writer.entries() {
            entry += n; // committed by an earlier build
            continue;
        }
        if entry != writer.entries() {
            bail!(
                "{}: {} entries are committed, which is not where a group of windows ends: the datastore is damaged; remove it and build again",
                out.display(),
                writer.entries()
            );
        }
        if stop() {
            return Ok(Built::Interrupted { entries: writer.entries(), indexed: 0 });
        }
        let g = forward_group(&run.model, ids, group, len, &run.device)?;
        let mut keys = Vec::with_capacity(n as usize * dim);
        let mut values = Vec::with_capacity(n as usize);
        for (row, w) in group.iter().enumerate() {
            for j in w.from..len {
                let at = row * len + j;
                keys.extend_from_slice(&g.features[at * dim..(at + 1) * dim]);
                values.push(ids[w.start + j + 1]);
            }
        }
        writer.append(&keys, &values)?;
        entry += n;
        progress("keys", entry, planned);
    }
    let done = writer.build_index(|i| progress("index", i, planned), stop)?;
    let meta = writer.meta();
    Ok(if done { Built::Complete } else { Built::Interrupted { entries: meta.entries, indexed: meta.index.indexed } })
}

/// The loss of a text under the LM alone and mixed with retrieval, for every k and λ asked.
#[derive(Debug, Clone)]
pub struct KnnScores {
    /// Predictions scored.
    pub tokens: usize,
    /// Nats per token, the LM alone.
    pub lm: f64,
    /// (k, λ, nats per token) for every k and λ.
    pub mixed: Vec<(usize, f64, f64)>,
    /// The datastore holds the scored text: each position retrieved only entries before it.
    pub causal: bool,
    /// Seconds spent searching (one query per token scored).
    pub search_seconds: f64,
    /// The approximate search's recall@k (largest k) against exact search, and over how many
    /// queries (`KnnEval::recall_queries`; none with exact search).
    pub recall: Option<(f64, usize)>,
}

/// Settings of a kNN-LM evaluation.
#[derive(Debug, Clone)]
pub struct KnnEval {
    /// Window length: the tokens each forward reads.
    pub window: usize,
    /// Tokens between window starts.
    pub stride: usize,
    /// Neighbour counts to score with (one search with the largest).
    pub ks: Vec<usize>,
    /// The interpolation weights λ to score with: p = λ p_kNN + (1 − λ) p_LM.
    pub lambdas: Vec<f64>,
    /// Divides the distances before the softmax over the neighbours.
    pub temperature: f64,
    /// Exact search or the HNSW index.
    pub mode: SearchMode,
    /// Also search about this many queries, spread over the text, exactly and report the
    /// index's recall@k.
    pub recall_queries: usize,
}

/// Checks that `store` was built by `run`'s model with keys of its width.
pub fn check_datastore(run: &Run, store: &Datastore) -> Result<()> {
    let o = &store.meta.origin;
    if store.dim() != run.config.model.d_model || o.vocab_size as usize != run.model.vocab_size {
        bail!(
            "{} holds keys of {} values over {} tokens; {} has d_model {} and {} tokens: the datastore belongs to another model",
            store.dir.display(),
            store.dim(),
            o.vocab_size,
            run.dir.display(),
            run.config.model.d_model,
            run.model.vocab_size
        );
    }
    if o.key != KEY_KIND {
        bail!("{} holds keys of kind {:?}; this build reads {KEY_KIND:?}", store.dir.display(), o.key);
    }
    if o.weights_sha256 != file_sha256(&run.weights)? {
        bail!(
            "{} was built from the weights of {} ({}); {} now reads {}: its keys would not match the model's states — build the datastore again",
            store.dir.display(),
            o.run,
            short(&o.weights_sha256),
            run.dir.display(),
            run.weights.display()
        );
    }
    Ok(())
}

fn short(sha: &str) -> String {
    format!("sha256 {}", variorum_retrieval::datastore::short(sha))
}

/// Whether `store` holds (a prefix of) `ids`, or `ids` a prefix of the text `store` holds: its
/// entry `e` then is position `e` of `ids`, and scoring must not retrieve entries at or after
/// the scored position. Its values are its text from the second token on.
pub fn overlaps(store: &Datastore, ids: &[u32]) -> bool {
    if store.meta.origin.text_sha256 == ids_sha256(ids) {
        return true;
    }
    let values = store.values();
    let n = values.len().min(ids.len().saturating_sub(1));
    n > 0 && values[..n] == ids[1..=n]
}

/// Scores `ids` with `run` and `store` ([`KnnEval`]); the LM-alone loss is
/// [`crate::eval::sliding_loss`]'s. When the datastore holds this text or a prefix of it (or
/// this text is a prefix of the datastore's: [`overlaps`]), every position retrieves only
/// entries before its own (a causal datastore: it never sees its own continuation); a text that
/// overlaps the datastore's otherwise is not detected — build datastores over the training
/// split and score the validation split. `progress` advances by one per window.
pub fn knn_loss(
    run: &Run,
    store: &Datastore,
    ids: &[u32],
    settings: &KnnEval,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<KnnScores> {
    check_run(run)?;
    check_datastore(run, store)?;
    let causal = overlaps(store, ids);
    let windows = sliding_windows(ids.len(), settings.window, settings.stride);
    let len = settings.window.min(ids.len().saturating_sub(1));
    // recall is measured on queries spread over the text (the first ones, near the start of a
    // causal datastore, see few entries and are searched exactly anyway)
    let total_queries: usize = windows.iter().map(|w| len - w.from).sum();
    let every = (total_queries / settings.recall_queries.max(1)).max(1);
    let mut seen = 0usize;
    let dim = store.dim();
    let k_max = settings.ks.iter().copied().max().unwrap_or(1).max(1);
    let mut lm = 0.0;
    let mut mixed = vec![0.0; settings.ks.len() * settings.lambdas.len()];
    let (mut tokens, mut search_seconds) = (0usize, 0.0);
    let (mut truth, mut approx) = (Vec::new(), Vec::new());
    for group in windows.chunks(GROUP) {
        let g = forward_group(&run.model, ids, group, len, &run.device)?;
        let mut queries = Vec::new();
        let mut before = Vec::new();
        let mut lm_lp = Vec::new();
        let mut targets = Vec::new();
        for (row, w) in group.iter().enumerate() {
            for j in w.from..len {
                let at = row * len + j;
                queries.extend_from_slice(&g.features[at * dim..(at + 1) * dim]);
                // entry e holds token e + 1: the position's own entry is w.start + j
                before.push(causal.then_some((w.start + j) as u64));
                lm_lp.push(g.logprobs[at] as f64);
                targets.push(ids[w.start + j + 1]);
            }
        }
        let t0 = Instant::now();
        let found = store.search(&queries, k_max, settings.mode, if causal { &before } else { &[] })?;
        search_seconds += t0.elapsed().as_secs_f64();
        if settings.recall_queries > 0 && settings.mode != SearchMode::Exact {
            let picked: Vec<usize> = (0..found.len()).filter(|i| (seen + i) % every == 0).collect();
            let q: Vec<f32> = picked.iter().flat_map(|&i| queries[i * dim..(i + 1) * dim].iter().copied()).collect();
            let b: Vec<Option<u64>> = picked.iter().map(|&i| if causal { before[i] } else { None }).collect();
            truth.extend(store.search(&q, k_max, SearchMode::Exact, &b)?);
            approx.extend(picked.iter().map(|&i| found[i].clone()));
        }
        seen += found.len();
        let values = store.values();
        for (i, neighbours) in found.iter().enumerate() {
            lm -= lm_lp[i];
            for (a, &k) in settings.ks.iter().enumerate() {
                let p =
                    knn_target_prob(&neighbours[..k.min(neighbours.len())], settings.temperature, values, targets[i]);
                for (b, &lambda) in settings.lambdas.iter().enumerate() {
                    mixed[a * settings.lambdas.len() + b] -= variorum_retrieval::mix_logprob(lm_lp[i], p, lambda);
                }
            }
        }
        tokens += found.len();
        if let Some(pb) = progress {
            pb.inc(group.len() as u64);
        }
    }
    let n = tokens.max(1) as f64;
    let mixed = settings
        .ks
        .iter()
        .flat_map(|&k| settings.lambdas.iter().map(move |&l| (k, l)))
        .zip(mixed)
        .map(|((k, l), s)| (k, l, s / n))
        .collect();
    let recall = (!truth.is_empty()).then(|| (variorum_retrieval::search::recall(&truth, &approx), truth.len()));
    Ok(KnnScores { tokens, lm: lm / n, mixed, causal, search_seconds, recall })
}

/// p_kNN of `target` (`None` without neighbours: the LM alone scores the position).
fn knn_target_prob(neighbours: &[Neighbour], temperature: f64, values: &[u32], target: u32) -> Option<f64> {
    if neighbours.is_empty() {
        return None;
    }
    let dist = variorum_retrieval::knn_distribution(neighbours, temperature, |id| values[id as usize]);
    Some(dist.iter().find(|(t, _)| *t == target).map_or(0.0, |(_, p)| *p))
}

/// Retrieval while generating: each next token is drawn from the mixture.
pub struct Retriever<'a> {
    /// The datastore searched.
    pub store: &'a Datastore,
    /// k, λ and the temperature.
    pub knn: KnnConfig,
    /// Exact search or the HNSW index.
    pub mode: SearchMode,
}

impl Retriever<'_> {
    /// The mixed log-probabilities of the next token, from the model's `logits` and `features`
    /// at the last position.
    pub fn next_logprobs(&self, logits: &[f32], features: &[f32]) -> Result<Vec<f32>> {
        let found = self.store.search(features, self.knn.k, self.mode, &[])?;
        let values = self.store.values();
        let dist = variorum_retrieval::knn_distribution(&found[0], self.knn.temperature, |id| values[id as usize]);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z = logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32 + max;
        let lm: Vec<f32> = logits.iter().map(|&l| l - z).collect();
        Ok(variorum_retrieval::mix_logprobs(&lm, &dist, self.knn.lambda))
    }
}
