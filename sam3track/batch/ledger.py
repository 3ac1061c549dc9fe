"""The batch ledger, ``OUT/ledger.jsonl``: one JSON line per finished video, written by the driver
alone, so a re-run (from any folder: the lines hold absolute paths or URLs) skips what is done. In an
object store the driver appends to a local copy and uploads it whole. Fields: docs/batch.md."""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sam3track.batch import storage

LEDGER_NAME = "ledger.jsonl"
UPLOAD_EVERY_SECONDS = 5.0  # an object-store ledger is uploaded whole, so not after every video


@dataclass
class VideoSummary:
    """One finished video, as the ledger records it."""

    video: str  # absolute path or URL of the input
    status: str  # "done" or "failed"
    frames: int = 0
    objects: int = 0
    seconds: float = 0.0
    reason: str = ""  # the one-line reason of a failure
    outputs: dict[str, str] = field(default_factory=dict)  # kind (mp4, json, png) -> path or URL
    settings: dict[str, Any] = field(default_factory=dict)  # prompts and outputs asked for
    attempts: int = 0  # times a worker started this video, over every run
    last_error: str = ""  # the latest failure of any attempt (kept after a later success)
    skipped: bool = False  # done by an earlier run (not written to the ledger again)

    @property
    def done(self) -> bool:
        return self.status == "done"

    def to_json(self) -> str:
        record = asdict(self)
        record.pop("skipped")
        return json.dumps(record, sort_keys=True)


def parse_ledger(text: str) -> dict[str, VideoSummary]:
    """The last record of each video (a torn or unreadable line is ignored)."""
    records: dict[str, VideoSummary] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
            records[record["video"]] = VideoSummary(**record)
        except (ValueError, TypeError, KeyError):
            continue
    return records


def read_ledger(out_dir: str | os.PathLike[str]) -> dict[str, VideoSummary]:
    """The last record of each video in ``out_dir/ledger.jsonl`` (a torn last line is ignored)."""
    return parse_ledger(storage.read_text(storage.join(storage.absolute(out_dir), LEDGER_NAME)) or "")


@dataclass
class Ledger:
    """The open ledger: a local file appended to, flushed and synced per line; for an object store, a
    local copy uploaded whole (at most every UPLOAD_EVERY_SECONDS, and on close)."""

    location: str  # OUT/ledger.jsonl, a path or URL
    file: io.TextIOWrapper
    scratch: str | None = None  # the local copy's folder when the ledger lives in a store
    dirty: bool = False
    uploaded_at: float = 0.0

    @classmethod
    def open(cls, out: str) -> "Ledger":
        location = storage.join(out, LEDGER_NAME)
        scratch = None
        path = Path(location)
        with storage.failing_as_usage("write the ledger", location):
            if storage.is_url(location):
                scratch = tempfile.mkdtemp(prefix="sam3track-ledger-")
                path = Path(scratch, LEDGER_NAME)
                path.write_text(storage.read_text(location) or "", encoding="utf-8")
            file = open(path, "a", encoding="utf-8")
            if file.tell() and not path.read_bytes().endswith(b"\n"):
                file.write("\n")  # a line torn by a crash stays alone (parse_ledger skips it)
        return cls(location, file, scratch)

    def append(self, summary: VideoSummary) -> None:
        """One line, on disk (synced) before this returns; uploaded when its time comes."""
        with storage.failing_as_usage("write the ledger", self.location):
            self.file.write(summary.to_json() + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())
        self.dirty = self.scratch is not None
        self.sync()

    def sync(self, force: bool = False) -> None:
        """Upload the local copy if it changed and the last upload is old enough (or ``force``)."""
        if not self.dirty or (not force and time.monotonic() - self.uploaded_at < UPLOAD_EVERY_SECONDS):
            return
        storage.upload(Path(self.file.name), self.location)
        self.dirty, self.uploaded_at = False, time.monotonic()

    def close(self) -> None:
        """Close the file; an object-store ledger is uploaded a last time and its copy removed."""
        self.file.close()
        if self.scratch is not None:
            try:
                self.sync(force=True)
            finally:
                Path(self.file.name).unlink(missing_ok=True)
                os.rmdir(self.scratch)
