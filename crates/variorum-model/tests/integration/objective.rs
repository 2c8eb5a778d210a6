//! `model.objective`: the masked objective adds the mask token and needs bidirectional attention;
//! what only makes sense left to right is refused with it, and kinds without a causal form are
//! refused for next-token prediction with a pointer to the masked objective.

use variorum_model::{ModelConfig, zoo};

fn parse(extra: &str) -> ModelConfig {
    let base = "vocab_size = 11\nd_model = 32\nn_layers = 2\nseq_len = 16\n";
    toml::from_str(&format!("{base}{extra}")).unwrap_or_else(|e| panic!("{e}"))
}

fn refusal(extra: &str) -> String {
    parse(extra).validate().expect_err("should be refused").to_string()
}

#[test]
fn the_masked_objective_adds_the_mask_token() {
    let causal = zoo::tiny();
    assert_eq!((causal.vocab(), causal.mask_token()), (11, None));
    let masked = parse("[objective]\nkind = \"masked\"");
    masked.validate().unwrap();
    assert_eq!((masked.vocab(), masked.mask_token()), (12, Some(11)));
    let model = masked.init(&burn::prelude::Device::flex());
    assert_eq!(model.token_embedding.weight.dims(), [12, 32]);
}

#[test]
fn a_mask_token_of_the_vocabulary_adds_no_row() {
    let masked = parse("[objective]\nkind = \"masked\"\nmask_token = 3");
    masked.validate().unwrap();
    assert_eq!((masked.vocab(), masked.mask_token()), (11, Some(3)));
    let model = masked.init(&burn::prelude::Device::flex());
    assert_eq!(model.token_embedding.weight.dims(), [11, 32]);
    assert_eq!(model.mask_token, Some(3));
    let e = refusal("[objective]\nkind = \"masked\"\nmask_token = 11");
    assert!(e.contains("model.objective.mask_token = 11 is not a token of the vocabulary (11 tokens)"), "{e}");
    // and when the vocabulary comes from the tokenizer
    let mut open_vocab: ModelConfig = toml::from_str("[objective]\nkind = \"masked\"\nmask_token = 20").unwrap();
    open_vocab.validate().unwrap();
    let e = open_vocab.resolve(11).unwrap_err().to_string();
    assert!(e.contains("mask_token = 20"), "{e}");
}

#[test]
fn left_to_right_pieces_are_refused_with_the_masked_objective() {
    for (extra, names) in [
        ("[objective]\nkind = \"masked\"\n[memory]\nkind = \"xl\"", "model.memory"),
        ("max_back = 4\n[objective]\nkind = \"masked\"", "model.max_back"),
        ("[objective]\nkind = \"masked\"\n[exits]\nkind = \"every-layer\"", "model.exits"),
        ("[objective]\nkind = \"masked\"\nmask_prob = 0", "model.objective.mask_prob"),
        ("[objective]\nkind = \"masked\"\nmask_token_prob = 0.95\nrandom_token_prob = 0.1", "at most 1"),
    ] {
        let e = refusal(extra);
        assert!(e.contains(names), "{extra}: {e}");
    }
}

#[test]
fn sinkhorn_sortcut_is_bidirectional_and_trains_only_masked() {
    let sortcut = "[attention]\nkind = \"sinkhorn\"\nblock = 4\nsortcut = 1\n";
    let e = refusal(sortcut);
    assert!(e.contains("model.objective.kind = \"masked\""), "{e}");
    parse(&format!("{sortcut}[objective]\nkind = \"masked\"")).validate().unwrap();
}

#[test]
fn kinds_without_a_causal_form_are_refused_for_next_token_prediction_and_say_why() {
    for (kind, why) in [
        ("kind = \"linformer\"\nmax_len = 16\nk = 4", "E and F mix every position"),
        ("kind = \"nystrom\"\nlandmarks = 4", "landmarks are means over segments"),
        ("kind = \"clustered\"\nclusters = 4", "centroid"),
        ("kind = \"inducing-points\"\nslots = 4", "every slot reads the whole sequence"),
    ] {
        let e = refusal(&format!("[attention]\n{kind}"));
        assert!(e.contains("has no causal form") && e.contains(why), "{kind}: {e}");
        assert!(e.contains("model.objective.kind = \"masked\""), "{kind}: {e}");
        parse(&format!("[attention]\n{kind}\n[objective]\nkind = \"masked\"")).validate().unwrap();
    }
}

#[test]
fn linformer_refuses_a_context_past_its_projections() {
    let e = refusal("[attention]\nkind = \"linformer\"\nmax_len = 8\nk = 4\n[objective]\nkind = \"masked\"");
    assert!(e.contains("model.seq_len = 16") && e.contains("model.attention.max_len = 8"), "{e}");
}

#[test]
fn poolingformer_refuses_a_memory() {
    let e = refusal(
        "[attention]\nkind = \"poolingformer\"\nwindow = 4\n[memory]\nkind = \"xl\"\n[position]\nkind = \"none\"",
    );
    assert!(e.contains("cannot read a memory"), "{e}");
}

#[test]
fn etc_cpc_needs_global_tokens_and_a_visible_segment() {
    let masked = "[objective]\nkind = \"masked\"\n[objective.cpc]\n";
    let e = refusal(masked);
    assert!(e.contains("model.objective.cpc") && e.contains("kind = \"etc\""), "{e}");
    // context 16, segments of 4: four segments, at most three hidden
    let etc = "[attention]\nkind = \"etc\"\nwindow = 2\nsegment = 4\n";
    parse(&format!("{etc}{masked}segments = 3")).validate().unwrap();
    let e = refusal(&format!("{etc}{masked}segments = 4"));
    assert!(e.contains("model.objective.cpc.segments = 4") && e.contains("4 complete segments of 4"), "{e}");
    let e = refusal(&format!("{etc}{masked}weight = 0"));
    assert!(e.contains("model.objective.cpc.weight = 0"), "{e}");
    let e = refusal(&format!("{etc}{masked}segments = 0"));
    assert!(e.contains("model.objective.cpc.segments must be at least 1"), "{e}");
}
