"""The vector layer (codegen.vecisa) for a CPU target this machine cannot run natively, NEON on
aarch64: the layer's harness cross-compiled (``aarch64-linux-gnu-gcc``) and run under qemu user
emulation, with the bounds and bits that tests/test_vecisa.py asks of the native targets. Skipped
where the cross compiler or qemu is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_vecisa import EXP_ULPS, HARNESS, LOG_ULPS, TANH_ULPS, _padded, _scalar_max, _scalar_min, _special_grid, _ulps

from tcdsl.codegen import vecisa
from tcdsl.polyhedral.cputarget import CpuTarget

pytestmark = [pytest.mark.cpu, pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64")]

NEON = CpuTarget("neon", "aarch64", 16, 32, True)

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
static void *slurp(const char *path, long size, long *n) {
  FILE *f = fopen(path, "rb"); fseek(f, 0, SEEK_END); *n = ftell(f) / size; rewind(f);
  void *b = malloc(*n * size); if (fread(b, size, *n, f) != (size_t)*n) exit(2); fclose(f); return b;
}
static void spill(const char *dir, const char *name, const void *b, long n, long size) {
  char path[4096]; snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb"); fwrite(b, size, n, f); fclose(f);
}
int main(int argc, char **argv) {
  const char *d = argv[1]; char path[4096]; long n, m;
  snprintf(path, sizeof path, "%s/x", d); float *x = slurp(path, 4, &n);
  snprintf(path, sizeof path, "%s/a", d); double *a = slurp(path, 8, &m);
  snprintf(path, sizeof path, "%s/b", d); double *b = slurp(path, 8, &m);
  float *t = malloc(n * 4), *l = malloc(n * 4), *e = malloc(n * 4), *fm = malloc(n * 4);
  if (vec_check(x, e, x, x, x, fm, n) != 4) return 3;
  vecisa_math(x, t, l, n);
  float *af = malloc(m * 4), *bf = malloc(m * 4), *mx = malloc(m * 4), *mn = malloc(m * 4);
  double *mxd = malloc(m * 8), *mnd = malloc(m * 8);
  for (long i = 0; i < m; i++) { af[i] = (float)a[i]; bf[i] = (float)b[i]; }
  vecisa_min_max(af, bf, mx, mn, a, b, mxd, mnd, m);
  spill(d, "exp", e, n, 4); spill(d, "tanh", t, n, 4); spill(d, "log", l, n, 4);
  spill(d, "max", mx, m, 4); spill(d, "min", mn, m, 4); spill(d, "maxd", mxd, m, 8); spill(d, "mind", mnd, m, 8);
  return 0;
}
"""


def test_neon_layer_under_qemu(tmp_path: Path) -> None:
    """NEON's exp, tanh and log within their bounds of float64 numpy (special values as numpy
    gives them), and max/min with the scalar tc_max/tc_min's bits, float32 and float64."""
    rng = np.random.default_rng(11)
    x = _padded(_special_grid(rng))
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0]
    a, b = (_padded(np.concatenate([rng.standard_normal(4000), rng.choice(special, 4000)])) for _ in range(2))
    x.tofile(tmp_path / "x")
    a.tofile(tmp_path / "a")
    b.tofile(tmp_path / "b")
    (tmp_path / "neon.c").write_text(HARNESS % vecisa.prelude(NEON) + MAIN)
    subprocess.run(["aarch64-linux-gnu-gcc", "-O3", "-march=armv8-a", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
                    "-Wall", "-Werror", "-static", str(tmp_path / "neon.c"), "-o", str(tmp_path / "neon"), "-lm"],
                   check=True, timeout=300)
    subprocess.run(["qemu-aarch64", str(tmp_path / "neon"), str(tmp_path)], check=True, timeout=300)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        x64 = np.where(np.isnan(x), np.nan, x.astype(np.float64))
        for name, want, bound in (("exp", np.exp(x64), EXP_ULPS), ("tanh", np.tanh(x64), TANH_ULPS),
                                  ("log", np.log(x64), LOG_ULPS)):
            got = np.fromfile(tmp_path / name, np.float32)
            want = np.where(np.abs(want) > np.finfo(np.float32).max, np.copysign(np.inf, want), want)
            finite = np.isfinite(want)
            ulps = _ulps(got[finite], want[finite])
            assert ulps.max() <= bound, (name, x[finite][np.argmax(ulps)], ulps.max())
            np.testing.assert_array_equal(got[~finite], want[~finite].astype(np.float32))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for name, want in (("max", _scalar_max(a32, b32)), ("min", _scalar_min(a32, b32)), ("maxd", _scalar_max(a, b)),
                       ("mind", _scalar_min(a, b))):
        got = np.fromfile(tmp_path / name, want.dtype)
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
