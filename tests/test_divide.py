"""Division by a constant (codegen.divide): the check that admits a divisor's two-part reciprocal
agrees with every float32 significand, and the kernels that divide by constants and sizes keep the
division's bits on every CPU target this machine runs (zeros, subnormals, huge values, infinities
and NaN included), in float32 and float64."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import divide, toolchain

try:
    from targets import runnable
except ImportError:  # run from another directory
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from targets import runnable

pytestmark = pytest.mark.cpu

NATIVE = toolchain.native_target(tuple(toolchain.compiler())).isa
TARGETS = [pytest.param(n, marks=() if n in (NATIVE, "avx2") else pytest.mark.slow)
           for n in ("avx512", "avx2", "sse2", "generic", "neon") if runnable(n)]


def _every_significand_rounds_as_the_division(c: float) -> bool:
    """Brute force, independently of divide.verified's filter: fma(x, hi, RN(x * lo)) computed
    exactly (the product in float64 is exact, the sum's error kept by TwoSum, a float64 midpoint
    between two float32 resolved by that error) against numpy's float32 division, for all 2^23
    significands x in [1, 2)."""
    c32 = np.float32(c)
    hi, lo = (np.float32(v) for v in divide._split(c))
    x = (np.arange(1 << 23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    p = x.astype(np.float64) * np.float64(hi)
    u = (x * lo).astype(np.float64)
    s = p + u
    b = s - u
    err = (p - b) + (u - (s - b))  # s + err == p + u exactly
    q = s.astype(np.float32)
    d = s - q.astype(np.float64)
    half = np.spacing(q).astype(np.float64) / 2
    away = (np.abs(d) == half) & (err != 0) & (np.sign(err) == np.sign(d))  # past the midpoint, away from q
    q = np.where(away, np.nextafter(q, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf))), q)
    return bool(np.array_equal(q.view(np.uint32), (x / c32).view(np.uint32)))


@pytest.mark.parametrize("significand", [3.0, 1000 / 512, 1.9118579626083374, 1.5676130056381226])
def test_the_check_admits_exactly_the_divisors_whose_two_part_reciprocal_rounds_right(significand: float) -> None:
    """1.9118579626083374 and 1.5676130056381226 (float32 values) each have one significand that
    the two-part product rounds the other way; 3 and 1000's significand have none."""
    want = _every_significand_rounds_as_the_division(significand)
    assert want == (significand in (3.0, 1000 / 512))
    assert divide.verified(float(np.float32(significand)).hex()) == want


def test_which_divisors_get_a_reciprocal() -> None:
    four = divide.reciprocal(4.0, "float32", fma=False)
    assert four is not None and four.exact and four.hi == 0.25
    assert divide.reciprocal(-0.5, "float64", fma=False) == divide.Reciprocal(-0.5, -2.0, 0.0)
    assert divide.reciprocal(2.0 ** -149, "float32", True) is None  # 2^149 is no float32
    thousand = divide.reciprocal(1000.0, "float32", fma=True)
    assert thousand is not None and not thousand.exact and thousand.hi == float(np.float32(1) / np.float32(1000))
    assert 2.0 ** thousand.low * abs(thousand.lo) >= 2.0 ** -125 and thousand.high <= 127
    for c, dtype, fma in ((3.0, "float64", True), (3.0, "float32", False), (0.0, "float32", True),
                          (float("inf"), "float32", True), (float("nan"), "float32", True),
                          (1.9118579626083374, "float32", True), (3.0, "int32", True)):
        assert divide.reciprocal(c, dtype, fma) is None, (c, dtype, fma)


def _grid(rng: np.random.Generator, dtype: type, cols: int) -> np.ndarray:
    """Rows of ``cols`` values: random bit patterns (every exponent, subnormals, NaN), ordinary
    values, and special values in rows of their own and among ordinary ones."""
    info = np.finfo(dtype)
    width = np.dtype(dtype).itemsize * 8
    bits = rng.integers(0, 2 ** width - 1, 30 * cols, dtype=np.uint64, endpoint=True)
    random_bits = bits.astype(np.uint32 if width == 32 else np.uint64).view(dtype)
    special = np.array([0.0, -0.0, info.tiny, -info.tiny, info.tiny / 8, info.smallest_subnormal, 1.0, -3.0,
                        info.max, -info.max, info.max / 4, np.inf, -np.inf, np.nan, 1e-30, 7e-39], dtype)
    ordinary = rng.uniform(-50, 50, 20 * cols).astype(dtype)
    sprinkled = ordinary.copy()
    sprinkled[rng.integers(0, sprinkled.size, 40)] = rng.choice(special, 40)
    flat = np.concatenate([random_bits, ordinary, sprinkled, np.resize(special, 2 * cols)])
    return np.resize(flat, (-(-flat.size // cols), cols))


def _assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    u = f"u{got.itemsize}"
    bad = np.nonzero(got[~nan].view(u) != want[~nan].view(u))[0]
    assert bad.size == 0, (got[~nan][bad[:5]], want[~nan][bad[:5]])


FLOAT32 = """def d(float(R, D) X) -> (A, B, E, F) {
    A(r, d) = X(r, d) / 3.0
    B(r, d) = X(r, d) / float(D)
    E(r, d) = X(r, d) / 0.25
    F(r, d) = (X(r, d) + 1.0) / 1.9118579626083374
}"""
FLOAT64 = """def d64(double(R, D) X) -> (A, E) {
    A(r, d) = X(r, d) / 3.0
    E(r, d) = X(r, d) / 8.0
}"""


@pytest.mark.parametrize("name", TARGETS)
def test_pointwise_divisions_by_constants_keep_the_divisions_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quotients by constants and sizes (powers of two by a multiply), float32 and float64, over
    every kind of value: numpy's division, bit for bit."""
    monkeypatch.setenv("TCDSL_CPU", name)
    rng = np.random.default_rng(7)
    X = _grid(rng, np.float32, 1000)
    k = tc.define(FLOAT32)
    with np.errstate(all="ignore"):
        wants = [X / np.float32(3), X / np.float32(1000), X / np.float32(0.25),
                 (X + np.float32(1)) / np.float32(1.9118579626083374)]
    for g, w in zip(k(X), wants):
        _assert_same_bits(g, w)
    assert "* 0x1.0000000000000p+2f" in k.lowered(X).source.text  # / 0.25
    X64 = _grid(rng, np.float64, 40)
    with np.errstate(all="ignore"):
        for g, w in zip(tc.define(FLOAT64)(X64), (X64 / 3.0, X64 / 8.0)):
            _assert_same_bits(g, w)


@pytest.mark.parametrize("name", TARGETS)
def test_a_mean_in_vectors_divides_each_term_as_the_division(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``M(n) +=! X(n, d) / D`` in vector accumulators, each term by the two-part reciprocal where
    the target has an fma: one dominant term per row (every magnitude, either sign) among terms
    too small to change its sum, so each row's mean is that term's quotient, bit for bit; rows
    with a zero, a subnormal or an infinity in the dominant term's vector divide it."""
    monkeypatch.setenv("TCDSL_CPU", name)
    target = toolchain.target()
    rng = np.random.default_rng(11)
    R = 4096
    X = rng.uniform(1e-30, 2e-30, (R, 1000)).astype(np.float32)  # quotients below 2e-33: lost in the sums
    big = (rng.choice([-1, 1], R) * np.exp(rng.uniform(np.log(1e-12), np.log(3e38), R))).astype(np.float32)
    col = rng.integers(0, 992, R)
    X[np.arange(R), col] = big
    X[0, col[0] + 1 if col[0] % 16 != 15 else col[0] - 1] = 0.0
    X[1, col[1] ^ 1] = 3e-39
    X[2, col[2]], X[3, col[3]], X[4, col[4]] = np.inf, -np.inf, np.nan
    k = tc.define("def mean(float(N, D) X) -> (M) { M(n) +=! X(n, d) / D }")
    with np.errstate(all="ignore"):
        _assert_same_bits(k(X), X[np.arange(R), col] / np.float32(1000))
    assert (k.lowered(X).source.text.count("tc_vf_divc(") > 1) == target.fma  # calls beside the definition
    # a quotient of constants along the row (``1.0 / D``) stays one division, which GCC folds
    k2 = tc.define("def m2(float(N, D) X) -> (M) { M(n) +=! X(n, d) * (1.0 / D) }")
    Y = np.zeros((8, 1000), np.float32)
    Y[:, 3] = np.arange(1, 9)
    _assert_same_bits(k2(Y), Y[:, 3] * (np.float32(1) / np.float32(1000)))
    assert k2.lowered(Y).source.text.count("tc_vf_divc(") <= 1
