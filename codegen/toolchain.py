"""Toolchain: ``CSource -> shared library`` with the system C compiler, cached on disk.

The cache key is the C text, the compiler's ``--version``, the flags and the tcdsl version; the
library is written to a temp file and renamed into place, so concurrent builders of one kernel
are safe. A failed compile keeps its source and raises ``TcCompileError`` with the log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path

from tcdsl import knobs
from tcdsl.errors import TcCompileError

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
         "-std=gnu11")
_loaded: dict[str, ctypes.CDLL] = {}
BUILDS = 0  # compiler invocations in this process (on-disk cache misses)
_lock = threading.Lock()


@functools.cache
def has_vector_math() -> bool:
    """glibc >= 2.35 on x86-64: libmvec has the SIMD math functions the C emitter can declare."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        name, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()  # e.g. "glibc 2.36"
        major, minor = (int(x) for x in version.split(".")[:2])
    except (ValueError, OSError, AttributeError):
        return False
    return name == "glibc" and (major, minor) >= (2, 35)


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "gcc")) or ["gcc"]


@functools.cache
def compiler_version(cc: tuple[str, ...]) -> str:
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TcCompileError(f"the C compiler {' '.join(cc)!r} cannot be run: {e}") from None
    return out.stdout.strip()


def library_key(source: str) -> str:
    from tcdsl import __version__

    cc = tuple(compiler())
    h = hashlib.sha256()
    for part in (source, compiler_version(cc), " ".join(cc), " ".join(FLAGS), __version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def build(source: str, stem: str) -> Path:
    """The path of the shared library for ``source`` (compiled unless cached)."""
    key = library_key(source)
    out_dir = knobs.cache_dir() / "c"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{stem}-{key}.so"
    if lib.exists() and not knobs.force_recompile():
        return lib
    src = out_dir / f"{stem}-{key}.c"
    _atomic_write(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{stem}-", suffix=".so")
    os.close(fd)
    libs = ["-lmvec", "-lm"] if "declare simd" in source else ["-lm"]
    cmd = [*compiler(), *FLAGS, "-o", tmp, str(src), *libs]
    global BUILDS
    BUILDS += 1
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        raise TcCompileError(f"the C compiler failed to run: {e}; source kept at {src}") from None
    if proc.returncode != 0:
        os.unlink(tmp)
        raise TcCompileError(f"C compilation failed (source kept at {src}):\n$ {shlex.join(cmd)}\n"
                             f"{proc.stderr.strip()}")
    os.replace(tmp, lib)
    return lib


def load(path: Path) -> ctypes.CDLL:
    with _lock:
        lib = _loaded.get(str(path))
        if lib is None:
            lib = ctypes.CDLL(str(path))
            _loaded[str(path)] = lib
        return lib


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
