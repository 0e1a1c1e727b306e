"""CPU transformation, before tiling: index-set splitting of guarded statements
(``isl.ScheduleNode -> isl.ScheduleNode``).

Padding by domain gives a statement guards that tie an output index to a reduction index
(``0 <= h + kh - 1 < H`` in a "same" convolution). Left in one nest, they make the reduction
loops' bounds depend on the output loops and the output row's bounds depend on the reduction
loops, so no register tile or vector row fits. This pass splits such a statement's band, along
every output index ``d`` with such guards, into the values of ``d`` where every reduction point
of the bounding box passes them (the interior, one interval) and the values below and above it
(the boundary). Each piece gets its own copy of the band, in order: the interior's domain is a
box again, tiled and vectorised like an unpadded statement; the boundary pieces keep the guards.
Where ``d`` is tied to a long reduction (a padded weight gradient's window, tied to the rows and
columns summed over), its boundary values become pieces of one value each (see ``cut``).

Pieces partition the output indices, so each output element is reduced in one piece and no
dependence runs between them; the split is kept only where the scheduled order stays legal.
"""

from __future__ import annotations

import itertools

import islpy as isl

from .deps import Deps, respects
from .scop import Scop

BOUNDARY_MARK = "boundary_piece"  # above each boundary piece's band (tileplan.plan may run it along another member)
MAX_PIECES = 27  # three split output indices (a 3-d stencil); beyond, the statement keeps its guards


def run(root: isl.ScheduleNode, scop: Scop, deps: Deps) -> isl.ScheduleNode:
    """Split every outermost band that schedules one guarded update statement (the root again)."""
    done: set[str] = set()
    for _ in range(len(scop.stmts)):  # each round splits one statement's band; the paths then change
        path = _next_band(root, (), scop, done)
        if path is None:
            break
        node = root
        for i in path:
            node = node.child(i)
        name = _names(node)[0]
        done.add(name)
        split = _split(node, scop, name)
        if split is not None and respects(deps.validity, split.get_schedule().get_map()):
            root = split.root()
    return root


def _names(node: isl.ScheduleNode) -> list[str]:
    names: list[str] = []
    node.get_domain().foreach_set(lambda st: names.append(st.get_tuple_name()))
    return names


def _next_band(node: isl.ScheduleNode, path: tuple[int, ...], scop: Scop,
               done: set[str]) -> tuple[int, ...] | None:
    """The path to the first outermost band holding one update statement not yet tried."""
    if node.get_type() == isl.schedule_node_type.band:
        names = _names(node)
        if len(names) == 1 and names[0].startswith("S") and names[0] not in done:
            return path
        return None
    for i in range(node.n_children()):
        found = _next_band(node.child(i), path + (i,), scop, done)
        if found is not None:
            return found
    return None


def _split(band: isl.ScheduleNode, scop: Scop, name: str) -> isl.ScheduleNode | None:
    sets: list[isl.Set] = []
    band.get_domain().foreach_set(sets.append)
    dom = sets[0].coalesce()
    outer = len(scop.tc_statement(name).lhs)
    cuts = cut(dom, outer)
    if len(cuts) < 2:
        return None
    node = band
    for piece, _ in cuts[:-1]:
        node = node.order_before(isl.UnionSet.from_set(piece))
    seq = node.parent().parent()
    inner = next(piece for piece, interior in cuts if interior)
    for i in range(seq.n_children()):
        child = seq.child(i).child(0)
        if child.get_type() == isl.schedule_node_type.band and _names(child) == [name]:
            shifted = from_zero(child)
            boundary = not isl.UnionSet.from_set(inner).is_equal(shifted.get_domain())
            seq = (shifted.insert_mark(isl.Id(BOUNDARY_MARK)) if boundary else shifted).parent().parent()
    return seq


def from_zero(band: isl.ScheduleNode) -> isl.ScheduleNode:
    """``band`` with each member shifted to start at 0 over the band's domain (a piece), so that
    the tiles laid over it later start where the piece starts, and the interior's tiles are whole."""
    dom = band.get_domain()
    mupa = band.band_get_partial_schedule()
    for i in range(band.band_n_member()):
        upa = mupa.get_union_pw_aff(i)
        try:
            lo = upa.intersect_domain(dom).min_val()
        except isl.Error:  # a quasi-affine member (a floor of the piece's indices): left where it starts
            continue
        if lo.is_int() and not lo.is_zero():
            mupa = mupa.set_union_pw_aff(i, upa.sub(isl.UnionPwAff.val_on_domain(dom, lo)))
    coincident = [band.band_member_get_coincident(i) for i in range(band.band_n_member())]
    permutable = band.band_get_permutable()
    node = band.delete().insert_partial_schedule(mupa).band_set_permutable(permutable)
    for i, c in enumerate(coincident):
        node = node.band_member_set_coincident(i, c)
    return node


def pieces(dom: isl.Set, outer: int) -> list[isl.Set]:
    """``dom`` cut along each of its first ``outer`` (output) dims that a guard ties to the later
    (reduction) dims: boundary below, interior, boundary above, in lexicographic order. One piece
    (``[dom]``) when nothing is split."""
    return [piece for piece, _ in cut(dom, outer)]


def cut(dom: isl.Set, outer: int) -> list[tuple[isl.Set, bool]]:
    """``pieces``, each with whether it is the interior (every split dim in its middle range)."""
    n = dom.dim(isl.dim_type.set)
    basics = dom.get_basic_sets()
    if dom.is_empty() or len(basics) != 1 or outer >= n:
        return [(dom, True)]
    box = _box(dom)
    if box is None:
        return [(dom, True)]
    cons = basics[0].get_constraints()
    ranges: list[tuple[int, list[tuple[int, int]], int]] = []  # (dim, its ranges, the interior's position)
    long_ties: list[int] = []  # the dims tied to a long reduction
    for d in range(outer):
        found = _cut(dom, box, cons, d, outer)
        if found is not None:
            ranges.append((d, found[0], found[1]))
            if found[2]:
                long_ties.append(len(ranges) - 1)
    count = 1
    for _, cut_d, _ in ranges:
        count *= len(cut_d)
    if count < 2 or count > MAX_PIECES:
        return [(dom, True)]
    # A dim tied to a long reduction (a padded weight gradient's window column kw, tied to the
    # columns summed over: w + kw - 1 in 0:W) has its boundary values cut one by one, the last such
    # dim first, as far as MAX_PIECES allows: in a piece of several values the reduction's range
    # moves with the window's (kw <= w), and its vector loop has no constant trip count (AVX2,
    # 8x16x32x32, 32 filters 5x5 padded by 2: 5.8 -> 31 GFLOP/s).
    for at in reversed(long_ties):
        d, cut_d, mid = ranges[at]
        singles = [(v, v) for lo, hi in cut_d[:mid] for v in range(lo, hi + 1)]
        after = [(v, v) for lo, hi in cut_d[mid + 1:] for v in range(lo, hi + 1)]
        if count // len(cut_d) * (len(singles) + 1 + len(after)) <= MAX_PIECES:
            count = count // len(cut_d) * (len(singles) + 1 + len(after))
            ranges[at] = (d, [*singles, cut_d[mid], *after], len(singles))
    middles = [cut_d[mid] for _, cut_d, mid in ranges]
    out = []
    for combo in itertools.product(*(cut_d for _, cut_d, _ in ranges)):
        piece = dom
        for (d, _, _), (lo, hi) in zip(ranges, combo):
            piece = piece.lower_bound_val(isl.dim_type.set, d, _val(dom, lo))
            piece = piece.upper_bound_val(isl.dim_type.set, d, _val(dom, hi))
        if not piece.is_empty():
            out.append((piece, list(combo) == middles))
    return out


def _box(dom: isl.Set) -> list[tuple[int, int]] | None:
    """The bounding box of ``dom`` (its sizes fixed), or None when a bound is not a constant."""
    box = []
    for k in range(dom.dim(isl.dim_type.set)):
        try:
            lo, hi = dom.dim_min_val(k), dom.dim_max_val(k)
        except isl.Error:
            return None
        if not (lo.is_int() and hi.is_int()):
            return None
        box.append((lo.to_python(), hi.to_python()))
    return box


LONG_REDUCTION = 8  # a tied reduction longer than this is no window (see cut)


def _cut(dom: isl.Set, box: list[tuple[int, int]], cons: list[isl.Constraint], d: int,
         outer: int) -> tuple[list[tuple[int, int]], int, bool] | None:
    """The ranges of output dim ``d`` (below, interior, above; empty ones left out), the
    interior's position among them, and whether a reduction tied to ``d`` is longer than
    LONG_REDUCTION, when guards tie ``d`` to reduction dims alone; else None."""
    n = len(box)
    tied = []
    for c in cons:
        on = [k for k in range(n) if not c.get_coefficient_val(isl.dim_type.set, k).is_zero()]
        divs = any(not c.get_coefficient_val(isl.dim_type.div, j).is_zero()
                   for j in range(c.dim(isl.dim_type.div)))
        if divs or d not in on or any(k < outer and k != d for k in on) or all(k < outer for k in on):
            continue
        tied.append(c)
    if not tied:
        return None
    space = dom.get_space()
    whole = isl.Set.universe(space).intersect_params(dom.params())
    for k, (lo, hi) in enumerate(box):
        whole = whole.lower_bound_val(isl.dim_type.set, k, _val(dom, lo))
        whole = whole.upper_bound_val(isl.dim_type.set, k, _val(dom, hi))
    good = isl.BasicSet.universe(space)
    for c in tied:
        good = good.add_constraint(c)
    bad = whole.subtract(isl.Set.from_basic_set(good))
    if bad.is_empty():
        return None
    touched = bad.project_out(isl.dim_type.set, d + 1, n - d - 1).project_out(isl.dim_type.set, 0, d)
    lo, hi = box[d]
    line = _interval(touched.get_space(), dom, lo, hi)
    inner = line.subtract(touched)
    if inner.is_empty():
        return None
    a, b = inner.dim_min_val(0).to_python(), inner.dim_max_val(0).to_python()
    if not inner.is_equal(_interval(touched.get_space(), dom, a, b)):
        return None  # guards that leave holes inside: no single interior
    reductions = {k for c in tied for k in range(outer, n) if not c.get_coefficient_val(isl.dim_type.set, k).is_zero()}
    long = any(box[k][1] - box[k][0] + 1 > LONG_REDUCTION for k in reductions)
    return [(x, y) for x, y in ((lo, a - 1), (a, b), (b + 1, hi)) if x <= y], int(a > lo), long


def _interval(space: isl.Space, dom: isl.Set, lo: int, hi: int) -> isl.Set:
    line = isl.Set.universe(space).intersect_params(dom.params())
    return line.lower_bound_val(isl.dim_type.set, 0, _val(dom, lo)).upper_bound_val(isl.dim_type.set, 0, _val(dom, hi))


def _val(dom: isl.Set, v: int) -> isl.Val:
    return isl.Val.int_from_si(dom.get_ctx(), v)
