//! What a run looks like: the HTML report, its line charts, learned attention heatmaps and the
//! patterns drawn as the papers draw them. Nothing here trains; everything reads a run.

pub mod heatmap;
pub mod pattern;
pub mod plot;
pub mod report;
