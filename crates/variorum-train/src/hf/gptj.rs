//! GPT-J (`model_type = "gptj"`, `GPTJForCausalLM`; Wang & Komatsuzaki 2021): parallel attention
//! and feed-forward branches reading one shared LayerNorm (the pre-LN kind's `parallel` and
//! `shared_norm`), rotary positions on the first `rotary_dim` dimensions of each head, rotating
//! adjacent pairs (`rotate_every_two`: variorum's `interleaved` layout), full attention without
//! biases, a GELU FFN with biases, an untied head with a bias (`model.head_bias`).
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
    let d = cfg.usize("n_embd")?;
    let layers = cfg.usize("n_layer")?;
    let heads = cfg.usize("n_head")?;
    let d_ff = cfg.opt_usize("n_inner")?.unwrap_or(4 * d);
    let positions = cfg.opt_usize("n_positions")?.unwrap_or(2048);
    let eps = cfg.f64_or("layer_norm_epsilon", 1e-5)?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;
    // variorum drops the embeddings and the branches' outputs with one probability: the
    // residual one (dropout changes training only)
    let dropout = cfg.f64_or("resid_pdrop", 0.0)?;
    cfg.f64_or("embd_pdrop", 0.0)?;
    let attn_dropout = cfg.f64_or("attn_pdrop", 0.0)?;
    let path = cfg.path().display().to_string();
    let ffn = cfg.activation("activation_function", "gelu_new")?;
    let head_dim = d / heads;
    if head_dim * heads != d {
        bail!("{path}: n_embd = {d} is not a multiple of n_head = {heads}");
    }
    // without rotary_dim GPT-J builds its frequencies over the whole width, not a head's:
    // a form no released model uses
    let Some(rotary_dim) = cfg.opt_usize("rotary_dim")? else {
        bail!("{path}: rotary_dim = null is not supported: give the rotating part of each head");
    };
    if rotary_dim % 2 != 0 || rotary_dim > head_dim {
        bail!("{path}: rotary_dim = {rotary_dim} must be even and at most the head size {head_dim}");
    }

    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy("transformer.wte.weight")),
        ("final_norm.gamma".to_string(), Recipe::copy("transformer.ln_f.weight")),
        ("final_norm.beta".to_string(), Recipe::copy("transformer.ln_f.bias")),
        ("head_bias".to_string(), Recipe::copy("lm_head.bias")),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    for i in 0..layers {
        let l = format!("transformer.h.{i}");
        let b = format!("blocks.{i}");
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        let qkv = Recipe::Join(["q_proj", "k_proj", "v_proj"].iter().map(|p| (t(&format!("attn.{p}")), d)).collect());
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("ln_1.weight")),
            (format!("{b}.attn_norm.beta"), c("ln_1.bias")),
            (format!("{b}.attn.qkv.qkv.weight"), qkv),
            (format!("{b}.attn.out.weight"), t("attn.out_proj")),
            (format!("{b}.ffn.up.weight"), t("mlp.fc_in")),
            (format!("{b}.ffn.up.bias"), c("mlp.fc_in.bias")),
            (format!("{b}.ffn.down.weight"), t("mlp.fc_out")),
            (format!("{b}.ffn.down.bias"), c("mlp.fc_out.bias")),
        ]);
    }

    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied };
    let model = sizes.model([
        ("head_bias", true.into()),
        // GPT-J's base is fixed
        ("position", rotary(10_000.0, "interleaved", rotary_dim, head_dim)),
        (
            "attention",
            table([
                ("kind", "full".into()),
                ("n_heads", int(heads)),
                ("bias", false.into()),
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
        class: "GPTJForCausalLM",
        model,
        tensors,
        // the sin/cos table and causal masks older checkpoints store; the head's weight when tied
        derived: |name| {
            name.ends_with("attn.bias")
                || name.ends_with("attn.masked_bias")
                || name.ends_with("embed_positions")
                || name == "lm_head.weight"
        },
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as GPT-J; `export`
/// reads it back with [`map`] and refuses the run unless that gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let activation = super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu_new");
    let rotary = match m["position"]["rotary_dim"].is_null() {
        true => m["attention"]["head_dim"].clone(),
        false => m["position"]["rotary_dim"].clone(),
    };
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("n_embd", m["d_model"].clone()),
        ("n_layer", m["n_layers"].clone()),
        ("n_head", m["attention"]["n_heads"].clone()),
        ("n_inner", m["feed_forward"]["d_ff"].clone()),
        ("n_positions", m["seq_len"].clone()),
        ("rotary_dim", rotary),
        ("activation_function", activation.into()),
        ("layer_norm_epsilon", m["block"]["norm_eps"].clone()),
        ("resid_pdrop", m["dropout"].clone()),
        ("embd_pdrop", m["dropout"].clone()),
        ("attn_pdrop", m["attention"]["dropout"].clone()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
