#!/usr/bin/env python3
"""Fixtures for the Decision Transformer against Hugging Face's `DecisionTransformerModel`
(crates/variorum-train/tests/fixtures/hf/decision_transformer/).

A tiny random model (state_dim 5, act_dim 3, hidden 16, 2 layers of 2 heads, ReLU, tanh action
head, max_ep_len 20) with every parameter perturbed, so that the LayerNorms, the biases and the
position row its GPT-2 adds everywhere (`wpe[0]`: DecisionTransformerModel passes position ids
of zero) are not at their initial values. Written with `save_pretrained` (config.json,
model.safetensors). expected.json holds two windows of four steps (states, continuous actions,
returns-to-go, timesteps; attention mask all ones) and the model's predictions: action_preds
[2, 4, 3], state_preds [2, 4, 5] and return_preds [2, 4, 1], fp32, eager attention, eval mode.

Usage (from the repository root): python3 scripts/reference/make_decision_transformer_fixtures.py
(pinned versions: scripts/reference/requirements.txt).
"""

import json
import os

import torch
from transformers import DecisionTransformerConfig, DecisionTransformerModel

OUT = "crates/variorum-train/tests/fixtures/hf/decision_transformer"


def main():
    torch.manual_seed(0)
    config = DecisionTransformerConfig(
        state_dim=5,
        act_dim=3,
        hidden_size=16,
        max_ep_len=20,
        n_layer=2,
        n_head=2,
        n_positions=64,
        activation_function="relu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        action_tanh=True,
        attn_implementation="eager",
    )
    model = DecisionTransformerModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    b, steps = 2, 4
    states = torch.randn(b, steps, 5)
    actions = torch.rand(b, steps, 3) * 2 - 1
    returns_to_go = torch.randn(b, steps, 1) * 3
    timesteps = torch.randint(0, 20, (b, steps))
    with torch.no_grad():
        out = model(
            states=states,
            actions=actions,
            returns_to_go=returns_to_go,
            timesteps=timesteps,
            attention_mask=torch.ones(b, steps, dtype=torch.long),
            return_dict=True,
        )
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT)
    flat = lambda t: [float(x) for x in t.reshape(-1).tolist()]
    expected = {
        "batch": b,
        "steps": steps,
        "states": flat(states),
        "actions": flat(actions),
        "returns_to_go": flat(returns_to_go),
        "timesteps": [int(x) for x in timesteps.reshape(-1).tolist()],
        "action_preds": flat(out.action_preds),
        "state_preds": flat(out.state_preds),
        "return_preds": flat(out.return_preds),
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)
    print("written to", OUT)


if __name__ == "__main__":
    main()
