//! ETC's global–local attention equals full attention over [global tokens; long tokens] under
//! the four pieces' masks (g2g, g2l, l2g, l2l), causal and bidirectional, for lengths that do and
//! do not end a segment.

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use common::D;
use variorum_attention::{AttentionInput, AttentionKind, EtcConfig, Positioning};
use variorum_core::{AttentionMask, GlobalLocal};
use variorum_position::PositionConfig;

/// `true` where row `i` must not see column `j` of the concatenated sequence.
fn hidden(i: usize, j: usize, globals: usize, window: usize, segment: usize, causal: bool) -> bool {
    let visible = match (i < globals, j < globals) {
        // g2g
        (true, true) => !causal || j <= i,
        // g2l: the own segment
        (true, false) => (j - globals) / segment == i,
        // l2g: completed segments (causal)
        (false, true) => !causal || (j + 1) * segment <= i - globals,
        // l2l: the window
        (false, false) => {
            let d = (i - globals) as i64 - (j - globals) as i64;
            d < window as i64 && (if causal { d >= 0 } else { -d < window as i64 })
        }
    };
    !visible
}

#[test]
fn global_local_pieces_equal_masked_full_attention() {
    let dev = Device::flex();
    for (window, segment, kv) in [(2, 3, 4), (3, 4, 2), (1, 2, 1)] {
        let cfg = EtcConfig { window, segment, block: Some(2), n_kv_heads: Some(kv), ..Default::default() };
        cfg.validate(D).unwrap();
        let etc =
            cfg.init(D, 0.3, 0.3, Positioning { config: &PositionConfig::None(Default::default()), context: 64 }, &dev);
        for len in [7, 9, 12] {
            for causal in [true, false] {
                let globals = if causal { (len - 1) / segment } else { len.div_ceil(segment) };
                let x: Tensor<3> = Tensor::random([2, globals + len, D], Distribution::Normal(0.0, 1.0), &dev);
                let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                let mask = AttentionMask { global_local: Some(GlobalLocal::Prefixed { globals }), ..base };
                let got = etc.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let n = globals + len;
                let m: Vec<bool> =
                    (0..n).flat_map(|i| (0..n).map(move |j| hidden(i, j, globals, window, segment, causal))).collect();
                let custom = Tensor::<2, Bool>::from_data(TensorData::new(m, [n, n]), &dev).unsqueeze::<3>();
                let dense_mask = AttentionMask::bidirectional().with_custom(custom);
                let want = etc.attention.forward(AttentionInput::self_attention(x, &dense_mask), None).context;
                let d = (got - want).abs().max().into_scalar::<f32>();
                assert!(d < 1e-5, "window {window} segment {segment} len {len} causal {causal}: {d}");
            }
        }
    }
}
