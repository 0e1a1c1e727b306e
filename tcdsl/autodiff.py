"""Reverse-mode differentiation: ``CheckedDef -> Backward`` (the backward def as TC text, with what
its params stand for and the forward values it needs saved): the statements walked in reverse
(``tcdsl.gradrules``), the forward values recomputed and the def assembled; and a kernel's backward,
derived or hand-written (``define(backward=...)``, checked by ``tcdsl.backward``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .backward import Backward, Param, user_backward, with_saved_outputs
from .core import dtypes as T
from .core.affine import Sym, Var
from .core.checked import Binop, Call, CheckedDef, Read, Statement, Tensor, TExpr, operands, reads
from .core.errors import TcGradientError
from .core.printer import stmt
from .core.sema import check_module
from .derivative import const, plain_var, read_text, rewrite
from .gradindex import box_covers, covers
from .gradindex import same as _same
from .gradlines import Line, tidy
from .gradrules import Derivation, Version
from .grammar import parse


def derive(checked: CheckedDef, wrt: Sequence[str] | None = None,
           save: Iterable[str] | Mapping[str, bool] | None = None) -> Backward:
    """The backward def of ``checked`` for the gradients of ``wrt`` (default: every float input).

    Statements are walked in reverse. Each float tensor a statement reads receives the gradient of
    the statement's left side times the read's partial derivative (``tcdsl.derivative``), written
    with plain names on the left: the read's access is inverted where a subscript solves for one of
    its indices (strided accesses under a divisibility test), and matched by an equality test
    otherwise (gathers, repeated indices). Every index keeps an explicit range and the forward
    statement's accesses stay in the domain (``where exists``), so padding by domain reproduces the
    forward statement's points exactly. Values the derivatives read are recomputed, except those
    written by reductions (temporaries, and earlier versions of a tensor later updated in place),
    which the forward returns too (``Backward.forward_source``); ``save`` overrides the choice."""
    return _Deriver(checked, wrt, save).run()


class _Deriver(Derivation):
    """A derivation's driver: every statement's gradients (``Derivation._statement``, in reverse),
    then the forward values they read recomputed, then the backward def's text."""

    # ---- driver ----
    def run(self) -> Backward:
        c = self.c
        for t in c.outputs:
            if t.name in self.active:
                self.state[t.name] = ("param", self._param("grad", t.name, f"d_{t.name}"))
        for k in reversed(range(len(self.stmts))):
            s = self.stmts[k]
            if s.tensor in self.active and s.tensor in self.state:
                start = len(self.lines)
                self._statement(k, s)
                if len(self.lines) > start:
                    self.lines.insert(start, f"# gradients through statement {s.number} (line {s.span.line}): "
                                             f"{_one_line(s)}")
        outs, out_names = [], set()
        for w in self.wrt:
            t = self.tensors[w]
            st = self.state.get(w)
            if st is None:
                name = self.fresh(f"d_{w}")
                idx = [self.fresh(f"i{p}") for p in range(len(t.dims))]
                self._emit(name, idx, "=", const(t.dtype, 0), [f"{i} in 0:{d}" for i, d in zip(idx, t.dims)])
                st = ("work", name)
            outs.append(f"{t.dtype}({', '.join(str(d) for d in t.dims)}) {st[1]}" if t.dims else f"{t.dtype} {st[1]}")
            out_names.add(st[1])
        grad_lines = self.lines
        self.lines = []
        self._recompute()
        if self.lines:
            self.lines.insert(0, "# forward values recomputed")
        inputs = [f"{t.decl()}" for t in c.inputs]
        params = [Param(t.name, "input", t.name) for t in c.inputs]
        order = {"output": 0, "saved": 1, "grad": 2}
        for p in sorted(self.params, key=lambda p: order[p.role]):
            t = self.tensors[p.of]
            dims = [self._param_dim(p.name, i, d) for i, d in enumerate(t.dims)]
            inputs.append(f"{t.dtype}({', '.join(dims)}) {p.name}" if dims else f"{t.dtype} {p.name}")
            params.append(p)
        name = self.fresh(f"{c.name}_grad")
        inert = [f"# {t}: every output is unchanged when it shifts, so no gradient flows through it"
                 for t in sorted(self.inert)]
        body = [f"  {line}" for line in inert + tidy(self.lines + grad_lines, out_names)]
        source = "\n".join([f"def {name}({', '.join(inputs)}) -> ({', '.join(outs)}) {{", *body, "}"]) + "\n"
        saved = tuple(p.name for p in params if p.role == "saved")
        return Backward(c.name, name, source, tuple(params), tuple(self.wrt), saved, self._forward_with(saved))

    def _forward_with(self, saved: tuple[str, ...]) -> str | None:
        """The forward def returning ``saved`` too: its own text when only temporaries are saved,
        else its statements with each saved earlier version written to a tensor of its own."""
        if not saved:
            return None
        versions = {v: n for v, n in self.vnames.items() if n in saved}
        if not versions:
            return with_saved_outputs(self.c, saved)
        c = self.c

        def holder(t: str, k: int | None) -> str:
            return t if k is None or (t, k) not in versions else versions[(t, k)]

        lines = []
        for k, s in enumerate(self.stmts):
            t = self.tensors[s.tensor]
            name, prev = holder(s.tensor, k), self.before[k].get(s.tensor)
            if prev is not None and holder(s.tensor, prev) != name and not self._overwrites(s):
                lines.append(_copy_text(name, holder(s.tensor, prev), t, self.fresh))
            lines.append(self._statement_text(k, name, holder))
        head = f"def {c.name}({', '.join(t.decl() for t in c.inputs)}) -> " \
               f"({', '.join([t.name for t in c.outputs] + list(saved))}) {{"
        return "\n".join([head, *(f"  {x}" for x in lines), "}"]) + "\n"

    def _statement_text(self, k: int, lhs: str, holder: Callable[[str, int | None], str]) -> str:
        return str(self._statement_line(k, lhs, holder))

    def _statement_line(self, k: int, lhs: str, holder: Callable[[str, int | None], str]) -> Line:
        """Statement ``k`` writing ``lhs``, each tensor ``t`` it reads named ``holder(t, version)``,
        every range explicit."""
        s = self.stmts[k]

        def tensor_of(t: str) -> str:
            return holder(t, self.before[k].get(t))

        where = [str(r) for r in s.ranges]
        for a in s.accesses:
            if a.kind == "exists" and all(x is not None for x in a.subs):
                where.append("exists " + read_text(tensor_of(a.tensor), a.subs))
        op = s.op if s.op == "=" else f"{s.op}=" + ("!" if s.init else "")
        rhs = rewrite(s.rhs, read=lambda r: replace(r, tensor=tensor_of(r.tensor)))
        return Line(lhs, tuple(s.lhs), op, rhs, tuple(where))

    def _param(self, role: str, of: str, base: str) -> str:
        key = (role, base)
        if key not in self.param_names:
            self.param_names[key] = self.fresh(base) if role == "grad" else base
            self.params.append(Param(self.param_names[key], role, of))
        return self.param_names[key]

    def _param_dim(self, param: str, p: int, d: Sym) -> str:
        if d.is_const():
            return str(d.const)
        if len(d.terms) == 1 and d.const == 0 and d.terms[0][1] == 1 and isinstance(d.terms[0][0], Var):
            return str(d)
        return self.fresh(f"{param}_{p}")  # a size the def computes: a size symbol of its own here

    # ---- recomputation ----
    def _recompute(self) -> None:
        """Statements recomputing every forward value the gradient statements read, in forward
        order; outputs come as params, saved temporaries from the forward."""
        todo: set[int] = set()
        copies: set[int] = set()
        seen: set[Version] = set()
        outputs = {t.name for t in self.c.outputs}
        inverted: dict[int, TExpr] = {}

        def need(v: Version) -> None:
            t, k = v
            if k is None or v in seen:
                return
            seen.add(v)
            if k == self.writes[t][-1] and t in outputs:
                self._param("output", t, t)
                return
            if self._keeps(t, k):
                self._param("saved", t, self.vname(t, k))
                return
            s = self.stmts[k]
            todo.add(k)
            back = self._from_output(k)
            if back is not None:
                inverted[k] = back
                for r in reads(back):
                    need(self.value_of[r.tensor])
                return
            for r in reads(s.rhs):
                need((r.tensor, self.before[k].get(r.tensor)))
            for a in s.accesses:
                if a.kind == "exists":
                    need((a.tensor, self.before[k].get(a.tensor)))
            prev = self.before[k].get(t)
            if prev is not None and not self._overwrites(s):
                copies.add(k)
                need((t, prev))

        for v in sorted(self.needed, key=lambda v: (v[1] is None, v[1] or 0, v[0])):
            need(v)
        for k in sorted(todo):
            s = self.stmts[k]
            t = self.tensors[s.tensor]
            name = self.vname(s.tensor, k)
            if k in copies:
                prev = self.vname(s.tensor, self.before[k].get(s.tensor))
                idx = [self.fresh(f"i{p}") for p in range(len(t.dims))]
                self._emit(name, idx, "=", Read(t.dtype, prev, tuple(Sym.var(i, "index") for i in idx)),
                           [f"{i} in 0:{d}" for i, d in zip(idx, t.dims)])
            if k in inverted:
                self._emit(name, list(s.lhs), "=", inverted[k], [str(r) for r in s.ranges])
            else:
                self.lines.append(self._statement_line(k, name, self.vname))

    def _from_output(self, k: int) -> TExpr | None:
        """Temporary ``t``'s value (statement ``k``, calling a builtin such as ``exp``) as one product
        of values the backward has anyway, where an output is ``O(l) = t(l) / u``: ``t = O * u``.
        Softmax's ``e = exp(X - mx)`` comes back as ``Y * s``, with no exp and no read of ``X``.
        Both statements write every point of their tensors; ``u`` reads inputs, outputs and saved
        values only."""
        s = self.stmts[k]
        if k != self.writes[s.tensor][-1] or s.op != "=" or s.reductions or not _calls(s.rhs) \
                or not covers(s, self.tensors):
            return None
        outputs = {t.name for t in self.c.outputs}
        for j in range(k + 1, len(self.stmts)):
            o = self.stmts[j]
            e = o.rhs
            same = {self.tensors[o.tensor].dtype, self.tensors[s.tensor].dtype, e.dtype}  # no narrower output
            if o.tensor not in outputs or j != self.writes[o.tensor][-1] or o.op != "=" or o.reductions \
                    or len(same) > 1 \
                    or not (isinstance(e, Binop) and e.op == "/" and isinstance(e.lhs, Read)) \
                    or e.lhs.tensor != s.tensor or self.before[j].get(s.tensor) != k or not covers(o, self.tensors):
                continue
            plain = [plain_var(x) for x in e.lhs.subs]
            names = [v for v in plain if v is not None]
            if len(names) != len(plain) or sorted(names) != sorted(o.lhs) or any(
                    not (_same(o.range(v).lo, r.lo) and _same(o.range(v).hi, r.hi)) for v, r in zip(names, s.ranges)):
                continue
            env = {v: Sym.var(i, "index") for v, i in zip(names, s.lhs)}
            u = rewrite(self.renamed(e.rhs, j), index=env)
            if any(not self._free(self.value_of[r.tensor]) for r in reads(u)) or _calls(u):
                continue
            out = self._value_read(o.tensor, j, tuple(env[v] for v in o.lhs))
            return Binop(s.rhs.dtype, "*", out, u)
        return None

    def _free(self, v: Version) -> bool:
        """Whether the backward has value ``v`` without computing it: an input, an output, or saved."""
        t, k = v
        return k is None or (k == self.writes[t][-1] and t in {o.name for o in self.c.outputs}) or self._keeps(t, k)

    def _overwrites(self, s: Statement) -> bool:
        if s.init:
            return box_covers(s, self.tensors)
        return s.op == "=" and covers(s, self.tensors)


def _copy_text(dst: str, src: str, t: Tensor, fresh: Callable[[str], str]) -> str:
    idx = [fresh(f"i{p}") for p in range(len(t.dims))]
    if not idx:
        return f"{dst} = {src}"
    return f"{dst}({', '.join(idx)}) = {src}({', '.join(idx)}) where " + \
        ", ".join(f"{i} in 0:{d}" for i, d in zip(idx, t.dims))


def _calls(e: TExpr) -> bool:
    """Whether ``e`` calls a builtin."""
    if isinstance(e, Call):
        return True
    if isinstance(e, Read):
        return any(_calls(x) for x in e.subs if isinstance(x, TExpr))
    return any(_calls(x) for x in operands(e))


def _one_line(s: Statement) -> str:
    return " ".join(stmt(s.source).split())


# ---- kernels: derived or user-supplied backward defs ----------------------------------------------


def attach(kernel: object, backward: str | None, save: Iterable[str] | Mapping[str, bool] | None,
           single: bool = True, filename: str = "<backward>") -> None:
    """Give ``kernel`` (a ``tcdsl.kernel.Kernel``) a hand-written backward def or a ``save=`` choice;
    for one def of several (``single`` false), names that are not its own are left to the others."""
    fwd: CheckedDef = kernel.checked  # type: ignore[attr-defined]
    if save is not None:
        if not single:
            temps = {t.name for t in fwd.temps}
            save = {n: v for n, v in save.items() if n in temps} if isinstance(save, Mapping) else \
                [n for n in save if n in temps]
        if any(T.is_float(t.dtype) for t in fwd.inputs):
            _Deriver(fwd, None, save)  # validates the names now
        kernel._save = save  # type: ignore[attr-defined]
    if backward is None:
        return
    defs = {c.name: c for c in check_module(parse(backward, filename))}
    chosen = defs.get(f"{fwd.name}_grad") or (next(iter(defs.values())) if len(defs) == 1 and single else None)
    if chosen is None:
        if not single:
            return
        raise TcGradientError(f"the backward source holds no def named '{fwd.name}_grad' for def '{fwd.name}'",
                              fwd.source.name.span.location())
    bw = user_backward(fwd, chosen)
    kernel_class: Any = type(kernel)  # the backward's kernel is of the same class (autodiff never imports it)
    kernel._user_backward = (bw, kernel_class(chosen))  # type: ignore[attr-defined]


def backward_of(kernel: object, wrt: Sequence[str] | None = None) -> Backward:
    """The backward def of a kernel (hand-written if it has one), cached per ``wrt``."""
    user = getattr(kernel, "_user_backward", None)
    if user is not None:
        return user[0]  # type: ignore[no-any-return]
    cache: dict = kernel.__dict__.setdefault("_backwards", {})
    key = None if wrt is None else tuple(wrt)
    bw = cache.get(key)
    if bw is None:
        fwd: CheckedDef = kernel.checked  # type: ignore[attr-defined]
        save = getattr(kernel, "_save", None)
        if key is not None:
            save = backward_of(kernel).saved  # a subset saves what the full backward saves
        bw = cache[key] = derive(fwd, key, save)
    return bw  # type: ignore[no-any-return]
