//! Kernelised ("linear") attention on one core (docs/attention.md): feature maps for exp(q·k),
//! random features, and the cumulative average.

pub(crate) mod average;
pub(crate) mod kernel;
pub(crate) mod linear;
pub(crate) mod performer;
pub(crate) mod random_features;
pub(crate) mod rfa;
