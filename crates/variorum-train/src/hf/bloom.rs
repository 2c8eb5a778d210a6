//! BLOOM (`model_type = "bloom"`, `BloomForCausalLM`; BigScience 2022): ALiBi instead of
//! positions (Press et al. 2022, the paper's slopes), a LayerNorm on the embedded tokens
//! (`model.embedding_norm`), pre-LN LayerNorm blocks, full attention with biases, a tanh-GELU
//! FFN four times as wide, tied embeddings.
//!
//! BLOOM adds `m_h · j` to the score of key `j`, where ALiBi's definition adds `−m_h · (i − j)`:
//! the two differ by `m_h · i`, the same for every key of query `i`, which the softmax cancels.
//! The fused `query_key_value` projection stores, per head, that head's q, k and v one after
//! the other, as GPT-NeoX's does; the import reorders its output features (exact).

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

/// BLOOM was trained on sequences of this length; ALiBi has no table to bound it.
const TRAINED_CONTEXT: usize = 2048;

/// A key transformers keeps but never reads (some of BigScience's files have it): the context
/// the model was trained on, variorum's `seq_len`; `export` writes it.
const CONTEXT_KEY: &str = "seq_length";

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    // older files call the width n_embed
    let d = match cfg.opt_usize("hidden_size")? {
        Some(d) => d,
        None => cfg.usize("n_embed")?,
    };
    let layers = cfg.usize("n_layer")?;
    let heads = cfg.usize("n_head")?;
    let eps = cfg.f64_or("layer_norm_epsilon", 1e-5)?;
    let tied = cfg.bool_or("tie_word_embeddings", true)?;
    let context = cfg.opt_usize(CONTEXT_KEY)?.unwrap_or(TRAINED_CONTEXT);
    let dropout = cfg.f64_or("hidden_dropout", 0.0)?;
    let attn_dropout = cfg.f64_or("attention_dropout", 0.0)?;
    let path = cfg.path().display().to_string();
    cfg.require(
        "apply_residual_connection_post_layernorm",
        Value::Bool(false),
        "variorum's pre-LN residual adds the block's input, not its normed input",
    )?;
    // tensor-parallel slicing of the pretraining run: the same function computed in pieces
    cfg.ignore(&["pretraining_tp", "slow_but_exact"]);
    let head_dim = d / heads;
    if head_dim * heads != d {
        bail!("{path}: hidden_size = {d} is not a multiple of n_head = {heads}");
    }

    let p = "transformer";
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{p}.word_embeddings.weight"))),
        ("embedding_norm.gamma".to_string(), Recipe::copy(format!("{p}.word_embeddings_layernorm.weight"))),
        ("embedding_norm.beta".to_string(), Recipe::copy(format!("{p}.word_embeddings_layernorm.bias"))),
        ("final_norm.gamma".to_string(), Recipe::copy(format!("{p}.ln_f.weight"))),
        ("final_norm.beta".to_string(), Recipe::copy(format!("{p}.ln_f.bias"))),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    for i in 0..layers {
        let l = format!("{p}.h.{i}");
        let b = format!("blocks.{i}");
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("input_layernorm.weight")),
            (format!("{b}.attn_norm.beta"), c("input_layernorm.bias")),
            (format!("{b}.ffn_norm.gamma"), c("post_attention_layernorm.weight")),
            (format!("{b}.ffn_norm.beta"), c("post_attention_layernorm.bias")),
            (
                format!("{b}.attn.qkv.qkv.weight"),
                Recipe::per_head_qkv(t("self_attention.query_key_value"), heads, head_dim),
            ),
            (
                format!("{b}.attn.qkv.qkv.bias"),
                Recipe::per_head_qkv(c("self_attention.query_key_value.bias"), heads, head_dim),
            ),
            (format!("{b}.attn.out.weight"), t("self_attention.dense")),
            (format!("{b}.attn.out.bias"), c("self_attention.dense.bias")),
            (format!("{b}.ffn.up.weight"), t("mlp.dense_h_to_4h")),
            (format!("{b}.ffn.up.bias"), c("mlp.dense_h_to_4h.bias")),
            (format!("{b}.ffn.down.weight"), t("mlp.dense_4h_to_h")),
            (format!("{b}.ffn.down.bias"), c("mlp.dense_4h_to_h.bias")),
        ]);
    }

    let sizes = Sizes { vocab, d, layers, seq_len: context, dropout, tied };
    let model = sizes.model([
        ("embedding_norm", true.into()),
        ("position", table([("kind", "alibi".into())])),
        (
            "attention",
            table([
                ("kind", "full".into()),
                ("n_heads", int(heads)),
                ("bias", true.into()),
                ("dropout", attn_dropout.into()),
            ]),
        ),
        ("block", table([("kind", "pre-ln".into()), ("norm", "layer-norm".into()), ("norm_eps", eps.into())])),
        // BLOOM's GELU is the tanh form, and its FFN 4 × wide
        ("feed_forward", table([("kind", "gelu-tanh".into()), ("d_ff", int(4 * d))])),
    ]);
    Ok(Mapping {
        class: "BloomForCausalLM",
        model,
        tensors,
        // the head when tied to the embedding
        derived: |name| name == "lm_head.weight",
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as BLOOM; `export`
/// reads it back with [`map`] and refuses the run unless that gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let pairs = [
        (CONTEXT_KEY, m["seq_len"].clone()),
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("n_layer", m["n_layers"].clone()),
        ("n_head", m["attention"]["n_heads"].clone()),
        ("layer_norm_epsilon", m["block"]["norm_eps"].clone()),
        ("apply_residual_connection_post_layernorm", false.into()),
        ("hidden_dropout", m["dropout"].clone()),
        ("attention_dropout", m["attention"]["dropout"].clone()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
