#!/usr/bin/env python3
"""Fixtures for `variorum import`: tiny random Hugging Face models and what transformers computes
with them (crates/variorum-train/tests/fixtures/hf/<architecture>/).

Each fixture directory is what `save_pretrained` writes (config.json, the safetensors weights,
tokenizer.json, tokenizer_config.json), plus expected.json: the text, its token ids as the
tokenizer gives them, the log-probability transformers gives every token after the first
(fp32, eager attention), and the 32 tokens its greedy `generate` appends to a prompt (with the
KV cache). The tests read them without Python.

The models are 16 wide, 2 layers, and stored in bf16 (Mistral in f16, GPT-2 in f32), so that
the twelve fit in a few hundred KiB. The weights are random and widened (matrices x12, norms
and biases jittered) so that the log-probabilities are far from uniform and a wrong mapping
shows. GPT-2 is stored in shards (an index and three files); LLaMA untied, with grouped-query
heads; OPT with its offset position table and BOS; Qwen2 with q/k/v biases, grouped-query heads,
tied, θ = 10⁶; GPT-NeoX with parallel branches and rotary on half of each head; Mistral with one
K/V head; Phi with one norm shared by its parallel branches, grouped-query heads and a head
bias; GPT-J with rotary on adjacent pairs of 2 of each head's 4 dimensions; BLOOM with ALiBi
over 6 heads and an embedding LayerNorm. The masked models, BERT (WordPiece, two token types),
RoBERTa (byte-level BPE, the position table offset past the padding id) and FNet (Fourier
mixing, an embedding projection, tanh GELU), record instead the
log-probability every position gives its own token with every fourth token hidden behind the
mask token, and the encoder's last hidden state. Nyströmformer is BERT's with 4 landmarks over
the text's 24 tokens (transformers' segment length), the authors' pseudo-inverse and a
depthwise conv of width 5 on V. The expectations come from each saved
directory loaded back with `from_pretrained` in f32 (bf16 values widen exactly), as a user
would load it.

T5 (v1.0: ReLU, tied and scaled head, d_kv 6 × 4 heads ≠ d_model, 3 encoder and 2 decoder
blocks, 8 buckets to distance 20; v1.1: gated tanh-GELU, a head of its own) is scored as
transformers trains it: the source with its `</s>`, the target after the decoder's start token
`<pad>`, each target token and the `</s>` after it; its greedy decode of the source, 32 tokens.
Its tokenizer is a Unigram model with Metaspace pieces, as T5's tokenizer.json.

Usage: python3 scripts/reference/make_hf_fixtures.py [OUT_DIR [NAME...]]  (NAME: gpt2 llama opt qwen2 gpt_neox mistral phi gptj bloom bert roberta fnet nystromformer deberta_v2 longformer big_bird reformer t5 t5_v1_1)
(pinned versions: scripts/reference/requirements.txt plus transformers, below).
"""

import json
import os
import re
import sys
from collections import Counter

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PINNED = "5.24.0"
assert transformers.__version__ == PINNED, f"transformers {transformers.__version__}, the fixtures pin {PINNED}"

# The text the tokenizers are trained on and the models scored on (Sonnet 18 and a line of Hamlet).
CORPUS = """Shall I compare thee to a summer's day?
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
To be, or not to be, that is the question.
"""
TEXT = "Shall I compare thee to a summer's day? Thou art more lovely, and so long lives this."
PROMPT = "So long as men"
# BigBird's: long enough for its block-sparse attention, an odd number of tokens
BIG_BIRD_TEXT = TEXT + " Rough winds do shake the buds."
GREEDY_TOKENS = 32


def byte_level_bpe(vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    return tok


def widen(model, seed, factor=12.0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(factor)
            elif "norm" in name or "ln" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def expectations(model, tokenizer, text=TEXT, prompt_text=PROMPT):
    """What transformers computes with `model`: the ids of `text`, every token's log-probability
    after the first, and the greedy continuation of `prompt_text` through the KV cache."""
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        scored = [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]
        prompt = tokenizer(prompt_text)["input_ids"]
        prompt_tensor = torch.tensor([prompt])
        # plain greedy decoding, as variorum's: no end-of-text stop, and no min_new_tokens, which
        # would suppress the end-of-text token where it is the argmax
        model.generation_config.eos_token_id = None
        out = model.generate(
            prompt_tensor,
            # explicit: inferred from pad_token_id it would mask LLaMA's BOS (id 0) out
            attention_mask=torch.ones_like(prompt_tensor),
            max_new_tokens=GREEDY_TOKENS,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )[0].tolist()
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "text": text,
        "ids": ids,
        "logprobs": scored,
        "prompt": prompt_text,
        "prompt_ids": prompt,
        "greedy": out[len(prompt):],
    }


def save(out, name, model, tokenizer, **save_args):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    model.save_pretrained(d, **save_args)
    tokenizer.save_pretrained(d)
    return d


def made(out, name, cls, cfg, tokenizer, seed, dtype=None, **save_args):
    """A tiny random `cls` of `cfg` (seeded, eager attention, widened), saved as fixture `name`
    (in `dtype` if given), and what transformers computes with the saved directory loaded back
    in f32 — as a user loads it: a model cast to bf16 and back would keep its rotary
    frequencies, a buffer, rounded to bf16 (1.4e-2 off), whereas loading computes them afresh."""
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.config._attn_implementation = "eager"
    widen(model, seed)
    d = save(out, name, model if dtype is None else model.to(dtype), tokenizer, **save_args)
    reloaded = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return d, expectations(reloaded.eval(), tokenizer)


def gpt2(out):
    tok = byte_level_bpe(320, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    cfg = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        n_embd=16,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return made(out, "gpt2", transformers.GPT2LMHeadModel, cfg, tokenizer, seed=1, max_shard_size="20KB")


def llama(out):
    tok = byte_level_bpe(300, ["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=44,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    return made(out, "llama", transformers.LlamaForCausalLM, cfg, tokenizer, seed=2, dtype=torch.bfloat16)


def opt(out):
    tok = byte_level_bpe(300, ["<s>", "<pad>", "</s>", "<unk>"])
    # OPT's tokenizer starts every text with </s> (id 2)
    tok.post_processor = processors.TemplateProcessing(single="</s> $A", pair="</s> $A </s> $B", special_tokens=[("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="</s>", eos_token="</s>", pad_token="<pad>")
    cfg = transformers.OPTConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=2,
        ffn_dim=40,
        max_position_embeddings=64,
        num_attention_heads=4,
        word_embed_proj_dim=16,
        dropout=0.0,
        activation_function="relu",
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
    )
    return made(out, "opt", transformers.OPTForCausalLM, cfg, tokenizer, seed=3, dtype=torch.bfloat16)


def qwen2(out):
    tok = byte_level_bpe(300, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    cfg = transformers.Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=36,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=0,
    )
    return made(out, "qwen2", transformers.Qwen2ForCausalLM, cfg, tokenizer, seed=4, dtype=torch.bfloat16)


def gpt_neox(out):
    tok = byte_level_bpe(300, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    cfg = transformers.GPTNeoXConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_act="gelu",
        max_position_embeddings=128,
        layer_norm_eps=1e-5,
        use_parallel_residual=True,
        # transformers 5 reads the rotary settings from here only (a partial_rotary_factor
        # keyword beside it is stored but not used)
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"},
        attention_bias=True,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return made(out, "gpt_neox", transformers.GPTNeoXForCausalLM, cfg, tokenizer, seed=5, dtype=torch.bfloat16)


def mistral(out):
    tok = byte_level_bpe(300, ["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    cfg = transformers.MistralConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        # a window wider than the text: within it sliding-window attention is full attention
        max_position_embeddings=256,
        sliding_window=96,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    return made(out, "mistral", transformers.MistralForCausalLM, cfg, tokenizer, seed=6, dtype=torch.float16)


def phi(out):
    tok = byte_level_bpe(300, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    cfg = transformers.PhiConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        layer_norm_eps=1e-5,
        hidden_act="gelu_new",
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"},
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return made(out, "phi", transformers.PhiForCausalLM, cfg, tokenizer, seed=7, dtype=torch.bfloat16)


def gptj(out):
    tok = byte_level_bpe(300, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    cfg = transformers.GPTJConfig(
        vocab_size=tok.get_vocab_size(),
        n_positions=128,
        n_embd=16,
        n_layer=2,
        n_head=4,
        rotary_dim=2,
        n_inner=36,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return made(out, "gptj", transformers.GPTJForCausalLM, cfg, tokenizer, seed=8, dtype=torch.bfloat16)


def bloom(out):
    tok = byte_level_bpe(300, ["<unk>", "<s>", "</s>", "<pad>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    # six heads: ALiBi's slopes for a head count that is not a power of two
    cfg = transformers.BloomConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=24,
        n_layer=2,
        n_head=6,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    return made(out, "bloom", transformers.BloomForCausalLM, cfg, tokenizer, seed=9, dtype=torch.bfloat16)


def masked_expectations(model, tokenizer, mask_id, text=TEXT):
    """What transformers computes with a masked LM: the ids of `text`, the same with every
    fourth token after the first replaced by the mask token, the log-probability each position
    gives the original token, and the last hidden state (the encoder's output) at every position."""
    ids = tokenizer(text)["input_ids"]
    # the first and last are [CLS]/<s> and [SEP]/</s>
    masked = [mask_id if 0 < i < len(ids) - 1 and i % 4 == 1 else t for i, t in enumerate(ids)]
    with torch.no_grad():
        out = model(torch.tensor([masked]), output_hidden_states=True)
        logprobs = torch.log_softmax(out.logits[0].double(), dim=-1)
        scored = [logprobs[i, ids[i]].item() for i in range(len(ids))]
        # nine significant digits: far below the tests' 1e-4, and half the file
        hidden = [[float(f"{v:.9g}") for v in row] for row in out.hidden_states[-1][0].double().tolist()]
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "text": text,
        "ids": ids,
        "masked_ids": masked,
        "mask_id": mask_id,
        "logprobs": scored,
        "hidden": hidden,
    }


def made_masked(out, name, cls, cfg, tokenizer, seed, mask_token, dtype=None):
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.config._attn_implementation = "eager"
    widen(model, seed)
    d = save(out, name, model if dtype is None else model.to(dtype), tokenizer)
    reloaded = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return d, masked_expectations(reloaded.eval(), tokenizer, tokenizer.convert_tokens_to_ids(mask_token))


def wordpiece():
    """A WordPiece tokenizer over the corpus, BERT's way: [CLS] text [SEP]. Its vocabulary is
    built here rather than by the tokenizers trainer, which breaks ties differently from run to
    run: the specials, every character alone and as a continuation, then the corpus's words of
    two or more characters by falling count (ties alphabetical)."""
    words = re.findall(r"\w+|[^\w\s]", CORPUS.lower())
    chars = sorted(set("".join(words)))
    counts = Counter(w for w in words if len(w) > 1)
    common = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:150]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + chars + ["##" + c for c in chars] + common
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]"
    )
    return tok, tokenizer


# The masked models' sizes (BERT's names): 16 wide, 2 layers of 4 heads, an FFN 32 wide.
BERT_TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32)


def bert(out):
    tok, tokenizer = wordpiece()
    cfg = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        hidden_act="gelu",
        max_position_embeddings=64,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )
    return made_masked(out, "bert", transformers.BertForMaskedLM, cfg, tokenizer, seed=10, mask_token="[MASK]", dtype=torch.bfloat16)


def roberta_tokenizer():
    """RoBERTa's byte-level BPE: <s> text </s>, and its <mask>."""
    tok = byte_level_bpe(300, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>"
    )
    return tok, tokenizer


def roberta(out):
    tok, tokenizer = roberta_tokenizer()
    cfg = transformers.RobertaConfig(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        max_position_embeddings=66,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    return made_masked(out, "roberta", transformers.RobertaForMaskedLM, cfg, tokenizer, seed=11, mask_token="<mask>", dtype=torch.bfloat16)


def fnet(out):
    tok, tokenizer = wordpiece()
    cfg = transformers.FNetConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=2,
        intermediate_size=32,
        hidden_act="gelu_new",
        max_position_embeddings=64,
        type_vocab_size=4,
        layer_norm_eps=1e-12,
        use_tpu_fourier_optimizations=False,
        pad_token_id=0,
    )
    return made_masked(out, "fnet", transformers.FNetForMaskedLM, cfg, tokenizer, seed=12, mask_token="[MASK]", dtype=torch.bfloat16)


def nystromformer(out):
    tok, tokenizer = wordpiece()
    # transformers computes the approximation for inputs of exactly segment_means_seq_len
    # tokens: the text's 24, in 4 landmarks of 6; a depthwise conv of width 5 on V
    cfg = transformers.NystromformerConfig(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        hidden_act="gelu_new",
        max_position_embeddings=64,
        type_vocab_size=2,
        segment_means_seq_len=len(tokenizer(TEXT)["input_ids"]),
        num_landmarks=4,
        conv_kernel_size=5,
        layer_norm_eps=1e-5,
        pad_token_id=0,
    )
    return made_masked(
        out, "nystromformer", transformers.NystromformerForMaskedLM, cfg, tokenizer, seed=15, mask_token="[MASK]", dtype=torch.bfloat16
    )


def deberta_v2(out):
    tok, tokenizer = wordpiece()
    # DeBERTa v3's settings: no absolute positions, log buckets (8 rows each way, exact within
    # 4, reaching the last at 19: the text's 24 tokens reach past it), the relative embeddings
    # normed and read through the content projections (share_att_key); the original head
    # (`legacy = False`: lm_predictions, always tied)
    cfg = transformers.DebertaV2Config(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        hidden_act="gelu",
        max_position_embeddings=64,
        type_vocab_size=0,
        relative_attention=True,
        position_biased_input=False,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        max_relative_positions=20,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        layer_norm_eps=1e-7,
        legacy=False,
        pad_token_id=0,
    )
    return made_masked(
        out, "deberta_v2", transformers.DebertaV2ForMaskedLM, cfg, tokenizer, seed=16, mask_token="[MASK]", dtype=torch.bfloat16
    )


def longformer(out):
    tok, tokenizer = roberta_tokenizer()
    # RoBERTa's embeddings; a window of 8 (4 each way) in the first layer, 16 in the second: the
    # text's 59 tokens span several windows (transformers pads them to a multiple of 16)
    cfg = transformers.LongformerConfig(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        max_position_embeddings=66,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        attention_window=[8, 16],
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        sep_token_id=2,
    )
    d, expected = made_masked(
        out, "longformer", transformers.LongformerForMaskedLM, cfg, tokenizer, seed=17, mask_token="<mask>", dtype=torch.bfloat16
    )
    # and with global attention on <s> (what transformers' classification heads give it): the
    # global projections at work
    model = transformers.LongformerForMaskedLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    masked = torch.tensor([expected["masked_ids"]])
    global_mask = torch.zeros_like(masked)
    global_mask[0, 0] = 1
    with torch.no_grad():
        result = model(masked, global_attention_mask=global_mask, output_hidden_states=True)
        logprobs = torch.log_softmax(result.logits[0].double(), dim=-1)
    ids = expected["ids"]
    expected["global_positions"] = [0]
    expected["global_logprobs"] = [logprobs[i, ids[i]].item() for i in range(len(ids))]
    expected["global_hidden"] = [[float(f"{v:.9g}") for v in row] for row in result.hidden_states[-1][0].double().tolist()]
    return d, expected


def big_bird(out):
    tok, tokenizer = wordpiece()
    # block-sparse attention in blocks of 2 with 2 random blocks: transformers computes it for
    # texts longer than (5 + 2·2)·2 = 18 tokens (the text's 31, padded to 32: the last block
    # half padding) and full attention up to that; in eval mode its random blocks are all block
    # 0. The embeddings rescaled by √d.
    cfg = transformers.BigBirdConfig(
        vocab_size=tok.get_vocab_size(),
        **BERT_TINY,
        hidden_act="gelu_new",
        max_position_embeddings=64,
        type_vocab_size=2,
        attention_type="block_sparse",
        block_size=2,
        num_random_blocks=2,
        rescale_embeddings=True,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        sep_token_id=3,
    )
    torch.manual_seed(18)
    model = transformers.BigBirdForMaskedLM(cfg).eval()
    widen(model, 18)
    d = save(out, "big_bird", model.to(torch.bfloat16), tokenizer)
    mask_id = tokenizer.convert_tokens_to_ids("[MASK]")
    load = lambda: transformers.BigBirdForMaskedLM.from_pretrained(d, dtype=torch.float32).eval()
    expected = masked_expectations(load(), tokenizer, mask_id, text=BIG_BIRD_TEXT)
    # a text of at most 18 tokens, on a model loaded afresh (transformers switches a model to
    # full attention for good once it sees one)
    expected["short"] = masked_expectations(load(), tokenizer, mask_id, text=PROMPT)
    return d, expected


def reformer(out):
    tok, tokenizer = roberta_tokenizer()
    # Local and LSH layers in turn, chunks of 4 and 8: the text's 59 tokens are padded to 64
    # (a multiple of both), the padding hashed into a bucket of its own; local chunks see one
    # chunk each way, wrapping around; 4 buckets, 2 rounds. Axial positions on an 8 × 8 grid.
    # The rotations come from `hash_seed` (transformers seeds torch before every draw, so every
    # LSH layer draws the same): recorded here for the test to hand to variorum.
    cfg = transformers.ReformerConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        num_attention_heads=2,
        attention_head_size=8,
        attn_layers=["local", "lsh", "local", "lsh"],
        feed_forward_size=32,
        hidden_act="relu",
        axial_pos_embds=True,
        axial_pos_shape=[8, 8],
        axial_pos_embds_dim=[6, 10],
        max_position_embeddings=64,
        local_attn_chunk_length=4,
        local_num_chunks_before=1,
        local_num_chunks_after=1,
        lsh_attn_chunk_length=8,
        lsh_num_chunks_before=1,
        lsh_num_chunks_after=0,
        num_buckets=4,
        num_hashes=2,
        hash_seed=7,
        is_decoder=False,
        hidden_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        lsh_attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
        pad_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    d, expected = made_masked(
        out, "reformer", transformers.ReformerForMaskedLM, cfg, tokenizer, seed=19, mask_token="<mask>", dtype=torch.bfloat16
    )
    model = transformers.ReformerForMaskedLM.from_pretrained(d, dtype=torch.float32).eval()
    expected["hidden"] = reformer_encoder_output(model, expected["masked_ids"])
    expected["rotations"] = reformer_rotations(cfg)
    # 6 tokens: padded to 8, local chunks of 4 wrapping, LSH layers attending in full
    short = masked_expectations(model, tokenizer, tokenizer.convert_tokens_to_ids("<mask>"), text="So long")
    short["hidden"] = reformer_encoder_output(model, short["masked_ids"])
    expected["short"] = short
    return d, expected


def reformer_encoder_output(model, masked):
    """A Reformer's encoder output: both streams, after the final LayerNorm, without the padding
    (its `hidden_states` are one stream before the LayerNorm, padded)."""
    with torch.no_grad():
        hidden = model.reformer(torch.tensor([masked])).last_hidden_state[0]
    return [[float(f"{v:.9g}") for v in row] for row in hidden.double().tolist()]


def reformer_rotations(cfg):
    """The rotations every LSH layer of a Reformer with `hash_seed` draws: transformers seeds torch
    with it before each draw, [heads, head_dim, rounds, buckets / 2]."""
    torch.manual_seed(cfg.hash_seed)
    shape = (cfg.num_attention_heads, cfg.attention_head_size, cfg.num_hashes, cfg.num_buckets // 2)
    return torch.randn(shape).tolist()


def unigram():
    """A SentencePiece-style Unigram tokenizer as T5's tokenizer.json is: Metaspace pieces, `</s>`
    appended to every text. Its vocabulary is written here (no trainer, so it is the same every
    run): `<pad>`, `</s>`, `<unk>`, the pieces `▁` and every character, then the corpus's words
    (with `▁` before them) by falling count, ties alphabetical; scores favour longer pieces."""
    words = CORPUS.split()
    chars = sorted(set("".join(words)))
    counts = Counter("\u2581" + w for w in words)
    common = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:120]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    pieces += [(c, -6.0) for c in chars] + [(w, -2.0 - 0.01 * i) for i, w in enumerate(common)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    return tok, tokenizer


WIDEN_T5 = float(os.environ.get("WIDEN_T5", "1.5"))
SOURCE = "Shall I compare thee to a summer's day?"
TARGET = "Thou art more lovely and more temperate: so long lives this."


def seq2seq_expectations(model, tokenizer):
    """What transformers computes with an encoder–decoder: the source's ids (with the `</s>` its
    tokenizer appends), the target's (without), the log-probability of every target token and of
    the `</s>` after it (the decoder reading `decoder_start_token_id` first), and the 32 tokens
    its greedy `generate` writes for the source (end-of-text not stopping it)."""
    source = tokenizer(SOURCE)["input_ids"]
    target = tokenizer(TARGET, add_special_tokens=False)["input_ids"]
    labels = target + [model.config.eos_token_id]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]), labels=torch.tensor([labels])).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        scored = [logprobs[i, t].item() for i, t in enumerate(labels)]
        model.generation_config.eos_token_id = None
        out = model.generate(
            torch.tensor([source]),
            attention_mask=torch.ones(1, len(source), dtype=torch.long),
            max_new_tokens=GREEDY_TOKENS,
            do_sample=False,
            use_cache=True,
        )[0].tolist()
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "source": SOURCE,
        "source_ids": source,
        "target": TARGET,
        "target_ids": target,
        "logprobs": scored,
        # without the decoder's start token
        "greedy": out[1:],
    }


def made_seq2seq(out, name, cfg, tokenizer, seed, untie=False):
    """As `made`, for T5, whose initialisation is already wide (the embedding N(0, 1), the
    projections scaled to their fan-in): matrices widened by WIDEN_T5 only."""
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    model.config._attn_implementation = "eager"
    widen(model, seed, WIDEN_T5)
    if untie:
        # v1.1's head of its own (transformers 5 keeps it apart when it differs)
        model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape))
    d = save(out, name, model.to(torch.bfloat16), tokenizer)
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return d, seq2seq_expectations(reloaded.eval(), tokenizer)


def t5(out):
    tok, tokenizer = unigram()
    # v1.0: ReLU, the head tied and the decoder's output scaled; heads of 6 (24 wide, not 16),
    # three encoder blocks and two decoder blocks, the buckets few enough that distances past
    # the exact ones are hashed
    cfg = transformers.T5Config(
        vocab_size=tok.get_vocab_size() + 3,
        d_model=16,
        d_kv=6,
        d_ff=40,
        num_layers=3,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        feed_forward_proj="relu",
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return made_seq2seq(out, "t5", cfg, tokenizer, seed=13)


def t5_v1_1(out):
    tok, tokenizer = unigram()
    cfg = transformers.T5Config(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        d_kv=4,
        d_ff=24,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return made_seq2seq(out, "t5_v1_1", cfg, tokenizer, seed=14, untie=True)


MAKERS = {
    "gpt2": gpt2,
    "llama": llama,
    "opt": opt,
    "qwen2": qwen2,
    "gpt_neox": gpt_neox,
    "mistral": mistral,
    "phi": phi,
    "gptj": gptj,
    "bloom": bloom,
    "bert": bert,
    "roberta": roberta,
    "fnet": fnet,
    "nystromformer": nystromformer,
    "deberta_v2": deberta_v2,
    "longformer": longformer,
    "big_bird": big_bird,
    "reformer": reformer,
    "t5": t5,
    "t5_v1_1": t5_v1_1,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "crates/variorum-train/tests/fixtures/hf"
    names = sys.argv[2:] or list(MAKERS)
    torch.set_num_threads(1)
    for make in (MAKERS[n] for n in names):
        d, expected = make(out)
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
            f.write("\n")
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        n = len(expected.get("ids", expected.get("target_ids", [])))
        print(f"{d}: {n} tokens, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
