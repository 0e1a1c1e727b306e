"""Privatised sums: ``LoopIR -> LoopIR`` (codegen.lower's ``privatise`` pass).

A sum over rows into a target the rows do not index (layernorm's ``d_G(d) +=! d_Y(n, d) * ...``,
a bias gradient) runs, by default, as a nest of its own: the columns in parallel, the rows inside,
so it reads its operands once more after the row loop that reads them already (layernorm's backward
read ``d_Y`` and ``X`` twice). Where a parallel row loop of as many rows exists, the sum moves into
it: the rows run in blocks, each block sums into partial rows of its own (``LFor.private``), and
after the loop the partial rows are added to the target in block order. The sum reads the same
rows as the row loop, in the same iteration, the threads never share an element, and the result
is the same for every run of the kernel (the blocks are fixed by the sizes and the target's cores,
not by which thread takes them). The sums run first in each row, as the row's first pass through
memory: the row's own loops then find the operands in L1 (layernorm's backward, 1500x1000, 2
threads, AVX-512, paired rounds: 0.83 -> 0.71 ms on inputs fresh from memory, 0.37 -> 0.34 ms on
inputs in L3, against the sums at the end of the row, where the row's other loops had pushed its
operands out of L1).

The sum must read only inputs (nothing the kernel writes), and its target must be read by nothing
in the kernel and written by nothing but its own init, which runs before the row loop: then where
and in which order the terms are added does not change what the kernel computes, beyond the
rounding of the sum.
"""

from __future__ import annotations

from dataclasses import replace

from tcdsl.core.checked import reads
from tcdsl.core.dtypes import np_dtype
from tcdsl.polyhedral.loopir import LCall, LFor, LInt, LNode, LoopIR, LOp, LVar, trip_count, walk

from . import memshare
from .facts import Facts

BLOCKS_PER_CORE = 8  # row blocks per core (as tc_chunk's chunks of a parallel loop)
MIN_ROWS = 16  # fewer rows than this: the sum keeps its own nest
# Nor where the rows the sums read take less than the target's L2 (layernorm's backward, paired
# rounds: 150x260 0.91x against the sums' own nest; 1500x1000, in L3, 0.91-1.16x; 8000x2000,
# from memory, 1.43-1.55x)
PARTIAL_BYTES = 64 << 20  # at most this much memory for the partial rows of one loop


def privatise(ir: LoopIR, f: Facts) -> LoopIR:
    """Each sum nest that qualifies (see the module's docstring) moved into the parallel row loop
    of as many rows that shares an operand with it, as loops at the start of its body."""
    body = list(ir.body)
    for i, row in enumerate(body):
        if not (isinstance(row, LFor) and row.omp and row.parallel and not row.collapse and not row.private):
            continue
        rows = trip_count(row)
        if rows is None or rows < MIN_ROWS or row.step != 1 or row.init != LInt(0):
            continue
        taken: list[int] = []
        moved: list[int] = []  # init nests after the row loop, of taken sums only: run before it
        calls: list[LCall] = []
        for j, nest in enumerate(body):
            sums = _sums(nest, f, rows) if j != i else None
            if sums and _shares(row, sums, f):
                inits = _inits_after(body, i, sums, f)
                if inits is not None:
                    taken.append(j)
                    moved.extend(inits)
                    calls.extend(sums)
        if not calls:
            continue
        blocks = min(BLOCKS_PER_CORE * max(1, f.target.cores), rows)
        targets = tuple(dict.fromkeys(f.scop.tc_statement(c.stmt).tensor for c in calls))
        if any(isinstance(c, LCall) and f.scop.tc_statement(c.stmt).tensor in targets for c in walk(row.body)):
            continue  # the row loop writes a target itself (an init run there): its writes would go to the partials
        row_bytes = sum(memshare.elements(f.shapes[t]) * _itemsize(f, t) for t in targets)
        if rows * row_bytes < f.target.l2:
            continue  # what the sums read again stays in L2: the partial rows would cost more than they save
        if blocks * row_bytes > PARTIAL_BYTES:
            continue
        loops = _loops(calls, row.var, f, _next_var(ir))
        body[i] = replace(row, body=(*loops, *row.body), private=targets, blocks=blocks)
        early = [body[j] for j in sorted(set(moved))]
        out = [n for j, n in enumerate(body) if j not in taken and j not in moved]
        at = out.index(body[i])
        return replace(ir, body=tuple(out[:at] + early + out[at:]))  # one row loop per kernel
    return ir


def _sums(nest: LNode, f: Facts, rows: int) -> list[LCall] | None:
    """The calls of ``nest``, where every node of it is a loop or a call of a qualifying sum over
    ``rows`` rows (None otherwise)."""
    if not isinstance(nest, LFor):
        return None
    calls = []
    written = _written(f)
    for n in walk((nest,)):
        if isinstance(n, LFor):
            if n.omp and n.collapse or n.private:
                return None
            continue
        if not isinstance(n, LCall):
            return None
        st, s = f.scop.stmt(n.stmt), f.scop.tc_statement(n.stmt)
        bound = f.scop.bound_statement(n.stmt)
        red = [i for i in st.indices if i not in s.lhs]
        if st.kind != "update" or s.op != "+" or len(red) != 1 or bound.guards or len(set(s.lhs)) != len(s.lhs):
            return None
        extent = {name: hi - lo for name, lo, hi in bound.ranges}
        lows = {name: lo for name, lo, _ in bound.ranges}
        if extent.get(red[0]) != rows or any(lows[i] != 0 for i in st.indices) or \
                tuple(extent[i] for i in s.lhs) != f.shapes[s.tensor] or not _contiguous(f, s.tensor):
            return None
        if any(r.tensor in written for r in reads(s.rhs)) or _read_anywhere(f, s.tensor):
            return None
        if written.get(s.tensor, set()) != {st.number}:
            return None
        calls.append(n)
    return calls or None


def _written(f: Facts) -> dict[str, set[int]]:
    """Tensor -> the TC statements that write it."""
    out: dict[str, set[int]] = {}
    for st in f.scop.stmts:
        out.setdefault(f.scop.tc_statement(st.name).tensor, set()).add(st.number)
    return out


def _read_anywhere(f: Facts, tensor: str) -> bool:
    return any(r.tensor == tensor for st in f.scop.stmts for r in reads(f.scop.tc_statement(st.name).rhs))


def _inits_after(body: list[LNode], row: int, sums: list[LCall], f: Facts) -> list[int] | None:
    """The top-level nests after the row loop that hold inits of the sums' targets, where each
    holds nothing else (they can run before the row loop); None where one holds more."""
    numbers = {f.scop.stmt(c.stmt).number for c in sums}
    out = []
    for j, n in enumerate(body[row + 1:], row + 1):
        calls = [c for c in walk((n,)) if isinstance(c, LCall)]
        ours = [c for c in calls if f.scop.stmt(c.stmt).kind == "init" and f.scop.stmt(c.stmt).number in numbers]
        if ours and len(ours) != len(calls):
            return None
        if ours:
            out.append(j)
    return out


def _shares(row: LFor, sums: list[LCall], f: Facts) -> bool:
    """The row loop reads a tensor the sums read: moving them there saves reading it again."""
    theirs = {r.tensor for c in sums for r in reads(f.scop.tc_statement(c.stmt).rhs)}
    ours = {r.tensor for c in walk(row.body) if isinstance(c, LCall) for r in reads(f.scop.tc_statement(c.stmt).rhs)}
    return bool(theirs & ours)


def _contiguous(f: Facts, tensor: str) -> bool:
    shape, strides = f.shapes[tensor], f.strides[tensor]
    want = 1
    for d in reversed(range(len(shape))):
        if shape[d] > 1 and strides[d] != want:
            return False
        want *= shape[d]
    return True


def _itemsize(f: Facts, tensor: str) -> int:
    return int(np_dtype(f.tensors[tensor].dtype).itemsize)


def _next_var(ir: LoopIR) -> int:
    used = [int(n.var[1:]) for n in walk(ir.body) if isinstance(n, LFor) and n.var[1:].isdigit()]
    return max(used, default=-1) + 1


def _loops(calls: list[LCall], row: str, f: Facts, first: int) -> tuple[LNode, ...]:
    """One perfect nest per target shape, over the target's dims (the innermost vectorised), each
    calling its sums at the row loop's row."""
    by_shape: dict[tuple[int, ...], list[LCall]] = {}
    for c in calls:
        by_shape.setdefault(f.shapes[f.scop.tc_statement(c.stmt).tensor], []).append(c)
    out: list[LNode] = []
    for shape, group in by_shape.items():
        names = [f"c{first + k}" for k in range(len(shape))]
        first += len(shape)
        body: list[LNode] = []
        for c in group:
            st, s = f.scop.stmt(c.stmt), f.scop.tc_statement(c.stmt)
            at = {name: LVar(names[s.lhs.index(name)]) if name in s.lhs else LVar(row) for name in st.indices}
            body.append(LCall(c.stmt, tuple(at[name] for name in st.indices)))
        inner: tuple[LNode, ...] = tuple(body)
        for d in reversed(range(len(shape))):
            var = names[d]
            inner = (LFor(var, LInt(0), LOp("<=", (LVar(var), LInt(shape[d] - 1))), 1, inner, parallel=True,
                          simd=d == len(shape) - 1),)
        out.extend(inner)
    return tuple(out)
