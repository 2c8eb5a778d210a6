//! Clipping by the global gradient norm, ‖g‖ = √Σ_p ‖g_p‖², as PyTorch's `clip_grad_norm_`.
//!
//! Burn's `GradientClippingConfig::Norm` clips each parameter tensor by its own norm, which is a
//! different (and surprising) operation. The scale min(1, max/‖g‖) stays a device tensor: no host
//! sync inside the step.

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sum: Option<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let s = variorum_core::ordered_sum(g.square());
            self.sum = Some(match self.sum.take() {
                Some(acc) => acc + s,
                None => s,
            });
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    scale: Tensor<1>,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            let s = self.scale.clone().unsqueeze::<D>();
            self.grads.register(param.id, g * s);
        }
    }
}

/// The global gradient norm, `[1]`, or `None` when there are no gradients.
pub fn global_norm<M: Module>(model: &M, grads: &GradientsParams) -> Option<Tensor<1>> {
    let mut v = SquaredNorm { grads, sum: None };
    model.visit(&mut v);
    v.sum.map(|s| s.sqrt())
}

/// Scales the gradients so their global norm is at most `max_norm`; returns the norm before
/// clipping (a `[1]` device tensor, for logging).
pub fn clip_global_norm<M: Module>(model: &M, grads: &mut GradientsParams, max_norm: f64) -> Option<Tensor<1>> {
    let norm = global_norm(model, grads)?;
    let scale = norm.clone().add_scalar(1e-6).recip().mul_scalar(max_norm).clamp_max(1.0);
    model.visit(&mut Scale { grads, scale });
    Some(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};

    #[test]
    fn clips_the_global_norm_not_each_tensor() {
        let dev = Device::flex().autodiff();
        let lin: Linear = LinearConfig::new(3, 2).init(&dev);
        let x = Tensor::<2>::ones([4, 3], &dev);
        let loss = lin.forward(x).mul_scalar(10.0).sum();
        let mut grads = GradientsParams::from_grads(loss.backward(), &lin);
        let w = grads.get::<2>(lin.weight.id).unwrap();
        let b = grads.get::<1>(lin.bias.as_ref().unwrap().id).unwrap();
        let before = (w.clone().square().sum() + b.clone().square().sum()).sqrt().into_scalar::<f32>();
        let norm = clip_global_norm(&lin, &mut grads, 1.0).unwrap().into_scalar::<f32>();
        assert!((norm - before).abs() < 1e-3 * before);
        let w2 = grads.get::<2>(lin.weight.id).unwrap();
        let b2 = grads.get::<1>(lin.bias.as_ref().unwrap().id).unwrap();
        let after = (w2.clone().square().sum() + b2.clone().square().sum()).sqrt().into_scalar::<f32>();
        assert!((after - 1.0).abs() < 1e-4, "global norm after clipping is {after}");
        // directions are kept: every tensor scaled by the same factor
        let ratio_w = (w2 / w).mean().into_scalar::<f32>();
        let ratio_b = (b2 / b).mean().into_scalar::<f32>();
        assert!((ratio_w - ratio_b).abs() < 1e-5);
    }
}
