//! Random projections for the random-feature attentions (Performer, RFA), kept as parameters
//! without gradient: saved with the model, drawn again by [`redraw`] when training asks.

use burn::module::{Param, ParamId};
use burn::prelude::*;
use burn::tensor::Distribution;

/// `rows` Gaussian vectors of size `d` (entries N(0, 1)); with `orthogonal`, each block of `d`
/// rows is made orthogonal (Gram–Schmidt on the draw) and every row is rescaled to the norm of an
/// independent Gaussian vector, so each row keeps the N(0, I) marginal (Performer's FAVOR+,
/// Choromanski et al. 2021, "orthogonal random features").
pub fn gaussian_rows(rows: usize, d: usize, orthogonal: bool, device: &Device) -> Tensor<2> {
    let draw: Tensor<2> = Tensor::random([rows, d], Distribution::Normal(0.0, 1.0), device);
    if !orthogonal || d == 0 {
        return draw;
    }
    let norms: Tensor<2> = Tensor::random([rows, d], Distribution::Normal(0.0, 1.0), device);
    let w: Vec<f64> = draw.into_data().convert::<f64>().try_into_vec::<f64>().unwrap_or_default();
    let n: Vec<f64> = norms.into_data().convert::<f64>().try_into_vec::<f64>().unwrap_or_default();
    // Gram–Schmidt by hand: Burn has no QR, and these are a few d × d blocks once per draw
    let mut out = vec![0f32; rows * d];
    for block in (0..rows).step_by(d) {
        let mut basis: Vec<Vec<f64>> = Vec::with_capacity(d);
        for r in block..(block + d).min(rows) {
            let mut v = w[r * d..(r + 1) * d].to_vec();
            for b in &basis {
                let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
                v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
            }
            let len = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= len);
            let target = n[r * d..(r + 1) * d].iter().map(|x| x * x).sum::<f64>().sqrt();
            out[r * d..(r + 1) * d].iter_mut().zip(&v).for_each(|(o, x)| *o = (x * target) as f32);
            basis.push(v);
        }
    }
    Tensor::from_data(TensorData::new(out, [rows, d]), device)
}

/// A fixed (no-gradient) parameter holding `value`.
pub fn fixed(value: Tensor<2>) -> Param<Tensor<2>> {
    Param::from_tensor(value).set_require_grad(false)
}

/// `param` with a new value and the same id (optimiser state and records keep pointing at it).
pub fn redraw(param: &Param<Tensor<2>>, value: Tensor<2>) -> Param<Tensor<2>> {
    let id: ParamId = param.id;
    // set on the parameter, not only its tensor: a parameter marked active gets its gradient
    // switched back on by Burn's module conversions
    Param::initialized(id, value).set_require_grad(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_blocks_are_orthogonal_with_gaussian_norms() {
        let dev = Device::flex();
        let w = gaussian_rows(10, 4, true, &dev);
        let v = w.clone().into_data().try_to_vec::<f32>().unwrap();
        let row = |r: usize| &v[r * 4..(r + 1) * 4];
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        for block in [0, 4] {
            for i in block..block + 4 {
                for j in block..i {
                    assert!(dot(row(i), row(j)).abs() < 1e-4, "rows {i}, {j}");
                }
            }
        }
        // rows of different blocks are independent draws, not orthogonal
        assert!((0..4).any(|i| dot(row(i), row(4 + i)).abs() > 1e-3));
        // norms are chi(4)-distributed, not 1
        assert!((0..10).any(|r| (dot(row(r), row(r)).sqrt() - 1.0).abs() > 0.1));
    }
}
