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
