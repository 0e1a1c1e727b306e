"""Vector expressions: ``TExpr x row -> bool``, whether a statement's value has a form in the
target's explicit vectors along that index, and ``TExpr -> C text``, that form (codegen.vecisa's
spelling); shared by the register tiles (codegen.vecplan, codegen.vectile) and the pointwise loops
(codegen.vecloop)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tcdsl.core.affine import Sym, Var
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
    convert,
    operands,
    read_tuple,
)
from tcdsl.polyhedral.loopir import LExpr, LInt, LOp, LVar, expr_vars, sum_terms

from . import divide
from .cexpr import ExprEmitter
from .facts import Facts
from .vecisa import half_type, vector_type

VECTOR_DTYPES = ("float32", "float64")  # pointwise loops and tiles
TILE_SUMS = ("int32",)  # sum and product tiles only: + - * wrap in vectors as in the scalar code, exactly
OPS = {"+": "+", "-": "-", "*": "*"}
LOOP_OPS = {**OPS, "/": "/"}  # a pointwise loop divides too (a tile's sum of quotients does not)
REDUCTIONS = ("+", "*", "max", "min")
LOOP_CALLS = ("exp", "tanh", "log", "sigmoid")  # float32 builtins with a vector form (codegen.vecisa)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")  # a pointwise loop's ?: selects lanes on these
# A pointwise loop calls the layer's tanh and log, written out, even where glibc's libmvec has
# vector variants: they are as fast or faster there and more accurate (16M elements of f(A*B + C),
# 2 threads: tanh AVX2 15.3 against 21.8 ms, AVX-512 8.4 against 9.0; log 0.82 ulp against 3.9, at
# the same speed), and libmvec's take a scalar path for a whole vector when one lane is special:
# log of inputs with negatives (NaN lanes) ran 4 to 6x slower (AVX2 51.6 against 12.8 ms).


def libmvec_exp(em: Facts) -> bool:
    """Whether ``exp`` loops call libmvec's vector expf rather than the layer's: on AVX2 and older,
    libmvec's is the faster (0.41 against 0.55 ns per element; SSE2 0.89 against 1.31; softmax
    4096x1024 1.92 against 2.25 ms on 2 threads); on AVX-512 the layer's, with vscalefps (0.22
    against 0.31). Such a loop keeps its simd form unless it prefetches (codegen.vecloop.plan):
    written out, it calls libmvec's vector function by name (``tc_vf_mvexp``, codegen.cprelude.mvexp_decl)."""
    return em.vector_math and em.target.isa != "avx512"


def moving_exp(em: Facts, e: TExpr, s: Statement, row: str) -> bool:
    """Whether ``e`` calls ``exp`` on values that move along ``row`` (a vector call, not a broadcast)."""
    if isinstance(e, Call) and e.fn == "exp" and not uniform(em, e, s, row, True):
        return True
    return any(moving_exp(em, x, s, row) for x in operands(e))


def half_expr(e: TExpr) -> bool:
    """``e`` has only what half vectors have: reads, constants, negation, ``+ - *``."""
    if isinstance(e, (Read, Const)):
        return True
    if isinstance(e, Binop):
        return e.op in OPS and half_expr(e.lhs) and half_expr(e.rhs)
    return isinstance(e, Unop) and e.op == "-" and half_expr(e.arg)


def plus_var(e: LExpr, var: str) -> bool:
    """``e`` is ``var``, or ``var`` plus or minus terms without it (``(c2 + var) + 1``)."""
    if isinstance(e, LOp) and e.op == "-" and len(e.args) == 2:
        return plus_var(e.args[0], var) and var not in expr_vars(e.args[1])
    terms = sum_terms(e)
    return terms.count(LVar(var)) == 1 and not any(var in expr_vars(t) for t in terms if t != LVar(var))


def vector_expr(em: Facts, e: TExpr, s: Statement, row: str, loop: bool = False, gather: bool = False) -> bool:
    """``e`` is reads, constants, negation, ``+``, ``-``, ``*`` and float ``max``/``min`` of the
    statement's type (float32 or float64; int32 in a tile), and each read is contiguous along the
    row or does not move with it. In a pointwise loop (``loop``) also ``/``, float32 ``sigmoid``,
    ``tanh``, ``log`` and ``exp`` (LOOP_CALLS; libmvec's exp where it is the faster, libmvec_exp),
    values hoisted out of the loop, contracted scalars and row buffers; a register tile reads neither its
    own target nor a buffer it does not index in memory. With ``gather``, reads along the row may
    be any constant number of elements apart (within 32-bit offsets)."""
    if e.dtype != em.tensors[s.tensor].dtype or e.dtype not in VECTOR_DTYPES + (() if loop else TILE_SUMS):
        return False
    e = _lift(e)
    if isinstance(e, Const) or fixed_value(e):
        return True
    if isinstance(e, Binop):
        return (e.op in (LOOP_OPS if loop else OPS) and vector_expr(em, e.lhs, s, row, loop, gather)
                and vector_expr(em, e.rhs, s, row, loop, gather))
    if isinstance(e, Unop):
        return e.op == "-" and vector_expr(em, e.arg, s, row, loop, gather)
    if isinstance(e, Call) and e.fn in ("max", "min"):  # the layer's, with tc_max/tc_min's bits
        return e.dtype in VECTOR_DTYPES and all(vector_expr(em, a, s, row, loop, gather) for a in e.args)
    if isinstance(e, Call) and loop and e.fn in LOOP_CALLS and e.dtype == "float32" and \
            vector_expr(em, e.args[0], s, row, loop):
        return True
    if isinstance(e, Select) and loop and isinstance(e.cond, Binop) and e.cond.op in COMPARISONS and \
            all(vector_expr(em, x, s, row, loop) for x in (e.cond.lhs, e.cond.rhs, e.then, e.other)):
        return True  # a pointwise loop's ?: on a comparison of its values: both sides, then a select
    if isinstance(e, (Call, Convert, Select)):
        return uniform(em, e, s, row, loop)
    if isinstance(e, Read):
        if loop and (id(e) in em.hoisted or e.tensor in em.scalars):
            return True
        if not loop and (e.tensor == s.tensor or e.tensor in em.scalars or e.tensor in em.rows):
            return False
        if e.conditional and not (loop and _in_range(e, s)) or not all(isinstance(x, Sym) for x in e.subs):
            return False
        step = elem_step(em, e.tensor, syms(e), row)
        if gather and step is not None and e.tensor not in em.rows:
            return abs(step) * em.target.lanes(e.dtype) < 2**31
        return step in (0, 1)
    return False


def uniform(em: Facts, e: TExpr, s: Statement, row: str, loop: bool) -> bool:
    """``e`` does not change along ``row`` (reads that do not move with it, other indices, sizes,
    constants): vectors compute it in scalar code, as the scalar loop does, and broadcast it
    (layernorm's ``rsqrt(var(n) + eps)`` along ``d``). Integer division is left out: its checks
    belong to the scalar code's own evaluation. A register tile (not ``loop``) reads memory only,
    not its own target."""
    if isinstance(e, (Const, SizeVal)):
        return True
    if isinstance(e, IndexVal):
        return e.name != row
    if isinstance(e, Read):
        if loop and (id(e) in em.hoisted or e.tensor in em.scalars):
            return True
        if not loop and (e.tensor == s.tensor or e.tensor in em.scalars or e.tensor in em.rows):
            return False
        return not e.conditional and all(isinstance(x, Sym) for x in e.subs) and \
            elem_step(em, e.tensor, syms(e), row) == 0
    if isinstance(e, Binop):
        return not (e.op in ("/", "%") and e.lhs.dtype not in VECTOR_DTYPES) and \
            uniform(em, e.lhs, s, row, loop) and uniform(em, e.rhs, s, row, loop)
    if isinstance(e, (Unop, Convert)):
        return uniform(em, e.arg, s, row, loop)
    if isinstance(e, Call):
        return all(uniform(em, a, s, row, loop) for a in e.args)
    if isinstance(e, Select):
        return all(uniform(em, x, s, row, loop) for x in (e.cond, e.then, e.other))
    return False


def _lift(e: TExpr) -> TExpr:
    """A conversion of a ``?:`` between two constants (a float64 statement's ``c ? 1.0 : 0.0``, whose
    literals are float32) as the ``?:`` between the converted constants: the same values."""
    if isinstance(e, Convert) and isinstance(e.arg, Select) and isinstance(e.arg.then, Const) and \
            isinstance(e.arg.other, Const):
        return Select(e.dtype, e.arg.cond, convert(e.arg.then, e.dtype), convert(e.arg.other, e.dtype))
    return e


def _in_range(e: Read, s: Statement) -> bool:
    """A read in a branch of ``?:`` (``conditional``: checked where the branch runs) at the
    subscripts of an unconditional read of the same tensor, which bounds the statement's domain:
    in range at every point, so a vector may load it whichever branch each lane takes."""
    return any(not r.conditional and r.tensor == e.tensor and r.subs == e.subs for r in read_tuple(s.rhs))


def fixed_value(e: TExpr) -> bool:
    """``e`` is a size or constant converted to the statement's type (``X(n, d) / D``), the same
    value in every lane."""
    return isinstance(e, Convert) and isinstance(e.arg, (SizeVal, Const))


def elem_step(em: Facts, tensor: str, subs: tuple[Sym, ...], row: str) -> int | None:
    """Elements of ``tensor``'s buffer (its memory, or the row buffer of a temporary) between
    ``subs`` at one value of ``row`` and the next; None if not linear in ``row``."""
    v = Var(row, "index")
    if tensor in em.rows:
        fixed, shape = em.rows[tensor], em.shapes[tensor]
        strides, stride = [0] * len(shape), 1
        for d in reversed(range(len(shape))):
            if d not in fixed:
                strides[d], stride = stride, stride * shape[d]
    else:
        strides = list(em.strides[tensor])
    step = 0
    for d, sub in enumerate(subs):
        if row in sub.without(v).indices():
            return None
        step += sub.coeff(v) * strides[d]
    return step


def vexpr(em: ExprEmitter, e: TExpr, env: dict[str, str], s: Statement, row: str,
          loads: dict[str, str] | None = None, lane: int | None = None, half: bool = False) -> str:
    """``e`` as a vector expression (codegen.vecisa); with ``loads``, each distinct load or
    broadcast is named there once (``load text -> local``) and the expression uses the names;
    ``lane``: the vector's offset in its tile row, where a read comes from packed panels; ``half``:
    in half vectors (``half_expr``), each broadcast the lower half of the full vectors' one."""
    v = vector_type(e.dtype)
    h = half_type(e.dtype) if half else v
    e = _lift(e)
    if isinstance(e, Const) or fixed_value(e):
        return f"{h}_set1({em._expr(e, env, s)})"
    if isinstance(e, Binop):
        a = vexpr(em, e.lhs, env, s, row, loads, lane, half)
        # a quotient whose dividend does not move along the row (``1.0 / D``) is folded or hoisted by GCC
        moves = e.op == "/" and not half and not uniform(em, e.lhs, s, row, True)
        r = divide.of_divisor(e.rhs, em.scop.inst.sizes, em.target.fma) if moves else None
        if r is not None and r.exact:
            return f"({a} * {v}_set1({em._expr(Const(e.dtype, r.hi), env, s)}))"
        if r is not None:
            values = ", ".join(em._expr(Const(e.dtype, x), env, s) for x in (r.divisor, r.hi, r.lo, *r.window))
            return f"tc_vf_divc({a}, {values})"
        b = vexpr(em, e.rhs, env, s, row, loads, lane, half)
        return f"({a} {LOOP_OPS[e.op]} {b})"
    if isinstance(e, Unop):
        return f"(-{vexpr(em, e.arg, env, s, row, loads, lane, half)})"
    if isinstance(e, Call) and e.fn in ("max", "min"):
        return f"{v}_{e.fn}({', '.join(vexpr(em, a, env, s, row, loads, lane) for a in e.args)})"
    if isinstance(e, Select) and not uniform(em, e, s, row, True):  # a comparison's lanes select
        assert isinstance(e.cond, Binop)
        a, b, then, other = (vexpr(em, x, env, s, row, loads, lane, half)
                             for x in (e.cond.lhs, e.cond.rhs, e.then, e.other))
        return f"{v}_select(({v}i)({a} {e.cond.op} {b}), {then}, {other})"
    if isinstance(e, (Convert, Select)) or isinstance(e, Call) and (
            e.fn not in LOOP_CALLS or e.dtype != "float32" or uniform(em, e, s, row, True)):
        return f"{h}_set1({em._expr(e, env, s)})"  # vector_expr's uniform(): once in scalar code, broadcast
    if isinstance(e, Call):
        arg = vexpr(em, e.args[0], env, s, row, loads, lane)
        if e.fn == "sigmoid":  # as the scalar builtin: 1 / (1 + exp(-x))
            return f"(tc_vf_set1(1.0f) / (tc_vf_set1(1.0f) + tc_vf_exp(-{arg})))"
        if e.fn == "exp" and libmvec_exp(em):  # the simd loop's function, by name: the same bits
            return f"tc_vf_mvexp({arg})"
        return f"tc_vf_{e.fn}({arg})"
    assert isinstance(e, Read)
    if e.conditional:  # vector_expr's _in_range: the unconditional read's element, unchecked
        e = replace(e, conditional=False)
    if id(e) in em.packed and lane is not None:  # codegen.pack's pack pass: from the panels
        at = f"{em.packed[id(e)]}{lane}]"
        return _named(f"{h}_load(&{at})", True, loads)
    at = em._read(e, env, s)
    step = None if id(e) in em.hoisted or e.tensor in em.scalars else elem_step(em, e.tensor, syms(e), row)
    if step == 1:
        return _named(f"{h}_load(&{at})", True, loads)
    if step:  # vector_expr allowed it: a tile with a strided row (never in half vectors)
        return _named(f"{v}_gather(&{at}, {step})", True, loads)
    broadcast = _named(f"{v}_set1({at})", False, loads)
    return f"{h}_lo({broadcast})" if half else broadcast


def _named(text: str, along: bool, loads: dict[str, str] | None) -> str:
    """``text``, or (with ``loads``) the local it is loaded into once."""
    if loads is None:
        return text
    if text not in loads:
        loads[text] = f"{'v' if along else 'b'}{len(loads)}"
    return loads[text]


def syms(r: Read) -> tuple[Sym, ...]:
    return tuple(x for x in r.subs if isinstance(x, Sym))


def substitute(e: LExpr, values: Mapping[str, int | LExpr]) -> LExpr:
    """``e`` with the loop variables of ``values`` replaced by their values (constants or
    expressions), constants of sums folded."""
    if isinstance(e, LVar) and e.name in values:
        v = values[e.name]
        return LInt(v) if isinstance(v, int) else v
    if isinstance(e, LOp):
        args = tuple(substitute(a, values) for a in e.args)
        if e.op == "+":  # fold the constants: ``c2 + 16``, not ``c2 + 0 + 16``
            const = sum(a.value for a in args if isinstance(a, LInt))
            rest = tuple(a for a in args if not isinstance(a, LInt))
            args = rest + ((LInt(const),) if const or not rest else ())
            if len(args) == 1:
                return args[0]
        return LOp(e.op, args)
    return e

