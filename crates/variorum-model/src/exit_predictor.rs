//! The Depth-Adaptive Transformer's exit predictors (Elbayad et al. 2020), `model.exits.predictor`:
//! a small classifier that decides, before or while a token runs, which of the N exits it leaves
//! at. Each predicts a distribution q over exits n = 1…N and learns it by cross-entropy against
//! an oracle q* = δ(argmax_n S^n − λ·n), computed from the exits' own (detached) predictions:
//!
//! - `sequence`: one exit for a whole sequence, q(n|x) = softmax(W x̄ + b). The paper averages the
//!   encoder states of the source; a decoder-only LM has none, so x̄_t is the running mean of the
//!   first block's outputs over the tokens so far (causal, and steady within a sequence). The
//!   oracle scores S^n = mean_t LL^n_t (or the fraction of tokens exit n gets right): the paper's
//!   sum over tokens with λ scaled by the length, so one λ means the same per token everywhere.
//! - `token-multinomial`: q_t(n) = softmax(W h¹_t + b), from the first block's output.
//! - `token-geometric`: a halting unit per block, X^n_t = σ(w_n·h^n_t + b_n) for n < N, and
//!   q_t(n) = X^n_t Π_{n'<n}(1 − X^{n'}_t), q_t(N) = Π_{n'<N}(1 − X^{n'}_t).
//!
//! For the token-specific predictors S^n_t = Σ_{t'} κ(t, t') LL^n_{t'} with the RBF kernel
//! κ(t, t') = exp(−(t − t')²/σ) (σ = 0: no smoothing), so a decision also weighs its effect on the
//! neighbouring tokens. LL^n_t = log p(y_t | h^n_t) is the `likelihood` oracle; `correctness` uses
//! C^n_t = 1[y_t = argmax_y p(y | h^n_t)] instead.
//!
//! The predictors read the states detached (choice: they learn when to exit without changing what
//! the model predicts). At decoding time [`ExitPredictor::exit_log_probs`] gives q for the
//! multinomial kinds, and a token leaves at the first block whose cumulative q reaches the
//! threshold (the paper takes the argmax; the cumulative form can be calibrated like CALM's
//! measures); the geometric kind leaves at the first block whose X^n_t reaches it.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{log_sigmoid, log_softmax, sigmoid};
use serde::{Deserialize, Serialize};

/// `model.exits.predictor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PredictorKind {
    /// No exit predictor (CALM's confidence measures decide at decoding time).
    #[default]
    None,
    /// One exit per sequence, from the running mean of the first block's outputs.
    Sequence,
    /// One exit per token: a softmax over exits from the first block's output.
    TokenMultinomial,
    /// One exit per token: a halting unit per block before the last; q is where the token halts.
    TokenGeometric,
}

impl PredictorKind {
    /// The config value (`"token-multinomial"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Sequence => "sequence",
            Self::TokenMultinomial => "token-multinomial",
            Self::TokenGeometric => "token-geometric",
        }
    }
}

/// `model.exits.oracle`: what the predictor is trained to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Oracle {
    /// The exit with the best log-likelihood of the target, less λ·n.
    #[default]
    Likelihood,
    /// The exit whose top token is right most often, less λ·n.
    Correctness,
}

/// An exit predictor over `exits` exits.
#[derive(Module, Debug)]
pub struct ExitPredictor {
    /// One `d → N` layer (sequence, token-multinomial) or one `d → 1` halting unit per block
    /// before the last (token-geometric).
    pub layers: Vec<Linear>,
    /// Which predictor this is.
    #[module(skip)]
    pub kind: PredictorKind,
    /// What it learns to imitate.
    #[module(skip)]
    pub oracle: Oracle,
    /// λ, the cost of each block in the oracle.
    pub lambda: f64,
    /// σ of the RBF smoothing of token-specific oracles.
    pub sigma: f64,
    /// Weight of the predictor's loss.
    pub weight: f64,
    /// N, the exits it chooses among: the model's blocks.
    pub exits: usize,
}

/// What the oracle is computed from, per exit n = 1…N (the last is the model's head).
pub struct ExitScores {
    /// log p(y_t | h^n_t), `[batch, len, N]`.
    pub log_likelihood: Tensor<3>,
    /// 1[y_t = argmax p(· | h^n_t)], `[batch, len, N]`.
    pub correct: Tensor<3>,
}

impl ExitPredictor {
    /// `None` for [`PredictorKind::None`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: PredictorKind,
        oracle: Oracle,
        lambda: f64,
        sigma: f64,
        weight: f64,
        exits: usize,
        d_model: usize,
        init_std: f64,
        device: &Device,
    ) -> Option<Self> {
        let init = Initializer::Normal { mean: 0.0, std: init_std };
        let linear = |out: usize| LinearConfig::new(d_model, out).with_initializer(init.clone()).init(device);
        let layers = match kind {
            PredictorKind::None => return None,
            PredictorKind::Sequence | PredictorKind::TokenMultinomial => vec![linear(exits)],
            PredictorKind::TokenGeometric => (0..exits.saturating_sub(1)).map(|_| linear(1)).collect(),
        };
        Some(Self { layers, kind, oracle, lambda, sigma, weight, exits })
    }

    /// log q over the exits, `[batch, len, N]`, of the multinomial kinds from their input: the
    /// running mean of the first block's outputs (sequence) or those outputs (token-multinomial).
    /// The geometric kind's q needs every block ([`Self::geometric_log_probs`]).
    pub fn exit_log_probs(&self, input: Tensor<3>) -> Tensor<3> {
        log_softmax(self.layers[0].forward(input), 2)
    }

    /// X^n_t of block `n` (0-based, before the last), `[batch, len]`.
    pub fn halting(&self, n: usize, h: Tensor<3>) -> Tensor<2> {
        let [b, l, _] = h.dims();
        sigmoid(self.layers[n].forward(h)).reshape([b, l])
    }

    /// The geometric kind's log q, `[batch, len, N]`, from the outputs of blocks 1…N−1.
    pub fn geometric_log_probs(&self, hidden: &[Tensor<3>]) -> Tensor<3> {
        let z: Vec<Tensor<3>> = hidden.iter().zip(&self.layers).map(|(h, w)| w.forward(h.clone())).collect();
        let z = Tensor::cat(z, 2); // [b, l, N−1]
        let [b, l, _] = z.dims();
        let stay = log_sigmoid(z.clone().neg()); // log(1 − X^n)
        let stayed = stay.cumsum(2); // Σ_{n'≤n} log(1 − X^{n'})
        let before = Tensor::cat(vec![Tensor::zeros([b, l, 1], &z.device()), stayed.clone()], 2); // Σ_{n'<n}
        let n = self.exits;
        let exit_here = Tensor::cat(vec![log_sigmoid(z), Tensor::zeros([b, l, 1], &before.device())], 2);
        exit_here + before.narrow(2, 0, n)
    }

    /// log q for training from the outputs of blocks 1…N−1 (detached here).
    fn log_probs(&self, hidden: &[Tensor<3>]) -> Tensor<3> {
        let hidden: Vec<Tensor<3>> = hidden.iter().map(|h| h.clone().detach()).collect();
        match self.kind {
            PredictorKind::TokenGeometric => self.geometric_log_probs(&hidden),
            PredictorKind::Sequence => self.exit_log_probs(running_mean(hidden[0].clone())),
            _ => self.exit_log_probs(hidden[0].clone()),
        }
    }

    /// The oracle's exit per position (0-based), `[batch, len]`.
    pub fn oracle_exits(&self, scores: &ExitScores) -> Tensor<2, Int> {
        let s = match self.oracle {
            Oracle::Likelihood => scores.log_likelihood.clone(),
            Oracle::Correctness => scores.correct.clone(),
        }
        .detach();
        let [b, l, n] = s.dims();
        let device = s.device();
        let s = match self.kind {
            PredictorKind::Sequence => s.mean_dim(1).expand([b, l, n]),
            _ if self.sigma > 0.0 => rbf_kernel(l, self.sigma, &device).unsqueeze_dim::<3>(0).matmul(s),
            _ => s,
        };
        let cost = Tensor::<1, Int>::arange(1..n as i64 + 1, &device).float().mul_scalar(self.lambda);
        (s - cost.reshape([1, 1, n])).argmax(2).reshape([b, l])
    }

    /// The predictor's loss: cross-entropy of q against the oracle, weighted.
    pub fn loss(&self, hidden: &[Tensor<3>], scores: &ExitScores) -> Tensor<1> {
        let target = self.oracle_exits(scores).unsqueeze_dim::<3>(2);
        let log_q = self.log_probs(hidden);
        log_q.gather(2, target).mean().neg().mul_scalar(self.weight)
    }
}

/// x̄_t = (1/t) Σ_{t'≤t} x_{t'} along dimension 1.
pub fn running_mean(x: Tensor<3>) -> Tensor<3> {
    let l = x.dims()[1];
    let count = Tensor::<1, Int>::arange(1..l as i64 + 1, &x.device()).float().reshape([1, l, 1]);
    x.cumsum(1) / count
}

/// κ(t, t') = exp(−(t − t')²/σ), `[len, len]`. Only the oracle uses it, on one training window,
/// so the dense `len × len` matrix is fine here.
fn rbf_kernel(len: usize, sigma: f64, device: &Device) -> Tensor<2> {
    let t = Tensor::<1, Int>::arange(0..len as i64, device).float();
    let d = t.clone().reshape([len, 1]) - t.reshape([1, len]);
    d.powf_scalar(2.0).div_scalar(-sigma).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn predictor(kind: PredictorKind, oracle: Oracle, lambda: f64, sigma: f64, dev: &Device) -> ExitPredictor {
        ExitPredictor::new(kind, oracle, lambda, sigma, 1.0, 3, 8, 0.5, dev).unwrap()
    }

    #[test]
    fn geometric_distribution_sums_to_one_and_matches_its_definition() {
        let dev = Device::flex();
        let p = predictor(PredictorKind::TokenGeometric, Oracle::Likelihood, 0.0, 0.0, &dev);
        let hidden: Vec<Tensor<3>> =
            (0..2).map(|_| Tensor::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &dev)).collect();
        let q = p.geometric_log_probs(&hidden).exp();
        let sums = q.clone().sum_dim(2).into_data().try_to_vec::<f32>().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
        let x1 = p.halting(0, hidden[0].clone());
        let x2 = p.halting(1, hidden[1].clone());
        let ones = x1.ones_like();
        let expected = Tensor::stack::<3>(
            vec![x1.clone(), (ones.clone() - x1.clone()) * x2.clone(), (ones.clone() - x1) * (ones - x2)],
            2,
        );
        let diff = (q - expected).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn oracle_takes_the_best_exit_less_lambda_n() {
        let dev = Device::flex();
        // one sequence, 3 tokens, 3 exits
        let ll = Tensor::<3>::from_data(
            TensorData::new(vec![-3.0f32, -1.0, -0.9, -2.0, -2.0, -2.0, -0.5, -0.4, -3.0], [1, 3, 3]),
            &dev,
        );
        let scores = ExitScores { log_likelihood: ll.clone(), correct: ll.zeros_like() };
        let exits =
            |p: &ExitPredictor| p.oracle_exits(&scores).into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
        let token = |lambda| predictor(PredictorKind::TokenMultinomial, Oracle::Likelihood, lambda, 0.0, &dev);
        assert_eq!(exits(&token(1e-3)), vec![2, 0, 1]); // a tiny λ breaks ties towards the cheaper exit
        assert_eq!(exits(&token(0.2)), vec![1, 0, 0]); // −1 − 0.4 > −0.9 − 0.6; −0.5 − 0.2 > −0.4 − 0.4
        assert_eq!(exits(&token(10.0)), vec![0, 0, 0]);
        // sequence: mean LL per exit = (−1.83, −1.13, −1.97)
        let seq = predictor(PredictorKind::Sequence, Oracle::Likelihood, 1e-3, 0.0, &dev);
        assert_eq!(exits(&seq), vec![1, 1, 1]);
        // correctness oracle reads the other score
        let correct =
            Tensor::<3>::from_data(TensorData::new(vec![0.0f32, 0., 1., 0., 1., 1., 1., 0., 0.], [1, 3, 3]), &dev);
        let scores = ExitScores { log_likelihood: ll, correct };
        let p = predictor(PredictorKind::TokenMultinomial, Oracle::Correctness, 1e-3, 0.0, &dev);
        assert_eq!(p.oracle_exits(&scores).into_data().convert::<i64>().try_into_vec::<i64>().unwrap(), vec![2, 1, 0]);
    }

    #[test]
    fn rbf_smoothing_is_the_kernel_weighted_sum() {
        let dev = Device::flex();
        let ll: Tensor<3> = Tensor::random([1, 6, 3], Distribution::Normal(0.0, 1.0), &dev);
        let sigma = 2.0;
        let v = ll.clone().into_data().try_to_vec::<f32>().unwrap();
        let mut expected = vec![0i64; 6];
        for (t, e) in expected.iter_mut().enumerate() {
            let score = |n: usize| {
                (0..6).map(|u| (-((t as f64 - u as f64).powi(2)) / sigma).exp() * v[u * 3 + n] as f64).sum::<f64>()
                    - 0.1 * (n + 1) as f64
            };
            *e = (0..3).max_by(|&a, &b| score(a).total_cmp(&score(b))).unwrap() as i64;
        }
        let p = predictor(PredictorKind::TokenGeometric, Oracle::Likelihood, 0.1, sigma, &dev);
        let scores = ExitScores { log_likelihood: ll.clone(), correct: ll.zeros_like() };
        assert_eq!(p.oracle_exits(&scores).into_data().convert::<i64>().try_into_vec::<i64>().unwrap(), expected);
    }

    #[test]
    fn sequence_input_is_the_running_mean() {
        let dev = Device::flex();
        let x = Tensor::<3>::from_data(TensorData::new(vec![1.0f32, 3.0, 5.0], [1, 3, 1]), &dev);
        assert_eq!(running_mean(x).into_data().try_to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    }
}
