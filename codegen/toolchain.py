"""Toolchain: ``CSource text -> Built (verified library bytes) -> loaded ctypes library``, with the
system C compiler and an on-disk cache (see ``diskcache``).

The cache key names the C text, the def, the compiler's ``--version``, the flags, the CPU target
(``-march=native``'s features) and the tcdsl version; the entry function gets a symbol unique to the
key. A library is loaded only from bytes that match the record tcdsl wrote when it built them; any
other entry is rebuilt. A failed compile keeps its source and raises ``TcCompileError`` with the log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import platform
import re
import shlex
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from tcdsl.core import knobs
from tcdsl.core.errors import TcCompileError
from tcdsl.core.version import __version__
from tcdsl.polyhedral import cputarget, guard
from tcdsl.polyhedral.cputarget import CpuTarget

from . import diskcache, pch

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
         "-std=gnu11")
PROBE_TIMEOUT_S = 60.0  # the compiler's --version and target queries
STEM_MAX = 40  # characters of the def's name kept in file names (the key covers the whole name)
_loaded: dict[str, ctypes.CDLL] = {}  # sha256 of the bytes loaded -> library: never stale
_loads = itertools.count()  # names of the files loaded (see _dlopen_bytes)
BUILDS = 0  # compiler invocations in this process (on-disk cache misses)
_lock = threading.Lock()


@dataclass(frozen=True)
class Built:
    """A cached library's path and the verified bytes to load (``symbol``: its entry, or "")."""

    path: Path
    symbol: str
    data: bytes
    sha256: str


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
    return list(_split_cc(os.environ.get("CC", "gcc")))


@functools.cache
def _split_cc(cc: str) -> tuple[str, ...]:
    return tuple(shlex.split(cc)) or ("gcc",)


def run_tool(cmd: list[str], timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``cmd``, run in a session of its own. At ``timeout`` the whole
    process group (the driver, cc1, as, ld) is killed and ``subprocess.TimeoutExpired`` raised.
    Output goes to temporary files, not pipes, so no descendant that keeps them open can make a
    wait outlast the timeout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        try:
            code = _wait(proc, timeout)
        except BaseException:  # the timeout, or an interrupt: nothing of the compiler survives
            _kill_group(proc)
            raise
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """``proc.wait(timeout)`` that returns as the process exits: Popen polls with sleeps of up to
    50 ms, a tenth of a small kernel's compile; a process's pidfd is readable once it has exited
    (Linux 5.3 and later, else Popen's own wait)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.wait(timeout=timeout)
    try:
        if not guard.readable(fd, timeout):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group id is the driver's pid
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # SIGKILLed; the zombie is reaped by Popen's own bookkeeping later


def _probe_timeout() -> float:
    return min(PROBE_TIMEOUT_S, knobs.compile_timeout())


@functools.cache
def compiler_version(cc: tuple[str, ...]) -> str:
    try:
        _, out, _ = run_tool([*cc, "--version"], _probe_timeout())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TcCompileError(f"the C compiler {' '.join(cc)!r} cannot be run: {e}") from None
    return out.strip()


@functools.cache
def cpu_target(cc: tuple[str, ...]) -> str:
    """The CPU target ``cc -march=native`` compiles for: the architecture and every target option it
    turns on (``-Q --help=target``), so that a cache shared between machines never hands one CPU's
    build to another. Compilers without that query (clang) fall back to the kernel's CPU flags."""
    try:
        code, out, _ = run_tool([*cc, "-march=native", "-Q", "--help=target"], _probe_timeout())
    except (OSError, subprocess.TimeoutExpired):
        code, out = 1, ""
    opts = []
    for m in re.finditer(r"^\s+(-m\S+)\s+(\S.*?)\s*$", out if code == 0 else "", re.M):
        opt, value = m.groups()
        if value != "[disabled]":
            opts.append(opt if value == "[enabled]" else opt + value)
    if any(o.startswith("-march=") for o in opts):
        return " ".join(opts)
    return _kernel_cpu_flags()


def target() -> CpuTarget:
    """The CPU target kernels compile for: the machine's own (what ``cc -march=native`` turns on),
    or the narrower one ``$TCDSL_CPU`` names, with the caches ``$TCDSL_CPU_CACHES`` gives."""
    return _named_target(knobs.cpu(), tuple(compiler()), tuple(sorted(knobs.cpu_caches().items())))


@functools.cache
def _named_target(name: str, cc: tuple[str, ...], caches: tuple[tuple[str, int], ...] = ()) -> CpuTarget:
    """``name``'s target on this machine, with the cache sizes ``caches`` (``$TCDSL_CPU_CACHES``) replaced."""
    sizes = dict(caches)
    native = native_target(cc)
    mine = replace(native, l1d=sizes.get("l1d", native.l1d), l2=sizes.get("l2", native.l2),
                   l3=sizes.get("l3", native.l3))
    return cputarget.named(name, mine)


@functools.cache
def native_target(cc: tuple[str, ...]) -> CpuTarget:
    """The machine's target: the vector ISA ``cc -march=native`` compiles for, the caches from sysfs
    and the cores this process may use."""
    features = set(cpu_target(cc).split())
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cputarget.from_features(features, platform.machine(), cores, _caches())


def _caches() -> dict[str, int]:
    """Sizes of cpu0's data caches by level (``l1d``, ``l2``, ``l3``) from sysfs, where it has them."""
    out: dict[str, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or level not in ("1", "2", "3"):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m:
            scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
            out["l1d" if level == "1" else f"l{level}"] = int(m[1]) * scale
    return out


def _kernel_cpu_flags() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if re.match(r"(flags|Features)\s*:", line):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return f"{platform.machine()} cpu flags: {flags}"


def library_key(source: str, stem: str = "", entry: str = "") -> str:
    cc = tuple(compiler())
    h = hashlib.sha256()
    for part in (source, stem, entry, compiler_version(cc), " ".join(cc), " ".join(FLAGS), cpu_target(cc),
                 target().key, __version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def entry_symbol(key: str) -> str:
    """The entry function's symbol in the library of ``key``: another kernel's library lacks it."""
    return f"tc_k_{key}"


def file_stem(stem: str) -> str:
    """A short, safe file-name prefix (the key, which covers the whole name, keeps names apart)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", stem)[:STEM_MAX]


def build(source: str, stem: str, entry: str = "") -> Path:
    """The path of a verified library for ``source``, compiled unless cached. With ``entry`` (the C
    function's name in ``source``), the library exports it as ``entry_symbol(key)``."""
    return built(source, stem, entry).path


def built(source: str, stem: str, entry: str = "", rebuild: bool = False) -> Built:
    """The library for ``source`` as verified bytes: from the cache when its record matches, else
    compiled (``rebuild`` or ``TCDSL_FORCE_RECOMPILE``: always compiled)."""
    key = library_key(source, stem, entry)
    out_dir = diskcache.private_dir(knobs.cache_dir(), "c")
    lib = out_dir / f"{file_stem(stem)}-{key}.so"
    symbol = entry_symbol(key) if entry else ""
    if not rebuild and not knobs.force_recompile():
        hit = diskcache.read_verified(lib, key, symbol)
        if hit is not None:
            diskcache.touch(lib)
            return Built(lib, symbol, *hit)
    b = _compile(source, lib, key, entry, symbol)
    diskcache.evict(out_dir, knobs.cache_max(), keep=lib, added=len(b.data) + len(source) + diskcache.RECORD_MAX)
    return b


def _compile(source: str, lib: Path, key: str, entry: str, symbol: str) -> Built:
    src = lib.with_suffix(".c")
    diskcache.atomic_write(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=diskcache.temp_prefix(), suffix=".so")
    os.close(fd)
    libs = ["-lmvec", "-lm"] if "declare simd" in source else ["-lm"]
    rename = [f"-D{entry}={symbol}"] if entry else []
    cc, flags = compiler(), [*FLAGS, *target().flags]
    pre = pch.include(cc, [f for f in flags if f != "-shared"], compiler_version(tuple(cc)), platform.machine(),
                      run_tool)
    cmd = [*cc, *flags, *rename, *pre, "-o", tmp, str(src), *libs]
    global BUILDS
    BUILDS += 1
    try:
        code, _, log = _run_compiler(cmd, src)
        if code != 0 and pre:  # again without the precompiled header: the kernel's own text decides
            cmd = [*cc, *flags, *rename, "-o", tmp, str(src), *libs]
            code, _, log = _run_compiler(cmd, src)
            if code == 0:
                pch.discard(pre)  # it was the header that failed: the next kernel builds it again
        if code != 0:
            raise TcCompileError(f"C compilation failed (source kept at {src}):\n$ {shlex.join(cmd)}\n{log.strip()}")
        os.chmod(tmp, 0o600)  # the linker's mode follows the umask: no one else may rewrite it
        with open(tmp, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        os.replace(tmp, lib)
        diskcache.write_record(lib, diskcache.Record(key, symbol, len(data), digest))
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return Built(lib, symbol, data, digest)


def _run_compiler(cmd: list[str], src: Path) -> tuple[int, str, str]:
    limit = knobs.compile_timeout()
    try:
        return run_tool(cmd, limit)
    except subprocess.TimeoutExpired:
        raise TcCompileError(f"the C compiler did not finish within {limit:g} s (TCDSL_COMPILE_TIMEOUT) and was "
                             f"killed with its whole process group; source kept at {src}") from None
    except OSError as e:
        raise TcCompileError(f"the C compiler failed to run: {e}; source kept at {src}") from None


def kernel_library(source: str, stem: str, entry: str) -> tuple[ctypes.CDLL, str, Path]:
    """(library, entry symbol, cache path) for the C function ``entry`` of ``source``. A cached
    library that fails to load or lacks its symbol is rebuilt once; a fresh build that fails too
    raises ``TcCompileError``."""
    b = built(source, stem, entry)
    try:
        return load(b), b.symbol, b.path
    except _Unusable:
        b = built(source, stem, entry, rebuild=True)
        try:
            return load(b), b.symbol, b.path
        except _Unusable as e:
            raise TcCompileError(f"the library tcdsl just built cannot be used: {e}") from None


class _Unusable(Exception):
    pass


def load(b: Built) -> ctypes.CDLL:
    """The library of ``b``'s verified bytes, loaded once per process per content; checks that it
    exports ``b.symbol``."""
    with _lock:
        lib = _loaded.get(b.sha256)
        if lib is None:
            lib = _dlopen_bytes(b.data, b.path.parent)
            _loaded[b.sha256] = lib
    if b.symbol and not hasattr(lib, b.symbol):
        raise _Unusable(f"{b.path} does not export its entry {b.symbol}")
    return lib


def _dlopen_bytes(data: bytes, directory: Path) -> ctypes.CDLL:
    """Load exactly ``data``, the bytes whose hash was checked. Loading by the cache path would let a
    file swapped in after the check run instead; so the bytes are copied to a fresh file in the
    private cache directory (no other user can replace it between the write and the load), removed
    once loaded. Its name is new to this process: the dynamic loader matches libraries by name, and a
    reused one would hand back the library loaded before under it (which rules out loading a
    ``memfd`` through ``/proc/self/fd/N`` and closing it: N comes back)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{diskcache.temp_prefix()}load{next(_loads)}-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(tmp)  # the mapping outlives the file
    except OSError as e:
        raise _Unusable(str(e)) from None
    finally:
        os.unlink(tmp)
