"""The C backend (``backend="c"``): the corpus against numpy and the interpreter, schedule
invariance under hypothesis-drawn MappingOptions, the legality check, the in-memory and on-disk
caches (also across two processes), compile errors, C keywords as TC names, run-time checks in C
and the OpenMP marks. Every test that compiles is marked ``cpu`` (skipped without a C compiler).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import resource
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcdsl as tc
from tcdsl import TcCompileError, TcRuntimeError, TcScheduleError
from tcdsl.codegen import toolchain
from tcdsl.options import FUSION, MappingOptions
from tcdsl.polyhedral import guard, schedule, trim
from tcdsl.polyhedral.deps import dependences
from tcdsl.polyhedral.loopir import LCall, LFor, LIf, LNode, walk
from tcdsl.polyhedral.scop import build_scop

try:  # pytest's default (prepend) import mode puts tests/ on sys.path; other modes may not
    from defs import DEFS, Arr, Case, assert_matches, make_inputs
    from targets import runnable
    from tolerance import assert_close, assert_sum_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from defs import DEFS, Arr, Case, assert_matches, make_inputs
    from targets import runnable
    from tolerance import assert_close, assert_sum_close

CASES = {c.name: c for c in DEFS}
REPO = Path(__file__).resolve().parent.parent

ORIGINAL_CC = os.environ.get("CC")
MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


@pytest.fixture(autouse=True, scope="module")
def _module_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every compile of this file goes to a private cache (never the user's ~/.cache/tcdsl);
    tests where caching matters set a fresh one of their own."""
    d = tmp_path_factory.mktemp("tcdsl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TCDSL_CACHE_DIR", str(d))
        mp.delenv("TCDSL_FORCE_RECOMPILE", raising=False)
        yield d


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return rng(seed).uniform(-1, 1, shape).astype(np.float32)


def c_code(text: str) -> str:
    """The C text without its ``//`` comments (the only place TC text may appear)."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def nested_omp(nodes: tuple[LNode, ...], inside: bool = False) -> bool:
    """Whether an omp loop sits inside another omp loop."""
    for n in nodes:
        if isinstance(n, LFor):
            if n.omp and inside:
                return True
            if nested_omp(n.body, inside or n.omp):
                return True
        elif isinstance(n, LIf) and (nested_omp(n.then, inside) or nested_omp(n.other, inside)):
            return True
    return False


# ---- 1. the corpus: C == numpy reference == interpreter ---------------------------------------------


@pytest.mark.cpu
@pytest.mark.parametrize("case", DEFS, ids=[c.name for c in DEFS])
def test_corpus_c_matches_reference_and_interpreter(case: Case):
    args = make_inputs(case.inputs)
    k = tc.define(case.source)
    got = k(*args, backend="c")
    assert_matches(got, case.reference(*args), case.tol, f"{case.name} (c vs numpy reference)")
    interp = k(*args, backend="numpy")
    assert_matches(got, interp, case.tol, f"{case.name} (c vs interpreter)")
    assert k.compile_count == 1


@pytest.mark.cpu
def test_default_backend_is_c_when_a_compiler_exists():
    assert tc.arguments.default_backend() == "c"
    k = tc.define(MATMUL)
    A, B = f32((5, 3)), f32((3, 4), 1)
    C = k(A, B)  # no backend: the default
    assert k.compile_count == 1
    assert_sum_close(C, np.matmul, A, B, terms=3)


# ---- 2. schedule invariance: any MappingOptions gives the interpreter's numbers ----------------------

CHAIN3 = ("def chain3(float(N, M) A, float(M) b) -> (O) {\n"
          "    t1(i, j) = A(i, j) * b(j) + 1.0\n"
          "    t2(i) +=! t1(i, j)\n"
          "    O(j, i) = t1(i, j) / t2(i)\n"
          "}")


def _chain3_ref(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    t1 = A.astype(np.float64) * b + 1
    return (t1 / t1.sum(1, keepdims=True)).T.astype(np.float32)


# name -> (source, odd-size inputs, numpy reference, terms (0: exact), deepest statement's index count)
INVARIANCE: dict[str, tuple[str, tuple[Any, ...], Any, int, int]] = {
    "matmul": (CASES["matmul"].source, (Arr("float32", (13, 7)), Arr("float32", (7, 33))),
               CASES["matmul"].reference, 7, 3),
    "conv2d": (CASES["conv2d_valid"].source, (Arr("float32", (1, 3, 7, 13)), Arr("float32", (2, 3, 3, 2))),
               CASES["conv2d_valid"].reference, 18, 7),
    "softmax": (CASES["softmax"].source, (Arr("float32", (7, 33), -5.0, 5.0),), CASES["softmax"].reference, 33, 2),
    "layernorm": (CASES["layernorm"].source,
                  (Arr("float32", (7, 13), -2.0, 2.0), Arr("float32", (13,)), Arr("float32", (13,))),
                  CASES["layernorm"].reference, 13, 2),
    "transposes": (CASES["transposes"].source, (Arr("float32", (7, 13)), Arr("float32", (1, 3, 7, 5))),
                   CASES["transposes"].reference, 0, 4),
    "embedding": (CASES["embedding"].source, (Arr("float32", (13, 7)), Arr("int32", (33,), 0, 13)),
                  CASES["embedding"].reference, 0, 2),
    "conv2d_same": (CASES["conv2d_same"].source, (Arr("float32", (1, 2, 7, 13)), Arr("float32", (3, 2, 3, 3))),
                    CASES["conv2d_same"].reference, 27, 7),
    "chain3": (CHAIN3, (Arr("float32", (7, 13), 0.5, 1.5), Arr("float32", (13,), 0.5, 1.5)), _chain3_ref, 13, 2),
    "reduce_all": (CASES["reduce_all"].source, (Arr("float32", (7, 13), 0.8, 1.2),),
                   CASES["reduce_all"].reference, 91, 2),
    "dot_rank0": (CASES["dot_rank0"].source, (Arr("float32", (33,)), Arr("float32", (33,))),
                  CASES["dot_rank0"].reference, 33, 1),
    "bmm": (CASES["batch_matmul"].source, (Arr("float32", (3, 7, 13)), Arr("float32", (3, 13, 5))),
            CASES["batch_matmul"].reference, 13, 4),
}

_SETUP: dict[str, tuple[Any, list[Any], Any]] = {}


def _setup(name: str) -> tuple[Any, list[Any], Any]:
    """The kernel, inputs and interpreter result of an invariance def (made once, checked once
    against the hand-written numpy reference)."""
    if name not in _SETUP:
        src, spec, ref, tol, _ = INVARIANCE[name]
        k = tc.define(src)
        args = make_inputs(spec, seed=3)
        want = k(*args, backend="numpy")
        assert_matches(want, ref(*args), tol, f"{name}: interpreter vs numpy reference")
        _SETUP[name] = (k, args, want)
    return _SETUP[name]


def mapping_options(depth: int) -> st.SearchStrategy[MappingOptions]:
    sizes = st.sampled_from([0, 1, 2, 3, 4, 5, 7, 8, 32, 64])
    perms = st.integers(1, max(depth, 1)).flatmap(lambda n: st.permutations(list(range(n))).map(tuple))
    return st.builds(
        MappingOptions,
        fusion=st.sampled_from((None, *FUSION)),
        tile=st.none() | st.lists(sizes, min_size=0, max_size=depth + 1).map(tuple),
        register_tile=st.none() | st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple),
        point_order=st.none() | perms,
        vectorize=st.booleans(),
        openmp=st.booleans(),
        parallel_depth=st.integers(0, 2),
        unroll=st.integers(0, 4),
    )


def _invariance(name: str, opts: MappingOptions) -> None:
    k, args, want = _setup(name)
    tol = INVARIANCE[name][3]
    got = k(*args, backend="c", options=opts)
    assert_matches(got, want, tol, f"{name} with {opts}")


def _invariance_test(name: str) -> Any:
    depth = INVARIANCE[name][4]

    @pytest.mark.cpu
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(opts=mapping_options(depth))
    def test(opts: MappingOptions) -> None:
        _invariance(name, opts)

    test.__name__ = f"test_schedule_invariance_{name}"
    return test


for _name in INVARIANCE:
    globals()[f"test_schedule_invariance_{_name}"] = _invariance_test(_name)


@pytest.mark.cpu
@pytest.mark.parametrize("fusion", FUSION)
@pytest.mark.parametrize("name", ["matmul", "softmax", "chain3", "conv2d_same"])
def test_schedule_invariance_corners(name: str, fusion: str):
    """Fixed corner options per fusion strategy: tiles of 1 everywhere, tiles larger than every
    extent, tiles not dividing the extents with register tiles, a reversed point order."""
    depth = INVARIANCE[name][4]
    for opts in (MappingOptions(fusion=fusion, tile=(1,) * depth),
                 MappingOptions(fusion=fusion, tile=(64,) * depth, vectorize=False),
                 MappingOptions(fusion=fusion, tile=(5, 3, 2), register_tile=(2, 3), openmp=False),
                 MappingOptions(fusion=fusion, point_order=tuple(reversed(range(depth))), parallel_depth=1)):
        _invariance(name, opts)


LOGIC = "def logic(float(N) A, float(N) B) -> (L) { L(i) = (A(i) > 0.0 && B(i) > 0.0) || A(i) < -0.5 ? 1 : 2 }"


@pytest.mark.cpu
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("rt", [None, (2,), (3,), (4,), (5,)])
def test_short_circuit_logic_under_register_tiles(rt: tuple[int, ...] | None, vectorize: bool):
    """Unroll-and-jam copies of a statement with `&&`/`||` (gcc 12 -O3 once vectorised these wrongly)."""
    k = tc.define(LOGIC)
    for seed in range(3):
        A, B = make_inputs((Arr("float32", (30,)), Arr("float32", (30,))), seed=seed)
        want = np.where(((A > 0) & (B > 0)) | (A < -0.5), 1, 2).astype(np.int32)
        np.testing.assert_array_equal(k(A, B, backend="numpy"), want)
        for openmp in (False, True):
            opts = MappingOptions(register_tile=rt, vectorize=vectorize, openmp=openmp)
            np.testing.assert_array_equal(k(A, B, backend="c", options=opts), want, err_msg=f"seed {seed}, {opts}")


# Sizes over the default tile size (32), so the default heuristics tile, register-tile and keep
# accumulators in locals; every fusion strategy and one explicit cache + register tiling.
# name -> (inputs, terms of the longest reduction at these sizes; 0: exact)
BIG: dict[str, tuple[tuple[Any, ...], int]] = {
    "matmul": ((Arr("float32", (67, 45)), Arr("float32", (45, 70))), 45),
    "batch_matmul": ((Arr("float32", (3, 37, 41)), Arr("float32", (3, 41, 34))), 41),
    "matvec": ((Arr("float32", (67, 100)), Arr("float32", (100,))), 100),
    "conv2d_same": ((Arr("float32", (1, 3, 35, 40)), Arr("float32", (5, 3, 3, 3))), 27),
    "reduce_cols_int": ((Arr("int32", (45, 67), -1000, 1000),), 0),
    "softmax": ((Arr("float32", (40, 70), -5.0, 5.0),), 70),
    "embedding_bag": ((Arr("float32", (50, 40)), Arr("int64", (33, 37), 0, 50)), 37),
    "reduce_after_init": ((Arr("float32", (40, 37), 0.9, 1.1), Arr("float32", (40,), 0.0, 3.0)), 38),
}


@pytest.mark.cpu
@pytest.mark.parametrize("name", list(BIG))
def test_big_sizes_default_and_tiled_options(name: str):
    case = CASES[name]
    k = tc.define(case.source)
    spec, tol = BIG[name]
    args = make_inputs(spec, seed=4)
    want = case.reference(*args)
    assert_matches(k(*args, backend="numpy"), want, tol, f"{name}: interpreter")
    for opts in (MappingOptions(), *(MappingOptions(fusion=f) for f in FUSION if f != "preserve"),
                 MappingOptions(tile=(16, 16, 16), register_tile=(4, 8))):
        assert_matches(k(*args, backend="c", options=opts), want, tol, f"{name} with {opts}")


@pytest.mark.cpu
@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("vectorize", [False, True])
def test_unroll_with_vectorize_compiles(unroll: int, vectorize: bool):
    """Full unrolling of small innermost loops, with and without `omp simd` on them."""
    k = tc.define(CASES["outer"].source)
    a, b = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.float32) - 1
    for opts in (MappingOptions(unroll=unroll, vectorize=vectorize),
                 MappingOptions(unroll=unroll, vectorize=vectorize, tile=(0, 2))):
        np.testing.assert_array_equal(k(a, b, backend="c", options=opts), np.outer(a, b), err_msg=str(opts))
    mm = tc.define(MATMUL)
    A, B = f32((7, 3)), f32((3, 4), 1)
    got = mm(A, B, backend="c", options=MappingOptions(unroll=unroll, vectorize=vectorize))
    assert_sum_close(got, np.matmul, A, B, terms=3)


# ---- 3. legality ---------------------------------------------------------------------------------


def _matmul_scop() -> Any:
    k = tc.define(MATMUL)
    inst = k.instance(np.zeros((4, 5), np.float32), np.zeros((5, 3), np.float32))
    scop = build_scop(inst)
    return scop, dependences(scop)


@pytest.fixture
def fresh_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """isl's remembered answers (schedule._memo) set aside: the test's searches run."""
    monkeypatch.setattr(schedule, "_memo", type(schedule._memo)())


def _hand_schedule(scop: Any, update: str) -> isl.Schedule:
    umap = isl.UnionMap("{ init1[i0, i1] -> [0, i0, i1, 0]; " f"S1[i0, i1, i2] -> [1, i0, i1, {update}] }}")
    umap = umap.intersect_domain(scop.domain)
    return isl.Schedule.from_domain(scop.domain).insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(umap))


def test_reduction_order_is_free_but_its_dependences_stay_for_parallelism():
    """Reductions may accumulate in any order (a reversed reduction loop is legal), but the
    accumulation dependences are kept, so a reduction loop is never run in parallel."""
    from tcdsl.polyhedral.deps import respects

    scop, deps = _matmul_scop()
    assert {s.name for s in scop.stmts} == {"init1", "S1"}
    reversed_k = _hand_schedule(scop, "-i2")
    assert schedule.check_legal(reversed_k, deps) is None
    assert not deps.reduction.is_empty()
    assert not respects(deps.all, reversed_k.get_map())  # the accumulation runs backwards: not a valid order
    assert "S1[" in str(deps.reduction) and "init1" not in str(deps.reduction)


def test_check_legal_rejects_update_before_init():
    scop, deps = _matmul_scop()
    umap = isl.UnionMap("{ init1[i0, i1] -> [1, i0, i1, 0]; S1[i0, i1, i2] -> [0, i0, i1, i2] }")
    sched = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(umap.intersect_domain(scop.domain)))
    with pytest.raises(TcScheduleError, match="violates dependences"):
        schedule.check_legal(sched, deps)


REVERSED_USE = "def rev(float(N) A) -> (O) {\n  T(i) = A(i) * 2.0\n  O(i) = T(N - 1 - i) + 1.0\n}"


def test_check_legal_rejects_a_fusion_that_reads_before_the_write():
    """Fusing S1[i] with S2[i] is illegal: S2 at i reads T(N - 1 - i), written later for i < N / 2."""
    k = tc.define(REVERSED_USE)
    scop = build_scop(k.instance(np.zeros(7, np.float32)))
    deps = dependences(scop)
    assert [s.name for s in scop.stmts] == ["S1", "S2"]
    fused = isl.UnionMap("{ S1[i0] -> [i0, 0]; S2[i0] -> [i0, 1] }").intersect_domain(scop.domain)
    sched = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(fused))
    with pytest.raises(TcScheduleError) as ei:
        schedule.check_legal(sched, deps)
    assert "violates dependences" in ei.value.message
    assert "S1[" in ei.value.message and "S2[" in ei.value.message
    # the program order, and every computed schedule, are legal
    ordered = isl.UnionMap("{ S1[i0] -> [0, i0]; S2[i0] -> [1, i0] }").intersect_domain(scop.domain)
    assert schedule.check_legal(isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(ordered)), deps) is None
    for fusion in FUSION:
        assert schedule.check_legal(schedule.compute(scop, deps, MappingOptions(fusion=fusion)), deps) is None


@pytest.mark.cpu
@pytest.mark.parametrize("fusion", [None, *FUSION])
def test_reversed_use_of_a_temporary_under_every_fusion(fusion: str | None):
    k = tc.define(REVERSED_USE)
    A = f32((33,))
    for opts in (MappingOptions(fusion=fusion), MappingOptions(fusion=fusion, tile=(4,), register_tile=(3,))):
        np.testing.assert_array_equal(k(A, backend="c", options=opts), A[::-1] * np.float32(2) + np.float32(1))


def test_isl_is_asked_each_question_once_per_process(monkeypatch: pytest.MonkeyPatch, fresh_schedules: None):
    """A def lowered again under options that keep its fusion strategy asks isl's scheduler nothing
    (its answers are remembered by the constraints and the strategy) and gets the same schedule;
    another strategy asks again; the memory keeps its newest answers only."""
    asked = []
    search = guard.run
    monkeypatch.setattr(guard, "run", lambda *a: asked.append(1) or search(*a))
    k = tc.define(MATMUL)
    A, B = f32((20, 30)), f32((30, 10), 1)
    first = str(k.lowered(A, B, options=MappingOptions(fusion="max", tile=(8, 8, 8))).tree)
    assert asked
    before = len(asked)
    for tile in ((4, 4, 4), (16, 2, 8)):
        opts = MappingOptions(fusion="max", tile=tile)
        assert str(k.lowered(A, B, options=opts).tree) == first and len(asked) == before
        assert_sum_close(k(A, B, backend="c", options=opts), np.matmul, A, B, terms=30)
    k.lowered(A, B, options=MappingOptions(fusion="min"))
    assert len(asked) > before
    monkeypatch.setattr(schedule, "MEMO_SCHEDULES", 2)
    k.lowered(A, B, options=MappingOptions(fusion="preserve"))
    assert 0 < len(schedule._memo) <= 2


@pytest.mark.parametrize("fusion", FUSION)
def test_check_legal_accepts_the_computed_and_the_program_order_schedules(fusion: str):
    scop, deps = _matmul_scop()
    assert schedule.check_legal(_hand_schedule(scop, "i2"), deps) is None
    sched = schedule.compute(scop, deps, MappingOptions(fusion=fusion))
    assert schedule.check_legal(sched, deps) is None
    # the computed schedule covers the whole domain
    assert sched.get_domain().is_equal(scop.domain)



def test_schedule_search_in_a_child_gives_the_same_tree(fresh_schedules: None):
    scop, deps = _matmul_scop()
    in_process = schedule._isl_schedule(scop.general, dependences(scop.general), MappingOptions(fusion="preserve"),
                                        100000)
    via_child = guard.run(lambda: in_process, scop.domain.get_ctx(), 10.0)
    assert via_child is not None and str(via_child) == str(in_process)
    assert guard.run(lambda: None, scop.domain.get_ctx(), 10.0) is None


def test_schedule_search_children_are_all_collected():
    """A child that answered is collected once it has left (at a later search), never left behind."""
    scop, _ = _matmul_scop()
    ctx = scop.domain.get_ctx()
    seen: set[int] = set()
    for _ in range(4):
        assert guard.run(lambda: None, ctx, 10.0) is None
        seen.update(guard._exiting)
    time.sleep(1.0)
    assert guard.run(lambda: None, ctx, 10.0) is None
    earlier = seen - set(guard._exiting[-1:])
    assert not earlier & set(guard._exiting)
    for pid in earlier:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


PADDED = """def convp(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H, w in 0:W
}"""


def _padded_conv(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    P = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(P, (3, 3), axis=(2, 3))
    return np.einsum("nchwkl,fckl->nfhw", win, W)


@pytest.mark.cpu
def test_constant_schedule_members_are_dropped_and_the_loops_stay():
    """Tile members that cover their whole range (a batch of 32 in tiles of 32) leave no schedule
    dimension behind: the kernel's C is the same, its loops renamed."""
    k = tc.define("def pool(float(N,C,H,W) I) -> (O) { O(n,c,h,w) max=! I(n,c,2*h + r_i,2*w + r_j) "
                  "where r_i in 0:2, r_j in 0:2 }")
    I = np.random.default_rng(0).standard_normal((32, 16, 12, 12), dtype=np.float32)
    low = k.lowered(I)
    kept = trim.run
    try:
        trim.run = lambda s: s
        untrimmed = k.lowered(I)
    finally:
        trim.run = kept
    dims = [low.final.get_map(), untrimmed.final.get_map()]
    assert all(schedule.respects(low.deps.validity, m) for m in dims)
    spaces: list[int] = []
    dims[0].foreach_map(lambda m: spaces.append(m.dim(isl.dim_type.out)))
    before: list[int] = []
    dims[1].foreach_map(lambda m: before.append(m.dim(isl.dim_type.out)))
    assert max(spaces) < max(before)
    def names(text: str) -> str:
        return re.sub(r"\bc\d+\b", "c", text)
    assert names(low.source.text) == names(untrimmed.source.text)
    np.testing.assert_array_equal(k(I), I.reshape(32, 16, 6, 2, 6, 2).max(axis=(3, 5)))


@pytest.mark.cpu
@pytest.mark.skipif(not runnable("avx2"), reason="the weights are packed for AVX2's register tiles")
def test_a_padded_convs_packed_panels_follow_the_loop_around_their_tile(monkeypatch: pytest.MonkeyPatch):
    """The pieces of a padded conv name their loops alike; the pack of the weights copies along the
    loop around its own tile (a loop of another piece, stepping by 1, overran the buffer). AVX2's
    tiles pack the weights (AVX-512's, in 54-lane rows of 4 filters, read them in place)."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    rng = np.random.default_rng(3)
    I = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
    W = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    k = tc.define(PADDED)
    assert "packed panels of W1" in k.source(I, W)
    assert_sum_close(k(I, W), _padded_conv, I, W, terms=64 * 9)


def test_searches_and_tools_wait_on_descriptors_past_1023():
    """The scheduler's child and the C compiler are waited on through descriptors that may be
    numbered past select()'s 1023 in a process holding many files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"the process may hold at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        scop, _ = _matmul_scop()
        assert guard.run(lambda: None, scop.domain.get_ctx(), 10.0) is None
        code, out, _ = toolchain.run_tool([sys.executable, "-c", "print(7)"], 60.0)
        assert (code, out.strip()) == (0, "7")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_schedule_search_past_its_limit_is_stopped():
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        guard.run(lambda: time.sleep(30), isl.DEFAULT_CONTEXT, 0.5)  # type: ignore[func-returns-value]
    assert time.perf_counter() - t0 < 5


STRIDED_CHAIN = ("def f(float(N) A, float(M) B, float(P) C) -> (S) {\n"
                 "  S +=! A(-2*i - 1) * B(k + 2*i - 2) * C(j + 2*k + 3)\n}")


@pytest.mark.cpu
def test_scheduler_past_the_timeout_falls_back_to_the_program_order(monkeypatch: pytest.MonkeyPatch, fresh_cache: Path,
                                                                     fresh_schedules: None):
    """A scheduler search that runs too long (simulated: the search first sleeps) is stopped; the
    kernel warns and still computes the right result."""
    slow_run = guard.run
    monkeypatch.setattr(schedule.guard, "run",
                        lambda search, ctx, limit: slow_run(lambda: (time.sleep(30), search())[1], ctx, limit))
    monkeypatch.setenv("TCDSL_SCHEDULE_TIMEOUT", "0.5")
    k = tc.define(MATMUL)
    A, B = f32((5, 7)), f32((7, 3), seed=1)
    with pytest.warns(tc.TcWarning, match="did not finish within 0.5 s on def 'matmul'"):
        got = k(A, B, backend="c")
    assert_sum_close(got, np.matmul, A, B, terms=7)


@pytest.mark.cpu
def test_reduction_over_mixed_strides_compiles_within_the_limit(monkeypatch: pytest.MonkeyPatch, fresh_schedules: None):
    """isl's scheduler once searched for minutes on this def (max fusion, range bounds that divide
    sizes): it now stops at the limit and the kernel still computes the right result."""
    monkeypatch.setenv("TCDSL_SCHEDULE_TIMEOUT", "2")
    k = tc.define(STRIDED_CHAIN)
    A, B, C = f32((6,)), f32((5,), seed=1), f32((3,), seed=2)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TcWarning)
        got = k(A, B, C, backend="c")
    assert time.perf_counter() - t0 < 15
    terms = len(A) * len(B) * len(C)  # at most one term per point of the (i, k, j) box
    assert_close(got, k(A, B, C, backend="numpy"), terms=terms,
                 scale=float(np.abs(A).max() * np.abs(B).max() * np.abs(C).max()))

# ---- 4. caches -------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_ten_calls_compile_once_and_new_strides_compile_again(fresh_cache: Path):
    k = tc.define(MATMUL)
    A, B = f32((13, 7)), f32((7, 5), 1)
    before = toolchain.BUILDS
    for _ in range(10):
        assert_sum_close(k(A, B, backend="c"), np.matmul, A, B, terms=7)
    assert k.compile_count == 1
    assert toolchain.BUILDS - before <= 1
    assert len(list((fresh_cache / "c").glob("tc_matmul-*.so"))) == 1
    # the same shapes as a transposed view: other strides, another compile, right numbers
    At = np.ascontiguousarray(A.T).T
    assert At.shape == A.shape and At.strides != A.strides
    assert_sum_close(k(At, B, backend="c"), np.matmul, A, B, terms=7)
    assert k.compile_count == 2
    for _ in range(3):
        k(A, B, backend="c")
        k(At, B, backend="c")
    assert k.compile_count == 2


@pytest.mark.cpu
@pytest.mark.parametrize("view", ["reversed", "step2", "broadcast", "transposed_B", "fortran"])
def test_strided_input_views(view: str):
    k = tc.define(MATMUL)
    base = f32((26, 14))
    B = f32((7, 5), 1)
    if view == "reversed":
        A = base[::-1, ::-1][:13, :7]
    elif view == "step2":
        A = base[::2, ::2]
    elif view == "broadcast":
        A = np.broadcast_to(base[0, :7], (13, 7))
    elif view == "transposed_B":
        A = base[:13, :7]
        B = np.ascontiguousarray(B.T).T
    else:
        A = np.asfortranarray(base[:13, :7])
    assert A.shape == (13, 7)
    assert_sum_close(k(A, B, backend="c"), np.matmul, A, B, terms=7)
    assert_sum_close(k(A, B, backend="numpy"), np.matmul, A, B, terms=7)


@pytest.mark.cpu
def test_new_dtype_of_a_short_form_kernel_compiles_again(fresh_cache: Path):
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)", backend="c")
    def mm(A, B):
        """matrix product"""

    A32, B32 = f32((5, 3)), f32((3, 4), 1)
    before = toolchain.BUILDS
    C32 = mm(A32, B32)
    assert C32.dtype == np.float32
    assert_sum_close(C32, np.matmul, A32, B32, terms=3)
    assert toolchain.BUILDS - before == 1
    A64, B64 = A32.astype(np.float64) / 3, B32.astype(np.float64) / 7
    C64 = mm(A64, B64)
    assert C64.dtype == np.float64
    assert_sum_close(C64, np.matmul, A64, B64, terms=3)  # float64's eps
    assert toolchain.BUILDS - before == 2
    k32, k64 = mm.kernel(A32, B32), mm.kernel(A64, B64)
    assert k32 is not k64
    assert (k32.compile_count, k64.compile_count) == (1, 1)
    assert len(list((fresh_cache / "c").glob("*.so"))) == 2


@pytest.mark.cpu
def test_fresh_kernel_hits_the_disk_cache_and_force_recompile_builds(fresh_cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    A, B = f32((6, 4)), f32((4, 3), 1)
    k1 = tc.define(MATMUL)
    before = toolchain.BUILDS
    assert_sum_close(k1(A, B, backend="c"), np.matmul, A, B, terms=4)
    assert toolchain.BUILDS - before == 1
    k2 = tc.define(MATMUL)  # a new Kernel object, same def, same cache dir: an on-disk hit
    assert_sum_close(k2(A, B, backend="c"), np.matmul, A, B, terms=4)
    assert k2.compile_count == 1  # an in-memory miss...
    assert toolchain.BUILDS - before == 1  # ...that does not run the compiler
    assert k1.compiled(A, B).path == k2.compiled(A, B).path
    monkeypatch.setenv("TCDSL_FORCE_RECOMPILE", "1")
    k3 = tc.define(MATMUL)
    assert_sum_close(k3(A, B, backend="c"), np.matmul, A, B, terms=4)
    assert toolchain.BUILDS - before == 2
    so = list((fresh_cache / "c").glob("tc_matmul-*.so"))
    assert len(so) == 1
    assert not [p.name for p in (fresh_cache / "c").iterdir() if p.name.startswith(".")]


@pytest.mark.cpu
def test_other_options_compile_again_same_options_do_not():
    k = tc.define(MATMUL)
    A, B = f32((9, 7)), f32((7, 11), 1)
    o1 = MappingOptions(tile=(4, 4, 4))
    o2 = MappingOptions(tile=(4, 4, 4), openmp=False)
    for _ in range(3):
        for o in (o1, o2, MappingOptions(tile=(4, 4, 4))):
            assert_sum_close(k(A, B, backend="c", options=o), np.matmul, A, B, terms=7)
    assert k.compile_count == 2


# ---- 5. two processes, one cache -------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import numpy as np
    import tcdsl as tc
    sync = Path(sys.argv[1])
    k = tc.define("def twoproc(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) + 1.0 }")
    A = np.arange(35, dtype=np.float32).reshape(5, 7) / 10
    B = np.arange(21, dtype=np.float32).reshape(7, 3) / 10
    (sync / ("ready" + sys.argv[2])).touch()
    deadline = time.time() + 60
    while not (sync / "go").exists() and time.time() < deadline:
        time.sleep(0.005)
    C = k(A, B, backend="c")
    want = A.astype(np.float64) @ B + 7
    # 7 terms A*B + 1, all >= 0: the sum of |terms| is want itself, so 4 eps per term is relative
    np.testing.assert_allclose(C, want, rtol=4 * 7 * float(np.finfo(np.float32).eps), atol=0)
    print("OK", k.compile_count, k.compiled(A, B).path)
""")


@pytest.mark.cpu
def test_two_processes_compile_the_same_kernel_at_once(tmp_path: Path):
    cache = tmp_path / "shared-cache"
    sync = tmp_path / "sync"
    sync.mkdir()
    env = dict(os.environ, TCDSL_CACHE_DIR=str(cache))
    env.pop("TCDSL_FORCE_RECOMPILE", None)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(sync), str(i)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        deadline = time.time() + 60
        while not all((sync / f"ready{i}").exists() for i in range(2)) and time.time() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        (sync / "go").touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("OK 1 "), out + err
    paths = {out.split()[2] for out, _ in outs}
    assert len(paths) == 1  # both loaded the same library
    files = sorted(p.name for p in (cache / "c").iterdir())
    so = [f for f in files if f.endswith(".so")]
    assert len(so) == 1 and so[0].startswith("tc_twoproc-"), files
    assert Path(paths.pop()).name == so[0]
    assert not [f for f in files if f.startswith(".")], files  # no temp files left behind


# ---- 6. compile errors -----------------------------------------------------------------------------


@pytest.mark.cpu
def test_compiler_failure_raises_with_stderr_and_kept_source(tmp_path: Path, fresh_cache: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    cc = tmp_path / "bad-cc"
    cc.write_text("#!/bin/sh\n"
                  'if [ "$1" = "--version" ]; then echo "badcc 0.1"; exit 0; fi\n'
                  'echo "badcc: fatal error: the frobnicator is jammed (42)" >&2\n'
                  "exit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("CC", str(cc))
    toolchain.compiler_version.cache_clear()
    try:
        k = tc.define(MATMUL)
        with pytest.raises(TcCompileError) as ei:
            k(f32((3, 2)), f32((2, 4)), backend="c")
    finally:
        toolchain.compiler_version.cache_clear()
    e = ei.value
    assert isinstance(e, tc.TcError)
    assert "the frobnicator is jammed (42)" in e.message
    kept = [Path(p) for p in re.findall(r"(/\S+?\.c)\b", e.message)]
    assert kept, e.message
    src = kept[0]
    assert src.exists() and src.parent == fresh_cache / "c"
    assert "tc_kernel" in src.read_text()
    assert k.compile_count == 0
    names = [p.name for p in (fresh_cache / "c").iterdir()]
    assert not [n for n in names if n.endswith(".so") or n.startswith(".")], names
    # with the real compiler back, the same kernel object compiles and runs
    if ORIGINAL_CC is None:
        monkeypatch.delenv("CC")
    else:
        monkeypatch.setenv("CC", ORIGINAL_CC)
    A, B = f32((3, 2)), f32((2, 4), 1)
    assert_sum_close(k(A, B, backend="c"), np.matmul, A, B, terms=2)
    assert k.compile_count == 1


@pytest.mark.cpu
def test_missing_compiler_raises_compile_error(tmp_path: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch):
    missing = tmp_path / "no-such-cc"
    monkeypatch.setenv("CC", str(missing))
    toolchain.compiler_version.cache_clear()
    try:
        k = tc.define(MATMUL)
        with pytest.raises(TcCompileError) as ei:
            k(f32((3, 2)), f32((2, 4)), backend="c")
    finally:
        toolchain.compiler_version.cache_clear()
    assert str(missing) in ei.value.message
    assert "cannot be run" in ei.value.message


# ---- 7. C keywords as TC names -----------------------------------------------------------------------

KEYWORD_DEF = """def main(float(int, long) for, float(long, char) static, float(char) restrict) -> (return, void) {
    return(if, while) +=! for(if, do) * static(do, while)
    void(if) = return(if, 0) + restrict(char - 1) * if
}"""

# The same def with every name spelled plainly: its C text must be the same outside comments.
PLAIN_DEF = """def kw(float(I, L) A, float(L, C) S, float(C) R) -> (O, V) {
    O(i, j) +=! A(i, k) * S(k, j)
    V(i) = O(i, 0) + R(C - 1) * i
}"""

# Names the emitter itself generates (tensors t0.., loop iterators c0.., statement indices x0.., the
# accumulator, the error array, helper macros): a TC def using them must still mean what it says.
GENERATED_NAMES_DEF = """def tc_kernel(float(c0, x0) t1, float(x0, acc) t0, float(acc) floord) -> (tc_err, t2) {
    tc_err(c1, c2) +=! t1(c1, x1) * t0(x1, c2)
    t2(c1) = tc_err(c1, 0) + floord(acc - 1) * c1
}"""

KEYWORDS = ("for", "static", "main", "int", "restrict", "return", "void", "long", "char", "if", "while", "do")


def _check_keyword_outputs(O: np.ndarray, V: np.ndarray, A: np.ndarray, B: np.ndarray, R: np.ndarray) -> None:
    """O = A @ B (5 terms) and V(i) = O(i, 0) + R(2) * i (6 terms), within their rounding."""
    assert_sum_close(O, np.matmul, A, B, terms=5)
    assert_sum_close(V, lambda A, B, R: (A @ B)[:, 0] + R[2] * np.arange(7), A, B, R, terms=6)


@pytest.mark.cpu
def test_c_keywords_are_tc_names_and_never_reach_c():
    k = tc.define(KEYWORD_DEF)
    A, B, R = f32((7, 5)), f32((5, 3), 1), f32((3,), 2)
    O, V = k(A, B, R, backend="c")
    _check_keyword_outputs(O, V, A, B, R)
    _check_keyword_outputs(*k(A, B, R, backend="numpy"), A, B, R)

    text = k.compiled(A, B, R).low.source.text
    plain = tc.define(PLAIN_DEF).compiled(A, B, R).low.source.text
    # C's own keywords (int, long, for, return, restrict, ...) appear in any kernel; the TC names must
    # add nothing: the code outside comments is exactly that of the plainly named def
    assert c_code(text) == c_code(plain)
    code = c_code(text)
    for word in KEYWORDS:
        n_kw = len(re.findall(rf"\b{word}\b", code))
        n_plain = len(re.findall(rf"\b{word}\b", c_code(plain)))
        assert n_kw == n_plain, word
    for word in ("main", "char", "while", "do"):  # words the emitter never writes itself
        assert not re.search(rf"\b{word}\b", code), word
    assert "return(if, while)" in text  # the TC statement is only in its comment


@pytest.mark.cpu
def test_tc_names_equal_to_generated_c_names():
    k = tc.define(GENERATED_NAMES_DEF)
    A, B, R = f32((7, 5)), f32((5, 3), 1), f32((3,), 2)
    O, V = k(A, B, R, backend="c")
    _check_keyword_outputs(O, V, A, B, R)
    plain = tc.define(PLAIN_DEF).compiled(A, B, R).low.source.text
    assert c_code(k.compiled(A, B, R).low.source.text) == c_code(plain)


# ---- 8. run-time checks in C -------------------------------------------------------------------------

GATHER = ("def g(float(V, D) Tab, int32(B) Idx) -> (O, P) {\n"
          "    P(b) = 1.0 where exists Idx(b)\n"
          "    O(b, d) = Tab(Idx(b), d) * 2.0\n"
          "}")


def _both_raise(k: Any, args: list[Any], **kw: Any) -> tuple[TcRuntimeError, TcRuntimeError]:
    with pytest.raises(TcRuntimeError) as c_err:
        k(*args, backend="c", **kw)
    with pytest.raises(TcRuntimeError) as np_err:
        k(*args, backend="numpy", **kw)
    return c_err.value, np_err.value


@pytest.mark.cpu
@pytest.mark.parametrize("bad", [4, 10, -1, -(2**31)])
def test_out_of_range_gather_raises_like_the_interpreter(bad: int):
    k = tc.define(GATHER, filename="model.tc")
    Tab = np.ones((4, 2), np.float32)
    Idx = np.array([0, 3, bad, 1, 2], np.int32)
    O_buf = np.full((5, 2), 7.0, np.float32)
    P_buf = np.full((5,), -3.0, np.float32)
    e, ref = _both_raise(k, [Tab, Idx], out=(O_buf, P_buf))
    assert "'Tab'" in e.message and "statement 2" in e.message
    assert f"read at {bad}," in e.message and "outside 0:4" in e.message
    assert e.message == ref.message
    assert str(e) == str(ref)
    assert (e.location.file, e.location.line, e.location.col) == ("model.tc", 3, 15)
    # out= buffers are untouched by the failed call
    np.testing.assert_array_equal(O_buf, np.full((5, 2), 7.0, np.float32))
    np.testing.assert_array_equal(P_buf, np.full((5,), -3.0, np.float32))
    # and the kernel still works afterwards
    good = np.array([0, 3, 2, 1, 2], np.int32)
    k(np.arange(8, dtype=np.float32).reshape(4, 2), good, backend="c", out=(O_buf, P_buf))
    np.testing.assert_array_equal(O_buf, np.arange(8, dtype=np.float32).reshape(4, 2)[good] * 2)
    np.testing.assert_array_equal(P_buf, np.ones(5, np.float32))


@pytest.mark.cpu
def test_out_of_range_gather_in_reduction_and_nested_gather():
    bag = tc.define(CASES["embedding_bag"].source)
    Idx = np.zeros((3, 5), np.int64)
    Idx[2, 4] = 10
    e, ref = _both_raise(bag, [np.ones((10, 4), np.float32), Idx])
    assert "'Tab'" in e.message and "read at 10," in e.message and str(e) == str(ref)
    gg = tc.define(CASES["gather_of_gather"].source)
    A = np.arange(9, dtype=np.float32)
    e, ref = _both_raise(gg, [A, np.zeros(6, np.int32), np.array([0, 1, 6, 2], np.int32)])
    assert "'Pm'" in e.message and "read at 6," in e.message and str(e) == str(ref)
    assert (e.location.line, e.location.col) == (1, 64)
    e, ref = _both_raise(gg, [A, np.array([0, 9, 0, 0, 0, 0], np.int32), np.array([0, 1, 2, 3], np.int32)])
    assert "'A'" in e.message and "read at 9," in e.message and str(e) == str(ref)
    assert (e.location.line, e.location.col) == (1, 62)


@pytest.mark.cpu
@pytest.mark.parametrize("op,word", [("/", "division"), ("%", "modulo")])
def test_integer_division_by_zero_raises_in_c(op: str, word: str):
    k = tc.define("def q(int32(N) A, int32(N) B) -> (Q) {\n"
                  f"    Q(i) = 1 + A(i) {op} B(i)\n"
                  "}")
    out = np.full(3, 99, np.int32)
    e, ref = _both_raise(k, [np.arange(3, dtype=np.int32), np.array([1, 0, 2], np.int32)], out=out)
    assert f"integer {word} by zero" in e.message and "statement 1" in e.message
    assert str(e) == str(ref)
    assert (e.location.file, e.location.line, e.location.col) == ("<string>", 2, 16)
    np.testing.assert_array_equal(out, np.full(3, 99, np.int32))


@pytest.mark.cpu
def test_integer_division_by_zero_in_reduction_raises_in_c():
    k = tc.define("def q(int32(N, K) A, int32(K) B) -> (S) { S(i) +=! A(i, k) / B(k) }")
    e, ref = _both_raise(k, [np.ones((2, 3), np.int32), np.array([1, 2, 0], np.int32)])
    assert "integer division by zero" in e.message and str(e) == str(ref)


@pytest.mark.cpu
def test_gather_and_division_on_a_branch_not_taken_do_not_raise():
    k = tc.define("def g(float(V) Tab, int32(B) Idx, int32(B) D) -> (O, L, R, Q) {\n"
                  "    O(b) = Idx(b) >= 0 && Idx(b) < V ? Tab(Idx(b)) : -1.0\n"
                  "    L(b) = Idx(b) >= 0 && Idx(b) < V && Tab(Idx(b)) > 1.5 ? 1 : 0\n"
                  "    R(b) = Idx(b) < 0 || Idx(b) >= V ? 0.0 : e * e where e = Tab(Idx(b))\n"
                  "    Q(b) = D(b) != 0 ? Idx(b) / D(b) + Idx(b) % D(b) : 0\n"
                  "}")
    Tab = np.array([1.0, 2.0, 3.0], np.float32)
    Idx = np.array([0, -1, 2, 3, 1, -5, 7], np.int32)
    D = np.array([2, 0, -3, 0, 1, 4, 0], np.int32)
    O, L, R, Q = k(Tab, Idx, D, backend="c")
    ok = (Idx >= 0) & (Idx < 3)
    safe = np.clip(Idx, 0, 2)
    np.testing.assert_array_equal(O, np.where(ok, Tab[safe], np.float32(-1)))
    np.testing.assert_array_equal(L, np.array([0, 0, 1, 0, 1, 0, 0], np.int32))
    np.testing.assert_array_equal(R, np.where(ok, Tab[safe] ** 2, np.float32(0)))
    Ds = np.where(D == 0, 1, D)
    np.testing.assert_array_equal(Q, np.where(D != 0, Idx // Ds + Idx % Ds, 0).astype(np.int32))
    for got, want in zip((O, L, R, Q), k(Tab, Idx, D, backend="numpy")):
        np.testing.assert_array_equal(got, want)


@pytest.mark.cpu
def test_gather_on_the_taken_branch_still_raises_in_c():
    k = tc.define("def g(float(V) Tab, int32(B) Idx) -> (O) {\n"
                  "    O(b) = Idx(b) >= 0 ? -1.0 : Tab(Idx(b))\n"
                  "}")
    e, ref = _both_raise(k, [np.ones(3, np.float32), np.array([0, -2, 1], np.int32)])
    assert "'Tab'" in e.message and "read at -2," in e.message and str(e) == str(ref)
    assert (e.location.line, e.location.col) == (2, 33)


INT64_MIN_DIV = textwrap.dedent("""
    import numpy as np
    import tcdsl as tc
    for op in ("/", "%"):
        k = tc.define("def q(int64(N) A, int64(N) B) -> (Q) { Q(i) = A(i) " + op + " B(i) }")
        A = np.array([np.iinfo(np.int64).min, 7, -7], np.int64)
        B = np.array([-1, 2, -1], np.int64)
        print(op, k(A, B, backend="c").tolist())
""")


@pytest.mark.cpu
def test_int64_min_divided_by_minus_one_does_not_crash(tmp_path: Path):
    """LONG_MIN / -1 traps on x86; the kernel must give the wrapped floor results (as numpy), not
    kill the process. Run in a child so that a crash fails this test only."""
    env = dict(os.environ, TCDSL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-c", INT64_MIN_DIV], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"rc {p.returncode}: {p.stderr[-2000:]}"
    lo = np.iinfo(np.int64).min
    assert p.stdout.splitlines() == [f"/ {[lo, 3, 7]}", f"% {[0, 1, 0]}"]


# ---- 9. parallelism ------------------------------------------------------------------------------


def _body_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("int tc_kernel("))
    return [line.strip() for line in lines[start + 1:] if line.strip()]


@pytest.mark.cpu
def test_matmul_outer_loop_is_omp_parallel_and_inner_loop_simd():
    k = tc.define(MATMUL)
    A, B = f32((330, 13)), f32((13, 170), 1)  # work enough for the threads (astgen.SERIAL_BELOW)
    ck = k.compiled(A, B)
    body = _body_lines(ck.low.source.text)
    first_for = next(i for i, line in enumerate(body) if line.startswith("for ("))
    assert first_for > 2 and body[first_for - 1].startswith("#pragma omp for"), body[:first_for + 1]
    assert body[first_for - 4:first_for - 1] == ["#pragma omp parallel", "{", "tc_spread(tc_mc);"], body[:first_for]
    assert "#pragma omp simd" in body
    loops = [n for n in walk(ck.low.ir.body) if isinstance(n, LFor)]
    assert loops[0].omp and loops[0].parallel
    assert any(n.simd for n in loops)
    elided = "init of statement" not in ck.low.source.text  # the register tiles start at 0 (see below)
    kept = tuple(n for n in ck.low.ir.body
                 if not (elided and all(c.stmt.startswith("init") for c in walk((n,)) if isinstance(c, LCall))))
    assert sum(line.startswith("#pragma omp parallel") for line in body) == \
        sum(n.omp for n in walk(kept) if isinstance(n, LFor))
    assert not nested_omp(ck.low.ir.body)
    assert_sum_close(k(A, B, backend="c"), np.matmul, A, B, terms=13)


MAXPOOL = """def maxpool(float(N, C, H, W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + r_kh, 2 * w + r_kw) where r_kh in 0:2, r_kw in 0:2
}"""


@pytest.mark.cpu
def test_register_tiles_over_whole_reductions_start_at_the_identity():
    """maxpool: each register tile runs the whole 2x2 window, so it starts at -inf and the
    separate initialisation nest of O goes (one pass over O less); NaNs still propagate."""
    k = tc.define(MAXPOOL)
    I = f32((2, 3, 10, 12))
    I[0, 1, 4, 5] = np.nan
    src = k.source(I)
    assert "init of statement 1" not in src and "= (-INFINITY);" in src
    # the window's stride-2 column loop runs inside the vectorised loop (GCC deinterleaves vectors)
    inside = r"#pragma omp simd\n\s*for \(long (c\d+) = 0; \1 <= 5; \1 \+= 1\) \{\n\s*#pragma GCC unroll 2\n"
    assert re.search(inside, src), src
    want = k(I, backend="numpy")
    np.testing.assert_array_equal(k(I, backend="c"), want)
    out = np.full((2, 3, 5, 6), 7.0, np.float32)
    k(I, out=out)
    np.testing.assert_array_equal(out, want)
    # partial windows (padding by domain): the tiles do not run whole reductions; the init stays
    pad = tc.define("def p(float(N) A) -> (O) { O(i) max=! A(i + r - 1) where i in 0:N, r in 0:3 }")
    A = f32((37,))
    assert "init of statement 1" in pad.source(A)
    np.testing.assert_array_equal(pad(A), pad(A, backend="numpy"))


FC_EPILOGUE = """def fc(float(B,M) I, float(M,N) W1, float(N) B1) -> (O) {
    O(b,n) +=! I(b,r_m) * W1(r_m,n)
    O(b,n) = fmax(O(b,n) + B1(n), 0.0)
}"""


def _fc(I: np.ndarray, W: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """relu(I @ W + bias): relu changes no sum by more than its rounding, so the sum's bound holds."""
    return np.maximum(I @ W + bias, 0)


@pytest.mark.cpu
def test_contraction_with_an_epilogue_keeps_its_register_tile():
    """By default the bias + relu does not enter the contraction's loops: fused there, it forced
    the reduction innermost (a dot product down each column of W1)."""
    k = tc.define(FC_EPILOGUE)
    I, W, b = f32((64, 96)), f32((96, 128), 1), f32((128,), 2)
    src = k.source(I, W, b)
    assert "register tile of O" in src, src
    assert_sum_close(k(I, W, b, backend="c"), _fc, I, W, b, terms=97)


@pytest.mark.cpu
def test_openmp_off_emits_no_parallel_region():
    k = tc.define(MATMUL)
    A, B = f32((33, 13)), f32((13, 7), 1)
    opts = MappingOptions(openmp=False)
    text = k.compiled(A, B, options=opts).low.source.text
    assert "omp parallel" not in text
    assert "#pragma omp simd" in text  # vectorisation is a separate knob
    no_simd = k.compiled(A, B, options=MappingOptions(openmp=False, vectorize=False)).low.source.text
    assert "#pragma omp" not in no_simd
    assert_sum_close(k(A, B, backend="c", options=opts), np.matmul, A, B, terms=13)


@pytest.mark.cpu
@pytest.mark.parametrize("n", [100, 10007])
def test_full_reduction_into_rank0_is_not_parallel(n: int):
    k = tc.define("def total(float(N) A) -> (S) { S +=! A(r_i) }")
    A = rng(5).uniform(0, 1, n).astype(np.float32)
    ck = k.compiled(A)
    assert "omp parallel" not in ck.low.source.text
    loops = [x for x in walk(ck.low.ir.body) if isinstance(x, LFor)]
    assert loops and not any(x.omp or x.parallel or x.simd for x in loops)
    S = k(A, backend="c")
    assert S.shape == () and S.dtype == np.float32
    assert_sum_close(S, np.sum, A, terms=n)


@pytest.mark.cpu
def test_row_reduction_parallel_over_rows_only():
    k = tc.define("def rows(float(M, N) A) -> (S) { S(i) +=! A(i, r_j) }")
    A = f32((1100, 33))
    ck = k.compiled(A)
    loops = [x for x in walk(ck.low.ir.body) if isinstance(x, LFor)]
    assert any(x.omp for x in loops)
    assert not nested_omp(ck.low.ir.body)
    # omp loops carry no dependence; every loop that carries one is neither parallel nor omp nor simd
    assert all(not x.note for x in loops if x.omp)
    assert all(not (x.parallel or x.omp or x.simd) for x in loops if x.note)
    assert any(x.note for x in loops)  # the reduction loop over j
    assert_sum_close(k(A, backend="c"), lambda A: A.sum(1), A, terms=33)


# ---- blocked transposes ------------------------------------------------------------------------------

TRANSPOSE = "def tr(float(M,N) A) -> (O) { O(j,i) = A(i,j) }"
PERMUTE = "def nhwc(int32(N,C,H,W) I) -> (O) { O(n,h,w,c) = I(n,c,h,w) }"


@pytest.mark.cpu
@pytest.mark.parametrize("shape", [(512, 768), (520, 264), (37, 50), (8, 8), (1000, 8), (3, 70), (9, 17)])
@pytest.mark.parametrize("tile", [None, (64, 64), (16, 8)])
def test_transpose_in_blocks_matches_numpy(shape: tuple[int, int], tile: tuple[int, int] | None):
    k = tc.define(TRANSPOSE)
    A = f32(shape)
    opts = MappingOptions(tile=tile)
    np.testing.assert_array_equal(k(A, backend="c", options=opts), A.T)
    np.testing.assert_array_equal(k(A[:, ::-1], backend="c", options=opts), A[:, ::-1].T)  # a strided view
    src = k.source(A, options=opts)
    if shape in ((512, 768), (520, 264), (1000, 8)) or tile == (16, 8):  # tiled: blocks, with leftovers
        assert "tc_transpose_rect(&" in src, src


@pytest.mark.cpu
@pytest.mark.parametrize("shape", [(2048, 2053), (2053, 2048)])
def test_large_transpose_streams_into_any_alignment(shape: tuple[int, int]):
    """Targets of 16 MiB and more are written around the caches in whole 64-byte lines: the first
    line boundary of each row depends on where the output starts, so outputs that start at every
    offset within a line must all come out right (partial lines at both ends of each row)."""
    k = tc.define(TRANSPOSE)
    A = f32(shape)
    src = k.source(A)
    streams = shape[0] % 16 == 0  # the target's rows, shape[0] long, share one alignment
    assert re.search(r"tc_transpose_rect\(&.*, 1\);", src) if streams else "tc_transpose_rect(&" in src
    n = A.size
    buf = np.empty(n + 16, np.float32)
    for offset in (0, 1, 4, 7, 8, 13, 15):
        buf[:] = np.nan
        out = buf[offset:offset + n].reshape(shape[1], shape[0])
        k(A, out=out)
        np.testing.assert_array_equal(out, A.T)
        assert np.isnan(buf[:offset]).all() and np.isnan(buf[offset + n:]).all()  # nothing outside out


@pytest.mark.cpu
def test_layout_permutation_in_blocks_matches_numpy():
    k = tc.define(PERMUTE)
    I = rng(0).integers(-2**31, 2**31 - 1, (2, 24, 5, 16), dtype=np.int32)
    got = k(I, backend="c")
    np.testing.assert_array_equal(got, I.transpose(0, 2, 3, 1))
    assert "tc_transpose_rect(&" in k.source(I)


# ---- vector exp ----------------------------------------------------------------------------------------

@pytest.mark.cpu
def test_float32_exp_within_three_ulp_and_special_values():
    """float32 exp (tcdsl's AVX-512 version in `omp simd` loops, measured at 1.01 ulp; glibc's vector
    expf elsewhere, measured at 2.55 ulp): within 3 ulp of the correctly rounded result over the
    whole range, subnormal results included; inf, -inf, nan, overflow and underflow exact."""
    k = tc.define("def e(float(N) A) -> (O) { O(i) = exp(A(i)) }")
    x = np.concatenate([np.linspace(-110, 90, 2_000_003, dtype=np.float32),
                        rng(0).uniform(-1, 1, 100_000).astype(np.float32),
                        np.float32([0.0, -0.0, 88.72283, 88.72284, -103.97208, -87.33655, 1e-30, -1e-30])])
    got = k(x, backend="c")
    want64 = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        want = want64.astype(np.float32)
    finite = np.isfinite(want) & (want > 0)
    ulp = np.spacing(want[finite]).astype(np.float64)
    err = np.abs(got[finite].astype(np.float64) - want64[finite]) / ulp
    assert err.max() <= 3.0, (err.max(), x[finite][err.argmax()])
    np.testing.assert_array_equal(got[~finite], want[~finite])  # overflow to inf, underflow to 0
    special = np.float32([np.inf, -np.inf, np.nan, 100.0, -200.0])
    out = k(special, backend="c")
    assert out[0] == np.inf and out[1] == 0.0 and np.isnan(out[2]) and out[3] == np.inf and out[4] == 0.0


def test_schedule_search_runs_here_when_fork_fails(monkeypatch: pytest.MonkeyPatch, fresh_schedules: None):
    def no_fork() -> int:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(guard.os, "fork", no_fork)
    scop, deps = _matmul_scop()
    sched = schedule.compute(scop, deps, MappingOptions())
    assert schedule.check_legal(sched, deps) is None and sched.get_domain().is_equal(scop.domain)
    assert guard.run(lambda: None, scop.domain.get_ctx(), 10.0) is None


@pytest.mark.cpu
@pytest.mark.parametrize("b, m, n", [(128, 96, 1024), (100, 33, 1000), (7, 5, 300)])
def test_few_parallel_tiles_share_threads_with_the_next_loop(b: int, m: int, n: int):
    """An `omp parallel for` over a handful of row tiles (128 rows in 48-row tiles: three for two
    threads) collapses with the column-tile loop inside it; tile edges stay exact."""
    k = tc.define(FC_EPILOGUE)
    I, W, bias = f32((b, m)), f32((m, n), 1), f32((n,), 2)
    if b == 128:
        assert "collapse(2)" in k.source(I, W, bias)
    assert_sum_close(k(I, W, bias, backend="c"), _fc, I, W, bias, terms=m + 1)


@pytest.mark.cpu
@pytest.mark.parametrize("threads", [1, 3, 64])
def test_parallel_loops_hand_out_chunks_for_any_thread_count(threads: int):
    """Parallel loops with a known iteration count are scheduled in chunks of about an eighth (or,
    over register tiles, a 32nd) of a thread's share (at least one iteration), so any number of
    threads computes every tile once."""
    gomp = ctypes.CDLL("libgomp.so.1")
    before = gomp.omp_get_max_threads()
    k = tc.define(FC_EPILOGUE)
    I, W, bias = f32((100, 33)), f32((33, 1000), 1), f32((1000,), 2)
    src = k.source(I, W, bias)
    assert re.search(r"#pragma omp for schedule\(dynamic, tc_chunk\(\d+L, (8|32)\)\)", src), src
    try:
        gomp.omp_set_num_threads(threads)
        got = k(I, W, bias, backend="c")
    finally:
        gomp.omp_set_num_threads(before)
    assert_sum_close(got, _fc, I, W, bias, terms=34)


SPREAD_CHILD = """
import json, os, sys
import numpy as np
import tcdsl as tc

def masks():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[int(t)] = sorted(os.sched_getaffinity(int(t)))
        except OSError:  # a thread that ended meanwhile
            pass
    return out

k = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
A = np.random.default_rng(0).standard_normal((200, 150)).astype(np.float32)
B = np.random.default_rng(1).standard_normal((150, 190)).astype(np.float32)
me, cores = os.getpid(), sorted(os.sched_getaffinity(0))
outs = [k(A, B)]  # the team of threads exists from here on
before = masks()
for pinned in (False, True):
    for _ in range(5):
        for t in before:  # every thread onto the first core; the team's threads free to leave it or not
            os.sched_setaffinity(t, {cores[0]})
        for t in before:
            if t != me and not pinned:
                os.sched_setaffinity(t, cores)
        outs.append(k(A, B))
        os.sched_setaffinity(me, cores)
        if not pinned:
            after = masks()
    for t in before:
        os.sched_setaffinity(t, cores)
np.save(sys.argv[1], np.stack(outs))
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.cpu
@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="Linux with two cores or more")
def test_threads_woken_on_the_callers_core_compute_the_same_and_keep_their_affinity(tmp_path: Path):
    """Every parallel region starts with ``tc_spread``: a thread of the team that finds itself on the
    core of the thread that started the region moves off it, and gets its affinity back as it was.
    With every thread put on one core before each call (free to leave it, then pinned to it), the
    results are numpy's, and no thread's affinity has changed."""
    k = tc.define(MATMUL)
    A, B = f32((200, 150)), f32((150, 190), 1)
    src = k.source(A, B)
    assert src.count("tc_spread(tc_mc);") == src.count("#pragma omp parallel\n") >= 1, src
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    p = subprocess.run([sys.executable, "-c", SPREAD_CHILD, str(tmp_path / "outs.npy")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["after"] == {t: m for t, m in got["before"].items() if t in got["after"]}, got
    A, B = np.random.default_rng(0).standard_normal((200, 150)).astype(np.float32), \
        np.random.default_rng(1).standard_normal((150, 190)).astype(np.float32)
    outs = np.load(tmp_path / "outs.npy")
    assert outs.shape == (11, 200, 190)
    for o in outs:
        assert_sum_close(o, np.matmul, A, B, terms=150)
    assert (outs == outs[0]).all()  # the same sums, whichever thread ran which tiles


# ---- operand layout (tcdsl.layout) ------------------------------------------------------------------

FC_TORCH_LAYOUT = """def fc(float(B,M) I, float(N,M) W1, float(N) B1) -> (O) {
    O(b,n) +=! I(b,r_m) * W1(n,r_m)
    O(b,n) = fmax(O(b,n) + B1(n), 0.0)
}"""


@pytest.mark.cpu
@pytest.mark.parametrize("b, m, n", [(128, 96, 256), (13, 7, 11), (1, 33, 5), (50, 1, 9)])
def test_contraction_against_a_transposed_operand_is_laid_out_and_exact(b: int, m: int, n: int):
    """``O(b, n) +=! I(b, r) * W(n, r)`` compiles as a transpose of W and a register-tiled product, or
    (where I and O are smaller than W) of I, the product and a transpose back, where it has
    LAYOUT_MIN_WORK products or more (or layout=True says so); the results match numpy for any sizes."""
    from tcdsl.kernel import LAYOUT_MIN_WORK

    k = tc.define(FC_TORCH_LAYOUT)
    I, W, bias = f32((b, m)), f32((n, m), 1), f32((n,), 2)
    big = b * m * n >= LAYOUT_MIN_WORK
    names = {"W1_t"} if n * m < b * m + b * n else {"I_t", "O_t"}  # the form moving fewer elements
    assert (set(k.lowered(I, W, bias).scop.inst.checked.tensors) >= names) == big
    assert_sum_close(k(I, W, bias, backend="c"), lambda I, W, b: _fc(I, W.T, b), I, W, bias, terms=m + 1)
    # explicit tiles are meant for the def as written: no rewrite then, unless layout=True says that
    # they are the laid-out def's; layout=False keeps the def as written with the default tiles
    for opts, laid in ((MappingOptions(layout=True), True), (MappingOptions(), big),
                       (MappingOptions(tile=(8, 8, 8)), False), (MappingOptions(tile=(8, 8, 8), layout=True), True),
                       (MappingOptions(register_tile=(2, 8, 1), point_order=(0, 2, 1), layout=True), True),
                       (MappingOptions(layout=False), False)):
        assert (names <= set(k.lowered(I, W, bias, options=opts).scop.inst.checked.tensors)) == laid, opts
        assert_sum_close(k(I, W, bias, backend="c", options=opts), lambda I, W, b: _fc(I, W.T, b), I, W, bias,
                         terms=m + 1)


def test_layout_leaves_other_statements_alone():
    from tcdsl.layout import applies, rewrite

    sizes = {"N": 4, "K": 3, "M": 5}
    for src in (MATMUL, "def f(float(N,K) A) -> (S) { S(i, j) +=! A(i, r) * A(j, r) where r in 0:2 }",
                "def f(int32(N,K) A, int32(M,K) B) -> (S) { S(i, j) +=! A(i, r) * B(j, r) }",
                "def f(float(N,K) A, float(M,K) B) -> (S) { S(i, j) +=! A(i, r) / B(j, r) }",
                "def f(float(N,K) A, float(M,K) B) -> (S) { S(i, j) +=! A(i, r) * B(j, r) * i }",
                "def f(float(N,K) A, float(M,K) B) -> (S) { S(i, j) +=! A(i, r) * B(j, r) / A(i, 0) }"):
        assert not applies(tc.define(src).checked) and rewrite(tc.define(src).checked, sizes) is None, src
    # a name the rewrite would take is already used: it picks another
    k = tc.define("def f(float(N,K) A, float(M,K) B, float(K,N) A_t, float(K,M) B_t) -> (S) "
                  "{ S(i, j) +=! A(i, r) * B(j, r) }")
    for sizes, name in (({"N": 5, "K": 3, "M": 4}, "B_t2"), ({"N": 2, "K": 30, "M": 40}, "A_t2")):
        laid = rewrite(k.checked, sizes)
        assert laid is not None and name in laid.tensors
    A, B, At, Bt = f32((5, 3)), f32((4, 3), 1), f32((3, 5), 2), f32((3, 4), 3)
    assert_sum_close(k(A, B, At, Bt, backend="c", options=MappingOptions(layout=True)), lambda A, B: A @ B.T, A, B,
                     terms=3)


@pytest.mark.parametrize("m, n, k, moved", [(1024, 1024, 1024, "B"), (960, 1088, 1000, "B"), (128, 1024, 1024, "AT"),
                                            (512, 256, 2048, "B"), (96, 900, 500, "AT"), (1, 1, 1, "B")])
def test_layout_transposes_the_operand_that_moves_fewer_elements(m: int, n: int, k: int, moved: str):
    """``T(x, y) +=! A(x, r) * B(y, r)``: B is transposed where it has fewer elements than A and T
    together (a square product), else A and T (a layer's batch against its weights)."""
    from tcdsl.layout import plans

    kern = tc.define("def f(float(M,K) A, float(N,K) B) -> (T) { T(m, n) +=! A(m, r) * B(n, r) }")
    (number, plan), = plans(kern.checked, {"M": m, "N": n, "K": k}).items()
    tensors = {"T": "T", "A": plan.a[0], "B": plan.b[0]}
    assert number == 1 and "".join(sorted(tensors[x] for x in plan.moved)) == moved
    assert (n * k < m * k + m * n) == (moved == "B")


# the contractions whose operand along the output's contiguous index runs along the reduction:
# (def, shapes, numpy, the laid-out def's new tensors at those shapes, the terms of a sum)
TRANSPOSED_PRODUCTS = [
    ("def f(float(K,M) A, float(N,K) B) -> (C) { C(m, n) +=! A(r, m) * B(n, r) }",  # Aᵀ Bᵀ: the result transposed
     [(70, 40), (90, 70)], lambda A, B: A.T @ B.T, {"C_t"}, 70),
    ("def f(float(K,M) A, float(N,K) B) -> (C) { C(m, n) +=! B(n, r) * A(r, m) }",  # the operands swapped: B
     [(30, 200), (20, 30)], lambda A, B: A.T @ B.T, {"B_t"}, 30),
    ("def f(float(Z,M,K) A, float(Z,N,K) B) -> (C) { C(z, m, n) +=! A(z, m, r) * B(z, n, r) }",  # Q Kᵀ
     [(3, 50, 40), (3, 45, 40)], lambda A, B: A @ B.transpose(0, 2, 1), {"B_t"}, 40),
    ("def f(float(Z,M,K) A, float(Z,N,K) B) -> (C) { C(z, m, n) +=! A(z, m, r) * B(z, n, r) }",
     [(2, 20, 60), (2, 300, 60)], lambda A, B: A @ B.transpose(0, 2, 1), {"A_t", "C_t"}, 60),
    ("def f(float(Z,K,M) A, float(Z,N,K) B) -> (C) { C(z, m, n) +=! A(z, r, m) * B(z, n, r) }",
     [(2, 33, 41), (2, 47, 33)], lambda A, B: A.transpose(0, 2, 1) @ B.transpose(0, 2, 1), {"B_t"}, 33),
    ("def f(float(N,K) A) -> (C) { C(i, j) +=! A(i, r) * A(j, r) }", [(40, 90)], lambda A: A @ A.T, {"A_t"}, 90),
    # constant factors and divisors beside the two reads
    ("def f(float(M,K) A, float(N,K) B) -> (C) { C(m, n) +=! 0.5 * A(m, r) * B(n, r) }",
     [(40, 30), (50, 30)], lambda A, B: 0.5 * A @ B.T, {"B_t"}, 30),
    ("def f(float(K,M) A, float(N,K) B) -> (C) { C(m, n) +=! A(r, m) * (B(n, r) * 2.0) / float(K) }",
     [(70, 40), (90, 70)], lambda A, B: A.T @ B.T * 2.0 / 70, {"C_t"}, 70),
]


@pytest.mark.cpu
@pytest.mark.parametrize("case", range(len(TRANSPOSED_PRODUCTS)))
def test_transposed_and_batched_products_are_laid_out_and_match_numpy(case: int):
    """``Aᵀ Bᵀ``, batched ``A Bᵀ`` (attention's ``Q Kᵀ``), ``A Aᵀ`` and products with constant factors
    take the register-tiled form through a transpose of one operand or of the result; the same sums
    as numpy, as written too."""
    src, shapes, ref, laid, terms = TRANSPOSED_PRODUCTS[case]
    k = tc.define(src)
    args = [f32(s, seed) for seed, s in enumerate(shapes)]
    assert laid <= set(k.lowered(*args).scop.inst.checked.tensors)
    for _ in range(2):
        assert_sum_close(k(*args), ref, *args, terms=terms)
    assert_sum_close(k(*args, options=MappingOptions(layout=False)), ref, *args, terms=terms)


def _einsum_def(spec: str) -> str:
    """``"zmr,zrn->mzn"`` as a def: one letter a dimension, reduction indices ``r_`` something."""
    ab, out = spec.split("->")
    a, b = ab.split(",")
    red = set(a + b) - set(out)
    name = {ch: f"r_{ch}" if ch in red else ch for ch in a + b}

    def dims(t: str) -> str:
        return ",".join(ch.upper() for ch in t)

    def subs(t: str) -> str:
        return ", ".join(name[ch] for ch in t)

    return f"def f(float({dims(a)}) A, float({dims(b)}) B) -> (C) {{ C({subs(out)}) +=! A({subs(a)}) * B({subs(b)}) }}"


EINSUM_SIZES = {"m": 13, "n": 21, "r": 17, "z": 3, "s": 4}
EINSUMS = ([f"{a},{b}->mn" for a in ("mr", "rm") for b in ("rn", "nr")]
           + [f"{a},{b}->{o}" for a in ("zmr", "mzr", "zrm", "mrz") for b in ("zrn", "znr", "rzn", "rnz")
              for o in ("zmn", "mzn", "mnz")]
           + ["mrs,rsn->mn", "mrs,nrs->mn", "rms,srn->mn", "smr,snr->mn"])


@pytest.mark.cpu
@pytest.mark.parametrize("spec", EINSUMS)
def test_every_index_order_of_a_contraction_is_register_tiled_and_matches_numpy(spec: str):
    """A product of two operands in any index order (batch indices anywhere, one or two reduction
    indices) is laid out as a (batched) matrix product (tcdsl.layout): its product statement gets a
    register tile, and the sums match numpy's."""
    k = tc.define(_einsum_def(spec))
    ab, _ = spec.split("->")
    args = [f32(tuple(EINSUM_SIZES[ch] for ch in t), seed) for seed, t in enumerate(ab.split(","))]
    terms = math.prod(EINSUM_SIZES[ch] for ch in set(ab) - set(spec.split("->")[1]) - {","})
    opts = MappingOptions(layout=True)
    assert "register tile" in str(k.lowered(*args, options=opts).passes[-1][1])
    assert_sum_close(k(*args, options=opts), lambda A, B: np.einsum(spec, A, B), *args, terms=terms)


@pytest.mark.cpu
@pytest.mark.parametrize("z, m, k, n", [(3, 70, 60, 50), (5, 13, 300, 40)])
def test_a_batched_products_batch_steps_outside_its_cache_tiles(z: int, m: int, k: int, n: int):
    """bmm's batch index, which every access moves along, is the outermost loop, one batch at a time
    (its cache tiles hold one batch's panels), shared by the threads with the row tiles; numpy's sums."""
    kern = tc.define("def bmm(float(Z,M,K) A, float(Z,K,N) B) -> (C) { C(z,m,n) +=! A(z,m,r_k) * B(z,r_k,n) }")
    A, B = f32((z, m, k)), f32((z, k, n), 1)
    first = str(kern.lowered(A, B).passes[-1][1]).split("\n")[0]
    batch = rf"for \((c\d+) = 0; \(\1 <= {z - 1}\); \1 \+= 1\)  // parallel omp( collapse\(2\))?( fine chunks)?"
    assert re.fullmatch(batch, first), first
    assert_sum_close(kern(A, B), np.matmul, A, B, terms=k)


# ---- small windows reduced into contiguous outputs -------------------------------------------------------

POOL = """def pool(float(N,C,H,W) I) -> (O, A) {
    O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw) where r_kh in 0:2, r_kw in 0:2
    A(n,c,h,w) +=! I(n,c,h + r_kh,w + r_kw) / 9.0 where r_kh in 0:3, r_kw in 0:3
}"""


@pytest.mark.cpu
@pytest.mark.parametrize("shape", [(2, 3, 56, 56), (1, 2, 9, 37), (3, 1, 5, 6)])
def test_small_windows_vectorise_over_the_output_row_and_match_numpy(shape: tuple[int, ...]):
    """Pooling windows (2x2, 3x3) go outside the output's contiguous loop, which is vectorised;
    max pooling still propagates NaN, sums stay within rounding of numpy."""
    k = tc.define(POOL)
    I = f32(shape)
    I[0, 0, 1, 3] = np.nan
    n, c, h, w = shape
    want_max = I[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    def avg(I: np.ndarray) -> np.ndarray:
        return (np.lib.stride_tricks.sliding_window_view(I, (3, 3), axis=(2, 3)) / 9.0).sum(axis=(4, 5))

    got_max, got_avg = k(I, backend="c")
    np.testing.assert_array_equal(got_max, want_max)  # NaN where a window holds one
    assert_sum_close(got_avg, avg, I, terms=9)  # NaN where a window holds one
    if shape == (2, 3, 56, 56):
        src = k.source(I)
        assert "statement 1: a 28 register tile of O" in src, src  # the output row, 28 wide, across the window


NORM_GRAD = """def norm_grad(float(N,D) X, float(D) G, float(N) mean, float(N) rstd, float(N,D) dY) -> (dX, dG, dB) {
    xc(n, d) = X(n, d) - mean(n)
    dG(d) +=! dY(r_n, d) * xc(r_n, d) * rstd(r_n)
    dB(d) +=! dY(r_n, d)
    dxc(n, d) = dY(n, d) * rstd(n) * G(d)
    s(n) +=! dxc(n, r_d) * xc(n, r_d) * rstd(n)
    m(n) +=! dxc(n, r_d)
    dX(n, d) = dxc(n, d) - (m(n) + xc(n, d) * rstd(n) * s(n)) / D
}"""


@pytest.mark.cpu
def test_default_fusion_keeps_statements_over_ranges_of_different_sizes_apart():
    """A pooling backward: 'max' fuses the 23-wide share of each window's gradient with the 46-wide
    input gradient, so each iteration tests which statement runs. The default takes 'preserve' and
    says why; both give numpy's gradient of a 2x2 max pool. A softmax (statements over equal ranges)
    keeps 'max'."""
    pool = "def pool(float(N,C,H,W) I) -> (O) {\n  O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw) " \
           "where r_kh in 0:2, r_kw in 0:2\n}"
    bw = tc.define(tc.define(pool).backward_source())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 10, 14)).astype(np.float32)
    windows = x.reshape(2, 3, 5, 2, 7, 2)
    o = windows.max(axis=(3, 5))
    d_o = rng.standard_normal(o.shape).astype(np.float32)
    low = bw.lowered(x, o, d_o)
    assert low.options.fusion == "preserve" and "ranges of different sizes" in low.fusion_why, low.fusion_why
    assert schedule.mixed_ranges(bw.lowered(x, o, d_o, options=MappingOptions(fusion="max")).tree, low.scop)
    hit = windows == o[:, :, :, None, :, None]
    want = (hit * (d_o / hit.sum(axis=(3, 5)))[:, :, :, None, :, None]).reshape(x.shape)
    for opts in (None, MappingOptions(fusion="max")):
        np.testing.assert_allclose(bw(x, o, d_o, options=opts), want, rtol=1e-6)
    soft = tc.define("def softmax(float(N,D) X) -> (Y) {\n  mx(n) max=! X(n,r_d)\n  e(n,d) = exp(X(n,d) - mx(n))\n"
                     "  s(n) +=! e(n,r_d)\n  Y(n,d) = e(n,d) / s(n)\n}")
    assert soft.lowered(np.ones((64, 200), np.float32)).options.fusion == "max"


@pytest.mark.cpu
def test_default_fusion_keeps_the_outermost_loops_parallel():
    """A def whose statements run their loops in different orders (column sums over n beside row
    sums over d, as a norm's backward; no plain product of two reads, so the def's default is 'max'):
    that fusion skews them under one serial outermost loop, so the default takes 'preserve', says
    why (explain, the schedule stage's decision), keeps every outermost loop parallel and gives the
    results of 'max' and of numpy; given options keep theirs."""
    rng = np.random.default_rng(5)
    N, D = 48, 40
    X, dY = rng.standard_normal((N, D)).astype(np.float32), rng.standard_normal((N, D)).astype(np.float32)
    G, mean, rstd = (rng.standard_normal(s).astype(np.float32) for s in (D, N, N))
    k = tc.define(NORM_GRAD)
    args = (X, G, mean, rstd, dY)
    low = k.lowered(*args)
    assert low.options.fusion == "preserve" and low.fusion_why.startswith("fusion 'preserve': 'max' ran ")
    assert schedule.serial_share(low.tree, low.scop) == 0.0
    maxed = k.lowered(*args, options=MappingOptions(fusion="max"))
    assert maxed.options.fusion == "max" and schedule.serial_share(maxed.tree, maxed.scop) > 0.5
    assert "fusion 'preserve': 'max' ran " in k.explain(*args).split("\n")[1]
    X64, dY64, G64, m64, r64 = (a.astype(np.float64) for a in (X, dY, G, mean, rstd))
    xc = X64 - m64[:, None]
    dxc = dY64 * r64[:, None] * G64
    want = (dxc - (dxc.sum(1)[:, None] + xc * r64[:, None] ** 2 * (dxc * xc).sum(1)[:, None]) / D,

            (dY64 * xc * r64[:, None]).sum(0), dY64.sum(0))
    for opts in (None, MappingOptions(fusion="max")):
        got = k(*args, options=opts)
        for g, w, terms in zip(got, want, (D, N, N)):
            assert_close(g, w, terms=terms, scale=np.abs(w).max(), dtype="float32")


@pytest.mark.cpu
def test_reductions_get_loops_of_their_own_beside_pointwise_statements():
    """Softmax's derived backward with nothing saved fuses its row reductions (the max and the sum
    recomputed, d_s) with pointwise statements on each row; the transform stage gives each statement
    of such a serial loop a loop of its own, inside the shared row loop: every loop that runs a
    statement is then parallel (vectorised) or runs that one statement (a reduction, accumulated in
    a local), and the gradient is numpy's."""
    rng = np.random.default_rng(2)
    N, D = 37, 300
    X, dY = rng.standard_normal((N, D)).astype(np.float32), rng.standard_normal((N, D)).astype(np.float32)
    b = tc.define(tc.define(next(c.source for c in DEFS if c.name == "softmax"), save=[]).backward_source())
    ir = b.lowered(X, dY).passes[-1][1]
    loops = [n for n in walk(ir.body) if isinstance(n, LFor) and any(isinstance(c, LCall) for c in n.body)]
    assert sum(isinstance(c, LCall) for n in loops for c in n.body) >= 4, str(ir)  # mx, s, d_s, d_X at least
    assert loops and all(n.parallel or sum(isinstance(c, LCall) for c in n.body) == 1 for n in loops), str(ir)
    e = np.exp(X.astype(np.float64) - X.max(1)[:, None])
    Y = e / e.sum(1)[:, None]
    want = Y * (dY - (dY * Y).sum(1)[:, None])
    assert_close(b(X, dY), want, terms=D, scale=np.abs(dY * Y).sum(1)[:, None] + np.abs(dY * Y), dtype="float32")


@pytest.mark.cpu
def test_nests_with_little_work_run_on_the_calling_thread():
    """A parallel nest of fewer than astgen.SERIAL_BELOW statement instances is no OpenMP region
    (starting the threads costs more than its work); a larger one is."""
    from tcdsl.polyhedral.astgen import SERIAL_BELOW

    k = tc.define(MATMUL)
    small = f32((8, 8)), f32((8, 8), 1)
    assert "#pragma omp parallel" not in k.source(*small)
    assert not any(n.omp for n in walk(k.lowered(*small).ir.body) if isinstance(n, LFor))
    assert_sum_close(k(*small), np.matmul, *small, terms=8)
    large = f32((64, 32)), f32((32, 64), 1)  # 131072 instances of the product
    assert 64 * 32 * 64 >= SERIAL_BELOW > 8 * 8 * 8
    assert "#pragma omp parallel" in k.source(*large)
    assert_sum_close(k(*large), np.matmul, *large, terms=32)


@pytest.mark.cpu
def test_read_only_strided_and_zero_dim_arguments():
    """The call's fast path takes element addresses through the buffer protocol; read-only,
    strided and zero-dimensional arrays take numpy's."""
    k = tc.define("def axpy(float(N) X, float a) -> (Y) { Y(i) = a * X(i) + 1.0 }")
    x = f32((40,))
    ro = x.copy()
    ro.flags.writeable = False
    a = np.array(3.0, np.float32)
    for arg in (x, ro, x[::3], x[::-1]):
        for _ in range(2):  # the first call and the repeated call's path
            np.testing.assert_array_equal(k(arg, a), 3.0 * arg + 1.0)


@pytest.mark.cpu
@pytest.mark.parametrize("shapes,options", [(((3, 4), (5, 4)), MappingOptions(layout=True)),
                                            (((40, 24), (36, 24)), MappingOptions(openmp=False, layout=True))])
def test_operands_transposed_in_blocks_and_read_in_the_same_kernel(shapes, options):
    """A product with its operands laid out for the contraction (tcdsl.layout): the blocked transpose
    (tc_transpose_rect, 32-bit words) writes a buffer the product then reads as floats, outside any
    parallel region too, where GCC's type-based alias analysis once moved the reads before the copy."""
    k = tc.define("def nt(float(M,K) A, float(N,K) B) -> (C) {\n  AB(m, n) +=! A(m, r_k) * B(n, r_k)\n"
                  "  C(m, n) = 2.0 * AB(m, n)\n}")
    A, B = f32(shapes[0]), f32(shapes[1], 1)
    src = k.source(A, B, options=options)
    assert "tc_transpose_rect(" in src and "#pragma omp parallel" not in src.split("int tc_kernel")[1]
    for _ in range(2):
        assert_sum_close(k(A, B, options=options), lambda a, b: 2.0 * a @ b.T, A, B, terms=shapes[0][1])


_HEAP_PROBE = """
import resource, sys, numpy as np, tcdsl as tc
k = tc.define("def one(float(N) A) -> (B) { B(i) = A(i) + 1.0 }")
k(np.ones(4, np.float32))  # the first C kernel: glibc's heap thresholds are set here
def step():  # a step's four 8 MiB blocks, made, written and freed together
    blocks = [np.empty(1 << 21, np.float32) for _ in range(4)]
    for b in blocks:
        b.fill(1.0)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


@pytest.mark.cpu
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_of_megabytes_are_reused_without_faults():
    """Once a C kernel runs, glibc keeps freed blocks under 32 MiB in the heap: four 8 MiB buffers
    made and freed together again and again fault no more (TCDSL_KEEP_HEAP=0 keeps glibc's
    defaults, which trim the 32 MiB freed back to the system each time: fresh pages, thousands of
    faults a step)."""
    def faults(keep: str) -> float:
        env = {**os.environ, "TCDSL_KEEP_HEAP": keep}
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
        env.pop("MALLOC_TRIM_THRESHOLD_", None)
        out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[-1])

    assert faults("1") < 50
    assert faults("0") > 500


@pytest.mark.cpu
def test_a_gathered_row_is_checked_once_before_the_loop_along_it():
    """An embedding bag's ``Tab(Idx(b, l), d)`` along ``d``: the row is read and checked before the
    (vectorised) loop over ``d``, not per element; results and the out-of-range error are the
    interpreter's."""
    bag = tc.define("def bag(float(V, D) Tab, int64(B, L) Idx) -> (O) { O(b, d) +=! Tab(Idx(b, l), d) }",
                    filename="bag.tc")
    rng = np.random.default_rng(4)
    tab, idx = rng.standard_normal((300, 64)).astype(np.float32), rng.integers(0, 300, (32, 10))
    src = bag.source(tab, idx).split("int tc_kernel")[1]
    hoisted = re.search(r"const long (g\d+) = tc_chk\(\(long\)t1\[", src)
    assert hoisted and f"t0[{hoisted.group(1)} * 64L + " in src, src
    assert_sum_close(bag(tab, idx), lambda t: t[idx].sum(1), tab, terms=10)
    idx[17, 3] = 300
    e, ref = _both_raise(bag, [tab, idx])
    assert "'Tab'" in e.message and "read at 300," in e.message and str(e) == str(ref)
