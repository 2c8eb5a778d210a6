//! The Memorizing Transformer's memory is per document: read as document streams, a row that
//! starts a new document gives exactly what a fresh model gives on that document alone, while
//! the other rows keep their memories (the layer-level properties — gate at 0, exact search,
//! causality — are tested beside the kind and by the generic harness).

use std::sync::Arc;

use burn::prelude::*;
use variorum_data::{DocumentStreams, SplitTags, TokenBatch};
use variorum_model::{DecoderLm, DecoderState, ModelConfig};

const MODEL: &str = "d_model = 16\nn_layers = 2\nseq_len = 4\nvocab_size = 20\n[position]\nkind = \"none\"\n[attention]\nkind = \"memorizing\"\nn_heads = 2\nmemory_size = 64\ntop_k = 4\n";

fn inputs(batch: &TokenBatch, rows: std::ops::Range<usize>, device: &Device) -> Tensor<2, Int> {
    let l = batch.seq_len;
    let ids = batch.inputs[rows.start * l..rows.end * l].to_vec();
    Tensor::from_data(TensorData::new(ids, [rows.len(), l]), device)
}

/// Row 1's logits over the pass, continuing one state; `forget` applies the rows' resets.
fn stream(model: &DecoderLm, pass: &[TokenBatch], forget: bool, device: &Device) -> Vec<Tensor<3>> {
    let mut state = DecoderState::default();
    let mut out = Vec::new();
    for (i, batch) in pass.iter().enumerate() {
        if i == 0 {
            assert!(batch.reset.iter().all(|&r| r));
        } else if forget {
            model.reset_rows(&mut state, &batch.reset);
        }
        let logits = model.forward_with(inputs(batch, 0..2, device), Some(&mut state)).logits;
        out.push(logits.narrow(0, 1, 1));
    }
    out
}

#[test]
fn a_new_document_reads_as_if_the_row_had_read_nothing_before() {
    let device = Device::flex();
    device.seed(7);
    let cfg: ModelConfig = toml::from_str(MODEL).unwrap();
    cfg.validate().unwrap();
    let model = cfg.init(&device);
    // documents A (12 predictions: 3 segments), B (1 segment) and C (2): A goes to row 0, B then
    // C to row 1, whose memory must forget B where C starts (batch 1)
    let tokens: Vec<u32> = (0..27).map(|i| (i * 7 % 19) as u32).collect();
    let tags = SplitTags::new(vec![0, 13, 18], vec![1, 2, 3]).unwrap();
    let pass = DocumentStreams::new(Arc::new(tokens), Arc::new(tags), 4, 2).unwrap().one_pass();
    assert_eq!(pass.len(), 3);
    assert_eq!(pass[1].reset, vec![false, true], "C starts in row 1 at batch 1");

    let mut alone = DecoderState::default();
    let fresh: Vec<Tensor<3>> =
        pass[1..].iter().map(|b| model.forward_with(inputs(b, 1..2, &device), Some(&mut alone)).logits).collect();
    let diff = |a: &Tensor<3>, b: &Tensor<3>| (a.clone() - b.clone()).abs().max().into_scalar::<f32>();

    let forgetting = stream(&model, &pass, true, &device);
    for (i, f) in fresh.iter().enumerate() {
        let d = diff(&forgetting[i + 1], f);
        assert!(d < 1e-5, "segment {i} of C differs by {d} from C read alone");
    }
    // the control: a row that does not forget reads C through B's memory
    let remembering = stream(&model, &pass, false, &device);
    let d = diff(&remembering[2], &fresh[1]);
    assert!(d > 1e-3, "B's memory should change C's second segment ({d})");
}
