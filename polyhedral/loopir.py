"""Loop IR: the small, printable, deterministic program that isl's AST becomes (``-> LoopIR``).

Loops carry what the schedule proved about them (parallel, vectorisable); statement calls
carry the original TC indices as expressions of the loop iterators. ``str(ir)`` is C-like text
used in golden tests and by ``kernel.source``-style introspection.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class LExpr:
    pass


@dataclass(frozen=True)
class LInt(LExpr):
    value: int


@dataclass(frozen=True)
class LVar(LExpr):
    name: str


@dataclass(frozen=True)
class LOp(LExpr):
    """``op`` is one of: + - * neg min max floordiv div mod == <= < >= > && || ?:"""

    op: str
    args: tuple[LExpr, ...]


@dataclass(frozen=True)
class LNode:
    pass


@dataclass(frozen=True)
class LFor(LNode):
    var: str
    init: LExpr
    cond: LExpr  # a comparison of ``var`` with an upper bound
    step: int
    body: tuple[LNode, ...]
    parallel: bool = False  # no dependence is carried by this loop
    omp: bool = False  # run it with `omp parallel for`
    simd: bool = False  # innermost and parallel: vectorise it
    note: str = ""  # for a loop that carries a dependence: one dependence it carries (a witness)
    mapped: str = ""  # GPU: "block" or "thread" when the loop's iterations are spread over ids
    dim: int = 0  # GPU: the grid or block dimension (0 is x)
    count: int = 0  # GPU: how many blocks or threads share the iterations (cyclically)


@dataclass(frozen=True)
class LIf(LNode):
    cond: LExpr
    then: tuple[LNode, ...]
    other: tuple[LNode, ...] = ()


@dataclass(frozen=True)
class LCall(LNode):
    stmt: str  # the scop statement name (init<n> or S<n>)
    args: tuple[LExpr, ...]  # one expression per statement index
    site: int = -1  # GPU: which AST site the call is (its instance -> loop iterators map)


@dataclass(frozen=True)
class LMark(LNode):
    """GPU: a schedule-tree mark kept in the loop IR (``gpu_kernel`` above a kernel's tile loops,
    ``gpu_point`` above its point loops); removed by the mapping."""

    name: str
    body: tuple[LNode, ...]


@dataclass(frozen=True)
class LSync(LNode):
    """GPU: a barrier across the threads of a block."""


@dataclass(frozen=True)
class LCopy(LNode):
    """GPU: the block's threads copy a box of ``tensor`` into the shared buffer ``buffer``; the box
    starts at ``offsets`` (expressions of the enclosing loops) and has ``sizes`` elements per dim."""

    buffer: str
    tensor: str
    offsets: tuple[LExpr, ...]
    sizes: tuple[int, ...]
    body: tuple[LNode, ...]  # the loops that read the copy


@dataclass(frozen=True)
class LoopIR:
    body: tuple[LNode, ...]

    def __str__(self) -> str:
        lines: list[str] = []
        for n in self.body:
            _print(n, 0, lines)
        return "\n".join(lines)


def walk(nodes: tuple[LNode, ...]) -> Iterator[LNode]:
    """Every node of a loop body, outermost first."""
    for n in nodes:
        yield n
        if isinstance(n, (LFor, LMark, LCopy)):
            yield from walk(n.body)
        elif isinstance(n, LIf):
            yield from walk(n.then)
            yield from walk(n.other)


def trip_count(f: LFor) -> int | None:
    """The exact number of iterations of ``for (v = c0; v <= c1 (or < c1); v += step)`` with
    constant ``c0`` and ``c1``; None for any other loop."""
    c = f.cond
    if not (isinstance(f.init, LInt) and isinstance(c, LOp) and c.op in ("<=", "<") and c.args[0] == LVar(f.var)
            and isinstance(c.args[1], LInt) and f.step > 0):
        return None
    last = c.args[1].value - (0 if c.op == "<=" else 1)
    return max((last - f.init.value) // f.step + 1, 0)


def trip_bound(f: LFor) -> int | None:
    """A constant bound on the iterations of ``f``: a constant start, and an upper bound that is a
    constant or a min with one (a partial tile's ``min(31, N - c0 - 1)``)."""
    hi = const_upper(f)
    if hi is None or not isinstance(f.init, LInt) or f.step <= 0:
        return None
    return max((hi - f.init.value) // f.step + 1, 0)


def const_upper(f: LFor) -> int | None:
    """A constant the loop variable never exceeds, from ``var <= E`` / ``var < E``."""
    c = f.cond
    if not (isinstance(c, LOp) and c.op in ("<=", "<") and c.args[0] == LVar(f.var)):
        return None
    bound = _const_in(c.args[1])
    return None if bound is None else bound - (1 if c.op == "<" else 0)


def _const_in(e: LExpr) -> int | None:
    if isinstance(e, LInt):
        return e.value
    if isinstance(e, LOp) and e.op == "min":
        vals = [v for v in (_const_in(a) for a in e.args) if v is not None]
        return min(vals) if vals else None
    return None


def expr_vars(e: LExpr) -> set[str]:
    """The loop variables an expression reads."""
    if isinstance(e, LVar):
        return {e.name}
    if isinstance(e, LOp):
        out: set[str] = set()
        for a in e.args:
            out |= expr_vars(a)
        return out
    return set()


_INFIX = {"+", "-", "*", "==", "<=", "<", ">=", ">", "&&", "||"}


def expr_text(e: LExpr) -> str:
    if isinstance(e, LInt):
        return str(e.value)
    if isinstance(e, LVar):
        return e.name
    assert isinstance(e, LOp)
    a = [expr_text(x) for x in e.args]
    if e.op in _INFIX:
        return "(" + f" {e.op} ".join(a) + ")"
    if e.op == "neg":
        return f"(-{a[0]})"
    if e.op == "?:":
        return f"({a[0]} ? {a[1]} : {a[2]})"
    return f"{e.op}({', '.join(a)})"


def _print(n: LNode, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(n, LFor):
        tags = [t for t, on in (("parallel", n.parallel), ("omp", n.omp), ("simd", n.simd)) if on]
        if n.mapped:
            tags.append(f"{n.mapped}s.{'xyz'[n.dim]}/{n.count}")
        if n.note:
            tags.append(f"carries {n.note}")
        tag = f"  // {' '.join(tags)}" if tags else ""
        out.append(f"{pad}for ({n.var} = {expr_text(n.init)}; {expr_text(n.cond)}; {n.var} += {n.step}){tag}")
        for b in n.body:
            _print(b, depth + 1, out)
    elif isinstance(n, LIf):
        out.append(f"{pad}if {expr_text(n.cond)}")
        for b in n.then:
            _print(b, depth + 1, out)
        if n.other:
            out.append(f"{pad}else")
            for b in n.other:
                _print(b, depth + 1, out)
    elif isinstance(n, LCall):
        out.append(f"{pad}{n.stmt}({', '.join(expr_text(a) for a in n.args)})")
    elif isinstance(n, LMark):
        out.append(f"{pad}// {n.name}")
        for b in n.body:
            _print(b, depth, out)
    elif isinstance(n, LSync):
        out.append(f"{pad}sync()")
    elif isinstance(n, LCopy):
        box = ", ".join(f"{expr_text(o)} +: {k}" for o, k in zip(n.offsets, n.sizes))
        out.append(f"{pad}shared {n.buffer} = {n.tensor}[{box}]")
        for b in n.body:
            _print(b, depth + 1, out)
