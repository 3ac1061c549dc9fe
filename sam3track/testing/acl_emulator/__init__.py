"""A strict in-process emulator of the pyacl `acl` module (Ascend runtime), for tests without hardware.

`install(**rules)` puts a fresh fake `acl` (with acl.rt / acl.mdl / acl.util) into sys.modules and
yields the `Emulator`; `pytest_fixture(**rules)` wraps it as a fixture. Usage, the rules it enforces,
its switches, its stats and what it does not emulate: docs/ascend.md, "Using the emulator".
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from . import constants
from .constants import *  # noqa: F401,F403
from .memory import AclError, EmulatorError
from .models import MAGIC, OmModel, parse_fake_om
from .runtime import Emulator, Rules, Stats

__all__ = ["install", "pytest_fixture", "Emulator", "Rules", "Stats", "AclError", "EmulatorError",
           "MAGIC", "OmModel", "parse_fake_om", "constants"]

_NAMES = ("acl", "acl.rt", "acl.mdl", "acl.util")


@contextmanager
def install(**rules):
    """Put a fresh fake `acl` into sys.modules for the duration; yields the Emulator."""
    emu = Emulator(**rules)
    saved = {n: sys.modules.get(n) for n in _NAMES}
    sys.modules["acl"] = emu.acl
    for n in ("rt", "mdl", "util"):
        sys.modules[f"acl.{n}"] = getattr(emu.acl, n)
    try:
        yield emu
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def pytest_fixture(**rules):
    """A pytest fixture (function scope) yielding an installed Emulator: `acl_emu = pytest_fixture()`."""
    import pytest

    @pytest.fixture
    def acl_emu():
        with install(**rules) as emu:
            yield emu

    return acl_emu
