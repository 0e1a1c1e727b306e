"""Rich display: ``text -> HTML`` for notebooks (Jupyter calls ``_repr_html_``), a leaf module any
layer may print with. A def, highlighted (keywords, types, reductions, the def's name, the range
comments); a schedule tree as nested, foldable nodes; a tuning result as a summary table, its
options (``MappingOptions._repr_html_``) and its plot. Printers only: every decision they show was made before.
"""

from __future__ import annotations

import base64
import html
import io
import re
from typing import Any

_TOKENS = re.compile(r"(?P<comment>#[^\n]*)|(?P<kw>\bdef\b|\bwhere\b|\bin\b)"
                     r"|(?P<type>\b(?:bool|u?int(?:8|16|32|64)|float(?:16|32|64)?|double)\b)"
                     r"|(?P<red>(?:\+|\*|max|min)=!?|=!|->)")
_STYLE = {"comment": "color:#6a737d", "kw": "color:#d73a49;font-weight:bold", "type": "color:#005cc5",
          "red": "color:#b31d28;font-weight:bold"}


def highlight(tc_text: str) -> str:
    """TC text as HTML in a ``<pre>``, its keywords, types, reductions and comments coloured."""
    out, at = [], 0
    for m in _TOKENS.finditer(tc_text):
        out.append(html.escape(tc_text[at:m.start()]))
        kind = m.lastgroup or ""
        out.append(f"<span style='{_STYLE[kind]}'>{html.escape(m.group(0))}</span>")
        at = m.end()
    out.append(html.escape(tc_text[at:]))
    text = re.sub(r"(def</span> )(\w+)", r"\1<b>\2</b>", "".join(out))
    return f"<pre style='line-height:1.35'>{text}</pre>"


class Preformatted(str):
    """Text that a notebook shows as it prints (a schedule tree, generated code), not as a quoted string."""

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self)}</pre>"

    def __reduce__(self) -> tuple:
        return (Preformatted, (str(self),))


_NODE_STYLE = {"domain": "color:#6f42c1", "band": "color:#005cc5", "filter": "color:#22863a", "mark": "color:#e36209",
               "sequence": "color:#6a737d", "set": "color:#6a737d"}


class ScheduleTree(Preformatted):
    """A schedule tree as ``treeprint`` prints it (a node per line, indented by depth, ``| `` lines
    holding its sets and maps); a notebook shows it as nested, foldable nodes coloured by kind."""

    def _repr_html_(self) -> str:
        lines = self.split("\n")
        head = [ln for ln in lines if ln.startswith("#")]
        nodes: list[tuple[int, str, list[str]]] = []  # (depth, node line, its | lines)
        for ln in lines:
            body = ln.lstrip(" ")
            if ln.startswith("#") or not body:
                continue
            if body.startswith("| ") and nodes:
                nodes[-1][2].append(body[2:])
            else:
                nodes.append(((len(ln) - len(body)) // 2, body, []))
        out = ["<div style='font-family:monospace'>"]
        out += [f"<div style='color:#6a737d'>{html.escape(h)}</div>" for h in head]
        depth = -1
        for d, line, details in nodes:
            while depth >= d:
                out.append("</details>")
                depth -= 1
            kind = line.split(" ", 1)[0]
            title = (f"<span style='{_NODE_STYLE.get(kind, '')};font-weight:bold'>{html.escape(kind)}</span>"
                     f"{html.escape(line[len(kind):])}")
            out.append(f"<details open style='margin-left:{1.2 if d else 0}em'><summary>{title}</summary>")
            out += [f"<div style='margin-left:2.2em;color:#444;white-space:pre'>{html.escape(x)}</div>"
                    for x in details]
            depth = d
        out += ["</details>"] * (depth + 1) + ["</div>"]
        return "".join(out)

    def __reduce__(self) -> tuple:
        return (ScheduleTree, (str(self),))


def tune_result(result: Any) -> str:
    """A ``TuneResult`` as a summary table, the options kept, and its plot (where matplotlib is)."""
    decision = result.decision.why if result.decision is not None else "no candidate was valid"
    rows = [("best", f"{result.time_s * 1e3:.4g} ms"), ("defaults", f"{result.default_time_s * 1e3:.4g} ms"),
            ("speed-up", f"{result.speedup:.2f}x"), ("candidates evaluated", str(result.evaluations)),
            ("invalid", str(result.invalid)), ("stopped by", result.stopped), ("final check", decision)]
    table = "".join(f"<tr><td style='text-align:left'>{k}</td><td style='text-align:left'>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    return f"<table>{table}</table>{result.options._repr_html_()}{_plot(result)}"


def _plot(result: Any) -> str:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return ""
    if not result.generations:
        return ""
    ax = result.plot()
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(ax.figure)
    png = base64.b64encode(buf.getvalue()).decode()
    return f"<img alt='best and median time per generation' src='data:image/png;base64,{png}'/>"
