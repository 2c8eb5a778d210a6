//! The checks every kind gets, on one tiny model per variant ([`crate::zoo::variants`], or a
//! user's own list): no leak from the future (and a bidirectional model does see later tokens),
//! cached decoding equals the full forward, save → load is bit-identical, a tiny batch is overfit;
//! and for encoder–decoders, their own ([`check_encoder_decoder`]).
//!
//! Each check takes the device to run on, so the crate names no backend: the workspace's tests
//! call them on flex (`crates/variorum-model/tests/generic.rs`), a user calls [`check_all`] on
//! whatever backend their project uses. Each returns the first failure as one line naming the
//! variant.

use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;

use crate::{DecoderLm, DecoderState, ModelConfig, Source};

/// Burn's CPU backends seed one process-wide RNG: checks that rely on seeded initialisation or
/// dropout take this lock, so that concurrent tests do not draw from each other's stream.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seeded pseudo-random token ids `[batch, len]` below `vocab`.
pub fn tokens(seed: u64, batch: usize, len: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let ids: Vec<i64> = (0..batch * len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as i64
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [batch, len]), device)
}

fn build(name: &str, cfg: &ModelConfig, seed: u64, device: &Device) -> Result<DecoderLm, String> {
    cfg.validate().map_err(|e| format!("{name}: the variant does not validate: {e}"))?;
    device.seed(seed);
    Ok(cfg.init(device))
}

fn max_abs_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds { Ok(()) } else { Err(why()) }
}

/// Positions of the long causality check: several of the kernels' query blocks (64 rows), so
/// that a layout sorted by content (LSH's buckets, routing's clusters) permutes queries and keys
/// across blocks and rows wider than the sums' 16 lanes, where the order of a sum can move with
/// later tokens.
pub const LONG_CAUSALITY_LEN: usize = 160;

/// A causal model's outputs up to position t ignore every token after t (and react to their
/// own); a masked (bidirectional) model's early outputs do see later tokens. Checked at 12
/// positions, and at [`LONG_CAUSALITY_LEN`] where the variant takes that context (its `seq_len`
/// raised to it): exactly, to the last bit, unless the kind declares why not.
pub fn check_causality(name: &str, cfg: &ModelConfig, device: &Device) -> Result<(), String> {
    causality_at(name, cfg, device, 12, 5)?;
    if let Some(long) = long_variant(cfg) {
        causality_at(&format!("{name} (at {LONG_CAUSALITY_LEN} positions)"), &long, device, LONG_CAUSALITY_LEN, 100)?;
    }
    Ok(())
}

/// The variant with a context of [`LONG_CAUSALITY_LEN`], where it validates with one.
pub fn long_variant(cfg: &ModelConfig) -> Option<ModelConfig> {
    let long = ModelConfig { seq_len: cfg.seq_len.max(LONG_CAUSALITY_LEN), ..cfg.clone() };
    long.validate().ok().map(|_| long)
}

fn causality_at(name: &str, cfg: &ModelConfig, device: &Device, l: usize, t: usize) -> Result<(), String> {
    let _guard = seeded();
    let model = build(name, cfg, 1, device)?;
    let (b, v) = (2, cfg.vocab());
    let a = tokens(3, b, l, v, device);
    // replace every token after position t
    let future = tokens(4, b, l - t - 1, v, device).add_scalar(1).remainder_scalar(v as i64);
    let changed = a.clone().slice_assign([0..b, t + 1..l], future);
    let la = model.forward(a).logits;
    let lb = model.forward(changed).logits;
    let past = max_abs_diff(la.clone().slice([0..b, 0..t + 1, 0..v]), lb.clone().slice([0..b, 0..t + 1, 0..v]));
    if !cfg.objective.is_causal() {
        return ensure(past > 1e-6, || format!("{name}: a bidirectional model's outputs ignored later tokens"));
    }
    let after = max_abs_diff(la.slice([0..b, t + 1..l, 0..v]), lb.slice([0..b, t + 1..l, 0..v]));
    // exact: a causal output may not depend on later tokens even in its rounding (a scale or
    // a sum taken over the whole sequence would let them in), unless the kind declares why its
    // last bits may move
    let (limit, why) = match cfg.attention.inexact_causality() {
        Some(why) => (1e-6, format!(" (declared inexact: {why})")),
        None => (0.0, String::new()),
    };
    ensure(past <= limit, || {
        format!("{name}: outputs at or before t changed by {past} when only later tokens changed{why}")
    })?;
    ensure(after > 1e-6, || format!("{name}: outputs after t did not react to their own tokens (the check is blind)"))
}

/// A prompt of 4 tokens, then one token at a time through the decoding state, gives the logits
/// of one full forward (causal models whose attention decodes incrementally; others pass).
pub fn check_cached_decoding(name: &str, cfg: &ModelConfig, device: &Device) -> Result<(), String> {
    if !cfg.attention.capabilities().incremental || !cfg.objective.is_causal() {
        return Ok(());
    }
    let _guard = seeded();
    let model = build(name, cfg, 2, device)?;
    let (b, l, v) = (2, 10, cfg.vocab());
    let toks = tokens(5, b, l, v, device);
    let full = model.forward(toks.clone()).logits;
    let mut state = DecoderState::default();
    let mut parts = vec![model.forward_with(toks.clone().slice([0..b, 0..4]), Some(&mut state)).logits];
    for i in 4..l {
        parts.push(model.forward_with(toks.clone().slice([0..b, i..i + 1]), Some(&mut state)).logits);
    }
    let diff = max_abs_diff(full, Tensor::cat(parts, 1));
    ensure(diff < 1e-4, || format!("{name}: cached decoding differs from the full forward by {diff}"))?;
    ensure(state.position == l, || format!("{name}: the state counts {} positions after {l}", state.position))
}

/// Saving a model and loading it into one initialised from another seed gives bit-identical
/// outputs (and the other seed gives different ones, so the check can fail).
pub fn check_save_load(name: &str, cfg: &ModelConfig, device: &Device) -> Result<(), String> {
    let _guard = seeded();
    let model = build(name, cfg, 7, device)?;
    let toks = tokens(9, 2, 8, cfg.vocab(), device);
    let before = model.forward(toks.clone()).logits.into_data();
    let dir = std::env::temp_dir().join(format!("variorum-harness-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{name}: cannot create {}: {e}", dir.display()))?;
    let path = dir.join("model");
    let result = (|| {
        model.save_file(&path).map_err(|e| format!("{name}: saving failed: {e:?}"))?;
        let fresh = build(name, cfg, 99, device)?;
        let differs = fresh.forward(toks.clone()).logits.into_data() != before;
        ensure(differs, || format!("{name}: a different seed gave the same model (the check is blind)"))?;
        let after = fresh.load_file(&path).forward(toks).logits.into_data();
        ensure(before == after, || format!("{name}: outputs differ after save/load"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// AdamW memorises one tiny batch (loss below 0.3 within 200 steps, from above 1.5) on
/// `autodiff_device` (a device with autodiff: `Device::….autodiff()`).
pub fn check_overfit(name: &str, cfg: &ModelConfig, autodiff_device: &Device) -> Result<(), String> {
    let _guard = seeded();
    let dev = autodiff_device;
    let model = build(name, cfg, 11, dev)?;
    let (inputs, targets) = match cfg.mask_token() {
        // next-token prediction: the batch shifted by one
        None => {
            let toks = tokens(13, 2, 17, cfg.vocab(), dev);
            (toks.clone().slice([0..2, 0..16]), toks.slice([0..2, 1..17]))
        }
        // masked LM: every third token hidden (the mask token), the others ignored as targets
        Some(mask) => {
            let toks = tokens(13, 2, 16, mask, dev).into_data().convert::<i64>();
            let toks = toks.try_to_vec::<i64>().map_err(|e| format!("{name}: {e:?}"))?;
            let hidden = |i: usize| i % 16 % 3 == 1;
            let ins: Vec<i64> = (0..32).map(|i| if hidden(i) { mask as i64 } else { toks[i] }).collect();
            let outs: Vec<i64> = (0..32).map(|i| if hidden(i) { toks[i] } else { mask as i64 }).collect();
            let t = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [2, 16]), dev);
            (t(ins), t(outs))
        }
    };
    // up to 200 steps, stopping once it is memorised: the slower kinds (rfa's gated random
    // features) need more than 80, and how many depends on rounding (GEMM kernels differ by CPU)
    memorise(name, model, 200, |m| m.loss(inputs.clone(), targets.clone()).0)
}

/// AdamW (lr 1e-2) on `loss` of the model until it falls below 0.3, for at most `steps` steps,
/// from above 1.5. Gradients are clipped at norm 1.0 (Burn's clipping: each parameter tensor by
/// its own norm; the trainer's is global): without it, a kind whose loss surface has cliffs
/// (capsule heads' EM routing) bounces out of the minimum and back, and whether it sat below the
/// bar at some step depended on rounding (GEMM order, kernels).
fn memorise(
    name: &str,
    mut model: DecoderLm,
    steps: usize,
    loss: impl Fn(&DecoderLm) -> Tensor<1>,
) -> Result<(), String> {
    let clip = burn::grad_clipping::GradientClippingConfig::Norm(1.0);
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).with_grad_clipping(Some(clip)).init();
    let (mut first, mut last) = (f32::NAN, f32::NAN);
    for step in 0..steps {
        let l = loss(&model);
        last = l.clone().into_scalar::<f32>();
        if step == 0 {
            first = last;
        }
        if last < 0.3 {
            break;
        }
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    ensure(first > 1.5, || format!("{name}: initial loss {first} is suspiciously low"))?;
    ensure(last < 0.3, || format!("{name}: loss only fell from {first} to {last} in {steps} steps on one batch"))
}

/// An encoder–decoder's defining properties, on two sources of 7 tokens and targets of 9: the
/// decoder's outputs up to t ignore later target tokens (and react to their own); every source
/// token reaches the first target position's output (the encoder reads both ways, the
/// cross-attention every source row); source padding changes nothing; cached decoding (the
/// source on the first call, its encoder output and cross-attention state kept, then one target
/// token at a time) gives the full forward's logits.
pub fn check_encoder_decoder(name: &str, cfg: &ModelConfig, device: &Device) -> Result<(), String> {
    let _guard = seeded();
    let model = build(name, cfg, 3, device)?;
    let (b, ls, lt, v) = (2, 7, 9, cfg.vocab());
    let src = tokens(21, b, ls, v, device);
    let tgt = tokens(22, b, lt, v, device);
    let plain = |s: Tensor<2, Int>| Source { tokens: s, padding: None };
    let run = |s: Source, t: Tensor<2, Int>| model.forward_tagged(t, s, None).logits;
    let base = run(plain(src.clone()), tgt.clone());
    let bump = |x: Tensor<2, Int>, at: usize| {
        let col = x.clone().slice([0..b, at..at + 1]).add_scalar(1).remainder_scalar(v as i64);
        x.slice_assign([0..b, at..at + 1], col)
    };
    // causal over the target
    let t = 4;
    let mut later = tgt.clone();
    for at in t + 1..lt {
        later = bump(later, at);
    }
    let moved = run(plain(src.clone()), later);
    let past = max_abs_diff(base.clone().narrow(1, 0, t + 1), moved.clone().narrow(1, 0, t + 1));
    let after = max_abs_diff(base.clone().narrow(1, t + 1, lt - t - 1), moved.narrow(1, t + 1, lt - t - 1));
    ensure(past == 0.0, || {
        format!("{name}: target outputs at or before {t} changed by {past} when later targets changed")
    })?;
    ensure(after > 1e-6, || {
        format!("{name}: later target outputs did not react to their tokens (the check is blind)")
    })?;
    // every source token reaches the first target output
    for at in 0..ls {
        let out = run(plain(bump(src.clone(), at)), tgt.clone());
        let d = max_abs_diff(out.narrow(1, 0, 1), base.clone().narrow(1, 0, 1));
        ensure(d > 1e-6, || format!("{name}: source token {at} does not reach the first target output"))?;
    }
    // padding: three more source tokens, hidden, change nothing
    let padded = Tensor::cat(vec![src.clone(), tokens(23, b, 3, v, device)], 1);
    let pad: Vec<bool> = (0..b).flat_map(|_| (0..ls + 3).map(|j| j >= ls)).collect();
    let padding = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, ls + 3]), device);
    let out = run(Source { tokens: padded, padding: Some(padding) }, tgt.clone());
    let d = max_abs_diff(out, base.clone());
    ensure(d < 1e-5, || format!("{name}: padding the source moved the outputs by {d}"))?;
    // cached decoding
    let mut state = DecoderState::default();
    let first = model.forward_tagged(tgt.clone().narrow(1, 0, 3), plain(src), Some(&mut state)).logits;
    let mut parts = vec![first];
    for i in 3..lt {
        parts.push(model.forward_tagged(tgt.clone().narrow(1, i, 1), None, Some(&mut state)).logits);
    }
    let d = max_abs_diff(Tensor::cat(parts, 1), base);
    ensure(d < 1e-4, || format!("{name}: cached decoding differs from the full forward by {d}"))
}

/// An encoder–decoder memorises one tiny batch of (source, target) pairs whose target is the
/// source reversed (loss below 0.3 within 300 steps) on `autodiff_device`.
pub fn check_encoder_decoder_overfit(name: &str, cfg: &ModelConfig, autodiff_device: &Device) -> Result<(), String> {
    let _guard = seeded();
    let dev = autodiff_device;
    let model = build(name, cfg, 11, dev)?;
    let end = cfg.end_token().ok_or_else(|| format!("{name}: not an encoder–decoder"))? as i64;
    let (b, l) = (4, 6);
    let src = tokens(31, b, l, end as usize, dev);
    let ids = src.clone().into_data().convert::<i64>().try_to_vec::<i64>().map_err(|e| format!("{name}: {e:?}"))?;
    let reversed: Vec<i64> =
        (0..b).flat_map(|r| (0..l).rev().map(move |j| (r, j))).map(|(r, j)| ids[r * l + j]).collect();
    let inputs: Vec<i64> =
        (0..b).flat_map(|r| std::iter::once(end).chain(reversed[r * l..r * l + l - 1].iter().copied())).collect();
    let t = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, l]), dev);
    let (inputs, targets) = (t(inputs), t(reversed));
    let source = Source { tokens: src, padding: None };
    memorise(name, model, 300, |m| m.loss_with(inputs.clone(), targets.clone(), source.clone(), None).0)
}

/// Every check on every variant: `device` for the forward checks, `device.autodiff()`'s
/// equivalent `autodiff_device` for the overfit. The first failure of each variant, one line each.
pub fn check_all(
    variants: &[(String, ModelConfig)],
    device: &Device,
    autodiff_device: &Device,
) -> Result<(), Vec<String>> {
    let failures: Vec<String> = variants
        .iter()
        .filter_map(|(name, cfg)| {
            check_causality(name, cfg, device)
                .and_then(|()| check_cached_decoding(name, cfg, device))
                .and_then(|()| check_save_load(name, cfg, device))
                .and_then(|()| check_overfit(name, cfg, autodiff_device))
                .err()
        })
        .collect();
    if failures.is_empty() { Ok(()) } else { Err(failures) }
}
