"""Server-side videos for ``sam3track serve``: only paths under ``--root``, with no traversal and no
symlink leading out of it (each path is resolved, then checked to lie inside the resolved root)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path, PurePosixPath

from sam3track.errors import shown
from sam3track.video.writer import READABLE_SUFFIXES

from .sessions import ServeError

VIDEO_SUFFIXES = READABLE_SUFFIXES  # what the page opens: what batch takes
MAX_LISTED = 500  # a root holding a whole disk still answers quickly


class VideoRoot:
    """The folder ``--root`` names (None: the server reads no server-side path, only uploads)."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(os.path.realpath(root)) if root is not None else None

    def resolve(self, name) -> Path:
        """``name`` (relative to the root, '/'-separated) as a real path inside the root; ServeError
        (403, 404) naming what is wrong otherwise."""
        if self.root is None:
            raise ServeError(403, "this server was started without --root, so it opens no server-side path; "
                                  "upload the video instead (POST /api/upload)")
        if not isinstance(name, str) or not name.strip() or "\0" in name:
            raise ServeError(400, f"resource_path must be a path relative to the server's root, not {shown(name)}")
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise ServeError(403, f"resource_path {shown(name)} must be relative to the server's root, without "
                                  "'..' (it names a video under --root, e.g. 'clips/bikes.mp4')")
        full = Path(os.path.realpath(self.root.joinpath(*relative.parts)))
        if not self.contains(full):
            raise ServeError(403, f"resource_path {shown(name)} leads outside the server's root (through a "
                                  "symlink); only videos under --root can be opened")
        if not full.exists():
            raise ServeError(404, f"resource_path {shown(name)}: no such file or folder under the server's root; "
                                  "GET /api/videos lists them")
        return full

    def contains(self, path: Path) -> bool:
        return os.path.commonpath([str(path), str(self.root)]) == str(self.root)

    def videos(self) -> list[dict]:
        """Video files under the root (symlinks followed only where they stay inside it), by path."""
        if self.root is None:
            return []
        return sorted(itertools.islice(self._video_files(), MAX_LISTED), key=lambda v: v["path"])

    def _video_files(self):
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # os.walk enters no symlinked folder
            for name in sorted(files):
                path = Path(folder, name)
                if path.suffix.lower() in VIDEO_SUFFIXES and self.contains(Path(os.path.realpath(path))):
                    yield {"path": path.relative_to(self.root).as_posix(), "bytes": path.stat().st_size}
