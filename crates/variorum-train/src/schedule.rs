//! Learning-rate schedule: linear warmup from 0 (step 0 runs at lr 0, as nanoGPT's), then cosine (or linear, or no) decay to `min_lr`.
//!
//! A pure function of the step, rather than Burn's stateful `LrScheduler`s, so that resuming a
//! run needs nothing but the step number and cannot drift.

use crate::config::{Decay, TrainConfig};

/// Learning rate of optimizer step `step` (0-based).
pub fn learning_rate(cfg: &TrainConfig, step: u64) -> f64 {
    if step < cfg.warmup_steps {
        return cfg.lr * step as f64 / cfg.warmup_steps as f64;
    }
    let span = cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
    let progress = ((step - cfg.warmup_steps) as f64 / span).min(1.0);
    let ratio = match cfg.decay {
        Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        Decay::Linear => 1.0 - progress,
        Decay::Constant => 1.0,
    };
    cfg.min_lr + ratio * (cfg.lr - cfg.min_lr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_min() {
        let cfg = TrainConfig { steps: 1000, warmup_steps: 100, lr: 1e-3, min_lr: 1e-4, ..Default::default() };
        assert_eq!(learning_rate(&cfg, 0), 0.0);
        assert!(learning_rate(&cfg, 50) < learning_rate(&cfg, 99));
        assert!((learning_rate(&cfg, 100) - 1e-3).abs() < 1e-12);
        assert!((learning_rate(&cfg, 550) - 5.5e-4).abs() < 1e-9, "cosine midpoint");
        assert!((learning_rate(&cfg, 1000) - 1e-4).abs() < 1e-12);
        let mut prev = f64::INFINITY;
        for s in 100..1000 {
            let lr = learning_rate(&cfg, s);
            assert!(lr <= prev);
            prev = lr;
        }
    }
}
