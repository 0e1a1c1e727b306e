"""Loop IR rewriting for the lowering passes: ``tuple[LNode, ...] x Visit -> tuple[LNode, ...]``,
the walk with which most passes of codegen.lower and codegen.gpulower replace nodes, and
``LOOPS``, the nodes that print as loops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tcdsl.polyhedral.loopir import LAccum, LCopy, LFor, LIf, LMark, LNode, LPack, LTile, LTranspose

Visit = Callable[[LNode], "LNode | tuple[LNode, ...] | None"]

LOOPS = (LFor, LTile, LAccum, LTranspose, LPack)  # nodes that print as loops (or wrap them)


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
