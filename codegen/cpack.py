"""Packs and transposes in C: ``LPack -> C text``, the panels of an operand a register tile
reads, copied into a heap buffer before it, and ``LTranspose -> C text``, a copy nest moved through
registers in blocks (codegen.transpose); a base class of the C emitter (codegen.c)."""

from __future__ import annotations

import math

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Read, reads
from tcdsl.core.printer import stmt as print_stmt
from tcdsl.polyhedral.loopir import LCall, LFor, LNode, LOp, LPack, LTile, LTranspose, trip_bound, walk_paths

from . import memshare, transpose
from .cexpr import CTYPE, ExprEmitter
from .writer import unparen as _top

# A copy into packed panels this large, made once before the parallel loops that read it, is made
# by every thread: matmul's B (4 MB at 960x1000x1088 on AVX2); a padded conv's weight gradient
# 8x64x56x56 packed its input (6 MB) for each of its eight boundary pieces (2 threads: 94 -> 86 ms).
# A small one (a conv's weights) stays serial.
PARALLEL_PACK_BYTES = 1 << 18
PANEL_ROWS = 64  # steps of a transposed pack's panels copied as one block (LPack.source)


class PackEmitter(ExprEmitter):
    """Prints packs and transposes; a pack's body goes back through ``_body``, the C emitter's."""

    def _body(self, body: tuple[LNode, ...]) -> None:
        """The C text of ``body``: the C emitter's hook (codegen.c), which prints every kind of node."""
        raise NotImplementedError

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

    @staticmethod
    def _pack_bytes(p: LPack, size: int) -> str:
        """The C expression of a pack buffer's bytes: one copy, or one per thread."""
        return f"{size}L" if p.shared else f"tc_threads * {size}L"

    def _pack_elements(self, p: LPack) -> int:
        """Elements of one thread's buffer: the panels, rounded up to whole 64-byte lines (each
        thread's buffer stays aligned, and aligned_alloc gets a multiple of its alignment)."""
        per_line = 64 // self._itemsize(p.tensor)
        blocks = math.prod(c[3] for c in p.chunks)
        return -(-blocks * p.panels * p.depth * p.width // per_line) * per_line

    def _pack(self, p: LPack) -> None:
        """The panels of ``p`` copied into this thread's part of its buffer (``_pack_buffers``),
        then its body, whose vector tile reads them (codegen.vecexpr.vexpr) instead of the tensor."""
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
