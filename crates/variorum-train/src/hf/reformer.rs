//! Reformer as a masked language model (`model_type = "reformer"`, `ReformerForMaskedLM`;
//! Kitaev et al. 2020): token embeddings plus axial positions (`axial`), a reversible stack
//! whose two output streams are concatenated (`reversible`, `merge = "concat"`), each layer's
//! attention pre-LN without biases, local or LSH as `attn_layers` lists them (`interleaved`
//! when both occur), a ReLU (or other) FFN, a LayerNorm over both streams and an untied head
//! 2·d wide with a bias.
//!
//! Local layers are the `local` kind with `wrap = true` (transformers' local chunks wrap
//! around: the first chunk's previous one is the last) and LSH layers the `lsh` kind with
//! `layout = "transformers"`. transformers pads a text longer than the smallest chunk to a
//! multiple of the least common multiple of the chunks (hidden keys; LSH hashes them into a
//! bucket of their own); every layer pads to that multiple (`pad_to`), which is the same
//! exactly when one chunk length divides the other, so other pairs are refused. LSH draws its
//! rotations anew at every forward in transformers (from `hash_seed` when set); variorum's are
//! drawn once per layer from its own seed: an import scores as transformers does given the same
//! rotations (the test hands it transformers' draw), and otherwise as transformers does with
//! another draw.
//!
//! `ReformerModelWithLMHead` (`is_decoder = true`) is refused: its causal LSH chooses which
//! earlier keys a query sees by hashing later tokens, so its next-token predictions read the
//! future, and its cached generation computes another function.

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::recipe::Recipe;
use super::{Mapping, Sizes, int, table};

pub(crate) fn map(cfg: &mut HfConfig, _ckpt: &Checkpoint) -> Result<Mapping> {
    let path = cfg.path().display().to_string();
    let vocab = cfg.usize("vocab_size")?;
    let d = cfg.usize("hidden_size")?;
    let heads = cfg.usize("num_attention_heads")?;
    let head_dim = cfg.opt_usize("attention_head_size")?.unwrap_or(64);
    let layers = cfg.usize("num_hidden_layers")?;
    let d_ff = cfg.opt_usize("feed_forward_size")?.unwrap_or(512);
    let positions = cfg.opt_usize("max_position_embeddings")?.unwrap_or(4096);
    let eps = cfg.f64_or("layer_norm_eps", 1e-12)?;
    let dropout = cfg.f64_or("hidden_dropout_prob", 0.05)?;
    let ffn = cfg.activation("hidden_act", "relu")?;

    if cfg.bool_or("is_decoder", false)? {
        bail!(
            "{path}: is_decoder = true (ReformerModelWithLMHead) is not supported: transformers' causal LSH picks the keys a query sees by hashing later tokens, so its next-token predictions read the future; variorum imports ReformerForMaskedLM"
        );
    }
    if cfg.bool_or("tie_word_embeddings", false)? {
        bail!(
            "{path}: tie_word_embeddings = true is not supported: Reformer's head reads both streams, 2·hidden_size wide"
        );
    }
    let kinds: Vec<String> = cfg
        .names("attn_layers")?
        .unwrap_or_else(|| ["local", "lsh", "local", "lsh", "local", "lsh"].map(String::from).to_vec());
    if kinds.len() != layers {
        bail!("{path}: attn_layers lists {} layers for num_hidden_layers = {layers}", kinds.len());
    }
    if let Some(other) = kinds.iter().find(|k| *k != "local" && *k != "lsh") {
        bail!("{path}: attn_layers has {other:?}: transformers' Reformer has local and lsh layers");
    }
    let local_chunk = cfg.opt_usize("local_attn_chunk_length")?.unwrap_or(64);
    let lsh_chunk = cfg.opt_usize("lsh_attn_chunk_length")?.unwrap_or(64);
    let used: Vec<usize> = [("local", local_chunk), ("lsh", lsh_chunk)]
        .into_iter()
        .filter(|(k, _)| kinds.iter().any(|x| x == k))
        .map(|(_, c)| c)
        .collect();
    let pad_to = used.iter().copied().max().unwrap_or(1);
    if used.iter().any(|&c| c == 0 || pad_to % c != 0) {
        bail!(
            "{path}: local_attn_chunk_length = {local_chunk} and lsh_attn_chunk_length = {lsh_chunk} are not supported: variorum pads as transformers does when one chunk length divides the other"
        );
    }
    let buckets = match cfg.array("num_buckets") {
        Ok(Some(_)) => {
            bail!("{path}: num_buckets as a list (factorised buckets) is not supported: give one even number")
        }
        Ok(None) => {
            bail!("{path}: num_buckets is not set: transformers chooses it from the first training batch; give it")
        }
        Err(_) => cfg.usize("num_buckets")?,
    };
    let rounds = cfg.opt_usize("num_hashes")?.unwrap_or(1);
    let (local_before, local_after) =
        (cfg.index_or("local_num_chunks_before", 1)?, cfg.index_or("local_num_chunks_after", 0)?);
    let (lsh_before, lsh_after) = (cfg.index_or("lsh_num_chunks_before", 1)?, cfg.index_or("lsh_num_chunks_after", 0)?);
    let position = match cfg.bool_or("axial_pos_embds", true)? {
        true => {
            let list = |cfg: &mut HfConfig, key: &str| -> Result<Vec<usize>> {
                let values = cfg.array(key)?.unwrap_or_default();
                values
                    .iter()
                    .map(|v| v.as_u64().map(|v| v as usize))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| anyhow::anyhow!("{}: {key} is not a list of sizes", cfg.path().display()))
            };
            let (shape, dims) = (list(cfg, "axial_pos_shape")?, list(cfg, "axial_pos_embds_dim")?);
            if shape.len() != 2 || dims.len() != 2 || dims.iter().sum::<usize>() != d {
                bail!(
                    "{path}: axial_pos_shape = {shape:?}, axial_pos_embds_dim = {dims:?}: transformers' Reformer reads two axes whose widths sum to hidden_size = {d}"
                );
            }
            let mut axial =
                vec![("kind", "axial".into()), ("shape", shape.iter().map(|&n| int(n)).collect::<Vec<_>>().into())];
            // the `axial` kind's own split (half each) goes without saying
            if dims != [d / 2, d - d / 2] {
                axial.push(("dims", dims.iter().map(|&n| int(n)).collect::<Vec<_>>().into()));
            }
            table(axial)
        }
        false => table([("kind", "learned".into()), ("max_len", int(positions))]),
    };
    // an init setting; variorum draws its own rotations (module docs); the attention dropouts cannot be
    // replayed by a reversible block's recomputation (model.dropout drops branch outputs); the
    // chunked FFN and head compute the same function; the classification heads' dropout
    cfg.ignore(&[
        "axial_norm_std",
        "hash_seed",
        "lsh_attention_probs_dropout_prob",
        "local_attention_probs_dropout_prob",
        "chunk_size_feed_forward",
        "chunk_size_lm_head",
        "classifier_dropout",
    ]);
    let mask_token = match cfg.mask_token() {
        Some(id) => id,
        None => super::bert::mask_token_id(cfg.path().parent().unwrap_or(std::path::Path::new(".")), true)?,
    };

    let e = "reformer.embeddings";
    let mut tensors = vec![
        ("token_embedding.weight".to_string(), Recipe::copy(format!("{e}.word_embeddings.weight"))),
        ("final_norm.gamma".to_string(), Recipe::copy("reformer.encoder.layer_norm.weight")),
        ("final_norm.beta".to_string(), Recipe::copy("reformer.encoder.layer_norm.bias")),
        ("head.weight".to_string(), Recipe::transpose("lm_head.decoder.weight")),
        // the head's own `bias` parameter, which its forward does not read, written as a copy
        (
            "head_bias".to_string(),
            Recipe::AlsoAs(Box::new(Recipe::copy("lm_head.decoder.bias")), "lm_head.bias".into()),
        ),
    ];
    match position.get("shape").and_then(|s| s.as_array()) {
        Some(shape) => {
            let n = |v: &toml::Value| v.as_integer().unwrap_or(0) as usize;
            let (d1, d2) = match position.get("dims").and_then(|v| v.as_array()) {
                Some(dims) => (n(&dims[0]), n(&dims[1])),
                None => (d / 2, d - d / 2),
            };
            let (n1, n2) = (n(&shape[0]), n(&shape[1]));
            let weights = |i: usize| format!("{e}.position_embeddings.weights.{i}");
            tensors.push((
                "position.tables.0".into(),
                Recipe::Reshape(Box::new(Recipe::copy(weights(0))), vec![n1, 1, d1], vec![n1, d1]),
            ));
            tensors.push((
                "position.tables.1".into(),
                Recipe::Reshape(Box::new(Recipe::copy(weights(1))), vec![1, n2, d2], vec![n2, d2]),
            ));
        }
        None => {
            tensors.push(("position.table".into(), Recipe::copy(format!("{e}.position_embeddings.embedding.weight"))))
        }
    }
    let inner = heads * head_dim;
    for (i, kind) in kinds.iter().enumerate() {
        let l = format!("reformer.encoder.layers.{i}");
        let b = format!("blocks.{i}");
        let c = |name: &str| Recipe::copy(format!("{l}.{name}"));
        let t = |name: &str| Recipe::transpose(format!("{l}.{name}.weight"));
        let s = |name: &str| (Recipe::transpose(format!("{l}.attention.self_attention.{name}.weight")), inner);
        let attention = match kind.as_str() {
            "lsh" => vec![
                (format!("{b}.attn.qv.weight"), Recipe::Join(vec![s("query_key"), s("value")])),
                (format!("{b}.attn.out.weight"), t("attention.output.dense")),
            ],
            _ => vec![
                (format!("{b}.attn.attention.qkv.qkv.weight"), Recipe::Join(vec![s("query"), s("key"), s("value")])),
                (format!("{b}.attn.attention.out.weight"), t("attention.output.dense")),
            ],
        };
        tensors.extend(attention);
        tensors.extend([
            (format!("{b}.attn_norm.gamma"), c("attention.layer_norm.weight")),
            (format!("{b}.attn_norm.beta"), c("attention.layer_norm.bias")),
            (format!("{b}.ffn_norm.gamma"), c("feed_forward.layer_norm.weight")),
            (format!("{b}.ffn_norm.beta"), c("feed_forward.layer_norm.bias")),
            (format!("{b}.ffn.up.weight"), t("feed_forward.dense.dense")),
            (format!("{b}.ffn.up.bias"), c("feed_forward.dense.dense.bias")),
            (format!("{b}.ffn.down.weight"), t("feed_forward.output.dense")),
            (format!("{b}.ffn.down.bias"), c("feed_forward.output.dense.bias")),
        ]);
    }

    let mut shared = vec![("n_heads", int(heads)), ("bias", false.into())];
    if inner != d {
        shared.push(("head_dim", int(head_dim)));
    }
    let with = |mut pairs: Vec<(&'static str, toml::Value)>| {
        pairs.extend(shared.iter().cloned());
        table(pairs)
    };
    // pad_to goes without saying where it is the kind's own chunk
    let padding = |chunk: usize| (pad_to != chunk).then(|| ("pad_to", int(pad_to)));
    let local = with(
        [
            ("kind", "local".into()),
            ("block", int(local_chunk)),
            ("memory", int(local_before * local_chunk)),
            ("look_ahead", int(local_after * local_chunk)),
            ("wrap", true.into()),
        ]
        .into_iter()
        .chain(padding(local_chunk))
        .collect(),
    );
    let lsh = with(
        [
            ("kind", "lsh".into()),
            ("buckets", int(buckets)),
            ("rounds", int(rounds)),
            ("chunk", int(lsh_chunk)),
            ("layout", "transformers".into()),
            ("chunks_before", int(lsh_before)),
            ("chunks_after", int(lsh_after)),
        ]
        .into_iter()
        .chain(padding(lsh_chunk))
        .collect(),
    );
    // the shortest cycle attn_layers repeats: one kind, or an interleaved list
    let period = (1..=layers).find(|&p| (0..layers).all(|i| kinds[i] == kinds[i % p])).unwrap_or(layers);
    let entry = |k: &String| if k == "lsh" { lsh.clone() } else { local.clone() };
    let attention = match period {
        1 => entry(&kinds[0]),
        _ => table([
            ("kind", "interleaved".into()),
            ("layers", toml::Value::Array(kinds[..period].iter().map(entry).collect())),
        ]),
    };
    let sizes = Sizes { vocab, d, layers, seq_len: positions, dropout, tied: false };
    let model = sizes.model([
        ("head_bias", true.into()),
        ("position", position),
        ("attention", attention),
        (
            "block",
            table([
                ("kind", "reversible".into()),
                ("norm", "layer-norm".into()),
                ("norm_eps", eps.into()),
                ("merge", "concat".into()),
            ]),
        ),
        ("feed_forward", table([("kind", ffn.into()), ("d_ff", int(d_ff))])),
        ("objective", table([("kind", "masked".into()), ("mask_token", int(mask_token))])),
    ]);
    Ok(Mapping {
        class: "ReformerForMaskedLM",
        model,
        tensors,
        // the head's own bias parameter, which its forward does not read (the decoder's is read)
        derived: |name| name == "lm_head.bias",
    })
}

/// The `config.json` of a masked run of this recipe (`m`: its expanded `[model]` as JSON) as
/// `ReformerForMaskedLM`; `export` reads it back with [`map`] and refuses the run unless that
/// gives the same model.
pub(crate) fn config_json(m: &Value) -> Map<String, Value> {
    let attention = &m["attention"];
    let layers: Vec<&Value> = match attention["layers"].as_array() {
        Some(list) => list.iter().collect(),
        None => vec![attention],
    };
    let n_layers = m["n_layers"].as_u64().unwrap_or(0) as usize;
    let kind = |a: &Value| a["kind"].as_str().unwrap_or_default().to_string();
    let attn_layers: Vec<Value> = (0..n_layers).map(|i| Value::from(kind(layers[i % layers.len()]))).collect();
    let first = |k: &str| layers.iter().find(|a| kind(a) == k).copied();
    let position = &m["position"];
    let mut json = Map::new();
    let mut put = |k: &str, v: Value| {
        json.insert(k.to_string(), v);
    };
    put("vocab_size", m["vocab_size"].clone());
    put("hidden_size", m["d_model"].clone());
    put("num_hidden_layers", m["n_layers"].clone());
    put("num_attention_heads", layers[0]["n_heads"].clone());
    put("attention_head_size", layers[0]["head_dim"].clone());
    put("feed_forward_size", m["feed_forward"]["d_ff"].clone());
    put("hidden_act", super::hf_activation(m["feed_forward"]["kind"].as_str(), "relu").into());
    put("max_position_embeddings", m["seq_len"].clone());
    put("layer_norm_eps", m["block"]["norm_eps"].clone());
    put("hidden_dropout_prob", m["dropout"].clone());
    put("attn_layers", Value::Array(attn_layers));
    put("axial_pos_embds", (position["kind"] == "axial").into());
    if position["kind"] == "axial" {
        let d = m["d_model"].as_u64().unwrap_or(0);
        put("axial_pos_shape", position["shape"].clone());
        let dims = match position["dims"].is_null() {
            true => Value::Array(vec![(d / 2).into(), (d - d / 2).into()]),
            false => position["dims"].clone(),
        };
        put("axial_pos_embds_dim", dims);
    }
    let whole_chunks = |a: &Value, key: &str| {
        let (n, chunk) = (a[key].as_u64().unwrap_or(0), a["block"].as_u64().unwrap_or(1).max(1));
        Value::from(n / chunk)
    };
    if let Some(local) = first("local") {
        put("local_attn_chunk_length", local["block"].clone());
        put("local_num_chunks_before", whole_chunks(local, "memory"));
        put("local_num_chunks_after", whole_chunks(local, "look_ahead"));
    }
    if let Some(lsh) = first("lsh") {
        put("lsh_attn_chunk_length", lsh["chunk"].clone());
        put("lsh_num_chunks_before", lsh["chunks_before"].clone());
        put("lsh_num_chunks_after", lsh["chunks_after"].clone());
        put("num_buckets", lsh["buckets"].clone());
        put("num_hashes", lsh["rounds"].clone());
    }
    put("is_decoder", false.into());
    put("tie_word_embeddings", false.into());
    json
}
