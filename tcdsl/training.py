"""Tuning a training step: ``Kernel x arguments -> TrainingTuneResult`` (the forward def as a
training step runs it, and its backward def, each searched and stored in the tuning cache).

Training runs two defs per layer: the forward, in the form that also returns the values its
backward reads (``Backward.forward_source``, when it saves any), and the backward def. Each is a
kernel of its own, so each is tuned for its own arguments: the backward's are made here from the
forward's results and cotangents of the outputs' shapes, laid out as autograd passes them
(contiguous), so that autograd's later calls find both entries. This layer receives the API's
kernel and makes the others through its class (``of_source``): it never imports the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .autodiff import backward_of
from .backward import Backward
from .core import dtypes as T
from .tuner.tune import TuneResult


@dataclass(frozen=True)
class TrainingTuneResult:
    """The searches of a training step: ``forward`` (the def as training runs it) and ``backward``."""

    forward: TuneResult
    backward: TuneResult
    forward_def: str  # the name of each def tuned
    backward_def: str

    def __repr__(self) -> str:
        return f"<TrainingTuneResult: forward {self.forward!r}; backward {self.backward!r}>"

    def explain(self) -> str:
        return (f"forward ({self.forward_def}): {self.forward.explain()}\n"
                f"backward ({self.backward_def}): {self.backward.explain()}")


def training_kernels(kernel: Any, wrt: Sequence[str] | None = None) -> tuple[Any, Any, Backward]:
    """The forward kernel a training step runs (the def returning what its backward reads too),
    the backward kernel, and the backward def they come from."""
    bw = backward_of(kernel, wrt)
    if bw.user:
        return kernel, kernel._user_backward[1], bw
    forward = kernel if bw.forward_source is None else \
        type(kernel).of_source(bw.forward_source, filename=f"<forward of {kernel.name}>", backend=kernel.backend)
    backward = type(kernel).of_source(bw.source, filename=f"<backward of {kernel.name}>", backend=kernel.backend)
    return forward, backward, bw


def backward_arguments(kernel: Any, forward: Any, bw: Backward, arrays: Sequence[np.ndarray],
                       seed: int = 0) -> list[np.ndarray]:
    """The backward def's arguments for ``arrays``: the inputs, the forward's results (outputs and
    saved values) and random cotangents of the outputs (contiguous, as autograd passes them)."""
    c = kernel.checked
    results = forward(*arrays)
    results = list(results) if isinstance(results, tuple) else [results]
    names = [t.name for t in c.outputs] + list(bw.saved)
    values = {t.name: a for t, a in zip(c.inputs, arrays)}
    values.update(zip(names, results))
    rng = np.random.default_rng(seed)
    types = {t.name: t.dtype for t in c.outputs}
    args = []
    for p in bw.params:
        if p.role == "grad":
            out = values[p.of]
            args.append(np.ascontiguousarray(rng.standard_normal(out.shape).astype(T.np_dtype(types[p.of]))))
        else:
            args.append(np.ascontiguousarray(values[p.name if p.role == "saved" else p.of]))
    return args


def autotune_step(kernel: Any, arrays: Sequence[np.ndarray], wrt: Sequence[str] | None = None,
                  **settings: Any) -> TrainingTuneResult:
    """Tune the forward def as training runs it and the backward def of ``wrt`` (default: every
    float input) for ``arrays``; ``settings`` are ``Kernel.autotune``'s, each def getting the whole
    ``budget``."""
    forward, backward, bw = training_kernels(kernel, wrt)
    fwd = forward.autotune(*arrays, **settings)
    bargs = backward_arguments(kernel, forward, bw, arrays)
    bwd = backward.autotune(*bargs, **settings)
    return TrainingTuneResult(fwd, bwd, forward.name, backward.name)
