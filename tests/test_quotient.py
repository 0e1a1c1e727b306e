"""How a pooling gradient's nests lower: codegen.lower.run_over_quotients (pointwise loops that
read at ``v / d`` run over the quotient, the ``d`` remainders written out, and the C emitter prints
those reads at the quotient), the tie count's window inside its vectors, and choices whose branches
read tensors computed before the choice. Each kernel is checked element by element against numpy,
with sizes that leave iterations after the last whole group, and against the loops and choices each
must leave alone."""

from __future__ import annotations

import re

import numpy as np
import pytest
from targets import runnable

import tcdsl as tc
from tcdsl.autodiff import backward_of
from tcdsl.codegen import lower
from tcdsl.polyhedral.loopir import LTile, walk

TARGET_NAMES = [n for n in ("avx512", "avx2", "sse2", "generic", "neon") if runnable(n)]

UPSAMPLE = """def up(float(N,C,H,W) I) -> (O) {
  O(n,c,h,w) = I(n,c,h/2,w/3) * 2.0 + I(n,c,h/2,(w+1)/3) - I(n,c,h/2,(w+5)/3) where h in 0:2*H, w in 0:WO
}"""

UNPOOL = """def unpool(float(N,C,H,W) I, float(N,C,HO,WO) O, float(N,C,HO,WO) G) -> (D) {
  D(n,c,h,w) = (I(n,c,h,w) == O(n,c,h/2,w/2)) ? G(n,c,h/2,w/2) : 0.0 where h in 0:H, w in 0:W, exists O(n,c,h/2,w/2)
}"""


def _inner_loops(text: str) -> list[str]:
    return re.findall(r"for \(long (c\d+) = (-?\d+); \1 <= (-?\d+); \1 \+= 1\)", text)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("wo", [15, 14, 13, 3])
@pytest.mark.parametrize("name", TARGET_NAMES)
def test_reads_at_a_quotient_run_over_the_quotient(name: str, wo: int, dtype: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads at ``w / 3``, ``(w + 1) / 3`` and ``(w + 5) / 3`` of rows 15, 14 and 13 wide (no
    iteration left, one, two after the whole groups of 3), and a row of 3: every element as numpy's."""
    monkeypatch.setenv("TCDSL_CPU", name)
    src = UPSAMPLE.replace("float(", f"{dtype}(").replace("WO", str(wo))
    k = tc.define(src)
    W = (wo + 5) // 3 + 1  # the widest read, (wo - 1 + 5) / 3, in range
    I = np.random.default_rng(wo).random((2, 3, 4, W)).astype(dtype)
    got = k(I)
    h, w = np.arange(8)[:, None], np.arange(wo)[None, :]
    want = I[:, :, h // 2, w // 3] * 2 + I[:, :, h // 2, (w + 1) // 3] - I[:, :, h // 2, (w + 5) // 3]
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
    text = k.source(I)
    assert "tc_fdiv((x3), 3)" not in text.split("int tc_kernel")[1] or wo % 3, text  # whole groups: no quotient left
    groups = [lo for _, lo, hi in _inner_loops(text) if (int(hi) - int(lo) + 1) == wo // 3 and lo == "0"]
    assert groups, text


@pytest.mark.parametrize("W", [46, 45])
def test_a_pooling_gradient_runs_over_the_pooled_columns(W: int) -> None:
    """The max-pooling gradient's last statement: each pooled column's two input columns in one
    iteration, its ``O`` and ``G`` read once at the quotient; an odd width leaves its last column to
    the loop after the groups. Ties and non-maxima checked against numpy."""
    k = tc.define(UNPOOL)
    rng = np.random.default_rng(W)
    I = rng.integers(0, 3, (2, 4, 6, W)).astype(np.float32)  # small integers: ties
    HO, WO = 3, (W + 1) // 2
    O = np.full((2, 4, HO, WO), -1.0, np.float32)
    for h in range(6):
        for w in range(W):
            O[:, :, h // 2, w // 2] = np.maximum(O[:, :, h // 2, w // 2], I[:, :, h, w])
    G = rng.random((2, 4, HO, WO)).astype(np.float32)
    got = k(I, O, G)
    h, w = np.arange(6)[:, None], np.arange(W)[None, :]
    want = np.where(I == O[:, :, h // 2, w // 2], G[:, :, h // 2, w // 2], 0)
    np.testing.assert_array_equal(got, want)
    low = k.lowered(I, O, G)
    quotient = dict(low.passes)["quotient"]
    assert str(quotient) != str(dict(low.passes)["vectorise"]), "the pass left the nest as it was"
    body = low.source.text.split("int tc_kernel")[1]
    assert "(2 * c" in body and "tc_fdiv((x3), 2)" not in body.split("+= 1) {", 1)[1].split("}\n        }")[0]


def test_loops_that_read_otherwise_are_left_alone() -> None:
    """A read at a remainder, at a quotient of a sum of two indices, or with two divisors keeps its
    loop as it was."""
    for src in ("def m(float(N) A) -> (B) { B(i) = A(i % 4) where i in 0:N }",
                "def s(float(N) A) -> (B) { B(i) = A((i + N) / 2) where i in 0:N }",
                "def t(float(N) A) -> (B) { B(i) = A(i / 2) + A(i / 3) where i in 0:N }"):
        k = tc.define(src)
        A = np.arange(64, dtype=np.float32)
        low = k.lowered(A)
        steps = dict(low.passes)
        assert str(steps["quotient"]) == str(steps["vectorise"]), src
        i = np.arange(64)
        want = {"m": A[i % 4], "s": A[(i + 64) // 2], "t": A[i // 2] + A[i // 3]}[k.name]
        np.testing.assert_array_equal(k(A), want)


def test_the_pass_is_listed_in_order() -> None:
    names = [n for n, _ in lower.PASSES]
    assert names.index("vectorise") < names.index("quotient") < names.index("split")


MAXPOOL = """def maxpool(float(N,C,H,W) I) -> (O) {
  O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw) where r_kh in 0:2, r_kw in 0:2
}"""


@pytest.mark.parametrize("W", [46, 45, 36])
def test_the_maxpool_gradient_counts_ties_with_the_window_inside_its_vectors(W: int) -> None:
    """The max-pooling gradient (derived): its count of ties is a register tile whose window column
    loop runs inside the vectorised loop (both columns of a window read in one iteration), and its
    ``d_I`` nest runs over the pooled columns. Ties share the gradient, as numpy's reference says."""
    k = tc.define(MAXPOOL)
    bw = tc.define(backward_of(k).source)
    rng = np.random.default_rng(W)
    I = rng.integers(0, 4, (2, 3, 6, W)).astype(np.float32)  # small integers: ties
    O = k(I)
    G = rng.random(O.shape).astype(np.float32)
    got = bw(I, O, G)
    ho, wo = O.shape[2:]
    window = I[:, :, :2 * ho, :2 * wo].reshape(2, 3, ho, 2, wo, 2)
    hit = window == O[:, :, :, None, :, None]
    share = G / hit.sum(axis=(3, 5))
    want = np.zeros_like(I)
    want[:, :, :2 * ho, :2 * wo] = np.where(hit, share[:, :, :, None, :, None], 0).reshape(2, 3, 2 * ho, 2 * wo)
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(np.float32).eps, atol=0)
    low = bw.lowered(I, O, G)
    steps = dict(low.passes)
    tiles = [n for n in walk(steps["vectorise"].body) if isinstance(n, LTile)]
    assert tiles and all(t.inside for t in tiles), str(steps["vectorise"])
    assert str(steps["quotient"]) != str(steps["vectorise"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_choice_between_reads_that_cannot_fail_reads_both_first(dtype: str) -> None:
    """A choice whose branches read in range everywhere is printed with both values computed first
    (loads and a blend); the value of the branch not taken (a NaN, an infinity) never shows. A
    branch whose read may leave its tensor keeps the plain choice, and that read is never made
    where it would fail."""
    k = tc.define(f"def pick({dtype}(N) X, {dtype}(N) A, {dtype}(N) B) -> (Y) {{\n"
                  "  Y(i) = X(i) > 0.0 ? A(i) : B(i) * 2.0\n}")
    rng = np.random.default_rng(3)
    X, A, B = (rng.random(37) - 0.5).astype(dtype), rng.random(37).astype(dtype), rng.random(37).astype(dtype)
    A[X <= 0] = np.nan
    B[X > 0] = np.inf
    np.testing.assert_array_equal(k(X, A, B), np.where(X > 0, A, B * 2))
    assert "tc_then" in k.source(X, A, B)
    shift = tc.define(f"def nxt({dtype}(N) X) -> (Y) {{ Y(i) = i < N - 1 ? X(i + 1) : 0.0 where i in 0:N }}")
    np.testing.assert_array_equal(shift(X), np.append(X[1:], 0))
    assert "tc_then" not in shift.source(X)
