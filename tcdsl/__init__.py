"""tcdsl: tensor comprehensions compiled through a polyhedral model.

``tc.define(source)`` turns TC text into kernels callable on arrays; see the README.

This folder is the top layer, over ``tcdsl.core``, ``tcdsl.grammar``, ``tcdsl.polyhedral`` and
``tcdsl.codegen``: the compiler driver and runtimes, then autodiff, the tuner and the torch glue,
then the API (``api``: kernels), then the command line. Autodiff, the tuner and the torch glue
never import the API: they make kernels through the class of the kernel they are given.
"""

from typing import Any

from . import tuning
from .api import GenericKernel, Kernel, Library, define
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


def autotune(kernel: Kernel | GenericKernel, *args: object, **settings: Any) -> object:
    """``kernel.autotune(*args, **settings)``: search mapping options, store and use the best."""
    return kernel.autotune(*args, **settings)

__all__ = ["define", "autotune", "MappingOptions", "Kernel", "GenericKernel", "Library", "TcError", "TcSyntaxError",
           "TcSemanticError", "TcTypeError", "TcRangeError", "TcArgumentError", "TcRuntimeError", "TcScheduleError",
           "TcCompileError", "TcGradientError", "TcWarning", "TcCacheWarning", "tuning", "__version__"]
