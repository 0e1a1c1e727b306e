"""Vector register tiles: ``LTile -> VectorTile | None``, and the tile written in the
target's explicit vectors (codegen.vecisa: AVX-512, AVX2, SSE2, NEON or generic vector extensions).

A float32 or float64 register tile (see regtile) of a ``+``, ``*``, ``max`` or ``min`` reduction
whose innermost tile loop has a constant trip count of at least one vector and runs along a
contiguous row of the target is written with one vector accumulator per vector of each row.
``max`` and ``min`` are the vector layer's, with the scalar ``tc_max``/``tc_min``'s bits
(NaN-propagating; a tie takes the new value), and start from -inf/+inf where the tile runs the
whole reduction. An int32 sum or product tile of int32 ``+ - *`` takes the vector form too,
exactly (both wrap), where every vector of one step (accumulators, loads, broadcasts) fits in the
registers: no integer multiply takes its broadcast from memory, and AVX2's 6x16 int32 tile
spilled five accumulators (0.74x GCC's own).

Each input vector of one step of the serial loops is loaded once into a register and used by
every row of the tile, and a value that does not move along the row is broadcast once.
Auto-vectorised, the same tile has GCC fold each load into every multiply-add that uses it again
(one load per FMA, most of them across a cache line): conv2d's 4x54 tile ran at a third of one
core's FMA peak that way and at 80 % this way. Where one outer tile loop is partial (6-row tiles
of 1024 rows), the last tile takes a vector tile of its own with the rows left (4), for each such
size the loops around it give (at most REST_SIZES). So does a tile whose row alone is cut short,
where a shifted tile cannot serve: 6x64 tiles of 500 columns end in a 6x52 vector tile (the
weight gradient of a 96x500 -> 900 layer, AVX-512, 2 threads, 60 paired calls: 0.58 -> 0.41 ms,
0.64 -> 0.90 of the FMA peak, the same bits), and where both are cut short, the corner too. A
size with no vector form (2 columns left, fewer than a half vector) takes the scalar tile cut to
that size, its bounds constants; other partial tiles take the general scalar tile. Lanes and the
accumulator budget come from the ``CpuTarget``.

A row that is not a whole number of vectors ends with a vector overlapping the one before it (a
54-wide row in 16 lanes: 0, 16, 32, 38): the overlapped elements are computed twice, from the
same inputs in the same order, and stored twice with the same bits, since every load of the
target happens before the serial loops and every store after them.

A float tile whose target row is not contiguous (the boundary columns polyhedral.split cuts
from a padded conv, run along the image's height) gathers its target and its reads along the row
(``tc_v?_gather``: the ISA's gather with 32-bit offsets on AVX2 and AVX-512) and scatters the
target back once, after the serial loops. Where the target's elements are neighbours along another
tile loop (a conv in vectors of its filters: each filter's output columns), the accumulators along
that loop are stored side by side, each lane's row at once (``tc_v?_scatter_rows``: an 8x8
transpose per 8 lanes on AVX2 and AVX-512): a 46x46 conv's 6x64 tiles ran 1-2 % faster than with
a store per element.

The vector text sits under ``#if TC_VEC`` beside the scalar tile, for compilers without the ISA.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tcdsl.core.affine import Sym, Var
from tcdsl.core.checked import (
    Binop,
    Call,
    Const,
    Convert,
    IndexVal,
    Read,
    Select,
    SizeVal,
    Statement,
    TExpr,
    Unop,
    convert,
    read_tuple,
    reads,
)
from tcdsl.polyhedral.loopir import (
    LExpr,
    LFor,
    LInt,
    LOp,
    LTile,
    LVar,
    expr_text,
    expr_value,
    expr_vars,
    loop_values,
    sum_terms,
    trip_count,
)

from . import divide
from .facts import Facts
from .vecisa import half_type, vector_type
from .writer import LineWriter, unparen

if TYPE_CHECKING:
    from .c import _Emitter

VECTOR_DTYPES = ("float32", "float64")  # pointwise loops and tiles
TILE_SUMS = ("int32",)  # sum and product tiles only: + - * wrap in vectors as in the scalar code, exactly
OPS = {"+": "+", "-": "-", "*": "*"}
LOOP_OPS = {**OPS, "/": "/"}  # a pointwise loop divides too (a tile's sum of quotients does not)
REDUCTIONS = ("+", "*", "max", "min")
LOOP_CALLS = ("exp", "tanh", "log", "sigmoid")  # float32 builtins with a vector form (codegen.vecisa)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")  # a pointwise loop's ?: selects lanes on these
# A pointwise loop calls the layer's tanh and log, written out, even where glibc's libmvec has
# vector variants: they are as fast or faster there and more accurate (16M elements of f(A*B + C),
# 2 threads: tanh AVX2 15.3 against 21.8 ms, AVX-512 8.4 against 9.0; log 0.82 ulp against 3.9, at
# the same speed), and libmvec's take a scalar path for a whole vector when one lane is special:
# log of inputs with negatives (NaN lanes) ran 4 to 6x slower (AVX2 51.6 against 12.8 ms).


def libmvec_exp(em: Facts) -> bool:
    """Whether ``exp`` loops keep their simd form and call libmvec's expf rather than the layer's:
    on AVX2 and older, libmvec's is the faster (0.41 against 0.55 ns per element; SSE2 0.89 against
    1.31; softmax 4096x1024 1.92 against 2.25 ms on 2 threads); on AVX-512 the layer's, with
    vscalefps (0.22 against 0.31)."""
    return em.vector_math and em.target.isa != "avx512"


@dataclass(frozen=True)
class VectorTile:
    rt: LTile
    stmt: Statement
    row: str  # the statement index that runs along the vectors
    starts: tuple[int, ...]  # offsets of the vectors in a row (the last may overlap the one before)
    lanes: int  # elements per vector
    full: tuple[LExpr, ...] = ()  # tests that a partial tile (``c6 <= min(5, N - c3)``) is whole this time
    # a row cut short runs as a whole tile ending at its last element: its first value of the vector
    # loop, and the test that the shifted tile still starts inside the row
    shift: LExpr | None = None
    shift_ok: LExpr | None = None
    stride: int = 1  # elements between the target's neighbours along the row (> 1: gathered and scattered)
    half: bool = False  # the last vector of a row is a half vector (CpuTarget.half_vectors) of lanes // 2
    # a tile cut short across the rows (the last 4 of 64 channels in 6-channel tiles), or along its
    # row (the last 52 of 500 columns): the test that it has that size, and the tile of it in vectors
    rests: tuple[tuple[LExpr, VectorTile], ...] = ()
    # sizes of a partial tile loop that have no vector tile (fewer columns left than a half
    # vector): the test, and the tile of that size, which takes the scalar tile with constant
    # bounds (see _rests)
    scalar_rests: tuple[tuple[LExpr, LTile], ...] = ()
    rolled: tuple[str, ...] = ()  # short serial loops printed as loops, not peeled (see _rolled)
    narrow: bool = False  # every vector a half vector: the row is shorter than a whole one
    # reads along a sliding window of the loop around the tile (a conv's input rows ``h + kh`` along
    # ``h``): the loop, and the reads whose lines the next tile takes first (see _ahead)
    ahead: tuple[LFor, tuple[Read, ...]] | None = None
    # the whole tile and ``rests`` cover every tile the loops around give (the row loop the only
    # partial one, each of its sizes a vector tile): no scalar tile is needed beside them
    covers: bool = False
    # a scattered target (``stride`` > 1) whose elements are neighbours along one of the other tile
    # loops (a conv's filters in the lanes, its output columns across the tile): that loop's place
    # in ``rt.inner``; its accumulators are stored side by side (``tc_v?_scatter_rows``)
    across: int | None = None

    @property
    def width(self) -> int:
        """The lanes of the row's vectors (of the whole ones, where the last is a half vector)."""
        return self.lanes // 2 if self.narrow else self.lanes

    def is_half(self, start: int) -> bool:
        """The vector at ``start`` in a row is a half vector."""
        return self.narrow or (self.half and start == self.starts[-1])

    def __str__(self) -> str:
        text = f"{len(self.starts)}x{self.width} lanes per row along {self.row}, starts {list(self.starts)}"
        if self.narrow:
            text += ", half vectors"
        elif self.half:
            text += f", the last a half vector of {self.lanes // 2}"
        if self.stride != 1:
            text += f", gathered (the row {self.stride} elements apart)"
        if self.across is not None:
            text += f", stored in rows along {self.rt.inner[self.across].var}"
        if self.full:
            text += f", whole when {' && '.join(expr_text(x) for x in self.full)}"
        if self.shift is not None and self.shift_ok is not None:
            text += f", else from {expr_text(self.shift)} when {expr_text(self.shift_ok)}"
        if self.ahead is not None:
            text += f", prefetching {', '.join(sorted({r.tensor for r in self.ahead[1]}))} along {self.ahead[0].var}"
        if self.rolled:
            text += f", {', '.join(self.rolled)} not unrolled"
        for cond, rest in self.rests:
            text += f"; when {expr_text(cond)}, {'x'.join(map(str, rest.rt.extents))}: {rest}"
        for cond, cut in self.scalar_rests:
            text += f"; when {expr_text(cond)}, {'x'.join(map(str, cut.extents))}: scalar"
        if self.covers:
            text += "; no other size"
        return text


def plan(em: Facts, rt: LTile, omp_vars: frozenset[str] = frozenset(),
         loops: tuple[LFor, ...] = (), rests: bool = True) -> VectorTile | None:
    """The vector form of ``rt``, or None where the tile does not have one; ``omp_vars``: the
    `omp parallel for` loops around it, ``loops``: every loop around it, outermost first;
    ``rests``: with the vector tiles of its partial loops cut short (see _rests)."""
    st = em.scop.stmt(rt.call.stmt)
    s = em.scop.tc_statement(rt.call.stmt)
    dtype = em.tensors[s.tensor].dtype
    vector_op = s.op in REDUCTIONS if dtype in VECTOR_DTYPES else s.op in ("+", "*") and dtype in TILE_SUMS
    if not em.vectorize or not vector_op:
        return None
    lanes = em.target.lanes(dtype)
    if s.tensor in em.scalars or s.tensor in em.rows or s.tensor in em.contracted:
        return None
    vec = rt.inner[-1]
    if any(trip_count(f) not in (None, e) for f, e in zip(rt.inner, rt.extents)):
        return None
    extent = rt.extents[-1]
    if lanes < 2 or extent < max(2, lanes // 2):
        return None
    args = dict(zip(st.indices, rt.call.args))
    along = [name for name, a in args.items() if vec.var in expr_vars(a)]
    if len(along) != 1 or along[0] not in s.lhs or not plus_var(args[along[0]], vec.var):
        return None
    row = along[0]
    stride = em.strides[s.tensor][s.lhs.index(row)]
    # a target row that is not contiguous (a one-column boundary piece of a padded conv, its rows
    # along the image's height) is gathered and scattered, its reads gathered too: floats only,
    # offsets within 32 bits
    gather = stride != 1 and dtype in VECTOR_DTYPES
    if stride != 1 and not (gather and 0 < stride * lanes < 2**31):
        return None
    if not vector_expr(em, s.rhs, s, row, gather=gather):
        return None
    rows = 1
    for e in rt.extents[:-1]:
        rows *= e
    # half vectors (a sum of products only): a row's last few elements, where they fit in one; a
    # row shorter than a vector in half vectors alone (``narrow``), the last overlapping the one
    # before: AVX-512, a conv's interior rows 12 wide (8x16x14x14 images, 32 filters) ran in
    # GCC's `omp simd` code
    halves_ok = (em.target.half_vectors and stride == 1 and dtype in VECTOR_DTYPES and s.op == "+"
                 and _half_expr(s.rhs))
    narrow = extent < lanes
    if narrow and not halves_ok:
        return None
    width = lanes // 2 if narrow else lanes
    starts = tuple(range(0, extent - width + 1, width))
    half = narrow or (halves_ok and 0 < extent % lanes <= lanes // 2)
    if extent % width:
        starts += (extent - lanes // 2 if half else extent - lanes,)
    if rows * len(starts) > em.target.accumulators:
        return None
    if dtype in TILE_SUMS and rows * len(starts) + len(starts) + rows > em.target.vector_registers:
        return None  # no multiply-add takes a broadcast from memory: every value of a step is a register
    full = []
    for f, e in zip(rt.inner, rt.extents):
        if trip_count(f) is not None:
            continue
        cond = f.cond
        if not (isinstance(cond, LOp) and cond.op in ("<", "<=") and len(cond.args) == 2):
            return None
        full.append(LOp(">=", (cond.args[1], LInt(_init(f) + e - (1 if cond.op == "<=" else 0)))))
    shift = _shift(em, rt, s, row, args[row], omp_vars) if trip_count(vec) is None else None
    shifted, shift_ok = shift or (None, None)
    if shift_ok is not None and len(full) > 1:  # the other tile loops whole
        shift_ok = LOp("&&", (*full[:-1], shift_ok))
    vector_rests, scalar_rests, every = _rests(em, rt, omp_vars, loops) if rests else ((), (), False)
    covers = every and len(full) == 1 and shift is None and \
        all(not r.full and r.shift is None for _, r in vector_rests)
    across = _across(em, rt, s, args) if stride != 1 else None
    return VectorTile(rt, s, row, starts, lanes, tuple(full), shifted, shift_ok, stride, half, vector_rests,
                      scalar_rests, _rolled(em, rt, s, row), narrow, _ahead(em, rt, s, loops), covers, across)


def _across(em: Facts, rt: LTile, s: Statement, args: dict[str, LExpr]) -> int | None:
    """The first tile loop outside the vectors along which the target moves by one element (see
    ``VectorTile.across``), or None."""
    for k, f in enumerate(rt.inner[:-1]):
        if f.step != 1:
            continue
        moving = [i for i in s.lhs if f.var in expr_vars(args[i])]
        if len(moving) == 1 and plus_var(args[moving[0]], f.var) and em.strides[s.tensor][s.lhs.index(moving[0])] == 1:
            return k
    return None


def _ahead(em: Facts, rt: LTile, s: Statement, loops: tuple[LFor, ...]) -> tuple[LFor, tuple[Read, ...]] | None:
    """The loop just around ``rt`` and the reads of ``s`` that slide along it: a subscript other than
    the last that moves with that loop and with one of the tile's inner serial loops (``h + kh`` of a
    conv's input, the tile one output row, the window's rows inner to its channels). The next tile
    reads one new row of each channel, which the hardware's prefetchers do not fetch ahead (each
    channel's rows are a stream of their own): each step of the outermost serial loop prefetches
    that row for the next tile. Group conv 32x32x16x28x28 (51 MB of input, from memory), 2 threads,
    min of 6 calls in two runs: AVX-512 25.0-26.4 -> 21.5 ms, AVX2 25.3-30.5 -> 22.7-26.2 ms."""
    if not loops or len(rt.serial) < 2 or not isinstance(loops[-1].init, LInt) or \
            any(trip_count(g) is None for g in rt.serial[1:]):
        return None
    around = loops[-1]
    inner = {g.var for g in rt.serial[1:]}
    st = em.scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    out = []
    for r in reads(s.rhs):
        subs = _syms(r)
        if len(subs) != len(r.subs) or r.tensor in em.rows or r.tensor in em.contracted or id(r) in em.packed:
            continue
        for x in subs[:-1]:  # along the last dimension the next tile's lines follow these (the hardware fetches them)
            moved = {v for i in x.indices() if i in args for v in expr_vars(args[i])}
            if around.var in moved and moved & inner and rt.serial[0].var not in moved:
                out.append(r)
                break
    return (around, tuple(out)) if out else None


ROLLED_TRIPS = 16  # serial loops this short, which GCC would peel completely, are candidates for _rolled


def _rolled(em: Facts, rt: LTile, s: Statement, row: str) -> tuple[str, ...]:
    """The short serial loops of ``rt`` that move a broadcast along the tile's rows (a conv tile
    along the output channels whose rows are output columns: ``I(.., w + kw)`` for ``w`` and ``kw``).
    Peeled, their steps broadcast the same elements, which GCC loads once and keeps in registers
    the accumulators need: AVX2 conv2d 8x64x56x56 in 2x8 channels x 6 columns ran at 61 GFLOP/s
    on one thread with the kw loop peeled, 105 with it rolled (a C driver, best of 8)."""
    st = em.scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    rows = {g.var for g in rt.inner[:-1]}
    out = []
    for g in rt.serial:
        trips = trip_count(g)
        if trips is None or trips > ROLLED_TRIPS:
            continue
        for r in reads(s.rhs):
            subs = _syms(r)
            if len(subs) != len(r.subs) or elem_step(em, r.tensor, subs, row) != 0:
                continue  # only broadcasts: a read along the vectors loads other elements every step
            if any(g.var in moved and moved & rows for moved in
                   ({v for i in x.indices() for v in expr_vars(args[i])} for x in subs)):
                out.append(g.var)
                break
    return tuple(out)


REST_SIZES = 2  # the most sizes of a tile loop cut short that take a vector tile each


def _rests(em: Facts, rt: LTile, omp_vars: frozenset[str], loops: tuple[LFor, ...]) \
        -> tuple[tuple[tuple[LExpr, VectorTile], ...], tuple[tuple[LExpr, LTile], ...], bool]:
    """The vector tiles of ``rt`` cut short along its one partial row loop, along the row itself
    (its vector loop), or both, one per size the loops around it give each (at most REST_SIZES):
    the last 4 of 64 output channels in tiles of 6 take a 4-row vector tile, not the scalar tile
    (AVX2 conv2d 8x64x56x56, 6x2 rows: 13.9 against 39 ms; in scalars, a tenth of the channels
    took most of the time), the last 52 of 500 columns in 64-wide tiles a 6x52 tile (see the
    module's docstring), and the last 4 of 100 rows of those columns a 4x52 tile (the rows' tiles,
    cut short along their row in turn). And whether every size the loops give is the whole tile's
    or one of these (enumerated from the loops' bounds: a superset of the sizes a run meets); with
    both cut short, the scalar tile stays for sizes past the enumerated ones.

    A size without a vector tile (4 columns left of 900 in 64-wide tiles, fewer than AVX-512's
    half vector) takes the scalar tile cut to it, its bounds constants, which GCC vectorises
    whole: 96x300 -> 900 weight gradient, AVX-512, 2 threads, 100 paired calls, 0.264 -> 0.241 ms
    (the 4 columns had cost as much as 48 others; 896 columns took 0.250 ms)."""
    last = len(rt.inner) - 1
    partial = [i for i, f in enumerate(rt.inner) if trip_count(f) is None]
    if not 0 < len(partial) <= 2 or (len(partial) == 2 and partial[1] != last):
        return (), (), False
    out = []
    scalar = []
    every = len(partial) == 1
    for i in partial:
        f = rt.inner[i]
        cond = f.cond
        cuts = _cut_sizes(f, rt.extents[i], loops)
        if cuts is None:
            every = False
            continue
        sizes, nonempty = cuts
        every = every and nonempty
        assert isinstance(cond, LOp) and isinstance(f.init, LInt)  # (_cut_sizes)
        shift = 1 if cond.op == "<=" else 0
        for k in sizes:
            cut = replace(f, cond=LOp(cond.op, (LVar(f.var), LInt(f.init.value + k - shift))))
            sub = replace(rt, inner=(*rt.inner[:i], cut, *rt.inner[i + 1:]),
                          extents=(*rt.extents[:i], k, *rt.extents[i + 1:]))
            # rows cut short whose row is cut short too take their own tiles of both (the
            # sub-tile's rests); the row cut short under whole rows is the last case
            vt = plan(em, sub, omp_vars, loops, rests=i != last or len(partial) == 1)
            test = LOp("==", (cond.args[1], LInt(f.init.value + k - shift)))
            if vt is not None:
                out.append((test, vt))
            else:
                every = False
                if i == last or len(partial) == 1:
                    scalar.append((test, replace(sub, split=0, vector=None, vector_text="")))
    return tuple(out), tuple(scalar), every


def _cut_sizes(f: LFor, extent: int, loops: tuple[LFor, ...]) -> tuple[list[int], bool] | None:
    """The sizes short of ``extent`` that the loops around give the partial tile loop ``f``
    (enumerated from their bounds: a superset of the sizes a run meets), largest first, and
    whether none of the sizes is empty; None where they cannot be enumerated or are more than
    REST_SIZES."""
    cond = f.cond
    if not (isinstance(cond, LOp) and cond.op in ("<", "<=") and len(cond.args) == 2 and isinstance(f.init, LInt)):
        return None
    bound = cond.args[1]
    envs = loop_values(loops, expr_vars(bound))
    if envs is None:
        return None
    values = {expr_value(bound, env) for env in envs}
    if None in values:
        return None
    shift = 1 if cond.op == "<=" else 0
    met = {v + shift - f.init.value for v in values if v is not None}
    sizes = sorted(met & set(range(1, extent)), reverse=True)
    if not 0 < len(sizes) <= REST_SIZES:
        return None
    return sizes, all(k >= 1 for k in met)


def _half_expr(e: TExpr) -> bool:
    """``e`` has only what half vectors have: reads, constants, negation, ``+ - *``."""
    if isinstance(e, (Read, Const)):
        return True
    if isinstance(e, Binop):
        return e.op in OPS and _half_expr(e.lhs) and _half_expr(e.rhs)
    return isinstance(e, Unop) and e.op == "-" and _half_expr(e.arg)


def _shift(em: Facts, rt: LTile, s: Statement, row: str, at: LExpr,
           omp_vars: frozenset[str]) -> tuple[LExpr, LExpr] | None:
    """A tile whose row is cut short (the last 6 of a 54-wide conv row in 8-wide tiles) computed as
    a whole tile ending at the row's last element: the elements it shares with the tile before are
    computed again from the identity, in the same order, and stored with the same bits. So only
    where the tile runs the whole reduction from the identity, and where the tile before is in the
    same thread (the loop stepping along the row is not an `omp parallel for` loop)."""
    vec = rt.inner[-1]
    cond = vec.cond
    if not rt.identity or (expr_vars(at) - {vec.var}) & omp_vars:
        return None
    assert isinstance(cond, LOp)
    last = cond.args[1] if cond.op == "<=" else LOp("-", (cond.args[1], LInt(1)))
    start = LOp("-", (last, LInt(rt.extents[-1] - 1)))
    box = next((r for r in s.ranges if r.name == row), None)
    if box is None:
        return None
    lo = box.lo.subs({k: Sym.of(v) for k, v in em.scop.inst.sizes.items()})
    if not lo.is_const():
        return None
    return start, LOp(">=", (substitute(at, {vec.var: start}), LInt(lo.const)))


def plus_var(e: LExpr, var: str) -> bool:
    """``e`` is ``var``, or ``var`` plus or minus terms without it (``(c2 + var) + 1``)."""
    if isinstance(e, LOp) and e.op == "-" and len(e.args) == 2:
        return plus_var(e.args[0], var) and var not in expr_vars(e.args[1])
    terms = sum_terms(e)
    return terms.count(LVar(var)) == 1 and not any(var in expr_vars(t) for t in terms if t != LVar(var))


def vector_expr(em: Facts, e: TExpr, s: Statement, row: str, loop: bool = False, gather: bool = False) -> bool:
    """``e`` is reads, constants, negation, ``+``, ``-``, ``*`` and float ``max``/``min`` of the
    statement's type (float32 or float64; int32 in a tile), and each read is contiguous along the
    row or does not move with it. In a pointwise loop (``loop``) also ``/``, float32 ``sigmoid``,
    ``tanh``, ``log`` and ``exp`` where libmvec's is not the faster (LOOP_CALLS, libmvec_exp),
    values hoisted out of the loop, contracted scalars and row buffers; a register tile reads neither its
    own target nor a buffer it does not index in memory. With ``gather``, reads along the row may
    be any constant number of elements apart (within 32-bit offsets)."""
    if e.dtype != em.tensors[s.tensor].dtype or e.dtype not in VECTOR_DTYPES + (() if loop else TILE_SUMS):
        return False
    e = _lift(e)
    if isinstance(e, Const) or fixed_value(e):
        return True
    if isinstance(e, Binop):
        return (e.op in (LOOP_OPS if loop else OPS) and vector_expr(em, e.lhs, s, row, loop, gather)
                and vector_expr(em, e.rhs, s, row, loop, gather))
    if isinstance(e, Unop):
        return e.op == "-" and vector_expr(em, e.arg, s, row, loop, gather)
    if isinstance(e, Call) and e.fn in ("max", "min"):  # the layer's, with tc_max/tc_min's bits
        return e.dtype in VECTOR_DTYPES and all(vector_expr(em, a, s, row, loop, gather) for a in e.args)
    if isinstance(e, Call) and loop and e.fn in LOOP_CALLS and e.dtype == "float32" and \
            not (e.fn == "exp" and libmvec_exp(em)) and vector_expr(em, e.args[0], s, row, loop):
        return True
    if isinstance(e, Select) and loop and isinstance(e.cond, Binop) and e.cond.op in COMPARISONS and \
            all(vector_expr(em, x, s, row, loop) for x in (e.cond.lhs, e.cond.rhs, e.then, e.other)):
        return True  # a pointwise loop's ?: on a comparison of its values: both sides, then a select
    if isinstance(e, (Call, Convert, Select)):
        return uniform(em, e, s, row, loop)
    if isinstance(e, Read):
        if loop and (id(e) in em.hoisted or e.tensor in em.scalars):
            return True
        if not loop and (e.tensor == s.tensor or e.tensor in em.scalars or e.tensor in em.rows):
            return False
        if e.conditional and not (loop and _in_range(e, s)) or not all(isinstance(x, Sym) for x in e.subs):
            return False
        step = elem_step(em, e.tensor, _syms(e), row)
        if gather and step is not None and e.tensor not in em.rows:
            return abs(step) * em.target.lanes(e.dtype) < 2**31
        return step in (0, 1)
    return False


def uniform(em: Facts, e: TExpr, s: Statement, row: str, loop: bool) -> bool:
    """``e`` does not change along ``row`` (reads that do not move with it, other indices, sizes,
    constants): vectors compute it in scalar code, as the scalar loop does, and broadcast it
    (layernorm's ``rsqrt(var(n) + eps)`` along ``d``). Integer division is left out: its checks
    belong to the scalar code's own evaluation. A register tile (not ``loop``) reads memory only,
    not its own target."""
    if isinstance(e, (Const, SizeVal)):
        return True
    if isinstance(e, IndexVal):
        return e.name != row
    if isinstance(e, Read):
        if loop and (id(e) in em.hoisted or e.tensor in em.scalars):
            return True
        if not loop and (e.tensor == s.tensor or e.tensor in em.scalars or e.tensor in em.rows):
            return False
        return not e.conditional and all(isinstance(x, Sym) for x in e.subs) and \
            elem_step(em, e.tensor, _syms(e), row) == 0
    if isinstance(e, Binop):
        return not (e.op in ("/", "%") and e.lhs.dtype not in VECTOR_DTYPES) and \
            uniform(em, e.lhs, s, row, loop) and uniform(em, e.rhs, s, row, loop)
    if isinstance(e, (Unop, Convert)):
        return uniform(em, e.arg, s, row, loop)
    if isinstance(e, Call):
        return all(uniform(em, a, s, row, loop) for a in e.args)
    if isinstance(e, Select):
        return all(uniform(em, x, s, row, loop) for x in (e.cond, e.then, e.other))
    return False


def _lift(e: TExpr) -> TExpr:
    """A conversion of a ``?:`` between two constants (a float64 statement's ``c ? 1.0 : 0.0``, whose
    literals are float32) as the ``?:`` between the converted constants: the same values."""
    if isinstance(e, Convert) and isinstance(e.arg, Select) and isinstance(e.arg.then, Const) and \
            isinstance(e.arg.other, Const):
        return Select(e.dtype, e.arg.cond, convert(e.arg.then, e.dtype), convert(e.arg.other, e.dtype))
    return e


def _in_range(e: Read, s: Statement) -> bool:
    """A read in a branch of ``?:`` (``conditional``: checked where the branch runs) at the
    subscripts of an unconditional read of the same tensor, which bounds the statement's domain:
    in range at every point, so a vector may load it whichever branch each lane takes."""
    return any(not r.conditional and r.tensor == e.tensor and r.subs == e.subs for r in read_tuple(s.rhs))


def fixed_value(e: TExpr) -> bool:
    """``e`` is a size or constant converted to the statement's type (``X(n, d) / D``), the same
    value in every lane."""
    return isinstance(e, Convert) and isinstance(e.arg, (SizeVal, Const))


def elem_step(em: Facts, tensor: str, subs: tuple[Sym, ...], row: str) -> int | None:
    """Elements of ``tensor``'s buffer (its memory, or the row buffer of a temporary) between
    ``subs`` at one value of ``row`` and the next; None if not linear in ``row``."""
    v = Var(row, "index")
    if tensor in em.rows:
        fixed, shape = em.rows[tensor], em.shapes[tensor]
        strides, stride = [0] * len(shape), 1
        for d in reversed(range(len(shape))):
            if d not in fixed:
                strides[d], stride = stride, stride * shape[d]
    else:
        strides = list(em.strides[tensor])
    step = 0
    for d, sub in enumerate(subs):
        if row in sub.without(v).indices():
            return None
        step += sub.coeff(v) * strides[d]
    return step


def vexpr(em: _Emitter, e: TExpr, env: dict[str, str], s: Statement, row: str,
          loads: dict[str, str] | None = None, lane: int | None = None, half: bool = False) -> str:
    """``e`` as a vector expression (codegen.vecisa); with ``loads``, each distinct load or
    broadcast is named there once (``load text -> local``) and the expression uses the names;
    ``lane``: the vector's offset in its tile row, where a read comes from packed panels; ``half``:
    in half vectors (``_half_expr``), each broadcast the lower half of the full vectors' one."""
    v = vector_type(e.dtype)
    h = half_type(e.dtype) if half else v
    e = _lift(e)
    if isinstance(e, Const) or fixed_value(e):
        return f"{h}_set1({em._expr(e, env, s)})"
    if isinstance(e, Binop):
        a = vexpr(em, e.lhs, env, s, row, loads, lane, half)
        # a quotient whose dividend does not move along the row (``1.0 / D``) is folded or hoisted by GCC
        moves = e.op == "/" and not half and not uniform(em, e.lhs, s, row, True)
        r = divide.of_divisor(e.rhs, em.scop.inst.sizes, em.target.fma) if moves else None
        if r is not None and r.exact:
            return f"({a} * {v}_set1({em._expr(Const(e.dtype, r.hi), env, s)}))"
        if r is not None:
            values = ", ".join(em._expr(Const(e.dtype, x), env, s) for x in (r.divisor, r.hi, r.lo, *r.window))
            return f"tc_vf_divc({a}, {values})"
        b = vexpr(em, e.rhs, env, s, row, loads, lane, half)
        return f"({a} {LOOP_OPS[e.op]} {b})"
    if isinstance(e, Unop):
        return f"(-{vexpr(em, e.arg, env, s, row, loads, lane, half)})"
    if isinstance(e, Call) and e.fn in ("max", "min"):
        return f"{v}_{e.fn}({', '.join(vexpr(em, a, env, s, row, loads, lane) for a in e.args)})"
    if isinstance(e, Select) and not uniform(em, e, s, row, True):  # a comparison's lanes select
        assert isinstance(e.cond, Binop)
        a, b, then, other = (vexpr(em, x, env, s, row, loads, lane, half)
                             for x in (e.cond.lhs, e.cond.rhs, e.then, e.other))
        return f"{v}_select(({v}i)({a} {e.cond.op} {b}), {then}, {other})"
    if isinstance(e, (Convert, Select)) or isinstance(e, Call) and (
            e.fn not in LOOP_CALLS or e.dtype != "float32" or uniform(em, e, s, row, True)):
        return f"{h}_set1({em._expr(e, env, s)})"  # vector_expr's uniform(): once in scalar code, broadcast
    if isinstance(e, Call):
        arg = vexpr(em, e.args[0], env, s, row, loads, lane)
        if e.fn == "sigmoid":  # as the scalar builtin: 1 / (1 + exp(-x))
            return f"(tc_vf_set1(1.0f) / (tc_vf_set1(1.0f) + tc_vf_exp(-{arg})))"
        return f"tc_vf_{e.fn}({arg})"
    assert isinstance(e, Read)
    if e.conditional:  # vector_expr's _in_range: the unconditional read's element, unchecked
        e = replace(e, conditional=False)
    if id(e) in em.packed and lane is not None:  # codegen.pack's pack pass: from the panels
        at = f"{em.packed[id(e)]}{lane}]"
        return _named(f"{h}_load(&{at})", True, loads)
    at = em._read(e, env, s)
    step = None if id(e) in em.hoisted or e.tensor in em.scalars else elem_step(em, e.tensor, _syms(e), row)
    if step == 1:
        return _named(f"{h}_load(&{at})", True, loads)
    if step:  # vector_expr allowed it: a tile with a strided row (never in half vectors)
        return _named(f"{v}_gather(&{at}, {step})", True, loads)
    broadcast = _named(f"{v}_set1({at})", False, loads)
    return f"{h}_lo({broadcast})" if half else broadcast


def _named(text: str, along: bool, loads: dict[str, str] | None) -> str:
    """``text``, or (with ``loads``) the local it is loaded into once."""
    if loads is None:
        return text
    if text not in loads:
        loads[text] = f"{'v' if along else 'b'}{len(loads)}"
    return loads[text]


def _syms(r: Read) -> tuple[Sym, ...]:
    return tuple(x for x in r.subs if isinstance(x, Sym))


def emit(em: _Emitter, vt: VectorTile, identity_start: bool, shift: LExpr | None = None,
         first_chunk: str | None = None) -> None:
    """The tile in vectors: accumulators set (to the identity, or loaded from the target; with
    ``first_chunk``, a C condition, to the identity where it holds and loaded elsewhere), the serial loops
    around one unrolled step of every accumulator, then the stores; with ``shift``, the vector loop
    starts there (``VectorTile.shift``)."""
    rt, s, w = vt.rt, vt.stmt, em.w
    st = em.scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    outer, vec = rt.inner[:-1], rt.inner[-1]
    combos = list(itertools.product(*(range(e) for e in rt.extents[:-1])))
    tiles = [(combo, start) for combo in combos for start in vt.starts]
    acc = {key: f"a{k}" for k, key in enumerate(tiles)}

    def env_at(combo: tuple[int, ...], start: int) -> dict[str, str]:
        values: dict[str, int | LExpr] = {f.var: _init(f) + k for f, k in zip(outer, combo)}
        values[vec.var] = _init(vec) + start if shift is None else LOp("+", (shift, LInt(start)))
        env = {name: f"({em._lexpr(substitute(a, values))})" for name, a in args.items()}
        return env

    def target(combo: tuple[int, ...], start: int) -> str:
        return em._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env_at(combo, start))

    v = vector_type(s.rhs.dtype)
    hv = half_type(s.rhs.dtype) if vt.half else v
    halves = {key for key in tiles if vt.is_half(key[1])}

    def vtype(key: tuple[tuple[int, ...], int]) -> str:
        return hv if key in halves else v

    starts = vt.starts
    overlap = " (the last overlapping the one before)" if len(starts) > 1 and starts[-1] < starts[-2] + vt.width else ""
    if vt.narrow:
        w.line(f"// in {len(starts)} half vectors of {vt.lanes // 2} per row{overlap}")
    elif vt.half:
        w.line(f"// in {len(starts) - 1} vectors of {vt.lanes} and one of {vt.lanes // 2} per row{overlap}")
    else:
        w.line(f"// in {len(starts)} vectors of {vt.lanes} per row{overlap}")
    identity = {"+": "_zero()", "*": "_set1(1)", "max": "_set1(-INFINITY)", "min": "_set1(INFINITY)"}[s.op]

    def load(key: tuple[tuple[int, ...], int]) -> str:
        at = target(*key)
        return f"{vtype(key)}_load(&{at})" if vt.stride == 1 else f"{v}_gather(&{at}, {vt.stride})"

    if first_chunk is not None and not identity_start:  # the reduction's first chunk, or a later one
        for key in tiles:
            w.line(f"{vtype(key)} {acc[key]};")
        w.line(f"if ({first_chunk}) {{")
        with w.indent():
            for key in tiles:
                w.line(f"{acc[key]} = {vtype(key)}{identity};")
        w.line("} else {")
        with w.indent():
            for key in tiles:
                w.line(f"{acc[key]} = {load(key)};")
        w.line("}")
    else:
        for key in tiles:
            value = vtype(key) + identity if identity_start else load(key)
            w.line(f"{vtype(key)} {acc[key]} = {value};")
    for k, loop in enumerate(rt.serial):
        if loop.var in vt.rolled:
            w.line("#pragma GCC unroll 1")
        w.line(f"for (long {loop.var} = {em._lexpr(loop.init)}; {unparen(em._lexpr(loop.cond))}; "
               f"{loop.var} += {loop.step}) {{")
        w.push()
        if k == 0 and vt.ahead is not None:
            _prefetch(em, vt, args, outer, vec, shift)
    loads: dict[str, str] = {}
    updates = []
    for combo, start in tiles:
        key = (combo, start)
        env = env_at(combo, start)

        def vx(e: TExpr, env: dict[str, str] = env, lane: int = start, half: bool = key in halves) -> str:
            return vexpr(em, e, env, s, vt.row, loads, lane, half)

        if s.op in ("max", "min"):  # as the scalar tc_max/tc_min: NaN-propagating, ties to the new value
            updates.append(f"{acc[key]} = {v}_{s.op}({acc[key]}, {vx(s.rhs)});")
        elif s.op == "*":
            updates.append(f"{acc[key]} = {acc[key]} * {vx(s.rhs)};")
        elif isinstance(s.rhs, Binop) and s.rhs.op == "*":
            updates.append(f"{acc[key]} = {vtype(key)}_fma({vx(s.rhs.lhs)}, {vx(s.rhs.rhs)}, {acc[key]});")
        else:
            updates.append(f"{acc[key]} = {acc[key]} + {vx(s.rhs)};")
    # the smaller set of operands first, kept in registers, and the other just before its first
    # use, so that a tile using all but a few registers (AVX2's 12 of 16) holds one of those at a
    # time: matmul's 6x16 tile keeps its 2 row vectors and takes the 6 broadcasts in turn, a conv
    # tile of 2 channels x 6 rows keeps the 2 broadcasts and takes the 6 row vectors in turn
    # (accumulators are independent: their order changes no result)
    vectors = [name for text, name in loads.items() if "_load(" in text or "_gather(" in text]
    first = vectors
    if len(loads) - len(vectors) < len(vectors):
        first = [name for name in loads.values() if name not in vectors]
        rank = {name: i for i, name in enumerate(vectors)}
        updates.sort(key=lambda line: min((rank[n] for n in re.findall(r"\bv\d+\b", line) if n in rank), default=0))
    for text, name in loads.items():
        if name in first:
            w.line(f"{hv if text.startswith(hv + '_') else v} {name} = {text};")
    for name in first:
        w.line(f"tc_keep({name});")
    pending = {name: text for text, name in loads.items() if name not in first}
    for line in updates:
        for name in re.findall(r"\b[bv]\d+\b", line):
            if name in pending:
                text = pending.pop(name)
                w.line(f"{hv if text.startswith(hv + '_') else v} {name} = {text};")
                if name in vectors:
                    w.line(f"tc_keep({name});")
        w.line(line)
    for _ in rt.serial:
        w.pop()
        w.line("}")
    if vt.across is not None:
        _store_rows(w, vt, tiles, acc, target, v)
        return
    for key in tiles:
        if vt.stride == 1:
            w.line(f"{vtype(key)}_store(&{target(*key)}, {acc[key]});")
        else:
            w.line(f"{v}_scatter(&{target(*key)}, {vt.stride}, {acc[key]});")


ROWS_AT_ONCE = 8  # tc_v?_scatter_rows: at most 8 vectors side by side (codegen.vecisa)


def _store_rows(w: LineWriter, vt: VectorTile, tiles: list[tuple[tuple[int, ...], int]],
                acc: dict[tuple[tuple[int, ...], int], str], target: Callable[[tuple[int, ...], int], str],
                v: str) -> None:
    """A scattered tile's stores, the accumulators that are neighbours along ``vt.across`` side by
    side, up to ROWS_AT_ONCE at a time (one left alone is scattered)."""
    assert vt.across is not None
    d = vt.across
    groups: dict[tuple[tuple[int, ...], int], list[tuple[tuple[int, ...], int]]] = {}
    for combo, start in tiles:
        groups.setdefault((combo[:d] + combo[d + 1:], start), []).append((combo, start))
    for keys in groups.values():
        keys.sort(key=lambda key: key[0][d])
        for at in range(0, len(keys), ROWS_AT_ONCE):
            part = keys[at:at + ROWS_AT_ONCE]
            if len(part) == 1:  # a row of one: the transpose would only add shuffles
                w.line(f"{v}_scatter(&{target(*part[0])}, {vt.stride}, {acc[part[0]]});")
                continue
            names = ", ".join(acc[key] for key in part)
            w.line(f"{v}_scatter_rows(&{target(*part[0])}, {vt.stride}, {len(part)}, ({v}[]){{{names}}});")


def _prefetch(em: _Emitter, vt: VectorTile, args: dict[str, LExpr], outer: tuple[LFor, ...], vec: LFor,
              shift: LExpr | None) -> None:
    """At a step of the tile's outermost serial loop, the lines of its sliding reads that the next
    tile along ``vt.ahead``'s loop reads first: the loop one step on, the inner serial loops at
    their last values, the tile's first row at each vector's start."""
    assert vt.ahead is not None
    around, sliding = vt.ahead
    fixed: dict[str, int | LExpr] = {f.var: _init(f) for f in outer}
    fixed[around.var] = LOp("+", (LVar(around.var), LInt(around.step)))
    for g in vt.rt.serial[1:]:
        trips = trip_count(g)
        assert trips is not None  # _ahead
        fixed[g.var] = _init(g) + (trips - 1) * g.step
    seen: set[str] = set()
    for start in vt.starts:
        values = {**fixed, vec.var: _init(vec) + start if shift is None else LOp("+", (shift, LInt(start)))}
        env = {name: f"({em._lexpr(substitute(a, values))})" for name, a in args.items()}
        for r in sliding:
            at = em._access(r.tensor, _syms(r), env)
            if at not in seen:  # an address past the tensor's end (the last tile's next) is never formed
                seen.add(at)
                base, index = at.split("[", 1)
                em.w.line(f"__builtin_prefetch((const void *)((uintptr_t){base} + sizeof(*{base}) * ({index[:-1]})));")


def cases(vt: VectorTile) -> list[tuple[tuple[LExpr, ...], VectorTile, LExpr | None, str]]:
    """The vector forms of a tile with partial loops, in the order they are tested: (the tests,
    the tile, where its vector loop starts if shifted, a comment); the scalar tile takes the rest."""
    out: list[tuple[tuple[LExpr, ...], VectorTile, LExpr | None, str]] = [(vt.full, vt, None, "")]
    if vt.shift is not None and vt.shift_ok is not None:
        out.append(((vt.shift_ok,), vt, vt.shift, f"  // the row's last {vt.rt.extents[-1]}"))
    for test, rest in vt.rests:
        out.append(((test, *rest.full), rest, None, _cut_note(vt.rt, rest.rt)))
        if rest.shift is not None and rest.shift_ok is not None:
            rows = "x".join(map(str, rest.rt.extents[:-1]))
            last = f"  // {rows} rows, the row's last {rest.rt.extents[-1]}"
            out.append(((test, rest.shift_ok), rest, rest.shift, last))
        for test2, both in rest.rests:  # rows cut short whose row is cut short too
            out.append(((test, test2, *both.full), both, None, _cut_note(vt.rt, both.rt)))
    return out


def scalar_cases(vt: VectorTile) -> list[tuple[tuple[LExpr, ...], LTile, str]]:
    """The sizes of a tile with partial loops that take the scalar tile with constant bounds
    (``VectorTile.scalar_rests``, those of its tiles of fewer rows first), tested after ``cases``:
    (the tests, the tile cut to that size, a comment)."""
    out = [((test, test2), cut, _cut_note(vt.rt, cut) + ", in scalars")
           for test, rest in vt.rests for test2, cut in rest.scalar_rests]
    return out + [((test,), cut, _cut_note(vt.rt, cut) + ", in scalars") for test, cut in vt.scalar_rests]


def _cut_note(whole: LTile, cut: LTile) -> str:
    """The comment on the case of ``whole`` cut short to ``cut``: across its rows, along its row, or both."""
    rows = "x".join(map(str, cut.extents[:-1]))
    if cut.extents[-1] == whole.extents[-1]:
        return f"  // {rows} rows"
    if cut.extents[:-1] == whole.extents[:-1]:
        return f"  // the row's last {cut.extents[-1]}"
    return f"  // {rows} rows, the row's last {cut.extents[-1]}"


def _init(f: LFor) -> int:
    assert isinstance(f.init, LInt)  # regtile.match: tile loops start at constants
    return f.init.value


def substitute(e: LExpr, values: Mapping[str, int | LExpr]) -> LExpr:
    """``e`` with the loop variables of ``values`` replaced by their values (constants or
    expressions), constants of sums folded."""
    if isinstance(e, LVar) and e.name in values:
        v = values[e.name]
        return LInt(v) if isinstance(v, int) else v
    if isinstance(e, LOp):
        args = tuple(substitute(a, values) for a in e.args)
        if e.op == "+":  # fold the constants: ``c2 + 16``, not ``c2 + 0 + 16``
            const = sum(a.value for a in args if isinstance(a, LInt))
            rest = tuple(a for a in args if not isinstance(a, LInt))
            args = rest + ((LInt(const),) if const or not rest else ())
            if len(args) == 1:
                return args[0]
        return LOp(e.op, args)
    return e

