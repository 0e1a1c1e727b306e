"""Schedule trim: ``isl.Schedule -> isl.Schedule`` without the band members that take one value
over their band's whole domain.

Tiling gives every member of a band a tile loop, and a member whose tile covers its whole range (a
batch of 32 in tiles of 32, a register band's member that steps over nothing) keeps one whose
schedule is a constant. Such a dimension orders nothing, but isl's AST builder still works through
it: a max-pool's 6-deep statement had 18 schedule dimensions, and its AST took 0.125 s instead of
0.05 s. Dropping a member that is constant over its band's domain keeps the order of every pair
of instances (lexicographic order does not look at a component that is equal everywhere), so the
AST has the same loops; the loops' names follow the dimensions that remain. A band left with no
member goes. The flags of the members kept (permutable, coincident) stay as they were.
"""

from __future__ import annotations

import islpy as isl


def run(sched: isl.Schedule) -> isl.Schedule:
    return _trim(sched.get_root()).get_schedule()


def constant_members(band: isl.ScheduleNode) -> list[int]:
    """The members of ``band`` that take one value over the band's domain."""
    dom = band.get_domain()
    mupa = band.band_get_partial_schedule()
    out = []
    for i in range(band.band_n_member()):
        values = isl.UnionMap.from_union_pw_aff(mupa.get_union_pw_aff(i)).intersect_domain(dom).range()
        sets: list[isl.Set] = []
        values.foreach_set(sets.append)
        if len(sets) == 1 and sets[0].is_singleton():
            out.append(i)
    return out


def _trim(node: isl.ScheduleNode) -> isl.ScheduleNode:
    if node.get_type() == isl.schedule_node_type.band:
        drop = constant_members(node)
        if drop:
            node = _without(node, drop)
            if node.get_type() != isl.schedule_node_type.band:  # the band went: go on from what took its place
                return _trim(node)
    for i in range(node.n_children()):
        node = _trim(node.child(i)).parent()
    return node


def _without(band: isl.ScheduleNode, drop: list[int]) -> isl.ScheduleNode:
    """``band`` without the members ``drop``; where none is left, the band's child in its place."""
    n = band.band_n_member()
    keep = [i for i in range(n) if i not in drop]
    mupa = band.band_get_partial_schedule()
    permutable = band.band_get_permutable()
    coincident = [band.band_member_get_coincident(i) for i in keep]
    node = band.delete()
    if not keep:
        return node
    parts = isl.UnionPwAffList.alloc(node.get_ctx(), len(keep))
    for i in keep:
        parts = parts.add(mupa.get_union_pw_aff(i))
    space = mupa.get_space().drop_dims(isl.dim_type.set, 0, n).add_dims(isl.dim_type.set, len(keep))
    node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff_list(space, parts))
    node = node.band_set_permutable(permutable)
    for j, c in enumerate(coincident):
        node = node.band_member_set_coincident(j, c)
    return node
