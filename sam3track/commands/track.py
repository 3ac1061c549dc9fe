"""``sam3track track``: its arguments, and the job they describe (:mod:`sam3track.jobs.track`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from sam3track.commands.common import int_at_least, setting
from sam3track.errors import UsageError
from sam3track.jobs import track as job_module
from sam3track.jobs.geometric import BOX_FORM, POINT_FORM, parse_box, parse_point
from sam3track.jobs.track import TrackJob
from sam3track.video.writer import VIDEO_SUFFIXES

__all__ = ["GeometricAction", "VIDEO_SUFFIXES", "add_parser", "cmd_track", "job_from_args", "run_track"]


class GeometricAction(argparse.Action):
    """--point / --box: parsed at once (errors name the option and value) and tagged with the
    --obj-id in force, into the one ordered list ``namespace.geometric``."""

    def __call__(self, parser, namespace, value, option_string=None):
        parse = parse_point if self.dest == "point" else parse_box
        try:
            item = parse(value, getattr(namespace, "obj_id", None))
        except UsageError as e:
            parser.error(str(e))
        namespace.geometric = list(getattr(namespace, "geometric", None) or []) + [item]


def _load_options(overrides, threads: int | None, precision: str | None, shapes: str | None) -> dict:
    """sam3track.load's keywords: the config overrides, then threads / precision / shapes where given."""
    options = dict(overrides or {})
    for name, value in (("threads", threads), ("precision", precision), ("shapes", shapes)):
        if value is not None:
            options[name] = value
    return options


def job_from_args(args: argparse.Namespace) -> TrackJob:
    load_options = _load_options(args.set, args.threads, args.precision, args.shapes)
    if args.weights is not None:
        load_options["weights"] = args.weights
    return TrackJob(video=args.video, prompts=list(args.prompt), bundle=args.bundle, output=args.output,
                    json_path=args.json, masks_dir=args.masks_dir, start_frame=args.start_frame,
                    max_frames=args.max_frames, backend=args.backend, device=args.device,
                    load_options=load_options, keep_timestamps=args.keep_timestamps,
                    geometric=list(args.geometric or []))


def cmd_track(args: argparse.Namespace) -> int:
    return job_module.run_track(job_from_args(args))


def run_track(video: str | os.PathLike[str], prompts: Sequence[str], *, overrides: dict | None = None,
              threads: int | None = None, precision: str | None = None, shapes: str | None = None,
              stdout: TextIO | None = None, stderr: TextIO | None = None, predictor: Any = None,
              report: dict | None = None, **job: Any) -> int:
    """Deprecated: ``sam3track.jobs.run_track(TrackJob(...))``. The keyword form of earlier releases:
    ``overrides``, ``threads``, ``precision`` and ``shapes`` become the job's ``load_options``; the
    other keywords are :class:`~sam3track.jobs.TrackJob` fields."""
    load_options = _load_options(overrides, threads, precision, shapes)
    job["geometric"] = list(job.get("geometric") or [])
    return job_module.run_track(TrackJob(video=video, prompts=list(prompts), load_options=load_options, **job),
                                stdout=stdout, stderr=stderr, predictor=predictor, report=report)


def add_parser(sub) -> argparse.ArgumentParser:
    """``sam3track track`` and its arguments, on the CLI's subparsers."""
    track = sub.add_parser(
        "track",
        # --bundle is checked by track itself (to explain how to get one), so argparse would
        # print it as optional; spell the usage out.
        usage="%(prog)s VIDEO (--prompt TEXT | --point ... | --box ...) ... --bundle DIR [options]",
        help="track text prompts through a video and write a mask video (and JSON / PNG masks)",
        description=(
            "Find every object matching the text prompts and track it through the video. Writes "
            "the video with tinted masks, boxes and labels (same size, frame count and timing "
            "as the input frames processed), plus optional JSON and PNG masks. Ctrl-C or "
            "SIGTERM stops early (exit code 130 or 143): the frames done are kept as valid "
            "outputs named <stem>.interrupted<suffix> (and <dir>.interrupted for --masks-dir) "
            "beside the paths asked for, which only ever hold complete outputs; a later complete run "
            "removes them. The outputs are locked while a run writes them: a second run aimed at "
            "one of them stops at once (exit code 2), naming the run that holds it.\n\n"
            "Clicks and boxes (video pixels) add or correct objects on given frames: "
            "--point FRAME:X,Y[:LABEL] (LABEL 1 positive, the default, or 0 negative) and "
            "--box FRAME:X0,Y0,X1,Y1, both repeatable. --obj-id ID applies to every --point and "
            "--box after it, up to the next --obj-id. Without an object id, the clicks on one frame "
            "form one new object and each box is a new object; with one, they add to (or refine) "
            "object ID on that frame, a new object if ID is not tracked yet. With --prompt too, a "
            "frame that has clicks for an --obj-id is first tracked with the text, so ID can name an "
            "object the text finds there (the ids --json shows). Prompts must lie on the frames "
            "processed; they are applied before tracking starts at --start-frame."
        ),
    )
    _add_inputs(track)
    _add_outputs(track)
    _add_backend_options(track)
    track.set_defaults(func=cmd_track, geometric=[], usage_error=track.error)
    return track


def _add_inputs(track: argparse.ArgumentParser) -> None:
    """The video, the prompts and the bundle."""
    track.add_argument("video", type=Path, metavar="VIDEO",
                       help="video file (mp4, mkv, mov, ...) or a folder of images")
    track.add_argument("--prompt", "-p", action="append", default=[], metavar="TEXT",
                       help="what to find, e.g. 'person' or 'red car'; repeat for several (optional when "
                            "--point or --box is given)")
    track.add_argument("--point", action=GeometricAction, metavar=POINT_FORM,
                       help="a click on frame FRAME at (X, Y) video pixels; LABEL 1 positive (default) or 0 "
                            "negative; repeatable")
    track.add_argument("--box", action=GeometricAction, metavar=BOX_FORM,
                       help="a box on frame FRAME, corners in video pixels; repeatable")
    track.add_argument("--obj-id", type=int_at_least(0), default=None, metavar="ID",
                       help="the object the --point / --box options after it belong to (until the next "
                            "--obj-id); without one, a frame's clicks make one new object, each box another")
    track.add_argument("--bundle", "-b", type=Path, default=None, metavar="DIR",
                       help="exported bundle (required): python -m graphs.export --checkpoint "
                            "SNAPSHOT --out DIR; `sam3track demo` shows the machinery without one")



def _add_outputs(track: argparse.ArgumentParser) -> None:
    """The mask video, JSON and PNG masks, the frames they cover, and their timing."""
    track.add_argument("-o", "--output", type=Path, default=None, metavar="OUT.mp4",
                       help="mask video to write (.mp4, .m4v, .mov, .mkv); default: "
                            "<video stem>.masks.mp4 next to the input")
    track.add_argument("--json", type=Path, default=None, metavar="OUT.json",
                       help="also write every frame's objects (id, prompt, score, box, COCO RLE "
                            "mask; decode with sam3track.sinks.decode_rle) as JSON")
    track.add_argument("--masks-dir", type=Path, default=None, metavar="DIR",
                       help="also write one PNG per frame, DIR/<frame:06d>.png, whose pixel value "
                            "is object id + 1 (0 = background; 16-bit when an id exceeds 254); "
                            "read with cv2.imread(path, cv2.IMREAD_UNCHANGED); staged in "
                            "DIR.<pid>.<random>.partial beside it and moved into DIR when the run "
                            "completes")
    track.add_argument("--start-frame", type=int_at_least(0), default=0, metavar="N",
                       help="first frame to process (0-based; default 0)")
    track.add_argument("--max-frames", type=int_at_least(1), default=None, metavar="N",
                       help="process at most N frames (default: to the end of the video)")
    track.add_argument("--keep-timestamps", action="store_true",
                       help="give the mask video the input's own timestamps (a clip from "
                            "--start-frame N then starts at frame N's time); default: the first "
                            "frame written is at 0, spacing unchanged")


def _add_backend_options(track: argparse.ArgumentParser) -> None:
    """How the graphs run: backend, device, precision, shapes, threads, config overrides."""
    track.add_argument("--backend", default="auto", metavar="NAME",
                       help="inference backend: auto (default: the fastest installed path whose masks stay "
                            "within the parity tolerances of onnxruntime fp32 here, measured once and cached), "
                            "onnxruntime, openvino (CPU; pip install 'sam3track[openvino]'), or acl for an OM bundle")
    track.add_argument("--device", default="cpu", metavar="NAME",
                       help="device for the backend: cpu, cuda:N or cann:N (onnxruntime), cpu (openvino), "
                            "npu:N (acl) (default: cpu)")
    track.add_argument("--precision", default=None, metavar="fp32|bf16",
                       help="openvino only: fp32 (default), or bf16 on CPUs with bf16 support (AMX, "
                            "AVX512-BF16): faster, results may differ from fp32")
    track.add_argument("--shapes", default=None, choices=("dynamic", "rows", "static"),
                       help="openvino only: dynamic (default: each graph compiled once), rows (a graph "
                            "compiled again once its calls settle on one object count, a second or two, then "
                            "faster: many objects), or static (compiled again for each new call shape, seconds "
                            "each, then faster: long videos)")
    track.add_argument("--weights", default=None, choices=("fp32", "fp16"),
                       help="onnxruntime or openvino, on the CPU: fp32 (default), or fp16: weights kept in "
                            "fp16, about half their memory (full size, onnxruntime: 2.4 instead of 3.5 GB at "
                            "one object), results within fp16 rounding (with --precision bf16 objects found "
                            "may differ)")
    track.add_argument("--threads", type=int_at_least(1), default=None, metavar="N",
                       help="intra-op threads for the backend (default: the backend's own, every core)")
    track.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a threshold or heuristic of the bundle's configuration, e.g. "
                            "--set new_det_thresh=0.6 (names: sam3track/config.py); repeat for several")
