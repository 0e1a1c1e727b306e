"""Golden files: each lowering stage's printed output for a few defs on fixed CPU targets (AVX-512
and AVX2 presets, so that the files do not depend on this machine's caches): the schedule after
the CPU transformations, the loop IR, the loop IR after each lowering pass (codegen.lower), and
the C text; for the GPU (sm_90), the mapped program after each of codegen.gpulower's passes and the
CUDA text. A change in any stage shows as a diff of
these files; ``pytest tests/test_golden.py --accept-golden`` rewrites them after a deliberate
change (review the diff before committing). The numbers the C computes are checked elsewhere
(test_vectile, test_cputarget, test_c_backend). The C text also declares libmvec's vector math where
glibc has it (glibc >= 2.35 on x86-64), as kernels built here do.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import toolchain
from tcdsl.codegen.gpulower import trace as gpu_trace
from tcdsl.codegen.lower import trace
from tcdsl.polyhedral.cputarget import preset
from tcdsl.polyhedral.treeprint import tree_text

GOLDEN = Path(__file__).resolve().parent / "golden"

DEFS = {
    "matmul": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }",
               [(96, 80), (80, 100)]),
    # a reduction longer than its cache tile: the register tiles start from the identity in the
    # first chunk and load C in the others (no initialisation nest); on AVX2, two row blocks read
    # B from one pack of all of it, its chunks a dimension of the buffer
    "matmul_chunks": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }",
                      [(140, 300), (300, 64)]),
    "conv2d": ("def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
               "  O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)\n}", [(2, 8, 20, 20), (8, 8, 3, 3)]),
    # 16 output channels: AVX2 runs it in vectors along the channels, the weights packed
    "conv_channels": ("def conv_channels(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
                      "  O(n,f,h,w) +=! I(n,r_c,h + r_kh,w + r_kw) * W1(f,r_c,r_kh,r_kw)\n}",
                      [(2, 8, 12, 40), (16, 8, 3, 3)]),
    "conv_same": ("def conv_same(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
                  "  O(n,f,h,w) +=! I(n,r_c,h + r_kh - 1,w + r_kw - 1) * W1(f,r_c,r_kh,r_kw)\n"
                  "    where h in 0:H, w in 0:W\n}",
                  [(2, 4, 12, 20), (8, 4, 3, 3)]),
    "softmax": ("def softmax(float(N,D) X) -> (Y) {\n  mx(n) max=! X(n,r_d)\n  e(n,d) = exp(X(n,d) - mx(n))\n"
                "  s(n) +=! e(n,r_d)\n  Y(n,d) = e(n,d) / s(n)\n}", [(16, 200)]),
    "maxpool": ("def pool(float(N,C,H,W) I) -> (O) {\n  O(n,c,h,w) max=! I(n,c,2*h + r_kh,2*w + r_kw) "
                "where r_kh in 0:2, r_kw in 0:2\n}", [(2, 4, 16, 16)]),
    "fc_relu": ("def fc(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {\n  O1(b, n) +=! I(b, r_m) * W1(n, r_m)\n"
                "  O1(b, n) = O1(b, n) + B1(n)\n  O1(b, n) = fmax(O1(b, n), 0)\n}", [(16, 64), (96, 64), (96,)]),
    # a conv's weight gradient: summed over images, rows and columns in vectors along the rows, the
    # window's columns and a strip of filters taken at once (AVX2 4 x 3, AVX-512 8 x 3 accumulators)
    "weight_grad": ("def dw(float(N,C,H,W) I, float(N,F,OH,OW) dO) -> (dW) {\n"
                    "  dW(f,c,kh,kw) +=! dO(r_n,f,r_h,r_w) * I(r_n,c,r_h + kh,r_w + kw) where kh in 0:3, kw in 0:3\n}",
                    [(2, 4, 14, 26), (2, 16, 12, 24)]),
    # the same form where the weights are the smaller operand: they are transposed instead (tcdsl.layout)
    "tmm": ("def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m, n) +=! A(m, r_k) * B(n, r_k)\n}",
            [(48, 64), (40, 64)]),
}
TARGETS = ["avx512", "avx2"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DEFS)
def test_golden(name: str, target: str, request: pytest.FixtureRequest) -> None:
    src, shapes = DEFS[name]
    k = tc.define(src)
    args = [np.zeros(s, np.float32) for s in shapes]
    low = k.lowered(*args, target=preset(target))
    stages = {"schedule": tree_text(low.final), "loops": str(low.ir), "passes": trace(low.passes, low.ir),
              "c": low.source.text}
    accept = request.config.getoption("--accept-golden")
    for stage, text in stages.items():
        path = GOLDEN / f"{name}.{target}.{stage}.txt"
        if accept:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            continue
        assert path.exists(), f"no golden file {path.name}: run pytest {__file__} --accept-golden"
        assert text == path.read_text(), f"{path.name} changed: review, then rerun with --accept-golden"


GPU_DEFS = {  # the GPU mapping for sm_90: the program after each of codegen.gpulower's passes, and its CUDA
    "matmul": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }", [(100, 70), (70, 90)]),
    "conv2d": (DEFS["conv2d"][0], DEFS["conv2d"][1]),
}


@pytest.mark.parametrize("name", GPU_DEFS)
def test_golden_gpu(name: str, request: pytest.FixtureRequest) -> None:
    src, shapes = GPU_DEFS[name]
    low = tc.define(src).lowered_gpu(*[np.zeros(s, np.float32) for s in shapes], backend="cuda")
    stages = {"passes": gpu_trace(low.passes, low.program), "cu": low.source.text}
    accept = request.config.getoption("--accept-golden")
    for stage, text in stages.items():
        path = GOLDEN / f"{name}.gpu.{stage}.txt"
        if accept:
            path.write_text(text)
            continue
        assert path.exists(), f"no golden file {path.name}: run pytest {__file__} --accept-golden"
        assert text == path.read_text(), f"{path.name} changed: review, then rerun with --accept-golden"


MARCH = {"avx512": "-march=x86-64-v4", "avx2": "-march=x86-64-v3"}


@pytest.mark.cpu
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 targets")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DEFS)
def test_each_x86_target_compiles_on_any_x86_machine(name: str, target: str, tmp_path: Path) -> None:
    """The C for both vector widths compiles here, whichever this machine runs (an AVX2 machine
    builds the AVX-512 code for x86-64-v4), with the vector layer switched on by the compiler's own
    macros."""
    src, shapes = DEFS[name]
    text = tc.define(src).source(*[np.zeros(s, np.float32) for s in shapes], target=preset(target))
    c = tmp_path / f"{name}.c"
    if "TC_VEC_ISA" in text:  # the kernel has explicit vectors: they must be on for this -march
        text += "\n#if !TC_VEC_ISA\n#error the vector layer is off\n#endif\n"
    c.write_text(text)
    flags = [f for f in toolchain.FLAGS if f not in ("-march=native", "-shared")]
    done = subprocess.run([*toolchain.compiler(), *flags, MARCH[target], "-c", "-o", str(tmp_path / "k.o"), str(c)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "k.o").stat().st_size > 0
