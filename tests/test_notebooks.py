"""The notebooks in examples/notebooks run headless (nbclient, an ipykernel of this interpreter) from
top to bottom without an error, and show what they say they show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"


def _run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The notebook executed in a scratch directory with caches of its own; its code cells' outputs."""
    monkeypatch.setenv("TCDSL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert book.metadata.kernelspec.name == "python3"
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on a cell's error
    return [c.outputs for c in book.cells if c.cell_type == "code"]


def _text(outputs: list[dict]) -> str:
    """A cell's outputs as a reader sees them. The kernel may split one print into several stream
    messages (at any character), so stream text is joined as it came; rich outputs each start a line."""
    text = ""
    for o in outputs:
        if o["output_type"] == "stream":
            text += o["text"]
        elif o["output_type"] in ("execute_result", "display_data"):
            text += "\n" + o["data"].get("text/html", "") + o["data"].get("text/plain", "") + "\n"
    return text


def test_the_quickstart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [_text(c) for c in _run("quickstart", tmp_path, monkeypatch)]
    everything = "\n".join(cells)
    assert "<b>mm</b>" in cells[0] and "# statement 1" in cells[0]  # the def, highlighted, with its ranges
    assert "max |tcdsl - numpy| = " in everything and "tcdsl " in everything and " ms, numpy " in everything
    assert "why not parallel" in everything and "<code>r_k</code>" in everything  # explain's table
    assert "#include <math.h>" in everything  # the generated C
    assert "<TuneResult: " in everything and "data:image/png;base64," in everything  # summary and plot
    assert "options: tuned on " in everything  # the views follow the tuning cache
    assert "did you mean &#x27;tanh&#x27;?" in everything  # the error, with its suggestion


def test_the_gpu_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    everything = "\n".join(_text(c) for c in _run("gpu_mapping", tmp_path, monkeypatch))
    assert "// launch tc_mm_k" in everything and "__global__" in everything
    assert "#define SHARED __shared__" in everything and "<b>tile</b>" in everything
    found = re.search(r"OpenCL: max \|error\| = (\S+)", everything)
    assert found or "no OpenCL here" in everything
    if found:
        # 96 float32 products of normals per entry: 96 * 2**-24 * sum(|a*b|) stays under 1e-3
        assert float(found.group(1)) < 1e-3


@pytest.mark.cpu
def test_pytorch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    everything = "\n".join(_text(c) for c in _run("pytorch", tmp_path, monkeypatch))
    assert "def linear_relu_grad(" in everything and "gradcheck: True" in everything
    assert "loss " in everything and "tensor([[" in everything  # trained (the cell asserts the drop); compiled
