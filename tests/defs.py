"""Differential-test corpus: TC defs with input specs and hand-written numpy references.

Each entry of ``DEFS`` is a ``Case`` (a 5-tuple): ``(name, source, inputs, reference, tol)``.

- ``inputs`` is a tuple of input specs, one per param: an ``Arr`` (random data drawn by
  ``make_inputs``), a fixed ``np.ndarray`` (used as is), or a Python scalar (a rank-0 param).
- ``reference(*arrays)`` is plain numpy; it returns one array or a tuple in the def's output
  declaration order, with exactly the dtypes TC's promotion rules give.
- ``tol`` is ``0`` for exact comparison (integers, bools, selections, copies), otherwise the
  number of terms K of the longest float sum (or product, or chain of roundings) behind one
  output element for these inputs, 1 for plain elementwise math. Float outputs are compared
  normwise by ``tolerance.assert_close``: within ``c * eps * K * max|want|`` plus a few eps of
  each element, whatever order the backend sums in. Integer and bool outputs stay exact.

The reference interpreter (``backend="numpy"``) is checked against these in
``tests/test_interp.py``; compiled backends reuse the same corpus (``make_inputs`` then
``assert_matches``). Nothing here imports tcdsl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from tolerance import assert_close


class Arr(NamedTuple):
    """A random input: floats uniform in ``[lo, hi)``, integers uniform in ``[lo, hi)``, bools fair."""

    dtype: str
    shape: tuple[int, ...]
    lo: float = -1.0
    hi: float = 1.0


class Case(NamedTuple):
    name: str
    source: str
    inputs: tuple[Any, ...]
    reference: Callable[..., Any]
    tol: int


def make_inputs(spec: tuple[Any, ...], seed: int = 0) -> list[Any]:
    """Concrete arguments for an input spec (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for s in spec:
        if isinstance(s, Arr):
            dt = np.dtype(s.dtype)
            if dt == np.bool_:
                out.append(rng.random(s.shape) < 0.5)
            elif dt.kind in "iu":
                out.append(rng.integers(int(s.lo), int(s.hi), size=s.shape).astype(dt))
            else:
                out.append((rng.random(s.shape) * (s.hi - s.lo) + s.lo).astype(dt))
        elif isinstance(s, np.ndarray):
            out.append(s.copy())
        else:
            out.append(s)
    return out


def assert_matches(got: Any, want: Any, tol: int, what: str = "", scale: Any = None) -> None:
    """``got`` has the structure, dtypes and shapes of ``want``; its values are equal (``tol == 0``)
    or within the rounding error of a ``tol``-term float reduction (see ``tolerance.assert_close``;
    ``scale`` is the magnitude of one term, by default the largest |want| of each output)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple), f"{what}: expected a tuple of {len(want)} outputs, got {type(got).__name__}"
        assert len(got) == len(want), f"{what}: expected {len(want)} outputs, got {len(got)}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_matches(g, w, tol, f"{what}[{k}]", scale)
        return
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: expected an ndarray, got {type(got).__name__}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if tol == 0:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        assert_close(got, want, terms=tol, scale=scale, err_msg=what)


# ---- reference helpers -----------------------------------------------------------------------------

f32 = np.float32
f64 = np.float64


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _conv(I: np.ndarray, W: np.ndarray, stride: int = 1, dil: int = 1) -> np.ndarray:
    """NCHW x FCHW valid cross-correlation, computed in float64, returned as float32."""
    N, C, H, Wd = I.shape
    F, _, KH, KW = W.shape
    Ho = (H - dil * (KH - 1) - 1) // stride + 1
    Wo = (Wd - dil * (KW - 1) - 1) // stride + 1
    out = np.zeros((N, F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            patch = I[:, :, kh * dil: kh * dil + stride * (Ho - 1) + 1: stride,
                      kw * dil: kw * dil + stride * (Wo - 1) + 1: stride].astype(f64)
            out += np.einsum("nchw,fc->nfhw", patch, W[:, :, kh, kw].astype(f64))
    return _f(out)


def _group_conv(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.stack([_conv(I[:, g], W[g]) for g in range(I.shape[1])], axis=1)


def _depthwise(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    N, C, H, Wd = I.shape
    _, KH, KW = W.shape
    out = np.zeros((N, C, H - KH + 1, Wd - KW + 1))
    for kh in range(KH):
        for kw in range(KW):
            out += I[:, :, kh: kh + H - KH + 1, kw: kw + Wd - KW + 1].astype(f64) * W[None, :, kh, kw, None, None]
    return _f(out)


def _pool(I: np.ndarray, k: int, s: int, fn: Callable[..., Any]) -> np.ndarray:
    N, C, H, Wd = I.shape
    Ho, Wo = (H - k) // s + 1, (Wd - k) // s + 1
    wins = [I[:, :, a: a + s * (Ho - 1) + 1: s, b: b + s * (Wo - 1) + 1: s].astype(f64)
            for a in range(k) for b in range(k)]
    return _f(fn(np.stack(wins), axis=0))


def _softmax(X: np.ndarray) -> np.ndarray:
    x = X.astype(f64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return _f(e / e.sum(axis=1, keepdims=True))


def _layernorm(X: np.ndarray, G: np.ndarray, B: np.ndarray) -> np.ndarray:
    x = X.astype(f64)
    m = x.mean(axis=1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=1, keepdims=True)
    return _f((x - m) / np.sqrt(v + 1e-5) * G + B)


def _batchnorm(X: np.ndarray, G: np.ndarray, B: np.ndarray) -> np.ndarray:
    x = X.astype(f64)
    m = x.mean(axis=(0, 2, 3), keepdims=True)
    v = ((x - m) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return _f((x - m) / np.sqrt(v + 1e-5) * G[None, :, None, None] + B[None, :, None, None])


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf``, exactly: done in float64, where ``|x| + 0.5`` of a float32 is exact."""
    a = np.abs(x.astype(f64))
    return _f(np.sign(x) * np.floor(a + 0.5))


def _erf(x: np.ndarray) -> np.ndarray:
    return _f(np.vectorize(math.erf)(x.astype(f64)))


def _elementwise(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, ...]:
    a, b, c = A.astype(f64), B.astype(f64), C.astype(f64)
    return (
        _f(np.maximum(a, 0)),                       # relu
        _f(1 / (1 + np.exp(-a))),                   # sigmoid
        _f(np.tanh(a)),                             # tanh
        _erf(A),                                    # erf
        _f(np.abs(a)),                              # abs
        _f(np.abs(b)),                              # fabs
        _f(np.power(c, a)),                         # pow (positive base)
        _f(np.arctan2(a, b)),                       # atan2
        _f(a * b + c),                              # fma
        _f(np.fmin(a, b)),                          # fmin
        _f(np.fmax(a, b)),                          # fmax
        _f(np.minimum(a, b) + np.maximum(a, c)),    # min / max
        _f(np.exp(a) + np.sqrt(c) + np.log(c)),     # exp sqrt log
    )


def _floor_ops(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, ...]:
    return (A // B, A % B, A // 3, A % 3, A // -3, A % -3, -A // 2)


def _casts(A: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, ...]:
    return (
        np.trunc(A).astype(np.int32),                          # int32(float): toward zero
        _f(K.astype(f64) / 2),                                 # float(int) / 2.0
        A.astype(f64) * 2,                                     # double(A) * 2.0 -> float64
        (np.trunc(A * f32(10)).astype(np.int32)) // 3,         # floor division of the cast
        np.trunc(A).astype(np.int64) + np.int64(1),            # int64(A) + 1 -> int64
    )


def _promotion(I32: np.ndarray, U8: np.ndarray, S8: np.ndarray, L: np.ndarray, D: np.ndarray, H: np.ndarray,
               Bo: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, ...]:
    return (
        I32.astype(f32) * f32(2.5),                                 # int32 * float literal -> float32
        U8.astype(np.int32) + S8.astype(np.int32),                  # uint8 + int8 -> int32
        L * np.int64(3) + I32.astype(np.int64),                     # int64 * int + int32 -> int64
        D * A.astype(f64) + I32.astype(f64),                        # float64 wins
        H * H,                                                      # float16 * float16 -> float16
        (H * H).astype(f32) + A,                                    # float16 + float32 -> float32
        np.where(Bo, A, -A),                                        # bool condition
        Bo.astype(np.int32) + Bo.astype(np.int32),                  # bool + bool -> int32
        A > f32(0),                                                 # comparison -> bool
        S8.astype(np.int32) * S8.astype(np.int32),                  # int8 * int8 -> int32, no wrap
        U8.astype(np.int32) - 1,                                    # uint8 - 1 -> int32, no wrap
    )


def _stack_concat(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, ...]:
    return (np.stack([A, B]), np.concatenate([A, B]))


def _int_reductions(A: np.ndarray) -> tuple[np.ndarray, ...]:
    return (A.sum(axis=1, dtype=np.int32), A.min(axis=1), A.max(axis=1), A.max(), A.min())


# ---- the corpus ----------------------------------------------------------------------------------

ROUND_DATA = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 8388609.0, -8388609.0,
                       1.4, -1.4, 2.6, -2.6, 0.0, 3.0], dtype=np.float32)
NONZERO = np.array([-7, -5, -3, -2, -1, 1, 2, 3, 4, 7, -4, 5], dtype=np.int32)
NUMER = np.array([-7, 7, -8, 9, -1, 0, 5, -13, 13, 6, -6, 11], dtype=np.int32)
FMOD_A = np.array([5.5, -5.5, 5.5, -5.5, 0.75, -7.0, 3.0], dtype=np.float32)
FMOD_B = np.array([2.0, 2.0, -2.0, -2.0, 0.5, 3.0, -4.0], dtype=np.float32)

DEFS: list[Case] = [
    Case("matmul",
         "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n"
         "    C(m, n) +=! A(m, r_k) * B(r_k, n)\n"
         "}",
         (Arr("float32", (5, 7)), Arr("float32", (7, 4))),
         lambda A, B: _f(A.astype(f64) @ B), 7),
    Case("matmul_tn",
         "def matmul_tn(float(K, M) A, float(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
         (Arr("float32", (6, 3)), Arr("float32", (6, 5))),
         lambda A, B: _f(A.T.astype(f64) @ B), 6),
    Case("matmul_nt_2",
         "def matmul_nt(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) * 2.0 }",
         (Arr("float32", (4, 9)), Arr("float32", (3, 9))),
         lambda A, B: _f(2 * (A.astype(f64) @ B.T)), 9),
    Case("batch_matmul",
         "def bmm(float(Bt, M, K) X, float(Bt, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }",
         (Arr("float32", (3, 4, 5)), Arr("float32", (3, 5, 2))),
         lambda X, Y: _f(X.astype(f64) @ Y), 5),
    Case("gemm_alpha_beta",
         "def gemm(float alpha, float beta, float(M, K) A, float(K, N) B, float(M, N) C0) -> (C) {\n"
         "    C(i, j) = beta * C0(i, j)\n"
         "    C(i, j) += alpha * A(i, k) * B(k, j)\n"
         "}",
         (1.5, -0.5, Arr("float32", (4, 6)), Arr("float32", (6, 3)), Arr("float32", (4, 3))),
         lambda al, be, A, B, C0: _f(be * C0.astype(f64) + al * (A.astype(f64) @ B)), 7),
    Case("matvec",
         "def matvec(float(M, K) A, float(K) x) -> (y) { y(i) +=! A(i, k) * x(k) }",
         (Arr("float32", (6, 8)), Arr("float32", (8,))),
         lambda A, x: _f(A.astype(f64) @ x), 8),
    Case("outer",
         "def outer(float(M) a, float(N) b) -> (O) { O(i, j) = a(i) * b(j) }",
         (Arr("float32", (5,)), Arr("float32", (3,))),
         lambda a, b: np.outer(a, b), 1),
    Case("dot_rank0",
         "def dot(float(N) a, float(N) b) -> (s) { s +=! a(r) * b(r) }",
         (Arr("float32", (17,)), Arr("float32", (17,))),
         lambda a, b: _f(np.dot(a.astype(f64), b)), 17),
    Case("reduce_rows",
         "def reduce_rows(float(M, N) A) -> (S, P, Mn, Mx) {\n"
         "    S(i) +=! A(i, j)\n"
         "    P(i) *=! A(i, j)\n"
         "    Mn(i) min=! A(i, j)\n"
         "    Mx(i) max=! A(i, j)\n"
         "}",
         (Arr("float32", (4, 6), 0.5, 1.5),),
         lambda A: (_f(A.astype(f64).sum(1)), _f(A.astype(f64).prod(1)), A.min(1), A.max(1)), 6),
    Case("reduce_all",
         "def reduce_all(float(M, N) A) -> (S, P, Mn, Mx) {\n"
         "    S +=! A(i, j)\n"
         "    P *=! A(i, j)\n"
         "    Mn min=! A(i, j)\n"
         "    Mx max=! A(i, j)\n"
         "}",
         (Arr("float32", (3, 5), 0.5, 1.5),),
         lambda A: (_f(A.astype(f64).sum()), _f(A.astype(f64).prod()), A.min(), A.max()), 15),
    Case("reduce_cols_int",
         "def reduce_int(int32(M, N) A) -> (S, Mn, Mx, Top, Bottom) {\n"
         "    S(i) +=! A(i, j)\n"
         "    Mn(i) min=! A(i, j)\n"
         "    Mx(i) max=! A(i, j)\n"
         "    Top max=! A(i, j)\n"
         "    Bottom min=! A(i, j)\n"
         "}",
         (Arr("int32", (5, 7), -1000, 1000),),
         _int_reductions, 0),
    Case("reduce_after_init",
         "def reduce_after_init(float(M, R) A, float(M) B) -> (O, Mx, Mn, P) {\n"
         "    O(i) = B(i)\n"
         "    O(i) += A(i, r)\n"
         "    Mx(i) = B(i)\n"
         "    Mx(i) max= A(i, r)\n"
         "    Mn(i) = 0.0 where exists B(i)\n"
         "    Mn(i) min= A(i, r)\n"
         "    P(i) = 2.0 where exists B(i)\n"
         "    P(i) *= A(i, r)\n"
         "}",
         (Arr("float32", (4, 5), 0.5, 1.5), Arr("float32", (4,), 0.0, 3.0)),
         lambda A, B: (_f(B.astype(f64) + A.astype(f64).sum(1)), np.maximum(B, A.max(1)),
                       np.minimum(f32(0), A.min(1)), _f(2 * A.astype(f64).prod(1))), 6),
    Case("conv2d_valid",
         "def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
         "    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n"
         "}",
         (Arr("float32", (2, 3, 7, 6)), Arr("float32", (4, 3, 3, 2))),
         lambda I, W: _conv(I, W), 18),
    Case("conv2d_bias",
         "def conv_bias(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) Bias) -> (O) {\n"
         "    O(n, f, h, w) = Bias(f) where n in 0:N, h in 0:H - KH + 1, w in 0:W - KW + 1\n"
         "    O(n, f, h, w) += I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n"
         "}",
         (Arr("float32", (1, 2, 6, 5)), Arr("float32", (3, 2, 2, 3)), Arr("float32", (3,))),
         lambda I, W, b: _f(_conv(I, W).astype(f64) + b[None, :, None, None]), 13),
    Case("conv2d_strided",
         "def conv_s2(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
         "    O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)\n"
         "}",
         (Arr("float32", (2, 2, 9, 8)), Arr("float32", (3, 2, 3, 3))),
         lambda I, W: _conv(I, W, stride=2), 18),
    Case("conv2d_dilated",
         "def conv_d2(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
         "    O(n, f, h, w) +=! I(n, c, h + 2*kh, w + 2*kw) * Wt(f, c, kh, kw)\n"
         "}",
         (Arr("float32", (1, 2, 8, 9)), Arr("float32", (2, 2, 3, 2))),
         lambda I, W: _conv(I, W, dil=2), 12),
    Case("conv2d_group",
         "def group_conv(float(N, G, C, H, W) I, float(G, F, C, KH, KW) Wt) -> (O) {\n"
         "    O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * Wt(g, f, c, kh, kw)\n"
         "}",
         (Arr("float32", (2, 3, 2, 5, 6)), Arr("float32", (3, 4, 2, 2, 3))),
         _group_conv, 12),
    Case("conv2d_depthwise",
         "def depthwise(float(N, C, H, W) I, float(C, KH, KW) Wt) -> (O) {\n"
         "    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * Wt(c, kh, kw)\n"
         "}",
         (Arr("float32", (2, 4, 6, 7)), Arr("float32", (4, 3, 3))),
         _depthwise, 9),
    Case("conv2d_same",
         "def conv_same(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {\n"
         "    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n"
         "}",
         (Arr("float32", (2, 3, 6, 5)), Arr("float32", (2, 3, 3, 3))),
         lambda I, W: _conv(np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))), W), 27),
    Case("maxpool_2x2_s2",
         "def maxpool(float(N, C, H, W) I) -> (O) {\n"
         "    O(n, c, h, w) max=! I(n, c, 2*h + kh, 2*w + kw) where kh in 0:2, kw in 0:2\n"
         "}",
         (Arr("float32", (2, 3, 7, 8)),),
         lambda I: _pool(I, 2, 2, np.max), 0),
    Case("avgpool_3x3_s1",
         "def avgpool(float(N, C, H, W) I) -> (O) {\n"
         "    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) / 9.0 where kh in 0:3, kw in 0:3\n"
         "}",
         (Arr("float32", (1, 2, 6, 5)),),
         lambda I: _pool(I, 3, 1, np.mean), 9),
    Case("softmax",
         "def softmax(float(N, D) X) -> (Y) {\n"
         "    mx(n) max=! X(n, d)\n"
         "    e(n, d) = exp(X(n, d) - mx(n))\n"
         "    s(n) +=! e(n, d)\n"
         "    Y(n, d) = e(n, d) / s(n)\n"
         "}",
         (Arr("float32", (4, 10), -5.0, 5.0),),
         _softmax, 10),
    Case("layernorm",
         "def layernorm(float(N, D) X, float(D) G, float(D) Bt) -> (Y) {\n"
         "    mean(n) +=! X(n, d) / D\n"
         "    xc(n, d) = X(n, d) - mean(n)\n"
         "    var(n) +=! xc(n, d) * xc(n, d) / D\n"
         "    Y(n, d) = xc(n, d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)\n"
         "}",
         (Arr("float32", (3, 16), -2.0, 2.0), Arr("float32", (16,)), Arr("float32", (16,))),
         _layernorm, 16),
    Case("batchnorm",
         "def batchnorm(float(N, C, H, W) X, float(C) G, float(C) Bt) -> (Y) {\n"
         "    mean(c) +=! X(n, c, h, w)\n"
         "    mean(c) = mean(c) / (N * H * W)\n"
         "    var(c) +=! (X(n, c, h, w) - mean(c)) * (X(n, c, h, w) - mean(c))\n"
         "    Y(n, c, h, w) = (X(n, c, h, w) - mean(c)) * rsqrt(var(c) / float(N * H * W) + 1e-5) * G(c) + Bt(c)\n"
         "}",
         (Arr("float32", (2, 3, 4, 5), -2.0, 2.0), Arr("float32", (3,)), Arr("float32", (3,))),
         _batchnorm, 40),
    Case("elementwise_math",
         "def ew(float(N) A, float(N) B, float(N) C)\n"
         "        -> (Relu, Sig, Th, Er, Ab, Fa, Pw, At, Fm, Fmn, Fmx, MnMx, Esl) {\n"
         "    Relu(i) = fmax(A(i), 0.0)\n"
         "    Sig(i) = sigmoid(A(i))\n"
         "    Th(i) = tanh(A(i))\n"
         "    Er(i) = erf(A(i))\n"
         "    Ab(i) = abs(A(i))\n"
         "    Fa(i) = fabs(B(i))\n"
         "    Pw(i) = pow(C(i), A(i))\n"
         "    At(i) = atan2(A(i), B(i))\n"
         "    Fm(i) = fma(A(i), B(i), C(i))\n"
         "    Fmn(i) = fmin(A(i), B(i))\n"
         "    Fmx(i) = fmax(A(i), B(i))\n"
         "    MnMx(i) = min(A(i), B(i)) + max(A(i), C(i))\n"
         "    Esl(i) = exp(A(i)) + sqrt(C(i)) + log(C(i))\n"
         "}",
         (Arr("float32", (40,), -4.0, 4.0), Arr("float32", (40,), -3.0, 3.0), Arr("float32", (40,), 0.1, 3.0)),
         _elementwise, 3),
    Case("round_half_away",
         "def rnd(float(N) A) -> (R, Fl, Ce, Tr) {\n"
         "    R(i) = round(A(i))\n"
         "    Fl(i) = floor(A(i))\n"
         "    Ce(i) = ceil(A(i))\n"
         "    Tr(i) = trunc(A(i))\n"
         "}",
         (ROUND_DATA,),
         lambda A: (_round_half_away(A), np.floor(A), np.ceil(A), np.trunc(A)), 0),
    Case("ternary_logic",
         "def tern(float(N) A, float(N) B) -> (T, L, Nt) {\n"
         "    T(i) = A(i) > B(i) ? A(i) - B(i) : 0.0\n"
         "    L(i) = (A(i) > 0.0 && B(i) > 0.0) || A(i) < -0.5 ? 1 : 2\n"
         "    Nt(i) = !(A(i) >= B(i)) ? A(i) : -B(i)\n"
         "}",
         (Arr("float32", (30,)), Arr("float32", (30,))),
         lambda A, B: (np.where(A > B, A - B, f32(0)),
                       np.where(((A > 0) & (B > 0)) | (A < -0.5), 1, 2).astype(np.int32),
                       np.where(~(A >= B), A, -B)), 0),
    Case("casts",
         "def casts(float(N) A, int32(N) K) -> (Ti, Kf, Dd, Fd, Li) {\n"
         "    Ti(i) = int32(A(i))\n"
         "    Kf(i) = float(K(i)) / 2.0\n"
         "    Dd(i) = double(A(i)) * 2.0\n"
         "    Fd(i) = int32(A(i) * 10.0) / 3\n"
         "    Li(i) = int64(A(i)) + 1\n"
         "}",
         (Arr("float32", (25,), -6.0, 6.0), Arr("int32", (25,), -9, 9)),
         _casts, 0),
    Case("int_floor_div_mod",
         "def floordiv(int32(N) A, int32(N) B) -> (Q, R, Q3, R3, Qm3, Rm3, Q2) {\n"
         "    Q(i) = A(i) / B(i)\n"
         "    R(i) = A(i) % B(i)\n"
         "    Q3(i) = A(i) / 3\n"
         "    R3(i) = A(i) % 3\n"
         "    Qm3(i) = A(i) / -3\n"
         "    Rm3(i) = A(i) % -3\n"
         "    Q2(i) = -A(i) / 2\n"
         "}",
         (NUMER, NONZERO),
         _floor_ops, 0),
    Case("float_mod_is_fmod",
         "def fmod_(float(N) A, float(N) B) -> (O, F) {\n"
         "    O(i) = A(i) % B(i)\n"
         "    F(i) = fmod(A(i), B(i))\n"
         "}",
         (FMOD_A, FMOD_B),
         lambda A, B: (np.fmod(A, B), np.fmod(A, B)), 0),
    Case("dtype_promotion",
         "def promo(int32(N) I, uint8(N) U, int8(N) S, int64(N) L, double(N) D, float16(N) H, bool(N) Bo,\n"
         "          float(N) A) -> (F, US, LL, DD, HH, HF, Sel, BB, Cmp, SS, Um) {\n"
         "    F(i) = I(i) * 2.5\n"
         "    US(i) = U(i) + S(i)\n"
         "    LL(i) = L(i) * 3 + I(i)\n"
         "    DD(i) = D(i) * A(i) + I(i)\n"
         "    HH(i) = H(i) * H(i)\n"
         "    HF(i) = H(i) * H(i) + A(i)\n"
         "    Sel(i) = Bo(i) ? A(i) : -A(i)\n"
         "    BB(i) = Bo(i) + Bo(i)\n"
         "    Cmp(i) = A(i) > 0.0\n"
         "    SS(i) = S(i) * S(i)\n"
         "    Um(i) = U(i) - 1\n"
         "}",
         (Arr("int32", (12,), -50, 50), Arr("uint8", (12,), 0, 256), Arr("int8", (12,), -128, 128),
          Arr("int64", (12,), -(1 << 40), 1 << 40), Arr("float64", (12,)), Arr("float16", (12,), -4.0, 4.0),
          Arr("bool", (12,)), Arr("float32", (12,))),
         _promotion, 2),
    Case("scalar_param",
         "def axpy(float alpha, float(N) X, float(N) Y) -> (Z) { Z(i) = alpha * X(i) + Y(i) }",
         (0.75, Arr("float32", (9,)), Arr("float32", (9,))),
         lambda a, X, Y: f32(a) * X + Y, 2),
    Case("sizes_as_values",
         "def sizes(float(N) A, float(M) B) -> (O, P) {\n"
         "    O(i) = A(i) * N\n"
         "    P(i, j) = i * M + j + N where exists A(i), exists B(j)\n"
         "}",
         (Arr("float32", (5,)), Arr("float32", (3,))),
         lambda A, B: (A * f32(5), (np.arange(15, dtype=np.int32) + 5).reshape(5, 3)), 0),
    Case("literal_dims",
         "def lit(float(3, N) A, float(N, 2) B) -> (O, T) {\n"
         "    O(n) +=! A(r, n)\n"
         "    T(i, j) +=! A(i, k) * B(k, j)\n"
         "}",
         (Arr("float32", (3, 6)), Arr("float32", (6, 2))),
         lambda A, B: (_f(A.astype(f64).sum(0)), _f(A.astype(f64) @ B)), 6),
    Case("affine_subscripts",
         "def affine(float(N) A) -> (Rev, Sub, Up, Diff) {\n"
         "    Rev(i) = A(N - 1 - i)\n"
         "    Sub(i) = A(2*i)\n"
         "    Up(i) = A(i / 2)\n"
         "    Diff(i) = A(i + 1) - A(i)\n"
         "}",
         (Arr("float32", (7,)),),
         lambda A: (A[::-1].copy(), A[::2].copy(), np.repeat(A, 2), A[1:] - A[:-1]), 0),
    Case("modulo_subscript",
         "def tile3(float(3) A, float(N) B) -> (O) { O(i) = A(i % 3) * B(i) where i in 0:N }",
         (Arr("float32", (3,)), Arr("float32", (10,))),
         lambda A, B: np.tile(A, 4)[:10] * B, 0),
    Case("where_let",
         "def let(float(N) A) -> (O) { O(i) = s * s + s where s = A(i) * 2.0 }",
         (Arr("float32", (11,)),),
         lambda A: (A * f32(2)) * (A * f32(2)) + A * f32(2), 2),
    Case("where_exists",
         "def ex(float(N) A) -> (Ones, Head) {\n"
         "    Ones(i) = 1.0 where exists A(i)\n"
         "    Head(i) = A(i) where exists A(i + 2)\n"
         "}",
         (Arr("float32", (6,)),),
         lambda A: (np.ones(6, f32), A[:-2].copy()), 0),
    Case("embedding",
         "def embed(float(V, D) Tab, int32(B) Idx) -> (O) { O(b, d) = Tab(Idx(b), d) }",
         (Arr("float32", (10, 4)), Arr("int32", (7,), 0, 10)),
         lambda T, I: T[I], 0),
    Case("embedding_bag",
         "def bag(float(V, D) Tab, int64(B, L) Idx) -> (O) { O(b, d) +=! Tab(Idx(b, r_l), d) }",
         (Arr("float32", (10, 4)), Arr("int64", (3, 5), 0, 10)),
         lambda T, I: _f(T.astype(f64)[I].sum(1)), 5),
    Case("gather_of_gather",
         "def gg(float(N) A, int32(P) Pm, int32(Q) Qi) -> (O) { O(i) = A(Pm(Qi(i))) }",
         (Arr("float32", (9,)), Arr("int32", (6,), 0, 9), Arr("int32", (8,), 0, 6)),
         lambda A, P, Q: A[P[Q]], 0),
    Case("gather_in_let",
         "def gl(float(V, D) Tab, int32(B) Idx) -> (O) { O(b, d) = v * v - v where v = Tab(Idx(b), d) }",
         (Arr("float32", (8, 3)), Arr("int32", (5,), 0, 8)),
         lambda T, I: T[I] * T[I] - T[I], 2),
    Case("stack_concat",
         "def cat(float(N) A, float(N) B) -> (S, C) {\n"
         "    S(s, i) = s == 0 ? A(i) : B(i) where s in 0:2\n"
         "    C(i) = i < N ? A(i) : B(i - N) where i in 0:2*N\n"
         "}",
         (Arr("float32", (5,)), Arr("float32", (5,))),
         _stack_concat, 0),
    Case("concat_cols",
         "def catc(float(R, N) A, float(R, M) B) -> (O) {\n"
         "    O(r, j) = j < N ? A(r, j) : B(r, j - N) where j in 0:N + M\n"
         "}",
         (Arr("float32", (3, 2)), Arr("float32", (3, 4))),
         lambda A, B: np.concatenate([A, B], axis=1), 0),
    Case("temporaries_chain",
         "def chain(float(N) A) -> (O) {\n"
         "    t1(i) = A(i) * 2.0\n"
         "    t2(i) = t1(i) + 1.0\n"
         "    t3(i) = exp(t2(i))\n"
         "    O(i) = t3(i) - t1(i)\n"
         "}",
         (Arr("float32", (13,)),),
         lambda A: _f(np.exp(A.astype(f64) * 2 + 1) - A.astype(f64) * 2), 2),
    Case("three_outputs_decl_order",
         "def three(float(N) A) -> (Z, X, Y) {\n"
         "    X(i) = A(i) + 1.0\n"
         "    Y(i) = X(i) * 2.0\n"
         "    Z +=! Y(i)\n"
         "}",
         (Arr("float32", (6,)),),
         lambda A: (_f(((A.astype(f64) + 1) * 2).sum()), A + f32(1), (A + f32(1)) * f32(2)), 6),
    Case("transposes",
         "def tr(float(M, N) A, float(B, C, H, W) I) -> (T, O) {\n"
         "    T(j, i) = A(i, j)\n"
         "    O(n, h, w, c) = I(n, c, h, w)\n"
         "}",
         (Arr("float32", (3, 5)), Arr("float32", (2, 3, 4, 5))),
         lambda A, I: (A.T.copy(), I.transpose(0, 2, 3, 1).copy()), 0),
    Case("diagonal_trace",
         "def diag(float(N, N) A) -> (Tr, D) {\n"
         "    Tr +=! A(i, i)\n"
         "    D(i) = A(i, i)\n"
         "}",
         (Arr("float32", (5, 5)),),
         lambda A: (_f(np.trace(A.astype(f64))), np.diag(A).copy()), 5),
    Case("tril_mask",
         "def tril(float(N, N) A) -> (L) { L(i, j) = j <= i ? A(i, j) : 0.0 }",
         (Arr("float32", (4, 4)),),
         lambda A: np.tril(A), 0),
    Case("conv1d_padded_sum_prod_max",
         "def c1(float(N) A, float(3) K) -> (S, P, M) {\n"
         "    S(h) +=! A(h + k - 1) * K(k) where h in 0:N\n"
         "    P(h) *=! A(h + k - 1) where h in 0:N, k in 0:3\n"
         "    M(h) max=! A(2*h + k - 1) where h in 0:(N + 1) / 2, k in 0:3\n"
         "}",
         (Arr("float32", (7,), 0.5, 2.0), Arr("float32", (3,))),
         lambda A, K: (_f(sum(np.pad(A.astype(f64), 1)[k:k + 7] * K[k] for k in range(3))),
                       _f(np.prod([np.pad(A.astype(f64), 1, constant_values=1)[k:k + 7] for k in range(3)], axis=0)),
                       np.max([np.pad(A, 1, constant_values=-np.inf)[k:k + 7:2] for k in range(3)], axis=0)), 3),
    Case("reduction_subranges",
         "def sub(float(M, K) A) -> (Tail, Padded) {\n"
         "    Tail(i) +=! A(i, k) where k in 1:K\n"
         "    Padded(i) +=! A(i, k) where k in 0:K + 2\n"
         "}",
         (Arr("float32", (3, 5)),),
         lambda A: (_f(A[:, 1:].astype(f64).sum(1)), _f(A.astype(f64).sum(1))), 7),
    Case("floor_subscripts",
         "def fs(float(N) A) -> (Dv, Md, Ix) {\n"
         "    Dv(i) = A((i - 3) / 2 + 2) where i in 0:6\n"
         "    Md(i) = A((i - 4) % 3) where i in 0:6\n"
         "    Ix(i) = i / 2 - i % 2 + (i - 5) / 2 + (i - 5) % 3 where exists A(i)\n"
         "}",
         (Arr("float32", (5,)),),
         lambda A: (A[(np.arange(6) - 3) // 2 + 2], A[(np.arange(6) - 4) % 3],
                    (lambda i: i // 2 - i % 2 + (i - 5) // 2 + (i - 5) % 3)(np.arange(5, dtype=np.int32))), 0),
    Case("contraction_odd_views",
         "def odd(float(N, K) A, float(K) B, float alpha) -> (Rev, Up, Conv) {\n"
         "    Rev(i) +=! A(N - 1 - i, k) * B(k)\n"
         "    Up(i) +=! alpha * A(i / 2, k) * B(k) where i in 0:2*N\n"
         "    Conv(i) +=! A(i + k, 0) * B(k)\n"
         "}",
         (Arr("float32", (6, 3)), Arr("float32", (3,)), -1.5),
         lambda A, B, al: (_f(A[::-1].astype(f64) @ B), _f(al * np.repeat(A.astype(f64) @ B, 2)),
                           _f(np.array([A[i:i + 3, 0].astype(f64) @ B for i in range(4)]))), 3),
    Case("let_in_reduction",
         "def lr(float(M, K) A) -> (S) { S(i) +=! v * v where v = A(i, k) - 0.5 }",
         (Arr("float32", (3, 7)),),
         lambda A: _f(((A.astype(f64) - 0.5) ** 2).sum(1)), 7),
    Case("bool_uint8_reductions",
         "def br(bool(M, N) Bo, uint8(M, N) U) -> (Any, All, Mn, P, Cnt) {\n"
         "    Any(i) max=! Bo(i, j)\n"
         "    All(i) min=! Bo(i, j)\n"
         "    Mn(i) min=! U(i, j)\n"
         "    P(i) *=! U(i, j)\n"
         "    Cnt(i) +=! Bo(i, j) ? 1 : 0\n"
         "}",
         (Arr("bool", (6, 3)), Arr("uint8", (6, 3), 0, 256)),
         lambda Bo, U: (Bo.any(1), Bo.all(1), U.min(1), U.prod(1, dtype=np.uint8),
                        Bo.sum(1, dtype=np.int32)), 0),
    Case("mixed_typing",
         "def mt(uint8(N) U, float(N) A, int32(N) K) -> (Neg, Mix, Cmp, NotF, Ab) {\n"
         "    Neg(i) = -U(i)\n"
         "    Mix(i) = K(i) > 0 ? 1 : 2.5\n"
         "    Cmp(i) = K(i) < 0.5\n"
         "    NotF(i) = !A(i)\n"
         "    Ab(i) = abs(K(i)) + min(K(i), 1)\n"
         "}",
         (Arr("uint8", (9,), 0, 256), np.array([0, 2, -1, 0, 0.5, -3, 0, 1, 0], np.float32),
          Arr("int32", (9,), -3, 3)),
         lambda U, A, K: (-U.astype(np.int32), np.where(K > 0, f32(1), f32(2.5)), K < 0.5, A == 0,
                          np.abs(K) + np.minimum(K, 1)), 0),
    Case("typed_output_partial_write",
         "def tp(float(N) A) -> (float(N) O, double(N) D) {\n"
         "    O(i) = A(i) + 1.0 where i in 0:2\n"
         "    D(i) = A(i)\n"
         "    D(i) = D(i) * 2.0 + 1.0\n"
         "}",
         (Arr("float32", (5,)),),
         lambda A: (np.concatenate([A[:2] + f32(1), np.zeros(3, f32)]), A.astype(f64) * 2 + 1), 0),
]
