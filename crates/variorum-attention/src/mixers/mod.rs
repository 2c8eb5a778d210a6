//! Token mixers in the attention slot (docs/mixers.md): MLPs, Fourier transforms,
//! convolutions, Hopfield lookups.

pub(crate) mod dynamic_conv;
pub(crate) mod fnet;
pub(crate) mod gmlp;
pub(crate) mod hopfield;
pub(crate) mod mlp_mixer;
