//! The model's integration tests (memories, objectives, encoder–decoder, per-layer settings,
//! attention maps, …), one module per file, built as one test binary. `generic.rs`, the harness
//! over every registered kind, stays its own: the harness's seeded checks hold a lock against
//! one another, but the tests here seed Burn's process-wide generator without it and would change
//! the weights the harness draws.

mod attention_maps;
mod cross_layer;
mod embedding_and_head;
mod encoder_decoder;
mod memory;
mod objective;
mod per_layer;
mod readme_kinds;
mod scores_and_heads;
mod sparse_patterns;
mod universal;
