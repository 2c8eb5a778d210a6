//! Which pieces combine: a table of rules over the capabilities the kinds declare. No rule names
//! a kind: a new kind that declares its capabilities is checked by every rule at once.

use variorum_core::{Capabilities, ConfigError};

use crate::ModelConfig;
use crate::exits::ExitConfig;

/// What the rules read of a model config: each axis's capabilities and the model-level choices.
pub struct Setting<'a> {
    /// The whole model config, for the model-level choices.
    pub model: &'a ModelConfig,
    /// What the attention kind declares.
    pub attention: Capabilities,
    /// What the position scheme declares.
    pub position: Capabilities,
    /// What the feed-forward kind declares.
    pub feed_forward: Capabilities,
}

impl<'a> Setting<'a> {
    /// The setting of `model`: its config and the capabilities of its kinds.
    pub fn of(model: &'a ModelConfig) -> Self {
        Self {
            model,
            attention: model.attention.capabilities(),
            position: model.position.capabilities(),
            feed_forward: model.feed_forward.kind.capabilities(),
        }
    }

    fn attention_kind(&self) -> &'static str {
        self.model.attention.kind()
    }

    fn position_kind(&self) -> &'static str {
        self.model.position.kind()
    }

    fn memory(&self) -> bool {
        !self.model.memory.is_none()
    }

    fn exits(&self) -> bool {
        !matches!(self.model.exits, ExitConfig::None)
    }

    /// n_layers distinct blocks (not one shared block).
    fn stack(&self) -> bool {
        !self.model.depth.shared()
    }
}

/// One compatibility rule: `holds` must be true, else the config is refused with `why`.
pub struct Rule {
    /// Whether the setting satisfies the rule.
    pub holds: fn(&Setting) -> bool,
    /// The refusal when it does not: what clashes, named by config key, and what would work.
    pub why: fn(&Setting) -> String,
}

/// Every rule, checked in order; the first that fails is reported.
pub const RULES: &[Rule] = &[
    Rule {
        holds: |s| !s.position.score_bias || s.attention.score_bias,
        why: |s| {
            format!(
                "model.position.kind = \"{}\" acts on the attention scores, but model.attention.kind = \"{}\" never forms them: use a score-forming attention or a position kind that needs no scores (sinusoidal, learned, rope, none)",
                s.position_kind(),
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.position.qk_rotation || s.attention.qk_rotation,
        why: |s| {
            format!(
                "model.position.kind = \"{}\" rotates queries and keys, but model.attention.kind = \"{}\" has none to rotate: use an absolute position kind",
                s.position_kind(),
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.model.objective.is_causal() || s.attention.causal,
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" has no causal form ({}), and next-token prediction needs causal attention: train it with model.objective.kind = \"masked\"",
                s.attention_kind(),
                s.model.attention.why_not_causal()
            )
        },
    },
    Rule {
        holds: |s| s.model.objective.is_causal() || s.attention.bidirectional,
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" has no bidirectional form, and model.objective.kind = \"masked\" needs one: use model.objective.kind = \"causal\"",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.exits() || (s.stack() && !s.memory()),
        why: |s| {
            format!(
                "model.exits.kind = \"{}\" needs a stack of distinct blocks without memory (model.depth.kind = \"stack\", model.memory.kind = \"none\")",
                s.model.exits.kind()
            )
        },
    },
    Rule {
        holds: |s| !s.memory() || s.attention.reads_memory,
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" cannot read a memory (model.memory.kind = \"{}\"): it forms its keys from the segment itself (compressed, sorted, pooled, partitioned or chosen among the segment's positions)",
                s.attention_kind(),
                s.model.memory.kind()
            )
        },
    },
    Rule {
        holds: |s| {
            let per_layer = s.model.attention.per_layer();
            per_layer == 0 || (per_layer == s.model.n_layers && s.stack())
        },
        why: |s| {
            format!(
                "model.attention: {} has {} entries for model.n_layers = {} distinct blocks: give one per layer (a shared Universal Transformer block has one)",
                s.model.attention.per_layer_key(),
                s.model.attention.per_layer(),
                s.model.n_layers
            )
        },
    },
    Rule {
        holds: |s| s.model.max_back.is_none() || s.attention.score_bias,
        why: |s| {
            format!(
                "model.max_back limits which keys a query scores, but model.attention.kind = \"{}\" does not apply it (it forms no score matrix a reach limit can act on): use a score-forming kind or drop max_back",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| {
            !s.attention.global_input
                || (!s.memory()
                    && s.stack()
                    && !s.exits()
                    && s.model.max_back.is_none()
                    && s.feed_forward.position_wise
                    && !s.position.per_layer
                    && !s.model.block.reversible())
        },
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" adds a global input beside the sequence, which only a plain stack carries: use it without model.memory, a universal depth, exits, max_back, a reversible block, a separable-conv feed_forward or per-layer position signals",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.model.block.reversible() || (!s.memory() && s.stack() && !s.exits() && !s.position.per_layer),
        why: |_| {
            "model.block.kind = \"reversible\" rebuilds each block's inputs from its outputs, which needs a plain stack of distinct blocks: use it without model.memory, a universal depth, exits or per-layer position signals".into()
        },
    },
    Rule {
        holds: |s| !s.model.block.reversible() || !s.model.position.tied_across_layers(),
        why: |s| {
            format!(
                "model.position.kind = \"{}\" with shared = true gives every layer the first layer's parameters, whose gradient sums every layer's; a reversible block (model.block.kind = \"reversible\") computes gradients one block at a time: use one or the other",
                s.position_kind()
            )
        },
    },
    Rule {
        holds: |s| {
            let m = &s.model;
            m.block.output_width(m.d_model) == m.d_model
                || (!m.tie_embeddings && !m.head_transform && !m.is_encoder_decoder())
        },
        why: |_| {
            "model.block.merge = \"concat\" hands the head both streams, 2 × model.d_model features: the head needs weights of its own (tie_embeddings = false), no head_transform, and a decoder-only model".into()
        },
    },
    Rule {
        holds: |s| !s.model.block.reversible() || s.attention.replayable,
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" draws noise in this setting (e.g. gumbel = true) that a reversible block's recomputation (model.block.kind = \"reversible\") cannot replay: turn the noise off",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.model.block.reversible() || s.model.attention.dropout() == 0.0,
        why: |s| {
            format!(
                "model.attention.dropout = {} cannot be used with model.block.kind = \"reversible\": the backward recomputes each block and cannot replay attention-weight dropout; model.dropout drops the branch outputs instead",
                s.model.attention.dropout()
            )
        },
    },
    Rule {
        holds: |s| !s.attention.distinct_layers || s.stack(),
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" gives its layers different roles by index, which one shared block (model.depth universal) cannot play: use a stack of distinct layers",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.attention.cross_layer || (!s.model.block.reversible() && !s.memory()),
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" reads the previous layer's attention maps, which a reversible block's backward (it inverts one block at a time) and a memory's reconstruction pass do not carry: use it without model.block.kind = \"reversible\" and model.memory",
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.attention.gathers_keys || !s.position.score_bias || s.position.distance_only,
        why: |s| {
            format!(
                "model.position.kind = \"{}\" needs contiguous keys, but model.attention.kind = \"{}\" gathers keys from anywhere in the sequence: use none, an absolute kind, rope, alibi or t5",
                s.position_kind(),
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| !s.position.absolute_scores || s.attention.absolute_scores,
        why: |s| {
            format!(
                "model.position.kind = \"{}\" scores absolute positions, which the blocks of model.attention.kind = \"{}\" do not carry; use a relative scheme (alibi, rope, t5, …) or learned",
                s.position_kind(),
                s.attention_kind()
            )
        },
    },
    Rule {
        holds: |s| s.feed_forward.position_wise || (!s.exits() && !s.memory()),
        why: |s| {
            format!(
                "model.feed_forward.kind = \"{}\" cannot be combined with model.exits.kind = \"{}\" or model.memory.kind = \"{}\": its window of recent inputs is neither propagated to skipped blocks nor carried across segments; use a position-wise feed_forward",
                s.model.feed_forward.kind.name(),
                s.model.exits.kind(),
                s.model.memory.kind()
            )
        },
    },
    Rule {
        holds: |s| {
            !s.attention.remembers
                || (!s.memory()
                    && s.stack()
                    && !s.exits()
                    && !s.model.block.reversible()
                    && !s.position.absolute
                    && !s.position.per_layer
                    && s.feed_forward.position_wise
                    && !s.model.is_encoder_decoder())
        },
        why: |s| {
            format!(
                "model.attention.kind = \"{}\" keeps a memory of earlier segments in its own state, which only a decoder's plain stack of distinct blocks carries, with a relative position scheme (memories reach past the segment): use it without model.memory, a universal depth, exits, a reversible block, per-layer position signals, a separable-conv feed_forward or an encoder, and with alibi, t5 or none for model.position (not \"{}\")",
                s.attention_kind(),
                s.position_kind()
            )
        },
    },
    Rule {
        holds: |s| match s.model.objective.cpc() {
            None => true,
            Some(c) => {
                s.attention.global_input
                    && s.model.attention.global_segment().is_some_and(|seg| s.model.seq_len / seg.max(1) > c.segments)
            }
        },
        why: |s| {
            let c = s.model.objective.cpc().map_or(0, |c| c.segments);
            match s.model.attention.global_segment() {
                None => format!(
                    "model.objective.cpc predicts each hidden segment at its global token, but model.attention.kind = \"{}\" has none: use kind = \"etc\"",
                    s.attention_kind()
                ),
                Some(seg) => format!(
                    "model.objective.cpc.segments = {c} hides that many of a window's {} complete segments of {seg} (model.seq_len = {}), and at least one must stay visible: hide fewer or lengthen the context",
                    s.model.seq_len / seg.max(1),
                    s.model.seq_len
                ),
            }
        },
    },
    Rule {
        holds: |s| {
            s.model.long_term_memory.is_none()
                || (s.model.objective.is_causal()
                    && !s.model.is_encoder_decoder()
                    && !s.exits()
                    && !s.model.block.reversible()
                    && !s.attention.global_input)
        },
        why: |_| {
            "model.long_term_memory mixes retrieved tokens into the final state before the head, which needs a causal decoder whose head reads the last block's output once: use it without exits, a reversible block, a global input, an encoder or a masked objective".into()
        },
    },
    Rule {
        holds: |s| !s.model.block.parallel() || !s.model.is_encoder_decoder(),
        why: |_| {
            "model.block.parallel = true runs attention and feed-forward side by side, but an encoder–decoder's decoder block puts cross-attention between them: use parallel = false".into()
        },
    },
    Rule {
        holds: |s| !s.memory() || !s.position.absolute,
        why: |s| {
            format!(
                "model.memory.kind = \"{}\" needs a relative position scheme (memories reach past the segment, where absolute positions are incoherent), but model.position.kind = \"{}\": use transformer-xl, rope, alibi, t5, shaw or none",
                s.model.memory.kind(),
                s.position_kind()
            )
        },
    },
];

/// Checks every rule of [`RULES`] against `model`.
pub fn check_rules(model: &ModelConfig) -> Result<(), ConfigError> {
    let setting = Setting::of(model);
    match RULES.iter().find(|r| !(r.holds)(&setting)) {
        Some(rule) => Err(ConfigError::new((rule.why)(&setting))),
        None => Ok(()),
    }
}
