"""Every notebook executes top to bottom (CI runs this; the notebooks are documentation that cannot go stale)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(path.parent)}}
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources=resources).execute()


def test_there_is_a_notebook():
    assert NOTEBOOKS
