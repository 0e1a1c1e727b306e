"""Division by a constant: ``(divisor, dtype, fma) -> Reciprocal | None``, how the C emitters print
``x / c`` for a ``c`` fixed when the kernel compiles (``X(n, d) / D``, ``x / 3.0``) so that every
quotient keeps the division's bits.

- A power of two: ``x * (1 / c)``, the reciprocal exact; the product and the quotient are the
  rounding of one real number, so they agree everywhere (subnormals, infinities, NaN, signed
  zeros), in scalar and vector code alike.
- Any other float32 divisor, in explicit vectors on a target with a fused multiply-add:
  ``fma(x, hi, x * lo)``, the reciprocal in two parts (``hi`` = RN(1/c), ``lo`` = RN(1/c - hi)),
  one multiply and one fma in place of a division (Brisebarre, Muller and Raina, "Accelerating
  correctly rounded floating-point division when the divisor is known in advance", IEEE TC 2004).
  It rounds as the division for most divisors, not all: ``Reciprocal`` is made only for a divisor
  whose significand passes ``verified`` on every float32 significand, which covers every ``x`` in
  the window where no intermediate leaves the normal range (the scaling by powers of two is exact
  there). A vector with a lane outside the window (zero, subnormal, huge, infinite, NaN) divides.

float64 divisors other than powers of two keep the division (2^52 significands are too many to
check), and so does scalar code (a branch per element would stop GCC vectorising its loops).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tcdsl.core.checked import Const, Convert, SizeVal, TExpr

CHUNK = 1 << 21  # float32 significands checked at a time (arrays of a few tens of MB)
_SIGNIFICANDS = 1 << 23
_EXP_RANGE = 100  # divisors within 2^-100..2^100 in magnitude: both parts of the reciprocal normal


@dataclass(frozen=True)
class Reciprocal:
    """``x / divisor`` as ``x * hi + x * lo``: ``lo`` is 0.0 for a power of two (``hi`` exact, no
    window); otherwise the two-part product holds for ``|x|`` in ``[2^low, 2^high)``."""

    divisor: float
    hi: float
    lo: float
    low: int = 0
    high: int = 0

    @property
    def exact(self) -> bool:
        return self.lo == 0.0

    @property
    def window(self) -> tuple[float, float]:
        """``[2^low, 2^high)``: the magnitudes of ``x`` where the two-part product holds."""
        return 2.0 ** self.low, 2.0 ** self.high


def of_divisor(e: TExpr, sizes: dict[str, int], fma: bool) -> Reciprocal | None:
    """``reciprocal`` of the divisor ``e`` where its value is fixed when the kernel compiles (a
    constant or a size, converted to the quotient's type), else None."""
    inner = e.arg if isinstance(e, Convert) else e
    if isinstance(inner, Const) and not isinstance(inner.value, bool):
        value = float(inner.value)
    elif isinstance(inner, SizeVal):
        value = float(sizes[inner.name])
    else:
        return None
    if e.dtype == "float32":
        with np.errstate(over="ignore"):
            value = float(np.float32(value))
    return reciprocal(value, e.dtype, fma)


def reciprocal(divisor: float, dtype: str, fma: bool) -> Reciprocal | None:
    """How to divide ``dtype`` values by ``divisor`` (already rounded to ``dtype``) without a
    division, or None (divide)."""
    if dtype not in ("float32", "float64") or not math.isfinite(divisor) or divisor == 0.0:
        return None
    m, e = math.frexp(abs(divisor))
    if m == 0.5:  # a power of two, 2^(e - 1): its reciprocal must be a finite value of the type
        least = -149 if dtype == "float32" else -1074
        most = 127 if dtype == "float32" else 1023
        if least <= 1 - e <= most:
            return Reciprocal(divisor, math.copysign(2.0 ** (1 - e), divisor), 0.0)
        return None
    if dtype != "float32" or not fma or not -_EXP_RANGE <= e <= _EXP_RANGE:
        return None
    if not verified(float(np.float32(m * 2)).hex()):
        return None
    hi, lo = _split(divisor)
    if abs(lo) < 2.0 ** -126:  # a subnormal low part loses the bits the check relied on
        return None
    # the window: x normal (zeros and subnormals divide: a tiny divisor's bound would reach them),
    # x * lo normal (|x| >= 2^-125 / |lo|, so x / c too), x * hi, x * lo and x finite
    low = max(-126, math.ceil(math.log2(2.0 ** -125 / abs(lo))) + 1)
    high = min(127, math.floor(math.log2(2.0 ** 126 / abs(hi))))
    return Reciprocal(divisor, hi, lo, low, high) if low < high else None


def _split(c: float) -> tuple[float, float]:
    """RN(1/c) and RN(1/c - RN(1/c)) in float32."""
    c32 = np.float32(c)
    hi = np.float32(1.0) / c32
    lo = np.float32(float(Fraction(1) / Fraction(float(c32)) - Fraction(float(hi))))
    return float(hi), float(lo)


@functools.lru_cache(maxsize=256)
def verified(significand: str) -> bool:
    """Whether ``fma(x, hi, RN(x * lo))`` equals ``RN(x / c)`` for the divisor ``c`` of this
    significand (in [1, 2), as ``float.hex``) and every float32 ``x`` in [1, 2).

    Computing the fast quotient exactly for 2^23 values is slow in numpy, so a filter comes first:
    the fast quotient's value before its rounding is within 2^-46 of ``x / c`` (in [0.5, 2)), so it
    rounds as the division wherever ``x / c`` lies further than that from the midpoint between two
    float32 neighbours; ``x / c`` in float64 locates it within 2^-52. The few near midpoints are
    checked exactly in rationals."""
    c = float.fromhex(significand)
    c32 = np.float32(c)
    hi, lo = _split(c)
    for start in range(0, _SIGNIFICANDS, CHUNK):
        x = (np.arange(start, start + CHUNK, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
        t = x.astype(np.float64) / c
        units = t * np.where(t >= 1.0, 2.0 ** 23, 2.0 ** 24)  # t in float32 ulps
        near = np.nonzero(np.abs(units - np.floor(units) - 0.5) < 2.0 ** -21)[0]
        for k in near:
            xk = float(x[k])
            fast = Fraction(xk) * Fraction(hi) + Fraction(float(np.float32(xk) * np.float32(lo)))
            if _round32(fast) != float(np.float32(xk) / c32):
                return False
    return True


def _round32(v: Fraction) -> float:
    """``v`` (positive, in the normal range) rounded to the nearest float32, ties to even."""
    a = np.float32(float(v))  # within one float32 neighbour of the answer
    best = None
    for cand in (np.nextafter(a, np.float32(0)), a, np.nextafter(a, np.float32(np.inf))):
        d = abs(Fraction(float(cand)) - v)
        even = int(np.float32(cand).view(np.uint32)) % 2 == 0
        key = (d, not even)
        if best is None or key < best[0]:
            best = (key, float(cand))
    assert best is not None
    return best[1]
