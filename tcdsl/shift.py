"""Shift invariance for reverse mode: ``CheckedDef -> set of temporaries`` whose gradient is zero
because no output changes when they shift (the running max a stable softmax or log-sum-exp
subtracts). Used by ``tcdsl.gradrules``, which then sends no gradient through them.

A temporary ``m`` written by one statement is shifted by an arbitrary ``delta`` per element; the
walk follows the def forward and describes each value's first-order change exactly, in one of two
forms, or gives up:

- additive: ``V(x)`` changes by ``c * delta(x[pos])`` (``X(n, d) - m(n)``: c = -1);
- multiplicative: ``V(x)`` changes by ``k * delta(x[pos]) * V(x)`` (``exp(X(n, d) - m(n))``: k = -1;
  its sum over ``d``: k = -1; the quotient of the two: k = 0, unchanged).

``m`` is invariant when every output ends unchanged (c = 0 or k = 0). Constants stay exact
(fractions), so cancellation is decided symbolically, never by rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .core import dtypes as T
from .core.affine import Sym
from .core.checked import Binop, Call, CheckedDef, Const, Convert, Read, Select, Statement, TExpr, Unop, reads
from .derivative import plain_var


@dataclass(frozen=True)
class Change:
    """The first-order change of a value: ``kind`` "add" (by ``coef * delta(key)``) or "mul" (by
    ``coef * delta(key) * value``); ``key`` names the indices ``delta`` is taken at: index names in
    an expression, the value's own dim positions for a tensor."""

    kind: str
    coef: Fraction
    key: tuple


ZERO: Change | None = Change("zero", Fraction(0), ())
UNKNOWN = None  # a change of neither form: the walk gives up on what depends on it


def _make(kind: str, coef: Fraction, key: tuple) -> Change:
    return ZERO if coef == 0 else Change(kind, coef, key)  # type: ignore[return-value]


def invariant_shifts(c: CheckedDef, active: set[str]) -> set[str]:
    """The float temporaries in ``active``, each written by one statement, whose shift leaves every
    output unchanged (so their gradient is zero and need not be computed)."""
    writes: dict[str, list[Statement]] = {}
    for s in c.stmts:
        writes.setdefault(s.tensor, []).append(s)
    out = set()
    for t in c.temps:
        if t.name in active and T.is_float(t.dtype) and len(writes.get(t.name, ())) == 1 and t.dims \
                and _outputs_unchanged(c, t.name):
            out.add(t.name)
    return out


def _outputs_unchanged(c: CheckedDef, m: str) -> bool:
    changes: dict[str, Change | None] = {}  # tensor -> change of its current value (absent: unchanged)
    for s in c.stmts:
        if s.tensor == m:
            changes[m] = Change("add", Fraction(1), tuple(range(len(s.lhs))))
            continue
        changes[s.tensor] = _statement(s, changes)
    return all(changes.get(t.name, ZERO) is ZERO for t in c.outputs)


def _statement(s: Statement, changes: dict[str, Change | None]) -> Change | None:
    rhs = _expr(s.rhs, changes)
    if s.reductions and rhs is not ZERO:
        if rhs is UNKNOWN or any(v in s.reductions for v in rhs.key):
            return UNKNOWN
        if not (rhs.kind == "mul" and s.op == "+" or s.op in ("min", "max")):
            return UNKNOWN  # a sum of additive changes grows with the range; products are not followed
    if not s.init and s.op != "=":  # an update: combine with the value before
        before = _read(Read(s.rhs.dtype, s.tensor, tuple(Sym.var(i, "index") for i in s.lhs)), changes)
        rhs = _add(before, rhs, 1) if s.op == "+" else _same(before, rhs) if s.op in ("min", "max") else \
            (UNKNOWN if before is not ZERO or rhs is not ZERO else ZERO)
    if rhs is not UNKNOWN and rhs is not ZERO:
        rhs = UNKNOWN if any(v not in s.lhs for v in rhs.key) else \
            Change(rhs.kind, rhs.coef, tuple(s.lhs.index(v) for v in rhs.key))
    if s.tensor in changes and (s.op == "=" or s.init) and rhs != changes[s.tensor]:
        return UNKNOWN  # written again, perhaps in part: its elements would change in different ways
    return rhs


def _read(r: Read, changes: dict[str, Change | None]) -> Change | None:
    ch = changes.get(r.tensor, ZERO)
    if ch is ZERO or ch is UNKNOWN:
        return ch
    key = [plain_var(r.subs[p]) for p in ch.key]
    if None in key:
        return UNKNOWN  # delta taken at a computed or gathered index: not followed
    return Change(ch.kind, ch.coef, tuple(key))


def _expr(e: TExpr, changes: dict[str, Change | None]) -> Change | None:
    if not T.is_float(e.dtype):
        return ZERO if all(changes.get(r.tensor, ZERO) is ZERO for r in reads(e)) else UNKNOWN
    if isinstance(e, Read):
        return _read(e, changes)
    if isinstance(e, Convert):
        return _expr(e.arg, changes)
    if isinstance(e, Unop):
        a = _expr(e.arg, changes)
        return a if a is ZERO or a is UNKNOWN or a.kind == "mul" else Change("add", -a.coef, a.key)
    if isinstance(e, Binop):
        a, b = _expr(e.lhs, changes), _expr(e.rhs, changes)
        if e.op in ("+", "-"):
            return _add(a, b, 1 if e.op == "+" else -1)
        if e.op in ("*", "/"):
            return _scale(a, b, 1 if e.op == "*" else -1)
        return ZERO if a is ZERO and b is ZERO else UNKNOWN
    if isinstance(e, Select):
        cond, a, b = _expr(e.cond, changes), _expr(e.then, changes), _expr(e.other, changes)
        if cond is not ZERO:
            return UNKNOWN
        if _is_zero(e.then) and b is not UNKNOWN and (b is ZERO or b.kind == "mul"):
            return b  # 0 scales to 0
        if _is_zero(e.other) and a is not UNKNOWN and (a is ZERO or a.kind == "mul"):
            return a
        return _same(a, b)
    if isinstance(e, Call):
        args = [_expr(x, changes) for x in e.args]
        if all(a is ZERO for a in args):
            return ZERO
        if e.fn in ("fmax", "fmin", "max", "min"):
            return _same(*args)
        a = args[0] if len(args) == 1 else UNKNOWN
        if a is UNKNOWN or a is ZERO:
            return a
        if e.fn == "exp" and a.kind == "add":
            return Change("mul", a.coef, a.key)
        if e.fn == "log" and a.kind == "mul":
            return Change("add", a.coef, a.key)
        if e.fn in ("sqrt", "rsqrt") and a.kind == "mul":
            return Change("mul", a.coef / 2 if e.fn == "sqrt" else -a.coef / 2, a.key)
        return UNKNOWN
    return ZERO  # constants, indices, sizes


def _is_zero(e: TExpr) -> bool:
    return isinstance(e, Const) and e.value == 0


def _keys_agree(a: Change, b: Change) -> bool:
    return a is ZERO or b is ZERO or a.key == b.key


def _add(a: Change | None, b: Change | None, sign: int) -> Change | None:
    """The change of ``a + sign * b``."""
    if a is UNKNOWN or b is UNKNOWN or not _keys_agree(a, b):
        return UNKNOWN
    if a is ZERO and b is ZERO:
        return ZERO
    if b is ZERO:
        return a if a.kind == "add" else UNKNOWN
    if a is ZERO:
        return Change("add", sign * b.coef, b.key) if b.kind == "add" else UNKNOWN
    if a.kind == b.kind == "add":
        return _make("add", a.coef + sign * b.coef, a.key)
    if a.kind == b.kind == "mul" and a.coef == b.coef:
        return a
    return UNKNOWN


def _scale(a: Change | None, b: Change | None, sign: int) -> Change | None:
    """The change of ``a * b`` (sign 1) or ``a / b`` (sign -1)."""
    if a is UNKNOWN or b is UNKNOWN or not _keys_agree(a, b):
        return UNKNOWN
    if (a is not ZERO and a.kind == "add") or (b is not ZERO and b.kind == "add"):
        return UNKNOWN
    ka = a.coef if a is not ZERO else Fraction(0)
    kb = b.coef if b is not ZERO else Fraction(0)
    key = a.key if a is not ZERO else b.key
    return _make("mul", ka + sign * kb, key)


def _same(*xs: Change | None) -> Change | None:
    """The change of a choice between values (max, min, a select): theirs when they all agree."""
    first = xs[0]
    return first if all(x == first for x in xs[1:]) else UNKNOWN
