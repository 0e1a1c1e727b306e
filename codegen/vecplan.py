"""Vector register tiles, planned: ``LTile -> VectorTile | None``, whether a register tile
(codegen.regtile) is written in the target's explicit vectors, and in which form (lanes, vectors
per row, its partial sizes); codegen.lower's vectorise pass records it, codegen.vectile prints it.

A float32 or float64 register tile (see regtile) of a ``+``, ``*``, ``max`` or ``min`` reduction
whose innermost tile loop has a constant trip count of at least one vector and runs along a
contiguous row of the target is written with one vector accumulator per vector of each row.
``max`` and ``min`` are the vector layer's, with the scalar ``tc_max``/``tc_min``'s bits
(NaN-propagating; a tie takes the new value), and start from -inf/+inf where the tile runs the
whole reduction. An int32 sum or product tile of int32 ``+ - *`` takes the vector form too,
exactly (both wrap), where every vector of one step (accumulators, loads, broadcasts) fits in the
registers: no integer multiply takes its broadcast from memory, and AVX2's 6x16 int32 tile
spilled five accumulators (0.74x GCC's own).

Where one outer tile loop is partial (6-row tiles of 1024 rows), the last tile takes a vector tile
of its own with the rows left (4), for each such size the loops around it give (at most
REST_SIZES). So does a tile whose row alone is cut short, where a shifted tile cannot serve: 6x64
tiles of 500 columns end in a 6x52 vector tile (the weight gradient of a 96x500 -> 900 layer,
AVX-512, 2 threads, 60 paired calls: 0.58 -> 0.41 ms, 0.64 -> 0.90 of the FMA peak, the same
bits), and where both are cut short, the corner too. A size with no vector form (2 columns left,
fewer than a half vector) takes the scalar tile cut to that size, its bounds constants; other
partial tiles take the general scalar tile. Lanes and the accumulator budget come from the
``CpuTarget``.

A row that is not a whole number of vectors ends with a vector overlapping the one before it (a
54-wide row in 16 lanes: 0, 16, 32, 38): the overlapped elements are computed twice, from the
same inputs in the same order, and stored twice with the same bits, since every load of the
target happens before the serial loops and every store after them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Read, Statement, reads
from tcdsl.polyhedral.cputarget import LINE
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
    trip_count,
)

from .facts import Facts
from .vecexpr import REDUCTIONS, TILE_SUMS, VECTOR_DTYPES, elem_step, half_expr, plus_var, substitute, syms, vector_expr


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
    # a scattered target started from the identity, each element on a line of its own (a padded
    # conv's boundary column): prefetches for writing per step of the outermost serial loop, that
    # bring the lines its stores will write in over the steps (see _fetch_target)
    fetch_target: int = 0

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
        if self.fetch_target:
            text += f", fetching its lines {self.fetch_target} per {self.rt.serial[0].var}"
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
                 and half_expr(s.rhs))
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
        full.append(LOp(">=", (cond.args[1], LInt(init_value(f) + e - (1 if cond.op == "<=" else 0)))))
    shift = _shift(em, rt, s, row, args[row], omp_vars) if trip_count(vec) is None else None
    shifted, shift_ok = shift or (None, None)
    if shift_ok is not None and len(full) > 1:  # the other tile loops whole
        shift_ok = LOp("&&", (*full[:-1], shift_ok))
    vector_rests, scalar_rests, every = _rests(em, rt, omp_vars, loops) if rests else ((), (), False)
    covers = every and len(full) == 1 and shift is None and \
        all(not r.full and r.shift is None for _, r in vector_rests)
    across = _across(em, rt, s, args) if stride != 1 else None
    fetch = _fetch_target(em, rt, s, stride, rows * len(starts) * lanes) if across is None else 0
    return VectorTile(rt, s, row, starts, lanes, tuple(full), shifted, shift_ok, stride, half, vector_rests,
                      scalar_rests, _rolled(em, rt, s, row), narrow, _ahead(em, rt, s, loops), covers, across,
                      fetch)


def _fetch_target(em: Facts, rt: LTile, s: Statement, stride: int, elements: int) -> int:
    """Prefetches per step of the outermost serial loop that fetch the lines of a scattered target
    (``elements`` lanes, each ``stride`` elements from the next, at least a line apart) over that
    loop, or 0. A tile that starts from the identity reads none of its target, and its scatter
    after the serial loops then waits for every line it writes: the boundary columns of a padded
    conv (8x64x56x56, 3x3, AVX-512, 2 threads: the column w = 0 alone 1.08 -> 0.77 ms with its
    lines fetched over its 64 channels; the whole conv 8.87-8.98 -> 8.34-8.38 ms in two runs)."""
    itemsize = np.dtype(em.tensors[s.tensor].dtype).itemsize
    if stride == 1 or stride * itemsize < LINE or not rt.identity or rt.first is not None or not rt.serial:
        return 0
    trips = trip_count(rt.serial[0])
    return -(-elements // trips) if trips else 0


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
        subs = syms(r)
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
            subs = syms(r)
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


def init_value(f: LFor) -> int:
    assert isinstance(f.init, LInt)  # regtile.match: tile loops start at constants
    return f.init.value
