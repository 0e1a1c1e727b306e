"""Scheduling: ``Scop x Deps x MappingOptions -> isl.Schedule`` with isl's scheduler.

Validity is every dependence; proximity and coincidence are the dependences too. The fusion
strategy sets isl's options around the call (Max: whole components; Preserve: maximise
coincidence; Min: one nest per SCC) and restores them afterwards. ``with_default_fusion`` decides
the strategy where the options leave it to the def (core.options.fusion_for), and prints why.
``check_legal`` is the invariant every transformation must keep. isl's answers are remembered in
the process by the constraints and the strategy they were asked with (``_isl_schedule``).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import islpy as isl

from tcdsl.core import knobs
from tcdsl.core.errors import TcScheduleError, TcWarning
from tcdsl.core.options import MappingOptions, fusion_for

from . import guard
from .deps import Deps, dependences, respects, violated
from .scop import Scop, stmt_order

# No constant shifts in schedules (max_constant_term 0): isl would otherwise fuse loops by shifting
# one statement's iterations against another's (S2 at d + 1023), which breaks vectorisation and
# the register tiles; without shifts, statements share their common outer loops and keep their
# own inner loops.
_COMMON = {"schedule_max_constant_term": 0}
_STRATEGY = {
    "max": {**_COMMON, "schedule_whole_component": 1},
    "preserve": {**_COMMON, "schedule_maximize_coincidence": 1},
    "min": {**_COMMON, "schedule_serialize_sccs": 1},
}


@contextmanager
def _isl_options(ctx: isl.Context, values: dict[str, int]) -> Iterator[None]:
    saved = {k: getattr(ctx, f"get_{k}")() for k in values}
    try:
        for k, v in values.items():
            getattr(ctx, f"set_{k}")(v)
        yield
    finally:
        for k, v in saved.items():
            getattr(ctx, f"set_{k}")(v)


def compute(scop: Scop, deps: Deps, options: MappingOptions) -> isl.Schedule:
    """isl's schedule for the scop under the options' fusion strategy. The scheduler works on the
    model for every size (its problems do not grow with the sizes, and a schedule legal for all
    sizes is legal for these), then the tree is restricted to this scop's domain and checked.
    Where isl fused loops by offsetting a statement by a size (S2 at d + D), the call's sizes are
    scheduled instead, within a small operation budget (isl can spin on some small sizes); past
    it, the offset schedule is kept (it is legal, only less tidy)."""
    general = scop.general
    if general is None:
        sched = _isl_schedule(scop, deps, options, knobs.isl_max_operations())
        if sched is None:  # out of budget: the program order
            sched = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
                isl.MultiUnionPwAff.from_union_map(scop.order))
        check_legal(sched, deps)
        return sched
    tree = compute(general, deps.general or dependences(general), options)
    sched = None
    if _shifts_by_sizes(tree) and _instances(scop) >= SIZED_MIN_INSTANCES:
        sched = _isl_schedule(scop, deps, options, SIZED_BUDGET, SIZED_LIMIT_S)
    if sched is None:
        sched = tree.intersect_domain(scop.domain)
    check_legal(sched, deps)
    return sched


def with_default_fusion(scop: Scop, deps: Deps, options: MappingOptions) -> tuple[isl.Schedule, MappingOptions, str]:
    """The schedule, the options with their fusion strategy decided, and why it was: the options'
    own strategy; else the def's default (``fusion_for``), except that where the default 'max'
    leaves more of the work under outermost loops that carry a dependence than 'preserve' does
    (``serial_share``), 'preserve'. Fusing statements whose loops run in different orders (a
    layernorm backward's column sums d_G(d) over n beside its row sums over d) can skew every nest
    under one serial loop, each of whose iterations forks the threads for the parallel loops
    inside it: 512x1024 on 2 threads, 3.9 ms against 0.43 ms for 'preserve'. A def with a scatter
    (polyhedral.scatter) gets 'preserve': 'max' fuses the initialisation of its target with the
    scatter along the target's columns, zeroing the target a column at a time."""
    if options.fusion is not None:
        return compute(scop, deps, options), options, f"fusion '{options.fusion}': the options'"
    scattered = [st.number for st in scop.inst.checked.stmts if st.scatter is not None]
    if scattered:
        kept = options.with_(fusion="preserve")
        return compute(scop, deps, kept), kept, (f"fusion 'preserve': statement {scattered[0]} is a scatter, whose "
                                                 "initialisation runs on its own, along its rows")
    chosen = options.with_(fusion=fusion_for(scop.inst.checked))
    tree = compute(scop, deps, chosen)
    why = f"fusion '{chosen.fusion}': the def's default"
    if chosen.fusion == "max":
        serial = serial_share(tree, scop)
        mixed = mixed_ranges(tree, scop)
        if serial > 0 or mixed:
            kept = options.with_(fusion="preserve")
            other = compute(scop, deps, kept)
            share = serial_share(other, scop)
            if share < serial:
                return other, kept, (f"fusion 'preserve': 'max' ran {serial:.0%} of the statement instances "
                                     f"under serial outermost loops, 'preserve' {share:.0%}")
            if mixed and share <= serial:
                a, b = (stmt_order(n)[0] for n in mixed)
                return other, kept, (f"fusion 'preserve': 'max' fused statements {a} and {b} in loops over ranges "
                                     "of different sizes (each iteration tests which of them runs)")
    return tree, chosen, why


def mixed_ranges(sched: isl.Schedule, scop: Scop) -> tuple[str, str] | None:
    """Two statements (updates, not initialisations) that a band runs over ranges of different
    sizes in one of its members, both moving along it: the loop then tests, at each iteration,
    which statements run (a pooling backward's 23-wide gradient share beside its 46-wide input
    gradient kept neither loop vectorised: 4.6 ms against 2.3 ms apart). None when there are none."""
    found: list[tuple[str, str]] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if found or node.get_type() != isl.schedule_node_type.band:
            return not found
        sets: list[isl.Set] = []
        node.get_domain().foreach_set(sets.append)
        sets = [st for st in sets if st.get_tuple_name().startswith("S")]
        if len(sets) < 2:
            return True
        partial = node.band_get_partial_schedule()
        for i in range(node.band_n_member()):
            upa = partial.get_union_pw_aff(i)
            spans: dict[str, int] = {}
            for st in sets:
                pa = upa.intersect_domain(isl.UnionSet.from_set(st)).extract_pw_aff(
                    st.get_space().from_domain().add_dims(isl.dim_type.out, 1))
                try:
                    lo, hi = pa.min_val(), pa.max_val()
                except isl.Error:
                    continue
                if lo.is_int() and hi.is_int() and hi.to_python() > lo.to_python():
                    spans[st.get_tuple_name()] = hi.to_python() - lo.to_python()
            distinct = sorted(set(spans.values()))
            if len(distinct) > 1:
                names = sorted(spans, key=stmt_order)
                found.append((names[0], next(n for n in names if spans[n] != spans[names[0]])))
                return False
        return True

    sched.get_root().foreach_descendant_top_down(visit)
    return found[0] if found else None


def serial_share(sched: isl.Schedule, scop: Scop) -> float:
    """The share of statement instances (counted by the boxes around each statement's domain)
    whose outermost loop carries a dependence, so that their nest starts serially."""
    boxes: dict[str, int] = {}

    def box(s: isl.Set) -> None:
        n = 1
        for i in range(s.dim(isl.dim_type.set)):
            lo, hi = s.dim_min_val(i), s.dim_max_val(i)
            if lo.is_int() and hi.is_int():
                n *= max(0, hi.to_python() - lo.to_python() + 1)
        boxes[s.get_tuple_name()] = boxes.get(s.get_tuple_name(), 0) + n

    scop.domain.foreach_set(box)
    serial = 0

    def visit(node: isl.ScheduleNode) -> bool:
        nonlocal serial
        if node.get_type() != isl.schedule_node_type.band:
            return True
        if not node.band_member_get_coincident(0):
            names: list[str] = []
            node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
            serial += sum(boxes.get(n, 0) for n in names)
        return False  # the outermost band of each nest only

    sched.get_root().foreach_descendant_top_down(visit)
    total = sum(boxes.values())
    return serial / total if total else 0.0


SIZED_BUDGET = 50000  # isl operations for scheduling one call's sizes (softmax 4096x1024 needs ~30000)
SIZED_LIMIT_S = 2.0  # and seconds (within the budget, isl spent minutes on mlp2 128x1024x1024x512 under max fusion)
# Below this many statement instances the kernel is quick whatever its schedule, and isl was seen to
# spin (minutes, within the operation budget) on some tiny sizes (batchnorm 3x17x4x1): keep the
# size-independent schedule there.
SIZED_MIN_INSTANCES = 1 << 16


def _instances(scop: Scop) -> int:
    total = 0
    for bs in scop.inst.stmts:
        n = 1
        for e in bs.shape:
            n *= e
        total += n
    return total


# isl's answers by their question (the constraints' text, the strategy, the operation budget): a def
# lowered again under other options (the tuner's candidates, in its workers) is scheduled again only
# where the fusion strategy differs. A maxpool's derived backward, 12x48x46x46: isl's four searches
# 2.4 s of its 2.6 s lowering.
MEMO_SCHEDULES = 64
_memo: OrderedDict[tuple[str, ...], str | None] = OrderedDict()
_memo_lock = threading.Lock()


def _isl_schedule(scop: Scop, deps: Deps, options: MappingOptions, budget: int,
                  optional_within_s: float | None = None) -> isl.Schedule | None:
    """isl's schedule within ``budget`` operations and TCDSL_SCHEDULE_TIMEOUT seconds, or None
    (with a warning: the kernel falls back to the program order). An optional search (the caller
    has a schedule already) stops silently after ``optional_within_s`` seconds. A question isl
    answered before in this process (a schedule, or none within the budget) is answered from
    ``_memo``, and so is an optional search the clock stopped (the caller keeps its schedule); a
    required search the clock stopped is asked again next time."""
    ctx = scop.domain.get_ctx()
    strategy = _STRATEGY[options.fusion or "preserve"]
    key = (str(scop.domain), str(scop.context), str(deps.validity), str(deps.all),
           repr(sorted(strategy.items())), str(budget), "optional" if optional_within_s is not None else "required")
    with _memo_lock:
        known = key in _memo
        if known:
            _memo.move_to_end(key)
            text = _memo[key]
    if known:
        return None if text is None else isl.Schedule.read_from_str(ctx, text)
    sc = (isl.ScheduleConstraints.on_domain(scop.domain).set_context(scop.context)
          .set_validity(deps.validity).set_proximity(deps.all).set_coincidence(deps.all))

    def search() -> isl.Schedule | None:
        try:
            with _isl_options(ctx, strategy):
                ctx.set_max_operations(budget)
                ctx.reset_operations()
                try:
                    return sc.compute_schedule()
                finally:
                    ctx.set_max_operations(0)
        except isl.Error:
            return None

    limit = knobs.schedule_timeout()
    if optional_within_s is not None:
        limit = min(limit, optional_within_s) if limit > 0 else optional_within_s
    try:
        sched = guard.run(search, ctx, limit)
    except TimeoutError:
        if optional_within_s is not None:  # the caller's schedule stands: this search is not asked again
            sched = None
        else:
            name = scop.inst.checked.name
            warnings.warn(TcWarning(f"isl's scheduler did not finish within {limit:g} s on def '{name}' "
                                    f"({', '.join(f'{k}={v}' for k, v in scop.inst.sizes.items()) or 'no sizes'}"
                                    f"{', every size' if scop.parametric else ''}); it runs in the program order. "
                                    "TCDSL_SCHEDULE_TIMEOUT sets the limit."), stacklevel=2)
            return None
    with _memo_lock:
        _memo[key] = None if sched is None else str(sched)
        while len(_memo) > MEMO_SCHEDULES:
            _memo.popitem(last=False)
    return sched


def _shifts_by_sizes(sched: isl.Schedule) -> bool:
    """Whether a band of ``sched`` offsets iterations by a size parameter."""
    found = False

    def visit(node: isl.ScheduleNode) -> bool:
        nonlocal found
        if node.get_type() == isl.schedule_node_type.band:
            text = str(node.band_get_partial_schedule())
            found = found or "p_" in text[text.index("{"):]
        return not found

    sched.get_root().foreach_descendant_top_down(visit)
    return found


def check_legal(sched: isl.Schedule, deps: Deps) -> None:
    """Raise TcScheduleError unless every dependence goes forward in ``sched``."""
    smap = sched.get_map()
    if not respects(deps.validity, smap):
        raise TcScheduleError(f"schedule violates dependences: {violated(deps.validity, smap)}")
