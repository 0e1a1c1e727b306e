"""Test support: compare a computed tensor with its reference within floating-point error bounds
(numpy-convertible arrays in; ``None`` or an ``AssertionError`` naming the worst element out).

A float reduction is only defined up to its summation order: vector lanes, tiling, FMA
contraction and the tuner's options all reorder it. Its error is bounded by the sum of the
|terms| it adds, not by its result, so a bare ``rtol`` fails on cancellation-heavy elements.
As in numerical libraries' own tests (LAPACK's ``|C - C_ref| / (K eps |A| |B|)``), the
allowance here is

    |actual - expected| <= C_ABS * eps * terms * scale  +  C_REL * eps * |expected|

where ``eps`` is the machine epsilon of the computation's dtype, ``terms`` the number of terms
K summed into one element, and ``scale`` a magnitude: ``max|A| * max|B|`` (``reduction_scale``,
the bound on one term), or elementwise the sum of |terms| itself (``abs_terms``: the reference
evaluated on |inputs|, the classic worst case ``K eps sum|a b|``), or the largest |expected|
(normwise, the default). ``assert_sum_close`` does the elementwise case in one call. Integer
and boolean results compare exactly; NaN and infinity must sit at the same places (with the
same sign) in both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# Allowance per term, in units of eps. Any order of a K-term sum of products is within
# K * (eps / 2) * sum|terms| of the exact value, so two such results (a backend and the interpreter)
# are within K * eps * sum|terms| of each other: 4 leaves room for normwise scales and chained sums.
C_ABS = 4.0
C_REL = 4.0  # allowance on the result itself: its last rounding and the reference's


def eps(dtype: Any) -> float:
    """Machine epsilon of a float dtype (float16's, float32's, float64's, ...)."""
    return float(np.finfo(np.dtype(dtype)).eps)


def reduction_scale(*factors: Any) -> float:
    """``max|f1| * max|f2| * ...``: a bound on one term of a sum of products of these factors."""
    out = 1.0
    for f in factors:
        a = np.abs(np.asarray(f, dtype=np.float64))
        out *= float(a.max()) if a.size else 0.0
    return out


def reduction_atol(dtype: Any, terms: int, *factors: Any, c: float = C_ABS) -> float:
    """``c * eps(dtype) * terms * max|f1| * max|f2| * ...``: the absolute allowance of a ``terms``-term
    sum of products of ``factors`` computed in ``dtype``."""
    return c * eps(dtype) * max(int(terms), 1) * reduction_scale(*factors)


def abs_terms(fn: Callable[..., Any], *inputs: Any) -> np.ndarray:
    """``fn`` evaluated in float64 on |inputs|: elementwise, the sum of |terms| of ``fn``'s result when
    ``fn`` is a sum of products of its inputs (a matmul, a convolution, a weighted sum)."""
    absed = [np.abs(np.asarray(x, dtype=np.float64)) for x in inputs]
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in a bound is NaN: no allowance there
        return np.asarray(fn(*absed), dtype=np.float64)


def assert_close(actual: Any, expected: Any, *, terms: int = 1, scale: Any = None, dtype: Any = None,
                 c: float = C_ABS, err_msg: str = "") -> None:
    """``actual`` equals ``expected`` within the rounding error of a ``terms``-term float reduction.

    ``scale`` is the magnitude of one term: a number, or an array broadcasting to ``expected``
    (elementwise bounds); ``None`` means the largest finite |expected| (a normwise bound). When
    ``scale`` is the elementwise sum of |terms| (``abs_terms``), pass ``terms`` anyway: the
    allowance is then ``c * eps * terms * sum|terms|``, the classic worst case. ``dtype`` is the
    precision the result was computed in (default: ``actual``'s, else ``expected``'s). Integer
    and boolean results compare exactly.
    """
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{err_msg}: shape {a.shape}, expected {e.shape}"
    if dtype is None:
        dtype = a.dtype if a.dtype.kind == "f" else e.dtype
    if np.dtype(dtype).kind != "f":
        np.testing.assert_array_equal(a, e, err_msg=err_msg)
        return
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    _assert_same_nonfinite(a64, e64, err_msg)
    finite = np.isfinite(e64)
    if scale is None:
        scale = float(np.abs(e64[finite]).max()) if finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are inf: checked above
        bound = c * eps(dtype) * max(int(terms), 1) * np.asarray(scale, dtype=np.float64) \
            + C_REL * eps(dtype) * np.abs(e64)
        err = np.where(finite, np.abs(a64 - e64), 0.0)
    bound = np.broadcast_to(bound, e64.shape)
    bad = err > bound
    if bad.any():
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), np.inf)
        i = _index(int(np.argmax(np.where(bad, ratio, -1.0))), e64.shape)
        raise AssertionError(
            f"{err_msg}\n{int(bad.sum())} of {e64.size} elements off by more than "
            f"{c:g}*eps*{terms}*scale + {C_REL:g}*eps*|expected| ({np.dtype(dtype).name}); worst at {i}: "
            f"actual {float(a64[i])!r}, expected {float(e64[i])!r}, |diff| {err[i]:.3g} > bound {bound[i]:.3g}")


def assert_sum_close(actual: Any, fn: Callable[..., Any], *inputs: Any, terms: int, err_msg: str = "") -> None:
    """``actual`` is ``fn(*inputs)``, a sum of ``terms`` products of the inputs per element (a matmul,
    a convolution): compared with ``fn`` evaluated in float64, within ``c * eps * terms`` times each
    element's own sum of |terms| (``fn`` on |inputs|)."""
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite inputs give non-finite references
        expected = fn(*(np.asarray(x, dtype=np.float64) for x in inputs))
    assert_close(actual, expected, terms=terms, scale=abs_terms(fn, *inputs), err_msg=err_msg)


def _assert_same_nonfinite(a: np.ndarray, e: np.ndarray, err_msg: str) -> None:
    """NaNs where the reference has NaNs, and infinities of the same sign where it has infinities."""
    for what, mask_a, mask_e in (("NaN", np.isnan(a), np.isnan(e)),
                                 ("+inf", np.isposinf(a), np.isposinf(e)),
                                 ("-inf", np.isneginf(a), np.isneginf(e))):
        if not np.array_equal(mask_a, mask_e):
            i = _index(int(np.argmax(mask_a != mask_e)), e.shape)
            raise AssertionError(f"{err_msg}\n{what} positions differ; first at {i}: "
                                 f"actual {float(a[i])!r}, expected {float(e[i])!r}")


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(j) for j in np.unravel_index(flat, shape))
