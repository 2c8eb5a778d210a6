//! LSH attention against its definition: dense shared-QK attention restricted to same-bucket
//! pairs (every round's buckets from the layer's own hashing), self excluded unless alone, and
//! several rounds as one softmax over the union of their pairs (the duplicate correction).

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{AttentionInput, AttentionKind, LshAttention, LshConfig};
use variorum_core::AttentionMask;

const D: usize = 16;

fn layer(buckets: usize, rounds: usize, chunk: usize, dev: &Device) -> LshAttention {
    let cfg = LshConfig { n_heads: 2, buckets, rounds, chunk, seed: 3, ..Default::default() };
    cfg.validate(D).unwrap();
    cfg.init(D, 0.5, 0.5, dev)
}

/// Dense reference: one softmax of q·k̂/√d over the union of the rounds' pairs
/// (`sees(round, batch, head, q, k)` in any round), self at −10⁵ — Reformer's multi-round
/// attention with the duplicate correction, where a key met in several rounds counts once.
fn dense(attn: &LshAttention, x: Tensor<3>, sees: impl Fn(usize, usize, usize, usize, usize) -> bool) -> Tensor<3> {
    let [b, l, _] = x.dims();
    let (h, hd) = (attn.n_heads, attn.head_dim);
    let dev = x.device();
    let qv = attn.qv.forward(x).reshape([b, l, 2, h, hd]);
    let q = qv.clone().narrow(2, 0, 1).reshape([b, l, h, hd]).swap_dims(1, 2);
    let v = qv.narrow(2, 1, 1).reshape([b, l, h, hd]).swap_dims(1, 2);
    let k = q.clone() / (q.clone().powf_scalar(2.0).sum_dim(3).sqrt() + 1e-6);
    let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
    let mut hidden = Vec::new();
    let mut is_self = Vec::new();
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                for j in 0..l {
                    hidden.push(!(0..attn.rounds).any(|r| sees(r, bi, hi, i, j)));
                    is_self.push(i == j);
                }
            }
        }
    }
    let hidden = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [b, h, l, l]), &dev);
    let is_self = Tensor::<4, Bool>::from_data(TensorData::new(is_self, [b, h, l, l]), &dev);
    let s = scores.mask_fill(is_self, -1e5).mask_fill(hidden, -1e9);
    let out = softmax(s, 3).matmul(v);
    attn.out.forward(out.swap_dims(1, 2).reshape([b, l, h * hd]))
}

/// Buckets `[round][batch][head][position]` as the layer hashes them.
fn buckets(attn: &LshAttention, x: Tensor<3>) -> Vec<Vec<Vec<Vec<i64>>>> {
    let [b, l, _] = x.dims();
    let (h, hd) = (attn.n_heads, attn.head_dim);
    let q = attn.qv.forward(x).reshape([b, l, 2, h, hd]).narrow(2, 0, 1).reshape([b, l, h, hd]).swap_dims(1, 2);
    let k = q.clone() / (q.powf_scalar(2.0).sum_dim(3).sqrt() + 1e-6);
    (0..attn.rounds)
        .map(|r| {
            let v = attn.buckets(k.clone(), r).into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
            (0..b).map(|bi| (0..h).map(|hi| v[(bi * h + hi) * l..(bi * h + hi + 1) * l].to_vec()).collect()).collect()
        })
        .collect()
}

fn run(attn: &LshAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    attn.forward(AttentionInput::self_attention(x, &mask), None).context
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn input(b: usize, l: usize, dev: &Device) -> Tensor<3> {
    dev.seed(7);
    Tensor::random([b, l, D], Distribution::Normal(0.0, 1.0), dev)
}

#[test]
fn one_bucket_one_round_is_full_shared_qk_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(1, 1, 64, &dev);
    let x = input(2, 12, &dev);
    for causal in [true, false] {
        let want = dense(&attn, x.clone(), |_, _, _, i, j| !causal || j <= i);
        let diff = max_diff(run(&attn, x.clone(), causal), want);
        assert!(diff < 1e-5, "causal {causal}: {diff}");
    }
}

#[test]
fn buckets_restrict_attention_to_same_bucket_keys() {
    let _guard = common::seeded();
    let dev = Device::flex();
    for rounds in [1, 3] {
        let attn = layer(4, rounds, 64, &dev);
        let x = input(2, 14, &dev);
        let hb = buckets(&attn, x.clone());
        let distinct: std::collections::BTreeSet<i64> = hb[0][0][0].iter().copied().collect();
        assert!(distinct.len() >= 2, "the hashing put everything in one bucket: {distinct:?}");
        for causal in [true, false] {
            let want = dense(&attn, x.clone(), |r, b, h, i, j| hb[r][b][h][i] == hb[r][b][h][j] && (!causal || j <= i));
            let diff = max_diff(run(&attn, x.clone(), causal), want);
            assert!(diff < 1e-5, "{rounds} rounds, causal {causal}: {diff}");
        }
    }
}

#[test]
fn causal_chunks_see_the_last_m_positions_of_the_own_bucket() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let m = 3;
    let attn = layer(2, 2, m, &dev);
    let x = input(1, 21, &dev);
    let hb = buckets(&attn, x.clone());
    let sees = |r: usize, b: usize, h: usize, i: usize, j: usize| {
        let bk = &hb[r][b][h];
        // j earlier in i's bucket, with at most m − 1 of that bucket between them
        j <= i && bk[i] == bk[j] && (j..i).filter(|&t| bk[t] == bk[i]).count() <= m
    };
    let diff = max_diff(run(&attn, x.clone(), true), dense(&attn, x.clone(), sees));
    assert!(diff < 1e-5, "{diff}");
    // and chunking changed something: not the unlimited same-bucket attention
    let unlimited = dense(&attn, x.clone(), |r, b, h, i, j| j <= i && hb[r][b][h][i] == hb[r][b][h][j]);
    assert!(max_diff(run(&attn, x, true), unlimited) > 1e-4);
}

#[test]
fn bidirectional_chunks_see_their_own_and_the_previous_chunk() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let m = 4;
    for rounds in [1, 3] {
        let attn = layer(2, rounds, m, &dev);
        let (l, x) = (13, input(1, 13, &dev));
        let hb = buckets(&attn, x.clone());
        // sorted index of each position per round and head: by (bucket, position)
        let rank = |r: usize, h: usize| {
            let bk = &hb[r][0][h];
            let mut order: Vec<usize> = (0..l).collect();
            order.sort_by_key(|&p| (bk[p], p));
            let mut rank = vec![0; l];
            for (s, &p) in order.iter().enumerate() {
                rank[p] = s;
            }
            rank
        };
        let ranks: Vec<[Vec<usize>; 2]> = (0..rounds).map(|r| [rank(r, 0), rank(r, 1)]).collect();
        let chunks = l.div_ceil(m);
        let sees = |r: usize, _: usize, h: usize, i: usize, j: usize| {
            let (ci, cj) = (ranks[r][h][i] / m, ranks[r][h][j] / m);
            hb[r][0][h][i] == hb[r][0][h][j] && (ci == cj || cj == (ci + chunks - 1) % chunks)
        };
        if rounds > 1 {
            // the rounds overlap partly, so counting a key once or per round differs
            let met = |i: usize, j: usize| (0..rounds).filter(|&r| sees(r, 0, 0, i, j)).count();
            let counts: Vec<usize> = (0..l).flat_map(|i| (0..l).map(move |j| (i, j))).map(|(i, j)| met(i, j)).collect();
            assert!(counts.contains(&1) && counts.iter().any(|&n| n > 1 && n < rounds + 1));
        }
        let diff = max_diff(run(&attn, x.clone(), false), dense(&attn, x, sees));
        assert!(diff < 1e-5, "{rounds} rounds: {diff}");
    }
}

#[test]
fn rotations_are_fixed_per_layer_and_differ_between_layers() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let x = input(1, 10, &dev);
    let cfg = LshConfig { n_heads: 2, buckets: 8, rounds: 1, ..Default::default() };
    let a = cfg.init(D, 0.5, 0.5, &dev);
    let b = LshAttention { layer: 1, ..a.clone() };
    assert_eq!(buckets(&a, x.clone()), buckets(&a, x.clone()));
    assert_ne!(buckets(&a, x.clone()), buckets(&b, x));
    assert!(cfg.for_layer(1).init(D, 0.5, 0.5, &dev).layer == 1);
}

#[test]
fn decoding_token_by_token_equals_the_full_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    // past several buffer growths of the cache, buckets with more than m earlier positions
    for (buckets, rounds, chunk) in [(4, 2, 3), (2, 1, 5), (1, 1, 4)] {
        let attn = layer(buckets, rounds, chunk, &dev);
        let x = input(2, 45, &dev);
        let gap = common::decoding_gap(|i, c| attn.forward(i, c), &x, 7);
        // the same keys summed in another order (gathered vs chunked)
        assert!(gap < 1e-4, "{buckets} buckets, {rounds} rounds, chunk {chunk}: {gap}");
    }
}

/// On flex (no dropout) LSH runs on the block-sparse kernel ([`variorum_attention::sorted_kernel`]):
/// the kernel path equals the composed one with the kernels off — output, input gradient and the
/// projection's gradient — causal and bidirectional, one to three rounds, one, two or many chunks
/// (the first's "before" wraps to the last), a length that is not a multiple of the chunk, a
/// single position, two batch rows.
#[test]
fn the_kernel_path_equals_the_composed_path_with_gradients() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    // chunks: 8, 6, 14, 3, 2 (the wrap is the other chunk), 1; and one position
    let cases =
        [(4, 1, 3, 23), (4, 2, 4, 21), (2, 3, 5, 70), (8, 2, 64, 130), (4, 2, 12, 23), (4, 2, 32, 20), (2, 2, 4, 1)];
    for (buckets, rounds, chunk, len) in cases {
        let attn = layer(buckets, rounds, chunk, &dev);
        let x = input(2, len, &dev);
        dev.seed(9);
        let w: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
        for causal in [true, false] {
            let what = format!("{buckets} buckets, {rounds} rounds, chunk {chunk}, len {len}, causal {causal}");
            let run = |x: Tensor<3>| run(&attn, x, causal);
            common::assert_kernel_matches_composed(&what, &x, &w, run, |g| attn.qv.weight.grad(g).unwrap());
        }
    }
}
