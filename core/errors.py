"""Errors: the one hierarchy every tcdsl stage raises, rooted at ``TcError``.

Every error carries a location (file, line, column, the source line and a caret span) when one is
known, prints as ``file:line:col: message`` followed by the source line and a caret, and pickles
(the tuner compiles in subprocesses), because it holds only plain strings and ints.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceFile:
    """A TC source text and the name used in locations (a path or ``<string>``)."""

    name: str
    text: str

    def line(self, n: int) -> str:
        lines = self.text.splitlines()
        return lines[n - 1] if 0 < n <= len(lines) else ""


@dataclass(frozen=True)
class Location:
    """A located span: 1-based line and column, the source line and the caret width."""

    file: str
    line: int
    col: int
    source_line: str = ""
    width: int = 1

    def render(self) -> str:
        if not self.source_line:
            return ""
        prefix = "".join(c if c == "\t" else " " for c in self.source_line[: self.col - 1])
        caret = prefix + "^" * max(1, self.width)
        return f"\n    {self.source_line}\n    {caret}"


class TcError(Exception):
    """Root of every error tcdsl reports to its users."""

    kind = "error"

    def __init__(self, message: str, location: Location | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(self._format())

    def _format(self) -> str:
        loc = self.location
        if loc is None:
            return self.message
        return f"{loc.file}:{loc.line}:{loc.col}: {self.message}{loc.render()}"

    def _repr_html_(self) -> str:
        """The located message with its source line and caret, as text (Jupyter's rich display)."""
        return f"<pre style='color:#b31d28'>{html.escape(type(self).__name__ + ': ' + str(self))}</pre>"

    def __reduce__(self):  # keep subclass, message and location across processes
        return (type(self), (self.message, self.location))


class TcSyntaxError(TcError):
    """The text is not TC: a lexer or parser error."""


class TcSemanticError(TcError):
    """The text parses but does not mean anything: names, reductions, writes, outputs."""


class TcTypeError(TcSemanticError):
    """A type error: a float subscript, a bad cast, a dtype mismatch with a declaration."""


class TcRangeError(TcError):
    """Range inference failed: an index with no range, an ambiguous or empty range."""


class TcArgumentError(TcError):
    """The arguments of a call do not fit the def: arity, rank, dtype or sizes."""


class TcRuntimeError(TcError):
    """A run-time failure inside a kernel: an out-of-range gather, integer division by zero."""


class TcScheduleError(TcError):
    """Scheduling or mapping failed, or a mapping does not fit the target."""


class TcCompileError(TcError):
    """The generated code did not compile."""


class TcWarning(UserWarning):
    """Something the user should know that still gives correct results (a slower fallback)."""


def locate(src: SourceFile, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> Location:
    """A Location for a span of ``src`` (the caret covers the span on its first line)."""
    text = src.line(line)
    if end_line == line and end_col is not None and end_col > col:
        width = end_col - col
    else:
        width = max(1, len(text.rstrip()) - col + 1)
    return Location(src.name, line, col, text, width)


class TcGradientError(TcSemanticError):
    """A def has no derivative tcdsl can derive: a product reduction, an input that is not a float."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to a misspelt ``name`` (fewest edits, a
    swap of neighbours counting one; then the same first letter; then the nearest length), or ``""``
    when none is close."""
    scored = sorted((_edits(name.lower(), k.lower()), k[:1].lower() != name[:1].lower(), abs(len(k) - len(name)), k)
                    for k in set(known) if k != name)
    if not scored:
        return ""
    edits, other_start, _, best = scored[0]
    limit = len(name) // 3 if other_start else max(1, len(name) // 3)  # short names: only with their first letter
    return f"; did you mean '{best}'?" if edits <= limit else ""


def _edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours turning ``a`` into ``b``."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]
