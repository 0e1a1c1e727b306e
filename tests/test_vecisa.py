"""The vector layer (codegen.vecisa) on every CPU target this machine runs: loads, stores,
broadcasts and fused multiply-adds lane by lane; the vector float32 ``exp``, ``tanh`` and ``log``
within their stated bounds (2, 2 and 1 ulp against float64) over their whole range, subnormals,
signed zeros, infinities, NaN and log's negatives included; and ``max``/``min`` of float32 and
float64 with the bits of the scalar ``tc_max``/``tc_min`` (NaN from either side, -0.0/+0.0 ties);
and the division by a constant through its two-part reciprocal with the division's bits.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tcdsl.codegen import divide, toolchain, vecisa
from tcdsl.errors import TcArgumentError
from tcdsl.polyhedral import cputarget

pytestmark = pytest.mark.cpu
EXP_ULPS = 2
TANH_ULPS = 2
LOG_ULPS = 1

HARNESS = r"""#include <math.h>
#include <string.h>
%s
/* out[i] = exp(x[i]) and fma[i] = a[i] * b[i] + c[i], n a multiple of the float32 lanes; returns the lanes
   (0: the vector layer is not compiled in) */
int vec_check(const float *x, float *out, const float *a, const float *b, const float *c, float *fma, long n) {
#if TC_VEC
  const long lanes = sizeof(tc_vf) / sizeof(float);
  for (long i = 0; i < n; i += lanes) {
    tc_vf v = tc_vf_load(&x[i]);
    tc_vf_store(&out[i], tc_vf_exp(v));
    tc_vf_store(&fma[i], tc_vf_fma(tc_vf_load(&a[i]), tc_vf_load(&b[i]), tc_vf_load(&c[i]) + tc_vf_zero()));
  }
  return (int)lanes;
#else
  return 0;
#endif
}
/* out_tanh[i] = tanh(x[i]), out_log[i] = log(x[i]) (n a multiple of the float32 lanes) */
void vecisa_math(const float *x, float *out_tanh, float *out_log, long n) {
#if TC_VEC
  for (long i = 0; i < n; i += (long)(sizeof(tc_vf) / sizeof(float))) {
    tc_vf v = tc_vf_load(&x[i]);
    tc_vf_store(&out_tanh[i], tc_vf_tanh(v));
    tc_vf_store(&out_log[i], tc_vf_log(v));
  }
#endif
}
/* out[i] = tc_vf_divc(x[i], ...): x / c by the two-part reciprocal (n a multiple of the float32 lanes) */
void vecisa_divc(const float *x, float *out, float c, float hi, float lo, float from, float to, long n) {
#if TC_VEC
  for (long i = 0; i < n; i += (long)(sizeof(tc_vf) / sizeof(float)))
    tc_vf_store(&out[i], tc_vf_divc(tc_vf_load(&x[i]), c, hi, lo, from, to));
#endif
}
/* max and min of a and b, float32 and float64 (n a multiple of the float32 lanes) */
void vecisa_min_max(const float *a, const float *b, float *mx, float *mn, const double *ad, const double *bd,
                 double *mxd, double *mnd, long n) {
#if TC_VEC
  for (long i = 0; i < n; i += (long)(sizeof(tc_vf) / sizeof(float))) {
    tc_vf_store(&mx[i], tc_vf_max(tc_vf_load(&a[i]), tc_vf_load(&b[i])));
    tc_vf_store(&mn[i], tc_vf_min(tc_vf_load(&a[i]), tc_vf_load(&b[i])));
  }
  for (long i = 0; i < n; i += (long)(sizeof(tc_vd) / sizeof(double))) {
    tc_vd_store(&mxd[i], tc_vd_max(tc_vd_load(&ad[i]), tc_vd_load(&bd[i])));
    tc_vd_store(&mnd[i], tc_vd_min(tc_vd_load(&ad[i]), tc_vd_load(&bd[i])));
  }
#endif
}
/* the n vectors at src (float32, then float64, n <= 8) stored side by side from dst, rows s apart:
   dst[l * s + j] = v[j][l]; returns the float32 lanes */
int vecisa_scatter_rows(const float *src, float *dst, const double *srcd, double *dstd, long s, int n) {
#if TC_VEC
  const int lanes = (int)(sizeof(tc_vf) / sizeof(float)), lanesd = (int)(sizeof(tc_vd) / sizeof(double));
  tc_vf v[8];
  tc_vd vd[8];
  for (int j = 0; j < n; j++) {
    v[j] = tc_vf_load(&src[j * lanes]);
    vd[j] = tc_vd_load(&srcd[j * lanesd]);
  }
  tc_vf_scatter_rows(dst, s, n, v);
  tc_vd_scatter_rows(dstd, s, n, vd);
  return lanes;
#else
  return 0;
#endif
}
"""


def _targets() -> list[str]:
    native = toolchain.native_target(tuple(toolchain.compiler()))
    out = []
    for name in ("avx512", "avx2", "sse2", "neon", "generic"):
        try:
            cputarget.named(name, native)
            out.append(name)
        except TcArgumentError:
            pass
    return out


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in float32 ulps of ``want`` (subnormals: the smallest subnormal's spacing)."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def _library(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[ctypes.CDLL, str, cputarget.CpuTarget]:
    """The harness built for target ``name`` (the vector layer compiled in), and vec_check's symbol."""
    monkeypatch.setenv("TCDSL_CPU", name)
    target = toolchain.target()
    lib, symbol, _ = toolchain.kernel_library(HARNESS % vecisa.prelude(target), f"vecisa_{name}", "vec_check")
    return lib, symbol, target


@pytest.mark.parametrize("name", _targets())
def test_vector_exp_and_fma(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lib, symbol, target = _library(name, monkeypatch)
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long]
    rng = np.random.default_rng(0)
    grid = np.concatenate([np.linspace(-110, 95, 40960), rng.uniform(-1, 1, 4096), rng.uniform(-88, 88, 4096),
                           [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 88.7, 88.73, 89.0, -87.3, -103.9, -104.5,
                            np.inf, -np.inf, np.nan, 0.5, -0.5, 1e-7]]).astype(np.float32)
    n = -(-grid.size // 64) * 64
    x = np.zeros(n, np.float32)
    x[:grid.size] = grid
    a, b, c = (rng.uniform(-2, 2, n).astype(np.float32) for _ in range(3))
    out, fma = np.empty(n, np.float32), np.empty(n, np.float32)
    lanes = fn(*(v.ctypes.data for v in (x, out, a, b, c, fma)), n)
    assert lanes == target.lanes("float32")
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    finite = np.isfinite(want) & (want < np.finfo(np.float32).max)
    assert _ulps(out[finite], want[finite]).max() <= EXP_ULPS, x[finite][np.argmax(_ulps(out[finite], want[finite]))]
    assert np.all(np.isinf(out[np.isposinf(want) | (want > np.finfo(np.float32).max)]))
    assert np.array_equal(np.isnan(out), np.isnan(x))
    exact = a.astype(np.float64) * b + c
    if target.fma:  # fused: one rounding
        np.testing.assert_array_equal(fma, exact.astype(np.float32))
    else:  # a multiply and an add: two roundings
        assert np.all(np.abs(fma - exact) <= 2 * np.spacing(np.abs(exact).astype(np.float32)) + 2 * np.spacing(
            np.abs(a * b).astype(np.float32)))


def _special_grid(rng: np.random.Generator) -> np.ndarray:
    """float32 values over the whole range: random bit patterns (every exponent, subnormals, NaNs),
    a dense stretch around tanh's switch at 0.625 and log's at sqrt(1/2), and the special values."""
    tiny = float(np.finfo(np.float32).tiny)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rest = np.concatenate([np.linspace(-12, 12, 100_001), np.linspace(0.55, 0.75, 40_001),
                           rng.uniform(0.5, 2, 50_000), np.exp(rng.uniform(-103, 88, 50_000)),
                           [0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45, tiny, -tiny, tiny / 2, -tiny / 2, 1.0, -1.0,
                            0.625, -0.625, 9.0, -9.0, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan]])
    return np.concatenate([bits, rest.astype(np.float32)])


def _padded(x: np.ndarray, lanes: int = 64) -> np.ndarray:
    out = np.zeros(-(-x.size // lanes) * lanes, x.dtype)
    out[:x.size] = x
    return out


@pytest.mark.parametrize("name", _targets())
def test_vector_tanh_and_log(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """tanh within TANH_ULPS and log within LOG_ULPS of float64 numpy; the special values exactly:
    tanh(+-0) = +-0, tanh(+-inf) = +-1, log(0) = -inf, log(inf) = inf, log of a negative NaN, NaN
    stays NaN."""
    lib, _, _ = _library(name, monkeypatch)
    x = _padded(_special_grid(np.random.default_rng(4)))
    th, lg = np.empty_like(x), np.empty_like(x)
    lib.vecisa_math.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long]
    lib.vecisa_math(x.ctypes.data, th.ctypes.data, lg.ctypes.data, x.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        x64 = np.where(np.isnan(x), np.nan, x.astype(np.float64))
        for got, want, bound in ((th, np.tanh(x64), TANH_ULPS), (lg, np.log(x64), LOG_ULPS)):
            finite = np.isfinite(want)
            ulps = _ulps(got[finite], want[finite])
            assert ulps.max() <= bound, (x[finite][np.argmax(ulps)], ulps.max())
            np.testing.assert_array_equal(got[~finite], want[~finite].astype(np.float32))
    zeros = x == 0
    np.testing.assert_array_equal(np.signbit(th[zeros]), np.signbit(x[zeros]))
    assert np.all(np.isnan(lg[x < 0])) and np.all(np.isneginf(lg[zeros]))


def _random_divisors() -> list[float]:
    """Divisors of every magnitude the two-part form takes (2^-100..2^100), either sign."""
    rng = np.random.default_rng(12)
    return [float(np.float32(v)) for v in rng.choice([-1, 1], 30) * np.exp(rng.uniform(-69, 69, 30))]


@pytest.mark.parametrize("name", _targets())
@pytest.mark.parametrize("divisors", [[3.0], [1000.0], [-0.1], [7.3e-5], [6.1e19], [1.2e-16, -2.7e-27],
                                      _random_divisors()], ids=[*"3 1000 -0.1 7.3e-5 6.1e19 tiny".split(), "random"])
def test_vector_division_by_a_constant_has_the_divisions_bits(name: str, divisors: list[float],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``tc_vf_divc`` (codegen.divide's two-part reciprocal) on every kind of float32, lanes inside
    and outside its window side by side: numpy's division, bit for bit (targets with an fma). A tiny
    divisor's window would reach below the normal range: zeros and subnormals divide there too."""
    lib, _, target = _library(name, monkeypatch)
    x = _padded(_special_grid(np.random.default_rng(6)))
    out = np.empty_like(x)
    lib.vecisa_divc.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_float] * 5 + [ctypes.c_long]
    taken = 0
    for divisor in divisors:
        r = divide.reciprocal(divisor, "float32", target.fma)
        if not target.fma:
            assert r is None
            continue
        if r is None:  # a divisor the check turns down keeps its division
            continue
        taken += 1
        lib.vecisa_divc(x.ctypes.data, out.ctypes.data, r.divisor, r.hi, r.lo, *r.window, x.size)
        with np.errstate(all="ignore"):
            want = x / np.float32(divisor)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(out), nan, err_msg=str(divisor))
        np.testing.assert_array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32), err_msg=str(divisor))
        inside = (np.abs(x) >= r.window[0]) & (np.abs(x) < r.window[1])
        assert inside.reshape(-1, target.lanes("float32")).all(1).mean() > 0.01, divisor  # vectors on the fast path
    assert taken >= (0.9 * len(divisors) if target.fma else 0)


def _scalar_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The scalar ``tc_max(a, b)`` (codegen.cprelude): a where a > b or a is NaN, else b."""
    return np.where((a > b) | np.isnan(a), a, b)


def _scalar_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a < b) | np.isnan(a), a, b)


@pytest.mark.parametrize("name", _targets())
def test_vector_min_max(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """max and min lane by lane with the scalar tc_max/tc_min's bits: NaN on either side, equal
    values and -0.0/+0.0 in both orders."""
    lib, _, _ = _library(name, monkeypatch)
    rng = np.random.default_rng(5)
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 1e-40])
    pairs = np.array([(p, q) for p in special for q in special])
    a64 = np.concatenate([pairs[:, 0], rng.standard_normal(4000), rng.choice(special, 2000)])
    b64 = np.concatenate([pairs[:, 1], rng.standard_normal(4000), rng.choice(special, 2000)])
    a64, b64 = _padded(a64), _padded(b64)
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    outs = [np.empty_like(v) for v in (a32, a32, a64, a64)]
    lib.vecisa_min_max.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_long]
    lib.vecisa_min_max(*(v.ctypes.data for v in (a32, b32, outs[0], outs[1], a64, b64, outs[2], outs[3])), a32.size)
    wants = [_scalar_max(a32, b32), _scalar_min(a32, b32), _scalar_max(a64, b64), _scalar_min(a64, b64)]
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    assert np.isnan(outs[0][:pairs.shape[0]][np.isnan(pairs).any(1)]).all()  # NaN from either side


@pytest.mark.parametrize("name", _targets())
def test_vectors_stored_side_by_side(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tc_v?_scatter_rows(p, s, n, v)``, float32 and float64, for every count of vectors from 1 to
    8: lane ``l`` of vector ``j`` lands at ``p[l * s + j]``, and nothing else in the rows changes."""
    lib, _, _ = _library(name, monkeypatch)
    lib.vecisa_scatter_rows.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_int]
    lib.vecisa_scatter_rows.restype = ctypes.c_int
    rng = np.random.default_rng(7)
    src = rng.standard_normal(8 * 64).astype(np.float32)
    srcd = rng.standard_normal(8 * 64)
    for n in range(1, 9):
        s = 11  # more than 8: the rows do not overlap
        dst = np.full(64 * s + 8, -7.0, np.float32)
        dstd = np.full(64 * s + 8, -7.0)
        lanes = lib.vecisa_scatter_rows(src.ctypes.data, dst.ctypes.data, srcd.ctypes.data, dstd.ctypes.data, s, n)
        assert lanes > 0  # the vector layer is compiled in for this target
        lanesd = lanes // 2
        for got, values, width in ((dst, src, lanes), (dstd, srcd, lanesd)):
            want = np.full_like(got, -7.0)
            for j in range(n):
                for lane in range(width):
                    want[lane * s + j] = values[j * width + lane]
            np.testing.assert_array_equal(got, want, err_msg=f"{n} vectors of {width} lanes ({got.dtype})")
