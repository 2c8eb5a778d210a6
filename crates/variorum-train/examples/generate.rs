//! Library use of a trained run: load it, generate, score.
//!
//! ```sh
//! cargo run --release -p variorum-train --example generate -- runs/gpt-baby-shakespeare-char "ROMEO:"
//! ```

use burn::prelude::*;
use variorum_train::generate::SampleConfig;
use variorum_train::run::Run;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), prompt) = (args.next(), args.next().unwrap_or_else(|| "\n".into())) else {
        anyhow::bail!("usage: generate RUN_DIR [PROMPT]");
    };
    let device = Device::flex();
    let run = Run::load(dir.as_ref(), &device)?;

    let prompt_ids = run.encode_prompt(&prompt)?;
    let cfg = SampleConfig {
        max_new_tokens: 200,
        temperature: 0.8,
        top_k: 0,
        top_p: 0.95,
        seed: 1,
        no_cache: false,
        tag: None,
    };
    let continuation = run.generate(&prompt_ids, &cfg, |_| {});
    println!("{prompt}{}", run.tokenizer.decode(&continuation));

    let mut all = prompt_ids;
    all.extend(&continuation);
    let scores = run.score(&all)?;
    let n = scores.tokens.len() as f64;
    println!(
        "\n{} {}s scored: {:.3} nats/{}",
        scores.tokens.len(),
        scores.unit,
        -scores.total_logprob / n,
        scores.unit
    );
    Ok(())
}
