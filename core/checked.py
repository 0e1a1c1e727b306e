"""Checked def: the output of semantic analysis and range inference (``Def -> CheckedDef``).

Expressions are typed (``TExpr``, every implicit conversion explicit as ``Convert``), subscripts
are quasi-affine ``Sym``s or typed gather expressions, and every statement carries the symbolic
range of each index and the accesses that bound its domain. ``str(checked)`` is the text that
``tcdsl check`` prints.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Union

from . import ast as A
from . import dtypes as T
from .affine import Sym
from .printer import definition


@dataclass(frozen=True)
class TExpr:
    dtype: str


@dataclass(frozen=True)
class Const(TExpr):
    value: int | float | bool


@dataclass(frozen=True)
class IndexVal(TExpr):
    name: str


@dataclass(frozen=True)
class SizeVal(TExpr):
    name: str


Subscript = Union[Sym, TExpr]  # noqa: UP007 (a runtime alias): a quasi-affine subscript, or a data-dependent (gather) one


@dataclass(frozen=True)
class Read(TExpr):
    """A tensor read. A ``conditional`` read (in a branch of ``?:`` or right of ``&&``/``||``)
    does not bound the statement's domain: it is bounds-checked where it is evaluated."""

    tensor: str
    subs: tuple[Subscript, ...]
    conditional: bool = False
    span: A.Span = field(default=A.NOSPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Unop(TExpr):
    op: str  # "-" or "!"
    arg: TExpr


@dataclass(frozen=True)
class Binop(TExpr):
    """Arithmetic (operands already of ``dtype``), comparison (operands of one type, result
    bool) or logical ``&&``/``||`` (bool operands)."""

    op: str
    lhs: TExpr
    rhs: TExpr
    span: A.Span = field(default=A.NOSPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Select(TExpr):
    cond: TExpr
    then: TExpr
    other: TExpr


@dataclass(frozen=True)
class Call(TExpr):
    fn: str
    args: tuple[TExpr, ...]


@dataclass(frozen=True)
class Convert(TExpr):
    arg: TExpr


def convert(e: TExpr, dtype: str) -> TExpr:
    """``e`` as ``dtype``: constants are folded (an integer wraps into a narrower integer type, as
    C converts), no-op conversions dropped."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        v = e.value
        if dtype == "bool":
            return Const(dtype, bool(v))
        if dtype.startswith("float"):
            return Const(dtype, float(v))
        if isinstance(v, float):
            return Convert(dtype, e)
        return Const(dtype, wrap(int(v), dtype))
    return Convert(dtype, e)


def wrap(v: int, dtype: str) -> int:
    """``v`` converted to the integer type ``dtype`` (two's complement, modulo 2**bits)."""
    bits = T.bits(dtype)
    v &= (1 << bits) - 1
    return v - (1 << bits) if not T.is_unsigned(dtype) and v >> (bits - 1) else v


def operands(e: TExpr) -> tuple[TExpr, ...]:
    """The direct operands of ``e``, in evaluation order (a read's subscripts are not operands)."""
    if isinstance(e, (Unop, Convert)):
        return (e.arg,)
    if isinstance(e, Binop):
        return (e.lhs, e.rhs)
    if isinstance(e, Select):
        return (e.cond, e.then, e.other)
    if isinstance(e, Call):
        return tuple(e.args)
    return ()


def reads(e: TExpr) -> list[Read]:
    """Every tensor read in ``e``, gathers' inner reads included, in evaluation order."""
    return list(read_tuple(e))


def read_tuple(e: TExpr) -> tuple[Read, ...]:
    """``reads(e)`` as a tuple. Passes ask again for the same statement once per read they look
    at, so the reads of the last few large expressions are kept and returned without a copy
    (expressions are immutable; an entry holds its expression, so its id is not reused while kept)."""
    kept = _KEPT_READS.get(id(e))
    if kept is not None and kept[0] is e:
        return kept[1]
    out: list[Read] = []

    def walk(x: TExpr) -> None:
        if isinstance(x, Read):
            for s in x.subs:
                if isinstance(s, TExpr):
                    walk(s)
            out.append(x)
        for o in operands(x):
            walk(o)

    walk(e)
    found = tuple(out)
    if len(found) >= _KEEP_FROM:
        with _KEPT_LOCK:
            if len(_KEPT_READS) >= _KEEP:
                _KEPT_READS.pop(next(iter(_KEPT_READS)))
            _KEPT_READS[id(e)] = (e, found)
    return found


_KEEP, _KEEP_FROM = 32, 64  # expressions kept; reads an expression needs to be kept
_KEPT_READS: dict[int, tuple[TExpr, tuple[Read, ...]]] = {}
_KEPT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple[Sym, ...]
    role: str  # "input", "output" or "temp"
    span: A.Span = field(default=A.NOSPAN, compare=False, repr=False)

    def decl(self) -> str:
        dims = "(" + ", ".join(str(d) for d in self.dims) + ")" if self.dims else ""
        return f"{self.dtype}{dims} {self.name}"


@dataclass(frozen=True)
class Access:
    """An affine access used for inference and domain bounds; ``None`` marks a gather dim."""

    tensor: str
    subs: tuple[Sym | None, ...]
    kind: str  # "read", "cond" (a conditional read), "exists" or "write"
    span: A.Span = field(default=A.NOSPAN, compare=False, repr=False)


@dataclass(frozen=True)
class IndexRange:
    name: str
    lo: Sym
    hi: Sym  # exclusive
    given: bool  # fixed by a `where` clause

    def __str__(self) -> str:
        return f"{self.name} in {self.lo}:{self.hi}"


@dataclass(frozen=True)
class Statement:
    number: int  # 1-based position in the def
    tensor: str
    lhs: tuple[str, ...]
    reductions: tuple[str, ...]
    op: str  # "=", "+", "*", "min" or "max"
    init: bool
    rhs: TExpr
    ranges: tuple[IndexRange, ...]  # lhs indices first, then reduction indices
    accesses: tuple[Access, ...]  # reads and exists: the statement runs where all are in bounds
    source: A.Stmt = field(compare=False, repr=False)
    # a scatter (polyhedral.scatter): left-hand index whose value the expression computes from data
    scatter: tuple[str, TExpr] | None = None

    @property
    def indices(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.ranges)

    def range(self, name: str) -> IndexRange:
        return next(r for r in self.ranges if r.name == name)

    @property
    def span(self) -> A.Span:
        return self.source.span

    def describe(self) -> str:
        return f"statement {self.number} (line {self.span.line}, writing '{self.tensor}')"


@dataclass(frozen=True)
class CheckedDef:
    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    temps: tuple[Tensor, ...]
    sizes: tuple[str, ...]  # size symbols, in order of first appearance in the params
    stmts: tuple[Statement, ...]
    source: A.Def = field(compare=False, repr=False)
    # outputs that a reduction without ``!`` reads before any statement writes them: a call
    # updates the caller's ``out=`` in place, from its current values
    accumulates: tuple[str, ...] = ()

    @property
    def tensors(self) -> dict[str, Tensor]:
        return {t.name: t for t in (*self.inputs, *self.outputs, *self.temps)}

    def statement(self, number: int) -> Statement:
        """The statement numbered ``number`` (``Statement.number``, 1-based)."""
        return self.stmts[number - 1]

    def __str__(self) -> str:
        lines = [definition(self.source)]
        for s in self.stmts:
            lines.append(f"# statement {s.number} (line {s.span.line}): " + ", ".join(str(r) for r in s.ranges))
        for t in (*self.outputs, *self.temps):
            lines.append(f"# {t.role} {t.decl()}")
        return "\n".join(lines)
