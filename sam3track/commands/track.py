"""``sam3track track``: track text prompts through a video into a mask video, JSON and PNGs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

import sam3track
from sam3track.commands.common import EXIT_ERROR, EXIT_OK, CliError
from sam3track.commands.interrupts import InterruptGuard, exit_code_for
from sam3track.commands.prompts import GeometricOption, check_in_video, group_calls
from sam3track.commands.outputs import (
    check_masks_dir,
    check_output_file,
    close_all,
    close_bar,
    default_output,
    same_file,
)
from sam3track.errors import Sam3TrackError
from sam3track.render import draw_objects
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.video import MaskVideoWriter, open_source

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv")  # what MaskVideoWriter can write
MASK_ID_OFFSET = 1  # object ids start at 0; PNG value 0 is background


def run_track(
    video: str | os.PathLike[str],
    prompts: Sequence[str],
    *,
    bundle: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    masks_dir: str | os.PathLike[str] | None = None,
    start_frame: int = 0,
    max_frames: int | None = None,
    backend: str = "onnxruntime",
    device: str = "cpu",
    overrides: dict | None = None,
    keep_timestamps: bool = False,
    geometric: Sequence[GeometricOption] = (),
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    predictor: Any = None,
    report: dict | None = None,
    threads: int | None = None,
    precision: str | None = None,
    shapes: str | None = None,
) -> int:
    """Track ``prompts`` through ``video`` and write the outputs; returns the exit code.

    ``threads``, ``precision``, ``shapes``: passed to :func:`sam3track.load` when given (intra-op
    threads for any backend; ``precision`` "fp32" or "bf16" and ``shapes`` "dynamic" or "static" for
    ``backend="openvino"``).

    ``predictor``: a predictor already loaded from ``bundle`` (with ``backend``, ``device`` and
    ``overrides``) to use instead of loading the bundle again; it is left open, so one process can
    track many videos with graphs loaded once (``sam3track batch``). ``report``: a dict that a
    successful run fills with ``frames``, ``objects`` (ids seen) and ``outputs`` (paths written).

    ``geometric``: the --point / --box options (:mod:`sam3track.commands.prompts`), applied with
    ``session.add_prompt`` after the text prompts and before tracking starts.

    User errors (:class:`Sam3TrackError`, and OSError on outputs) are printed as
    ``error: <message>`` and give 2. A Ctrl-C (SIGINT) or SIGTERM gives 128 + the signal number
    (130, 143) after leaving the frames done beside the outputs, under ``.interrupted`` names.
    The mask video starts at time 0 unless ``keep_timestamps`` keeps the input's own times.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    overrides = dict(overrides or {})
    if threads is not None:
        overrides["threads"] = threads
    if precision is not None:
        overrides["precision"] = precision
    if shapes is not None:
        overrides["shapes"] = shapes
    try:
        with InterruptGuard() as guard:
            return _track(
                guard, Path(video), list(prompts), bundle, output, json_path, masks_dir,
                start_frame, max_frames, backend, device, overrides, keep_timestamps,
                list(geometric), out, err, predictor, report if report is not None else {},
            )
    except KeyboardInterrupt as e:  # before any output was opened
        print("interrupted before any frame was processed; no outputs written", file=err)
        return exit_code_for(e)
    except (Sam3TrackError, OSError) as e:
        print(f"error: {e}", file=err)
        return EXIT_ERROR


def _track(
    guard: InterruptGuard,
    video: Path,
    prompts: list[str],
    bundle: str | os.PathLike[str] | None,
    output: str | os.PathLike[str] | None,
    json_path: str | os.PathLike[str] | None,
    masks_dir: str | os.PathLike[str] | None,
    start_frame: int,
    max_frames: int | None,
    backend: str,
    device: str,
    overrides: dict,
    keep_timestamps: bool,
    geometric: list[GeometricOption],
    out: TextIO,
    err: TextIO,
    loaded: Any,
    report: dict,
) -> int:
    # 1. Arguments that need no file access.
    if bundle is None:
        # The demo bundle has random weights: tracking with it silently would look like a
        # model that finds nothing, so a real bundle must be asked for by name.
        raise CliError(
            "--bundle DIR is required: export a checkpoint with python -m graphs.export "
            "--checkpoint SNAPSHOT --out BUNDLE, or run `sam3track demo` to see the machinery "
            "with random weights"
        )
    if not prompts and not geometric:
        raise CliError("give at least one --prompt TEXT (e.g. --prompt person), --point or --box")
    calls = group_calls(geometric)
    for text in prompts:
        if not text.strip():
            raise CliError("--prompt is empty; give the words to find, e.g. --prompt 'red car'")
    if max_frames is not None and max_frames < 1:
        raise CliError(f"--max-frames must be at least 1, got {max_frames}")
    if start_frame < 0:
        raise CliError(f"--start-frame must be 0 or more, got {start_frame}")

    # 2. The input video (missing, not a video, no frames, undecodable: VideoError here). It is
    # opened once: the session decodes each frame and the drawing reuses it from its cache.
    reader = open_source(video)
    try:
        n_frames = len(reader)
        if start_frame >= n_frames:
            raise CliError(
                f"--start-frame {start_frame} is outside {video}, which has {n_frames} frames "
                f"(valid: 0..{n_frames - 1})"
            )
        stop = n_frames if max_frames is None else min(n_frames, start_frame + max_frames)
        check_in_video(geometric, start_frame, stop, reader.width, reader.height)

        # 3. Outputs, checked before any work so a typo doesn't cost a whole run.
        video_out = Path(output) if output is not None else default_output(video)
        if video_out.is_dir():  # before the suffix check, whose complaint would mislead
            raise CliError(f"-o {video_out} is a folder; give a file name, e.g. "
                           f"{video_out / default_output(video).name}")
        if video_out.suffix.lower() not in VIDEO_SUFFIXES:
            raise CliError(
                f"cannot write {video_out}: unknown video suffix {video_out.suffix!r}; "
                f"use one of {', '.join(VIDEO_SUFFIXES)}"
            )
        check_output_file(video_out, "the video")
        json_out = Path(json_path) if json_path is not None else None
        if json_out is not None:
            check_output_file(json_out, "the JSON")
        masks_out = Path(masks_dir) if masks_dir is not None else None
        if masks_out is not None:
            check_masks_dir(masks_out)
        named = [("-o", video_out), ("--json", json_out), ("--masks-dir", masks_out)]
        for flag, path in named:
            if path is not None and same_file(path, video):
                raise CliError(f"{flag} {path} is the input video; choose another output path")
        files = [(f, p) for f, p in named if p is not None]
        for i, (flag_a, a) in enumerate(files):
            for flag_b, b in files[i + 1:]:
                if same_file(a, b):
                    raise CliError(f"{flag_a} and {flag_b} both name {a}; give them different paths")

        # 4. The bundle.
        bundle_dir = Path(bundle)
        if not bundle_dir.exists():
            raise CliError(
                f"bundle folder not found: {bundle_dir}; export one with "
                f"python -m graphs.export --checkpoint SNAPSHOT --out {bundle_dir}"
            )
        if not bundle_dir.is_dir():
            raise CliError(f"--bundle {bundle_dir} is a file; pass the bundle's folder")
        try:
            predictor = loaded if loaded is not None else sam3track.load(
                bundle_dir, backend=backend, device=device, **overrides)
        except (Sam3TrackError, KeyboardInterrupt):
            raise
        except Exception as e:  # a backend's own exception type: still the bundle's fault
            raise sam3track.BundleError(
                f"cannot load the bundle {bundle_dir} with {backend} on {device}: "
                f"{type(e).__name__}: {e}"
            ) from e
        try:
            with predictor.start_session(reader) as session:  # the session does not close it
                if getattr(session, "box_prompts", "tracker") == "detector":
                    _add_sam31_prompts(session, prompts, geometric, calls, start_frame)
                else:
                    for text in prompts:
                        session.add_prompt(frame_index=start_frame, text=text)
                    _add_geometric(session, calls, bool(prompts))
                return _propagate(
                    guard, session, reader, video, prompts, geometric, start_frame, stop, max_frames,
                    video_out, json_out, masks_out, bundle_dir, keep_timestamps, out, err, report,
                )
        finally:
            if loaded is None:  # a predictor handed in belongs to the caller
                predictor.close()
    finally:
        reader.close()


def _add_sam31_prompts(session: Any, prompts: list[str], geometric: list, calls: list, start: int) -> None:
    """A SAM 3.1 bundle: one detector prompt (Meta's add_prompt starts over on each), the text with every
    --box as its exemplars (labels 1), on the start frame; then the --point calls, which add or refine
    objects by clicks."""
    if len(prompts) > 1:
        raise CliError(f"a SAM 3.1 bundle takes one --prompt (each text prompt starts over in Meta's SAM 3.1); "
                       f"got {len(prompts)}: {', '.join(map(repr, prompts))}")
    boxes = [g for g in geometric if g.option == "--box"]
    for g in boxes:
        if g.obj_id is not None or g.frame != start:
            raise CliError(f"{g}: on a SAM 3.1 bundle a box is an exemplar of the text prompt on the start frame "
                           f"{start} (Meta's SAM 3.1 detector prompt), not an object: give it as --box {start}:... "
                           "without --obj-id")
    if prompts or boxes:
        try:
            session.add_prompt(frame_index=start, text=prompts[0] if prompts else None,
                               boxes=[list(g.coords) for g in boxes] or None)
        except Sam3TrackError as e:
            raise CliError(f"{', '.join(map(str, boxes)) or '--prompt'}: {e}") from e
    for call in calls:
        if call.box is None:
            try:
                session.add_prompt(**call.kwargs())
            except Sam3TrackError as e:
                raise CliError(f"{', '.join(map(str, call.options))}: {e}") from e


def _add_geometric(session: Any, calls: list, have_text: bool) -> None:
    """Apply the --point / --box prompts. With text prompts, a frame whose clicks name an object id
    is first tracked with the text (the official add_prompt(text) does so), so the id can be one
    the text finds there. Errors name the options of the call at fault."""
    text_run: set[int] = set()
    for call in calls:
        if have_text and call.obj_id is not None and call.frame_index not in text_run:
            session.run_frame(call.frame_index)
            text_run.add(call.frame_index)
        try:
            session.add_prompt(**call.kwargs())
        except Sam3TrackError as e:
            raise CliError(f"{', '.join(map(str, call.options))}: {e}") from e


def _propagate(
    guard: InterruptGuard,
    session: Any,
    reader: Any,
    video: Path,
    prompts: list[str],
    geometric: list[GeometricOption],
    start: int,
    stop: int,
    max_frames: int | None,
    video_out: Path,
    json_out: Path | None,
    masks_out: Path | None,
    bundle_dir: Path,
    keep_timestamps: bool,
    out: TextIO,
    err: TextIO,
    report: dict,
) -> int:
    sinks: list[Any] = []
    written: list[Path] = []
    done = 0
    seen: set[int] = set()
    bar = None
    results = None
    # A clip cut from a longer video starts at 0 like any video, unless the user wants the
    # source's clock (to line the masks up with the original); spacing is kept either way.
    pts_offset = 0 if keep_timestamps else reader.pts(start)
    started = time.perf_counter()
    try:
        writer = MaskVideoWriter.like(video_out, reader)
        sinks.append(writer)
        written.append(video_out)
        json_sink = None
        if json_out is not None:
            metadata = {
                "video": str(video),
                "prompts": prompts,
                "clicks_and_boxes": [g.to_json() for g in geometric],
                "bundle": str(bundle_dir),
                "start_frame": start,
                "max_frames": max_frames,
                "width": reader.width,
                "height": reader.height,
                "fps": float(reader.frame_rate),
                "keep_timestamps": keep_timestamps,
                "id_offset_in_masks_dir": MASK_ID_OFFSET if masks_out is not None else None,
            }
            json_sink = JsonSink(json_out, metadata=metadata)
            sinks.append(json_sink)
            written.append(json_out)
        masks_sink = None
        if masks_out is not None:
            masks_sink = MasksDirSink(masks_out, id_offset=MASK_ID_OFFSET)
            sinks.append(masks_sink)
            written.append(masks_out)

        bar = tqdm(total=stop - start, desc="tracking", unit="frame", file=err,
                   dynamic_ncols=True, smoothing=0.1)
        results = session.propagate(direction="forward", start_frame=start, max_frames=max_frames)
        for result in results:
            index = start + done
            if index >= stop:
                raise Sam3TrackError(
                    f"the predictor returned frame {result.frame_index}, past the last frame "
                    f"asked for ({stop - 1}); this is a bug in sam3track, please report it"
                )
            if int(result.frame_index) != index:
                raise Sam3TrackError(
                    f"the predictor returned frame {result.frame_index} where frame "
                    f"{index} was expected; this is a bug in sam3track, please report it"
                )
            # The frame the session just tracked, from its decode cache: decoded once per run.
            rendered = draw_objects(session.frame(index), result)
            with guard.atomic():  # all outputs get this frame, or none does
                writer.write(rendered, pts=reader.pts(index) - pts_offset,
                             time_base=reader.time_base)
                if json_sink is not None:
                    json_sink.write(result)
                if masks_sink is not None:
                    masks_sink.write(result)
                done += 1
            seen.update(int(i) for i in result.object_ids)
            bar.set_postfix(objects=len(result), refresh=False)
            bar.update(1)
        if done == 0:
            raise Sam3TrackError(f"the predictor returned no frames for {video} from frame {start}")
        guard.finish()  # every frame is written: from here on, a signal cannot stop the closing
    except KeyboardInterrupt as e:
        kept = _close_early(guard, bar, sinks, written)
        print(f"interrupted after {done} frames; {_partial_note(kept)}", file=err)
        return exit_code_for(e)
    except (Sam3TrackError, OSError) as e:
        kept = _close_early(guard, bar, sinks, written)
        where = f"; {done} frames done, {_partial_note(kept)}" if kept else ""
        print(f"error: {e}{where}", file=err)
        return EXIT_ERROR
    finally:
        if results is not None and hasattr(results, "close"):
            with guard.finalising():
                results.close()

    close_bar(bar)
    try:
        for sink in sinks:
            sink.close(complete=True)
    except (Sam3TrackError, OSError):
        close_all(sinks, written, complete=False)
        raise
    elapsed = time.perf_counter() - started
    fps = done / elapsed if elapsed > 0 else float("inf")
    outputs = ", ".join(str(p) + ("/" if p == masks_out else "") for p in written)
    report.update(frames=done, objects=len(seen), outputs=[str(p) for p in written])
    print(
        f"tracked {done} frames ({start}..{start + done - 1}) in {elapsed:.1f} s "
        f"({fps:.1f} frames/s), {len(seen)} object{'' if len(seen) == 1 else 's'} seen; "
        f"wrote {outputs}",
        file=out,
    )
    return EXIT_OK


def _close_early(
    guard: InterruptGuard, bar: Any, sinks: list[Any], written: list[Path]
) -> list[str]:
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


def cmd_track(args: argparse.Namespace) -> int:
    return run_track(
        args.video, args.prompt, bundle=args.bundle, output=args.output, json_path=args.json,
        masks_dir=args.masks_dir, start_frame=args.start_frame, max_frames=args.max_frames,
        backend=args.backend, device=args.device, overrides=dict(args.set),
        keep_timestamps=args.keep_timestamps, geometric=args.geometric,
        threads=args.threads, precision=args.precision, shapes=args.shapes,
    )
