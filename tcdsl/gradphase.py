"""Backward-def statements: a strided gradient sum taken in phases (``TExpr`` x index box ->
``Phases | None``). Used by ``tcdsl.gradrules`` as it emits a contribution.

The input gradient of a conv with stride 2, ``d_I(n, c, x2, x3) +=! d_O(n, f, h, w) * W(f, c, x2 - 2*h,
x3 - 2*w)``, sums over the output rows and columns ``h, w`` that reach input row ``x2`` and column
``x3``: which ones depends on the parity of ``x2`` and ``x3``, so no loop order is both box-shaped and
contiguous, and the sum ran with the channels innermost, scalar (8x32x29x29, 32 filters 3x3: 5.1 ms
against torch's 0.5). Writing ``x2 = 2*a + p`` and ``h = a - i`` turns the window's subscript into
``2*i + p`` and the gradient's into ``a - i``: for each phase ``p`` a stride-1 correlation over a
window of ``i`` with a fixed range (from 0: ``h = a - i - i_lo``), in a temporary
``G(p, q, n, c, a, b)`` contiguous along ``b``, which the input gradient then reads back at
``G(x2 % 2, x3 % 2, n, c, x2 / 2, x3 / 2)``. Each phase is a nest of its own, outermost
(8x32x29x29, 32 filters 3x3: 0.73 -> 0.54 ms against the phases beside the channels,
``G(n, c, p, q, a, b)``).

The sum reads copies, so that its nest is box-shaped: the window in phases,
``W_phases(f, q0, j0, q1, j1, c) = W(f, c, 2*j0 + q0, 2*j1 + q1)``, whose taps a phase lacks are
zeros, and the gradient zero-padded by the window's reach, ``d_O_pad(n, f, y, x) = d_O(n, f, y - 1,
x - 1)``, read at ``(a - i + 1, b - j + 1)``: no boundary pieces. A padded point's factor is zero,
so it adds zero (as ``gradpad``'s copies: NaN where the other factor is not finite). AVX-512, 2
threads, interleaved medians against torch: 8x32x29x29 (32 filters 3x3) 0.54 -> 0.53 ms (torch
0.44), padded 8x32x28x28 0.71 -> 0.41 (0.49), 4x3x64x64 (16 filters 7x7, stride 2, padded by 3)
0.74 -> 0.29 (0.84).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .core.affine import Sym, Var, floordiv, mod
from .core.checked import Read, TExpr
from .derivative import plain_var
from .gradpad import factors


@dataclass(frozen=True)
class Copy:
    """A factor of the phases' sum read from a copy made before the sum:
    ``copy(idx) = source where idx in 0:extents``, and the sum's ``read`` becomes ``copy(at)``."""

    stem: str
    read: Read  # the factor, in the new indices
    idx: tuple[str, ...]
    source: Read
    extents: tuple[Sym, ...]
    at: tuple[Sym, ...]


@dataclass(frozen=True)
class Phases:
    """A gradient sum's change of indices: each strided left-side index ``y`` of stride ``s`` is
    ``s * a + p`` (phase ``p``, quotient ``a``) and the summed index ``v`` that strides it is
    ``a - i - i_lo``; the window and the gradient read from ``copies``."""

    env: dict[str, Sym]  # the old indices in the new ones
    lhs: tuple[str, ...]  # the temporary's indices: the phases, then the others with the quotients in place
    back: tuple[Sym, ...]  # the temporary's subscripts in the old left-side indices
    ranges: dict[str, tuple[Sym, Sym]]  # the new indices' ranges (half-open)
    free: tuple[str, ...]  # the summed indices, ``v`` replaced by ``i``
    copies: tuple[Copy, ...]


@dataclass(frozen=True)
class _Pair:
    v: str  # the summed index
    s: int  # the stride
    e: int  # the window subscript's constant: y - s*v + e
    at: int  # the window subscript's position in the window read
    p: str = ""
    a: str = ""
    i: str = ""
    lo: int = 0  # i_lo: the least i before the shift to 0
    taps: Sym = Sym.of(0)  # the range of i
    quot: Sym = Sym.of(0)  # the range of a


def phases(value: TExpr, box: Mapping[str, tuple[Sym, Sym]], lhs: tuple[str, ...], free: tuple[str, ...],
           dims_of: Callable[[str], tuple[Sym, ...] | None], fresh: Callable[[str], str]) -> Phases | None:
    """The phases of the sum ``value`` over ``box`` into left side ``lhs`` (summed over ``free``),
    or None where no factor (the window) reads at ``y - s * v + e`` for a left-side index ``y``
    starting at 0, a summed index ``v`` and literals ``s >= 2`` and ``e``. Each such ``v`` must be a
    whole dimension of another unconditional factor read at plain ``v`` (its range stays the
    domain's, through that read), and every such subscript must be in one window read."""
    facs = [r for r in factors(value) if not r.conditional and all(isinstance(x, Sym) for x in r.subs)]
    shaped = [(r, dims) for r in facs if (dims := dims_of(r.tensor)) is not None and len(dims) == len(r.subs)]
    whole = {v for r, dims in shaped for sub, dim in zip(r.subs, dims)
             if (v := plain_var(sub)) is not None and v in free and box[v] == (Sym.of(0), dim)}
    pairs: dict[str, _Pair] = {}
    window: Read | None = None
    for r, _dims in shaped:
        for k, sub in enumerate(r.subs):
            assert isinstance(sub, Sym)
            if any(not isinstance(a, Var) for a in sub.atoms()):
                continue
            steps = {a.name: c for a, c in sub.terms if isinstance(a, Var) and a.kind == "index"}
            ys = [y for y, c in steps.items() if y in lhs and c == 1]
            vs = [v for v, c in steps.items() if v in free and c <= -2]
            if len(steps) != 2 or len(ys) != 1 or len(vs) != 1 or vs[0] not in whole:
                continue
            y, v = ys[0], vs[0]
            e = sub - Sym.var(y, "index") + Sym.var(v, "index") * (-steps[v])
            if not e.is_const() or box[y][0] != Sym.of(0) or y in pairs or any(q.v == v for q in pairs.values()) \
                    or (window is not None and window != r):
                return None  # (a second pairing of an index, or a second window: not this form)
            window = r
            pairs[y] = _Pair(v, -steps[v], e.const, k)
    if window is None:
        return None
    wdims = dims_of(window.tensor)
    assert wdims is not None
    env: dict[str, Sym] = {}
    ranges: dict[str, tuple[Sym, Sym]] = {}
    for y in lhs:
        if y in pairs:
            q = pairs[y]
            lo = (-q.e) // q.s
            taps = floordiv(wdims[q.at] - 1 - q.e, q.s) + 1 - lo
            q = pairs[y] = replace(q, p=fresh(f"{y}_p"), a=fresh(f"{y}_q"), i=fresh(f"{q.v}_i"), lo=lo, taps=taps,
                                   quot=floordiv(box[y][1] + (q.s - 1), q.s))
            env[y] = Sym.var(q.a, "index") * q.s + Sym.var(q.p, "index")
            env[q.v] = Sym.var(q.a, "index") - Sym.var(q.i, "index") - lo
            ranges[q.p] = (Sym.of(0), Sym.of(q.s))
            ranges[q.a] = (Sym.of(0), q.quot)
            ranges[q.i] = (Sym.of(0), taps)
    order = [pairs[y] for y in lhs if y in pairs]
    new_lhs = [q.p for q in order] + [pairs[y].a if y in pairs else y for y in lhs]
    back = [mod(Sym.var(y, "index"), pairs[y].s) for y in lhs if y in pairs] + \
        [floordiv(Sym.var(y, "index"), pairs[y].s) if y in pairs else Sym.var(y, "index") for y in lhs]
    by_v = {q.v: q for q in order}
    renamed = tuple(by_v[v].i if v in by_v else v for v in free)
    copies = [_window_copy(window, wdims, order, env, lhs, fresh)]
    for r, dims in shaped:
        moved = [v for sub in r.subs for v in sub.indices() if v in by_v]  # type: ignore[union-attr]
        if r != window and moved and all(plain_var(sub) in by_v or not (sub.indices() & by_v.keys())  # type: ignore[union-attr]
                                         for sub in r.subs):
            copies.append(_padded_copy(r, dims, by_v, env, fresh))
    return Phases(env, tuple(new_lhs), tuple(back), ranges, renamed, tuple(copies))


def _window_copy(r: Read, dims: tuple[Sym, ...], order: list[_Pair], env: dict[str, Sym], lhs: tuple[str, ...],
                 fresh: Callable[[str], str]) -> Copy:
    """The window in phases: each strided dimension ``k`` becomes ``(q, j)`` with the tap
    ``s * (j + i_lo) + q + e`` (a zero where that leaves the window). The dimensions the left side
    moves come last (the weights' input channels, ``W_phases(f, q0, j0, q1, j1, c)``): contiguous
    where the sum runs in vectors of them, 1.48 -> 0.41 ms for 8x32x28x28 padded (the channels
    gathered in place), and as fast where it broadcasts the weights."""
    at_k = {q.at: q for q in order}
    parts: list[tuple[int, list[str], Sym, list[Sym], list[Sym]]] = []  # (rank, copy indices, source, extents, at)
    for k, (sub, dim) in enumerate(zip(r.subs, dims)):
        q = at_k.get(k)
        if q is None:
            t = fresh(f"p{k}")
            moved = bool(sub.indices() & set(lhs))  # type: ignore[union-attr]
            parts.append((2 if moved else 0, [t], Sym.var(t, "index"), [dim], [sub.subs(env)]))  # type: ignore[union-attr]
        else:
            ph, tap = fresh(f"q{k}"), fresh(f"j{k}")
            parts.append((1, [ph, tap], Sym.var(tap, "index") * q.s + Sym.var(ph, "index") + (q.s * q.lo + q.e),
                          [Sym.of(q.s), q.taps], [Sym.var(q.p, "index"), Sym.var(q.i, "index")]))
    laid = sorted(parts, key=lambda x: x[0])
    idx = [i for p in laid for i in p[1]]
    ext = [e for p in laid for e in p[3]]
    at = [a for p in laid for a in p[4]]
    read = Read(r.dtype, r.tensor, tuple(x.subs(env) for x in r.subs))  # type: ignore[union-attr]
    return Copy(f"{r.tensor}_phases", read, tuple(idx), Read(r.dtype, r.tensor, tuple(p[2] for p in parts)),
                tuple(ext), tuple(at))


def _padded_copy(r: Read, dims: tuple[Sym, ...], by_v: dict[str, _Pair], env: dict[str, Sym],
                 fresh: Callable[[str], str]) -> Copy:
    """A factor read at plain ``v`` (the gradient), zero-padded by the window's reach: at
    ``a - i - i_lo`` it reads the copy at ``a - i + taps - 1``, always inside it."""
    idx: list[str] = []
    src: list[Sym] = []
    ext: list[Sym] = []
    at: list[Sym] = []
    for k, (sub, dim) in enumerate(zip(r.subs, dims)):
        t = fresh(f"p{k}")
        idx.append(t)
        q = by_v.get(plain_var(sub) or "")
        if q is None:
            src.append(Sym.var(t, "index"))
            ext.append(dim)
            at.append(sub.subs(env))  # type: ignore[union-attr]
        else:
            reach = q.taps - 1 + q.lo
            src.append(Sym.var(t, "index") - reach)
            ext.append(q.quot + q.taps - 1)
            at.append(Sym.var(q.a, "index") - Sym.var(q.i, "index") + q.taps - 1)
    read = Read(r.dtype, r.tensor, tuple(x.subs(env) for x in r.subs))  # type: ignore[union-attr]
    return Copy(f"{r.tensor}_pad", read, tuple(idx), Read(r.dtype, r.tensor, tuple(src)), tuple(ext), tuple(at))


def read_back(name: str, dtype: str, ph: Phases) -> Read:
    """The temporary ``name``'s read at the old left side's point."""
    return Read(dtype, name, ph.back)
