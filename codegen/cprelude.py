"""C prelude: ``CpuTarget -> C text`` that every CPU kernel (codegen.c) starts with: the runtime
helpers (floor division, checked indices, error records, chunks of parallel loops, threads spread
over the cores), libmvec's SIMD declarations and float32 exp's vector variant."""

from __future__ import annotations

from tcdsl.polyhedral.cputarget import CpuTarget

PRELUDE = r"""#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define tc_lmin(a, b) ((a) < (b) ? (a) : (b))
#define tc_lmax(a, b) ((a) > (b) ? (a) : (b))
/* min/max of values: NaN-propagating, as numpy's minimum/maximum */
#define tc_min(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define tc_max(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define tc_abs(a) ((a) < 0 ? -(a) : (a))
/* buffers the kernel allocates (packed panels); a build may define its own (tests make it fail) */
#ifndef tc_aligned_alloc
#define tc_aligned_alloc aligned_alloc
#endif

/* floor division and modulo (Python's); d == -1 is separate because LONG_MIN / -1 traps on x86.
   No branch once d is a constant: a quotient inside a simd loop leaves the loop vectorisable. */
static inline long tc_fdiv(long n, long d) {
  if (d == -1) return (long)(0UL - (unsigned long)n);
  long q = n / d; return q - (long)((q * d != n) & ((n < 0) != (d < 0)));
}
static inline long tc_fmod(long n, long d) {
  if (d == -1) return 0;
  long r = n % d; return r + d * (long)((r != 0) & ((r < 0) != (d < 0)));
}
/* A failed check records its code and value (the first one wins) and reads element 0 instead. */
static inline void tc_fail(long *err, long code, long v) {
  long expected = 0;
  if (__atomic_compare_exchange_n(&err[0], &expected, code, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    __atomic_store_n(&err[1], v, __ATOMIC_RELAXED);
}
static inline long tc_chk(long v, long n, long code, long *err) {
  if ((unsigned long)v >= (unsigned long)n) { tc_fail(err, code, v); return 0; }
  return v;
}
static inline long tc_nz(long d, long code, long *err) {
  if (d == 0) { tc_fail(err, code, 0); return 1; }
  return d;
}
static inline unsigned long tc_unz(unsigned long d, long code, long *err) {
  if (d == 0) { tc_fail(err, code, 0); return 1; }
  return d;
}
/* Iterations per chunk of a parallel loop: about per_thread chunks per thread, handed out as
   threads become free, so a thread that loses its core to another process holds up less of the
   work */
#ifdef _OPENMP
#include <omp.h>
static inline long tc_chunk(long trips, long per_thread) {
  const long c = trips / (per_thread * omp_get_max_threads());
  return c > 1 ? c : 1;
}
#endif
/* Each parallel region starts with tc_spread(tc_core() of the thread that starts it). Linux may
   wake a thread of the team on the core of the thread that woke it, though another core idles;
   the two then spin for each other at the region's barriers, taking turns at the scheduler's tick
   (a 0.2 ms matmul took 4 or 8 ms in a third of the calls after a pause, on 2 cores). The starting
   thread yields its core once, and a thread that finds itself on that core moves off it (its
   affinity narrowed, then given back as it was). */
#if defined(_OPENMP) && defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
static inline int tc_core(void) {
  unsigned core = 0;
  return syscall(SYS_getcpu, &core, (void *)0, (void *)0) == 0 ? (int)core : -1;
}
static inline void tc_spread(int core) {
  if (core < 0 || core >= 1024 || omp_get_num_threads() < 2) return;
  if (omp_get_thread_num() == 0) { sched_yield(); return; }
  if (tc_core() != core) return;
  unsigned long all[16], other[16];  /* 1024 cores */
  const long n = syscall(SYS_sched_getaffinity, 0, sizeof all, all);
  if (n <= 0 || (size_t)n > sizeof all) return;
  unsigned long left = 0;
  for (long i = 0; i < n / (long)sizeof(long); i++) {
    other[i] = all[i] & ~(i == core / 64 ? 1UL << (core % 64) : 0UL);
    left |= other[i];
  }
  if (left && syscall(SYS_sched_setaffinity, 0, (size_t)n, other) == 0)
    syscall(SYS_sched_setaffinity, 0, (size_t)n, all);
}
#else
static inline int tc_core(void) { return -1; }
static inline void tc_spread(int core) { (void)core; }
#endif

"""

# A kernel with vector register tiles is compiled without GCC's predictive commoning: the tiles
# already load each input vector once per step, and GCC, carrying the rows a conv tile shares
# across its window's steps in registers, spilled a 6x2 tile's accumulators (AVX2 conv2d
# 8x64x56x56: 3 spills per step; 6x2 tiles 100-108 GFLOP/s with it, 160-190 without, 4x2 ~148).
NO_COMMONING = """#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-predictive-commoning")))  /* the register tiles load once per step */
#endif"""
# the `omp simd` loops' vector variant of float32 exp (the x86 vector-function ABI's ISA letter):
# GCC calls it for whole vectors of lanes; single values use libm's expf
_SIMD_ABI = {"avx512": "e", "avx2": "d", "sse2": "b"}


def simd_letter(target: CpuTarget) -> str | None:
    """The vector-function ABI's ISA letter of ``target`` (generic 16-byte vectors on x86-64 are SSE's)."""
    if target.isa == "generic" and target.arch == "x86_64" and target.vector_bytes == 16:
        return "b"
    return _SIMD_ABI.get(target.isa)


def vector_exp(target: CpuTarget) -> str:
    """``TC_EXPF``: float32 exp in `omp simd` loops, through a vector variant that runs the vector
    layer's ``tc_vf_exp`` (codegen.vecisa), or libm's expf where the target has none."""
    letter = simd_letter(target)
    lanes = target.lanes("float32")
    return f"""#if TC_VEC_ISA && defined(__GNUC__) && !defined(__clang__)
#pragma omp declare simd notinbranch simdlen({lanes})
float tc_expf(float);
__attribute__((visibility("hidden"))) float tc_expf_one(float x) __asm__("tc_expf");
__attribute__((visibility("hidden"))) float tc_expf_one(float x) {{ return expf(x); }}
__attribute__((visibility("hidden"))) tc_vf _ZGV{letter}N{lanes}v_tc_expf(tc_vf x) {{ return tc_vf_exp(x); }}
#define TC_EXPF tc_expf
#else
#define TC_EXPF expf
#endif
"""


def mvexp_decl(target: CpuTarget) -> str:
    """``tc_vf_mvexp``: libmvec's vector expf, which explicit vector loops call by name where it is
    the faster (codegen.vecexpr.libmvec_exp); the vector-function ABI names it by ISA and lanes."""
    name = f"_ZGV{simd_letter(target)}N{target.lanes('float32')}v_expf"
    return f"#if TC_VEC_ISA\ntc_vf {name}(tc_vf);  /* libmvec */\n#define tc_vf_mvexp {name}\n#endif\n"


# glibc's libmvec has SIMD versions of these (glibc >= 2.35): declaring them lets `omp simd` loops
# call the vector variants (`_ZGV..._expf`) instead of one scalar call per lane
VECTOR_MATH = ("exp", "log", "log1p", "expm1", "tanh", "erf", "sin", "cos", "tan", "exp2", "log2", "log10",
               "cbrt", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "atan2")


def vector_math_decls() -> str:
    lines = []
    for f in VECTOR_MATH:
        for suffix, ct in (("f", "float"), ("", "double")):
            params = ", ".join([ct] * (2 if f in ("pow", "atan2") else 1))
            lines.append(f"#pragma omp declare simd notinbranch\n{ct} {f}{suffix}({params});")
    return "\n".join(lines) + "\n"
