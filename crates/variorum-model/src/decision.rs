//! The Decision Transformer (Chen et al. 2021): reinforcement learning as conditional sequence
//! modelling. A trajectory is read as the token sequence
//!
//! τ = (R̂_1, s_1, a_1, R̂_2, s_2, a_2, …),   R̂_t = Σ_{t' ≥ t} r_{t'},
//!
//! each token embedded by its own linear layer (return-to-go, state, action) plus a learned
//! embedding of its step's timestep t — the only position signal — then normalised and run
//! through a causal transformer; the action a_t is predicted from the output at s_t. Acting,
//! the model is given the return it should achieve as R̂_1 and subtracts each reward received.
//!
//! The transformer is any causal stack the `[model]` table composes (attention kind, block,
//! feed-forward, relative position scheme), run over the embedded tokens by
//! [`DecoderLm::forward_embedded`]; its one-row token embedding is unused, as in Hugging Face's
//! `DecisionTransformerModel`, whose GPT-2 has `vocab_size = 1`.
//!
//! Choices where the paper leaves them open, following the authors' code and Hugging Face's:
//! discrete actions enter one-hot through a linear layer (`embed_action`) and leave as logits
//! (cross-entropy); continuous ones leave through tanh (squared error). With
//! `predict_states_and_returns` the output at a_t also predicts s_{t+1} and R̂_{t+1} (Hugging
//! Face's `predict_state` and `predict_return`; the paper found that this does not help), each
//! trained by squared error. With `returns = false` the sequence is (s_1, a_1, s_2, a_2, …): the
//! same transformer as a behaviour-cloning policy, the paper's BC baseline.

use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use serde::{Deserialize, Serialize};
use variorum_block::Norm;
use variorum_core::{AuxLosses, ConfigError, error::check};

use crate::{DecoderLm, DecoderState, ModelConfig};

/// How actions are read and predicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    /// One of `action_dim` choices: one-hot in, logits out, cross-entropy.
    #[default]
    Discrete,
    /// `action_dim` numbers in [−1, 1]: tanh out, squared error.
    Continuous,
}

/// `[model.decision]`: the Decision Transformer's settings (`model.kind = "decision-transformer"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DecisionConfig {
    /// Condition on returns-to-go: (R̂, s, a) per step. `false`: (s, a) per step, the same
    /// transformer as a behaviour-cloning policy. Default true.
    pub returns: bool,
    /// Returns-to-go are divided by this before their embedding (the authors use 1,000 for
    /// MuJoCo's returns in the thousands). Default 1.
    pub return_scale: f64,
    /// Rows of the timestep embedding: steps numbered 0..max_timestep. Default: the longest
    /// episode of the data (set when training starts).
    pub max_timestep: Option<usize>,
    /// Length of a state. Default: the data's.
    pub state_dim: Option<usize>,
    /// Choices of a discrete action, or numbers of a continuous one. Default: the data's.
    pub action_dim: Option<usize>,
    /// Discrete or continuous actions. Default: the data's.
    pub actions: Option<ActionKind>,
    /// Also predict s_{t+1} and R̂_{t+1} from the output at a_t (squared error). Default false.
    pub predict_states_and_returns: bool,
}

impl Default for DecisionConfig {
    fn default() -> Self {
        Self {
            returns: true,
            return_scale: 1.0,
            max_timestep: None,
            state_dim: None,
            action_dim: None,
            actions: None,
            predict_states_and_returns: false,
        }
    }
}

impl DecisionConfig {
    /// Tokens per step: 3 with returns, 2 without.
    pub fn tokens_per_step(&self) -> usize {
        if self.returns { 3 } else { 2 }
    }

    /// Forward FLOPs per token outside the blocks: a step's embeddings (return, state, action)
    /// and its action head, spread over the step's tokens (the sizes once resolved; 0 before).
    pub fn flops_per_token(&self, d_model: usize) -> u64 {
        let (s, a) = (self.state_dim.unwrap_or(0), self.action_dim.unwrap_or(0));
        let per_step = 2 * d_model * (self.returns as usize + s + a + a);
        (per_step / self.tokens_per_step()) as u64
    }

    /// Checks the section alone and against `model`; messages name the key.
    pub fn validate(&self, model: &ModelConfig) -> Result<(), ConfigError> {
        check(self.return_scale.is_finite() && self.return_scale > 0.0, || {
            format!("model.decision.return_scale = {} must be a positive number", self.return_scale)
        })?;
        for (key, v) in
            [("max_timestep", self.max_timestep), ("state_dim", self.state_dim), ("action_dim", self.action_dim)]
        {
            check(v != Some(0), || format!("model.decision.{key} must be at least 1"))?;
        }
        let tps = self.tokens_per_step();
        check(model.seq_len.is_multiple_of(tps), || {
            format!(
                "model.seq_len = {} is the context in tokens, {tps} per step (return-to-go, state, action{}): use a multiple of {tps}, e.g. {}",
                model.seq_len,
                if self.returns { "" } else { " without returns: state, action" },
                tps * (model.seq_len / tps).max(1)
            )
        })?;
        let attention = model.attention.capabilities();
        let kind = model.attention.kind();
        let refusals = [
            (
                model.position.capabilities().absolute,
                format!(
                    "model.position.kind = \"{}\" adds positions to the input; the Decision Transformer's position signal is its timestep embedding: use \"none\" or a relative scheme",
                    model.position.kind()
                ),
            ),
            (
                !attention.causal,
                format!(
                    "model.attention.kind = \"{kind}\" has no causal form, and an action may not see what follows it"
                ),
            ),
            (
                !attention.variable_length,
                format!(
                    "model.attention.kind = \"{kind}\" needs sequences of one fixed length; acting reads the steps so far"
                ),
            ),
            (
                attention.global_input || attention.remembers || model.attention.tags().is_some(),
                format!(
                    "model.attention.kind = \"{kind}\" needs global tokens, memories or tags, which trajectories do not carry"
                ),
            ),
            (
                !model.memory.is_none(),
                "model.memory carries segments along ordered streams; trajectories are drawn as windows".into(),
            ),
            (
                matches!(&model.depth, variorum_block::DepthConfig::Universal(u) if u.act),
                "model.depth's Adaptive Computation Time halts tokens of a text; use act = false".into(),
            ),
            (!matches!(model.exits, crate::ExitConfig::None), "model.exits predict tokens; remove them".into()),
            (!model.objective.is_causal(), "model.objective must be causal".into()),
            (
                model.long_term_memory.is_some() || model.cross_attention.is_some(),
                "model.long_term_memory and model.cross_attention read text; remove them".into(),
            ),
        ];
        for (refused, why) in refusals {
            check(!refused, || format!("model.kind = \"decision-transformer\": {why}"))?;
        }
        Ok(())
    }
}

/// The Decision Transformer a `[model]` table with `kind = "decision-transformer"` describes.
#[derive(Module, Debug)]
pub struct DecisionTransformer {
    /// The timestep embedding `[max_timestep, d_model]`, added to each step's three tokens.
    pub embed_timestep: Embedding,
    /// R̂ / return_scale → d_model; absent without returns (behaviour cloning).
    pub embed_return: Option<Linear>,
    /// state → d_model.
    pub embed_state: Linear,
    /// action (one-hot when discrete) → d_model.
    pub embed_action: Linear,
    /// The norm of the embedded tokens (the blocks' norm kind).
    pub embed_norm: Norm,
    /// The causal stack.
    pub backbone: DecoderLm,
    /// d_model → action logits or values, read at the state tokens.
    pub predict_action: Linear,
    /// d_model → next state, read at the action tokens (`predict_states_and_returns`).
    pub predict_state: Option<Linear>,
    /// d_model → next return-to-go / return_scale, read at the action tokens.
    pub predict_return: Option<Linear>,
    /// Discrete or continuous actions.
    #[module(skip)]
    pub actions: ActionKind,
    /// `model.decision.return_scale`.
    pub return_scale: f64,
    /// Tokens per step (3, or 2 without returns).
    pub tokens_per_step: usize,
    /// Steps of context: `seq_len / tokens_per_step`.
    pub context: usize,
}

/// A window of steps as tensors, `[batch, steps, …]`.
#[derive(Debug, Clone)]
pub struct StepInputs {
    /// `[batch, steps]` returns-to-go, unscaled.
    pub returns_to_go: Tensor<2>,
    /// `[batch, steps, state_dim]`.
    pub states: Tensor<3>,
    /// The actions taken.
    pub actions: ActionInputs,
    /// `[batch, steps]` each step's number in its episode.
    pub timesteps: Tensor<2, Int>,
}

/// Actions as tensors.
#[derive(Debug, Clone)]
pub enum ActionInputs {
    /// `[batch, steps]` choice numbers.
    Discrete(Tensor<2, Int>),
    /// `[batch, steps, action_dim]`.
    Continuous(Tensor<3>),
}

/// What a forward over a window predicts.
#[derive(Debug)]
pub struct DecisionOutput {
    /// `[batch, steps, action_dim]`: logits (discrete) or tanh values (continuous), read at
    /// each step's state token.
    pub actions: Tensor<3>,
    /// `[batch, steps, state_dim]` next states, read at each action token.
    pub states: Option<Tensor<3>>,
    /// `[batch, steps]` next returns-to-go / return_scale, read at each action token.
    pub returns: Option<Tensor<2>>,
    /// The stack's auxiliary losses.
    pub aux_losses: AuxLosses,
}

impl ModelConfig {
    /// The Decision Transformer of this config (`kind = "decision-transformer"`, its
    /// `[model.decision]` resolved: state and action sizes and the timestep table set).
    pub fn init_decision(&self, device: &Device) -> DecisionTransformer {
        let dc = self.decision.clone().unwrap_or_default();
        let (s, a, steps) = (
            dc.state_dim.expect("model.decision.state_dim is resolved from the data"),
            dc.action_dim.expect("model.decision.action_dim is resolved from the data"),
            dc.max_timestep.expect("model.decision.max_timestep is resolved from the data"),
        );
        let d = self.d_model;
        let init = Initializer::Normal { mean: 0.0, std: self.init_std };
        let linear = |i: usize, o: usize| LinearConfig::new(i, o).with_initializer(init.clone()).init(device);
        let backbone = ModelConfig { vocab_size: Some(1), ..self.clone() };
        let norm = self.block.residual();
        let model = DecisionTransformer {
            embed_timestep: EmbeddingConfig::new(steps, d).with_initializer(init.clone()).init(device),
            embed_return: dc.returns.then(|| linear(1, d)),
            embed_state: linear(s, d),
            embed_action: linear(a, d),
            embed_norm: norm.norm.init(d, norm.norm_eps, device),
            backbone: DecoderLm::new(&backbone, device),
            predict_action: linear(d, a),
            predict_state: dc.predict_states_and_returns.then(|| linear(d, s)),
            predict_return: dc.predict_states_and_returns.then(|| linear(d, 1)),
            actions: dc.actions.unwrap_or_default(),
            return_scale: dc.return_scale,
            tokens_per_step: dc.tokens_per_step(),
            context: self.seq_len / dc.tokens_per_step(),
        };
        model.map(&mut crate::param_ids::PathIds::default())
    }
}

impl DecisionTransformer {
    /// The embedded tokens of `x`, `[batch, tokens_per_step · steps, d_model]` in the order
    /// (R̂_t, s_t, a_t) per step, each its own embedding plus its step's timestep embedding,
    /// normalised, then the embedding dropout.
    pub fn embed(&self, x: &StepInputs) -> Tensor<3> {
        let [b, steps] = x.timesteps.dims();
        let time = self.embed_timestep.forward(x.timesteps.clone());
        let mut tokens = Vec::with_capacity(3);
        if let Some(r) = &self.embed_return {
            let rtg = x.returns_to_go.clone().div_scalar(self.return_scale).unsqueeze_dim::<3>(2);
            tokens.push(r.forward(rtg) + time.clone());
        }
        tokens.push(self.embed_state.forward(x.states.clone()) + time.clone());
        tokens.push(self.embed_actions(&x.actions) + time);
        let d = tokens[0].dims()[2];
        let interleaved = Tensor::stack::<4>(tokens, 2).reshape([b, steps * self.tokens_per_step, d]);
        self.backbone.embedding_dropout.forward(self.embed_norm.forward(interleaved))
    }

    /// The action embedding: a linear layer on one-hot choices (a row of its weight plus its
    /// bias) or on the action vector.
    fn embed_actions(&self, actions: &ActionInputs) -> Tensor<3> {
        match actions {
            ActionInputs::Discrete(a) => {
                let [b, steps] = a.dims();
                let w = self.embed_action.weight.val();
                let d = w.dims()[1];
                let rows = w.select(0, a.clone().reshape([b * steps])).reshape([b, steps, d]);
                match &self.embed_action.bias {
                    Some(bias) => rows + bias.val().unsqueeze::<3>(),
                    None => rows,
                }
            }
            ActionInputs::Continuous(a) => self.embed_action.forward(a.clone()),
        }
    }

    /// Forward over fresh windows: every step's predictions.
    pub fn forward(&self, x: &StepInputs) -> DecisionOutput {
        let [b, steps] = x.timesteps.dims();
        let (h, aux_losses) = self.backbone.forward_embedded(self.embed(x), None);
        let d = h.dims()[2];
        let per_step = h.reshape([b, steps, self.tokens_per_step, d]);
        let at = |i: usize| per_step.clone().narrow(2, i, 1).reshape([b, steps, d]);
        let actions = self.action_output(at(self.tokens_per_step - 2));
        let after_action = at(self.tokens_per_step - 1);
        DecisionOutput {
            actions,
            states: self.predict_state.as_ref().map(|p| p.forward(after_action.clone())),
            returns: self.predict_return.as_ref().map(|p| p.forward(after_action).reshape([b, steps])),
            aux_losses,
        }
    }

    fn action_output(&self, h: Tensor<3>) -> Tensor<3> {
        let y = self.predict_action.forward(h);
        match self.actions {
            ActionKind::Discrete => y,
            ActionKind::Continuous => burn::tensor::activation::tanh(y),
        }
    }

    /// The action to take after the last step of `x`, whose own action is not read
    /// (`[batch, action_dim]`: logits or values). `x` is the context: every step of the episode
    /// so far, or its last `context` steps once it is longer. With `cache` (which must have seen
    /// only this episode's earlier calls), a window that extends the previous call's by one
    /// step runs only the new tokens (the last action, R̂_t, s_t) through the KV caches; any
    /// other window (the first, or one whose start moved) runs whole and refills the cache.
    pub fn next_action(&self, x: &StepInputs, cache: Option<&mut DecoderState>) -> Tensor<2> {
        let [b, steps] = x.timesteps.dims();
        let tps = self.tokens_per_step;
        let tokens = self.embed(x).narrow(1, 0, tps * steps - 1);
        let h = match cache {
            Some(c) if steps > 1 && c.position == tps * (steps - 1) - 1 => {
                self.backbone.forward_embedded(tokens.narrow(1, tps * (steps - 1) - 1, tps), Some(c)).0
            }
            Some(c) => {
                *c = DecoderState::default();
                self.backbone.forward_embedded(tokens, Some(c)).0
            }
            None => self.backbone.forward_embedded(tokens, None).0,
        };
        let (len, a) = (h.dims()[1], self.predict_action.weight.dims()[1]);
        self.action_output(h.narrow(1, len - 1, 1)).reshape([b, a])
    }

    /// The training loss over a window's valid steps (`valid`: `[batch, steps]`, 1 or 0):
    /// cross-entropy of the taken choice, or the squared error of the action, averaged over the
    /// valid steps; with state and return heads, their squared errors against the next step's
    /// (where it is valid) added. Returns the total and the action term alone.
    pub fn loss(&self, x: &StepInputs, valid: Tensor<2>) -> (Tensor<1>, Tensor<1>, AuxLosses) {
        let out = self.forward(x);
        let [b, steps] = valid.dims();
        let count = valid.clone().sum().clamp_min(1.0);
        let action = match &x.actions {
            ActionInputs::Discrete(a) => {
                let logp = log_softmax(out.actions, 2);
                let taken = logp.gather(2, a.clone().unsqueeze_dim::<3>(2)).reshape([b, steps]);
                -(taken * valid.clone()).sum() / count.clone()
            }
            ActionInputs::Continuous(a) => {
                let err = (out.actions - a.clone()).powi_scalar(2).mean_dim(2).reshape([b, steps]);
                (err * valid.clone()).sum() / count.clone()
            }
        };
        // the stack's auxiliary losses come weighted
        let mut total = out.aux_losses.iter().fold(action.clone(), |t, (_, l)| t + l.clone());
        if steps > 1 {
            // the next step's state and return-to-go, where both steps are valid
            let next_valid = valid.clone().narrow(1, 1, steps - 1) * valid.narrow(1, 0, steps - 1);
            let n = next_valid.clone().sum().clamp_min(1.0);
            if let Some(pred) = out.states {
                let target = x.states.clone().narrow(1, 1, steps - 1);
                let err = (pred.narrow(1, 0, steps - 1) - target).powi_scalar(2).mean_dim(2).reshape([b, steps - 1]);
                total = total + (err * next_valid.clone()).sum() / n.clone();
            }
            if let Some(pred) = out.returns {
                let target = x.returns_to_go.clone().narrow(1, 1, steps - 1).div_scalar(self.return_scale);
                let err = (pred.narrow(1, 0, steps - 1) - target).powi_scalar(2);
                total = total + (err * next_valid).sum() / n;
            }
        }
        (total, action, out.aux_losses)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Distribution;

    use super::*;

    const S: usize = 5;
    const A: usize = 3;

    fn config(extra: &str) -> ModelConfig {
        config_of(12, extra, "")
    }

    fn config_of(seq_len: usize, extra: &str, decision: &str) -> ModelConfig {
        let text = format!(
            "kind = \"decision-transformer\"\nd_model = 16\nn_layers = 2\nseq_len = {seq_len}\ninit_std = 0.3\n{extra}\n\
             [attention]\nkind = \"full\"\nn_heads = 2\n[position]\nkind = \"none\"\n\
             [decision]\nstate_dim = {S}\naction_dim = {A}\nmax_timestep = 20\n{decision}\n"
        );
        let cfg: ModelConfig = toml::from_str(&text).unwrap();
        cfg.validate().unwrap();
        cfg
    }

    fn model(cfg: &ModelConfig) -> DecisionTransformer {
        cfg.init_decision(&Device::flex())
    }

    fn inputs(b: usize, steps: usize, seed: u64) -> StepInputs {
        let device = Device::flex();
        device.seed(seed);
        let ts: Vec<i64> = (0..b * steps).map(|i| (i % steps) as i64 + 2).collect();
        let acts: Vec<i64> = (0..b * steps).map(|i| (i * 7 % A) as i64).collect();
        StepInputs {
            returns_to_go: Tensor::random([b, steps], Distribution::Normal(0.0, 2.0), &device),
            states: Tensor::random([b, steps, S], Distribution::Normal(0.0, 1.0), &device),
            actions: ActionInputs::Discrete(Tensor::from_data(TensorData::new(acts, [b, steps]), &device)),
            timesteps: Tensor::from_data(TensorData::new(ts, [b, steps]), &device),
        }
    }

    fn close(a: Tensor<3>, b: Tensor<3>, tol: f32) {
        let d = (a - b).abs().max().into_scalar::<f32>();
        assert!(d < tol, "differ by {d}");
    }

    #[test]
    fn the_tokens_are_return_state_action_per_step_each_with_its_timestep() {
        let cfg = config("");
        let m = model(&cfg);
        let x = inputs(2, 4, 1);
        let got = m.embed(&x);
        // by hand: R̂/scale·w_R + b_R, s·W_s + b_s, W_a[a] + b_a, each + E[t], then the norm
        let time = m.embed_timestep.weight.val().select(0, x.timesteps.clone().reshape([8])).reshape([2, 4, 16]);
        let lin = |l: &Linear, v: Tensor<3>| {
            v.matmul(l.weight.val().unsqueeze()) + l.bias.as_ref().unwrap().val().unsqueeze()
        };
        let r = lin(m.embed_return.as_ref().unwrap(), x.returns_to_go.clone().unsqueeze_dim(2)) + time.clone();
        let s = lin(&m.embed_state, x.states.clone()) + time.clone();
        let ActionInputs::Discrete(a) = &x.actions else { unreachable!() };
        let one_hot: Tensor<3> = a.clone().one_hot::<3>(A).float();
        let act = lin(&m.embed_action, one_hot) + time;
        for t in 0..4 {
            for (j, want) in [&r, &s, &act].into_iter().enumerate() {
                let token = got.clone().narrow(1, 3 * t + j, 1);
                close(token, m.embed_norm.forward(want.clone().narrow(1, t, 1)), 1e-5);
            }
        }
    }

    #[test]
    fn an_action_is_predicted_from_its_state_token_and_sees_nothing_after_it() {
        let m = model(&config(""));
        let x = inputs(1, 4, 2);
        let base = m.forward(&x).actions;
        for t in 0..4 {
            // the step's own action and everything after it: no change up to t
            let mut y = x.clone();
            let ActionInputs::Discrete(a) = &y.actions else { unreachable!() };
            y.actions = ActionInputs::Discrete(
                a.clone()
                    .slice_assign([0..1, t..t + 1], Tensor::from_data([[(t as i64 + 1) % A as i64]], &Device::flex())),
            );
            if t + 1 < 4 {
                y.returns_to_go = y
                    .returns_to_go
                    .clone()
                    .slice_assign([0..1, t + 1..4], Tensor::ones([1, 3 - t], &Device::flex()).mul_scalar(9.0));
                y.states =
                    y.states.clone().slice_assign([0..1, t + 1..4, 0..S], Tensor::ones([1, 3 - t, S], &Device::flex()));
            }
            let out = m.forward(&y).actions;
            close(out.clone().narrow(1, 0, t + 1), base.clone().narrow(1, 0, t + 1), 1e-6);
            // ... and the step's return-to-go and state do reach it
            let mut z = x.clone();
            z.returns_to_go =
                z.returns_to_go.clone().slice_assign([0..1, t..t + 1], Tensor::from_data([[50.0]], &Device::flex()));
            let moved =
                (m.forward(&z).actions.narrow(1, t, 1) - base.clone().narrow(1, t, 1)).abs().max().into_scalar::<f32>();
            assert!(moved > 1e-4, "step {t}: the return-to-go does not reach its action ({moved})");
            let mut z = x.clone();
            z.states = z
                .states
                .clone()
                .slice_assign([0..1, t..t + 1, 0..S], Tensor::ones([1, 1, S], &Device::flex()).mul_scalar(5.0));
            let moved =
                (m.forward(&z).actions.narrow(1, t, 1) - base.clone().narrow(1, t, 1)).abs().max().into_scalar::<f32>();
            assert!(moved > 1e-4, "step {t}: the state does not reach its action ({moved})");
        }
    }

    #[test]
    fn acting_with_the_cache_equals_the_full_forward_at_every_step() {
        for extra in ["", "[block]\nkind = \"post-ln\""] {
            let m = model(&config(extra));
            let x = inputs(2, 9, 3);
            let mut cache = DecoderState::default();
            for t in 0..9usize {
                // the context: the episode so far, its last 4 steps once longer
                let from = (t + 1).saturating_sub(m.context);
                let window = StepInputs {
                    returns_to_go: x.returns_to_go.clone().narrow(1, from, t + 1 - from),
                    states: x.states.clone().narrow(1, from, t + 1 - from),
                    actions: match &x.actions {
                        ActionInputs::Discrete(a) => ActionInputs::Discrete(a.clone().narrow(1, from, t + 1 - from)),
                        ActionInputs::Continuous(_) => unreachable!(),
                    },
                    timesteps: x.timesteps.clone().narrow(1, from, t + 1 - from),
                };
                let cached = m.next_action(&window, Some(&mut cache));
                let full = m.forward(&window).actions;
                let n = full.dims()[1];
                close(cached.unsqueeze_dim(1), full.narrow(1, n - 1, 1), 2e-5);
            }
        }
    }

    #[test]
    fn without_returns_the_steps_are_state_action_and_returns_are_not_read() {
        let cfg = config_of(8, "", "returns = false");
        let m = model(&cfg);
        assert!(m.embed_return.is_none());
        assert_eq!((m.tokens_per_step, m.context), (2, 4));
        let x = inputs(1, 4, 4);
        let mut y = x.clone();
        y.returns_to_go = y.returns_to_go.mul_scalar(100.0);
        close(m.forward(&x).actions, m.forward(&y).actions, 0.0 + 1e-9);
        assert_eq!(m.embed(&x).dims(), [1, 8, 16]);
    }

    #[test]
    fn the_loss_is_the_cross_entropy_of_the_taken_actions_over_valid_steps() {
        let m = model(&config(""));
        let x = inputs(2, 4, 5);
        let valid: Tensor<2> = Tensor::from_data([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]], &Device::flex());
        let (_, action, _) = m.loss(&x, valid);
        let logits = m.forward(&x).actions.into_data().try_to_vec::<f32>().unwrap();
        let ActionInputs::Discrete(a) = &x.actions else { unreachable!() };
        let a = a.clone().into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        let mut sum = 0.0f64;
        for (row, step) in [(0, 0), (0, 1), (0, 2), (1, 0)] {
            let i = row * 4 + step;
            let l = &logits[i * A..(i + 1) * A];
            let lse = l.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
            sum += lse - l[a[i] as usize] as f64;
        }
        let got = action.into_scalar::<f32>() as f64;
        assert!((got - sum / 4.0).abs() < 1e-5, "{got} vs {}", sum / 4.0);
    }

    #[test]
    fn a_config_the_decision_transformer_cannot_run_is_refused_by_name() {
        let refused = |extra: &str, part: &str| {
            let text = format!(
                "kind = \"decision-transformer\"\nd_model = 16\nn_layers = 2\n{extra}\n[decision]\nstate_dim = 2\n"
            );
            let cfg: ModelConfig = toml::from_str(&text).unwrap();
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(part), "{extra}: {e}");
        };
        refused("seq_len = 10\n[position]\nkind = \"none\"", "multiple of 3");
        refused("seq_len = 12\n[position]\nkind = \"learned\"", "timestep embedding");
        refused(
            "seq_len = 12\n[position]\nkind = \"none\"\n[attention]\nkind = \"linformer\"\nmax_len = 12\nk = 4",
            "linformer",
        );
        let cfg: ModelConfig = toml::from_str("[decision]\nreturns = false").unwrap();
        assert!(cfg.validate().unwrap_err().to_string().contains("not \"decision-transformer\""));
    }
}
