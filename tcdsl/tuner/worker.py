"""A tuning worker process: serves compile and timing requests of ``tcdsl.tuner.evaluate`` over
two pipes (``python -m tcdsl.tuner.worker IN_FD OUT_FD RUNNER PARENT_PID``); it never imports the user's
script, and whatever a candidate does to it (a crash, a hang) ends here. When the tuning process
goes away, the worker ends too, and takes whatever it started with it.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from tcdsl.core.options import MappingOptions
from tcdsl.tuner.evaluate import FLUSH_BYTES, WORKER_MARK, compile_candidate, kill_marked, start_outputs


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def serve(requests: Connection, replies: Connection, runner_path: str) -> None:
    """Answer requests until the pipe closes: ("job", kernel_of, source, inputs, reps, backend) -> ("ok", "job")
    (``kernel_of``: TC text -> kernel, see ``evaluate.KernelOf``); ("compile", kernel_of, source, specs,
    options, backend) -> ("ok",) or ("error", why); ("prepare", options) -> the
    same, for the job's kernel in this process; ("time", options,
    want_outputs) -> ("ok", seconds, outputs or None) or ("error", why). ``runner_path``
    ("module:function", with ``time_candidate``'s signature) times a candidate."""
    runner = _resolve(runner_path)
    kernel: Any = None
    inputs: list[np.ndarray] = []
    reps = 5
    backend = "c"
    flush = np.ones(FLUSH_BYTES // 8, np.int64)  # touched now: no page faults while timing
    while True:
        try:
            msg = requests.recv()
        except (EOFError, OSError):
            return
        try:
            if msg[0] == "job":
                kernel, inputs, reps = msg[1](msg[2]), msg[3], msg[4]
                backend = msg[5] if len(msg) > 5 else "c"
                replies.send(("ok", "job"))
            elif msg[0] == "compile":
                err = compile_candidate(*msg[1:])
                replies.send(("ok",) if err is None else ("error", err))
            elif msg[0] == "prepare":  # lower and load the candidate before it is timed
                options = MappingOptions.from_json(msg[1])
                if backend == "c":
                    kernel.compiled(*inputs, options=options)
                else:  # lowered, built and run once
                    kernel(*inputs, backend=backend, options=options, **start_outputs(kernel, inputs))
                replies.send(("ok",))
            elif msg[0] == "time":
                options = MappingOptions.from_json(msg[1])
                if backend == "c":
                    seconds, out = runner(kernel, inputs, options, reps, flush)
                else:
                    seconds, out = runner(kernel, inputs, options, reps, flush, backend=backend)
                replies.send(("ok", seconds, out if msg[2] else None))
        except Exception as e:
            replies.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


def _end_with(parent: int) -> None:
    """Poll until ``parent`` is gone (this process is then adopted), then kill this worker and
    everything it started: a hung compile must not outlive the tuner. ``parent`` is the pid the
    tuner passed, not this process's parent when the poll starts: a tuner killed while the worker
    was still importing would otherwise leave it watching its new parent forever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    kill_marked(os.environ.get(WORKER_MARK, ""))
    if hasattr(os, "getpgrp") and os.getpgrp() == os.getpid():  # the group is this worker's (Worker._start)
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


if __name__ == "__main__":
    threading.Thread(target=_end_with, args=(int(sys.argv[4]),), daemon=True).start()
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False), sys.argv[3])
