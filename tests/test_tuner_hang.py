"""The autotuner against a real C compiler that hangs or crashes: a ``CC`` wrapper around the
system compiler that faults on every source but the default options' one. The budget bounds
``autotune`` (hung compiles included), the defaults still come back and compute right, and no
process the tuner started (wrapper, compiler, their children) outlives it."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import toolchain
from tcdsl.options import MappingOptions
from tcdsl.tuner.cache import TuningCache
from tcdsl.tuner.evaluate import GRACE_S, ArgSpec, compile_candidate
from tcdsl.tuner.tune import TuneResult

pytestmark = pytest.mark.cpu

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
M, K, N = 72, 48, 60  # big enough that the candidates' tilings give code of their own
SLACK_S = 3.0  # killing the workers and the final bookkeeping, past the deadline's grace
MARK = "TCDSL_TEST_CC_MARK"  # in the environment of every process the tests' tuner starts

# The mode file says what the wrapper does with a source other than allowed.c: "record" (copy it to
# allowed.c, then compile), "pass", "hang" (a child that sleeps, as a stuck cc1 would), "segv" or
# "kill" (the compiler dies of that signal). Queries without a source (--version, the CPU target)
# always answer.
WRAPPER = """#!/bin/sh
dir={dir}
src=
for a in "$@"; do case "$a" in *.c) src=$a;; esac; done
mode=$(cat "$dir/mode")
if [ -z "$src" ]; then exec {cc} "$@"; fi
if [ "$mode" = record ]; then cp "$src" "$dir/allowed.c"; exec {cc} "$@"; fi
if [ "$mode" = pass ] || cmp -s "$src" "$dir/allowed.c"; then exec {cc} "$@"; fi
case "$mode" in
  hang) sleep 3600 & echo $! >> "$dir/sleepers"; wait;;
  segv) kill -SEGV $$;;
  kill) kill -KILL $$;;
esac
exit 1
"""


class FaultyCC:
    """The wrapper's folder: its mode, and the processes it and the tuner started."""

    def __init__(self, folder: Path, mark: str) -> None:
        self.folder, self.mark = folder, mark
        self.compile_s = 0.0  # what building the defaults took here (the fixture's cold compile)

    def set_mode(self, mode: str) -> None:
        (self.folder / "mode").write_text(mode)

    def sleepers(self) -> list[int]:
        """The pids of the children that hung compiles started (the wrapper writes them down)."""
        f = self.folder / "sleepers"
        return [int(x) for x in f.read_text().split()] if f.exists() else []

    def marked(self) -> list[int]:
        """Live processes (not zombies: they show no environment) that carry this test's mark."""
        needle = f"{MARK}={self.mark}\0".encode()
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if needle in f.read():
                            found.append(int(name))
                except OSError:
                    pass
        return found

    def survivors(self, wait_s: float = 3.0) -> list[int]:
        """The marked processes still alive after up to ``wait_s`` (a SIGKILL takes a moment)."""
        end = time.monotonic() + wait_s
        while (alive := self.marked()) and time.monotonic() < end:
            time.sleep(0.05)
        return alive


@pytest.fixture
def faulty_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyCC]:
    real = toolchain.compiler()
    real = [shutil.which(real[0]) or real[0], *real[1:]]
    folder = tmp_path / "cc"
    folder.mkdir()
    script = folder / "cc"
    script.write_text(WRAPPER.format(dir=shlex.quote(str(folder)), cc=shlex.join(real)))
    script.chmod(0o755)
    cc = FaultyCC(folder, uuid.uuid4().hex)
    monkeypatch.setenv("CC", str(script))
    monkeypatch.setenv(MARK, cc.mark)
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path / "record"))
    cc.set_mode("record")  # the default options' source as the tuner builds it, in a cache of its own
    specs = [ArgSpec.of(a) for a in inputs()]
    t0 = time.monotonic()
    assert compile_candidate(tc.Kernel.of_source, str(tc.define(MM).checked), specs, MappingOptions().to_json()) is None
    cc.compile_s = time.monotonic() - t0
    assert (folder / "allowed.c").exists()
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path / "cache"))  # the tuner finds the defaults unbuilt
    yield cc
    for pid in cc.marked():  # a failed test leaves nothing behind
        os.kill(pid, signal.SIGKILL)


def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)


def check_numbers(cc: FaultyCC, options: MappingOptions) -> None:
    """A new kernel run with ``options`` against numpy, within the rounding of K float32 products
    (built by the real compiler where this process's source differs from the tuner's)."""
    cc.set_mode("pass")
    A, B = inputs()
    got = tc.define(MM)(A, B, options=options)
    atol = 4 * np.finfo(np.float32).eps * K * np.abs(A).max() * np.abs(B).max()
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=0, atol=atol)


def hang_budget(cc: FaultyCC) -> float:
    """A budget that leaves the candidates time to start compiling (and hang) after the defaults'
    cold compile and timing: 8 s, or more on a machine so loaded that the defaults took over 2 s."""
    return max(8.0, 4.0 * cc.compile_s)


def tune(tmp_path: Path, **settings: Any) -> tuple[TuneResult, float]:
    """autotune on the small matmul, its own tuning cache; (result, seconds it took)."""
    A, B = inputs()
    t0 = time.monotonic()
    result = tc.define(MM).autotune(A, B, seed=0, progress=False, patience=None, reps=2,
                                    cache=TuningCache(tmp_path / "tuning.sqlite"), **settings)
    return result, time.monotonic() - t0


def test_the_survivor_check_sees_a_marked_process(faulty_cc: FaultyCC):
    proc = subprocess.Popen(["sleep", "30"], env=dict(os.environ))
    try:
        # Between fork and exec the child's /proc environ is still the parent's start-up one,
        # without the mark: wait for the exec rather than look once.
        end = time.monotonic() + 10.0
        while proc.pid not in faulty_cc.marked() and time.monotonic() < end:
            time.sleep(0.02)
        assert proc.pid in faulty_cc.marked()
    finally:
        proc.kill()
        proc.wait()
    assert faulty_cc.survivors() == []


def test_the_budget_stops_compiles_that_hang_and_the_defaults_win(faulty_cc: FaultyCC, tmp_path: Path):
    faulty_cc.set_mode("hang")
    budget = hang_budget(faulty_cc)
    result, spent = tune(tmp_path, generations=3, population=4, budget=budget)
    print(f"budget {budget} s: returned after {spent:.2f} s")
    assert spent < budget + GRACE_S + SLACK_S, spent
    assert faulty_cc.sleepers(), "no candidate's compile hung"
    assert faulty_cc.survivors() == []
    assert result.options == MappingOptions() and math.isfinite(result.time_s) and result.time_s > 0
    assert result.stopped == "budget"
    assert result.invalid == 0 and result.rejected == []  # stopped by the budget, not found invalid
    check_numbers(faulty_cc, result.options)


def test_the_budget_bounds_a_search_where_nothing_compiles(faulty_cc: FaultyCC, tmp_path: Path):
    (faulty_cc.folder / "allowed.c").unlink()  # the defaults hang too
    faulty_cc.set_mode("hang")
    budget = 3.0
    result, spent = tune(tmp_path, generations=2, population=3, budget=budget)
    print(f"budget {budget} s, nothing compiles: returned after {spent:.2f} s")
    assert budget + GRACE_S - 1.0 < spent < budget + GRACE_S + SLACK_S, spent  # the grace waits for a first one
    assert faulty_cc.survivors() == []
    assert result.options == MappingOptions() and result.time_s == math.inf
    check_numbers(faulty_cc, result.options)


@pytest.mark.parametrize("time_on", ["local", "executor"])
def test_the_budget_stops_waiting_for_an_executor(faulty_cc: FaultyCC, tmp_path: Path, time_on: str,
                                                   monkeypatch: pytest.MonkeyPatch):
    """Compiles (and, with time_on="executor", timings) run on an executor the tuner cannot kill: it
    stops waiting for them; whoever owns the executor ends its tasks."""
    faulty_cc.set_mode("hang")
    budget = hang_budget(faulty_cc)
    monkeypatch.setenv("TCDSL_COMPILE_TIMEOUT", str(budget + GRACE_S + 30))  # the budget ends the wait first
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        result, spent = tune(tmp_path, generations=3, population=4, budget=budget, executor=pool, time_on=time_on)
        print(f"budget {budget} s on an executor, time_on={time_on}: returned after {spent:.2f} s")
    finally:  # the owner ends the executor's tasks: no more hangs, and the hung compiles killed
        faulty_cc.set_mode("pass")
        # a compile the tuner stopped waiting for may not have written its sleeper down yet (a busy
        # machine): let its wrapper get there before it is killed
        end = time.monotonic() + 5.0
        while not faulty_cc.sleepers() and faulty_cc.marked() and time.monotonic() < end:
            time.sleep(0.05)
        for pid in faulty_cc.marked():
            os.kill(pid, signal.SIGKILL)
        pool.shutdown(wait=True, cancel_futures=True)
    assert spent < budget + GRACE_S + SLACK_S, spent
    assert faulty_cc.sleepers(), "no candidate's compile hung"
    assert result.options == MappingOptions() and math.isfinite(result.time_s)
    assert result.invalid == 0
    check_numbers(faulty_cc, result.options)


def test_a_compile_timeout_kills_the_compiler_and_its_children(faulty_cc: FaultyCC, tmp_path: Path):
    faulty_cc.set_mode("hang")
    result, spent = tune(tmp_path, generations=1, population=3, compile_timeout=6.0)
    print(f"compile timeout 6 s: returned after {spent:.2f} s")
    assert faulty_cc.sleepers(), "no candidate's compile hung"
    assert faulty_cc.survivors() == []
    assert result.options == MappingOptions() and math.isfinite(result.time_s)
    assert result.invalid == 2 and all("compile timed out after 6 s" in why for _, why in result.rejected)
    assert spent < 30.0, spent
    check_numbers(faulty_cc, result.options)


@pytest.mark.parametrize("signal_name", ["segv", "kill"])
def test_a_compiler_that_crashes_scores_its_candidates_invalid(faulty_cc: FaultyCC, tmp_path: Path,
                                                               signal_name: str):
    faulty_cc.set_mode(signal_name)
    result, spent = tune(tmp_path, generations=2, population=4, budget=40.0)
    print(f"compiler killed by SIG{signal_name.upper()}: returned after {spent:.2f} s")
    assert faulty_cc.survivors() == []
    assert result.options == MappingOptions() and math.isfinite(result.time_s)
    assert result.invalid >= 3 and len(result.rejected) == result.invalid
    assert all(why.startswith("compile: ") for _, why in result.rejected)
    check_numbers(faulty_cc, result.options)


def test_the_workers_end_with_a_tuner_killed_mid_compile(faulty_cc: FaultyCC, tmp_path: Path):
    faulty_cc.set_mode("hang")
    # seed 0, as the tests above: a random seed may draw only candidates whose C is the defaults'
    # (24x16x20 leaves few tiles that change the code), and then no compile hangs
    script = (f"import numpy as np, tcdsl as tc\n"
              f"from tcdsl.tuner.cache import TuningCache\n"
              f"rng = np.random.default_rng(0)\n"
              f"A, B = rng.standard_normal(({M}, {K}), np.float32), rng.standard_normal(({K}, {N}), np.float32)\n"
              f"tc.define({MM!r}).autotune(A, B, seed=0, generations=1, population=3, progress=False,\n"
              f"                           cache=TuningCache({str(tmp_path / 'tuning.sqlite')!r}))\n")
    tuner = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    try:
        end = time.monotonic() + 60
        while not faulty_cc.sleepers() and time.monotonic() < end and tuner.poll() is None:
            time.sleep(0.1)
        assert faulty_cc.sleepers(), "no candidate's compile hung"
    finally:
        tuner.kill()
        tuner.wait()
    assert faulty_cc.survivors(wait_s=5.0) == []  # each worker sees its parent go within a second


def test_a_worker_whose_tuner_died_before_it_started_ends() -> None:
    """The tuner passes its pid: a worker that starts (or finishes importing) after the tuner is
    gone, and so never saw it as its parent, ends at once instead of watching its new parent."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is no process's parent any more
    r, w = os.pipe()
    worker = subprocess.Popen([sys.executable, "-m", "tcdsl.tuner.worker", str(r), str(w),
                               "tcdsl.tuner.evaluate:time_candidate", str(gone.pid)], pass_fds=(r, w),
                              start_new_session=True)
    os.close(r)
    os.close(w)
    try:
        assert worker.wait(timeout=30) == -signal.SIGKILL  # its watchdog killed its own group
    finally:
        if worker.poll() is None:
            worker.kill()
