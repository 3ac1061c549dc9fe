"""One video tracked into files: a mask video, and optionally JSON and a folder of PNG masks.

What ``sam3track track`` runs, and each video of ``sam3track batch``. A :class:`TrackJob` says what to
do; :func:`run_track` checks it before any work, loads the bundle (or uses a predictor already
loaded), adds the prompts, writes every output frame by frame (all of them get a frame or none does)
and returns an exit code. A Ctrl-C or SIGTERM leaves the frames done beside the outputs under
``.interrupted`` names; the paths asked for only ever hold complete outputs. The outputs are locked
from before the bundle loads to the end, so a second run aimed at them stops at once (exit 2).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sam3track.errors import BundleError, Sam3TrackError, UsageError
from sam3track.jobs.exit_codes import EXIT_ERROR, EXIT_OK
from sam3track.jobs.geometric import GeometricOption, PromptCall, check_in_video, group_calls
from sam3track.jobs.interrupts import InterruptGuard, exit_code_for
from sam3track.jobs.outputs import (
    check_masks_dir,
    check_output_file,
    close_all,
    close_bar,
    default_output,
    lock_outputs,
    release_all,
    same_file,
)
from sam3track.output_lock import OutputLock
from sam3track.progress import progress_bar
from sam3track.render import draw_objects
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.tracking_session import TrackingSession
from sam3track.video import MaskVideoWriter, open_source
from sam3track.video.writer import VIDEO_SUFFIXES

MASK_ID_OFFSET = 1  # object ids start at 0; PNG value 0 is background
PathLike = str | os.PathLike


@dataclass
class TrackJob:
    """What to track and where to write it.

    ``load_options``: passed to :func:`sam3track.load` (threads, precision, shapes and config
    overrides). ``geometric``: --point / --box options (:mod:`sam3track.jobs.geometric`), applied
    after the text prompts and before tracking starts. The mask video starts at time 0 unless
    ``keep_timestamps`` keeps the input's own times."""

    video: PathLike
    prompts: list[str]
    bundle: PathLike | None = None
    output: PathLike | None = None  # the mask video; None: <video stem>.masks.mp4 beside the video
    json_path: PathLike | None = None
    masks_dir: PathLike | None = None
    start_frame: int = 0
    max_frames: int | None = None
    backend: str = "auto"
    device: str = "cpu"
    load_options: dict = field(default_factory=dict)
    keep_timestamps: bool = False
    geometric: list[GeometricOption] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    """A checked job: the frames to track and the outputs to write."""

    video: Path
    start: int
    stop: int
    video_out: Path
    json_out: Path | None
    masks_out: Path | None
    calls: list[PromptCall]

    def outputs(self) -> list[Path]:
        """The outputs asked for, in the order they are opened."""
        return [p for p in (self.video_out, self.json_out, self.masks_out) if p is not None]


def run_track(job: TrackJob, *, stdout: TextIO | None = None, stderr: TextIO | None = None,
              predictor: Any = None, report: dict | None = None) -> int:
    """Run ``job``; returns the exit code (0, 2 for a user error printed as ``error: <message>``,
    128 + the signal number after a Ctrl-C or SIGTERM).

    ``predictor``: one already loaded from the job's bundle, backend and options, used instead of
    loading the bundle again and left open (one process tracks many videos with graphs loaded once).
    ``report``: filled by a successful run with ``frames``, ``objects`` (ids seen) and ``outputs``."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        with InterruptGuard() as guard:
            return _run(guard, job, out, err, predictor, report if report is not None else {})
    except KeyboardInterrupt as e:  # before any output was opened
        print("interrupted before any frame was processed; no outputs written", file=err)
        return exit_code_for(e)
    except (Sam3TrackError, OSError) as e:
        print(f"error: {e}", file=err)
        return EXIT_ERROR


def _run(guard: InterruptGuard, job: TrackJob, out: TextIO, err: TextIO, loaded: Any, report: dict) -> int:
    calls = _check_request(job)
    # The input video is opened once: the session decodes each frame and the drawing reuses it.
    reader = open_source(Path(job.video))  # missing, not a video, undecodable: VideoError here
    try:
        plan = _plan(job, reader, calls)
        bundle_dir = _check_bundle(job.bundle)
        # Locked before the bundle loads: a run aimed at another live run's outputs stops at once.
        locks = lock_outputs(plan.outputs(), plan.masks_out)
        try:
            predictor = loaded if loaded is not None else _load(job, bundle_dir)
            try:
                # one pass that never goes back: no store of what a later correction would read
                with predictor.start_session(reader, keep_history=False) as session:  # it does not close reader
                    _add_prompts(session, job, plan)
                    return _write_outputs(guard, session, reader, job, plan, locks, out, err, report)
            finally:
                if loaded is None:  # a predictor handed in belongs to the caller
                    predictor.close()
        finally:
            release_all(locks)
    finally:
        reader.close()


def _check_request(job: TrackJob) -> list[PromptCall]:
    """What needs no file access: a bundle named, prompts given, frame numbers in range."""
    if job.bundle is None:
        # The demo bundle has random weights: tracking with it silently would look like a
        # model that finds nothing, so a real bundle must be asked for by name.
        raise UsageError("--bundle DIR is required: export a checkpoint with python -m graphs.export "
                         "--checkpoint SNAPSHOT --out BUNDLE, or run `sam3track demo` to see the machinery "
                         "with random weights")
    if not job.prompts and not job.geometric:
        raise UsageError("give at least one --prompt TEXT (e.g. --prompt person), --point or --box")
    calls = group_calls(list(job.geometric))
    if any(not text.strip() for text in job.prompts):
        raise UsageError("--prompt is empty; give the words to find, e.g. --prompt 'red car'")
    if job.max_frames is not None and job.max_frames < 1:
        raise UsageError(f"--max-frames must be at least 1, got {job.max_frames}")
    if job.start_frame < 0:
        raise UsageError(f"--start-frame must be 0 or more, got {job.start_frame}")
    return calls


def _plan(job: TrackJob, reader: Any, calls: list[PromptCall]) -> _Plan:
    """The frames to track and the outputs, checked before any work so a typo doesn't cost a run."""
    video, start = Path(job.video), job.start_frame
    n_frames = len(reader)
    if start >= n_frames:
        raise UsageError(f"--start-frame {start} is outside {video}, which has {n_frames} frames "
                         f"(valid: 0..{n_frames - 1})")
    stop = n_frames if job.max_frames is None else min(n_frames, start + job.max_frames)
    check_in_video(list(job.geometric), start, stop, reader.width, reader.height)
    video_out = Path(job.output) if job.output is not None else default_output(video)
    if video_out.is_dir():  # before the suffix check, whose complaint would mislead
        raise UsageError(f"-o {video_out} is a folder; give a file name, e.g. "
                         f"{video_out / default_output(video).name}")
    if video_out.suffix.lower() not in VIDEO_SUFFIXES:
        raise UsageError(f"cannot write {video_out}: unknown video suffix {video_out.suffix!r}; "
                         f"use one of {', '.join(VIDEO_SUFFIXES)}")
    check_output_file(video_out, "the video")
    json_out = Path(job.json_path) if job.json_path is not None else None
    if json_out is not None:
        check_output_file(json_out, "the JSON")
    masks_out = Path(job.masks_dir) if job.masks_dir is not None else None
    if masks_out is not None:
        check_masks_dir(masks_out)
    _check_distinct(video, [("-o", video_out), ("--json", json_out), ("--masks-dir", masks_out)])
    return _Plan(video, start, stop, video_out, json_out, masks_out, calls)


def _check_distinct(video: Path, named: list[tuple[str, Path | None]]) -> None:
    """No output is the input video, and no two outputs are one file."""
    for flag, path in named:
        if path is not None and same_file(path, video):
            raise UsageError(f"{flag} {path} is the input video; choose another output path")
    files = [(flag, path) for flag, path in named if path is not None]
    for i, (flag_a, a) in enumerate(files):
        for flag_b, b in files[i + 1:]:
            if same_file(a, b):
                raise UsageError(f"{flag_a} and {flag_b} both name {a}; give them different paths")


def _check_bundle(bundle: PathLike) -> Path:
    bundle_dir = Path(bundle)
    if not bundle_dir.exists():
        raise UsageError(f"bundle folder not found: {bundle_dir}; export one with "
                         f"python -m graphs.export --checkpoint SNAPSHOT --out {bundle_dir}")
    if not bundle_dir.is_dir():
        raise UsageError(f"--bundle {bundle_dir} is a file; pass the bundle's folder")
    return bundle_dir


def _load(job: TrackJob, bundle_dir: Path) -> Any:
    import sam3track

    try:
        return sam3track.load(bundle_dir, backend=job.backend, device=job.device, **job.load_options)
    except (Sam3TrackError, KeyboardInterrupt):
        raise
    except Exception as e:  # a backend's own exception type: still the bundle's fault
        raise BundleError(f"cannot load the bundle {bundle_dir} with {job.backend} on {job.device}: "
                          f"{type(e).__name__}: {e}") from e


def _add_prompts(session: TrackingSession, job: TrackJob, plan: _Plan) -> None:
    """Text first, then clicks and boxes, as each family reads them (``session.box_prompts``)."""
    prompts, geometric = list(job.prompts), list(job.geometric)
    if session.box_prompts == "detector":
        _add_detector_prompts(session, prompts, geometric, plan.calls, plan.start)
        return
    for text in prompts:
        session.add_prompt(frame_index=plan.start, text=text)
    _add_tracker_prompts(session, plan.calls, bool(prompts))


def _add_detector_prompts(session: TrackingSession, prompts: list[str], geometric: list, calls: list,
                          start: int) -> None:
    """A SAM 3.1 bundle: one detector prompt (Meta's add_prompt starts over on each), the text with every
    --box as its exemplars (labels 1), on the start frame; then the --point calls, which add or refine
    objects by clicks."""
    if len(prompts) > 1:
        raise UsageError(f"a SAM 3.1 bundle takes one --prompt (each text prompt starts over in Meta's SAM 3.1); "
                         f"got {len(prompts)}: {', '.join(map(repr, prompts))}")
    boxes = [g for g in geometric if g.option == "--box"]
    for g in boxes:
        if g.obj_id is not None or g.frame != start:
            raise UsageError(f"{g}: on a SAM 3.1 bundle a box is an exemplar of the text prompt on the start "
                             f"frame {start} (Meta's SAM 3.1 detector prompt), not an object: give it as "
                             f"--box {start}:... without --obj-id")
    if prompts or boxes:
        try:
            session.add_prompt(frame_index=start, text=prompts[0] if prompts else None,
                               boxes=[list(g.coords) for g in boxes] or None)
        except Sam3TrackError as e:
            raise UsageError(f"{', '.join(map(str, boxes)) or '--prompt'}: {e}") from e
    for call in calls:
        if call.box is None:
            _add_call(session, call)


def _add_tracker_prompts(session: TrackingSession, calls: list[PromptCall], have_text: bool) -> None:
    """Apply the --point / --box prompts. With text prompts, a frame whose clicks name an object id
    is first tracked with the text (the official add_prompt(text) does so), so the id can be one
    the text finds there."""
    text_run: set[int] = set()
    for call in calls:
        if have_text and call.obj_id is not None and call.frame_index not in text_run:
            session.run_frame(call.frame_index)
            text_run.add(call.frame_index)
        _add_call(session, call)


def _add_call(session: TrackingSession, call: PromptCall) -> None:
    """One add_prompt call; its error names the options of the call at fault."""
    try:
        session.add_prompt(**call.kwargs())
    except Sam3TrackError as e:
        raise UsageError(f"{', '.join(map(str, call.options))}: {e}") from e


@dataclass
class _Outputs:
    """The open outputs of a run, in the order they were opened."""

    writer: MaskVideoWriter
    json: JsonSink | None = None
    masks: MasksDirSink | None = None

    def write(self, rendered, result, pts: int, time_base) -> None:
        self.writer.write(rendered, pts=pts, time_base=time_base)
        if self.json is not None:
            self.json.write(result)
        if self.masks is not None:
            self.masks.write(result)


def _open_outputs(job: TrackJob, plan: _Plan, reader: Any, locks: dict[Path, OutputLock], opened: list,
                  written: list) -> _Outputs:
    """Every output, under the lock taken for it, each added to ``opened`` / ``written`` as soon as it
    exists (so an error while opening the next still closes it)."""
    writer = MaskVideoWriter.like(plan.video_out, reader, lock=locks[plan.video_out])
    opened.append(writer)
    written.append(plan.video_out)
    outputs = _Outputs(writer)
    if plan.json_out is not None:
        metadata = {
            "video": str(plan.video), "prompts": list(job.prompts),
            "clicks_and_boxes": [g.to_json() for g in job.geometric], "bundle": str(Path(job.bundle)),
            "start_frame": plan.start, "max_frames": job.max_frames, "width": reader.width,
            "height": reader.height, "fps": float(reader.frame_rate), "keep_timestamps": job.keep_timestamps,
            "id_offset_in_masks_dir": MASK_ID_OFFSET if plan.masks_out is not None else None,
        }
        outputs.json = JsonSink(plan.json_out, metadata=metadata, lock=locks[plan.json_out])
        opened.append(outputs.json)
        written.append(plan.json_out)
    if plan.masks_out is not None:
        outputs.masks = MasksDirSink(plan.masks_out, id_offset=MASK_ID_OFFSET, lock=locks[plan.masks_out])
        opened.append(outputs.masks)
        written.append(plan.masks_out)
    return outputs


@dataclass
class _Progress:
    done: int = 0  # frames written to every output
    seen: set = field(default_factory=set)  # object ids seen
    bar: Any = None  # the tqdm bar, once open


def _write_outputs(guard: InterruptGuard, session: TrackingSession, reader: Any, job: TrackJob, plan: _Plan,
                   locks: dict[Path, OutputLock], out: TextIO, err: TextIO, report: dict) -> int:
    """Track from the start frame and write each frame to every output; close them complete, or
    after a signal or an error as ``.interrupted`` partials."""
    # A clip cut from a longer video starts at 0 like any video, unless the user wants the
    # source's clock (to line the masks up with the original); spacing is kept either way.
    pts_offset = 0 if job.keep_timestamps else reader.pts(plan.start)
    sinks: list[Any] = []
    written: list[Path] = []
    progress = _Progress()
    results = None
    started = time.perf_counter()
    try:
        outputs = _open_outputs(job, plan, reader, locks, sinks, written)
        progress.bar = progress_bar(plan.stop - plan.start, "tracking", "frame", err, dynamic_ncols=True,
                                    smoothing=0.1)
        results = session.propagate(direction="forward", start_frame=plan.start, max_frames=job.max_frames)
        _track_frames(guard, session, reader, pts_offset, plan, results, outputs, progress)
        guard.finish()  # every frame is written: from here on, a signal cannot stop the closing
    except KeyboardInterrupt as e:
        kept = _close_early(guard, progress.bar, sinks, written)
        print(f"interrupted after {progress.done} frames; {_partial_note(kept)}", file=err)
        return exit_code_for(e)
    except (Sam3TrackError, OSError) as e:
        kept = _close_early(guard, progress.bar, sinks, written)
        where = f"; {progress.done} frames done, {_partial_note(kept)}" if kept else ""
        print(f"error: {e}{where}", file=err)
        return EXIT_ERROR
    finally:
        if results is not None and hasattr(results, "close"):
            with guard.finalising():
                results.close()
    _close_complete(progress.bar, sinks, written)
    _summarise(plan, progress, written, time.perf_counter() - started, out, report)
    return EXIT_OK


def _track_frames(guard: InterruptGuard, session: TrackingSession, reader: Any, pts_offset: int, plan: _Plan,
                  results, outputs: _Outputs, progress: _Progress) -> None:
    bar = progress.bar
    for result in results:
        index = plan.start + progress.done
        if index >= plan.stop:
            raise Sam3TrackError(f"the predictor returned frame {result.frame_index}, past the last frame "
                                 f"asked for ({plan.stop - 1}); this is a bug in sam3track, please report it")
        if int(result.frame_index) != index:
            raise Sam3TrackError(f"the predictor returned frame {result.frame_index} where frame {index} was "
                                 "expected; this is a bug in sam3track, please report it")
        # The frame the session just tracked, from its decode cache: decoded once per run.
        rendered = draw_objects(session.frame(index), result)
        with guard.atomic():  # all outputs get this frame, or none does
            outputs.write(rendered, result, reader.pts(index) - pts_offset, reader.time_base)
            progress.done += 1
        progress.seen.update(int(i) for i in result.object_ids)
        bar.set_postfix(objects=len(result), refresh=False)
        bar.update(1)
    if progress.done == 0:
        raise Sam3TrackError(f"the predictor returned no frames for {plan.video} from frame {plan.start}")


def _close_complete(bar: Any, sinks: list[Any], written: list[Path]) -> None:
    close_bar(bar)
    try:
        for sink in sinks:
            sink.close(complete=True)
    except (Sam3TrackError, OSError):
        close_all(sinks, written, complete=False)
        raise


def _summarise(plan: _Plan, progress: _Progress, written: list[Path], elapsed: float, out: TextIO,
               report: dict) -> None:
    done, seen = progress.done, progress.seen
    fps = done / elapsed if elapsed > 0 else float("inf")
    outputs = ", ".join(str(p) + ("/" if p == plan.masks_out else "") for p in written)
    report.update(frames=done, objects=len(seen), outputs=[str(p) for p in written])
    print(f"tracked {done} frames ({plan.start}..{plan.start + done - 1}) in {elapsed:.1f} s "
          f"({fps:.1f} frames/s), {len(seen)} object{'' if len(seen) == 1 else 's'} seen; wrote {outputs}",
          file=out)


def _close_early(guard: InterruptGuard, bar: Any, sinks: list[Any], written: list[Path]) -> list[str]:
    """Close the progress bar and every output after a run stopped early (a signal or an error);
    where the outputs that hold something ended up (their ``.interrupted`` names)."""
    with guard.finalising():
        close_bar(bar)
        return close_all(sinks, written, complete=False)


def _partial_note(kept: list[str]) -> str:
    if not kept:
        return "no outputs written"
    return (f"partial outputs written to {', '.join(kept)} (the paths asked for were left "
            f"untouched; run again for complete outputs)")
