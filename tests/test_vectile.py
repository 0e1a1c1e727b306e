"""Register tiles and loops in the target's explicit vectors (codegen.vecplan, codegen.vectile,
codegen.vecloop, codegen.vecisa), on every CPU target this machine runs (AVX-512, AVX2, SSE2, generic vector
extensions; ``TCDSL_CPU``): the kernels that take the vector form give the same bits as the
scalar code where the target has FMA (within the term-scaled bound where it has not), against
numpy, with the tile starting at zero or loaded from the target, rows of whole vectors or ending
in an overlapping vector, tiles cut short across their rows in vector tiles of fewer rows or
along their rows in vector tiles of fewer columns (columns too few for a vector in the scalar tile
with constant bounds), other partial tiles on the scalar path beside whole ones, and the scalar
fallback (-DTC_VEC=0) still right."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from test_vecisa import LOG_ULPS, TANH_ULPS
from tolerance import abs_terms, assert_close, assert_sum_close

import tcdsl as tc
from tcdsl.codegen import cpack, lower, pack, toolchain, vecisa, vecloop, vecplan
from tcdsl.options import MappingOptions
from tcdsl.polyhedral import cputarget, tileplan

try:
    from targets import runnable
except ImportError:  # run from another directory
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from targets import runnable

pytestmark = pytest.mark.cpu


TARGET_NAMES = [n for n in ("avx512", "avx2", "sse2", "generic", "neon") if runnable(n)]
NATIVE = toolchain.native_target(tuple(toolchain.compiler())).isa
# the machine's own ISA and AVX2 run by default; the narrower 16-byte targets are a slow sweep
# (--run-slow), with a smoke test of their own below
TARGETS = [pytest.param(n, marks=() if n in (NATIVE, "avx2") else pytest.mark.slow) for n in TARGET_NAMES]


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> cputarget.CpuTarget:
    """Each CPU target this machine can run, selected through TCDSL_CPU."""
    monkeypatch.setenv("TCDSL_CPU", request.param)
    return toolchain.target()

CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
}"""
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
SUM = "def s(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) - 0.5 * B(r_k,n) }"


def _conv(I: np.ndarray, W: np.ndarray) -> np.ndarray:
    KH, KW = W.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(I, (KH, KW), axis=(2, 3))
    return np.einsum("nchwkl,fckl->nfhw", win, W, dtype=np.float64)


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b


# (id, source, shapes, options, numpy reference, what the vector tile must show, (terms K, a function
# that is each element's sum of |terms| when given |inputs|))
CASES = [
    ("conv-overlap", CONV, [(2, 8, 20, 20), (8, 8, 3, 3)], None, _conv, ("tc_vf_zero()",),
     (72, _conv)),
    ("matmul-whole", MATMUL, [(24, 40), (40, 48)], None, _mm, ("tc_vf_zero()",), (40, _mm)),
    ("matmul-k-tiles", MATMUL, [(64, 256), (256, 64)], MappingOptions(tile=(4, 32, 8)), _mm,
     ("tc_vf_zero()",), (256, _mm)),
    # the reduction in chunks of a cache tile: the tiles start from zero in the first, load C in the others
    ("matmul-first-chunk", MATMUL, [(64, 300), (300, 64)], MappingOptions(tile=(0, 0, 128)), _mm,
     ("tc_vf_zero()", "tc_vf_load(&t2"), (300, _mm)),
    # 6-row tiles of 100 rows: the last tile, 4 rows, takes a vector tile of its own, the only
    # other size there is (so the vector code has no scalar tile beside it)
    ("matmul-partial-row-tiles", MATMUL, [(100, 64), (64, 64)], None, _mm,
     ("if (tc_lmin(", "} else {  // 4 rows"), (64, _mm)),
    ("matmul-partial-overlap", MATMUL, [(50, 300), (300, 85)], None, _mm,
     ("if (tc_lmin(",), (300, _mm)),
    # a row cut short (100 = 6 x 16 + 4 wide on AVX2; AVX-512's 64-wide tiles of 100), run as a whole
    # tile ending at the row's last element, the overlap computed again from the identity
    ("conv-shifted-last-tile", CONV, [(2, 8, 6, 102), (8, 8, 3, 3)], None, _conv, ("the row's last",),
     (72, _conv)),
    # 10 output channels in tiles of 6 (AVX2's 6x2 rows) or 4 (AVX-512's 4 x 1 row): the last
    # channels in a vector tile of fewer rows, its row ending in a shifted tile too
    ("conv-channels-cut-short", CONV, [(2, 8, 12, 60), (10, 8, 3, 3)], None, _conv, (" rows", ") == "),
     (72, _conv)),
    ("sum-of-difference", SUM, [(4, 20), (20, 44)], None,
     lambda a, b: a.sum(1, dtype=np.float64)[:, None] - 0.5 * b.sum(0, dtype=np.float64)[None, :],
     (" - ", "tc_vf_set1(0x1"),
     (20, lambda a, b: a.sum(1)[:, None] + 0.5 * b.sum(0)[None, :])),
]


def _run(case: tuple, cc: str | None = None, **extra: object) -> tuple[np.ndarray, str, list[np.ndarray]]:
    _, src, shapes, options, _, _, _ = case
    k = tc.define(src)
    rng = np.random.default_rng(0)
    args = [(rng.random(s) * 2 - 1).astype(np.float32) for s in shapes]
    opts = options or MappingOptions()
    opts = dataclasses.replace(opts, **extra) if extra else opts
    return k(*args, options=opts), k.source(*args, options=opts), args


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vector_tile_matches_scalar_and_numpy(case: tuple, target: cputarget.CpuTarget) -> None:
    got, src, args = _run(case)
    assert "#if TC_VEC" in src, src
    assert f"explicit vectors for {target.isa}" in src
    # 4-lane targets (SSE2, NEON, generic) tile the 100-wide rows of the shifted case exactly
    exact = case[0] == "conv-shifted-last-tile" and 100 % target.lanes("float32") == 0 and target.lanes("float32") < 8
    for marker in () if exact else case[5]:
        assert marker in src, marker
    scalar, scalar_src, _ = _run(case, vectorize=False)
    assert "#if TC_VEC" not in scalar_src
    if target.fma:  # the same fused multiply-adds in the same order per element: the same bits
        np.testing.assert_array_equal(got, scalar)
    terms, sum_abs = case[6]
    assert_close(got, case[4](*args), terms=terms, scale=abs_terms(sum_abs, *args))
    assert_close(scalar, case[4](*args), terms=terms, scale=abs_terms(sum_abs, *args))
    assert not np.array_equal(got, np.zeros_like(got))


def _built_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: str, src: str, args: list) -> np.ndarray:
    """The kernel compiled with one more compiler flag, in a cache of its own."""
    monkeypatch.setenv("CC", " ".join([*toolchain.compiler(), flag]))
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path / flag.strip("-").replace("=", "_")))
    before = toolchain.BUILDS
    out = tc.define(src)(*args)
    assert toolchain.BUILDS == before + 1  # a build of its own, not the library from the cache
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("name", [n for n in TARGET_NAMES if n not in (NATIVE, "avx2")])
def test_sixteen_byte_targets(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSE2 and generic vector extensions (their full sweep is slow): a matmul tile and the conv tile
    with overlapping vectors against numpy and the scalar code."""
    monkeypatch.setenv("TCDSL_CPU", name)
    for case in (CASES[0], CASES[1]):
        got, src, args = _run(case)
        assert f"explicit vectors for {name}" in src and "tc_vf_zero()" in src
        scalar, _, _ = _run(case, vectorize=False)
        terms, sum_abs = case[6]
        assert_close(got, case[4](*args), terms=terms, scale=abs_terms(sum_abs, *args))
        assert_close(scalar, case[4](*args), terms=terms, scale=abs_terms(sum_abs, *args))


def test_fallback_without_vectors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the vector code turned off (-DTC_VEC=0), the same source runs its scalar tile, with the
    same bits."""
    case = CASES[0]
    got, src, args = _run(case)
    np.testing.assert_array_equal(_built_with(monkeypatch, tmp_path, "-DTC_VEC=0", case[1], args), got)


@pytest.mark.parametrize("M", [100, 98, 64])
def test_a_tile_whose_sizes_all_have_vector_forms_has_no_scalar_tile_beside_them(
        M: int, target: cputarget.CpuTarget, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where the whole tile and its tiles of fewer rows cover every size the loops give (6-row tiles
    of 100 or 98 rows; 64 rows: 4 left on 6-row tiles), the scalar tile is compiled only for a build
    without the target's vectors; both builds give numpy's values."""
    k = tc.define(MATMUL)
    rng = np.random.default_rng(M)
    A, B = (rng.random(s, dtype=np.float32) * 2 - 1 for s in [(M, 64), (64, 48)])
    src = k.source(A, B)
    passes = str(k.lowered(A, B).passes[-1][1])
    got = k(A, B)
    assert_close(got, _mm(A, B), terms=64, scale=abs_terms(_mm, np.abs(A), np.abs(B)))
    if "no other size" not in passes:
        assert "} else\n" in src  # a scalar tile takes the sizes left
        return
    vector, scalar = src.split("#if TC_VEC", 1)[1].split("#else", 1)
    assert "acc[" not in vector and "acc[" in scalar.split("#endif", 1)[0]
    without = _built_with(monkeypatch, tmp_path, "-DTC_VEC=0", MATMUL, [A, B])
    assert_close(without, _mm(A, B), terms=64, scale=abs_terms(_mm, np.abs(A), np.abs(B)))


def test_conv_tile_shape(target: cputarget.CpuTarget) -> None:
    """conv2d at the benchmark's row width: the register tile fits the target's accumulators, and
    each input vector is loaded once per step and kept in a register."""
    k = tc.define(CONV)
    rng = np.random.default_rng(1)
    I = rng.random((2, 8, 56, 56), dtype=np.float32)
    W = rng.random((8, 8, 3, 3), dtype=np.float32)
    src = k.source(I, W)
    whole = _kernel_text(src).split("} else if")[0]  # the whole tile (a row's last tile may follow, shifted)
    fmas = whole.count("= tc_vf_fma(") + whole.count("= tc_hf_fma(")
    assert 0 < fmas <= target.accumulators, src
    if target.isa == "avx512":
        assert "a 4x54 register tile of O" in src, src
        # columns 0, 16 and 32 in full vectors, 46 to 53 in a half vector
        assert fmas == 16 and whole.count("= tc_hf_fma(") == 4
        assert src.count("tc_vf_load(&t0") == 3 and src.count("tc_hf_load(&t0") == 1
        assert "in 3 vectors of 16 and one of 8 per row (the last overlapping the one before)" in src
    assert "tc_keep(v" in src
    assert_sum_close(k(I, W), _conv, I, W, terms=72)


@pytest.mark.parametrize("shape", [(2, 8, 12, 40, 16), (2, 3, 7, 45, 32), (2, 4, 5, 50, 48), (2, 4, 6, 40, 24),
                                   (2, 128, 4, 40, 64), (2, 8, 4, 40, 128)],
                         ids=["cols-rest-2", "cols-rest-1", "cols-whole", "channels-24", "panels-295k", "channels-128"])
def test_conv_in_channel_vectors(shape: tuple, target: cputarget.CpuTarget) -> None:
    """On a target of 16 vector registers a conv whose output channels come in two, three or four
    vectors (a multiple of them) runs in vectors along the channels (24 channels on AVX2: three):
    the weights packed once into channel panels before the parallel loops, each input element
    broadcast, the kernel's width loop not unrolled, the columns
    cut short in a tile of fewer columns. A target with more registers does so only where the
    output rows leave lanes of their last vector idle (43 columns: 43 of 48 lanes; 48 columns keep
    the tile along them), in one vector of channels too where rows of at most two vectors sum over
    ONE_VECTOR_STEPS or more (16 filters on AVX-512, 8 on AVX2). Other channel counts keep the
    tile along the columns, and so do channels cut into cache tiles (128 of them), whose panels
    would be packed once per tile. Against numpy,
    and bit for bit against the scalar tile."""
    N, C, H, W, F = shape
    k = tc.define(CONV)
    rng = np.random.default_rng(2)
    I = (rng.random((N, C, H, W)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, 3, 3)) * 2 - 1).astype(np.float32)
    src = k.source(I, Wt)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    lanes = target.lanes("float32")
    cols = W - 2
    idle = cols < tileplan.FILLED_ROWS * lanes * -(-cols // lanes)
    vectors = any(F % (v * lanes) == 0 for v in tileplan.CHANNEL_VECTORS) or \
        F == lanes and C * 9 >= tileplan.ONE_VECTOR_STEPS and cols <= 2 * lanes  # one vector of them
    if (target.accumulators < 16 or idle) and vectors and F <= 64:
        assert "lanes per row along f" in passes and "once for every thread" in passes, passes
        assert "#pragma GCC unroll 1" in src and "tc_vf_load(&tc_pk0_at[" in src
        assert "tc_vf_gather(&t1" not in _kernel_text(src) and "tc_vf_set1(t0[" in src
    else:
        assert "lanes per row along w" in passes, passes
        assert "once for every thread" not in passes
    got = k(I, Wt)
    scalar = k(I, Wt, options=MappingOptions(vectorize=False))
    if target.fma:
        np.testing.assert_array_equal(got, scalar)
    assert_sum_close(got, _conv, I, Wt, terms=C * 9)


PADDED_CONV = """def convp(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H, w in 0:W
}"""


@pytest.mark.parametrize("filters", [8, 16])
def test_a_padded_convs_columns_take_the_channel_form_where_the_filters_fill_vectors(
        filters: int, target: cputarget.CpuTarget) -> None:
    """A padded conv's boundary columns whose filters fill whole vectors run in channel vectors x
    rows, the weights packed, not down the column with its rows gathered: in one vector of channels
    where the filters fill exactly one (8 on AVX2, 16 on AVX-512: polyhedral.tileplan.plan), in two
    where they fill two. Against numpy, and bit for bit against the scalar code."""
    N, C, H, W, F = 2, 8, 20, 20, filters
    lanes = target.lanes("float32")
    k = tc.define(PADDED_CONV)
    rng = np.random.default_rng(5)
    I = (rng.random((N, C, H, W)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    if F % lanes == 0:
        assert "lanes per row along h" not in passes, passes  # no column's rows gathered
        assert f"{F // lanes}x{lanes} lanes per row along f" in passes, passes
    if F == lanes:
        rows = min(H - 2, 24 if lanes == 16 else 12)  # the column's 18 rows, up to the tile's accumulators
        assert f"{rows}x{lanes} register tile of S1" in passes, passes
    got = k(I, Wt)
    if target.fma:
        np.testing.assert_array_equal(got, k(I, Wt, options=MappingOptions(vectorize=False)))
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert_sum_close(got, _conv, padded, Wt, terms=C * 9)


@pytest.mark.parametrize("filters", [16, 24])
def test_scattered_tiles_from_the_identity_fetch_their_lines(filters: int, target: cputarget.CpuTarget,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A padded conv's boundary columns (tiles of filter vectors x rows, or of rows down the column,
    each output element on a line of its own, scattered after the reduction) fetch the lines they
    will write over the steps of their outermost reduction loop, ceil(elements / trips) lines a
    step, every element once, and the pass prints it; the values are the bits of the kernel
    without the fetches, and numpy's."""
    N, C, H, W = 2, 8, 20, 20
    k = tc.define(PADDED_CONV)
    rng = np.random.default_rng(filters)
    I = (rng.random((N, C, H, W)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((filters, C, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    body = _kernel_text(k.source(I, Wt))
    lines = [line for line in passes.split("\n") if "register tile of S1" in line]
    fetching = [line for line in lines if "fetching its lines" in line]
    scattered = [line for line in lines if "gathered" in line and "stored in rows" not in line]
    assert fetching == scattered and fetching, passes  # each scattered tile (all start from the identity)
    for line in (x.split("; when ")[0] for x in fetching):  # ceil(elements / 8 channels, the outer loop's steps)
        extents = [int(x) for x in re.findall(r"(\d+(?:x\d+)*) register tile", line)[0].split("x")]
        vectors, lanes = map(int, re.findall(r"(\d+)x(\d+) lanes per row along", line)[0])
        per = int(re.findall(r"fetching its lines (\d+) per c", line)[0])
        assert per == -(-math.prod(extents[:-1]) * vectors * lanes // C), line
    # a tile's rests (24 filters: 16 + 8 lanes) are tiles of their own, each fetching
    assert body.count("__builtin_prefetch((const void *)(tc_ft[tc_j / ") == passes.count("fetching its lines"), body
    got = k(I, Wt)
    monkeypatch.setattr(vecplan, "_fetch_target", lambda *a: 0)
    plain = tc.define(PADDED_CONV)
    assert "tc_ft" not in _kernel_text(plain.source(I, Wt))
    np.testing.assert_array_equal(got, plain(I, Wt))
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert_sum_close(got, _conv, padded, Wt, terms=C * 9)


@pytest.mark.parametrize("width", [32, 34])
def test_a_conv_whose_channel_planes_alias_in_l1_takes_one_vector_of_channels(
        width: int, target: cputarget.CpuTarget) -> None:
    """A conv in channel vectors whose output planes are 4 KiB apart (32x32 float32, from 34x34
    inputs) takes one vector of channels x the budget's columns, so that a tile's scattered stores
    stay in one L1 set's ways; 30x30 planes keep all the channels in one tile (4 vectors of 8 on
    AVX2: polyhedral.tileplan.ALIAS_BYTES). Against numpy, and bit for bit against the scalar code."""
    N, C, F = 2, 16, 32
    k = tc.define(CONV)
    rng = np.random.default_rng(7)
    I = (rng.random((N, C, width, width)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    lanes = target.lanes("float32")
    if target.accumulators < 16 and F == 4 * lanes:  # AVX2: the channel form, all 32 filters in 4 vectors
        want = f"1x{lanes} lanes per row along f" if width == 34 else f"4x{lanes} lanes per row along f"
        assert want in passes, passes
    # where the filters run down the output planes, each tile stores its columns as rows, side by side
    tiles = [line for line in passes.split("\n") if "lanes per row along f" in line]
    assert all("stored in rows along" in line for line in tiles), passes
    if tiles:
        assert "_scatter_rows(&t2[" in k.source(I, Wt) and "_scatter(&t2[" not in k.source(I, Wt)
    got = k(I, Wt)
    if target.fma:
        np.testing.assert_array_equal(got, k(I, Wt, options=MappingOptions(vectorize=False)))
    assert_sum_close(got, _conv, I, Wt, terms=C * 9)


@pytest.mark.parametrize("width", [45, 57])
def test_a_conv_in_filter_vectors_stores_its_columns_as_rows(width: int, target: cputarget.CpuTarget) -> None:
    """A conv in vectors of its 64 filters stores each tile's output columns as rows, side by side
    (``tc_vf_scatter_rows``); a row's last tile of one column (43 = 7x6 + 1 on AVX-512, 55 = 18x3 + 1
    on AVX2) scatters it. The same bits as the scalar code, and numpy's values."""
    N, C, F = 2, 16, 64
    k = tc.define(CONV)
    rng = np.random.default_rng(11)
    I = (rng.random((N, C, 9, width)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    tiles = [line for line in passes.split("\n") if "lanes per row along f" in line]
    if tiles:  # the filters in the lanes, the columns across the tile
        assert all("stored in rows along" in line for line in tiles), passes
        src = k.source(I, Wt)
        assert "_scatter_rows(&t2[" in src, src
        if (width - 2) % int(re.findall(r"(\d+)x\d+ register tile", tiles[0])[0]) == 1:
            assert "_scatter(&t2[" in src, src  # the one-column tile
    got = k(I, Wt)
    if target.fma:
        np.testing.assert_array_equal(got, k(I, Wt, options=MappingOptions(vectorize=False)))
    assert_sum_close(got, _conv, I, Wt, terms=C * 9)


STRIDED_PADDED_CONV = """def convsp(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,2*h + r_kh - 1,2*w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H / 2, w in 0:W / 2
}"""


def test_a_strided_padded_convs_narrow_interior_runs_in_channel_vectors(target: cputarget.CpuTarget) -> None:
    """A padded conv's interior whose rows are narrower than one float32 vector (a stride-2 conv of
    28 columns padded by 1: 13 of its 14 output columns, read two apart) runs in vectors of its
    filters on every target, as the unpadded conv does (polyhedral.tileplan.plan); on AVX-512 it
    kept its rows, with no vector form at all. Against numpy, and bit for bit against the scalar code."""
    N, C, H, W, F = 2, 32, 28, 28, 32
    k = tc.define(STRIDED_PADDED_CONV)
    rng = np.random.default_rng(6)
    I = (rng.random((N, C, H, W)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1])
    tiles = [line for line in passes.split("\n") if "register tile of S1" in line]
    if F % target.lanes("float32") == 0:
        assert tiles and all("lanes per row along f" in line for line in tiles), passes
    got = k(I, Wt)
    if target.fma:
        np.testing.assert_array_equal(got, k(I, Wt, options=MappingOptions(vectorize=False)))
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))

    def conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return _conv(x, w)[:, :, ::2, ::2][:, :, :got.shape[2], :got.shape[3]]

    assert_sum_close(got, conv, padded, Wt, terms=C * 9)


STEM = """def stem(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,2 * h + r_kh - 3,2 * w + r_kw - 3) * W1(f,r_c,r_kh,r_kw) where h in 0:H / 2, w in 0:W / 2
}"""


def test_a_stem_convs_window_runs_in_vectors_of_its_filters(target: cputarget.CpuTarget) -> None:
    """A network's first conv: 3 channels under a 7x7 window, stride 2, padded by 3. Its
    reductions are each narrower than a vector and its output rows are read two apart, so neither
    its window's columns (in masked vectors of 7 lanes, an element at a time) nor its rows (no
    vector load along them) make vectors: its interior runs in vectors of its 16 filters, as its
    boundary rows do. On a target of 4 lanes (SSE2, NEON, generic 16-byte vectors) the window's
    7 columns are wider than a vector and sum in vectors of their own. The numbers are numpy's."""
    N, C, H, W, F, K = 2, 3, 48, 48, 16, 7
    k = tc.define(STEM)
    rng = np.random.default_rng(7)
    I = (rng.random((N, C, H, W)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, K, K)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, Wt).passes[-1][1]).split("\n")
    plans = [line.strip() for line in passes if "register tile of S1" in line or "accumulate S1" in line]
    calls = [line.strip() for line in passes if line.strip().startswith("S1(")]
    assert len(plans) == len(calls), "\n".join(passes)
    # the interior: rows and columns both past the padding's reach (h, w >= 2 here)
    interior = r"S1\(c0, [^,]+, \(+c\d+( \+ c\d+s?\))? \+ 2\), \(+c\d+( \+ c\d+s?\))? \+ 2\)"
    inner = [p for p, c in zip(plans, calls) if re.match(interior, c)]
    if K < target.lanes("float32"):
        assert len(inner) == 1 and "register tile" in inner[0] and "lanes per row along f" in inner[0], \
            "\n".join(passes)
    else:
        assert len(inner) == 1 and "accumulate S1" in inner[0] and " lanes + 3 masked per" in inner[0], \
            "\n".join(passes)
    got = k(I, Wt)
    padded = np.pad(I, ((0, 0), (0, 0), (3, 3), (3, 3)))

    def conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return _conv(x, w)[:, :, ::2, ::2][:, :, :got.shape[2], :got.shape[3]]

    assert_sum_close(got, conv, padded, Wt, terms=C * K * K)


def test_a_conv_over_an_offset_range_tiles_from_where_it_starts(target: cputarget.CpuTarget) -> None:
    """A conv written for its interior only (`where h in 2:30, w in 2:30`: the output's first two
    rows and columns stay 0) is scheduled from where its ranges start: its register tiles are
    whole, in vectors, with no `max(0, 2 - c)` bound cutting them (it ran 16x slower than the
    whole padded conv, with no vector form). The numbers are numpy's."""
    N, C, S, F, K = 2, 8, 20, 16, 5
    k = tc.define(f"""def inner(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {{
        O(n,f,h,w) +=! I(n,r_c,h + r_kh - 2,w + r_kw - 2) * W1(f,r_c,r_kh,r_kw) where h in 2:{S - 2}, w in 2:{S - 2}
    }}""")
    rng = np.random.default_rng(8)
    I = (rng.random((N, C, S, S)) * 2 - 1).astype(np.float32)
    Wt = (rng.random((F, C, K, K)) * 2 - 1).astype(np.float32)
    text = str(k.lowered(I, Wt).passes[-1][1])
    tiles = [line for line in text.split("\n") if "register tile of S1" in line]
    assert tiles and all("lanes per row" in line for line in tiles) and "max(" not in text, text
    got = k(I, Wt)
    assert got.shape == (N, F, S - 2, S - 2)
    assert_sum_close(got, lambda x, w: np.pad(_conv(x, w), ((0, 0), (0, 0), (2, 0), (2, 0))), I, Wt, terms=C * K * K)


GROUP_CONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,r_c,h + r_kh,w + r_kw) * W1(g,f,r_c,r_kh,r_kw)
}"""


def test_a_conv_row_tile_prefetches_the_next_rows_of_its_input(target: cputarget.CpuTarget) -> None:
    """A tile of one output row reads rows h..h+2 of each channel; at each channel it prefetches the
    row the next tile (h + 1) reads first, h + 3, from the input itself. The last tile's prefetches
    point past the input (harmless); a tile in channel vectors, which slides along the contiguous
    columns, prefetches nothing. Against numpy."""
    k = tc.define(GROUP_CONV)
    rng = np.random.default_rng(5)
    I = (rng.random((2, 3, 4, 9, 20)) * 2 - 1).astype(np.float32)
    W = (rng.random((3, 8, 4, 3, 3)) * 2 - 1).astype(np.float32)
    passes = str(k.lowered(I, W).passes[-1][1])
    tiles = [line for line in passes.split("\n") if "register tile of S1" in line]
    src = _kernel_text(k.source(I, W))
    fetched = re.findall(r"__builtin_prefetch\(\(const void \*\)\(\(uintptr_t\)t0 \+ sizeof\(\*t0\) \* "
                         r"\((.*)\)\)\);", src)
    if tiles and all("lanes per row along f" in line for line in tiles):  # 4-lane targets: channel vectors
        assert not fetched and not any("prefetching" in line for line in tiles), tiles
    else:  # the loop of h, the output's row (its 4th index), whichever the target's schedule names it
        row = re.search(r"S1\((?:[^,]+, ){3}(c\d+),", passes)
        assert row is not None, passes
        assert tiles and all(f"prefetching I along {row.group(1)}" in line for line in tiles), tiles
        assert fetched and all(f"({row.group(1)} + 1)) + (2)) * 20L" in f for f in fetched), fetched
    got = k(I, W)
    assert_sum_close(got, lambda a, b: np.einsum("ngchwkl,gfckl->ngfhw", np.lib.stride_tricks.sliding_window_view(
        a, (3, 3), axis=(3, 4)), b, dtype=np.float64), I, W, terms=4 * 9)
    if target.accumulators < 16:  # AVX2's conv in channel vectors slides along the columns
        C = (rng.random((2, 8, 6, 40)) * 2 - 1).astype(np.float32)
        Wc = (rng.random((16, 8, 3, 3)) * 2 - 1).astype(np.float32)
        conv = tc.define(CONV)
        lines = [line for line in str(conv.lowered(C, Wc).passes[-1][1]).split("\n") if "lanes per row along f" in line]
        assert lines and not any("prefetching" in line for line in lines), lines
        assert "__builtin_prefetch" not in _kernel_text(conv.source(C, Wc))
        assert_sum_close(conv(C, Wc), _conv, C, Wc, terms=8 * 9)


def _kernel_text(src: str) -> str:
    """The kernel's function, without the preludes (whose vector functions use the layer too)."""
    return src[src.index("int tc_kernel("):]


SOFTMAX = """def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n,r_d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,r_d)
    Y(n,d) = e(n,d) / s(n)
}"""
SCALE = """def scale(float(N,D) X, float(N) M, float(N) S) -> (Y) {
    Y(n,d) = (X(n,d) - M(n)) * 0.5 / S(n)
    Y(n,d) = Y(n,d) * X(n,d)
}"""


UNIFORM_CALLS = """def uc({t}(N,D) X, {t}(N) S) -> (Y) {{
    Y(n,d) = X(n,d) - log(S(n)) + tanh(S(n)) * exp(-S(n)) + sigmoid(S(n)) * X(n,d)
}}"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("D", [3, 5, 9, 17, 40])
def test_calls_of_values_fixed_along_the_row_are_broadcast(target: cputarget.CpuTarget, dtype: str, D: int) -> None:
    """``log(S(n))`` along ``d`` (log_softmax's) is computed once in scalar code and broadcast,
    whichever the type (float64 has no vector log) and whether rows hold whole vectors or not:
    numpy's values."""
    rng = np.random.default_rng(D)
    X = (rng.random((6, D)) * 2 - 1).astype(dtype)
    S = (rng.random(6) + 0.5).astype(dtype)
    k = tc.define(UNIFORM_CALLS.format(t=dtype))
    X64, S64 = X.astype(np.float64)[:, :], S.astype(np.float64)[:, None]
    want = X64 - np.log(S64) + np.tanh(S64) * np.exp(-S64) + X64 / (1 + np.exp(-S64))
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(k(X, S), want, rtol=0, atol=16 * eps * (1 + np.abs(want)).max())


@pytest.mark.parametrize("D", [1024, 1000])
def test_vector_loop_softmax(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, D: int) -> None:
    """softmax's exp and division loops in explicit vectors (exp inlined on AVX-512, libmvec's
    elsewhere): the auto-vectorised
    loops' values (-DTC_VEC=0; the bits where the row sum is not in vector accumulators, whose
    order of addition differs), close to numpy, with rows of whole vectors or not."""
    X = (np.random.default_rng(2).random((16, D), dtype=np.float32) - 0.5) * 20
    k = tc.define(SOFTMAX)
    src = k.source(X)
    assert "(tc_vf_load(&r" in src and " / " in src, src  # e / s, e in a row buffer
    t = toolchain.target()
    if t.isa != "avx512" and toolchain.has_vector_math():  # libmvec's expf in a simd loop (vecexpr.libmvec_exp)
        assert "TC_EXPF((" in src, src
    elif D == 1024:  # 4 tiles of 256: exp and sum in loops of their own (D = 1000: exp fused with the sum)
        assert "tc_vf_exp((" in src, src
    if D % t.lanes("float32"):  # the division's rows end in an overlapping vector
        assert "overlapping the vector before" in src, src
    got = k(X)
    scalar = _built_with(monkeypatch, tmp_path, "-DTC_VEC=0", SOFTMAX, [X])
    if any("accumulate S3" in line and "vector" in line for line in lower.trace(k.lowered(X).passes).splitlines()):
        assert_close(got, scalar, terms=D, scale=scalar)  # the sum's D roundings, in another order
    else:
        np.testing.assert_array_equal(scalar, got)
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    # all terms positive: within D roundings of the sum and ~20 of exp's argument, relative to each element
    assert_close(got, want, terms=D + 20, scale=want)


@pytest.mark.parametrize("D", [48, 50])
def test_vector_loop_broadcast_and_in_place(D: int) -> None:
    """Broadcast reads and a constant in a vector loop of two statements; the loop, which updates
    Y in place, ends rows that are not whole vectors in a masked vector (an overlapping one would
    update its elements twice)."""
    rng = np.random.default_rng(3)
    X = rng.random((8, D), dtype=np.float32)
    M = rng.random(8, dtype=np.float32)
    S = rng.random(8, dtype=np.float32) + 1
    k = tc.define(SCALE)
    src = k.source(X, M, S)
    stores = [line for line in src.split("\n") if "tc_vf_store(&" in line]
    masked = [line for line in _kernel_text(src).split("\n") if "tc_vf_store_n(" in line]
    whole = D % toolchain.target().lanes("float32") == 0
    assert len(stores) == 2 and len(masked) == (0 if whole else 2), src
    assert ("+ 1 masked" in str(k.lowered(X, M, S).lowered_ir)) != whole
    want = ((X.astype(np.float64) - M[:, None]) * 0.5 / S[:, None]) * X
    # a handful of roundings, relative to |X| + |M| where X - M cancels (all inputs are positive)
    assert_close(k(X, M, S), want, terms=4, scale=((X + M[:, None]) * 0.5 / S[:, None]) * X)


MASK = """def mask(float(N,D) G, float(N,D) O, float(D) B) -> (Y, Z) {
    Y(n,d) = G(n,d)
    Y(n,d) = Y(n,d) * ((O(n,d) + B(d) >= 0.0) ? 1.0 : 0.0)
    Z(n,d) = O(n,d) < G(n,d) ? O(n,d) : -G(n,d)
}"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("D", [203, 64])
def test_vector_loops_select_on_comparisons(D: int, dtype: str, target: cputarget.CpuTarget) -> None:
    """A pointwise loop's ``?:`` on a comparison of its values (a relu's backward mask, a
    min-like choice whose branches read what the comparison read) runs in vectors, lane by lane:
    both sides, then a select, as the vectorise pass prints; the mask updates Y in place, so
    rows of 203 end in a masked vector. Exactly numpy's values, NaN comparing false."""
    rng = np.random.default_rng(4)
    G, O = (rng.standard_normal((40, D)).astype(dtype) for _ in range(2))
    B = rng.standard_normal(D).astype(dtype)
    O[3, 5] = O[7, D - 1] = np.nan
    k = tc.define(MASK.replace("float(", f"{dtype}("))
    text = str(k.lowered(G, O, B).lowered_ir)
    lanes = target.lanes(dtype)
    assert text.count(" lanes") == 2 and ("+ 1 masked" in text) == (D % lanes != 0), text
    Y, Z = k(G, O, B)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(Y, G * np.where(O + B >= 0, 1.0, 0.0).astype(dtype))
        np.testing.assert_array_equal(Z, np.where(O < G, O, -G))


ROWS = """def rows(float(N,D) X, float(N,D) Y) -> (S, P, MX, MN, Q) {
    S(n) +=! X(n,r_d)
    P(n) *=! Y(n,r_d)
    MX(n) max=! X(n,r_d)
    MN(n) min=! X(n,r_d)
    Q(n) +=! X(n,r_d) * Y(n,r_d)
}"""


def _check_rows(k: tc.Kernel, X: np.ndarray, Y: np.ndarray, dtype: str) -> tuple[np.ndarray, ...]:
    """ROWS' results on X and Y, checked against numpy: sums close to float64 within the terms'
    roundings, max and min exact (numpy's propagate NaN too)."""
    S, P, MX, MN, Q = k(X, Y)
    D = X.shape[1]
    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    with np.errstate(invalid="ignore"):
        assert_close(S, X64.sum(1), terms=D, scale=np.abs(X64).sum(1), dtype=dtype)
        assert_close(Q, (X64 * Y64).sum(1), terms=D, scale=np.abs(X64 * Y64).sum(1), dtype=dtype)
        assert_close(P, Y64.prod(1), terms=D, scale=Y64.prod(1), dtype=dtype)
    np.testing.assert_array_equal(MX, X.max(1))
    np.testing.assert_array_equal(MN, X.min(1))
    return S, P, MX, MN, Q


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("D", [1024, 203])
def test_row_reductions_in_vector_accumulators(D: int, dtype: str, target: cputarget.CpuTarget) -> None:
    """Row reductions (+, *, max, min and a sum of products) take explicit vector accumulators,
    as the vectorise pass prints: sums close to numpy within D roundings of their |terms|, max and
    min exact, with rows of whole vectors or not (203: the last elements in a masked vector); a NaN in
    the vector part or in the last elements reaches the row's sum, max and min."""
    rng = np.random.default_rng(7)
    X = (rng.random((200, D)) - 0.5).astype(dtype)  # rows enough for the threads (astgen.SERIAL_BELOW)
    Y = (1 + (rng.random((200, D)) - 0.5) * 0.01).astype(dtype)
    X[2, 5] = X[4, D - 1] = np.nan
    k = tc.define(ROWS.replace("float(", f"{dtype}("))
    lanes = target.lanes(dtype)
    parts = min(4, D // lanes)
    rest = f" + {D % lanes} masked" if D % lanes else ""
    text = str(k.lowered(X, Y).lowered_ir)  # the IR the emitter prints, after every pass
    assert text.count(f"(simd; vector {parts} x {lanes} lanes{rest})") == 5, text
    S, P, MX, MN, Q = _check_rows(k, X, Y, dtype)
    assert np.isnan(S[[2, 4]]).all() and np.isnan(Q[[2, 4]]).all() and not np.isnan(S[[0, 1, 3, 5]]).any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("D", [30, 7])
@pytest.mark.parametrize("name", TARGET_NAMES)
def test_a_rows_last_elements_read_as_the_overlapping_vector(name: str, D: int, dtype: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Where whole vectors come before a row's last elements and masked loads are slow (every target
    but AVX-512), the sums read those elements as the overlapping vector that ends the row, the lanes
    it shares with the vector before zeroed: each element counts once (a huge value there is not
    added twice, an infinity gives inf and not NaN), the identity fills the shared lanes of a product,
    max and min. AVX-512 and rows shorter than a vector load the last elements masked."""
    monkeypatch.setenv("TCDSL_CPU", name)
    lanes = toolchain.target().lanes(dtype)
    rng = np.random.default_rng(5)
    X = (rng.random((64, D)) - 0.5).astype(dtype)
    Y = (1 + (rng.random((64, D)) - 0.5) * 0.01).astype(dtype)
    shared = max(D - lanes, 0)  # a lane both the last whole vector and the overlapping one load
    X[1, shared], X[2, shared], Y[3, shared] = 1e6, np.inf, 3.0
    k = tc.define(ROWS.replace("float(", f"{dtype}("))
    text = _kernel_text(k.source(X, Y))
    top = name != "avx512" and D >= lanes and D % lanes != 0
    assert ("_load_top(" in text) == top and ("_load_n(" in text) == (D % lanes != 0 and not top), text
    S, P, MX, MN, Q = _check_rows(k, X, Y, dtype)
    assert S[2] == np.inf and Q[2] == np.inf and MX[2] == np.inf


UNIFORM = """def norm(float(N,D) X, float(N) V, float(D) G) -> (M, Y, Q) {
    M(n) +=! X(n,r_d) / D
    Y(n,d) = X(n,d) * rsqrt(V(n) + 1.0) * (V(n) > 0.5 ? 2.0 : 1.0) * G(d)
    Q(d) +=! X(r_n,d) * rsqrt(V(r_n) + 1.0)
}"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parts_that_do_not_move_along_the_vectors_are_broadcast(dtype: str, target: cputarget.CpuTarget) -> None:
    """A size converted to a float (``/ D``), a builtin call and a ``?:`` on values that stay the
    same along the vector loop are computed in scalar code and broadcast: the row sum, the
    pointwise loop and the column-sum register tile (layernorm's forward and backward) all run in
    explicit vectors, as the vectorise pass prints, with numpy's values."""
    rng = np.random.default_rng(3)
    X = (rng.random((300, 203)) - 0.5).astype(dtype)
    V = rng.random(300).astype(dtype)
    G = (rng.random(203) + 0.5).astype(dtype)
    k = tc.define(UNIFORM.replace("float(", f"{dtype}("))
    text = str(k.lowered(X, V, G).lowered_ir)
    lanes = target.lanes(dtype)
    sums = rf"accumulate S1 over c\d+ in a local \(simd; vector {min(4, 203 // lanes)} x {lanes} lanes"
    assert re.search(sums, text), text
    if lanes >= 4:  # (two lanes: the column tile's 203 columns in tiles of 12 with bounds it does not vectorise)
        assert re.search(r"register tile of S3 .*; vector \d+x\d+ lanes per row", text), text
    assert re.search(r"S2\(.*\n?", text) and re.search(r"hoist .* vector \d+ x \d+ lanes", text), text
    M, Y, Q = k(X, V, G)
    X64, V64, G64 = X.astype(np.float64), V.astype(np.float64), G.astype(np.float64)
    r = 1 / np.sqrt(V64 + 1)
    assert_close(M, (X64 / 203).sum(1), terms=203, scale=np.abs(X64 / 203).sum(1), dtype=dtype)
    want_y = X64 * r[:, None] * np.where(V64 > 0.5, 2.0, 1.0)[:, None] * G64
    assert_close(Y, want_y, terms=4, scale=np.abs(want_y), dtype=dtype)
    assert_close(Q, (X64 * r[:, None]).sum(0), terms=300, scale=np.abs(X64 * r[:, None]).sum(0), dtype=dtype)


NEST = """def nest(float(N,F,W) A, float(N,C,W) B, float(N,F,H,W) dO, float(N,C,HI,WI) I) -> (S, MX, MN, dW) {
    S(f, c) +=! A(r_n, f, r_w) * B(r_n, c, r_w)
    MX(f) max=! A(r_n, f, r_w)
    MN(f) min=! A(r_n, f, r_w)
    dW(f, c, kh, kw) +=! dO(r_n, f, r_h, r_w) * I(r_n, c, r_h + kh, r_w + kw) where kh in 0:3, kw in 0:3
}"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("W", [30, 32, 12, 7])
def test_reduction_nests_accumulate_in_vectors_across_their_rows(W: int, dtype: str,
                                                                 target: cputarget.CpuTarget) -> None:
    """A reduction over a nest of loops (a conv's weight gradient: batch, rows, columns) keeps its
    element and its vector accumulators across the whole nest, as the passes print, with each
    row's last elements in a masked vector (30 columns: 16 + 14 on AVX-512, 24 + 6 on AVX2; rows
    shorter than a vector, 7 or 12 columns, in that masked vector alone); the
    sums take the elements of the short loops around them at once, one accumulator each, its
    masked vector included, in the way with the fewest loads per multiply-add that the target's
    accumulators hold (the weight gradient of 4 filters: AVX2's 12 hold a strip of 2 filters x the
    window's 3 columns, 5 loads for 6 multiply-adds, rather than one filter's whole 3x3 window, 10
    for 9; AVX-512's 24 hold 2 filters' whole windows, 11 for 18), max and min one element each;
    sums close to float64 within the terms' roundings, max and min exact, and a NaN in a row's
    masked part reaches the sum, max and min."""
    rng = np.random.default_rng(11)
    N, F, C, H = 3, 4, 5, 6
    A, B = (rng.standard_normal(s).astype(dtype) for s in ((N, F, W), (N, C, W)))
    dO, I = rng.standard_normal((N, F, H, W)).astype(dtype), rng.standard_normal((N, C, H + 2, W + 2)).astype(dtype)
    A[1, 2, W - 1] = np.nan  # the last column: in the masked vector when W is not whole vectors
    k = tc.define(NEST.replace("float(", f"{dtype}("))
    lanes = target.lanes(dtype)
    rest = f" + {W % lanes} masked" if W % lanes else ""
    form = f" x {lanes} lanes{rest} per " if W >= lanes else f"vector {W} of {lanes} lanes masked per "
    text = str(dict(k.lowered(A, B, dO, I).passes)["vectorise"])
    lines = {line.split("accumulate ")[1].split(" ")[0]: line for line in text.split("\n") if "// accumulate" in line}
    assert len(lines) == 4 and all(form in x for x in lines.values()), text
    assert all(", " in x.split(" over ")[1].split(" in a local")[0] for x in lines.values()), text  # nests, not rows
    assert "at once" in lines["S1"] and "at once" in lines["S4"], text  # the sums: several elements at once
    # a strip of 2 filters (all that 4 filters split into) sharing the input's loads, with the
    # window's columns, or its whole window where 18 accumulators fit
    window = r" \(3\), c\d+ \(3\)" if 18 <= target.accumulators else r" \(3\)"
    assert re.search(rf"the elements of c\d+s \(2\), c\d+{window} at once", lines["S4"]), text
    assert "at once" not in lines["S2"] + lines["S3"], text  # max and min: one element each
    S, MX, MN, dW = k(A, B, dO, I)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    with np.errstate(invalid="ignore"):
        assert_close(S, np.einsum("nfw,ncw->fc", A64, B64), terms=N * W,
                     scale=np.einsum("nfw,ncw->fc", np.abs(A64), np.abs(B64)), dtype=dtype)
        np.testing.assert_array_equal(MX, A.max((0, 2)))
        np.testing.assert_array_equal(MN, A.min((0, 2)))
    assert np.isnan(S[2]).all() and not np.isnan(S[[0, 1, 3]]).any()
    win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (3, 3), axis=(2, 3))[:, :, :H, :W]
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(dW, ref, terms=N * H * W, scale=scale, dtype=dtype)


def test_a_jammed_sum_loads_what_its_elements_share_once_a_step(target: cputarget.CpuTarget) -> None:
    """A weight gradient's jammed sum makes each distinct load of a step once, into a local: the
    input's taps, and the output gradient once per filter of the strip. Loads that several
    elements use are held in registers (tc_keep), so GCC cannot reload them as operands of each
    multiply-add: first as many as the registers beside the accumulators hold, for the whole step;
    each other load comes just before the updates that use it, held too while the ones live at
    once fit (AVX2, 4 filters x 3 taps: the output gradient's, used by three updates each, one
    register at a time); the step loop is not unrolled (two steps' registers would spill); the
    result matches float64."""
    rng = np.random.default_rng(12)
    N, F, C, H, W = 2, 8, 3, 5, 48
    A, B, dO, I = (rng.standard_normal(s).astype(np.float32)
                   for s in ((N, F, W), (N, C, W), (N, F, H, W), (N, C, H + 2, W + 2)))
    k = tc.define(NEST)
    src = k.source(A, B, dO, I)
    steps, starts = [], []  # the bodies of the jammed sums' step loops (S's and dW's), their lines
    lines = src.split("\n")
    for i, x in enumerate(lines):
        if x.strip() == "#pragma GCC unroll 1" and lines[i + 1].strip().startswith("for (; "):
            body = lines[i + 2:]
            steps.append([y.strip() for y in body[:next(j for j, y in enumerate(body) if y.strip() == "}")]])
            starts.append(i)
    plan = re.search(r"accumulate dW over .*, the elements of (.*) at once", src)
    assert plan is not None, src
    # dW's step loop: the first after its plan (S's sum may take other elements at once)
    step = next(x for x, at in zip(steps, starts) if at > src[:plan.start()].count("\n"))
    sizes = [int(x) for x in re.findall(r"\((\d+)\)", plan.group(1))]
    strip, taps = sizes[0], math.prod(sizes[1:])  # the filters' strip first, then the window's loops
    assert "s (" in plan.group(1) and strip * taps <= target.accumulators, plan.group(0)
    declared = [x for x in step if "_load(&" in x]
    updates = [x for x in step if x.startswith("q") and "_fma(" in x]
    assert len(updates) == taps * strip and len(declared) == taps + strip, "\n".join(step)
    assert all("_load(" not in x for x in updates), "\n".join(step)  # every operand a local

    def uses(name: str, lines: list[str]) -> int:
        return sum(u.count(f"({name},") + u.count(f" {name},") for u in lines)

    spare = target.vector_registers - strip * taps - 1
    first = step.index(updates[0])
    ahead = [x for x in step[:first] if "_load(&" in x]  # held for the whole step
    held = min(spare, len(declared))
    assert len(ahead) == held + (held < len(declared)), "\n".join(step)  # and the first other load
    assert all("tc_keep(" in x for x in ahead[:held]), "\n".join(step)
    for x in declared[held:]:
        name = x.split(" = ")[0].split()[-1]
        # its updates follow it, before the next load, and it is held there (one register at a time)
        at = step.index(x)
        after = step[at + 1:]
        end = next((i for i, y in enumerate(after) if "_load(&" in y), len(after))
        assert uses(name, after[:end]) == uses(name, updates), "\n".join(step)
        assert ("tc_keep(" in x) == (uses(name, updates) > 1), x
    *_, dW = k(A, B, dO, I)
    win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (3, 3), axis=(2, 3))[:, :, :H, :W]
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(dW, ref, terms=N * H * W, scale=scale, dtype="float32")


@pytest.mark.parametrize("W", [28, 14])
def test_a_jammed_sums_overlapping_vector_shares_its_loads_as_a_step(W: int, target: cputarget.CpuTarget) -> None:
    """Where a weight gradient's rows end in the overlapping vector (every target but AVX-512, rows
    that are not whole vectors) after two whole vectors or more (AVX2: 28 = 3 x 8 + 4), its
    multiply-adds share their loads as a whole step's do: each distinct read once, zeroed in the
    lanes the vector before summed (``_load_top``), into a local the updates use; after one (14 =
    8 + 6) each update loads its own. A huge value and an infinity in those lanes count once (inf,
    not NaN); the numbers are float64's."""
    rng = np.random.default_rng(13)
    N, F, C, H = 2, 8, 3, 5
    A, B, dO, I = (rng.standard_normal(s).astype(np.float32)
                   for s in ((N, F, W), (N, C, W), (N, F, H, W), (N, C, H + 2, W + 2)))
    lanes = target.lanes("float32")
    shared = W - lanes + 1 if W > lanes else 0  # a column both the last whole vector and the overlapping one read
    I[0, 1, 2, shared], I[1, 2, 3, shared] = 1e6, np.inf
    k = tc.define(NEST)
    src = _kernel_text(k.source(A, B, dO, I))
    section = src[src.index("accumulate dW over"):]
    section = section[:section.index("#else")]
    top = target.isa != "avx512" and W > lanes and W % lanes != 0
    tails = [x.strip() for x in section.split("\n") if "_load_top(" in x]
    plan = re.search(r"the elements of (.*) at once", section)
    assert plan is not None, section
    strip, *window = (int(x) for x in re.findall(r"\((\d+)\)", plan.group(1)))
    if top and W >= 2 * lanes:  # one load per filter of the strip and per tap, each a local
        assert len(tails) == strip + math.prod(window), "\n".join(tails)
        assert all(re.match(r"tc_vf v\d+ = tc_vf_load_top\(", x) for x in tails), "\n".join(tails)
    elif top:
        assert tails and not any(re.match(r"tc_vf v\d+ = tc_vf_load_top\(", x) for x in tails), "\n".join(tails)
    else:
        assert not tails, "\n".join(tails)
    *_, dW = k(A, B, dO, I)
    win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (3, 3), axis=(2, 3))[:, :, :H, :W]
    with np.errstate(invalid="ignore"):
        ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
        scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    inf = np.isinf(ref)
    assert inf.any() and np.array_equal(np.isinf(dW), inf) and np.array_equal(dW[inf], ref[inf])
    assert_close(dW[~inf], ref[~inf], terms=N * H * W, scale=scale[~inf], dtype="float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("window", [5, 7])
def test_weight_gradients_of_wide_windows_sum_along_rows(window: int, dtype: str, target: cputarget.CpuTarget) -> None:
    """The weight gradient of a 5x5 or 7x7 conv: the window's columns (the target's contiguous
    member) are narrow (fewer than 8, or narrower than a vector: also where a vector holds only 4,
    float64 on AVX2, SSE2), and the rows summed over (24 or 30 columns: longer than a vector on
    every target) walk both operands contiguously. So the reductions run innermost, in vectors
    along the rows, the window's columns taken at once (with a strip of filters where the
    accumulators hold it), and no register tile runs across the channels, gathered (float64 on
    AVX2, 8x16x32x32 with 32 filters, the backward: 5x5 44 -> 11 ms, 7x7 padded 22 -> 6.7); the
    numbers are numpy's."""
    rng = np.random.default_rng(14)
    N, F, C, H, W = 2, 8, 3, 2 * window + 3, 4 * window + 8
    I = rng.standard_normal((N, C, H, W)).astype(dtype)
    dO = rng.standard_normal((N, F, H - window + 1, W - window + 1)).astype(dtype)
    k = tc.define("""def dw(DT(N,C,H,W) I, DT(N,F,OH,OW) dO) -> (dW) {
        dW(f, c, kh, kw) +=! dO(r_n, f, r_h, r_w) * I(r_n, c, r_h + kh, r_w + kw) where kh in 0:KH, kw in 0:KW
    }""".replace("KH", str(window)).replace("KW", str(window)).replace("DT(", f"{dtype}("))
    text = str(dict(k.lowered(I, dO).passes)["vectorise"])
    assert "register tile" not in text, text
    sums = [line for line in text.splitlines() if "// accumulate S1 over" in line]
    assert len(sums) == 1 and re.search(rf"the elements of (c\d+s \(\d+\), )?c\d+ \({window}\) at once", sums[0]), text
    win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (window, window), axis=(2, 3))
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(k(I, dO), ref, terms=dO[:, 0].size, scale=scale, dtype=dtype)


def _padded_weight_gradient(n: int, c: int, f: int, size: int, k: int, seed: int):
    """A padded conv's weight gradient as autodiff derives it for a window of any size: the input
    read from a zero-padded copy, rows and columns of literal range. The kernel, its arguments
    and a check of its numbers against float64 numpy."""
    p = k // 2
    kernel = tc.define(f"""def dw(float(N,C,H,W) I, float(N,F,{size},{size}) dO, float(F,C,KH,KW) Wt) -> (dW) {{
        Ip(p0, p1, p2, p3) = I(p0, p1, p2 - {p}, p3 - {p})
            where p0 in 0:N, p1 in 0:C, p2 in 0:KH + {size - 1}, p3 in 0:KW + {size - 1}
        dW(f, c, kh, kw) +=! dO(n, f, h, w) * Ip(n, c, h + kh, kw + w)
            where f in 0:F, c in 0:C, kh in 0:KH, kw in 0:KW, n in 0:N, h in 0:{size}, w in 0:{size}
    }}""")
    rng = np.random.default_rng(seed)
    I, dO, Wt = (rng.standard_normal(s).astype(np.float32)
                 for s in ((n, c, size, size), (n, f, size, size), (f, c, k, k)))

    def check() -> None:
        pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
        win = np.lib.stride_tricks.sliding_window_view(pad, (k, k), axis=(2, 3))[:, :, :size, :size]
        want = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
        scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
        assert_close(kernel(I, dO, Wt), want, terms=n * size * size, scale=scale, dtype="float32")
    return kernel, (I, dO, Wt), check


def test_a_weight_gradients_sum_walks_the_images_outside_their_rows(target: cputarget.CpuTarget) -> None:
    """A weight gradient summed over images, rows and columns (a padded conv's, reading a
    zero-padded copy of the input) runs its sum with the loop of the widest step outermost: the
    images (one plane of every channel apart) outside the rows (one row apart), whatever order the
    schedule gave them, so that each image's rows stream once; the numbers are numpy's."""
    N, H = 3, 18
    k, args, check = _padded_weight_gradient(N, 4, 8, H, 3, seed=21)
    lines = str(dict(k.lowered(*args).passes)["vectorise"]).splitlines()
    at = next(i for i, x in enumerate(lines) if "// accumulate S2 over" in x)
    assert f"<= {N - 1});" in lines[at + 1] and f"<= {H - 1});" in lines[at + 2], "\n".join(lines[at:at + 4])
    check()


def test_a_wide_windows_tap_sums_take_strips_of_filters_and_channels(target: cputarget.CpuTarget) -> None:
    """A 7x7 padded conv's weight gradient reading a zero-padded input: its window's columns would
    take too few filters beside them (7 accumulators each), so each tap's sum takes a strip of
    filters and one of channels at once (their loads shared: one per filter and per channel a
    step), as the pieces of a split sum do; the numbers are numpy's."""
    K = 7
    k, args, check = _padded_weight_gradient(2, 8, 8, 20, K, seed=22)
    text = str(dict(k.lowered(*args).passes)["vectorise"])
    plan = re.search(r"accumulate S2 over .*, the elements of (c\d+)s \((\d+)\), (c\d+)s \((\d+)\) at once", text)
    assert plan is not None and int(plan.group(2)) * int(plan.group(4)) > K, text
    check()


def test_reduction_nests_without_vectors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the vector code turned off (-DTC_VEC=0), the nests' scalar form (the jammed loops run
    again around each element's sum, the filters' strips too) gives the vector form's numbers."""
    rng = np.random.default_rng(12)
    N, F, C, H, W = 2, 4, 3, 5, 30
    shapes = ((N, F, W), (N, C, W), (N, F, H, W), (N, C, H + 2, W + 2))
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = tc.define(NEST)(*args)
    scalar = _built_with(monkeypatch, tmp_path, "-DTC_VEC=0", NEST, args)
    for g, x, terms in zip(got, scalar, (N * W, N * W, N * W, N * H * W)):
        assert_close(x, g.astype(np.float64), terms=terms, scale=np.abs(g).max() + 1, dtype="float32")


COLUMN = "def col(float(M,N) X) -> (O) {{ O(j) {op}=! X(i, j) }}"
COLUMN_INTO = "def col(float(M,N) X) -> (O) {{ O(j) {op}= X(i, j) }}"  # no bang: into the given O


def _fold(op: str, start: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The scalar code's reduction of X's rows into ``start``, in row order: ``tc_max(acc, x)`` is
    acc where acc > x or acc is NaN, else x (so NaN anywhere gives NaN, and ties take x)."""
    acc = start.copy()
    for x in X:
        keep = (acc > x if op == "max" else acc < x) | np.isnan(acc)
        acc = np.where(keep, acc, x)
    return acc


def _column_input(M: int, dtype: str) -> np.ndarray:
    """(M, 70) values with NaNs in a few columns (first, middle and last row), and columns of
    signed zeros only (ties of -0.0 and +0.0 in both orders)."""
    rng = np.random.default_rng(6)
    X = (rng.random((M, 70)) * 2 - 1).astype(dtype)
    X[0, 3] = X[M // 2, 40] = X[M - 1, 69] = X[7, 17] = np.nan
    X[:, 10] = np.where(rng.random(M) < 0.5, -0.0, 0.0)
    X[:, 11] = 0.0
    X[M - 1, 11] = -0.0
    X[:, 12] = -0.0
    X[M // 3, 12] = 0.0
    return X


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("M", [300, 40])  # the reduction in chunks (the first from the identity) or whole
def test_vector_min_max_tile(op: str, dtype: str, M: int, target: cputarget.CpuTarget) -> None:
    """A column max/min (rows contiguous) in vector register tiles: the bits of the scalar code's
    reduction in row order (NaNs propagated, signed zeros as tc_max/tc_min give them), the values
    of the reference interpreter."""
    src = COLUMN.format(op=op).replace("float(", "double(" if dtype == "float64" else "float(")
    k = tc.define(src)
    X = _column_input(M, dtype)
    code = k.source(X)
    v = "tc_vf" if dtype == "float32" else "tc_vd"
    assert f"= {v}_{op}(a0, " in code, code
    assert f"a0 = {v}_set1({'-' if op == 'max' else ''}INFINITY);" in code, code
    got = k(X)
    start = np.full(70, -np.inf if op == "max" else np.inf, dtype)
    want = _fold(op, start, X)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    np.testing.assert_array_equal(k(X, options=MappingOptions(vectorize=False)).view(got.dtype), got)
    np.testing.assert_array_equal(got, k(X, backend="numpy"))
    assert np.isnan(got[[3, 17, 40, 69]]).all() and not np.isnan(np.delete(got, [3, 17, 40, 69])).any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_vector_min_max_into_out(op: str, dtype: str, target: cputarget.CpuTarget) -> None:
    """``max=`` without a bang: the vector tile starts from the values given in out= (a NaN there
    stays NaN)."""
    src = COLUMN_INTO.format(op=op).replace("float(", "double(" if dtype == "float64" else "float(")
    k = tc.define(src)
    X = _column_input(300, dtype)
    start = (np.random.default_rng(7).random(70) * 1.5 - 0.75).astype(dtype)
    start[[5, 11]] = [np.nan, 0.0]
    assert f"{'tc_vf' if dtype == 'float32' else 'tc_vd'}_{op}(a0, " in k.source(X)
    got = k(X, out=start.copy())
    want = _fold(op, start, X)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    np.testing.assert_array_equal(got, k(X, out=start.copy(), backend="numpy"))
    assert np.isnan(got[5])


POINTWISE = """def pw(float(N,D) X, float(N,D) P) -> (T, L, S, G) {
    T(n,d) = tanh(X(n,d))
    L(n,d) = log(P(n,d))
    S(n,d) = 1 / (1 + exp(-X(n,d)))
    G(n,d) = sigmoid(X(n,d))
}"""
SIGMOID_ULPS = 4  # exp's 2 ulp, the sum's and the quotient's roundings


def _ulps32(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.mark.parametrize("D", [512, 200])
def test_vector_loop_transcendentals(D: int, target: cputarget.CpuTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """tanh, log and both sigmoid spellings in vector loops (codegen.vecisa's tc_vf_tanh, tc_vf_log
    and tc_vf_exp), rows of whole vectors or ending in an overlapping one, where the C library has
    no vector math (so on NEON, clang or musl): within the layer's bounds of float64 numpy, special
    values (signed zeros, infinities, NaN, subnormals, log of negatives) as numpy gives them."""
    monkeypatch.setattr(toolchain, "has_vector_math", lambda: False)
    rng = np.random.default_rng(8)
    X = np.linspace(-30, 30, 16 * D).reshape(16, D).astype(np.float32)
    P = np.exp(rng.uniform(-100, 88, (16, D))).astype(np.float32)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-39, -3.0, 1.0, 0.625, -0.625]
    X[0, :len(special)] = P[1, :len(special)] = special
    P[2, :3] = [0.0, np.finfo(np.float32).tiny, 1e-42]
    k = tc.define(POINTWISE)
    src = k.source(X, P)
    for call in ("tc_vf_tanh(tc_vf_load(", "tc_vf_log(tc_vf_load(", "(tc_vf_set1(1.0f) + tc_vf_exp(-tc_vf_load(",
                 "tc_vf_exp((-tc_vf_load("):
        assert call in src, (call, src)
    got = dict(zip("TLSG", k(X, P)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        want = {"T": np.tanh(X.astype(np.float64)), "L": np.log(P.astype(np.float64)),
                "S": 1 / (1 + np.exp(-X.astype(np.float64)))}
    want["G"] = want["S"]
    for name, bound in (("T", TANH_ULPS), ("L", LOG_ULPS), ("S", SIGMOID_ULPS), ("G", SIGMOID_ULPS)):
        finite = np.isfinite(want[name])
        ulps = _ulps32(got[name][finite], want[name][finite])
        assert ulps.max() <= bound, (name, ulps.max())
        np.testing.assert_array_equal(got[name][~finite], want[name][~finite].astype(np.float32))
    np.testing.assert_array_equal(np.signbit(got["T"][0, :2]), [False, True])  # tanh(+-0) = +-0
    ref = k(X, P, backend="numpy")
    for name, r in zip("TLSG", ref):
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(r))


INT_MM = "def mm(int32(M,K) A, int32(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) - 3 }"
INT_COLUMN = "def col(int32(M,N) X) -> (O, P) { O(j) +=! X(i, j)\n P(j) max=! X(i, j) }"


@pytest.mark.parametrize("shape", [((24, 40), (40, 48)), ((50, 300), (300, 85))])
def test_vector_int32_sum_tile(shape: tuple, target: cputarget.CpuTarget) -> None:
    """int32 sum tiles in vectors, exact: products and sums that overflow wrap as in the scalar code
    and the reference interpreter (whole tiles, and partial ones on the scalar path beside them). A
    2-row tile of two vectors per row takes the vector form on every target; the default tiles
    take it where all of one step's vectors fit in the registers."""
    rng = np.random.default_rng(9)
    A, B = (rng.integers(-2**31, 2**31, s, dtype=np.int64).astype(np.int32) for s in shape)
    k = tc.define(INT_MM)
    small = MappingOptions(register_tile=(2, 2 * target.lanes("int32")))
    src = k.source(A, B, options=small)
    assert "a0 = tc_vi_" in src and "tc_vi_store(&t2" in src, src
    wrapped = ((A.astype(np.int64) @ B.astype(np.int64) - 3 * shape[0][1]) + 2**31) % 2**32 - 2**31
    ref = k(A, B, backend="numpy")
    np.testing.assert_array_equal(ref, wrapped.astype(np.int32))
    for options in (small, MappingOptions(), MappingOptions(vectorize=False)):
        np.testing.assert_array_equal(k(A, B, options=options), ref)


def test_vector_int32_column_sum(target: cputarget.CpuTarget) -> None:
    """An int32 column sum in a vector tile; the int32 max beside it keeps its scalar tile (the layer
    has no int32 max)."""
    X = np.random.default_rng(10).integers(-1000, 1000, (300, 70)).astype(np.int32)
    k = tc.define(INT_COLUMN)
    src = k.source(X)
    assert "tc_vi_load(&t0" in src and src.count("#if TC_VEC\n") == 1, src
    O, P = k(X)
    np.testing.assert_array_equal(O, X.sum(0, dtype=np.int32))
    np.testing.assert_array_equal(P, X.max(0))


@pytest.mark.skipif(not toolchain.has_vector_math(), reason="glibc's vector math (x86-64, glibc >= 2.35)")
def test_vector_loops_take_the_layers_tanh_and_log_over_libmvec() -> None:
    """With glibc's vector math declared too, the tanh, log and sigmoid loops are written out with
    the layer's inlined forms (within 2 and 1 ulp; libmvec's falls back to scalar calls on special
    lanes), and special values come out as numpy's: log of 0, of a negative, of inf; tanh of +-inf."""
    X = np.linspace(0.5, 3, 4 * 512, dtype=np.float32).reshape(4, 512)
    P = X.copy()
    P[0, :4] = [0.0, -1.0, np.inf, np.nan]
    X[1, :3] = [np.inf, -np.inf, -0.0]
    k = tc.define(POINTWISE)
    src = k.source(X, P)
    assert "tc_vf_tanh(tc_vf_load(" in src and "tc_vf_log(tc_vf_load(" in src and "tc_vf_exp(-tc_vf_load(" in src, src
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        want = [np.tanh(X.astype(np.float64)), np.log(P.astype(np.float64)),
                1 / (1 + np.exp(-X.astype(np.float64)))]
    T, L, S, G = k(X, P)
    for got, w, bound in ((T, want[0], 2), (L, want[1], 1), (S, want[2], SIGMOID_ULPS), (G, want[2], SIGMOID_ULPS)):
        finite = np.isfinite(w)
        assert _ulps32(got[finite], w[finite]).max() <= bound
        np.testing.assert_array_equal(got[~finite], w[~finite].astype(np.float32))
    np.testing.assert_array_equal(L[0, :4], np.float32([-np.inf, np.nan, np.inf, np.nan]))
    np.testing.assert_array_equal(T[1, :3], np.float32([1.0, -1.0, -0.0]))
    assert np.signbit(T[1, 2])


PRODUCT = "def col({t}(M,N) X) -> (O) {{ O(j) *=! X(i, j) }}"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("M", [300, 40])
def test_vector_product_tile(dtype: str, M: int, target: cputarget.CpuTarget) -> None:
    """A column product in vector tiles: the scalar code's bits (the same multiplies in row order;
    int32 wraps), starting from 1 (the whole reduction, or its first chunk), close to numpy."""
    rng = np.random.default_rng(12)
    if dtype == "int32":
        X = rng.integers(-7, 8, (M, 70)).astype(np.int32)
    else:
        X = (rng.random((M, 70)) * 0.2 + 0.9).astype(dtype)  # no overflow in 300 factors
        X[5, 9] = np.nan
        X[7, 20] = -0.0
    k = tc.define(PRODUCT.format(t={"float32": "float", "float64": "double", "int32": "int32"}[dtype]))
    v = vecisa.vector_type(dtype)
    src = k.source(X)
    assert "a0 = a0 * " in src and f"a0 = {v}_set1(1);" in src, src
    got = k(X)
    fold = np.ones(70, dtype)
    for row in X:
        fold = (fold * row).astype(dtype)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), fold.view(f"u{fold.itemsize}"))
    np.testing.assert_array_equal(k(X, options=MappingOptions(vectorize=False)), got)
    ref = k(X, backend="numpy")
    if dtype == "int32":
        np.testing.assert_array_equal(got, ref)
    else:  # M roundings of a product of positive factors, relative to it
        assert_close(got, ref, terms=M, scale=np.abs(ref))
        assert np.isnan(got[9]) and np.signbit(got[20]) and got[20] == 0


MAX_MIN_CALLS = """def mm({t}(N,D) X, {t}(N,D) Y) -> (R, O) {{
    R(n,d) = max(X(n,d), 0) + min(Y(n,d), X(n,d))
    O(d) +=! max(X(r_n,d), Y(r_n,d))
}}"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vector_max_min_calls(dtype: str, target: cputarget.CpuTarget) -> None:
    """The builtins max and min in a vector loop and inside a vector sum tile: tc_max/tc_min's bits
    (NaN from either side, -0.0/+0.0 ties take the second argument), numpy's values."""
    rng = np.random.default_rng(13)
    X, Y = (rng.standard_normal((64, 512)).astype(dtype) for _ in range(2))
    X[0, :6] = [np.nan, 0.0, -0.0, 1.0, -0.0, 0.0]
    Y[0, :6] = [1.0, -0.0, 0.0, np.nan, -0.0, 0.0]
    X[3, 7] = np.nan
    k = tc.define(MAX_MIN_CALLS.format(t="float" if dtype == "float32" else "double"))
    v = vecisa.vector_type(dtype)
    src = k.source(X, Y)
    assert f"({v}_max({v}_load(" in src and f"{v}_min({v}_load(" in src and f"a0 = a0 + {v}_max(v" in src, src
    R, O = k(X, Y)

    def tc_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where((a > b) | np.isnan(a), a, b)

    def tc_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where((a < b) | np.isnan(a), a, b)

    want_r = (tc_max(X, np.zeros_like(X)) + tc_min(Y, X)).astype(dtype)
    np.testing.assert_array_equal(R.view(f"u{R.itemsize}"), want_r.view(f"u{R.itemsize}"))
    Rr, Or = k(X, Y, backend="numpy")
    np.testing.assert_array_equal(R, Rr)
    np.testing.assert_array_equal(k(X, Y, options=MappingOptions(vectorize=False))[1], O)
    terms = tc_max(X, Y).astype(np.float64)
    assert_close(O, Or, terms=64, scale=np.abs(terms).sum(0))
    assert np.isnan(O[[0, 3, 7]]).all()


MATMUL_T = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,r_k) * B(r_k,n) - 0.5 * A(m,r_k) }}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [300, 40])  # the reduction in tiles (the target loaded) or whole (from zero)
def test_half_vector_ends_a_row(dtype: str, K: int, target: cputarget.CpuTarget) -> None:
    """A row whose last elements fit in half a vector ends in a half vector where the target has
    them (AVX-512: 50 float32 = 3 x 16 + 2, the half vector from 42; 20 float64 = 2 x 8 + 4, from
    16); elsewhere in whole vectors. Either way the scalar code's bits, close to numpy."""
    k, A, B = _matmul_t(dtype, K, {"float32": 50, "float64": 20}[dtype], 13)
    src = _kernel_text(k.source(A, B))
    half = "tc_hf" if dtype == "float32" else "tc_hd"
    lanes = target.lanes(dtype)
    assert (f"{half}_load(&t1[" in src) == target.half_vectors, src
    if target.half_vectors:
        assert f"{half}_store(&t2[" in src and f"{half}_lo(b" in src
        assert f"one of {lanes // 2} per row" in src
        assert (f"{half} a" in src and f"= {half}_load(&t2[" in src) == (K == 300), src
    _check_matmul_t(k, A, B)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [300, 40])  # the reduction in tiles (the target loaded) or whole (from zero)
def test_a_row_cut_short_takes_a_vector_tile_of_its_own(dtype: str, K: int, target: cputarget.CpuTarget) -> None:
    """Rows of 500 in tiles of whole vectors (AVX-512 float32: 7 x 64 + 52, float64: 15 x 32 + 20;
    AVX2: 31 x 16 + 4, 62 x 8 + 4) end in a vector tile of the columns left, the only other size,
    so the vector code has no scalar tile beside it: the scalar code's bits, close to numpy."""
    k, A, B = _matmul_t(dtype, K, 500, 17)
    src = _kernel_text(k.source(A, B))
    passes = str(k.lowered(A, B).passes[-1][1])
    assert "whole when" in passes or target.isa not in ("avx512", "avx2"), passes  # a tile cut short
    if "whole when" in passes:
        assert "// the row's last" in src and "no other size" in passes, passes
        vector = src.split("#if TC_VEC", 1)[1].split("#else", 1)[0]
        assert "acc[" not in vector
    _check_matmul_t(k, A, B)


@pytest.mark.parametrize("K", [300, 40])
def test_a_row_cut_shorter_than_a_half_vector_takes_the_scalar_tile_at_its_size(
        K: int, target: cputarget.CpuTarget) -> None:
    """Rows of 898 in tiles of whole vectors (AVX-512: 14 x 64 + 2; AVX2: 56 x 16 + 2) leave 2
    columns, too few for a half vector: they take the scalar tile with constant bounds
    (``acc[6][2]``), tested before the general one: the scalar code's bits, close to numpy."""
    k, A, B = _matmul_t("float32", K, 898, 19)
    src = _kernel_text(k.source(A, B))
    passes = str(k.lowered(A, B).passes[-1][1])
    if target.isa in ("avx512", "avx2"):
        assert "6x2: scalar" in passes, passes
        assert "// the row's last 2, in scalars" in src and "float acc[6][2];" in src
    _check_matmul_t(k, A, B)


@pytest.mark.parametrize("K", [300, 40])
def test_tiles_cut_short_across_and_along_their_rows_take_vector_tiles_of_both(
        K: int, target: cputarget.CpuTarget) -> None:
    """100 rows in tiles of 6 and rows of 500 in tiles of whole vectors: the last 4 rows, the last
    columns (AVX-512: 52 of 64; AVX2: 4 of 16) and both at once each take a vector tile: the scalar
    code's bits, close to numpy."""
    rng = np.random.default_rng(23)
    A = (rng.random((100, K)) * 2 - 1).astype(np.float32)
    B = (rng.random((K, 500)) * 2 - 1).astype(np.float32)
    k = tc.define(MATMUL_T.format(t="float"))
    src = _kernel_text(k.source(A, B))
    if target.isa in ("avx512", "avx2"):
        last = {"avx512": 52, "avx2": 4}[target.isa]
        for note in ("// 4 rows", f"// the row's last {last}", f"// 4 rows, the row's last {last}"):
            assert note + "\n" in src, note
    _check_matmul_t(k, A, B)


def _matmul_t(dtype: str, K: int, N: int, seed: int) -> tuple[tc.Kernel, np.ndarray, np.ndarray]:
    """MATMUL_T in ``dtype`` and its inputs: 24 x K and K x N, uniform in [-1, 1)."""
    rng = np.random.default_rng(seed)
    A = (rng.random((24, K)) * 2 - 1).astype(dtype)
    B = (rng.random((K, N)) * 2 - 1).astype(dtype)
    return tc.define(MATMUL_T.format(t={"float32": "float", "float64": "double"}[dtype])), A, B


def _check_matmul_t(k: tc.Kernel, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The scalar code's bits, close to numpy."""
    got = k(A, B)
    np.testing.assert_array_equal(k(A, B, options=MappingOptions(vectorize=False)), got)
    want = A.astype(np.float64) @ B - 0.5 * A.sum(1, dtype=np.float64)[:, None]
    assert_close(got, want, terms=2 * A.shape[1], scale=np.abs(A) @ np.abs(B) + 0.5 * np.abs(A).sum(1)[:, None])
    return got


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [300, 40])
def test_rows_shorter_than_a_vector_run_in_half_vectors(dtype: str, K: int, target: cputarget.CpuTarget) -> None:
    """A row shorter than a vector but at least half one runs in half vectors where the target has
    them (AVX-512: 12 float32 in two of 8, from 0 and 4; 6 float64 in two of 4, from 0 and 2); a row
    a vector and at most half another long, in a whole vector and a half one (AVX2: 12 float32 in 8
    and 4; 6 float64 in 4 and 2): the scalar code's bits, close to numpy; elsewhere whole vectors or
    scalars. A padded conv's 12-wide interior (14x14 images) too, its tile planned for half vectors
    (elsewhere none), close to numpy."""
    width = {"float32": 12, "float64": 6}[dtype]
    k, A, B = _matmul_t(dtype, K, width, 14)
    src = _kernel_text(k.source(A, B))
    lanes = target.lanes(dtype)
    narrow = f"in 2 half vectors of {lanes // 2} per row (the last overlapping the one before)"
    ending = f"in {width // lanes} vectors of {lanes} and one of {lanes // 2} per row"
    assert (narrow in src) == (target.half_vectors and width < lanes), src
    assert (ending in src) == (target.half_vectors and lanes < width <= lanes * 3 // 2), src
    _check_matmul_t(k, A, B)
    if dtype == "float64" or K == 40:
        return
    conv = tc.define("""def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H, w in 0:W
    }""")
    rng = np.random.default_rng(15)
    I = rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
    W1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    text = str(conv.lowered(I, W1).lowered_ir)
    tiles = [line for line in text.split("\n") if "register tile" in line]
    interior = [line for line in tiles if "along w" in line]
    if target.half_vectors and target.lanes(dtype) > 12:  # rows shorter than a vector
        assert interior and all("half vectors" in line for line in interior), text
    else:  # (AVX2: the interior in vectors of output channels, along f)
        assert tiles and not any("half vectors" in line for line in tiles), text
    got = conv(I, W1)
    win = np.lib.stride_tricks.sliding_window_view(np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    assert_close(got, _conv_win(win, W1), terms=16 * 9, scale=_conv_win(np.abs(win), np.abs(W1)))


def _conv_win(win: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.einsum("nchwkl,fckl->nfhw", win, W, dtype=np.float64)


SOFTMAX_THEN_READ = """def sm(float(N,D) X) -> (Y, Z) {
    mx(n) max=! X(n,r_d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,r_d)
    Y(n,d) = e(n,d) / s(n)
    Z(n,d) = Y(n,d) * 2
}"""


@pytest.mark.parametrize("D", [1024, 1008, 1000])
def test_large_write_once_outputs_stream(D: int, target: cputarget.CpuTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output written once and never read back, in a kernel whose tensors outgrow the last-level
    cache (here: any size, STREAM_SHARE raised), is stored past the caches where its rows are whole
    cache lines (D = 1024, 1008 floats; not 1000: 62.5 lines) and its vectors aligned, with a
    fence per thread before the parallel loop's barrier; an output the kernel reads back (Y, read
    by Z) is stored as usual. The values are the plain stores' bits, on aligned and unaligned rows."""
    X = np.random.default_rng(13).standard_normal((96, D)).astype(np.float32)
    k = tc.define(SOFTMAX_THEN_READ)
    plain_Y, plain_Z = k(X)  # small: plain stores
    monkeypatch.setattr(vecloop, "STREAM_SHARE", 1 << 40)
    k = tc.define(SOFTMAX_THEN_READ)
    src = k.source(X)
    body = src[src.index("int tc_kernel"):]
    assert "tc_vf_stream(&t1[" not in body, body  # Y is read back
    if D * 4 % 64 == 0:  # Z streams
        assert "tc_vf_stream(&t2[" in body, body
        assert "#pragma omp parallel\n" in body and " nowait" in body and body.count("tc_stream_fence();") == 2, body
        assert ", streaming Z\n    S5(" in str(k.lowered(X).passes[-1][1])  # the pass prints its choice
    else:
        assert "tc_vf_stream(&" not in body and "tc_stream_fence();" not in body, body
        assert "streaming" not in str(k.lowered(X).passes[-1][1])
    Y, Z = k(X)
    assert Z.ctypes.data % 64 == 0  # fresh outputs are aligned: whole rows stream when D * 4 is too
    np.testing.assert_array_equal(Y, plain_Y)
    np.testing.assert_array_equal(Z, plain_Z)
    out = (np.empty((96, D), np.float32), np.empty((96, D + 1), np.float32)[:, 1:])  # Z's rows unaligned
    k(X, out=out)
    np.testing.assert_array_equal(out[0], plain_Y)
    np.testing.assert_array_equal(out[1], plain_Z)
    # small kernels keep plain stores
    monkeypatch.setattr(vecloop, "STREAM_SHARE", 2)
    assert "tc_vf_stream(&" not in tc.define(SOFTMAX_THEN_READ).source(X).split("int tc_kernel")[1]


ELEMENTWISE = "def ew(float(N) A, float(N) B) -> (O) { O(i) = A(i) * B(i) + 1.0 }"


def test_a_large_elementwise_output_streams_from_each_tile_of_its_loop(target: cputarget.CpuTarget,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-dimensional output written once, in a kernel outgrowing the last-level cache (here:
    any size, STREAM_SHARE raised), streams from every tile of its tiled loop: each tile's row
    starts at the parallel loop's variable, a whole number of cache lines of elements for each of
    its values. The values are the plain stores' bits."""
    rng = np.random.default_rng(3)
    A, B = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(2))
    want = tc.define(ELEMENTWISE)(A, B)
    monkeypatch.setattr(vecloop, "STREAM_SHARE", 1 << 40)
    k = tc.define(ELEMENTWISE)
    body = _kernel_text(k.source(A, B))
    assert "tc_vf_stream(&t2[" in body, body
    assert ", streaming O" in str(k.lowered(A, B).passes[-1][1])
    np.testing.assert_array_equal(k(A, B), want)


TANH_CHAIN = """def chain(float(N,D) A, float(N,D) B, float(D) C) -> (Y, Z) {
    Y(n,d) = tanh(A(n,d) * B(n,d) + C(d))
    Z(n,d) = exp(-B(n,d))
}"""


@pytest.mark.parametrize("D", [1024, 500])
def test_large_pointwise_loops_prefetch_the_inputs_they_alone_read(D: int, target: cputarget.CpuTarget,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """In a kernel whose tensors outgrow the last-level cache (here: any size, STREAM_SHARE
    raised), a vector loop fetches the rows of the inputs no other statement reads PREFETCH_BYTES
    ahead (A; not B, which both statements read, nor C, reused by every row), and
    the pass prints it; the values are the bits of the loop without prefetches."""
    rng = np.random.default_rng(D)
    A, B = (rng.standard_normal((40, D)).astype(np.float32) for _ in range(2))
    C = rng.standard_normal(D).astype(np.float32)
    plain = tc.define(TANH_CHAIN)
    assert "__builtin_prefetch" not in plain.source(A, B, C)
    want = plain(A, B, C)
    monkeypatch.setattr(vecloop, "STREAM_SHARE", 1 << 40)
    k = tc.define(TANH_CHAIN)
    body = k.source(A, B, C).split("int tc_kernel")[1]
    ahead = vecloop.PREFETCH_BYTES
    assert body.count("__builtin_prefetch(") == 1, body
    assert f"__builtin_prefetch((const void *)((uintptr_t)&t0[(x0) * {D}L + (x1)] + {ahead}));" in body, body
    assert ", prefetching A\n" in str(k.lowered(A, B, C).passes[-1][1])
    for got, w in zip(k(A, B, C), want):
        np.testing.assert_array_equal(got, w)
    monkeypatch.setattr(vecloop, "PREFETCH_BYTES", 0)  # the knob that turns them off
    assert "__builtin_prefetch" not in tc.define(TANH_CHAIN).source(A, B, C)


@pytest.mark.parametrize("D", [1024, 1000, 40])
def test_row_loops_prefetch_the_next_row_an_earlier_loop_read(D: int, target: cputarget.CpuTarget,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Softmax's exponentials re-read the row of X its maximum read first, from the caches: that
    loop runs in explicit vectors and fetches the same elements of the next row (4 * D bytes ahead)
    while it computes, and the pass prints it; rows shorter than NEXT_ROW_LINES lines (D = 40)
    fetch nothing. Where libmvec's exp is the faster (AVX2 with glibc's libmvec), the loop calls it
    by name, and without prefetches keeps its simd form, which calls the same function. The values
    are the bits of the kernel without the prefetches, and numpy's within a sum's rounding."""
    X = np.random.default_rng(D).standard_normal((64, D)).astype(np.float32)
    k = tc.define(SOFTMAX)
    body = _kernel_text(k.source(X))
    text = str(k.lowered(X).passes[-1][1])
    exps = re.search(r"// parallel simd hoist h0=call0.read1(.*)\n\s*S2\(", text)
    assert exps is not None, text
    fetch = f"__builtin_prefetch((const void *)((uintptr_t)&t0[(x0) * {D}L + (x1)] + {4 * D}));"
    mvec = target.isa != "avx512" and toolchain.has_vector_math()
    if 4 * D >= vecloop.NEXT_ROW_LINES * 64:
        assert body.count(fetch) == 1 and "prefetching X's next c" in text and f"({4 * D} bytes ahead)" in text, body
        assert "lanes" in exps.group(1) and ("tc_vf_mvexp(" in body) == mvec, text
    else:
        assert "__builtin_prefetch" not in body and "next" not in text, body
        assert ("lanes" in exps.group(1)) != mvec and "tc_vf_mvexp(" not in body, text
    got = k(X)
    monkeypatch.setattr(vecloop, "NEXT_ROW_LINES", 1 << 40)  # the knob that turns them off
    plain = tc.define(SOFTMAX)
    assert "__builtin_prefetch" not in _kernel_text(plain.source(X))
    np.testing.assert_array_equal(got, plain(X))
    e = np.exp(X.astype(np.float64) - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=8 * D * np.finfo(np.float32).eps)


PRODUCT_CHAIN = "def prod(float(M,K) A, float(K,N) B) -> (C) { C(m,n) *=! A(m,r_k) + B(r_k,n) }"


@pytest.mark.parametrize("K", [300, 256, 129])
@pytest.mark.parametrize("kind", ["sum", "max", "product"])
def test_first_chunk_starts_from_identity(kind: str, K: int, target: cputarget.CpuTarget) -> None:
    """A reduction longer than its cache tile, run by register tiles in chunks: the tiles start from
    the identity in the first chunk and load the target in the others, the initialisation nest gone;
    the values those of numpy (sum, product) and the bits of the reduction in order (max), on
    chunk counts that divide the reduction and that do not."""
    rng = np.random.default_rng(K)
    if kind == "sum":
        k, args = tc.define(MATMUL), [(rng.random(s) * 2 - 1).astype(np.float32) for s in [(30, K), (K, 40)]]
    elif kind == "max":
        k, args = tc.define(COLUMN.format(op="max")), [_column_input(K, "float32")]
    else:  # factors near 1: a long product stays finite
        k = tc.define(PRODUCT_CHAIN)
        args = [(1 + (rng.random(s) - 0.5) / 64).astype(np.float32) for s in [(12, K), (K, 20)]]
        args[1] = (args[1] - 1).astype(np.float32)
    loops = str(k.lowered(*args).passes[-1][1])
    # (a column reduction's tile runs the chunks in two serial loops of its own: whole, from the identity)
    assert ("from the identity" if kind == "max" else "from the identity when") in loops, loops
    assert "init1(" not in loops, loops
    got = k(*args)
    if kind == "sum":
        assert_close(got, _mm(*args), terms=K, scale=abs_terms(_mm, *args))
    elif kind == "max":
        want = _fold("max", np.full(70, -np.inf, np.float32), args[0])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    else:
        want = np.prod(args[0][:, :, None].astype(np.float64) + args[1][None, :, :], axis=1)
        # each factor's rounding: relative error grows with the count of factors
        np.testing.assert_allclose(got, want, rtol=4 * K * np.finfo(np.float32).eps)
    if kind != "sum" or target.fma:  # (without fused vectors a sum of products rounds each product)
        np.testing.assert_array_equal(got, k(*args, options=MappingOptions(vectorize=False)))


@pytest.mark.skipif(not runnable("avx2"), reason="an x86 machine with AVX2")
@pytest.mark.parametrize("shape", [(300, 256, 256), (280, 300, 768), (140, 129, 1024)])
def test_whole_operand_packed_once(shape: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """On AVX2 (16-lane panels, half a line per vector) a matmul with several row blocks packs the
    whole of B once per call, before the parallel loops, the column blocks becoming dimensions of
    the buffer (the last cut short in the second and third shapes; the reduction runs unchunked,
    tileplan.plan's deep chunks): the numbers of numpy, and the bits of the per-thread packs and
    of a whole copy read by a parallel loop of row tiles."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    M, K, N = shape
    rng = np.random.default_rng(M)
    A, B = ((rng.random(s) * 2 - 1).astype(np.float32) for s in ((M, K), (K, N)))
    k = tc.define(MATMUL)
    loops = str(k.lowered(A, B).passes[-1][1])
    assert "once for every thread, copied by all threads" in loops, loops
    got = k(A, B)
    assert_close(got, _mm(A, B), terms=K, scale=abs_terms(_mm, A, B))
    # column blocks outside the rows, each reading its own panels: each thread packs its own
    own = MappingOptions(tile=(M, 64, 128), register_tile=(6, 16, 1))
    loops = str(k.lowered(A, B, options=own).passes[-1][1])
    assert "pack B" in loops and "copied by all threads" not in loops, loops
    np.testing.assert_array_equal(k(A, B, options=own), got)
    # every row tile in the parallel loop, which reads the panels again in each iteration: one copy
    rows = MappingOptions(tile=(M, N, 128), register_tile=(6, 16, 1))
    loops = str(k.lowered(A, B, options=rows).passes[-1][1])
    assert "copied by all threads" in loops and "+= 6)  // parallel omp" in loops, loops
    np.testing.assert_array_equal(k(A, B, options=rows), got)


@pytest.mark.skipif(not runnable("avx2"), reason="an x86 machine with AVX2")
@pytest.mark.parametrize("M", [40, 300])
def test_packed_whole_reduces_in_deep_chunks(M: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX2: an operand packed whole once per call (several row blocks) lets the reduction run
    unchunked up to 1024 terms (tileplan.plan); one row block keeps chunks of 128, first from the
    identity. The numbers of numpy either way."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    K, N = 700, 256
    rng = np.random.default_rng(M)
    A, B = ((rng.random(s) * 2 - 1).astype(np.float32) for s in ((M, K), (K, N)))
    k = tc.define(MATMUL)
    loops = str(k.lowered(A, B).passes[-1][1])
    if M > 48:
        assert "copied by all threads" in loops and "+= 128)" not in loops and "from the identity;" in loops, loops
    else:
        assert "+= 128)" in loops and "from the identity when" in loops, loops
    assert_close(k(A, B), _mm(A, B), terms=K, scale=abs_terms(_mm, A, B))


@pytest.mark.skipif(not runnable("avx2"), reason="an x86 machine with AVX2")
def test_panels_too_large_for_a_thread_pack_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reduction chunks whose panels outgrow a thread's pack (PACK_MAX_BYTES) still read packed
    panels: the whole operand, once per call (without, 4 KiB rows conflict in L1 and a 1024^3
    matmul tiled (132, 512, 256) on AVX2 ran 0.53x numpy against the defaults' 0.97x)."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    M, K, N = 150, 640, 1024
    rng = np.random.default_rng(7)
    A, B = ((rng.random(s) * 2 - 1).astype(np.float32) for s in ((M, K), (K, N)))
    k = tc.define(MATMUL)
    deep = MappingOptions(tile=(66, 512, 320))  # 32 panels x 320 steps x 16 floats: 640 KiB a block
    assert 32 * 320 * 16 * 4 > pack.PACK_MAX_BYTES
    loops = str(k.lowered(A, B, options=deep).passes[-1][1])
    assert "pack B" in loops and "copied by all threads" in loops, loops
    assert_close(k(A, B, options=deep), _mm(A, B), terms=K, scale=abs_terms(_mm, A, B))


@pytest.mark.skipif(not runnable("avx2"), reason="an x86 machine with AVX2")
def test_an_operand_larger_than_a_quarter_of_l3_is_still_packed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matmul's B larger than a quarter of the target's L3 (but within SHARED_PACK_BYTES) is
    packed once per call, not again by every row block: the numbers of numpy."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    monkeypatch.setenv("TCDSL_CPU_CACHES", "l3=1M")  # a quarter of L3: 256 KiB
    K, N = 160, 448  # B: 280 KiB
    assert (1 << 20) // 4 < K * N * 4 <= cputarget.SHARED_PACK_BYTES
    rng = np.random.default_rng(11)
    A, B = ((rng.random(s) * 2 - 1).astype(np.float32) for s in ((400, K), (K, N)))
    k = tc.define(MATMUL)
    loops = str(k.lowered(A, B).passes[-1][1])
    assert "pack B" in loops and "copied by all threads" in loops, loops
    assert_close(k(A, B), _mm(A, B), terms=K, scale=abs_terms(_mm, A, B))


WGRAD_SAME = """def wgrad(float(N,C,H,W) I, float(N,F,H,W) dO) -> (dW) {
    dW(f, c, kh, kw) +=! dO(r_n, f, r_h, r_w) * I(r_n, c, r_h + kh - 1, r_w + kw - 1) where kh in 0:3, kw in 0:3
}"""


@pytest.mark.skipif(not runnable("avx2"), reason="an x86 machine with AVX2")
def test_large_shared_packs_are_copied_by_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack made once before the parallel loops that read it (matmul's B, a conv's weights) is
    copied by every thread (`omp for` on its outermost loop) where it takes at least
    PARALLEL_PACK_BYTES (the matrix), a small one (the weights) serially: the numbers of numpy."""
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    rng = np.random.default_rng(4)
    I = rng.standard_normal((2, 64, 30, 58)).astype(np.float32)
    W1 = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    A, B = rng.standard_normal((960, 1000)).astype(np.float32), rng.standard_normal((1000, 1088)).astype(np.float32)
    conv, mm = tc.define(CONV), tc.define(MATMUL)
    copies = []
    for tensor, kernel, args in (("W1", conv, (I, W1)), ("B", mm, (A, B))):
        text = kernel.lowered(*args).source.text
        pattern = rf"read {tensor} from (\d+) packed panels of (\d+) x (\d+)\n(.*?)const long pk"
        copies += re.findall(pattern, text, re.S)
    big = [int(n) * int(d) * int(w) * 4 >= cpack.PARALLEL_PACK_BYTES for n, d, w, _ in copies]
    assert len(copies) == 2 and big == [False, True], copies
    assert all(("#pragma omp parallel\n" in c[3] and "#pragma omp for schedule(static)" in c[3]) == b
               for c, b in zip(copies, big)), copies
    assert_close(mm(A, B), _mm(A, B), terms=1000, scale=_mm(np.abs(A), np.abs(B)))
    assert_close(conv(I, W1), _conv(I, W1), terms=64 * 9, scale=_conv(np.abs(I), np.abs(W1)))


def test_a_padded_weight_gradient_sums_each_tap_over_its_rows() -> None:
    """A padded conv's weight gradient, split into a piece per tap of its window, sums each piece
    over the images' rows in vectors (its reductions innermost, not a register tile across the
    channels): the numbers of numpy."""
    rng = np.random.default_rng(4)
    N, C, F, H, W = 2, 32, 64, 40, 40
    I, dO = rng.standard_normal((N, C, H, W)).astype(np.float32), rng.standard_normal((N, F, H, W)).astype(np.float32)
    k = tc.define(WGRAD_SAME)
    text = str(k.lowered(I, dO).lowered_ir)
    assert "register tile" not in text and text.count("// accumulate S1 over") == 9, text
    pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3))[:, :, :H, :W]
    want = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(k(I, dO), want, terms=N * H * W, scale=scale)
