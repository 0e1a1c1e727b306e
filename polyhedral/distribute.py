"""CPU transformation, before tiling: distribution of bands by statement
(``isl.ScheduleNode x Deps -> isl.ScheduleNode``): a band's ``!`` initialisations split off before
its other statements, bands that run statements in opposite directions or that fuse a reduction
with other statements' writes cut into one band per statement, wherever that stays legal.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

from .deps import Deps, respects
from .members import member_direction
from .scop import Scop, stmt_order


def split_inits(root: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode:
    """Give the ``!`` initialisations of each outer band a nest of their own, before the band's
    other statements (no init guard inside a reduction loop), where that keeps the schedule legal."""
    node = root.child(0)
    if node.get_type() == isl.schedule_node_type.band:
        return _split_band(node, deps).root()
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        i = 0
        while i < node.n_children():  # a split may merge its new sequence into this one: recount
            child = node.child(i)
            if child.n_children() and child.child(0).get_type() == isl.schedule_node_type.band:
                node = _split_band(child.child(0), deps).root().child(0)  # the outer sequence keeps its place
            i += 1
    return node.root()


def _split_band(band: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode:
    dom = band.get_domain()
    names: list[str] = []
    dom.foreach_set(lambda st: names.append(st.get_tuple_name()))
    inits = [n for n in names if n.startswith("init")]
    if not inits or len(inits) == len(names):
        return band
    filt = isl.UnionSet("{ " + "; ".join(f"{n}[{', '.join(f'i{k}' for k in range(_arity(dom, n)))}]"
                                         for n in inits) + " }").intersect(dom)
    split = band.order_before(filt)
    if respects(deps.validity, split.get_schedule().get_map()):
        return split
    return band


def _arity(dom: isl.UnionSet, name: str) -> int:
    sets: list[isl.Set] = []
    dom.foreach_set(lambda st: sets.append(st) if st.get_tuple_name() == name else None)
    return sets[0].dim(isl.dim_type.set)


def distribute_mixed(root: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode:
    """Bands that run one statement backwards and another forwards (isl's way of fusing a
    reduction after another inside one loop) are distributed into one band per statement, in
    textual order, where that is legal; each then runs forwards (polyhedral.transform's
    ``_unreverse``)."""
    failed: set[tuple[int, ...]] = set()
    for _ in range(64):  # each success splits a band into single-statement bands: this ends
        path = _find_band(root, (), _mixed, failed)
        if path is None:
            return root
        node = root
        for i in path:
            node = node.child(i)
        done = distribute(node, deps)
        failed.add(path)  # a path is tried once, whatever happens
        if done is not None:
            root = done.root()
    return root


def _find_band(node: isl.ScheduleNode, path: tuple[int, ...], pred: Callable[[isl.ScheduleNode], bool],
               skip: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    if node.get_type() == isl.schedule_node_type.band and path not in skip and pred(node):
        return path
    for i in range(node.n_children()):
        found = _find_band(node.child(i), path + (i,), pred, skip)
        if found is not None:
            return found
    return None


def _mixed(band: isl.ScheduleNode) -> bool:
    mupa = band.band_get_partial_schedule()
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    if len(sets) < 2:
        return False
    for i in range(band.band_n_member()):
        signs = set()
        for dom in sets:
            d = member_direction(mupa.get_union_pw_aff(i), dom)
            signs |= {(c > 0) - (c < 0) for c in (d or []) if c != 0}
        if signs == {1, -1}:
            return True
    return False


def distribute_reductions(root: isl.ScheduleNode, deps: Deps, scop: Scop) -> isl.ScheduleNode:
    """Innermost bands whose serial member moves one statement's reduction (its element stays)
    and another statement's element are distributed from that member inwards, one loop per
    statement in textual order, where that is legal; the members outside it stay shared. Fused,
    every statement runs serially and unvectorised; apart, the reduction accumulates in a register
    (codegen.lower) and the others' loops are parallel (vectorised). A softmax's backward,
    d_mx(n) +=! d_e(n, d) * -exp(..) beside d_X(n, d) +=! d_e(n, d) * exp(..), 1024x1024 on 2
    threads: 4.3 -> 0.94 ms."""
    failed: set[tuple[int, ...]] = set()
    for _ in range(64):  # each success leaves single-statement bands inside: this ends
        path = _find_band(root, (), lambda band: _reduction_member(band, scop) is not None, failed)
        if path is None:
            return root
        failed.add(path)
        node = root
        for i in path:
            node = node.child(i)
        member = _reduction_member(node, scop)
        assert member is not None
        inner = node.band_split(member).child(0) if member else node
        done = distribute(inner, deps)
        if done is not None:
            root = done.root()
    return root


def _reduction_member(band: isl.ScheduleNode, scop: Scop) -> int | None:
    """The first serial member of innermost band ``band`` along which one statement reduces (its
    element stays) and another writes a new element each step (None: there is none)."""
    if _band_below(band):
        return None
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    if len(sets) < 2:
        return None
    mupa = band.band_get_partial_schedule()
    for i in range(band.band_n_member()):
        if band.band_member_get_coincident(i):
            continue
        kinds = set()
        for dom in sets:
            name = dom.get_tuple_name()
            d = member_direction(mupa.get_union_pw_aff(i), dom)
            if not d or not any(d):
                continue
            moved = {ix for ix, c in zip(scop.stmt(name).indices, d) if c}
            kinds.add("writes" if moved & set(scop.tc_statement(name).lhs) else "reduces")
        if kinds == {"writes", "reduces"}:
            return i
    return None


def _band_below(node: isl.ScheduleNode) -> bool:
    """Whether a band lies under ``node``."""
    found = False

    def visit(n: isl.ScheduleNode) -> bool:
        nonlocal found
        found = found or (n.get_type() == isl.schedule_node_type.band and not n.is_equal(node))
        return not found

    node.foreach_descendant_top_down(visit)
    return found


def distribute(band: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode | None:
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    sets.sort(key=lambda st: stmt_order(st.get_tuple_name()))
    node = band
    for st in sets[:-1]:
        node = node.order_before(isl.UnionSet.from_set(st))
    return node if respects(deps.validity, node.get_schedule().get_map()) else None
