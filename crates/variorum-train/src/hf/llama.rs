//! LLaMA (`model_type = "llama"`, `LlamaForCausalLM`; Touvron et al. 2023) and Mistral
//! (`"mistral"`, the same layers): rotary positions rotating halves of each head, pre-LN blocks
//! with RMSNorm, grouped-query full attention, a SwiGLU FFN, tied or untied embeddings.
//!
//! PyTorch's `nn.Linear` stores `[out, in]`: every projection is transposed. q, k and v are
//! joined along the output into variorum's fused projection; gate and up into the gated FFN's
//! up-projection, gate first.
//!
//! Qwen2 (`"qwen2"`) is LLaMA with biases on q, k and v (none on the output projection).
//!
//! Mistral's `sliding_window` masks keys more than that many positions back. Within a context
//! no longer than the window that is full attention, which is what the import writes, with
//! `seq_len` at most the window.

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, rotary, table};

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let model_type = cfg.model_type()?;
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("hidden_size")?;
    let layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = cfg.opt_usize("head_dim")?.unwrap_or(d / heads);
    let d_ff = cfg.usize("intermediate_size")?;
    let mut positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(2048);
    let eps = cfg.f64_or("rms_norm_eps", 1e-6)?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;
    let attention_bias = cfg.bool_or("attention_bias", false)?;
    let mlp_bias = cfg.bool_or("mlp_bias", false)?;
    let attn_dropout = cfg.f64_or("attention_dropout", 0.0)?;
    let path = cfg.path().display().to_string();
    match cfg.str_or("hidden_act", "silu")?.as_str() {
        "silu" | "swish" => {}
        other => bail!("{path}: hidden_act = {other:?} is not supported (silu: SwiGLU)"),
    }
    let rope = cfg.rope(&[], 1.0)?;
    if rope.fraction != 1.0 {
        bail!("{path}: partial_rotary_factor = {} is not LLaMA's: every dimension rotates", rope.fraction);
    }
    let theta = rope.theta;
    // tensor-parallel slicing of the pretraining run: the same function computed in pieces
    cfg.ignore(&["pretraining_tp"]);
    if model_type == "mistral" {
        if let Some(window) = cfg.opt_usize("sliding_window")? {
            positions = positions.min(window);
        }
        cfg.ignore(&["use_sliding_window", "max_window_layers"]);
    }
    // Qwen2: biases on q, k and v but not on the output projection (given zeros: variorum's
    // `bias` covers all four); sliding windows only where use_sliding_window says so
    let qwen2 = model_type == "qwen2";
    if qwen2 {
        cfg.require("use_sliding_window", Value::Bool(false), "variorum's Qwen2 attends to the whole context")?;
        if let Some(types) = cfg.array("layer_types")? {
            if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                bail!("{path}: layer_types holds {other}: variorum's Qwen2 has full attention in every layer");
            }
        }
        // read only with use_sliding_window
        cfg.ignore(&["sliding_window", "max_window_layers"]);
    }
    let qkv_bias = attention_bias || qwen2;

    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy("model.embed_tokens.weight")),
        ("final_norm.gamma".to_string(), Recipe::copy("model.norm.weight")),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    for i in 0..layers {
        let l = format!("model.layers.{i}");
        let b = format!("blocks.{i}");
        let widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim];
        let qkv = |part: &dyn Fn(&str) -> Recipe| {
            Recipe::Join(["q_proj", "k_proj", "v_proj"].iter().zip(widths).map(|(p, w)| (part(p), w)).collect())
        };
        let gate_up = |part: &dyn Fn(&str) -> Recipe| {
            Recipe::Join(["gate_proj", "up_proj"].iter().map(|p| (part(p), d_ff)).collect())
        };
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), Recipe::copy(format!("{l}.input_layernorm.weight"))),
            (format!("{b}.ffn_norm.gamma"), Recipe::copy(format!("{l}.post_attention_layernorm.weight"))),
            (format!("{b}.attn.qkv.qkv.weight"), qkv(&|p| t(&format!("self_attn.{p}")))),
            (format!("{b}.attn.out.weight"), t("self_attn.o_proj")),
            (format!("{b}.ffn.up.weight"), gate_up(&|p| t(&format!("mlp.{p}")))),
            (format!("{b}.ffn.down.weight"), t("mlp.down_proj")),
        ]);
        if qkv_bias {
            tensors.push((format!("{b}.attn.qkv.qkv.bias"), qkv(&|p| Recipe::copy(format!("{l}.self_attn.{p}.bias")))));
            let out = match attention_bias {
                true => Recipe::copy(format!("{l}.self_attn.o_proj.bias")),
                false => Recipe::Zeros(vec![d]),
            };
            tensors.push((format!("{b}.attn.out.bias"), out));
        }
        if mlp_bias {
            let bias = |p: &str| Recipe::copy(format!("{l}.mlp.{p}.bias"));
            tensors.push((format!("{b}.ffn.up.bias"), gate_up(&bias)));
            tensors.push((format!("{b}.ffn.down.bias"), bias("down_proj")));
        }
    }

    let mut attention = vec![
        ("kind", "full".into()),
        ("n_heads", int(heads)),
        ("n_kv_heads", int(kv_heads)),
        ("bias", qkv_bias.into()),
        ("dropout", attn_dropout.into()),
    ];
    if head_dim * heads != d {
        attention.push(("head_dim", int(head_dim)));
    }
    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout: 0.0, tied };
    let model = sizes.model([
        ("position", rotary(theta, "rotate-half", head_dim, head_dim)),
        ("attention", table(attention)),
        ("block", table([("kind", "pre-ln".into()), ("norm", "rms-norm".into()), ("norm_eps", eps.into())])),
        ("feed_forward", table([("kind", "swiglu".into()), ("d_ff", int(d_ff)), ("bias", mlp_bias.into())])),
    ]);
    Ok(Mapping {
        class: match model_type.as_str() {
            "mistral" => "MistralForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            _ => "LlamaForCausalLM",
        },
        model,
        tensors,
        // rotary frequencies some checkpoints store; the head when tied to the embedding
        derived: |name| name.ends_with("rotary_emb.inv_freq") || name == "lm_head.weight",
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as LLaMA;
/// `export` reads it back with [`map`] and refuses the run unless that gives the same model.
/// The rotary base is written both as transformers 5 keeps it (`rope_parameters`) and as
/// earlier versions read it (`rope_theta`).
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let base = m["position"]["base"].clone();
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("intermediate_size", m["feed_forward"]["d_ff"].clone()),
        ("num_hidden_layers", m["n_layers"].clone()),
        ("num_attention_heads", m["attention"]["n_heads"].clone()),
        ("num_key_value_heads", m["attention"]["n_kv_heads"].clone()),
        ("head_dim", m["attention"]["head_dim"].clone()),
        ("max_position_embeddings", m["seq_len"].clone()),
        ("rms_norm_eps", m["block"]["norm_eps"].clone()),
        ("rope_theta", base.clone()),
        ("rope_parameters", serde_json::json!({"rope_theta": base, "rope_type": "default"})),
        ("hidden_act", "silu".into()),
        ("attention_bias", m["attention"]["bias"].clone()),
        ("attention_dropout", m["attention"]["dropout"].clone()),
        ("mlp_bias", m["feed_forward"]["bias"].clone()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
