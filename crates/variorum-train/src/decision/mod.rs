//! Training and acting of the Decision Transformer (`model.kind = "decision-transformer"`,
//! `data.trajectories`): the same run directory, checkpoints, metrics and exact resume as
//! `train`'s language models, over windows of trajectory steps instead of token windows.
//!
//! Batch t is a function of (seed, t) and the device is reseeded from (seed, t) before each
//! step, so a resumed run replays the uninterrupted one. The validation loss is the action loss
//! over the held-out episodes (the last `data.val_fraction` of the file), cut into consecutive
//! windows.

mod rollout;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use variorum_data::decision::{
    ActionSpace, BatchActions, StepBatch, StepWindows, Trajectory, TrajectoryHeader, TrajectorySet,
};
use variorum_model::{ActionInputs, ActionKind, DecisionTransformer, ModelConfig, StepInputs};

pub use rollout::{Rollouts, TargetResult, rollouts};

use crate::checkpoint::{self, TrainState, write_atomic};
use crate::config::ExperimentConfig;
use crate::lock::RunLock;
use crate::metrics::{MetricsLog, Row};
use crate::schedule::learning_rate;
use crate::step::optimizer;
use crate::trainer::prepare::{DrawNow, check_request, check_same_run};
use crate::trainer::{Outcome, Summary, TrainOptions, ensure_finite, finish_plot, median, step_seed};

/// Fills `[model.decision]`'s sizes from a trajectory file's header and episodes: the state
/// and action widths, the action kind, and the timestep table (the longest episode or the
/// environment's horizon, unless set; a set one shorter is refused).
pub fn resolve(model: &mut ModelConfig, set: &TrajectorySet, path: &Path) -> Result<()> {
    let d = model.decision.get_or_insert_with(Default::default);
    let (kind, n) = match set.header.actions {
        ActionSpace::Discrete(n) => (ActionKind::Discrete, n),
        ActionSpace::Continuous(n) => (ActionKind::Continuous, n),
    };
    // acting runs to the environment's horizon, which the data's episodes may not reach
    let horizon = match set.header.env {
        variorum_data::decision::EnvConfig::KeyDoor(e) => e.horizon,
        variorum_data::decision::EnvConfig::External => 0,
    };
    let longest = set.episodes.iter().map(Trajectory::len).max().unwrap_or(0).max(horizon);
    for (key, set_to, data) in [("state_dim", d.state_dim, set.header.state_dim), ("action_dim", d.action_dim, n)] {
        if let Some(v) = set_to.filter(|&v| v != data) {
            bail!(
                "model.decision.{key} = {v}, but {} has {data}: remove it (the data's is the default)",
                path.display()
            );
        }
    }
    if let Some(k) = d.actions.filter(|&k| k != kind) {
        bail!("model.decision.actions = {k:?}, but the actions of {} are {kind:?}: remove it", path.display());
    }
    if let Some(m) = d.max_timestep.filter(|&m| m < longest) {
        bail!(
            "model.decision.max_timestep = {m}, but {} has episodes (or an environment's horizon) of {longest} steps: raise it to at least {longest}",
            path.display()
        );
    }
    d.state_dim = Some(set.header.state_dim);
    d.action_dim = Some(n);
    d.actions = Some(kind);
    d.max_timestep = Some(d.max_timestep.unwrap_or(longest));
    Ok(())
}

/// The held-out episodes: the last `val_fraction` of them (at least one), the rest trained on.
pub fn split(episodes: Vec<Trajectory>, val_fraction: f64, path: &Path) -> Result<(Vec<Trajectory>, Vec<Trajectory>)> {
    if episodes.len() < 2 {
        bail!(
            "{} holds {} episode(s): training holds some out for validation, so it needs at least 2",
            path.display(),
            episodes.len()
        );
    }
    let val = ((episodes.len() as f64 * val_fraction).round() as usize).clamp(1, episodes.len() - 1);
    let mut train = episodes;
    let held = train.split_off(train.len() - val);
    Ok((train, held))
}

/// A batch of windows as the model's inputs, with its `[batch, K]` validity.
pub fn batch_inputs(b: &StepBatch, state_dim: usize, device: &Device) -> (StepInputs, Tensor<2>) {
    let (rows, k) = (b.batch_size, b.context);
    let actions = match &b.actions {
        BatchActions::Discrete(a) => {
            ActionInputs::Discrete(Tensor::from_data(TensorData::new(a.clone(), [rows, k]), device))
        }
        BatchActions::Continuous(a) => {
            let n = a.len() / (rows * k);
            ActionInputs::Continuous(Tensor::from_data(TensorData::new(a.clone(), [rows, k, n]), device))
        }
    };
    let valid: Vec<f32> = b.valid.iter().map(|&v| v as u8 as f32).collect();
    (
        StepInputs {
            returns_to_go: Tensor::from_data(TensorData::new(b.returns_to_go.clone(), [rows, k]), device),
            states: Tensor::from_data(TensorData::new(b.states.clone(), [rows, k, state_dim]), device),
            actions,
            timesteps: Tensor::from_data(TensorData::new(b.timesteps.clone(), [rows, k]), device),
        },
        Tensor::from_data(TensorData::new(valid, [rows, k]), device),
    )
}

/// The mean action loss of `model` over `batches`, weighted by their valid steps.
pub fn validation_loss(model: &DecisionTransformer, batches: &[StepBatch], state_dim: usize, device: &Device) -> f64 {
    let (mut sum, mut steps) = (0.0, 0usize);
    for b in batches {
        let (x, valid) = batch_inputs(b, state_dim, device);
        let (_, action, _) = model.loss(&x, valid);
        sum += action.into_scalar::<f32>() as f64 * b.steps() as f64;
        steps += b.steps();
    }
    sum / steps.max(1) as f64
}

/// A Decision Transformer run's copy of its trajectory file's header: the environment.
pub const HEADER_FILE: &str = "trajectories.json";

/// A loaded Decision Transformer run.
pub struct DecisionRun {
    /// Its `config.toml`.
    pub config: ExperimentConfig,
    /// Its trajectory file's header (the environment acted in).
    pub header: TrajectoryHeader,
    /// The trained model.
    pub model: DecisionTransformer,
}

/// Loads a run's Decision Transformer (`model.bpk`, else its newest checkpoint) with its config
/// and its data's header.
pub fn load_run(run: &Path, device: &Device) -> Result<DecisionRun> {
    let path = run.join("config.toml");
    let cfg =
        ExperimentConfig::load(&path).with_context(|| format!("cannot read the run's config {}", path.display()))?;
    if cfg.model.kind != variorum_model::ModelKind::DecisionTransformer {
        bail!("{} is not a Decision Transformer's run (model.kind = \"decision-transformer\")", run.display());
    }
    let model = cfg.model.init_decision(device);
    let weights = run.join("model.bpk");
    let file = if weights.is_file() {
        weights
    } else {
        match checkpoint::latest(run)? {
            Some((dir, _)) => dir.join("model.bpk"),
            None => bail!("{} holds neither model.bpk nor a checkpoint: train it first", run.display()),
        }
    };
    let header_path = run.join(HEADER_FILE);
    let header: TrajectoryHeader = serde_json::from_str(
        &fs::read_to_string(&header_path).with_context(|| format!("cannot read {}", header_path.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("{} is not a trajectory header: {e}", header_path.display()))?;
    Ok(DecisionRun { config: cfg, header, model: crate::weights::load_weights(model, &file, "weights")? })
}

/// `variorum train` for `model.kind = "decision-transformer"`.
pub fn train(mut cfg: ExperimentConfig, opts: &TrainOptions) -> Result<Outcome> {
    let checkpoints = check_request(&mut cfg, opts)?;
    let run = &opts.run_dir;
    let path = cfg.data.trajectories.clone().expect("validated: data.trajectories is set");
    let set = TrajectorySet::load(&path)?;
    resolve(&mut cfg.model, &set, &path)?;
    cfg.model.validate()?;
    if opts.resume {
        let saved = check_same_run(run, &cfg)?;
        cfg.train = crate::config::TrainConfig { steps: opts.max_steps.unwrap_or(saved.train.steps), ..saved.train };
    }
    if opts.init_from.is_some() {
        bail!("--init-from loads a language model's weights by name; the Decision Transformer trains from scratch");
    }
    let state_dim = set.header.state_dim;
    let space = set.header.actions;
    let (train_eps, val_eps) = split(set.episodes, cfg.data.val_fraction, &path)?;
    let tc = cfg.train.clone();
    let model_cfg = cfg.model.clone();
    let context = model_cfg.seq_len / model_cfg.decision.as_ref().map_or(3, |d| d.tokens_per_step());
    let windows = StepWindows::new(Arc::new(train_eps), state_dim, space, context, tc.batch_size, tc.seed);
    let val_batches = StepWindows::new(Arc::new(val_eps), state_dim, space, context, tc.batch_size, tc.seed)
        .in_order(tc.eval_batches);

    fs::create_dir_all(run).with_context(|| format!("cannot create run directory {}", run.display()))?;
    let _lock = RunLock::acquire(run)?;
    write_atomic(&run.join("config.toml"), cfg.to_toml().as_bytes())?;
    // what acting needs of the data: the environment (rollouts do not read the episodes)
    write_atomic(&run.join(HEADER_FILE), serde_json::to_string_pretty(&set.header)?.as_bytes())?;

    let device = opts.device.clone().autodiff();
    let host = opts.init_device.clone().unwrap_or_else(|| opts.device.clone()).autodiff();
    host.seed(tc.seed);
    let mut model = model_cfg.init_decision(&host);
    model.visit(&mut DrawNow);
    if host != device {
        model = model.fork(&device);
    }
    let mut optim = optimizer(&tc);
    let mut state = TrainState::default();
    if opts.resume {
        let (dir, (m, o, st), skipped) = checkpoint::newest_that_loads(&checkpoints, |dir, st| {
            let st = st.clone().map_err(|e| anyhow::anyhow!(e))?;
            let m = crate::weights::load_weights(model.clone(), &dir.join("model.bpk"), "checkpoint")?;
            Ok((m, crate::step::load_optimizer(&tc, dir)?, st))
        })?;
        if !skipped.is_empty() {
            eprintln!(
                "note: resuming from {} (step {}); newer ones do not load: {}",
                dir.display(),
                st.step,
                skipped.join("; ")
            );
        }
        (model, optim, state) = (m, o, st);
        if state.step > tc.steps {
            bail!(
                "the run is already at step {}, past train.steps = {}: raise --max-steps to continue",
                state.step,
                tc.steps
            );
        }
    }
    let params = model.num_params();
    let metrics = MetricsLog::open(run, opts.resume.then_some(state.step))?;
    let save = |model: &DecisionTransformer, optim: &burn::optim::ModuleOptimizer, state: &TrainState| {
        checkpoint::save(run, state, tc.keep_checkpoints, |dir| {
            model.clone().save_file(dir.join("model.bpk")).map_err(|e| anyhow::anyhow!("{e}"))?;
            checkpoint::save_optimizer(optim, &dir.join("optim.bpk"))
        })
    };
    let inner = device.clone().inner();
    let tokens_per_step = model.tokens_per_step as f64;
    let (mut interval_tokens, mut interval_secs, mut last_train) = (0.0, 0.0, None);
    while state.step < tc.steps {
        if opts.interrupt.load(Ordering::SeqCst) || opts.stop_at.is_some_and(|s| state.step >= s) {
            let ckpt = save(&model, &optim, &state)?;
            finish_plot(run, &metrics)?;
            return Ok(Outcome::Interrupted { step: state.step, checkpoint: ckpt });
        }
        let step = state.step;
        let lr = learning_rate(&tc, step);
        device.seed(step_seed(tc.seed, step));
        let t0 = Instant::now();
        let n = tc.grad_accum.max(1);
        let mut acc = burn::optim::GradientsAccumulator::<DecisionTransformer>::new();
        let mut loss_sum = 0.0;
        for m in 0..n as u64 {
            let b = windows.batch(step * n as u64 + m);
            interval_tokens += b.steps() as f64 * tokens_per_step;
            let (x, valid) = batch_inputs(&b, state_dim, &device);
            let (total, action, _) = model.loss(&x, valid);
            let grads = total.div_scalar(n as f64).backward();
            acc.accumulate(&model, burn::optim::GradientsParams::from_grads(grads, &model));
            loss_sum += action.into_scalar::<f32>() as f64;
        }
        let mut grads = acc.grads();
        let norm = if tc.grad_clip > 0.0 {
            crate::clip::clip_global_norm(&model, &mut grads, tc.grad_clip)
        } else {
            crate::clip::global_norm(&model, &grads)
        };
        model = optim.step(lr, model, grads);
        state.loss_sum += loss_sum / n as f64;
        state.loss_count += 1;
        state.step += 1;
        let dt = t0.elapsed().as_secs_f64();
        interval_secs += dt;
        state.train_seconds += dt;

        let done = state.step == tc.steps;
        let eval_now = (tc.eval_interval > 0 && state.step % tc.eval_interval == 0) || done;
        if state.step % tc.log_interval == 0 || eval_now {
            ensure_finite(state.loss_sum, &state, run)?;
            let train_loss = state.loss_sum / state.loss_count.max(1) as f64;
            last_train = Some(train_loss);
            let val_loss = eval_now.then(|| validation_loss(&model.valid(), &val_batches, state_dim, &inner));
            if val_loss.is_some() {
                state.val_loss = val_loss;
            }
            let tps = interval_tokens / interval_secs.max(1e-9);
            metrics.append(&Row {
                step: state.step,
                train_loss: Some(train_loss),
                val_loss,
                lr,
                grad_norm: norm.map(|t| t.into_scalar::<f32>() as f64),
                tokens_per_sec: Some(tps),
                elapsed_sec: state.train_seconds,
                aux: Vec::new(),
            })?;
            if let Some(v) = val_loss {
                eprintln!("step {:>6}  train {train_loss:.4}  val {v:.4}  {tps:.0} tok/s", state.step);
            }
            (state.loss_sum, state.loss_count, interval_tokens, interval_secs) = (0.0, 0, 0.0, 0.0);
        }
        if (tc.checkpoint_interval > 0 && state.step % tc.checkpoint_interval == 0) || done {
            save(&model, &optim, &state)?;
        }
    }
    let valid = model.valid();
    let (tmp, weights) = (run.join(".model.tmp.bpk"), run.join("model.bpk"));
    valid
        .save_file(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}; the checkpoints are intact", tmp.display()))?;
    fs::rename(&tmp, &weights).with_context(|| format!("cannot move {} to {}", tmp.display(), weights.display()))?;
    finish_plot(run, &metrics)?;
    let rows = metrics.rows()?;
    let mut tps: Vec<f64> = rows.iter().skip(1).filter_map(|r| r.tokens_per_sec).collect();
    if tps.is_empty() {
        tps = rows.iter().filter_map(|r| r.tokens_per_sec).collect();
    }
    let summary = Summary {
        steps: state.step,
        tokens_per_sec: median(&mut tps),
        final_train_loss: last_train.or_else(|| rows.iter().rev().find_map(|r| r.train_loss)),
        final_val_loss: state.val_loss,
        params,
        flops_per_token: cfg.model.flops_per_token(),
        device: opts.device_name.clone(),
        train_seconds: state.train_seconds,
        peak_rss_mib: crate::bench::peak_rss_mib(),
        mixture: None,
    };
    write_atomic(&run.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    Ok(Outcome::Finished(summary))
}
