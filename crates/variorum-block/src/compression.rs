//! Compression functions of the Compressive Transformer (Rae et al. 2020),
//! f_c: R^{n × d} → R^{⌊n/c⌋ × d}, applied to the states evicted from the FIFO memory:
//!
//! - `max-pool`, `mean-pool`: pooling with kernel = stride = c;
//! - `conv`: a 1D convolution with kernel = stride = c;
//! - `dilated-conv`: kernel c, dilation 2, stride c (each compressed state also reads the group
//!   before it; zero-padded at the start);
//! - `most-used`: keeps the n/c states that received the most attention while in memory, in
//!   their original order.
//!
//! The convolutions start as mean pooling (weight 1/c on the diagonal), so a fresh model
//! compresses sensibly and c = 1 starts as the identity. The auto-encoding loss decodes with
//! g(x) = x W_g, one linear map to c states per compressed state (a transposed convolution with
//! kernel = stride = c), initialised to repeat its input — the inverse of mean pooling on constant
//! groups, so it too starts as the identity for c = 1.
//!
//! The losses, both computed on the evicted states with everything but the compression network
//! held fixed (the paper's stop-gradient):
//! L_ae = ‖old_mem − g(f_c(old_mem))‖²,  L_ar = ‖attn(h, old_mem) − attn(h, f_c(old_mem))‖².

use burn::module::Param;
use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig1d};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// `model.memory.compression`: the compression function f_c, at rate c.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompressionKind {
    /// Max pooling, kernel = stride = c.
    MaxPool,
    /// Mean pooling, kernel = stride = c.
    MeanPool,
    /// A 1D convolution, kernel = stride = c, starting as mean pooling. The default.
    #[default]
    Conv,
    /// A 1D convolution, kernel c, dilation 2, stride c: each compressed state also reads the
    /// group before it.
    DilatedConv,
    /// The n/c states that received the most attention while in memory, in their original order.
    MostUsed,
}

impl CompressionKind {
    /// `decoder`: build g for the auto-encoding loss.
    pub fn init(self, d_model: usize, rate: usize, decoder: bool, device: &Device) -> Compressor {
        let conv = |dilation: usize, left: usize| {
            let mut conv = Conv1dConfig::new(d_model, d_model, rate)
                .with_stride(rate)
                .with_dilation(dilation)
                .with_padding(PaddingConfig1d::Explicit(left, 0))
                .init(device);
            // mean pooling: w[o, i, k] = δ_oi / c
            let eye: Tensor<2> = Tensor::eye(d_model, device);
            let w = eye.div_scalar(rate as f64).unsqueeze_dim::<3>(2).expand([d_model, d_model, rate]);
            conv.weight = Param::from_tensor(w);
            conv.bias = conv.bias.map(|b| Param::from_tensor(b.val().zeros_like()));
            conv
        };
        let decoder = decoder.then(|| {
            let linear = LinearConfig::new(d_model, rate * d_model).with_bias(false).init(device);
            // repeat: W_g = [I I … I]
            let eye: Tensor<2> = Tensor::eye(d_model, device);
            Linear { weight: Param::from_tensor(Tensor::cat(vec![eye; rate], 1)), ..linear }
        });
        Compressor {
            rate,
            kind: self,
            conv: match self {
                Self::Conv => Some(conv(1, 0)),
                Self::DilatedConv => Some(conv(2, rate - 1)),
                _ => None,
            },
            decoder,
        }
    }

    /// The name in a config.
    pub fn name(self) -> &'static str {
        match self {
            Self::MaxPool => "max-pool",
            Self::MeanPool => "mean-pool",
            Self::Conv => "conv",
            Self::DilatedConv => "dilated-conv",
            Self::MostUsed => "most-used",
        }
    }
}

/// A compression function with its parameters: `[b, n, d]` → `[b, n / c, d]`.
#[derive(Module, Debug)]
pub struct Compressor {
    /// c, states per compressed state.
    pub rate: usize,
    /// The compression function.
    #[module(skip)]
    pub kind: CompressionKind,
    /// The convolution of `conv` and `dilated-conv` (none for the others).
    pub conv: Option<Conv1d>,
    /// g of the auto-encoding loss (when it is on).
    pub decoder: Option<Linear>,
}

impl Compressor {
    /// `[b, n, d]` → `[b, n / c, d]`; `usage: [b, n]` is the attention each state received
    /// (read by `most-used`).
    pub fn compress(&self, x: Tensor<3>, usage: Option<Tensor<2>>) -> Tensor<3> {
        let [b, n, d] = x.dims();
        let c = self.rate;
        let groups = n / c;
        let x = x.narrow(1, 0, groups * c);
        if let Some(conv) = &self.conv {
            return conv.forward(x.swap_dims(1, 2)).swap_dims(1, 2);
        }
        match self.kind {
            CompressionKind::MaxPool => x.reshape([b, groups, c, d]).max_dim(2).reshape([b, groups, d]),
            CompressionKind::MostUsed => {
                let usage = usage
                    .map(|u| u.narrow(1, 0, groups * c))
                    .unwrap_or_else(|| Tensor::zeros([b, groups * c], &x.device()));
                // the top n/c slots by usage (ties: the older first), back in time order
                let (_, top) = usage.topk_with_indices(groups, 1);
                let top = top.sort(1);
                x.gather(1, top.unsqueeze_dim::<3>(2).expand([b, groups, d]))
            }
            _ => x.reshape([b, groups, c, d]).mean_dim(2).reshape([b, groups, d]),
        }
    }

    /// g: `[b, m, d]` → `[b, m·c, d]`, if the compressor has a decoder.
    pub fn decode(&self, z: Tensor<3>) -> Option<Tensor<3>> {
        let [b, m, d] = z.dims();
        Some(self.decoder.as_ref()?.forward(z).reshape([b, m * self.rate, d]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn all() -> [CompressionKind; 5] {
        use CompressionKind::*;
        [MaxPool, MeanPool, Conv, DilatedConv, MostUsed]
    }

    #[test]
    fn every_compression_maps_n_states_to_n_over_c() {
        let dev = Device::flex();
        let x: Tensor<3> = Tensor::random([2, 12, 8], Distribution::Normal(0.0, 1.0), &dev);
        for kind in all() {
            for c in [1, 2, 3] {
                let comp = kind.init(8, c, true, &dev);
                let usage = Tensor::random([2, 12], Distribution::Default, &dev);
                assert_eq!(comp.compress(x.clone(), Some(usage)).dims(), [2, 12 / c, 8], "{} c={c}", kind.name());
                assert_eq!(comp.decode(Tensor::zeros([2, 12 / c, 8], &dev)).unwrap().dims(), [2, 12, 8]);
            }
        }
    }

    #[test]
    fn pooling_and_the_initial_convolution_agree_with_their_definitions() {
        let dev = Device::flex();
        let x = Tensor::<1>::from_floats([1.0, 5.0, 2.0, -4.0], &dev).reshape([1, 4, 1]);
        let get = |k: CompressionKind, u: Option<Tensor<2>>| {
            k.init(1, 2, false, &dev).compress(x.clone(), u).reshape([2]).into_data().try_to_vec::<f32>().unwrap()
        };
        assert_eq!(get(CompressionKind::MaxPool, None), vec![5.0, 2.0]);
        assert_eq!(get(CompressionKind::MeanPool, None), vec![3.0, -1.0]);
        assert_eq!(get(CompressionKind::Conv, None), vec![3.0, -1.0]);
        // dilation 2 after one state of zero padding [0, 1, 5, 2, -4]: taps (0, 5) and (5, -4)
        assert_eq!(get(CompressionKind::DilatedConv, None), vec![2.5, 0.5]);
        let usage = Tensor::<1>::from_floats([0.1, 0.9, 0.8, 0.2], &dev).reshape([1, 4]);
        assert_eq!(get(CompressionKind::MostUsed, Some(usage)), vec![5.0, 2.0], "the two most used, in order");
    }

    #[test]
    fn rate_one_starts_as_the_identity() {
        let dev = Device::flex();
        let x: Tensor<3> = Tensor::random([1, 5, 4], Distribution::Normal(0.0, 1.0), &dev);
        for kind in [CompressionKind::Conv, CompressionKind::MeanPool] {
            let comp = kind.init(4, 1, true, &dev);
            let z = comp.compress(x.clone(), None);
            assert!((z.clone() - x.clone()).abs().max().into_scalar::<f32>() < 1e-6);
            assert!((comp.decode(z).unwrap() - x.clone()).abs().max().into_scalar::<f32>() < 1e-6);
        }
    }
}
