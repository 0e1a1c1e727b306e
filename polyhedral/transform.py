"""CPU transformations: ``isl.Schedule x MappingOptions -> isl.Schedule`` (tile, permute, unroll).

Every permutable band is tiled (cache tiles), its point band is permuted so that the innermost
loop walks contiguous memory, and, when asked, the point band is tiled again into register
tiles whose loops are fully unrolled (unroll-and-jam). Each step keeps the schedule legal
(checked by ``schedule.check_legal`` after the whole pass, and after each step under the
``TCDSL_CHECK_SCHEDULE`` knob).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcdsl import knobs
from tcdsl.affine import Sym, Var
from tcdsl.options import MappingOptions

from .deps import Deps, respects
from .schedule import check_legal
from .scop import Scop

DEFAULT_TILE = 32


@dataclass(frozen=True)
class MemberInfo:
    """What one band member does to the accesses of the statements it schedules."""

    contiguous: int  # accesses whose last dim moves by +-1 and no other dim moves
    invariant: int  # accesses that do not move
    strided: int  # accesses that move along an outer dim
    extent: int  # the largest trip count over the statements (for tile-size choices)


def transform(sched: isl.Schedule, scop: Scop, deps: Deps, options: MappingOptions) -> isl.Schedule:
    node = _split_inits(sched.get_root(), deps)
    node = _visit(node, scop, deps, options)
    out = node.get_schedule()
    check_legal(out, deps)
    return out


def _split_inits(root: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode:
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
    if respects(deps.all, split.get_schedule().get_map()):
        return split
    return band


def _arity(dom: isl.UnionSet, name: str) -> int:
    sets: list[isl.Set] = []
    dom.foreach_set(lambda st: sets.append(st) if st.get_tuple_name() == name else None)
    return sets[0].dim(isl.dim_type.set)


def _visit(node: isl.ScheduleNode, scop: Scop, deps: Deps, options: MappingOptions) -> isl.ScheduleNode:
    """Transform every band below ``node``; returns the node at ``node``'s position."""
    depth = node.get_tree_depth()
    if node.get_type() == isl.schedule_node_type.band:
        node = _band(node, scop, deps, options)
    for i in range(node.n_children()):
        node = _visit(node.child(i), scop, deps, options).parent()
    while node.get_tree_depth() > depth:
        node = node.parent()
    return node


def _band(band: isl.ScheduleNode, scop: Scop, deps: Deps, options: MappingOptions) -> isl.ScheduleNode:
    """Tile ``band`` and arrange its point loops; returns the innermost band created, so the
    caller continues below it."""
    n = band.band_n_member()
    if not (band.band_get_permutable() or n == 1):
        return band
    infos = [member_info(band, i, scop) for i in range(n)]
    sizes = _tile_sizes(infos, options)
    if any(s > 1 for s in sizes):
        mv = isl.MultiVal.zero(band.band_get_space())
        ctx = band.get_ctx()
        for i, s in enumerate(sizes):
            # a size of 1 would keep the member whole inside the point band: tile by its extent instead
            mv = mv.set_val(i, isl.Val.int_from_si(ctx, s if s > 1 else max(infos[i].extent, 1)))
        band = band.band_tile(mv).child(0)
        _maybe_check(band, deps)
    if n > 1 and band.band_get_permutable():
        order = options.point_order if options.point_order and len(options.point_order) == n else \
            _point_order(infos)
        band = permute(band, list(order))
        _maybe_check(band, deps)
    if options.register_tile:
        band = _register_tile(band, options.register_tile)
        _maybe_check(band, deps)
    return band


def _tile_sizes(infos: list[MemberInfo], options: MappingOptions) -> list[int]:
    if options.tile is not None:
        sizes = list(options.tile) + [0] * len(infos)
        return [sizes[i] for i in range(len(infos))]
    return [DEFAULT_TILE if info.extent > DEFAULT_TILE else 0 for info in infos]


def _point_order(infos: list[MemberInfo]) -> list[int]:
    """Innermost: the member with the most contiguous and fewest strided accesses; the others
    keep their order (outermost first)."""
    def score(i: int) -> tuple[int, int, int]:
        m = infos[i]
        return (m.contiguous - m.strided, m.invariant, i)

    inner = max(range(len(infos)), key=score)
    return [i for i in range(len(infos)) if i != inner] + [inner]


def permute(band: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Rebuild a permutable band with its members in ``order`` (coincidence flags follow)."""
    if order == list(range(len(order))):
        return band
    ctx = band.get_ctx()
    mupa = band.band_get_partial_schedule()
    coincident = [band.band_member_get_coincident(i) for i in range(band.band_n_member())]
    lst = isl.UnionPwAffList.alloc(ctx, len(order))
    for i in order:
        lst = lst.add(mupa.get_union_pw_aff(i))
    space = mupa.get_space()
    node = band.delete().insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff_list(space, lst))
    node = node.band_set_permutable(1)
    for new, old in enumerate(order):
        node = node.band_member_set_coincident(new, coincident[old])
    return node


def _register_tile(band: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    n = band.band_n_member()
    vals = (list(sizes) + [1] * n)[:n]
    if all(v <= 1 for v in vals):
        return band
    mv = isl.MultiVal.zero(band.band_get_space())
    ctx = band.get_ctx()
    for i, v in enumerate(vals):
        mv = mv.set_val(i, isl.Val.int_from_si(ctx, max(v, 1)))
    inner = band.band_tile(mv).child(0)
    for i, v in enumerate(vals):
        if v > 1:
            inner = inner.band_member_set_ast_loop_type(i, isl.ast_loop_type.unroll)
    return inner


def _maybe_check(node: isl.ScheduleNode, deps: Deps) -> None:
    if knobs.check_schedule():
        check_legal(node.get_schedule(), deps)


# ---- what a member does to memory ---------------------------------------------------------------


def member_info(band: isl.ScheduleNode, i: int, scop: Scop) -> MemberInfo:
    upa = band.band_get_partial_schedule().get_union_pw_aff(i)
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    contiguous = invariant = strided = extent = 0
    for dom in sets:
        st = scop.stmt(dom.get_tuple_name())
        direction = _direction(upa, dom)
        if direction is None:
            strided += 1
            continue
        extent = max(extent, _extent(upa, dom))
        tc = scop.tc_statement(st.name)
        subs_list = [acc.subs for acc in tc.accesses if acc.kind in ("read", "cond")]
        subs_list.append(tuple(Sym.var(x, "index") for x in tc.lhs))
        for subs in subs_list:
            moves = [_move(sub, st.indices, direction) for sub in subs]
            if all(m == 0 for m in moves):
                invariant += 1
            elif moves and all(m == 0 for m in moves[:-1]) and moves[-1] in (1, -1):
                contiguous += 1
            else:
                strided += 1
    return MemberInfo(contiguous, invariant, strided, extent)


def _move(sub: Sym | None, indices: tuple[str, ...], direction: list[int]) -> int | None:
    """How far a subscript moves when the member advances by one (None: not affine in it)."""
    if sub is None:
        return None
    total = 0
    for k, name in enumerate(indices):
        if direction[k] == 0:
            continue
        v = Var(name, "index")
        c = sub.coeff(v)
        if c == 0 and name in sub.indices():
            return None
        total += c * direction[k]
    return total


def _direction(upa: isl.UnionPwAff, dom: isl.Set) -> list[int] | None:
    """The coefficients of a band member over a statement's indices (None if not affine)."""
    pa = upa.intersect_domain(isl.UnionSet.from_set(dom)).extract_pw_aff(_pw_space(upa, dom))
    coeffs: list[list[int]] = []

    def piece(_set: isl.Set, aff: isl.Aff) -> None:
        coeffs.append([aff.get_coefficient_val(isl.dim_type.in_, k).to_python()
                       for k in range(aff.dim(isl.dim_type.in_))])

    pa.foreach_piece(piece)
    if not coeffs or any(c != coeffs[0] for c in coeffs):
        return None
    return coeffs[0]


def _pw_space(upa: isl.UnionPwAff, dom: isl.Set) -> isl.Space:
    return dom.get_space().from_domain().add_dims(isl.dim_type.out, 1)


def _extent(upa: isl.UnionPwAff, dom: isl.Set) -> int:
    pa = upa.intersect_domain(isl.UnionSet.from_set(dom)).extract_pw_aff(_pw_space(upa, dom))
    try:
        lo, hi = pa.min_val(), pa.max_val()
    except isl.Error:
        return 0
    if not (lo.is_int() and hi.is_int()):
        return 0
    return hi.to_python() - lo.to_python() + 1
