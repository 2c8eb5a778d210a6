//! Phi-1, Phi-1.5 and Phi-2 (`model_type = "phi"`, `PhiForCausalLM`; Gunasekar et al. 2023,
//! Li et al. 2023): parallel attention and feed-forward branches reading one shared LayerNorm
//! (the pre-LN kind's `parallel` and `shared_norm`), rotary positions on the first
//! `partial_rotary_factor` of each head's dimensions (rotate-half), grouped-query full attention
//! with biases, a GELU FFN, an untied head with a bias (`model.head_bias`).
//!
//! PyTorch's `nn.Linear` stores `[out, in]`: every projection is transposed; q, k and v are
//! joined along the output into variorum's fused projection.

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
    let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    let d_ff = cfg.usize("intermediate_size")?;
    let positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(2048);
    let eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;
    // variorum drops the embeddings, the branches' outputs and the FFN's hidden layer with one
    // probability: the residual one (dropout changes training only)
    let dropout = cfg.f64_or("resid_pdrop", 0.0)?;
    cfg.f64_or("embd_pdrop", 0.0)?;
    let attn_dropout = cfg.f64_or("attention_dropout", 0.0)?;
    let path = cfg.path().display().to_string();
    let ffn = cfg.activation("hidden_act", "gelu_new")?;
    cfg.require("qk_layernorm", Value::Bool(false), "variorum's attention does not normalise queries and keys")?;
    // transformers 5 writes Phi's default 0.5 into rope_parameters; older files may not
    let rope = cfg.rope(&[], 0.5)?;
    let head_dim = d / heads;
    if head_dim * heads != d {
        bail!("{path}: hidden_size = {d} is not a multiple of num_attention_heads = {heads}");
    }
    let rotary_dim = rope.rotary_dim(head_dim, cfg.path())?;

    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy("model.embed_tokens.weight")),
        ("final_norm.gamma".to_string(), Recipe::copy("model.final_layernorm.weight")),
        ("final_norm.beta".to_string(), Recipe::copy("model.final_layernorm.bias")),
        ("head_bias".to_string(), Recipe::copy("lm_head.bias")),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    let widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim];
    for i in 0..layers {
        let l = format!("model.layers.{i}");
        let b = format!("blocks.{i}");
        let qkv = |part: &dyn Fn(&str) -> Recipe| {
            Recipe::Join(["q_proj", "k_proj", "v_proj"].iter().zip(widths).map(|(p, w)| (part(p), w)).collect())
        };
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("input_layernorm.weight")),
            (format!("{b}.attn_norm.beta"), c("input_layernorm.bias")),
            (format!("{b}.attn.qkv.qkv.weight"), qkv(&|p| t(&format!("self_attn.{p}")))),
            (format!("{b}.attn.qkv.qkv.bias"), qkv(&|p| c(&format!("self_attn.{p}.bias")))),
            (format!("{b}.attn.out.weight"), t("self_attn.dense")),
            (format!("{b}.attn.out.bias"), c("self_attn.dense.bias")),
            (format!("{b}.ffn.up.weight"), t("mlp.fc1")),
            (format!("{b}.ffn.up.bias"), c("mlp.fc1.bias")),
            (format!("{b}.ffn.down.weight"), t("mlp.fc2")),
            (format!("{b}.ffn.down.bias"), c("mlp.fc2.bias")),
        ]);
    }

    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied };
    let model = sizes.model([
        ("head_bias", true.into()),
        ("position", rotary(rope.theta, "rotate-half", rotary_dim, head_dim)),
        (
            "attention",
            table([
                ("kind", "full".into()),
                ("n_heads", int(heads)),
                ("n_kv_heads", int(kv_heads)),
                ("bias", true.into()),
                ("dropout", attn_dropout.into()),
            ]),
        ),
        (
            "block",
            table([
                ("kind", "pre-ln".into()),
                ("norm", "layer-norm".into()),
                ("norm_eps", eps.into()),
                ("parallel", true.into()),
                ("shared_norm", true.into()),
            ]),
        ),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
    ]);
    Ok(Mapping {
        class: "PhiForCausalLM",
        model,
        tensors,
        // rotary frequencies some checkpoints store; the head's weight when tied
        derived: |name| name.ends_with("rotary_emb.inv_freq") || name == "lm_head.weight",
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as Phi; `export`
/// reads it back with [`map`] and refuses the run unless that gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let activation = super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu_new");
    let head_dim = m["attention"]["head_dim"].as_f64().unwrap_or(1.0);
    let rotary = m["position"]["rotary_dim"].as_f64().unwrap_or(head_dim);
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("intermediate_size", m["feed_forward"]["d_ff"].clone()),
        ("num_hidden_layers", m["n_layers"].clone()),
        ("num_attention_heads", m["attention"]["n_heads"].clone()),
        ("num_key_value_heads", m["attention"]["n_kv_heads"].clone()),
        ("max_position_embeddings", m["seq_len"].clone()),
        ("layer_norm_eps", m["block"]["norm_eps"].clone()),
        ("hidden_act", activation.into()),
        ("resid_pdrop", m["dropout"].clone()),
        ("embd_pdrop", m["dropout"].clone()),
        ("attention_dropout", m["attention"]["dropout"].clone()),
        ("qk_layernorm", false.into()),
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
