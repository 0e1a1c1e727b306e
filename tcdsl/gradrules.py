"""Reverse-mode rules, one statement at a time: a forward ``Statement`` -> the backward def's
gradient statements through it (``list[Line]``): each float read gets the gradient of the left side
times its partial derivative; the written tensor's gradient becomes its gradient before the statement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from .backward import Param, default_saved
from .core import dtypes as T
from .core.affine import Sym, bounds, sign_of
from .core.checked import (
    Binop,
    Call,
    CheckedDef,
    Convert,
    Read,
    Select,
    Statement,
    TExpr,
    Unop,
    convert,
    reads,
)
from .core.errors import TcGradientError
from .core.sema import BUILTINS
from .derivative import Key, cmp, const, diff, key_of, mul, read_text, rewrite
from .derivative import unconditional_reads as uncond
from .gradindex import box_covers, covers, reindex
from .gradlines import Line
from .gradpad import Pad, Split, pads, splits
from .gradphase import phases, read_back
from .shift import invariant_shifts

Version = tuple[str, "int | None"]  # (tensor, statement after which the value holds); None: an input


class Derivation:
    """One derivation's state: the forward def's statements and the versions of each tensor they
    write, the names taken, the gradient of each tensor so far and the backward statements emitted;
    with the rules that take the gradients back through one statement (``_statement``)."""

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
            if box_covers(s, self.tensors):
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
        if d is None and covers(s, self.tensors):
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
        ri = reindex(s, subs, target, self.tensors, self.fresh)
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
