#!/usr/bin/env python3
"""Writes the reference data for tests/test_half.c, test_quantize.c and test_matmul.c into
tests/fixtures/quant/, computed with numpy and torch (independent of qlm's C code).

  f16_to_f32.bin  every float16 bit pattern 0..65535 as float32 bits (uint32 little-endian), numpy
  f32_cases.txt   "f32_bits f16_bits bf16_bits" per line: numpy float32->float16, torch float32->bfloat16
                  (both round to nearest even) for edge cases and random bit patterns
  quantize.txt    matrices with their symmetric INT8 quantization per tensor and per row:
                  s = max|w| / 127 (float32), q = round_half_away_from_zero(w / s) clamped to +-127
  matmul.txt      y = x W^T + b in float64 (torch) for W stored as f32 / f16 / bf16 / int8 per row
                  (x in the activation form of W: rounded to bf16 for bf16 W; for int8 W, 16-bit
                  integers q = rint(x * (32767 / max|x|)) times the row scale max|x| / 32767)

Run from the repository root: python3 tools/make_quant_fixtures.py
"""
import os

import numpy as np
import torch

OUT = os.path.join("tests", "fixtures", "quant")
rng = np.random.default_rng(20240611)


def bits32(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def hexs(u):
    return " ".join("%08x" % int(v) for v in np.asarray(u).ravel())


def write_f16_table():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        f = h.astype(np.float32)
    bits32(f).astype("<u4").tofile(os.path.join(OUT, "f16_to_f32.bin"))


def f32_cases():
    u = [
        0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000,
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0x7FFFFFFF,  # NaNs: compared as NaN only
        0x3F801000,  # 1 + 2^-11: f16 tie, rounds to even (1.0)
        0x3F803000,  # 1 + 3*2^-11: f16 tie, rounds up
        0x3F801001, 0x3F800FFF,
        0x3F808000,  # 1 + 2^-8: bf16 tie -> 1.0
        0x3F818000,  # 1 + 3*2^-8: bf16 tie -> up
        0x477FE000,  # 65504, f16 max
        0x477FEFFF, 0x477FF000, 0x477FF001,  # around 65520 (f16 overflow tie)
        0x47800000, 0x7F7FFFFF, 0xFF7FFFFF,  # 65536, f32 max
        0x38800000, 0x387FFFFF, 0x387FE000, 0x387FF000,  # f16 smallest normal and just below
        0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF,  # 2^-24, 2^-25 (tie to 0) and neighbours
        0x33C00000,  # 1.5 * 2^-24: tie -> 2 * 2^-24
        0x34200000,  # 2.5 * 2^-24: tie -> 2 * 2^-24
        0x00000001, 0x807FFFFF, 0x00800000,  # f32 subnormals
        0x7F7F8000, 0x7F7F7FFF,  # bf16 overflow tie region
    ]
    rand_any = rng.integers(0, 2**32, size=1500, dtype=np.uint64).astype(np.uint32)
    # Concentrate on exponents that f16 represents or rounds into (2^-26 .. 2^17).
    exps = rng.integers(127 - 26, 127 + 17, size=1500).astype(np.uint32)
    mant = rng.integers(0, 2**23, size=1500, dtype=np.uint64).astype(np.uint32)
    sign = rng.integers(0, 2, size=1500).astype(np.uint32) << 31
    rand_half = sign | (exps << 23) | mant
    u = np.concatenate([np.array(u, dtype=np.uint32), rand_any, rand_half])
    f = u.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = f.astype(np.float16).view(np.uint16)
    b = torch.from_numpy(f.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    with open(os.path.join(OUT, "f32_cases.txt"), "w") as fh:
        fh.write("# f32_bits f16_bits bf16_bits (numpy / torch, round to nearest even)\n")
        for a, c, d in zip(u, h, b):
            fh.write("%08x %04x %04x\n" % (a, c, d))


def quant_rows(w):
    """Per-row (or, for a 1-row view of the whole tensor, per-tensor) scales and q, in float32."""
    w = w.astype(np.float32)
    absmax = np.abs(w).max(axis=1).astype(np.float32)
    s = (absmax / np.float32(127)).astype(np.float32)
    s[~(s > 0)] = np.float32(1)
    t = (w / s[:, None]).astype(np.float32).astype(np.float64)
    q = np.sign(t) * np.floor(np.abs(t) + 0.5)
    return s, np.clip(q, -127, 127).astype(np.int32)


def write_quantize():
    # A: absmax 127 so the per-tensor scale is exactly 1 and the .5 values are exact ties.
    a = rng.integers(-254, 255, size=(6, 37)).astype(np.float32) / 2
    a[2, 5] = 127.0
    a[3, :4] = [0.5, -0.5, 2.5, -3.5]
    # B: Gaussian rows, one zero row, one tiny row, one with an outlier.
    b = (rng.standard_normal((9, 53)) * 0.02).astype(np.float32)
    b[1] = 0
    b[4] *= np.float32(1e-30)
    b[6, 17] = 3.0
    with open(os.path.join(OUT, "quantize.txt"), "w") as fh:
        fh.write("# per matrix: dims, w bits, per-tensor scale bits and q, per-row scale bits and q\n")
        for w in (a, b):
            st, qt = quant_rows(w.reshape(1, -1))
            sr, qr = quant_rows(w)
            fh.write("matrix %d %d\n" % w.shape)
            fh.write("w %s\n" % hexs(bits32(w)))
            fh.write("tensor_scale %s\n" % hexs(bits32(st)))
            fh.write("tensor_q %s\n" % " ".join(str(v) for v in qt.ravel()))
            fh.write("row_scales %s\n" % hexs(bits32(sr)))
            fh.write("row_q %s\n" % " ".join(str(v) for v in qr.ravel()))


def i16_form(x):
    """Rows of x as int8 weights multiply them in qlm: q = round-half-even(x * (32767 / max|x|)),
    computed in float32, times s = max|x| / 32767 (float32), per row."""
    x = x.astype(np.float32)
    absmax = np.abs(x).max(axis=1).astype(np.float32)
    inv = (np.float32(32767) / absmax).astype(np.float32)
    s = (absmax / np.float32(32767)).astype(np.float32)
    q = np.rint((x * inv[:, None]).astype(np.float32))
    return q.astype(np.float64) * s.astype(np.float64)[:, None]


def write_matmul():
    n, rows, cols = 5, 11, 45
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    wt = torch.from_numpy(w)
    s, q = quant_rows(w)
    deq = {
        "f32": wt.double(),
        "f16": wt.half().double(),
        "bf16": wt.bfloat16().double(),
        "int8_rows": torch.from_numpy(q.astype(np.float64) * s.astype(np.float64)[:, None]),
    }
    xt, bt = torch.from_numpy(x).double(), torch.from_numpy(b).double()
    # BF16 weights multiply x rounded to bf16, as torch's bf16 matmul does; int8 weights x in
    # 16-bit integers with a row scale (qlm_x_dtype).
    x_for = {"bf16": torch.from_numpy(x).bfloat16().double(), "int8_rows": torch.from_numpy(i16_form(x))}
    with open(os.path.join(OUT, "matmul.txt"), "w") as fh:
        fh.write("# n rows cols, x/w/bias float32 bits, then y = x W^T + bias in float64 per weight dtype\n")
        fh.write("dims %d %d %d\n" % (n, rows, cols))
        fh.write("x %s\n" % hexs(bits32(x)))
        fh.write("w %s\n" % hexs(bits32(w)))
        fh.write("bias %s\n" % hexs(bits32(b)))
        for name, wd in deq.items():
            y = (x_for.get(name, xt) @ wd.T + bt).numpy()
            fh.write("y_%s %s\n" % (name, " ".join("%.17g" % v for v in y.ravel())))


def main():
    os.makedirs(OUT, exist_ok=True)
    write_f16_table()
    f32_cases()
    write_quantize()
    write_matmul()


if __name__ == "__main__":
    main()
