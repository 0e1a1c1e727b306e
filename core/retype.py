"""Retyping (``A.Def -> A.Def``): the same def with some element types replaced, e.g. a float32 def
made float64 for ``torch.autograd.gradcheck`` (``Kernel.double``).
"""

from __future__ import annotations

from collections.abc import Mapping

from . import ast as A
from . import dtypes as T


def retyped(d: A.Def, types: Mapping[str, str]) -> A.Def:
    """``d`` with every declared type and cast whose canonical type is a key of ``types`` (canonical
    names: ``float32``) given the value instead; inferred types follow from those."""

    def ty(t: str) -> str:
        return types.get(T.ALIASES.get(t, t), t)

    def expr(e: A.Expr) -> A.Expr:
        if isinstance(e, A.Cast):
            return A.Cast(ty(e.type), expr(e.arg), e.span)
        return A.map_children(e, expr)

    params = tuple(A.Param(ty(p.type), p.name, p.dims, p.span) for p in d.params)
    outputs = tuple(A.Output(o.name, ty(o.type) if o.type else None, o.dims, o.span) for o in d.outputs)
    stmts = tuple(A.Stmt(s.lhs, s.indices, s.op, expr(s.rhs), tuple(A.map_children(w, expr) for w in s.wheres), s.span,
                         s.annotation) for s in d.stmts)
    return A.Def(d.name, params, outputs, stmts, d.span)
