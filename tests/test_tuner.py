"""The autotuner end to end: search space, safe evaluation (crashing, hanging, raising and wrong
candidates), the driver with its cache, resume, the kernel API, Dask, and the CLI."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import has_cuda, has_opencl
from tolerance import assert_close, assert_sum_close
from tuner_faults import HANG, RAISES, SEGFAULT, WRONG

import tcdsl as tc
from tcdsl.options import MappingOptions
from tcdsl.tuner import space as S
from tcdsl.tuner import tune as T
from tcdsl.tuner.cache import TuningCache
from tcdsl.tuner.evaluate import Evaluator

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MM_RENAMED = "def mm(float(X,Y) P, float(Y,Z) Q) -> (R) { R(x,z) +=! P(x,y) * Q(y,z) }"
SOFTMAX = """def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n,r_d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,r_d)
    Y(n,d) = e(n,d) / s(n)
}"""
FAULTY = "tuner_faults:faulty_runner"


def f32(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TuningCache:
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))
    return TuningCache()


# ---- search space ------------------------------------------------------------------------------

def test_space_round_trips_options_and_prunes_spilling_register_tiles():
    k = tc.define(MM)
    space = S.space_for(k.checked, {"M": 64, "K": 48, "N": 200})
    assert [g.name for g in space.genes][:5] == ["fusion", "tiles", "tile0", "tile1", "tile2"]
    choices = dict((g.name, g.choices) for g in space.genes)
    assert (max(choices["tile0"]), max(choices["tile1"]), max(choices["tile2"])) == (48, 128, 32)  # < m, n, k
    assert {0, 4, 8, 16, 32, 64, 128, 40, 50, 100} <= set(choices["tile1"])  # powers of two, divisors of 200
    for opts in (MappingOptions(), MappingOptions(fusion="min", tile=(32, 64, 16), register_tile=(4, 16, 1),
                                                  point_order=(0, 2, 1), vectorize=False, parallel_depth=1,
                                                  unroll=8)):
        g = S.from_options(space, opts)
        assert g is not None and S.to_options(space, g) == opts
    assert S.from_options(space, MappingOptions(tile=(3, 3, 3))) is None  # not a choice of the space
    spill = S.from_options(space, MappingOptions(tile=(32, 64, 16), register_tile=(32, 64, 1)))
    assert spill is not None and "register tile of 2048" in (S.prune(space, spill) or "")


def test_space_of_an_a_bt_contraction_lays_its_tiles_out_or_not():
    """A def whose contraction is laid out (tcdsl.layout) gets a layout gene: explicit tiles for the
    def as written (None) or for the laid-out def (True); a def without one has no such gene and no
    genome for layout=True."""
    fc = tc.define("def fc(float(B,M) I, float(N,M) W) -> (O) { O(b,n) +=! I(b,r_m) * W(n,r_m) }")
    space = S.space_for(fc.checked, {"B": 32, "M": 300, "N": 200})
    choices = dict((g.name, g.choices) for g in space.genes)
    assert choices["layout"] == (None, True)
    # the levels of both: (b, n, m) as written, (m, b) / (n, b, m) / (b, n) laid out
    assert (max(choices["tile0"]), max(choices["tile1"]), max(choices["tile2"])) == (256, 128, 256)
    for opts in (MappingOptions(), MappingOptions(tile=(64, 16, 128), register_tile=(6, 16, 1), layout=True),
                 MappingOptions(tile=(16, 64, 128), register_tile=(1, 1, 1))):
        g = S.from_options(space, opts)
        assert g is not None and S.to_options(space, g) == opts
    mm = S.space_for(tc.define(MM).checked, {"M": 64, "K": 48, "N": 200})
    assert "layout" not in [g.name for g in mm.genes]
    assert S.from_options(mm, MappingOptions(layout=True)) is None


def test_canonical_text_ignores_names_but_not_structure():
    same = S.canonical_text(tc.define(MM).checked), S.canonical_text(tc.define(MM_RENAMED).checked)
    assert same[0] == same[1]
    other = "def mm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
    assert S.canonical_text(tc.define(other).checked) != same[0]


# ---- safe evaluation ---------------------------------------------------------------------------

@pytest.mark.cpu
def test_crashing_hanging_raising_and_wrong_candidates_are_scored_invalid():
    k = tc.define(MM)
    A, B = f32((64, 32)), f32((32, 48), 1)
    ev = Evaluator(str(k.checked), [A, B], [k(A, B, backend="numpy")], tc.Kernel.of_source, runner=FAULTY,
                   run_timeout_s=3.0)
    try:
        cands = [MappingOptions(), MappingOptions(unroll=SEGFAULT), MappingOptions(unroll=HANG),
                 MappingOptions(unroll=RAISES), MappingOptions(unroll=WRONG), MappingOptions(tile=(16, 16, 16))]
        costs = ev(cands)
    finally:
        ev.close()
    assert math.isfinite(costs[0]) and math.isfinite(costs[5]) and costs[0] > 0
    assert costs[1:5] == [math.inf] * 4
    why = {MappingOptions.from_json(o).unroll: reason for o, reason in ev.rejected}
    assert "SIGSEGV" in why[SEGFAULT] and "timed out after" in why[HANG]
    assert ev.timeout() == max(2.0, 20 * ev.best * 6) < 3.0  # once a best is known, slow ones stop sooner
    assert "this candidate raises" in why[RAISES] and "wrong result" in why[WRONG]


@pytest.mark.cpu
def test_a_candidate_that_does_not_compile_is_invalid_and_the_rest_run():
    k = tc.define(MM)
    A, B = f32((16, 16)), f32((16, 16), 1)
    ev = Evaluator(str(k.checked), [A, B], [k(A, B, backend="numpy")], tc.Kernel.of_source, jobs=2)
    try:
        costs = ev([MappingOptions(point_order=(0, 1, 2, 3, 4)), MappingOptions()])  # too many members
    finally:
        ev.close()
    assert math.isfinite(costs[1]) and costs[1] > 0


# ---- the driver ----------------------------------------------------------------------------------

@pytest.mark.cpu
def test_autotune_stores_a_checked_best_that_later_calls_use(db: TuningCache):
    k = tc.define(MM)
    A, B = f32((96, 64)), f32((64, 80), 1)
    result = k.autotune(A, B, generations=2, population=6, elites=2, seed=0, progress=False, runner=FAULTY,
                        run_timeout=3.0)
    assert math.isfinite(result.time_s) and result.time_s > 0 and result.evaluations >= 6
    assert result.options.unroll not in (SEGFAULT, HANG, WRONG, RAISES)  # faulty ones never win
    entry = db.best(T.key_for(k, [A, B]))
    assert entry is not None and MappingOptions.from_json(entry.options) == result.options
    assert len(db.history(T.key_for(k, [A, B]))) == len(result.generations)
    # a new kernel of the same def with other names picks the tuned options up, and computes right
    k2 = tc.define(MM_RENAMED)
    assert k2._tuned_for([A, B]) == result.options
    assert_sum_close(k2(A, B), np.matmul, A, B, terms=64)
    assert k2._tuned_for([A, B[:, :40]]) is None  # other sizes: not tuned
    assert "best" in result.explain() and f"{result.evaluations} candidates" in result.explain()
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = result.plot()
    assert [list(line.get_xdata()) for line in ax.lines] == [[0, 1], [0, 1]]
    assert ax.lines[0].get_ydata()[-1] == pytest.approx(result.generations[-1].best_cost * 1e3)


@pytest.mark.cpu
def test_the_views_show_the_options_a_call_uses_and_where_they_come_from(db: TuningCache):
    """After tuning, options_for, explain, source, schedule and compiled follow the tuning cache (a
    fresh kernel of the same def too), say so with the date and the time measured, and name what
    differs from the defaults; options= and kernel.options win over the cache, and say so."""
    k = tc.define(MM)
    A, B = f32((40, 24)), f32((24, 32), 1)
    defaults = "options: defaults (no tuning cache entry for these arguments)"
    assert k.options_for(A, B) == MappingOptions()
    assert k.explain(A, B).startswith(defaults + "\n") and k.source(A, B).startswith(f"/* {defaults} */\n")
    tuned = MappingOptions(tile=(8, 16, 8), unroll=4)
    db.record(T.key_for(k, [A, B]), tuned.to_json(), 1.25e-3, evaluations=37)
    fresh = tc.define(MM_RENAMED)
    for kernel in (k, fresh):
        kernel._tuned.clear()  # k looked the cache up before the entry existed (once per argument layout)
        assert kernel.options_for(A, B) == tuned
        heads = [kernel.explain(A, B).splitlines()[0], kernel.source(A, B).splitlines()[0],
                 kernel.schedule(A, B).splitlines()[0]]
        for head in heads:
            assert re.search(r"options: tuned on \d{4}-\d\d-\d\d \d\d:\d\d UTC: 1\.25 ms measured, 37 candidates "
                             r"evaluated; differs from the defaults in tile: None -> \(8, 16, 8\), unroll: 0 -> 4",
                             head), head
        text = kernel.source(A, B)
        assert text.split("\n", 1)[1] == kernel.compiled(A, B).low.source.text  # what a call compiles
        assert "c0 += 8" in text  # the tuned tile, not the default one
    assert_sum_close(fresh(A, B), np.matmul, A, B, terms=24)
    mine = MappingOptions(tile=(4, 4, 4))
    assert fresh.options_for(A, B) == tuned and fresh.explain(A, B, options=mine).startswith(
        "options: passed explicitly (options=); differs from the defaults in tile: None -> (4, 4, 4)")
    fresh.options = mine
    assert fresh.options_for(A, B) == mine and fresh.source(A, B).startswith("/* options: the kernel's own")


@pytest.mark.cpu
def test_an_interrupted_search_resumes_from_its_checkpoint(db: TuningCache, monkeypatch: pytest.MonkeyPatch):
    k = tc.define(SOFTMAX)
    X = f32((64, 128))
    calls = {"n": 0}
    original = T._Progress.generation

    def interrupt_after_first(self: T._Progress, g: T.Generation) -> None:
        original(self, g)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # Ctrl-C after generation 0 was checkpointed

    monkeypatch.setattr(T._Progress, "generation", interrupt_after_first)
    first = k.autotune(X, generations=3, population=5, elites=1, seed=2, progress=False, patience=None)
    assert first.stopped == "interrupted" and [g.number for g in first.generations] == [0]
    key = T.key_for(k, [X])
    assert db.load_checkpoint(key) is not None  # kept for the resume
    assert db.best(key) is not None  # what was found is kept
    rest = k.autotune(X, generations=3, population=5, elites=1, seed=2, progress=False, patience=None, resume=True)
    assert rest.stopped == "generations" and [g.number for g in rest.generations] == [0, 1, 2]
    assert db.load_checkpoint(key) is None
    x = X.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    assert_close(k(X), e / e.sum(1, keepdims=True), terms=128, dtype=np.float32)


@pytest.mark.cpu
def test_ctrl_c_in_the_first_generation_keeps_what_was_measured(db: TuningCache, monkeypatch: pytest.MonkeyPatch):
    """Ctrl-C while the first generation runs: the result holds the best candidate timed so far
    (the defaults are timed first, so there is one), the defaults stay, and the progress counts
    (every candidate) agree with the summary's."""
    k = tc.define(MM)
    A, B = f32((48, 40)), f32((40, 56), 1)
    seen: list[T._Progress] = []
    original = T._Progress.candidate

    def interrupt_at_the_fourth(self: T._Progress, cost: float, how: str) -> None:
        original(self, cost, how)
        seen.extend([self] * (how == "valid"))
        if len(seen) == 4:  # the fourth candidate timed (pruned ones, invalid, come before the timed ones)
            raise KeyboardInterrupt

    monkeypatch.setattr(T._Progress, "candidate", interrupt_at_the_fourth)
    result = k.autotune(A, B, generations=3, population=12, seed=5, progress=False, patience=None)
    assert result.stopped == "interrupted" and result.generations == []
    assert result.candidate is not None and math.isfinite(result.default_time_s)
    assert result.options == MappingOptions() and not result.decision.keep  # unchecked against the defaults
    bar = seen[-1]
    assert bar.invalid == result.invalid and result.evaluations >= 4 + bar.invalid


@pytest.mark.cpu
def test_short_form_kernels_tune_too(db: TuningCache):
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A, B = f32((24, 16)), f32((16, 40), 1)
    result = tc.autotune(matmul, A, B, generations=1, population=3, elites=1, seed=6, progress=False)
    assert math.isfinite(result.time_s) and result.evaluations == 3
    assert db.best(T.key_for(matmul.kernel(A, B), [A, B])) is not None
    assert_sum_close(matmul(A, B), np.matmul, A, B, terms=16)


@pytest.mark.cpu
def test_the_budget_stops_the_search_within_a_generation(db: TuningCache):
    k = tc.define(MM)
    A, B = f32((48, 48)), f32((48, 48), 1)
    t0 = time.monotonic()
    result = k.autotune(A, B, generations=5, population=40, budget=2.0, seed=4, progress=False)
    spent = time.monotonic() - t0
    assert result.stopped == "budget" and 0 < result.evaluations < 40
    assert spent < 2.0 + 15.0, spent  # one batch of candidates past the deadline, plus the final timings
    assert math.isfinite(result.time_s)


def _cluster(distributed: Any) -> Any:
    """Two worker processes on loopback; the dashboard on a free port (8787 may be taken by
    another run: distributed's retry then leaks a socket, an error under -W error)."""
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address="127.0.0.1:0")


@pytest.mark.cpu
def test_search_runs_on_a_dask_cluster(db: TuningCache):
    distributed = pytest.importorskip("distributed")
    k = tc.define(MM)
    A, B = f32((32, 32)), f32((32, 32), 1)
    with _cluster(distributed) as cluster, distributed.Client(cluster) as client:
        result = tc.autotune(k, A, B, generations=1, population=4, elites=1, seed=5, progress=False,
                             executor=client.get_executor())
    assert math.isfinite(result.time_s) and result.evaluations == 4


@pytest.mark.cpu
def test_candidates_timed_on_the_dask_workers(db: TuningCache, tmp_path: Path):
    """time_on="executor": the workers time the candidates in processes of their own (the runner
    records its pid and its parent's), a segfaulting candidate kills only such a process, and
    the best is still checked against the reference here."""
    distributed = pytest.importorskip("distributed")
    k = tc.define(MM)
    A, B = f32((32, 32)), f32((32, 32), 1)
    log = tmp_path / "timings.txt"
    os.environ["TCDSL_TEST_TIMING_LOG"] = str(log)
    try:
        with _cluster(distributed) as cluster, distributed.Client(cluster) as client:
            worker_pids = set(client.run(os.getpid).values())
            result = tc.autotune(k, A, B, generations=2, population=6, elites=1, seed=5, progress=False,
                                 executor=client.get_executor(), time_on="executor",
                                 runner="tuner_faults:logged_or_crash")
            assert set(client.run(os.getpid).values()) == worker_pids  # no Dask worker died
    finally:
        del os.environ["TCDSL_TEST_TIMING_LOG"]
    assert math.isfinite(result.time_s)
    assert result.invalid >= 1  # the segfault
    lines = [tuple(map(int, line.split())) for line in log.read_text().split("\n") if line]
    remote = [pid for pid, parent in lines if parent in worker_pids]
    assert remote, lines  # timed in processes started by the Dask workers
    assert all(pid not in worker_pids for pid, _ in lines)  # never in a Dask worker itself
    assert_sum_close(k(A, B), np.matmul, A, B, terms=32)  # the tuned options sum in another order
    with pytest.raises(ValueError, match="needs an executor"):
        tc.autotune(k, A, B, generations=1, population=2, elites=1, progress=False, time_on="executor")


@pytest.mark.cpu
def test_cli_tune_prints_and_stores_the_best(tmp_path: Path):
    src = tmp_path / "mm.tc"
    src.write_text(MM + "\n")
    env = dict(os.environ, TCDSL_TUNING_DB=str(tmp_path / "t.sqlite"))
    out = subprocess.run([sys.executable, "-m", "tcdsl", "tune", str(src), "--sizes", "M=32,K=16,N=24",
                          "--generations", "1", "--population", "3", "--seed", "1"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    best = MappingOptions.from_json(out.stdout.strip().splitlines()[-1])
    assert TuningCache(tmp_path / "t.sqlite").entries()[0].options == best.to_json()


def test_cli_names_the_defs_when_the_entry_is_missing_or_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from tcdsl.cli import main

    src = tmp_path / "two.tc"
    src.write_text(MM + "\n" + SOFTMAX + "\n")
    for command in ("compile", "tune"):
        assert main([command, str(src), "--sizes", "M=4,K=4,N=4"]) == 1
        err = capsys.readouterr().err
        assert f"--entry must name one of the defs in {src}: mm, softmax" in err, err
    if not has_cuda():
        assert main(["tune", str(src), "--entry", "mm", "--backend", "cuda", "--sizes", "M=4,K=4,N=4"]) == 1
        assert "needs cupy" in capsys.readouterr().err
    assert main(["compile", str(src), "--entry", "mm", "--sizes", "M=4,K=4,N=4", "--emit", "c"]) == 0
    assert "int tc_kernel(" in capsys.readouterr().out


# ---- the GPU space (TC's options), tuned on OpenCL ----------------------------------------------------


def test_gpu_space_round_trips_and_prunes_what_the_device_cannot_run():
    k = tc.define(MM)
    sp = S.gpu_space_for(k.checked, {"M": 64, "K": 48, "N": 80})
    g = S.from_options(sp, MappingOptions())
    assert g is not None and S.to_options(sp, g) == MappingOptions() and S.prune(sp, g) is None
    o = MappingOptions(fusion="max", tile=(16, 8, 4), blocks=(4, 1), threads=(64, 4), shared_memory=False,
                       private_memory=False, unroll=4, unroll_copy_shared=True)
    assert S.to_options(sp, S.from_options(sp, o)) == o
    assert "1024" in S.prune(sp, S.from_options(sp, MappingOptions(threads=(1024, 32))))
    assert "under a warp" in S.prune(sp, S.from_options(sp, MappingOptions(threads=(4, 2))))
    names = {gene.name for gene in sp.genes}
    assert {"block_x", "block_y", "thread_x", "thread_y", "thread_z", "shared_memory", "private_memory",
            "unroll", "unroll_copy_shared", "fusion", "gtile0", "gtile1", "gtile2"} <= names


@pytest.mark.gpu
@pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform")
def test_tuning_on_opencl_stores_options_that_later_calls_use(tmp_path: Path):
    k = tc.define(MM)
    A = np.random.default_rng(0).standard_normal((48, 40)).astype(np.float32)
    B = np.random.default_rng(1).standard_normal((40, 56)).astype(np.float32)
    cache = TuningCache(tmp_path / "gpu.sqlite")
    result = k.autotune(A, B, backend="opencl", generations=2, population=6, seed=3, cache=cache,
                        progress=False, reps=2)
    assert result.key.backend == "opencl" and "opencl" in result.key.arch
    assert result.evaluations >= 6 and math.isfinite(result.time_s)
    stored = cache.best(result.key)
    assert stored is not None and MappingOptions.from_json(stored.options) == result.options
    assert_sum_close(k(A, B, backend="opencl", options=result.options), np.matmul, A, B, terms=40)
    assert k._tuned_for([A, B], "opencl") == result.options  # later calls on OpenCL take them
    assert T.key_for(k, [A, B], "opencl") != T.key_for(k, [A, B], "c")


def test_autotune_spells_out_its_keywords_with_the_searchs_defaults():
    """``Kernel.autotune`` lists the search's keyword parameters (IDEs and help() show them), with
    the same defaults as the search itself."""
    import inspect

    mine = inspect.signature(tc.Kernel.autotune).parameters
    search = inspect.signature(T.autotune).parameters
    keywords = [n for n, p in search.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keywords and all(n in mine and mine[n].default == search[n].default for n in keywords), keywords
    assert "budget" in tc.Kernel.autotune.__doc__ and "patience" in tc.Kernel.autotune.__doc__
