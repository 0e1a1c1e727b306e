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
    flow: isl.UnionMap = field(compare=False)
    false: isl.UnionMap = field(compare=False)

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.false)

    def __str__(self) -> str:
        return f"flow: {self.flow}\nfalse: {self.false}"


def dependences(scop: Scop) -> Deps:
    flow = (isl.UnionAccessInfo.from_sink(scop.reads).set_must_source(scop.writes)
            .set_schedule_map(scop.order).compute_flow().get_may_dependence())
    false = (isl.UnionAccessInfo.from_sink(scop.writes).set_must_source(scop.writes)
             .set_may_source(scop.reads).set_schedule_map(scop.order).compute_flow().get_may_dependence())
    return Deps(flow.coalesce(), false.coalesce())


def respects(deps: isl.UnionMap, schedule_map: isl.UnionMap) -> bool:
    """Whether every dependence goes forward in ``schedule_map`` (a flat schedule of the whole
    domain, e.g. ``Schedule.get_map()``): the legality check run after every transformation."""
    if deps.is_empty():
        return True
    return deps.is_subset(schedule_map.lex_lt_union_map(schedule_map))


def violated(deps: isl.UnionMap, schedule_map: isl.UnionMap) -> isl.UnionMap:
    """The dependences that ``schedule_map`` does not respect (empty when legal)."""
    return deps.subtract(schedule_map.lex_lt_union_map(schedule_map))
