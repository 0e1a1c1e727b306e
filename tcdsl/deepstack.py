"""Deep nesting: runs a stage (checking, lowering, a call) on a thread with a large stack when a def's
expressions nest deeper than plain recursion allows (``depth(tree) -> int``, ``call(fn, ...) -> fn's result``).

Every pass over expressions (checking, printing, the interpreter, code generation) recurses once
or a few times per nesting level. Defs nested up to ``THRESHOLD`` levels run as they are; deeper
ones run on a helper thread with a ``STACK_BYTES`` stack (reserved, not committed, memory) and a
recursion limit raised to ``RECURSION_LIMIT`` while it runs. Past that, the def is refused with
a located error instead of a crash.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .core.errors import Location, TcSemanticError

THRESHOLD = 80  # nesting levels that run on the calling thread
STACK_BYTES = 512 << 20
RECURSION_LIMIT = 250_000  # at about 1 KiB of C stack per level at most, well inside STACK_BYTES

R = TypeVar("R")

_local = threading.local()
_lock = threading.Lock()
_active = 0
_saved_limit = 0


def depth(*roots: Any) -> int:
    """The deepest nesting of dataclass nodes (and the tuples and lists that hold them) under
    ``roots``, measured without recursion. Source spans are leaves."""
    best = 0
    todo: list[tuple[Any, int]] = [(r, 1) for r in roots]
    while todo:
        node, d = todo.pop()
        if isinstance(node, (tuple, list)):
            todo.extend((c, d) for c in node)
            continue
        if not dataclasses.is_dataclass(node) or isinstance(node, type) or _is_leaf(node):
            continue
        best = max(best, d)
        todo.extend((v, d + 1) for v in vars(node).values())
    return best


def _is_leaf(node: Any) -> bool:
    return type(node).__name__ in ("Span", "SourceFile", "Location")


def is_deep(*roots: Any) -> bool:
    return depth(*roots) > THRESHOLD


def call(fn: Callable[..., R], args: tuple = (), kwargs: dict[str, Any] | None = None, *,
         what: str = "the def", where: Location | None = None) -> R:
    """``fn(*args, **kwargs)`` on a large-stack thread (directly when already on one); its result
    or its exception comes back to the caller. A nesting too deep even there is a located
    ``TcSemanticError`` naming ``what``."""
    kwargs = kwargs or {}
    if getattr(_local, "inside", False):
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def target() -> None:
        _local.inside = True
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (handed to the calling thread)
            box["error"] = e

    _raise_limit()
    try:
        with _lock:
            old = _set_stack_size()
            try:
                worker = threading.Thread(target=target, name="tcdsl-deep", daemon=True)
                worker.start()
            finally:
                threading.stack_size(old)
        while worker.is_alive():
            worker.join(0.1)  # short waits keep Ctrl-C working on the calling thread
    finally:
        _restore_limit()
    err = box.get("error")
    if isinstance(err, RecursionError):
        raise TcSemanticError(f"{what} nests its expressions too deeply for tcdsl; split them with where-lets or "
                              f"temporaries", where) from None
    if err is not None:
        raise err
    return box["value"]


def _set_stack_size() -> int:
    """Ask for STACK_BYTES for the next thread (or the most a platform allows, halving down to
    64 MiB); returns the previous setting."""
    size = STACK_BYTES
    while True:
        try:
            return threading.stack_size(size)
        except (ValueError, RuntimeError):
            if size <= 64 << 20:
                return threading.stack_size()
            size //= 2


def _raise_limit() -> None:
    global _active, _saved_limit
    with _lock:
        if _active == 0:
            _saved_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved_limit, RECURSION_LIMIT))
        _active += 1


def _restore_limit() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active == 0:
            sys.setrecursionlimit(_saved_limit)
