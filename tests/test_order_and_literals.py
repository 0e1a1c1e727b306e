"""Interpreter and C backend agree on what the order of evaluation decides: integer reductions
wrap in the target's type, products fold into the running value term by term, and constants
that round to inf or NaN in their type print as C's INFINITY/NAN."""

from __future__ import annotations

import numpy as np
import pytest

import tcdsl as tc


def both(src: str, *args: np.ndarray) -> list[np.ndarray]:
    k = tc.define(src)
    return [np.asarray(k(*args, backend=b)) for b in ("numpy", "c")]


@pytest.mark.cpu
@pytest.mark.parametrize(("dtype", "op"), [("int32", "*=!"), ("int16", "*=!"), ("int32", "+=!"), ("int8", "+=!"),
                                           ("uint16", "*=!"), ("int64", "*=!")])
def test_integer_reductions_wrap_in_the_target_type(dtype: str, op: str) -> None:
    info = np.iinfo(dtype)
    a = np.array([info.max // 3, info.max // 2, 7, 3], dtype=dtype)
    want = np.array(a[0], dtype=dtype)
    with np.errstate(over="ignore"):
        for x in a[1:]:
            want = (want * x if op == "*=!" else want + x).astype(dtype)
    for src in (f"def f({dtype}(N) A) -> (O) {{ O {op} A(r) }}",
                f"def f({dtype}(N) A) -> (O) {{ O(i) {op} A(r) where i in 0:2 }}"):
        for got in both(src, a):
            np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))


@pytest.mark.cpu
def test_a_product_folds_into_the_running_value_term_by_term() -> None:
    src = "def f(float(N) A, float(K) B) -> (Y) {\n  Y(i) = A(i)\n  Y(i) *= B(r)\n}"
    a = np.array([0.0, 2.0, -1.0], np.float32)
    b = np.array([1e30, 1e30, 1e-30], np.float32)  # the terms' own product overflows, the running one
    want = np.array([0.0, np.inf, -np.inf], np.float32)  # does only where the value is not 0
    for got in both(src, a, b):
        np.testing.assert_array_equal(got, want)


@pytest.mark.cpu
@pytest.mark.parametrize(("src", "want"), [
    ("def f(float16(N) A) -> (O) { O(i) = 70000 + A(i) }", np.inf),  # 70000 is inf in float16
    ("def f(float(N) A) -> (O) { O(i) = A(i) - 1e38 * 10.0 }", -np.inf),  # folded past float32's max
    ("def f(float(N) A) -> (O) { O(i) = A(i) + 1e38 * 10.0 - 1e38 * 10.0 }", np.nan),
])
def test_constants_that_round_to_non_finite_values_compile(src: str, want: float) -> None:
    k = tc.define(src)
    a = np.array([0.0, 1.0], dtype=k.checked.inputs[0].dtype)
    for got in both(src, a):
        np.testing.assert_array_equal(got, np.full(2, want, dtype=got.dtype))
