//! A prior on the scores conditioned on a task, the `task-prior` kind (Pilault, Elhattami, Pal
//! 2021, Conditionally Adaptive Multi-Task Learning, "conditional attention"): multi-head
//! attention plus a block-diagonal matrix computed from the example's task embedding z,
//!
//!   Attention(Q, K, V, z) = softmax(Q Kᵀ/√d + M(z)) V,   M(z) = ⊕_{n=1}^{N} A'_n(z),
//!   A'_n(z) = A_n ⊙ γ(z) + β(z),
//!
//! with A_n ∈ ℝ^{(L/N)×(L/N)} learned per diagonal block, γ and β FiLM maps ℝ^{D_z} → ℝ^{(L/N)²}
//! (Perez et al. 2018) and ⊕ the direct sum: query position i and key position j get
//! A'_n(z)[i mod L/N, j mod L/N] when both lie in block n, 0 otherwise. For a language model the
//! task is the example's tag from the data (`data.tags`: the play a window comes from, or a
//! corpus name), read from `AttentionMask::tags`.
//!
//! Choices where the paper leaves one open, or where we depart from it:
//! - The task embedding is this layer's own table (`tasks` rows of `task_dim`), not one shared
//!   by the model: the kind stays one file. Row 0 is the untagged example's (text before the
//!   first section, or a forward given no tags), so a model runs without tags too.
//! - γ and β are one linear map each (FiLM's), shared by the blocks; A_n are per block. M(z) is
//!   the same for every head, as in the paper.
//! - L is the model's context (`model.seq_len`) and the block size ⌈L/N⌉, so N need not divide L.
//!   Positions are absolute, so a cached query gets the row the full forward gives it; a
//!   position past the last block (none within the context) gets no prior.
//! - Initialisation: the paper draws A_n at random; we start it at 0, with γ's bias 1 and β's 0
//!   (small weights) and z ~ N(0, 1): M(z) starts near 0, so training starts from plain
//!   attention (as an adapter added to a trained model should) and the gradient reaches A_n
//!   through γ ≈ 1 from the first step.
//!
//! The causal form and cached decoding are `full`'s (a KV cache). M(z) needs every score, so
//! the fused attention kernel does not apply: this kind takes the composed path.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::ScoreLayout;

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};

attention_config! {
    /// `model.attention` with `kind = "task-prior"`.
    pub struct TaskPriorConfig {
        /// Rows of the task-embedding table: the example tags the layer tells apart (ids
        /// 0..tasks, 0 = untagged). Default 64; the data may have at most this many tags.
        pub tasks: usize = 64,
        /// D_z, the size of a task embedding. Default 16.
        pub task_dim: usize = 16,
        /// N, the diagonal blocks the context is cut into (each ⌈seq_len / N⌉ positions).
        /// Default 4.
        pub blocks: usize = 4,
    }
}

impl TaskPriorConfig {
    /// The layer for `d_model`: `full`'s heads, z ~ N(0, 1), FiLM with γ's bias 1 and β's 0,
    /// A_n at zero (M(z) starts near 0: plain attention); blocks of ⌈L/N⌉, L the context.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> TaskPriorAttention {
        let block = position.context.div_ceil(self.blocks).max(1);
        let cells = block * block;
        let mut film = normal_linear(self.task_dim, 2 * cells, true, init_std, device);
        let bias: Vec<f32> = (0..2 * cells).map(|i| if i < cells { 1.0 } else { 0.0 }).collect();
        film.bias = Some(Param::from_tensor(Tensor::<1>::from_floats(bias.as_slice(), device)));
        TaskPriorAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            tasks: Param::from_tensor(Tensor::random(
                [self.tasks, self.task_dim],
                Distribution::Normal(0.0, 1.0),
                device,
            )),
            film,
            blocks: Param::from_tensor(Tensor::zeros([self.blocks, block, block], device)),
            block,
        }
    }
}

impl AttentionKind for TaskPriorConfig {
    type Module = TaskPriorAttention;
    const SUMMARY: &'static str = "task prior (CAMTL): full attention plus a block-diagonal prior A_n ⊙ γ(z) + β(z) on the scores, z the embedding of the example's tag (data.tags); KV cache";
    const PAPER: &'static str = "Pilault, Elhattami, Pal 2021, Conditionally Adaptive Multi-Task Learning: Improving Transfer Learning in NLP Using Fewer Parameters & Less Data";
    const CAPS: Capabilities = Capabilities { reads_memory: false, ..caps::SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.tasks >= 1, || {
            "model.attention.tasks = 0 must be at least 1 (row 0 is the untagged example's; set it to the \
             number of tags data.tags finds)"
                .into()
        })?;
        check(self.task_dim >= 1, || "model.attention.task_dim = 0 must be at least 1, e.g. 16".into())?;
        check(self.blocks >= 1, || "model.attention.blocks = 0 must be at least 1, e.g. 4".into())
    }

    /// Full attention's, plus the prior: FiLM's two maps once per row (not per token), and one
    /// add per head and key.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k) + (self.n_heads * len_k) as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn tags(&self) -> Option<usize> {
        Some(self.tasks)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        TestVariant::score_path_with(Self::default(), Self { n_kv_heads: Some(2), blocks: 3, ..Self::default() })
    }
}

/// Multi-head attention plus a block-diagonal prior M(z) on the scores, conditioned on the
/// example's task embedding z.
#[derive(Module, Debug)]
pub struct TaskPriorAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// z per tag, `[tasks, task_dim]`; row 0 is the untagged example's.
    pub tasks: Param<Tensor<2>>,
    /// [γ | β]: z → `[2 · block²]`.
    pub film: Linear,
    /// A_n, `[blocks, block, block]`.
    pub blocks: Param<Tensor<3>>,
    /// ⌈L / N⌉.
    pub block: usize,
}

/// For every (query, key) entry of `layout`, its cell in the flattened `[N · block²]` blocks, or
/// `N · block²` (a zero appended after them) off the diagonal blocks.
fn cells(layout: &ScoreLayout, n_blocks: usize, block: usize) -> Vec<i64> {
    let off = (n_blocks * block * block) as i64;
    let mut index = Vec::with_capacity(layout.len_q * layout.len_k);
    for i in 0..layout.len_q {
        let q = layout.q_start + i * layout.stride;
        for j in 0..layout.len_k {
            let k = layout.k_start + j * layout.stride;
            let n = q / block;
            index.push(if n == k / block && n < n_blocks {
                ((n * block + q % block) * block + k % block) as i64
            } else {
                off
            });
        }
    }
    index
}

impl TaskPriorAttention {
    /// A'_n(z) for each row's tag, `[b, N, block, block]` (`tags: [b]`; `None`: tag 0).
    pub fn conditioned_blocks(&self, tags: Option<Tensor<1, Int>>, b: usize, device: &Device) -> Tensor<4> {
        let tags = tags.unwrap_or_else(|| Tensor::zeros([b], device));
        let z = self.tasks.val().select(0, tags);
        let [n, s, _] = self.blocks.dims();
        let cells = s * s;
        let film = self.film.forward(z);
        let gamma = film.clone().narrow(1, 0, cells).reshape([b, 1, s, s]);
        let beta = film.narrow(1, cells, cells).reshape([b, 1, s, s]);
        self.blocks.val().unsqueeze_dim::<4>(0) * gamma + beta.expand([b, n, s, s])
    }

    /// M(z), `[b, 1, len_q, len_k]`: each row's conditioned blocks placed on the diagonal of
    /// the positions of `layout`, 0 elsewhere.
    pub fn prior(&self, tags: Option<Tensor<1, Int>>, layout: &ScoreLayout, b: usize, device: &Device) -> Tensor<4> {
        let a = self.conditioned_blocks(tags, b, device);
        let [_, n, s, _] = a.dims();
        let flat = Tensor::cat(vec![a.reshape([b, n * s * s]), Tensor::zeros([b, 1], device)], 1);
        let (lq, lk) = (layout.len_q, layout.len_k);
        let index = Tensor::<1, Int>::from_data(TensorData::new(cells(layout, n, s), [lq * lk]), device);
        flat.gather(1, index.unsqueeze_dim::<2>(0).expand([b, lq * lk])).reshape([b, 1, lq, lk])
    }

    /// `full`'s forward (keys after `cache`'s) with M(z) of each row's tag (`input.mask.tags`;
    /// none: tag 0) added to the scaled scores.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let [b, _, _] = input.query.dims();
        let device = input.query.device();
        let tags = input.mask.tags.clone();
        self.attention.forward_with_score_bias(input, cache, |p| self.prior(tags, &p.layout, b, &device))
    }

    /// The projections a forward forms (for tests and inspection).
    pub fn project(&self, x: Tensor<3>, mask: &AttentionMask) -> Projected {
        self.attention.project(x, None, mask, None)
    }
}

impl AttentionMechanism for TaskPriorAttention {
    kv_cache_hooks!();

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::softmax;

    const L: usize = 8;

    /// A layer of context L = 8 in N = 3 blocks of 3 (the last block runs past the context),
    /// its prior made non-trivial: random A_n and FiLM weights.
    fn setup(device: &Device) -> (TaskPriorAttention, Tensor<3>) {
        device.seed(11);
        let cfg = TaskPriorConfig { tasks: 5, task_dim: 4, blocks: 3, ..Default::default() };
        cfg.validate(16).unwrap();
        let position = Positioning { context: L, ..Positioning::NONE };
        let mut attn = cfg.init(16, 0.2, 0.2, position, device);
        attn.blocks = Param::from_tensor(Tensor::random([3, 3, 3], Distribution::Normal(0.0, 1.0), device));
        attn.film.weight = Param::from_tensor(Tensor::random([4, 18], Distribution::Normal(0.0, 0.5), device));
        (attn, Tensor::random([3, L, 16], Distribution::Normal(0.0, 1.0), device))
    }

    fn tags(ids: &[i64], device: &Device) -> Option<Tensor<1, Int>> {
        Some(Tensor::from_data(TensorData::new(ids.to_vec(), [ids.len()]), device))
    }

    fn output(attn: &TaskPriorAttention, x: Tensor<3>, mask: &AttentionMask) -> AttentionOutput {
        TaskPriorAttention::forward(attn, AttentionInput::self_attention(x, mask).with_weights(), None)
    }

    fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn the_prior_is_the_direct_sum_of_the_film_modulated_blocks() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let ids = [2i64, 0, 4];
        let film = attn.film.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let film_bias = attn.film.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        let table = attn.tasks.val().into_data().try_to_vec::<f32>().unwrap();
        let a = attn.blocks.val().into_data().try_to_vec::<f32>().unwrap();
        let mut m = vec![0.0f32; 3 * L * L];
        for (r, &t) in ids.iter().enumerate() {
            let z = &table[t as usize * 4..t as usize * 4 + 4];
            // [γ | β] = z W + b, 9 cells each
            let film_out: Vec<f32> =
                (0..18).map(|c| film_bias[c] + (0..4).map(|i| z[i] * film[i * 18 + c]).sum::<f32>()).collect();
            for i in 0..L {
                for j in 0..L {
                    if i / 3 == j / 3 {
                        let (n, cell) = (i / 3, (i % 3) * 3 + j % 3);
                        m[(r * L + i) * L + j] = a[n * 9 + cell] * film_out[cell] + film_out[9 + cell];
                    }
                }
            }
        }
        let m = Tensor::<1>::from_floats(m.as_slice(), &dev).reshape([3, 1, L, L]);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let mask = mask.with_tags(tags(&ids, &dev));
            let p = attn.project(x.clone(), &mask);
            let prior = attn.prior(mask.tags.clone(), &p.layout, 3, &dev);
            assert!(max_diff(prior, m.clone()) < 1e-5, "M(z) is not ⊕ A_n ⊙ γ(z) + β(z)");
            let a = &attn.attention;
            let want = softmax(a.mask_scores(a.scores(&p) + m.clone(), &mask, None, &p), 3);
            let diff = max_diff(output(&attn, x.clone(), &mask).weights.unwrap(), want);
            assert!(diff < 1e-5, "causal {}: weights differ from softmax(QKᵀ/√d + M(z)) by {diff}", mask.causal);
        }
    }

    #[test]
    fn a_zero_prior_is_plain_multi_head_attention() {
        let dev = Device::flex();
        let (mut attn, x) = setup(&dev);
        let mask = AttentionMask::causal().with_tags(tags(&[1, 2, 3], &dev));
        let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        assert!(max_diff(output(&attn, x.clone(), &mask).context, plain.clone()) > 1e-4, "the prior must act");
        // FiLM's weights and biases 0, so γ = β = 0: M(z) = A_n ⊙ 0 + 0 = 0 whatever the task
        attn.film.weight = Param::from_tensor(Tensor::zeros([4, 18], &dev));
        attn.film.bias = Some(Param::from_tensor(Tensor::zeros([18], &dev)));
        let diff = max_diff(output(&attn, x, &mask).context, plain);
        assert!(diff < 1e-6, "a zero prior differs from full attention by {diff}");
    }

    #[test]
    fn each_row_is_conditioned_on_its_own_tag_alone() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let causal = AttentionMask::causal();
        let batch = output(&attn, x.clone(), &causal.clone().with_tags(tags(&[1, 3, 0], &dev))).context;
        for (r, t) in [(0usize, 1i64), (1, 3), (2, 0)] {
            let row = x.clone().narrow(0, r, 1);
            let alone = output(&attn, row.clone(), &causal.clone().with_tags(tags(&[t], &dev))).context;
            assert!(max_diff(alone, batch.clone().narrow(0, r, 1)) < 1e-5, "row {r} read another row's tag");
            let other = output(&attn, row, &causal.clone().with_tags(tags(&[(t + 1) % 5], &dev))).context;
            let moved = max_diff(other, batch.clone().narrow(0, r, 1));
            assert!(moved > 1e-4, "row {r}: another tag must change the output (moved {moved})");
        }
        // no tags = tag 0 for every row
        let untagged = output(&attn, x.clone(), &causal).context;
        let zeros = output(&attn, x, &causal.with_tags(tags(&[0, 0, 0], &dev))).context;
        assert!(max_diff(untagged, zeros) < 1e-6, "an untagged forward is not tag 0");
    }

    #[test]
    fn causal_and_cached_decoding_equals_the_full_forward() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let t = tags(&[4, 1, 2], &dev);
        let causal = AttentionMask::causal().with_tags(t.clone());
        let full = output(&attn, x.clone(), &causal).context;
        // a later token changes no earlier output
        let changed = x
            .clone()
            .slice_assign([0..3, L - 1..L, 0..16], Tensor::random([3, 1, 16], Distribution::Normal(0.0, 1.0), &dev));
        let after = output(&attn, changed, &causal).context;
        let leak = max_diff(after.narrow(1, 0, L - 1), full.clone().narrow(1, 0, L - 1));
        assert!(leak < 1e-6, "a later position changed an earlier output by {leak}");
        // a prompt of 4 (crossing a block boundary), then one token at a time
        let mut cache = KvCache::default();
        let prompt = AttentionInput::self_attention(x.clone().narrow(1, 0, 4), &causal);
        let mut steps = vec![TaskPriorAttention::forward(&attn, prompt, Some(&mut cache)).context];
        for i in 4..L {
            let mask = AttentionMask::causal().at(i, 0).with_tags(t.clone());
            let input = AttentionInput::self_attention(x.clone().narrow(1, i, 1), &mask);
            steps.push(TaskPriorAttention::forward(&attn, input, Some(&mut cache)).context);
        }
        let diff = max_diff(Tensor::cat(steps, 1), full);
        assert!(diff < 1e-5, "cached decoding differs from the full forward by {diff}");
    }

    #[test]
    fn the_blocks_the_film_and_the_task_table_learn() {
        let dev = Device::flex().autodiff();
        let (attn, x) = setup(&dev);
        let mask = AttentionMask::causal().with_tags(tags(&[1, 2, 1], &dev));
        let out = TaskPriorAttention::forward(&attn, AttentionInput::self_attention(x, &mask), None);
        let grads = out.context.powf_scalar(2.0).sum().backward();
        let sum = |g: Option<Tensor<2>>| g.map_or(0.0, |g| g.abs().sum().into_scalar::<f32>());
        let blocks = attn.blocks.grad(&grads).map_or(0.0, |g| g.abs().sum().into_scalar::<f32>());
        let film = sum(attn.film.weight.grad(&grads));
        let table = attn.tasks.grad(&grads).expect("a gradient into the task table");
        // only the rows of the tags used get one
        let rows = table.abs().sum_dim(1).into_data().try_to_vec::<f32>().unwrap();
        assert!(blocks > 0.0 && film > 0.0, "no gradient into the prior: A {blocks}, FiLM {film}");
        assert!(rows[1] > 0.0 && rows[2] > 0.0, "no gradient into the used tags' embeddings: {rows:?}");
        assert_eq!((rows[0], rows[3], rows[4]), (0.0, 0.0, 0.0), "unused tags got a gradient: {rows:?}");
    }
}
