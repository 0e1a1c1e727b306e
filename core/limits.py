"""Size limits of a call: ``Instance`` -> nothing, or a located ``TcRangeError`` naming the size or range at fault.

Every shape, range and subscript value of a bound def must fit in int64 (the type the generated
code computes them in), and the tensors a call allocates must fit in this machine's memory;
both are checked before any backend allocates or runs anything.
"""

from __future__ import annotations

import functools
import os

from . import ast as A
from . import dtypes as T
from .affine import Sym, bounds
from .checked import CheckedDef, Tensor
from .errors import Location, TcRangeError
from .instance import Instance

INT64_MAX = 2**63 - 1


def check_instance(inst: Instance) -> None:
    """Shapes, ranges and subscripts of ``inst`` within int64."""
    checked = inst.checked
    for t in (*checked.outputs, *checked.temps):
        shape = inst.shapes[t.name]
        nbytes = _bytes(shape, t.dtype)
        if any(n > INT64_MAX for n in shape) or nbytes > INT64_MAX:
            raise TcRangeError(f"{_role(t)} '{t.name}' would have shape {shape} of {t.dtype}, {nbytes} bytes, past the "
                               f"int64 range of sizes{_origin(checked, t, shape)}", _where(checked, t, shape))
    consts = {k: Sym.of(v) for k, v in inst.sizes.items()}
    for bs in inst.stmts:
        s = bs.stmt
        for name, lo, hi in bs.ranges:
            if max(abs(lo), abs(hi)) > INT64_MAX:
                raise TcRangeError(f"index '{name}' of {s.describe()} ranges over {lo}:{hi}, past int64",
                                   _range_location(s.source, name))
        if any(hi <= lo for _, lo, hi in bs.ranges):
            continue
        box = {name: (Sym.of(lo), Sym.of(hi)) for name, lo, hi in bs.ranges}
        for acc in s.accesses:
            for d, sub in enumerate(acc.subs):
                if sub is not None and _magnitude(sub.subs(consts), box) > INT64_MAX:
                    raise TcRangeError(f"subscript {d} of '{acc.tensor}' ({sub}) in {s.describe()} reaches values "
                                       f"past int64 over the ranges " + ", ".join(f"{n} in {lo}:{hi}" for n, lo, hi
                                                                                 in bs.ranges),
                                       acc.span.location() or s.span.location())


def check_memory(inst: Instance, available: int | None = None) -> None:
    """The outputs and temporaries of a call fit in ``available`` bytes (default: this machine's
    physical memory)."""
    limit = physical_memory() if available is None else available
    if limit is None:
        return
    checked = inst.checked
    tensors = [*checked.outputs, *checked.temps]
    if sum(_bytes(inst.shapes[t.name], t.dtype) for t in tensors) <= limit:
        return
    total = 0
    for t in sorted(tensors, key=lambda t: -_bytes(inst.shapes[t.name], t.dtype)):
        shape = inst.shapes[t.name]
        nbytes = _bytes(shape, t.dtype)
        total += nbytes
        if total > limit:
            what = "" if nbytes == total else f" (with the other tensors of the call, {_human(total)})"
            raise TcRangeError(f"{_role(t)} '{t.name}' needs {nbytes} bytes ({_human(nbytes)}: shape {shape} of "
                               f"{t.dtype}){what}, more than this machine's {_human(limit)} of memory"
                               f"{_origin(checked, t, shape)}", _where(checked, t, shape))


@functools.cache
def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = T.np_dtype(dtype).itemsize
    for d in shape:
        n *= max(d, 0)
    return n


def _human(n: int) -> str:
    x = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if x < 1024 or unit == "EiB":
            return f"{x:.1f} {unit}" if unit != "bytes" else f"{n} bytes"
        x /= 1024
    return f"{n} bytes"


def _role(t: Tensor) -> str:
    return "output" if t.role == "output" else "temporary"


def _largest_dim(shape: tuple[int, ...]) -> int:
    return max(range(len(shape)), key=lambda k: shape[k]) if shape else 0


def _origin(checked: CheckedDef, t: Tensor, shape: tuple[int, ...]) -> str:
    """Where the largest dim of ``t`` comes from: its declaration or a statement's range."""
    if not shape:
        return ""
    k = _largest_dim(shape)
    s = _first_writer(checked, t.name)
    if s is None or _declared(checked, t.name) or k >= len(s.ranges):
        return f"; dim {k} is declared {t.dims[k]}" if k < len(t.dims) else ""
    r = s.ranges[k]
    return f"; its dim {k} is the range {r.lo}:{r.hi} of index '{r.name}' in {s.describe()}"


def _where(checked: CheckedDef, t: Tensor, shape: tuple[int, ...]) -> Location | None:
    s = _first_writer(checked, t.name)
    if s is None or _declared(checked, t.name) or not shape:
        return t.span.location()
    k = _largest_dim(shape)
    if k < len(s.ranges):
        return _range_location(s.source, s.ranges[k].name)
    return s.span.location()


def _range_location(stmt: A.Stmt, index: str) -> Location | None:
    """The ``where`` range of ``index`` in ``stmt`` if it has one, else the statement."""
    for w in stmt.wheres:
        if isinstance(w, A.WhereRange) and w.index.name == index:
            return w.span.location()
    return stmt.span.location()


def _first_writer(checked: CheckedDef, name: str):
    return next((s for s in checked.stmts if s.tensor == name), None)


def _declared(checked: CheckedDef, name: str) -> bool:
    return any(o.name.name == name and o.type is not None for o in checked.source.outputs)


def _magnitude(s: Sym, box: dict[str, tuple[Sym, Sym]]) -> int:
    """An upper bound of |every partial sum| when ``s`` is evaluated over ``box``."""
    total = abs(s.const)
    for atom, c in s.terms:
        lo, hi = bounds(Sym.of(atom), box)
        if not (lo.is_const() and hi.is_const()):
            return 0  # not concrete: nothing to check
        total += abs(c) * max(abs(lo.const), abs(hi.const))
    return total
