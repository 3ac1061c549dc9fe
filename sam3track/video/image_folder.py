"""A folder of images read as a video with OpenCV, one frame per file in natural name order."""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from sam3track.errors import VideoError
from sam3track.video.source import DEFAULT_FPS, FixedRateSource

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})


def _natural_key(name: str) -> list[Any]:
    # "frame2.jpg" before "frame10.jpg"; zero-padded names sort the same as plain sorting.
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


class ImageFolderSource(FixedRateSource):
    """A folder of images (jpg/jpeg/png/bmp/webp), one frame per file in natural name order."""

    _first_name = "the first image"

    def __init__(self, path: str | os.PathLike[str], fps: float | Fraction = DEFAULT_FPS) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        if not self.path.exists():
            raise VideoError(f"image folder not found: {self.name}; check the path")
        if not self.path.is_dir():
            raise VideoError(f"{self.name} is not a folder; use open_video() for a video file")
        files = [
            p for p in self.path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not files:
            raise VideoError(
                f"{self.name} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); "
                f"pass a folder of frames"
            )
        self.files = sorted(files, key=lambda p: _natural_key(p.name))
        super().__init__(fps)
        first = self._load(0)
        self._height, self._width = first.shape[:2]

    def _load(self, index: int) -> np.ndarray:
        file = self.files[index]
        # imdecode of the raw bytes rather than imread: imread silently returns None for
        # unreadable files and mishandles some non-ASCII paths on Windows.
        try:
            data = np.fromfile(file, dtype=np.uint8)
        except OSError as e:
            raise VideoError(f"cannot read image {file} (frame {index}): {e}") from e
        bgr = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
        if bgr is None:
            raise VideoError(
                f"cannot decode image {file} (frame {index}); the file is damaged or not an "
                f"image, replace or remove it"
            )
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    def __len__(self) -> int:
        return len(self.files)

    def _frame_name(self, index: int) -> str:
        return f"image {self.files[index]} (frame {index})"


def open_image_folder(
    path: str | os.PathLike[str], fps: float | Fraction = DEFAULT_FPS
) -> ImageFolderSource:
    """Open a folder of images as a video; ``fps`` only sets the timing of written outputs."""
    return ImageFolderSource(path, fps)
