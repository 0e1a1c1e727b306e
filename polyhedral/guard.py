"""Scheduling under a clock: run isl's scheduler in a forked child that is stopped after a limit.

isl's scheduler holds the interpreter for the whole search and its operation budget is a poor
clock: on some domains (reductions whose subscripts mix strides of 2 and 3 across three indices)
ten thousand operations take milliseconds and a hundred thousand take ten seconds. So the search
runs in a child process that shares nothing back but the schedule's text; past the limit
(TCDSL_SCHEDULE_TIMEOUT) the child is killed and the caller falls back to the program order.
Where ``fork`` is unavailable or fails, the search runs in this process.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import time
import warnings
from collections.abc import Callable

import islpy as isl

_NONE = b"-"  # the child found no schedule (out of its operation budget)


def run(search: Callable[[], isl.Schedule | None], ctx: isl.Context, limit_s: float) -> isl.Schedule | None:
    """``search()`` in a child process (None when it finds nothing); TimeoutError when it runs
    past ``limit_s`` seconds. ``ctx`` parses the child's schedule."""
    if not hasattr(os, "fork") or limit_s <= 0:
        return search()
    r, w = os.pipe()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process: the child runs isl only
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:  # no memory or processes left for a child: search here, without the clock
        os.close(r)
        os.close(w)
        return search()
    if pid == 0:  # the child: search, write the text, leave without running any cleanup
        code = 0
        try:
            os.close(r)
            sched = search()
            _write_all(w, _NONE if sched is None else str(sched).encode())
            os.close(w)  # the parent reads on at once: leaving the process takes it milliseconds more
        except BaseException:  # noqa: BLE001 (anything: the parent sees a failed search)
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = None
    try:
        data = _read_until(r, time.monotonic() + limit_s)
    finally:
        os.close(r)
        _reap(pid, kill=data is None)
    if data is None:
        raise TimeoutError(f"isl's scheduler ran past {limit_s:g} s")
    if not data or data == _NONE:
        return None
    return isl.Schedule.read_from_str(ctx, data.decode())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable (or its other end closes) within ``timeout`` seconds (inf: no
    limit). ``poll``, not ``select``: select refuses a descriptor past 1023."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)  # a hang-up is reported whatever is asked for
    if math.isinf(timeout) and timeout > 0:
        return bool(poll.poll(None))
    return bool(poll.poll(max(0, math.ceil(timeout * 1000)) if math.isfinite(timeout) else 0))


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes the pipe, or None past the deadline."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not readable(fd, left):
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


_exiting: list[int] = []  # children whose answer came and that are still leaving


def _reap(pid: int, kill: bool) -> None:
    """Wait for a killed child; collect one that answered if it has left, else later (at the next
    search, or when this process exits)."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        return
    _exiting.append(pid)
    for p in list(_exiting):
        try:
            done, _ = os.waitpid(p, os.WNOHANG)
        except ChildProcessError:  # collected elsewhere
            done = p
        if done:
            with contextlib.suppress(ValueError):  # another thread's search collected it first
                _exiting.remove(p)
