"""Candidates that misbehave on purpose, for the tuner's isolation tests: the worker runs
``faulty_runner`` instead of ``time_candidate`` (options pick the fault by their unroll limit)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from tcdsl.options import MappingOptions
from tcdsl.tuner.evaluate import time_candidate

SEGFAULT, HANG, WRONG, RAISES = 4, 8, 16, 32  # MappingOptions.unroll values


def faulty_runner(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                  flush: np.ndarray) -> tuple[float, Any]:
    if options.unroll == SEGFAULT:
        os.kill(os.getpid(), signal.SIGSEGV)
    if options.unroll == HANG:
        time.sleep(3600)
    if options.unroll == RAISES:
        raise RuntimeError("this candidate raises")
    seconds, out = time_candidate(kernel, inputs, options, reps, flush)
    if options.unroll == WRONG:  # the fastest candidate of all, with a wrong result
        return seconds / 1000, np.zeros_like(out)
    return seconds, out


def logged_or_crash(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                    flush: np.ndarray) -> tuple[float, Any]:
    """Appends "pid parent-pid" to $TCDSL_TEST_TIMING_LOG for each timing; the very first timing
    (no log yet) segfaults instead."""
    log = os.environ["TCDSL_TEST_TIMING_LOG"]
    first = not os.path.exists(log)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {os.getppid()}\n")
    if first:
        os.kill(os.getpid(), signal.SIGSEGV)
    return time_candidate(kernel, inputs, options, reps, flush)
