"""GPU check: conformance on CUDA against the interpreter, then timings against torch.

usage: python benchmarks/gpu.py [--backend cuda|opencl] [--quick] [--only NAME[,NAME...]]
                                [--options JSON] [--reps N] [--budget S] [--json PATH]
                                [--no-conformance] [--no-timing] [--tf32] [--cases PATH]

1. Every conformance case (``../shared/conformance/cases.py``, found by path; see --cases) runs on the
   chosen GPU backend and is compared with tcdsl's interpreter (``backend="numpy"``), with the
   case's own tolerance (relative 2-norm error, as ``conformance/run.py``). On CUDA each case runs
   twice: numpy arrays in (copied to the device, numpy out) and cupy arrays in (cupy out).
2. Thirteen kernels are timed against torch on the same device (cuBLAS / cuDNN and torch's own
   kernels; TF32 off unless --tf32, so both sides compute in fp32): matmul 4096^3, tmm
   128x16384x4096 (C = A * B^T), batched matmul 500x26x72x26, group conv N32 G32 C=F=16 56x56 3x3,
   fused FC+bias+relu, softmax, layernorm, conv2d N32 C64 F64 56x56 3x3, 2x2 max pooling, the sum
   of 64M floats, an elementwise tanh(A * B + C), an 8192^2 transpose and an embedding bag's table
   gradient (a scatter-add), with the naive (default) mapping options unless --options says otherwise.

Timing: a first call (compile + run, reported as "first s"), two warm-up calls, then N timed calls
(N sized to about --target seconds per contender, 3 at least, 1 for calls over 2 s; --reps fixes
it). Each contender's figure is the median. On CUDA:
- "tcdsl ms": device time of tcdsl's kernels alone, launched back to back between CUDA events (the
  compiled program the public call built, replayed on buffers allocated once);
- "call ms": the public call ``kernel(*cupy_arrays)``, wall clock between device synchronisations
  (binding, output allocation, launches and the error-flag read that ends each call);
- "torch ms": the torch function between CUDA events (``torch.cuda.Event``), back to back.
The ratio is torch ms / tcdsl ms (above 1: tcdsl is faster). Every tcdsl result is checked against
torch (max |tcdsl - torch| / max |torch|, MISMATCH above 1e-4).

``--backend opencl`` is a dry run of this script on any machine: OpenCL through pyopencl (PoCL on a
CPU), tiny sizes, torch on the CPU as the comparator, wall-clock times of the public call only.

On the device machine tcdsl need not be installed: when ``import tcdsl`` fails, the package is
loaded from this checkout (its islpy and lark must still be importable; see gpu_setup.sh).
Exit status: 1 when a conformance case fails or a timed kernel errors or disagrees with torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tcdsl.codegen.gpu import ERR_INTS

ROOT = Path(__file__).resolve().parents[1]
BENCH_TOL = 1e-4  # max |tcdsl - torch| / max |torch|
SLOW_CALL_S = 2.0  # calls slower than this are timed once after the warm-up
MAX_REPS = 50
WARMUP = 2  # untimed calls before the timed ones (after tcdsl's first, compiling call); the last sizes N


# ----------------------------------------------------------------------------------------------
# imports that must work on a bare device machine


def import_tcdsl() -> tuple[Any, str]:
    """``tcdsl``, installed or (when not installed) loaded from this checkout: the package maps
    ``tcdsl.core``, ``tcdsl.grammar``, ``tcdsl.polyhedral`` and ``tcdsl.codegen`` to the folders at the
    repository root (pyproject's package-dir), so the checkout's root is added to the package's path."""
    if os.environ.get("TCDSL_BENCH_FROM_TREE") != "1":
        try:
            import tcdsl

            return tcdsl, f"installed ({Path(tcdsl.__file__).parent})"
        except ImportError as e:
            if e.name is not None and not e.name.startswith("tcdsl"):
                raise  # tcdsl was found but one of its dependencies (islpy, lark) is missing
    for name in [m for m in sys.modules if m == "tcdsl" or m.startswith("tcdsl.")]:
        del sys.modules[name]
    init = ROOT / "tcdsl" / "__init__.py"
    spec = importlib.util.spec_from_file_location("tcdsl", init,
                                                  submodule_search_locations=[str(ROOT / "tcdsl"), str(ROOT)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load tcdsl from {init}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tcdsl"] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop("tcdsl", None)
        raise
    return mod, f"from the checkout {ROOT} (not installed)"


def load_cases(path: str | None) -> tuple[list[dict[str, Any]], Any, str]:
    """The conformance cases, imported by path: --cases, else ../shared/conformance/cases.py beside
    the checkout, else shared/ in it, else .gpu/conformance/cases.py (the copy gpu_setup.sh
    prepare makes, since ../shared does not travel to the device machine)."""
    candidates = [Path(path)] if path else [ROOT.parent / "shared" / "conformance" / "cases.py",
                                            ROOT / "shared" / "conformance" / "cases.py",
                                            ROOT / ".gpu" / "conformance" / "cases.py"]
    for p in candidates:
        if p.is_file():
            spec = importlib.util.spec_from_file_location("tcdsl_conformance_cases", p)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            return list(mod.CASES), mod.gen, str(p)
    raise FileNotFoundError("no conformance cases at " + ", ".join(str(p) for p in candidates))


# ----------------------------------------------------------------------------------------------
# the device: cupy + torch.cuda, or pyopencl + torch on the CPU


class Device:
    def __init__(self, backend: str, torch: Any) -> None:
        self.backend = backend
        self.torch = torch
        self.cp: Any = None
        if backend == "cuda":
            import cupy

            self.cp = cupy

    @property
    def cuda(self) -> bool:
        return self.backend == "cuda"

    def to_tc(self, a: np.ndarray) -> Any:
        return self.cp.asarray(a) if self.cuda else a

    def to_torch(self, a: np.ndarray) -> Any:
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        return t.to("cuda") if self.cuda else t

    def host(self, x: Any) -> np.ndarray:
        if self.torch is not None and isinstance(x, self.torch.Tensor):
            return x.detach().cpu().numpy()
        if self.cp is not None and isinstance(x, self.cp.ndarray):
            return self.cp.asnumpy(x)
        return np.asarray(x)

    def sync(self) -> None:
        if self.cuda:
            self.cp.cuda.Device().synchronize()
            if self.torch is not None:
                self.torch.cuda.synchronize()

    def free(self) -> None:
        if self.cuda:
            self.cp.get_default_memory_pool().free_all_blocks()
            if self.torch is not None:
                self.torch.cuda.empty_cache()


def describe(dev: Device, tc: Any, how: str, options: Any, torch_note: str) -> None:
    print("## machine")
    print(f"- python {platform.python_version()}, numpy {np.__version__}, tcdsl {tc.__version__} {how}")
    if dev.cuda:
        cp = dev.cp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        cc = cp.cuda.Device().compute_capability
        drv = cp.cuda.runtime.driverGetVersion()
        try:
            from cupy.cuda import nvrtc

            nv = nvrtc.getVersion()
        except Exception as e:  # noqa: BLE001 - only a report line
            nv = f"unknown ({e})"
        print(f"- GPU: {name}, sm_{cc}, {props['multiProcessorCount']} SMs, "
              f"{props['totalGlobalMem'] / 2**30:.0f} GiB; driver API {drv}; cupy {cp.__version__}, NVRTC {nv}")
    else:
        try:
            from tcdsl import gpurt

            _, ctx, _ = gpurt.opencl()
            d = ctx.devices[0]
            print(f"- OpenCL device: {d.name.strip()} ({d.platform.name.strip()}), {d.max_compute_units} units")
        except Exception as e:  # noqa: BLE001 - only a report line
            print(f"- OpenCL device: unknown ({e})")
    t = dev.torch
    if t is not None:
        extra = ""
        if dev.cuda:
            extra = (f", CUDA {t.version.cuda}, cuDNN {t.backends.cudnn.version()}, "
                     f"TF32 matmul={t.backends.cuda.matmul.allow_tf32} cudnn={t.backends.cudnn.allow_tf32}")
        else:
            extra = f", {t.get_num_threads()} CPU threads"
        print(f"- torch {t.__version__}{extra}")
    else:
        print(f"- torch: {torch_note}")
    print(f"- tcdsl mapping options: {options.to_json()}")
    print()


# ----------------------------------------------------------------------------------------------
# 1. conformance


def rel_norm_err(got: np.ndarray, want: np.ndarray) -> float:
    """As conformance/run.py: ||got - want||_2 / ||want||_2."""
    return float(np.linalg.norm((got.astype("float64") - want.astype("float64")).ravel())
                 / max(float(np.linalg.norm(want.astype("float64").ravel())), 1e-30))


def compare(got: Sequence[Any], want: Sequence[Any], tol: float, dev: Device) -> tuple[str | None, float]:
    """(failure or None, the worst error)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}", float("inf")
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = dev.host(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, want {w.shape}", float("inf")
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, want {w.dtype}", float("inf")
        if tol == 0:
            if not np.array_equal(g, w):
                return f"output {i}: not equal", float("inf")
            continue
        err = rel_norm_err(g, w)
        worst = max(worst, err)
        if not np.isfinite(err) or err > tol:
            return f"output {i}: rel err {err:.2e} > {tol}", err
    return None, worst


def as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def run_conformance(tc: Any, dev: Device, options: Any, cases_path: str | None) -> tuple[int, list[str], list[dict]]:
    cases, gen, where = load_cases(cases_path)
    print(f"## conformance: {len(cases)} cases from {where}, backend {dev.backend} against the interpreter")
    fails: list[str] = []
    rows: list[dict] = []
    for c in cases:
        t0 = time.perf_counter()
        row: dict[str, Any] = {"name": c["name"]}
        try:
            args = [gen(shape, dtype, kind) for shape, dtype, kind in c["inputs"].values()]
            k = tc.define(c["src"])
            want = as_tuple(k(*[a.copy() for a in args], backend="numpy"))
            got = as_tuple(k(*[a.copy() for a in args], backend=dev.backend, options=options))
            bad = [t for t in got if not isinstance(t, np.ndarray)]
            why, err = compare(got, want, c["tol"], dev)
            if why is None and bad:
                why = f"host arrays in, {type(bad[0]).__name__} out (want numpy)"
            notes = []
            if why is None and dev.cuda:
                dgot = as_tuple(k(*[dev.to_tc(a) for a in args], options=options))
                dbad = [t for t in dgot if not isinstance(t, dev.cp.ndarray)]
                why, derr = compare(dgot, want, c["tol"], dev)
                why = f"cupy arrays in: {why}" if why else None
                if why is None and dbad:
                    why = f"cupy arrays in, {type(dbad[0]).__name__} out (want cupy)"
                err = max(err, derr)
                notes.append("cupy in/out ok")
            try:  # the case's numpy reference, for information: the interpreter is the oracle here
                rwhy, rerr = compare(got, [np.asarray(r) for r in c["ref"](*[a.copy() for a in args])], c["tol"], dev)
                notes.append(f"vs reference {rerr:.1e}" + (f" (REFERENCE MISMATCH: {rwhy})" if rwhy else ""))
            except Exception as e:  # noqa: BLE001
                notes.append(f"reference failed: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - one case's failure must not stop the others
            why, err, notes = f"{type(e).__name__}: {str(e).strip()[:300]}", float("nan"), []
            if os.environ.get("TCDSL_BENCH_TRACEBACK"):
                traceback.print_exc()
        dt = time.perf_counter() - t0
        row.update(ok=why is None, error=why, rel_err=err, seconds=round(dt, 3))
        rows.append(row)
        if why is None:
            print(f"PASS {c['name']:<20} max rel err {err:.1e}; {'; '.join(notes)} ({dt:.1f} s)", flush=True)
        else:
            fails.append(c["name"])
            print(f"FAIL {c['name']:<20} {why} ({dt:.1f} s)", flush=True)
    print(f"conformance: {len(cases) - len(fails)} passed, {len(fails)} failed\n", flush=True)
    return len(cases), fails, rows


# ----------------------------------------------------------------------------------------------
# 2. timings

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,r_k) * B(n,r_k) }"
BMM = "def bmm(float(B,N,M) X, float(B,M,K) Y) -> (Z) { Z(b,n,k) +=! X(b,n,r_m) * Y(b,r_m,k) }"
GROUP_CONV = """def group_conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,r_c,h + r_kh,w + r_kw) * W1(g,f,r_c,r_kh,r_kw)
}"""
FC_RELU = """def fc_relu(float(B,M) I, float(N,M) W1, float(N) B1) -> (O) {
    O(b,n) +=! I(b,r_m) * W1(n,r_m)
    O(b,n) = fmax(O(b,n) + B1(n), 0.0)
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
CONV2D = """def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
}"""
MAXPOOL = """def maxpool(float(N,C,H,W) X) -> (Y) {
    Y(n,c,h,w) max=! X(n,c,2*h + r_i,2*w + r_j) where r_i in 0:2, r_j in 0:2
}"""
TOTAL = "def total(float(N) A) -> (S) { S() +=! A(r_n) }"
ELEMENTWISE = "def tanh_fma(float(N) A, float(N) B, float(N) C) -> (O) { O(i) = tanh(A(i) * B(i) + C(i)) }"
TRANSPOSE = "def transpose(float(M,N) A) -> (O) { O(j,i) = A(i,j) }"
BAG_GRAD = """def bag_grad(float(B,D) G, int64(B,L) Idx) -> (T) {
    T(x,d) +=! (x == Idx(b,l)) ? G(b,d) : 0.0 where x in 0:VOCAB, d in 0:D, b in 0:B, l in 0:L
}"""


@dataclass
class Bench:
    name: str
    label: str
    src: str
    shapes: list[tuple[int, ...]]
    flops: float = 0.0  # arithmetic kernels: GFLOP/s column
    nbytes: float = 0.0  # memory-bound kernels: GB/s column (each tensor read or written once)
    index: tuple[int, int] | None = None  # (input position, n): that input is int64, drawn from 0..n-1
    tol: float = BENCH_TOL  # max |tcdsl - torch| / max |torch|


def benches(size: str) -> list[Bench]:
    """size: full (the H200 run), quick (--quick on CUDA), tiny (--backend opencl)."""
    S = {
        "full": dict(mm=4096, tmm=(128, 16384, 4096), bmm=(500, 26, 72, 26), gc=(32, 32, 16, 16, 56),
                     fc=(512, 4096, 4096), sm=(32768, 1024), cv=(32, 64, 64, 56), mp=(32, 64, 112),
                     ew=1 << 26, tr=8192, bag=(50000, 256, 4096, 32)),
        "quick": dict(mm=1024, tmm=(128, 2048, 1024), bmm=(500, 26, 72, 26), gc=(8, 8, 16, 16, 28),
                      fc=(128, 1024, 1024), sm=(4096, 1024), cv=(8, 32, 32, 28), mp=(8, 32, 56),
                      ew=1 << 22, tr=2048, bag=(5000, 128, 512, 16)),
        "tiny": dict(mm=100, tmm=(20, 150, 70), bmm=(20, 26, 72, 26), gc=(2, 4, 8, 8, 12),
                     fc=(32, 128, 96), sm=(64, 200), cv=(2, 3, 5, 14), mp=(2, 3, 14),
                     ew=5000, tr=70, bag=(300, 24, 40, 5)),
    }[size]
    m = S["mm"]
    tm, tn, tk = S["tmm"]
    bb, bn, bm, bk = S["bmm"]
    gn, gg, gc, gf, gh = S["gc"]
    fb, fm, fn = S["fc"]
    sn, sd = S["sm"]
    go = gh - 2
    cn, cc, cf, ch = S["cv"]
    pn, pc, ph = S["mp"]
    ew, tr = S["ew"], S["tr"]
    vocab, bd, bb2, bl = S["bag"]
    co = ch - 2
    return [
        Bench("matmul", f"{m}x{m}x{m}", MATMUL, [(m, m), (m, m)], flops=2 * m**3),
        Bench("tmm", f"{tm}x{tn}x{tk}, C=A*B^T", TMM, [(tm, tk), (tn, tk)], flops=2 * tm * tn * tk),
        Bench("bmm", f"{bb}x{bn}x{bm}x{bk}", BMM, [(bb, bn, bm), (bb, bm, bk)], flops=2 * bb * bn * bm * bk),
        Bench("group_conv", f"N{gn} G{gg} C{gc} F{gf} {gh}x{gh} 3x3", GROUP_CONV,
              [(gn, gg, gc, gh, gh), (gg, gf, gc, 3, 3)], flops=2 * gn * gg * gf * gc * go * go * 9),
        Bench("fc_relu", f"{fb}x{fm} -> {fn}", FC_RELU, [(fb, fm), (fn, fm), (fn,)], flops=2 * fb * fm * fn),
        Bench("softmax", f"{sn}x{sd}", SOFTMAX, [(sn, sd)], nbytes=2 * 4 * sn * sd),
        Bench("layernorm", f"{sn}x{sd}", LAYERNORM, [(sn, sd)], nbytes=2 * 4 * sn * sd),
        Bench("conv2d", f"N{cn} C{cc} F{cf} {ch}x{ch} 3x3", CONV2D, [(cn, cc, ch, ch), (cf, cc, 3, 3)],
              flops=2 * cn * cf * cc * co * co * 9),
        Bench("maxpool", f"{pn}x{pc}x{ph}x{ph} 2x2", MAXPOOL, [(pn, pc, ph, ph)], nbytes=4 * pn * pc * ph * ph * 5 / 4),
        # one float32 sum of N terms: its rounding error grows with N (sqrt(N) * 2^-24 for a sequential sum of
        # normal values, relative to the sum's own size of about sqrt(N)), so the bound scales with the terms
        Bench("sum", f"{ew}", TOTAL, [(ew,)], nbytes=4 * ew, tol=max(BENCH_TOL, 4 * ew**0.5 * 2.0**-24 * 10)),
        Bench("tanh_fma", f"{ew}", ELEMENTWISE, [(ew,)] * 3, nbytes=4 * 4 * ew),
        Bench("transpose", f"{tr}x{tr}", TRANSPOSE, [(tr, tr)], nbytes=2 * 4 * tr * tr),
        Bench("bag_grad", f"V{vocab} D{bd} B{bb2} L{bl} (scatter-add)", BAG_GRAD.replace("VOCAB", str(vocab)),
              [(bb2, bd), (bb2, bl)], nbytes=4 * (2 * bb2 * bl * bd + vocab * bd), index=(1, vocab)),
    ]


def torch_impls(torch: Any, b: Bench) -> dict[str, Callable[..., Any]]:
    F = torch.nn.functional

    def group_conv(I: Any, W: Any) -> Any:
        N, G, C, H, Wd = I.shape
        _, Fo, _, KH, KW = W.shape
        O = F.conv2d(I.reshape(N, G * C, H, Wd), W.reshape(G * Fo, C, KH, KW), groups=G)
        return O.reshape(N, G, Fo, O.shape[2], O.shape[3])

    def bag_grad(G: Any, Idx: Any) -> Any:
        vocab = b.index[1] if b.index else 0
        rows = Idx.shape[1]
        return torch.zeros(vocab, G.shape[1], device=G.device, dtype=G.dtype).index_add_(
            0, Idx.reshape(-1), G.repeat_interleave(rows, dim=0))

    return {
        "matmul": torch.matmul,
        "tmm": lambda A, B: torch.matmul(A, B.t()),
        "bmm": torch.bmm,
        "group_conv": group_conv,
        "fc_relu": lambda I, W1, B1: F.relu(F.linear(I, W1, B1)),
        "softmax": lambda X: torch.softmax(X, dim=1),
        "layernorm": lambda X: F.layer_norm(X, X.shape[1:]),
        "conv2d": F.conv2d,
        "maxpool": lambda X: F.max_pool2d(X, 2),
        "sum": lambda A: A.sum(),
        "tanh_fma": lambda A, B, C: torch.tanh(A * B + C),
        "transpose": lambda A: A.t().contiguous(),
        "bag_grad": bag_grad,
    }


@dataclass
class Result:
    bench: Bench
    status: str = "ok"  # ok | MISMATCH | ERROR | skipped
    note: str = ""
    first_s: float | None = None  # tcdsl's first call: lowering, compile and one run
    call_ms: float | None = None  # median public call
    kernel_ms: float | None = None  # median device time of the kernels alone (CUDA)
    torch_ms: float | None = None
    rel_err: float | None = None
    reps: dict[str, int] = field(default_factory=dict)
    launches: list[str] = field(default_factory=list)

    @property
    def tc_ms(self) -> float | None:
        return self.kernel_ms if self.kernel_ms is not None else self.call_ms


def reps_for(t_one: float, target: float, fixed: int | None) -> int:
    if fixed:
        return fixed
    if t_one > SLOW_CALL_S:
        return 1
    return max(3, min(MAX_REPS, int(target / max(t_one, 1e-6))))


def time_wall(fn: Callable[[], Any], dev: Device, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        dev.sync()
        t0 = time.perf_counter()
        fn()
        dev.sync()
        out.append(time.perf_counter() - t0)
    return out


def warm(fn: Callable[[], Any], dev: Device) -> float:
    """WARMUP untimed calls (one when a call is slow); the last one's wall time."""
    t = 0.0
    for _ in range(WARMUP):
        t = time_wall(fn, dev, 1)[0]
        if t > SLOW_CALL_S:
            break
    return t


def time_torch_events(torch: Any, fn: Callable[[], Any], reps: int) -> list[float]:
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize()
    for s, e in evs:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in evs]


def time_cupy_events(cp: Any, fn: Callable[[], Any], reps: int) -> list[float]:
    evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    cp.cuda.Device().synchronize()
    for s, e in evs:
        s.record()
        fn()
        e.record()
    cp.cuda.Device().synchronize()
    return [cp.cuda.get_elapsed_time(s, e) / 1e3 for s, e in evs]


class RawLaunch:
    """The CUDA program a public call compiled, relaunched on buffers allocated once (no binding, no
    allocation, no error-flag read): the device time of tcdsl's kernels alone. Uses the kernel's
    program cache and gpurt.CudaKernel's fields; when those change, the column reads n/a."""

    def __init__(self, kernel: Any, inputs: Sequence[Any], cp: Any) -> None:
        progs = [g for g in getattr(kernel, "_gpu", {}).values() if hasattr(g, "kernels") and hasattr(g, "low")]
        if len(progs) != 1:
            raise RuntimeError(f"expected one compiled program in the kernel's cache, found {len(progs)}")
        gk = progs[0]
        self.cp = cp
        c = gk.inst.checked
        arrays = {t.name: cp.ascontiguousarray(a) for t, a in zip(c.inputs, inputs)}
        for t in (*c.outputs, *c.temps):
            arrays[t.name] = cp.zeros(gk.inst.shapes[t.name], dtype=t.dtype)
        self.err = cp.zeros(ERR_INTS, dtype=cp.int32)  # code, pad, int64 value (see codegen.gpu.tc_fail)
        self.args = [arrays[n] for n in gk.low.source.params] + [self.err]
        self.kernels = gk.kernels
        self.outputs = [arrays[t.name] for t in c.outputs]

    def __call__(self) -> None:
        for fn, spec in self.kernels:
            fn(spec.grid, spec.block, self.args)

    def check(self) -> str | None:
        code = self.err.get()
        return f"error flag {code.tolist()} set by the relaunched kernels" if code[0] else None


def launch_lines(kernel: Any, arrays: Sequence[Any], backend: str, options: Any) -> list[str]:
    progs = [g for g in getattr(kernel, "_gpu", {}).values() if hasattr(g, "low")]
    specs = progs[0].low.source.kernels if len(progs) == 1 else \
        kernel.lowered_gpu(*arrays, backend=backend, options=options).source.kernels
    return [f"{s.name}: grid {tuple(s.grid)} block {tuple(s.block)} {s.shared_bytes} B shared" for s in specs]


def max_rel_err(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / max(scale, 1e-30)


def run_bench(tc: Any, b: Bench, dev: Device, options: Any, target: float, fixed: int | None) -> Result:
    r = Result(b)
    rng = np.random.default_rng(2026)
    host: list[np.ndarray] = [rng.standard_normal(s, dtype=np.float32) for s in b.shapes]
    if b.index is not None:
        at, n = b.index
        host[at] = rng.integers(0, n, b.shapes[at], dtype=np.int64)
    got: np.ndarray | None = None
    try:
        got = time_tcdsl(tc, b, r, host, dev, options, target, fixed)
    except Exception as e:  # noqa: BLE001 - the torch column is still worth having
        r.status = "ERROR"
        r.note += f"{type(e).__name__}: {str(e).strip()[:400]}; "
        if os.environ.get("TCDSL_BENCH_TRACEBACK"):
            traceback.print_exc()
    dev.free()
    torch = dev.torch
    if torch is not None:
        try:
            fn = torch_impls(torch, b)[b.name]
            t_in = [dev.to_torch(a) for a in host]
            with torch.no_grad():
                want = dev.host(fn(*t_in))
                t_t = warm(lambda: fn(*t_in), dev)
                nt = reps_for(t_t, target, fixed)
                ts = time_torch_events(torch, lambda: fn(*t_in), nt) if dev.cuda else \
                    time_wall(lambda: fn(*t_in), dev, nt)
            r.torch_ms = statistics.median(ts) * 1e3
            r.reps["torch"] = nt
            if got is None:
                pass
            elif want.shape != got.shape:
                r.status, r.note = "MISMATCH", r.note + f"shape {got.shape}, torch {want.shape}; "
            else:
                r.rel_err = max_rel_err(got, want)
                if not np.isfinite(r.rel_err) or r.rel_err > b.tol:
                    r.status = "MISMATCH"
            del t_in
        except Exception as e:  # noqa: BLE001 - a torch failure leaves tcdsl's figures standing
            r.note += f"torch failed: {type(e).__name__}: {str(e)[:200]}; "
    return r


def time_tcdsl(tc: Any, b: Bench, r: Result, host: list[np.ndarray], dev: Device, options: Any, target: float,
               fixed: int | None) -> np.ndarray:
    """tcdsl's figures into ``r``; returns its result on the host."""
    tc_in = [dev.to_tc(a) for a in host]
    k = tc.define(b.src)

    def call() -> Any:
        return k(*tc_in, backend=dev.backend, options=options)

    dev.sync()
    t0 = time.perf_counter()
    out = call()
    dev.sync()
    r.first_s = time.perf_counter() - t0
    try:
        r.launches = launch_lines(k, tc_in, dev.backend, options)
    except Exception as e:  # noqa: BLE001 - only a report line
        r.launches = [f"launch configuration unknown: {type(e).__name__}: {e}"]
    got = dev.host(out)
    t_one = warm(call, dev)
    n = reps_for(t_one, target, fixed)
    r.call_ms = statistics.median(time_wall(call, dev, n)) * 1e3
    r.reps["call"] = n
    if dev.cuda:
        try:
            raw = RawLaunch(k, tc_in, dev.cp)
            for _ in range(WARMUP if t_one < SLOW_CALL_S else 0):
                raw()
            nk = reps_for(t_one, target, fixed)
            r.kernel_ms = statistics.median(time_cupy_events(dev.cp, raw, nk)) * 1e3
            r.reps["kernels"] = nk
            why = raw.check()
            rerr = max((max_rel_err(dev.host(o), dev.host(c)) for o, c in zip(raw.outputs, as_tuple(out))), default=0)
            if why or rerr > b.tol:
                r.kernel_ms = None
                r.note += f"relaunch disagrees with the call ({why or f'rel err {rerr:.1e}'}); "
        except Exception as e:  # noqa: BLE001 - internals of the runtime; the call time still stands
            r.note += f"kernel-only timing n/a ({type(e).__name__}: {e}); "
    return got


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def rate(r: Result) -> str:
    t = r.tc_ms
    if t is None or t <= 0:
        return "-"
    if r.bench.flops:
        return f"{r.bench.flops / (t * 1e-3) / 1e9:.0f} GFLOP/s"
    return f"{r.bench.nbytes / (t * 1e-3) / 1e9:.0f} GB/s"


def print_table(results: list[Result], dev: Device) -> None:
    what = "kernels' device time (CUDA events)" if dev.cuda else "public call, wall clock"
    print(f"## times (median ms; tcdsl ms = {what}; ratio = torch ms / tcdsl ms, above 1: tcdsl faster)")
    head = ["kernel", "size", "tcdsl ms", "torch ms", "torch/tcdsl", "call ms", "first s", "tcdsl rate",
            "rel err", "status"]
    rows = []
    for r in results:
        ratio = f"{r.torch_ms / r.tc_ms:.2f}" if r.torch_ms and r.tc_ms else "-"
        rows.append([r.bench.name, r.bench.label, fmt(r.tc_ms), fmt(r.torch_ms), ratio, fmt(r.call_ms),
                     fmt(r.first_s, ".2f"), rate(r), fmt(r.rel_err, ".1e"), r.status])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    notes = [(r.bench.name, r.note.rstrip("; ")) for r in results if r.note]
    for name, note in notes:
        print(f"- {name}: {note}")
    print()


def run_timings(tc: Any, dev: Device, options: Any, size: str, only: list[str] | None, target: float,
                fixed: int | None, deadline: float) -> list[Result]:
    todo = [b for b in benches(size) if not only or any(o in b.name for o in only)]
    print(f"## timings: {len(todo)} kernels, sizes '{size}', backend {dev.backend}"
          + (", torch " + ("cuda" if dev.cuda else "cpu") if dev.torch is not None else ", no torch"), flush=True)
    results = []
    for b in todo:
        if time.perf_counter() > deadline:
            results.append(Result(b, status="skipped", note="time budget (--budget) spent"))
            print(f"- {b.name}: skipped, time budget spent", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            r = run_bench(tc, b, dev, options, target, fixed)
        except Exception as e:  # noqa: BLE001 - one kernel's failure must not stop the rest
            r = Result(b, status="ERROR", note=f"{type(e).__name__}: {str(e).strip()[:400]}")
            if os.environ.get("TCDSL_BENCH_TRACEBACK"):
                traceback.print_exc()
        results.append(r)
        print(f"- {b.name} {b.label}: {r.status}, tcdsl {fmt(r.tc_ms)} ms, torch {fmt(r.torch_ms)} ms, "
              f"first call {fmt(r.first_s, '.2f')} s, reps {r.reps} ({time.perf_counter() - t0:.1f} s)"
              + (f" [{r.note.rstrip('; ')}]" if r.note else ""), flush=True)
        for line in r.launches:
            print(f"    {line}")
        dev.free()
    print()
    return results


# ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "opencl"), default="cuda",
                    help="cuda (the H200 run) or opencl (a dry run of this script on PoCL, tiny sizes)")
    ap.add_argument("--quick", action="store_true", help="small sizes and short timings")
    ap.add_argument("--only", default=None, help="timed kernels whose name contains one of these (comma list)")
    ap.add_argument("--options", default=None, help="MappingOptions as JSON (default: the naive options)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per contender (default: sized by --target)")
    ap.add_argument("--target", type=float, default=None, help="seconds of timing per contender (default 1, quick 0.2)")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds after the start past which no new kernel is timed (default 300)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--cases", default=None, help="path of the conformance cases.py")
    ap.add_argument("--no-conformance", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--tf32", action="store_true", help="let torch use TF32 (off by default: fp32 against fp32)")
    a = ap.parse_args(argv)
    start = time.perf_counter()

    tc, how = import_tcdsl()
    options = tc.MappingOptions.from_json(a.options) if a.options else tc.MappingOptions()
    torch: Any = None
    torch_note = ""
    try:
        import torch
    except ImportError as e:
        torch_note = f"not importable ({e}): no comparator"
    if a.backend == "cuda":
        from tcdsl import gpurt

        if not gpurt.cuda_available():
            print("backend cuda: no CUDA device or no cupy here (for a dry run: --backend opencl)")
            return 2
    if torch is not None:
        if a.backend == "cuda":
            if not torch.cuda.is_available():
                torch_note, torch = "torch sees no CUDA device: no comparator", None
            else:
                torch.backends.cuda.matmul.allow_tf32 = a.tf32
                torch.backends.cudnn.allow_tf32 = a.tf32
                torch.backends.cudnn.benchmark = True
        else:
            torch.set_num_threads(1)  # the dry run's comparator: PoCL's worker threads take the cores
    dev = Device(a.backend, torch)
    describe(dev, tc, how, options, torch_note)

    failed = False
    out: dict[str, Any] = {"backend": a.backend, "quick": a.quick, "options": json.loads(options.to_json())}
    if not a.no_conformance:
        try:
            n, fails, rows = run_conformance(tc, dev, options, a.cases)
            out["conformance"] = {"cases": n, "failed": fails, "rows": rows}
            failed |= bool(fails)
        except Exception as e:  # noqa: BLE001 - e.g. no cases file: the timings still run
            print(f"conformance: could not run ({type(e).__name__}: {e})\n")
            out["conformance"] = {"error": str(e)}
            failed = True
    if not a.no_timing:
        size = "tiny" if a.backend == "opencl" else "quick" if a.quick else "full"
        target = a.target if a.target is not None else (0.2 if a.quick else 1.0)
        only = [s for s in a.only.split(",") if s] if a.only else None
        results = run_timings(tc, dev, options, size, only, target, a.reps, start + a.budget)
        print_table(results, dev)
        failed |= any(r.status in ("ERROR", "MISMATCH") for r in results)
        out["timings"] = [{"name": r.bench.name, "size": r.bench.label, "status": r.status, "note": r.note,
                           "tcdsl_ms": r.tc_ms, "kernel_ms": r.kernel_ms, "call_ms": r.call_ms,
                           "torch_ms": r.torch_ms, "first_s": r.first_s, "rel_err": r.rel_err, "reps": r.reps,
                           "launches": r.launches} for r in results]
    print(f"total {time.perf_counter() - start:.0f} s; {'FAILURES above' if failed else 'all ok'}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
