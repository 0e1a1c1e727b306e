"""The threads' share of the work, codegen.lower's ``parallel`` pass: ``LoopIR x Facts -> LoopIR``,
`omp parallel for` loops of few iterations collapsed with the loop inside (``LFor.collapse``), and
loops over register tiles handing out fine chunks (``LFor.fine``).
"""

from __future__ import annotations

from dataclasses import replace

from tcdsl.core import dtypes as T
from tcdsl.polyhedral.loopir import (
    LCall,
    LFor,
    LNode,
    LoopIR,
    LTile,
    expr_value,
    expr_vars,
    trip_bound,
    trip_count,
    walk,
)

from .facts import Facts
from .rewrite import LOOPS, rewrite

COLLAPSE_BELOW = 16  # an `omp parallel for` loop with fewer iterations shares them with the loop inside


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
