"""Vector loops: ``LFor -> VectorLoop | None``, and a vectorisable pointwise loop written in the
target's explicit vectors (codegen.vecisa).

An innermost ``omp simd`` loop of float32 or float64 ``=`` statements of one type, with a constant trip count of at
least one vector, whose target and reads run along the loop contiguously (or not at all: a
broadcast), and whose value is built from ``+ - * /``, negation and the float32 builtins ``exp``,
``tanh``, ``log`` and ``sigmoid``: softmax's ``e(n, d) = exp(X(n, d) - mx(n))``. Auto-vectorised,
each vector of such a loop calls the out-of-line vector ``exp``, and every call clobbers every
vector register; written out, ``exp`` is inlined and its constants stay in registers (softmax
1.12 -> 0.95 ms on 2 threads). The arithmetic is the scalar loop's, lane by lane: with ``+ - * /``
both give the same bits, and with ``exp`` where the scalar loop calls the layer's ``exp`` as its
vector variant (x86 with GCC on AVX-512: codegen.cprelude.vector_exp; elsewhere libm's or libmvec's
expf). ``tanh`` and ``log`` are codegen.vecisa's (within 2 and 1 ulp, where libm's and libmvec's
are within 4), so they may differ from the scalar loop's in the last bits; they are used where
libmvec has vector variants too, as fast or faster in these loops and never falling back to
scalar calls on special lanes (codegen.vecexpr.LOOP_CALLS). A loop with ``exp`` keeps its simd
form where libmvec's expf is the faster (codegen.vecexpr.libmvec_exp: AVX2 and older), unless it
prefetches: then it calls libmvec's vector expf by name (the same function, so the same bits).

In a kernel that outgrows the caches, outputs written once bypass them (``streamed``) and the
inputs a loop alone reads are prefetched ahead of its vectors (``_along``).

A trip count that is not a whole number of vectors ends with a vector overlapping the one before
it, which recomputes and rewrites the same values; where a statement of the loop reads what one
of them writes (an update in place), rerun lanes would not, and the loop keeps its scalar form.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Binop, Read, Statement, TExpr, operands, reads
from tcdsl.polyhedral.cputarget import LINE
from tcdsl.polyhedral.loopir import LAccum, LCall, LExpr, LFor, LInt, LOp, LVar, expr_vars, trip_count

from .cexpr import ExprEmitter
from .cprelude import simd_letter
from .facts import Facts
from .vecexpr import (
    REDUCTIONS,
    VECTOR_DTYPES,
    elem_step,
    libmvec_exp,
    moving_exp,
    plus_var,
    substitute,
    vector_expr,
    vexpr,
)
from .vecisa import vector_type
from .writer import unparen


@dataclass(frozen=True)
class VectorLoop:
    loop: LFor
    calls: tuple[tuple[LCall, Statement, str], ...]  # each statement, and its index that moves with the loop
    trips: int
    lanes: int
    overlap: bool  # the last vector overlaps the one before
    stream: frozenset[str] = frozenset()  # tensors whose whole vectors bypass the caches (streamed)
    prefetch: frozenset[str] = frozenset()  # tensors read along the loop, fetched PREFETCH_BYTES ahead
    masked: bool = False  # the last elements in a masked vector instead (an update in place)
    # inputs whose elements the next iteration of the `omp` loop around reads, fetched that many bytes
    # ahead (``_next_rows``), and that loop's variable
    next_rows: tuple[tuple[str, int], ...] = ()
    row_loop: str = ""

    def __str__(self) -> str:
        last = " + 1 masked" if self.masked else " + 1 overlapping" if self.overlap else ""
        return (f"{self.trips // self.lanes} x {self.lanes} lanes" + last
                + (f", streaming {', '.join(sorted(self.stream))}" if self.stream else "")
                + (f", prefetching {', '.join(sorted(self.prefetch))}" if self.prefetch else "")
                + "".join(f", prefetching {t}'s next {self.row_loop} row ({b} bytes ahead)" for t, b in self.next_rows))


def plan(em: Facts, n: LFor, rows: tuple[LFor, frozenset[str]] | None = None,
         loops: tuple[LFor, ...] = ()) -> VectorLoop | None:
    """The vector form of the simd loop ``n``, or None where it has none; ``rows``: the `omp` loop
    whose body holds ``n`` and the tensors the nests before ``n`` in that body read (``_next_rows``);
    ``loops``: the loops around ``n``, outermost first (``_whole_lines``)."""
    if not (em.VECTOR_TILES and em.vectorize and n.simd and not n.omp and n.step == 1 and isinstance(n.init, LInt)):
        return None
    trips = trip_count(n)
    if trips is None or not n.body or not all(isinstance(b, LCall) for b in n.body):
        return None
    dtypes = {em.tensors[em.scop.tc_statement(b.stmt).tensor].dtype for b in n.body if isinstance(b, LCall)}
    if len(dtypes) != 1 or not dtypes <= set(VECTOR_DTYPES):
        return None
    lanes = em.target.lanes(dtypes.pop())
    if lanes < 2 or trips < lanes:
        return None
    calls = []
    for call in n.body:
        assert isinstance(call, LCall)
        st = em.scop.stmt(call.stmt)
        s = em.scop.tc_statement(call.stmt)
        if st.kind != "update" or s.op != "=" or s.tensor in em.scalars:
            return None
        args = dict(zip(st.indices, call.args))
        along = [name for name, a in args.items() if n.var in expr_vars(a)]
        if len(along) != 1 or along[0] not in s.lhs or not plus_var(args[along[0]], n.var):
            return None
        row = along[0]
        if elem_step(em, s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), row) != 1:
            return None
        if not vector_expr(em, s.rhs, s, row, loop=True):
            return None
        calls.append((call, s, row))
    written = {s.tensor for _, s, _ in calls}
    overlap = trips % lanes != 0
    # rerunning lanes would read what the first run wrote: the last elements in a masked vector
    masked = overlap and any(r.tensor in written for _, s, _ in calls for r in reads(s.rhs))
    stream = frozenset(s.tensor for call, s, row in calls
                       if streamed(em, s.tensor) and _whole_lines(em, call, s, row, n, loops))
    large = PREFETCH_BYTES > 0 and _large(em)
    ahead = frozenset(r.tensor for _, s, row in calls for r in _along(em, s, row)) if large else frozenset()
    after = _next_rows(em, calls, rows) if rows is not None else ()
    if libmvec_exp(em) and any(moving_exp(em, s.rhs, s, row) for _, s, row in calls) and \
            not ((ahead or after) and simd_letter(em.target) is not None):
        return None  # the simd form calls libmvec's exp as well, and there is nothing to prefetch
    return VectorLoop(n, tuple(calls), trips, lanes, overlap and not masked, stream, ahead, masked, after,
                      rows[0].var if after and rows is not None else "")


NEXT_ROW_LINES = 4  # the next iteration's elements at least this many cache lines ahead (else the lines are the same)


def _next_rows(em: Facts, calls: list[tuple[LCall, Statement, str]], rows: tuple[LFor, frozenset[str]]) \
        -> tuple[tuple[str, int], ...]:
    """The inputs this loop reads along its row that a nest before it in the same iteration of the
    `omp` loop around read too (softmax's rows: their maximum first, then the exponentials), with the
    bytes between an element and the one the loop's next iteration reads. The first nest brought the
    row into the caches, so this loop finds it there and computes; fetching the next iteration's
    elements meanwhile overlaps the memory stream with that work, where the hardware's prefetcher
    stops at the row's end until the next row's first loads. Softmax 4096x1024 on a 2 MiB-L2 Xeon,
    AVX-512, 2 threads (a hand-built kernel, interleaved): 1.93 -> 1.75 ms and 2.03 -> 1.93 ms
    one row ahead."""
    outer, before = rows
    inputs = {t.name for t in em.c.inputs}
    out: dict[str, int] = {}
    for call, s, row in calls:
        st = em.scop.stmt(call.stmt)
        args = dict(zip(st.indices, call.args))
        moving = [i for i, a in args.items() if outer.var in expr_vars(a)]
        if len(moving) != 1 or not plus_var(args[moving[0]], outer.var):
            continue
        for r in reads(s.rhs):
            if r.tensor not in inputs or r.tensor not in before or not _row_read(em, r, row):
                continue
            step = elem_step(em, r.tensor, tuple(x for x in r.subs if isinstance(x, Sym)), moving[0])
            nbytes = (step or 0) * outer.step * np.dtype(em.tensors[r.tensor].dtype).itemsize
            if nbytes >= NEXT_ROW_LINES * LINE:
                out.setdefault(r.tensor, nbytes)
    return tuple(sorted(out.items()))


def _row_read(em: Facts, r: Read, row: str) -> bool:
    """Whether ``r`` reads along ``row`` one element apart, every subscript affine."""
    subs = tuple(x for x in r.subs if isinstance(x, Sym))
    return len(subs) == len(r.subs) and elem_step(em, r.tensor, subs, row) == 1


# stream outputs when the kernel's inputs and outputs take at least the whole last-level cache: below
# that, the output stays in the cache for the next kernel (softmax backward 2000x1000 after its
# forward, 24 MB in a 32 MB L3: 0.77 ms streamed, 0.55 ms stored plainly, torch 0.59 ms)
STREAM_SHARE = 1
PREFETCH_BYTES = 1024  # how far ahead of a vector loop its reads along the loop are fetched (0: none)


def _large(em: Facts) -> bool:
    """The kernel's inputs and outputs take at least 1/STREAM_SHARE of the last-level cache."""
    c = em.c
    nbytes = sum(math.prod(em.shapes[t.name]) * np.dtype(t.dtype).itemsize for t in (*c.inputs, *c.outputs))
    return nbytes * STREAM_SHARE >= em.target.l3


def _along(em: Facts, s: Statement, row: str) -> list[Read]:
    """The reads of ``s`` from inputs that no other statement reads, running along the loop's row
    in memory one element apart: in a large kernel (``_large``) they come from memory, and a loop
    whose vectors take many instructions each (tanh, exp) leaves the hardware's prefetcher behind
    (tanh(A*B+C), 16M floats, 2 threads, explicit prefetches 1 KB ahead: AVX2 14.8 -> 11.7 ms,
    AVX-512 11.0 -> 8.9 ms; plain A*B+C the same either way). An input another statement reads
    too (softmax's rows, read by their maximum first) may be in the caches already, and so may a
    read that misses one of the statement's indices (a bias row)."""
    inputs = {t.name for t in em.c.inputs}
    once = {t for t in inputs if sum(any(r.tensor == t for r in reads(st.rhs)) for st in em.c.stmts) == 1}
    out = []
    for r in reads(s.rhs):
        subs = tuple(x for x in r.subs if isinstance(x, Sym))
        if (r.tensor in once and id(r) not in em.hoisted and len(subs) == len(r.subs)
                and set(s.lhs) <= {i for x in subs for i in x.indices()} and elem_step(em, r.tensor, subs, row) == 1):
            out.append(r)  # each element read once: a read that misses an index is reused from the caches
    return out


def _whole_lines(em: Facts, call: LCall, s: Statement, row: str, n: LFor, loops: tuple[LFor, ...]) -> bool:
    """Whether the loop's stores of ``s`` fill whole cache lines, each line by whole vectors of
    one iteration: the row starts on a line (its index's first value a whole number of lines of
    elements for every value of the loops around, ``loops``; every other index's stride too, given
    a line-aligned array) and runs whole lines. A streamed store that covers part of a line writes
    that part to memory alone, and a plain store to a line a streamed one began waits for it
    (softmax 4096x1000, rows of 4000 bytes, AVX-512 on 2 threads, interleaved: 1.66 ms stored
    plainly, 1.89 ms streamed; 4096x1024 1.78 and 1.44 ms)."""
    per_line = LINE // np.dtype(em.tensors[s.tensor].dtype).itemsize
    args = dict(zip(em.scop.stmt(call.stmt).indices, call.args))
    trips = trip_count(n)
    if not isinstance(n.init, LInt) or trips is None or trips % per_line:
        return False
    start = substitute(args[row], {n.var: n.init.value})
    if not _multiple(start, per_line, {g.var: g for g in loops}):
        return False
    return all(stride % per_line == 0 for i, stride in zip(s.lhs, em.strides[s.tensor]) if i != row)


def _multiple(e: LExpr, k: int, loops: dict[str, LFor]) -> bool:
    """Whether ``e`` is a multiple of ``k`` for every value of the loops in it (``loops``: each
    loop's first value and step multiples of ``k``), as far as its form shows."""
    if isinstance(e, LInt):
        return e.value % k == 0
    if isinstance(e, LVar):
        g = loops.get(e.name)
        return g is not None and g.step % k == 0 and _multiple(g.init, k, loops)
    if isinstance(e, LOp) and e.op == "+":
        return all(_multiple(a, k, loops) for a in e.args)
    if isinstance(e, LOp) and e.op == "*":
        return any(_multiple(a, k, loops) for a in e.args)
    return False


def streamed(em: Facts, tensor: str) -> bool:
    """Whether the stores of ``tensor`` bypass the caches: an output written by one ``=`` statement
    and read by none (the kernel never reads it back, and the caller reads it after the whole
    kernel), in a kernel whose inputs and outputs together take at least 1/STREAM_SHARE of the
    last-level cache, so that the output would be evicted before anyone reads it. A plain store
    first reads the line it writes (write-allocate): streaming saves that read (softmax 4096x1024
    1.37 -> 1.25 ms on 2 threads)."""
    c = em.c
    if tensor not in {t.name for t in c.outputs} or tensor in c.accumulates:
        return False
    if [st.tensor for st in c.stmts].count(tensor) != 1 or any(r.tensor == tensor for st in c.stmts
                                                                for r in reads(st.rhs)):
        return False
    return _large(em)


def emit(em: ExprEmitter, vl: VectorLoop) -> None:
    """The loop in whole vectors, then the last vector (overlapping) when the trip count is not
    a whole number of them."""
    w, n = em.w, vl.loop
    assert isinstance(n.init, LInt)
    lo = n.init.value
    lanes = vl.lanes
    whole = vl.trips // lanes * lanes
    w.line(f"for (long {n.var} = {lo}; {n.var} < {lo + whole}; {n.var} += {lanes}) {{")
    with w.indent():
        _body(em, vl)
    w.line("}")
    if vl.overlap:
        w.line(f"{{  // the last {lanes} of {vl.trips}, overlapping the vector before")
        with w.indent():
            w.line(f"const long {n.var} = {lo + vl.trips - lanes};")
            _body(em, vl, tail=True)
        w.line("}")
    elif vl.masked:
        w.line(f"{{  // the last {vl.trips - whole} of {vl.trips}, in a masked vector")
        with w.indent():
            w.line(f"const long {n.var} = {lo + whole};")
            _body(em, vl, tail=True, rest=vl.trips - whole)
        w.line("}")


def _body(em: ExprEmitter, vl: VectorLoop, tail: bool = False, rest: int = 0) -> None:
    """One vector of the loop's statements; with ``rest``, its first ``rest`` lanes only (masked
    loads along the row, a masked store)."""
    fetched: set[str] = set()
    for call, s, row in vl.calls:
        st = em.scop.stmt(call.stmt)
        em.w.line(f"{{  // statement {s.number} (line {s.span.line})")
        with em.w.indent():
            env: dict[str, str] = {}
            for k, (name, arg) in enumerate(zip(st.indices, call.args)):
                em.w.line(f"const long x{k} = {unparen(em._lexpr(arg))};")
                env[name] = f"x{k}"
            nexts = dict(vl.next_rows)
            ahead = [(r, PREFETCH_BYTES) for r in (_along(em, s, row) if vl.prefetch and not tail else ())]
            ahead += [(r, nexts[r.tensor]) for r in (reads(s.rhs) if nexts and not tail else ())
                      if r.tensor in nexts and _row_read(em, r, row)]  # the next row's elements
            for r, nbytes in ahead:
                at = em._read(r, env, s)
                if at not in fetched:  # a prefetch never faults, past the end too
                    fetched.add(at)  # (an address, not a pointer past the array: integer arithmetic)
                    em.w.line(f"__builtin_prefetch((const void *)((uintptr_t)&{at} + {nbytes}));")
            target = em._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env)
            v = vector_type(s.rhs.dtype)
            value = vexpr(em, s.rhs, env, s, row)
            if rest:
                assert f"{v}_gather(" not in value  # plan's reads: along the row, or broadcast
                em.w.line(f"{v}_store_n({rest}, &{target}, {value.replace(f'{v}_load(', f'{v}_load_n({rest}, ')});")
            else:
                store = "_stream" if s.tensor in vl.stream and not tail else "_store"
                em.w.line(f"{v}{store}(&{target}, {value});")
        em.w.line("}")


ACCUM_PARTS = 4  # vector accumulators of a row reduction: a sum's adds overlap (4-cycle latency, 2 pipes)
# the shortest reduction loop that runs in one masked vector where it is shorter than a vector: the
# weight gradient of a conv on 8x8 images (32 images, 4 filters, 3x3 window padded by 1) 41 -> 12 us
# on AVX-512, where GCC's `omp simd` sum of 7 or 8 columns ran in scalars
MIN_TRIPS = 4


@dataclass(frozen=True)
class VectorAccum:
    """A reduction nest (codegen.lower.accumulation) whose innermost loop runs in explicit vectors:
    ``parts`` accumulators of ``lanes`` lanes take its whole vectors in turn, and where the loop is
    not a whole number of vectors, one more takes its last ``trips % lanes`` elements in a masked
    vector (reading only them; the other lanes add the identity). A loop shorter than a vector (at
    least MIN_TRIPS: a weight gradient's 8-column rows on AVX-512) runs in that masked vector alone.
    The accumulators live across the loops around it, and are combined at the end, lane by lane,
    into the local. With one `omp simd` accumulator each add waits for the one before (a sum of a
    1024-row: 64 dependent adds); the order of the sum is unspecified either way, and max/min give
    the same value."""
    accum: LAccum
    stmt: Statement
    row: str
    trips: int
    lanes: int
    parts: int

    @property
    def rest(self) -> int:
        return self.trips % self.lanes

    def __str__(self) -> str:
        rows = f" per {self.accum.loops[-1].var} row" if len(self.accum.loops) > 1 else ""
        if self.trips < self.lanes:
            return f"{self.trips} of {self.lanes} lanes masked" + rows
        return f"{self.parts} x {self.lanes} lanes" + (f" + {self.rest} masked" if self.rest else "") + rows


def plan_accum(em: Facts, a: LAccum) -> VectorAccum | None:
    """The vector form of accumulation ``a`` (its innermost loop), or None where it has none."""
    n = a.loops[-1]
    if not (em.VECTOR_TILES and em.vectorize and a.simd and n.step == 1 and isinstance(n.init, LInt)):
        return None
    trips = trip_count(n)
    st = em.scop.stmt(a.call.stmt)
    s = em.scop.tc_statement(a.call.stmt)
    dtype = em.tensors[s.tensor].dtype
    if trips is None or st.kind != "update" or s.op not in REDUCTIONS or dtype not in VECTOR_DTYPES:
        return None
    lanes = em.target.lanes(dtype)
    args = dict(zip(st.indices, a.call.args))
    along = [name for name, arg in args.items() if n.var in expr_vars(arg)]
    if lanes < 2 or trips < min(lanes, MIN_TRIPS) or len(along) != 1 or not plus_var(args[along[0]], n.var):
        return None
    if not vector_expr(em, s.rhs, s, along[0], loop=True):
        return None
    parts = max(1, min(ACCUM_PARTS, trips // lanes))
    # jammed (``jam``): each element its own accumulators, one of whole vectors and one masked
    return VectorAccum(a, s, along[0], trips, lanes, 1 if a.jam else parts)


_IDENTITY = {"+": "_zero()", "*": "_set1(1)", "max": "_set1(-INFINITY)", "min": "_set1(INFINITY)"}


def _vop(v: str, op: str, a: str, b: str) -> str:
    return f"{v}_{op}({a}, {b})" if op in ("max", "min") else f"{a} {op} {b}"


def _update(em: ExprEmitter, va: VectorAccum, q: str, args: tuple[LExpr, ...], off: int = 0, rest: int = 0) -> None:
    """Accumulator ``q`` takes the sum's statement at ``args`` (its call's, or a jammed element's)
    as a vector ``off`` past the innermost loop's index; with ``rest``, its next ``rest`` elements
    only, and the identity in the other lanes: masked loads of the first ``rest`` lanes, or where
    whole vectors came before and masked loads are slow (``_top``), the overlapping vector that
    ends with the row, with the lanes it shares with the vector before zeroed."""
    w, s = em.w, va.stmt
    v = vector_type(s.rhs.dtype)
    identity = _IDENTITY[s.op]
    st = em.scop.stmt(va.accum.call.stmt)
    top = bool(rest) and _top(em, va)
    if top:
        off += rest - va.lanes
    w.line("{")
    with w.indent():
        env: dict[str, str] = {}
        for k, (name, arg) in enumerate(zip(st.indices, args)):
            shift = (f" + {off}" if off > 0 else f" - {-off}") if off and name == va.row else ""
            w.line(f"const long x{k} = {unparen(em._lexpr(arg))}{shift};")
            env[name] = f"x{k}"

        def value(e: TExpr, select: bool = True) -> str:
            text = vexpr(em, e, env, s, va.row)
            if not rest:
                return text
            assert f"{v}_gather(" not in text  # plan_accum's reads: along the row, or broadcast
            masked = text.replace(f"{v}_load(", f"{v}_load_top({rest}, " if top else f"{v}_load_n({rest}, ")
            if not select:
                return masked
            return f"{v}_select(m, {masked}, {v}{identity if e is s.rhs else '_zero()'})"

        # two reads along the row load zeros outside the rest: their product adds zero there
        loads = _row_product(em, va, env)
        if rest and not loads:
            w.line(f"const {v}i m = {v}_{'last' if top else 'first'}({rest});")
        w.line(_step(v, s, q, lambda e: value(e, not loads)))
    w.line("}")


def _top(em: Facts, va: VectorAccum) -> bool:
    """A sum's last elements read as the overlapping vector that ends with the row (``_update``):
    where whole vectors came before it (so the vector reads inside the row) and the target's masked
    loads are slow. AVX2's ``vmaskmovps`` on AMD (Zen 1, 2 threads): conv 6x24x30x30, 40 filters
    3x3, weight gradient (28-wide rows: 3 vectors and 4 elements) 3.39 -> 1.72 ms; SSE2, NEON and
    generic vectors load the elements one by one. AVX-512's masked loads are as fast as plain ones."""
    return va.trips >= va.lanes and em.target.isa != "avx512"


def _row_product(em: ExprEmitter, va: VectorAccum, env: dict[str, str]) -> bool:
    """Whether the sum's update is a multiply-add of two reads along the row (vector loads at
    ``env``)."""
    s = va.stmt
    v = vector_type(s.rhs.dtype)
    return _fused(s) and all(isinstance(x, Read) and vexpr(em, x, env, s, va.row).startswith(f"{v}_load(")
                             for x in operands(s.rhs))


def _fused(s: Statement) -> bool:
    """Whether the sum's update is one multiply-add a point, as the scalar code's."""
    return s.op == "+" and isinstance(s.rhs, Binop) and s.rhs.op == "*"


def _step(v: str, s: Statement, q: str, text: Callable[[TExpr], str]) -> str:
    """The line that updates accumulator ``q`` by the sum's value, each operand as ``text`` gives it."""
    if _fused(s):
        assert isinstance(s.rhs, Binop)
        return f"{q} = {v}_fma({text(s.rhs.lhs)}, {text(s.rhs.rhs)}, {q});"
    return f"{q} = {_vop(v, s.op, q, text(s.rhs))};"


def _open(em: ExprEmitter, loops: tuple[LFor, ...]) -> None:
    """``for`` lines of ``loops``, outermost first, each body indented (closed by the caller)."""
    for o in loops:
        em.w.line(f"for ({em.ITYPE} {o.var} = {unparen(em._lexpr(o.init))}; {unparen(em._lexpr(o.cond))}; "
                  f"{o.var} += {o.step}) {{")
        em.w.push()


def emit_accum(em: ExprEmitter, va: VectorAccum) -> None:
    """The accumulation into the local ``acc`` (declared and stored by the caller)."""
    w, n, s = em.w, va.accum.loops[-1], va.stmt
    assert isinstance(n.init, LInt)
    v = vector_type(s.rhs.dtype)
    lo, end, lanes, step = n.init.value, n.init.value + va.trips, va.lanes, va.parts * va.lanes
    identity = _IDENTITY[s.op]

    def vop(a: str, b: str) -> str:
        return _vop(v, s.op, a, b)

    def update(q: str, off: int, rest: int = 0) -> None:
        _update(em, va, q, va.accum.call.args, off, rest)

    names = [f"q{j}" for j in range(va.parts)] + ["qt"] * bool(va.rest)
    w.line(f"{v} " + ", ".join(f"{q} = {v}{identity}" for q in names) + ";")  # before the outer loops
    _open(em, va.accum.loops[:-1])
    w.line(f"long {n.var} = {lo};")
    w.line(f"for (; {n.var} + {step} <= {end}; {n.var} += {step}) {{")
    with w.indent():
        for j in range(va.parts):
            update(f"q{j}", j * lanes)
    w.line("}")
    if va.trips % step >= lanes:
        w.line(f"for (; {n.var} + {lanes} <= {end}; {n.var} += {lanes}) {{")
        with w.indent():
            update("q0", 0)
        w.line("}")
    if va.rest:
        update("qt", 0, va.rest)
    for _ in va.accum.loops[:-1]:
        w.pop()
        w.line("}")
    if va.rest:
        w.line(f"q0 = {vop('q0', 'qt')};")
    width = 1
    while width < va.parts:
        for j in range(0, va.parts - width, 2 * width):
            w.line(f"q{j} = {vop(f'q{j}', f'q{j + width}')};")
        width *= 2
    scalar = f"tc_{s.op}(acc, q0[l])" if s.op in ("max", "min") else f"acc {s.op} q0[l]"
    w.line(f"for (int l = 0; l < {lanes}; l++) acc = {scalar};")


def jam(em: Facts, n: LFor) -> LFor | LAccum | None:
    """``n`` with short loops of its perfect nest around a vector sum (an ``LAccum`` over a nest: a
    weight gradient's batch, rows and columns) taken into the sum, each element with an
    accumulator of its own (a row's last, masked vector adds zeros in its other lanes, into the
    same one): the loads their reads share are made once per vector, not once per element. The
    innermost loops are taken (a weight gradient's window columns, or its whole window), and
    possibly a strip of a parallel loop further out (``_strips``: its filters, which share the
    input's loads), or strips of two loops where no loop it could take shifts a read along the
    vectors (``_strip_sets``); of the ways that keep the accumulators within the target's, the
    one with the fewest loads per multiply-add (``_loads``). None where there is no such nest.
    Weight gradients on 2 threads (AVX-512): conv 8x16x32x32, 3x3, 1.45 -> 0.76 ms; group conv 8x32x16x28x28, 17.9 ->
    10.2 ms. AVX2 (Zen 1): the window's columns for 4 filters (12 accumulators, 7 loads for 12
    multiply-adds) rather than the whole window for one filter (9, 10 loads for 9): conv
    8x16x32x32, 32 filters 3x3, 1.44 -> 1.07 ms."""
    chain = [n]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], LFor):
        chain.append(chain[-1].body[0])  # type: ignore[arg-type]
    inner = chain[-1].body
    if len(inner) != 1 or not isinstance(inner[0], LAccum) or inner[0].jam:
        return None
    acc = inner[0]
    s = em.scop.tc_statement(acc.call.stmt)
    if s.op != "+" or em.tensors[s.tensor].dtype not in VECTOR_DTYPES:
        return None
    if plan_accum(em, replace(acc, simd=True, jam=(chain[-1],))) is None:
        return None
    args = dict(zip(em.scop.stmt(acc.call.stmt).indices, acc.call.args))
    bounds = set().union(*(expr_vars(x.init) | expr_vars(x.cond) for x in acc.loops))
    taken: list[LFor] = []
    count = 1
    for f in reversed(chain):
        trips = trip_count(f)
        if f.omp or trips is None or trips < 1 or count * trips > em.target.accumulators or f.var in bounds:
            break
        # each element its own: the loop moves one index of the target, which no other jammed loop moves
        own = [i for i in s.lhs if f.var in expr_vars(args[i])]
        if len(own) != 1 or not plus_var(args[own[0]], f.var) or expr_vars(args[own[0]]) & {g.var for g in taken}:
            break
        taken.insert(0, f)
        count *= trips
    vec = acc.loops[-1].var if acc.loops else None  # the loop the sum runs along in vectors
    moves = _moved(args, s)
    shifted = any(f.var in moved and vec in moved for moved in moves for f in taken)
    best: tuple[tuple[float, int], list[LFor], tuple[tuple[int, int], ...]] | None = None
    for k in range(len(taken) + 1):  # the innermost loops, from all of them to none (strips alone)
        jammed = taken[k:]
        elements = math.prod(trip_count(f) or 1 for f in jammed)
        outer = chain[:len(chain) - len(jammed)]
        # strips alone beside window columns that fill few accumulators with their strips (a 7x7
        # window's: 2 filters x 7) take pairs too (_strip_sets)
        few = not jammed and best is not None and -best[0][1] < PAIRS_FILL * em.target.accumulators
        for strips in _strip_sets(em, outer, jammed, elements, acc, s, pairs=not shifted or few):
            total = elements * math.prod(size for _, size in strips)
            if total < 2:
                continue
            sizes = {f.var: trip_count(f) or 1 for f in jammed}
            sizes.update((outer[at].var, size) for at, size in strips)
            cost = (_loads(em, acc, s, sizes) / total, -total)
            if best is None or cost < best[0]:
                best = (cost, jammed, strips)
    if best is None:
        return None
    _, taken, strips = best
    outer = chain[:len(chain) - len(taken)]
    for at, size in sorted(strips, reverse=True):  # the outer strip's loop first in ``taken``
        var = outer[at].var
        strip_loop = LFor(f"{var}s", LInt(0), LOp("<=", (LVar(f"{var}s"), LInt(size - 1))), 1, (), parallel=True)
        moved = {var: LOp("+", (LVar(var), LVar(strip_loop.var)))}
        call = replace(acc.call, args=tuple(substitute(x, moved) for x in acc.call.args))
        nest: LFor | LCall = call
        loops: list[LFor] = []
        for g in reversed(acc.loops):  # the perfect nest around the call, rebuilt around the new one
            loops.insert(0, replace(g, body=(nest,)))
            nest = loops[0]
        acc = replace(acc, loops=tuple(loops), call=call)
        outer = [*outer[:at], replace(outer[at], step=size), *outer[at + 1:]]
        taken = [strip_loop, *taken]
    a = replace(acc, simd=True, jam=tuple(taken))
    va = plan_accum(em, a)
    assert va is not None
    node: LFor | LAccum = replace(a, vector=va, vector_text=str(va))
    for f in reversed(outer):
        node = replace(f, body=(node,))
    return node


def _loads(em: Facts, acc: LAccum, s: Statement, sizes: dict[str, int]) -> int:
    """The distinct loads of one vector step of the sum with the loops of ``sizes`` taken at once
    (their trip counts, a strip's its size): one per read per value of the taken loops it moves
    (a gathered read, whose index is data: one per element)."""
    args = dict(zip(em.scop.stmt(acc.call.stmt).indices, acc.call.args))
    total = 0
    for r in reads(s.rhs):
        if not all(isinstance(x, Sym) for x in r.subs):
            total += math.prod(sizes.values())
            continue
        moved = {var for var in sizes
                 if any(var in expr_vars(args[i]) for x in r.subs if isinstance(x, Sym) for i in x.indices())}
        total += math.prod(sizes[v] for v in moved)
    return total


# Strips of a parallel loop around a jammed sum that the sum takes at once too (``_strips``): a
# weight gradient's filters share the input's loads (one per tap of the window). AVX-512, 2 threads:
# conv 8x16x32x32, 32 filters 3x3, weight gradient 0.61 -> 0.49 ms (two filters' whole windows,
# paired rounds, faster in 20 of 20).
STRIPS = (2, 3, 4, 6, 8)
PAIRS_FILL = 2 / 3  # window columns whose best strips fill less of the accumulators weigh pairs instead
PARALLEL_UNITS = 4  # a strip leaves the parallel loops around the sum at least this many iterations a core


def _moved(args: dict[str, LExpr], s: Statement) -> list[set[str]]:
    """The loop variables each subscript of each read of ``s`` moves with (``args``: the call's
    argument of each of the statement's indices)."""
    return [{v for i in x.indices() for v in expr_vars(args[i])}
            for r in reads(s.rhs) for x in r.subs if isinstance(x, Sym)]


def _strip_sets(em: Facts, outer: list[LFor], taken: list[LFor], count: int, acc: LAccum,
                s: Statement, pairs: bool) -> list[tuple[tuple[int, int], ...]]:
    """The strips ``jam`` may cut around the sum besides the ``taken`` loops (``count`` elements):
    none, one (``_strips``), or, with ``pairs`` (no loop that could be taken shifts a read along
    the vectors, as a window's columns do), one of each of two loops (a padded conv's
    single-tap weight gradient: 4 filters x 4 channels, 8 loads for 16 multiply-adds, where its 16
    channels alone load 17), within the target's accumulators and leaving the parallel loops around
    the sum PARALLEL_UNITS iterations a core (or as many as they had). 2 threads, 8x16x32x32 padded
    by 1, 32 filters 3x3: AVX-512 5.9 -> 1.6 ms, AVX2 5.5 -> 2.0 ms. Beside taken window columns a
    second strip, or two in their place, saves loads that hit the same cache lines: AVX-512's 4
    filters x 2 channels x 3 columns (10 loads for 24) ran 0.52 ms against 0.48 for 8 filters x 3
    columns (11 for 24). Pairs are weighed too where no loop is taken and the window's columns
    with their best strips fill less than PAIRS_FILL of the accumulators: each tap of a 7x7 window
    summed on its own, 4 filters x 4 channels, 8 loads for 16, rather than 2 filters x the
    window's 7 columns, 9 for 14; 4x16x40x40 padded by 3, 16 filters: AVX-512 1.06 -> 1.00 ms,
    AVX2 1.78 -> 1.31. (3x3 windows, 18 to 24 accumulators with their strips, keep them: a group
    conv's weight gradient, 6x8x12x30x30 with 12 filters a group, ran 3.5 % slower in pairs.)"""
    units = math.prod(trip_count(g) or 1 for g in outer if g.parallel)
    least = min(units, PARALLEL_UNITS * em.target.cores)
    args = dict(zip(em.scop.stmt(acc.call.stmt).indices, acc.call.args))

    def moves(at: int) -> set[str]:  # the target's indices the loop at ``at`` moves
        return {i for i in s.lhs if outer[at].var in expr_vars(args[i])}

    out: list[tuple[tuple[int, int], ...]] = [()]
    for first in _strips(em, outer, taken, count, acc, s):
        out.append((first,))
        for second in _strips(em, outer, taken, count * first[1], acc, s) if pairs else []:
            if second[0] > first[0] and units // (first[1] * second[1]) >= least and \
                    not moves(first[0]) & moves(second[0]):  # each element its own accumulator
                out.append((first, second))
    return out


def _strips(em: Facts, outer: list[LFor], taken: list[LFor], count: int, acc: LAccum,
            s: Statement) -> list[tuple[int, int]]:
    """The ways to cut a loop of ``outer`` into strips whose elements ``jam`` takes at once too, as
    (its position, the strip's size): a parallel loop from 0 by 1, a whole number of strips of more
    than one, every loop inside it up to the sum parallel with bounds that do not move with it, the
    accumulators within the target's, the loop moving one index of the target that no taken loop
    moves, some read that does not move with it (whose loads the strip shares), and the parallel
    loops around the sum left with PARALLEL_UNITS iterations a core (or as many as they had)."""
    st = em.scop.stmt(acc.call.stmt)
    args = dict(zip(st.indices, acc.call.args))
    jammed = {f.var for f in taken}
    out: list[tuple[int, int]] = []
    for at, f in enumerate(outer):
        trips = trip_count(f)
        inside = outer[at + 1:]
        if not (f.parallel and f.step == 1 and f.init == LInt(0) and trips is not None
                and all(g.parallel for g in inside)):
            continue
        if any(f.var in expr_vars(g.init) | expr_vars(g.cond) for g in [*inside, *taken, *acc.loops]):
            continue
        own = [i for i in s.lhs if f.var in expr_vars(args[i])]
        if len(own) != 1 or not plus_var(args[own[0]], f.var) or expr_vars(args[own[0]]) & jammed:
            continue
        if _loads(em, acc, s, {f.var: 2}) == 2 * _loads(em, acc, s, {}):
            continue  # every read moves with it: a strip shares no load
        units = math.prod(trip_count(g) or 1 for g in outer if g.parallel)  # what the threads share
        out.extend((at, size) for size in STRIPS
                   if trips % size == 0 and trips > size and count * size <= em.target.accumulators
                   and units // size >= min(units, PARALLEL_UNITS * em.target.cores))
    return out


def _subst(e: LExpr, values: dict[str, int]) -> LExpr:
    """``e`` with the loop variables of ``values`` replaced by their values."""
    if isinstance(e, LVar) and e.name in values:
        return LInt(values[e.name])
    if isinstance(e, LOp):
        return LOp(e.op, tuple(_subst(x, values) for x in e.args))
    return e


def emit_jammed(em: ExprEmitter, va: VectorAccum, ctype: str) -> None:
    """The jammed sum (``jam``): each element of the jammed loops loaded into a local, accumulated
    in vectors of its own across the nest, and stored."""
    w, n, s, a = em.w, va.accum.loops[-1], va.stmt, va.accum
    assert isinstance(n.init, LInt)
    v = vector_type(s.rhs.dtype)
    lo, end, lanes = n.init.value, n.init.value + va.trips, va.lanes
    st = em.scop.stmt(a.call.stmt)
    ranges = []
    for f in a.jam:
        assert isinstance(f.init, LInt)
        ranges.append([f.init.value + k * f.step for k in range(trip_count(f) or 0)])
    combos = [dict(zip((f.var for f in a.jam), c)) for c in itertools.product(*ranges)]
    targets = []
    for k, values in enumerate(combos):
        args = {i: _subst(x, values) for i, x in zip(st.indices, a.call.args)}
        outer = {name: f"({unparen(em._lexpr(args[name]))})" for name in s.lhs}
        targets.append(em._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), outer))
        w.line(f"{ctype} acc{k} = {targets[-1]};")
    names = [f"q{k}" for k in range(len(combos))]
    w.line(f"{v} " + ", ".join(f"{q} = {v}_zero()" for q in names) + ";")

    def update(q: str, values: dict[str, int], rest: int = 0) -> None:
        _update(em, va, q, tuple(_subst(x, values) for x in a.call.args), 0, rest)

    _open(em, a.loops[:-1])
    w.line(f"long {n.var} = {lo};")
    w.line("#pragma GCC unroll 1")  # a step holds the registers: two steps side by side would spill
    w.line(f"for (; {n.var} + {lanes} <= {end}; {n.var} += {lanes}) {{")
    with w.indent():
        _shared_step(em, va, combos)
    w.line("}")
    if va.rest and _shared_tail(em, va):  # the overlapping vector, its loads shared as the step's
        w.line("{")
        with w.indent():
            _shared_step(em, va, combos, va.rest)
        w.line("}")
    elif va.rest:  # the masked vector's other lanes add zero: into the same accumulator
        for k, values in enumerate(combos):
            update(f"q{k}", values, va.rest)
    for _ in a.loops[:-1]:
        w.pop()
        w.line("}")
    for k in range(len(combos)):
        w.line(f"for (int l = 0; l < {lanes}; l++) acc{k} = acc{k} + q{k}[l];")
        w.line(f"{targets[k]} = acc{k};")


def _shared_tail(em: ExprEmitter, va: VectorAccum) -> bool:
    """Whether a jammed sum's last elements take ``_shared_step``'s form too, ``rest`` of them: the
    overlapping vector that ends with the row (``_top``), in a multiply-add of two reads along the
    row, each zeroed in the lanes the vector before summed. Its loads are then shared among the
    elements as the whole vectors' are, instead of each update's own masked pair, which GCC
    schedules all ahead of the multiply-adds and spills (AVX2, the weight gradient of conv+bias+relu
    6x24x30x30: rows of 28, three vectors and 4 lanes). Not after a single whole vector
    (``_one_step``)."""
    env = {name: "0" for name in em.scop.stmt(va.accum.call.stmt).indices}
    return _top(em, va) and not _one_step(em, va) and _row_product(em, va, env)


def _one_step(em: ExprEmitter, va: VectorAccum) -> bool:
    """Rows of one whole vector before the overlapping one (AVX2, 14-wide rows: 8 + 6). There the
    loads stay as they were, each other load folded into its multiply-adds and the last elements
    loaded for each update (``_update``): holding them, or sharing the last vector's, made the weight
    gradient of conv 8x32x29x29 stride 2 slower (0.30 -> 0.36 ms alone; its backward 0.86-1.01 ->
    0.94-1.08 ms, 4 interleaved runs), where rows of three or four vectors gained."""
    return _top(em, va) and va.trips < 2 * va.lanes


def _shared_step(em: ExprEmitter, va: VectorAccum, combos: list[dict[str, int]], rest: int = 0) -> None:
    """One whole-vector step of a jammed sum: each distinct load once, into a local, then one
    update per element; with ``rest``, the overlapping vector of the row's last ``rest`` elements
    instead (``_shared_tail``). Loads that several elements share are held in registers
    (``tc_keep``), as many as the registers beside the accumulators allow: otherwise GCC folds each
    use into its multiply-add as a memory operand, and a strip of filters reloads the input's taps
    for every filter (AVX-512, weight gradient of conv 8x16x32x50, 32 filters 3x3: 20 loads a step
    for 18 multiply-adds instead of 11)."""
    w, s, a = em.w, va.stmt, va.accum
    v = vector_type(s.rhs.dtype)
    st = em.scop.stmt(a.call.stmt)
    loads: dict[str, str] = {}
    lines = []
    back = f" - {va.lanes - rest}" if rest else ""
    for k, values in enumerate(combos):
        env = {name: f"({unparen(em._lexpr(_subst(x, values)))}{back if name == va.row else ''})"
               for name, x in zip(st.indices, a.call.args)}
        lines.append(_step(v, s, f"q{k}", _named_in(em, va, env, loads)))
    if rest:
        loads = {text.replace(f"{v}_load(", f"{v}_load_top({rest}, ", 1): name for text, name in loads.items()}
    uses = {name: sum(len(re.findall(rf"\b{name}\b", line)) for line in lines) for name in loads.values()}
    free = em.target.vector_registers - len(combos) - 1  # one for a folded operand
    kept = set(sorted((n for n in uses if uses[n] > 1), key=lambda n: -uses[n])[:max(0, free)])
    for text, name in loads.items():
        if name in kept:
            w.line(f"{v} {name} = {text}; tc_keep({name});")
    # each other load just before the updates that use it, so that it lives in one register for
    # their span (declared all at once, they outlive the free registers and GCC folds each use
    # into its multiply-add, loading the vector again: AVX2 (Zen 1), conv 8x16x32x32 weight
    # gradient, 4 filters x 3 taps, 13 loads a step instead of 7, 1.33 -> 1.04 ms)
    used = [{n for n in loads.values() if re.search(rf"\b{n}\b", line)} for line in lines]
    order: list[tuple[str, str, list[int]]] = []  # each other load, then the updates it completes
    ready, done = set(kept), [False] * len(lines)
    for text, name in [(t, n) for t, n in loads.items() if n not in kept] + [("", "")]:
        ready.add(name)
        order.append((text, name, [k for k in range(len(lines)) if not done[k] and used[k] <= ready]))
        for k in order[-1][2]:
            done[k] = True
    assert all(done)
    # Held in a register too where the registers allow it (the most of them live at once beside
    # the accumulators and the kept loads): GCC otherwise folds each of its uses into a multiply-add,
    # loading it again (AVX2, weight gradient of conv 6x24x30x30, 40 filters 3x3: 4 filters x 3 taps,
    # 15 loads a step instead of 7, 0.71-0.75 -> 0.47-0.58 ms; the same bits)
    held = [name for _, name, _ in order if name and uses[name] > 1]
    last = {n: max(i for i, (_, _, ks) in enumerate(order) if any(n in used[k] for k in ks)) for n in held}
    at = {name: i for i, (_, name, _) in enumerate(order)}
    most = max((sum(at[n] <= i <= last[n] for n in held) for i in range(len(order))), default=0)
    hold = len(combos) + len(kept) + most <= em.target.vector_registers and not _one_step(em, va)
    for text, name, ks in order:
        if name:
            keep = f" tc_keep({name});" if hold and uses[name] > 1 else ""
            w.line(f"{v} {name} = {text};{keep}" if keep else f"const {v} {name} = {text};")
        for k in ks:
            w.line(lines[k])


def _named_in(em: ExprEmitter, va: VectorAccum, env: dict[str, str], loads: dict[str, str]) -> Callable[[TExpr], str]:
    """An operand's vector text at ``env``, each load named in ``loads``."""
    return lambda e: vexpr(em, e, env, va.stmt, va.row, loads)
