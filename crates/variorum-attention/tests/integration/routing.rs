//! Routing attention against its definition (dense attention restricted to same-cluster pairs),
//! and its centroids' moving average.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{AttentionInput, AttentionKind, RoutingAttention, RoutingConfig};
use variorum_core::AttentionMask;

const D: usize = 16;

fn layer(clusters: usize, window: usize, local_heads: usize, dev: &Device) -> RoutingAttention {
    let cfg = RoutingConfig { n_heads: 2, clusters, window, local_heads, decay: 0.5, ..Default::default() };
    cfg.validate(D).unwrap();
    cfg.init(D, 0.5, 0.5, dev)
}

fn input(b: usize, l: usize, dev: &Device) -> Tensor<3> {
    dev.seed(11);
    Tensor::random([b, l, D], Distribution::Normal(0.0, 1.0), dev)
}

/// q, k, v heads `[b, h, l, hd]` as the layer projects them.
fn heads(attn: &RoutingAttention, x: Tensor<3>) -> [Tensor<4>; 3] {
    let [b, l, _] = x.dims();
    let (h, hd) = (attn.n_heads, attn.head_dim);
    let qkv = attn.qkv.forward(x).reshape([b, l, 3, h, hd]);
    let head = |i: usize| qkv.clone().narrow(2, i, 1).reshape([b, l, h, hd]).swap_dims(1, 2);
    [head(0), head(1), head(2)]
}

fn clusters_of(attn: &RoutingAttention, x: Tensor<4>) -> Vec<i64> {
    attn.assign(x).into_data().convert::<i64>().try_into_vec::<i64>().unwrap()
}

/// Dense attention over the pairs `sees(batch, head, q, k)` allows; rows that see nothing give 0.
fn dense(attn: &RoutingAttention, x: Tensor<3>, sees: impl Fn(usize, usize, usize, usize) -> bool) -> Tensor<3> {
    let [b, l, _] = x.dims();
    let (h, hd) = (attn.n_heads, attn.head_dim);
    let [q, k, v] = heads(attn, x.clone());
    let mut hidden = Vec::new();
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                for j in 0..l {
                    hidden.push(!sees(bi, hi, i, j));
                }
            }
        }
    }
    let hidden = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [b, h, l, l]), &x.device());
    let any = hidden.clone().bool_not().float().max_dim(3);
    let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((hd as f64).sqrt()).mask_fill(hidden, -1e9);
    let out = softmax(scores, 3).matmul(v) * any;
    attn.out.forward(out.swap_dims(1, 2).reshape([b, l, h * hd]))
}

fn run(attn: &RoutingAttention, x: Tensor<3>, causal: bool) -> Tensor<3> {
    let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
    attn.forward(AttentionInput::self_attention(x, &mask), None).context
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn one_cluster_is_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(1, 16, 0, &dev);
    let x = input(2, 11, &dev);
    for causal in [true, false] {
        let diff = max_diff(run(&attn, x.clone(), causal), dense(&attn, x.clone(), |_, _, i, j| !causal || j <= i));
        assert!(diff < 1e-5, "causal {causal}: {diff}");
    }
}

#[test]
fn queries_attend_to_the_keys_of_their_cluster() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(3, 16, 0, &dev);
    let (b, l, h) = (2, 13, 2);
    let x = input(b, l, &dev);
    let [q, k, _] = heads(&attn, x.clone());
    let (cq, ck) = (clusters_of(&attn, q), clusters_of(&attn, k));
    let distinct: std::collections::BTreeSet<i64> = cq.iter().copied().collect();
    assert!(distinct.len() >= 2, "everything in one cluster");
    let at = |c: &Vec<i64>, bi: usize, hi: usize, i: usize| c[(bi * h + hi) * l + i];
    for causal in [true, false] {
        let sees = |bi, hi, i, j| at(&cq, bi, hi, i) == at(&ck, bi, hi, j) && (!causal || j <= i);
        let diff = max_diff(run(&attn, x.clone(), causal), dense(&attn, x.clone(), sees));
        assert!(diff < 1e-5, "causal {causal}: {diff}");
    }
}

#[test]
fn causally_a_query_sees_the_latest_keys_of_its_cluster_among_2w_items() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let w = 2;
    let attn = layer(2, w, 0, &dev);
    let l = 17;
    let x = input(1, l, &dev);
    let [q, k, _] = heads(&attn, x.clone());
    let (cq, ck) = (clusters_of(&attn, q), clusters_of(&attn, k));
    // the routing items of each head in sorted order: (cluster, position, key first)
    let rank = |hi: usize| {
        let mut items: Vec<(i64, usize, usize)> = (0..l).map(|i| (ck[hi * l + i], i, 0)).collect();
        items.extend((0..l).map(|i| (cq[hi * l + i], i, 1)));
        items.sort();
        let mut at = std::collections::HashMap::new();
        for (s, &(_, pos, kind)) in items.iter().enumerate() {
            at.insert((pos, kind), s);
        }
        at
    };
    let ranks = [rank(0), rank(1)];
    let sees = |_: usize, hi: usize, i: usize, j: usize| {
        let (s, t) = (ranks[hi][&(i, 1)], ranks[hi][&(j, 0)]);
        cq[hi * l + i] == ck[hi * l + j] && t < s && s - t <= 2 * w
    };
    let diff = max_diff(run(&attn, x.clone(), true), dense(&attn, x.clone(), sees));
    assert!(diff < 1e-5, "{diff}");
    let unlimited = dense(&attn, x.clone(), |_, hi, i, j| j <= i && cq[hi * l + i] == ck[hi * l + j]);
    assert!(max_diff(run(&attn, x, true), unlimited) > 1e-4, "the window limited nothing");
}

#[test]
fn local_heads_are_a_sliding_window_of_w_keys() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let w = 3;
    let attn = layer(4, w, 2, &dev);
    let x = input(2, 12, &dev);
    let diff = max_diff(run(&attn, x.clone(), true), dense(&attn, x.clone(), |_, _, i, j| j <= i && i - j < w));
    assert!(diff < 1e-5, "{diff}");
}

/// Mean cosine of each vector with its nearest centroid: what spherical k-means increases.
fn fit(attn: &RoutingAttention, x: Tensor<4>) -> f32 {
    let [_, h, _, d] = x.dims();
    let unit = x.clone() / x.powf_scalar(2.0).sum_dim(3).sqrt();
    let mu = attn.centroids.val().reshape([1, h, attn.clusters, d]).swap_dims(2, 3);
    unit.matmul(mu).max_dim(3).mean().into_scalar::<f32>()
}

#[test]
fn centroids_move_toward_the_data_under_the_moving_average() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    let mut attn = layer(3, 4, 0, &dev);
    let x = input(4, 32, &dev);
    let [q, k, _] = heads(&attn.valid(), x.clone().without_autodiff());
    let before = (fit(&attn.valid(), q.clone()), fit(&attn.valid(), k.clone()));
    let mu0 = attn.centroids.val();
    for step in 1..=5 {
        let _ = run(&attn, x.clone(), true);
        // what the trainer calls after every optimizer step
        variorum_attention::AttentionMechanism::after_optimizer_step(&mut attn, step);
    }
    let after = (fit(&attn.valid(), q.clone()), fit(&attn.valid(), k.clone()));
    assert!(after.0 > before.0 + 0.05 && after.1 > before.1 + 0.05, "fit {before:?} -> {after:?}");
    // unit rows, no gradient, and nothing moves without a training forward in between
    let norms = attn.centroids.val().powf_scalar(2.0).sum_dim(1).sqrt();
    assert!((norms - 1.0).abs().max().into_scalar::<f32>() < 1e-4);
    assert!(!attn.centroids.val().is_require_grad());
    let mu = attn.centroids.val();
    let _ = run(&attn.valid(), x.without_autodiff(), true);
    attn.update_centroids();
    assert_eq!((attn.centroids.val() - mu).abs().max().into_scalar::<f32>(), 0.0);
    assert!((attn.centroids.val() - mu0).abs().max().into_scalar::<f32>() > 1e-2);
}

#[test]
fn decoding_token_by_token_equals_the_full_forward() {
    let _guard = common::seeded();
    let dev = Device::flex();
    for (clusters, window, local) in [(3, 2, 0), (2, 4, 1), (1, 3, 0)] {
        let attn = layer(clusters, window, local, &dev);
        let x = input(2, 45, &dev);
        let gap = common::decoding_gap(|i, c| attn.forward(i, c), &x, 7);
        // the same keys summed in another order (gathered vs chunked)
        assert!(gap < 1e-4, "{clusters} clusters, window {window}, {local} local heads: {gap}");
    }
}

/// On flex (no dropout) routing runs on the block-sparse kernel ([`variorum_attention::sorted_kernel`]):
/// the kernel path equals the composed one with the kernels off — output, input gradient and the
/// projection's gradient — causal and bidirectional, windows that cut clusters, one, two or many
/// chunks (the first's "before" wraps to the last), local heads, rows that see no key, two batch
/// rows.
#[test]
fn the_kernel_path_equals_the_composed_path_with_gradients() {
    let _guard = common::seeded();
    let dev = Device::flex().autodiff();
    // 2w-item chunks over the 2l items: 12, 14, 5, 4, 2, 1
    let cases = [(3, 2, 0, 23), (2, 3, 1, 40), (4, 1, 0, 9), (8, 40, 0, 130), (3, 12, 0, 23), (3, 30, 0, 23)];
    let mut unseen = false;
    for (clusters, window, local, len) in cases {
        let attn = layer(clusters, window, local, &dev);
        let x = input(2, len, &dev);
        let [q, k, _] = heads(&attn, x.clone());
        let (cq, ck) = (clusters_of(&attn, q), clusters_of(&attn, k));
        // a query whose cluster has no key at or before it sees nothing, causally
        unseen |= (0..cq.len()).any(|t| (t - t % len..=t).all(|j| ck[j] != cq[t]));
        dev.seed(12);
        let w: Tensor<3> = Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), &dev);
        for causal in [true, false] {
            let what = format!("{clusters} clusters, window {window}, {local} local heads, len {len}, causal {causal}");
            let run = |x: Tensor<3>| run(&attn, x, causal);
            common::assert_kernel_matches_composed(&what, &x, &w, run, |g| attn.qkv.weight.grad(g).unwrap());
        }
    }
    assert!(unseen, "no case had a query that sees no key");
}

/// A prefill after a cache — a prompt, then a chunk of several tokens — runs on the kernel from the
/// cached heads and equals the composed path.
#[test]
fn a_chunk_after_a_cached_prompt_takes_the_kernel() {
    let _guard = common::seeded();
    let dev = Device::flex();
    let attn = layer(3, 2, 1, &dev);
    let x = input(2, 19, &dev);
    let chunks = |kernels: bool| {
        common::with_kernels(kernels, || {
            let mut cache = variorum_attention::KvCache::default();
            let mut calls = 0;
            let parts: Vec<Tensor<3>> = [(0, 7), (7, 12)]
                .into_iter()
                .map(|(s, n)| {
                    let mask = AttentionMask::causal().at(s, 0);
                    let before = variorum_kernels::block_sparse::calls();
                    let input = AttentionInput::self_attention(x.clone().narrow(1, s, n), &mask);
                    let y = attn.forward(input, Some(&mut cache)).context;
                    calls += variorum_kernels::block_sparse::calls() - before;
                    y
                })
                .collect();
            (Tensor::cat(parts, 1), calls)
        })
    };
    let ((y1, calls1), (y2, calls2)) = (chunks(true), chunks(false));
    assert_eq!((calls1, calls2), (2, 0), "the kernel runs for each chunk, and only with the kernels on");
    assert!(max_diff(y1, y2) < 1e-5);
}
