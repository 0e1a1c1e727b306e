"""Binding: ``CheckedDef`` + the call's arrays -> ``Instance`` (concrete sizes, ranges, shapes, guards).

Size symbols take their values from the input shapes (checked for consistency), every symbolic
range is evaluated, and each affine access that may leave its tensor at these sizes becomes a
guard: the statement runs only where all its guards hold (padding by domain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .affine import Sym, bounds
from .checked import CheckedDef, Statement
from .errors import TcArgumentError, TcRangeError


@dataclass(frozen=True)
class Guard:
    access: int  # position in Statement.accesses
    dim: int
    sub: Sym  # sizes substituted: indices only
    extent: int


@dataclass(frozen=True)
class BoundStmt:
    stmt: Statement
    ranges: tuple[tuple[str, int, int], ...]  # (index, lo, hi) in box order: lhs then reductions
    guards: tuple[Guard, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, hi - lo) for _, lo, hi in self.ranges)


@dataclass(frozen=True)
class Instance:
    checked: CheckedDef
    sizes: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    stmts: tuple[BoundStmt, ...]


def bind_sizes(checked: CheckedDef, shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    """Size-symbol values from the input shapes, with every literal dim and repeated symbol checked."""
    sizes: dict[str, int] = {}
    seen: dict[str, str] = {}
    for t, shape in zip(checked.inputs, shapes):
        if len(shape) != len(t.dims):
            raise TcArgumentError(f"'{t.name}' is declared with {len(t.dims)} dims but the argument has "
                                  f"{len(shape)} (shape {tuple(shape)})", t.span.location())
        for d, (dim, n) in enumerate(zip(t.dims, shape)):
            if dim.is_const():
                if dim.const != n:
                    raise TcArgumentError(f"dim {d} of '{t.name}' is declared {dim.const} but the argument has {n}",
                                          t.span.location())
                continue
            name = str(dim)
            if name in sizes and sizes[name] != n:
                raise TcArgumentError(f"size symbol {name}: {seen[name]} but '{t.name}' has {n} in dim {d}",
                                      t.span.location())
            sizes.setdefault(name, int(n))
            seen.setdefault(name, f"'{t.name}' has {n} in dim {d}")
    return sizes


def instantiate(checked: CheckedDef, sizes: dict[str, int]) -> Instance:
    consts = {k: Sym.of(v) for k, v in sizes.items()}
    shapes: dict[str, tuple[int, ...]] = {}
    for t in (*checked.inputs, *checked.outputs, *checked.temps):
        shapes[t.name] = tuple(int(d.eval(sizes)) for d in t.dims)
        for d, (dim, n) in enumerate(zip(t.dims, shapes[t.name])):
            if n < 0:
                raise TcRangeError(f"dim {d} of '{t.name}' is {dim} = {n} for these sizes ({_show(sizes)}), a negative "
                                   f"extent", t.span.location())
    stmts = []
    for s in checked.stmts:
        ranges = tuple((r.name, int(r.lo.eval(sizes)), int(r.hi.eval(sizes))) for r in s.ranges)
        target = shapes[s.tensor]
        for (name, lo, hi), extent in zip(ranges, target):
            if hi > extent and hi > lo:
                raise TcRangeError(f"index '{name}' of {s.describe()} ranges over {lo}:{hi}, past the size {extent} "
                                   f"of '{s.tensor}' ({_show(sizes)})", s.span.location())
        stmts.append(BoundStmt(s, ranges, _guards(s, ranges, shapes, consts)))
    return Instance(checked, dict(sizes), shapes, tuple(stmts))


def _guards(s: Statement, ranges: tuple[tuple[str, int, int], ...], shapes: dict[str, tuple[int, ...]],
            consts: dict[str, Sym]) -> tuple[Guard, ...]:
    if any(hi <= lo for _, lo, hi in ranges):
        return ()
    box = {name: (Sym.of(lo), Sym.of(hi)) for name, lo, hi in ranges}
    out = []
    for k, acc in enumerate(s.accesses):
        if acc.kind == "cond":
            continue
        for d, sub in enumerate(acc.subs):
            if sub is None:
                continue
            concrete = sub.subs(consts)
            extent = shapes[acc.tensor][d]
            lo, hi = bounds(concrete, box)
            if lo.is_const() and hi.is_const() and lo.const >= 0 and hi.const < extent:
                continue
            out.append(Guard(k, d, concrete, extent))
    return tuple(out)


def accumulate_error(checked: CheckedDef) -> TcArgumentError:
    """The error for a call without ``out=`` to a def that updates an output in place."""
    name = checked.accumulates[0]
    s = next(s for s in checked.stmts if s.tensor == name)
    return TcArgumentError(f"{checked.name}(): statement {s.number} reduces into the output '{name}' with "
                           f"'{s.source.op}' (no '!'), which updates the caller's '{name}' in place: pass it as "
                           f"out= to update it, or write '{s.source.op}!' to start from the identity",
                           s.span.location())


def _first_writer(inst: Instance, tensor: str) -> tuple[BoundStmt, bool] | None:
    """The first statement that writes ``tensor``, and whether it reads it too; None where a
    statement reads it before any writes it, or none writes it."""
    for bs in inst.stmts:
        reads_it = any(a.tensor == tensor for a in bs.stmt.accesses)
        if bs.stmt.tensor == tensor:
            return bs, reads_it
        if reads_it:
            return None
    return None


def _writes_its_box(bs: BoundStmt, reads_it: bool) -> bool:
    """Whether a statement writes every point of its left side's ranges: an initialisation ``!``,
    or ``=`` without guards, that does not read what it writes."""
    s = bs.stmt
    return not reads_it and (s.init or (s.op == "=" and not bs.guards))


def fully_written(inst: Instance, tensor: str) -> bool:
    """Whether some statement writes every element of ``tensor`` before anything reads it: the
    first statement that writes it initialises it (``!``) or assigns it over its whole shape
    without guards. Such a tensor needs no zero-filling."""
    first = _first_writer(inst, tensor)
    if first is None:
        return False
    bs, reads_it = first
    lhs = bs.ranges[: len(bs.stmt.lhs)]
    covers = tuple(hi for _, _, hi in lhs) == inst.shapes[tensor] and all(lo == 0 for _, lo, _ in lhs)
    return covers and _writes_its_box(bs, reads_it)


Regions = tuple[tuple[slice, ...], ...]


def unwritten(inst: Instance, tensor: str) -> Regions | None:
    """The parts of ``tensor`` that no statement writes before anything reads it, to zero-fill:
    none when it is ``fully_written``; the slabs around the box its first writer covers whole (an
    initialisation ``!``, or ``=`` without guards, from ``lo`` to ``hi`` in each dimension: a
    left-side range ``i in 1:N + 1`` leaves ``O(0)``); None where the whole tensor needs zeros."""
    if fully_written(inst, tensor):
        return ()
    first = _first_writer(inst, tensor)
    if first is None or not _writes_its_box(*first):
        return None
    shape = inst.shapes[tensor]
    box = [(lo, hi) for _, lo, hi in first[0].ranges[: len(first[0].stmt.lhs)]]
    if len(box) != len(shape) or not all(0 <= lo <= hi <= n for (lo, hi), n in zip(box, shape)):
        return None
    out: list[tuple[slice, ...]] = []
    for d, ((lo, hi), n) in enumerate(zip(box, shape)):
        if lo > 0:
            out.append((slice(None),) * d + (slice(0, lo),))
        if hi < n:
            out.append((slice(None),) * d + (slice(hi, n),))
    return tuple(out)


def _show(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())
