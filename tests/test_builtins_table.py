"""The builtin table (tcdsl.core.builtins): every builtin on every backend against scipy/numpy (mpmath
where scipy is not accurate enough) on a grid of arguments with special values, to a stated number
of ulps per function and type; NaN positions exactly; the derivatives by gradcheck; the CUDA text
through NVRTC. One def holds all the builtins of a type, so each backend compiles once per type.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest
import scipy.special as sp

import tcdsl as tc
from tcdsl.codegen import gpu, mathlib, nvrtc, toolchain
from tcdsl.core.builtins import BUILTINS
from tcdsl.core.checked import Call, Read
from tcdsl.derivative import diff, key_of
from tcdsl.errors import TcGradientError

try:  # pytest's default (prepend) import mode puts tests/ on sys.path; other modes may not
    from conftest import has_c_compiler, has_opencl
    from targets import runnable
except ImportError:  # pragma: no cover
    from tests.conftest import has_c_compiler, has_opencl
    from tests.targets import runnable

mp = pytest.importorskip("mpmath")
NATIVE = toolchain.native_target(tuple(toolchain.compiler())).isa
mp.mp.dps = 40

N = 96  # grid points per builtin
TYPES = {"float32": "float", "float64": "double"}
NEW = ("copysign cospi cyl_bessel_i0 cyl_bessel_i1 erfc erfcinv erfcx erfinv exp10 fdim fdivide hypot j0 j1 "
       "lgamma logb nextafter norm3d norm4d normcdf normcdfinv rcbrt remainder rhypot rnorm3d rnorm4d sinpi "
       "tgamma y0 y1 digamma trigamma").split()

# ---- references ---------------------------------------------------------------------------------------


def _mp(f, *, special=None, zero=False):
    """Elementwise ``f`` in mpmath (40 digits) on finite arguments (``zero``: not at 0 either);
    ``special`` (numpy, float64) gives the value elsewhere."""
    def g(*args: np.ndarray) -> np.ndarray:
        out = special(*args) if special is not None else np.full(args[0].shape, np.nan)
        out = np.array(out, dtype=np.float64)
        for i in np.ndindex(args[0].shape):
            vals = [float(a[i]) for a in args]
            if all(math.isfinite(v) for v in vals) and not (zero and 0 in vals):
                out[i] = float(f(*(mp.mpf(v) for v in vals)))
        return out
    return g


def _jy(order: int, second: bool):
    """scipy below 5; mpmath beyond, where scipy's phase x - pi/4 costs up to 1000 ulps"""
    sci = {(0, False): sp.j0, (1, False): sp.j1, (0, True): sp.y0, (1, True): sp.y1}[order, second]
    far = _mp(lambda x: (mp.bessely if second else mp.besselj)(order, x))

    def g(x: np.ndarray) -> np.ndarray:
        near = np.where(np.isinf(x) & ((x > 0) | (not second)), 0.0, sci(x))
        big = np.isfinite(x) & (np.abs(x) > 5) & ((x > 0) | (not second))
        return np.where(big, far(np.where(big, x, 1.0)), near)
    return g


def _norm(*a: np.ndarray) -> np.ndarray:
    return _mp(lambda *v: mp.sqrt(mp.fsum(t * t for t in v)),
               special=lambda *v: np.where(np.any(np.isinf(v), axis=0), np.inf, np.nan))(*a)


def _rnorm(*a: np.ndarray) -> np.ndarray:
    def special(*v: np.ndarray) -> np.ndarray:
        return np.where(np.any(np.isinf(v), axis=0), 0.0, np.nan)

    def f(*v):
        s = mp.fsum(t * t for t in v)
        return mp.inf if s == 0 else 1 / mp.sqrt(s)
    return _mp(f, special=special)(*a)


def _remainder(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ok = np.isfinite(x) & ~np.isnan(y) & (y != 0)
    return np.array([math.remainder(a, b) if k else math.nan for a, b, k in zip(x.ravel(), y.ravel(), ok.ravel())])


def _logb(x: np.ndarray) -> np.ndarray:
    e = np.array([math.frexp(v)[1] - 1 if math.isfinite(v) and v != 0 else 0 for v in x], dtype=np.float64)
    return np.where(x == 0, -np.inf, np.where(np.isfinite(x), e, np.abs(x)))


def _erfcx(x: np.ndarray) -> np.ndarray:
    neg = _mp(lambda v: mp.erfc(v) * mp.exp(v * v), special=lambda v: np.where(v < 0, np.inf, np.nan))
    return np.where(x >= 0, sp.erfcx(x), neg(np.where(x >= 0, -1.0, x)))


def _erfcinv_tiny(q):
    return mp.findroot(lambda y: mp.log(mp.erfc(y)) - mp.log(q), mp.sqrt(-mp.log(q)))


REFERENCE = {
    "copysign": np.copysign,
    "sinpi": _mp(mp.sinpi), "cospi": _mp(mp.cospi),
    "cyl_bessel_i0": _mp(lambda x: mp.besseli(0, x), special=lambda x: np.abs(x)),
    "cyl_bessel_i1": _mp(lambda x: mp.besseli(1, x), special=lambda x: x),
    "erfc": _mp(lambda x: mp.erfc(x) if abs(x) < 30 else mp.mpf(2 * (x < 0)),
                special=lambda x: np.where(np.isnan(x), np.nan, (x < 0) * 2.0)),
    "erfcinv": lambda q: np.where((q > 0) & (q < 1e-280), _mp(_erfcinv_tiny)(
        np.where((q > 0) & (q < 1e-280), q, 1e-300)), sp.erfcinv(q)),
    "erfcx": _erfcx, "erfinv": sp.erfinv,
    "exp10": _mp(lambda x: mp.power(10, x), special=lambda x: np.where(x == -np.inf, 0.0, x)),
    "fdim": lambda x, y: np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x - y, 0.0)),
    "fdivide": np.true_divide, "hypot": np.hypot,
    "j0": _jy(0, False), "j1": _jy(1, False), "y0": _jy(0, True), "y1": _jy(1, True),
    "trigamma": _mp(lambda x: mp.psi(1, x) if x > 0 or x != int(x) else mp.inf,
                    special=lambda x: np.where(x == np.inf, 0.0, np.where(x == 0, np.inf, np.nan))),
    "lgamma": lambda x: np.where(np.isinf(x), np.inf, np.where(np.abs(x) < 1e-300, -np.log(np.abs(x)), sp.gammaln(x))),
    "tgamma": sp.gamma, "logb": _logb,
    "digamma": _mp(lambda x: mp.digamma(x) if x > 0 or x != int(x) else mp.nan, zero=True,
                   special=lambda x: np.where(x == np.inf, x, np.where(x == 0, -np.copysign(np.inf, x), np.nan))),
    "norm3d": _norm, "norm4d": _norm, "rnorm3d": _rnorm, "rnorm4d": _rnorm,
    "normcdf": _mp(lambda x: mp.ncdf(x) if abs(x) < 40 else mp.mpf(x > 0),
                   special=lambda x: np.where(np.isnan(x), np.nan, (x > 0) * 1.0)),
    "normcdfinv": sp.ndtri,
    "rcbrt": _mp(lambda x: mp.sign(x) / mp.cbrt(abs(x)), zero=True,
                 special=lambda x: np.where(x == 0, np.copysign(np.inf, x),
                                            np.where(np.isnan(x), np.nan, np.copysign(0.0, x)))),
    "remainder": _remainder,
    "rhypot": lambda x, y: _rnorm(x, y),
}

# ---- the grid ---------------------------------------------------------------------------------------


def _specials(dt: type) -> list[float]:
    fi = np.finfo(dt)
    return [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -3.75, float(fi.tiny), -float(fi.tiny), float(fi.smallest_subnormal),
            float(fi.max), -float(fi.max), math.inf, -math.inf, math.nan]


def _domain(name: str, dt: type, rng: np.random.Generator, n: int) -> np.ndarray:
    """Random arguments where ``name`` is interesting, as float64."""
    f32 = dt == np.float32
    big = 37 if f32 else 300
    mag = np.sign(rng.uniform(-1, 1, n)) * 10.0 ** rng.uniform(-big, big, n)
    if name == "erfinv":
        return np.concatenate([rng.uniform(-1, 1, n // 2), np.sign(rng.uniform(-1, 1, n - n // 2)) *
                               (1 - 10.0 ** rng.uniform(-7 if f32 else -15, -1, n - n // 2))])
    if name in ("erfcinv", "normcdfinv"):
        top = 2.0 if name == "erfcinv" else 1.0
        k = n // 3
        return np.concatenate([rng.uniform(0, top, k), 10.0 ** rng.uniform(-44 if f32 else -320, -1, k),
                               top - 10.0 ** rng.uniform(-7 if f32 else -15, -1, n - 2 * k)])
    if name in ("lgamma", "tgamma", "digamma", "trigamma"):
        k = n // 4
        poles = -np.floor(rng.uniform(0, 20, k)) + np.sign(rng.uniform(-1, 1, k)) * 10.0 ** rng.uniform(-6, -2, k)
        return np.concatenate([rng.uniform(-20, 40 if f32 else 180, n - n // 4), poles])
    if name in ("j0", "j1", "y0", "y1"):
        return np.concatenate([rng.uniform(0, 40, n // 2), 10.0 ** rng.uniform(-10, 6, n - n // 2)])
    if name == "erfcx":
        return np.concatenate([rng.uniform(-9 if f32 else -26, 12, n // 2), 10.0 ** rng.uniform(0, 30, n - n // 2)])
    if name == "normcdf":
        return rng.uniform(-13 if f32 else -37, 9, n)
    if name == "exp10":
        return rng.uniform(-46 if f32 else -324, 39 if f32 else 309, n)
    if name in ("cyl_bessel_i0", "cyl_bessel_i1"):
        return rng.uniform(-95 if f32 else -715, 95 if f32 else 715, n)
    if name in ("sinpi", "cospi"):
        k, rest = n // 3, n - 2 * (n // 3)
        return np.concatenate([rng.uniform(-1e3, 1e3, k), np.round(rng.uniform(-1e3, 1e3, k)) / 2,
                               np.sign(rng.uniform(-1, 1, rest)) * 10.0 ** rng.uniform(-30, 20, rest)])
    return np.concatenate([rng.uniform(-10, 10, n // 2), mag[: n - n // 2]])


@functools.cache
def grid(name: str, dtype: str) -> np.ndarray:
    """``(N, arity)`` arguments for ``name`` in ``dtype``: special values (and their pairs) first."""
    dt = np.dtype(dtype).type
    b = BUILTINS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    cols = []
    for k in range(b.arity):
        sp_ = _specials(dt)
        sp_ = sp_[k:] + sp_[:k]  # every argument sees the special values, in different pairs
        rnd = _domain(name, dt, rng, N - len(sp_))
        cols.append(np.concatenate([sp_, rnd]))
    args = np.stack(cols, axis=1)
    if name == "remainder":  # ties: x / y halfway between integers
        far = 1e300 if dt == np.float64 else 1e30
        args[-6:] = [[5.5, 1.0], [6.5, 1.0], [-2.5, 1.0], [7.0, 2.0], [3.0, 2.0], [far, 3.0]]
    if name in ("norm3d", "norm4d", "rnorm3d", "rnorm4d", "hypot", "rhypot"):  # scaling: large and small together
        h = 1e300 if dt == np.float64 else 1e37
        args[-4:] = np.array([[h, h, h, h], [1e-300 if dt == np.float64 else 1e-40, 0.0, 0.0, 0.0],
                              [3.0, 4.0, 12.0, 84.0], [h, -1.0, 0.0, 1e-30]])[:, : b.arity]
    with np.errstate(over="ignore"):
        return args.astype(dt)


def reference(name: str, dtype: str) -> np.ndarray:
    args = grid(name, dtype).astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "nextafter":  # a step in the type itself
            a = grid(name, dtype)
            return np.nextafter(a[:, 0], a[:, 1])
        out = REFERENCE[name](*(args[:, k] for k in range(args.shape[1])))
        return np.asarray(out, dtype=np.float64).astype(dtype)


# ---- ulp bounds (measured, with room for other libms) ---------------------------------------------------

# name -> (float32, float64) ulps against the reference, on every backend
ULPS: dict[str, tuple[float, float]] = {
    "copysign": (0, 0), "fdim": (0, 0), "fdivide": (0, 0), "nextafter": (0, 0), "remainder": (0, 0), "logb": (0, 0),
    "sinpi": (2, 2), "cospi": (2, 2), "hypot": (2, 2), "rhypot": (2, 3),
    # 1 / cbrt: in C loops, libmvec's AVX2 cbrtf is up to 2.9 ulps from the exact value (2M random
    # arguments in -100..100), and its reciprocal up to 4.4 ulps of the result
    "rcbrt": (5, 3),
    "norm3d": (2, 3), "norm4d": (2, 3), "rnorm3d": (2, 3), "rnorm4d": (2, 3),
    "erfc": (4, 4), "erfcx": (3, 4), "exp10": (3, 3), "erfinv": (2, 4), "erfcinv": (2, 4), "normcdf": (3, 8),
    "normcdfinv": (2, 3), "cyl_bessel_i0": (4, 4), "cyl_bessel_i1": (4, 4),
    # lgamma and the polygammas: ulps of max(|result|, 1)
    "lgamma": (4, 4), "tgamma": (4, 8), "digamma": (6, 8), "trigamma": (3, 4),
    # Bessel functions of the first and second kind: ulps of max(|result|, the envelope sqrt(2 / (pi x)))
    "j0": (4, 6), "j1": (4, 4), "y0": (8, 16), "y1": (5, 6),
}


def ulp_errors(name: str, dtype: str, got: np.ndarray) -> np.ndarray:
    """|got - reference| in ulps of the reference's type (results below the smallest normal count
    in ulps of the smallest normal; j/y in ulps of their envelope where larger)."""
    want = reference(name, dtype)
    dt = np.dtype(dtype).type
    fi = np.finfo(dt)
    scale = np.maximum(np.abs(want.astype(np.float64)), float(fi.tiny))
    if name in ("j0", "j1", "y0", "y1"):
        x = np.abs(grid(name, dtype)[:, 0].astype(np.float64))
        with np.errstate(divide="ignore"):
            scale = np.maximum(scale, np.minimum(1.0, math.sqrt(2 / math.pi) / np.sqrt(x)))
    if name in ("lgamma", "digamma"):  # absolute near the zeros (lgamma at 1 and 2, digamma's roots)
        scale = np.maximum(scale, 1.0)
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.minimum(scale, float(fi.max)).astype(dt)).astype(np.float64)
    fin = np.isfinite(want) & np.isfinite(got)
    err = np.zeros(want.shape)
    with np.errstate(invalid="ignore"):
        err[fin] = np.abs(got[fin].astype(np.float64) - want[fin].astype(np.float64)) / ulp[fin]
    return err


def check(name: str, dtype: str, got: np.ndarray, backend: str) -> float:
    want = reference(name, dtype)
    args = grid(name, dtype)
    nan = np.isnan(want) != np.isnan(got)
    assert not nan.any(), f"{name} {dtype} {backend}: NaN where the reference has none or the reverse at " \
                          f"{args[nan][:4].tolist()}: got {got[nan][:4]}, want {want[nan][:4]}"
    inf = np.isinf(want) | np.isinf(got)
    assert np.array_equal(got[inf], want[inf]), f"{name} {dtype} {backend}: infinities differ at " \
        f"{args[inf][got[inf] != want[inf]][:4].tolist()}: got {got[inf][got[inf] != want[inf]][:4]}"
    err = ulp_errors(name, dtype, got)
    limit = ULPS[name][dtype == "float64"]
    worst = int(np.argmax(err))
    assert err[worst] <= limit, f"{name} {dtype} {backend}: {err[worst]:.3g} ulps (bound {limit}) at " \
                                f"{args[worst].tolist()}: got {got[worst]!r}, want {want[worst]!r}"
    return float(err.max())


# ---- the def with every new builtin ---------------------------------------------------------------------


def source(dtype: str) -> str:
    outs = ", ".join(f"O{k}" for k in range(len(NEW)))
    lines = []
    for k, name in enumerate(NEW):
        args = ", ".join(f"A({k}, i, {j})" for j in range(BUILTINS[name].arity))
        lines.append(f"    O{k}(i) = {name}({args})")
    return f"def all_builtins({TYPES[dtype]}(F, N, K) A) -> ({outs}) {{\n" + "\n".join(lines) + "\n}"


def packed(dtype: str) -> np.ndarray:
    a = np.zeros((len(NEW), N, 4), dtype=dtype)
    for k, name in enumerate(NEW):
        g = grid(name, dtype)
        a[k, :, : g.shape[1]] = g
    return a


@functools.cache
def run(backend: str, dtype: str) -> tuple[np.ndarray, ...]:
    with np.errstate(all="ignore"):
        return tc.define(source(dtype))(packed(dtype), backend=backend)


BACKENDS = [
    pytest.param("numpy"),
    pytest.param("c", marks=[pytest.mark.cpu]),
    pytest.param("opencl", marks=[pytest.mark.gpu, pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform")]),
]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_builtin_matches_the_reference(backend: str, dtype: str) -> None:
    if backend == "c" and not has_c_compiler():
        pytest.skip("no C compiler")
    outs = run(backend, dtype)
    failures = []
    for name, got in zip(NEW, outs):
        try:
            check(name, dtype, np.asarray(got), backend)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.skipif(not runnable("avx2") or NATIVE == "avx2", reason="an x86 machine wider than AVX2")
def test_every_builtin_on_the_avx2_path(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bounds for the C kernels of an AVX2 machine, built here (``TCDSL_CPU=avx2``): their
    loops call libmvec's AVX2 variants, not the wider ones the machine's own build calls."""
    if not has_c_compiler():
        pytest.skip("no C compiler")
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    with np.errstate(all="ignore"):
        outs = tc.define(source(dtype))(packed(dtype), backend="c")
    failures = []
    for name, got in zip(NEW, outs):
        try:
            check(name, dtype, np.asarray(got), "c (avx2)")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_float16_computes_in_float_and_rounds(backend: str) -> None:
    """float16 arguments: every backend within 1 ulp (of float16) of the interpreter, which
    computes in float64 and rounds; NaN and infinities in the same places."""
    if backend == "c" and not has_c_compiler():
        pytest.skip("no C compiler")
    k = tc.define(source("float32").replace("float(F, N, K)", "float16(F, N, K)"))
    with np.errstate(all="ignore"):
        a = packed("float32").astype(np.float16)
        want, got = k(a, backend="numpy"), k(a, backend=backend)
    for name, w, g in zip(NEW, want, got):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert np.array_equal(np.isnan(w), np.isnan(g)), name
        inf = np.isinf(w) | np.isinf(g)
        assert np.array_equal(w[inf], g[inf]), name
        fin = np.isfinite(w)
        with np.errstate(over="ignore"):  # the spacing at 65504 is inf in float16: 32 in float64
            ulp = np.spacing(np.maximum(np.abs(w[fin]), float(np.finfo(np.float16).tiny)).astype(np.float16))
        ulp = np.where(np.isinf(ulp), 32.0, ulp)
        assert np.all(np.abs(w[fin] - g[fin]) <= ulp.astype(np.float64)), name


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_inline_library_gives_the_interpreters_bits(backend: str, dtype: str) -> None:
    """fmax, fmin, fdim and round on every pair of special values and halfway cases give the
    interpreter's bits: for fmax/fmin the number where one side is NaN and the second operand on a
    tie (numpy's and glibc's: -0.0 against +0.0 picks the second), round halfway cases away from zero.
    In C they are the library's inline functions, not libm calls, so the loops around them vectorise."""
    if backend == "c" and not has_c_compiler():
        pytest.skip("no C compiler")
    k = tc.define(f"def lib({dtype}(N) A, {dtype}(N) B) -> (X, Y, D, R) {{\n"
                  "  X(i) = fmax(A(i), B(i))\n  Y(i) = fmin(A(i), B(i))\n"
                  "  D(i) = fdim(A(i), B(i))\n  R(i) = round(A(i))\n}")
    big = np.float32(2**23) if dtype == "float32" else np.float64(2**52)
    v = np.array([np.nan, -0.0, 0.0, 1.0, -1.0, -np.inf, np.inf, 2.5, -2.5, 0.5, -0.5, 1.5,
                  np.nextafter(np.array(0.5, dtype), 0), big + 1, -big - 1, np.finfo(dtype).tiny], dtype=dtype)
    a, b = np.repeat(v, len(v)), np.tile(v, len(v))
    got, want = k(a, b, backend=backend), k(a, b, backend="numpy")
    u = np.uint32 if dtype == "float32" else np.uint64
    assert np.array_equal(want[0].view(u), np.fmax(a, b).view(u))
    assert np.array_equal(want[1].view(u), np.fmin(a, b).view(u))
    for name, g, w in zip("XYDR", got, want):
        same = (g.view(u) == w.view(u)) | (np.isnan(g) & np.isnan(w))  # NaN payloads may differ
        assert same.all(), (name, a[~same], b[~same], g[~same], w[~same])
    if backend == "c":
        code = "\n".join(line.split("//")[0] for line in k.source(a, b).splitlines())  # not the def quoted
        assert all(f"tc_{f}" in code for f in ("fmax", "fmin", "fdim", "round"))
        assert not re.search(r"(?<![\w@])(fmax|fmin|fdim|round)f?\(", code)


def test_the_table_is_complete_and_consistent() -> None:
    from tcdsl.core.sema import BUILTINS as SEMA

    assert set(NEW) <= set(BUILTINS) and set(SEMA) == set(BUILTINS)
    for b in BUILTINS.values():
        assert SEMA[b.name] == (b.arity, b.kind)
        for target in ("c", "cuda", "opencl"):
            text = b.spelling(target)
            assert set(re.findall(r"\{(\d+)\}", text)) == {str(i) for i in range(b.arity)}, (b.name, target)
            for m in re.findall(r"\b(tc_\w+)\{f\}", text):
                if not m.startswith(("tc_min", "tc_max", "tc_abs")):
                    assert m in mathlib.LIBRARY, (b.name, target, m)
            for m in re.findall(r"\b(\w+)\{f\}", text):
                assert target != "opencl" or m.startswith("tc_") or m in gpu._F_NAMES, (b.name, m)


def test_every_differentiable_builtin_has_a_rule() -> None:
    for b in BUILTINS.values():
        args = tuple(Read("float64", f"X{k}", ()) for k in range(b.arity))
        e = Call("float64", b.name, args)
        for a in args:
            if b.derivative is None:
                with pytest.raises(TcGradientError, match=b.name):
                    diff(e, key_of(a))
            elif b.derivative == "flat":
                assert diff(e, key_of(a)) is None
            else:
                diff(e, key_of(a))  # a rule exists (TypeError otherwise)


GRAD_SRC = """
def grads(double(N) A, double(N) B) -> (O1, O2, O3, O4, O5, O6, O7) {
    O1(i) = erfc(A(i)) + erfinv(A(i)) + erfcinv(A(i)) + erfcx(A(i) - 0.5) + exp10(A(i)) + normcdf(B(i) - 2.0)
    O2(i) = normcdfinv(A(i)) + sinpi(B(i)) + cospi(A(i)) + rcbrt(B(i)) + lgamma(B(i)) + tgamma(B(i))
    O3(i) = j0(B(i)) + j1(B(i)) + y0(B(i)) + y1(B(i)) + cyl_bessel_i0(B(i)) + cyl_bessel_i1(A(i) - 0.5)
    O4(i) = hypot(A(i), B(i)) + rhypot(A(i), B(i)) + norm3d(A(i), B(i), A(i) * B(i))
    O5(i) = norm4d(A(i), B(i), 1.5, B(i) - A(i)) + rnorm3d(A(i), B(i), 0.5) + rnorm4d(A(i), B(i), A(i), 2.0)
    O6(i) = fdivide(A(i), B(i)) + copysign(A(i) - 0.5, B(i) - 1.75) + fdim(A(i), B(i) - 1.5)
    O7(i) = remainder(B(i), A(i)) + nextafter(A(i), B(i)) + logb(B(i)) * A(i)
}
"""


@pytest.mark.cpu
def test_gradcheck_of_every_differentiable_builtin() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    a = (torch.rand(12, generator=gen, dtype=torch.float64) * 0.8 + 0.1).requires_grad_(True)
    b = (torch.rand(12, generator=gen, dtype=torch.float64) * 2.5 + 0.5).requires_grad_(True)
    k = tc.define(GRAD_SRC, backend="c")
    assert torch.autograd.gradcheck(k, (a, b), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.cpu
def test_lgamma_twice_differentiable_then_refused() -> None:
    torch = pytest.importorskip("torch")
    b = (torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3 + 0.2).requires_grad_(True)
    k = tc.define("def lg(double(N) B) -> (O) { O(i) = lgamma(B(i)) }", backend="c")
    assert torch.autograd.gradgradcheck(k, (b,), eps=1e-6, atol=1e-5, rtol=1e-4)  # digamma, then trigamma
    k3 = tc.define("def tg(double(N) B) -> (O) { O(i) = trigamma(B(i)) }", backend="c")
    with pytest.raises(TcGradientError, match="'trigamma' has no derivative"):
        torch.autograd.grad(k3(b).sum(), b)


@pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("dtype", list(TYPES))
def test_cuda_text_compiles(dtype: str) -> None:
    low = tc.define(source(dtype)).lowered_gpu(packed(dtype), backend="cuda")
    out = nvrtc.compile_cuda(low.source.text)
    assert out.cubin[:4] == b"\x7fELF", out.log
