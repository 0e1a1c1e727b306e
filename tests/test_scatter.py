"""Scatters (polyhedral.scatter): a sum selected by ``index == value read from data`` runs once per
point of its other indices, at the element the data names, instead of testing the equality over
the index's whole range. Checked against numpy's ``np.add.at`` and the interpreter (which runs the
equality form as written): duplicate and out-of-range values, extra conditions, products, a
temporary target, float64, widths that are not whole vectors, every fusion strategy; and that the
lowered code has no loop over the scattered index.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.options import MappingOptions

sys.path.insert(0, str(Path(__file__).parent))
from tolerance import assert_sum_close  # noqa: E402

pytestmark = pytest.mark.cpu

BAG = """
def bag(float(V, D) Table, int64(B, L) Idx) -> (Bag) {
    Bag(b, d) +=! Table(Idx(b, r_l), d)
}
"""


def _lowered_text(k: tc.Kernel, *args: object, options: MappingOptions | None = None) -> str:
    low = k.lowered(*args, options=options)
    return str(low.passes[-1][1])


@pytest.mark.parametrize("dtype,idx_type,D", [("float32", "int64", 64), ("float32", "int32", 37),
                                              ("float64", "int64", 5)])
def test_the_gradient_of_an_embedding_bag_is_a_scatter(dtype: str, idx_type: str, D: int) -> None:
    ctype = {"float32": "float", "float64": "double"}[dtype]
    k = tc.define(BAG.replace("float(", f"{ctype}(").replace("int64", idx_type))
    V, B, L = 301, 9, 7
    rng = np.random.default_rng(0)
    idx = rng.integers(0, V, (B, L)).astype(idx_type)
    idx[0, :3] = 5  # repeated rows add up
    table = rng.standard_normal((V, D)).astype(dtype)
    d_bag = rng.standard_normal((B, D)).astype(dtype)
    bw = tc.define(k.backward_source())
    got = bw(table, idx, d_bag)

    def scatter(d: np.ndarray) -> np.ndarray:
        out = np.zeros((V, D), d.dtype)
        np.add.at(out, idx.reshape(-1), np.repeat(d, L, axis=0))
        return out

    assert_sum_close(got, scatter, d_bag, terms=B * L)
    assert got[5].any() and not got[np.setdiff1d(np.arange(V), idx)].any()
    text = _lowered_text(bw, table, idx, d_bag)
    assert "data(" in text
    assert f"<= {V - 1})" not in text.split("init1")[-1], text  # no loop over the table's rows around the scatter
    shown = str(bw.explain(table, idx, d_bag))
    assert "is a scatter" in shown and re.search(r"a scatter: x0 = [a-z0-9(]*Idx\(b, r_l\)", shown)


EQUALITY = """
def pick(float(V, D) Seed, float(B, D) G, int32(B) Idx, float(B) M, float(B) W) -> (T) {
    T(x, d) +=! ((x == Idx(b)) && (M(b) > 0.0)) ? W(b) * G(b, d) : 0.0 where x in 0:V, d in 0:D, b in 0:B
}
"""


def _inputs(V: int, D: int, B: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(-3, V + 3, B).astype(np.int32)  # some values outside 0:V: the equality never holds
    idx[:4] = [-1, V, V + 2, 2]
    return [rng.standard_normal((V, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32), idx,
            rng.standard_normal(B).astype(np.float32), rng.standard_normal(B).astype(np.float32)]


@pytest.mark.parametrize("fusion", [None, "max", "preserve", "min"])
def test_equality_selected_sums_keep_their_meaning(fusion: str | None) -> None:
    """Values outside the index's range add nothing (the equality form's meaning), the other
    conditions still hold, and a product stays a product, under every fusion strategy."""
    k = tc.define(EQUALITY)
    V, D, B = 23, 19, 41
    args = _inputs(V, D, B)
    _, g, idx, m, w = args
    opts = MappingOptions(fusion=fusion) if fusion else None
    got = k(*args, options=opts)

    def picked(g: np.ndarray, w: np.ndarray) -> np.ndarray:
        out = np.zeros((V, D), g.dtype)
        for b in range(B):
            if 0 <= idx[b] < V and m[b] > 0:
                out[idx[b]] += w[b] * g[b]
        return out

    assert_sum_close(got, picked, g, w, terms=B)
    assert_sum_close(k(*args, backend="numpy"), picked, g, w, terms=B)
    assert "data(" in _lowered_text(k, *args, options=opts)


def test_a_scattered_temporary_feeds_later_statements() -> None:
    k = tc.define("""
def onehot(float(B, D) G, int64(B) Idx, float(V) S) -> (O) {
    T(x, d) +=! (x == Idx(b)) ? G(b, d) : 0.0 where x in 0:V, d in 0:D, b in 0:B
    O(x, d) = T(x, d) * S(x)
}
""")
    rng = np.random.default_rng(1)
    V, D, B = 50, 33, 200
    g, idx, s = rng.standard_normal((B, D)).astype(np.float32), rng.integers(0, V, B), \
        rng.standard_normal(V).astype(np.float32)

    def scaled(g: np.ndarray, s: np.ndarray) -> np.ndarray:
        out = np.zeros((V, D), g.dtype)
        np.add.at(out, idx, g)
        return out * s[:, None]

    assert_sum_close(k(g, idx, s), scaled, g, s, terms=B)


def test_an_index_used_beside_the_equality_is_not_scattered() -> None:
    """The index also scales the value: the sum keeps its loop over the index's range."""
    k = tc.define("""
def scaled(float(B, D) G, int32(B) Idx) -> (T) {
    T(x, d) +=! (x == Idx(b)) ? G(b, d) * float(x) : 0.0 where x in 0:7, d in 0:D, b in 0:B
}
""")
    rng = np.random.default_rng(2)
    g, idx = rng.standard_normal((11, 4)).astype(np.float32), rng.integers(0, 7, 11).astype(np.int32)

    def scaled(g: np.ndarray) -> np.ndarray:
        out = np.zeros((7, 4), g.dtype)
        np.add.at(out, idx, g * idx[:, None])
        return out

    assert_sum_close(k(g, idx), scaled, g, terms=11)
    assert "data(" not in _lowered_text(k, g, idx)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,idx_type", [("float32", "int64"), ("float64", "int32"), ("int32", "int32")])
def test_gpu_scatters_add_atomically_in_parallel(dtype: str, idx_type: str) -> None:
    """On the GPU mappings the table's initialisation is a kernel of its own and the scatter runs
    every (bag, position) point in parallel, adding atomically (OpenCL: PoCL on any machine, against
    np.add.at, duplicate, negative and out-of-range rows included); the CUDA text uses atomicAdd and
    compiles for sm_90 with no spills, and runs where a CUDA device is."""
    from conftest import has_cuda, has_opencl

    from tcdsl.codegen import nvrtc
    from tcdsl.polyhedral import gpucheck

    ctype = {"float32": "float", "float64": "double", "int32": "int32"}[dtype]
    k = tc.define(f"""
def bag_grad({ctype}(B, D) G, {idx_type}(B, L) Idx) -> (T) {{
    T(x, d) +=! (x == Idx(b, l)) ? G(b, d) : {ctype}(0) where x in 0:V, d in 0:D, b in 0:B, l in 0:L
}}
""".replace("0:V", "0:203"))
    rng = np.random.default_rng(3)
    V, B, L, D = 203, 19, 11, 37
    idx = rng.integers(-2, V + 2, (B, L)).astype(idx_type)
    idx[0, :4] = 7  # one row many times: the atomic additions meet
    g = (rng.standard_normal((B, D)) * 8).astype(dtype)

    def scatter(g: np.ndarray) -> np.ndarray:
        out = np.zeros((V, D), g.dtype)
        inside = (idx >= 0) & (idx < V)
        np.add.at(out, idx[inside], np.repeat(g[:, None, :], L, axis=1)[inside])
        return out

    low = k.lowered_gpu(g, idx, backend="opencl")
    program = str(low.program)
    assert len(low.source.kernels) == 2 and f"tc_atomic_add_{dtype}(&" in low.source.text, program
    scatter_kernel = program.split("kernel ")[2]
    assert scatter_kernel.count("threads.") == 2, program  # b and l: the points run in parallel
    for kern in low.program.kernels:  # the race oracle: atomic additions race with nothing
        assert gpucheck.races(kern, low.scop) == [], kern.name
    if has_opencl():
        got = k(g, idx, backend="opencl")
        if dtype == "int32":
            np.testing.assert_array_equal(got, scatter(g))
        else:
            assert_sum_close(got, scatter, g, terms=B * L)
    if nvrtc.available():
        text = k.lowered_gpu(g, idx, backend="cuda").source.text
        assert f"tc_atomic_add_{dtype}(&" in text
        out = nvrtc.compile_cuda(text, "sm_90")
        assert all(v == 0 for v in out.spills().values()), out.log
    if has_cuda():  # pragma: no cover - runs where a GPU is
        import cupy

        got = cupy.asnumpy(k(cupy.asarray(g), cupy.asarray(idx)))
        if dtype == "int32":
            np.testing.assert_array_equal(got, scatter(g))
        else:
            assert_sum_close(got, scatter, g, terms=B * L)
