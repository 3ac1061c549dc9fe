"""What the page downloads from a session's outputs: the mask video, the JSON (COCO RLE) and a zip of
PNG masks, written by the same classes as ``sam3track track`` into a folder of the server's own."""

from __future__ import annotations

import zipfile
from pathlib import Path

from sam3track.jobs.track import MASK_ID_OFFSET
from sam3track.render import draw_objects
from sam3track.results import FrameResult
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.video import MaskVideoWriter, open_source

from .wire import result_from_wire

DOWNLOADS = {
    "masks.mp4": "video/mp4",
    "results.json": "application/json",
    "masks.zip": "application/zip",
}


def write_download(kind: str, video: Path, name: str, outputs: dict[int, dict], folder: Path) -> Path:
    """The file ``kind`` (a key of DOWNLOADS) for ``outputs`` (frame -> JSON outputs), in ``folder``."""
    with open_source(video) as reader:
        h, w = reader.height, reader.width
        results = [result_from_wire(f, outputs[f], h, w) for f in sorted(outputs)]
        if kind == "masks.mp4":
            return _video(reader, results, folder / kind)
    if kind == "results.json":
        return _json(results, name, folder / kind)
    return _pngs(results, folder)


def _video(reader, results: list[FrameResult], path: Path) -> Path:
    """Every frame from the first with outputs to the last, masks drawn (as ``sam3track track``)."""
    by_frame = {r.frame_index: r for r in results}
    first, last = results[0].frame_index, results[-1].frame_index
    offset = reader.pts(first)  # the video starts at time 0, spacing kept
    with MaskVideoWriter.like(path, reader) as writer:
        for frame in reader.frames(first, last + 1):
            result = by_frame.get(frame.index) or FrameResult.empty(frame.index, reader.height, reader.width)
            writer.write(draw_objects(frame.rgb, result), pts=frame.pts - offset, time_base=frame.time_base)
    return path


def _json(results: list[FrameResult], name: str, path: Path) -> Path:
    with JsonSink(path, metadata={"video": name, "written_by": "sam3track serve"}) as sink:
        for result in results:
            sink.write(result)
    return path


def _pngs(results: list[FrameResult], folder: Path) -> Path:
    masks = folder / "masks"
    with MasksDirSink(masks, id_offset=MASK_ID_OFFSET) as sink:
        for result in results:
            sink.write(result)
    archive = folder / "masks.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:  # PNGs are compressed already
        for png in sorted(masks.glob("*.png")):
            zipped.write(png, f"masks/{png.name}")
    return archive
