"""Errors, at their public path: ``tcdsl.errors`` re-exports the one hierarchy rooted at ``TcError``,
which lives in the bottom layer (``tcdsl.core.errors``) because every stage raises it."""

from .core.errors import (
    Location,
    SourceFile,
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
    locate,
)

__all__ = ["Location", "SourceFile", "TcArgumentError", "TcCompileError", "TcError", "TcGradientError",
           "TcRangeError", "TcRuntimeError", "TcScheduleError", "TcSemanticError", "TcSyntaxError", "TcTypeError",
           "TcWarning", "locate"]
