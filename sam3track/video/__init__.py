"""Reading frames (video files, image folders, arrays) and writing mask videos."""

from sam3track.video.reader import (
    ArraySource,
    DecodedFrame,
    FrameSource,
    ImageFolderSource,
    VideoReader,
    frames_from_array,
    open_image_folder,
    open_source,
    open_video,
)
from sam3track.video.writer import MaskVideoWriter

__all__ = [
    "ArraySource",
    "DecodedFrame",
    "FrameSource",
    "ImageFolderSource",
    "MaskVideoWriter",
    "VideoReader",
    "frames_from_array",
    "open_image_folder",
    "open_source",
    "open_video",
]
