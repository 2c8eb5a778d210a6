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
}

impl FreezeConfig {
    /// Whether nothing is frozen.
    pub fn is_empty(&self) -> bool {
        !self.embeddings && self.first_blocks == 0 && !self.all_but_head
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
