"""GPU lowering passes: ``GpuProgram -> GpuProgram``, the register decisions that codegen.gpu
prints, in order (``run``; ``trace`` prints each pass's program, ``TCDSL_DUMP_DIR`` writes it):

    scatter     the index a scatter computes from data becomes ``data(...)`` of the loops its value
                moves with (codegen.lower.scatter_call): no register holds its target across them
    hold        a loop that every thread runs (a matmul's k tiles) around one thread region with
                one reduction: each thread holds its elements of the target in a register array
                across the loop (``LHold``)
    accumulate  a nest of loops inside a thread around one reduction into an element the nest does
                not move (a conv's channel and window loops): the element in a register (``LAccum``,
                the CPU's accumulation, codegen.lower.accumulation, over a nest)

The last two are the ``private_memory`` option's: without it they leave the program as mapped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tcdsl.core.checked import reads
from tcdsl.polyhedral.gpu import GpuProgram
from tcdsl.polyhedral.loopir import (
    LCall,
    LCopy,
    LFor,
    LHold,
    LNode,
    LSync,
    expr_vars,
    trip_bound,
    walk,
)
from tcdsl.polyhedral.scop import Scop

from .lower import accumulation, scatter_call
from .rewrite import rewrite

GpuPass = Callable[[GpuProgram, Scop], GpuProgram]
MAX_SLOTS = 64  # register-array elements a hold may give each thread


def run(program: GpuProgram, scop: Scop, private_memory: bool = True) -> tuple[tuple[str, GpuProgram], ...]:
    """The program after each pass, in order (the last is what codegen.gpu prints)."""
    out = []
    for name, p in PASSES:
        if private_memory or name == "scatter":
            program = p(program, scop)
        out.append((name, program))
    return tuple(out)


def trace(steps: tuple[tuple[str, GpuProgram], ...], start: GpuProgram) -> str:
    """Each pass's program, or ``(unchanged)`` where the pass decided nothing."""
    parts, before = [], str(start)
    for name, program in steps:
        text = str(program)
        parts.append(f"== {name}\n{'(unchanged)' if text == before else text}")
        before = text
    return "\n\n".join(parts) + "\n"


def _kernels(program: GpuProgram, visit: Callable[[LNode], LNode | None]) -> GpuProgram:
    return replace(program, kernels=tuple(replace(k, body=rewrite(k.body, visit)) for k in program.kernels))


# ---- scatter ----
def scatter_indices(program: GpuProgram, scop: Scop) -> GpuProgram:
    return _kernels(program, lambda n: scatter_call(n, scop))


# ---- hold ----
def hold_registers(program: GpuProgram, scop: Scop) -> GpuProgram:
    return _kernels(program, lambda n: _hold(n, scop) if isinstance(n, LFor) and not n.mapped else None)


def _hold(n: LFor, scop: Scop) -> LHold | None:
    """``n`` as an ``LHold``: its body holds one thread region (through copies and barriers) whose
    loops do not depend on ``n``, around a reduction loop of the one statement ``n`` runs, into an
    element those loops fix, at most MAX_SLOTS elements per thread."""
    found = _region_of(n.body)
    if found is None:
        return None
    chain, red, call = found
    st = scop.stmt(call.stmt)
    s = scop.tc_statement(st.name)
    if st.kind != "update" or s.op == "=" or any(r.tensor == s.tensor for r in reads(s.rhs)):
        return None
    if sum(isinstance(x, LCall) for x in walk(n.body)) != 1:
        return None
    args = dict(zip(st.indices, call.args))
    if any({n.var, red.var} & expr_vars(args[i]) for i in s.lhs):
        return None
    slots = []
    for f in chain:
        trips = trip_bound(f)
        if trips is None or n.var in expr_vars(f.init) | expr_vars(f.cond):
            return None
        slots.append(-(-trips // f.count))
    if math.prod(slots) > MAX_SLOTS:
        return None
    return LHold(n, tuple(chain), red, call, tuple(slots))


def _region_of(body: tuple[LNode, ...]) -> tuple[list[LFor], LFor, LCall] | None:
    """The one thread region in ``body`` (through copies and barriers): its thread loops, and
    the reduction loop of one call they hold."""
    regions = []
    for x in body:
        if isinstance(x, LCopy):
            inner = _region_of(x.body)
            if inner is None:
                return None
            regions.append(inner)
        elif isinstance(x, LFor) and x.mapped == "thread":
            chain = [x]
            while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], LFor) and chain[-1].body[0].mapped:
                chain.append(chain[-1].body[0])
            last = chain[-1].body
            if not (len(last) == 1 and isinstance(last[0], LFor) and not last[0].mapped
                    and len(last[0].body) == 1 and isinstance(last[0].body[0], LCall)):
                return None
            regions.append((chain, last[0], last[0].body[0]))
        elif not isinstance(x, LSync):
            return None
    return regions[0] if len(regions) == 1 else None


# ---- accumulate ----
def accumulate_nests(program: GpuProgram, scop: Scop) -> GpuProgram:
    def visit(n: LNode) -> LNode | None:
        if isinstance(n, LHold):
            return n  # its loops print as the hold's
        if isinstance(n, LFor) and not n.mapped:
            return accumulation(n, scop, nest=True)
        return None

    return _kernels(program, visit)


PASSES: tuple[tuple[str, GpuPass], ...] = (
    ("scatter", scatter_indices),
    ("hold", hold_registers),
    ("accumulate", accumulate_nests),
)
