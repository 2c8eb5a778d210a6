//! How one of variorum's tensors is made from a checkpoint's: copied, transposed from PyTorch's
//! `[out, in]` `nn.Linear` layout to Burn's `[in, out]`, several joined along their last axis
//! (q | k | v into the fused projection, gate | up into a gated FFN's), leading rows dropped,
//! reordered along the last axis, reshaped, or zeros where the architecture has no tensor.
//! Every recipe can be run backwards ([`Recipe::invert`]): that is how `export` writes a
//! checkpoint, so what is exported is by construction what the import reads.

use anyhow::{Result, bail};

use super::checkpoint::Checkpoint;

/// A variorum tensor in terms of the checkpoint's.
#[derive(Debug, Clone)]
pub(crate) enum Recipe {
    /// The tensor as stored.
    Copy(String),
    /// A 2-D tensor transposed.
    Transpose(String),
    /// Tensors of equal leading axes joined along the last one, in order, each of the width
    /// (last axis) the config implies.
    Join(Vec<(Recipe, usize)>),
    /// A tensor without its first rows (OPT's position table, whose first two rows no position
    /// reads); written back with zero rows in their place.
    SkipRows(Box<Recipe>, usize),
    /// A tensor with its last axis reordered: entry `i` of the result is entry `order[i]` of
    /// the stored one (GPT-NeoX's fused projection, q | k | v within each head, read as
    /// variorum's, each of q, k, v over all heads).
    Permute(Box<Recipe>, Vec<usize>),
    /// Zeros of a shape: a bias the checkpoint's architecture does not have but variorum's
    /// setting includes (Qwen2's output projection has none while its q/k/v have them).
    Zeros(Vec<usize>),
    /// A tensor of another shape with the same values in the same order (Nyströmformer's
    /// `Conv2d` kernel `[h, 1, k, 1]` as variorum's `Conv1d` kernel `[h, 1, k]`): the stored
    /// shape, then variorum's.
    Reshape(Box<Recipe>, Vec<usize>, Vec<usize>),
    /// A matrix with one row of another checkpoint matrix added to each of its rows: BERT's
    /// token-type embedding of type 0, which every position of a one-segment text adds, folded
    /// into the position table. Written back as the matrix, and a one-row table of zeros.
    PlusRow(Box<Recipe>, String, usize),
    /// A tensor the checkpoint also stores under a second name that its forward does not read
    /// (Reformer's `lm_head.bias` beside the decoder's, which is read): read from the first,
    /// written back under both, so that transformers finds every parameter it declares.
    AlsoAs(Box<Recipe>, String),
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

    /// A fused q/k/v projection (`Copy`/`Transpose` of it as `fused`) stored per head, each
    /// head's q, k and v one after the other (`[heads, 3, head_dim]` along its output:
    /// GPT-NeoX, BLOOM), read as variorum's: all heads' q, then all k, then all v.
    pub(crate) fn per_head_qkv(fused: Recipe, heads: usize, head_dim: usize) -> Recipe {
        // variorum's output feature (part p, head h, j) is the stored (h, p, j)
        let order = (0..3)
            .flat_map(|p| (0..heads).flat_map(move |h| (0..head_dim).map(move |j| (h * 3 + p) * head_dim + j)))
            .collect();
        Recipe::Permute(Box::new(fused), order)
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
                let mut out: Option<Vec<usize>> = None;
                for (part, width) in parts {
                    let s = part.shape(ckpt)?;
                    if s.last() != Some(width) {
                        bail!("{part:?} has the shape {s:?}, but config.json implies {width} along its last axis");
                    }
                    match &mut out {
                        None => out = Some(s),
                        Some(out) => {
                            let last = out.len() - 1;
                            if s.len() != out.len() || s[..last] != out[..last] {
                                bail!("{self:?}: the parts' shapes {out:?} and {s:?} do not join along the last axis");
                            }
                            out[last] += s[last];
                        }
                    }
                }
                out.ok_or_else(|| anyhow::anyhow!("nothing to join"))
            }
            Recipe::SkipRows(inner, skip) => {
                let mut shape = inner.shape(ckpt)?;
                match shape.first_mut() {
                    Some(rows) if *rows > *skip => *rows -= skip,
                    _ => bail!("{inner:?} has the shape {shape:?}: expected more than {skip} rows"),
                }
                Ok(shape)
            }
            Recipe::Permute(inner, order) => {
                let shape = inner.shape(ckpt)?;
                if shape.last() != Some(&order.len()) {
                    bail!("{inner:?} has the shape {shape:?}: expected {} along its last axis", order.len());
                }
                Ok(shape)
            }
            Recipe::Zeros(shape) => Ok(shape.clone()),
            Recipe::Reshape(inner, stored, ours) => {
                let shape = inner.shape(ckpt)?;
                if &shape != stored || stored.iter().product::<usize>() != ours.iter().product::<usize>() {
                    bail!("{inner:?} has the shape {shape:?}: expected {stored:?}, read as {ours:?}");
                }
                Ok(ours.clone())
            }
            Recipe::AlsoAs(inner, _) => inner.shape(ckpt),
            Recipe::PlusRow(inner, name, row) => {
                let shape = inner.shape(ckpt)?;
                match (ckpt.shape(name)?.as_slice(), shape.as_slice()) {
                    (&[rows, w], &[_, width]) if *row < rows && w == width => Ok(shape),
                    (other, _) => {
                        bail!("tensor {name} is {other:?}: expected a matrix with row {row} as wide as {inner:?}")
                    }
                }
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
                let values: Vec<Vec<f32>> = parts.iter().map(|(p, _)| p.values(ckpt)).collect::<Result<_>>()?;
                let widths: Vec<usize> = parts.iter().map(|(_, w)| *w).collect();
                let rows = values[0].len() / widths[0].max(1);
                let mut out = Vec::with_capacity(values.iter().map(Vec::len).sum());
                for r in 0..rows {
                    for (v, &w) in values.iter().zip(&widths) {
                        out.extend_from_slice(&v[r * w..(r + 1) * w]);
                    }
                }
                Ok(out)
            }
            Recipe::SkipRows(inner, skip) => {
                // the shape check (more rows than skipped) before any slicing
                let kept = self.shape(ckpt)?[0];
                let mut v = inner.values(ckpt)?;
                let width = v.len() / (kept + skip);
                Ok(v.split_off(skip * width))
            }
            Recipe::Permute(inner, order) => {
                let v = inner.values(ckpt)?;
                Ok(v.chunks(order.len()).flat_map(|row| order.iter().map(|&i| row[i])).collect())
            }
            Recipe::Zeros(shape) => Ok(vec![0.0; shape.iter().product()]),
            Recipe::Reshape(inner, _, _) => {
                self.shape(ckpt)?;
                inner.values(ckpt)
            }
            Recipe::AlsoAs(inner, _) => inner.values(ckpt),
            Recipe::PlusRow(inner, name, row) => {
                let width = *self.shape(ckpt)?.last().expect("a matrix");
                let added = ckpt.values(name)?;
                let added = &added[row * width..(row + 1) * width];
                let mut v = inner.values(ckpt)?;
                for chunk in v.chunks_mut(width) {
                    chunk.iter_mut().zip(added).for_each(|(x, a)| *x += a);
                }
                Ok(v)
            }
        }
    }

    /// The checkpoint's tensors that make `values` (of `shape`, row-major) by this recipe:
    /// copied back, transposed back, or split at the parts' widths.
    pub(crate) fn invert(
        &self,
        values: Vec<f32>,
        shape: &[usize],
        out: &mut Vec<(String, Vec<usize>, Vec<f32>)>,
    ) -> Result<()> {
        match self {
            Recipe::Copy(name) => out.push((name.clone(), shape.to_vec(), values)),
            Recipe::Transpose(name) => {
                let [rows, cols] = shape[..] else {
                    bail!("{self:?} is given a tensor of shape {shape:?}: expected a matrix")
                };
                let mut t = vec![0.0; values.len()];
                for r in 0..rows {
                    for c in 0..cols {
                        t[c * rows + r] = values[r * cols + c];
                    }
                }
                out.push((name.clone(), vec![cols, rows], t));
            }
            Recipe::Join(parts) => {
                let total: usize = parts.iter().map(|(_, w)| w).sum();
                if shape.last() != Some(&total) {
                    bail!("{self:?} is given a tensor of shape {shape:?}: its parts are {total} wide");
                }
                let rows = values.len() / total.max(1);
                let mut offset = 0;
                for (part, width) in parts {
                    let mut piece = Vec::with_capacity(rows * width);
                    for r in 0..rows {
                        piece.extend_from_slice(&values[r * total + offset..r * total + offset + width]);
                    }
                    let mut part_shape = shape.to_vec();
                    *part_shape.last_mut().expect("at least 1-D") = *width;
                    part.invert(piece, &part_shape, out)?;
                    offset += width;
                }
            }
            Recipe::SkipRows(inner, skip) => {
                let Some((_, rest)) = shape.split_first() else { bail!("{self:?} is given a scalar") };
                let width = rest.iter().product::<usize>();
                let mut padded = vec![0.0; skip * width];
                padded.extend(values);
                let mut padded_shape = shape.to_vec();
                padded_shape[0] += skip;
                inner.invert(padded, &padded_shape, out)?;
            }
            Recipe::Permute(inner, order) => {
                let mut back = vec![0.0; values.len()];
                for (row_out, row_in) in back.chunks_mut(order.len()).zip(values.chunks(order.len())) {
                    for (i, &from) in order.iter().enumerate() {
                        row_out[from] = row_in[i];
                    }
                }
                inner.invert(back, shape, out)?;
            }
            // nothing of the checkpoint's: the architecture has no such tensor
            Recipe::Zeros(_) => {}
            Recipe::Reshape(inner, stored, _) => inner.invert(values, stored, out)?,
            Recipe::AlsoAs(inner, name) => {
                out.push((name.clone(), shape.to_vec(), values.clone()));
                inner.invert(values, shape, out)?;
            }
            Recipe::PlusRow(inner, name, _) => {
                let width = *shape.last().unwrap_or(&0);
                out.push((name.clone(), vec![1, width], vec![0.0; width]));
                inner.invert(values, shape, out)?;
            }
        }
        Ok(())
    }
}
