"""Empty reductions and zero sizes on every backend: a ``!`` reduction over no points gives its
identity (0, 1, +inf/-inf, the integer type's max/min) in every dtype, whatever the freshly
allocated or ``out=`` memory held; zero-size outputs come back empty with the right shape; and
run-time checks report the real value (an int64 gather index whole) even along a dim no address
depends on. The C backend is marked ``cpu``, OpenCL (PoCL) ``gpu``; the CUDA text is checked to
hold the same initialisation and compiled with NVRTC where it is installed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import islpy as isl
import numpy as np
import pytest

import tcdsl as tc
from tcdsl import gpurt
from tcdsl.codegen import nvrtc
from tcdsl.options import MappingOptions

try:
    from conftest import has_opencl
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import has_opencl

needs_opencl = pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform (apt install pocl-opencl-icd)")
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install nvidia-cuda-nvrtc)")

BACKENDS = [pytest.param("c", marks=pytest.mark.cpu, id="c"),
            pytest.param("opencl", marks=[pytest.mark.gpu, needs_opencl], id="opencl")]
OPS = {"+=!": "+", "*=!": "*", "min=!": "min", "max=!": "max"}
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool"]
SOME_DTYPES = ["float32", "float16", "int64", "uint8"]
GARBAGE = 7  # every byte of fresh memory in these tests


def identity(op: str, dtype: str) -> np.generic:
    """What a reduction over no points gives, written out from numpy's type limits."""
    dt = np.dtype(dtype)
    if op in ("+=!", "*=!"):
        return dt.type(0 if op == "+=!" else 1)
    low = op == "max=!"
    if dt == np.bool_:
        return dt.type(not low)
    if dt.kind == "f":
        return dt.type(-np.inf if low else np.inf)
    info = np.iinfo(dt)
    return dt.type(info.min if low else info.max)


@pytest.fixture
def garbage(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fresh host arrays (np.empty) and fresh OpenCL buffers hold GARBAGE bytes, not zeros."""
    real_empty = np.empty

    def empty(*args: Any, **kwargs: Any) -> np.ndarray:
        a = real_empty(*args, **kwargs)
        if a.dtype.kind != "O":
            a.reshape(-1).view(np.uint8).fill(GARBAGE)
        return a

    monkeypatch.setattr(np, "empty", empty)
    if has_opencl():
        cl, _, queue = gpurt.opencl()
        real_buffer = cl.Buffer

        def buffer(context: Any, flags: Any, size: int = 0, hostbuf: Any = None) -> Any:
            b = real_buffer(context, flags, size=size, hostbuf=hostbuf)
            if hostbuf is None:
                cl.enqueue_fill_buffer(queue, b, np.uint8(GARBAGE), 0, size)
            return b

        monkeypatch.setattr(cl, "Buffer", buffer)
    yield


def run(k: Any, args: list[np.ndarray], backend: str, want: np.ndarray, **kw: Any) -> None:
    """``k`` on ``backend`` gives exactly ``want``: twice in a row, and into ``out=`` buffers filled
    with garbage (the C backend writes those in place)."""
    for _ in range(2):
        got = k(*args, backend=backend, **kw)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    out = np.full(want.shape, GARBAGE, want.dtype)
    assert k(*args, backend=backend, out=out, **kw) is out
    np.testing.assert_array_equal(out, want)


def typed(src: str, op: str, dtype: str) -> Any:
    return tc.define(src.replace("OP", op).replace("T(", f"{dtype}("))


# ---- reductions over no points ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_reduction_over_an_empty_dim_is_the_identity(backend: str, op: str, dtype: str, garbage: None):
    k = typed("def rs(T(N, K) A) -> (S) { S(i) OP A(i, r_j) }", op, dtype)
    run(k, [np.zeros((5, 0), dtype)], backend, np.full(5, identity(op, dtype), dtype))


@pytest.mark.parametrize("dtype", SOME_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_full_reduction_to_a_scalar_over_no_points(backend: str, op: str, dtype: str, garbage: None):
    k = typed("def total(T(N, K) A) -> (S) { S OP A(r_i, r_j) }", op, dtype)
    run(k, [np.zeros((3, 0), dtype)], backend, np.array(identity(op, dtype), dtype))


@pytest.mark.parametrize("dtype", SOME_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_where_range_is_the_identity(backend: str, op: str, dtype: str, garbage: None):
    # every size is positive; the where clause alone leaves the reduction no points (K - 3 = 0)
    k = typed("def w(T(N, K) A) -> (S) { S(i) OP A(i, r_j) where r_j in 0:K - 3 }", op, dtype)
    run(k, [np.ones((4, 3), dtype)], backend, np.full(4, identity(op, dtype), dtype))


def _padded(op: str, dtype: str, a: np.ndarray, n_out: int, offset: int, window: int) -> np.ndarray:
    """S(i) OP A(i + r + offset) for r in 0:window, over the in-bounds points only (numpy)."""
    fold = {"+=!": np.add, "*=!": np.multiply, "min=!": np.minimum, "max=!": np.maximum}[op]
    out = np.full(n_out, identity(op, dtype), dtype)
    for i in range(n_out):
        for r in range(window):
            if 0 <= i + r + offset < a.shape[0]:
                out[i] = fold(out[i], a[i + r + offset])
    return out


@pytest.mark.parametrize("dtype", SOME_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_by_domain_that_leaves_points_without_terms(backend: str, op: str, dtype: str, garbage: None):
    a = np.array([3, 1, 2], dtype)
    # partly: S(3..6) lie past A's end and reduce nothing
    k = typed("def pad(T(N) A) -> (S) { S(i) OP A(i + r) where i in 0:N + 4, r in 0:2 }", op, dtype)
    run(k, [a], backend, _padded(op, dtype, a, 7, 0, 2))
    # wholly: every read is out of bounds, so the reduction never runs
    k = typed("def off(T(N) A) -> (S) { S(i) OP A(i + r + 5) where i in 0:N, r in 0:2 }", op, dtype)
    want = _padded(op, dtype, a, 3, 5, 2)
    assert (want == identity(op, dtype)).all()
    run(k, [a], backend, want)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_rows_without_terms_under_every_mapping(backend: str, op: str, garbage: None):
    # rows 0..3 and 9..12 of O read nothing of A: tiles that hold O in registers must not start
    # them from anything but the identity
    k = typed("def p(T(N, M) A) -> (O) { O(i, j) OP A(i + r - 6, j) where i in 0:N + 8, r in 0:3 }", op, "float32")
    a = (np.arange(5 * 40) % 7 + 1).astype(np.float32).reshape(5, 40)
    want = np.stack([_padded(op, "float32", a[:, j], 13, -6, 3) for j in range(40)], axis=1)
    for opts in _options(backend):
        run(k, [a], backend, want, options=opts)


# ---- contractions and temporaries ---------------------------------------------------------------

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
C_OPTIONS = [None, MappingOptions(tile=(4, 8, 2)), MappingOptions(tile=(4, 16, 4), register_tile=(2, 16)),
             MappingOptions(register_tile=(6, 32)), MappingOptions(fusion="max"), MappingOptions(vectorize=False),
             MappingOptions(openmp=False), MappingOptions(tile=(0, 0, 0), point_order=(2, 0, 1))]
GPU_OPTIONS = [None, MappingOptions(private_memory=False), MappingOptions(shared_memory=False),
               MappingOptions(tile=(4, 4, 4), threads=(4, 4), blocks=(2, 2)),
               MappingOptions(tile=(2, 8, 1), threads=(8, 2), blocks=(1, 1))]


def _options(backend: str) -> list[MappingOptions | None]:
    return C_OPTIONS if backend == "c" else GPU_OPTIONS


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_with_k_zero_is_zeros_under_every_mapping(backend: str, garbage: None):
    for dtype, (m, n) in (("float32", (6, 40)), ("float64", (33, 70)), ("int32", (5, 17))):
        k = tc.define(MATMUL.replace("float(", f"{dtype}("))
        for opts in _options(backend):
            run(k, [np.ones((m, 0), dtype), np.ones((0, n), dtype)], backend, np.zeros((m, n), dtype),
                options=opts)
    # weights stored as PyTorch stores them (the transposed-operand form)
    kt = tc.define("def lin(float(M, K) A, float(N, K) W) -> (C) { C(m, n) +=! A(m, r_k) * W(n, r_k) }")
    run(kt, [np.ones((6, 0), np.float32), np.ones((40, 0), np.float32)], backend, np.zeros((6, 40), np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_reductions_feeding_later_statements(backend: str, garbage: None):
    relu = tc.define("def f(float(M, K) A, float(K, N) B) -> (C) {\n"
                     "  T(m, n) +=! A(m, r_k) * B(r_k, n)\n  C(m, n) = max(T(m, n), 0.0) + 1.0\n}")
    for opts in _options(backend):
        run(relu, [np.ones((6, 0), np.float32), np.ones((0, 40), np.float32)], backend,
            np.ones((6, 40), np.float32), options=opts)
    two = tc.define("def g(float(N, K) A) -> (O) { M(i) max=! A(i, r)\n S(i) +=! A(i, r)\n O(i) = S(i) - M(i) }")
    run(two, [np.ones((5, 0), np.float32)], backend, np.full(5, np.inf, np.float32))
    scalar = tc.define("def h(float(N, K) A) -> (O) { S +=! A(r_i, r_j)\n O(i) = S + 2.0 where i in 0:N }")
    run(scalar, [np.ones((5, 0), np.float32)], backend, np.full(5, 2.0, np.float32))
    conv = tc.define("def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
                     "  O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * Wt(f, r_c, r_kh, r_kw)\n}")
    for opts in _options(backend):
        run(conv, [np.ones((1, 0, 6, 6), np.float32), np.ones((3, 0, 3, 3), np.float32)], backend,
            np.zeros((1, 3, 4, 4), np.float32), options=opts)


# ---- zero-size outputs --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_outputs_come_back_empty_with_their_shape(backend: str, garbage: None):
    k = tc.define(MATMUL)
    for a, b, shape in (((0, 4), (4, 40), (0, 40)), ((5, 4), (4, 0), (5, 0)), ((0, 0), (0, 0), (0, 0))):
        for opts in _options(backend):
            run(k, [np.ones(a, np.float32), np.ones(b, np.float32)], backend, np.zeros(shape, np.float32),
                options=opts)
    for op in OPS:
        rs = typed("def rs(T(N, K) A) -> (S) { S(i) OP A(i, r_j) }", op, "int32")
        run(rs, [np.ones((0, 4), np.int32)], backend, np.zeros(0, np.int32))
    chain = tc.define("def ch(float(N) A) -> (O) { T(i) = A(i) * 2.0\n O(i) = T(i) + 1.0 }")
    run(chain, [np.ones(0, np.float32)], backend, np.zeros(0, np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_size_that_leaves_other_statements_work(backend: str, garbage: None):
    k = tc.define("def catc(float(R, N) A, float(R, M) B) -> (O) {\n"
                  "  O(r, j) = j < N ? A(r, j) : B(r, j - N) where j in 0:N + M\n}")
    a, b = np.zeros((3, 0), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    run(k, [a, b], backend, np.concatenate([a, b], axis=1))


def test_scop_of_a_zero_size_keeps_the_initialisation():
    from tcdsl.polyhedral.scop import build_scop

    k = tc.define("def rs(float(N, K) A) -> (S) { S(i) +=! A(i, r_j) }")
    scop = build_scop(k.instance(np.zeros((5, 0), np.float32)))
    points: dict[str, int] = {}
    scop.domain.foreach_set(lambda s: points.__setitem__(s.get_tuple_name(), s.count_val().to_python()))
    assert points == {"init1": 5}
    assert scop.general is not None and scop.general.context.is_subset(isl.Set(
        "[p_N, p_K] -> { : p_N >= 0 and p_K >= 0 }"))


# ---- the CUDA text ------------------------------------------------------------------------------


def _body(text: str) -> str:
    return text[text.index("// t0:"):]


@pytest.mark.parametrize("op", OPS)
def test_cuda_text_initialises_like_opencl(op: str):
    k = typed("def rs(T(N, K) A) -> (S) { S(i) OP A(i, r_j) }", op, "float32")
    a = np.zeros((5, 0), np.float32)
    cuda, opencl = (k.source(a, backend=b) for b in ("cuda", "opencl"))
    assert "init of statement 1" in cuda
    assert _body(cuda) == _body(opencl)
    if nvrtc.available():
        assert nvrtc.compile_cuda(cuda).cubin[:4] == b"\x7fELF"


# ---- run-time checks report the real value ------------------------------------------------------

GATHER = "def g(float(V, D) T, IDX(B) I) -> (O) { O(b, d) = T(I(b), d) }"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [2**32 + 7, -(2**40) - 3, 2**62 + 1, 9])
def test_int64_gather_out_of_range_reports_the_whole_index(backend: str, value: int):
    k = tc.define(GATHER.replace("IDX", "int64"))
    idx = np.array([0, value], np.int64)
    with pytest.raises(tc.TcRuntimeError, match=rf"dim 0 of 'T' is read at {value}, outside 0:4"):
        k(np.ones((4, 3), np.float32), idx, backend=backend)


@needs_nvrtc
def test_cuda_error_flags_keep_the_value_as_int64():
    k = tc.define(GATHER.replace("IDX", "int64"))
    text = k.source(np.ones((4, 3), np.float32), np.zeros(2, np.int64), backend="cuda")
    assert "int64_t" in text[text.index("tc_fail"):text.index("tc_chk")]
    nvrtc.compile_cuda(text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_checks_hold_where_no_address_depends_on_the_index(backend: str):
    k = tc.define(GATHER.replace("IDX", "int32"))
    row = np.arange(3, dtype=np.float32)
    cases: list[tuple[np.ndarray, int, int]] = [
        (np.broadcast_to(row, (4, 3)), 6, 4),  # dim 0 of stride 0
        (np.zeros((0, 3), np.float32), 1, 0),  # an empty table
    ]
    for table, bad, extent in cases:
        with pytest.raises(tc.TcRuntimeError, match=rf"read at {bad}, outside 0:{extent}"):
            k(table, np.array([bad, bad], np.int32), backend=backend)
    got = k(np.broadcast_to(row, (4, 3)), np.array([3, 1], np.int32), backend=backend)
    np.testing.assert_array_equal(got, np.stack([row, row]))

