"""Tuning a training step (``kernel.autotune(..., backward=True)``, ``TcModule.autotune``,
``tcdsl tune --backward``): the forward def as training runs it and the backward def are each
searched and stored, and autograd's later calls run with both results. The searches use a runner
that reports every non-default candidate faster (``test_tuner_decision:truly_faster``), so that
what is kept is known; the gradients are checked against torch's own layer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tcdsl as tc  # noqa: E402
from tcdsl.nn import TcModule  # noqa: E402
from tcdsl.options import MappingOptions  # noqa: E402
from tcdsl.torch_ops import _entry  # noqa: E402
from tcdsl.training import TrainingTuneResult, backward_arguments, training_kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from grad_defs import CASES  # noqa: E402
from tolerance import assert_close  # noqa: E402

pytestmark = pytest.mark.cpu

# the gradient corpus's layernorm (tests/grad_defs.py), in float32 as torch's layer runs it
LAYERNORM = next(c for c in CASES if c.name == "layernorm").source.replace("double(", "float(")
FAST = dict(generations=1, population=3, elites=1, seed=1, progress=False, runner="test_tuner_decision:truly_faster")


@pytest.fixture(autouse=True)
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("TCDSL_TUNING_DB", str(path))
    return path


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(12, 40, generator=g), torch.randn(40, generator=g), torch.randn(40, generator=g)]


def test_autograd_runs_the_tuned_forward_and_backward() -> None:
    k = tc.define(LAYERNORM)
    xs = _inputs()
    result = k.autotune(*xs, backward=True, **FAST)
    assert isinstance(result, TrainingTuneResult)
    assert (result.forward_def, result.backward_def) == ("layernorm", "layernorm_grad")
    for r in (result.forward, result.backward):
        assert r.options != MappingOptions() and r.decision is not None and r.decision.keep
    assert "forward (layernorm)" in result.explain() and "backward (layernorm_grad)" in result.explain()

    leaves = [x.clone().requires_grad_(True) for x in xs]
    y = k(*leaves)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    y.backward(gy)
    ref = [x.clone().requires_grad_(True) for x in xs]
    torch.nn.functional.layer_norm(ref[0], (40,), ref[1], ref[2], eps=1e-5).backward(gy)
    for a, b in zip(leaves, ref):
        assert_close(a.grad.numpy(), b.grad.numpy(), terms=40 * 12 * 4)

    # the kernels autograd built for this step report the tuned options as theirs
    arrays = [x.numpy() for x in xs]
    fwd_entry = _entry(k.__dict__["_torch_keys"][(None, None, True)])
    assert fwd_entry.kernel.options_for(*arrays) == result.forward.options
    forward, _, bw = training_kernels(k)
    bargs = backward_arguments(k, forward, bw, arrays)
    (bkey,) = k.__dict__["_torch_backward_keys"].values()
    assert _entry(bkey).kernel.options_for(*bargs) == result.backward.options


def test_a_module_tunes_the_gradients_its_step_needs() -> None:
    """The input does not require a gradient: the backward tuned is the parameters' only."""
    m = TcModule(LAYERNORM, G=torch.ones(40), Bt=torch.zeros(40))
    x = _inputs()[0]
    result = m.autotune(x, **FAST)
    assert result.backward.options != MappingOptions()
    _, backward, bw = training_kernels(m.kernel, ["G", "Bt"])
    assert bw.grads == ("G", "Bt")
    assert [t.name for t in backward.checked.outputs] == ["d_G", "d_Bt"]
    loss = m(x).square().sum()
    loss.backward()
    assert m.G.grad is not None and m.Bt.grad is not None and x.grad is None
    with pytest.raises(tc.TcArgumentError, match="takes 1 inputs"):
        m.autotune(x, x)


def test_the_command_line_tunes_a_training_step(tmp_path: Path, db: Path) -> None:
    src = tmp_path / "ln.tc"
    src.write_text(LAYERNORM)
    out = subprocess.run([sys.executable, "-m", "tcdsl", "tune", str(src), "--sizes", "N=8,D=24", "--backward",
                          "--budget", "20", "--generations", "1", "--population", "3", "--seed", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "layernorm:" in out.stdout and "layernorm_grad:" in out.stdout
    stored = {e.name: e.shapes for e in tc.tuning.entries(path=db)}
    assert stored["layernorm"] == ((8, 24), (24,), (24,))
    # the backward's arguments: X, G, the saved mean and var, and the output's gradient
    assert stored["layernorm_grad"][0] == (8, 24) and (8, 24) in stored["layernorm_grad"][1:]
