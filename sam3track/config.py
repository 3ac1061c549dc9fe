"""Configuration checks every family's config shares; each family's config object is its own
(families/sam3/config.py: TrackerConfig, families/sam31/config.py: Sam31Config), filled from the bundle
manifest."""

from __future__ import annotations

from .errors import Sam3TrackError


class ConfigError(Sam3TrackError, TypeError):
    """An unknown configuration option, or a value of the wrong type."""


def check_override_names(overrides: dict, fields, family: str, config_class: str) -> None:
    """Every family's first check of ``sam3track.load`` keywords: each names a field of its config.
    ``family``: " for a SAM 3.1 bundle" or "" in messages."""
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"unknown configuration options {unknown}{family}; the names are the fields of "
                          f"{config_class}")


def refuse_fixed(name: str, fixed) -> None:
    """An override of a value the exported graphs fix (each family's FIXED_BY_MODEL) is refused."""
    if name in fixed:
        raise ConfigError(f"configuration option {name} is fixed by the exported graphs and cannot be "
                          "overridden; export the checkpoint again to change it")


# names that moved into the SAM 3 family, served with a DeprecationWarning (sam3track/moved.py)
_MOVED = {name: 'sam3track.families.sam3.config' for name in ('TrackerConfig', 'FIXED_BY_MODEL')}


def __getattr__(name: str):
    from .moved import moved_attribute

    return moved_attribute(__name__, name, _MOVED)
