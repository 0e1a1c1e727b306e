"""Schedule tree as text: ``isl.Schedule -> str`` (one line per node, indented by depth).

Bands show their members per statement, permutability, coincidence and loop types; filters and
sequences show which statements they order. Used by ``kernel.schedule()`` and golden tests.
"""

from __future__ import annotations

import islpy as isl

_LOOP_TYPE = {isl.ast_loop_type.unroll: "unroll", isl.ast_loop_type.separate: "separate",
              isl.ast_loop_type.atomic: "atomic"}


def tree_text(sched: isl.Schedule) -> str:
    lines: list[str] = []
    _node(sched.get_root(), 0, lines)
    return "\n".join(lines)


def _body(obj: isl.Map | isl.Set) -> str:
    """``[p_M] -> { S1[i0] : ... }`` as ``S1[i0] : ...``: the parameters are the domain's, printed once."""
    text = str(obj)
    _, arrow, rest = text.partition("-> {") if text.startswith("[") else ("", "", text.lstrip("{"))
    return rest.strip().removesuffix("}").strip() if arrow or text.startswith("{") else text


def _maps(u: isl.UnionMap | isl.UnionSet) -> list[str]:
    items: list[str] = []
    if isinstance(u, isl.UnionMap):
        u.foreach_map(lambda m: items.append(_body(m)))
    else:
        u.foreach_set(lambda s: items.append(_body(s)))
    return sorted(items)


def _node(node: isl.ScheduleNode, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    t = node.get_type()
    if t == isl.schedule_node_type.domain:
        space = node.domain_get_domain().get_space()
        params = [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]
        out.append(f"{pad}domain" + (f" [{', '.join(params)}]" if params else ""))
        for s in _maps(node.domain_get_domain()):
            out.append(f"{pad}  | {s}")
    elif t == isl.schedule_node_type.band:
        n = node.band_n_member()
        coinc = "".join("1" if node.band_member_get_coincident(i) else "0" for i in range(n))
        types = [_LOOP_TYPE.get(node.band_member_get_ast_loop_type(i), "") for i in range(n)]
        extra = f" loops=[{', '.join(x or '-' for x in types)}]" if any(types) else ""
        out.append(f"{pad}band {n} member{'s' * (n != 1)} permutable={int(bool(node.band_get_permutable()))} "
                   f"coincident={coinc}{extra}")
        for m in _maps(node.band_get_partial_schedule_union_map()):
            out.append(f"{pad}  | {m}")
    elif t == isl.schedule_node_type.sequence:
        out.append(f"{pad}sequence")
    elif t == isl.schedule_node_type.set:
        out.append(f"{pad}set")
    elif t == isl.schedule_node_type.filter:
        out.append(f"{pad}filter {', '.join(_maps(node.filter_get_filter()))}")
    elif t == isl.schedule_node_type.mark:
        out.append(f"{pad}mark {node.mark_get_id().get_name()}")
    elif t == isl.schedule_node_type.leaf:
        return
    else:
        out.append(f"{pad}{t}")
    for i in range(node.n_children()):
        _node(node.child(i), depth + 1, out)
