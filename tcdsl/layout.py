"""Layout: ``CheckedDef -> CheckedDef | None``, a def rewritten so that every contraction has an
operand that runs along the output's contiguous index (the C backend's register-tiled form).

``T(x, y) +=! A(x, r) * B(y, r)`` (a fully connected layer with weights ``W(out, in)``, ``A Bᵀ``)
has both operands contiguous along the reduction index only: compiled as it stands, each output
element is a dot product, four times slower than a register-tiled product. Rewritten as

    At(r, x) = A(x, r)                    # a blocked transpose of the operand
    Tt(y, x) +=! B(y, r) * At(r, x)       # At runs along Tt's contiguous index x
    T(x, y) = Tt(y, x)                    # a blocked transpose back

it computes the same sums (each element still adds its products in an unspecified order) with
two extra passes over ``A`` and ``T``. Only statements with plain index subscripts and no
``where`` clause are rewritten; the interpreter keeps the def as written.
"""

from __future__ import annotations

from .core import ast as A
from .core.affine import Sym, Var
from .core.checked import Binop, CheckedDef, Read, Statement
from .core.printer import definition, stmt
from .core.sema import check_def
from .grammar import parse


def rewrite(checked: CheckedDef) -> CheckedDef | None:
    """The rewritten def, or None when no statement has the ``A Bᵀ`` form."""
    taken = set(checked.tensors) | set(checked.sizes) | {i for s in checked.stmts for i in s.indices}
    lines: list[str] = []
    changed = False
    for s in checked.stmts:
        m = _match(s, checked)
        if m is None:
            lines.append(stmt(s.source))
            continue
        a, b, x, y, r = m
        at, tt = _fresh(f"{a}_t", taken), _fresh(f"{s.tensor}_t", taken)
        lines += [f"{at}({r}, {x}) = {a}({x}, {r})",
                  f"{tt}({y}, {x}) +=! {b}({y}, {r}) * {at}({r}, {x})",
                  f"{s.tensor}({x}, {y}) = {tt}({y}, {x})"]
        changed = True
    if not changed:
        return None
    head = definition(A.Def(checked.source.name, checked.source.params, checked.source.outputs, ()))
    text = head.rstrip("}").rstrip() + "\n" + "".join(f"  {line}\n" for line in lines) + "}\n"
    module = parse(text, f"<{checked.name}, operands laid out for the C backend>")
    return check_def(module.defs[0])


def _match(s: Statement, checked: CheckedDef) -> tuple[str, str, str, str, str] | None:
    """``(A, B, x, y, r)`` for ``T(x, y) +=! A(x, r) * B(y, r)`` (operands in either order)."""
    if s.op != "+" or not s.init or len(s.lhs) != 2 or len(s.reductions) != 1 or s.source.wheres:
        return None
    if not (isinstance(s.rhs, Binop) and s.rhs.op == "*" and isinstance(s.rhs.lhs, Read)
            and isinstance(s.rhs.rhs, Read)):
        return None
    x, y = s.lhs
    (r,) = s.reductions
    subs = {}
    for read in (s.rhs.lhs, s.rhs.rhs):
        names = tuple(_index(sub) for sub in read.subs)
        if read.conditional or read.tensor == s.tensor or len(names) != 2 or None in names:
            return None
        subs[names] = read.tensor
    if (x, r) not in subs or (y, r) not in subs or x == y:
        return None
    if not checked.tensors[s.tensor].dtype.startswith("float"):
        return None
    return subs[x, r], subs[y, r], x, y, r


def _index(sub: object) -> str | None:
    """The index name of a subscript that is exactly one index, else None."""
    if isinstance(sub, Sym) and len(sub.terms) == 1 and sub.const == 0:
        (atom, k), = sub.terms
        if k == 1 and isinstance(atom, Var) and atom.kind == "index":
            return atom.name
    return None


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name
