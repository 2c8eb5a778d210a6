//! Encoder–decoder models end to end (`model.kind = "encoder-decoder"`, configs/seq2seq/): a
//! reversal task learned from generated pairs and written back for words never seen; cached
//! generation equal to recomputing everything; beam search at least as likely as greedy; each
//! row of a padded batch reading its own source only; span corruption training on a plain text;
//! the data files and configs refused by name where they do not fit.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::seeded;
use variorum_data::{Corpus, pair_eval_batches};
use variorum_train::generate::SampleConfig;
use variorum_train::run::Run;
use variorum_train::seq2seq::{beam_search_from, generate_from, score_examples, target_tokens};
use variorum_train::step::{batch_rows, batch_tensors};
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// configs/seq2seq/reverse.toml on `pairs` (a TSV file), with `settings`.
fn config(pairs: &Path, settings: &[&str]) -> Result<ExperimentConfig, variorum_core::ConfigError> {
    let cfg = ExperimentConfig::load(&repo("configs/seq2seq/reverse.toml")).unwrap();
    let mut all = vec![format!("data.path={}", pairs.display())];
    all.extend(settings.iter().map(|s| s.to_string()));
    cfg.with_settings(&all)
}

fn run_to_end(cfg: ExperimentConfig, dir: &Path) -> f64 {
    let mut opts = TrainOptions::new(dir, Device::flex(), "flex");
    opts.max_steps = Some(cfg.train.steps);
    match train(cfg, &opts).unwrap() {
        Outcome::Finished(s) => s.final_val_loss.unwrap(),
        Outcome::Interrupted { .. } => panic!("not interrupted"),
    }
}

/// 600 random words and their reversals (the shipped file's recipe, another seed).
fn reversal_pairs(dir: &Path) -> PathBuf {
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    };
    let mut text = String::new();
    for _ in 0..600 {
        let len = 3 + next(8) as usize;
        let word: String = (0..len).map(|_| (b'a' + next(26) as u8) as char).collect();
        text.push_str(&format!("{word}\t{}\n", word.chars().rev().collect::<String>()));
    }
    let path = dir.join("reverse.tsv");
    std::fs::write(&path, text).unwrap();
    path
}

/// The model learns to reverse words from 540 pairs and writes the reversal of the 60 held-out
/// words it never saw; cached generation (the source encoded once, cross-attention keys and
/// values kept) writes what recomputing everything for every token writes; beam search finds a
/// target at least as likely as greedy decoding.
#[test]
fn an_encoder_decoder_learns_to_reverse_unseen_words() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let pairs = reversal_pairs(tmp.path());
    let steps = ["train.steps=800", "train.eval_interval=400", "train.checkpoint_interval=800"];
    let loss = run_to_end(config(&pairs, &steps).unwrap(), &tmp.path().join("run"));
    assert!(loss < 0.1, "validation loss per target token {loss:.4}");
    let device = Device::flex();
    let run = Run::load(&tmp.path().join("run"), &device).unwrap();
    let corpus = Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let val = &corpus.pairs.as_ref().unwrap().val;
    assert_eq!(val.len(), 60);
    let greedy = SampleConfig::greedy(20);
    let mut exact = 0;
    for p in val.iter() {
        let written = generate_from(&run.model, &p.source, &greedy, &device, |_| {});
        exact += usize::from(written == p.target);
        if p.line % 6 == 0 {
            let recomputed = generate_from(
                &run.model,
                &p.source,
                &SampleConfig { no_cache: true, ..greedy.clone() },
                &device,
                |_| {},
            );
            assert_eq!(recomputed, written, "line {}: cached and recomputed generation differ", p.line);
            let beam = beam_search_from(&run.model, &p.source, 3, 20, &device);
            let lp = |t: &[u32]| run.score_from(&p.source, t).unwrap().total_logprob / (t.len() + 1) as f64;
            assert!(lp(&beam) >= lp(&written) - 1e-4, "line {}: beam {} < greedy {}", p.line, lp(&beam), lp(&written));
        }
    }
    assert!(exact >= 54, "{exact} of 60 unseen words reversed exactly");
    // `variorum eval`'s measurement: the loss training reported, and chrF near 100
    let batches = pair_eval_batches(
        val,
        &corpus.path,
        run.model.seq_len,
        target_tokens(&run.config.model).unwrap(),
        usize::MAX,
        16,
    )
    .unwrap();
    let vocab = run.config.model.vocab_size.unwrap();
    let s = score_examples(&run.model, &batches, &run.tokenizer, vocab, 1, 60, &device, || {});
    assert!((s.loss - loss).abs() < 1e-4, "eval {} vs training's {loss}", s.loss);
    assert!(s.chrf > 95.0, "chrF {}", s.chrf);
    // export and fine-tuning: the safetensors file initialises a new run with every tensor (the
    // encoder's and the cross-attention's among them), which continues from the trained loss
    let file = tmp.path().join("model.safetensors");
    let names = variorum_train::transfer::export_safetensors(&run.model, &file).unwrap();
    assert!(names.iter().any(|n| n.starts_with("encoder.blocks.")) && names.iter().any(|n| n.contains(".cross.attn.")));
    let tune =
        ["train.steps=1", "train.lr=1e-9", "train.min_lr=1e-10", "train.warmup_steps=0", "train.eval_interval=1"];
    let mut opts = TrainOptions::new(tmp.path().join("tuned"), Device::flex(), "flex");
    opts.init_from = Some(file);
    let Outcome::Finished(t) = train(config(&pairs, &tune).unwrap(), &opts).unwrap() else { panic!("interrupted") };
    let tuned = t.final_val_loss.unwrap();
    assert!((tuned - loss).abs() < 1e-3, "fine-tuning started from {tuned}, the run ended at {loss}");
}

/// A row's logits over its target depend on its own source and target alone: scored in a batch
/// beside pairs of other lengths (its source and target padded) or alone (no padding), they
/// agree.
#[test]
fn each_row_of_a_padded_batch_reads_its_own_source_only() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&reversal_pairs(tmp.path()), &[]).unwrap();
    let corpus = Corpus::load(&cfg.data, None).unwrap();
    let mut model_cfg = cfg.model.clone();
    model_cfg.resolve(corpus.tokenizer.vocab_size()).unwrap();
    let device = Device::flex();
    device.seed(3);
    let model = model_cfg.init(&device);
    let val = &corpus.pairs.as_ref().unwrap().val[..6];
    let end = target_tokens(&model_cfg).unwrap();
    assert!(val.iter().any(|p| p.source.len() != val[0].source.len()), "the rows must differ in length");
    let batch = pair_eval_batches(val, &corpus.path, model_cfg.seq_len, end, 6, 6).unwrap().remove(0);
    let (inputs, _) = batch_tensors(&batch, &device);
    let together = model.forward_tagged(inputs, batch_rows(&batch, &device), None).logits;
    for (r, p) in val.iter().enumerate() {
        let alone =
            pair_eval_batches(std::slice::from_ref(p), &corpus.path, model_cfg.seq_len, end, 1, 1).unwrap().remove(0);
        assert!(alone.seq_len == p.target.len() + 1);
        let (inputs, _) = batch_tensors(&alone, &device);
        let own = model.forward_tagged(inputs, batch_rows(&alone, &device), None).logits;
        let n = alone.seq_len;
        let row = together.clone().narrow(0, r, 1).narrow(1, 0, n);
        let d = (row - own).abs().max().into_scalar::<f32>();
        assert!(d < 1e-5, "row {r}: its logits in the batch differ from alone by {d}");
    }
}

/// T5's span corruption on a plain text: dropped spans are restored from the source, so the
/// loss per target token falls far below the text's unigram entropy; decoding the corrupted
/// validation windows writes their sentinels and spans.
#[test]
fn span_corruption_trains_on_a_plain_text() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let text = common::corpus(tmp.path());
    let settings: Vec<String> = [
        "model.objective.kind=span-corruption",
        "model.seq_len=32",
        "train.steps=300",
        "train.eval_interval=300",
        "train.checkpoint_interval=300",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // the reversal config, reading the text plainly
    let mut cfg = config(&text, &[]).unwrap();
    cfg.data.pairs = None;
    let cfg = cfg.with_settings(&settings).unwrap();
    let loss = run_to_end(cfg, &tmp.path().join("run"));
    // the corpus's characters carry about 3 nats each alone
    assert!(loss < 1.0, "span corruption validation loss {loss:.4}");
    // and the spans are restored from their own source: each row scored against another row's
    // source (the sources rotated by one) loses what the source told it
    let device = Device::flex();
    let run = Run::load(&tmp.path().join("run"), &device).unwrap();
    let corpus = Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let batches = variorum_train::seq2seq::validation_examples(&run.config.model, &corpus, 64, 16).unwrap().unwrap();
    let own = variorum_train::eval::evaluate(&run.model, &batches, &device);
    let swapped: Vec<_> = batches
        .iter()
        .map(|b| {
            let mut b = b.clone();
            b.sources.rotate_left(1);
            b
        })
        .collect();
    let other = variorum_train::eval::evaluate(&run.model, &swapped, &device);
    assert!((own - loss).abs() < 1e-3, "{own} vs training's {loss}");
    assert!(other > own + 0.3, "with another row's source {other:.4}, with its own {own:.4}");
    let sample = std::fs::read_to_string(tmp.path().join("run/sample.txt")).unwrap();
    assert!(sample.starts_with("source: ") && sample.contains("<s0>"), "{sample}");
}

/// What does not fit is refused by name, with the config or the data file.
#[test]
fn mismatched_configs_and_files_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let pairs = reversal_pairs(tmp.path());
    let refused = |settings: &[&str], want: &str| {
        let e = config(&pairs, settings).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(want), "{settings:?}: {e}");
    };
    refused(&["model.kind=decoder"], "model.encoder is set, but model.kind = \"decoder\" has no encoder");
    let mut decoder = config(&pairs, &[]).unwrap();
    decoder.model = variorum_model::ModelConfig {
        kind: variorum_model::ModelKind::Decoder,
        encoder: Default::default(),
        cross_attention: None,
        ..decoder.model
    };
    let e = decoder.validate().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("data.pairs gives every example a source, which only an encoder reads"), "{e}");
    refused(
        &["model.objective.kind=span-corruption"],
        "data.pairs and model.objective.kind = \"span-corruption\" are both set",
    );
    refused(&["model.objective.kind=masked"], "cannot be used with model.kind = \"encoder-decoder\"");
    refused(
        &["model.cross_attention={kind = \"nystrom\"}"],
        "model.cross_attention.kind = \"nystrom\" has no cross-attention form",
    );
    refused(&["model.encoder.attention={kind = \"lsh\"}"], "does not hide padded keys");
    refused(&["train.batching=ordered"], "draws whole examples");
    // the encoder's attention meets the rules the decoder's does: ALiBi needs scores to act on
    refused(
        &["model.position={kind = \"alibi\"}", "model.encoder.attention={kind = \"linear\"}"],
        "the encoder (model.encoder): model.position.kind = \"alibi\" acts on the attention scores",
    );
    // a bad line is named with its file and line, before any training
    let bad = tmp.path().join("bad.tsv");
    std::fs::write(&bad, "abc\tcba\nno tab here\n").unwrap();
    let cfg = config(&bad, &[]).unwrap();
    let mut opts = TrainOptions::new(tmp.path().join("bad-run"), Device::flex(), "flex");
    opts.max_steps = Some(1);
    let e = format!("{:#}", train(cfg, &opts).err().unwrap());
    assert!(e.contains("bad.tsv line 2: no tab between a source and its target"), "{e}");
    // aligned files of different lengths
    std::fs::write(tmp.path().join("src.txt"), "abc\nde\n").unwrap();
    std::fs::write(tmp.path().join("tgt.txt"), "cba\n").unwrap();
    let mut cfg = config(&tmp.path().join("src.txt"), &[]).unwrap();
    cfg.data.pairs = Some(variorum_data::PairsConfig { target_path: Some(tmp.path().join("tgt.txt")) });
    let e = format!("{:#}", train(cfg, &opts).err().unwrap());
    assert!(e.contains("src.txt has 2 lines and") && e.contains("tgt.txt has 1"), "{e}");
}

/// configs/seq2seq/reverse-t5.toml, T5's recipe with one relative bias table per stack
/// (`model.position.shared`): after training, every layer of a stack holds the table its
/// first layer holds (each step's update reaches them all, not the first layer's copy alone),
/// and the run exports as T5.
#[test]
fn t5_tables_shared_by_a_stack_stay_one_through_training() {
    use burn::store::ModuleSnapshot;
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let pairs = reversal_pairs(tmp.path());
    let cfg = ExperimentConfig::load(&repo("configs/seq2seq/reverse-t5.toml")).unwrap();
    let settings = [format!("data.path={}", pairs.display()), "train.steps=20".into(), "train.eval_interval=20".into()];
    let cfg = cfg.with_settings(&settings).unwrap();
    run_to_end(cfg, &tmp.path().join("run"));
    let device = Device::flex();
    let run = Run::load(&tmp.path().join("run"), &device).unwrap();
    let tables = |m: &variorum_model::DecoderLm| -> Vec<(String, Vec<f32>)> {
        m.collect(None, None, true)
            .into_iter()
            .filter(|t| t.name.ends_with("position.table"))
            .map(|t| (t.name.clone(), burn::store::bridge::to_data(&t).unwrap().try_to_vec::<f32>().unwrap()))
            .collect()
    };
    let trained = tables(&run.model);
    assert_eq!(trained.len(), 4, "{:?}", trained.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for stack in ["encoder.blocks.", "blocks."] {
        let layers: Vec<&(String, Vec<f32>)> = trained.iter().filter(|(n, _)| n.starts_with(stack)).collect();
        for (name, values) in &layers[1..] {
            assert_eq!(values, &layers[0].1, "{name} is not {}", layers[0].0);
        }
    }
    let out = tmp.path().join("hf");
    variorum_train::hf::export(&tmp.path().join("run"), &out, &device).unwrap();
    assert!(out.join("model.safetensors").is_file());
}
