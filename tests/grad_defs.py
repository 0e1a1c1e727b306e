"""Corpus of differentiable TC defs (float64) for the gradient tests, with tiny input shapes.

Each ``GradCase`` is ``(name, source, inputs)``; an input is a shape (random float64 uniform in
``[lo, hi)`` of the case) or a fixed integer ``np.ndarray`` (gather indices). Nothing here imports
tcdsl or torch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class GradCase(NamedTuple):
    name: str
    source: str
    inputs: tuple[Any, ...]
    lo: float = -1.0
    hi: float = 1.0


def make(case: GradCase, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in case.inputs:
        if isinstance(spec, np.ndarray):
            out.append(spec.copy())
        else:
            out.append(np.asarray(rng.random(spec) * (case.hi - case.lo) + case.lo))
    return out


CASES: list[GradCase] = [
    GradCase("matmul", "def matmul(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
             ((3, 4), (4, 2))),
    GradCase("tmm", "def tmm(double(M, K) A, double(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
             ((3, 4), (2, 4))),
    GradCase("bmm", "def bmm(double(B, M, K) X, double(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }",
             ((2, 3, 2), (2, 2, 3))),
    GradCase("conv2d",
             "def conv2d(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n"
             "}",
             ((1, 2, 4, 5), (2, 2, 2, 3))),
    GradCase("strided_conv",
             "def conv_s2(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)\n"
             "}",
             ((1, 2, 5, 6), (2, 2, 2, 3))),
    GradCase("strided_padded_conv",  # its input gradient's phases read the window's taps at (p + 1) % 2
             "def conv_s2_p1(double(N, C, H, W) I, double(F, C, 3, 3) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(f, c, kh, kw)"
             " where h in 0:(H + 1) / 2, w in 0:(W + 1) / 2\n"
             "}",
             ((1, 2, 6, 7), (2, 2, 3, 3))),
    GradCase("strided_padded_conv_fixed",  # fixed sizes: its weight gradient reads one split, zero-padded copy
             "def conv_s2_fixed(double(1, 2, 6, 6) I, double(2, 2, 3, 3) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(f, c, kh, kw) where h in 0:3, w in 0:3\n"
             "}",
             ((1, 2, 6, 6), (2, 2, 3, 3))),
    GradCase("strided_conv_rows",  # a stride along the rows only: phases of the rows, the columns as they are
             "def conv_s21(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, 2*h + kh, w + kw) * Wt(f, c, kh, kw)\n"
             "}",
             ((1, 2, 7, 5), (2, 2, 3, 2))),
    GradCase("strided_conv1d",  # stride 3 under a window of 5: three phases, a window of two taps each
             "def conv1d_s3(double(N, C, L) I, double(F, C, K) Wt) -> (O) {\n"
             "    O(n, f, l) +=! I(n, c, 3*l + k) * Wt(f, c, k)\n"
             "}",
             ((2, 2, 11), (2, 2, 5))),
    GradCase("stride3_padded_conv",  # a window of unknown width, stride 3: a split piece's schedule is quasi-affine
             "def conv_s3(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, 3*h + kh - 1, 3*w + kw - 1) * Wt(f, c, kh, kw) where h in 0:3, w in 0:3\n"
             "}",
             ((1, 2, 8, 9), (2, 2, 2, 2))),
    GradCase("dilated_conv",
             "def conv_d2(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, h + 2*kh, w + 2*kw) * Wt(f, c, kh, kw)\n"
             "}",
             ((1, 1, 5, 5), (2, 1, 2, 2))),
    GradCase("padded_conv",
             "def conv_same(double(N, C, H, W) I, double(F, C, 3, 3) Wt, double(F) Bias) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n"
             "    O(n, f, h, w) = O(n, f, h, w) + Bias(f)\n"
             "}",
             ((1, 2, 4, 3), (2, 2, 3, 3), (2,))),
    GradCase("padded_conv_any_window",  # a window of unknown size: the weight gradient's copy is padded to its reach
             "def conv_pw(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n"
             "}",
             ((1, 2, 5, 4), (2, 2, 3, 2))),
    GradCase("conv_bias_relu_in_place",
             "def cbr(double(N, C, H, W) I, double(F, C, KH, KW) Wt, double(F) B) -> (O) {\n"
             "    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n"
             "    O(n, f, h, w) = O(n, f, h, w) + B(f)\n"
             "    O(n, f, h, w) = fmax(O(n, f, h, w), 0.0)\n"
             "}",
             ((1, 2, 4, 4), (2, 2, 2, 2), (2,))),
    GradCase("group_conv",
             "def group_conv(double(N, G, C, H, W) I, double(G, F, C, KH, KW) Wt) -> (O) {\n"
             "    O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * Wt(g, f, c, kh, kw)\n"
             "}",
             ((1, 2, 2, 4, 3), (2, 2, 2, 2, 2))),
    GradCase("maxpool",
             "def maxpool(double(N, C, H, W) I) -> (O) {\n"
             "    O(n, c, h, w) max=! I(n, c, 2*h + kh, 2*w + kw) where kh in 0:2, kw in 0:2\n"
             "}",
             ((1, 2, 5, 4),)),
    GradCase("dilated_maxpool",  # its backward's schedule has a member with a rational coefficient
             "def maxpool_d2(double(N, C, H, W) I) -> (O) {\n"
             "    O(n, c, h, w) max=! I(n, c, h + 2*kh, w + 2*kw) where kh in 0:3, kw in 0:3\n"
             "}",
             ((1, 2, 5, 6),)),
    GradCase("overlapping_pool",  # a window wider than its stride: a divisibility test per point
             "def pool3s2(double(N, C, H, W) I) -> (O) {\n"
             "    O(n, c, h, w) max=! I(n, c, 2*h + kh, 2*w + kw) where kh in 0:3, kw in 0:3\n"
             "}",
             ((1, 2, 7, 6),)),
    GradCase("gapped_pool",  # a window narrower than its stride: the points between windows get 0
             "def pool2s3(double(N, C, H, W) I) -> (O) {\n"
             "    O(n, c, h, w) +=! I(n, c, 3*h + kh + 1, 3*w + kw) * I(n, c, 3*h + kh + 1, 3*w + kw) "
             "where kh in 0:2, kw in 0:2\n"
             "}",
             ((1, 2, 8, 7),)),
    GradCase("avgpool",
             "def avgpool(double(N, C, H, W) I) -> (O) {\n"
             "    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) / 9.0 where kh in 0:3, kw in 0:3\n"
             "}",
             ((1, 2, 4, 5),)),
    GradCase("softmax",
             "def softmax(double(N, D) X) -> (Y) {\n"
             "    mx(n) max=! X(n, d)\n"
             "    e(n, d) = exp(X(n, d) - mx(n))\n"
             "    s(n) +=! e(n, d)\n"
             "    Y(n, d) = e(n, d) / s(n)\n"
             "}",
             ((3, 5),)),
    GradCase("log_softmax",  # the max shifts nothing the outputs see: no gradient flows through it
             "def log_softmax(double(N, D) X) -> (Y) {\n"
             "    mx(n) max=! X(n, d)\n"
             "    s(n) +=! exp(X(n, d) - mx(n))\n"
             "    Y(n, d) = X(n, d) - mx(n) - log(s(n))\n"
             "}",
             ((3, 5),)),
    GradCase("unnormalized_exp",  # the max's shift shows in the output: its gradient flows
             "def unnormalized(double(N, D) X) -> (Y) {\n"
             "    mx(n) max=! X(n, d)\n"
             "    Y(n, d) = exp(X(n, d) - mx(n)) * 2.0\n"
             "}",
             ((3, 5),)),
    GradCase("column_normalized",  # each row's max shifted, the columns normalised: not invariant
             "def colnorm(double(N, D) X) -> (Y) {\n"
             "    mx(n) max=! X(n, d)\n"
             "    e(n, d) = exp(X(n, d) - mx(n))\n"
             "    t(d) +=! e(n, d)\n"
             "    Y(n, d) = e(n, d) / t(d)\n"
             "}",
             ((3, 5),)),
    GradCase("layernorm",
             "def layernorm(double(N, D) X, double(D) G, double(D) Bt) -> (Y) {\n"
             "    mean(n) +=! X(n, d) / D\n"
             "    xc(n, d) = X(n, d) - mean(n)\n"
             "    var(n) +=! xc(n, d) * xc(n, d) / D\n"
             "    Y(n, d) = xc(n, d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)\n"
             "}",
             ((3, 5), (5,), (5,))),
    GradCase("batchnorm",
             "def batchnorm(double(N, C, H, W) X, double(C) G, double(C) Bt) -> (Y) {\n"
             "    mean(c) +=! X(n, c, h, w)\n"
             "    mean(c) = mean(c) / (N * H * W)\n"
             "    var(c) +=! (X(n, c, h, w) - mean(c)) * (X(n, c, h, w) - mean(c))\n"
             "    Y(n, c, h, w) = (X(n, c, h, w) - mean(c)) * rsqrt(var(c) / double(N * H * W) + 1e-5) * G(c)"
             " + Bt(c)\n"
             "}",
             ((2, 2, 2, 3), (2,), (2,))),
    GradCase("mlp",
             "def mlp(double(B, K) X, double(H, K) W1, double(H) B1, double(O, H) W2, double(O) B2) -> (Y) {\n"
             "    Hd(b, h) +=! X(b, k) * W1(h, k)\n"
             "    A(b, h) = fmax(Hd(b, h) + B1(h), 0.0)\n"
             "    Y(b, o) +=! A(b, h) * W2(o, h)\n"
             "    Y(b, o) = Y(b, o) + B2(o)\n"
             "}",
             ((3, 4), (5, 4), (5,), (2, 5), (2,))),
    GradCase("kru3",
             "def kru3(double(D0, N0) W0, double(D1, N1) W1, double(D2, N2) W2, double(M, N0, N1, N2) X)"
             " -> (Y) {\n"
             "    XW2(m, n0, n1, d2) +=! X(m, n0, n1, n2) * W2(d2, n2)\n"
             "    XW1(m, n0, d1, d2) +=! XW2(m, n0, n1, d2) * W1(d1, n1)\n"
             "    Y(m, d0, d1, d2) +=! XW1(m, n0, d1, d2) * W0(d0, n0)\n"
             "}",
             ((2, 3), (2, 2), (3, 2), (2, 3, 2, 2))),
    GradCase("tensordot", "def td(double(A, B, C) X, double(C, B, D) Y) -> (Z) { Z(a, d) +=! X(a, b, c) * Y(c, b, d) }",
             ((2, 3, 2), (2, 3, 3))),
    GradCase("elementwise",
             "def ew(double(N) A, double(N) B, double(N) C) -> (O, P) {\n"
             "    T1(i) = sigmoid(A(i)) * tanh(B(i)) + exp(C(i)) - log(C(i)) + sqrt(C(i))\n"
             "    T2(i) = erf(A(i)) + pow(C(i), B(i)) + atan2(A(i), B(i)) + fma(A(i), B(i), C(i)) + abs(A(i))\n"
             "    O(i) = T1(i) * T2(i) / (1.0 + C(i) * C(i)) + fmin(A(i), B(i)) + (A(i) > B(i) ? A(i) * B(i) : -C(i))\n"
             "    P(i) = rsqrt(C(i)) + log1p(C(i)) + expm1(A(i)) + cbrt(C(i)) + sin(A(i)) * cos(B(i))"
             " + max(A(i), C(i))\n"
             "}",
             ((6,), (6,), (6,)), 0.2, 1.5),
    GradCase("gather",
             "def embed_bag(double(V, D) Tab, int32(B, L) Idx, double(B, L) Wt) -> (O) {\n"
             "    O(b, d) +=! Tab(Idx(b, l), d) * Wt(b, l)\n"
             "}",
             ((5, 3), np.array([[0, 2, 2], [4, 0, 1]], dtype=np.int32), (2, 3))),
    GradCase("gemm_scalars",
             "def gemm(double alpha, double beta, double(M, K) A, double(K, N) B, double(M, N) C0) -> (C) {\n"
             "    C(i, j) = beta * C0(i, j)\n"
             "    C(i, j) += alpha * A(i, k) * B(k, j)\n"
             "}",
             ((), (), (3, 2), (2, 3), (3, 3))),
    GradCase("shifts_and_diagonal",
             "def shifts(double(N, N) A, double(N) x) -> (O, Q, U) {\n"
             "    O(i) = A(i, i) * x(i)\n"
             "    Q(i) +=! x(i + j) * A(j, i) where j in 0:2\n"
             "    U(i) = x(i / 2) * x(N - 1 - i / 2) where i in 0:2*N\n"
             "}",
             ((4, 4), (4,))),
    GradCase("conditional_reads_and_updates",
             "def misc(double(N) A, double(N) B, double(3) T) -> (O, P, Q) {\n"
             "    O(i) = A(i) > 0.0 ? B(i + 1) : A(i) * A(i) where i in 0:N - 1\n"
             "    P(i) = O(i) * T(i % 3) where i in 0:N - 1\n"
             "    P(i) *= exp(O(i)) where exists A(i + 2)\n"
             "    Q(i) +=! s * B(N - 1 - i - k) where s = A(i + k) * 2.0, k in 0:2\n"
             "}",
             ((7,), (7,), (3,))),
    GradCase("min_max_after_init",
             "def mm_init(double(M, R) A, double(M) B) -> (Mx, Mn) {\n"
             "    Mx(i) = B(i)\n"
             "    Mx(i) max= A(i, r)\n"
             "    Mn(i) = double(0.0) where exists B(i)\n"
             "    Mn(i) min= A(i, r)\n"
             "}",
             ((3, 4), (3,))),
]
