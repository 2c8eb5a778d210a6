//! Hugging Face's `DecisionTransformerModel` (`model_type = "decision_transformer"`): a GPT-2
//! (pre-LN blocks with LayerNorm, full attention with biases, the FFN of `activation_function`,
//! default ReLU) over the embedded (R̂, s, a) tokens, read into a
//! [`DecisionTransformer`](variorum_model::DecisionTransformer).
//!
//! Its GPT-2 adds the position row `wpe[0]` to every token (the model passes position ids of
//! zero), right after `embed_ln`: a constant, folded here into the norm's shift
//! (`embed_ln(x) + p = γ·x̂ + (β + p)`), which is exact. Its `nn.Linear` embeddings and heads
//! store `[out, in]` and are transposed; the GPT-2 blocks are read as `gpt2.rs` reads them. Its
//! one-row `wte` (`vocab_size = 1`, read by no input) is the backbone's unused token row.

use std::path::Path;

use anyhow::{Result, bail};
use burn::prelude::*;
use burn::store::ModuleSnapshot;
use serde_json::Value;
use variorum_model::{ActionKind, DecisionConfig, DecisionTransformer, ModelConfig, ModelKind};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;

/// A `DecisionTransformerModel` directory (`config.json`, `model.safetensors`) as the
/// equivalent `[model]` config and its model, weights loaded, on `device`. Only its tanh action
/// head is read (`action_tanh = true`): continuous actions.
pub fn import_decision_transformer(dir: &Path, device: &Device) -> Result<(ModelConfig, DecisionTransformer)> {
    let mut hf = HfConfig::load(dir)?;
    let model_type = hf.model_type()?;
    if model_type != "decision_transformer" {
        bail!("{}: model_type = {model_type:?} is not \"decision_transformer\"", hf.path().display());
    }
    let (d, layers, heads) = (hf.usize("hidden_size")?, hf.usize("n_layer")?, hf.usize("n_head")?);
    let (state_dim, act_dim, max_ep_len) = (hf.usize("state_dim")?, hf.usize("act_dim")?, hf.usize("max_ep_len")?);
    let positions = hf.usize("n_positions")?;
    let d_ff = hf.opt_usize("n_inner")?.unwrap_or(4 * d);
    let eps = hf.f64_or("layer_norm_epsilon", 1e-5)?;
    let ffn = hf.activation("activation_function", "relu")?;
    hf.require("action_tanh", Value::Bool(true), "variorum's continuous actions leave through tanh")?;
    hf.require("scale_attn_weights", Value::Bool(true), "variorum scales scores by 1/√head_dim")?;
    hf.require("scale_attn_by_inverse_layer_idx", Value::Bool(false), "no per-layer score scaling")?;
    hf.require("add_cross_attention", Value::Bool(false), "a decoder-only stack")?;
    hf.require("vocab_size", Value::from(1), "the backbone reads no tokens")?;
    // dropout (variorum's model.dropout is set from resid_pdrop), numerics and generation
    let dropout = hf.f64_or("resid_pdrop", 0.1)?;
    hf.ignore(&[
        "embd_pdrop",
        "attn_pdrop",
        "reorder_and_upcast_attn",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "use_cache",
    ]);
    hf.finish("DecisionTransformerModel")?;

    let text = format!(
        "kind = \"decision-transformer\"\nd_model = {d}\nn_layers = {layers}\nseq_len = {}\ndropout = {dropout}\n\
         [position]\nkind = \"none\"\n[attention]\nkind = \"full\"\nn_heads = {heads}\n\
         [block]\nkind = \"pre-ln\"\nnorm = \"layer-norm\"\nnorm_eps = {eps:e}\n\
         [feed_forward]\nkind = \"{ffn}\"\nd_ff = {d_ff}\n",
        3 * (positions / 3).max(1)
    );
    let mut cfg: ModelConfig = toml::from_str(&text)?;
    cfg.decision = Some(DecisionConfig {
        state_dim: Some(state_dim),
        action_dim: Some(act_dim),
        max_timestep: Some(max_ep_len),
        actions: Some(ActionKind::Continuous),
        predict_states_and_returns: true,
        ..DecisionConfig::default()
    });
    debug_assert_eq!(cfg.kind, ModelKind::DecisionTransformer);
    cfg.validate()?;

    let ckpt = Checkpoint::open(dir)?;
    let mut tensors: Vec<(String, Recipe)> = vec![
        ("embed_timestep.weight".into(), Recipe::copy("embed_timestep.weight")),
        ("embed_norm.gamma".into(), Recipe::copy("embed_ln.weight")),
        ("backbone.token_embedding.weight".into(), Recipe::copy("encoder.wte.weight")),
        ("backbone.final_norm.gamma".into(), Recipe::copy("encoder.ln_f.weight")),
        ("backbone.final_norm.beta".into(), Recipe::copy("encoder.ln_f.bias")),
        ("predict_action.weight".into(), Recipe::transpose("predict_action.0.weight")),
        ("predict_action.bias".into(), Recipe::copy("predict_action.0.bias")),
    ];
    for part in ["return", "state", "action"] {
        tensors.push((format!("embed_{part}.weight"), Recipe::transpose(format!("embed_{part}.weight"))));
        tensors.push((format!("embed_{part}.bias"), Recipe::copy(format!("embed_{part}.bias"))));
    }
    for part in ["state", "return"] {
        tensors.push((format!("predict_{part}.weight"), Recipe::transpose(format!("predict_{part}.weight"))));
        tensors.push((format!("predict_{part}.bias"), Recipe::copy(format!("predict_{part}.bias"))));
    }
    for i in 0..layers {
        for (ours, theirs) in super::gpt2::BLOCK_TENSORS {
            tensors.push((format!("backbone.blocks.{i}.{ours}"), Recipe::copy(format!("encoder.h.{i}.{theirs}"))));
        }
    }
    let mut packs = Vec::with_capacity(tensors.len() + 1);
    for (name, recipe) in &tensors {
        let shape = recipe.shape(&ckpt)?;
        packs.push(burn::store::bridge::from_data(TensorData::new(recipe.values(&ckpt)?, shape), name.clone(), None));
    }
    // embed_ln's shift with GPT-2's position row 0 added
    let beta = ckpt.values("embed_ln.bias")?;
    let row = ckpt.values("encoder.wpe.weight")?;
    let shifted: Vec<f32> = beta.iter().zip(&row[..d]).map(|(b, p)| b + p).collect();
    packs.push(burn::store::bridge::from_data(TensorData::new(shifted, [d]), "embed_norm.beta".into(), None));

    let mut model = cfg.init_decision(device);
    let result = model.apply(packs, None, None, true);
    if !result.errors.is_empty() || !result.missing.is_empty() || !result.unused.is_empty() {
        bail!(
            "{}: the Decision Transformer's tensors do not match (missing {:?}, unused {:?}, errors {:?})",
            dir.display(),
            result.missing,
            result.unused,
            result.errors
        );
    }
    let used = |n: &str| {
        n == "embed_ln.bias"
            || n == "encoder.wpe.weight"
            || n.ends_with(".attn.bias")
            || n.ends_with(".attn.masked_bias")
    };
    if let Some(n) = ckpt.unused().into_iter().find(|n| !used(n)) {
        bail!("{}: tensor {n} has no place in a Decision Transformer", dir.display());
    }
    Ok((cfg, model))
}
