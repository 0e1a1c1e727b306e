"""The CPU lowering passes (codegen.lower) one at a time: the C printed from the loop IR after each
pass, with only the passes before it applied, computes what the reference interpreter computes.
Corpus defs under the default options and options drawn from the tuner's space (seeded), on this
machine's vector width and on AVX2 (compiled with ``-mno-avx512f`` on an AVX-512 machine). A pass
that decides nothing for a def gives the IR before it, which is not run twice. The whole pipeline's
numbers are checked in test_cputarget and test_c_backend; the printed IR in test_golden."""

from __future__ import annotations

import dataclasses
import random
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.arguments import c_ready, coerce_inputs
from tcdsl.codegen import c as cgen
from tcdsl.codegen import lower, pack, toolchain
from tcdsl.compiler import CKernel
from tcdsl.core.instance import bind_sizes
from tcdsl.errors import TcRuntimeError
from tcdsl.options import MappingOptions
from tcdsl.polyhedral import cputarget
from tcdsl.polyhedral.loopir import LCall, LFor, LInt, LOp, LTile, LVar, expr_value, loop_values, walk
from tcdsl.tuner import space as S

try:
    from defs import DEFS, assert_matches, make_inputs
    from targets import runnable, runnable_of
except ImportError:  # run from another directory
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from defs import DEFS, assert_matches, make_inputs
    from targets import runnable, runnable_of

pytestmark = pytest.mark.cpu

# defs whose IR each pass changes: temporaries (softmax, layernorm), transposes, register tiles,
# strided windows, reductions into one element, hoisted reads, several statements
PICKED = ["matmul", "conv2d_strided", "maxpool_2x2_s2", "softmax", "layernorm", "reduce_rows", "transposes",
          "let_in_reduction", "contraction_odd_views", "conv1d_padded_sum_prod_max"]


def _runnable() -> list[str]:
    return runnable_of("native", "avx2")


def test_the_passes_run_in_the_listed_order() -> None:
    k = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }")
    low = k.lowered(np.ones((24, 16), np.float32), np.ones((16, 40), np.float32), target="avx2")
    assert [name for name, _ in low.passes] == [name for name, _ in lower.PASSES]
    assert low.lowered_ir is low.passes[-1][1]
    text = lower.trace(low.passes, low.ir)
    assert "register tile of S1 across" in text and "lanes per row" in text  # regtile, then vectorise
    assert "(unchanged)" in text  # a matmul has no temporaries to contract


def test_dump_dir_writes_the_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_DUMP_DIR", str(tmp_path))
    k = tc.define("def sm(float(N,D) X) -> (Y) { mx(n) max=! X(n,r_d)\n e(n,d) = exp(X(n,d) - mx(n))\n"
                  " s(n) +=! e(n,r_d)\n Y(n,d) = e(n,d) / s(n) }")
    k.lowered(np.ones((8, 40), np.float32))
    text = (tmp_path / "sm.passes.txt").read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("== ")] == [n for n, _ in lower.PASSES]
    assert "temporary e in one row" in text  # the contract pass's decision, printed


@pytest.mark.parametrize("cpu", _runnable())
@pytest.mark.parametrize("name", PICKED)
def test_every_pass_computes_what_the_interpreter_does(name: str, cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_CPU", cpu)
    case = next(c for c in DEFS if c.name == name)
    k = tc.define(case.source)
    args = make_inputs(case.inputs)
    arrays = [np.asarray(a) for a in args]
    space = S.space_for(k.checked, bind_sizes(k.checked, [a.shape for a in arrays]))
    rng = random.Random(f"passes-{name}-{cpu}")
    ref = k(*args, backend="numpy")
    inputs = {t.name: c_ready(a) for t, a in zip(k.checked.inputs, coerce_inputs(k.checked, args))}
    ran = 0
    for options in (MappingOptions(), *(S.to_options(space, space.random(rng)) for _ in range(2))):
        low = k.lowered(*args, options=options)
        target = cputarget.named(cpu, toolchain.native_target(tuple(toolchain.compiler())))
        seen: set[str] = set()
        for upto, (pass_name, ir) in enumerate(low.passes):
            if str(ir) in seen:
                continue
            seen.add(str(ir))
            src = cgen.emit(ir, low.scop, low.strides, target, vectorize=options.vectorize,
                            vector_math=toolchain.has_vector_math())
            kernel = CKernel(dataclasses.replace(low, passes=low.passes[:upto + 1], source=src))
            outs = kernel(inputs)
            got = tuple(outs[t.name] for t in k.checked.outputs)
            assert_matches(got if len(got) > 1 else got[0], ref, case.tol,
                           f"{name} on {cpu} after the {pass_name} pass under {options}")
            ran += 1
    assert ran >= 3


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(50, 300), (100, 1000), (200, 150)])  # (M, K); rows of B are 4 KiB
def test_packed_panels_compute_the_product(shape: tuple[int, int], dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack pass on AVX2, where rows of B 4 KiB apart fall into one L1 set: partial row tiles
    (M = 50 is 8 tiles of 6 and one of 2), partial reduction blocks (K = 300, 1000)."""
    if "avx2" not in _runnable():
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    m, kk = shape
    n = 4096 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(7)
    A = rng.standard_normal((m, kk)).astype(dtype)
    B = rng.standard_normal((kk, n)).astype(dtype)
    k = tc.define(MM.replace("float(", f"{dtype}("))
    assert "pack B" in lower.trace(k.lowered(A, B).passes)
    got = k(A, B)
    want = A.astype(np.float64) @ B.astype(np.float64)
    bound = 2 * kk * np.finfo(dtype).eps * np.abs(A).max() * np.abs(B).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)


FC = """def fc(float(B,M) I, float(N,M) W, float(N) Bs) -> (O) {
  O(b,n) +=! I(b,r_m) * W(n,r_m)
  O(b,n) = fmax(O(b,n) + Bs(n), 0.0)
}"""


# (B, M, N), and the caches of the target (a 2 MiB L2 packs a 500-wide operand, whose transpose
# runs in blocks of 64 rows and a last one of 52)
@pytest.mark.parametrize("shape,caches", [((128, 1024, 1024), ""), ((64, 1024, 300), ""), ((96, 1024, 64), ""),
                                          ((96, 500, 900), "l1d=48K,l2=2M")])
def test_a_transposed_operand_is_packed_straight_from_its_source(
        shape: tuple[int, int, int], caches: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A layer's operand, laid out transposed for the product (tcdsl.layout) and then packed into
    panels on AVX2, is packed from the operand itself, each panel a blocked transpose of its rows:
    the transpose nest is gone from the IR, and the result has the bits of the kernel that
    transposes and packs in two passes, within the product's rounding of numpy's. Built without
    the vector layer (-DTC_VEC=0), the scalar tile reads the source too (the transposed copy is
    never written)."""
    if "avx2" not in _runnable():
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    if caches:
        monkeypatch.setenv("TCDSL_CPU_CACHES", caches)
    b, m, n = shape
    rng = np.random.default_rng(3)
    I, W, Bs = (rng.standard_normal(s).astype(np.float32) for s in ((b, m), (n, m), (n,)))
    k = tc.define(FC)
    text = str(k.lowered(I, W, Bs).passes[-1][1])
    # the operand moved (I, or W where the product is written transposed) is packed from itself
    assert re.search(r"// pack (I|W)_t \(read \d of S2\).*transposed from \1 \(its transpose into \1_t folded here\)",
                     text), text
    assert "transpose S1 in blocks" not in text  # X_t(r_m, x) = X(x, r_m): copied by the pack alone
    got = k(I, W, Bs)
    scalar = _without_vectors(monkeypatch, tmp_path, FC, [I, W, Bs])  # the scalar tile reads the source too
    monkeypatch.setattr(pack, "_foldable", lambda *a: False)
    two_passes = tc.define(FC)
    assert "transpose S1 in blocks" in str(two_passes.lowered(I, W, Bs).passes[-1][1])
    np.testing.assert_array_equal(got, two_passes(I, W, Bs))
    want = np.maximum(I.astype(np.float64) @ W.T.astype(np.float64) + Bs, 0)
    bound = 4 * (m + 1) * np.finfo(np.float32).eps * np.abs(I).max() * np.abs(W).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    # the input as a transposed view (its rows not contiguous): the pack copies what it reads
    It = np.ascontiguousarray(I.T).T
    np.testing.assert_allclose(k(It, W, Bs), want, rtol=0, atol=bound)
    np.testing.assert_allclose(scalar, want, rtol=0, atol=bound)


def _without_vectors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, src: str, args: list) -> np.ndarray:
    """The def's kernel compiled with ``-DTC_VEC=0`` (its scalar tiles), in a cache of its own."""
    with monkeypatch.context() as m:
        m.setenv("CC", " ".join([*toolchain.compiler(), "-DTC_VEC=0"]))
        m.setenv("TCDSL_CACHE_DIR", str(tmp_path / "scalar"))
        k = tc.define(src)
        assert "transposed from" in str(k.lowered(*args).passes[-1][1])
        return k(*args)


def test_a_transposed_operand_in_column_blocks_is_packed_straight_from_its_source(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``A Bᵀ`` 1024^3 on AVX2: B laid out transposed, packed whole in two blocks of 32 panels of
    16 columns, each block's panels after the last's, copied from B itself; the bits of the kernel
    that transposes first."""
    if "avx2" not in _runnable():
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    abt = "def abt(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,r_k) * B(n,r_k) }"
    rng = np.random.default_rng(5)
    A, B = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
    k = tc.define(abt)
    text = str(k.lowered(A, B).passes[-1][1])
    assert "// pack B_t (read 1 of S2) into tc_pk0: 2 x 32 panels x 1024 steps x 16" in text
    assert "transposed from B (its transpose into B_t folded here)" in text and "// transpose" not in text
    got = k(A, B)
    scalar = _without_vectors(monkeypatch, tmp_path, abt, [A, B])
    monkeypatch.setattr(pack, "_foldable", lambda *a: False)
    two_passes = tc.define(abt)
    assert "transpose S1 in blocks" in str(two_passes.lowered(A, B).passes[-1][1])
    np.testing.assert_array_equal(got, two_passes(A, B))
    want = A.astype(np.float64) @ B.T.astype(np.float64)
    bound = 4 * 1025 * np.finfo(np.float32).eps * np.abs(A).max() * np.abs(B).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    np.testing.assert_allclose(scalar, want, rtol=0, atol=bound)


@pytest.mark.parametrize("target,columns,packed", [("avx2", 1024, True), ("avx2", 1088, True), ("avx2", 1040, False),
                                                   ("avx2", 1000, False), ("avx512", 1024, False)])
def test_panels_are_packed_where_rows_share_l1_sets(target: str, columns: int, packed: bool) -> None:
    """4 KiB rows put a panel's 128 rows in one L1 set; 4352-byte rows spread them over 16 sets
    of 8 (all their ways); 4160-byte and 4000-byte rows over all of them. AVX-512 loads whole lines."""
    k = tc.define(MM)
    low = k.lowered(np.zeros((96, 1000), np.float32), np.zeros((1000, columns), np.float32), target=target)
    assert ("pack B" in lower.trace(low.passes)) == packed


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_large_l2_holds_each_reduction_chunks_panels(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a 2 MiB L2 (CpuTarget.l2_panels) rows of B 4 KiB apart are packed whatever the vector
    width, and the reduction runs in chunks whose panels fill half of L2 (1024 columns: 256 steps);
    with 1 MiB it runs whole (AVX2) or unpacked (AVX-512). The numbers of numpy on the machine's ISAs."""
    A = np.zeros((96, 1000), np.float32)
    B = np.zeros((1000, 1024), np.float32)
    k = tc.define(MM)
    big, small = (dataclasses.replace(cputarget.preset(isa), l2=size) for size in (2 << 20, 1 << 20))
    loops = lower.trace(k.lowered(A, B, target=big).passes)
    assert "pack B" in loops and "+= 256)" in loops, loops
    loops = lower.trace(k.lowered(A, B, target=small).passes)
    assert ("pack B" in loops) == (isa == "avx2") and "+= 256)" not in loops, loops
    if not runnable(isa):
        pytest.skip(f"this machine runs no {isa} code")
    monkeypatch.setenv("TCDSL_CPU", isa)
    monkeypatch.setenv("TCDSL_CPU_CACHES", "l2=2M")
    rng = np.random.default_rng(11)
    A = rng.standard_normal((96, 1000)).astype(np.float32)
    B = rng.standard_normal((1000, 1024)).astype(np.float32)
    assert "+= 256)" in lower.trace(k.lowered(A, B).passes)
    want = A.astype(np.float64) @ B.astype(np.float64)
    bound = 2 * 1000 * np.finfo(np.float32).eps * np.abs(A).max() * np.abs(B).max()
    np.testing.assert_allclose(k(A, B), want, rtol=0, atol=bound)


@pytest.mark.parametrize("target", ["avx2", "avx512"])
def test_loops_over_register_tiles_take_fine_chunks_and_streamed_rows_long_ones(target: str) -> None:
    """The parallel pass marks an omp loop fine exactly where it runs register tiles; the C hands
    its iterations out in about 32 chunks a thread, a streaming row loop's in about 8."""
    def omp_loops(low: object) -> list[LFor]:
        return [n for n in walk(low.lowered_ir.body) if isinstance(n, LFor) and n.omp]  # type: ignore[attr-defined]

    fc = tc.define("def fc(float(B,K) X, float(N,K) W, float(N) Bs) -> (Y) {\n"
                   "  Y(b, n) +=! X(b, r_k) * W(n, r_k)\n  Y(b, n) = fmax(Y(b, n) + Bs(n), 0.0)\n}")
    fc_args = (np.zeros((128, 1024), np.float32), np.zeros((1024, 1024), np.float32), np.zeros(1024, np.float32))
    low = fc.lowered(*fc_args, target=target)
    loops = omp_loops(low)
    assert any(n.fine for n in loops), lower.trace(low.passes)
    assert all(n.fine == any(isinstance(m, LTile) for m in walk(n.body)) for n in loops)
    assert "fine chunks" in lower.trace(low.passes)
    assert re.search(r"schedule\(dynamic, tc_chunk\(\d+L, 32\)\)", fc.source(*fc_args))

    sm = tc.define("def sm(float(N,D) X) -> (Y) { mx(n) max=! X(n,r_d)\n e(n,d) = exp(X(n,d) - mx(n))\n"
                   " s(n) +=! e(n,r_d)\n Y(n,d) = e(n,d) / s(n) }")
    x = np.zeros((2000, 1000), np.float32)
    loops = omp_loops(sm.lowered(x, target=target))
    assert loops and not any(n.fine for n in loops)
    assert "schedule(dynamic, tc_chunk(2000L, 8))" in sm.source(x)


def test_a_failed_panel_allocation_is_a_located_error_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed panels live in heap buffers allocated when the kernel starts (not on thread stacks,
    which may be small); built so that the allocation fails, the call raises a located
    TcRuntimeError and leaves the caller's out= as it was."""
    if "avx2" not in _runnable():
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    monkeypatch.setenv("CC", shlex.join([*toolchain.compiler(), "-Dtc_aligned_alloc(a,s)=((void *)0)"]))
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(1)
    A = rng.standard_normal((50, 300)).astype(np.float32)
    B = rng.standard_normal((300, 1024)).astype(np.float32)
    k = tc.define(MM)
    assert "packed panels" in k.source(A, B)
    out = np.full((50, 1024), 7.0, np.float32)
    with pytest.raises(TcRuntimeError, match="could not allocate .* bytes for the packed panels of 'B'") as e:
        k(A, B, out=out)
    assert e.value.location is not None and e.value.location.line == 1
    assert (out == 7.0).all()


def test_loop_values_enumerate_the_bounds_a_tile_reads() -> None:
    """The sizes a tile cut short can take come from enumerating the loops around it (vectorise):
    a 6-row tile loop inside 64 rows stepped by 6 ends short once, at 60, with 4 rows."""
    outer = LFor("c0", LInt(0), LOp("<=", (LVar("c0"), LInt(1))), 1, ())
    rows = LFor("c1", LInt(0), LOp("<=", (LVar("c1"), LInt(63))), 6, ())
    inner = LFor("c2", LVar("c1"), LOp("<", (LVar("c2"), LOp("+", (LVar("c1"), LInt(3))))), 2, ())
    bound = LOp("min", (LInt(5), LOp("+", (LOp("neg", (LVar("c1"),)), LInt(63)))))
    envs = loop_values([outer, rows, inner], {"c1"})
    assert envs is not None and [e["c1"] for e in envs] == list(range(0, 64, 6))  # c0 and c2 left alone
    assert {expr_value(bound, e) for e in envs} == {5, 3}
    both = loop_values([outer, rows, inner], {"c2"})  # c2's bounds read c1: both enumerated
    assert both is not None and len(both) == 11 * 2 and both[-1] == {"c1": 60, "c2": 62}
    assert loop_values([rows], {"c9"}) is None  # a variable no loop defines
    assert loop_values([rows], {"c1"}, limit=5) is None  # past the limit
    assert expr_value(LOp("floordiv", (LInt(-7), LInt(2))), {}) == -4
    assert expr_value(LOp("div", (LInt(-7), LInt(2))), {}) == -3  # C's division truncates
    assert expr_value(LOp("mod", (LInt(-7), LInt(2))), {}) == -1
    assert expr_value(LOp("?:", (LOp("<", (LInt(1), LInt(2))), LInt(5), LInt(6))), {}) == 5
    assert expr_value(LOp("mod", (LInt(7), LInt(0))), {}) is None
    assert expr_value(LOp("+", (LVar("x"), LInt(1))), {}) is None


SIBLINGS = """
def sums(float(N, D) X, float(N, D) Y) -> (A, T, B) {{
  A(d) +=! X(n, d) * Y(n, d)
  T(n, d) = X(n, d) * 2.0
  B(d) +=! {b} * X(n, d)
}}
"""


@pytest.mark.parametrize("cpu", _runnable())
@pytest.mark.parametrize("b_reads", ["Y(n, d)", "T(n, d)"])
def test_independent_nests_of_the_same_loops_run_them_once(b_reads: str, cpu: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The siblings pass: two column sums of X in nests of the same loops, a row nest between them.
    B's nest joins A's where B reads Y (nothing the row nest writes), and stays after the row nest
    where B reads T, which the row nest writes. Either way the kernel computes what the interpreter
    does (sizes that are not multiples of the tiles)."""
    monkeypatch.setenv("TCDSL_CPU", cpu)
    k = tc.define(SIBLINGS.format(b=b_reads))
    rng = np.random.default_rng(5)
    X, Y = (rng.standard_normal((301, 203)).astype(np.float32) for _ in range(2))
    low = k.lowered(X, Y)
    before, after = (dict(low.passes)[name] for name in ("fuse", "siblings"))
    tops = [[c.stmt for c in walk((n,)) if isinstance(c, LCall)] for n in after.body]
    if b_reads == "T(n, d)":
        assert after.body == before.body
        assert [s for s in map(set, tops) if s & {"S1", "S3"}] == [{"S1"}, {"S3"}]
    else:
        assert len(after.body) == len(before.body) - 1
        both = next(t for t in tops if "S1" in t)
        assert "S3" in both and both.index("S1") < both.index("S3")
    got = k(X, Y)
    want = k(X, Y, backend="numpy")
    for g, w in zip(got, want):
        assert_matches(g, w, 301, f"sums with B reading {b_reads} on {cpu}")


def _layernorm_backward(N: int, D: int, dtype: str = "float32") -> tuple[tc.Kernel, list[np.ndarray]]:
    k = tc.define(next(c for c in DEFS if c.name == "layernorm").source.replace("float(", f"{dtype}("))
    bwd = tc.define(k.backward_source())
    rng = np.random.default_rng(6)
    X = rng.standard_normal((N, D)).astype(dtype)
    mean = X.mean(1).astype(dtype)
    var = ((X - mean[:, None]) ** 2).mean(1).astype(dtype)
    return bwd, [X, rng.standard_normal(D).astype(dtype), rng.standard_normal(D).astype(dtype), mean, var,
                 rng.standard_normal((N, D)).astype(dtype)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("N, D", [(1500, 260), (1003, 333)])
def test_layernorm_gain_and_bias_gradients_sum_in_the_row_loop(N: int, D: int, dtype: str) -> None:
    """In layernorm's derived backward, d_G and d_Bt are sums over the rows of what the row loop
    reads (d_Y, X): the privatise pass moves them into it, each block of rows summing into partial
    rows of its own, added in block order after the loop (rows not a multiple of the blocks:
    1003), and they run first in each row; no nest of their own is left, the kernel allocates the
    partial rows before anything else, and the gradients match the interpreter's, the same on
    every call."""
    bwd, args = _layernorm_backward(N, D, dtype)
    low = bwd.lowered(*args)
    of = {low.scop.tc_statement(st.name).tensor: st.name for st in low.scop.stmts if st.kind == "update"}
    after = dict(low.passes)["privatise"]
    rows = [n for n in after.body if isinstance(n, LFor) and n.private]
    assert len(rows) == 1 and set(rows[0].private) == {"d_G", "d_Bt"}, str(after)
    assert 1 < rows[0].blocks <= N
    assert "summing d_G, d_Bt in partial rows" in str(low.lowered_ir)
    first = rows[0].body[0]  # the sums are the row's first pass through its operands
    assert {c.stmt for c in walk((first,)) if isinstance(c, LCall)} == {of["d_G"], of["d_Bt"]}, str(after)
    for n in after.body:
        if n is not rows[0]:
            assert not {of["d_G"], of["d_Bt"]} & {c.stmt for c in walk((n,)) if isinstance(c, LCall)}, str(after)
    text = bwd.source(*args)
    assert text.index("partial rows") < text.index("#pragma omp parallel")  # allocated first
    got = bwd(*args)
    for g, w in zip(got, bwd(*args, backend="numpy")):
        assert_matches(g, w, N * 4, "layernorm's backward")
    for g, again in zip(got, bwd(*args)):
        np.testing.assert_array_equal(g, again)


def test_only_sums_of_inputs_into_unread_targets_move_into_the_row_loop() -> None:
    """Layernorm's backward with one more sum of d_Y, F: it moves into the row loop with d_G and
    d_Bt; where another statement reads F (W), F keeps its nest and the other two still move;
    with too few rows for what the sums read to outgrow L2, nothing moves. The results match the
    interpreter's every time."""
    head = "-> (float32(N, D) d_X, float32(D) d_G, float32(D) d_Bt)"
    base = tc.define(next(c for c in DEFS if c.name == "layernorm").source).backward_source()
    assert head in base

    def extended(outs: str, lines: str) -> tc.Kernel:
        return tc.define(base.replace(head, head[:-1] + ", " + outs + ")").rstrip().rstrip("}") + lines + "}\n")

    f_sum = "  F(d) +=! d_Y(n, d) * 2.0 where d in 0:D, n in 0:N\n"
    cases = [(extended("F", f_sum), 1500, {"F", "d_G", "d_Bt"}),
             (extended("F, W", f_sum + "  W(d) = F(d) * 2.0\n"), 1500, {"d_G", "d_Bt"}),
             (extended("F", f_sum), 100, set())]
    for k, N, moved in cases:
        _, args = _layernorm_backward(N, 260)
        ir = dict(k.lowered(*args).passes)["privatise"]
        assert {t for n in ir.body if isinstance(n, LFor) for t in n.private} == moved, str(ir)
        for g, w in zip(k(*args), k(*args, backend="numpy")):
            assert_matches(g, w, N * 4, k.name)


def test_a_failed_partial_rows_allocation_is_a_located_error_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built so that the allocation of the partial rows fails, the call raises a located
    TcRuntimeError naming the sum and leaves the caller's out= buffers as they were."""
    monkeypatch.setenv("CC", shlex.join([*toolchain.compiler(), "-Dtc_aligned_alloc(a,s)=((void *)0)"]))
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path))
    bwd, args = _layernorm_backward(1500, 260)
    assert "partial rows" in bwd.source(*args)
    outs = [np.full((1500, 260), 7.0, np.float32), np.full(260, 7.0, np.float32), np.full(260, 7.0, np.float32)]
    with pytest.raises(TcRuntimeError, match="could not allocate .* bytes for the partial sums of 'd_(G|Bt)'") as e:
        bwd(*args, out=outs)
    assert e.value.location is not None
    assert all((o == 7.0).all() for o in outs)
