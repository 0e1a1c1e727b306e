"""Register tiles in C: ``LTile -> C text``, a reduction's target held in a local array (in
registers) across the tile's serial loops (codegen.regtile), in the target's vectors
(codegen.vectile) beside the scalar tile; a base class of the C emitter (codegen.c)."""

from __future__ import annotations

from tcdsl.core import dtypes as T
from tcdsl.core.affine import Sym
from tcdsl.core.checked import reads
from tcdsl.polyhedral.loopir import LCall, LFor, LInt, LTile, expr_vars, trip_count

from . import vectile
from .cexpr import CTYPE, ExprEmitter, index_names, literal
from .writer import unparen as _top


class TileEmitter(ExprEmitter):
    """Prints register tiles, in vectors and in scalars."""

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
        start = literal(T.identity(s.op, self.tensors[s.tensor].dtype), ctype)
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
                if isinstance(sub, Sym) or not reads(sub) or index_names(sub) & moved:
                    continue
                env = {i: f"({_top(self._lexpr(args[i]))})" for i in index_names(sub)}
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
