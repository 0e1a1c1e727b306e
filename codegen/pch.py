"""Precompiled headers: ``(compiler, flags, target) -> ["-include", header]`` once GCC's precompiled
form of the system headers every kernel includes is ready, built in the background when it is not.

Parsing ``<immintrin.h>`` and libc's headers is most of a kernel's C compile: GCC 12 at ``-O3`` on
Zen 4 takes 0.25 s for an empty file that includes them and 0.38 s for the whole AVX2 matmul
kernel, which takes 0.15 s with them precompiled (the same library, byte for byte: the kernel's
own ``#include`` lines find the headers already read). The first kernel compiled with a new
compiler, flags or target starts the precompiled header's build (about a second of one core) in a
thread and compiles without it; the kernels after it use it. GCC checks that a precompiled header
matches the flags it is used with and reads the header's text where it does not, so a stale one
costs time, never a wrong kernel; a compile that fails with one is retried without it
(``codegen.toolchain``). ``TCDSL_PCH=0`` turns them off; compilers other than GCC never use them.

The header and its ``.gch`` live in the private cache directory (``pch/``), named by a hash of the
compiler's version and command, the flags and the header's text; a build writes a temporary and
renames it into place, then records the ``.gch``'s size and sha256 beside it, and a ``.gch`` is used
only while its bytes match that record (as the cached libraries: codegen.diskcache). One process
builds at a time: the builder holds a claim file, which others leave alone until CLAIM_S old.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tcdsl.core import knobs

from . import diskcache

HEADERS = {  # the system headers a kernel of each architecture may include (codegen.cprelude, codegen.vecisa)
    "x86_64": ("math.h", "stdbool.h", "stdint.h", "stdlib.h", "string.h", "immintrin.h"),
    "aarch64": ("math.h", "stdbool.h", "stdint.h", "stdlib.h", "string.h", "arm_neon.h"),
}
OTHER = ("math.h", "stdbool.h", "stdint.h", "stdlib.h", "string.h")
Runner = Callable[[list[str], float], tuple[int, str, str]]  # toolchain.run_tool
CLAIM_S = 300.0  # a claim to build a precompiled header this old is a dead builder's
_lock = threading.Lock()
_building: dict[str, threading.Thread] = {}  # header path -> the thread building its .gch
_verified: set[tuple[str, int, int, int]] = set()  # (.gch, inode, size, mtime) whose record matched
BUILDS = 0  # precompiled headers this process has built (tests read it)


def header_text(arch: str) -> str:
    lines = [f"#include <{h}>" for h in HEADERS.get(arch, OTHER)]
    return "\n".join(["/* tcdsl: system headers of C kernels, precompiled (codegen.pch) */", *lines,
                      "#ifdef _OPENMP", "#include <omp.h>", "#endif", ""])


def is_gcc(version: str) -> bool:
    """Whether ``--version`` printed ``version`` names GCC (clang's precompiled headers differ)."""
    first = version.splitlines()[0] if version else ""
    return "clang" not in version.lower() and ("gcc" in first.lower() or "Free Software Foundation" in version)


def include(cc: list[str], flags: list[str], version: str, arch: str, run: Runner) -> list[str]:
    """``["-include", header]`` when the precompiled header for ``cc`` and ``flags`` is ready; else
    ``[]``, having started its build (``run``: ``toolchain.run_tool``) unless one is under way."""
    if not knobs.pch() or not is_gcc(version):
        return []
    text = header_text(arch)
    h = hashlib.sha256("\0".join([version, *cc, *flags, text]).encode()).hexdigest()[:20]
    d = diskcache.private_dir(knobs.cache_dir(), "pch")
    header = d / f"tc_sys-{h}.h"
    if _trusted(header, h, text):
        return ["-include", str(header)]
    with _lock:
        t = _building.get(str(header))
        if t is not None and t.is_alive() or not _claim(header):
            return []
        t = threading.Thread(target=_build, args=(cc, flags, header, h, text, run), daemon=True,
                             name="tcdsl-pch")
        _building[str(header)] = t
    t.start()
    return []


def _claim(header: Path) -> bool:
    """Whether this process may build ``header``'s ``.gch``: it created the claim file, or the
    claim there is older than CLAIM_S (its builder died); another process's live claim means its
    build is under way (the tuner's workers start together)."""
    claim = header.with_name(f".tcdsl-claim-{header.name}")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                if time.time() - claim.stat().st_mtime < CLAIM_S:
                    return False
                claim.unlink()
            except OSError:
                return False
            continue
        except OSError:
            return False
        os.close(fd)
        return True
    return False


def _build(cc: list[str], flags: list[str], header: Path, key: str, text: str, run: Runner) -> None:
    """Write ``header`` and compile it to ``header.gch`` through a temporary; any failure leaves
    no ``.gch`` (kernels then compile without one)."""
    global BUILDS
    fd, tmp = tempfile.mkstemp(dir=header.parent, prefix=diskcache.temp_prefix(), suffix=".gch")
    os.close(fd)
    try:
        if not header.is_file() or header.read_text() != text:
            diskcache.atomic_write(header, text.encode())
        code, _, _ = run([*cc, *flags, "-x", "c-header", "-o", tmp, str(header)], knobs.compile_timeout())
        if code == 0:
            os.chmod(tmp, 0o600)  # the compiler's output follows the umask: private, as the libraries
            with open(tmp, "rb") as f:
                data = f.read()
            gch = Path(f"{header}.gch")
            os.replace(tmp, gch)
            diskcache.write_record(gch, diskcache.Record(key, "pch", len(data), hashlib.sha256(data).hexdigest()))
            with _lock:
                BUILDS += 1
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        try:
            header.with_name(f".tcdsl-claim-{header.name}").unlink()
        except OSError:
            pass


def _trusted(header: Path, key: str, text: str) -> bool:
    """Whether ``header`` holds ``text`` and its ``.gch`` the bytes recorded when tcdsl built it
    (checked once per process and file: diskcache.read_verified)."""
    gch = Path(f"{header}.gch")
    try:
        st = gch.stat()
    except OSError:
        return False
    seen = (str(gch), st.st_ino, st.st_size, st.st_mtime_ns)
    if seen in _verified:
        return True
    if diskcache.read_verified(gch, key, "pch") is None:
        return False
    try:
        if header.read_text() != text:
            return False
    except OSError:
        return False
    _verified.add(seen)
    return True


def discard(args: list[str]) -> None:
    """Remove the precompiled header of ``include``'s ``args`` (a compile failed with it)."""
    if len(args) == 2:
        try:
            os.unlink(f"{args[1]}.gch")
        except OSError:
            pass


def wait() -> None:
    """Wait for the builds this process started (tests; a process need not wait for them)."""
    with _lock:
        threads = list(_building.values())
    for t in threads:
        t.join()
