//! Full attention and what changes its scores or heads (docs/scores-and-heads.md): priors,
//! synthesized scores, residual and reused maps, head interaction.

pub(crate) mod capsule_heads;
pub(crate) mod collaborative;
pub(crate) mod evolving;
pub(crate) mod full;
pub(crate) mod gaussian_prior;
pub(crate) mod hard_coded_gaussian;
pub(crate) mod lazyformer;
pub(crate) mod realformer;
pub(crate) mod synthesizer;
pub(crate) mod talking_heads;
pub(crate) mod task_prior;
