"""Disk cache: ``configured path -> private directory`` and ``(file, Record) -> verified bytes``.

A cache directory is used only when this user owns it and no one else can write to it (tcdsl creates
its directories 0700 whatever the umask); otherwise the process falls back to a private temporary
directory, with one ``TcCacheWarning`` per refused directory. An entry is trusted only through the
``Record`` written beside it when tcdsl built it (key, entry symbol, size, sha256); anything else
reads as a miss. Temporaries left by killed builds are removed when a directory is first opened.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from tcdsl.core import knobs
from tcdsl.core.errors import TcCompileError, TcWarning

STALE_S = 1800.0  # a temporary this old belongs to no live build (unless compiles may take longer, see _stale)
RECORD_SUFFIX = ".sha256"
RECORD_MAX = 4096  # bytes of a record file read at most
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # temporaries name their host...
_TEMP = re.compile(r"^\.tcdsl-([0-9a-f]{8})-(\d+)-")  # ...and pid: a dead builder's are removed at once
_lock = threading.Lock()
_opened: set[str] = set()  # directories probed and cleaned by this process
_warned: set[str] = set()  # refused directories already reported
_fallback: Path | None = None


class TcCacheWarning(TcWarning):
    """The kernel cache directory cannot be used safely; this process compiles into a private
    temporary directory instead (correct results, no reuse across processes)."""


class UnsafeDir(Exception):
    """Why a cache directory is refused (the message completes "cannot use the kernel cache DIR: ")."""


def private_dir(root: Path, sub: str) -> Path:
    """``root/sub``, created 0700 and checked (ours, writable by no one else, writable by us); on any
    failure the same ``sub`` of this process's private temporary directory, with one warning."""
    try:
        d = _make_private(root, sub)
    except UnsafeDir as e:
        d = _fallback_dir(root, str(e)) / sub
        try:
            mkdir_private(d)
        except OSError as e2:
            raise TcCompileError(f"cannot use the private kernel cache {d}: {e2}") from None
    _open_once(d)
    return d


def _uid() -> int:
    return os.geteuid()  # the owner of the files this process creates


def _make_private(root: Path, sub: str) -> Path:
    d = root / sub
    for p in (root, d):
        _mkdir_private(p)
        _check_private(p)
    with _lock:
        if str(d) in _opened:
            return d
    _probe_write(d)
    return d


def mkdir_private(path: Path) -> None:
    """Create ``path`` and the parents it lacks, each 0700 whatever the umask (``OSError`` when one
    cannot be made). For every directory tcdsl keeps state in (kernels, tuning database)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue  # another process made it: its mode is checked like any existing directory's
        os.chmod(p, 0o700)  # a umask such as 0o277 strips bits from mkdir's mode, never adds any


def _mkdir_private(path: Path) -> None:
    try:
        mkdir_private(path)
    except OSError as e:
        raise UnsafeDir(f"{e.filename or path} cannot be created ({e.strerror or e})") from None


def _check_private(p: Path) -> None:
    try:
        st = os.stat(p)  # a symlink counts as what it points to: its target must pass the same checks
    except OSError as e:
        raise UnsafeDir(f"{p} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{p} is not a directory")
    if st.st_uid != _uid():
        raise UnsafeDir(f"{p} is owned by uid {st.st_uid}, not by this user (uid {_uid()}); "
                        "another user could plant code in it")
    if st.st_mode & 0o022:
        who = "world" if st.st_mode & 0o002 else "group"
        raise UnsafeDir(f"{p} is {who}-writable (mode {stat.S_IMODE(st.st_mode):04o}); others could plant "
                        f"code in it (chmod 700 {p} to use it)")


def _probe_write(d: Path) -> None:
    """A real write: permission bits say nothing on a read-only mount, nor for root."""
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=temp_prefix())
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UnsafeDir(f"{d} is not writable ({e.strerror or e})") from None


def _fallback_dir(root: Path, reason: str) -> Path:
    global _fallback
    with _lock:
        if _fallback is None:
            try:
                _fallback = Path(tempfile.mkdtemp(prefix="tcdsl-cache-"))  # 0700, a fresh name
            except OSError as e:
                raise TcCompileError(f"cannot use the kernel cache {root}: {reason}; and no private "
                                     f"temporary directory can be made: {e}") from None
            atexit.register(shutil.rmtree, _fallback, True)
        fallback = _fallback
        first = str(root) not in _warned
        _warned.add(str(root))
    if first:
        warnings.warn(TcCacheWarning(f"cannot use the kernel cache {root}: {reason}. Kernels compiled by this "
                                     f"process go to the private temporary directory {fallback} and are not "
                                     "reused by other processes"), stacklevel=4)
    return fallback


def _open_once(d: Path) -> None:
    with _lock:
        if str(d) in _opened:
            return
        _opened.add(str(d))
    remove_stale(d)


def temp_prefix() -> str:
    """The name prefix of this process's temporaries (host and pid, so that a killed build's are found)."""
    return f".tcdsl-{_HOST}-{os.getpid()}-"


def remove_stale(d: Path, now: float | None = None) -> list[str]:
    """Remove the temporaries in ``d`` whose builder is dead (same host, pid gone) or that are older
    than ``STALE_S``; every hidden file there is a temporary. Returns the names removed."""
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = list(os.scandir(d))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith("."):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) or not _stale(e.name, st.st_mtime, now):
                continue
            os.unlink(e.path)
            removed.append(e.name)
        except OSError:
            continue  # gone already, or another process's cleanup won
    return removed


def _stale(name: str, mtime: float, now: float) -> bool:
    if now - mtime > max(STALE_S, 2 * knobs.compile_timeout()):
        return True
    m = _TEMP.match(name)
    return m is not None and m.group(1) == _HOST and not _alive(int(m.group(2)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists
    return True


@dataclass(frozen=True)
class Record:
    """What tcdsl recorded about a library it built: the key it was built for, its entry symbol, and
    its size and sha256."""

    key: str
    symbol: str
    size: int
    sha256: str

    def text(self) -> str:
        return f"tcdsl-library 1\nkey {self.key}\nsymbol {self.symbol}\nsize {self.size}\nsha256 {self.sha256}\n"

    @staticmethod
    def parse(text: str) -> Record | None:
        lines = text.split("\n")
        if len(lines) != 6 or lines[0] != "tcdsl-library 1" or lines[5]:
            return None
        fields = dict(line.partition(" ")[::2] for line in lines[1:5])
        try:
            return Record(fields["key"], fields["symbol"], int(fields["size"]), fields["sha256"])
        except (KeyError, ValueError):
            return None


def record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def read_verified(path: Path, key: str, symbol: str) -> tuple[bytes, str] | None:
    """The bytes of ``path`` and their sha256 when its record names ``key`` and ``symbol`` and the
    bytes match it; None for anything else (absent, planted, truncated, swapped, foreign)."""
    raw = _read_own(record_path(path), RECORD_MAX)
    rec = Record.parse(raw.decode(errors="replace")) if raw is not None else None
    if rec is None or rec.key != key or rec.symbol != symbol:
        return None
    data = _read_own(path, rec.size)
    if data is None or len(data) != rec.size:
        return None
    digest = hashlib.sha256(data).hexdigest()
    return (data, digest) if hmac.compare_digest(digest, rec.sha256) else None


def touch(path: Path) -> None:
    """Mark ``path``'s entry used now (its record's time: what ``evict`` orders by)."""
    try:
        os.utime(record_path(path))
    except OSError:
        pass  # another process evicted it meanwhile: this one holds the verified bytes already


RESCAN_S = 60.0  # a process lists a cache directory again at most this often (others add to it too)
_ledger: dict[str, tuple[float, int]] = {}  # directory -> (when this process listed it, bytes then + its own since)
_ledger_lock = threading.Lock()


def evict(d: Path, limit: int, keep: Path, added: int = 0) -> list[str]:
    """Remove the least recently used entries of ``d`` (each an entry file with its record and
    whatever shares its name up to the first dot: a kernel's library and C source) until the rest
    hold at most ``limit`` bytes; never ``keep``'s entry (the one just built, ``added`` bytes).
    ``limit`` 0: no limit. Returns the names of the entries removed. Loaded libraries are copies
    (codegen.toolchain), so a process using a kernel another process evicts keeps running it.

    Listing a directory of thousands of entries takes a good part of a second, so a process lists
    it at most every RESCAN_S seconds: in between it adds what it builds to the total it last saw
    and lists again only when that passes ``limit``. Other processes' builds count from the next
    listing: the directory may run over by what they build within RESCAN_S."""
    if limit <= 0:
        return []
    now = time.monotonic()
    with _ledger_lock:
        seen = _ledger.get(str(d))
        if seen is not None and now - seen[0] < RESCAN_S and seen[1] + added <= limit:
            _ledger[str(d)] = (seen[0], seen[1] + added)
            return []
    groups: dict[str, list[os.DirEntry[str]]] = {}
    try:
        with os.scandir(d) as entries:
            for f in entries:
                if not f.name.startswith(".") and f.is_file(follow_symlinks=False):
                    groups.setdefault(f.name.split(".", 1)[0], []).append(f)
    except OSError:
        return []
    sized: list[tuple[float, str, int]] = []
    for name, files in groups.items():
        try:
            stats = [f.stat(follow_symlinks=False) for f in files]
        except OSError:
            continue  # removed meanwhile
        used = max((st.st_mtime for f, st in zip(files, stats) if f.name.endswith(RECORD_SUFFIX)),
                   default=min(st.st_mtime for st in stats))
        sized.append((used, name, sum(st.st_size for st in stats)))
    total = sum(size for _, _, size in sized)
    gone = []
    for _, name, size in sorted(sized):
        if total <= limit:
            break
        if name == keep.name.split(".", 1)[0]:
            continue
        for f in groups[name]:
            try:
                os.unlink(f.path)
            except FileNotFoundError:
                pass
        total -= size
        gone.append(name)
    with _ledger_lock:
        _ledger[str(d)] = (now, total)
    return gone


def _read_own(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` + 1 bytes of a regular file of ours that no one else can write; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None  # absent, a symlink, unreadable: a miss (rebuilding reports real trouble)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_mode & 0o022 or st.st_size > limit:
            return None
        return f.read(limit + 1)


def write_record(path: Path, rec: Record) -> None:
    """Record ``rec`` beside ``path`` (after the library is in place)."""
    atomic_write(record_path(path), rec.text().encode())


def atomic_write(path: Path, data: bytes) -> None:
    """Write through a temporary of this process and ``os.replace``: readers see all or nothing."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
