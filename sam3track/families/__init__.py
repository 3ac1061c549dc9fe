"""Model families: what differs between SAM 3 and SAM 3.1 bundles, chosen once from the manifest.

A family says which graphs and manifest keys its bundles need, builds the one configuration object
from the manifest, and makes the sessions. The predictor asks `family_of(manifest)` once and never
branches on the family name again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

SAM3, SAM31 = "sam3", "sam3.1"


@dataclass(frozen=True)
class Family:
    name: str
    required_graphs: tuple[str, ...]
    required_keys: tuple[tuple[str, ...], ...]
    config_from_manifest: Callable  # (manifest, **overrides) -> config
    session_class: Callable  # () -> the Session class
    check_geometry: bool  # the bundle's SAM 3 geometry checks apply


def family_of(manifest: dict) -> Family:
    """The family of a manifest ("family" absent means SAM 3); BundleError for any other name."""
    from ..errors import BundleError

    name = manifest.get("family", SAM3)
    if name == SAM3:
        from ..bundle import REQUIRED_GRAPHS, REQUIRED_KEYS
        from ..config import TrackerConfig

        def session():
            from ..session import Session
            return Session

        return Family(SAM3, REQUIRED_GRAPHS, REQUIRED_KEYS, TrackerConfig.from_manifest, session, True)
    if name == SAM31:
        from .sam31 import config

        def session():
            from .sam31.session import Sam31Session
            return Sam31Session

        return Family(SAM31, config.REQUIRED_GRAPHS, config.REQUIRED_KEYS, config.Sam31Config.from_manifest,
                      session, False)
    raise BundleError(f"the manifest names model family {name!r}; this sam3track runs {SAM3!r} and {SAM31!r} "
                      "bundles")
