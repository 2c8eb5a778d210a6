//! Clustered attention against its definition: every query gets softmax(q_c Kᵀ/√d)V of its
//! cluster's centroid (the mean of its members); C = L is full attention; members of a cluster of
//! identical queries get identical outputs; Lloyd iterations never increase the within-cluster sum
//! of squares; the improved (top-k) form against its equation, and full attention at k = L_K.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::{AttentionConfig, AttentionInput, AttentionKind, ClusteredAttention, ClusteredConfig};
use variorum_core::AttentionMask;

const D: usize = 16;

fn config(clusters: usize, iterations: usize, top_k: Option<usize>) -> ClusteredConfig {
    ClusteredConfig { n_heads: 2, clusters, iterations, top_k, ..Default::default() }
}

fn build(clusters: usize, iterations: usize, top_k: Option<usize>, dev: &Device) -> ClusteredAttention {
    let cfg = config(clusters, iterations, top_k);
    cfg.validate(D).unwrap();
    cfg.init(D, 0.5, 0.5, dev)
}

fn x(len: usize, dev: &Device) -> Tensor<3> {
    Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), dev)
}

fn to_vec<const N: usize>(t: Tensor<N>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn max_diff<const N: usize>(a: Tensor<N>, b: Tensor<N>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn full_attention(attn: &ClusteredAttention, query: Tensor<3>, source: Option<Tensor<3>>) -> Tensor<3> {
    let (q, k, v) = attn.proj.split(query, source);
    let probs = softmax(q.matmul(k.swap_dims(2, 3)).div_scalar((D as f64 / 2.0).sqrt()), 3);
    attn.proj.merge(probs.matmul(v))
}

#[test]
fn one_cluster_per_query_is_full_attention() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(21);
    for l in [5, 12] {
        // C = L (and C > L, capped): every query starts as its own centroid and stays one
        for clusters in [l, l + 3] {
            let attn = build(clusters, 3, None, &dev);
            let input = x(l, &dev);
            let mask = AttentionMask::bidirectional();
            let got = attn.forward(AttentionInput::self_attention(input.clone(), &mask), None).context;
            let d = max_diff(got, full_attention(&attn, input, None));
            assert!(d < 1e-5, "L {l}, C {clusters}: {d}");
        }
    }
}

#[test]
fn identical_queries_share_their_centroid_s_output() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(22);
    let attn = build(3, 4, None, &dev);
    // three distinct tokens, each repeated 4 times, attending over a random source
    let tokens = x(3, &dev);
    let query = Tensor::cat((0..12).map(|i| tokens.clone().narrow(1, i / 4, 1)).collect(), 1);
    let source = x(9, &dev);
    let mask = AttentionMask::bidirectional();
    let got = attn.forward(AttentionInput::cross_attention(query, source.clone(), &mask), None).context;
    // the naive softmax(c Kᵀ/√d)V of each distinct token (the centroid of its cluster)
    let want = full_attention(&attn, tokens, Some(source));
    for i in 0..12 {
        let d = max_diff(got.clone().narrow(1, i, 1), want.clone().narrow(1, i / 4, 1));
        assert!(d < 1e-5, "query {i}: {d}");
        let first = got.clone().narrow(1, i / 4 * 4, 1);
        assert!(max_diff(got.clone().narrow(1, i, 1), first) == 0.0, "members differ at {i}");
    }
}

/// Random queries, a few clusters: each output is softmax(μ Kᵀ/√d)V with μ the mean of the
/// queries the layer assigned to the same cluster (computed here from the assignment).
#[test]
fn outputs_are_the_centroid_attention_of_each_query_s_cluster() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(23);
    let attn = build(4, 5, None, &dev);
    let (q, k, v) = attn.proj.split(x(20, &dev), None);
    let [b, h, l, dh] = q.dims();
    let got = to_vec(attn.attend(q.clone(), k.clone(), v.clone(), None, None));
    let assignment: Vec<i64> =
        attn.cluster(q.clone(), None, 5).assignment.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    let (qh, kh, vh) = (to_vec(q), to_vec(k), to_vec(v));
    let row = |t: &[f32], r: usize, i: usize| t[(r * l + i) * dh..(r * l + i + 1) * dh].to_vec();
    let mut sizes = Vec::new();
    for r in 0..b * h {
        for i in 0..l {
            let c = assignment[r * l + i];
            let members: Vec<usize> = (0..l).filter(|&j| assignment[r * l + j] == c).collect();
            sizes.push(members.len());
            let mu: Vec<f32> = (0..dh)
                .map(|e| members.iter().map(|&j| row(&qh, r, j)[e]).sum::<f32>() / members.len() as f32)
                .collect();
            let s: Vec<f32> = (0..l)
                .map(|j| row(&kh, r, j).iter().zip(&mu).map(|(a, m)| a * m).sum::<f32>() / (dh as f32).sqrt())
                .collect();
            let m = s.iter().cloned().fold(f32::MIN, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            for d in 0..dh {
                let want: f32 = (0..l).map(|j| e[j] / z * row(&vh, r, j)[d]).sum();
                let diff = (want - got[(r * l + i) * dh + d]).abs();
                assert!(diff < 1e-5, "row {r} query {i}: {diff}");
            }
        }
    }
    assert!(sizes.iter().any(|&s| s > 1), "some cluster holds several queries");
}

#[test]
fn lloyd_iterations_never_increase_the_within_cluster_sum_of_squares() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(24);
    let attn = build(5, 1, None, &dev);
    let q: Tensor<4> = Tensor::random([2, 3, 40, 4], Distribution::Normal(0.0, 1.0), &dev);
    let qh = to_vec(q.clone());
    let mut previous = vec![f32::INFINITY; 6];
    let mut decreased = false;
    for iterations in 1..=8 {
        let clusters = attn.cluster(q.clone(), None, iterations);
        let assignment: Vec<i64> = clusters.assignment.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        let centroids = to_vec(clusters.centroids);
        for r in 0..6 {
            let mut wcss = 0.0;
            for i in 0..40 {
                let c = assignment[r * 40 + i] as usize;
                // the centroid is the mean of its members
                let members: Vec<usize> = (0..40).filter(|&j| assignment[r * 40 + j] as usize == c).collect();
                for e in 0..4 {
                    let mean = members.iter().map(|&j| qh[(r * 40 + j) * 4 + e]).sum::<f32>() / members.len() as f32;
                    assert!((mean - centroids[(r * 5 + c) * 4 + e]).abs() < 1e-5);
                    wcss += (qh[(r * 40 + i) * 4 + e] - centroids[(r * 5 + c) * 4 + e]).powi(2);
                }
            }
            assert!(wcss <= previous[r] + 1e-4, "row {r}, {iterations} iterations: {wcss} > {}", previous[r]);
            decreased |= wcss < previous[r] - 1e-3 && iterations > 1;
            previous[r] = wcss;
        }
    }
    assert!(decreased, "the iterations improved some clustering");
}

#[test]
fn top_k_rescoring_matches_its_equation_and_is_full_attention_at_every_key() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(25);
    let input = x(14, &dev);
    let mask = AttentionMask::bidirectional();
    // k = L_K: every key rescored exactly, whatever the clusters
    let attn = build(3, 4, Some(14), &dev);
    let got = attn.forward(AttentionInput::self_attention(input.clone(), &mask), None).context;
    let d = max_diff(got, full_attention(&attn, input.clone(), None));
    assert!(d < 1e-5, "{d}");
    // k = 4: o_i = m̂ softmax_T(q_i K_T) V_T + Σ_{l ∉ T} A^c_l v_l, written densely per cluster
    let top = 4;
    let attn = build(3, 4, Some(top), &dev);
    let (q, k, v) = attn.proj.split(input, None);
    let [b, h, l, dh] = q.dims();
    let got = to_vec(attn.attend(q.clone(), k.clone(), v.clone(), None, None));
    let clusters = attn.cluster(q.clone(), None, 4);
    let assignment: Vec<i64> = clusters.assignment.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    let (qh, kh, vh) = (to_vec(q), to_vec(k), to_vec(v));
    let row = |t: &[f32], r: usize, i: usize| t[(r * l + i) * dh..(r * l + i + 1) * dh].to_vec();
    let dot = |a: &[f32], c: &[f32]| a.iter().zip(c).map(|(x, y)| x * y).sum::<f32>() / (dh as f32).sqrt();
    let soft = |s: Vec<f32>| {
        let m = s.iter().cloned().fold(f32::MIN, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect::<Vec<f32>>()
    };
    for r in 0..b * h {
        for i in 0..l {
            let c = assignment[r * l + i];
            let members: Vec<usize> = (0..l).filter(|&j| assignment[r * l + j] == c).collect();
            let mu: Vec<f32> = (0..dh)
                .map(|e| members.iter().map(|&j| row(&qh, r, j)[e]).sum::<f32>() / members.len() as f32)
                .collect();
            let a = soft((0..l).map(|j| dot(&mu, &row(&kh, r, j))).collect());
            let mut order: Vec<usize> = (0..l).collect();
            order.sort_by(|&x, &y| a[y].partial_cmp(&a[x]).unwrap());
            let chosen = &order[..top];
            let mass: f32 = chosen.iter().map(|&j| a[j]).sum();
            let exact = soft(chosen.iter().map(|&j| dot(&row(&qh, r, i), &row(&kh, r, j))).collect());
            for d in 0..dh {
                let mut want: f32 = chosen.iter().zip(&exact).map(|(&j, p)| mass * p * row(&vh, r, j)[d]).sum();
                want += (0..l).filter(|j| !chosen.contains(j)).map(|j| a[j] * row(&vh, r, j)[d]).sum::<f32>();
                let diff = (want - got[(r * l + i) * dh + d]).abs();
                assert!(diff < 1e-5, "row {r} query {i}: {diff}");
            }
        }
    }
}

#[test]
fn padding_keys_get_no_weight() {
    let _guard = common::seeded();
    let dev = Device::flex();
    dev.seed(26);
    for top_k in [None, Some(8)] {
        let attn = build(3, 3, top_k, &dev);
        let query = x(6, &dev);
        let source = x(10, &dev);
        let pad: Vec<bool> = (0..20).map(|i| i % 10 >= 7).collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, 10]), &dev);
        let masked = AttentionMask::bidirectional().with_padding(pad);
        let got = attn.forward(AttentionInput::cross_attention(query.clone(), source.clone(), &masked), None).context;
        let mask = AttentionMask::bidirectional();
        let short = source.narrow(1, 0, 7);
        let want = attn.forward(AttentionInput::cross_attention(query, short, &mask), None).context;
        let d = max_diff(got, want);
        assert!(d < 1e-5, "top_k {top_k:?}: {d}");
    }
}

#[test]
fn refusals_and_capabilities() {
    let ok = config(4, 2, None);
    ok.validate(D).unwrap();
    for (bad, field) in [
        (ClusteredConfig { clusters: 0, ..ok.clone() }, "model.attention.clusters"),
        (ClusteredConfig { iterations: 0, ..ok.clone() }, "model.attention.iterations"),
        (ClusteredConfig { top_k: Some(0), ..ok.clone() }, "model.attention.top_k"),
        (ClusteredConfig { dropout: 1.0, ..ok.clone() }, "model.attention.dropout"),
        (ClusteredConfig { n_heads: 3, ..ok.clone() }, "n_heads"),
    ] {
        let e = bad.validate(D).unwrap_err().to_string();
        assert!(e.contains(field), "{bad:?}: {e}");
    }
    let parsed: AttentionConfig =
        toml::from_str("kind = \"clustered\"\nclusters = 8\niterations = 3\ntop_k = 5").unwrap();
    assert_eq!(
        parsed,
        AttentionConfig::Clustered(ClusteredConfig {
            clusters: 8,
            iterations: 3,
            top_k: Some(5),
            ..Default::default()
        })
    );
    let caps = parsed.capabilities();
    assert!(!caps.causal && caps.bidirectional && !caps.incremental);
}
