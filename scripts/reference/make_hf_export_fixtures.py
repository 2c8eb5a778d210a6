#!/usr/bin/env python3
"""Fixtures for `variorum export --format hf`: runs trained here, exported, and what transformers
computes with the export (crates/variorum-train/tests/fixtures/hf/export/<name>/).

Ten runs trained by the variorum binary on corpus.txt (Sonnet 18 four times, committed beside
them) and six imported models fine-tuned (roundtrip, t5, deberta, big_bird, longformer, reformer):
  gpt        the GPT recipe (learned positions, pre-LN LayerNorm, exact GELU, tied embeddings,
             characters) -> GPT2LMHeadModel, its char tokenizer as a tokenizer.json;
  llama      the LLaMA-style recipe as variorum's baby config has it (rotary positions pairing
             (2k, 2k+1), RMSNorm, SwiGLU, 4 query heads on 2 key/value heads, untied) ->
             LlamaForCausalLM, the rotary features permuted to transformers' rotate-half order;
  neox       rotary pairs (2k, 2k+1) on 2 of each head's 4 dimensions, LayerNorm, attention and
             feed-forward in parallel, biases, GELU, untied -> GPTNeoXForCausalLM (the fused
             projection stored per head, the rotary features permuted);
  phi        one LayerNorm shared by parallel branches, rotate-half rotary on 2 of each head's 4
             dimensions, 4 query heads on 2 key/value heads, a head bias -> PhiForCausalLM;
  gptj       the same with rotary pairs (2k, 2k+1) and no attention biases -> GPTJForCausalLM
             (GPT-J's own pairing: nothing permuted);
  bloom      ALiBi over 6 heads, a LayerNorm on the embeddings, tanh GELU, tied ->
             BloomForCausalLM;
  bert       a masked model: learned positions, the embedding LayerNorm, post-LN blocks, the MLM
             head transform and bias, its mask token an extra row -> BertForMaskedLM, the mask
             token added to the exported tokenizer as [MASK];
  fnet       the same with the fnet kind's Fourier mixing, an embedding projection and tanh GELU
             -> FNetForMaskedLM;
  nystromformer  BERT's with the nystrom kind (4 landmarks over its 60 positions, the authors'
             start of the pseudo-inverse, a conv of width 5 on V) and tanh GELU ->
             NystromformerForMaskedLM;
  t5_scratch the T5 recipe trained here from scratch on pairs.tsv (T5's bucketed bias with one
             table per stack, `shared = true`; RMSNorm, unscaled attention without biases, ReLU,
             the head tied and read at 1/sqrt(d_model); characters, `</s>` an extra row) ->
             T5ForConditionalGeneration, `</s>` added to the exported vocabulary;
  roundtrip  the round trip: tests/fixtures/hf/llama (a transformers model, bf16) imported,
             fine-tuned 100 steps (`train --init-from`, its own tokenizer kept by
             `data.tokenizer.kind = "file"`), exported again;
  t5         the same for an encoder–decoder: tests/fixtures/hf/t5_v1_1 imported, fine-tuned
             100 steps on pairs.tsv (each line of the sonnet and the next; each stack's one
             relative bias table trained as one, `shared = true`, as the import writes it),
             exported as T5ForConditionalGeneration; transformers scores a target given its
             source and decodes the source greedily (AutoModelForSeq2SeqLM).
  deberta    the same for DeBERTa: tests/fixtures/hf/deberta_v2 (v3's settings: log buckets,
             the relative table normed and read through the content projections) imported,
             fine-tuned 100 steps on the sonnet with the position parameters frozen (DeBERTa
             has one relative table for all layers, variorum one per layer: frozen, the copies
             stay equal), exported as DebertaV2ForMaskedLM (the position projections as their
             own, BERT's head).
  big_bird   the same for BigBird: tests/fixtures/hf/big_bird (block-sparse attention in blocks
             of 2, 2 random blocks, the embeddings rescaled) imported, fine-tuned 100 steps on
             the sonnet, exported as BigBirdForMaskedLM; scored on a longer text (31 tokens),
             for which transformers computes the block-sparse attention rather than full.
  reformer   the same for Reformer: tests/fixtures/hf/reformer (local and LSH layers in turn,
             axial positions, reversible blocks whose streams are concatenated) imported,
             fine-tuned 100 steps, exported as ReformerForMaskedLM; transformers scores it with
             its LSH rotations drawn from a hash_seed, recorded for the test to hand to variorum.
  longformer the same for Longformer: tests/fixtures/hf/longformer (windows of 4 and 8 keys each
             way, global projections of its own, RoBERTa's tokenizer) imported, fine-tuned 100
             steps, exported as LongformerForMaskedLM (positions numbered from the padding
             token's id, the rows before written as zeros).

Each directory holds the run (config.toml, tokenizer.json, model.bpk) and expected.json: the
text's token ids as transformers' AutoTokenizer gives them from the export, the log-probability
transformers gives every token after the first (fp32, eager attention), the 32 tokens its greedy
`generate` appends to a prompt, and the sha256 of every file `variorum export` wrote, so that the
test, exporting the same run again without Python, knows it wrote the files transformers scored.

Usage (from the repository root, after `cargo build --release`):
    python3 scripts/reference/make_hf_export_fixtures.py [VARIORUM_BINARY [NAME...]]
(pinned versions: scripts/reference/requirements.txt).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM, AutoTokenizer

# the import fixtures' script: the pinned version's check, and what transformers computes
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import expectations as transformers_computes  # noqa: E402
from make_hf_fixtures import reformer_encoder_output, reformer_rotations  # noqa: E402
from make_hf_fixtures import BIG_BIRD_TEXT  # noqa: E402
from make_hf_fixtures import masked_expectations  # noqa: E402
from make_hf_fixtures import seq2seq_expectations  # noqa: E402

ROOT = "crates/variorum-train/tests/fixtures/hf/export"
CORPUS = os.path.join(ROOT, "corpus.txt")
PAIRS = os.path.join(ROOT, "pairs.tsv")
TEXT = "Shall I compare thee to a summer's day? Thou art more lovely"
PROMPT = "So long as men"

# What every run shares: a tiny model trained briefly (the weights only need to be far from
# their initialisation for a wrong mapping to show).
TRAIN = """
[data]
path = "{corpus}"
val_fraction = 0.25
{tokenizer}

[train]
steps = {steps}
batch_size = 8
lr = 3e-3
warmup_steps = 10
eval_interval = {steps}
eval_batches = 2
checkpoint_interval = {steps}
sample_tokens = 0
"""

GPT = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = true

[model.position]
kind = "learned"

[model.attention]
kind = "full"
n_heads = 4

[model.block]
kind = "pre-ln"
norm = "layer-norm"

[model.feed_forward]
kind = "gelu"
d_ff = 32
"""

LLAMA = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = false

[model.position]
kind = "rope"
layout = "interleaved"

[model.attention]
kind = "full"
n_heads = 4
n_kv_heads = 2
bias = false

[model.block]
kind = "pre-ln"
norm = "rms-norm"

[model.feed_forward]
kind = "swiglu"
d_ff = 32
bias = false
"""

NEOX = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = false

[model.position]
kind = "rope"
layout = "interleaved"
rotary_dim = 2

[model.attention]
kind = "full"
n_heads = 4

[model.block]
kind = "pre-ln"
norm = "layer-norm"
parallel = true

[model.feed_forward]
kind = "gelu"
d_ff = 32
"""

PHI = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = false
head_bias = true

[model.position]
kind = "rope"
rotary_dim = 2

[model.attention]
kind = "full"
n_heads = 4
n_kv_heads = 2

[model.block]
kind = "pre-ln"
norm = "layer-norm"
parallel = true
shared_norm = true

[model.feed_forward]
kind = "gelu-tanh"
d_ff = 48
"""

GPTJ = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = false
head_bias = true

[model.position]
kind = "rope"
layout = "interleaved"
rotary_dim = 2

[model.attention]
kind = "full"
n_heads = 4
bias = false

[model.block]
kind = "pre-ln"
norm = "layer-norm"
parallel = true
shared_norm = true

[model.feed_forward]
kind = "gelu-tanh"
d_ff = 48
"""

BLOOM = """
[model]
d_model = 24
n_layers = 2
seq_len = 64
tie_embeddings = true
embedding_norm = true

[model.position]
kind = "alibi"

[model.attention]
kind = "full"
n_heads = 6

[model.block]
kind = "pre-ln"
norm = "layer-norm"

[model.feed_forward]
kind = "gelu-tanh"
d_ff = 96
"""

BERT = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = true
embedding_norm = true
head_transform = true
head_bias = true

[model.position]
kind = "learned"

[model.attention]
kind = "full"
n_heads = 4

[model.block]
kind = "post-ln"
norm = "layer-norm"

[model.feed_forward]
kind = "gelu"
d_ff = 32

[model.objective]
kind = "masked"
"""

# BERT's with Nyströmformer's attention: 4 landmarks over the 60-character text (transformers
# approximates at exactly its segment_means_seq_len, the run's seq_len), the authors' start of
# the pseudo-inverse, a depthwise conv of width 5 on V
NYSTROM = BERT.replace("seq_len = 64", "seq_len = 60").replace(
    'kind = "full"\nn_heads = 4',
    'kind = "nystrom"\nn_heads = 4\nlandmarks = 4\nconv_kernel = 5\npinv_scale = "batch"',
).replace('kind = "gelu"\nd_ff', 'kind = "gelu-tanh"\nd_ff')

FNET = """
[model]
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = true
embedding_norm = true
embedding_projection = true
head_transform = true
head_bias = true

[model.position]
kind = "learned"

[model.attention]
kind = "fnet"

[model.block]
kind = "post-ln"
norm = "layer-norm"

[model.feed_forward]
kind = "gelu-tanh"
d_ff = 32

[model.objective]
kind = "masked"
"""

# T5's recipe from scratch (v1.0's tied head read at 1/sqrt(d_model), ReLU), one relative bias
# table per stack as T5 has it, on the sonnet's pairs of lines; drawn wide (T5 draws its
# embedding from N(0, 1)), or the head's 1/sqrt(d_model) leaves the logits near uniform
T5_SCRATCH = """
[model]
kind = "encoder-decoder"
init_std = 0.25
d_model = 16
n_layers = 2
seq_len = 64
tie_embeddings = true
scale_head = true

[model.encoder]
n_layers = 2

[model.attention]
kind = "full"
n_heads = 4
bias = false
scaled = false

[model.cross_attention]
kind = "full"
n_heads = 4
bias = false
scaled = false

[model.position]
kind = "t5"
num_buckets = 8
max_distance = 20
shared = true

[model.block]
kind = "pre-ln"
norm = "rms-norm"
norm_eps = 1e-6

[model.feed_forward]
kind = "relu"
d_ff = 32
bias = false
"""

CORPUS_TEXT = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
"""

KEEP = ("config.toml", "tokenizer.json", "model.bpk")


def variorum(binary, *args):
    subprocess.run([binary, *args], check=True, stdout=subprocess.DEVNULL)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expectations(export_dir):
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    with open(os.path.join(export_dir, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    masked = model_type in ("bert", "fnet", "nystromformer", "deberta-v2", "big_bird", "longformer", "reformer")
    auto = AutoModelForMaskedLM if masked else AutoModelForSeq2SeqLM if model_type == "t5" else AutoModelForCausalLM
    # Reformer's LSH draws its rotations at every forward: seeded here, recorded below, and
    # handed to variorum's layers by the test
    seeded = {"hash_seed": REFORMER_HASH_SEED} if model_type == "reformer" else {}
    model = auto.from_pretrained(export_dir, dtype=torch.float32, attn_implementation="eager", **seeded).eval()
    if model_type == "t5":
        expected = {"class": type(model).__name__, **seq2seq_expectations(model, tokenizer)}
        expected["exported"] = {f: sha256(os.path.join(export_dir, f)) for f in sorted(os.listdir(export_dir))}
        return expected
    # BigBird attends in full to texts of at most (5 + 2r)·b tokens
    text = BIG_BIRD_TEXT if model_type == "big_bird" else TEXT
    ids = tokenizer(text)["input_ids"]
    # the text again, or, from an imported WordPiece tokenizer (lowercased, punctuation split),
    # a text that encodes to the same ids
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == text or tokenizer(decoded)["input_ids"] == ids, f"the exported tokenizer does not round-trip: {decoded!r}"
    if masked:
        computed = masked_expectations(model, tokenizer, tokenizer.mask_token_id, text)
        if model_type == "reformer":
            computed["hidden"] = reformer_encoder_output(model, computed["masked_ids"])
            computed["rotations"] = reformer_rotations(model.config)
    else:
        computed = transformers_computes(model, tokenizer, text, PROMPT)
    expected = {"class": type(model).__name__, **computed}
    expected["exported"] = {f: sha256(os.path.join(export_dir, f)) for f in sorted(os.listdir(export_dir))}
    return expected


REFORMER_HASH_SEED = 7


def train(binary, tmp, name, text, init_from=None):
    config = os.path.join(tmp, f"{name}.toml")
    with open(config, "w") as f:
        f.write(text)
    run = os.path.join(tmp, name)
    args = ["train", config, "--out", run, "--no-progress", "--no-report"]
    if init_from:
        args += ["--init-from", init_from]
    variorum(binary, *args)
    return run


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "release", "variorum")
    names = set(sys.argv[2:])
    wanted = lambda name: not names or name in names  # noqa: E731
    torch.set_num_threads(1)
    os.makedirs(ROOT, exist_ok=True)
    with open(CORPUS, "w") as f:
        # four times: a validation quarter longer than the imported model's 128 positions
        f.write(CORPUS_TEXT * 4)
    lines = CORPUS_TEXT.strip().split("\n")
    with open(PAIRS, "w") as f:
        f.writelines(f"{a}\t{b}\n" for a, b in zip(lines, lines[1:]))
    with tempfile.TemporaryDirectory() as tmp:
        char = TRAIN.format(corpus=CORPUS, tokenizer='tokenizer = { kind = "char" }', steps=200)
        recipes = {
            "gpt": GPT, "llama": LLAMA, "neox": NEOX, "phi": PHI, "gptj": GPTJ, "bloom": BLOOM, "bert": BERT, "fnet": FNET,
            "nystromformer": NYSTROM,
        }
        runs = {name: train(binary, tmp, name, recipe + char) for name, recipe in recipes.items() if wanted(name)}
        if wanted("t5_scratch"):
            pairs = TRAIN.format(corpus=PAIRS, tokenizer='tokenizer = { kind = "char" }\n[data.pairs]', steps=1000)
            runs["t5_scratch"] = train(binary, tmp, "t5_scratch", T5_SCRATCH + pairs)
        def fine_tuned(name, fixture, corpus, pairs=False, freeze_positions=False):
            """tests/fixtures/hf/<fixture> imported, then fine-tuned 100 steps on `corpus` with
            its own tokenizer; `imported-<name>` is the import (the fixture's config names it)."""
            imported = os.path.join(tmp, f"imported-{name}")
            variorum(binary, "import", f"crates/variorum-train/tests/fixtures/hf/{fixture}", "--out", imported)
            tokenizer = f'tokenizer = {{ kind = "file", path = "{imported}/tokenizer.json" }}'
            text = f'extends = "{imported}/config.toml"\n' + TRAIN.format(
                corpus=corpus, tokenizer=tokenizer + ("\n[data.pairs]" if pairs else ""), steps=100
            )
            if freeze_positions:
                text += "\n[train.freeze]\npositions = true\n"
            runs[name] = train(binary, tmp, name, text, init_from=imported)

        if wanted("roundtrip"):
            fine_tuned("roundtrip", "llama", CORPUS)
        # the one table DeBERTa's encoder shares stays one (T5's: the import writes shared = true)
        if wanted("deberta"):
            fine_tuned("deberta", "deberta_v2", CORPUS, freeze_positions=True)
        if wanted("big_bird"):
            fine_tuned("big_bird", "big_bird", CORPUS)
        if wanted("longformer"):
            fine_tuned("longformer", "longformer", CORPUS)
        if wanted("reformer"):
            fine_tuned("reformer", "reformer", CORPUS)
        if wanted("t5"):
            fine_tuned("t5", "t5_v1_1", PAIRS, pairs=True)

        for name, run in runs.items():
            export_dir = os.path.join(tmp, f"{name}-hf")
            variorum(binary, "export", run, "--format", "hf", "--out", export_dir)
            expected = expectations(export_dir)
            d = os.path.join(ROOT, name)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            for f in KEEP:
                shutil.copy(os.path.join(run, f), d)
            # the run's config names temporary paths that are gone: the fixture's own instead
            with open(os.path.join(d, "config.toml")) as f:
                config = f.read()
            for i in ("imported-roundtrip", "imported-t5", "imported-deberta", "imported-big_bird", "imported-longformer", "imported-reformer"):
                config = config.replace(f"{os.path.join(tmp, i)}/tokenizer.json", os.path.join(d, "tokenizer.json"))
            with open(os.path.join(d, "config.toml"), "w") as f:
                f.write(config)
            with open(os.path.join(d, "expected.json"), "w") as f:
                json.dump(expected, f, indent=1)
                f.write("\n")
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            n = len(expected.get("ids", expected.get("target_ids", [])))
            print(f"{d}: {expected['class']}, {n} tokens, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
