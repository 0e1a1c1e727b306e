"""The builtin functions of TC (the CUDA math library's, float variants for float32): one table.

``name -> Builtin``: arity, typing kind, numpy implementation (for the reference interpreter), and
how C, CUDA and OpenCL C spell a call; read by semantic analysis, the interpreter, derivatives and
every emitter. Functions a target lacks come from ``tcdsl.codegen.mathlib`` (C text).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.special as sp
from numpy.polynomial.chebyshev import chebval

from .mathlib_tables import TABLES

Impl = Callable[..., Any]


@dataclass(frozen=True)
class Builtin:
    """One builtin. A spelling is a C call template: ``{0}``, ``{1}``... are the arguments, ``{f}``
    is ``f`` for float32 and float16 (which compute in float) and empty for float64, ``{one}`` is 1
    in the call's type. ``cuda`` and ``opencl`` default to ``c``; OpenCL C's overloaded names are
    reached through ``#define expf exp`` lines (codegen/gpu.py). ``c_int`` spells the call on integers
    (kind "same" only), ``half`` on float16 where computing in float and rounding is not the same.
    ``derivative``: "smooth" (a rule in tcdsl/derivative.py), "flat" (zero wherever defined), or
    None (no derivative)."""

    name: str
    arity: int
    kind: str  # "math": computes in float; "same": keeps an arithmetic type
    numpy: Impl
    c: str
    cuda: str | None = None
    opencl: str | None = None
    c_int: str | None = None
    derivative: str | None = "smooth"
    half: str | None = None

    def spelling(self, target: str, dtype: str = "float32") -> str:
        """The call template for ``target`` ("c", "cuda" or "opencl") on ``dtype``."""
        if dtype == "float16" and self.half is not None:
            return self.half
        own = {"c": self.c, "cuda": self.cuda, "opencl": self.opencl}[target]
        return own if own is not None else self.c


def _f64(f: Impl) -> Impl:
    """``f`` computed in float64 and rounded to the arguments' type."""
    def g(*args: Any) -> Any:
        dtype = np.result_type(*args)
        with np.errstate(all="ignore"):
            return np.asarray(f(*(np.asarray(a, dtype=np.float64) for a in args))).astype(dtype)
    return g


def _two_prod(a: np.ndarray, b: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """``a * b`` as a rounded product and its exact error (Dekker's splitting; |a b| < 2^996)."""
    p = a * b
    split = 134217729.0
    ah = a * split - (a * split - a)
    al = a - ah
    bh = b * split - (b * split - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _sinpi_cospi(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sin(pi x) and cos(pi x) after the exact reduction x = n/2 + r, |r| <= 1/4."""
    big = ~(np.abs(x) < 2.0**53)
    xs = np.where(big, 0.0, x)
    n = np.rint(2 * xs)
    r = xs - 0.5 * n
    s, c = np.sin(np.pi * r), np.cos(np.pi * r)
    q = np.mod(n, 4)
    sin = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    cos = np.select([q == 0, q == 1, q == 2], [c, -s, -c], s)
    nan = np.isnan(x) | np.isinf(x)
    sin = np.where(sin == 0, np.copysign(0.0, x), sin)
    sin = np.where(nan, np.nan, np.where(big, np.copysign(0.0, x), sin))
    cos = np.where(nan, np.nan, np.where(big, 1.0, cos + 0.0))
    return sin, cos


def _erfcx(x: np.ndarray) -> np.ndarray:
    """scipy's erfcx, with exp(x^2) taken from an exact split of x^2 for negative x."""
    neg = (x < -1) & (x > -26.7)
    xn = np.where(neg, x, -2.0)
    h, lo = _two_prod(xn, xn)
    e = np.exp(h)
    return np.where(neg, 2 * (e + e * lo) - sp.erfcx(-xn), sp.erfcx(x))


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc: scipy's erfcx times exp(-x^2), x^2 split exactly, for x > 1/2 (where scipy's erfc loses
    about 2 x^2 ulps)."""
    mid = (x > 0.5) & (x < 27.3)
    xm = np.where(mid, x, 1.0)
    h, lo = _two_prod(xm, xm)
    e = np.exp(-h)
    return np.where(mid, sp.erfcx(xm) * (e - e * lo), sp.erfc(x))


def _erfcinv(q: np.ndarray) -> np.ndarray:
    """scipy's erfcinv, and for q below 1e-280 Newton's method on log erfc(y) = log erfcx(y) - y^2
    (scipy's loses the subnormal q)."""
    tiny = (q > 0) & (q < 1e-280)
    qt = np.where(tiny, q, 1e-300)
    y = np.sqrt(-np.log(qt))
    for _ in range(8):
        h, lo = _two_prod(y, y)
        y = y + (np.log(sp.erfcx(y)) - h - lo - np.log(qt)) * sp.erfcx(y) * (math.sqrt(math.pi) / 2)
    return np.where(tiny, y, sp.erfcinv(q))


def _lgamma(x: np.ndarray) -> np.ndarray:
    """log |gamma(x)| as C99: +inf at -inf, -log |x| where 1/x overflows (scipy gives inf)."""
    small = np.abs(x) < 1e-300
    return np.where(np.isinf(x), np.inf, np.where(small & (x != 0), -np.log(np.abs(np.where(small, x, 1.0))),
                                                    sp.gammaln(x)))


def _digamma(x: np.ndarray) -> np.ndarray:
    """scipy's psi, reflected for x < 0 with exact sinpi and cospi (scipy loses digits near poles)."""
    neg = (x < 0) & np.isfinite(x)
    xn = np.where(neg, x, -0.5)
    s, c = _sinpi_cospi(xn)
    pole = neg & (x == np.floor(x))
    zero = np.where(x == 0, -np.copysign(np.inf, x), sp.psi(x))
    return np.where(pole, np.nan, np.where(neg, sp.psi(1 - xn) - math.pi * c / s, zero))


def _trigamma(x: np.ndarray) -> np.ndarray:
    """scipy's polygamma(1, x), reflected for x < 0 with an exact sinpi; +inf at the poles."""
    neg = (x < 0) & np.isfinite(x)
    xn = np.where(neg, x, -0.5)
    s, _ = _sinpi_cospi(xn)
    pole = (x <= 0) & (x == np.floor(x)) & np.isfinite(x)
    pos = sp.polygamma(1, np.where(neg | pole, 1.0, x))
    reflected = math.pi**2 / (s * s) - sp.polygamma(1, 1 - xn)
    return np.where(pole, np.inf, np.where(x == -np.inf, np.nan, np.where(neg, reflected, pos)))


def _bessel_i(order: int) -> Impl:
    """I0 or I1 as exp(-|x|) I(x) (scipy's i0e, i1e) times exp(|x| / 2) twice, finite up to the
    overflow of I itself."""
    scaled = sp.i1e if order else sp.i0e

    def g(x: np.ndarray) -> np.ndarray:
        e = np.exp(np.abs(x) / 2)
        inf = np.abs(x) if order == 0 else x
        return np.where(np.isfinite(x), scaled(x) * e * e, np.where(np.isnan(x), x, inf))
    return g


def _normcdf(x: np.ndarray) -> np.ndarray:
    """erfc(-x / sqrt 2) / 2 with the argument carried in two parts."""
    hi, lo_c = 0.7071067811865476, -4.833646656726457e-17
    fine = np.abs(x) < 1e10
    xf = np.where(fine, x, 0.0)
    t, err = _two_prod(-xf, hi)
    lo = err - xf * lo_c
    c = _erfc(t)
    return np.where(fine, 0.5 * (c - lo * (2 / math.sqrt(math.pi)) * c / _erfcx(t)), 0.5 * _erfc(-x))


def _logb(x: np.ndarray) -> np.ndarray:
    m, e = np.frexp(x)
    return np.where(x == 0, -np.inf, np.where(np.isfinite(x), (e - 1).astype(np.float64), np.abs(x)))


def _remainder(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """IEEE remainder: x - n y, n the integer nearest x / y (ties to even), computed exactly."""
    p = np.abs(y)
    two_p = 2 * p
    ok = np.isfinite(two_p) & (two_p > 0)
    a = np.abs(np.where(ok, np.fmod(x, np.where(ok, two_p, 1.0)), x))  # below 2p (2p overflowing: below p)
    big = p > 1e-300  # halving p is exact; below, compare doubled values
    b = a - p
    past_half = np.where(big, a > 0.5 * p, a + a > p)
    again = np.where(big, b >= 0.5 * p, b + b >= p)
    r = np.where(past_half, np.where(again, b - p, b), a)
    r = np.where(np.signbit(x), -r, r)
    return np.where((p == 0) | np.isinf(x) | np.isnan(x) | np.isnan(y), np.nan, r)


def _fdim(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x - y, 0.0))


def _norm(*args: np.ndarray, reciprocal: bool = False) -> np.ndarray:
    """sqrt of the sum of squares (or its reciprocal), scaled by the largest |value|."""
    a = [np.abs(v) for v in args]
    m = np.maximum.reduce(a)
    inf = np.logical_or.reduce([np.isinf(v) for v in a])
    nan = np.logical_or.reduce([np.isnan(v) for v in a])
    s = np.where((m > 0) & np.isfinite(m), m, 1.0)
    root = np.sqrt(sum((v / s) ** 2 for v in a))
    val = (1 / root) / s if reciprocal else s * root
    val = np.where(m == 0, np.inf if reciprocal else 0.0, val)
    val = np.where(nan, np.nan, val)
    return np.where(inf, 0.0 if reciprocal else np.inf, val)


def _hankel(x: np.ndarray, order: int, second: bool) -> np.ndarray:
    """J or Y of order 0 or 1 for x >= 8 from Hankel's P and Q (tcdsl.codegen.mathlib's Chebyshev fits);
    the phase x - (2n + 1) pi / 4 is taken as sums of sin x and cos x (exact in x), not by
    subtracting a rounded multiple of pi as scipy does."""
    t = 128.0 / (x * x) - 1.0
    p = chebval(t, TABLES[f"P{order}_LARGE"])
    q = chebval(t, TABLES[f"Q{order}_LARGE"]) / x
    s, c = np.sin(x), np.cos(x)
    cc, ss = (s - c, -(s + c)) if order else (c + s, s - c)  # sqrt 2 cos(chi), sqrt 2 sin(chi)
    k = 1 / math.sqrt(math.pi) / np.sqrt(x)
    return k * (p * ss + q * cc) if second else k * (p * cc - q * ss)


def _bessel_jy(f: Impl, order: int, second: bool) -> Impl:
    """scipy's j0 (j1, y0, y1) for |x| < 8, Hankel's expansion beyond; 0 at +inf (and at -inf
    for J) as in libm."""
    def g(x: np.ndarray) -> np.ndarray:
        a = np.abs(x)
        far = np.isfinite(x) & (a >= 8) & ((x > 0) | (not second))
        h = _hankel(np.where(far, a, 8.0), order, second)
        h = np.where(x < 0, -h, h) if order and not second else h
        return np.where(np.isinf(x) & ((x > 0) | (not second)), 0.0, np.where(far, h, f(x)))
    return g


def _round(x: Any) -> Any:
    """C's round: halfway cases away from zero (exact: ``x - trunc(x)`` needs no rounding)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _b(name: str, arity: int, numpy: Impl, c: str | None = None, **kw: Any) -> Builtin:
    args = ", ".join(f"{{{i}}}" for i in range(arity))
    return Builtin(name, arity, kw.pop("kind", "math"), numpy, c if c is not None else f"{name}{{f}}({args})", **kw)


def _lib(name: str, arity: int, numpy: Impl, cuda: str | None = None, **kw: Any) -> Builtin:
    """A builtin C takes from tcdsl.codegen.mathlib (``tc_<name>``); CUDA has it natively unless told."""
    args = ", ".join(f"{{{i}}}" for i in range(arity))
    return Builtin(name, arity, "math", numpy, f"tc_{name}{{f}}({args})",
                   cuda if cuda is not None else f"{name}{{f}}({args})", **kw)


_TABLE: tuple[Builtin, ...] = (
    # C99 and OpenCL, numpy's own
    _b("exp", 1, np.exp), _b("log", 1, np.log), _b("log1p", 1, np.log1p), _b("expm1", 1, np.expm1),
    _b("sqrt", 1, np.sqrt), _b("cbrt", 1, np.cbrt), _b("tanh", 1, np.tanh),
    _b("rsqrt", 1, lambda x: 1 / np.sqrt(x), "({one} / sqrt{f}({0}))"),
    _b("sigmoid", 1, lambda x: 1 / (1 + np.exp(-x)), "({one} / ({one} + exp{f}(-{0})))"),
    _b("erf", 1, _f64(sp.erf)),
    _b("floor", 1, np.floor, derivative="flat"), _b("ceil", 1, np.ceil, derivative="flat"),
    _lib("round", 1, _round, opencl="round{f}({0})", derivative="flat"), _b("trunc", 1, np.trunc, derivative="flat"),
    _b("sin", 1, np.sin), _b("cos", 1, np.cos), _b("tan", 1, np.tan), _b("fabs", 1, np.abs),
    _b("abs", 1, np.abs, "fabs{f}({0})", kind="same", c_int="tc_abs({0})"),
    _b("exp2", 1, np.exp2), _b("log2", 1, np.log2), _b("log10", 1, np.log10), _b("asin", 1, np.arcsin),
    _b("acos", 1, np.arccos), _b("atan", 1, np.arctan), _b("sinh", 1, np.sinh), _b("cosh", 1, np.cosh),
    _b("asinh", 1, np.arcsinh), _b("acosh", 1, np.arccosh), _b("atanh", 1, np.arctanh),
    _b("pow", 2, np.power), _b("atan2", 2, np.arctan2),
    # C takes fmax, fmin, round and fdim from tcdsl.codegen.mathlib too: inline, so that loops of them vectorise
    _lib("fmax", 2, np.fmax, opencl="fmax{f}({0}, {1})"), _lib("fmin", 2, np.fmin, opencl="fmin{f}({0}, {1})"),
    _b("fmod", 2, np.fmod),
    _b("min", 2, np.minimum, "tc_min({0}, {1})", kind="same", c_int="tc_min({0}, {1})"),
    _b("max", 2, np.maximum, "tc_max({0}, {1})", kind="same", c_int="tc_max({0}, {1})"),
    _b("fma", 3, lambda a, b, c: a * b + c),
    # the rest of the CUDA math library: libm and OpenCL C have these
    _b("erfc", 1, _f64(_erfc)), _b("exp10", 1, _f64(lambda x: np.power(10.0, x))), _b("hypot", 2, np.hypot),
    _b("lgamma", 1, _f64(_lgamma)), _b("tgamma", 1, _f64(sp.gamma)),
    _b("logb", 1, _f64(_logb), derivative="flat"),
    _b("nextafter", 2, np.nextafter, half="tc_nextafter_half{f}({0}, {1})"),
    _b("remainder", 2, _f64(_remainder)), _b("copysign", 2, np.copysign),
    _lib("fdim", 2, _f64(_fdim), opencl="fdim{f}({0}, {1})"),
    # libm has these; OpenCL C takes them from tcdsl.codegen.mathlib
    _b("j0", 1, _f64(_bessel_jy(sp.j0, 0, False)), opencl="tc_j0{f}({0})"),
    _b("j1", 1, _f64(_bessel_jy(sp.j1, 1, False)), opencl="tc_j1{f}({0})"),
    _b("y0", 1, _f64(_bessel_jy(sp.y0, 0, True)), opencl="tc_y0{f}({0})"),
    _b("y1", 1, _f64(_bessel_jy(sp.y1, 1, True)), opencl="tc_y1{f}({0})"),
    # OpenCL C has these; C takes them from tcdsl.codegen.mathlib
    _lib("sinpi", 1, _f64(lambda x: _sinpi_cospi(x)[0]), opencl="sinpi{f}({0})"),
    _lib("cospi", 1, _f64(lambda x: _sinpi_cospi(x)[1]), opencl="cospi{f}({0})"),
    # neither has these
    _lib("erfinv", 1, _f64(sp.erfinv)), _lib("erfcinv", 1, _f64(_erfcinv)), _lib("erfcx", 1, _f64(_erfcx)),
    _lib("normcdf", 1, _f64(_normcdf)), _lib("normcdfinv", 1, _f64(lambda p: -math.sqrt(2) * _erfcinv(2 * p))),
    Builtin("cyl_bessel_i0", 1, "math", _f64(_bessel_i(0)), "tc_i0{f}({0})", "cyl_bessel_i0{f}({0})"),
    Builtin("cyl_bessel_i1", 1, "math", _f64(_bessel_i(1)), "tc_i1{f}({0})", "cyl_bessel_i1{f}({0})"),
    _lib("rcbrt", 1, _f64(lambda x: 1 / np.cbrt(x))),
    _lib("rhypot", 2, _f64(lambda x, y: _norm(x, y, reciprocal=True))),
    Builtin("norm3d", 3, "math", _f64(_norm), "tc_norm{f}({0}, {1}, {2}, {zero}, 0)", "norm3d{f}({0}, {1}, {2})"),
    Builtin("norm4d", 4, "math", _f64(_norm), "tc_norm{f}({0}, {1}, {2}, {3}, 0)", "norm4d{f}({0}, {1}, {2}, {3})"),
    Builtin("rnorm3d", 3, "math", _f64(lambda *a: _norm(*a, reciprocal=True)), "tc_norm{f}({0}, {1}, {2}, {zero}, 1)",
            "rnorm3d{f}({0}, {1}, {2})"),
    Builtin("rnorm4d", 4, "math", _f64(lambda *a: _norm(*a, reciprocal=True)), "tc_norm{f}({0}, {1}, {2}, {3}, 1)",
            "rnorm4d{f}({0}, {1}, {2}, {3})"),
    _b("fdivide", 2, np.true_divide, "({0} / {1})"),
    # beyond CUDA's library: the derivatives of lgamma and tgamma, and of those
    Builtin("digamma", 1, "math", _f64(_digamma), "tc_digamma{f}({0})"),
    Builtin("trigamma", 1, "math", _f64(_trigamma), "tc_trigamma{f}({0})", derivative=None),
)

BUILTINS: dict[str, Builtin] = {b.name: b for b in _TABLE}
ARITY: dict[str, tuple[int, str]] = {b.name: (b.arity, b.kind) for b in _TABLE}  # name -> (arity, kind)
