"""PyTorch modules from defs: a ``Kernel`` (or TC text) and parameter shapes -> ``torch.nn.Module``.

Inputs named as parameters become ``nn.Parameter`` objects of the module; the others are the module's
call arguments, in the def's order. Gradients come from the kernel's backward def.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .api import define
from .core.errors import TcArgumentError
from .core.printer import definition
from .torch_ops import torch_dtype


class TcModule(torch.nn.Module):
    """``TcModule(src, W=(F, C, 3, 3), B=(F,))``: a module whose forward runs the def, with the named
    inputs as parameters (a shape: initialised uniformly in +-1/sqrt(fan-in) for two or more dims,
    zeros otherwise; a tensor: used as the initial value)."""

    def __init__(self, kernel: Any, /, *, backend: str | None = None, **parameters: Any) -> None:
        super().__init__()
        if isinstance(kernel, str):
            kernel = define(kernel)
        if not hasattr(kernel, "checked"):
            raise TcArgumentError("TcModule takes TC text with one def or a def-form kernel")
        self.kernel = kernel
        self.backend = backend
        inputs = {t.name: t for t in kernel.checked.inputs}
        for name, value in parameters.items():
            t = inputs.get(name)
            if t is None:
                raise TcArgumentError(f"'{name}' is not an input of {kernel.name} "
                                      f"({', '.join(inputs)})", kernel.checked.source.name.span.location())
            dtype = torch_dtype(t.dtype)
            if isinstance(value, torch.Tensor):
                data = value.detach().clone().to(dtype)
            else:
                shape = tuple(int(n) for n in value)
                if len(shape) != len(t.dims):
                    raise TcArgumentError(f"parameter '{name}' is declared with {len(t.dims)} dims, got shape "
                                          f"{shape}", t.span.location())
                data = torch.zeros(shape, dtype=dtype)
                if len(shape) >= 2:
                    bound = 1.0 / math.sqrt(max(1, math.prod(shape[1:])))
                    data.uniform_(-bound, bound)
            self.register_parameter(name, torch.nn.Parameter(data))
        self.input_names = [n for n in inputs if n not in parameters]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (``copy.deepcopy``, ``torch.save``) as the def's text: the kernel is rebuilt."""
        state = self.__dict__.copy()
        kernel = state.pop("kernel")
        user = getattr(kernel, "_user_backward", None)
        state["_tc_def"] = (definition(kernel.checked.source) + "\n", user[0].source if user else None,
                            getattr(kernel, "_save", None))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        source, backward, save = state.pop("_tc_def")
        super().__setstate__(state)
        self.kernel = define(source, backward=backward, save=save)

    def forward(self, *args: Any) -> Any:
        if len(args) != len(self.input_names):
            raise TcArgumentError(f"{self.kernel.name} module takes {len(self.input_names)} inputs "
                                  f"({', '.join(self.input_names)}), got {len(args)}")
        given = dict(zip(self.input_names, args))
        values = [given[t.name] if t.name in given else getattr(self, t.name) for t in self.kernel.checked.inputs]
        return self.kernel(*values, backend=self.backend)

    def autotune(self, *example_inputs: Any, **settings: Any) -> Any:
        """Tune a training step of the module for these inputs (``Kernel.autotune`` with
        ``backward=True``): the gradients of its parameters, and of the inputs that require them,
        as autograd will ask for them. The same keyword settings; returns a ``TrainingTuneResult``."""
        if len(example_inputs) != len(self.input_names):
            raise TcArgumentError(f"{self.kernel.name} module takes {len(self.input_names)} inputs "
                                  f"({', '.join(self.input_names)}), got {len(example_inputs)}")
        given = dict(zip(self.input_names, example_inputs))
        values, wrt = [], []
        for t in self.kernel.checked.inputs:
            v = given[t.name] if t.name in given else getattr(self, t.name)
            if isinstance(v, torch.Tensor):
                if v.requires_grad:
                    wrt.append(t.name)
                v = v.detach()
            values.append(v)
        if not wrt:
            raise TcArgumentError(f"{self.kernel.name} module: neither its parameters nor these inputs require "
                                  "gradients, so a training step has no backward to tune")
        return self.kernel.autotune(*values, backward=True, wrt=wrt, **settings)

    def extra_repr(self) -> str:
        return f"{self.kernel.name}({', '.join(t.name for t in self.kernel.checked.inputs)})"
