"""CPU lowering passes: ``LoopIR x Facts -> LoopIR``, one decision per pass, run in the order of
``PASSES``. Each pass records what it decided as nodes or fields of the loop IR
(polyhedral.loopir: ``LDecl``, ``LReset``, ``LTranspose``, ``LTile``, ``LAccum``, ``LPack``, and the ``hoist``,
``vector``, ``unroll`` and ``collapse`` fields of loops), so ``str(ir)`` after each pass shows it,
and the C emitter (codegen.c) only prints what the IR says.

    scatter     indices that a scatter computes from data, as ``data(...)`` of the loops they move with
    contract    temporaries that live in one scalar, or in the row one iteration uses
    share       temporaries whose lifetimes do not overlap share one buffer
    transpose   copy nests that read along one loop and write along the other move in blocks
    regtile     reduction nests whose target stays in a register tile across the serial loops
    accumulate  innermost nests of reduction loops into one element, in a local
    hoist       reads that do not move with a vectorised loop, loaded once before it
    vectorise   tiles and pointwise loops in the target's explicit vectors, where they have that form
    quotient    pointwise loops that read at ``v / d`` run over the quotient, the ``d`` remainders written out
    pack        the operand a vector tile loads along its rows copied into contiguous panels (from the
                tensor a transpose copied it from, where nothing else reads the transposed copy)
    fuse        nests of one statement's pieces that share their outer parallel loops run them once
    siblings    independent nests that run the same outer loops and read a tensor in common run them once
    split       compiler-vectorised tile loops cut into whole vectors and the rest
    unroll      short innermost loops unrolled (the ``unroll`` option)
    parallel    `omp parallel for` loops with few iterations share their threads with the loop inside
                (not with columns whose iterations write the same cache lines: those move inward)

``run`` returns the IR after every pass; the ``TCDSL_DUMP_DIR`` knob writes them
(``<def>.passes.txt``), and the golden-file tests check them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tcdsl.core import dtypes as T
from tcdsl.core.affine import FloorDiv, Sym, Var
from tcdsl.core.checked import Read, Statement, read_tuple, reads
from tcdsl.core.instance import fully_written
from tcdsl.polyhedral.loopir import (
    LAccum,
    LCall,
    LCopy,
    LDecl,
    LExpr,
    LFor,
    LIf,
    LInt,
    LMark,
    LNode,
    LoopIR,
    LOp,
    LPack,
    LReset,
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
from tcdsl.polyhedral.scatter import value_indices
from tcdsl.polyhedral.scop import Scop

from . import contract, memshare, privatise, regtile, transpose, vecexpr, vecloop, vecplan
from .facts import Facts

Pass = Callable[[LoopIR, Facts], LoopIR]
Visit = Callable[[LNode], "LNode | tuple[LNode, ...] | None"]

SMALL_INNER = 4  # a window reduction this short may run inside the vectorised tile loop (_interleaved)
COLLAPSE_BELOW = 16  # an `omp parallel for` loop with fewer iterations shares them with the loop inside
LOOPS = (LFor, LTile, LAccum, LTranspose, LPack)  # nodes that print as loops (or wrap them)


def run(ir: LoopIR, facts: Facts) -> tuple[tuple[str, LoopIR], ...]:
    """The IR after each pass, in order (the last is what the emitter prints)."""
    out = []
    for name, p in PASSES:
        ir = p(ir, facts)
        out.append((name, ir))
    return tuple(out)


def trace(steps: tuple[tuple[str, LoopIR], ...], start: LoopIR | None = None) -> str:
    """Each pass's output, or ``(unchanged)`` where the pass decided nothing (the first pass's
    against ``start``, the IR the passes ran on, where given)."""
    parts, before = [], None if start is None else str(start)
    for name, ir in steps:
        text = str(ir)
        parts.append(f"== {name}\n{'(unchanged)' if text == before else text}")
        before = text
    return "\n".join(parts) + "\n"


def rewrite(body: tuple[LNode, ...], visit: Visit) -> tuple[LNode, ...]:
    """``body`` with each node ``visit`` replaces (a node, or several) replaced, and the bodies of
    the loops and ifs it leaves (returns None for) rewritten the same way."""
    out: list[LNode] = []
    for n in body:
        r = visit(n)
        if r is not None:
            out.extend(r if isinstance(r, tuple) else (r,))
        elif isinstance(n, LFor):
            out.append(replace(n, body=rewrite(n.body, visit)))
        elif isinstance(n, LIf):
            out.append(replace(n, then=rewrite(n.then, visit), other=rewrite(n.other, visit)))
        elif isinstance(n, (LPack, LCopy, LMark)):  # (shared copies and marks: the GPU's, codegen.gpulower)
            out.append(replace(n, body=rewrite(n.body, visit)))
        else:
            out.append(n)
    return tuple(out)


# ---- scatter ----
def scatter_indices(ir: LoopIR, f: Facts) -> LoopIR:
    """The index a scatter computes from data (polyhedral.scatter) becomes ``data(...)`` of the
    loop values of the indices its value reads: later passes see its target move with those loops
    (no local or register tile holds it across them), and only the plain statement prints it."""

    return replace(ir, body=rewrite(ir.body, lambda n: scatter_call(n, f.scop)))


def scatter_call(n: LNode, scop: Scop) -> LCall | None:
    """``n``, a call of a scatter's update, with ``data(...)`` for the index it computes (None: any
    other node). The GPU lowering runs it too."""
    if not isinstance(n, LCall):
        return None
    st = scop.stmt(n.stmt)
    s = scop.tc_statement(n.stmt)
    if s.scatter is None or st.kind != "update":
        return None
    args = dict(zip(st.indices, n.args))
    data = LOp("data", tuple(args[i] for i in value_indices(s)))
    return replace(n, args=tuple(data if i == s.scatter[0] else a for i, a in zip(st.indices, n.args)))


def has_data(call: LCall) -> bool:
    """Whether a statement call computes an index from data (a scatter): only the plain statement
    prints it."""
    return any(isinstance(a, LOp) and a.op == "data" for a in call.args)


# ---- contract ----
def contract_temporaries(ir: LoopIR, f: Facts) -> LoopIR:
    """Temporaries in one scalar (contract.contractible) or one row buffer (contract.row_buffers),
    declared by an ``LDecl`` at the start of the body they live in."""
    scalars = contract.contractible(ir, f.scop)
    rows = contract.row_buffers(ir, f.scop, set(scalars))
    decls: dict[int, list[LNode]] = {}
    for name, (where, fixed) in rows.items():
        decls.setdefault(where, []).append(LDecl(name, "row", fixed))
    for name, where in scalars.items():
        decls.setdefault(where, []).append(LDecl(name, "scalar"))
    f.contracted, f.scalars = set(scalars), set(scalars)
    f.rows = {name: fixed for name, (_, fixed) in rows.items()}

    def place(body: tuple[LNode, ...]) -> tuple[LNode, ...]:
        out = list(decls.get(id(body), []))
        for n in body:
            if isinstance(n, LFor):
                n = replace(n, body=place(n.body))
            elif isinstance(n, LIf):
                n = replace(n, then=place(n.then), other=place(n.other))
            out.append(n)
        return tuple(out)

    return replace(ir, body=place(ir.body))


# ---- share ----
def share_buffers(ir: LoopIR, f: Facts) -> LoopIR:
    """Buffer owners (memshare.share); a temporary that reuses another's buffer and is not written
    whole is zeroed (``LReset``) before the top-level nest that first touches it."""
    owners = memshare.share(ir, f.scop, f.contracted | set(f.rows))
    resets: dict[int, list[LNode]] = {}
    for name, owner in owners.items():
        if owner != name and not fully_written(f.scop.inst, name):
            resets.setdefault(memshare.first_use(ir, f.scop, name), []).append(LReset(name, owner))
    body = tuple(x for pos, n in enumerate(ir.body) for x in (*resets.get(pos, []), n))
    return LoopIR(body, tuple(sorted(owners.items())))


# ---- transpose ----
def blocked_transposes(ir: LoopIR, f: Facts) -> LoopIR:
    if not f.vectorize:
        return ir
    in_memory = f.in_memory
    return replace(ir, body=rewrite(ir.body, lambda n: transpose.match(n, f.scop, f.c, f.strides, in_memory)
                                     if isinstance(n, LFor) else None))


# ---- regtile ----
def register_tiles(ir: LoopIR, f: Facts) -> LoopIR:
    """Register tiles (regtile.match); a ``!`` statement whose tiles run its whole reduction starts
    them at the identity, and its initialisation nests go (regtile.identity_starts). Where a cache
    tile outside cuts the reduction into chunks, the tiles start at the identity in the first chunk
    and load the target in the others. A tile that runs the whole reduction of its elements while
    other updates of the statement do not (the interior of a split statement) starts at the
    identity too; the initialisation stays for the others."""
    identity, firsts = regtile.identity_starts(ir.body, f.scop, f.c)

    def visit(n: LNode) -> LNode | None:
        if not isinstance(n, LFor):
            return None
        rt = regtile.match(n, f.scop, f.c)
        if rt is None:
            return None
        s = f.scop.tc_statement(rt.call.stmt)
        if id(n) in firsts:  # the tile runs chunks: the first starts from the identity
            return replace(rt, first=firsts[id(n)])
        return replace(rt, identity=s.number in identity or (s.init and regtile.whole_reduction(rt, f.scop, s)))

    body = rewrite(ir.body, visit)
    kept = tuple(n for n in body if not _initialised_by_tiles(n, identity))
    return replace(ir, body=kept)


def _initialised_by_tiles(n: LNode, identity: set[int]) -> bool:
    """A top-level nest of initialisations that the register tiles make redundant."""
    names = {x.stmt for x in walk((n,)) if isinstance(x, LCall)}
    return bool(names) and all(name.startswith("init") and int(name[4:]) in identity for name in names)


# ---- accumulate ----
def accumulate(ir: LoopIR, f: Facts) -> LoopIR:
    """An innermost perfect nest of reduction loops into one element keeps the element in a local
    across the whole nest: a weight gradient's sum over batch, rows and columns loads and stores
    its element once, not once per row (and its vector form, codegen.vecloop, combines its lanes once)."""
    return replace(ir, body=rewrite(ir.body, lambda n: accumulation(n, f.scop, nest=True)
                                    if isinstance(n, LFor) else None))


def accumulation(n: LFor, scop: Scop, nest: bool = False) -> LAccum | None:
    """``n`` as an ``LAccum``: one loop (with ``nest``, a perfect nest of loops not mapped to GPU
    ids) around one reduction into an element the loops do not move, and that it does not read."""
    loops = [n]
    while nest and len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], LFor) and not loops[-1].body[0].mapped:
        loops.append(loops[-1].body[0])
    if len(loops[-1].body) != 1 or not isinstance(loops[-1].body[0], LCall):
        return None
    call = loops[-1].body[0]
    st = scop.stmt(call.stmt)
    s = scop.tc_statement(st.name)
    if st.kind != "update" or s.op == "=" or any(r.tensor == s.tensor for r in reads(s.rhs)):
        return None
    args = dict(zip(st.indices, call.args))
    if any({x.var for x in loops} & expr_vars(args[i]) for i in s.lhs):
        return None
    return LAccum(tuple(loops), call)


# ---- hoist ----
def hoist_reads(ir: LoopIR, f: Facts) -> LoopIR:
    """Reads in a vectorised loop that do not move with it are loaded once before it (GCC cannot
    prove them invariant inside OpenMP regions, which blocks vectorisation)."""
    count = [0]

    def visit(n: LNode) -> LNode | None:
        if not (isinstance(n, LFor) and n.simd) or not all(isinstance(b, LCall) for b in n.body) or not n.body:
            return None
        hoist = _hoistable(n, f, count)
        return replace(n, hoist=hoist) if hoist else None

    return replace(ir, body=rewrite(ir.body, visit))


def _hoistable(n: LFor, f: Facts, count: list[int]) -> tuple[tuple[str, int, int], ...]:
    written = {f.scop.tc_statement(c.stmt).tensor for c in n.body if isinstance(c, LCall)}
    out: list[tuple[str, int, int]] = []
    seen: set[int] = set()
    for k, call in enumerate(n.body):
        assert isinstance(call, LCall)
        st = f.scop.stmt(call.stmt)
        if st.kind != "update":
            continue
        s = f.scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        for pos, r in enumerate(reads(s.rhs)):
            if id(r) in seen or r.tensor in written or r.conditional or r.tensor in f.scalars:
                continue
            if not all(isinstance(x, Sym) for x in r.subs):
                continue
            names = set().union(*(x.indices() for x in r.subs if isinstance(x, Sym))) if r.subs else set()
            if any(n.var in expr_vars(args[i]) for i in names):
                continue
            seen.add(id(r))
            out.append((f"h{count[0]}", k, pos))
            count[0] += 1
    return tuple(out)


def hoisted_reads(n: LFor, f: Facts) -> dict[int, str]:
    """``id(Read) -> local`` for the reads ``n`` hoists."""
    out = {}
    for name, k, pos in n.hoist:
        call = n.body[k]
        assert isinstance(call, LCall)
        out[id(read_tuple(f.scop.tc_statement(call.stmt).rhs)[pos])] = name
    return out


# ---- vectorise ----
def vectorise(ir: LoopIR, f: Facts) -> LoopIR:
    """Tiles and pointwise loops in explicit vectors (vecplan, vecloop); the other tiles and
    reductions vectorised by the compiler (`omp simd`), a strided window inside the tile loops."""
    if not f.vectorize:
        return ir
    omp: dict[int, frozenset[str]] = {}
    around: dict[int, tuple[LFor, ...]] = {}

    def scan(body: tuple[LNode, ...], outer: frozenset[str], loops: tuple[LFor, ...]) -> None:
        for n in body:
            if isinstance(n, LFor):
                # the parallel pass may collapse an `omp parallel for` loop with the loop inside it
                inner = {n.body[0].var} if len(n.body) == 1 and isinstance(n.body[0], LFor) else set()
                scan(n.body, outer | {n.var} | inner if n.omp else outer, (*loops, n))
            elif isinstance(n, LIf):
                scan(n.then, outer, loops)
                scan(n.other, outer, loops)
            elif isinstance(n, LTile):
                omp[id(n)] = outer
                around[id(n)] = loops

    scan(ir.body, frozenset(), ())

    def visit(n: LNode) -> LNode | None:
        if isinstance(n, LTile):
            inside = _interleaved(n, f)
            simd = n.inner[-1].parallel
            vt = vecplan.plan(f, n, omp.get(id(n), frozenset()), around.get(id(n), ())) \
                if f.VECTOR_TILES and inside is None else None
            return replace(n, simd=simd, inside=inside.var if inside is not None else "", vector=vt,
                           vector_text=str(vt) if vt is not None else "")
        if isinstance(n, LAccum):
            dtype = f.tensors[f.scop.tc_statement(n.call.stmt).tensor].dtype
            a = replace(n, simd=dtype not in ("float16", "bool"))
            va = vecloop.plan_accum(f, a)
            return replace(a, vector=va, vector_text=str(va)) if va is not None else a
        if isinstance(n, LFor) and not n.simd:
            jammed = vecloop.jam(f, n)
            if jammed is not None:
                return jammed
        if isinstance(n, LFor) and n.simd:
            f.hoisted = hoisted_reads(n, f)
            vl = vecloop.plan(f, n)
            f.hoisted = {}
            return replace(n, vector=vl, vector_text=str(vl)) if vl is not None else None
        return None

    return replace(ir, body=rewrite(ir.body, visit))


# ---- quotient ----
def run_over_quotients(ir: LoopIR, f: Facts) -> LoopIR:
    """A pointwise simd loop over ``v`` whose statement reads at ``v / d`` (``d`` a constant: a
    pooling gradient's ``O(n, c, x2 / 2, x3 / 2)``, a nearest upsampling) runs over the quotient
    ``q``, with the ``d`` remainders written out in its body (``v = d*q + r``): the reads at
    ``v / d`` become reads at ``q``, one element per iteration, and the reads and writes at ``v``
    groups of ``d`` neighbours, which the compiler vectorises; the iterations past the last whole
    group run after it. (Compiled with ``-fwrapv``, the compiler cannot simplify ``(2*q + 1) / 2``
    itself; the emitter prints it as ``q``.) The maxpool gradient's ``d_I`` nest, 12x48x46x46, 2
    threads on AVX2 (Zen 1): 4.2 -> 1.6 ms; the whole gradient kernel 7.2 -> 4.7 ms."""

    def visit(n: LNode) -> LNode | tuple[LNode, ...] | None:
        if not isinstance(n, LFor) or not n.simd or n.vector is not None:
            return None
        plan = _quotient_plan(n, f)
        if plan is None:
            return None
        d, k, lo, hi = plan
        call = n.body[0]
        assert isinstance(call, LCall)
        whole = (hi - lo + 1) // d
        q = LVar(n.var)

        def at(r: int) -> LCall:
            value: LExpr = LOp("*", (LInt(d), q))
            if r:
                value = LOp("+", (value, LInt(r)))
            return replace(call, args=tuple(value if i == k else a for i, a in enumerate(call.args)))

        groups = replace(n, init=LInt(lo // d), cond=LOp("<=", (q, LInt(lo // d + whole - 1))),
                         body=tuple(at(r) for r in range(d)))
        if lo + whole * d > hi:
            return groups
        return groups, replace(n, init=LInt(lo + whole * d))

    return replace(ir, body=rewrite(ir.body, visit))


def _quotient_plan(n: LFor, f: Facts) -> tuple[int, int, int, int] | None:
    """(``d``, the statement index that is the loop's variable, the loop's first and last values)
    where ``run_over_quotients`` applies to ``n``: one pointwise assignment, the loop's variable one
    of its indices, read only at that index itself or at ``index / d`` (plus a constant), with
    constant bounds whose first value ``d`` divides and at least one whole group."""
    if n.step != 1 or n.hoist or n.unroll or len(n.body) != 1 or not isinstance(n.body[0], LCall):
        return None
    if not (isinstance(n.init, LInt) and isinstance(n.cond, LOp) and n.cond.op in ("<=", "<")
            and n.cond.args[0] == LVar(n.var) and isinstance(n.cond.args[1], LInt)):
        return None
    lo, hi = n.init.value, n.cond.args[1].value - (n.cond.op == "<")
    call = n.body[0]
    st = f.scop.stmt(call.stmt)
    if st.kind != "update":
        return None
    s = f.scop.tc_statement(st.name)
    moving = [i for i, a in enumerate(call.args) if n.var in expr_vars(a)]
    if s.op != "=" or s.scatter is not None or len(moving) != 1 or call.args[moving[0]] != LVar(n.var):
        return None
    k = moving[0]
    index = Var(st.indices[k], "index")
    dens: set[int] = set()
    for r in read_tuple(s.rhs):
        for sub in r.subs:
            if not isinstance(sub, Sym):
                return None
            for atom, _ in sub.terms:
                if isinstance(atom, Var) or index not in Sym(((atom, 1),)).free_vars():
                    continue
                if not isinstance(atom, FloorDiv) or atom.num.terms != ((index, 1),):
                    return None  # (a remainder, a min or max, a quotient of more than the index)
                dens.add(atom.den)
    if len(dens) != 1:
        return None
    (d,) = dens
    if d < 2 or lo % d or hi - lo + 1 < d:
        return None
    return d, k, lo, hi


def _interleaved(rt: LTile, f: Facts) -> LFor | None:
    """The short innermost reduction loop of a window read with a stride (maxpool's
    ``I(.., 2*w + r_kw)``), to run inside the vectorised tile loop: with both window points in
    one iteration, GCC loads whole vectors and deinterleaves them instead of gathering."""
    last, inner = rt.serial[-1], rt.inner[-1]
    trips = trip_count(last)
    if trips is None or trips > SMALL_INNER or not inner.parallel:
        return None
    st = f.scop.stmt(rt.call.stmt)
    s: Statement = f.scop.tc_statement(st.name)
    args = dict(zip(st.indices, rt.call.args))
    along = [i for i, a in args.items() if inner.var in expr_vars(a)]  # (the tile's start plus ``inner``)
    w = along[0] if len(along) == 1 and vecexpr.plus_var(args[along[0]], inner.var) else None
    k = next((i for i, a in args.items() if a == LVar(last.var)), None)
    if w is None or k is None:
        return None
    vw, vk = Var(w, "index"), Var(k, "index")
    for r in reads(s.rhs):
        for sub in r.subs:
            if isinstance(sub, Sym) and abs(sub.coeff(vw)) >= 2 and sub.coeff(vk) != 0:
                return last
    return None


# ---- pack ----
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
    """The elements the transpose nest ``n`` (``_only_transpose``) copies: its loops' trip counts
    multiplied (None where one is not constant)."""
    counts = []
    while isinstance(n, LFor):
        counts.append(trip_count(n))
        n = n.body[0]
    assert isinstance(n, LTranspose)
    counts += [trip_count(n.outer), trip_count(n.inner)]
    return None if any(c is None for c in counts) else math.prod(c for c in counts if c is not None)


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
    # tiles' rows, one tile per cache tile, transform's rows of a contraction packed once)
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


# ---- fuse ----
FUSE_MIN_TRIPS = 32  # the shared loops' iterations: at least this many (for the threads to share)


def fuse_pieces(ir: LoopIR, f: Facts) -> LoopIR:
    """Consecutive top-level nests of one statement whose outermost loops are the same parallel
    output loops (the pieces polyhedral.split cuts from a padded conv: its boundary columns and its
    interior, each row) run those loops once, each nest's rest in turn inside them, so a boundary
    column runs on the input rows the interior reads for the same output row, not in a pass over
    the whole input of its own; their shared packs go before the fused nest. Legal where the
    statement reads nothing it writes: updates of different elements then do not depend on each
    other, and an element's updates in either nest run in the same iteration of the shared loops
    (their output subscripts in those loops are the same), in the order the nests had."""
    out: list[LNode] = []
    for n in ir.body:
        fused = _fuse(out[-1], n, f) if out else None
        if fused is not None:
            out[-1] = fused
        else:
            out.append(n)
    return ir if len(out) == len(ir.body) else replace(ir, body=tuple(out))


def _peel(n: LNode) -> tuple[list[LPack], LFor] | None:
    """The shared packs around a nest (outermost first) and its root loop."""
    packs: list[LPack] = []
    while isinstance(n, LPack) and n.shared and len(n.body) == 1:
        packs.append(n)
        n = n.body[0]
    return (packs, n) if isinstance(n, LFor) else None


def _fuse(a: LNode, b: LNode, f: Facts) -> LNode | None:
    pa, pb = _peel(a), _peel(b)
    if pa is None or pb is None:
        return None
    calls = [[x for x in walk((root,)) if isinstance(x, LCall)] for root in (pa[1], pb[1])]
    names = {c.stmt for cs in calls for c in cs}
    if len(names) != 1 or not all(calls):
        return None
    name = names.pop()
    st = f.scop.stmt(name)
    s = f.scop.tc_statement(name)
    if st.kind != "update" or any(r.tensor == s.tensor for r in reads(s.rhs)):
        return None
    shared = _shared_loops(pa[1], pb[1], lambda la, lb: (
        (la.var, la.init, la.cond, la.step) == (lb.var, lb.init, lb.cond, lb.step) and la.parallel and lb.parallel
        and not (la.simd or lb.simd or la.hoist or lb.hoist or la.unroll or lb.unroll)))
    if not shared:
        return None
    trips = [trip_count(x) for x, _ in shared]
    if any(t is None for t in trips) or math.prod(t or 0 for t in trips) < FUSE_MIN_TRIPS:
        return None
    # the shared loops move output subscripts only, the same ones in both nests, each a function
    # of the shared loops alone (so an element's updates sit in one iteration of them)
    outer = {x.var for x, _ in shared}
    args = [dict(zip(st.indices, c.args)) for cs in calls for c in cs]
    for i in st.indices:
        moved = [a[i] for a in args if expr_vars(a[i]) & outer]
        if moved and (i not in s.lhs or len(set(moved)) != 1 or len(moved) != len(args)
                      or not expr_vars(moved[0]) <= outer):
            return None
    body = shared[-1][0].body + shared[-1][1].body
    # a piece too small for threads of its own (astgen.SERIAL_BELOW) takes the other's parallel loop
    second = not any(x.omp for x, _ in shared) and any(y.omp for _, y in shared)
    for x, y in reversed(shared):
        body = (replace(x, body=body, omp=(y if second else x).omp, collapse=(y if second else x).collapse),)
    node: LNode = body[0]
    for p in reversed(pa[0] + pb[0]):
        node = replace(p, body=(node,))
    return node


# ---- siblings ----
def fuse_siblings(ir: LoopIR, f: Facts) -> LoopIR:
    """Two top-level nests of different statements whose outer loops are the same (bounds, steps,
    parallel or serial) and that read a tensor in common run those loops once, each nest's rest in
    turn inside them, so the common tensor comes from memory once: layernorm's backward sums d_Y
    down its columns for the gain's gradient and for the bias's, in two nests of the same tiles.
    Legal where neither nest writes what the other reads or writes, and the later nest, which moves
    up to the earlier, neither writes what the nests between them read or write nor reads what they
    write: then no dependence joins them, and any interleaving of their iterations computes the
    same values. Temporaries that share a buffer (the share pass) stay where they are."""
    body = list(ir.body)
    touched = [_touches(n, f) for n in body]  # (reads, writes) of each top-level node
    sharing = {x for t, o in ir.owners if t != o for x in (t, o)}
    i = 0
    while i < len(body):
        j = i + 1
        while j < len(body):
            fused = _sibling(body[i], body[j], touched[i:j + 1], sharing)
            if fused is None:
                j += 1
            else:
                body[i] = fused
                touched[i] = (touched[i][0] | touched[j][0], touched[i][1] | touched[j][1])
                del body[j], touched[j]
        i += 1
    return ir if len(body) == len(ir.body) else replace(ir, body=tuple(body))


def _touches(n: LNode, f: Facts) -> tuple[set[str], set[str]]:
    """The tensors a nest reads and those it writes (statements' targets; the tensors of packs,
    resets and transposes count as both)."""
    rd: set[str] = set()
    wr: set[str] = set()
    for x in walk((n,)):
        calls = [x] if isinstance(x, LCall) else [c for c in (getattr(x, "call", None),) if isinstance(c, LCall)]
        for c in calls:
            st = f.scop.tc_statement(c.stmt)
            wr.add(st.tensor)
            rd.update(r.tensor for r in reads(st.rhs))
        for name in (getattr(x, "tensor", None), getattr(x, "owner", None), getattr(x, "source", None)):
            if isinstance(name, str) and not isinstance(x, LDecl):
                rd.add(name)
                wr.add(name)
    return rd, wr


def _sibling(a: LNode, b: LNode, touched: list[tuple[set[str], set[str]]], sharing: set[str]) -> LNode | None:
    """``a`` and ``b`` run once in their shared loops, or None; ``touched``: what ``a``, the nodes
    between them and ``b`` read and write, in order."""
    if not (isinstance(a, LFor) and isinstance(b, LFor)):
        return None
    (ra, wa), (rb, wb) = touched[0], touched[-1]
    if not ra & rb or wa & (rb | wb) or wb & ra or (ra | wa | rb | wb) & sharing:
        return None
    if any(wm & (rb | wb) or wb & rm for rm, wm in touched[1:-1]):
        return None
    shared = _shared_loops(a, b, lambda la, lb: (
        (la.var, la.init, la.cond, la.step, la.parallel, la.omp, la.collapse)
        == (lb.var, lb.init, lb.cond, lb.step, lb.parallel, lb.omp, lb.collapse)
        and not (la.simd or lb.simd or la.hoist or lb.hoist or la.unroll or lb.unroll or la.tile or lb.tile
                 or la.vector is not None or lb.vector is not None or la.private or lb.private)))
    if not shared:
        return None
    inner = shared[-1][0].body + shared[-1][1].body
    for x, _ in reversed(shared):
        inner = (replace(x, body=inner),)
    return inner[0]


def _shared_loops(a: LFor, b: LFor, same: Callable[[LFor, LFor], bool]) -> list[tuple[LFor, LFor]]:
    """The loops two nests can run once, from their roots down: pairs for which ``same`` holds,
    each below the previous pair as the only node of both bodies."""
    shared: list[tuple[LFor, LFor]] = []
    la, lb = a, b
    while same(la, lb):
        shared.append((la, lb))
        if not (len(la.body) == 1 and len(lb.body) == 1 and isinstance(la.body[0], LFor)
                and isinstance(lb.body[0], LFor)):
            break
        la, lb = la.body[0], lb.body[0]
    return shared


# ---- split ----
def split_tiles(ir: LoopIR, f: Facts) -> LoopIR:
    """A compiler-vectorised tile loop whose constant trip count is not a whole number of vectors
    runs as two loops, the whole vectors then the rest: GCC then keeps each part of the tile in
    registers (group conv's 26-wide rows: 98 -> 78 ms on one thread)."""

    def visit(n: LNode) -> LNode | None:
        if not isinstance(n, LTile) or not n.simd:
            return None
        loop = n.inner[-1]
        trips = trip_count(loop)
        lanes = f.target.lanes(f.tensors[f.scop.tc_statement(n.call.stmt).tensor].dtype)
        if trips is None or not isinstance(loop.init, LInt) or trips <= lanes or trips % lanes == 0:
            return n
        return replace(n, split=loop.init.value + trips // lanes * lanes)

    return replace(ir, body=rewrite(ir.body, visit))


# ---- unroll ----
def unroll(ir: LoopIR, f: Facts) -> LoopIR:
    if not f.unroll:
        return ir

    def visit(n: LNode) -> LNode | None:
        if not isinstance(n, LFor) or n.omp or n.simd or any(isinstance(b, LOOPS) for b in n.body):
            return None
        trips = regtile.trip_bound(n)
        if trips is None or trips > f.unroll:
            return None
        return replace(n, unroll=trips, body=rewrite(n.body, visit))

    return replace(ir, body=rewrite(ir.body, visit))


# ---- parallel ----
def collapse(ir: LoopIR, f: Facts) -> LoopIR:
    """An `omp parallel for` loop with few iterations (three 48-row tiles of a 128-row product left
    one of two threads idle a third of the time) shares its threads with the parallel loop
    inside it, where the nest is perfect and rectangular, as `collapse(2)` requires.

    Not with a loop whose iterations all write into the same cache lines (a padded conv's boundary
    columns, one to a few wide: in each row, each column writes next to the others): shared among
    the threads, two threads write the same lines at once, and the lines move from core to core at
    each write. Such a loop trades places with the parallel loop inside it (both parallel: any
    order is legal), which the threads share instead, each running the columns of its rows in
    turn; where there is none, the threads share the outer loop alone. AVX-512, 2 threads, the 5x5
    conv padded by 2 (8x16x32x32, 32 filters), its two boundary column pieces timed one by one in 5
    fresh processes each: 0.059-0.080 ms -> 0.047-0.051 ms each (0.17-0.22 ms before in runs where
    the machine was loaded); the whole forward, interleaved 15 rounds, faster in 12/15 (AVX-512)
    and 14/15 (AVX2), the stem's in 15/15 and 11/15, the derived backward defs even."""

    def visit(n: LNode) -> LNode | None:
        if not (isinstance(n, LFor) and n.omp and _collapsible(n)):
            return None
        if _shares_lines(n.body[0], f):  # (n.body[0]: an LFor, _collapsible)
            n = _interchanged(n)
            if not _collapsible(n) or _shares_lines(n.body[0], f):
                return replace(n, body=rewrite(n.body, visit))
        return replace(n, collapse=True, body=rewrite(n.body, visit))

    return replace(ir, body=rewrite(ir.body, visit))


def fine_chunks(ir: LoopIR, f: Facts) -> LoopIR:
    """An `omp parallel for` loop around register tiles hands its iterations out in fine chunks
    (codegen.c's ``tc_chunk``: about 32 a thread, against 8 for other loops): a tile's work is
    large against a chunk's cost, and the last chunks leave little to wait for (AVX2 FC 128x1024
    -> 1024 in 171 row tiles of 6 rows, paired rounds on 2 threads: chunks of 2 tiles 1.04x
    against chunks of 10). A loop that streams its rows through memory keeps long chunks: the
    prefetchers follow each thread's run of rows (the forward of layernorm 1500x1000 on fresh
    inputs each call, 2 threads, interleaved rounds: chunks of 23 rows 0.43-0.45 ms, of 94 rows
    0.36 ms; on one thread the two ran alike)."""

    def visit(n: LNode) -> LNode | None:
        if not (isinstance(n, LFor) and n.omp):
            return None
        return replace(n, fine=True) if any(isinstance(m, LTile) for m in walk(n.body)) else n

    return replace(ir, body=rewrite(ir.body, visit))


def parallel(ir: LoopIR, f: Facts) -> LoopIR:
    """The threads' share of the work: ``collapse``, then ``fine_chunks``."""
    return fine_chunks(collapse(ir, f), f)


LINE_BYTES = 64  # a cache line: two threads writing into one line at once move it between their cores


def _shares_lines(m: LNode, f: Facts) -> bool:
    """Whether every iteration of loop ``m`` writes into the lines of the others: some statement
    inside writes an element that ``m``'s whole range moves by LINE_BYTES or less (and that a step
    moves at all), a boundary column one to a few elements wide. (A loop whose writes are further
    apart, a weight gradient's channels, 36 bytes apart, each summed at length and written once,
    keeps sharing its iterations among the threads.)"""
    trips = trip_bound(m) if isinstance(m, LFor) else None
    if not isinstance(m, LFor) or not trips:
        return False
    for x in walk(m.body):
        if not isinstance(x, LCall):
            continue
        s = f.scop.tc_statement(x.stmt)
        if s.tensor not in f.in_memory:
            continue
        args = dict(zip(f.scop.stmt(x.stmt).indices, x.args))
        subs = [args[i] for i in s.lhs]
        start = {v: 0 for e in subs for v in expr_vars(e)}
        moved: list[int] = []
        for e in subs:
            a, b = expr_value(e, start), expr_value(e, {**start, m.var: m.step})
            if a is not None and b is not None:
                moved.append(int(b) - int(a))
        if len(moved) != len(subs):
            continue
        step = sum(st * d for st, d in zip(f.strides[s.tensor], moved))
        if 0 < abs(step) * T.bits(f.tensors[s.tensor].dtype) // 8 * trips <= LINE_BYTES:
            return True
    return False


def _interchanged(n: LFor) -> LFor:
    """``n`` with the loop inside it and the one inside that swapped, where both are parallel,
    perfectly nested and neither's bounds read the other (else ``n`` itself)."""
    m = n.body[0]
    if not (isinstance(m, LFor) and len(m.body) == 1 and isinstance(m.body[0], LFor)):
        return n
    m2 = m.body[0]
    plain = all(x.parallel and not (x.simd or x.omp or x.hoist or x.unroll or x.tile or x.private)
                and x.vector is None and x.step > 0 for x in (m, m2))
    if not plain or m.var in expr_vars(m2.init) | expr_vars(m2.cond) or \
            m2.var in expr_vars(m.init) | expr_vars(m.cond):
        return n
    return replace(n, body=(replace(m2, body=(replace(m, body=m2.body),)),))


def _collapsible(n: LFor) -> bool:
    trips = trip_count(n)
    if trips is None or trips >= COLLAPSE_BELOW or len(n.body) != 1 or not isinstance(n.body[0], LFor):
        return False
    m = n.body[0]
    return (m.parallel and not m.simd and not m.omp and m.step > 0
            and n.var not in expr_vars(m.init) | expr_vars(m.cond)
            and any(isinstance(b, LOOPS) for b in m.body)  # no unroll pragma on m
            and not m.hoist)


PASSES: tuple[tuple[str, Pass], ...] = (
    ("scatter", scatter_indices),
    ("contract", contract_temporaries),
    ("share", share_buffers),
    ("transpose", blocked_transposes),
    ("privatise", privatise.privatise),
    ("regtile", register_tiles),
    ("accumulate", accumulate),
    ("hoist", hoist_reads),
    ("vectorise", vectorise),
    ("quotient", run_over_quotients),
    ("pack", pack_panels),
    ("fuse", fuse_pieces),
    ("siblings", fuse_siblings),
    ("split", split_tiles),
    ("unroll", unroll),
    ("parallel", parallel),
)
