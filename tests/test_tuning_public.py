"""The caches in the open: ``tc.tuning`` (list, filter, forget, export, import, clear), the
``tcdsl cache`` command, and the kernel cache's size limit (``TCDSL_CACHE_MAX``, least recently
used first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.codegen import diskcache
from tcdsl.core import knobs
from tcdsl.core.errors import TcArgumentError
from tcdsl.tuner import tune as T
from tcdsl.tuner.cache import TuningCache

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
SCALE = "def scale(float(N) X) -> (Y) { Y(i) = X(i) * 3 }"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TuningCache:
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))
    return TuningCache()


def _stored(db: TuningCache) -> tuple[tc.Kernel, tc.Kernel, list[np.ndarray], list[np.ndarray]]:
    mm, scale = tc.define(MM), tc.define(SCALE)
    ab = [np.ones((8, 4), np.float32), np.ones((4, 6), np.float32)]
    x = [np.ones(10, np.float32)]
    db.record(T.key_for(mm, ab), tc.MappingOptions(tile=(4, 4, 4)).to_json(), 2e-3, 11)
    db.record(T.key_for(scale, x), tc.MappingOptions().to_json(), 1e-5, 3)
    return mm, scale, ab, x


def test_entries_filter_forget_and_clear(db: TuningCache) -> None:
    mm, scale, ab, x = _stored(db)
    every = tc.tuning.entries()
    assert [e.name for e in every] == ["mm", "scale"] and all(e.here for e in every)
    (e,) = tc.tuning.entries(mm)
    assert (e.backend, e.shapes, e.options, e.time_s, e.evaluations) == ("c", ((8, 4), (4, 6)),
                                                                           tc.MappingOptions(tile=(4, 4, 4)), 2e-3, 11)
    assert "mm (c) 8x4 4x6: 2 ms, 11 candidates" in str(e) and "tile: None -> (4, 4, 4)" in str(e)
    assert [x.name for x in tc.tuning.entries("scale")] == ["scale"] and tc.tuning.entries(backend="opencl") == []
    renamed = tc.define(MM.replace("A", "P").replace("B", "Q"))
    assert len(tc.tuning.entries(renamed)) == 1  # the same def with other tensor names
    with pytest.raises(TcArgumentError, match="clear"):
        tc.tuning.forget()
    assert tc.tuning.forget(mm) == 1 and [x.name for x in tc.tuning.entries()] == ["scale"]
    assert mm.options_for(*ab) == tc.MappingOptions()  # a fresh lookup finds nothing now
    assert tc.tuning.clear() == 1 and tc.tuning.entries() == []


def test_export_then_import_on_a_machine_of_another_kind(db: TuningCache, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An export round-trips; entries made for another machine load, list as such, and are not used."""
    mm, _, ab, _ = _stored(db)
    out = tmp_path / "tuned.json"
    assert tc.tuning.export(out, "mm") == 1
    doc = json.loads(out.read_text())
    assert doc["format"] == "tcdsl-tuning" and len(doc["entries"]) == 1
    other = json.loads(json.dumps(doc))
    other["entries"][0]["key"]["device"] = "another CPU"
    (tmp_path / "other.json").write_text(json.dumps(other))
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "second.sqlite"))
    assert tc.tuning.import_(out) == 1 and tc.tuning.import_(tmp_path / "other.json") == 1
    assert tc.tuning.import_(out) == 0  # not faster than what is there
    here = {e.key.device: e.here for e in tc.tuning.entries()}
    assert here == {T.device_for("c")[0]: True, "another CPU": False}
    assert tc.define(MM).options_for(*ab) == tc.MappingOptions(tile=(4, 4, 4))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tcdsl-tuning", "version": 1, "entries": [{"key": {}}]}))
    with pytest.raises(TcArgumentError, match="entry 0"):
        tc.tuning.import_(bad)
    with pytest.raises(TcArgumentError, match="not a tuning export"):
        tc.tuning.import_(tmp_path / "missing.json")


def test_cli_cache_commands(db: TuningCache, tmp_path: Path) -> None:
    _stored(db)
    env = {**os.environ, "TCDSL_CACHE_DIR": str(tmp_path / "kernels")}

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "tcdsl", "cache", *args], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    listed = cli("list")
    assert "mm (c) 8x4 4x6: 2 ms" in listed and "2 entries" in listed
    assert "1 entries" in cli("list", "--entry", "scale")
    assert "exported 2 entries" in cli("export", str(tmp_path / "all.json"))
    assert "forgot 1 entries" in cli("forget", "--entry", "mm")
    assert "1 entries of" in cli("import", str(tmp_path / "all.json"))
    assert "(tuning cache)" in cli("du")
    assert "forgot 2 entries" in cli("clear")
    r = subprocess.run([sys.executable, "-m", "tcdsl", "cache", "export"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and "name the file" in r.stderr


@pytest.mark.cpu
def test_the_kernel_cache_keeps_the_most_recently_used_within_its_limit(fresh_cache: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.arange(16, dtype=np.float32)
    first = tc.define("def a(float(N) X) -> (Y) { Y(i) = X(i) + 1 }")
    first(x)
    d = fresh_cache / "c"
    one = sum(f.stat().st_size for f in d.iterdir())
    monkeypatch.setenv("TCDSL_CACHE_MAX", str(int(2.5 * one)))  # room for two kernels of this size
    second = tc.define("def b(float(N) X) -> (Y) { Y(i) = X(i) + 2 }")
    second(x)
    time.sleep(0.05)
    np.testing.assert_array_equal(tc.define("def a(float(N) X) -> (Y) { Y(i) = X(i) + 1 }")(x), x + 1)  # a hit: a used
    third = tc.define("def c(float(N) X) -> (Y) { Y(i) = X(i) + 3 }")
    np.testing.assert_array_equal(third(x), x + 3)
    stems = {f.name.split("-", 1)[0] for f in d.iterdir() if not f.name.startswith(".")}
    assert stems == {"tc_a", "tc_c"}  # b, the least recently used, went
    assert sum(f.stat().st_size for f in d.iterdir()) <= knobs.cache_max()
    np.testing.assert_array_equal(tc.define("def b(float(N) X) -> (Y) { Y(i) = X(i) + 2 }")(x), x + 2)  # rebuilt


def test_a_cache_directory_is_listed_again_only_when_it_may_have_passed_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build adds its bytes to the total the process last listed; the directory is listed again
    (and its least recently used entries removed) when that total passes the limit, or RESCAN_S
    after the last listing (other processes build into it too)."""
    d = tmp_path / "c"
    d.mkdir()

    def entry(name: str, age: float) -> Path:
        lib = d / f"{name}.so"
        lib.write_bytes(b"x" * 1000)
        diskcache.record_path(lib).write_bytes(b"r" * 24)
        t = time.time() - age
        os.utime(lib, (t, t))
        os.utime(diskcache.record_path(lib), (t, t))
        return lib

    for k in range(3):
        entry(f"k{k}", 100 - k)
    listed: list[object] = []
    real = os.scandir
    monkeypatch.setattr(diskcache.os, "scandir", lambda p: listed.append(p) or real(p))
    clock = [1000.0]
    monkeypatch.setattr(diskcache.time, "monotonic", lambda: clock[0])
    assert diskcache.evict(d, 5000, d / "k2.so") == [] and len(listed) == 1  # 3072 bytes
    keep = entry("k3", 0)
    assert diskcache.evict(d, 5000, keep, added=1024) == [] and len(listed) == 1  # 4096: not listed
    entry("k4", 0)  # another process's build: counted at the next listing
    clock[0] += diskcache.RESCAN_S
    assert diskcache.evict(d, 5000, keep, added=0) == ["k0"] and len(listed) == 2  # 5120 bytes: the oldest goes
    keep = entry("k5", 0)
    assert diskcache.evict(d, 5000, keep, added=1024) == ["k1"] and len(listed) == 3  # over the limit: listed
    assert sorted(f.name.split(".")[0] for f in d.iterdir()) == ["k2", "k2", "k3", "k3", "k4", "k4", "k5", "k5"]
