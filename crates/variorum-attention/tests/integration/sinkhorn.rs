//! Sparse Sinkhorn attention against its definition: softmax over [the block's sorted block; the
//! block itself], the sorted block the soft-permutation mix of key blocks.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{AttentionInput, AttentionKind, SinkhornAttention, SinkhornConfig};
use variorum_core::AttentionMask;

const D: usize = 16;

fn layer(block: usize, sortcut: Option<usize>, dev: &Device) -> SinkhornAttention {
    let cfg = SinkhornConfig { n_heads: 2, block, sortcut, ..Default::default() };
    cfg.validate(D).unwrap();
    cfg.init(D, 0.5, 0.5, dev)
}

fn input(b: usize, l: usize, dev: &Device) -> Tensor<3> {
    dev.seed(5);
    Tensor::random([b, l, D], Distribution::Normal(0.0, 1.0), dev)
}

fn heads(attn: &SinkhornAttention, x: Tensor<3>) -> [Tensor<4>; 3] {
    let [b, l, _] = x.dims();
    let (h, hd) = (attn.n_heads, attn.head_dim);
    let qkv = attn.qkv.forward(x).reshape([b, l, 3, h, hd]);
    let head = |i: usize| qkv.clone().narrow(2, i, 1).reshape([b, l, h, hd]).swap_dims(1, 2);
    [head(0), head(1), head(2)]
}

fn run(attn: &SinkhornAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    attn.forward(AttentionInput::self_attention(x, &mask), None).context
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

/// The definition, query by query: block i's sorted keys Σ_j S_ij K_j and its own keys (causal:
/// up to the query; the first block has no sorted block).
fn reference(attn: &SinkhornAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let [b, l, _] = x.dims();
    let (h, hd, m) = (attn.n_heads, attn.head_dim, attn.block);
    assert_eq!(l % m, 0, "the reference takes whole blocks");
    let n = l / m;
    let [q, k, v] = heads(attn, x);
    let s = attn.sort_matrix(k.clone().reshape([b, h, n, m * hd]), causal);
    let mut rows = Vec::new();
    for t in 0..l {
        let i = t / m;
        let mix = |x: &Tensor<4>| {
            s.clone().narrow(2, i, 1).matmul(x.clone().reshape([b, h, n, m * hd])).reshape([b, h, m, hd])
        };
        let own = if causal { t - i * m + 1 } else { m };
        let (mut keys, mut values) = (vec![k.clone().narrow(2, i * m, own)], vec![v.clone().narrow(2, i * m, own)]);
        if !(causal && i == 0) {
            keys.push(mix(&k));
            values.push(mix(&v));
        }
        let scores =
            q.clone().narrow(2, t, 1).matmul(Tensor::cat(keys, 2).swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
        rows.push(softmax(scores, 3).matmul(Tensor::cat(values, 2)));
    }
    let out = Tensor::cat(rows, 2).swap_dims(1, 2).reshape([b, l, h * hd]);
    attn.out.forward(out)
}

#[test]
fn blocks_attend_to_themselves_and_their_sorted_block() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(4, None, &dev);
    let x = input(2, 16, &dev);
    for causal in [true, false] {
        let diff = max_diff(run(&attn, x.clone(), causal), reference(&attn, x.clone(), causal));
        assert!(diff < 1e-5, "causal {causal}: {diff}");
    }
}

#[test]
fn one_block_is_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(8, None, &dev);
    let x = input(1, 8, &dev);
    let [q, k, v] = heads(&attn, x.clone());
    for causal in [true, false] {
        let scores = q.clone().matmul(k.clone().swap_dims(2, 3)).div_scalar((attn.head_dim as f64).sqrt());
        let hidden: Vec<bool> = (0..64).map(|x| causal && x % 8 > x / 8).collect();
        let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [8, 8]), &dev)
            .reshape([1, 1, 8, 8])
            .expand([1, 2, 8, 8]);
        let out = softmax(scores.mask_fill(hidden, -1e9), 3).matmul(v.clone());
        let want = attn.out.forward(out.swap_dims(1, 2).reshape([1, 8, 2 * attn.head_dim]));
        let diff = max_diff(run(&attn, x.clone(), causal), want);
        assert!(diff < 1e-5, "causal {causal}: {diff}");
    }
}

#[test]
fn balancing_is_doubly_stochastic_and_causal_rows_read_earlier_blocks() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = SinkhornConfig { n_heads: 2, block: 2, iterations: 30, ..Default::default() }.init(D, 0.5, 0.5, &dev);
    let k: Tensor<4> = Tensor::random([1, 2, 5, 2 * attn.head_dim], Distribution::Normal(0.0, 1.0), &dev);
    let s = attn.sort_matrix(k.clone(), false);
    let rows = (s.clone().sum_dim(3) - 1.0).abs().max().into_scalar::<f32>();
    let cols = (s.sum_dim(2) - 1.0).abs().max().into_scalar::<f32>();
    assert!(rows < 1e-3 && cols < 1e-3, "row sums off by {rows}, column sums by {cols}");
    let c = attn.sort_matrix(k, true).into_data().try_to_vec::<f32>().unwrap();
    for hi in 0..2 {
        for i in 0..5 {
            let row = &c[(hi * 5 + i) * 5..(hi * 5 + i + 1) * 5];
            let total: f32 = row.iter().sum();
            assert!((total - if i == 0 { 0.0 } else { 1.0 }).abs() < 1e-5, "row {i}: {row:?}");
            assert!(row[i..].iter().all(|&x| x < 1e-6), "row {i} reads a later block: {row:?}");
        }
    }
}

#[test]
fn sortcut_attends_to_the_first_sorted_blocks() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(4, Some(2), &dev);
    let x = input(1, 16, &dev);
    let [q, k, v] = heads(&attn, x.clone());
    let hd = attn.head_dim;
    let s = attn.sort_matrix(k.clone().reshape([1, 2, 4, 4 * hd]), false).narrow(2, 0, 2);
    let mix = |x: Tensor<4>| s.clone().matmul(x.reshape([1, 2, 4, 4 * hd])).reshape([1, 2, 8, hd]);
    let scores = q.matmul(mix(k).swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
    let want = attn.out.forward(softmax(scores, 3).matmul(mix(v)).swap_dims(1, 2).reshape([1, 16, 2 * hd]));
    let diff = max_diff(run(&attn, x, false), want);
    assert!(diff < 1e-5, "{diff}");
}

#[test]
fn decoding_token_by_token_equals_the_full_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    for block in [3, 4, 8] {
        let attn = layer(block, None, &dev);
        let x = input(2, 29, &dev);
        let gap = common::decoding_gap(|i, c| attn.forward(i, c), &x, 5);
        // the same keys summed in another order (gathered vs blocked)
        assert!(gap < 1e-4, "block {block}: {gap}");
    }
}

/// A causal output may not depend on a later position even in its rounding: changing the last
/// positions of a block leaves every earlier output bit-identical. ("The blocks before i" as
/// cumsum − own block rounded differently when the own block changed.)
#[test]
fn causal_outputs_before_a_change_are_bit_identical() {
    let dev = Device::flex();
    let attn = layer(4, None, &dev);
    let x = input(2, 24, &dev);
    let before = run(&attn, x.clone(), true);
    for (seed, at) in [(1, 11), (2, 15), (3, 22), (4, 7)] {
        dev.seed(seed);
        let later = Tensor::random([2, 24 - at, D], Distribution::Normal(0.0, 3.0), &dev);
        let y = x.clone().slice_assign([0..2, at..24, 0..D], later);
        let after = run(&attn, y, true);
        assert_eq!(
            before.clone().narrow(1, 0, at).into_data(),
            after.narrow(1, 0, at).into_data(),
            "outputs before position {at} changed"
        );
    }
}

/// On flex (no dropout, no SortCut) the blocks attend on their own kernel: equal to the
/// composed path with the kernels off — output, input gradient, the projection's and the sorting
/// network's gradients —
/// causal and bidirectional, one block, several, a partial last block.
#[test]
fn the_kernel_path_equals_the_composed_path_with_gradients() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    for (block, len) in [(4, 16), (4, 18), (3, 3), (8, 5)] {
        let attn = SinkhornAttention { gumbel: false, ..layer(block, None, &dev) };
        let x = input(2, len, &dev);
        dev.seed(6);
        let w: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
        for causal in [true, false] {
            let what = format!("block {block}, len {len}, causal {causal}");
            let run = |x: Tensor<3>| run(&attn, x, causal);
            let before = variorum_kernels::sinkhorn::calls();
            common::assert_kernel_matches_composed(&what, &x, &w, &run, |g| attn.qkv.weight.grad(g).unwrap());
            // the sorting network's gradient comes back through the kernel's dS
            common::assert_kernel_matches_composed(&what, &x, &w, &run, |g| attn.sort.weight.grad(g).unwrap());
            assert!(variorum_kernels::sinkhorn::calls() > before, "{what}: Sinkhorn's kernel");
        }
    }
}
