"""Quasi-affine expressions over size symbols and indices (``Sym``), used for subscripts and ranges.

A ``Sym`` is an integer constant plus integer multiples of atoms; an atom is a variable (size
symbol or index), a floor division or modulo of a Sym by a positive literal, or a min/max of Syms.
Smart constructors simplify what they can prove (exact divisions, min/max of Syms that differ by
a constant), so ranges print as users write them: ``H - KH + 1``, ``(H - KH) / 2 + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np


@dataclass(frozen=True)
class Var:
    name: str
    kind: str  # "size" or "index"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloorDiv:
    num: Sym
    den: int

    def __str__(self) -> str:
        return f"{_paren(self.num)} / {self.den}"


@dataclass(frozen=True)
class Mod:
    num: Sym
    den: int

    def __str__(self) -> str:
        return f"{_paren(self.num)} % {self.den}"


@dataclass(frozen=True)
class MinMax:
    op: str  # "min" or "max"
    args: tuple[Sym, ...]

    def __str__(self) -> str:
        return f"{self.op}({', '.join(str(a) for a in self.args)})"


Atom = Union[Var, FloorDiv, Mod, MinMax]  # noqa: UP007 (a runtime alias)


def _paren(s: Sym) -> str:
    text = str(s)
    return text if s.is_atomic() else f"({text})"


def _key(a: Atom) -> tuple[int, str]:
    order = {Var: 0, FloorDiv: 1, Mod: 2, MinMax: 3}[type(a)]
    return (order, str(a))


@dataclass(frozen=True)
class Sym:
    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # ---- construction ----
    @staticmethod
    def make(terms: Mapping[Atom, int] | None = None, const: int = 0) -> Sym:
        items = [(a, c) for a, c in (terms or {}).items() if c != 0]
        items.sort(key=lambda t: _key(t[0]))
        return Sym(tuple(items), int(const))

    @staticmethod
    def of(x: int | Atom | Sym) -> Sym:
        if isinstance(x, Sym):
            return x
        if isinstance(x, (int, np.integer)):
            return Sym((), int(x))
        return Sym.make({x: 1})

    @staticmethod
    def var(name: str, kind: str) -> Sym:
        return Sym.make({Var(name, kind): 1})

    # ---- arithmetic ----
    def _dict(self) -> dict[Atom, int]:
        return dict(self.terms)

    def __add__(self, other: int | Sym) -> Sym:
        o = Sym.of(other)
        d = self._dict()
        for a, c in o.terms:
            d[a] = d.get(a, 0) + c
        return Sym.make(d, self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> Sym:
        return self * -1

    def __sub__(self, other: int | Sym) -> Sym:
        return self + (-Sym.of(other))

    def __rsub__(self, other: int | Sym) -> Sym:
        return Sym.of(other) - self

    def __mul__(self, k: int | Sym) -> Sym:
        if isinstance(k, Sym):
            if k.is_const():
                k = k.const
            elif self.is_const():
                return k * self.const
            else:
                raise ValueError("product of two non-constant expressions is not affine")
        return Sym.make({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    # ---- queries ----
    def is_const(self) -> bool:
        return not self.terms

    def is_atomic(self) -> bool:
        return (not self.terms) or (len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0)

    def coeff(self, v: Var) -> int:
        return dict(self.terms).get(v, 0)

    def atoms(self) -> tuple[Atom, ...]:
        return tuple(a for a, _ in self.terms)

    def free_vars(self) -> frozenset[Var]:
        out: set[Var] = set()
        for a, _ in self.terms:
            if isinstance(a, Var):
                out.add(a)
            elif isinstance(a, (FloorDiv, Mod)):
                out |= a.num.free_vars()
            else:
                for s in a.args:
                    out |= s.free_vars()
        return frozenset(out)

    def indices(self) -> frozenset[str]:
        return frozenset(v.name for v in self.free_vars() if v.kind == "index")

    def without(self, atom: Atom) -> Sym:
        return Sym.make({a: c for a, c in self.terms if a != atom}, self.const)

    # ---- evaluation ----
    def eval(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with ints or integer numpy arrays bound to the variables (floor semantics)."""
        total: Any = self.const
        for a, c in self.terms:
            total = total + c * _eval_atom(a, env)
        return total

    def subs(self, env: Mapping[str, Sym]) -> Sym:
        """Substitute Syms for variables, re-simplifying."""
        total = Sym.of(self.const)
        for a, c in self.terms:
            total = total + c * _subs_atom(a, env)
        return total

    # ---- printing ----
    def __str__(self) -> str:
        parts: list[str] = []
        for a, c in sorted(self.terms, key=lambda t: t[1] < 0):
            text = str(a)
            if isinstance(a, (FloorDiv, Mod)) and c != 1:
                text = f"({text})"
            mag = abs(c)
            piece = text if mag == 1 else f"{mag}*{text}"
            if not parts:
                parts.append(piece if c > 0 else f"-{piece}")
            else:
                parts.append(("+ " if c > 0 else "- ") + piece)
        if self.const or not parts:
            if not parts:
                parts.append(str(self.const))
            else:
                parts.append(("+ " if self.const > 0 else "- ") + str(abs(self.const)))
        return " ".join(parts)

    def isl(self) -> str:
        """The expression in isl's syntax (floor divisions spelled ``floor((e)/k)``)."""
        text = str(self.const)
        for a, c in self.terms:
            text += f" {'+' if c > 0 else '-'} {abs(c)}*{_isl_atom(a)}"
        return text


def _eval_atom(a: Atom, env: Mapping[str, Any]) -> Any:
    if isinstance(a, Var):
        return env[a.name]
    if isinstance(a, FloorDiv):
        return a.num.eval(env) // a.den
    if isinstance(a, Mod):
        v = a.num.eval(env)
        return v % a.den
    vals = [s.eval(env) for s in a.args]
    if all(_is_int(v) for v in vals):
        return min(vals) if a.op == "min" else max(vals)
    f = np.minimum if a.op == "min" else np.maximum
    out = vals[0]
    for v in vals[1:]:
        out = f(out, v)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer))


def _subs_atom(a: Atom, env: Mapping[str, Sym]) -> Sym:
    if isinstance(a, Var):
        return env.get(a.name, Sym.of(a))
    if isinstance(a, FloorDiv):
        return floordiv(a.num.subs(env), a.den)
    if isinstance(a, Mod):
        return mod(a.num.subs(env), a.den)
    args = [s.subs(env) for s in a.args]
    return smin(*args) if a.op == "min" else smax(*args)


def _isl_atom(a: Atom) -> str:
    if isinstance(a, Var):
        return a.name
    if isinstance(a, FloorDiv):
        return f"floor(({a.num.isl()})/{a.den})"
    if isinstance(a, Mod):
        return f"(({a.num.isl()}) mod {a.den})"
    return f"{a.op}({', '.join(s.isl() for s in a.args)})" if len(a.args) == 2 else \
        _isl_atom(MinMax(a.op, (a.args[0], Sym.of(MinMax(a.op, a.args[1:])))))


# ---- smart constructors ------------------------------------------------------------------------


def floordiv(s: Sym, k: int) -> Sym:
    """floor(s / k) for a positive literal k, simplified when exact."""
    if k <= 0:
        raise ValueError("division by a non-positive literal")
    if k == 1:
        return s
    if s.is_const():
        return Sym.of(s.const // k)
    if all(c % k == 0 for _, c in s.terms):
        return Sym.make({a: c // k for a, c in s.terms}, s.const // k)
    return Sym.make({FloorDiv(s, k): 1})


def ceildiv(s: Sym, k: int) -> Sym:
    return -floordiv(-s, k)


def mod(s: Sym, k: int) -> Sym:
    if k <= 0:
        raise ValueError("modulo by a non-positive literal")
    if s.is_const():
        return Sym.of(s.const % k)
    if all(c % k == 0 for _, c in s.terms):
        return Sym.of(s.const % k)
    return Sym.make({Mod(s, k): 1})


def _extreme(op: str, args: tuple[Sym, ...]) -> Sym:
    flat: list[Sym] = []
    for a in args:
        if len(a.terms) == 1 and a.const == 0 and a.terms[0][1] == 1 and isinstance(a.terms[0][0], MinMax) \
                and a.terms[0][0].op == op:
            flat.extend(a.terms[0][0].args)
        else:
            flat.append(a)
    kept: list[Sym] = []
    for a in flat:
        for i, b in enumerate(kept):
            sign = sign_of(a - b)
            if sign is not None:
                if (op == "min" and sign < 0) or (op == "max" and sign > 0):
                    kept[i] = a
                break
        else:
            kept.append(a)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=str)
    return Sym.make({MinMax(op, tuple(kept)): 1})


def sign_of(s: Sym) -> int | None:
    """+1 if ``s >= 0`` for every size value (sizes are never negative), -1 if ``s <= 0``, else None."""
    if s.is_const():
        return 1 if s.const >= 0 else -1
    if not all(isinstance(a, Var) and a.kind == "size" for a in s.atoms()):
        return None
    signs = {c > 0 for _, c in s.terms}
    if len(signs) != 1:
        return None
    pos = signs.pop()
    if pos and s.const >= 0:
        return 1
    if not pos and s.const <= 0:
        return -1
    return None


def smin(*args: Sym) -> Sym:
    return _extreme("min", tuple(Sym.of(a) for a in args))


def smax(*args: Sym) -> Sym:
    return _extreme("max", tuple(Sym.of(a) for a in args))


def bounds(s: Sym, ranges: Mapping[str, tuple[Sym, Sym]]) -> tuple[Sym, Sym]:
    """Inclusive [min, max] of ``s`` when each index ``i`` ranges over ``ranges[i] = (lo, hi)`` (half-open)."""
    lo = Sym.of(s.const)
    hi = Sym.of(s.const)
    for a, c in s.terms:
        amin, amax = _atom_bounds(a, ranges)
        if c > 0:
            lo, hi = lo + c * amin, hi + c * amax
        else:
            lo, hi = lo + c * amax, hi + c * amin
    return lo, hi


def _atom_bounds(a: Atom, ranges: Mapping[str, tuple[Sym, Sym]]) -> tuple[Sym, Sym]:
    if isinstance(a, Var):
        if a.kind == "index":
            lo, hi = ranges[a.name]
            return lo, hi - 1
        return Sym.of(a), Sym.of(a)
    if isinstance(a, FloorDiv):
        lo, hi = bounds(a.num, ranges)
        return floordiv(lo, a.den), floordiv(hi, a.den)
    if isinstance(a, Mod):
        lo, hi = bounds(a.num, ranges)
        if lo.is_const() and hi.is_const() and lo.const // a.den == hi.const // a.den:
            return Sym.of(lo.const % a.den), Sym.of(hi.const % a.den)
        return Sym.of(0), Sym.of(a.den - 1)
    pairs = [bounds(s, ranges) for s in a.args]
    f = smin if a.op == "min" else smax
    return f(*(p[0] for p in pairs)), f(*(p[1] for p in pairs))
