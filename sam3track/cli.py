"""The ``sam3track`` command: track text prompts through a video, run the demo, inspect a bundle.

    sam3track track VIDEO --prompt TEXT [--prompt TEXT ...] --bundle DIR [-o OUT.mp4]
                    [--json OUT.json] [--masks-dir DIR] [--start-frame N] [--max-frames N]
                    [--keep-timestamps] [--obj-id ID] [--point FRAME:X,Y[:LABEL] ...]
                    [--box FRAME:X0,Y0,X1,Y1 ...]
    sam3track batch INPUTS... --prompt TEXT [--prompt TEXT ...] --bundle DIR --out DIR
                    [--workers N] [--address auto|ray://HOST:PORT] [--outputs mp4,json,png]
    sam3track demo [-o OUT.mp4] [--max-frames N]
    sam3track info BUNDLE

Exit codes: 0 success, 2 bad input (the message on stderr says what and where), 130 / 143
stopped by Ctrl-C / SIGTERM (the frames finished before it are left beside the outputs under
``.interrupted`` names; the paths asked for only ever hold complete outputs).

This module parses the command line and dispatches; each subcommand lives in
:mod:`sam3track.commands` (``track``, ``demo``, ``info``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import sam3track
from sam3track.commands.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, CliError
from sam3track.commands.batch import cmd_batch
from sam3track.commands.demo import DEMO_MAX_FRAMES, cmd_demo, demo_clip
from sam3track.commands.info import cmd_info
from sam3track.commands.prompts import BOX_FORM, POINT_FORM, GeometricAction
from sam3track.commands.track import cmd_track, run_track

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "CliError",
    "build_parser",
    "demo_clip",
    "main",
    "run_track",
]


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


class _Paragraphs(argparse.HelpFormatter):
    """Wraps a description like the default formatter, keeping its paragraphs (marked by NUL)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(super(_Paragraphs, self)._fill_text(part, width, indent)
                           for part in text.split("\0"))


class _OneLineErrors(argparse.ArgumentParser):
    """Usage mistakes reported like every other user error: one ``error:`` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="sam3track",
        description="SAM 3 video tracking from exported graphs (no PyTorch at run time).",
        epilog=(
            "examples:\n"
            "  sam3track demo                                   # the shipped random-weights bundle\n"
            "  python -m graphs.export --checkpoint SNAPSHOT --out sam3-bundle\n"
            "  sam3track track video.mp4 --prompt dog --bundle sam3-bundle --json dog.json\n"
            "  sam3track info sam3-bundle\n\n"
            "exit codes: 0 ok, 2 bad input, 130 Ctrl-C / 143 SIGTERM (the frames done are\n"
            "left beside the outputs as <stem>.interrupted<suffix>; complete outputs are kept)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sam3track {sam3track.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
            "beside the paths asked for, which only ever hold complete outputs.\n\n"
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
    track.add_argument("--obj-id", type=_int_at_least(0), default=None, metavar="ID",
                       help="the object the --point / --box options after it belong to (until the next "
                            "--obj-id); without one, a frame's clicks make one new object, each box another")
    track.add_argument("--bundle", "-b", type=Path, default=None, metavar="DIR",
                       help="exported bundle (required): python -m graphs.export --checkpoint "
                            "SNAPSHOT --out DIR; `sam3track demo` shows the machinery without one")
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
                            "DIR.partial and moved into DIR when the run completes")
    track.add_argument("--start-frame", type=_int_at_least(0), default=0, metavar="N",
                       help="first frame to process (0-based; default 0)")
    track.add_argument("--max-frames", type=_int_at_least(1), default=None, metavar="N",
                       help="process at most N frames (default: to the end of the video)")
    track.add_argument("--keep-timestamps", action="store_true",
                       help="give the mask video the input's own timestamps (a clip from "
                            "--start-frame N then starts at frame N's time); default: the first "
                            "frame written is at 0, spacing unchanged")
    track.add_argument("--backend", default="onnxruntime", metavar="NAME",
                       help="inference backend: onnxruntime, openvino (CPU; pip install "
                            "'sam3track[openvino]'), or acl for an OM bundle (default: onnxruntime)")
    track.add_argument("--device", default="cpu", metavar="NAME",
                       help="device for the backend: cpu, cuda:N or cann:N (onnxruntime), cpu (openvino), "
                            "npu:N (acl) (default: cpu)")
    track.add_argument("--precision", default=None, metavar="fp32|bf16",
                       help="openvino only: fp32 (default), or bf16 on CPUs with bf16 support (AMX, "
                            "AVX512-BF16): faster, results may differ from fp32")
    track.add_argument("--shapes", default=None, choices=("dynamic", "static"),
                       help="openvino only: dynamic (default: each graph compiled once), or static (compiled "
                            "again for each new call shape, seconds each, then faster: long videos)")
    track.add_argument("--threads", type=_int_at_least(1), default=None, metavar="N",
                       help="intra-op threads for the backend (default: the backend's own, every core)")
    track.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a threshold or heuristic of the bundle's configuration, e.g. "
                            "--set new_det_thresh=0.6 (names: sam3track/config.py); repeat for several")
    track.set_defaults(func=cmd_track, geometric=[], usage_error=track.error)

    batch = sub.add_parser(
        "batch",
        help="track text prompts through many videos on Ray workers (pip install 'sam3track[ray]')",
        description=(
            "Track the prompts through every input video on --workers Ray workers, each holding "
            "one predictor loaded once. Without --address a local Ray starts in this process; "
            "with it the run joins that cluster (ray start --head on the first host). Outputs per "
            "video: OUT/<stem>-<hash>.masks.mp4 (+ .json, .masks/ PNGs), the hash from the input's "
            "path, written as sam3track track writes them. OUT/ledger.jsonl records each video "
            "done or failed; running the same command again skips what is done and retries what "
            "failed. A worker that dies is replaced and its video redone from the start.\n\n"
            "exit codes: 0 all done, 1 some videos failed (see the table and the ledger), 2 bad "
            "arguments, 130 Ctrl-C (what finished is in the ledger)"
        ).replace("\n\n", "\0"),
        formatter_class=_Paragraphs,
    )
    batch.add_argument("inputs", nargs="+", type=Path, metavar="INPUTS",
                       help="video files, folders (searched recursively for videos) or .txt files "
                            "listing one path a line")
    batch.add_argument("--prompt", "-p", action="append", required=True, metavar="TEXT",
                       help="what to find; repeat for several")
    batch.add_argument("--bundle", "-b", type=Path, required=True, metavar="DIR",
                       help="exported bundle folder (on every host of a cluster, same path)")
    batch.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="folder for every video's outputs and ledger.jsonl (created if needed)")
    batch.add_argument("--workers", type=_int_at_least(1), default=1, metavar="N",
                       help="model replicas, one process and predictor each (default 1; on GPUs, "
                            "one per device)")
    batch.add_argument("--address", default=None, metavar="auto|ray://HOST:PORT",
                       help="join this Ray cluster (default: start a local one in this process)")
    batch.add_argument("--outputs", default="mp4,json", metavar="mp4,json,png",
                       help="what to write per video: mp4 (always), json (COCO RLE masks), png "
                            "(a folder of label PNGs) (default: mp4,json)")
    batch.add_argument("--backend", default="onnxruntime", metavar="NAME",
                       help="inference backend (default: onnxruntime)")
    batch.add_argument("--device", default="cpu", metavar="NAME",
                       help="cpu, or cuda (one GPU per worker, assigned by Ray) (default: cpu)")
    batch.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a threshold of the bundle's configuration; repeatable")
    batch.set_defaults(func=cmd_batch)

    demo = sub.add_parser(
        "demo",
        help="track 'person' and 'bike' in the bundled bikes.mp4 with the RANDOM-weights demo bundle",
        description=(
            "Runs `track` on examples/clips/bikes.mp4 with the demo bundle, a tiny SAM 3 with "
            "RANDOM weights built on first use: the masks show the machinery, not the model's "
            "skill. Export a real facebook/sam3 snapshot with python -m graphs.export for real "
            "masks."
        ),
    )
    demo.add_argument("-o", "--output", type=Path, default=None, metavar="OUT.mp4",
                      help="mask video to write (default: ./bikes.masks.mp4)")
    demo.add_argument("--max-frames", type=_int_at_least(1), default=DEMO_MAX_FRAMES, metavar="N",
                      help=f"frames to process (default {DEMO_MAX_FRAMES})")
    demo.add_argument("--backend", default="onnxruntime", metavar="NAME", help=argparse.SUPPRESS)
    demo.add_argument("--device", default="cpu", metavar="NAME", help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)

    info = sub.add_parser(
        "info",
        help="describe a bundle: source, graphs, tensors and the backends that can run it",
        description="Print a bundle's manifest in brief.",
    )
    info.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle folder")
    info.set_defaults(func=cmd_info)
    return parser


def _setting(text: str) -> tuple[str, object]:
    """NAME=VALUE with VALUE read as JSON when it parses (numbers, true/false), else as text."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sam3track`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "track" and not args.prompt and not args.geometric:
            args.usage_error("give at least one --prompt TEXT, --point FRAME:X,Y or --box FRAME:X0,Y0,X1,Y1")
    except SystemExit as e:  # --help, --version, or a usage error (argparse prints it)
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
