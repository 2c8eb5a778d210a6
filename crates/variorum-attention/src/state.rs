//! The incremental-decoding state of one attention layer, open to every kind: each mechanism
//! keeps its own type in it (a KV cache, recurrent sums, a kind's several caches), created on
//! first use. A kind defined outside this crate keeps its state here the same way.
//!
//! [`CarriedMaps`] is the same open box with another lifetime: what one block application hands
//! the next within one forward (RealFormer's raw scores, Lazyformer's probabilities).

use core::any::Any;
use core::fmt::Debug;

/// A kind's state: anything cloneable (beam search copies states) that can cross threads.
trait LayerState: Any + Debug + Send + Sync {
    fn clone_boxed(&self) -> Box<dyn LayerState>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
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

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
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

    /// Stores `s`, replacing whatever the layer held.
    pub fn put<S: Any + Debug + Clone + Send + Sync>(&mut self, s: S) {
        self.0 = Some(Box::new(s));
    }

    /// Takes the state out if it is of type `S` (leaving the layer empty); `None` otherwise, and
    /// then a state of another type stays where it is.
    pub fn take<S: Any>(&mut self) -> Option<S> {
        if !self.0.as_ref().is_some_and(|s| (**s).as_any().is::<S>()) {
            return None;
        }
        let boxed = self.0.take().expect("checked above").into_any();
        Some(*boxed.downcast::<S>().expect("checked above"))
    }

    /// The KV cache, created on first use (the state of every kind that caches keys and values).
    pub fn kv_mut(&mut self) -> &mut crate::cache::KvCache {
        self.get_or_default()
    }
}

/// What one block application hands the next within one forward: attention maps for kinds
/// that read the previous layer's (RealFormer adds its raw scores, Lazyformer reuses its
/// probabilities, evolving attention convolves them). The model creates one empty slot per
/// forward and passes it through every block application in order (a shared block's every
/// application included); a kind takes what the previous application left, of its own type,
/// and puts what the next should read. Kinds that ignore it leave it as it is. Open like
/// [`AttentionState`]: a kind outside this crate carries its own type.
///
/// Only kinds that declare `Capabilities::cross_layer` read it, and the rules keep them out of
/// stacks that do not run their blocks in order once per forward (a reversible stack's backward
/// inverts block by block).
#[derive(Debug, Clone, Default)]
pub struct CarriedMaps(AttentionState);

impl CarriedMaps {
    /// What the previous block application left, if it is of type `S`.
    pub fn take<S: Any>(&mut self) -> Option<S> {
        self.0.take()
    }

    /// Leaves `s` for the next block application.
    pub fn put<S: Any + Debug + Clone + Send + Sync>(&mut self, s: S) {
        self.0.put(s)
    }

    /// What the slot holds, if of type `S`, without taking it.
    pub fn get<S: Any>(&self) -> Option<&S> {
        self.0.get()
    }

    /// Whether the slot holds nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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

    #[test]
    fn a_carried_map_is_taken_once_and_only_as_its_own_type() {
        let mut c = CarriedMaps::default();
        assert!(c.take::<Sums>().is_none() && c.is_empty());
        c.put(Sums(vec![1]));
        assert!(c.take::<u64>().is_none(), "another type takes nothing");
        assert_eq!(c.get::<Sums>(), Some(&Sums(vec![1])));
        assert_eq!(c.take::<Sums>(), Some(Sums(vec![1])));
        assert!(c.is_empty(), "taking empties the slot");
    }
}
