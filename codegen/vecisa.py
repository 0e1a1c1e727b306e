"""Vector ISA layer: ``CpuTarget -> str``, the C prelude that gives the explicit vector code of the
register tiles and pointwise loops (codegen.vectile, codegen.vecloop) one spelling on every target.

For each vector element type (``tc_vf``: float32, ``tc_vd``: float64) the prelude defines the
type and ``_load``, ``_store``, ``_set1``, ``_zero`` and ``_fma``; ``+ - * /`` are C operators on
the vector types (GCC and clang vector extensions). ``tc_vf_exp`` is float32 ``exp`` lane by lane
within 2 ulp (tested in tests/test_vecisa.py). AVX-512, AVX2+FMA, SSE2 and NEON use their
intrinsics; any other GCC or clang target uses generic vector extensions of the target's width.

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
    return "tc_vf" if dtype == "float32" else "tc_vd"


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
    exp = "" if target.isa in ("avx512", "avx2") else _EXP_SCALAR_LANES
    return head + body + exp + "#endif\n"


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
    if target.isa == "avx512":
        lines.append(_EXP_AVX512)
    elif target.isa == "avx2":
        lines.append(_EXP_AVX2)
    return "\n".join(lines) + "\n"


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


# float32 exp: 2^k * p(r), k = round(x / ln 2), r = x - k ln 2 in two parts, Cephes' polynomial
_EXP_AVX512 = r"""static inline __attribute__((always_inline)) tc_vf tc_vf_exp(tc_vf x) {
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  __m512 y = _mm512_scalef_ps(p, k);  /* subnormal results included */
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  /* NaN stays NaN */
}"""

# AVX2 has no scalef: 2^k is two normal powers of two, 2^(k >> 1) * 2^(k - (k >> 1)), so that
# results down to the subnormals (k = -150) round once, in the last multiply
_EXP_AVX2 = r"""static inline __attribute__((always_inline)) tc_vf tc_vf_exp(tc_vf x) {
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(89.0f));
  __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i ki = _mm256_cvtps_epi32(k);
  __m256i k1 = _mm256_srai_epi32(ki, 1);
  __m256i k2 = _mm256_sub_epi32(ki, k1);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  /* NaN stays NaN */
}"""

# elsewhere: libm's expf on each lane (vector subscripts are a GCC/clang extension)
_EXP_SCALAR_LANES = r"""static inline tc_vf tc_vf_exp(tc_vf x) {
  for (unsigned i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = expf(x[i]);
  return x;
}
"""
