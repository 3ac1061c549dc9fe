"""``sam3track batch``: track text prompts through many videos on Ray workers (:mod:`sam3track.batch`)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sam3track.commands.common import EXIT_ERROR, EXIT_OK, Paragraphs, int_at_least, setting
from sam3track.jobs.interrupts import InterruptGuard, exit_code_for
from sam3track.errors import Sam3TrackError
from sam3track.progress import progress_bar

EXIT_SOME_FAILED = 1  # the run finished, but at least one video failed (see the ledger)


def summary_table(rows: list, elapsed: float) -> str:
    """The end-of-run table: one line per failed video, then the counts (successes are not listed:
    the ledger has every video)."""
    failed = [s for s in rows if not s.done]
    done = [s for s in rows if s.done and not s.skipped]
    skipped = sum(1 for s in rows if s.skipped)
    lines = []
    if failed:
        lines.append(f"{'status':<8} {'attempts':>8} {'seconds':>8}  video: reason")
        lines += [f"{s.status:<8} {s.attempts:>8} {s.seconds:>8.2f}  {s.video}: {s.reason}" for s in failed]
    frames = sum(s.frames for s in done)
    rate = f"; {frames / elapsed:.1f} frames/s, {60 * len(done) / elapsed:.1f} videos/min" \
        if elapsed > 0 and done else ""
    lines.append(f"{len(done)} done, {len(failed)} failed, {skipped} skipped (done before) in "
                 f"{elapsed:.1f} s, {frames} frames{rate}")
    return "\n".join(lines)


@dataclass
class _Shown:
    """The one progress bar (frames across the batch) and what the run printed so far."""

    err: TextIO
    bar: Any = None
    frames: int = 0

    def progress(self, p: Any) -> None:
        if self.bar is None:
            return
        postfix = {"videos": f"{p.finished}/{p.videos}", "failed": p.failed}
        if p.waiting:
            postfix["waiting"] = f"{p.waiting} workers"
        self.bar.set_postfix(postfix, refresh=False)
        if p.frames > self.frames:
            self.bar.update(p.frames - self.frames)
            self.frames = p.frames

    def note(self, message: str) -> None:
        write = getattr(self.bar, "write", None)  # tqdm: above the bar, which stays drawn
        if write is not None:
            write(f"note: {message}", file=self.err)
        else:
            print(f"note: {message}", file=self.err, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_batch(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from sam3track.batch import LEDGER_NAME
    from sam3track.batch.storage import absolute, join

    out = out or sys.stdout
    err = err or sys.stderr
    rows: list = []
    shown = _Shown(err, progress_bar(None, "tracking", "frame", err, dynamic_ncols=True))
    started = time.perf_counter()
    try:
        with InterruptGuard():  # SIGINT and SIGTERM stop the batch cleanly, as they stop `track`, even where
            return _run(args, out, err, shown, rows, started)  # the shell started it with SIGINT ignored
    except KeyboardInterrupt as e:
        shown.close()
        done = sum(1 for s in rows if s.done)
        print(f"interrupted: {done} videos done are in the ledger {join(absolute(args.out), LEDGER_NAME)}; "
              f"run the same command again to finish the others", file=err)
        return exit_code_for(e)


def _run(args: argparse.Namespace, out: TextIO, err: TextIO, shown: "_Shown", rows: list, started: float) -> int:
    from sam3track.batch import track_videos

    try:
        results = track_videos(
            args.inputs, args.prompt, args.bundle, args.out, workers=args.workers,
            address=args.address, backend=args.backend, device=args.device, outputs=args.outputs,
            overrides=dict(args.set), cpus_per_worker=args.cpus_per_worker,
            on_progress=shown.progress, note=shown.note,
        )
        try:
            for summary in results:
                rows.append(summary)
        finally:
            results.close()  # on Ctrl-C: the workers are stopped, the ledger closed
    except Sam3TrackError as e:
        shown.close()
        print(f"error: {e}", file=err)
        return EXIT_ERROR
    shown.close()
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
            "one predictor loaded once. Without --address (or RAY_ADDRESS) a local Ray starts in "
            "this process; with it the run joins that cluster (ray start --head on the first host). "
            "Relative paths are made absolute here, before any worker sees them. Outputs per "
            "video: OUT/<stem>-<hash>.masks.mp4 (+ .json, .masks/ PNGs), the hash from the input's "
            "path, written as sam3track track writes them. OUT/ledger.jsonl records each video "
            "done or failed; running the same command again skips what is done and retries what "
            "failed. A worker that dies is replaced and its video redone from the start.\n\n"
            "exit codes: 0 all done, 1 some videos failed (see the table and the ledger), 2 bad "
            "arguments, 130 Ctrl-C (what finished is in the ledger)"
        ).replace("\n\n", "\0"),
        formatter_class=Paragraphs,
    )
    batch.add_argument("inputs", nargs="+", metavar="INPUTS",
                       help="video files, folders (searched recursively for videos) or .txt files "
                            "listing one path a line; local paths or URLs (s3://, gs://: pip install "
                            "'sam3track[cloud]')")
    batch.add_argument("--prompt", "-p", action="append", required=True, metavar="TEXT",
                       help="what to find; repeat for several")
    batch.add_argument("--bundle", "-b", type=Path, required=True, metavar="DIR",
                       help="exported bundle folder (on every host of a cluster, same path)")
    batch.add_argument("--out", required=True, metavar="DIR|URL",
                       help="folder (or object-store URL) for every video's outputs and ledger.jsonl "
                            "(a local folder is created if needed; never searched for inputs)")
    batch.add_argument("--workers", type=int_at_least(1), default=1, metavar="N",
                       help="model replicas, one process and predictor each (default 1; on GPUs, "
                            "one per device; a local Ray starts no more than cores and memory hold)")
    batch.add_argument("--cpus-per-worker", type=int_at_least(1), default=None, metavar="N",
                       help="CPUs each worker reserves and its inference threads (default: the cores "
                            "shared among local workers; 1 on a cluster)")
    batch.add_argument("--address", default=None, metavar="auto|HOST:PORT|ray://HOST:PORT",
                       help="join this Ray cluster (default: the one in RAY_ADDRESS if set, else a "
                            "local Ray started in this process)")
    batch.add_argument("--outputs", default="mp4,json", metavar="mp4,json,png",
                       help="what to write per video: mp4 (always), json (COCO RLE masks), png "
                            "(a folder of label PNGs) (default: mp4,json)")
    batch.add_argument("--backend", default="auto", metavar="NAME",
                       help="inference backend: auto (default: the fastest path within the parity tolerances "
                            "here, measured once per machine and cached), onnxruntime, openvino")
    batch.add_argument("--device", default="cpu", metavar="NAME",
                       help="cpu, or cuda (one GPU per worker, assigned by Ray) (default: cpu)")
    batch.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a threshold of the bundle's configuration; repeatable")
    batch.set_defaults(func=cmd_batch)
    return batch
