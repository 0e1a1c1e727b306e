"""Backward-def statements: which factors of a windowed gradient sum read a zero-padded copy
(``TExpr`` x index box -> ``list[Pad]``), and which a copy deinterleaved along a stride
(``list[Split]``). Used by ``tcdsl.gradrules`` as it emits a contribution.

A padded conv's weight gradient ``d_W(f, c, kh, kw) +=! d_O(n, f, h, w) * I(n, c, h + kh - 1, w + kw - 1)``
reads the input out of bounds near its edges. By the domain rule each point runs only where every
read is in bounds, so the compiled sum splits into one piece per tap of the window, each streaming
the data again with its own bounds. Reading a zero-padded copy of the input instead leaves one
box-shaped nest, which takes the whole window in registers and strips of filters: 8x16x32x32, 32
filters 3x3, weight gradient 2.61 -> 0.43 ms (AVX-512), 1.31 -> 0.65 ms (AVX2); the copy is one pass
over the input. A padded point's factor is zero, so it adds zero to the sum: the gradient of zero
padding, as torch computes it (a non-finite value of another factor at such a point meets 0 there).

Only a window's sums are padded: every index of the gradient's left side that a padded subscript
moves ranges over at most ``WINDOW`` values, or is summed by the forward statement (a window of
any size: ``float(F, C, KH, KW) W``). Where such a window's reads pass the input's last rows only
for some sizes (``h + kh - 1`` for ``h in 0:32, kh in 0:KH``: past ``H`` when ``KH + 30 > H``),
the copy holds the rows the sum reaches (``KH + 31`` from the first pad row: zeros past the end).
The same conv in the form ``float(F, C, KH, KW)``, ``where h in 0:32``, was left with its pieces:
2.6 ms for forward + backward against torch's 1.5; from the copy, 1.5 (AVX-512).

The input gradient of the same conv (its left side the input's rows and columns) runs slower
from a padded copy on AVX-512 (0.44 -> 0.95 ms), and keeps its boundary pieces.

A strided conv's weight gradient ``d_W(f, c, kh, kw) +=! d_O(n, f, h, w) * I(n, c, 2*h + kh, kw + 2*w)``
reads the input two apart along the columns it sums, so its sum has no vector form (a gather per
element, or scalar). Reading a copy of the input with its last dimension deinterleaved into phases
(``I_split(n, c, y, q, b) = I(n, c, y, 2*b + q)``) turns the read into
``I_split(n, c, 2*h + kh, kw % 2, w + kw / 2)``, contiguous along ``w``: the same jammed sum as an
unstrided window's (``Split``). 8x32x29x29, 32 filters 3x3, stride 2, AVX-512: 3.6 -> 0.41 ms.
A read both padded and strided takes one copy, split and zero-padded at once (``gradrules``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .core.affine import Sym, Var, bounds, floordiv, mod, sign_of
from .core.checked import Binop, Convert, Read, TExpr, Unop

WINDOW = 16  # most values of a left-side index a padded subscript may move


@dataclass(frozen=True)
class Pad:
    """A factor read out of bounds, and the zero-padded copy it reads instead."""

    read: Read
    low: tuple[Sym, ...]  # zeros before each dimension
    extents: tuple[Sym, ...]  # the copy's dimensions

    def shifted(self, name: str) -> Read:
        """The read, of the copy ``name``."""
        subs = tuple(s + lo for s, lo in zip(self.read.subs, self.low) if isinstance(s, Sym))  # (pads: all Sym)
        return Read(self.read.dtype, name, subs)


def factors(e: TExpr) -> list[Read]:
    """The reads that multiply the whole of ``e`` (a zero one makes it zero)."""
    if isinstance(e, Read):
        return [e]
    if isinstance(e, Binop) and e.op == "*":
        return factors(e.lhs) + factors(e.rhs)
    if isinstance(e, Convert) or isinstance(e, Unop) and e.op == "-":
        return factors(e.arg)
    return []


def pads(value: TExpr, box: Mapping[str, tuple[Sym, Sym]], lhs: tuple[str, ...],
         dims_of: Callable[[str], tuple[Sym, ...] | None], windows: frozenset[str] = frozenset()) -> list[Pad]:
    """The factors of a sum's ``value`` over ``box`` (left-side indices ``lhs``) to read from
    zero-padded copies: reads of known tensors with affine subscripts that leave their bounds by
    amounts fixed for every size below, moved by no left-side index of more than ``WINDOW`` values
    but those of ``windows`` (summed by the forward: a window, whatever its size).

    Where the top of a dimension is left only for some sizes (``I(n, c, h + kh - 1, ...)`` with
    ``h in 0:32, kh in 0:KH``: out of bounds when ``KH + 30 > H``), the copy holds the rows the sum
    reads, ``hi + 1`` of them past its low pad: zeros where they lie past the tensor's end."""
    out: list[Pad] = []
    for r in factors(value):
        dims = dims_of(r.tensor)
        if r.conditional or dims is None or len(dims) != len(r.subs) or r in (p.read for p in out):
            continue
        low, ext, outside = [], [], False
        for sub, dim in zip(r.subs, dims):
            if not isinstance(sub, Sym) or not sub.indices() <= box.keys():
                break
            lo, hi = bounds(sub, box)
            before, after = -lo, hi - (dim - 1)
            if sign_of(before) not in (-1, 1):
                break  # a low side that depends on the sizes: the shift would too
            b = before if sign_of(before) == 1 and before != Sym.of(0) else Sym.of(0)
            a = after if sign_of(after) == 1 and after != Sym.of(0) else Sym.of(0)
            if b != Sym.of(0) or a != Sym.of(0) or sign_of(after) is None:
                moved = sub.indices() & set(lhs)
                if any(not _small(box[i]) and i not in windows for i in moved):
                    break
                outside = True
            low.append(b)
            ext.append(hi + 1 + b if sign_of(after) is None else dim + b + a)
        else:
            if outside:
                out.append(Pad(r, tuple(low), tuple(ext)))
    return out


def _small(rng: tuple[Sym, Sym]) -> bool:
    n = rng[1] - rng[0]
    return n.is_const() and n.const <= WINDOW


@dataclass(frozen=True)
class Split:
    """A factor whose last subscript steps ``stride`` elements along a summed index, and the copy
    it reads instead: that dimension deinterleaved into ``stride`` phases of consecutive elements,
    ``copy(..., q, b) = read's tensor(..., stride * b + q)``."""

    read: Read
    stride: int
    summed: str  # the summed index the last subscript steps along
    extents: tuple[Sym, ...]  # the copy's dimensions

    def reread(self, name: str, box: Mapping[str, tuple[Sym, Sym]]) -> Read:
        """The read, of the copy ``name``: ``stride * v + e`` becomes ``(e % stride, v + e / stride)``
        (``(e, v)`` where ``e`` stays within one phase's range)."""
        *head, last = self.read.subs
        assert isinstance(last, Sym)
        v = Sym.var(self.summed, "index")
        rest = last - v * self.stride
        lo, hi = bounds(rest, box)
        if lo.is_const() and hi.is_const() and 0 <= lo.const and hi.const < self.stride:
            tail = (rest, v)
        else:
            tail = (mod(rest, self.stride), v + floordiv(rest, self.stride))
        return Read(self.read.dtype, name, (*head, *tail))


def splits(value: TExpr, box: Mapping[str, tuple[Sym, Sym]], summed: tuple[str, ...],
           dims_of: Callable[[str], tuple[Sym, ...] | None]) -> list[Split]:
    """The factors of a sum's ``value`` over ``box`` to read from deinterleaved copies: reads of
    known tensors whose last subscript is ``s * v + e`` for a summed index ``v`` and a literal
    ``s >= 2``, where ``e`` moves with no other summed index by more than one element a step."""
    out: list[Split] = []
    for r in factors(value):
        dims = dims_of(r.tensor)
        if r.conditional or dims is None or len(dims) != len(r.subs) or not r.subs or \
                r in (p.read for p in out) or not all(isinstance(x, Sym) for x in r.subs):
            continue
        last = r.subs[-1]
        assert isinstance(last, Sym)
        if not last.indices() <= box.keys() or any(not isinstance(a, Var) for a in last.atoms()):
            continue
        steps = {a.name: c for a, c in last.terms if isinstance(a, Var) and a.kind == "index"}
        strided = [v for v, c in steps.items() if v in summed and c >= 2]
        if len(strided) != 1 or any(abs(c) > 1 for v, c in steps.items() if v in summed and v != strided[0]):
            continue
        s = steps[strided[0]]
        out.append(Split(r, s, strided[0], (*dims[:-1], Sym.of(s), floordiv(dims[-1] + (s - 1), s))))
    return out
