"""The benchmark driver behind ``tcdsl bench``: one kernel on given arrays, timed with its default,
tuned and explicit mapping options against ``numpy.einsum`` of the same def, in interleaved rounds
(``Kernel x arrays -> Report``, a table that prints).

A def has an einsum peer when it is one statement that ``interp.einsum_form`` writes as einsum
subscripts (a sum of products of plain reads, or such a product alone) and whose index ranges
cover its tensors whole. Every kernel variant's result is checked against the peer's first, within
the rounding error of the sum (``C_ERR * eps * (terms + factors) * sum|terms|``); a variant that
differs is marked MISMATCH, gets no speed ratio, and makes the report fail.

Timing: the first call of each variant (it compiles or loads the kernel) is not timed. Each round
then times every variant once, the first variant rotating from round to round, so that a noisy
machine's load hits all alike; before its sample a variant waits until this process's thread pools
(OpenMP's, BLAS's) stop spinning, makes one untimed call, then times a batch of calls lasting at
least ``BATCH_S`` with the garbage collector off. The table gives the median and the minimum per
call over the rounds.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import interp
from .codegen import pch
from .core.checked import CheckedDef
from .core.errors import TcArgumentError, TcError
from .core.instance import Instance
from .core.options import MappingOptions
from .tuner import tune

ROUNDS = 20  # tcdsl bench's default number of rounds
BATCH_S = 0.02  # a timed sample runs calls until this many seconds have passed
QUIESCE_S = 0.25  # the longest wait for spinning thread pools before a sample
NOISY = 0.25  # a spread (interquartile range / median) above this gets a warning
C_ERR = 4.0  # the allowance per term of the check against einsum, in units of eps (as tests/tolerance.py)


@dataclass(frozen=True)
class EinsumPeer:
    """``np.einsum(spec, *operands, optimize=True) * scale``: the def as numpy computes it.
    ``operands`` are positions in the def's inputs; ``terms`` is the number of terms summed into
    one element (the product of the reduction ranges); ``flops`` counts a multiply-add as two."""

    spec: str
    operands: tuple[int, ...]
    names: tuple[str, ...]
    scale: float
    terms: int
    flops: int
    reduces: bool

    def __call__(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        out = np.einsum(self.spec, *(arrays[i] for i in self.operands), optimize=True)
        if self.scale != 1.0:
            return out * np.asarray(self.scale, dtype=out.dtype)
        return np.array(out, copy=True) if any(np.may_share_memory(out, arrays[i]) for i in self.operands) else out

    def __str__(self) -> str:
        scaled = f" * {self.scale:g}" if self.scale != 1.0 else ""
        return f"np.einsum({self.spec!r}, {', '.join(self.names)}, optimize=True){scaled}"

    def allowance(self, arrays: Sequence[np.ndarray]) -> np.ndarray | None:
        """Elementwise, how far a correct float result may be from this one: ``C_ERR * eps * (terms
        + factors) * sum|terms|`` (the sum of |terms| is the einsum of |inputs|, in float64); None
        for integers, which compare exactly (their sums wrap alike in any order)."""
        if arrays[self.operands[0]].dtype.kind != "f":
            return None
        absed = [np.abs(np.asarray(arrays[i], dtype=np.float64)) for i in self.operands]
        with np.errstate(all="ignore"):
            bound = np.einsum(self.spec, *absed, optimize=True) * abs(self.scale)
        eps = float(np.finfo(arrays[self.operands[0]].dtype).eps)
        return np.asarray(C_ERR * eps * (self.terms + len(self.operands)) * bound)


def einsum_peer(checked: CheckedDef, inst: Instance) -> EinsumPeer | str:
    """The def's einsum peer at the sizes of ``inst``, or why it has none (a phrase)."""
    if len(checked.stmts) != 1:
        return f"def '{checked.name}' has {len(checked.stmts)} statements; einsum computes one"
    s = checked.stmts[0]
    if s.tensor in checked.accumulates:
        return f"'{s.tensor}' adds to the values passed in (+= without !), einsum starts from zero"
    if s.tensor not in [t.name for t in checked.outputs]:
        return f"statement 1 writes '{s.tensor}', not an output"
    form = interp.einsum_form(s)
    if isinstance(form, str):
        return form
    spec, tensors, scale = form
    inputs = [t.name for t in checked.inputs]
    dtype = next(t.dtype for t in checked.outputs if t.name == s.tensor)
    for t in tensors:
        if t not in inputs:
            return f"statement 1 reads '{t}', which is not an input"
        if checked.tensors[t].dtype != dtype:
            return f"'{t}' is {checked.tensors[t].dtype} but '{s.tensor}' is {dtype}"
    ranges = {name: (lo, hi) for name, lo, hi in inst.stmts[0].ranges}
    letters = dict(zip(interp.EINSUM_LETTERS, s.indices))
    reads, lhs = spec.split("->")
    for tensor, sub in [*zip(tensors, reads.split(",")), (s.tensor, lhs)]:
        for d, ch in enumerate(sub):
            index = letters[ch]
            lo, hi = ranges[index]
            if (lo, hi) != (0, inst.shapes[tensor][d]):
                return (f"index '{index}' ranges over {lo}:{hi} at these sizes but dim {d} of '{tensor}' has "
                        f"{inst.shapes[tensor][d]}; einsum runs over whole tensors")
    points = math.prod(hi - lo for lo, hi in ranges.values())
    terms = math.prod(ranges[r][1] - ranges[r][0] for r in s.reductions)
    per_point = len(tensors) - 1 + (scale != 1.0) + bool(s.reductions)
    return EinsumPeer(spec, tuple(inputs.index(t) for t in tensors), tensors, scale, terms, points * per_point,
                      bool(s.reductions))


def mismatch(got: np.ndarray, want: np.ndarray, allowed: np.ndarray | None) -> str | None:
    """None when ``got`` matches ``want`` (exactly for integers, else within ``allowed``, NaN
    where NaN, infinities alike); else the worst element, in a phrase."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, einsum's is {want.shape}"
    with np.errstate(all="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        bad = got != want
        if got.dtype.kind in "fc":
            bad &= ~(np.isnan(got) & np.isnan(want))
            if allowed is not None:
                bad &= ~(diff <= allowed)
    if not bad.any():
        return None
    at = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0))), got.shape) \
        if got.ndim else ()
    where = f"[{', '.join(map(str, at))}]" if at else ""
    limit = f" (allowed {float(np.broadcast_to(allowed, got.shape)[at]):.3g})" if allowed is not None else ""
    return (f"{int(bad.sum())} of {got.size} elements differ; at {where or 'the scalar'}: {got[at].item()!r} against "
            f"einsum's {want[at].item()!r}{limit}")


def quiesce(max_s: float | None = None, step: float = 0.005) -> None:
    """Sleep until this process's threads stop using CPU (at most ``max_s``, default ``QUIESCE_S``):
    thread pools spin for a while after a call (OpenBLAS's up to ~0.1 s) and would take the cores
    of the next variant. First wait for the precompiled header a first compile may have started
    (codegen.pch): its compiler runs for a second or more beside the timed calls, on one of the
    cores they use (a conv on 2 threads ran 2.5x slower meanwhile)."""
    pch.wait()
    deadline = time.perf_counter() + (QUIESCE_S if max_s is None else max_s)
    prev = time.process_time()
    while time.perf_counter() < deadline:
        time.sleep(step)
        cur = time.process_time()
        if cur - prev < 0.1 * step:
            return
        prev = cur


@dataclass(frozen=True)
class Variant:
    name: str
    call: Callable[[], Any]


def measure(variants: Sequence[Variant], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round (see the module's docstring)."""
    batch = {}
    for v in variants:  # calls per sample, from one timed call
        quiesce()
        t0 = time.perf_counter()
        v.call()
        batch[v.name] = max(1, min(10_000, math.ceil(BATCH_S / max(time.perf_counter() - t0, 1e-7))))
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(rounds):
        for v in [*variants[r % len(variants):], *variants[: r % len(variants)]]:
            quiesce()
            v.call()  # wakes the thread pools: the batch runs hot, as in a loop that calls only it
            n = batch[v.name]
            gc.disable()
            try:
                t0 = time.perf_counter()
                for _ in range(n):
                    v.call()
                samples[v.name].append((time.perf_counter() - t0) / n)
            finally:
                gc.enable()
    return samples


@dataclass(frozen=True)
class Row:
    name: str
    median_s: float
    min_s: float
    spread: float | None  # the interquartile range of the rounds / the median (None: under 2 rounds)
    rate: float | None  # GFLOP/s, GOP/s or GB/s at the median
    ratio: float | None  # the reference's median / this median (> 1: faster); None after a mismatch
    check: str  # "ok", "MISMATCH", "reference" or "-" (not checked)


@dataclass(frozen=True)
class Report:
    """The table ``tcdsl bench`` prints, and the problems found (a mismatch fails the report)."""

    rows: tuple[Row, ...]
    unit: str  # "GFLOP/s", "GOP/s" (integers) or "GB/s"
    reference: str  # what the ratio column compares with
    notes: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        w = max(len("variant"), *(len(r.name) for r in self.rows))
        vs = f"vs {self.reference}"
        head = (f"{'variant':<{w}}  {'median ms':>10}  {'min ms':>10}  {'spread':>6}  {self.unit:>8}  {vs:>{len(vs)}}"
                "  check")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            spread = f"{r.spread:6.0%}" if r.spread is not None else f"{'-':>6}"
            rate = f"{r.rate:8.4g}" if r.rate is not None else f"{'-':>8}"
            ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x" if r.ratio >= 0.1 else f"{r.ratio:.2g}x"
            lines.append(f"{r.name:<{w}}  {r.median_s * 1e3:10.4f}  {r.min_s * 1e3:10.4f}  {spread}  {rate}  "
                         f"{ratio:>{len(vs)}}  {r.check}")
        return "\n".join([*lines, *self.notes, *(f"MISMATCH: {p}" for p in self.problems)])


def report(samples: dict[str, list[float]], checks: dict[str, str], problems: Sequence[str], reference: str,
           unit: str, work: float) -> Report:
    """The table of ``measure``'s samples: ``work`` (flops, or bytes) per call gives the rate column."""
    ref = statistics.median(samples[reference])
    rows = []
    for name, times in samples.items():
        med = statistics.median(times)
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else None
        ratio = None if checks.get(name) == "MISMATCH" or med <= 0 else ref / med
        rows.append(Row(name, med, min(times), (quartiles[2] - quartiles[0]) / med if quartiles and med > 0 else None,
                        work / med / 1e9 if med > 0 and work else None, ratio, checks.get(name, "-")))
    short = reference.removeprefix("tcdsl, ")
    notes = [f"{unit}: {'inputs read, outputs written once' if unit == 'GB/s' else 'a multiply-add counts 2'}, at "
             "the median time; spread: the interquartile range of the rounds / the median",
             f"vs {short}: its median time / the variant's (> 1: the variant is faster)"]
    if "numpy.einsum" not in samples:
        notes.append("results not checked: without an einsum peer there is no reference")
    by_name = {r.name: r for r in rows}
    if "tcdsl, tuned options" in by_name and "tcdsl, default options" in by_name:
        speed = by_name["tcdsl, default options"].median_s / by_name["tcdsl, tuned options"].median_s
        notes.append(f"tuned options: {speed:.2f}x the speed of the defaults")
    noisy = max((r.spread for r in rows if r.spread is not None), default=0.0)
    if noisy > NOISY:
        notes.append(f"warning: the rounds vary by up to {noisy:.0%} of the median: compare the min column, or run "
                     "more --rounds on a quieter machine")
    return Report(tuple(rows), unit, short, tuple(notes), tuple(problems))


def blas_line() -> str:
    """numpy's version and BLAS and the thread pools loaded in this process, in one line (or that no
    OpenMP runtime is loaded: kernels too small for a parallel loop do not load one)."""
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-untyped]
    except ImportError:
        try:
            config: Any = np.show_config(mode="dicts")  # type: ignore[func-returns-value]
            found = config["Build Dependencies"]["blas"]
            return f"numpy {np.__version__}, BLAS {found.get('name')} {found.get('version')} (threadpoolctl not " \
                   "installed: thread counts unknown)"
        except Exception:  # noqa: BLE001 (numpy < 1.26 has no mode="dicts"; the line is informative only)
            return f"numpy {np.__version__}, BLAS unknown (install threadpoolctl to see it)"
    pools: list[dict[str, Any]] = threadpool_info()
    mine = os.path.dirname(os.path.dirname(np.__file__))
    blas = [p for p in pools if p.get("user_api") == "blas"]
    ours = [p for p in blas if os.path.dirname(p.get("filepath", "")).startswith(os.path.join(mine, "numpy"))]
    parts = [f"numpy {np.__version__}"]
    for p in (ours or blas)[:1]:
        parts.append(f"BLAS {p.get('internal_api')} {p.get('version')} ({p.get('architecture')}, "
                     f"{p.get('threading_layer')}, {_count(p.get('num_threads'))})")
    omp = [p for p in pools if p.get("user_api") == "openmp"]
    for p in omp:
        parts.append(f"kernels' OpenMP: {p.get('prefix')} ({_count(p.get('num_threads'))})")
    if not omp:  # the kernels so far have no parallel loop (too small to split), so none loaded it
        parts.append("kernels' OpenMP: not loaded (the kernels run on one thread)")
    return "; ".join(parts)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _count(n: Any) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:
        raise TcArgumentError("--threads needs threadpoolctl (pip install threadpoolctl)") from None
    with threadpool_limits(limits=n):
        yield


def _tuned(kernel: Any, arrays: list[np.ndarray]) -> tuple[MappingOptions, str] | str:
    """The tuning cache's options for these arguments and where they come from, or why there are none."""
    try:
        entry = tune.tuned_entry(kernel, arrays, backend="c")
    except TcError as e:
        return f"the tuning cache could not be read ({e})"
    if entry is None:
        return "no tuned options for these arguments"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(entry.created))
    options = MappingOptions.from_json(entry.options)
    changed = ", ".join(options.changes())
    return options, (f"tuned on {when} ({entry.time_s * 1e3:.4g} ms measured, {entry.evaluations} candidates); "
                     + (f"changes from the defaults: {changed}" if changed else "the search kept the defaults"))


def _candidates(kernel: Any, arrays: list[np.ndarray], backend: str, options: MappingOptions | None,
                tune_hint: str, say: Callable[[str], None]) -> list[tuple[str, MappingOptions | None]]:
    """The kernel variants to time: (row name, the options passed), one row per distinct options."""
    if backend == "numpy":
        say("tuned options: none used (mapping options apply to the C backend)")
        return [("tcdsl, numpy backend", None)]
    out: list[tuple[str, MappingOptions | None]] = [("tcdsl, default options", MappingOptions())]
    tuned = _tuned(kernel, arrays)
    if isinstance(tuned, str):
        say(f"tuned options: {tuned}; search them with `{tune_hint}`")
    elif tuned[0] == MappingOptions():
        say(f"tuned options: {tuned[1]} (the default options' row times them)")
    else:
        say(f"tuned options: {tuned[1]}")
        out.append(("tcdsl, tuned options", tuned[0]))
    same = next((name for name, o in out if o == options), None)
    if same is not None:
        say(f"--options: the same as {same.removeprefix('tcdsl, ')} (timed as that row)")
    elif options is not None:
        out.append(("tcdsl, --options", options))
    return out


def run(kernel: Any, arrays: list[np.ndarray], *, rounds: int = ROUNDS, backend: str = "c",
        options: MappingOptions | None = None, threads: int | None = None, tune_hint: str = "tcdsl tune",
        say: Callable[[str], None] = print) -> Report:
    """Time ``kernel`` on ``arrays``: its default options, the tuning cache's for these arguments
    (if any) and ``options`` (if given), on ``backend`` ("c" or "numpy"), and the def's einsum peer
    (if it has one), in ``rounds`` interleaved rounds. ``say`` gets what is compared, and how, as it
    is known; ``tune_hint`` is the command suggested when nothing is tuned."""
    if rounds < 1:
        raise TcArgumentError(f"--rounds must be at least 1, not {rounds}")
    if threads is not None and threads < 1:
        raise TcArgumentError(f"--threads must be at least 1, not {threads}")
    if backend not in ("c", "numpy"):
        raise TcArgumentError(f"bench runs the c or the numpy backend, not {backend!r}")
    if backend == "numpy" and options is not None:
        raise TcArgumentError("--options: the numpy backend (the reference interpreter) takes no mapping options")
    checked = kernel.checked
    inst = kernel.instance(*arrays)
    sizes = ", ".join(f"{k}={v}" for k, v in inst.sizes.items())
    shapes = ", ".join(f"{t.dtype}({'x'.join(map(str, a.shape))}) {t.name}" for t, a in zip(checked.inputs, arrays))
    say(f"{checked.name} at {sizes}: {shapes}; backend {backend}")
    peer = einsum_peer(checked, inst)
    say(f"einsum peer: {peer}" if isinstance(peer, EinsumPeer) else f"no einsum peer: {peer}")
    candidates = _candidates(kernel, arrays, backend, options, tune_hint, say)

    outs = [np.zeros(inst.shapes[t.name], t.dtype) for t in checked.outputs] if checked.accumulates else None
    variants: list[Variant] = []
    for name, opts in candidates:
        def call(opts: MappingOptions | None = opts) -> Any:
            return kernel(*arrays, out=outs, backend=backend, options=opts)
        variants.append(Variant(name, call))
    if isinstance(peer, EinsumPeer):
        variants.append(Variant("numpy.einsum", lambda: peer(arrays)))
    first: dict[str, float] = {}
    results: dict[str, Any] = {}
    for v in variants:
        t0 = time.perf_counter()
        results[v.name] = v.call()  # a kernel compiles, or loads from the disk cache
        first[v.name] = time.perf_counter() - t0
    say("first calls (compile or load; not timed): " + ", ".join(f"{n} {t:.3g} s" for n, t in first.items()))

    problems: list[str] = []
    checks: dict[str, str] = {}
    if isinstance(peer, EinsumPeer):
        want, allowed = results["numpy.einsum"], peer.allowance(arrays)
        k = [t.name for t in checked.outputs].index(checked.stmts[0].tensor)
        for name, _ in candidates:
            wrong = mismatch(results[name] if len(checked.outputs) == 1 else results[name][k], want, allowed)
            checks[name] = "ok" if wrong is None else "MISMATCH"
            if wrong is not None:
                problems.append(f"{name}: the result differs from {peer}: {wrong}")
        checks["numpy.einsum"] = "reference"

    with _threads(threads):
        say(blas_line())
        load, cpus = os.getloadavg()[0], _cpus()
        busy = load >= 0.75 * cpus
        say(f"{cpus} CPUs, load average {load:.2f}" + (": other processes compete for the cores, which slows "
            "multithreaded variants most" if busy else "") + (" (compare with --threads 1)" if busy and threads is None
                                                                else ""))
        say(f"{rounds} rounds; each times every variant once (the first rotating), a batch of calls lasting "
            f">= {BATCH_S * 1e3:g} ms after one untimed call")
        samples = measure(variants, rounds)

    if isinstance(peer, EinsumPeer) and peer.reduces:
        unit = "GFLOP/s" if arrays[peer.operands[0]].dtype.kind == "f" else "GOP/s"
        work = float(peer.flops)
    else:
        unit = "GB/s"
        work = float(sum(a.nbytes for a in arrays) + sum(
            math.prod(inst.shapes[t.name]) * np.dtype(t.dtype).itemsize for t in checked.outputs))
    reference = "numpy.einsum" if isinstance(peer, EinsumPeer) else variants[0].name
    return report(samples, checks, problems, reference, unit, work)
