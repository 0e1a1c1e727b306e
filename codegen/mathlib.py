"""C math library of tcdsl's builtins that libm (or OpenCL C) lacks: ``names -> C text``.

Each function is written once, generic over its floating type, and printed for float (``f``
suffix, float literals) or double; the C, OpenCL and CUDA emitters put the ones a kernel calls,
with what they call, before the kernel. The text is C99 and OpenCL C 1.2 (``DEVFN`` qualifies).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tcdsl.core.mathlib_tables import TABLES


@dataclass(frozen=True)
class CFunction:
    """One library function: ``text`` uses ``T`` for the type, ``@`` after each function name
    (``f`` for float), and ``$NAME`` for the per-type constants of ``_CONSTANTS``."""

    name: str
    needs: tuple[str, ...]
    text: str


# per-type constants: (float, double)
_CONSTANTS: dict[str, tuple[str, str]] = {
    "INTEGRAL": ("16777216.0f", "9007199254740992.0"),  # 2^p: every float at least this is an even integer
    "PI_HI": ("3.14159274f", "3.141592653589793"),
    "PI_LO": ("-8.74227766e-08f", "1.2246467991473532e-16"),
    "RSQRT2_HI": ("0.707106769f", "0.7071067811865476"),
    "RSQRT2_LO": ("1.21016175e-08f", "-4.833646656726457e-17"),
    "NEWTON": ("1", "2"),  # refinement steps after the Chebyshev start
    "TINY": ("1.17549435e-38f", "2.2250738585072014e-308"),  # the smallest normal value
    "LN_MAX": ("88.7228394f", "709.782712893384"),  # log of the largest finite value
    "DIGAMMA_SHIFT": ("6.0f", "10.0"),  # recurrence up to here, then the asymptotic series
    "TRIGAMMA_SHIFT": ("6.0f", "20.0"),
}


def _cheb(table: str) -> CFunction:
    """Clenshaw's recurrence for ``TABLES[table]``, unrolled into straight-line code."""
    cs = TABLES[table]
    lines = [f"DEVFN T tc_ch_{table.lower()}@(T t) {{", "  T t2 = t + t, b0 = 0.0, b1 = 0.0, b2 = 0.0;"]
    for c in reversed(cs[1:]):
        lines.append(f"  b2 = b1; b1 = b0; b0 = t2 * b1 - b2 + {c!r};")
    lines.append(f"  return t * b0 - b1 + {cs[0]!r};")
    lines.append("}")
    return CFunction(f"tc_ch_{table.lower()}", (), "\n".join(lines))


_FUNCTIONS: tuple[CFunction, ...] = (
    *(_cheb(t) for t in TABLES),
    CFunction("tc_sinpi", (), r"""
/* sin(pi x), cos(pi x): x = n/2 + r exactly (|r| <= 1/4), pi r as a two-part product, then the quadrant */
DEVFN T tc_sinpi@(T x) {
  if (!(fabs@(x) < $INTEGRAL)) return x - x == 0.0 ? copysign@(0.0, x) : x - x;
  T n = rint@(x + x), r = x - n * 0.5;
  T h = r * $PI_HI, l = fma@(r, $PI_HI, -h) + r * $PI_LO;
  T s = sin@(h), c = cos@(h);
  int q = (int)(n - 4.0 * floor@(n * 0.25));
  T v = q == 0 ? s + l * c : q == 1 ? c - l * s : q == 2 ? -(s + l * c) : -(c - l * s);
  return v == 0.0 ? copysign@(0.0, x) : v;
}"""),
    CFunction("tc_cospi", (), r"""
DEVFN T tc_cospi@(T x) {
  if (!(fabs@(x) < $INTEGRAL)) return x - x == 0.0 ? 1.0 : x - x;
  T n = rint@(x + x), r = x - n * 0.5;
  T h = r * $PI_HI, l = fma@(r, $PI_HI, -h) + r * $PI_LO;
  T s = sin@(h), c = cos@(h);
  int q = (int)(n - 4.0 * floor@(n * 0.25));
  T v = q == 0 ? c - l * s : q == 1 ? -(s + l * c) : q == 2 ? -(c - l * s) : s + l * c;
  return v + 0.0;
}"""),
    CFunction("tc_erfcx", (), r"""
/* exp(x^2) erfc(x): with x^2 split exactly for small x, Laplace's continued fraction from x = 2 */
DEVFN T tc_erfcx@(T x) {
  if (x != x) return x;
  if (x < 2.0) {
    if (x * x > $LN_MAX) return INFINITY;
    T h = x * x, l = fma@(x, x, -h);
    T e = exp@(h);
    return (e + e * l) * erfc@(x);
  }
  T f = 0.0;
  for (int k = 60; k >= 1; k--) f = (0.5 * k) / (x + f);
  return 0.56418958354775628695 / (x + f);
}"""),
    CFunction("tc_normcdf", ("tc_erfcx",), r"""
/* 1/2 erfc(-x / sqrt 2), the argument carried in two parts (erfc's slope takes the low part) */
DEVFN T tc_normcdf@(T x) {
  T t = -x * $RSQRT2_HI;
  if (!(fabs@(x) < INFINITY)) return 0.5 * erfc@(t);
  T l = fma@(-x, $RSQRT2_HI, -t) - x * $RSQRT2_LO;
  T c = erfc@(t);
  return 0.5 * (c - l * 1.1283791670955126 * c / tc_erfcx@(t));
}"""),
    CFunction("tc_erfcinv_tail", ("tc_ch_erfcinv_tail", "tc_erfcx"), r"""
/* erfcinv(q) for 0 < q <= 1/2: a fit in 1 / sqrt(-log q), then Newton steps on log erfc */
DEVFN T tc_erfcinv_tail@(T q) {
  T w = sqrt@(-log@(q));
  T t = ((1.0 / w - 0.03636363636363636) / (1.2011224087864498 - 0.03636363636363636)) * 2.0 - 1.0;
  T y = w * tc_ch_erfcinv_tail@(t);
  for (int i = 0; i < $NEWTON; i++) {
    T e = erfc@(y);
    if (e < $TINY) {  /* subnormal: log erfc(y) = log erfcx(y) - y^2, y^2 in two parts */
      T h = y * y, l = fma@(y, y, -h), r = tc_erfcx@(y);
      y += (log@(r) - h - l - log@(q)) * r * 0.88622692545275801;
    } else y += log@(e / q) * tc_erfcx@(y) * 0.88622692545275801;
  }
  return y;
}"""),
    CFunction("tc_erfinv", ("tc_ch_erfinv_central", "tc_erfcinv_tail"), r"""
DEVFN T tc_erfinv@(T x) {
  T a = fabs@(x);
  if (a <= 0.5) return x * tc_ch_erfinv_central@(x * x * 8.0 - 1.0);
  if (!(a <= 1.0)) return (x - x) / (x - x);
  if (a == 1.0) return x * INFINITY;
  return copysign@(tc_erfcinv_tail@(1.0 - a), x);
}"""),
    CFunction("tc_erfcinv", ("tc_erfinv", "tc_erfcinv_tail"), r"""
DEVFN T tc_erfcinv@(T q) {
  if (!(q >= 0.0 && q <= 2.0)) return (q - q) / (q - q);
  if (q == 0.0) return INFINITY;
  if (q == 2.0) return -INFINITY;
  if (q < 0.5) return tc_erfcinv_tail@(q);
  if (q > 1.5) return -tc_erfcinv_tail@(2.0 - q);
  return tc_erfinv@(1.0 - q);
}"""),
    CFunction("tc_normcdfinv", ("tc_erfcinv",), r"""
DEVFN T tc_normcdfinv@(T p) { return -1.4142135623730951 * tc_erfcinv@(p + p); }"""),
    CFunction("tc_i_series", (), r"""
/* modified Bessel functions: for |x| <= 8 their power series (terms all positive), beyond it
   sqrt(x) exp(-x) I(x) by a Chebyshev fit in 1/x, with exp(x) applied in halves */
DEVFN T tc_i_series@(T x, int order) {
  T q = 0.25 * x * x, term = order ? 0.5 : 1.0, sum = term;
  for (int k = 1; k < 40 && term > 1e-17 * sum; k++) { term *= q / (T)(k * (k + order)); sum += term; }
  return sum;
}"""),
    CFunction("tc_i0", ("tc_i_series", "tc_ch_i0_large"), r"""
DEVFN T tc_i0@(T x) {
  T a = fabs@(x);
  if (a == INFINITY) return a;
  if (a <= 8.0) return tc_i_series@(a, 0);
  T e = exp@(0.5 * a);
  return e * (tc_ch_i0_large@(16.0 / a - 1.0) / sqrt@(a)) * e;
}"""),
    CFunction("tc_i1", ("tc_i_series", "tc_ch_i1_large"), r"""
DEVFN T tc_i1@(T x) {
  T a = fabs@(x), v;
  if (a <= 8.0) v = a * tc_i_series@(a, 1);
  else if (a == INFINITY) v = a;
  else { T e = exp@(0.5 * a); v = e * (tc_ch_i1_large@(16.0 / a - 1.0) / sqrt@(a)) * e; }
  return x < 0.0 ? -v : v;
}"""),
    CFunction("tc_bessel_large", ("tc_ch_p0_large", "tc_ch_q0_large", "tc_ch_p1_large", "tc_ch_q1_large"), r"""
/* Bessel functions of the first and second kind for x >= 8 from Hankel's P and Q; the phases
   cos(x - pi/4) and friends are sums of cos x and sin x, so no multiple of pi is subtracted */
DEVFN T tc_bessel_large@(T x, int order, int second) {
  T t = 128.0 / (x * x) - 1.0, s = sin@(x), c = cos@(x), k = 0.56418958354775628695 / sqrt@(x);
  T p = order ? tc_ch_p1_large@(t) : tc_ch_p0_large@(t);
  T q = (order ? tc_ch_q1_large@(t) : tc_ch_q0_large@(t)) / x;
  T cc = order ? s - c : c + s, ss = order ? -(s + c) : s - c;  /* sqrt 2 cos(chi), sqrt 2 sin(chi) */
  return second ? k * (p * ss + q * cc) : k * (p * cc - q * ss);
}"""),
    CFunction("tc_j0", ("tc_ch_j0_small", "tc_bessel_large"), r"""
DEVFN T tc_j0@(T x) {
  T a = fabs@(x);
  if (a <= 8.0) return tc_ch_j0_small@(a * a * 0.03125 - 1.0);
  return a == INFINITY ? 0.0 : tc_bessel_large@(a, 0, 0);
}"""),
    CFunction("tc_j1", ("tc_ch_j1_small", "tc_bessel_large"), r"""
DEVFN T tc_j1@(T x) {
  T a = fabs@(x), v;
  if (a <= 8.0) v = a * tc_ch_j1_small@(a * a * 0.03125 - 1.0);
  else v = a == INFINITY ? 0.0 : tc_bessel_large@(a, 1, 0);
  return x < 0.0 ? -v : v;
}"""),
    CFunction("tc_y0", ("tc_ch_y0_small", "tc_j0", "tc_bessel_large"), r"""
DEVFN T tc_y0@(T x) {
  if (!(x >= 0.0)) return (x - x) / (x - x);
  if (x == 0.0) return -INFINITY;
  if (x <= 8.0) return tc_ch_y0_small@(x * x * 0.03125 - 1.0) + 0.63661977236758134 * log@(x) * tc_j0@(x);
  return x == INFINITY ? 0.0 : tc_bessel_large@(x, 0, 1);
}"""),
    CFunction("tc_y1", ("tc_ch_y1_small", "tc_j1", "tc_bessel_large"), r"""
DEVFN T tc_y1@(T x) {
  if (!(x >= 0.0)) return (x - x) / (x - x);
  if (x == 0.0) return -INFINITY;
  if (x <= 8.0) {
    if (x < 1e-30) return -0.63661977236758134 / x;
    return x * tc_ch_y1_small@(x * x * 0.03125 - 1.0) + 0.63661977236758134 * (log@(x) * tc_j1@(x) - 1.0 / x);
  }
  return x == INFINITY ? 0.0 : tc_bessel_large@(x, 1, 1);
}"""),
    CFunction("tc_fmax", (), r"""
/* fmax and fmin as numpy's and glibc's: the other operand where one is NaN, else the second on a
   tie. libm's are calls, and GCC leaves a loop that calls them scalar (a relu pass 13x slower) */
DEVFN T tc_fmax@(T a, T b) { return (a > b || b != b) ? a : b; }"""),
    CFunction("tc_fmin", (), r"""
DEVFN T tc_fmin@(T a, T b) { return (a < b || b != b) ? a : b; }"""),
    CFunction("tc_round", (), r"""
/* round and fdim as libm's, inline for the same reason; x - trunc(x) is exact */
DEVFN T tc_round@(T x) { T t = trunc@(x); return fabs@(x - t) >= 0.5 ? t + copysign@(1.0, x) : t; }"""),
    CFunction("tc_fdim", (), r"""
DEVFN T tc_fdim@(T a, T b) { return a > b ? a - b : (a != a || b != b) ? a + b : 0.0; }"""),
    CFunction("tc_rcbrt", (), r"""
DEVFN T tc_rcbrt@(T x) { return 1.0 / cbrt@(x); }"""),
    CFunction("tc_rhypot", ("tc_norm",), r"""
DEVFN T tc_rhypot@(T x, T y) { return tc_norm@(x, y, 0.0, 0.0, 1); }"""),
    CFunction("tc_norm", (), r"""
/* sqrt(a^2 + b^2 + c^2 + d^2) and its reciprocal, scaled by a power of two near the largest |value| */
DEVFN T tc_norm@(T a, T b, T c, T d, int reciprocal) {
  a = fabs@(a); b = fabs@(b); c = fabs@(c); d = fabs@(d);
  if (a == INFINITY || b == INFINITY || c == INFINITY || d == INFINITY) return reciprocal ? 0.0 : INFINITY;
  T m = fmax@(fmax@(a, b), fmax@(c, d));
  if (a != a || b != b || c != c || d != d) return a + b + c + d;
  if (m == 0.0) return reciprocal ? INFINITY : 0.0;
  int e = ilogb@(m);
  a = ldexp@(a, -e); b = ldexp@(b, -e); c = ldexp@(c, -e); d = ldexp@(d, -e);
  T s = fma@(a, a, fma@(b, b, fma@(c, c, d * d)));
  return reciprocal ? ldexp@(1.0 / sqrt@(s), -e) : ldexp@(sqrt@(s), e);
}"""),
    CFunction("tc_digamma", ("tc_sinpi", "tc_cospi"), r"""
/* digamma: reflection below 0, the recurrence up to DIGAMMA_SHIFT, then the asymptotic series */
DEVFN T tc_digamma@(T x) {
  if (x != x || x == INFINITY) return x;
  T r = 0.0;
  if (x <= 0.0) {
    if (x == 0.0) return -copysign@(1.0, x) * INFINITY;
    if (x == floor@(x)) return (x - x) / (x - x);
    r = -3.14159265358979324 * tc_cospi@(x) / tc_sinpi@(x);
    x = 1.0 - x;
  }
  while (x < $DIGAMMA_SHIFT) { r -= 1.0 / x; x += 1.0; }
  T f = 1.0 / (x * x);
  T s = f * (0.083333333333333333 - f * (0.0083333333333333333 - f * (0.003968253968253968
        - f * (0.0041666666666666667 - f * (0.0075757575757575758 - f * 0.021092796092796093)))));
  return r + log@(x) - 0.5 / x - s;
}"""),
    CFunction("tc_nextafter_half", (), r"""
/* nextafter on float16 values held in floats: one float16 step (the caller rounds to float16) */
DEVFN T tc_nextafter_half@(T x, T y) {
  if (x != x || y != y) return x + y;
  if (x == y) return y;
  if (x == 0.0) return copysign@(5.9604644775390625e-08, y);
  T a = fabs@(x);
  if (a == INFINITY) return copysign@(65504.0, x);
  int e = a < 6.103515625e-05 ? -14 : ilogb@(a);
  T ulp = ldexp@(1.0, e - 10);
  int away = (y > x) == (x > 0.0);
  if (!away && e > -14 && a == ldexp@(1.0, e)) ulp *= 0.5;
  return away ? x + copysign@(ulp, x) : x - copysign@(ulp, x);
}"""),
    CFunction("tc_trigamma", ("tc_sinpi",), r"""
/* trigamma: reflection below 0, the recurrence up to TRIGAMMA_SHIFT, then the asymptotic series */
DEVFN T tc_trigamma@(T x) {
  if (x != x || x == INFINITY) return x != x ? x : 0.0;
  T r = 0.0, sign = 1.0;
  if (x <= 0.0) {
    if (x == floor@(x)) return x == -INFINITY ? x - x : INFINITY;
    T s = tc_sinpi@(x);
    r = 9.8696044010893586 / (s * s);  /* psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x) */
    sign = -1.0;
    x = 1.0 - x;
  }
  T acc = 0.0;
  while (x < $TRIGAMMA_SHIFT) { acc += 1.0 / (x * x); x += 1.0; }
  T f = 1.0 / (x * x);
  T tail = 1.0 / x + 0.5 * f + f * (0.16666666666666667 / x) * (1.0 - f * (0.2 - f * (0.14285714285714286
           - f * (0.2 - f * 0.45454545454545455))));
  return r + sign * (acc + tail);
}"""),
)
LIBRARY: dict[str, CFunction] = {f.name: f for f in _FUNCTIONS}

_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])")
_SUFFIXED = re.compile(r"\b([a-z_][a-z0-9_]*)@")
# the libm names the library calls; OpenCL C spells them without the f (see codegen/gpu.py)
LIBM_CALLS: tuple[str, ...] = tuple(sorted({m for f in _FUNCTIONS for m in _SUFFIXED.findall(f.text)
                                           if not m.startswith("tc_")}))


def closure(names: Iterable[str]) -> list[str]:
    """``names`` with every library function they call, each after the ones it calls."""
    order: list[str] = []

    def visit(n: str) -> None:
        if n in order:
            return
        for m in LIBRARY[n].needs:
            visit(m)
        order.append(n)

    for n in sorted(set(names)):
        visit(n)
    return order


def instantiate(name: str, dtype: str) -> str:
    """The C text of library function ``name`` for ``dtype`` (float16 computes in float)."""
    double = dtype == "float64"
    text = LIBRARY[name].text
    for key, (f, d) in _CONSTANTS.items():
        text = text.replace(f"${key}", d if double else f)
    text = re.sub(r"\bT\b", "double" if double else "float", text)
    text = _SUFFIXED.sub(lambda m: m.group(1) + ("" if double else "f"), text)
    if not double:
        text = _FLOAT_LITERAL.sub(lambda m: m.group(1) if m.group(1).endswith("f") else m.group(1) + "f", text)
    return text.strip("\n")


def source(calls: Iterable[tuple[str, str]]) -> str:
    """The library text for the (function, dtype) pairs a kernel calls, with what they call; empty
    when there are none."""
    by_type: dict[str, set[str]] = {}
    for name, dtype in calls:
        by_type.setdefault("float64" if dtype == "float64" else "float32", set()).add(name)
    if not by_type:
        return ""
    parts = ["#ifndef DEVFN\n#define DEVFN static inline\n#endif"]
    for dtype in sorted(by_type):
        parts.extend(instantiate(n, dtype) for n in closure(by_type[dtype]))
    return "\n".join(parts) + "\n"
