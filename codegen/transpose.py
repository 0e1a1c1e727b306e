"""Blocked transposes: ``LFor -> Transpose | None``, copy nests that read memory along one loop
and write it along the other (``O(j, i) = A(i, j)``, layout changes of any rank).

Element by element, such a copy reads a new cache line at every step of its inner loop, and
with power-of-two row lengths the lines of a tile fall into the same cache sets and evict each
other. Moved in 8x8 blocks instead, eight rows of the source are read as vectors, transposed in
registers with shuffles and written as eight vectors, so every line is used whole once loaded.
Leftover rows and columns (extents that are not multiples of 8) are copied element by element.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcdsl.affine import Sym, Var
from tcdsl.checked import CheckedDef, Read
from tcdsl.dtypes import bits
from tcdsl.polyhedral.loopir import LCall, LExpr, LFor, LInt, LOp, LVar, expr_vars, trip_count
from tcdsl.polyhedral.scop import Scop

BLOCK = 8

# GCC and clang spell two-vector shuffles differently; the block is moved as 32-bit integers
# (a copy: no floating-point operation touches the values).
HELPER = r"""
typedef uint32_t tc_u32x8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t tc_i32x8 __attribute__((vector_size(32)));
#if defined(__clang__)
#define TC_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TC_SHUF(a, b, ...) __builtin_shuffle(a, b, (tc_i32x8){__VA_ARGS__})
#endif
/* o[r * so + c] = a[c * sa + r] for r, c in 0..7 (32-bit elements) */
static inline void tc_transpose8(const void *restrict a, long sa, void *restrict o, long so) {
  const uint32_t *p = (const uint32_t *)a;
  uint32_t *q = (uint32_t *)o;
  tc_u32x8 r0 = *(const tc_u32x8 *)(p), r1 = *(const tc_u32x8 *)(p + sa);
  tc_u32x8 r2 = *(const tc_u32x8 *)(p + 2 * sa), r3 = *(const tc_u32x8 *)(p + 3 * sa);
  tc_u32x8 r4 = *(const tc_u32x8 *)(p + 4 * sa), r5 = *(const tc_u32x8 *)(p + 5 * sa);
  tc_u32x8 r6 = *(const tc_u32x8 *)(p + 6 * sa), r7 = *(const tc_u32x8 *)(p + 7 * sa);
  tc_u32x8 s0 = TC_SHUF(r0, r1, 0, 8, 1, 9, 4, 12, 5, 13), s1 = TC_SHUF(r0, r1, 2, 10, 3, 11, 6, 14, 7, 15);
  tc_u32x8 s2 = TC_SHUF(r2, r3, 0, 8, 1, 9, 4, 12, 5, 13), s3 = TC_SHUF(r2, r3, 2, 10, 3, 11, 6, 14, 7, 15);
  tc_u32x8 s4 = TC_SHUF(r4, r5, 0, 8, 1, 9, 4, 12, 5, 13), s5 = TC_SHUF(r4, r5, 2, 10, 3, 11, 6, 14, 7, 15);
  tc_u32x8 s6 = TC_SHUF(r6, r7, 0, 8, 1, 9, 4, 12, 5, 13), s7 = TC_SHUF(r6, r7, 2, 10, 3, 11, 6, 14, 7, 15);
  tc_u32x8 u0 = TC_SHUF(s0, s2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = TC_SHUF(s0, s2, 2, 3, 10, 11, 6, 7, 14, 15);
  tc_u32x8 u2 = TC_SHUF(s1, s3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = TC_SHUF(s1, s3, 2, 3, 10, 11, 6, 7, 14, 15);
  tc_u32x8 u4 = TC_SHUF(s4, s6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = TC_SHUF(s4, s6, 2, 3, 10, 11, 6, 7, 14, 15);
  tc_u32x8 u6 = TC_SHUF(s5, s7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = TC_SHUF(s5, s7, 2, 3, 10, 11, 6, 7, 14, 15);
  *(tc_u32x8 *)(q) = TC_SHUF(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);
  *(tc_u32x8 *)(q + so) = TC_SHUF(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);
  *(tc_u32x8 *)(q + 2 * so) = TC_SHUF(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);
  *(tc_u32x8 *)(q + 3 * so) = TC_SHUF(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);
  *(tc_u32x8 *)(q + 4 * so) = TC_SHUF(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);
  *(tc_u32x8 *)(q + 5 * so) = TC_SHUF(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);
  *(tc_u32x8 *)(q + 6 * so) = TC_SHUF(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);
  *(tc_u32x8 *)(q + 7 * so) = TC_SHUF(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);
}
"""


@dataclass(frozen=True)
class Transpose:
    outer: LFor  # the loop along which the source is contiguous
    inner: LFor  # the loop along which the target is contiguous
    call: LCall
    source: str  # TC tensor read
    source_stride: int  # elements between consecutive inner-loop steps in the source
    target_stride: int  # elements between consecutive outer-loop steps in the target


def match(n: LFor, scop: Scop, checked: CheckedDef, strides: dict[str, tuple[int, ...]],
          in_memory: set[str]) -> Transpose | None:
    """The blocked transpose of nest ``n`` (``n`` and its only child loop around one copy), or None.
    ``in_memory``: the tensors held in their own buffers (not contracted or row-buffered)."""
    if len(n.body) != 1 or not isinstance(n.body[0], LFor):
        return None
    inner = n.body[0]
    if len(inner.body) != 1 or not isinstance(inner.body[0], LCall):
        return None
    call = inner.body[0]
    st = scop.stmt(call.stmt)
    s = checked.stmts[st.number - 1]
    if st.kind != "update" or s.op != "=" or not isinstance(s.rhs, Read) or s.rhs.conditional:
        return None
    src = s.rhs
    tensors = {t.name: t for t in (*checked.inputs, *checked.outputs, *checked.temps)}
    if (src.tensor == s.tensor or not {src.tensor, s.tensor} <= in_memory or not all(isinstance(x, Sym)
                                                                                     for x in src.subs)
            or tensors[src.tensor].dtype != tensors[s.tensor].dtype or bits(tensors[s.tensor].dtype) != 32):
        return None
    if not (_rectangular(n, None) and _rectangular(inner, n)):
        return None
    if n.omp and not (full_blocks(n) and full_blocks(inner)):
        return None  # `omp parallel for` needs the canonical loop: leftovers only in serial loops
    args = dict(zip(st.indices, call.args))
    lhs = tuple(Sym.var(i, "index") for i in s.lhs)
    t_outer = _stride(lhs, strides[s.tensor], args, n.var)
    t_inner = _stride(lhs, strides[s.tensor], args, inner.var)
    s_outer = _stride(src.subs, strides[src.tensor], args, n.var)  # type: ignore[arg-type]
    s_inner = _stride(src.subs, strides[src.tensor], args, inner.var)  # type: ignore[arg-type]
    if t_inner != 1 or s_outer != 1 or not t_outer or not s_inner:
        return None
    return Transpose(n, inner, call, src.tensor, s_inner, t_outer)


def _rectangular(f: LFor, outer: LFor | None) -> bool:
    """``for (v = a; v <= b; v += 1)`` (or ``<``) with bounds free of ``v`` and of ``outer``'s variable."""
    c = f.cond
    if f.step != 1 or not (isinstance(c, LOp) and c.op in ("<=", "<") and c.args[0] == LVar(f.var)):
        return False
    used = expr_vars(f.init) | expr_vars(c.args[1])
    return f.var not in used and (outer is None or outer.var not in used)


def full_blocks(f: LFor) -> bool:
    """Constant bounds and a trip count that is a multiple of the block: no leftover to copy."""
    trips = trip_count(f) if f.step == 1 else None
    return trips is not None and trips > 0 and trips % BLOCK == 0


def _stride(subs: tuple[Sym, ...], strides: tuple[int, ...], args: dict[str, LExpr], var: str) -> int | None:
    """Elements the access moves per step of loop ``var``; None where it is not affine in it."""
    total = 0
    for sub, stride in zip(subs, strides):
        for atom, k in sub.terms:
            if not isinstance(atom, Var):  # a floor division or min/max: only where it does not move
                if any(var in expr_vars(args[i]) for i in Sym.of(atom).indices()):
                    return None
                continue
            if atom.kind != "index":
                continue
            c = _coeff(args[atom.name], var)
            if c is None:
                return None
            total += k * c * stride
    return total


def _coeff(e: LExpr, var: str) -> int | None:
    """The coefficient of ``var`` in an affine ``e`` (None when ``e`` is not affine in it)."""
    if isinstance(e, LInt):
        return 0
    if isinstance(e, LVar):
        return 1 if e.name == var else 0
    if not isinstance(e, LOp):
        return None
    if e.op in ("+", "-"):
        parts = [_coeff(a, var) for a in e.args]
        if any(p is None for p in parts):
            return None
        return sum(parts) if e.op == "+" else parts[0] - sum(parts[1:])  # type: ignore[arg-type,operator]
    if e.op == "neg":
        p = _coeff(e.args[0], var)
        return None if p is None else -p
    if e.op == "*" and len(e.args) == 2:
        a, b = e.args
        if isinstance(a, LInt):
            p = _coeff(b, var)
            return None if p is None else a.value * p
        if isinstance(b, LInt):
            p = _coeff(a, var)
            return None if p is None else b.value * p
    return None if var in expr_vars(e) else 0
