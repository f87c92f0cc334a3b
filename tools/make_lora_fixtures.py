#!/usr/bin/env python3
"""Dev-time generator of the LoRA parity fixtures in tests/fixtures/lora/ (see the README there).
qlm never runs Python; this script only produces committed reference files.

peft attaches LoRA adapters to the random Llama and T5 fixtures (tests/fixtures/llama/*,
tests/fixtures/t5/gated_untied), their A and B are set to non-zero random values, and each adapter
folder is saved with save_pretrained (adapter_config.json + adapter_model.safetensors) next to the
logits of the unmerged PEFT model: for Llama every position of the base fixture's `tokens`, for T5
the teacher-forced decoder logits over the base fixture's `decoder_ids[:-1]`.

Usage (from the repository root):
  python tools/make_lora_fixtures.py                 writes tests/fixtures/lora/
  python tools/make_lora_fixtures.py --check DIR     loads each DIR/<name> written by qlm
                                                     (QLM_EXPORT_DIR=DIR build/tests/test_lora)
                                                     with PeftModel.from_pretrained and compares
                                                     its logits with the fixture's
Needs torch, transformers 4.x (4.57 was used; see tests/fixtures/t5/README.md why not 5), peft,
safetensors, numpy. transformers 4.x reads the Llama fixtures' transformers-5 config.json without
its `rope_parameters`, so rope_theta is passed explicitly; every run checks that the base model
with the adapter disabled reproduces the base fixture's logits.f32.
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import peft
import safetensors
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, T5ForConditionalGeneration

FIX = "tests/fixtures"
OUT = os.path.join(FIX, "lora")
# ΔW = scale·B·A gets entries of about EFFECT × the base weight's standard deviation.
EFFECT = 0.4

ADAPTERS = {
    # Attention only, a target list of short names.
    "mha_attn_r8": dict(base="llama/mha_untied", seed=11, cfg=dict(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    # The MLP of layer 1 only, rsLoRA.
    "mha_mlp_rslora_r16": dict(base="llama/mha_untied", seed=12, cfg=dict(
        r=16, lora_alpha=32, use_rslora=True, target_modules=["gate_proj", "up_proj", "down_proj"],
        layers_to_transform=[1])),
    # Every linear layer (peft saves the expanded list) of a model with q/k/v biases, rsLoRA.
    "qwen2_all_rslora_r4": dict(base="llama/qwen2_bias", seed=13, cfg=dict(
        r=4, lora_alpha=8, use_rslora=True, target_modules="all-linear")),
    # A regex (re.fullmatch on the module path), per-module ranks and alphas, GQA shapes.
    "gqa_regex_patterns": dict(base="llama/gqa_tied", seed=14, cfg=dict(
        r=8, lora_alpha=16, target_modules=r".*\.(q_proj|v_proj|down_proj)",
        rank_pattern={"down_proj": 4, "model.layers.1.self_attn.q_proj": 16}, alpha_pattern={"v_proj": 4})),
    # T5: every linear of both stacks (self, cross, gated feed-forward), with patterns.
    "t5_all_patterns_r8": dict(base="t5/gated_untied", seed=15, cfg=dict(
        r=8, lora_alpha=8, target_modules="all-linear", rank_pattern={"wo": 4},
        alpha_pattern={"EncDecAttention.k": 2})),
    # T5: q and v of self- and cross-attention, rsLoRA.
    "t5_qv_rslora_r16": dict(base="t5/gated_untied", seed=16, cfg=dict(
        r=16, lora_alpha=8, use_rslora=True, target_modules=["q", "v"])),
}


def load_base(base):
    path = os.path.join(FIX, base)
    if base.startswith("t5/"):
        return T5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with open(os.path.join(path, "config.json")) as f:
        theta = json.load(f)["rope_parameters"]["rope_theta"]
    cfg = AutoConfig.from_pretrained(path, rope_theta=theta)
    return AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32).eval()


def base_reference(base):
    with open(os.path.join(FIX, base, "reference.json")) as f:
        return json.load(f)


@torch.no_grad()
def logits_of(model, base):
    ref = base_reference(base)
    if base.startswith("t5/"):
        out = model(input_ids=torch.tensor([ref["input_ids"]]), decoder_input_ids=torch.tensor([ref["decoder_ids"][:-1]]))
    else:
        out = model(input_ids=torch.tensor([ref["tokens"]]))
    return out.logits[0].float().numpy()


def lora_layers(model):
    for name, mod in model.named_modules():
        if isinstance(mod, peft.tuners.lora.LoraLayer) and "default" in mod.lora_A:
            yield name.removeprefix("base_model.model."), mod


@torch.no_grad()
def randomize(model, seed):
    """A ~ N(0, 1/in); B sized so that ΔW's entries are about EFFECT × std(W0)."""
    g = torch.Generator().manual_seed(seed)
    for _, mod in lora_layers(model):
        a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        r, n_in = a.shape
        scale = mod.scaling["default"]
        w_std = float(mod.base_layer.weight.std())
        a.copy_(torch.randn(a.shape, generator=g) / math.sqrt(n_in))
        b.copy_(torch.randn(b.shape, generator=g) * (EFFECT * w_std * math.sqrt(n_in) / (scale * math.sqrt(r))))


def max_abs(a, b):
    return float(np.abs(a.astype(np.float64) - b).max())


def make(name, spec):
    base = spec["base"]
    model = get_peft_model(load_base(base), LoraConfig(init_lora_weights=False, **spec["cfg"])).eval()
    randomize(model, spec["seed"])
    logits = logits_of(model, base)
    with model.disable_adapter():
        plain = logits_of(model, base)
    base_logits = np.fromfile(os.path.join(FIX, base, "logits.f32"), dtype="<f4").reshape(plain.shape)
    if max_abs(plain, base_logits) > 1e-4:
        raise SystemExit(f"{name}: the base model does not reproduce {base}/logits.f32")

    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    os.remove(os.path.join(d, "README.md"))  # peft's model card template
    # What peft reads back must be what produced the logits.
    again = PeftModel.from_pretrained(load_base(base), d).eval()
    if max_abs(logits_of(again, base), logits) != 0:
        raise SystemExit(f"{name}: the saved adapter does not reproduce its logits")
    logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))

    modules = {path: dict(r=mod.r["default"], scale=mod.scaling["default"]) for path, mod in lora_layers(model)}
    ref = dict(base=base, seed=spec["seed"], config=spec["cfg"], modules=modules,
               n_params=sum(p.numel() for n, p in model.named_parameters() if "lora_" in n),
               logits_file="logits.f32", logits_shape=list(logits.shape),
               logits_max_abs=float(np.abs(logits).max()), adapter_effect_max_abs=max_abs(logits, plain),
               versions=dict(torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__,
                             safetensors=safetensors.__version__, numpy=np.__version__))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {len(modules)} modules, {ref['n_params']} parameters, {size} bytes, max|logit| "
          f"{ref['logits_max_abs']:.2f}, adapter moves logits by up to {ref['adapter_effect_max_abs']:.2f}")


def check(export_dir):
    """Adapters written by qlm, loaded by peft, must give the fixtures' logits."""
    for name, spec in ADAPTERS.items():
        d = os.path.join(export_dir, name)
        if not os.path.isdir(d):
            print(f"{name}: not exported, skipped")
            continue
        model = PeftModel.from_pretrained(load_base(spec["base"]), d).eval()
        ref = np.fromfile(os.path.join(OUT, name, "logits.f32"), dtype="<f4")
        diff = max_abs(logits_of(model, spec["base"]).reshape(-1), ref)
        print(f"{name}: peft loads qlm's adapter, max|logit diff| {diff:.3g}")
        if diff > 1e-5:
            raise SystemExit(f"{name}: mismatch")


def main():
    # peft saves an expanded target list in set order: fix the string hash so reruns give the same bytes.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", metavar="DIR")
    args = ap.parse_args()
    if int(transformers.__version__.split(".")[0]) >= 5:
        raise SystemExit("use transformers 4.x (see the docstring)")
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if args.check:
        check(args.check)
        return
    for name, spec in ADAPTERS.items():
        make(name, spec)


if __name__ == "__main__":
    main()
