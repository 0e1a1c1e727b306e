"""Reference interpreter: runs an ``Instance`` on numpy arrays (``Instance x inputs -> outputs``).

Each statement is evaluated with numpy over its whole iteration box, split into chunks of at
most ``CHUNK`` points so memory stays bounded; contractions (sums of products of affine reads)
go straight to ``np.einsum`` over strided views. Semantics are the language's: identity
initialisation for ``!``, statements in order, padding by domain, bounds-checked gathers, C
conversions, and floor ``/`` and ``%`` on integers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import dtypes as T
from .affine import Sym, Var
from .checked import Binop, Call, Const, Convert, IndexVal, Read, Select, SizeVal, TExpr, Unop, reads
from .errors import TcRuntimeError
from .instance import BoundStmt, Instance

CHUNK = 1 << 21
_REDUCE = {"+": np.add, "*": np.multiply, "min": np.minimum, "max": np.maximum}


def run(inst: Instance, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute every statement; returns the outputs by name (fresh C-contiguous arrays)."""
    arrays: dict[str, np.ndarray] = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    c = inst.checked
    for t in (*c.outputs, *c.temps):
        arrays[t.name] = np.zeros(inst.shapes[t.name], dtype=t.dtype)
    with np.errstate(all="ignore"):
        for bs in inst.stmts:
            _statement(bs, arrays, inst.sizes)
    return {t.name: arrays[t.name] for t in c.outputs}


def _statement(bs: BoundStmt, arrays: dict[str, np.ndarray], sizes: dict[str, int]) -> None:
    s = bs.stmt
    out = arrays[s.tensor]
    nl = len(s.lhs)
    region = tuple(slice(0, hi) for _, _, hi in bs.ranges[:nl])
    if s.init:
        out[region] = T.identity(s.op, out.dtype.name)
    if 0 in bs.shape:
        return
    if s.op == "+" and not bs.guards and _einsum(bs, arrays, sizes, _view_of(out, region)):
        return
    for chunk in _chunks(bs.ranges):
        _chunk(bs, chunk, arrays, sizes, out)


def _view_of(out: np.ndarray, region: tuple[slice, ...]) -> np.ndarray:
    """A writable view of ``out[region]`` (for a rank-0 ``out``, ``out`` itself)."""
    return out[region] if region else out


def _chunks(ranges: tuple[tuple[str, int, int], ...]) -> Iterator[list[tuple[int, int]]]:
    box = [(lo, hi) for _, lo, hi in ranges]
    stack = [box]
    while stack:
        b = list(stack.pop())
        if math.prod(hi - lo for lo, hi in b) <= CHUNK:
            yield b
            continue
        k = next(i for i, (lo, hi) in enumerate(b) if hi - lo > 1)
        lo, hi = b[k]
        mid = (lo + hi) // 2
        stack.append(b[:k] + [(mid, hi)] + b[k + 1:])
        stack.append(b[:k] + [(lo, mid)] + b[k + 1:])


def _chunk(bs: BoundStmt, chunk: list[tuple[int, int]], arrays: dict[str, np.ndarray], sizes: dict[str, int],
           out: np.ndarray) -> None:
    s = bs.stmt
    n = len(chunk)
    env: dict[str, Any] = dict(sizes)
    for axis, ((name, _, _), (lo, hi)) in enumerate(zip(bs.ranges, chunk)):
        axis_shape = [1] * n
        axis_shape[axis] = hi - lo
        env[name] = np.arange(lo, hi, dtype=np.int64).reshape(axis_shape)
    mask = None
    for g in bs.guards:
        v = g.sub.eval(env)
        ok = (v >= 0) & (v < g.extent)
        mask = ok if mask is None else mask & ok
    ev = _Eval(bs, arrays, env, clip=bool(bs.guards))
    vals = np.asarray(ev.value(s.rhs, mask))
    shape = tuple(hi - lo for lo, hi in chunk)
    vals = np.broadcast_to(vals.astype(out.dtype, copy=False), shape)
    nl = len(s.lhs)
    region = tuple(slice(lo, hi) for lo, hi in chunk[:nl])
    if s.op == "=":
        if mask is None:
            out[region] = vals
        else:
            np.copyto(_view_of(out, region), vals, where=np.broadcast_to(mask, shape))
        return
    uf = _REDUCE[s.op]
    if mask is not None:
        vals = np.where(mask, vals, np.asarray(T.identity(s.op, out.dtype.name), dtype=out.dtype))
    part = uf.reduce(vals, axis=tuple(range(nl, n))) if n > nl else vals
    out[region] = uf(out[region], part)


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
                self._check(e, d, v, extent, live, "gather")
                v = np.clip(v, 0, max(extent - 1, 0))
            idx.append(v)
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


def _round(x: Any) -> Any:
    """C's round: halfway cases away from zero (exact: ``x - trunc(x)`` needs no rounding)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _erf(x: Any) -> Any:
    """erf in float64: Maclaurin series for |x| < 3, a continued fraction for erfc beyond."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    small = np.minimum(ax, 3.0)
    term = small.copy()
    total = small.copy()
    x2 = small * small
    for n in range(1, 80):
        term = -term * x2 / n
        total = total + term / (2 * n + 1)
    series = 2.0 / np.sqrt(np.pi) * total
    big = np.maximum(ax, 3.0)
    frac = np.zeros_like(big)
    for k in range(60, 0, -1):
        frac = (k / 2.0) / (big + frac)
    tail = 1.0 - np.exp(-big * big) / np.sqrt(np.pi) / (big + frac)
    return np.sign(x) * np.where(ax < 3.0, series, tail)


_UNARY: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "round": _round, "trunc": np.trunc, "sin": np.sin, "cos": np.cos, "tan": np.tan, "fabs": np.abs,
    "abs": np.abs, "exp2": np.exp2, "log2": np.log2, "log10": np.log10, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh,
}
_NARY: dict[str, Callable[..., Any]] = {
    "pow": np.power, "fmax": np.fmax, "fmin": np.fmin, "atan2": np.arctan2, "fmod": np.fmod,
    "min": np.minimum, "max": np.maximum, "fma": lambda a, b, c: a * b + c,
}


def _call(fn: str, args: list[Any], dtype: str) -> Any:
    f = _UNARY.get(fn) or _NARY[fn]
    return np.asarray(f(*args)).astype(dtype, copy=False)


# ---- contraction fast path ---------------------------------------------------------------------


def _einsum(bs: BoundStmt, arrays: dict[str, np.ndarray], sizes: dict[str, int], target: np.ndarray) -> bool:
    """``target op= sum of a product of affine reads`` through einsum on strided views; False when
    the statement is not such a contraction."""
    s = bs.stmt
    factors: list[TExpr] = []
    if not _product(s.rhs, factors):
        return False
    dtype = target.dtype.name
    rs = reads(s.rhs)
    if len(rs) != len([f for f in factors if isinstance(f, Read)]) or len(rs) > 8:
        return False
    letters = {name: chr(ord("a") + i) for i, (name, _, _) in enumerate(bs.ranges)}
    if len(letters) > 26:
        return False
    lo = {name: lo for name, lo, _ in bs.ranges}
    ext = {name: hi - lo for name, lo, hi in bs.ranges}
    consts = {k: Sym.of(v) for k, v in sizes.items()}
    ops: list[np.ndarray] = []
    specs: list[str] = []
    scale = 1.0
    for f in factors:
        if isinstance(f, Const):
            scale *= float(f.value)
            continue
        assert isinstance(f, Read)
        if f.dtype != dtype:
            return False
        view = _view(arrays[f.tensor], f, lo, ext, consts)
        if view is None:
            return False
        arr, axes = view
        ops.append(arr)
        specs.append("".join(letters[a] for a in axes))
    used = set("".join(specs))
    out_spec = "".join(letters[i] for i in s.lhs)
    if not ops or not set(out_spec) <= used or len(used) != len(bs.ranges):
        return False
    res = np.einsum(",".join(specs) + "->" + out_spec, *ops, optimize=True)
    if scale != 1.0:
        res = res * np.asarray(scale, dtype=dtype)
    target += res.astype(dtype, copy=False)
    return True


def _product(e: TExpr, out: list[TExpr]) -> bool:
    if isinstance(e, Binop) and e.op == "*":
        return _product(e.lhs, out) and _product(e.rhs, out)
    if isinstance(e, Read) or (isinstance(e, Const) and T.is_float(e.dtype)):
        out.append(e)
        return True
    return False


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
