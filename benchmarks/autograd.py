"""Autograd benchmark: forward + backward of tcdsl kernels (derived backward defs, C backend) against
PyTorch eager on the CPU, side by side in one process.

usage: .venv/bin/python benchmarks/autograd.py [--rounds N] [--only NAME[,NAME...]] [--tune SECONDS]

Layers (float32, sizes mostly not powers of two): conv2d, conv + bias + relu, group conv, layernorm,
softmax, 2x2 max pooling, a two-layer MLP, an embedding bag (sum; the gradient goes to the table
only) and a tiny fully connected layer (8x8 -> 8, where the cost of a call dominates).

Speed: each round times one forward + backward and one forward of each contender (the order
alternating), after warm-up calls that also compile tcdsl's kernels; every timed sample starts once
the thread pools of the previous one have stopped spinning (on a machine with few cores a spinning
pool steals the cores of the next call). A sample of a fast layer (a step under ``BATCH_S``) is a
batch of steps lasting at least ``BATCH_S``, fresh leaves for each made before the clock starts,
after one untimed step that wakes the thread pools (as tcdsl.bench does): back-to-back steps, as in
a training loop, rather than the wake-up of sleeping threads, which alone costs a tiny layer's
tcdsl kernels about a millisecond. The table gives medians and the speed ratios ``torch time /
tcdsl time`` (above 1: tcdsl is faster; the target is >= 0.8 per layer). Run it on an
otherwise idle machine: another busy process makes each OpenMP barrier wait for a descheduled
thread, milliseconds per parallel loop (the load average is printed at the start and the end).

Memory: the peak resident memory one training step (forward + backward, the gradients included)
adds to the process, for each contender alike: the inputs and the output gradient already exist,
the garbage collector has run and glibc has handed its free pages back (``malloc_trim``); then the
kernel's high-water mark is reset (``/proc/self/clear_refs``), the step runs, and the peak is
``VmHWM`` minus the ``VmRSS`` before the step. It counts every page the step touches, wherever it
was allocated: torch's allocator, numpy's buffers (tcdsl's temporaries), the ``aligned_alloc`` packs
of tcdsl's C kernels, the autograd graph. The smallest of ``MEM_REPEATS`` steps (alternating); the
target is tcdsl's peak <= 1.2x torch's. Linux only (``n/a`` elsewhere).

Correctness: tcdsl's output and input gradients, and torch's float32 ones, are compared with torch's
float64 result from the same inputs: the largest relative difference ``max|x - ref| / max|ref|``
over the output and the gradients. tcdsl fails (FAIL, exit status 1) above ``C_ERR * eps32 *
terms``, ``terms`` being the most float32 terms rounded into one result along its longest chain of
sums (forward and backward), as tcdsl.bench allows a sum's rounding. A relu or a max whose argument
lies within rounding of its kink could legitimately pick the other side (the seeds are fixed).

Per call: a one-element kernel called in a loop, in microseconds per call: with a numpy array, with
a torch tensor (each also into an ``out=`` buffer, and as a short form), and forward + backward
with a tensor that requires grad, beside torch eager's own ``A + 1`` (targets: numpy path <= 5 us, torch path <= 15 us).

Tuned: ``--tune S`` first tunes each layer's training step (``kernel.autotune(*inputs,
backward=True, budget=S)``: the forward def and the backward def, S seconds each, into the tuning
cache, ``$TCDSL_TUNING_DB``, by default in ``$TCDSL_CACHE_DIR``: use a fresh one), prints the
tuner's keep-or-drop decisions, then times autograd's calls, which run with the tuned options. The
targets are then the tuned ones: >= 1.0x torch per layer, >= 1.5x for group conv and the
embedding bag.

The closing "targets" section says which targets are met, and names the layers whose rounds' paired
f+b speeds leave the target inside their median's 95% interval (the verdict there rests on the noise).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from cpu import GROUP_CONV, MAXPOOL, SOFTMAX, torch_impls  # benchmarks/cpu.py: the same defs as the CPU benchmark

import tcdsl as tc
from tcdsl import bench
from tcdsl.compiler import cpu_target
from tcdsl.tuner.decide import median_interval

EPS32 = float(np.finfo(np.float32).eps)
C_ERR = bench.C_ERR  # allowance per summed term, in units of eps
BATCH_S = bench.BATCH_S  # a timed sample repeats a faster step until at least this long
MEM_REPEATS = 9
SPEED_TARGET = 0.8  # torch time / tcdsl time, per layer
TUNED_TARGET = 1.0  # the same with --tune
TUNED_TARGET_HIGH = {"group_conv": 1.5, "embed_bag": 1.5}  # layers with a higher tuned target
TINY_TARGET = 2.0  # the tiny layer: tcdsl time / torch time at most
MEM_TARGET = 1.2  # tcdsl peak / torch peak at most
NUMPY_CALL_TARGET_US = 5.0
TORCH_CALL_TARGET_US = 15.0

CONV = """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}
"""
CONV_BIAS_RELU = """
def conv_bias_relu(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) Bs) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * Wt(f, r_c, r_kh, r_kw)
    O(n, f, h, w) = fmax(O(n, f, h, w) + Bs(f), 0.0)
}
"""
MLP = """
def mlp2(float(B, K) X, float(H, K) W1, float(H) B1, float(O, H) W2, float(O) B2) -> (Y) {
    Hd(b, h) +=! X(b, k) * W1(h, k)
    A(b, h) = fmax(Hd(b, h) + B1(h), 0.0)
    Y(b, o) +=! A(b, h) * W2(o, h)
    Y(b, o) = Y(b, o) + B2(o)
}
"""
LAYERNORM = """
def layernorm(float(N, D) X, float(D) G, float(D) Bt) -> (Y) {
    mean(n) +=! X(n, d) / D
    xc(n, d) = X(n, d) - mean(n)
    var(n) +=! xc(n, d) * xc(n, d) / D
    Y(n, d) = xc(n, d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)
}
"""
EMBEDDING_BAG = """
def embedding_bag(float(V, D) Table, int64(B, L) Idx) -> (Bag) {
    Bag(b, d) +=! Table(Idx(b, r_l), d)
}
"""
FC = """
def fc(float(B, K) X, float(N, K) W, float(N) Bs) -> (Y) {
    Y(b, n) +=! X(b, r_k) * W(n, r_k)
    Y(b, n) = Y(b, n) + Bs(n)
}
"""
ONE = "def one(float(N) A) -> (B) { B(i) = A(i) + 1.0 }"
ONE_SHORT = "B(i) = A(i) + 1.0"  # the same as a short form (tc.define(...) of a function of A)


@dataclass
class Case:
    name: str
    shapes: str
    kernel: object
    reference: Callable[..., torch.Tensor]
    inputs: list[torch.Tensor]
    terms: int  # the most float32 terms rounded into one result (output or gradient), along its longest chain


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.rand(*shape, generator=g) * 2 - 1) * scale

    timpl = torch_impls(torch)
    V, D, B, L = 3000, 64, 32, 10
    idx = torch.randint(0, V, (B, L), generator=g)
    most = int(torch.bincount(idx.flatten()).max())  # a table row's gradient sums this many bag gradients
    return [
        # conv: the weight gradient sums N*H'*W' terms; conv_bias_relu's bias gradient as many
        Case("conv2d", "I 8x16x32x32, W 32x16x3x3", tc.define(CONV),
             lambda i, w: F.conv2d(i, w), [rand(8, 16, 32, 32), rand(32, 16, 3, 3, scale=0.1)], 8 * 30 * 30),
        Case("conv_relu", "I 6x24x30x30, W 40x24x3x3, bias, relu", tc.define(CONV_BIAS_RELU),
             lambda i, w, b: torch.relu(F.conv2d(i, w, b)),
             [rand(6, 24, 30, 30), rand(40, 24, 3, 3, scale=0.1), rand(40, scale=0.1)], 6 * 28 * 28),
        Case("group_conv", "I 6x8x12x30x30 (NGCHW), W 8x12x12x3x3", tc.define(GROUP_CONV), timpl["group_conv"],
             [rand(6, 8, 12, 30, 30), rand(8, 12, 12, 3, 3, scale=0.1)], 6 * 28 * 28),
        # layernorm: the mean and the variance sum D terms each, G's and Bt's gradients N
        Case("layernorm", "X 1500x1000, gain, bias", tc.define(LAYERNORM),
             lambda x, gm, bt: F.layer_norm(x, (x.shape[1],), gm, bt, eps=1e-5),
             [rand(1500, 1000), rand(1000), rand(1000)], 1500 + 2 * 1000),
        Case("softmax", "X 2000x1000, rows", tc.define(SOFTMAX), timpl["softmax"], [rand(2000, 1000)], 2 * 1000),
        Case("maxpool", "I 12x48x46x46, 2x2 stride 2", tc.define(MAXPOOL), timpl["maxpool"],
             [rand(12, 48, 46, 46)], 4),
        # mlp2: the output sums K then H terms
        Case("mlp2", "X 96x500 -> 900 -> 300, relu", tc.define(MLP),
             lambda x, w1, b1, w2, b2: F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2),
             [rand(96, 500), rand(900, 500, scale=0.05), rand(900), rand(300, 900, scale=0.05), rand(300)],
             500 + 900),
        Case("embed_bag", f"table V{V} D{D}, idx B{B} L{L}, sum", tc.define(EMBEDDING_BAG),
             lambda t, i: F.embedding_bag(i, t, mode="sum"), [rand(V, D), idx], max(L, most)),
        Case("tiny_fc", "X 8x8 -> 8, bias", tc.define(FC), lambda x, w, b: F.linear(x, w, b),
             [rand(8, 8), rand(8, 8), rand(8)], 8),
    ]


def leaves(inputs: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Fresh copies of the inputs; the floating ones require grad (converted to ``dtype`` if given)."""
    out = []
    for x in inputs:
        if x.is_floating_point():
            out.append(x.detach().to(dtype or x.dtype, copy=True).requires_grad_(True))
        else:
            out.append(x)
    return out


def quiesce(max_s: float = 1.0, pause: float = 0.01) -> None:
    """Sleep until this process's threads stop using CPU (at most ``max_s``)."""
    bench.quiesce(max_s, pause)


def step(fn: Callable[..., torch.Tensor], batch: list[list[torch.Tensor]], gy: torch.Tensor, backward: bool) -> float:
    """Seconds per step: one step on each set of leaves in ``batch``, timed together; with more than
    one set, the first step is an untimed one that wakes the thread pools."""
    def one(xs: list[torch.Tensor]) -> None:
        if backward:
            fn(*xs).backward(gy)
        else:
            with torch.no_grad():
                fn(*xs)

    quiesce()
    if len(batch) > 1:
        one(batch[0])
        batch = batch[1:]
    start = time.perf_counter()
    for xs in batch:
        one(xs)
    return (time.perf_counter() - start) / len(batch)


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def errors(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], gy: torch.Tensor,
           y_ref: torch.Tensor, g_ref: list[torch.Tensor]) -> float:
    """The largest relative difference of ``fn``'s output and input gradients from the float64 ones."""
    xs = leaves(inputs)
    y = fn(*xs)
    y.backward(gy)
    grads = [x.grad for x in xs if x.requires_grad]
    assert all(g is not None for g in grads), "an input that requires grad got no gradient"
    return max([rel(y.detach(), y_ref)] + [rel(a, b) for a, b in zip(grads, g_ref)])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# peak memory of a step (see the module's docstring)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


_MALLOC_TRIM: Callable[[int], int] | None
try:
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim  # glibc: hand free heap pages back to the kernel
except (OSError, AttributeError):
    _MALLOC_TRIM = None


def memory_supported() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kb("VmHWM")
        return True
    except OSError:
        return False


def peak_bytes(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], gy: torch.Tensor) -> int:
    """What one forward + backward adds to the process's peak resident memory, in bytes."""
    xs = leaves(inputs)
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    before = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    fn(*xs).backward(gy)
    peak = _status_kb("VmHWM")
    del xs
    return max(0, peak - before) * 1024


# ----------------------------------------------------------------------------------------------


def tune(case: Case, budget: float) -> str:
    """Tune the layer's training step (forward and backward defs, ``budget`` seconds each); a line
    with the tuner's decisions."""
    t0 = time.perf_counter()
    res = case.kernel.autotune(*case.inputs, backward=True, budget=budget, progress=False)  # type: ignore[attr-defined]
    parts = []
    for what, r in (("forward", res.forward), ("backward", res.backward)):
        d = r.decision
        if d is None:
            verdict = "no decision"
        elif d.rounds == 0:
            verdict = f"{'kept' if d.keep else 'dropped'} ({d.why})"
        else:
            won = f"{d.speedup:.2f}x the defaults, {d.wins}/{d.rounds} rounds won"
            verdict = f"{'kept' if d.keep else 'dropped'} ({won})"
        parts.append(f"{what} {verdict}")
    return f"  tuned {case.name} in {time.perf_counter() - t0:.0f} s: " + "; ".join(parts)


def run(case: Case, rounds: int, memory: bool) -> dict:
    k = case.kernel
    xs_r = leaves(case.inputs, torch.float64)
    y_r = case.reference(*xs_r)
    gy = torch.rand(y_r.shape, generator=torch.Generator().manual_seed(1)) - 0.5
    y_r.backward(gy.double())
    g_ref = [x.grad for x in xs_r if x.requires_grad]
    contenders = {"tcdsl": k, "torch": case.reference}
    err = {n: errors(fn, case.inputs, gy, y_r.detach(), g_ref) for n, fn in contenders.items()}  # type: ignore[arg-type]
    reps: dict[tuple[str, bool], int] = {}
    for w in range(2):  # warm-up (the first step compiles); then 3 back-to-back steps give the batch size
        for n, fn in contenders.items():
            for b in (True, False):
                t = step(fn, [leaves(case.inputs) for _ in range(1 + 3 * w)], gy, b)  # type: ignore[arg-type]
                reps[(n, b)] = 1 if t >= BATCH_S else 1 + min(1000, math.ceil(BATCH_S / max(t, 1e-7)))
    peaks: dict[str, int | None] = {n: None for n in contenders}
    if memory:
        got: dict[str, list[int]] = {n: [] for n in contenders}
        for r in range(MEM_REPEATS):
            for n, fn in list(contenders.items())[:: 1 if r % 2 == 0 else -1]:
                got[n].append(peak_bytes(fn, case.inputs, gy))  # type: ignore[arg-type]
        peaks = {n: min(v) for n, v in got.items()}
    times: dict[tuple[str, bool], list[float]] = {(n, b): [] for n in contenders for b in (True, False)}
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for n, fn in order:
            for b in (True, False):
                batch = [leaves(case.inputs) for _ in range(reps[(n, b)])]
                times[(n, b)].append(step(fn, batch, gy, b))  # type: ignore[arg-type]
    med = {f"{n}_{'fb' if b else 'f'}": statistics.median(v) for (n, b), v in times.items()}
    pairs = [t / d for t, d in zip(times[("torch", True)], times[("tcdsl", True)])]  # each round's f+b speed
    return {"err": err["tcdsl"], "torch_err": err["torch"], "tol": C_ERR * EPS32 * case.terms,
            "tcdsl_mem": peaks["tcdsl"], "torch_mem": peaks["torch"], "fb_interval": median_interval(pairs), **med}


def per_call(rounds: int) -> dict[str, float]:
    """Microseconds per call of a one-element kernel, and of torch eager's ``A + 1``: the median over
    ``rounds`` samples, each a loop of calls lasting about 20 ms after an untimed call."""
    k = tc.define(ONE)
    short = tc.define(ONE_SHORT)(lambda A: None)
    a = np.zeros(1, np.float32)
    ta = torch.zeros(1)
    tg = torch.zeros(1, requires_grad=True)
    g1 = torch.ones(1)

    def fb(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        return lambda: fn(tg).backward(g1)

    a_out, ta_out, ta_eager = np.zeros(1, np.float32), torch.zeros(1), torch.zeros(1)
    variants: dict[str, Callable[[], object]] = {
        "numpy": lambda: k(a),
        "numpy_out": lambda: k(a, out=a_out),
        "numpy_short": lambda: short(a),
        "torch": lambda: k(ta),
        "torch_out": lambda: k(ta, out=ta_out),
        "torch_short": lambda: short(ta),
        "eager_out": lambda: torch.add(ta, 1.0, out=ta_eager),
        "torch_fb": fb(k),  # type: ignore[arg-type]
        "eager": lambda: ta + 1.0,
        "eager_fb": fb(lambda x: x + 1.0),
    }
    calls = {}
    for name, call in variants.items():
        for _ in range(20):  # warm-up; the first call compiles
            call()
        quiesce()
        call()
        t0 = time.perf_counter()
        for _ in range(100):
            call()
        calls[name] = max(100, math.ceil(0.02 / ((time.perf_counter() - t0) / 100)))
    samples: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            call, n = variants[name], calls[name]
            quiesce()
            call()  # untimed: wakes the thread pools
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
    return {n: statistics.median(v) for n, v in samples.items()}


def mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="", help="comma-separated: layers (and per_call) whose name contains one")
    ap.add_argument("--tune", type=float, default=None, metavar="SECONDS",
                    help="tune each layer's forward and backward defs first, this many seconds each")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    t_start = time.perf_counter()
    target = cpu_target()
    print(f"tcdsl CPU target (TCDSL_CPU={os.environ.get('TCDSL_CPU', 'native')}): {target.isa}: {target}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32; medians of {args.rounds} rounds")
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.tune is not None:
        print(f"options: tuned, {args.tune:g} s per def (forward and backward), then used by autograd")
    memory = memory_supported()
    if not memory:
        print("peak memory: n/a (needs Linux's /proc/self/clear_refs)")
    print()
    print(f"speed = torch time / tcdsl time (above 1: tcdsl is faster; target >= {SPEED_TARGET}); "
          f"peak MiB = what one forward + backward adds to the peak resident memory (target tcdsl <= "
          f"{MEM_TARGET}x torch); err = max relative difference from torch float64 (FAIL above tol)")
    header = (f"{'layer':<11} {'shapes':<40} {'tcdsl f+b ms':>12} {'torch f+b ms':>12} {'f+b speed':>9} "
              f"{'f speed':>7} {'tcdsl MiB':>9} {'torch MiB':>9} {'mem x':>6} {'tcdsl err':>9} {'torch err':>9} "
              f"{'tol':>7}")
    print(header)
    print("-" * len(header))
    failed = False
    results: dict[str, dict] = {}
    for case in cases():
        if only and not any(o in case.name for o in only):
            continue
        if args.tune is not None:
            print(tune(case, args.tune), flush=True)
        r = run(case, args.rounds, memory)
        results[case.name] = r
        bad = not r["err"] <= r["tol"]
        failed |= bad
        tm, pm = r["tcdsl_mem"], r["torch_mem"]
        mem_x = f"{tm / pm:6.2f}" if tm is not None and pm else f"{'n/a':>6}"
        print(f"{case.name:<11} {case.shapes:<40} {r['tcdsl_fb'] * 1e3:12.3f} {r['torch_fb'] * 1e3:12.3f} "
              f"{r['torch_fb'] / r['tcdsl_fb']:9.2f} {r['torch_f'] / r['tcdsl_f']:7.2f} {mib(tm):>9} {mib(pm):>9} "
              f"{mem_x} {r['err']:9.1e} {r['torch_err']:9.1e} {r['tol']:7.1e}{'  FAIL' if bad else ''}", flush=True)
    calls = None
    if not only or any(o in "per_call" for o in only):
        calls = per_call(args.rounds)
        print()
        print(f"per call: a one-element kernel `{ONE}`, N=1, a loop of calls (us per call, median of "
              f"{args.rounds} rounds)")
        rows = [("numpy array in", calls["numpy"], f"target <= {NUMPY_CALL_TARGET_US:g} us", None),
                ("numpy array in, out=", calls["numpy_out"], "", None),
                ("numpy array in, short form", calls["numpy_short"], "", None),
                ("torch tensor, no grad", calls["torch"], f"target <= {TORCH_CALL_TARGET_US:g} us",
                 calls["eager"]),
                ("torch tensor, out=", calls["torch_out"], "", calls["eager_out"]),
                ("torch tensor, short form", calls["torch_short"], "", calls["eager"]),
                ("torch, requires_grad, forward + backward", calls["torch_fb"], "", calls["eager_fb"])]
        for what, us, tgt, eager in rows:
            peer = "" if eager is None else f"torch eager A + 1{', out=' if 'out=' in what else ''}: {eager:8.1f} us"
            print(f"  {what:<42} {us:8.1f} us  {tgt:<18} {peer}")
    print()
    print("targets")
    speed = {n: r["torch_fb"] / r["tcdsl_fb"] for n, r in results.items() if n != "tiny_fc"}
    if speed:
        def goal(n: str) -> float:
            return SPEED_TARGET if args.tune is None else TUNED_TARGET_HIGH.get(n, TUNED_TARGET)

        slow = [f"{n} {s:.2f} (target {goal(n):g})" for n, s in speed.items() if s < goal(n)]
        what = f">= {SPEED_TARGET}" if args.tune is None else \
            f"(tuned) >= {TUNED_TARGET}, group conv and embedding bag >= {TUNED_TARGET_HIGH['group_conv']}"
        print(f"- f+b speed {what} (torch time / tcdsl time): {len(speed) - len(slow)}/{len(speed)} "
              f"layers met" + (f"; missed: {', '.join(slow)}" if slow else ""))
        spans = {n: results[n]["fb_interval"] for n in speed}
        close = [f"{n} {lo:.2f}-{hi:.2f}" for n, got in spans.items() if got is not None
                 for lo, hi in [got] if lo <= goal(n) <= hi]
        if close:
            print(f"  within this run's noise of the target (the 95% interval of the rounds' paired median holds "
                  f"it): {', '.join(close)}")
    if "tiny_fc" in results:
        r = results["tiny_fc"]
        x = r["tcdsl_fb"] / r["torch_fb"]
        print(f"- tiny layer (fc 8x8 -> 8) f+b within {TINY_TARGET:g}x torch eager: tcdsl {r['tcdsl_fb'] * 1e6:.0f} "
              f"us, torch {r['torch_fb'] * 1e6:.0f} us, {x:.1f}x: {'met' if x <= TINY_TARGET else 'missed'}")
    if calls is not None:
        for path, us, limit in (("numpy path", calls["numpy"], NUMPY_CALL_TARGET_US),
                                ("torch path", calls["torch"], TORCH_CALL_TARGET_US)):
            print(f"- per call, {path} <= {limit:g} us: {us:.1f} us: {'met' if us <= limit else 'missed'}")
    mems = {n: r["tcdsl_mem"] / r["torch_mem"] for n, r in results.items() if r["tcdsl_mem"] is not None
            and r["torch_mem"]}
    if mems:
        over = [f"{n} {m:.2f}x" for n, m in mems.items() if m > MEM_TARGET]
        print(f"- peak memory of a step <= {MEM_TARGET}x torch's: {len(mems) - len(over)}/{len(mems)} layers met"
              + (f"; missed: {', '.join(over)}" if over else ""))
    print(f"- gradients: {'FAIL (see the table)' if failed else 'all layers within tolerance'}")
    print(f"total {time.perf_counter() - t_start:.0f} s; load average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
