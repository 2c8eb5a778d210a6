//! `variorum runs`: a table (or JSON) of the run directories under a folder: model, steps done,
//! best validation loss, tokens/s and status.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct RunsArgs {
    /// Default: runs.
    pub dir: Option<PathBuf>,
    /// One JSON object per run instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: RunsArgs) -> Result<ExitCode> {
    let RunsArgs { dir, json } = args;
    let root = dir.unwrap_or_else(|| PathBuf::from("runs"));
    let rows = variorum_train::listing::list(&root)?;
    let mut table = String::new();
    if json {
        table = serde_json::to_string_pretty(&rows)? + "\n";
    } else {
        let name = |d: &Path| d.strip_prefix(&root).unwrap_or(d).display().to_string();
        let width = rows.iter().map(|r| name(&r.dir).len()).max().unwrap_or(3).max(3);
        let head = ("run", "model", "steps", "best val", "tokens/s");
        table += &format!("{:<width$}  {:<36}  {:>11}  {:>8}  {:>9}  status\n", head.0, head.1, head.2, head.3, head.4);
        for r in &rows {
            let steps = format!("{}/{}", r.steps_done, r.steps);
            let val = r.best_val_loss.map_or("-".to_string(), |v| format!("{v:.4}"));
            let speed = r.tokens_per_sec.map_or("-".to_string(), |v| format!("{v:.0}"));
            let status = serde_json::to_value(r.status)?.as_str().unwrap_or("?").to_string();
            let model: String = r.model.chars().take(36).collect();
            let run = name(&r.dir);
            table += &format!("{run:<width$}  {model:<36}  {steps:>11}  {val:>8}  {speed:>9}  {status}\n");
        }
        if rows.is_empty() {
            table += &format!("# no run directories under {}\n", root.display());
        }
    }
    // a reader that stops early (`| head`) ends the table, not the program
    match std::io::stdout().lock().write_all(table.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}
