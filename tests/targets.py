"""The CPU targets this machine can run: the values the tests give ``$TCDSL_CPU``."""

from __future__ import annotations

from tcdsl.codegen import toolchain
from tcdsl.errors import TcArgumentError
from tcdsl.polyhedral import cputarget


def runnable(name: str) -> bool:
    """Whether kernels built for the preset (or ``native``) ``name`` run here."""
    try:
        cputarget.named(name, toolchain.native_target(tuple(toolchain.compiler())))
        return True
    except TcArgumentError:
        return False


def runnable_of(*names: str) -> list[str]:
    return [n for n in names if runnable(n)]
