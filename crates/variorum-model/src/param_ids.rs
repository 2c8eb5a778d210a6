//! Parameter ids fixed by where each parameter sits in the model, not drawn at random.
//!
//! Burn gives every parameter a random 64-bit id from the operating system's entropy
//! (`burn_std::id::IdGenerator`), writes it into every weights and optimizer file, and keys the
//! optimizer's state by it. Two trainings of one config and seed then wrote the same numbers
//! under different ids, so their checkpoints differed byte for byte. Here each parameter's id is
//! a hash (FNV-1a, written out: eight lines, stable across Rust versions, unlike `std`'s
//! `DefaultHasher`) of its path in the module tree; a parameter reached at two paths (a shared
//! one) keeps one id, the first path's.

use std::collections::HashMap;

use burn::module::{ModuleMapper, Param, ParamId};
use burn::prelude::*;

/// `module` with every parameter's id the hash of its path, as [`ModelConfig::init`] gives
/// them: for parameters added to a model afterwards (LoRA adapters), whose ids Burn draws at
/// random. Ids of parameters already there are recomputed from the same paths, so unchanged.
///
/// [`ModelConfig::init`]: crate::ModelConfig::init
pub fn path_ids<M: Module>(module: M) -> M {
    module.map(&mut PathIds::default())
}

/// Gives every parameter of a module the id of its path ([`ModuleMapper`]).
#[derive(Default)]
pub(crate) struct PathIds {
    path: Vec<String>,
    given: HashMap<ParamId, ParamId>,
}

impl PathIds {
    fn id(&mut self, old: ParamId) -> ParamId {
        let path = self.path.join(".");
        *self.given.entry(old).or_insert_with(|| ParamId::from(fnv1a(path.as_bytes())))
    }
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl ModuleMapper for PathIds {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, mut param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.id = self.id(param.id);
        param
    }

    fn map_int<const D: usize>(&mut self, mut param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        param.id = self.id(param.id);
        param
    }

    fn map_bool<const D: usize>(&mut self, mut param: Param<Tensor<D, Bool>>) -> Param<Tensor<D, Bool>> {
        param.id = self.id(param.id);
        param
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo;

    fn ids(cfg: &crate::ModelConfig) -> Vec<ParamId> {
        struct Ids(Vec<ParamId>);
        impl burn::module::ModuleVisitor for Ids {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.0.push(param.id);
            }
        }
        let mut v = Ids(Vec::new());
        cfg.init(&Device::flex()).visit(&mut v);
        v.0
    }

    #[test]
    fn two_models_of_one_config_have_the_same_distinct_ids() {
        let cfg = zoo::tiny();
        let (a, b) = (ids(&cfg), ids(&cfg));
        assert_eq!(a, b);
        let mut distinct = a.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), a.len(), "two parameters share an id");
    }

    #[test]
    fn the_ids_come_from_the_paths() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a(b"blocks.0.attn"), fnv1a(b"blocks.1.attn"));
    }
}
