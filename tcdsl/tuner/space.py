"""The tuner's search space: ``CheckedDef`` + sizes -> ``Space`` of genes, and genome <-> ``MappingOptions``.

For the C backend a genome chooses the fusion strategy, whether the tiles come from the default
heuristic or from the genome (tile sizes per band member, register tiles, a point-loop order),
vectorisation, the parallel loop's depth and the unroll limit; for a def with an ``A Bᵀ``
contraction, also whether the genome's tiles apply to the def laid out
(``MappingOptions.layout``). For the GPU backends (TC's options) it chooses the fusion, tile
sizes, blocks and threads per dimension, shared and private memory, unrolling and copy unrolling.
Genomes that cannot run well are pruned before compiling (``prune``): on the GPU, mappings the
device cannot launch (the static resource proof) and blocks of fewer than a warp of threads.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from tcdsl.core import dtypes as T
from tcdsl.core.affine import Sym
from tcdsl.core.checked import CheckedDef
from tcdsl.core.errors import TcScheduleError
from tcdsl.core.options import FUSION, MappingOptions
from tcdsl.core.sema import BUILTINS
from tcdsl.layout import rewrite
from tcdsl.polyhedral.gpu import DEFAULT_BLOCKS, DEFAULT_THREADS, SM90, check_options

from .genetic import Gene, Genome, Space

TILE_SIZES = (0, 4, 8, 16, 32, 48, 64, 128, 256, 512, 1024)  # 0: the member stays untiled
REGISTER_SIZES = (1, 2, 4, 6, 8, 16, 32, 64)
UNROLL = (0, 4, 8, 16)
MAX_ACCUMULATORS = 1024  # register-tile elements (a product of factors) beyond which the tile spills
MAX_ORDERS = 24  # all point orders up to 4 members, else each member moved innermost


def depth(checked: CheckedDef) -> int:
    """The deepest loop nest of the def: the most indices any statement runs over."""
    return max((len(s.lhs) + len(s.reductions) for s in checked.stmts), default=0)


def extents(checked: CheckedDef, sizes: dict[str, int]) -> list[int]:
    """Per loop level, the largest extent a statement has there (for tile choices)."""
    n = depth(checked)
    best = [1] * n
    env = {k: Sym.of(v) for k, v in sizes.items()}
    for s in checked.stmts:
        for level, r in enumerate(s.ranges):
            lo, hi = r.lo.subs(env), r.hi.subs(env)
            if not lo.terms and not hi.terms:  # ranges with floor divisions etc. keep the default
                best[level] = max(best[level], int(hi.const) - int(lo.const))
    return best


def tile_choices(extent: int) -> tuple[int, ...]:
    """0 (untiled), the powers of two and usual sizes below ``extent``, and its divisors from 4 up
    (tiles that divide the extent leave no partial tile)."""
    divisors = {d for d in range(4, extent // 2 + 1) if extent % d == 0}
    return tuple(sorted({t for t in TILE_SIZES if t < extent} | divisors | {0}))


def orders(n: int) -> list[tuple[int, ...] | None]:
    """Point-loop orders to try: None (the heuristic's), then permutations of ``n`` members."""
    if n <= 1:
        return [None]
    perms = list(itertools.permutations(range(n)))
    if len(perms) > MAX_ORDERS:
        perms = [tuple([*(j for j in range(n) if j != i), i]) for i in range(n)]
    return [None, *perms]


def space_for(checked: CheckedDef, sizes: dict[str, int]) -> Space:
    """The genes of the C backend for ``checked`` at ``sizes``; for a def with an ``A Bᵀ``
    contraction (tcdsl.layout), whether explicit tiles apply to the def laid out or as written
    (the tile genes then cover the loop levels of both)."""
    ext = extents(checked, sizes)
    laid = rewrite(checked, sizes)
    if laid is not None:
        ext = [max(a, b) for a, b in itertools.zip_longest(ext, extents(laid, sizes), fillvalue=1)]
    genes = [Gene("fusion", (None, *FUSION)), Gene("tiles", ("default", "explicit"))]
    if laid is not None:
        genes.append(Gene("layout", (None, True)))
    for level, e in enumerate(ext):
        genes.append(Gene(f"tile{level}", tile_choices(e)))
    for level, e in enumerate(ext):
        genes.append(Gene(f"register{level}", tuple(r for r in REGISTER_SIZES if r <= max(e, 1))))
    genes += [Gene("order", tuple(orders(len(ext)))),
              Gene("vectorize", (True, False)),
              Gene("parallel_depth", tuple(range(min(3, max(len(ext), 1))))),
              Gene("unroll", UNROLL)]
    return Space(tuple(genes))


GPU_TILES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
GPU_BLOCKS = (1, 4, 16, 64, 256, 1024, 4096)
GPU_THREADS = ((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), (1, 2, 4, 8, 16, 32), (1, 2, 4))
GPU_UNROLL = (0, 1, 2, 4, 8, 16, 32)
WARP = 32


def gpu_space_for(checked: CheckedDef, sizes: dict[str, int]) -> Space:
    """The genes of the GPU backends (TC's mapping options) for ``checked`` at ``sizes``."""
    ext = extents(checked, sizes)
    genes = [Gene("fusion", (None, *FUSION)), Gene("tiles", ("default", "explicit"))]
    for level, e in enumerate(ext):
        genes.append(Gene(f"gtile{level}", tuple(t for t in GPU_TILES if t < max(e, 2)) or (0,)))
    genes += [Gene("block_x", GPU_BLOCKS), Gene("block_y", GPU_BLOCKS)]
    genes += [Gene(f"thread_{'xyz'[d]}", GPU_THREADS[d]) for d in range(3)]
    genes += [Gene("shared_memory", (True, False)), Gene("private_memory", (True, False)),
              Gene("unroll", GPU_UNROLL), Gene("unroll_copy_shared", (False, True))]
    return Space(tuple(genes))


def _is_gpu(space: Space) -> bool:
    return any(g.name == "thread_x" for g in space.genes)


def _levels(space: Space) -> int:
    """Loop levels the space has tile (and register) genes for."""
    return sum(1 for g in space.genes if g.name.startswith(("register", "gtile")))


def _gpu_to_options(space: Space, v: dict[str, Any]) -> MappingOptions:
    blocks = (v["block_x"], v["block_y"])
    threads: tuple[int, ...] = (v["thread_x"], v["thread_y"], v["thread_z"])
    while len(threads) > 1 and threads[-1] == 1:
        threads = threads[:-1]
    explicit = v["tiles"] == "explicit"
    return MappingOptions(
        fusion=v["fusion"], tile=tuple(v[f"gtile{i}"] for i in range(_levels(space))) if explicit else None,
        blocks=None if blocks == DEFAULT_BLOCKS else blocks, threads=None if threads == DEFAULT_THREADS else threads,
        shared_memory=v["shared_memory"], private_memory=v["private_memory"], unroll=v["unroll"],
        unroll_copy_shared=v["unroll_copy_shared"])


def _gpu_from_options(space: Space, options: MappingOptions) -> Genome | None:
    n = _levels(space)
    explicit = options.tile is not None
    tile = (list(options.tile or ()) + [0] * n)[:n]
    blocks = (list(options.blocks or DEFAULT_BLOCKS) + [1, 1])[:2]
    threads = (list(options.threads or DEFAULT_THREADS) + [1, 1, 1])[:3]
    values: dict[str, Any] = {"fusion": options.fusion, "tiles": "explicit" if explicit else "default",
                              "block_x": blocks[0], "block_y": blocks[1], "shared_memory": options.shared_memory,
                              "private_memory": options.private_memory, "unroll": options.unroll,
                              "unroll_copy_shared": options.unroll_copy_shared}
    values.update({f"thread_{'xyz'[d]}": threads[d] for d in range(3)})
    values.update({f"gtile{i}": tile[i] for i in range(n)})
    try:
        return space.encode(values)
    except ValueError:
        return None


def to_options(space: Space, genome: Genome) -> MappingOptions:
    v = space.decode(genome)
    if _is_gpu(space):
        return _gpu_to_options(space, v)
    n = _levels(space)
    explicit = v["tiles"] == "explicit"
    return MappingOptions(
        fusion=v["fusion"],
        tile=tuple(v[f"tile{i}"] for i in range(n)) if explicit else None,
        register_tile=tuple(v[f"register{i}"] for i in range(n)) if explicit else None,
        point_order=tuple(v["order"]) if explicit and v["order"] is not None else None,
        vectorize=v["vectorize"], parallel_depth=v["parallel_depth"], unroll=v["unroll"], layout=v.get("layout"))


def from_options(space: Space, options: MappingOptions) -> Genome | None:
    """The genome of ``options``, or None where the space has no such choice."""
    if _is_gpu(space):
        return _gpu_from_options(space, options)
    n = _levels(space)
    explicit = options.tile is not None or options.register_tile is not None or options.point_order is not None
    tile = (list(options.tile or ()) + [0] * n)[:n] if explicit else [0] * n
    reg = (list(options.register_tile or ()) + [1] * n)[:n] if explicit else [1] * n
    values: dict[str, Any] = {"fusion": options.fusion, "tiles": "explicit" if explicit else "default",
                              "order": options.point_order if explicit else None, "vectorize": options.vectorize,
                              "parallel_depth": options.parallel_depth, "unroll": options.unroll}
    if any(g.name == "layout" for g in space.genes):
        values["layout"] = options.layout
    elif options.layout is not None:
        return None
    values.update({f"tile{i}": tile[i] for i in range(n)})
    values.update({f"register{i}": reg[i] for i in range(n)})
    try:
        return space.encode(values)
    except ValueError:
        return None


def prune(space: Space, genome: Genome) -> str | None:
    """Why ``genome`` is not worth compiling, or None: a register tile beyond the registers spills;
    a GPU mapping the device cannot run, or blocks of fewer threads than a warp."""
    if _is_gpu(space):
        options = to_options(space, genome)
        try:
            check_options(options, SM90)
        except TcScheduleError as e:
            return str(e)
        threads = math.prod(options.threads or (32, 8))
        return f"{threads} threads per block, under a warp" if threads < WARP else None
    v = space.decode(genome)
    if v["tiles"] == "explicit":
        acc = math.prod(v[f"register{i}"] for i in range(_levels(space)))
        if acc > MAX_ACCUMULATORS:
            return f"register tile of {acc} elements"
    return None


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEEP = set(BUILTINS) | set(T.TYPE_NAMES) | {"def", "where", "in"}


def canonical_text(checked: CheckedDef) -> str:
    """The def's text with its own names (def, tensors, sizes, indices) renamed in order of first
    appearance: two defs that differ only in names give the same text (the tuning cache's key)."""
    text = "\n".join(line for line in str(checked).splitlines() if not line.lstrip().startswith("#"))
    names: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        word = m.group(0)
        if word in _KEEP:
            return word
        return names.setdefault(word, f"v{len(names)}")

    return _IDENT.sub(rename, text)
