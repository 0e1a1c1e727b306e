"""Grammar-based fuzzing of tcdsl: hypothesis strategies (TC text + inputs -> cases) and the oracle.

``cases()`` draws valid defs covering every construct of SPEC section 1 together with inputs;
``mutants()`` damages their text token by token; ``check_case`` / ``check_mutant`` run a case
through ``tc.define`` and both the C backend and the reference interpreter and return an outcome
name (counted by the tests and by ``benchmarks/fuzz_report.py``) or raise ``FuzzFailure``.

Float results are compared against a bound the generator carries with every expression: the
largest magnitude the value can take and the largest difference two correct evaluations can
show (summation order, libm ulps). Values that every backend must compute bit for bit (integer
arithmetic, correctly rounded float operations in the same order, comparisons, casts) carry a
zero difference and are compared exactly; the generator only feeds such values to operations
that are not continuous (comparisons, ``floor``, casts to integers, ``log`` near 0), so a
reordered sum can never flip a branch.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import tcdsl as tc
from tcdsl.core import dtypes as T
from tcdsl.core.instance import instantiate
from tcdsl.core.sema import check_def
from tcdsl.errors import TcError
from tcdsl.grammar import parse

INF = math.inf
UNIT = {"float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
FLOATS = ("float16", "float32", "float64")
SPELL = {"float32": ("float", "float32"), "float64": ("double", "float64")}
INT_LIMIT = {t: 2 ** (T.bits(t) - 1) - 1 for t in ("int8", "int16", "int32", "int64")}
SIZE_NAMES = ("N", "M", "K", "P")
LHS_INDICES = ("i", "j", "k_", "l")
RED_INDICES = ("r", "r_k", "s_")
MAX_DIM = 6


class FuzzFailure(AssertionError):
    """tcdsl did something no input may make it do: a foreign exception, an unlocated error,
    backends that disagree."""


# ---- expressions --------------------------------------------------------------------------------

# precedence levels of the grammar, loosest first
P_TERN, P_OR, P_AND, P_EQ, P_REL, P_ADD, P_MUL, P_UNARY, P_ATOM = range(9)
BIN_PREC = {"||": P_OR, "&&": P_AND, "==": P_EQ, "!=": P_EQ, "<": P_REL, "<=": P_REL, ">": P_REL, ">=": P_REL,
            "+": P_ADD, "-": P_ADD, "*": P_MUL, "/": P_MUL, "%": P_MUL}


@dataclass(frozen=True)
class Ex:
    """A generated expression: its text, TC type, precedence, the largest magnitude it can take
    (``bound``; finite implies no NaN or inf), the largest absolute difference two backends may show
    (``err``; 0: bit for bit) and a relative one (``rel``, from a libm call at the top)."""

    text: str
    dtype: str
    prec: int = P_ATOM
    bound: float = 0.0
    err: float = 0.0
    rel: float = 0.0

    @property
    def exact(self) -> bool:
        return self.err == 0 and self.rel == 0

    def abs_err(self) -> float:
        return self.err + self.rel * self.bound if self.rel else self.err

    def at(self, prec: int) -> str:
        return self.text if self.prec >= prec else f"({self.text})"


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0.0
    return a * b


def _pow(b: float, k: int) -> float:
    """``b ** k`` for ``b >= 1``, inf where it would overflow."""
    return INF if b == INF or k * math.log(b) > 700 else b**k


def _round_err(dtype: str, bound: float, dirty: bool) -> float:
    """The difference one rounding adds when its operands may already differ (none when they
    cannot: a correctly rounded operation on equal operands gives equal results)."""
    if dtype == "float16":  # C may keep _Float16 arithmetic in float between operations
        return 2 * bound * UNIT["float16"]
    return bound * UNIT.get(dtype, 0.0) if dirty else 0.0


def _int_bound(t: str, b: float) -> float:
    if t == "bool":
        return 1.0
    return min(b, float(np.iinfo(np.dtype(t)).max))


def _fix(dtype: str, bound: float, err: float, rel: float = 0.0) -> tuple[float, float, float]:
    """Bounds as the value's type sees them: integers are exact, overflowing floats unbounded."""
    if not T.is_float(dtype):
        return _int_bound(dtype, bound), 0.0, 0.0
    fmax = float(np.finfo(np.dtype(dtype)).max)
    if bound > fmax / 4 or math.isnan(bound):
        return INF, INF if (err or rel) else 0.0, 0.0
    return bound, err, rel


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bound: float
    err: float = 0.0
    kind: str = "input"  # input, temp, output
    values: str = "small"  # input values: small (dyadic), wild (any finite), index (gather targets)
    limit: int = MAX_DIM  # index tensors: values drawn below this (gather targets' extents)


@dataclass
class Param:
    name: str
    dtype: str
    spelling: str
    dims: tuple[str, ...]  # dim texts (size symbols or literals)
    parens: bool = False  # a rank-0 param written `float() a`


@dataclass
class DefSpec:
    """A generated def: its text, its params with the values to draw, the size values and, per
    output, the tolerance of a comparison between backends."""

    name: str
    text: str
    params: list[Param]
    sizes: dict[str, int]
    tensors: dict[str, TensorInfo]
    outputs: list[str]
    features: set[str] = field(default_factory=set)


class _Stmt:
    """State while drawing one statement: its indices and their extents, lets, anchors."""

    def __init__(self, indices: dict[str, int], target: str | None) -> None:
        self.indices = indices  # index -> extent estimate
        self.target = target  # tensor the statement writes, readable only at the written point
        self.lets: dict[str, Ex] = {}
        self.used: set[str] = set()
        self.anchored: set[str] = set()
        self.shifted: set[str] = set()  # indices read at a negative shift (their range starts above 0)


class Gen:
    """Draws one def; ``draw`` is hypothesis's."""

    def __init__(self, draw: Any, allow_empty: bool) -> None:
        self.draw = draw
        self.features: set[str] = set()
        n_sizes = draw(st.integers(1, 3))
        lo = 0 if allow_empty and draw(st.integers(0, 9)) == 0 else 1
        self.sizes = {SIZE_NAMES[i]: draw(st.integers(lo, MAX_DIM)) for i in range(n_sizes)}
        self.tensors: dict[str, TensorInfo] = {}
        self.params: list[Param] = []
        self.stmts: list[str] = []
        self.typed_outputs: dict[str, str] = {}  # name -> header text
        self.typed_info: dict[str, TensorInfo] = {}
        self.written: list[str] = []  # in the order of first write
        self.name = "f"
        self.cur: _Stmt | None = None

    def keep_used_sizes(self) -> None:
        """Only the size symbols some param declares are sizes; the others are dropped."""
        used = {d for p in self.params for d in p.dims}
        self.sizes = {n: v for n, v in self.sizes.items() if n in used}

    # ---- choices ----
    def pick(self, seq: Any) -> Any:
        return self.draw(st.sampled_from(list(seq)))

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) < int(p * 1000)

    def feature(self, name: str) -> None:
        self.features.add(name)

    # ---- header ----
    def dim(self) -> tuple[str, int]:
        if self.sizes and self.chance(0.75):
            n = self.pick(self.sizes)
            return n, self.sizes[n]
        v = self.draw(st.integers(1, MAX_DIM))
        self.feature("literal dim")
        return str(v), v

    def param(self, k: int) -> None:
        dtype = self.pick(("float32", "float32", "float32", "float64", "float64", "int32", "int64", "int8",
                           "int16", "uint8", "uint32", "uint64", "bool", "float16"))
        spelling = self.pick(SPELL.get(dtype, (dtype,)))
        rank = self.draw(st.integers(0, 3))
        dims = [self.dim() for _ in range(rank)]
        name = f"{'ABCDEFGH'[k]}{self.pick(('', '', '_in', '2'))}"
        if T.is_float(dtype):
            values = self.pick(("small", "small", "small", "wild"))
            bound = 8.0 if values == "small" else 1e4
        elif dtype == "bool":
            values, bound = "small", 1.0
        else:
            values = self.pick(("small", "index", "wild")) if dtype != "uint8" else "small"
            bound = 100.0 if values != "wild" else _int_bound(dtype, INF)
        self.feature(f"param {dtype}" + (" rank0" if rank == 0 else ""))
        self.params.append(Param(name, dtype, spelling, tuple(d for d, _ in dims), rank == 0 and self.chance(0.3)))
        self.tensors[name] = TensorInfo(name, dtype, tuple(v for _, v in dims), bound, 0.0, "input", values)

    # ---- expressions ----
    def expr(self, want: str, depth: int, exact: bool = False) -> Ex:
        """An expression of kind ``want`` (float, int, bool or any); ``exact``: bit for bit on every
        backend (the operand of a comparison, a cast to an integer, a condition)."""
        for _ in range(6):
            e = self._expr(want, depth, exact)
            if e is not None and (not exact or e.exact):
                return e
        return self.literal(want)

    def _kind_ok(self, dtype: str, want: str) -> bool:
        if want == "any":
            return True
        if want == "float":
            return T.is_float(dtype)
        if want == "int":
            return T.is_int(dtype)
        return dtype == "bool"

    def _expr(self, want: str, depth: int, exact: bool) -> Ex | None:
        if depth <= 0 or self.chance(0.15):
            return self.leaf(want, exact)
        forms = {"float": ("arith", "arith", "call", "call", "call", "neg", "minmax", "tern", "cast", "div", "let"),
                 "int": ("arith", "arith", "neg", "minmax", "tern", "cast", "idiv", "idiv", "let", "abs"),
                 "bool": ("cmp", "cmp", "logic", "not", "cast", "tern"),
                 "any": ("arith", "arith", "call", "call", "cmp", "neg", "tern", "minmax", "cast", "idiv", "div",
                         "logic", "not")}[want]
        form = self.pick(forms)
        if form == "arith":
            a, b = self.expr(want if want != "bool" else "any", depth - 1), self.expr(want, depth - 1)
            return self.binary(self.pick("+-*"), a, b)
        if form == "div":
            a = self.expr("float", depth - 1)
            b = self.expr(self.pick(("float", "int")), depth - 1, exact=True)
            return self.binary(self.pick("/%") if a.exact and self.chance(0.3) else "/", a, b)
        if form == "idiv":
            a = self.expr("int", depth - 1)
            if self.chance(0.7):  # a divisor that is never 0: (x % n + 1) or a literal
                b = self.literal("int", nonzero=True) if self.chance(0.5) else self.binary(
                    "+", self.binary("%", self.expr("int", depth - 2), self.literal("int", nonzero=True, lo=1)),
                    Ex("1", "int32", P_ATOM, 1.0))
            else:
                b = self.expr("int", depth - 1)
            self.feature("integer division")
            return self.binary(self.pick("/%"), a, b)
        if form == "neg":
            a = self.expr(want if want != "bool" else "any", depth - 1)
            return self.unary("-" if self.chance(0.85) else "+", a)
        if form == "not":
            return self.unary("!", self.expr("any", depth - 1, exact=True))
        if form == "abs":
            return self.call(self.pick(("abs",)), [self.expr("int", depth - 1)])
        if form == "cmp":
            a, b = self.expr("any", depth - 1, exact=True), self.expr("any", depth - 1, exact=True)
            return self.binary(self.pick(("==", "!=", "<", "<=", ">", ">=")), a, b)
        if form == "logic":
            a, b = self.expr("any", depth - 1, exact=True), self.expr("any", depth - 1, exact=True)
            return self.binary(self.pick(("&&", "||")), a, b)
        if form == "tern":
            c = self.expr("bool", depth - 1, exact=True)
            a, b = self.expr(want, depth - 1, exact), self.expr(want, depth - 1, exact)
            return self.ternary(c, a, b)
        if form == "minmax":
            a, b = self.expr(want, depth - 1, exact), self.expr(want, depth - 1, exact)
            fn = self.pick(("min", "max", "fmin", "fmax") if want == "float" else ("min", "max"))
            return self.call(fn, [a, b])
        if form == "cast":
            return self.cast(want, depth)
        if form == "let":
            if self.cur is None:
                return None
            name = f"v{len(self.cur.lets)}"
            value = self.expr(want, depth - 1, exact)
            self.cur.lets[name] = value
            self.feature("where let")
            return Ex(name, value.dtype, P_ATOM, value.bound, value.err, value.rel)
        return self.math_call(want, depth, exact)

    def leaf(self, want: str, exact: bool) -> Ex:
        choices = ["read", "read", "read", "literal"]
        if want in ("int", "any"):
            choices += ["index", "size"]
        if self.cur and self.cur.lets:
            choices.append("let")
        c = self.pick(choices)
        if c == "read":
            r = self.read(want)
            if r is not None:
                return r
        if c == "index" and self.cur and self.cur.indices:
            n = self.pick(sorted(self.cur.indices))
            self.cur.used.add(n)
            self.feature("index value")
            return Ex(n, "int32", P_ATOM, float(max(self.cur.indices[n], 8)))
        if c == "size" and self.sizes:
            n = self.pick(sorted(self.sizes))
            self.feature("size value")
            return Ex(n, "int32", P_ATOM, float(MAX_DIM))
        if c == "let" and self.cur:
            names = [n for n, v in self.cur.lets.items() if self._kind_ok(v.dtype, want)]
            if names:
                n = self.pick(names)
                v = self.cur.lets[n]
                return Ex(n, v.dtype, P_ATOM, v.bound, v.err, v.rel)
        return self.literal(want)

    def literal(self, want: str, nonzero: bool = False, lo: int = 0) -> Ex:
        if want == "bool":
            return self.binary(self.pick(("<", "==")), self.literal("int"), self.literal("int"))
        if want == "float" or (want == "any" and self.chance(0.4)):
            v = self.pick((0.5, 0.25, 1.5, 2.0, 3.0, 0.1, 1e-3, 100.0) if nonzero else
                          (0.0, 0.5, 0.25, 1.5, 2.0, 3.0, 0.1, 1e-3, 100.0))
            text = self.pick(_float_spellings(v))
            self.feature("float literal")
            return Ex(text, "float32", P_ATOM, abs(v))
        if self.chance(0.05):
            v = self.pick((2**31 - 1, 2**31, 2**40, 2**62))
            self.feature("int64 literal")
            return Ex(str(v), "int32" if v < 2**31 else "int64", P_ATOM, float(v))
        v = self.draw(st.integers(max(lo, 1 if nonzero else 0), 9))
        self.feature("int literal")
        return Ex(str(v), "int32", P_ATOM, float(v))

    def read(self, want: str) -> Ex | None:
        cands = [t for t in self.tensors.values() if self._kind_ok(t.dtype, want)
                 and (t.kind == "input" or t.name in self.written) and t.name != (self.cur and self.cur.target)]
        if self.cur and self.cur.target in self.written and self._kind_ok(self.tensors[self.cur.target].dtype, want) \
                and self.cur_op == "=" and self.chance(0.2):
            t = self.tensors[self.cur.target]  # read the point the statement writes
            self.feature("read of the written point")
            return Ex(f"{t.name}({', '.join(self.cur_lhs)})", t.dtype, P_ATOM, t.bound, t.err)
        if not cands:
            return None
        t = self.pick(cands)
        subs = [self.subscript(t, d) for d in range(len(t.shape))]
        self.feature("read rank0 bare" if not subs else "read")
        text = t.name if not subs and self.chance(0.7) else f"{t.name}({', '.join(subs)})"
        return Ex(text, t.dtype, P_ATOM, t.bound, t.err)

    def subscript(self, t: TensorInfo, d: int, anchor: str | None = None) -> str:
        """A subscript of dim ``d`` of ``t``: affine in the statement's indices (shifts, strides,
        floor division and modulo by literals), a constant, or a gather."""
        extent = t.shape[d]
        idx = anchor or (self.pick(sorted(self.cur.indices)) if self.cur and self.cur.indices else None)
        forms = ["plain", "plain", "shift", "stride", "fdiv", "flip", "const"]
        if anchor is None:
            forms += ["gather", "mod", "minus", "two"]
        form = self.pick(forms) if idx is not None else "const"
        if idx is not None and form not in ("const", "gather"):
            self.cur.used.add(idx)
            if form in ("plain", "shift", "stride", "fdiv", "flip", "two"):
                self.cur.anchored.add(idx)
        sym = next((n for n, v in self.sizes.items() if v == extent and n in self._dims_of(t, d)), None)
        if form == "plain":
            return idx
        if form == "shift":
            self.feature("subscript shift")
            return f"{idx} + {self.draw(st.integers(1, 2))}"
        if form == "minus":
            self.cur.shifted.add(idx)
            self.feature("subscript shift")
            return f"{idx} - 1"
        if form == "stride":
            self.feature("subscript stride")
            return f"2*{idx}" + self.pick(("", " + 1"))
        if form == "fdiv":
            self.feature("subscript floor division")
            return f"{idx} / 2" if self.chance(0.5) else f"({idx} + 1) / 2"
        if form == "mod":
            self.feature("subscript modulo")
            return f"{idx} % {max(1, min(extent, self.draw(st.integers(1, 4))))}"
        if form == "flip":
            self.feature("subscript flip")
            return f"{sym} - 1 - {idx}" if sym else f"{extent - 1} - {idx}"
        if form == "two" and len(self.cur.indices) > 1:
            other = self.pick(sorted(set(self.cur.indices) - {idx}))
            self.cur.used.add(other)
            self.cur.shifted.add(idx)
            self.feature("subscript two indices")
            return f"{idx} + {other}"
        if form == "gather":
            g = self.gather(extent)
            if g is not None:
                return g
        if extent == 0:
            return "0"
        self.feature("subscript constant")
        return str(self.draw(st.integers(0, extent - 1))) if not sym or self.chance(0.5) else f"{sym} - 1"

    def _dims_of(self, t: TensorInfo, d: int) -> tuple[str, ...]:
        p = next((p for p in self.params if p.name == t.name), None)
        return (p.dims[d],) if p else ()

    def gather(self, extent: int) -> str | None:
        idx = [t for t in self.tensors.values() if t.kind == "input" and t.values == "index"]
        if not idx or extent == 0:
            return None
        g = self.pick(idx)
        g.limit = min(g.limit, extent)
        subs = []
        for d in range(len(g.shape)):
            idxs = sorted(self.cur.indices) if self.cur else []
            if idxs and self.chance(0.8):
                n = self.pick(idxs)
                self.cur.used.add(n)
                self.cur.anchored.add(n)
                subs.append(n)
            else:
                subs.append(str(self.draw(st.integers(0, max(0, g.shape[d] - 1)))))
        self.feature("gather")
        text = g.name if not subs else f"{g.name}({', '.join(subs)})"
        if self.chance(0.2):
            text = f"({text} + 1) % {extent}"
            self.feature("gather modulo")
        return text

    def binary(self, op: str, a: Ex, b: Ex) -> Ex:
        prec = BIN_PREC[op]
        text = f"{a.at(prec)} {op} {b.at(prec + 1)}"
        if op in ("&&", "||") or prec in (P_EQ, P_REL):
            self.feature(f"op {op}")
            return Ex(text, "bool", prec, 1.0)
        t = T.promote(a.dtype, b.dtype)
        self.feature(f"op {op} {'float' if T.is_float(t) else 'int'}")
        ea, eb = a.abs_err(), b.abs_err()
        if op in "+-":
            bound = a.bound + b.bound
            err = ea + eb
        elif op == "*":
            bound = _mul(a.bound, b.bound)
            err = _mul(ea, b.bound) + _mul(eb, a.bound) + _mul(ea, eb)
        elif op == "/":
            bound = a.bound if not T.is_float(t) else INF
            err = 0.0 if ea == 0 and eb == 0 else INF
        else:
            bound = b.bound if not T.is_float(t) else a.bound if not T.is_float(b.dtype) and b.text.isdigit() \
                and b.text != "0" else INF
            err = 0.0 if ea == 0 and eb == 0 else INF
        err += _round_err(t, bound, err > 0)
        return Ex(text, t, prec, *_fix(t, bound, err))

    def unary(self, op: str, a: Ex) -> Ex:
        text = f"{op}{a.at(P_UNARY)}"
        if op == "!":
            self.feature("op !")
            return Ex(text, "bool", P_UNARY, 1.0)
        self.feature(f"op unary {op}")
        t = T.promote(a.dtype, a.dtype)
        return Ex(text, t, P_UNARY, *_fix(t, a.bound, a.err, a.rel))

    def ternary(self, c: Ex, a: Ex, b: Ex) -> Ex:
        t = a.dtype if a.dtype == b.dtype else T.promote(a.dtype, b.dtype)
        self.feature("ternary")
        return Ex(f"{c.at(P_OR)} ? {a.at(P_TERN)} : {b.at(P_TERN)}", t, P_TERN,
                  *_fix(t, max(a.bound, b.bound), max(a.abs_err(), b.abs_err())))

    def call(self, fn: str, args: list[Ex]) -> Ex:
        t = args[0].dtype
        for a in args[1:]:
            t = T.promote(t, a.dtype)
        if fn in ("min", "max", "abs"):
            t = "int32" if t == "bool" or (T.is_int(t) and T.bits(t) < 32) else t
        else:
            t = T.float_of(t)
        self.feature(f"builtin {fn}")
        text = f"{fn}({', '.join(a.text for a in args)})"
        return Ex(text, t, P_ATOM, *_fix(t, max(a.bound for a in args), max(a.abs_err() for a in args)))

    # math builtins: (name, arity, needs exact arguments, bound of the result from the argument's)
    def math_call(self, want: str, depth: int, exact: bool) -> Ex | None:
        if want in ("int", "bool"):
            return None
        smooth = {"exp": 20, "exp2": 20, "expm1": 20, "tanh": INF, "sigmoid": INF, "erf": INF, "atan": INF,
                  "sin": 100, "cos": 100, "sinh": 20, "cosh": 20, "asinh": INF, "fabs": INF, "fma": INF}
        rough = ("log", "log1p", "log2", "log10", "sqrt", "rsqrt", "cbrt", "tan", "asin", "acos", "acosh", "atanh",
                 "pow", "atan2", "floor", "ceil", "round", "trunc", "fmod")
        fn = self.pick(tuple(smooth) + rough)
        arity = 3 if fn == "fma" else 2 if fn in ("pow", "atan2", "fmod") else 1
        args = [self.expr(self.pick(("float", "float", "int")), depth - 1, exact=exact or fn in rough)
                for _ in range(arity)]
        if fn in smooth and args[0].bound > smooth[fn]:
            args = [self.literal("float") for _ in range(arity)]
        t = args[0].dtype
        for a in args[1:]:
            t = T.promote(t, a.dtype)
        t = T.float_of(t)
        u = UNIT[t]
        b0, e0 = args[0].bound, args[0].abs_err()
        self.feature(f"builtin {fn}")
        text = f"{fn}({', '.join(a.text for a in args)})"
        exact_fn = fn in ("floor", "ceil", "round", "trunc", "fmod", "sqrt", "fabs")
        if fn in ("exp", "exp2", "expm1", "sinh", "cosh"):
            bound = math.exp(b0)
            err = bound * e0
        elif fn in ("tanh", "sigmoid", "erf", "sin", "cos"):
            bound, err = 1.0, e0
        elif fn in ("atan", "asinh"):
            bound, err = max(2.0, b0), e0
        elif fn == "fabs":
            bound, err = b0, e0
        elif fn == "fma":
            bound = _mul(b0, args[1].bound) + args[2].bound
            err = _mul(e0, args[1].bound) + _mul(args[1].abs_err(), b0) + args[2].abs_err() + 2 * bound * u
        elif fn in ("floor", "ceil", "round", "trunc"):
            bound, err = b0 + 1, 0.0
        elif fn == "atan2":
            bound, err = 4.0, 0.0
        elif fn in ("log", "log1p", "log2", "log10", "asinh"):
            bound, err = (120.0 if t != "float64" else 750.0), 0.0
        else:
            bound, err = INF, 0.0
        if exact_fn and all(a.exact for a in args) and t != "float16":
            return Ex(text, t, P_ATOM, *_fix(t, bound, 0.0))
        if fn in ("fmod", "sqrt", "tan", "pow", "rsqrt", "cbrt", "asin", "acos", "acosh", "atanh", "atan2"):
            return Ex(text, t, P_ATOM, INF, 0.0, 8 * u)  # exact arguments: only the call's own ulps
        return Ex(text, t, P_ATOM, *_fix(t, bound, err + 8 * bound * u))

    def cast(self, want: str, depth: int) -> Ex | None:
        if want == "float":
            t = self.pick(("float32", "float64", "float"))
            a = self.expr("any", depth - 1)
            tt = T.canonical(t)
            self.feature("cast to float")
            err = a.abs_err() + _round_err(tt, a.bound, a.abs_err() > 0)
            return Ex(f"{t}({a.text})", tt, P_ATOM, *_fix(tt, a.bound, err))
        if want == "bool":
            a = self.expr("any", depth - 1, exact=True)
            self.feature("cast to bool")
            return Ex(f"bool({a.text})", "bool", P_ATOM, 1.0)
        t = self.pick(("int32", "int64", "int8", "int16", "uint8", "uint32", "uint64"))
        a = self.expr("any", depth - 1, exact=True)
        if T.is_float(a.dtype):
            limit = 100.0 if T.bits(t) < 32 else 2.0**30
            if T.is_unsigned(t) or not a.exact or not a.bound < limit:
                return None  # a float that does not fit: undefined behaviour in C
        self.feature(f"cast to {t}")
        return Ex(f"{t}({a.text})", t, P_ATOM, *_fix(t, a.bound if not T.is_unsigned(a.dtype) else INF, 0.0))

    # ---- statements ----
    cur_op: str = "="
    cur_lhs: tuple[str, ...] = ()

    def statement(self, number: int) -> bool:
        """Draw one statement and keep it when the def so far checks; False when none fitted."""
        for _ in range(4):
            saved = (dict(self.tensors), list(self.written), set(self.features),
                     {n: t.limit for n, t in self.tensors.items()})
            text, target, op, is_new = self._statement_text(number)
            self.stmts.append(text)
            try:
                ok = self._commit(target, op, is_new)
            except TcError:
                ok = False
            if ok:
                return True
            self.stmts.pop()
            self.tensors, self.written, self.features, limits = saved
            for n, lim in limits.items():
                self.tensors[n].limit = lim
        return False

    def _statement_text(self, number: int) -> tuple[str, str, str, bool]:
        existing = [n for n in self.written]
        pending_typed = [n for n in self.typed_outputs if n not in self.written]
        if pending_typed and (self.chance(0.6) or number == 1):
            target, is_new = pending_typed[0], True
        elif existing and self.chance(0.3):
            target, is_new = self.pick(sorted(existing)), False
        else:
            target, is_new = f"{self.pick(('T', 'O', 'tmp', 'Out'))}{number}", True
        t = self.tensors.get(target) or self.typed_info.get(target)
        rank = len(t.shape) if t is not None else self.draw(st.integers(0, 3))
        ops = ["=", "+=!", "+=!", "*=!", "min=!", "max=!"] + (["+=", "*=", "min=", "max="] * 2 if not is_new else [])
        op = self.pick(ops)
        lhs = LHS_INDICES[:rank]
        n_red = 0 if op == "=" else self.draw(st.integers(0, 2))
        red = RED_INDICES[:n_red]
        extents = {i: (t.shape[k] if t is not None else self.dim()[1]) for k, i in enumerate(lhs)}
        extents.update({r: self.dim()[1] for r in red})
        self.cur = _Stmt(extents, target)
        self.cur_op, self.cur_lhs = op, lhs
        kind = "any"
        if t is not None and not T.is_float(t.dtype):
            kind = "int" if t.dtype != "bool" else "bool"
        if op != "=" and kind == "bool":
            kind = "int"
        wheres: list[str] = []
        anchors: list[Ex] = []
        for i in (*lhs, *red):
            how = self.pick(("where", "read", "read", "exists") if i in red or t is None else ("where", "read"))
            if how == "where":
                wheres.append(self.where_range(i, extents[i], fixed=t is not None and i in lhs))
                continue
            a = self.anchor(i)
            if a is None:
                wheres.append(self.where_range(i, extents[i], fixed=t is not None and i in lhs))
            elif how == "exists":
                wheres.append(f"exists {a.text}")
                self.feature("where exists")
            else:
                anchors.append(a)
        depth = self.draw(st.integers(1, 4))
        rhs = self.expr(kind, depth) if kind != "any" else self.expr(self.pick(("float", "float", "int", "any")),
                                                                        depth)
        for a in anchors:
            if kind in ("int", "bool") and (T.is_float(a.dtype) or kind == "bool"):
                wheres.append(f"exists {a.text}")  # bounds the index without changing the value
                continue
            rhs = self.binary(self.pick("+*") if kind != "bool" else "+", rhs, a) if self.chance(0.5) \
                else self.call(self.pick(("min", "max")), [rhs, a])
        if kind == "int" and T.is_float(rhs.dtype):
            rhs = self.expr("int", 1)
        if kind == "bool" and rhs.dtype != "bool":
            rhs = self.expr("bool", 1)
        ranged = {w.split(" in ")[0] for w in wheres if " in " in w}
        for i in (*lhs, *red):
            loose = i not in self.cur.anchored or (i in lhs and i in self.cur.shifted)
            if i not in ranged and loose and (i in lhs or i in self.cur.used):
                wheres.append(self.where_range(i, extents[i], fixed=t is not None and i in lhs))
        for name, v in self.cur.lets.items():
            wheres.append(f"{name} = {v.text}")
        lhs_text = target if rank == 0 and self.chance(0.6) else f"{target}({', '.join(lhs)})"
        text = f"{lhs_text} {op} {rhs.text}"
        if wheres:
            text += " where " + ", ".join(wheres)
        self.feature(f"statement {op}" + (" rank0" if rank == 0 else ""))
        self.rhs = rhs
        self.cur = None
        return text, target, op, is_new

    def where_range(self, i: str, extent: int, fixed: bool) -> str:
        self.feature("where range")
        if fixed:
            sym = next((n for n, v in self.sizes.items() if v == extent), None)
            return f"{i} in 0:{sym if sym and self.chance(0.7) else extent}"
        hi = self.pick(("sym", "lit", "minus", "min")) if self.sizes else "lit"
        n = self.pick(sorted(self.sizes)) if self.sizes else ""
        text = {"sym": n, "lit": str(extent), "minus": f"{n} - 1", "min": f"min({n}, {extent})"}[hi]
        lo = "1" if self.chance(0.15) and i in RED_INDICES else "0"
        return f"{i} in {lo}:{text}"

    def anchor(self, i: str) -> Ex | None:
        """A read that bounds index ``i`` with a subscript whose range starts at 0."""
        cands = [t for t in self.tensors.values() if t.shape and (t.kind == "input" or t.name in self.written)
                 and t.name != self.cur.target]
        if not cands:
            return None
        t = self.pick(cands)
        d = self.draw(st.integers(0, len(t.shape) - 1))
        subs = []
        for k in range(len(t.shape)):
            subs.append(self.subscript(t, k, anchor=i) if k == d else self.subscript(t, k))
        self.cur.used.add(i)
        self.cur.anchored.add(i)
        return Ex(f"{t.name}({', '.join(subs)})", t.dtype, P_ATOM, t.bound, t.err)

    def _commit(self, target: str, op: str, is_new: bool) -> bool:
        """Check the def so far; record the new tensor's shape and the bounds of its values."""
        outs = list(dict.fromkeys([*self.written, target]))
        d = parse(self.text(outs)).defs[0]
        checked = check_def(d)
        inst = instantiate(checked, self.sizes)
        bs = inst.stmts[-1]
        stmt = bs.stmt
        k = 1
        for _, lo, hi in bs.ranges[len(stmt.lhs):]:
            k *= max(0, hi - lo)
        dtype = next(t.dtype for t in (*checked.outputs, *checked.temps) if t.name == target)
        shape = inst.shapes[target]
        rhs = self.rhs
        old = self.tensors.get(target)
        b, e = rhs.bound, rhs.abs_err()
        if T.is_float(dtype) and T.is_float(rhs.dtype) and T.bits(dtype) < T.bits(rhs.dtype):
            e = e + _round_err(dtype, b, e > 0)
        if not T.is_float(dtype) and T.is_float(rhs.dtype):
            limit = 100.0 if dtype == "bool" or T.bits(dtype) < 32 else 2.0**30
            if not (rhs.exact and b < limit) or T.is_unsigned(dtype):
                return False  # an out-of-range float to int conversion is undefined in C
        u = UNIT.get(dtype, 0.0)
        red = stmt.op
        if red == "+":
            bound = b * k
            err = k * e + (k * k * bound * u if T.is_float(dtype) else 0.0)
        elif red == "*":
            bk = _pow(max(b, 1.0), k)
            bound = bk
            err = (k * e * bk + k * k * u * bk) if T.is_float(dtype) else 0.0
        else:
            bound, err = b, e
        if T.is_float(dtype) and dtype == "float16":
            err += 2 * bound * u
        if old is not None and not is_new:
            if red in ("+", "*") and not stmt.init:
                bound = bound + old.bound if red == "+" else _mul(bound, max(old.bound, 1.0))
                err = err + _mul(old.err, 1.0 if red == "+" else _pow(max(b, 1.0), k))
            else:
                bound, err = max(bound, old.bound), max(err, old.err)
        bound, err, _ = _fix(dtype, bound, err)
        kind = "output" if target in self.typed_outputs else "temp"
        self.tensors[target] = TensorInfo(target, dtype, shape, bound, err, kind)
        if target not in self.written:
            self.written.append(target)
        return True

    def text(self, outputs: list[str]) -> str:
        params = ", ".join(f"{p.spelling}({', '.join(p.dims)}) {p.name}" if p.dims or p.parens
                           else f"{p.spelling} {p.name}" for p in self.params)
        outs = ", ".join(self.typed_outputs.get(o, o) for o in outputs)
        body = "\n".join(f"    {s}" for s in self.stmts)
        return f"def {self.name}({params}) -> ({outs}) {{\n{body}\n}}\n"


def _float_spellings(v: float) -> tuple[str, ...]:
    spell = {0.0: ("0.0", "0.", ".0", "0e0"), 0.5: ("0.5", ".5", "5e-1", "5.0E-1"), 0.25: ("0.25", ".25", "25e-2"),
             1.5: ("1.5", "15e-1"), 2.0: ("2.0", "2.", "2e0"), 3.0: ("3.0", "3.", "0.3e1"),
             0.1: ("0.1", "1e-1", ".1"), 1e-3: ("1e-3", "0.001", "1E-3"), 100.0: ("100.0", "1e2", "1.0e+2")}
    return spell[v]


@st.composite
def defs(draw: Any, allow_empty: bool = True) -> DefSpec:
    """A valid def of 1-4 statements over 1-4 params, with concrete sizes."""
    g = Gen(draw, allow_empty)
    g.name = draw(st.sampled_from(("f", "kernel", "fuzz_def", "conv", "g2")))
    for k in range(draw(st.integers(1, 4))):
        g.param(k)
    g.keep_used_sizes()
    if draw(st.booleans()):
        n = "Y"
        spelling = draw(st.sampled_from(("float", "double", "int32", "float32", "int64")))
        dims = [g.dim() for _ in range(draw(st.integers(0, 2)))]
        texts = ", ".join(d for d, _ in dims)
        g.typed_outputs[n] = f"{spelling}({texts}) {n}" if dims or draw(st.booleans()) else f"{spelling} {n}"
        g.typed_info[n] = TensorInfo(n, T.canonical(spelling), tuple(v for _, v in dims), 0.0, 0.0, "output")
        g.feature("typed output" + (" rank0" if not dims else ""))
    for k in range(draw(st.integers(1, 4))):
        g.statement(k + 1)
    for n in g.typed_outputs:
        assume(n in g.written)
    assume(g.written)
    written = list(g.written)
    outs = [n for n in written if n in g.typed_outputs or draw(st.booleans())] or [written[-1]]
    outs = draw(st.permutations(outs))
    temps = set(written) - set(outs)
    if temps:
        g.feature("temporary")
    text = g.text(list(outs))
    if draw(st.integers(0, 4)) == 0:
        text = f"# fuzzed def\n{text}".replace("\n    ", "\n    // a comment\n    ", 1)
        g.feature("comment")
    if draw(st.integers(0, 5)) == 0:  # a source of several defs: a library
        other = text.replace(f"def {g.name}(", f"def {g.name}_other(", 1)
        text = f"{other}\n{text}" if draw(st.booleans()) else f"{text}\n{other}"
        g.feature("several defs")
    for n in outs:
        g.tensors[n].kind = "output"
    return DefSpec(g.name, text, g.params, g.sizes, g.tensors, list(outs), g.features)


# ---- inputs ---------------------------------------------------------------------------------------


def _values(draw: Any, t: TensorInfo) -> np.ndarray:
    dt = np.dtype(t.dtype)
    n = int(np.prod(t.shape)) if t.shape else 1
    if t.dtype == "bool":
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif T.is_float(t.dtype):
        if t.values == "small":
            vals = [k / 4 for k in draw(st.lists(st.integers(-32, 32), min_size=n, max_size=n))]
        else:
            vals = draw(st.lists(st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=16
                                           if t.dtype == "float16" else 32), min_size=n, max_size=n))
    elif t.values == "index":
        oob = draw(st.integers(0, 9)) == 0
        lo, hi = (-1 if not T.is_unsigned(t.dtype) else 0, t.limit) if oob else (0, max(0, t.limit - 1))
        vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    elif t.values == "small":
        lo = 0 if T.is_unsigned(t.dtype) else -100
        vals = draw(st.lists(st.integers(lo, 100), min_size=n, max_size=n))
    else:
        info = np.iinfo(dt)
        vals = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
    return np.array(vals, dtype=dt).reshape(t.shape)


def _relaid(draw: Any, a: np.ndarray) -> np.ndarray:
    """The same values in another layout: a strided view, Fortran order or swapped bytes."""
    how = draw(st.sampled_from(("strided", "fortran", "swapped")))
    if how == "strided":
        big = np.zeros(tuple(2 * n for n in a.shape), dtype=a.dtype)
        view = big[tuple(slice(None, None, 2) for _ in a.shape)]
        view[...] = a
        return view
    if how == "fortran":
        return np.asfortranarray(a)
    return a.astype(a.dtype.newbyteorder("S"))


@dataclass
class Case:
    spec: DefSpec
    args: list[Any]

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        arrs = ", ".join(f"{p.name}={a!r}" for p, a in zip(self.spec.params, self.args))
        return f"Case(sizes={self.spec.sizes}, source=\n{self.spec.text}\nargs: {arrs})"


@st.composite
def cases(draw: Any, allow_empty: bool = True) -> Case:
    spec = draw(defs(allow_empty))
    args: list[Any] = []
    for p in spec.params:
        t = spec.tensors[p.name]
        a = _values(draw, t)
        if not t.shape and draw(st.integers(0, 3)) == 0:  # a Python scalar for a rank-0 param
            a = a.item() if t.dtype in ("float64", "int64", "bool") else a[()]
        elif t.shape and draw(st.integers(0, 4)) == 0:
            a = _relaid(draw, a)
        args.append(a)
    return Case(spec, args)


# ---- mutation -------------------------------------------------------------------------------------

TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|\+=!|\*=!|min=!|max=!|&&|\|\||"
                   r"[=!<>]=|->|.", re.S)
NOISE = list("(){},:;?!<>=+-*/%#.eE0123456789_ aZ\n\t\\\"'`@$~^|&[]") + ["\x00", "\x7f", "é", "∑", "\ufeff",
                                                                       "def", "where", "in", "exists"]


@st.composite
def mutants(draw: Any) -> tuple[str, DefSpec]:
    """The text of a valid def damaged 1-3 times: a token dropped, duplicated, swapped with
    another, replaced by noise, random characters inserted, a huge number, or truncated."""
    spec = draw(defs(allow_empty=False))
    toks = TOKEN.findall(spec.text)
    for _ in range(draw(st.integers(1, 3))):
        if not toks:
            break
        k = draw(st.integers(0, len(toks) - 1))
        op = draw(st.sampled_from(("drop", "dup", "swap", "noise", "insert", "number", "truncate", "name")))
        if op == "drop":
            del toks[k]
        elif op == "dup":
            toks.insert(k, toks[k])
        elif op == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[k], toks[j] = toks[j], toks[k]
        elif op == "noise":
            toks[k] = draw(st.sampled_from(NOISE))
        elif op == "insert":
            toks.insert(k, draw(st.text(min_size=1, max_size=4)))
        elif op == "number":
            toks.insert(k, draw(st.sampled_from(("99999999999999999999999999999", "2147483648", "-1", "0", "1e400",
                                                  "9223372036854775808", "4294967296", "1.5", "007"))))
        elif op == "name":
            toks[k] = draw(st.sampled_from(("N", "i", "r", "A", "exp", "float", "min", "T1", "Y", "j")))
        else:
            toks = toks[:k]
    return "".join(toks), spec


# ---- the oracle -----------------------------------------------------------------------------------

STATS: Counter[str] = Counter()
WARNED: dict[str, str] = {}  # warning class and first line -> the shortest source that raised it


def _located(e: TcError) -> bool:
    loc = e.location
    return loc is not None and loc.line >= 1 and loc.col >= 1 and f":{loc.line}:{loc.col}:" in str(e)


def _tc_error(e: TcError, where: str, src: str) -> str:
    name = type(e).__name__
    if not _located(e):
        raise FuzzFailure(f"{where}: {name} without a location: {e}\n--- source:\n{src}")
    return name


def define(src: str) -> Any:
    """``tc.define(src)``; a TcError passes through, anything else is a failure."""
    try:
        return tc.define(src)
    except TcError:
        raise
    except Exception as e:  # noqa: BLE001 - every foreign exception is what the fuzzer looks for
        raise FuzzFailure(f"define: {type(e).__name__}: {e}\n--- source:\n{src}") from e


def _unchanged(args: list[Any], before: list[Any], backend: str, src: str) -> None:
    for k, (a, b) in enumerate(zip(args, before)):
        if isinstance(a, np.ndarray) and not np.array_equal(a, b, equal_nan=True):
            raise FuzzFailure(f"backend={backend} changed input {k}\n--- source:\n{src}")


def _run(kernel: Any, args: list[Any], backend: str, src: str) -> Any:
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            res = kernel(*args, backend=backend)
    except TcError as e:
        _unchanged(args, before, backend, src)
        return e
    except Exception as e:  # noqa: BLE001
        raise FuzzFailure(f"backend={backend}: {type(e).__name__}: {e}\n--- source:\n{src}\nargs={args!r}") from e
    _unchanged(args, before, backend, src)
    for w in seen:  # counted, and kept with the shortest source that raised it
        key = f"{backend}: {w.category.__name__}: {str(w.message).splitlines()[0][:80]}"
        key = re.sub(r"'[^']*'|\(.*\)|[0-9]+", "_", key)
        STATS["warning " + key] += 1
        if key not in WARNED or len(src) < len(WARNED[key]):
            WARNED[key] = src
    return res if isinstance(res, tuple) else (res,)


def check_case(case: Case, run_c: bool = True) -> str:
    """Define and run ``case`` on the interpreter and (``run_c``) the C backend; the outcome's name."""
    src = case.spec.text
    try:
        kernel = define(src)
    except TcError as e:
        # valid defs may still be refused where the language forbids what was drawn: count it
        return "valid def refused: " + _tc_error(e, "define", src)
    if isinstance(kernel, tc.Library):
        kernel = kernel[case.spec.name]
    ref = _run(kernel, case.args, "numpy", src)
    if not run_c:
        return _outcome(ref, "numpy", src)
    got = _run(kernel, case.args, "c", src)
    if isinstance(ref, TcError) or isinstance(got, TcError):
        if type(ref) is not type(got):
            raise FuzzFailure(f"numpy gives {_desc(ref)} but C gives {_desc(got)}\n--- source:\n{src}\n"
                              f"args={case.args!r}")
        return "both raised " + _tc_error(ref, "run", src)
    for name, g, r in zip(case.spec.outputs, got, ref):
        _compare(name, g, r, case.spec.tensors[name], src, case.args)
    return "ran, C == numpy"


def _outcome(res: Any, backend: str, src: str) -> str:
    if isinstance(res, TcError):
        return f"{backend} raised " + _tc_error(res, "run", src)
    return f"ran on {backend}"


def _desc(r: Any) -> str:
    return f"{type(r).__name__}: {r}" if isinstance(r, Exception) else "results"


def _compare(name: str, got: Any, want: Any, t: TensorInfo, src: str, args: list[Any]) -> None:
    got, want = np.asarray(got), np.asarray(want)

    def fail(why: str) -> None:
        raise FuzzFailure(f"output '{name}' ({t.dtype}{list(t.shape)}): {why}\nC:      {got!r}\nnumpy:  {want!r}\n"
                          f"--- source:\n{src}\nargs={args!r}")

    if got.dtype != want.dtype or got.shape != want.shape:
        fail(f"C gives {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}")
    if not T.is_float(want.dtype.name) or t.err == 0:
        kind = "float" if T.is_float(want.dtype.name) else "integer/bool"
        STATS[f"compared outputs: {kind}, exactly"] += 1
        if not np.array_equal(got, want, equal_nan=want.dtype.kind == "f"):
            fail("values differ where both backends must agree bit for bit")
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        fail("NaN at different positions")
    inf = np.isinf(w)
    if not np.array_equal(inf, np.isinf(g)) or not np.array_equal(g[inf], w[inf]):
        fail("inf at different positions")
    if t.err == INF:
        STATS["compared outputs: float, NaN/inf positions only (no finite bound)"] += 1
        return
    STATS["compared outputs: float, within the carried bound"] += 1
    fin = np.isfinite(w)
    diff = np.abs(g[fin] - w[fin])
    if diff.size and diff.max() > 4 * t.err:
        fail(f"differ by {diff.max():.3g}, more than the bound {4 * t.err:.3g} (sum of |terms| times eps)")


def check_mutant(src: str, seed: int, run_c: bool = False) -> str:
    """A damaged text: a located TcError, or a def that runs; with ``run_c`` the C backend raises
    what the interpreter raises and, for a def without floats, gives the same integers."""
    try:
        kernel = define(src)
    except TcError as e:
        return "refused: " + _tc_error(e, "define", src)
    if isinstance(kernel, tc.Library):
        kernels = list(kernel)
    elif isinstance(kernel, tc.Kernel):
        kernels = [kernel]
    else:
        return "accepted as the short form"
    outcome = "accepted, ran"
    for k in kernels:
        args = args_for(k, seed)
        if args is None:
            return "accepted, sizes not drawn"
        ref = _run(k, args, "numpy", src)
        if isinstance(ref, TcError):
            outcome = "accepted, numpy raised " + _tc_error(ref, "run", src)
        if not run_c:
            continue
        got = _run(k, args, "c", src)
        if isinstance(ref, TcError) or isinstance(got, TcError):
            if type(ref) is not type(got):
                raise FuzzFailure(f"numpy gives {_desc(ref)} but C gives {_desc(got)}\n--- source:\n{src}\n"
                                  f"args={args!r}")
            continue
        floats = any(T.is_float(t.dtype) for t in (*k.checked.inputs, *k.checked.outputs, *k.checked.temps))
        if not floats and not re.search(r"[0-9][.eE]|\.[0-9]|float|double|exp|log|sqrt|sin|cos|tan|erf|pow|atan|cbrt|"
                                        r"floor|ceil|round|trunc|fm|sigmoid", src):
            for t, g, r in zip(k.checked.outputs, got, ref):
                if not np.array_equal(np.asarray(g), np.asarray(r)):
                    raise FuzzFailure(f"integer output '{t.name}' differs: C {g!r}, numpy {r!r}\n--- source:\n{src}"
                                      f"\nargs={args!r}")
            outcome += ", C == numpy"
    return outcome


def args_for(kernel: Any, seed: int) -> list[Any] | None:
    """Arguments for any checked def: sizes 1-4 (literal dims as written), small values drawn from
    ``seed``; None when a literal dim is too large to draw."""
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    out: list[Any] = []
    for t in kernel.checked.inputs:
        shape = []
        for d in t.dims:
            if d.is_const():
                if not 0 <= d.const <= 64:
                    return None
                shape.append(int(d.const))
            else:
                shape.append(sizes.setdefault(str(d), int(rng.integers(1, 5))))
        dt = np.dtype(t.dtype)
        if T.is_float(t.dtype):
            a = (rng.integers(-32, 33, size=shape) / 4).astype(dt)
        elif t.dtype == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        else:
            a = rng.integers(0, 2, size=shape).astype(dt)  # in range of every dim: gathers hold
        out.append(a)
    return out
