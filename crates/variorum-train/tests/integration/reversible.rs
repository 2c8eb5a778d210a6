//! Reversible stacks: inputs rebuilt from outputs through many layers, and the gradients of the
//! activation-free backward equal those of ordinary back-propagation through stored activations.

use crate::common;

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use common::seeded;
use variorum_attention::{AdaptiveSpanConfig, AttentionConfig, MultiHeadAttentionConfig, SinkhornConfig};
use variorum_block::{BlockConfig, RevContext, Streams};
use variorum_core::AttentionMask;
use variorum_model::reversible_grads::reversible_grads;
use variorum_model::{ModelConfig, zoo};
use variorum_position::PositionConfig;

fn reversible(n_layers: usize, dropout: f64) -> ModelConfig {
    ModelConfig { block: BlockConfig::Reversible(Default::default()), n_layers, dropout, ..zoo::tiny() }
}

fn tokens(seed: u64, batch: usize, len: usize, vocab: usize, dev: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..batch * len).map(|i| ((i as u64 * 7 + seed * 5) % vocab as u64) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, len]), dev)
}

fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

#[test]
fn twelve_layers_rebuild_their_inputs_from_their_outputs() {
    let _g = seeded();
    let dev = Device::flex();
    dev.seed(3);
    let model = ModelConfig { init_std: 0.2, ..reversible(12, 0.0) }.init(&dev);
    let x: Tensor<3> = Tensor::random([2, 16, 32], Distribution::Normal(0.0, 1.0), &dev);
    let mask = AttentionMask::causal();
    // dropout while rebuilding too: the masks are replayed
    let dropout = Some(variorum_block::ReplayDropout { prob: 0.2, seed: 11 });
    let cx = |layer| RevContext { mask: &mask, dense_mask: None, dropout, layer };
    let mut s = Streams::split(x.clone());
    for (i, block) in model.blocks.iter().enumerate() {
        s = block.reversible_forward(s, &cx(i), None).0;
    }
    assert!(max_diff(s.x1.clone(), x.clone()) > 0.5, "the stack barely changed its input");
    for (i, block) in model.blocks.iter().enumerate().rev() {
        s = block.reversible_inverse(s, &cx(i));
    }
    let (e1, e2) = (max_diff(s.x1, x.clone()), max_diff(s.x2, x));
    assert!(e1 < 1e-4 && e2 < 1e-4, "rebuilt inputs differ by {e1}, {e2}");
}

/// Every parameter's gradient in both, as (path, largest difference, largest magnitude).
struct Compare<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    path: Vec<String>,
    rows: Vec<(String, f32, f32)>,
}

impl ModuleVisitor for Compare<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (a, b) = (self.a.get::<D>(param.id), self.b.get::<D>(param.id));
        let path = self.path.join(".");
        match (a, b) {
            (Some(a), Some(b)) => {
                let scale = a.clone().abs().max().into_scalar::<f32>();
                let diff = (a - b).abs().max().into_scalar::<f32>();
                self.rows.push((path, diff, scale));
            }
            (None, None) => {}
            (a, b) => panic!("{path}: gradient present in one only ({} / {})", a.is_some(), b.is_some()),
        }
    }
}

fn check_gradients(cfg: ModelConfig, what: &str) {
    check_tagged_gradients(cfg, None, what)
}

/// [`check_gradients`] of rows tagged `tags` (a model conditioned on them).
fn check_tagged_gradients(cfg: ModelConfig, tags: Option<[i64; 3]>, what: &str) {
    let _g = seeded();
    let dev = Device::flex().autodiff();
    dev.seed(5);
    let model = cfg.init(&dev);
    let (x, y) = (tokens(1, 3, 16, 11, &dev), tokens(2, 3, 16, 11, &dev));
    let tags = tags.map(|t| Tensor::<1, Int>::from_data(TensorData::new(t.to_vec(), [3]), &dev));
    // parameters are initialised lazily, drawing from the generator: do it before seeding
    let _ = model.valid().forward(x.clone().without_autodiff());

    dev.seed(9);
    let (loss, aux) = model.loss_with(x.clone(), y.clone(), tags.clone(), None);
    let total = aux.iter().fold(loss.clone(), |t, (_, l)| t + l.clone());
    let stored = GradientsParams::from_grads(total.backward(), &model);

    dev.seed(9);
    let (rev_loss, rev_aux, rebuilt) = reversible_grads(&model, x, y, tags, 1.0);
    let dl = (loss - rev_loss).abs().into_scalar::<f32>();
    assert!(dl < 1e-5, "{what}: losses differ by {dl}");
    let sum = |a: &variorum_core::AuxLosses| a.iter().map(|(_, l)| l.clone().into_scalar::<f32>()).sum::<f32>();
    let da = (sum(&aux) - sum(&rev_aux)).abs();
    assert!(da < 1e-5, "{what}: auxiliary losses {} vs {}", sum(&aux), sum(&rev_aux));

    let mut cmp = Compare { a: &stored, b: &rebuilt, path: Vec::new(), rows: Vec::new() };
    model.visit(&mut cmp);
    assert!(cmp.rows.len() > 10, "{what}: only {} gradients compared", cmp.rows.len());
    for (path, diff, scale) in &cmp.rows {
        assert!(*scale > 0.0, "{what}: {path} has no gradient");
        assert!(*diff < 1e-4, "{what}: {path} differs by {diff} (largest entry {scale})");
    }
}

#[test]
fn gradients_equal_those_through_stored_activations() {
    check_gradients(reversible(4, 0.0), "plain");
}

#[test]
fn gradients_with_dropout_replay_the_same_masks() {
    check_gradients(reversible(3, 0.2), "dropout 0.2");
}

#[test]
fn gradients_include_the_auxiliary_losses_and_relative_positions() {
    let span = AdaptiveSpanConfig { n_heads: 4, max_span: 8, ramp: 2, ..Default::default() };
    let cfg = ModelConfig {
        attention: AttentionConfig::AdaptiveSpan(span),
        position: PositionConfig::Alibi(Default::default()),
        tie_embeddings: false,
        ..reversible(3, 0.0)
    };
    check_gradients(cfg, "adaptive span + alibi, untied");
}

/// Reformer's end of the stack (`merge = "concat"`): the final norm and the head read
/// [Y₁ ; Y₂], 2 × d_model features — the logits equal those computed by hand from the two
/// streams — and the activation-free backward still equals back-propagation.
#[test]
fn concatenated_streams_feed_a_head_twice_as_wide() {
    let block = BlockConfig::Reversible(variorum_block::ReversibleConfig {
        merge: variorum_block::StreamMerge::Concat,
        ..Default::default()
    });
    let cfg = ModelConfig { block, tie_embeddings: false, ..reversible(3, 0.0) };
    check_gradients(cfg.clone(), "streams concatenated");

    let dev = Device::flex();
    dev.seed(3);
    let model = cfg.init(&dev);
    let x = tokens(4, 2, 12, 11, &dev);
    let d = cfg.d_model;
    let norm = model.final_norm.as_ref().expect("the final norm");
    let head = model.head.as_ref().expect("a head of its own");
    assert_eq!(head.weight.val().dims()[0], 2 * d, "the head reads both streams");
    let mut streams = Streams::split(model.embed(x.clone(), 0));
    let mask = AttentionMask::causal();
    for (i, block) in model.blocks.iter().enumerate() {
        let cx = RevContext { mask: &mask, dense_mask: None, dropout: None, layer: i };
        streams = block.reversible_forward(streams, &cx, None).0;
    }
    let joined = Tensor::cat(vec![streams.x1, streams.x2], 2);
    let want = head.forward(norm.forward(joined));
    let got = model.forward(x).logits;
    let diff = max_diff(got, want);
    assert!(diff < 1e-5, "logits differ from head(norm([Y1; Y2])) by {diff}");
    // a tied head cannot read 2·d features
    let tied = ModelConfig { tie_embeddings: true, ..cfg };
    assert!(tied.validate().unwrap_err().to_string().contains("merge = \"concat\""));
}

#[test]
fn gradients_of_a_model_conditioned_on_example_tags() {
    let attention: AttentionConfig = toml::from_str("kind = \"task-prior\"\ntasks = 4").unwrap();
    let cfg = ModelConfig { attention, init_std: 0.2, ..reversible(3, 0.0) };
    // the tags reach both passes: a loss under other tags differs
    let dev = Device::flex();
    dev.seed(5);
    let model = cfg.init(&dev);
    let (x, y) = (tokens(1, 3, 16, 11, &dev), tokens(2, 3, 16, 11, &dev));
    let tagged = |t: [i64; 3]| Some(Tensor::<1, Int>::from_data(TensorData::new(t.to_vec(), [3]), &dev));
    let a = model.loss_with(x.clone(), y.clone(), tagged([1, 2, 3]), None).0.into_scalar::<f32>();
    let b = model.loss_with(x, y, tagged([3, 3, 0]), None).0.into_scalar::<f32>();
    assert!((a - b).abs() > 1e-6, "the tags changed nothing: {a} vs {b}");
    check_tagged_gradients(cfg, Some([1, 2, 3]), "task prior, tagged rows");
}

#[test]
fn attention_dropout_and_memories_are_refused_with_reversible_blocks() {
    let attention = AttentionConfig::Full(MultiHeadAttentionConfig { dropout: 0.1, ..Default::default() });
    let err = ModelConfig { attention, ..reversible(2, 0.0) }.validate().unwrap_err().to_string();
    assert!(err.contains("model.attention.dropout") && err.contains("reversible"), "{err}");
    let sinkhorn = AttentionConfig::Sinkhorn(SinkhornConfig::default());
    let err = ModelConfig { attention: sinkhorn, ..reversible(2, 0.0) }.validate().unwrap_err().to_string();
    assert!(err.contains("gumbel"), "{err}");
    let quiet = AttentionConfig::Sinkhorn(SinkhornConfig { gumbel: false, ..Default::default() });
    assert!(ModelConfig { attention: quiet, ..reversible(2, 0.0) }.validate().is_ok());
    let per_layer = PositionConfig::UniversalTimestep(Default::default());
    let err = ModelConfig { position: per_layer, ..reversible(2, 0.0) }.validate().unwrap_err().to_string();
    assert!(err.contains("model.block.kind = \"reversible\""), "{err}");
}

#[test]
fn gradients_through_content_based_attention() {
    use variorum_attention::LshConfig;
    let lsh = AttentionConfig::Lsh(LshConfig { buckets: 4, rounds: 2, chunk: 4, ..Default::default() });
    check_gradients(
        ModelConfig { attention: lsh, position: PositionConfig::None(Default::default()), ..reversible(3, 0.0) },
        "lsh",
    );
    let sinkhorn = AttentionConfig::Sinkhorn(SinkhornConfig { block: 4, gumbel: false, ..Default::default() });
    check_gradients(ModelConfig { attention: sinkhorn, ..reversible(3, 0.1) }, "sinkhorn, dropout 0.1");
}
