//! AdamW whose step is one kernel per parameter ([`variorum_kernels::adamw`]) instead of Burn's
//! chain of tensor ops. Its state is Burn's [`AdamWState`], so checkpoints written by either
//! load into the other.

use burn::optim::{AdamWState, AdaptiveMomentumState, LearningRate, Optimizer};
use burn::prelude::*;
use variorum_kernels::adamw::{AdamWStep, step};

/// AdamW with decoupled weight decay (no AMSGrad, no cautious decay: the trainer never asks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAdamW {
    /// β₁, the decay of the first moment (`train.beta1`).
    pub beta_1: f32,
    /// β₂, the decay of the second moment (`train.beta2`).
    pub beta_2: f32,
    /// ε, added to the second moment's root in the denominator (`train.eps`).
    pub epsilon: f32,
    /// Decoupled weight decay λ: each step scales a parameter by `1 − lr · λ`.
    pub weight_decay: f32,
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let (time, moments) = match state {
            Some(s) => (s.momentum.time + 1, Some((s.momentum.moment_1, s.momentum.moment_2))),
            None => (1, None),
        };
        let constants = AdamWStep {
            lr: lr as f32,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            time: time as i32,
        };
        let (tensor, moment_1, moment_2) = step(tensor, grad, moments, constants);
        (tensor, Some(AdamWState::new(AdaptiveMomentumState::new(time, moment_1, moment_2))))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
    use burn::tensor::Distribution;

    /// Five steps of a linear layer: the same weights as Burn's AdamW with the same settings,
    /// and the same after a save/load of the optimizer state half-way (Burn's state record).
    #[test]
    fn steps_like_burns_adamw_and_shares_its_state() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let layer: Linear = LinearConfig::new(24, 40).init(&device);
        let x: Tensor<2> = Tensor::random([16, 24], Distribution::Normal(0.0, 1.0), &device);
        let ours = FusedAdamW { beta_1: 0.9, beta_2: 0.99, epsilon: 1e-8, weight_decay: 0.1 };
        let burns = AdamWConfig::new().with_beta_1(0.9).with_beta_2(0.99).with_epsilon(1e-8).with_weight_decay(0.1);
        let train = |mut optim: ModuleOptimizer, mut model: Linear, steps: usize| {
            for _ in 0..steps {
                let loss = model.forward(x.clone()).powf_scalar(2.0).mean();
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(1e-2, model, grads);
            }
            (model, optim)
        };
        let (a, _) = train(ModuleOptimizer::from(ours), layer.clone(), 5);
        let (b, _) = train(burns.init(), layer.clone(), 5);
        // three steps, the state handed over to a fresh Burn AdamW, two more
        let (c, optim) = train(ModuleOptimizer::from(ours), layer.clone(), 3);
        let checkpoint = optim.into_bytes().expect("the state serialises");
        let resumed = burns.init().from_bytes(checkpoint).expect("Burn's AdamW reads the state");
        let (c, _) = train(resumed, c, 2);
        let w = |m: &Linear| m.weight.val().inner();
        let scale = w(&b).abs().max().into_scalar::<f32>();
        for (what, m) in [("fused AdamW", &a), ("fused AdamW resumed by Burn's", &c)] {
            let diff = (w(m) - w(&b)).abs().max().into_scalar::<f32>();
            assert!(diff <= 1e-5 * scale, "{what}: weights differ from Burn's AdamW by {diff}");
        }
        // the steps moved the weights (an optimizer that does nothing would agree with itself)
        let moved = (w(&a) - w(&layer)).abs().max().into_scalar::<f32>();
        assert!(moved > 1e-2, "five steps moved the weights by only {moved}");
    }
}
