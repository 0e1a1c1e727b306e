"""The suite's comparison helper (tests/tolerance.py): float reductions within c*eps*K of their sums of
|terms| whatever the summation order, one missing term or a misplaced NaN caught, integers exact."""

from __future__ import annotations

import numpy as np
import pytest
from tolerance import abs_terms, assert_close, assert_sum_close, eps, reduction_atol


def _mats(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _summed(A: np.ndarray, B: np.ndarray, order: np.ndarray) -> np.ndarray:
    """A @ B in float32, one rank-1 update at a time, in the given order of k."""
    C = np.zeros((A.shape[0], B.shape[1]), np.float32)
    for k in order:
        C += np.outer(A[:, k], B[k])
    return C


@pytest.mark.parametrize("seed", range(5))
def test_any_summation_order_passes(seed: int) -> None:
    A, B = _mats(32, 300, 32, seed)
    rng = np.random.default_rng(seed + 10)
    for order in (np.arange(300), np.arange(300)[::-1], rng.permutation(300)):
        assert_sum_close(_summed(A, B, order), np.matmul, A, B, terms=300)
    # a bare rtol does not hold: cancellation leaves some element far off relative to itself
    C = _summed(A, B, rng.permutation(300))
    want = A.astype(np.float64) @ B
    assert (np.abs(C - want) / np.abs(want)).max() > 1e-6


@pytest.mark.parametrize("k", [1, 17, 300])
def test_one_missing_term_fails(k: int) -> None:
    A, B = _mats(8, k, 8, seed=k)
    C = A @ B
    C[3, 4] -= A[3, k - 1] * B[k - 1, 4]
    with pytest.raises(AssertionError, match=r"1 of 64 elements .* worst at \(3, 4\)"):
        assert_sum_close(C, np.matmul, A, B, terms=k)


def test_bounds_scale_with_terms_dtype_and_magnitude() -> None:
    A, B = _mats(4, 4, 4)
    assert reduction_atol(np.float32, 10, A, B) == pytest.approx(
        4 * eps(np.float32) * 10 * np.abs(A).max() * np.abs(B).max())
    assert reduction_atol(np.float64, 10, A, B) < reduction_atol(np.float32, 10, A, B) * 1e-8
    np.testing.assert_array_equal(abs_terms(np.matmul, A, B), np.abs(A.astype(np.float64)) @ np.abs(B))
    x = np.float32(1.0)
    assert_close(x + np.float32(3e-6), 1.0, terms=8)  # 8 terms of magnitude 1: 3.8e-6 allowed
    with pytest.raises(AssertionError):
        assert_close(x + np.float32(3e-6), 1.0, terms=1)
    with pytest.raises(AssertionError):  # computed in float64: eps is float64's
        assert_close(np.float64(1.0) + 1e-12, 1.0, terms=8)


def test_non_finite_positions_and_signs_must_match() -> None:
    got = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert_close(got, np.array([1.0, np.nan, np.inf, -np.inf]))
    for want in ([1.0, 0.0, np.inf, -np.inf], [1.0, np.nan, -np.inf, -np.inf], [np.nan, np.nan, np.inf, -np.inf]):
        with pytest.raises(AssertionError, match="positions differ"):
            assert_close(got, np.array(want))


def test_integers_compare_exactly() -> None:
    assert_close(np.array([1, 2], np.int32), np.array([1, 2]), terms=1000)
    with pytest.raises(AssertionError):
        assert_close(np.array([1, 2], np.int32), np.array([1, 3]), terms=1000)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros(2, np.float32), np.zeros(3))
