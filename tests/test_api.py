"""The public Python API (SPEC section 2) on the numpy backend: tc.define, kernels, libraries, the
short form, call-time checks, out=, caching, text forms and error objects. Every test checks real
numbers against hand-written numpy or exact message fragments and locations."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
from tolerance import assert_sum_close

import tcdsl as tc

MM_SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

# A def whose params sit on their own lines, so a location's line tells which param it names.
MM_MULTILINE = """def mmx(
    float(M, K) A,
    float(K, N) B
) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
"""

LIB_SRC = """def twice(float(N) X) -> (Y) {
  Y(i) = X(i) * 2.0
}
def plus_one(float(N) X) -> (Y) {
  Y(i) = X(i) + 1.0
}
def rowsum(float(M, N) X) -> (S) {
  S(i) +=! X(i, r_j)
}
"""


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def mm() -> tc.Kernel:
    return tc.define(MM_SRC)


@pytest.fixture(scope="module")
def mmx() -> tc.Kernel:
    return tc.define(MM_MULTILINE, filename="mmx.tc")


# ---- tc.define: one def, several defs ------------------------------------------------------------


def test_single_def_returns_callable_kernel(mm: tc.Kernel) -> None:
    assert isinstance(mm, tc.Kernel)
    assert mm.name == "mm"
    A, B = f32(3, 4, seed=1), f32(4, 5, seed=2)
    C = mm(A, B)
    assert C.shape == (3, 5) and C.dtype == np.float32
    assert_sum_close(C, np.matmul, A, B, terms=4)


def test_library_attribute_item_iteration_len() -> None:
    lib = tc.define(LIB_SRC)
    assert isinstance(lib, tc.Library)
    assert len(lib) == 3
    assert [k.name for k in lib] == ["twice", "plus_one", "rowsum"]
    assert all(isinstance(k, tc.Kernel) for k in lib)
    assert lib["twice"] is lib.twice
    X = np.array([1.0, -2.0, 3.5], np.float32)
    np.testing.assert_array_equal(lib.twice(X), [2.0, -4.0, 7.0])
    np.testing.assert_array_equal(lib["plus_one"](X), [2.0, -1.0, 4.5])
    M = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(lib.rowsum(M), [3.0, 12.0])


def test_library_missing_name_is_key_error() -> None:
    lib = tc.define(LIB_SRC)
    with pytest.raises(KeyError, match="nope"):
        lib["nope"]


def test_entry_picks_one_def_and_attributes_suggest() -> None:
    names = [k.name for k in tc.define(LIB_SRC)]
    k = tc.define(LIB_SRC, entry=names[1])
    assert isinstance(k, tc.Kernel) and k.name == names[1]
    with pytest.raises(tc.TcArgumentError, match=f"did you mean '{names[0]}'"):
        tc.define(LIB_SRC, entry=names[0] + "x")
    with pytest.raises(AttributeError, match=f"no def '{names[0]}x'; did you mean '{names[0]}'"):
        getattr(tc.define(LIB_SRC), names[0] + "x")
    with pytest.raises(tc.TcArgumentError, match="outputs= names the outputs of statements without a def header"):
        tc.define(LIB_SRC, outputs=["Y"])  # was ignored
    with pytest.raises(tc.TcArgumentError, match="entry= need"):
        tc.define("C(i) = A(i)", entry="f")


def test_define_overloads_tell_type_checkers_what_comes_back() -> None:
    import typing

    from tcdsl import api

    returns = [typing.get_type_hints(o, vars(api))["return"] for o in typing.get_overloads(api.define)]
    assert returns == [tc.Kernel, api.ShortForm, typing.Any]
    assert typing.get_type_hints(api.Library.__getattr__, vars(api))["return"] is tc.Kernel


def test_library_duplicate_def_names_raise() -> None:
    src = ("def a(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 }\n"
           "def a(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }\n")
    with pytest.raises(tc.TcError, match="'a'") as ei:
        tc.define(src)
    assert ei.value.location is not None
    assert ei.value.location.line == 2


def test_define_source_without_defs_or_statements_raises() -> None:
    for src in ("", "# only a comment\n"):
        with pytest.raises(tc.TcError):
            tc.define(src)


def test_define_backend_numpy_and_unknown() -> None:
    k = tc.define("def d(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 }", backend="numpy")
    X = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(k(X), [2.0, 4.0])
    np.testing.assert_array_equal(k(X, backend="numpy"), [2.0, 4.0])
    with pytest.raises(tc.TcArgumentError, match="unknown backend 'nosuch'; available: c, numpy"):
        k(X, backend="nosuch")
    with pytest.raises(tc.TcArgumentError, match="unknown backend 'nosuch'"):
        tc.define("def d(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 }", backend="nosuch")


# ---- the decorator short form --------------------------------------------------------------------


def test_short_form_matmul_params_from_signature() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    assert isinstance(matmul, tc.GenericKernel)
    assert matmul.params == ["A", "B"]
    assert matmul.outputs == ("C",)
    A, B = f32(3, 4, seed=3), f32(4, 2, seed=4)
    assert_sum_close(matmul(A, B), np.matmul, A, B, terms=4)


def test_short_form_param_order_is_the_signature_order() -> None:
    @tc.define("C(i) = A(i) - B(i)")
    def sub(B, A): ...  # B first

    b = np.array([1.0, 2.0, 3.0], np.float32)
    a = np.array([10.0, 20.0, 30.0], np.float32)
    np.testing.assert_array_equal(sub(b, a), [9.0, 18.0, 27.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_short_form_types_from_arguments(dtype: type) -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A = np.arange(6).reshape(2, 3).astype(dtype)
    B = (np.arange(12).reshape(3, 4) - 5).astype(dtype)
    C = matmul(A, B)
    assert C.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(C, (A.astype(np.int64) @ B.astype(np.int64)).astype(dtype))


def test_short_form_sizes_from_arguments_several_shapes() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    for m, k, n in [(2, 3, 4), (5, 5, 5), (1, 7, 2), (4, 3, 4), (6, 1, 3)]:
        A = rng(m).standard_normal((m, k))
        B = rng(n + 10).standard_normal((k, n))
        C = matmul(A, B)
        assert C.shape == (m, n)
        assert_sum_close(C, np.matmul, A, B, terms=k)


def test_short_form_repeated_calls_skip_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short-form call on arrays of shapes and dtypes it has seen goes straight to the def made
    for them: each call's own numbers, out= included; a new shape or dtype makes its signature again,
    an argument that is not an array takes the first call's path and its errors."""
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A, B = f32(3, 4, seed=50), f32(4, 5, seed=51)
    assert_sum_close(matmul(A, B), np.matmul, A, B, terms=4)
    made = matmul.kernel
    monkeypatch.setattr(type(matmul), "kernel", lambda self, *a: pytest.fail("signature made again"))
    for seed in (52, 53):
        A2 = f32(3, 4, seed=seed)
        assert_sum_close(matmul(A2, B), np.matmul, A2, B, terms=4)
        out = np.full((3, 5), np.nan, np.float32)
        assert matmul(A2, B, out=out) is out
        assert_sum_close(out, np.matmul, A2, B, terms=4)
    monkeypatch.setattr(type(matmul), "kernel", made)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    got = matmul(A64, B64)  # another dtype: its own def
    assert got.dtype == np.float64
    assert_sum_close(got, np.matmul, A64, B64, terms=4)
    A3 = f32(6, 4, seed=54)  # another shape
    assert_sum_close(matmul(A3, B), np.matmul, A3, B, terms=4)
    with pytest.raises(tc.TcArgumentError, match="argument 'A' is a list"):
        matmul(A.tolist(), B)


def test_short_form_contraction_mismatch_takes_the_intersection() -> None:
    """TC's rule: ``k`` runs where both reads are in bounds (0:4 here)."""
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(30, dtype=np.float32).reshape(5, 6)
    np.testing.assert_array_equal(matmul(a, b), a @ b[:4])


def test_short_form_arity() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    with pytest.raises(tc.TcArgumentError, match=r"matmul\(\) takes 2 arguments \(A, B\), got 1"):
        matmul(np.ones((2, 2), np.float32))
    with pytest.raises(tc.TcArgumentError, match="got 3"):
        matmul(*(np.ones((2, 2), np.float32),) * 3)


def test_short_form_outputs_in_order_of_first_write() -> None:
    @tc.define("C(i) = B(i) * 2.0\nD(i) = A(i) + 1.0\nC(i) = C(i) + D(i)")
    def f(A, B): ...

    assert f.outputs == ("C", "D")
    A = np.array([1.0, 2.0, 3.0], np.float32)
    B = np.array([10.0, 20.0, 30.0], np.float32)
    C, D = f(A, B)
    np.testing.assert_array_equal(D, A + 1)
    np.testing.assert_array_equal(C, 2 * B + A + 1)


def test_short_form_outputs_keyword_makes_temporaries() -> None:
    src = "T(i) = A(i) * 2.0\nC(i) = T(i) + B(i)"

    @tc.define(src, outputs=("C",))
    def only_c(A, B): ...

    @tc.define(src)
    def both(A, B): ...

    A = np.array([1.0, 2.0, 3.0], np.float32)
    B = np.array([0.5, 0.25, 0.0], np.float32)
    C = only_c(A, B)
    assert isinstance(C, np.ndarray)
    np.testing.assert_array_equal(C, 2 * A + B)
    T, C2 = both(A, B)
    np.testing.assert_array_equal(T, 2 * A)
    np.testing.assert_array_equal(C2, 2 * A + B)


def test_short_form_outputs_naming_unwritten_tensor_is_located() -> None:
    with pytest.raises(tc.TcSemanticError, match="'Q'") as ei:  # at decoration or at the first call

        @tc.define("C(i) = A(i) * 2.0", outputs=("Q",))
        def f(A): ...

        f(np.ones(3, np.float32))
    loc = ei.value.location
    assert loc is None or loc.line >= 1  # never a fake position such as <generated>:0:0


def test_short_form_rank0_output_and_scalar_input() -> None:
    @tc.define("S +=! A(r_i)")
    def total(A): ...

    S = total(np.arange(5, dtype=np.float64))
    assert S.shape == () and S.dtype == np.float64
    assert float(S) == 10.0

    @tc.define("C(i) = A(i) * s")
    def scale(A, s): ...

    A = np.array([1.0, 2.0], np.float32)
    r = scale(A, np.float32(1.5))
    assert r.dtype == np.float32
    np.testing.assert_array_equal(r, [1.5, 3.0])


def test_short_form_one_kernel_per_size_pattern() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    k1 = matmul.kernel(np.ones((2, 3)), np.ones((3, 4)))
    k2 = matmul.kernel(np.ones((5, 6)), np.ones((6, 7)))
    assert k1 is k2
    A, B = rng(1).standard_normal((2, 3)), rng(2).standard_normal((3, 4))
    for _ in range(4):
        assert_sum_close(matmul(A, B), np.matmul, A, B, terms=3)
    assert len(k1._cache) == 1
    # a different dtype is a different def
    k3 = matmul.kernel(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    assert k3 is not k1
    assert [t.dtype for t in k3.checked.inputs] == ["float32", "float32"]


def test_short_form_byte_order_and_strides() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A = rng(5).standard_normal((6, 8))
    B = rng(6).standard_normal((4, 5))
    a = A[::2, ::-2].astype(">f8")  # 3x4, big-endian
    b = B[::-1, :]
    C = matmul(a, b)
    assert C.dtype == np.float64 and C.dtype.isnative
    assert_sum_close(C, np.matmul, A[::2, ::-2], B[::-1, :], terms=4)


# ---- results: one array, tuples, out= ------------------------------------------------------------


TWO_SRC = "def two(float(N) X) -> (S, P) { S(i) = X(i) + 1.0\n P(i) = X(i) * 3.0 }"
GATHER_SRC = "def g(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }"
GATHER2_SRC = """def g2(float(N) T, int32(M) I) -> (S, O) {
  S(i) = T(i) + 1.0
  O(j) = T(I(j))
}"""


def test_one_output_array_several_outputs_tuple() -> None:
    two = tc.define(TWO_SRC)
    X = np.array([0.0, 1.0, -2.0], np.float32)
    r = two(X)
    assert isinstance(r, tuple) and len(r) == 2
    np.testing.assert_array_equal(r[0], X + 1)
    np.testing.assert_array_equal(r[1], X * 3)
    one = tc.define("def one(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }")
    y = one(X)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, X * X)


def test_out_single_array_filled_and_returned() -> None:
    g = tc.define(GATHER_SRC)
    T = np.array([10.0, 11.0, 12.0, 13.0], np.float32)
    I = np.array([3, 0, 2], np.int32)
    o = np.full(3, -1.0, np.float32)
    r = g(T, I, out=o)
    assert r is o
    np.testing.assert_array_equal(o, [13.0, 10.0, 12.0])
    o2 = np.full(3, -1.0, np.float32)
    r2 = g(T, I, out=[o2])  # a one-element list works too
    assert r2 is o2
    np.testing.assert_array_equal(o2, [13.0, 10.0, 12.0])


def test_out_tuple_filled_and_returned() -> None:
    two = tc.define(TWO_SRC)
    X = np.array([0.0, 1.0, -2.0], np.float32)
    s, p = np.full(3, 9.0, np.float32), np.full(3, 9.0, np.float32)
    r = two(X, out=(s, p))
    assert isinstance(r, tuple) and r[0] is s and r[1] is p
    np.testing.assert_array_equal(s, X + 1)
    np.testing.assert_array_equal(p, X * 3)


def test_out_strided_views_are_filled() -> None:
    two = tc.define(TWO_SRC)
    X = np.array([1.0, 2.0, 3.0], np.float32)
    big = np.zeros((3, 2), np.float32)
    two(X, out=(big[:, 0], big[::-1, 1]))
    np.testing.assert_array_equal(big, [[2.0, 9.0], [3.0, 6.0], [4.0, 3.0]])


def test_out_rank0() -> None:
    sm = tc.define("def sm(float(N) X) -> (S) { S +=! X(r_i) }")
    o = np.zeros((), np.float32)
    r = sm(np.array([1.0, 2.0, 4.5], np.float32), out=o)
    assert r is o
    assert float(o) == 7.5


def test_out_may_alias_an_input() -> None:
    d = tc.define("def d(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 + 1.0 }")
    x = np.array([1.0, 2.0, 3.0], np.float32)
    d(x, out=x)
    np.testing.assert_array_equal(x, [3.0, 5.0, 7.0])


@pytest.mark.parametrize("bad,msg", [
    (np.zeros(3, np.float64), "out= for 'O' must be float32 with shape (3,), got float64 with shape (3,)"),
    (np.zeros(4, np.float32), "out= for 'O' must be float32 with shape (3,), got float32 with shape (4,)"),
    (np.zeros((3, 1), np.float32), "got float32 with shape (3, 1)"),
])
def test_out_wrong_shape_or_dtype(bad: np.ndarray, msg: str) -> None:
    g = tc.define(GATHER_SRC)
    bad[...] = 5
    before = bad.copy()
    with pytest.raises(tc.TcArgumentError) as ei:
        g(np.arange(4, dtype=np.float32), np.array([0, 3, 1], np.int32), out=bad)
    assert msg in ei.value.message
    np.testing.assert_array_equal(bad, before)


def test_out_wrong_count_and_kind() -> None:
    two = tc.define(TWO_SRC)
    X = np.ones(3, np.float32)
    s = np.full(3, 4.0, np.float32)
    with pytest.raises(tc.TcArgumentError, match="out= holds 1 arrays but two has 2 outputs"):
        two(X, out=s)
    np.testing.assert_array_equal(s, 4.0)
    with pytest.raises(tc.TcArgumentError, match="out= for 'S' is a float, not a numpy array"):
        two(X, out=[1.0, 2.0])
    ro = np.full(3, 4.0, np.float32)
    ro.flags.writeable = False
    with pytest.raises(tc.TcArgumentError, match="out= for 'P' is read-only"):
        two(X, out=(s, ro))
    np.testing.assert_array_equal(s, 4.0)  # the first, valid buffer was not written either
    np.testing.assert_array_equal(ro, 4.0)


def test_out_errors_are_located_at_the_output() -> None:
    g = tc.define(GATHER_SRC)
    with pytest.raises(tc.TcArgumentError) as ei:
        g(np.arange(4, dtype=np.float32), np.array([0, 1], np.int32), out=np.zeros(5, np.float32))
    loc = ei.value.location
    assert loc is not None and loc.line == 1
    assert loc.source_line[loc.col - 1:].startswith("O")  # the output declaration `-> (O)`


def test_runtime_failure_leaves_out_untouched() -> None:
    g = tc.define(GATHER_SRC)
    T = np.arange(4, dtype=np.float32)
    o = np.full(3, 7.0, np.float32)
    with pytest.raises(tc.TcRuntimeError, match=r"dim 0 of 'T' is read at 5, outside 0:4") as ei:
        g(T, np.array([0, 5, 1], np.int32), out=o)
    assert "statement 1" in ei.value.message
    assert (ei.value.location.line, ei.value.location.col) == (1, 47)
    np.testing.assert_array_equal(o, 7.0)
    with pytest.raises(tc.TcRuntimeError, match="read at -1"):
        g(T, np.array([0, -1, 1], np.int32), out=o)
    np.testing.assert_array_equal(o, 7.0)


def test_runtime_failure_leaves_out_tuple_untouched() -> None:
    g2 = tc.define(GATHER2_SRC)
    T = np.arange(4, dtype=np.float32)
    s, o = np.full(4, 7.0, np.float32), np.full(2, 8.0, np.float32)
    with pytest.raises(tc.TcRuntimeError, match="'T'") as ei:
        g2(T, np.array([1, 9], np.int32), out=(s, o))
    assert ei.value.location.line == 3  # the gathering statement
    np.testing.assert_array_equal(s, 7.0)  # statement 1 succeeded, but nothing reached the caller
    np.testing.assert_array_equal(o, 8.0)
    g2(T, np.array([1, 3], np.int32), out=(s, o))
    np.testing.assert_array_equal(s, T + 1)
    np.testing.assert_array_equal(o, [1.0, 3.0])


# ---- inputs: strides, byte order, scalars; never modified -----------------------------------------


def test_strided_inputs(mm: tc.Kernel) -> None:
    A = f32(6, 8, seed=7)
    B = f32(5, 4, seed=8)
    D = f32(6, 5, seed=15)
    cases = [
        (A[::2, ::-2], B.T[::-1, :]),          # steps and negative strides
        (A[:4, :5], D.T[:, 1:3]),              # transposed view, plain slices
        (A.T[::-1][:3], A[::-1, ::3]),         # negative strides both ways
        (np.asfortranarray(A), np.asfortranarray(A.T)),
    ]
    for a, b in cases:
        assert_sum_close(mm(a, b), np.matmul, a, b, terms=a.shape[1])


def test_non_native_byte_order(mm: tc.Kernel) -> None:
    A, B = f32(3, 4, seed=9), f32(4, 2, seed=10)
    for a, b in [(A.astype(">f4"), B), (A, B.astype(">f4")), (A.astype(">f4"), B.astype(">f4")[::-1][::-1])]:
        C = mm(a, b)
        assert C.dtype == np.float32 and C.dtype.isnative
        assert_sum_close(C, np.matmul, A, B, terms=4)
    ki = tc.define("def neg(int32(N) X) -> (Y) { Y(i) = -X(i) }")
    np.testing.assert_array_equal(ki(np.array([1, -2, 70000], ">i4")), [-1, 2, -70000])


def test_rank0_params_scalars_and_0d_arrays() -> None:
    s = tc.define("def s(float alpha, float(N) X) -> (Y) { Y(i) = alpha * X(i) }")
    X = np.array([0.0, 1.0, 2.0, -3.0], np.float32)
    for alpha in (2.5, np.float32(2.5), np.array(2.5, np.float32), np.array(2.5, ">f4")):
        r = s(alpha, X)
        assert r.dtype == np.float32
        np.testing.assert_array_equal(r, [0.0, 2.5, 5.0, -7.5])
    np.testing.assert_array_equal(s(3, X), [0.0, 3.0, 6.0, -9.0])  # a Python int for a float param
    si = tc.define("def si(int32 n, int32(N) X) -> (Y) { Y(i) = n * X(i) }")
    Xi = np.array([1, 2, -3], np.int32)
    for n in (3, np.int32(3), np.array(3, np.int32)):
        np.testing.assert_array_equal(si(n, Xi), [3, 6, -9])


def test_python_float_for_int_param_raises() -> None:
    si = tc.define("def si(int32 n, int32(N) X) -> (Y) { Y(i) = n * X(i) }")
    with pytest.raises(tc.TcArgumentError, match=r"'n' is int32 but the argument is the float 3\.0") as ei:
        si(3.0, np.array([1], np.int32))
    assert (ei.value.location.line, ei.value.location.col) == (1, 8)


def test_python_int_out_of_range_for_int_param() -> None:
    si = tc.define("def si(int32 n, int32(N) X) -> (Y) { Y(i) = n * X(i) }")
    with pytest.raises(tc.TcArgumentError, match="'n'") as ei:
        si(2**40, np.array([1], np.int32))
    assert (ei.value.location.line, ei.value.location.col) == (1, 8)


def test_numpy_scalar_of_other_dtype_for_rank0_raises() -> None:
    s = tc.define("def s(float alpha, float(N) X) -> (Y) { Y(i) = alpha * X(i) }")
    with pytest.raises(tc.TcArgumentError, match="'alpha' is declared float32 but the argument has dtype float64"):
        s(np.float64(2.0), np.ones(2, np.float32))


def test_rank0_output_is_0d_array() -> None:
    sm = tc.define("def sm(float(N) X) -> (S) { S +=! X(r_i) }")
    r = sm(np.array([1.0, 2.0, 3.5], np.float32))
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.float32
    assert float(r) == 6.5


def test_inputs_are_never_modified() -> None:
    lib = tc.define(LIB_SRC)
    mm = tc.define(MM_SRC)
    g2 = tc.define(GATHER2_SRC)
    A = f32(6, 8, seed=11)
    args_list = [
        (mm, (A[:3, :4], A[:4, 2:7])),
        (mm, (A[::2, ::-2], np.asfortranarray(A[:4, :3]))),
        (mm, (A[:2, :3].astype(">f4"), A[:3, :2])),
        (lib.rowsum, (A,)),
        (lib.twice, (A[0],)),
        (g2, (A[1], np.array([7, 0, 3], np.int32))),
    ]
    for k, args in args_list:
        copies = [a.copy() for a in args]
        k(*args)
        for a, c in zip(args, copies):
            assert a.dtype == c.dtype
            np.testing.assert_array_equal(a, c)
    # a failing call does not touch its inputs either
    T, I = A[2], np.array([0, 99], np.int32)
    Tc, Ic = T.copy(), I.copy()
    with pytest.raises(tc.TcRuntimeError):
        g2(T, I)
    np.testing.assert_array_equal(T, Tc)
    np.testing.assert_array_equal(I, Ic)


def test_results_are_fresh_and_do_not_alias_inputs() -> None:
    ident = tc.define("def ident(float(N) X) -> (Y) { Y(i) = X(i) }")
    X = np.array([1.0, 2.0, 3.0], np.float32)
    Y = ident(X)
    assert Y.dtype == np.float32
    np.testing.assert_array_equal(Y, X)
    assert not np.shares_memory(X, Y)
    Y[:] = 99.0
    np.testing.assert_array_equal(X, [1.0, 2.0, 3.0])
    Y2 = ident(X)  # the cache does not hand back the buffer of the previous call
    assert not np.shares_memory(Y, Y2)
    np.testing.assert_array_equal(Y2, [1.0, 2.0, 3.0])
    two = tc.define(TWO_SRC)
    S, P = two(X)
    assert not np.shares_memory(S, P) and not np.shares_memory(S, X)


# ---- call-time checks: messages and locations ----------------------------------------------------


def test_arity_message_names_params(mm: tc.Kernel, mmx: tc.Kernel) -> None:
    with pytest.raises(tc.TcArgumentError, match=r"mm\(\) takes 2 arguments \(A, B\), got 1") as ei:
        mm(np.ones((2, 2), np.float32))
    assert isinstance(ei.value, tc.TcError)
    assert (ei.value.location.line, ei.value.location.col) == (1, 5)
    with pytest.raises(tc.TcArgumentError, match=r"mmx\(\) takes 2 arguments \(A, B\), got 3") as ei:
        mmx(*(np.ones((2, 2), np.float32),) * 3)
    assert ei.value.location.file == "mmx.tc" and ei.value.location.line == 1


def test_rank_error(mmx: tc.Kernel) -> None:
    with pytest.raises(tc.TcArgumentError) as ei:
        mmx(np.ones((2, 3), np.float32), np.ones(3, np.float32))
    assert ei.value.message == "'B' is declared with 2 dims but the argument has 1 (shape (3,))"
    loc = ei.value.location
    assert (loc.file, loc.line, loc.col) == ("mmx.tc", 3, 5)
    assert loc.source_line == "    float(K, N) B"


def test_dtype_error(mmx: tc.Kernel) -> None:
    with pytest.raises(tc.TcArgumentError) as ei:
        mmx(np.ones((2, 3), np.float64), np.ones((3, 2), np.float32))
    assert ei.value.message == ("'A' is declared float32 but the argument has dtype float64 (convert it with "
                                ".astype(np.float32), or call mmx.double(), the def in float64)")
    assert (ei.value.location.line, ei.value.location.col) == (2, 5)
    for dt in (np.float16, np.int32, np.complex64, np.bool_):
        msg = f"'B' is declared float32 but the argument has dtype {np.dtype(dt)}"
        with pytest.raises(tc.TcArgumentError, match=msg):
            mmx(np.ones((2, 3), np.float32), np.ones((3, 2), dt))


def test_size_symbol_conflict(mmx: tc.Kernel) -> None:
    with pytest.raises(tc.TcArgumentError) as ei:
        mmx(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    e = ei.value
    assert e.message == "size symbol K: 'A' has 3 in dim 1 but 'B' has 4 in dim 0"
    assert (e.location.line, e.location.col) == (3, 5)
    assert str(e) == ("mmx.tc:3:5: size symbol K: 'A' has 3 in dim 1 but 'B' has 4 in dim 0\n"
                      "        float(K, N) B\n"
                      "        ^^^^^^^^^^^^^")


def test_size_symbol_conflict_within_one_tensor() -> None:
    sq = tc.define("def tr(\n  float(N, N) A\n) -> (S) { S +=! A(r_i, r_i) }")
    assert float(sq(np.diag(np.array([1.0, 2.0, 3.0], np.float32)))) == 6.0
    with pytest.raises(tc.TcArgumentError, match="size symbol N: 'A' has 2 in dim 0 but 'A' has 3 in dim 1") as ei:
        sq(np.ones((2, 3), np.float32))
    assert ei.value.location.line == 2


def test_literal_dim_mismatch() -> None:
    lit = tc.define("def lit(\n  float(3, N) A\n) -> (B) { B(i, j) = A(i, j) + 1.0 }")
    with pytest.raises(tc.TcArgumentError) as ei:
        lit(np.zeros((4, 2), np.float32))
    assert ei.value.message == "dim 0 of 'A' is declared 3 but the argument has 4"
    assert (ei.value.location.line, ei.value.location.col) == (2, 3)
    np.testing.assert_array_equal(lit(np.zeros((3, 2), np.float32)), np.ones((3, 2), np.float32))


def test_non_array_argument() -> None:
    g = tc.define(GATHER_SRC)
    with pytest.raises(tc.TcArgumentError, match="argument 'T' is a str, not an array"):
        g("abc", np.array([0], np.int32))


def test_failed_call_adds_nothing_to_cache(mm: tc.Kernel) -> None:
    k = tc.define(MM_SRC)
    with pytest.raises(tc.TcArgumentError):
        k(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(tc.TcArgumentError):
        k(np.ones((2, 3), np.float32), np.ones((3, 2), np.float64))
    assert len(k._cache) == 0


# ---- caching -------------------------------------------------------------------------------------


def test_cache_one_instance_per_shape() -> None:
    k = tc.define(MM_SRC)
    A, B = f32(3, 4, seed=12), f32(4, 5, seed=13)
    for _ in range(10):
        assert_sum_close(k(A, B), np.matmul, A, B, terms=4)
    assert len(k._cache) == 1
    # same shapes through other strides / byte order / order: still one instance
    k(np.asfortranarray(A), B.astype(">f4"))
    k(A[::-1][::-1], B)
    assert len(k._cache) == 1
    A2 = f32(2, 4, seed=14)
    for _ in range(3):
        assert_sum_close(k(A2, B), np.matmul, A2, B, terms=4)
    assert len(k._cache) == 2


def test_repeated_calls_follow_what_the_call_depends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated call with the same argument layout goes straight to its compiled kernel; changing
    the layout, the kernel's options, the CPU target or passing out=/options= is seen at once."""
    k = tc.define(MM_SRC, backend="c")
    A, B = f32(5, 7, seed=20), f32(7, 3, seed=21)
    first = k(A, B)
    again = k(A, B)
    assert not np.shares_memory(first, again)
    np.testing.assert_array_equal(first, again)
    A2 = f32(5, 7, seed=22)  # another array, same layout: its own values
    assert_sum_close(k(A2, B), np.matmul, A2, B, terms=7)
    At = np.asfortranarray(A)  # same shape, other strides: the kernel for those strides
    assert_sum_close(k(At, B), np.matmul, A, B, terms=7)
    assert_sum_close(k(A[:, ::-1][:, ::-1], B), np.matmul, A, B, terms=7)
    swapped = A.astype(A.dtype.newbyteorder())  # same shape and strides, the other byte order
    assert_sum_close(k(swapped, B), np.matmul, A, B, terms=7)
    assert_sum_close(k(A, B), np.matmul, A, B, terms=7)
    built = k.compile_count
    k.options = tc.MappingOptions(tile=(2, 2))
    assert_sum_close(k(A, B), np.matmul, A, B, terms=7)
    assert k.compile_count == built + 1  # the new options compiled, not the last call's kernel
    monkeypatch.setenv("TCDSL_CPU", "generic")
    assert_sum_close(k(A, B), np.matmul, A, B, terms=7)
    assert k.compile_count == built + 2  # the generic target's build
    out = np.full((5, 3), np.nan, np.float32)
    assert k(A, B, out=out) is out
    assert_sum_close(out, np.matmul, A, B, terms=7)
    np.testing.assert_array_equal(k(A, B, backend="numpy"), k(A, B))


@pytest.mark.cpu
def test_naming_the_backend_a_call_takes_anyway_keeps_the_repeated_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend="c"`` on a kernel whose calls run C anyway (its own backend, or the default where a
    C compiler exists) takes the repeated-call paths a plain call takes, with and without out=, each
    call on its own numbers; a kernel defined for numpy still compiles and runs C when a call names it."""
    k = tc.define(MM_SRC)
    A, B = f32(5, 7, seed=50), f32(7, 3, seed=51)
    out = np.empty((5, 3), np.float32)
    k(A, B, backend="c")
    k(A, B, backend="c", out=out)
    monkeypatch.setattr(tc.Kernel, "_call", lambda self, *a, **kw: pytest.fail("slow path"))
    for seed in (52, 53):
        A = f32(5, 7, seed=seed)
        assert_sum_close(k(A, B, backend="c"), np.matmul, A, B, terms=7)
        out[...] = np.nan
        assert k(A, B, backend="c", out=out) is out
        assert_sum_close(out, np.matmul, A, B, terms=7)
    monkeypatch.undo()
    ref = tc.define(MM_SRC, backend="numpy")
    ref(A, B)
    built = ref.compile_count
    assert_sum_close(ref(A, B, backend="c"), np.matmul, A, B, terms=7)
    assert ref.compile_count == built + 1  # named: compiled and run in C, not the numpy call's path


def test_repeated_out_calls_go_straight_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated call with out= on the same layouts runs the kernel without the first call's
    checks: each call's own numbers, outputs the def does not write whole zeroed again, outputs a
    reduction without ``!`` updated from their values; buffers that cannot take the results
    directly (sharing memory with an input, read-only) take the first call's path."""
    part = tc.define("def part(float(N) X) -> (Y, S) { Y(i) = X(i) * 2.0 where i in 1:N\n S +=! X(r_i) }",
                     backend="c")
    acc = tc.define("def acc(float(N, K) A) -> (R) { R(n) += A(n, r_k) }", backend="c")
    X = f32(9, seed=40)
    y, s = np.empty(9, np.float32), np.empty((), np.float32)
    part(X, out=(y, s))  # the first call: compiled, checked
    slow = []
    monkeypatch.setattr(tc.Kernel, "_call", lambda self, *a, **k: slow.append(1) or pytest.fail("slow path"))
    for seed in (41, 42):
        X = f32(9, seed=seed)
        y[:], s[...] = np.nan, np.nan  # what the kernel leaves unwritten must not survive
        assert part(X, out=[y, s])[0] is y
        np.testing.assert_array_equal(y, np.concatenate([[0.0], X[1:] * 2]))
        assert_sum_close(s, np.sum, X, terms=9)
    monkeypatch.undo()
    A = f32(4, 6, seed=43)
    r = np.full(4, 10.0, np.float32)
    for calls in range(1, 4):  # each call adds to what the buffer holds
        assert acc(A, out=r) is r
        assert_sum_close(r - 10.0, lambda a, c=calls: c * a.sum(axis=1), A, terms=6 * calls + 1)
    X = f32(9, seed=44)
    shared = np.concatenate([X, np.zeros(1, np.float32)])
    part(shared[:9], out=(shared[1:], s))  # overlaps its input: computed aside, then copied
    np.testing.assert_array_equal(shared[1:], np.concatenate([[0.0], X[1:] * 2]))
    frozen = np.zeros(9, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(tc.TcArgumentError, match="out= for 'Y' is read-only"):
        part(X, out=(frozen, s))
    # a temporary with a buffer of its own (the row sums): the kernel's parameters are not just the
    # def's inputs and outputs, so the run goes by addresses, each call with its own buffer
    rows = tc.define("def rows(float(N,M) X) -> (Y) { S(n) +=! X(n, r_m)\n Y(n, m) = X(n, m) / S(n) }",
                     backend="c")
    y = np.empty((30, 40), np.float32)
    for seed in (45, 46, 47):
        X2 = f32(30, 40, seed=seed) + 2.0
        y[:] = np.nan
        assert rows(X2, out=y) is y
        want = X2.astype(np.float64) / X2.astype(np.float64).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(y, want, rtol=4 * 40 * np.finfo(np.float32).eps)


def test_repeated_calls_of_a_one_input_def_read_each_arrays_own_elements() -> None:
    """The one-input repeated call reads the array's address from the array object: views at an
    offset, read-only arrays, reversed views and an array reshaped in place each give their own
    numbers; the address it reads is numpy's own for every kind of array."""
    from tcdsl.compiler import data_address

    k = tc.define("def inc(float(N) A) -> (B) { B(i) = A(i) * 2.0 + 1.0 }", backend="c")
    big = f32(40, seed=30)
    for lo in (0, 1, 5, 33):  # one layout, other addresses
        np.testing.assert_array_equal(k(big[lo:lo + 7]), big[lo:lo + 7] * 2 + 1)
    frozen = big[3:10].copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(k(frozen), frozen * 2 + 1)
    np.testing.assert_array_equal(k(big[::-1][:7]), big[::-1][:7] * 2 + 1)
    flat = f32(8, seed=31)
    np.testing.assert_array_equal(k(flat), flat * 2 + 1)
    flat.shape = (2, 4)  # the same object, now 2-D: refused, not read as 1-D
    with pytest.raises(tc.TcError):
        k(flat)
    flat.shape = (8,)
    np.testing.assert_array_equal(k(flat), flat * 2 + 1)
    memmap_like = np.frombuffer(bytearray(flat.tobytes()), np.float32)
    np.testing.assert_array_equal(k(memmap_like), flat * 2 + 1)
    class Sub(np.ndarray):
        pass

    kinds = [big, big[5:], big[::-3], frozen, memmap_like, np.asfortranarray(f32(3, 4, seed=2))[1:, 1:],
             np.ones((2, 2), np.float32), big[2:].view(Sub), np.zeros(0)]
    for a in kinds:
        assert data_address(a) == a.ctypes.data


def test_repeated_call_errors_are_located() -> None:
    k = tc.define("def pick(float(N) X, int32(M) I) -> (Y) { Y(m) = X(I(m)) }", backend="c")
    X, ok, bad = np.arange(4, dtype=np.float32), np.array([0, 3], np.int32), np.array([0, 4], np.int32)
    for _ in range(2):
        np.testing.assert_array_equal(k(X, ok), [0.0, 3.0])
        with pytest.raises(tc.TcRuntimeError, match="out of range") as e:
            k(X, bad)
        assert e.value.location is not None and e.value.location.line == 1


def test_errors_surface_at_the_users_call_first_or_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed check raises from the user's call, without tcdsl's inner frames, on the first call
    and on the repeated calls that go straight to the kernel; TCDSL_DEBUG=1 keeps the frames."""
    import traceback

    k = tc.define("def pick(float(N) X, int32(M) I) -> (Y) { Y(m) = X(I(m)) }", backend="c")
    X, bad = np.arange(4, dtype=np.float32), np.array([0, 4], np.int32)

    def frames() -> list[str]:
        with pytest.raises(tc.TcRuntimeError, match="out of range") as e:
            k(X, bad)
        return [f.filename for f in traceback.extract_tb(e.value.__traceback__)]

    for _ in range(3):  # the first call compiles; the next ones are repeated calls
        ours = [f for f in frames() if os.sep + "tcdsl" + os.sep in f]
        assert len(ours) == 1 and ours[0].endswith("kernel.py")  # the call's own line, then the user's
    monkeypatch.setenv("TCDSL_DEBUG", "1")
    assert any(f.endswith(os.path.join("tcdsl", "compiler.py")) for f in frames())


def test_each_failing_repeated_call_reports_its_own_value() -> None:
    """Repeated calls reuse one error record per thread: a failure reports the value of its own
    call, never one left from an earlier failure, in this thread or another."""
    k = tc.define("def pick(float(N) X, int32(M) I) -> (Y) { Y(m) = X(I(m)) }", backend="c")
    X = np.arange(4, dtype=np.float32)
    k(X, np.array([0, 3], np.int32))
    seen: list[str] = []

    def fail(at: int) -> None:
        with pytest.raises(tc.TcRuntimeError, match=f"read at {at}, outside 0:4") as e:
            k(X, np.array([0, at], np.int32))
        seen.append(str(e.value))

    for at in (9, 7):
        fail(at)
    worker = threading.Thread(target=fail, args=(5,))
    worker.start()
    worker.join()
    fail(6)
    assert len(seen) == 4
    np.testing.assert_array_equal(k(X, np.array([3, 1], np.int32)), [3.0, 1.0])


def test_instance_sizes_and_ranges(mm: tc.Kernel) -> None:
    inst = mm.instance(np.ones((3, 4), np.float32), np.ones((4, 5), np.float32))
    assert inst.sizes == {"M": 3, "K": 4, "N": 5}
    assert inst.shapes["C"] == (3, 5)
    assert inst.stmts[0].ranges == (("m", 0, 3), ("n", 0, 5), ("k", 0, 4))


# ---- text forms ----------------------------------------------------------------------------------


def test_str_shows_canonical_def_and_ranges(mm: tc.Kernel) -> None:
    assert str(mm) == ("def mm(float32(M, K) A, float32(K, N) B) -> (C) {\n"
                       "  C(m, n) +=! A(m, k) * B(k, n)\n"
                       "}\n"
                       "# statement 1 (line 1): m in 0:M, n in 0:N, k in 0:K\n"
                       "# output float32(M, N) C")


def test_str_line_numbers_follow_source(mmx: tc.Kernel) -> None:
    assert "# statement 1 (line 5): m in 0:M, n in 0:N, k in 0:K" in str(mmx)


def test_repr_html(mm: tc.Kernel) -> None:
    h = mm._repr_html_()
    assert h.startswith("<pre") and h.endswith("</pre>")
    assert "def</span> <b>mm</b>(" in h
    assert "-&gt;</span> (C)" in h  # escaped
    assert "# statement 1 (line 1): m in 0:M, n in 0:N, k in 0:K" in h


# ---- errors --------------------------------------------------------------------------------------


def _raised(fn) -> tc.TcError:
    try:
        fn()
    except tc.TcError as e:
        return e
    raise AssertionError("no TcError raised")


def test_errors_pickle(mm: tc.Kernel, mmx: tc.Kernel) -> None:
    g = tc.define(GATHER_SRC)
    errors = [
        _raised(lambda: mm(np.ones((2, 2), np.float32))),
        _raised(lambda: mmx(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))),
        _raised(lambda: g(np.ones(2, np.float32), np.array([5], np.int32))),
        _raised(lambda: tc.define("def f(float(N) X) -> (Y) { T(i) += X(i)\n Y(i) = T(i) }")),
        _raised(lambda: tc.define("def f(float(N) X) -> (Y) { Y(i) = X(i) + }")),
        tc.TcArgumentError("no location"),
    ]
    kinds = {type(e) for e in errors}
    assert {tc.TcArgumentError, tc.TcRuntimeError, tc.TcSemanticError, tc.TcSyntaxError} <= kinds
    for e in errors:
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e)
        assert str(e2) == str(e)
        assert e2.message == e.message
        assert e2.location == e.location
    assert str(errors[-1]) == "no location"


def test_syntax_errors_pickle_with_their_chain() -> None:
    """Picklers that keep an exception's cause and context (tblib's, which dask installs) pickle
    a syntax error too: it carries no chain from the parser (whose state holds modules)."""
    pytest.importorskip("tblib")
    code = ("import pickle, tblib.pickling_support, tcdsl as tc\n"
            "tblib.pickling_support.install(tc.TcError)\n"
            "try:\n    tc.define('def f(float(N) X) -> (Y) { Y(i) = X(i) + }')\n"
            "except tc.TcSyntaxError as e:\n    e2 = pickle.loads(pickle.dumps(e))\n"
            "    print(type(e2).__name__, e2.location.col, e.__context__ is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["TcSyntaxError", "42", "True"], out.stderr


def test_error_hierarchy() -> None:
    for cls in (tc.TcSyntaxError, tc.TcSemanticError, tc.TcTypeError, tc.TcRangeError, tc.TcArgumentError,
                tc.TcRuntimeError, tc.TcScheduleError, tc.TcCompileError):
        assert issubclass(cls, tc.TcError)
    assert issubclass(tc.TcTypeError, tc.TcSemanticError)


@pytest.mark.cpu
def test_an_isl_failure_is_a_located_schedule_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import islpy as isl

    from tcdsl import compiler

    def fail(*args: object, **kwargs: object) -> None:
        raise isl.Error("call to isl_ast_build_node_from_schedule failed: internal in /isl/x.c:1")

    monkeypatch.setattr(compiler.astgen, "build", fail)
    k = tc.define("def twice(float(N) A) -> (B) {\n  B(i) = A(i) * 2\n}")
    with pytest.raises(tc.TcScheduleError, match="def twice could not be scheduled") as info:
        k(np.ones(3, np.float32), backend="c")
    assert info.value.location is not None and (info.value.location.line, info.value.location.col) == (2, 3)
    assert "/isl/" not in str(info.value)
