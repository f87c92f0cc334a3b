"""Writes tests/fixtures/train/adamw_op.safetensors: three torch.optim.AdamW steps (on the CPU,
float32, single-tensor implementation) of 4096 weights, for test_train's test_adamw_matches_torch.
Tensors: p0 (the start), g1..g3 (each step's gradient), p1..p3 (the weights after each step).
Hyper-parameters (the test uses the same): lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
Gradients span 1e-9 .. 1e-1 and hold zeros, so that eps and the bias corrections matter.
Usage: python tools/make_adamw_fixture.py [OUT]"""
import sys

import torch
from safetensors.torch import save_file

N = 4096
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/train/adamw_op.safetensors"
    torch.manual_seed(7301)
    p = torch.nn.Parameter(0.05 * torch.randn(N))
    tensors = {"p0": p.detach().clone()}
    opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    for step in range(1, 4):
        g = torch.randn(N) * torch.pow(10.0, -torch.randint(1, 10, (N,)).float())
        g[torch.randperm(N)[: N // 64]] = 0
        p.grad = g.clone()
        opt.step()
        tensors[f"g{step}"] = g
        tensors[f"p{step}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, out, metadata={"format": "pt"})
    print(f"{out}: {len(tensors)} tensors of {N}")


if __name__ == "__main__":
    main()
