"""CPU targets: ``CpuTarget``, the machine a C kernel is compiled for, as the tiling, register-tile
and vector passes read it (next to ``GpuTarget`` for the GPU mapping).

A target names its vector ISA, the bytes of one vector register (so the lanes of each dtype), how
many vector registers the code may keep live, whether it has fused multiply-add, its cache sizes
and its cores. ``from_features`` builds one from the compiler's view of ``-march=native`` (GCC's
``-Q --help=target``) or the kernel's CPU flags; ``named`` gives the presets that ``$TCDSL_CPU``
selects (``avx512``, ``avx2``, ``sse2``, ``neon``, ``generic``), each with the compiler flags that
narrow a wider machine to it. Its ``key`` enters every cache key, kernels and tuning alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tcdsl.core.errors import TcArgumentError

LINE, L1_WAYS = 64, 8  # bytes of a cache line; ways of an L1 data cache set
SHARED_PACK_BYTES = 64 << 20  # an operand packed whole, once per call, may take this much memory
# A private L2 this large (Intel's server cores since Sapphire Rapids: 2 MiB) sits beside an L3 that
# feeds one core too slowly for a register tile to stream its panels from it (see l2_panels)
L2_PANELS_BYTES = 2 << 20


@dataclass(frozen=True)
class CpuTarget:
    isa: str  # "avx512", "avx2", "sse2", "neon" or "generic"
    arch: str  # the machine: "x86_64", "aarch64", ...
    vector_bytes: int  # bytes of one vector register
    vector_registers: int  # architectural vector registers
    fma: bool  # fused multiply-add in vectors
    l1d: int = 32 * 1024  # bytes of level-1 data cache per core
    l2: int = 512 * 1024  # bytes of level-2 cache per core
    l3: int = 8 * 1024 * 1024  # bytes of the last-level cache
    cores: int = 1  # cores this process may run on
    flags: tuple[str, ...] = ()  # compiler flags, after -march=native, that select this target

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` in one vector register (1 when the dtype has no vector form)."""
        size = np.dtype("float32" if dtype == "float16" else dtype).itemsize if dtype != "bool" else 1
        return max(1, self.vector_bytes // size)

    @property
    def accumulators(self) -> int:
        """Vector registers a register tile may keep as accumulators: the others hold the
        inputs of one step (a quarter of the file, at least four) and the broadcasts."""
        return self.vector_registers - max(4, self.vector_registers // 4)

    def panel_conflicts(self, stride: int, rows: int) -> bool:
        """Whether ``rows`` lines ``stride`` bytes apart (a register tile's operand panel read from
        the caller's memory) take more than half the ways of the L1 sets they fall into (the rest
        hold the other operand and the output), on a target whose vectors are at most half a line
        (codegen.pack packs such panels). Measured on Zen 4, AVX2: matmul 1024^3 (4 KiB rows, one
        set) 101 -> 143 GFLOP/s packed on 2 threads; 960x1000x1088 (68 lines apart: 16 sets of 8
        rows, all their ways) 1 thread 26-33 -> 21 ms; AVX-512 (whole-line vectors) 1024^3 200 ->
        187 on 2 threads, 960x1000x1088 20.5 ms either way on one, so it is left alone, except on a
        core whose L2 holds a reduction chunk's panels (``l2_panels``)."""
        if (self.vector_bytes > LINE // 2 and not self.l2_panels) or stride <= 0 or stride % LINE:
            return False
        sets = max(1, self.l1d // (LINE * L1_WAYS))
        return 2 * rows * math.gcd(stride // LINE, sets) > sets * L1_WAYS

    @property
    def l2_panels(self) -> bool:
        """Whether the packed panels of one reduction chunk stay in L2 (codegen.pack packs the
        operand whatever the vector width, and the chunk's panels fill at most half of L2) rather than
        stream from L3 across the whole reduction. On a 2 MiB-L2 Xeon (Sapphire Rapids class, 2
        threads, interleaved medians against numpy/OpenBLAS): AVX-512 matmul 1024^3 211 -> 300
        GFLOP/s (unpacked -> packed in chunks of 128 or 256; whole reduction chunks: 184), 960x1088x1000
        211 -> 295, 128x1024x1024 123 -> 160; AVX2 1024^3 152 -> 190. Zen 3/4 (512 KiB / 1 MiB L2, a
        fast L3) run the whole reduction faster (AVX2 matmul 1024^3 0.92x -> 1.01x numpy)."""
        return self.l2 >= L2_PANELS_BYTES

    @property
    def shared_pack_bytes(self) -> int:
        """The largest operand codegen.pack packs whole, once per call for every thread, rather
        than in blocks per thread (each row block copying its panels again): SHARED_PACK_BYTES, or a
        quarter of L3 where that is more. The bound is the copy's memory, not the cache: on Zen 1
        (8 MiB L3, AVX2, 2 threads) whole copies larger than L3 still ran faster than per-thread
        blocks, matmul 2048^3 (16 MiB of B) 59.5 -> 69 GFLOP/s and 256x4096x4096 (64 MiB) 41 -> 48;
        1024^3 (4 MiB) 62 -> 73."""
        return max(self.l3 // 4, SHARED_PACK_BYTES)

    @property
    def half_vectors(self) -> bool:
        """Whether the ISA has vectors of half the width with the same arithmetic (AVX-512's 256-bit
        registers, AVX2's 128-bit ones), which a register tile ends a row with where the row's last
        few elements fit in one. A core that runs a full vector as two halves spends half the FMA
        slots on one: Zen 4 with 512-bit vectors (single thread, 8x64x56x56 conv 18.1 -> 16.1 ms),
        Zen 1 with 256-bit ones (a group conv's rows of 26, 3 whole vectors and a half rather than
        4: N32 G32 C=F=16 28x28 on 2 threads, see CHANGELOG); a core with whole-width FMA units
        spends one FMA slot either way."""
        return self.isa in ("avx512", "avx2")

    @property
    def key(self) -> str:
        """What compiled code depends on (the caches are the tiling's inputs; the core count is not:
        a kernel asks OpenMP at run time)."""
        return (f"{self.isa}/{self.arch}/v{self.vector_bytes}x{self.vector_registers}/fma{int(self.fma)}"
                f"/l1d{self.l1d}/l2{self.l2}/l3{self.l3}/{' '.join(self.flags)}")

    def __str__(self) -> str:
        return (f"{self.isa} on {self.arch}: {self.vector_bytes * 8}-bit vectors ({self.lanes('float32')} float32 "
                f"lanes, {self.lanes('float64')} float64), {self.vector_registers} vector registers, "
                f"{'FMA' if self.fma else 'no FMA'}, L1d {self.l1d // 1024} KiB, L2 {self.l2 // 1024} KiB, "
                f"L3 {self.l3 // 1024} KiB, {self.cores} core(s)")


# vector ISA -> (vector bytes, vector registers, FMA); x86 narrows with the flags of NARROW
_ISAS: dict[str, tuple[int, int, bool]] = {
    "avx512": (64, 32, True),
    "avx2": (32, 16, True),
    "sse2": (16, 16, False),
    "neon": (16, 32, True),
    "generic": (16, 16, False),
}
_X86_RANK = ("sse2", "avx2", "avx512")
# GCC's tuning for some AVX2 CPUs (Zen 1: znver1) vectorises simd loops 128 bits wide, and calls libmvec's
# 4-lane expf; AVX2 targets vectorise them 256 bits wide (softmax 4096x1024 on Zen 1, 2 threads: 6.6 -> 5.4 ms)
WIDE = {"avx2": ("-mprefer-vector-width=256",)}
NARROW = {"avx2": ("-mno-avx512f", *WIDE["avx2"]), "sse2": ("-mno-avx",), "generic": ("-mno-avx",)}


def from_features(features: set[str], arch: str, cores: int = 1, caches: dict[str, int] | None = None) -> CpuTarget:
    """The widest ISA that ``features`` (GCC option names such as ``-mavx512f``, or kernel CPU flags
    such as ``avx512f``) turn on, on ``arch``."""
    have = {f.removeprefix("-m") for f in features}
    if arch in ("x86_64", "AMD64", "i686"):
        if "avx512f" in have:
            isa = "avx512"
        elif "avx2" in have and "fma" in have:
            isa = "avx2"
        else:
            isa = "sse2"
    elif arch in ("aarch64", "arm64"):
        isa = "neon"
    else:
        isa = "generic"
    size, regs, fma = _ISAS[isa]
    found = caches or {}
    return CpuTarget(isa, arch, size, regs, fma, l1d=found.get("l1d", 32 * 1024), l2=found.get("l2", 512 * 1024),
                     l3=found.get("l3", 8 * 1024 * 1024), cores=cores, flags=WIDE.get(isa, ()))


def named(name: str, native: CpuTarget) -> CpuTarget:
    """The target ``$TCDSL_CPU`` names (``native``: the machine's own), with the machine's caches
    and cores. A target narrower than the machine compiles with flags that turn the wider ISA off;
    one the machine cannot run is an error, since its kernels would stop the process."""
    name = name.strip().lower()
    if name in ("", "native"):
        return native
    if name not in _ISAS:
        raise TcArgumentError(f"TCDSL_CPU={name!r} names no CPU target; use one of native, "
                              f"{', '.join(_ISAS)}")
    if name == native.isa:
        return native
    x86 = native.isa in _X86_RANK
    runs = (x86 and name in _X86_RANK and _X86_RANK.index(name) <= _X86_RANK.index(native.isa)) or name == "generic"
    if not runs:
        raise TcArgumentError(f"TCDSL_CPU={name!r}: this machine's CPU ({native.isa} on {native.arch}) cannot run "
                              f"{name} code; narrower targets only")
    size, regs, fma = _ISAS[name]
    flags = NARROW.get(name, ()) if x86 else ()
    if name == "generic" and not x86:
        size, regs, fma = native.vector_bytes, native.vector_registers, native.fma
    return replace(native, isa=name, vector_bytes=size, vector_registers=regs, fma=fma, flags=flags)


def preset(name: str) -> CpuTarget:
    """A target by its ISA's name alone (default caches, one core), whatever this machine runs: the
    code of a cross-build, to read or compile elsewhere."""
    key = name.strip().lower()
    if key not in _ISAS:
        raise TcArgumentError(f"{name!r} names no CPU target; use one of {', '.join(_ISAS)}")
    arch = "aarch64" if key == "neon" else "any" if key == "generic" else "x86_64"
    return CpuTarget(key, arch, *_ISAS[key], flags=NARROW.get(key, ()) if arch == "x86_64" else ())


GENERIC = preset("generic")  # what code printed without a machine assumes
