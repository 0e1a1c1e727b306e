"""The reference interpreter (``backend="numpy"``) against hand-written numpy.

Every def of the shared corpus (``tests/defs.py``) runs on plain, strided, reversed, sliced and
big-endian inputs and with tiny chunks; run-time errors (out-of-range gathers, integer division by
zero) are checked for class, message and location; large boxes are checked for chunked results.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl import interp
from tcdsl.errors import TcArgumentError, TcError, TcRuntimeError

try:  # pytest's default (prepend) import mode puts tests/ on sys.path; other modes may not
    from defs import DEFS, Arr, Case, assert_matches, make_inputs
    from tolerance import assert_sum_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from defs import DEFS, Arr, Case, assert_matches, make_inputs
    from tolerance import assert_sum_close

CASES = {c.name: c for c in DEFS}


def run_case(case: Case, args: list, **kw):
    return tc.define(case.source)(*args, backend="numpy", **kw)


# ---- the corpus ----------------------------------------------------------------------------------


def test_corpus_is_broad_and_well_formed():
    assert len(DEFS) >= 35
    assert len(CASES) == len(DEFS), "case names must be unique"
    for c in DEFS:
        assert isinstance(c, tuple) and len(c) == 5
        assert c.source.lstrip().startswith("def "), c.name
        assert c.tol >= 0, c.name


@pytest.mark.parametrize("case", DEFS, ids=[c.name for c in DEFS])
def test_def(case: Case):
    args = make_inputs(case.inputs)
    want = case.reference(*args)
    got = run_case(case, args)
    assert_matches(got, want, case.tol, case.name)


@pytest.mark.parametrize("case", DEFS, ids=[c.name for c in DEFS])
def test_def_other_seed_and_tiny_chunks(case: Case, monkeypatch: pytest.MonkeyPatch):
    """Chunks of 7 points split every box (reduction axes included) at odd places."""
    monkeypatch.setattr(interp, "CHUNK", 7)
    args = make_inputs(case.inputs, seed=1)
    want = case.reference(*args)
    got = run_case(case, args)
    assert_matches(got, want, case.tol, case.name)


# ---- layouts: any strides, any byte order --------------------------------------------------------


def _fortran(a: np.ndarray) -> np.ndarray:
    return a.T.copy().T if a.ndim >= 2 else a


def _negative(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a
    v = np.flip(np.flip(a).copy())
    assert all(s < 0 for s in v.strides) or a.size <= 1
    return v


def _sliced(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a
    big = np.zeros(tuple(2 * n + 1 for n in a.shape), dtype=a.dtype)
    view = big[tuple(slice(1, None, 2) for _ in a.shape)]
    view[...] = a
    assert not view.flags.c_contiguous or a.size <= 1
    return view


def _big_endian(a: np.ndarray) -> np.ndarray:
    b = a.astype(a.dtype.newbyteorder(">"))
    assert a.dtype.itemsize == 1 or not b.dtype.isnative
    return b


def _mixed(a: np.ndarray) -> np.ndarray:
    return _big_endian(_negative(a)) if a.ndim >= 1 else _big_endian(a)


LAYOUTS = {"fortran": _fortran, "negative": _negative, "sliced": _sliced, "big_endian": _big_endian,
           "mixed": _mixed}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", DEFS, ids=[c.name for c in DEFS])
def test_def_any_layout(case: Case, layout: str):
    args = make_inputs(case.inputs)
    want = case.reference(*args)
    strange = [LAYOUTS[layout](a) if isinstance(a, np.ndarray) else a for a in args]
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in strange]
    got = run_case(case, strange)
    assert_matches(got, want, case.tol, f"{case.name} ({layout})")
    for b, a in zip(before, strange):  # inputs are read, never written
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


def test_big_endian_float64_and_int64():
    k = tc.define("def f(double(N) D, int64(N) L) -> (O) { O(i) = D(i) * L(i) }")
    D = np.linspace(-3, 3, 7)
    L = np.arange(-3, 4, dtype=np.int64) * (1 << 35)
    got = k(D.astype(">f8"), L.astype(">i8"))
    assert got.dtype == np.float64 and got.dtype.isnative
    np.testing.assert_array_equal(got, D * L)


def test_transposed_view_matmul():
    A = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    B = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    mm = tc.define(CASES["matmul"].source)
    got = mm(A.T, B.T)  # (4, 6) x (6, 5), both views with swapped strides
    assert_sum_close(got, np.matmul, A.T, B.T, terms=6)
    assert got.dtype == np.float32 and got.shape == (4, 5)


# ---- scalars and dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.75, np.float32(0.75), np.array(0.75, dtype=np.float32), 3],
                         ids=["python_float", "np_float32", "0d_array", "python_int"])
def test_rank0_param_forms(alpha):
    k = tc.define(CASES["scalar_param"].source)
    X = np.arange(9, dtype=np.float32) - 4
    Y = np.full(9, 0.5, dtype=np.float32)
    got = k(alpha, X, Y)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.float32(alpha) * X + Y)


def test_rank0_output_is_0d_array():
    k = tc.define(CASES["dot_rank0"].source)
    a = np.arange(5, dtype=np.float32)
    got = k(a, a)
    assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == np.float32
    assert float(got) == 30.0


def test_float32_stays_float32():
    k = tc.define("def f(float(N) A, int32(N) K) -> (O1, O2, O3, O4, O5, O6) {\n"
                  "    O1(i) = A(i) * N\n"
                  "    O2(i) = A(i) / 3\n"
                  "    O3(i) = A(i) + 1\n"
                  "    O4(i) = exp(K(i))\n"
                  "    O5(i) = K(i) * 0.5\n"
                  "    O6 +=! A(i) * 1e-3\n"
                  "}")
    A = np.linspace(-1, 1, 8, dtype=np.float32)
    K = np.arange(-4, 4, dtype=np.int32)
    o = k(A, K)
    assert [x.dtype for x in o] == [np.dtype(np.float32)] * 6
    np.testing.assert_allclose(o[0], A * np.float32(8), rtol=1e-7)
    np.testing.assert_allclose(o[1], A / np.float32(3), rtol=1e-7)
    np.testing.assert_allclose(o[2], A + np.float32(1), rtol=1e-7)
    np.testing.assert_allclose(o[3], np.exp(K.astype(np.float32)), rtol=1e-6)
    np.testing.assert_array_equal(o[4], K.astype(np.float32) * np.float32(0.5))
    assert_sum_close(o[5], lambda A: (A * 1e-3).sum(), A, terms=8)


def test_float_division_by_zero_is_ieee_without_warnings():
    k = tc.define("def d(float(N) A, float(N) B) -> (O) { O(i) = A(i) / B(i) }")
    A = np.array([1.0, -1.0, 0.0, 2.0], dtype=np.float32)
    B = np.array([0.0, 0.0, 0.0, 4.0], dtype=np.float32)
    got = k(A, B)
    np.testing.assert_array_equal(got, np.array([np.inf, -np.inf, np.nan, 0.5], dtype=np.float32))


def test_results_are_fresh_arrays():
    k = tc.define(CASES["outer"].source)
    a = np.ones(3, np.float32)
    first = k(a, a)
    first[...] = 7
    second = k(a, a)
    np.testing.assert_array_equal(second, np.ones((3, 3), np.float32))
    assert second.flags.writeable and second.flags.c_contiguous


def test_short_form_decorator_on_numpy():
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A = np.arange(6, dtype=np.float32).reshape(2, 3)
    B = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = matmul(A, B, backend="numpy")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, A @ B)


# ---- run-time errors: gathers ---------------------------------------------------------------------

GATHER = ("def g(float(V, D) Tab, int32(B) Idx) -> (O, P) {\n"
          "    P(b) = 1.0 where exists Idx(b)\n"
          "    O(b, d) = Tab(Idx(b), d) * 2.0\n"
          "}")


@pytest.mark.parametrize("bad", [5, 10, -1])
def test_gather_out_of_range_raises(bad: int):
    k = tc.define(GATHER, filename="model.tc")
    Tab = np.ones((4, 2), np.float32)
    Idx = np.array([0, 3, bad, 1], np.int32)
    with pytest.raises(TcRuntimeError) as ei:
        k(Tab, Idx)
    e = ei.value
    assert isinstance(e, TcError)
    assert "'Tab'" in e.message
    assert "statement 2" in e.message
    assert f"at {bad}," in e.message and "0:4" in e.message
    assert e.location is not None
    assert (e.location.file, e.location.line, e.location.col) == ("model.tc", 3, 15)
    assert e.location.source_line == "    O(b, d) = Tab(Idx(b), d) * 2.0"
    assert str(e).startswith("model.tc:3:15: ")
    assert str(e).splitlines()[1].strip() == "O(b, d) = Tab(Idx(b), d) * 2.0"
    assert str(e).splitlines()[2].index("^") == str(e).splitlines()[1].index("Tab")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is TcRuntimeError and str(back) == str(e)


def test_gather_out_of_range_in_reduction_and_nested_gather():
    bag = tc.define(CASES["embedding_bag"].source)
    Tab = np.ones((10, 4), np.float32)
    Idx = np.zeros((3, 5), np.int64)
    Idx[2, 4] = 10
    with pytest.raises(TcRuntimeError, match=r"'Tab'.*10.*0:10"):
        bag(Tab, Idx)
    gg = tc.define(CASES["gather_of_gather"].source)
    A = np.arange(9, dtype=np.float32)
    with pytest.raises(TcRuntimeError) as ei:  # the inner gather Pm(Qi(i)) is the bad one
        gg(A, np.zeros(6, np.int32), np.array([0, 1, 6, 2], np.int32))
    assert "'Pm'" in ei.value.message and "6" in ei.value.message
    assert (ei.value.location.line, ei.value.location.col) == (1, 64)
    with pytest.raises(TcRuntimeError) as ei:  # the outer one
        gg(A, np.array([0, 9, 0, 0, 0, 0], np.int32), np.array([0, 1, 2, 3], np.int32))
    assert "'A'" in ei.value.message and "9" in ei.value.message
    assert (ei.value.location.line, ei.value.location.col) == (1, 62)


def test_gather_excluded_by_ternary_does_not_raise():
    k = tc.define("def g(float(V) Tab, int32(B) Idx) -> (O, L, R) {\n"
                  "    O(b) = Idx(b) >= 0 && Idx(b) < V ? Tab(Idx(b)) : -1.0\n"
                  "    L(b) = Idx(b) >= 0 && Idx(b) < V && Tab(Idx(b)) > 1.5 ? 1 : 0\n"
                  "    R(b) = Idx(b) < 0 || Idx(b) >= V ? 0.0 : e * e where e = Tab(Idx(b))\n"
                  "}")
    Tab = np.array([1.0, 2.0, 3.0], np.float32)
    Idx = np.array([0, -1, 2, 3, 1, -5], np.int32)
    O, L, R = k(Tab, Idx)
    ok = (Idx >= 0) & (Idx < 3)
    safe = np.clip(Idx, 0, 2)
    np.testing.assert_array_equal(O, np.where(ok, Tab[safe], np.float32(-1)))
    np.testing.assert_array_equal(L, np.array([0, 0, 1, 0, 1, 0], np.int32))
    np.testing.assert_array_equal(R, np.where(ok, Tab[safe] ** 2, np.float32(0)))


def test_gather_in_taken_branch_still_raises():
    k = tc.define("def g(float(V) Tab, int32(B) Idx) -> (O) {\n"
                  "    O(b) = Idx(b) >= 0 ? -1.0 : Tab(Idx(b))\n"
                  "}")
    with pytest.raises(TcRuntimeError) as ei:
        k(np.ones(3, np.float32), np.array([0, -2, 1], np.int32))
    assert "'Tab'" in ei.value.message and "-2" in ei.value.message
    assert (ei.value.location.line, ei.value.location.col) == (2, 33)


# ---- run-time errors: integer division by zero ------------------------------------------------------


@pytest.mark.parametrize("op,word", [("/", "division"), ("%", "modulo")])
def test_integer_division_by_zero_raises(op: str, word: str):
    src = ("def q(int32(N) A, int32(N) B) -> (Q) {\n"
           f"    Q(i) = 1 + A(i) {op} B(i)\n"
           "}")
    k = tc.define(src)
    with pytest.raises(TcRuntimeError) as ei:
        k(np.arange(3, dtype=np.int32), np.array([1, 0, 2], np.int32))
    e = ei.value
    assert "by zero" in e.message and word in e.message
    assert "statement 1" in e.message
    assert (e.location.file, e.location.line, e.location.col) == ("<string>", 2, 16)
    assert str(e).startswith("<string>:2:16: ")


def test_integer_division_by_zero_in_reduction_raises():
    k = tc.define("def q(int32(N, K) A, int32(K) B) -> (S) { S(i) +=! A(i, k) / B(k) }")
    with pytest.raises(TcRuntimeError, match="division by zero"):
        k(np.ones((2, 3), np.int32), np.array([1, 2, 0], np.int32))


def test_integer_division_guarded_by_ternary_does_not_raise():
    k = tc.define("def q(int32(N) A, int32(N) B) -> (Q, R) {\n"
                  "    Q(i) = B(i) != 0 ? A(i) / B(i) : 0\n"
                  "    R(i) = B(i) == 0 || A(i) % B(i) == 0 ? 1 : 0\n"
                  "}")
    A = np.array([7, -7, 6, 5], np.int32)
    B = np.array([2, 0, -3, 0], np.int32)
    Q, R = k(A, B)
    np.testing.assert_array_equal(Q, np.array([3, 0, -2, 0], np.int32))
    np.testing.assert_array_equal(R, np.array([0, 1, 1, 1], np.int32))


def test_argument_errors_are_tc_errors():
    k = tc.define(CASES["matmul"].source)
    with pytest.raises(TcArgumentError, match="K"):
        k(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(TcArgumentError, match="float64"):
        k(np.ones((2, 3)), np.ones((3, 2), np.float32))


# ---- large boxes are chunked ----------------------------------------------------------------------


def test_large_matmul_300():
    rng = np.random.default_rng(7)
    A = rng.standard_normal((300, 300)).astype(np.float32)
    B = rng.standard_normal((300, 300)).astype(np.float32)
    got = tc.define(CASES["matmul"].source)(A, B)
    assert got.dtype == np.float32
    assert_sum_close(got, np.matmul, A, B, terms=300)


def test_large_matmul_300_general_path():
    """Not a pure product (``+ 0.0``, ``max=!``): evaluated point-wise over 27M points in chunks."""
    rng = np.random.default_rng(8)
    A = rng.standard_normal((300, 300)).astype(np.float32)
    B = rng.standard_normal((300, 300)).astype(np.float32)
    k = tc.define("def mm(float(M, K) A, float(K, N) B) -> (C, T) {\n"
                  "    C(m, n) +=! A(m, k) * B(k, n) + 0.0\n"
                  "    T(m, n) max=! A(m, k) + B(k, n)\n"
                  "}")
    C, T = k(A, B)
    assert_sum_close(C, np.matmul, A, B, terms=300)
    want = np.concatenate([(A[s:s + 50, :, None] + B[None]).max(axis=1) for s in range(0, 300, 50)])
    np.testing.assert_array_equal(T, want)


def test_large_broadcast_elementwise():
    rng = np.random.default_rng(9)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for n in (160, 150, 140))
    assert 160 * 150 * 140 > 2 ** 21
    k = tc.define("def bc(float(I) a, float(J) b, float(K) c) -> (O) { O(i, j, k) = a(i) * b(j) + c(k) }")
    got = k(a, b, c)
    assert got.dtype == np.float32 and got.shape == (160, 150, 140)
    np.testing.assert_array_equal(got, a[:, None, None] * b[None, :, None] + c[None, None, :])


def test_large_full_reduction_split_on_reduction_axes():
    A = (np.arange(170 * 160 * 150, dtype=np.int64) % 13 - 6).astype(np.int32).reshape(170, 160, 150)
    k = tc.define("def s(int32(I, J, K) A) -> (S, M) {\n"
                  "    S +=! A(i, j, k) * 2 + 1\n"
                  "    M max=! A(i, j, k) * (i - j) + k\n"
                  "}")
    S, M = k(A)
    assert S.dtype == np.int32 and S.shape == ()
    assert int(S) == int((A.astype(np.int64) * 2 + 1).sum())
    i, j, kk = np.ogrid[:170, :160, :150]
    assert int(M) == int((A.astype(np.int64) * (i - j) + kk).max())


def test_large_same_conv_padded_by_domain():
    rng = np.random.default_rng(10)
    I = rng.standard_normal((600, 600)).astype(np.float32)
    K = rng.standard_normal((3, 3)).astype(np.float32)
    k = tc.define("def same(float(H, W) I, float(3, 3) K) -> (O) {\n"
                  "    O(h, w) +=! I(h + kh - 1, w + kw - 1) * K(kh, kw) where h in 0:H, w in 0:W\n"
                  "}")
    got = k(I, K)
    assert got.dtype == np.float32 and got.shape == (600, 600)

    def same(I: np.ndarray, K: np.ndarray) -> np.ndarray:
        P = np.pad(I, 1)
        return sum(P[a:a + 600, b:b + 600] * K[a, b] for a in range(3) for b in range(3))

    assert_sum_close(got, same, I, K, terms=9)


def test_make_inputs_is_deterministic_and_typed():
    spec = (Arr("int8", (4,), -3, 3), Arr("bool", (2, 2)), Arr("float16", (3,)), 2.5)
    a, b = make_inputs(spec, seed=5), make_inputs(spec, seed=5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert [np.asarray(x).dtype for x in a[:3]] == [np.dtype("int8"), np.dtype(bool), np.dtype("float16")]
    assert a[0].min() >= -3 and a[0].max() < 3 and a[3] == 2.5
