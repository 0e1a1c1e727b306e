"""Scop: ``Instance -> Scop``, the polyhedral model of a checked def (isl domains and accesses).

Each TC statement becomes an update statement ``S<n>`` over all its indices and, for the ``!``
forms, an initialisation ``init<n>`` over its left-hand side. Domains hold the index ranges and
the padding-by-domain guards; reads and writes are isl maps to the tensors (gathered dims are
over-approximated by the whole dim); ``order`` is the textual program order. Sizes are fixed to
the instance's values (the default) or kept as isl parameters (``parametric=True``).
Every isl name is generated here (``t_<tensor>``, ``S<n>``, ``p_<size>``, and ``q_<n>`` for a floor
division, modulo, min or max of sizes in a range bound), so TC names never reach isl's parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from tcdsl.core.affine import Atom, Sym, Var
from tcdsl.core.checked import Statement
from tcdsl.core.instance import BoundStmt, Instance


@dataclass(frozen=True)
class ScopStmt:
    name: str  # isl statement name
    number: int  # the TC statement (1-based)
    kind: str  # "init" or "update"
    indices: tuple[str, ...]  # TC index names, in the order of the isl tuple


@dataclass(frozen=True)
class Scop:
    inst: Instance
    parametric: bool
    stmts: tuple[ScopStmt, ...]
    arrays: dict[str, str]  # TC tensor name -> isl array name
    domain: isl.UnionSet = field(compare=False)
    reads: isl.UnionMap = field(compare=False)
    writes: isl.UnionMap = field(compare=False)
    order: isl.UnionMap = field(compare=False)
    context: isl.Set = field(compare=False)
    general: Scop | None = field(default=None, compare=False)  # the same model for every size >= 1 (>= 0)

    def stmt(self, name: str) -> ScopStmt:
        return next(s for s in self.stmts if s.name == name)

    def tc_statement(self, name: str) -> Statement:
        """The TC statement of the isl statement ``name`` (``S<n>`` or ``init<n>``)."""
        return self.inst.checked.statement(self.stmt(name).number)

    def bound_statement(self, name: str) -> BoundStmt:
        """The TC statement of ``name`` as bound at the instance's sizes (ranges, shape, guards)."""
        return self.inst.stmts[self.stmt(name).number - 1]

    def __str__(self) -> str:
        lines = [f"scop {self.inst.checked.name}" + (" (parametric)" if self.parametric else
                                                     f" ({', '.join(f'{k}={v}' for k, v in self.inst.sizes.items())})")]
        for s in self.stmts:
            st = self.tc_statement(s.name)
            lines.append(f"  {s.name}: {s.kind} of statement {s.number} (line {st.span.line}), writes {st.tensor}")
        lines += [f"  domain: {self.domain}", f"  reads: {self.reads}", f"  writes: {self.writes}",
                  f"  order: {self.order}"]
        return "\n".join(lines)


def stmt_order(name: str) -> tuple[int, int]:
    """Textual order of scop statement names: init<n> before S<n>, by statement number."""
    return (int(name.removeprefix("init").removeprefix("S")), 0 if name.startswith("init") else 1)


def build_scop(inst: Instance, parametric: bool = False) -> Scop:
    """The model with the size symbols as isl parameters ``p_<size>``: fixed to the instance's sizes
    (the default; ``general`` then holds the same model for every size of at least 1, which the
    scheduler uses) or free (``parametric=True``, sizes of at least 1).

    A call with a zero size lies outside that general model (its context has every size >= 1,
    and the fixed model cut from it would lose every statement, the initialisations of the ``!``
    forms too, whose domains need not be empty): its fixed and general models are built over
    every size >= 0."""
    if parametric:
        return _build(inst)
    general = _build(inst, least=1 if all(v >= 1 for v in inst.sizes.values()) else 0)
    qs = _bound_params(inst)
    values = [f"p_{k} = {v}" for k, v in inst.sizes.items()]
    values += [f"{q} = {Sym.of(a).eval(inst.sizes)}" for a, q in qs.items()]
    fixed = isl.Set(_params(inst, qs) + "{ : " + (" and ".join(values) or "true") + " }")
    return Scop(inst, False, general.stmts, general.arrays, general.domain.intersect_params(fixed),
                general.reads.intersect_params(fixed), general.writes.intersect_params(fixed),
                general.order.intersect_params(fixed), fixed, general)


def _params(inst: Instance, qs: dict[Atom, str]) -> str:
    return "[" + ", ".join([f"p_{s}" for s in inst.checked.sizes] + list(qs.values())) + "] -> "


def _bound_params(inst: Instance) -> dict[Atom, str]:
    """A parameter ``q_<n>`` for each floor division, modulo, min or max of sizes alone in a range
    bound (``(H - KH) / 2 + 1``). isl's scheduler can search for minutes over domains whose bounds
    divide sizes; over these parameters, every bound is affine."""
    atoms: dict[Atom, str] = {}
    for s in inst.checked.stmts:
        for r in s.ranges:
            for b in (r.lo, r.hi):
                for a in b.atoms():
                    if not isinstance(a, Var) and not Sym.of(a).indices() and a not in atoms:
                        atoms[a] = f"q_{len(atoms)}"
    return atoms


def _build(inst: Instance, least: int = 1) -> Scop:
    """The parametric model over every size ``>= least``."""
    c = inst.checked
    arrays = {t.name: f"t_{t.name}" for t in (*c.inputs, *c.outputs, *c.temps)}
    shapes = {t.name: t.dims for t in (*c.inputs, *c.outputs, *c.temps)}
    qs = _bound_params(inst)
    params = _params(inst, qs)

    def sym(s: Sym, idx: dict[str, str]) -> str:
        env = {k: Sym.var(v, "index") for k, v in idx.items()}
        env.update({k: Sym.var(f"p_{k}", "size") for k in c.sizes})
        return s.subs(env).isl()

    def bound(s: Sym, idx: dict[str, str]) -> str:
        plain = Sym.make({(Var(qs[a], "size") if a in qs else a): k for a, k in s.terms}, s.const)
        return sym(plain, idx)

    depth = max((len(s.ranges) for s in c.stmts), default=0)
    stmts: list[ScopStmt] = []
    domains, reads, writes, order = [], [], [], []
    for s in c.stmts:
        idx = {name: f"i{k}" for k, name in enumerate(s.indices)}
        tup = ", ".join(idx[i] for i in s.indices)
        lhs_tup = ", ".join(idx[i] for i in s.lhs)
        box = [f"{bound(r.lo, idx)} <= {idx[r.name]} < {bound(r.hi, idx)}" for r in s.ranges]
        target = arrays[s.tensor]
        if s.init:
            name = f"init{s.number}"
            stmts.append(ScopStmt(name, s.number, "init", s.lhs))
            cons = " and ".join(box[: len(s.lhs)]) or "true"
            domains.append(f"{name}[{lhs_tup}] : {cons}")
            writes.append(f"{name}[{lhs_tup}] -> {target}[{lhs_tup}]")
            order.append(f"{name}[{lhs_tup}] -> [{_pad([str(s.number), '0', *(idx[i] for i in s.lhs)], depth)}]")
        name = f"S{s.number}"
        stmts.append(ScopStmt(name, s.number, "update", s.indices))
        guards = []
        for acc in s.accesses:
            for d, sub in enumerate(acc.subs):
                if sub is not None and acc.kind != "cond":
                    guards.append(f"0 <= {sym(sub, idx)} < {sym(shapes[acc.tensor][d], idx)}")
        written = f"{target}[{lhs_tup}]"
        if s.scatter is not None:  # one point of the scattered index, writing anywhere in its dim
            x = s.scatter[0]
            box.append(f"{idx[x]} = {bound(s.range(x).lo, idx)}")
            d = s.lhs.index(x)
            dims = [idx[i] if i != x else "g" for i in s.lhs]
            written = f"{target}[{', '.join(dims)}] : 0 <= g < {sym(shapes[s.tensor][d], idx)}"
        cons = " and ".join(box + guards) or "true"
        domains.append(f"{name}[{tup}] : {cons}")
        writes.append(f"{name}[{tup}] -> {written}")
        if s.op != "=":
            reads.append(f"{name}[{tup}] -> {written}")
        for acc in s.accesses:
            if acc.kind not in ("read", "cond"):
                continue
            outs, extra = [], []
            for d, sub in enumerate(acc.subs):
                extent = sym(shapes[acc.tensor][d], idx)
                if sub is None:
                    var = f"g{d}"
                    outs.append(var)
                    extra.append(f"0 <= {var} < {extent}")
                else:
                    outs.append(sym(sub, idx))
                    if acc.kind == "cond":
                        extra.append(f"0 <= {outs[-1]} < {extent}")
            cond = (" : " + " and ".join(extra)) if extra else ""
            reads.append(f"{name}[{tup}] -> {arrays[acc.tensor]}[{', '.join(outs)}]{cond}")
        order.append(f"{name}[{tup}] -> [{_pad([str(s.number), '1', *(idx[i] for i in s.indices)], depth)}]")
    size_env = {k: Sym.var(f"p_{k}", "size") for k in c.sizes}
    defs = [f"p_{k} >= {least}" for k in c.sizes] + [f"{q} = {Sym.of(a).subs(size_env).isl()}" for a, q in qs.items()]
    ctx_text = params + "{ : " + (" and ".join(defs) or "true") + " }"
    context = isl.Set(ctx_text)
    domain = _union_set(params, domains).intersect_params(context)
    return Scop(inst, True, tuple(stmts), arrays, domain,
                _union_map(params, reads).intersect_domain(domain),
                _union_map(params, writes).intersect_domain(domain),
                _union_map(params, order).intersect_domain(domain), context)


def _pad(items: list[str], depth: int) -> str:
    return ", ".join(items + ["0"] * (depth + 2 - len(items)))


def _union_set(params: str, parts: list[str]) -> isl.UnionSet:
    return isl.UnionSet(params + "{ " + "; ".join(parts) + " }")


def _union_map(params: str, parts: list[str]) -> isl.UnionMap:
    return isl.UnionMap(params + "{ " + "; ".join(parts) + " }")
