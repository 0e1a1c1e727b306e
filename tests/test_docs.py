"""The documentation site (``make docs``) builds with every Sphinx warning an error, and shows what it
is made of: the public API's docstrings, the README's sections and the notebooks' stored outputs."""

from __future__ import annotations

import html
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")

import tcdsl as tc  # noqa: E402  (after the skips: nothing to check without Sphinx)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("quickstart", "gpu_mapping", "pytorch")


def _text(markup: str) -> str:
    """A page's (or a docstring's) words: tags, code quotes and emphasis marks dropped, spaces collapsed."""
    markup = re.sub(r"<(script|style)\b.*?</\1>", " ", markup, flags=re.S)
    words = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).replace("`", "").replace("*", "").split())
    return re.sub(r"([(\[]) | ([)\],.;:])", r"\1\2", words)  # a tag's space inside brackets, before a comma


def _first_sentence(obj: object) -> str:
    doc = inspect.getdoc(obj)
    assert doc, f"{obj!r} has no docstring"
    return _text(doc).split(". ")[0]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-E", "-j", "1", "-q",
                           "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"sphinx exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return out / "html"


def test_every_public_name_has_an_entry(site: Path) -> None:
    page = (site / "api.html").read_text()
    for name in tc.__all__:
        if name == "__version__":
            continue
        anchor = f'id="module-tcdsl.{name}"' if inspect.ismodule(getattr(tc, name)) else f'id="tcdsl.{name}"'
        assert anchor in page, f"tcdsl.{name} is public but docs/api.rst does not document it"
    for anchor in ('id="tcdsl.tuner.tune.TuneResult"', 'id="module-tcdsl.nn"', 'id="tcdsl.nn.TcModule"'):
        assert anchor in page


def test_the_api_page_shows_the_docstrings(site: Path) -> None:
    from tcdsl.core import options
    from tcdsl.nn import TcModule
    from tcdsl.tuner.tune import TuneResult

    words = _text((site / "api.html").read_text())
    for obj in (tc.define, tc.Kernel, tc.Kernel.autotune, tc.Kernel.explain, tc.GenericKernel, tc.Library,
                options, tc.tuning, tc.tuning.export, TuneResult, TuneResult.explain, TcModule, tc.TcError,
                tc.TcCacheWarning):
        assert _first_sentence(obj) in words, f"the docstring of {obj!r} is not on the API page"
    # MappingOptions' fields, each with the comment beside it in core/options.py
    assert _text("tile: tuple[int, ...] | None = None — per band member, outermost first") in words
    assert _text("threads: tuple[int, ...] | None = None — GPU block size per dim") in words


def test_the_guide_is_the_readme(site: Path) -> None:
    page = (site / "guide.html").read_text()
    headings = [_text(h) for h in re.findall(r"<h2>(.*?)</h2>", page, flags=re.S)]
    readme = (ROOT / "README.md").read_text()
    sections = [line[3:].strip() for line in readme.splitlines() if line.startswith("## ")]
    assert len(sections) >= 5 and [h.rstrip("¶").strip() for h in headings] == [s.replace("`", "") for s in sections]
    assert 'C(m, n) +=! A(m, r_k) * B(r_k, n)' in html.unescape(page)  # the README's code blocks


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebooks_show_their_outputs(site: Path, name: str) -> None:
    page = (site / "_notebooks" / f"{name}.html").read_text()
    words = _text(page)
    book = json.loads((ROOT / "examples" / "notebooks" / f"{name}.ipynb").read_text())
    outputs = [o for c in book["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    streams = ["".join(o["text"]) for o in outputs if o["output_type"] == "stream"]
    assert streams, f"{name}.ipynb has no printed output stored"
    for text in streams:
        line = next(line for line in text.splitlines() if line.strip() and "\r" not in line)
        assert _text(line) in words, f"{name}: printed output {line!r} is not on its page"
    rich = [o for o in outputs if "text/html" in o.get("data", {})]
    if rich:
        assert 'class="output text_html"' in page  # rich display rendered as HTML, not as its text
    assert "cdn.jsdelivr.net" not in page and "require.min.js" not in page  # the pages load nothing from outside
