"""Scatters: ``Instance -> Instance``, sums selected by an index equal to a value read from data.

A sum such as ``d_Table(x0, d) +=! (x0 == Idx(b, l)) ? d_Bag(b, d) : 0.0`` (the derived gradient of
the gather ``Table(Idx(b, l), d)``, or a one-hot product written by hand) adds a value at one point
of ``x0`` for each point of its other indices: the one the data names. Run over the whole range of
``x0``, it tests the equality ``V`` times per point, for ``V`` the table's rows. Such a statement
gets ``Statement.scatter = (x0, Idx(b, l))``: the scop gives ``x0`` one point and over-approximates
the element it writes by the whole dim (as a gather's read), and the emitted code computes ``x0``
from the data and skips values outside its range, where the equality never holds. So the result
is that of the equality form, at the cost of one addition per point of the other indices.
On the GPU the additions are atomic (``atomic``: ``Deps -> Deps``), so the points of the other
indices run in parallel; their order, and so the rounding of a float sum, may vary between runs.

The statement qualifies when it sums (``+``), its right side is ``cond ? value : 0`` with the
equality among ``cond``'s conjuncts, the value side reads data and has an integer type, and the
index occurs nowhere else in the statement but its left side.
"""

from __future__ import annotations

from dataclasses import replace

from tcdsl.core import dtypes as T
from tcdsl.core.checked import Binop, Const, Convert, IndexVal, Read, Select, Statement, TExpr, operands, reads
from tcdsl.core.instance import BoundStmt, Instance

from .deps import Deps, statements_in
from .scop import Scop


def scatters(inst: Instance) -> Instance:
    """``inst`` with each statement of the scatter form marked and its equality removed."""
    stmts = []
    changed = False
    for bs in inst.stmts:
        s = _scatter(bs)
        changed |= s is not bs.stmt
        stmts.append(bs if s is bs.stmt else replace(bs, stmt=s))
    if not changed:
        return inst
    new = {bs.stmt.number: bs.stmt for bs in stmts}
    checked = replace(inst.checked, stmts=tuple(new.get(s.number, s) for s in inst.checked.stmts))
    return replace(inst, checked=checked, stmts=tuple(stmts))


def _scatter(bs: BoundStmt) -> Statement:
    s = bs.stmt
    rhs = s.rhs
    if s.op != "+" or s.scatter is not None or not isinstance(rhs, Select) or not _zero(rhs.other):
        return s
    terms = _conjuncts(rhs.cond)
    for k, term in enumerate(terms):
        found = _equality(term, s)
        if found is None:
            continue
        index, value = found
        rest = terms[:k] + terms[k + 1:]
        then = rhs.then
        if rest:
            cond = rest[0]
            for t in rest[1:]:
                cond = Binop("bool", "&&", cond, t)
            then = Select(rhs.dtype, cond, then, rhs.other)
        if _mentions(then, index) or any(index in _acc_indices(a.subs) for a in s.accesses if a.kind != "write"):
            continue
        return replace(s, rhs=then, scatter=(index, value))
    return s


def _zero(e: TExpr) -> bool:
    while isinstance(e, Convert):
        e = e.arg
    return isinstance(e, Const) and e.value == 0


def _conjuncts(e: TExpr) -> list[TExpr]:
    if isinstance(e, Binop) and e.op == "&&":
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _equality(e: TExpr, s: Statement) -> tuple[str, TExpr] | None:
    """``(index, value)`` for ``index == value`` (either way round): a left-hand index of ``s``
    against an integer value that reads data and not that index."""
    if not (isinstance(e, Binop) and e.op == "=="):
        return None
    for a, b in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
        index = _index(a)
        if (index is not None and index in s.lhs and T.is_int(b.dtype) and b.dtype != "bool" and reads(b)
                and not _mentions(b, index)):
            return index, b
    return None


def _index(e: TExpr) -> str | None:
    """The index an integer expression is, converted to a type that holds every index."""
    while isinstance(e, Convert) and T.is_int(e.dtype) and T.bits(e.dtype) >= T.bits(T.INDEX) \
            and not T.is_unsigned(e.dtype):
        e = e.arg
    return e.name if isinstance(e, IndexVal) else None


def _mentions(e: TExpr, index: str) -> bool:
    if isinstance(e, IndexVal):
        return e.name == index
    if isinstance(e, Read):
        return any(index in _acc_indices((x,)) if not isinstance(x, TExpr) else _mentions(x, index) for x in e.subs)
    return any(_mentions(x, index) for x in operands(e))


def _acc_indices(subs: tuple) -> set[str]:
    out: set[str] = set()
    for x in subs:
        if x is not None and not isinstance(x, TExpr):
            out |= x.indices()
    return out


def value_indices(s: Statement) -> tuple[str, ...]:
    """The indices a scatter's value reads, in the statement's order."""
    assert s.scatter is not None
    used: set[str] = set()

    def walk(e: TExpr) -> None:
        if isinstance(e, IndexVal):
            used.add(e.name)
        if isinstance(e, Read):
            used.update(_acc_indices(e.subs))
            for x in e.subs:
                if isinstance(x, TExpr):
                    walk(x)
        for o in operands(e):
            walk(o)

    walk(s.scatter[1])
    return tuple(i for i in s.indices if i in used)


# the element types whose additions the GPU backends make atomic (codegen.gpu's tc_atomic_add_*)
ATOMIC_DTYPES = ("float32", "float64", "int32", "int64")


def atomic(deps: Deps, scop: Scop) -> Deps:
    """``deps`` for a mapping whose scatters add atomically (the GPU's): their updates may then run
    at once as well as in any order, so the loops their values move with need not be serial. A
    scatter of another element type keeps its updates apart."""
    names = [st.name for st in scop.stmts if st.kind == "update"
             and scop.tc_statement(st.name).scatter is not None
             and scop.inst.checked.tensors[scop.tc_statement(st.name).tensor].dtype in ATOMIC_DTYPES]
    if not names:
        return deps
    mine = statements_in(scop.domain, names)
    kept = deps.reduction.subtract(deps.reduction.intersect_domain(mine).intersect_range(mine))
    return replace(deps, reduction=kept.coalesce())
