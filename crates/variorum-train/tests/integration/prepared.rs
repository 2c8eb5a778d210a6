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
    let straight = tmp.path().join("straight");
    let Outcome::Finished(summary) = train(cfg.clone(), &options(&straight)).unwrap() else { panic!("finishes") };
    assert!(tmp.path().join("prepared/index.json").is_file(), "train prepared the sources first");
    assert!(summary.final_val_loss.unwrap().is_finite());
    let mixture = summary.mixture.expect("a mixture in the summary");
    assert_eq!(mixture.iter().map(|m| m.intended).collect::<Vec<_>>(), vec![0.25, 0.75]);
    assert!((mixture[1].drawn - 0.75).abs() < 0.1, "20 steps × 4 rows: {mixture:?}");
    let json = std::fs::read_to_string(straight.join("summary.json")).unwrap();
    assert!(json.contains("\"mixture\"") && json.contains("notes.jsonl"), "{json}");

    let split = tmp.path().join("split");
    let mut opts = options(&split);
    opts.stop_at = Some(8);
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Interrupted { step: 8, .. }));
    let mut opts = options(&split);
    opts.resume = true;
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Finished(_)));
    for file in ["model.bpk", "sample.txt", "summary.json"] {
        let read = |d: &Path| std::fs::read(d.join(file)).unwrap();
        if file == "summary.json" {
            // timings differ; the mixture does not
            let mix = |d: &Path| serde_json::from_slice::<serde_json::Value>(&read(d)).unwrap()["mixture"].clone();
            assert_eq!(mix(&straight), mix(&split));
        } else {
            assert!(read(&straight) == read(&split), "the resumed run's {file} differs");
        }
    }
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

    // ordered batches do not read shards yet
    let mut ordered = cfg.clone();
    ordered.train.batching = variorum_train::config::Batching::Ordered;
    let e = one_line(train(ordered, &options(&tmp.path().join("ordered"))).err().expect("refused"));
    assert!(e.contains("train.batching = \"ordered\""), "{e}");

    // the sources changed under the run: prepared again, with another character set, and the
    // run's tokenizer no longer made them
    std::fs::write(tmp.path().join("plays/00.txt"), "QXZ: characters the run never saw\n").unwrap();
    let mut opts = options(&run);
    opts.resume = true;
    let e = one_line(train(cfg, &opts).err().expect("refused"));
    assert!(e.contains("prepared with another tokenizer than the run's"), "{e}");
}
