//! BERT, RoBERTa and FNet as masked language models (`model_type = "bert"`, `BertForMaskedLM`,
//! Devlin et al. 2019; `"roberta"`, `RobertaForMaskedLM`, Liu et al. 2019; `"fnet"`,
//! `FNetForMaskedLM`, Lee-Thorp et al. 2021; `"longformer"`, `LongformerForMaskedLM`, Beltagy
//! et al. 2020; `"big_bird"`, `BigBirdForMaskedLM`, Zaheer et al. 2020, its attention in
//! `big_bird.rs`): learned positions, a LayerNorm on the embedded
//! input (`model.embedding_norm`), post-LN blocks, bidirectional full attention with biases —
//! FNet: the `fnet` kind's Fourier mixing, no weights, and a dense layer after the embedding norm
//! (`model.embedding_projection`) —, a GELU FFN, and the MLM head: dense, the FFN's activation,
//! LayerNorm (`model.head_transform`), the tied embedding and a bias (`model.head_bias`). The
//! mask token is the tokenizer's own (`model.objective.mask_token`).
//!
//! Every token of a one-segment text has token type 0, so that type's embedding is added to
//! every position: the import folds it into the position table (`PlusRow`); a model read for
//! two-segment inputs (type 1) is not what variorum computes. RoBERTa numbers positions from
//! `pad_token_id + 1`, as OPT from 2: the rows before are dropped.
//!
//! Longformer is RoBERTa with the `longformer` kind for attention: a window of
//! `attention_window / 2` keys each way (`window` = that + 1, the query's own included, per layer
//! where the config lists one per layer) and global projections Q_g, K_g, V_g of their own
//! (`global_projections = "separate"`, kept although no position is global: transformers gives
//! global attention only to the positions a caller's `global_attention_mask` names, none by
//! default for a masked LM; a config naming `model.attention.global` positions computes what
//! transformers computes with them global). transformers pads the input to a multiple of the
//! window with masked keys: the same scores for the tokens of the text.
//!
//! Nyströmformer (`"nystromformer"`, `NystromformerForMaskedLM`, Xiong et al. 2021) is BERT with
//! the `nystrom` kind for attention: `num_landmarks` segment means, six iterations of the
//! pseudo-inverse started as the authors' code starts them (`pinv_scale = "batch"`), the
//! depthwise convolution of V (`conv_kernel`); positions numbered from 2. transformers computes
//! the approximation only for inputs of exactly `segment_means_seq_len` tokens (it reshapes them
//! into the landmarks' segments; shorter texts must be padded, the padding then entering the
//! landmark means) — variorum's segments take any length, so it equals transformers at that
//! length. With `num_landmarks = segment_means_seq_len` transformers computes softmax attention
//! whatever the length: the import gives every position its own landmark (`landmarks` =
//! `seq_len`), where the kind computes the attention itself.

use std::path::Path;

use anyhow::{Result, anyhow, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let model_type = cfg.model_type()?;
    let (fnet, nystrom, longformer) = (model_type == "fnet", model_type == "nystromformer", model_type == "longformer");
    let big_bird = model_type == "big_bird";
    // RoBERTa's embeddings and head
    let roberta = model_type == "roberta" || longformer;
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("hidden_size")?;
    let layers = cfg.usize("num_hidden_layers")?;
    let heads = if fnet { 0 } else { cfg.usize("num_attention_heads")? };
    let d_ff = cfg.usize("intermediate_size")?;
    let positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(if nystrom { 510 } else { 512 });
    // Nyströmformer's table has two rows before position 0
    let table_rows = if nystrom { positions + 2 } else { positions };
    let eps = cfg.f64_or("layer_norm_eps", if nystrom { 1e-5 } else { 1e-12 })?;
    let tied = cfg.bool_or("tie_word_embeddings", true)?;
    let dropout = cfg.f64_or("hidden_dropout_prob", 0.1)?;
    let attn_dropout = if fnet { 0.0 } else { cfg.f64_or("attention_probs_dropout_prob", 0.1)? };
    let types = cfg.opt_usize("type_vocab_size")?.unwrap_or(2);
    let path = cfg.path().display().to_string();
    // the prediction head's activation is hidden_act, as the FFN's; RoBERTa's is always the erf GELU
    let ffn = cfg.activation("hidden_act", if fnet || nystrom || big_bird { "gelu_new" } else { "gelu" })?;
    if roberta && ffn != "gelu" {
        bail!(
            "{path}: hidden_act other than gelu is not supported: RoBERTa's head transform uses GELU whatever it says"
        );
    }
    if fnet {
        cfg.require(
            "use_tpu_fourier_optimizations",
            Value::Bool(false),
            "variorum's Fourier mixing is the FFT over the whole sequence",
        )?;
        // read only with the TPU optimisations
        cfg.ignore(&["tpu_short_seq_length"]);
    } else if longformer {
        cfg.require(
            "attention_mode",
            "longformer".into(),
            "variorum's Longformer is the sliding window with global attention",
        )?;
        // read only when exporting to ONNX
        cfg.ignore(&["onnx_export"]);
    } else if nystrom {
        cfg.require("add_cross_attention", Value::Bool(false), "variorum's Nyströmformer has no cross-attention")?;
        // transformers reads the other start only through a config subscript that fails
        cfg.require("inv_coeff_init_option", Value::Bool(false), "the authors' start of the pseudo-inverse")?;
    } else {
        if !big_bird {
            cfg.require(
                "position_embedding_type",
                "absolute".into(),
                "variorum's BERT has learned absolute positions",
            )?;
        }
        cfg.require("is_decoder", Value::Bool(false), "a masked language model attends both ways")?;
        cfg.require("add_cross_attention", Value::Bool(false), "variorum's BERT has no cross-attention")?;
    }
    let landmarks = match nystrom {
        true => {
            let (m, segment) = (cfg.usize("num_landmarks")?, cfg.usize("segment_means_seq_len")?);
            if m != segment && !segment.is_multiple_of(m) {
                bail!("{path}: segment_means_seq_len = {segment} is not a multiple of num_landmarks = {m}");
            }
            // softmax attention at every length, where transformers' landmarks are its positions
            Some(if m == segment { positions } else { m })
        }
        false => None,
    };
    let windows = match longformer {
        true => attention_windows(cfg, layers)?,
        false => Vec::new(),
    };
    let conv = if nystrom { cfg.opt_usize("conv_kernel_size")? } else { None };
    if let Some(k) = conv.filter(|k| k % 2 == 0) {
        bail!("{path}: conv_kernel_size = {k} is even: transformers' padding keeps the length only for odd kernels");
    }
    // the classification heads'
    cfg.ignore(&["classifier_dropout"]);
    // RoBERTa's positions start after the padding id, Nyströmformer's at 2
    let offset = match (roberta, nystrom) {
        (true, _) => cfg.index_or("pad_token_id", 1)? + 1,
        (_, true) => 2,
        _ => 0,
    };
    if table_rows <= offset {
        bail!("{path}: max_position_embeddings = {table_rows} leaves no position after the first {offset}");
    }
    let (p, class) = match model_type.as_str() {
        "roberta" => ("roberta", "RobertaForMaskedLM"),
        "longformer" => ("longformer", "LongformerForMaskedLM"),
        "fnet" => ("fnet", "FNetForMaskedLM"),
        "nystromformer" => ("nystromformer", "NystromformerForMaskedLM"),
        "big_bird" => ("bert", "BigBirdForMaskedLM"),
        _ => ("bert", "BertForMaskedLM"),
    };
    let mask_token = match cfg.mask_token() {
        Some(id) => id,
        None => mask_token_id(cfg.path().parent().unwrap_or(Path::new(".")), roberta)?,
    };
    if types == 0 {
        bail!("{path}: type_vocab_size = 0 leaves no token type for a text");
    }

    let big_bird_attention = match big_bird {
        true => Some(super::big_bird::attention(cfg, heads, attn_dropout)?),
        false => None,
    };
    // the kinds whose projections sit in a module of their own
    let nested = longformer || big_bird_attention.as_ref().is_some_and(|a| a["kind"].as_str() == Some("bigbird"));

    let e = format!("{p}.embeddings");
    let positions = Recipe::copy(format!("{e}.position_embeddings.weight"));
    let positions = if offset > 0 { Recipe::SkipRows(Box::new(positions), offset) } else { positions };
    let (head, transform) = if roberta {
        ("lm_head", ["lm_head.dense", "lm_head.layer_norm"])
    } else {
        ("cls.predictions", ["cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm"])
    };
    let mut tensors = vec![(
        "position.table".to_string(),
        Recipe::PlusRow(Box::new(positions), format!("{e}.token_type_embeddings.weight"), 0),
    )];
    tensors.extend(embeddings_and_head(&e, head, transform, tied));
    if fnet {
        tensors.push(("embedding_projection.weight".to_string(), Recipe::transpose(format!("{e}.projection.weight"))));
        tensors.push(("embedding_projection.bias".to_string(), Recipe::copy(format!("{e}.projection.bias"))));
    }
    for i in 0..layers {
        let l = format!("{p}.encoder.layer.{i}");
        let b = format!("blocks.{i}");
        // the mixing sublayer's norm: after the attention's output projection, or FNet's Fourier
        let mixing = if fnet { "fourier.output" } else { "attention.output" };
        if !fnet {
            // the nystrom kind's projections sit in `proj`, the longformer and bigbird kinds' in
            // `attention`
            let a = match (nystrom, nested) {
                (true, _) => format!("{b}.attn.proj"),
                (_, true) => format!("{b}.attn.attention"),
                _ => format!("{b}.attn"),
            };
            tensors.extend(attention_projections(&l, &a, ["query", "key", "value"], d));
        }
        if longformer {
            let names = ["query_global", "key_global", "value_global"];
            tensors.extend(fused_qkv(&l, &format!("{b}.attn.global_qkv.qkv"), names, d));
        }
        if let Some(k) = conv {
            // transformers' Conv2d kernel (k × 1) per head, variorum's Conv1d (k) per head
            let stored = Recipe::copy(format!("{l}.attention.self.conv.weight"));
            tensors.push((
                format!("{b}.attn.conv.weight"),
                Recipe::Reshape(Box::new(stored), vec![heads, 1, k, 1], vec![heads, 1, k]),
            ));
        }
        tensors.extend(post_ln_norms_and_ffn(&l, &b, mixing));
    }

    // BigBird's embeddings times √d before the positions are added
    let scale_embeddings = big_bird && cfg.bool_or("rescale_embeddings", false)?;
    let attention = match (fnet, landmarks) {
        (true, _) => table([("kind", "fnet".into())]),
        _ if big_bird => big_bird_attention.expect("read above"),
        _ if longformer => {
            // a one-sided reach of attention_window / 2: w = that + 1 keys back, that many ahead
            let keys: Vec<usize> = windows.iter().map(|w| w / 2 + 1).collect();
            let mut a = vec![
                ("kind", "longformer".into()),
                ("n_heads", int(heads)),
                ("bias", true.into()),
                ("dropout", attn_dropout.into()),
                ("window", int(keys[0])),
                ("global_projections", "separate".into()),
            ];
            if keys.iter().any(|&k| k != keys[0]) {
                a.push(("layer_windows", toml::Value::Array(keys.iter().map(|&k| int(k)).collect())));
            }
            table(a)
        }
        (false, Some(m)) => {
            let mut a = vec![
                ("kind", "nystrom".into()),
                ("n_heads", int(heads)),
                ("bias", true.into()),
                ("dropout", attn_dropout.into()),
                ("landmarks", int(m)),
                ("pinv_iterations", int(6)),
                ("pinv_scale", "batch".into()),
            ];
            if let Some(k) = conv {
                a.push(("conv_kernel", int(k)));
            }
            table(a)
        }
        (false, None) => table([
            ("kind", "full".into()),
            ("n_heads", int(heads)),
            ("bias", true.into()),
            ("dropout", attn_dropout.into()),
        ]),
    };
    let sizes = Sizes { vocab, d, layers, seq_len: table_rows - offset, dropout, tied };
    let scaled = scale_embeddings.then(|| ("scale_embeddings", true.into()));
    let model = sizes.model(scaled.into_iter().chain([
        ("embedding_norm", true.into()),
        ("embedding_projection", fnet.into()),
        ("head_transform", true.into()),
        ("head_bias", true.into()),
        ("position", table([("kind", "learned".into())])),
        ("attention", attention),
        ("block", table([("kind", "post-ln".into()), ("norm", "layer-norm".into()), ("norm_eps", eps.into())])),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
        ("objective", table([("kind", "masked".into()), ("mask_token", int(mask_token))])),
    ]));
    Ok(Mapping {
        class,
        model,
        tensors,
        // the tied decoder (and its bias, the head's own under another name); the pooler and
        // next-sentence head of pretraining checkpoints, which the masked LM does not read
        derived: |name| {
            name.ends_with("predictions.decoder.weight")
                || name.ends_with("predictions.decoder.bias")
                || name == "lm_head.decoder.weight"
                || name == "lm_head.decoder.bias"
                || name.ends_with("embeddings.position_ids")
                || name.ends_with("embeddings.token_type_ids")
                || name.contains(".pooler.")
                || name.starts_with("cls.seq_relationship.")
        },
    })
}

/// The token embedding, the LayerNorm on the embedded input and the MLM head of a BERT-style
/// checkpoint: `e` the embeddings' module, `head` the head's (its `bias`, and its
/// `decoder.weight` when not `tied`), `transform` its dense layer and LayerNorm.
pub(crate) fn embeddings_and_head(e: &str, head: &str, transform: [&str; 2], tied: bool) -> Vec<(String, Recipe)> {
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{e}.word_embeddings.weight"))),
        ("embedding_norm.gamma".to_string(), Recipe::copy(format!("{e}.LayerNorm.weight"))),
        ("embedding_norm.beta".to_string(), Recipe::copy(format!("{e}.LayerNorm.bias"))),
        ("head_transform.dense.weight".to_string(), Recipe::transpose(format!("{}.weight", transform[0]))),
        ("head_transform.dense.bias".to_string(), Recipe::copy(format!("{}.bias", transform[0]))),
        ("head_transform.norm.gamma".to_string(), Recipe::copy(format!("{}.weight", transform[1]))),
        ("head_transform.norm.beta".to_string(), Recipe::copy(format!("{}.bias", transform[1]))),
        ("head_bias".to_string(), Recipe::copy(format!("{head}.bias"))),
    ];
    if !tied {
        tensors.push(("head.weight".to_string(), Recipe::transpose(format!("{head}.decoder.weight"))));
    }
    tensors
}

/// The query, key and value projections of checkpoint layer `l` (`attention.self.<names>`, each
/// `width` outputs) joined into variorum's fused projection `qkv` (its weight and bias).
pub(crate) fn fused_qkv(l: &str, qkv: &str, names: [&str; 3], width: usize) -> [(String, Recipe); 2] {
    let join = |suffix: &str, part: fn(String) -> Recipe| {
        Recipe::Join(names.iter().map(|q| (part(format!("{l}.attention.self.{q}.{suffix}")), width)).collect())
    };
    [(format!("{qkv}.weight"), join("weight", Recipe::Transpose)), (format!("{qkv}.bias"), join("bias", Recipe::Copy))]
}

/// [`fused_qkv`] into attention module `a`, and its output projection.
pub(crate) fn attention_projections(l: &str, a: &str, names: [&str; 3], width: usize) -> Vec<(String, Recipe)> {
    let mut tensors = fused_qkv(l, &format!("{a}.qkv.qkv"), names, width).to_vec();
    tensors.extend([
        (format!("{a}.out.weight"), Recipe::transpose(format!("{l}.attention.output.dense.weight"))),
        (format!("{a}.out.bias"), Recipe::copy(format!("{l}.attention.output.dense.bias"))),
    ]);
    tensors
}

/// The two LayerNorms and the FFN of post-LN checkpoint layer `l` as variorum's block `b`:
/// `mixing` is the module whose output LayerNorm follows the token mixing (`attention.output`).
pub(crate) fn post_ln_norms_and_ffn(l: &str, b: &str, mixing: &str) -> [(String, Recipe); 8] {
    let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
    let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
    [
        (format!("{b}.attn_norm.gamma"), c(&format!("{mixing}.LayerNorm.weight"))),
        (format!("{b}.attn_norm.beta"), c(&format!("{mixing}.LayerNorm.bias"))),
        (format!("{b}.ffn.up.weight"), t("intermediate.dense")),
        (format!("{b}.ffn.up.bias"), c("intermediate.dense.bias")),
        (format!("{b}.ffn.down.weight"), t("output.dense")),
        (format!("{b}.ffn.down.bias"), c("output.dense.bias")),
        (format!("{b}.ffn_norm.gamma"), c("output.LayerNorm.weight")),
        (format!("{b}.ffn_norm.beta"), c("output.LayerNorm.bias")),
    ]
}

/// Longformer's `attention_window`: one even width for every layer, or a list of one per layer.
fn attention_windows(cfg: &mut HfConfig, layers: usize) -> Result<Vec<usize>> {
    let path = cfg.path().display().to_string();
    let windows = match cfg.array("attention_window") {
        Ok(Some(list)) => list.iter().map(|w| w.as_u64().map(|w| w as usize)).collect::<Option<Vec<_>>>(),
        Ok(None) => Some(vec![512; layers]),
        Err(_) => Some(vec![cfg.usize("attention_window")?; layers]),
    };
    let windows = windows.ok_or_else(|| anyhow!("{path}: attention_window is not a width or a list of widths"))?;
    if windows.len() != layers {
        bail!("{path}: attention_window lists {} widths for {layers} layers", windows.len());
    }
    if let Some(w) = windows.iter().find(|&&w| w == 0 || w % 2 == 1) {
        bail!("{path}: attention_window = {w}: transformers needs a positive even width");
    }
    Ok(windows)
}

/// The id of the tokenizer's mask token: the `mask_token` of `tokenizer_config.json` (BERT's
/// `[MASK]`, RoBERTa's `<mask>` by default), looked up in `tokenizer.json`'s added tokens.
pub(crate) fn mask_token_id(dir: &Path, roberta: bool) -> Result<usize> {
    let read = |name: &str| -> Result<Option<Value>> {
        let file = dir.join(name);
        if !file.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&file).map_err(|e| anyhow!("{} cannot be read: {e}", file.display()))?;
        serde_json::from_str(&text).map(Some).map_err(|e| anyhow!("{} is not JSON: {e}", file.display()))
    };
    let mut token = if roberta { "<mask>" } else { "[MASK]" }.to_string();
    if let Some(config) = read("tokenizer_config.json")? {
        match &config["mask_token"] {
            Value::String(s) => token = s.clone(),
            Value::Object(o) => token = o.get("content").and_then(Value::as_str).unwrap_or(&token).to_string(),
            _ => {}
        }
    }
    let tokenizer = dir.join("tokenizer.json");
    let added = read("tokenizer.json")?.map(|t| t["added_tokens"].clone()).unwrap_or(Value::Null);
    added
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["content"].as_str() == Some(&token))
        .and_then(|t| t["id"].as_u64())
        .map(|id| id as usize)
        .ok_or_else(|| anyhow!("{}: no mask token {token:?} among the added tokens", tokenizer.display()))
}

/// The `config.json` of a masked run's model (`m`: its expanded `[model]` as JSON) as BERT;
/// `export` reads it back with [`map`] and refuses the run unless that gives the same model.
/// One token type, whose embedding (zeros) the position table already holds.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("num_hidden_layers", m["n_layers"].clone()),
        ("num_attention_heads", m["attention"]["n_heads"].clone()),
        ("intermediate_size", m["feed_forward"]["d_ff"].clone()),
        ("hidden_act", super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu").into()),
        ("hidden_dropout_prob", m["dropout"].clone()),
        ("attention_probs_dropout_prob", m["attention"]["dropout"].clone()),
        ("max_position_embeddings", m["seq_len"].clone()),
        ("type_vocab_size", 1.into()),
        ("layer_norm_eps", m["block"]["norm_eps"].clone()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The `config.json` of a masked run with Fourier mixing (`m`: its expanded `[model]` as JSON)
/// as FNet; `export` reads it back with [`map`] and refuses the run unless that gives the same
/// model.
pub(crate) fn fnet_config_json(m: &Value) -> Map<String, Value> {
    let pairs = [
        ("vocab_size", m["vocab_size"].clone()),
        ("hidden_size", m["d_model"].clone()),
        ("num_hidden_layers", m["n_layers"].clone()),
        ("intermediate_size", m["feed_forward"]["d_ff"].clone()),
        ("hidden_act", super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu_new").into()),
        ("hidden_dropout_prob", m["dropout"].clone()),
        ("max_position_embeddings", m["seq_len"].clone()),
        ("type_vocab_size", 1.into()),
        ("layer_norm_eps", m["block"]["norm_eps"].clone()),
        ("use_tpu_fourier_optimizations", false.into()),
        ("tie_word_embeddings", m["tie_embeddings"].clone()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The `config.json` of a masked run with the `nystrom` kind (`m`: its expanded `[model]` as
/// JSON) as Nyströmformer; `export` reads it back with [`map`] and refuses the run unless that
/// gives the same model. transformers approximates at one length, `segment_means_seq_len`: the
/// run's `seq_len`, which its landmarks must divide; with a landmark per position
/// (`landmarks = seq_len`) it computes softmax attention at every length, as the kind does.
pub(crate) fn nystromformer_config_json(m: &Value) -> Map<String, Value> {
    let mut json = config_json(m);
    json.insert("hidden_act".into(), super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu_new").into());
    let a = &m["attention"];
    json.insert("num_landmarks".into(), a["landmarks"].clone());
    json.insert("segment_means_seq_len".into(), m["seq_len"].clone());
    json.insert("conv_kernel_size".into(), a["conv_kernel"].clone());
    json.insert("inv_coeff_init_option".into(), false.into());
    json
}

/// The `config.json` of a masked run with the `bigbird` kind in transformers' layout (the
/// settings the import writes) or full attention with `scale_embeddings` (`m`: its expanded
/// `[model]` as JSON) as BigBird; `export` reads it back with [`map`] and refuses the run unless
/// that gives the same model (a seeded random draw, say, which transformers draws only in
/// training and anew every step).
pub(crate) fn big_bird_config_json(m: &Value) -> Map<String, Value> {
    let mut json = config_json(m);
    json.insert("hidden_act".into(), super::hf_activation(m["feed_forward"]["kind"].as_str(), "gelu_new").into());
    let a = &m["attention"];
    let sparse = a["kind"].as_str() == Some("bigbird");
    json.insert("attention_type".into(), if sparse { "block_sparse" } else { "original_full" }.into());
    if sparse {
        json.insert("block_size".into(), a["block"].clone());
        json.insert("num_random_blocks".into(), a["random_blocks"].clone());
    }
    json.insert("use_bias".into(), true.into());
    json.insert("rescale_embeddings".into(), m["scale_embeddings"].clone());
    json
}

/// The `config.json` of a masked run with the `longformer` kind (`m`: its expanded `[model]` as
/// JSON, with `pad_token_id`: the run's padding token, which export finds in its tokenizer) as
/// Longformer; `export` reads it back with [`map`] and refuses the run unless that gives the same
/// model. Longformer numbers positions from `pad_token_id + 1` (RoBERTa's embeddings): the
/// table's rows before are written as zeros. A window of w keys back is `attention_window`
/// 2(w − 1), per layer where the run has `layer_windows`.
pub(crate) fn longformer_config_json(m: &Value) -> Map<String, Value> {
    let mut json = config_json(m);
    let a = &m["attention"];
    let width = |w: &Value| w.as_u64().map_or(Value::Null, |w| (2 * w.saturating_sub(1)).into());
    let windows: Vec<Value> = match a["layer_windows"].as_array() {
        Some(per_layer) => per_layer.iter().map(width).collect(),
        None => vec![width(&a["window"]); m["n_layers"].as_u64().unwrap_or(0) as usize],
    };
    let pad = m["pad_token_id"].as_u64().unwrap_or_default();
    json.insert("attention_window".into(), Value::Array(windows));
    json.insert("attention_mode".into(), "longformer".into());
    json.insert("pad_token_id".into(), pad.into());
    json.insert("max_position_embeddings".into(), (m["seq_len"].as_u64().unwrap_or_default() + pad + 1).into());
    json
}
