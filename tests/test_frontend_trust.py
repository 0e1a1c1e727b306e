"""The front end on hostile input: integer literals that do not fit, defs nested or chained
thousands deep (checked, run on the interpreter and the C backend, numbers against numpy), absurd
sizes and ranges, arguments that are not arrays and unclosed parentheses. Every failure is a
located TcError of the right class; nothing else escapes."""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
import pytest

import tcdsl as tc
from tcdsl import deepstack
from tcdsl.core import checked as C
from tcdsl.core import limits
from tcdsl.core.sema import check_def
from tcdsl.errors import (
    TcArgumentError,
    TcError,
    TcRangeError,
    TcSemanticError,
    TcSyntaxError,
    TcTypeError,
)
from tcdsl.grammar import parse

EPS32 = float(np.finfo(np.float32).eps)
BACKENDS = ["numpy", pytest.param("c", marks=pytest.mark.cpu)]


def located(fn, cls: type[TcError], line: int, col: int, *fragments: str, src: str | None = None) -> TcError:
    """``fn()`` raises exactly ``cls`` at ``line:col`` with every fragment in its message."""
    with pytest.raises(TcError) as info:
        fn()
    e = info.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert e.location is not None, str(e)
    assert (e.location.line, e.location.col) == (line, col), str(e)
    if src is not None:
        assert e.location.source_line == src.splitlines()[line - 1]
    for frag in fragments:
        assert frag in e.message, f"{frag!r} not in {e.message!r}"
    return e


@functools.cache
def kernel(src: str) -> tc.Kernel:
    """``tc.define(src)``, once per source (the deep defs take seconds to parse)."""
    return tc.define(src)


def define_error(src: str, cls: type[TcError], line: int, col: int, *fragments: str) -> TcError:
    return located(lambda: tc.define(src), cls, line, col, *fragments, src=src)


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def pairwise_bound(abs_sum: np.ndarray, terms: int) -> np.ndarray:
    """Error bound of a pairwise (balanced) float32 sum of ``terms`` terms: log2(terms) roundings,
    each at most eps/2 of the sum of |terms| (doubled: two computations compared)."""
    return 2 * math.ceil(math.log2(max(terms, 2))) * EPS32 * abs_sum + 1e-30


# ---- integer literals ------------------------------------------------------------------------------

BIG = "99999999999999999999999999999"

LITERALS = [
    # id, source, line, col, fragment
    ("value", f"def f(int32(N) A) -> (O) {{\n  O(i) = A(i) + {BIG}\n}}", 2, 17, "does not fit in int64"),
    ("subscript", f"def f(float(N) A) -> (O) {{\n  O(i) = A(i + {BIG})\n}}", 2, 16, "does not fit in int64"),
    ("condition", f"def f(float(N) A) -> (O) {{\n  O(i) = A(i) > {BIG} ? 1.0 : 0.0\n}}", 2, 17,
     "does not fit in int64"),
    ("where_range", f"def f(float(N) A) -> (O) {{\n  O(i) = A(0) where i in 0:{BIG}\n}}", 2, 28,
     "does not fit in int64"),
    ("where_let", f"def f(float(N) A) -> (O) {{\n  O(i) = A(i) * x where x = {BIG}\n}}", 2, 29,
     "does not fit in int64"),
    ("past_int64_max", "def f(int64(N) A) -> (O) {\n  O(i) = A(i) + 9223372036854775808\n}", 2, 17,
     "integer literal 9223372036854775808 does not fit in int64"),
    ("param_dim", f"def f(float({BIG}) A) -> (O) {{\n  O(i) = A(i)\n}}", 1, 13, f"dim {BIG} of 'A'"),
    ("output_dim", f"def f(float(N) A) -> (float({BIG}) O) {{\n  O(i) = A(i)\n}}", 1, 29, f"dim {BIG} of 'O'"),
    ("uint64_cast", "def f(uint64(N) A) -> (O) {\n  O(i) = A(i) + uint64(18446744073709551616)\n}", 2, 24,
     "does not fit in uint64"),
    ("affine_product", "def f(float(N) A) -> (O) {\n  O(i) = A(i * 4611686018427387904 * 4) where i in 0:N\n}",
     2, 12, "does not fit in int64"),
]


@pytest.mark.parametrize("src,line,col,fragment", [c[1:] for c in LITERALS], ids=[c[0] for c in LITERALS])
def test_literal_that_does_not_fit_is_located(src: str, line: int, col: int, fragment: str) -> None:
    define_error(src, TcTypeError, line, col, fragment)


def test_literal_of_thousands_of_digits_is_a_syntax_error() -> None:
    for src, col in (("def f(float(" + "9" * 5000 + ") A) -> (O) { O(i) = A(i) }", 13),
                     ("def f(float(N) A) -> (O) { O(i) = A(i) + " + "9" * 5000 + " }", 42)):
        define_error(src, TcSyntaxError, 1, col, "5000 digits")
    define_error("def f(float(N) A) -> (O) { O(i) = A(i) + " + "9" * 5000 + ".0 }", TcSyntaxError, 1, 42,
                 "out of the float32 range")


@pytest.mark.parametrize("backend", BACKENDS)
def test_literals_that_fit_agree_with_numpy(backend: str) -> None:
    a = np.array([-3, 0, 7, 2**31 - 1], np.int32)
    k = tc.define("def f(int32(N) A) -> (O) { O(i) = A(i) + 3000000000 }")
    got = k(a, backend=backend)
    assert got.dtype == np.int64  # a literal past int32 is an int64, as in C
    np.testing.assert_array_equal(got, a.astype(np.int64) + 3000000000)
    a64 = np.array([0, 5, 2**62], np.int64)
    low = tc.define("def f(int64(N) A) -> (O) { O(i) = A(i) + -9223372036854775808 }")(a64, backend=backend)
    np.testing.assert_array_equal(low, a64 + np.iinfo(np.int64).min)
    u = np.array([0, 1, 2**63], np.uint64)
    top = tc.define("def f(uint64(N) A) -> (O) { O(i) = A(i) + uint64(18446744073709551615) }")(u, backend=backend)
    np.testing.assert_array_equal(top, u + np.uint64(2**64 - 1))  # wraps modulo 2**64, as numpy does


@pytest.mark.parametrize("backend", BACKENDS)
def test_folded_constant_converts_as_c(backend: str) -> None:
    # an int32 literal stored into uint8 / int8 wraps as C's conversions do, on every backend
    out = tc.define("def f(uint8(N) A) -> (uint8(N) O, int8(N) P) { O(i) = 300 where i in 0:N\n"
                    " P(i) = 200 where i in 0:N }")(np.zeros(3, np.uint8), backend=backend)
    np.testing.assert_array_equal(out[0], np.full(3, 44, np.uint8))
    np.testing.assert_array_equal(out[1], np.full(3, -56, np.int8))
    assert C.wrap(2**64 + 5, "uint64") == 5 and C.wrap(255, "int8") == -1 and C.wrap(-1, "uint16") == 65535


# ---- depth: chains are balanced exactly, nesting runs on a large stack --------------------------------


def _depth(e: C.TExpr) -> int:
    return deepstack.depth(e)


def test_short_chains_keep_their_order_long_ones_are_balanced() -> None:
    for n in (10, deepstack.THRESHOLD // 2):
        short = check_def(parse("def f(float(N) A) -> (O) { O(i) = " + " + ".join(["A(i)"] * n) + " }").defs[0])
        e = short.stmts[0].rhs
        for _ in range(n - 1):  # left to right, as written
            assert isinstance(e, C.Binop) and e.op == "+" and isinstance(e.rhs, C.Read)
            e = e.lhs
    long = check_def(parse("def f(float(N) A) -> (O) { O(i) = " + " - ".join(["A(i)"] * 1000) + " }").defs[0])
    assert _depth(long.stmts[0].rhs) <= 2 * math.ceil(math.log2(1000)) + 2
    assert len(long.stmts[0].accesses) == 1  # one access however often it is read


def test_reads_of_a_large_expression_are_kept_by_identity(monkeypatch) -> None:
    # passes ask for a statement's reads once per read they look at: kept, they are walked once
    src = "def f(float(N) A, float(N) B) -> (O) { O(i) = " + " + ".join(["A(i) * B(i)"] * 200) + " }"
    e = check_def(parse(src).defs[0]).stmts[0].rhs
    first = C.reads(e)
    assert [r.tensor for r in first] == ["A", "B"] * 200
    first.clear()  # a caller's list is its own
    walked = []
    monkeypatch.setattr(C, "operands", lambda x: walked.append(x) or ())
    again = C.reads(e)
    assert walked == []  # not walked again
    monkeypatch.undo()
    assert len(again) == 400 and again is not first
    assert all(x is y for x, y in zip(again, C.reads(e)))  # the same nodes, not copies
    assert C.read_tuple(e) is C.read_tuple(e)  # the kept tuple itself, for passes that index it per read
    other = check_def(parse(src.replace("B(i)", "A(i)")).defs[0]).stmts[0].rhs
    assert [r.tensor for r in C.reads(other)] == ["A"] * 400  # another expression is walked afresh


def chain_def(n: int, seed: int = 7) -> tuple[tc.Kernel, np.ndarray, np.ndarray]:
    """A def of ``n`` binary operators, + and - in a random pattern over A(i), B(i) and the scalars
    s and t; returns the kernel, each term's operand (0: A, 1: B, 2: s, 3: t) and its sign."""
    rng = np.random.default_rng(seed)
    which = rng.integers(0, 4, n + 1)
    signs = np.where(rng.integers(0, 2, n + 1) == 1, 1.0, -1.0)
    signs[0] = 1.0
    names = ("A(i)", "B(i)", "s", "t")
    parts = [names[which[0]]]
    parts += [(" + " if sg > 0 else " - ") + names[w] for w, sg in zip(which[1:], signs[1:])]
    k = tc.define("def f(float(N) A, float(N) B, float s, float t) -> (O) { O(i) = " + "".join(parts) + " }")
    return k, which, signs


def check_chain(k: tc.Kernel, which: np.ndarray, signs: np.ndarray, backend: str) -> None:
    a, b = f32(16, seed=1), f32(16, seed=2)
    s, t = np.float32(0.375), np.float32(-1.25)
    values = [a.astype(np.float64), b.astype(np.float64), np.float64(s), np.float64(t)]
    expected = sum(float(np.sum(signs[which == w])) * values[w] for w in range(4))
    abs_sum = sum(int(np.sum(which == w)) * np.abs(values[w]) for w in range(4))
    got = k(a, b, s, t, backend=backend)
    assert got.dtype == np.float32
    err = np.abs(got - expected)
    assert np.all(err <= pairwise_bound(abs_sum, len(which))), float(np.max(err))


@pytest.fixture(scope="module")
def hundred_thousand() -> tuple[tc.Kernel, np.ndarray, np.ndarray]:
    return chain_def(100_000)


def test_hundred_thousand_operators(hundred_thousand) -> None:
    check_chain(*hundred_thousand, "numpy")


@pytest.mark.cpu
@pytest.mark.slow  # the C compiler alone takes minutes on a 100 000-operator expression
def test_hundred_thousand_operators_on_c(hundred_thousand) -> None:
    check_chain(*hundred_thousand, "c")


@pytest.mark.cpu
def test_ten_thousand_operators_on_c() -> None:
    k, which, signs = chain_def(10_000, seed=3)
    check_chain(k, which, signs, "c")
    check_chain(k, which, signs, "numpy")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("count", [500, 501, 100_001])
def test_unary_minus_runs(count: int, backend: str) -> None:
    a = f32(8)
    k = kernel("def f(float(N) A) -> (O) { O(i) = " + "-" * count + "A(i) }")
    np.testing.assert_array_equal(k(a, backend=backend), a if count % 2 == 0 else -a)
    nots = kernel("def f(float(N) A) -> (O) { O(i) = " + "!" * count + "A(i) }")
    z = np.array([0.0, 1.0, -2.0, np.nan], np.float32)
    want = (z != 0) if count % 2 == 0 else (z == 0)
    np.testing.assert_array_equal(nots(z, backend=backend), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_hundred_chained_operators(backend: str) -> None:
    a = f32(8)
    k = kernel("def f(float(N) A) -> (O) { O(i) = " + " + ".join(["A(i)"] * 501) + " }")
    got = k(a, backend=backend)
    assert np.all(np.abs(got - 501 * a.astype(np.float64)) <= pairwise_bound(501 * np.abs(a), 501))


M = 5000


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_thousand_nested_parentheses(backend: str) -> None:
    a = f32(8)
    alternating = kernel("def f(float(N) A) -> (O) { O(i) = " + "(" * M + "A(i)" + " + 1.0) * 0.5" * M + " }")
    x = a.copy()
    for _ in range(M):
        x = (x + np.float32(1.0)) * np.float32(0.5)
    np.testing.assert_array_equal(alternating(a, backend=backend), x)  # each step exact in float32 order
    right = kernel("def f(float(N) A) -> (O) { O(i) = " + "A(i) + (" * M + "A(i)" + ")" * M + " }")
    y = a.copy()
    for _ in range(M):
        y = a + y  # innermost first, as the parentheses say
    np.testing.assert_array_equal(right(a, backend=backend), y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_thousand_nested_calls_and_ternaries(backend: str) -> None:
    a = f32(8)
    calls = kernel("def f(float(N) A) -> (O) { O(i) = " + "fabs(-" * M + "A(i)" + ")" * M + " }")
    np.testing.assert_array_equal(calls(a, backend=backend), np.abs(a))
    tern = kernel("def f(float(N) A) -> (O) { O(i) = "
                     + "".join(f"A(i) > {1 - k / M:.6f} ? {k}.0 : " for k in range(M)) + "-1.0 }")
    thresholds = np.array([float(f"{1 - k / M:.6f}") for k in range(M)], np.float32)
    want = np.array([next((k for k, t in enumerate(thresholds) if v > t), -1) for v in a], np.float32)
    np.testing.assert_array_equal(tern(a, backend=backend), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_chains_are_exact_in_integers_and_follow_c_promotions(backend: str) -> None:
    # int32 terms wrap in int32 until the int64 term, then sum in int64: the balanced tree is cut
    # where the running type changes, so it equals left-to-right evaluation exactly
    n = 100
    a = np.array([2**30, -(2**30) + 7, 123456789, -1], np.int32)
    big = np.array([2**40, 5, -(2**50), 0], np.int64)
    src = ("def f(int32(N) A, int64(N) L) -> (O) { O(i) = " + " + ".join(["A(i)"] * n) + " + L(i) + "
           + " + ".join(["A(i)"] * n) + " }")
    first = (a.astype(np.int64) * n + 2**31) % 2**32 - 2**31  # int32 wrap-around
    want = first + big + a.astype(np.int64) * n
    got = kernel(src)(a, big, backend=backend)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # unsigned: a long run of subtractions wraps modulo 2**32
    u = np.array([0, 1, 2**32 - 1, 12345], np.uint32)
    v = np.array([7, 2**31, 3, 0], np.uint32)
    sub = kernel("def f(uint32(N) U, uint32(N) V) -> (O) { O(i) = U(i)" + " - V(i)" * n + " }")
    np.testing.assert_array_equal(sub(u, v, backend=backend),
                                  ((u.astype(np.int64) - n * v.astype(np.int64)) % 2**32).astype(np.uint32))
    # int8 terms promote to int32 first, as in C
    s8 = np.array([127, -128, 5], np.int8)
    p8 = kernel("def f(int8(N) A) -> (O) { O(i) = " + " + ".join(["A(i)"] * n) + " }")(s8, backend=backend)
    np.testing.assert_array_equal(p8, s8.astype(np.int32) * n)
    # && and || keep their short-circuit order: the right of && reads only where the left held
    idx = np.array([0, 5, 1], np.int32)
    t = np.array([1.0, 2.0], np.float32)
    guard = kernel("def f(int32(N) I, float(M) T) -> (O) { O(i) = "
                      + " && ".join(["I(i) < 2"] * n + ["T(I(i)) > 0.0"] * 3) + " }")
    np.testing.assert_array_equal(guard(idx, t, backend=backend), [True, False, True])


def test_nesting_past_the_large_stack_is_a_located_error(monkeypatch) -> None:
    monkeypatch.setattr(deepstack, "RECURSION_LIMIT", 3000)
    limit = sys.getrecursionlimit()
    src = "def deep(float(N) A) -> (O) {\n  O(i) = " + "(" * 3000 + "A(i)" + " + 1.0) * 0.5" * 3000 + "\n}"
    e = define_error(src, TcSemanticError, 1, 5, "def 'deep' nests its expressions too deeply")
    assert "RecursionError" not in str(e)
    assert sys.getrecursionlimit() == limit  # restored


def test_deep_call_returns_and_raises_on_the_caller() -> None:
    assert deepstack.call(lambda x: x + 1, (1,)) == 2
    with pytest.raises(KeyError):
        deepstack.call(lambda: {}["missing"])
    assert deepstack.depth(parse("def f(float(N) A) -> (O) { O(i) = " + "exp(" * 300 + "A(i)" + ")" * 300
                                 + " }")) > 300


# ---- escapes: absurd sizes and ranges -------------------------------------------------------------

A4 = np.arange(4, dtype=np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_larger_than_memory_names_the_range(backend: str) -> None:
    src = "def f(float(N) A) -> (O) {\n  O(i) = A(0) where i in 0:10000000000000\n}"
    k = tc.define(src)
    e = located(lambda: k(A4, backend=backend), TcRangeError, 2, 21, "40000000000000 bytes", "0:10000000000000",
                "index 'i'", "memory", src=src)
    assert "'O'" in e.message


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_check_counts_every_tensor(monkeypatch, backend: str) -> None:
    monkeypatch.setattr(limits, "physical_memory", lambda: 1 << 20)
    src = "def f(float(N) A) -> (float(N, N) O, T) {\n  O(i, j) = A(i) * A(j)\n  T(i) = A(i)\n}"
    k = tc.define(src)
    np.testing.assert_array_equal(k(np.ones(256, np.float32), backend=backend)[0], np.ones((256, 256)))  # 256 KiB
    a = np.ones(600, np.float32)  # 600 * 600 * 4 bytes: past 1 MiB
    located(lambda: k(a, backend=backend), TcRangeError, 1, 23, "'O' needs 1440000 bytes", "1.0 MiB of memory",
            src=src)


SIZES = [
    # id, source, line, col, fragments
    ("range_past_int64_bytes", "def f(float(N) A) -> (O) {\n  O(i) = A(0) where i in 0:4611686018427387904\n}", 2, 21,
     ("18446744073709551616 bytes", "past the int64 range", "0:4611686018427387904")),
    ("product_of_ranges", "def f(float(N) A) -> (O) {\n  O(i, j) = A(0) where i in 0:4294967296, j in 0:4294967296\n}",
     2, 24, ("shape (4294967296, 4294967296)", "past the int64 range")),
    ("size_times_literal", "def f(float(N) A) -> (O) {\n  O(i) = A(0) where i in 0:N * 4611686018427387904\n}", 2, 21,
     ("shape (18446744073709551616,)", "4611686018427387904*N")),
    ("subscript_past_int64", "def f(float(N) A) -> (O) {\n  O(i) = A(i + 9223372036854775807) where i in 0:N\n}", 2,
     10, ("subscript 0 of 'A'", "past int64", "i in 0:4")),
]


@pytest.mark.parametrize("src,line,col,fragments", [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_past_int64_are_located(src: str, line: int, col: int, fragments: tuple[str, ...],
                                      backend: str) -> None:
    k = tc.define(src)
    located(lambda: k(A4, backend=backend), TcRangeError, line, col, *fragments, src=src)
    located(lambda: k.instance(A4), TcRangeError, line, col, *fragments, src=src)  # before any allocation


def test_declared_dims_past_int64_bytes() -> None:
    define_error("def f(float(4294967296, 4294967296) A) -> (O) {\n  O(i, j) = A(i, j)\n}", TcTypeError, 1, 7,
                 "'A' is declared with 4294967296 * 4294967296 elements", "73786976294838206464 bytes")
    define_error("def f(float(N) A) -> (float(4294967296, 4294967296) O) {\n  O(i, j) = A(0) where i in 0:N, "
                 "j in 0:N\n}", TcTypeError, 1, 23, "'O' is declared with")


def test_huge_declared_dim_is_a_located_argument_error() -> None:
    src = "def f(float(999999999999999999) A) -> (O) {\n  O(i) = A(i)\n}"
    located(lambda: tc.define(src)(A4), TcArgumentError, 1, 7, "declared 999999999999999999 but the argument has 4",
            src=src)


# ---- non-array arguments ---------------------------------------------------------------------------

SRC2 = "def f(\n  float(N) A,\n  float s\n) -> (O) {\n  O(i) = A(i) * s\n}"


@pytest.mark.parametrize("arg,fragment", [
    ([1.0, 2.0], "argument 'A' is a list, not an array"),
    ("ab", "argument 'A' is a str, not an array"),
    (None, "argument 'A' is a NoneType, not an array"),
    ({"x": 1}, "argument 'A' is a dict, not an array"),
    (object(), "argument 'A' is a object, not an array"),
    (1.5, "'A' is declared with 1 dims but the argument is the scalar 1.5"),
    (np.float32(1.5), "'A' is declared with 1 dims but the argument is the scalar np.float32(1.5)"),
    (np.ones(3, np.float64), "'A' is declared float32 but the argument has dtype float64"),
    (np.ones(3, np.complex64), "'A' is declared float32 but the argument has dtype complex64"),
    (np.array(["a"]), "'A' is declared float32 but the argument has dtype <U1"),
    (np.ones((3, 2), np.float32), "'A' is declared with 1 dims but the argument has 2"),
], ids=["list", "str", "None", "dict", "object", "float", "np_scalar", "float64", "complex", "unicode", "rank"])
def test_bad_argument_is_located_at_its_param(arg, fragment: str) -> None:
    k = tc.define(SRC2)
    located(lambda: k(arg, np.float32(2.0)), TcArgumentError, 2, 3, fragment, src=SRC2)


@pytest.mark.parametrize("arg,fragment", [
    ("x", "argument 's' is a str, not an array"),
    (None, "argument 's' is a NoneType, not an array"),
    (2.5 + 1j, "argument 's' is a complex, not an array"),
])
def test_bad_scalar_argument_is_located(arg, fragment: str) -> None:
    k = tc.define(SRC2)
    located(lambda: k(np.ones(3, np.float32), arg), TcArgumentError, 3, 3, fragment, src=SRC2)


def test_short_form_bad_argument_points_at_its_first_use() -> None:
    @tc.define("B(i) = X(i) * 2.0")
    def double(X):
        pass

    np.testing.assert_array_equal(double(np.ones(2, np.float32)), [2.0, 2.0])
    e = located(lambda: double([1.0, 2.0]), TcArgumentError, 1, 8, "argument 'X' is a list")
    assert e.location.source_line == "B(i) = X(i) * 2.0"


# ---- unclosed parentheses --------------------------------------------------------------------------


UNCLOSED = [
    # id, source, line, col, fragments
    ("paren_then_brace", "def f(float(N) A) -> (B) {\n  B(i) = A(i\n}", 2, 11,
     ("'(' was never closed", "stopped at 3:1", "unexpected '}'")),
    ("inner_closed_outer_not", "def f(float(N) A) -> (B) {\n  B(i) = exp(A((i))\n}", 2, 13,
     ("'(' was never closed", "stopped at 3:1")),
    ("paren_at_end", "def f(float(N) A) -> (B) {\n  B(i) = (A(i) + 1.0", 2, 10,
     ("'(' was never closed", "stopped at 2:21", "unexpected end of text")),
    ("brace_at_end", "def f(float(N) A) -> (B) {\n  B(i) = A(i)\n  # done\n", 1, 26,
     ("'{' was never closed", "stopped at 2:14")),
    ("where_bound", "def f(float(N) A) -> (B) {\n  B(i) = A(0) where i in 0:(N\n}", 2, 28,
     ("'(' was never closed", "stopped at 3:1")),
]


@pytest.mark.parametrize("src,line,col,fragments", [c[1:] for c in UNCLOSED], ids=[c[0] for c in UNCLOSED])
def test_unclosed_bracket_points_where_it_opens(src: str, line: int, col: int, fragments: tuple[str, ...]) -> None:
    e = located(lambda: parse(src), TcSyntaxError, line, col, *fragments, src=src)
    assert e.location.width == 1
    assert e.__cause__ is None and e.__suppress_context__


def test_other_syntax_errors_keep_their_place() -> None:
    # a wrong token inside open parentheses on the same line, or an extra ')', is not "never closed"
    for src, line, col, frag in (("def f(float(N) A) -> (B) {\n  B(i) = A(i))\n}", 2, 14, "unexpected ')'"),
                                 ("def f(float(N) A) -> (B) {\n  B(i) = A(i $)\n}", 2, 14, "unexpected character"),
                                 ("def f(float(N) A) -> (B) {\n  B(i) = A(i}\n}", 2, 11, "'(' was never closed")):
        e = located(lambda src=src: parse(src), TcSyntaxError, line, col, frag, src=src)
        if "never" not in frag:
            assert "never closed" not in e.message
