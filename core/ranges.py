"""Range inference: the symbolic half-open range of every index of a statement.

Solved as TC does, in rounds: an access subscript in which exactly one index is still unknown
bounds that index so that the access stays inside its tensor for every value of the known
ones; all bounds found in one round are intersected, TC's rule: ``0:N`` from one tensor and
``0:M`` from another give ``0:min(N, M)``, the largest range in which every read is in bounds
(``tcdsl check`` and ``explain`` print what was chosen). ``where i in lo:hi`` fixes a range
outright (padding by domain).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ast as A
from .affine import FloorDiv, Sym, Var, bounds, ceildiv, floordiv, smax, smin
from .checked import Access, IndexRange
from .errors import TcRangeError


@dataclass(frozen=True)
class Bound:
    lo: Sym
    hi: Sym  # exclusive
    access: Access
    dim: int


def infer(indices: list[str], given: dict[str, tuple[Sym, Sym]], accesses: list[tuple[Access, tuple[Sym, ...]]],
          spans: dict[str, A.Span], show: dict[int, str], what: str) -> tuple[IndexRange, ...]:
    """Ranges for ``indices`` (in order). ``accesses`` pairs each access with its tensor's dims;
    ``show[id(access)]`` is its source text for messages; ``what`` names the statement."""
    known: dict[str, tuple[Sym, Sym]] = dict(given)
    unknown = [i for i in indices if i not in known]
    while unknown:
        found: dict[str, list[Bound]] = {}
        padded: dict[str, list[Bound]] = {}  # bounds from subscripts that involve a where-given index
        for acc, dims in accesses:
            for d, (sub, extent) in enumerate(zip(acc.subs, dims)):
                if sub is None:
                    continue
                free = [i for i in sub.indices() if i not in known]
                if len(free) != 1:
                    continue
                solved = _solve(sub, Var(free[0], "index"), Sym.of(0), extent - 1, known)
                if solved is not None:
                    tier = padded if sub.indices() & given.keys() else found
                    tier.setdefault(free[0], []).append(Bound(solved[0], solved[1], acc, d))
        for name, cands in padded.items():
            found.setdefault(name, cands)
        if not found:
            break
        for name, cands in found.items():
            known[name] = _intersect(cands)
        unknown = [i for i in unknown if i not in known]
    if unknown:
        name = unknown[0]
        raise TcRangeError(_unsolved_message(name, accesses, show, what), spans[name].location())
    return tuple(IndexRange(name, *known[name], name in given) for name in indices)  # an empty range runs no points


def _solve(sub: Sym, u: Var, lo: Sym, hi: Sym, known: dict[str, tuple[Sym, Sym]]) -> tuple[Sym, Sym] | None:
    """The range of ``u`` (half-open) that keeps ``lo <= sub <= hi`` for every value of the
    other indices, or None when ``u`` does not appear in a solvable position."""
    a = sub.coeff(u)
    inside = [t for t in sub.atoms() if not isinstance(t, Var) and u.name in Sym.of(t).indices()]
    if a != 0 and not inside:
        rmin, rmax = bounds(sub.without(u), known)
        if a > 0:
            return ceildiv(lo - rmin, a), floordiv(hi - rmax, a) + 1
        b = -a
        return ceildiv(rmax - hi, b), floordiv(rmin - lo, b) + 1
    if a == 0 and len(inside) == 1 and isinstance(inside[0], FloorDiv):
        atom = inside[0]
        c = sub.coeff(atom)  # type: ignore[arg-type]
        if c <= 0:
            return None
        rmin, rmax = bounds(sub.without(atom), known)
        q_lo, q_hi = ceildiv(lo - rmin, c), floordiv(hi - rmax, c)
        return _solve(atom.num, u, q_lo * atom.den, q_hi * atom.den + (atom.den - 1), known)
    return None


def _intersect(cands: list[Bound]) -> tuple[Sym, Sym]:
    """TC's rule: the largest range in which every read is in bounds, the intersection of the
    candidates (``0:min(N, M)`` when one read gives ``0:N`` and another ``0:M``)."""
    return smax(*(c.lo for c in cands)), smin(*(c.hi for c in cands))


def _unsolved_message(name: str, accesses: list[tuple[Access, tuple[Sym, ...]]], show: dict[int, str],
                      what: str) -> str:
    uses = [(show.get(id(acc), acc.tensor), s) for acc, _ in accesses for s in acc.subs
            if s is not None and name in s.indices()]
    if not uses:
        reason = "it is not used in any tensor subscript"
        hint = f"write `where {name} in lo:hi` or `where exists T({name}, ...)`"
    elif all(s.indices() == {name} for _, s in uses):
        reason = "its subscripts do not bound it (a modulo or a nested use), in " + \
            ", ".join(dict.fromkeys(t for t, _ in uses))
        hint = f"write `where {name} in lo:hi`"
    else:
        reason = "it only appears in subscripts together with other unknown indices, in " + \
            ", ".join(dict.fromkeys(t for t, _ in uses))
        hint = f"write `where {name} in lo:hi`"
    return f"cannot infer the range of index '{name}' in {what}: {reason}; {hint}"
