//! One set of relative position parameters per stack, read by every layer (T5's one bias table
//! per stack: `model.position.shared`).
//!
//! Each layer keeps the scheme in its attention, as every other scheme is kept, so no attention
//! kind needs to know about sharing; tying makes the copies of the layers after the first the
//! first layer's tensor itself. A forward then uses one tensor at every layer, and
//! back-propagation sums every layer's gradient into it: the gradient of a parameter shared by
//! the stack. Each copy keeps its own parameter id, so the gradient is found once, under the
//! first layer's id, and the optimizer steps that copy alone; tying again afterwards hands the
//! stepped tensor to the rest. The trainer ties before and after every step (a model loaded
//! from a checkpoint holds equal copies that are separate tensors until then); a model only run
//! forward needs nothing, since its copies are equal.
//!
//! A layer's position parameters are those under a module called `position` in
//! `blocks.<i>` (the decoder) or `encoder.blocks.<i>` (the encoder); each is tied to the one of
//! the same name after `position` (`T5.table`) in block 0 of its stack.

use std::any::Any;
use std::collections::HashMap;

use burn::module::{ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;

use crate::DecoderLm;

/// Where a parameter sits: its stack (`blocks`, `encoder.blocks`), its layer, and its name
/// under `position` (`table`); `None` for a parameter outside a layer's position scheme.
fn place(path: &[String]) -> Option<(String, usize, String)> {
    let b = path.iter().position(|m| m == "blocks")?;
    let layer = path.get(b + 1)?.parse().ok()?;
    let p = path.iter().rposition(|m| m == "position").filter(|&p| p > b + 1)?;
    Some((path[..=b].join("."), layer, path[p + 1..].join(".")))
}

/// Collects block 0's position tensors of every stack.
#[derive(Default)]
struct FirstLayer {
    path: Vec<String>,
    found: HashMap<(String, String), Box<dyn Any>>,
}

impl ModuleVisitor for FirstLayer {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // the path ends in the parameter's own name (`…position.T5.table`)
        if let Some((stack, 0, name)) = place(&self.path) {
            self.found.insert((stack, name), Box::new(param.val()));
        }
    }
}

/// Gives every later layer's position parameter block 0's tensor, keeping the parameter's id.
struct Tie {
    path: Vec<String>,
    first: HashMap<(String, String), Box<dyn Any>>,
}

impl ModuleMapper for Tie {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some((stack, _, name)) = place(&self.path).filter(|(_, layer, _)| *layer > 0) else { return param };
        let Some(first) = self.first.get(&(stack, name)).and_then(|t| t.downcast_ref::<Tensor<D>>()) else {
            return param;
        };
        if first.shape() != param.shape() {
            return param;
        }
        let first = first.clone();
        param.map(|_| first)
    }
}

impl DecoderLm {
    /// The model with every layer's relative position parameters tied to the first layer's
    /// of its stack, when `model.position` shares them (T5's `shared = true`); else
    /// the model as it is.
    pub fn tie_positions(self) -> Self {
        if !self.tied_positions {
            return self;
        }
        let mut first = FirstLayer::default();
        self.visit(&mut first);
        self.map(&mut Tie { path: Vec::new(), first: first.found })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(String::from).collect()
    }

    #[test]
    fn a_position_parameter_is_placed_by_stack_layer_and_name() {
        let at = |p: &str| place(&path(p));
        assert_eq!(at("blocks.3.attn.position.T5.table"), Some(("blocks".into(), 3, "T5.table".into())));
        assert_eq!(
            at("encoder.blocks.0.attn.Full.mha.position.T5.table"),
            Some(("encoder.blocks".into(), 0, "T5.table".into()))
        );
        assert_eq!(at("blocks.1.attn.qkv.qkv.weight"), None);
        // the model's own absolute table is no layer's
        assert_eq!(at("position.table"), None);
    }
}
