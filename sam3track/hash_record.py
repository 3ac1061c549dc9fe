"""The sha256s a load has already computed for a bundle's files, so that the next load of an unchanged
bundle checks its manifest without reading gigabytes again.

One JSON file per bundle folder in the user cache (user_cache.py): file -> (size, mtime_ns, ctime_ns,
inode, sha256). A file whose stat differs in any of those is hashed again; a record is a convenience
against corruption in transit or on disk, not a defence against someone who forges a file's times.
Unreadable or unwritable records are a miss, never an error.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .user_cache import cache_folder, read_json, write_json


def _stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class HashRecord:
    """The recorded sha256s of the files of one folder; `sha256(path, compute)` answers from the record
    when the file's stat is unchanged, else computes (and records) it."""

    def __init__(self, folder: Path, setting=None):
        self.given = Path(folder)  # files are named relative to it (a symlinked graph may resolve elsewhere)
        self.folder = self.given.resolve()
        root = cache_folder(setting)
        key = hashlib.sha256(str(self.folder).encode()).hexdigest()[:32]
        self.path = root / "hashes" / f"{key}.json" if root is not None else None
        record = read_json(self.path) if self.path is not None else None
        self.files: dict = record.get("files", {}) if record and record.get("folder") == str(self.folder) else {}
        self.changed = False

    def known(self, path: Path) -> str | None:
        """The recorded sha256 of `path` when its stat is what it was then, else None."""
        entry = self.files.get(self._name(path))
        try:
            if isinstance(entry, list) and len(entry) == 5 and entry[:4] == _stamp(path):
                return entry[4]
        except OSError:
            pass
        return None

    def sha256(self, path: Path, compute) -> str:
        digest = self.known(path)
        if digest is None:
            stamp = _stamp(path)
            digest = compute(path)
            if _stamp(path) == stamp:  # not recorded when the file changed while it was read
                self.files[self._name(path)] = stamp + [digest]
                self.changed = True
        return digest

    def _name(self, path: Path) -> str:
        return Path(path).relative_to(self.given).as_posix()

    def save(self) -> None:
        if self.path is not None and self.changed:
            write_json(self.path, {"folder": str(self.folder), "files": self.files})
            self.changed = False
