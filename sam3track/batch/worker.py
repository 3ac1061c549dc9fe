"""What runs on the Ray workers: :class:`Worker`, one predictor loaded once tracking one video per call
through :func:`sam3track.jobs.run_track` (a video or outputs in an object store go through local
scratch), and :class:`ProgressBoard`, where workers count the frames and attempts the driver shows.
Retries and scratch: docs/batch.md."""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sam3track.batch import storage
from sam3track.batch.ledger import VideoSummary
from sam3track.batch.scratch import remove_orphaned_scratch, scratch_folder
from sam3track.errors import Sam3TrackError

MAX_TASK_RETRIES = 2  # a video whose worker dies is tried at most 3 times in all
REPORT_EVERY_SECONDS = 0.5  # how often a worker tells the board its frame count
# Test hooks, read by the driver and handed to the workers (whose environment Ray sets up): a
# sleep after each frame so a kill lands mid-video, a folder where workers note their pid (and
# their threads), and a file whose existence holds each worker before its second video (so a Ctrl-C
# lands between videos however fast or slow the machine is).
FRAME_DELAY_ENV = "SAM3TRACK_BATCH_TEST_FRAME_DELAY"
PID_DIR_ENV = "SAM3TRACK_BATCH_TEST_PID_DIR"
HOLD_FILE_ENV = "SAM3TRACK_BATCH_TEST_HOLD_FILE"
HOLD_SECONDS = 300  # a hold never outlives a test that forgot to remove the file
JSON_HEAD_END = ', "frames": [\n'  # how sinks.JsonSink ends its first line, the metadata


class ProgressBoard:
    """Frames done and attempts started per video (a Ray actor with no CPU of its own)."""

    def __init__(self) -> None:
        self.frames: dict[str, int] = {}
        self.attempts: dict[str, int] = {}

    def started(self, video: str) -> int:
        """A worker starts ``video``: the number of this attempt within the run."""
        self.attempts[video] = self.attempts.get(video, 0) + 1
        return self.attempts[video]

    def count(self, video: str, frames: int) -> None:
        self.frames[video] = max(frames, self.frames.get(video, 0))  # a retry restarts from 0

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.frames), dict(self.attempts)


class _CountingSession:
    """A tracking session whose propagation reports each frame (everything else passes through)."""

    def __init__(self, session: Any, on_frame: Callable[[int], None]) -> None:
        self._session, self._on_frame = session, on_frame

    def __enter__(self) -> "_CountingSession":
        self._session.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._session.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def propagate(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return _counted(self._session.propagate(*args, **kwargs), self._on_frame)


def _counted(results: Any, on_frame: Callable[[int], None]) -> Iterator[Any]:
    try:
        for n, result in enumerate(results, 1):
            on_frame(n)
            yield result
    finally:
        if hasattr(results, "close"):
            results.close()


class _CountingPredictor:
    """A loaded predictor whose sessions report their frames (run_track sees a predictor)."""

    def __init__(self, predictor: Any, on_frame: Callable[[int], None]) -> None:
        self._predictor, self._on_frame = predictor, on_frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._predictor, name)

    def start_session(self, *args: Any, **kwargs: Any) -> _CountingSession:
        return _CountingSession(self._predictor.start_session(*args, **kwargs), self._on_frame)


def reserved_cpus() -> int:
    """The CPUs Ray reserved for this worker (at least 1: a GPU worker may reserve none)."""
    import ray

    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


class Worker:
    """One predictor, loaded once, tracking one video per call (a Ray actor; see docs/batch.md). Its
    backend's intra-op threads are ``threads``, else the CPUs Ray reserved for it."""

    def __init__(self, bundle: str, backend: str, device: str, overrides: dict,
                 threads: int | None, hooks: dict, board: str) -> None:
        import ray

        import sam3track

        # The board by name: an actor handle among the arguments would put them in the object store,
        # where Ray warns a restart may not find them.
        self.hooks, self.board, self.bundle = hooks, ray.get_actor(board), bundle
        self.videos_started = 0
        options = dict(overrides)
        options.setdefault("threads", threads or reserved_cpus())
        self.threads = options["threads"]
        if hooks.get("pid_dir"):  # its threads, and which sam3track it runs (the tests' checkout?)
            Path(hooks["pid_dir"], str(os.getpid())).write_text(f"threads={self.threads}\n{sam3track.__file__}")
        self.predictor = sam3track.load(bundle, backend=backend, device=device, **options)
        remove_orphaned_scratch()  # what a killed worker on this machine left (this one may replace it)

    def pid(self) -> int:
        """Answers once the worker is up: the driver sends it videos only then."""
        return os.getpid()

    def track(self, video: str, prompts: list[str], outputs: dict[str, str],
              settings: dict) -> VideoSummary:
        import ray

        attempt = ray.get(self.board.started.remote(video))
        self._test_hooks(video)
        started = time.perf_counter()
        try:
            with scratch_folder() as scratch:
                code, reason, report = self._track(video, prompts, outputs, scratch)
        except Sam3TrackError as e:  # fetching or uploading: the message names the URL
            code, reason, report = -1, str(e).splitlines()[0], {}
        except Exception as e:  # anything run_track does not report itself: still this video's
            code, reason, report = -1, f"{type(e).__name__}: {e}".splitlines()[0], {}
        seconds = round(time.perf_counter() - started, 3)
        if code != 0:
            return VideoSummary(video, "failed", seconds=seconds, reason=reason, settings=settings,
                                attempts=attempt, last_error=reason)
        return VideoSummary(video, "done", frames=int(report["frames"]), objects=int(report["objects"]),
                            seconds=seconds, outputs=outputs, settings=settings, attempts=attempt)

    def _track(self, video: str, prompts: list[str], outputs: dict[str, str],
               scratch: str) -> tuple[int, str, dict]:
        """Run the job on local files (a URL's video fetched into ``scratch``, its outputs written there
        and uploaded once complete); the exit code, the failure's reason, run_track's report."""
        from sam3track.jobs import track as track_job

        local_video = _fetch(video, Path(scratch))
        local_outputs = {k: str(Path(scratch, storage.basename(v))) if storage.is_url(v) else v
                         for k, v in outputs.items()}
        report: dict = {}
        err = io.StringIO()
        job = track_job.TrackJob(local_video, list(prompts), bundle=self.bundle, output=local_outputs["mp4"],
                                 json_path=local_outputs.get("json"), masks_dir=local_outputs.get("png"))
        predictor = _CountingPredictor(self.predictor, self._frame_counter(video))
        code = track_job.run_track(job, stdout=io.StringIO(), stderr=err, predictor=predictor, report=report)
        if code != 0:  # the reason names the input as the user gave it, not its scratch copy
            return code, _reason(err.getvalue(), code).replace(local_video, video), report
        if local_video != video and "json" in outputs:
            name_source_in_json(Path(local_outputs["json"]), video)
        _publish(local_outputs, outputs)
        return code, "", report

    def _frame_counter(self, video: str) -> Callable[[int], None]:
        """Tells the board the frames done, at most every REPORT_EVERY_SECONDS."""
        last = [0.0]
        delay = float(self.hooks.get("frame_delay") or 0)

        def on_frame(n: int) -> None:
            if delay:
                time.sleep(delay)
            if time.monotonic() - last[0] >= REPORT_EVERY_SECONDS:
                last[0] = time.monotonic()
                self.board.count.remote(video, n)

        return on_frame

    def _test_hooks(self, video: str) -> None:
        if self.hooks.get("pid_dir"):
            Path(self.hooks["pid_dir"], f"{os.getpid()}.busy").write_text(video)
        if self.hooks.get("hold_file") and self.videos_started:
            until = time.monotonic() + HOLD_SECONDS
            while Path(self.hooks["hold_file"]).exists() and time.monotonic() < until:
                time.sleep(0.05)
        self.videos_started += 1


def _fetch(video: str, scratch: Path) -> str:
    """A local path for ``video``: itself, or a URL's object downloaded into ``scratch``."""
    if not storage.is_url(video):
        return video
    local = scratch / ("input" + os.path.splitext(storage.basename(video))[1].lower())
    storage.download(video, local)
    return str(local)


def _publish(local_outputs: dict[str, str], outputs: dict[str, str]) -> None:
    """Upload the outputs that go to a store, the mask video last (each object appears whole)."""
    for kind in sorted(outputs, key=lambda k: k == "mp4"):
        if storage.is_url(outputs[kind]):
            storage.upload(Path(local_outputs[kind]), outputs[kind])


def name_source_in_json(path: Path, video: str) -> None:
    """Make the JSON's ``metadata.video`` the URL instead of the scratch copy it was tracked from
    (the metadata is the file's first line; the frames are copied unchanged)."""
    import json

    with open(path, encoding="utf-8") as src:
        head = src.readline()
        if not head.endswith(JSON_HEAD_END):
            return  # not the layout this knows: leave the file as it is
        record = json.loads(head[:-len(JSON_HEAD_END)] + "}")
        record["metadata"]["video"] = video
        fixed = path.with_name(path.name + ".named")
        with open(fixed, "w", encoding="utf-8") as dst:
            dst.write(json.dumps(record)[:-1] + JSON_HEAD_END)
            shutil.copyfileobj(src, dst)
    os.replace(fixed, path)


def _reason(stderr: str, code: int) -> str:
    errors = [line[len("error: "):] for line in stderr.splitlines() if line.startswith("error: ")]
    return errors[-1] if errors else f"sam3track track exited with {code}"
