"""Vector register tiles, printed: ``VectorTile -> C text``, a tile planned by codegen.vecplan
written in the target's explicit vectors (codegen.vecisa: AVX-512, AVX2, SSE2, NEON or generic
vector extensions), one vector accumulator per vector of each row.

Each input vector of one step of the serial loops is loaded once into a register and used by
every row of the tile, and a value that does not move along the row is broadcast once.
Auto-vectorised, the same tile has GCC fold each load into every multiply-add that uses it again
(one load per FMA, most of them across a cache line): conv2d's 4x54 tile ran at a third of one
core's FMA peak that way and at 80 % this way.

A float tile whose target row is not contiguous (the boundary columns polyhedral.split cuts
from a padded conv, run along the image's height) gathers its target and its reads along the row
(``tc_v?_gather``: the ISA's gather with 32-bit offsets on AVX2 and AVX-512) and scatters the
target back once, after the serial loops. Where the target's elements are neighbours along another
tile loop (a conv in vectors of its filters: each filter's output columns), the accumulators along
that loop are stored side by side, each lane's row at once (``tc_v?_scatter_rows``: an 8x8
transpose per 8 lanes on AVX2 and AVX-512): a 46x46 conv's 6x64 tiles ran 1-2 % faster than with
a store per element.

The vector text sits under ``#if TC_VEC`` beside the scalar tile, for compilers without the ISA.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Binop, TExpr
from tcdsl.polyhedral.loopir import LExpr, LFor, LInt, LOp, LTile, LVar, trip_count

from .cexpr import ExprEmitter
from .vecexpr import substitute, syms, vexpr
from .vecisa import half_type, vector_type
from .vecplan import VectorTile, init_value
from .writer import LineWriter, unparen


def emit(em: ExprEmitter, vt: VectorTile, identity_start: bool, shift: LExpr | None = None,
         first_chunk: str | None = None) -> None:
    """The tile in vectors: accumulators set (to the identity, or loaded from the target; with
    ``first_chunk``, a C condition, to the identity where it holds and loaded elsewhere), the serial loops
    around one unrolled step of every accumulator, then the stores; with ``shift``, the vector loop
    starts there (``VectorTile.shift``)."""
    rt, s, w = vt.rt, vt.stmt, em.w
    st = em.scop.stmt(rt.call.stmt)
    args = dict(zip(st.indices, rt.call.args))
    outer, vec = rt.inner[:-1], rt.inner[-1]
    combos = list(itertools.product(*(range(e) for e in rt.extents[:-1])))
    tiles = [(combo, start) for combo in combos for start in vt.starts]
    acc = {key: f"a{k}" for k, key in enumerate(tiles)}

    def env_at(combo: tuple[int, ...], start: int) -> dict[str, str]:
        values: dict[str, int | LExpr] = {f.var: init_value(f) + k for f, k in zip(outer, combo)}
        values[vec.var] = init_value(vec) + start if shift is None else LOp("+", (shift, LInt(start)))
        env = {name: f"({em._lexpr(substitute(a, values))})" for name, a in args.items()}
        return env

    def target(combo: tuple[int, ...], start: int) -> str:
        return em._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env_at(combo, start))

    v = vector_type(s.rhs.dtype)
    hv = half_type(s.rhs.dtype) if vt.half else v
    halves = {key for key in tiles if vt.is_half(key[1])}

    def vtype(key: tuple[tuple[int, ...], int]) -> str:
        return hv if key in halves else v

    starts = vt.starts
    overlap = " (the last overlapping the one before)" if len(starts) > 1 and starts[-1] < starts[-2] + vt.width else ""
    if vt.narrow:
        w.line(f"// in {len(starts)} half vectors of {vt.lanes // 2} per row{overlap}")
    elif vt.half:
        w.line(f"// in {len(starts) - 1} vectors of {vt.lanes} and one of {vt.lanes // 2} per row{overlap}")
    else:
        w.line(f"// in {len(starts)} vectors of {vt.lanes} per row{overlap}")
    identity = {"+": "_zero()", "*": "_set1(1)", "max": "_set1(-INFINITY)", "min": "_set1(INFINITY)"}[s.op]

    def load(key: tuple[tuple[int, ...], int]) -> str:
        at = target(*key)
        return f"{vtype(key)}_load(&{at})" if vt.stride == 1 else f"{v}_gather(&{at}, {vt.stride})"

    if first_chunk is not None and not identity_start:  # the reduction's first chunk, or a later one
        for key in tiles:
            w.line(f"{vtype(key)} {acc[key]};")
        w.line(f"if ({first_chunk}) {{")
        with w.indent():
            for key in tiles:
                w.line(f"{acc[key]} = {vtype(key)}{identity};")
        w.line("} else {")
        with w.indent():
            for key in tiles:
                w.line(f"{acc[key]} = {load(key)};")
        w.line("}")
    else:
        for key in tiles:
            value = vtype(key) + identity if identity_start else load(key)
            w.line(f"{vtype(key)} {acc[key]} = {value};")
    if vt.fetch_target:  # the address of each vector's first lane (integers: no pointer is formed past the end)
        firsts = ", ".join(f"(uintptr_t)&{target(*key)}" for key in tiles)
        w.line(f"const uintptr_t tc_ft[{len(tiles)}] = {{{firsts}}};")
    for k, loop in enumerate(rt.serial):
        if loop.var in vt.rolled:
            w.line("#pragma GCC unroll 1")
        w.line(f"for (long {loop.var} = {em._lexpr(loop.init)}; {unparen(em._lexpr(loop.cond))}; "
               f"{loop.var} += {loop.step}) {{")
        w.push()
        if k == 0 and vt.ahead is not None:
            _prefetch(em, vt, args, outer, vec, shift)
        if k == 0 and vt.fetch_target:
            _fetch_target(em, vt, loop, len(tiles))
    loads: dict[str, str] = {}
    updates = []
    for combo, start in tiles:
        key = (combo, start)
        env = env_at(combo, start)

        def vx(e: TExpr, env: dict[str, str] = env, lane: int = start, half: bool = key in halves) -> str:
            return vexpr(em, e, env, s, vt.row, loads, lane, half)

        if s.op in ("max", "min"):  # as the scalar tc_max/tc_min: NaN-propagating, ties to the new value
            updates.append(f"{acc[key]} = {v}_{s.op}({acc[key]}, {vx(s.rhs)});")
        elif s.op == "*":
            updates.append(f"{acc[key]} = {acc[key]} * {vx(s.rhs)};")
        elif isinstance(s.rhs, Binop) and s.rhs.op == "*":
            updates.append(f"{acc[key]} = {vtype(key)}_fma({vx(s.rhs.lhs)}, {vx(s.rhs.rhs)}, {acc[key]});")
        else:
            updates.append(f"{acc[key]} = {acc[key]} + {vx(s.rhs)};")
    # the smaller set of operands first, kept in registers, and the other just before its first
    # use, so that a tile using all but a few registers (AVX2's 12 of 16) holds one of those at a
    # time: matmul's 6x16 tile keeps its 2 row vectors and takes the 6 broadcasts in turn, a conv
    # tile of 2 channels x 6 rows keeps the 2 broadcasts and takes the 6 row vectors in turn
    # (accumulators are independent: their order changes no result)
    vectors = [name for text, name in loads.items() if "_load(" in text or "_gather(" in text]
    first = vectors
    if len(loads) - len(vectors) < len(vectors):
        first = [name for name in loads.values() if name not in vectors]
        rank = {name: i for i, name in enumerate(vectors)}
        updates.sort(key=lambda line: min((rank[n] for n in re.findall(r"\bv\d+\b", line) if n in rank), default=0))
    for text, name in loads.items():
        if name in first:
            w.line(f"{hv if text.startswith(hv + '_') else v} {name} = {text};")
    for name in first:
        w.line(f"tc_keep({name});")
    pending = {name: text for text, name in loads.items() if name not in first}
    for line in updates:
        for name in re.findall(r"\b[bv]\d+\b", line):
            if name in pending:
                text = pending.pop(name)
                w.line(f"{hv if text.startswith(hv + '_') else v} {name} = {text};")
                if name in vectors:
                    w.line(f"tc_keep({name});")
        w.line(line)
    for _ in rt.serial:
        w.pop()
        w.line("}")
    if vt.across is not None:
        _store_rows(w, vt, tiles, acc, target, v)
        return
    for key in tiles:
        if vt.stride == 1:
            w.line(f"{vtype(key)}_store(&{target(*key)}, {acc[key]});")
        else:
            w.line(f"{v}_scatter(&{target(*key)}, {vt.stride}, {acc[key]});")


ROWS_AT_ONCE = 8  # tc_v?_scatter_rows: at most 8 vectors side by side (codegen.vecisa)


def _store_rows(w: LineWriter, vt: VectorTile, tiles: list[tuple[tuple[int, ...], int]],
                acc: dict[tuple[tuple[int, ...], int], str], target: Callable[[tuple[int, ...], int], str],
                v: str) -> None:
    """A scattered tile's stores, the accumulators that are neighbours along ``vt.across`` side by
    side, up to ROWS_AT_ONCE at a time (one left alone is scattered)."""
    assert vt.across is not None
    d = vt.across
    groups: dict[tuple[tuple[int, ...], int], list[tuple[tuple[int, ...], int]]] = {}
    for combo, start in tiles:
        groups.setdefault((combo[:d] + combo[d + 1:], start), []).append((combo, start))
    for keys in groups.values():
        keys.sort(key=lambda key: key[0][d])
        for at in range(0, len(keys), ROWS_AT_ONCE):
            part = keys[at:at + ROWS_AT_ONCE]
            if len(part) == 1:  # a row of one: the transpose would only add shuffles
                w.line(f"{v}_scatter(&{target(*part[0])}, {vt.stride}, {acc[part[0]]});")
                continue
            names = ", ".join(acc[key] for key in part)
            w.line(f"{v}_scatter_rows(&{target(*part[0])}, {vt.stride}, {len(part)}, ({v}[]){{{names}}});")


def _fetch_target(em: ExprEmitter, vt: VectorTile, loop: LFor, vectors: int) -> None:
    """At a step of the outermost serial loop, the next ``vt.fetch_target`` lines of the scattered
    target, fetched for writing: lane ``j % lanes`` of vector ``j / lanes``, ``j`` counting on from
    the lines earlier steps fetched (see vecplan._fetch_target)."""
    step = f"(({loop.var} - {em._lexpr(loop.init)}) / {loop.step})"
    q, lanes = vt.fetch_target, vt.lanes
    nbytes = vt.stride * em._itemsize(vt.stmt.tensor)
    em.w.line(f"for (long tc_j = {step} * {q}; tc_j < {step} * {q} + {q} && tc_j < {vectors * lanes}; tc_j++)")
    lane = f"(uintptr_t)(tc_j % {lanes}) * {nbytes}"
    em.w.line(f"  __builtin_prefetch((const void *)(tc_ft[tc_j / {lanes}] + {lane}), 1);")


def _prefetch(em: ExprEmitter, vt: VectorTile, args: dict[str, LExpr], outer: tuple[LFor, ...], vec: LFor,
              shift: LExpr | None) -> None:
    """At a step of the tile's outermost serial loop, the lines of its sliding reads that the next
    tile along ``vt.ahead``'s loop reads first: the loop one step on, the inner serial loops at
    their last values, the tile's first row at each vector's start."""
    assert vt.ahead is not None
    around, sliding = vt.ahead
    fixed: dict[str, int | LExpr] = {f.var: init_value(f) for f in outer}
    fixed[around.var] = LOp("+", (LVar(around.var), LInt(around.step)))
    for g in vt.rt.serial[1:]:
        trips = trip_count(g)
        assert trips is not None  # _ahead
        fixed[g.var] = init_value(g) + (trips - 1) * g.step
    seen: set[str] = set()
    for start in vt.starts:
        values = {**fixed, vec.var: init_value(vec) + start if shift is None else LOp("+", (shift, LInt(start)))}
        env = {name: f"({em._lexpr(substitute(a, values))})" for name, a in args.items()}
        for r in sliding:
            at = em._access(r.tensor, syms(r), env)
            if at not in seen:  # an address past the tensor's end (the last tile's next) is never formed
                seen.add(at)
                base, index = at.split("[", 1)
                em.w.line(f"__builtin_prefetch((const void *)((uintptr_t){base} + sizeof(*{base}) * ({index[:-1]})));")


def cases(vt: VectorTile) -> list[tuple[tuple[LExpr, ...], VectorTile, LExpr | None, str]]:
    """The vector forms of a tile with partial loops, in the order they are tested: (the tests,
    the tile, where its vector loop starts if shifted, a comment); the scalar tile takes the rest."""
    out: list[tuple[tuple[LExpr, ...], VectorTile, LExpr | None, str]] = [(vt.full, vt, None, "")]
    if vt.shift is not None and vt.shift_ok is not None:
        out.append(((vt.shift_ok,), vt, vt.shift, f"  // the row's last {vt.rt.extents[-1]}"))
    for test, rest in vt.rests:
        out.append(((test, *rest.full), rest, None, _cut_note(vt.rt, rest.rt)))
        if rest.shift is not None and rest.shift_ok is not None:
            rows = "x".join(map(str, rest.rt.extents[:-1]))
            last = f"  // {rows} rows, the row's last {rest.rt.extents[-1]}"
            out.append(((test, rest.shift_ok), rest, rest.shift, last))
        for test2, both in rest.rests:  # rows cut short whose row is cut short too
            out.append(((test, test2, *both.full), both, None, _cut_note(vt.rt, both.rt)))
    return out


def scalar_cases(vt: VectorTile) -> list[tuple[tuple[LExpr, ...], LTile, str]]:
    """The sizes of a tile with partial loops that take the scalar tile with constant bounds
    (``VectorTile.scalar_rests``, those of its tiles of fewer rows first), tested after ``cases``:
    (the tests, the tile cut to that size, a comment)."""
    out = [((test, test2), cut, _cut_note(vt.rt, cut) + ", in scalars")
           for test, rest in vt.rests for test2, cut in rest.scalar_rests]
    return out + [((test,), cut, _cut_note(vt.rt, cut) + ", in scalars") for test, cut in vt.scalar_rests]


def _cut_note(whole: LTile, cut: LTile) -> str:
    """The comment on the case of ``whole`` cut short to ``cut``: across its rows, along its row, or both."""
    rows = "x".join(map(str, cut.extents[:-1]))
    if cut.extents[-1] == whole.extents[-1]:
        return f"  // {rows} rows"
    if cut.extents[:-1] == whole.extents[:-1]:
        return f"  // the row's last {cut.extents[-1]}"
    return f"  // {rows} rows, the row's last {cut.extents[-1]}"
