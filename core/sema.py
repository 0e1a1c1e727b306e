"""Semantic analysis: ``Def -> CheckedDef`` (names, types, reductions, writes, then ranges).

Resolves every name (size symbol, tensor, index, let, builtin), types every expression with C's
conversions made explicit, classifies subscripts as quasi-affine or gathers, enforces the
language's rules (SPEC section 1 and its three fixes), and calls range inference per statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from . import ast as A
from . import dtypes as T
from .affine import Sym, floordiv, mod, sign_of, smax, smin
from .builtins import ARITY as BUILTINS  # builtin -> (arity, kind)
from .checked import (
    Access,
    Binop,
    Call,
    CheckedDef,
    Const,
    Convert,
    IndexRange,
    IndexVal,
    Read,
    Select,
    SizeVal,
    Statement,
    Tensor,
    TExpr,
    Unop,
    convert,
    operands,
)
from .errors import TcRangeError, TcSemanticError, TcTypeError, did_you_mean
from .printer import definition as print_def
from .printer import expr as print_expr
from .ranges import infer

_ARITH = {"+", "-", "*", "/", "%"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CMP = {"==", "!=", "<", "<=", ">", ">="}
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
CHAIN = 64  # chains of more terms than this are typed iteratively and summed (multiplied, ...) pairwise
_LEVEL = {"+": frozenset("+-"), "-": frozenset("+-"), "*": frozenset("*"), "&&": frozenset(("&&",)),
          "||": frozenset(("||",))}


def _subscript_names(s: A.Stmt, tensors: set[str]) -> set[str]:
    """The bare names in ``s``'s tensor subscripts (an index may be named like a builtin: ``j0``)."""
    out: set[str] = set()
    todo: list[tuple[object, bool]] = [(s.rhs, False), *((w, False) for w in s.wheres)]
    while todo:
        node, inside = todo.pop()
        if isinstance(node, A.Name):
            if inside:
                out.add(node.name)
            continue
        sub = inside or (isinstance(node, A.Apply) and node.name in tensors)
        for value in getattr(node, "__dict__", {}).values():
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, (A.Expr, A.WhereExists, A.WhereLet, A.WhereRange)):
                    todo.append((v, sub))
    return out


def _err(cls, msg: str, span: A.Span):
    return cls(msg, span.location())


def check_def(d: A.Def) -> CheckedDef:
    return _DefChecker(d).run()


def check_module(m: A.Module) -> list[CheckedDef]:
    check_def_names(m)
    return [check_def(d) for d in m.defs]


def check_def_names(m: A.Module) -> None:
    """No two defs of ``m`` share a name."""
    names: set[str] = set()
    for d in m.defs:
        if d.name.name in names:
            raise _err(TcSemanticError, f"def '{d.name.name}' is defined twice", d.name.span)
        names.add(d.name.name)


@dataclass
class _Scope:
    """Per-statement state while typing its right-hand side."""

    stmt: A.Stmt
    lets: dict[str, A.WhereLet]
    index_spans: dict[str, A.Span] = field(default_factory=dict)
    index_order: list[str] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    shown: dict[int, str] = field(default_factory=dict)
    expanding: tuple[str, ...] = ()
    conditional: int = 0  # > 0 while typing a branch of ?: or the right operand of && / ||
    bounded: frozenset[str] | None = None  # indices that a where range or an affine subscript bounds (lazy)

    def use_index(self, name: str, span: A.Span) -> None:
        if name not in self.index_spans:
            self.index_spans[name] = span
            self.index_order.append(name)


class _DefChecker:
    def __init__(self, d: A.Def) -> None:
        self.d = d
        self.what_def = f"def '{d.name.name}'"
        self.sizes: dict[str, A.Span] = {}
        self.inputs: dict[str, Tensor] = {}
        self.declared_outputs: dict[str, A.Output] = {}
        self.shaped: dict[str, Tensor] = {}  # tensors with a known shape: inputs, typed or written outputs
        self.written: set[str] = set()
        self.inferred: set[str] = set()  # tensors whose dims come from the ranges that write them
        self.accumulates: dict[str, A.Span] = {}  # outputs reduced into before any write
        self.lhs_names = {s.lhs.name for s in d.stmts}

    # ---- header ----
    def _header(self) -> None:
        names: dict[str, A.Span] = {}
        for p in self.d.params:
            if p.name.name in names:
                raise _err(TcSemanticError, f"parameter '{p.name.name}' is declared twice in {self.what_def}",
                           p.name.span)
            names[p.name.name] = p.name.span
            dims = tuple(self._dim(dim, p.name.name) for dim in (p.dims or ()))
            self._check_elements(p.name.name, p.type, dims, p.span)
            t = Tensor(p.name.name, p.type, dims, "input", p.span)
            self.inputs[t.name] = t
            self.shaped[t.name] = t
        for name, span in self.sizes.items():
            if name in names:
                raise _err(TcSemanticError, f"'{name}' is both a size symbol and a tensor in {self.what_def}", span)
        for o in self.d.outputs:
            n = o.name.name
            if n in self.inputs:
                raise _err(TcSemanticError, f"'{n}' is both an input and an output of {self.what_def}", o.name.span)
            if n in self.declared_outputs:
                raise _err(TcSemanticError, f"output '{n}' is listed twice in {self.what_def}", o.name.span)
            if n in self.sizes:
                raise _err(TcSemanticError, f"'{n}' is both a size symbol and an output in {self.what_def}",
                           o.name.span)
            self.declared_outputs[n] = o
            if o.type is not None:
                out_dims: list[Sym] = []
                for dim in o.dims or ():
                    if dim.name is not None and dim.name not in self.sizes:
                        raise _err(TcSemanticError, f"size symbol '{dim.name}' of output '{n}' is not a size of any "
                                   f"input of {self.what_def}", dim.span)
                    out_dims.append(Sym.var(dim.name, "size") if dim.name is not None else self._literal_dim(dim, n))
                self._check_elements(n, o.type, out_dims, o.span)
                self.shaped[n] = Tensor(n, o.type, tuple(out_dims), "output", o.span)

    def _dim(self, dim: A.Dim, tensor: str) -> Sym:
        if dim.name is None:
            return self._literal_dim(dim, tensor)
        self.sizes.setdefault(dim.name, dim.span)
        return Sym.var(dim.name, "size")

    def _literal_dim(self, dim: A.Dim, tensor: str) -> Sym:
        v = dim.value or 0
        if v > INT64_MAX:
            raise _err(TcTypeError, f"dim {_show_int(v)} of '{tensor}' does not fit in int64, the type of sizes",
                       dim.span)
        return Sym.of(v)

    def _check_elements(self, name: str, dtype: str, dims: list[Sym] | tuple[Sym, ...], span: A.Span) -> None:
        """Literal dims whose product (in bytes) overflows int64 can never be allocated."""
        consts = [d.const for d in dims if d.is_const()]
        count = 1
        for c in consts:
            count *= c
        nbytes = count * T.np_dtype(dtype).itemsize
        if nbytes > INT64_MAX:
            raise _err(TcTypeError, f"'{name}' is declared with {' * '.join(map(str, consts))} elements of "
                       f"{dtype}, {nbytes} bytes, past the int64 range of sizes", span)

    # ---- whole def ----
    def run(self) -> CheckedDef:
        self._header()
        stmts = [self._statement(i + 1, s) for i, s in enumerate(self.d.stmts)]
        outputs = []
        for n, o in self.declared_outputs.items():
            if n not in self.written:
                raise _err(TcSemanticError, f"output '{n}' of {self.what_def} is never written", o.name.span)
            t = self.shaped[n]
            outputs.append(Tensor(n, t.dtype, t.dims, "output", t.span))
        temps = [Tensor(t.name, t.dtype, t.dims, "temp", t.span) for n, t in self.shaped.items()
                 if n not in self.inputs and n not in self.declared_outputs]
        return CheckedDef(self.d.name.name, tuple(self.inputs.values()), tuple(outputs), tuple(temps),
                          tuple(self.sizes), tuple(stmts), self.d, tuple(self.accumulates))

    # ---- one statement ----
    def _statement(self, number: int, written: A.Stmt) -> Statement:
        s = self._constant_subscripts(written)
        name = s.lhs.name
        what = f"statement {number} of {self.what_def}"
        if name in self.inputs:
            raise _err(TcSemanticError, f"'{name}' is an input of {self.what_def} and cannot be written", s.lhs.span)
        if name in self.sizes:
            raise _err(TcSemanticError, f"'{name}' is a size symbol and cannot be written", s.lhs.span)
        idents = [i for i in s.indices or () if isinstance(i, A.Ident)]  # constants are indices by now
        lhs = [i.name for i in idents]
        for k, ident in enumerate(idents):
            if ident.name in lhs[:k]:
                raise _err(TcSemanticError, f"index '{ident.name}' appears twice on the left of {what}", ident.span)
            if ident.name in self.sizes or ident.name in self.shaped or ident.name in self.declared_outputs:
                raise _err(TcSemanticError, f"'{ident.name}' names a size or tensor and cannot be an index", ident.span)
        red = s.reduction
        if red is not None and not s.init and name not in self.written:
            if name not in self.declared_outputs:
                raise _err(TcSemanticError, f"reduction '{s.op}' into the temporary '{name}', which no earlier "
                           f"statement of {self.what_def} writes, would read uninitialised memory; write "
                           f"'{red}=!' to start from the identity", s.span)
            self.accumulates.setdefault(name, s.span)  # the call updates the caller's out= in place
        existing = self.shaped.get(name)
        if existing is not None and len(existing.dims) != len(lhs):
            raise _err(TcSemanticError, f"'{name}' has {len(existing.dims)} dims but is written with {len(lhs)} "
                       f"indices", s.lhs.span)
        lets: dict[str, A.WhereLet] = {}
        ranges: dict[str, tuple[Sym, Sym]] = {}
        range_spans: dict[str, A.Span] = {}
        exists: list[A.WhereExists] = []
        for w in s.wheres:
            if isinstance(w, A.WhereLet):
                if w.name.name in lets or w.name.name in self.sizes or w.name.name in self.shaped:
                    raise _err(TcSemanticError, f"'{w.name.name}' is already defined", w.name.span)
                lets[w.name.name] = w
            elif isinstance(w, A.WhereRange):
                if w.index.name in ranges:
                    raise _err(TcRangeError, f"index '{w.index.name}' is given two ranges", w.index.span)
                ranges[w.index.name] = (self._size_expr(w.lo), self._size_expr(w.hi))
                range_spans[w.index.name] = w.index.span
            else:
                exists.append(w)
        scope = _Scope(s, lets)
        for ident in idents:
            scope.use_index(ident.name, ident.span)
        for ident in idents:
            if ident.name in lets:
                raise _err(TcSemanticError, f"'{ident.name}' is both an index and a where-let", ident.span)
        rhs = self._expr(s.rhs, scope)
        for w in exists:
            self._read(w.access, scope, kind="exists")
        for n, sp in range_spans.items():
            if n not in scope.index_spans:
                raise _err(TcRangeError, f"where clause gives a range to '{n}', which {what} does not use", sp)
        reductions = [i for i in scope.index_order if i not in lhs]
        if s.op == "=" and reductions:
            first = reductions[0]
            raise _err(TcSemanticError, f"index '{first}' appears only on the right of {what}, so it is a "
                       f"reduction index, but '=' does not reduce; use '+=!' (or another reduction) or put "
                       f"'{first}' on the left", scope.index_spans[first])
        if red is not None:
            for acc in scope.accesses:
                if acc.tensor == name:
                    raise _err(TcSemanticError, f"reduction {what} reads '{name}', the tensor it reduces into; "
                               f"read a copy instead", acc.span)
        else:
            for acc in scope.accesses:
                if acc.tensor == name and acc.subs != tuple(Sym.var(i, "index") for i in lhs):
                    raise _err(TcSemanticError, f"{what} reads '{name}' at another point than the one it writes; "
                               f"write the result to a new tensor", acc.span)
        accesses = tuple(dict.fromkeys(scope.accesses))  # a repeated access bounds nothing more: kept once
        all_acc = [(a, self.shaped[a.tensor].dims) for a in accesses]
        if existing is not None:
            write = Access(name, tuple(Sym.var(i, "index") for i in lhs), "write", s.lhs.span)
            scope.shown[id(write)] = f"{name}({', '.join(lhs)})"
            all_acc.append((write, existing.dims))
        spans = {**scope.index_spans, **range_spans}
        index_ranges = infer(lhs + reductions, ranges, all_acc, spans, scope.shown, what)
        index_ranges = self._lhs_from_zero(index_ranges, len(lhs), name, what, spans)
        if existing is None:
            dtype = rhs.dtype
            dims = tuple(r.hi for r in index_ranges[: len(lhs)])
            self.shaped[name] = Tensor(name, dtype, dims, "output" if name in self.declared_outputs else "temp",
                                       s.lhs.span)
            self.inferred.add(name)
        else:
            grown = list(existing.dims)
            for d, (r, extent) in enumerate(zip(index_ranges, existing.dims)):
                over, size = r.hi - extent, r.hi - r.lo
                if sign_of(-over) == 1 or (size.is_const() and size.const <= 0):
                    continue  # inside the tensor, or no points at all
                if name in self.inferred:  # an inferred extent is the largest upper bound of the ranges writing it
                    grown[d] = r.hi if sign_of(over) == 1 else smax(extent, r.hi)
                elif over.is_const():
                    raise _err(TcRangeError, f"index '{r.name}' ranges over {r.lo}:{r.hi}, past dim "
                               f"{lhs.index(r.name)} of '{name}' ({extent})", spans[r.name])
            self.shaped[name] = replace(existing, dims=tuple(grown))
        self.written.add(name)
        target = self.shaped[name]
        return Statement(number, name, tuple(lhs), tuple(reductions), "=" if red is None else red, s.init,
                         convert(rhs, target.dtype), index_ranges,
                         accesses, written)

    def _lhs_from_zero(self, ranges: tuple[IndexRange, ...], n: int, name: str, what: str,
                       spans: dict[str, A.Span]) -> tuple[IndexRange, ...]:
        """An LHS range may start above 0 (the points below it are 0), never below: one that starts
        below 0 for every size is an error; one that does for some sizes (``KH - 1:HO`` when
        ``KH = 0``) starts at ``max(0, lo)``."""
        out = list(ranges)
        for k, r in enumerate(ranges[:n]):
            sign = sign_of(r.lo)
            if sign == 1:
                continue
            if sign == -1:
                raise _err(TcRangeError, f"the range of index '{r.name}' on the left of {what} is {r.lo}:{r.hi}, which "
                           f"starts below 0, outside '{name}'; write `where {r.name} in 0:...` to pad (the statement "
                           f"then runs only where its reads are in bounds)", spans[r.name])
            out[k] = replace(r, lo=smax(Sym.of(0), r.lo))
        return tuple(out)

    def _constant_subscripts(self, s: A.Stmt) -> A.Stmt:
        """``O(i, 0) = e`` as ``O(i, c1) = e where c1 in 0:1``: a constant on the left is an index
        with a one-point range (a fresh name, so that every later stage sees only indices)."""
        if not any(isinstance(i, A.Num) for i in s.indices or ()):
            return s
        used = set(_NAME.findall(print_def(self.d)))
        indices: list[A.Ident | A.Num] = []
        extra: list[A.Where] = []
        for k, sub in enumerate(s.indices or ()):
            if isinstance(sub, A.Ident):
                indices.append(sub)
                continue
            if sub.value > INT64_MAX:
                raise _err(TcTypeError, f"subscript {_show_int(int(sub.value))} does not fit in int64, the type of "
                           f"indices", sub.span)
            fresh = f"_{k}"
            while fresh in used:
                fresh += "_"
            used.add(fresh)
            ident = A.Ident(fresh, sub.span)
            indices.append(ident)
            hi = A.Num(int(sub.value) + 1, False, sub.span)
            extra.append(A.WhereRange(ident, sub, hi, sub.span))
        return replace(s, indices=tuple(indices), wheres=s.wheres + tuple(extra))

    # ---- size expressions (where ranges) ----
    def _size_expr(self, e: A.Expr) -> Sym:
        return _fits(self._size_expr_of(e), e, "range bound")

    def _size_expr_of(self, e: A.Expr) -> Sym:
        if isinstance(e, A.Num) and not e.is_float:
            return Sym.of(_int_literal(e))
        if isinstance(e, A.Name):
            if e.name in self.sizes:
                return Sym.var(e.name, "size")
            raise _err(TcRangeError, f"'{e.name}' is not a size symbol; a range bound is an integer expression of "
                       f"sizes and literals", e.span)
        if isinstance(e, A.Unary) and e.op in "-+":
            v = self._size_expr(e.arg)
            return -v if e.op == "-" else v
        if isinstance(e, A.Apply) and e.name in ("min", "max") and len(e.args) == 2:
            a, b = (self._size_expr(x) for x in e.args)
            return smin(a, b) if e.name == "min" else smax(a, b)
        if isinstance(e, A.Binary) and e.op in _ARITH:
            a, b = self._size_expr(e.lhs), self._size_expr(e.rhs)
            return self._affine_op(e, a, b)
        raise _err(TcRangeError, "a range bound must be an integer expression of sizes and literals", A.span_of(e))

    def _affine_op(self, e: A.Binary, a: Sym, b: Sym) -> Sym:
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            if a.is_const() or b.is_const():
                return a * b
            raise _err(TcSemanticError, "a product of two non-constant terms is not affine", e.span)
        if not b.is_const() or b.const <= 0:
            raise _err(TcSemanticError, f"'{e.op}' in a subscript or range needs a positive integer literal on "
                       f"the right", e.span)
        return floordiv(a, b.const) if e.op == "/" else mod(a, b.const)

    # ---- subscripts ----
    def _affine(self, e: A.Expr, scope: _Scope) -> Sym | None:
        """A quasi-affine Sym for ``e``, or None if it is not one (then it may be a gather)."""
        if isinstance(e, A.Num):
            return None if e.is_float else Sym.of(_int_literal(e))
        if isinstance(e, A.Name):
            n = e.name
            if n in scope.lets:
                return self._with_let(n, scope, lambda v: self._affine(v, scope))
            if n in self.sizes:
                return Sym.var(n, "size")
            if n in self.shaped or n in self.declared_outputs:
                return None
            scope.use_index(n, e.span)
            return Sym.var(n, "index")
        if isinstance(e, A.Unary) and e.op in "-+":
            v = self._affine(e.arg, scope)
            return None if v is None else (-v if e.op == "-" else v)
        if isinstance(e, A.Binary) and e.op in _ARITH:
            a, b = self._affine(e.lhs, scope), self._affine(e.rhs, scope)
            if a is None or b is None:
                return None
            if e.op == "*" and not (a.is_const() or b.is_const()):
                return None
            if e.op in "/%" and not (b.is_const() and b.const > 0):
                return None
            return _fits(self._affine_op(e, a, b), e, "subscript")
        return None

    def _with_let(self, n: str, scope: _Scope, fn):
        if n in scope.expanding:
            raise _err(TcSemanticError, f"where-let '{n}' refers to itself", scope.lets[n].name.span)
        saved = scope.expanding
        scope.expanding = saved + (n,)
        try:
            return fn(scope.lets[n].value)
        finally:
            scope.expanding = saved

    def _read(self, e: A.Apply, scope: _Scope, kind: str = "read") -> Read:
        t = self.shaped.get(e.name)
        if t is None:
            if e.name in self.declared_outputs:
                raise _err(TcSemanticError, f"output '{e.name}' is read before any statement writes it", e.span)
            if e.name in self.lhs_names:
                raise _err(TcSemanticError, f"'{e.name}' is read before any statement writes it", e.span)
            known = [*self.shaped, *self.declared_outputs, *(b for b in BUILTINS if BUILTINS[b][0] == len(e.args)),
                     *(T.TYPE_NAMES if len(e.args) == 1 else ())]  # a cast
            raise _err(TcSemanticError, f"'{e.name}' is not a tensor or builtin of {self.what_def}"
                       + did_you_mean(e.name, known), e.span)
        if e.name not in self.inputs and e.name not in self.written:
            raise _err(TcSemanticError, f"'{e.name}' is read before any statement writes it", e.span)
        if len(e.args) != len(t.dims):
            raise _err(TcSemanticError, f"'{e.name}' has {len(t.dims)} dims but is read with {len(e.args)} subscripts",
                       e.span)
        subs: list[Sym | TExpr] = []
        affine: list[Sym | None] = []
        for arg in e.args:
            a = self._affine(arg, scope)
            if a is not None:
                subs.append(a)
                affine.append(a)
                continue
            g = self._expr(arg, scope)
            if not (T.is_int(g.dtype) or g.dtype == "bool"):
                raise _err(TcTypeError, f"subscript of '{e.name}' has type {g.dtype}; subscripts are integers",
                           A.span_of(arg))
            if not (_contains_read(g) or _divides_by_variable(g)):
                raise _err(TcSemanticError, f"subscript '{print_expr(arg)}' of '{e.name}' is neither affine in "
                           f"indices and sizes nor data-dependent (only a division or modulo by a size or an index "
                           f"may make a subscript non-affine)", A.span_of(arg))
            self._check_bounded(g, arg, scope)
            subs.append(convert(g, "int64"))
            affine.append(None)
        if kind == "read" and scope.conditional:
            kind = "cond"
        acc = Access(e.name, tuple(affine), kind, e.span)
        scope.accesses.append(acc)
        scope.shown[id(acc)] = print_expr(e)
        return Read(t.dtype, e.name, tuple(subs), kind == "cond", e.span)

    def _check_bounded(self, g: TExpr, arg: A.Expr, scope: _Scope) -> None:
        """Every index of the non-affine subscript ``g`` (a gather, or a division or modulo by a
        size or an index) needs its range from elsewhere: such a subscript bounds nothing."""
        if scope.bounded is None:
            scope.bounded = self._bounded_indices(scope)
        for name in _index_vals(g):
            if name not in scope.bounded:
                raise _err(TcRangeError, f"index '{name}' appears only in non-affine subscripts (such as "
                           f"'{print_expr(arg)}'), which do not bound its range; write `where {name} in lo:hi`",
                           scope.index_spans.get(name, A.span_of(arg)))

    def _bounded_indices(self, scope: _Scope) -> frozenset[str]:
        """The indices of ``scope``'s statement that range inference can bound: those given a
        ``where`` range, and those in an affine subscript of a read, an ``exists`` or the write."""
        s = scope.stmt
        out = {w.index.name for w in s.wheres if isinstance(w, A.WhereRange)}
        if s.lhs.name in self.shaped:
            out |= {i.name for i in s.indices or () if isinstance(i, A.Ident)}
        probe = _Scope(s, scope.lets)  # _affine records the indices it meets: keep them off ``scope``
        todo: list[A.Expr] = [s.rhs, *(w.access for w in s.wheres if isinstance(w, A.WhereExists))]
        lets_seen: set[str] = set()
        while todo:
            e = todo.pop()
            if isinstance(e, A.Apply):
                for a in e.args:
                    sub = self._affine(a, probe) if e.name in self.shaped else None
                    if sub is not None:
                        out |= sub.indices()
                todo += e.args
            elif isinstance(e, A.Name) and e.name in scope.lets and e.name not in lets_seen:
                lets_seen.add(e.name)
                todo.append(scope.lets[e.name].value)
            elif isinstance(e, (A.Unary, A.Cast)):
                todo.append(e.arg)
            elif isinstance(e, A.Binary):
                todo += [e.lhs, e.rhs]
            elif isinstance(e, A.Ternary):
                todo += [e.cond, e.then, e.other]
        return frozenset(out)

    # ---- value expressions ----
    def _expr(self, e: A.Expr, scope: _Scope) -> TExpr:
        if isinstance(e, A.Num):
            if e.is_float:
                return Const(T.FLOAT_LITERAL, float(e.value))
            v = _int_literal(e)
            return Const(T.INT_LITERAL if v < 2**31 else "int64", v)
        if isinstance(e, A.Name):
            return self._name(e, scope)
        if isinstance(e, A.Apply):
            return self._apply(e, scope)
        if isinstance(e, A.Cast):
            if e.type == "uint64" and isinstance(e.arg, A.Num) and not e.arg.is_float:
                return Const("uint64", _int_literal(e.arg, UINT64_MAX, "uint64"))
            return convert(self._expr(e.arg, scope), e.type)
        if isinstance(e, A.Unary):
            if e.op == "-" and isinstance(e.arg, A.Num) and not e.arg.is_float and e.arg.value == INT64_MAX + 1:
                return Const("int64", -INT64_MAX - 1)  # the one int64 whose magnitude is not an int64 literal
            a = self._expr(e.arg, scope)
            if e.op == "!":
                return Unop("bool", "!", convert(a, "bool"))
            t = T.promote(a.dtype, a.dtype)
            a = convert(a, t)
            return a if e.op == "+" else Unop(t, "-", a)
        if isinstance(e, A.Binary):
            chain = _chain(e)
            if chain is not None:
                return self._chain(e, chain[0], chain[1], scope)
            a = self._expr(e.lhs, scope)
            if e.op in ("&&", "||"):
                b = self._branch(e.rhs, scope)
                return Binop("bool", e.op, convert(a, "bool"), convert(b, "bool"), e.span)
            b = self._expr(e.rhs, scope)
            t = T.promote(a.dtype, b.dtype)
            res = "bool" if e.op in _CMP else t
            return Binop(res, e.op, convert(a, t), convert(b, t), e.span)
        if isinstance(e, A.Ternary):
            c = convert(self._expr(e.cond, scope), "bool")
            a, b = self._branch(e.then, scope), self._branch(e.other, scope)
            t = T.promote(a.dtype, b.dtype) if a.dtype != b.dtype else a.dtype
            return Select(t, c, convert(a, t), convert(b, t))
        raise TypeError(e)

    def _chain(self, e: A.Binary, first: A.Expr, rest: list[tuple[str, A.Expr]], scope: _Scope) -> TExpr:
        """A long left-nested run of one operator level (``a + b - c + ...``, ``a * b * ...``,
        ``a && b && ...``), typed term by term in source order and combined as a balanced tree.

        This is exact where the operator is: ``&&`` and ``||`` (short-circuit, left to right, as
        written), and integer ``+ - *`` (wrapping arithmetic is associative). The run is cut where
        C's conversions change the running type, so every operation runs in the type it has when
        written left to right. Float sums and products are computed pairwise (as numpy sums),
        which differs from left to right only by rounding."""
        if e.op in ("&&", "||"):
            terms = [convert(self._expr(first, scope), "bool")]
            terms += [convert(self._branch(x, scope), "bool") for _, x in rest]
            return _balance([(False, t) for t in terms], "bool", e.op, e.span)[1]
        head = self._expr(first, scope)
        items: list[tuple[bool, TExpr]] = [(False, head)]
        t = head.dtype
        for op, x in rest:
            term = self._expr(x, scope)
            wider = T.promote(t, term.dtype)
            if wider != t:
                items = [(False, _balance(items, t, e.op, e.span)[1])]
                t = wider
            items.append((op == "-", term))
        return _balance(items, t, e.op, e.span)[1]

    def _branch(self, e: A.Expr, scope: _Scope) -> TExpr:
        """Type an expression evaluated only on some points: its reads become conditional."""
        scope.conditional += 1
        try:
            return self._expr(e, scope)
        finally:
            scope.conditional -= 1

    def _name(self, e: A.Name, scope: _Scope) -> TExpr:
        n = e.name
        if n in scope.lets:
            return self._with_let(n, scope, lambda v: self._expr(v, scope))
        if n in self.shaped or n in self.declared_outputs:
            t = self.shaped.get(n)
            if t is not None and not t.dims:
                return self._read(A.Apply(n, (), e.span), scope)
            self._raise_bare(n, t, e.span)
        if n in self.sizes:
            return SizeVal(T.INDEX, n)
        if (n in BUILTINS or n in T.TYPE_NAMES) and n not in scope.index_spans and \
                n not in _subscript_names(scope.stmt, set(self.shaped) | set(self.declared_outputs)):
            raise _err(TcSemanticError, f"'{n}' is a function; call it with arguments", e.span)
        scope.use_index(n, e.span)
        return IndexVal(T.INDEX, n)

    def _raise_bare(self, n: str, t: Tensor | None, span: A.Span):
        if t is None:
            raise _err(TcSemanticError, f"output '{n}' is read before any statement writes it", span)
        raise _err(TcSemanticError, f"tensor '{n}' has {len(t.dims)} dims and is used without subscripts", span)

    def _apply(self, e: A.Apply, scope: _Scope) -> TExpr:
        if e.name in self.shaped or e.name in self.declared_outputs or e.name not in BUILTINS:
            return self._read(e, scope)
        arity, kind = BUILTINS[e.name]
        if len(e.args) != arity:
            raise _err(TcSemanticError, f"builtin '{e.name}' takes {arity} argument{'s' * (arity > 1)}, "
                       f"got {len(e.args)}", e.span)
        args = [self._expr(a, scope) for a in e.args]
        t = args[0].dtype
        for a in args[1:]:
            t = T.promote(t, a.dtype)
        if kind == "math":
            t = T.float_of(t)
        elif t == "bool" or (T.is_int(t) and T.bits(t) < 32):
            t = "int32"
        return Call(t, e.name, tuple(convert(a, t) for a in args))


def _show_int(v: int) -> str:
    text = str(v)
    return text if len(text) <= 40 else f"{text[:12]}...{text[-6:]} ({len(text)} digits)"


def _int_literal(e: A.Num, limit: int = INT64_MAX, widest: str = "int64") -> int:
    """The value of an integer literal, which must fit in int64 (its type is int32, or int64 when
    larger, as in C) or in ``widest`` where a cast gives it that type."""
    v = int(e.value)
    if v > limit:
        raise _err(TcTypeError, f"integer literal {_show_int(v)} does not fit in {widest} (at most {limit})", e.span)
    return v


def _fits(s: Sym, e: A.Expr, what: str) -> Sym:
    """``s`` (computed from ``e``) with every coefficient and constant in the int64 range."""
    for c in (s.const, *(c for _, c in s.terms)):
        if abs(c) > INT64_MAX:
            raise _err(TcTypeError, f"{what} '{print_expr(e)}' has the constant {_show_int(c)}, which does not fit "
                       f"in int64", A.span_of(e))
    return s


def _chain(e: A.Binary) -> tuple[A.Expr, list[tuple[str, A.Expr]]] | None:
    """A left-nested run of more than CHAIN operators of ``e``'s level, as its first operand and
    the (operator, operand) pairs after it in source order; None for shorter runs."""
    level = _LEVEL.get(e.op)
    if level is None or not (isinstance(e.lhs, A.Binary) and e.lhs.op in level):
        return None
    rest: list[tuple[str, A.Expr]] = []
    node: A.Expr = e
    while isinstance(node, A.Binary) and node.op in level:
        rest.append((node.op, node.rhs))
        node = node.lhs
    if len(rest) <= CHAIN:
        return None
    rest.reverse()
    return node, rest


def _balance(items: list[tuple[bool, TExpr]], t: str, op: str, span: A.Span) -> tuple[bool, TExpr]:
    """Combine ``items`` (negated?, term) with ``op`` in type ``t`` as a balanced tree; returns
    (negated?, value). For sums, -a + -b is -(a + b), a + -b is a - b and -a + b is b - a, so no
    negation is ever computed (the first item, never negated, keeps every group it joins positive)."""
    if len(items) == 1:
        neg, x = items[0]
        return neg, convert(x, t)
    mid = len(items) // 2
    (na, a), (nb, b) = _balance(items[:mid], t, op, span), _balance(items[mid:], t, op, span)
    if op in ("+", "-"):
        if na == nb:
            return na, Binop(t, "+", a, b, span)
        return False, Binop(t, "-", a, b, span) if nb else Binop(t, "-", b, a, span)
    return False, Binop(t, op, a, b, span)


def _divides_by_variable(e: TExpr) -> bool:
    """Whether ``e`` holds an integer ``/`` or ``%`` whose divisor is not a constant (a size, an
    index, an expression of them): such a subscript is a non-affine read, bounds-checked at run
    time like a gather."""
    if isinstance(e, Binop) and e.op in ("/", "%") and T.is_int(e.dtype):
        divisor = e.rhs.arg if isinstance(e.rhs, Convert) else e.rhs
        if not isinstance(divisor, Const):
            return True
    return any(_divides_by_variable(x) for x in operands(e))


def _index_vals(e: TExpr) -> list[str]:
    """The indices ``e`` uses outside tensor reads (those inside a read are its own subscripts)."""
    out: list[str] = []
    todo = [e]
    while todo:
        x = todo.pop()
        if isinstance(x, IndexVal):
            out.append(x.name)
        todo += reversed(operands(x))
    return list(dict.fromkeys(out))


def _contains_read(e: TExpr) -> bool:
    return isinstance(e, Read) or any(_contains_read(x) for x in operands(e))
