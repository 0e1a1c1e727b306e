"""Backward-def statements: a strided gradient sum taken in phases (``TExpr`` x index box ->
``Phases | None``). Used by ``tcdsl.autodiff`` as it emits a contribution.

The input gradient of a conv with stride 2, ``d_I(n, c, x2, x3) +=! d_O(n, f, h, w) * W(f, c, x2 - 2*h,
x3 - 2*w)``, sums over the output rows and columns ``h, w`` that reach input row ``x2`` and column
``x3``: which ones depends on the parity of ``x2`` and ``x3``, so no loop order is both box-shaped and
contiguous, and the sum ran with the channels innermost, scalar (8x32x29x29, 32 filters 3x3: 5.1 ms
against torch's 0.5). Writing ``x2 = 2*a + p`` and ``h = a - i`` turns the window's subscript into
``2*i + p`` and the gradient's into ``a - i``: for each phase ``p`` a stride-1 correlation over a
window of ``i`` with a fixed range, in a temporary ``G(p, q, n, c, a, b)`` contiguous along ``b``,
which the input gradient then reads back at ``G(x2 % 2, x3 % 2, n, c, x2 / 2, x3 / 2)``. Each phase is
a nest of its own, outermost (8x32x29x29, 32 filters 3x3: 0.73 -> 0.54 ms against the phases
beside the channels, ``G(n, c, p, q, a, b)``). The window's
taps a phase does not have read a zero of the window's deinterleaved copy (``gradpad.Split``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .core.affine import Sym, Var, floordiv, mod
from .core.checked import Read, TExpr
from .gradpad import factors


@dataclass(frozen=True)
class Phases:
    """A gradient sum's change of indices: each strided left-side index ``y`` of stride ``s`` is
    ``s * a + p`` (phase ``p``, quotient ``a``) and the summed index ``v`` that strides it is
    ``a - i``."""

    env: dict[str, Sym]  # the old indices in the new ones
    lhs: tuple[str, ...]  # the temporary's indices: the phases, then the others with the quotients in place
    back: tuple[Sym, ...]  # the temporary's subscripts in the old left-side indices
    ranges: dict[str, tuple[Sym, Sym]]  # the new indices' ranges (half-open)
    free: tuple[str, ...]  # the summed indices, ``v`` replaced by ``i``


def phases(value: TExpr, box: Mapping[str, tuple[Sym, Sym]], lhs: tuple[str, ...], free: tuple[str, ...],
           dims_of: Callable[[str], tuple[Sym, ...] | None], fresh: Callable[[str], str]) -> Phases | None:
    """The phases of the sum ``value`` over ``box`` into left side ``lhs`` (summed over ``free``),
    or None where no factor reads at ``y - s * v + e`` for a left-side index ``y`` starting at 0, a
    summed index ``v`` and literals ``s >= 2`` and ``e``; each such ``v`` must be a whole dimension
    of an unconditional factor read at plain ``v`` (its range stays the domain's, through that read)."""
    facs = factors(value)
    whole: set[str] = set()  # summed indices read plainly over a whole dimension
    for r in facs:
        dims = dims_of(r.tensor)
        if r.conditional or dims is None or len(dims) != len(r.subs):
            continue
        for sub, dim in zip(r.subs, dims):
            if isinstance(sub, Sym) and len(sub.terms) == 1 and sub.const == 0 and sub.terms[0][1] == 1:
                atom = sub.terms[0][0]
                if isinstance(atom, Var) and atom.name in free and box[atom.name] == (Sym.of(0), dim):
                    whole.add(atom.name)
    pairs: dict[str, tuple[str, int, Sym, Sym]] = {}  # y -> (v, s, e, the window's dimension)
    for r in facs:
        dims = dims_of(r.tensor)
        if r.conditional or dims is None or len(dims) != len(r.subs):
            continue
        for sub, dim in zip(r.subs, dims):
            if not isinstance(sub, Sym) or any(not isinstance(a, Var) for a in sub.atoms()):
                continue
            steps = {a.name: c for a, c in sub.terms if isinstance(a, Var) and a.kind == "index"}
            ys = [y for y, c in steps.items() if y in lhs and c == 1]
            vs = [v for v, c in steps.items() if v in free and c <= -2]
            if len(steps) != 2 or len(ys) != 1 or len(vs) != 1 or vs[0] not in whole:
                continue
            y, v = ys[0], vs[0]
            e = sub - Sym.var(y, "index") + Sym.var(v, "index") * (-steps[v])
            if not e.is_const() or box[y][0] != Sym.of(0) or y in pairs or \
                    any(p[0] == v for p in pairs.values()):
                return None  # (a second pairing of the same index: not this form)
            pairs[y] = (v, -steps[v], e, dim)
    if not pairs:
        return None
    env: dict[str, Sym] = {}
    ranges: dict[str, tuple[Sym, Sym]] = {}
    renamed: dict[str, str] = {}
    phase_names: list[str] = []
    quot: dict[str, str] = {}
    back_phase: list[Sym] = []
    for y in lhs:
        if y not in pairs:
            continue
        v, s, e, dim = pairs[y]
        p, a, i = fresh(f"{y}_p"), fresh(f"{y}_q"), fresh(f"{v}_i")
        env[y] = Sym.var(a, "index") * s + Sym.var(p, "index")
        env[v] = Sym.var(a, "index") - Sym.var(i, "index")
        ranges[p] = (Sym.of(0), Sym.of(s))
        ranges[a] = (Sym.of(0), floordiv(box[y][1] + (s - 1), s))
        ranges[i] = (floordiv(-e, s), floordiv(dim - 1 - e, s) + 1)
        renamed[v] = i
        phase_names.append(p)
        quot[y] = a
        back_phase.append(mod(Sym.var(y, "index"), s))
    new_lhs: list[str] = list(phase_names)
    back: list[Sym] = list(back_phase)
    for y in lhs:
        if y in pairs:
            new_lhs.append(quot[y])
            back.append(floordiv(Sym.var(y, "index"), pairs[y][1]))
        else:
            new_lhs.append(y)
            back.append(Sym.var(y, "index"))
    return Phases(env, tuple(new_lhs), tuple(back), ranges, tuple(renamed.get(v, v) for v in free))


def read_back(name: str, dtype: str, ph: Phases) -> Read:
    """The temporary ``name``'s read at the old left side's point."""
    return Read(dtype, name, ph.back)
