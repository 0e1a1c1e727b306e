"""The wheel exposes one import package, `tcdsl`, assembled from the pipeline folders (package-dir),
and works when installed away from the checkout: build it, install it into a scratch directory,
and run a kernel from there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Left out of the copy the wheel is built from: local state, not sources.
_SKIP_AT_ROOT = {".git", ".venv", "build", "dist", ".hypothesis", ".mypy_cache", ".pytest_cache"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n in ("__pycache__", ".ruff_cache") or n.endswith(".egg-info")}
    if Path(directory).resolve() == ROOT:
        skip |= _SKIP_AT_ROOT & set(names)
    return skip


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"{cmd[:4]} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


def test_wheel_installs_one_package_that_runs(tmp_path: Path) -> None:
    # Build from a copy, so the checkout gets no build/ or egg-info and no stale build/lib leaks in.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_ignore, symlinks=True)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)])
    (wheel,) = dist.glob("tcdsl-0.1.0-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "tcdsl/__init__.py",
        "tcdsl/py.typed",
        "tcdsl/core/__init__.py",
        "tcdsl/core/sema.py",
        "tcdsl/grammar/__init__.py",
        "tcdsl/grammar/parser.py",
        "tcdsl/grammar/tc.lark",
        "tcdsl/polyhedral/__init__.py",
        "tcdsl/codegen/__init__.py",
        "tcdsl/tuner/__init__.py",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    top = {n.split("/", 1)[0] for n in names}
    assert not top & {"core", "grammar", "polyhedral", "codegen", "tests", "examples", "benchmarks"}, top
    assert top == {"tcdsl", "tcdsl-0.1.0.dist-info"}, top
    entry_points = zipfile.ZipFile(wheel).read("tcdsl-0.1.0.dist-info/entry_points.txt").decode()
    assert "tcdsl = tcdsl.cli:main" in entry_points

    site = tmp_path / "site"
    _run([*pip, "install", "-q", "--no-deps", "--target", str(site), str(wheel)])

    # cwd is tmp_path, so the checkout is not on sys.path. An editable install of tcdsl in this
    # interpreter adds a meta-path finder, but setuptools appends it after the path-based finder,
    # so the entry inserted first in sys.path wins; the __file__ checks below prove it.
    probe = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        import numpy as np
        import tcdsl as tc
        import tcdsl.codegen, tcdsl.core, tcdsl.grammar, tcdsl.polyhedral

        k = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}")
        A = np.arange(6, dtype=np.float32).reshape(2, 3)
        B = np.ones((3, 2), np.float32)
        C = k(A, B, backend="numpy")
        assert np.array_equal(C, A @ B), C  # small integers: every sum is exact
        for m in (tc, tcdsl.core, tcdsl.grammar, tcdsl.polyhedral, tcdsl.codegen):
            print(m.__file__)
        """
    )
    out = _run([sys.executable, "-c", probe], cwd=tmp_path).stdout.split()
    assert len(out) == 5, out
    for path in out:
        assert Path(path).resolve().is_relative_to(site.resolve()), f"{path} is not from the wheel ({site})"


def test_sdist_ships_the_examples_license_and_changelog(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_ignore, symlinks=True)
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path / "dist"), str(src)])
    (sdist,) = (tmp_path / "dist").glob("tcdsl-*.tar.gz")
    import tarfile

    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        info = tar.extractfile(f"{sdist.name[:-len('.tar.gz')]}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    examples = {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").iterdir() if p.suffix in (".tc", ".py")}
    assert {"LICENSE", "CHANGELOG.md", "README.md"} | examples <= names, sorted(names)
    import tcdsl

    assert f"Version: {tcdsl.__version__}" in info and "License-Expression: MIT" in info


def test_the_version_is_written_once_and_the_cli_reports_it() -> None:
    import tcdsl

    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "\nversion = " not in text.split("[tool.setuptools.dynamic]")[0]
    out = subprocess.run([sys.executable, "-m", "tcdsl", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"tcdsl {tcdsl.__version__}"
