"""The videos of a batch and the names of their outputs: files, folders and ``.txt`` lists, local
or in an object store, each made absolute once by the driver; the output folder is never an input.
Names and rules: docs/batch.md."""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path

from sam3track.batch import storage
from sam3track.errors import UsageError
from sam3track.video.writer import READABLE_SUFFIXES

OUTPUT_KINDS = ("mp4", "json", "png")
INPUT_SUFFIXES = READABLE_SUFFIXES


def _is_video(location: str) -> bool:
    return os.path.splitext(location)[1].lower() in INPUT_SUFFIXES


def _listed(listing: str) -> list[str]:
    """The paths a ``.txt`` list names, one a line, relative ones against the list's folder."""
    found = []
    for line in (storage.read_text(listing) or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if storage.is_url(line) or os.path.isabs(os.path.expanduser(line)):
            found.append(storage.absolute(line))
        else:
            found.append(storage.absolute(storage.join(storage.parent(listing), line)))
    return found


def _expand(item: str) -> list[str]:
    """One input: a video, every video under a folder (or URL prefix), or the videos a list names."""
    if storage.is_url(item):
        if item.lower().endswith(".txt") and storage.exists(item):
            return _listed(item)
        found = storage.find_files(item)
        if found is None:
            raise UsageError(f"input not found: {item}")
        return [url for url in found if url == item or _is_video(url)]
    path = Path(item)
    if path.is_dir():
        with storage.failing_as_usage("search", item):  # a subfolder it may not read
            return sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in INPUT_SUFFIXES)
    if path.suffix.lower() == ".txt" and path.is_file():
        return _listed(item)
    if path.exists():
        return [item]
    raise UsageError(f"input not found: {item}")


def find_videos(inputs: Iterable[str | os.PathLike[str]], exclude: str | None = None) -> list[str]:
    """Absolute paths and URLs of every video of ``inputs``, each once, in the order found; none that
    lies under ``exclude`` (the output folder: a re-run must not track its own outputs)."""
    videos: list[str] = []
    seen: set[str] = set()
    for item in inputs:
        for video in _expand(storage.absolute(item)):
            video = storage.absolute(video)
            if video in seen or (exclude is not None and storage.inside(video, exclude)):
                continue
            seen.add(video)
            videos.append(video)
    return videos


def collect_inputs(inputs: Iterable[str | os.PathLike[str]],
                   exclude: str | os.PathLike[str] | None = None) -> list[Path | str]:
    """Video files as given, folders searched recursively by video suffix (sorted), and ``.txt``
    files read as one path a line (relative to the list's folder; blank and ``#`` lines skipped).
    Absolute :class:`Path` objects (URL strings for objects in a store), each once, in the order found,
    none under ``exclude``. A missing input raises :class:`UsageError`."""
    skip = storage.absolute(exclude) if exclude is not None else None
    return [v if storage.is_url(v) else Path(v) for v in find_videos(inputs, skip)]


def no_videos_message(inputs: Sequence[str | os.PathLike[str]], out: str) -> str:
    """Why a batch has nothing to do, and what was looked for."""
    named = ", ".join(str(i) for i in inputs)
    return (f"no videos found in {named}: looked for files ending {' '.join(INPUT_SUFFIXES)} (folders "
            f"searched recursively, .txt files read as lists of paths), leaving out the output folder "
            f"{out}; give video files or folders that hold some")


def output_name(video: str | os.PathLike[str]) -> str:
    """``<stem>-<8 hex>``: the hash of the absolute path (or URL) keeps same-stem inputs apart."""
    absolute = storage.absolute(video)
    stem = os.path.splitext(posixpath.basename(absolute) if storage.is_url(absolute)
                            else os.path.basename(absolute))[0]
    return f"{stem}-{hashlib.sha1(absolute.encode()).hexdigest()[:8]}"


def output_paths(video: str, out: str, kinds: Sequence[str]) -> dict[str, str]:
    """Each output kind's absolute path or URL under ``out``."""
    name = output_name(video)
    names = {"mp4": f"{name}.masks.mp4", "json": f"{name}.json", "png": f"{name}.masks"}
    return {k: storage.join(out, names[k]) for k in OUTPUT_KINDS if k in kinds}


def parse_outputs(outputs: str | Sequence[str]) -> list[str]:
    kinds = [k.strip().lower() for k in (outputs.split(",") if isinstance(outputs, str) else outputs)]
    kinds = [k for k in kinds if k]
    unknown = [k for k in kinds if k not in OUTPUT_KINDS]
    if unknown:
        raise UsageError(f"unknown output {unknown[0]!r}; choose among {','.join(OUTPUT_KINDS)}")
    if "mp4" not in kinds:
        raise UsageError("--outputs must include mp4: the mask video is always written (as by "
                         "sam3track track); add json and/or png for more")
    return kinds
