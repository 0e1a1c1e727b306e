"""Memory sharing: ``LoopIR x Scop -> {temporary: buffer owner}``, temporaries whose lifetimes do not
overlap reuse one buffer.

A temporary lives from the first to the last top-level loop nest that touches it. Temporaries of
one dtype whose lifetimes are disjoint share the buffer of the first of them (sized for the
largest); each later one starts from zeros, as a fresh temporary does.
"""

from __future__ import annotations

import math

from tcdsl.core.checked import reads
from tcdsl.polyhedral.loopir import LCall, LNode, LoopIR, walk
from tcdsl.polyhedral.scop import Scop


def share(ir: LoopIR, scop: Scop, contracted: set[str]) -> dict[str, str]:
    """Temporary -> the temporary whose buffer it uses (itself for owners)."""
    checked = scop.inst.checked
    temps = [t for t in checked.temps if t.name not in contracted]
    life: dict[str, list[int]] = {}
    for pos, node in enumerate(ir.body):
        for call in _calls(node):
            st = scop.stmt(call.stmt)
            s = scop.tc_statement(st.name)
            names = {s.tensor} | ({r.tensor for r in reads(s.rhs)} if st.kind == "update" else set())
            for name in names:
                life.setdefault(name, [pos, pos])[1] = pos
    owners: list[tuple[str, str, int]] = []  # (owner, dtype, last position in use)
    out: dict[str, str] = {}
    for t in sorted((t for t in temps if t.name in life), key=lambda t: life[t.name][0]):
        start, end = life[t.name]
        for k, (owner, dtype, last) in enumerate(owners):
            if dtype == t.dtype and last < start:
                out[t.name] = owner
                owners[k] = (owner, dtype, end)
                break
        else:
            out[t.name] = t.name
            owners.append((t.name, t.dtype, end))
    return out


def first_use(ir: LoopIR, scop: Scop, name: str) -> int:
    """The position of the top-level nest that first touches tensor ``name``."""
    for pos, node in enumerate(ir.body):
        for call in _calls(node):
            st = scop.stmt(call.stmt)
            s = scop.tc_statement(st.name)
            if s.tensor == name or (st.kind == "update" and any(r.tensor == name for r in reads(s.rhs))):
                return pos
    return -1


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _calls(node: LNode) -> list[LCall]:
    return [n for n in walk((node,)) if isinstance(n, LCall)]
