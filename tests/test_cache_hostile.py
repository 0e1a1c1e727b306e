"""The kernel cache under attack and damage: planted, truncated, empty, garbage, swapped and
other-size libraries are rebuilt and never loaded; shared, foreign, read-only and uncreatable
directories are refused with one warning; directories are private whatever the umask; stale
temporaries go; names stay bounded; the CPU target is in the key; a hung compiler is killed with
its process group. Every test compiles (``cpu``) into a cache directory of its own.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl import TcCompileError
from tcdsl.codegen import diskcache, pch, toolchain
from tcdsl.codegen.diskcache import TcCacheWarning
from tcdsl.compiler import library_text

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
SCALED = "def scaled(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) * 3 }"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(fresh_cache: Path) -> Path:
    return fresh_cache


def inputs(m: int = 6, k: int = 5, n: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))


def check_matmul(got: np.ndarray, A: np.ndarray, B: np.ndarray, scale: float = 1.0) -> None:
    want = scale * (A.astype(np.float64) @ B.astype(np.float64))
    atol = 4 * np.finfo(np.float32).eps * A.shape[1] * np.abs(A).max() * np.abs(B).max() * scale
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def entry(k: tc.Kernel, *args: np.ndarray) -> tuple[Path, str]:
    """The cache path and entry symbol tcdsl uses for ``k`` on ``args`` (computed, nothing built)."""
    low = k.lowered(*args)
    stem = f"tc_{low.scop.inst.checked.name}"
    key = toolchain.library_key(library_text(low), stem, low.source.name)
    name = f"{toolchain.file_stem(stem)}-{key}.so"
    return diskcache.private_dir(Path(os.environ["TCDSL_CACHE_DIR"]), "c") / name, toolchain.entry_symbol(key)


def compile_c(text: str, out: Path) -> bytes:
    src = out.with_suffix(".c")
    src.write_text(text)
    subprocess.run([*toolchain.compiler(), "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


def planted_library(tmp_path: Path, symbol: str, marker: Path) -> bytes:
    """A library that exports the expected symbol (returning success without computing) and whose
    constructor leaves ``marker``: running it at all is the failure."""
    return compile_c(textwrap.dedent(f"""\
        #include <stdio.h>
        __attribute__((constructor)) static void planted(void) {{
            FILE *f = fopen("{marker}", "w");
            if (f) {{ fputs("planted code ran", f); fclose(f); }}
        }}
        int {symbol}(void *a, void *b, void *c, void *err) {{ return 0; }}
        int tc_kernel(void *a, void *b, void *c, void *err) {{ return 0; }}
        """), tmp_path / "planted.so")


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sha256 of every library this test loads."""
    seen: list[str] = []
    real = toolchain._dlopen_bytes

    def spy(data: bytes, directory: Path):  # type: ignore[no-untyped-def]
        seen.append(hashlib.sha256(data).hexdigest())
        return real(data, directory)

    monkeypatch.setattr(toolchain, "_dlopen_bytes", spy)
    return seen


def verified(path: Path, symbol: str) -> bool:
    key = symbol.removeprefix("tc_k_")
    return diskcache.read_verified(path, key, symbol) is not None


# ---- planted libraries -------------------------------------------------------------------------------


@pytest.mark.cpu
@pytest.mark.parametrize("record", ["none", "genuine", "forged"])
def test_a_planted_library_never_runs(cache: Path, tmp_path: Path, record: str, loads: list[str]):
    """A library at the predictable name of a kernel not yet built: with no record, with the record
    of the genuine build, or with a forged record that matches it (in a directory others can write,
    the only place a forger could put one)."""
    A, B = inputs()
    k = tc.define(MATMUL)
    path, symbol = entry(k, A, B)
    marker = tmp_path / "marker"
    planted = planted_library(tmp_path, symbol, marker)
    if record == "genuine":  # the record of a real build elsewhere, next to the planted bytes
        elsewhere = tmp_path / "elsewhere"
        os.environ["TCDSL_CACHE_DIR"] = str(elsewhere)
        tc.define(MATMUL)(A, B, backend="c")
        os.environ["TCDSL_CACHE_DIR"] = str(cache)
        shutil.copy(diskcache.record_path(elsewhere / "c" / path.name), diskcache.record_path(path))
    path.write_bytes(planted)
    if record == "forged":
        digest = hashlib.sha256(planted).hexdigest()
        key = symbol.removeprefix("tc_k_")
        diskcache.write_record(path, diskcache.Record(key, symbol, len(planted), digest))
        os.chmod(cache, 0o777)
        with pytest.warns(TcCacheWarning, match="world-writable"):
            got = tc.define(MATMUL)(A, B, backend="c")
    else:
        got = tc.define(MATMUL)(A, B, backend="c")
    check_matmul(got, A, B)
    assert not marker.exists(), "the planted library's constructor ran"
    assert hashlib.sha256(planted).hexdigest() not in loads
    if record != "forged":
        assert path.read_bytes() != planted and verified(path, symbol)  # replaced by tcdsl's own build


# ---- damaged entries -------------------------------------------------------------------------------


def _damage(kind: str, path: Path, tmp_path: Path) -> None:
    """Damage the cache entry at ``path`` (the library and, for the swaps, its record too)."""
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zero":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(np.random.default_rng(1).bytes(len(data)))
    else:  # another kernel's entry (library and record) in its place
        A, B = inputs(7, 3, 2) if kind == "other_sizes" else inputs()
        other = tc.define(MATMUL if kind == "other_sizes" else SCALED)
        other(A, B, backend="c")
        src = other.compiled(A, B).path
        assert src != path
        shutil.copy(src, path)
        shutil.copy(diskcache.record_path(src), diskcache.record_path(path))


@pytest.mark.cpu
@pytest.mark.parametrize("kind", ["truncated", "zero", "garbage", "swapped", "other_sizes"])
def test_a_damaged_entry_is_rebuilt_never_loaded(cache: Path, tmp_path: Path, kind: str, loads: list[str]):
    A, B = inputs()
    k1 = tc.define(MATMUL)
    check_matmul(k1(A, B, backend="c"), A, B)
    path, symbol = entry(k1, A, B)
    assert k1.compiled(A, B).path == path
    _damage(kind, path, tmp_path)
    damaged = hashlib.sha256(path.read_bytes()).hexdigest()
    genuine = list(loads)
    before = toolchain.BUILDS
    check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)  # a new kernel object: the disk entry is read
    assert toolchain.BUILDS == before + 1
    assert verified(path, symbol)
    if kind not in ("swapped", "other_sizes"):
        assert damaged not in loads[len(genuine):]
    # later kernels, here and in a fresh process, take the rebuilt entry without compiling
    check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
    assert toolchain.BUILDS == before + 1
    script = ("import numpy as np, tcdsl as tc\nfrom tcdsl.codegen import toolchain\n"
              f"rng = np.random.default_rng(0)\nA = rng.standard_normal((6, 5)).astype(np.float32)\n"
              "B = rng.standard_normal((5, 4)).astype(np.float32)\n"
              f"C = tc.define({MATMUL!r})(A, B, backend='c')\n"
              "assert toolchain.BUILDS == 0, toolchain.BUILDS\n"
              "print(float(np.abs(C - A.astype(np.float64) @ B).max()))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1e-4


@pytest.mark.cpu
def test_each_library_has_its_own_entry_symbol(cache: Path):
    A, B = inputs()
    k, s = tc.define(MATMUL), tc.define(SCALED)
    check_matmul(k(A, B, backend="c"), A, B)
    check_matmul(s(A, B, backend="c"), A, B, scale=3.0)
    (pk, sym_k), (ps, sym_s) = entry(k, A, B), entry(s, A, B)
    assert pk != ps and sym_k != sym_s
    assert k.compiled(A, B).fn.__name__ == sym_k
    lib_k = toolchain.load(toolchain.built(library_text(k.lowered(A, B)), "tc_matmul", "tc_kernel"))
    assert hasattr(lib_k, sym_k) and not hasattr(lib_k, sym_s) and not hasattr(lib_k, "tc_kernel")


@pytest.mark.cpu
def test_a_library_without_its_entry_symbol_is_rebuilt(cache: Path, tmp_path: Path):
    """Even with a record that matches its bytes, a library lacking its symbol is not called."""
    A, B = inputs()
    k = tc.define(MATMUL)
    path, symbol = entry(k, A, B)
    lone = compile_c("int tc_kernel(void *a, void *b, void *c, void *e) { return 0; }\n", tmp_path / "lone.so")
    path.write_bytes(lone)
    key = symbol.removeprefix("tc_k_")
    diskcache.write_record(path, diskcache.Record(key, symbol, len(lone), hashlib.sha256(lone).hexdigest()))
    before = toolchain.BUILDS
    check_matmul(k(A, B, backend="c"), A, B)
    assert toolchain.BUILDS == before + 1
    assert path.read_bytes() != lone and verified(path, symbol)


@pytest.mark.cpu
def test_the_in_process_cache_keys_on_content_not_path(cache: Path):
    """Two libraries loaded under one path: each call gets its own (the loader matches by name, so a
    reused name must never hand back the earlier library)."""
    A, B = inputs()
    bk = toolchain.built(library_text(tc.define(MATMUL).lowered(A, B)), "tc_matmul", "tc_kernel")
    bs = toolchain.built(library_text(tc.define(SCALED).lowered(A, B)), "tc_scaled", "tc_kernel")
    same_path = toolchain.Built(bk.path, bs.symbol, bs.data, bs.sha256)
    assert hasattr(toolchain.load(bk), bk.symbol)
    assert hasattr(toolchain.load(same_path), bs.symbol)


# ---- directories -----------------------------------------------------------------------------------


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.cpu
def test_directories_and_files_are_private_under_umask_000(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    top = tmp_path / "made" / "by" / "tcdsl"
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(top / "cache"))
    A, B = inputs()
    old = os.umask(0)
    try:
        check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
        pch.wait()  # the precompiled header's build, in the background under the same umask
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "made")
    dirs = {p: m for p, m in modes.items() if (tmp_path / p).is_dir()}
    made = {"made", "made/by", "made/by/tcdsl", "made/by/tcdsl/cache", "made/by/tcdsl/cache/c"}
    assert set(dirs) - {"made/by/tcdsl/cache/pch"} == made
    assert all(m == 0o700 for m in dirs.values()), {p: oct(m) for p, m in dirs.items()}
    files = {p: m for p, m in modes.items() if p not in dirs}
    assert {p.rsplit(".", 1)[-1] for p in files} - {"h", "gch"} == {"c", "so", "sha256"}
    assert all(m & 0o077 == 0 for m in files.values()), {p: oct(m) for p, m in files.items()}


@pytest.mark.cpu
def test_the_tuning_database_leaves_the_cache_private_under_a_loose_umask(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    from tcdsl.tuner.cache import TuningCache

    top = tmp_path / "loose" / "cache"
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(top))
    monkeypatch.delenv("TCDSL_TUNING_DB", raising=False)
    A, B = inputs()
    old = os.umask(0o002)
    try:
        TuningCache()  # made first, as by a tuning run: the kernel cache must still accept the dir
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
    finally:
        os.umask(old)
    assert stat.S_IMODE(top.stat().st_mode) == 0o700 and any((top / "c").glob("*.so"))


def _foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        os.chown(path, 54321, 54321)  # really another user's
    else:  # only root can give a file away: this user is then "someone else" to the owner check
        real = os.getuid()
        monkeypatch.setattr(diskcache, "_uid", lambda: real + 1)


@pytest.mark.cpu
@pytest.mark.parametrize("case", ["group-writable", "world-writable", "foreign root", "foreign subdir"])
def test_a_shared_directory_is_refused_with_one_warning(cache: Path, tmp_path: Path, case: str,
                                                        monkeypatch: pytest.MonkeyPatch):
    (cache / "c").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    if case == "group-writable":
        cache.chmod(0o770)
    elif case == "world-writable":
        (cache / "c").chmod(0o777)
    else:
        _foreign(cache if case == "foreign root" else cache / "c", monkeypatch)
    A, B = inputs()
    reason = {"group-writable": "group-writable", "world-writable": "world-writable"}.get(case, "owned by uid")
    with pytest.warns(TcCacheWarning, match=reason) as caught:
        check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
        check_matmul(tc.define(SCALED)(A, B, backend="c"), A, B, scale=3.0)
    assert len([w for w in caught if issubclass(w.category, TcCacheWarning)]) == 1
    assert str(cache) in str(caught[0].message)
    assert not list(cache.rglob("*.so")), "a refused directory was written to"


@pytest.mark.cpu
@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_an_unusable_directory_falls_back_with_one_warning(tmp_path: Path, case: str,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TCDSL_FORCE_RECOMPILE", raising=False)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    if case == "a file":
        d = blocker
    elif case == "under a file":
        d = blocker / "cache"
    else:
        d = tmp_path / "ro"
        (d / "c").mkdir(parents=True)
        for p in (d / "c", d):
            p.chmod(0o500)
        if os.geteuid() == 0:  # root writes through permission bits: make the writes fail as they
            real = tempfile.mkstemp  # would for anyone else (EACCES) inside this directory only

            def mkstemp(*args, dir=None, **kw):  # type: ignore[no-untyped-def]
                if dir is not None and Path(dir).is_relative_to(d):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
                return real(*args, dir=dir, **kw)

            monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(d))
    A, B = inputs()
    try:
        with pytest.warns(TcCacheWarning, match="cannot use the kernel cache") as caught:
            check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
            check_matmul(tc.define(SCALED)(A, B, backend="c"), A, B, scale=3.0)
    finally:
        if case == "read-only":
            for p in (d, d / "c"):
                p.chmod(0o700)
    assert len([w for w in caught if issubclass(w.category, TcCacheWarning)]) == 1
    assert {"a file": "not a directory", "under a file": "cannot be created",
            "read-only": "not writable"}[case] in str(caught[0].message)


# ---- temporaries, names, key -------------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.cpu
def test_stale_temporaries_are_removed_when_the_directory_is_opened(cache: Path):
    c = cache / "c"
    c.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    host = diskcache._HOST
    other = "0" * 8 if host != "0" * 8 else "1" * 8
    dead = _dead_pid()
    names = {"dead builder": f".tcdsl-{host}-{dead}-abc.so", "old legacy": ".tc_matmul-x1y2z3.so",
             "live builder": f"{diskcache.temp_prefix()}def.so", "other host": f".tcdsl-{other}-{dead}-ghi.so",
             "old record temp": f".tcdsl-{other}-{dead}-jkl"}
    for label, name in names.items():
        (c / name).write_bytes(b"partial")
        if label.startswith("old"):
            t = time.time() - 2 * diskcache.STALE_S
            os.utime(c / name, (t, t))
    A, B = inputs()
    check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
    left = {p.name for p in c.iterdir() if p.name.startswith(".")}
    assert left == {names["live builder"], names["other host"]}


HANGING_CC = """#!/bin/sh
# a C compiler that answers the queries through the real one and hangs on compiles
case "$*" in
  *--version*|*--help=target*) exec {cc} "$@" ;;
esac
{body}
"""


def _hanging_cc(tmp_path: Path, body: str) -> Path:
    cc = tmp_path / "hang-cc"
    cc.write_text(HANGING_CC.format(cc=" ".join(toolchain.compiler()), body=body))
    cc.chmod(0o700)
    return cc


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie no one has reaped yet
    except FileNotFoundError:
        return True


def _wait_for(cond, limit: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.cpu
def test_a_build_killed_with_sigkill_leaves_a_temporary_that_the_next_process_removes(cache: Path,
                                                                                        tmp_path: Path):
    pidfile = tmp_path / "cc.pid"
    cc = _hanging_cc(tmp_path, f'echo $$ > {pidfile}\nexec sleep 120')
    script = f"import tcdsl as tc, numpy as np\ntc.define({MATMUL!r})(np.ones((2, 2), 'f4'), np.ones((2, 2), 'f4'))\n"
    env = {**os.environ, "CC": str(cc)}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO)
    try:
        assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
        temps = [p.name for p in (cache / "c").iterdir() if p.name.startswith(".") and p.name.endswith(".so")]
        assert temps and all(f"-{child.pid}-" in t for t in temps)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if pidfile.exists():
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the compiler runs in a group of its own
            except (ProcessLookupError, ValueError):
                pass
    assert all((cache / "c" / t).exists() for t in temps)
    A, B = inputs()
    check_matmul(tc.define(MATMUL)(A, B, backend="c"), A, B)
    assert not [t for t in temps if (cache / "c" / t).exists()]


@pytest.mark.cpu
def test_a_hung_compiler_is_killed_with_its_process_group(cache: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    pidfile = tmp_path / "grandchild.pid"
    cc = _hanging_cc(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait")
    monkeypatch.setenv("CC", str(cc))
    toolchain.compiler_version((str(cc),))  # its queries answer before the short limit is set
    toolchain.cpu_target((str(cc),))
    monkeypatch.setenv("TCDSL_COMPILE_TIMEOUT", "5")
    A, B = inputs()
    t0 = time.monotonic()
    with pytest.raises(TcCompileError, match="did not finish within 5 s"):
        tc.define(MATMUL)(A, B, backend="c")
    assert time.monotonic() - t0 < 30
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10)
    grandchild = int(pidfile.read_text())
    assert _wait_for(lambda: _gone(grandchild), 10), "the compiler's child outlived the timeout"
    assert not [p for p in (cache / "c").iterdir() if p.name.startswith(".")]


@pytest.mark.cpu
def test_a_long_def_name_gives_a_bounded_file_name(cache: Path):
    name = "k" + "_long" * 60
    assert len(name) > 225
    k = tc.define(f"def {name}(float(M, K) A, float(K, N) B) -> (C) {{ C(m, n) +=! A(m, r_k) * B(r_k, n) }}")
    A, B = inputs()
    check_matmul(k(A, B, backend="c"), A, B)
    assert all(len(p.name) <= 100 for p in (cache / "c").iterdir())
    # two names alike in their first characters keep their own libraries
    k2 = tc.define(f"def {name}x(float(M, K) A, float(K, N) B) -> (C) {{ C(m, n) +=! A(m, r_k) * B(r_k, n) }}")
    check_matmul(k2(A, B, backend="c"), A, B)
    assert k.compiled(A, B).path != k2.compiled(A, B).path


@pytest.mark.cpu
def test_the_cpu_target_is_in_the_key(cache: Path, monkeypatch: pytest.MonkeyPatch):
    cc = tuple(toolchain.compiler())
    target = toolchain.cpu_target(cc)
    assert "-march=" in target or "cpu flags" in target, target
    if "-march=" in target and os.uname().machine == "x86_64":
        assert "-msse2" in target.split()  # an option -march=native turns on, as gcc lists it
    A, B = inputs()
    k = tc.define(MATMUL)
    check_matmul(k(A, B, backend="c"), A, B)
    here = k.compiled(A, B).path
    # another node sharing this cache: its CPU has other features, so its key and library differ
    monkeypatch.setattr(toolchain, "cpu_target", lambda cc: target.replace("-mavx512f", "") + " -mother-cpu")
    before = toolchain.BUILDS
    k2 = tc.define(MATMUL)
    check_matmul(k2(A, B, backend="c"), A, B)
    assert toolchain.BUILDS == before + 1
    assert k2.compiled(A, B).path != here
