"""Race check: ``GpuKernel x Scop -> list of races``, by running a kernel's loop IR for every block
and thread (small sizes) and recording who touches which element between two barriers.

Each thread runs as a generator that stops at every barrier; a block's threads advance together
from barrier to barrier. Two accesses to the same element of a tensor or shared buffer, by two
threads of one block, in the same interval between barriers, at least one a write, are a race.
This is the oracle for barrier placement: independent of how barriers were placed, and unlike
PoCL (which adds barriers at the back edge of every loop holding one) it sees every interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Read, reads

from .gpu import BLOCK_IDS, THREAD_IDS, GpuKernel
from .loopir import LCall, LCopy, LExpr, LFor, LIf, LMark, LNode, LSync, expr_text, expr_value
from .scop import Scop


@dataclass(frozen=True)
class Race:
    block: tuple[int, int, int]
    interval: int  # barriers passed before the accesses
    location: tuple[str, int]  # (tensor or shared buffer, flat element index)
    threads: tuple[int, int]  # linear thread ids
    kinds: tuple[str, str]  # "read" / "write"

    def __str__(self) -> str:
        return (f"block {self.block}, after barrier {self.interval}: {self.location[0]}[{self.location[1]}] "
                f"{self.kinds[0]} by thread {self.threads[0]}, {self.kinds[1]} by thread {self.threads[1]}")


def races(kernel: GpuKernel, scop: Scop, limit: int = 10) -> list[Race]:
    """Up to ``limit`` races of ``kernel`` (none: every cross-thread dependence has a barrier)."""
    found: list[Race] = []
    gx, gy, gz = kernel.grid
    bx, by, bz = kernel.block
    for b in ((x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)):
        threads = []
        for t in ((x, y, z) for z in range(bz) for y in range(by) for x in range(bx)):
            env = {**dict(zip(BLOCK_IDS, b)), **dict(zip(THREAD_IDS, t))}
            threads.append(_Thread(kernel, scop, env, t[0] + bx * (t[1] + by * t[2])).run())
        interval = 0
        live = list(range(len(threads)))
        while live:
            seen: dict[tuple[str, int], list[tuple[int, str]]] = {}
            still = []
            for tid in live:
                log: list[tuple[str, tuple[str, int]]] = []
                try:
                    while True:
                        step = next(threads[tid])
                        if step is None:
                            still.append(tid)
                            break
                        log.append(step)
                except StopIteration:
                    pass
                for kind, loc in log:
                    seen.setdefault(loc, []).append((tid, kind))
            for loc, accesses in seen.items():
                writers = [t for t, k in accesses if k == "write"]
                if not writers:
                    continue
                other = next(((t, k) for t, k in accesses if t != writers[0]), None)
                if other is not None:
                    found.append(Race(b, interval, loc, (writers[0], other[0]), ("write", other[1])))
                    if len(found) >= limit:
                        return found
            live = still
            interval += 1
    return found


class _Thread:
    def __init__(self, kernel: GpuKernel, scop: Scop, env: dict[str, int], tlin: int) -> None:
        self.kernel = kernel
        self.scop = scop
        self.env = dict(env)
        self.env["tc_tlin"] = tlin
        self.sizes = scop.inst.sizes
        self.shapes = scop.inst.shapes
        self.promoted: dict[str, tuple[str, tuple[int, ...], tuple[int, ...], int]] = {}
        self.pitch = {b.name: b.pitch for b in kernel.shared}

    def run(self) -> Iterator[tuple[str, tuple[str, int]] | None]:
        yield from self._body(self.kernel.body)

    def _body(self, nodes: tuple[LNode, ...]) -> Iterator[tuple[str, tuple[str, int]] | None]:
        for n in nodes:
            yield from self._node(n)

    def _node(self, n: LNode) -> Iterator[tuple[str, tuple[str, int]] | None]:
        env = self.env
        if isinstance(n, LSync):
            yield None
        elif isinstance(n, LFor):
            init = _eval(n.init, env)
            step = n.step
            if n.mapped:
                ident = (BLOCK_IDS if n.mapped == "block" else THREAD_IDS)[n.dim]
                init += step * ((env[ident] - init // step) % n.count)
                step *= n.count
            v = init
            while True:
                env[n.var] = v
                if not _eval(n.cond, env):
                    break
                yield from self._body(n.body)
                v += step
            env.pop(n.var, None)
        elif isinstance(n, LIf):
            yield from self._body(n.then if _eval(n.cond, env) else n.other)
        elif isinstance(n, LMark):
            yield from self._body(n.body)
        elif isinstance(n, LCopy):
            offs = tuple(_eval(o, env) for o in n.offsets)
            shape = self.shapes[n.tensor]
            nthreads = math.prod(self.kernel.block)
            for e in range(env["tc_tlin"], math.prod(n.sizes), nthreads):
                j = _unravel(e, n.sizes)
                if all(o + x < s for o, x, s in zip(offs, j, shape)):
                    yield ("read", (n.tensor, _flat([o + x for o, x in zip(offs, j)], shape)))
                    yield ("write", (n.buffer, _shared_flat(j, n.sizes, self.pitch[n.buffer])))
            self.promoted[n.tensor] = (n.buffer, offs, n.sizes, self.pitch[n.buffer])
            yield from self._body(n.body)
            del self.promoted[n.tensor]
        elif isinstance(n, LCall):
            yield from self._call(n)

    def _call(self, n: LCall) -> Iterator[tuple[str, tuple[str, int]]]:
        st = self.scop.stmt(n.stmt)
        s = self.scop.tc_statement(st.name)
        scattered = s.scatter[0] if st.kind == "update" and s.scatter is not None else None
        atomic = scattered is not None  # adds atomically at the row the data names
        idx = {name: _eval(a, self.env) for name, a in zip(st.indices, n.args) if name != scattered}
        values = {**self.sizes, **idx}
        if st.kind == "update":
            for r in reads(s.rhs):
                loc = self._read(r, values)
                if loc is not None:
                    yield ("read", loc)
        if atomic:
            return
        target = (s.tensor, _flat([idx[i] for i in s.lhs], self.shapes[s.tensor]))
        if st.kind == "update" and s.op != "=":
            yield ("read", target)
        yield ("write", target)

    def _read(self, r: Read, values: dict[str, int]) -> tuple[str, int] | None:
        if not all(isinstance(x, Sym) for x in r.subs):
            return None  # a gather: its element depends on data
        sub = [x.eval(values) for x in r.subs if isinstance(x, Sym)]
        shape = self.shapes[r.tensor]
        if not all(0 <= v < e for v, e in zip(sub, shape)):
            return None  # a guarded read outside the tensor does not happen
        p = self.promoted.get(r.tensor)
        if p is not None:
            buf, offs, sizes, pitch = p
            return (buf, _shared_flat([v - o for v, o in zip(sub, offs)], sizes, pitch))
        return (r.tensor, _flat(sub, shape))


def _unravel(e: int, sizes: tuple[int, ...]) -> list[int]:
    out = []
    for s in reversed(sizes):
        out.append(e % s)
        e //= s
    return list(reversed(out))


def _flat(idx: list[int] | tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for v, s in zip(idx, shape):
        flat = flat * s + v
    return flat


def _shared_flat(j: list[int] | tuple[int, ...], sizes: tuple[int, ...], pitch: int) -> int:
    dims = [*sizes[:-1], pitch]
    return _flat(j, tuple(dims))


def _eval(e: LExpr, env: dict[str, int]) -> int:
    v = expr_value(e, env)
    assert v is not None, expr_text(e)
    return v
