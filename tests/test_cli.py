"""The command line's manners: help for every flag, located messages for bad --options and unknown
size symbols (with a suggestion), every file of ``check`` reported, a quiet broken pipe; and the
"did you mean" suggestions of the front end for tensors, builtins, types and option names."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tcdsl as tc
from tcdsl import cli

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }\n"


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tcdsl", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_every_flag_has_help() -> None:
    parser_help = _cli("--help").stdout
    assert "--version" in parser_help
    for command in ("check", "compile", "grad", "tune", "cache"):
        text = _cli(command, "--help").stdout
        options = [line.split()[0] for line in text.splitlines() if line.startswith("  ") and line.split()
                   and line.split()[0] != "-h,"]
        undocumented = [line for line in text.split("options:")[1].split("\n  -")[1:] if len(line.split()) < 3]
        assert options and not undocumented, (command, text)


def test_bad_options_and_sizes_are_located_with_suggestions(tmp_path: Path) -> None:
    (tmp_path / "mm.tc").write_text(MM)
    r = _cli("compile", "mm.tc", "--sizes", "M=8,N=8,K=8", "--options", '{"tile": [4,}', cwd=tmp_path)
    assert r.returncode == 1 and "--options: mapping options are not JSON" in r.stderr
    assert '    {"tile": [4,}\n                ^' in r.stderr  # a caret under the column
    r = _cli("compile", "mm.tc", "--sizes", "M=8,N=8,K=8", "--options", '{"tiel": [4]}', cwd=tmp_path)
    assert r.returncode == 1 and "unknown mapping options: 'tiel'; did you mean 'tile'?" in r.stderr
    r = _cli("compile", "mm.tc", "--sizes", "M=8,n=8,K=8", cwd=tmp_path)
    assert r.returncode == 1 and "no size symbol 'n'; did you mean 'N'?" in r.stderr, r.stderr
    r = _cli("compile", "mm.tc", "--sizes", "M=8,N=8,K=8", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("/* options: ")  # what a call would use, said first


def test_check_reports_every_file(tmp_path: Path) -> None:
    (tmp_path / "good.tc").write_text(MM)
    (tmp_path / "bad.tc").write_text("def bad(float(N) X) -> (Y) { Y(i) = Xq(i) }\n")
    r = _cli("check", "bad.tc", "missing.tc", "good.tc", cwd=tmp_path)
    assert r.returncode == 1 and "def mm(float32(M, K) A" in r.stdout  # checked after two failures
    assert "bad.tc:1:37: 'Xq' is not a tensor or builtin of def 'bad'; did you mean 'X'?" in r.stderr
    assert "missing.tc" in r.stderr and "2 of 3 files have errors" in r.stderr


def test_a_broken_pipe_is_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mm.tc").write_text(MM)
    read, write = os.pipe()
    os.close(read)  # the reader (`| head`) is gone: every write fails with EPIPE
    out = io.TextIOWrapper(open(write, "wb", buffering=0), write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    code = cli.main(["compile", str(tmp_path / "mm.tc"), "--sizes", "M=8,N=8,K=8"])
    monkeypatch.undo()
    out.close()  # its descriptor now writes to /dev/null (main put it there): closing flushes nothing anywhere
    assert code == 141 and capsys.readouterr().err == ""


@pytest.mark.parametrize("source,message", [
    ("def f(float(N) X) -> (Y) { Y(i) = tahn(X(i)) }", "'tahn' is not a tensor or builtin of def 'f'; did you mean "
                                                       "'tanh'?"),
    ("def f(float(N) X, float(N) Wt) -> (Y) { Y(i) = W(i) }", "did you mean 'Wt'?"),
    ("def f(float(N) X) -> (Y) { Y(i) = flot(X(i)) }", "did you mean 'float'?"),
    ("def f(flaot(N) X) -> (Y) { Y(i) = X(i) }", "'flaot' is not a type; the types are bool, int8, int16, int32, "
                                                 "int64, uint8, uint16, uint32, uint64, float16, float32, float, "
                                                 "float64, double; did you mean 'float'?"),
])
def test_misspelt_names_get_a_suggestion(source: str, message: str) -> None:
    with pytest.raises(tc.TcError) as e:
        tc.define(source)
    assert message in e.value.message and e.value.location is not None


def test_unrelated_names_get_none() -> None:
    with pytest.raises(tc.TcSemanticError) as e:
        tc.define("def f(float(N) X) -> (Y) { Y(i) = qqq(X(i)) }")
    assert "did you mean" not in e.value.message
    with pytest.raises(tc.TcArgumentError, match="unknown mapping options: 'zzz'$"):
        tc.MappingOptions.from_json('{"zzz": 1}')
