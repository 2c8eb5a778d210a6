//! The incremental-decoding state of one attention layer, open to every kind: each mechanism
//! keeps its own type in it (a KV cache, recurrent sums, a kind's several caches), created on
//! first use. A kind defined outside this crate keeps its state here the same way.

use core::any::Any;
use core::fmt::Debug;

/// A kind's state: anything cloneable (beam search copies states) that can cross threads.
trait LayerState: Any + Debug + Send + Sync {
    fn clone_boxed(&self) -> Box<dyn LayerState>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Debug + Clone + Send + Sync> LayerState for T {
    fn clone_boxed(&self) -> Box<dyn LayerState> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Incremental-decoding state of one attention layer. Empty until the mechanism first stores
/// its own state type in it; mechanisms without state never do.
#[derive(Debug, Default)]
pub struct AttentionState(Option<Box<dyn LayerState>>);

impl Clone for AttentionState {
    fn clone(&self) -> Self {
        Self(self.0.as_ref().map(|s| (**s).clone_boxed()))
    }
}

impl AttentionState {
    /// The layer's state of type `S`, created on first use. One layer keeps one kind of state:
    /// a state of another type (a layer rebuilt as another kind) is replaced.
    pub fn get_or_default<S: Any + Debug + Clone + Default + Send + Sync>(&mut self) -> &mut S {
        if !self.0.as_ref().is_some_and(|s| (**s).as_any().is::<S>()) {
            self.0 = Some(Box::new(S::default()));
        }
        self.0.as_mut().and_then(|s| (**s).as_any_mut().downcast_mut()).expect("stored just above")
    }

    /// The state, if the layer holds one of type `S`.
    pub fn get<S: Any>(&self) -> Option<&S> {
        self.0.as_ref().and_then(|s| (**s).as_any().downcast_ref())
    }

    /// Whether the mechanism has stored nothing yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The KV cache, created on first use (the state of every kind that caches keys and values).
    pub fn kv_mut(&mut self) -> &mut crate::KvCache {
        self.get_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Default, PartialEq)]
    struct Sums(Vec<u32>);

    #[test]
    fn a_state_is_created_once_kept_cloned_and_replaced_by_another_type() {
        let mut s = AttentionState::default();
        assert!(s.is_empty() && s.get::<Sums>().is_none());
        s.get_or_default::<Sums>().0.push(3);
        s.get_or_default::<Sums>().0.push(4);
        let copy = s.clone();
        s.get_or_default::<Sums>().0.push(5);
        assert_eq!(copy.get::<Sums>(), Some(&Sums(vec![3, 4])), "a clone is a deep copy");
        assert_eq!(s.get::<Sums>(), Some(&Sums(vec![3, 4, 5])));
        assert_eq!(*s.get_or_default::<u64>(), 0, "another type starts afresh");
        assert!(s.get::<Sums>().is_none());
    }
}
