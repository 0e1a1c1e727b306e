"""Reverse-mode differentiation: ``CheckedDef -> Backward`` (the backward def as TC text, with what
its params stand for and the forward values it needs saved); also the hand-written backward defs
of ``define(backward=...)``, checked against the same convention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .core import ast as A
from .core import dtypes as T
from .core.affine import FloorDiv, MinMax, Mod, Sym, Var, bounds, floordiv, mod, sign_of
from .core.checked import (
    Binop,
    Call,
    CheckedDef,
    Convert,
    Read,
    Select,
    Statement,
    Tensor,
    TExpr,
    Unop,
    convert,
    operands,
    reads,
)
from .core.errors import TcGradientError
from .core.printer import definition, stmt
from .core.sema import BUILTINS, check_module
from .derivative import IndexExpr, Key, cmp, const, diff, key_of, mul, plain_var, read_text, rewrite
from .derivative import unconditional_reads as uncond
from .gradlines import Line, tidy
from .gradpad import Pad, Split, pads, splits
from .gradphase import phases, read_back
from .grammar import parse
from .shift import invariant_shifts

Version = tuple[str, "int | None"]  # (tensor, statement after which the value holds); None: an input


@dataclass(frozen=True)
class Param:
    """A param of a backward def: ``role`` is "input" or "output" (forward tensor ``of``), "saved"
    (a value the forward also returns under ``name``, of tensor ``of``) or "grad" (the gradient of
    forward output ``of``)."""

    name: str
    role: str
    of: str


@dataclass(frozen=True)
class Backward:
    """A backward def: its TC text, what its params and outputs stand for, and the values the
    forward must also return (``saved``, in order, by ``forward_source``)."""

    forward: str
    name: str
    source: str
    params: tuple[Param, ...]
    grads: tuple[str, ...]  # forward inputs whose gradients the def returns, in order
    saved: tuple[str, ...] = ()  # values the forward also returns: temporaries, earlier versions of a tensor
    forward_source: str | None = None  # the forward def returning them too (None: nothing saved)
    user: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return self.source


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


def with_saved_outputs(checked: CheckedDef, saved: Sequence[str]) -> str:
    """The forward def's text with the temporaries ``saved`` also returned (after its outputs)."""
    d = checked.source
    extra = tuple(A.Output(A.Ident(n)) for n in saved)
    return definition(replace(d, outputs=d.outputs + extra)) + "\n"


def default_saved(checked: CheckedDef) -> set[str]:
    """Temporaries worth keeping from the forward: those some statement writes by a reduction."""
    temps = {t.name for t in checked.temps}
    return {s.tensor for s in checked.stmts if s.tensor in temps and s.reductions}


def saved_types(bw: Backward, checked: CheckedDef) -> dict[str, str]:
    """The TC type of each value ``bw`` saves."""
    types = {t.name: t.dtype for t in checked.temps + checked.outputs}
    return {p.name: types[p.of] for p in bw.params if p.role == "saved"}


@dataclass
class _Reindex:
    lhs: list[str]
    env: dict[str, Sym]
    free: list[str]
    guards: list[TExpr]


class _Deriver:
    def __init__(self, c: CheckedDef, wrt: Sequence[str] | None, save: Iterable[str] | Mapping[str, bool] | None):
        self.c = c
        self.stmts = c.stmts
        self.tensors = c.tensors
        floats = [t.name for t in c.inputs if T.is_float(t.dtype)]
        self.wrt = list(floats if wrt is None else wrt)
        loc = c.source.name.span.location()
        for w in self.wrt:
            if w not in floats:
                what = "a float input" if w not in self.tensors else f"a float input (it is {self.tensors[w].dtype})"
                raise TcGradientError(f"cannot differentiate {c.name} with respect to '{w}': not {what}", loc)
        if not self.wrt:
            raise TcGradientError(f"{c.name} has no float input to differentiate with respect to", loc)
        self.used: set[str] = {*self.tensors, *c.sizes, c.name, *BUILTINS, *T.TYPE_NAMES}
        for s in self.stmts:
            self.used.update(s.indices)
        self.writes: dict[str, list[int]] = {}
        self.before: list[dict[str, int | None]] = []
        current: dict[str, int | None] = {t.name: None for t in c.inputs}
        for k, s in enumerate(self.stmts):
            self.before.append(dict(current))
            self.writes.setdefault(s.tensor, []).append(k)
            current[s.tensor] = k
        self.vnames: dict[Version, str] = {}
        for k, s in enumerate(self.stmts):  # earlier versions of a tensor written more than once
            if k != self.writes[s.tensor][-1]:
                self.vnames[(s.tensor, k)] = self.fresh(f"{s.tensor}_{k + 1}")
        self.save, self.exact = self._save_set(save)
        self.active = self._active()
        self.inert = invariant_shifts(c, self.active)  # shifts no output sees: their gradient is zero
        self.value_of: dict[str, Version] = {}  # backward name -> forward value version
        self.lines: list[Line | str] = []
        self.state: dict[str, tuple[str, str]] = {}  # tensor -> ("param" | "work", gradient name)
        self.params: list[Param] = []
        self.param_names: dict[tuple[str, str], str] = {}
        self.pad_copies: dict[tuple, str] = {}  # (tensor, what the copy does) -> its padded or split copy
        self.needed: set[Version] = set()

    # ---- setup ----
    def _save_set(self, save: Iterable[str] | Mapping[str, bool] | None) -> tuple[set[str], bool]:
        """The names of the values the forward keeps (temporaries, and earlier versions of tensors
        written more than once, by their names in the backward def), and whether that set is exact
        (else earlier versions written by reductions are kept too)."""
        temps = {t.name for t in self.c.temps}
        names = temps | set(self.vnames.values())
        chosen = default_saved(self.c)
        if save is None:
            return chosen, False
        items = dict(save) if isinstance(save, Mapping) else {n: True for n in save}
        if not isinstance(save, Mapping):
            chosen = set()
        for n, keep in items.items():
            if n not in names:
                raise TcGradientError(f"save= names '{n}', which is not a temporary of {self.c.name}",
                                      self.c.source.name.span.location())
            (chosen.add if keep else chosen.discard)(n)
        return chosen, not isinstance(save, Mapping)

    def _keeps(self, t: str, k: int) -> bool:
        """Whether the forward keeps the value of ``t`` after statement ``k`` for the backward."""
        if k == self.writes[t][-1]:
            return t in self.save
        name = self.vnames[(t, k)]
        if name in self.save or self.exact:
            return name in self.save
        return bool(self.stmts[k].reductions)

    def _active(self) -> set[str]:
        active = set(self.wrt)
        changed = True
        while changed:
            changed = False
            for s in self.stmts:
                if s.tensor not in active and T.is_float(self.tensors[s.tensor].dtype) and \
                        any(r.tensor in active for r in reads(s.rhs)):
                    active.add(s.tensor)
                    changed = True
        return active

    def fresh(self, base: str) -> str:
        name, n = base, 2
        while name in self.used:
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return name

    # ---- values of the forward ----
    def vname(self, t: str, k: int | None) -> str:
        name = t if k is None or k == self.writes[t][-1] else self.vnames[(t, k)]
        self.value_of[name] = (t, k)
        return name

    def renamed(self, e: TExpr, k: int) -> TExpr:
        """``e`` of statement ``k`` with each read naming the version of its tensor it reads."""
        return rewrite(e, read=lambda r: replace(r, tensor=self.vname(r.tensor, self.before[k].get(r.tensor))))

    def _note_reads(self, e: TExpr) -> None:
        for r in reads(e):
            if r.tensor in self.value_of:
                self.needed.add(self.value_of[r.tensor])

    def _value_read(self, t: str, k: int | None, subs: tuple) -> Read:
        return Read(self.tensors[t].dtype, self.vname(t, k), subs)

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

    # ---- one statement ----
    def _statement(self, k: int, s: Statement) -> None:
        V = s.tensor
        vt = self.tensors[V]
        prev = self.before[k].get(V)
        f = self.renamed(s.rhs, k)
        lhs_subs = tuple(Sym.var(i, "index") for i in s.lhs)
        gname = self.state[V][1]
        g = Read(vt.dtype, gname, lhs_subs)
        keys = self._keys(f, k)
        self_key = (self.vname(V, prev), lhs_subs) if prev is not None else None
        if s.op == "*" and s.reductions and keys:
            raise TcGradientError(f"{s.describe()}: a product reduction ('*=' over reduction index "
                                  f"'{s.reductions[0]}') has no derivative tcdsl can derive; write it as exp of a "
                                  f"sum of logs, or pass backward= with a hand-written gradient", s.span.location())
        share: Read | None = None
        here = self._value_read(V, k, lhs_subs)
        if s.op in ("min", "max") and (keys or (prev is not None and not s.init)):
            share = self._share(k, s, f, here, prev)
        value = self._own_value(k, s, f, here)
        for key in keys:
            if key == self_key:
                continue
            d = diff(f, key)
            if d is None:
                continue
            if value is not None:  # exp(u)' = exp(u), tanh(u)' = 1 - tanh(u)^2: the value the statement wrote
                d = _substitute(d, value, here)
            contrib: TExpr | None
            if s.op in ("min", "max"):
                assert share is not None
                contrib = Select(vt.dtype, cmp("==", f, here), mul(share, d) or const(vt.dtype, 0),
                                 const(vt.dtype, 0))
            elif s.op == "*" and prev is not None and not s.init:
                contrib = mul(mul(g, self._value_read(V, prev, lhs_subs)), d)
            else:
                contrib = mul(g, d)
            if contrib is not None:
                self._accumulate(k, s, key, contrib)
        if prev is None:
            del self.state[V]  # nothing before the first write
            return
        self._transition(k, s, f, g, here, share, self_key)

    def _own_value(self, k: int, s: Statement, f: TExpr, here: Read) -> TExpr | None:
        """The right side of ``=`` statement ``k`` where the backward has the value it wrote at no
        cost: an output's final value (a param), a saved value, or one the backward already reads.
        Derivatives that contain that right side (exp, tanh, sigmoid, sqrt...) read the value
        instead of computing it again."""
        if s.op != "=" or not isinstance(f, Call) or f.dtype != here.dtype:
            return None
        if any(r.tensor == s.tensor for r in reads(f)):
            return None
        V = s.tensor
        final = k == self.writes[V][-1]
        output = final and V in {t.name for t in self.c.outputs}
        if output or self._keeps(V, k) or (V, k) in self.needed:
            return f
        return None

    def _keys(self, f: TExpr, k: int) -> list[Key]:
        out: list[Key] = []
        for r in reads(f):
            t, _ = self.value_of[r.tensor]
            if t in self.active and t not in self.inert and T.is_float(r.dtype) and key_of(r) not in out:
                out.append(key_of(r))
        return out

    def _share(self, k: int, s: Statement, f: TExpr, here: Read, prev: int | None) -> Read:
        """Each point's share of the gradient of a min/max reduction: the gradient over the number of
        points that attain the extremum (ties share it evenly)."""
        dt = self.tensors[s.tensor].dtype
        name = self.fresh(f"{s.tensor}_ties")
        one, zero = const(dt, 1), const(dt, 0)
        ranges = [str(r) for r in s.ranges]
        if prev is not None and not s.init:
            before = self._value_read(s.tensor, prev, here.subs)
            self._emit(name, list(s.lhs), "=", Select(dt, cmp("==", before, here), one, zero),
                       [str(r) for r in s.ranges[: len(s.lhs)]])
            op = "+="
        else:
            op = "+=!"
        self._emit(name, list(s.lhs), op, Select(dt, cmp("==", f, here), one, zero),
                   ranges + self._exists(self._domain(k, s), Select(dt, cmp("==", f, here), one, zero), _box(s)))
        # each tie's share of the gradient, once per point of the left side (not per point of the window)
        ties = Read(dt, name, here.subs)
        share = self.fresh(f"d_{s.tensor}_share")
        g = Read(dt, self.state[s.tensor][1], here.subs)
        self._emit(share, list(s.lhs), "=", Select(dt, cmp(">", ties, zero), Binop(dt, "/", g, ties), zero),
                   [str(r) for r in s.ranges[: len(s.lhs)]])
        return Read(dt, share, here.subs)

    def _transition(self, k: int, s: Statement, f: TExpr, g: Read, here: Read, share: Read | None,
                    self_key: Key | None) -> None:
        """Turn the gradient of the tensor after statement ``k`` into the gradient before it."""
        V, dt = s.tensor, self.tensors[s.tensor].dtype
        lhs_ranges = [str(r) for r in s.ranges[: len(s.lhs)]]
        if s.op == "+" and not s.init:
            return
        if s.init:
            if self._box_covers(s):
                del self.state[V]
                return
            self._update(V, list(s.lhs), const(dt, 0), lhs_ranges)
            return
        if s.op in ("min", "max"):
            assert share is not None
            before = self._value_read(V, self.before[k].get(V), here.subs)
            self._update(V, list(s.lhs), Select(dt, cmp("==", before, here), share,
                                                const(dt, 0)), lhs_ranges)
            return
        if s.op == "*":
            value = mul(g, f) or const(dt, 0)
            self._update(V, list(s.lhs), value, lhs_ranges + self._exists(self._domain(k, s), value, _box(s)))
            return
        d = diff(f, self_key) if self_key is not None else None
        if d is None and self._covers(s):
            del self.state[V]
            return
        if d is not None and d == const(dt, 1):
            return  # V(l) = V(l) + ...: the gradient passes through unchanged
        value = (mul(g, d) if d is not None else None) or const(dt, 0)
        self._update(V, list(s.lhs), value, lhs_ranges + self._exists(self._domain(k, s), value, _box(s)))

    def _update(self, V: str, idx: list[str], value: TExpr, where: list[str]) -> None:
        """``dV(idx) = value`` in place (the gradient of an output is copied first: it is an input)."""
        kind, name = self.state[V]
        if kind == "param":
            work = self._work_copy(V, name)
            value = rewrite(value, read=lambda r: replace(r, tensor=work) if r.tensor == name else r)
            name = work
        self._emit(name, idx, "=", value, where)

    def _work_copy(self, V: str, param: str) -> str:
        t = self.tensors[V]
        work = self.fresh(f"d_{V}_acc")
        idx = [self.fresh(f"i{p}") for p in range(len(t.dims))]
        self._emit(work, idx, "=", Read(t.dtype, param, tuple(Sym.var(i, "index") for i in idx)),
                   [f"{i} in 0:{d}" for i, d in zip(idx, t.dims)])
        self.state[V] = ("work", work)
        return work

    # ---- contributions ----
    def _accumulate(self, k: int, s: Statement, key: Key, contrib: TExpr) -> None:
        """Add ``contrib`` (in the indices of statement ``k``) into the gradient of the read ``key``."""
        vname, subs = key
        t = self.value_of[vname][0]
        target = self.tensors[t]
        ri = self._reindex(k, s, subs, target)
        value = rewrite(contrib, index=ri.env)
        if ri.guards:
            cond = ri.guards[0]
            for gd in ri.guards[1:]:
                cond = Binop("bool", "&&", cond, gd)
            value = Select(value.dtype, cond, value, const(value.dtype, 0))
        lhs_syms = tuple(Sym.var(y, "index") for y in ri.lhs)
        domain = [_as_read(rewrite(r, index=ri.env)) for r in self._domain(k, s)]
        domain = [r for r in domain if not (r.tensor == vname and r.subs == lhs_syms)]
        box = {y: (Sym.of(0), d) for y, d in zip(ri.lhs, target.dims)}
        box.update({v: (s.range(v).lo, s.range(v).hi) for v in ri.free})
        lhs, free = tuple(ri.lhs), tuple(ri.free)
        ph = phases(value, box, lhs, free, self._dims_of, self.fresh) if free and not ri.guards else None
        if ph is not None:  # a strided sum, in phases: into a temporary, read back below
            value = rewrite(value, index=ph.env)
            domain = [_as_read(rewrite(r, index=ph.env)) for r in domain]
            for cp in ph.copies:  # the window in phases, the gradient padded: a box-shaped sum
                copy = self.fresh(cp.stem)
                self._emit(copy, list(cp.idx), "=", cp.source, [f"{i} in 0:{e}" for i, e in zip(cp.idx, cp.extents)])
                value = _substitute(value, cp.read, Read(cp.read.dtype, copy, cp.at))
                domain = [r for r in domain if (r.tensor, r.subs) != (cp.read.tensor, cp.read.subs)]
            box = {**{y: box[y] for y in lhs if y not in ph.env}, **ph.ranges,
                   **{v: box[v] for v in free if v not in ph.env}}
            lhs, free = ph.lhs, ph.free
        where = [f"{y} in {box[y][0]}:{box[y][1]}" for y in (*lhs, *free)]
        if free:  # a sum over a window: its factors read out of bounds from zero-padded copies
            padded: dict[str, Pad] = {}  # copies made below where the sum reads them, not split
            for p in pads(value, box, lhs, self._dims_of, frozenset(s.reductions)):
                padded[name := f"{p.read.tensor}?{len(padded)}"] = p  # a placeholder: no def name has a '?'
                value = _substitute(value, p.read, p.shifted(name))
                domain = [r for r in domain if (r.tensor, r.subs) != (p.read.tensor, p.read.subs)]
            for sp in splits(value, box, free, lambda t: padded[t].extents if t in padded else self._dims_of(t)):
                value = _substitute(value, sp.read, sp.reread(self._split(sp, padded.get(sp.read.tensor)), box))
                domain = [r for r in domain if (r.tensor, r.subs) != (sp.read.tensor, sp.read.subs)]
            read = {r.tensor for r in reads(value)}
            names = {name: self._padded(p) for name, p in padded.items() if name in read}
            value = rewrite(value, read=lambda r: replace(r, tensor=names[r.tensor]) if r.tensor in names else r)
        where += self._exists(domain, value, box)
        if ph is not None:
            summed = self.fresh(f"d_{t}_phases")
            self._emit(summed, list(lhs), "+=!", convert(value, target.dtype), where)
            value, free = read_back(summed, target.dtype, ph), ()
            where = [f"{y} in 0:{d}" for y, d in zip(ri.lhs, target.dims)]
        st = self.state.get(t)
        if st is None:
            name = self.fresh(f"d_{t}")
            self.state[t] = ("work", name)
            op = "=" if not free else "+=!"  # nothing left to sum: each point takes one contribution
        else:
            name = st[1] if st[0] == "work" else self._work_copy(t, st[1])
            op = "+="
        self._emit(name, ri.lhs, op, convert(value, target.dtype), where)

    def _domain(self, k: int, s: Statement) -> list[Read]:
        """The reads that bound statement ``k``'s domain: its left side's gradient, its unconditional
        affine reads and its ``where exists`` accesses (as reads of the versions it sees)."""
        g = Read(self.tensors[s.tensor].dtype, self.state[s.tensor][1], tuple(Sym.var(i, "index") for i in s.lhs))
        out = [g]
        for r in reads(s.rhs):
            if not r.conditional and all(isinstance(x, Sym) for x in r.subs):
                out.append(self._shape_read(r.tensor, self.before[k].get(r.tensor), r.subs))
        for a in s.accesses:
            if a.kind == "exists":
                if any(x is None for x in a.subs):
                    continue
                out.append(self._shape_read(a.tensor, self.before[k].get(a.tensor), tuple(a.subs)))
        return out

    def _shape_read(self, t: str, k: int | None, subs: tuple) -> Read:
        """A read of a tensor shaped like ``t`` for a ``where exists`` clause: ``t``'s gradient when
        the backward has one at this point (saves recomputing a value only its shape is needed of)."""
        st = self.state.get(t)
        if k is not None and st is not None:
            return Read(self.tensors[t].dtype, st[1], subs)
        return self._value_read(t, k, subs)

    def _exists(self, domain: list[Read], value: TExpr, box: dict[str, tuple[Sym, Sym]]) -> list[str]:
        """``where exists`` clauses for the accesses of ``domain`` that ``value`` does not read at
        every point and that may leave their tensor somewhere in ``box`` (the statement's ranges)."""
        present = {(r.tensor, r.subs) for r in uncond(value)}
        out: list[str] = []
        for r in domain:
            if (r.tensor, r.subs) in present or not r.subs or self._inside(r, box):
                continue
            present.add((r.tensor, r.subs))
            out.append("exists " + read_text(r.tensor, r.subs))
        return out

    def _dims_of(self, name: str) -> tuple[Sym, ...] | None:
        """The dimensions of the backward def's tensor ``name`` (a forward value or a gradient)."""
        of = self.value_of[name][0] if name in self.value_of else \
            next((t for t, (_, n) in self.state.items() if n == name), None)
        return None if of is None else tuple(self.tensors[of].dims)

    def _padded(self, p: Pad) -> str:
        """The zero-padded copy ``p`` reads, made once before its first reader (``gradpad``)."""
        return self._copy(p.read, (p.low, p.extents), "pad", p.extents,
                          lambda idx: tuple(i - lo for i, lo in zip(idx, p.low)))

    def _split(self, sp: Split, pad: Pad | None = None) -> str:
        """The deinterleaved copy ``sp`` reads, made once before its first reader (``gradpad``); of
        a zero-padded copy ``pad``, read from ``pad``'s tensor at once (zeros where that is out of
        bounds: one copy, not two)."""
        low = pad.low if pad is not None else (Sym.of(0),) * len(sp.extents[:-1])
        r = pad.read if pad is not None else sp.read
        return self._copy(r, ("split", sp.stride, low, sp.extents), "split", sp.extents,
                          lambda idx: (*(i - lo for i, lo in zip(idx[:-2], low)),
                                       idx[-1] * sp.stride + idx[-2] - low[-1]))

    def _copy(self, r: Read, key: tuple, kind: str, extents: tuple[Sym, ...],
              subs: Callable[[tuple[Sym, ...]], tuple[Sym, ...]]) -> str:
        """A copy of ``r``'s tensor, ``copy(idx) = tensor(subs(idx)) where idx in 0:extents``, emitted
        before its first reader; once per key for a fixed value (a gradient still summing: a copy
        per reader)."""
        fixed = r.tensor in self.value_of or ("param", r.tensor) in self.state.values()
        at = (r.tensor, *key)
        name = self.pad_copies.get(at) if fixed else None
        if name is None:
            name = self.fresh(f"{r.tensor}_{kind}")
            if fixed:
                self.pad_copies[at] = name
            idx = [self.fresh(f"p{k}") for k in range(len(extents))]
            self._emit(name, idx, "=", Read(r.dtype, r.tensor, subs(tuple(Sym.var(i, "index") for i in idx))),
                       [f"{i} in 0:{e}" for i, e in zip(idx, extents)])
        return name

    def _inside(self, r: Read, box: dict[str, tuple[Sym, Sym]]) -> bool:
        """Whether read ``r`` stays in bounds for every point of ``box`` (for all sizes)."""
        dims = self._dims_of(r.tensor)
        if dims is None:
            return False
        for sub, dim in zip(r.subs, dims):
            if not isinstance(sub, Sym) or not sub.indices() <= box.keys():
                return False
            lo, hi = bounds(sub, box)
            if sign_of(lo) != 1 or sign_of(dim - 1 - hi) != 1:
                return False
        return True

    def _emit(self, name: str, idx: list[str], op: str, value: TExpr, where: list[str]) -> None:
        self._note_reads(value)
        for w in where:
            if w.startswith("exists "):
                n = w[len("exists "):].split("(")[0]
                if n in self.value_of:
                    self.needed.add(self.value_of[n])
        self.lines.append(Line(name, tuple(idx), op, value, tuple(where)))

    # ---- re-indexing ----
    def _reindex(self, k: int, s: Statement, subs: tuple, target: Tensor) -> _Reindex:
        """Plain left-side names for an access ``target(subs)`` of statement ``s``: each subscript
        solves for one of the statement's indices where it can, else becomes an equality test."""
        rng = {r.name: (r.lo, r.hi) for r in s.ranges}
        pivots: dict[str, Sym] = {}
        lhs: list[str | None] = [None] * len(subs)
        for p, sub in enumerate(subs):
            v = plain_var(sub)
            if v is not None and v in rng and v not in pivots:
                lhs[p] = v
                pivots[v] = Sym.var(v, "index")
        raw: list[tuple[str, object, object]] = []
        exact: set[str] = set()  # solved as a remainder: inside its range by construction
        for p, sub in enumerate(subs):
            if lhs[p] is not None:
                continue
            y = self.fresh(f"x{p}")
            lhs[p] = y
            ysym = Sym.var(y, "index")
            if not isinstance(sub, Sym):
                raw.append(("eq", ysym, sub))
                continue
            sub2 = sub.subs(pivots)
            cands = [(v.name, c) for v, c in sub2.terms if isinstance(v, Var) and v.kind == "index"
                     and v.name in rng and v.name not in pivots and not _nested(sub2, v.name)]
            if not cands:
                raw.append(("eq", ysym, sub2))
                continue
            window = _window(sub2, cands, rng)
            if window is not None:  # a stride over a window no wider than it: both indices solve
                v, c, u, lo, width = window
                num = ysym - (sub2 - Sym.var(v, "index") * c - Sym.var(u, "index"))
                vsol = floordiv(num - lo, c)
                usol = num - vsol * c
                if width < c:
                    raw.append(("lt", mod(num - lo, c), width))
                pivots = {q: e.subs({v: vsol, u: usol}) for q, e in pivots.items()}
                pivots[v], pivots[u] = vsol, usol
                exact.add(u)
                continue
            others = [x for q, x in enumerate(subs) if q != p and isinstance(x, Sym)]
            v, c = min(cands, key=lambda vc: (not self._implied(k, s, vc[0]), abs(vc[1]) != 1,
                                              sum(vc[0] in o.indices() for o in others), vc[0] not in s.lhs))
            rest = sub2 - Sym.var(v, "index") * c
            if abs(c) == 1:
                sol = (ysym - rest) * c
            else:
                num = ysym - rest if c > 0 else rest - ysym
                sol = floordiv(num, abs(c))
                raw.append(("div", num, abs(c)))
            pivots = {u: e.subs({v: sol}) for u, e in pivots.items()}
            pivots[v] = sol
        for v in pivots:
            if v in exact:
                continue
            lo_ok, hi_ok = self._implied_sides(k, s, v, (subs, target.dims))
            if not (lo_ok and hi_ok):
                lo, hi = rng[v]
                raw.append(("box", Sym.var(v, "index"), (None if lo_ok else lo, None if hi_ok else hi)))
        guards: list[TExpr] = []
        idx = T.INDEX
        for kind, a, b in raw:
            if kind == "eq":
                assert isinstance(a, Sym)
                rhs = IndexExpr(idx, b.subs(pivots)) if isinstance(b, Sym) else rewrite(b, index=pivots)  # type: ignore
                guards.append(cmp("==", IndexExpr(idx, a), convert(rhs, idx) if T.is_int(rhs.dtype) else rhs))
            elif kind == "div":
                assert isinstance(a, Sym) and isinstance(b, int)
                guards.append(cmp("==", IndexExpr(idx, mod(a.subs(pivots), b)), const(idx, 0)))
            elif kind == "lt":
                assert isinstance(a, Sym) and isinstance(b, int)
                guards.append(cmp("<", IndexExpr(idx, a), const(idx, b)))
            else:
                assert isinstance(a, Sym) and isinstance(b, tuple)
                e = a.subs(pivots)
                lo, hi = b
                if lo is not None:
                    guards.append(cmp(">=", IndexExpr(idx, e), IndexExpr(idx, lo)))
                if hi is not None:
                    guards.append(cmp("<", IndexExpr(idx, e), IndexExpr(idx, hi)))
        env = {v: e for v, e in pivots.items() if e != Sym.var(v, "index")}
        free = [v for v in s.indices if v not in pivots]
        return _Reindex([y for y in lhs if y is not None], env, free, guards)

    def _implied(self, k: int, s: Statement, v: str, target: tuple[tuple, tuple[Sym, ...]] | None = None) -> bool:
        return all(self._implied_sides(k, s, v, target))

    def _implied_sides(self, k: int, s: Statement, v: str,
                       target: tuple[tuple, tuple[Sym, ...]] | None = None) -> tuple[bool, bool]:
        """Whether the lower and the upper bound of index ``v``'s range in statement ``s`` are each
        where one of its domain accesses (or the ``target`` access, subscripts and dims) leaves its
        tensor, so that dropping that bound keeps the domain."""
        lo, hi = s.range(v).lo, s.range(v).hi
        extra = {} if target is None else {None: target[1]}
        accesses: list[tuple[str | None, tuple]] = [] if target is None else [(None, target[0])]
        accesses += [(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs))]
        accesses += [(r.tensor, r.subs) for r in reads(s.rhs) if not r.conditional]
        accesses += [(a.tensor, a.subs) for a in s.accesses if a.kind == "exists"]
        lo_ok = hi_ok = False
        for tname, subs in accesses:
            dims = extra[None] if tname is None else self.tensors[tname].dims
            for sub, dim in zip(subs, dims):
                if not isinstance(sub, Sym):
                    continue
                off = sub - Sym.var(v, "index")
                if off.is_const():
                    lo_ok = lo_ok or _same(lo, Sym.of(-off.const))
                    hi_ok = hi_ok or _same(hi, dim - off.const)
        return lo_ok, hi_ok

    def _covers(self, s: Statement) -> bool:
        """Whether ``=`` statement ``s`` writes every point of its tensor."""
        if not self._box_covers(s):
            return False
        rng = {r.name: (r.lo, r.hi) for r in s.ranges}
        accs: list[tuple[str, tuple]] = [(r.tensor, r.subs) for r in reads(s.rhs) if not r.conditional]
        accs += [(a.tensor, a.subs) for a in s.accesses if a.kind == "exists"]
        for tname, subs in accs:
            for sub, dim in zip(subs, self.tensors[tname].dims):
                if not isinstance(sub, Sym):
                    continue
                lo, hi = bounds(sub, rng)
                if sign_of(lo) != 1 and not (lo.is_const() and lo.const >= 0):
                    return False
                if sign_of(dim - 1 - hi) != 1:
                    return False
        return True

    def _box_covers(self, s: Statement) -> bool:
        dims = self.tensors[s.tensor].dims
        return all(r.lo.is_const() and r.lo.const == 0 and _same(r.hi, d) for r, d in zip(s.ranges, dims))

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
        if k != self.writes[s.tensor][-1] or s.op != "=" or s.reductions or not _calls(s.rhs) or not self._covers(s):
            return None
        outputs = {t.name for t in self.c.outputs}
        for j in range(k + 1, len(self.stmts)):
            o = self.stmts[j]
            e = o.rhs
            same = {self.tensors[o.tensor].dtype, self.tensors[s.tensor].dtype, e.dtype}  # no narrower output
            if o.tensor not in outputs or j != self.writes[o.tensor][-1] or o.op != "=" or o.reductions \
                    or len(same) > 1 \
                    or not (isinstance(e, Binop) and e.op == "/" and isinstance(e.lhs, Read)) \
                    or e.lhs.tensor != s.tensor or self.before[j].get(s.tensor) != k or not self._covers(o):
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
            return self._box_covers(s)
        return s.op == "=" and self._covers(s)


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


def _box(s: Statement) -> dict[str, tuple[Sym, Sym]]:
    return {r.name: (r.lo, r.hi) for r in s.ranges}


def _as_read(e: TExpr) -> Read:
    assert isinstance(e, Read)
    return e


def _substitute(e: TExpr, old: TExpr, new: TExpr) -> TExpr:
    """``e`` with each subexpression equal to ``old`` replaced by ``new``."""
    if e == old:
        return new
    if isinstance(e, Binop):
        return replace(e, lhs=_substitute(e.lhs, old, new), rhs=_substitute(e.rhs, old, new))
    if isinstance(e, (Unop, Convert)):
        return replace(e, arg=_substitute(e.arg, old, new))
    if isinstance(e, Select):
        return replace(e, cond=_substitute(e.cond, old, new), then=_substitute(e.then, old, new),
                       other=_substitute(e.other, old, new))
    if isinstance(e, Call):
        return replace(e, args=tuple(_substitute(a, old, new) for a in e.args))
    return e


def _window(sub: Sym, cands: list[tuple[str, int]], rng: Mapping[str, tuple[Sym, Sym]]
            ) -> tuple[str, int, str, Sym, int] | None:
    """``(v, c, u, lo, width)`` when ``sub`` is ``c*v + u + ...`` with a stride ``c > 1`` and an
    index ``u`` whose range ``lo:lo + width`` is no wider than ``c`` (a pooling window, a
    non-overlapping patch): each value of ``sub`` then comes from at most one ``(v, u)``, so both
    solve (``v = (y - lo) / c``, ``u`` the remainder) and no sum over ``u`` is left."""
    for u, cu in cands:
        if cu != 1:
            continue
        lo, hi = rng[u]
        width = hi - lo
        if not width.is_const() or width.const < 1:
            continue
        for v, c in cands:
            if v != u and c >= max(2, width.const):
                return v, c, u, lo, width.const
    return None


def _nested(s: Sym, v: str) -> bool:
    """Whether index ``v`` occurs in ``s`` inside a floor division, modulo, min or max."""
    return any(isinstance(a, (FloorDiv, Mod, MinMax)) and v in Sym.of(a).indices() for a, _ in s.terms)


def _same(a: Sym, b: Sym) -> bool:
    d = a - b
    return d.is_const() and d.const == 0


# ---- kernels: derived or user-supplied backward defs ----------------------------------------------


def user_backward(fwd: CheckedDef, bwd: CheckedDef) -> Backward:
    """A hand-written backward def for ``fwd``, checked against the convention: its params are the
    forward's inputs, then (optionally) its outputs, then the gradients of its outputs; its
    outputs are the gradients of the forward's inputs (all of them, or the float ones), in order."""
    n_in, n_out = len(fwd.inputs), len(fwd.outputs)
    loc = bwd.source.name.span.location()
    names = [t.name for t in bwd.inputs]
    if len(names) == n_in + n_out:
        roles = [("input", t.name) for t in fwd.inputs] + [("grad", t.name) for t in fwd.outputs]
    elif len(names) == n_in + 2 * n_out:
        roles = [("input", t.name) for t in fwd.inputs] + [("output", t.name) for t in fwd.outputs] + \
            [("grad", t.name) for t in fwd.outputs]
    else:
        raise TcGradientError(f"backward def '{bwd.name}' takes {len(names)} params; a backward of {fwd.name} takes "
                              f"its {n_in} inputs, optionally its {n_out} outputs, then the gradients of its "
                              f"{n_out} outputs ({n_in + n_out} or {n_in + 2 * n_out} params)", loc)
    floats = [t.name for t in fwd.inputs if T.is_float(t.dtype)]
    if len(bwd.outputs) == n_in:
        grads = [t.name for t in fwd.inputs]
    elif len(bwd.outputs) == len(floats):
        grads = floats
    else:
        raise TcGradientError(f"backward def '{bwd.name}' returns {len(bwd.outputs)} tensors; a backward of "
                              f"{fwd.name} returns the gradient of each of its inputs ({n_in}) or of each float "
                              f"input ({len(floats)})", loc)
    params = tuple(Param(n, role, of) for n, (role, of) in zip(names, roles))
    return Backward(fwd.name, bwd.name, definition(bwd.source) + "\n", params, tuple(grads), (), user=True)


def attach(kernel: object, backward: str | None, save: Iterable[str] | Mapping[str, bool] | None,
           single: bool = True, filename: str = "<backward>") -> None:
    """Give ``kernel`` (a ``tcdsl.api.Kernel``) a hand-written backward def or a ``save=`` choice;
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
    kernel_class: Any = type(kernel)  # the backward's kernel is of the same class (autodiff never imports the API)
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
