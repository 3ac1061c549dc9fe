"""``sam3track batch``: track text prompts through many videos on Ray workers (:mod:`sam3track.batch`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from sam3track.commands.common import EXIT_ERROR, EXIT_OK, Paragraphs, int_at_least, setting
from sam3track.jobs.interrupts import exit_code_for
from sam3track.errors import Sam3TrackError
from sam3track.progress import progress_bar

EXIT_SOME_FAILED = 1  # the run finished, but at least one video failed (see the ledger)


def summary_table(rows: list, elapsed: float) -> str:
    """The end-of-run table: one line per video, then the totals."""
    lines = [f"{'status':<8} {'frames':>6} {'objects':>7} {'seconds':>8}  video / reason"]
    for s in rows:
        status = "skipped" if s.skipped else s.status
        detail = s.video if s.done else f"{s.video}: {s.reason}"
        lines.append(f"{status:<8} {s.frames:>6} {s.objects:>7} {s.seconds:>8.2f}  {detail}")
    done = [s for s in rows if s.done and not s.skipped]
    frames = sum(s.frames for s in done)
    failed = sum(1 for s in rows if not s.done)
    skipped = sum(1 for s in rows if s.skipped)
    rate = f"{frames / elapsed:.1f} frames/s, {60 * len(done) / elapsed:.1f} videos/min" \
        if elapsed > 0 else ""
    lines.append(f"{len(done)} done, {failed} failed, {skipped} skipped (done before) in "
                 f"{elapsed:.1f} s; {rate}")
    return "\n".join(lines)


def run_batch(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from sam3track.batch import collect_inputs, track_videos

    out = out or sys.stdout
    err = err or sys.stderr
    rows: list = []
    bar = None
    started = time.perf_counter()
    try:
        total = len(collect_inputs(args.inputs))
        bar = progress_bar(total, "videos", "video", err, dynamic_ncols=True)
        frames = 0
        results = track_videos(
            args.inputs, args.prompt, args.bundle, args.out, workers=args.workers,
            address=args.address, backend=args.backend, device=args.device,
            outputs=args.outputs, overrides=dict(args.set),
        )
        try:
            for summary in results:
                rows.append(summary)
                if not summary.skipped:
                    frames += summary.frames
                elapsed = time.perf_counter() - started
                failed = sum(1 for s in rows if not s.done)
                bar.set_postfix({"frames/s": f"{frames / elapsed:.1f}", "failed": failed},
                                refresh=False)
                bar.update(1)
        finally:
            results.close()  # on Ctrl-C: the workers are stopped, the ledger closed
    except KeyboardInterrupt as e:
        if bar is not None:
            bar.close()
        done = sum(1 for s in rows if s.done)
        print(f"interrupted: {done} videos done are in the ledger {args.out}/ledger.jsonl; "
              f"run the same command again to finish the others", file=err)
        return exit_code_for(e)
    except Sam3TrackError as e:
        if bar is not None:
            bar.close()
        print(f"error: {e}", file=err)
        return EXIT_ERROR
    bar.close()
    print(summary_table(rows, time.perf_counter() - started), file=out)
    return EXIT_SOME_FAILED if any(not s.done for s in rows) else EXIT_OK


def cmd_batch(args: argparse.Namespace) -> int:
    return run_batch(args)


def add_parser(sub) -> argparse.ArgumentParser:
    """``sam3track batch`` and its arguments, on the CLI's subparsers."""
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
        formatter_class=Paragraphs,
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
    batch.add_argument("--workers", type=int_at_least(1), default=1, metavar="N",
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
    batch.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a threshold of the bundle's configuration; repeatable")
    batch.set_defaults(func=cmd_batch)
    return batch
