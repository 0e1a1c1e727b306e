"""Tuning cache: round trips, best-only replacement, key sensitivity, concurrent writers from several
processes, checkpoints, seeding by related defs, forgetting, corrupt files and the default path."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tcdsl.tuner.cache import TuneEntry, TuneKey, TuningCache, TuningCacheError

REPO = Path(__file__).resolve().parents[1]

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def make_key(**changes: object) -> TuneKey:
    key = TuneKey(
        tc=MATMUL,
        entry="matmul",
        shapes=((64, 32), (32, 16)),
        dtypes=("float32", "float32"),
        strides=((32, 1), (16, 1)),
        backend="c",
        device="Intel Xeon",
        arch="x86_64-avx512",
        compiler="gcc 12.2.0 -O3",
        version="0.1.0",
    )
    return dataclasses.replace(key, **changes)  # type: ignore[arg-type]


def options(tile: int) -> str:
    return json.dumps({"tile": [tile, tile], "unroll": 4})


def run_python(code: str, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_round_trip_and_persistence(tmp_path: Path) -> None:
    db = tmp_path / "tune.sqlite"
    key = make_key()
    before = time.time()
    assert TuningCache(db).record(key, options(8), 1.25e-3, evaluations=40) is True
    entry = TuningCache(db).best(key)  # a new object on the same path sees it
    assert entry is not None
    assert entry.key == key
    assert json.loads(entry.options) == {"tile": [8, 8], "unroll": 4}
    assert entry.time_s == 1.25e-3
    assert entry.evaluations == 40
    assert before <= entry.created <= time.time()
    assert TuningCache(db).entries() == [entry]


def test_only_faster_results_replace_the_best(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    key = make_key()
    assert cache.record(key, options(8), 2.0, evaluations=10, history=[{"gen": 0, "best": 2.0}]) is True
    assert cache.record(key, options(16), 3.0, evaluations=20, history=[{"gen": 1, "best": 3.0}]) is False
    assert cache.record(key, options(32), 2.0, history=[{"gen": 2, "best": 2.0}]) is False  # a tie keeps the old
    best = cache.best(key)
    assert best is not None and (json.loads(best.options)["tile"], best.time_s, best.evaluations) == ([8, 8], 2.0, 10)
    assert cache.record(key, options(4), 0.5, evaluations=30, history=[{"gen": 3, "best": 0.5}, {"gen": 4}]) is True
    best = cache.best(key)
    assert best is not None and (json.loads(best.options)["tile"], best.time_s, best.evaluations) == ([4, 4], 0.5, 30)
    assert cache.history(key) == [
        {"gen": 0, "best": 2.0},
        {"gen": 1, "best": 3.0},
        {"gen": 2, "best": 2.0},
        {"gen": 3, "best": 0.5},
        {"gen": 4},
    ]
    assert cache.record(key, options(2), 0.25) is True  # no history given: nothing appended
    assert len(cache.history(key)) == 5


CHANGES: dict[str, object] = {
    "tc": MATMUL.replace("+=!", "+="),
    "entry": "matmul2",
    "shapes": ((64, 32), (32, 17)),
    "dtypes": ("float64", "float32"),
    "strides": ((1, 64), (16, 1)),
    "backend": "opencl",
    "device": "AMD EPYC",
    "arch": "x86_64-avx2",
    "compiler": "clang 17 -O3",
    "version": "0.2.0",
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_changing_any_key_field_misses(tmp_path: Path, field: str) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    cache.record(make_key(), options(8), 1.0)
    other = make_key(**{field: CHANGES[field]})
    assert other.digest() != make_key().digest()
    assert cache.best(other) is None
    assert cache.best(make_key()) is not None


def test_digest_is_canonical_and_stable_across_processes() -> None:
    key = make_key()
    listed = make_key(shapes=[[64, 32], [32, 16]], strides=[[32, 1], [16, 1]], dtypes=["float32", "float32"])
    assert listed == key and listed.digest() == key.digest()
    assert TuneKey.from_json(key.to_json()) == key
    assert json.loads(key.to_json())["shapes"] == [[64, 32], [32, 16]]
    assert len(key.digest()) == 64 and int(key.digest(), 16) >= 0
    code = f"from tcdsl.tuner.cache import TuneKey; print(TuneKey.from_json({key.to_json()!r}).digest())"
    for seed in ("1", "12345"):
        assert run_python(code, {"PYTHONHASHSEED": seed}).strip() == key.digest()


WORKER = textwrap.dedent(
    """
    import json, os, random, sys, time
    from pathlib import Path
    from tcdsl.tuner.cache import TuneKey, TuningCache

    db, worker, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    shared = TuneKey.from_json(sys.argv[4])
    own = TuneKey.from_json(sys.argv[5])
    cache = TuningCache(db)
    times = [1.0 + 0.001 * (worker + 4 * i) for i in range(50)]  # distinct across workers
    random.Random(worker).shuffle(times)
    (go.parent / f"ready{worker}").touch()
    while not go.exists():
        time.sleep(0.001)
    for i, t in enumerate(times):
        cache.record(shared, json.dumps({"worker": worker, "i": i}), t, 1, [{"worker": worker, "i": i, "t": t}])
        cache.record(own, json.dumps({"worker": worker, "i": i}), t, 1, [{"worker": worker, "i": i, "t": t}])
    print(json.dumps(times))
    """
)


def test_concurrent_writers_keep_the_global_minimum(tmp_path: Path) -> None:
    db, go = tmp_path / "tune.sqlite", tmp_path / "go"
    shared = make_key()
    owns = [make_key(shapes=((100 + w, 32), (32, 16))) for w in range(4)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(w), str(go), shared.to_json(), owns[w].to_json()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(4)
    ]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready{w}").exists() for w in range(4)) and time.monotonic() < deadline:
        time.sleep(0.005)  # every worker has opened the cache: start them writing together
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert "locked" not in err
    times = [json.loads(out) for out, _ in outputs]
    cache = TuningCache(db)

    best = cache.best(shared)
    assert best is not None
    assert best.time_s == min(min(ts) for ts in times) == 1.0
    assert json.loads(best.options) == {"worker": 0, "i": times[0].index(1.0)}
    shared_history = cache.history(shared)
    assert len(shared_history) == 200
    for w in range(4):  # each worker's records appear in the order it committed them
        assert [h["i"] for h in shared_history if h["worker"] == w] == list(range(50))
        own = cache.best(owns[w])
        assert own is not None and own.time_s == min(times[w])
        assert [h["t"] for h in cache.history(owns[w])] == times[w]
    rows = len(shared_history) + sum(len(cache.history(k)) for k in owns)
    assert rows == 4 * 2 * 50
    assert len(cache.entries()) == 5


def test_one_cache_shared_by_threads(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    key = make_key()
    won: list[bool] = []

    def work(t: int) -> None:
        for i in range(25):
            won.append(cache.record(key, options(t), 2.0 - 0.01 * (t + 4 * i), history=[{"thread": t, "i": i}]))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    best = cache.best(key)
    assert best is not None and best.time_s == pytest.approx(2.0 - 0.01 * 99)
    assert json.loads(best.options)["tile"] == [3, 3]
    assert len(won) == 100 and won.count(True) >= 1
    assert len(cache.history(key)) == 100


def test_checkpoints(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    key, other = make_key(), make_key(backend="cuda")
    assert cache.load_checkpoint(key) is None
    cache.save_checkpoint(key, {"generation": 3, "population": [[1, 2], [3, 4]], "rng": "abc"})
    assert cache.load_checkpoint(key) == {"generation": 3, "population": [[1, 2], [3, 4]], "rng": "abc"}
    cache.save_checkpoint(key, {"generation": 4})
    assert TuningCache(cache.path).load_checkpoint(key) == {"generation": 4}
    assert cache.load_checkpoint(other) is None
    assert cache.best(key) is None  # a checkpoint is not a result
    cache.clear_checkpoint(key)
    assert cache.load_checkpoint(key) is None
    cache.clear_checkpoint(key)  # clearing twice is harmless


def test_related_entries_fastest_first(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    k1 = make_key(shapes=((64, 32), (32, 16)))
    k2 = make_key(shapes=((128, 32), (32, 16)))
    k3 = make_key(shapes=((256, 32), (32, 16)), device="AMD EPYC")
    cache.record(k1, options(8), 3.0)
    cache.record(k2, options(16), 1.0)
    cache.record(k3, options(32), 2.0)
    cache.record(make_key(tc=MATMUL + " "), options(1), 0.1)  # another def text
    cache.record(make_key(entry="other"), options(1), 0.1)
    cache.record(make_key(backend="cuda"), options(1), 0.1)
    related = cache.related(MATMUL, "matmul", "c")
    assert [e.key for e in related] == [k2, k3, k1]
    assert [e.time_s for e in related] == [1.0, 2.0, 3.0]
    assert all(isinstance(e, TuneEntry) for e in related)
    assert cache.related(MATMUL, "matmul", "opencl") == []
    assert len(cache.entries()) == 6


def test_forget_removes_entry_history_and_checkpoint(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    key, kept = make_key(), make_key(arch="sm_90", backend="cuda")
    cache.record(key, options(8), 1.0, history=[{"gen": 0}])
    cache.save_checkpoint(key, {"generation": 1})
    cache.record(kept, options(8), 2.0, history=[{"gen": 0}])
    cache.forget(key)
    assert cache.best(key) is None
    assert cache.history(key) == []
    assert cache.load_checkpoint(key) is None
    assert [e.key for e in cache.entries()] == [kept]
    assert cache.history(kept) == [{"gen": 0}]
    assert cache.record(key, options(16), 5.0) is True  # a forgotten key starts afresh


def test_corrupt_file_raises_and_is_left_in_place(tmp_path: Path) -> None:
    db = tmp_path / "tune.sqlite"
    garbage = bytes(range(256)) * 16
    db.write_bytes(garbage)
    with pytest.raises(TuningCacheError, match="tune.sqlite") as info:
        TuningCache(db)
    assert str(db) in str(info.value)
    assert db.read_bytes() == garbage


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "other.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(TuningCacheError, match="not a tcdsl tuning cache"):
        TuningCache(db)


def test_default_path_follows_the_knobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a" / "b" / "mine.sqlite"
    monkeypatch.setenv("TCDSL_TUNING_DB", str(target))
    cache = TuningCache()
    assert cache.path == target and target.is_file()
    cache.record(make_key(), options(8), 1.0)
    assert TuningCache(target).best(make_key()) is not None

    monkeypatch.delenv("TCDSL_TUNING_DB")
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path / "cache" / "dir"))
    cache = TuningCache()
    assert cache.path == tmp_path / "cache" / "dir" / "tuning.sqlite"
    assert cache.path.is_file()
    assert cache.best(make_key()) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1e-9])
def test_invalid_times_are_rejected(tmp_path: Path, bad: float) -> None:
    cache = TuningCache(tmp_path / "tune.sqlite")
    with pytest.raises(ValueError, match="finite, non-negative"):
        cache.record(make_key(), options(8), bad)
    assert cache.best(make_key()) is None
    assert cache.history(make_key()) == []
    assert cache.record(make_key(), options(8), 0.0) is True  # zero is a valid (if lucky) time
