"""An indented line buffer: the emitters' output device (``lines -> str``), and ``unparen``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class LineWriter:
    def __init__(self, unit: str = "  ") -> None:
        self._lines: list[str] = []
        self._depth = 0
        self._unit = unit

    def line(self, text: str = "") -> None:
        self._lines.append(self._unit * self._depth + text if text else "")

    def raw(self, text: str) -> None:
        self._lines.extend(text.rstrip("\n").split("\n"))

    def mark(self) -> int:
        """The position of the next line, for ``insert``."""
        return len(self._lines)

    def insert(self, at: int, text: str) -> None:
        """Put ``text`` (unindented lines) at a position taken with ``mark``."""
        self._lines[at:at] = text.rstrip("\n").split("\n")

    def push(self) -> None:
        self._depth += 1

    def pop(self) -> None:
        self._depth -= 1

    @contextmanager
    def indent(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def unparen(text: str) -> str:
    """Drop one pair of outer parentheses (OpenMP wants `c0 < N`, not `(c0 < N)`)."""
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text
