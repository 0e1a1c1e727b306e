"""The reference interpreter (``backend="numpy"``) as the one reference: non-finite and
overflowing values in contractions against the C backend and per-term numpy, rank-0 statements
of every kind against hand-computed numpy, and ``where`` boxes far wider than their domain,
whose cost follows the points that run (counted, not timed).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcdsl as tc
from tcdsl import interp
from tcdsl.core.instance import bind_sizes, instantiate
from tcdsl.errors import TcError, TcRuntimeError

try:  # pytest's default (prepend) import mode puts tests/ on sys.path; other modes may not
    from tolerance import assert_close, reduction_scale
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tolerance import assert_close, reduction_scale

F32 = np.float32
# the scalar factor last, as written: each term is (A * B) * s
MMS = "def mms({t}(M,K) A, {t}(N,K) B, {t} s) -> (C) {{ C(m,n) +=! A(m,k) * B(n,k) * s }}"
# the scalar factor between the reads: each term is (A * s) * B
MSM = "def msm({t}(M,K) A, {t}(N,K) B, {t} s) -> (C) {{ C(m,n) +=! A(m,k) * s * B(n,k) }}"
MM = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def both(src: str, *args: Any) -> tuple[Any, Any]:
    """The def run on the C backend and on the interpreter."""
    k = tc.define(src)
    return k(*args, backend="c"), k(*args, backend="numpy")


def per_term(A: np.ndarray, B: np.ndarray, s: Any, scalar_last: bool = True) -> np.ndarray:
    """``sum_k`` of the terms of MMS (or MSM), each rounded in A's type in the written order."""
    s = np.asarray(s, dtype=A.dtype)
    with np.errstate(all="ignore"):
        a, b = A[:, None, :], B[None, :, :]
        terms = (a * b) * s if scalar_last else (a * s) * b
        return terms.sum(axis=-1, dtype=A.dtype)


@pytest.fixture
def points(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts what the interpreter evaluates: ``chunks`` and ``points`` on the term-by-term path,
    ``einsum`` boxes and their ``einsum_points`` on the contraction fast path."""
    seen = {"chunks": 0, "points": 0, "einsum": 0, "einsum_points": 0}
    chunk, einsum = interp._chunk, interp._einsum

    def count_chunk(bs: Any, box: Any, *rest: Any) -> None:
        seen["chunks"] += 1
        seen["points"] += int(np.prod([hi - lo for _, lo, hi in box]))
        chunk(bs, box, *rest)

    def count_einsum(bs: Any, box: Any, *rest: Any) -> bool:
        done = einsum(bs, box, *rest)
        if done:
            seen["einsum"] += 1
            seen["einsum_points"] += int(np.prod([hi - lo for _, lo, hi in box]))
        return done

    monkeypatch.setattr(interp, "_chunk", count_chunk)
    monkeypatch.setattr(interp, "_einsum", count_einsum)
    yield seen


# ---- non-finite values: the interpreter agrees with the compiled code ------------------------------


def _signed_with_zeros(shape: tuple[int, ...], seed: int, dtype: Any = F32) -> np.ndarray:
    """Values in +-[0.5, 2) with about a quarter of them exactly 0."""
    r = rng(seed)
    x = r.uniform(0.5, 2.0, shape) * r.choice([-1.0, 1.0], shape)
    x[r.random(shape) < 0.25] = 0.0
    return x.astype(dtype)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("s", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("src", [MMS, MSM], ids=["scalar_last", "scalar_between"])
def test_non_finite_scalar_in_a_contraction_matches_c(src: str, s: float, dtype: str) -> None:
    """(A*B)*inf is NaN where A*B is 0 and +-inf otherwise; mixed signs in one sum give NaN. The
    old einsum path hoisted the scalar: (sum A*B)*inf, an infinity where C has NaN."""
    A = _signed_with_zeros((5, 9), 1, dtype)
    B = _signed_with_zeros((4, 9), 2, dtype)
    A[0, :] = np.abs(A[0, :]) + 1  # row 0 with row 3 of B: every term of one sign, no zero
    B[3, :] = np.abs(B[3, :]) + 1
    c, n = both(src.format(t=dtype), A, B, np.asarray(s, dtype))
    assert_close(n, c, terms=9, scale=reduction_scale(A, B), err_msg="interpreter vs C")
    assert_close(n, per_term(A, B, s, src is MMS), terms=9, scale=reduction_scale(A, B))
    if not np.isnan(s):
        assert np.isinf(n[0, 3]) and np.isnan(n).any()  # the test covers both outcomes


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_non_finite_inputs_in_a_matmul_match_c(dtype: str) -> None:
    A = rng(3).standard_normal((6, 11)).astype(dtype)
    B = _signed_with_zeros((11, 7), 4, dtype)
    A[1, 2] = np.inf  # row 1: inf times B's row 2 (zeros give NaN)
    A[2, :] = np.inf  # row 2: + and - infinities
    A[4, 5] = np.nan
    B[:, 6] = np.abs(B[:, 6]) + 1  # column 6 positive: row 1 gives +inf there, not NaN
    c, n = both(MM.format(t=dtype), A, B)
    assert_close(n, c, terms=11, scale=reduction_scale(A[np.isfinite(A)], B), err_msg="interpreter vs C")
    assert np.isposinf(n[1, 6]) and np.isnan(n[2]).any() and np.isnan(n[4]).all()
    assert np.isfinite(n[[0, 3, 5]]).all()


@pytest.mark.cpu
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_overflowing_terms_of_one_sign_match_c(sign: float) -> None:
    """s = +-3e38: terms 2*3*s overflow to an infinity of one sign, small terms stay finite; every
    summation order (the compiled code's lanes, its fused multiply-add) gives the same result."""
    r = rng(5)
    A = r.choice(np.asarray([0.0, 1e-3, 2.0], F32), (6, 16))
    B = r.choice(np.asarray([0.0, 1e-3, 3.0], F32), (5, 16))
    A[0, :] = 1e-3  # row 0: no overflowing term anywhere
    s = F32(sign * 3e38)
    c, n = both(MMS.format(t="float32"), A, B, s)
    big = (A[:, None, :] == 2) & (B[None, :, :] == 3)
    expect_inf = big.any(axis=-1)
    assert expect_inf.any() and not expect_inf.all()
    assert np.array_equal(np.isinf(n), expect_inf) and (np.sign(n[expect_inf]) == sign).all()
    assert_close(n, c, terms=16, scale=3 * 3e35, err_msg="interpreter vs C")


@pytest.mark.cpu
def test_products_grouped_as_written_match_c() -> None:
    """1e20 * 1e20 overflows float32 before * 1e-30 can bring it back; 1e20 * 1e-30 * 1e20 does not."""
    A = np.full((2, 3), 1e20, F32)
    A[1] = 1.0
    B = np.full((2, 3), 1e20, F32)
    s = F32(1e-30)
    for src, scalar_last in ((MMS, True), (MSM, False)):
        c, n = both(src.format(t="float32"), A, B, s)
        want = per_term(A, B, s, scalar_last)
        assert_close(n, want, terms=3, scale=1e10, err_msg=src)
        assert_close(n, c, terms=3, scale=1e10, err_msg=src)
        assert np.isinf(n[0]).all() == scalar_last


def test_overflowing_terms_of_both_signs_follow_per_term_evaluation() -> None:
    """Where overflowing terms of both signs meet, each term is +-inf as written and their sum
    NaN (the compiled code's result then depends on its summation order: not compared)."""
    A = np.asarray([[2.0, -2.0, 1e-3], [2.0, 2.0, 1e-3], [1e-3, 1e-3, 1e-3]], F32)
    B = np.asarray([[3.0, 3.0, 3.0]], F32)
    k = tc.define(MMS.format(t="float32"))
    for s in (F32(3e38), F32(-3e38)):
        n = k(A, B, s, backend="numpy")
        assert np.isnan(n[0, 0]) and np.isinf(n[1, 0]) and np.sign(n[1, 0]) == np.sign(s)
        assert np.isfinite(n[2, 0])
        assert_close(n, per_term(A, B, s), terms=3, scale=1e36)


def test_finite_bounded_contractions_take_the_einsum_path(points: dict[str, int]) -> None:
    A = rng(6).standard_normal((8, 10)).astype(F32)
    B = rng(7).standard_normal((10, 9)).astype(F32)
    k = tc.define(MM.format(t="float32"))
    assert_close(k(A, B, backend="numpy"), A.astype(np.float64) @ B, terms=10, scale=reduction_scale(A, B))
    assert points["einsum"] == 1 and points["chunks"] == 0


@pytest.mark.parametrize("poison", [np.inf, np.nan, 1e30])
def test_non_finite_or_huge_operands_run_term_by_term(points: dict[str, int], poison: float) -> None:
    A = rng(6).standard_normal((8, 10)).astype(F32)
    B = rng(7).standard_normal((10, 9)).astype(F32)
    A[3, 4] = poison
    B[4, :] = np.where(np.arange(9) % 2 == 0, 0.0, 1e10)  # 0 * inf is NaN; 1e30 * 1e10 overflows
    got = tc.define(MM.format(t="float32"))(A, B, backend="numpy")
    with np.errstate(all="ignore"):
        want = (A[:, :, None] * B[None, :, :]).sum(axis=1, dtype=F32)
    assert_close(got, want, terms=10, scale=reduction_scale(A[np.abs(A) < 1e20], B))
    assert points["einsum"] == 0 and points["chunks"] >= 1
    assert not np.isfinite(got[3]).all()


# ---- rank-0 statements ----------------------------------------------------------------------------

X3 = np.asarray([1.5, -2.0, 4.0], F32)
A0 = np.asarray(2.5, F32)

RANK0: list[tuple[str, str, tuple[Any, ...], Any]] = [
    ("copy", "def f(float a) -> (b) { b = a }", (A0,), A0),
    ("arith", "def f(float a) -> (b) { b = a * 2.0 + 1.0 }", (A0,), A0 * F32(2) + F32(1)),
    ("select", "def f(float a) -> (b) { b = a > 3.0 ? a : -a }", (A0,), -A0),
    ("call", "def f(float a) -> (b) { b = exp(a) }", (A0,), np.exp(A0)),
    ("int_floor_div", "def f(int32 a) -> (b) { b = a / 2 }", (np.asarray(-3, np.int32),), np.int32(-2)),
    ("const_read", "def f(float(N) X) -> (b) { b = X(2) }", (X3,), X3[2]),
    ("read_outside_runs_nowhere", "def f(float(N) X) -> (b) { b = X(3) }", (X3,), F32(0)),
    ("operand", "def f(float a, float(N) X) -> (Y) { Y(i) = X(i) * a }", (A0, X3), X3 * A0),
    ("two_operands", "def f(float a, float c, float(N) X) -> (Y) { Y(i) = X(i) * a - c }",
     (A0, F32(1), X3), X3 * A0 - F32(1)),
    ("sum", "def f(float(N) X) -> (b) { b +=! X(i) }", (X3,), X3.sum()),
    ("prod", "def f(float(N) X) -> (b) { b *=! X(i) }", (X3,), X3.prod()),
    ("min", "def f(float(N) X) -> (b) { b min=! X(i) }", (X3,), X3.min()),
    ("max", "def f(float(N) X) -> (b) { b max=! X(i) }", (X3,), X3.max()),
    ("scalar_sum", "def f(float a) -> (b) { b +=! a }", (A0,), A0),
    ("scalar_max", "def f(float a) -> (b) { b max=! a }", (A0,), A0),
    ("contraction", "def f(float a, float(N) X) -> (b) { b +=! X(i) * a }", (A0, X3), (X3 * A0).sum()),
    ("padded", "def f(float(N) X) -> (b) { b +=! X(i + 1) where i in 0:N }", (X3,), X3[1:].sum()),
    ("temp_then_use", "def f(float(N) X) -> (Y) { t +=! X(i)\n Y(i) = X(i) - t / float(N) }",
     (X3,), X3 - X3.sum() / F32(3)),
    ("two_outputs", "def f(float(N) X) -> (s, Y) { s max=! X(i)\n Y(i) = X(i) / s }",
     (X3,), (X3.max(), X3 / X3.max())),
    ("chain", "def f(float a) -> (b, c) { b = a + 1.0\n c +=! b * b }", (A0,), (A0 + 1, (A0 + 1) ** 2)),
]


def _same(got: Any, want: Any) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    w = np.asarray(want)
    assert isinstance(got, np.ndarray) and got.shape == w.shape and got.dtype == w.dtype, (got, w)
    assert_close(got, w, terms=3, scale=float(np.abs(X3).max() * np.abs(A0)) if w.dtype.kind == "f" else None)


@pytest.mark.parametrize(("src", "args", "want"), [c[1:] for c in RANK0], ids=[c[0] for c in RANK0])
def test_rank0_statements(src: str, args: tuple[Any, ...], want: Any) -> None:
    _same(tc.define(src)(*args, backend="numpy"), want)


@pytest.mark.parametrize(("src", "args", "want"), [c[1:] for c in RANK0], ids=[c[0] for c in RANK0])
def test_rank0_statements_with_scalars_and_tiny_chunks(src: str, args: tuple[Any, ...], want: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy scalars instead of rank-0 arrays, and chunks of one point."""
    monkeypatch.setattr(interp, "CHUNK", 1)
    scalars = tuple(a[()] if a.ndim == 0 else a for a in map(np.asarray, args))
    _same(tc.define(src)(*scalars, backend="numpy"), want)


@pytest.mark.cpu
@pytest.mark.parametrize(("src", "args"), [c[1:3] for c in RANK0], ids=[c[0] for c in RANK0])
def test_rank0_statements_match_c(src: str, args: tuple[Any, ...]) -> None:
    c, n = both(src, *args)
    _same(n, c)


# ---- the cost follows the points that run ---------------------------------------------------------

A23 = np.arange(6, dtype=F32).reshape(2, 3) - 2  # 2 x 3, entries -2..3


@pytest.mark.parametrize("src", [
    "def p(float(M,K) A) -> (P) { P(i) +=! A(i,k) where k in 0:1000000000 }",
    "def p(float(M,K) A) -> (P) { P(i) +=! A(i,k) where k in -1000000000:1000000000 }",
    "def p(float(M,K) A) -> (P) { P(i) +=! A(i, 2 - k) where k in -1000000000:1000000000 }",
], ids=["wide", "both_sides", "negative_coefficient"])
def test_huge_where_box_evaluates_only_the_domain(points: dict[str, int], src: str) -> None:
    got = tc.define(src)(A23, backend="numpy")
    np.testing.assert_array_equal(got, A23.sum(axis=1))
    assert points["einsum_points"] + points["points"] == 6


def test_huge_where_box_term_by_term(points: dict[str, int]) -> None:
    src = "def p(float(M,K) A) -> (P) { P(i) +=! exp(A(i,k)) * 2.0 where k in 0:1000000000 }"
    got = tc.define(src)(A23, backend="numpy")
    assert_close(got, (np.exp(A23.astype(np.float64)) * 2).sum(axis=1), terms=3, scale=2 * np.exp(3.0))
    assert points == {"chunks": 1, "points": 6, "einsum": 0, "einsum_points": 0}


def test_floor_division_and_strides_narrow_exactly(points: dict[str, int]) -> None:
    A = np.arange(14, dtype=F32).reshape(2, 7)
    src = "def p(float(M,K) A) -> (P, Q) { P(i) +=! A(i, k / 2) where k in 0:1000000000\n" \
          " Q(i) +=! A(i, 2*k + 1) where k in -1000000000:1000000000 }"
    p, q = tc.define(src)(A, backend="numpy")
    np.testing.assert_array_equal(p, 2 * A.sum(axis=1))
    np.testing.assert_array_equal(q, A[:, 1::2].sum(axis=1))
    assert points["points"] + points["einsum_points"] == 2 * 14 + 2 * 3


def test_two_index_subscript_narrows_both(points: dict[str, int]) -> None:
    src = "def p(float(M,K) A) -> (P) { P(i) +=! A(i, k + j) where k in 0:1000000000, j in 0:1000000000 }"
    got = tc.define(src)(A23, backend="numpy")
    np.testing.assert_array_equal(got, A23 @ np.asarray([1, 2, 3], F32))
    assert points["points"] + points["einsum_points"] <= 2 * 3 * 3


def test_band_domain_is_chunked_around_its_points(points: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A(i, k - j) holds on a band of the k x j square: chunks narrowed one by one skip the rest."""
    monkeypatch.setattr(interp, "CHUNK", 16)
    n = 64
    src = f"def p(float(M,K) A) -> (P) {{ P(i) +=! A(i, k - j) * 1.0 + 0.0 where k in 0:{n}, j in 0:{n} }}"
    got = tc.define(src)(A23, backend="numpy")
    counts = np.asarray([n, n - 1, n - 2], F32)  # how many (k, j) pairs give k - j = 0, 1, 2
    np.testing.assert_array_equal(got, A23 @ counts)
    assert points["points"] < 2 * n * n // 4


def test_guards_that_never_hold_run_no_point(points: dict[str, int]) -> None:
    src = "def p(float(M,K) A) -> (P, Q) { P(i) +=! A(i, k + 10) where k in 0:1000000000\n" \
          " Q(i) max=! A(i, k - 5) where k in 0:4 }"
    p, q = tc.define(src)(A23, backend="numpy")
    np.testing.assert_array_equal(p, [0, 0])
    np.testing.assert_array_equal(q, [-np.inf, -np.inf])
    assert points["points"] + points["einsum_points"] == 0


def test_gathers_in_a_huge_box_keep_their_checks(points: dict[str, int]) -> None:
    src = "def g(float(M,K) A, int32(L) Idx) -> (P) { P(i) +=! A(i, Idx(k)) where k in 0:1000000000 }"
    k = tc.define(src)
    idx = np.asarray([2, 0, 2, 1], np.int32)
    np.testing.assert_array_equal(k(A23, idx, backend="numpy"), A23[:, idx].sum(axis=1))
    assert points["points"] == 2 * 4
    with pytest.raises(TcRuntimeError, match="gather out of range.*'A'.*read at 3, outside 0:3"):
        k(A23, np.asarray([0, 3], np.int32), backend="numpy")


def run_interp(src: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """``interp.run`` on the def's instance for these inputs, without the call's own size checks."""
    checked = tc.define(src).checked
    inst = instantiate(checked, bind_sizes(checked, [inputs[t.name].shape for t in checked.inputs]))
    return interp.run(inst, inputs)


def test_range_past_int64_bounded_by_its_guards_runs_on_its_domain(points: dict[str, int]) -> None:
    src = "def p(float(M,K) A) -> (P) { P(i) +=! A(i,k) where k in 0:K + 9223372036854775807 }"
    np.testing.assert_array_equal(run_interp(src, A=A23)["P"], A23.sum(axis=1))
    assert points["einsum_points"] + points["points"] == 6


@pytest.mark.parametrize("run", ["call", "interp"])
def test_index_range_past_int64_is_a_located_error(run: str) -> None:
    """An index that no guard bounds ranges past int64: a located error, on a call or in the
    interpreter alone (never wrapped indices)."""
    src = ("def p(float(M,K) A) -> (P) {\n"
           " P(i) +=! A(i,0) * float(k) where k in 9223372036854775806:K + 9223372036854775806\n}")
    with pytest.raises(TcError, match=r"<string>:2:\d+:.*'k'.*9223372036854775806:9223372036854775809"):
        if run == "call":
            tc.define(src)(A23, backend="numpy")
        else:
            run_interp(src, A=A23)


@pytest.mark.parametrize("n", [0, 2])
def test_a_select_branch_reading_an_empty_tensor_is_never_taken(n: int) -> None:
    k = tc.define("def catc(float(R, N) A, float(R, M) B) -> (O) "
                  "{ O(r, j) = j < N ? A(r, j) : B(r, j - N) where j in 0:N + M }")
    a = np.arange(3 * n, dtype=np.float32).reshape(3, n) - 10
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(a, b, backend="numpy"), np.concatenate([a, b], axis=1))
