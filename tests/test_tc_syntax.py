"""TC syntax that tcdsl takes as TC does: ``<=>`` annotations after a statement (parsed, kept in the
AST, printed back, no other effect) and subscripts made non-affine by a division or modulo by a
size symbol or an index (read like a gather: bounds-checked at run time, floored ``/`` and ``%``,
a located error for a zero divisor). Numbers are checked against numpy written out here, on the
interpreter, C (marked ``cpu``) and OpenCL on PoCL (marked ``gpu``); the CUDA text is compiled
with NVRTC where it is installed, and gradients through such reads pass torch's gradcheck.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcdsl as tc
from tcdsl.codegen import nvrtc
from tcdsl.core import ast as A
from tcdsl.core.printer import module as print_module
from tcdsl.core.printer import stmt as print_stmt
from tcdsl.core.sema import check_def
from tcdsl.grammar import parse, parse_statements
from tcdsl.options import MappingOptions

try:
    from conftest import has_opencl
    from tolerance import assert_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import has_opencl
    from tolerance import assert_close

needs_opencl = pytest.mark.skipif(not has_opencl(), reason="no OpenCL platform (apt install pocl-opencl-icd)")
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install nvidia-cuda-nvrtc)")
BACKENDS = [pytest.param("numpy", id="numpy"),
            pytest.param("c", marks=pytest.mark.cpu, id="c"),
            pytest.param("opencl", marks=[pytest.mark.gpu, needs_opencl], id="opencl")]


def rand(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---- 1. `<=>` annotations ----------------------------------------------------------------------------

# a batched product with a bias; the annotations name functions that exist nowhere
BMM_PLAIN = ("def bmm(float(B, M, K) X, float(B, K, N) Y, float(N) Bias) -> (Z, P) {\n"
             "    Z(b, m, n) +=! X(b, m, r) * Y(b, r, n)\n"
             "    P(b, m, n) = Z(b, m, n) + Bias(n) where n in 0:N\n"
             "}")
BMM_ANNOTATED = ("def bmm(float(B, M, K) X, float(B, K, N) Y, float(N) Bias) -> (Z, P) {\n"
                 "    Z(b, m, n) +=! X(b, m, r) * Y(b, r, n) <=> batch_matmul(X, Y)\n"
                 "    P(b, m, n) = Z(b, m, n) + Bias(n) where n in 0:N <=> add(Z, broadcast(Bias, 0) * 1)\n"
                 "}")


def test_annotation_is_kept_in_the_ast_with_its_span() -> None:
    d = parse(BMM_ANNOTATED, "bmm.tc").defs[0]
    first, second = d.stmts
    assert first.annotation == A.Apply("batch_matmul", (A.Name("X"), A.Name("Y")))
    loc = first.annotation.span.location()
    assert (loc.file, loc.line, loc.col) == ("bmm.tc", 2, 48)
    assert first.wheres == ()
    # after the where clauses, as TC also reads it
    assert isinstance(second.annotation, A.Apply) and second.annotation.name == "add"
    assert second.annotation.args[1] == A.Binary("*", A.Apply("broadcast", (A.Name("Bias"), A.Num(0, False))),
                                                 A.Num(1, False))
    assert len(second.wheres) == 1 and isinstance(second.wheres[0], A.WhereRange)
    assert second.annotation.span.location().line == 3
    # the annotation takes part in equality: the same statements without it are different ASTs
    assert parse(BMM_PLAIN).defs[0] != d
    assert [s.rhs for s in parse(BMM_PLAIN).defs[0].stmts] == [s.rhs for s in d.stmts]


@pytest.mark.parametrize("src", [BMM_ANNOTATED, BMM_PLAIN,
                                 "def f(float(N) A) -> (O) { O(i) = A(i) <=> (A(i) > 0 ? relu(A) : -x) + 1 }",
                                 "def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:N <=> id(float(A), 2.5) }"])
def test_print_parse_round_trip(src: str) -> None:
    m = parse(src)
    text = print_module(m)
    again = parse(text)
    assert again == m
    assert print_module(again) == text
    if "<=>" in src:
        assert all(s.annotation is not None for s in again.defs[0].stmts)
        # printed before the where clauses, the place TC's own parser reads it
        for line in text.splitlines():
            if "where" in line and "<=>" in line:
                assert line.index("<=>") < line.index("where")


def test_annotating_every_statement_of_the_corpus_changes_nothing_but_the_text() -> None:
    """Each def of ``tests/defs.py`` with an annotation on every statement (after the rhs, or after
    the where clauses when it has some): it prints and re-parses to itself, checks to the same
    ranges and computes the same numbers on the interpreter."""
    from defs import DEFS, make_inputs

    for case in DEFS:
        plain = parse(case.source).defs[0]
        stmts = tuple(dataclasses.replace(s, annotation=A.Apply(f"same_as_{n}", (A.Name(s.lhs.name), A.Num(n, False))))
                      for n, s in enumerate(plain.stmts))
        text = print_module(A.Module((dataclasses.replace(plain, stmts=stmts),)))
        annotated = parse(text)
        assert print_module(annotated) == text, case.name
        assert [s.annotation for s in annotated.defs[0].stmts] == [s.annotation for s in stmts], case.name
        moved = text  # the same annotations written after the where clauses parse to the same AST
        for line in text.splitlines():
            if " <=> " in line and " where " in line:
                head, ann_where = line.split(" <=> ", 1)
                ann, where = ann_where.split(" where ", 1)
                moved = moved.replace(line, f"{head} where {where} <=> {ann}")
        assert parse(moved) == annotated, case.name
        want, got = check_def(plain), check_def(annotated.defs[0])
        assert [s.ranges for s in got.stmts] == [s.ranges for s in want.stmts], case.name
        if case.name in ("matmul", "conv2d_same", "embedding", "softmax"):
            args = make_inputs(case.inputs)
            for g, w in zip(np.atleast_1d(tc.define(text)(*args, backend="numpy")),
                            np.atleast_1d(tc.define(case.source)(*args, backend="numpy"))):
                np.testing.assert_array_equal(g, w)


def test_short_form_keeps_the_annotation() -> None:
    (s,) = parse_statements("C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A, B)")
    assert s.annotation == A.Apply("matmul", (A.Name("A"), A.Name("B")))
    assert print_stmt(s) == "C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A, B)"


def test_checked_def_and_cli_print_the_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tcdsl.cli import main

    checked = str(check_def(parse(BMM_ANNOTATED).defs[0]))
    assert "Z(b, m, n) +=! X(b, m, r) * Y(b, r, n) <=> batch_matmul(X, Y)" in checked
    assert "P(b, m, n) = Z(b, m, n) + Bias(n) <=> add(Z, broadcast(Bias, 0) * 1) where n in 0:N" in checked
    path = tmp_path / "bmm.tc"
    path.write_text(BMM_ANNOTATED + "\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "<=> batch_matmul(X, Y)" in out and "<=> add(Z, broadcast(Bias, 0) * 1) where n in 0:N" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_annotation_has_no_effect_on_results(backend: str) -> None:
    X, Y, Bias = rand(2, 3, 5, seed=1), rand(2, 5, 4, seed=2), rand(4, seed=3)
    plain = tc.define(BMM_PLAIN)(X, Y, Bias, backend=backend)
    annotated = tc.define(BMM_ANNOTATED)(X, Y, Bias, backend=backend)
    for p, a in zip(plain, annotated):
        np.testing.assert_array_equal(a, p)
    z = np.einsum("bmk,bkn->bmn", X.astype(np.float64), Y.astype(np.float64))
    assert_close(annotated[0], z, terms=5, scale=np.abs(X).max() * np.abs(Y).max())
    assert_close(annotated[1], z + Bias, terms=6, scale=np.abs(X).max() * np.abs(Y).max() + np.abs(Bias).max())


@pytest.mark.parametrize("src,line,col,words", [
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) <=> g(A, )\n}", 2, 24, ["unexpected ')'"]),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) <=>\n}", 3, 1, ["unexpected '}'"]),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) <=> g(A) where i in 0:N <=> h(A)\n}", 2, 39, ["unexpected '<=>'"]),
    ("def f(float(N) A) -> (O) {\n  O(i) = (A(i) <=> g(A))\n}", 2, 16, ["unexpected '<=>'", "')'"]),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) <=> g(in)\n}", 2, 21, ["'in' is a keyword"]),
])
def test_syntax_error_in_an_annotation_is_located(src: str, line: int, col: int, words: list[str]) -> None:
    with pytest.raises(tc.TcSyntaxError) as ei:
        parse(src, "ann.tc")
    e = ei.value
    assert (e.location.file, e.location.line, e.location.col) == ("ann.tc", line, col), str(e)
    for w in words:
        assert w in e.message, e.message


# ---- 2. division and modulo by a size or an index in a subscript ------------------------------------

# channels gathered modulo a group count that is itself a reduction index (1 <= g < G)
GROUPS = ("def groups(float(N, C, H) I, float(K, H) W, float(G) Wg) -> (O) {\n"
          "    O(n, k, h) +=! I(n, k % g, h) * W(k, h) * Wg(g) where g in 1:G\n"
          "}")


def groups_ref(I: np.ndarray, W: np.ndarray, Wg: np.ndarray) -> np.ndarray:
    I, W, Wg = (x.astype(np.float64) for x in (I, W, Wg))
    out = np.zeros((I.shape[0], W.shape[0], I.shape[2]))
    for g in range(1, Wg.shape[0]):
        for k in range(W.shape[0]):
            out[:, k, :] += I[:, k % g, :] * W[k, :] * Wg[g]
    return out


# nearest-neighbour upsampling by a factor given as a size symbol: j / R and j % R
UPSAMPLE = ("def up(float(N, M) I, float(R) Phase, float(J) Gain) -> (O) {\n"
            "    O(n, j) = I(n, j / R) * Phase(j % R) * Gain(j)\n"
            "}")

# floored division and modulo of negative numerators by an index: trunc would read out of range
FLOORED = ("def fl(float(N) A, int32(N) T) -> (Q, S, U) {\n"
           "    Q(i, d) = A((i - 3) / (d + 1) + 3) where i in 0:N, d in 0:3\n"
           "    S(i, d) = A((i - 3) % (d + 1)) where i in 0:N, d in 0:3\n"
           "    U(i) = T(i) + T(t) where t = (i - N) % N\n"
           "}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_modulo_by_a_reduction_index(backend: str) -> None:
    I, W, Wg = rand(2, 4, 3, seed=4), rand(6, 3, seed=5), rand(4, seed=6)
    got = tc.define(GROUPS)(I, W, Wg, backend=backend)
    scale = np.abs(I).max() * np.abs(W).max() * np.abs(Wg).max()
    assert_close(got, groups_ref(I, W, Wg), terms=3, scale=scale)


@pytest.mark.parametrize("backend,options", [
    pytest.param("c", MappingOptions(tile=(2, 4, 3), register_tile=(2, 2)), marks=pytest.mark.cpu, id="c-tiled"),
    pytest.param("c", MappingOptions(tile=(1, 3, 8), vectorize=False, unroll=4, openmp=False), marks=pytest.mark.cpu,
                 id="c-unrolled"),
    pytest.param("opencl", MappingOptions(tile=(2, 4, 3), blocks=(2,), threads=(4, 2)),
                 marks=[pytest.mark.gpu, needs_opencl], id="opencl-small-grid"),
    pytest.param("opencl", MappingOptions(shared_memory=False, private_memory=False, fusion="max"),
                 marks=[pytest.mark.gpu, needs_opencl], id="opencl-no-promotion")])
def test_non_affine_reads_under_mapping_options(backend: str, options: MappingOptions) -> None:
    I, W, Wg = rand(3, 5, 9, seed=4), rand(7, 9, seed=5), rand(5, seed=6)
    got = tc.define(GROUPS)(I, W, Wg, backend=backend, options=options)
    scale = np.abs(I).max() * np.abs(W).max() * np.abs(Wg).max()
    assert_close(got, groups_ref(I, W, Wg), terms=4, scale=scale)


@pytest.mark.cpu
@settings(max_examples=12, deadline=None)
@given(shift=st.integers(-6, 6), lo=st.integers(-3, 2), width=st.integers(1, 3), op=st.sampled_from("/%"),
       size=st.none() | st.integers(1, 3), offset=st.integers(-2, 4))
def test_drawn_divisors_agree_with_python_on_numpy_and_c(shift: int, lo: int, width: int, op: str, size: int | None,
                                                         offset: int) -> None:
    """``A((i + shift) op q + offset)`` with ``q`` the size symbol D (``size``), or an index summed
    over ``lo:lo+width``: Python's floored ``//`` and ``%`` give the reference, an element outside A
    or a zero divisor the error; both backends agree with it."""
    if size is None:
        src = (f"def f(float(N) A) -> (O) {{\n    O(i) +=! A((i + {shift}) {op} d + {offset}) where i in 0:N, "
               f"d in {lo}:{lo + width}\n}}")
        divisors, args = range(lo, lo + width), ()
    else:
        src = (f"def f(float(N) A, float(D) E) -> (O) {{\n    O(i) = A((i + {shift}) {op} D + {offset}) * E(0) "
               f"where i in 0:N\n}}")
        divisors, args = range(size, size + 1), (np.ones(size, np.float32),)
    A_ = rand(6, seed=11)
    want = np.zeros(6)
    error = False
    for i in range(6):
        for q in divisors:
            at = None if q == 0 else ((i + shift) // q if op == "/" else (i + shift) % q) + offset
            if at is None or not 0 <= at < 6:
                error = True
            else:
                want[i] += A_[at]
    k = tc.define(src)
    for backend in ("numpy", "c"):
        if error:
            with pytest.raises(tc.TcRuntimeError, match="by zero|out of range"):
                k(A_, *args, backend=backend)
        else:
            got = k(A_, *args, backend=backend)
            assert_close(got, want, terms=width, scale=np.abs(A_).max(), err_msg=f"{backend}: {src}")


def test_other_indices_are_still_inferred() -> None:
    (s,) = check_def(parse(GROUPS).defs[0]).stmts
    assert [(r.name, str(r.lo), str(r.hi)) for r in s.ranges] == [
        ("n", "0", "N"), ("k", "0", "K"), ("h", "0", "H"), ("g", "1", "G")]
    (read_i,) = [a for a in s.accesses if a.tensor == "I"]
    assert [str(x) for x in read_i.subs] == ["n", "None", "h"]  # the whole dim 1 may be read
    (u,) = check_def(parse(UPSAMPLE).defs[0]).stmts
    assert [(r.name, str(r.lo), str(r.hi)) for r in u.ranges] == [("n", "0", "N"), ("j", "0", "J")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_division_and_modulo_by_a_size(backend: str) -> None:
    I, Phase, Gain = rand(3, 4, seed=7), rand(3, seed=8), rand(12, seed=9)
    got = tc.define(UPSAMPLE)(I, Phase, Gain, backend=backend)
    want = np.repeat(I, 3, axis=1) * np.tile(Phase, 4) * Gain
    assert got.shape == (3, 12)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_division_and_modulo_round_down(backend: str) -> None:
    A, T = rand(7, seed=9), np.arange(10, 17, dtype=np.int32)
    Q, S, U = tc.define(FLOORED)(A, T, backend=backend)
    i = np.arange(7)[:, None]
    d = np.arange(1, 4)[None, :]
    np.testing.assert_array_equal(Q, A[(i - 3) // d + 3])  # Python's // and % round down, as tcdsl does
    np.testing.assert_array_equal(S, A[(i - 3) % d])
    np.testing.assert_array_equal(U, T + T[(np.arange(7) - 7) % 7])
    assert Q.shape == S.shape == (7, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_divisor_is_the_located_division_error(backend: str) -> None:
    k = tc.define("def z(float(N, C) I, float(D) E) -> (O) {\n"
                  "    O(n, k) +=! I(n, k % d) * E(d) where k in 0:C, d in 0:D\n"
                  "}", filename="z.tc")
    I = rand(2, 3)
    with pytest.raises(tc.TcRuntimeError) as ei:
        k(I, rand(2), backend=backend)  # d takes the value 0
    e = ei.value
    assert "integer modulo by zero" in e.message and "statement 1" in e.message
    assert (e.location.file, e.location.line, e.location.col) == ("z.tc", 2, 22)
    with pytest.raises(tc.TcRuntimeError) as ei:
        tc.define("def z(float(N, C) I, float(D) E) -> (P) {\n"
                  "    P(n, k) = I(n, k / (D - 2)) + E(0) where k in 0:C\n"
                  "}", filename="z.tc")(I, rand(2), backend=backend)  # D - 2 is 0
    assert "integer division by zero" in ei.value.message
    assert (ei.value.location.line, ei.value.location.col) == (2, 20)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_non_affine_read_is_located_and_names_the_tensor(backend: str) -> None:
    k = tc.define("def sh(float(N, M) I, float(J) Pos, float(R) Step) -> (O) {\n"
                  "    O(n, j) = I(n, j / R) * Pos(j)\n"
                  "}", filename="sh.tc")
    I, Pos = rand(2, 3), rand(8)
    out = np.full((2, 8), 5.0, np.float32)
    with pytest.raises(tc.TcRuntimeError) as ei:
        k(I, Pos, rand(2), backend=backend, out=out)  # j = 6, 7 read I(n, 3)
    e = ei.value
    assert "'I'" in e.message and "dim 1" in e.message and "read at 3" in e.message and "outside 0:3" in e.message
    assert "statement 1" in e.message and e.message.startswith("read out of range")  # not a gather
    assert (e.location.file, e.location.line, e.location.col) == ("sh.tc", 2, 15)
    np.testing.assert_array_equal(out, np.full((2, 8), 5.0, np.float32))  # a failed call writes nothing
    # with a step of 3 every read is in range
    np.testing.assert_array_equal(k(I, Pos, rand(3), backend=backend), I[:, np.arange(8) // 3] * Pos)


def test_index_only_in_a_non_affine_subscript_needs_a_where_range() -> None:
    src = ("def f(float(N, M) I) -> (O) {\n"
           "    O(n) +=! I(n, k % M)\n"
           "}")
    with pytest.raises(tc.TcRangeError) as ei:
        tc.define(src, filename="f.tc")
    e = ei.value
    assert "index 'k'" in e.message and "only in non-affine subscripts" in e.message
    assert "where k in lo:hi" in e.message
    assert (e.location.line, e.location.col) == (2, 19)
    # the same read with a range for k runs, and a let that hides the modulo is seen through
    for fixed in ("def f(float(N, M) I) -> (O) {\n    O(n) +=! I(n, k % M) where k in 0:5\n}",
                  "def f(float(N, M) I) -> (O) {\n    O(n) +=! I(n, q) where q = k % M, k in 0:5\n}"):
        I = rand(2, 3)
        np.testing.assert_allclose(tc.define(fixed)(I), I[:, [0, 1, 2, 0, 1]].sum(axis=1), rtol=0, atol=1e-5)
    with pytest.raises(tc.TcRangeError, match="index 'k' appears only in non-affine"):
        tc.define("def f(float(N, M) I) -> (O) {\n    O(n, k) = I(n, q) where q = k / M\n}")


def test_product_of_indices_is_still_refused() -> None:
    with pytest.raises(tc.TcSemanticError, match="neither affine.*division or modulo by a size or an index"):
        tc.define("def f(float(N) A) -> (O) { O(i, j) = A(i * j) where i in 0:2, j in 0:2 }")


@needs_nvrtc
def test_cuda_text_compiles_with_nvrtc() -> None:
    for src, args in ((GROUPS, (rand(2, 4, 3), rand(6, 3), rand(4))), (UPSAMPLE, (rand(3, 4), rand(3), rand(12))),
                      (FLOORED, (rand(7), np.arange(7, dtype=np.int32)))):
        low = tc.define(src).lowered_gpu(*args, backend="cuda")
        assert nvrtc.compile_cuda(low.source.text, "sm_90").cubin[:4] == b"\x7fELF"


@pytest.mark.cpu
def test_gradients_through_non_affine_reads() -> None:
    torch = pytest.importorskip("torch")
    k = tc.define("def g(double(N, C, H) I, double(K, H) W, double(G) Wg) -> (O, O2) {\n"
                  "    O(n, k, h) +=! I(n, k % g, h) * W(k, h) * Wg(g) where g in 1:G\n"
                  "    O2(n, j) = O(n, j / K, 0) * W(j % K, 1) where j in 0:2*K\n"
                  "}", backend="c")
    args = tuple(torch.from_numpy(rand(*s, seed=n, dtype=np.float64)).requires_grad_(True)
                 for n, s in enumerate([(2, 3, 2), (4, 2), (3,)]))
    assert torch.autograd.gradcheck(k, args, eps=1e-6, atol=1e-6, rtol=1e-5)
