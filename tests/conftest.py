"""Test tiers: unmarked tests are pure Python; `cpu` needs a C compiler; `gpu` needs a CUDA device or
an OpenCL platform (PoCL counts). Tiers the machine lacks are skipped. `slow` sweeps are opt-in:
pass --run-slow (or select them with -m slow)."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import settings

# every schedule transformation is checked against the dependences in tests (see core/knobs.py)
os.environ.setdefault("TCDSL_CHECK_SCHEDULE", "1")
# tiling and packing decisions that tests check read the cache sizes: every machine's tests see one
# machine's (a Zen 4 core's L1d and L2, a CCD's L3); the vector ISA stays this machine's own
os.environ.setdefault("TCDSL_CPU_CACHES", "l1d=32K,l2=1M,l3=32M")
# kernels called in tests run their default options: a tuning cache of the user's is never read
os.environ["TCDSL_TUNING_DB"] = os.path.join(tempfile.mkdtemp(prefix="tcdsl-tests-"), "tuning.sqlite")


# drawn tests draw the same examples on every run and machine, so the suite is never flaky;
# `pytest --hypothesis-profile=explore` draws new ones (and replays failures it saved)
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")
    parser.addoption("--accept-golden", action="store_true",
                     help="rewrite the golden files of tests/golden with what the compiler prints now")


@functools.cache
def has_c_compiler() -> bool:
    return shutil.which((os.environ.get("CC", "").split() or ["gcc"])[0]) is not None


@functools.cache
def has_cuda() -> bool:
    try:
        with warnings.catch_warnings():  # an import-time warning must not read as "no device"
            warnings.simplefilter("ignore")
            import cupy

            return bool(cupy.is_available())
    except Exception:
        return False


@functools.cache
def has_opencl() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pyopencl as cl

            return len(cl.get_platforms()) > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--run-slow") or "slow" in (config.getoption("markexpr") or "")
    for item in items:
        if item.get_closest_marker("cpu") and not has_c_compiler():
            item.add_marker(pytest.mark.skip(reason="no C compiler ($CC, default gcc)"))
        if item.get_closest_marker("gpu") and not (has_cuda() or has_opencl()):
            item.add_marker(pytest.mark.skip(reason="no CUDA device and no OpenCL platform"))
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow sweep: pass --run-slow"))


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty kernel cache of the test's own (``TCDSL_CACHE_DIR``), read without forced rebuilds."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(d))
    monkeypatch.delenv("TCDSL_FORCE_RECOMPILE", raising=False)
    return d
