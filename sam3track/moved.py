"""Old import paths of modules that moved into a family, kept working with a DeprecationWarning.

`import sam3track.session` (and the others below) gives the module at its new place; the finder is
installed by sam3track/__init__.py. Names that left a core module that stays (memory_bank, config)
are served by that module's own `__getattr__`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module -> where it lives now
MOVED_MODULES = {
    "sam3track.session": "sam3track.families.sam3.session",
    "sam3track.frame_loop": "sam3track.families.sam3.frame_loop",
    "sam3track.planning": "sam3track.families.sam3.planning",
    "sam3track.association": "sam3track.families.sam3.association",
    "sam3track.objects": "sam3track.families.sam3.objects",
    "sam3track.text_prompts": "sam3track.families.sam3.text_prompts",
    "sam3track.interactive": "sam3track.families.sam3.clicks",
}


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in a later release)",
                  DeprecationWarning, stacklevel=stacklevel)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:
        pass  # the module at its new place is already executed


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        warn_moved(fullname, new)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def moved_attribute(module: str, name: str, moved: dict[str, str]):
    """A core module's `__getattr__` for names that moved into a family (`moved`: name -> new module)."""
    if name not in moved:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_moved(f"{module}.{name}", f"{moved[name]}.{name}", stacklevel=4)
    return getattr(importlib.import_module(moved[name]), name)
