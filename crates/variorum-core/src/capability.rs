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
    /// Attention: can read a memory of earlier segments (keys before the segment's own).
    pub reads_memory: bool,
    /// Attention: keeps a memory of earlier segments in its own state (the Memorizing
    /// Transformer's kNN memory), so the model carries its state from one training step to the
    /// next along ordered streams, as it does a `model.memory`.
    pub remembers: bool,
    /// Attention: gathers keys from anywhere in the sequence (random blocks, summaries, permuted
    /// blocks), so a score-acting position scheme must act through the distance alone.
    pub gathers_keys: bool,
    /// Attention: scores carry the absolute positions of query and key (a position scheme that
    /// scores absolute positions can act on them). Position: the scheme needs that.
    pub absolute_scores: bool,
    /// Attention: adds a global input beside the sequence (ETC's global tokens), which only a
    /// plain stack of distinct blocks carries.
    pub global_input: bool,
    /// Can be recomputed bit-identically by a reversible block's backward (no fresh noise).
    pub replayable: bool,
    /// Attention: reads the attention maps the previous block application left
    /// (`variorum_attention::CarriedMaps`: RealFormer, Lazyformer, evolving attention), so its
    /// blocks must run in order, once each per forward.
    pub cross_layer: bool,
    /// Attention: its layers play different roles by index (Lazyformer's computing and reusing
    /// layers), which one shared block applied at every depth cannot.
    pub distinct_layers: bool,
    /// Position: the scheme acts only through the query–key distance (no table of keys).
    pub distance_only: bool,
    /// Position: absolute positions added to the input (incoherent past a memory boundary).
    pub absolute: bool,
    /// Position: a signal added before every block (not carried by a skipped or shared block).
    pub per_layer: bool,
    /// Feed-forward: acts on each position alone (no window of earlier inputs as state).
    pub position_wise: bool,
    /// Attention: cross-attention — queries attend over a source sequence of another length
    /// (`AttentionInput::key_value`, an encoder's output), each query over every source row by
    /// content, independently of the other queries, source padding hidden. As an
    /// encoder–decoder uses it: a bidirectional mask over the source, no decoding state of its
    /// own (what the kind derives from a fixed source it may keep in the cross state the model
    /// hands `AttentionMechanism::cross_attention`), no position scheme between a query
    /// and the source (the layer is built with `Positioning::NONE`). Kinds whose pattern is tied
    /// to the query's position, that mix queries with one another, that reduce the source to a
    /// summary, or that read only their own sequence say no; neutral pieces declare none.
    pub cross: bool,
    /// Attention: hides padded keys (`AttentionMask::padding`) in bidirectional self-attention,
    /// so that a row padded at the end reads as the row alone — what an encoder over a batch of
    /// sources of different lengths needs. Kinds that pool, sort, bucket or transform the whole
    /// sequence before the mask applies, or whose pattern depends on the padded length (random
    /// or permuted blocks counted over it), say no.
    pub hides_padding: bool,
    /// Attention: honours a per-example graph (`AttentionMask::graph`, `data.graph`): a position
    /// reads only its neighbours and itself, through the dense score mask or by gathering them.
    pub graph: bool,
    /// Attention: draws a discrete choice trained by REINFORCE, each batch row against the
    /// others (`REINFORCE_PREFIX` terms): a micro-batch needs at least two rows.
    pub policy: bool,
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
        reads_memory: true,
        remembers: false,
        gathers_keys: false,
        absolute_scores: false,
        global_input: false,
        replayable: true,
        cross_layer: false,
        distinct_layers: false,
        distance_only: false,
        absolute: false,
        per_layer: false,
        position_wise: true,
        cross: false,
        hides_padding: true,
        graph: false,
        policy: false,
    };

    /// What two attention settings used in different layers of one model support together:
    /// what each can do, both must (causal, a memory, a score bias, …); what either does, the
    /// pair does (auxiliary losses, gathered keys, a global input, …). Every field is named, so a
    /// new one has to say which it is.
    pub fn together(self, other: Capabilities) -> Capabilities {
        let Capabilities {
            causal,
            bidirectional,
            incremental,
            score_bias,
            qk_rotation,
            aux_losses,
            variable_length,
            reads_memory,
            remembers,
            gathers_keys,
            absolute_scores,
            global_input,
            replayable,
            cross_layer,
            distinct_layers,
            distance_only,
            absolute,
            per_layer,
            position_wise,
            cross,
            hides_padding,
            graph,
            policy,
        } = self;
        Capabilities {
            causal: causal && other.causal,
            bidirectional: bidirectional && other.bidirectional,
            incremental: incremental && other.incremental,
            score_bias: score_bias && other.score_bias,
            qk_rotation: qk_rotation && other.qk_rotation,
            aux_losses: aux_losses || other.aux_losses,
            variable_length: variable_length && other.variable_length,
            reads_memory: reads_memory && other.reads_memory,
            remembers: remembers || other.remembers,
            gathers_keys: gathers_keys || other.gathers_keys,
            absolute_scores: absolute_scores && other.absolute_scores,
            global_input: global_input || other.global_input,
            replayable: replayable && other.replayable,
            cross_layer: cross_layer || other.cross_layer,
            distinct_layers: distinct_layers || other.distinct_layers,
            distance_only: distance_only && other.distance_only,
            absolute: absolute || other.absolute,
            per_layer: per_layer || other.per_layer,
            position_wise: position_wise && other.position_wise,
            cross: cross && other.cross,
            hides_padding: hides_padding && other.hides_padding,
            graph: graph && other.graph,
            policy: policy || other.policy,
        }
    }
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
    /// What the kind declares it supports.
    pub caps: Capabilities,
}
