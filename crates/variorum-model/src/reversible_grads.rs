//! Gradients of a reversible stack without its activations (Gomez et al. 2017, §4; Reformer §3).
//!
//! 1. The stack runs forward on the inference copy of the model — no graph, so nothing of a block
//!    outlives it; only the two output streams remain.
//! 2. The head (final norm, logits, loss) runs under autodiff from the output streams as leaves,
//!    giving dL/dY₁, dL/dY₂ and the head's gradients.
//! 3. From the last block to the first: rebuild the block's inputs from its outputs
//!    (`TransformerBlock::reversible_inverse`), recompute that one block under autodiff from
//!    them as leaves, and back-propagate ⟨Y₁, dL/dY₁⟩ + ⟨Y₂, dL/dY₂⟩ (+ its auxiliary losses):
//!    this gives the block's parameter gradients and dL/dX₁, dL/dX₂ for the block below.
//! 4. The embedding gets dL/dX₁ + dL/dX₂ (both streams start as its output).
//!
//! Burn has no tensor-level custom backward; this manual vector–Jacobian product loop uses only
//! its public API (`Tensor::grad`, `GradientsParams::from_module`, `GradientsAccumulator`).
//! Peak memory is one block's graph plus the streams, whatever the depth.

use crate::DecoderLm;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use variorum_block::{RevContext, Streams};
use variorum_core::AuxLosses;

/// The loss of `tokens` → `targets` (detached), the auxiliary losses (detached, weighted), and
/// the gradients of `scale · (loss + Σ aux)` with respect to every parameter of a reversible
/// `model` on an autodiff device, for rows tagged `tags` (`None`: untagged).
pub fn reversible_grads(
    model: &DecoderLm,
    tokens: Tensor<2, Int>,
    targets: Tensor<2, Int>,
    tags: Option<Tensor<1, Int>>,
    scale: f64,
) -> (Tensor<1>, AuxLosses, GradientsParams) {
    let [_, len] = tokens.dims();
    let device = tokens.device();
    let plain = device.clone().without_autodiff();
    let mut acc = GradientsAccumulator::<DecoderLm>::new();

    // the embedding's graph is small ([batch, len, d]); it waits for step 4
    let x0 = model.embed(tokens, 0);
    let dropout = model.replay_dropout(&device);
    let (mask, dense) = model.mask(len, None, &plain);
    let (mask_ad, dense_ad) = model.mask(len, None, &device);
    // the same tags on either device (integer tensors carry no graph)
    let mask = mask.with_tags(tags.as_ref().map(|t| Tensor::from_data(t.to_data(), &plain)));
    let mask_ad = mask_ad.with_tags(tags);
    let context = |layer: usize, autodiff: bool| RevContext {
        mask: if autodiff { &mask_ad } else { &mask },
        dense_mask: if autodiff { dense_ad.as_ref() } else { dense.as_ref() },
        dropout,
        layer,
    };

    // 1. forward without a graph
    let frozen = model.valid();
    let mut streams = Streams::split(x0.clone().detach().without_autodiff());
    let mut aux_sums: AuxLosses = Vec::new();
    for (i, block) in frozen.blocks.iter().enumerate() {
        let (s, aux) = block.reversible_forward(streams, &context(i, false), None);
        streams = s;
        variorum_core::sum_aux_losses(&mut aux_sums, aux);
    }

    // 2. the head, from the output streams as leaves
    let y1 = leaf(streams.x1.clone());
    let y2 = leaf(streams.x2.clone());
    let logits =
        model.exit_logits(model.depth - 1, Streams { x1: y1.clone(), x2: y2.clone() }.merge(model.stream_merge));
    let loss = model.token_loss(logits, targets);
    let mut grads = loss.clone().mul_scalar(scale).backward();
    let mut gy = upstream(&y1, &y2, &grads);
    acc.accumulate(model, GradientsParams::from_grads(grads, model));

    // 3. block by block, from the top
    for (i, block) in model.blocks.iter().enumerate().rev() {
        let inputs = frozen.blocks[i].reversible_inverse(streams, &context(i, false));
        let (x1, x2) = (leaf(inputs.x1.clone()), leaf(inputs.x2.clone()));
        let (out, aux) = block.reversible_forward(Streams { x1: x1.clone(), x2: x2.clone() }, &context(i, true), None);
        grads = surrogate(out, gy, aux, scale).backward();
        gy = upstream(&x1, &x2, &grads);
        acc.accumulate(model, GradientsParams::from_module(&mut grads, block));
        streams = inputs;
    }

    // 4. the embedding, which fed both streams
    let grads = (x0 * (gy.x1 + gy.x2).autodiff()).sum().backward();
    acc.accumulate(model, GradientsParams::from_grads(grads, model));
    let aux = aux_sums.into_iter().map(|(n, l)| (n, l.autodiff().detach())).collect();
    (loss.detach(), aux, acc.grads())
}

/// A graph leaf holding `x`'s value.
fn leaf(x: Tensor<3>) -> Tensor<3> {
    x.autodiff().detach().require_grad()
}

/// dL/dX₁, dL/dX₂ read from the leaves after a backward (plain tensors).
fn upstream(x1: &Tensor<3>, x2: &Tensor<3>, grads: &burn::tensor::Gradients) -> Streams {
    let read = |x: &Tensor<3>| x.grad(grads).unwrap_or_else(|| x.zeros_like().without_autodiff());
    Streams { x1: read(x1), x2: read(x2) }
}

/// ⟨Y₁, g₁⟩ + ⟨Y₂, g₂⟩ + scale · Σ aux: its gradient with respect to the block's inputs and
/// parameters is the chain rule through this block.
fn surrogate(out: Streams, g: Streams, aux: AuxLosses, scale: f64) -> Tensor<1> {
    let mut total = (out.x1 * g.x1.autodiff()).sum() + (out.x2 * g.x2.autodiff()).sum();
    for (_, l) in aux {
        total = total + l.mul_scalar(scale);
    }
    total
}
