//! DeBERTa v2 and v3 as masked language models (`model_type = "deberta-v2"`,
//! `DebertaV2ForMaskedLM`; He et al. 2021): BERT's post-LN encoder (a LayerNorm on the embedded
//! tokens, post-LN blocks, a GELU FFN, the MLM head: dense, activation, LayerNorm, the tied
//! embedding and a bias) whose attention is disentangled: the `deberta` position scheme, with
//! no absolute positions (`position_biased_input = false`).
//!
//! DeBERTa keeps one table of relative embeddings (and its LayerNorm, `norm_rel_ebd`) for the
//! whole encoder; variorum's tables are per layer, so the import copies it into each — the same
//! function; an export needs the copies equal. With `share_att_key` the position terms read the
//! table through the layer's content query and key projections (v3); the import copies those
//! into the scheme's own W_{q,r}, W_{k,r} (with their biases), and the export writes them as
//! `pos_query_proj` / `pos_key_proj` (`share_att_key = false`), which is the same function
//! whether or not they still equal the content projections. v3's `position_buckets` are the
//! scheme's logarithmic buckets (`log_buckets` = `max_relative_positions`). Position→content
//! reads the offset i − j, as Microsoft's code does (`p2c_distance = "query-minus-key"`; the
//! paper's equation reads j − i).
//!
//! Both heads transformers has are read: the original (`legacy = false`, `lm_predictions`,
//! always tied) and BERT's (`legacy = true`, `cls.predictions`, tied unless
//! `tie_word_embeddings = false`); export writes BERT's.

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, bert, int, table};

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("hidden_size")?;
    let layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    let head_dim = cfg.opt_usize("attention_head_size")?.unwrap_or(d / heads.max(1));
    let d_ff = cfg.usize("intermediate_size")?;
    let positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(512);
    let eps = cfg.f64_or("layer_norm_eps", 1e-7)?;
    let dropout = cfg.f64_or("hidden_dropout_prob", 0.1)?;
    let attn_dropout = cfg.f64_or("attention_probs_dropout_prob", 0.1)?;
    let ffn = cfg.activation("hidden_act", "gelu")?;
    let legacy = cfg.bool_or("legacy", true)?;
    // the original head reads the word embeddings whatever the config says
    let tied = cfg.bool_or("tie_word_embeddings", true)? || !legacy;
    let path = cfg.path().display().to_string();

    if !cfg.bool_or("relative_attention", false)? {
        bail!("{path}: relative_attention = false is not supported: variorum's DeBERTa is its disentangled attention");
    }
    if cfg.bool_or("position_biased_input", true)? {
        bail!(
            "{path}: position_biased_input = true (absolute positions besides the relative ones) is not supported: a variorum model has one position scheme"
        );
    }
    if let types @ 1.. = cfg.int_or("type_vocab_size", 0)? {
        bail!(
            "{path}: type_vocab_size = {types} is not supported: variorum's DeBERTa has no token types (v2 and v3 have none)"
        );
    }
    if let Some(e) = cfg.opt_usize("embedding_size")?.filter(|&e| e != d) {
        bail!(
            "{path}: embedding_size = {e} (≠ hidden_size = {d}) is not supported: variorum's DeBERTa embeds at the model's width"
        );
    }
    if let k @ 1.. = cfg.int_or("conv_kernel_size", 0)? {
        bail!(
            "{path}: conv_kernel_size = {k} is not supported: variorum's DeBERTa has no convolution beside the first layer"
        );
    }
    // read only with the convolution, and by the classification heads' pooler
    cfg.ignore(&["conv_groups", "conv_act", "pooler_dropout", "pooler_hidden_act", "pooler_hidden_size"]);
    let mut terms = cfg.names("pos_att_type")?.unwrap_or_default();
    terms.sort();
    if terms != ["c2p", "p2c"] {
        bail!("{path}: pos_att_type = {terms:?} is not supported: variorum's DeBERTa has both c2p and p2c");
    }
    let share = cfg.bool_or("share_att_key", false)?;
    let norm = match cfg.names("norm_rel_ebd")?.unwrap_or_default().as_slice() {
        [] => false,
        [one] if one == "none" => false,
        [one] if one == "layer_norm" => true,
        other => bail!("{path}: norm_rel_ebd = {other:?} is not supported (none, layer_norm)"),
    };
    let max_relative = cfg.int_or("max_relative_positions", -1)?;
    let max_relative = if max_relative < 1 { positions } else { max_relative as usize };
    let buckets = cfg.int_or("position_buckets", -1)?;
    let (span, log_buckets) = if buckets > 0 { (buckets as usize, Some(max_relative)) } else { (max_relative, None) };
    let mask_token = match cfg.mask_token() {
        Some(id) => id,
        None => bert::mask_token_id(cfg.path().parent().unwrap_or(std::path::Path::new(".")), false)?,
    };

    let e = "deberta.embeddings";
    let (head, transform) = match legacy {
        true => ("cls.predictions", ["cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm"]),
        false => ("lm_predictions.lm_head", ["lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm"]),
    };
    let mut tensors = bert::embeddings_and_head(e, head, transform, tied);
    let inner = heads * head_dim;
    for i in 0..layers {
        let l = format!("deberta.encoder.layer.{i}");
        let b = format!("blocks.{i}");
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        let (pos_query, pos_key) = if share { ("query_proj", "key_proj") } else { ("pos_query_proj", "pos_key_proj") };
        let p = format!("{b}.attn.position");
        tensors.extend(bert::attention_projections(
            &l,
            &format!("{b}.attn"),
            ["query_proj", "key_proj", "value_proj"],
            inner,
        ));
        tensors.extend([
            (format!("{p}.relative"), Recipe::copy("deberta.encoder.rel_embeddings.weight")),
            (format!("{p}.position_query.weight"), t(&format!("attention.self.{pos_query}"))),
            (format!("{p}.position_query.bias"), c(&format!("attention.self.{pos_query}.bias"))),
            (format!("{p}.position_key.weight"), t(&format!("attention.self.{pos_key}"))),
            (format!("{p}.position_key.bias"), c(&format!("attention.self.{pos_key}.bias"))),
        ]);
        tensors.extend(bert::post_ln_norms_and_ffn(&l, &b, "attention.output"));
        if norm {
            tensors.push((format!("{p}.norm.gamma"), Recipe::copy("deberta.encoder.LayerNorm.weight")));
            tensors.push((format!("{p}.norm.beta"), Recipe::copy("deberta.encoder.LayerNorm.bias")));
        }
    }

    // transformers reads position→content at δ(i, j), as Microsoft's code does
    let mut position = vec![
        ("kind", "deberta".into()),
        ("max_distance", int(span)),
        ("bias", true.into()),
        ("p2c_distance", "query-minus-key".into()),
    ];
    if let Some(m) = log_buckets {
        position.push(("log_buckets", int(m)));
    }
    if norm {
        position.push(("norm", true.into()));
        position.push(("norm_eps", eps.into()));
    }
    let mut attention =
        vec![("kind", "full".into()), ("n_heads", int(heads)), ("bias", true.into()), ("dropout", attn_dropout.into())];
    if inner != d {
        attention.push(("head_dim", int(head_dim)));
    }
    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied };
    let model = sizes.model([
        ("embedding_norm", true.into()),
        ("head_transform", true.into()),
        ("head_bias", true.into()),
        ("position", table(position)),
        ("attention", table(attention)),
        ("block", table([("kind", "post-ln".into()), ("norm", "layer-norm".into()), ("norm_eps", eps.into())])),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
        ("objective", table([("kind", "masked".into()), ("mask_token", int(mask_token))])),
    ]);
    Ok(Mapping {
        class: "DebertaV2ForMaskedLM",
        model,
        tensors,
        // the tied decoder and its bias (the head's own under another name); the replaced-token
        // detection head of pretraining checkpoints (v3's), which the masked LM does not read
        derived: |name| {
            name == "cls.predictions.decoder.weight"
                || name == "cls.predictions.decoder.bias"
                || name.ends_with("embeddings.position_ids")
                || name.starts_with("mask_predictions.")
        },
    })
}

/// The `config.json` of a masked run with `deberta` positions (`m`: its expanded `[model]` as
/// JSON) as DeBERTa v2; `export` reads it back with [`map`] and refuses the run unless that
/// gives the same model. The position projections are written as their own
/// (`share_att_key = false`) and the head as BERT's (`legacy = true`).
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let position = &m["position"];
    let (max_relative, buckets) = match position["log_buckets"].as_u64() {
        Some(log) => (log.into(), position["max_distance"].clone()),
        None => (position["max_distance"].clone(), (-1).into()),
    };
    let norm = if position["norm"].as_bool() == Some(true) { "layer_norm" } else { "none" };
    // BERT's sizes and rates, no token types
    let mut json = bert::config_json(m);
    json.extend(
        [
            ("attention_head_size", m["attention"]["head_dim"].clone()),
            ("type_vocab_size", 0.into()),
            ("relative_attention", true.into()),
            ("position_biased_input", false.into()),
            ("pos_att_type", Value::Array(vec!["p2c".into(), "c2p".into()])),
            ("max_relative_positions", max_relative),
            ("position_buckets", buckets),
            ("share_att_key", false.into()),
            ("norm_rel_ebd", norm.into()),
            ("legacy", true.into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    json
}
