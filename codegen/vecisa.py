"""Vector ISA layer: ``CpuTarget -> str``, the C prelude that gives the explicit vector code of the
register tiles and pointwise loops (codegen.vectile, codegen.vecloop) one spelling on every target.

For each vector element type (``tc_vf``: float32, ``tc_vd``: float64) the prelude defines the
type and ``_load``, ``_store``, ``_set1``, ``_zero``, ``_fma``, ``_max``, ``_min`` and ``_select``
(by a lane mask); ``+ - * /`` are C operators on the vector types (GCC and clang vector
extensions). ``tc_vi`` (int32, as many lanes as float32) has ``_load``, ``_store``, ``_set1``,
``_zero`` and ``_fma`` (a multiply and an add), wrapping as the scalar code does. AVX-512 and AVX2
also have half-width ``tc_hf``/``tc_hd`` (256 and 128 bits) for the short last vector of a tile's row. AVX-512,
AVX2+FMA, SSE2 and NEON use their intrinsics; any other GCC or clang target uses generic vector
extensions of the target's width. Rows of elements ``s`` apart have ``_gather(p, s)`` and
``_scatter(p, s, v)`` on every target. The last ``n`` elements of a row (``n`` below the lanes) have
``_load_n(n, p)``, which reads only them and leaves the lanes above zero (AVX-512's and AVX2's
masked loads, lane by lane elsewhere), and ``_first(n)``, the lane mask of the first ``n`` lanes.
``tc_vf_divc`` divides by a float32 constant through its two-part reciprocal (codegen.divide) where
``tc_vf_outside`` finds every lane in the window that form was checked for, and divides elsewhere.

``_max``/``_min`` give the bits of the scalar ``tc_max``/``tc_min`` (codegen.cprelude) lane by lane: the
running value ``a`` where ``a > b`` (``a < b``) or ``a`` is NaN, else the new value ``b`` (so a NaN
on either side gives NaN, and a tie or -0.0/+0.0 gives ``b``): x86's max/min and then ``a`` where
``a`` is unordered; NEON and generic vectors compare and select (NEON's vmaxq orders -0.0 below +0.0).

float32 transcendentals, with their bounds against the function in float64 (tests/test_vecisa.py,
on every target this machine runs; measured on 8 million random bit patterns and all of [0.5, 2)):
``tc_vf_exp`` within 2 ulp (one polynomial: AVX-512 and AVX2 intrinsics, vector extensions
elsewhere); ``tc_vf_tanh`` within 2 ulp (1.34 measured); ``tc_vf_log`` within 1 ulp (0.84
measured). glibc's scalar and vector tanhf and logf are within 4 ulp, so the pointwise loops use
these in their place. Subnormals, signed zeros, infinities and NaN give what libm gives.

The layer exists where the compiler's own macros agree with the target (``TC_VEC_ISA``:
``__AVX512F__`` for AVX-512, ...). The explicit tiles and loops sit under ``#if TC_VEC``, which
follows it unless given (``-DTC_VEC=0`` takes the scalar code beside them).
"""

from __future__ import annotations

from tcdsl.polyhedral.cputarget import CpuTarget

_GUARD = {
    "avx512": "defined(__AVX512F__)",
    "avx2": "defined(__AVX2__) && defined(__FMA__)",
    "sse2": "defined(__SSE2__)",
    "neon": "defined(__ARM_NEON) && defined(__aarch64__)",
    "generic": "1",
}

_X86 = {  # isa -> (register type suffix, intrinsic prefix, asm constraint)
    "avx512": ("512", "_mm512", "v"),
    "avx2": ("256", "_mm256", "x"),
    "sse2": ("", "_mm", "x"),
}


def vector_type(dtype: str) -> str:
    return {"float32": "tc_vf", "float64": "tc_vd", "int32": "tc_vi"}[dtype]


def half_type(dtype: str) -> str:
    """The half-width vector of ``dtype`` (float32/float64, where ``CpuTarget.half_vectors``)."""
    return {"float32": "tc_hf", "float64": "tc_hd"}[dtype]


def prelude(target: CpuTarget) -> str:
    """The vector layer for ``target`` (see the module's docstring)."""
    head = (f"/* explicit vectors for {target.isa}: {target.lanes('float32')} float32 / {target.lanes('float64')} "
            f"float64 lanes, {target.vector_registers} registers (tcdsl.polyhedral.cputarget) */\n"
            f"#if defined(__GNUC__) && ({_GUARD[target.isa]})\n#define TC_VEC_ISA 1\n#else\n#define TC_VEC_ISA 0\n"
            f"#endif\n#ifndef TC_VEC\n#define TC_VEC TC_VEC_ISA\n#endif\n#if TC_VEC_ISA\n")
    if target.isa in _X86:
        body = _x86(target)
    elif target.isa == "neon":
        body = _NEON
    else:
        body = _generic(target)
    exp = "" if target.isa in ("avx512", "avx2") else _CLAMP[target.isa] + _EXP_VECTOR_EXTENSIONS
    min_max = _GENERIC_MIN_MAX if target.isa == "generic" else ""
    return (head + body + _LANE_MASKS + _partial(target.isa) + _strided(target.isa) + _stream(target.isa) + min_max
            + exp + _TANH_LOG + _outside(target.isa) + _DIVC
            + "#endif\n#ifndef tc_stream_fence\n#define tc_stream_fence() ((void)0)\n#endif\n")


def _stream(isa: str) -> str:
    """``tc_v?_stream(p, v)``: a store that bypasses the caches (x86's non-temporal stores) where
    ``p`` is aligned to the vector, a plain store elsewhere; ``tc_stream_fence()`` orders a thread's
    streamed stores before what it does next (each thread runs it before the loop's barrier)."""
    if isa not in _X86:
        return ("#define tc_vf_stream(p, v) tc_vf_store(p, v)\n#define tc_vd_stream(p, v) tc_vd_store(p, v)\n"
                "#define tc_stream_fence() ((void)0)\n")
    pre = _X86[isa][1]
    out = [f"#define tc_v{t}_stream(p, v) do {{ if (((unsigned long)(p) & (sizeof(tc_v{t}) - 1)) == 0) "
           f"{pre}_stream_{sfx}(p, v); else {pre}_storeu_{sfx}(p, v); }} while (0)"
           for t, sfx in (("f", "ps"), ("d", "pd"))]
    return "\n".join(out) + "\n#define tc_stream_fence() _mm_sfence()\n"


def _partial(isa: str) -> str:
    """``tc_v?_first(n)``, the mask of lanes ``0..n-1``, ``tc_v?_load_n(n, p)``: ``p[0..n-1]`` in
    those lanes and zeros above, reading nothing past ``p[n-1]`` (0 <= n <= the lanes), and
    ``tc_v?_store_n(n, p, v)``, which writes only ``p[0..n-1]``. ``tc_v?_last(n)`` masks the top
    ``n`` lanes, and ``tc_v?_load_top(n, p)`` loads the whole vector at ``p`` with the lanes below
    them zeroed: a row's last ``n`` elements read as an overlapping vector, where masked loads are
    slow (AVX2's ``vmaskmovps`` on AMD: a conv weight gradient's 28-wide rows took twice as long)."""
    out = []
    for t, ctype, itype in (("f", "float", "int"), ("d", "double", "long long")):
        lanes = f"(int)(sizeof(tc_v{t}) / sizeof({ctype}))"
        out.append(f"static inline tc_v{t}i tc_v{t}_first(int n) "
                   f"{{ tc_v{t}i m; for (int l = 0; l < {lanes}; l++) m[l] = l < n ? ({itype})-1 : 0; return m; }}")
        out.append(f"static inline tc_v{t}i tc_v{t}_last(int n) "
                   f"{{ tc_v{t}i m; for (int l = 0; l < {lanes}; l++) m[l] = l >= {lanes} - n ? ({itype})-1 : 0; "
                   "return m; }")
        sfx = "ps" if t == "f" else "pd"
        if isa == "avx512":
            bits = 16 if t == "f" else 8
            out.append(f"#define tc_v{t}_load_n(n, p) _mm512_maskz_loadu_{sfx}((__mmask{bits})((1u << (n)) - 1u), p)")
            out.append(f"#define tc_v{t}_store_n(n, p, v) "
                       f"_mm512_mask_storeu_{sfx}(p, (__mmask{bits})((1u << (n)) - 1u), v)")
            out.append(f"#define tc_v{t}_load_top(n, p) "
                       f"_mm512_maskz_loadu_{sfx}((__mmask{bits})~((1u << ({bits} - (n))) - 1u), p)")
        elif isa == "avx2":
            out.append(f"#define tc_v{t}_load_n(n, p) _mm256_maskload_{sfx}(p, (__m256i)tc_v{t}_first(n))")
            out.append(f"#define tc_v{t}_store_n(n, p, v) _mm256_maskstore_{sfx}(p, (__m256i)tc_v{t}_first(n), v)")
            iota, width = ("_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)", "epi32") if t == "f" else \
                ("_mm256_setr_epi64x(0, 1, 2, 3)", "epi64x")
            top = 7 if t == "f" else 3
            out.append(f"#define tc_v{t}_load_top(n, p) _mm256_and_{sfx}(_mm256_loadu_{sfx}(p), _mm256_castsi256_{sfx}("
                       f"_mm256_cmpgt_{width.rstrip('x')}({iota}, _mm256_set1_{width}({top} - (n)))))")
        else:
            out.append(f"static inline tc_v{t} tc_v{t}_load_n(int n, const {ctype} *p) "
                       f"{{ tc_v{t} v = tc_v{t}_zero(); for (int l = 0; l < n; l++) v[l] = p[l]; return v; }}")
            out.append(f"static inline void tc_v{t}_store_n(int n, {ctype} *p, tc_v{t} v) "
                       f"{{ for (int l = 0; l < n; l++) p[l] = v[l]; }}")
            out.append(f"static inline tc_v{t} tc_v{t}_load_top(int n, const {ctype} *p) "
                       f"{{ return (tc_v{t})((tc_v{t}i)tc_v{t}_load(p) & tc_v{t}_last(n)); }}")
    return "\n".join(out) + "\n"


def _strided(isa: str) -> str:
    """``tc_v?_gather(p, s)``: the vector of ``p[0], p[s], p[2s], ...`` (AVX2's and AVX-512's gathers
    with 32-bit offsets, which vecplan.plan checks fit; lane by lane elsewhere), and
    ``tc_v?_scatter(p, s, v)``, its store, lane by lane (once per tile, after the reduction).
    ``tc_v?_scatter_rows(p, s, n, v)`` stores ``n`` (at most 8) such vectors side by side,
    ``p[l * s + j] = v[j][l]``: lane ``l``'s row of ``n`` neighbours at once, from an 8x8 transpose
    per 8 lanes on AVX2 and AVX-512 (float32: a 46x46 conv's 6x64 tiles ran 1-2 % faster than with
    the scatters' stores, one element at a time), lane by lane elsewhere."""
    out = []
    for t, ctype in (("f", "float"), ("d", "double")):
        lanes = f"(int)(sizeof(tc_v{t}) / sizeof({ctype}))"
        out.append(f"static inline void tc_v{t}_scatter({ctype} *p, long s, tc_v{t} v) "
                   f"{{ for (int l = 0; l < {lanes}; l++) p[l * s] = v[l]; }}")
        if isa in ("avx512", "avx2") and t == "f":
            out.append(_SCATTER_ROWS_X86 + (_SCATTER_ROWS_AVX512 if isa == "avx512" else _SCATTER_ROWS_AVX2))
        else:
            out.append(f"static inline __attribute__((always_inline)) void tc_v{t}_scatter_rows("
                       f"{ctype} *p, long s, int n, const tc_v{t} *v) "
                       f"{{ for (int l = 0; l < {lanes}; l++) for (int j = 0; j < n; j++) p[l * s + j] = v[j][l]; }}")
        if isa in ("avx512", "avx2"):
            out.append(_x86_gather(isa, t, ctype))
        else:
            out.append(f"static inline tc_v{t} tc_v{t}_gather(const {ctype} *p, long s) "
                       f"{{ tc_v{t} v; for (int l = 0; l < {lanes}; l++) v[l] = p[l * s]; return v; }}")
    return "\n".join(out) + "\n"


# the rows of 8 float32 vectors of 8 as its columns (unpack, shuffle, swap halves: 24 shuffles),
# and the first n of 8 floats stored (n a constant once inlined)
_SCATTER_ROWS_X86 = r"""static inline __attribute__((always_inline)) void tc_transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20); r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20); r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31); r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31); r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
"""
_SCATTER_ROWS_AVX512 = r"""static inline __attribute__((always_inline)) void tc_vf_scatter_rows(float *p, long s, int n,
                                                                   const tc_vf *v) {
  for (int h = 0; h < 2; h++) {
    __m256 r[8];
    for (int j = 0; j < 8; j++)
      r[j] = j >= n ? _mm256_setzero_ps() : h ? _mm512_extractf32x8_ps(v[j], 1) : _mm512_castps512_ps256(v[j]);
    tc_transpose8(r);
    for (int l = 0; l < 8; l++) _mm256_mask_storeu_ps(p + (h * 8 + l) * s, (__mmask8)((1u << n) - 1u), r[l]);
  }
}"""
# AVX2's masked store (vmaskmovps) is slow on AMD: the row goes out in pieces of 4, 2 and 1
_SCATTER_ROWS_AVX2 = r"""static inline __attribute__((always_inline)) void tc_store8_n(float *p, int n, __m256 v) {
  if (n == 8) { _mm256_storeu_ps(p, v); return; }
  __m128 x = _mm256_castps256_ps128(v);
  if (n >= 4) { _mm_storeu_ps(p, x); x = _mm256_extractf128_ps(v, 1); p += 4; n -= 4; }
  if (n >= 2) { _mm_storel_pi((__m64 *)p, x); x = _mm_movehl_ps(x, x); p += 2; n -= 2; }
  if (n) _mm_store_ss(p, x);
}
static inline __attribute__((always_inline)) void tc_vf_scatter_rows(float *p, long s, int n,
                                                                   const tc_vf *v) {
  __m256 r[8];
  for (int j = 0; j < 8; j++) r[j] = j < n ? v[j] : _mm256_setzero_ps();
  tc_transpose8(r);
  for (int l = 0; l < 8; l++) tc_store8_n(p + l * s, n, r[l]);
}"""


def _x86_gather(isa: str, t: str, ctype: str) -> str:
    lanes = {("avx512", "f"): 16, ("avx512", "d"): 8, ("avx2", "f"): 8, ("avx2", "d"): 4}[isa, t]
    index = {16: "_mm512", 8: "_mm256", 4: "_mm"}[lanes]  # the offsets' register: one 32-bit int per lane
    iota = ", ".join(str(k) for k in range(lanes))
    offsets = f"{index}_mullo_epi32({index}_set1_epi32((int)s), {index}_setr_epi32({iota}))"
    sfx = "ps" if t == "f" else "pd"
    call = (f"_mm512_i32gather_{sfx}({offsets}, p, sizeof({ctype}))" if isa == "avx512" else
            f"_mm256_i32gather_{sfx}(p, {offsets}, sizeof({ctype}))")
    return f"static inline tc_v{t} tc_v{t}_gather(const {ctype} *p, long s) {{ return {call}; }}"


def _x86(target: CpuTarget) -> str:
    bits, pre, constraint = _X86[target.isa]
    fma = target.fma
    lines = ["#include <immintrin.h>",
             f"typedef __m{bits or '128'} tc_vf;",
             f"typedef __m{bits or '128'}d tc_vd;",
             f'#define tc_keep(v) __asm__("" : "+{constraint}"(v))']
    for t, sfx in (("vf", "ps"), ("vd", "pd")):
        lines += [f"#define tc_{t}_load(p) {pre}_loadu_{sfx}(p)",
                  f"#define tc_{t}_store(p, v) {pre}_storeu_{sfx}(p, v)",
                  f"#define tc_{t}_set1(x) {pre}_set1_{sfx}(x)",
                  f"#define tc_{t}_zero() {pre}_setzero_{sfx}()",
                  f"#define tc_{t}_fma(a, b, c) {pre}_fmadd_{sfx}(a, b, c)" if fma else
                  f"#define tc_{t}_fma(a, b, c) ((a) * (b) + (c))"]
    lines += _x86_min_max(target.isa)
    if target.half_vectors:
        lines += _x86_half(target.isa)
    if target.isa == "avx512":
        lines.append(_EXP_AVX512)
    elif target.isa == "avx2":
        lines.append(_EXP_AVX2)
    return "\n".join(lines) + "\n"


def _x86_half(isa: str) -> list[str]:
    """The half vectors (``CpuTarget.half_vectors``): ``tc_hf``/``tc_hd``, 256 bits on AVX-512 and
    128 on AVX2, with ``_load``, ``_store``, ``_set1``, ``_zero``, ``_fma`` and ``_lo`` (the lower half
    of a full vector: a broadcast shared with the full vectors of a tile)."""
    bits, pre, full = ("256", "_mm256", "512") if isa == "avx512" else ("", "_mm", "256")
    lines = [f"typedef __m{bits or '128'} tc_hf;", f"typedef __m{bits or '128'}d tc_hd;"]
    for t, sfx in (("hf", "ps"), ("hd", "pd")):
        lines += [f"#define tc_{t}_load(p) {pre}_loadu_{sfx}(p)",
                  f"#define tc_{t}_store(p, v) {pre}_storeu_{sfx}(p, v)",
                  f"#define tc_{t}_set1(x) {pre}_set1_{sfx}(x)",
                  f"#define tc_{t}_zero() {pre}_setzero_{sfx}()",
                  f"#define tc_{t}_fma(a, b, c) {pre}_fmadd_{sfx}(a, b, c)",
                  f"#define tc_{t}_lo(v) _mm{full}_cast{sfx}{full}_{sfx}{bits or '128'}(v)"]
    return lines


def _x86_min_max(isa: str) -> list[str]:
    """``tc_v?_max(a, b)``: the ISA's max (``a > b ? a : b``: b where either is NaN or both are
    zeros), then ``a`` where ``a`` is NaN, as the scalar ``tc_max`` (codegen.cprelude); so ``min``."""
    _, pre, _ = _X86[isa]
    out = []
    for t, sfx in (("vf", "ps"), ("vd", "pd")):
        for op in ("max", "min"):
            m = f"{pre}_{op}_{sfx}(a, b)"
            if isa == "avx512":
                body = f"return {pre}_mask_mov_{sfx}({m}, {pre}_cmp_{sfx}_mask(a, a, _CMP_UNORD_Q), a);"
            elif isa == "avx2":
                body = f"return {pre}_blendv_{sfx}({m}, a, {pre}_cmp_{sfx}(a, a, _CMP_UNORD_Q));"
            else:  # SSE2 has no blend
                body = (f"tc_{t} nan = {pre}_cmpunord_{sfx}(a, a); "
                        f"return {pre}_or_{sfx}({pre}_and_{sfx}(nan, a), {pre}_andnot_{sfx}(nan, {m}));")
            out.append(f"static inline __attribute__((always_inline)) tc_{t} tc_{t}_{op}(tc_{t} a, tc_{t} b) "
                       f"{{ {body} }}")
    return out


_NEON = r"""#include <arm_neon.h>
typedef float32x4_t tc_vf;
typedef float64x2_t tc_vd;
#define tc_keep(v) __asm__("" : "+w"(v))
#define tc_vf_load(p) vld1q_f32(p)
#define tc_vf_store(p, v) vst1q_f32(p, v)
#define tc_vf_set1(x) vdupq_n_f32(x)
#define tc_vf_zero() vdupq_n_f32(0.0f)
#define tc_vf_fma(a, b, c) vfmaq_f32(c, a, b)
#define tc_vd_load(p) vld1q_f64(p)
#define tc_vd_store(p, v) vst1q_f64(p, v)
#define tc_vd_set1(x) vdupq_n_f64(x)
#define tc_vd_zero() vdupq_n_f64(0.0)
#define tc_vd_fma(a, b, c) vfmaq_f64(c, a, b)
/* vmaxq/vminq order -0.0 below +0.0: compare and select instead, as the scalar tc_max/tc_min */
#define TC_NEON_MAX_MIN(t, sfx, op, cmp) \
  static inline t tc_##op(t a, t b) { return vbslq_##sfx(vceqq_##sfx(a, a), vbslq_##sfx(cmp(a, b), a, b), a); }
TC_NEON_MAX_MIN(tc_vf, f32, vf_max, vcgtq_f32)
TC_NEON_MAX_MIN(tc_vf, f32, vf_min, vcltq_f32)
TC_NEON_MAX_MIN(tc_vd, f64, vd_max, vcgtq_f64)
TC_NEON_MAX_MIN(tc_vd, f64, vd_min, vcltq_f64)
"""


def _generic(target: CpuTarget) -> str:
    n = target.vector_bytes
    return f"""typedef float tc_vf __attribute__((vector_size({n})));
typedef double tc_vd __attribute__((vector_size({n})));
#define tc_keep(v) ((void)0)
static inline tc_vf tc_vf_load(const float *p) {{ tc_vf v; __builtin_memcpy(&v, p, sizeof v); return v; }}
static inline void tc_vf_store(float *p, tc_vf v) {{ __builtin_memcpy(p, &v, sizeof v); }}
static inline tc_vd tc_vd_load(const double *p) {{ tc_vd v; __builtin_memcpy(&v, p, sizeof v); return v; }}
static inline void tc_vd_store(double *p, tc_vd v) {{ __builtin_memcpy(p, &v, sizeof v); }}
#define tc_vf_set1(x) ((tc_vf){{0}} + (float)(x))
#define tc_vd_set1(x) ((tc_vd){{0}} + (double)(x))
#define tc_vf_zero() ((tc_vf){{0}})
#define tc_vd_zero() ((tc_vd){{0}})
#define tc_vf_fma(a, b, c) ((a) * (b) + (c))
#define tc_vd_fma(a, b, c) ((a) * (b) + (c))
"""


# float32 exp: 2^k * p(r), k = round(x / ln 2), r = x - k ln 2 in two parts, Cephes' polynomial;
# the steps up to p(r) in AVX-512's or AVX2's intrinsics (``@`` is _mm512 or _mm256)
_EXP_POLY = r"""static inline __attribute__((always_inline)) tc_vf tc_vf_exp(tc_vf x) {
  tc_vf xc = @_min_ps(@_max_ps(x, @_set1_ps(-104.0f)), @_set1_ps(89.0f));
  tc_vf k = @ROUND(@_mul_ps(xc, @_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  tc_vf r = @_fnmadd_ps(k, @_set1_ps(0.693359375f), xc);
  r = @_fnmadd_ps(k, @_set1_ps(-2.12194440e-4f), r);
  tc_vf p = @_set1_ps(1.9875691500e-4f);
  p = @_fmadd_ps(p, r, @_set1_ps(1.3981999507e-3f));
  p = @_fmadd_ps(p, r, @_set1_ps(8.3334519073e-3f));
  p = @_fmadd_ps(p, r, @_set1_ps(4.1665795894e-2f));
  p = @_fmadd_ps(p, r, @_set1_ps(1.6666665459e-1f));
  p = @_fmadd_ps(p, r, @_set1_ps(5.0000001201e-1f));
  p = @_add_ps(@_fmadd_ps(p, @_mul_ps(r, r), r), @_set1_ps(1.0f));
"""

_EXP_AVX512 = (_EXP_POLY.replace("@ROUND", "@_roundscale_ps").replace("@", "_mm512")
               + r"""  __m512 y = _mm512_scalef_ps(p, k);  /* subnormal results included */
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  /* NaN stays NaN */
}""")

# AVX2 has no scalef: 2^k is two normal powers of two, 2^(k >> 1) * 2^(k - (k >> 1)), so that
# results down to the subnormals (k = -150) round once, in the last multiply
_EXP_AVX2 = (_EXP_POLY.replace("@ROUND", "@_round_ps").replace("@", "_mm256")
             + r"""  __m256i ki = _mm256_cvtps_epi32(k);
  __m256i k1 = _mm256_srai_epi32(ki, 1);
  __m256i k2 = _mm256_sub_epi32(ki, k1);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  /* NaN stays NaN */
}""")

# elsewhere (SSE2, NEON, generic vectors) the same steps in vector extensions: k rounded by adding
# and subtracting 1.5 * 2^23, 2^k from the exponent bits in two halves as on AVX2
_CLAMP = {
    "sse2": "#define tc_vf_clamp(x, lo, hi) _mm_min_ps(_mm_max_ps(x, lo), hi)\n",
    "neon": "#define tc_vf_clamp(x, lo, hi) vminq_f32(vmaxq_f32(x, lo), hi)\n",
    "generic": "#define tc_vf_clamp(x, lo, hi) tc_vf_min(tc_vf_max(x, lo), hi)\n",
}
_EXP_VECTOR_EXTENSIONS = r"""static inline tc_vf tc_vf_exp(tc_vf x) {
  const tc_vf xc = tc_vf_clamp(x, tc_vf_set1(-104.0f), tc_vf_set1(89.0f));  /* NaN: any value */
  const tc_vf k = (xc * tc_vf_set1(1.44269504088896341f) + tc_vf_set1(12582912.0f)) - tc_vf_set1(12582912.0f);
  tc_vf r = tc_vf_fma(k, tc_vf_set1(-0.693359375f), xc);
  r = tc_vf_fma(k, tc_vf_set1(2.12194440e-4f), r);
  tc_vf p = tc_vf_fma(tc_vf_set1(1.9875691500e-4f), r, tc_vf_set1(1.3981999507e-3f));
  p = tc_vf_fma(p, r, tc_vf_set1(8.3334519073e-3f));
  p = tc_vf_fma(p, r, tc_vf_set1(4.1665795894e-2f));
  p = tc_vf_fma(p, r, tc_vf_set1(1.6666665459e-1f));
  p = tc_vf_fma(p, r, tc_vf_set1(5.0000001201e-1f));
  p = tc_vf_fma(p, r * r, r) + tc_vf_set1(1.0f);
  const tc_vfi ki = __builtin_convertvector(k, tc_vfi);
  const tc_vfi k1 = ki >> 1;
  const tc_vf y = p * (tc_vf)((k1 + 127) << 23) * (tc_vf)((ki - k1 + 127) << 23);
  return tc_vf_select((tc_vfi)(x != x), x, y);  /* NaN stays NaN */
}
"""

# every target: integer vectors of the lanes' width, and a select by a lane mask (all ones or
# zeros, as a vector comparison gives it; GCC and clang vector extensions)
_LANE_MASKS = r"""typedef int tc_vfi __attribute__((vector_size(sizeof(tc_vf))));
typedef long long tc_vdi __attribute__((vector_size(sizeof(tc_vd))));
static inline tc_vf tc_vf_select(tc_vfi m, tc_vf a, tc_vf b) { return (tc_vf)(((tc_vfi)a & m) | ((tc_vfi)b & ~m)); }
static inline tc_vd tc_vd_select(tc_vdi m, tc_vd a, tc_vd b) { return (tc_vd)(((tc_vdi)a & m) | ((tc_vdi)b & ~m)); }
typedef tc_vfi tc_vi;  /* int32 lanes: + - * wrap, as the scalar code's (-fwrapv) */
static inline tc_vi tc_vi_load(const void *p) { tc_vi v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void tc_vi_store(void *p, tc_vi v) { __builtin_memcpy(p, &v, sizeof v); }
#define tc_vi_set1(x) ((tc_vi){0} + (int)(x))
#define tc_vi_zero() ((tc_vi){0})
#define tc_vi_fma(a, b, c) ((a) * (b) + (c))
"""

# a division by a float32 constant as its reciprocal in two parts, where codegen.divide verified it
_DIVC = r"""/* x / c, c fixed at compile time, with the division's bits (codegen.divide): x * hi + x * lo in a
   multiply and an fma; a vector with a lane whose |x| lies outside [from, to) (zero, subnormal,
   huge, inf, NaN) divides */
static inline __attribute__((always_inline)) tc_vf tc_vf_divc(tc_vf x, float c, float hi, float lo,
                                                              float from, float to) {
  if (__builtin_expect(tc_vf_outside(x, from, to), 0)) return x / tc_vf_set1(c);
  return tc_vf_fma(x, tc_vf_set1(hi), x * tc_vf_set1(lo));
}
"""


def _outside(isa: str) -> str:
    """``tc_vf_outside(x, from, to)``: whether a lane's ``|x|`` is not in ``[from, to)`` (NaN is
    not): x86 compares unordered-true into a mask register or a sign mask, the others test vector
    extensions' lane masks."""
    if isa == "avx512":
        return ("#define tc_vf_outside(x, from, to) ((_mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(from), "
                "_CMP_NGE_UQ) | _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(to), _CMP_NLT_UQ)) != 0)\n")
    if isa == "avx2":
        return ("static inline __attribute__((always_inline)) int tc_vf_outside(__m256 x, float from, float to) {\n"
                "  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);\n"
                "  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(ax, _mm256_set1_ps(from), _CMP_NGE_UQ),\n"
                "                      _mm256_cmp_ps(ax, _mm256_set1_ps(to), _CMP_NLT_UQ))) != 0;\n}\n")
    if isa == "sse2":
        return ("static inline __attribute__((always_inline)) int tc_vf_outside(__m128 x, float from, float to) {\n"
                "  const __m128 ax = _mm_andnot_ps(_mm_set1_ps(-0.0f), x);\n"
                "  return _mm_movemask_ps(_mm_or_ps(_mm_cmpnge_ps(ax, _mm_set1_ps(from)), "
                "_mm_cmpnlt_ps(ax, _mm_set1_ps(to)))) != 0;\n}\n")
    any_lane = ("return vmaxvq_u32((uint32x4_t)m) != 0;" if isa == "neon" else
                "int any = 0; for (unsigned k = 0; k < sizeof m / sizeof m[0]; k++) any |= m[k]; return any != 0;")
    return (f"static inline int tc_vf_any(tc_vfi m) {{ {any_lane} }}\n"
            "static inline int tc_vf_outside(tc_vf x, float from, float to) {\n"
            "  const tc_vf ax = (tc_vf)((tc_vfi)x & 0x7fffffff);\n"
            "  return tc_vf_any(~((tc_vfi)(ax >= tc_vf_set1(from)) & (tc_vfi)(ax < tc_vf_set1(to))));\n}\n")


# max and min as the scalar tc_max/tc_min (codegen.cprelude), lane by lane: a where a > b (a < b) or a is NaN, else b
_GENERIC_MIN_MAX = "".join(
    f"static inline tc_v{t} tc_v{t}_{op}(tc_v{t} a, tc_v{t} b) "
    f"{{ return tc_v{t}_select((tc_v{t}i)(a {cmp} b) | (tc_v{t}i)(a != a), a, b); }}\n"
    for t in "fd" for op, cmp in (("max", ">"), ("min", "<")))

# float32 tanh and log lane by lane (vector extensions over the layer's fma and exp; Cephes'
# polynomials). tanh: on |x| < 0.625, x + x^3 p(x^2); above, 1 - 2 / (exp(2|x|) + 1), which is 1
# where exp overflows; the sign of x put back (so -0.0 and NaN stay). log: subnormals scaled by
# 2^23; x = 2^k m with m in [sqrt(1/2), sqrt(2)), log(x) = k ln 2 + log1p(m - 1), ln 2 in two
# parts; 0 -> -inf, negatives -> NaN, inf and NaN themselves.
_TANH_LOG = r"""static inline tc_vf tc_vf_tanh(tc_vf x) {
  const tc_vfi sign = (tc_vfi)x & (-2147483647 - 1);
  const tc_vf a = (tc_vf)((tc_vfi)x & 2147483647);
  const tc_vf z = a * a;
  tc_vf p = tc_vf_fma(tc_vf_set1(-5.70498872745e-3f), z, tc_vf_set1(2.06390887954e-2f));
  p = tc_vf_fma(p, z, tc_vf_set1(-5.37397155531e-2f));
  p = tc_vf_fma(p, z, tc_vf_set1(1.33314422036e-1f));
  p = tc_vf_fma(p, z, tc_vf_set1(-3.33332819422e-1f));
  const tc_vf small = tc_vf_fma(p * z, a, a);
  const tc_vf big = tc_vf_set1(1.0f) - tc_vf_set1(2.0f) / (tc_vf_exp(a + a) + tc_vf_set1(1.0f));
  return (tc_vf)((tc_vfi)tc_vf_select((tc_vfi)(a < tc_vf_set1(0.625f)), small, big) | sign);
}
static inline tc_vf tc_vf_log(tc_vf x) {
  const tc_vfi tiny = (tc_vfi)(x < tc_vf_set1(1.17549435e-38f));
  const tc_vfi ix = (tc_vfi)tc_vf_select(tiny, x * tc_vf_set1(8388608.0f), x) - (tiny & (23 << 23));
  const tc_vfi t = ix - 0x3f3504f3;
  const tc_vfi k = t >> 23;
  const tc_vf f = (tc_vf)(ix - (k << 23)) - tc_vf_set1(1.0f);
  const tc_vf e = __builtin_convertvector(k, tc_vf);
  const tc_vf z = f * f;
  tc_vf p = tc_vf_fma(tc_vf_set1(7.0376836292e-2f), f, tc_vf_set1(-1.1514610310e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(1.1676998740e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(-1.2420140846e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(1.4249322787e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(-1.6668057665e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(2.0000714765e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(-2.4999993993e-1f));
  p = tc_vf_fma(p, f, tc_vf_set1(3.3333331174e-1f));
  tc_vf y = tc_vf_fma(e, tc_vf_set1(-2.12194440e-4f), p * (f * z));
  y = tc_vf_fma(z, tc_vf_set1(-0.5f), y);
  const tc_vf r = tc_vf_fma(e, tc_vf_set1(0.693359375f), f + y);
  const tc_vf special = tc_vf_select((tc_vfi)(x == tc_vf_zero()), tc_vf_set1(-INFINITY),
                                     tc_vf_select((tc_vfi)(x < tc_vf_zero()), tc_vf_set1(NAN), x));
  return tc_vf_select((tc_vfi)(x > tc_vf_zero()) & (tc_vfi)(x < tc_vf_set1(INFINITY)), r, special);
}
"""
