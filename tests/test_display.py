"""Rich display in notebooks: a kernel's def highlighted, a namespace of defs, explain() as a table
whose loops are named by the def's indices, mapping options with their changes marked, a tuning
result with its plot, and errors with their caret."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.tuner.cache import TuningCache

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"


def test_a_kernel_and_a_namespace_show_their_defs_highlighted() -> None:
    k = tc.define(MM)
    page = k._repr_html_()
    assert "<b>mm</b>" in page and "float32</span>(M, K) A" in page and ">+=!</span>" in page
    assert "<span style='color:#6a737d'># statement 1 (line 1): m in 0:M, n in 0:N, r_k in 0:K</span>" in page
    lib = tc.define(MM + "\ndef twice(float(N) X) -> (Y) { Y(i) = X(i) * 2 }")
    page = lib._repr_html_()
    assert page.index("<code>mm</code>") < page.index("<code>twice</code>") and page.count("<pre") == 2


def test_explain_is_text_and_a_table_of_loops_named_by_the_defs_indices() -> None:
    k = tc.define(MM)
    A, B = np.ones((64, 48), np.float32), np.ones((48, 32), np.float32)
    e = k.explain(A, B)
    assert isinstance(e, str) and str(e).startswith("options: defaults")
    walks = [r.walks for r in e.rows]
    assert set(walks) >= {"m", "n", "r_k"} and any(w.startswith("m by ") for w in walks)
    (serial,) = [r for r in e.rows if r.runs == "serial"]
    assert serial.walks == "r_k" and serial.why.startswith("carries S1[")
    assert f"for {serial.var} (r_k) from" in e  # the text names the loop's indices too
    page = e._repr_html_()
    assert page.count("<tr><td") == len(e.rows) and "<code>r_k</code>" in page and "why not parallel" in page
    again = pickle.loads(pickle.dumps(e))
    assert again == e and again.rows == e.rows


def test_the_schedule_tree_folds_by_node_and_the_code_shows_as_text() -> None:
    k = tc.define(MM)
    A, B = np.ones((16, 8), np.float32), np.ones((8, 12), np.float32)
    tree, code = k.schedule(A, B), k.source(A, B)
    assert tree.startswith("# options: ") and "domain [p_M, p_K, p_N]\n" in tree
    assert "-> {" not in tree and not any(ln.rstrip().endswith("}") for ln in tree.splitlines())  # bodies only
    page = tree._repr_html_()
    nodes = [ln.strip() for ln in tree.splitlines()[1:] if not ln.strip().startswith("|")]
    assert page.count("<details open") == page.count("</details>") == len(nodes)
    # each node nests in the one above it with less indentation: the tree's shape survives
    depth, deepest = 0, 0
    for tag in page.replace("<details open", "\0<").replace("</details>", "\0>").split("\0")[1:]:
        depth += 1 if tag.startswith("<") else -1
        deepest = max(deepest, depth)
    indents = [(len(ln) - len(ln.lstrip())) // 2 for ln in tree.splitlines()[1:] if not ln.strip().startswith("|")]
    assert depth == 0 and deepest == max(indents) + 1
    assert "<span style='color:#005cc5;font-weight:bold'>band</span>" in page and "&lt;= i0 &lt;=" in page
    assert "<span style='color:#e36209;font-weight:bold'>mark</span> register_tile" in page
    assert pickle.loads(pickle.dumps(tree)) == tree and type(pickle.loads(pickle.dumps(tree))) is type(tree)
    assert "&lt;math.h&gt;" in code._repr_html_() and pickle.loads(pickle.dumps(code)) == code


def test_options_mark_what_differs_from_the_defaults() -> None:
    page = tc.MappingOptions(tile=(8, 8), blocks=(4, 2))._repr_html_()
    assert "2 differ from the defaults" in page
    assert "<b>tile</b></td><td style='text-align:left'><code>(8, 8)</code> (default <code>None</code>)" in page
    assert "<b>blocks</b>" in page and "<b>vectorize</b>" not in page and ">vectorize<" in page
    assert "MappingOptions: the defaults" in tc.MappingOptions()._repr_html_()


def test_errors_show_their_caret() -> None:
    with pytest.raises(tc.TcSemanticError) as e:
        tc.define("def f(float(N) X) -> (Y) { Y(i) = Xq(i) }")
    page = e.value._repr_html_()
    assert page.startswith("<pre") and "TcSemanticError: &lt;string&gt;:1:35:" in page and "^^^^^" in page


@pytest.mark.cpu
def test_a_tuning_result_shows_a_summary_its_options_and_its_plot(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))
    assert TuningCache().entries() == []
    k = tc.define(MM)
    result = k.autotune(np.ones((16, 8), np.float32), np.ones((8, 12), np.float32), generations=1, population=3,
                        seed=1, progress=False)
    page = result._repr_html_()
    assert f"<td style='text-align:left'>{result.evaluations}</td>" in page and "speed-up" in page
    assert "MappingOptions:" in page
    assert "<img alt='best and median time per generation' src='data:image/png;base64," in page
