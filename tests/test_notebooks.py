"""Every example notebook runs top to bottom on the demo bundle (CI executes them all)."""

from __future__ import annotations

import shutil

import pytest

from .conftest import REPO

NOTEBOOKS = sorted((REPO / "examples" / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def demo_cache(tiny_bundle, tmp_path_factory):
    """The demo bundle is the tiny seed-0 bundle: reuse the session's export instead of building again."""
    from sam3track.demo import DEMO_BUNDLE_NAME

    cache = tmp_path_factory.mktemp("cache")
    shutil.copytree(tiny_bundle, cache / DEMO_BUNDLE_NAME)
    return cache


def test_there_are_three_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, demo_cache, monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SAM3TRACK_CACHE_DIR", str(demo_cache))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any(o.output_type in ("display_data", "execute_result") for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", [])), "the notebook showed nothing"
