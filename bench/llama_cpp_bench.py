#!/usr/bin/env python3
"""Dev-time comparison for `make bench`: llama.cpp (through llama-cpp-python) decode and prefill
speed on the default model requantized to Q8_0. Prints one summary line. Never used by qlm."""
import ctypes
import os
import sys
import tempfile
import time

import llama_cpp


def main():
    src, threads = sys.argv[1], int(sys.argv[2])
    q8 = os.path.join(tempfile.gettempdir(), "qlm-bench-smollm2-q8_0.gguf")
    if not os.path.exists(q8):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True  # the source is Q4_1
        ok = llama_cpp.llama_model_quantize(src.encode(), q8.encode(), ctypes.byref(params))
        if ok != 0:
            raise SystemExit("quantize failed")
    llm = llama_cpp.Llama(model_path=q8, n_ctx=1024, n_threads=threads, n_batch=512, verbose=False)
    prompt = list(range(100, 612))
    t0 = time.perf_counter()
    llm.eval(prompt)
    pp = len(prompt) / (time.perf_counter() - t0)
    llm.reset()
    llm.eval([1])
    t0 = time.perf_counter()
    for i in range(128):
        llm.eval([100 + i])
    tg = 128 / (time.perf_counter() - t0)
    print(f"pp512 {pp:.1f} tok/s, tg128 {tg:.1f} tok/s")


if __name__ == "__main__":
    main()
