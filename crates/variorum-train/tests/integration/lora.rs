//! LoRA (`[train.lora]`, `variorum_train::lora`): the adapted model starts as the base model
//! (B = 0), computes W + (α/r)·A·B once B moves, merges into exactly that, and trains its
//! adapters alone; what a model cannot adapt is refused by name.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use variorum_attention::{AttentionConfig, MultiHeadAttentionConfig};
use variorum_block::FeedForwardKind;
use variorum_model::{DecoderLm, ModelConfig};
use variorum_train::lora::{LoraConfig, LoraTarget, adapter_params, attach};

use crate::common::seeded;

/// A LLaMA-like tiny model: 4 query heads on 2 key/value heads, SwiGLU (gate | value fused).
fn llama_like() -> ModelConfig {
    let mut cfg = ModelConfig {
        attention: AttentionConfig::Full(MultiHeadAttentionConfig {
            n_heads: 4,
            n_kv_heads: Some(2),
            ..Default::default()
        }),
        ..variorum_model::zoo::tiny()
    };
    cfg.feed_forward.kind = FeedForwardKind::Swiglu;
    cfg.validate().unwrap();
    cfg
}

fn every_target(rank: usize) -> LoraConfig {
    use LoraTarget::*;
    LoraConfig { rank, alpha: 3.0, dropout: 0.0, targets: vec![Q, K, V, Out, Up, Gate, Down] }
}

fn tokens(vocab: usize, device: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..2 * 12).map(|i| (i * 5 + 3) % vocab as i64).collect();
    Tensor::from_data(TensorData::new(v, [2, 12]), device)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

/// Every adapter factor B redrawn from N(0, 0.5²), as training would have moved it.
struct MoveB(Vec<String>);

impl ModuleMapper for MoveB {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.0.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.0.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.0.iter().any(|m| m == "lora") && self.0.last().is_some_and(|m| m == "b") {
            param.map(|t| {
                let moved = Tensor::random(t.shape(), burn::tensor::Distribution::Normal(0.0, 0.5), &t.device());
                if t.is_require_grad() { moved.require_grad() } else { moved }
            })
        } else {
            param
        }
    }
}

/// `(path, id, values)` of every parameter.
#[derive(Default)]
struct Params {
    path: Vec<String>,
    found: Vec<(String, ParamId, Vec<f32>, Vec<usize>)>,
}

impl ModuleVisitor for Params {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        let dims = t.dims().to_vec();
        self.found.push((
            self.path.join("."),
            param.id,
            t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap(),
            dims,
        ));
    }
}

fn params(m: &DecoderLm) -> Vec<(String, ParamId, Vec<f32>, Vec<usize>)> {
    let mut p = Params::default();
    m.visit(&mut p);
    p.found
}

#[test]
fn the_adapted_model_starts_as_the_base_and_merges_to_what_it_computes() {
    let _guard = seeded();
    let device = Device::flex();
    device.seed(3);
    let cfg = llama_like();
    let base = cfg.init(&device);
    let x = tokens(cfg.vocab(), &device);
    let adapted = attach(base.clone(), &cfg, &every_target(2)).unwrap();
    // B = 0: bit for bit the base model's logits
    let diff = max_diff(base.forward(x.clone()).logits, adapted.forward(x.clone()).logits);
    assert_eq!(diff, 0.0, "B = 0 changed the logits by {diff}");

    let moved = adapted.map(&mut MoveB(Vec::new()));
    let unmerged = moved.forward(x.clone()).logits;
    assert!(max_diff(unmerged.clone(), base.forward(x.clone()).logits) > 1e-2, "the adapters changed nothing");
    let merged = moved.clone().materialize();
    let diff = max_diff(unmerged, merged.forward(x.clone()).logits);
    assert!(diff < 1e-5, "merged and unmerged logits differ by {diff}");

    // the merged weights are W + (α/r)·A·B, block by block: the fused q | k | v of layer 0
    // (q 4 heads × 8, k and v 2 heads × 8 each) and the SwiGLU's gate | value
    let (before, after, merged) = (params(&base), params(&moved), params(&merged));
    let value = |set: &[(String, ParamId, Vec<f32>, Vec<usize>)], stem: &str, tail: &str| {
        let hit: Vec<_> = set.iter().filter(|(p, ..)| p.starts_with(stem) && p.ends_with(tail)).collect();
        assert_eq!(hit.len(), 1, "{stem}…{tail}: {:?}", set.iter().map(|(p, ..)| p).collect::<Vec<_>>());
        (hit[0].2.clone(), hit[0].3.clone())
    };
    for (stem, weight, parts) in
        [("blocks.0.attn.", "qkv.qkv.weight", &[32usize, 16, 16][..]), ("blocks.0.ffn.", "up.weight", &[64, 64][..])]
    {
        let (w, dims) = value(&before, stem, weight);
        let (w_merged, _) = value(&merged, stem, weight);
        let (d_in, d_out) = (dims[0], dims[1]);
        assert_eq!(d_out, parts.iter().sum::<usize>());
        let mut start = 0;
        for (i, &width) in parts.iter().enumerate() {
            let (a, _) = value(&after, stem, &format!("{weight}.lora.parts.{i}.a"));
            let (b, _) = value(&after, stem, &format!("{weight}.lora.parts.{i}.b"));
            let r = a.len() / d_in;
            for row in 0..d_in {
                for col in 0..width {
                    let ab: f32 = (0..r).map(|k| a[row * r + k] * b[k * width + col]).sum();
                    let want = w[row * d_out + start + col] + 3.0 / r as f32 * ab;
                    let got = w_merged[row * d_out + start + col];
                    assert!((want - got).abs() < 1e-5, "{stem}{weight} part {i} [{row}, {col}]: {got} ≠ {want}");
                }
            }
            start += width;
        }
    }
    // the adapters: 2 layers × (q, k, v, out, gate, up, down), each r·(d_in + width)
    let per_layer = 2 * ((32 + 32) + (32 + 16) * 2 + (32 + 32) + (32 + 64) * 2 + (64 + 32));
    assert_eq!(adapter_params(&moved), 2 * per_layer);
}

#[test]
fn gradients_reach_the_adapters_alone() {
    let _guard = seeded();
    let device = Device::flex().autodiff();
    device.seed(4);
    let cfg = llama_like();
    let adapted = attach(cfg.init(&device), &cfg, &every_target(2)).unwrap().map(&mut MoveB(Vec::new()));
    let x = tokens(cfg.vocab(), &device);
    let (_, _, grads) = adapted.loss_and_grads(x.clone(), x, None, None, 1);
    let all = params(&adapted);
    let adapters: Vec<&(String, ParamId, Vec<f32>, Vec<usize>)> =
        all.iter().filter(|(p, ..)| p.contains(".lora.")).collect();
    // 2 layers × 7 adapted column blocks (q, k, v, out, gate, up, down) × (A, B)
    assert_eq!(adapters.len(), 2 * 7 * 2, "{:?}", adapters.iter().map(|(p, ..)| p).collect::<Vec<_>>());
    for (path, id, _, dims) in &all {
        let grad = match dims.len() {
            1 => grads.get::<1>(*id).map(|g| g.abs().max().into_scalar::<f32>()),
            2 => grads.get::<2>(*id).map(|g| g.abs().max().into_scalar::<f32>()),
            3 => grads.get::<3>(*id).map(|g| g.abs().max().into_scalar::<f32>()),
            n => panic!("{path}: a parameter of rank {n}"),
        };
        if path.contains(".lora.") {
            assert!(grad.is_some_and(|g| g > 0.0), "{path}: no gradient ({grad:?})");
        } else {
            assert!(grad.is_none(), "{path}, frozen, has a gradient");
        }
    }
}

#[test]
fn what_a_model_cannot_adapt_is_refused_by_name() {
    let device = Device::flex();
    let cfg = llama_like();
    let refused = |cfg: &ModelConfig, lora: LoraConfig| {
        format!("{:#}", attach(cfg.init(&device), cfg, &lora).map(|_| ()).unwrap_err())
    };
    let e = refused(&cfg, LoraConfig { rank: 0, ..Default::default() });
    assert!(e.contains("train.lora.rank = 0"), "{e}");
    // the value columns of layer 0 are 2 heads × 8 wide
    let e = refused(&cfg, LoraConfig { rank: 17, targets: vec![LoraTarget::V], ..Default::default() });
    assert!(e.contains("train.lora.rank = 17 exceeds") && e.contains("v projection"), "{e}");
    // a plain FFN has no gate
    let gelu = ModelConfig { feed_forward: variorum_model::zoo::tiny().feed_forward, ..cfg.clone() };
    let e = refused(&gelu, LoraConfig { targets: vec![LoraTarget::Gate], ..Default::default() });
    assert!(e.contains("\"gate\"") && e.contains("model.feed_forward.kind = \"gelu\""), "{e}");
    // FNet mixes with a Fourier transform: no q, k or v
    let fnet = ModelConfig { attention: AttentionConfig::Fnet(Default::default()), ..cfg };
    let e = refused(&fnet, LoraConfig::default());
    assert!(e.contains("\"q\"") && e.contains("model.attention.kind = \"fnet\""), "{e}");
}

fn options(run: &std::path::Path) -> variorum_train::TrainOptions {
    let mut opts = variorum_train::TrainOptions::new(run, Device::flex(), "flex");
    opts.progress = false;
    opts.report = false;
    opts
}

/// A LoRA run end to end (`train --init-from BASE` with `[train.lora]`): its weights files hold
/// the adapters alone and `lora-base.json` the base's sha256; the loaded run computes the base
/// weights untouched plus its adapters; stopped and resumed it writes the uninterrupted run's
/// bytes (LoRA's dropout included); `--merge` gives a plain model computing the same; a changed base, a LoRA run without
/// `--init-from`, `[train.freeze]` beside it, an export without `--merge` and `--merge` on a run
/// without adapters are refused in one line.
#[test]
fn a_lora_run_keeps_its_adapters_apart_resumes_exactly_and_merges() {
    use variorum_train::{Outcome, train};
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let text = crate::common::corpus(tmp.path());
    let base_cfg = crate::common::tiny_config(&text, 0.1);
    let base = tmp.path().join("base");
    train(base_cfg.clone(), &options(&base)).unwrap();

    let mut cfg = base_cfg.clone();
    use LoraTarget::*;
    // with LoRA's dropout, so that resuming must also restore what it draws
    cfg.train.lora = Some(LoraConfig { rank: 4, alpha: 16.0, dropout: 0.1, targets: vec![Q, V, Out, Down] });
    cfg.train.lr = 1e-2;
    let straight = tmp.path().join("straight");
    let mut opts = options(&straight);
    opts.init_from = Some(base.clone());
    let Outcome::Finished(s) = train(cfg.clone(), &opts).unwrap() else { panic!("interrupted") };
    let base_summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("summary.json")).unwrap()).unwrap();
    let base_loss = base_summary["final_val_loss"].as_f64().unwrap();
    assert!(s.final_val_loss.unwrap() < base_loss, "LoRA {:?} vs base {base_loss}", s.final_val_loss);

    // the weights file: the adapters alone, 2 layers × (q, v, out, down) × (A, B)
    let adapters = std::fs::metadata(straight.join("model.bpk")).unwrap().len();
    let whole = std::fs::metadata(base.join("model.bpk")).unwrap().len();
    assert!(adapters * 4 < whole, "model.bpk is {adapters} bytes, the base's {whole}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(straight.join("lora-base.json")).unwrap()).unwrap();
    let sha = variorum_train::lora::sha256_file(&base.join("model.bpk")).unwrap();
    assert_eq!(record["sha256"], sha);

    // loaded: the base's weights, untouched, under its adapters
    let device = Device::flex();
    let (tuned, original) = (
        variorum_train::run::Run::load(&straight, &device).unwrap(),
        variorum_train::run::Run::load(&base, &device).unwrap(),
    );
    let frozen: Vec<_> = params(&tuned.model).into_iter().filter(|(p, ..)| !p.contains(".lora.")).collect();
    let before = params(&original.model);
    assert_eq!(frozen.len(), before.len());
    for ((p, _, a, _), (q, _, b, _)) in frozen.iter().zip(&before) {
        assert_eq!((p, a), (q, b), "{p} moved");
    }
    assert_eq!(adapter_params(&tuned.model), 2 * 4 * (32 + 32 + 32 + 32 + 32 + 32 + 128 + 32));

    // stopped at step 8 and resumed: the same bytes
    let split = tmp.path().join("split");
    let mut opts = options(&split);
    opts.init_from = Some(base.clone());
    opts.stop_at = Some(8);
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Interrupted { step: 8, .. }));
    let mut opts = options(&split);
    opts.resume = true;
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Finished(_)));
    for file in ["model.bpk", "sample.txt"] {
        let (x, y) = (std::fs::read(straight.join(file)).unwrap(), std::fs::read(split.join(file)).unwrap());
        assert!(x == y, "the resumed LoRA run's {file} differs from the uninterrupted one's");
    }

    // the dropout acts: without it the same run ends elsewhere
    let undropped = tmp.path().join("undropped");
    let mut opts = options(&undropped);
    opts.init_from = Some(base.clone());
    let mut no_dropout = cfg.clone();
    no_dropout.train.lora.as_mut().unwrap().dropout = 0.0;
    train(no_dropout, &opts).unwrap();
    let (x, y) =
        (std::fs::read(straight.join("model.bpk")).unwrap(), std::fs::read(undropped.join("model.bpk")).unwrap());
    assert!(x != y, "train.lora.dropout = 0.1 trained the same adapters as 0");

    // merged: a plain model computing what the adapted one does
    let x = tokens(tuned.model.vocab_size, &device);
    let adapted = tuned.model.forward(x.clone()).logits;
    let merged = variorum_train::lora::for_export(tuned, true).unwrap();
    assert_eq!(adapter_params(&merged.model), 0);
    let diff = max_diff(adapted, merged.model.forward(x).logits);
    assert!(diff < 1e-5, "merged logits differ by {diff}");

    // refusals, one line each
    let one_line = |e: anyhow::Error| {
        let e = format!("{e:#}");
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let e = one_line(
        variorum_train::lora::for_export(variorum_train::run::Run::load(&straight, &device).unwrap(), false)
            .err()
            .unwrap(),
    );
    assert!(e.contains("is a LoRA run: --merge"), "{e}");
    let e = one_line(
        variorum_train::lora::for_export(variorum_train::run::Run::load(&base, &device).unwrap(), true).err().unwrap(),
    );
    assert!(e.contains("has none"), "{e}");
    let e = one_line(train(cfg.clone(), &options(&tmp.path().join("no-base"))).err().unwrap());
    assert!(e.contains("--init-from"), "{e}");
    let frozen_too = cfg.with_settings(&["train.freeze.embeddings=true".to_string()]);
    assert!(frozen_too.unwrap_err().to_string().contains("train.freeze with train.lora"));
    // the base changes under the adapters
    let mut bytes = std::fs::read(base.join("model.bpk")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(base.join("model.bpk"), bytes).unwrap();
    let e = one_line(variorum_train::run::Run::load(&straight, &device).err().unwrap());
    assert!(e.contains("have changed since"), "{e}");
}

/// The same properties across the models LoRA must work with: an encoder–decoder (T5's
/// recipe: self- and cross-attention in both stacks, a gated FFN), a Transformer-XL memory,
/// a kernelised kind (Performer, its projections wrapped) and layers of two kinds in turn. B = 0
/// gives the base's loss exactly; with B moved, merged and unmerged agree within 1e-5.
#[test]
fn lora_adapts_encoder_decoders_memories_and_other_kinds() {
    use variorum_block::{MemoryConfig, XlMemoryConfig};
    use variorum_model::Source;
    use variorum_model::zoo::{t5_recipe, tiny};
    let _guard = seeded();
    let device = Device::flex();
    let kinds = |toml: &str| -> AttentionConfig { toml::from_str(toml).unwrap() };
    let mut performer = tiny();
    performer.attention = kinds("kind = \"performer\"\nn_heads = 4\nfeatures = 8\nredraw_interval = 0");
    let mut interleaved = tiny();
    interleaved.attention = kinds(
        "kind = \"interleaved\"\n[[layers]]\nkind = \"full\"\nn_heads = 4\n[[layers]]\nkind = \"local\"\nn_heads = 4\nblock = 4",
    );
    let memory = ModelConfig {
        seq_len: 6,
        memory: MemoryConfig::Xl(XlMemoryConfig { length: 6 }),
        position: variorum_position::PositionConfig::TransformerXl(Default::default()),
        ..tiny()
    };
    use LoraTarget::*;
    let plain = vec![Q, K, V, Out, Up, Down];
    let models = [
        ("encoder-decoder", t5_recipe(), vec![Q, K, V, Out, Up, Gate, Down]),
        ("memory", memory, plain.clone()),
        ("performer", performer, plain.clone()),
        ("interleaved", interleaved, plain),
    ];
    for (name, cfg, targets) in models {
        cfg.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        device.seed(9);
        let base = cfg.init(&device);
        let lora = LoraConfig { rank: 2, alpha: 4.0, dropout: 0.0, targets };
        let adapted = attach(base.clone(), &cfg, &lora).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let x = tokens(cfg.vocab(), &device).slice([0..2, 0..cfg.seq_len.min(12)]);
        let source = cfg.is_encoder_decoder().then(|| Source { tokens: tokens(cfg.vocab(), &device), padding: None });
        let loss = |m: &DecoderLm| -> f32 {
            let rows = source.clone().map(variorum_model::Rows::from).unwrap_or_default();
            m.loss_with(x.clone(), x.clone(), rows, None).0.into_scalar::<f32>()
        };
        assert_eq!(loss(&base), loss(&adapted), "{name}: B = 0 changed the loss");
        let moved = adapted.map(&mut MoveB(Vec::new()));
        let (unmerged, merged) = (loss(&moved), loss(&moved.clone().materialize()));
        assert!((unmerged - loss(&base)).abs() > 1e-3, "{name}: the adapters changed nothing");
        assert!((unmerged - merged).abs() < 1e-5, "{name}: merged {merged} vs unmerged {unmerged}");
    }
}
