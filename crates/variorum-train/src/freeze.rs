//! Freezing parameter groups for fine-tuning: their gradients are dropped before the optimizer
//! step, so AdamW leaves them (and their moments) untouched.

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

/// `train.freeze`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FreezeConfig {
    /// Token embedding, absolute position, embedding norm and projection parameters. Default
    /// false.
    pub embeddings: bool,
    /// The first n blocks (of the decoder, in an encoder–decoder: its encoder blocks train). Default 0.
    pub first_blocks: usize,
    /// Everything but the output head (`head`, or `token_embedding` when tied, its bias and
    /// transform). Default false.
    pub all_but_head: bool,
    /// Every position parameter: the absolute position table and each attention's relative
    /// scheme (T5's bucket tables, Shaw's, …). A model whose layers each hold a copy of one
    /// table (an imported DeBERTa's) keeps the copies equal with it, and so stays exportable.
    /// Default false.
    pub positions: bool,
}

impl FreezeConfig {
    /// Whether nothing is frozen.
    pub fn is_empty(&self) -> bool {
        !self.embeddings && self.first_blocks == 0 && !self.all_but_head && !self.positions
    }

    /// Checks the settings against a model of `n_layers` blocks, with tied embeddings when `tied`;
    /// messages name the key (`train.freeze.*`).
    pub fn validate(&self, n_layers: usize, tied: bool) -> Result<(), ConfigError> {
        check(self.first_blocks <= n_layers, || {
            format!("train.freeze.first_blocks = {} exceeds model.n_layers = {n_layers}", self.first_blocks)
        })?;
        check(!(self.all_but_head && self.embeddings && tied), || {
            "train.freeze: embeddings = true with all_but_head = true and tied embeddings freezes every parameter"
                .into()
        })
    }

    /// Whether the parameters of the module at `path` (module names from the root) are frozen.
    fn frozen(&self, path: &[String], tied: bool) -> bool {
        let top = path.first().map(String::as_str).unwrap_or("");
        if self.all_but_head {
            let head = if tied { "token_embedding" } else { "head" };
            if !matches!(top, "head_bias" | "head_transform") && top != head {
                return true;
            }
        }
        if self.embeddings && matches!(top, "token_embedding" | "position" | "embedding_norm" | "embedding_projection")
        {
            return true;
        }
        // the model's own `position` and every attention's (`blocks.i.attn.position`, …)
        if self.positions && path.iter().any(|m| m == "position") {
            return true;
        }
        top == "blocks" && path.get(1).and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i < self.first_blocks)
    }
}

struct DropFrozen<'a> {
    cfg: &'a FreezeConfig,
    tied: bool,
    path: Vec<String>,
    grads: &'a mut GradientsParams,
}

impl ModuleVisitor for DropFrozen<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.cfg.frozen(&self.path, self.tied) {
            let _ = self.grads.remove::<D>(param.id);
        }
    }
}

/// Removes the gradients of frozen parameters.
pub fn drop_frozen_grads(model: &variorum_model::DecoderLm, grads: &mut GradientsParams, cfg: &FreezeConfig) {
    if cfg.is_empty() {
        return;
    }
    let tied = model.head.is_none();
    model.visit(&mut DropFrozen { cfg, tied, path: Vec::new(), grads });
}

#[cfg(test)]
mod tests {
    use super::*;
    use variorum_model::ModelConfig;

    /// The path of every parameter that has a gradient.
    struct WithGrads<'a> {
        grads: &'a GradientsParams,
        path: Vec<String>,
        found: Vec<String>,
    }

    impl ModuleVisitor for WithGrads<'_> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.grads.get::<D>(param.id).is_some() {
                self.found.push(self.path.join("."));
            }
        }
    }

    /// `positions` drops the gradient of every position parameter — each layer's T5 table, in
    /// the encoder and the decoder — and of nothing else.
    #[test]
    fn frozen_positions_are_every_position_table_and_nothing_else() {
        let dev = Device::flex().autodiff();
        let position = toml::from_str("kind = \"t5\"").unwrap();
        let cfg = ModelConfig { position, ..variorum_model::zoo::tiny_encoder_decoder() };
        cfg.validate().unwrap();
        let model = cfg.init(&dev);
        let with_grads = |grads: &GradientsParams| {
            let mut v = WithGrads { grads, path: Vec::new(), found: Vec::new() };
            model.visit(&mut v);
            v.found
        };
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 2, 3, 4], [1, 4]), &dev);
        let source = variorum_model::Source::from_rows(&[vec![5, 6, 7]], &dev);
        let loss = model.forward_tagged(tokens, source, None).logits.sum();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        let all = with_grads(&grads);
        drop_frozen_grads(&model, &mut grads, &FreezeConfig { positions: true, ..Default::default() });
        let kept = with_grads(&grads);
        let dropped: Vec<&String> = all.iter().filter(|n| !kept.contains(n)).collect();
        let tables: Vec<&String> = all.iter().filter(|n| n.split('.').any(|m| m == "position")).collect();
        assert_eq!(dropped, tables, "exactly the position tables are frozen");
        assert!(dropped.iter().any(|n| n.starts_with("encoder")) && dropped.iter().any(|n| n.starts_with("blocks")));
    }
}
