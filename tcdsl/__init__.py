"""tcdsl: tensor comprehensions compiled through a polyhedral model.

``tc.define(source)`` turns TC text into kernels callable on arrays; see the README.

This folder is the top layer, over ``tcdsl.core``, ``tcdsl.grammar``, ``tcdsl.polyhedral`` and
``tcdsl.codegen``: the compiler driver and runtimes, then autodiff, the tuner and the torch glue,
then the kernels (``kernel``, over ``arguments``) and the API (``api``: ``define``), then the command
line. Autodiff, the tuner and the torch glue never import the kernels or the API: they make kernels
through the class of the kernel they are given.
"""

import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

from . import tuning
from .api import GenericKernel, Library, define
from .codegen.diskcache import TcCacheWarning
from .core.errors import (
    TcArgumentError,
    TcCompileError,
    TcError,
    TcGradientError,
    TcRangeError,
    TcRuntimeError,
    TcScheduleError,
    TcSemanticError,
    TcSyntaxError,
    TcTypeError,
    TcWarning,
)
from .core.options import MappingOptions
from .core.version import __version__
from .kernel import Kernel


def _torch_ops() -> None:
    """Register the ``tcdsl::`` torch ops, able to rebuild any kernel from its key's def text (a graph
    exported in another process loads and runs). Done now if torch is imported, else right after it is."""
    try:
        from . import torch_ops  # torch is imported already: registering costs nothing more
    except Exception as e:  # never break the user's `import torch` (an unsupported torch, say)
        warnings.warn(f"tcdsl's torch ops are not registered: {type(e).__name__}: {e}", TcWarning, stacklevel=2)
        return
    torch_ops.KERNEL_OF_SOURCE = Kernel.of_source


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Registers the ops once torch's import finishes (tcdsl never imports torch itself)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _torch_ops()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "torch" in sys.modules:
    _torch_ops()
elif importlib.util.find_spec("torch") is not None:
    sys.meta_path.insert(0, _AfterTorch())


def autotune(kernel: Kernel | GenericKernel, *args: object, **settings: Any) -> object:
    """``kernel.autotune(*args, **settings)``: search mapping options, store and use the best."""
    return kernel.autotune(*args, **settings)

__all__ = ["define", "autotune", "MappingOptions", "Kernel", "GenericKernel", "Library", "TcError", "TcSyntaxError",
           "TcSemanticError", "TcTypeError", "TcRangeError", "TcArgumentError", "TcRuntimeError", "TcScheduleError",
           "TcCompileError", "TcGradientError", "TcWarning", "TcCacheWarning", "tuning", "__version__"]
