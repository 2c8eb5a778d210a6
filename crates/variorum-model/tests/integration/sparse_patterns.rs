//! Model-level rules of the sparse patterns that gather keys: each layer draws its own random
//! blocks, and position schemes that need contiguous keys are refused by name.

use burn::prelude::*;
use variorum_attention::{
    Attention, AttentionConfig, BigBirdConfig, BlockwiseConfig, FixedConfig, Local2dConfig, LongformerConfig,
};
use variorum_model::{ModelConfig, zoo};
use variorum_position::{PositionConfig, RotaryConfig, ShawConfig, T5BiasConfig, XlRelativeConfig};

fn gathering() -> Vec<AttentionConfig> {
    vec![
        AttentionConfig::Bigbird(BigBirdConfig { block: 2, global_tokens: 1, ..Default::default() }),
        AttentionConfig::Fixed(FixedConfig { stride: 4, summary: 1, ..Default::default() }),
        AttentionConfig::Blockwise(BlockwiseConfig { block: 4, ..Default::default() }),
        AttentionConfig::Local2d(Local2dConfig { width: 4, query_rows: 2, query_cols: 2, ..Default::default() }),
    ]
}

#[test]
fn each_layer_draws_its_own_random_blocks() {
    let dev = Device::flex();
    {
        let attention = gathering().remove(0);
        let m = ModelConfig { attention, ..zoo::tiny() }.init(&dev);
        let layers: Vec<usize> = m
            .blocks
            .iter()
            .map(|b| match &b.attn {
                Attention::Bigbird(a) => a.layer,
                _ => unreachable!("a bigbird model"),
            })
            .collect();
        assert_eq!(layers, vec![0, 1]);
    }
}

#[test]
fn schemes_that_need_contiguous_keys_are_refused() {
    for attention in gathering() {
        for position in
            [PositionConfig::TransformerXl(XlRelativeConfig::default()), PositionConfig::Shaw(ShawConfig::default())]
        {
            let kind = position.kind();
            let e = ModelConfig { attention: attention.clone(), position, ..zoo::tiny() }.validate().unwrap_err();
            let e = e.to_string();
            assert!(e.contains(&format!("model.position.kind = \"{kind}\" needs contiguous keys")), "{e}");
        }
        for position in [
            PositionConfig::Alibi(Default::default()),
            PositionConfig::T5(T5BiasConfig::default()),
            PositionConfig::Rope(RotaryConfig::default()),
            PositionConfig::default(),
        ] {
            ModelConfig { attention: attention.clone(), position, ..zoo::tiny() }.validate().unwrap();
        }
    }
}

/// Which positions' logits change when the token at position 0 changes, in a 2-layer model whose
/// attention sees only the query itself plus global tokens.
fn reached_from_the_first_token(global_token_ids: Vec<u32>) -> Vec<usize> {
    let dev = Device::flex();
    let attention = AttentionConfig::Longformer(LongformerConfig {
        window: 1,
        block: Some(2),
        global_token_ids,
        ..Default::default()
    });
    let cfg = ModelConfig { attention, ..zoo::tiny() };
    cfg.validate().unwrap();
    let m = cfg.init(&dev);
    let tokens =
        |first: i64| Tensor::<2, Int>::from_data(TensorData::new(vec![first, 1, 5, 2, 7, 1, 2, 8], [1, 8]), &dev);
    let diff = (m.forward(tokens(0)).logits - m.forward(tokens(9)).logits).abs().max_dim(2).reshape([8]);
    let diff = diff.into_data().try_to_vec::<f32>().unwrap();
    (0..8).filter(|&i| diff[i] > 1e-6).collect()
}

#[test]
fn a_global_token_id_makes_its_positions_global() {
    // token 5 at position 2: as a global query it sees position 0; as a global key every later
    // query sees it, so in the second layer the change reaches every position from 2 on
    assert_eq!(reached_from_the_first_token(vec![5]), vec![0, 2, 3, 4, 5, 6, 7]);
    assert_eq!(reached_from_the_first_token(vec![]), vec![0]);
}

#[test]
fn max_back_is_refused_where_no_key_is_scored() {
    use variorum_attention::LinearAttentionConfig;
    let attention = AttentionConfig::Linear(LinearAttentionConfig::default());
    let e = ModelConfig { attention, max_back: Some(8), ..zoo::tiny() }.validate().unwrap_err().to_string();
    assert!(e.contains("model.max_back") && e.contains("\"linear\""), "{e}");
}

#[test]
fn etc_global_tokens_carry_a_finished_segment_to_later_ones() {
    use variorum_attention::EtcConfig;
    // window 1 (a token sees only itself) and segments of 4: a change of token 0 reaches
    // position 0 and — through segment 0's global token, once the segment is complete — every
    // position from 4 on, but not 1–3
    let dev = Device::flex();
    let attention = AttentionConfig::Etc(EtcConfig { window: 1, segment: 4, block: Some(2), ..Default::default() });
    let cfg = ModelConfig { attention, ..zoo::tiny() };
    cfg.validate().unwrap();
    let m = cfg.init(&dev);
    let tokens = |first: i64| {
        Tensor::<2, Int>::from_data(TensorData::new(vec![first, 1, 5, 2, 7, 1, 2, 8, 3, 4], [1, 10]), &dev)
    };
    let diff = (m.forward(tokens(0)).logits - m.forward(tokens(9)).logits).abs().max_dim(2).reshape([10]);
    let diff = diff.into_data().try_to_vec::<f32>().unwrap();
    let reached: Vec<usize> = (0..10).filter(|&i| diff[i] > 1e-6).collect();
    assert_eq!(reached, vec![0, 4, 5, 6, 7, 8, 9]);
    // refused where the global input has no place
    let attention = AttentionConfig::Etc(EtcConfig::default());
    let e = ModelConfig { attention, max_back: Some(4), ..zoo::tiny() }.validate().unwrap_err().to_string();
    assert!(e.contains("\"etc\" adds a global input"), "{e}");
}
