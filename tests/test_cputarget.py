"""CPU targets (tcdsl.polyhedral.cputarget): detection from the compiler's or the kernel's view of
the CPU, the presets ``$TCDSL_CPU`` selects, the target in the kernel cache key, the tiling plan
reading it, and compiled kernels under random mapping options on every vector width this machine
runs (AVX-512 and AVX2 on an AVX-512 machine) agreeing with the reference interpreter.
"""

from __future__ import annotations

import dataclasses
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import toolchain
from tcdsl.core.instance import bind_sizes
from tcdsl.errors import TcArgumentError
from tcdsl.options import MappingOptions
from tcdsl.polyhedral import cputarget
from tcdsl.polyhedral.members import MemberInfo
from tcdsl.polyhedral.tileplan import plan
from tcdsl.tuner import space as S

try:
    from defs import DEFS, assert_matches, make_inputs
    from targets import runnable_of
    from tolerance import assert_sum_close
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from defs import DEFS, assert_matches, make_inputs
    from targets import runnable_of
    from tolerance import assert_sum_close

X86 = {"x86_64"}


@pytest.mark.parametrize("features, arch, isa, lanes32, regs", [
    ({"-march=znver4", "-mavx512f", "-mavx2", "-mfma"}, "x86_64", "avx512", 16, 32),
    ({"-march=znver3", "-mavx2", "-mfma"}, "x86_64", "avx2", 8, 16),
    ({"avx2", "fma", "sse2"}, "x86_64", "avx2", 8, 16),  # the kernel's CPU flags
    ({"avx2", "sse2"}, "x86_64", "sse2", 4, 16),  # AVX2 without FMA: no fused vectors
    ({"-march=x86-64"}, "x86_64", "sse2", 4, 16),
    ({"asimd", "fp"}, "aarch64", "neon", 4, 32),
    ({"-march=rv64gc"}, "riscv64", "generic", 4, 16),
])
def test_detection(features: set[str], arch: str, isa: str, lanes32: int, regs: int) -> None:
    t = cputarget.from_features(features, arch, cores=3, caches={"l1d": 48 * 1024, "l2": 2 << 20})
    assert (t.isa, t.lanes("float32"), t.vector_registers) == (isa, lanes32, regs)
    assert t.lanes("float64") == lanes32 // 2 and t.lanes("int8") == lanes32 * 4
    assert t.l1d == 48 * 1024 and t.l2 == 2 << 20 and t.cores == 3
    assert 0 < t.accumulators < t.vector_registers
    assert isa in str(t) and t.key.startswith(isa)


def test_cache_sizes_from_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """``$TCDSL_CPU_CACHES`` replaces the caches the machine reports (any of the three, K/M/G or
    bytes), whatever ``$TCDSL_CPU`` names; the target's key, and so the kernel cache, follow it;
    a malformed value is refused naming the knob."""
    monkeypatch.setenv("TCDSL_CPU_CACHES", "l2=3M, L3=12MiB")
    t = toolchain.target()
    assert (t.l2, t.l3) == (3 << 20, 12 << 20) and "l2" + str(3 << 20) in t.key
    monkeypatch.setenv("TCDSL_CPU_CACHES", "l1d=49152")
    t2 = toolchain.target()
    assert t2.l1d == 48 * 1024 and t2.key != t.key and t2.isa == t.isa
    if runnable_of("avx2"):
        monkeypatch.setenv("TCDSL_CPU", "avx2")
        assert toolchain.target().l1d == 48 * 1024
    for bad in ("l4=1M", "l2=0", "l2", "l2=1T"):
        monkeypatch.setenv("TCDSL_CPU_CACHES", bad)
        with pytest.raises(TcArgumentError, match="TCDSL_CPU_CACHES"):
            toolchain.target()


def test_presets_narrow_only() -> None:
    native = cputarget.from_features({"-mavx512f"}, "x86_64")
    avx2 = cputarget.named("avx2", native)
    assert (avx2.isa, avx2.vector_bytes, avx2.vector_registers, avx2.flags) == ("avx2", 32, 16, ("-mno-avx512f",
                                                                                      "-mprefer-vector-width=256"))
    assert cputarget.named("native", native) is native and cputarget.named("AVX512", native) == native
    assert cputarget.from_features({"-mavx2", "-mfma"}, "x86_64").flags == ("-mprefer-vector-width=256",)
    assert cputarget.named("sse2", native).flags == ("-mno-avx",)
    assert len({native.key, avx2.key, cputarget.named("sse2", native).key}) == 3
    with pytest.raises(TcArgumentError, match="cannot run avx512"):
        cputarget.named("avx512", cputarget.from_features({"-mavx2", "-mfma"}, "x86_64"))
    with pytest.raises(TcArgumentError, match="cannot run neon"):
        cputarget.named("neon", native)
    with pytest.raises(TcArgumentError, match="names no CPU target"):
        cputarget.named("pentium", native)
    arm = cputarget.from_features(set(), "aarch64")
    assert cputarget.named("generic", arm).vector_bytes == 16 and cputarget.named("generic", arm).flags == ()


@pytest.mark.parametrize("isa", ["avx512", "avx2", "sse2", "neon", "generic"])
def test_register_tiles_fit_the_target(isa: str) -> None:
    """matmul's default register tile holds at most the target's accumulators, one vector per
    lane group; the cache tiles follow the caches."""
    t = cputarget.named(isa, cputarget.from_features({"-mavx512f"} if isa != "neon" else set(),
                                                     "x86_64" if isa != "neon" else "aarch64"))
    infos = [MemberInfo(0, 1, 1, 960), MemberInfo(1, 1, 0, 1088), MemberInfo(0, 1, 1, 1000)]
    for itemsize in (4, 8):
        p = plan(infos, [True, True, False], MappingOptions(), t, itemsize)
        rows, cols = p.register[0], p.register[1]
        lanes = t.vector_bytes // itemsize
        assert rows == 6 and cols % lanes == 0
        assert rows * cols // lanes <= t.accumulators
    small = cputarget.CpuTarget("avx2", "x86_64", 32, 16, True, l1d=16 * 1024, l2=256 * 1024)
    big = cputarget.CpuTarget("avx2", "x86_64", 32, 16, True, l1d=64 * 1024, l2=2 << 20)
    assert plan(infos, [True, True, False], MappingOptions(), small).tile < \
        plan(infos, [True, True, False], MappingOptions(), big).tile


def test_a_row_loop_around_nests_of_its_own_is_shared_by_rows() -> None:
    """A one-member parallel band is a strip-mine: with nests below it (layernorm's rows) its
    strips would only be the threads' shares (1500 rows in strips of 512: three, for two threads),
    and inside another loop (a row's columns) they cut the vector loop short; it stays untiled
    there, keeping given tiles, and only an outermost pointwise loop keeps its default strips.
    Layernorm's forward then runs its rows in the OpenMP loop itself, each row's columns whole."""
    t = cputarget.CpuTarget("avx512", "x86_64", 64, 32, True, cores=2)
    rows = [MemberInfo(2, 0.5, 1.5, 1500)]
    tiled = plan(rows, [True], MappingOptions(), t, 4).tile[0]
    assert 1 < tiled < 1500
    assert plan(rows, [True], MappingOptions(), t, 4, spread=True).tile == [0]
    assert plan([MemberInfo(2, 0.5, 1.5, 100_000)], [True], MappingOptions(), t, 4, spread=True).tile == [0]
    assert plan(rows, [True], MappingOptions(tile=(256,)), t, 4, spread=True).tile == [256]
    ln = tc.define("""def ln(float(N, D) X) -> (Y) {
        mean(n) +=! X(n, d) / D
        Y(n, d) = X(n, d) - mean(n)
    }""")
    X = np.ones((1500, 1000), np.float32)
    text = str(ln.explain(X))
    assert re.search(r"for c\d+ \(n\) from 0 while \(c\d+ <= 1499\) step 1: parallel, OpenMP parallel for", text), text
    assert re.search(r"for c\d+ \(d\) from 0 while \(c\d+ <= 999\) step 1: parallel, vectorised", text), text


def test_rows_share_packed_panels_in_equal_tiles() -> None:
    """Where the reduction walks an operand's rows 4 KiB apart (matmul 1024^3: one L1 set), AVX2
    packs its panels, and the row cache tiles grow to share each copy, in eight tiles of nearly
    equal size (1024 rows: 132 each, not 144 and a last one of 16); so do rows 4352 bytes apart
    (1088 columns: 16 sets, all their ways); rows 4160 bytes apart (1040 columns) spread over all
    the sets, unpacked, in 48-row tiles; AVX-512 vectors, whole lines, do not pack, unless the L2
    holds a reduction chunk's panels (2 MiB: CpuTarget.l2_panels)."""
    avx512 = cputarget.from_features({"-mavx512f"}, "x86_64")
    avx2 = cputarget.named("avx2", avx512)
    assert avx2.panel_conflicts(4096, 128) and avx2.panel_conflicts(4352, 128)
    assert not avx2.panel_conflicts(4160, 128) and not avx2.panel_conflicts(4352, 16)
    assert not avx512.panel_conflicts(4096, 128)
    wide = dataclasses.replace(avx512, l2=2 << 20)
    assert wide.panel_conflicts(4096, 128) and not dataclasses.replace(avx512, l2=1 << 20).l2_panels

    def rows(t: cputarget.CpuTarget, m: int, n: int) -> int:
        infos = [MemberInfo(0, 1, 1, m, 4 * 1024), MemberInfo(1, 1, 0, n, 4), MemberInfo(0, 1, 1, 1024, 4 * n)]
        return plan(infos, [True, True, False], MappingOptions(), t, 4).tile[0]

    assert rows(avx2, 1024, 1024) == 132 and rows(avx2, 2048, 1024) == 6 * -(-2048 // 96)
    assert rows(avx2, 1024, 1088) == 132 and rows(avx2, 1024, 1040) == 48 and rows(avx512, 1024, 1024) == 48
    assert rows(avx2, 300, 1024) == 48  # too few rows to share: as unpacked
    # the same from the def: the stride comes from B's shape
    mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }")
    for n, step, packed in ((1024, 132, True), (1088, 132, True), (1040, 48, False)):
        low = mm.lowered(np.zeros((1024, 1024), np.float32), np.zeros((1024, n), np.float32),
                         target=cputarget.preset("avx2"))
        assert f"c0 += {step})" in low.source.text and ("packed panels of B" in low.source.text) == packed


FC = """def fc(float(B,M) I, float(N,M) W1, float(N) B1) -> (O) {
    O(b,n) +=! I(b,r_m) * W1(n,r_m)
    O(b,n) = fmax(O(b,n) + B1(n), 0.0)
}"""
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
BMM = "def bmm(float(Q,M,K) A, float(Q,K,N) B) -> (C) { C(q,m,n) +=! A(q,m,r_k) * B(q,r_k,n) }"


def test_rows_in_single_register_tiles_where_blocks_reuse_nothing() -> None:
    """Where a row cache tile would reuse nothing one register tile does not (the panels of the
    operand loaded along the rows run straight inside the rows, and the reduction is whole, or the
    whole operand fits half of L2), each row cache tile is one register tile of 6 rows, shared out
    finely among the threads: FC 128x1024 -> 1024 on AVX2 (packed whole, once per call) and on
    AVX-512 with 1 MiB of L2 (read in place, the reduction in chunks); not with 512 KiB of L2
    there, nor for matmul 1024^3 (blocks of its columns), nor inside a batch loop."""
    avx2 = cputarget.preset("avx2")
    avx512 = dataclasses.replace(cputarget.preset("avx512"), l2=1 << 20)
    fc, mm, bmm = tc.define(FC), tc.define(MM), tc.define(BMM)
    f32 = np.float32
    fc_args = (np.zeros((128, 1024), f32), np.zeros((1024, 1024), f32), np.zeros(1024, f32))

    def loops(k: tc.Kernel, args: tuple, target: cputarget.CpuTarget) -> str:
        return str(k.lowered(*args, target=target).passes[-1][1])

    fine = "c0 += 6)  // parallel omp"
    fc_avx2 = loops(fc, fc_args, avx2)
    assert fine in fc_avx2 and "copied by all threads" in fc_avx2
    assert fine in loops(fc, fc_args, avx512)
    assert fine not in loops(fc, fc_args, cputarget.preset("avx512"))  # 512 KiB of L2
    square = (np.zeros((1024, 1024), f32),) * 2
    assert "c0 += 132)" in str(mm.lowered(*square, target=avx2).passes[-1][1])
    batched = (np.zeros((8, 256, 128), f32), np.zeros((8, 128, 128), f32))
    assert "+= 6)  // parallel omp" not in str(bmm.lowered(*batched, target=avx2).passes[-1][1])


@pytest.mark.cpu
@pytest.mark.parametrize("name", runnable_of("avx2", "avx512"))
def test_rows_in_single_register_tiles_give_numpy_numbers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FC and matmul in single-register-tile row blocks (the rows not a multiple of 6: a last,
    shorter tile): numpy's numbers, bit for bit those of the scalar code."""
    monkeypatch.setenv("TCDSL_CPU", name)
    rng = np.random.default_rng(7)
    I, W1, B1 = (rng.standard_normal(s).astype(np.float32) for s in ((96, 512), (200, 512), (200,)))
    fc = tc.define(FC)
    assert "+= 6)  // parallel omp" in str(fc.lowered(I, W1, B1).passes[-1][1])
    got = fc(I, W1, B1)
    assert_sum_close(got, lambda i, w, b: np.maximum(i @ w.T + b, 0), I, W1, B1, terms=512)
    A, B = (rng.standard_normal(s).astype(np.float32) for s in ((100, 256), (256, 256)))
    mm = tc.define(MM)
    assert "+= 6)  // parallel omp" in str(mm.lowered(A, B).passes[-1][1])
    got = mm(A, B)
    assert_sum_close(got, lambda a, b: a @ b, A, B, terms=256)
    np.testing.assert_array_equal(got, mm(A, B, options=MappingOptions(vectorize=False)))


@pytest.mark.cpu
def test_the_target_is_in_the_kernel_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    if toolchain.native_target(tuple(toolchain.compiler())).isa != "avx512":
        pytest.skip("needs an AVX-512 machine to narrow")
    keys = set()
    for name in ("native", "avx2", "sse2"):
        monkeypatch.setenv("TCDSL_CPU", name)
        keys.add(toolchain.library_key("int f(void) { return 0; }", "k"))
    assert len(keys) == 3


@pytest.mark.cpu
def test_the_target_is_in_the_tuning_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from tcdsl.tuner.tune import key_for

    if toolchain.native_target(tuple(toolchain.compiler())).isa != "avx512":
        pytest.skip("needs an AVX-512 machine to narrow")
    k = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }")
    arrays = [np.ones((4, 4), np.float32)] * 2
    keys = []
    for name in ("native", "avx2"):
        monkeypatch.setenv("TCDSL_CPU", name)
        keys.append(key_for(k, arrays))
    assert keys[0].arch != keys[1].arch and "avx2/" in keys[1].arch and "avx512/" in keys[0].arch


def _runnable() -> list[str]:
    return runnable_of("native", "avx2")


PICKED = ["matmul", "matmul_tn", "batch_matmul", "gemm_alpha_beta", "conv2d_valid", "conv2d_strided",
          "maxpool_2x2_s2", "softmax", "layernorm", "reduce_rows", "transposes", "conv1d_padded_sum_prod_max",
          "contraction_odd_views", "let_in_reduction"]


@pytest.mark.cpu
@pytest.mark.parametrize("cpu", _runnable())
@pytest.mark.parametrize("name", PICKED)
def test_random_options_on_every_vector_width(name: str, cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A corpus def under its default options and two options drawn from the tuner's space
    (seeded), compiled for this vector width, against numpy and the reference interpreter."""
    monkeypatch.setenv("TCDSL_CPU", cpu)
    case = next(c for c in DEFS if c.name == name)
    k = tc.define(case.source)
    args = make_inputs(case.inputs)
    arrays = [np.asarray(a) for a in args]
    space = S.space_for(k.checked, bind_sizes(k.checked, [a.shape for a in arrays]))
    rng = random.Random(f"{name}-{cpu}")
    drawn = [S.to_options(space, space.random(rng)) for _ in range(2)]
    want = case.reference(*args)
    ref = k(*args, backend="numpy")
    for options in (MappingOptions(), *drawn):
        got = k(*args, backend="c", options=options)
        assert_matches(got, want, case.tol, f"{name} on {cpu} under {options}")
        assert_matches(got, ref, case.tol, f"{name} on {cpu} under {options} (interpreter)")


def test_conv_output_rows_take_bands_where_their_input_outgrows_l2() -> None:
    """A conv whose input rows, across every channel, outgrow 2/3 of L2 (64 channels of 56x56:
    800 KB of a 1 MB L2) runs in bands of output rows, whole register tiles dividing the rows (6 of
    54), the bands and the images the parallel loops; at 46x46 (540 KB), with AVX-512's whole-row
    tiles, and with AVX2's tile in channel vectors (output channels filling them), the image stays
    whole. 40 output channels keep AVX2 in its tile along the columns."""
    conv = tc.define("""def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
    }""")
    mib = 1 << 20

    def first_loop(isa: str, side: int, channels: int = 40) -> str:
        t = dataclasses.replace(cputarget.preset(isa), l2=mib)
        low = conv.lowered(np.zeros((8, 64, side, side), np.float32), np.zeros((channels, 64, 3, 3), np.float32),
                           target=t)
        # after the passes: the parallel loop marked (below the notes of what is packed before it)
        return next(line for line in str(low.passes[-1][1]).split("\n") if not line.startswith("//"))

    assert re.search(r"c\d+ \+= 6\)", first_loop("avx2", 56)) and "collapse(2)" in first_loop("avx2", 56)
    assert re.search(r"c\d+ \+= 1\)", first_loop("avx2", 46))  # the images outermost, whole
    assert re.search(r"c\d+ \+= 1\)", first_loop("avx512", 56))
    assert re.search(r"c\d+ \+= 1\)", first_loop("avx2", 56, channels=64))


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_batch_of_one_takes_the_same_register_tile_as_a_batch(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv of one image plans the register tile a batch gets (the batch member, one wide and
    invariant for every read, does not take a row of the tile), and computes the same numbers."""
    conv = tc.define("""def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
    }""")
    t = cputarget.preset(isa)
    W = np.random.default_rng(3).standard_normal((32, 8, 3, 3)).astype(np.float32)

    def tile(n: int) -> str:
        low = conv.lowered(np.zeros((n, 8, 12, 56), np.float32), W, target=t)
        line = next(line.strip().split(";")[0] for line in str(low.passes[-1][1]).split("\n")
                    if "register tile of" in line)
        return re.sub(r"\bc\d+\b", "c", line)  # the loops' names follow the schedule's dimensions

    assert tile(1) == tile(3), (tile(1), tile(3))
    if isa not in runnable_of(isa):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", isa)
    I = np.random.default_rng(4).standard_normal((1, 8, 12, 56)).astype(np.float32)
    assert_sum_close(conv(I, W), lambda a, b: np.einsum(
        "nchwkl,fckl->nfhw", np.lib.stride_tricks.sliding_window_view(a, (3, 3), axis=(2, 3)), b), I, W, terms=8 * 9)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("width", [30, 18])
def test_rows_of_a_few_vectors_run_in_channel_vectors_on_avx2(isa: str, width: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv whose output rows are two to four vectors (30 or 18 columns) runs in vectors of
    output channels on AVX2, as wider images do (a whole row in the tile would hold 2 channels x 4
    vectors: two operand loads for every three multiply-adds). AVX-512 takes rows that fill their
    vectors (30 of 32 lanes) whole, along the columns, and rows of 18 (18 of 32 lanes) in channel
    vectors too; a group conv keeps its rows on both (its groups move the weights). Against numpy."""
    conv = tc.define("""def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
    }""")
    rng = np.random.default_rng(8)
    I = rng.standard_normal((2, 16, 7, width + 2)).astype(np.float32)
    W = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    low = conv.lowered(I, W, target=cputarget.preset(isa))
    tiles = [line for line in str(low.passes[-1][1]).split("\n") if "register tile of S1" in line]
    along = "along f" if isa == "avx2" or width == 18 else "along w"
    assert tiles and all(along in line for line in tiles), tiles
    # a group conv's groups move its weights too: unpacked in channel vectors they would be gathered
    group = tc.define("""def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
        O(n,g,f,h,w) +=! I(n,g,r_c,h + r_kh,w + r_kw) * W1(g,f,r_c,r_kh,r_kw)
    }""")
    GI = rng.standard_normal((2, 3, 4, 7, width + 2)).astype(np.float32)
    GW = rng.standard_normal((3, 16, 4, 3, 3)).astype(np.float32)
    gtiles = [line for line in str(group.lowered(GI, GW, target=cputarget.preset(isa)).passes[-1][1]).split("\n")
              if "register tile of S1" in line]
    assert gtiles and all("along w" in line for line in gtiles), gtiles
    if isa not in runnable_of(isa):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", isa)
    assert_sum_close(conv(I, W), lambda a, b: np.einsum(
        "nchwkl,fckl->nfhw", np.lib.stride_tricks.sliding_window_view(a, (3, 3), axis=(2, 3)), b), I, W, terms=16 * 9)
    assert_sum_close(group(GI, GW), lambda a, b: np.einsum(
        "ngchwkl,gfckl->ngfhw", np.lib.stride_tricks.sliding_window_view(a, (3, 3), axis=(3, 4)), b), GI, GW,
        terms=4 * 9)


def test_a_conv_tile_cut_short_under_a_band_tile_keeps_its_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX2 runs a conv on 70x70 images in tiles of 3 columns x 4 channel vectors, its rows in bands
    of 64: the last tile of a row has 2 columns, and isl bounds that tile's loop as
    ``-div(c9 + 24, 23) + 3``. The loop is bounded by the tile's size from the schedule's mark, so
    the register tile and its vectors stay (scalar code ran 15x slower). Against numpy."""
    conv = tc.define("""def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)
    }""")
    rng = np.random.default_rng(9)
    I = rng.standard_normal((1, 8, 70, 70)).astype(np.float32)
    W = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
    ir = str(conv.lowered(I, W, target=cputarget.preset("avx2")).passes[-1][1])
    tiles = [line for line in ir.split("\n") if "register tile of S1" in line]
    assert tiles and "3x32 register tile" in tiles[0] and "lanes per row along f" in tiles[0], ir
    assert "div(" in tiles[0] and "== 1), 2x32" in tiles[0], tiles  # the 2-column tile, in vectors too
    if "avx2" not in runnable_of("avx2"):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", "avx2")
    assert_sum_close(conv(I, W), lambda a, b: np.einsum(
        "nchwkl,fckl->nfhw", np.lib.stride_tricks.sliding_window_view(a, (3, 3), axis=(2, 3)), b), I, W, terms=8 * 9)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_strided_conv_gets_a_register_tile(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv with a stride of 2 runs its channels inside a register tile of output channels x
    columns, not with its reductions innermost: its 3x3 window reads contiguous memory, the
    columns do not, and that small window no longer decides the plan. Against numpy."""
    conv = tc.define("""def conv_s2(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
        O(n,f,h,w) +=! I(n,r_c,2*h + r_kh,2*w + r_kw) * W1(f,r_c,r_kh,r_kw)
            where h in 0:(H-KH)/2+1, w in 0:(W-KW)/2+1
    }""")
    rng = np.random.default_rng(6)
    I = rng.standard_normal((2, 8, 13, 37)).astype(np.float32)
    W = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    low = conv.lowered(I, W, target=cputarget.preset(isa))
    tiles = [line for line in str(low.passes[-1][1]).split("\n") if "register tile of S1 across" in line]
    # the channels and the window inside the tile
    assert tiles and re.search(r"register tile of S1 across c\d+, c\d+, c\d+;", tiles[0]), str(low.passes[-1][1])
    if isa not in runnable_of(isa):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", isa)
    win = np.lib.stride_tricks.sliding_window_view
    assert_sum_close(conv(I, W), lambda a, b: np.einsum(
        "nchwkl,fckl->nfhw", win(a, (3, 3), axis=(2, 3))[:, :, ::2, ::2], b), I, W, terms=8 * 9)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_padded_weight_gradient_of_few_filters_sums_its_rows_in_vectors(isa: str, monkeypatch: pytest.MonkeyPatch
                                                                         ) -> None:
    """The weight gradient of a padded 3x3 conv on small images with few filters (a tiny training
    layer: 4 filters, 8x8 images) is split into boundary pieces whose only longer parallel member,
    the filters, is shorter than a vector: no register tile runs across it (strided, in scalars);
    each piece sums its rows in vectors, every filter at once, as the passes print. Against numpy."""
    t = cputarget.preset(isa)
    piece = [MemberInfo(0, 1, 2, 4, 256, 4), MemberInfo(0, 3, 0, 1), MemberInfo(0, 3, 0, 1), MemberInfo(0, 3, 0, 1),
             MemberInfo(0, 1, 2, 32, 1024, 32), MemberInfo(0, 1, 2, 7, 32, 8), MemberInfo(2, 1, 0, 7, 4, 8)]
    p = plan(piece, [True] * 4 + [False] * 3, MappingOptions(), t, 4, boundary=True)
    assert p.register == [1] * 7 and p.order[-3:] == [4, 5, 6], p
    dw = tc.define("""def dw(float(N,C,H,W) I, float(N,F,H,W) dO) -> (dW) {
        dW(f, c, kh, kw) +=! dO(n, f, h, w) * I(n, c, h + kh - 1, w + kw - 1)
            where kh in 0:3, kw in 0:3, h in 0:H, w in 0:W
    }""")
    rng = np.random.default_rng(8)
    I, dO = rng.standard_normal((32, 1, 8, 8)).astype(np.float32), rng.standard_normal((32, 4, 8, 8)).astype(np.float32)
    text = str(dict(dw.lowered(I, dO, target=t).passes)["vectorise"])
    assert "register tile" not in text, text
    sums = [line for line in text.split("\n") if "// accumulate S1" in line]
    lanes = t.lanes("float32")
    assert len(sums) == 9 and all("the elements of c0 (4) at once" in line for line in sums), text
    # the pieces' rows: 7 columns (a boundary column cut off) in one masked vector, 8 on AVX-512 too
    assert sum(f"vector 7 of {lanes} lanes masked per" in line for line in sums) == 6, text
    assert sum((f"vector 8 of {lanes} lanes masked" if lanes > 8 else "vector 1 x 8 lanes per") in line
               for line in sums) == 3, text
    if isa not in runnable_of(isa):
        return  # the plan is checked; this machine cannot run the target's code
    monkeypatch.setenv("TCDSL_CPU", isa)
    pad = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3))
    ref = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    got = dw(I, dO)
    assert np.all(np.abs(got - ref) <= 32 * 64 * np.finfo(np.float32).eps * scale + 1e-30)


def test_reductions_innermost_keep_a_lone_tiled_parallel_member_whole() -> None:
    """A weight gradient's band (filters, channels, the window; then images, rows, columns summed
    innermost) cuts no parallel member into cache tiles when only one of them would be: its tiles
    reuse nothing, and 40 filters in 32 + 8 leave no whole strips for the jammed sums.
    Where two of them are tiled (512 x 512 channels), both keep their tiles."""
    t = cputarget.preset("avx512")

    def band(f: int, c: int) -> list[MemberInfo]:
        return [MemberInfo(0, 1, 2, f, 3136, f), MemberInfo(0, 1, 2, c, 3600, c), MemberInfo(0, 1, 2, 3, 120, 3),
                MemberInfo(1, 1, 1, 3, 4, 3), MemberInfo(0, 0, 2, 6, 1, 6), MemberInfo(0, 0, 2, 28, 1, 28),
                MemberInfo(2, 0, 0, 28, 4, 28)]

    coincident = [True] * 4 + [False] * 3
    assert plan(band(40, 24), coincident, MappingOptions(), t, 4).tile[:4] == [0, 0, 0, 0]
    wide = plan(band(512, 512), coincident, MappingOptions(), t, 4).tile
    assert 1 < wide[0] < 512 and 1 < wide[1] < 512, wide
    conv = tc.define("""def cbr(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * Wt(f, r_c, r_kh, r_kw)
    }""")
    rng = np.random.default_rng(9)
    I = rng.standard_normal((2, 24, 10, 10)).astype(np.float32)
    W = rng.standard_normal((40, 24, 3, 3)).astype(np.float32)
    grad = tc.define(conv.backward_source(wrt=["Wt"]))
    dO = rng.standard_normal((2, 40, 8, 8)).astype(np.float32)
    text = str(grad.lowered(I, W, dO, target=t).lowered_ir)
    strip = re.search(r"for \(c\d+ = 0; \(c\d+ <= 39\); c\d+ \+= (\d+)\)  // parallel omp", text)
    assert strip is not None and int(strip.group(1)) > 1 and 40 % int(strip.group(1)) == 0, text
    win = np.lib.stride_tricks.sliding_window_view(I.astype(np.float64), (3, 3), axis=(2, 3))
    want = np.einsum("nfhw,nchwkl->fckl", dO.astype(np.float64), win)
    scale = np.einsum("nfhw,nchwkl->fckl", np.abs(dO.astype(np.float64)), np.abs(win))
    got = grad(I, W, dO)
    assert np.all(np.abs(got - want) <= 2 * 64 * np.finfo(np.float32).eps * scale + 1e-30)
