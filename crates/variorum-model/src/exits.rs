//! Early exits, `model.exits`: an output classifier after every block (Elbayad et al. 2020,
//! "Depth-Adaptive Transformer"; Schuster et al. 2022, CALM), so that a prediction can be read
//! from block n < N:
//!
//! p(y_t | h^n_t) = softmax(W_n · norm_n(h^n_t)),
//!
//! with W_n, norm_n the model's own head and final norm (`shared = true`, CALM's choice) or one
//! classifier per block. Training adds the intermediate exits' cross-entropies as the
//! `early_exits` auxiliary loss (times `weight`), so every exit learns to predict on every token,
//! weighted by `weighting`:
//!
//! - `uniform` (default): their mean, (1/(N−1)) Σ_{n<N} L_n — Elbayad et al.'s aligned training;
//! - `calm`: CALM's L = Σ_{n=1..N} ω_n L_n with ω_n = n / Σ_j j (Schuster et al. 2022, eq. 5),
//!   deeper exits weighted more. We add Σ_{n<N} (n/N) L_n to the last block's loss, which is
//!   CALM's loss divided by ω_N: the same gradients up to one constant factor, which Adam's update
//!   does not see (only its ε and the clipping threshold do), and the reported training loss stays
//!   the last block's.
//!
//! With `classifier = true` every intermediate block also gets CALM's learned exit classifier,
//! c_n = σ(w_n·h^n + b_n), trained (as the `exit_classifier` loss, binary cross-entropy) to predict
//! whether exit n's top token equals the last block's — the consistency oracle. It reads the
//! states detached, so it never changes what the model predicts.
//!
//! `predictor` adds one of the Depth-Adaptive Transformer's exit predictors
//! ([`crate::exit_predictor`]), trained as the `exit_predictor` loss against its oracle.
//!
//! `training = "mixed"` is Elbayad et al.'s other way of training the exits (§2.2.2). Aligned
//! training (the above) assumes every block's state of every earlier token exists; at inference
//! a token that left at block n_t has none above n_t, and its state h^{n_t}_t is copied to the
//! blocks above (CALM's propagation, [`crate::DecoderLm::propagate`]). Mixed training samples
//! M = `paths` exit sequences (n_1 … n_T) per step, runs the stack with each — block n computes
//! every token, and a token whose exit n_t < n keeps its copied state h^{n_t}_t, which later
//! tokens attend to — and minimises
//!
//! L = −(1/M) Σ_m (1/T) Σ_t log p(y_t | h^{n^{(m)}_t}_t),
//!
//! each token read by its own exit's classifier (the last block's is the model's head). The paper
//! states only "random exits"; we draw each n_t uniformly from 1 … N, independently per token,
//! path and row, from the step's seeded generator. Its Table 1 compares M = 1, 3 and 6 with
//! aligned training (M = 6 is "most comparable", as many losses per example); the default is 6.
//! This loss is the whole training objective (it replaces the last block's loss and the
//! `early_exits` term, so `weight` and `weighting` do not apply), and the reported training loss
//! is its value; validation still reads the last block. The classifier and the predictors, which
//! learn from every exit's output on the same tokens, need aligned training.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_block::Norm;
use variorum_core::{ConfigError, KindInfo, error::check};

use crate::exit_predictor::{ExitPredictor, Oracle, PredictorKind};

/// `model.exits`, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ExitConfig {
    /// Predictions only after the last block.
    #[default]
    None,
    /// A classifier after every block.
    EveryLayer(EveryLayerConfig),
}

/// `model.exits.weighting`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitWeighting {
    /// The mean of the intermediate exits' losses (Elbayad et al. 2020).
    #[default]
    Uniform,
    /// Exit n of N weighted n/N (Schuster et al. 2022).
    Calm,
}

impl ExitWeighting {
    /// The weight of intermediate exit `n` (1-based) of a stack of `depth` blocks, relative to the
    /// last block's loss.
    pub fn weight(self, n: usize, depth: usize) -> f64 {
        match self {
            Self::Uniform => 1.0 / (depth - 1) as f64,
            Self::Calm => n as f64 / depth as f64,
        }
    }
}

/// `model.exits.training`: how the exits are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitTraining {
    /// Every exit on every token, all states computed (one pass).
    #[default]
    Aligned,
    /// `paths` sampled exit sequences, the states above each token's exit copied from it.
    Mixed,
}

/// `model.exits` with `kind = "every-layer"`: an output classifier after every block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EveryLayerConfig {
    /// Every exit uses the model's final norm and output head. Default true.
    pub shared: bool,
    /// Weight of the intermediate exits' loss. Default 1.
    pub weight: f64,
    /// How the exits' losses are combined: `uniform` (their mean; default) or `calm` (exit n of N
    /// weighted n/N, CALM's ω_n up to a constant).
    pub weighting: ExitWeighting,
    /// Train CALM's per-block exit classifier too. Default false.
    pub classifier: bool,
    /// Elbayad et al.'s exit predictor: `none` (default), `sequence`, `token-multinomial`,
    /// `token-geometric`.
    pub predictor: PredictorKind,
    /// The predictor's oracle: `likelihood` (default) or `correctness`.
    pub oracle: Oracle,
    /// λ, the oracle's cost per block (in nats per token, or in fraction correct). Default 0.01.
    pub lambda: f64,
    /// σ of the RBF kernel smoothing the token-specific oracles; 0 = none. Default 1.
    pub sigma: f64,
    /// Weight of the predictor's loss. Default 1.
    pub predictor_weight: f64,
    /// `aligned` (default: every exit on every token) or `mixed` (sampled exit paths, states
    /// copied above each token's exit).
    pub training: ExitTraining,
    /// M, the exit paths sampled per step under mixed training. Default 6.
    pub paths: usize,
}

impl Default for EveryLayerConfig {
    fn default() -> Self {
        Self {
            shared: true,
            weight: 1.0,
            weighting: ExitWeighting::Uniform,
            classifier: false,
            predictor: PredictorKind::None,
            oracle: Oracle::Likelihood,
            lambda: 0.01,
            sigma: 1.0,
            predictor_weight: 1.0,
            training: ExitTraining::Aligned,
            paths: 6,
        }
    }
}

impl ExitConfig {
    /// The `kind = "…"` value.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::EveryLayer(_) => "every-layer",
        }
    }

    /// Tiny settings the generic tests run, named by what they exercise: a shared head and one
    /// classifier per block; the Depth-Adaptive Transformer's predictors with both oracles.
    pub fn test_variants() -> Vec<(String, Self)> {
        let mut out = Vec::new();
        for shared in [true, false] {
            let c = EveryLayerConfig { shared, classifier: shared, ..Default::default() };
            out.push((format!("exits every-layer shared={shared}"), Self::EveryLayer(c)));
        }
        let calm = EveryLayerConfig { weighting: ExitWeighting::Calm, classifier: true, ..Default::default() };
        out.push(("exits every-layer, CALM's weighting".into(), Self::EveryLayer(calm)));
        for shared in [true, false] {
            let c = EveryLayerConfig { shared, training: ExitTraining::Mixed, paths: 2, ..Default::default() };
            out.push((format!("exits mixed training shared={shared}"), Self::EveryLayer(c)));
        }
        for (predictor, oracle) in [
            (PredictorKind::Sequence, Oracle::Likelihood),
            (PredictorKind::TokenMultinomial, Oracle::Correctness),
            (PredictorKind::TokenGeometric, Oracle::Likelihood),
        ] {
            let c = EveryLayerConfig { predictor, oracle, ..Default::default() };
            out.push((format!("exits predictor {} ({oracle:?})", predictor.name()), Self::EveryLayer(c)));
        }
        out
    }

    /// Checks the weights, λ and σ; messages name the config key (`model.exits.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::None => Ok(()),
            Self::EveryLayer(c) => {
                for (name, v) in [("weight", c.weight), ("lambda", c.lambda), ("sigma", c.sigma)] {
                    check(v >= 0.0 && v.is_finite(), || format!("model.exits.{name} = {v} must be finite and >= 0"))?;
                }
                check(c.predictor_weight >= 0.0, || "model.exits.predictor_weight must be >= 0".into())?;
                if c.training == ExitTraining::Mixed {
                    check(c.paths >= 1, || "model.exits.paths must be at least 1 under training = \"mixed\"".into())?;
                    check(!c.classifier && c.predictor == PredictorKind::None, || {
                        "model.exits.training = \"mixed\" trains each token at one sampled exit, but the classifier and \
                         the exit predictors learn from every exit's output: use training = \"aligned\" with them"
                            .into()
                    })?;
                    check(c.weight == 1.0 && c.weighting == ExitWeighting::Uniform, || {
                        "model.exits.weight and weighting combine the exits' losses under aligned training; mixed \
                         training's loss is the mean over its sampled paths: leave them unset"
                            .into()
                    })?;
                }
                Ok(())
            }
        }
    }

    /// The `variorum zoo` rows.
    pub fn zoo() -> Vec<KindInfo> {
        let caps = variorum_core::Capabilities::NEUTRAL;
        vec![
            KindInfo {
                axis: "model.exits",
                kind: "none",
                summary: "predictions after the last block only",
                paper: "",
                caps,
            },
            KindInfo {
                axis: "model.exits",
                kind: "every-layer",
                summary: "an output classifier after every block (shared or per block), trained on all exits; exit predictors (sequence, token multinomial, token geometric) with likelihood/correctness oracles; CALM early exit at generation",
                paper: "Elbayad et al. 2020, Depth-Adaptive Transformer; Schuster et al. 2022, Confident Adaptive Language Modeling",
                caps: variorum_core::Capabilities { aux_losses: true, ..caps },
            },
        ]
    }
}

/// Per-block classifiers for the intermediate exits (empty when they share the model's head).
#[derive(Module, Debug)]
pub struct ExitHeads {
    /// The intermediate exits' own final norms, one per block before the last (empty when shared).
    pub norms: Vec<Norm>,
    /// The intermediate exits' own output heads `d_model → vocab`, no bias (empty when shared).
    pub heads: Vec<Linear>,
    /// Weight of the `early_exits` loss (`model.exits.weight`).
    pub weight: f64,
    /// How the exits' losses are combined.
    #[module(skip)]
    pub weighting: ExitWeighting,
    /// CALM's exit classifiers, one per intermediate block (empty when off).
    pub classifiers: Vec<Linear>,
    /// The Depth-Adaptive Transformer's exit predictor.
    pub predictor: Option<ExitPredictor>,
    /// M, the exit paths of mixed training; 0 = aligned training.
    pub mixed_paths: usize,
}

impl ExitHeads {
    /// σ(w_n·h + b_n) of block `n`'s classifier, `[b, len]`, if there is one.
    pub fn confidence(&self, n: usize, h: Tensor<3>) -> Option<Tensor<2>> {
        let [b, l, _] = h.dims();
        Some(burn::tensor::activation::sigmoid(self.classifiers.get(n)?.forward(h)).reshape([b, l]))
    }

    /// `blocks − 1` intermediate exits; `norm` builds a norm like the model's.
    pub fn new(
        cfg: &EveryLayerConfig,
        blocks: usize,
        d_model: usize,
        vocab: usize,
        init_std: f64,
        norm: impl Fn() -> Norm,
        device: &Device,
    ) -> Self {
        let n = if cfg.shared { 0 } else { blocks.saturating_sub(1) };
        let init = Initializer::Normal { mean: 0.0, std: init_std };
        Self {
            norms: (0..n).map(|_| norm()).collect(),
            heads: (0..n)
                .map(|_| LinearConfig::new(d_model, vocab).with_bias(false).with_initializer(init.clone()).init(device))
                .collect(),
            weight: cfg.weight,
            weighting: cfg.weighting,
            classifiers: (0..if cfg.classifier { blocks.saturating_sub(1) } else { 0 })
                .map(|_| LinearConfig::new(d_model, 1).with_initializer(init.clone()).init(device))
                .collect(),
            predictor: ExitPredictor::new(
                cfg.predictor,
                cfg.oracle,
                cfg.lambda,
                cfg.sigma,
                cfg.predictor_weight,
                blocks,
                d_model,
                init_std,
                device,
            ),
            mixed_paths: if cfg.training == ExitTraining::Mixed { cfg.paths } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::{Rows, cross_entropy};
    use crate::{ModelConfig, harness, zoo};

    /// The `early_exits` loss is Σ_{n<N} w_n L_n with the weighting's w_n: the mean (uniform),
    /// or n/N (CALM's ω_n / ω_N), here for N = 4 blocks.
    #[test]
    fn exit_losses_are_weighted_as_configured() {
        let dev = Device::flex();
        for weighting in [ExitWeighting::Uniform, ExitWeighting::Calm] {
            let exits = ExitConfig::EveryLayer(EveryLayerConfig { weighting, weight: 0.5, ..Default::default() });
            let cfg = ModelConfig { n_layers: 4, exits, ..zoo::tiny() };
            dev.seed(4);
            let model = cfg.init(&dev);
            let tokens = harness::tokens(1, 2, 9, 11, &dev);
            let (input, targets) = (tokens.clone().narrow(1, 0, 8), tokens.narrow(1, 1, 8));
            let (_, aux) = model.loss(input.clone(), targets.clone());
            let got = aux.iter().find(|(n, _)| n == "early_exits").unwrap().1.clone().into_scalar::<f32>();
            let hidden = model.forward(input).hidden;
            assert_eq!(hidden.len(), 3);
            let want: f64 = hidden
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    let l = cross_entropy(model.exit_logits(i, h), targets.clone()).into_scalar::<f32>() as f64;
                    let w = match weighting {
                        ExitWeighting::Uniform => 1.0 / 3.0,
                        ExitWeighting::Calm => (i + 1) as f64 / 4.0,
                    };
                    w * l
                })
                .sum::<f64>()
                * 0.5;
            assert!((got as f64 - want).abs() < 1e-5, "{weighting:?}: {got} vs {want}");
        }
    }

    fn mixed(shared: bool, paths: usize) -> ModelConfig {
        let c = EveryLayerConfig { shared, training: ExitTraining::Mixed, paths, ..Default::default() };
        ModelConfig { n_layers: 4, exits: ExitConfig::EveryLayer(c), ..zoo::tiny() }
    }

    fn path(exits: &[i64], dev: &Device) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(exits.to_vec(), [1, exits.len()]), dev)
    }

    /// On a path every token leaving at the last block is the plain forward; every token leaving
    /// at block n is the aligned forward's output of block n (nothing above it ran for anyone).
    #[test]
    fn a_path_through_one_block_is_that_blocks_output() {
        let dev = Device::flex();
        dev.seed(5);
        let model = mixed(false, 1).init(&dev);
        let tokens = harness::tokens(1, 1, 8, 11, &dev);
        let aligned = model.forward(tokens.clone());
        let last = model.forward_on_path(tokens.clone(), Rows::default(), None, Some(&path(&[3; 8], &dev)));
        let d = (last.logits - aligned.logits.clone()).abs().max().into_scalar::<f32>();
        assert!(d < 1e-6, "all at the last block: {d}");
        for n in 0..3 {
            let out = model.forward_on_path(tokens.clone(), Rows::default(), None, Some(&path(&[n; 8], &dev)));
            let d = (out.hidden[0].clone() - aligned.hidden[n as usize].clone()).abs().max().into_scalar::<f32>();
            assert!(d < 1e-6, "all at block {n}: {d}");
        }
    }

    /// A token's exit is its own: changing it changes that token's state and later ones' (they
    /// attend to its copied state) and none before it; and it does change what later tokens see
    /// in the blocks above the exit, which aligned training never shows them.
    #[test]
    fn a_tokens_exit_reaches_itself_and_later_tokens_only() {
        let dev = Device::flex();
        dev.seed(6);
        let model = mixed(true, 1).init(&dev);
        let tokens = harness::tokens(1, 1, 8, 11, &dev);
        let run = |exits: &[i64]| {
            let out = model.forward_on_path(tokens.clone(), Rows::default(), None, Some(&path(exits, &dev)));
            out.hidden[0].clone().abs().max_dim(2).reshape([8]).into_data().try_to_vec::<f32>().unwrap()
        };
        let (base, moved) = (run(&[3, 3, 3, 3, 3, 3, 3, 3]), run(&[3, 3, 3, 1, 3, 3, 3, 3]));
        assert_eq!(base[..3], moved[..3], "earlier tokens unchanged");
        for t in 3..8 {
            assert!(base[t] != moved[t], "token {t} must see the copied state");
        }
    }

    /// The mixed loss is the mean over the paths of each token's cross-entropy at its exit,
    /// per-exit classifiers read by hand; and mixed training's loss is such a loss, without the
    /// aligned `early_exits` term.
    #[test]
    fn the_mixed_loss_reads_each_token_at_its_exit() {
        let dev = Device::flex();
        dev.seed(7);
        let model = mixed(false, 3).init(&dev);
        let tokens = harness::tokens(1, 2, 9, 11, &dev);
        let (input, targets) = (tokens.clone().narrow(1, 0, 8), tokens.narrow(1, 1, 8));
        let ids: [[i64; 16]; 3] = [
            [0, 2, 0, 1, 2, 2, 0, 0, 0, 3, 0, 3, 3, 0, 3, 2],
            [3, 1, 2, 2, 1, 2, 0, 3, 2, 0, 2, 3, 2, 0, 3, 1],
            [1, 1, 1, 1, 0, 0, 0, 0, 3, 3, 3, 3, 2, 2, 2, 2],
        ];
        let paths: Vec<Tensor<2, Int>> =
            ids.iter().map(|p| Tensor::from_data(TensorData::new(p.to_vec(), [2, 8]), &dev)).collect();
        let (got, _) = model.loss_on_paths(input.clone(), targets.clone(), Rows::default(), false, &paths);
        let mut want = 0.0f64;
        for (exits, ids) in paths.iter().zip(&ids) {
            let out = model.forward_on_path(input.clone(), Rows::default(), None, Some(exits));
            let h = out.hidden[0].clone();
            let per_exit: Vec<Vec<f32>> = (0..4)
                .map(|i| {
                    let logits = if i == 3 { out.logits.clone() } else { model.exit_logits(i, h.clone()) };
                    let logp = burn::tensor::activation::log_softmax(logits, 2);
                    logp.gather(2, targets.clone().unsqueeze_dim::<3>(2)).into_data().try_to_vec::<f32>().unwrap()
                })
                .collect();
            let nll: f64 = ids.iter().enumerate().map(|(t, &e)| -per_exit[e as usize][t] as f64).sum();
            want += nll / 16.0 / 3.0;
        }
        let got = got.into_scalar::<f32>() as f64;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        let (sampled, aux) = model.loss(input, targets);
        assert!(aux.iter().all(|(n, _)| n != "early_exits"), "mixed training has no aligned exit loss");
        assert!(sampled.into_scalar::<f32>().is_finite());
    }

    #[test]
    fn mixed_training_refuses_what_it_cannot_train() {
        let refused = |c: EveryLayerConfig, says: &str| {
            let e = ExitConfig::EveryLayer(EveryLayerConfig { training: ExitTraining::Mixed, ..c }).validate();
            let e = e.unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        };
        refused(EveryLayerConfig { paths: 0, ..Default::default() }, "model.exits.paths must be at least 1");
        refused(EveryLayerConfig { classifier: true, ..Default::default() }, "the classifier and the exit predictors");
        let predictor = EveryLayerConfig { predictor: PredictorKind::Sequence, ..Default::default() };
        refused(predictor, "use training = \"aligned\"");
        refused(EveryLayerConfig { weighting: ExitWeighting::Calm, ..Default::default() }, "weight and weighting");
        refused(EveryLayerConfig { weight: 0.5, ..Default::default() }, "leave them unset");
        let toml: ExitConfig = toml::from_str("kind = \"every-layer\"\ntraining = \"mixed\"\npaths = 3").unwrap();
        assert_eq!(
            toml,
            ExitConfig::EveryLayer(EveryLayerConfig { training: ExitTraining::Mixed, paths: 3, ..Default::default() })
        );
    }
}
