"""C emitter: ``LoopIR x Scop -> CSource`` (one C function, OpenMP-parallel, restrict pointers).

Every identifier is generated (tensors ``t0..``, iterators ``c0..``, statement indices ``x0..``),
so no TC name reaches the C text except inside ``//`` comments naming each statement. Tensor
accesses are linearised with the call's element strides; gathers, conditional reads and integer
division are checked and report an error code instead of touching memory out of bounds.

Below it, in the order it builds on them: codegen.cprelude (the runtime text every kernel starts
with), codegen.cexpr (expressions and statement instances), codegen.cpack (packs and transposes)
and codegen.ctile (register tiles); this module prints the function around them and its loops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tcdsl.core import dtypes as T
from tcdsl.core.affine import Sym
from tcdsl.core.checked import read_tuple
from tcdsl.core.instance import fully_written
from tcdsl.core.printer import stmt as print_stmt
from tcdsl.polyhedral.cputarget import CpuTarget
from tcdsl.polyhedral.loopir import (
    LAccum,
    LCall,
    LDecl,
    LFor,
    LIf,
    LNode,
    LoopIR,
    LPack,
    LReset,
    LTile,
    LTranspose,
    trip_count,
    walk,
)
from tcdsl.polyhedral.scop import Scop

from . import mathlib, memshare, transpose, vecexpr, vecisa, vecloop
from .cexpr import CTYPE, ErrorSite
from .cpack import PackEmitter
from .cprelude import NO_COMMONING, PRELUDE, mvexp_decl, simd_letter, vector_exp, vector_math_decls
from .ctile import TileEmitter
from .writer import unparen as _top


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


class _Emitter(TileEmitter, PackEmitter):
    def __init__(self, scop: Scop, strides: dict[str, tuple[int, ...]], fn: str, vectorize: bool,
                 vector_math: bool, unroll: int = 0, target: CpuTarget | None = None) -> None:
        super().__init__(scop, strides, target, vectorize, vector_math, unroll)
        self.fn = fn
        self.partials: dict[int, dict[str, str]] = {}  # id(privatised row loop) -> target -> its partial rows

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
        self.vector_code = self.vectorize and uses_exp and simd_letter(self.target) is not None and \
            not vecexpr.libmvec_exp(self)
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
            mvexp = mvexp_decl(self.target) if "tc_vf_mvexp(" in w.text() else ""
            w.insert(vector_prelude, vecisa.prelude(self.target) + mvexp)
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


def _streams(nodes: tuple[LNode, ...]) -> bool:
    """Whether a vector loop among ``nodes`` streams its stores (vecloop.streamed)."""
    return any(isinstance(x, LFor) and x.vector is not None and bool(x.vector.stream) for x in walk(nodes))


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
