"""The demo bundle: a small SAM 3 with RANDOM weights, shipped inside the package.

It lets ``sam3track demo`` and the notebooks run straight after ``pip install``, without torch or the
real checkpoint; its masks show the machinery, not the model's skill. What it holds and how to
regenerate it: docs/api.md, "The demo bundle".
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
