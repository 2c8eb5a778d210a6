//! The `variorum` binary's tests (every command run as a process, exactness across thread
//! counts), built as one test binary; `wgpu.rs` stays its own (it may set the process's
//! environment before any thread starts).

mod cli;
mod exact;
