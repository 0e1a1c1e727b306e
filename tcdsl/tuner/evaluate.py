"""Safe evaluation of tuning candidates: ``list[MappingOptions]`` -> ``list[float]`` (seconds; inf: invalid).

Candidates are compiled in parallel worker processes (or on any ``concurrent.futures.Executor``),
then timed one at a time in an isolated worker with a timeout: a candidate that crashes, hangs
or raises is scored invalid and the worker is replaced, together with every process it started
(a compiler, isl's scheduler); the session never sees the fault. With ``time_on="executor"``, the
executor's workers also time the candidates, each in an isolated process of its own machine (one
worker per machine keeps timings apart). A candidate that would become the best is first checked
here against the reference interpreter. A deadline (the tuner's budget) bounds every wait.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from tcdsl import gpurt
from tcdsl.codegen import nvrtc
from tcdsl.core import knobs
from tcdsl.core.options import MappingOptions

FLUSH_BYTES = 64 << 20  # written between timed runs: more than the last-level cache
RTOL = 1e-4  # max |candidate - reference| / max |reference| accepted for floating-point outputs
SLOWER_THAN_BEST = 20  # a timing request may take this many times the best candidate's calls
MIN_TIMEOUT_S = 2.0
GRACE_S = 5.0  # how long past the deadline a wait may last while no candidate has a valid time
WORKER_MARK = "TCDSL_TUNER_WORKER"  # in a worker's environment, inherited by all it starts: its token

# TC text of one def -> its kernel, in a worker process: ``of_source`` of the tuned kernel's class (taken
# from the kernel by ``tune.autotune``, sent pickled by reference), so the tuner never imports the API.
KernelOf = Callable[[str], Any]


@dataclass(frozen=True)
class ArgSpec:
    """Shape, dtype and element strides of one input: enough to compile for it."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]

    @staticmethod
    def of(a: np.ndarray) -> ArgSpec:
        return ArgSpec(a.shape, a.dtype.str, tuple(s // a.itemsize for s in a.strides))

    def dummy(self) -> np.ndarray:
        """A (zero) array with this layout."""
        dt = np.dtype(self.dtype)
        if not self.shape or 0 in self.shape:
            return np.zeros(self.shape, dt)
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.strides))
        base = np.zeros(span, dt)
        offset = sum((n - 1) * -s for n, s in zip(self.shape, self.strides) if s < 0)
        return np.lib.stride_tricks.as_strided(base[offset:], self.shape, tuple(s * dt.itemsize for s in self.strides))


def compile_candidate(kernel_of: KernelOf, source: str, specs: Sequence[ArgSpec], options_json: str,
                      backend: str = "c") -> str | None:
    """Build the kernel of ``source`` (made by ``kernel_of``) for ``specs`` under the options (C: into
    the disk cache; OpenCL: the platform's program cache; CUDA: checked with NVRTC where it is
    installed); None when it compiled, else the reason. Runs in worker processes (or on a Dask worker)."""
    try:
        kernel = kernel_of(source)
        options = MappingOptions.from_json(options_json)
        dummies = [s.dummy() for s in specs]
        if backend == "c":
            kernel.compiled(*dummies, options=options)
        elif backend == "opencl":
            gpurt.OpenCLKernel(kernel.lowered_gpu(*dummies, backend="opencl", options=options))
        else:
            low = kernel.lowered_gpu(*dummies, backend="cuda", options=options)
            if nvrtc.available():
                nvrtc.compile_cuda(low.source.text)
        return None
    except Exception as e:  # every failure is the candidate's: scored invalid
        return f"{type(e).__name__}: {e}"


# ---- worker processes ----------------------------------------------------------------------------

def _flush(buf: np.ndarray) -> None:
    buf.sum()  # reads every line: the caches then hold none of the kernel's data, and nothing dirty


def start_outputs(kernel: Any, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
    """``out=`` for a def that updates its outputs in place (``CheckedDef.accumulates``): zeros, so
    that the reference and every candidate start from the same values; nothing for other defs."""
    c = kernel.checked
    if not c.accumulates:
        return {}
    inst = kernel.instance(*inputs)
    outs = [np.zeros(inst.shapes[t.name], dtype=t.dtype) for t in c.outputs]
    return {"out": outs if len(outs) > 1 else outs[0]}


def time_candidate(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                   flush: np.ndarray, backend: str = "c") -> tuple[float, Any]:
    """One warm-up call (which loads the library), then the median of ``reps`` calls, each after
    the caches are flushed; returns (seconds, the warm-up call's outputs). On the GPU backends a
    call includes its transfers and ends when the device has finished. A def that updates its
    outputs in place starts the warm-up call from zeros (``start_outputs``); the timed calls go on
    updating the same buffers."""
    start = start_outputs(kernel, inputs)
    out = kernel(*inputs, backend=backend, options=options, **start)
    if start:  # the timed calls go on updating these buffers: check the warm-up's values
        out = tuple(np.array(o) for o in out) if isinstance(out, tuple) else np.array(out)
    times = []
    for _ in range(reps):
        _flush(flush)
        t0 = time.perf_counter()
        kernel(*inputs, backend=backend, options=options, **start)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


class Worker:
    """One worker process (``python -m tcdsl.tuner.worker``: no re-import of the user's script)
    in a session of its own; a request that faults or outlives its timeout kills and replaces it,
    and with it every process it started (see ``kill_tree``)."""

    def __init__(self, runner: str = "tcdsl.tuner.evaluate:time_candidate") -> None:
        self.runner = runner
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""  # the current process's WORKER_MARK value
        self.conn: Connection | None = None  # replies
        self._out: Connection | None = None  # requests
        self.job: tuple | None = None  # sent first to every new process

    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        self.token = secrets.token_hex(12)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **{WORKER_MARK: self.token})
        quiet = None if knobs.debug() else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tcdsl.tuner.worker", str(to_child_r), str(to_parent_w), self.runner,
             str(os.getpid())],
            pass_fds=(to_child_r, to_parent_w), env=env, stdin=subprocess.DEVNULL, stdout=quiet, stderr=quiet,
            start_new_session=True)
        os.close(to_child_r)
        os.close(to_parent_w)
        self._out = Connection(to_child_w, readable=False)
        self.conn = Connection(to_parent_r, writable=False)
        if self.job is not None:
            self._out.send(self.job)

    def set_job(self, job: tuple) -> None:
        self.job = job
        self.stop()  # the next request starts a process that gets the job first

    def start(self) -> None:
        """Start the process now unless it runs (it starts on the first request otherwise)."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self._start()

    def send(self, msg: tuple) -> None:
        self.start()
        assert self._out is not None
        self._out.send(msg)

    def receive(self, timeout: float) -> tuple:
        """The reply, or ("error", why) after a crash, or ("timeout", why) after the timeout (the
        process is then replaced). The job's acknowledgement, when a new process got one, is read first."""
        assert self.conn is not None and self.proc is not None
        deadline = time.monotonic() + timeout
        try:
            while self.conn.poll(max(0.0, deadline - time.monotonic())):
                reply = self.conn.recv()
                if reply != ("ok", "job"):
                    return reply  # type: ignore[no-any-return]
            kind, why = "timeout", f"timed out after {timeout:g} s"
        except (EOFError, OSError):
            _reap(self.proc)
            kind, why = "error", f"worker died ({_exit_reason(self.proc.returncode)})"
        self.stop()
        return (kind, why)

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc.pid, self.token)
            _reap(self.proc)
        for c in (self.conn, self._out):
            if c is not None:
                c.close()
        self.proc, self.conn, self._out = None, None, None


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # stuck in the kernel: left to the system
        pass


def kill_tree(leader: int, token: str) -> None:
    """SIGKILL the process group ``leader`` leads, then every process started under the worker's
    token (``kill_marked``)."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    except AttributeError:  # no process groups (Windows): the worker alone
        with contextlib.suppress(OSError):
            os.kill(leader, signal.SIGTERM)
    kill_marked(token)


def kill_marked(token: str) -> None:
    """SIGKILL every process but this one whose environment holds the worker's token: its
    descendants, including those that moved to a session of their own (a compiler run under a
    timeout) or lost their parent, until none is left."""
    for _ in range(100 if token else 0):
        pids = marked(token)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def marked(token: str) -> list[int]:
    """The live processes, other than this one, whose environment holds WORKER_MARK=``token`` (read
    from /proc; none where there is no /proc). A process that has exited shows no environment."""
    needle = f"{WORKER_MARK}={token}\0".encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    me, found = os.getpid(), []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:  # gone, or not ours
            continue
    return found


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# ---- timing on an executor's workers ----------------------------------------------------------------

_REMOTE_TIMERS: dict[tuple, Worker] = {}  # in an executor's worker process: the current job's timing process
_REMOTE_LOCK = threading.Lock()  # one timing at a time per process, whatever the executor's threads


def time_remote(kernel_of: KernelOf, source: str, inputs: list[np.ndarray], options_json: str, reps: int,
                backend: str, runner: str, compile_timeout_s: float, run_timeout_s: float) -> tuple:
    """Runs on an executor's worker (a Dask worker on another machine, say): lowers, loads and
    times one candidate in an isolated timing process of that worker, which is kept for the job's
    next candidates (until another job comes); returns ("ok", seconds) or ("error", why). A
    candidate that crashes or hangs ends that process, not the executor's worker. Tasks of one
    process take turns (the timings stay apart, and so do the requests to the timing process)."""
    key = (kernel_of, source, tuple(ArgSpec.of(a) for a in inputs), reps, backend, runner)
    with _REMOTE_LOCK:
        timer = _REMOTE_TIMERS.get(key)
        if timer is None:  # a new job: the last one's process goes
            for old in _REMOTE_TIMERS.values():
                old.stop()
            _REMOTE_TIMERS.clear()
            timer = _REMOTE_TIMERS[key] = Worker(runner)
            timer.set_job(("job", kernel_of, source, inputs, reps, backend))
        timer.send(("prepare", options_json))
        reply = timer.receive(compile_timeout_s)
        if reply[0] != "ok":
            return ("error", f"compile: {reply[1]}")
        timer.send(("time", options_json, False))
        reply = timer.receive(run_timeout_s)
        return ("ok", float(reply[1])) if reply[0] == "ok" else ("error", f"run: {reply[1]}")


# ---- the evaluator ---------------------------------------------------------------------------------

class OutOfBudget(Exception):
    """A wait the deadline cut short: the candidate is not scored (neither valid nor invalid)."""


@dataclass
class Evaluator:
    """Scores candidate options of one kernel on fixed inputs (see the module docstring).

    ``deadline`` (``time.monotonic()`` seconds) bounds every wait, compiles and runs alike: what
    still runs then is stopped, except that while no candidate has a valid time, compiling, timing
    and checking go on for up to ``GRACE_S`` more, so that one (the defaults first) gets scored
    (see ``_end``).
    Candidates the deadline stopped land in ``cut``, not in ``rejected``."""

    source: str
    inputs: list[np.ndarray]
    reference: list[np.ndarray]  # the interpreter's outputs on ``inputs``
    kernel_of: KernelOf  # how a worker process makes the kernel of ``source``
    executor: Executor | None = None
    compile_timeout_s: float = 300.0
    run_timeout_s: float = 60.0
    reps: int = 5
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    runner: str = "tcdsl.tuner.evaluate:time_candidate"  # "module:function" timing one candidate
    backend: str = "c"  # "c", "opencl" or "cuda"
    time_on: str = "local"  # "executor": candidates are also timed on the executor's workers
    log: Callable[[str], None] = lambda _msg: None
    deadline: float = math.inf
    best: float = math.inf
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (options JSON, why)
    cut: set[str] = field(default_factory=set)  # options JSON the deadline stopped before they were scored
    request_s: dict[str, float] = field(default_factory=dict)  # options JSON -> wall seconds of its timing request
    prepare_s: dict[str, float] = field(default_factory=dict)  # options JSON -> the timer's first lowering and load
    on_scored: Callable[[str, float], None] | None = None  # told each candidate's score as it is known

    def __post_init__(self) -> None:
        if self.time_on not in ("local", "executor"):
            raise ValueError(f"time_on must be 'local' or 'executor', not {self.time_on!r}")
        if self.time_on == "executor" and self.executor is None:
            raise ValueError("time_on='executor' needs an executor")
        self._timer = Worker(self.runner)
        self._timer.set_job(("job", self.kernel_of, self.source, self.inputs, self.reps, self.backend))
        self._timer.start()  # it starts up while the first candidates compile
        self._compilers: list[Worker] = []
        self.specs = [ArgSpec.of(a) for a in self.inputs]

    def close(self) -> None:
        for w in [self._timer, *self._compilers]:
            w.stop()

    # -- the deadline --

    def spent(self) -> bool:
        """Whether the deadline has passed."""
        return time.monotonic() >= self.deadline

    def _end(self, compiled: bool = False) -> float:
        """When waiting stops: at the deadline once something can be scored (a candidate has a
        valid time, or, for compiles, one compiled), else ``GRACE_S`` later."""
        return self.deadline if compiled or math.isfinite(self.best) else self.deadline + GRACE_S

    def out_of_time(self) -> bool:
        """Whether to start nothing more."""
        return time.monotonic() >= self._end()

    def _limit(self, seconds: float) -> float:
        """``seconds``, or what is left until ``_end()`` if that is less."""
        return min(seconds, max(0.0, self._end() - time.monotonic()))

    def _ask(self, worker: Worker, msg: tuple, seconds: float) -> tuple:
        """``worker``'s reply to ``msg`` within ``seconds``; OutOfBudget when the deadline cut that short."""
        limit = self._limit(seconds)
        if limit <= 0 < seconds:
            raise OutOfBudget
        worker.send(msg)
        reply = worker.receive(limit)
        if reply[0] == "timeout" and limit < seconds:
            raise OutOfBudget
        return reply

    # -- scoring --

    def __call__(self, candidates: Sequence[MappingOptions]) -> list[float]:
        texts = [o.to_json() for o in candidates]
        if self.time_on == "executor":
            costs = self._time_remote(texts)
            for text, cost in zip(texts, costs):
                self._scored(text, cost)
            return costs
        costs = []
        for text, err in zip(texts, self._compile_all(texts)):
            costs.append(self._score(text, err))
            self._scored(text, costs[-1])
        return costs

    def _scored(self, text: str, cost: float) -> None:
        if self.on_scored is not None:
            self.on_scored(text, cost)

    def _score(self, text: str, compile_error: str | None) -> float:
        if text in self.cut:
            return math.inf
        if compile_error:
            self._reject(text, f"compile: {compile_error}")
            return math.inf
        if self.out_of_time():
            self.cut.add(text)
            return math.inf
        try:
            return self._time(text)
        except OutOfBudget:
            self.cut.add(text)
            return math.inf

    def _reject(self, text: str, why: str) -> None:
        self.rejected.append((text, why))
        self.log(f"invalid candidate {text}: {why.splitlines()[0] if why else ''}")

    def _compile_all(self, texts: list[str]) -> list[str | None]:
        """Each candidate's compile error or None; those the deadline stopped go to ``cut``."""
        if self.executor is not None:
            return self._compile_on_executor(texts)
        while len(self._compilers) < max(1, self.jobs):
            self._compilers.append(Worker())
        results: list[str | None] = [None] * len(texts)
        pending = list(range(len(texts)))
        busy: dict[int, tuple[Worker, int, float]] = {}  # fileno -> (worker, task, started)
        idle = list(self._compilers)
        compiled = False
        while pending or busy:
            stop = self._end(compiled)
            if time.monotonic() >= stop:  # the rest is not compiled
                for w, _, _ in busy.values():
                    w.stop()
                self.cut.update(texts[i] for i in [*pending, *(i for _, i, _ in busy.values())])
                break
            while pending and idle:
                w, i = idle.pop(), pending.pop(0)
                w.send(("compile", self.kernel_of, self.source, self.specs, texts[i], self.backend))
                assert w.conn is not None
                busy[w.conn.fileno()] = (w, i, time.monotonic())
            next_stop = min([stop, *(t0 + self.compile_timeout_s for _, _, t0 in busy.values())])
            conns = [w.conn for w, _, _ in busy.values() if w.conn is not None]
            ready = wait(conns, timeout=min(1.0, max(0.0, next_stop - time.monotonic())))
            now = time.monotonic()
            for fd, (w, i, t0) in list(busy.items()):
                if w.conn in ready:
                    reply = w.receive(0)
                elif now - t0 >= self.compile_timeout_s:
                    w.stop()
                    reply = ("error", f"compile timed out after {self.compile_timeout_s:g} s")
                else:
                    continue
                results[i] = None if reply[0] == "ok" else reply[1]
                compiled = compiled or reply[0] == "ok"
                del busy[fd]
                idle.append(w)
        return results

    def _compile_on_executor(self, texts: list[str]) -> list[str | None]:
        assert self.executor is not None
        futures = {self.executor.submit(compile_candidate, self.kernel_of, self.source, self.specs, t, self.backend): i
                   for i, t in enumerate(texts)}
        results: list[str | None] = [None] * len(texts)
        timeout_at = time.monotonic() + self.compile_timeout_s
        compiled = False
        while futures:
            stop = self._end(compiled)
            now = time.monotonic()
            if now >= min(stop, timeout_at):  # what is still running is not waited for
                for f, i in futures.items():
                    f.cancel()
                    if now >= stop:
                        self.cut.add(texts[i])
                    else:
                        results[i] = f"compile timed out after {self.compile_timeout_s:g} s"
                break
            done, _ = wait_futures(list(futures), timeout=min(1.0, min(stop, timeout_at) - now),
                                   return_when=FIRST_COMPLETED)
            for f in done:
                i = futures.pop(f)
                try:
                    results[i] = f.result()
                except Exception as e:
                    results[i] = f"{type(e).__name__}: {e}"
                compiled = compiled or results[i] is None
        return results

    def _time_remote(self, texts: list[str]) -> list[float]:
        """Each candidate compiled and timed by one executor task (see ``time_remote``); a new
        best is checked here, against the reference, before it counts."""
        timeout = self.timeout()
        futures = [self._submit_timing(t, timeout) if self._limit(timeout) > 0 else None for t in texts]
        costs = []
        for text, f in zip(texts, futures):
            try:
                if f is None or self.out_of_time():
                    raise OutOfBudget
                t0 = time.monotonic()
                reply = self._remote_reply(f, timeout)
                self.request_s[text] = time.monotonic() - t0  # the wait for it (the tasks run side by side)
                if reply[0] != "ok":
                    self._reject(text, reply[1])
                    costs.append(math.inf)
                    continue
                t = float(reply[1])
                if t < self.best:
                    why = self._check(text)
                    if why:
                        self._reject(text, why)
                        costs.append(math.inf)
                        continue
                    self.best = t
                costs.append(t)
            except OutOfBudget:
                if f is not None:
                    f.cancel()
                self.cut.add(text)
                costs.append(math.inf)
        return costs

    def _submit_timing(self, text: str, timeout: float) -> Future:
        """The remote task's own waits end with the deadline's grace too."""
        assert self.executor is not None
        return self.executor.submit(time_remote, self.kernel_of, self.source, self.inputs, text, self.reps,
                                    self.backend, self.runner, self._limit(self.compile_timeout_s),
                                    self._limit(timeout))

    def _remote_reply(self, f: Future, timeout: float) -> tuple:
        seconds = self.compile_timeout_s + timeout + 60
        limit = self._limit(seconds)
        try:
            return f.result(timeout=limit)  # type: ignore[no-any-return]
        except FutureTimeout:
            if limit < seconds:
                raise OutOfBudget from None
            return ("error", f"executor: no reply after {seconds:g} s")
        except Exception as e:  # the task's worker died
            return ("error", f"executor: {type(e).__name__}: {e}")

    def timeout(self) -> float:
        """Seconds one timing request may take: ``run_timeout_s``, or less once a best is known
        (a candidate 20x slower than the best is not worth waiting for; never under 2 s)."""
        if not math.isfinite(self.best):
            return self.run_timeout_s
        return min(self.run_timeout_s, max(MIN_TIMEOUT_S, SLOWER_THAN_BEST * self.best * (self.reps + 1)))

    def _time(self, text: str) -> float:
        t0 = time.monotonic()
        reply = self._ask(self._timer, ("prepare", text), self.compile_timeout_s)  # lowering (isl) and loading
        if reply[0] != "ok":  # count apart from the run
            self._reject(text, f"compile: {reply[1]}")
            return math.inf
        self.prepare_s.setdefault(text, time.monotonic() - t0)
        t0 = time.monotonic()
        reply = self._ask(self._timer, ("time", text, False), self.timeout())
        self.request_s[text] = time.monotonic() - t0
        if reply[0] != "ok":
            self._reject(text, f"run: {reply[1]}")
            return math.inf
        t = float(reply[1])
        if t < self.best:  # a new best is checked before it counts
            why = self._check(text)
            if why:
                self._reject(text, why)
                return math.inf
            self.best = t
        return t

    def again(self, options: MappingOptions) -> float:
        """One more timing of options already scored, under the run timeout (inf when it fails);
        OutOfBudget when the deadline cuts it short. On an executor, whichever worker takes it."""
        text = options.to_json()
        if self.time_on == "executor":
            if self._limit(self.run_timeout_s) <= 0:
                raise OutOfBudget
            reply = self._remote_reply(self._submit_timing(text, self.run_timeout_s), self.run_timeout_s)
        else:
            reply = self._ask(self._timer, ("time", text, False), self.run_timeout_s)
        return float(reply[1]) if reply[0] == "ok" else math.inf

    def pair(self, tuned: MappingOptions, default: MappingOptions, r: int) -> tuple[float, float] | None:
        """Round ``r`` of the final comparison, (tuned seconds, default seconds) timed back to back
        under the same load, the defaults first in even rounds and the tuned options first in odd
        ones; None when the deadline stops it."""
        try:
            if r % 2:
                t = self.again(tuned)
                return t, self.again(default)
            d = self.again(default)
            return self.again(tuned), d
        except OutOfBudget:
            return None

    def _check(self, text: str) -> str | None:
        reply = self._ask(self._timer, ("time", text, True), self.run_timeout_s)
        if reply[0] != "ok":
            return f"check run: {reply[1]}"
        got = reply[2] if isinstance(reply[2], tuple) else (reply[2],)
        return mismatch(got, self.reference)


def mismatch(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str | None:
    """Why ``got`` differs from the reference outputs, or None."""
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind in "fc":
            finite = np.isfinite(w)
            if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(g[~finite & ~np.isnan(w)],
                                                                                  w[~finite & ~np.isnan(w)]):
                return f"output {k}: NaN or infinity where the reference differs"
            scale = float(np.max(np.abs(w[finite]))) if finite.any() else 0.0
            err = float(np.max(np.abs(g[finite].astype(np.float64) - w[finite]))) if finite.any() else 0.0
            if not err <= RTOL * (scale or 1.0):
                return f"output {k}: wrong result (max error {err:.3g}, scale {scale:.3g})"
        elif not np.array_equal(g, w):
            return f"output {k}: wrong result ({int(np.sum(g != w))} elements differ)"
    return None
