//! Config errors: one line naming the key path, what is wrong, and what would work.

use std::fmt;

/// A user mistake in a config, reported before anything is built.
///
/// The message is complete on its own, e.g.
/// `model.attention.n_heads = 5 does not divide model.d_model = 128 (try 1, 2, 4, 8, 16, …)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl ConfigError {
    /// The error with message `msg`.
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// `ensure!`-style helper for validation code: `check(cond, || format!(...))?`.
pub fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), ConfigError> {
    if cond { Ok(()) } else { Err(ConfigError(msg())) }
}

/// Divisors of `n`, to suggest values that would work.
pub fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}
