//! The GPU path, tested without a GPU: on lavapipe (software Vulkan) the wgpu backend must give
//! the same forward and backward results as the CPU backend for the same weights.
//! Set VARIORUM_SKIP_WGPU=1 to skip on a machine with no Vulkan driver at all.

#![cfg(feature = "wgpu")]

use burn::optim::GradientsParams;
use burn::prelude::*;

/// The CPU and GPU devices (autodiff), or `None` where VARIORUM_SKIP_WGPU=1; keep the returned
/// directory alive while the GPU runs.
fn devices() -> Option<(Device, Device, tempfile::TempDir)> {
    if std::env::var("VARIORUM_SKIP_WGPU").is_ok_and(|v| v == "1") {
        eprintln!("skipped: VARIORUM_SKIP_WGPU=1");
        return None;
    }
    // lavapipe wants a private runtime directory (mode 0700); CI machines have none.
    let runtime = tempfile::tempdir().unwrap();
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", runtime.path()) };
    }
    Some((Device::flex().autodiff(), Device::wgpu(burn::tensor::DeviceKind::DefaultDevice).autodiff(), runtime))
}

/// The loss of `cfg`'s model (the same weights on both devices) on a fixed batch of 2 × `len`
/// tokens, and the gradient of the token embedding, on the CPU and on the GPU.
fn on_both(cfg: &variorum_model::ModelConfig, len: usize, cpu: &Device, gpu: &Device) -> [(f32, Vec<f32>); 2] {
    cpu.seed(3);
    let model_cpu = cfg.init(cpu);
    let dir = tempfile::tempdir().unwrap();
    model_cpu.clone().save_file(dir.path().join("m")).unwrap();
    let model_gpu = cfg.init(gpu).load_file(dir.path().join("m"));
    let ids: Vec<i64> = (0..2 * (len + 1)).map(|i| (i * 7 % 11) as i64).collect();
    let run = |model: &variorum_model::DecoderLm, dev: &Device| {
        let t = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [2, len + 1]), dev);
        let (loss, _) = model.loss(t.clone().slice([0..2, 0..len]), t.slice([0..2, 1..len + 1]));
        let value = loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(loss.backward(), model);
        let g = grads.get::<2>(model.token_embedding.weight.id).unwrap();
        (value, g.into_data().try_to_vec::<f32>().unwrap())
    };
    [run(&model_cpu, cpu), run(&model_gpu, gpu)]
}

/// The two runs' losses within 1e-4 and embedding gradients within 1e-3 of the largest.
fn assert_close(name: &str, [(loss_cpu, grad_cpu), (loss_gpu, grad_gpu)]: [(f32, Vec<f32>); 2]) {
    assert!((loss_cpu - loss_gpu).abs() < 1e-4, "{name}: loss: cpu {loss_cpu} vs wgpu {loss_gpu}");
    let scale = grad_cpu.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = grad_cpu.iter().zip(&grad_gpu).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 0.0, "{name}");
    assert!(diff < 1e-3 * scale, "{name}: embedding gradient differs by {diff} (scale {scale})");
}

#[test]
fn wgpu_forward_and_backward_match_the_cpu() {
    let Some((cpu, gpu, _runtime)) = devices() else { return };
    // the plain model, the kinds that sort, gather and rebuild (content-based attention,
    // reversible blocks), pool and rank on the host, a bidirectional masked LM with an
    // iterative pseudo-inverse, a sorted normaliser (the fused kernel on the CPU, sort and cumsum
    // ops on the GPU), capsule routing, and a loss on the weights
    let chosen = [
        "base (learned, full, pre-ln, gelu)",
        "attention lsh",
        "attention routing",
        "block reversible",
        "attention poolingformer max",
        "attention prob-sparse causal",
        "attention nystrom",
        "attention full entmax-1.5, grouped-query",
        "attention capsule-heads em",
        "attention full guidance previous, first",
    ];
    let variants: Vec<_> =
        variorum_testkit::variants().into_iter().filter(|(n, _)| chosen.contains(&n.as_str())).collect();
    assert_eq!(variants.len(), chosen.len(), "a chosen variant was renamed");
    for (name, cfg) in variants {
        assert_close(&name, on_both(&cfg, 16, &cpu, &gpu));
    }
}

/// Full attention whose scores exceed the budget goes by query blocks on the GPU (Burn's ops
/// with the hand-written backward of `variorum_kernels::query_blocked`) and gives the CPU's
/// fused kernel's loss and gradients: causal and both ways (a masked LM), RoPE with
/// grouped-query heads. The budget is lowered so that 40 tokens make three blocks.
#[test]
fn wgpu_query_blocked_attention_matches_the_cpu() {
    use variorum_kernels::query_blocked;
    let Some((cpu, gpu, _runtime)) = devices() else { return };
    let base = variorum_model::ModelConfig { seq_len: 40, ..variorum_model::zoo::tiny() };
    let mut rope = variorum_model::ModelConfig {
        position: serde_json::from_str(r#"{ "kind": "rope" }"#).unwrap(),
        ..base.clone()
    };
    if let variorum_attention::AttentionConfig::Full(full) = &mut rope.attention {
        full.n_kv_heads = Some(2);
    }
    let masked = variorum_model::ModelConfig {
        objective: variorum_model::ObjectiveConfig::Masked(Default::default()),
        ..base.clone()
    };
    let chosen = [("causal", base), ("rope, grouped-query", rope), ("masked", masked)];
    for (name, cfg) in chosen {
        let before = query_blocked::calls();
        // 2 sequences × 4 heads × 40 keys: 16 query rows per block
        let runs = query_blocked::with_score_budget(2 * 4 * 40 * 16, || on_both(&cfg, 40, &cpu, &gpu));
        assert!(query_blocked::calls() > before, "{name}: the GPU run did not take the blocked path");
        assert_close(&name, runs);
    }
}

/// A tiny character model of the baby recipe, 200 steps, a checkpoint every 100.
const TINY: &str = r#"
[model]
d_model = 32
n_layers = 2
seq_len = 32
dropout = 0.0

[model.position]
kind = "learned"

[model.attention]
kind = "full"
n_heads = 4

[data]
dataset = "shakespeare"
tokenizer = { kind = "char" }

[train]
steps = 200
batch_size = 4
lr = 3e-3
warmup_steps = 10
log_interval = 20
eval_interval = 100
eval_batches = 1
checkpoint_interval = 100
sample_tokens = 16
"#;

/// Every logged step's training loss in a run's metrics.
fn losses(run: &std::path::Path) -> Vec<(u64, f64)> {
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    metrics
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((f[0].parse().ok()?, f[1].parse().ok()?))
        })
        .collect()
}

/// The same config and seed give the same run on the CPU and on wgpu (the weights are drawn on
/// the CPU whatever the device): every logged training loss within 1e-3 over 200 steps. A run
/// stopped at a checkpoint on the CPU resumes on the GPU and ends where the CPU's own run ends,
/// and the CPU's run generates the same greedy text on the GPU.
#[test]
fn wgpu_trains_resumes_and_generates_as_the_cpu_does() {
    let Some((_, _, runtime)) = devices() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("shakespeare")).unwrap();
    let words = ["to be", "or not", "that is", "the question", "whether", "'tis nobler", "in the mind"];
    let text: String = (0..3000)
        .map(|i| format!("{}{}", words[(i * 5 + i / 3) % words.len()], [" ", "\n"][usize::from(i % 9 == 8)]))
        .collect();
    std::fs::write(data.join("shakespeare/input.txt"), text).unwrap();
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    // `--stop-at` ends as Ctrl-C does: a checkpoint, and exit code 130
    let variorum = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_variorum"))
            .args(args)
            .env("VARIORUM_DATA", &data)
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap();
        let expected = if args.contains(&"--stop-at") { 130 } else { 0 };
        assert_eq!(o.status.code(), Some(expected), "variorum {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let run = |name: &str| dir.path().join(name);
    let train = |device: &str, name: &str, extra: &[&str]| {
        let out = run(name);
        let mut args = vec!["train", config.to_str().unwrap(), "--device", device, "--out", out.to_str().unwrap()];
        args.extend(["--no-progress", "--no-report"]);
        args.extend(extra);
        variorum(&args);
    };
    train("cpu", "cpu", &[]);
    train("wgpu", "gpu", &[]);
    train("cpu", "moved", &["--stop-at", "100"]);
    train("wgpu", "moved", &["--resume"]);
    let reference = losses(&run("cpu"));
    assert_eq!(reference.len(), 10, "a loss every 20 steps");
    for other in ["gpu", "moved"] {
        let got = losses(&run(other));
        assert_eq!(got.iter().map(|s| s.0).collect::<Vec<_>>(), reference.iter().map(|s| s.0).collect::<Vec<_>>());
        for ((step, a), (_, b)) in reference.iter().zip(&got) {
            assert!((a - b).abs() < 1e-3, "{other}: step {step}: cpu {a} vs {b}");
        }
    }
    let generate = |device: &str| {
        let cpu_run = run("cpu");
        let args =
            ["generate", cpu_run.to_str().unwrap(), "--device", device, "--prompt", "to be", "--temperature", "0"];
        variorum(&[&args[..], &["--max-new-tokens", "24"]].concat())
    };
    assert_eq!(generate("wgpu"), generate("cpu"));
}
