"""Conv layers as models use them: padding, strides, 1x1 to 7x7 windows, forward and forward +
backward (the derived backward defs), tcdsl's C backend against PyTorch eager, side by side.

usage: .venv/bin/python benchmarks/conv_layers.py [--rounds N] [--only NAME[,NAME...]]

Each layer is one TC def written as a user writes it: padding by domain (``I(n, c, h + kh - p, w +
kw - p)`` with ``where h in 0:OH, w in 0:OW``: the reads outside the image are left out of the sum)
and strides in the subscripts. torch runs ``F.conv2d(..., stride, padding)`` on the same tensors.
A round times one forward and one forward + backward (gradients of the input and the weights) of
each contender, the first rotating, after warm-up calls that compile tcdsl's kernels, as
tcdsl.bench.measure does: each sample waits until the previous one's thread pools have stopped
spinning, makes one untimed call that wakes its own pools, then times a batch of calls lasting at
least 20 ms (back-to-back layers, as in a training step, rather than the wake-up of sleeping
threads: on a VM a parallel region after an idle pause can wait 4-8 ms for a descheduled vCPU).
The table gives medians, GFLOP/s (a forward's 2·N·F·C·KH·KW·OH·OW; forward + backward three
times that), tcdsl's share of the machine's float32 FMA peak (measured in the same run, as
benchmarks/cpu.py does, with the target's real vector width) and the speed ratios ``torch time /
tcdsl time`` (above 1: tcdsl is faster). Outputs and gradients are checked against torch float64.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from cpu import FmaPeak, measure_fma_peak  # benchmarks/cpu.py: the FMA peak loop

import tcdsl as tc
from tcdsl import bench
from tcdsl.compiler import cpu_target

ROUNDS = 9
TOL = 1e-4  # max |tcdsl - torch float64| / max |torch float64|, per output and gradient


@dataclass(frozen=True)
class Layer:
    name: str
    n: int
    c: int
    hw: int
    f: int
    k: int
    stride: int = 1
    pad: int = 0

    @property
    def out(self) -> int:
        return (self.hw + 2 * self.pad - self.k) // self.stride + 1

    def source(self) -> str:
        def at(v: str, r: str) -> str:
            base = f"{self.stride} * {v}" if self.stride != 1 else v
            return f"{base} + {r}" + (f" - {self.pad}" if self.pad else "")

        where = f" where h in 0:{self.out}, w in 0:{self.out}" if self.pad or self.stride != 1 else ""
        return (f"def {self.name}(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {{\n"
                f"    O(n,f,h,w) +=! I(n,r_c,{at('h', 'r_kh')},{at('w', 'r_kw')}) * W1(f,r_c,r_kh,r_kw){where}\n}}")

    def flops(self) -> float:
        return 2.0 * self.n * self.f * self.c * self.k * self.k * self.out * self.out


LAYERS = [
    Layer("conv3x3", 8, 16, 32, 32, 3),
    Layer("conv3x3_pad", 8, 16, 32, 32, 3, pad=1),
    Layer("conv5x5", 8, 16, 32, 32, 5),
    Layer("conv5x5_pad", 8, 16, 32, 32, 5, pad=2),
    Layer("conv7x7_pad", 4, 16, 40, 16, 7, pad=3),
    Layer("conv1x1", 8, 64, 14, 64, 1),
    Layer("conv3x3_s2", 8, 32, 29, 32, 3, stride=2),
    Layer("conv3x3_s2_pad", 8, 32, 28, 32, 3, stride=2, pad=1),
    Layer("stem7x7_s2_pad", 4, 3, 64, 16, 7, stride=2, pad=3),
]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def run(layer: Layer, rounds: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((layer.n, layer.c, layer.hw, layer.hw)).astype(np.float32))
    w = torch.from_numpy((rng.standard_normal((layer.f, layer.c, layer.k, layer.k)) * 0.1).astype(np.float32))
    d_o = torch.from_numpy(rng.standard_normal((layer.n, layer.f, layer.out, layer.out)).astype(np.float32))
    x.requires_grad_()
    w.requires_grad_()
    k = tc.define(layer.source())

    def theirs(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.conv2d(*inputs, stride=layer.stride, padding=layer.pad)

    # correctness: outputs and gradients against torch in float64
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = theirs((x64, w64))
    want_g = torch.autograd.grad(want, (x64, w64), d_o.double())
    got = k(x, w)
    got_g = torch.autograd.grad(got, (x, w), d_o)
    err = max(float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max())
              for a, b in zip((got, *got_g), (want, *want_g)))
    contenders = {
        "tcdsl f": lambda: k(x, w),
        "torch f": lambda: theirs((x, w)),
        "tcdsl f+b": lambda: torch.autograd.grad(k(x, w), (x, w), d_o),
        "torch f+b": lambda: torch.autograd.grad(theirs((x, w)), (x, w), d_o),
    }
    for call in contenders.values():
        call()
    samples = bench.measure([bench.Variant(name, call) for name, call in contenders.items()], rounds)
    out = {name: median_ms(s) for name, s in samples.items()}
    out["err"] = err
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--only", default="", help="layers whose name contains one of these (comma-separated)")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    wanted = [s for s in args.only.split(",") if s]
    layers = [lay for lay in LAYERS if not wanted or any(s in lay.name for s in wanted)]
    print(f"tcdsl CPU target (TCDSL_CPU={os.environ.get('TCDSL_CPU', 'native')}): {cpu_target()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32; medians of {args.rounds} rounds")
    peak = max(measure_fma_peak(FmaPeak()).values())
    print(f"float32 FMA peak: {peak:.1f} GFLOP/s (all threads)")
    print()
    print("| layer | shape | tcdsl f ms | torch f ms | f speed | tcdsl f+b ms | torch f+b ms | f+b speed "
          "| tcdsl f+b GFLOP/s | share of peak | err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failed = []
    for lay in layers:
        r = run(lay, args.rounds)
        fb = 3 * lay.flops() / (r["tcdsl f+b"] * 1e-3) / 1e9
        shape = f"N{lay.n} C{lay.c} {lay.hw}x{lay.hw} F{lay.f} {lay.k}x{lay.k} s{lay.stride} p{lay.pad}"
        print(f"| {lay.name} | {shape} | {r['tcdsl f']:.3f} | {r['torch f']:.3f} | {r['torch f'] / r['tcdsl f']:.2f} "
              f"| {r['tcdsl f+b']:.3f} | {r['torch f+b']:.3f} | {r['torch f+b'] / r['tcdsl f+b']:.2f} | {fb:.1f} "
              f"| {fb / peak:.2f} | {r['err']:.1e} |", flush=True)
        if not r["err"] <= TOL:
            failed.append(lay.name)
    print()
    print("all outputs and gradients within tolerance" if not failed else f"FAIL (error above {TOL}): {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
