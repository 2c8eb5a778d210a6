//! Memory-compressed attention: with stride 1 and an identity convolution it is full attention;
//! decoding (from a fresh or an open block, one or several tokens at a time) equals the parallel
//! causal forward; no query sees a block it has not finished.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_attention::CompressedState;
use variorum_attention::{AttentionInput, AttentionKind, MemoryCompressedAttention, MemoryCompressedConfig};
use variorum_core::AttentionMask;

const D: usize = 16;

fn build(stride: usize, local: bool, dev: &Device) -> MemoryCompressedAttention {
    let cfg = MemoryCompressedConfig { stride, local, ..Default::default() };
    cfg.validate(D).unwrap();
    cfg.init(D, 0.3, 0.3, dev)
}

fn x(len: usize, dev: &Device) -> Tensor<3> {
    Tensor::random([2, len, D], Distribution::Normal(0.0, 1.0), dev)
}

#[test]
fn stride_one_with_identity_compression_is_full_attention() {
    let dev = Device::flex();
    let mut attn = build(1, false, &dev);
    // Conv1d weight [out, in, 1] = identity, bias 0
    let eye = Tensor::<2>::eye(D, &dev).reshape([D, D, 1]);
    for conv in [&mut attn.compress_k, &mut attn.compress_v] {
        conv.weight = Param::from_tensor(eye.clone());
        conv.bias = conv.bias.take().map(|b| Param::from_tensor(b.val().zeros_like()));
    }
    let input = x(7, &dev);
    let mask = AttentionMask::bidirectional();
    let got = attn.forward(AttentionInput::self_attention(input.clone(), &mask), None).context;
    let (q, k, v) = attn.proj.split(input, None);
    let probs = softmax(q.matmul(k.swap_dims(2, 3)).div_scalar((D as f64 / 4.0).sqrt()), 3);
    let want = attn.proj.merge(probs.matmul(v));
    let d = (got - want).abs().max().into_scalar::<f32>();
    assert!(d < 1e-5, "{d}");
}

#[test]
fn decoding_equals_the_parallel_forward() {
    let dev = Device::flex();
    for (stride, local) in [(3, true), (2, false), (4, true)] {
        let attn = build(stride, local, &dev);
        let input = x(11, &dev);
        let causal = AttentionMask::causal();
        let full = attn.forward(AttentionInput::self_attention(input.clone(), &causal), None).context;
        // a fresh prompt of 4, then one token, a chunk of 3, then the rest one by one
        let mut state = CompressedState::default();
        let mut parts = Vec::new();
        for (s, n) in [(0, 4), (4, 1), (5, 3), (8, 1), (9, 1), (10, 1)] {
            let m = AttentionMask::causal().at(s, 0);
            let out = attn.forward(AttentionInput::self_attention(input.clone().narrow(1, s, n), &m), Some(&mut state));
            parts.push(out.context);
        }
        let d = (full - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>();
        assert!(d < 1e-4, "stride {stride}: {d}");
    }
}

#[test]
fn a_block_is_seen_only_once_finished() {
    // stride 3: position 4 (block 3..5) reaches query 4 (its own block, raw) and, compressed,
    // queries from 5 on; query 3 precedes it and must not change
    let dev = Device::flex();
    let attn = build(3, true, &dev);
    let a = x(9, &dev);
    let b = a.clone().slice_assign([0..2, 4..5, 0..D], Tensor::random([2, 1, D], Distribution::Normal(0.0, 1.0), &dev));
    let mask = AttentionMask::causal();
    let run = |x: Tensor<3>| attn.forward(AttentionInput::self_attention(x, &mask), None).context;
    let diff = (run(a) - run(b)).abs().max_dim(2).max_dim(0).reshape([9]).into_data().try_to_vec::<f32>().unwrap();
    let changed: Vec<usize> = (0..9).filter(|&i| diff[i] > 1e-6).collect();
    assert_eq!(changed, vec![4, 5, 6, 7, 8]);
}

/// The paper's interleaved arrangement (`local_layers = B`): the first layer attends within its
/// causal block of B positions only, the second to the compressed keys alone (stride 1 with an
/// identity compression: every strictly earlier position, nothing for the first query); both
/// decode as they run in parallel.
#[test]
fn interleaved_layers_are_local_blocks_then_compressed_keys_alone() {
    let dev = Device::flex();
    let cfg = MemoryCompressedConfig { stride: 1, local_layers: Some(4), ..Default::default() };
    cfg.validate(D).unwrap();
    let input = x(11, &dev);
    let causal = AttentionMask::causal();
    for layer in [0, 1] {
        let mut attn = cfg.for_layer(layer).init(D, 0.3, 0.3, &dev);
        let eye = Tensor::<2>::eye(D, &dev).reshape([D, D, 1]);
        for conv in [&mut attn.compress_k, &mut attn.compress_v] {
            conv.weight = Param::from_tensor(eye.clone());
            conv.bias = conv.bias.take().map(|b| Param::from_tensor(b.val().zeros_like()));
        }
        let got = attn.forward(AttentionInput::self_attention(input.clone(), &causal), None).context;
        let (q, k, v) = attn.proj.split(input.clone(), None);
        let sees = |i: usize, j: usize| if layer == 0 { j <= i && j / 4 == i / 4 } else { j < i };
        let hidden: Vec<bool> = (0..11).flat_map(|i| (0..11).map(move |j| !sees(i, j))).collect();
        let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [11, 11]), &dev).reshape([1, 1, 11, 11]);
        let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((D as f64 / 4.0).sqrt()).mask_fill(hidden, -1e9);
        let mut want = softmax(scores, 3).matmul(v);
        if layer == 1 {
            // the first query has no earlier key
            let [b, h, _, dh] = want.dims();
            want = want.slice_assign([0..b, 0..h, 0..1, 0..dh], Tensor::zeros([b, h, 1, dh], &dev));
        }
        let want = attn.proj.merge(want);
        let d = (got.clone() - want).abs().max().into_scalar::<f32>();
        assert!(d < 1e-5, "layer {layer}: {d}");
        let mut state = CompressedState::default();
        let mut parts = Vec::new();
        for (s, n) in [(0, 5), (5, 1), (6, 3), (9, 1), (10, 1)] {
            let m = AttentionMask::causal().at(s, 0);
            let out = attn.forward(AttentionInput::self_attention(input.clone().narrow(1, s, n), &m), Some(&mut state));
            parts.push(out.context);
        }
        let d = (Tensor::cat(parts, 1) - got).abs().max().into_scalar::<f32>();
        assert!(d < 1e-5, "layer {layer}: decoding differs by {d}");
    }
}
