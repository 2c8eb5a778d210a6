//! Encoder–decoder models, across the kinds they compose: every cross-attention kind, every
//! bidirectional attention kind as the encoder's (and the decoder's where it decodes), every
//! position scheme and block kind an encoder–decoder takes — each checked for its defining
//! properties (`harness::check_encoder_decoder`): a causal decoder, every source token read,
//! source padding hidden, cached decoding equal to the full forward. The base model also learns
//! to reverse its sources.

use burn::prelude::*;
use variorum_model::harness::{check_encoder_decoder, check_encoder_decoder_overfit};
use variorum_model::zoo::{encoder_decoder_variants, tiny_encoder_decoder};

#[test]
fn every_encoder_decoder_variant_keeps_its_properties() {
    let device = Device::flex();
    let variants = encoder_decoder_variants();
    let failures: Vec<String> =
        variants.iter().filter_map(|(name, cfg)| check_encoder_decoder(name, cfg, &device).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // the kinds that must take part
    for part in [
        "cross attention full",
        "cross attention linear",
        "cross attention performer",
        "self attention full",
        "self attention linear",
        "position rope",
        "position t5",
        "block post-ln",
    ] {
        assert!(
            variants.iter().any(|(n, _)| n.starts_with(&format!("encoder-decoder {part}"))),
            "no variant {part}: {:?}",
            variants.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn an_encoder_decoder_memorises_reversed_sources() {
    let device = Device::flex().autodiff();
    check_encoder_decoder_overfit("encoder-decoder base", &tiny_encoder_decoder(), &device).unwrap();
}
