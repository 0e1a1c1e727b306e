"""The ``tcdsl`` command line: ``check`` prints each def checked, with its ranges; ``compile`` prints
the generated C, the schedule or the explanation; ``grad`` prints the derived backward def; ``tune``
searches and stores mapping options; ``bench`` times a kernel (default and tuned options) against
numpy's einsum of the same def; ``cache`` lists, forgets, exports and imports what searches stored,
and shows what the caches hold on disk.

Errors are printed located (file:line:col, the source line, a caret) with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from . import bench, deepstack, tuning
from .arguments import default_backend
from .core import knobs, limits
from .core.errors import TcArgumentError, TcError, did_you_mean
from .core.options import MappingOptions
from .core.sema import check_def, check_def_names
from .core.version import __version__
from .grammar import parse
from .kernel import kernels_of


def _checked_text(d: Any) -> str:
    return str(check_def(d))


def _check(args: argparse.Namespace) -> int:
    """Every file checked and reported, its errors on stderr; status 1 if any had one."""
    failed = 0
    for path in args.files:
        try:
            text = Path(path).read_text(encoding="utf-8")
            module = parse(text, str(path))
            check_def_names(module)
            for d in module.defs:
                if deepstack.is_deep(d):
                    print(deepstack.call(_checked_text, (d,), what=f"def '{d.name.name}'",
                                         where=d.name.span.location()))
                else:
                    print(_checked_text(d))
                print()
        except (TcError, OSError, UnicodeDecodeError) as e:
            print(f"tcdsl: {e}", file=sys.stderr)
            failed += 1
    if failed and len(args.files) > 1:
        print(f"tcdsl: {failed} of {len(args.files)} files have errors", file=sys.stderr)
    return 1 if failed else 0


def _sizes(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"sizes are NAME=INT pairs separated by commas, not {item!r}")
        out[name.strip()] = int(value)
    return out


def _arguments(checked, sizes: dict[str, int]) -> list[np.ndarray]:
    unknown = [s for s in sizes if s not in checked.sizes]
    if unknown:
        raise TcArgumentError(f"def '{checked.name}' has no size symbol " + ", ".join(
            f"'{s}'{did_you_mean(s, checked.sizes)}" for s in unknown) + f" (its sizes: {', '.join(checked.sizes)})")
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
    return kernels_of([defs[args.entry]], None)[0]


def _options(text: str) -> MappingOptions:
    try:
        return MappingOptions.from_json(text)
    except TcArgumentError as e:
        raise TcArgumentError(f"--options: {e.message}") from None


def _compile(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    options = _options(args.options) if args.options else None  # None: what a call would use (tuned or defaults)
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
                             budget=args.budget or None, seed=args.seed, resume=args.resume, backend=args.backend,
                             backward=args.backward)
    if args.backward:
        for name, r in ((result.forward_def, result.forward), (result.backward_def, result.backward)):
            print(f"{name}: {r.explain()}")
            print(r.options.to_json())
        return 0
    print(result.explain())
    print(result.options.to_json())
    return 0


def _bench(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    options = _options(args.options) if args.options else None
    rng = np.random.default_rng(args.seed)
    arrays = [_random_like(a, rng) for a in _arguments(kernel.checked, args.sizes)]
    sizes = ",".join(f"{k}={v}" for k, v in args.sizes.items())
    hint = f"tcdsl tune {args.file} --entry {args.entry}" + (f" --sizes {sizes}" if sizes else "")
    report = bench.run(kernel, arrays, rounds=args.rounds, backend=args.backend or default_backend(), options=options,
                       threads=args.threads, tune_hint=hint)
    print(report)
    for problem in report.problems:
        print(f"tcdsl: MISMATCH: {problem}", file=sys.stderr)
    return 0 if report.ok else 1


def _grad(args: argparse.Namespace) -> int:
    kernel = _entry(args)
    wrt = [w.strip() for w in args.wrt.split(",") if w.strip()] if args.wrt else None
    print(kernel.backward_source(wrt), end="")
    return 0


TUNE_BUDGET_S = 120.0  # tcdsl tune's default budget


def _cache(args: argparse.Namespace) -> int:
    which, backend = args.entry, args.backend
    if args.action == "list":
        found = tuning.entries(which, backend=backend)
        for e in found:
            print(e)
        print(f"{len(found)} entries in {knobs.tuning_db()}"
              + (f" ({sum(not e.here for e in found)} made for other machines, not used here)"
                 if any(not e.here for e in found) else ""))
    elif args.action == "forget":
        print(f"forgot {tuning.forget(which, backend=backend)} entries")
    elif args.action == "clear":
        print(f"forgot {tuning.clear()} entries")
        if args.kernels:
            print(f"removed {_remove_kernels()} compiled kernels")
    elif args.action == "export":
        if not args.file:
            raise TcArgumentError("tcdsl cache export FILE.json: name the file to write")
        print(f"exported {tuning.export(args.file, which, backend=backend)} entries to {args.file}")
    elif args.action == "import":
        if not args.file:
            raise TcArgumentError("tcdsl cache import FILE.json: name the file to read")
        print(f"{tuning.import_(args.file)} entries of {args.file} became the best for their keys")
    else:  # du
        for name, size, files in _disk_use():
            print(f"{size / 2**20:10.2f} MiB  {files:6d} files  {name}")
    return 0


def _disk_use() -> list[tuple[str, int, int]]:
    """(what, bytes, files) for each part of the kernel cache directory, and the tuning cache."""
    root, db = knobs.cache_dir(), knobs.tuning_db()
    parts: dict[str, list[int]] = {}
    if root.is_dir():
        for f in root.rglob("*"):
            if f.is_file() and f != db and not f.name.startswith(db.name):
                part = f.relative_to(root).parts[0] if len(f.relative_to(root).parts) > 1 else "."
                parts.setdefault(str(root / part), [0, 0])
                parts[str(root / part)][0] += f.stat().st_size
                parts[str(root / part)][1] += 1
    tuned = [p for p in db.parent.glob(db.name + "*") if p.is_file()] if db.parent.is_dir() else []  # -wal, -shm too
    rows = [(name, size, n) for name, (size, n) in sorted(parts.items())]
    return rows + [(f"{db} (tuning cache)", sum(p.stat().st_size for p in tuned), len(tuned))]


def _remove_kernels() -> int:
    """Delete the compiled kernels (the cache directory's ``c``), leaving the tuning cache."""
    d = knobs.cache_dir() / "c"
    n = sum(1 for f in d.iterdir() if f.is_file() and not f.name.endswith(".sha256")) if d.is_dir() else 0
    if d.is_dir():
        shutil.rmtree(d)
    return n


def _random_like(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if a.dtype.kind == "f":
        return rng.standard_normal(a.shape).astype(a.dtype)
    if a.dtype.kind in "iu":
        return rng.integers(0, 4, a.shape).astype(a.dtype)  # small: safe as gather indices into most tables
    return a


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tcdsl", description="Tensor comprehensions compiler.")
    ap.add_argument("--version", action="version", version=f"tcdsl {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="print each def in canonical form with the inferred range of every index")
    check.add_argument("files", nargs="+", metavar="FILE.tc", help="TC files; each is checked and reported")
    check.set_defaults(run=_check)
    comp = sub.add_parser("compile", help="print the generated C, the schedule tree or the explanation of one def")
    comp.add_argument("file", metavar="FILE.tc", help="the TC file holding the def")
    comp.add_argument("--entry", help="the def to compile (default: the only one)")
    comp.add_argument("--sizes", type=_sizes, default={}, help="size symbols, e.g. M=64,N=32,K=128")
    comp.add_argument("--emit", choices=("c", "cuda", "opencl", "schedule", "explain"), default="c",
                      help="what to print: generated C (default), CUDA or OpenCL, the schedule tree, or why each "
                           "loop is parallel or not")
    comp.add_argument("--options", help="mapping options as JSON, e.g. '{\"tile\": [32, 32, 32]}' (default: the "
                                        "tuned ones for these sizes, else the defaults)")
    comp.set_defaults(run=_compile)
    grad = sub.add_parser("grad", help="print the backward def derived for one def (reverse mode)")
    grad.add_argument("file", metavar="FILE.tc", help="the TC file holding the def")
    grad.add_argument("--entry", help="the def to differentiate (default: the only one)")
    grad.add_argument("--wrt", help="inputs to differentiate with respect to, e.g. A,B (default: every float input)")
    grad.set_defaults(run=_grad)
    tune = sub.add_parser("tune", help="search mapping options for one def at given sizes and store the best")
    tune.add_argument("file", metavar="FILE.tc", help="the TC file holding the def")
    tune.add_argument("--entry", help="the def to tune (default: the only one)")
    tune.add_argument("--sizes", type=_sizes, default={}, help="size symbols, e.g. M=64,N=32,K=128")
    tune.add_argument("--budget", type=float, default=TUNE_BUDGET_S,
                      help=f"stop after this many seconds, the final check included (default {TUNE_BUDGET_S:g}; "
                           "0: no limit)")
    tune.add_argument("--generations", type=int, default=25, help="generations of the search at most (default 25)")
    tune.add_argument("--population", type=int, default=100, help="candidates per generation (default 100)")
    tune.add_argument("--seed", type=int, help="seed of the search's random choices (default: a fresh one)")
    tune.add_argument("--resume", action="store_true", help="continue an interrupted search")
    tune.add_argument("--backward", action="store_true",
                      help="tune a training step: the def as training runs it and its backward def (the "
                           "gradients of every float input), each with the whole budget")
    tune.add_argument("--backend", choices=("c", "opencl", "cuda"), default="c",
                      help="where the kernel runs: c (default), opencl or cuda")
    tune.set_defaults(run=_tune)
    ben = sub.add_parser("bench", help="time one def's kernel (default and tuned options) against numpy's einsum "
                                        "of the same def")
    ben.add_argument("file", metavar="FILE.tc", help="the TC file holding the def")
    ben.add_argument("--entry", help="the def to time (default: the only one)")
    ben.add_argument("--sizes", type=_sizes, default={}, help="size symbols, e.g. M=512,N=512,K=512")
    ben.add_argument("--rounds", type=int, default=bench.ROUNDS,
                     help=f"interleaved rounds; each times every variant once (default {bench.ROUNDS})")
    ben.add_argument("--backend", choices=("c", "numpy"),
                     help="where the kernel runs: c (the default where a C compiler exists) or numpy (the "
                          "reference interpreter)")
    ben.add_argument("--options", help="mapping options as JSON, timed as one more variant, e.g. "
                                       "'{\"tile\": [32, 32, 32]}'")
    ben.add_argument("--threads", type=int, help="threads for the kernels and numpy's BLAS alike (default: "
                                                 "what they use now; needs threadpoolctl)")
    ben.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    ben.set_defaults(run=_bench)
    cache = sub.add_parser("cache", help="list, forget, export or import tuned options; show what the caches hold")
    cache.add_argument("action", choices=("list", "forget", "export", "import", "clear", "du"),
                       help="list: the stored results; forget: those of --entry and/or --backend; export FILE / "
                            "import FILE: as JSON, for another machine; clear: every result (--kernels: the "
                            "compiled kernels too); du: disk use of the kernel and tuning caches")
    cache.add_argument("file", nargs="?", metavar="FILE.json", help="the file to export to or import from")
    cache.add_argument("--entry", help="only the results of the def with this name")
    cache.add_argument("--backend", choices=("c", "opencl", "cuda"), help="only the results for this backend")
    cache.add_argument("--kernels", action="store_true", help="with clear: remove the compiled kernels too")
    cache.set_defaults(run=_cache)
    args = ap.parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # `tcdsl ... | head`: the reader left; no traceback, no second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # a shell's status for SIGPIPE
    except TcError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
