"""AST generation: ``isl.Schedule x Deps -> LoopIR`` through isl's AST builder.

While isl builds each loop, a dependence test (PPCG's) decides whether the loop carries a
dependence; parallel loops are then marked: the outermost parallel loop of each nest (at the
requested depth) runs with OpenMP, innermost parallel loops are vectorised. isl callbacks must
never raise (an exception there crashes isl), so errors are stashed and re-raised after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import islpy as isl

from tcdsl.core.errors import TcScheduleError
from tcdsl.core.options import MappingOptions

from .loopir import LCall, LExpr, LFor, LIf, LInt, LNode, LoopIR, LOp, LVar, const_upper, walk, work
from .transform import REGISTER_MARK

# members whose names end in "_" (they clash with Python keywords) are missing from islpy's stubs
_AND, _OR = getattr(isl.ast_expr_op_type, "and_"), getattr(isl.ast_expr_op_type, "or_")  # noqa: B009
_FOR, _IF = getattr(isl.ast_node_type, "for_"), getattr(isl.ast_node_type, "if_")  # noqa: B009

_OPS = {
    _AND: "&&", isl.ast_expr_op_type.and_then: "&&",
    _OR: "||", isl.ast_expr_op_type.or_else: "||",
    isl.ast_expr_op_type.max: "max", isl.ast_expr_op_type.min: "min", isl.ast_expr_op_type.minus: "neg",
    isl.ast_expr_op_type.add: "+", isl.ast_expr_op_type.sub: "-", isl.ast_expr_op_type.mul: "*",
    isl.ast_expr_op_type.div: "div", isl.ast_expr_op_type.fdiv_q: "floordiv", isl.ast_expr_op_type.pdiv_q: "div",
    isl.ast_expr_op_type.pdiv_r: "mod", isl.ast_expr_op_type.zdiv_r: "mod",
    isl.ast_expr_op_type.cond: "?:", isl.ast_expr_op_type.select: "?:",
    isl.ast_expr_op_type.eq: "==", isl.ast_expr_op_type.le: "<=", isl.ast_expr_op_type.lt: "<",
    isl.ast_expr_op_type.ge: ">=", isl.ast_expr_op_type.gt: ">",
}


class Witness:
    """One dependence a loop carries, as ``S1[0, 3] -> S1[0, 4]`` (or "a dependence"): a pair of
    statement instances isl samples when the text is first asked for (printing the loop IR, or
    ``explain``). Finding it costs more than the test that the loop carries one, and most
    compiles never print it."""

    __slots__ = ("_deps", "_schedule", "_depth", "_text")

    def __init__(self, deps: isl.UnionMap, schedule: isl.UnionMap, depth: int) -> None:
        self._deps, self._schedule, self._depth = deps, schedule, depth
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = _witness(self._deps, self._schedule, self._depth)
        return self._text

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return str(self) == str(other) if isinstance(other, (Witness, str)) else NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))


def loop_annotator(deps: isl.UnionMap, notes: list[Witness],
                   errors: list[BaseException]) -> Callable[[isl.AstBuild], isl.Id]:
    """isl's before-each-for callback: annotates each loop "par", or "seq<k>" with the witness of a
    dependence it carries in ``notes[k]``; errors go to ``errors`` (re-raise them after the build)."""
    def before_for(b: isl.AstBuild) -> isl.Id:
        try:
            witness = _carried(b, deps)
            if witness is None:
                return isl.Id("par")
            notes.append(witness)
            return isl.Id(f"seq{len(notes) - 1}")
        except BaseException as e:  # noqa: BLE001 - re-raised after the build
            errors.append(e)
            return isl.Id("seq")

    return before_for


def build(sched: isl.Schedule, context: isl.Set, deps: isl.UnionMap, options: MappingOptions) -> LoopIR:
    errors: list[BaseException] = []
    notes: list[Witness] = []
    ab = isl.AstBuild.from_context(context)
    ab, _handle = ab.set_before_each_for(loop_annotator(deps, notes, errors))
    root = ab.node_from_schedule(sched)
    if errors:
        raise errors[0]
    body = _node(root, notes)
    return LoopIR(tuple(_mark(body, options, omp_allowed=options.openmp, depth=0)))


def _carried(b: isl.AstBuild, deps: isl.UnionMap) -> Witness | None:
    """None if the loop being built carries no dependence; else the witness of one it carries."""
    s = b.get_schedule()
    n = b.get_schedule_space().dim(isl.dim_type.set)
    m = deps.apply_domain(s).apply_range(s)
    if m.is_empty():
        return None
    d = isl.Set.from_union_set(m.deltas())
    for i in range(n - 1):
        d = d.fix_dim_si(i, 0)
    if d.is_empty():
        return None
    lo, hi = d.dim_min_val(n - 1), d.dim_max_val(n - 1)
    if lo.is_zero() and hi.is_zero():
        return None
    return Witness(deps, s, n)


def _witness(deps: isl.UnionMap, s: isl.UnionMap, n: int) -> str:
    """A pair of instances in ``deps`` that the ``n``-th dimension of schedule ``s`` runs in
    different iterations of the same outer ones, as text."""
    flat = _flatten_range(s)
    eq = " and ".join(f"a{i} = b{i}" for i in range(n - 1))
    carried = isl.UnionMap(f"{{ [{', '.join(f'a{i}' for i in range(n))}] -> [{', '.join(f'b{i}' for i in range(n))}] : "
                           f"{eq + ' and ' if eq else ''}a{n - 1} != b{n - 1} }}")
    pairs = deps.intersect(flat.apply_range(carried).apply_range(flat.reverse()))
    if pairs.is_empty():
        return "a dependence"
    point = pairs.wrap().sample_point()
    return _pair_text(point)


def _flatten_range(u: isl.UnionMap) -> isl.UnionMap:
    maps: list[isl.Map] = []
    u.foreach_map(maps.append)
    out = isl.UnionMap.from_map(maps[0].flatten_range())
    for m in maps[1:]:
        out = out.union(isl.UnionMap.from_map(m.flatten_range()))
    return out


def _pair_text(point: isl.Point) -> str:
    """``S1[0, 0, 3] -> S1[0, 0, 4]`` from a point of a wrapped map."""
    text = str(point).strip()  # e.g. "[p_M = 8] -> { [S1[0, 0, 3] -> S1[0, 0, 4]] }"
    if "->" in text.split("{", 1)[0]:
        text = text[text.index("{"):]
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return text


# ---- isl AST -> loop IR -----------------------------------------------------------------------


def _node(n: isl.AstNode, notes: Sequence[Witness | str]) -> list[LNode]:
    t = n.get_type()
    if t == isl.ast_node_type.block:
        lst = n.block_get_children()
        out: list[LNode] = []
        for i in range(lst.n_ast_node()):
            out.extend(_node(lst.get_at(i), notes))
        return out
    if t == _FOR:
        var = n.for_get_iterator().get_id().get_name()
        ann = n.get_annotation()
        tag = ann.get_name() if ann is not None else "seq"
        note = notes[int(tag[3:])] if tag.startswith("seq") and tag[3:] else ""
        step = n.for_get_inc().get_val().to_python()
        return [LFor(var, _expr(n.for_get_init()), _expr(n.for_get_cond()), int(step),
                     tuple(_node(n.for_get_body(), notes)), parallel=tag == "par", note=note)]
    if t == _IF:
        other = tuple(_node(n.if_get_else_node(), notes)) if n.if_has_else_node() else ()
        return [LIf(_expr(n.if_get_cond()), tuple(_node(n.if_get_then_node(), notes)), other)]
    if t == isl.ast_node_type.user:
        call = n.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        args = tuple(_expr(call.get_op_arg(i)) for i in range(1, call.get_op_n_arg()))
        return [LCall(name, args)]
    if t == isl.ast_node_type.mark:
        inner = _node(n.mark_get_node(), notes)
        if n.mark_get_id().get_name() == REGISTER_MARK and len(inner) == 1 and isinstance(inner[0], LFor):
            return [replace(_bounded(inner[0], n.mark_get_id().get_user()), tile=True)]
        return inner
    raise TcScheduleError(f"unexpected isl AST node type {t}")


def _bounded(f: LFor, sizes: object) -> LFor:
    """The loops of a register tile (``f`` and the loops alone in its body, outermost first), each
    whose upper bound is not a constant or a ``min`` with one bounded by its tile's size from the
    mark (``sizes``, one per loop, in order; unchanged where the loops and sizes do not pair up). isl
    writes the bound of a tile cut short in other forms too: ``c16 <= -div(c9 + 24, 23) + 3`` is
    ``min(2, 67 - 3 * c9)``, which the regtile pass would not take for a register tile (a conv on
    70x70 images in 3-column tiles of channel vectors on AVX2 ran in scalars, 15x slower)."""
    chain = [f]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], LFor):
        chain.append(chain[-1].body[0])
    if not isinstance(sizes, tuple) or len(sizes) != len(chain):
        return f

    def rebuild(k: int) -> LFor:
        g = chain[k]
        body = (rebuild(k + 1),) if k + 1 < len(chain) else g.body
        c = g.cond
        if isinstance(g.init, LInt) and g.init.value == 0 and g.step == 1 and const_upper(g) is None and \
                isinstance(c, LOp) and c.op == "<=" and c.args[0] == LVar(g.var):
            c = LOp("<=", (c.args[0], LOp("min", (LInt(sizes[k] - 1), c.args[1]))))
        return replace(g, cond=c, body=body)

    return rebuild(0)


def _expr(e: isl.AstExpr) -> LExpr:
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return LInt(int(e.get_val().to_python()))
    if t == isl.ast_expr_type.id:
        return LVar(e.get_id().get_name())
    op = e.get_op_type()
    if op not in _OPS:
        raise TcScheduleError(f"unexpected isl AST operator {op}")
    args = tuple(_expr(e.get_op_arg(i)) for i in range(e.get_op_n_arg()))
    name = _OPS[op]
    if name in ("min", "max") and len(args) > 2:  # n-ary: fold into nested binary calls
        folded = args[-1]
        for a in reversed(args[:-1]):
            folded = LOp(name, (a, folded))
        return folded
    return LOp(name, args)


# ---- parallel marks -----------------------------------------------------------------------------

# A parallel loop whose nest runs fewer statement instances runs on the calling thread: starting
# the threads costs more than the work (an 8x8 fully connected layer's forward + backward, 2 threads:
# 0.5 ms against torch's 0.07 ms while each of its loops was an `omp parallel for`)
SERIAL_BELOW = 1 << 15


def _mark(nodes: list[LNode] | tuple[LNode, ...], options: MappingOptions, omp_allowed: bool,
          depth: int) -> list[LNode]:
    out: list[LNode] = []
    for n in nodes:
        if isinstance(n, LFor):
            innermost = not any(isinstance(x, LFor) for x in walk(n.body))
            omp = (omp_allowed and n.parallel and depth >= options.parallel_depth and not innermost_trivial(n)
                   and work((n,)) >= SERIAL_BELOW)
            body = _mark(n.body, options, omp_allowed and not omp, depth + (1 if n.parallel else 0))
            simd = options.vectorize and n.parallel and innermost and not omp
            out.append(replace(n, body=tuple(body), omp=omp, simd=simd))
        elif isinstance(n, LIf):
            out.append(LIf(n.cond, tuple(_mark(n.then, options, omp_allowed, depth)),
                           tuple(_mark(n.other, options, omp_allowed, depth))))
        else:
            out.append(n)
    return out


def innermost_trivial(n: LFor) -> bool:
    """A loop with a constant trip count of at most one is not worth a parallel region."""
    if isinstance(n.init, LInt) and isinstance(n.cond, LOp) and n.cond.op in ("<=", "<") \
            and isinstance(n.cond.args[1], LInt):
        hi = n.cond.args[1].value - (1 if n.cond.op == "<" else 0)
        return hi - n.init.value < n.step
    return False
