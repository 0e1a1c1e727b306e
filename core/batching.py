"""Batching (``A.Def -> A.Def``): the def that runs a def over a leading batch index, for ``torch.vmap``.

Every tensor that carries the batch (the inputs named, every output and temporary) gets a leading
dimension of a new size symbol, and every write and read of it a leading index; inputs not named
are read as before, shared by the whole batch. The batch is then one kernel whose outermost loop
is parallel, not a loop of calls.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from . import ast as A
from .printer import definition

BATCH_SIZE, BATCH_INDEX = "VMAP_B", "vmap_b"  # renamed with a number where the def uses the name already


def _fresh(base: str, taken: str) -> str:
    name, n = base, 0
    while re.search(rf"\b{name}\b", taken):
        n += 1
        name = f"{base}{n}"
    return name


def _names(node: object) -> set[str]:
    """The names read in an expression or where clause (tensors among them)."""
    if isinstance(node, (A.Name, A.Apply)):
        own = {node.name}
        return own | set().union(*map(_names, node.args)) if isinstance(node, A.Apply) else own
    if isinstance(node, (A.Expr, A.WhereRange, A.WhereExists, A.WhereLet)):
        return set().union(*(_names(v) for v in vars(node).values() if isinstance(v, (A.Expr, A.Where))))
    return set()


def carried(d: A.Def, inputs: Collection[str]) -> frozenset[str]:
    """The tensors whose values depend on the batched ``inputs``: those, and every tensor a
    statement writes from one of them (to a fixed point: a later statement may make an earlier
    written tensor depend on the batch)."""
    carry = set(inputs)
    reads = [(s.lhs.name, _names(s.rhs).union(*map(_names, s.wheres))) for s in d.stmts]
    while True:
        more = {lhs for lhs, names in reads if lhs not in carry and names & carry}
        if not more:
            return frozenset(carry)
        carry |= more


def batched(d: A.Def, inputs: Collection[str]) -> tuple[A.Def, frozenset[str]]:
    """``d`` over a leading batch, and the tensors that carry it: ``inputs`` (names of params) and
    every output and temporary computed from them get the leading dimension; the rest (inputs not
    named, tensors that depend on none of them) are shared by the whole batch."""
    text = definition(d)
    size, index = _fresh(BATCH_SIZE, text), _fresh(BATCH_INDEX, text)
    known = {p.name.name for p in d.params}
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise ValueError(f"def '{d.name.name}' has no input {', '.join(unknown)}")
    if not inputs:
        raise ValueError(f"def '{d.name.name}': a batch needs at least one batched input")
    carry = carried(d, inputs)
    bdim, bidx = A.Dim(name=size), A.Ident(index)

    def expr(e: A.Expr) -> A.Expr:
        if isinstance(e, A.Name) and e.name in carry:
            return A.Apply(e.name, (A.Name(index),), e.span)
        if isinstance(e, A.Apply) and e.name in carry:
            return A.Apply(e.name, (A.Name(index),) + tuple(expr(a) for a in e.args), e.span)
        return A.map_children(e, expr)

    # the batch index's range is given, not inferred: a statement may read no batched tensor
    batch_range = A.WhereRange(bidx, A.Num(0, False), A.Name(size))
    params = tuple(A.Param(p.type, p.name, (bdim,) + (p.dims or ()), p.span) if p.name.name in inputs else p
                   for p in d.params)
    outputs = tuple(A.Output(o.name, o.type, (bdim,) + o.dims, o.span)
                    if o.dims is not None and o.name.name in carry else o for o in d.outputs)
    stmts = tuple(A.Stmt(s.lhs, (bidx,) + (s.indices or ()), s.op, expr(s.rhs),
                         (batch_range,) + tuple(A.map_children(w, expr) for w in s.wheres), s.span, s.annotation)
                  if s.lhs.name in carry else s for s in d.stmts)
    return A.Def(d.name, params, outputs, stmts, d.span), carry
