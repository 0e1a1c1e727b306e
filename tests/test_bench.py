"""``tcdsl bench``: a def's kernel timed with its default, tuned and explicit options against
numpy's einsum of the same def; the def -> einsum translation (``interp.einsum_form``, and
``bench.einsum_peer`` at given sizes); a result that differs from einsum's fails loudly."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl import bench, cli, interp
from tcdsl.codegen import pch
from tcdsl.tuner import tune as T
from tcdsl.tuner.cache import TuningCache

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }\n"
TANH = "def th(float(N) X) -> (Y) { Y(i) = tanh(X(i)) }\n"
SIZES = "M=8,N=6,K=4"


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_cache: Path) -> None:
    """Short samples, a short wait for idle thread pools, and a tuning cache of the test's own."""
    monkeypatch.setattr(bench, "BATCH_S", 0.001)
    monkeypatch.setattr(bench, "QUIESCE_S", 0.01)
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))


def _write(tmp_path: Path, text: str, name: str = "k.tc") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _row(out: str, name: str) -> list[str]:
    """The cells of the table row of variant ``name``: median, min, spread, rate, ratio, check."""
    line = next((ln for ln in out.splitlines() if ln.startswith(name + "  ")), None)
    assert line is not None, f"no row {name!r} in:\n{out}"
    return line[len(name):].split()


@pytest.mark.parametrize("source,form", [
    (MM, ("ac,cb->ab", ("A", "B"), 1.0)),
    ("def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,m,r_k) * Y(b,r_k,n) }",
     ("abd,adc->abc", ("X", "Y"), 1.0)),
    ("def tmm(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(r_k,m) * B(r_k,n) }", ("ca,cb->ab", ("A", "B"), 1.0)),
    ("def bias(float(B,I) A, float(I) V) -> (O) { O(b,i) = A(b,i) * V(i) }", ("ab,b->ab", ("A", "V"), 1.0)),
    ("def sc(float(N) X, float(N) W) -> (Y) { Y(i) = 3 * X(i) * W(i) * 0.5 }", ("a,a->a", ("X", "W"), 1.5)),
    ("def tr(float(N,M) X) -> (Y) { Y(j,i) = X(i,j) }", ("ba->ab", ("X",), 1.0)),
    ("def dot(float(N) X, float(N) W) -> (Y) { Y +=! X(r_i) * W(r_i) }", ("a,a->", ("X", "W"), 1.0)),
])
def test_defs_that_einsum_computes(source: str, form: tuple[str, tuple[str, ...], float]) -> None:
    assert interp.einsum_form(tc.define(source).checked.stmts[0]) == form


@pytest.mark.parametrize("source,reason", [
    ("def sh(float(N) X) -> (Y) { Y(i) = X(i+1) where i in 0:N-1 }", "'X' is read at i + 1, not a plain index"),
    ("def last(float(N) X) -> (Y) { Y(i) = X(N-1) * X(i) }", "'X' is read at N - 1, not a plain index"),
    ("def mx(float(N,M) X) -> (Y) { Y(i) max=! X(i,r_j) }", "reduces with 'max='"),
    (TANH, "not a product of tensor reads and float constants"),
    ("def g(float(N) X, int32(M) I) -> (Y) { Y(i) = X(I(i)) }", "'X' is read at a gathered index"),
    ("def bc(float(N) X) -> (Y) { Y(i,j) = X(i) where j in 0:4 }", "index 'j' of statement 1 subscripts no read"),
])
def test_defs_that_einsum_does_not_compute(source: str, reason: str) -> None:
    form = interp.einsum_form(tc.define(source).checked.stmts[0])
    assert isinstance(form, str) and reason in form


def test_the_peer_needs_whole_tensors_at_the_given_sizes() -> None:
    k = tc.define("def s(float(N) A, float(M) B) -> (C) { C(i) = A(i) * B(i) }")
    a, b = np.ones(8, np.float32), np.ones(6, np.float32)
    assert "index 'i' ranges over 0:6 at these sizes but dim 0 of 'A' has 8" in str(
        bench.einsum_peer(k.checked, k.instance(a, b)))
    assert isinstance(bench.einsum_peer(k.checked, k.instance(a, a)), bench.EinsumPeer)
    two = tc.define("def two(float(N) X) -> (Y, Z) { Y(i) = X(i) * X(i)\n Z(i) = Y(i) * 2 }")
    assert "has 2 statements" in str(bench.einsum_peer(two.checked, two.instance(a)))
    acc = tc.define("def acc(float(N,M) X) -> (Y) { Y(i) += X(i,r_j) }")
    assert "+= without !" in str(bench.einsum_peer(acc.checked, acc.instance(np.ones((3, 2), np.float32))))


def test_the_peer_computes_the_def() -> None:
    rng = np.random.default_rng(1)
    k = tc.define("def sc(float(B,N) X, float(N) W) -> (Y) { Y(b,i) = 3 * X(b,i) * W(i) }")
    x, w = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    peer = bench.einsum_peer(k.checked, k.instance(x, w))
    assert isinstance(peer, bench.EinsumPeer) and str(peer) == "np.einsum('ab,b->ab', X, W, optimize=True) * 3"
    np.testing.assert_allclose(peer([x, w]), 3 * x * w, rtol=1e-6)
    assert bench.mismatch(k(x, w, backend="numpy"), peer([x, w]), peer.allowance([x, w])) is None
    wrong = peer([x, w]).copy()
    wrong[2, 3] += 1
    assert "1 of 20 elements differ; at [2, 3]" in str(bench.mismatch(wrong, peer([x, w]), peer.allowance([x, w])))
    mm = tc.define(MM.replace("float", "int32"))
    a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.ones((3, 2), np.int32)
    peer = bench.einsum_peer(mm.checked, mm.instance(a, b))
    assert isinstance(peer, bench.EinsumPeer) and peer.allowance([a, b]) is None  # integers compare exactly
    assert bench.mismatch(mm(a, b, backend="numpy"), peer([a, b]), None) is None
    assert "1 of 4 elements differ" in str(bench.mismatch(peer([a, b]) + np.eye(2, 2, 1, np.int32), peer([a, b]),
                                                          None))
    diag = tc.define("def d(float(N,N) A) -> (C) { C(i) = A(i,i) }")
    a = np.ones((3, 3), np.float32)
    got = bench.einsum_peer(diag.checked, diag.instance(a))([a])  # a copy, not einsum's read-only view of A
    assert isinstance(got, np.ndarray) and got.flags.writeable and not np.shares_memory(got, a)


def test_every_bench_flag_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = capsys.readouterr().out
    undocumented = [line for line in text.split("options:")[1].split("\n  -")[1:] if len(line.split()) < 3]
    assert "--rounds" in text and "--threads" in text and not undocumented, text


@pytest.mark.cpu
def test_a_matmul_against_einsum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MM)
    assert cli.main(["bench", file, "--sizes", SIZES, "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "einsum peer: np.einsum('ac,cb->ab', A, B, optimize=True)" in out
    assert "no tuned options for these arguments; search them with `tcdsl tune " in out
    assert f"`tcdsl tune {file} --entry mm --sizes M=8,N=6,K=4`" in out
    assert re.search(r"^variant +median ms +min ms +spread +GFLOP/s +vs numpy.einsum +check$", out, re.M), out
    median, low, spread, rate, ratio, check = _row(out, "tcdsl, default options")
    assert float(median) >= float(low) > 0 and float(rate) > 0 and check == "ok"
    assert ratio.endswith("x") and float(ratio[:-1]) > 0  # 2 decimals, or 2 digits below 0.1
    assert spread.endswith("%") and _row(out, "numpy.einsum")[4:] == ["1.00x", "reference"]
    assert "tcdsl, tuned options" not in out and "numpy" in out and "BLAS" in out


@pytest.mark.cpu
def test_a_def_without_einsum_form_is_still_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, TANH + "def mx(float(N,M) X) -> (Y) { Y(i) max=! X(i,r_j) }\n")
    assert cli.main(["bench", file, "--entry", "th", "--sizes", "N=64", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "no einsum peer: the right side of statement 1 is not a product of tensor reads" in out
    median, low, spread, rate, ratio, check = _row(out, "tcdsl, default options")
    assert float(median) > 0 and ratio == "1.00x" and check == "-" and "GB/s" in out
    assert "numpy.einsum  " not in out and "results not checked" in out
    assert cli.main(["bench", file, "--entry", "mx", "--sizes", "N=8,M=4", "--rounds", "1"]) == 0
    assert "no einsum peer: statement 1 reduces with 'max='" in capsys.readouterr().out


@pytest.mark.cpu
def test_tuned_and_explicit_options_are_timed_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MM)
    kernel = tc.define(MM)
    arrays = [np.zeros((8, 4), np.float32), np.zeros((4, 6), np.float32)]  # what --sizes M=8,N=6,K=4 makes
    TuningCache().record(T.key_for(kernel, arrays), tc.MappingOptions(tile=(4, 4, 4)).to_json(), 2e-3, 11)
    args = ["bench", file, "--sizes", SIZES, "--rounds", "2", "--options", '{"tile": [2, 2, 2]}']
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "tuned options: tuned on " in out and "(2 ms measured, 11 candidates)" in out and "tile: None" in out
    for name in ("tcdsl, default options", "tcdsl, tuned options", "tcdsl, --options"):
        assert _row(out, name)[5] == "ok", out
    assert "tuned options: " in out.split("check")[-1] and "x the speed of the defaults" in out
    assert cli.main(["bench", file, "--sizes", SIZES, "--rounds", "1", "--options", '{"tile": [4, 4, 4]}']) == 0
    out = capsys.readouterr().out  # options already in the table get no second row
    assert "--options: the same as tuned options (timed as that row)" in out and "tcdsl, --options" not in out


@pytest.mark.cpu
def test_a_result_that_differs_from_einsum_fails_loudly(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken translation stands in for a broken kernel: the two disagree, and no ratio is shown."""
    monkeypatch.setattr(interp, "einsum_form", lambda s: ("ca,cb->ab", ("A", "B"), 1.0))  # A transposed
    file = _write(tmp_path, MM)
    assert cli.main(["bench", file, "--sizes", "M=5,N=5,K=5", "--rounds", "1"]) == 1
    captured = capsys.readouterr()
    assert _row(captured.out, "tcdsl, default options")[4:] == ["-", "MISMATCH"]
    assert "tcdsl: MISMATCH: tcdsl, default options: the result differs from np.einsum('ca,cb->ab'" in captured.err
    assert "elements differ; at [" in captured.err


def test_errors_exit_1_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MM)
    assert cli.main(["bench", file, "--entry", "nope", "--sizes", SIZES]) == 1
    assert "--entry must name one of the defs in" in capsys.readouterr().err
    assert cli.main(["bench", file, "--sizes", "M=8"]) == 1
    assert "def 'mm' needs sizes for" in capsys.readouterr().err
    assert cli.main(["bench", file, "--sizes", SIZES, "--rounds", "0"]) == 1
    assert "--rounds must be at least 1" in capsys.readouterr().err
    assert cli.main(["bench", file, "--sizes", SIZES, "--backend", "numpy", "--options", "{}"]) == 1
    assert "numpy backend" in capsys.readouterr().err


def test_the_numpy_backend_is_timed_against_einsum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MM)
    assert cli.main(["bench", file, "--sizes", SIZES, "--rounds", "1", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert _row(out, "tcdsl, numpy backend")[5] == "ok" and "mapping options apply to the C backend" in out


@pytest.mark.cpu
def test_threads_limit_the_kernels_and_blas_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("threadpoolctl")
    file = _write(tmp_path, MM)
    # sizes whose kernel has a parallel loop: it loads the OpenMP runtime even in a process of its own
    assert cli.main(["bench", file, "--sizes", "M=128,K=64,N=96", "--rounds", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"kernels' OpenMP: \S+ \(1 thread\)", out) and re.search(r"BLAS .*, 1 thread\)", out), out
    assert cli.main(["bench", file, "--sizes", SIZES, "--threads", "0"]) == 1
    assert "--threads must be at least 1" in capsys.readouterr().err


@pytest.mark.cpu
def test_tuned_options_equal_to_the_defaults_get_no_row_of_their_own(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MM)
    arrays = [np.zeros((8, 4), np.float32), np.zeros((4, 6), np.float32)]
    TuningCache().record(T.key_for(tc.define(MM), arrays), tc.MappingOptions().to_json(), 1e-3, 5)
    assert cli.main(["bench", file, "--sizes", SIZES, "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "the search kept the defaults (the default options' row times them)" in out
    assert "tcdsl, tuned options" not in out and _row(out, "tcdsl, default options")[5] == "ok"


def test_timing_waits_for_a_precompiled_header_under_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first compile starts the precompiled header's build in the background (codegen.pch); its
    compiler would take a core from the timed calls, so quiesce() returns only once it is done."""
    done = threading.Event()

    def build() -> None:
        time.sleep(0.3)
        done.set()

    t = threading.Thread(target=build, daemon=True)
    monkeypatch.setitem(pch._building, "/nonexistent/tc_sys-test.h", t)
    t.start()
    bench.quiesce(max_s=0.01)
    assert done.is_set()
