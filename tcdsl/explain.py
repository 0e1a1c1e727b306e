"""Explanations: ``Lowered -> str``, why each loop is or is not parallel and what was fused.

For every loop of the generated nest: parallel (and how it runs: OpenMP, SIMD) or serial with
one dependence it carries, as a concrete pair of statement instances found by isl. For the
statements: which share a loop nest, and for those that do not, whether Max fusion would have
put them together.
"""

from __future__ import annotations

import islpy as isl

from .core.options import MappingOptions
from .core.printer import stmt as print_stmt
from .polyhedral import schedule
from .polyhedral.loopir import LFor, LIf, LNode
from .polyhedral.loopir import expr_text as lexpr
from .polyhedral.scop import stmt_order


def explain(low, options: MappingOptions) -> str:  # low: compiler.Lowered (no import cycle)
    scop = low.scop
    c = scop.inst.checked
    sizes = ", ".join(f"{k}={v}" for k, v in scop.inst.sizes.items())
    out = [f"def {c.name} ({sizes}), fusion '{options.fusion}'", "", "statements:"]
    for st in scop.stmts:
        s = scop.tc_statement(st.name)
        what = "init of statement" if st.kind == "init" else "statement"
        out.append(f"  {st.name}[{', '.join(st.indices)}]: {what} {s.number} (line {s.span.line}): "
                   f"{print_stmt(s.source)}")
    out += ["", "ranges (inferred or given by `where`; the intersection where reads disagree):"]
    for s in c.stmts:
        shown = [f"{r.name} in {r.lo}:{r.hi} = {r.lo.eval(scop.inst.sizes)}:{r.hi.eval(scop.inst.sizes)}"
                 for r in s.ranges]
        out.append(f"  statement {s.number}: {', '.join(shown) or 'no indices'}")
    out += ["", "fusion:"]
    groups = _nests(low.tree)  # the scheduler's decision (before initialisations get nests of their own)
    if len(groups) == 1:
        out.append(f"  {', '.join(groups[0])} share one loop nest")
    else:
        fused_max = _nests(schedule.compute(scop, low.deps, options.with_(fusion="max")))
        for g in groups:
            out.append(f"  nest: {', '.join(g)}")
        if options.fusion != "max" and len(fused_max) < len(groups):
            out.append(f"  not fused under '{options.fusion}'; fusion 'max' would make {len(fused_max)} nest(s): "
                       + "; ".join(", ".join(g) for g in fused_max))
        elif options.fusion == "max":
            out.append("  even 'max' fusion keeps these nests apart: no legal schedule shares their outer loops")
        else:
            out.append("  fusion 'max' keeps them apart too: no legal schedule shares their outer loops")
    inits = [st.name for st in scop.stmts if st.kind == "init"]
    if inits and len(_nests(low.final)) > len(groups):
        out.append(f"  the initialisations ({', '.join(inits)}) then run in nests of their own, before the "
                   f"reductions they start")
    out += ["", "loops:"]
    _loops(low.ir.body, 1, out)
    return "\n".join(out)


def _nests(sched: isl.Schedule) -> list[list[str]]:
    """The statements of each top-level loop nest, in order."""
    node = sched.get_root()
    while node.n_children() == 1 and node.get_type() in (isl.schedule_node_type.domain,
                                                         isl.schedule_node_type.mark):
        node = node.child(0)
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        groups = []
        for i in range(node.n_children()):
            groups.append(sorted(_names(node.child(i).filter_get_filter()), key=stmt_order))
        return groups
    return [sorted(_names(node.get_domain()), key=stmt_order)]


def _names(uset: isl.UnionSet) -> list[str]:
    names: list[str] = []
    uset.foreach_set(lambda s: names.append(s.get_tuple_name()))
    return names


def _loops(nodes: tuple[LNode, ...], depth: int, out: list[str]) -> None:
    for n in nodes:
        if isinstance(n, LFor):
            head = f"{'  ' * depth}for {n.var} from {lexpr(n.init)} while {lexpr(n.cond)} step {n.step}: "
            if n.parallel:
                how = ", OpenMP parallel for" if n.omp else (", vectorised (omp simd)" if n.simd else "")
                out.append(head + f"parallel{how}")
            else:
                out.append(head + f"serial, carries {n.note or 'a dependence'}")
            _loops(n.body, depth + 1, out)
        elif isinstance(n, LIf):
            _loops(n.then, depth, out)
            _loops(n.other, depth, out)
