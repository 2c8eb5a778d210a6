//! The plain query/key/value projection, written once for every mechanism that uses it.
//!
//! One fused `[d_model, (n_heads + 2·n_kv_heads)·head_dim]` matrix: self-attention costs a single
//! GEMM. Grouped-/multi-query attention (Ainslie et al. 2023; Shazeer 2019) just has fewer K/V
//! heads; the head size is independent of `d_model / n_heads`.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;

/// A linear layer with N(0, std²) weights: the projections of the kinds with their own
/// (lsh, routing, sinkhorn).
pub fn normal_linear(d_in: usize, d_out: usize, bias: bool, std: f64, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(bias).with_initializer(Initializer::Normal { mean: 0.0, std }).init(device)
}

/// `parts` fused projections `[b, len, parts · heads · head_dim]` split into `parts` tensors of
/// heads, `[b, heads, len, head_dim]` each.
pub fn split_heads(x: Tensor<3>, parts: usize, heads: usize, head_dim: usize) -> Vec<Tensor<4>> {
    let [b, l, _] = x.dims();
    let x = x.reshape([b, l, parts, heads, head_dim]);
    (0..parts).map(|i| x.clone().narrow(2, i, 1).reshape([b, l, heads, head_dim]).swap_dims(1, 2)).collect()
}

#[derive(Config, Debug)]
pub struct QkvProjectionConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    #[config(default = true)]
    pub bias: bool,
    #[config(default = 0.02)]
    pub init_std: f64,
}

impl QkvProjectionConfig {
    pub fn init(&self, device: &Device) -> QkvProjection {
        let width = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim;
        QkvProjection {
            qkv: LinearConfig::new(self.d_model, width)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: self.init_std })
                .init(device),
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

#[derive(Module, Debug)]
pub struct QkvProjection {
    pub qkv: Linear,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Queries `[b, n_heads, len_q, head_dim]`, keys and values `[b, n_kv_heads, len_k, head_dim]`.
pub type Qkv = (Tensor<4>, Tensor<4>, Tensor<4>);

impl QkvProjection {
    /// Self-attention: q, k, v from the same states, each by its own columns of the projection.
    /// Three products of a third the width instead of views of one: the backward of a view
    /// (`narrow`) writes its gradient into zeros the size of the whole projection, so three views
    /// cost three `[b, L, (h + 2 h_kv) · d_h]` gradients where three products sum three
    /// `[b, L, d_model]` ones (16k positions, d_model 256: 100 MiB less at the backward's peak).
    pub fn self_attention(&self, x: Tensor<3>) -> Qkv {
        let [b, l, d] = x.dims();
        let (h, hkv, dh) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let w = self.qkv.weight.val();
        let part = |x: Tensor<3>, heads: usize, at: usize| {
            let columns = at * dh..(at + heads) * dh;
            let bias = self.qkv.bias.as_ref().map(|bias| bias.val().slice([columns.clone()]));
            let y = variorum_kernels::linear::linear(x, w.clone().slice([0..d, columns]), bias);
            y.reshape([b, l, heads, dh]).swap_dims(1, 2)
        };
        (part(x.clone(), h, 0), part(x.clone(), hkv, h), part(x, hkv, h + hkv))
    }

    /// [`self_attention`](Self::self_attention) with the projection's output `[b, L, (h + 2 h_kv)
    /// · d_h]` they are views of.
    pub fn self_attention_packed(&self, x: Tensor<3>) -> (Tensor<3>, Qkv) {
        let [b, l, _] = x.dims();
        let heads = self.n_heads + 2 * self.n_kv_heads;
        let packed = variorum_kernels::linear::forward(&self.qkv, x);
        let all = packed.clone().reshape([b, l, heads, self.head_dim]).swap_dims(1, 2);
        let q = all.clone().narrow(1, 0, self.n_heads);
        let k = all.clone().narrow(1, self.n_heads, self.n_kv_heads);
        let v = all.narrow(1, self.n_heads + self.n_kv_heads, self.n_kv_heads);
        (packed, (q, k, v))
    }

    /// Cross-attention: q from `x`, k and v from `source` (any length).
    pub fn cross_attention(&self, x: Tensor<3>, source: Tensor<3>) -> Qkv {
        let (k, v) = self.keys_values(source);
        (self.queries(x), k, v)
    }

    /// The queries alone, `[b, n_heads, len, head_dim]` (the first columns of the projection).
    pub fn queries(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, lq, d] = x.dims();
        let hq = self.n_heads * self.head_dim;
        let w = self.qkv.weight.val().slice([0..d, 0..hq]);
        let bias = self.qkv.bias.as_ref().map(|bias| bias.val().slice([0..hq]));
        let q = variorum_kernels::linear::linear(x, w, bias);
        q.reshape([b, lq, self.n_heads, self.head_dim]).swap_dims(1, 2)
    }

    /// Keys and values alone from `source`, `[b, n_kv_heads, len, head_dim]` each (the last
    /// columns): what cross-attention keeps of a source that does not change.
    pub fn keys_values(&self, source: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let [b, lk, d] = source.dims();
        let hq = self.n_heads * self.head_dim;
        let w = self.qkv.weight.val();
        let width = w.dims()[1];
        let bias = self.qkv.bias.as_ref().map(|bias| bias.val().slice([hq..width]));
        let kv = variorum_kernels::linear::linear(source, w.slice([0..d, hq..width]), bias);
        let kv = kv.reshape([b, lk, 2 * self.n_kv_heads, self.head_dim]).swap_dims(1, 2);
        (kv.clone().narrow(1, 0, self.n_kv_heads), kv.narrow(1, self.n_kv_heads, self.n_kv_heads))
    }
}
