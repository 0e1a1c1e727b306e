"""Backward-def statements before printing: ``list[Line | str] -> list[Line | str]`` (``str``: a
comment). Used by ``tcdsl.autodiff`` once every gradient statement is derived, so the printed
backward def is what runs:

- a gradient's first contribution ``G(i) = a`` and a later elementwise ``G(i) += b`` over the same
  ranges become one statement ``G(i) = a + b`` at the later place (one pass over ``G``, not two);
- a temporary written by one cheap ``=`` statement (no builtin calls, a few operations) is
  substituted into the statements that read it once per point of their loops, and is then not
  stored at all (softmax's ``e = Y * s``, layernorm's ``xc = X - mean``).

Values are unchanged to the bit: a merge adds the same two terms, and a substituted temporary has
the type of its expression (the backward def infers it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .core.affine import Sym, Var
from .core.checked import Binop, Call, Read, Select, TExpr, operands, reads
from .derivative import rewrite, text

INLINE_OPS = 4  # most arithmetic operations a temporary may take to be substituted into its readers
_RANGE = re.compile(r"^(\w+) in (.+)$")
_EXISTS = re.compile(r"\b(\w+)\(")


@dataclass(frozen=True)
class Line:
    """One statement of a backward def: ``name(idx) op value where ...``."""

    name: str
    idx: tuple[str, ...]
    op: str  # "=", "+=", "+=!", "max=!", ...
    value: TExpr
    where: tuple[str, ...]

    def __str__(self) -> str:
        lhs = f"{self.name}({', '.join(self.idx)})" if self.idx else self.name
        line = f"{lhs} {self.op} {text(self.value)}"
        return line + (" where " + ", ".join(self.where) if self.where else "")

    def reads(self) -> set[str]:
        out = {r.tensor for r in reads(self.value)}
        for w in self.where:
            if w.startswith("exists "):
                out.update(_EXISTS.findall(w))
        if self.op != "=" and not self.op.endswith("!"):
            out.add(self.name)  # an update reads the value before it
        return out

    def ranges(self) -> dict[str, str] | None:
        """Index -> range text when ``where`` only gives the ranges of the left side's indices."""
        out = {}
        for w in self.where:
            m = _RANGE.match(w)
            if m is None:
                return None
            out[m.group(1)] = m.group(2)
        return out if set(out) == set(self.idx) and len(out) == len(self.idx) else None

    def loop_indices(self) -> set[str]:
        return set(self.idx) | {m.group(1) for w in self.where if (m := _RANGE.match(w))}


def tidy(items: list[Line | str], keep: set[str]) -> list[Line | str]:
    """Merged contributions and substituted temporaries (``keep``: tensors that must stay, the
    def's outputs); comments left heading nothing are dropped."""
    items = list(items)
    while _merge_one(items) or _inline_one(items, keep):
        pass
    out: list[Line | str] = []
    for k, x in enumerate(items):
        if isinstance(x, str) and (k + 1 == len(items) or isinstance(items[k + 1], str)):
            continue
        out.append(x)
    return out


def _lines(items: list[Line | str], lo: int, hi: int) -> list[Line]:
    return [x for x in items[lo:hi] if isinstance(x, Line)]


def _merge_one(items: list[Line | str]) -> bool:
    for i, b in enumerate(items):
        if not isinstance(b, Line) or b.op != "+=" or (rb := b.ranges()) is None:
            continue
        j = next((j for j in range(i - 1, -1, -1) if isinstance(x := items[j], Line) and x.name == b.name), None)
        if j is None:
            continue
        a = items[j]
        assert isinstance(a, Line)
        ra = a.ranges()
        if a.op != "=" or ra is None or len(a.idx) != len(b.idx) or a.value.dtype != b.value.dtype \
                or any(ra[x] != rb[y] for x, y in zip(a.idx, b.idx)) or b.name in {r.tensor for r in reads(b.value)}:
            continue
        between = _lines(items, j + 1, i)
        if any(b.name in x.reads() or x.name in a.reads() for x in between):
            continue
        env = {y: Sym.var(x, "index") for x, y in zip(a.idx, b.idx)}
        items[i] = replace(a, value=Binop(a.value.dtype, "+", a.value, rewrite(b.value, index=env)))
        del items[j]
        return True
    return False


def _inline_one(items: list[Line | str], keep: set[str]) -> bool:
    for i, t in enumerate(items):
        if not isinstance(t, Line) or t.op != "=" or t.name in keep or t.ranges() is None \
                or _ops(t.value) > INLINE_OPS:
            continue
        later = _lines(items, i + 1, len(items))
        if any(x.name == t.name for x in _lines(items, 0, i) + later):
            continue  # written elsewhere too
        if any(x.name in t.reads() for x in later):
            continue  # what it reads changes after it
        readers = [x for x in later if t.name in x.reads()]
        if not readers or not all(_substitutable(t, x) for x in readers):
            continue
        for k in range(i + 1, len(items)):
            x = items[k]
            if isinstance(x, Line) and x in readers:
                items[k] = replace(x, value=_substitute(x.value, t))
        del items[i]
        return True
    return False


def _substitutable(t: Line, x: Line) -> bool:
    """Whether ``x`` reads ``t`` only in its value, each point of ``t`` once per point of ``x``'s
    loops (as the read costed): every subscript one of its loop indices plus a constant, each
    index in one subscript, all of them used. A window's ``x2 / 2`` reads a point four times, a
    contraction's operand once per other index: those keep the statement."""
    if any(w.startswith("exists ") and t.name in _EXISTS.findall(w) for w in x.where):
        return False
    loops = x.loop_indices()
    for r in reads(x.value):
        if r.tensor == t.name:
            used = []
            for s in r.subs:
                if not isinstance(s, Sym):
                    return False
                terms = [(a, c) for a, c in s.terms if isinstance(a, Var) and a.kind == "index"]
                if len(terms) != 1 or len(s.terms) != 1 or abs(terms[0][1]) != 1:
                    return False
                used.append(terms[0][0].name)
            if len(set(used)) != len(used) or set(used) != loops:
                return False
    return True


def _substitute(e: TExpr, t: Line) -> TExpr:
    def read(r: Read) -> TExpr:
        if r.tensor != t.name:
            return r
        return rewrite(t.value, index={i: s for i, s in zip(t.idx, r.subs) if isinstance(s, Sym)})
    return rewrite(e, read=read)


def _ops(e: TExpr) -> int:
    """Arithmetic operations in ``e``; a builtin call counts as too many."""
    if isinstance(e, Call):
        return INLINE_OPS + 1
    if isinstance(e, Read):
        return sum(_ops(s) for s in e.subs if isinstance(s, TExpr))
    kids = operands(e)
    return (1 if kids else 0) + (1 if isinstance(e, Select) else 0) + sum(_ops(k) for k in kids)
