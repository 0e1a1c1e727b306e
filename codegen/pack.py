"""Operand packing, codegen.lower's ``pack`` pass: ``LoopIR x Facts -> LoopIR``, the operand a
vector register tile loads along its rows copied into contiguous panels (``LPack``), and a pack of
a whole transposed operand copying from the tensor the transpose read, the transpose gone.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tcdsl.core import dtypes as T
from tcdsl.core.affine import Sym
from tcdsl.core.checked import Read, reads
from tcdsl.polyhedral.loopir import (
    LCall,
    LExpr,
    LFor,
    LIf,
    LInt,
    LNode,
    LoopIR,
    LOp,
    LPack,
    LTile,
    LTranspose,
    LVar,
    expr_value,
    expr_vars,
    loop_values,
    sum_terms,
    trip_bound,
    trip_count,
    walk,
    walk_paths,
)

from . import vecexpr
from .facts import Facts
from .rewrite import rewrite


def pack_panels(ir: LoopIR, f: Facts) -> LoopIR:
    """The operand a vector register tile loads along its rows, the same for every row of the tile
    (matmul's B), is copied once per cache tile into a buffer of panels: one panel per tile
    position along the row, each the tile's row width by the reduction steps, contiguous in the
    order the tile reads it. Read from the caller's memory instead, a row of the operand is
    wherever its row stride puts it: with a 4 KiB stride (1024 floats) every row of a panel falls
    into the same L1 set, and at numpy's 16-byte alignment every other 32-byte load splits across
    two cache lines (AVX2 matmul 1024^3: 115 GFLOP/s from the caller's memory, 150 packed).
    The copy goes just outside the innermost loop that reuses the panels (the tile's rows step
    along it), inside the parallel loop, so each thread packs its own."""
    wraps: dict[int, LPack] = {}
    count = [0]

    def find(body: tuple[LNode, ...], path: tuple[LFor, ...]) -> None:
        for n in body:
            if isinstance(n, LFor):
                find(n.body, path + (n,))
            elif isinstance(n, LIf):
                find(n.then, path)
                find(n.other, path)
            elif isinstance(n, LTile) and n.vector is not None:
                found = _packing(n, path, f, f"tc_pk{count[0]}")
                if found is not None and id(found[0]) not in wraps:
                    wraps[id(found[0])] = found[1]
                    count[0] += 1

    find(ir.body, ())
    if not wraps:
        return ir

    def visit(n: LNode) -> LNode | None:
        pack = wraps.get(id(n))
        if pack is None or not isinstance(n, LFor):
            return None
        return replace(pack, body=(replace(n, body=rewrite(n.body, visit)),))

    return _fold_transposes(replace(ir, body=rewrite(ir.body, visit)), f)


def _fold_transposes(ir: LoopIR, f: Facts) -> LoopIR:
    """A pack of the whole operand, made once before the parallel loops, whose operand is a
    temporary that a blocked transpose wrote from another tensor and that nothing else reads (the
    row operand of ``T(x, y) +=! A(x, r) * B(y, r)`` laid out by tcdsl.layout: ``At(r, x) = A(x,
    r)``) copies its panels from that tensor in blocks, each panel the transpose of ``width`` of
    its rows, and the transpose goes: one pass over the operand instead of two. FC 128x1024 ->
    1024 on AVX2, 2 threads, the kernel alone back to back: transpose 20 us and pack 36 us ->
    25 us (1.33 -> 1.30 ms)."""
    writers = {}
    for n in ir.body:
        t = _only_transpose(n)
        if t is not None and _elements(n) == math.prod(f.shapes[t.source]):  # the whole tensor
            writers[f.scop.tc_statement(f.scop.stmt(t.call.stmt).name).tensor] = t
    if not writers:
        return ir
    folded: set[str] = set()  # the statements of the transposes folded into packs
    calls: dict[str, int] = {}  # statement -> its calls in the IR (one: no other piece reads unpacked)
    for x in walk(ir.body):
        if isinstance(x, LCall):
            calls[x.stmt] = calls.get(x.stmt, 0) + 1

    def visit(n: LNode) -> LNode | None:
        if not isinstance(n, LPack) or n.tensor not in writers:
            return None
        body = rewrite(n.body, visit)
        t = writers[n.tensor]
        if calls.get(n.stmt) != 1 or not _foldable(n, t, f):
            return replace(n, body=body)
        folded.add(t.call.stmt)
        return replace(n, body=body, source=t.source, source_stride=t.source_stride)

    body = rewrite(ir.body, visit)

    def kept(x: LNode) -> bool:
        t = _only_transpose(x)
        return t is None or t.call.stmt not in folded

    return replace(ir, body=tuple(x for x in body if kept(x)))


def _elements(n: LNode) -> int | None:
    """The elements the transpose nest ``n`` (``_only_transpose``) copies: the iterations of its
    loops, counted through their bounds (a partial last block's ``min(63, 499 - c0)`` included);
    None where a bound is not a function of the loops outside it."""
    loops = []
    while isinstance(n, LFor):
        loops.append(n)
        n = n.body[0]
    assert isinstance(n, LTranspose)
    *outer, last = (*loops, n.outer, n.inner)
    envs = loop_values(outer, {f.var for f in outer}, limit=1 << 16)
    c = last.cond
    if envs is None or last.step <= 0 or not isinstance(c, LOp) or c.op not in ("<=", "<") or \
            c.args[0] != LVar(last.var):
        return None
    total = 0
    for env in envs:
        lo, hi = expr_value(last.init, env), expr_value(c.args[1], env)
        if lo is None or hi is None:
            return None
        total += max((hi - (c.op == "<") - lo) // last.step + 1, 0)
    return total


def _only_transpose(n: LNode) -> LTranspose | None:
    """The blocked transpose that is all of the nest ``n`` (its loops hold nothing else), or None."""
    while isinstance(n, LFor) and len(n.body) == 1:
        n = n.body[0]
    return n if isinstance(n, LTranspose) else None


def _foldable(p: LPack, t: LTranspose, f: Facts) -> bool:
    """Whether pack ``p`` can copy its panels straight from the source of transpose ``t``: a shared
    pack (no box, one serial loop: the rows of the panels, at most one loop of column blocks) of a
    32-bit temporary of two dims that no other statement reads and no other read of ``p``'s
    statement reads; the tile reads it at (serial loop, panel loop + vector loop), every panel
    whole inside the source, and the transpose is the plain ``T(i, j) = S(j, i)`` of the whole of
    ``S`` (``_fold_transposes``). The temporary is then never written: the emitter reads any other
    access of it (the scalar tile beside the vector one) from ``S`` (codegen.cexpr ``folded``)."""
    temps = {x.name for x in f.c.temps}
    # one loop of column blocks outside the reuse, each block's panels following the last's
    if not p.shared or len(p.chunks) > 1 or any(c[1] != 0 or c[2] != p.panels * p.width for c in p.chunks) or \
            p.box or len(p.serial) != 1 or p.tensor not in temps or p.tensor not in f.in_memory or \
            len(f.shapes[p.tensor]) != 2:
        return False
    readers = [(st.name, r) for st in f.scop.stmts if st.kind == "update"
               for r in reads(f.scop.tc_statement(st.name).rhs) if r.tensor == p.tensor]
    if len(readers) != 1 or readers[0][0] != p.stmt:
        return False
    tile, above = next(((x, up) for x, up in walk_paths(p.body) if isinstance(x, LTile) and x.call.stmt == p.stmt
                        and tuple(g.var for g in x.serial) == p.serial and p.call in (None, x.call)), (None, ()))
    if tile is None:
        return False
    st = f.scop.stmt(p.stmt)
    r = reads(f.scop.tc_statement(st.name).rhs)[p.read]
    args = dict(zip(st.indices, tile.call.args))
    panel = [x for x in reversed(above) if isinstance(x, LFor) and x.var == p.panel][:1]
    serial, vec = tile.serial[0], tile.inner[-1]
    subs = [x.indices() for x in r.subs if isinstance(x, Sym)]
    if len(subs) != 2 or any(len(i) != 1 for i in subs) or any(Sym.var(next(iter(i)), "index") != x
                                                               for i, x in zip(subs, r.subs)):
        return False
    (k,), (x,) = (tuple(i) for i in subs)
    # the column read: the block's start, the panel's and the lane
    along = sorted([*(c[0] for c in p.chunks), *(g.var for g in (*panel, vec))])
    terms = sum_terms(args[x]) if x in args else []
    if args.get(k) != LVar(serial.var) or not all(isinstance(e, LVar) for e in terms) or \
            sorted(e.name for e in terms if isinstance(e, LVar)) != along:
        return False
    firsts = [g.init for g in (serial, vec, *panel)]
    if not all(isinstance(i, LInt) and i.value == 0 for i in firsts) or trip_count(serial) != p.depth or \
            trip_count(vec) != p.width or (panel and (panel[0].step != p.width or trip_count(panel[0]) != p.panels)):
        return False
    rows, cols = f.shapes[p.tensor]
    ts = f.scop.tc_statement(f.scop.stmt(t.call.stmt).name)
    src = ts.rhs
    assert isinstance(src, Read)  # (codegen.transpose: a copy)
    plain = [Sym.var(i, "index") for i in ts.lhs]
    return (T.bits(f.tensors[p.tensor].dtype) == 32 and p.depth <= rows and p.all_panels * p.width <= cols
            and len(ts.lhs) == 2 and list(src.subs) == plain[::-1] and f.strides[src.tensor][1] == 1
            and t.source_stride == f.strides[src.tensor][0] and f.shapes[src.tensor] == (cols, rows))


PACK_MAX_BYTES = 256 << 10  # a packed block lives on the thread's stack
def _packing(t: LTile, path: tuple[LFor, ...], f: Facts, buffer: str) -> tuple[LFor, LPack] | None:
    """(the loop to pack before, the pack) for tile ``t`` under the loops ``path``, or None."""
    vt = t.vector
    st = f.scop.stmt(t.call.stmt)
    s = f.scop.tc_statement(st.name)
    args = dict(zip(st.indices, t.call.args))
    vec, rows = t.inner[-1], t.inner[:-1]
    width = t.extents[-1]
    if any(x.step != 1 for x in t.serial) or not isinstance(vec.init, LInt) or vt.shift is not None:
        return None
    for pos, r in enumerate(reads(s.rhs)):
        if r.conditional or r.tensor == s.tensor or r.tensor not in f.in_memory:
            continue
        if not all(isinstance(x, Sym) for x in r.subs):
            continue
        subs = tuple(x for x in r.subs if isinstance(x, Sym))
        step = vecexpr.elem_step(f, r.tensor, subs, vt.row)
        gathered = step not in (None, 0, 1)  # a strided row: a gather per step unless packed
        if step != 1 and not gathered:
            continue
        moves: set[str] = set()
        for x in subs:
            for i in x.indices():
                moves |= expr_vars(args[i])
        if moves & {g.var for g in rows} or not moves & {g.var for g in t.serial}:
            continue
        panel: list[LFor] = []
        reuse = None
        for loop in reversed(path):
            if loop.var in moves:
                panel.insert(0, loop)
            else:
                reuse = loop
                break
        if reuse is None or any(p.omp for p in panel) or len(panel) > 1:
            continue
        if panel and (panel[0].step != width or not isinstance(panel[0].init, LInt)):
            continue
        inside = {reuse.var, vec.var, *(g.var for g in panel), *(g.var for g in t.serial), *(g.var for g in rows)}
        box = _box(t, path, r.subs, args) if gathered else None
        # where the serial loops' bounds vary (a boundary piece's window, ``kw >= 1 - w``), the pack
        # holds their whole range
        bounds = [*panel, vec] if box is not None else [*panel, *t.serial, vec]
        if any((expr_vars(x.init) | expr_vars(x.cond) - {x.var}) & inside for x in bounds):
            continue
        counts = [trip_bound(x) for x in panel] + ([k for _, k in box] if box else [trip_bound(x) for x in t.serial])
        reused = trip_bound(reuse)
        if any(c is None for c in counts) or reused is None or reused < 2:
            continue
        panels = counts[0] if panel else 1
        depth = 1
        for c in counts[1 if panel else 0:]:
            assert c is not None
            depth *= c
        assert panels is not None
        itemsize = T.bits(f.tensors[r.tensor].dtype) // 8
        # a block per thread larger than PACK_MAX_BYTES packs only as the whole operand, once per
        # call (below); a gathered read packs once per call, on the heap: any size
        per_thread_fits = panels * depth * width * itemsize <= PACK_MAX_BYTES
        serial = tuple(g.var for g in t.serial)
        if gathered:
            # the panels are the same for every iteration of the loops around them, whose bounds
            # they do not read: one copy before the parallel loops, read by every thread
            outside = path[:next(k for k, x in enumerate(path) if x is reuse) + 1]
            if not any(x.var in moves for x in outside) and \
                    not any(expr_vars(x.init) | expr_vars(x.cond) - {x.var} for x in bounds):
                return path[0], LPack(buffer, r.tensor, t.call.stmt, pos, panel[0].var if panel else "",
                                      serial, width, panels, depth, (), shared=True, box=box or (), call=t.call)
            # packed per thread instead, a padded conv's boundary pieces ran 0.975x as fast
            continue
        inner = t.serial[-1]
        along = [i for i, a in args.items() if inner.var in expr_vars(a)]
        stride = vecexpr.elem_step(f, r.tensor, subs, along[0]) if len(along) == 1 else None
        if stride is None or not f.target.panel_conflicts(abs(stride) * itemsize, trip_bound(inner) or 0):
            continue
        pack = LPack(buffer, r.tensor, t.call.stmt, pos, panel[0].var if panel else "", serial, width, panels,
                     depth, (), call=t.call)
        whole = _whole_operand(pack, path, reuse, moves, bounds, f.target.shared_pack_bytes, itemsize)
        if whole is not None:
            return path[0], whole
        if per_thread_fits and not reuse.omp:  # (a parallel reuse loop: each thread would copy it all)
            return reuse, pack
    return None


BOX_MAX_VALUES = 4096  # the assignments enumerated to find one serial loop's range (_box)


def _box(t: LTile, path: tuple[LFor, ...], subs: tuple[object, ...],
         args: dict[str, LExpr]) -> tuple[tuple[int, int], ...] | None:
    """(first, count) covering every value of each serial loop of ``t``, where some of their bounds
    read loops of ``path`` (a boundary piece's reductions, ``kh <= h``); None where none do, a range
    is not found, or a subscript of the read moves with two serial loops (a point of the box could
    then read outside the tensor: with one each, every subscript value the box reads is one that
    some iteration reads)."""
    serial = {g.var for g in t.serial}
    if not any((expr_vars(g.init) | expr_vars(g.cond) - {g.var}) - serial for g in t.serial):
        return None
    for x in subs:
        if not isinstance(x, Sym):
            return None
        moved = set().union(*(expr_vars(args[i]) for i in x.indices())) if x.indices() else set()
        if len(moved & serial) > 1:
            return None
    out = []
    for k, g in enumerate(t.serial):
        envs = loop_values((*path, *t.serial[:k + 1]), {g.var}, limit=BOX_MAX_VALUES)
        if not envs:
            return None
        values = [e[g.var] for e in envs]
        out.append((min(values), max(values) - min(values) + 1))
    return tuple(out)


def _whole_operand(pack: LPack, path: tuple[LFor, ...], reuse: LFor, moves: set[str], bounds: list[LFor],
                   most: int, itemsize: int) -> LPack | None:
    """``pack`` made one copy of the whole operand per call, before the parallel loops, where
    loops outside its reuse that do not move the read would otherwise copy the same panels again
    (matmul's row blocks: each packed all of B's panels for its cache tile), the loops outside it
    that move the read (the column blocks, the reduction's chunks) becoming dimensions of the
    buffer. Only for loops of constant bounds, and an operand of at most ``most`` bytes (the
    target's ``shared_pack_bytes``). AVX2 on 2 threads, paired interleaved rounds against torch,
    per-thread packs -> this: matmul 1024^3 1.020x -> 1.088x and 1.074x -> 1.112x (best rounds
    195 -> 207 GFLOP/s), 960x1088x1000 1.004x -> 1.065x, A*B^T 1024^3 0.909x -> 0.954x, FC
    128x1024 -> 1024 1.094x -> 1.115x."""
    outside = path[:path.index(reuse)]
    chunks = [x for x in outside if x.var in moves]
    # (a parallel reuse loop copies the panels again in each of its iterations: the register
    # tiles' rows, one tile per cache tile, tileplan's rows of a contraction packed once)
    again = [x for x in outside if x.var not in moves] + ([reuse] if reuse.omp else [])
    if not any((trip_bound(x) or 0) > 1 for x in again):
        return None
    fixed = {x.var for x in again} | {reuse.var}
    if any(expr_vars(x.init) | expr_vars(x.cond) - {x.var} for x in chunks) or \
            any((expr_vars(x.init) | expr_vars(x.cond) - {x.var}) & fixed for x in bounds):
        return None
    dims = []
    for x in chunks:
        first, trips = expr_value(x.init, {}), trip_count(x)
        if first is None or trips is None or trips < 1:
            return None
        dims.append((x.var, first, x.step, trips))
    elements = math.prod(d[3] for d in dims) * pack.panels * pack.depth * pack.width
    if elements * itemsize > most:
        return None
    return replace(pack, shared=True, chunks=tuple(dims), parallel=any(x.omp for x in path))
