//! The GPU path, tested without a GPU: on lavapipe (software Vulkan) the wgpu backend must give
//! the same forward and backward results as the CPU backend for the same weights.
//! Set VARIORUM_SKIP_WGPU=1 to skip on a machine with no Vulkan driver at all.

#![cfg(feature = "wgpu")]

use burn::optim::GradientsParams;
use burn::prelude::*;

#[test]
fn wgpu_forward_and_backward_match_the_cpu() {
    if std::env::var("VARIORUM_SKIP_WGPU").is_ok_and(|v| v == "1") {
        eprintln!("skipped: VARIORUM_SKIP_WGPU=1");
        return;
    }
    // lavapipe wants a private runtime directory (mode 0700); CI machines have none.
    let runtime = tempfile::tempdir().unwrap();
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", runtime.path()) };
    }
    let cpu = Device::flex().autodiff();
    let gpu = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice).autodiff();
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
        cpu.seed(3);
        let model_cpu = cfg.init(&cpu);
        let dir = tempfile::tempdir().unwrap();
        model_cpu.clone().save_file(dir.path().join("m")).unwrap();
        let model_gpu = cfg.init(&gpu).load_file(dir.path().join("m"));

        let ids: Vec<i64> = (0..2 * 17).map(|i| (i * 7 % 11) as i64).collect();
        let run = |model: &variorum_model::DecoderLm, dev: &Device| {
            let t = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [2, 17]), dev);
            let (loss, _) = model.loss(t.clone().slice([0..2, 0..16]), t.slice([0..2, 1..17]));
            let value = loss.clone().into_scalar::<f32>();
            let grads = GradientsParams::from_grads(loss.backward(), model);
            let g = grads.get::<2>(model.token_embedding.weight.id).unwrap();
            (value, g.into_data().try_to_vec::<f32>().unwrap())
        };
        let (loss_cpu, grad_cpu) = run(&model_cpu, &cpu);
        let (loss_gpu, grad_gpu) = run(&model_gpu, &gpu);
        assert!((loss_cpu - loss_gpu).abs() < 1e-4, "{name}: loss: cpu {loss_cpu} vs wgpu {loss_gpu}");
        let scale = grad_cpu.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = grad_cpu.iter().zip(&grad_gpu).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(scale > 0.0, "{name}");
        assert!(diff < 1e-3 * scale, "{name}: embedding gradient differs by {diff} (scale {scale})");
    }
}
