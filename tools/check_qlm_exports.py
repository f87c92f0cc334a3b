#!/usr/bin/env python3
"""Dev-time check that files written by qlm load in the Python libraries.

    QLM_EXPORT_DIR=/tmp/qlm_export ./build/tests/test_hf_config
    QLM_EXPORT_DIR=/tmp/qlm_export ./build/tests/test_safetensors
    python3 tools/check_qlm_exports.py /tmp/qlm_export

For every fixture folder re-written by qlm (config.json from qlm_hf_config_save,
model.safetensors from qlm_safetensors_save): transformers loads it and must reproduce the
fixture's reference logits, and both safetensors.numpy and safetensors.torch must read the
weights bit for bit. roundtrip.safetensors (F32/F16/BF16/INT8 with per-tensor and per-row
scales, odd metadata) must load in both readers.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as np_load
from safetensors.torch import load_file as pt_load
from transformers import AutoConfig, AutoModelForCausalLM

FIXTURES = "tests/fixtures/llama"


def check_model(export, name):
    d = os.path.join(export, name)
    ref_dir = os.path.join(FIXTURES, name)
    ref = json.load(open(os.path.join(ref_dir, "reference.json")))
    a, b = AutoConfig.from_pretrained(ref_dir), AutoConfig.from_pretrained(d)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings", "rope_parameters", "bos_token_id", "attention_bias", "mlp_bias"):
        va, vb = getattr(a, key, None), getattr(b, key, None)
        if key == "head_dim":  # qwen2 configs leave it out; the models use hidden/heads then
            va = va or a.hidden_size // a.num_attention_heads
            vb = vb or b.hidden_size // b.num_attention_heads
        assert va == vb or (key == "rms_norm_eps" and abs(va - vb) < 1e-12), f"{name}: {key} {va} != {vb}"
    want = np_load(os.path.join(ref_dir, "model.safetensors"))
    for got in (np_load(os.path.join(d, "model.safetensors")),
                {k: v.numpy() for k, v in pt_load(os.path.join(d, "model.safetensors")).items()}):
        assert want.keys() == got.keys(), name
        for k in want:
            assert want[k].tobytes() == got[k].tobytes(), f"{name}: {k}"
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ref["tokens"]])).logits[0].numpy()
    expect = np.fromfile(os.path.join(ref_dir, ref["logits_file"]), "<f4").reshape(ref["logits_shape"])
    err = float(np.abs(logits - expect).max())
    assert err <= 1e-5, f"{name}: logits differ by {err}"
    print(f"{name}: transformers loads qlm's config.json + model.safetensors, max |logit diff| {err:.2e}")


def check_roundtrip(path):
    t = pt_load(path)
    n_np = 0
    with safe_open(path, "np") as f:
        meta = f.metadata()
        for k in f.keys():
            if t[k].dtype == torch.bfloat16:
                continue  # numpy has no bfloat16
            assert f.get_tensor(k).tobytes() == t[k].numpy().tobytes(), k
            n_np += 1
    assert meta == {"format": "pt", 'quote"d': "line\nbreak\x01"}, meta
    assert t["w.i8_rows"].dtype == torch.int8 and tuple(t["w.i8_rows_scale"].shape) == (6,)
    assert tuple(t["w.i8_tensor_scale"].shape) == (1,) and t["w.i8_tensor_scale"][0] == np.float32(0.0123)
    assert t["m.bf16"].dtype == torch.bfloat16 and tuple(t["b.bf16_4d"].shape) == (1, 2, 3, 4)
    print(f"roundtrip.safetensors: {len(t)} tensors read by safetensors.torch ({n_np} also by safetensors.numpy), "
          f"dtypes {sorted({str(v.dtype) for v in t.values()})}")


def main():
    export = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QLM_EXPORT_DIR", "/tmp/qlm_export")
    names = sorted(n for n in os.listdir(export) if os.path.isdir(os.path.join(export, n)))
    if not names:
        sys.exit(f"{export}: nothing exported")
    for name in names:
        check_model(export, name)
    rt = os.path.join(export, "roundtrip.safetensors")
    if os.path.exists(rt):
        check_roundtrip(rt)
    print("all ok")


if __name__ == "__main__":
    main()
