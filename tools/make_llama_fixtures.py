#!/usr/bin/env python3
"""Dev-time generator of the small Hugging Face parity fixtures in tests/fixtures/llama/
and the safetensors format fixture in tests/fixtures/safetensors/. qlm never runs Python;
this script only produces the committed reference files (see tests/fixtures/README.md).

Usage (from the repository root):  python3 tools/make_llama_fixtures.py [--out tests/fixtures] [--only NAME ...]
Needs torch, transformers, safetensors, numpy. Runs on the CPU in float32 with fixed seeds.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig,
                          LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

N_NEW = 64
PROMPT_LEN = 12
MIN_MARGIN = 0.02
MIN_DISTINCT = 16

FIXTURES = {
    # MHA, untied lm_head, mlp/attention without bias.
    "mha_untied": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=1001,
        cfg=dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=384, max_position_embeddings=256, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    # GQA 8 query heads / 2 kv heads, tied embeddings (only model.embed_tokens.weight is stored).
    "gqa_tied": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=2002,
        cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                 rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
    # Qwen2: q/k/v bias, no o_proj bias, GQA 4/2, untied.
    "qwen2_bias": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM), seed=3003,
        cfg=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=448, max_position_embeddings=256, rms_norm_eps=1e-6,
                 rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3])),
    # Llama 3 RoPE scaling, rope_theta 500000, head_dim 32 != hidden/heads (16), 3 layers.
    # original_max_position_embeddings is small so that the scaling changes most frequencies.
    "llama3_rope": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=4004,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=256,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                 rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=32, rope_theta=500000.0),
                 rope_theta=500000.0)),
    # Qwen3: per-head q/k RMSNorm, head_dim 24 != hidden/heads, GQA 6/2 (ratio 3), tied; layers from
    # max_window_layers (1) on attend over a window of 8, shorter than the 12-token prompt.
    "qwen3_window": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM), seed=5005,
        cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=24, vocab_size=352, max_position_embeddings=256,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                 use_sliding_window=True, sliding_window=8, max_window_layers=1,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen3, second shape: attention biases (q/k/v/o), GQA 8/2, untied, no window, theta 1e4.
    "qwen3_bias_untied": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM), seed=15015,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=256,
                 rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, attention_bias=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Mistral: every layer over a window of 10, GQA 8/2, untied.
    "mistral_window": dict(
        cls=(MistralConfig, MistralForCausalLM), seed=6006,
        cfg=dict(hidden_size=64, intermediate_size=144, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=288, max_position_embeddings=256, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, sliding_window=10,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Exact GELU MLP with linear RoPE scaling (position interpolation, factor 4).
    "gelu_linear_rope": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=7007,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, hidden_act="gelu",
                 rope_parameters=dict(rope_type="linear", factor=4.0, rope_theta=10000.0))),
    # YaRN RoPE (factor 8 over an original context of 16: every ramp region in use, attention factor
    # from the factor), tanh GELU, attention and MLP biases.
    "yarn_gelu_tanh_bias": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=8008,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-6,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, hidden_act="gelu_pytorch_tanh",
                 attention_bias=True, mlp_bias=True,
                 rope_parameters=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=16,
                                      beta_fast=8.0, beta_slow=1.0, rope_theta=10000.0))),
    # Gemma 2: (1 + w) norms before and after each block, embedding x sqrt(64), query scale
    # 24^-0.5, attention scores capped at 5 and logits at 8 (small enough to bind), windowed layers
    # 0 and 2 (window 8). Untied: tied, the scaled input embedding outvotes everything else at
    # these sizes and the continuation repeats one token.
    "gemma2_softcap": dict(
        cls=(Gemma2Config, Gemma2ForCausalLM), seed=9009, norm_offset=True, embed_std=0.3 / 8,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=24, sliding_window=8,
                 tie_word_embeddings=False,
                 attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Gemma 3 (text): q/k norms with (1 + w), global layer every 3rd (layer 2) with linear RoPE
    # scaling on theta 1e6, local layers on theta 1e4 over a window of 6, no caps, untied.
    "gemma3_local_rope": dict(
        cls=(Gemma3TextConfig, Gemma3ForCausalLM), seed=10010, norm_offset=True, embed_std=0.3 / 8,
        cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=32, vocab_size=288, max_position_embeddings=256, rms_norm_eps=1e-6,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=32, sliding_window=6,
                 sliding_window_pattern=3, tie_word_embeddings=False,
                 rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                                  "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    # Phi-3: q/k/v in one qkv_proj and gate/up in one gate_up_proj, every layer over a window of 9.
    "phi3_fused": dict(
        cls=(Phi3Config, Phi3ForCausalLM), seed=11011,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, original_max_position_embeddings=256,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 sliding_window=9, rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Phi-3 longrope: the short factors while every position of a call stays within
    # original_max_position_embeddings (128 here: always), the long ones past it (8: always, the
    # 12-token prompt already reaches past it); attention factor sqrt(1 + ln(factor) / ln(orig)),
    # factor max/orig (4) or as given (2).
    "phi3_longrope_short": dict(
        cls=(Phi3Config, Phi3ForCausalLM), seed=13013,
        cfg=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=256, max_position_embeddings=512,
                 original_max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0,
                 rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                      short_factor=[1.0, 1.1, 1.3, 1.7, 2.2, 3.0, 4.1, 5.5],
                                      long_factor=[1.2, 1.9, 2.7, 4.4, 6.0, 9.5, 14.0, 21.0]))),
    "phi3_longrope_long": dict(
        cls=(Phi3Config, Phi3ForCausalLM), seed=14014,
        cfg=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=256, max_position_embeddings=80,
                 original_max_position_embeddings=8, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0,
                 rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                      short_factor=[1.0, 1.1, 1.3, 1.7, 2.2, 3.0, 4.1, 5.5],
                                      long_factor=[1.0, 1.2, 1.5, 2.1, 2.9, 4.0, 5.6, 8.0], factor=2.0))),
    # Qwen2 with use_sliding_window: layers from max_window_layers (1) on over a window of 8, GQA 4/2, tied.
    "qwen2_window": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM), seed=16016,
        cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                 use_sliding_window=True, sliding_window=8, max_window_layers=1,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Mistral, MQA (1 kv head), tied, head_dim 32 != hidden/heads; window 40 binds from position 40 (greedy step 29).
    "mistral_mqa_tied": dict(
        cls=(MistralConfig, MistralForCausalLM), seed=17017,
        cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=32, vocab_size=288, max_position_embeddings=256, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, sliding_window=40,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Gemma 2, tied, MQA, layers 0 and 2 over a window of 16, the default caps (scores 50, logits 30).
    # Tied, the x8 input embedding makes every continuation repeat one token unless the blocks outweigh
    # it: norm weights drawn as for the other models (no norm_offset, so x 1.7..2.3), and
    # query_pre_attn_scalar 256 (Gemma's default) so that the attention is not so sharp that BF16 drifts.
    "gemma2_tied_mqa": dict(
        cls=(Gemma2Config, Gemma2ForCausalLM), seed=18018, embed_std=0.12,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=16, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=256, sliding_window=16,
                 tie_word_embeddings=True,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Gemma 3 (text), tied (norms and query scale as gemma2_tied_mqa), GQA 4/2, layers 1 and 3 global,
    # the others over a window of 5, default RoPE on both; logits capped at 10 (max |logit| 12 uncapped).
    # transformers' Gemma 3 ignores attn_logit_softcapping (5 here): its attention scores stay uncapped.
    "gemma3_tied_softcap": dict(
        cls=(Gemma3TextConfig, Gemma3ForCausalLM), seed=19019, embed_std=0.15,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=256, sliding_window=5,
                 sliding_window_pattern=2, tie_word_embeddings=True,
                 attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                 rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1000000.0),
                                  "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    # Phi-3, GQA 8/2 (head_dim 8) through the fused qkv_proj, tied, no window.
    "phi3_gqa_tied": dict(
        cls=(Phi3Config, Phi3ForCausalLM), seed=20020,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, original_max_position_embeddings=256,
                 rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 sliding_window=None, rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Dynamic NTK RoPE (factor 2) past max_position_embeddings 32, GQA 4/2. Stateful in transformers:
    # greedy ids and margins come from generate() (see stateful_rope in make_fixture).
    "dynamic_ntk": dict(
        cls=(LlamaConfig, LlamaForCausalLM), seed=21021, stateful_rope=True,
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=32, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                 rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0))),
}


def init_weights(model, seed, norm_offset=False, embed_std=None):
    """Non-trivial random init so that logits are spread out and greedy choices are clear. Norms
    scale by 0.7..1.3 (Gemma's (1 + w): w in -0.3..0.3); embed_std: the embedding's own spread
    (Gemma multiplies it by sqrt(hidden_size))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((-0.3 if norm_offset else 0.7) + 0.6 * torch.rand(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name and embed_std is not None:
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name == "lm_head.weight":
                # Small enough that a tied model's logits are not dominated by the input token.
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def full_forward_greedy(model, prompt, n_new):
    """Greedy continuation by full re-evaluation (no cache), with the top1-top2 margin of every step."""
    ids = list(prompt)
    margins = []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def generate_greedy(model, prompt, n_new):
    """Greedy continuation by generate() (KV cache), with the top1-top2 margin of every step from its scores."""
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=n_new, eos_token_id=None, pad_token_id=0,
                               bos_token_id=1, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=gen_cfg)
    tops = [torch.topk(step[0], 2).values for step in out.scores]
    return [int(x) for x in out.sequences[0, len(prompt):]], [float(t[0] - t[1]) for t in tops]


def tensor_summary(model_dir):
    from safetensors.numpy import load_file
    out = {}
    for name, a in sorted(load_file(os.path.join(model_dir, "model.safetensors")).items()):
        a64 = a.astype(np.float64)
        out[name] = {"dtype": str(a.dtype), "shape": list(a.shape), "sum": float(a64.sum()),
                     "abs_sum": float(np.abs(a64).sum()), "first": [float(x) for x in a.reshape(-1)[:4]]}
    return out


def build(spec, seed):
    """Model, prompt, greedy ids and step margins for one seed."""
    cfg_cls, model_cls = spec["cls"]
    torch.manual_seed(seed)
    config = cfg_cls(**spec["cfg"])
    model = model_cls(config).float().eval()
    init_weights(model, seed, spec.get("norm_offset", False), spec.get("embed_std"))
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    rng = np.random.default_rng(seed)
    prompt = [1] + [int(x) for x in rng.integers(3, config.vocab_size, PROMPT_LEN - 1)]
    # stateful_rope (dynamic NTK): transformers rescales RoPE from the longest position of each call, and cached
    # keys keep their rotation, so only generate() itself gives its greedy path; full re-evaluation differs.
    greedy_fn = generate_greedy if spec.get("stateful_rope") else full_forward_greedy
    greedy, margins = greedy_fn(model, prompt, N_NEW)
    return model, config, prompt, greedy, margins


def make_fixture(name, spec, root):
    # The first seed from spec["seed"] on whose greedy path no step is a near-tie (margin
    # >= MIN_MARGIN), that does not collapse into repeating a few tokens, and that never
    # produces an end-of-sequence id.
    for seed in range(spec["seed"], spec["seed"] + 100):
        model, config, prompt, ref_greedy, margins = build(spec, seed)
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        # generate() stops at an end-of-sequence id, the full-forward continuation does not.
        if min(margins) >= MIN_MARGIN and len(set(ref_greedy)) >= MIN_DISTINCT and not set(eos) & set(ref_greedy):
            break
    else:
        sys.exit(f"{name}: no seed without near-ties")
    model_cls = spec["cls"][1]
    stateful = spec.get("stateful_rope", False)
    greedy = ref_greedy if stateful else generate_greedy(model, prompt, N_NEW)[0]
    if greedy != ref_greedy:
        sys.exit(f"{name}: generate() and full-forward greedy disagree")
    seq = prompt + greedy
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float().numpy()
        prompt_logits = model(torch.tensor([prompt])).logits[0].float().numpy()
    # Logits of the prompt positions do not depend on what follows (causal mask), unless the RoPE
    # of the whole pass depends on its length.
    assert stateful or np.allclose(logits[: len(prompt)], prompt_logits, atol=1e-5)
    top2 = np.sort(logits, axis=1)[:, -2:]
    pos_margins = top2[:, 1] - top2[:, 0]

    d = os.path.join(root, "llama", name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    gen_path = os.path.join(d, "generation_config.json")
    if os.path.exists(gen_path):
        os.remove(gen_path)  # not needed; keeps the fixture to config + weights + references
    logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    ref = {
        "model_class": model_cls.__name__,
        "seed": seed,
        "tokens": seq,
        "prompt_len": len(prompt),
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "logits_file": "logits.f32",
        "logits_shape": [len(seq), config.vocab_size],
        "logits_max_abs": float(np.abs(logits).max()),
        "logits_mean_abs": float(np.abs(logits).mean()),
        "min_greedy_margin": float(min(margins)),
        "min_position_margin": float(pos_margins.min()),
        **({"greedy_from": "generate"} if stateful else {}),
        "tensors": tensor_summary(d),
        "versions": versions(),
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {size} bytes, logits max|.| {ref['logits_max_abs']:.3f} mean|.| {ref['logits_mean_abs']:.3f}, "
          f"min greedy margin {ref['min_greedy_margin']:.4f}, min position margin {ref['min_position_margin']:.4f}, "
          f"{len(set(greedy))} distinct greedy ids, seed {seed}")


# A long prompt through a short window: Mistral, 4,096 prompt tokens, window 512. Only the last
# prompt position's logits and those of each greedy step are kept (the whole [4112, vocab] matrix
# would be 4 MB).
LONG = dict(name="mistral_long_window", seed=12012, prompt_len=4096, n_new=16,
            cfg=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                     tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, sliding_window=512,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0)))


def make_long_fixture(root):
    spec = LONG
    for seed in range(spec["seed"], spec["seed"] + 100):
        torch.manual_seed(seed)
        config = MistralConfig(**spec["cfg"])
        model = MistralForCausalLM(config).float().eval()
        init_weights(model, seed)
        rng = np.random.default_rng(seed)
        prompt = [1] + [int(x) for x in rng.integers(3, config.vocab_size, spec["prompt_len"] - 1)]
        ids, rows, margins = list(prompt), [], []
        with torch.no_grad():
            for _ in range(spec["n_new"] + 1):
                logits = model(torch.tensor([ids])).logits[0, -1]
                top = torch.topk(logits, 2)
                margins.append(float(top.values[0] - top.values[1]))
                rows.append(logits.numpy().copy())
                ids.append(int(top.indices[0]))
        greedy = ids[len(prompt):len(prompt) + spec["n_new"]]
        if min(margins) >= MIN_MARGIN and 2 not in greedy:
            break
    else:
        sys.exit("mistral_long_window: no seed without near-ties")
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=spec["n_new"], eos_token_id=None, pad_token_id=0,
                               bos_token_id=1)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=gen_cfg)
    if [int(x) for x in out[0, len(prompt):]] != greedy:
        sys.exit("mistral_long_window: generate() (sliding-window cache) and full-forward greedy disagree")
    d = os.path.join(root, "llama", spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    gen_path = os.path.join(d, "generation_config.json")
    if os.path.exists(gen_path):
        os.remove(gen_path)
    logits = np.stack(rows[: spec["n_new"]])  # the last prompt position, then each greedy token's but the last
    logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    ref = {"model_class": "MistralForCausalLM", "seed": seed, "prompt_ids": prompt, "greedy_ids": greedy,
           "logits_file": "logits.f32", "logits_shape": list(logits.shape),
           "logits_rows": "position prompt_len - 1 + i: after the prompt and the first i greedy tokens",
           "logits_max_abs": float(np.abs(logits).max()), "min_greedy_margin": float(min(margins)),
           "versions": versions()}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"{spec['name']}: prompt {len(prompt)}, window {config.sliding_window}, min greedy margin "
          f"{min(margins):.4f}, seed {seed}")


def make_mixed_safetensors(root):
    """One file with every dtype qlm reads, INT8 with per-tensor and per-row "_scale" companions,
    written by the Python library itself (qlm must load it and re-save it byte for byte)."""
    from safetensors.torch import save_file
    ar = torch.arange(24, dtype=torch.float64)
    tensors = {
        "f32.matrix": (ar.reshape(4, 6) * 0.25 - 3.0).float(),
        "f16.vector": (ar[:5] * 0.5 - 1.0).half(),
        "bf16.vector": torch.tensor([1.0, -2.0, 3.140625, 0.0, float("inf"), 0.25], dtype=torch.bfloat16),
        "i8.per_tensor": (ar[:6].reshape(2, 3) * 11 - 60).to(torch.int8),
        "i8.per_tensor_scale": torch.tensor([0.125], dtype=torch.float32),
        "i8.per_row": torch.tensor([[127, -127, 0], [1, -1, 64], [-128, 5, 9]], dtype=torch.int8),
        "i8.per_row_scale": torch.tensor([0.5, 0.25, 2.0], dtype=torch.float32),
        "empty": torch.zeros((0, 3), dtype=torch.float32),
        "scalar": torch.tensor(7.5, dtype=torch.float32),
    }
    d = os.path.join(root, "safetensors")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "mixed.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    print(f"safetensors/mixed.safetensors: {os.path.getsize(path)} bytes")


def versions():
    import safetensors
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", nargs="+", choices=sorted(FIXTURES) + [LONG["name"]], help="make only these fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, spec in FIXTURES.items():
        if not args.only or name in args.only:
            make_fixture(name, spec, args.out)
    if not args.only or LONG["name"] in args.only:
        make_long_fixture(args.out)
    if not args.only:
        make_mixed_safetensors(args.out)
    print(json.dumps(versions()))


if __name__ == "__main__":
    main()
