"""Reference interpreter: runs an ``Instance`` on numpy arrays (``Instance x inputs -> outputs``).

A statement runs on the points of its domain only: its ``where`` box is narrowed to where the
affine in-bounds guards can hold (interval reasoning over the subscripts, repeated to a fixpoint:
exact for single-index subscripts, a box around the domain otherwise), then split into chunks of
at most ``CHUNK`` points, each narrowed again, so the cost follows the points that run, not the
box. A chunk is evaluated with numpy term by term: each operation in the written order and rounded
in its type, as the generated code does; the guards still open in the chunk mask what they exclude.
A contraction (a sum of products of affine reads) goes to ``np.einsum`` on strided views instead
only when its data are finite and small enough that no grouping of its products and sums can
overflow: einsum and term-by-term evaluation then differ by rounding alone. Semantics are the
language's: identity initialisation for ``!``, statements in order, padding by domain,
bounds-checked gathers, C conversions, and floor ``/`` and ``%`` on integers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .core import dtypes as T
from .core.affine import FloorDiv, Sym, Var, bounds
from .core.builtins import BUILTINS
from .core.checked import Binop, Call, Const, Convert, IndexVal, Read, Select, SizeVal, Statement, TExpr, Unop, reads
from .core.errors import TcRangeError, TcRuntimeError
from .core.instance import BoundStmt, Guard, Instance

CHUNK = 1 << 21
ROUNDS = 64  # narrowing passes over the guards per box (each pass only shrinks it; a cap for slow fixpoints)
_REDUCE = {"+": np.add, "*": np.multiply, "min": np.minimum, "max": np.maximum}

Box = tuple[tuple[str, int, int], ...]  # (index, lo, hi) half-open, in box order: lhs then reductions


def run(inst: Instance, inputs: dict[str, np.ndarray],
        initial: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Execute every statement; returns the outputs by name (fresh C-contiguous arrays). The
    outputs in ``initial`` start from a copy of its values (``CheckedDef.accumulates``), the
    others from 0."""
    arrays: dict[str, np.ndarray] = {k: np.asarray(v, order="C") for k, v in inputs.items()}  # rank 0 stays 0
    c = inst.checked
    for t in (*c.outputs, *c.temps):
        start = (initial or {}).get(t.name)
        arrays[t.name] = np.zeros(inst.shapes[t.name], dtype=t.dtype) if start is None else \
            np.array(start, dtype=t.dtype, order="C")
    with np.errstate(all="ignore"):
        for bs in inst.stmts:
            _statement(bs, arrays, inst.sizes)
    return {t.name: arrays[t.name] for t in c.outputs}


def _statement(bs: BoundStmt, arrays: dict[str, np.ndarray], sizes: dict[str, int]) -> None:
    s = bs.stmt
    out = arrays[s.tensor]
    if s.init:
        out[_region(bs.ranges[: len(s.lhs)])] = T.identity(s.op, out.dtype.name)
    if 0 in bs.shape:
        return
    box = _narrow(bs.ranges, bs.guards)
    if box is None:
        return
    _check_index_width(bs, box)
    if s.op == "+" and not _live(bs.guards, box) and _einsum(bs, box, arrays, sizes, out):
        return
    for chunk, guards in _chunks(box, bs.guards):
        _chunk(bs, chunk, guards, arrays, sizes, out)


def _check_index_width(bs: BoundStmt, box: Box) -> None:
    """Indices are 64-bit integers, as in the generated code: a range reaching past them is an error."""
    top = int(np.iinfo(np.int64).max)
    for name, lo, hi in box:
        if lo < -top or hi > top:
            raise TcRangeError(f"index '{name}' of {bs.stmt.describe()} ranges over {lo}:{hi}, outside the 64-bit "
                               f"integer range of indices", bs.stmt.span.location())


def _region(box: Box) -> tuple[slice, ...]:
    """The slices of ``box`` (its ranges never start below 0)."""
    return tuple(slice(max(lo, 0), max(hi, 0)) for _, lo, hi in box)


def _view_of(out: np.ndarray, region: tuple[slice, ...]) -> np.ndarray:
    """A writable view of ``out[region]`` (for a rank-0 ``out``, ``out`` itself)."""
    return out[region] if region else out


# ---- the domain: narrowing the box to where the guards can hold ------------------------------------


def _narrow(box: Box, guards: tuple[Guard, ...]) -> Box | None:
    """The sub-box of ``box`` that keeps every point where all ``guards`` hold (``0 <= sub <
    extent``), found by interval reasoning repeated until nothing changes; None when no point can
    satisfy them. Exact when each subscript has one index; otherwise a box around the domain."""
    cur = {name: (lo, hi) for name, lo, hi in box}
    for _ in range(ROUNDS):
        before = dict(cur)
        for g in guards:
            if not _constrain(g.sub, 0, g.extent - 1, cur):
                return None
        if cur == before:
            break
    return tuple((name, *cur[name]) for name, _, _ in box)


def _constrain(s: Sym, lo: int, hi: int, cur: dict[str, tuple[int, int]]) -> bool:
    """Shrink the ranges in ``cur`` to those points that may have ``lo <= s <= hi``: each term's
    atom is bounded by what the rest of ``s`` can reach; an index atom's range is cut to that, a
    floor division passes the bound on to its numerator. False when no point is left."""
    if not s.terms:
        return lo <= s.const <= hi
    for atom, c in s.terms:
        rlo, rhi = bounds(s.without(atom), _syms(cur))
        if not (rlo.is_const() and rhi.is_const()):
            continue
        alo, ahi = _solve(lo - rhi.const, hi - rlo.const, c)  # lo - rhi <= c * atom <= hi - rlo
        if alo > ahi:
            return False
        if isinstance(atom, Var) and atom.name in cur:
            a, b = cur[atom.name]
            a, b = max(a, alo), min(b, ahi + 1)
            if a >= b:
                return False
            cur[atom.name] = (a, b)
        elif isinstance(atom, FloorDiv) and not _constrain(atom.num, alo * atom.den, ahi * atom.den + atom.den - 1,
                                                           cur):
            return False
    return True


def _solve(lo: int, hi: int, c: int) -> tuple[int, int]:
    """The integers ``x`` with ``lo <= c * x <= hi`` (``c != 0``), as an inclusive range."""
    if c < 0:
        lo, hi, c = -hi, -lo, -c
    return -(-lo // c), hi // c


def _syms(cur: dict[str, tuple[int, int]]) -> dict[str, tuple[Sym, Sym]]:
    """Ranges as ``affine.bounds`` takes them."""
    return {name: (Sym.of(lo), Sym.of(hi)) for name, (lo, hi) in cur.items()}


def _live(guards: tuple[Guard, ...], box: Box) -> tuple[Guard, ...]:
    """The guards that may fail somewhere in ``box`` (the others hold at every point of it)."""
    ranges = _syms({name: (lo, hi) for name, lo, hi in box})
    out = []
    for g in guards:
        lo, hi = bounds(g.sub, ranges)
        if not (lo.is_const() and hi.is_const() and lo.const >= 0 and hi.const < g.extent):
            out.append(g)
    return tuple(out)


def _chunks(box: Box, guards: tuple[Guard, ...]) -> Iterator[tuple[Box, tuple[Guard, ...]]]:
    """Sub-boxes of at most ``CHUNK`` points covering the domain in ``box``, each narrowed to its
    guards and paired with the guards that may still fail in it; boxes without points are dropped."""
    stack = [box]
    while stack:
        b = _narrow(stack.pop(), guards)
        if b is None:
            continue
        if math.prod(hi - lo for _, lo, hi in b) <= CHUNK:
            yield b, _live(guards, b)
            continue
        k = next(i for i, (_, lo, hi) in enumerate(b) if hi - lo > 1)
        name, lo, hi = b[k]
        mid = (lo + hi) // 2
        stack.append((*b[:k], (name, mid, hi), *b[k + 1:]))
        stack.append((*b[:k], (name, lo, mid), *b[k + 1:]))


# ---- one chunk, term by term ---------------------------------------------------------------------


def _chunk(bs: BoundStmt, chunk: Box, guards: tuple[Guard, ...], arrays: dict[str, np.ndarray],
           sizes: dict[str, int], out: np.ndarray) -> None:
    s = bs.stmt
    n = len(chunk)
    env: dict[str, Any] = dict(sizes)
    for axis, (name, lo, hi) in enumerate(chunk):
        axis_shape = [1] * n
        axis_shape[axis] = hi - lo
        env[name] = np.arange(lo, hi, dtype=np.int64).reshape(axis_shape)
    mask = None
    for g in guards:
        v = g.sub.eval(env)
        ok = (v >= 0) & (v < g.extent)
        mask = ok if mask is None else mask & ok
    ev = _Eval(bs, arrays, env, clip=bool(guards))
    shape = tuple(hi - lo for _, lo, hi in chunk)
    vals = np.broadcast_to(ev.value(s.rhs, mask).astype(out.dtype, copy=False), shape)
    nl = len(s.lhs)
    target = _view_of(out, _region(chunk[:nl]))
    if s.op == "=":
        np.copyto(target, vals, where=True if mask is None else np.broadcast_to(mask, shape))
        return
    uf = _REDUCE[s.op]
    if mask is not None:
        vals = np.where(mask, vals, np.asarray(T.identity(s.op, out.dtype.name), dtype=out.dtype))
    if s.op == "*" and n > nl and T.is_float(out.dtype.name):
        # a product folds into the value already there term by term, as the compiled loops do
        # (forming the terms' product first can overflow where the running value does not)
        terms = np.concatenate([target[..., None], vals.reshape(vals.shape[:nl] + (-1,))], axis=-1)
        target[...] = np.multiply.reduce(terms, axis=-1, dtype=out.dtype)
        return
    # in the target's type: integer sums and products wrap as the compiled code's do
    part = uf.reduce(vals, axis=tuple(range(nl, n)), dtype=out.dtype) if n > nl else vals
    target[...] = uf(target, part, dtype=out.dtype)


class _Eval:
    def __init__(self, bs: BoundStmt, arrays: dict[str, np.ndarray], env: dict[str, Any], clip: bool) -> None:
        self.bs = bs
        self.arrays = arrays
        self.env = env
        self.clip = clip

    def value(self, e: TExpr, live: Any) -> Any:
        r = self._value(e, live)
        return r.astype(e.dtype, copy=False) if isinstance(r, np.ndarray) else np.asarray(r, dtype=e.dtype)

    def _value(self, e: TExpr, live: Any) -> Any:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=e.dtype)
        if isinstance(e, IndexVal):
            return self.env[e.name].astype(e.dtype)
        if isinstance(e, SizeVal):
            return np.asarray(self.env[e.name], dtype=e.dtype)
        if isinstance(e, Read):
            return self._read(e, live)
        if isinstance(e, Convert):
            return np.asarray(self.value(e.arg, live)).astype(e.dtype)
        if isinstance(e, Unop):
            a = self.value(e.arg, live)
            return np.logical_not(a) if e.op == "!" else np.negative(a)
        if isinstance(e, Select):
            c = self.value(e.cond, live)
            a = self.value(e.then, _and(live, c))
            b = self.value(e.other, _and(live, np.logical_not(c)))
            return np.where(c, a, b)
        if isinstance(e, Binop):
            return self._binop(e, live)
        if isinstance(e, Call):
            return _call(e.fn, [self.value(a, live) for a in e.args], e.dtype)
        raise TypeError(e)

    def _binop(self, e: Binop, live: Any) -> Any:
        a = self.value(e.lhs, live)
        if e.op == "&&":
            return np.logical_and(a, self.value(e.rhs, _and(live, a)))
        if e.op == "||":
            return np.logical_or(a, self.value(e.rhs, _and(live, np.logical_not(a))))
        b = self.value(e.rhs, live)
        op = e.op
        if op in ("/", "%") and T.is_int(e.lhs.dtype):
            zero = b == 0
            hit = _and(live, zero)
            if np.any(hit):
                raise TcRuntimeError(f"integer {'division' if op == '/' else 'modulo'} by zero in "
                                     f"{self.bs.stmt.describe()}", e.span.location())
            b = np.where(zero, np.ones((), dtype=b.dtype), b)
            return np.floor_divide(a, b) if op == "/" else np.mod(a, b)
        return _BINARY[op](a, b)

    def _read(self, e: Read, live: Any) -> Any:
        arr = self.arrays[e.tensor]
        if not e.subs:
            return arr[()]
        idx = []
        for d, sub in enumerate(e.subs):
            extent = arr.shape[d]
            if isinstance(sub, Sym):
                v = sub.eval(self.env)
                if e.conditional:
                    self._check(e, d, np.asarray(v), extent, live, "read")
                if self.clip or e.conditional:
                    v = np.clip(v, 0, max(extent - 1, 0))
            else:
                v = np.asarray(self.value(sub, live), dtype=np.int64)
                self._check(e, d, v, extent, live, "gather" if reads(sub) else "read")
                v = np.clip(v, 0, max(extent - 1, 0))
            idx.append(v)
        if arr.size == 0:  # no point reads it (checked above, or masked off): the value is never used
            return np.zeros(np.broadcast_shapes(*(np.shape(v) for v in idx)), dtype=arr.dtype)
        return arr[tuple(idx)]


    def _check(self, e: Read, d: int, v: np.ndarray, extent: int, live: Any, what: str) -> None:
        hit = _and(live, (v < 0) | (v >= extent))
        if np.any(hit):
            value = int(np.broadcast_to(v, np.broadcast_shapes(v.shape, np.shape(hit)))[hit][0])
            raise TcRuntimeError(f"{what} out of range in {self.bs.stmt.describe()}: dim {d} of '{e.tensor}' is "
                                 f"read at {value}, outside 0:{extent}", e.span.location())


def _and(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return np.logical_and(a, b)


_BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "%": np.fmod,
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
    ">=": np.greater_equal,
}


def _call(fn: str, args: list[Any], dtype: str) -> Any:
    return np.asarray(BUILTINS[fn].numpy(*args)).astype(dtype, copy=False)


# ---- contraction fast path ---------------------------------------------------------------------


def _einsum(bs: BoundStmt, box: Box, arrays: dict[str, np.ndarray], sizes: dict[str, int],
            out: np.ndarray) -> bool:
    """``out[box] += sum of a product of affine reads`` through einsum on strided views; False when
    the statement is not such a contraction or its data are not ``_tame``."""
    dtype = out.dtype.name
    plan = _contraction(bs, box, arrays, sizes, dtype)
    if plan is None:
        return False
    spec, ops, scale = plan
    res = np.einsum(spec, *ops, optimize=True)
    if scale != 1.0:
        res = res * np.asarray(scale, dtype=dtype)
    target = _view_of(out, _region(box[: len(bs.stmt.lhs)]))
    target += res.astype(dtype, copy=False)
    return True


def _contraction(bs: BoundStmt, box: Box, arrays: dict[str, np.ndarray], sizes: dict[str, int],
                 dtype: str) -> tuple[str, list[np.ndarray], float] | None:
    """The einsum subscripts, the operands (views) and the product of the constant factors of a
    tame contraction over ``box``; None for any other statement."""
    s = bs.stmt
    factors: list[TExpr] = []
    if not _product(s.rhs, factors) or len(box) > 26:
        return None
    rs = reads(s.rhs)
    if len(rs) != len([f for f in factors if isinstance(f, Read)]) or len(rs) > 8:
        return None
    letters = {name: chr(ord("a") + i) for i, (name, _, _) in enumerate(box)}
    lo = {name: lo for name, lo, _ in box}
    ext = {name: hi - lo for name, lo, hi in box}
    consts = {k: Sym.of(v) for k, v in sizes.items()}
    ops: list[np.ndarray] = []
    specs: list[str] = []
    scale = 1.0
    for f in factors:
        if isinstance(f, Const):
            scale *= float(f.value)
            continue
        assert isinstance(f, Read)
        view = _view(arrays[f.tensor], f, lo, ext, consts) if f.dtype == dtype else None
        if view is None:
            return None
        ops.append(view[0])
        specs.append("".join(letters[a] for a in view[1]))
    used = set("".join(specs))
    out_spec = "".join(letters[i] for i in s.lhs)
    if not ops or not set(out_spec) <= used or len(used) != len(box):
        return None
    terms = math.prod(ext[name] for name in ext if name not in s.lhs)
    if not _tame(factors, arrays, scale, terms, dtype):
        return None
    return ",".join(specs) + "->" + out_spec, ops, scale


def _tame(factors: list[TExpr], arrays: dict[str, np.ndarray], scale: float, terms: int, dtype: str) -> bool:
    """Whether every grouping of the contraction gives the same non-finite values as term-by-term
    evaluation (products in the written order, then the sum). True for integers (wrapping sums
    are exact in any order); for floats when every factor's tensor is finite and the product of
    the factors' largest magnitudes, times the number of terms, stays far below the type's
    largest value: then no product or partial sum, however grouped, can overflow, and both
    results are finite. An einsum over float32 accumulates in float32 (BLAS or numpy's own loops)
    like the generated code, in another order: the results differ by rounding alone."""
    if not T.is_float(dtype):
        return True
    if not math.isfinite(scale):
        return False
    bound = float(terms) * max(1.0, abs(scale))
    for f in factors:
        if isinstance(f, Read):
            m = _magnitude(arrays[f.tensor])
            if not math.isfinite(m):
                return False
            bound *= max(1.0, m)
    return bound <= float(np.finfo(dtype).max) / 4


def _magnitude(a: np.ndarray) -> float:
    """The largest ``|x|`` in ``a`` (0 when empty; inf or nan when ``a`` holds a non-finite value)."""
    if a.size == 0:
        return 0.0
    hi, lo = float(a.max()), float(a.min())  # nan when ``a`` holds one
    return math.nan if math.isnan(hi) or math.isnan(lo) else max(abs(hi), abs(lo))


def _product(e: TExpr, out: list[TExpr]) -> bool:
    if isinstance(e, Binop) and e.op == "*":
        return _product(e.lhs, out) and _product(e.rhs, out)
    if isinstance(e, Read) or (isinstance(e, Const) and T.is_float(e.dtype)):
        out.append(e)
        return True
    return False


EINSUM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def einsum_form(s: Statement) -> tuple[str, tuple[str, ...], float] | str:
    """The statement as ``np.einsum`` over whole tensors: (subscripts, the tensor of each operand,
    the product of its constant factors) when its right side is a product of reads and float
    constants, each read subscripted by plain indices (``A(m,r_k)``; not ``A(i+1)``, not a gather),
    summed over its reduction indices (``+=``, ``+=!``) or not reduced (``=``); else why not, as a
    phrase. The index ranges are not checked: einsum runs over whole tensors."""
    if s.op not in ("+", "="):
        return f"statement {s.number} reduces with '{s.op}=', einsum only sums"
    if s.op == "=" and s.reductions:
        return f"statement {s.number} assigns with '=' over the reduction indices {', '.join(s.reductions)}"
    factors: list[TExpr] = []
    if not _product(s.rhs, factors):
        return f"the right side of statement {s.number} is not a product of tensor reads and float constants"
    if len(s.indices) > len(EINSUM_LETTERS):
        return f"statement {s.number} has more indices than einsum has letters"
    letter = dict(zip(s.indices, EINSUM_LETTERS))
    specs: list[str] = []
    tensors: list[str] = []
    scale = 1.0
    for f in factors:
        if isinstance(f, Const):
            scale *= float(f.value)
            continue
        assert isinstance(f, Read)
        spec = ""
        for sub in f.subs:
            atom = sub.terms[0][0] if isinstance(sub, Sym) and sub.is_atomic() and sub.terms else None
            if not (isinstance(atom, Var) and atom.name in letter):
                at = sub if isinstance(sub, Sym) else "a gathered index"
                return f"'{f.tensor}' is read at {at}, not a plain index"
            spec += letter[atom.name]
        specs.append(spec)
        tensors.append(f.tensor)
    unread = [i for i in s.indices if not any(letter[i] in spec for spec in specs)]
    if not specs or unread:
        return f"index '{unread[0]}' of statement {s.number} subscripts no read" if unread else \
            f"statement {s.number} reads no tensor"
    return ",".join(specs) + "->" + "".join(letter[i] for i in s.lhs), tuple(tensors), scale


def _view(arr: np.ndarray, r: Read, lo: dict[str, int], ext: dict[str, int],
          consts: dict[str, Sym]) -> tuple[np.ndarray, list[str]] | None:
    item = arr.itemsize
    elem_strides = [s // item for s in arr.strides]
    offset = 0
    stride: dict[str, int] = {}
    for d, sub in enumerate(r.subs):
        if not isinstance(sub, Sym):
            return None
        c = sub.subs(consts)
        if not all(isinstance(a, Var) for a in c.atoms()):
            return None
        at_lo = c.const + sum(k * lo[a.name] for a, k in c.terms if isinstance(a, Var))
        offset += at_lo * elem_strides[d]
        for a, k in c.terms:
            assert isinstance(a, Var)
            stride[a.name] = stride.get(a.name, 0) + k * elem_strides[d]
    axes = [name for name in lo if name in stride]
    try:
        view = np.ndarray(tuple(ext[a] for a in axes), dtype=arr.dtype, buffer=arr, offset=offset * item,
                          strides=tuple(stride[a] * item for a in axes))
    except (ValueError, TypeError):
        return None
    return view, axes
