"""Index-set splitting (polyhedral.split): a statement whose padding-by-domain guards tie an output
index to a reduction index is cut into a guard-free interior and boundary pieces. The pieces
partition the domain; the interior gets the register tiles and vectors of an unpadded statement;
and the C computes what the reference interpreter does, for every piece, at sizes where pieces
are empty or the interior is, on this machine's vector width and on AVX2, under the default
options and options drawn from the tuner's space."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import tcdsl as tc
from tcdsl.core.instance import bind_sizes
from tcdsl.core.options import MappingOptions
from tcdsl.polyhedral import split
from tcdsl.polyhedral.loopir import LCall, LFor, LPack, expr_vars, walk
from tcdsl.tuner import space as S

try:
    from targets import runnable_of
    from tolerance import assert_close, reduction_scale
except ImportError:  # run from another directory
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from targets import runnable_of
    from tolerance import assert_close, reduction_scale

SAME = """def same(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:H, w in 0:W
}"""


def _conv_domain(H: int, W: int) -> isl.Set:
    return isl.Set(f"{{ S[h, w, kh, kw] : 0 <= h < {H} and 0 <= w < {W} and 0 <= kh < 3 and 0 <= kw < 3 and "
                   f"0 <= h + kh - 1 < {H} and 0 <= w + kw - 1 < {W} }}")


def _pieces_of(low: object, stmt: str) -> int:
    """The filters of the final schedule that hold ``stmt`` alone (one per piece)."""
    filters = re.findall(r'filter: "([^"]*)"', str(low.final.get_root()))  # type: ignore[attr-defined]
    return sum(1 for f in filters if set(re.findall(r"(\w+)\[i0", f)) == {stmt})


def _range(piece: isl.Set, d: int) -> tuple[int, int]:
    return piece.dim_min_val(d).to_python(), piece.dim_max_val(d).to_python()


def test_a_same_convolution_splits_into_an_interior_box_and_its_border() -> None:
    dom = _conv_domain(10, 12)
    pieces = split.pieces(dom, 2)
    assert len(pieces) == 9
    assert [(_range(p, 0), _range(p, 1)) for p in pieces][4] == ((1, 8), (1, 10))  # the interior
    interior = pieces[4]
    assert _range(interior, 2) == (0, 2) and _range(interior, 3) == (0, 2)
    # every point of the interior's bounding box is in it: no guard is left
    box = isl.Set("{ S[h, w, kh, kw] : 1 <= h <= 8 and 1 <= w <= 10 and 0 <= kh < 3 and 0 <= kw < 3 }")
    assert interior.is_equal(box)
    union = pieces[0]
    for k, p in enumerate(pieces):
        for q in pieces[k + 1:]:
            assert p.intersect(q).is_empty()
        union = union.union(p)
    assert union.is_equal(dom)


@pytest.mark.parametrize("text,outer", [
    ("{ S[h, kh] : 0 <= h < 10 and 0 <= kh < 3 }", 1),  # a box: nothing to split
    ("{ S[i, j, k] : 0 <= i < 8 and 0 <= j < 8 and 0 <= k < 3 and i + j + k < 12 }", 2),  # ties two outputs
    ("{ S[h, kh] : 0 <= h < 10 and 0 <= kh < 3 and h + kh < 11 and h - kh != 4 }", 1),  # not one convex piece
    ("{ S[h] : 0 <= h < 10 }", 1),  # no reduction index
])
def test_domains_without_one_interior_per_index_stay_whole(text: str, outer: int) -> None:
    dom = isl.Set(text)
    assert split.pieces(dom, outer) == [dom]


def test_an_interior_off_centre_is_cut_where_the_guards_end() -> None:
    dom = isl.Set("{ S[h, kh] : 0 <= h < 10 and 0 <= kh < 3 and 0 <= h - 4 * kh }")
    pieces = split.pieces(dom, 1)
    assert [_range(p, 0) for p in pieces] == [(0, 7), (8, 9)]
    assert pieces[1].is_equal(isl.Set("{ S[h, kh] : 8 <= h <= 9 and 0 <= kh < 3 }"))
    assert pieces[0].union(pieces[1]).is_equal(dom)


def test_the_interior_is_tiled_as_an_unpadded_convolution() -> None:
    k = tc.define(SAME)
    I = np.zeros((2, 8, 30, 40), np.float32)
    W1 = np.zeros((16, 8, 3, 3), np.float32)
    low = k.lowered(I, W1, target="avx512")
    assert _pieces_of(low, "S1") == 9
    loops = str(low.passes[-1][1])
    assert "lanes per row" in loops  # vector register tiles, as in an unpadded conv
    interior = [line for line in loops.splitlines() if "register tile of S1" in line]
    assert any("x38" in line for line in interior), interior  # whole 38-wide interior rows (w in 1..38)
    # the one-wide boundary columns run in one vector of the 16 filters x rows of the column, the
    # weights packed (polyhedral.tileplan.plan), not along the height gathered
    assert any("x16 register tile" in line and "1x16 lanes per row along f" in line
               and re.search(r"\bc\d+ not unrolled", line) for line in interior), interior
    assert not any("along h" in line for line in interior), interior


# (source, input shapes, reference) -- references in float64 from padded inputs
def _np_conv(I: np.ndarray, W: np.ndarray, pad: tuple[int, int], stride: int = 1) -> np.ndarray:
    Ip = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    F, _, KH, KW = W.shape
    Ho = (Ip.shape[2] - KH) // stride + 1
    Wo = (Ip.shape[3] - KW) // stride + 1
    out = np.zeros((I.shape[0], F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            patch = Ip[:, :, kh:kh + stride * (Ho - 1) + 1:stride, kw:kw + stride * (Wo - 1) + 1:stride]
            out += np.einsum("nchw,fc->nfhw", patch, W[:, :, kh, kw].astype(np.float64))
    return out


CASES = {
    "same3x3": (SAME, lambda n, h, w: [(n, 3, h, w), (5, 3, 3, 3)], lambda I, W: _np_conv(I, W, (1, 1))),
    "same5x5": (SAME.replace("- 1", "- 2"), lambda n, h, w: [(n, 2, h, w), (4, 2, 5, 5)],
                lambda I, W: _np_conv(I, W, (2, 2))),
    "strided": ("""def s2(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,2*h + r_kh - 1,2*w + r_kw - 1) * W1(f,r_c,r_kh,r_kw) where h in 0:(H+1)/2, w in 0:(W+1)/2
    }""", lambda n, h, w: [(n, 3, h, w), (4, 3, 3, 3)],
                lambda I, W: _np_conv(I, W, (1, 1), 2)[:, :, :(I.shape[2] + 1) // 2, :(I.shape[3] + 1) // 2]),
    "input_grad": ("""def dconv(float(N,F,HO,WO) dO, float(F,C,KH,KW) W1) -> (dI) {
        dI(n,c,h,w) +=! dO(n,r_f,h - r_kh,w - r_kw) * W1(r_f,c,r_kh,r_kw) where h in 0:HO+KH-1, w in 0:WO+KW-1
    }""", lambda n, h, w: [(n, 4, h, w), (4, 3, 3, 3)],
                   lambda dO, W: _np_conv(dO, W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3), (2, 2))),
}
SIZES = [(2, 1, 1), (1, 2, 3), (2, 9, 40), (1, 21, 35)]  # (N, H, W): no interior, a 1-wide one, larger ones


def _inputs(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
@pytest.mark.parametrize("name", CASES)
def test_every_piece_computes_what_the_interpreter_does(name: str, cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_CPU", cpu)
    source, shapes, reference = CASES[name]
    k = tc.define(source)
    rng = random.Random(f"split-{name}-{cpu}")
    for size in SIZES:
        args = _inputs(shapes(*size), seed=len(size) + size[2])
        want = reference(*args)
        terms = int(np.prod(args[1].shape[1:])) if name != "input_grad" else args[1].shape[0] * 9
        scale = reduction_scale(*args)
        assert_close(k(*args, backend="numpy"), want, terms=terms, scale=scale, err_msg=f"{name} {size} interpreter")
        space = S.space_for(k.checked, bind_sizes(k.checked, [a.shape for a in args]))
        drawn = (S.to_options(space, space.random(rng)),) if size[1] > 8 else ()  # tuner options where they tile
        for options in (MappingOptions(), *drawn):
            got = k(*args, options=options)
            assert_close(got, want, terms=terms, scale=scale, err_msg=f"{name} {size} on {cpu} under {options}")


@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
@pytest.mark.parametrize("name", ["same3x3", "strided"])
def test_pieces_start_from_the_identity_and_the_zero_fill_goes(name: str, cpu: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece of a split statement runs the whole reduction of its outputs in its register
    tiles, whatever the guards leave of it (the first row: kh in 1..2), so each tile starts from
    the identity and the separate nest that wrote zeros first is gone; the values stay numpy's,
    under the defaults and under tuner options drawn at random (which may cut the reduction into
    chunks, where the zero fill comes back). Where some updates stay outside register tiles (an
    input gradient's corners; a 5x5 conv's on AVX2), or one nest holds two tiles, it stays."""
    monkeypatch.setenv("TCDSL_CPU", cpu)
    source, shapes, reference = CASES[name]
    k = tc.define(source)
    args = _inputs(shapes(2, 19, 37), seed=7)
    steps = dict(k.lowered(*args).passes)
    tiles = [line for line in str(steps["regtile"]).splitlines() if "register tile of S1" in line]
    assert len(tiles) > 1 and all("from the identity" in line for line in tiles), tiles
    assert "init1(" not in str(steps["regtile"]) and "init of statement" not in k.source(*args)
    want = reference(*args)
    terms = int(np.prod(args[1].shape[1:])) if name != "input_grad" else args[1].shape[0] * 9
    scale = reduction_scale(*args)
    rng = random.Random(f"identity-{name}-{cpu}")
    space = S.space_for(k.checked, bind_sizes(k.checked, [a.shape for a in args]))
    for options in (MappingOptions(), *(S.to_options(space, space.random(rng)) for _ in range(4))):
        got = k(*args, options=options)
        assert_close(got, want, terms=terms, scale=scale, err_msg=f"{name} on {cpu} under {options}")


@pytest.mark.parametrize("target", ["avx2", "avx512"])
@pytest.mark.parametrize("name", ["same3x3", "input_grad"])
def test_boundary_columns_run_in_channel_vectors(name: str, target: str) -> None:
    """With 32 output channels (whole vectors on both ISAs), the one- or two-wide boundary columns
    run along the height in tiles of channel vectors, as the interior of an AVX2 conv does, not in
    vectors along the height gathered a row apart."""
    source, _, _ = CASES[name]
    k = tc.define(source)
    # 32 output channels: the forward's filters, the input gradient's input channels
    w_shape = (32, 3, 3, 3) if name == "same3x3" else (3, 32, 3, 3)
    low = k.lowered(*_inputs([(2, 3, 9, 20), w_shape], seed=7), target=target)
    tiles = [line for line in str(low.passes[-1][1]).splitlines() if "register tile of S1" in line]
    assert not any("along h" in line for line in tiles), tiles
    channel = "along f" if name == "same3x3" else "along c"
    # (on AVX2 the interior runs in channel vectors too)
    columns = sum(bool(re.search(r"// \d+x32 register tile", line)) and channel in line for line in tiles)
    assert columns == 2 if target == "avx512" else columns >= 2, tiles
    # every tile along the channels reads W1 from packs made once per call, not with a gather per
    # step (W1's channels are a window apart); where its reductions vary along it (the columns'
    # ``kw <= w``, the corners' both), its pack holds the range they all cover
    text = str(low.passes[-1][1])
    packs = [line for line in text.splitlines() if "// pack W1" in line]
    gathered = [line for line in tiles if f"lanes per row {channel}," in line]
    assert len(packs) == len(gathered) and all("once for every thread" in p for p in packs), (packs, tiles)
    if name == "input_grad":  # the kw loop of the columns
        assert sum(bool(re.search(r"\bc\d+ in 0\.\.1, once", line)) for line in packs) >= 2, packs
    assert "_gather(&t1[" not in k.source(*_inputs([(2, 3, 9, 20), w_shape], seed=7), target=target)


@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
def test_the_threads_share_a_padded_convs_rows_not_its_boundary_columns(cpu: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 5x5 conv padded by 2 has boundary columns two wide, each writing into the same cache lines
    as the other (its neighbour in every row): the threads share the images and the rows of those
    pieces, each running both columns of its rows, not one column each, which would move the lines
    between the cores at every write. The results stay the conv's."""
    monkeypatch.setenv("TCDSL_CPU", cpu)
    source, _, reference = CASES["same5x5"]
    k = tc.define(source)
    args = _inputs([(2, 2, 11, 23), (32, 2, 5, 5)], seed=3)
    ir = k.lowered(*args).passes[-1][1]
    nests = 0
    for root in ir.body:
        while isinstance(root, LPack):
            root = root.body[0]
        if not (isinstance(root, LFor) and root.omp):
            continue
        nests += 1
        shared = {root.var} | ({root.body[0].var} if root.collapse else set())  # type: ignore[union-attr]
        # (no piece's columns are shared: the interior and the boundary rows run along them in tiles)
        assert not any(shared & expr_vars(c.args[3]) for c in walk((root,)) if isinstance(c, LCall)), str(ir)
    assert nests == 9, str(ir)  # the interior and eight boundary pieces
    assert_close(k(*args), reference(*args), terms=2 * 25, scale=reduction_scale(*args))


def _top_nests(text: str) -> list[str]:
    """The printed loop IR cut into its top-level nests (each with the pack comments before it)."""
    nests: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.startswith("for "):
            nests.append(pending + line + "\n")
            pending = ""
        elif line.startswith("//") or not nests:
            pending += line + "\n"
        else:
            nests[-1] += line + "\n"
    return nests


def test_avx2_boundary_columns_run_in_the_interiors_parallel_loop() -> None:
    """On AVX2, where a padded conv's interior runs in channel vectors (38 columns), its one-wide
    columns take one output row per tile, with the interior's loops outside (image, row): the fuse
    pass runs both columns inside the interior's parallel loop, each row's columns with its
    interior. (Beside an interior of 18 columns, in channel vectors too, the columns run in 3 rows x 4
    vectors on their own: test_boundary_columns_run_in_channel_vectors.)"""
    k = tc.define(SAME)
    low = k.lowered(*_inputs([(2, 3, 23, 40), (32, 3, 3, 3)], seed=5), target="avx2")
    steps = dict(low.passes)
    assert str(steps["fuse"]) != str(steps["pack"])
    nests = _top_nests(str(steps["fuse"]))
    interior = [n for n in nests if sum("register tile of S1" in line for line in n.splitlines()) == 3]
    assert len(interior) == 1, nests
    tiles = [line for line in interior[0].splitlines() if "register tile of S1" in line]
    assert len(tiles) == 3 and sum("// 32 register tile" in line for line in tiles) == 2, interior[0]
    assert interior[0].count("parallel omp") == 1 and interior[0].count("// pack W1") == 3, interior[0]
    # the image and row loops once, the columns' and the interior's rests inside them
    head = interior[0].splitlines()
    loops = [line for line in head if line.lstrip().startswith("for (c0 ") or line.lstrip().startswith("for (c1 ")]
    assert len(loops) == 2, interior[0]


@pytest.mark.parametrize("cpu", runnable_of("native", "avx2"))
@pytest.mark.parametrize("name", ["same3x3", "input_grad"])
def test_boundary_columns_in_channel_vectors_compute_what_numpy_does(name: str, cpu: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCDSL_CPU", cpu)
    source, _, reference = CASES[name]
    k = tc.define(source)
    for h, w in ((9, 20), (23, 13), (23, 40)):  # (23 x 40 on AVX2: columns fused into the interior)
        w_shape = (32, 3, 3, 3) if name == "same3x3" else (3, 32, 3, 3)
        args = _inputs([(2, 3, h, w), w_shape], seed=h)
        want = reference(*args)
        terms = int(np.prod(args[1].shape[1:])) if name != "input_grad" else args[1].shape[0] * 9
        assert_close(k(*args), want, terms=terms, scale=reduction_scale(*args), err_msg=f"{name} {h}x{w} on {cpu}")


def test_max_and_int_reductions_split_exactly() -> None:
    src = """def pools(float(N,H,W) X, int32(N,H,W) Y) -> (M, S) {
        M(n,h,w) max=! X(n,h + r_i - 1,w + r_j - 1) where h in 0:H, w in 0:W, r_i in 0:3, r_j in 0:3
        S(n,h,w) +=! Y(n,h + r_i - 1,w + r_j - 1) where h in 0:H, w in 0:W, r_i in 0:3, r_j in 0:3
    }"""
    k = tc.define(src)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 19, 37)).astype(np.float32)
    Y = rng.integers(-50, 50, (2, 19, 37)).astype(np.int32)
    M, Sm = k(X, Y)
    Xp = np.pad(X, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    Yp = np.pad(Y, ((0, 0), (1, 1), (1, 1)))
    want_m = np.max([Xp[:, i:i + 19, j:j + 37] for i in range(3) for j in range(3)], axis=0)
    want_s = np.sum([Yp[:, i:i + 19, j:j + 37] for i in range(3) for j in range(3)], axis=0)
    np.testing.assert_array_equal(M, want_m)
    np.testing.assert_array_equal(Sm, want_s)
    low = k.lowered(X, Y)
    assert _pieces_of(low, "S1") == 9 and _pieces_of(low, "S2") == 9


@pytest.mark.parametrize("target", ["avx2", "avx512"])
@pytest.mark.parametrize("window", [5, 7])
def test_wide_windows_boundary_pieces_keep_register_tiles(window: int, target: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The input gradient of a 5x5 or 7x7 conv: its boundary pieces are four or six rows or columns
    wide, and the window's bounds move with them (kh <= h). No register tile runs along such a
    member (its trip counts would move with the reduction's): every piece of the sum runs in a
    register tile, none in scalars. The numbers are numpy's where this machine runs the target."""
    source, _, reference = CASES["input_grad"]
    k = tc.define(source.replace("3, 3)", f"{window}, {window})"))
    args = _inputs([(2, 4, 14, 16), (4, 16, window, window)], seed=9)
    text = str(k.lowered(*args, target=target).passes[-1][1])
    pieces = [line for line in text.splitlines() if line.strip().startswith("S1(")]
    tiles = [line for line in text.splitlines() if "register tile of S1" in line]
    assert len(pieces) == 9 and len(tiles) == 9, text
    # vectors along the channels, or (AVX-512) along the columns of the pieces where they are whole
    assert all("along c," in line or "along w," in line for line in tiles), tiles
    if target not in runnable_of(target):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", target)
    dO, W = args
    want = _np_conv(dO, W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3), (window - 1, window - 1))
    assert_close(k(*args), want, terms=4 * window * window, scale=reduction_scale(*args))


# A padded conv's weight gradient as a user may write it, reading the input out of bounds at its
# edges (the derived one reads a zero-padded copy instead: tcdsl.gradpad)
_WGRAD_GUARDED = """def conv_grad(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(N, F, H, W) d_O) -> (d_W1) {
    d_W1(f, r_c, r_kh, r_kw) +=! d_O(n, f, h, w) * I(n, r_c, h + r_kh - 1, r_kw + w - 1)
        where f in 0:F, r_c in 0:C, r_kh in 0:KH, r_kw in 0:KW, n in 0:N, h in 0:H, w in 0:W
}"""


@pytest.mark.parametrize("window", [3, 5, 7])
def test_padded_weight_gradients_sum_their_rows_in_vectors(window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight gradient of a padded conv: the window's rows and columns are tied to the rows and
    columns summed over (0 <= h + kh - p < H). Its boundary values are cut one by one, as far as
    MAX_PIECES allows (the columns first), so that in every piece the columns summed over have a
    constant range: each piece sums them innermost, in vectors (whatever order the scheduler left
    the reductions in), several elements at once; the numbers are numpy's."""
    p = window // 2
    k = tc.define(_WGRAD_GUARDED.replace("- 1", f"- {p}"))
    monkeypatch.setenv("TCDSL_CPU", "avx2" if "avx2" in runnable_of("avx2") else "generic")
    rng = np.random.default_rng(10)
    I, dO = (rng.standard_normal(s).astype(np.float32) for s in ((8, 3, 12, 20), (8, 8, 12, 20)))
    W = np.zeros((8, 3, window, window), np.float32)
    text = str(dict(k.lowered(I, W, dO).passes)["vectorise"])
    sums = [line for line in text.splitlines() if "// accumulate S1" in line]
    pieces = window * window if window * window <= split.MAX_PIECES else 3 * window
    assert len(sums) == pieces, text
    assert all(re.search(r"the elements of .* at once \(simd; vector ", line) for line in sums), text
    pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    win = np.lib.stride_tricks.sliding_window_view(pad, (window, window), axis=(2, 3))
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(k(I, W, dO), ref, terms=8 * 12 * 20, scale=scale)


def test_single_tap_pieces_take_strips_of_filters_and_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A padded 3x3 conv's weight gradient: each boundary piece sums one tap, so no window loop is
    left to take into the sum, and one loop of 16 channels would load the input 16 times for 16
    multiply-adds. Its pieces take strips of both the filters and the channels at once (the
    accumulators holding their product), each load shared by a strip of the other; the numbers are
    numpy's."""
    k = tc.define(_WGRAD_GUARDED)
    target = "avx2" if "avx2" in runnable_of("avx2") else "generic"
    monkeypatch.setenv("TCDSL_CPU", target)
    rng = np.random.default_rng(11)
    I, dO = (rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 9, 21), (2, 32, 9, 21)))
    W = np.zeros((32, 16, 3, 3), np.float32)
    text = str(dict(k.lowered(I, W, dO).passes)["vectorise"])
    sums = [line for line in text.splitlines() if "// accumulate S1" in line]
    assert len(sums) == 9, text
    if target == "avx2":  # 12 accumulators: 2 filters x 4 channels (6 loads for 8 multiply-adds)
        assert all(re.search(r"the elements of c\d+s \(\d\), c\d+s \(\d\) at once", line) for line in sums), text
    pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3))
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    assert_close(k(I, W, dO), ref, terms=2 * 9 * 21, scale=scale)
