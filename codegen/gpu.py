"""GPU emitter: ``GpuProgram x Scop -> GpuSource`` in CUDA or OpenCL C 1.2, from one kernel body.

The body is the C emitter's (statements, checks, builtins) with GPU hooks: mapped loops start at
the block or thread id and stride by the block or thread count, shared copies and barriers are
printed through macros (``SHARED``, ``SYNC()``, ``GLOBAL``), and a per-dialect prelude defines them,
so the CUDA and OpenCL texts differ only in their first lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tcdsl.core.affine import Sym
from tcdsl.core.builtins import BUILTINS
from tcdsl.core.checked import Read
from tcdsl.polyhedral.gpu import BLOCK_IDS, THREAD_IDS, GpuKernel, GpuProgram
from tcdsl.polyhedral.loopir import LCall, LCopy, LFor, LHold, LInt, LNode, LSync
from tcdsl.polyhedral.scop import Scop

from . import mathlib, regtile
from .c import _Emitter
from .cexpr import CTYPE, ErrorSite
from .writer import unparen as _top

DIALECTS = ("cuda", "opencl")
ERR_INTS = 4  # the error flags every kernel takes last: int32 code, pad, int64 value (see tc_fail)

CUDA_PRELUDE = r"""// CUDA (NVRTC)
#define KERNEL extern "C" __global__
#define GLOBAL
#define SHARED __shared__
#define RESTRICT __restrict__
#define SYNC() __syncthreads()
#define DEVFN static __device__ inline
#define TC_CAS(p, c, v) atomicCAS((p), (c), (v))
#define TID_X threadIdx.x
#define TID_Y threadIdx.y
#define TID_Z threadIdx.z
#define BID_X blockIdx.x
#define BID_Y blockIdx.y
#define BID_Z blockIdx.z
static __device__ inline float tc_h(float x) {  /* x rounded to the nearest half */
  unsigned short h; float y;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h));
  return y;
}
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
"""

# OpenCL C's math functions are overloaded: the float spellings (`expf`) of the builtins and of
# tcdsl.codegen.mathlib's calls are defined to them
_F_NAMES = tuple(sorted({*mathlib.LIBM_CALLS, *(m for b in BUILTINS.values()
                                                for m in re.findall(r"\b(\w+)\{f\}", b.spelling("opencl"))
                                                if not m.startswith("tc_"))}))

OPENCL_PRELUDE = r"""// OpenCL C 1.2
#define KERNEL __kernel
#define GLOBAL __global
#define SHARED __local
#define RESTRICT restrict
#define SYNC() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#define DEVFN static inline
#define TC_CAS(p, c, v) atomic_cmpxchg((volatile __global int *)(p), (c), (v))
#define TID_X get_local_id(0)
#define TID_Y get_local_id(1)
#define TID_Z get_local_id(2)
#define BID_X get_group_id(0)
#define BID_Y get_group_id(1)
#define BID_Z get_group_id(2)
DEVFN float tc_h(float x) {
  ushort u; vstore_half_rte(x, 0, (__private half *)&u); return vload_half(0, (__private half *)&u);
}
typedef char int8_t;
typedef uchar uint8_t;
typedef short int16_t;
typedef ushort uint16_t;
typedef int int32_t;
typedef uint uint32_t;
typedef long int64_t;
typedef ulong uint64_t;
""" + "".join(f"#define {f}f {f}\n" for f in _F_NAMES)

# a scatter's additions (polyhedral.scatter.atomic), per dialect and element type; only those a
# program's scatters use are printed (OpenCL's 64-bit ones need cl_khr_int64_base_atomics: a device
# without it cannot run such a scatter, and says so when the program builds)
ATOMICS = {
    "cuda": {
        "float32": "static __device__ inline void tc_atomic_add_float32(float *p, float v) { atomicAdd(p, v); }",
        "float64": "static __device__ inline void tc_atomic_add_float64(double *p, double v) {\n"
                   "  atomicAdd(p, v);\n}",
        "int32": "static __device__ inline void tc_atomic_add_int32(int *p, int v) { atomicAdd(p, v); }",
        "int64": "static __device__ inline void tc_atomic_add_int64(long long *p, long long v) {\n"
                 "  atomicAdd((unsigned long long *)p, (unsigned long long)v);  /* two's complement */\n}",
    },
    "opencl": {
        "float32": "DEVFN void tc_atomic_add_float32(__global float *p, float v) {  /* compare-and-swap */\n"
                   "  volatile __global uint *q = (volatile __global uint *)p;\n  uint old = *q, seen;\n"
                   "  while ((seen = atomic_cmpxchg(q, old, as_uint(as_float(old) + v))) != old) old = seen;\n}",
        "float64": "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"
                   "DEVFN void tc_atomic_add_float64(__global double *p, double v) {\n"
                   "  volatile __global ulong *q = (volatile __global ulong *)p;\n  ulong old = *q, seen;\n"
                   "  while ((seen = atom_cmpxchg(q, old, as_ulong(as_double(old) + v))) != old) old = seen;\n}",
        "int32": "DEVFN void tc_atomic_add_int32(__global int *p, int v) {\n"
                 "  atomic_add((volatile __global int *)p, v);\n}",
        "int64": "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"
                 "DEVFN void tc_atomic_add_int64(__global long *p, long v) {\n"
                 "  atom_add((volatile __global long *)p, v);\n}",
    },
}

COMMON = r"""
typedef unsigned char tc_bool;
/* float16 tensors live in float buffers (the runtime converts); every float16 value is rounded to
   the nearest half, so results are numpy's */
#define _Float16 float
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define tc_pmod(a, n) ((((a) % (n)) + (n)) % (n))
#define tc_lmin(a, b) ((a) < (b) ? (a) : (b))
#define tc_lmax(a, b) ((a) > (b) ? (a) : (b))
#define tc_min(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define tc_max(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define tc_abs(a) ((a) < 0 ? -(a) : (a))
#define TC_EXPF expf
DEVFN long tc_fdiv(long n, long d) {
  if (d == -1) return -n;
  long q = n / d; return (q * d != n && ((n < 0) != (d < 0))) ? q - 1 : q;
}
DEVFN long tc_fmod(long n, long d) {
  if (d == -1) return 0;
  long r = n % d; return (r != 0 && ((r < 0) != (d < 0))) ? r + d : r;
}
/* A failed check records its code and value (the first one wins) and reads element 0 instead.
   The flags are four ints: the code, a pad, and the value as one 64-bit integer (an int64 gather
   index out of range is reported whole). */
DEVFN void tc_fail(GLOBAL int *err, long code, long v) {
  if (TC_CAS(&err[0], 0, (int)code) == 0) *(GLOBAL int64_t *)(err + 2) = (int64_t)v;
}
DEVFN long tc_chk(long v, long n, long code, GLOBAL int *err) {
  if ((unsigned long)v >= (unsigned long)n) { tc_fail(err, code, v); return 0; }
  return v;
}
DEVFN long tc_nz(long d, long code, GLOBAL int *err) {
  if (d == 0) { tc_fail(err, code, 0); return 1; }
  return d;
}
DEVFN unsigned long tc_unz(unsigned long d, long code, GLOBAL int *err) {
  if (d == 0) { tc_fail(err, code, 0); return 1; }
  return d;
}
"""

_IDS = {"tc_tx": "TID_X", "tc_ty": "TID_Y", "tc_tz": "TID_Z", "tc_bx": "BID_X", "tc_by": "BID_Y", "tc_bz": "BID_Z"}


@dataclass(frozen=True)
class LaunchSpec:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


@dataclass(frozen=True)
class GpuSource:
    dialect: str
    text: str
    kernels: tuple[LaunchSpec, ...]  # launched in order, each with every tensor and the error flags
    params: tuple[str, ...]  # TC tensor names, in argument order
    errors: tuple[ErrorSite, ...]

    def __str__(self) -> str:
        return self.text


def emit(program: GpuProgram, scop: Scop, dialect: str, unroll: int = 0, unroll_copies: bool = False) -> GpuSource:
    """``dialect``'s text of ``program`` after codegen.gpulower's passes."""
    if dialect not in DIALECTS:
        raise ValueError(dialect)
    strides = {}
    for name, shape in scop.inst.shapes.items():
        st, acc = [], 1
        for n in reversed(shape):
            st.append(acc)
            acc *= max(n, 1)
        strides[name] = tuple(reversed(st))
    e = _GpuEmitter(scop, strides, dialect, unroll, unroll_copies)
    return e.program(program)


class _GpuEmitter(_Emitter):
    ITYPE = "int"
    VECTOR_TILES = False
    ATOMIC_SCATTERS = True  # polyhedral.scatter.atomic: the points of a scatter run in parallel

    def __init__(self, scop: Scop, strides: dict[str, tuple[int, ...]], dialect: str, unroll: int,
                 unroll_copies: bool) -> None:
        super().__init__(scop, strides, "tc", vectorize=False, vector_math=False, unroll=unroll)
        self.dialect = dialect
        self.TARGET = dialect
        self.unroll_copies = unroll_copies
        self.contracted = set()
        self.rows = {}
        self.promoted: dict[str, tuple[str, tuple[str, ...], tuple[int, ...], int]] = {}
        self.pitches: dict[str, int] = {}
        self.held: dict[int, tuple[LCall, str]] = {}  # id(reduction loop) -> (its call, register element)
        self.slots: dict[int, tuple[str, int]] = {}  # id(thread loop) -> (slot variable, slots per thread)
        self.block = (1, 1, 1)
        big = any(math.prod(s) >= 2**31 for s in scop.inst.shapes.values())
        self.ITYPE = "long" if big else "int"
        self.LONG = "L" if big else ""

    def program(self, program: GpuProgram) -> GpuSource:
        w = self.w
        w.raw(CUDA_PRELUDE if self.dialect == "cuda" else OPENCL_PRELUDE)
        if self.dialect == "opencl" and any(t.dtype == "float64" for t in self.tensors.values()):
            w.raw("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        w.raw(COMMON)
        scattered = sorted({self.tensors[self.scop.tc_statement(st.name).tensor].dtype for st in self.scop.stmts
                            if st.kind == "update" and self.scop.tc_statement(st.name).scatter is not None})
        for dtype in scattered:
            if dtype in ATOMICS[self.dialect]:
                w.raw(ATOMICS[self.dialect][dtype] + "\n")
        library = w.mark()  # the tcdsl.codegen.mathlib functions the kernels call go here
        for name in self.order:
            t = self.tensors[name]
            w.line(f"// {self.var[name]}: {t.role} {t.decl()}, shape {self.shapes[name]}")
        specs = []
        for k in program.kernels:
            w.line()
            self._kernel(k)
            specs.append(LaunchSpec(k.name, k.grid, k.block, k.shared_bytes))
        if self.mathlib:
            w.insert(library, mathlib.source(self.mathlib))
        return GpuSource(self.dialect, w.text(), tuple(specs), self.order, tuple(self.errors))

    def _kernel(self, k: GpuKernel) -> None:
        w = self.w
        params = []
        for name in self.order:
            t = self.tensors[name]
            const = "const " if t.role == "input" else ""
            ctype = "tc_bool" if t.dtype == "bool" else CTYPE[t.dtype]
            params.append(f"GLOBAL {const}{ctype} *RESTRICT {self.var[name]}")
        params.append("GLOBAL int *RESTRICT tc_err")
        w.line(f"KERNEL void {k.name}({', '.join(params)}) {{")
        with w.indent():
            for b in k.shared:
                ctype = "tc_bool" if b.dtype == "bool" else CTYPE[b.dtype]
                w.line(f"SHARED {ctype} {b.name}[{b.elements}];  // {b.tensor}: a "
                       f"{'x'.join(map(str, b.sizes))} box")
            for v in (*THREAD_IDS, *BLOCK_IDS):
                w.line(f"const int {v} = (int){_IDS[v]};")
            bx, by, _ = k.block
            w.line(f"const int tc_tlin = tc_tx + {bx} * (tc_ty + {by} * tc_tz);")
            for p, value in self._params().items():
                w.line(f"const long {p} = {value};")
            self.block = k.block
            self.pitches = {b.name: b.pitch for b in k.shared}
            for n in k.body:
                self._node(n)
        w.line("}")

    def _params(self) -> dict[str, int]:
        inst = self.scop.inst
        out = {f"p_{k}": v for k, v in inst.sizes.items()}
        ctx = self.scop.context
        import islpy as isl

        for i in range(ctx.dim(isl.dim_type.param)):
            name = ctx.get_dim_name(isl.dim_type.param, i)
            if name is not None and name not in out:
                val = ctx.plain_get_val_if_fixed(isl.dim_type.param, i)
                if val.is_int():
                    out[name] = int(val.to_python())
        return out

    # ---- loops ----
    def _node(self, n: LNode) -> None:
        w = self.w
        if isinstance(n, LSync):
            w.line("SYNC();")
            return
        if isinstance(n, LCopy):
            self._copy(n)
            return
        if isinstance(n, LHold):
            self._hold(n)
            return
        if isinstance(n, LFor) and id(n) in self.slots:
            self._slot_loop(n, lambda: self._body(n.body))
            return
        if isinstance(n, LFor) and n.mapped:
            w.line(f"for ({self.ITYPE} {n.var} = {self._start(n)}; {_top(self._lexpr(n.cond))}; "
                   f"{n.var} += {n.step * n.count}) {{  // {n.mapped}s.{'xyz'[n.dim]}")
            with w.indent():
                self._body(n.body)
            w.line("}")
            return
        if isinstance(n, LFor):
            held = self.held.get(id(n))
            if held is not None:
                self._held_loop(n, *held)
                return
            trips = regtile.trip_bound(n)
            if self.unroll and self.dialect == "cuda" and trips is not None and trips <= self.unroll:
                w.line(f"#pragma unroll {trips}")
            w.line(f"for ({self.ITYPE} {n.var} = {_top(self._lexpr(n.init))}; {_top(self._lexpr(n.cond))}; "
                   f"{n.var} += {n.step}) {{")
            with w.indent():
                self._body(n.body)
            w.line("}")
            return
        super()._node(n)

    def _expr(self, e: Any, env: dict[str, str], s: Any) -> str:
        text = super()._expr(e, env, s)
        return f"tc_h({text})" if e.dtype == "float16" and not isinstance(e, Read) else text

    def _start(self, n: LFor) -> str:
        """The first iteration of mapped loop ``n`` that this block or thread runs."""
        ident = {("block", d): v for d, v in enumerate(BLOCK_IDS)} | {("thread", d): v
                                                                     for d, v in enumerate(THREAD_IDS)}
        tid = ident[(n.mapped, n.dim)]
        init = _top(self._lexpr(n.init))
        s = n.step
        if isinstance(n.init, LInt) and n.init.value == 0:
            return tid if s == 1 else f"{s} * {tid}"
        return (f"{init} + {s} * tc_pmod({tid} - floord({init}, {s}), {n.count})" if s != 1 else
                f"{init} + tc_pmod({tid} - ({init}), {n.count})")

    def _hold(self, h: LHold) -> None:
        """codegen.gpulower's hold: each thread's elements of the target in a register array of
        ``h.slots``, loaded before ``h.loop`` and written back once after it."""
        n, chain, red, call = h.loop, h.chain, h.red, h.call
        st = self.scop.stmt(call.stmt)
        s = self.scop.tc_statement(st.name)
        args = dict(zip(st.indices, call.args))
        w = self.w
        t = self.tensors[s.tensor]
        outer = {name: f"({_top(self._lexpr(args[name]))})" for name in s.lhs}
        target = self._access(s.tensor, tuple(Sym.var(i, "index") for i in s.lhs), outer)
        for k, (f, count) in enumerate(zip(chain, h.slots)):
            self.slots[id(f)] = (f"r{k}", count)
        acc = "acc" + "".join(f"[r{k}]" for k in range(len(chain)))
        w.line(f"{{  // statement {s.number}: each thread keeps its elements of {s.tensor} in registers across "
               f"{n.var}")
        with w.indent():
            w.line(f"{CTYPE[t.dtype]} acc{''.join(f'[{k}]' for k in h.slots)};")
            self._chain_loops(list(chain), f"{acc} = {target};")
            self.held[id(red)] = (call, acc)
            w.line(f"for ({self.ITYPE} {n.var} = {_top(self._lexpr(n.init))}; {_top(self._lexpr(n.cond))}; "
                   f"{n.var} += {n.step}) {{")
            with w.indent():
                self._body(n.body)
            w.line("}")
            del self.held[id(red)]
            self._chain_loops(list(chain), f"{target} = {acc};")
        w.line("}")
        for f in chain:
            del self.slots[id(f)]

    def _slot_loop(self, f: LFor, body: Callable[[], None]) -> None:
        """Thread loop ``f`` as a loop over this thread's slots (a constant count, unrolled, so
        the register array is indexed by constants): slot r holds the thread's r-th iteration."""
        w = self.w
        var, count = self.slots[id(f)]
        if self.dialect == "cuda":
            w.line("#pragma unroll")
        w.line(f"for (int {var} = 0; {var} < {count}; {var}++) {{  // threads.{'xyz'[f.dim]}")
        with w.indent():
            w.line(f"const {self.ITYPE} {f.var} = {self._start(f)} + {var} * {f.step * f.count};")
            w.line(f"if ({_top(self._lexpr(f.cond))}) {{")
            with w.indent():
                body()
            w.line("}")
        w.line("}")

    def _chain_loops(self, chain: list[LFor], stmt: str) -> None:
        def nest(k: int) -> None:
            if k == len(chain):
                self.w.line(stmt)
            else:
                self._slot_loop(chain[k], lambda: nest(k + 1))

        nest(0)

    def _held_loop(self, n: LFor, call: LCall, acc: str) -> None:
        w = self.w
        w.line(f"for ({self.ITYPE} {n.var} = {_top(self._lexpr(n.init))}; {_top(self._lexpr(n.cond))}; "
               f"{n.var} += {n.step}) {{")
        with w.indent():
            self._statement_body(call, acc)
        w.line("}")

    def _copy(self, n: LCopy) -> None:
        w = self.w
        shape = self.shapes[n.tensor]
        pitch = self.pitches[n.buffer]
        rank = len(n.sizes)
        w.line(f"{{  // {n.buffer} <- {n.tensor}, a {'x'.join(map(str, n.sizes))} box")
        with w.indent():
            offs = []
            for d, o in enumerate(n.offsets):
                name = f"{n.buffer}_o{d}"
                w.line(f"const long {name} = {_top(self._lexpr(o))};")
                offs.append(name)
            total = math.prod(n.sizes)
            threads = math.prod(self.block)
            if self.unroll_copies and self.dialect == "cuda":
                w.line("#pragma unroll")
            w.line(f"for (int e = tc_tlin; e < {total}; e += {threads}) {{")
            with w.indent():
                rest = "e"
                for d in reversed(range(rank)):
                    if d == 0:
                        w.line(f"const int j0 = {rest};")
                    else:
                        w.line(f"const int j{d} = {rest} % {n.sizes[d]};")
                        w.line(f"const int q{d} = {rest} / {n.sizes[d]};")
                        rest = f"q{d}"
                inside = " && ".join(f"{offs[d]} + j{d} < {shape[d]}" for d in range(rank))
                src = self._global(n.tensor, [f"({offs[d]} + j{d})" for d in range(rank)])
                w.line(f"if ({inside}) {n.buffer}[{self._shared_index(n.sizes, pitch, [f'j{d}' for d in range(rank)])}]"
                       f" = {src};")
            w.line("}")
            self.promoted[n.tensor] = (n.buffer, tuple(offs), n.sizes, pitch)
            self._body(n.body)
            del self.promoted[n.tensor]
        w.line("}")

    def _global(self, tensor: str, subs: list[str]) -> str:
        st = self.strides[tensor]
        terms = [f"{s} * {st[d]}{self.LONG}" if st[d] != 1 else s for d, s in enumerate(subs) if st[d] != 0]
        return f"{self.var[tensor]}[{' + '.join(terms) or '0'}]"

    @staticmethod
    def _shared_index(sizes: tuple[int, ...], pitch: int, subs: list[str]) -> str:
        dims = [*sizes[:-1], pitch]
        text = subs[0]
        for d in range(1, len(subs)):
            text = f"({text}) * {dims[d]} + {subs[d]}"
        return text

    def _access(self, tensor: str, subs: tuple[Sym, ...], env: dict[str, str],
                checked: list[str] | None = None) -> str:
        p = self.promoted.get(tensor)
        if p is None:
            return super()._access(tensor, subs, env, checked)
        buf, offs, sizes, pitch = p
        texts = [checked[d] if checked is not None else self._sym(sub, env) for d, sub in enumerate(subs)]
        return f"{buf}[{self._shared_index(sizes, pitch, [f'({t} - {o})' for t, o in zip(texts, offs)])}]"


def launch_text(src: GpuSource) -> str:
    """The launches, one per line (for ``kernel.source``)."""
    return "\n".join(f"// launch {k.name}: grid {k.grid}, block {k.block}, {k.shared_bytes} B shared"
                     for k in src.kernels)


__all__ = ["emit", "GpuSource", "LaunchSpec", "DIALECTS", "launch_text"]
