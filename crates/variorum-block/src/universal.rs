//! Depth as a config axis, `model.depth`: a stack of distinct blocks, or the Universal Transformer
//! (Dehghani et al. 2019) — one block applied `model.n_layers` times with shared weights, the
//! position ⊕ step signal before each step (`model.position.kind = "universal-timestep"`), and
//! optionally Adaptive Computation Time (Graves 2016) deciding per position how many steps count.
//!
//! ACT, per position, with the state s_t entering step t and the block's output y_t:
//!
//! p_t = σ(w·s_t + b),  N = min{n : Σ_{t≤n} p_t ≥ 1 − ε} (or the last step),
//! R = 1 − Σ_{t<N} p_t,  w_t = p_t for t < N, w_N = R, 0 after,
//! output = Σ_t w_t y_t,  ponder cost ρ = N + R, loss += τ·mean(ρ).
//!
//! The weights sum to 1 for every position; after halting a position's output stays as it is
//! (its state is copied forward) while the block keeps transforming its state, so later positions
//! still attend to it and a cached step-by-step decoding computes exactly what the full forward
//! does. R carries the gradient of ρ to the halting unit.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::sigmoid;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, KindInfo, error::check};

/// `model.depth`, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DepthConfig {
    /// `model.n_layers` distinct blocks.
    #[default]
    Stack,
    /// One block applied `model.n_layers` times.
    Universal(UniversalConfig),
}

/// `model.depth` with `kind = "universal"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UniversalConfig {
    /// Adaptive Computation Time; without it every position takes every step. Default true.
    pub act: bool,
    /// 1 − ε: a position halts once its halting probabilities reach this. Default 0.99.
    pub threshold: f64,
    /// τ, weight of the ponder cost. Default 0.01.
    pub ponder_weight: f64,
    /// Initial bias of the halting unit. Default 1 (as in the Universal Transformer's code).
    pub halting_bias: f64,
}

impl Default for UniversalConfig {
    fn default() -> Self {
        Self { act: true, threshold: 0.99, ponder_weight: 0.01, halting_bias: 1.0 }
    }
}

impl DepthConfig {
    /// The name in a config (the `kind` key).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Stack => "stack",
            Self::Universal(_) => "universal",
        }
    }

    /// Tiny settings the generic tests run, named by what they exercise (the zoo runs them with
    /// 3 block applications and the timestep signal).
    pub fn test_variants() -> Vec<(String, Self)> {
        let ut = |act: bool| Self::Universal(UniversalConfig { act, halting_bias: -1.0, ..Default::default() });
        vec![("depth universal".into(), ut(false)), ("depth universal + act".into(), ut(true))]
    }

    /// Whether a trained model shows what its depth learned (ACT: the steps each token took).
    pub fn shows_what_it_learned(&self) -> bool {
        matches!(self, Self::Universal(u) if u.act)
    }

    /// Whether the blocks share one set of weights.
    pub fn shared(&self) -> bool {
        matches!(self, Self::Universal(_))
    }

    /// Checks the settings; messages name the config key (`model.depth.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Stack => Ok(()),
            Self::Universal(u) => {
                check(u.threshold > 0.0 && u.threshold <= 1.0, || {
                    format!("model.depth.threshold = {} must be in (0, 1] (it is 1 − ε)", u.threshold)
                })?;
                check(u.ponder_weight >= 0.0, || "model.depth.ponder_weight must be >= 0".into())
            }
        }
    }

    /// ACT's halting unit (weights normal with std `init_std`, bias `halting_bias`), if the depth
    /// is universal with `act`.
    pub fn init_act(&self, d_model: usize, init_std: f64, device: &Device) -> Option<Act> {
        match self {
            Self::Universal(u) if u.act => {
                let mut halting = LinearConfig::new(d_model, 1)
                    .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                    .init(device);
                halting.bias = halting
                    .bias
                    .map(|b| burn::module::Param::from_tensor(b.val().ones_like().mul_scalar(u.halting_bias)));
                Some(Act { halting, threshold: u.threshold, ponder_weight: u.ponder_weight })
            }
            _ => None,
        }
    }

    /// The `variorum zoo` rows.
    pub fn zoo() -> Vec<KindInfo> {
        let caps = variorum_core::Capabilities::NEUTRAL;
        vec![
            KindInfo { axis: "model.depth", kind: "stack", summary: "n_layers distinct blocks", paper: "", caps },
            KindInfo {
                axis: "model.depth",
                kind: "universal",
                summary: "one shared block applied n_layers times; Adaptive Computation Time with ponder cost",
                paper: "Dehghani et al. 2019, Universal Transformers; Graves 2016, Adaptive Computation Time",
                caps: variorum_core::Capabilities { aux_losses: true, ..caps },
            },
        ]
    }
}

/// The halting unit and ACT's settings.
#[derive(Module, Debug)]
pub struct Act {
    /// The halting unit w·s + b, `d_model` → 1; p_t is its sigmoid.
    pub halting: Linear,
    /// 1 − ε: a position halts once its halting probabilities reach this.
    pub threshold: f64,
    /// τ, weight of the ponder cost.
    pub ponder_weight: f64,
}

/// ACT's running totals over the steps of one forward, per position `[b, len]`.
pub struct ActState {
    /// 1 for a position that has halted, 0 while it runs.
    pub halted: Tensor<2>,
    /// Σ p over the steps taken so far (then 1 once halted).
    pub halting_probability: Tensor<2>,
    /// R, the remainder each position took when it halted (0 before).
    pub remainders: Tensor<2>,
    /// Steps that counted (N).
    pub n_updates: Tensor<2>,
    /// Σ w_t y_t so far.
    pub output: Option<Tensor<3>>,
    /// Σ w_t so far (1 for every position at the end).
    pub weight_sum: Tensor<2>,
}

impl Act {
    /// The totals before the first step: zeros for `[batch, len]` positions.
    pub fn start(&self, batch: usize, len: usize, device: &Device) -> ActState {
        let z = || Tensor::zeros([batch, len], device);
        ActState {
            halted: z(),
            halting_probability: z(),
            remainders: z(),
            n_updates: z(),
            output: None,
            weight_sum: z(),
        }
    }

    /// One step: `input` is the state entering it, `output` the block's result; `last` forces
    /// every running position to halt.
    pub fn step(&self, st: &mut ActState, input: Tensor<3>, output: Tensor<3>, last: bool) {
        let [b, l, _] = input.dims();
        let p = sigmoid(self.halting.forward(input)).reshape([b, l]);
        let running = st.halted.clone().neg().add_scalar(1.0);
        let reaches = (st.halting_probability.clone() + p.clone()).greater_equal_elem(self.threshold).float();
        let halts = if last { running.clone() } else { reaches * running.clone() };
        let continues = running - halts.clone();
        st.halting_probability = st.halting_probability.clone() + p.clone() * continues.clone();
        let remainder = halts.clone() * st.halting_probability.clone().neg().add_scalar(1.0);
        st.remainders = st.remainders.clone() + remainder.clone();
        st.halting_probability = st.halting_probability.clone() + remainder.clone();
        st.n_updates = st.n_updates.clone() + continues.clone() + halts.clone();
        st.halted = st.halted.clone() + halts;
        let w = p * continues + remainder;
        st.weight_sum = st.weight_sum.clone() + w.clone();
        let weighted = output * w.unsqueeze_dim(2);
        st.output = Some(match st.output.take() {
            Some(o) => o + weighted,
            None => weighted,
        });
    }

    /// τ·mean(N + R) over every position, or over those `counted` marks (`[batch, len]`, 1 for a
    /// position of an example, 0 for padding: graph data).
    pub fn ponder_cost(&self, st: &ActState, counted: Option<Tensor<2>>) -> Tensor<1> {
        let cost = st.n_updates.clone() + st.remainders.clone();
        let mean = match counted {
            Some(c) => (cost * c.clone()).sum() / c.sum().clamp_min(1.0),
            None => cost.mean(),
        };
        mean.mul_scalar(self.ponder_weight).reshape([1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn act(dev: &Device) -> Act {
        DepthConfig::Universal(UniversalConfig { halting_bias: -1.0, ..Default::default() })
            .init_act(8, 0.5, dev)
            .unwrap()
    }

    #[test]
    fn weights_sum_to_one_and_steps_stay_within_the_maximum() {
        let dev = Device::flex();
        let act = act(&dev);
        let mut st = act.start(2, 5, &dev);
        for t in 0..4 {
            let x: Tensor<3> = Tensor::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
            act.step(&mut st, x.clone(), x, t == 3);
        }
        let sums = st.weight_sum.clone().into_data().try_to_vec::<f32>().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
        let hp = st.halting_probability.clone().into_data().try_to_vec::<f32>().unwrap();
        assert!(hp.iter().all(|s| (s - 1.0).abs() < 1e-5), "probabilities plus remainders: {hp:?}");
        let n = st.n_updates.clone().into_data().try_to_vec::<f32>().unwrap();
        assert!(n.iter().all(|&s| (1.0..=4.0).contains(&s)), "{n:?}");
        // with random inputs and bias −1 some positions run longer than others
        assert!(n.iter().any(|&s| s != n[0]) || n[0] > 1.0);
    }

    #[test]
    fn ponder_cost_leaves_out_what_is_not_counted() {
        let dev = Device::flex();
        let act = act(&dev);
        let mut st = act.start(1, 4, &dev);
        st.n_updates = Tensor::from_data(TensorData::new(vec![1.0f32, 2.0, 9.0, 9.0], [1, 4]), &dev);
        st.remainders = Tensor::zeros([1, 4], &dev);
        let counted = Tensor::from_data(TensorData::new(vec![1.0f32, 1.0, 0.0, 0.0], [1, 4]), &dev);
        let tau = act.ponder_weight as f32;
        let only = act.ponder_cost(&st, Some(counted)).into_scalar::<f32>();
        assert!((only - 1.5 * tau).abs() < 1e-6, "{only}");
        let all = act.ponder_cost(&st, None).into_scalar::<f32>();
        assert!((all - 5.25 * tau).abs() < 1e-6, "{all}");
    }

    #[test]
    fn ponder_cost_gradient_reaches_the_halting_unit() {
        let dev = Device::flex().autodiff();
        let act = act(&dev);
        let mut st = act.start(1, 3, &dev);
        for t in 0..3 {
            let x: Tensor<3> = Tensor::random([1, 3, 8], Distribution::Normal(0.0, 1.0), &dev);
            act.step(&mut st, x.clone(), x, t == 2);
        }
        let grads = act.ponder_cost(&st, None).backward();
        let g = act.halting.weight.grad(&grads).unwrap().abs().sum().into_scalar::<f32>();
        assert!(g > 0.0);
    }
}
