"""Every example notebook runs top to bottom on the shipped demo bundle (CI executes them all)."""

from __future__ import annotations

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # the full tier: the notebooks executed in a kernel

NOTEBOOKS = sorted((REPO / "examples" / "notebooks").glob("*.ipynb"))


def test_there_are_four_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what a notebook writes to a temp folder goes with the test's
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any(o.output_type in ("display_data", "execute_result") for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", [])), "the notebook showed nothing"
