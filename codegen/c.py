"""C emitter: ``LoopIR x Scop -> CSource`` (one C function, OpenMP-parallel, restrict pointers).

Every identifier is generated (tensors ``t0..``, iterators ``c0..``, statement indices ``x0..``),
so no TC name reaches the C text except inside ``//`` comments naming each statement. Tensor
accesses are linearised with the call's element strides; gathers, conditional reads and integer
division are checked and report an error code instead of touching memory out of bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from tcdsl.core import dtypes as T
from tcdsl.core.affine import FloorDiv, MinMax, Mod, Sym, Var, bounds
from tcdsl.core.builtins import BUILTINS
from tcdsl.core.checked import (
    Binop,
    Call,
    Const,
    Convert,
    IndexVal,
    Read,
    Select,
    SizeVal,
    Statement,
    TExpr,
    Unop,
    operands,
    read_tuple,
    reads,
)
from tcdsl.core.instance import fully_written
from tcdsl.core.printer import stmt as print_stmt
from tcdsl.polyhedral.cputarget import CpuTarget
from tcdsl.polyhedral.loopir import (
    LAccum,
    LCall,
    LDecl,
    LExpr,
    LFor,
    LIf,
    LInt,
    LNode,
    LoopIR,
    LOp,
    LPack,
    LReset,
    LTile,
    LTranspose,
    LVar,
    expr_vars,
    trip_bound,
    trip_count,
    walk,
    walk_paths,
)
from tcdsl.polyhedral.scatter import ATOMIC_DTYPES
from tcdsl.polyhedral.scop import Scop

from . import divide, mathlib, memshare, transpose, vecisa, vecloop, vectile
from .facts import Facts
from .writer import LineWriter
from .writer import unparen as _top

CTYPE = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "_Float16", "float32": "float", "float64": "double",
}

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

# A copy into packed panels this large, made once before the parallel loops that read it, is made
# by every thread: matmul's B (4 MB at 960x1000x1088 on AVX2); a padded conv's weight gradient
# 8x64x56x56 packed its input (6 MB) for each of its eight boundary pieces (2 threads: 94 -> 86 ms).
# A small one (a conv's weights) stays serial.
PARALLEL_PACK_BYTES = 1 << 18
PANEL_ROWS = 64  # steps of a transposed pack's panels copied as one block (LPack.source)

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


def _simd_letter(target: CpuTarget) -> str | None:
    """The vector-function ABI's ISA letter of ``target`` (generic 16-byte vectors on x86-64 are SSE's)."""
    if target.isa == "generic" and target.arch == "x86_64" and target.vector_bytes == 16:
        return "b"
    return _SIMD_ABI.get(target.isa)


def _streams(nodes: tuple[LNode, ...]) -> bool:
    """Whether a vector loop among ``nodes`` streams its stores (vecloop.streamed)."""
    return any(isinstance(x, LFor) and x.vector is not None and bool(x.vector.stream) for x in walk(nodes))


def vector_exp(target: CpuTarget) -> str:
    """``TC_EXPF``: float32 exp in `omp simd` loops, through a vector variant that runs the vector
    layer's ``tc_vf_exp`` (codegen.vecisa), or libm's expf where the target has none."""
    letter = _simd_letter(target)
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


@dataclass(frozen=True)
class ErrorSite:
    code: int
    kind: str  # "gather", "read", "division", "modulo", "memory" or "partials" (a buffer the kernel allocates)
    stmt: int  # TC statement number
    tensor: str
    dim: int
    span: object = field(compare=False, repr=False)


@dataclass(frozen=True)
class CSource:
    name: str  # the C function's name
    text: str
    params: tuple[str, ...]  # TC tensor names, in argument order
    errors: tuple[ErrorSite, ...]
    contracted: tuple[str, ...] = ()  # temporaries that live in scalars (no memory needed)
    shared: tuple[tuple[str, str], ...] = ()  # (temporary, owner whose buffer it reuses)
    buffers: tuple[tuple[str, int], ...] = ()  # owner temporaries and their sizes in elements

    def __str__(self) -> str:
        return self.text


def emit(ir: LoopIR, scop: Scop, strides: dict[str, tuple[int, ...]], target: CpuTarget, fn: str = "tc_kernel",
         vectorize: bool = True, vector_math: bool = False) -> CSource:
    """C source for ``ir`` after the lowering passes (codegen.lower) on ``target``; ``strides``
    gives each tensor's element strides; ``vector_math`` declares libmvec's SIMD math functions
    (see ``toolchain.has_vector_math``)."""
    return _Emitter(scop, strides, fn, vectorize, vector_math, 0, target).run(ir)


class _Emitter(Facts):
    ITYPE = "long"  # loop iterators and statement indices
    LONG = "L"  # suffix of stride literals (64-bit address arithmetic)
    TARGET = "c"  # whose builtin spellings (tcdsl.core.builtins) this emitter prints
    ATOMIC_SCATTERS = False  # a scatter's additions race with other threads' (the GPU mappings)

    def __init__(self, scop: Scop, strides: dict[str, tuple[int, ...]], fn: str, vectorize: bool,
                 vector_math: bool, unroll: int = 0, target: CpuTarget | None = None) -> None:
        super().__init__(scop, strides, target, vectorize, vector_math, unroll)
        self.fn = fn
        self.var = {name: f"t{i}" for i, name in enumerate(self.order)}
        self.sizes = {k: Sym.of(v) for k, v in scop.inst.sizes.items()}
        self.errors: list[ErrorSite] = []
        self.scalars: dict[str, str] = {}  # contracted temporaries in scope -> their C scalar
        self.vector_code = False  # explicit vector code written (vectile, vecloop)
        self.vector_tiles = False  # register tiles among it (vectile)
        self.mathlib: set[tuple[str, str]] = set()  # (tcdsl.codegen.mathlib function, type) the kernel calls
        self.partials: dict[int, dict[str, str]] = {}  # id(privatised row loop) -> target -> its partial rows
        # while a statement prints: its indices that are d*q + r (codegen.lower.run_over_quotients) -> (d, q, r)
        self.quotients: dict[str, tuple[int, str, int]] = {}
        self.folded: dict[str, str] = {}  # temporaries a pack copies from their source -> the source (run)
        self.w = LineWriter()

    def run(self, ir: LoopIR) -> CSource:
        w = self.w
        decls = [n for n in walk(ir.body) if isinstance(n, LDecl)]
        self.contracted = {d.tensor for d in decls if d.kind == "scalar"}
        self.rows = {d.tensor: d.fixed for d in decls if d.kind == "row"}
        w.raw(PRELUDE)
        vector_prelude = w.mark()  # codegen.vecisa's layer goes here if any vector code is written
        if self.vector_math:
            w.raw(vector_math_decls())
        uses_exp = any(re.search(r"\b(exp|sigmoid)\s*\(", print_stmt(st.source)) for st in self.c.stmts)
        self.vector_code = self.vectorize and uses_exp and _simd_letter(self.target) is not None and \
            not vectile.libmvec_exp(self)
        w.raw(vector_exp(self.target) if self.vector_code else "#define TC_EXPF expf\n")
        if any(isinstance(n, LTranspose) or (isinstance(n, LPack) and n.source) for n in walk(ir.body)):
            w.raw(transpose.HELPER)
        library = w.mark()  # the tcdsl.codegen.mathlib functions the kernel calls go here
        for name in self.order:
            t = self.tensors[name]
            w.line(f"// {self.var[name]}: {t.role} {t.decl()}, shape {self.shapes[name]}, "
                   f"strides {self.strides[name]}")
        params = []
        for name in self.order:
            t = self.tensors[name]
            const = "const " if t.role == "input" else ""
            params.append(f"{const}{CTYPE[t.dtype]} *restrict {self.var[name]}")
        params.append("long *restrict tc_err")
        signature = w.mark()
        w.line(f"int {self.fn}({', '.join(params)}) {{")
        temps = {t.name for t in self.c.temps}
        owners = {name: name for name in self.in_memory & temps} | dict(ir.owners)
        for name, owner in owners.items():
            self.var[name] = self.var[owner]
        with w.indent():
            packs = [n for n in walk(ir.body) if isinstance(n, LPack)]
            # a temporary whose transpose a pack took over (LPack.source) is never written: any other
            # read of it (the scalar tile beside the vector one, for compilers without the ISA) reads
            # its source, transposed
            self.folded = {p.tensor: p.source for p in packs if p.source}
            self._pack_buffers(packs)
            partials = self._partial_buffers([n for n in walk(ir.body) if isinstance(n, LFor) and n.private],
                                             [p.buffer for p in packs])
            self._body(ir.body)
            if _streams(ir.body):
                w.line("tc_stream_fence();  // the streamed stores of a loop outside a parallel region")
            for buf in [p.buffer for p in packs] + partials:
                w.line(f"free({buf});")
            w.line("return (int)tc_err[0];")
        w.line("}")
        if self.vector_tiles:
            w.insert(signature, NO_COMMONING)
        if self.mathlib:
            w.insert(library, mathlib.source(self.mathlib))
        if self.vector_code:
            w.insert(vector_prelude, vecisa.prelude(self.target))
        sizes: dict[str, int] = {}
        for name, owner in owners.items():
            sizes[owner] = max(sizes.get(owner, 0), memshare.elements(self.shapes[name]))
        return CSource(self.fn, w.text(), self.order, tuple(self.errors),
                       tuple(sorted({*self.contracted, *self.rows})),
                       tuple(sorted((n, o) for n, o in owners.items() if n != o)), tuple(sorted(sizes.items())))

    def _body(self, body: tuple[LNode, ...]) -> None:
        for n in body:
            self._node(n)

    def _decl(self, d: LDecl) -> None:
        name = d.tensor
        if d.kind == "row":
            size = memshare.elements(tuple(n for k, n in enumerate(self.shapes[name]) if k not in d.fixed))
            var = f"r{self.order.index(name)}"
            self.w.line(f"{CTYPE[self.tensors[name].dtype]} {var}[{size}];  // temporary {name}: the slice "
                        f"this iteration uses")
            if not fully_written(self.scop.inst, name):
                self.w.line(f"memset({var}, 0, sizeof {var});")
        else:
            self.scalars[name] = f"s{self.order.index(name)}"
            self.w.line(f"{CTYPE[self.tensors[name].dtype]} {self.scalars[name]};  // temporary {name}, "
                        f"contracted to a scalar")

    def _pack_buffers(self, packs: list[LPack]) -> None:
        """One heap buffer per pack and thread, allocated before anything is written: where it
        cannot be had, the kernel stops with a located error and its outputs untouched."""
        if not packs:
            return
        w = self.w
        if not all(p.shared for p in packs):
            w.line("#ifdef _OPENMP")
            w.line("const long tc_threads = omp_get_max_threads();")
            w.line("#else")
            w.line("const long tc_threads = 1;")
            w.line("#endif")
        codes = []
        for p in packs:
            size = self._pack_elements(p) * self._itemsize(p.tensor)
            st = self.scop.tc_statement(p.stmt)
            codes.append((p, size, self._site("memory", st, p.tensor, 0, st.span)))
            ctype = CTYPE[self.tensors[p.tensor].dtype]
            w.line(f"{ctype} *{p.buffer} = ({ctype} *)tc_aligned_alloc(64, {self._pack_bytes(p, size)});  "
                   f"// packed panels of {p.tensor}, {size} bytes" + ("" if p.shared else " per thread"))
        w.line(f"if ({' || '.join(f'!{p.buffer}' for p in packs)}) {{")
        with w.indent():
            for p, size, code in codes:
                w.line(f"if (!{p.buffer}) tc_fail(tc_err, {code}, {self._pack_bytes(p, size)});")
                w.line(f"free({p.buffer});")
            w.line("return (int)tc_err[0];")
        w.line("}")

    def _partial_buffers(self, loops: list[LFor], held: list[str]) -> list[str]:
        """The partial rows of each privatised row loop (codegen.privatise), in heap buffers
        allocated with the packs, before anything is written: where they cannot be had, the kernel
        stops with a located error (after freeing ``held``). Returns the buffers' names."""
        w = self.w
        out: list[str] = []
        codes: list[tuple[str, int, int]] = []
        for n in loops:
            names = {}
            for t in n.private:
                buf = names[t] = f"tc_pv{len(out)}"
                out.append(buf)
                call = next(c for c in walk(n.body)
                            if isinstance(c, LCall) and self.scop.tc_statement(c.stmt).tensor == t)
                st = self.scop.tc_statement(call.stmt)
                size = n.blocks * memshare.elements(self.shapes[t]) * self._itemsize(t)
                codes.append((buf, size, self._site("partials", st, t, 0, st.span)))
                ctype = CTYPE[self.tensors[t].dtype]
                w.line(f"{ctype} *{buf} = ({ctype} *)tc_aligned_alloc(64, {size}L);  "
                       f"// {t} summed in {n.blocks} partial rows")
            self.partials[id(n)] = names
        if out:
            w.line(f"if ({' || '.join(f'!{b}' for b in out)}) {{")
            with w.indent():
                for buf, size, code in codes:
                    w.line(f"if (!{buf}) tc_fail(tc_err, {code}, {size}L);")
                for buf in held + out:
                    w.line(f"free({buf});")
                w.line("return (int)tc_err[0];")
            w.line("}")
        return out

    @staticmethod
    def _pack_bytes(p: LPack, size: int) -> str:
        """The C expression of a pack buffer's bytes: one copy, or one per thread."""
        return f"{size}L" if p.shared else f"tc_threads * {size}L"

    def _itemsize(self, tensor: str) -> int:
        return int(np.dtype(self.tensors[tensor].dtype).itemsize)

    def _pack_elements(self, p: LPack) -> int:
        """Elements of one thread's buffer: the panels, rounded up to whole 64-byte lines (each
        thread's buffer stays aligned, and aligned_alloc gets a multiple of its alignment)."""
        per_line = 64 // self._itemsize(p.tensor)
        blocks = math.prod(c[3] for c in p.chunks)
        return -(-blocks * p.panels * p.depth * p.width // per_line) * per_line

    def _pack(self, p: LPack) -> None:
        """The panels of ``p`` copied into this thread's part of its buffer (``_pack_buffers``),
        then its body, whose vector tile reads them (codegen.vectile.vexpr) instead of the tensor."""
        w = self.w
        tile, above = next((x, up) for x, up in walk_paths(p.body) if isinstance(x, LTile) and x.call.stmt == p.stmt
                           and tuple(g.var for g in x.serial) == p.serial and p.call in (None, x.call))
        # the loop around the tile that moves along the panels (another piece may name a loop alike)
        panel = [x for x in reversed(above) if isinstance(x, LFor) and x.var == p.panel][:1]
        st = self.scop.stmt(p.stmt)
        s = self.scop.tc_statement(st.name)
        r = reads(s.rhs)[p.read]
        args = dict(zip(st.indices, tile.call.args))
        vec = tile.inner[-1]
        ctype = CTYPE[self.tensors[r.tensor].dtype]
        steps = [f"({g.var} - {_top(self._lexpr(g.init))}) / {g.step}" for g in panel]
        # each serial loop's first value and trip count: its own, or the box covering its varying bounds
        ranges = list(p.box) if p.box else [(_top(self._lexpr(g.init)), trip_bound(g)) for g in tile.serial]
        stride, terms = 1, []
        for g, (first, count) in reversed(list(zip(tile.serial, ranges))):
            terms.append(f"({g.var} - {first})" + (f" * {stride}" if stride != 1 else ""))
            assert count is not None
            stride *= count
        depth = " + ".join(reversed(terms))
        block = ""  # the chunks' index, then the panel's (a pack of the whole operand)
        for var, first, step, trips in p.chunks:
            index = f"({var} - {first}) / {step}"
            block = f"({block} * {trips} + {index})" if block else index
        if block:
            steps = [f"({block} * {p.panels} + {steps[0]})" if steps else f"{block} * {p.panels}"]
        base = f"({steps[0]} * {p.depth} + {depth}) * {p.width}" if steps else f"({depth}) * {p.width}"
        w.line(f"{{  // statement {s.number}'s register tiles read {r.tensor} from {p.panels} packed panels of "
               f"{p.depth} x {p.width}")
        w.push()
        buf = f"{p.buffer}_at"  # this copy's panels (several packs may enclose one nest)
        if p.shared:  # before the parallel loops: one copy that every thread reads
            w.line(f"{ctype} *restrict {buf} = {p.buffer};")
        else:
            w.line("#ifdef _OPENMP")
            w.line(f"{ctype} *restrict {buf} = {p.buffer} + omp_get_thread_num() * {self._pack_elements(p)}L;")
            w.line("#else")
            w.line(f"{ctype} *restrict {buf} = {p.buffer};")
            w.line("#endif")
        if p.source:  # the panels straight from the tensor a transpose would have copied (codegen.pack)
            self._transposed_panels(p, buf)
            self._packed_body(p, tile.call, id(r), f"{buf}[{base} + ")
            return
        if p.parallel:  # the whole operand: the threads copy its blocks
            collapse = f" collapse({len(p.chunks)})" if len(p.chunks) > 1 else ""
            self._region_open(f"schedule(static){collapse}")
        copy = False  # a large copy before the parallel loops, parallel along the first row loop
        for var, first, step, trips in p.chunks:
            w.line(f"for (long {var} = {first}; {var} < {first + step * trips}; {var} += {step}) {{")
            w.push()
        for k, (g, (first, count)) in enumerate(zip(tile.serial, ranges)):  # along the rows: whole rows stream in
            cond = f"{g.var} < {first} + {count}" if p.box else _top(self._lexpr(g.cond))
            if k == 0 and p.shared and not p.parallel and \
                    self._pack_elements(p) * self._itemsize(r.tensor) >= PARALLEL_PACK_BYTES:
                copy = True
                self._region_open("schedule(static)")
            w.line(f"for (long {g.var} = {first}; {cond}; {g.var} += {g.step}) {{")
            w.push()
        for g in panel:
            w.line(f"for (long {g.var} = {_top(self._lexpr(g.init))}; {_top(self._lexpr(g.cond))}; "
                   f"{g.var} += {g.step}) {{")
            w.push()
        env = {i: f"({_top(self._lexpr(a))})" for i, a in args.items()}
        subs = tuple(x for x in r.subs if isinstance(x, Sym))
        w.line(f"const long pk = {base};")
        w.line("#pragma omp simd")
        w.line(f"for (long {vec.var} = {_top(self._lexpr(vec.init))}; {_top(self._lexpr(vec.cond))}; "
               f"{vec.var} += 1) {{")
        w.line(f"  {buf}[pk + ({vec.var} - {_top(self._lexpr(vec.init))})] = "
               f"{self._access(r.tensor, subs, env)};")
        w.line("}")
        for _ in (*panel, *tile.serial):
            w.pop()
            w.line("}")
        if copy:  # the first row loop closed
            self._region_close()
        for _ in p.chunks:
            w.pop()
            w.line("}")
        if p.parallel:
            self._region_close()
        self._packed_body(p, tile.call, id(r), f"{buf}[{base} + ")

    def _packed_body(self, p: LPack, call: LCall, read: int, element: str) -> None:
        """``p``'s body, its tile's read ``read`` taken from the panels (``element`` + the lane), and
        the block ``_pack`` opened closed."""
        self.pack_of[call] = (read, element)
        self._body(p.body)
        del self.pack_of[call]
        self.w.pop()
        self.w.line("}")

    def _transposed_panels(self, p: LPack, buf: str) -> None:
        """``p``'s panels copied from ``p.source`` (``LPack.source``): panel ``q`` is the transpose of
        ``p.width`` rows of the source, from row ``q * p.width``, its ``p.depth`` steps in blocks of
        PANEL_ROWS shared among the threads (codegen.transpose's ``tc_transpose_rect``)."""
        w = self.w
        src, ld, n, panels = self.var[p.source], p.source_stride, PANEL_ROWS, p.all_panels
        w.line(f"// each panel the transpose of {p.width} rows of {p.source}, {ld} elements apart")
        if p.parallel or panels * p.depth * p.width * self._itemsize(p.source) >= PARALLEL_PACK_BYTES:
            self._region_open("schedule(static)")
            close = True
        else:
            w.line("{")
            w.push()
            close = False
        w.line(f"for (long tc_s = 0; tc_s < {p.depth}; tc_s += {n}) {{")
        w.line(f"  for (long tc_q = 0; tc_q < {panels}; tc_q++)")
        w.line(f"    tc_transpose_rect(&{src}[tc_q * {p.width * ld}L + tc_s], {ld}L, "
               f"&{buf}[(tc_q * {p.depth}L + tc_s) * {p.width}], {p.width}L, tc_lmin({n}L, {p.depth}L - tc_s), "
               f"{p.width}L, 0);")
        w.line("}")
        if close:
            self._region_close()
        else:
            w.pop()
            w.line("}")

    def _reset(self, r: LReset) -> None:
        size = memshare.elements(self.shapes[r.tensor])
        self.w.line(f"memset({self.var[r.tensor]}, 0, {size}L * sizeof({CTYPE[self.tensors[r.tensor].dtype]}));  "
                    f"// temporary {r.tensor} reuses the buffer of {r.owner}")

    # ---- loops ----
    def _node(self, n: LNode) -> None:
        w = self.w
        if isinstance(n, LTranspose):
            self._transpose(n)
        elif isinstance(n, LTile):
            self._register_tile(n)
        elif isinstance(n, LAccum):
            self._accumulate(n)
        elif isinstance(n, LDecl):
            self._decl(n)
        elif isinstance(n, LReset):
            self._reset(n)
        elif isinstance(n, LPack):
            self._pack(n)
        elif isinstance(n, LFor) and n.private:
            self._private_rows(n)
        elif isinstance(n, LFor):
            hoisted = self._hoist(n)
            self.hoisted.update(hoisted)
            vl = n.vector
            if vl is not None:
                self.vector_code = True
                w.line("#if TC_VEC")
                vecloop.emit(self, vl)
                w.line("#else")
            fence = n.omp and _streams((n,))  # each thread orders its streamed stores before the barrier
            if n.omp:
                collapse = " collapse(2)" if n.collapse else ""
                self._region_open(f"{_schedule(n)}{collapse}" + (" nowait" if fence else ""))
            elif n.simd:
                w.line("#pragma omp simd")
            if n.unroll:
                w.line(f"#pragma GCC unroll {n.unroll}")
            cond = _top(self._lexpr(n.cond))
            w.line(f"for (long {n.var} = {_top(self._lexpr(n.init))}; {cond}; {n.var} += {n.step}) {{")
            with w.indent():
                self._body(n.body)
            w.line("}")
            if vl is not None:
                w.line("#endif")
            if fence:
                w.line("tc_stream_fence();")
            if n.omp:
                self._region_close()
            for key in hoisted:
                del self.hoisted[key]
        elif isinstance(n, LIf):
            w.line(f"if ({_top(self._lexpr(n.cond))}) {{")
            with w.indent():
                self._body(n.then)
            if n.other:
                w.line("} else {")
                with w.indent():
                    self._body(n.other)
            w.line("}")
        elif isinstance(n, LCall):
            self._call(n)

    def _private_rows(self, n: LFor) -> None:
        """Row loop ``n`` in ``n.blocks`` blocks of rows handed out to the threads, each block
        summing into partial rows of its own of the ``n.private`` targets (codegen.privatise,
        buffers from ``_partial_buffers``), added to the targets in block order after the loop."""
        w = self.w
        trips = trip_count(n)
        assert trips is not None and not n.collapse and n.vector is None
        hoisted = self._hoist(n)
        self.hoisted.update(hoisted)
        parts = self.partials[id(n)]
        sizes = {t: memshare.elements(self.shapes[t]) for t in n.private}
        fence = _streams((n,))
        w.line(f"// rows in {n.blocks} blocks; {', '.join(n.private)} summed per block, then in block order")
        self._region_open("schedule(dynamic, 1)" + (" nowait" if fence else ""))
        w.line(f"for (long tc_rb = 0; tc_rb < {n.blocks}; tc_rb += 1) {{")
        w.push()
        saved = {t: self.var[t] for t in n.private}
        for k, (t, buf) in enumerate(parts.items()):
            ctype = CTYPE[self.tensors[t].dtype]
            w.line(f"{ctype} *restrict tc_pr{k} = {buf} + tc_rb * {sizes[t]}L;")
            w.line("#pragma omp simd")
            w.line(f"for (long tc_i = 0; tc_i < {sizes[t]}L; tc_i += 1) tc_pr{k}[tc_i] = 0;")
            self.var[t] = f"tc_pr{k}"
        w.line(f"for (long {n.var} = tc_rb * {trips}L / {n.blocks}; {n.var} < (tc_rb + 1) * {trips}L / {n.blocks}; "
               f"{n.var} += 1) {{")
        with w.indent():
            self._body(n.body)
        w.line("}")
        self.var.update(saved)
        w.pop()
        w.line("}")
        if fence:
            w.line("tc_stream_fence();")
        self._region_close()
        for t, buf in parts.items():
            ctype = CTYPE[self.tensors[t].dtype]
            w.line("#pragma omp simd")
            w.line(f"for (long tc_i = 0; tc_i < {sizes[t]}L; tc_i += 1) {{")
            with w.indent():
                w.line(f"{ctype} tc_s = {self.var[t]}[tc_i];")
                w.line(f"for (long tc_b = 0; tc_b < {n.blocks}; tc_b += 1) tc_s += {buf}[tc_b * {sizes[t]}L + tc_i];")
                w.line(f"{self.var[t]}[tc_i] = tc_s;")
            w.line("}")
        for key in hoisted:
            del self.hoisted[key]

    def _transpose(self, tp: LTranspose) -> None:
        """A copy nest moved through registers in 8x8 blocks (see codegen.transpose): one call for
        the whole rectangle, or, where the outer loop is the parallel one, one per eight rows."""
        p, q = tp.outer, tp.inner
        if not p.omp:
            self._transpose_rect(tp, p, q, f"{self._inclusive_bound(p)} - {p.var} + 1")
            return
        assert transpose.full_blocks(p)
        self._region_open("schedule(static)")
        self.w.line(f"for (long {p.var} = {_top(self._lexpr(p.init))}; {_top(self._lexpr(p.cond))}; "
                    f"{p.var} += {transpose.BLOCK}) {{")
        with self.w.indent():
            self._transpose_rect(tp, None, q, str(transpose.BLOCK))
        self.w.line("}")
        self._region_close()

    def _region_open(self, worksharing: str) -> None:
        """A parallel region whose threads first spread over the cores (the prelude's
        ``tc_spread``), then share the loop that follows by ``omp for`` with these clauses;
        ``_region_close`` ends it after the loop."""
        w = self.w
        w.line("{")
        w.push()
        w.line("const int tc_mc = tc_core();")
        w.line("#pragma omp parallel")
        w.line("{")
        w.push()
        w.line("tc_spread(tc_mc);")
        w.line(f"#pragma omp for {worksharing}")

    def _region_close(self) -> None:
        for _ in range(2):
            self.w.pop()
            self.w.line("}")

    def _inclusive_bound(self, f: LFor) -> str:
        assert isinstance(f.cond, LOp)
        bound = _top(self._lexpr(f.cond.args[1]))
        return f"({bound})" if f.cond.op == "<=" else f"({bound} - 1)"

    def _transpose_rect(self, tp: LTranspose, p: LFor | None, q: LFor, rows: str) -> None:
        """``tc_transpose_rect`` from the first iteration of ``p`` (None: its current one) and of
        ``q``: ``rows`` target rows, all of ``q``'s columns."""
        w = self.w
        st = self.scop.stmt(tp.call.stmt)
        s = self.scop.tc_statement(st.name)
        src = s.rhs
        assert isinstance(src, Read)
        stream = int(memshare.elements(self.shapes[s.tensor]) * 4 >= transpose.STREAM_MIN_BYTES)
        w.line(f"{{  // statement {s.number} (line {s.span.line}): {print_stmt(s.source)}, in "
               f"{transpose.BLOCK}x{transpose.BLOCK} blocks")
        with w.indent():
            for f in (p, q):
                if f is not None:
                    w.line(f"const long {f.var} = {_top(self._lexpr(f.init))};")
            env: dict[str, str] = {}
            for k, (name, arg) in enumerate(zip(st.indices, tp.call.args)):
                w.line(f"const long x{k} = {_top(self._lexpr(arg))};")
                env[name] = f"x{k}"
            target = self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env)
            source = self._access(src.tensor, tuple(x for x in src.subs if isinstance(x, Sym)), env)
            w.line(f"tc_transpose_rect(&{source}, {tp.source_stride}L, &{target}, {tp.target_stride}L, {rows}, "
                   f"{self._inclusive_bound(q)} - {q.var} + 1, {stream});")
        w.line("}")

    def _register_tile(self, rt: LTile) -> None:
        """The reduction target of ``rt`` in ``acc[...]`` across the serial loop (see regtile); a read
        that a pack around it copied into panels (``_pack``) comes from them."""
        packed = self.pack_of.get(rt.call)
        if packed is not None:
            self.packed[packed[0]] = packed[1]
        try:
            self._register_tile_body(rt)
        finally:
            if packed is not None:
                del self.packed[packed[0]]

    def _register_tile_body(self, rt: LTile) -> None:
        st = self.scop.stmt(rt.call.stmt)
        s = self.scop.tc_statement(st.name)
        args = dict(zip(st.indices, rt.call.args))
        outer = {name: f"({_top(self._lexpr(args[name]))})" for name in s.lhs}
        target = self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), outer)
        w = self.w
        w.line(f"{{  // statement {s.number}: a {'x'.join(map(str, rt.extents))} register tile of {s.tensor} "
               f"across {rt.loop.var}")
        with w.indent():
            inside = next((f for f in rt.serial if f.var == rt.inside), None) if rt.inside else None
            first = _top(self._lexpr(rt.first)) if rt.first is not None else None
            vt = rt.vector
            self.vector_code |= vt is not None
            self.vector_tiles |= vt is not None
            if vt is not None and vt.full:  # partial tiles take the scalar tile, where no case below fits
                w.line("#if TC_VEC")
                head = "if"
                forms = vectile.cases(vt)
                for k, (test, case, shift, note) in enumerate(forms):
                    if vt.covers and k == len(forms) - 1:  # the one size left
                        w.line(f"}} else {{{note}")
                    else:
                        w.line(f"{head} ({' && '.join(_top(self._lexpr(x)) for x in test)}) {{{note}")
                    with w.indent():
                        vectile.emit(self, case, rt.identity, shift, first)
                    head = "} else if"
                for test, cut, note in [] if vt.covers else vectile.scalar_cases(vt):
                    w.line(f"}} else if ({' && '.join(_top(self._lexpr(x)) for x in test)}) {{{note}")
                    with w.indent():
                        self._scalar_tile(cut, target, first, inside)
                if vt.covers:  # the scalar tile only where the target's vectors are missing
                    w.line("}")
                    w.line("#else")
                else:
                    w.line("} else")
                    w.line("#endif")
                w.line("{")
                w.push()
            elif vt is not None:
                w.line("#if TC_VEC")
                vectile.emit(self, vt, rt.identity, first_chunk=first)
                w.line("#else")
            self._scalar_tile(rt, target, first, inside)
            if vt is not None and vt.full:
                w.pop()
                w.line("}")
                if vt.covers:
                    w.line("#endif")
            elif vt is not None:
                w.line("#endif")
        w.line("}")

    def _scalar_tile(self, rt: LTile, target: str, first: str | None, inside: LFor | None) -> None:
        """``rt`` in the scalar array ``acc``: loaded (or started from the identity), updated across
        the serial loops, stored to ``target``."""
        w = self.w
        s = self.scop.tc_statement(self.scop.stmt(rt.call.stmt).name)
        ctype = CTYPE[self.tensors[s.tensor].dtype]
        acc = "acc" + "".join(f"[{f.var} - {_top(self._lexpr(f.init))}]" for f in rt.inner)
        w.line(f"{ctype} acc{''.join(f'[{e}]' for e in rt.extents)};")
        start = _literal(T.identity(s.op, self.tensors[s.tensor].dtype), ctype)
        if rt.identity:  # the tile runs the whole reduction: no load, no init nest
            self._tile_loops(rt, f"{acc} = {start};")
        elif first is not None:  # its first chunk starts from the identity (no init nest)
            self._tile_loops(rt, f"{acc} = ({first}) ? {start} : {target};")
        else:
            self._tile_loops(rt, f"{acc} = {target};")
        serial = [f for f in rt.serial if f is not inside]
        for loop in serial:
            w.line(f"for (long {loop.var} = {_top(self._lexpr(loop.init))}; {_top(self._lexpr(loop.cond))}; "
                   f"{loop.var} += {loop.step}) {{")
            w.push()
        self._tile_loops(rt, None, acc, inside)
        for _ in serial:
            w.pop()
            w.line("}")
        self._tile_loops(rt, f"{target} = {acc};")

    def _tile_loops(self, rt: LTile, copy: str | None, acc: str = "",
                    inside: LFor | None = None) -> None:
        """The tile loops of ``rt`` around ``copy`` (a load or store of the tile), or around the
        statement updating ``acc`` (unrolled outer loops, vectorised innermost loop)."""
        w = self.w

        def body() -> None:
            if copy is not None:
                w.line(copy)
            elif inside is not None:
                w.line(f"#pragma GCC unroll {trip_count(inside)}")
                w.line(f"for (long {inside.var} = {_top(self._lexpr(inside.init))}; "
                       f"{_top(self._lexpr(inside.cond))}; {inside.var} += {inside.step}) {{")
                with w.indent():
                    self._statement_body(rt.call, acc)
                w.line("}")
            else:
                self._statement_body(rt.call, acc)

        def nest(k: int) -> None:
            if k == len(rt.inner):
                body()
                return
            f = rt.inner[k]
            simd = k == len(rt.inner) - 1 and rt.simd
            hoisted = self._hoist_gathers(rt.call, f) if simd and copy is None and inside is None else []
            for lo, hi in self._vector_segments(f, rt) if simd else [(None, None)]:
                if simd:
                    w.line("#pragma omp simd")
                elif copy is None:
                    w.line(f"#pragma GCC unroll {rt.extents[k]}")
                init = lo if lo is not None else _top(self._lexpr(f.init))
                cond = f"{f.var} < {hi}" if hi is not None else _top(self._lexpr(f.cond))
                w.line(f"for (long {f.var} = {init}; {cond}; {f.var} += 1) {{")
                w.push()
                nest(k + 1)
                w.pop()
                w.line("}")
            for key in hoisted:
                del self.gathered[key]

        nest(0)

    def _hoist_gathers(self, call: LCall, loop: LFor) -> list[tuple[int, int]]:
        """Checked row numbers of the unconditional gathers of ``call`` that ``loop`` (at least one
        iteration) does not move, computed once before it: the loop then reads one row, contiguous
        and vectorised (an embedding bag's ``Table(Idx(b, l), d)`` along ``d``). ``(id(Read), dim)``
        of each, for ``_read``."""
        trips = trip_count(loop)
        if trips is None or trips < 1:
            return []
        st = self.scop.stmt(call.stmt)
        s = self.scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        moved = {i for i, a in args.items() if loop.var in expr_vars(a)}
        out = []
        for r in reads(s.rhs):
            if r.conditional or id(r) in self.hoisted or r.tensor in self.scalars or r.tensor in self.rows:
                continue
            for d, sub in enumerate(r.subs):
                if isinstance(sub, Sym) or not reads(sub) or _index_names(sub) & moved:
                    continue
                env = {i: f"({_top(self._lexpr(args[i]))})" for i in _index_names(sub)}
                code = self._site("gather", s, r.tensor, d, r.span)
                name = f"g{len(self.gathered)}"
                self.w.line(f"const long {name} = tc_chk((long){self._expr(sub, env, s)}, "
                            f"{self.shapes[r.tensor][d]}L, {code}, tc_err);")
                self.gathered[(id(r), d)] = name
                out.append((id(r), d))
        return out

    def _vector_segments(self, f: LFor, rt: LTile) -> list[tuple[str | None, str | None]]:
        """The innermost tile loop as one loop, or as two where the split pass cut it."""
        if not rt.split:
            return [(None, None)]
        trips = trip_count(f)
        assert isinstance(f.init, LInt) and trips is not None
        return [(str(f.init.value), str(rt.split)), (str(rt.split), str(f.init.value + trips))]

    def _hoist(self, n: LFor) -> dict[int, str]:
        """The loads of the reads the hoist pass moved before loop ``n``; ``id(Read) -> local``."""
        out: dict[int, str] = {}
        for name, k, pos in n.hoist:
            call = n.body[k]
            assert isinstance(call, LCall)
            st = self.scop.stmt(call.stmt)
            r = read_tuple(self.scop.tc_statement(st.name).rhs)[pos]
            args = dict(zip(st.indices, call.args))
            names = set().union(*(x.indices() for x in r.subs if isinstance(x, Sym))) if r.subs else set()
            env = {i: f"({_top(self._lexpr(args[i]))})" for i in names}
            self.w.line(f"const {CTYPE[r.dtype]} {name} = "
                        f"{self._access(r.tensor, tuple(x for x in r.subs if isinstance(x, Sym)), env)};")
            out[id(r)] = name
        return out

    def _accumulate(self, a: LAccum) -> None:
        """A nest of loops around one reduction into an element they do not move: the element in a
        local accumulator (in a register); the innermost loop an `omp simd` reduction where the
        vectorise pass says so."""
        call = a.call
        st = self.scop.stmt(call.stmt)
        s = self.scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        t = self.tensors[s.tensor]
        ctype = CTYPE[t.dtype]
        w = self.w
        if a.jam:
            assert a.vector is not None
            self.vector_code = True
            w.line(f"{{  // statement {s.number}: accumulate {s.tensor} over {', '.join(f.var for f in a.loops)}, "
                   f"the elements of {', '.join(f'{f.var} ({trip_count(f)})' for f in a.jam)} at once")
            w.line("#if TC_VEC")
            with w.indent():
                vecloop.emit_jammed(self, a.vector, CTYPE[self.tensors[s.tensor].dtype])
            w.line("#else")
            with w.indent():
                for n in a.jam:
                    w.line(f"for ({self.ITYPE} {n.var} = {_top(self._lexpr(n.init))}; {_top(self._lexpr(n.cond))}; "
                           f"{n.var} += {n.step}) {{")
                    w.push()
                self._accumulate(replace(a, jam=(), vector=None, vector_text=""))
                for _ in a.jam:
                    w.pop()
                    w.line("}")
            w.line("#endif")
            w.line("}")
            return
        w.line(f"{{  // statement {s.number}: accumulate {s.tensor} over {', '.join(f.var for f in a.loops)}")
        with w.indent():
            outer = {name: f"({_top(self._lexpr(args[name]))})" for name in s.lhs}
            target = self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), outer)
            w.line(f"{ctype} acc = {target};")
            simd = a.simd
            minmax = simd and s.op in ("min", "max")
            floating = T.is_float(t.dtype)
            if minmax and floating:
                w.line("int nan = acc != acc;")
            if a.vector is not None:
                self.vector_code = True
                w.line("#if TC_VEC")
                vecloop.emit_accum(self, a.vector)
                w.line("#else")
            for n in a.loops:
                if simd and n is a.loops[-1]:
                    extra = " reduction(|:nan)" if minmax and floating else ""
                    w.line(f"#pragma omp simd reduction({s.op}:acc){extra}")
                w.line(f"for ({self.ITYPE} {n.var} = {_top(self._lexpr(n.init))}; {_top(self._lexpr(n.cond))}; "
                       f"{n.var} += {n.step}) {{")
                w.push()
            self._statement_body(call, "acc", "nan" if minmax else None)
            for _ in a.loops:
                w.pop()
                w.line("}")
            if a.vector is not None:
                w.line("#endif")
            w.line(f"{target} = {'nan ? NAN : acc' if minmax and floating else 'acc'};")
        w.line("}")

    def _lexpr(self, e: LExpr) -> str:
        if isinstance(e, LInt):
            return f"{e.value}L" if abs(e.value) >= 2**31 else str(e.value)
        if isinstance(e, LVar):
            return e.name
        assert isinstance(e, LOp)
        a = [self._lexpr(x) for x in e.args]
        op = e.op
        if op in ("+", "-", "*", "==", "<=", "<", ">=", ">", "&&", "||"):
            return "(" + f" {op} ".join(a) + ")"
        if op == "neg":
            return f"(-{a[0]})"
        if op == "?:":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op in ("min", "max"):
            return f"tc_l{op}({a[0]}, {a[1]})"
        if op == "floordiv":
            return f"floord({a[0]}, {a[1]})"
        if op == "div":
            return f"({a[0]} / {a[1]})"
        if op == "mod":
            return f"({a[0]} % {a[1]})"
        raise ValueError(op)

    # ---- statements ----
    def _call(self, n: LCall) -> None:
        self._statement_body(n, None)

    def _statement_body(self, n: LCall, acc: str | None, nan_flag: str | None = None) -> None:
        """One statement instance; with ``acc``, the reduction target is that local variable; with
        ``nan_flag``, a min/max reduction is written so OpenMP can vectorise it, NaNs being
        recorded in the flag (numpy's min and max propagate NaN)."""
        st = self.scop.stmt(n.stmt)
        s = self.scop.tc_statement(st.name)
        w = self.w
        w.line(f"{{  // {'init of ' if st.kind == 'init' else ''}statement {s.number} (line {s.span.line}): "
               f"{print_stmt(s.source)}")
        with w.indent():
            env: dict[str, str] = {}
            scatter = s.scatter if st.kind == "update" else None
            self.quotients = {}
            for k, (name, arg) in enumerate(zip(st.indices, n.args)):
                env[name] = f"x{k}"
                if scatter is None or name != scatter[0]:
                    w.line(f"const {self.ITYPE} x{k} = {_top(self._lexpr(arg))};")
                group = _group_of(arg)
                if group is not None:
                    self.quotients[f"x{k}"] = group
            if scatter is not None:  # the index the data names; the equality holds nowhere outside its range
                x = env[scatter[0]]
                w.line(f"const {self.ITYPE} {x} = (long){self._expr(scatter[1], env, s)};")
                lo, hi = next((lo, hi) for i, lo, hi in self.scop.bound_statement(st.name).ranges if i == scatter[0])
                w.line(f"if ({x} >= {lo}L && {x} < {hi}L) {{")
                w.push()
            target = acc or self.scalars.get(s.tensor) or \
                self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), env)
            ctype = CTYPE[self.tensors[s.tensor].dtype]
            if st.kind == "init":
                w.line(f"{target} = {_literal(T.identity(s.op, self.tensors[s.tensor].dtype), ctype)};")
            else:
                rhs = self._expr(s.rhs, env, s)
                dtype = self.tensors[s.tensor].dtype
                if scatter is not None and self.ATOMIC_SCATTERS and dtype in ATOMIC_DTYPES:
                    w.line(f"tc_atomic_add_{dtype}(&{target}, {rhs});")  # other threads add to it too
                elif s.op == "=":
                    w.line(f"{target} = {rhs};")
                elif s.op == "+" and _is_product(s.rhs):
                    # a contraction: one fused multiply-add per point (no other contraction happens)
                    assert isinstance(s.rhs, Binop)
                    a, b = self._expr(s.rhs.lhs, env, s), self._expr(s.rhs.rhs, env, s)
                    w.line(f"{target} = fma{'f' if s.rhs.dtype == 'float32' else ''}({a}, {b}, {target});")
                elif s.op == "+":
                    w.line(f"{target} = {target} + {rhs};")
                elif s.op == "*":
                    w.line(f"{target} = {target} * {rhs};")
                elif nan_flag is not None:
                    cmp = ">" if s.op == "max" else "<"
                    w.line(f"const {ctype} v = {rhs};")
                    w.line(f"{target} = v {cmp} {target} ? v : {target};")
                    if T.is_float(self.tensors[s.tensor].dtype):
                        w.line(f"{nan_flag} |= (v != v);")
                else:
                    w.line(f"{target} = tc_{s.op}({target}, {rhs});")
            if scatter is not None:
                w.pop()
                w.line("}")
        w.line("}")
        self.quotients = {}  # (the next statement sets its own)

    def _access(self, tensor: str, subs: tuple[Sym, ...], env: dict[str, str],
                checked: list[str] | None = None) -> str:
        if tensor in self.folded:  # T(i, j) = S(j, i), read from S (LPack.source)
            return self._access(self.folded[tensor], subs[::-1], env, None if checked is None else checked[::-1])
        if tensor in self.rows:
            return self._row_access(tensor, subs, env, checked)
        strides = self.strides[tensor]
        terms = []
        for d, sub in enumerate(subs):
            text = checked[d] if checked is not None else self._sym(sub, env)
            if strides[d] != 0:
                terms.append(f"{text} * {strides[d]}{self.LONG}" if strides[d] != 1 else text)
        return f"{self.var[tensor]}[{' + '.join(terms) or '0'}]"

    def _row_access(self, tensor: str, subs: tuple[Sym, ...], env: dict[str, str],
                    checked: list[str] | None) -> str:
        fixed = self.rows[tensor]
        shape = self.shapes[tensor]
        terms, stride = [], 1
        for d in reversed(range(len(subs))):
            if d in fixed:
                continue
            text = checked[d] if checked is not None else self._sym(subs[d], env)
            terms.append(f"{text} * {stride}L" if stride != 1 else text)
            stride *= shape[d]
        return f"r{self.order.index(tensor)}[{' + '.join(reversed(terms)) or '0'}]"

    def _sym(self, s: Sym, env: dict[str, str]) -> str:
        s = s.subs(self.sizes)
        parts = [str(s.const)] if s.const or not s.terms else []
        for a, c in s.terms:
            parts.append(f"{c} * {self._atom(a, env)}" if c != 1 else self._atom(a, env))
        return "(" + " + ".join(parts) + ")"

    def _atom(self, a: object, env: dict[str, str]) -> str:
        if isinstance(a, Var):
            return env[a.name]
        if isinstance(a, FloorDiv):
            if len(a.num.terms) == 1 and a.num.terms[0][1] == 1 and isinstance(a.num.terms[0][0], Var):
                group = self.quotients.get(env.get(a.num.terms[0][0].name, ""))
                if group is not None and group[0] == a.den:  # (d*q + r + c) / d = q + (r + c) / d, exactly
                    d, q, r = group
                    extra = (r + a.num.const) // d
                    return f"({q} + {extra})" if extra else q
            return f"tc_fdiv({self._sym(a.num, env)}, {a.den})"
        if isinstance(a, Mod):
            return f"tc_fmod({self._sym(a.num, env)}, {a.den})"
        assert isinstance(a, MinMax)
        out = self._sym(a.args[-1], env)
        for x in reversed(a.args[:-1]):
            out = f"tc_l{a.op}({self._sym(x, env)}, {out})"
        return out

    def _site(self, kind: str, s: Statement, tensor: str, dim: int, span: object) -> int:
        code = len(self.errors) + 1
        self.errors.append(ErrorSite(code, kind, s.number, tensor, dim, span))
        return code

    def _expr(self, e: TExpr, env: dict[str, str], s: Statement) -> str:
        ct = CTYPE[e.dtype]
        if isinstance(e, Const):
            return _literal(e.value, ct)
        if isinstance(e, IndexVal):
            return f"(({ct}){env[e.name]})"
        if isinstance(e, SizeVal):
            return f"(({ct}){self.scop.inst.sizes[e.name]})"
        if isinstance(e, Read):
            return self._read(e, env, s)
        if isinstance(e, Convert):
            inner = self._expr(e.arg, env, s)
            if e.dtype == "bool":
                return f"({inner} != 0)"
            return f"(({ct}){inner})"
        if isinstance(e, Unop):
            return f"(!{self._expr(e.arg, env, s)})" if e.op == "!" else f"(({ct})-{self._expr(e.arg, env, s)})"
        if isinstance(e, Select):
            cond, then, other = (self._expr(x, env, s) for x in (e.cond, e.then, e.other))
            if self.TARGET == "c" and self._loads_anyway(e, s):
                # both values computed before the choice: loads the compiler cannot prove safe stay
                # loads and a blend, not masked loads or a branch (a pooling gradient's share)
                return (f"({{ const {ct} tc_then = {then}; const {ct} tc_else = {other}; "
                        f"({cond}) ? tc_then : tc_else; }})")
            return f"({cond} ? {then} : {other})"
        if isinstance(e, Binop):
            a, b = self._expr(e.lhs, env, s), self._expr(e.rhs, env, s)
            if e.op in ("/", "%") and T.is_int(e.lhs.dtype):
                code = self._site("division" if e.op == "/" else "modulo", s, "", 0, e.span)
                if T.is_unsigned(e.lhs.dtype):  # floor and truncation agree; keep the full unsigned range
                    return f"(({ct})({a} {e.op} ({ct})tc_unz({b}, {code}, tc_err)))"
                f = "tc_fdiv" if e.op == "/" else "tc_fmod"
                return f"(({ct}){f}((long){a}, tc_nz((long){b}, {code}, tc_err)))"
            if e.op == "%":
                return f"fmod{'f' if e.dtype == 'float32' else ''}({a}, {b})"
            if e.op == "/" and e.dtype in ("float32", "float64"):
                r = divide.of_divisor(e.rhs, self.scop.inst.sizes, False)  # scalar code: powers of two only
                if r is not None and r.exact:
                    return f"(({ct})({a} * {_literal(r.hi, ct)}))"
            if e.op in ("&&", "||") and self._pure(e.lhs, s) and self._pure(e.rhs, s):
                # both sides are safe to evaluate: no branch (GCC 12 mis-vectorises some && / || chains)
                return f"((bool){a} {e.op[0]} (bool){b})"
            if e.op in ("&&", "||", "==", "!=", "<", "<=", ">", ">="):
                return f"({a} {e.op} {b})"
            return f"(({ct})({a} {e.op} {b}))"
        if isinstance(e, Call):
            return self._builtin(e, [self._expr(x, env, s) for x in e.args])
        raise TypeError(e)

    def _loads_anyway(self, e: Select, s: Statement) -> bool:
        """Whether a choice reads a tensor in a branch and both branches are small, hold no choice
        and are pure (``_pure``): then evaluating both cannot fail or leave a tensor, and costs
        little. (A nest of choices keeps the plain form, and is looked at in constant time.)"""
        if not (_small(e.then) and _small(e.other)):
            return False
        return bool(reads(e.then) or reads(e.other)) and self._pure(e.then, s) and self._pure(e.other, s)

    def _pure(self, e: TExpr, s: Statement) -> bool:
        """No check can fail while evaluating ``e``: no gather, no conditional read that may leave
        its tensor, no integer division."""
        if isinstance(e, Read):
            if not all(isinstance(x, Sym) for x in e.subs):
                return False
            if not e.conditional:
                return True
            box = {r.name: (r.lo.subs(self.sizes), r.hi.subs(self.sizes)) for r in s.ranges}
            shape = self.shapes[e.tensor]
            return all(_inside(x.subs(self.sizes), box, shape[d]) for d, x in enumerate(e.subs)
                       if isinstance(x, Sym))
        if isinstance(e, Binop):
            if e.op in ("/", "%") and T.is_int(e.lhs.dtype):
                return False
            return self._pure(e.lhs, s) and self._pure(e.rhs, s)
        if isinstance(e, (Unop, Convert)):
            return self._pure(e.arg, s)
        if isinstance(e, Select):
            return all(self._pure(x, s) for x in (e.cond, e.then, e.other))
        if isinstance(e, Call):
            return all(self._pure(a, s) for a in e.args)
        return True

    def _read(self, e: Read, env: dict[str, str], s: Statement) -> str:
        if e.tensor in self.scalars:
            return self.scalars[e.tensor]
        if id(e) in self.hoisted:
            return self.hoisted[id(e)]
        shape = self.shapes[e.tensor]
        box = {r.name: (r.lo.subs(self.sizes), r.hi.subs(self.sizes)) for r in s.ranges}
        texts, checks = [], []
        for d, sub in enumerate(e.subs):
            if isinstance(sub, Sym):
                text = self._sym(sub, env)
                if e.conditional and not _inside(sub.subs(self.sizes), box, shape[d]):
                    code = self._site("read", s, e.tensor, d, e.span)
                    text = f"tc_chk({text}, {shape[d]}L, {code}, tc_err)"
                    checks.append(d)
            elif (id(e), d) in self.gathered:  # checked before the loop (_hoist_gathers)
                text = self.gathered[(id(e), d)]
                checks.append(d)
            else:
                # a subscript computed from tensor values (a gather) or from indices (``j / R``)
                code = self._site("gather" if reads(sub) else "read", s, e.tensor, d, e.span)
                text = f"tc_chk((long){self._expr(sub, env, s)}, {shape[d]}L, {code}, tc_err)"
                checks.append(d)
            texts.append(text)
        access = self._access(e.tensor, tuple(Sym.of(0) for _ in e.subs), env, checked=texts)
        # a dim of stride 0 (broadcast, or an empty tensor) leaves the address: its check still runs
        unaddressed = [texts[d] for d in checks if self.strides[e.tensor][d] == 0 and e.tensor not in self.rows]
        return f"({', '.join(unaddressed)}, {access})" if unaddressed else access

    def _builtin(self, e: Call, a: list[str]) -> str:
        """A call of a builtin, spelled for this emitter's target (``tcdsl.core.builtins``); a function
        of tcdsl's math library is noted for the prelude."""
        b, t = BUILTINS[e.fn], e.dtype
        if not T.is_float(t):
            assert b.c_int is not None, e.fn
            return b.c_int.format(*a)
        template = b.spelling(self.TARGET, t)
        self.mathlib.update((m, t) for m in _LIBRARY_CALL.findall(template))
        if t == "float32":  # float32 exp has a vector variant (vector_exp); the template, not the
            template = _EXPF.sub("TC_EXPF(", template)  # call, as the arguments are long when nested
        call = template.format(*a, f="f" if t in ("float32", "float16") else "", one=_literal(1.0, CTYPE[t]),
                               zero=_literal(0.0, CTYPE[t]))
        return f"(({CTYPE[t]}){call})" if t == "float16" else call


_LIBRARY_CALL = re.compile(r"\b(tc_\w+)\{f\}")
_EXPF = re.compile(r"\bexp\{f\}\(")


def _is_product(e: TExpr) -> bool:
    return isinstance(e, Binop) and e.op == "*" and e.dtype in ("float32", "float64")


def _inside(sub: Sym, box: dict[str, tuple[Sym, Sym]], extent: int) -> bool:
    lo, hi = bounds(sub, box)
    return lo.is_const() and hi.is_const() and lo.const >= 0 and hi.const < extent


def _literal(v: object, ctype: str) -> str:
    if ctype in ("float", "double", "_Float16"):
        x = float(v)  # type: ignore[arg-type]
        with np.errstate(over="ignore"):  # rounded to the type first: 70000 is inf in float16
            x = float({"float": np.float32, "_Float16": np.float16}.get(ctype, np.float64)(x))
        if math.isnan(x):
            return "NAN"
        if math.isinf(x):
            return "INFINITY" if x > 0 else "(-INFINITY)"
        if ctype == "float":
            return f"{x.hex()}f"
        if ctype == "_Float16":
            return f"((_Float16){x.hex()})"
        return x.hex()
    if ctype == "bool":
        return "true" if v else "false"
    iv = int(v)  # type: ignore[call-overload]
    if ctype in ("uint64_t",):
        return f"{iv}UL"
    if ctype == "int64_t" or abs(iv) >= 2**31:
        return f"({iv}L)" if iv != -(2**63) else "(-9223372036854775807L - 1)"
    if iv == -(2**31):
        return "(-2147483647 - 1)"
    return f"(({ctype}){iv})" if ctype not in ("int32_t",) else (str(iv) if iv >= 0 else f"({iv})")


CHUNKS_PER_THREAD = 8  # a parallel loop's dynamic chunks per thread
FINE_CHUNKS_PER_THREAD = 32  # the same for a loop over register tiles


def _schedule(n: LFor) -> str:
    """The schedule clause of parallel loop ``n`` (and, collapsed, of the loop inside it): chunks
    handed out dynamically where the iteration count is known (on a machine shared with other
    work, a static split waits for its slowest thread: softmax 2.5 -> 1.8 ms median with another
    process on one of two cores), static otherwise: ``CHUNKS_PER_THREAD`` chunks a thread, or
    ``FINE_CHUNKS_PER_THREAD`` where the loop runs register tiles (``LFor.fine``, the lowering's
    parallel pass)."""
    trips = trip_count(n)
    if trips is not None and n.collapse:
        inner = n.body[0]
        assert isinstance(inner, LFor)
        m = trip_count(inner)
        trips = None if m is None else trips * m
    if trips is None:
        return "schedule(static)"
    return f"schedule(dynamic, tc_chunk({trips}L, {FINE_CHUNKS_PER_THREAD if n.fine else CHUNKS_PER_THREAD}))"


SMALL_BRANCH = 32  # nodes: the largest branch a choice computes before it chooses (_loads_anyway)


def _small(e: TExpr) -> bool:
    """``e`` has at most SMALL_BRANCH nodes and no choice."""
    todo, seen = [e], 0
    while todo:
        x = todo.pop()
        seen += 1
        if seen > SMALL_BRANCH or isinstance(x, Select):
            return False
        todo.extend(operands(x))
        if isinstance(x, Read):
            todo.extend(sub for sub in x.subs if isinstance(sub, TExpr))
    return True


def _group_of(e: LExpr) -> tuple[int, str, int] | None:
    """``(d, q, r)`` where a statement index is ``d*q + r``, ``q`` a loop's variable and ``d`` >= 2
    (codegen.lower.run_over_quotients); its quotients by ``d`` print as ``q`` plus a constant."""
    r = 0
    if isinstance(e, LOp) and e.op == "+" and len(e.args) == 2:
        head, tail = e.args
        if isinstance(tail, LInt):
            e, r = head, tail.value
    if not (isinstance(e, LOp) and e.op == "*" and len(e.args) == 2):
        return None
    d, q = e.args
    if isinstance(d, LInt) and isinstance(q, LVar) and d.value >= 2:
        return d.value, q.name, r
    return None


def _index_names(e: TExpr) -> set[str]:
    """The statement indices ``e`` uses, in its values and in the subscripts of its reads."""
    out: set[str] = set()
    if isinstance(e, IndexVal):
        out.add(e.name)
    elif isinstance(e, Read):
        for x in e.subs:
            out |= x.indices() if isinstance(x, Sym) else _index_names(x)
    else:
        for kid in operands(e):
            out |= _index_names(kid)
    return out
