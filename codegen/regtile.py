"""Register tiles: ``LFor -> LTile | None``, the reduction nests whose target can live in a
small local array (held in registers) for the whole of a serial loop.

The pattern is the micro-kernel of a contraction: a serial loop ``L`` (the reduction) around a
perfect nest of small loops ``I1..Id`` (constant trip bounds) around one reduction statement
whose target moves with ``I1..Id`` one element per step and not at all with ``L``. The target
tile is then loaded once before ``L``, updated in ``acc[I1][I2]...`` and stored once after.
"""

from __future__ import annotations

from tcdsl.core.affine import Sym
from tcdsl.core.checked import CheckedDef, Statement
from tcdsl.polyhedral.loopir import (
    LCall,
    LExpr,
    LFor,
    LIf,
    LInt,
    LNode,
    LOp,
    LTile,
    LVar,
    const_upper,
    expr_value,
    expr_vars,
    loop_values,
    sum_terms,
    walk,
)
from tcdsl.polyhedral.loopir import trip_bound as loop_trip_bound
from tcdsl.polyhedral.scop import Scop

MAX_ELEMENTS = 512


def match(n: LFor, scop: Scop, checked: CheckedDef) -> LTile | None:
    if n.parallel or len(n.body) != 1 or not isinstance(n.body[0], LFor):
        return None
    chain: list[LFor] = [n]
    node: LNode = n.body[0]
    while isinstance(node, LFor):
        chain.append(node)
        if len(node.body) != 1:
            return None
        node = node.body[0]
    if not isinstance(node, LCall):
        return None
    st = scop.stmt(node.stmt)
    s = scop.tc_statement(st.name)
    if st.kind != "update" or s.op == "=":
        return None
    args = dict(zip(st.indices, node.args))
    lhs = [args[i] for i in s.lhs]
    lhs_vars = set().union(*(expr_vars(a) for a in lhs)) if lhs else set()
    split = next((k for k, f in enumerate(chain) if f.var in lhs_vars), len(chain))
    serial, inner = chain[:split], chain[split:]
    if not inner or len(inner) > 3 or any(f.var in lhs_vars for f in serial) or any(f.parallel for f in serial):
        return None
    if not inner[0].tile:  # the schedule transform planned no register tile here
        return None
    serial_vars = {f.var for f in serial}
    inner_vars = [f.var for f in inner]
    extents = []
    for f in inner:
        if f.step != 1 or (expr_vars(f.init) | expr_vars(f.cond)) & serial_vars or not isinstance(f.init, LInt):
            return None
        hi = const_upper(f)
        if hi is None:
            return None
        extents.append(hi - f.init.value + 1)
        if sum(1 for a in lhs if f.var in expr_vars(a)) != 1 or not any(_unit_in(a, f.var, inner_vars) for a in lhs):
            return None
    total = 1
    for e in extents:
        total *= e
    if total > MAX_ELEMENTS or total < 2:
        return None
    return LTile(tuple(serial), tuple(inner), node, tuple(extents))


def trip_bound(f: LFor) -> int | None:
    """A constant bound on the trip count of a loop with a constant start and step 1."""
    return loop_trip_bound(f) if f.step == 1 else None


def _unit_in(e: LExpr, var: str, inner: list[str]) -> bool:
    """``e`` is ``var`` plus terms with no tile variable (``var``, ``c2 + var``, ``(c2 + var) + 1``)."""
    terms = sum_terms(e)
    return terms.count(LVar(var)) == 1 and not any(expr_vars(t) & set(inner) for t in terms if t != LVar(var))


def identity_starts(body: tuple[LNode, ...], scop: Scop,
                    checked: CheckedDef) -> tuple[set[int], dict[int, LExpr]]:
    """The ``!`` statements whose register tiles can start from the identity instead of loading
    the target (so their separate initialisation nests can go: maxpool writes and re-reads O
    once less, a K-tiled matmul writes C once less): every update of the statement sits in a
    register tile whose serial loops run the whole, rectangular reduction of each element, or one
    chunk of it that a serial loop around the tile steps through in order (``first_chunk``); every
    element the initialisation writes is updated; and the initialisation has top-level nests of
    its own. Also, by the ``id`` of each such tile's root loop that runs chunks, where it starts
    from the identity (``first_chunk``: its first chunk)."""
    tiles: dict[str, list[tuple[LTile, int, tuple[LFor, ...]]]] = {}
    calls: dict[str, int] = {}
    per_nest: dict[tuple[str, int], int] = {}  # (statement, top-level nest) -> its tiles there

    def visit(nodes: tuple[LNode, ...], around: tuple[LFor, ...], nest: int) -> None:
        for n in nodes:
            if isinstance(n, LFor):
                rt = match(n, scop, checked)
                if rt is not None:
                    tiles.setdefault(rt.call.stmt, []).append((rt, id(n), around))
                    calls[rt.call.stmt] = calls.get(rt.call.stmt, 0) + 1
                    per_nest[rt.call.stmt, nest] = per_nest.get((rt.call.stmt, nest), 0) + 1
                    continue
                visit(n.body, (*around, n), nest)
            elif isinstance(n, LIf):
                visit(n.then, around, nest)
                visit(n.other, around, nest)
            elif isinstance(n, LCall):
                calls[n.stmt] = calls.get(n.stmt, 0) + 1

    for k, n in enumerate(body):
        visit((n,), (), k)
    out: set[int] = set()
    firsts: dict[int, LExpr] = {}
    for s in checked.stmts:
        name = f"S{s.number}"
        if not s.init or name not in tiles or calls.get(name) != len(tiles[name]):
            continue
        starts: dict[int, LExpr] = {}
        alone = all(count == 1 for (stmt, _), count in per_nest.items() if stmt == name)
        for rt, root, around in tiles[name]:
            first = first_chunk(rt, around, scop, s)
            if first is None and alone and own_reduction(rt, scop, s):
                first = LInt(1)
            if first is None:
                break
            if first != LInt(1):
                starts[root] = first
        else:
            if not _init_nests_apart(body, f"init{s.number}") or not _updates_cover_init(scop, s.number):
                continue
            out.add(s.number)
            firsts.update(starts)
    return out, firsts


def first_chunk(rt: LTile, around: tuple[LFor, ...], scop: Scop, s: Statement) -> LExpr | None:
    """Where a serial loop cuts the statement's reduction into chunks that the tile's serial loops
    run (``around``: the loops enclosing the tile, outermost first): the condition under which the
    tile runs each element's first chunk (the cutting loops around the tile at their first values;
    ``1`` where the cutting loops are the tile's own, which then runs the whole reduction). None
    unless each reduction index is one serial loop of the tile (each used once), plus at most one
    serial loop around it or before it in the tile, with constant bounds and not moving the
    target, whose chunks cover the reduction's rectangular range once, in order."""
    st = scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    sizes = {k: Sym.of(v) for k, v in scop.inst.sizes.items()}
    ranges = {r.name: r for r in s.ranges}
    lhs_vars = set().union(*(expr_vars(args[i]) for i in s.lhs)) if s.lhs else set()
    loops = {g.var: g for g in (*around, *rt.serial)}
    own = {f.var for f in rt.serial}
    tests: list[LExpr] = []
    used: set[str] = set()
    for r in s.reductions:
        lo, hi = ranges[r].lo.subs(sizes), ranges[r].hi.subs(sizes)
        terms = sum_terms(args[r])
        names = [t.name for t in terms if isinstance(t, LVar)]
        if lo.terms or hi.terms or any(not isinstance(t, (LVar, LInt)) for t in terms) or \
                any(n not in loops for n in names) or len(set(names)) != len(names) or not 1 <= len(names) <= 2:
            return None
        order = sorted(names, key=list(loops).index)  # the cutting loop, then the point loop
        f, g = loops[order[-1]], (loops[order[0]] if len(order) == 2 else None)
        if f.var not in own or f.step != 1 or (g is not None and (
                g.parallel or g.var in lhs_vars or expr_vars(g.init) or expr_vars(g.cond) - {g.var})):
            return None
        used |= set(names)
        const = sum(t.value for t in terms if isinstance(t, LInt))
        g_values = [0]
        if g is not None:
            envs = loop_values((g,), {g.var}, limit=1 << 14)
            if not envs:
                return None
            g_values = [e[g.var] for e in envs]
            if g.var not in own:
                tests.append(LOp("==", (LVar(g.var), LInt(g_values[0]))))
        at = lo.const
        for v in g_values:
            env = {g.var: v} if g is not None else {}
            first, last = expr_value(f.init, env), _last(f, env)
            if first is None or last is None or first + v + const != at or last < first:
                return None
            at = last + v + const + 1
        if at != hi.const:
            return None
    if own - used:
        return None
    if not tests:
        return LInt(1)
    return tests[0] if len(tests) == 1 else LOp("&&", tuple(tests))


def own_reduction(rt: LTile, scop: Scop, s: Statement) -> bool:
    """Each reduction index of ``s`` is one of the tile's own step-1 serial loops plus a constant,
    a loop for each: no loop around the tile moves a reduction index, so one run of the tile's
    loops visits every reduction point its nest holds for each of its elements, whatever their
    bounds. Where the statement's tiles are one to a top-level nest, the nests hold disjoint sets
    of its elements (index-set splitting cuts the outputs, polyhedral.split; isl's loop separation
    cuts the loops outside the tiles): each tile then runs its elements' whole reduction, as a
    guarded statement's boundary piece does (the first row of a padded conv, ``kh`` in 1..2)."""
    st = scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    own = {f.var: f for f in rt.serial}
    used: list[str] = []
    for r in s.reductions:
        terms = sum_terms(args[r])
        names = [t.name for t in terms if isinstance(t, LVar)]
        if any(not isinstance(t, (LVar, LInt)) for t in terms) or len(names) != 1 or names[0] not in own \
                or own[names[0]].step != 1:
            return False
        used.append(names[0])
    return len(set(used)) == len(used) == len(own)


def _last(f: LFor, env: dict[str, int]) -> int | None:
    """The last value of a step-1 loop whose condition is ``var <= e`` or ``var < e``."""
    c = f.cond
    if not (isinstance(c, LOp) and c.op in ("<=", "<") and c.args[0] == LVar(f.var)):
        return None
    e = expr_value(c.args[1], env)
    return None if e is None else e - (1 if c.op == "<" else 0)


def whole_reduction(rt: LTile, scop: Scop, s: Statement) -> bool:
    """The serial loops of ``rt`` run the statement's whole (rectangular) reduction, from its first
    point to its last, for every element of the tile: no other update touches them."""
    return first_chunk(rt, (), scop, s) == LInt(1)


def _init_nests_apart(body: tuple[LNode, ...], init: str) -> bool:
    """Every call of ``init`` is in a top-level nest that calls nothing else."""
    for n in body:
        names = {x.stmt for x in walk((n,)) if isinstance(x, LCall)}
        if init in names and names != {init}:
            return False
    return True


def _updates_cover_init(scop: Scop, number: int) -> bool:
    """Each element the initialisation writes is updated at least once."""
    import islpy as isl

    st = scop.stmt(f"S{number}")
    init = scop.stmt(f"init{number}")
    pos = {name: k for k, name in enumerate(st.indices)}
    src = ", ".join(f"i{k}" for k in range(len(st.indices)))
    dst = ", ".join(f"i{pos[name]}" for name in init.indices)
    proj = isl.UnionMap(f"{{ S{number}[{src}] -> init{number}[{dst}] }}")
    updated = scop.domain.intersect(isl.UnionSet(f"{{ S{number}[{src}] }}")).apply(proj)
    inits = scop.domain.intersect(isl.UnionSet(f"{{ init{number}[{dst}] }}"))
    return bool(inits.is_subset(updated))
