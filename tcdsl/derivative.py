"""Expression derivatives for reverse mode: ``TExpr x read -> TExpr`` (the partial derivative of a
typed expression with respect to one tensor read; ``None``: identically zero), and ``TExpr -> str``
(typed expressions printed back as TC text). Used by ``tcdsl.autodiff``, ``tcdsl.gradrules`` and
``tcdsl.gradindex``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .core import dtypes as T
from .core.affine import Sym, Var
from .core.builtins import BUILTINS
from .core.checked import Binop, Call, Const, Convert, IndexVal, Read, Select, SizeVal, TExpr, Unop, convert
from .core.errors import TcGradientError
from .core.printer import num

Key = tuple[str, tuple]  # (tensor, subscripts) of a read: every read with this key is one variable


@dataclass(frozen=True)
class IndexExpr(TExpr):
    """Index arithmetic (a Sym over indices and sizes) standing for an index after re-indexing."""

    sym: Sym


def key_of(r: Read) -> Key:
    return (r.tensor, r.subs)


def plain_var(sub: object) -> str | None:
    """The index a subscript is, where it is one index and nothing else."""
    if isinstance(sub, Sym) and sub.const == 0 and len(sub.terms) == 1:
        atom, c = sub.terms[0]
        if c == 1 and isinstance(atom, Var) and atom.kind == "index":
            return atom.name
    return None


# ---- construction with folding -------------------------------------------------------------------


def const(dtype: str, value: float) -> Const:
    return Const(dtype, float(value) if T.is_float(dtype) else int(value))


def _is(e: TExpr | None, value: float) -> bool:
    return isinstance(e, Const) and e.value == value


def add(a: TExpr | None, b: TExpr | None) -> TExpr | None:
    if a is None or _is(a, 0):
        return b
    if b is None or _is(b, 0):
        return a
    return Binop(a.dtype, "+", a, b)


def sub(a: TExpr | None, b: TExpr | None) -> TExpr | None:
    if b is None or _is(b, 0):
        return a
    if a is None or _is(a, 0):
        return neg(b)
    return Binop(a.dtype, "-", a, b)


def neg(a: TExpr | None) -> TExpr | None:
    if a is None:
        return None
    if isinstance(a, Const):
        return const(a.dtype, -a.value)
    if isinstance(a, Unop) and a.op == "-":
        return a.arg
    return Unop(a.dtype, "-", a)


def mul(a: TExpr | None, b: TExpr | None) -> TExpr | None:
    if a is None or b is None or _is(a, 0) or _is(b, 0):
        return None
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    if _is(a, -1):
        return neg(b)
    if _is(b, -1):
        return neg(a)
    return Binop(a.dtype, "*", a, b)


def div(a: TExpr | None, b: TExpr) -> TExpr | None:
    if a is None or _is(a, 0):
        return None
    if _is(b, 1):
        return a
    return Binop(a.dtype, "/", a, b)


def select(c: TExpr, a: TExpr | None, b: TExpr | None, dtype: str) -> TExpr | None:
    if a is None and b is None:
        return None
    return Select(dtype, c, a if a is not None else const(dtype, 0), b if b is not None else const(dtype, 0))


def call(fn: str, *args: TExpr) -> TExpr:
    return Call(args[0].dtype, fn, tuple(args))


def cmp(op: str, a: TExpr, b: TExpr) -> TExpr:
    return Binop("bool", op, a, b)


# ---- derivatives ----------------------------------------------------------------------------------

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SQRT_PI_OVER_2 = math.sqrt(math.pi) / 2
_SQRT_2PI = math.sqrt(2 * math.pi)


def diff(e: TExpr, key: Key) -> TExpr | None:
    """d e / d (the reads with ``key``), or None where it is identically zero. Integer and boolean
    subexpressions carry no derivative; ``fmax``/``max`` send it to the first argument on ties."""
    if not T.is_float(e.dtype):
        return None
    if isinstance(e, Read):
        return const(e.dtype, 1) if key_of(e) == key else None
    if isinstance(e, (Const, IndexVal, SizeVal, IndexExpr)):
        return None
    if isinstance(e, Convert):
        return convert(d, e.dtype) if (d := diff(e.arg, key)) is not None else None
    if isinstance(e, Unop):
        return neg(diff(e.arg, key)) if e.op == "-" else None
    if isinstance(e, Select):
        return select(e.cond, diff(e.then, key), diff(e.other, key), e.dtype)
    if isinstance(e, Binop):
        return _diff_binop(e, key)
    if isinstance(e, Call):
        return _diff_call(e, key)
    raise TypeError(e)


def _diff_binop(e: Binop, key: Key) -> TExpr | None:
    a, b = e.lhs, e.rhs
    da, db = diff(a, key), diff(b, key)
    if e.op == "+":
        return add(da, db)
    if e.op == "-":
        return sub(da, db)
    if e.op == "*":
        return add(mul(da, b), mul(a, db))
    if e.op == "/":
        # times 1 / b and a * (1 / b^2): where b is the same along a loop (a size, softmax's sum), a
        # multiply per point and the division once
        one = const(b.dtype, 1)
        return sub(mul(da, div(one, b)), mul(mul(a, div(one, Binop(b.dtype, "*", b, b))), db))
    if e.op == "%":  # fmod on floats
        return sub(da, mul(db, call("trunc", Binop(a.dtype, "/", a, b))))
    return None  # comparisons and logic


def _diff_call(e: Call, key: Key) -> TExpr | None:
    fn, args, t = e.fn, e.args, e.dtype
    rule = BUILTINS[fn].derivative
    if rule == "flat":
        return None
    if rule is None:
        if any(diff(a, key) is not None for a in args):
            raise TcGradientError(f"builtin '{fn}' has no derivative tcdsl can derive; pass backward= with a "
                                  f"hand-written gradient")
        return None
    if len(args) == 1:
        x = args[0]
        dx = diff(x, key)
        if dx is None:
            return None
        return mul(dx, _unary_derivative(fn, x, e, t))
    ds = [diff(a, key) for a in args]
    if all(d is None for d in ds):
        return None
    if fn in ("fmax", "max", "fmin", "min"):
        op = ">=" if fn in ("fmax", "max") else "<="
        return select(cmp(op, args[0], args[1]), ds[0], ds[1], t)
    if fn == "pow":
        a, b = args
        one = const(t, 1)
        return add(mul(ds[0], mul(b, call("pow", a, Binop(t, "-", b, one)))), mul(ds[1], mul(e, call("log", a))))
    if fn == "atan2":
        y, x = args
        den = Binop(t, "+", Binop(t, "*", x, x), Binop(t, "*", y, y))
        return div(sub(mul(x, ds[0]), mul(y, ds[1])), den)
    if fn == "fmod":
        a, b = args
        return sub(ds[0], mul(ds[1], call("trunc", Binop(t, "/", a, b))))
    if fn == "fma":
        a, b, c = args
        return add(add(mul(ds[0], b), mul(a, ds[1])), ds[2])
    total: TExpr | None = None
    for d, p in zip(ds, _partials(fn, args, e, t)):
        if d is not None:
            total = add(total, mul(d, p))
    return total


def _partials(fn: str, args: tuple[TExpr, ...], e: TExpr, t: str) -> tuple[TExpr | None, ...]:
    """The partial derivatives of ``e = fn(*args)`` (None: zero), for the builtins of two or more
    arguments past the C99 ones."""
    zero, one = const(t, 0), const(t, 1)

    def bop(op: str, a: TExpr, b: TExpr) -> TExpr:
        return Binop(t, op, a, b)

    if fn in ("hypot", "norm3d", "norm4d"):  # x_i / |x|
        return tuple(bop("/", a, e) for a in args)
    if fn in ("rhypot", "rnorm3d", "rnorm4d"):  # -x_i / |x|^3
        cube = bop("*", bop("*", e, e), e)
        return tuple(Unop(t, "-", bop("*", a, cube)) for a in args)
    x, y = args[0], args[1]
    if fn == "fdivide":
        return bop("/", one, y), Unop(t, "-", bop("/", e, y))
    if fn == "copysign":  # |x| with y's sign: the slope is 1 where the signs agree, -1 where not
        return bop("*", call("copysign", one, x), call("copysign", one, y)), None
    if fn == "fdim":
        return Select(t, cmp(">", x, y), one, zero), Select(t, cmp(">", x, y), const(t, -1), zero)
    if fn == "remainder":  # x - n y, n constant between its jumps: n = (x - e) / y
        return one, Unop(t, "-", bop("/", bop("-", x, e), y))
    if fn == "nextafter":  # one step from x: x itself, to first order
        return one, None
    raise TypeError(fn)


def _unary_derivative(fn: str, x: TExpr, e: TExpr, t: str) -> TExpr:
    """d fn(x) / dx, given ``e = fn(x)``."""
    one = const(t, 1)

    def sq(v: TExpr) -> TExpr:
        return Binop(t, "*", v, v)

    def bop(op: str, a: TExpr, b: TExpr) -> TExpr:
        return Binop(t, op, a, b)

    table: dict[str, Callable[[], TExpr]] = {
        "exp": lambda: e,
        "exp2": lambda: bop("*", e, const(t, _LN2)),
        "expm1": lambda: call("exp", x),
        "log": lambda: bop("/", one, x),
        "log2": lambda: bop("/", one, bop("*", x, const(t, _LN2))),
        "log10": lambda: bop("/", one, bop("*", x, const(t, _LN10))),
        "log1p": lambda: bop("/", one, bop("+", one, x)),
        "sqrt": lambda: bop("/", const(t, 0.5), e),
        "rsqrt": lambda: bop("/", bop("*", const(t, -0.5), e), x),
        "cbrt": lambda: bop("/", one, bop("*", const(t, 3), sq(e))),
        "tanh": lambda: bop("-", one, sq(e)),
        "sigmoid": lambda: bop("*", e, bop("-", one, e)),
        "erf": lambda: bop("*", const(t, _TWO_OVER_SQRT_PI), call("exp", Unop(t, "-", sq(x)))),
        "sin": lambda: call("cos", x),
        "cos": lambda: Unop(t, "-", call("sin", x)),
        "tan": lambda: bop("+", one, sq(e)),
        "asin": lambda: call("rsqrt", bop("-", one, sq(x))),
        "acos": lambda: Unop(t, "-", call("rsqrt", bop("-", one, sq(x)))),
        "atan": lambda: bop("/", one, bop("+", one, sq(x))),
        "sinh": lambda: call("cosh", x),
        "cosh": lambda: call("sinh", x),
        "asinh": lambda: call("rsqrt", bop("+", sq(x), one)),
        "acosh": lambda: call("rsqrt", bop("-", sq(x), one)),
        "atanh": lambda: bop("/", one, bop("-", one, sq(x))),
        "abs": lambda: _sign(x, t),
        "fabs": lambda: _sign(x, t),
        "erfc": lambda: bop("*", const(t, -_TWO_OVER_SQRT_PI), call("exp", Unop(t, "-", sq(x)))),
        "erfinv": lambda: bop("*", const(t, _SQRT_PI_OVER_2), call("exp", sq(e))),
        "erfcinv": lambda: bop("*", const(t, -_SQRT_PI_OVER_2), call("exp", sq(e))),
        "erfcx": lambda: bop("-", bop("*", bop("*", const(t, 2), x), e), const(t, _TWO_OVER_SQRT_PI)),
        "exp10": lambda: bop("*", e, const(t, _LN10)),
        "normcdf": lambda: bop("/", call("exp", bop("*", const(t, -0.5), sq(x))), const(t, _SQRT_2PI)),
        "normcdfinv": lambda: bop("*", const(t, _SQRT_2PI), call("exp", bop("*", const(t, 0.5), sq(e)))),
        "sinpi": lambda: bop("*", const(t, math.pi), call("cospi", x)),
        "cospi": lambda: bop("*", const(t, -math.pi), call("sinpi", x)),
        "rcbrt": lambda: bop("*", const(t, -1 / 3), sq(sq(e))),
        "lgamma": lambda: call("digamma", x),
        "digamma": lambda: call("trigamma", x),
        "tgamma": lambda: bop("*", e, call("digamma", x)),
        "j0": lambda: Unop(t, "-", call("j1", x)),
        "y0": lambda: Unop(t, "-", call("y1", x)),
        "cyl_bessel_i0": lambda: call("cyl_bessel_i1", x),
        "j1": lambda: _order_one(call("j0", x), e, x, t),
        "y1": lambda: bop("-", call("y0", x), bop("/", e, x)),
        "cyl_bessel_i1": lambda: _order_one(call("cyl_bessel_i0", x), e, x, t),
    }
    if fn not in table:
        raise TypeError(fn)
    return table[fn]()


def _order_one(f0: TExpr, f1: TExpr, x: TExpr, t: str) -> TExpr:
    """``f0 - f1 / x``, the slope of J1 (I1) from J0 (I0) and J1 (I1); 1/2 at x = 0."""
    return Select(t, cmp("==", x, const(t, 0)), const(t, 0.5), Binop(t, "-", f0, Binop(t, "/", f1, x)))


def _sign(x: TExpr, t: str) -> TExpr:
    zero = const(t, 0)
    return Select(t, cmp(">", x, zero), const(t, 1), Select(t, cmp("<", x, zero), const(t, -1), zero))


# ---- rewriting ------------------------------------------------------------------------------------


def rewrite(e: TExpr, read: Callable[[Read], TExpr] | None = None, index: Mapping[str, Sym] | None = None) -> TExpr:
    """``e`` with every read passed through ``read`` (after its subscripts are rewritten) and every
    index ``i`` in ``index`` replaced by ``index[i]`` (in values and in subscripts)."""
    env = dict(index or {})

    def go(x: TExpr) -> TExpr:
        if isinstance(x, IndexVal):
            return IndexExpr(x.dtype, env[x.name]) if x.name in env else x
        if isinstance(x, IndexExpr):
            return IndexExpr(x.dtype, x.sym.subs(env))
        if isinstance(x, Read):
            subs = tuple(s.subs(env) if isinstance(s, Sym) else go(s) for s in x.subs)
            r = replace(x, subs=subs)
            return read(r) if read is not None else r
        if isinstance(x, (Unop, Convert)):
            return replace(x, arg=go(x.arg))
        if isinstance(x, Binop):
            return replace(x, lhs=go(x.lhs), rhs=go(x.rhs))
        if isinstance(x, Select):
            return replace(x, cond=go(x.cond), then=go(x.then), other=go(x.other))
        if isinstance(x, Call):
            return replace(x, args=tuple(go(a) for a in x.args))
        return x

    return go(e)


def unconditional_reads(e: TExpr) -> list[Read]:
    """The reads of ``e`` evaluated at every point (not under ``?:``, ``&&`` or ``||``)."""
    out: list[Read] = []

    def walk(x: TExpr) -> None:
        if isinstance(x, Read):
            out.append(x)
            for s in x.subs:
                if isinstance(s, TExpr):
                    walk(s)
        elif isinstance(x, (Unop, Convert)):
            walk(x.arg)
        elif isinstance(x, Binop):
            walk(x.lhs)
            if x.op not in ("&&", "||"):
                walk(x.rhs)
        elif isinstance(x, Select):
            walk(x.cond)
        elif isinstance(x, Call):
            for a in x.args:
                walk(a)

    walk(e)
    return out


# ---- printing -------------------------------------------------------------------------------------


def literal(c: Const) -> str:
    v = c.value
    if c.dtype == "bool":
        return "bool(1)" if v else "bool(0)"
    if T.is_float(c.dtype):
        if not math.isfinite(float(v)):
            raise ValueError(f"no TC literal for {v}")
        text = num(abs(float(v)), True)
        text = text if c.dtype == "float32" else f"{c.dtype}({text})"
    else:
        text = str(abs(int(v)))
        text = text if c.dtype == "int32" else f"{c.dtype}({text})"
    return f"(-{text})" if float(v) < 0 or (float(v) == 0 and math.copysign(1, float(v)) < 0) else text


def subscript(s: Sym | TExpr) -> str:
    return str(s) if isinstance(s, Sym) else text(s)


def read_text(tensor: str, subs: tuple) -> str:
    return f"{tensor}({', '.join(subscript(s) for s in subs)})" if subs else tensor


def text(e: TExpr) -> str:
    """TC text for a typed expression; every conversion is explicit, so it re-checks to ``e``."""
    if isinstance(e, Const):
        return literal(e)
    if isinstance(e, (IndexVal, SizeVal)):
        return e.name
    if isinstance(e, IndexExpr):
        return f"({e.sym})"
    if isinstance(e, Read):
        return read_text(e.tensor, e.subs)
    if isinstance(e, Convert):
        return f"{e.dtype}({text(e.arg)})"
    if isinstance(e, Unop):
        return f"{e.op}({text(e.arg)})"
    if isinstance(e, Binop):
        return f"({text(e.lhs)} {e.op} {text(e.rhs)})"
    if isinstance(e, Select):
        return f"({text(e.cond)} ? {text(e.then)} : {text(e.other)})"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(text(a) for a in e.args)})"
    raise TypeError(e)
