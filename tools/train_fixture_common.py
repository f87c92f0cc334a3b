"""Shared by tools/make_train_fixtures.py (Llama/Qwen2) and tools/make_t5_train_fixtures.py (T5): the
gradient, LoRA and AdamW reference steps and their conventions, so both fixture sets stay in step.
Each script keeps its batch, loss, model loading and tensor classes; `loss_fn(model)` returns
(mean loss tensor, target count, per-sequence loss sums)."""
import argparse
import json
import os
import shutil
import sys

import peft
import safetensors
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

N_STEPS = 10

LORA_INIT_SEED = 6101   # torch.manual_seed before get_peft_model (A: peft's kaiming-uniform init)
LORA_B_SEED = 6202      # every lora_B <- 0.02 * N(0, 1), in named_parameters order
LORA_B_STD = 0.02

FULL_OPT = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd_matrix=0.1, wd_vector=0.0, max_norm=1.0)
LORA_OPT = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, max_norm=1.0)


def contig(d):
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in d.items()}


def save_st(tensors, path):
    save_file(tensors, path, metadata={"format": "pt"})


def write_json(path, obj, indent=None):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def fresh_dir(out_root, name, base):
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    print(f"{name}: base {base}")
    return out


def train_steps(model, params_groups, params, opt_cfg, loss_fn):
    """N_STEPS of: zero_grad, loss, backward, clip_grad_norm_ (pre-clip norm recorded), AdamW step."""
    opt = torch.optim.AdamW(params_groups, lr=opt_cfg["lr"], betas=opt_cfg["betas"], eps=opt_cfg["eps"],
                            foreach=False)
    losses, norms = [], []
    for _ in range(N_STEPS):
        opt.zero_grad()
        loss, _, _ = loss_fn(model)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=opt_cfg["max_norm"], foreach=False)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    return losses, norms


def print_max_abs(title, tensors, tensor_class):
    by = {}
    for k, v in tensors.items():
        c = tensor_class(k)
        by[c] = max(by.get(c, 0.0), float(v.abs().max()))
    print(f"  {title}: " + ", ".join(f"{c} {m:.3e}" for c, m in sorted(by.items())))


def full_grads(model, base, out, loss_fn):
    """Writes grads.safetensors; returns (loss, n_targets, seq_sums, grads, grad_norm)."""
    base_keys = set(load_file(os.path.join(base, "model.safetensors")).keys())
    named = dict(model.named_parameters())  # shared (tied) parameters appear once
    assert set(named) == base_keys, (set(named) ^ base_keys)

    model.zero_grad()
    loss, n_targets, seq_sums = loss_fn(model)
    loss.backward()
    grads = contig({k: p.grad for k, p in named.items()})
    save_st(grads, os.path.join(out, "grads.safetensors"))
    grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
    return float(loss.detach()), n_targets, seq_sums, grads, grad_norm


def check_padded(loss_f, n_targets, seq_sums, grad_norm, padded, tol):
    """Checks the per-sequence loss against transformers' padded-batch loss (padded); returns the
    reference.json loss entries, in file order."""
    print(f"  loss {loss_f!r}  n_targets {n_targets}  grad norm {grad_norm:.6g}  "
          f"HF padded-batch loss |diff| {abs(padded - loss_f):.3g}")
    assert abs(padded - loss_f) < tol
    return {"loss": loss_f, "n_targets": n_targets, "seq_loss_sums": seq_sums, "grad_norm": grad_norm,
            "hf_padded_batch_loss": padded}


def peft_with_random_b(model, lora_cfg, dtype=torch.float32):
    """The adapter's start every reference shares: peft's init from LORA_INIT_SEED, then B drawn
    from LORA_B_SEED (peft would leave it zero, and every A gradient with it)."""
    torch.manual_seed(LORA_INIT_SEED)
    pmodel = get_peft_model(model, LoraConfig(**lora_cfg))
    pmodel.train()
    g = torch.Generator().manual_seed(LORA_B_SEED)
    with torch.no_grad():
        for k, p in pmodel.named_parameters():
            if "lora_B" in k:
                p.copy_((LORA_B_STD * torch.randn(p.shape, generator=g)).to(dtype))
    return pmodel


def lora_adapter_after_steps(model, lora_cfg, loss_fn, dtype):
    """The adapter (saved names) after N_STEPS AdamW steps from the same start, in dtype."""
    pmodel = peft_with_random_b(model.to(dtype), lora_cfg, dtype)
    named = [(k, p) for k, p in pmodel.named_parameters() if p.requires_grad]
    lp = [p for _, p in named]
    train_steps(pmodel, [{"params": lp, "weight_decay": LORA_OPT["weight_decay"]}], lp, LORA_OPT, loss_fn)
    return {k.replace(".default.", "."): p.detach().double() for k, p in named}


def lora_reference(model, lora_cfg, out, loss_fn, tensor_class, save_final, f64_twin=None):
    """Adapter with randomized B (saved to out/lora_adapter), its loss and gradients, then N_STEPS
    AdamW steps with the base frozen. Returns the reference.json entries, in file order. f64_twin:
    a second copy of the base, trained the same way in float64, so that the reference records how
    far its own float32 result lies from the float64 one (AdamW amplifies the rounding of
    near-zero gradients: that spread bounds any float32 implementation's agreement)."""
    pmodel = peft_with_random_b(model, lora_cfg)
    adir = os.path.join(out, "lora_adapter")
    pmodel.save_pretrained(adir)
    os.remove(os.path.join(adir, "README.md"))  # peft's model card template
    saved = load_file(os.path.join(adir, "adapter_model.safetensors"))

    lora_params = {k: p for k, p in pmodel.named_parameters() if p.requires_grad}
    assert all(("lora_A" in k or "lora_B" in k) for k in lora_params)
    adapter_name = ".default."

    def to_saved(k):
        assert adapter_name in k, k
        return k.replace(adapter_name, ".")

    assert set(map(to_saved, lora_params)) == set(saved), set(map(to_saved, lora_params)) ^ set(saved)
    for k, p in lora_params.items():
        assert torch.equal(p.detach(), saved[to_saved(k)]), k

    pmodel.zero_grad()
    lloss, _, lsums = loss_fn(pmodel)
    lloss.backward()
    lgrads = contig({to_saved(k): p.grad for k, p in lora_params.items()})
    save_st(lgrads, os.path.join(out, "lora_grads.safetensors"))
    lloss_f = float(lloss.detach())
    print(f"  lora_loss {lloss_f!r}  ({len(lgrads)} tensors, "
          f"{sum(v.numel() for v in lgrads.values())} params)")
    print_max_abs("max |lora grad|", lgrads, tensor_class)
    ref = {"lora_loss": lloss_f, "lora_seq_loss_sums": lsums}
    ref["lora"] = {**lora_cfg, "init_seed": LORA_INIT_SEED, "B_seed": LORA_B_SEED, "B_std": LORA_B_STD,
                   "scaling": lora_cfg["lora_alpha"] / lora_cfg["r"], "n_tensors": len(lgrads)}

    lp = list(lora_params.values())
    ref["lora_adamw_losses"], ref["lora_adamw_grad_norms"] = train_steps(
        pmodel, [{"params": lp, "weight_decay": LORA_OPT["weight_decay"]}], lp, LORA_OPT, loss_fn)
    if save_final:
        save_st(contig({to_saved(k): p for k, p in lora_params.items()}),
                os.path.join(out, "lora_adamw_final.safetensors"))
    if save_final and f64_twin is not None:
        f64 = lora_adapter_after_steps(f64_twin, lora_cfg, loss_fn, torch.float64)
        ref["lora_adamw_final_f32_vs_f64"] = max(
            float((p.detach().double() - f64[to_saved(k)]).abs().max()) for k, p in lora_params.items())
        print(f"  lora final adapter, torch float32 vs float64: {ref['lora_adamw_final_f32_vs_f64']:.3g}")
    print("  lora_adamw_losses " + " ".join(f"{x:.5f}" for x in ref["lora_adamw_losses"]))
    print("  lora_adamw_norms  " + " ".join(f"{x:.4f}" for x in ref["lora_adamw_grad_norms"]))
    return ref


def full_reference(model, base, out, loss_fn, tensor_class, save_final):
    """N_STEPS full fine-tuning AdamW steps (weight decay on ndim >= 2 only); returns (losses, norms)."""
    named = dict(model.named_parameters())
    mats = [p for p in named.values() if p.ndim >= 2]
    vecs = [p for p in named.values() if p.ndim < 2]
    params = list(named.values())
    losses, norms = train_steps(
        model, [{"params": mats, "weight_decay": FULL_OPT["wd_matrix"]},
                {"params": vecs, "weight_decay": FULL_OPT["wd_vector"]}], params, FULL_OPT, loss_fn)
    final = contig(named)
    if save_final:
        save_st(final, os.path.join(out, "adamw_final.safetensors"))
    print("  adamw_losses " + " ".join(f"{x:.5f}" for x in losses))
    print("  adamw_norms  " + " ".join(f"{x:.4f}" for x in norms))
    orig = load_file(os.path.join(base, "model.safetensors"))
    print_max_abs("max |final - initial|", {k: final[k] - orig[k] for k in final}, tensor_class)
    return losses, norms


def write_reference(out, ref):
    """Appends the optimizer conventions and tool versions, then writes out/reference.json."""
    ref["adamw"] = {"lr": FULL_OPT["lr"], "betas": list(FULL_OPT["betas"]), "eps": FULL_OPT["eps"],
                    "weight_decay_ndim_ge_2": FULL_OPT["wd_matrix"], "weight_decay_ndim_1": FULL_OPT["wd_vector"],
                    "max_norm": FULL_OPT["max_norm"], "steps": N_STEPS}
    ref["lora_adamw"] = {"lr": LORA_OPT["lr"], "betas": list(LORA_OPT["betas"]), "eps": LORA_OPT["eps"],
                         "weight_decay": LORA_OPT["weight_decay"], "max_norm": LORA_OPT["max_norm"],
                         "steps": N_STEPS}
    ref["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                       "peft": peft.__version__, "safetensors": safetensors.__version__,
                       "python": sys.version.split()[0]}
    write_json(os.path.join(out, "reference.json"), ref, indent=1)


def main(doc, default_out, bases, make_one, check=None):
    """Parses --out, fixes hashing and determinism, then make_one(name, *bases[name], out) for each."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--only", nargs="+", choices=sorted(bases), help="make only these fixtures")
    args = ap.parse_args()
    # peft stores target_modules as a set: fix str hashing so adapter_config.json lists them in the same order.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    if check is not None:
        check()
    transformers.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name, spec in bases.items():
        if not args.only or name in args.only:
            make_one(name, *spec, args.out)
