#!/usr/bin/env python3
"""Fixtures for LoRA adapters in Hugging Face PEFT's files (crates/variorum-train/tests/fixtures/peft/).

Both directions, on the two transformers models of tests/fixtures/hf (a LLaMA and a GPT-2, whose
Conv1D layers store [in, out] and fuse q | k | v in one `c_attn`):

  llama_from_peft, gpt2_from_peft
      an adapter made by PEFT itself on the transformers model, its factors random (B not zero):
      every projection of the LLaMA (q/k/v/o, gate/up/down); GPT-2's c_attn, c_proj and c_fc
      (fan_in_fan_out) with an alpha_pattern giving the MLP's c_fc its own alpha. The test imports
      the model and the adapter (`variorum import ADAPTER --base RUN`) and must compute the logits
      PEFT computed within 1e-4.
  llama_export, gpt2_export
      a LoRA run trained here by the variorum binary on the imported model (30 steps of
      corpus.txt: the LLaMA with every projection adapted, its rotary features permuted on the
      way out; GPT-2 with q and v only, which `c_attn` holds as one module: a rank-2r pair),
      exported without --merge; PEFT loads the export onto the transformers model. The directory
      holds the run (config.toml, tokenizer.json, model.bpk: its adapters alone) and the sha256
      of every file the export wrote; the test imports the base again, exports the run again and
      must write those files, and the run must compute the logits PEFT computed within 1e-4.

expected.json: the token ids of TEXT (the model's own tokenizer) and the logits [len, vocab],
row-major, fp32, eager attention.

Usage (from the repository root, after `cargo build --release`):
    python3 scripts/reference/make_peft_fixtures.py [VARIORUM_BINARY]
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
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

HF = "crates/variorum-train/tests/fixtures/hf"
ROOT = "crates/variorum-train/tests/fixtures/peft"
CORPUS = os.path.join(HF, "export", "corpus.txt")
TEXT = "Shall I compare thee to a summer's day? Thou art more lovely"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def base_model(name):
    return AutoModelForCausalLM.from_pretrained(os.path.join(HF, name), dtype=torch.float32, attn_implementation="eager").eval()


def logits(model, name):
    ids = AutoTokenizer.from_pretrained(os.path.join(HF, name))(TEXT)["input_ids"]
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits[0]
    return {"ids": ids, "vocab": out.shape[-1], "logits": [round(float(x), 7) for x in out.flatten()]}


def write_expected(out, expected):
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")


def from_peft(name, config):
    """An adapter PEFT makes on the transformers model, with random factors, and its logits."""
    out = os.path.join(ROOT, f"{name}_from_peft")
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    model = get_peft_model(base_model(name), config).eval()
    model.save_pretrained(out)
    os.remove(os.path.join(out, "README.md"))  # PEFT's model card template
    write_expected(out, logits(model, name))


def exported(binary, tmp, name, targets):
    """A LoRA run trained here on the imported model, exported, and what PEFT computes with it."""
    out = os.path.join(ROOT, f"{name}_export")
    shutil.rmtree(out, ignore_errors=True)
    base = os.path.join(tmp, f"{name}_base")
    subprocess.run([binary, "import", os.path.join(HF, name), "--out", base], check=True, stdout=subprocess.DEVNULL)
    config = os.path.join(tmp, f"{name}_lora.toml")
    with open(config, "w") as f:
        f.write(
            f'extends = "{os.path.abspath(base)}/config.toml"\n'
            f'[data]\npath = "{os.path.abspath(CORPUS)}"\n'
            "[train]\nsteps = 30\nlr = 0.01\n"
            f"[train.lora]\nrank = 4\nalpha = 8\ntargets = {json.dumps(targets)}\n"
        )
    run = os.path.join(tmp, f"{name}_run")
    subprocess.run([binary, "train", config, "--init-from", base, "--out", run, "--no-progress", "--no-report"],
                   check=True, stdout=subprocess.DEVNULL)
    adapter = os.path.join(tmp, f"{name}_adapter")
    subprocess.run([binary, "export", run, "--format", "hf", "--out", adapter], check=True, stdout=subprocess.DEVNULL)
    os.makedirs(out)
    for f in ["config.toml", "tokenizer.json", "model.bpk"]:
        shutil.copy(os.path.join(run, f), out)
    model = PeftModel.from_pretrained(base_model(name), adapter).eval()
    expected = logits(model, name)
    expected["exported"] = {f: sha256(os.path.join(adapter, f)) for f in sorted(os.listdir(adapter))}
    # the adapter's config names the base by a path of this machine: the test checks the rest
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        expected["adapter_config"] = {k: v for k, v in json.load(f).items() if k != "base_model_name_or_path"}
    del expected["exported"]["adapter_config.json"]
    write_expected(out, expected)


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "release", "variorum")
    torch.set_num_threads(1)
    os.makedirs(ROOT, exist_ok=True)
    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    from_peft("llama", LoraConfig(r=4, lora_alpha=8, target_modules=every, init_lora_weights=False))
    from_peft("gpt2", LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True,
                                 alpha_pattern={"mlp.c_fc": 2.0}, init_lora_weights=False))
    with tempfile.TemporaryDirectory() as tmp:
        exported(binary, tmp, "llama", ["q", "k", "v", "out", "gate", "up", "down"])
        exported(binary, tmp, "gpt2", ["q", "v"])


if __name__ == "__main__":
    main()
