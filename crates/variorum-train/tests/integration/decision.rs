//! The Decision Transformer end to end: Hugging Face's `DecisionTransformerModel` as the outside
//! reference, training from a trajectory file with exact resume, acting by rollouts.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use variorum_data::decision::{GenerateConfig, KeyDoorConfig, generate};
use variorum_model::{ActionInputs, StepInputs};
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, metrics, train};

use crate::common::seeded;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/decision_transformer");

#[test]
fn hugging_faces_decision_transformer_predicts_what_ours_predicts() {
    // building the model draws from the process-wide generator another test's run replays
    let _guard = seeded();
    let device = Device::flex();
    let (cfg, model) = variorum_train::hf::import_decision_transformer(Path::new(FIXTURE), &device).unwrap();
    assert_eq!(cfg.decision.as_ref().unwrap().state_dim, Some(5));
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(FIXTURE).join("expected.json")).unwrap()).unwrap();
    let floats =
        |k: &str| -> Vec<f32> { e[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect() };
    let (b, steps) = (e["batch"].as_u64().unwrap() as usize, e["steps"].as_u64().unwrap() as usize);
    let ts: Vec<i64> = e["timesteps"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let x = StepInputs {
        returns_to_go: Tensor::from_data(TensorData::new(floats("returns_to_go"), [b, steps]), &device),
        states: Tensor::from_data(TensorData::new(floats("states"), [b, steps, 5]), &device),
        actions: ActionInputs::Continuous(Tensor::from_data(
            TensorData::new(floats("actions"), [b, steps, 3]),
            &device,
        )),
        timesteps: Tensor::from_data(TensorData::new(ts, [b, steps]), &device),
    };
    let out = model.forward(&x);
    let check = |what: &str, got: Tensor<3>| {
        let got = got.into_data().convert::<f32>().try_into_vec::<f32>().unwrap();
        let want = floats(what);
        assert_eq!(got.len(), want.len(), "{what}");
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{what}: differs from transformers' by {worst}");
        // not a vacuous comparison: the predictions vary
        assert!(want.iter().any(|v| (v - want[0]).abs() > 1e-2), "{what}");
    };
    check("action_preds", out.actions);
    check("state_preds", out.states.unwrap());
    check("return_preds", out.returns.unwrap().unsqueeze_dim(2));
    // without the folded position row the predictions differ: the fixture's wpe[0] is not zero
}

/// A trajectory file of `episodes` key-to-door episodes (behaviour policies of `epsilons`) and a tiny Decision Transformer config
/// training on it.
fn setup(dir: &Path, episodes: usize, epsilons: &[f64]) -> (PathBuf, ExperimentConfig) {
    let set =
        generate(&GenerateConfig { env: KeyDoorConfig::default(), episodes, epsilons: epsilons.to_vec(), seed: 1 });
    let path = dir.join("trajectories.jsonl");
    set.save(&path).unwrap();
    let text = format!(
        r#"
[model]
kind = "decision-transformer"
d_model = 32
n_layers = 2
seq_len = 24
dropout = 0.1
[model.position]
kind = "none"
[model.attention]
kind = "full"
n_heads = 2
[data]
trajectories = "{}"
[train]
steps = 20
batch_size = 8
warmup_steps = 4
lr = 3e-3
eval_interval = 5
eval_batches = 2
log_interval = 5
checkpoint_interval = 5
"#,
        path.display()
    );
    (path, ExperimentConfig::parse(&text, false).unwrap())
}

fn options(run: &Path) -> TrainOptions {
    TrainOptions::new(run, Device::flex(), "flex")
}

#[test]
fn a_decision_transformer_trains_resumes_exactly_and_acts() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    // the expert alone: its moves are a function of what the context shows, so learnable
    let (_, mut cfg) = setup(tmp.path(), 60, &[0.0]);
    cfg.train.steps = 80;
    cfg.train.eval_interval = 20;
    let straight = tmp.path().join("straight");
    let Outcome::Finished(summary) = train(cfg.clone(), &options(&straight)).unwrap() else { panic!("finished") };
    let rows = metrics::read(&straight.join("metrics.csv")).unwrap();
    let first = rows.iter().find_map(|r| r.val_loss).unwrap();
    let last = summary.final_val_loss.unwrap();
    // four moves: a uniform guess is ln 4 = 1.386
    assert!(last < first - 0.1 && last < 1.0, "validation loss {first} -> {last}");

    let split = tmp.path().join("split");
    let mut opts = options(&split);
    opts.stop_at = Some(8);
    assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Interrupted { step: 8, .. }));
    let mut opts = options(&split);
    opts.resume = true;
    assert!(matches!(train(cfg, &opts).unwrap(), Outcome::Finished(_)));
    let (a, b) = (std::fs::read(straight.join("model.bpk")).unwrap(), std::fs::read(split.join("model.bpk")).unwrap());
    assert!(a == b, "the resumed run's weights differ from the uninterrupted run's");

    // rollouts: deterministic, on evaluation layouts, each target's episodes as asked
    let device = Device::flex();
    let run = variorum_train::decision::load_run(&straight, &device).unwrap();
    let env = KeyDoorConfig::default();
    let r1 = variorum_train::decision::rollouts(&run.model, env, &[0.5, 1.0], 6, 3, false, &device);
    let r2 = variorum_train::decision::rollouts(&run.model, env, &[0.5, 1.0], 6, 3, false, &device);
    assert_eq!(r1.targets.len(), 2);
    for (x, y) in r1.targets.iter().zip(&r2.targets) {
        assert_eq!(x.returns, y.returns);
        assert_eq!(x.returns.len(), 6);
        // a return is 1 − T/40 on success, −1 otherwise
        assert!(x.returns.iter().all(|&r| (r + 1.0).abs() < 1e-5 || (r > -1e-5 && r < 1.0)), "{:?}", x.returns);
    }
}

#[test]
fn bad_trajectory_settings_are_refused_in_one_line() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let (path, cfg) = setup(tmp.path(), 4, &[0.5]);
    // a timestep table shorter than an episode
    let mut short = cfg.clone();
    short.model.decision = Some(variorum_model::DecisionConfig { max_timestep: Some(3), ..Default::default() });
    let e = train(short, &options(&tmp.path().join("a"))).err().unwrap().to_string();
    assert!(e.contains("max_timestep = 3") && e.contains("raise it to at least 40"), "{e}");
    // a missing file
    let mut missing = cfg.clone();
    missing.data.trajectories = Some(tmp.path().join("nope.jsonl"));
    let e = format!("{:#}", train(missing, &options(&tmp.path().join("b"))).err().unwrap());
    assert!(e.contains("nope.jsonl") && e.contains("variorum trajectories"), "{e}");
    // one episode cannot be split into training and validation
    let text = std::fs::read_to_string(&path).unwrap();
    let two_lines: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&path, two_lines.join("\n")).unwrap();
    let e = train(cfg.clone(), &options(&tmp.path().join("c"))).err().unwrap().to_string();
    assert!(e.contains("1 episode(s)"), "{e}");
    // text data with a Decision Transformer, and trajectories with a language model
    let mut text_data = cfg.clone();
    text_data.data.trajectories = None;
    text_data.data.path = Some(path.clone());
    assert!(text_data.validate().unwrap_err().to_string().contains("data.trajectories"));
    let mut lm = cfg;
    lm.model = Default::default();
    assert!(lm.validate().unwrap_err().to_string().contains("decision-transformer"));
}
