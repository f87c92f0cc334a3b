#!/usr/bin/env python3
"""Dev-time generator of tests/fixtures/gguf/: small synthetic GGUF files written with gguf-py,
with reference values computed by gguf-py and transformers, and reference numbers read from the
real default model (SmolLM2-135M-Instruct Q4_1 GGUF). tests/test_gguf.c compares qlm's GGUF
loader against them. The files are described in tests/fixtures/gguf/README.md.

Usage (from the repository root):
    python3 tools/make_gguf_fixtures.py [--gguf ~/.cache/qlm/SmolLM2-135M-Instruct.Q4_1.gguf] [--skip-real]
Needs numpy, gguf; torch and transformers for the cross-checks and the real-model reference.
"""
import argparse
import json
import math
import os
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

OUT = "tests/fixtures/gguf"
K_TYPES = {T.Q4_K, T.Q5_K, T.Q6_K}  # gguf-py can only dequantize these


def permute_for_llama_cpp(w, n_head):
    """The row order llama.cpp's converter gives Q/K of "llama" models (interleaved RoPE pairs):
    within each head, Hugging Face row s*hd/2 + i is stored at row 2i + s."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rng, qtype, n_elems):
    """Random K-quant blocks (gguf-py cannot quantize these) with sane F16 super-block scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_elems // block, size), dtype=np.uint8)
    scale = (rng.uniform(0.004, 0.02, size=(n_elems // block, 2))).astype(np.float16).view(np.uint8)
    if qtype == T.Q6_K:
        raw[:, 208:210] = scale[:, 0:2]
    else:
        raw[:, 0:4] = scale
    return raw


def encode(rng, hf_weight, qtype, perm_heads=0):
    """GGUF bytes for a tensor given in Hugging Face layout, and the reference F32 values in HF
    layout after the round trip through the file's type (dequantized by gguf-py)."""
    w = permute_for_llama_cpp(hf_weight, perm_heads) if perm_heads else hf_weight
    if qtype in K_TYPES:
        data = random_k_blocks(rng, qtype, w.size).reshape(w.shape[0], -1)
    elif qtype == T.F32:
        data = w.astype(np.float32)
    elif qtype == T.F16:
        data = w.astype(np.float16)
    else:
        data = gguf.quants.quantize(w.astype(np.float32), qtype)
    back = gguf.quants.dequantize(data.view(np.uint8) if qtype not in (T.F32, T.F16) else data, qtype)
    back = back.astype(np.float32).reshape(w.shape)
    return data, (unpermute(back, perm_heads) if perm_heads else back)


def llama3_rope_divisors(head_dim, theta, factor, low=1.0, high=4.0, orig=8192):
    """Per-frequency divisors as llama.cpp's converter writes rope_freqs.weight for Llama 3.x."""
    out = []
    for j in range(0, head_dim, 2):
        freq = 1.0 / theta ** (j / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# Metadata of every value type, written by the synthetic llama fixture under "test.*".
TEST_KVS = [
    ("test.u8", V.UINT8, 200), ("test.i8", V.INT8, -100), ("test.u16", V.UINT16, 60000),
    ("test.i16", V.INT16, -30000), ("test.u32", V.UINT32, 4000000000), ("test.i32", V.INT32, -2000000000),
    ("test.u64", V.UINT64, 12345678901234), ("test.i64", V.INT64, -12345678901234),
    ("test.f32", V.FLOAT32, 0.1), ("test.f64", V.FLOAT64, -2.5e-300), ("test.bool", V.BOOL, True),
    ("test.bool_false", V.BOOL, False), ("test.str", V.STRING, "héllo \"wörld\"\n"),
    ("test.arr.u8", V.ARRAY, ([0, 1, 255], V.UINT8)), ("test.arr.i8", V.ARRAY, ([-128, 0, 127], V.INT8)),
    ("test.arr.u16", V.ARRAY, ([1, 65535], V.UINT16)), ("test.arr.i16", V.ARRAY, ([-32768, 32767], V.INT16)),
    ("test.arr.u32", V.ARRAY, ([7, 4294967295], V.UINT32)), ("test.arr.i32", V.ARRAY, ([-5, 6, -7], V.INT32)),
    ("test.arr.u64", V.ARRAY, ([1, 2 ** 40], V.UINT64)), ("test.arr.i64", V.ARRAY, ([-(2 ** 40), 3], V.INT64)),
    ("test.arr.f32", V.ARRAY, ([1.5, -0.25, 3.0e-3], V.FLOAT32)),
    ("test.arr.f64", V.ARRAY, ([1e100, -1.0 / 3.0], V.FLOAT64)),
    ("test.arr.bool", V.ARRAY, ([True, False, True], V.BOOL)),
    ("test.arr.str", V.ARRAY, (["a", "", "Ġthe", "<|im_end|>"], V.STRING)),
    ("test.arr.nested", V.ARRAY, ([[1, 2], [3], [4, 5, 6]], V.ARRAY)),
    ("test.arr.nested_str", V.ARRAY, ([["x", "yz"], ["w"]], V.ARRAY)),
]


def add_test_kvs(w):
    for key, vtype, val in TEST_KVS:
        if vtype == V.ARRAY:
            items, sub = val
            w.add_key_value(key, items, V.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, val, vtype)


def read_back_kvs(path):
    """The test.* values as gguf-py reads them back: {key: {"type": name, "value": ...}}."""
    r = gguf.GGUFReader(path)
    out = {}
    for key, vtype, written in TEST_KVS:
        f = r.fields[key]
        val = f.contents()  # nested arrays come back flattened
        if isinstance(val, float) and f.types[0] == V.FLOAT32:
            val = float(np.float32(val))
        if isinstance(val, list) and f.types[-1] == V.FLOAT32:
            val = [float(np.float32(x)) for x in val]
        entry = {"type": V(f.types[0]).name, "elem": V(f.types[1]).name if len(f.types) > 1 else None, "value": val}
        if vtype == V.ARRAY and written[1] == V.ARRAY:
            entry["outer_count"] = len(written[0])
        out[key] = entry
    return out


def build_metadata_file():
    """kv_types.gguf: no tensors, metadata of every value type (transformers' reader cannot read
    nested arrays, so this is kept apart from the models); kv_types.json: gguf-py's reading."""
    path = os.path.join(OUT, "kv_types.gguf")
    w = gguf.GGUFWriter(path, "llama")
    add_test_kvs(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(OUT, "kv_types.json"), "w") as f:
        json.dump(read_back_kvs(path), f, indent=1, ensure_ascii=False)


def layer_names(hf):
    return {
        "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
        "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    }[hf]


def gguf_name(hf):
    glob = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
    if hf in glob:
        return glob[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{layer_names('.'.join(parts[3:]))}"


def build_model(name, spec, rng):
    """Writes <name>.gguf, <name>.f32 (reference tensors in HF layout, concatenated) and
    <name>.json (config, tensor index, metadata)."""
    c = spec["config"]
    arch, dim, hid, nh, nkv = spec["arch"], c["dim"], c["hidden_dim"], c["n_heads"], c["n_kv_heads"]
    hd = dim // nh
    permute = arch == "llama"
    path = os.path.join(OUT, name + ".gguf")
    w = gguf.GGUFWriter(path, arch)
    if spec.get("alignment"):
        w.add_custom_alignment(spec["alignment"])
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["max_seq_len"])
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hid)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["norm_eps"])
    if spec.get("key_length"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    tokens = [f"tok{i}" for i in range(c["vocab_size"])]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(c["bos_id"])
    w.add_eos_token_id(c["eos_id"])

    def rand(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors = []  # (hf name, gguf name, type, reference)

    def put(hf, weight, qtype, perm=0):
        data, ref = encode(rng, weight, qtype, perm)
        if qtype in (T.F32, T.F16):
            w.add_tensor(gguf_name(hf), data)
        else:
            w.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
        tensors.append((hf, gguf_name(hf), qtype, ref))

    put("model.embed_tokens.weight", rand(c["vocab_size"], dim), spec["embed_type"])
    for l, types in enumerate(spec["layer_types"]):
        p = f"model.layers.{l}."
        put(p + "input_layernorm.weight", 1 + rand(dim, scale=0.1), T.F32)
        put(p + "self_attn.q_proj.weight", rand(nh * hd, dim), types[0], nh if permute else 0)
        put(p + "self_attn.k_proj.weight", rand(nkv * hd, dim), types[1], nkv if permute else 0)
        put(p + "self_attn.v_proj.weight", rand(nkv * hd, dim), types[2])
        put(p + "self_attn.o_proj.weight", rand(dim, nh * hd), types[3])
        if spec.get("attn_bias"):
            put(p + "self_attn.q_proj.bias", rand(nh * hd), T.F32, nh if permute else 0)
            put(p + "self_attn.k_proj.bias", rand(nkv * hd), T.F32, nkv if permute else 0)
            put(p + "self_attn.v_proj.bias", rand(nkv * hd), T.F32)
        if spec.get("qk_norm"):
            put(p + "self_attn.q_norm.weight", 1 + rand(hd, scale=0.1), T.F32)
            put(p + "self_attn.k_norm.weight", 1 + rand(hd, scale=0.1), T.F32)
        put(p + "post_attention_layernorm.weight", 1 + rand(dim, scale=0.1), types[7])
        put(p + "mlp.gate_proj.weight", rand(hid, dim), types[4])
        put(p + "mlp.up_proj.weight", rand(hid, dim), types[5])
        put(p + "mlp.down_proj.weight", rand(dim, hid), types[6])
    put("model.norm.weight", 1 + rand(dim, scale=0.1), T.F32)
    if spec.get("output_type") is not None:
        put("lm_head.weight", rand(c["vocab_size"], dim), spec["output_type"])
    if spec.get("rope_factor"):
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(hd, c["rope_theta"], spec["rope_factor"]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    index, offset = [], 0
    with open(os.path.join(OUT, name + ".f32"), "wb") as f:
        for hf, gname, qtype, ref in tensors:
            ref = np.ascontiguousarray(ref, dtype="<f4")
            f.write(ref.tobytes())
            index.append({"hf": hf, "gguf": gname, "type": qtype.name, "shape": list(ref.shape), "offset": offset})
            offset += ref.size
    meta = {"config": dict(c, arch=arch, head_dim=hd), "tensors": index}
    if spec.get("rope_factor"):
        meta["config"].update(rope_scale_factor=spec["rope_factor"], rope_low_freq_factor=1.0,
                              rope_high_freq_factor=4.0, rope_orig_max_pos=8192)
    check_reader(path, tensors, permute, nh, nkv)
    r = gguf.GGUFReader(path)
    meta["data_offset"] = int(r.data_offset)
    meta["data_end"] = int(max(t.data_offset + t.n_bytes for t in r.tensors))
    return path, meta, tensors


def check_reader(path, tensors, permute, nh, nkv):
    """gguf-py reads back what was written: types, GGUF shapes (innermost first) and values."""
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    for hf, gname, qtype, ref in tensors:
        t = by_name[gname]
        assert t.tensor_type == qtype, (gname, t.tensor_type, qtype)
        assert list(t.shape) == list(reversed(ref.shape)), (gname, t.shape, ref.shape)
        back = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(ref.shape)
        heads = nh if ".q_proj." in hf else nkv if ".k_proj." in hf else 0
        if permute and heads:
            back = unpermute(back, heads)
        assert np.array_equal(back, ref), gname


def check_with_transformers(path, tensors):
    """transformers' GGUF loader un-permutes Q/K on its own; its weights must equal the reference."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("transformers not available: skipping the cross-check of", path)
        return
    folder, fname = os.path.split(os.path.abspath(path))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    sd = model.state_dict()
    for hf, _, _, ref in tensors:
        got = sd[hf].numpy()
        assert got.shape == ref.shape, (hf, got.shape, ref.shape)
        assert np.array_equal(got, ref), (hf, float(np.abs(got - ref).max()))
    print("transformers agrees with the reference for", len(tensors), "tensors of", path)


LLAMA_SPEC = {
    "arch": "llama",
    "config": {"dim": 32, "hidden_dim": 256, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 64,
               "max_seq_len": 128, "rope_theta": 500000.0, "norm_eps": 1e-6, "bos_id": 1, "eos_id": 2,
               "tie_embeddings": 0, "attn_bias": 0},
    "embed_type": T.Q8_0,
    "output_type": T.Q4_1,
    # q, k, v, o, gate, up, down, ffn_norm
    "layer_types": [
        [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.F32],
        [T.Q4_1, T.Q4_0, T.Q8_0, T.BF16, T.F16, T.Q5_0, T.Q5_K, T.F16],
        [T.Q8_0, T.Q5_1, T.Q4_1, T.F16, T.Q5_1, T.F32, T.Q6_K, T.BF16],
    ],
    "rope_factor": 32.0,
}

QWEN2_SPEC = {
    "arch": "qwen2",
    "config": {"dim": 32, "hidden_dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 48,
               "max_seq_len": 64, "rope_theta": 1000000.0, "norm_eps": 1e-6, "bos_id": 0, "eos_id": 47,
               "tie_embeddings": 1, "attn_bias": 1},
    "embed_type": T.F16,
    "output_type": None,
    "layer_types": [[T.Q8_0, T.Q4_1, T.F32, T.Q4_0, T.F16, T.Q8_0, T.Q5_0, T.F32]],
    "attn_bias": True,
    "key_length": True,
    "alignment": 1,
}

# Qwen3: per-head q/k norms (attn_q_norm / attn_k_norm), no biases, rotate-half layout.
QWEN3_SPEC = {
    "arch": "qwen3",
    "config": {"dim": 32, "hidden_dim": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 40,
               "max_seq_len": 64, "rope_theta": 1000000.0, "norm_eps": 1e-6, "bos_id": 1, "eos_id": 39,
               "tie_embeddings": 0, "attn_bias": 0, "qk_norm": 1},
    "embed_type": T.F32,
    "output_type": T.Q8_0,
    "layer_types": [[T.Q8_0, T.F16, T.Q4_0, T.BF16, T.Q4_1, T.F32, T.Q8_0, T.F32],
                    [T.F32, T.Q4_1, T.Q8_0, T.F16, T.Q5_0, T.Q4_0, T.BF16, T.F32]],
    "qk_norm": True,
    "key_length": True,
    # transformers' GGUF reader takes Qwen3's head_dim from its config default (128), not from
    # attention.key_length, so it cannot load a small model: gguf-py's read-back is the check.
    "skip_transformers": True,
}

MODELS = [("tiny_llama", LLAMA_SPEC), ("tiny_qwen2", QWEN2_SPEC), ("tiny_qwen3", QWEN3_SPEC)]

# Hugging Face fixtures (tests/fixtures/llama) written as llama.cpp's converter writes their
# architectures, F32: qlm must load each and reproduce the fixture's transformers logits.
HF_AS_GGUF = ["gemma2_softcap", "gemma3_local_rope", "phi3_longrope_long"]


def hf_fixture_as_gguf(name):
    """Writes tests/fixtures/gguf/<name>.gguf from tests/fixtures/llama/<name>: Gemma's norms stored
    as 1 + w (transformers' GGUF reader takes the 1 off again), Gemma 2's window pattern as a number
    and Gemma 3's as a list of bools, Phi-3's q/k/v as attn_qkv and its
    gate and up as ffn_up, longrope's factors as rope_factors_short/long.weight."""
    from safetensors.numpy import load_file
    d = os.path.join("tests/fixtures/llama", name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    t = load_file(os.path.join(d, "model.safetensors"))
    mt = cfg["model_type"]
    arch = {"gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}[mt]
    gemma = arch.startswith("gemma")
    nh, nkv, hid, n_layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or hid // nh
    rope = cfg.get("rope_parameters") or {}
    path = os.path.join(OUT, name + ".gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hid)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(cfg["vocab_size"])])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if gemma:
        full = rope.get("full_attention", rope)
        w.add_rope_freq_base(full["rope_theta"])
        w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
        w.add_sliding_window(cfg["sliding_window"])
        types = cfg["layer_types"]
        if arch == "gemma3":
            # llama.cpp's per-layer form: one bool per layer, true where it is windowed
            w.add_sliding_window_pattern([x == "sliding_attention" for x in types])
        else:
            w.add_sliding_window_pattern(next(i + 1 for i, x in enumerate(types) if x == "full_attention"))
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if arch == "gemma3":
            w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
            if full.get("rope_type") == "linear":
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
                w.add_rope_scaling_factor(full["factor"])
    else:
        w.add_rope_freq_base(rope["rope_theta"])
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "longrope":
            orig = cfg["original_max_position_embeddings"]
            factor = rope.get("factor") or cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_orig_ctx_len(orig)
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(factor) / math.log(orig)))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate_up_proj": "ffn_up",
             "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
    for hf_name, a in sorted(t.items()):
        if hf_name == "model.embed_tokens.weight":
            g_name = "token_embd.weight"
        elif hf_name == "model.norm.weight":
            g_name = "output_norm.weight"
        elif hf_name == "lm_head.weight":
            g_name = "output.weight"
        else:
            parts = hf_name.split(".")
            g_name = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.weight"
        if gemma and hf_name.endswith("norm.weight"):
            a = a + np.float32(1)
        w.add_tensor(g_name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{name}.gguf: {os.path.getsize(path)} bytes, arch {arch}")


def real_reference(path):
    """Reference numbers of the real SmolLM2 GGUF: metadata and tensor infos by gguf-py, and
    summaries of the weights under Hugging Face names from transformers' GGUF loader (which
    dequantizes with gguf-py and reverses llama.cpp's Q/K permutation itself)."""
    import torch
    from transformers import AutoModelForCausalLM

    r = gguf.GGUFReader(path)
    meta = {}
    for key in ["general.architecture", "llama.block_count", "llama.context_length", "llama.embedding_length",
                "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
                "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model", "tokenizer.ggml.pre"]:
        v = r.fields[key].contents()
        meta[key] = float(np.float32(v)) if isinstance(v, float) else v
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    ttype = r.fields["tokenizer.ggml.token_type"].contents()
    arrays = {
        "tokenizer.ggml.tokens": {"n": len(toks), "items": {str(i): toks[i] for i in (0, 1, 2, 100, 1000, 49151)}},
        "tokenizer.ggml.merges": {"n": len(merges), "items": {str(i): merges[i] for i in (0, 1, 48899)}},
        "tokenizer.ggml.token_type": {"n": len(ttype), "items": {str(i): int(ttype[i]) for i in (0, 16, 17, 49151)}},
    }
    infos = [{"name": t.name, "type": t.tensor_type.name, "ne": [int(x) for x in t.shape]} for t in r.tensors]

    folder, fname = os.path.split(os.path.abspath(path))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    sd = model.state_dict()
    sums = {}
    for name, t in sd.items():
        if name == "lm_head.weight":
            continue  # tied: qlm's store has no separate lm_head
        a = t.numpy().astype(np.float64)
        flat = t.numpy().reshape(-1)
        sums[name] = {"shape": list(t.shape), "sum": float(a.sum()), "sum_abs": float(np.abs(a).sum()),
                      "sum_sq": float((a * a).sum()),
                      "samples": {str(i): float(flat[i]) for i in sorted({0, 1, 63, 64, flat.size // 2, flat.size - 1})}}
    rows = {}
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.29.self_attn.q_proj.weight", "model.layers.29.self_attn.k_proj.weight"]:
        rows[name] = [float(x) for x in sd[name].numpy().astype(np.float64).sum(axis=1)]
    return {"file": fname, "metadata": meta, "arrays": arrays, "n_kv": len(r.fields) - 3, "tensor_infos": infos,
            "tensor_sums": sums, "row_sums": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/qlm/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--hf-only", action="store_true", help="write only the Hugging Face fixtures as GGUF")
    ap.add_argument("--only", nargs="+", choices=[n for n, _ in MODELS],
                    help="rewrite only these synthetic models (the others are built aside, so that each one's "
                         "random values stay what a full run gives)")
    args = ap.parse_args()
    global OUT
    os.makedirs(OUT, exist_ok=True)
    for name in HF_AS_GGUF:
        hf_fixture_as_gguf(name)
    if args.hf_only:
        return
    rng = np.random.default_rng(20240601)
    if not args.only:
        build_metadata_file()
    final_out, aside = OUT, tempfile.mkdtemp()
    for name, spec in MODELS:
        keep = not args.only or name in args.only
        OUT = final_out if keep else aside
        path, meta, tensors = build_model(name, spec, rng)
        if not keep:
            continue
        if not spec.get("skip_transformers"):
            check_with_transformers(path, tensors)
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1, ensure_ascii=False)
    OUT = final_out
    if not args.skip_real and not args.only:
        with open(os.path.join(OUT, "smollm2_q4_1.json"), "w") as f:
            json.dump(real_reference(args.gguf), f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
