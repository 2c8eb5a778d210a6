//! What a mechanism supports. Validation, `variorum zoo` and the generic tests all read the same
//! declaration, so adding a kind to an axis enrols it everywhere.

use serde::Serialize;

/// Declared capabilities of one kind on one axis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Can run with a causal mask (decoder use).
    pub causal: bool,
    /// Can run without a causal mask (encoder use).
    pub bidirectional: bool,
    /// Keeps a KV cache or recurrent state for incremental decoding.
    pub incremental: bool,
    /// Forms an explicit score matrix that an additive position bias can act on.
    pub score_bias: bool,
    /// Accepts rotations of q and k before the scores (RoPE).
    pub qk_rotation: bool,
    /// Adds auxiliary losses.
    pub aux_losses: bool,
    /// Works for any sequence length up to the model's context (no fixed-length parameters).
    pub variable_length: bool,
}

impl Capabilities {
    /// A piece that constrains nothing: any mask, any length, incremental decoding (norms,
    /// feed-forward layers, residual wiring, most position schemes).
    pub const NEUTRAL: Capabilities = Capabilities {
        causal: true,
        bidirectional: true,
        incremental: true,
        score_bias: false,
        qk_rotation: false,
        aux_losses: false,
        variable_length: true,
    };
}

/// One row of `variorum zoo`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct KindInfo {
    /// Config axis, e.g. `model.attention`.
    pub axis: &'static str,
    /// The `kind = "…"` value.
    pub kind: &'static str,
    /// One-line description.
    pub summary: &'static str,
    /// Source paper (authors, year, title).
    pub paper: &'static str,
    pub caps: Capabilities,
}
