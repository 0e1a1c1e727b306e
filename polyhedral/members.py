"""CPU transformation, the tiling's view of memory: ``isl.ScheduleNode (a band) x member x Scop ->
MemberInfo``, how one member of a band moves the accesses of the statements it schedules
(contiguous, invariant or strided; its extent and the bytes a step moves), as polyhedral.tileplan
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcdsl.core import dtypes as T
from tcdsl.core.affine import Sym, Var

from .scop import Scop


@dataclass(frozen=True)
class MemberInfo:
    """What one band member does to the accesses of the statements it schedules."""

    contiguous: float  # accesses whose last dim moves by +-1 and no other dim moves
    invariant: float  # accesses that do not move
    strided: float  # accesses that move along an outer dim
    extent: int  # the largest trip count over the statements (for tile-size choices)
    stride: int = 0  # bytes the widest-moving read advances per step of the member (0: none known)
    whole: int = 0  # the range of the one index it steps over the statement's whole domain (before
    # polyhedral.split cut it into pieces; 0 where it steps several)
    tied: bool = False  # the ranges of the statement's other indices move with it (a boundary piece's rows)
    target: int = 0  # bytes the statements' target advances per step of the member (0: none known)

def member_info(band: isl.ScheduleNode, i: int, scop: Scop) -> MemberInfo:
    """How member ``i`` moves the accesses of the band's statements, each access weighted by its
    statement's share of the band's instances (the statements that do the work decide)."""
    upa = band.band_get_partial_schedule().get_union_pw_aff(i)
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    counts = {dom.get_tuple_name(): _instances(scop, dom.get_tuple_name()) for dom in sets}
    total = sum(counts.values()) or 1
    contiguous = invariant = strided = 0.0
    extent = stride = whole = target = 0
    tied = False
    for dom in sets:
        st = scop.stmt(dom.get_tuple_name())
        weight = counts[st.name] / total
        direction = member_direction(upa, dom)
        if direction is None:
            strided += weight
            continue
        extent = max(extent, _extent(upa, dom))
        stepped = [k for k, c in enumerate(direction) if c]
        if not stepped:  # one wide here (a boundary piece's column): the one index the piece fixes
            stepped = [k for k in range(len(st.indices)) if _index_range(scop, st.name, k, dom) == 1
                       and _index_range(scop, st.name, k) > 1][:2]
        if len(stepped) == 1 and abs(direction[stepped[0]]) in (0, 1):
            whole = max(whole, _index_range(scop, st.name, stepped[0]))
            tied = tied or _tied(dom, stepped[0])
        tc = scop.tc_statement(st.name)
        subs_list = [acc.subs for acc in tc.accesses if acc.kind in ("read", "cond")]
        subs_list.append(tuple(Sym.var(x, "index") for x in tc.lhs))
        for acc in tc.accesses:
            if acc.kind == "read":
                moved = [_move(x, st.indices, direction) for x in acc.subs]
                stride = max(stride, _bytes_moved(scop, acc.tensor, moved))
        target = max(target, _bytes_moved(scop, tc.tensor, [_move(Sym.var(x, "index"), st.indices, direction)
                                                             for x in tc.lhs]))
        for subs in subs_list:
            moves = [_move(sub, st.indices, direction) for sub in subs]
            if all(m == 0 for m in moves):
                invariant += weight
            elif moves and all(m == 0 for m in moves[:-1]) and moves[-1] in (1, -1):
                contiguous += weight
            else:
                strided += weight
    return MemberInfo(contiguous, invariant, strided, extent, stride, whole, tied, target)


def _tied(dom: isl.Set, k: int) -> bool:
    """Whether the other dims' ranges in ``dom`` depend on the value of dim ``k``: ``dom`` is not
    the product of dim ``k``'s range and the rest (a guard ``kh <= h`` in a boundary piece)."""
    n = dom.dim(isl.dim_type.set)
    line = dom.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(isl.dim_type.set, 0, k)
    line = line.insert_dims(isl.dim_type.set, 0, k).add_dims(isl.dim_type.set, n - k - 1)
    if dom.has_tuple_name():
        line = line.set_tuple_name(dom.get_tuple_name())
    return not dom.eliminate(isl.dim_type.set, k, 1).intersect(line).is_equal(dom)


def _index_range(scop: Scop, name: str, k: int, dom: isl.Set | None = None) -> int:
    """The number of values index ``k`` of statement ``name`` takes over ``dom``, by default its
    whole domain (0 where that is not a constant)."""
    sets: list[isl.Set] = [dom] if dom is not None else []
    if dom is None:
        scop.domain.foreach_set(lambda st: sets.append(st) if st.get_tuple_name() == name else None)
    if not sets or sets[0].is_empty():
        return 0
    try:
        lo, hi = sets[0].dim_min_val(k), sets[0].dim_max_val(k)
    except isl.Error:
        return 0
    return hi.to_python() - lo.to_python() + 1 if lo.is_int() and hi.is_int() else 0


def _bytes_moved(scop: Scop, tensor: str, moves: list[int | None]) -> int:
    """Bytes an access of ``tensor`` advances when its subscripts move by ``moves`` (0 if unknown)."""
    shape = scop.inst.shapes.get(tensor)
    if shape is None or None in moves or len(moves) != len(shape):
        return 0
    step, size = 0, T.np_dtype(scop.inst.checked.tensors[tensor].dtype).itemsize
    for d in reversed(range(len(shape))):
        step += (moves[d] or 0) * size
        size *= shape[d]
    return abs(step)


def _instances(scop: Scop, name: str) -> int:
    st = scop.stmt(name)
    bs = scop.bound_statement(name)
    shape = bs.shape[: len(bs.stmt.lhs)] if st.kind == "init" else bs.shape
    count = 1
    for n in shape:
        count *= n
    return count


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


def member_direction(upa: isl.UnionPwAff, dom: isl.Set) -> list[int] | None:
    """The coefficients of a band member over a statement's indices (None if not affine)."""
    pa = upa.intersect_domain(isl.UnionSet.from_set(dom)).extract_pw_aff(_pw_space(upa, dom))
    coeffs: list[list[int | None]] = []

    def piece(_set: isl.Set, aff: isl.Aff) -> None:
        vals = [aff.get_coefficient_val(isl.dim_type.in_, k) for k in range(aff.dim(isl.dim_type.in_))]
        coeffs.append([v.to_python() if v.is_int() else None for v in vals])  # rational: a floor division

    pa.foreach_piece(piece)
    if not coeffs or any(c != coeffs[0] for c in coeffs) or None in coeffs[0]:
        return None
    return coeffs[0]  # type: ignore[return-value]


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
