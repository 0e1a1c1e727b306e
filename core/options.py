"""MappingOptions: the one knob object that enters the schedule stage (frozen, JSON round trip).

CPU knobs: fusion strategy, tile sizes, register tiles (unroll-and-jam), point-loop order,
vectorisation, OpenMP, the depth of the parallel loop, unrolling and the operands' layout.
``None`` means "let the default heuristic decide" (see ``polyhedral.transform``). GPU knobs
(TC's): tiles, blocks and threads per dimension (x first), shared and private memory promotion,
copy unrolling (see ``polyhedral.gpu``).
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .affine import Sym
from .checked import Binop, CheckedDef, Read, Statement
from .errors import TcArgumentError, did_you_mean

FUSION = ("max", "preserve", "min")
# the fields each backend reads (fusion: both)
CPU_FIELDS = ("fusion", "tile", "register_tile", "point_order", "vectorize", "openmp", "parallel_depth", "unroll",
              "layout")
GPU_FIELDS = ("fusion", "tile", "blocks", "threads", "shared_memory", "max_shared_memory", "private_memory",
              "unroll", "unroll_copy_shared")


@dataclass(frozen=True)
class MappingOptions:
    fusion: str | None = None  # None: "min" for defs with a contraction, else "max" (see fusion_for)
    tile: tuple[int, ...] | None = None  # per band member, outermost first; 0 or 1 leaves a member untiled
    register_tile: tuple[int, ...] | None = None  # unroll-and-jam factors of the point loops
    point_order: tuple[int, ...] | None = None  # a permutation of the point band's members
    vectorize: bool = True
    openmp: bool = True
    parallel_depth: int = 0  # which parallel loop level gets `omp parallel for` (0: outermost)
    unroll: int = 0  # fully unroll innermost point loops up to this trip count (0: off)
    # C: an A*B^T contraction with its operands laid out (tcdsl.layout: a transposed operand and
    # output), its tiles, register tiles and point order then those of the laid-out def (True), or
    # as written (False); None: laid out unless tiles, register tiles or a point order are given
    layout: bool | None = None
    blocks: tuple[int, ...] | None = None  # GPU grid size per dim, x first (None: 256, 256)
    threads: tuple[int, ...] | None = None  # GPU block size per dim, x first (None: 32, 8)
    shared_memory: bool = True  # GPU: promote reused or uncoalesced input tiles to shared memory
    max_shared_memory: int | None = None  # GPU: bytes of shared memory a block may use (None: the device's)
    private_memory: bool = True  # GPU: keep per-thread reduction targets in registers
    unroll_copy_shared: bool = False  # GPU: unroll the loops that copy to shared memory

    def __post_init__(self) -> None:
        if self.fusion is not None and self.fusion not in FUSION:
            raise TcArgumentError(f"fusion must be one of {', '.join(FUSION)}, not {self.fusion!r}")
        for name in ("tile", "register_tile", "point_order", "blocks", "threads"):
            v = getattr(self, name)
            if v is not None:
                v = tuple(int(x) for x in v)
                if any(x < 0 for x in v):
                    raise TcArgumentError(f"{name} entries must be non-negative: {v}")
                object.__setattr__(self, name, v)
        if self.point_order is not None and sorted(self.point_order) != list(range(len(self.point_order))):
            raise TcArgumentError(f"point_order must be a permutation of 0..n-1, not {self.point_order}")
        if self.parallel_depth < 0 or self.unroll < 0:
            raise TcArgumentError("parallel_depth and unroll must be non-negative")
        for name in ("blocks", "threads"):
            v = getattr(self, name)
            if v is not None and not (1 <= len(v) <= 3 and all(x >= 1 for x in v)):
                raise TcArgumentError(f"{name} takes 1 to 3 positive sizes (x first), not {v}")
        if self.max_shared_memory is not None and self.max_shared_memory < 0:
            raise TcArgumentError("max_shared_memory must be non-negative")

    def resolved(self, checked: CheckedDef) -> MappingOptions:
        """These options with the default fusion strategy chosen for ``checked``."""
        return self if self.fusion is not None else replace(self, fusion=fusion_for(checked))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MappingOptions:
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as e:
            raise TcArgumentError(f"mapping options are not JSON: {e.msg} at column {e.colno}:\n    {text}\n"
                                  f"    {' ' * (e.colno - 1)}^") from None
        if not isinstance(data, dict):
            raise TcArgumentError(f"mapping options are a JSON object of names and values, not {text!r}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise TcArgumentError("unknown mapping options: " + ", ".join(
                f"{name!r}{did_you_mean(name, known)}" for name in sorted(unknown)))
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})  # type: ignore[arg-type]

    def with_(self, **changes: Any) -> MappingOptions:
        return replace(self, **changes)

    def _repr_html_(self) -> str:
        """A table in two groups (the C backend's fields and the GPU's), the values that differ from
        the defaults in bold, named first, with the default beside them (Jupyter's rich display)."""
        changed = {c.split(":", 1)[0] for c in self.changes()}
        base, rows = MappingOptions(), []
        for group, names in (("C", CPU_FIELDS), ("CUDA / OpenCL", GPU_FIELDS)):
            cells = []
            for n in sorted(names, key=lambda n: (n not in changed, names.index(n))):
                value = html.escape(repr(getattr(self, n)))
                if n in changed:
                    cells.append(f"<tr><td style='text-align:left'><b>{n}</b></td><td style='text-align:left'>"
                                 f"<code>{value}</code> (default <code>{html.escape(repr(getattr(base, n)))}</code>)"
                                 "</td></tr>")
                else:
                    cells.append(f"<tr><td style='text-align:left'>{n}</td><td style='text-align:left'>"
                                 f"<code>{value}</code></td></tr>")
            rows.append(f"<tr><th colspan=2 style='text-align:left'>{group}</th></tr>{''.join(cells)}")
        note = f"{len(changed)} differ from the defaults" if changed else "the defaults"
        return f"<table><caption style='text-align:left'>MappingOptions: {note}</caption>{''.join(rows)}</table>"

    def changes(self) -> list[str]:
        """``"name: default -> value"`` for each option that differs from the defaults."""
        base, mine = asdict(MappingOptions()), asdict(self)
        return [f"{k}: {base[k]!r} -> {mine[k]!r}" for k in sorted(mine) if mine[k] != base[k]]

    def key(self) -> str:
        return self.to_json()


def fusion_for(checked: CheckedDef) -> str:
    """The default fusion strategy: a def with a contraction (a reduction of a product of reads
    that share the reduction index, as in matmul or conv) gets one nest per statement ("min"):
    fused into the contraction's loops, a bias or relu that needs the finished sum pushes the
    reduction innermost (a dot product down a column per output, 50x slower than the register-
    tiled contraction followed by one pass over the output). Other defs (softmax, norms,
    elementwise chains) are bound by memory: fusing everything on the common outer loops ("max")
    keeps each slice in cache between statements."""
    return "min" if any(_is_contraction(s) for s in checked.stmts) else "max"


def _is_contraction(s: Statement) -> bool:
    if s.op != "+" or not s.reductions or not (isinstance(s.rhs, Binop) and s.rhs.op == "*"):
        return False
    reads = [r for r in (s.rhs.lhs, s.rhs.rhs) if isinstance(r, Read)]
    red = set(s.reductions)
    return len(reads) == 2 and all(any(isinstance(x, Sym) and x.indices() & red for x in r.subs) for r in reads)
