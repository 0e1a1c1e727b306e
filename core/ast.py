"""AST: the parser's output (``str -> Module``), frozen dataclasses that each carry a source span.

Spans never take part in equality, so ``parse(print(m)) == m`` compares structure only.
Call-like nodes (``f(x)``) stay unresolved here: semantic analysis decides between tensor read,
builtin call and cast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from .errors import Location, SourceFile, locate


@dataclass(frozen=True)
class Span:
    src: SourceFile = field(repr=False)
    line: int
    col: int
    end_line: int
    end_col: int

    def location(self) -> Location | None:
        if self.line <= 0:
            return None
        return locate(self.src, self.line, self.col, self.end_line, self.end_col)


NOSPAN = Span(SourceFile("<generated>", ""), 0, 0, 0, 0)


def _span() -> Span:
    return field(default=NOSPAN, compare=False, repr=False)  # type: ignore[return-value]


_N = TypeVar("_N")

# ---- expressions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """Base of expression nodes; every concrete node has a ``span`` field (see ``span_of``)."""


def span_of(e: Expr) -> Span:
    return getattr(e, "span", NOSPAN)


def map_children(node: _N, fn: Callable[[Expr], Expr]) -> _N:
    """``node`` (an expression or a where clause) with ``fn`` applied to each expression it holds
    directly, alone or in a tuple (a call's arguments); the transforms of whole defs (batching,
    retyping) recurse through it and handle only the nodes they change."""
    changes: dict[str, Any] = {}
    for f in fields(node):  # type: ignore[arg-type]
        v = getattr(node, f.name)
        if isinstance(v, Expr):
            changes[f.name] = fn(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, Expr) for x in v):
            changes[f.name] = tuple(fn(x) for x in v)
    return replace(node, **changes) if changes else node  # type: ignore[type-var]


@dataclass(frozen=True)
class Num(Expr):
    value: int | float
    is_float: bool
    span: Span = _span()


@dataclass(frozen=True)
class Name(Expr):
    """A bare name: an index, a size symbol, a let, or a rank-0 tensor."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class Apply(Expr):
    """``f(args)``: a tensor read or a builtin call, decided by semantic analysis."""

    name: str
    args: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Cast(Expr):
    """``float(x)``, ``int32(x)``: a conversion written with a type keyword."""

    type: str
    arg: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "-", "!", "+"
    arg: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Binary(Expr):
    op: str  # + - * / % == != < <= > >= && ||
    lhs: Expr
    rhs: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Ternary(Expr):
    cond: Expr
    then: Expr
    other: Expr
    span: Span = _span()


# ---- statements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span = _span()


@dataclass(frozen=True)
class WhereRange:
    index: Ident
    lo: Expr
    hi: Expr
    span: Span = _span()


@dataclass(frozen=True)
class WhereExists:
    access: Apply
    span: Span = _span()


@dataclass(frozen=True)
class WhereLet:
    name: Ident
    value: Expr
    span: Span = _span()


Where = WhereRange | WhereExists | WhereLet

REDUCTION_OPS = ("+=", "*=", "min=", "max=")
ASSIGN_OPS = ("=",) + REDUCTION_OPS + tuple(op + "!" for op in REDUCTION_OPS)


@dataclass(frozen=True)
class Stmt:
    """``lhs(indices) op rhs where ...``; ``indices`` is None for a bare rank-0 LHS. An LHS
    subscript is an index name or an integer constant (``O(i, 0)``)."""

    lhs: Ident
    indices: tuple[Ident | Num, ...] | None
    op: str
    rhs: Expr
    wheres: tuple[Where, ...] = ()
    span: Span = _span()
    annotation: Expr | None = None  # TC's ``<=> matmul(A, B)``: kept and printed back, never checked or run

    @property
    def reduction(self) -> str | None:
        """The reduction operator without ``=``/``!`` (``+``, ``*``, ``min``, ``max``) or None."""
        return None if self.op == "=" else self.op.rstrip("!")[:-1]

    @property
    def init(self) -> bool:
        return self.op.endswith("!")


# ---- definitions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Dim:
    """A declared dimension: a size symbol (``name``) or an integer literal (``value``)."""

    name: str | None = None
    value: int | None = None
    span: Span = _span()


@dataclass(frozen=True)
class Param:
    type: str
    name: Ident
    dims: tuple[Dim, ...] | None  # None: a rank-0 ``type NAME`` parameter
    span: Span = _span()


@dataclass(frozen=True)
class Output:
    name: Ident
    type: str | None = None  # None: type and shape inferred
    dims: tuple[Dim, ...] | None = None
    span: Span = _span()


@dataclass(frozen=True)
class Def:
    name: Ident
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    stmts: tuple[Stmt, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Module:
    defs: tuple[Def, ...]
    src: SourceFile = field(default=NOSPAN.src, compare=False, repr=False)
