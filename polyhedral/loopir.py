"""Loop IR: the small, printable, deterministic program that isl's AST becomes (``-> LoopIR``).

Loops carry what the schedule proved about them (parallel, vectorisable); statement calls
carry the original TC indices as expressions of the loop iterators. ``str(ir)`` is C-like text
used in golden tests and by ``kernel.source``-style introspection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


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
    note: object = ""  # for a loop that carries a dependence: one dependence it carries (its text: str(note))
    mapped: str = ""  # GPU: "block" or "thread" when the loop's iterations are spread over ids
    dim: int = 0  # GPU: the grid or block dimension (0 is x)
    count: int = 0  # GPU: how many blocks or threads share the iterations (cyclically)
    tile: bool = False  # CPU: the outermost loop of a register tile the schedule transform planned
    # set by the CPU lowering passes (codegen.lower):
    hoist: tuple[tuple[str, int, int], ...] = ()  # reads loaded once before the loop: (name, call, read)
    unroll: int = 0  # unroll this many (all) iterations
    collapse: bool = False  # `omp parallel for collapse(2)` with the loop inside
    fine: bool = False  # an omp loop over register tiles: its threads take them in fine chunks
    private: tuple[str, ...] = ()  # the sums into these run in partial rows per block of rows (codegen.privatise)
    blocks: int = 0  # the blocks of rows, with ``private``
    vector: Any = field(default=None, compare=False)  # the loop in explicit vectors (codegen.vecloop)
    vector_text: str = ""  # how, for the printed form


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
class LDecl(LNode):
    """CPU: a temporary that lives in the enclosing body only: in one scalar (``kind`` "scalar"),
    or in the slice of it that one iteration uses (``kind`` "row", with the dims ``fixed`` there)."""

    tensor: str
    kind: str
    fixed: tuple[int, ...] = ()


@dataclass(frozen=True)
class LReset(LNode):
    """CPU: zero the temporary ``tensor``, which reuses the buffer of ``owner``, before its first use."""

    tensor: str
    owner: str


@dataclass(frozen=True)
class LTranspose(LNode):
    """CPU: the copy nest ``outer``/``inner`` moved in blocks through registers (codegen.transpose)."""

    outer: LFor
    inner: LFor
    call: LCall
    source: str  # the tensor read
    source_stride: int  # elements between consecutive reads along the inner loop
    target_stride: int  # elements between consecutive writes along the outer loop


@dataclass(frozen=True)
class LTile(LNode):
    """CPU: a register tile. The reduction target of ``call`` stays in a small local array for the
    whole of the ``serial`` loops (outermost first; the first is the nest's root), indexed by the
    ``inner`` tile loops (constant trip bounds ``extents``)."""

    serial: tuple[LFor, ...]
    inner: tuple[LFor, ...]
    call: LCall
    extents: tuple[int, ...]
    identity: bool = False  # the tile starts at the reduction's identity (its init nest is gone)
    first: LExpr | None = None  # or starts there where this holds (its reduction's first chunk), else loads
    simd: bool = False  # the innermost tile loop is vectorised by the compiler
    inside: str = ""  # a short serial loop run inside the tile loops (a strided window)
    split: int = 0  # the innermost tile loop runs as two loops, below this value and from it
    vector: Any = field(default=None, compare=False)  # the tile in explicit vectors (codegen.vecplan)
    vector_text: str = ""

    @property
    def loop(self) -> LFor:
        return self.serial[0]


@dataclass(frozen=True)
class LAccum(LNode):
    """A nest of loops around one reduction into an element the nest does not move, accumulated in a
    local (scalar replacement): an innermost reduction loop on the CPU, a thread's conv window on GPUs."""

    loops: tuple[LFor, ...]  # a perfect nest, outermost first, around ``call``
    call: LCall
    simd: bool = False  # the innermost loop as an `omp simd` reduction
    jam: tuple[LFor, ...] = ()  # the short loops around it, moving the element, whose elements it takes at once
    vector: Any = field(default=None, compare=False)  # the loop in explicit vectors (codegen.vecloop)
    vector_text: str = ""  # how, for the printed form

    @property
    def loop(self) -> LFor:
        return self.loops[0]


@dataclass(frozen=True)
class LHold(LNode):
    """GPU: across ``loop``, which every thread runs (a matmul's k tiles), each thread keeps its
    elements of the target of ``call`` in a register array, loaded before the loop and written back
    once after it: ``slots[i]`` iterations of thread loop ``chain[i]`` (in ``loop``'s body) per
    thread, updated by ``red``, the reduction loop of ``call`` inside the chain."""

    loop: LFor
    chain: tuple[LFor, ...]
    red: LFor
    call: LCall
    slots: tuple[int, ...]


@dataclass(frozen=True)
class LPack(LNode):
    """CPU: before ``body``, copy what a register tile's vector read of ``tensor`` (read number
    ``read`` of statement ``stmt``) takes across ``panel`` (a loop of ``body`` moving along the row;
    "" for none) and the ``serial`` loops into ``buffer``: ``panels`` panels of ``depth`` steps of
    ``width`` contiguous elements, in the order the tile reads them. ``shared``: the panels move
    with no loop around the pack, which sits before the parallel loops: one copy per call that
    every thread reads (else each thread packs its own). ``chunks``: loops of ``body`` outside the
    tile's reuse that move the read too (name, first value, step, trip count; outermost first),
    each a dimension of the buffer (a shared pack of the whole operand, its copy split among the
    threads when ``parallel``). ``box``: where the serial loops' bounds vary with loops outside
    (a boundary piece's reductions), the range that covers every value of each: the buffer holds
    the whole box, each tile reads its part."""

    buffer: str
    tensor: str
    stmt: str
    read: int
    panel: str
    serial: tuple[str, ...]
    width: int
    panels: int
    depth: int
    body: tuple[LNode, ...]
    shared: bool = False
    chunks: tuple[tuple[str, int, int, int], ...] = ()
    parallel: bool = False
    box: tuple[tuple[int, int], ...] = ()  # (first, count) per serial loop, where their bounds vary outside
    call: LCall | None = None  # the tile that reads the panels (its statement call; None: the first of ``stmt``)
    # ``tensor`` is a temporary a blocked transpose wrote from ``source``, whose rows ``source_stride``
    # elements apart are ``tensor``'s columns: the panels are copied from ``source`` in blocks, each
    # panel the transpose of ``width`` of its rows, and the transpose is gone ("" for none)
    source: str = ""
    source_stride: int = 0

    @property
    def all_panels(self) -> int:
        """The panels in the buffer, in order: the blocks' (``chunks``) times the panels of each."""
        return self.panels * math.prod(c[3] for c in self.chunks)


@dataclass(frozen=True)
class LoopIR:
    body: tuple[LNode, ...]
    owners: tuple[tuple[str, str], ...] = ()  # CPU: (temporary, the temporary whose buffer it uses)

    def __str__(self) -> str:
        lines = [f"// {t} reuses the buffer of {o}" for t, o in self.owners if t != o]
        for n in self.body:
            _print(n, 0, lines)
        return "\n".join(lines)


def children(n: LNode) -> tuple[LNode, ...]:
    """The nodes directly inside ``n``, in order (none for a statement or a leaf)."""
    if isinstance(n, (LFor, LMark, LCopy, LPack)):
        return n.body
    if isinstance(n, (LTile, LAccum, LHold)):
        return (n.loop,)
    if isinstance(n, LTranspose):
        return (n.outer,)
    if isinstance(n, LIf):
        return (*n.then, *n.other)
    return ()


def walk(nodes: tuple[LNode, ...]) -> Iterator[LNode]:
    """Every node of a loop body, outermost first."""
    for n in nodes:
        yield n
        yield from walk(children(n))


def walk_paths(nodes: tuple[LNode, ...], above: tuple[LNode, ...] = ()) -> Iterator[tuple[LNode, tuple[LNode, ...]]]:
    """``walk``'s nodes, each with the nodes around it (outermost first): loop names repeat across
    the pieces of a body, so a loop around a node is found among these, not by name in the body."""
    for n in nodes:
        yield n, above
        yield from walk_paths(children(n), (*above, n))


def work(nodes: tuple[LNode, ...]) -> float:
    """Statement instances a body runs, through the constant bounds of its loops (inf where a
    loop has none)."""
    total = 0.0
    for n in nodes:
        if isinstance(n, LCall):
            total += 1
        elif isinstance(n, LFor):
            trips = trip_bound(n)
            inner = work(n.body)
            total += math.inf if trips is None and inner else (trips or 0) * inner
        elif isinstance(n, LIf):
            total += work(n.then) + work(n.other)
        elif isinstance(n, (LAccum, LTile)):
            total += work((n.loop,))
        elif isinstance(n, LTranspose):
            total += work((n.outer,))
        elif isinstance(n, (LPack, LCopy, LMark)):
            total += work(n.body)
    return total


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


def _c_div(a: int, b: int) -> int:
    """C's ``/`` on integers: the quotient truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_EVAL: dict[str, Callable[..., int]] = {
    "+": lambda *a: sum(a), "-": lambda a, b: a - b, "*": lambda a, b: a * b, "neg": lambda a: -a,
    "min": min, "max": max, "floordiv": lambda a, b: a // b, "div": _c_div,
    "mod": lambda a, b: a - b * _c_div(a, b), "==": lambda a, b: int(a == b), "<=": lambda a, b: int(a <= b),
    "<": lambda a, b: int(a < b), ">=": lambda a, b: int(a >= b), ">": lambda a, b: int(a > b),
    "&&": lambda *a: int(all(a)), "||": lambda *a: int(any(a)), "?:": lambda c, x, y: x if c else y,
}


def expr_value(e: LExpr, env: Mapping[str, int]) -> int | None:
    """The value of ``e`` (C's integer semantics) with the loop variables of ``env``; None where it
    reads another variable, divides by zero or has an operation this does not evaluate."""
    if isinstance(e, LInt):
        return e.value
    if isinstance(e, LVar):
        return env.get(e.name)
    if not isinstance(e, LOp) or e.op not in _EVAL:
        return None
    a = [expr_value(x, env) for x in e.args]
    if any(x is None for x in a) or (e.op in ("floordiv", "div", "mod") and a[1] == 0):
        return None
    return _EVAL[e.op](*a)


def loop_values(loops: Sequence[LFor], wanted: set[str], limit: int = 4096) -> list[dict[str, int]] | None:
    """Every assignment of the variables of ``loops`` (a chain of nested loops, outermost first)
    that the variables ``wanted`` depend on, enumerated through their bounds; None where a bound is
    not a function of the outer loops' variables, or past ``limit`` assignments."""
    need = set(wanted)
    chain = []
    for f in reversed(loops):  # the loops ``wanted`` reads, and the loops their bounds read
        if f.var in need:
            chain.append(f)
            need |= expr_vars(f.init) | (expr_vars(f.cond) - {f.var})
    chain.reverse()
    if need - {f.var for f in chain}:
        return None
    envs: list[dict[str, int]] = [{}]
    for f in chain:
        out = []
        for env in envs:
            lo = expr_value(f.init, env)
            if lo is None or f.step <= 0:
                return None
            v = lo
            while True:
                ok = expr_value(f.cond, {**env, f.var: v})
                if ok is None:
                    return None
                if not ok:
                    break
                out.append({**env, f.var: v})
                if len(out) > limit:
                    return None
                v += f.step
        envs = out
    return envs


def sum_terms(e: LExpr) -> list[LExpr]:
    """The terms of a nest of ``+`` (``(c2 + c9) + 1`` -> ``c2, c9, 1``); ``[e]`` for anything else."""
    if isinstance(e, LOp) and e.op == "+":
        return [t for a in e.args for t in sum_terms(a)]
    return [e]


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
        tags = [t for t, on in (("parallel", n.parallel), ("omp", n.omp), ("simd", n.simd),
                                ("collapse(2)", n.collapse), ("fine chunks", n.fine),
                                ("register tile", n.tile)) if on]
        if n.unroll:
            tags.append(f"unroll {n.unroll}")
        if n.private:
            tags.append(f"in {n.blocks} blocks of rows, summing {', '.join(n.private)} in partial rows")
        if n.hoist:
            tags.append("hoist " + ",".join(f"{name}=call{c}.read{r}" for name, c, r in n.hoist))
        if n.vector_text:
            tags.append(f"vector {n.vector_text}")
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
    elif isinstance(n, LPack):
        serial = [f"{v} in {a}..{a + k - 1}" for v, (a, k) in zip(n.serial, n.box)] if n.box else list(n.serial)
        across = ", ".join([c[0] for c in n.chunks] + ([n.panel] if n.panel else []) + serial)
        blocks = "".join(f"{c[3]} x " for c in n.chunks)
        out.append(f"{pad}// pack {n.tensor} (read {n.read} of {n.stmt}) into {n.buffer}: {blocks}{n.panels} panels x "
                   f"{n.depth} steps x {n.width}, across {across}" + (", once for every thread" if n.shared else "")
                   + (", copied by all threads" if n.parallel else "")
                   + (f", transposed from {n.source} (its transpose into {n.tensor} folded here)" if n.source else ""))
        for b in n.body:
            _print(b, depth, out)
    elif isinstance(n, LDecl):
        where = "one scalar" if n.kind == "scalar" else f"one row (dims {list(n.fixed)} fixed here)"
        out.append(f"{pad}temporary {n.tensor} in {where}")
    elif isinstance(n, LReset):
        out.append(f"{pad}zero {n.tensor} (in the buffer of {n.owner})")
    elif isinstance(n, LTranspose):
        out.append(f"{pad}// transpose {n.call.stmt} in blocks: reads {n.source} {n.source_stride} apart, "
                   f"writes {n.target_stride} apart")
        _print(n.outer, depth, out)
    elif isinstance(n, LTile):
        how = [f"{'x'.join(map(str, n.extents))} register tile of {n.call.stmt} across "
               f"{', '.join(f.var for f in n.serial)}"]
        how += [t for t, on in (("from the identity", n.identity), ("simd", n.simd)) if on]
        if n.first is not None:
            how.insert(1, f"from the identity when {expr_text(n.first)}, else loaded")
        if n.inside:
            how.append(f"{n.inside} inside the tile loops")
        if n.split:
            how.append(f"{n.inner[-1].var} split at {n.split}")
        if n.vector_text:
            how.append(f"vector {n.vector_text}")
        out.append(f"{pad}// {'; '.join(how)}")
        _print(n.loop, depth, out)
    elif isinstance(n, LHold):
        per = "x".join(map(str, n.slots))
        out.append(f"{pad}// hold {n.call.stmt} in registers across {n.loop.var}: {per} per thread "
                   f"(thread loops {', '.join(f.var for f in n.chain)}), updated by {n.red.var}")
        _print(n.loop, depth, out)
    elif isinstance(n, LAccum):
        over = ", ".join(f.var for f in n.loops)
        local = "; ".join(["simd"] * n.simd + [f"vector {n.vector_text}"] * bool(n.vector_text))
        jam = f", the elements of {', '.join(f'{f.var} ({trip_count(f)})' for f in n.jam)} at once" if n.jam else ""
        out.append(f"{pad}// accumulate {n.call.stmt} over {over} in a local{jam}{f' ({local})' if local else ''}")
        _print(n.loop, depth, out)
    elif isinstance(n, LCopy):
        box = ", ".join(f"{expr_text(o)} +: {k}" for o, k in zip(n.offsets, n.sizes))
        out.append(f"{pad}shared {n.buffer} = {n.tensor}[{box}]")
        for b in n.body:
            _print(b, depth + 1, out)
