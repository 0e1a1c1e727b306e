"""Backward defs: ``Backward``, a backward def as TC text with what its params stand for and the
forward values it needs saved; and the hand-written backward defs of ``define(backward=...)``
checked against the same convention (``CheckedDef x CheckedDef -> Backward``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .core import ast as A
from .core import dtypes as T
from .core.checked import CheckedDef
from .core.errors import TcGradientError
from .core.printer import definition


@dataclass(frozen=True)
class Param:
    """A param of a backward def: ``role`` is "input" or "output" (forward tensor ``of``), "saved"
    (a value the forward also returns under ``name``, of tensor ``of``) or "grad" (the gradient of
    forward output ``of``)."""

    name: str
    role: str
    of: str


@dataclass(frozen=True)
class Backward:
    """A backward def: its TC text, what its params and outputs stand for, and the values the
    forward must also return (``saved``, in order, by ``forward_source``)."""

    forward: str
    name: str
    source: str
    params: tuple[Param, ...]
    grads: tuple[str, ...]  # forward inputs whose gradients the def returns, in order
    saved: tuple[str, ...] = ()  # values the forward also returns: temporaries, earlier versions of a tensor
    forward_source: str | None = None  # the forward def returning them too (None: nothing saved)
    user: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return self.source


def with_saved_outputs(checked: CheckedDef, saved: Sequence[str]) -> str:
    """The forward def's text with the temporaries ``saved`` also returned (after its outputs)."""
    d = checked.source
    extra = tuple(A.Output(A.Ident(n)) for n in saved)
    return definition(replace(d, outputs=d.outputs + extra)) + "\n"


def default_saved(checked: CheckedDef) -> set[str]:
    """Temporaries worth keeping from the forward: those some statement writes by a reduction."""
    temps = {t.name for t in checked.temps}
    return {s.tensor for s in checked.stmts if s.tensor in temps and s.reductions}


def saved_types(bw: Backward, checked: CheckedDef) -> dict[str, str]:
    """The TC type of each value ``bw`` saves."""
    types = {t.name: t.dtype for t in checked.temps + checked.outputs}
    return {p.name: types[p.of] for p in bw.params if p.role == "saved"}


def user_backward(fwd: CheckedDef, bwd: CheckedDef) -> Backward:
    """A hand-written backward def for ``fwd``, checked against the convention: its params are the
    forward's inputs, then (optionally) its outputs, then the gradients of its outputs; its
    outputs are the gradients of the forward's inputs (all of them, or the float ones), in order."""
    n_in, n_out = len(fwd.inputs), len(fwd.outputs)
    loc = bwd.source.name.span.location()
    names = [t.name for t in bwd.inputs]
    if len(names) == n_in + n_out:
        roles = [("input", t.name) for t in fwd.inputs] + [("grad", t.name) for t in fwd.outputs]
    elif len(names) == n_in + 2 * n_out:
        roles = [("input", t.name) for t in fwd.inputs] + [("output", t.name) for t in fwd.outputs] + \
            [("grad", t.name) for t in fwd.outputs]
    else:
        raise TcGradientError(f"backward def '{bwd.name}' takes {len(names)} params; a backward of {fwd.name} takes "
                              f"its {n_in} inputs, optionally its {n_out} outputs, then the gradients of its "
                              f"{n_out} outputs ({n_in + n_out} or {n_in + 2 * n_out} params)", loc)
    floats = [t.name for t in fwd.inputs if T.is_float(t.dtype)]
    if len(bwd.outputs) == n_in:
        grads = [t.name for t in fwd.inputs]
    elif len(bwd.outputs) == len(floats):
        grads = floats
    else:
        raise TcGradientError(f"backward def '{bwd.name}' returns {len(bwd.outputs)} tensors; a backward of "
                              f"{fwd.name} returns the gradient of each of its inputs ({n_in}) or of each float "
                              f"input ({len(floats)})", loc)
    params = tuple(Param(n, role, of) for n, (role, of) in zip(names, roles))
    return Backward(fwd.name, bwd.name, definition(bwd.source) + "\n", params, tuple(grads), (), user=True)
