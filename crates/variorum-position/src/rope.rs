//! Rotary position embedding (RoPE; Su et al. 2021, "RoFormer"):
//!
//! f(x, m)_{(2k, 2k+1)} = [[cos mθ_k, −sin mθ_k], [sin mθ_k, cos mθ_k]] · (x_{2k}, x_{2k+1}),
//! θ_k = base^(−2k/d_rot),
//!
//! applied to every query and key head before the scores, so that
//! ⟨f(q, m), f(k, n)⟩ = g(q, k, m − n) depends on positions only through their difference.
//!
//! Two layouts pair the dimensions differently: `interleaved` rotates (x_{2k}, x_{2k+1}) as in the
//! paper; `rotate-half` rotates (x_k, x_{k+d_rot/2}) as GPT-NeoX and LLaMA do. They are the same
//! map up to a fixed permutation of the head dimensions. `rotary_dim < head_dim` rotates only the
//! first `rotary_dim` dimensions of each head (GPT-J, GPT-NeoX) and passes the rest through.
//!
//! On flex, a fused projection's queries and keys are rotated in place of the head split by one
//! kernel ([`variorum_kernels::rope`], through [`RelativeScheme::rotate_packed`]), so the fused
//! attention kernel reads them packed; this file's [`RotaryEmbedding::rotate`] is the composed
//! form everywhere else (cached decoding, other kinds) and the kernel's reference in the tests.

use crate::kind::{HeadShape, PackedHeads, PositionKind, RelativeScheme};
use crate::{RelativePosition, ScoreLayout};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;
use variorum_core::{ConfigError, error::check};
use variorum_kernels::rope::{Rotation, rotate_packed};

/// Which dimensions are rotated together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RopeLayout {
    /// (x_k, x_{k + d/2}) — GPT-NeoX, LLaMA.
    #[default]
    RotateHalf,
    /// (x_{2k}, x_{2k+1}) — the paper.
    Interleaved,
}

/// `model.position` with `kind = "rope"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RotaryConfig {
    /// Base of the wavelengths. Default 10000.
    pub base: f64,
    /// `rotate-half` (default) or `interleaved`.
    pub layout: RopeLayout,
    /// Rotated dimensions per head (even). Default: the whole head.
    pub rotary_dim: Option<usize>,
}

impl Default for RotaryConfig {
    fn default() -> Self {
        Self { base: 10_000.0, layout: RopeLayout::RotateHalf, rotary_dim: None }
    }
}

impl RotaryConfig {
    /// Checks the settings against the head size; messages name the config key.
    pub fn validate(&self, head_dim: usize) -> Result<(), ConfigError> {
        check(self.base > 1.0, || format!("model.position.base = {} must be > 1 (10000 is the paper's)", self.base))?;
        let r = self.rotary_dim.unwrap_or(head_dim);
        check(r % 2 == 0 && r > 0 && r <= head_dim, || {
            format!(
                "model.position.rotary_dim = {r} must be even, at least 2 and at most the head size {head_dim} (rope rotates pairs of dimensions)"
            )
        })
    }

    /// The rotation for heads of `head_dim`. No parameters.
    pub fn init(&self, head_dim: usize) -> RotaryEmbedding {
        RotaryEmbedding {
            base: self.base,
            rotary_dim: self.rotary_dim.unwrap_or(head_dim),
            interleaved: self.layout == RopeLayout::Interleaved,
        }
    }
}

/// RoPE's rotation of the query and key heads by their positions.
#[derive(Module, Debug)]
pub struct RotaryEmbedding {
    /// Base of the wavelengths: θ_k = base^(−2k/d_rot).
    pub base: f64,
    /// d_rot, the rotated dimensions per head (even); the rest pass through.
    pub rotary_dim: usize,
    /// (x_{2k}, x_{2k+1}) pairs rather than (x_k, x_{k + d_rot/2}).
    pub interleaved: bool,
}

impl RotaryEmbedding {
    /// cos and sin of m·θ_k for positions `start..start+len`, each `[len, rotary_dim / 2]`.
    fn angles(&self, start: usize, len: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
        let half = self.rotary_dim / 2;
        let (c, s) = variorum_kernels::rope::angles(self.base, self.rotary_dim, start, len);
        let t = |v| Tensor::<2>::from_data(TensorData::new(v, [len, half]), device);
        (t(c), t(s))
    }

    /// Rotates `x: [batch, heads, len, head_dim]` whose rows sit at positions `start..start+len`.
    pub fn rotate(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        let [b, h, l, dh] = x.dims();
        let (r, half) = (self.rotary_dim, self.rotary_dim / 2);
        let (cos, sin) = self.angles(start, l, &x.device());
        let (cos, sin) = (cos.reshape([1, 1, l, half]), sin.reshape([1, 1, l, half]));
        let rot = if r == dh { x.clone() } else { x.clone().narrow(3, 0, r) };
        let rotated = if self.interleaved {
            let pairs = rot.reshape([b, h, l, half, 2]);
            let x0 = pairs.clone().narrow(4, 0, 1).reshape([b, h, l, half]);
            let x1 = pairs.narrow(4, 1, 1).reshape([b, h, l, half]);
            let y0 = x0.clone() * cos.clone() - x1.clone() * sin.clone();
            let y1 = x1 * cos + x0 * sin;
            Tensor::stack::<5>(vec![y0, y1], 4).reshape([b, h, l, r])
        } else {
            let x0 = rot.clone().narrow(3, 0, half);
            let x1 = rot.narrow(3, half, half);
            let y0 = x0.clone() * cos.clone() - x1.clone() * sin.clone();
            let y1 = x1 * cos + x0 * sin;
            Tensor::cat(vec![y0, y1], 3)
        };
        if r == dh { rotated } else { Tensor::cat(vec![rotated, x.narrow(3, r, dh - r)], 3) }
    }
}

impl PositionKind for RotaryConfig {
    const SUMMARY: &'static str = "rotary embedding of q and k; rotate-half or interleaved; partial rotary dimension";
    const PAPER: &'static str = "Su et al. 2021, RoFormer";
    const CAPS: Capabilities = Capabilities { qk_rotation: true, ..Capabilities::NEUTRAL };

    fn validate(&self, heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        RotaryConfig::validate(self, heads.head_dim)
    }

    fn init_relative(&self, heads: HeadShape, _context: usize, _device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.head_dim).into())
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        let partial = Self { layout: RopeLayout::Interleaved, rotary_dim: Some(4), base: 500.0 };
        vec![("rotate-half", Self::default()), ("interleaved, partial", partial)]
    }
}

/// RoPE acts on q and k only: the scores pass unchanged, and gathered keys need no bias.
impl RelativeScheme for RotaryEmbedding {
    fn rotate(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        RotaryEmbedding::rotate(self, x, start)
    }

    fn rotates_packed(&self) -> bool {
        true
    }

    fn rotate_packed(&self, qkv: Tensor<3>, heads: PackedHeads, start: usize) -> Option<Tensor<3>> {
        let rotation = Rotation {
            n_heads: heads.n_heads,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
            rotary_dim: self.rotary_dim,
            base: self.base,
            interleaved: self.interleaved,
            start,
        };
        rotate_packed(qkv, rotation)
    }

    fn rotates(&self) -> bool {
        true
    }

    fn scores(&self, scores: Tensor<4>, _q: Tensor<4>, _k: Tensor<4>, _layout: &ScoreLayout, _scale: f64) -> Tensor<4> {
        scores
    }

    fn works_on_gathered_keys(&self) -> bool {
        true
    }

    fn bias_at(&self, _d: &crate::Distances, _device: &Device) -> Option<Tensor<4>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn random(shape: [usize; 4], dev: &Device) -> Tensor<4> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// ⟨R_i q, R_j k⟩ for all i, j of two sequences starting at `start`.
    fn scores(rope: &RotaryEmbedding, q: Tensor<4>, k: Tensor<4>, start: usize) -> Tensor<4> {
        rope.rotate(q, start).matmul(rope.rotate(k, start).swap_dims(2, 3))
    }

    #[test]
    fn scores_depend_only_on_the_distance() {
        let dev = Device::flex();
        for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
            for rotary_dim in [None, Some(4)] {
                let rope = RotaryConfig { layout, rotary_dim, ..Default::default() }.init(8);
                let (q, k) = (random([1, 2, 5, 8], &dev), random([1, 2, 5, 8], &dev));
                let at0 = scores(&rope, q.clone(), k.clone(), 0);
                let at37 = scores(&rope, q.clone(), k.clone(), 37);
                assert!(
                    max_diff(at0.clone(), at37) < 1e-4,
                    "{layout:?} {rotary_dim:?}: shifting both positions changed the scores"
                );
                let plain = q.matmul(k.swap_dims(2, 3));
                assert!(max_diff(at0, plain) > 1e-3, "{layout:?}: the rotation must change off-diagonal scores");
            }
        }
    }

    #[test]
    fn rotation_keeps_norms_and_position_zero_is_identity() {
        let dev = Device::flex();
        let rope = RotaryConfig::default().init(8);
        let x = random([2, 3, 4, 8], &dev);
        assert!(max_diff(rope.rotate(x.clone(), 0).narrow(2, 0, 1), x.clone().narrow(2, 0, 1)) < 1e-6);
        let n0 = x.clone().powf_scalar(2.0).sum_dim(3);
        let n1 = rope.rotate(x, 11).powf_scalar(2.0).sum_dim(3);
        assert!(max_diff(n0, n1) < 1e-4);
    }

    #[test]
    fn layouts_agree_after_permutation() {
        // interleaved pairs (2k, 2k+1) are rotate-half pairs (k, k + d/2) after moving
        // dimension 2k to k and 2k+1 to k + d/2
        let dev = Device::flex();
        let x = random([1, 2, 6, 8], &dev);
        let perm: Vec<i64> = (0..4).map(|k| 2 * k).chain((0..4).map(|k| 2 * k + 1)).collect();
        let perm = Tensor::<1, Int>::from_data(TensorData::new(perm, [8]), &dev);
        let half = RotaryConfig::default().init(8);
        let inter = RotaryConfig { layout: RopeLayout::Interleaved, ..Default::default() }.init(8);
        let a = inter.rotate(x.clone(), 5).select(3, perm.clone());
        let b = half.rotate(x.select(3, perm), 5);
        assert!(max_diff(a, b) < 1e-5);
    }

    #[test]
    fn offset_rotation_is_a_slice_of_the_full_one() {
        // what a KV cache relies on: rotating token t alone at offset t equals row t of the full rotation
        let dev = Device::flex();
        let rope = RotaryConfig::default().init(8);
        let x = random([1, 2, 6, 8], &dev);
        let full = rope.rotate(x.clone(), 0);
        let tail = rope.rotate(x.narrow(2, 4, 2), 4);
        assert!(max_diff(full.narrow(2, 4, 2), tail) < 1e-5);
    }

    #[test]
    fn the_packed_kernel_rotates_as_the_composed_heads_do_with_its_gradient() {
        // queries and keys of a packed projection rotated by the kernel equal the heads split and
        // rotated by Burn's ops, values untouched; the gradients too (the backward rotates by −mθ)
        let dev = Device::flex().autodiff();
        dev.seed(3);
        let (b, l, h, hkv, dh) = (2, 37, 4, 2, 8);
        for (layout, rotary_dim, start) in [
            (RopeLayout::RotateHalf, None, 0),
            (RopeLayout::RotateHalf, Some(4), 5),
            (RopeLayout::Interleaved, Some(6), 19),
        ] {
            let rope = RotaryConfig { layout, rotary_dim, ..Default::default() }.init(dh);
            let heads = PackedHeads { n_heads: h, n_kv_heads: hkv, head_dim: dh };
            let qkv: Tensor<3> = Tensor::random([b, l, (h + 2 * hkv) * dh], Distribution::Normal(0.0, 1.0), &dev);
            let up: Tensor<3> = Tensor::random([b, l, (h + 2 * hkv) * dh], Distribution::Normal(0.0, 1.0), &dev);
            let run = |packed: bool| {
                let x = qkv.clone().require_grad();
                let y = if packed {
                    rope.rotate_packed(x.clone(), heads, start).expect("flex has the kernel")
                } else {
                    let split = |from: usize, n: usize| {
                        x.clone().narrow(2, from * dh, n * dh).reshape([b, l, n, dh]).swap_dims(1, 2)
                    };
                    let merge = |t: Tensor<4>, n: usize| t.swap_dims(1, 2).reshape([b, l, n * dh]);
                    let q = merge(rope.rotate(split(0, h), start), h);
                    let k = merge(rope.rotate(split(h, hkv), start), hkv);
                    Tensor::cat(vec![q, k, x.clone().narrow(2, (h + hkv) * dh, hkv * dh)], 2)
                };
                let grads = (y.clone() * up.clone()).sum().backward();
                (y, x.grad(&grads).unwrap())
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let diff = |a: Tensor<3>, b: Tensor<3>| (a - b).abs().max().into_scalar::<f32>();
            assert!(diff(y1.clone(), y2) < 1e-5, "{layout:?} {rotary_dim:?} forward");
            assert!(diff(g1, g2) < 1e-5, "{layout:?} {rotary_dim:?} backward");
            assert!(diff(y1, qkv.clone()) > 1e-2, "the rotation must change the queries and keys");
        }
    }
}
