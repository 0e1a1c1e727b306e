"""Canonical printer: AST -> TC text (``Module -> str``).

The output re-parses to an equal AST (spans aside), uses canonical type names and the fewest
parentheses C precedence allows; it is the form ``tcdsl check`` prints and caches key on.
"""

from __future__ import annotations

from . import ast as A

_BINARY_PREC = {"||": 2, "&&": 3, "==": 4, "!=": 4, "<": 5, "<=": 5, ">": 5, ">=": 5,
                "+": 6, "-": 6, "*": 7, "/": 7, "%": 7}
_UNARY_PREC = 8
_ATOM_PREC = 9


def _prec(e: A.Expr) -> int:
    if isinstance(e, A.Ternary):
        return 1
    if isinstance(e, A.Binary):
        return _BINARY_PREC[e.op]
    if isinstance(e, A.Unary):
        return _UNARY_PREC
    return _ATOM_PREC


def _wrap(e: A.Expr, min_prec: int) -> str:
    text = expr(e)
    return f"({text})" if _prec(e) < min_prec else text


def num(value: int | float, is_float: bool) -> str:
    if not is_float:
        return str(int(value))
    text = repr(float(value))
    return text if any(c in text for c in ".eE") else text + ".0"


def expr(e: A.Expr) -> str:
    if isinstance(e, A.Num):
        return num(e.value, e.is_float)
    if isinstance(e, A.Name):
        return e.name
    if isinstance(e, A.Apply):
        return f"{e.name}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, A.Cast):
        return f"{e.type}({expr(e.arg)})"
    if isinstance(e, A.Unary):
        ops = []
        while isinstance(e, A.Unary):  # a run of unary operators, without recursion
            ops.append(e.op)
            e = e.arg
        return "".join(ops) + _wrap(e, _UNARY_PREC)
    if isinstance(e, A.Binary):
        p = _BINARY_PREC[e.op]
        rest = []
        while isinstance(e, A.Binary) and _BINARY_PREC[e.op] == p:  # a left-nested run, without recursion
            rest.append(f" {e.op} {_wrap(e.rhs, p + 1)}")
            e = e.lhs
        return _wrap(e, p) + "".join(reversed(rest))
    if isinstance(e, A.Ternary):
        return f"{_wrap(e.cond, 2)} ? {expr(e.then)} : {_wrap(e.other, 1)}"
    raise TypeError(f"not an expression: {e!r}")


def where(w: A.Where) -> str:
    if isinstance(w, A.WhereRange):
        return f"{w.index.name} in {_wrap(w.lo, 2)}:{_wrap(w.hi, 2)}"
    if isinstance(w, A.WhereExists):
        return f"exists {expr(w.access)}"
    return f"{w.name.name} = {expr(w.value)}"


def stmt(s: A.Stmt) -> str:
    lhs = s.lhs.name if s.indices is None else f"{s.lhs.name}({', '.join(_lhs_sub(i) for i in s.indices)})"
    text = f"{lhs} {s.op} {expr(s.rhs)}"
    if s.annotation is not None:  # before the where clauses, where TC's parser reads it
        text += f" <=> {expr(s.annotation)}"
    if s.wheres:
        text += " where " + ", ".join(where(w) for w in s.wheres)
    return text


def _lhs_sub(i: A.Ident | A.Num) -> str:
    return i.name if isinstance(i, A.Ident) else str(i.value)


def _dims(dims: tuple[A.Dim, ...]) -> str:
    return ", ".join(d.name if d.name is not None else str(d.value) for d in dims)


def param(p: A.Param) -> str:
    if p.dims is None:
        return f"{p.type} {p.name.name}"
    return f"{p.type}({_dims(p.dims)}) {p.name.name}"


def output(o: A.Output) -> str:
    if o.type is None:
        return o.name.name
    if not o.dims:
        return f"{o.type} {o.name.name}"
    return f"{o.type}({_dims(o.dims)}) {o.name.name}"


def definition(d: A.Def, indent: str = "  ") -> str:
    params = ", ".join(param(p) for p in d.params)
    head = f"def {d.name.name}({params}) -> ({', '.join(output(o) for o in d.outputs)}) {{"
    body = [indent + stmt(s) for s in d.stmts]
    return "\n".join([head, *body, "}"])


def module(m: A.Module) -> str:
    return "\n\n".join(definition(d) for d in m.defs) + "\n"
