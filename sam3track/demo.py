"""The demo bundle: a small SAM 3 with RANDOM weights, shipped inside the package.

It exists so ``sam3track demo`` and the notebooks work straight after ``pip install``, without torch
and without downloading the real facebook/sam3 checkpoint. Its masks show the machinery
(reading, tracking, drawing, writing), not the model's skill.

The bundle lives in ``sam3track/demo_bundle/`` (seven graphs, tokenizer, manifest; no checkpoint, which
the runtime never reads). It is the ``demo`` preset of ``graphs/tiny.py`` with seed 0, and is
regenerated, after changing that preset or the exporter, with one command from the repository root:

    python -m graphs.export --demo --out sam3track/demo_bundle --overwrite

``tests/test_demo_bundle.py`` exports it afresh and checks that every graph gives the shipped graph's
outputs, so a stale shipped bundle fails the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sam3track.errors import Sam3TrackError

DEMO_BUNDLE_NAME = "demo_bundle"  # the package-data folder next to this file
REGENERATE_COMMAND = "python -m graphs.export --demo --out sam3track/demo_bundle --overwrite"


def demo_bundle_path(log: Callable[[str], None] | None = None) -> Path:
    """The shipped demo bundle's directory. Nothing is built or imported beyond this module.

    ``log`` is kept for callers that print progress; a shipped bundle has nothing to report, so it
    is never called.
    """
    path = Path(__file__).resolve().parent / DEMO_BUNDLE_NAME
    if not (path / "manifest.json").is_file():
        raise Sam3TrackError(
            f"the demo bundle is missing from this installation: {path / 'manifest.json'} does not exist; "
            f"reinstall sam3track, or regenerate the bundle from a repository checkout with "
            f"`pip install -e '.[export]' && {REGENERATE_COMMAND}`"
        )
    return path
