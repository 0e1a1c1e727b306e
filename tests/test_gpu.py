"""The GPU backend on any machine: the mapping (blocks, threads, shared and private promotion,
barriers) run as OpenCL on PoCL against the interpreter, with the naive options and with
hypothesis-drawn ones; every generated CUDA kernel compiled for sm_90 by NVRTC (no spills with the
naive options); barriers that cannot be removed; the static resource proof. Tests that run
kernels are marked ``gpu`` (skipped without an OpenCL platform or a CUDA device).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcdsl as tc
from tcdsl import TcArgumentError, TcScheduleError, gpurt
from tcdsl.codegen import nvrtc
from tcdsl.options import FUSION, MappingOptions
from tcdsl.polyhedral import gpucheck
from tcdsl.polyhedral.gpu import GpuKernel, GpuTarget
from tcdsl.polyhedral.loopir import LCopy, LFor, LIf, LNode, LSync, walk

try:
    from defs import DEFS, Case, assert_matches, make_inputs
    from tolerance import assert_close, assert_sum_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from defs import DEFS, Case, assert_matches, make_inputs
    from tolerance import assert_close, assert_sum_close

from conftest import has_cuda, has_opencl

CASES = {c.name: c for c in DEFS}
MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
NORMALISE = "def nrm(float(I, J) A) -> (O) { S(i) +=! A(i, j)\n O(i, j) = A(i, j) / S(i) }"
REVERSE = "def rev(float(I, J) A) -> (O) { T(i, j) = A(i, j) * 2.0\n O(i, j) = T(i, J - 1 - j) + T(i, j) }"
HALF: set[str] = set()
needs_opencl = pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform (apt install pocl-opencl-icd)")
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install nvidia-cuda-nvrtc)")


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- 1. the corpus on OpenCL (PoCL) ------------------------------------------------------------


@pytest.mark.gpu
@needs_opencl
@pytest.mark.parametrize("case", DEFS, ids=[c.name for c in DEFS])
def test_corpus_opencl_matches_reference_and_interpreter(case: Case):
    args = make_inputs(case.inputs)
    k = tc.define(case.source)
    got = k(*args, backend="opencl")
    assert_matches(got, case.reference(*args), case.tol, f"{case.name} (opencl vs numpy reference)")
    assert_matches(got, k(*args, backend="numpy"), case.tol, f"{case.name} (opencl vs interpreter)")


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="no CUDA device")
@pytest.mark.parametrize("case", [c for c in DEFS if c.name not in HALF], ids=lambda c: c.name)
def test_corpus_cuda_matches_reference(case: Case):  # pragma: no cover - runs where a GPU is
    import cupy

    args = make_inputs(case.inputs)
    k = tc.define(case.source)
    got = k(*[cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args])
    got = tuple(g.get() for g in got) if isinstance(got, tuple) else got.get()
    assert_matches(got, case.reference(*args), case.tol, case.name)


# ---- 2. every CUDA kernel compiles for sm_90 -------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("case", [c for c in DEFS if c.name not in HALF], ids=lambda c: c.name)
def test_corpus_cuda_compiles_for_sm90_without_spills(case: Case):
    args = make_inputs(case.inputs)
    low = tc.define(case.source).lowered_gpu(*args, backend="cuda")
    out = nvrtc.compile_cuda(low.source.text, "sm_90")
    assert out.cubin[:4] == b"\x7fELF"
    spills = out.spills()
    assert set(spills) == {k.name for k in low.source.kernels}
    assert all(v == 0 for v in spills.values()), out.log


@needs_nvrtc
def test_promoted_matmul_compiles_with_shared_memory_and_barriers():
    A, B = f32(100, 70), f32(70, 90)
    low = tc.define(MATMUL).lowered_gpu(A, B, backend="cuda")
    out = nvrtc.compile_cuda(low.source.text)
    assert "used 1 barriers" in out.log and "8448 bytes smem" in out.log, out.log
    props = out.log.split("Function properties for tc_matmul_k1")[1].splitlines()[1]
    assert "0 bytes stack frame" in props, out.log  # the accumulators are registers, not local memory


# ---- 3. hypothesis-drawn options on OpenCL ----------------------------------------------------------


def gpu_options() -> st.SearchStrategy[MappingOptions]:
    sizes = st.sampled_from([0, 1, 2, 3, 5, 8, 16, 32])
    dims = st.lists(st.sampled_from([1, 2, 3, 4, 8, 16, 32]), min_size=1, max_size=3).filter(
        lambda t: int(np.prod(t)) <= 1024)
    return st.builds(
        MappingOptions,
        fusion=st.sampled_from((None, *FUSION)),
        tile=st.none() | st.lists(sizes, min_size=0, max_size=4).map(tuple),
        blocks=st.none() | st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
        threads=st.none() | dims.map(tuple),
        shared_memory=st.booleans(),
        max_shared_memory=st.sampled_from([None, 0, 600, 4096]),
        private_memory=st.booleans(),
        unroll_copy_shared=st.booleans(),
        unroll=st.integers(0, 4),
    )


DRAWN = ["matmul", "batch_matmul", "conv2d_strided", "conv2d_group", "conv2d_same", "maxpool_2x2_s2", "softmax",
         "layernorm", "transposes", "temporaries_chain", "embedding", "reduce_all", "tril_mask"]
_SETUP: dict[str, tuple[Any, list[Any], Any]] = {}


def _setup(name: str) -> tuple[Any, list[Any], Any]:
    if name not in _SETUP:
        case = CASES[name]
        k = tc.define(case.source)
        args = make_inputs(case.inputs, seed=5)
        _SETUP[name] = (k, args, k(*args, backend="numpy"))
    return _SETUP[name]


def _drawn_test(name: str) -> Any:
    @pytest.mark.gpu
    @needs_opencl
    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(opts=gpu_options())
    def test(opts: MappingOptions) -> None:
        k, args, want = _setup(name)
        got = k(*args, backend="opencl", options=opts)
        assert_matches(got, want, CASES[name].tol, f"{name} with {opts}")
        low = k.lowered_gpu(*args, backend="opencl", options=opts)
        for kern in low.program.kernels:
            assert not gpucheck.races(kern, low.scop, 1), f"{name} with {opts}: {kern.name} races"
        if nvrtc.available():  # the same mapping, printed as CUDA, compiles for sm_90
            nvrtc.compile_cuda(k.lowered_gpu(*args, backend="cuda", options=opts).source.text)

    test.__name__ = f"test_opencl_options_{name}"
    return test


for _name in DRAWN:
    globals()[f"test_opencl_options_{_name}"] = _drawn_test(_name)


@pytest.mark.gpu
@needs_opencl
def test_a_footprint_bounded_by_integer_divisions_is_left_unpromoted() -> None:
    # a tile of 5 along conv's output columns: the read box's bounds hold floor divisions
    k, args, want = _setup("conv2d_same")
    opts = MappingOptions(tile=(0, 0, 5), threads=(1,))
    assert_matches(k(*args, backend="opencl", options=opts), want, CASES["conv2d_same"].tol, f"conv2d_same with {opts}")


@pytest.mark.gpu
@needs_opencl
@pytest.mark.parametrize("shape", [(1, 1, 1), (33, 17, 65), (100, 37, 70), (64, 64, 64), (77, 130, 45)])
@pytest.mark.parametrize("opts", [MappingOptions(), MappingOptions(blocks=(1,), threads=(8, 4)),
                                  MappingOptions(tile=(16, 8, 4), blocks=(2, 2), threads=(4, 4)),
                                  MappingOptions(shared_memory=False, private_memory=False)],
                         ids=["naive", "one-block", "small-tiles", "no-promotion"])
def test_matmul_odd_sizes_and_small_grids(shape: tuple[int, int, int], opts: MappingOptions):
    M, K, N = shape
    A, B = f32(M, K), f32(K, N, seed=1)
    got = tc.define(MATMUL)(A, B, backend="opencl", options=opts)
    assert_sum_close(got, np.matmul, A, B, terms=K)


# ---- 4. the mapping's structure ---------------------------------------------------------------------


def test_register_decisions_are_passes_that_print(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """codegen.gpulower decides what lives in registers, before the printer: matmul's k tiles hold
    each thread's elements of C (an LHold), a thread's conv window accumulates in a local (an
    LAccum); without private memory both passes leave the mapped program as it is. The trace of
    the passes goes to TCDSL_DUMP_DIR with the CUDA."""
    from tcdsl.polyhedral.loopir import LAccum, LHold

    monkeypatch.setenv("TCDSL_DUMP_DIR", str(tmp_path))
    A, B = f32(100, 70), f32(70, 90)
    low = tc.define(MATMUL).lowered_gpu(A, B, backend="cuda")
    assert [name for name, _ in low.passes] == ["scatter", "hold", "accumulate"]
    assert str(low.passes[0][1]) == str(low.program)  # no scatter in a matmul
    (hold,) = [n for k in low.passes[1][1].kernels for n in walk(k.body) if isinstance(n, LHold)]
    assert hold.slots == (4, 1) and hold.loop.var in low.source.text
    assert "hold S1 in registers across" in (tmp_path / "matmul.gpu-passes.txt").read_text()
    plain = tc.define(MATMUL).lowered_gpu(A, B, backend="cuda", options=MappingOptions(private_memory=False))
    assert all(str(p) == str(plain.program) for _, p in plain.passes)
    conv = ("def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) "
            "{ O(n,f,h,w) +=! I(n,r_c,h+r_kh,w+r_kw) * W1(f,r_c,r_kh,r_kw) }")
    low = tc.define(conv).lowered_gpu(f32(2, 4, 10, 10), f32(3, 4, 3, 3), backend="opencl")
    (acc,) = [n for k in low.passes[-1][1].kernels for n in walk(k.body) if isinstance(n, LAccum)]
    assert len(acc.loops) == 3 and "accumulate O over" in low.source.text


def test_matmul_mapping_blocks_threads_shared_and_private():
    A, B = f32(100, 70), f32(70, 90)
    low = tc.define(MATMUL).lowered_gpu(A, B, backend="opencl")
    init, update = low.program.kernels
    assert update.grid == (3, 4, 1) and update.block == (32, 8, 1)
    loops = [n for n in walk(update.body) if isinstance(n, LFor)]
    assert [(f.mapped, f.dim, f.count) for f in loops if f.mapped] == \
        [("block", 1, 4), ("block", 0, 3), ("thread", 1, 8), ("thread", 0, 32)]
    copies = [n for n in walk(update.body) if isinstance(n, LCopy)]
    assert [(c.tensor, c.sizes) for c in copies] == [("A", (32, 32)), ("B", (32, 32))]
    assert update.shared_bytes == 2 * 32 * 33 * 4  # the innermost dim padded against bank conflicts
    assert sum(isinstance(n, LSync) for n in walk(update.body)) == 2
    assert not any(isinstance(n, LSync) for n in walk(init.body))
    # each thread's 4 elements of C (rows ty, ty+8, ...) stay in registers across the k tiles
    assert "each thread keeps its elements of C in registers across" in low.source.text
    assert "float acc[4][1];" in low.source.text and low.source.text.count("= acc[r0][r1];") == 1
    plain = tc.define(MATMUL).lowered_gpu(A, B, backend="opencl", options=MappingOptions(private_memory=False))
    assert "acc" not in plain.source.text


@pytest.mark.gpu
@needs_opencl
def test_full_reduction_feeding_a_consumer_is_split_into_kernels():
    k = tc.define("def f(float(N) A) -> (O) { S +=! A(i)\n O(i) = A(i) / S }")
    A = np.random.default_rng(0).random(1000).astype(np.float32) + 0.5
    low = k.lowered_gpu(A, backend="opencl")
    assert len(low.program.kernels) == 3  # zero S; sum into S; divide by S (S lives in device memory)
    assert low.program.kernels[2].grid[0] > 1
    # every term is positive: S is within 1000 * eps * S of its value, and so is each O(i) relatively
    assert_close(k(A, backend="opencl"), A / A.astype(np.float64).sum(), terms=1000, scale=A / A.sum())


def test_barrier_only_where_threads_exchange_data():
    k = tc.define(NORMALISE)
    low = k.lowered_gpu(f32(5, 40), backend="opencl", options=MappingOptions(fusion="max", tile=(1,)))
    (kern,) = low.program.kernels
    assert sum(isinstance(n, LSync) for n in walk(kern.body)) == 1  # thread 0's sum, then every thread reads it
    elementwise = tc.define("def f(float(N, M) A) -> (O) { O(i, j) = exp(A(i, j)) + 1.0 }")
    src = elementwise.source(f32(70, 50), backend="opencl")
    assert "SYNC();" not in src.split("// OpenCL C 1.2")[1].split("KERNEL", 1)[1]


def test_source_prints_both_dialects_without_a_gpu():
    A, B = f32(40, 20), f32(20, 30)
    cuda = tc.define(MATMUL).source(A, B, backend="cuda")
    opencl = tc.define(MATMUL).source(A, B, backend="opencl")
    assert '#define KERNEL extern "C" __global__' in cuda and "#define SYNC() __syncthreads()" in cuda
    assert "#define KERNEL __kernel" in opencl and "barrier(CLK_LOCAL_MEM_FENCE" in opencl
    assert "// launch tc_matmul_k1: grid (2, 1, 1), block (30, 8, 1)" in cuda  # 2 row tiles; 30 columns
    body = cuda.split("#define TC_EXPF expf", 1)[1]
    assert body == opencl.split("#define TC_EXPF expf", 1)[1]  # one body, two preludes


# ---- 5. barriers: none missing, none that could go --------------------------------------------------


@pytest.mark.parametrize("case", [c for c in DEFS if c.name not in HALF], ids=lambda c: c.name)
def test_corpus_kernels_have_no_races(case: Case):
    args = make_inputs(case.inputs)
    low = tc.define(case.source).lowered_gpu(*args, backend="opencl")
    for kern in low.program.kernels:
        assert gpucheck.races(kern, low.scop, 3) == [], kern.name


def _drop_sync(nodes: tuple[LNode, ...], which: int, seen: list[int]) -> tuple[LNode, ...]:
    """``nodes`` without their ``which``-th barrier (in program order)."""
    out: list[LNode] = []
    for n in nodes:
        if isinstance(n, LSync):
            seen[0] += 1
            if seen[0] - 1 == which:
                continue
            out.append(n)
        elif isinstance(n, (LFor, LCopy)):
            out.append(dataclasses.replace(n, body=_drop_sync(n.body, which, seen)))
        elif isinstance(n, LIf):
            out.append(dataclasses.replace(n, then=_drop_sync(n.then, which, seen),
                                           other=_drop_sync(n.other, which, seen)))
        else:
            out.append(n)
    return tuple(out)


def _barriers(k: GpuKernel) -> int:
    return sum(isinstance(n, LSync) for n in walk(k.body))


@pytest.mark.parametrize("opts", [MappingOptions(tile=(8, 8, 8), threads=(4, 4), blocks=(2, 2)),
                                  MappingOptions(tile=(16, 8, 4), threads=(8, 2), blocks=(1,))])
def test_each_barrier_of_promoted_matmul_is_needed(opts: MappingOptions):
    A, B = f32(20, 30), f32(30, 20, seed=1)
    low = tc.define(MATMUL).lowered_gpu(A, B, backend="opencl", options=opts)
    kern = low.program.kernels[1]
    assert kern.shared and _barriers(kern) == 2
    assert gpucheck.races(kern, low.scop) == []
    for which in range(2):
        cut = dataclasses.replace(kern, body=_drop_sync(kern.body, which, [0]))
        assert _barriers(cut) == 1
        found = gpucheck.races(cut, low.scop, 1)
        assert found and found[0].location[0].startswith("sh"), f"barrier {which} removed: no race found"


def test_cli_prints_cuda_and_opencl(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from tcdsl.cli import main

    src = tmp_path / "mm.tc"
    src.write_text(MATMUL)
    assert main(["compile", str(src), "--sizes", "M=40,K=20,N=30", "--emit", "cuda"]) == 0
    cuda = capsys.readouterr().out
    assert "// launch tc_matmul_k1" in cuda and '#define KERNEL extern "C" __global__' in cuda
    assert main(["compile", str(src), "--sizes", "M=40,K=20,N=30", "--emit", "opencl"]) == 0
    assert "#define KERNEL __kernel" in capsys.readouterr().out


def _without_sync(low: Any, which: int) -> Any:
    parts = low.source.text.split("SYNC();")
    assert len(parts) > which + 1
    cut = "SYNC();".join(parts[: which + 1]) + "/* removed */" + "SYNC();".join(parts[which + 1:])
    return dataclasses.replace(low, source=dataclasses.replace(low.source, text=cut))


@pytest.mark.gpu
@needs_opencl
def test_missing_barriers_give_wrong_results_on_pocl():
    """PoCL runs a block's threads one after another between barriers, so a missing barrier before
    reads of another thread's data shows in the results (a barrier at a loop's back edge does
    not: PoCL adds one there itself; the race check covers those). The kernels without the
    barrier run on other inputs than the correct ones: memory the correct run left behind (a
    temporary's buffer reused) would otherwise hold the right values."""
    A, B = f32(64, 96), f32(96, 64, seed=1)
    low = tc.define(MATMUL).lowered_gpu(A, B, backend="opencl")
    assert_sum_close(gpurt.OpenCLKernel(low)({"A": A, "B": B})["C"], np.matmul, A, B, terms=96)
    A, B = f32(64, 96, seed=3), f32(96, 64, seed=4)
    bad = gpurt.OpenCLKernel(_without_sync(low, 0))({"A": A, "B": B})["C"]
    with pytest.raises(AssertionError):
        assert_sum_close(bad, np.matmul, A, B, terms=96)
    R = f32(5, 40, seed=2)
    low = tc.define(REVERSE).lowered_gpu(R, backend="opencl", options=MappingOptions(fusion="max", tile=(1,)))
    (kern,) = low.program.kernels
    assert _barriers(kern) == 1  # T is written by one thread and read by another

    def want(R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # the values, and the terms' sum (one rounding)
        return R[:, ::-1] * 2 + R * 2, np.abs(R[:, ::-1] * 2) + np.abs(R * 2)

    assert_close(gpurt.OpenCLKernel(low)({"A": R})["O"], want(R)[0], scale=want(R)[1])
    R = f32(5, 40, seed=5)
    bad = gpurt.OpenCLKernel(_without_sync(low, 0))({"A": R})["O"]
    with pytest.raises(AssertionError):
        assert_close(bad, want(R)[0], scale=want(R)[1])


def test_barrier_after_single_thread_reduction():
    A = f32(5, 40)
    low = tc.define(NORMALISE).lowered_gpu(A, backend="opencl", options=MappingOptions(fusion="max", tile=(1,)))
    (kern,) = low.program.kernels
    assert _barriers(kern) == 1  # thread 0's sum, then every thread reads it
    assert gpucheck.races(kern, low.scop) == []
    assert gpucheck.races(dataclasses.replace(kern, body=_drop_sync(kern.body, 0, [0])), low.scop, 1)


# ---- 6. the static resource proof ---------------------------------------------------------------------


@pytest.mark.parametrize("opts, option", [
    (MappingOptions(threads=(2048,)), "threads"),
    (MappingOptions(threads=(32, 32, 2)), "threads"),
    (MappingOptions(threads=(1, 1, 128)), "threads"),
    (MappingOptions(blocks=(1, 1, 70000)), "blocks"),
    (MappingOptions(max_shared_memory=1 << 20), "max_shared_memory"),
])
def test_mappings_beyond_the_device_are_rejected_before_compiling(opts: MappingOptions, option: str):
    k = tc.define(MATMUL)
    A, B = f32(64, 64), f32(64, 64)
    with pytest.raises(TcScheduleError, match=option):
        k.lowered_gpu(A, B, backend="cuda", options=opts)
    if has_opencl():
        with pytest.raises(TcScheduleError, match=option):
            k(A, B, backend="opencl", options=opts)
        assert k.compile_count == 0


def test_shared_memory_budget_is_respected_from_isl_footprints():
    A, B = f32(100, 70), f32(70, 90)
    k = tc.define(MATMUL)
    for budget, buffers in ((0, 0), (4300, 1), (8448, 2)):
        low = k.lowered_gpu(A, B, backend="cuda", options=MappingOptions(max_shared_memory=budget))
        upd = low.program.kernels[1]
        assert len(upd.shared) == buffers and upd.shared_bytes <= budget
    small = GpuTarget(name="small", max_threads=128, max_shared=4096)
    with pytest.raises(TcScheduleError, match="threads"):
        k.lowered_gpu(A, B, backend="cuda", target=small)
    low = k.lowered_gpu(A, B, backend="cuda", options=MappingOptions(threads=(16, 8)), target=small)
    assert all(kk.shared_bytes <= 4096 for kk in low.program.kernels)


# ---- 7. errors and availability ------------------------------------------------------------------------


@pytest.mark.skipif(has_cuda(), reason="a CUDA device is present")
def test_cuda_backend_without_a_device_says_what_is_missing():
    with pytest.raises(TcArgumentError, match="cupy"):
        tc.define(MATMUL)(f32(4, 4), f32(4, 4), backend="cuda")


@pytest.mark.gpu
@needs_opencl
def test_gather_out_of_range_is_reported_on_opencl():
    k = tc.define("def g(float(V, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }")
    with pytest.raises(tc.TcRuntimeError, match="out of range"):
        k(f32(4, 3), np.array([0, 9], dtype=np.int32), backend="opencl")


class _OnDevice:
    """Stands for a cupy array where there is no device: the argument checks know device arrays by
    their type's module, and read only its shape, strides and dtype."""

    __module__ = "cupy._core.core"

    def __init__(self, a: np.ndarray) -> None:
        self.shape, self.strides, self.dtype, self.ndim = a.shape, a.strides, a.dtype, a.ndim


def test_scalar_parameters_stay_on_the_host_beside_device_arrays():
    """A Python or numpy scalar for a scalar parameter goes with device arrays (the call copies it);
    a host array for an array parameter does not, and a scalar is still checked against its type."""
    k = tc.define("def axpy(float alpha, float(N) X, float(N) Y) -> (Z) { Z(i) = alpha * X(i) + Y(i) }")
    x = _OnDevice(f32(5))
    for alpha in (0.75, np.float32(0.75), np.array(0.75, np.float32)):
        assert "alpha" in k.lowered_gpu(alpha, x, x, backend="cuda").source.text
    with pytest.raises(TcArgumentError, match="'Y' is on the host"):
        k.lowered_gpu(0.75, x, f32(5), backend="cuda")
    with pytest.raises(TcArgumentError, match="'alpha' is declared float32 but the argument has dtype float64"):
        k.lowered_gpu(np.float64(0.75), x, x, backend="cuda")
    n = tc.define("def scale(int32 n, float(N) X) -> (Z) { Z(i) = X(i) * float(n) }")
    with pytest.raises(TcArgumentError, match="'n' is int32 but the argument is the float 0.5"):
        n.lowered_gpu(0.5, x, backend="cuda")
