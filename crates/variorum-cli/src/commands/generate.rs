//! `variorum generate`: continue a prompt with a trained run, streaming the text as it is
//! produced (sampling, beam search, or sampling from the kNN-LM mixture); an encoder–decoder
//! writes the target of `--source`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use variorum_train::generate::SampleConfig;
use variorum_train::run::Run;

use crate::common::at_least;
use crate::datastore::KnnArgs;
use crate::device::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A run directory.
    pub run: PathBuf,
    #[arg(long, required_unless_present = "source")]
    pub prompt: Option<String>,
    /// The source an encoder–decoder writes a target for (the encoder runs once; the
    /// decoder stops at its end token or its context).
    #[arg(long, conflicts_with = "prompt")]
    pub source: Option<String>,
    #[arg(long, default_value_t = 200)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample among the k most likely tokens only (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample within the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Recompute the whole context for every token instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Beam search with this many beams (deterministic; ignores the sampling options).
    #[arg(long, default_value_t = 1)]
    pub beams: usize,
    /// Generate under this example tag (a run trained on tagged data: the names are in its
    /// tags.json, e.g. "HAMLET, PRINCE OF DENMARK").
    #[arg(long)]
    pub tag: Option<String>,
    /// Draw each token from the kNN-LM mixture with this datastore (`variorum datastore build`).
    #[arg(long, conflicts_with_all = ["source", "beams"])]
    pub knn: Option<PathBuf>,
    /// Neighbours retrieved per token.
    #[arg(long, default_value_t = 64, requires = "knn")]
    pub knn_k: usize,
    /// Weight λ of the kNN distribution.
    #[arg(long, default_value_t = 0.25, requires = "knn")]
    pub knn_lambda: f64,
    /// Temperature T of p_kNN ∝ exp(−distance / T).
    #[arg(long, default_value_t = 1.0, requires = "knn")]
    pub knn_temperature: f64,
}

pub fn run(args: GenerateArgs) -> Result<ExitCode> {
    let GenerateArgs {
        run,
        prompt,
        source,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        device,
        no_cache,
        beams,
        tag,
        knn,
        knn_k,
        knn_lambda,
        knn_temperature,
    } = args;
    at_least("--beams", beams, 1)?;
    at_least("--max-new-tokens", max_new_tokens, 1)?;
    if !(temperature >= 0.0 && temperature.is_finite()) {
        anyhow::bail!("--temperature {temperature} must be >= 0 (0 = greedy)");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        anyhow::bail!("--top-p {top_p} must be in (0, 1]");
    }
    let (device, _) = device.select()?;
    let run = Run::load(&run, &device)?;
    if run.model.mask_token.is_some() {
        anyhow::bail!(
            "{} was trained with model.objective.kind = \"masked\" (bidirectional attention): it fills in hidden tokens and cannot generate left to right; see its sample.txt, or score it with `variorum eval`",
            run.dir.display()
        );
    }
    if run.model.encoder.is_some() || source.is_some() {
        let Some(source) = source else {
            anyhow::bail!(
                "{} is an encoder–decoder: it writes the target of a source; pass --source TEXT",
                run.dir.display()
            );
        };
        if run.model.encoder.is_none() {
            anyhow::bail!(
                "{} is a decoder-only model: it continues a prompt (--prompt), it has no encoder to read --source",
                run.dir.display()
            );
        }
        if tag.is_some() {
            anyhow::bail!("--tag: an encoder–decoder is not conditioned on example tags");
        }
        if no_cache && beams > 1 {
            eprintln!("note: beam search recomputes its beams every step; --no-cache changes nothing");
        }
        if max_new_tokens >= run.model.seq_len {
            eprintln!(
                "note: the target stops at {} tokens, model.seq_len less the end token it starts from",
                run.model.seq_len - 1
            );
        }
        let cfg = SampleConfig { max_new_tokens, temperature, top_k, top_p, seed, no_cache, tag: None };
        return generate_from_source(&run, &source, &cfg, beams, &device);
    }
    let prompt = prompt.unwrap_or_default();
    let prompt_ids = run.encode_prompt(&prompt)?;
    let tag = tag.map(|name| run.tag_id(&name)).transpose()?;
    if tag.is_none() && run.config.model.attention.tags().is_some() && !run.tags.is_empty() {
        eprintln!(
            "note: generating untagged (tag 0); pass --tag with one of the {} tags in {}",
            run.tags.len() - 1,
            run.dir.join(variorum_train::run::TAGS_FILE).display()
        );
    }
    let cfg = SampleConfig { max_new_tokens, temperature, top_k, top_p, seed, no_cache, tag };
    let mut out = std::io::stdout();
    write!(out, "{prompt}")?;
    out.flush()?;
    // decode the whole continuation each time and print what is new, so multi-byte
    // characters split over byte-level tokens come out whole
    let mut generated: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let start = std::time::Instant::now();
    if beams > 1 && run.model.long_term_memory.is_some() {
        anyhow::bail!(
            "--beams: beam search does not retrieve for a long-term memory; sample without --beams (greedy with --temperature 0)"
        );
    }
    if beams > 1 {
        let best = variorum_train::generate::beam_search(&run.model, &prompt_ids, beams, max_new_tokens, tag, &device);
        let secs = start.elapsed().as_secs_f64();
        writeln!(out, "{}", run.tokenizer.decode(&best))?;
        eprintln!(
            "{} tokens in {secs:.2} s: {:.1} tokens/s (beam search, {beams} beams)",
            best.len(),
            best.len() as f64 / secs.max(1e-9)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let store = match &knn {
        Some(dir) => {
            // `eval --knn`'s settings, with one k and one λ and the index's default search
            let args = KnnArgs {
                knn: Some(dir.clone()),
                knn_k: vec![knn_k],
                knn_lambda: vec![knn_lambda],
                knn_temperature,
                knn_exact: false,
                knn_ef: 128,
                knn_recall: 0,
            };
            args.check()?;
            variorum_train::retrieval::knn_lm::check_run(&run)?;
            let store = variorum_retrieval::Datastore::open(dir)?;
            variorum_train::retrieval::knn_lm::check_datastore(&run, &store)?;
            Some((store, args))
        }
        None => None,
    };
    let retriever = store.as_ref().map(|(store, args)| variorum_train::retrieval::knn_lm::Retriever {
        store,
        knn: variorum_retrieval::KnnConfig { k: knn_k, lambda: knn_lambda, temperature: knn_temperature },
        mode: args.mode(),
    });
    // a long-term memory retrieves for every position as the text grows
    let neighbours = match run.config.model.long_term_memory {
        Some(_) => Some(variorum_train::retrieval::spalm::OnlineNeighbours::open(
            &run.config,
            run.model.vocab_size,
            &device,
            64,
        )?),
        None => None,
    };
    let retrieval = variorum_train::generate::Retrieval { knn: retriever.as_ref(), neighbours: neighbours.as_ref() };
    variorum_train::generate::generate_with(&run.model, &prompt_ids, &cfg, retrieval, &device, |t| {
        generated.push(t);
        let text = run.tokenizer.decode(&generated);
        let text = text.trim_end_matches('\u{FFFD}');
        if text.len() > printed && text.is_char_boundary(printed) {
            let _ = write!(out, "{}", &text[printed..]);
            let _ = out.flush();
            printed = text.len();
        }
    })?;
    let secs = start.elapsed().as_secs_f64();
    let text = run.tokenizer.decode(&generated);
    if text.len() > printed && text.is_char_boundary(printed) {
        write!(out, "{}", &text[printed..])?;
    }
    writeln!(out)?;
    eprintln!(
        "{} tokens in {secs:.2} s: {:.1} tokens/s ({})",
        generated.len(),
        generated.len() as f64 / secs.max(1e-9),
        if run.model.has_memory() {
            "memory carried"
        } else if knn.is_some() && no_cache {
            "no cache, kNN-LM"
        } else if knn.is_some() {
            "KV cache, kNN-LM"
        } else if no_cache {
            "no cache"
        } else {
            "KV cache"
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `variorum generate --source`: an encoder–decoder's target for `source`, streamed (sampling)
/// or printed whole (beam search).
fn generate_from_source(
    run: &Run,
    source: &str,
    cfg: &SampleConfig,
    beams: usize,
    device: &burn::prelude::Device,
) -> Result<ExitCode> {
    // as the model was trained on sources: with the tokenizer's special tokens (T5's `</s>`)
    let ids = run.tokenizer.encode_prompt(source).context("the source cannot be encoded")?;
    if ids.is_empty() || ids.len() > run.model.seq_len {
        anyhow::bail!(
            "the source is {} tokens: an encoder–decoder reads 1 to model.seq_len = {} tokens",
            ids.len(),
            run.model.seq_len
        );
    }
    // the special tokens the config adds start after the text vocabulary
    let vocab = run.model.text_vocab;
    let start = std::time::Instant::now();
    let mut out = std::io::stdout();
    let written = if beams > 1 {
        let best = variorum_train::seq2seq::beam_search_from(&run.model, &ids, beams, cfg.max_new_tokens, device);
        writeln!(out, "{}", variorum_train::seq2seq::show(&best, &run.tokenizer, vocab))?;
        best
    } else {
        let mut so_far = Vec::new();
        let mut printed = 0usize;
        let best = variorum_train::seq2seq::generate_from(&run.model, &ids, cfg, device, |t| {
            so_far.push(t);
            let text = variorum_train::seq2seq::show(&so_far, &run.tokenizer, vocab);
            let text = text.trim_end_matches('\u{FFFD}');
            if text.len() > printed && text.is_char_boundary(printed) {
                let _ = write!(out, "{}", &text[printed..]);
                let _ = out.flush();
                printed = text.len();
            }
        });
        let text = variorum_train::seq2seq::show(&best, &run.tokenizer, vocab);
        if text.len() > printed && text.is_char_boundary(printed) {
            write!(out, "{}", &text[printed..])?;
        }
        writeln!(out)?;
        best
    };
    let secs = start.elapsed().as_secs_f64();
    let how = match (beams > 1, cfg.no_cache) {
        (true, _) => format!("beam search, {beams} beams"),
        (false, true) => "no cache: the source and the prefix read again for every token".into(),
        (false, false) => "source encoded once, KV cache".into(),
    };
    eprintln!("{} tokens in {secs:.2} s: {:.1} tokens/s ({how})", written.len(), written.len() as f64 / secs.max(1e-9));
    Ok(ExitCode::SUCCESS)
}
