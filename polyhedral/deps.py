"""Dependences: ``Scop -> Deps`` (flow, anti and output dependences as isl union maps).

Computed with isl's dataflow analysis (``UnionAccessInfo.compute_flow``) against the program
order: flow (RAW) from writes to later reads, and the false dependences (WAR and WAW) the PPCG
way, with writes as sinks, writes as must-sources and reads as may-sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from .scop import Scop


@dataclass(frozen=True)
class Deps:
    """``flow`` and ``false`` order different statements, or a non-reduction statement's
    instances; ``reduction`` links the instances of one reduction statement through the element
    they accumulate into. Reductions are sums, products, minima and maxima: their updates may run
    in any order, but never two at once. So schedules must respect ``validity``; loops are
    parallel only if they carry nothing in ``all``."""

    flow: isl.UnionMap = field(compare=False)
    false: isl.UnionMap = field(compare=False)
    reduction: isl.UnionMap = field(compare=False)
    general: Deps | None = field(default=None, compare=False)  # those of ``Scop.general``, where there is one

    @property
    def validity(self) -> isl.UnionMap:
        return self.flow.union(self.false)

    @property
    def all(self) -> isl.UnionMap:
        return self.validity.union(self.reduction)

    def __str__(self) -> str:
        return f"flow: {self.flow}\nfalse: {self.false}\nreduction: {self.reduction}"


def dependences(scop: Scop) -> Deps:
    """The scop's dependences. A scop fixed to a call's sizes takes those of its general model (which
    the scheduler needs anyway) at these sizes: dataflow is exact for each value of the sizes, and
    the fixed model is the general one with the sizes' values as constraints."""
    if scop.general is not None:
        g = dependences(scop.general)
        fixed = scop.context
        return Deps(g.flow.intersect_params(fixed).coalesce(), g.false.intersect_params(fixed).coalesce(),
                    g.reduction.intersect_params(fixed).coalesce(), g)
    updates = [st for st in scop.stmts if st.kind == "update" and scop.tc_statement(st.name).op != "="]
    red = statements_in(scop.domain, [st.name for st in updates])
    plain = scop.domain.subtract(red)
    must, may = scop.writes.intersect_domain(plain), scop.writes.intersect_domain(red)
    flow = (isl.UnionAccessInfo.from_sink(scop.reads).set_must_source(must).set_may_source(may)
            .set_schedule_map(scop.order).compute_flow().get_may_dependence())
    false = (isl.UnionAccessInfo.from_sink(scop.writes).set_must_source(must)
             .set_may_source(may.union(scop.reads)).set_schedule_map(scop.order).compute_flow().get_may_dependence())
    self_deps = isl.UnionMap.empty(flow.get_space())
    for st in updates:
        one = statements_in(scop.domain, [st.name])
        self_deps = self_deps.union(flow.union(false).intersect_domain(one).intersect_range(one))
    return Deps(flow.subtract(self_deps).coalesce(), false.subtract(self_deps).coalesce(), self_deps.coalesce())


def statements_in(domain: isl.UnionSet, names: list[str]) -> isl.UnionSet:
    """The part of ``domain`` that belongs to the statements ``names``."""
    out = isl.UnionSet.empty(domain.get_space())
    sets: list[isl.Set] = []
    domain.foreach_set(sets.append)
    for st in sets:
        if st.get_tuple_name() in names:
            out = out.union(isl.UnionSet.from_set(st))
    return out


def respects(deps: isl.UnionMap, schedule_map: isl.UnionMap) -> bool:
    """Whether every dependence goes forward in ``schedule_map`` (a flat schedule of the whole
    domain, e.g. ``Schedule.get_map()``): the legality check run after every transformation."""
    if deps.is_empty():
        return True
    return violated(deps, schedule_map).is_empty()


def violated(deps: isl.UnionMap, schedule_map: isl.UnionMap) -> isl.UnionMap:
    """The dependences that ``schedule_map`` does not respect (empty when legal): each dependence
    taken to schedule time, compared there with time's lexicographic order (far cheaper than
    ordering every pair of instances when the schedule has many pieces)."""
    timed = deps.apply_domain(schedule_map).apply_range(schedule_map)
    maps: list[isl.Map] = []
    timed.foreach_map(maps.append)
    if any(not m.get_space().domain().is_equal(m.get_space().range()) for m in maps):
        return deps.subtract(schedule_map.lex_lt_union_map(schedule_map))  # times of different lengths
    late = isl.UnionMap.empty(timed.get_space())
    for m in maps:
        late = late.union(isl.UnionMap.from_map(m.subtract(isl.Map.lex_lt(m.get_space().domain()))))
    if late.is_empty():
        return late
    back = late.apply_domain(schedule_map.reverse()).apply_range(schedule_map.reverse())
    return deps.intersect(back)
