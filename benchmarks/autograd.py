"""Autograd benchmark: forward + backward of tcdsl kernels (derived backward defs, C backend) against
PyTorch eager on the CPU, side by side in one process.

usage: .venv/bin/python benchmarks/autograd.py [--rounds N] [--only NAME[,NAME...]]

Each round times one forward + backward of each contender (the order alternating), after warm-up
calls that also compile tcdsl's kernels; every timed call starts once the thread pools of the
previous one have stopped spinning (torch's and tcdsl's OpenMP pools are separate: on a machine
with few cores one spinning pool steals the cores of the other). The table shows medians, ``tcdsl / torch`` (below 1:
tcdsl is faster) for forward + backward and for the forward alone, and the largest relative
difference between tcdsl's and torch's output and input gradients (FAIL above 1e-3; exit status 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import tcdsl as tc
from tcdsl import bench

CONV = """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
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


@dataclass
class Case:
    name: str
    shapes: str
    kernel: object
    reference: Callable[..., torch.Tensor]
    inputs: list[torch.Tensor]


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.rand(*shape, generator=g) * 2 - 1) * scale

    return [
        Case("conv2d", "I 8x16x32x32, W 32x16x3x3", tc.define(CONV),
             lambda i, w: F.conv2d(i, w), [rand(8, 16, 32, 32), rand(32, 16, 3, 3, scale=0.1)]),
        Case("mlp2", "X 128x512, W1 1024x512, W2 256x1024", tc.define(MLP),
             lambda x, w1, b1, w2, b2: F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2),
             [rand(128, 512), rand(1024, 512, scale=0.05), rand(1024), rand(256, 1024, scale=0.05), rand(256)]),
        Case("layernorm", "X 512x1024", tc.define(LAYERNORM),
             lambda x, gm, bt: F.layer_norm(x, (x.shape[1],), gm, bt, eps=1e-5),
             [rand(512, 1024), rand(1024), rand(1024)]),
    ]


def leaves(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(True) for x in inputs]


def quiesce(max_s: float = 1.0, pause: float = 0.01) -> None:
    """Sleep until this process's threads stop using CPU (at most ``max_s``)."""
    bench.quiesce(max_s, pause)


def step(fn: Callable[..., torch.Tensor], xs: list[torch.Tensor], gy: torch.Tensor, backward: bool) -> float:
    quiesce()
    start = time.perf_counter()
    if backward:
        y = fn(*xs)
        y.backward(gy)
    else:
        with torch.no_grad():
            fn(*xs)
    return time.perf_counter() - start


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run(case: Case, rounds: int) -> dict:
    k = case.kernel
    xs_t, xs_r = leaves(case.inputs), leaves(case.inputs)
    y_t, y_r = k(*xs_t), case.reference(*xs_r)  # type: ignore[operator]
    gy = torch.rand(y_r.shape, generator=torch.Generator().manual_seed(1)) - 0.5
    y_t.backward(gy)
    y_r.backward(gy)
    err = max([rel(y_t.detach(), y_r.detach())] + [rel(a.grad, b.grad) for a, b in zip(xs_t, xs_r)])
    contenders = {"tcdsl": k, "torch": case.reference}
    times: dict[tuple[str, bool], list[float]] = {(n, b): [] for n in contenders for b in (True, False)}
    for _ in range(2):  # warm-up
        for fn in contenders.values():
            for b in (True, False):
                step(fn, leaves(case.inputs), gy, b)  # type: ignore[arg-type]
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for n, fn in order:
            for b in (True, False):
                xs = leaves(case.inputs)
                times[(n, b)].append(step(fn, xs, gy, b))  # type: ignore[arg-type]
    med = {key: statistics.median(v) for key, v in times.items()}
    return {"err": err, **{f"{n}_{'fb' if b else 'f'}": t for (n, b), t in med.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32; medians of {args.rounds} rounds")
    header = (f"{'kernel':<10} {'shapes':<36} {'tcdsl f+b ms':>12} {'torch f+b ms':>12} {'f+b ratio':>9} "
              f"{'tcdsl f ms':>10} {'torch f ms':>10} {'f ratio':>8} {'max rel err':>11}")
    print(header)
    print("-" * len(header))
    failed = False
    for case in cases():
        if only and not any(o in case.name for o in only):
            continue
        r = run(case, args.rounds)
        bad = r["err"] > 1e-3
        failed |= bad
        print(f"{case.name:<10} {case.shapes:<36} {r['tcdsl_fb'] * 1e3:12.2f} {r['torch_fb'] * 1e3:12.2f} "
              f"{r['tcdsl_fb'] / r['torch_fb']:9.2f} {r['tcdsl_f'] * 1e3:10.2f} {r['torch_f'] * 1e3:10.2f} "
              f"{r['tcdsl_f'] / r['torch_f']:8.2f} {r['err']:11.1e}{'  FAIL' if bad else ''}")
    print("ratio = tcdsl time / torch time (below 1: tcdsl is faster)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
