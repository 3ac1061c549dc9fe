"""Saving tracking results: a JSON file with COCO RLE masks, or a folder of id-valued PNGs.

Both sinks take one :class:`FrameResult` per :meth:`write` call and are context managers. Both
are safe to interrupt, and neither ever puts a partial result under the name asked for: the JSON
file is built under a temporary name and, when the run stops early, finalised into valid JSON
(marked ``"complete": false``) named ``<stem>.interrupted.json``; the PNGs are written into a
staging folder ``<dir>.<pid>.<random>.partial``, moved into the folder when the run completes and
left as ``<dir>.interrupted`` when it stops early. Each sink locks its output while open
(:mod:`sam3track.output_lock`), so a second writer of the same path fails at once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, TextIO

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from sam3track.atomic_files import (
    FinishedOnExit,
    finish_partial,
    interrupted_folder,
    partial_path,
    partial_pattern,
    remove_stale_files,
    stale_partials,
    write_bytes_atomic,
)
from sam3track.errors import VideoError
from sam3track.output_lock import OutputLock
from sam3track.results import FrameResult

log = logging.getLogger(__name__)

JSON_FORMAT = "sam3track.frames"
JSON_VERSION = 1


def encode_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE of one ``[H, W]`` mask as JSON-ready ``{"size": [H, W], "counts": str}``."""
    rle = mask_utils.encode(np.asfortranarray(mask, dtype=np.uint8))  # pycocotools wants F order
    return {"size": [int(rle["size"][0]), int(rle["size"][1])], "counts": rle["counts"].decode()}


def _encode_many(masks: np.ndarray) -> list[dict[str, Any]]:
    if masks.shape[0] == 0:
        return []
    # One call for all objects: [N, H, W] -> Fortran-ordered [H, W, N].
    stacked = np.asfortranarray(np.transpose(masks, (1, 2, 0)), dtype=np.uint8)
    return [
        {"size": [int(r["size"][0]), int(r["size"][1])], "counts": r["counts"].decode()}
        for r in mask_utils.encode(stacked)
    ]


def decode_rle(obj: dict[str, Any]) -> np.ndarray:
    """Bool ``[H, W]`` mask from an RLE dict, or from a JSON object entry holding ``"mask"``."""
    rle = obj["mask"] if "mask" in obj else obj
    counts = rle["counts"]
    if isinstance(counts, list):  # uncompressed COCO RLE, as other tools may write it
        h, w = rle["size"]
        rle = mask_utils.frPyObjects(rle, h, w)
    else:
        counts = counts.encode() if isinstance(counts, str) else counts
        rle = {"size": list(rle["size"]), "counts": counts}
    with warnings.catch_warnings():
        # pycocotools' Cython array predates NumPy 2's __array__(copy=...) protocol and warns
        # on every decode; the result is correct, the warning is noise for our users.
        warnings.filterwarnings(
            "ignore", message="__array__ implementation", category=DeprecationWarning
        )
        return np.asarray(mask_utils.decode(rle)).astype(bool)


def _finite(value: float) -> float | None:
    # json would write NaN/Infinity, which is not JSON; null keeps the file loadable anywhere.
    value = float(value)
    return value if math.isfinite(value) else None


class JsonSink(FinishedOnExit):
    """All frames' objects in one JSON file, written incrementally.

    Layout::

        {"format": "sam3track.frames", "version": 1, "metadata": {...},
         "frames": [{"frame_index": 0, "height": H, "width": W,
                     "objects": [{"object_id": 1, "prompt": "person", "score": 0.93,
                                  "box_xyxy": [x0, y0, x1, y1],
                                  "mask": {"size": [H, W], "counts": "<COCO RLE>"}}]}, ...],
         "num_frames": n, "complete": true}

    Frames are appended to ``<name>.<pid>.<random>.partial`` as they come (flushed each time),
    and ``close`` closes the list and renames the file onto ``path``, removing the
    ``<stem>.interrupted.json`` an earlier run left. ``close(complete=False)`` (what
    ``__exit__`` does on an exception or Ctrl-C) finalises the same way with
    ``"complete": false`` but renames it to ``<stem>.interrupted.json`` beside ``path``, so an
    interrupted run leaves valid JSON with the frames done and never replaces a complete file
    at ``path``; with no frame done it leaves nothing.

    ``path`` is locked from here to ``close`` (:class:`~sam3track.output_lock.OutputLock`;
    :class:`~sam3track.errors.OutputBusyError` while another writer holds it); ``lock``: one
    already taken for ``path``, which the sink then releases on ``close``.
    """

    def __init__(self, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None, *,
                 lock: OutputLock | None = None):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise VideoError(
                f"cannot write {self.path}: folder {self.path.parent} does not exist; create it"
            )
        self.frames_written = 0
        self.result: Path | None = None  # where close() left the file, if anywhere
        self._closed = False
        self._lock = lock if lock is not None else OutputLock.acquire(self.path)
        try:
            if self._lock.held:
                remove_stale_files(self.path, log)
            self._tmp = partial_path(self.path)
            self._file: TextIO = self._start(metadata)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, metadata: dict[str, Any] | None) -> TextIO:
        try:
            file = open(self._tmp, "w", encoding="utf-8")
        except OSError as e:
            raise VideoError(f"cannot write {self._tmp}: {e}") from e
        try:
            head = {"format": JSON_FORMAT, "version": JSON_VERSION, "metadata": metadata or {}}
            # Write the header object without its closing brace, then open the frames list.
            file.write(json.dumps(head)[:-1] + ', "frames": [\n')
        except OSError as e:
            file.close()
            self._tmp.unlink(missing_ok=True)
            raise VideoError(f"cannot write {self._tmp}: {e}") from e
        return file

    @staticmethod
    def frame_to_dict(result: FrameResult) -> dict[str, Any]:
        """The JSON entry of one frame (also handy for callers that build JSON themselves)."""
        masks = _encode_many(np.asarray(result.masks, dtype=bool))
        objects = []
        for i in range(len(result)):
            objects.append(
                {
                    "object_id": int(result.object_ids[i]),
                    "prompt": result.prompts[i] if i < len(result.prompts) else "",
                    "score": _finite(result.scores[i]),
                    "box_xyxy": [_finite(v) for v in result.boxes_xyxy[i]],
                    "mask": masks[i],
                }
            )
        return {
            "frame_index": int(result.frame_index),
            "height": result.height,
            "width": result.width,
            "objects": objects,
        }

    def write(self, result: FrameResult) -> None:
        if self._closed:
            raise VideoError(f"{self.path} is already closed; open a new JsonSink")
        text = json.dumps(self.frame_to_dict(result), separators=(",", ":"))
        try:
            self._file.write(("" if self.frames_written == 0 else ",\n") + text)
            self._file.flush()
        except OSError as e:
            raise VideoError(
                f"cannot write frame {result.frame_index} to {self._tmp}: {e}; check disk space"
            ) from e
        self.frames_written += 1

    def close(self, complete: bool = True) -> Path | None:
        """Finish the JSON and rename it onto :attr:`path`. Returns the path, or None on failure
        of an incomplete close (logged, so the interrupting exception stays the one raised)."""
        if self._closed:
            return self.result
        self._closed = True
        try:
            self.result = self._finish(complete)
        finally:
            self._lock.release()
        return self.result

    def _finish(self, complete: bool) -> Path | None:
        if not complete and self.frames_written == 0:  # an empty file would only mislead
            self._file.close()
            self._tmp.unlink(missing_ok=True)
            return None
        tail = f'\n], "num_frames": {self.frames_written}, "complete": {json.dumps(complete)}}}\n'
        try:
            self._file.write(tail)
            self._file.close()
            holds = f"{self.frames_written} frames done"
            return finish_partial(self._tmp, self.path, complete=complete, log=log, holds=holds)
        except OSError as e:
            self._file.close()
            self._tmp.unlink(missing_ok=True)
            if complete:
                raise VideoError(f"cannot finish {self.path}: {e}; check disk space") from e
            log.warning("cannot finish %s after an interruption: %s", self.path, e)
            return None


# What the sink itself puts in its staging folder: a stale one holding only these is ours to clear.
_STAGED_NAME = re.compile(r"\d{6}\.png(" + partial_pattern("") + ")?")


def _only_staged_pngs(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding only what this sink writes (ours to delete)."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    return all(_STAGED_NAME.fullmatch(p.name) for p in folder.iterdir())


class MasksDirSink(FinishedOnExit):
    """One indexed PNG per frame, ``<dir>/<frame_index:06d>.png``.

    Pixel value = object id + ``id_offset`` (0 = background); where objects overlap, the later
    object in the result wins. A frame is written as 8-bit PNG when its largest value fits in
    255 and as 16-bit otherwise; read them with ``cv2.imread(p, cv2.IMREAD_UNCHANGED)`` (or
    PIL), which keeps the values. A value must lie in 1..65535: pass ``id_offset=1`` if object
    ids start at 0, so object 0 is not mistaken for background.

    PNGs are written into the staging folder ``<dir>.<pid>.<random>.partial`` beside ``dir``, so
    ``dir`` only ever holds the masks of complete runs. ``close()`` moves each PNG into ``dir``
    (replacing same-named files, keeping any others) and removes the ``<dir>.interrupted`` an
    earlier run left; ``close(complete=False)`` (what ``__exit__`` does on an exception or Ctrl-C)
    renames the staging folder to ``<dir>.interrupted`` instead, replacing an older one, or removes
    it when no frame was written. ``dir`` is locked while the sink is open, as :class:`JsonSink`'s
    file is (``lock``: one already taken for ``dir``).
    """

    def __init__(self, directory: str | os.PathLike[str], id_offset: int = 0, *,
                 lock: OutputLock | None = None) -> None:
        self.directory = Path(directory)
        self.id_offset = int(id_offset)
        self.frames_written = 0
        self.result: Path | None = None  # where close() left the PNGs, if anywhere
        self._closed = False
        self._lock = lock if lock is not None else OutputLock.acquire(self.directory, make_parents=True)
        self.staging = partial_path(self.directory)
        try:
            if self._lock.held:
                self._clear_stale_staging()
            self.staging.mkdir(parents=True)
        except OSError as e:
            self._lock.release()
            raise VideoError(
                f"cannot create the staging folder {self.staging} for the masks folder "
                f"{self.directory}: {e}"
            ) from e
        except BaseException:
            self._lock.release()
            raise

    def _clear_stale_staging(self) -> None:
        """Remove the staging folders killed runs left, but never a folder of someone else's."""
        for stale in stale_partials(self.directory):
            if _only_staged_pngs(stale):
                shutil.rmtree(stale, ignore_errors=True)
                log.info("removed %s, left by a run that was killed", stale)
            else:
                log.warning("left %s alone: it holds files sam3track did not write", stale)

    def path_for(self, frame_index: int) -> Path:
        """Where frame ``frame_index``'s PNG lands once the run completes."""
        return self.directory / f"{int(frame_index):06d}.png"

    def label_image(self, result: FrameResult) -> np.ndarray:
        """The ``[H, W]`` id image written for ``result`` (uint8 or uint16)."""
        values = result.object_ids.astype(np.int64) + self.id_offset
        if values.size and (values.min() < 1 or values.max() > 65535):
            bad = int(result.object_ids[(values < 1) | (values > 65535)][0])
            raise VideoError(
                f"frame {result.frame_index}: object id {bad} + id_offset {self.id_offset} is "
                f"outside 1..65535, which a PNG label image can hold (0 is background); "
                f"use id_offset=1 for ids starting at 0, or the JSON sink"
            )
        dtype = np.uint8 if not values.size or values.max() <= 255 else np.uint16
        labels = np.zeros((result.height, result.width), dtype)
        for value, mask in zip(values, result.masks):
            labels[np.asarray(mask, dtype=bool)] = value  # later objects overwrite earlier ones
        return labels

    def write(self, result: FrameResult) -> None:
        if self._closed:
            raise VideoError(f"{self.directory} is already closed; open a new MasksDirSink")
        path = self.staging / self.path_for(result.frame_index).name
        ok, data = cv2.imencode(".png", self.label_image(result))
        if not ok:
            raise VideoError(f"cannot encode the mask PNG for frame {result.frame_index}")
        try:
            # Atomic even in staging: an interrupted run's folder must hold only whole images.
            write_bytes_atomic(path, data.tobytes())
        except OSError as e:
            raise VideoError(
                f"cannot write {path} (frame {result.frame_index}): {e}; check disk space"
            ) from e
        self.frames_written += 1

    def close(self, complete: bool = True) -> Path | None:
        """Move the PNGs into :attr:`directory` (complete) or leave them in ``<dir>.interrupted``
        (stopped early); returns that folder, or None when nothing was kept (incomplete close,
        which never raises, so the exception that stopped the run is the one seen)."""
        if self._closed:
            return self.result
        self._closed = True
        try:
            self.result = self._close(complete)
        finally:
            self._lock.release()
        return self.result

    def _close(self, complete: bool) -> Path | None:
        if complete:
            return self._move_into_place()
        try:
            if self.frames_written == 0:
                shutil.rmtree(self.staging)
                return None
            return self._keep_as_interrupted()
        except OSError as e:
            log.warning("cannot keep the masks of %s after an interruption: %s", self.directory, e)
        return None

    def _move_into_place(self) -> Path:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for png in sorted(self.staging.glob("*.png")):
                os.replace(png, self.directory / png.name)
            self.staging.rmdir()
        except OSError as e:
            # Whatever is still staged is complete-run output too: keep it, named as partial.
            kept = None
            if self.staging.exists():
                try:
                    kept = self._keep_as_interrupted()
                except OSError:
                    kept = self.staging
            where = f"; the masks not moved are in {kept}" if kept is not None else ""
            raise VideoError(f"cannot move the masks into {self.directory}: {e}{where}") from e
        leftover = interrupted_folder(self.directory)
        if _only_staged_pngs(leftover):  # an earlier run's part, superseded now
            shutil.rmtree(leftover, ignore_errors=True)
        return self.directory

    def _keep_as_interrupted(self) -> Path:
        target = interrupted_folder(self.directory)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # an older interrupted run's masks: this run's replace them
        elif os.path.lexists(target):
            target.unlink()
        os.replace(self.staging, target)
        log.warning("run interrupted: %s holds the masks of the %d frames done", target,
                    self.frames_written)
        return target
