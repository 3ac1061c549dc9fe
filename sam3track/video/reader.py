"""Opening frames from any input: a video file, a folder of images, or an in-memory array.

:func:`open_source` picks the reader; all of them expose the same small interface
(:class:`~sam3track.video.source.FrameSource`) so the predictor never cares where frames come
from. The readers themselves live in :mod:`~sam3track.video.video_file`,
:mod:`~sam3track.video.image_folder` and :mod:`~sam3track.video.array`; their names are
re-exported here, where they used to be defined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sam3track.video.array import ArraySource, frames_from_array
from sam3track.video.image_folder import IMAGE_SUFFIXES, ImageFolderSource, open_image_folder
from sam3track.video.source import DEFAULT_FPS, DecodedFrame, FrameSource
from sam3track.video.video_file import VideoReader, open_video

__all__ = [
    "DEFAULT_FPS",
    "IMAGE_SUFFIXES",
    "ArraySource",
    "DecodedFrame",
    "FrameSource",
    "ImageFolderSource",
    "VideoReader",
    "frames_from_array",
    "open_image_folder",
    "open_source",
    "open_video",
]


def open_source(
    source: str | os.PathLike[str] | np.ndarray | Sequence[np.ndarray] | FrameSource,
) -> FrameSource:
    """A video file, an image folder, an array of frames, or an existing source, as a source."""
    if isinstance(source, FrameSource):
        return source
    if isinstance(source, (str, os.PathLike)):
        return open_image_folder(source) if Path(source).is_dir() else open_video(source)
    return frames_from_array(source)
