"""Blocked transposes: ``LFor -> LTranspose | None``, copy nests that read memory along one loop
and write it along the other (``O(j, i) = A(i, j)``, layout changes of any rank).

Element by element, such a copy reads a new cache line at every step of its inner loop, and
with power-of-two row lengths the lines of a tile fall into the same cache sets and evict each
other. Moved in 8x8 blocks instead, eight rows of the source are read as vectors, transposed in
registers with shuffles and written as eight vectors, so every line is used whole once loaded.
The emitter hands each tile (or, under `omp parallel for`, each strip of eight target rows) to
``tc_transpose_rect``, which walks 16 source rows at a time so that target lines are written
whole, streams large targets past the caches, and copies leftover rows and columns (extents
that are not multiples of 8) element by element.
"""

from __future__ import annotations

from tcdsl.core.affine import Sym, Var
from tcdsl.core.checked import CheckedDef, Read
from tcdsl.core.dtypes import bits
from tcdsl.polyhedral.loopir import LCall, LExpr, LFor, LInt, LOp, LTranspose, LVar, expr_vars, trip_count
from tcdsl.polyhedral.scop import Scop

BLOCK = 8
STREAM_MIN_BYTES = 16 << 20  # targets at least this large bypass the caches (they would not stay in them)

# GCC and clang spell two-vector shuffles differently; the block is moved as 32-bit integers
# (a copy: no floating-point operation touches the values). On x86 with AVX, large targets are
# written with non-temporal stores in whole cache lines: a normal store first reads the line it
# writes, so a copy moves three bytes for every two it needs (elsewhere they are stored normally).
HELPER = r"""
/* the elements are moved as 32-bit words of any type: may_alias keeps GCC's type-based alias analysis
   from assuming a float the caller reads is not written here */
typedef uint32_t tc_u32 __attribute__((may_alias));
typedef uint32_t tc_u32x8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t tc_i32x8 __attribute__((vector_size(32)));
#if defined(__clang__)
#define TC_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TC_SHUF(a, b, ...) __builtin_shuffle(a, b, (tc_i32x8){__VA_ARGS__})
#endif
/* v[r][c] = a[c * sa + r] for r, c in 0..7 (32-bit elements) */
static inline void tc_transpose8v(const tc_u32 *restrict p, long sa, tc_u32x8 v[8]) {
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
  v[0] = TC_SHUF(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);
  v[1] = TC_SHUF(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);
  v[2] = TC_SHUF(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);
  v[3] = TC_SHUF(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);
  v[4] = TC_SHUF(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);
  v[5] = TC_SHUF(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);
  v[6] = TC_SHUF(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);
  v[7] = TC_SHUF(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);
}
/* o[r * so + c] = a[c * sa + r] for r, c in 0..7 */
static inline void tc_transpose8x(const tc_u32 *restrict p, long sa, tc_u32 *restrict q, long so) {
  tc_u32x8 v[8];
  tc_transpose8v(p, sa, v);
  for (int k = 0; k < 8; k++)
    *(tc_u32x8 *)(q + k * so) = v[k];
}
/* Non-temporal stores of whole 64-byte lines (x86-64 with AVX): each line is written by one
   instruction (AVX-512) or two back to back, never left half-written in a write-combining buffer,
   which would then go to memory as a partial line (a read-modify-write: 2x slower). */
#if defined(__AVX__) && defined(__x86_64__)
#include <immintrin.h>
#define TC_HAVE_NT 1
/* o[r * so + c] = a[c * sa + r] for r in 0..7, c in 0..15, o's rows 64-byte aligned */
static inline void tc_transpose16x8_nt(const tc_u32 *restrict p, long sa, tc_u32 *restrict q, long so) {
  tc_u32x8 lo[8], hi[8];
  tc_transpose8v(p, sa, lo);
  tc_transpose8v(p + 8 * sa, sa, hi);
  for (int k = 0; k < 8; k++) {
#if defined(__AVX512F__)
    _mm512_stream_si512((void *)(q + k * so),
                        _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)lo[k]), (__m256i)hi[k], 1));
#else
    _mm256_stream_si256((__m256i *)(q + k * so), (__m256i)lo[k]);
    _mm256_stream_si256((__m256i *)(q + k * so + 8), (__m256i)hi[k]);
#endif
  }
}
#define TC_NT_FENCE() _mm_sfence()
#else
#define TC_HAVE_NT 0
static inline void tc_transpose16x8_nt(const tc_u32 *restrict p, long sa, tc_u32 *restrict q, long so) {
  tc_transpose8x(p, sa, q, so);
  tc_transpose8x(p + 8 * sa, sa, q + 8, so);
}
#define TC_NT_FENCE() ((void)0)
#endif
/* o[r * so + c] = a[c * sa + r] for r in 0..7, c in 0..n-1 (n >= 0), normal stores */
static inline void tc_transpose_rows8(const tc_u32 *restrict p, long sa, tc_u32 *restrict q, long so, long n) {
  long c = 0;
  for (; c + 8 <= n; c += 8)
    tc_transpose8x(p + c * sa, sa, q + c, so);
  for (; c < n; c++)
    for (long r = 0; r < 8; r++)
      q[r * so + c] = p[c * sa + r];
}
/* o[r * so + c] = a[c * sa + r] for r in 0..n0-1, c in 0..n1-1 (32-bit elements). Groups of 16
   columns (16 rows of a, one 64-byte line of each row of o) are swept down the rows, so a is
   read row by row and each line of o is written whole; with nt (and so a multiple of 16, so that
   the rows of o share one alignment) those lines are written around the caches. */
static __attribute__((noinline)) void tc_transpose_rect(const void *restrict a, long sa, void *restrict o,
                                                        long so, long n0, long n1, int nt) {
  const tc_u32 *p = (const tc_u32 *)a;
  tc_u32 *q = (tc_u32 *)o;
  long c = 0;
  const int stream = TC_HAVE_NT && nt && so % 16 == 0 && ((uintptr_t)q & 3) == 0;
  if (stream) {  /* the columns before the first line boundary of o's rows */
    c = (long)((0 - (uintptr_t)q / 4) & 15);
    if (c > n1)
      c = n1;
    long r = 0;
    for (; r + 8 <= n0; r += 8)
      tc_transpose_rows8(p + r, sa, q + r * so, so, c);
    for (; r < n0; r++)
      for (long k = 0; k < c; k++)
        q[r * so + k] = p[k * sa + r];
  }
  for (; c + 16 <= n1; c += 16) {
    long r = 0;
    for (; r + 8 <= n0; r += 8) {
      if (stream) {
        tc_transpose16x8_nt(p + c * sa + r, sa, q + r * so + c, so);
      } else {
        tc_transpose8x(p + c * sa + r, sa, q + r * so + c, so);
        tc_transpose8x(p + (c + 8) * sa + r, sa, q + r * so + c + 8, so);
      }
    }
    for (; r < n0; r++)
      for (long k = c; k < c + 16; k++)
        q[r * so + k] = p[k * sa + r];
  }
  if (stream)
    TC_NT_FENCE();
  long r = 0;
  for (; r + 8 <= n0; r += 8)
    tc_transpose_rows8(p + c * sa + r, sa, q + r * so + c, so, n1 - c);
  for (; r < n0; r++)
    for (long k = c; k < n1; k++)
      q[r * so + k] = p[k * sa + r];
}
"""


def match(n: LFor, scop: Scop, checked: CheckedDef, strides: dict[str, tuple[int, ...]],
          in_memory: set[str]) -> LTranspose | None:
    """The blocked transpose of nest ``n`` (``n`` and its only child loop around one copy), or None.
    ``in_memory``: the tensors held in their own buffers (not contracted or row-buffered)."""
    if len(n.body) != 1 or not isinstance(n.body[0], LFor):
        return None
    inner = n.body[0]
    if len(inner.body) != 1 or not isinstance(inner.body[0], LCall):
        return None
    call = inner.body[0]
    st = scop.stmt(call.stmt)
    s = scop.tc_statement(st.name)
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
    if n.omp and not full_blocks(n):
        return None  # `omp parallel for` needs the canonical loop: leftover rows only in serial loops
    args = dict(zip(st.indices, call.args))
    lhs = tuple(Sym.var(i, "index") for i in s.lhs)
    t_outer = _stride(lhs, strides[s.tensor], args, n.var)
    t_inner = _stride(lhs, strides[s.tensor], args, inner.var)
    s_outer = _stride(src.subs, strides[src.tensor], args, n.var)  # type: ignore[arg-type]
    s_inner = _stride(src.subs, strides[src.tensor], args, inner.var)  # type: ignore[arg-type]
    if t_inner != 1 or s_outer != 1 or not t_outer or not s_inner:
        return None
    return LTranspose(n, inner, call, src.tensor, s_inner, t_outer)


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
