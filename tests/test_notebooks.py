"""Every walkthrough notebook runs top to bottom (headless, in a Jupyter kernel), and is stored without outputs.

The kernel runs with ``BYOC_HETERO_NOTEBOOK=quick`` (unless the variable is set: ``full`` runs the notebooks as
a reader does), which each notebook reads in its first cell: smaller sizes where the notebook's point does
not need the size (01: VGG-11 at 32x32 with 64-wide fc layers: the same layers, one region, the same checks
against the llvm-only build; tests/test_models.py::test_vgg11_full_size checks the full size) and fewer timing
repeats (04, 05: their timings are printed, never asserted). Every assert of every notebook still runs. The
kernel imports the package under test (``PYTHONPATH``), not another installed copy.

A kernel per notebook, not the test process: notebook 03 registers a lowering into the oneDNN backend's table
(``lowers``), which nothing unregisters: in this process it would stay for every later test, and a second run
would raise "already has a lowering".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has saved outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_top_to_bottom(path, tmp_path, monkeypatch):
    import byoc_hetero

    package_root = str(Path(byoc_hetero.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("BYOC_HETERO_NOTEBOOK", os.environ.get("BYOC_HETERO_NOTEBOOK", "quick"))
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
