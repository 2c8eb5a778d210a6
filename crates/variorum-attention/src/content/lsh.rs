//! LSH attention (Kitaev et al. 2020, Reformer), the `lsh` kind. Queries and keys share one
//! projection (shared-QK: k_j = q_j / ‖q_j‖), and a query attends only to keys that hash to its
//! bucket under random rotations,
//!
//! h(x) = argmax([xR; −xR]),   R ∈ ℝ^{d × b/2} random, b buckets,
//!
//! o_i = Σ_{j ∈ P_i} exp(q_i·k_j/√d − z(i, P_i)) v_j,   P_i = {j : h(k_i) = h(k_j)}.
//!
//! Computed as in the paper ([`crate::pattern::sorted_chunks`]): per hash round, positions are sorted by
//! (bucket, position), cut into chunks of m, and each chunk attends to itself and the chunk
//! before — O(L·m) scores, plus the sort. Within those keys only same-bucket pairs count. A position does not attend to itself
//! unless nothing else is available (its score is set to −10⁵). Several rounds (`rounds`) are
//! combined as in the paper's appendix: within round r the score of key j loses log N_ij, N_ij
//! the number of rounds in which j is among the keys i sees, and the rounds are weighted by their
//! normalisers, o_i = Σ_r exp(z_r(i) − log Σ_r' exp z_r'(i)) o_i^r. Together that is one softmax
//! over the union of the rounds' keys — a key met in r rounds counts once, not r times.
//!
//! Causal: a chunk boundary in the sorted order depends on how many later positions hash to lower
//! buckets, which would leak the future into the set of keys a query sees. Our causal variant
//! therefore lets a query see the m positions before it *in the sorted order* (not "its chunk and
//! the one before"), restricted to its bucket: that is the last m earlier positions of its own
//! bucket, which depend on the past alone. Cached decoding then equals the full forward: the cache
//! remembers every position's buckets, and a new token scores itself and the last m earlier
//! positions of its bucket, per round (O(m) on the device per token).
//!
//! On flex without dropout the rounds run on the block-sparse kernel ([`crate::pattern::sorted_kernel`]):
//! each round a piece over its sorted order, the pieces merged into the same one softmax.
//!
//! The rotations R are drawn per head and round from a ChaCha stream seeded by (`seed`, layer):
//! fixed per layer and reproducible (the paper draws new ones for every forward).
//! `layout = "transformers"` is the same mechanism as transformers' Reformer arranges it
//! ([`LshLayout::Transformers`]): what `variorum import` makes of a `ReformerForMaskedLM`.
//!
//! No relative position scheme applies (there is no score matrix to bias); absolute ones do. No
//! memory either (`reads_memory: false`): shared-QK sorts the queries and keys of the same
//! positions together.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::concat_heads;
use crate::engine::projections;
use crate::engine::qkv::{normal_linear, project_heads};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::pattern::adjacent_chunks::{ChunkItems, adjacent_chunk_attention};
use crate::pattern::sorted_chunks::{RoundLayout, SortedItems, attend_picked, host, sorted_chunk_attention};
use crate::pattern::sorted_kernel;
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "lsh"`.
    pub struct LshConfig [n_heads, head_dim, dropout, bias] {
        /// b, hash buckets: 1 or an even number. Default 8.
        pub buckets: usize = 8,
        /// Hash rounds combined per query. Default 2.
        pub rounds: usize = 2,
        /// m, the chunk of the sorted sequence a query attends within (and the one before). Default 32.
        pub chunk: usize = 32,
        /// Seed of the random rotations (mixed with the layer index). Default 0.
        pub seed: u64 = 0,
        /// `"paper"` (above) or `"transformers"`, LSH attention as transformers' Reformer
        /// computes it ([`LshLayout::Transformers`]). Default paper.
        pub layout: LshLayout = LshLayout::Paper,
        /// Transformers layout: chunks before a query's chunk it sees. Default 1.
        pub chunks_before: usize = 1,
        /// Transformers layout: chunks after it. Default 0.
        pub chunks_after: usize = 0,
        /// Transformers layout: a sequence longer than `chunk` is padded (hidden keys, a bucket
        /// of their own after the others) to a multiple of this, a multiple of `chunk`.
        /// Default `chunk`.
        pub pad_to: Option<usize> = None,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]).
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

impl LshConfig {
    fn head_dim(&self, d_model: usize) -> usize {
        self.head_shape(d_model).head_dim
    }

    /// The layer: `init_std` for the shared query/key and value projection, `out_std` for the
    /// output.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LshAttention {
        let (h, hd) = (self.n_heads, self.head_dim(d_model));
        LshAttention {
            qv: normal_linear(d_model, 2 * h * hd, self.bias, init_std, device),
            out: normal_linear(h * hd, d_model, self.bias, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: h,
            head_dim: hd,
            buckets: self.buckets,
            rounds: self.rounds,
            chunk: self.chunk,
            seed: self.seed,
            layer: self.layer,
            layout: self.layout,
            chunks_before: self.chunks_before,
            chunks_after: self.chunks_after,
            pad_to: self.pad_to.unwrap_or(self.chunk),
            rotations: None,
        }
    }
}

impl AttentionKind for LshConfig {
    type Module = LshAttention;
    const SUMMARY: &'static str = "Reformer LSH attention: shared-QK, random-rotation hashing into buckets, several rounds, sorted chunks attending to themselves and the chunk before (causal: the m positions before in the sorted order)";
    const PAPER: &'static str = "Kitaev et al. 2020, Reformer: The Efficient Transformer";
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::NO_SCORES };

    fn capabilities(&self) -> Capabilities {
        match self.layout {
            LshLayout::Paper => Self::CAPS,
            LshLayout::Transformers => Capabilities { causal: false, incremental: false, ..Self::CAPS },
        }
    }

    fn why_not_causal(&self) -> &'static str {
        "layout = \"transformers\" cuts chunks from an order that later positions' buckets decide"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, self.chunk, d_model)?;
        crate::kind::check_dropout(self.dropout)?;
        check(self.buckets == 1 || (self.buckets >= 2 && self.buckets % 2 == 0), || {
            format!("model.attention.buckets = {} must be 1 or even (h(x) = argmax([xR; −xR]))", self.buckets)
        })?;
        check(self.rounds >= 1, || "model.attention.rounds must be at least 1".into())?;
        match self.layout {
            LshLayout::Paper => check((self.chunks_before, self.chunks_after, self.pad_to) == (1, 0, None), || {
                "model.attention: chunks_before, chunks_after and pad_to are read only with layout = \"transformers\""
                    .into()
            }),
            LshLayout::Transformers => {
                let pad_to = self.pad_to.unwrap_or(self.chunk);
                check(pad_to >= 1 && pad_to % self.chunk == 0, || {
                    format!("model.attention.pad_to = {pad_to} must be a multiple of chunk = {}", self.chunk)
                })
            }
        }
    }

    head_settings_hooks!();

    /// Multiply–adds per token: projections, the rotations, 2m scores and 2m value rows per round.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let (h, hd) = (self.n_heads as u64, self.head_dim(d_model) as u64);
        let keys = (2 * self.chunk).min(len_k) as u64;
        let per_round = h * (hd * self.buckets as u64 / 2 + 2 * keys * hd);
        2 * (3 * d_model as u64 * h * hd + self.rounds as u64 * per_round)
    }

    /// The rotations are seeded by the layer too.
    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn build(&self, init: &LayerInit, device: &Device) -> LshAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // several chunks and buckets at the harness's lengths
        let transformers = Self { layout: LshLayout::Transformers, pad_to: Some(6), ..Self::default() };
        vec![
            TestVariant::new("", Self { buckets: 4, rounds: 2, chunk: 3, ..Default::default() }),
            TestVariant::new("transformers", Self { buckets: 4, rounds: 2, chunk: 3, ..transformers }).masked(),
        ]
    }
}

/// How the hashed positions are arranged into what each query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LshLayout {
    /// As the paper describes it (above): per round, chunks of the round's sorted order, keys of
    /// the query's bucket only, scores q·k̂/√d, a key met in several rounds counted once; causal
    /// by the sorted order.
    #[default]
    Paper,
    /// As transformers' `LSHSelfAttention` computes it (bidirectional only): the rounds' sorted
    /// orders one after the other, cut into chunks of m, each seeing `chunks_before` and
    /// `chunks_after` neighbouring chunks modulo their number (`pattern::adjacent_chunks`: a
    /// round's first chunk sees the previous round's last) with every key in them, whatever its
    /// bucket; scores q·k̂ with k̂ = k / √(mean(k²) + 10⁻⁶) / √d, about q·k/‖k‖ (no further
    /// 1/√d); a key met in several rounds counts once per round (the rounds' outputs weighted
    /// by their normalisers, no correction); a sequence of at most m positions attended to in
    /// full. The rotations are the seeded ones of the paper layout, fixed per layer:
    /// transformers draws new ones every forward (its outputs vary from call to call), and a
    /// draw of its can be handed to a layer (the `rotations` field of [`LshAttention`]) to compare the two.
    /// transformers' causal LSH picks a query's chunk mates by hashing later tokens; this
    /// layout has no causal form.
    Transformers,
}

/// A Reformer LSH attention layer ([`LshConfig`]): shared-QK heads hashed into buckets.
#[derive(Module, Debug)]
pub struct LshAttention {
    /// The shared query/key projection and the value projection, fused.
    pub qv: Linear,
    /// The output projection, `h · d_h → d_model`.
    pub out: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Heads h.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// b, hash buckets: 1 or even.
    pub buckets: usize,
    /// Hash rounds combined per query.
    pub rounds: usize,
    /// m, the chunk of the sorted sequence a query attends within (and the one before);
    /// causal: the m earlier positions of its bucket.
    pub chunk: usize,
    /// Seed of the random rotations, mixed with `layer`.
    pub seed: u64,
    /// The layer's index, mixed into the rotations' seed so each layer hashes differently.
    pub layer: usize,
    /// Paper or transformers' arrangement ([`LshLayout`]).
    #[module(skip)]
    pub layout: LshLayout,
    /// Transformers layout: chunks seen before the query's.
    #[module(skip)]
    pub chunks_before: usize,
    /// Transformers layout: chunks seen after the query's.
    #[module(skip)]
    pub chunks_after: usize,
    /// Transformers layout: longer sequences are padded to a multiple of this.
    #[module(skip)]
    pub pad_to: usize,
    /// Transformers layout: rotations given from outside, `[heads, head_dim, rounds,
    /// buckets / 2]` as transformers lays them out (no gradient) — a draw of transformers' to
    /// compare with it; `None` (as built): the seeded draws of the paper layout.
    pub rotations: Option<Param<Tensor<4>>>,
}

/// A position's score against itself: below any real score, above a masked one.
const SELF_SCORE: f32 = -1e5;

impl LshAttention {
    /// The rotations of round `round`, `[1, heads, head_dim, buckets / 2]`, N(0, 1) entries.
    fn rotations(&self, round: usize, device: &Device) -> Tensor<4> {
        let half = self.buckets / 2;
        let stream = self.seed ^ (self.layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (round as u64) << 40;
        let mut rng = ChaCha8Rng::seed_from_u64(stream);
        let n = self.n_heads * self.head_dim * half;
        // Box–Muller: rand_distr would be a dependency for this one line
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let (u, v): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect();
        Tensor::from_data(TensorData::new(values, [1, self.n_heads, self.head_dim, half]), device)
    }

    /// Bucket of each key in round `round`, `[b, heads, len]` (keys `[b, heads, len, head_dim]`).
    pub fn buckets(&self, keys: Tensor<4>, round: usize) -> Tensor<3, Int> {
        let [b, h, l, _] = keys.dims();
        if self.buckets == 1 {
            return Tensor::zeros([b, h, l], &keys.device());
        }
        // no gradient flows through an argmax: detached, the graph keeps none of this
        let rotated = keys.clone().detach().matmul(self.rotations(round, &keys.device()));
        Tensor::cat(vec![rotated.clone(), rotated.neg()], 3).argmax(3).squeeze_dim::<3>(3)
    }

    /// Shared query/key and value heads, `[b, heads, len, head_dim]` each.
    fn project(&self, x: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let [q, v]: [Tensor<4>; 2] =
            project_heads(&self.qv, x, 2, self.n_heads, self.head_dim).try_into().expect("two parts");
        (q, v)
    }

    /// Self-attention over the hash buckets (`key_value` must be `None`), `[b, len_q, d_model]`.
    /// The cache keeps every position's projection, value and buckets; one causal token is O(m).
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        // shared-QK: keys come from the queries' positions (models refuse a memory with it)
        assert!(input.key_value.is_none(), "lsh attention is self-attention only (shared queries and keys)");
        let causal = input.mask.causal;
        if self.layout == LshLayout::Transformers {
            assert!(!causal && cache.is_none(), "layout = \"transformers\" is bidirectional (models refuse it causal)");
            let (q, v) = self.project(input.query);
            let context = concat_heads(self.attend_as_transformers(q, v, input.mask.padding.clone()));
            return AttentionOutput { context: self.out.forward(context), weights: None, aux_losses: Vec::new() };
        }
        let (q, v) = self.project(input.query);
        let [b, h, lq, _] = q.dims();
        let context = match cache {
            None => self.attend_all(q, v, lq, causal),
            Some(cache) => {
                // the cache keeps every position's shared projection, value and buckets
                let buckets: Vec<Vec<i64>> = (0..self.rounds).map(|r| host(self.buckets(unit(q.clone()), r))).collect();
                for t in 0..lq {
                    let tags = (0..b * h).flat_map(|bh| buckets.iter().map(move |round| round[bh * lq + t]));
                    cache.tags.push(tags.collect());
                }
                let (all_q, all_v) = cache.append(q.clone(), v);
                if lq == 1 && causal && cache.tags.len() == cache.len() {
                    concat_heads(self.decode_one(q, cache))
                } else {
                    self.attend_all(all_q, all_v, lq, causal)
                }
            }
        };
        AttentionOutput { context: self.out.forward(context), weights: None, aux_losses: Vec::new() }
    }

    /// Every round over all positions; the outputs of the last `lq`, heads merged, `[b, lq, h · hd]`.
    fn attend_all(&self, q: Tensor<4>, v: Tensor<4>, lq: usize, causal: bool) -> Tensor<3> {
        let [b, h, l, hd] = q.dims();
        if crate::engine::heads::kernel_takes(&self.dropout, &q) {
            // hashed as the cache and the composed path hash them; the kernel's keys carry the
            // 1/√d of the scores
            let keys = unit(q.clone());
            let buckets: Vec<Vec<i64>> = (0..self.rounds).map(|r| host(self.buckets(keys.clone(), r))).collect();
            let keys = keys.div_scalar((hd as f64).sqrt());
            if let Some(context) = sorted_kernel::hash_rounds(q.clone(), keys, v.clone(), &buckets, self.chunk, causal)
            {
                return context.narrow(1, l - lq, lq);
            }
        }
        let keys = unit(q.clone());
        let position = Tensor::<1, Int>::arange(0..l as i64, &q.device()).reshape([1, 1, l]).expand([b, h, l]);
        // sorted by (bucket, position)
        let layouts: Vec<RoundLayout> = (0..self.rounds)
            .map(|r| {
                let bucket = self.buckets(keys.clone(), r);
                RoundLayout::new(bucket.clone(), bucket.mul_scalar(l as i64) + position.clone())
            })
            .collect();
        let duplicates = if self.rounds > 1 { layouts.clone() } else { Vec::new() };
        let rounds = layouts.into_iter().map(|layout| {
            let bucket = layout.bucket.float();
            let items = SortedItems {
                q: q.clone(),
                k: keys.clone(),
                v: v.clone(),
                sort_key: layout.rank,
                query_bucket: bucket.clone(),
                key_bucket: bucket,
                rounds: duplicates.clone(),
            };
            sorted_chunk_attention(items, self.chunk, causal, Some(SELF_SCORE), &self.dropout)
        });
        concat_heads(combine_rounds(rounds.collect()).narrow(2, l - lq, lq))
    }

    /// The newest position's query (causal) against the keys it sees, read from the buckets the
    /// cache remembers: itself and the last m earlier positions of its bucket, per round —
    /// O(m) work on the device per token, whatever the context.
    fn decode_one(&self, q: Tensor<4>, cache: &KvCache) -> Tensor<4> {
        let [b, h, _, _] = q.dims();
        let (tags, l) = (&cache.tags, cache.len());
        // picks[round][b·h]: itself, then the last m earlier positions of its bucket
        let picks: Vec<Vec<Vec<i64>>> = (0..self.rounds)
            .map(|r| {
                (0..b * h)
                    .map(|bh| {
                        let at = bh * self.rounds + r;
                        let bucket = tags[l - 1][at];
                        let earlier = (0..l - 1).rev().filter(|&p| tags[p][at] == bucket).take(self.chunk);
                        std::iter::once(l as i64 - 1).chain(earlier.map(|p| p as i64)).collect()
                    })
                    .collect()
            })
            .collect();
        // in how many rounds each picked position is picked (the duplicate correction)
        let met: Vec<Vec<Vec<usize>>> = picks
            .iter()
            .map(|round| {
                let count = |bh: usize, p: &i64| picks.iter().filter(|other| other[bh].contains(p)).count();
                round.iter().enumerate().map(|(bh, row)| row.iter().map(|p| count(bh, p)).collect()).collect()
            })
            .collect();
        let rounds = picks.iter().zip(&met).map(|(picks, met)| {
            let met = (self.rounds > 1).then_some(met.as_slice());
            attend_picked(q.clone(), cache, picks, self.chunk + 1, Some(SELF_SCORE), true, met)
        });
        combine_rounds(rounds.collect())
    }
}

impl LshAttention {
    /// [`LshLayout::Transformers`]: `[b, h, len, hd]` outputs from the shared projections `qk`
    /// and values `v`, padded keys (`[b, len]`, true = padding) hidden and sorted last.
    fn attend_as_transformers(&self, qk: Tensor<4>, v: Tensor<4>, padding: Option<Tensor<2, Bool>>) -> Tensor<4> {
        let [b, h, len, hd] = qk.dims();
        let device = qk.device();
        let m = self.chunk;
        let n = if len <= m { len } else { len.next_multiple_of(self.pad_to) };
        let pad = |t: Tensor<4>| match n - len {
            0 => t,
            extra => Tensor::cat(vec![t, Tensor::zeros([b, h, extra, hd], &device)], 2),
        };
        let (qk, v) = (pad(qk), pad(v));
        let keys = qk.clone() / (qk.clone().powf_scalar(2.0).mean_dim(3) + 1e-6).sqrt() / (hd as f64).sqrt();
        let position: Tensor<3, Int> = Tensor::arange(0..n as i64, &device).reshape([1, 1, n]).expand([b, h, n]);
        let given = padding.map(|p| {
            let p = Tensor::cat(vec![p.int(), Tensor::zeros([b, n - len], &device)], 1);
            p.equal_elem(1).unsqueeze_dim::<3>(1).expand([b, h, n])
        });
        let hidden = match (given, n > len) {
            (Some(g), _) => Some(g.bool_or(position.clone().greater_equal_elem(len as i64))),
            (None, true) => Some(position.clone().greater_equal_elem(len as i64)),
            (None, false) => None,
        };
        if n <= m {
            let items = ChunkItems { q: qk, k: keys, v, position, hidden };
            let full = adjacent_chunk_attention(items, n, 0, 0, false, Some(SELF_SCORE), &self.dropout, false);
            return full.out.narrow(2, 0, len);
        }
        // per round: buckets (hidden positions in an extra one), offset by the round so the
        // rounds sort one after the other; a bucket's positions in order
        let rotations = self.rotations.as_ref().map(|r| r.val());
        let extra = hidden.is_some();
        let per_round = self.buckets + extra as usize;
        let sort_keys: Vec<Tensor<3, Int>> = (0..self.rounds)
            .map(|r| {
                let bucket = match (&rotations, self.buckets) {
                    (_, 1) => Tensor::zeros([b, h, n], &device),
                    (Some(all), _) => {
                        let half = self.buckets / 2;
                        let rotation = all.clone().narrow(2, r, 1).reshape([1, h, hd, half]);
                        let rotated = qk.clone().detach().matmul(rotation);
                        Tensor::cat(vec![rotated.clone(), rotated.neg()], 3).argmax(3).squeeze_dim::<3>(3)
                    }
                    (None, _) => self.buckets(qk.clone(), r),
                };
                let bucket = match &hidden {
                    Some(hidden) => bucket.mask_fill(hidden.clone(), self.buckets as i64),
                    None => bucket,
                };
                (bucket + (r * per_round) as i64).mul_scalar(n as i64) + position.clone()
            })
            .collect();
        // [b, h, R·n]: indices r·n + position into the rounds laid end to end
        let order = Tensor::cat(sort_keys, 2).argsort(2);
        let at = order.clone().remainder_scalar(n as i64);
        let pick =
            |t: &Tensor<4>| t.clone().gather(2, at.clone().unsqueeze_dim::<4>(3).expand([b, h, self.rounds * n, hd]));
        let items = ChunkItems {
            q: pick(&qk),
            k: pick(&keys),
            v: pick(&v),
            position: at.clone(),
            hidden: hidden.map(|hd| hd.int().gather(2, at.clone()).equal_elem(1)),
        };
        let chunked = adjacent_chunk_attention(
            items,
            m,
            self.chunks_before,
            self.chunks_after,
            false,
            Some(SELF_SCORE),
            &self.dropout,
            false,
        );
        let (out, z) = (chunked.out, chunked.log_normaliser);
        // back to (round, position) order, then the rounds weighted by their normalisers
        let inverse = order.argsort(2).unsqueeze_dim::<4>(3);
        let out =
            out.gather(2, inverse.clone().expand([b, h, self.rounds * n, hd])).reshape([b, h, self.rounds, n, hd]);
        let z = z.gather(2, inverse).reshape([b, h, self.rounds, n, 1]);
        let weights = softmax(z, 2);
        (out * weights).sum_dim(2).reshape([b, h, n, hd]).narrow(2, 0, len)
    }
}

/// Rounds' outputs weighted by their normalisers: softmax over the rounds of log Σ exp(scores).
/// With the duplicate correction in the scores this is one softmax over the union of the rounds'
/// keys (Reformer, appendix): Σ_r e^{z_r} o_r / Σ_r e^{z_r} = Σ_{j ∈ ∪P_r} e^{s_ij} v_j / Σ e^{s_ij}.
fn combine_rounds(mut rounds: Vec<(Tensor<4>, Tensor<4>)>) -> Tensor<4> {
    if rounds.len() == 1 {
        return rounds.pop().expect("one round").0;
    }
    let weights = softmax(Tensor::cat(rounds.iter().map(|(_, z)| z.clone()).collect(), 3), 3);
    rounds.into_iter().enumerate().map(|(r, (o, _))| o * weights.clone().narrow(3, r, 1)).reduce(|a, c| a + c).unwrap()
}

/// x / ‖x‖ over the last dimension.
fn unit(x: Tensor<4>) -> Tensor<4> {
    x.clone() / (x.powf_scalar(2.0).sum_dim(3).sqrt() + 1e-6)
}

impl AttentionMechanism for LshAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LshAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }
}
