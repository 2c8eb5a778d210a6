//! The GTrXL gate (Parisotto et al. 2020, "Stabilizing Transformers for Reinforcement Learning"):
//! a GRU-style gate that replaces the residual sum x + y of a block,
//!
//! r = σ(W_r y + U_r x),   z = σ(W_z y + U_z x − b_g),
//! ĥ = tanh(W_g y + U_g (r ⊙ x)),   g(x, y) = (1 − z) ⊙ x + z ⊙ ĥ,
//!
//! where x is the residual stream and y the branch output (after a ReLU, in the paper's
//! identity-map reordering: norms on the branch inputs only). With the bias b_g > 0 the update
//! gate starts nearly closed, z ≈ σ(−b_g), so a fresh block is close to the identity map.
//!
//! b_g^(l) is learned, like the paper's: a parameter of each gate (one per dimension, as a GRU's
//! biases are), starting at the config's `gate_bias`. `learn_gate_bias = false` keeps it a
//! constant (the form before this option, which also loads runs trained with it).

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::sigmoid;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, Declared};

use crate::NormKind;
use crate::block::{BlockKind, ResidualConfig};

/// `model.block` with `kind = "gtrxl"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GtrxlConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
    /// b_g, the update gate's (initial) bias; > 0 starts each block near the identity. Default 2
    /// (the paper's).
    pub gate_bias: f64,
    /// Learn b_g per gate and dimension from `gate_bias` (the paper's); false: a constant.
    /// Default true.
    pub learn_gate_bias: bool,
}

impl Default for GtrxlConfig {
    fn default() -> Self {
        Self { norm: NormKind::LayerNorm, norm_eps: 1e-5, gate_bias: 2.0, learn_gate_bias: true }
    }
}

impl Declared for GtrxlConfig {
    const SUMMARY: &'static str =
        "norms on branch inputs only, GRU-style gates instead of residual sums, gate bias > 0 (near-identity start)";
    const PAPER: &'static str = "Parisotto et al. 2020, Stabilizing Transformers for Reinforcement Learning";
    const CAPS: Capabilities = Capabilities::NEUTRAL;
}

/// The identity-map reordering: pre-LN branches whose outputs (after a ReLU) go through a gate.
impl BlockKind for GtrxlConfig {
    fn residual(&self) -> ResidualConfig {
        ResidualConfig { norm: self.norm, norm_eps: self.norm_eps }
    }

    fn gates(&self, d_model: usize, init_std: f64, device: &Device) -> Vec<GtrxlGate> {
        let gate = || GtrxlGate::new(d_model, self.gate_bias, self.learn_gate_bias, init_std, device);
        vec![gate(), gate()]
    }
}

/// GTrXL's gate g(x, y), replacing one residual sum of a block.
#[derive(Module, Debug)]
pub struct GtrxlGate {
    /// [W_r | W_z | W_g] applied to the branch output y.
    pub from_branch: Linear,
    /// [U_r | U_z] applied to the stream x.
    pub from_stream: Linear,
    /// U_g applied to r ⊙ x.
    pub candidate: Linear,
    /// b_g, `[d_model]`, when learned.
    pub learned_bias: Option<Param<Tensor<1>>>,
    /// b_g when constant (`learn_gate_bias = false`), else its initial value.
    pub gate_bias: f64,
}

impl GtrxlGate {
    /// A gate over `d_model` channels: weights normal with std `init_std`, b_g = `gate_bias`,
    /// learned per dimension when `learned`.
    pub fn new(d_model: usize, gate_bias: f64, learned: bool, init_std: f64, device: &Device) -> Self {
        let init = Initializer::Normal { mean: 0.0, std: init_std };
        let lin = |o: usize| LinearConfig::new(d_model, o).with_bias(false).with_initializer(init.clone()).init(device);
        Self {
            from_branch: lin(3 * d_model),
            from_stream: lin(2 * d_model),
            candidate: lin(d_model),
            learned_bias: learned.then(|| Param::from_tensor(Tensor::full([d_model], gate_bias, device))),
            gate_bias,
        }
    }

    /// g(x, y) for the stream `x` and the branch output `y`, both `[b, len, d]`.
    pub fn forward(&self, x: Tensor<3>, y: Tensor<3>) -> Tensor<3> {
        let d = x.dims()[2];
        let wy = self.from_branch.forward(y);
        let ux = self.from_stream.forward(x.clone());
        let r = sigmoid(wy.clone().narrow(2, 0, d) + ux.clone().narrow(2, 0, d));
        let z = wy.clone().narrow(2, d, d) + ux.narrow(2, d, d);
        let z = sigmoid(match &self.learned_bias {
            Some(b) => z - b.val().unsqueeze_dim::<2>(0).unsqueeze_dim::<3>(0),
            None => z.sub_scalar(self.gate_bias),
        });
        let h = (wy.narrow(2, 2 * d, d) + self.candidate.forward(r * x.clone())).tanh();
        x.clone() + z * (h - x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    #[test]
    fn starts_close_to_the_identity_map() {
        let dev = Device::flex();
        let x: Tensor<3> = Tensor::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &dev);
        let y: Tensor<3> = Tensor::random([2, 5, 16], Distribution::Normal(0.0, 0.1), &dev);
        let norm = |t: Tensor<3>| t.powf_scalar(2.0).sum().sqrt().into_scalar::<f32>();
        // relative change of the stream: about σ(−b_g), the update gate's opening
        let change = |b_g: f64| {
            let out = GtrxlGate::new(16, b_g, true, 0.02, &dev).forward(x.clone(), y.clone());
            norm(out - x.clone()) / norm(x.clone())
        };
        let sigma = |v: f64| 1.0 / (1.0 + (-v).exp());
        assert!((change(2.0) as f64) < sigma(-2.0) + 0.05, "b_g = 2: {}", change(2.0));
        assert!(change(6.0) < 0.01, "b_g = 6: {}", change(6.0));
        assert!(change(-4.0) > 0.8, "a negative bias opens the gate: {}", change(-4.0));
    }

    /// b_g is a parameter the loss trains (the paper's b_g^(l)), starting at `gate_bias`; the
    /// constant form equals the learned one at initialisation.
    #[test]
    fn the_gate_bias_is_learned() {
        let dev = Device::flex().autodiff();
        dev.seed(3);
        let x: Tensor<3> = Tensor::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &dev);
        let y: Tensor<3> = Tensor::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &dev);
        let gate = GtrxlGate::new(16, 2.0, true, 0.02, &dev);
        let b = gate.learned_bias.clone().expect("learned by default");
        assert_eq!(b.val().into_data().try_to_vec::<f32>().unwrap(), vec![2.0; 16]);
        let grads = gate.forward(x.clone(), y.clone()).sum().backward();
        let g = b.val().grad(&grads).expect("a gradient for b_g");
        assert!(g.abs().min().into_scalar::<f32>() > 0.0, "every dimension's bias is trained");

        let constant = GtrxlGate { learned_bias: None, ..gate.clone() };
        let gap = (constant.forward(x.clone(), y.clone()) - gate.forward(x, y)).abs().max().into_scalar::<f32>();
        assert_eq!(gap, 0.0);
    }
}
