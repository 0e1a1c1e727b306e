"""TC's meaning for the constructs TC programs use: range inference by intersection, output ranges
that do not start at 0 (the points below them are 0), reductions without ``!`` into a caller's
``out=``, constants on the left, and empty ``where`` ranges. Each def is checked against numpy
on the interpreter, C and OpenCL (with garbage-filled ``out=`` memory), the CUDA text compiles
with NVRTC, and gradients pass torch's gradcheck.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import nvrtc
from tcdsl.errors import TcArgumentError, TcRangeError, TcSemanticError
from tcdsl.options import MappingOptions

try:
    from conftest import has_opencl
    from tolerance import assert_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import has_opencl
    from tolerance import assert_close

torch = pytest.importorskip("torch")

needs_opencl = pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform (apt install pocl-opencl-icd)")
BACKENDS = [pytest.param("numpy", id="numpy"),
            pytest.param("c", marks=pytest.mark.cpu, id="c"),
            pytest.param("opencl", marks=[pytest.mark.gpu, needs_opencl], id="opencl")]
GARBAGE = 7.0


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    shapes: tuple[tuple[int, ...], ...]
    reference: Callable[..., np.ndarray]  # numpy, float64 in, the whole output (0 where unwritten)
    terms: int = 1  # terms summed per output element (the tolerance scales with it)
    differentiable: bool = True


def _shift_conv_grad(dO: np.ndarray, W: np.ndarray) -> np.ndarray:
    """d_I(n, c, h) = sum over f, kh of dO(n, f, h - kh) * W(f, c, kh), for h - kh in range."""
    n, f, ho = dO.shape
    _, c, kh = W.shape
    out = np.zeros((n, c, ho + kh - 1))
    for k in range(kh):
        out[:, :, k:k + ho] += np.einsum("nfh,fc->nch", dO, W[:, :, k])
    return out


def _conv2d_input_grad(dO: np.ndarray, W: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """The transposed convolution of ``dO`` by ``W``, kept on rows and columns ``lo:hi`` (0 elsewhere)."""
    n, m, ho, wo = dO.shape
    _, c, kh, kw = W.shape
    out = np.zeros((n, c, ho + kh - 1, wo + kw - 1))
    for a in range(kh):
        for b in range(kw):
            out[:, :, a:a + ho, b:b + wo] += np.einsum("nmhw,mc->nchw", dO, W[:, :, a, b])
    mask = np.zeros(out.shape[2:], bool)
    mask[lo:hi, lo:hi] = True
    return np.where(mask, out, 0.0)[:, :, :hi, :hi] if hi is not None else out


def _conv2d_weight_grad(dO: np.ndarray, I: np.ndarray) -> np.ndarray:
    _, _, ho, wo = dO.shape
    kh, kw = I.shape[2] - ho + 1, I.shape[3] - wo + 1
    return np.stack([np.stack([np.einsum("nmhw,nchw->mc", dO, I[:, :, a:a + ho, b:b + wo]) for b in range(kw)], -1)
                     for a in range(kh)], -2)


CASES = [
    # 1. range inference: TC's intersection rule
    Case("intersect_sizes", "def f(float(N) B, float(M) A) -> (O) { O(j) = B(j) * A(j) }",
         ((7,), (4,)), lambda B, A: B[:4] * A),
    Case("intersect_symbolic_reduction", "def f(float(N) B, float(M, K) A) -> (O) { O(j) +=! B(j) * A(i, j) }",
         ((6,), (3, 4)), lambda B, A: B[:4] * A.sum(0), terms=3),
    Case("intersect_matmul", "def f(float(M, K) A, float(L, N) B) -> (C) { C(i, j) +=! A(i, k) * B(k, j) }",
         ((3, 5), (4, 2)), lambda A, B: A[:, :4] @ B, terms=4),
    # 2. output ranges that do not start at 0
    Case("shift_right", "def f(float(N) I) -> (O) { O(i) = I(i - 1) }", ((5,),),
         lambda I: np.concatenate([[0.0], I])),
    Case("where_interior", "def f(float(H, W) I) -> (O) { O(h, w) = I(h, w) * 2 where h in 1:H-1, w in 1:W-1 }",
         ((5, 4),), lambda I: np.pad(2 * I[1:-1, 1:-1], ((1, 0), (1, 0)))),
    Case("partial_copy", "def f(float(N) I) -> (O) { O(i) = I(i) where i in 2:N }", ((6,),),
         lambda I: np.concatenate([[0.0, 0.0], I[2:]])),
    Case("shifted_sum", "def f(float(N, K) I) -> (O) { O(i) +=! I(i - 2, k) }", ((4, 3),),
         lambda I: np.concatenate([[0.0, 0.0], I.sum(1)]), terms=3),
    Case("shifted_max", "def f(float(N, K) I) -> (O) { O(i) max=! I(i - 1, k) }", ((4, 3),),
         lambda I: np.concatenate([[0.0], I.max(1)])),
    Case("conv_input_grad_shifted",
         "def f(float(N, F, HO) dO, float(F, C, KH) W) -> (dI) {\n"
         "  dI(n, c, h) +=! dO(n, f, h - kh) * W(f, c, kh) where h in 0:HO + KH - 1\n}",
         ((2, 3, 5), (3, 2, 3)), _shift_conv_grad, terms=9),
    # TC's own meaning of an unpadded input gradient: the rounds bound h by every kh, so only the
    # interior KH-1:HO is written (TC left the rest uninitialised; here it is 0)
    Case("conv2d_input_grad_interior",
         "def f(float(N, M, HO, WO) dO, float(M, C, KH, KW) W) -> (dI) {\n"
         "  dI(n, c, h, w) +=! dO(n, m, h - kh, w - kw) * W(m, c, kh, kw)\n}",
         ((2, 3, 4, 4), (3, 2, 3, 3)), lambda dO, W: _conv2d_input_grad(dO, W, 2, 4), terms=27),
    Case("conv2d_input_grad_padded",
         "def f(float(N, M, HO, WO) dO, float(M, C, KH, KW) W) -> (dI) {\n"
         "  dI(n, c, h, w) +=! dO(n, m, h - kh, w - kw) * W(m, c, kh, kw)\n"
         "    where h in 0:HO + KH - 1, w in 0:WO + KW - 1\n}",
         ((2, 3, 4, 4), (3, 2, 3, 3)), _conv2d_input_grad, terms=27),
    Case("conv2d_weight_grad",
         "def f(float(N, M, HO, WO) dO, float(N, C, H, W) I) -> (dW) {\n"
         "  dW(m, c, kh, kw) +=! dO(n, m, h, w) * I(n, c, h + kh, w + kw)\n}",
         ((2, 3, 4, 4), (2, 2, 6, 6)), _conv2d_weight_grad, terms=32),
    Case("two_statements_two_halves",
         "def f(float(N) I) -> (O) {\n  O(i) = I(i) where i in 0:N\n  O(i) = I(i - N) * 3 where i in N + 1:2 * N\n}",
         ((4,),), lambda I: np.concatenate([I, [0.0], 3 * I[1:]])),
    # 4. constants on the left
    Case("constant_sum", "def f(float(M) I) -> (O) { O(0) +=! I(r_m) }", ((5,),),
         lambda I: np.array([I.sum()]), terms=5),
    Case("constant_column", "def f(float(M, N) I) -> (O) { O(i, 0) = I(i, 1) }", ((3, 4),),
         lambda I: I[:, 1:2]),
    Case("constant_columns",
         "def f(float(M, N) I) -> (O) {\n  O(i, 0) = I(i, 0)\n  O(i, 2) +=! I(i, r) * I(i, r)\n}",
         ((3, 4),), lambda I: np.stack([I[:, 0], np.zeros(3), (I * I).sum(1)], 1), terms=4),
    Case("constant_row_max", "def f(float(M, N) I) -> (O) { O(1, j) max=! I(r, j) }", ((3, 4),),
         lambda I: np.stack([np.zeros(4), I.max(0)])),
    # 4. empty where ranges
    Case("empty_where_reduction", "def f(float(N) I) -> (O) { O(i) +=! I(r) where i in 0:N, r in 4:2 }", ((3,),),
         lambda I: np.zeros(3), differentiable=False),
    Case("empty_where_statement",
         "def f(float(N) I) -> (O) {\n  O(i) = I(i)\n  O(i) = I(i) * 5 where i in 8:4\n}", ((3,),),
         lambda I: I),
]


def _inputs(case: Case, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, s).astype(np.float32) for s in case.shapes]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_tc_meaning(case: Case, backend: str) -> None:
    k = tc.define(case.source, backend=backend)
    args = _inputs(case)
    want = case.reference(*[a.astype(np.float64) for a in args])
    got = k(*args)
    assert got.shape == want.shape
    assert_close(got, want, terms=case.terms)
    out = np.full(want.shape, GARBAGE, np.float32)  # unwritten points are 0 in caller memory too
    assert k(*args, out=out) is out
    assert_close(out, want, terms=case.terms)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cuda_text_compiles(case: Case) -> None:
    k = tc.define(case.source)
    text = k.source(*_inputs(case), backend="cuda")
    assert "__global__" in text
    if nvrtc.available():
        assert nvrtc.compile_cuda(text).cubin[:4] == b"\x7fELF"


@pytest.mark.cpu
@pytest.mark.parametrize("case", [c for c in CASES if c.differentiable], ids=lambda c: c.name)
def test_gradients(case: Case) -> None:
    k = tc.define(case.source.replace("float(", "double("), backend="c")
    args = [torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for a in _inputs(case, seed=1)]
    if "max=" in case.source:  # keep the maxima apart from ties
        args = [torch.from_numpy(np.arange(a.numel(), dtype=np.float64).reshape(a.shape) * 0.37 % 5)
                .requires_grad_(True) for a in args]
    assert torch.autograd.gradcheck(k, tuple(args), eps=1e-6, atol=1e-6, rtol=1e-5)


# ---- range inference is shown ---------------------------------------------------------------------


def test_check_and_explain_show_the_intersection() -> None:
    k = tc.define("def f(float(N) B, float(M, N2) A) -> (O) {\n  O(j) +=! B(j) + A(i, j)\n}")
    assert "j in 0:min(N, N2), i in 0:M" in str(k.checked)
    text = k.explain(np.ones(5, np.float32), np.ones((2, 3), np.float32))
    assert "j in 0:min(N, N2) = 0:3" in text and "i in 0:M = 0:2" in text


def test_where_still_overrides_the_intersection() -> None:
    k = tc.define("def f(float(N) B, float(M) A) -> (O) { O(j) = B(j) + A(j) where j in 0:N }")
    b, a = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(k(b, a), [0, 2, 4, 0, 0])  # padding: j runs where both reads are in bounds


def test_data_dependent_reads_keep_their_checks() -> None:
    k = tc.define("def f(float(N) T, int32(M) Idx, float(L) B) -> (O) { O(i) = T(Idx(i)) + B(i) }")
    t = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(k(t, np.array([3, 0, 1], np.int32), np.ones(2, np.float32)), [4, 1])
    with pytest.raises(tc.TcRuntimeError, match="'T'"):
        k(t, np.array([0, 9], np.int32), np.ones(2, np.float32))


# ---- output ranges ----------------------------------------------------------------------------------


def test_range_below_zero_is_a_located_error() -> None:
    with pytest.raises(TcRangeError) as info:
        tc.define("def f(float(N) I) -> (O) {\n  O(i) = I(i + 2)\n}")
    e = info.value
    assert e.location is not None and (e.location.line, e.location.col) == (2, 5)
    assert "-2:N - 2" in e.message and "below 0" in e.message


def test_negative_extent_is_a_located_error_at_call_time() -> None:
    k = tc.define("def f(float(N) I) -> (O) {\n  O(i) = I(i) where i in 0:N - 7\n}")
    np.testing.assert_array_equal(k(np.ones(8, np.float32)), [1])
    with pytest.raises(TcRangeError) as info:
        k(np.ones(5, np.float32))
    e = info.value
    assert e.location is not None and e.location.line == 2
    assert "'O'" in e.message and "N - 7 = -2" in e.message and "N=5" in e.message


def test_constant_subscripts_print_back() -> None:
    src = "def f(float(M, N) I) -> (O) {\n  O(i, 0) = I(i, 1)\n  O(i, 2) +=! I(i, r)\n}"
    k = tc.define(src)
    text = str(k.checked)
    assert "O(i, 0) = I(i, 1)" in text and "O(i, 2) +=! I(i, r)" in text
    assert tc.define(text.split("\n# ")[0]).checked.stmts == k.checked.stmts


def test_constant_subscript_name_never_clashes() -> None:
    k = tc.define("def f(float(M) _1) -> (O) { O(i, 3) = _1(i) }")
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(k(x), np.pad(x[:, None], ((0, 0), (3, 0))))


# ---- reductions without ! into the caller's output -------------------------------------------------

ACCUMULATE = {
    "+=": lambda o, a: o + a.sum(1),
    "*=": lambda o, a: o * a.prod(1),
    "min=": lambda o, a: np.minimum(o, a.min(1)),
    "max=": lambda o, a: np.maximum(o, a.max(1)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ACCUMULATE)
def test_reduction_into_out_updates_it(op: str, backend: str) -> None:
    k = tc.define(f"def f(float(M, N) A) -> (O) {{ O(i) {op} A(i, j) }}", backend=backend)
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.5, (6, 5)).astype(np.float32)
    o = rng.uniform(-2, 2, 6).astype(np.float32)
    want = ACCUMULATE[op](o.astype(np.float64), a.astype(np.float64))
    assert k(a, out=o) is o
    assert_close(o, want, terms=6)
    with pytest.raises(TcArgumentError) as info:
        k(a)
    assert "out=" in info.value.message and f"'{op}!'" in info.value.message


@pytest.mark.cpu
@pytest.mark.parametrize("options", [
    MappingOptions(),
    MappingOptions(tile=(8, 4, 16), unroll=4),
    MappingOptions(register_tile=(4, 8)),
    MappingOptions(fusion="min", vectorize=False),
], ids=["defaults", "tiled", "register_tile", "no_vectors"])
def test_accumulating_matmul_under_options(options: MappingOptions) -> None:
    k = tc.define("def mm(float(M, K) A, float(K, N) B) -> (C) { C(i, j) += A(i, k) * B(k, j) }",
                  backend="c")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((37, 23)).astype(np.float32), rng.standard_normal((23, 45)).astype(np.float32)
    c0 = rng.standard_normal((37, 45)).astype(np.float32)
    want = c0.astype(np.float64) + a.astype(np.float64) @ b
    for c in (c0.copy(), np.asfortranarray(c0)):  # written in place, and through a copy
        k(a, b, out=c, options=options)
        assert_close(c, want, terms=24)


def test_accumulate_then_other_statements() -> None:
    k = tc.define("def f(float(M, N) A) -> (O, P) {\n  O(i) += A(i, j)\n  P(i) = O(i) * 2\n}")
    a = np.ones((3, 4), np.float32)
    o, p = np.full(3, 10, np.float32), np.zeros(3, np.float32)
    k(a, out=(o, p))
    np.testing.assert_array_equal(o, [14, 14, 14])
    np.testing.assert_array_equal(p, [28, 28, 28])


def test_temporaries_still_need_a_bang() -> None:
    with pytest.raises(TcSemanticError, match="temporary 'T'.*'\\+=!'"):
        tc.define("def f(float(M, N) A) -> (O) {\n  T(i) += A(i, j)\n  O(i) = T(i)\n}")


def test_accumulate_through_torch() -> None:
    k = tc.define("def f(float(M, N) A) -> (O) { O(i) += A(i, j) }")
    a, o = torch.ones(3, 4), torch.full((3,), 2.0)
    with pytest.raises(TcArgumentError, match="out="):
        k(a)
    version = o._version
    assert k(a, out=o) is o
    assert o.tolist() == [6.0, 6.0, 6.0] and o._version > version  # marked as mutated

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(a: Any, o: Any) -> Any:
        k(a, out=o)
        return o * 1

    assert step(a, o).tolist() == [10.0, 10.0, 10.0]
    assert o.tolist() == [10.0, 10.0, 10.0]


def test_indices_named_like_builtins() -> None:
    """``j0``, ``y1``, ... are builtins and ordinary index names too, in either order of use."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for src in ("def f(float(N, M) A) -> (B) { B(i) +=! A(i, j0) * j0 }",
                "def f(float(N, M) A) -> (B) { B(i) +=! j0 * A(i, j0) }",
                "def f(float(N, M) A) -> (B) { B(y1, j1) = A(y1, j1) + y1 }"):
        k = tc.define(src)
        want = (a * np.arange(3)).sum(1) if "+=!" in src else a + np.arange(2)[:, None]
        np.testing.assert_array_equal(k(a), want)
    with pytest.raises(TcSemanticError, match="'j0' is a function"):
        tc.define("def f(float(N) A) -> (B) { B(i) = A(i) * j0 }")


@pytest.mark.cpu
def test_autotune_a_def_that_updates_its_output(tmp_path: Path) -> None:
    """The tuner runs the reference and every candidate from zeroed outputs; the tuned kernel then
    still updates the caller's out= in place."""
    from tcdsl.tuner.cache import TuningCache

    k = tc.define("def mm(float(M, K) A, float(K, N) B) -> (C) { C(i, j) += A(i, k) * B(k, j) }")
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((24, 16)).astype(np.float32), rng.standard_normal((16, 20)).astype(np.float32)
    result = k.autotune(a, b, generations=1, population=3, budget=20, progress=False,
                        cache=TuningCache(str(tmp_path / "tuning.sqlite")))
    assert result.rejected == [] and np.isfinite(result.time_s)
    c0 = rng.standard_normal((24, 20)).astype(np.float32)
    c = c0.copy()
    k(a, b, out=c)
    assert_close(c, c0.astype(np.float64) + a.astype(np.float64) @ b, terms=17)
