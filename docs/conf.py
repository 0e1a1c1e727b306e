"""Sphinx configuration: the API reference from tcdsl's docstrings, the README as the guide and the
example notebooks with their stored outputs (``make docs``; ``tests/test_docs.py`` builds it with
warnings as errors).

The notebooks live in ``examples/notebooks``; Sphinx reads only files under this folder, so each
build copies them into ``docs/_notebooks`` (git-ignored), rewriting a copy only when it changed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import io
import os
import re
import shutil
import tempfile
import tokenize
from pathlib import Path
from typing import Any

import tcdsl

DOCS = Path(__file__).resolve().parent
NOTEBOOKS = DOCS.parent / "examples" / "notebooks"
COPIES = DOCS / "_notebooks"


def _copy_notebooks() -> None:
    """``examples/notebooks/*.ipynb`` -> ``docs/_notebooks``: through a temp file and ``os.replace``, so a
    build running beside this one never reads half a notebook."""
    COPIES.mkdir(exist_ok=True)
    for copy in COPIES.glob("*.ipynb"):
        if not (NOTEBOOKS / copy.name).exists():
            copy.unlink(missing_ok=True)  # its notebook is gone: no page for it
    for book in sorted(NOTEBOOKS.glob("*.ipynb")):
        copy = COPIES / book.name
        if copy.exists() and copy.read_bytes() == book.read_bytes():
            continue  # unchanged: Sphinx keeps the page it built
        fd, tmp = tempfile.mkstemp(dir=COPIES, suffix=".tmp")
        os.close(fd)
        shutil.copyfile(book, tmp)
        os.replace(tmp, copy)


_copy_notebooks()

project = "tcdsl"
author = "the tcdsl authors"
copyright = "the tcdsl authors"
release = version = tcdsl.__version__

extensions = [
    "sphinx.ext.autodoc",
    "myst_nb",  # Markdown pages (MyST) and .ipynb notebooks; it loads myst_parser itself
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]

# The notebooks are stored with their outputs (tests/test_notebooks.py runs them): render those.
nb_execution_mode = "off"
# The quickstart's tuner progress bar is an ipywidgets view: show its text form, and load no widget
# JavaScript from a CDN (the pages work offline).
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js: dict[str, dict[str, str]] = {}

# Docstrings and the README quote code ("c", 'min'): keep straight quotes and dashes as written.
smartquotes = False
myst_heading_anchors = 3  # the README's sections get anchors, as on GitHub

# tcdsl.nn subclasses torch.nn.Module; without torch installed (the "docs" extra leaves it out: it is a
# large download) autodoc imports it against a stand-in: the same text, only TcModule's signature
# shows as (*args, **kwargs).
if importlib.util.find_spec("torch") is None:
    autodoc_mock_imports = ["torch"]

# Signatures carry the types; "description" would repeat each one in a list under the text.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# A method without a docstring shows none, not its base class's (torch.nn.Module.forward's, say).
autodoc_inherit_docstrings = False

html_theme = "alabaster"
html_title = f"tcdsl {release}"
html_theme_options = {
    "description": "tensor comprehensions compiled through a polyhedral model",
    "page_width": "1180px",  # the README's code blocks and tables are wide
    "sidebar_width": "230px",
}


def _field_comments(cls: type) -> dict[str, str]:
    """A dataclass's fields documented by a comment on their line (``tile: ... = None  # per band
    member``): those comments, by field name."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    found: dict[str, str] = {}
    depth, line_start, name = 0, True, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type == tokenize.NAME and line_start and depth == 1 and tok.string in names:
            name = tok.string  # a field declared in the class body (not a method's local)
        elif tok.type == tokenize.COMMENT and name is not None:
            found[name] = tok.string.lstrip("#").strip()
        if tok.type == tokenize.NEWLINE:
            name = None
        line_start = tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    return found


def _rst(comment: str) -> str:
    """A source comment as reST: code in backquotes (one or two) as a literal, every other markup
    character as itself."""
    parts = re.split(r"``([^`]+)``|`([^`]+)`", comment)  # per match: the text before it, then its two groups
    out = []
    for i in range(0, len(parts), 3):
        out.append(re.sub(r"([\\*_|`\[\]<>])", r"\\\1", parts[i]))
        code = (parts[i + 1] or parts[i + 2]) if i + 2 < len(parts) else None
        if code:
            out.append(f"``{code}``")
    return "".join(out)


def _default(f: dataclasses.Field) -> str | None:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return None


def _document_fields(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A dataclass lists its fields: name, type and default, and the comment beside it in the source."""
    if what not in ("class", "exception") or not dataclasses.is_dataclass(obj):
        return
    comments = _field_comments(obj)
    lines += ["", ".. rubric:: Fields", ""]
    for f in dataclasses.fields(obj):
        kind = f.type if isinstance(f.type, str) else inspect.formatannotation(f.type)
        default = _default(f)
        item = f"``{f.name}: {kind}{'' if default is None else ' = ' + default}``"
        lines.append(f"* {item}" + (f" — {_rst(comments[f.name])}" if f.name in comments else ""))
    lines.append("")


def _dataclass_signature(app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None,
                         return_annotation: str | None) -> tuple[str, str | None] | None:
    """A dataclass's signature as names and defaults: the types are in its list of fields (the
    annotations are strings under ``from __future__ import annotations`` and print badly)."""
    if what not in ("class", "exception") or not dataclasses.is_dataclass(obj):
        return None
    params = []
    for f in dataclasses.fields(obj):
        if f.init:
            default = _default(f)
            params.append(f.name if default is None else f"{f.name}={default}")
    return f"({', '.join(params)})", return_annotation


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", _document_fields)
    app.connect("autodoc-process-signature", _dataclass_signature)
