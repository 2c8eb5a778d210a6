//! `variorum zoo`: every kind on every config axis, with its capabilities (and so the roles it
//! can take in an encoder–decoder) and its source paper.

use std::process::ExitCode;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct ZooArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ZooArgs) -> Result<ExitCode> {
    let kinds = variorum_model::zoo::kinds();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&kinds)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<20} {:<18} {:<64} {}", "axis", "kind", "supports", "paper");
    for k in kinds {
        let c = k.caps;
        // an attention kind's roles in an encoder–decoder: the encoder's self-attention
        // (bidirectional over padded sources), the decoder's (causal), cross-attention
        let attention = k.axis == "model.attention";
        let flags: Vec<&str> = [
            (c.causal, "causal"),
            (c.bidirectional, "bidir"),
            (c.incremental, "cache"),
            (c.score_bias, "bias"),
            (c.qk_rotation, "rot"),
            (c.aux_losses, "aux"),
            (c.variable_length, "varlen"),
            (c.graph, "graph"),
            (attention && c.bidirectional && c.hides_padding, "encoder"),
            (attention && c.causal, "decoder"),
            (attention && c.cross, "cross"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        println!("{:<20} {:<18} {:<64} {}", k.axis, k.kind, flags.join(","), k.paper);
        println!("{:<20} {:<18} {}", "", "", k.summary);
    }
    Ok(ExitCode::SUCCESS)
}
