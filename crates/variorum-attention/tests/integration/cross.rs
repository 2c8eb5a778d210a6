//! Cross-attention, kind by kind: every test variant of every kind that declares `cross` (the
//! capability an encoder–decoder's cross-attention will need) attends from queries over a source
//! of another length — in both directions of length — and the property that defines it holds:
//! each query's output is a function of that query and the whole source alone. Changing one query
//! changes its row only; changing any one source row changes the output; padding the source
//! changes nothing. Kinds that declare no
//! `cross` are left out (their patterns are tied to the query's position, they mix queries, or
//! they read only their own sequence).

use crate::common;

use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_attention::{AttentionConfig, AttentionInput, Positioning};
use variorum_core::AttentionMask;

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn cross_attention_kinds_attend_each_query_over_the_whole_source() {
    let _guard = common::seeded();
    let device = Device::default();
    device.seed(5);
    let d = common::D;
    let mask = AttentionMask::bidirectional();
    let (mut checked, mut failures) = (Vec::new(), Vec::new());
    for variant in AttentionConfig::test_variants() {
        let cfg = variant.config;
        if !cfg.capabilities().cross {
            continue;
        }
        let name = format!("{} ({})", cfg.kind(), variant.name);
        // no position scheme: position between a query and a source row is not this test's
        let attention = cfg.init(d, 0.3, 0.3, Positioning::NONE, &device);
        for (lq, lk) in [(3, 7), (9, 4)] {
            let query = Tensor::<3>::random([2, lq, d], Distribution::Normal(0.0, 1.0), &device);
            let source = Tensor::<3>::random([2, lk, d], Distribution::Normal(0.0, 1.0), &device);
            let run = |q: Tensor<3>, s: Tensor<3>| {
                attention.forward(AttentionInput::cross_attention(q, s, &mask), None).context
            };
            let base = run(query.clone(), source.clone());
            if base.dims() != [2, lq, d] {
                failures.push(format!("{name}, {lq} over {lk}: output {:?}", base.dims()));
                continue;
            }
            // one query changed: its row moves, no other does
            let q1 = query
                .clone()
                .slice_assign([0..2, 1..2, 0..d], Tensor::random([2, 1, d], Distribution::Normal(0.0, 1.0), &device));
            let moved = run(q1, source.clone());
            let others = max_diff(moved.clone().narrow(1, 0, 1), base.clone().narrow(1, 0, 1))
                .max(max_diff(moved.clone().narrow(1, 2, lq - 2), base.clone().narrow(1, 2, lq - 2)));
            let own = max_diff(moved.narrow(1, 1, 1), base.clone().narrow(1, 1, 1));
            if others > 1e-5 || own < 1e-6 {
                failures.push(format!("{name}, {lq} over {lk}: other queries moved {others}, the changed one {own}"));
            }
            // each source row is read
            for at in 0..lk {
                let s1 = source.clone().slice_assign(
                    [0..2, at..at + 1, 0..d],
                    Tensor::random([2, 1, d], Distribution::Normal(0.0, 1.0), &device),
                );
                let moved = max_diff(run(query.clone(), s1), base.clone());
                if moved < 1e-6 {
                    failures.push(format!("{name}, {lq} over {lk}: source row {at} is not read"));
                }
            }
            // source padding is hidden: three rows of padding appended change nothing
            let padded = Tensor::cat(
                vec![source.clone(), Tensor::random([2, 3, d], Distribution::Normal(0.0, 1.0), &device)],
                1,
            );
            let pad: Vec<bool> = (0..2).flat_map(|_| (0..lk + 3).map(move |j| j >= lk)).collect();
            let padding = Tensor::<2, Bool>::from_data(TensorData::new(pad, [2, lk + 3]), &device);
            let masked = AttentionMask { padding: Some(padding), ..mask.clone() };
            let out = attention.forward(AttentionInput::cross_attention(query.clone(), padded, &masked), None).context;
            let moved = max_diff(out, base.clone());
            if moved > 1e-5 {
                failures.push(format!("{name}, {lq} over {lk}: source padding moved the output by {moved}"));
            }
        }
        checked.push(name);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // the kinds that must take part (the list grows as kinds learn cross-attention)
    let kinds = [
        "full",
        "talking-heads",
        "capsule-heads",
        "collaborative",
        "linear",
        "performer",
        "rfa",
        "inducing-points",
        "hopfield",
    ];
    for kind in kinds {
        assert!(
            checked.iter().any(|n| n.starts_with(&format!("{kind} "))),
            "{kind} declares no cross-attention: {checked:?}"
        );
    }
}
