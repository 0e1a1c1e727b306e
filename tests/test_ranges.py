"""Range inference against brute-force enumeration on small concrete sizes.

The rule (TC's rounds): a subscript in which exactly one index is still unknown bounds that index to
the largest interval that keeps the access in bounds for every value of the already-known indices;
the bounds found in one round intersect. ``brute_rounds`` applies that rule by enumerating integer
points (no symbolic algebra), and every inferred box is compared with it, checked to keep every read
in bounds, and (for the classic cases) checked to be maximal for its last-solved index.
"""

from __future__ import annotations

import itertools
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerance import assert_sum_close

import tcdsl as tc
from tcdsl.errors import TcRangeError

Env = dict[str, int]
WINDOW = range(-80, 81)  # candidate index values; every true range here lies well inside


@dataclass(frozen=True)
class Sub:
    """One affine subscript: ``coeffs`` over indices, plus a constant that may depend on sizes."""

    coeffs: tuple[tuple[str, int], ...]
    const: Callable[[Env], int] = lambda env: 0
    div: int = 1  # the whole subscript floor-divided by this literal

    @property
    def vars(self) -> frozenset[str]:
        return frozenset(n for n, c in self.coeffs if c != 0)

    def __call__(self, env: Env) -> int:
        return (sum(c * env[n] for n, c in self.coeffs if c != 0) + self.const(env)) // self.div


def sub(const: int | Callable[[Env], int] = 0, div: int = 1, **coeffs: int) -> Sub:
    c = const if callable(const) else (lambda env, v=const: v)
    return Sub(tuple(coeffs.items()), c, div)


@dataclass(frozen=True)
class Read:
    tensor: str
    subs: tuple[Sub, ...]


def in_bounds(reads: list[Read], shapes: dict[str, tuple[int, ...]], env: Env) -> bool:
    return all(0 <= s(env) < shapes[r.tensor][d] for r in reads for d, s in enumerate(r.subs))


def brute_rounds(indices: list[str], reads: list[Read], shapes: dict[str, tuple[int, ...]],
                 sizes: Env) -> tuple[dict[str, tuple[int, int] | None], list[list[str]]]:
    """The rounds rule by enumeration: index -> (lo, hi) (None: depends on an empty range), and the
    rounds (which indices each round solved)."""
    dims = [(r.tensor, d, s) for r in reads for d, s in enumerate(r.subs)]
    known: dict[str, tuple[int, int] | None] = {}
    rounds: list[list[str]] = []
    while len(known) < len(indices):
        solvable = sorted({next(iter(s.vars - known.keys())) for _, _, s in dims if len(s.vars - known.keys()) == 1},
                          key=indices.index)
        assert solvable, "the generated statement must be solvable by rounds"
        solved: dict[str, tuple[int, int] | None] = {}
        for u in solvable:
            relevant = [(t, d, s) for t, d, s in dims if u in s.vars and s.vars <= known.keys() | {u}]
            deps = sorted(set().union(*(s.vars for _, _, s in relevant)) - {u})
            if any(known[v] is None or known[v][0] >= known[v][1] for v in deps):  # type: ignore[index]
                solved[u] = None  # "for all values" of an empty range: no meaningful answer
                continue
            valid = []
            for x in WINDOW:
                ok = True
                for vals in itertools.product(*(range(*known[v]) for v in deps)):  # type: ignore[misc]
                    env = {**sizes, **dict(zip(deps, vals)), u: x}
                    if not all(0 <= s(env) < shapes[t][d] for t, d, s in relevant):
                        ok = False
                        break
                if ok:
                    valid.append(x)
            if valid:
                assert valid == list(range(valid[0], valid[-1] + 1)), "in-bounds values form an interval"
                assert WINDOW[0] < valid[0] and valid[-1] < WINDOW[-1], "window too small"
                solved[u] = (valid[0], valid[-1] + 1)
            else:
                solved[u] = (0, 0)
        known.update(solved)
        rounds.append(solvable)
    return known, rounds


def box_points(box: dict[str, tuple[int, int]], order: list[str]):
    for vals in itertools.product(*(range(*box[n]) for n in order)):
        yield dict(zip(order, vals))


def inferred(k, *arrays: np.ndarray) -> dict[str, tuple[int, int]]:
    return {name: (lo, hi) for name, lo, hi in k.instance(*arrays).stmts[0].ranges}


def reference(lhs: list[str], reds: list[str], box: dict[str, tuple[int, int]], reads: list[Read],
              arrays: dict[str, np.ndarray], sizes: Env, dtype=np.float32) -> np.ndarray:
    """Sum over the box of the product of the reads (``+=!``; a single read: ``=``), reads guarded."""
    shapes = {n: a.shape for n, a in arrays.items()}
    out = np.zeros(tuple(box[n][1] for n in lhs), dtype=np.float64)
    for env in box_points(box, lhs + reds):
        env = {**sizes, **env}
        if not in_bounds(reads, shapes, env):
            continue
        v = 1.0
        for r in reads:
            v *= float(arrays[r.tensor][tuple(s(env) for s in r.subs)])
        out[tuple(env[n] for n in lhs)] += v
    return out.astype(dtype)


def rand_ints(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-3, 4, size=shape).astype(np.float32)


# ---- classic cases: exact box, in bounds, maximal ---------------------------------------------------


@dataclass(frozen=True)
class Case:
    src: str
    lhs: list[str]
    reds: list[str]
    reads: list[Read]
    shapes: Callable[[Env], dict[str, tuple[int, ...]]]
    size_grid: list[Env]
    expect: Callable[[Env], dict[str, tuple[int, int]]]  # hand-derived answer
    last: str  # the index solved in the last round


CASES = {
    "conv": Case(
        "def f(float(H) I, float(KH) W) -> (O) { O(h) +=! I(h + kh) * W(kh) }",
        ["h"], ["kh"], [Read("I", (sub(h=1, kh=1),)), Read("W", (sub(kh=1),))],
        lambda e: {"I": (e["H"],), "W": (e["KH"],)},
        [{"H": h, "KH": kh} for h in range(1, 8) for kh in range(1, h + 1)],
        lambda e: {"h": (0, e["H"] - e["KH"] + 1), "kh": (0, e["KH"])}, "h"),
    "strided_conv": Case(
        "def f(float(H) I, float(KH) W) -> (O) { O(h) +=! I(2*h + kh) * W(kh) }",
        ["h"], ["kh"], [Read("I", (sub(h=2, kh=1),)), Read("W", (sub(kh=1),))],
        lambda e: {"I": (e["H"],), "W": (e["KH"],)},
        [{"H": h, "KH": kh} for h in range(1, 9) for kh in range(1, h + 1)],
        lambda e: {"h": (0, (e["H"] - e["KH"]) // 2 + 1), "kh": (0, e["KH"])}, "h"),
    "reversed": Case(
        "def f(float(N) A) -> (O) { O(i) = A(N - 1 - i) }",
        ["i"], [], [Read("A", (sub(lambda e: e["N"] - 1, i=-1),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(1, 7)],
        lambda e: {"i": (0, e["N"])}, "i"),
    "reversed_neg_first": Case(
        "def f(float(N) A) -> (O) { O(i) = A(-i + N - 1) }",
        ["i"], [], [Read("A", (sub(lambda e: e["N"] - 1, i=-1),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(1, 7)],
        lambda e: {"i": (0, e["N"])}, "i"),
    "half": Case(
        "def f(float(N) A) -> (O) { O(i) = A(i / 2) }",
        ["i"], [], [Read("A", (sub(div=2, i=1),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(1, 7)],
        lambda e: {"i": (0, 2 * e["N"])}, "i"),
    "odd": Case(
        "def f(float(N) A) -> (O) { O(i) = A(2*i + 1) }",
        ["i"], [], [Read("A", (sub(1, i=2),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(2, 9)],
        lambda e: {"i": (0, e["N"] // 2)}, "i"),
    "shift_right_reduction": Case(
        "def f(float(N) A) -> (S) { S +=! A(i + 3) }",
        [], ["i"], [Read("A", (sub(3, i=1),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(1, 7)],
        lambda e: {"i": (-3, e["N"] - 3)}, "i"),
    "shift_left_reduction": Case(
        "def f(float(N) A) -> (S) { S +=! A(i - 1) }",
        [], ["i"], [Read("A", (sub(-1, i=1),))],
        lambda e: {"A": (e["N"],)}, [{"N": n} for n in range(1, 7)],
        lambda e: {"i": (1, e["N"] + 1)}, "i"),
    "strided_conv_2d": Case(
        "def f(float(H, W) I, float(KH, KW) F) -> (O) { O(h, w) +=! I(h + kh, 2*w + kw) * F(kh, kw) }",
        ["h", "w"], ["kh", "kw"], [Read("I", (sub(h=1, kh=1), sub(w=2, kw=1))), Read("F", (sub(kh=1), sub(kw=1)))],
        lambda e: {"I": (e["H"], e["W"]), "F": (e["KH"], e["KW"])},
        [{"H": 4, "W": 7, "KH": 2, "KW": 3}, {"H": 3, "W": 5, "KH": 3, "KW": 1}, {"H": 5, "W": 6, "KH": 1, "KW": 2}],
        lambda e: {"h": (0, e["H"] - e["KH"] + 1), "w": (0, (e["W"] - e["KW"]) // 2 + 1), "kh": (0, e["KH"]),
                   "kw": (0, e["KW"])}, "w"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_classic_case_box_is_the_rounds_answer(name: str) -> None:
    case = CASES[name]
    k = tc.define(case.src)
    rng = np.random.default_rng(0)
    order = case.lhs + case.reds
    for sizes in case.size_grid:
        shapes = case.shapes(sizes)
        arrays = {t: rand_ints(rng, s) for t, s in shapes.items()}
        box = inferred(k, *arrays.values())
        assert list(box) == order
        assert box == case.expect(sizes), sizes
        brute, _ = brute_rounds(order, case.reads, shapes, sizes)
        assert box == brute, sizes
        # (a) every point of the box keeps every read in bounds
        for env in box_points(box, order):
            assert in_bounds(case.reads, shapes, {**sizes, **env}), (sizes, env)
        # (b) one more value of the last-solved index at either end leaves some read
        lo, hi = box[case.last]
        for extra in (lo - 1, hi):
            wider = {**box, case.last: (extra, extra + 1)}
            assert any(not in_bounds(case.reads, shapes, {**sizes, **env}) for env in box_points(wider, order)), \
                (sizes, case.last, extra)
        # the kernel computes over exactly that box
        got = k(*arrays.values())
        want = reference(case.lhs, case.reds, box, case.reads, arrays, sizes)
        np.testing.assert_array_equal(got, want)


def test_kernel_larger_than_input() -> None:
    k = tc.define("def conv(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(h + kh) * W(kh)\n}")
    x = np.ones(2, np.float32)
    out = k(x, np.ones(3, np.float32))  # h in 0:H - KH + 1 = 0:0
    assert out.shape == (0,) and out.dtype == np.float32
    with pytest.raises(TcRangeError) as info:  # 0:-1 cannot be a shape
        k(x, np.ones(4, np.float32))
    e = info.value
    assert e.location is not None and (e.location.line, e.location.col) == (2, 3)
    assert "'O'" in e.message and "H - KH + 1 = -1" in e.message and "H=2" in e.message and "KH=4" in e.message


# ---- symbolic text ----------------------------------------------------------------------------------


@pytest.mark.parametrize("src, text", [
    ("def conv(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(h + kh) * W(kh)\n}",
     "# statement 1 (line 2): h in 0:H - KH + 1, kh in 0:KH"),
    ("def sconv(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(2*h + kh) * W(kh)\n}",
     "# statement 1 (line 2): h in 0:(H - KH) / 2 + 1, kh in 0:KH"),
    ("def rev(float(N) A) -> (O) {\n  O(i) = A(N - 1 - i)\n}",
     "# statement 1 (line 2): i in 0:N"),
    ("def shift(float(N) A) -> (S) {\n  S +=! A(i - 1)\n}",
     "# statement 1 (line 2): i in 1:N + 1"),
    ("def pad(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(h + kh - 1) * W(kh) where h in 0:H\n}",
     "# statement 1 (line 2): h in 0:H, kh in 0:KH"),
])
def test_symbolic_range_text(src: str, text: str) -> None:
    lines = str(tc.define(src).checked).splitlines()
    assert text in lines


def test_conv_output_shape_text() -> None:
    k = tc.define("def conv(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(2*h + kh) * W(kh)\n}")
    assert "# output float32((H - KH) / 2 + 1) O" in str(k.checked).splitlines()


def _eval_text(expr: str, env: Env) -> int:
    """A printed range bound evaluated with TC's meaning (``/`` is floor division, unary minus binds tighter)."""
    py = expr.replace("/", "//")
    assert re.fullmatch(r"[\w\s()+\-*/,]*", py)
    return int(eval(py, {"__builtins__": {}, "min": min, "max": max}, dict(env)))


def test_negated_floordiv_prints_unambiguously() -> None:
    k = tc.define("def f(float(N) A) -> (S) {\n  S +=! A(-2*i + 1)\n}")
    line = next(ln for ln in str(k.checked).splitlines() if ln.startswith("# statement 1"))
    m = re.fullmatch(r"# statement 1 \(line 2\): i in (.+):(.+)", line)
    assert m is not None, line
    for n in range(1, 9):
        a = np.zeros(n, np.float32)
        (_, lo, hi), = k.instance(a).stmts[0].ranges
        # the true answer: 0 <= -2i + 1 <= N - 1  <=>  -(N - 2)/2 <= i <= 1/2
        assert (lo, hi) == (-((n - 2) // 2), 1)
        assert (_eval_text(m.group(1), {"N": n}), _eval_text(m.group(2), {"N": n})) == (lo, hi), line


def test_modulo_only_index_message() -> None:
    with pytest.raises(TcRangeError) as info:
        tc.define("def f(float(N) A) -> (O) {\n  O(i) = A(i % 3)\n}")
    e = info.value
    assert e.location is not None and (e.location.line, e.location.col) == (2, 5)
    assert "index 'i'" in e.message and "where i in" in e.message
    assert "together with other unknown indices" not in e.message


# ---- hypothesis: generated affine subscripts --------------------------------------------------------

nonzero = st.integers(-3, 3).filter(lambda a: a != 0)
const = st.integers(-3, 3)
cross = st.one_of(st.just(0), st.integers(-2, 2))


def _text(s: Sub) -> str:
    """TC text of a generated subscript, e.g. ``-2*i + 1*k - 3``."""
    parts = [(c, f"{abs(c)}*{n}") for n, c in s.coeffs if c != 0] + [(s.const({}), str(abs(s.const({}))))]
    text = ("-" if parts[0][0] < 0 else "") + parts[0][1]
    for c, t in parts[1:]:
        text += f" - {t}" if c < 0 else f" + {t}"
    return text


def check_generated(src: str, order: list[str], reads: list[Read], shapes: dict[str, tuple[int, ...]],
                    sizes: Env, seed: int) -> None:
    brute, _ = brute_rounds(order, reads, shapes, sizes)
    rng = np.random.default_rng(seed)
    arrays = {t: rand_ints(rng, s) for t, s in shapes.items()}
    k = tc.define(src)
    empty = [n for n in order if brute[n] is None or brute[n][0] >= brute[n][1]]  # type: ignore[index]
    try:
        box = inferred(k, *arrays.values())
    except TcRangeError as e:
        assert empty, f"unexpected range error: {e}"
        assert "empty range" in e.message
        return
    assert list(box) == order
    for n in order:
        b = brute[n]
        if b is None:
            continue  # depends on an empty range: the box is empty anyway
        if b[0] >= b[1]:
            assert box[n][1] <= box[n][0], (n, box, brute)
        else:
            assert box[n] == b, (n, box, brute)
    for env in box_points(box, order):
        assert in_bounds(reads, shapes, {**sizes, **env}), env
    want = reference([], order, box, reads, arrays, sizes) if not empty else np.float32(0)
    # The compiled kernel must agree too. A few of these generated reductions make isl's scheduler
    # search for minutes: past a short limit they run in the program order (with a TcWarning).
    saved = os.environ.get("TCDSL_SCHEDULE_TIMEOUT")
    os.environ["TCDSL_SCHEDULE_TIMEOUT"] = "1"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TcWarning)
            got = k(*arrays.values())
    finally:
        if saved is None:
            del os.environ["TCDSL_SCHEDULE_TIMEOUT"]
        else:
            os.environ["TCDSL_SCHEDULE_TIMEOUT"] = saved
    np.testing.assert_array_equal(got, want)


@settings(max_examples=120, deadline=None)
@given(a1=nonzero, c1=const, a2=nonzero, b2=cross, c2=const, n=st.integers(1, 6), m=st.integers(1, 6),
       two_d=st.booleans())
def test_hypothesis_two_rounds(a1: int, c1: int, a2: int, b2: int, c2: int, n: int, m: int, two_d: bool) -> None:
    """``S +=! A(a1*i + c1) * B(a2*k + b2*i + c2)`` (or one 2-D tensor ``A(.., ..)``): i is solved in
    round 1, k in round 1 (b2 = 0) or round 2 for all i of its range."""
    s1, s2 = sub(c1, i=a1), sub(c2, k=a2, i=b2)
    shapes: dict[str, tuple[int, ...]]
    if two_d:
        src = f"def f(float(N, M) A) -> (S) {{\n  S +=! A({_text(s1)}, {_text(s2)})\n}}"
        reads, shapes = [Read("A", (s1, s2))], {"A": (n, m)}
    else:
        src = f"def f(float(N) A, float(M) B) -> (S) {{\n  S +=! A({_text(s1)}) * B({_text(s2)})\n}}"
        reads, shapes = [Read("A", (s1,)), Read("B", (s2,))], {"A": (n,), "B": (m,)}
    _, rounds = brute_rounds(["i", "k"], reads, shapes, {"N": n, "M": m})
    assert rounds == ([["i", "k"]] if b2 == 0 else [["i"], ["k"]])
    check_generated(src, ["i", "k"], reads, shapes, {"N": n, "M": m}, seed=n * 7 + m)


@settings(max_examples=100, deadline=None)
@given(a1=nonzero, c1=const, a2=nonzero, b2=cross, c2=const, a3=nonzero, b3=cross, c3=const,
       n=st.integers(1, 6), m=st.integers(1, 6), p=st.integers(1, 6))
def test_hypothesis_chain_of_rounds(a1: int, c1: int, a2: int, b2: int, c2: int, a3: int, b3: int, c3: int,
                                    n: int, m: int, p: int) -> None:
    """``S +=! A(a1*i + c1) * B(a2*k + b2*i + c2) * C(a3*j + b3*k + c3)``: up to three rounds."""
    s1, s2, s3 = sub(c1, i=a1), sub(c2, k=a2, i=b2), sub(c3, j=a3, k=b3)
    src = (f"def f(float(N) A, float(M) B, float(P) C) -> (S) {{\n"
           f"  S +=! A({_text(s1)}) * B({_text(s2)}) * C({_text(s3)})\n}}")
    reads = [Read("A", (s1,)), Read("B", (s2,)), Read("C", (s3,))]
    check_generated(src, ["i", "k", "j"], reads, {"A": (n,), "B": (m,), "C": (p,)}, {"N": n, "M": m, "P": p},
                    seed=n * 31 + m * 7 + p)


@settings(max_examples=100, deadline=None)
@given(a1=nonzero, c1=const, a2=nonzero, c2=const, n=st.integers(1, 7))
def test_hypothesis_same_round_intersection(a1: int, c1: int, a2: int, c2: int, n: int) -> None:
    """Two subscripts over the same size symbol bound i in the same round: the bounds intersect."""
    s1, s2 = sub(c1, i=a1), sub(c2, i=a2)
    src = f"def f(float(N) A, float(N) B) -> (S) {{\n  S +=! A({_text(s1)}) * B({_text(s2)})\n}}"
    check_generated(src, ["i"], [Read("A", (s1,)), Read("B", (s2,))], {"A": (n,), "B": (n,)}, {"N": n},
                    seed=n)


@pytest.mark.parametrize("src, n, want", [
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) + A(2*i)\n}", 5, (0, 3)),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) + A(2*i)\n}", 1, (0, 1)),
    ("def f(float(N) A) -> (S) {\n  S +=! A(i) * A(-i)\n}", 4, (0, 1)),
    ("def f(float(N) A) -> (S) {\n  S +=! A(i + 1) * A(N - 1 - i)\n}", 6, (0, 5)),
])
def test_same_symbol_bounds_intersect(src: str, n: int, want: tuple[int, int]) -> None:
    k = tc.define(src)
    a = np.arange(1, n + 1, dtype=np.float32)
    (_, lo, hi), = k.instance(a).stmts[0].ranges
    assert (lo, hi) == want
    got = k(a)
    if "O(i)" in src:
        np.testing.assert_array_equal(got, [a[i] + a[2 * i] for i in range(lo, hi)])
    elif "-i" in src:
        np.testing.assert_array_equal(got, np.float32(a[0] * a[0]))
    else:
        np.testing.assert_array_equal(got, np.float32(sum(a[i + 1] * a[n - 1 - i] for i in range(lo, hi))))


# ---- padding by domain ------------------------------------------------------------------------------


@pytest.mark.parametrize("h", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("kh", [1, 2, 3, 4])
def test_padding_by_domain_is_zero_padded_same_correlation(h: int, kh: int) -> None:
    k = tc.define("def same(float(H) I, float(KH) W) -> (O) {\n"
                  "  O(h) +=! I(h + kh - 1) * W(kh) where h in 0:H\n"
                  "}")
    rng = np.random.default_rng(h * 10 + kh)
    x = rng.standard_normal(h).astype(np.float32)
    w = rng.standard_normal(kh).astype(np.float32)

    def same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        padded = np.pad(x, (1, kh))  # I(-1) and I(H..) read as zero
        return np.array([sum(padded[p + q] * w[q] for q in range(kh)) for p in range(h)])

    assert inferred(k, x, w) == {"h": (0, h), "kh": (0, kh)}
    got = k(x, w)
    assert got.shape == (h,)
    assert_sum_close(got, same, x, w, terms=kh)


def test_padding_by_domain_same_3x3_convolution() -> None:
    k = tc.define("def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
                  "  O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n"
                  "}")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)

    def same(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        return sum(np.einsum("nchw,fc->nfhw", p[:, :, i:i + 5, j:j + 4], wt[:, :, i, j])
                   for i, j in itertools.product(range(3), range(3)))

    assert inferred(k, x, wt) == {"n": (0, 2), "f": (0, 4), "h": (0, 5), "w": (0, 4), "c": (0, 3), "kh": (0, 3),
                                  "kw": (0, 3)}
    assert_sum_close(k(x, wt), same, x, wt, terms=27)


@pytest.mark.parametrize("n", [7, 5000])  # below and above the size the outputs are aligned from
def test_an_output_written_from_an_offset_has_zeros_below_it_whatever_its_memory_held(n: int) -> None:
    """`O(i) = ... where i in 1:N + 1` leaves `O(0)`, and a 2-D output written from row 2 and
    column 1 leaves its first rows and column: those parts are 0 in a fresh output (whose memory
    may hold an earlier call's values) and in one given with `out=` full of other values, and
    everything else is written: the numbers of numpy on every call."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal(n).astype(np.float32)
    k = tc.define("def f(float(N) X) -> (O) { O(i) = X(i - 1) * 2.0 + 1.0 where i in 1:N + 1 }")
    want = np.concatenate([[0.0], X.astype(np.float64) * 2 + 1]).astype(np.float32)
    for _ in range(3):  # freed outputs' memory comes back to later calls
        np.testing.assert_array_equal(k(X), want)
        np.full(n + 1, np.nan, np.float32)  # memory the next call's output may reuse
    out = np.full(n + 1, np.nan, np.float32)
    k(X, out=out)
    np.testing.assert_array_equal(out, want)
    A = rng.standard_normal((n // 4 + 1, 3)).astype(np.float32)
    k2 = tc.define("def g(float(M, K) A) -> (O) { O(k, m) = A(m - 2, k - 1) + 1.0 where m in 2:M + 2, k in 1:K + 1 }")
    want2 = np.zeros((4, A.shape[0] + 2), np.float32)
    want2[1:, 2:] = A.T + 1
    np.testing.assert_array_equal(k2(A), want2)
    out2 = np.full(want2.shape, -7.0, np.float32)
    k2(A, out=out2)
    np.testing.assert_array_equal(out2, want2)
