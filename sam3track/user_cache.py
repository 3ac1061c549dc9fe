"""The per-user cache folder of what loading a bundle can reuse: graphs optimised or compiled by a runtime
(backends/compile_cache.py) and records of bundles whose sha256 was checked (bundle.py).

Folder: compiled/ in sam3track's cache folder: $SAM3TRACK_CACHE, else $XDG_CACHE_HOME/sam3track, else
~/.cache/sam3track (the folder backend="auto" keeps its verdicts in too).
SAM3TRACK_COMPILE_CACHE=0 turns the cache off for a process (load(compile_cache=False) for one load).
Every file goes in by rename, so a reader sees a whole entry or none; an unreadable entry is a miss.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

ENV_FOLDER = "SAM3TRACK_CACHE"
ENV_SWITCH = "SAM3TRACK_COMPILE_CACHE"


def default_folder() -> Path:
    if os.environ.get(ENV_FOLDER):
        return Path(os.environ[ENV_FOLDER]).expanduser() / "compiled"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sam3track" / "compiled"


def cache_folder(setting=None) -> Path | None:
    """The folder a load caches into, or None for no cache. setting: None (on, unless the environment
    says SAM3TRACK_COMPILE_CACHE=0), False (off), True (on), or a folder to use instead."""
    if setting is None:
        setting = os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")
    if setting is False:
        return None
    if setting is True:
        return default_folder()
    if isinstance(setting, (str, os.PathLike)):
        return Path(setting).expanduser()
    from .errors import Sam3TrackError

    raise Sam3TrackError(f"compile_cache must be True, False, None or a folder path; not {setting!r}")


def read_json(path: Path) -> dict | None:
    """A JSON object from the cache, or None when absent or unreadable (a miss, never an error)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict) -> bool:
    """Write `value` to `path` by rename (readers never see half a file); False when the folder cannot be
    written (a read-only home): the cache is an optimisation, never a reason to fail a load."""
    path = Path(path)
    temp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(json.dumps(value, sort_keys=True))
        os.replace(temp, path)
        return True
    except OSError:
        try:
            temp.unlink()
        except OSError:
            pass
        return False
