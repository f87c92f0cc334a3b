#!/usr/bin/env python3
"""Dev-time generator of the T5 parity fixtures in tests/fixtures/t5/ (see the README there).
qlm never runs Python; this script only produces committed reference files.

Three random-initialized T5ForConditionalGeneration models made with transformers:
  gated_untied  T5 v1.1 / FLAN style: gated-GELU feed-forward, untied lm_head (weights committed)
  relu_tied     original T5 style: ReLU feed-forward, tied head scaled by d_model^-0.5 (weights committed)
  flan_small    flan-t5-small's exact config.json from ../shared/assets; its 77M weights are not
                committed: they come from a counter-based hash (splitmix64 of the tensor's index and
                the element's index) that tests/test_t5.c reproduces bit for bit in C.
For each: the encoder output, teacher-forced decoder logits over decoder_start + 32 greedy ids
(greedy by full re-evaluation, no EOS stop), and the relative-position buckets.

Usage (from the repository root): python3 tools/make_t5_fixtures.py
Needs torch, transformers 4.x (4.57 was used), safetensors, numpy, tokenizers. transformers 5 is not
a reference for T5: its T5Config forces tie_word_embeddings to True, so a v1.1/FLAN model's own
lm_head is replaced by the shared embedding.
"""
import json
import os
import shutil

import numpy as np
import safetensors
import torch
import transformers
from transformers import T5Config, T5ForConditionalGeneration

OUT = "tests/fixtures/t5"
ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "assets")
N_NEW = 32
MIN_MARGIN = 0.02
MIN_DISTINCT = 8

SMALL = dict(vocab_size=320, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=3, num_heads=4,
             relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
             layer_norm_epsilon=1e-6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)

FIXTURES = {
    "gated_untied": dict(seed=5001, embed_std=3.0, head_gain=1.0, cfg=dict(SMALL, feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "relu_tied": dict(seed=6001, embed_std=0.1, head_gain=8.0, cfg=dict(SMALL, feed_forward_proj="relu", tie_word_embeddings=True, num_decoder_layers=2)),
}

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """splitmix64 finalizer on a uint64 numpy array (wrapping arithmetic)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK64)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(MASK64)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(MASK64)
    return x ^ (x >> np.uint64(31))


def hash_uniform(tensor_index, n):
    """n floats uniform in [-1, 1): the top 24 bits of splitmix64(tensor_index << 40 | i)."""
    i = np.arange(n, dtype=np.uint64) | (np.uint64(tensor_index) << np.uint64(40))
    with np.errstate(over="ignore"):
        h = splitmix64(i)
    return ((h >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 2.0 - 1.0).astype(np.float32)


def hash_init(model):
    """Deterministic weights the C test rebuilds: tensors in sorted-name order get index 1, 2, ...;
    norms 1 + 0.2u, relative-attention biases 2u, embeddings 1u, other matrices u * 1.7/sqrt(cols)."""
    names = sorted(n for n, _ in model.named_parameters())
    params = dict(model.named_parameters())
    spec = []
    with torch.no_grad():
        for idx, name in enumerate(names, start=1):
            p = params[name]
            u = torch.from_numpy(hash_uniform(idx, p.numel()).reshape(p.shape))
            if "layer_norm" in name:
                v, rule = 1.0 + 0.2 * u, "norm"
            elif "relative_attention_bias" in name:
                v, rule = 2.0 * u, "bias"
            elif name in ("shared.weight", "lm_head.weight") or "embed_tokens" in name:
                v, rule = u, "embed"
            else:
                v, rule = u * np.float32(1.7 / np.sqrt(p.shape[1])), "matrix"
            p.copy_(v)
            spec.append(dict(name=name, index=idx, rule=rule, shape=list(p.shape)))
    return spec


def random_init(model, seed, embed_std, head_gain):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                # head_gain on the decoder's final norm spreads the logits that a tied head's
                # d_model^-0.5 scaling would otherwise squeeze below clear greedy margins.
                gain = head_gain if name == "decoder.final_layer_norm.weight" else 1.0
                p.copy_(gain * (0.7 + 0.6 * torch.rand(p.shape, generator=g)))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "shared.weight":
                # Untied: large, or a random decoder repeats one token whatever it has read. Tied:
                # small, or the head maps each token to itself.
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[1]))


@torch.no_grad()
def greedy(model, src, start, n_new):
    enc = model.get_encoder()(input_ids=torch.tensor([src])).last_hidden_state
    dec = [start]
    margins = []
    for _ in range(n_new):
        logits = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([dec])).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        dec.append(int(torch.argmax(logits)))
    full = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([dec[:-1]])).logits[0]
    return enc[0].numpy(), dec, full.numpy(), margins


def buckets(model):
    """Relative-position buckets of both directions for deltas -1100..1100 (memory - query)."""
    att = model.encoder.block[0].layer[0].SelfAttention
    rel = torch.arange(-1100, 1101)
    out = {}
    for key, bidir in (("bidirectional", True), ("unidirectional", False)):
        out[key] = att._relative_position_bucket(rel, bidirectional=bidir, num_buckets=att.relative_attention_num_buckets,
                                                 max_distance=att.relative_attention_max_distance).tolist()
    return out


def write(name, model, cfg_dict, src, weights, extra):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    enc, dec, logits, margins = greedy(model, src, model.config.decoder_start_token_id, N_NEW)
    if weights:
        model.save_pretrained(d, safe_serialization=True)
        for junk in ("generation_config.json",):
            if os.path.exists(os.path.join(d, junk)):
                os.remove(os.path.join(d, junk))
    else:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_dict, f, indent=2)
    enc.astype("<f4").tofile(os.path.join(d, "encoder_out.f32"))
    if weights:
        logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    else:
        # A 32k vocabulary: the last row in full, the 20 highest logits of the others.
        top = np.argsort(-logits, axis=1, kind="stable")[:, :20].astype("<i4")
        top.tofile(os.path.join(d, "top20_ids.i32"))
        np.take_along_axis(logits, top, axis=1).astype("<f4").tofile(os.path.join(d, "top20_logits.f32"))
        logits[-1].astype("<f4").tofile(os.path.join(d, "last_logits.f32"))
    ref = dict(versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                             safetensors=safetensors.__version__, numpy=np.__version__),
               input_ids=src, decoder_ids=dec, greedy_ids=dec[1:], encoder_out_shape=list(enc.shape),
               logits_shape=list(logits.shape), logits_max_abs=float(np.abs(logits).max()),
               min_greedy_margin=min(margins), buckets=buckets(model), **extra)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{name}: src {len(src)} ids, greedy {dec[1:9]}..., min margin {min(margins):.4f}, "
          f"max|logit| {ref['logits_max_abs']:.2f}")


def main():
    if int(transformers.__version__.split(".")[0]) >= 5:
        raise SystemExit("use transformers 4.x (see the docstring)")
    torch.set_grad_enabled(False)
    for name, fx in FIXTURES.items():
        rng = np.random.default_rng(fx["seed"])
        for seed in range(fx["seed"], fx["seed"] + 200):
            torch.manual_seed(seed)
            model = T5ForConditionalGeneration(T5Config(**fx["cfg"])).eval()
            random_init(model, seed, fx["embed_std"], fx["head_gain"])
            src = [int(x) for x in rng.integers(3, fx["cfg"]["vocab_size"], 15)] + [1]
            _, dec, _, margins = greedy(model, src, 0, N_NEW)
            if min(margins) >= MIN_MARGIN and len(set(dec)) >= MIN_DISTINCT:
                break
        else:
            raise SystemExit(f"{name}: no seed gave a clear, varied greedy continuation")
        write(name, model, None, src, True, dict(seed=seed))

    # flan-t5-small's own config with hash weights; the prompt tokenized by its tokenizer.json.
    from tokenizers import Tokenizer
    small = os.path.join(ASSETS, "flan-t5-small")
    with open(os.path.join(small, "config.json")) as f:
        cfg = json.load(f)
    model = T5ForConditionalGeneration(T5Config.from_pretrained(small)).eval()
    spec = hash_init(model)
    text = "Summarize the following conversation.\n\n#Person1#: Hello, how are you?\n#Person2#: Fine, thanks.\n\nSummary: "
    src = Tokenizer.from_file(os.path.join(small, "tokenizer.json")).encode(text).ids
    write("flan_small", model, cfg, src, False, dict(prompt=text, tensors=spec))


if __name__ == "__main__":
    main()
