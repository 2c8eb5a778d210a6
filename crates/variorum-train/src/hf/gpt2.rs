//! GPT-2 (`model_type = "gpt2"`, `GPT2LMHeadModel`; Radford et al. 2019): learned positions,
//! pre-LN blocks with LayerNorm, full attention with biases, a GELU FFN (the tanh form,
//! `gelu_new`, unless `activation_function` says otherwise), tied embeddings (untied when
//! `tie_word_embeddings` is false).
//!
//! Its `Conv1D` layers store weights as `[in, out]`, Burn's own layout: copied as they are.
//! `c_attn` is q | k | v along its output, head-major within each, as variorum's fused
//! projection.

use anyhow::Result;
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

/// A GPT-2 block's tensors: variorum's name, then GPT-2's, both relative to the block.
pub(crate) const BLOCK_TENSORS: [(&str, &str); 12] = [
    ("attn_norm.gamma", "ln_1.weight"),
    ("attn_norm.beta", "ln_1.bias"),
    ("attn.qkv.qkv.weight", "attn.c_attn.weight"),
    ("attn.qkv.qkv.bias", "attn.c_attn.bias"),
    ("attn.out.weight", "attn.c_proj.weight"),
    ("attn.out.bias", "attn.c_proj.bias"),
    ("ffn_norm.gamma", "ln_2.weight"),
    ("ffn_norm.beta", "ln_2.bias"),
    ("ffn.up.weight", "mlp.c_fc.weight"),
    ("ffn.up.bias", "mlp.c_fc.bias"),
    ("ffn.down.weight", "mlp.c_proj.weight"),
    ("ffn.down.bias", "mlp.c_proj.bias"),
];

pub(crate) fn map(cfg: &mut HfConfig, ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    let positions = cfg.usize("n_positions")?;
    let d = cfg.usize("n_embd")?;
    let layers = cfg.usize("n_layer")?;
    let heads = cfg.usize("n_head")?;
    let d_ff = cfg.opt_usize("n_inner")?.unwrap_or(4 * d);
    let eps = cfg.f64_or("layer_norm_epsilon", 1e-5)?;
    let resid = cfg.f64_or("resid_pdrop", 0.1)?;
    let attn_dropout = cfg.f64_or("attn_pdrop", 0.1)?;
    cfg.f64_or("embd_pdrop", 0.1)?; // variorum drops the embeddings with model.dropout
    let ffn = cfg.activation("activation_function", "gelu_new")?;
    cfg.require("scale_attn_weights", Value::Bool(true), "variorum scales scores by 1/√head_dim")?;
    cfg.require("scale_attn_by_inverse_layer_idx", Value::Bool(false), "no per-layer score scaling")?;
    cfg.require("add_cross_attention", Value::Bool(false), "a decoder-only model")?;
    let tied = cfg.bool_or("tie_word_embeddings", true)?;
    // numerics of the reference (upcasting the scores), not the function computed; the n_ctx of
    // old configs is n_positions; summary_* configure GPT2DoubleHeadsModel's classifier only
    cfg.ignore(&[
        "reorder_and_upcast_attn",
        "n_ctx",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
    ]);

    // GPT2LMHeadModel's names; a bare GPT2Model's have no prefix
    let p = if ckpt.has("wte.weight") { "" } else { "transformer." };
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{p}wte.weight"))),
        ("position.table".to_string(), Recipe::copy(format!("{p}wpe.weight"))),
        ("final_norm.gamma".to_string(), Recipe::copy(format!("{p}ln_f.weight"))),
        ("final_norm.beta".to_string(), Recipe::copy(format!("{p}ln_f.bias"))),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    for i in 0..layers {
        let h = format!("{p}h.{i}");
        let b = format!("blocks.{i}");
        for (ours, theirs) in BLOCK_TENSORS {
            tensors.push((format!("{b}.{ours}"), Recipe::copy(format!("{h}.{theirs}"))));
        }
    }

    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout: resid, tied };
    let model = sizes.model([
        ("position", table([("kind", "learned".into()), ("max_len", int(positions))])),
        ("attention", table([("kind", "full".into()), ("n_heads", int(heads)), ("dropout", attn_dropout.into())])),
        ("block", table([("kind", "pre-ln".into()), ("norm", "layer-norm".into()), ("norm_eps", eps.into())])),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
    ]);
    Ok(Mapping {
        class: "GPT2LMHeadModel",
        model,
        tensors,
        // the causal mask GPT-2 once stored per layer, and the head tied to the embedding
        derived: |name| {
            name.ends_with(".attn.bias") && !name.contains("c_attn")
                || name.ends_with(".attn.masked_bias")
                || name == "lm_head.weight"
        },
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as GPT-2;
/// `export` reads it back with [`map`] and refuses the run unless that gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let activation = super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu");
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("n_positions", m["position"]["max_len"].clone()),
        ("n_embd", m["d_model"].clone()),
        ("n_layer", m["n_layers"].clone()),
        ("n_head", m["attention"]["n_heads"].clone()),
        ("n_inner", m["feed_forward"]["d_ff"].clone()),
        ("activation_function", activation.into()),
        ("layer_norm_epsilon", m["block"]["norm_eps"].clone()),
        ("resid_pdrop", m["dropout"].clone()),
        ("embd_pdrop", m["dropout"].clone()),
        ("attn_pdrop", m["attention"]["dropout"].clone()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
