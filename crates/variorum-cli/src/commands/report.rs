//! `variorum report`: one self-contained HTML page for one or several runs (config, curves,
//! throughput, samples, attention, recorded evaluations, what adaptive models learned).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Default: RUN/report.html for one run, report.html for several.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let ReportArgs { runs, out, device } = args;
    let (device, _) = device.select()?;
    let out = match (out, runs.as_slice()) {
        (Some(out), _) => out,
        (None, [one]) => one.join(variorum_train::pictures::report::REPORT_FILE),
        (None, _) => PathBuf::from(variorum_train::pictures::report::REPORT_FILE),
    };
    let pb = variorum_train::progress::spinner(&format!("reading {} run(s)", runs.len()));
    let written = variorum_train::pictures::report::write(&runs, &out, &device);
    pb.finish_and_clear();
    written?;
    eprintln!("report written to {}", out.display());
    Ok(ExitCode::SUCCESS)
}
