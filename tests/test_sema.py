"""Semantic analysis: every semantic, type and range error is located (class, line:col, message), the
inferred types and outputs/temporaries are right, errors pickle, and call-time argument errors name
what went wrong."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.errors import TcArgumentError, TcError, TcRangeError, TcSemanticError, TcTypeError


def expect_error(src: str, cls: type[TcError], line: int, col: int, *fragments: str) -> TcError:
    """``tc.define(src)`` raises exactly ``cls`` at ``<string>:line:col`` with every fragment in its message."""
    with pytest.raises(TcError) as info:
        tc.define(src)
    e = info.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert e.location is not None
    assert (e.location.file, e.location.line, e.location.col) == ("<string>", line, col), str(e)
    assert f"<string>:{line}:{col}:" in str(e)
    assert e.location.source_line == src.splitlines()[line - 1]
    for frag in fragments:
        assert frag in e.message, f"{frag!r} not in {e.message!r}"
    return e


# ---- reductions and writes ------------------------------------------------------------------------


def test_reduction_without_bang_into_unwritten_output_needs_out() -> None:
    """TC's meaning: ``O(i) += ...`` updates the caller's O in place, so a call must pass it."""
    k = tc.define("def f(float(N, K) A) -> (O) {\n"
                  "    O(i) += A(i, k)\n"
                  "}")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(TcArgumentError) as info:
        k(a)
    e = info.value
    assert e.location is not None and (e.location.line, e.location.col) == (2, 5)
    assert "'O'" in e.message and "out=" in e.message and "'+=!'" in e.message
    lines = str(e).splitlines()
    assert lines[1].strip() == "O(i) += A(i, k)"
    assert lines[2].index("^") == lines[1].index("O(i)")  # the caret sits under the statement
    o = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    assert k(a, out=o) is o
    np.testing.assert_array_equal(o, np.array([1.0, -2.0, 3.0], np.float32) + a.sum(axis=1))


def test_reduction_without_bang_into_unwritten_temporary() -> None:
    src = ("def f(float(N, K) A) -> (O) {\n"
           "    T(i) += A(i, k)\n"
           "    O(i) = T(i)\n"
           "}")
    e = expect_error(src, TcSemanticError, 2, 5, "temporary 'T'", "uninitialised", "'+=!'")
    lines = str(e).splitlines()
    assert lines[1].strip() == "T(i) += A(i, k)"


def test_max_reduction_without_bang_suggests_max_bang() -> None:
    k = tc.define("def f(float(N, K) A) -> (O) {\n"
                  "    O(i) max= A(i, k)\n"
                  "}")
    with pytest.raises(TcArgumentError) as info:
        k(np.ones((2, 2), np.float32))
    assert "'max=!'" in info.value.message and "out=" in info.value.message


def test_reduction_without_bang_after_a_write_is_allowed() -> None:
    k = tc.define("def f(float(N, K) A) -> (O) {\n"
                  "    O(i) = A(i, 0)\n"
                  "    O(i) += A(i, k)\n"
                  "}")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(a), a[:, 0] + a.sum(axis=1))


def test_assignment_with_reduction_index() -> None:
    src = ("def f(float(N, K) A) -> (O) {\n"
           "    O(i) = A(i, k)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 17, "index 'k'", "reduction index", "'+=!'")


def test_writing_an_input() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "    A(i) = 1.0\n"
           "}")
    expect_error(src, TcSemanticError, 3, 5, "'A' is an input", "cannot be written")


def test_unknown_tensor() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i) + B(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 19, "'B'", "not a tensor or builtin")


def test_unknown_function() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = foo(A(i))\n"
           "}")
    expect_error(src, TcSemanticError, 2, 12, "'foo'", "not a tensor or builtin")


def test_wrong_number_of_subscripts() -> None:
    src = ("def f(float(N, M) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 12, "'A' has 2 dims", "1 subscripts")


def test_wrong_number_of_lhs_indices_for_a_written_tensor() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "    O(i, j) = A(i) * A(j)\n"
           "}")
    expect_error(src, TcSemanticError, 3, 5, "'O' has 1 dims", "2 indices")


def test_tensor_used_without_subscripts() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "    P(i) = A + 1.0\n"
           "}")
    expect_error(src, TcSemanticError, 3, 12, "tensor 'A' has 1 dims", "without subscripts")


def test_builtin_with_wrong_arity() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = exp(A(i), 1.0)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 12, "builtin 'exp' takes 1 argument", "got 2")
    src2 = ("def f(float(N) A) -> (O) {\n"
            "    O(i) = 1.0 + pow(A(i))\n"
            "}")
    expect_error(src2, TcSemanticError, 2, 18, "builtin 'pow' takes 2 arguments", "got 1")


def test_output_never_written() -> None:
    src = ("def f(float(N) A) -> (O, P) {\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 1, 26, "output 'P'", "never written")


def test_duplicate_param() -> None:
    src = ("def f(float(N) A,\n"
           "      float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 16, "parameter 'A'", "declared twice")


def test_output_also_a_param() -> None:
    src = ("def f(float(N) A) -> (A) {\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 1, 23, "'A' is both an input and an output")


def test_typed_output_size_symbol_not_defined_by_an_input() -> None:
    src = ("def f(float(N) A) -> (float(M) O) {\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 1, 29, "size symbol 'M'", "output 'O'", "not a size of any input")


def test_typed_output_with_known_symbol_is_accepted() -> None:
    k = tc.define("def f(float(N) A) -> (double(N) O) {\n"
                  "    O(i) = A(i) * 2.0\n"
                  "}")
    out = k(np.array([1.0, 2.5], dtype=np.float32))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [2.0, 5.0])


def test_output_read_before_written() -> None:
    src = ("def f(float(N) A) -> (O, P) {\n"
           "    P(i) = O(i) + A(i)\n"
           "    O(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 12, "'O'", "read before any statement writes it")


def test_temp_read_before_written() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i) + T(i)\n"
           "    T(i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 19, "'T'", "read before")


def test_reduction_reading_its_own_lhs() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "    O(i) +=! O(i) * 2.0\n"
           "}")
    expect_error(src, TcSemanticError, 3, 14, "reads 'O'", "reduces into")


def test_assignment_reading_its_lhs_at_another_point() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "    O(i) = O(i) + O(0)\n"
           "}")
    expect_error(src, TcSemanticError, 3, 19, "reads 'O' at another point")


def test_assignment_reading_its_lhs_at_the_written_point_is_allowed() -> None:
    k = tc.define("def f(float(N) A) -> (O) {\n"
                  "    O(i) = A(i)\n"
                  "    O(i) = O(i) * O(i) + 1.0\n"
                  "}")
    a = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(k(a), a * a + 1)


# ---- subscripts and indices -----------------------------------------------------------------------


def test_float_literal_subscript() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i) + A(1.5)\n"
           "}")
    e = expect_error(src, TcTypeError, 2, 21, "subscript of 'A'", "float32", "integers")
    assert isinstance(e, TcSemanticError)


def test_float_tensor_subscript() -> None:
    src = ("def f(float(N) A, float(N) B) -> (O) {\n"
           "    O(i) = A(B(i))\n"
           "}")
    expect_error(src, TcTypeError, 2, 14, "subscript of 'A'", "float32")


def test_non_affine_subscript_without_reads() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i, j) = A(i*j)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 17, "'i * j'", "neither affine", "data-dependent")


def test_index_twice_on_lhs() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i, i) = A(i)\n"
           "}")
    expect_error(src, TcSemanticError, 2, 10, "index 'i' appears twice on the left")


def test_where_range_on_unused_index() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i) where j in 0:N\n"
           "}")
    expect_error(src, TcRangeError, 2, 23, "'j'", "does not use")


def test_lhs_range_not_starting_at_zero() -> None:
    """TC's rule: the extent is the range's upper bound; the points below it are 0."""
    k = tc.define("def f(float(N) A) -> (O) {\n"
                  "    O(i) = A(i - 1)\n"
                  "}")
    a = np.array([5.0, 6.0, 7.0], dtype=np.float32)
    np.testing.assert_array_equal(k(a), [0.0, 5.0, 6.0, 7.0])


def test_lhs_range_starting_below_zero() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i + 1)\n"
           "}")
    expect_error(src, TcRangeError, 2, 7, "index 'i'", "-1:N - 1", "below 0", "where i in 0:")


def test_lhs_range_not_starting_at_zero_is_fixed_by_where() -> None:
    k = tc.define("def f(float(N) A) -> (O) {\n"
                  "    O(i) = A(i - 1) where i in 0:N\n"
                  "}")
    a = np.array([5.0, 6.0, 7.0], dtype=np.float32)
    np.testing.assert_array_equal(k(a), [0.0, 5.0, 6.0])


def test_unsolvable_index() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i, j) = A(i)\n"
           "}")
    expect_error(src, TcRangeError, 2, 10, "cannot infer the range of index 'j'", "where j in lo:hi")


def test_unsolvable_reduction_index() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) +=! A(i) * float(r)\n"
           "}")
    expect_error(src, TcRangeError, 2, 27, "index 'r'", "where r in")


def test_reads_that_disagree_take_the_intersection() -> None:
    """TC's rule: the largest range in which every read is in bounds."""
    k = tc.define("def f(float(N) A, float(M) B) -> (O) {\n"
                  "    O(i) = A(i) + B(i)\n"
                  "}")
    assert "i in 0:min(M, N)" in str(k.checked)
    a, b = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.float32) * 10
    np.testing.assert_array_equal(k(a, b), a[:3] + b)
    np.testing.assert_array_equal(k(b, a), a[:3] + b)


def test_empty_where_range() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) +=! A(i) where i in 3:3\n"
           "}")
    k = tc.define(src)  # runs on no points: the extent is the upper bound, every point 0
    np.testing.assert_array_equal(k(np.ones(5, np.float32)), np.zeros(3, np.float32))


def test_where_range_past_a_typed_output() -> None:
    src = ("def f(float(N) A) -> (float(N) O) {\n"
           "    O(i) = A(i) where i in 0:N + 1\n"
           "}")
    expect_error(src, TcRangeError, 2, 23, "index 'i'", "0:N + 1", "'O'")


def test_duplicate_def_names() -> None:
    src = ("def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "}\n"
           "def f(float(N) A) -> (O) {\n"
           "    O(i) = A(i) * 2.0\n"
           "}")
    expect_error(src, TcSemanticError, 4, 5, "def 'f'", "twice")


def test_multi_def_library_checks_each_def() -> None:
    src = ("def g(float(N) A) -> (O) {\n"
           "    O(i) = A(i)\n"
           "}\n"
           "def h(float(N) A) -> (O) {\n"
           "    O(i) = A(i, 0)\n"
           "}")
    expect_error(src, TcSemanticError, 5, 12, "'A' has 1 dims", "2 subscripts")


# ---- types, outputs, temporaries ------------------------------------------------------------------

TYPES_SRC = """def types(int32(N) A, float(N) B, double(N) D) -> (I, F, G, X, Bo, Last) {
    I(i) = A(i) * 2 - A(i) / 2
    F(i) = A(i) + 1.0
    G(i) = A(i) + B(i)
    X(i) = B(i) + D(i)
    Bo(i) = A(i) < 3
    T(i) = A(i) + 1
    Last(i) = T(i) * 10
}"""


def test_output_dtypes_inferred() -> None:
    k = tc.define(TYPES_SRC)
    assert [(t.name, t.dtype) for t in k.checked.outputs] == [
        ("I", "int32"), ("F", "float32"), ("G", "float32"), ("X", "float64"), ("Bo", "bool"), ("Last", "int32")]
    assert [(t.name, t.dtype, t.role) for t in k.checked.temps] == [("T", "int32", "temp")]
    text = str(k.checked)
    assert "# output float64(N) X" in text
    assert "# temp int32(N) T" in text


def test_call_results_follow_inferred_types_and_skip_temps() -> None:
    k = tc.define(TYPES_SRC)
    a = np.array([-3, 0, 5, 7], dtype=np.int32)
    b = np.array([0.5, 1.5, -2.0, 4.0], dtype=np.float32)
    d = np.array([0.25, 1e-10, 3.0, -1.0], dtype=np.float64)
    res = k(a, b, d)
    assert isinstance(res, tuple) and len(res) == 6  # T is a temporary: not returned
    i, f, g, x, bo, last = res
    assert [r.dtype for r in res] == [np.int32, np.float32, np.float32, np.float64, np.bool_, np.int32]
    np.testing.assert_array_equal(i, a * 2 - a // 2)  # floor division
    np.testing.assert_array_equal(f, a.astype(np.float32) + np.float32(1.0))
    np.testing.assert_array_equal(g, a.astype(np.float32) + b)
    np.testing.assert_array_equal(x, b.astype(np.float64) + d)
    np.testing.assert_array_equal(bo, a < 3)
    np.testing.assert_array_equal(last, (a + 1) * 10)


def test_outputs_follow_declaration_order() -> None:
    k = tc.define("def f(float(N) A) -> (Second, First) {\n"
                  "    First(i) = A(i) + 1.0\n"
                  "    Tmp(i) = First(i) * 2.0\n"
                  "    Second(i) = Tmp(i) - A(i)\n"
                  "}")
    assert [t.name for t in k.checked.outputs] == ["Second", "First"]
    assert [t.name for t in k.checked.temps] == ["Tmp"]
    a = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    second, first = k(a)
    np.testing.assert_array_equal(first, a + 1)
    np.testing.assert_array_equal(second, (a + 1) * 2 - a)


# ---- pickling and call-time errors ----------------------------------------------------------------


@pytest.mark.parametrize("src, cls", [
    ("def f(float(N) A) -> (O) {\n    T(i) += A(i)\n    O(i) = T(i)\n}", TcSemanticError),
    ("def f(float(N) A) -> (O) {\n    O(i) = A(0.5)\n}", TcTypeError),
    ("def f(float(N) A) -> (O) {\n    O(i, j) = A(i)\n}", TcRangeError),
])
def test_errors_pickle(src: str, cls: type[TcError]) -> None:
    with pytest.raises(cls) as info:
        tc.define(src)
    e = info.value
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is cls
    assert e2.message == e.message
    assert e2.location == e.location and e2.location is not None
    assert str(e2) == str(e)


CALL_SRC = ("def f(float(N, K) A,\n"
            "      float(K) B) -> (O) {\n"
            "    O(i) +=! A(i, k) * B(k)\n"
            "}")


def _call_error(*args: object) -> TcArgumentError:
    k = tc.define(CALL_SRC)
    with pytest.raises(TcArgumentError) as info:
        k(*args)
    e = info.value
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is TcArgumentError and e2.message == e.message and e2.location == e.location
    return e


def test_call_arity_error() -> None:
    e = _call_error(np.zeros((2, 3), np.float32))
    assert "takes 2 arguments" in e.message and "got 1" in e.message


def test_call_rank_error() -> None:
    e = _call_error(np.zeros((2, 3), np.float32), np.zeros((3, 1), np.float32))
    assert "'B'" in e.message and "1 dims" in e.message and "2" in e.message
    assert e.location is not None and (e.location.line, e.location.col) == (2, 7)


def test_call_dtype_error() -> None:
    e = _call_error(np.zeros((2, 3), np.float64), np.zeros(3, np.float32))
    assert "'A'" in e.message and "float32" in e.message and "float64" in e.message
    assert e.location is not None and (e.location.line, e.location.col) == (1, 7)


def test_call_size_symbol_conflict_names_symbol_and_both_sizes() -> None:
    e = _call_error(np.zeros((2, 3), np.float32), np.zeros(5, np.float32))
    assert "size symbol K" in e.message
    assert "3" in e.message and "5" in e.message
    assert "'A'" in e.message and "'B'" in e.message
    assert f"<string>:{e.location.line}:{e.location.col}:" in str(e)  # type: ignore[union-attr]


def test_call_with_matching_sizes_computes() -> None:
    k = tc.define(CALL_SRC)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.0, -1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(k(a, b), a @ b)
