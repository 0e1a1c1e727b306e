"""CPU lowering passes: ``LoopIR x Facts -> LoopIR``, one decision per pass, run in the order of
``PASSES``. Each pass records what it decided as nodes or fields of the loop IR
(polyhedral.loopir: ``LDecl``, ``LReset``, ``LTranspose``, ``LTile``, ``LAccum``, ``LPack``, and the ``hoist``,
``vector``, ``unroll`` and ``collapse`` fields of loops), so ``str(ir)`` after each pass shows it,
and the C emitter (codegen.c) only prints what the IR says. Most passes live here; a line that
starts with a module's name (``codegen.pack:``) says where its pass lives instead:

    scatter     indices that a scatter computes from data, as ``data(...)`` of the loops they move with
    contract    temporaries that live in one scalar, or in the row one iteration uses
    share       temporaries whose lifetimes do not overlap share one buffer
    transpose   copy nests that read along one loop and write along the other move in blocks
    privatise   codegen.privatise: sums over rows into a target the rows do not index, moved into
                the parallel row loop that reads the same rows, each block of rows into partial rows
    regtile     reduction nests whose target stays in a register tile across the serial loops
    accumulate  innermost nests of reduction loops into one element, in a local
    hoist       reads that do not move with a vectorised loop, loaded once before it
    vectorise   tiles and pointwise loops in the target's explicit vectors, where they have that form
    quotient    pointwise loops that read at ``v / d`` run over the quotient, the ``d`` remainders written out
    pack        codegen.pack: the operand a vector tile loads along its rows copied into contiguous
                panels (from the tensor a transpose copied it from, where nothing else reads the
                transposed copy)
    fuse        codegen.fuse: nests of one statement's pieces that share their outer parallel loops
                run them once
    siblings    codegen.fuse: independent nests that run the same outer loops and read a tensor in
                common run them once
    split       compiler-vectorised tile loops cut into whole vectors and the rest
    unroll      short innermost loops unrolled (the ``unroll`` option)
    parallel    codegen.threads: `omp parallel for` loops with few iterations share their threads
                with the loop inside (not with columns whose iterations write the same cache lines:
                those move inward); loops over register tiles hand out fine chunks

``run`` returns the IR after every pass; the ``TCDSL_DUMP_DIR`` knob writes them
(``<def>.passes.txt``), and the golden-file tests check them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tcdsl.core.affine import FloorDiv, Sym, Var
from tcdsl.core.checked import Statement, read_tuple, reads
from tcdsl.core.instance import fully_written
from tcdsl.polyhedral.loopir import (
    LAccum,
    LCall,
    LDecl,
    LExpr,
    LFor,
    LIf,
    LInt,
    LNode,
    LoopIR,
    LOp,
    LReset,
    LTile,
    LVar,
    expr_vars,
    trip_count,
    walk,
)
from tcdsl.polyhedral.scatter import value_indices
from tcdsl.polyhedral.scop import Scop

from . import contract, memshare, privatise, regtile, transpose, vecexpr, vecloop, vecplan
from .facts import Facts
from .fuse import fuse_pieces, fuse_siblings
from .pack import pack_panels
from .rewrite import LOOPS, rewrite
from .threads import parallel

Pass = Callable[[LoopIR, Facts], LoopIR]

SMALL_INNER = 4  # a window reduction this short may run inside the vectorised tile loop (_interleaved)


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
                around[id(n)] = loops
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
    rows: dict[int, tuple[LFor, frozenset[str]]] = {}  # a simd loop in an `omp` loop's body -> vecloop.plan's rows
    for n in walk(ir.body):
        if isinstance(n, LFor) and n.omp:
            before: set[str] = set()
            for x in n.body:
                if isinstance(x, LFor) and x.simd:
                    rows[id(x)] = (n, frozenset(before))
                before |= {r.tensor for c in walk((x,)) if isinstance(c, LCall)
                           for r in reads(f.scop.tc_statement(c.stmt).rhs)}

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
            vl = vecloop.plan(f, n, rows.get(id(n)), around.get(id(n), ()))
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
