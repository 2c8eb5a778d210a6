//! GPT-NeoX and Pythia (`model_type = "gpt_neox"`, `GPTNeoXForCausalLM`; Black et al. 2022,
//! Biderman et al. 2023): rotary positions on the first `partial_rotary_factor` of each head's
//! dimensions (rotate-half), pre-LN LayerNorm blocks whose attention and feed-forward branches
//! run in parallel (`use_parallel_residual`, the pre-LN kind's `parallel` setting), full
//! attention with biases, a GELU FFN, an untied head.
//!
//! The fused `query_key_value` projection stores, per head, that head's q, k and v one after the
//! other (`[h, 3, head_dim]` along its output); variorum's fused projection holds all heads' q,
//! then all k, then all v. The import reorders the output features (a permutation: exact).

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, rotary, table};

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("hidden_size")?;
    let layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    let d_ff = cfg.usize("intermediate_size")?;
    let positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(2048);
    let eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;
    let parallel = cfg.bool_or("use_parallel_residual", true)?;
    let bias = cfg.bool_or("attention_bias", true)?;
    let attn_dropout = cfg.f64_or("attention_dropout", 0.0)?;
    let dropout = cfg.f64_or("hidden_dropout", 0.0)?;
    let path = cfg.path().display().to_string();
    let ffn = cfg.activation("hidden_act", "gelu")?;
    let rope = cfg.rope(&["rotary_emb_base"], 1.0)?;
    let theta = rope.theta;
    // the classification head's, and a flag transformers' generation reads
    cfg.ignore(&["classifier_dropout", "is_decoder"]);

    let head_dim = d / heads;
    if head_dim * heads != d {
        bail!("{path}: hidden_size = {d} is not a multiple of num_attention_heads = {heads}");
    }
    let rotary_dim = rope.rotary_dim(head_dim, cfg.path())?;

    let p = "gpt_neox";
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{p}.embed_in.weight"))),
        ("final_norm.gamma".to_string(), Recipe::copy(format!("{p}.final_layer_norm.weight"))),
        ("final_norm.beta".to_string(), Recipe::copy(format!("{p}.final_layer_norm.bias"))),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("embed_out.weight")));
    }
    for i in 0..layers {
        let l = format!("{p}.layers.{i}");
        let b = format!("blocks.{i}");
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("input_layernorm.weight")),
            (format!("{b}.attn_norm.beta"), c("input_layernorm.bias")),
            (format!("{b}.ffn_norm.gamma"), c("post_attention_layernorm.weight")),
            (format!("{b}.ffn_norm.beta"), c("post_attention_layernorm.bias")),
            (format!("{b}.attn.qkv.qkv.weight"), Recipe::per_head_qkv(t("attention.query_key_value"), heads, head_dim)),
            (format!("{b}.attn.out.weight"), t("attention.dense")),
            (format!("{b}.ffn.up.weight"), t("mlp.dense_h_to_4h")),
            (format!("{b}.ffn.up.bias"), c("mlp.dense_h_to_4h.bias")),
            (format!("{b}.ffn.down.weight"), t("mlp.dense_4h_to_h")),
            (format!("{b}.ffn.down.bias"), c("mlp.dense_4h_to_h.bias")),
        ]);
        if bias {
            tensors.push((
                format!("{b}.attn.qkv.qkv.bias"),
                Recipe::per_head_qkv(c("attention.query_key_value.bias"), heads, head_dim),
            ));
            tensors.push((format!("{b}.attn.out.bias"), c("attention.dense.bias")));
        }
    }

    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied };
    let model = sizes.model([
        ("position", rotary(theta, "rotate-half", rotary_dim, head_dim)),
        (
            "attention",
            table([
                ("kind", "full".into()),
                ("n_heads", int(heads)),
                ("bias", bias.into()),
                ("dropout", attn_dropout.into()),
            ]),
        ),
        (
            "block",
            table([
                ("kind", "pre-ln".into()),
                ("norm", "layer-norm".into()),
                ("norm_eps", eps.into()),
                ("parallel", parallel.into()),
            ]),
        ),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
    ]);
    Ok(Mapping {
        class: "GPTNeoXForCausalLM",
        model,
        tensors,
        // causal masks and rotary frequencies older checkpoints store; a tied head
        derived: |name| {
            name.ends_with(".attention.bias")
                || name.ends_with(".attention.masked_bias")
                || name.ends_with("rotary_emb.inv_freq")
                || name == "embed_out.weight"
        },
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as GPT-NeoX;
/// `export` reads it back with [`map`] and refuses the run unless that gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let activation = super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu");
    let head_dim = m["attention"]["head_dim"].as_f64().unwrap_or(1.0);
    let rotary = m["position"]["rotary_dim"].as_f64().unwrap_or(head_dim);
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("num_hidden_layers", m["n_layers"].clone()),
        ("num_attention_heads", m["attention"]["n_heads"].clone()),
        ("intermediate_size", m["feed_forward"]["d_ff"].clone()),
        ("hidden_act", activation.into()),
        ("max_position_embeddings", m["seq_len"].clone()),
        ("layer_norm_eps", m["block"]["norm_eps"].clone()),
        ("use_parallel_residual", m["block"]["parallel"].clone()),
        ("attention_bias", m["attention"]["bias"].clone()),
        ("attention_dropout", m["attention"]["dropout"].clone()),
        ("hidden_dropout", m["dropout"].clone()),
        (
            "rope_parameters",
            serde_json::json!({
                "rope_theta": m["position"]["base"],
                "partial_rotary_factor": rotary / head_dim,
                "rope_type": "default",
            }),
        ),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
