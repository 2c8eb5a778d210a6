//! OPT (`model_type = "opt"`, `OPTForCausalLM`; Zhang et al. 2022): learned positions, pre-LN
//! blocks with LayerNorm, full attention with biases, a ReLU FFN, tied embeddings: GPT-2's
//! recipe with ReLU and separate q/k/v projections.
//!
//! OPT's position table has two rows more than positions: position `t` reads row `t + 2` (a
//! fairseq offset). The first two rows are never read, so the import drops them and variorum's
//! learned table is exact. The configurations of the 350M model (`do_layer_norm_before = false`,
//! post-LN; `word_embed_proj_dim` ≠ `hidden_size`, projections in and out) are refused.

use anyhow::{Result, bail};
use serde_json::Value;

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

/// The rows OPT's position table has before position 0.
const POSITION_OFFSET: usize = 2;

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    let positions = cfg.usize("max_position_embeddings")?;
    let d = cfg.usize("hidden_size")?;
    let layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    let d_ff = cfg.usize("ffn_dim")?;
    let dropout = cfg.f64_or("dropout", 0.1)?;
    let attn_dropout = cfg.f64_or("attention_dropout", 0.0)?;
    let path = cfg.path().display().to_string();
    if let Some(proj) = cfg.opt_usize("word_embed_proj_dim")? {
        if proj != d {
            bail!("{path}: word_embed_proj_dim = {proj} is not supported: variorum embeds at the model width ({d})");
        }
    }
    let ffn = cfg.activation("activation_function", "relu")?;
    cfg.require(
        "do_layer_norm_before",
        Value::Bool(true),
        "variorum's OPT is pre-LN (the 350M model's post-LN is not mapped)",
    )?;
    cfg.require("_remove_final_layer_norm", Value::Bool(false), "a pre-LN model with its final LayerNorm")?;
    cfg.require("enable_bias", Value::Bool(true), "OPT's projections have biases")?;
    cfg.require("layer_norm_elementwise_affine", Value::Bool(true), "LayerNorms with a gain and a bias")?;
    cfg.require("tie_word_embeddings", Value::Bool(true), "OPTForCausalLM ties its head to the embedding")?;
    cfg.require("is_encoder_decoder", Value::Bool(false), "a decoder-only model")?;
    // dropping whole layers while training; variorum trains every layer (inference is the same)
    cfg.require("layerdrop", Value::from(0.0), "variorum has no layer drop")?;
    cfg.ignore(&["init_std"]);

    let p = "model.decoder";
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{p}.embed_tokens.weight"))),
        (
            "position.table".to_string(),
            Recipe::SkipRows(Box::new(Recipe::copy(format!("{p}.embed_positions.weight"))), POSITION_OFFSET),
        ),
        ("final_norm.gamma".to_string(), Recipe::copy(format!("{p}.final_layer_norm.weight"))),
        ("final_norm.beta".to_string(), Recipe::copy(format!("{p}.final_layer_norm.bias"))),
    ];
    for i in 0..layers {
        let l = format!("{p}.layers.{i}");
        let b = format!("blocks.{i}");
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let qkv = |part: &dyn Fn(&str) -> Recipe| {
            Recipe::Join(["q_proj", "k_proj", "v_proj"].iter().map(|x| (part(&format!("self_attn.{x}")), d)).collect())
        };
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("self_attn_layer_norm.weight")),
            (format!("{b}.attn_norm.beta"), c("self_attn_layer_norm.bias")),
            (format!("{b}.attn.qkv.qkv.weight"), qkv(&|x| t(x))),
            (format!("{b}.attn.qkv.qkv.bias"), qkv(&|x| c(&format!("{x}.bias")))),
            (format!("{b}.attn.out.weight"), t("self_attn.out_proj")),
            (format!("{b}.attn.out.bias"), c("self_attn.out_proj.bias")),
            (format!("{b}.ffn_norm.gamma"), c("final_layer_norm.weight")),
            (format!("{b}.ffn_norm.beta"), c("final_layer_norm.bias")),
            (format!("{b}.ffn.up.weight"), t("fc1")),
            (format!("{b}.ffn.up.bias"), c("fc1.bias")),
            (format!("{b}.ffn.down.weight"), t("fc2")),
            (format!("{b}.ffn.down.bias"), c("fc2.bias")),
        ]);
    }

    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied: true };
    let model = sizes.model([
        ("position", table([("kind", "learned".into()), ("max_len", int(positions))])),
        ("attention", table([("kind", "full".into()), ("n_heads", int(heads)), ("dropout", attn_dropout.into())])),
        // OPT's LayerNorms keep PyTorch's default ε
        ("block", table([("kind", "pre-ln".into()), ("norm", "layer-norm".into()), ("norm_eps", 1e-5.into())])),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
    ]);
    Ok(Mapping {
        class: "OPTForCausalLM",
        model,
        tensors,
        // the head, tied to the embedding
        derived: |name| name == "lm_head.weight",
    })
}
