"""Explanations: ``Lowered -> Explanation``, why each loop is or is not parallel and what was fused.

For every loop of the generated nest: the def's indices it walks (``m``, ``r_k``; ``by 32`` for a
loop over tiles), parallel (and how it runs: OpenMP, SIMD) or serial with one dependence it
carries, as a concrete pair of statement instances found by isl. For the statements: which share a
loop nest, and for those that do not, whether Max fusion would have put them together. An
``Explanation`` is the text (a ``str``) with the loops as rows, and an HTML table in notebooks.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import islpy as isl

from .core.options import MappingOptions
from .core.printer import stmt as print_stmt
from .derivative import text
from .polyhedral import schedule
from .polyhedral.loopir import LCall, LFor, LIf, LNode, expr_vars, walk
from .polyhedral.loopir import expr_text as lexpr
from .polyhedral.scop import Scop, stmt_order


@dataclass(frozen=True)
class LoopRow:
    """One loop of the nest, for the text and the table."""

    depth: int
    var: str  # the generated loop variable (c0, c1, ...)
    walks: str  # the def's indices it moves, with the step of a loop over tiles ("m by 32")
    bounds: str  # "from 0 while (c0 <= 63) step 32"
    runs: str  # "parallel, OpenMP parallel for", "serial"
    why: str  # for a serial loop: the dependence it carries


class Explanation(str):
    """``explain()``'s text, with its loops as ``rows`` and an HTML form for notebooks."""

    rows: tuple[LoopRow, ...]

    def __new__(cls, text: str, rows: tuple[LoopRow, ...] = ()) -> Explanation:
        self = super().__new__(cls, text)
        self.rows = rows
        return self

    def _repr_html_(self) -> str:
        head, _, _ = self.partition("\nloops:")
        table = "".join(
            f"<tr><td style='text-align:left;padding-left:{1 + 1.5 * r.depth}em'><code>{html.escape(r.walks)}</code>"
            f"</td><td><code>{html.escape(r.var)}</code></td><td style='text-align:left'>{html.escape(r.runs)}</td>"
            f"<td style='text-align:left'><code>{html.escape(r.why)}</code></td></tr>" for r in self.rows)
        return (f"<pre>{html.escape(head.rstrip())}</pre><table><thead><tr><th>loop over</th><th>variable</th>"
                f"<th>runs</th><th>why not parallel</th></tr></thead><tbody>{table}</tbody></table>")

    def __reduce__(self) -> tuple:
        return (Explanation, (str(self), self.rows))


def loop_rows(nodes: tuple[LNode, ...], scop: Scop, depth: int = 0) -> list[LoopRow]:
    """The loops of ``nodes``, outermost first, each named by the def's indices it moves."""
    rows: list[LoopRow] = []
    for n in nodes:
        if isinstance(n, LFor):
            if n.parallel:
                how = ", OpenMP parallel for" if n.omp else (", vectorised (omp simd)" if n.simd else "")
                runs, why = f"parallel{how}", ""
            else:
                runs, why = "serial", f"carries {n.note or 'a dependence'}"
            bounds = f"from {lexpr(n.init)} while {lexpr(n.cond)} step {n.step}"
            rows.append(LoopRow(depth, n.var, _walks(n, scop), bounds, runs, why))
            rows += loop_rows(n.body, scop, depth + 1)
        elif isinstance(n, LIf):
            rows += loop_rows(n.then, scop, depth) + loop_rows(n.other, scop, depth)
    return rows


def _walks(n: LFor, scop: Scop) -> str:
    """The statement indices whose values loop ``n``'s variable moves, in the def's own names."""
    names: list[str] = []
    for call in walk(n.body):
        if isinstance(call, LCall):
            for index, arg in zip(scop.stmt(call.stmt).indices, call.args):
                if n.var in expr_vars(arg) and index not in names:
                    names.append(index)
    label = ", ".join(names) or "-"
    return f"{label} by {n.step}" if n.step > 1 else label


def explain(low, options: MappingOptions) -> Explanation:  # low: compiler.Lowered (no import cycle)
    scop = low.scop
    c = scop.inst.checked
    sizes = ", ".join(f"{k}={v}" for k, v in scop.inst.sizes.items())
    out = [f"def {c.name} ({sizes}), {low.fusion_why}", "", "statements:"]
    for st in scop.stmts:
        s = scop.tc_statement(st.name)
        what = "init of statement" if st.kind == "init" else "statement"
        out.append(f"  {st.name}[{', '.join(st.indices)}]: {what} {s.number} (line {s.span.line}): "
                   f"{print_stmt(s.source)}")
        if s.scatter is not None and st.kind == "update":
            x = s.scatter[0]
            others = ", ".join(i for i in s.indices if i != x)
            out.append(f"    a scatter: {x} = {text(s.scatter[1])}, one element per point of {others or 'the def'} "
                       f"(a value outside {s.range(x).lo}:{s.range(x).hi} adds nothing)")
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
    rows = loop_rows(low.ir.body, scop)
    out += [f"{'  ' * (1 + r.depth)}for {r.var} ({r.walks}) {r.bounds}: {r.runs}{', ' + r.why if r.why else ''}"
            for r in rows]
    return Explanation("\n".join(out), tuple(rows))


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
