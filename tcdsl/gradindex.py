"""Backward-def statements: a forward statement's access solved for the gradient's left side
(``Statement`` x subscripts -> ``Reindex``: plain index names, what the statement's indices become,
the indices left to sum and the guards); and whether a statement writes its whole tensor.
Used by ``tcdsl.gradrules`` as it emits a contribution, and by ``tcdsl.autodiff``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .core import dtypes as T
from .core.affine import FloorDiv, MinMax, Mod, Sym, Var, bounds, floordiv, mod, sign_of
from .core.checked import Statement, Tensor, TExpr, convert, reads
from .derivative import IndexExpr, cmp, const, plain_var, rewrite


@dataclass
class Reindex:
    """An access solved by ``reindex``: the gradient's left-side index names, each statement index
    solved in them (``env``), the statement's indices left free (summed) and the guards."""

    lhs: list[str]
    env: dict[str, Sym]
    free: list[str]
    guards: list[TExpr]


def reindex(s: Statement, subs: tuple, target: Tensor, tensors: Mapping[str, Tensor],
            fresh: Callable[[str], str]) -> Reindex:
    """Plain left-side names for an access ``target(subs)`` of statement ``s``: each subscript
    solves for one of the statement's indices where it can, else becomes an equality test
    (``tensors``: the forward def's, by name; ``fresh`` names each new index)."""
    rng = {r.name: (r.lo, r.hi) for r in s.ranges}
    pivots: dict[str, Sym] = {}
    lhs: list[str | None] = [None] * len(subs)
    for p, sub in enumerate(subs):
        v = plain_var(sub)
        if v is not None and v in rng and v not in pivots:
            lhs[p] = v
            pivots[v] = Sym.var(v, "index")
    raw: list[tuple[str, object, object]] = []
    exact: set[str] = set()  # solved as a remainder: inside its range by construction
    for p, sub in enumerate(subs):
        if lhs[p] is not None:
            continue
        y = fresh(f"x{p}")
        lhs[p] = y
        ysym = Sym.var(y, "index")
        if not isinstance(sub, Sym):
            raw.append(("eq", ysym, sub))
            continue
        sub2 = sub.subs(pivots)
        cands = [(v.name, c) for v, c in sub2.terms if isinstance(v, Var) and v.kind == "index"
                 and v.name in rng and v.name not in pivots and not _nested(sub2, v.name)]
        if not cands:
            raw.append(("eq", ysym, sub2))
            continue
        window = _window(sub2, cands, rng)
        if window is not None:  # a stride over a window no wider than it: both indices solve
            v, c, u, lo, width = window
            num = ysym - (sub2 - Sym.var(v, "index") * c - Sym.var(u, "index"))
            vsol = floordiv(num - lo, c)
            usol = num - vsol * c
            if width < c:
                raw.append(("lt", mod(num - lo, c), width))
            pivots = {q: e.subs({v: vsol, u: usol}) for q, e in pivots.items()}
            pivots[v], pivots[u] = vsol, usol
            exact.add(u)
            continue
        others = [x for q, x in enumerate(subs) if q != p and isinstance(x, Sym)]
        v, c = min(cands, key=lambda vc: (not _implied(s, vc[0], tensors), abs(vc[1]) != 1,
                                          sum(vc[0] in o.indices() for o in others), vc[0] not in s.lhs))
        rest = sub2 - Sym.var(v, "index") * c
        if abs(c) == 1:
            sol = (ysym - rest) * c
        else:
            num = ysym - rest if c > 0 else rest - ysym
            sol = floordiv(num, abs(c))
            raw.append(("div", num, abs(c)))
        pivots = {u: e.subs({v: sol}) for u, e in pivots.items()}
        pivots[v] = sol
    for v in pivots:
        if v in exact:
            continue
        lo_ok, hi_ok = _implied_sides(s, v, tensors, (subs, target.dims))
        if not (lo_ok and hi_ok):
            lo, hi = rng[v]
            raw.append(("box", Sym.var(v, "index"), (None if lo_ok else lo, None if hi_ok else hi)))
    guards: list[TExpr] = []
    idx = T.INDEX
    for kind, a, b in raw:
        if kind == "eq":
            assert isinstance(a, Sym)
            rhs = IndexExpr(idx, b.subs(pivots)) if isinstance(b, Sym) else rewrite(b, index=pivots)  # type: ignore
            guards.append(cmp("==", IndexExpr(idx, a), convert(rhs, idx) if T.is_int(rhs.dtype) else rhs))
        elif kind == "div":
            assert isinstance(a, Sym) and isinstance(b, int)
            guards.append(cmp("==", IndexExpr(idx, mod(a.subs(pivots), b)), const(idx, 0)))
        elif kind == "lt":
            assert isinstance(a, Sym) and isinstance(b, int)
            guards.append(cmp("<", IndexExpr(idx, a), const(idx, b)))
        else:
            assert isinstance(a, Sym) and isinstance(b, tuple)
            e = a.subs(pivots)
            lo, hi = b
            if lo is not None:
                guards.append(cmp(">=", IndexExpr(idx, e), IndexExpr(idx, lo)))
            if hi is not None:
                guards.append(cmp("<", IndexExpr(idx, e), IndexExpr(idx, hi)))
    env = {v: e for v, e in pivots.items() if e != Sym.var(v, "index")}
    free = [v for v in s.indices if v not in pivots]
    return Reindex([y for y in lhs if y is not None], env, free, guards)


def _implied(s: Statement, v: str, tensors: Mapping[str, Tensor],
             target: tuple[tuple, tuple[Sym, ...]] | None = None) -> bool:
    return all(_implied_sides(s, v, tensors, target))


def _implied_sides(s: Statement, v: str, tensors: Mapping[str, Tensor],
                   target: tuple[tuple, tuple[Sym, ...]] | None = None) -> tuple[bool, bool]:
    """Whether the lower and the upper bound of index ``v``'s range in statement ``s`` are each
    where one of its domain accesses (or the ``target`` access, subscripts and dims) leaves its
    tensor, so that dropping that bound keeps the domain."""
    lo, hi = s.range(v).lo, s.range(v).hi
    extra = {} if target is None else {None: target[1]}
    accesses: list[tuple[str | None, tuple]] = [] if target is None else [(None, target[0])]
    accesses += [(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs))]
    accesses += [(r.tensor, r.subs) for r in reads(s.rhs) if not r.conditional]
    accesses += [(a.tensor, a.subs) for a in s.accesses if a.kind == "exists"]
    lo_ok = hi_ok = False
    for tname, subs in accesses:
        dims = extra[None] if tname is None else tensors[tname].dims
        for sub, dim in zip(subs, dims):
            if not isinstance(sub, Sym):
                continue
            off = sub - Sym.var(v, "index")
            if off.is_const():
                lo_ok = lo_ok or same(lo, Sym.of(-off.const))
                hi_ok = hi_ok or same(hi, dim - off.const)
    return lo_ok, hi_ok


def covers(s: Statement, tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``=`` statement ``s`` writes every point of its tensor."""
    if not box_covers(s, tensors):
        return False
    rng = {r.name: (r.lo, r.hi) for r in s.ranges}
    accs: list[tuple[str, tuple]] = [(r.tensor, r.subs) for r in reads(s.rhs) if not r.conditional]
    accs += [(a.tensor, a.subs) for a in s.accesses if a.kind == "exists"]
    for tname, subs in accs:
        for sub, dim in zip(subs, tensors[tname].dims):
            if not isinstance(sub, Sym):
                continue
            lo, hi = bounds(sub, rng)
            if sign_of(lo) != 1 and not (lo.is_const() and lo.const >= 0):
                return False
            if sign_of(dim - 1 - hi) != 1:
                return False
    return True


def box_covers(s: Statement, tensors: Mapping[str, Tensor]) -> bool:
    """Whether statement ``s``'s ranges span its whole tensor (each from 0 to its dim)."""
    dims = tensors[s.tensor].dims
    return all(r.lo.is_const() and r.lo.const == 0 and same(r.hi, d) for r, d in zip(s.ranges, dims))


def _window(sub: Sym, cands: list[tuple[str, int]], rng: Mapping[str, tuple[Sym, Sym]]
            ) -> tuple[str, int, str, Sym, int] | None:
    """``(v, c, u, lo, width)`` when ``sub`` is ``c*v + u + ...`` with a stride ``c > 1`` and an
    index ``u`` whose range ``lo:lo + width`` is no wider than ``c`` (a pooling window, a
    non-overlapping patch): each value of ``sub`` then comes from at most one ``(v, u)``, so both
    solve (``v = (y - lo) / c``, ``u`` the remainder) and no sum over ``u`` is left."""
    for u, cu in cands:
        if cu != 1:
            continue
        lo, hi = rng[u]
        width = hi - lo
        if not width.is_const() or width.const < 1:
            continue
        for v, c in cands:
            if v != u and c >= max(2, width.const):
                return v, c, u, lo, width.const
    return None


def _nested(s: Sym, v: str) -> bool:
    """Whether index ``v`` occurs in ``s`` inside a floor division, modulo, min or max."""
    return any(isinstance(a, (FloorDiv, Mod, MinMax)) and v in Sym.of(a).indices() for a, _ in s.terms)


def same(a: Sym, b: Sym) -> bool:
    """Whether two affine forms are equal for all sizes (their difference is the constant 0)."""
    d = a - b
    return d.is_const() and d.const == 0
