"""The whole C pipeline on layer-shaped defs at sizes drawn at random (seeded): matmuls in every
operand order, batched, a fully connected layer, convolutions (plain, padded, strided, grouped),
pooling, row and column reductions, softmax, layernorm and a pointwise chain, each forward and
its derived backward def, float32 and float64, under the default options and options drawn from
the tuner's space, on every vector width this machine runs (AVX-512 and AVX2 on an AVX-512
machine), against the reference interpreter.

The sizes favour the edges of the register and vector tiles: 1, a vector and one either side of
it, primes. A wrong subscript, a tile cut short in the wrong place or a dropped remainder moves a
result by about its own magnitude; rounding moves it by at most ``terms`` roundings of the
largest magnitude in play (``_allowance``), far less at these sizes. ``-m slow`` draws more sizes.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.core.instance import bind_sizes, instantiate
from tcdsl.options import MappingOptions
from tcdsl.training import backward_arguments, training_kernels
from tcdsl.tuner import space as S

try:
    from targets import runnable_of
except ImportError:  # run from another directory
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from targets import runnable_of

pytestmark = pytest.mark.cpu

# name -> (def, the inputs' dims by size name); ``KH``/``KW`` are window sizes, ``G``/``Z`` batches
LAYERS = {
    "mm": ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }", "A:M,K B:K,N"),
    "mm_abt": ("def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,r_k) * B(n,r_k) }", "A:M,K B:N,K"),
    "mm_atb": ("def f(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(r_k,m) * B(r_k,n) }", "A:K,M B:K,N"),
    "mm_atbt": ("def f(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(r_k,m) * B(n,r_k) }", "A:K,M B:N,K"),
    "bmm_abt": ("def f(float(Z,M,K) A, float(Z,N,K) B) -> (C) { C(z,m,n) +=! A(z,m,r_k) * B(z,n,r_k) }",
                "A:Z,M,K B:Z,N,K"),
    "fc_relu": ("def f(float(B,M) I, float(N,M) W, float(N) Bs) -> (O) {\n"
                "  O(b,n) +=! I(b,r_m) * W(n,r_m)\n  O(b,n) = fmax(O(b,n) + Bs(n), 0.0)\n}", "I:B,M W:N,M Bs:N"),
    "conv": ("def f(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
             "  O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)\n}", "I:N,C,H,W W1:F,C,KH,KW"),
    "conv_padded": ("def f(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
                    "  O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw)"
                    " where h in 0:H, w in 0:W\n}",
                    "I:N,C,H,W W1:F,C,KH,KW"),
    "conv_strided": ("def f(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
                     "  O(n,f,h,w) +=! I(n,r_c,2*h + r_kh,2*w + r_kw) * W1(f,r_c,r_kh,r_kw)"
                     " where h in 0:(H-KH)/2+1, w in 0:(W-KW)/2+1\n}", "I:N,C,H,W W1:F,C,KH,KW"),
    "group_conv": ("def f(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {\n"
                   "  O(n,g,f,h,w) +=! I(n,g,r_c,h + r_kh,w + r_kw) * W1(g,f,r_c,r_kh,r_kw)\n}",
                   "I:N,G,C,H,W W1:G,F,C,KH,KW"),
    "maxpool": ("def f(float(N,C,H,W) I) -> (O) {\n  O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw)"
                " where h in 0:H/2, w in 0:W/2, r_kh in 0:2, r_kw in 0:2\n}", "I:N,C,H,W"),
    "row_min_col_sum": ("def f(float(N,D) X) -> (Y, S) {\n  Y(n) min=! X(n,r_d)\n  S(d) +=! X(r_n,d)\n}", "X:N,D"),
    "softmax": ("def f(float(N,D) X) -> (Y) {\n  mx(n) max=! X(n,r_d)\n  e(n,d) = exp(X(n,d) - mx(n))\n"
                "  s(n) +=! e(n,r_d)\n  Y(n,d) = e(n,d) / s(n)\n}", "X:N,D"),
    "layernorm": ("def f(float(N,D) X, float(D) G, float(D) Bt) -> (Y) {\n  mean(n) +=! X(n,d) / D\n"
                  "  xc(n,d) = X(n,d) - mean(n)\n  var(n) +=! xc(n,d) * xc(n,d) / D\n"
                  "  Y(n,d) = xc(n,d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)\n}", "X:N,D G:D Bt:D"),
    "tanh_fma": ("def f(float(N) A, float(N) B, float(N) C) -> (Y) { Y(i) = tanh(A(i) * B(i) + C(i)) }",
                 "A:N B:N C:N"),
}
EDGES = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 24, 31, 33, 40, 47, 65)  # around 8- and 16-lane vectors
CHANNELS = (1, 3, 8, 16, 17, 24)
IMAGE = (3, 5, 9, 14, 16, 23)
DRAWS, SLOW_DRAWS = 1, 8  # size draws per layer, ISA and dtype


def _sizes(rng: random.Random, name: str) -> dict[str, int]:
    _, dims = LAYERS[name]
    sizes: dict[str, int] = {}
    for part in dims.split():
        for d in part.split(":")[1].split(","):
            if d in sizes:
                continue
            if d in ("KH", "KW"):
                sizes[d] = rng.choice((1, 2, 3, 5))
            elif d in ("Z", "G") or (d == "N" and "H" in dims):
                sizes[d] = rng.choice((1, 2, 3))
            elif d in ("C", "F") and "KH" in dims:
                sizes[d] = rng.choice(CHANNELS)
            elif d in ("H", "W"):
                sizes[d] = rng.choice(IMAGE)
            else:
                sizes[d] = rng.choice(EDGES)
    for d, k in (("H", "KH"), ("W", "KW")):  # a window that fits the image; pooling's 2x2 too
        if d in sizes:
            sizes[d] = max(sizes[d], sizes.get(k, 2))
    return sizes


def _allowance(kernel: tc.Kernel, args: list[np.ndarray], want: tuple[np.ndarray, ...], dtype: str) -> float:
    """``4 eps`` times the terms of the def's reductions (each statement's, summed: the backward's
    chain through them) times the largest magnitude in play: the results', and the def evaluated
    on |inputs| (a sum of products' sum of |terms|)."""
    inst = instantiate(kernel.checked, bind_sizes(kernel.checked, [a.shape for a in args]))
    terms = sum(math.prod(max(hi - lo, 1) for name, lo, hi in st.ranges if name in s.reductions) if s.reductions
                else 1 for st, s in zip(inst.stmts, kernel.checked.stmts))
    with np.errstate(all="ignore"):
        absed = kernel(*[np.abs(a) if a.dtype.kind == "f" else a for a in args], backend="numpy")
    absed = absed if isinstance(absed, tuple) else (absed,)
    scale = max([float(np.abs(x).max()) for x in (*want, *absed) if x.size and np.isfinite(x).all()] + [1.0])
    return 4 * float(np.finfo(dtype).eps) * terms * scale


def _check(kernel: tc.Kernel, args: list[np.ndarray], options: MappingOptions, dtype: str, what: str) -> None:
    want = kernel(*args, backend="numpy")
    got = kernel(*args, options=options)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    allowed = _allowance(kernel, args, want, dtype)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, \
            f"{what}: output {k} is {g.dtype}{g.shape}, not {w.dtype}{w.shape}"
        assert (np.isnan(g) == np.isnan(w)).all(), f"{what}: output {k} has NaNs elsewhere"
        err = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max(initial=0.0, where=~np.isnan(w)))
        assert err <= allowed, f"{what}: output {k} differs by {err:.3g} (allowed {allowed:.3g})"


def _sweep(name: str, cpu: str, dtype: str, draws: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_CPU", cpu)
    src, dims = LAYERS[name]
    kernel = tc.define(src.replace("float(", "double(") if dtype == "float64" else src)
    rng = random.Random(f"layer-sweep-{name}-{cpu}-{dtype}-{draws}")
    fk, bk, bw = training_kernels(kernel)
    for _ in range(draws):
        sizes = _sizes(rng, name)
        data = np.random.default_rng(rng.randrange(1 << 30))
        args = [data.uniform(-1, 1, [sizes[d] for d in part.split(":")[1].split(",")]).astype(dtype)
                for part in dims.split()]
        for which, k, a in (("forward", kernel, args), ("backward", bk, backward_arguments(kernel, fk, bw, args))):
            space = S.space_for(k.checked, bind_sizes(k.checked, [np.asarray(x).shape for x in a]))
            for options in (MappingOptions(), S.to_options(space, space.random(rng))):
                _check(k, list(a), options, dtype, f"{name} {which} {dtype} on {cpu} at {sizes} under {options}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_at_drawn_sizes_compute_what_the_interpreter_does(name: str, cpu: str, dtype: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _sweep(name, cpu, dtype, DRAWS, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
@pytest.mark.parametrize("name", list(LAYERS))
def test_slow_layers_at_more_drawn_sizes(name: str, cpu: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _sweep(name, cpu, dtype, SLOW_DRAWS, monkeypatch)
