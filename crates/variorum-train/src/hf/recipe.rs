//! How one of variorum's tensors is made from a checkpoint's: copied, transposed from PyTorch's
//! `[out, in]` `nn.Linear` layout to Burn's `[in, out]`, or several joined along their last axis
//! (q | k | v into the fused projection, gate | up into a gated FFN's).

use anyhow::{Result, bail};

use super::checkpoint::Checkpoint;

/// A variorum tensor in terms of the checkpoint's.
#[derive(Debug, Clone)]
pub(crate) enum Recipe {
    /// The tensor as stored.
    Copy(String),
    /// A 2-D tensor transposed.
    Transpose(String),
    /// Tensors of equal leading axes joined along the last one, in order.
    Join(Vec<Recipe>),
}

impl Recipe {
    /// The stored tensor as it is.
    pub(crate) fn copy(name: impl Into<String>) -> Recipe {
        Recipe::Copy(name.into())
    }

    /// The stored 2-D tensor transposed.
    pub(crate) fn transpose(name: impl Into<String>) -> Recipe {
        Recipe::Transpose(name.into())
    }

    /// The shape this recipe gives, from the headers alone.
    pub(crate) fn shape(&self, ckpt: &Checkpoint) -> Result<Vec<usize>> {
        match self {
            Recipe::Copy(name) => ckpt.shape(name),
            Recipe::Transpose(name) => match ckpt.shape(name)?.as_slice() {
                &[a, b] => Ok(vec![b, a]),
                other => bail!("tensor {name} is {other:?}: expected a matrix"),
            },
            Recipe::Join(parts) => {
                let mut shapes = parts.iter().map(|p| p.shape(ckpt));
                let mut out = shapes.next().ok_or_else(|| anyhow::anyhow!("nothing to join"))??;
                for s in shapes {
                    let s = s?;
                    let last = out.len() - 1;
                    if s.len() != out.len() || s[..last] != out[..last] {
                        bail!("{self:?}: the parts' shapes {out:?} and {s:?} do not join along the last axis");
                    }
                    out[last] += s[last];
                }
                Ok(out)
            }
        }
    }

    /// The values, row-major, in the shape of [`shape`](Self::shape).
    pub(crate) fn values(&self, ckpt: &Checkpoint) -> Result<Vec<f32>> {
        match self {
            Recipe::Copy(name) => ckpt.values(name),
            Recipe::Transpose(name) => {
                let [rows, cols] = ckpt.shape(name)?[..] else { bail!("tensor {name} is not a matrix") };
                let v = ckpt.values(name)?;
                let mut t = vec![0.0; v.len()];
                for r in 0..rows {
                    for c in 0..cols {
                        t[c * rows + r] = v[r * cols + c];
                    }
                }
                Ok(t)
            }
            Recipe::Join(parts) => {
                let shapes: Vec<Vec<usize>> = parts.iter().map(|p| p.shape(ckpt)).collect::<Result<_>>()?;
                let values: Vec<Vec<f32>> = parts.iter().map(|p| p.values(ckpt)).collect::<Result<_>>()?;
                let widths: Vec<usize> = shapes.iter().map(|s| *s.last().expect("at least 1-D")).collect();
                let rows = values[0].len() / widths[0].max(1);
                let mut out = Vec::with_capacity(values.iter().map(Vec::len).sum());
                for r in 0..rows {
                    for (v, &w) in values.iter().zip(&widths) {
                        out.extend_from_slice(&v[r * w..(r + 1) * w]);
                    }
                }
                Ok(out)
            }
        }
    }
}
