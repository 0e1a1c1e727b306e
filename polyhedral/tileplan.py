"""CPU transformation, the tiling plan: ``list[MemberInfo] x MappingOptions x CpuTarget -> Plan``,
one band's cache tile sizes, point loop order and register tiles (the options' where given, else
the default heuristic for the target), which polyhedral.transform applies to the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tcdsl.core.options import MappingOptions

from .cputarget import GENERIC, CpuTarget
from .members import MemberInfo

ROW_REGISTER_ONE = 6  # register-tile rows of a contraction with one row member
ROW_TILES_PER_CACHE_TILE = 8  # its cache tile: eight register tiles
# Where the operand panels get packed (CpuTarget.panel_conflicts), a row cache tile of up to 144
# rows shares each copy of the panels among up to 24 register tiles (AVX2 matmul 1024^3 on 2
# threads: 152 -> 169 GFLOP/s); the rows are cut into a multiple of eight tiles of nearly equal
# size, so that 2, 4 or 8 threads get equal shares (1024 rows: 8 tiles of 132, not 7 of 144 and
# one of 16). Unpacked, the 48-row tiles balance better (AVX2 960x1000x1088: 201 against 140).
PACKED_ROW_FACTOR, PACKED_ROW_BLOCKS = 3, 8
COLUMN_TILE_ACCUMULATORS = 16  # AVX-512's 4 x 4 conv tile along the columns; fewer: channel vectors (plan)
FILLED_ROWS = 15 / 16  # conv rows filling this share of their vectors' lanes keep them on AVX-512 (plan)
BAND_L2_SHARE = 8  # a conv's band of output rows reads its input rows in this share of L2 (plan)
# A copy that reads along one member and writes along another (a transpose) is moved in tiles of
# 64 target rows x 1024 target columns: each group of 16 source rows is read in 256-byte runs
# and each target line is written whole (4096^2: 4.5 ms against 5.8 ms for 256 x 256 tiles)
SMALL_WINDOW = 4  # reductions this short go outside a contiguous output loop (see plan)
NARROW = 8  # a contiguous member narrower than this many elements or a vector is narrow beside a row sum (plan)
CROSS_TILE = 64
CROSS_CONTIG_TILE = 1024
# channel vectors per tile in plan's AVX2 conv form, the first that divides the channels: three for
# 24 channels (the input gradient of a 24-channel conv, 6x24x30x30 with 40 filters, 2 threads, paired
# rounds: 1.27-1.29x the tile along the columns it took before); five (40 filters) gained nothing
CHANNEL_VECTORS = (4, 3, 2)
# the shortest reduction (channels x window) over which rows that leave lanes idle take one vector of
# channels (plan): shorter, the tile's scattered stores outweigh the lanes gained (16 filters over
# 8 or 16 channels, 3x3: 0.93-0.95x on AVX-512, 0.67x on AVX2, paired rounds)
ONE_VECTOR_STEPS = 256
MAX_STRIDE = 4  # rows read this many elements apart at most count as a strided conv's (plan)
# A conv in channel vectors whose output advances a multiple of this many bytes from one channel
# to the next (planes of 32x32 or 64x64 float32) stores its tile's channels into lines of one L1
# set: a tile of all its channels, 4 vectors x 3 columns, writes 32 lines into 8 ways, and each
# next tile refetches them. One vector of channels x 12 columns writes 8 lines, which stay
# (plan). AVX2 (Zen 4), 2 threads, 15 interleaved rounds, the same bits: 8x16x34x34 with 32 filters
# 3x3 (32x32 out) 0.73-0.77 -> 0.47-0.48 ms, 66x66 3.0-3.1 -> 1.9-2.0, padded 8x16x32x32 0.77-0.93 ->
# 0.60-0.84, padded 4x16x64x64 1.86 -> 1.30, 24 filters 0.56 -> 0.36, 16 filters 0.49 -> 0.44, 3
# channels 0.49 -> 0.19, 5x5 windows 1.46 -> 1.30 (32x32 out) and 2.09 -> 1.95 (padded); even on
# padded 16x32x32x32 (2.49 -> 2.68 in one run, 2.20 -> 2.01 in another), a 7x7 window padded
# 1.86 -> 1.91. 64 filters (two tiles of channels) keep theirs: 8x64x34x34 3.64 -> 3.97 in this form.
ALIAS_BYTES = 4096

@dataclass(frozen=True)
class Plan:
    tile: list[int]  # per band member (original order); 0 or 1: untiled
    order: list[int]  # the point loops, outermost first (original member numbers)
    register: list[int]  # register-tile size per point loop (in ``order``); 1: none
    singles: frozenset[int] = frozenset()  # members stepped one at a time in the tile band (a batch, outermost)


def scatter_plan(infos: list[MemberInfo], coincident: list[bool], target: CpuTarget = GENERIC,
                 itemsize: int = 4) -> Plan:
    """A scatter's band: its non-parallel members move the element it adds into with the data, so
    no register tile holds it across them. The parallel member walking memory is cut into chunks
    of whole vectors, at least two per core, whose loop runs outermost (the threads' shares); the
    loops over the data run inside it, and the chunk's points innermost, in vectors (embedding bag
    gradient, 64 columns: one fork per call, not one per index)."""
    n = len(infos)
    lanes = max(1, target.vector_bytes // itemsize)
    par = [i for i in range(n) if coincident[i]]
    red = [i for i in range(n) if not coincident[i]]
    if not par:
        return Plan([0] * n, list(range(n)), [1] * n)
    contig = max(par, key=lambda i: (round(infos[i].contiguous - infos[i].strided, 6), i))
    chunk = max(lanes, _pow2_floor(max(1, infos[contig].extent // (2 * max(1, target.cores)))))
    tile = [0] * n
    if infos[contig].extent <= chunk:  # at most one vector: the member's own loop is the threads' shares
        return Plan(tile, [contig] + [i for i in par if i != contig] + red, [1] * n)
    tile[contig] = chunk
    for i in red:  # their tile loops run once, inside the chunks' loop
        tile[i] = max(infos[i].extent, 1)
    return Plan(tile, [i for i in par if i != contig] + red + [contig], [1] * n)


def plan(infos: list[MemberInfo], coincident: list[bool], options: MappingOptions,
         target: CpuTarget = GENERIC, itemsize: int = 4, boundary: bool = False, spread: bool = False) -> Plan:
    """Tile sizes, point order and register tiles for one band: the options' where given, else
    the default heuristic for ``target`` (its lanes for elements of ``itemsize`` bytes, its
    accumulator registers and caches). A band with a reduction (a non-coincident member) and a
    parallel member walking contiguous memory becomes a BLAS-like nest: cache tiles, then the
    reduction loops inside register tiles of a 'row' member x the contiguous member (the target
    tile stays in registers across the reduction); other bands put their most contiguous member
    innermost. In a ``boundary`` piece of a split statement whose contiguous member is a few
    columns wide, the register tile runs along the last longer parallel member instead (its
    reads and target gathered: codegen.vecplan). ``spread``: the band has loops below it or
    around it (it is not an outermost pointwise loop).

    The default is decided in _Band's steps, in this order: where memory is walked (``walk``),
    the row members and the loop order (``nest``), packed panels and fine row shares
    (``panels``), rows taken whole (``whole_rows``) and a conv's channel vectors
    (``channel_form``); then the options override what they give."""
    band = _Band(infos, coincident, target, itemsize, boundary)
    band.walk()
    band.nest()
    band.panels()
    band.whole_rows()
    band.channel_form(options)
    n, par, red = band.n, band.par, band.red
    tile = _fit(options.tile, n, 0) if options.tile is not None else [band.default_tile(i) for i in range(n)]
    if options.tile is None and red and band.row is None and band.contig is None and \
            sum(1 < tile[i] < infos[i].extent for i in par) == 1:
        # reductions innermost, one parallel member cut into tiles: the others whole inside each of
        # its tiles, the tiles reuse nothing more than the loop whole, and its point loop would be
        # cut short (a weight gradient's 40 filters in 32 + 8: no whole strips, codegen.vecloop)
        tile = [0 if i in par else t for i, t in enumerate(tile)]
    if spread and options.tile is None and n == 1 and par:
        # One parallel loop: tiled, it is only cut into strips, which reuse nothing more. Around
        # nests of its own (a row loop), the strips would be the threads' shares, and a few of them
        # leave cores idle (1500 rows in strips of 512 on 2 threads: 1024 rows on one); untiled,
        # the threads take chunks of rows as they become free, and the loop can hold sums over its
        # rows in partial rows (codegen.privatise). Inside another loop (a row's columns), it runs
        # whole, a constant trip count for its vectors (codegen.vecloop).
        tile[0] = 0
    order = band.order
    if options.point_order is not None and len(options.point_order) == n:
        order = list(options.point_order)
    if options.register_tile is not None:
        register = _fit(options.register_tile, n, 1)
    elif options.point_order is None:
        register = [band.default_register(i) for i in order]
    else:
        register = [1] * n
    # A batch member of a register-tiled product (every access moves along it: bmm's z) steps
    # outside the cache tiles, one value at a time: inside them, each tile of rows walked every
    # batch's panel of the other operand, a working set the batch count times larger than the
    # cache tile was made for (AVX-512, 2 threads, 20 paired rounds: bmm 8x512^3 11.7 -> 10.1 ms,
    # 3x256x200x300 0.52 -> 0.48 ms, 64x128^3 the same). Not where a reduction is a small window (a
    # conv's groups, a pooling window): a group conv's groups ran 2.5% slower so (32x32x16x28x28),
    # a maxpool backward's tie count 7% faster (12x48x46x46); both keep their form.
    singles = frozenset(i for i in par if band.row is not None and i != band.contig and i not in band.rows and
                        infos[i].invariant == 0 and infos[i].extent > 1 and options.tile is None and not band.window)
    return Plan(tile, order, register, singles)


class _Band:
    """What plan decides about one band by default, step by step: each step reads the facts the
    ones before it set (and ``lanes`` halves for rows shorter than a vector, from ``walk`` on)."""

    def __init__(self, infos: list[MemberInfo], coincident: list[bool], target: CpuTarget, itemsize: int,
                 boundary: bool) -> None:
        self.infos, self.coincident, self.target, self.itemsize, self.boundary = \
            infos, coincident, target, itemsize, boundary
        self.n = n = len(infos)
        self.lanes = max(1, target.vector_bytes // itemsize)
        self.budget = target.accumulators  # vector accumulators a register tile may hold
        self.two_row_budget = 2 * self.budget // 3  # two row members: the rest holds more operand vectors
        # cache tiles: a row panel of the reduction in L1, the reduction x contiguous panel in a quarter of L2
        self.red_tile = _pow2_floor(max(16, target.l1d * 3 // 4 //
                                        (ROW_REGISTER_ONE * ROW_TILES_PER_CACHE_TILE * itemsize)))
        self.contig_tile = min(1024, max(128, _pow2_floor(target.l2 // 4 // (self.red_tile * itemsize))))
        self.square_tile = _pow2_floor(math.isqrt(target.l1d // itemsize // 4))  # two square tiles in half of L1
        self.par = [i for i in range(n) if coincident[i]]
        self.red = [i for i in range(n) if not coincident[i]]
        # set by walk
        self.contig: int | None = None  # the parallel member walking memory most contiguously
        self.best = 0  # the member the nest runs innermost
        self.window: list[int] = []  # reductions of a small window (a conv's 3x3)
        self.column = False  # a boundary piece's register tile runs along a longer member
        self.narrow: int | None = None  # a boundary column's own contiguous member
        self.narrow_contig = False
        # set by nest
        self.row: int | None = None
        self.rows: list[int] = []
        self.order: list[int] = []
        # set by panels
        self.packed = False
        self.deep_red = 0
        self.fine_rows = False
        self.crossing: list[int] = []
        self.transposing = False
        # set by whole_rows
        self.whole_contig = False
        self.row_split: dict[int, int] = {}
        # set by channel_form
        self.channel_vectors = 0
        self.channel_rows = 0  # the tile's rows along the contiguous member (0: as many as the budget holds)

    def contiguity(self, i: int) -> tuple[float, bool, float, int]:  # ties go to parallel members
        infos = self.infos
        return (round(infos[i].contiguous - infos[i].strided, 6), self.coincident[i], infos[i].invariant, i)

    # the boundary columns polyhedral.split cuts from a padded conv (one or two wide): the
    # register tile runs along the image's height instead (single thread, 8x64x56x56 conv with
    # 3x3 padding: 11.2 ms against 19.1 ms with the columns' reductions innermost)
    # (nor along a member of a boundary piece that the reductions' bounds move with, four or more
    # values narrower than a vector: a 5x5 window's boundary rows)
    def cut_short(self, i: int) -> bool:
        return self.boundary and self.infos[i].tied and 4 <= self.infos[i].extent < self.lanes

    def walk(self) -> None:
        """The member walking memory contiguously (``contig``) and the one to run innermost (``best``)."""
        infos, par, red, lanes, n = self.infos, self.par, self.red, self.lanes, self.n
        contig = max(par, key=self.contiguity) if par else None
        # a conv's small window (3x3) beside a long reduction (the channels) does not decide where
        # memory is walked best: with a stride of 2 the window's reads are the contiguous ones, and
        # the conv ran with its reductions innermost, no register tile (8x64x57x57, 128 filters: AVX2
        # 7.5 GFLOP/s). Pooling, all window, keeps its own form.
        window = [i for i in red if 0 < infos[i].extent <= SMALL_WINDOW]
        best = max([i for i in range(n) if i not in window] if 0 < len(window) < len(red) else range(n),
                   key=self.contiguity)
        # (nor do reductions each narrower than a vector beside a contiguous output row of a vector or
        # more, where another parallel member reuses a read: a network's stem, 3 channels under a 7x7
        # window with stride 2, whose reductions innermost ran in masked vectors of 7 of 16 lanes an
        # element at a time; with its rows, read two apart, in channel vectors (strided_rows below),
        # 4x3x64x64 padded by 3 with 16 filters, 15 interleaved rounds, all faster: AVX-512 0.38-0.48
        # -> 0.24 ms, AVX2 0.25-0.29 -> 0.18-0.19 ms)
        if best in red and contig is not None and infos[contig].contiguous > 0 and infos[contig].extent >= lanes and \
                all(0 < infos[i].extent < lanes for i in red) and math.prod(infos[i].extent for i in red) >= lanes and \
                any(infos[i].invariant > 0 and infos[i].extent >= 4 for i in par if i != contig):
            best = contig
        longer = [i for i in par if infos[i].extent >= 4 and not self.cut_short(i)]
        # (not where a reduction longer than a window walks memory contiguously: a padded 3x3 weight
        # gradient's piece, one tap of the window summed over images, rows and columns, whose register
        # tile would run across the filters or channels: 8x16x32x32, 32 filters, 15.0 ms against 2.7
        # ms for its reductions innermost on AVX-512, 13.6 against 1.6 on AVX2; 32 images 8x8 with 4
        # filters, 140 against 41 us; a window's columns, whose range moves with the piece's, are no
        # such reduction: the input gradient of a 5x5 or 7x7 conv, whose boundary columns are four or
        # six wide, AVX2 8x16x32x32 with 32 filters 5x5: 1.6 -> 47 GFLOP/s)
        column = self.boundary and bool(red) and contig is not None and \
            (infos[contig].extent < 4 or self.cut_short(contig)) and \
            bool(longer) and not any(infos[i].contiguous > 0 and infos[i].extent > SMALL_WINDOW and
                                     not (infos[i].tied and infos[i].extent < lanes) for i in red)
        self.narrow = contig  # a boundary column's own contiguous member (one or two wide)
        if column:
            contig = best = longer[-1]
        # (nor where the contiguous member is narrower than a vector and a reduction at least a vector
        # long walks memory as contiguously, moving no access along an outer dim: a weight gradient of a
        # 5x5 or 7x7 window, whose register tile would run across the channels, gathered, while its
        # jammed sum runs along the rows of both operands. AVX2, 2 threads: 8x16x32x32, 32 filters 5x5,
        # 1.9 -> 56 GFLOP/s; 7x7, 3.9 -> 41. Narrow is also under NARROW elements where a vector holds
        # fewer (float64 on AVX2, SSE2): a 5- or 7-wide window fills a vector of 4 there, yet the channel
        # tile lost as much; the whole backward of conv 8x16x32x32, 32 filters, float64 on AVX2: 5x5
        # 44 -> 11 ms, 5x5 padded 29 -> 7.5, 7x7 padded 22 -> 6.7; float32 on SSE2: 65 -> 20, 52 -> 9.2,
        # 28 -> 12)
        self.narrow_contig = contig is not None and infos[contig].extent < max(lanes, NARROW) and not column and any(
            infos[r].contiguous >= infos[contig].contiguous and infos[r].strided == 0 and infos[r].extent >= lanes
            for r in red)
        if self.target.half_vectors and contig is not None and lanes // 2 <= infos[contig].extent < lanes:
            self.lanes //= 2  # rows shorter than a vector run in half vectors (codegen.vecplan: narrow tiles)
        self.contig, self.best, self.window, self.column = contig, best, window, column

    def nest(self) -> None:
        """The register tile's row members (``row``, ``rows``) and the point loop order."""
        infos, par, red, n = self.infos, self.par, self.red, self.n
        contig, best = self.contig, self.best
        rows: list[int] = []
        row = None
        # (not when the contiguous member is a few wide, as a 3x3 weight gradient's: its register tile
        # would run across a strided member, 1.05 s against 27 ms for reductions innermost)
        if red and contig is not None and (infos[contig].contiguous > 0 or self.column) and best in par and \
                not 0 < infos[contig].extent < 4 and not self.narrow_contig:
            others = [i for i in par if i != contig]
            ranked = sorted(others, key=lambda i: (infos[i].invariant, i), reverse=True)
            # a member one wide outside the others (a batch of one) leads no rows: every read is
            # invariant along it, so it ranked first and took the output channels' place (a conv of
            # one 56x56 image, 64 channels: 48 against 148 GFLOP/s on AVX2, 91 against 184 on AVX-512).
            # The one-wide row or column of a padded conv's boundary piece, inside the others, keeps
            # its place: its two-row form runs 1.2x-1.4x faster than one row member there.
            outer = [i for i in ranked if infos[i].extent == 1 and all(i < j for j in others if infos[j].extent != 1)]
            ranked = [i for i in ranked if i not in outer] + outer
            row = ranked[0] if ranked else None
            # a second row member (conv: output channel x output row) when it too leaves an operand
            # in place: more accumulators per operand loaded
            rows = [r for r in ranked[:2]
                    if r == row or (infos[r].invariant > 0 and infos[r].extent >= 4 and not self.cut_short(r))]
            order = [i for i in others if i not in rows] + sorted(rows) + [contig] + red
        elif par and not red:
            order = [i for i in range(n) if i != best] + [best]
            contig = best
        elif par and contig is not None and infos[contig].contiguous > 0 and \
                all(0 < infos[i].extent <= SMALL_WINDOW for i in red):
            # a small window (pooling, a 3x3 stencil) reduced into a contiguous output: the window's
            # loops outside, the output's contiguous loop innermost and vectorised (a 2-wide reduction
            # innermost vectorises nothing: maxpool 2.6 ms against 1.2 ms for torch.compile)
            order = [i for i in par if i != contig] + red + [contig]
        elif par:  # a reduction walks memory best: parallel loops outside, reductions inside (accumulated)
            # the most contiguous reduction innermost, where the scheduler left another there (the
            # pieces of a padded conv's weight gradient, summed over rows, columns, then images: AVX2
            # 8x16x32x32, 32 filters 3x3 padded by 1, 3.4 -> 15.6 GFLOP/s; with codegen.vecloop's strip of
            # filters, 21-25)
            # (reductions alike in that, the one of the widest step outermost: a padded weight gradient
            # read from a zero-padded copy, its rows' range literal and its images' a size, had the rows
            # outside the images, each step of the images a plane of every channel away: 8x16x32x32,
            # 32 filters 3x3, 2.14 -> 0.61 ms on AVX-512, 1.01 -> 0.79 on AVX2; 5x5 1.54 -> 1.04, 1.70 -> 1.45)
            order = par + sorted(red, key=lambda i: (*self.contiguity(i)[:3], -infos[i].stride, i))
            contig = None
        else:
            order = list(range(n))
        self.row, self.rows, self.order, self.contig = row, rows, order, contig

    def panels(self) -> None:
        """Whether the rows' operand is packed into panels, how deep its reduction chunks run, and
        whether the threads share out the rows one register tile at a time."""
        infos, par, red, target, itemsize = self.infos, self.par, self.red, self.target, self.itemsize
        row, rows, contig = self.row, self.rows, self.contig
        # the operand a one-row register tile loads along its rows will be packed into panels (its rows
        # conflict in L1: codegen.pack)
        self.packed = packed = len(rows) == 1 and any(target.panel_conflicts(infos[r].stride, self.red_tile)
                                                      for r in red)
        # Such an operand, when several row blocks read it and the whole of it fits the target's
        # shared pack, is packed once per call (codegen.pack): its rows no longer meet in L1, so the
        # reduction runs in chunks as deep as one register tile's rows of the other operand fill 3/4 of
        # L1 (1024 float32 of a 32 KiB L1) rather than as all the row tiles of a cache tile do. AVX2 on
        # 2 threads, 60 paired interleaved rounds against numpy: matmul 1024^3 0.920x -> 1.011x,
        # 960x1088x1000 0.979x -> 1.043x (chunks of 128 -> the whole reduction).
        if packed and contig is not None and row is not None and len(red) == 1 and \
                infos[row].extent > ROW_REGISTER_ONE * ROW_TILES_PER_CACHE_TILE and \
                infos[contig].extent * infos[red[0]].extent * itemsize <= target.shared_pack_bytes:
            self.deep_red = _pow2_floor(max(self.red_tile, target.l1d * 3 // 4 // (ROW_REGISTER_ONE * itemsize)))
            if target.l2_panels:  # the chunk's panels in half of L2 (CpuTarget.l2_panels)
                walked = min(infos[contig].extent, self.contig_tile) * itemsize
                self.deep_red = max(self.red_tile, min(self.deep_red, _pow2_floor(target.l2 // 2 // walked)))
        # Where the register tiles' rows run straight around their panels of the operand they load
        # along the rows (no blocks of its columns, which would put a loop between them and leave the
        # operand unpacked: AVX2 matmul 1024^3 0.58x), and a cache tile of rows reuses nothing one
        # register tile does not (the reduction whole, or the whole operand in half of L2), and the
        # rows are the only parallel member besides the vectors': each cache tile is one register
        # tile, and the threads share the rows out finely. 1024 rows in blocks of 132 (the last of
        # 100) or of 48 (the last of 16) gave two threads 528 and 496; paired rounds on 2 threads
        # against those blocks: FC 128x1024 -> 1024 1.02x (AVX2) and 1.04x (AVX-512), matmul 256^3
        # 1.06x (AVX2). A batch loop outside the rows shares the work out already.
        self.fine_rows = row is not None and contig is not None and len(rows) == 1 and len(red) == 1 and \
            (bool(self.deep_red) or not packed) and \
            infos[row].extent > ROW_REGISTER_ONE * ROW_TILES_PER_CACHE_TILE and \
            infos[contig].extent <= self.contig_tile and \
            (0 < infos[red[0]].extent <= self.deep_red or
             infos[contig].extent * infos[red[0]].extent * itemsize <= target.l2 // 2) and \
            all(infos[o].extent == 1 for o in par if o not in rows and o != contig)
        # members along which another access is contiguous (a transpose's source)
        self.crossing = [i for i in par if not red and i != contig and infos[i].contiguous > 0]
        self.transposing = bool(self.crossing)

    def default_tile(self, i: int) -> int:
        infos, red, rows, contig = self.infos, self.red, self.rows, self.contig
        if i in red and self.row is None and contig is None:
            return 0  # reductions innermost: one accumulator over the whole range
        # whole register tiles of rows; where the row operand may be copied into panels (vectors of
        # at most half a line, codegen.pack) three times as many, to share each copy
        row_tile = ROW_REGISTER_ONE * ROW_TILES_PER_CACHE_TILE if len(rows) == 1 else 64
        if i in rows and self.fine_rows:
            return ROW_REGISTER_ONE if infos[i].extent > ROW_REGISTER_ONE else 0
        if i in rows and self.packed:
            # up to three times as many rows, in a multiple of PACKED_ROW_BLOCKS tiles of nearly equal size
            e, most = infos[i].extent, PACKED_ROW_FACTOR * row_tile
            blocks = PACKED_ROW_BLOCKS * -(-e // (PACKED_ROW_BLOCKS * most))
            row_tile = max(row_tile, ROW_REGISTER_ONE * -(-e // (ROW_REGISTER_ONE * blocks)))
        band = self.band_rows(i) if len(rows) == 2 and i == max(rows) and red else 0
        if band:
            return band if infos[i].extent > band else 0
        if self.transposing and i == contig:
            size = CROSS_CONTIG_TILE
        elif i in self.crossing:
            size = CROSS_TILE
        else:
            size = self.contig_tile if i == contig else row_tile if i in rows else \
                (self.deep_red or self.red_tile) if i in red else self.square_tile
        return size if infos[i].extent > size else 0

    # Two row members (conv: output channel x output row) and a contiguous member of two to four
    # vectors (a conv output row) that the register tile takes whole (its last, partial vector in
    # a loop of its own, see codegen.ctile): 8 channels x 1 row x 2 vectors, or 4 x 1 x 3-4 vectors.
    # On one thread, group conv (26 wide) ran 63 ms against 84 ms for 2 x 4 rows, conv2d (54 wide)
    # 45 ms against 53 ms for 6 x 1; split into 13- or 14-lane pieces under 4 x 4 rows instead,
    # the rows ran 1.3x-1.5x slower.
    # (these are AVX-512's 16 of 24 accumulators; a target with fewer registers scales them down)
    def whole_rows(self) -> None:
        """Whether a two-row-member tile takes the contiguous rows whole, and its rows then."""
        infos, rows, contig, lanes = self.infos, self.rows, self.contig, self.lanes
        vectors = -(-infos[contig].extent // lanes) if contig is not None else 0
        row_count = _pow2_floor(self.two_row_budget // vectors) if vectors else 0
        self.whole_contig = len(rows) == 2 and lanes > 1 and contig is not None and \
            _whole_rows(infos[contig].extent, lanes, self.two_row_budget)
        if self.whole_contig and contig is not None:
            first, second = sorted(rows)
            if vectors == 2 and infos[first].extent >= row_count:
                self.row_split = {first: row_count, second: 1}
            elif vectors == 2:
                self.row_split = {first: 2, second: row_count // 2}
            else:
                self.row_split = {first: row_count, second: 1}

    def band_rows(self, i: int) -> int:
        """A conv's output rows per cache tile (the second row member), where the input rows all
        of them read across the reduction's outermost member (every channel) outgrow 2/3 of L2:
        as many rows as read an eighth of L2, in whole register tiles, dividing the rows where a
        size near that does (0: no tile). Measured on 2 threads, paired interleaved rounds, each
        tiling against the whole image: AVX2 conv2d 8x64x56x56 (800 KB of input rows in a 1 MB
        L2) 6 rows 1.06-1.07x, 8 1.06x, 10 1.08x, 18 1.04x; 46x46 (540 KB) 0.99-1.01x for 4 to 22
        rows; AVX-512's 4x1 tile of four vectors 0.99x with 9 rows, so its whole-row tiles keep
        the image whole, and so does a tile in channel vectors, whose rows of output each read three
        input rows from L2 (AVX2 conv2d 8x64x56x56 in 4 x 3 channel vectors: the whole image 1.05x
        over 6-row bands, faster in 14 of 21 paired rounds)."""
        infos, red, target = self.infos, self.red, self.target
        if self.channel_vectors:
            return 0
        deep = [infos[r].extent for r in red if infos[r].stride > infos[i].stride > 0]
        per_row = infos[i].stride * max(deep) if deep else 0
        if not per_row or self.whole_contig or per_row * infos[i].extent * 3 <= target.l2 * 2:
            return 0
        step = max(1, self.two_row_budget // 4)
        want = max(step, target.l2 // BAND_L2_SHARE // per_row // step * step)
        return next((t for t in range(want, max(step, want // 2) - 1, -step) if infos[i].extent % t == 0), want)

    def default_register(self, i: int) -> int:
        infos, red, rows, contig = self.infos, self.red, self.rows, self.contig
        budget, lanes, whole_contig = self.budget, self.lanes, self.whole_contig
        if not red or self.cut_short(i):
            return 1
        if self.channel_vectors:
            rows_along = self.channel_rows or budget * lanes // self.channel_vectors
            return self.channel_vectors if i == min(rows) else rows_along if i == contig else 1
        if i in rows:
                # one row member: 6 rows x 4 vectors = 24 accumulators (of 32 vector registers), each
                # operand vector loaded once per 6 fused multiply-adds (4 rows: 2.3x slower on matmul)
            if len(rows) == 1 and infos[i].extent >= ROW_REGISTER_ONE:
                return ROW_REGISTER_ONE
                # two row members, one vector each: (the two-row budget / 4) rows of the second, and of
                # the first as many as fill at most 16 accumulators: AVX2 6 x 2 (conv2d 8x64x56x56 on 2
                # threads, interleaved medians: 171-188 against 167-185 GFLOP/s for 4 x 2), AVX-512 4 x 4
                # (a 122-wide conv: 140 against 122 for 6 x 4 and 105 for 12 x 2)
            second = max(1, self.two_row_budget // 4)
            want = self.row_split[i] if whole_contig else min(budget, 16) // second if i == min(rows) else second
            if not whole_contig and i == min(rows) and infos[i].extent >= 4:
                want = min(want, infos[i].extent)  # 4 or 5 channels: one tile of them all
            return want if infos[i].extent >= want else 1
        if i == contig:
            e = infos[i].extent
            if whole_contig:
                return e
                # keep the tile within the accumulator registers: one vector per row with two row
                # members, the budget over ROW_REGISTER_ONE rows with one
            wide = lanes if len(rows) > 1 else max(1, budget // ROW_REGISTER_ONE) * lanes if rows else \
                max(1, budget // 2) * lanes  # one row (a window reduction): half the accumulators
            exact = [d for d in range(wide, lanes // 2 - 1, -1) if e % d == 0]  # full tiles: constant trip counts
            if exact and e < 4 * wide:
                return exact[0]
            return min(wide, _pow2_floor(e)) if e >= lanes else e if e >= 4 else 1
        return 1

    def channel_form(self, options: MappingOptions) -> None:
        """Whether a conv's register tile runs in vectors along its output channels instead
        (``channel_vectors``, ``channel_rows``; the loop order moves its channels inside)."""
        infos, par, red, rows, contig = self.infos, self.par, self.red, self.rows, self.contig
        target, itemsize, lanes, budget, column = self.target, self.itemsize, self.lanes, self.budget, self.column
        # A conv on a target of 16 vector registers (AVX2) runs in vectors along the output channels
        # instead: four (else two) vectors of channels x (the budget / 4, else / 2) output columns,
        # the weights packed into channel panels (codegen.pack) and each input element
        # broadcast. Along the columns, two of every three input loads start off a vector boundary
        # (the kernel's shifts) and split across cache lines. AVX2 conv2d 8x64x56x56, 2 threads, paired
        # interleaved rounds: 2 vectors x 6 columns 1.21x the 6 channels x 2 rows tile along the
        # columns (faster in 9 of 11), 4 x 3 a further 1.045x (10 of 11; 46x46: 1.026x, 8 of 11).
        # AVX-512's 4 x 4 tile of 16-lane rows stays (this form 0.97x there). A padded conv's boundary
        # columns take this form on both ISAs, along the image's height: their weights packed, rather
        # than the height in vectors gathered 56 elements apart. 2 threads, medians of 30 interleaved
        # calls: AVX2 8x64x56x56 padded by 1 13.8 -> 12.0 ms (its two columns 1.6 -> 0.4-0.7 ms each),
        # 46x46 10.6 -> 9.4 ms, the input gradient of a 3x3 conv (8x64x54x54 -> 56x56) 30.7 -> 21.4 ms;
        # AVX-512 (6 rows x 4 vectors) 56x56 12.4-12.7 -> 10.9-11.4 ms, 46x46 8.5 -> 7.3 ms.
        # Rows of two to four vectors, which AVX-512 takes whole (8 channels x 1 row x 2 vectors), take
        # this form too on such a target: whole, they leave it 2 channels x 1 row x 4 vectors, 8
        # accumulators, two operand loads for every three multiply-adds. AVX2, 2 threads, paired rounds:
        # conv 8x16x32x32 (30-wide rows) 0.38 -> 0.33-0.36 ms, 16x32x16x16 0.65 -> 0.57, padded
        # 8x16x32x32 0.98 -> 0.82 and 16x32x14x14 0.39 -> 0.33; its input gradient, padded 1.12-1.20 ->
        # 0.55-0.57 ms, unpadded 0.45-0.54 -> 0.49-0.52.
        # (Not where another parallel member moves every operand, a group conv's groups: its weights,
        # unpacked, would be gathered at each step. AVX2 group conv 32x32x16x28x28: 24.7 -> 69.5 ms.)
        # On a target of more registers (AVX-512) an unpadded conv takes this form too where its rows
        # leave lanes of their last vector idle (FILLED_ROWS): four channel vectors x 6 columns, 24
        # accumulators, ten operand loads for 24 multiply-adds and every lane busy. AVX-512, 2 threads,
        # min of 30 calls, in two runs each: 8x64x46x46 with 64 filters (44 of 48 lanes) 5.38-5.45 ->
        # 5.13-5.26 ms, 16x64x22x22 1.37 -> 1.09, 2x32x102x102 3.81-4.14 -> 3.36, 8x32x14x14 (half
        # vectors) 0.35 -> 0.21, 16x64x9x9 (rows of 7, a masked vector) 1.42 -> 0.33; 8x64x56x56 7.76
        # -> 7.71 and 4x32x38x38 with 96 filters 1.39 -> 1.39 (even); float64 8x64x46x46 11.5 -> 10.3-10.6,
        # 8x64x22x22 2.05 -> 2.10-2.18 (a loss). Rows that fill their vectors keep
        # them: 8x16x32x32 (30 of 32 lanes) 0.31 -> 0.33 in this form. A padded conv's interior keeps
        # them as well (8x64x56x56 padded 8.3 -> 8.6 ms, 8x16x32x32 0.38 -> 0.70: its boundary pieces
        # then run beside an interior of another form), except a float32 interior narrower than one
        # vector, whose rows would take one masked or gathered vector a row (a stride-2 conv's 13 of
        # 14 columns: no vector form at all). AVX-512, 2 threads, 15 interleaved rounds, the same bits:
        # padded 8x32x28x28 stride 2 0.35 -> 0.20 ms, padded 8x64x14x14 0.96 -> 0.67, 8x32x16x16 0.30 ->
        # 0.26, 16x32x9x9 0.59 -> 0.30, their input gradients 1.73 -> 1.45 (14x14) and 0.93 -> 0.64 (9x9);
        # float64 16x32x9x9 (7 of 8 lanes) 0.29 -> 0.34, so float64 keeps its rows.
        settled = all(infos[i].invariant > 0 for i in par if i not in rows and i != contig)
        narrow_interior = contig is not None and itemsize <= 4 and \
            infos[contig].extent < target.vector_bytes // itemsize
        # (and rows read with a stride, as a stride-2 conv's columns: along them the input is no vector load)
        strided_rows = contig is not None and itemsize < infos[contig].stride <= MAX_STRIDE * itemsize
        idle_rows = contig is not None and settled and (not self.boundary or strided_rows) and \
            (infos[contig].whole == infos[contig].extent or narrow_interior or strided_rows) and \
            infos[contig].extent < FILLED_ROWS * lanes * -(-infos[contig].extent // lanes)
        idle_lanes = idle_rows and budget >= COLUMN_TILE_ACCUMULATORS
        if not (len(rows) == 2 and red and contig is not None and lanes > 1 and infos[contig].extent >= 4 and
                (not self.whole_contig or column or settled) and
                (budget < COLUMN_TILE_ACCUMULATORS or column or idle_lanes)):
            return
        first = min(rows)
        count = next((v for v in CHANNEL_VECTORS if infos[first].extent % (v * lanes) == 0), 0)
        if count > 1 and infos[first].extent == count * lanes and infos[first].target and \
                infos[first].target % ALIAS_BYTES == 0:
            count = 1  # one vector of channels, so that a tile's stores stay in L1 (ALIAS_BYTES)
        # Channels that fill exactly one vector (16 filters float32 on AVX-512, 8 on AVX2, 8 float64
        # on AVX-512, or an input gradient's as many channels) take the form too, one vector of
        # channels x the budget's columns or rows, in a padded conv's boundary columns, and where
        # rows of at most two vectors leave lanes idle over a reduction of ONE_VECTOR_STEPS or more.
        # Those had no vector form, or ran down a column gathering its rows. 2 threads, 30 paired
        # rounds (median ratio, rounds won): AVX-512, 16 filters: conv 16x32x9x9 4.43x (30/30),
        # 8x32x20x20 1.23x (30), 8x32x28x28 1.03x (30), 16x32x14x14 1.00x, padded 8x16x56x56 1.10x
        # (30), padded 8x32x32x32 1.08x (30), the input gradient of conv 8x16x32x32 (32 filters 3x3)
        # 0.47-0.48 -> 0.43-0.44 ms; AVX2, 8 filters: conv 16x32x9x9 7.28x (30), 16x32x14x14 1.05x
        # (26), padded 8x16x56x56 1.05x (29), padded 8x32x32x32 1.25x (30). Rows of more vectors
        # stay as they were (AVX-512 8x16x46x46 0.93x in this form, AVX2 8x32x20x20 0.99x). The same
        # results, bit for bit.
        steps = math.prod(infos[i].extent for i in red)
        if not count and infos[first].extent == lanes and \
                (column or (idle_rows and (steps >= ONE_VECTOR_STEPS or strided_rows) and
                            infos[contig].extent <= 2 * lanes)):
            count = 1
        given = _fit(options.tile, self.n, 0) if options.tile is not None else None

        def cut(i: int) -> bool:  # a cache tile across member i, the options' or the default
            size = given[i] if given is not None else self.default_tile(i)
            return 1 < size < infos[i].extent

        # (the channels and the reductions untiled: the weights pack once, for every thread)
        if not (count and infos[first].invariant > 0 and not cut(first) and not any(cut(r) for r in red)):
            return
        self.channel_vectors = count * lanes
        self.order = [i for i in self.order if i not in (first, contig) and i not in red] + [contig, first] + red
        narrow = self.narrow
        if column and budget < COLUMN_TILE_ACCUMULATORS and narrow is not None and infos[narrow].extent == 1 \
                and _channel_interior(infos[narrow].whole - 2, lanes, self.two_row_budget):
            # A boundary column whose interior runs in channel vectors too: one output row
            # per tile, the loops outside it in the interior's order (image, row, column), so
            # that codegen.fuse's fuse pass runs the columns in the interior's parallel loop,
            # on the input rows it has just read (AVX2 8x64x56x56 padded by 1, caches flushed
            # before each call, in three runs: 13.7-14.7 -> 11.8-13.2 ms, 46x46 9.0 -> 8.0 ms,
            # against the columns on their own in 3 x 4 vectors).
            # (A column two wide, as an input gradient's, whose reductions vary along it, keeps
            # 3 x 4: one row per tile, the column loop would sit inside its weights' reuse, and
            # they would be gathered, not packed: 16.7 -> 20.7 ms.)
            self.channel_rows = 1
            self.order = [i for i in range(self.n) if i in par and i != first] + [first] + red


def _whole_rows(width: int, lanes: int, two_row_budget: int) -> bool:
    """Rows ``width`` wide are few enough vectors (two to four, or a quarter of the two-row
    budget) for a two-row-member register tile to take them whole, at least two of them."""
    vectors = -(-width // lanes)
    return 2 <= vectors <= max(4, two_row_budget // 4) and _pow2_floor(two_row_budget // vectors) >= 2


def _channel_interior(width: int, lanes: int, two_row_budget: int) -> bool:
    """Whether a padded conv's boundary columns beside an interior ``width`` columns wide run one
    row per tile inside the interior's loop (plan): where its rows are too wide for a register tile
    to take them whole. Beside narrower interiors (in channel vectors too, on such a target) the
    columns on their own are faster: AVX2, padded 8x16x32x32, input gradient 0.56 against 0.68 ms,
    forward 0.79-0.81 against 0.82-0.84 ms."""
    return width >= 4 and not _whole_rows(width, lanes, two_row_budget)


def _pow2_floor(x: int) -> int:
    """The largest power of two at most ``x`` (1 for ``x < 2``)."""
    return 1 << (max(int(x), 1).bit_length() - 1)


def _fit(values: tuple[int, ...], n: int, fill: int) -> list[int]:
    return (list(values) + [fill] * n)[:n]
