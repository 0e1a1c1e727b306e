"""Knobs: every environment variable tcdsl reads, declared once (all named ``TCDSL_*``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import TcArgumentError


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def check_schedule() -> bool:
    """TCDSL_CHECK_SCHEDULE: check that every dependence holds after each schedule transformation
    (always checked once after the whole pass)."""
    return _flag("TCDSL_CHECK_SCHEDULE")


def isl_max_operations() -> int:
    """TCDSL_ISL_MAX_OPERATIONS: the isl scheduler's operation budget before it falls back to the
    program order (default 2,000,000)."""
    return int(os.environ.get("TCDSL_ISL_MAX_OPERATIONS", "2000000"))


def schedule_timeout() -> float:
    """TCDSL_SCHEDULE_TIMEOUT: seconds isl's scheduler may search before the kernel falls back to
    the program order (default 10; 0 searches in this process without a limit)."""
    return float(os.environ.get("TCDSL_SCHEDULE_TIMEOUT", "10"))


def cpu() -> str:
    """TCDSL_CPU: the CPU target C kernels compile for: ``native`` (the default: what the compiler's
    ``-march=native`` turns on), or a narrower one of ``avx512``, ``avx2``, ``sse2``, ``neon`` and
    ``generic`` (see tcdsl.polyhedral.cputarget)."""
    return os.environ.get("TCDSL_CPU", "native")


_SIZE = re.compile(r"\s*(l1d|l2|l3)\s*=\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", re.I)


def cpu_caches() -> dict[str, int]:
    """TCDSL_CPU_CACHES: cache sizes that replace what the machine reports (``l1d=32K,l2=1M,l3=32M``;
    any of the three): for a virtual machine whose reported caches are not its CPU's, or to build
    for another machine's. Tiling and packing decisions read them."""
    text = os.environ.get("TCDSL_CPU_CACHES", "").strip()
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _SIZE.fullmatch(part)
        if m is None or int(m[2]) == 0:
            raise TcArgumentError(f"TCDSL_CPU_CACHES={text!r}: {part!r} is not a cache size such as l2=1M "
                                  f"(l1d, l2 or l3 = a positive number of bytes, K, M or G)")
        out[m[1].lower()] = int(m[2]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[3].upper()]
    return out


# os.environ's own mapping of encoded names to encoded values (CPython, POSIX): read directly, a
# lookup costs a twentieth of os.environ.get's, which encodes the name and decodes the value
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


if isinstance(_ENV_DATA, dict):
    _env = _ENV_DATA.get

    def call_env() -> tuple[object, ...]:
        """What a call's CPU target and C compiler are read from (TCDSL_CPU, CC, TCDSL_CPU_CACHES), as raw
        values to compare with a previous call's (a repeated call checks them before it reuses its kernel)."""
        return _env(b"TCDSL_CPU"), _env(b"CC"), _env(b"TCDSL_CPU_CACHES")
else:
    def call_env() -> tuple[object, ...]:
        """``call_env`` where os.environ keeps no encoded mapping."""
        return os.environ.get("TCDSL_CPU"), os.environ.get("CC"), os.environ.get("TCDSL_CPU_CACHES")


def cache_dir() -> Path:
    """TCDSL_CACHE_DIR: where compiled kernels live (default ``$XDG_CACHE_HOME/tcdsl`` or ``~/.cache/tcdsl``).
    tcdsl creates it 0700; one that is group- or world-writable, owned by another user or not
    writable is refused with a ``TcCacheWarning``, and kernels then go to a private temporary
    directory for the process."""
    if os.environ.get("TCDSL_CACHE_DIR"):
        return Path(os.environ["TCDSL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tcdsl"


def tuning_db() -> Path:
    """TCDSL_TUNING_DB: the SQLite tuning cache (default ``tuning.sqlite`` in the cache dir)."""
    if os.environ.get("TCDSL_TUNING_DB"):
        return Path(os.environ["TCDSL_TUNING_DB"])
    return cache_dir() / "tuning.sqlite"


def cache_max() -> int:
    """TCDSL_CACHE_MAX: the most bytes of compiled kernels kept on disk (``2G``, ``500M``, ``800K``,
    ``1.5GiB`` or a number of bytes; ``0``: no limit; default 2G). Past it, the least recently used
    kernels go."""
    text = os.environ.get("TCDSL_CACHE_MAX", "2G")
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise TcArgumentError(f"TCDSL_CACHE_MAX={text!r}: expected a size such as 2G, 500M or 1000000 (bytes)")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()])


def compile_timeout() -> float:
    """TCDSL_COMPILE_TIMEOUT: seconds one run of the C compiler may take before it is killed with its
    whole process group and the compile fails (default 600)."""
    return float(os.environ.get("TCDSL_COMPILE_TIMEOUT", "600"))


def pch() -> bool:
    """TCDSL_PCH: compile C kernels with a precompiled header of the system headers they include
    (GCC only; default on, ``0`` turns it off; see tcdsl.codegen.pch)."""
    return os.environ.get("TCDSL_PCH", "1").strip().lower() not in ("0", "false", "no", "off")


def keep_heap() -> bool:
    """TCDSL_KEEP_HEAP: on glibc, before the first C kernel runs, let freed memory stay in the heap
    for reuse (``mallopt``: blocks under 32 MiB from the heap, trimmed back to the system past
    128 MiB free) unless the process set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``
    itself; ``0`` leaves glibc's defaults."""
    return os.environ.get("TCDSL_KEEP_HEAP", "1").strip().lower() not in ("0", "false", "no", "off")


def force_recompile() -> bool:
    """TCDSL_FORCE_RECOMPILE: ignore the on-disk cache of compiled kernels."""
    return _flag("TCDSL_FORCE_RECOMPILE")


def dump_dir() -> Path | None:
    """TCDSL_DUMP_DIR: if set, write each stage's text there (scop, schedule, loop IR, the loop IR after each
    lowering pass, C)."""
    d = os.environ.get("TCDSL_DUMP_DIR")
    return Path(d) if d else None


def debug() -> bool:
    """TCDSL_DEBUG: show tcdsl's internal frames in tracebacks of user errors."""
    return _flag("TCDSL_DEBUG")
