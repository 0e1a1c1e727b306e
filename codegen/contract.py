"""Temporary contraction: ``LoopIR x Scop -> {temporary: body}``, the temporaries that can live in
one scalar because their producer and every consumer were fused into the same loop body.

A temporary qualifies when one ``=`` statement writes it and later statements of the same body
read it only at the point just written (the same loop expressions), and nothing else touches it:
it is then written and read within one iteration, and never needs memory.
"""

from __future__ import annotations

from collections.abc import Iterator

from tcdsl.core.affine import Sym, Var
from tcdsl.core.checked import reads
from tcdsl.polyhedral.loopir import LCall, LExpr, LFor, LIf, LNode, LoopIR, expr_vars
from tcdsl.polyhedral.scop import Scop


def contractible(ir: LoopIR, scop: Scop) -> dict[str, int]:
    """Temporary name -> ``id()`` of the body tuple in which it becomes a scalar."""
    checked = scop.inst.checked
    uses: dict[str, list[tuple[int, int, LCall, str]]] = {t.name: [] for t in checked.temps}
    for body in _bodies(ir.body):
        for pos, node in enumerate(body):
            if not isinstance(node, LCall):
                continue
            st = scop.stmt(node.stmt)
            s = scop.tc_statement(st.name)
            if s.tensor in uses:
                uses[s.tensor].append((id(body), pos, node, "init" if st.kind == "init" else "write"))
            if st.kind == "update":
                for r in {r.tensor for r in reads(s.rhs)}:
                    if r in uses:
                        uses[r].append((id(body), pos, node, "read"))
    out: dict[str, int] = {}
    for name, entries in uses.items():
        if _qualifies(name, entries, scop):
            out[name] = entries[0][0]
    return out


def _qualifies(name: str, entries: list[tuple[int, int, LCall, str]], scop: Scop) -> bool:
    if not entries or len({e[0] for e in entries}) != 1:
        return False
    writes = [e for e in entries if e[3] != "read"]
    if len(writes) != 1 or writes[0][3] != "write":
        return False
    _, wpos, wcall, _ = writes[0]
    wst = scop.stmt(wcall.stmt)
    ws = scop.tc_statement(wst.name)
    if ws.op != "=" or any(r.tensor == name for r in reads(ws.rhs)):
        return False
    wargs = dict(zip(wst.indices, wcall.args))
    point = [wargs[i] for i in ws.lhs]
    for _, pos, call, role in entries:
        if role != "read":
            continue
        if pos <= wpos:
            return False
        st = scop.stmt(call.stmt)
        s = scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        for r in reads(s.rhs):
            if r.tensor != name:
                continue
            for d, sub in enumerate(r.subs):
                idx = _plain_index(sub)
                if idx is None or args[idx] != point[d]:
                    return False
    return True


def _plain_index(sub: object) -> str | None:
    if isinstance(sub, Sym) and sub.const == 0 and len(sub.terms) == 1:
        atom, coeff = sub.terms[0]
        if coeff == 1 and isinstance(atom, Var) and atom.kind == "index":
            return atom.name
    return None


def _bodies(body: tuple[LNode, ...]) -> Iterator[tuple[LNode, ...]]:
    yield body
    for n in body:
        if isinstance(n, LFor):
            yield from _bodies(n.body)
        elif isinstance(n, LIf):
            yield from _bodies(n.then)
            yield from _bodies(n.other)


def row_buffers(ir: LoopIR, scop: Scop, taken: set[str], limit: int = 16384) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Temporaries that need only a slice per iteration of one loop: ``name -> (id of that loop's
    body, the dims fixed by the loop)``. Every access of the temporary lies in the loop's body and
    indexes the fixed dims with the same loop expressions, so a local buffer of the other dims
    (at most ``limit`` elements) replaces the whole tensor."""
    checked = scop.inst.checked
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    for t in checked.temps:
        if t.name in taken:
            continue
        found = _row_buffer(ir, scop, t.name, len(t.dims))
        if found is None:
            continue
        body_id, fixed = found
        rest = [n for d, n in enumerate(scop.inst.shapes[t.name]) if d not in fixed]
        size = 1
        for n in rest:
            size *= n
        if size <= limit:
            out[t.name] = (body_id, fixed)
    return out


def _row_buffer(ir: LoopIR, scop: Scop, name: str, rank: int) -> tuple[int, tuple[int, ...]] | None:
    # every access as (path of enclosing loops, the subscript of each dim as a loop expression or None)
    accesses: list[tuple[tuple[LFor, ...], list[LExpr | None]]] = []
    for path, call in _calls_with_path(ir.body, ()):
        st = scop.stmt(call.stmt)
        s = scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        if s.tensor == name:
            accesses.append((path, [args[i] for i in s.lhs]))
        if st.kind == "update":
            for r in reads(s.rhs):
                if r.tensor == name:
                    accesses.append((path, [args[i] if (i := _plain_index(x)) is not None else None
                                            for x in r.subs]))
    if len(accesses) < 2:
        return None
    common = accesses[0][0]
    for path, _ in accesses[1:]:
        k = 0
        while k < min(len(common), len(path)) and common[k] is path[k]:
            k += 1
        common = common[:k]
    if not common:
        return None
    loop = common[-1]
    outer_vars = {f.var for f in common}
    fixed = []
    for d in range(rank):
        first = accesses[0][1][d]
        if first is None or not expr_vars(first) <= outer_vars:
            continue
        if all(subs[d] == first for _, subs in accesses):
            fixed.append(d)
    # the buffer lives for one iteration of every enclosing common loop: each of them must move
    # the slice, or a later iteration would find the buffer gone
    used: set[str] = set()
    for d in fixed:
        e = accesses[0][1][d]
        if e is not None:
            used |= expr_vars(e)
    if not fixed or not outer_vars <= used:
        return None
    return (id(loop.body), tuple(fixed))


def _calls_with_path(body: tuple[LNode, ...], path: tuple[LFor, ...]) -> Iterator[tuple[tuple[LFor, ...], LCall]]:
    for n in body:
        if isinstance(n, LCall):
            yield path, n
        elif isinstance(n, LFor):
            yield from _calls_with_path(n.body, path + (n,))
        elif isinstance(n, LIf):
            yield from _calls_with_path(n.then, path)
            yield from _calls_with_path(n.other, path)
