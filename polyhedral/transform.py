"""CPU transformations: ``isl.Schedule x MappingOptions -> isl.Schedule`` (tile, permute, unroll).

Every permutable band is tiled (cache tiles), its point band is permuted so that the innermost
loop walks contiguous memory, and, when asked, the point band is tiled again into register
tiles whose loops are fully unrolled (unroll-and-jam). Each step keeps the schedule legal
(checked by ``schedule.check_legal`` after the whole pass, and after each step under the
``TCDSL_CHECK_SCHEDULE`` knob). Before tiling, bands are distributed by statement
(polyhedral.distribute) and padded statements split (polyhedral.split); each band's sizes, order
and register tiles come from polyhedral.tileplan, from what its members do to memory
(polyhedral.members).
"""

from __future__ import annotations

import islpy as isl

from tcdsl.core import dtypes as T
from tcdsl.core import knobs
from tcdsl.core.options import MappingOptions

from . import split
from .cputarget import GENERIC, CpuTarget
from .deps import Deps, respects
from .distribute import distribute_mixed, distribute_reductions, split_inits
from .members import member_direction, member_info
from .schedule import check_legal
from .scop import Scop
from .tileplan import plan, scatter_plan


def transform(sched: isl.Schedule, scop: Scop, deps: Deps, options: MappingOptions,
              target: CpuTarget = GENERIC) -> isl.Schedule:
    node = split_inits(sched.get_root(), deps)
    node = distribute_mixed(node, deps)
    node = distribute_reductions(node, deps, scop)
    node = split.run(node, scop, deps)
    node = _visit(node, scop, deps, options, target)
    out = node.get_schedule()
    check_legal(out, deps)
    return out


def _visit(node: isl.ScheduleNode, scop: Scop, deps: Deps, options: MappingOptions,
           target: CpuTarget, boundary: bool = False) -> isl.ScheduleNode:
    """Transform every band below ``node`` (``boundary``: below a boundary piece's mark, see
    polyhedral.split); returns the node at ``node``'s position."""
    depth = node.get_tree_depth()
    if node.get_type() == isl.schedule_node_type.mark:
        boundary = boundary or node.mark_get_id().get_name() == split.BOUNDARY_MARK
    if node.get_type() == isl.schedule_node_type.band:
        node = _band(node, scop, deps, options, target, boundary)
    for i in range(node.n_children()):
        node = _visit(node.child(i), scop, deps, options, target, boundary).parent()
    while node.get_tree_depth() > depth:
        node = node.parent()
    return node


def _band(band: isl.ScheduleNode, scop: Scop, deps: Deps, options: MappingOptions,
          target: CpuTarget, boundary: bool = False) -> isl.ScheduleNode:
    """Tile ``band`` and arrange its point loops; returns the innermost band created, so the
    caller continues below it."""
    n = band.band_n_member()
    if not (band.band_get_permutable() or n == 1):
        return band
    band = _unreverse(band, deps)
    # each member from 0 over the band's domain (one shift for all its statements: the same
    # dependences), so that tiles start where the loops do: a conv written for its interior
    # (`where h in 2:30, w in 2:30`) had its register tiles cut by `max(0, 2 - c)` bounds and no
    # vector form, 21 ms against 1.3 ms for the whole padded conv
    band = split.from_zero(band)
    infos = [member_info(band, i, scop) for i in range(n)]
    coincident = [bool(band.band_member_get_coincident(i)) for i in range(n)]
    if _scatters(band, scop):
        p = scatter_plan(infos, coincident, target, _itemsize(band, scop))
    else:
        # a one-member band is a strip-mine, not a reuse tiling; outermost, its tiles are the threads'
        # shares, which a leaf's vector loop keeps (a pointwise kernel in chunks of vectors)
        spread = band.get_schedule_depth() > 0 or band.child(0).get_type() != isl.schedule_node_type.leaf
        p = plan(infos, coincident, options, target, _itemsize(band, scop), boundary, spread)
    if any(s > 1 for s in p.tile) or p.singles:
        mv = isl.MultiVal.zero(band.band_get_space())
        ctx = band.get_ctx()
        for i, s in enumerate(p.tile):
            # an untiled member keeps its whole range in the point band: tile it by its extent
            size = 1 if i in p.singles else s if s > 1 else max(infos[i].extent, 1)
            mv = mv.set_val(i, isl.Val.int_from_si(ctx, size))
        band = band.band_tile(mv).child(0)
        _maybe_check(band, deps)
    if n > 1 and band.band_get_permutable():
        band = permute(band, p.order)
        _maybe_check(band, deps)
    if any(r > 1 for r in p.register):
        band = _register_tile(band, p.register)
        _maybe_check(band, deps)
    return band


def _scatters(band: isl.ScheduleNode, scop: Scop) -> bool:
    """Whether the band schedules a scatter (polyhedral.scatter)."""
    names: list[str] = []
    band.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    return any(name.startswith("S") and scop.tc_statement(name).scatter is not None for name in names)


def _itemsize(band: isl.ScheduleNode, scop: Scop) -> int:
    """Bytes per element of the widest tensor the band's statements write (4 when none is known)."""
    names: list[str] = []
    band.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    tensors = scop.inst.checked.tensors
    sizes = [T.np_dtype(tensors[scop.tc_statement(name).tensor].dtype).itemsize for name in names]
    return max(sizes, default=4)


def _unreverse(band: isl.ScheduleNode, deps: Deps) -> isl.ScheduleNode:
    """Members that run every statement's indices backwards (isl may reverse a loop that carries
    only reductions) are turned forwards again when that stays legal: forward loops read memory
    in the order the prefetchers and vector loads expect."""
    mupa = band.band_get_partial_schedule()
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    flip = []
    for i in range(band.band_n_member()):
        found = [member_direction(mupa.get_union_pw_aff(i), dom) for dom in sets]
        dirs = [d for d in found if d is not None]
        if len(dirs) == len(found) and all(c <= 0 for d in dirs for c in d) and any(c < 0 for d in dirs for c in d):
            flip.append(i)
    if not flip:
        return band
    for i in flip:
        mupa = mupa.set_union_pw_aff(i, mupa.get_union_pw_aff(i).neg())
    coincident = [band.band_member_get_coincident(i) for i in range(band.band_n_member())]
    permutable = band.band_get_permutable()
    node = band.delete().insert_partial_schedule(mupa)
    node = node.band_set_permutable(permutable)
    for i, c in enumerate(coincident):
        node = node.band_member_set_coincident(i, c)
    if respects(deps.validity, node.get_schedule().get_map()):
        return node
    return band


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


REGISTER_MARK = "register_tile"  # above the loops of a register tile (codegen.lower's regtile pass)


def _register_tile(band: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """Tile the point band again: members of size 1 move out (a reduction loop ends up outside
    the register tile), the others leave small inner loops marked ``REGISTER_MARK``, which the
    lowering passes keep in registers."""
    mv = isl.MultiVal.zero(band.band_get_space())
    ctx = band.get_ctx()
    for i, v in enumerate(sizes):
        mv = mv.set_val(i, isl.Val.int_from_si(ctx, max(v, 1)))
    # the mark carries the sizes of the loops it leaves (astgen bounds each by its size)
    mark = isl.Id(REGISTER_MARK, user=tuple(v for v in sizes if v > 1))
    return band.band_tile(mv).child(0).insert_mark(mark).child(0)


def _maybe_check(node: isl.ScheduleNode, deps: Deps) -> None:
    if knobs.check_schedule():
        check_legal(node.get_schedule(), deps)
