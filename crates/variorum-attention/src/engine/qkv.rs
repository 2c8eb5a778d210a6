//! The plain query/key/value projection, written once for every mechanism that uses it.
//!
//! One fused `[d_model, (n_heads + 2·n_kv_heads)·head_dim]` matrix. The fused kernels read q, k
//! and v from its one product ([`QkvProjection::self_attention_packed`]); the other paths take
//! one product per part ([`project_head_range`]), whose backward costs less than views of one
//! product. Grouped-/multi-query attention (Ainslie et al. 2023; Shazeer 2019) just has fewer
//! K/V heads; the head size is independent of `d_model / n_heads`.

use std::ops::Range;

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

/// `x` projected by the output columns `columns` of `linear` alone, times `factor`: one product
/// of that width. The factor goes on the smaller side: the `d_in × width` weight slice (and
/// bias) when `x` has more rows than `d_in` (training), the output otherwise (decoding one row).
fn project_columns(linear: &Linear, x: Tensor<3>, columns: Range<usize>, factor: f64) -> Tensor<3> {
    let [b, l, d] = x.dims();
    let bias = linear.bias.as_ref().map(|bias| bias.val().slice([columns.clone()]));
    if let Some(update) = linear.weight.reparameterization::<variorum_kernels::lora::LowRankUpdate>() {
        let y = update.beside(linear.weight.base(), bias, x, columns);
        return if factor == 1.0 { y } else { y.mul_scalar(factor) };
    }
    let weight = linear.weight.val().slice([0..d, columns.clone()]);
    if factor == 1.0 {
        return variorum_kernels::linear::linear(x, weight, bias);
    }
    if b * l > d {
        variorum_kernels::linear::linear(x, weight.mul_scalar(factor), bias.map(|b| b.mul_scalar(factor)))
    } else {
        variorum_kernels::linear::linear(x, weight, bias).mul_scalar(factor)
    }
}

/// Heads `first .. first + heads` of `linear`'s output over `x` (heads of `head_dim` columns)
/// times `factor`, `[b, heads, L, head_dim]`, by one product of their width (the factor before
/// the head view: [`project_columns`]).
pub fn project_head_range(
    linear: &Linear,
    x: Tensor<3>,
    (first, heads, head_dim): (usize, usize, usize),
    factor: f64,
) -> Tensor<4> {
    let [b, l, _] = x.dims();
    let y = project_columns(linear, x, first * head_dim..(first + heads) * head_dim, factor);
    y.reshape([b, l, heads, head_dim]).swap_dims(1, 2)
}

/// [`split_heads`] of `linear`'s output over `x`, each part by its own product
/// ([`project_head_range`]). Views of one product cost more in the backward: a view's
/// (`narrow`'s) gradient is written into zeros the size of the whole product, one per part, where
/// separate products sum `[b, L, d_in]` gradients.
pub fn project_heads(linear: &Linear, x: Tensor<3>, parts: usize, heads: usize, head_dim: usize) -> Vec<Tensor<4>> {
    (0..parts).map(|i| project_head_range(linear, x.clone(), (i * heads, heads, head_dim), 1.0)).collect()
}

/// Sizes and initialisation of a [`QkvProjection`].
#[derive(Config, Debug)]
pub struct QkvProjectionConfig {
    /// Width of the hidden states projected.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads: `n_heads` (multi-head), 1 (multi-query) or a divisor (grouped-query).
    pub n_kv_heads: usize,
    /// Size of each head, independent of `d_model / n_heads`.
    pub head_dim: usize,
    /// A bias on the projection. Default true.
    #[config(default = true)]
    pub bias: bool,
    /// Standard deviation of the initial weights, N(0, std²). Default 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
}

impl QkvProjectionConfig {
    /// The projection, its weights and bias drawn from N(0, `init_std`²).
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

/// The query, key and value projections as one fused linear layer.
#[derive(Module, Debug)]
pub struct QkvProjection {
    /// `d_model → (n_heads + 2·n_kv_heads)·head_dim`: the queries' columns, then the keys',
    /// then the values'.
    pub qkv: Linear,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (each shared by `n_heads / n_kv_heads` query heads).
    pub n_kv_heads: usize,
    /// Size of each head.
    pub head_dim: usize,
}

/// Queries `[b, n_heads, len_q, head_dim]`, keys and values `[b, n_kv_heads, len_k, head_dim]`.
pub type Qkv = (Tensor<4>, Tensor<4>, Tensor<4>);

impl QkvProjection {
    /// Self-attention: q, k, v from the same states, each by its own columns of the projection
    /// (`project_heads`: at 16k positions and d_model 256, 100 MiB less at the backward's peak
    /// than views of one product).
    pub fn self_attention(&self, x: Tensor<3>) -> Qkv {
        self.cross_attention(x.clone(), x)
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
        self.scaled_queries(x, 1.0)
    }

    /// `scale ·` [`queries`](Self::queries), the scale on whichever is smaller, the weight's
    /// `d_model × h·d_h` slice or the `[b, L, h·d_h]` product (`project_columns`); either way
    /// before the head view, over which a product would be a strided single-threaded pass.
    pub fn scaled_queries(&self, x: Tensor<3>, scale: f64) -> Tensor<4> {
        project_head_range(&self.qkv, x, (0, self.n_heads, self.head_dim), scale)
    }

    /// Keys and values alone from `source`, `[b, n_kv_heads, len, head_dim]` each (the last
    /// columns): what cross-attention keeps of a source that does not change.
    pub fn keys_values(&self, source: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let (h, hkv, dh) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let part = |first: usize| project_head_range(&self.qkv, source.clone(), (first, hkv, dh), 1.0);
        (part(h), part(h + hkv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, Tolerance};

    /// `scaled_queries` equals the scale times `queries`, output and input and weight gradients,
    /// where the scale goes on the weight (more rows than d_model) and where it goes on the
    /// output (one row, as in decoding).
    #[test]
    fn scaled_queries_are_the_scaled_queries_with_gradients() {
        let device = Device::default().autodiff();
        let proj = QkvProjectionConfig::new(8, 2, 1, 4).with_init_std(0.5).init(&device);
        for len in [1, 9] {
            let x: Tensor<3> = Tensor::random([2, len, 8], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let probe: Tensor<4> = Tensor::random([2, 2, len, 4], Distribution::Normal(0.0, 1.0), &device);
            let run = |q: Tensor<4>| {
                let grads = (q.clone() * probe.clone()).sum().backward();
                let bias = proj.qkv.bias.as_ref().map(|b| b.grad(&grads).unwrap());
                (q.inner(), x.grad(&grads).unwrap(), proj.qkv.weight.grad(&grads).unwrap(), bias.unwrap())
            };
            let (a, ga, wa, ba) = run(proj.scaled_queries(x.clone(), 0.3));
            let (b, gb, wb, bb) = run(proj.queries(x.clone()) * 0.3);
            a.into_data().assert_approx_eq::<f32>(&b.into_data(), Tolerance::default());
            ga.into_data().assert_approx_eq::<f32>(&gb.into_data(), Tolerance::default());
            wa.into_data().assert_approx_eq::<f32>(&wb.into_data(), Tolerance::default());
            ba.into_data().assert_approx_eq::<f32>(&bb.into_data(), Tolerance::default());
        }
    }
}
