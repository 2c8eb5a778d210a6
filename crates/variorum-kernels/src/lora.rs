//! The low-rank update of a linear layer's weight (Hu et al. 2021, LoRA), as a Burn
//! [`Reparameterization`] of the weight parameter:
//!
//! W' = W + (α/r)·A·B,  A: `[d_in, r]`, B: `[r, d_out]`.
//!
//! Read through `Param::val` the weight is W', so any code that reads a projection's weight sees
//! the adapted one. The shared projections ([`crate::linear::forward`] and the column products of
//! attention) instead ask the parameter for its update and compute it beside the frozen product,
//!
//! y = x·W + (α/r)·(drop(x)·A)·B,
//!
//! so that autodiff forms no weight-sized gradient (W is frozen, its gradient is never wanted) and
//! LoRA's dropout has an input to drop. Both forms give the same outputs without dropout.
//!
//! Burn's own [`LoraAdapter`] is one factor pair per matrix; our projections fuse several (q | k |
//! v in one matrix, a gated FFN's gate | value), and PEFT adapts each of them apart, so
//! [`LowRankUpdate`] holds one [`LoraAdapter`] per adapted block of output columns (zero
//! elsewhere).

use std::ops::Range;

use burn::module::{LoraAdapter, Reparameterization};
use burn::prelude::*;

/// A block of a weight's output columns: its width and the adapter of those columns, if any.
#[derive(Debug, Clone)]
pub struct ColumnBlock {
    /// Columns in the block.
    pub width: usize,
    /// The index in [`LowRankUpdate::parts`] of the block's adapter; `None`: not adapted.
    pub part: Option<usize>,
}

/// The LoRA update of one weight `[d_in, d_out]`: a rank-r pair for each adapted block of
/// its output columns, zero over the rest.
#[derive(Module, Debug)]
pub struct LowRankUpdate {
    /// One adapter per adapted block, in column order.
    pub parts: Vec<LoraAdapter>,
    /// The weight's output columns, block by block.
    #[module(skip)]
    pub blocks: Vec<ColumnBlock>,
    /// The probability with which an input element is dropped before A, while training (LoRA's
    /// dropout; the kept ones are scaled by 1/(1 − p)).
    #[module(skip)]
    pub dropout: f64,
}

impl LowRankUpdate {
    /// The update (α/r)·A·B over all the weight's columns, `[d_in, d_out]`.
    pub fn delta(&self) -> Tensor<2> {
        if let [ColumnBlock { part: Some(0), .. }] = self.blocks.as_slice() {
            return self.parts[0].delta();
        }
        let a = self.parts[0].a.val();
        let (d_in, device) = (a.dims()[0], a.device());
        let columns = self
            .blocks
            .iter()
            .map(|b| match b.part {
                Some(i) => self.parts[i].delta(),
                None => Tensor::zeros([d_in, b.width], &device),
            })
            .collect();
        Tensor::cat(columns, 1)
    }

    /// The update's product over `x: [.., d_in]`, (α/r)·(drop(x)·A)·B, over all the weight's
    /// columns: `[.., d_out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let d_out = self.blocks.iter().map(|b| b.width).sum();
        self.forward_columns(x, 0..d_out)
    }

    /// `x·W (+ b) + ` the update's product, over the output columns `columns` of the frozen
    /// weight `base` (`[d_in, d_out]`, the parameter's `base()`): the two products side by side.
    pub fn beside<const D: usize>(
        &self,
        base: Tensor<2>,
        bias: Option<Tensor<1>>,
        x: Tensor<D>,
        columns: Range<usize>,
    ) -> Tensor<D> {
        let [d_in, d_out] = base.dims();
        let base = match columns.len() == d_out {
            true => base,
            false => base.slice([0..d_in, columns.clone()]),
        };
        crate::linear::linear(x.clone(), base, bias) + self.forward_columns(x, columns)
    }

    /// [`forward`](Self::forward) over the output columns `columns` alone: `[.., columns.len()]`.
    /// The blocks outside them cost nothing, and the zero blocks inside them only their zeros.
    /// Each adapted block draws its own dropout, as PEFT's modules (`q_proj`, `v_proj`) do.
    pub fn forward_columns<const D: usize>(&self, x: Tensor<D>, columns: Range<usize>) -> Tensor<D> {
        let dropped = |x: Tensor<D>| match self.dropout > 0.0 {
            true => burn::nn::DropoutConfig::new(self.dropout).init().forward(x),
            false => x,
        };
        let mut dims = x.dims();
        let device = x.device();
        let mut pieces = Vec::new();
        let mut start = 0;
        for block in &self.blocks {
            let (from, to) = (start.max(columns.start), (start + block.width).min(columns.end));
            start += block.width;
            if from >= to {
                continue;
            }
            dims[D - 1] = to - from;
            pieces.push(match block.part {
                Some(i) => {
                    let part = &self.parts[i];
                    let b = part.b.val();
                    let b = match to - from == block.width {
                        true => b,
                        false => b.narrow(1, from + block.width - start, to - from),
                    };
                    let low = crate::linear::linear(dropped(x.clone()), part.a.val(), None);
                    crate::linear::linear(low, b.mul_scalar(part.scale), None)
                }
                None => Tensor::zeros(dims, &device),
            });
        }
        match pieces.len() {
            1 => pieces.pop().unwrap(),
            _ => Tensor::cat(pieces, D - 1),
        }
    }
}

impl Reparameterization for LowRankUpdate {
    const NAME: &'static str = "lora";

    fn apply<const D: usize>(&self, base: Tensor<D>) -> Tensor<D> {
        let shape = base.shape();
        base + self.delta().reshape(shape)
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::tensor::Distribution;

    fn update(device: &Device) -> (Tensor<2>, LowRankUpdate) {
        let w = Tensor::random([6, 12], Distribution::Normal(0.0, 1.0), device);
        let pair = |n| LoraAdapter {
            a: Param::from_tensor(Tensor::random([6, 2], Distribution::Normal(0.0, 1.0), device)),
            b: Param::from_tensor(Tensor::random([2, n], Distribution::Normal(0.0, 1.0), device)),
            scale: 1.5,
        };
        let blocks = vec![
            ColumnBlock { width: 4, part: Some(0) },
            ColumnBlock { width: 4, part: None },
            ColumnBlock { width: 4, part: Some(1) },
        ];
        (w, LowRankUpdate { parts: vec![pair(4), pair(4)], blocks, dropout: 0.0 })
    }

    /// The product beside the frozen one equals the product with the merged weight, over all
    /// columns and over any range of them (ranges cutting blocks included).
    #[test]
    fn the_update_beside_the_product_equals_the_merged_weight() {
        let device = Device::flex();
        let (w, u) = update(&device);
        let x = Tensor::<3>::random([2, 3, 6], Distribution::Normal(0.0, 1.0), &device);
        let merged = x.clone().matmul(u.apply(w.clone()).unsqueeze());
        struct Attach(Option<LowRankUpdate>);
        impl burn::module::Reparameterizer for Attach {
            type Reparam = LowRankUpdate;
            fn reparameterize<const D: usize>(
                &mut self,
                _: &str,
                param: Param<Tensor<D>>,
            ) -> (Param<Tensor<D>>, Option<LowRankUpdate>) {
                (param, self.0.take())
            }
        }
        let linear = burn::nn::Linear { weight: Param::from_tensor(w), bias: None };
        let param = linear.apply_reparameterization(Attach(Some(u))).weight;
        for columns in [0..12, 0..4, 4..8, 8..12, 2..10, 5..7] {
            let update = param.reparameterization::<LowRankUpdate>().unwrap();
            let got = update.beside(param.base(), None, x.clone(), columns.clone());
            let want = merged.clone().slice([0..2, 0..3, columns.clone()]);
            let err: f32 = (got - want).abs().max().into_scalar();
            assert!(err < 1e-4, "{columns:?}: {err}");
        }
    }

    /// With A = B = I and α/r = 1 the update's product is drop(x) itself: while training a
    /// fraction p of the elements is zero and the rest are x/(1 − p); outside training (a device
    /// without autodiff) nothing is dropped.
    #[test]
    fn dropout_drops_the_adapters_input_while_training_only() {
        let identity = |device: &Device| {
            let eye: Tensor<2> = Tensor::eye(64, device);
            LowRankUpdate {
                parts: vec![LoraAdapter { a: Param::from_tensor(eye.clone()), b: Param::from_tensor(eye), scale: 1.0 }],
                blocks: vec![ColumnBlock { width: 64, part: Some(0) }],
                dropout: 0.25,
            }
        };
        let device = Device::flex();
        device.seed(7);
        let x = Tensor::<2>::random([64, 64], Distribution::Uniform(1.0, 2.0), &device);
        let kept = identity(&device).forward(x.clone());
        assert_eq!((kept - x.clone()).abs().max().into_scalar::<f32>(), 0.0, "dropped outside training");

        let training = Device::flex().autodiff();
        let dropped = identity(&training).forward(x.clone().autodiff()).inner();
        let zeros: f32 = dropped.clone().equal_elem(0.0).float().mean().into_scalar();
        assert!((zeros - 0.25).abs() < 0.03, "{zeros} of the elements dropped, p = 0.25");
        let scaled = dropped.clone().div(x).mask_fill(dropped.equal_elem(0.0), 1.0 / 0.75);
        let err: f32 = (scaled - 1.0 / 0.75).abs().max().into_scalar();
        assert!(err < 1e-5, "kept values are not x/(1 - p): off by {err}");
    }
}
