//! Head projections and helpers every kind with its own q/k/v shares: the head checks of a kind
//! without grouped keys, separate q/k/v and output projections, padding hidden from keys and
//! means, a table read past its end.

use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::qkv::{QkvProjection, QkvProjectionConfig};
use crate::kind::AttentionKind;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use variorum_core::{ConfigError, error::check};

/// The head checks of `full`, plus a positive chunk.
pub fn validate_heads(
    n_heads: usize,
    head_dim: Option<usize>,
    chunk: usize,
    d_model: usize,
) -> Result<(), ConfigError> {
    MultiHeadAttentionConfig { n_heads, head_dim, ..Default::default() }.validate(d_model)?;
    check(chunk >= 1, || "model.attention.chunk must be at least 1".into())
}

/// The projections every multi-head kernelised kind shares: fused q/k/v and the output.
#[derive(Module, Debug)]
pub struct HeadProjections {
    pub qkv: QkvProjection,
    pub out: Linear,
}

impl HeadProjections {
    pub fn new(
        d_model: usize,
        n_heads: usize,
        head_dim: usize,
        bias: bool,
        init_std: f64,
        out_std: f64,
        device: &Device,
    ) -> Self {
        Self {
            qkv: QkvProjectionConfig::new(d_model, n_heads, n_heads, head_dim)
                .with_bias(bias)
                .with_init_std(init_std)
                .init(device),
            out: LinearConfig::new(n_heads * head_dim, d_model)
                .with_bias(bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
                .init(device),
        }
    }

    /// q `[b, h, len_q, d_h]`, k and v `[b, h, len_k, d_h]`.
    pub fn split(&self, query: Tensor<3>, key_value: Option<Tensor<3>>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        self.split_scaled(query, key_value, 1.0)
    }

    /// [`split`](Self::split) with q times `scale`, the scale on its projection
    /// ([`QkvProjection::scaled_queries`]) rather than a strided pass over its head view.
    pub fn split_scaled(
        &self,
        query: Tensor<3>,
        key_value: Option<Tensor<3>>,
        scale: f64,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let (k, v) = self.qkv.keys_values(key_value.unwrap_or_else(|| query.clone()));
        (self.qkv.scaled_queries(query, scale), k, v)
    }

    /// `[b, h, len, d_h]` → `[b, len, d_model]`.
    pub fn merge(&self, context: Tensor<4>) -> Tensor<3> {
        let [b, h, l, dh] = context.dims();
        self.out.forward(context.swap_dims(1, 2).reshape([b, l, h * dh]))
    }
}

/// Zeroes the rows of padded positions of `x: [b, len, d]` (`padding: [b, len]`, true =
/// padding): what a token mixer does so that padding contributes nothing.
pub fn zero_padding(x: Tensor<3>, padding: Option<&Tensor<2, Bool>>) -> Tensor<3> {
    match padding {
        None => x,
        Some(p) => {
            let shape = x.dims();
            x.mask_fill(p.clone().unsqueeze_dim::<3>(2).expand(shape), 0.0)
        }
    }
}

/// Zeroes the features of padded keys (`padding: [b, len_k]`, true = padding).
pub fn hide_padding(k: Tensor<4>, padding: Option<&Tensor<2, Bool>>) -> Tensor<4> {
    match padding {
        None => k,
        Some(p) => {
            let [b, l] = p.dims();
            k.mask_fill(p.clone().reshape([b, 1, l, 1]), 0.0)
        }
    }
}

/// 1 at real positions and 0 at padding, `[b, 1, len, 1]` (all ones without a padding mask): the
/// weights of means over positions.
pub fn unpadded(padding: Option<&Tensor<2, Bool>>, b: usize, len: usize, device: &Device) -> Tensor<4> {
    match padding {
        Some(p) => p.clone().bool_not().float().reshape([b, 1, len, 1]),
        None => Tensor::ones([b, 1, len, 1], device),
    }
}

/// Entries `start..start + len` of `t` along `dim`; positions past the table's last entry read
/// that entry (see the module doc: only a context longer than the model's reaches them).
pub fn take<const D: usize>(t: Tensor<D>, dim: usize, start: usize, len: usize) -> Tensor<D> {
    let n = t.dims()[dim];
    if start + len <= n {
        return t.narrow(dim, start, len);
    }
    let device = t.device();
    let index: Vec<i64> = (start..start + len).map(|p| p.min(n.saturating_sub(1)) as i64).collect();
    t.select(dim, Tensor::<1, Int>::from_data(TensorData::new(index, [len]), &device))
}
