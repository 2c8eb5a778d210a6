//! T5, v1.0 and v1.1 (`model_type = "t5"`, `T5ForConditionalGeneration`; Raffel et al. 2020):
//! an encoder–decoder (`model.kind = "encoder-decoder"`) of pre-LN blocks whose norm is T5's RMS
//! norm (no mean, no bias: `rms-norm`); full attention without biases and without the 1/√d_h
//! (`scaled = false`), T5's bucketed relative bias in the self-attention (two-sided in the
//! encoder, one-sided in the decoder; none in the cross-attention); an FFN without biases, ReLU
//! (v1.0) or gated tanh-GELU (v1.1's `gated-gelu`: `geglu-tanh`). v1.0 ties the head to the
//! embedding and reads the decoder's output times 1/√d_model (`model.scale_head`); v1.1 has a
//! head of its own and no factor. The decoder starts from `<pad>` (`decoder_start_token_id`)
//! and a target ends with `</s>` (`eos_token_id`), both tokens of the vocabulary
//! (`model.start_token`, `model.end_token`).
//!
//! T5 computes the relative bias from the first layer's table and adds it in every layer of a
//! stack: `shared = true` of the `t5` positions, where every layer holds the first layer's
//! table, one tensor (the import copies T5's into each). A run whose layers have tables of
//! their own exports if they agree (fine-tuned with `train.freeze.positions`).
//!
//! transformers 5 always ties the embeddings in the config (`tie_word_embeddings = true`) and
//! keeps v1.1's factor apart (`scale_decoder_outputs`); a checkpoint with an `lm_head.weight` of
//! its own is read with it (transformers 5 does not tie weights that differ), and earlier
//! versions' `tie_word_embeddings = false` means no factor, as there.

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

pub(crate) fn map(cfg: &mut HfConfig, ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("d_model")?;
    let head_dim = cfg.usize("d_kv")?;
    let d_ff = cfg.usize("d_ff")?;
    let encoder_layers = cfg.usize("num_layers")?;
    let decoder_layers = cfg.opt_usize("num_decoder_layers")?.unwrap_or(encoder_layers);
    let heads = cfg.usize("num_heads")?;
    let num_buckets = cfg.opt_usize("relative_attention_num_buckets")?.unwrap_or(32);
    let max_distance = cfg.opt_usize("relative_attention_max_distance")?.unwrap_or(128);
    let dropout = cfg.f64_or("dropout_rate", 0.1)?;
    let eps = cfg.f64_or("layer_norm_epsilon", 1e-6)?;
    // T5 has no length limit of its own; `n_positions` (512 in Google's configs) is the length
    // it was trained on
    let seq_len = cfg.opt_usize("n_positions")?.unwrap_or(512);
    let pad = cfg.index_or("pad_token_id", 0)?;
    let start = cfg.index_or("decoder_start_token_id", pad)?;
    let end = cfg.index_or("eos_token_id", 1)?;
    let path = cfg.path().display().to_string();
    cfg.require("is_encoder_decoder", Value::Bool(true), "variorum's T5 is an encoder–decoder")?;
    cfg.require("is_decoder", Value::Bool(false), "variorum's T5 is the whole encoder–decoder")?;
    // what transformers derives from feed_forward_proj (some versions write it out)
    cfg.ignore(&["dense_act_fn", "is_gated_act", "initializer_factor", "classifier_dropout"]);
    let projection = cfg.str_or("feed_forward_proj", "relu")?;
    let ffn = match projection.as_str() {
        "relu" => "relu",
        "gelu" => "gelu",
        "gelu_new" => "gelu-tanh",
        // transformers reads `gated-gelu` as the tanh GELU, for compatibility with Mesh TF
        "gated-gelu" | "gated-gelu_new" => "geglu-tanh",
        "gated-silu" | "gated-swish" => "swiglu",
        other => bail!(
            "{path}: feed_forward_proj = {other:?} is not supported (relu, gelu, gelu_new, gated-gelu, gated-silu)"
        ),
    };
    let gated = projection.starts_with("gated-");
    let tie_word_embeddings = cfg.bool_or("tie_word_embeddings", true)?;
    let scale_head = match cfg.opt_bool("scale_decoder_outputs")? {
        Some(scale) => scale,
        None => tie_word_embeddings,
    };
    // transformers 5 ties only weights that are equal: a head stored apart is the model's own
    let tied = tie_word_embeddings && !ckpt.has("lm_head.weight");

    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy("shared.weight")),
        ("encoder.final_norm.gamma".to_string(), Recipe::copy("encoder.final_layer_norm.weight")),
        ("final_norm.gamma".to_string(), Recipe::copy("decoder.final_layer_norm.weight")),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose("lm_head.weight")));
    }
    let inner = heads * head_dim;
    let attention = |theirs: &str, ours: &str, tensors: &mut Vec<(String, Recipe)>| {
        let t = |p: &str| Recipe::transpose(format!("{theirs}.{p}.weight"));
        let qkv = Recipe::Join(["q", "k", "v"].iter().map(|p| (t(p), inner)).collect());
        tensors.push((format!("{ours}.qkv.qkv.weight"), qkv));
        tensors.push((format!("{ours}.out.weight"), t("o")));
    };
    let feed_forward = |theirs: &str, ours: &str, tensors: &mut Vec<(String, Recipe)>| {
        let t = |p: &str| Recipe::transpose(format!("{theirs}.{p}.weight"));
        let up = match gated {
            true => Recipe::Join(vec![(t("wi_0"), d_ff), (t("wi_1"), d_ff)]),
            false => t("wi"),
        };
        tensors.push((format!("{ours}.up.weight"), up));
        tensors.push((format!("{ours}.down.weight"), t("wo")));
    };
    for (stack, ours, layers) in [("encoder", "encoder.blocks", encoder_layers), ("decoder", "blocks", decoder_layers)]
    {
        let bias = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        for i in 0..layers {
            let (h, b) = (format!("{stack}.block.{i}.layer"), format!("{ours}.{i}"));
            tensors.push((format!("{b}.attn_norm.gamma"), Recipe::copy(format!("{h}.0.layer_norm.weight"))));
            attention(&format!("{h}.0.SelfAttention"), &format!("{b}.attn"), &mut tensors);
            tensors.push((format!("{b}.attn.position.table"), Recipe::transpose(bias.clone())));
            // the decoder's sublayer 1 is the cross-attention, its FFN sublayer 2
            let ffn_layer = if stack == "decoder" {
                tensors.push((format!("{b}.cross.norm.gamma"), Recipe::copy(format!("{h}.1.layer_norm.weight"))));
                attention(&format!("{h}.1.EncDecAttention"), &format!("{b}.cross.attn"), &mut tensors);
                2
            } else {
                1
            };
            tensors.push((format!("{b}.ffn_norm.gamma"), Recipe::copy(format!("{h}.{ffn_layer}.layer_norm.weight"))));
            feed_forward(&format!("{h}.{ffn_layer}.DenseReluDense"), &format!("{b}.ffn"), &mut tensors);
        }
    }

    let mut attention = vec![
        ("kind", "full".into()),
        ("n_heads", int(heads)),
        ("bias", false.into()),
        ("scaled", false.into()),
        ("dropout", dropout.into()),
    ];
    if inner != d {
        attention.push(("head_dim", int(head_dim)));
    }
    let attention = table(attention);
    let sizes = Sizes { vocab, d, layers: decoder_layers, seq_len, dropout, tied };
    let model = sizes.model([
        ("kind", "encoder-decoder".into()),
        ("scale_head", scale_head.into()),
        ("end_token", int(end)),
        ("start_token", int(start)),
        ("encoder", table([("n_layers", int(encoder_layers))])),
        (
            "position",
            table([
                ("kind", "t5".into()),
                ("num_buckets", int(num_buckets)),
                ("max_distance", int(max_distance)),
                ("shared", true.into()),
            ]),
        ),
        ("attention", attention.clone()),
        ("cross_attention", attention),
        ("block", table([("kind", "pre-ln".into()), ("norm", "rms-norm".into()), ("norm_eps", eps.into())])),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff)), ("bias", false.into())])),
    ]);
    Ok(Mapping {
        class: "T5ForConditionalGeneration",
        model,
        tensors,
        // the stacks' own references to the shared embedding, which some checkpoints store, and
        // a cross-attention table old checkpoints carry and no forward reads
        derived: |name| {
            name == "encoder.embed_tokens.weight"
                || name == "decoder.embed_tokens.weight"
                || name.ends_with("EncDecAttention.relative_attention_bias.weight")
        },
    })
}

/// The `config.json` of a run's model (`m`: its expanded `[model]` as JSON) as T5;
/// `export` reads it back with [`map`] and refuses the run unless that gives the same model.
/// `tie_word_embeddings` is written as transformers before version 5 reads it (a tied head is
/// a scaled one), and `scale_decoder_outputs` as version 5 does: a run whose head is tied but
/// unscaled, or untied and scaled, reads back otherwise and is refused.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let projection = match m["feed_forward"]["kind"].as_str() {
        Some("gelu") => "gelu",
        Some("gelu-tanh") => "gelu_new",
        Some("geglu-tanh") => "gated-gelu",
        Some("swiglu") => "gated-silu",
        // relu, and any other kind: the read-back names the difference
        _ => "relu",
    };
    let attention = &m["attention"];
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("d_model", m["d_model"].clone()),
        ("d_kv", attention["head_dim"].clone()),
        ("d_ff", m["feed_forward"]["d_ff"].clone()),
        ("num_layers", m["encoder"]["n_layers"].clone()),
        ("num_decoder_layers", m["n_layers"].clone()),
        ("num_heads", attention["n_heads"].clone()),
        ("relative_attention_num_buckets", m["position"]["num_buckets"].clone()),
        ("relative_attention_max_distance", m["position"]["max_distance"].clone()),
        ("dropout_rate", m["dropout"].clone()),
        ("layer_norm_epsilon", m["block"]["norm_eps"].clone()),
        ("feed_forward_proj", projection.into()),
        ("is_encoder_decoder", true.into()),
        ("n_positions", m["seq_len"].clone()),
        ("tie_word_embeddings", m["scale_head"].clone()),
        ("scale_decoder_outputs", m["scale_head"].clone()),
        ("eos_token_id", m["end_token"].clone()),
        ("decoder_start_token_id", m["start_token"].clone()),
        ("pad_token_id", m["start_token"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
