//! Phase two of `train`: the loop's body, one optimizer step and what falls due after it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;
use burn::prelude::*;
use variorum_data::TokenBatch;

use super::{Outcome, Session, ensure_finite, finish_plot, step_seed};
use crate::checkpoint::TrainState;
use crate::eval::{evaluate, stream_loss};
use crate::listing::Status;
use crate::metrics::Row;
use crate::schedule::learning_rate;
use crate::step::train_step;

impl Session<'_> {
    /// Whether to stop before the next step: Ctrl-C was pressed, or `--stop-at` is reached.
    pub(super) fn stop_requested(&self) -> bool {
        self.opts.interrupt.load(Ordering::SeqCst) || self.opts.stop_at.is_some_and(|s| self.state.step >= s)
    }

    /// Stops between two steps (Ctrl-C, `--stop-at`): a checkpoint with the logging interval's
    /// loss so far, so `--resume` continues the interval, then the plot and the report as they
    /// stand. It ends the run in the loop's place, before its next step, which is why it is not
    /// part of `finish` (no final weights, sample or summary).
    pub(super) fn interrupt(mut self) -> Result<Outcome> {
        let (sum, _) = read_loss(&self.loss_acc, &self.state);
        ensure_finite(sum, &self.state, self.run)?;
        self.state.loss_sum = sum;
        let ckpt = self.save()?;
        self.pb.abandon();
        finish_plot(self.run, &self.metrics)?;
        self.report(Status::Interrupted, &self.model, |s| eprintln!("{s}"));
        Ok(Outcome::Interrupted { step: self.state.step, checkpoint: ckpt })
    }

    /// Phase two, once per iteration of the loop: step `self.state.step`'s batches, reseeded
    /// device, forward/backward/clip/optimizer step and the mechanisms' hooks, then — when the
    /// step falls on an interval — the loss read, a metrics row (`log`, evaluating in
    /// `validation_loss`) and a checkpoint (`checkpoint`). The split is at the step because a
    /// step is the unit of exact resume: everything it does depends only on the seed, the step
    /// number and the state carried in the session. Takes the session by value because
    /// `train_step` consumes the model and hands back the updated one.
    pub(super) fn step(mut self) -> Result<Self> {
        let step = self.state.step;
        let lr = learning_rate(&self.cfg.train, step);
        self.device.seed(step_seed(self.cfg.train.seed, step));
        let micro = self.micro_batches(step)?;
        self.interval_tokens += micro.iter().map(batch_tokens).sum::<f64>();
        let t0 = Instant::now();
        let (m, res) =
            train_step(self.model, &mut self.optim, &self.cfg.train, &micro, lr, &self.device, self.memory.as_mut());
        // the mechanisms' own updates between steps (random features redrawn, centroids moved),
        // drawn from the step's seeded stream, so a resumed run replays them
        self.model = m.after_optimizer_step(step as usize + 1);
        variorum_core::sum_aux_losses(&mut self.aux_acc, res.aux);
        self.loss_acc = Some(match self.loss_acc.take() {
            Some(a) => a + res.loss,
            None => res.loss,
        });
        self.last_norm = res.grad_norm;
        self.state.loss_count += 1;
        self.state.step += 1;
        self.interval_steps += 1;
        self.pb.set_position(self.state.step);

        let tc = &self.cfg.train;
        let done = self.state.step == tc.steps;
        let eval_now = (tc.eval_interval > 0 && self.state.step % tc.eval_interval == 0) || done;
        let log_now = self.state.step % tc.log_interval == 0 || eval_now;
        let ckpt_now = (tc.checkpoint_interval > 0 && self.state.step % tc.checkpoint_interval == 0) || done;

        if log_now || ckpt_now {
            let (sum, count) = read_loss(&self.loss_acc, &self.state);
            self.loss_acc = None;
            ensure_finite(sum, &self.state, self.run)?;
            // the loss read above waited for the step's work: time it with the step
            let dt = t0.elapsed().as_secs_f64();
            self.interval_train_secs += dt;
            self.state.train_seconds += dt;
            if log_now {
                self.log(sum, count, lr, eval_now)?;
            } else {
                self.state.loss_sum = sum;
            }
            if ckpt_now {
                self.checkpoint(done)?;
            }
        } else {
            let dt = t0.elapsed().as_secs_f64();
            self.interval_train_secs += dt;
            self.state.train_seconds += dt;
        }
        Ok(self)
    }

    /// Step `step`'s `grad_accum` micro-batches: batch `i` is a pure function of (seed, i), with
    /// its retrieved tokens, masked with a seed of its own under the masked objective.
    fn micro_batches(&self, step: u64) -> Result<Vec<TokenBatch>> {
        let tc = &self.cfg.train;
        (0..tc.grad_accum as u64)
            .map(|m| {
                let i = step * tc.grad_accum as u64 + m;
                let mut b = self.batches.get(i)?;
                if let Some((train, _)) = &self.retrieved {
                    train.attach(&mut b);
                }
                Ok(match &self.masking {
                    Some(mask) => mask.apply(&b, step_seed(tc.seed, i)),
                    None => b,
                })
            })
            .collect()
    }

    /// Closes a logging interval of `count` steps whose losses sum to `sum`: evaluates when
    /// `eval_now`, writes the metrics row, updates the progress bar (and prints the evaluation's
    /// line), and starts the next interval.
    fn log(&mut self, sum: f64, count: u64, lr: f64, eval_now: bool) -> Result<()> {
        let train_loss = sum / count.max(1) as f64;
        self.last_train_loss = Some(train_loss);
        let tps = self.interval_tokens / self.interval_train_secs.max(1e-9);
        let val_loss = if eval_now {
            let v = self.validation_loss();
            self.state.val_loss = Some(v);
            Some(v)
        } else {
            None
        };
        let grad_norm = self.last_norm.take().map(|n| n.into_scalar::<f32>() as f64);
        let aux: Vec<(String, f64)> = std::mem::take(&mut self.aux_acc)
            .into_iter()
            .map(|(n, t)| (n, t.into_scalar::<f32>() as f64 / self.interval_steps.max(1) as f64))
            .collect();
        self.metrics.append(&Row {
            step: self.state.step,
            train_loss: Some(train_loss),
            val_loss,
            lr,
            grad_norm,
            tokens_per_sec: Some(tps),
            elapsed_sec: self.state.train_seconds,
            aux: aux.clone(),
        })?;
        self.pb.set_message(format!(
            "loss {train_loss:.4}{} | {:.0} tok/s | lr {lr:.2e}",
            self.state.val_loss.map(|v| format!(" | val {v:.4}")).unwrap_or_default(),
            tps
        ));
        if let Some(v) = val_loss {
            let aux: String = aux.iter().map(|(n, x)| format!("  {n} {x:.3e}")).collect();
            self.say(format!("step {:>6}  train {train_loss:.4}  val {v:.4}  {tps:.0} tok/s{aux}", self.state.step));
        }
        self.state.loss_sum = 0.0;
        self.state.loss_count = 0;
        self.interval_steps = 0;
        self.interval_tokens = 0.0;
        self.interval_train_secs = 0.0;
        Ok(())
    }

    /// The validation loss of the model as it stands.
    fn validation_loss(&self) -> f64 {
        let (model, tc, seq_len, corpus) = (&self.model, &self.cfg.train, self.cfg.model.seq_len, &self.corpus);
        let inner = self.device.clone().inner();
        let val_retrieved = self.retrieved.as_ref().map(|(_, v)| v);
        if let Some(batches) = &self.document_eval {
            // a model without memory reads each segment alone (a KV cache would grow past its
            // context)
            let read = batches.iter().map(Ok::<_, std::convert::Infallible>);
            match crate::eval::document_loss(&model.valid(), read, model.has_memory(), &inner, None) {
                Ok((loss, _)) => loss,
            }
        } else if model.has_memory() {
            // memory models are scored as they run: segments of ordered streams
            let n = (tc.eval_batches * tc.batch_size * seq_len + 1).min(corpus.val.len());
            match stream_loss(
                &model.valid(),
                &corpus.val[..n],
                seq_len,
                tc.batch_size,
                true,
                val_retrieved,
                &inner,
                None,
            ) {
                (_, 0) => evaluate(&model.valid(), &self.eval_set, &inner),
                (v, _) => v,
            }
        } else {
            evaluate(&model.valid(), &self.eval_set, &inner)
        }
    }

    /// Writes a checkpoint (atomically, `checkpoint::save`), then the report — except after the
    /// last step, whose report is written at the end, after the peak memory is read.
    fn checkpoint(&self, done: bool) -> Result<()> {
        self.save()?;
        // the last one is written at the end, after the peak memory is read
        if !done {
            self.report(Status::Running, &self.model, |s| self.say(s));
        }
        Ok(())
    }
}

/// Reads the interval's loss: the one host sync of the loop outside evaluation.
fn read_loss(acc: &Option<Tensor<1>>, st: &TrainState) -> (f64, u64) {
    let dev_sum = acc.as_ref().map_or(0.0, |t| t.clone().into_scalar::<f32>() as f64);
    (st.loss_sum + dev_sum, st.loss_count)
}

/// Positions each step processes, counted from its batches: an encoder–decoder's are its
/// target rows (as long as the batch's longest) and their sources.
fn batch_tokens(b: &TokenBatch) -> f64 {
    (b.batch_size * b.seq_len + b.sources.iter().map(|s| s.len()).sum::<usize>()) as f64
}
