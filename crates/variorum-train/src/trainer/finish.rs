//! Phase three of `train`: the artefacts of a finished run.

use std::fs;

use anyhow::{Context, Result};
use burn::prelude::*;
use variorum_data::{TokenBatch, Tokenizer};
use variorum_model::DecoderLm;

use super::{Outcome, Session, Summary, finish_plot, median};
use crate::checkpoint::write_atomic;
use crate::generate::{SampleConfig, generate};
use crate::listing::Status;

impl Session<'_> {
    /// Phase three, after the last step: the final weights (`model.bpk`, written beside and
    /// renamed into place), the loss plot, the closing sample, `summary.json` and the report.
    /// The split is after the loop because none of this is training state: the checkpoints
    /// already hold the run, and an artefact that fails here leaves `--resume` able to redo it.
    pub(super) fn finish(self) -> Result<Outcome> {
        self.pb.finish_and_clear();

        // --- final artefacts
        let run = self.run;
        let valid = self.model.valid();
        // written beside and renamed into place: a failed or cut-off write never leaves a truncated
        // model.bpk (which loading prefers to the checkpoints)
        let (tmp, weights) = (run.join(".model.tmp.bpk"), run.join("model.bpk"));
        let written = match self.cfg.train.lora.is_some() {
            true => crate::lora::save_adapters(&valid, &tmp),
            false => valid.clone().save_file(&tmp).map_err(|e| anyhow::anyhow!("{e}")),
        };
        written.map_err(|e| {
            anyhow::anyhow!(
                "cannot write {}: {e:#}; the checkpoints are intact (--resume finishes the run)",
                tmp.display()
            )
        })?;
        fs::rename(&tmp, &weights).with_context(|| {
            format!("cannot move {} to {}; the checkpoints are intact", tmp.display(), weights.display())
        })?;
        finish_plot(run, &self.metrics)?;
        let text = self.closing_sample(&valid);
        write_atomic(&run.join("sample.txt"), text.as_bytes())?;

        let summary = self.summary()?;
        write_atomic(&run.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
        self.report(Status::Finished, &valid, |s| eprintln!("{s}"));
        Ok(Outcome::Finished(summary))
    }

    /// `sample.txt`: a masked model fills in a validation window, an encoder–decoder writes the
    /// first validation example's target, any other model continues a prompt.
    fn closing_sample(&self, valid: &DecoderLm) -> String {
        let (cfg, corpus, eval_set) = (&self.cfg, &self.corpus, &self.eval_set);
        let tc = &cfg.train;
        let inner = self.device.clone().inner();
        // text starts after a line break; graph examples have none: the first validation example's
        // first token (and the complete graph, as any generation)
        let first_example = corpus.graphs.as_ref().and_then(|g| g.val.first()).map(|e| e.tokens[..1].to_vec());
        let prompt = first_example
            .or_else(|| corpus.tokenizer.encode("\n").ok().filter(|p| !p.is_empty()))
            .unwrap_or_else(|| vec![0]);
        let sample_cfg = SampleConfig {
            max_new_tokens: tc.sample_tokens,
            temperature: tc.sample_temperature,
            top_k: 0,
            top_p: 1.0,
            seed: tc.seed,
            no_cache: false,
            // a tagged run samples under the tag of its first validation window
            tag: eval_set.first().and_then(|b| b.tags.first()).map(|&t| t as u32),
        };
        match (valid.mask_token, eval_set.first()) {
            // a masked model does not generate: it fills in the hidden tokens of a validation window
            (Some(mask), Some(b)) => fill_in_sample(valid, b, mask, &corpus.tokenizer, &inner),
            // an encoder–decoder writes the target of the first validation example
            (None, Some(b)) if !b.sources.is_empty() => {
                let vocab = valid.text_vocab;
                let show = |t: &[u32]| crate::seq2seq::show(t, &corpus.tokenizer, vocab);
                // the first example's target, without its end token
                let mut target: Vec<u32> =
                    b.targets[..b.seq_len].iter().take_while(|&&t| t >= 0).map(|&t| t as u32).collect();
                target.pop();
                let written = crate::seq2seq::generate_from(valid, &b.sources[0], &sample_cfg, &inner, |_| {});
                format!("source: {}\ntarget: {}\nmodel:  {}\n", show(&b.sources[0]), show(&target), show(&written))
            }
            _ => {
                // a long-term memory retrieves as the sample grows; if its datastore cannot be read
                // now, the sample goes without (the run's artefacts matter more than its sample)
                let retrieving = cfg.model.long_term_memory.as_ref().map(|_| {
                    let online = crate::retrieval::spalm::OnlineNeighbours::open(cfg, cfg.model.vocab(), &inner, 64)?;
                    let retrieval = crate::generate::Retrieval { knn: None, neighbours: Some(&online) };
                    crate::generate::generate_with(valid, &prompt, &sample_cfg, retrieval, &inner, |_| {})
                });
                let sample = match retrieving {
                    Some(Ok(sample)) => sample,
                    Some(Err(e)) => {
                        eprintln!("note: the closing sample is written without retrieval: {e:#}");
                        generate(valid, &prompt, &sample_cfg, &inner, |_| {})
                    }
                    None => generate(valid, &prompt, &sample_cfg, &inner, |_| {}),
                };
                let mut text = corpus.tokenizer.decode(&prompt);
                text.push_str(&corpus.tokenizer.decode(&sample));
                text
            }
        }
    }

    /// The run's final figures (`summary.json`), read from the metrics log and the state; the
    /// peak memory is read here, after the closing sample.
    fn summary(&self) -> Result<Summary> {
        let rows = self.metrics.rows()?;
        let mut tps: Vec<f64> = rows.iter().skip(1).filter_map(|r| r.tokens_per_sec).collect();
        if tps.is_empty() {
            tps = rows.iter().filter_map(|r| r.tokens_per_sec).collect();
        }
        Ok(Summary {
            steps: self.state.step,
            tokens_per_sec: median(&mut tps),
            final_train_loss: self.last_train_loss.or_else(|| rows.iter().rev().find_map(|r| r.train_loss)),
            final_val_loss: self.state.val_loss,
            params: self.params,
            flops_per_token: self.cfg.model.flops_per_token(),
            device: self.opts.device_name.clone(),
            train_seconds: self.state.train_seconds,
            peak_rss_mib: crate::bench::peak_rss_mib(),
            mixture: self.mixture(),
        })
    }

    /// What each source of a prepared corpus supplied: the rows are a function of (seed, step),
    /// so they are counted again here, whatever resumes the run had.
    fn mixture(&self) -> Option<Vec<super::MixtureShare>> {
        let (super::Batches::Mixture(m), Some(p)) = (&self.batches, &self.corpus.prepared) else { return None };
        let steps = self.state.step * self.cfg.train.grad_accum as u64;
        let shares = m.intended().into_iter().zip(m.drawn(steps)).zip(&p.index.sources);
        Some(
            shares
                .map(|((intended, drawn), s)| super::MixtureShare { source: s.config.path.clone(), intended, drawn })
                .collect(),
        )
    }
}

/// The first row of a masked batch three times: as the model saw it (hidden tokens as `_`), with
/// the model's guesses in their place, and as written.
fn fill_in_sample(model: &DecoderLm, batch: &TokenBatch, mask: usize, tok: &Tokenizer, device: &Device) -> String {
    // a graph example's own tokens, not its padding
    let l = batch.graphs.first().map_or(batch.seq_len, |g| g.len().min(batch.seq_len));
    let (inputs, _) = crate::step::batch_tensors(batch, device);
    let rows = crate::step::batch_rows(batch, device);
    let guesses = model.forward_tagged(inputs, rows, None).logits.narrow(0, 0, 1).argmax(2);
    let guesses = guesses.into_data().convert::<i64>().try_into_vec::<i64>().unwrap_or_default();
    let (seen, targets) = (&batch.inputs[..l], &batch.targets[..l]);
    let piece = |t: i64| if t < 0 || t as usize >= mask { "_".to_string() } else { tok.decode(&[t as u32]) };
    let line = |pick: &dyn Fn(usize) -> String| (0..l).map(pick).collect::<String>();
    let hidden = |i: usize| targets[i] != mask as i64;
    let shown = line(&|i| if hidden(i) { "_".into() } else { piece(seen[i]) });
    let filled = line(&|i| if hidden(i) { piece(guesses.get(i).copied().unwrap_or(-1)) } else { piece(seen[i]) });
    let original = line(&|i| if hidden(i) { piece(targets[i]) } else { piece(seen[i]) });
    format!(
        "# masked language model: a validation window with its hidden tokens as _\nseen:     {shown}\nfilled:   {filled}\noriginal: {original}\n"
    )
}
