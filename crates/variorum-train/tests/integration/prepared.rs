//! Training from a prepared corpus (`data.sources`, `data.prepared`): `train` prepares the
//! sources itself, reads windows from the shards, resumes to the uninterrupted run's bytes,
//! reports the mixture it drew, and refuses shards that are not its own.

use std::path::Path;

use crate::common::{corpus, seeded, tiny_config};
use burn::prelude::*;
use variorum_data::SourceConfig;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

fn options(run: &Path) -> TrainOptions {
    TrainOptions::new(run, Device::flex(), "flex")
}

/// Two sources: the test corpus cut into 30 text files, and 60 JSON Lines documents; weights
/// 1 : 3.
fn prepared_config(root: &Path) -> ExperimentConfig {
    let text = std::fs::read_to_string(corpus(root)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (i, part) in lines.chunks(lines.len().div_ceil(30)).enumerate() {
        let dir = root.join("plays");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{i:02}.txt")), part.join("\n") + "\n").unwrap();
    }
    let jsonl: String = (0..60)
        .map(|i| {
            serde_json::json!({ "text": format!("{} whether {i} in the mind\n", lines[i % lines.len()]) }).to_string()
                + "\n"
        })
        .collect();
    std::fs::write(root.join("notes.jsonl"), jsonl).unwrap();
    let mut cfg = tiny_config(&root.join("corpus.txt"), 0.1);
    cfg.data.path = None;
    cfg.data.val_fraction = 0.2;
    cfg.data.sources = vec![
        SourceConfig { path: root.join("plays").display().to_string(), text_field: None, weight: Some(1.0) },
        SourceConfig {
            path: root.join("notes.jsonl").display().to_string(),
            text_field: Some("text".into()),
            weight: Some(3.0),
        },
    ];
    cfg.data.prepared = Some(root.join("prepared"));
    cfg
}

#[test]
fn a_run_on_prepared_shards_resumes_exactly_and_reports_its_mixture() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = prepared_config(tmp.path());
    let summary = resumes_exactly(&cfg, tmp.path());
    assert!(tmp.path().join("prepared/index.json").is_file(), "train prepared the sources first");
    assert!(summary.final_val_loss.unwrap().is_finite());
    let mixture = summary.mixture.expect("a mixture in the summary");
    assert_eq!(mixture.iter().map(|m| m.intended).collect::<Vec<_>>(), vec![0.25, 0.75]);
    assert!((mixture[1].drawn - 0.75).abs() < 0.1, "20 steps × 4 rows: {mixture:?}");
    let json = |d: &str| std::fs::read_to_string(tmp.path().join(d).join("summary.json")).unwrap();
    assert!(json("straight").contains("\"mixture\"") && json("straight").contains("notes.jsonl"));
    // timings differ; the mixture does not
    let mix = |d: &str| serde_json::from_str::<serde_json::Value>(&json(d)).unwrap()["mixture"].clone();
    assert_eq!(mix("straight"), mix("split"));
}

#[test]
fn a_run_refuses_shards_that_are_not_its_own() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = prepared_config(tmp.path());
    let run = tmp.path().join("run");
    let mut opts = options(&run);
    opts.stop_at = Some(2);
    train(cfg.clone(), &opts).unwrap();
    let one_line = |e: anyhow::Error| {
        let e = format!("{e:#}");
        assert!(!e.contains('\n'), "{e}");
        e
    };

    // the corpus alone (data.prepared), asked for with another tokenizer
    let mut alone = cfg.clone();
    alone.data.sources.clear();
    alone.data.tokenizer = variorum_data::TokenizerConfig::Byte;
    let e = one_line(train(alone, &options(&tmp.path().join("byte"))).err().expect("refused"));
    assert!(e.contains("was prepared with data.tokenizer") && e.contains("byte"), "{e}");

    // weights sample random windows; streams read every source in turn
    let mut ordered = cfg.clone();
    ordered.train.batching = variorum_train::config::Batching::Ordered;
    let e = one_line(train(ordered, &options(&tmp.path().join("ordered"))).err().expect("refused"));
    assert!(e.contains("weights") && e.contains("train.batching = \"random\""), "{e}");

    // the sources changed under the run: prepared again, with another character set, and the
    // run's tokenizer no longer made them
    std::fs::write(tmp.path().join("plays/00.txt"), "QXZ: characters the run never saw\n").unwrap();
    let mut opts = options(&run);
    opts.resume = true;
    let e = one_line(train(cfg, &opts).err().expect("refused"));
    assert!(e.contains("prepared with another tokenizer than the run's"), "{e}");
}

/// Trains `cfg` straight, and stopped at step 8 then resumed: the two runs' weights and samples
/// must be the same bytes.
fn resumes_exactly(cfg: &ExperimentConfig, root: &Path) -> variorum_train::Summary {
    let straight = root.join("straight");
    let Outcome::Finished(summary) = train(cfg.clone(), &options(&straight)).unwrap() else { panic!("finishes") };
    let split = root.join("split");
    let mut opts = options(&split);
    opts.stop_at = Some(8);
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Interrupted { step: 8, .. }));
    let mut opts = options(&split);
    opts.resume = true;
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Finished(_)));
    for file in ["model.bpk", "sample.txt"] {
        let read = |d: &Path| std::fs::read(d.join(file)).unwrap();
        assert!(read(&straight) == read(&split), "{:?}: the resumed run's {file} differs", cfg.train.batching);
    }
    summary
}

#[test]
fn memories_train_from_prepared_documents_and_ordered_streams_and_resume_exactly() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = prepared_config(tmp.path());
    cfg.data.sources.iter_mut().for_each(|s| s.weight = None);

    // document streams are a function of the step: a resumed run reads what the straight one read
    let mut documents = cfg.clone();
    documents.train.batching = variorum_train::config::Batching::Documents;
    let summary = resumes_exactly(&documents, &tmp.path().join("documents"));
    assert!(summary.final_val_loss.unwrap().is_finite());
    assert!(summary.mixture.is_none(), "streams draw no mixture");

    // a memory per document: the Memorizing Transformer trains on them (its kNN memory is not
    // checkpointed, so a resumed run starts it afresh: not compared)
    let mut memorizing = documents;
    memorizing.model = toml::from_str(
        "d_model = 32\nn_layers = 2\nseq_len = 16\n[position]\nkind = \"alibi\"\n\
         [attention]\nkind = \"memorizing\"\nn_heads = 4\nmemory_size = 256\ntop_k = 4\n",
    )
    .unwrap();
    let run = tmp.path().join("memorizing");
    let Outcome::Finished(summary) = train(memorizing, &options(&run)).unwrap() else { panic!("finishes") };
    assert!(summary.final_val_loss.unwrap().is_finite());

    // a memory carried from segment to segment: Transformer-XL over ordered streams
    let mut ordered = cfg;
    ordered.model.memory = toml::from_str("kind = \"xl\"\nlength = 16\n").unwrap();
    ordered.model.position = toml::from_str("kind = \"transformer-xl\"\n").unwrap();
    ordered.train.batching = variorum_train::config::Batching::Ordered;
    let summary = resumes_exactly(&ordered, &tmp.path().join("ordered"));
    assert!(summary.final_val_loss.unwrap().is_finite());
}
