"""Model families: what differs between SAM 3 and SAM 3.1 bundles, chosen once from the manifest.

A family says which graphs and manifest keys its bundles need, builds the one configuration object
from the manifest, and makes the sessions. `family_of(manifest)` looks the manifest's "family" up in
FAMILIES; the predictor asks it once and never branches on the family name again. Adding a family is
one entry there and its package beside ``sam3/`` and ``sam31/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import BundleError

SAM3, SAM31 = "sam3", "sam3.1"


@dataclass(frozen=True)
class Family:
    name: str
    required_graphs: tuple[str, ...]
    required_keys: tuple[tuple[str, ...], ...]
    config_from_manifest: Callable  # (manifest, **overrides) -> config
    session_class: Callable  # () -> the Session class (imported on first use: loading a bundle needs none)
    check_geometry: bool  # the bundle's SAM 3 geometry checks apply
    # graphs a text-prompted first frame may not run (clicks, boxes, births): a load checks them and
    # makes their session at their first run (backends/compile_cache.py)
    deferred_graphs: tuple[str, ...] = ()
    # graphs run only when a prompt is added (the text encoder: a third of the full-size weights), which
    # a backend that reopens them quickly frees after each run (backends/compile_cache.py, `released`)
    released_graphs: tuple[str, ...] = ()


def _sam3() -> Family:
    from . import sam3
    from .sam3.config import TrackerConfig

    def session():
        from .sam3.session import Sam3Session
        return Sam3Session

    return Family(SAM3, sam3.REQUIRED_GRAPHS, sam3.REQUIRED_KEYS, TrackerConfig.from_manifest, session, True,
                  ("interactive_decoder", "mask_init"), ("text_encoder",))


def _sam31() -> Family:
    from .sam31 import config

    def session():
        from .sam31.session import Sam31Session
        return Sam31Session

    return Family(SAM31, config.REQUIRED_GRAPHS, config.REQUIRED_KEYS, config.Sam31Config.from_manifest,
                  session, False, ("interactive_decoder", "mask_init", "box_grounding_head"), ("text_encoder",))


# manifest "family" -> its Family (absent means SAM 3: bundles from before SAM 3.1 carry no name)
FAMILIES: dict[str, Callable[[], Family]] = {SAM3: _sam3, SAM31: _sam31}


def family_of(manifest: dict) -> Family:
    """The family of a manifest ("family" absent means SAM 3); BundleError for any other name."""
    name = manifest.get("family", SAM3)
    if name not in FAMILIES:
        raise BundleError(f"the manifest names model family {name!r}; this sam3track runs "
                          f"{' and '.join(map(repr, FAMILIES))} bundles")
    return FAMILIES[name]()
