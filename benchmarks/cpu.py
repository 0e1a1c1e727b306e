"""CPU benchmark: tcdsl's C backend against numpy/BLAS and PyTorch eager, side by side in one process.

usage: .venv/bin/python benchmarks/cpu.py [--only NAME[,NAME...]] [--rounds N] [--no-torch] [--options JSON]
                                          [--peers-isa avx2]

Every contender runs in this one process, timed round-robin (each round times one call of each
contender, the starting contender rotating), so that the load of a shared machine hits all alike;
the table shows each contender's median. Before each timed call the script waits until the thread
pools of the previous call have stopped spinning (see quiesce()). Warm-up calls come first;
tcdsl's compile is timed apart.
Every tcdsl result is checked against numpy: a mismatch is marked FAIL and the exit status is 1.
A STREAM-like triad measured here gives the machine's bandwidth for the memory-bound kernels: its
best before and after the kernels, and its median as one more contender in their rounds (the
fractions of the targets compare medians from the same rounds).
Its compute-bound counterpart is the float32 FMA peak (a C loop of independent vector multiply-adds
in registers, built by tcdsl's toolchain, best before and after the kernels): the compute table
gives each contender's GFLOP/s, tcdsl's fraction of the peak and the fastest time the peak allows.
The closing "targets" section says which performance targets are met, judged on the medians, with
the median of the rounds' own ratios and its distribution-free 95% interval (the order statistics
of a sign test): where that interval holds the target, the verdict rests on the host's noise.
With --tune SECONDS each kernel is autotuned for that long; its tuned options are then timed against
the defaults in 20 interleaved rounds of their own, printed beside the tuner's own keep-or-drop decision.

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (set on some machines) slow numpy's BLAS down; this script
unsets both for its own process before numpy loads (re-executing itself when they were set).
"""

from __future__ import annotations

import os
import sys

_BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_UNSET_MARK = "TCDSL_BENCH_UNSET_BLAS_ENV"  # records, across the re-exec, what was unset


# --peers-isa avx2: numpy's OpenBLAS, torch's ATen and oneDNN kernels limited to AVX2, as on a
# machine without AVX-512 (run with TCDSL_CPU=avx2 to compare tcdsl's AVX2 code with theirs). torch's
# float32 matmul and linear call MKL's sgemm, which oneDNN's limit does not reach: on a Xeon, torch's
# 128x1024 -> 1024 linear ran 288 GFLOP/s under the other limits alone, above the AVX2 FMA peak (235)
_PEERS_AVX2 = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
               "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
_PEERS_MARK = "TCDSL_BENCH_PEERS_ISA"


def _clean_blas_env() -> None:
    """Unset the OpenBLAS overrides (or, with --peers-isa avx2, set the peers' AVX2 limits), then
    re-exec so that numpy's BLAS and torch start from that environment."""
    avx2 = "--peers-isa=avx2" in sys.argv or any(a == "--peers-isa" and b == "avx2"
                                                  for a, b in zip(sys.argv, sys.argv[1:]))
    if avx2:
        if os.environ.get(_PEERS_MARK) == "avx2":
            return
        os.environ.update(_PEERS_AVX2)
        os.environ.pop("OPENBLAS_L2_SIZE", None)
        os.environ[_PEERS_MARK] = "avx2"
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
    found = [f"{v}={os.environ[v]}" for v in _BLAS_ENV if v in os.environ]
    if not found:
        return
    for v in _BLAS_ENV:
        os.environ.pop(v, None)
    os.environ[_UNSET_MARK] = " ".join(found)
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


if __name__ == "__main__":
    _clean_blas_env()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

import tcdsl as tc  # noqa: E402
from tcdsl import bench  # noqa: E402
from tcdsl.options import MappingOptions  # noqa: E402
from tcdsl.tuner.decide import median_interval  # noqa: E402

F32 = np.float32
RTOL = 1e-4  # max |tcdsl - numpy| / max |numpy|; float32 sums of <= 1024 terms stay far below this
TIME_BUDGET_S = 2.0  # auto rounds: about this much timing per kernel (all contenders together)
MIN_ROUNDS, MAX_ROUNDS = 7, 40
PRECALL_BELOW_S = 0.25  # a contender faster than this makes an untimed call right before each timed one
TRIAD_N = 32 << 20  # 32M float32 per array
TRIAD_REPS = 20
FMA_REPS = 7  # best of this many runs of the FMA peak loop
FMA_RUN_S = 0.075  # seconds per run
OUT = "tcdsl out="  # memory-bound kernels only: tcdsl writing into a preallocated output
TRIAD = "triad"  # memory-bound kernels only: numpy's threaded triad, timed in the same rounds
TUNED = "tcdsl tuned"  # with --tune: the options the autotuner found for this kernel
TUNE_ROUNDS = 20  # with --tune: interleaved rounds of the tuned options against the defaults, right after tuning
COMPILE_TARGET_S = 0.5  # the median of the kernels' first builds (compile s)
COMPILED = "torch.compile"  # with --tune: maxpool's torch.compile contender (its tuned target)

# ----------------------------------------------------------------------------------------------
# TC sources

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,r_k) * B(n,r_k) }"
BMM = "def bmm(float(Bt,M,K) A, float(Bt,K,N) B) -> (C) { C(b,m,n) +=! A(b,m,r_k) * B(b,r_k,n) }"
CONV2D = """def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
}"""
CONV2D_SAME = """def conv2d_same(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H, w in 0:W
}"""
GROUP_CONV = """def group_conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,r_c,h + r_kh,w + r_kw) * W1(g,f,r_c,r_kh,r_kw)
}"""
FC_RELU = """def fc_relu(float(B,M) I, float(N,M) W1, float(N) B1) -> (O) {
    O(b,n) +=! I(b,r_m) * W1(n,r_m)
    O(b,n) = fmax(O(b,n) + B1(n), 0.0)
}"""
MLP2 = """def mlp2(float(B,M) I, float(N,M) W1, float(N) B1, float(P,N) W2, float(P) B2) -> (O2) {
    O1(b,n) +=! I(b,r_m) * W1(n,r_m)
    O1(b,n) = fmax(O1(b,n) + B1(n), 0.0)
    O2(b,p) +=! O1(b,r_n) * W2(p,r_n)
    O2(b,p) = fmax(O2(b,p) + B2(p), 0.0)
}"""
SOFTMAX = """def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n,r_d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,r_d)
    Y(n,d) = e(n,d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N,D) X) -> (Y) {
    s(n) +=! X(n,r_d)
    mu(n) = s(n) / float(D)
    v(n) +=! (X(n,r_d) - mu(n)) * (X(n,r_d) - mu(n))
    Y(n,d) = (X(n,d) - mu(n)) * rsqrt(v(n) / float(D) + 1e-5)
}"""
ELEMENTWISE = "def tanh_fma(float(N) A, float(N) B, float(N) C) -> (O) { O(i) = tanh(A(i) * B(i) + C(i)) }"
TRANSPOSE = "def transpose(float(M,N) A) -> (O) { O(j,i) = A(i,j) }"
MAXPOOL = """def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw) where r_kh in 0:2, r_kw in 0:2
}"""

# ----------------------------------------------------------------------------------------------
# numpy references (what a numpy user would write: BLAS where it applies, im2col for convolutions)


def np_conv2d(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    win = sliding_window_view(I, W.shape[2:], axis=(2, 3))  # (N, C, H', W', KH, KW)
    return np.ascontiguousarray(np.einsum("nchwij,fcij->nfhw", win, W, optimize=True))


def np_conv2d_same(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np_conv2d(np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))), W)


def np_group_conv(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    N, G, C, _, _ = I.shape
    _, F, _, KH, KW = W.shape
    win = sliding_window_view(I, (KH, KW), axis=(3, 4))  # (N, G, C, H', W', KH, KW)
    Ho, Wo = win.shape[3], win.shape[4]
    cols = win.transpose(1, 0, 3, 4, 2, 5, 6).reshape(G, N * Ho * Wo, C * KH * KW)  # im2col (a copy)
    out = np.matmul(cols, W.reshape(G, F, C * KH * KW).transpose(0, 2, 1))  # (G, N*H'*W', F), BLAS per group
    return np.ascontiguousarray(out.reshape(G, N, Ho, Wo, F).transpose(1, 0, 4, 2, 3))


def np_fc_relu(I: np.ndarray, W1: np.ndarray, B1: np.ndarray) -> np.ndarray:
    O = I @ W1.T
    O += B1
    return np.maximum(O, 0, out=O)


def np_mlp2(I: np.ndarray, W1: np.ndarray, B1: np.ndarray, W2: np.ndarray, B2: np.ndarray) -> np.ndarray:
    return np_fc_relu(np_fc_relu(I, W1, B1), W2, B2)


def np_softmax(X: np.ndarray) -> np.ndarray:
    e = X - X.max(axis=1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e


def np_layernorm(X: np.ndarray) -> np.ndarray:
    d = X - X.mean(axis=1, keepdims=True)
    var = np.einsum("nd,nd->n", d, d)[:, None] / F32(X.shape[1])
    d *= 1 / np.sqrt(var + F32(1e-5))
    return d


def np_tanh_fma(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    t = A * B
    t += C
    return np.tanh(t, out=t)


def np_maxpool(I: np.ndarray) -> np.ndarray:
    # the max of the four strided corners: several times faster than reshape(...).max(axis=(3, 5))
    O = np.maximum(I[:, :, 0::2, 0::2], I[:, :, 0::2, 1::2])
    np.maximum(O, I[:, :, 1::2, 0::2], out=O)
    return np.maximum(O, I[:, :, 1::2, 1::2], out=O)


# ----------------------------------------------------------------------------------------------
# torch eager references (built once torch is imported)


def torch_impls(torch: Any) -> dict[str, Callable[..., Any]]:
    F = torch.nn.functional

    def group_conv(I: Any, W: Any) -> Any:
        N, G, C, H, Wd = I.shape
        _, Fo, _, KH, KW = W.shape
        O = F.conv2d(I.reshape(N, G * C, H, Wd), W.reshape(G * Fo, C, KH, KW), groups=G)
        return O.reshape(N, G, Fo, O.shape[2], O.shape[3])

    return {
        "matmul": torch.matmul,
        "tmm": lambda A, B: torch.matmul(A, B.t()),
        "bmm": torch.bmm,
        "conv2d": F.conv2d,
        "conv2d_same": lambda I, W: F.conv2d(I, W, padding=1),
        "group_conv": group_conv,
        "fc_relu": lambda I, W1, B1: F.relu(F.linear(I, W1, B1)),
        "mlp2": lambda I, W1, B1, W2, B2: F.relu(F.linear(F.relu(F.linear(I, W1, B1)), W2, B2)),
        "softmax": lambda X: torch.softmax(X, dim=1),
        "layernorm": lambda X: F.layer_norm(X, X.shape[1:]),
        "tanh_fma": lambda A, B, C: torch.tanh(A * B + C),
        "transpose": lambda A: A.t().contiguous(),
        "maxpool": lambda I: F.max_pool2d(I, 2, 2),
    }


# ----------------------------------------------------------------------------------------------
# flop counts of the compute-bound kernels, from their input shapes (a multiply-add counts 2)


def matmul_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """C(m,n) += A(m,k) * B(k,n)."""
    (m, k), (_, n) = a, b
    return 2 * m * n * k


def tmm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """C(m,n) += A(m,k) * B(n,k)."""
    (m, k), (n, _) = a, b
    return 2 * m * n * k


def bmm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """C(b,m,n) += A(b,m,k) * B(b,k,n)."""
    (bt, m, k), (_, _, n) = a, b
    return 2 * bt * m * n * k


def conv2d_flops(i: tuple[int, ...], w: tuple[int, ...]) -> int:
    """A valid convolution (no padding, stride 1): the output is (H-KH+1) x (W-KW+1)."""
    (n, c, h, wd), (f, _, kh, kw) = i, w
    return 2 * n * f * (h - kh + 1) * (wd - kw + 1) * c * kh * kw


def group_conv_flops(i: tuple[int, ...], w: tuple[int, ...]) -> int:
    """G independent valid convolutions of C to F channels."""
    (n, g, c, h, wd), (_, f, _, kh, kw) = i, w
    return 2 * n * g * f * (h - kh + 1) * (wd - kw + 1) * c * kh * kw


def fc_relu_flops(i: tuple[int, ...], w1: tuple[int, ...], _b1: tuple[int, ...]) -> int:
    """The product I * W1^T only: the bias and the relu add B*N operations, negligible."""
    (b, m), (n, _) = i, w1
    return 2 * b * n * m


def mlp2_flops(i: tuple[int, ...], w1: tuple[int, ...], _b1: tuple[int, ...], w2: tuple[int, ...],
               _b2: tuple[int, ...]) -> int:
    """Both products (biases and relus left out): I * W1^T, then O1 * W2^T."""
    (b, m), (n, _), (p, _) = i, w1, w2
    return 2 * b * n * m + 2 * b * p * n


FLOP_COUNTS: dict[str, Callable[..., int]] = {  # by Case.torch_key
    "matmul": matmul_flops,
    "tmm": tmm_flops,
    "bmm": bmm_flops,
    "conv2d": conv2d_flops,
    "conv2d_same": lambda i, w: conv2d_flops((i[0], i[1], i[2] + 2, i[3] + 2), w),  # padded by 1: H x W out
    "group_conv": group_conv_flops,
    "fc_relu": fc_relu_flops,
    "mlp2": mlp2_flops,
}


# ----------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    name: str  # what --only matches, and the first column
    shape: str
    source: str
    torch_key: str
    numpy_fn: Callable[..., np.ndarray]
    input_shapes: Sequence[tuple[int, ...]]
    bytes_moved: int = 0  # memory-bound kernels: the bytes one call must read and write (no write-allocate)
    flops: int = 0  # compute-bound kernels: the floating-point operations of one call (a multiply-add is 2)


@dataclass
class Result:
    case: Case
    times: dict[str, float] = field(default_factory=dict)  # contender -> median seconds
    best: dict[str, float] = field(default_factory=dict)  # contender -> min seconds
    # contender -> the median over rounds of its time / tcdsl's in the same round: a slow spell of
    # the host that spans a round slows both sides of its ratio alike
    paired: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # contender -> seconds per round
    rounds: int = 0
    compile_s: float | None = None
    rel_err: float | None = None
    status: str = "ok"  # ok | FAIL | ERROR
    note: str = ""
    tuned: Any = None  # the TuneResult, with --tune
    side: dict[str, list[float]] = field(default_factory=dict)  # with --tune: "tuned"/"default" -> seconds per round
    tune_s: float = 0.0  # wall time of the search


def cases() -> list[Case]:
    n_ew = 1 << 24
    all_cases = [
        Case("matmul_1024", "1024x1024x1024", MATMUL, "matmul", lambda A, B: A @ B, [(1024, 1024), (1024, 1024)]),
        Case("matmul_256", "256x256x256", MATMUL, "matmul", lambda A, B: A @ B, [(256, 256), (256, 256)]),
        Case("matmul_960", "960x1088x1000 (not powers of two)", MATMUL, "matmul", lambda A, B: A @ B,
             [(960, 1000), (1000, 1088)]),
        Case("tmm_1024", "1024x1024x1024, C=A*B^T", TMM, "tmm", lambda A, B: A @ B.T, [(1024, 1024), (1024, 1024)]),
        Case("bmm", "64 x 128x128x128", BMM, "bmm", np.matmul, [(64, 128, 128), (64, 128, 128)]),
        Case("conv2d", "N8 C64 56x56 F64 3x3", CONV2D, "conv2d", np_conv2d, [(8, 64, 56, 56), (64, 64, 3, 3)]),
        Case("conv2d_46", "N8 C64 46x46 F64 3x3", CONV2D, "conv2d", np_conv2d, [(8, 64, 46, 46), (64, 64, 3, 3)]),
        Case("conv2d_same", "N8 C64 56x56 F64 3x3, padded by 1", CONV2D_SAME, "conv2d_same", np_conv2d_same,
             [(8, 64, 56, 56), (64, 64, 3, 3)]),
        Case("group_conv", "N32 G32 C=F=16 28x28 3x3", GROUP_CONV, "group_conv", np_group_conv,
             [(32, 32, 16, 28, 28), (32, 16, 16, 3, 3)]),
        Case("fc_relu", "128x1024 -> 1024", FC_RELU, "fc_relu", np_fc_relu, [(128, 1024), (1024, 1024), (1024,)]),
        Case("mlp2", "128x1024 -> 1024 -> 512", MLP2, "mlp2", np_mlp2,
             [(128, 1024), (1024, 1024), (1024,), (512, 1024), (512,)]),
        Case("softmax", "4096x1024", SOFTMAX, "softmax", np_softmax, [(4096, 1024)]),
        Case("layernorm", "4096x1024", LAYERNORM, "layernorm", np_layernorm, [(4096, 1024)]),
        Case("tanh_fma", "tanh(A*B+C), 16M", ELEMENTWISE, "tanh_fma", np_tanh_fma, [(n_ew,)] * 3,
             bytes_moved=4 * 4 * n_ew),
        Case("transpose", "4096x4096", TRANSPOSE, "transpose", lambda A: np.ascontiguousarray(A.T), [(4096, 4096)],
             bytes_moved=2 * 4 * 4096 * 4096),
        Case("maxpool", "2x2/2, N32 C64 56x56", MAXPOOL, "maxpool", np_maxpool, [(32, 64, 56, 56)],
             bytes_moved=4 * 32 * 64 * (56 * 56 + 28 * 28)),
    ]
    for c in all_cases:
        if c.torch_key in FLOP_COUNTS:
            c.flops = FLOP_COUNTS[c.torch_key](*c.input_shapes)
    return all_cases


# ----------------------------------------------------------------------------------------------
# machine description and bandwidth


def describe_machine(torch: Any, torch_note: str, options: MappingOptions) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    print("## machine")
    print(f"- cpu: {cpu}, os.cpu_count() = {os.cpu_count()}, OMP_NUM_THREADS = {os.environ.get('OMP_NUM_THREADS')}")
    print(f"- python {platform.python_version()}, numpy {np.__version__}, tcdsl {tc.__version__}")
    try:
        from tcdsl.codegen import toolchain

        print(f"- C compiler: {' '.join(toolchain.compiler())}")
        print(f"- CPU target (TCDSL_CPU={os.environ.get('TCDSL_CPU', 'native')}): {toolchain.target()}")
    except Exception as e:  # the toolchain module is not ours; a change there must not stop the benchmark
        print(f"- C compiler: unknown ({e})")
    unset = os.environ.get(_UNSET_MARK)
    print(f"- BLAS environment: {'unset for this process: ' + unset if unset else 'no OPENBLAS_CORETYPE/L2_SIZE set'}")
    if os.environ.get(_PEERS_MARK) == "avx2":
        print(f"- peers limited to AVX2 (--peers-isa avx2): {', '.join(f'{k}={v}' for k, v in _PEERS_AVX2.items())}")
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            print(f"- threadpool {info.get('user_api')}: {info.get('internal_api')} {info.get('version')}, "
                  f"architecture {info.get('architecture')}, num_threads {info.get('num_threads')} "
                  f"({os.path.basename(info.get('filepath', ''))})")
    except ImportError:
        print("- threadpoolctl not installed: cannot tell which BLAS kernel numpy runs")
    if torch is not None:
        print(f"- torch {torch.__version__}, {torch.get_num_threads()} threads")
    else:
        print(f"- torch: {torch_note}")
    print(f"- tcdsl mapping options: {options.to_json()}")
    print(f"- load average (1, 5, 15 min): {load_avg()}")
    print()


def load_avg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


class Triad:
    """a = b + s*c on 32M float32 (3 arrays * 4 bytes per element, TRIAD_BYTES per call).

    numpy has no fused triad, so it runs in L2-sized chunks (a = c*s, then a += b while the chunk of
    a is still in cache): memory sees exactly one read of b and c and one write of a. ``threaded``
    splits it over all cores (ufuncs release the GIL); ``single`` runs it on one thread.
    """

    def __init__(self) -> None:
        n = TRIAD_N
        self.a = np.zeros(n, F32)
        self.b = np.full(n, 1.0, F32)
        self.c = np.full(n, 2.0, F32)
        self.threads = os.cpu_count() or 1
        self.pool = ThreadPoolExecutor(self.threads)

    def part(self, lo: int, hi: int) -> None:
        chunk, s = 1 << 16, F32(3.0)
        for i in range(lo, hi, chunk):
            j = min(i + chunk, hi)
            x = self.a[i:j]
            np.multiply(self.c[i:j], s, out=x)
            np.add(x, self.b[i:j], out=x)

    def single(self) -> None:
        self.part(0, TRIAD_N)

    def threaded(self) -> None:
        step = -(-TRIAD_N // self.threads)
        list(self.pool.map(lambda t: self.part(t * step, min(TRIAD_N, (t + 1) * step)), range(self.threads)))

    def check(self) -> None:
        if not np.allclose(self.a[:: TRIAD_N // 7], 7.0):
            raise SystemExit("triad: wrong result")


TRIAD_BYTES = 3 * 4 * TRIAD_N


def measure_triad(torch: Any, triad: Triad) -> dict[str, float]:
    """Best-of-N GB/s of the triad per variant: numpy on one thread, on all cores, and torch's
    one-pass triad."""
    variants: list[tuple[str, Callable[[], Any]]] = [("numpy, 1 thread", triad.single),
                                                     (f"numpy, {triad.threads} threads", triad.threaded)]
    if torch is not None:
        ta, tb, tcc = (torch.from_numpy(x) for x in (triad.a, triad.b, triad.c))
        variants.append((f"torch.add, {torch.get_num_threads()} threads",
                         lambda: torch.add(tb, tcc, alpha=3.0, out=ta)))
    gbs: dict[str, float] = {}
    for name, fn in variants:
        fn()
        quiesce()
        best = math.inf
        for _ in range(TRIAD_REPS):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        gbs[name] = TRIAD_BYTES / best / 1e9
    triad.check()
    return gbs


def triad_report(before: dict[str, float], after: dict[str, float]) -> float:
    """Print the triads measured before and after the kernels; returns numpy's best of both."""
    ref = max(v for m in (before, after) for k, v in m.items() if k.startswith("numpy"))
    print(f"## bandwidth (STREAM-like triad a = b + s*c, 32M float32, best of {TRIAD_REPS}, 3 arrays * 4 bytes)")
    print()
    print("| triad | GB/s before the kernels | GB/s after |")
    print("|---|---:|---:|")
    for k in before:
        print(f"| {k} | {before[k]:.1f} | {after[k]:.1f} |")
    print()
    print(f"the machine's best (numpy): {ref:.1f} GB/s")
    print()
    return ref


# float32 FMA peak: the compute-bound counterpart of the triad. Built with tcdsl's own compiler and
# flags (-O3 -march=native -fopenmp ...); the 12 accumulators stay in registers (checked with -S:
# 12 vfmadd132ps on %zmm registers per iteration, no loads or stores), and their sum goes to a
# volatile global, so the compiler cannot drop the loop.
FMA_PEAK_C = r"""#include <omp.h>
#include <math.h>
#if defined(__AVX512F__) || defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* 12 independent multiply-add chains per thread, in registers: acc = acc * a + b, which tends to
   b / (1 - a) = 1, so no overflow and no denormals. */
#define ACC 12
#if defined(__AVX512F__)
#define LANES 16
#define VEC __m512
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
const char *tc_fma_isa = "AVX-512 _mm512_fmadd_ps";
#elif defined(__FMA__) && defined(__AVX2__)
#define LANES 8
#define VEC __m256
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
const char *tc_fma_isa = "AVX2 _mm256_fmadd_ps";
#else
#define LANES 1
#define VEC float
#define SET1(x) (x)
#define FMA fmaf
#define ADD(x, y) ((x) + (y))
#define STORE(p, x) (*(p) = (x))
const char *tc_fma_isa = "scalar fmaf";
#endif

volatile float tc_fma_sink;  /* the sum of all accumulators: the loops cannot be dropped */
int tc_fma_threads;          /* the threads the last call ran on */

/* iters multiply-adds on each of ACC accumulators of LANES floats, on `threads` threads (0: the
   OpenMP default); returns the FLOPs done by all threads together (2 per lane per multiply-add). */
double tc_fma_peak(long iters, int threads) {
    int n = threads > 0 ? threads : omp_get_max_threads();
    double flops = 0.0;
    float total = 0.0f;
    #pragma omp parallel num_threads(n) reduction(+ : flops, total)
    {
        const VEC a = SET1(0.999999f), b = SET1(1e-6f);
        const float s = 0.5f + 1e-3f * (float)omp_get_thread_num();
        VEC x0 = SET1(s), x1 = SET1(s + 0.01f), x2 = SET1(s + 0.02f), x3 = SET1(s + 0.03f);
        VEC x4 = SET1(s + 0.04f), x5 = SET1(s + 0.05f), x6 = SET1(s + 0.06f), x7 = SET1(s + 0.07f);
        VEC x8 = SET1(s + 0.08f), x9 = SET1(s + 0.09f), x10 = SET1(s + 0.10f), x11 = SET1(s + 0.11f);
        for (long i = 0; i < iters; i++) {
            x0 = FMA(x0, a, b); x1 = FMA(x1, a, b); x2 = FMA(x2, a, b); x3 = FMA(x3, a, b);
            x4 = FMA(x4, a, b); x5 = FMA(x5, a, b); x6 = FMA(x6, a, b); x7 = FMA(x7, a, b);
            x8 = FMA(x8, a, b); x9 = FMA(x9, a, b); x10 = FMA(x10, a, b); x11 = FMA(x11, a, b);
        }
        VEC sum = ADD(ADD(ADD(x0, x1), ADD(x2, x3)), ADD(ADD(x4, x5), ADD(x6, x7)));
        sum = ADD(sum, ADD(ADD(x8, x9), ADD(x10, x11)));
        float lanes[LANES];
        STORE(lanes, sum);
        for (int l = 0; l < LANES; l++)
            total += lanes[l];
        flops += 2.0 * ACC * LANES * (double)iters;
        #pragma omp single nowait
        tc_fma_threads = omp_get_num_threads();
    }
    tc_fma_sink = total;
    return flops;
}
"""


class FmaPeak:
    """The float32 FMA peak loop (FMA_PEAK_C), compiled by tcdsl's toolchain and loaded with ctypes."""

    def __init__(self) -> None:
        from tcdsl.codegen import toolchain

        self.lib = toolchain.kernel_library(FMA_PEAK_C, "fma_peak", "")[0]  # verified bytes, as kernels
        self.fn = self.lib.tc_fma_peak
        self.fn.argtypes = [ctypes.c_long, ctypes.c_int]
        self.fn.restype = ctypes.c_double
        isa = ctypes.c_char_p.in_dll(self.lib, "tc_fma_isa").value
        self.isa = isa.decode() if isa else "?"
        self.iters: dict[int, int] = {}  # threads -> iterations for a run of about FMA_RUN_S

    def run(self, iters: int, threads: int) -> tuple[float, float, int]:
        """One call: (seconds, FLOPs done, threads it ran on); ``threads`` 0 is the OpenMP default."""
        t0 = time.perf_counter()
        flops = self.fn(iters, threads)
        dt = time.perf_counter() - t0
        if not math.isfinite(ctypes.c_float.in_dll(self.lib, "tc_fma_sink").value):
            raise SystemExit("FMA peak: the accumulators are not finite")
        return dt, flops, ctypes.c_int.in_dll(self.lib, "tc_fma_threads").value

    def gflops(self, threads: int) -> tuple[float, int]:
        """Best-of-FMA_REPS GFLOP/s on ``threads`` threads (0: the OpenMP default), and the thread count."""
        iters = self.iters.get(threads)
        if iters is None:  # size one run to about FMA_RUN_S
            iters = 1 << 16
            while (dt := self.run(iters, threads)[0]) < 0.01:
                iters *= 4
            iters = self.iters[threads] = max(1, int(iters * FMA_RUN_S / dt))
        quiesce()
        best, flops, used = math.inf, 0.0, 0
        for _ in range(FMA_REPS):
            dt, flops, used = self.run(iters, threads)
            best = min(best, dt)
        return flops / best / 1e9, used


def measure_fma_peak(peak: FmaPeak) -> dict[str, float]:
    """GFLOP/s of the FMA peak loop on one thread and on all (the OpenMP default)."""
    one, _ = peak.gflops(1)
    every, n = peak.gflops(0)
    return {"1 thread": one, f"{n} thread{'s' if n != 1 else ''} (all)": every}


def fma_report(before: dict[str, float], after: dict[str, float], peak: FmaPeak) -> float:
    """Print the FMA peaks measured before and after the kernels; returns the best all-thread figure."""
    ref = max(v for m in (before, after) for k, v in m.items() if k.endswith("(all)"))
    print(f"## compute (float32 FMA peak: {ref:.1f} GFLOP/s; {peak.isa}, 12 independent accumulators in "
          f"registers per thread, best of {FMA_REPS} runs of ~{FMA_RUN_S * 1e3:.0f} ms)")
    print()
    print("| FMA peak | GFLOP/s before the kernels | GFLOP/s after |")
    print("|---|---:|---:|")
    for k in before:
        print(f"| {k} | {before[k]:.1f} | {after.get(k, math.nan):.1f} |")
    print()
    print(f"the machine's best (all threads): {ref:.1f} GFLOP/s")
    print()
    return ref


# ----------------------------------------------------------------------------------------------
# timing


def rel_err(got: Any, want: np.ndarray) -> float:
    got = np.asarray(got)
    if got.shape != want.shape:
        return math.inf
    scale = float(np.max(np.abs(want))) or 1.0
    err = np.abs(got.astype(np.float64) - want)
    if np.isnan(err).any():
        return math.inf
    return float(err.max()) / scale


def quiesce(max_s: float = 1.0, step: float = 0.01) -> None:
    """Sleep until this process's threads stop using CPU (at most max_s).

    Thread pools spin for a while after a call (OpenBLAS ~0.1 s, OpenMP a few ms); on a machine with
    few cores the spinning pool of one contender would steal the cores of the next one, and the
    order of the round would decide the times. So every timed call starts with all pools idle.
    Waking a sleeping pool costs scheduler latency (milliseconds on a loaded machine), so a fast
    contender then makes one untimed call first and its timed call runs hot, as in a loop that
    calls only it (see PRECALL_BELOW_S).
    """
    bench.quiesce(max_s, step)


def run_case(case: Case, rng: np.random.Generator, torch: Any, timpl: dict[str, Any], options: MappingOptions,
             rounds_arg: int | None, triad: Triad | None = None, tune_s: float | None = None,
             population: int = 100) -> Result:
    res = Result(case)
    arrays = [rng.standard_normal(s, dtype=F32) for s in case.input_shapes]
    want = case.numpy_fn(*arrays)
    contenders: dict[str, Callable[[], Any]] = {}

    kernel = tc.define(case.source)
    try:
        t0 = time.perf_counter()
        kernel.compiled(*arrays, options=options)
        res.compile_s = time.perf_counter() - t0
        got = kernel(*arrays, backend="c", options=options)
        res.rel_err = rel_err(got, want)
        if not res.rel_err <= RTOL:
            res.status = "FAIL"
    except Exception as e:  # a crash is reported in the table, the other kernels still run
        res.status = "ERROR"
        res.note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    if res.status != "ERROR":
        contenders["tcdsl"] = lambda: kernel(*arrays, backend="c", options=options)
        if case.bytes_moved:  # the kernel alone, writing into an existing array as the triad does
            out = np.empty_like(want)
            contenders[OUT] = lambda: kernel(*arrays, backend="c", options=options, out=out)
    if case.bytes_moved and triad is not None:  # the machine's bandwidth under the same load
        contenders[TRIAD] = triad.threaded
    if tune_s and res.status == "ok":
        tune_case(res, kernel, arrays, want, tune_s, contenders, population)
    contenders["numpy"] = lambda: case.numpy_fn(*arrays)
    if torch is not None:
        tensors = [torch.from_numpy(a) for a in arrays]
        torch_fn = timpl[case.torch_key]
        t_err = rel_err(torch_fn(*tensors).numpy(), want)
        if not t_err <= RTOL:  # the references must agree, or the ratios mean nothing
            res.note += f" torch disagrees with numpy (rel err {t_err:.1e})"
        contenders["torch"] = lambda: torch_fn(*tensors)
        if tune_s and case.name == "maxpool":
            compiled = torch.compile(torch_fn)
            compiled(*tensors)
            contenders[COMPILED] = lambda: compiled(*tensors)

    # warm-up: each contender has made one call above (the checks); one more, timed, sizes the rounds
    est: dict[str, float] = {}
    for name, call in contenders.items():
        quiesce()
        t0 = time.perf_counter()
        call()
        est[name] = time.perf_counter() - t0
    rounds = rounds_arg or max(MIN_ROUNDS, min(MAX_ROUNDS, int(TIME_BUDGET_S / max(sum(est.values()), 1e-6))))
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    order = list(contenders)
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                call = contenders[name]
                quiesce()
                if est[name] < PRECALL_BELOW_S:
                    call()  # wakes this contender's own thread pool: the timed call runs hot
                t0 = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - t0)
    finally:
        gc.enable()
    res.times = {k: statistics.median(v) for k, v in samples.items()}
    res.best = {k: min(v) for k, v in samples.items()}
    res.samples = samples
    if "tcdsl" in samples:
        res.paired = {k: statistics.median(a / b for a, b in zip(v, samples["tcdsl"])) for k, v in samples.items()}
    res.rounds = rounds
    return res


# ----------------------------------------------------------------------------------------------
# report


def fmt_ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}" if t < 0.01 else f"{t * 1e3:.2f}" if t < 1 else f"{t * 1e3:.0f}"


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else num / den


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def interval_text(r: Result, against: str, base: str, thr: float) -> str:
    """The 95% interval of the median of the rounds' own ratios (``against`` time / ``base`` time
    in each round), and whether it holds the target: the verdict then rests on the host's noise."""
    pairs = [a / b for a, b in zip(r.samples.get(against, []), r.samples.get(base, []))]
    got = median_interval(pairs)
    if got is None:
        return ""
    lo, hi = got
    return f"; 95% interval of the paired median {lo:.2f}-{hi:.2f}x" + \
        (", which holds the target: within this run's noise" if lo <= thr <= hi else "")


def table(results: list[Result]) -> None:
    print("## times (median per call, ms; ratio > 1: tcdsl is faster)")
    print()
    print("| kernel | shape | tcdsl ms | numpy ms | torch ms | numpy/tcdsl | torch/tcdsl | max rel err | compile s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        t = r.times.get("tcdsl")
        err = "ERROR" if r.status == "ERROR" else f"{'FAIL ' if r.status == 'FAIL' else ''}{r.rel_err:.1e}"
        comp = "-" if r.compile_s is None else f"{r.compile_s:.2f}"
        print(f"| {r.case.name} | {r.case.shape} | {fmt_ms(t)} | {fmt_ms(r.times.get('numpy'))} "
              f"| {fmt_ms(r.times.get('torch'))} | {fmt_ratio(ratio(r.times.get('numpy'), t))} "
              f"| {fmt_ratio(ratio(r.times.get('torch'), t))} | {err} | {comp} |")
    print()
    notes = [f"- {r.case.name}: {r.note.strip()}" for r in results if r.note.strip()]
    rounds = ", ".join(f"{r.case.name} {r.rounds}" for r in results)
    print(f"rounds (samples per contender): {rounds}")
    print(f"max rel err = max|tcdsl - numpy| / max|numpy|, FAIL above {RTOL:g}. compile s = the first build in "
          "this process (schedule, codegen and the C compiler, unless tcdsl's disk cache holds the library; "
          "TCDSL_FORCE_RECOMPILE=1 times full builds)")
    if notes:
        print("notes:")
        print("\n".join(notes))
    print()
    print("## best of the rounds (min per call, ms): what each contender does when the machine lets it")
    print()
    print("| kernel | tcdsl ms | numpy ms | torch ms | numpy/tcdsl | torch/tcdsl |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        b = r.best.get("tcdsl")
        print(f"| {r.case.name} | {fmt_ms(b)} | {fmt_ms(r.best.get('numpy'))} | {fmt_ms(r.best.get('torch'))} "
              f"| {fmt_ratio(ratio(r.best.get('numpy'), b))} | {fmt_ratio(ratio(r.best.get('torch'), b))} |")
    print()


def bandwidth_table(results: list[Result], best_triad: float) -> None:
    """Achieved GB/s of the memory-bound kernels and tcdsl's fraction of the triad timed in the
    same rounds (medians against medians, best against best)."""
    rows = [r for r in results if r.case.bytes_moved]
    if not rows:
        return
    print("## memory-bound kernels (GB/s = bytes read + written once / median time)")
    print()
    print("tcdsl, numpy and torch allocate a fresh output per call (its first touch costs page faults); "
          "'tcdsl out=' writes into an existing array, as the triad does: the fractions of the triad use it. "
          "The triad runs as one more contender in the same rounds, so the load of the machine hits it alike.")
    print()
    print("| kernel | MB moved | tcdsl GB/s | tcdsl out= GB/s | numpy GB/s | torch GB/s | triad GB/s | "
          "tcdsl out= / triad | best / best | tcdsl out= / machine's best triad |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gb = {k: (TRIAD_BYTES if k == TRIAD else r.case.bytes_moved) / v / 1e9 for k, v in r.times.items()}
        cell = [f"{gb[k]:.1f}" if k in gb else "-" for k in ("tcdsl", OUT, "numpy", "torch", TRIAD)]
        fr = [triad_fraction(r, t) for t in (r.times, r.best)]
        fr.append(gb[OUT] / best_triad if OUT in gb and best_triad else None)
        print(f"| {r.case.name} | {r.case.bytes_moved / 1e6:.0f} | {' | '.join(cell)} | "
              + " | ".join("-" if f is None else f"{f:.2f}" for f in fr) + " |")
    print()


def compute_table(results: list[Result], peak: float) -> None:
    """GFLOP/s of the compute-bound kernels per contender, tcdsl's fraction of the FMA peak and the
    fastest time the peak allows (medians, then best of the rounds)."""
    rows = [r for r in results if r.case.flops and r.times]
    if not rows:
        return
    print("## compute-bound kernels (GFLOP/s = FLOPs of one call / median time; a multiply-add counts 2)")
    print()
    print("'fastest at peak' = FLOPs / the machine's best all-thread FMA peak"
          + (f" ({peak:.1f} GFLOP/s)" if peak else " (not measured)")
          + "; 'best possible torch/tcdsl' = torch time / that: the largest speed-up over torch any code "
          "could show here. A fraction of the peak above 1 means the peak runs lost cores to other work.")
    print()
    print("| kernel | GFLOP | tcdsl GFLOP/s | numpy GFLOP/s | torch GFLOP/s | tcdsl / peak | fastest time at peak ms "
          "| best possible torch/tcdsl |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        at_peak = r.case.flops / (peak * 1e9) if peak else None
        print(f"| {r.case.name} | {r.case.flops / 1e9:.3f} | {fmt_gflops(r, r.times)} "
              f"| {fmt_frac(peak_fraction(r, r.times, peak))} | {fmt_ms(at_peak)} "
              f"| {fmt_ratio(ratio(r.times.get('torch'), at_peak))} |")
    print()
    print("best of the rounds:")
    print()
    print("| kernel | tcdsl GFLOP/s | numpy GFLOP/s | torch GFLOP/s | tcdsl / peak | best possible torch/tcdsl |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        at_peak = r.case.flops / (peak * 1e9) if peak else None
        print(f"| {r.case.name} | {fmt_gflops(r, r.best)} | {fmt_frac(peak_fraction(r, r.best, peak))} "
              f"| {fmt_ratio(ratio(r.best.get('torch'), at_peak))} |")
    print()


def fmt_gflops(r: Result, times: dict[str, float]) -> str:
    """The tcdsl, numpy and torch GFLOP/s cells of one row."""
    return " | ".join("-" if times.get(k) is None else f"{r.case.flops / times[k] / 1e9:.1f}"
                      for k in ("tcdsl", "numpy", "torch"))


def fmt_frac(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def peak_fraction(r: Result, times: dict[str, float], peak: float) -> float | None:
    """tcdsl's GFLOP/s over the FMA peak (None when tcdsl did not run or gave a wrong result)."""
    t = times.get("tcdsl")
    if t is None or not peak or r.status != "ok":
        return None
    return r.case.flops / t / 1e9 / peak


def triad_fraction(r: Result, times: dict[str, float]) -> float | None:
    """tcdsl's GB/s writing into an existing array over the triad's, from the same rounds."""
    t, tt = times.get(OUT), times.get(TRIAD)
    if t is None or tt is None or r.status != "ok":
        return None
    return (r.case.bytes_moved / t) / (TRIAD_BYTES / tt)


def tune_case(res: Result, kernel: Any, arrays: list[np.ndarray], want: np.ndarray, tune_s: float,
              contenders: dict[str, Callable[[], Any]], population: int = 100) -> None:
    """Autotune ``kernel`` for ``tune_s`` seconds; its best options join the contenders."""
    t0 = time.perf_counter()
    try:
        res.tuned = kernel.autotune(*arrays, budget=tune_s, seed=0, progress=False, population=population,
                                    elites=max(1, population // 10))
    except Exception as e:
        res.note += f" tuning failed: {type(e).__name__}: {e}"
        return
    res.tune_s = time.perf_counter() - t0
    opts = res.tuned.options
    err = rel_err(kernel(*arrays, backend="c", options=opts), want)
    if not err <= RTOL:
        res.status = "FAIL"
        res.note += f" tuned options give a wrong result (rel err {err:.1e})"
        return
    contenders[TUNED] = lambda: kernel(*arrays, backend="c", options=opts)
    defaults = MappingOptions()
    res.side = side_by_side({"default": lambda: kernel(*arrays, backend="c", options=defaults),
                             "tuned": contenders[TUNED]}, TUNE_ROUNDS)
    print(f"{res.case.name} after {res.tune_s:.0f} s of tuning: {side_summary(res)}; tuner: {decision_text(res.tuned)}",
          flush=True)


def side_by_side(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls`` in ``rounds`` interleaved rounds, timed as in run_case
    (the first of a round rotating, pools quiesced, fast calls made hot by an untimed call first)."""
    est: dict[str, float] = {}
    for name, call in calls.items():
        quiesce()
        t0 = time.perf_counter()
        call()
        est[name] = time.perf_counter() - t0
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = list(calls)
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                quiesce()
                if est[name] < PRECALL_BELOW_S:
                    calls[name]()
                t0 = time.perf_counter()
                calls[name]()
                samples[name].append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return samples


def side_summary(r: Result) -> str:
    """The side-by-side rounds of tuned against default options: medians, their ratio, rounds won."""
    tuned, default = r.side.get("tuned", []), r.side.get("default", [])
    if not tuned or not default:
        return "not timed side by side"
    won = sum(t < d for t, d in zip(tuned, default))
    t, d = statistics.median(tuned), statistics.median(default)
    return (f"tuned {fmt_ms(t)} ms, default {fmt_ms(d)} ms (medians of {len(tuned)} interleaved rounds), "
            f"default/tuned {fmt_ratio(ratio(d, t))}, tuned faster in {won} of {len(tuned)}")


def decision_text(tuned: Any) -> str:
    """What the autotuner's final check against the defaults decided, and on what numbers."""
    d = getattr(tuned, "decision", None)
    if d is None:
        return "no valid candidate"
    if not d.rounds:
        return f"{'kept' if d.keep else 'defaults'} ({d.why})"
    return (f"{'kept its best' if d.keep else 'kept the defaults'} ({d.speedup:.2f}x in {d.rounds} rounds, "
            f"won {d.wins}, sign test p = {d.p_value:.2g})")


def tuned_table(results: list[Result], tune_s: float, population: int) -> None:
    rows = [r for r in results if r.tuned is not None]
    if not rows:
        return
    print(f"## tuned (autotuner budget {tune_s:g} s per kernel, seed 0, population {population}; "
          "medians of the same rounds)")
    print()
    print("| kernel | tuned ms | default ms | numpy ms | torch ms | numpy/tuned | torch/tuned | candidates | "
          "search s | options changed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base = json.loads(MappingOptions().to_json())
    for r in rows:
        t = r.times.get(TUNED)
        best = json.loads(r.tuned.options.to_json())
        diff = ", ".join(f"{k}={best[k]}" for k in sorted(best) if best[k] != base[k]) or "(defaults)"
        print(f"| {r.case.name} | {fmt_ms(t)} | {fmt_ms(r.times.get('tcdsl'))} | {fmt_ms(r.times.get('numpy'))} | "
              f"{fmt_ms(r.times.get('torch'))} | {fmt_ratio(ratio(r.times.get('numpy'), t))} | "
              f"{fmt_ratio(ratio(r.times.get('torch'), t))} | {r.tuned.evaluations} | {r.tune_s:.0f} | {diff} |")
    print()
    print(f"## tuned against default options, side by side ({TUNE_ROUNDS} interleaved rounds right after tuning; "
          "the tuner's own final check in the last column)")
    print()
    print("| kernel | tuned ms | default ms | default/tuned | tuned faster in | tuner's decision |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        tuned, default = r.side.get("tuned", []), r.side.get("default", [])
        t, d = (statistics.median(x) if x else None for x in (tuned, default))
        won = f"{sum(a < b for a, b in zip(tuned, default))} of {len(tuned)}" if tuned else "-"
        print(f"| {r.case.name} | {fmt_ms(t)} | {fmt_ms(d)} | {fmt_ratio(ratio(d, t))} | {won} | "
              f"{decision_text(r.tuned)} |")
    print()
    by = {r.case.name: r for r in rows}
    goals = [("matmul 1024^3 >= 1.0x numpy", "matmul_1024", "numpy", 1.0),
             ("matmul 960x1088x1000 >= 1.0x numpy", "matmul_960", "numpy", 1.0),
             ("conv2d >= 1.2x torch eager", "conv2d", "torch", 1.2),
             ("conv2d 46x46 >= 1.2x torch eager", "conv2d_46", "torch", 1.2),
             ("group conv >= 2x torch eager", "group_conv", "torch", 2.0),
             ("FC + bias + relu >= 1.2x torch eager", "fc_relu", "torch", 1.2),
             ("softmax >= 1.2x torch eager", "softmax", "torch", 1.2),
             ("layernorm >= 1.2x torch eager", "layernorm", "torch", 1.2),
             ("maxpool >= 1.0x torch.compile", "maxpool", COMPILED, 1.0)]
    print("## targets after tuning (medians, best-of in brackets)")
    print()
    for what, name, against, thr in goals:
        r = by.get(name)
        if r is None or TUNED not in r.times or against not in r.times:
            print(f"- {what}: not run")
            continue
        x, xb = (ratio(t.get(against), t.get(TUNED)) for t in (r.times, r.best))
        verdict = "met" if x is not None and x >= thr else "NOT met"
        print(f"- {what}: {verdict} ({fmt_ratio(x)}; best-of {fmt_ratio(xb)}{interval_text(r, against, TUNED, thr)})")
    print()


def targets(results: list[Result], have_torch: bool) -> None:
    by = {r.case.name: r for r in results}
    # (what, kernel, against, threshold)
    goals = [("matmul 1024^3 >= 0.8x numpy", "matmul_1024", "numpy", 0.8),
             ("matmul 960x1088x1000 >= 0.8x numpy", "matmul_960", "numpy", 0.8),
             ("A*B^T >= 0.8x numpy", "tmm_1024", "numpy", 0.8),
             ("FC + bias + relu >= 1.0x torch eager", "fc_relu", "torch", 1.0),
             ("conv2d >= 1.0x torch eager", "conv2d", "torch", 1.0),
             ("conv2d 46x46 >= 1.0x torch eager", "conv2d_46", "torch", 1.0),
             ("group conv >= 1.5x torch eager", "group_conv", "torch", 1.5),
             ("softmax >= 1.1x torch eager", "softmax", "torch", 1.1),
             ("layernorm >= 1.2x torch eager", "layernorm", "torch", 1.2),
             ("elementwise >= 0.8x triad bandwidth (out=)", "tanh_fma", "triad", 0.8),
             ("maxpool >= 0.8x triad bandwidth", "maxpool", "triad", 0.8),
             ("transpose >= 0.6x triad bandwidth (out=)", "transpose", "triad", 0.6)]
    print("## targets (default options; judged on the medians, best-of in brackets, with the median of the rounds' "
          "own ratios)")
    print()
    for what, name, against, thr in goals:
        r = by.get(name)
        if r is None:
            verdict = "not run"
        elif r.status != "ok":
            verdict = f"not met ({'wrong result' if r.status == 'FAIL' else 'error'})"
        elif against == "torch" and not have_torch:
            verdict = "n/a (no torch)"
        else:
            x, xb = (triad_fraction(r, t) if against == "triad" else ratio(t.get(against), t.get("tcdsl"))
                     for t in (r.times, r.best))
            paired = f"; paired rounds {r.paired[against]:.2f}x{interval_text(r, against, 'tcdsl', thr)}" \
                if against != "triad" and against in r.paired else ""
            verdict = "n/a" if x is None else \
                f"{'met' if x >= thr else 'NOT met'} ({x:.2f}x; best-of {xb:.2f}x{paired})"
        print(f"- {what}: {verdict}")
    builds = sorted(r.compile_s for r in results if r.compile_s is not None)
    if builds:
        mid = statistics.median(builds)
        print(f"- median cold compile <= {COMPILE_TARGET_S:g} s: {'met' if mid <= COMPILE_TARGET_S else 'NOT met'} "
              f"({mid:.2f} s over {len(builds)} kernels; {builds[0]:.2f} to {builds[-1]:.2f} s)")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--only", help="run the kernels whose name contains this (comma-separated: any of these)")
    ap.add_argument("--rounds", type=int, help=f"rounds per kernel (default: sized to ~{TIME_BUDGET_S:g} s of timing "
                                                f"per kernel, {MIN_ROUNDS} to {MAX_ROUNDS})")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch column")
    ap.add_argument("--peers-isa", choices=["avx2"], help="limit numpy's BLAS and torch to AVX2 kernels, as on a "
                    "machine without AVX-512 (with TCDSL_CPU=avx2: every contender on AVX2)")
    ap.add_argument("--options", help="tcdsl MappingOptions as JSON, e.g. '{\"tile\": [32, 32, 32]}'")
    ap.add_argument("--tune", type=float, metavar="SECONDS",
                    help="also autotune each kernel for this long and time its best options ('tcdsl tuned'); "
                         "the search uses a fresh tuning cache unless TCDSL_TUNING_DB is set")
    ap.add_argument("--population", type=int, default=100, help="the search's population with --tune (default 100)")
    a = ap.parse_args(argv)
    if a.tune and not os.environ.get("TCDSL_TUNING_DB"):  # each run searches from scratch
        os.environ["TCDSL_TUNING_DB"] = os.path.join(tempfile.mkdtemp(prefix="tcdsl-bench-"), "tuning.sqlite")
    if a.rounds is not None and a.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        options = MappingOptions.from_json(a.options) if a.options else MappingOptions()
    except (ValueError, TypeError, tc.TcError) as e:
        ap.error(f"--options: {e}")

    torch: Any = None
    torch_note = "skipped (--no-torch)"
    if not a.no_torch:
        try:
            import torch  # type: ignore[no-redef]

            torch.set_num_threads(os.cpu_count() or 1)
        except ImportError as e:
            torch, torch_note = None, f"not importable ({e}); torch columns left empty"
    timpl = torch_impls(torch) if torch is not None else {}

    selected = cases()
    if a.only:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        selected = [c for c in selected if any(k in c.name for k in keys)]
        if not selected:
            ap.error(f"--only {a.only!r} matches no kernel; kernels: {', '.join(c.name for c in cases())}")

    t_start = time.perf_counter()
    describe_machine(torch, torch_note, options)
    triad = Triad() if any(c.bytes_moved for c in selected) else None
    triad_before = measure_triad(torch, triad) if triad else {}
    fma, fma_before = None, {}
    if any(c.flops for c in selected):
        try:
            fma = FmaPeak()
            fma_before = measure_fma_peak(fma)
        except Exception as e:  # no peak: the compute table still shows GFLOP/s
            fma = None
            print(f"FMA peak not measured: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            print()

    rng = np.random.default_rng(0)
    results = []
    for case in selected:
        r = run_case(case, rng, torch, timpl, options, a.rounds, triad, a.tune, a.population)
        results.append(r)
        times = ", ".join(f"{k} {fmt_ms(v)} ms" for k, v in r.times.items())
        print(f"[{time.perf_counter() - t_start:6.1f} s] {case.name}: {r.status}, {r.rounds} rounds: {times}",
              flush=True)
    print()
    table(results)
    best_triad = triad_report(triad_before, measure_triad(torch, triad)) if triad is not None else 0.0
    bandwidth_table(results, best_triad)
    best_peak = fma_report(fma_before, measure_fma_peak(fma), fma) if fma is not None else 0.0
    compute_table(results, best_peak)
    targets(results, torch is not None)
    if a.tune:
        tuned_table(results, a.tune, a.population)
    bad = [r.case.name for r in results if r.status != "ok"]
    print(f"load average at the end: {load_avg()} (on {os.cpu_count()} cores: other work on the machine slows every "
          "contender; the round-robin spreads it evenly but not away)")
    print(f"total {time.perf_counter() - t_start:.0f} s; "
          + (f"{len(bad)} kernel(s) wrong or failing: {', '.join(bad)}" if bad else "all tcdsl results match numpy"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
