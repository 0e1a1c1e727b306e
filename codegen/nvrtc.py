"""NVRTC through ctypes: ``CUDA source -> cubin + ptxas report``, with no GPU and no cupy needed.

The library comes from the ``nvidia-cuda-nvrtc`` wheel (or the system's libnvrtc). Used to check
that every generated CUDA kernel compiles for a target architecture and how many registers and
spills ptxas reports; the CUDA runtime itself compiles through cupy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import re
from dataclasses import dataclass

from tcdsl.core.errors import TcCompileError


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str  # NVRTC's log, with ptxas's report per kernel (-v)

    def spills(self) -> dict[str, int]:
        """Bytes of spill stores + loads per kernel, from ptxas's report."""
        out: dict[str, int] = {}
        current = ""
        for line in self.log.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m:
                current = m.group(1)
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and current:
                out[current] = int(m.group(1)) + int(m.group(2))
        return out


@functools.cache
def library() -> ctypes.CDLL | None:
    """libnvrtc, from the nvidia-cuda-nvrtc wheel or the system; None when there is none."""
    candidates: list[str] = []
    try:
        import nvidia

        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
            candidates += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in path or ".alt." in path:
            continue
        try:
            for dep in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                if ".alt." not in dep:  # NVRTC opens its builtins by name: load them first, globally
                    ctypes.CDLL(dep, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def available() -> bool:
    return library() is not None


def compile_cuda(text: str, arch: str = "sm_90", name: str = "tc.cu") -> Compiled:
    """Compile ``text`` to a cubin for ``arch``; raises ``TcCompileError`` with NVRTC's log."""
    lib = library()
    if lib is None:
        raise TcCompileError("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None))
    try:
        opts = [f"-arch={arch}", "--std=c++17", "--ptxas-options=-v", "-diag-suppress=177"]
        arr = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if status != 0:
            raise TcCompileError(f"NVRTC rejected the generated CUDA kernel:\n{log}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin))
        return Compiled(cubin.raw, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def version() -> tuple[int, int]:
    lib = library()
    if lib is None:
        return (0, 0)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return (major.value, minor.value)


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise TcCompileError(f"NVRTC failed: {lib.nvrtcGetErrorString(status).decode()}")
