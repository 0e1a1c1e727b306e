"""The vector layer (codegen.vecisa) on every CPU target this machine runs: loads, stores,
broadcasts and fused multiply-adds lane by lane, and the vector float32 ``exp`` within its stated
bound (2 ulp against exp in float64) over its whole range, subnormal results, overflow to inf,
underflow to 0 and NaN included.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tcdsl.codegen import toolchain, vecisa
from tcdsl.errors import TcArgumentError
from tcdsl.polyhedral import cputarget

pytestmark = pytest.mark.cpu
EXP_ULPS = 2

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


@pytest.mark.parametrize("name", _targets())
def test_vector_exp_and_fma(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_CPU", name)
    target = toolchain.target()
    lib, symbol, _ = toolchain.kernel_library(HARNESS % vecisa.prelude(target), f"vecisa_{name}", "vec_check")
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
