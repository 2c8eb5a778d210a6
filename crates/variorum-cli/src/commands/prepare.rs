//! `variorum prepare`: a config's `[data] sources` tokenized once into token shards
//! that training reads window by window (see variorum-data's `prepared` module, and docs/data.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use variorum_train::ExperimentConfig;

#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// The config whose `[data] sources` are prepared.
    pub config: PathBuf,
    /// Where the shards go (default: the config's `data.prepared`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: PrepareArgs) -> Result<ExitCode> {
    let cfg = ExperimentConfig::load(&args.config)?;
    let p = variorum_train::prepared::prepare_corpus(&cfg.data, args.out.as_deref())?;
    let i = &p.index;
    let what = match (p.written, p.kept) {
        (false, _) => "already prepared (sources unchanged)".to_string(),
        (true, 0) => "prepared".to_string(),
        (true, k) => format!("prepared ({k} shards kept from an interrupted prepare)"),
    };
    let docs = |f: fn(&variorum_data::ShardRecord) -> u64| i.shards.iter().map(f).sum::<u64>();
    println!("{}: {what}", p.dir.display());
    println!(
        "  {} shards of u{}; training {} tokens in {} documents; validation {} tokens in {} documents",
        i.shards.len(),
        8 * u32::from(i.width),
        i.train_tokens(),
        docs(|s| s.train_documents),
        i.val_tokens(),
        docs(|s| s.val_documents)
    );
    for (n, s) in i.sources.iter().enumerate() {
        let skipped = match s.skipped_invalid {
            0 => String::new(),
            k => format!(", {k} skipped (not UTF-8)"),
        };
        println!(
            "  source {n} {}: {} files, {} documents{skipped}, {} training tokens",
            s.config.path,
            s.files.len(),
            s.documents,
            s.train_tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}
