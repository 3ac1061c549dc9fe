"""Shared fixtures: one tiny bundle per test session, exported through the real checkpoint path."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "examples" / "clips"


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    from graphs.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny"
    return export_bundle(None, out, tiny_seed=0, log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_plain_bundle(tmp_path_factory) -> Path:
    """The tiny bundle with standard-op attention (--attention plain): what om.convert (ATC) needs."""
    from graphs.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny-plain"
    return export_bundle(None, out, tiny_seed=0, log=lambda *_: None, attention="plain")
