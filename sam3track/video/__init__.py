"""Reading frames (video files, image folders, arrays) and writing mask videos."""

from sam3track.video.array import ArraySource, frames_from_array
from sam3track.video.image_folder import ImageFolderSource, open_image_folder
from sam3track.video.reader import open_source
from sam3track.video.source import DecodedFrame, FrameSource
from sam3track.video.video_file import VideoReader, open_video
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
