"""The ``tcdsl`` command line: ``check`` prints each def checked, with its ranges; ``compile`` prints
the generated C, the schedule or the explanation; ``grad`` prints the derived backward def; ``tune``
searches and stores mapping options.

Errors are printed located (file:line:col, the source line, a caret) with exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from . import deepstack
from .api import _kernels_of
from .core import limits
from .core.errors import TcArgumentError, TcError
from .core.options import MappingOptions
from .core.sema import check_def, check_def_names
from .grammar import parse


def _checked_text(d: Any) -> str:
    return str(check_def(d))


def _check(args: argparse.Namespace) -> int:
    for path in args.files:
        text = Path(path).read_text(encoding="utf-8")
        module = parse(text, str(path))
        check_def_names(module)
        for d in module.defs:
            if deepstack.is_deep(d):
                print(deepstack.call(_checked_text, (d,), what=f"def '{d.name.name}'", where=d.name.span.location()))
            else:
                print(_checked_text(d))
            print()
    return 0


def _sizes(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"sizes are NAME=INT pairs separated by commas, not {item!r}")
        out[name.strip()] = int(value)
    return out


def _arguments(checked, sizes: dict[str, int]) -> list[np.ndarray]:
    missing = [s for s in checked.sizes if s not in sizes]
    if missing:
        raise TcArgumentError(f"def '{checked.name}' needs sizes for {', '.join(missing)} (--sizes "
                              + ",".join(f"{s}=..." for s in checked.sizes) + ")")
    arrays = []
    memory = limits.physical_memory()
    for t in checked.inputs:
        shape = tuple(int(d.eval(sizes)) for d in t.dims)
        nbytes = int(np.dtype(t.dtype).itemsize * np.prod(shape, dtype=object))
        if any(n < 0 for n in shape):
            raise TcArgumentError(f"input '{t.name}' would have the negative shape {shape} (from --sizes)",
                                  t.span.location())
        if memory is not None and nbytes > memory:
            raise TcArgumentError(f"input '{t.name}' of shape {shape} (from --sizes) needs {nbytes} bytes, more than "
                                  f"this machine's memory", t.span.location())
        arrays.append(np.zeros(shape, dtype=t.dtype))
    return arrays


def _entry(args: argparse.Namespace) -> Any:
    """The kernel of the def named by --entry (or the file's only def)."""
    module = parse(Path(args.file).read_text(encoding="utf-8"), str(args.file))
    defs = {d.name.name: d for d in module.defs}
    if args.entry is None and len(defs) == 1:
        args.entry = next(iter(defs))
    if args.entry not in defs:
        raise TcArgumentError(f"--entry must name one of the defs in {args.file}: {', '.join(defs)}")
    return _kernels_of([defs[args.entry]], None)[0]


def _compile(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    options = MappingOptions.from_json(args.options) if args.options else MappingOptions()
    arrays = _arguments(kernel.checked, args.sizes)
    if args.emit in ("c", "cuda", "opencl"):
        print(kernel.source(*arrays, backend=args.emit, options=options), end="")
    elif args.emit == "schedule":
        print(kernel.schedule(*arrays, options=options))
    else:
        print(kernel.explain(*arrays, options=options))
    return 0


def _tune(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    rng = np.random.default_rng(args.seed or 0)
    arrays = [_random_like(a, rng) for a in _arguments(kernel.checked, args.sizes)]
    result = kernel.autotune(*arrays, generations=args.generations, population=args.population,
                             budget=args.budget, seed=args.seed, resume=args.resume, backend=args.backend)
    print(result.explain())
    print(result.options.to_json())
    return 0


def _grad(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    wrt = [w.strip() for w in args.wrt.split(",") if w.strip()] if args.wrt else None
    print(kernel.backward_source(wrt), end="")
    return 0


def _random_like(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if a.dtype.kind == "f":
        return rng.standard_normal(a.shape).astype(a.dtype)
    if a.dtype.kind in "iu":
        return rng.integers(0, 4, a.shape).astype(a.dtype)  # small: safe as gather indices into most tables
    return a


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tcdsl", description="Tensor comprehensions compiler.")
    sub = ap.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="print each def in canonical form with the inferred range of every index")
    check.add_argument("files", nargs="+", metavar="FILE.tc")
    check.set_defaults(run=_check)
    comp = sub.add_parser("compile", help="print the generated C, the schedule tree or the explanation of one def")
    comp.add_argument("file", metavar="FILE.tc")
    comp.add_argument("--entry", help="the def to compile (default: the only one)")
    comp.add_argument("--sizes", type=_sizes, default={}, help="size symbols, e.g. M=64,N=32,K=128")
    comp.add_argument("--emit", choices=("c", "cuda", "opencl", "schedule", "explain"), default="c")
    comp.add_argument("--options", help="mapping options as JSON (see MappingOptions.to_json)")
    comp.set_defaults(run=_compile)
    grad = sub.add_parser("grad", help="print the backward def derived for one def (reverse mode)")
    grad.add_argument("file", metavar="FILE.tc")
    grad.add_argument("--entry", help="the def to differentiate (default: the only one)")
    grad.add_argument("--wrt", help="inputs to differentiate with respect to, e.g. A,B (default: every float input)")
    grad.set_defaults(run=_grad)
    tune = sub.add_parser("tune", help="search mapping options for one def at given sizes and store the best")
    tune.add_argument("file", metavar="FILE.tc")
    tune.add_argument("--entry", help="the def to tune (default: the only one)")
    tune.add_argument("--sizes", type=_sizes, default={}, help="size symbols, e.g. M=64,N=32,K=128")
    tune.add_argument("--budget", type=float, help="stop after this many seconds")
    tune.add_argument("--generations", type=int, default=25)
    tune.add_argument("--population", type=int, default=100)
    tune.add_argument("--seed", type=int)
    tune.add_argument("--resume", action="store_true", help="continue an interrupted search")
    tune.add_argument("--backend", choices=("c", "opencl", "cuda"), default="c")
    tune.set_defaults(run=_tune)
    args = ap.parse_args(argv)
    try:
        return int(args.run(args))
    except TcError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
