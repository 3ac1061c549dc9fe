"""``sam3track demo``: ``track`` on the bundled bikes.mp4 with the RANDOM-weights demo bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from sam3track.commands.common import EXIT_ERROR, int_at_least, print_error
from sam3track.jobs import track as track_job
from sam3track.errors import Sam3TrackError

DEMO_PROMPTS = ("person", "bike")
DEMO_START_FRAME = 76  # a shot with a cyclist (frames 76-136 are one continuous shot)
DEMO_MAX_FRAMES = 48
# With random weights the tracker's masks rarely match the detector's, so the hotstart rules would
# remove nearly every new object; the demo turns them off to show tracking at all.
DEMO_OVERRIDES = {"hotstart_delay": 0}

RANDOM_WEIGHTS_NOTE = """\
NOTE: the demo bundle is a small SAM 3 with RANDOM weights. Its masks show the machinery
(decoding, tracking, drawing, writing), not the model's skill.
For real masks, export a facebook/sam3 snapshot and track with it:
    python -m graphs.export --checkpoint /path/to/facebook-sam3-snapshot --out sam3-bundle
    sam3track track video.mp4 --prompt dog --bundle sam3-bundle"""


def demo_clip() -> Path:
    """``examples/clips/bikes.mp4`` of the repository checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "examples" / "clips" / "bikes.mp4"


def cmd_demo(args: argparse.Namespace) -> int:
    print(RANDOM_WEIGHTS_NOTE, flush=True)
    clip = demo_clip()
    if not clip.is_file():
        print_error(
            f"the demo clip {clip} is not here: it ships with the repository checkout, not the "
            f"installed package; run `sam3track track YOUR_VIDEO --prompt person` instead"
        )
        return EXIT_ERROR
    output = args.output if args.output is not None else Path.cwd() / "bikes.masks.mp4"
    try:
        from sam3track.demo import demo_bundle_path

        bundle = demo_bundle_path()  # shipped with the package: nothing to build
    except Sam3TrackError as e:
        print_error(str(e))
        return EXIT_ERROR
    print(f"tracking {', '.join(repr(p) for p in DEMO_PROMPTS)} in {clip} "
          f"({args.max_frames} frames from frame {DEMO_START_FRAME}) with {bundle}; hotstart removal off",
          flush=True)
    job = track_job.TrackJob(clip, list(DEMO_PROMPTS), bundle=bundle, output=output, start_frame=DEMO_START_FRAME,
                             max_frames=args.max_frames, backend=args.backend, device=args.device,
                             load_options=dict(DEMO_OVERRIDES))
    return track_job.run_track(job)


def add_parser(sub) -> argparse.ArgumentParser:
    """``sam3track demo`` and its arguments, on the CLI's subparsers."""
    demo = sub.add_parser(
        "demo",
        help="track 'person' and 'bike' in the bundled bikes.mp4 with the RANDOM-weights demo bundle",
        description=(
            "Runs `track` on examples/clips/bikes.mp4 with the demo bundle, a tiny SAM 3 with "
            "RANDOM weights shipped with the package: the masks show the machinery, not the model's "
            "skill. Export a real facebook/sam3 snapshot with python -m graphs.export for real "
            "masks."
        ),
    )
    demo.add_argument("-o", "--output", type=Path, default=None, metavar="OUT.mp4",
                      help="mask video to write (default: ./bikes.masks.mp4)")
    demo.add_argument("--max-frames", type=int_at_least(1), default=DEMO_MAX_FRAMES, metavar="N",
                      help=f"frames to process (default {DEMO_MAX_FRAMES})")
    demo.add_argument("--backend", default="auto", metavar="NAME", help=argparse.SUPPRESS)
    demo.add_argument("--device", default="cpu", metavar="NAME", help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
    return demo
