"""GPU mapping: ``isl.Schedule x MappingOptions -> GpuProgram`` (kernels whose loops are spread over
blocks and threads, with shared-memory copies and barriers), checked against the device's limits.

Each outermost band of the schedule tree is tiled (``tile``) and marked: the tile loops become a
kernel's block loops, the point loops its thread loops. After isl builds the AST (with PPCG's
dependence test on every loop), the outermost parallel tile loops are mapped to blocks and the
outermost parallel point loops to threads (innermost to x), each cyclically when there are more
iterations than blocks or threads. What no thread loop covers runs on thread 0. Input tiles that
are reused or read across threads are promoted to shared memory (isl boxes of their footprint),
and barriers go where a dependence links two threads of a block with no barrier between them
(tested with isl on each call site's instance-to-loop map).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import islpy as isl

from tcdsl.core.affine import Sym
from tcdsl.core.checked import Read, reads
from tcdsl.core.errors import TcScheduleError
from tcdsl.core.options import MappingOptions

from . import astgen
from .deps import Deps
from .distribute import distribute
from .loopir import (
    LCall,
    LCopy,
    LExpr,
    LFor,
    LIf,
    LInt,
    LMark,
    LNode,
    LoopIR,
    LOp,
    LSync,
    LVar,
    expr_text,
    expr_vars,
    trip_bound,
    walk,
)
from .schedule import check_legal
from .scop import Scop

DEFAULT_TILE = (32, 32, 32)  # TC's naive mapping options
DEFAULT_BLOCKS = (256, 256)
DEFAULT_THREADS = (32, 8)
UNTILED = 1 << 30  # a tile size of 0 leaves the member whole
THREAD_IDS = ("tc_tx", "tc_ty", "tc_tz")
BLOCK_IDS = ("tc_bx", "tc_by", "tc_bz")


@dataclass(frozen=True)
class GpuTarget:
    """The limits a mapping must fit (an sm_90 device unless told otherwise)."""

    name: str = "sm_90"
    max_threads: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared: int = 48 * 1024  # bytes of static shared memory per block


SM90 = GpuTarget()


@dataclass(frozen=True)
class SharedBuffer:
    name: str
    tensor: str
    dtype: str
    sizes: tuple[int, ...]  # elements per dim of the box
    pitch: int  # elements per row of the innermost dim (padded against bank conflicts)

    @property
    def elements(self) -> int:
        return math.prod(self.sizes[:-1]) * self.pitch


@dataclass(frozen=True)
class GpuKernel:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    body: tuple[LNode, ...]
    shared: tuple[SharedBuffer, ...]
    shared_bytes: int

    def __str__(self) -> str:
        head = (f"kernel {self.name}<<<grid {self.grid}, block {self.block}>>> shared {self.shared_bytes} B"
                + "".join(f"\n  shared {b.name}: {b.tensor} box {'x'.join(map(str, b.sizes))} pitch {b.pitch}"
                          for b in self.shared))
        body = "\n".join("  " + line for line in str(LoopIR(self.body)).splitlines())
        return f"{head}\n{body}"


@dataclass(frozen=True)
class GpuProgram:
    kernels: tuple[GpuKernel, ...]  # launched in this order

    def __str__(self) -> str:
        return "\n\n".join(str(k) for k in self.kernels)


def check_options(options: MappingOptions, target: GpuTarget) -> None:
    """The static resource proof for what the options ask for: threads per block, grid sizes and
    shared memory within the device's limits (raises ``TcScheduleError`` naming the option)."""
    threads = options.threads or DEFAULT_THREADS
    if math.prod(threads) > target.max_threads:
        raise TcScheduleError(f"threads={tuple(threads)} asks for {math.prod(threads)} threads per block; "
                              f"{target.name} allows {target.max_threads}")
    for d, n in enumerate(threads):
        if n > target.max_block[d]:
            raise TcScheduleError(f"threads={tuple(threads)}: {'xyz'[d]} is {n}, {target.name} allows "
                                  f"{target.max_block[d]}")
    for d, n in enumerate(options.blocks or DEFAULT_BLOCKS):
        if n > target.max_grid[d]:
            raise TcScheduleError(f"blocks={tuple(options.blocks or ())}: {'xyz'[d]} is {n}, {target.name} allows "
                                  f"{target.max_grid[d]}")
    if options.max_shared_memory is not None and options.max_shared_memory > target.max_shared:
        raise TcScheduleError(f"max_shared_memory={options.max_shared_memory} bytes exceeds the "
                              f"{target.max_shared} bytes of shared memory a block has on {target.name}")


# ---- the schedule tree: tile and mark each outer band ------------------------------------------


def mark_tree(sched: isl.Schedule, options: MappingOptions) -> isl.Schedule:
    """Tile each outermost band with ``tile`` and mark it: ``gpu_kernel`` above the tile band,
    ``gpu_point`` above the point band (an untiled band gets both marks)."""
    tile = options.tile or DEFAULT_TILE

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        t = node.get_type()
        if t == isl.schedule_node_type.band:
            return _tile_and_mark(node, tile)
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return visit(sched.get_root()).get_schedule()


def split_serial(sched: isl.Schedule, deps: Deps) -> isl.Schedule:
    """Outer bands whose outer loop is serial (it carries a dependence, as a full reduction fused
    with its consumer) are distributed into one band per statement, in textual order, where that
    is legal: each then becomes a kernel of its own, whose loops can spread over blocks."""
    root = sched.get_root()
    tried: set[tuple[int, ...]] = set()
    for _ in range(64):
        path = _outer_band(root, (), tried)
        if path is None:
            break
        tried.add(path)
        node = root
        for i in path:
            node = node.child(i)
        done = distribute(node, deps)
        if done is not None:
            root = done.root()
    return root.get_schedule()


def _outer_band(node: isl.ScheduleNode, path: tuple[int, ...], skip: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first outermost band (none above it) that is serial in its outer member and schedules
    several statements."""
    if node.get_type() == isl.schedule_node_type.band:
        n = node.get_domain().n_set()
        if path not in skip and not node.band_member_get_coincident(0) and n > 1:
            return path
        return None
    for i in range(node.n_children()):
        found = _outer_band(node.child(i), path + (i,), skip)
        if found is not None:
            return found
    return None


def _tile_and_mark(band: isl.ScheduleNode, tile: tuple[int, ...]) -> isl.ScheduleNode:
    n = band.band_n_member()
    sizes = [tile[i] if i < len(tile) else 0 for i in range(n)]
    if (band.band_get_permutable() or n == 1) and any(s > 0 for s in sizes):
        ctx = band.get_ctx()
        mv = isl.MultiVal.zero(band.band_get_space())
        for i, s in enumerate(sizes):
            mv = mv.set_val(i, isl.Val.int_from_si(ctx, s if s > 0 else UNTILED))
        band = band.band_tile(mv)
        band = band.child(0).insert_mark(isl.Id("gpu_point")).parent()
        return band.insert_mark(isl.Id("gpu_kernel"))
    return band.insert_mark(isl.Id("gpu_point")).insert_mark(isl.Id("gpu_kernel"))


# ---- the AST, with marks and call sites --------------------------------------------------------


def build_ast(sched: isl.Schedule, scop: Scop, deps: Deps) -> tuple[list[LNode], list[isl.Map]]:
    """Loop IR of ``sched`` with its marks kept; each call names its site: the map from the
    statement's instances to the values of the loops around the call, outermost first."""
    errors: list[BaseException] = []
    notes: list[astgen.Witness] = []
    sites: list[isl.Map] = []

    def at_domain(node: isl.AstNode, b: isl.AstBuild) -> isl.AstNode:
        try:
            sites.append(isl.Map.from_union_map(b.get_schedule()).flatten_range())
            return node.set_annotation(isl.Id(f"site{len(sites) - 1}"))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            return node

    ab = isl.AstBuild.from_context(scop.context)
    ab, _h1 = ab.set_before_each_for(astgen.loop_annotator(deps.all, notes, errors))
    ab, _h2 = ab.set_at_each_domain(at_domain)
    root = ab.node_from_schedule(sched)
    if errors:
        raise errors[0]
    return _node(root, notes), sites


def _node(n: isl.AstNode, notes: list[astgen.Witness]) -> list[LNode]:
    t = n.get_type()
    if t == isl.ast_node_type.mark:
        return [LMark(n.mark_get_id().get_name(), tuple(_node(n.mark_get_node(), notes)))]
    if t == isl.ast_node_type.user:
        (call,) = astgen._node(n, notes)
        assert isinstance(call, LCall)
        ann = n.get_annotation()
        return [replace(call, site=int(ann.get_name()[4:]))]
    if t == isl.ast_node_type.block:
        lst = n.block_get_children()
        out: list[LNode] = []
        for i in range(lst.n_ast_node()):
            out.extend(_node(lst.get_at(i), notes))
        return out
    if t == astgen._FOR:
        (f,) = astgen._node(n, notes)  # for the loop's own fields; the body again, with marks
        assert isinstance(f, LFor)
        return [replace(f, body=tuple(_node(n.for_get_body(), notes)))]
    if t == astgen._IF:
        other = tuple(_node(n.if_get_else_node(), notes)) if n.if_has_else_node() else ()
        return [LIf(astgen._expr(n.if_get_cond()), tuple(_node(n.if_get_then_node(), notes)), other)]
    raise TcScheduleError(f"unexpected isl AST node type {t}")


# ---- mapping ---------------------------------------------------------------------------------------


def map_program(sched: isl.Schedule, scop: Scop, deps: Deps, options: MappingOptions,
                target: GpuTarget = SM90, name: str = "tc") -> tuple[isl.Schedule, GpuProgram]:
    """The marked schedule and the kernels: one per top-level nest of the schedule, in order."""
    check_options(options, target)
    marked = mark_tree(split_serial(sched, deps), options)
    check_legal(marked, deps)
    nodes, sites = build_ast(marked, scop, deps)
    budget = options.max_shared_memory if options.max_shared_memory is not None else target.max_shared
    kernels = []
    for k, item in enumerate(nodes):
        m = _Mapper(scop, deps, options, sites, budget, f"{name}_k{k}")
        kernels.append(m.kernel(item))
    return marked, GpuProgram(tuple(kernels))


@dataclass
class _Chain:
    loops: list[LFor]  # outermost first
    counts: list[int]  # threads (or blocks) per loop, same order


class _Mapper:
    def __init__(self, scop: Scop, deps: Deps, options: MappingOptions, sites: list[isl.Map], budget: int,
                 name: str) -> None:
        self.scop = scop
        self.deps = deps
        self.options = options
        self.sites = sites
        self.budget = budget
        self.name = name
        self.blocks = options.blocks or DEFAULT_BLOCKS
        self.threads = options.threads or DEFAULT_THREADS
        self.shared: list[SharedBuffer] = []
        self.shared_bytes = 0

    def kernel(self, item: LNode) -> GpuKernel:
        body: tuple[LNode, ...] = item.body if isinstance(item, LMark) and item.name == "gpu_kernel" else (item,)
        body, grid = self._map_blocks(body)
        chains: list[_Chain] = []
        self._find_chains(body, False, chains)
        block = [1, 1, 1]
        for ch in chains:
            for pos, f in enumerate(ch.loops):
                d = len(ch.loops) - 1 - pos
                bound = trip_bound(f)
                n = self.threads[d] if bound is None else max(1, min(self.threads[d], bound))
                block[d] = max(block[d], n)
        self.block = (block[0], block[1], block[2])
        body = tuple(self._map_threads(body, False, []))
        body = tuple(self._sync(body, []))
        return GpuKernel(self.name, grid, self.block, body, tuple(self.shared), self.shared_bytes)

    # -- blocks --
    def _map_blocks(self, body: tuple[LNode, ...]) -> tuple[tuple[LNode, ...], tuple[int, int, int]]:
        """The outermost parallel tile loops go to blocks (innermost of them to x). Where the tiles
        leave none (a single tile per member: conv's batch and group loops under 32x32x32), the
        outer parallel point loops above the thread loops go to blocks instead of running in
        every thread of one block."""
        chain = self._block_chain(body, allow_point=False) or self._block_chain(body, allow_point=True)
        grid = [1, 1, 1]
        dims: dict[int, int] = {}
        for pos, f in enumerate(chain):
            d = len(chain) - 1 - pos
            trips = trip_bound(f)
            grid[d] = self.blocks[d] if trips is None else max(1, min(self.blocks[d], trips))
            dims[id(f)] = d

        def rebuild(nodes: tuple[LNode, ...]) -> tuple[LNode, ...]:
            if len(nodes) != 1 or not dims:
                return nodes
            n = nodes[0]
            if isinstance(n, LMark):
                return (LMark(n.name, rebuild(n.body)),)
            if isinstance(n, LFor) and id(n) in dims:
                d = dims.pop(id(n))
                return (replace(n, body=rebuild(n.body), mapped="block", dim=d, count=grid[d]),)
            return nodes

        return rebuild(body), (grid[0], grid[1], grid[2])

    def _block_chain(self, nodes: tuple[LNode, ...], allow_point: bool) -> list[LFor]:
        chain: list[LFor] = []
        in_point = False
        while len(chain) < min(len(self.blocks), 3) and len(nodes) == 1:
            n = nodes[0]
            if isinstance(n, LMark):
                if n.name == "gpu_point" and not allow_point:
                    break
                in_point = in_point or n.name == "gpu_point"
                nodes = n.body
            elif isinstance(n, LFor) and n.parallel and not (in_point and self._chain_starts(n)):
                chain.append(n)
                nodes = n.body
            else:
                break
        return chain

    # -- threads --
    def _chain_starts(self, f: LFor) -> bool:
        """Whether the thread loops start at the parallel loop ``f``: the innermost parallel loops
        of a perfect nest go to threads (the innermost to x, for coalescing); the parallel loops
        above them stay loops that every thread of the block runs."""
        run, g = 1, f
        while len(g.body) == 1 and isinstance(g.body[0], LFor) and g.body[0].parallel:
            g = g.body[0]
            run += 1
        return run <= min(len(self.threads), 3)

    def _chain_at(self, f: LFor) -> list[LFor]:
        chain = [f]
        while len(chain) < min(len(self.threads), 3) and len(chain[-1].body) == 1 \
                and isinstance(chain[-1].body[0], LFor) and chain[-1].body[0].parallel:
            chain.append(chain[-1].body[0])
        return chain

    def _find_chains(self, nodes: tuple[LNode, ...], in_point: bool, out: list[_Chain]) -> None:
        for n in nodes:
            if isinstance(n, LMark):
                self._find_chains(n.body, in_point or n.name == "gpu_point", out)
            elif isinstance(n, LFor):
                if in_point and n.parallel and not n.mapped and self._chain_starts(n):
                    out.append(_Chain(self._chain_at(n), []))
                else:
                    self._find_chains(n.body, in_point, out)
            elif isinstance(n, LIf):
                self._find_chains(n.then, in_point, out)
                self._find_chains(n.other, in_point, out)

    def _has_chain(self, n: LFor, in_point: bool) -> bool:
        found: list[_Chain] = []
        self._find_chains((n,), in_point, found)
        return bool(found)

    def _map_threads(self, nodes: tuple[LNode, ...], in_point: bool, around: list[LFor]) -> list[LNode]:
        """``nodes`` with thread loops mapped, promoted and guarded; ``around``: the uniform loops
        (run by every thread of the block) that enclose them."""
        out: list[LNode] = []
        for n in nodes:
            if isinstance(n, LMark):
                out.extend(self._map_threads(n.body, in_point or n.name == "gpu_point", around))
            elif isinstance(n, LFor) and in_point and n.parallel and not n.mapped and self._chain_starts(n):
                out.extend(self._thread_region(n, around))
            elif isinstance(n, LFor) and not self._has_chain(n, in_point):
                out.append(_only_thread_zero((_unmark(n),), range(3), self.block))  # one thread runs it all
            elif isinstance(n, LFor):
                out.append(replace(n, body=tuple(self._map_threads(n.body, in_point, [*around, n]))))
            elif isinstance(n, LIf):
                out.append(LIf(n.cond, tuple(self._map_threads(n.then, in_point, around)),
                               tuple(self._map_threads(n.other, in_point, around))))
            else:
                out.append(_only_thread_zero((n,), range(3), self.block))
        return out

    def _thread_region(self, f: LFor, around: list[LFor]) -> list[LNode]:
        chain = self._chain_at(f)

        def rebuild(g: LFor, pos: int) -> LFor:
            d = len(chain) - 1 - pos
            body = g.body if pos == len(chain) - 1 else (rebuild(g.body[0], pos + 1),)  # type: ignore[arg-type]
            return replace(g, body=body, mapped="thread", dim=d, count=self.block[d])

        region: LNode = rebuild(f, 0)
        region = _only_thread_zero((region,), range(len(chain), 3), self.block)
        copies = self._promote(region, chain, around)
        if not copies:
            return [region]
        inner: LNode = region
        wrapped: tuple[LNode, ...] = (LSync(), inner)
        for c in reversed(copies):
            wrapped = (replace(c, body=wrapped),)
        # the next copy into these buffers (another iteration of a loop around) waits for every read
        return [*wrapped, LSync()] if around else list(wrapped)

    # -- shared memory --
    def _promote(self, region: LNode, chain: list[LFor], around: list[LFor]) -> list[LCopy]:
        if not self.options.shared_memory:
            return []
        c = self.scop.inst.checked
        inputs = {t.name for t in c.inputs}
        calls = [n for n in walk((region,)) if isinstance(n, LCall)]
        region_loops = {n.var for n in walk((region,)) if isinstance(n, LFor)}
        x_var = chain[-1].var
        promotable: dict[str, bool] = {}
        wanted: set[str] = set()
        for call in calls:
            st = self.scop.stmt(call.stmt)
            if st.kind != "update":
                continue
            s = self.scop.tc_statement(st.name)
            args = dict(zip(st.indices, call.args))
            for r in reads(s.rhs):
                if r.tensor not in inputs or not r.subs:
                    continue
                ok = not r.conditional and all(isinstance(x, Sym) for x in r.subs)
                promotable[r.tensor] = promotable.get(r.tensor, True) and ok
                if ok and _worth_promoting(r, args, region_loops, x_var):
                    wanted.add(r.tensor)
        copies: list[LCopy] = []
        for tensor, ok in promotable.items():
            if not ok or tensor not in wanted:
                continue
            box = self._footprint(tensor, calls, around)
            if box is None:
                continue
            offsets, sizes = box
            t = next(x for x in c.inputs if x.name == tensor)
            pitch = sizes[-1] + 1 if sizes[-1] % 32 == 0 else sizes[-1]
            buf = SharedBuffer(f"sh{len(self.shared)}", tensor, t.dtype, sizes, pitch)
            nbytes = buf.elements * _itemsize(t.dtype)
            if self.shared_bytes + nbytes > self.budget:
                continue
            self.shared.append(buf)
            self.shared_bytes += nbytes
            copies.append(LCopy(buf.name, tensor, offsets, sizes, ()))
        return copies

    def _footprint(self, tensor: str, calls: list[LCall], around: list[LFor]
                   ) -> tuple[tuple[LExpr, ...], tuple[int, ...]] | None:
        """The box of ``tensor`` the calls read, per iteration of the loops ``around``: its start
        (expressions of those loops) and its size (the largest over all iterations)."""
        arr = self.scop.arrays[tensor]
        nu = len(around)
        total: isl.Map | None = None
        for call in calls:
            site = self.sites[call.site]
            elements = isl.UnionSet(f"{{ {arr}[{', '.join(f'e{i}' for i in range(_rank(self.scop, tensor)))}] }}")
            acc = self.scop.reads.intersect_domain(isl.UnionSet.from_set(site.domain())).intersect_range(elements)
            if acc.is_empty():
                continue
            m = isl.UnionMap.from_map(site).reverse().apply_range(acc)
            fp = isl.Map.from_union_map(m)
            fp = fp.project_out(isl.dim_type.in_, nu, fp.dim(isl.dim_type.in_) - nu)
            fp = fp.set_tuple_name(isl.dim_type.in_, "U")
            total = fp if total is None else total.union(fp)
        if total is None:
            return None
        npar = total.dim(isl.dim_type.param)
        fp = total.move_dims(isl.dim_type.param, npar, isl.dim_type.in_, 0, nu)
        for i, f in enumerate(around):
            fp = fp.set_dim_name(isl.dim_type.param, npar + i, f.var)
        box = fp.range()
        build = isl.AstBuild.from_context(box.params())
        offsets, sizes = [], []
        for d in range(box.dim(isl.dim_type.set)):
            lo, hi = box.dim_min(d), box.dim_max(d)
            try:
                extent = hi.sub(lo).max_val()
            except isl.Error:  # bounds with integer divisions (tiles that do not divide a stride): not promoted
                return None
            if not extent.is_int():
                return None
            sizes.append(int(extent.to_python()) + 1)
            offsets.append(astgen._expr(build.expr_from_pw_aff(lo)))
        return tuple(offsets), tuple(sizes)

    # -- barriers --
    def _sync(self, nodes: tuple[LNode, ...], encl: list[LFor]) -> list[LNode]:
        """Barriers in the uniform body ``nodes`` (inside the loops ``encl``): between two of its
        parts wherever a dependence runs from one thread's instance in the first to another
        thread's in the second, with no barrier between; at the end of a loop body where such a
        dependence crosses iterations."""
        items: list[LNode] = []
        for n in nodes:  # the parts themselves first
            if isinstance(n, LFor) and n.mapped != "thread":
                items.append(replace(n, body=tuple(self._sync(n.body, [*encl, n]))))
            elif isinstance(n, LIf) and not _thread_guard(n):
                items.append(LIf(n.cond, tuple(self._sync(n.then, encl)), tuple(self._sync(n.other, encl))))
            elif isinstance(n, LCopy):
                items.append(replace(n, body=tuple(self._sync(n.body, encl))))
            else:
                items.append(n)
        sites = [self._sites_in(n, encl) for n in items]
        out: list[LNode] = []
        start = 0  # first part after the last barrier
        for b, n in enumerate(items):
            if isinstance(n, LSync):
                out.append(n)
                start = b + 1
                continue
            if any(self._crosses(sa, sb, len(encl), False) for a in range(start, b) for sa in sites[a]
                   for sb in sites[b]):
                out.append(LSync())
                start = b
            out.append(n)
        if encl and encl[-1].mapped != "block":
            bars = [i for i, n in enumerate(items) if isinstance(n, LSync)]
            first = bars[0] if bars else len(items)
            last = bars[-1] + 1 if bars else 0
            if any(self._crosses(sa, sb, len(encl) - 1, True) for a in range(last, len(items)) for sa in sites[a]
                   for b in range(first) for sb in sites[b]):
                out.append(LSync())
        return out

    def _sites_in(self, n: LNode, encl: list[LFor]) -> list[tuple[LCall, list[LFor], bool]]:
        """(call, the loops around it, whether thread 0 runs it alone) for each call in ``n``."""
        out: list[tuple[LCall, list[LFor], bool]] = []

        def visit(x: LNode, loops: list[LFor], single: bool) -> None:
            if isinstance(x, LCall):
                out.append((x, loops, single))
            elif isinstance(x, LFor):
                for b in x.body:
                    visit(b, [*loops, x], single)
            elif isinstance(x, LIf):
                guard = _thread_guard(x) and not any(isinstance(y, LFor) and y.mapped == "thread"
                                                     for y in walk(x.then))
                for b in (*x.then, *x.other):
                    visit(b, loops, single or guard)
            elif isinstance(x, (LMark, LCopy)):
                for b in x.body:
                    visit(b, loops, single)

        visit(n, list(encl), False)
        return out

    def _crosses(self, a: tuple[LCall, list[LFor], bool], b: tuple[LCall, list[LFor], bool], common: int,
                 carried: bool) -> bool:
        """Whether a dependence runs from an instance of call ``a`` to one of call ``b`` on another
        thread, both in the same iteration of the first ``common`` loops (and, ``carried``, in a
        later iteration of the next one)."""
        (ca, la, sa), (cb, lb, sb) = a, b
        ma, mb = self.sites[ca.site], self.sites[cb.site]
        rel = isl.UnionMap.from_map(ma).reverse().apply_range(self.deps.all).apply_range(isl.UnionMap.from_map(mb))
        if rel.is_empty():
            return False
        ta, tb = _thread_ids(la, sa, "a"), _thread_ids(lb, sb, "b")
        differ = " or ".join(f"({x}) != ({y})" for x, y in zip(ta, tb) if x != y or x != "0")
        if not differ:
            return False
        cons = [f"a{i} = b{i}" for i in range(common)]
        if carried:
            cons.append(f"a{common} < b{common}")
        cons.append(f"({differ})")
        va = ", ".join(f"a{i}" for i in range(len(la)))
        vb = ", ".join(f"b{i}" for i in range(len(lb)))
        test = isl.Map(f"{{ [{va}] -> [{vb}] : {' and '.join(cons)} }}")
        return not isl.Map.from_union_map(rel).intersect(test).is_empty()


def _unmark(n: LNode) -> LNode:
    """``n`` without marks."""
    if isinstance(n, LMark):
        inner = tuple(_unmark(b) for b in n.body)
        return inner[0] if len(inner) == 1 else LIf(LInt(1), inner)
    if isinstance(n, LFor):
        return replace(n, body=tuple(_unmark(b) for b in n.body))
    if isinstance(n, LIf):
        return LIf(n.cond, tuple(_unmark(b) for b in n.then), tuple(_unmark(b) for b in n.other))
    return n


def _thread_ids(loops: list[LFor], single: bool, prefix: str) -> list[str]:
    """The thread id (x, y, z) of an instance, as isl expressions of its loop values."""
    ids = ["0", "0", "0"]
    if single:
        return ids
    for pos, f in enumerate(loops):
        if f.mapped == "thread":
            v = f"{prefix}{pos}"
            ids[f.dim] = f"({v}) mod {f.count}" if f.step == 1 else f"floor(({v})/{f.step}) mod {f.count}"
    return ids


def _thread_guard(n: LIf) -> bool:
    return bool(expr_vars(n.cond) & set(THREAD_IDS))


def _only_thread_zero(nodes: tuple[LNode, ...], dims: range, block: tuple[int, int, int]) -> LNode:
    """``nodes`` run by the threads whose ids in ``dims`` are 0 (the others would repeat them)."""
    conds = [LOp("==", (LVar(THREAD_IDS[d]), LInt(0))) for d in dims if block[d] > 1]
    if not conds:
        return nodes[0] if len(nodes) == 1 else LIf(LInt(1), nodes)
    cond = conds[0]
    for c in conds[1:]:
        cond = LOp("&&", (cond, c))
    return LIf(cond, nodes)


def _worth_promoting(r: Read, args: dict[str, LExpr], region_loops: set[str], x_var: str) -> bool:
    """Reuse (a loop of the region does not move the read) or an uncoalesced read (the x thread
    loop moves a dim other than the last)."""
    used: set[str] = set()
    per_dim: list[set[str]] = []
    for sub in r.subs:
        vs: set[str] = set()
        assert isinstance(sub, Sym)
        for i in sub.indices():
            vs |= expr_vars(args[i])
        per_dim.append(vs)
        used |= vs
    reuse = bool(region_loops - used)
    uncoalesced = any(x_var in vs for vs in per_dim[:-1])
    return reuse or uncoalesced


def _rank(scop: Scop, tensor: str) -> int:
    return len(scop.inst.shapes[tensor])


def _itemsize(dtype: str) -> int:
    import numpy as np

    if dtype == "float16":
        return 4  # held as float on the device
    return int(np.dtype(dtype).itemsize) if dtype != "bool" else 1


__all__ = ["GpuTarget", "SM90", "GpuKernel", "GpuProgram", "SharedBuffer", "map_program", "check_options",
           "mark_tree", "build_ast", "expr_text"]
