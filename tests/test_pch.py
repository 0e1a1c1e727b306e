"""Precompiled system headers (codegen.pch): the first C kernel built with a compiler and flags
starts the header's build and compiles without it; the kernels after it compile through it, into
the same library bytes; a broken precompiled header or TCDSL_PCH=0 still compiles right."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import pch, toolchain

pytestmark = pytest.mark.cpu

SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
GCC = "gcc" in toolchain.compiler_version(tuple(toolchain.compiler())).splitlines()[0].lower()
needs_gcc = pytest.mark.skipif(not GCC, reason="precompiled headers are GCC's")


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines of the kernel compiles (not the header's build) from here on."""
    seen: list[list[str]] = []
    real = toolchain.run_tool

    def run(cmd: list[str], timeout: float) -> tuple[int, str, str]:
        if "c-header" not in cmd and "--version" not in cmd:
            seen.append(cmd)
        return real(cmd, timeout)

    monkeypatch.setattr(toolchain, "run_tool", run)
    return seen


def _mm(n: int, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    A = np.random.default_rng(n).random((n, n), dtype=np.float32)
    return tc.define(SRC)(A, A, **kw), A


@needs_gcc
def test_first_kernel_starts_the_header_and_later_ones_use_it(fresh_cache: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pch.wait()  # builds other tests started
    seen = _spy(monkeypatch)
    before = pch.BUILDS
    C, A = _mm(40)
    assert not any("-include" in cmd for cmd in seen)  # the first compiles without it
    pch.wait()
    assert pch.BUILDS == before + 1
    (gch,) = (fresh_cache / "pch").glob("tc_sys-*.h.gch")
    assert gch.stat().st_size > 0 and (gch.stat().st_mode & 0o077) == 0
    C2, A2 = _mm(41)
    assert any("-include" in cmd and str(gch)[: -len(".gch")] in cmd for cmd in seen)
    for got, a in ((C, A), (C2, A2)):
        np.testing.assert_allclose(got, a.astype(np.float64) @ a, rtol=1e-5, atol=1e-5 * a.shape[0])


@needs_gcc
def test_the_same_library_with_and_without_it(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mm(40)
    pch.wait()
    k = tc.define(SRC)
    A = np.ones((33, 33), np.float32)
    text = k.source(A, A)
    with_pch = toolchain.built(text, "mm", "tc_kernel", rebuild=True)
    monkeypatch.setenv("TCDSL_PCH", "0")
    without = toolchain.built(text, "mm", "tc_kernel", rebuild=True)
    assert with_pch.sha256 == without.sha256


@needs_gcc
def test_a_planted_or_broken_header_is_not_used(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .gch whose bytes do not match the record tcdsl wrote is never handed to the compiler: the
    kernel compiles without it and a new one is built in its place."""
    _mm(40)
    pch.wait()
    (gch,) = (fresh_cache / "pch").glob("tc_sys-*.h.gch")
    gch.write_bytes(b"not a precompiled header" * 100)
    seen = _spy(monkeypatch)
    C, A = _mm(42)
    assert seen and not any("-include" in cmd for cmd in seen)
    np.testing.assert_allclose(C, A.astype(np.float64) @ A, rtol=1e-5, atol=1e-5 * A.shape[0])
    pch.wait()
    assert gch.read_bytes()[:4] == b"gpch"  # GCC's own again
    _mm(43)
    assert "-include" in seen[-1]


@needs_gcc
def test_a_compile_that_fails_with_the_header_is_retried_without(fresh_cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _mm(40)
    pch.wait()
    (gch,) = (fresh_cache / "pch").glob("tc_sys-*.h.gch")
    seen = _spy(monkeypatch)
    real = toolchain.run_tool

    def run(cmd: list[str], timeout: float) -> tuple[int, str, str]:
        if "-include" in cmd:
            return 1, "", "error: the precompiled header does not fit"
        return real(cmd, timeout)

    monkeypatch.setattr(toolchain, "run_tool", run)
    C, A = _mm(44)
    np.testing.assert_allclose(C, A.astype(np.float64) @ A, rtol=1e-5, atol=1e-5 * A.shape[0])
    assert not gch.exists()  # it failed where the kernel's own text compiled: built again next time
    assert seen and not any("-include" in cmd for cmd in seen)  # the compile that counted: without it


def test_turned_off(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pch.wait()  # builds other tests started
    monkeypatch.setenv("TCDSL_PCH", "0")
    seen = _spy(monkeypatch)
    before = pch.BUILDS
    _mm(40)
    _mm(41)
    pch.wait()
    assert pch.BUILDS == before and not (fresh_cache / "pch").exists()
    assert seen and not any("-include" in cmd for cmd in seen)


def test_only_gcc() -> None:
    assert pch.is_gcc("gcc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.")
    assert not pch.is_gcc("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu")
    assert not pch.is_gcc("")


@needs_gcc
def test_one_build_at_a_time_across_processes(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's fresh claim (the tuner's workers compile at once) means its build is under
    way: this one compiles without the header and builds none; a claim older than CLAIM_S is a
    dead builder's and is taken over."""
    pch.wait()
    before = pch.BUILDS
    _mm(40)  # creates the directory, claims and builds
    pch.wait()
    (gch,) = (fresh_cache / "pch").glob("tc_sys-*.h.gch")
    header = Path(str(gch)[: -len(".gch")])
    claim = header.with_name(f".tcdsl-claim-{header.name}")
    assert not claim.exists() and pch.BUILDS == before + 1
    gch.unlink()
    claim.write_text("another process")
    seen = _spy(monkeypatch)
    _mm(41)
    pch.wait()
    assert pch.BUILDS == before + 1 and not gch.exists() and not any("-include" in c for c in seen)
    old = time.time() - pch.CLAIM_S - 10
    os.utime(claim, (old, old))
    _mm(42)
    pch.wait()
    assert pch.BUILDS == before + 2 and gch.exists() and not claim.exists()
