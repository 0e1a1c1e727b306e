"""The Python API: ``tc.define`` (``str -> Kernel | Library | ShortForm``): TC text checked into
kernels, one per def (``tcdsl.kernel``), or statements without a def header into a short-form
kernel, which makes a def per argument signature.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import deepstack
from .arguments import as_array, torch_args
from .autodiff import attach
from .core import ast as A
from .core import dtypes as T
from .core.errors import (
    Location,
    SourceFile,
    TcArgumentError,
    TcError,
    TcSemanticError,
    TcSyntaxError,
    did_you_mean,
    locate,
)
from .core.options import MappingOptions
from .core.sema import check_def_names
from .grammar import is_short_form, parse, parse_statements
from .kernel import Kernel, kernels_of, load_torch_ops, torch_ops_if_loaded, user_facing
from .training import TrainingTuneResult
from .tuner import tune


class ShortForm:
    """The decorator form: statements only; params from the function, types and sizes per call."""

    def __init__(self, source: str, filename: str, outputs: Sequence[str] | None, backend: str | None) -> None:
        self.stmts = parse_statements(source, filename)
        if not self.stmts:
            raise TcSyntaxError("the source holds no def and no statement", locate(SourceFile(filename, source), 1, 1))
        self.source = source
        self.outputs = tuple(outputs) if outputs else None
        self.backend = backend
        written = {s.lhs.name for s in self.stmts}
        for o in self.outputs or ():
            if o not in written:
                raise TcSemanticError(f"output '{o}' is never written by the statements", self.stmts[0].span.location())

    def __call__(self, fn: Callable[..., Any]) -> GenericKernel:
        if not callable(fn):
            raise TypeError("the short form of tc.define decorates a function whose parameters name the inputs")
        params = [p.name for p in inspect.signature(fn).parameters.values()]
        # the def's name (and its backward's, name_grad) must be a TC name: a lambda's "<lambda>" is not
        name = re.sub(r"\W", "_", fn.__name__).strip("_") or "kernel"
        name = f"k_{name}" if name[0].isdigit() else name
        return GenericKernel(name, params, self.stmts, self.outputs, self.backend, fn.__doc__)


class GenericKernel:
    """A short-form kernel: a def is made per argument signature (dtypes, ranks, equal sizes)."""

    def __init__(self, name: str, params: list[str], stmts: tuple[A.Stmt, ...], outputs: tuple[str, ...] | None,
                 backend: str | None, doc: str | None) -> None:
        self.name = name
        self.params = params
        self.stmts = stmts
        written = list(dict.fromkeys(s.lhs.name for s in stmts))
        self.outputs = outputs or tuple(w for w in written if w not in params)
        self.backend = backend
        self._kernels: dict[tuple, Kernel] = {}
        # arguments' shapes and dtypes -> their kernel: numpy arrays' (_hot_kernel), plain CPU
        # tensors' (torch_ops.generic_repeated)
        self._hot: dict[tuple, Kernel] = {}
        self.__doc__ = doc
        self.__name__ = name
        if not stmts:
            raise TcArgumentError(f"short-form def '{name}' has no statements")

    def __repr__(self) -> str:
        return f"<tcdsl kernel {self.name}({', '.join(self.params)}), short form>"

    def kernel(self, *args: Any) -> Kernel:
        """The def-form kernel made for these arguments' dtypes, ranks and size equalities."""
        if len(args) != len(self.params):
            raise TcArgumentError(f"{self.name}() takes {len(self.params)} arguments ({', '.join(self.params)}), "
                                  f"got {len(args)}")
        arrays = [as_array(a, p, _first_use(self.stmts, p)) for a, p in zip(args, self.params)]
        sig = tuple((a.dtype.newbyteorder("=").str, a.shape) for a in arrays)
        pattern = _size_pattern(arrays)
        key = tuple((d, len(s)) for d, s in sig), pattern
        k = self._kernels.get(key)
        if k is None:
            k = kernels_of([self._make_def(arrays)], self.backend)[0]
            self._kernels[key] = k
        if all(type(a) is np.ndarray for a in args):
            self._remember(tuple([(a.shape, a.dtype) for a in args]), k)
        return k

    def _remember(self, key: tuple, k: Kernel) -> None:
        """``_hot_kernel``'s entry for arguments of these shapes and dtypes (a bounded table: a
        program calling with ever new shapes starts it afresh)."""
        if len(self._hot) >= HOT_SHAPES:
            self._hot.clear()
        self._hot[key] = k

    def _hot_kernel(self, args: Sequence[Any]) -> Kernel | None:
        """The kernel an earlier call made for numpy arrays of these shapes and dtypes, else None."""
        key = []
        for a in args:
            if type(a) is not np.ndarray:
                return None
            key.append((a.shape, a.dtype))
        return self._hot.get(tuple(key))

    def _make_def(self, arrays: list[np.ndarray]) -> A.Def:
        names: dict[int, str] = {}
        params = []
        for p, a in zip(self.params, arrays):
            t = T.from_numpy(a.dtype)
            if t is None:
                raise TcArgumentError(f"argument '{p}' has dtype {a.dtype}, which TC has no type for")
            dims = []
            for d, n in enumerate(a.shape):
                sym = names.setdefault(n, f"{p}_{d}")
                dims.append(A.Dim(name=sym))
            params.append(A.Param(t, A.Ident(p), tuple(dims) if a.ndim else None))
        outputs = tuple(A.Output(A.Ident(o)) for o in self.outputs)
        span = self.stmts[0].span
        return A.Def(A.Ident(self.name, span), tuple(params), outputs, self.stmts, span)

    @user_facing
    def __call__(self, *args: Any, out: Any = None, backend: str | None = None,
                 options: MappingOptions | None = None) -> Any:
        k = self._hot_kernel(args)  # a repeated call: straight to its kernel's own call
        if k is not None:
            return k(*args, out=out, backend=backend, options=options)
        ops = torch_ops_if_loaded()
        if ops is not None:
            fast = ops.generic_repeated(self, args, out, backend, options)
            if fast is not None:
                return fast
        if torch_args(args):
            return load_torch_ops().call_generic(self, args, out=out, backend=backend, options=options)
        return self.kernel(*args)(*args, out=out, backend=backend or self.backend, options=options)

    def source(self, *args: Any, **kw: Any) -> str:
        return self.kernel(*args).source(*args, **kw)

    def backward_source(self, *args: Any, wrt: Sequence[str] | None = None) -> str:
        """The backward def of the def made for these arguments (see ``Kernel.backward_source``)."""
        return self.kernel(*args).backward_source(wrt)

    def schedule(self, *args: Any, **kw: Any) -> str:
        return self.kernel(*args).schedule(*args, **kw)

    def explain(self, *args: Any, **kw: Any) -> str:
        return self.kernel(*args).explain(*args, **kw)

    def options_for(self, *args: Any, backend: str = "c") -> MappingOptions:
        """The options a call with these arguments uses (see ``Kernel.options_for``)."""
        return self.kernel(*args).options_for(*args, backend=backend)

    def autotune(self, *args: Any, **settings: Any) -> tune.TuneResult | TrainingTuneResult:
        """``Kernel.autotune`` (the same keyword parameters, ``backward=True`` too) on the def made
        for these arguments."""
        return self.kernel(*args).autotune(*args, **settings)


HOT_SHAPES = 256  # argument shapes a short-form kernel remembers for its repeated calls


def _first_use(stmts: Sequence[A.Stmt], name: str) -> Location | None:
    """Where the statements first use the tensor ``name`` (a short-form kernel's params have no
    declaration to point at)."""
    todo: list[Any] = list(reversed(stmts))
    while todo:
        node = todo.pop()
        if isinstance(node, (A.Name, A.Apply)) and node.name == name:
            return node.span.location()
        if isinstance(node, (tuple, list)):
            todo.extend(reversed(node))
        elif isinstance(node, (A.Expr, A.Stmt, A.WhereRange, A.WhereExists, A.WhereLet)):
            todo.extend(reversed([v for v in vars(node).values() if not isinstance(v, A.Span)]))
    return None


def _size_pattern(arrays: list[np.ndarray]) -> tuple:
    first: dict[int, int] = {}
    flat = [n for a in arrays for n in a.shape]
    return tuple(first.setdefault(n, i) for i, n in enumerate(flat))


class Library(SimpleNamespace):
    """The kernels of a multi-def source, by def name (attributes, ``lib["name"]``, iteration); type
    checkers see every attribute as a ``Kernel``."""

    if TYPE_CHECKING:  # SimpleNamespace's stub types unknown attributes as Any
        def __getattribute__(self, name: str) -> Kernel: ...

    def __getattr__(self, name: str) -> Kernel:  # only for names that are not attributes: no such def
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"the source has no def '{name}'{did_you_mean(name, vars(self))} (its defs: "
                             f"{', '.join(vars(self))})")

    def __getitem__(self, name: str) -> Kernel:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[Kernel]:
        return iter(vars(self).values())

    def __len__(self) -> int:
        return len(vars(self))

    def _repr_html_(self) -> str:
        """Each def, highlighted, under its name (Jupyter's rich display)."""
        return "".join(f"<h4 style='margin-bottom:0'><code>{name}</code></h4>{k._repr_html_()}"
                       for name, k in vars(self).items())


@overload
def define(source: str, *, entry: str, filename: str = ..., backend: str | None = ...,
           backward: str | None = ..., save: Any = ...) -> Kernel: ...
@overload
def define(source: str, *, outputs: Sequence[str], filename: str = ..., backend: str | None = ...) -> ShortForm: ...
@overload
def define(source: str, *, filename: str = ..., backend: str | None = ..., backward: str | None = ...,
           save: Any = ...) -> Any: ...


@user_facing
def define(source: str, *, entry: str | None = None, filename: str = "<string>",
           outputs: Sequence[str] | None = None, backend: str | None = None, backward: str | None = None,
           save: Any = None) -> Kernel | Library | ShortForm:
    """Compile TC text.

    - A source with one def gives a ``Kernel``; with several, a ``Library`` (one kernel per def, by
      name); ``entry=NAME`` picks the kernel of one def out of several.
    - Statements without a ``def`` header give a decorator (``ShortForm``) that takes the input
      names from the decorated function; ``outputs`` names its outputs (default: every tensor
      written and never read).
    - ``backward`` is TC text of hand-written backward defs (``NAME_grad``, or the only def) used by
      PyTorch autograd instead of derived ones; ``save`` names the temporaries the forward keeps for
      the derived backward (a list: exactly those; a dict: overrides of the default choice).

    Which of these a source gives depends on its text, so type checkers see ``define(src,
    entry=NAME)`` as a ``Kernel`` and a plain ``define(src)`` as ``Any``: annotate the result
    (``mm: tc.Kernel = tc.define(...)``, ``lib: tc.Library = ...``) to have it checked."""
    if not isinstance(source, str):
        raise TypeError("tc.define takes TC source text")
    if is_short_form(source):
        if backward is not None or save is not None or entry is not None:
            raise TcArgumentError("backward=, save= and entry= need a source with a def header")
        return ShortForm(source, filename, outputs, backend)
    if outputs is not None:
        raise TcArgumentError("outputs= names the outputs of statements without a def header; a def names its "
                              "own after '->'")
    module = parse(source, filename)
    check_def_names(module)
    defs = module.defs
    if entry is not None:
        names = [d.name.name for d in defs]
        if entry not in names:
            raise TcArgumentError(f"entry={entry!r} names no def of the source{did_you_mean(entry, names)} (its "
                                  f"defs: {', '.join(names)})")
        defs = tuple(d for d in defs if d.name.name == entry)
    kernels = kernels_of(defs, backend)
    if backward is not None or save is not None:
        for k in kernels:
            if k._deep:
                deepstack.call(attach, (k, backward, save), {"single": len(kernels) == 1}, what=f"def '{k.name}'",
                               where=k.checked.source.name.span.location())
            else:
                attach(k, backward, save, single=len(kernels) == 1)
    if len(kernels) == 1:
        return kernels[0]
    return Library(**{k.name: k for k in kernels})


__all__ = ["define", "Kernel", "GenericKernel", "Library", "TcError"]
