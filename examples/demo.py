"""A short tour of tcdsl: define kernels in TC, compile them to parallel C, run them on numpy arrays
and check them against numpy and against tcdsl's reference interpreter.

Run with ``make demo`` (or ``.venv/bin/python examples/demo.py``). Exits non-zero if any result
differs from numpy.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tcdsl as tc

rng = np.random.default_rng(0)
failures = 0


def check(title: str, got: np.ndarray, want: np.ndarray, seconds: float, rtol: float = 1e-4) -> None:
    global failures
    err = float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))
    ok = got.shape == want.shape and err <= rtol
    failures += not ok
    mark = "ok " if ok else "BAD"
    print(f"  {mark} {title:<44} shape {str(got.shape):<18} rel err {err:.1e}  {seconds * 1e3:7.1f} ms")


def timed(fn, *args):
    """Run once (the first call compiles for these shapes), then time a second call."""
    fn(*args)
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


print("1. A def, checked: ranges are inferred from the reads")
lib = tc.define("""
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) Bias) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * Wt(f, r_c, r_kh, r_kw)
    O(n, f, h, w)  = O(n, f, h, w) + Bias(f)
}
def softmax(float(N, D) X) -> (Y) {
    mx(n) max=! X(n, r_d)                 # temporaries: written, not listed as outputs
    ex(n, d) = exp(X(n, d) - mx(n))
    sm(n) +=! ex(n, r_d)
    Y(n, d) = ex(n, d) / sm(n)
}
def same_conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    # a range wider than the reads allow: the statement runs only where they are in bounds
    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W
}
def embed(float(E, D) Table, int32(B, L) Idx) -> (O) {
    O(b, d) +=! Table(Idx(b, r_l), d)     # a gather, bounds-checked at run time
}
""")
print(lib.conv2d)
print()

print("2. Compile to C (isl schedule, tiles, OpenMP, SIMD) and run on numpy arrays; compare with numpy")
A = rng.standard_normal((256, 256), dtype=np.float32)
B = rng.standard_normal((256, 256), dtype=np.float32)
C, s = timed(lib.matmul, A, B)
check("matmul 256x256x256", C, A.astype(np.float64) @ B, s)

I = rng.standard_normal((4, 16, 30, 30), dtype=np.float32)
Wt = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
Bias = rng.standard_normal(32, dtype=np.float32)
O, s = timed(lib.conv2d, I, Wt, Bias)
win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (3, 3), axis=(2, 3))
check("conv2d + bias 4x16x30x30, 32 filters 3x3", O, np.einsum("nchwij,fcij->nfhw", win, Wt) + Bias[:, None, None], s)

X = rng.standard_normal((512, 1000), dtype=np.float32)
Y, s = timed(lib.softmax, X)
e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
check("softmax 512x1000", Y, e / e.sum(1, keepdims=True), s)

O, s = timed(lib.same_conv, I, Wt)
pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3))
check("'same' conv by padding by domain", O, np.einsum("nchwij,fcij->nfhw", win, Wt), s)

Table = rng.standard_normal((1000, 64), dtype=np.float32)
Idx = rng.integers(0, 1000, size=(32, 20), dtype=np.int32)
O, s = timed(lib.embed, Table, Idx)
check("embedding bag 32x20 over 1000x64", O, Table.astype(np.float64)[Idx].sum(1), s)

print()
print("   ... and the same kernels on the reference interpreter (backend='numpy')")
C, s = timed(lambda a, b: lib.matmul(a, b, backend="numpy"), A, B)
check("matmul 256x256x256, interpreter", C, A.astype(np.float64) @ B, s)
O, s = timed(lambda *a: lib.same_conv(*a, backend="numpy"), I, Wt)
check("'same' conv, interpreter", O, np.einsum("nchwij,fcij->nfhw", win, Wt), s)

print()
print("   Why each loop of the compiled matmul is (or is not) parallel:")
print("\n".join("   " + line for line in lib.matmul.explain(A, B).split("loops:\n")[1].splitlines()))

print()
print("3. The short form: inputs from the function's parameters, types and sizes from the arguments")


@tc.define("C(i, j) +=! A(i, k) * B(k, j)")
def matmul(A, B): ...


Ad = rng.standard_normal((64, 48))
Bd = rng.standard_normal((48, 32))
C, s = timed(matmul, Ad, Bd)
check("float64 matmul 64x48x32 (short form)", C, Ad @ Bd, s, rtol=1e-12)

print()
print("4. The GPU mapping: tiles to blocks, points to threads, shared memory, barriers")
print("   (CUDA text on any machine; run as OpenCL where a platform exists: PoCL runs it on the CPU)")
from tcdsl import gpurt  # noqa: E402

A, B = A[:100, :70].copy(), B[:70, :90].copy()
low = lib.matmul.lowered_gpu(A, B, backend="cuda")
for kern in low.program.kernels:
    print(f"   {kern.name}: grid {kern.grid}, block {kern.block}, {kern.shared_bytes} bytes of shared memory")
if gpurt.opencl_available():
    C, s = timed(lambda a, b: lib.matmul(a, b, backend="opencl"), A, B)
    check("matmul 100x70x90 on OpenCL", C, A.astype(np.float64) @ B, s)
else:
    print("   no OpenCL platform here (Debian: pocl-opencl-icd): skipped running it")

print()
print("5. Errors are located and explained")
for bad, args in [
    ("def f(float(N) A) -> (B) {\n  B(i) += A(i)\n}", (np.ones(3, np.float32),)),  # updates B: needs out=B
    ("def f(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}",
     (np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))),
    ("def f(float(E, D) T, int32(B) Idx) -> (O) {\n  O(b, d) = T(Idx(b), d)\n}",
     (np.ones((3, 2), np.float32), np.array([0, 7], np.int32))),
]:
    try:
        k = tc.define(bad)
        k(*args)
        print("  BAD: no error raised")
        failures += 1
    except tc.TcError as err:
        print(f"  {type(err).__name__}: {err}\n")

print("all results match numpy" if not failures else f"{failures} result(s) differ from numpy")
sys.exit(1 if failures else 0)
