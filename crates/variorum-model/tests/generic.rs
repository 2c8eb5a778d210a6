//! Tests every kind on every axis gets for free (one tiny model per declared variant, from
//! `zoo::variants`, and the test kit's cross-axis combinations),
//! through the checks of `variorum_model::harness`: causality, cached decoding = full forward,
//! save → load bit-identical, a tiny batch is overfit.

use burn::prelude::*;
use variorum_model::{ModelConfig, harness};

/// Runs `check` on every zoo variant and fails with every variant it fails on.
fn every_variant(check: impl Fn(&str, &ModelConfig) -> Result<(), String>) {
    let failures: Vec<String> =
        variorum_testkit::variants().iter().filter_map(|(name, cfg)| check(name, cfg).err()).collect();
    assert!(failures.is_empty(), "{} variant(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn causal_outputs_ignore_future_tokens_and_bidirectional_ones_see_them() {
    every_variant(|name, cfg| harness::check_causality(name, cfg, &Device::flex()));
}

/// The same on the composed path (Burn's ops, as every backend without the CPU kernels runs it):
/// each kind's fallback is causal to the last bit too.
#[test]
fn causal_outputs_ignore_future_tokens_on_the_composed_path_too() {
    variorum_kernels::without_kernels(|| {
        every_variant(|name, cfg| harness::check_causality(&format!("{name} (composed)"), cfg, &Device::flex()))
    });
}

#[test]
fn cached_decoding_equals_full_forward() {
    every_variant(|name, cfg| harness::check_cached_decoding(name, cfg, &Device::flex()));
}

#[test]
fn save_then_load_gives_bit_identical_outputs() {
    every_variant(|name, cfg| harness::check_save_load(name, cfg, &Device::flex()));
}

#[test]
fn tiny_model_overfits_a_tiny_batch() {
    every_variant(|name, cfg| harness::check_overfit(name, cfg, &Device::flex().autodiff()));
}

/// The long causality check reaches the kinds whose kernel layout is sorted by content: their
/// blocks permute only past one block of 64 queries and rows of 16 keys.
#[test]
fn kinds_sorted_by_content_get_the_long_causality_check() {
    let variants = variorum_testkit::variants();
    let sorted: Vec<_> = variants.iter().filter(|(_, cfg)| matches!(cfg.attention.kind(), "lsh" | "routing")).collect();
    assert!(sorted.len() >= 3, "LSH's and routing's variants: {}", sorted.len());
    for (name, cfg) in sorted {
        assert!(harness::long_variant(cfg).is_some(), "{name} does not take {} positions", harness::LONG_CAUSALITY_LEN);
    }
}
