"""Nest fusion, codegen.lower's ``fuse`` and ``siblings`` passes: ``LoopIR x Facts -> LoopIR``,
consecutive top-level nests of one statement's pieces, and independent nests of the same outer
loops that read a tensor in common, run their shared loops once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tcdsl.core.checked import reads
from tcdsl.polyhedral.loopir import (
    LCall,
    LDecl,
    LFor,
    LNode,
    LoopIR,
    LPack,
    expr_vars,
    trip_count,
    walk,
)

from .facts import Facts

FUSE_MIN_TRIPS = 32  # the shared loops' iterations: at least this many (for the threads to share)


# ---- fuse ----
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
