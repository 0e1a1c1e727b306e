"""Reference-interpreter timings (backend="numpy"): the oracle must stay fast enough for tests.

usage: .venv/bin/python benchmarks/interp.py [--repeat N]
Prints the median wall time of each kernel, with the contraction fast path (einsum over strided
views) and with the generic chunked broadcast path forced, and checks each result against numpy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tcdsl as tc
from tcdsl import interp

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
CONV = ("def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {"
        " O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * Wt(f,r_c,r_kh,r_kw) }")


def median_time(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    A = rng.standard_normal((256, 256), dtype=np.float32)
    B = rng.standard_normal((256, 256), dtype=np.float32)
    I = rng.standard_normal((64, 64, 30, 30), dtype=np.float32)
    W = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    mm, conv = tc.define(MM), tc.define(CONV)
    win = np.lib.stride_tricks.sliding_window_view(I, (3, 3), axis=(2, 3))
    cases = [("matmul 256x256x256", mm, (A, B), A @ B),
             ("conv 64x64x30x30, 64 filters 3x3", conv, (I, W), np.einsum("nchwij,fcij->nfhw", win, W, optimize=True))]
    print(f"{'kernel':<36} {'fast path':>10} {'generic':>10}  max rel err")
    for name, k, args, want in cases:
        def call(k=k, args=args):
            return k(*args, backend="numpy")

        fast = median_time(call, a.repeat)
        saved = interp._einsum
        interp._einsum = lambda *x: False
        try:
            generic = median_time(call, max(1, a.repeat // 2))
            got = k(*args, backend="numpy")
        finally:
            interp._einsum = saved
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"{name:<36} {fast:9.3f}s {generic:9.3f}s  {err:.1e}")


if __name__ == "__main__":
    main()
