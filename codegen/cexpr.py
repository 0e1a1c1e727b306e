"""C expressions and statements: ``TExpr x env -> C text`` and one statement instance,
``LCall -> C lines``; the base class of the C emitter (codegen.c), and what the vector printers
(codegen.vecexpr, codegen.vectile, codegen.vecloop) print their scalar parts through.

Every identifier is generated (tensors ``t0..``, statement indices ``x0..``). Tensor accesses are
linearised with the call's element strides; gathers, conditional reads and integer division are
checked and report an error code (an ``ErrorSite``) instead of touching memory out of bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from tcdsl.core import dtypes as T
from tcdsl.core.affine import FloorDiv, MinMax, Mod, Sym, Var, bounds
from tcdsl.core.builtins import BUILTINS
from tcdsl.core.checked import (
    Binop,
    Call,
    Const,
    Convert,
    IndexVal,
    Read,
    Select,
    SizeVal,
    Statement,
    TExpr,
    Unop,
    operands,
    reads,
)
from tcdsl.core.printer import stmt as print_stmt
from tcdsl.polyhedral.cputarget import CpuTarget
from tcdsl.polyhedral.loopir import LCall, LExpr, LInt, LOp, LVar
from tcdsl.polyhedral.scatter import ATOMIC_DTYPES
from tcdsl.polyhedral.scop import Scop

from . import divide
from .facts import Facts
from .writer import LineWriter
from .writer import unparen as _top

CTYPE = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "_Float16", "float32": "float", "float64": "double",
}


@dataclass(frozen=True)
class ErrorSite:
    code: int
    kind: str  # "gather", "read", "division", "modulo", "memory" or "partials" (a buffer the kernel allocates)
    stmt: int  # TC statement number
    tensor: str
    dim: int
    span: object = field(compare=False, repr=False)


class ExprEmitter(Facts):
    """The emitter's state and what every printer of C text shares: expressions, accesses, one
    statement instance, error sites, and the parallel region around a loop."""

    ITYPE = "long"  # loop iterators and statement indices
    LONG = "L"  # suffix of stride literals (64-bit address arithmetic)
    TARGET = "c"  # whose builtin spellings (tcdsl.core.builtins) this emitter prints
    ATOMIC_SCATTERS = False  # a scatter's additions race with other threads' (the GPU mappings)

    def __init__(self, scop: Scop, strides: dict[str, tuple[int, ...]], target: CpuTarget | None = None,
                 vectorize: bool = True, vector_math: bool = False, unroll: int = 0) -> None:
        super().__init__(scop, strides, target, vectorize, vector_math, unroll)
        self.var = {name: f"t{i}" for i, name in enumerate(self.order)}
        self.sizes = {k: Sym.of(v) for k, v in scop.inst.sizes.items()}
        self.errors: list[ErrorSite] = []
        self.scalars: dict[str, str] = {}  # contracted temporaries in scope -> their C scalar
        self.vector_code = False  # explicit vector code written (vectile, vecloop)
        self.vector_tiles = False  # register tiles among it (vectile)
        self.mathlib: set[tuple[str, str]] = set()  # (tcdsl.codegen.mathlib function, type) the kernel calls
        # while a statement prints: its indices that are d*q + r (codegen.lower.run_over_quotients) -> (d, q, r)
        self.quotients: dict[str, tuple[int, str, int]] = {}
        self.folded: dict[str, str] = {}  # temporaries a pack copies from their source -> the source (codegen.c's run)
        self.w = LineWriter()

    def _itemsize(self, tensor: str) -> int:
        return int(np.dtype(self.tensors[tensor].dtype).itemsize)

    def _region_open(self, worksharing: str) -> None:
        """A parallel region whose threads first spread over the cores (the prelude's
        ``tc_spread``), then share the loop that follows by ``omp for`` with these clauses;
        ``_region_close`` ends it after the loop."""
        w = self.w
        w.line("{")
        w.push()
        w.line("const int tc_mc = tc_core();")
        w.line("#pragma omp parallel")
        w.line("{")
        w.push()
        w.line("tc_spread(tc_mc);")
        w.line(f"#pragma omp for {worksharing}")

    def _region_close(self) -> None:
        for _ in range(2):
            self.w.pop()
            self.w.line("}")

    def _lexpr(self, e: LExpr) -> str:
        if isinstance(e, LInt):
            return f"{e.value}L" if abs(e.value) >= 2**31 else str(e.value)
        if isinstance(e, LVar):
            return e.name
        assert isinstance(e, LOp)
        a = [self._lexpr(x) for x in e.args]
        op = e.op
        if op in ("+", "-", "*", "==", "<=", "<", ">=", ">", "&&", "||"):
            return "(" + f" {op} ".join(a) + ")"
        if op == "neg":
            return f"(-{a[0]})"
        if op == "?:":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op in ("min", "max"):
            return f"tc_l{op}({a[0]}, {a[1]})"
        if op == "floordiv":
            return f"floord({a[0]}, {a[1]})"
        if op == "div":
            return f"({a[0]} / {a[1]})"
        if op == "mod":
            return f"({a[0]} % {a[1]})"
        raise ValueError(op)

    # ---- statements ----
    def _call(self, n: LCall) -> None:
        self._statement_body(n, None)

    def _statement_body(self, n: LCall, acc: str | None, nan_flag: str | None = None) -> None:
        """One statement instance; with ``acc``, the reduction target is that local variable; with
        ``nan_flag``, a min/max reduction is written so OpenMP can vectorise it, NaNs being
        recorded in the flag (numpy's min and max propagate NaN)."""
        st = self.scop.stmt(n.stmt)
        s = self.scop.tc_statement(st.name)
        w = self.w
        w.line(f"{{  // {'init of ' if st.kind == 'init' else ''}statement {s.number} (line {s.span.line}): "
               f"{print_stmt(s.source)}")
        with w.indent():
            env: dict[str, str] = {}
            scatter = s.scatter if st.kind == "update" else None
            self.quotients = {}
            for k, (name, arg) in enumerate(zip(st.indices, n.args)):
                env[name] = f"x{k}"
                if scatter is None or name != scatter[0]:
                    w.line(f"const {self.ITYPE} x{k} = {_top(self._lexpr(arg))};")
                group = _group_of(arg)
                if group is not None:
                    self.quotients[f"x{k}"] = group
            if scatter is not None:  # the index the data names; the equality holds nowhere outside its range
                x = env[scatter[0]]
                w.line(f"const {self.ITYPE} {x} = (long){self._expr(scatter[1], env, s)};")
                lo, hi = next((lo, hi) for i, lo, hi in self.scop.bound_statement(st.name).ranges if i == scatter[0])
                w.line(f"if ({x} >= {lo}L && {x} < {hi}L) {{")
                w.push()
            target = acc or self.scalars.get(s.tensor) or \
                self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env)
            ctype = CTYPE[self.tensors[s.tensor].dtype]
            if st.kind == "init":
                w.line(f"{target} = {literal(T.identity(s.op, self.tensors[s.tensor].dtype), ctype)};")
            else:
                rhs = self._expr(s.rhs, env, s)
                dtype = self.tensors[s.tensor].dtype
                if scatter is not None and self.ATOMIC_SCATTERS and dtype in ATOMIC_DTYPES:
                    w.line(f"tc_atomic_add_{dtype}(&{target}, {rhs});")  # other threads add to it too
                elif s.op == "=":
                    w.line(f"{target} = {rhs};")
                elif s.op == "+" and _is_product(s.rhs):
                    # a contraction: one fused multiply-add per point (no other contraction happens)
                    assert isinstance(s.rhs, Binop)
                    a, b = self._expr(s.rhs.lhs, env, s), self._expr(s.rhs.rhs, env, s)
                    w.line(f"{target} = fma{'f' if s.rhs.dtype == 'float32' else ''}({a}, {b}, {target});")
                elif s.op == "+":
                    w.line(f"{target} = {target} + {rhs};")
                elif s.op == "*":
                    w.line(f"{target} = {target} * {rhs};")
                elif nan_flag is not None:
                    cmp = ">" if s.op == "max" else "<"
                    w.line(f"const {ctype} v = {rhs};")
                    w.line(f"{target} = v {cmp} {target} ? v : {target};")
                    if T.is_float(self.tensors[s.tensor].dtype):
                        w.line(f"{nan_flag} |= (v != v);")
                else:
                    w.line(f"{target} = tc_{s.op}({target}, {rhs});")
            if scatter is not None:
                w.pop()
                w.line("}")
        w.line("}")
        self.quotients = {}  # (the next statement sets its own)

    def _access(self, tensor: str, subs: tuple[Sym, ...], env: dict[str, str],
                checked: list[str] | None = None) -> str:
        if tensor in self.folded:  # T(i, j) = S(j, i), read from S (LPack.source)
            return self._access(self.folded[tensor], subs[::-1], env, None if checked is None else checked[::-1])
        if tensor in self.rows:
            return self._row_access(tensor, subs, env, checked)
        strides = self.strides[tensor]
        terms = []
        for d, sub in enumerate(subs):
            text = checked[d] if checked is not None else self._sym(sub, env)
            if strides[d] != 0:
                terms.append(f"{text} * {strides[d]}{self.LONG}" if strides[d] != 1 else text)
        return f"{self.var[tensor]}[{' + '.join(terms) or '0'}]"

    def _row_access(self, tensor: str, subs: tuple[Sym, ...], env: dict[str, str],
                    checked: list[str] | None) -> str:
        fixed = self.rows[tensor]
        shape = self.shapes[tensor]
        terms, stride = [], 1
        for d in reversed(range(len(subs))):
            if d in fixed:
                continue
            text = checked[d] if checked is not None else self._sym(subs[d], env)
            terms.append(f"{text} * {stride}L" if stride != 1 else text)
            stride *= shape[d]
        return f"r{self.order.index(tensor)}[{' + '.join(reversed(terms)) or '0'}]"

    def _sym(self, s: Sym, env: dict[str, str]) -> str:
        s = s.subs(self.sizes)
        parts = [str(s.const)] if s.const or not s.terms else []
        for a, c in s.terms:
            parts.append(f"{c} * {self._atom(a, env)}" if c != 1 else self._atom(a, env))
        return "(" + " + ".join(parts) + ")"

    def _atom(self, a: object, env: dict[str, str]) -> str:
        if isinstance(a, Var):
            return env[a.name]
        if isinstance(a, FloorDiv):
            if len(a.num.terms) == 1 and a.num.terms[0][1] == 1 and isinstance(a.num.terms[0][0], Var):
                group = self.quotients.get(env.get(a.num.terms[0][0].name, ""))
                if group is not None and group[0] == a.den:  # (d*q + r + c) / d = q + (r + c) / d, exactly
                    d, q, r = group
                    extra = (r + a.num.const) // d
                    return f"({q} + {extra})" if extra else q
            return f"tc_fdiv({self._sym(a.num, env)}, {a.den})"
        if isinstance(a, Mod):
            return f"tc_fmod({self._sym(a.num, env)}, {a.den})"
        assert isinstance(a, MinMax)
        out = self._sym(a.args[-1], env)
        for x in reversed(a.args[:-1]):
            out = f"tc_l{a.op}({self._sym(x, env)}, {out})"
        return out

    def _site(self, kind: str, s: Statement, tensor: str, dim: int, span: object) -> int:
        code = len(self.errors) + 1
        self.errors.append(ErrorSite(code, kind, s.number, tensor, dim, span))
        return code

    def _expr(self, e: TExpr, env: dict[str, str], s: Statement) -> str:
        ct = CTYPE[e.dtype]
        if isinstance(e, Const):
            return literal(e.value, ct)
        if isinstance(e, IndexVal):
            return f"(({ct}){env[e.name]})"
        if isinstance(e, SizeVal):
            return f"(({ct}){self.scop.inst.sizes[e.name]})"
        if isinstance(e, Read):
            return self._read(e, env, s)
        if isinstance(e, Convert):
            inner = self._expr(e.arg, env, s)
            if e.dtype == "bool":
                return f"({inner} != 0)"
            return f"(({ct}){inner})"
        if isinstance(e, Unop):
            return f"(!{self._expr(e.arg, env, s)})" if e.op == "!" else f"(({ct})-{self._expr(e.arg, env, s)})"
        if isinstance(e, Select):
            cond, then, other = (self._expr(x, env, s) for x in (e.cond, e.then, e.other))
            if self.TARGET == "c" and self._loads_anyway(e, s):
                # both values computed before the choice: loads the compiler cannot prove safe stay
                # loads and a blend, not masked loads or a branch (a pooling gradient's share)
                return (f"({{ const {ct} tc_then = {then}; const {ct} tc_else = {other}; "
                        f"({cond}) ? tc_then : tc_else; }})")
            return f"({cond} ? {then} : {other})"
        if isinstance(e, Binop):
            a, b = self._expr(e.lhs, env, s), self._expr(e.rhs, env, s)
            if e.op in ("/", "%") and T.is_int(e.lhs.dtype):
                code = self._site("division" if e.op == "/" else "modulo", s, "", 0, e.span)
                if T.is_unsigned(e.lhs.dtype):  # floor and truncation agree; keep the full unsigned range
                    return f"(({ct})({a} {e.op} ({ct})tc_unz({b}, {code}, tc_err)))"
                f = "tc_fdiv" if e.op == "/" else "tc_fmod"
                return f"(({ct}){f}((long){a}, tc_nz((long){b}, {code}, tc_err)))"
            if e.op == "%":
                return f"fmod{'f' if e.dtype == 'float32' else ''}({a}, {b})"
            if e.op == "/" and e.dtype in ("float32", "float64"):
                r = divide.of_divisor(e.rhs, self.scop.inst.sizes, False)  # scalar code: powers of two only
                if r is not None and r.exact:
                    return f"(({ct})({a} * {literal(r.hi, ct)}))"
            if e.op in ("&&", "||") and self._pure(e.lhs, s) and self._pure(e.rhs, s):
                # both sides are safe to evaluate: no branch (GCC 12 mis-vectorises some && / || chains)
                return f"((bool){a} {e.op[0]} (bool){b})"
            if e.op in ("&&", "||", "==", "!=", "<", "<=", ">", ">="):
                return f"({a} {e.op} {b})"
            return f"(({ct})({a} {e.op} {b}))"
        if isinstance(e, Call):
            return self._builtin(e, [self._expr(x, env, s) for x in e.args])
        raise TypeError(e)

    def _loads_anyway(self, e: Select, s: Statement) -> bool:
        """Whether a choice reads a tensor in a branch and both branches are small, hold no choice
        and are pure (``_pure``): then evaluating both cannot fail or leave a tensor, and costs
        little. (A nest of choices keeps the plain form, and is looked at in constant time.)"""
        if not (_small(e.then) and _small(e.other)):
            return False
        return bool(reads(e.then) or reads(e.other)) and self._pure(e.then, s) and self._pure(e.other, s)

    def _pure(self, e: TExpr, s: Statement) -> bool:
        """No check can fail while evaluating ``e``: no gather, no conditional read that may leave
        its tensor, no integer division."""
        if isinstance(e, Read):
            if not all(isinstance(x, Sym) for x in e.subs):
                return False
            if not e.conditional:
                return True
            box = {r.name: (r.lo.subs(self.sizes), r.hi.subs(self.sizes)) for r in s.ranges}
            shape = self.shapes[e.tensor]
            return all(_inside(x.subs(self.sizes), box, shape[d]) for d, x in enumerate(e.subs)
                       if isinstance(x, Sym))
        if isinstance(e, Binop):
            if e.op in ("/", "%") and T.is_int(e.lhs.dtype):
                return False
            return self._pure(e.lhs, s) and self._pure(e.rhs, s)
        if isinstance(e, (Unop, Convert)):
            return self._pure(e.arg, s)
        if isinstance(e, Select):
            return all(self._pure(x, s) for x in (e.cond, e.then, e.other))
        if isinstance(e, Call):
            return all(self._pure(a, s) for a in e.args)
        return True

    def _read(self, e: Read, env: dict[str, str], s: Statement) -> str:
        if e.tensor in self.scalars:
            return self.scalars[e.tensor]
        if id(e) in self.hoisted:
            return self.hoisted[id(e)]
        shape = self.shapes[e.tensor]
        box = {r.name: (r.lo.subs(self.sizes), r.hi.subs(self.sizes)) for r in s.ranges}
        texts, checks = [], []
        for d, sub in enumerate(e.subs):
            if isinstance(sub, Sym):
                text = self._sym(sub, env)
                if e.conditional and not _inside(sub.subs(self.sizes), box, shape[d]):
                    code = self._site("read", s, e.tensor, d, e.span)
                    text = f"tc_chk({text}, {shape[d]}L, {code}, tc_err)"
                    checks.append(d)
            elif (id(e), d) in self.gathered:  # checked before the loop (_hoist_gathers)
                text = self.gathered[(id(e), d)]
                checks.append(d)
            else:
                # a subscript computed from tensor values (a gather) or from indices (``j / R``)
                code = self._site("gather" if reads(sub) else "read", s, e.tensor, d, e.span)
                text = f"tc_chk((long){self._expr(sub, env, s)}, {shape[d]}L, {code}, tc_err)"
                checks.append(d)
            texts.append(text)
        access = self._access(e.tensor, tuple(Sym.of(0) for _ in e.subs), env, checked=texts)
        # a dim of stride 0 (broadcast, or an empty tensor) leaves the address: its check still runs
        unaddressed = [texts[d] for d in checks if self.strides[e.tensor][d] == 0 and e.tensor not in self.rows]
        return f"({', '.join(unaddressed)}, {access})" if unaddressed else access

    def _builtin(self, e: Call, a: list[str]) -> str:
        """A call of a builtin, spelled for this emitter's target (``tcdsl.core.builtins``); a function
        of tcdsl's math library is noted for the prelude."""
        b, t = BUILTINS[e.fn], e.dtype
        if not T.is_float(t):
            assert b.c_int is not None, e.fn
            return b.c_int.format(*a)
        template = b.spelling(self.TARGET, t)
        self.mathlib.update((m, t) for m in _LIBRARY_CALL.findall(template))
        if t == "float32":  # float32 exp has a vector variant (vector_exp); the template, not the
            template = _EXPF.sub("TC_EXPF(", template)  # call, as the arguments are long when nested
        call = template.format(*a, f="f" if t in ("float32", "float16") else "", one=literal(1.0, CTYPE[t]),
                               zero=literal(0.0, CTYPE[t]))
        return f"(({CTYPE[t]}){call})" if t == "float16" else call


_LIBRARY_CALL = re.compile(r"\b(tc_\w+)\{f\}")
_EXPF = re.compile(r"\bexp\{f\}\(")


def _is_product(e: TExpr) -> bool:
    return isinstance(e, Binop) and e.op == "*" and e.dtype in ("float32", "float64")


def _inside(sub: Sym, box: dict[str, tuple[Sym, Sym]], extent: int) -> bool:
    lo, hi = bounds(sub, box)
    return lo.is_const() and hi.is_const() and lo.const >= 0 and hi.const < extent


def literal(v: object, ctype: str) -> str:
    if ctype in ("float", "double", "_Float16"):
        x = float(v)  # type: ignore[arg-type]
        with np.errstate(over="ignore"):  # rounded to the type first: 70000 is inf in float16
            x = float({"float": np.float32, "_Float16": np.float16}.get(ctype, np.float64)(x))
        if math.isnan(x):
            return "NAN"
        if math.isinf(x):
            return "INFINITY" if x > 0 else "(-INFINITY)"
        if ctype == "float":
            return f"{x.hex()}f"
        if ctype == "_Float16":
            return f"((_Float16){x.hex()})"
        return x.hex()
    if ctype == "bool":
        return "true" if v else "false"
    iv = int(v)  # type: ignore[call-overload]
    if ctype in ("uint64_t",):
        return f"{iv}UL"
    if ctype == "int64_t" or abs(iv) >= 2**31:
        return f"({iv}L)" if iv != -(2**63) else "(-9223372036854775807L - 1)"
    if iv == -(2**31):
        return "(-2147483647 - 1)"
    return f"(({ctype}){iv})" if ctype not in ("int32_t",) else (str(iv) if iv >= 0 else f"({iv})")


SMALL_BRANCH = 32  # nodes: the largest branch a choice computes before it chooses (_loads_anyway)


def _small(e: TExpr) -> bool:
    """``e`` has at most SMALL_BRANCH nodes and no choice."""
    todo, seen = [e], 0
    while todo:
        x = todo.pop()
        seen += 1
        if seen > SMALL_BRANCH or isinstance(x, Select):
            return False
        todo.extend(operands(x))
        if isinstance(x, Read):
            todo.extend(sub for sub in x.subs if isinstance(sub, TExpr))
    return True


def _group_of(e: LExpr) -> tuple[int, str, int] | None:
    """``(d, q, r)`` where a statement index is ``d*q + r``, ``q`` a loop's variable and ``d`` >= 2
    (codegen.lower.run_over_quotients); its quotients by ``d`` print as ``q`` plus a constant."""
    r = 0
    if isinstance(e, LOp) and e.op == "+" and len(e.args) == 2:
        head, tail = e.args
        if isinstance(tail, LInt):
            e, r = head, tail.value
    if not (isinstance(e, LOp) and e.op == "*" and len(e.args) == 2):
        return None
    d, q = e.args
    if isinstance(d, LInt) and isinstance(q, LVar) and d.value >= 2:
        return d.value, q.name, r
    return None


def index_names(e: TExpr) -> set[str]:
    """The statement indices ``e`` uses, in its values and in the subscripts of its reads."""
    out: set[str] = set()
    if isinstance(e, IndexVal):
        out.add(e.name)
    elif isinstance(e, Read):
        for x in e.subs:
            out |= x.indices() if isinstance(x, Sym) else index_names(x)
    else:
        for kid in operands(e):
            out |= index_names(kid)
    return out
