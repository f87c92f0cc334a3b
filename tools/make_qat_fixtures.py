#!/usr/bin/env python3
"""Dev-time generator of the learned-scale fake-quantization (LSQ / QAT) fixtures in
tests/fixtures/qat/, the reference for quant/fake_quant.c (tests/test_fake_quant.c). qlm never
runs Python; this script only produces the committed reference files.

Usage (from the repository root):  python3 tools/make_qat_fixtures.py [--out tests/fixtures/qat]
Needs torch and numpy. Runs on the CPU in float32 with fixed seeds.

Each case is torch._fake_quantize_learnable_per_tensor_affine (one scale) or
torch._fake_quantize_learnable_per_channel_affine (axis 0, one scale per row), symmetric
(zero_point 0), with the grad factor _LearnableFakeQuantize(use_grad_scaling=True) uses:
1.0 / (X.numel() * quant_max) ** 0.5. For each case NAME.f32 holds little-endian float32 arrays
back to back: w[rows*cols], dout[rows*cols], out[rows*cols], dw[rows*cols], scales[k],
dscales[k] (k = 1 per tensor, rows per channel); cases.json lists the cases, shapes, qmin, qmax
and grad_factor (a float32 value written exactly).

The script also checks torch against the closed-form formulas quant/fake_quant.c implements
(forward and dw bit for bit, each scale-gradient term bit for bit) and stops if they disagree.
"""
import argparse
import json
import os

import numpy as np
import torch

ROWS_T, COLS_T = 64, 96
ROWS_C, COLS_C = 32, 48


def f32(x):
    return np.float32(x)


def near_ties(s, count, rng):
    """Values next to (k + 0.5) * s where round(x * (1/s)) != round(x / s) in float32: they tell
    multiplication by the float inverse (what torch does) from division."""
    inv = f32(1) / s
    out = []
    for k in rng.permutation(np.arange(-127, 127)):
        v0 = f32((k + 0.5) * float(s))
        for direction in (np.inf, -np.inf):
            v = v0
            for _ in range(16):
                if np.rint(f32(v * inv)) != np.rint(f32(v / s)):
                    if v not in out:
                        out.append(v)
                    break
                v = np.nextafter(v, f32(direction), dtype=np.float32)
        if len(out) >= count:
            break
    return np.array(out[:count], dtype=np.float32)


def exact_ties(s, ks):
    """(k + 0.5) * s for a power-of-two s: w * (1/s) is exactly k + 0.5 (round half to even)."""
    return np.array([(k + 0.5) * float(s) for k in ks], dtype=np.float32)


def plant(w, values, rng):
    flat = w.reshape(-1)
    idx = rng.choice(flat.size, size=len(values), replace=False)
    flat[idx] = values


def make_cases():
    cases = []

    # 1. per tensor, an arbitrary scale 0.6 * absmax / 127 (about a fifth of the values clip),
    #    plus values next to rounding ties that only multiplication by 1/s rounds as torch does.
    rng = np.random.default_rng(101)
    w = (rng.standard_normal((ROWS_T, COLS_T)) * 0.05).astype(np.float32)
    s = f32(0.6 * np.abs(w).max() / 127)
    plant(w, near_ties(s, 48, rng), rng)
    cases.append(dict(name="tensor_clip", kind="tensor", qmin=-127, qmax=127, w=w, scales=np.array([s])))

    # 2. per tensor, qmin -128, scale 2^-7 (exact ties, both bounds, half-way past them).
    rng = np.random.default_rng(202)
    w = (rng.standard_normal((ROWS_T, COLS_T)) * 0.45).astype(np.float32)
    s = f32(2.0 ** -7)
    ks = [-129, -128.9, -128.6, -128, -128.4, -127, -126, -3, -2, -1, 0, 1, 2, 3, 125, 126, 127, 128]
    extra = [(-128.5 + 0.1) * float(s), 127.4 * float(s), 127.6 * float(s), -128.6 * float(s)]
    plant(w, np.concatenate([exact_ties(s, ks), np.array(extra, dtype=np.float32)]), rng)
    cases.append(dict(name="tensor_ties_m128", kind="tensor", qmin=-128, qmax=127, w=w, scales=np.array([s])))

    # 3. per channel, per-row scales absmax_row / 127 times 0.5 .. 1.2 (some rows clip, some not);
    #    row 0 has a power-of-two scale and exact ties, row 1 values next to ties.
    rng = np.random.default_rng(303)
    w = (rng.standard_normal((ROWS_C, COLS_C)) * rng.uniform(0.01, 0.2, (ROWS_C, 1))).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127 * rng.uniform(0.5, 1.2, ROWS_C)).astype(np.float32)
    scales[0] = f32(2.0 ** -9)
    t = exact_ties(scales[0], [-128, -127, -126, -1, 0, 1, 2, 126, 127])
    w[0, : len(t)] = t
    nt = near_ties(scales[1], 12, rng)
    w[1, : len(nt)] = nt
    cases.append(dict(name="channel_127", kind="channel", qmin=-127, qmax=127, w=w, scales=scales))

    # 4. per channel, qmin -128 / qmax 127, with exact ties at -128.5 and 127.5.
    rng = np.random.default_rng(404)
    w = (rng.standard_normal((ROWS_C, COLS_C)) * rng.uniform(0.01, 0.2, (ROWS_C, 1))).astype(np.float32)
    scales = (np.abs(w).max(axis=1) / 127 * rng.uniform(0.5, 1.2, ROWS_C)).astype(np.float32)
    scales[3] = f32(2.0 ** -8)
    t = exact_ties(scales[3], [-129, -128, -127, -2, -1, 0, 1, 126, 127, 128])
    w[3, : len(t)] = t
    cases.append(dict(name="channel_m128", kind="channel", qmin=-128, qmax=127, w=w, scales=scales))
    return cases


def run_torch(case, dout):
    w = torch.from_numpy(case["w"]).clone().requires_grad_(True)
    scale = torch.from_numpy(case["scales"].astype(np.float32)).clone().requires_grad_(True)
    zp = torch.zeros(scale.numel())
    qmin, qmax = case["qmin"], case["qmax"]
    gf = 1.0 / (w.numel() * qmax) ** 0.5  # _LearnableFakeQuantize, use_grad_scaling=True
    if case["kind"] == "tensor":
        out = torch._fake_quantize_learnable_per_tensor_affine(w, scale, zp, qmin, qmax, gf)
    else:
        out = torch._fake_quantize_learnable_per_channel_affine(w, scale, zp, 0, qmin, qmax, gf)
    out.backward(torch.from_numpy(dout))
    return out.detach().numpy(), w.grad.numpy(), scale.grad.numpy().astype(np.float32), np.float32(gf)


def closed_form(case, dout, gf):
    """The formulas of quant/fake_quant.h in numpy float32; returns out, dw, dscale terms."""
    w = case["w"]
    s = case["scales"].astype(np.float32).reshape(-1, 1) if case["kind"] == "channel" \
        else case["scales"].astype(np.float32).reshape(1, 1)
    inv = np.float32(1) / s
    q = np.rint(w * inv)  # numpy rint: round half to even
    lo, hi = np.float32(case["qmin"]), np.float32(case["qmax"])
    qc = np.clip(q, lo, hi)
    out = qc * s
    inside = (q >= lo) & (q <= hi)
    dw = np.where(inside, dout, np.float32(0))
    d = (q.astype(np.float64) * s.astype(np.float64) - w.astype(np.float64)).astype(np.float32)
    t_in = dout * d * inv * gf
    t_out = np.where(q < lo, dout * lo * gf, dout * hi * gf)
    return out, dw, np.where(inside, t_in, t_out).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/qat")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    manifest = []
    for i, case in enumerate(make_cases()):
        rows, cols = case["w"].shape
        dout = np.random.default_rng(900 + i).standard_normal((rows, cols)).astype(np.float32)
        out, dw, dscale, gf = run_torch(case, dout)
        cf_out, cf_dw, terms = closed_form(case, dout, gf)
        assert np.array_equal(out, cf_out), case["name"] + ": forward differs from the closed form"
        assert np.array_equal(dw, cf_dw), case["name"] + ": dw differs from the closed form"
        cf_ds = terms.astype(np.float64).sum(axis=1) if case["kind"] == "channel" else terms.astype(np.float64).sum()
        scale_of = np.abs(terms).astype(np.float64).sum(axis=1 if case["kind"] == "channel" else None)
        err = np.max(np.abs(cf_ds - dscale) / scale_of)
        assert err < 1e-5, f"{case['name']}: dscale differs from the closed form ({err})"
        clipped = int(((np.rint(case["w"] * (np.float32(1) / case["scales"].reshape(-1, 1)
                                                   if case["kind"] == "channel" else np.float32(1) / case["scales"][0])))
                       .clip(-1e9, 1e9) > case["qmax"]).sum())
        sc = case["scales"].astype(np.float32).reshape(-1, 1)
        by_div = int((np.rint(case["w"] * (np.float32(1) / sc)) != np.rint(case["w"] / sc)).sum())
        blob = np.concatenate([a.astype("<f4").reshape(-1) for a in
                               (case["w"], dout, out, dw, case["scales"].astype(np.float32), dscale)])
        blob.tofile(os.path.join(args.out, case["name"] + ".f32"))
        manifest.append(dict(name=case["name"], kind=case["kind"], rows=int(rows), cols=int(cols),
                             qmin=case["qmin"], qmax=case["qmax"], grad_factor=float(gf),
                             scales=1 if case["kind"] == "tensor" else int(rows)))
        print(f"{case['name']}: {rows}x{cols} {case['kind']} qmin={case['qmin']} gf={gf!r} "
              f"above qmax: {clipped}, w*(1/s) and w/s round apart: {by_div}, dscale vs closed form (rel. to sum|t|): {err:.2e}")
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(dict(torch=torch.__version__,
                       layout="float32 LE: w, dout, out, dw (rows*cols each), scales, dscales (k each)",
                       cases=manifest), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
