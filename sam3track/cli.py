"""The ``sam3track`` command: track text prompts through a video, run the demo, inspect a bundle.

    sam3track track VIDEO --prompt TEXT [--prompt TEXT ...] [--bundle DIR] [-o OUT.mp4]
                    [--json OUT.json] [--masks-dir DIR] [--start-frame N] [--max-frames N]
    sam3track demo [-o OUT.mp4] [--max-frames N]
    sam3track info BUNDLE

Exit codes: 0 success, 2 bad input (the message on stderr says what and where), 130 interrupted
(Ctrl-C; the outputs hold the frames finished before it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

import sam3track
from sam3track.errors import Sam3TrackError
from sam3track.render import draw_objects
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.video import MaskVideoWriter, open_source

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd program

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv")  # what MaskVideoWriter can write
MASK_ID_OFFSET = 1  # object ids start at 0; PNG value 0 is background
DEMO_PROMPTS = ("person", "bike")
DEMO_MAX_FRAMES = 48

RANDOM_WEIGHTS_NOTE = """\
NOTE: the demo bundle is a tiny SAM 3 with RANDOM weights. Its masks show the machinery
(decoding, tracking, drawing, writing), not the model's skill.
For real masks, export a facebook/sam3 snapshot and track with it:
    python -m graphs.export --checkpoint /path/to/facebook-sam3-snapshot --out sam3-bundle
    sam3track track video.mp4 --prompt dog --bundle sam3-bundle"""


class CliError(Sam3TrackError):
    """A command-line argument is wrong (reported like every other user error)."""


def _err(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------------
# Ctrl-C handling
# ------------------------------------------------------------------------------------------


class _InterruptGuard:
    """Turns SIGINT into KeyboardInterrupt, except inside :meth:`atomic` blocks.

    A frame is written to the video, the JSON and the masks folder inside one atomic block, so
    an interrupted run leaves every output holding the same frames. A Ctrl-C arriving inside the
    block is remembered and raised right after it; while outputs are being finalised
    (:meth:`finalising`) further Ctrl-Cs are ignored so the files are always closed properly.
    Installed only on the main thread (the only one Python delivers signals to).
    """

    def __init__(self) -> None:
        self._deferring = False
        self._ignoring = False
        self._pending = False
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self._ignoring:
            return
        if self._deferring:
            self._pending = True
            return
        raise KeyboardInterrupt

    def __enter__(self) -> "_InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    @contextmanager
    def atomic(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    @contextmanager
    def finalising(self) -> Iterator[None]:
        self._ignoring = True
        try:
            yield
        finally:
            self._ignoring = False


# ------------------------------------------------------------------------------------------
# Checking outputs before any work is done
# ------------------------------------------------------------------------------------------


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _check_dir_writable(folder: Path, target: Path, what: str) -> None:
    if not folder.exists():
        existing = _nearest_existing(folder)
        if existing.exists() and not existing.is_dir():
            raise CliError(f"cannot write {what} {target}: {existing} is a file, not a folder")
        raise CliError(f"cannot write {what} {target}: folder {folder} does not exist; create it")
    if not folder.is_dir():
        raise CliError(f"cannot write {what} {target}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"cannot write {what} {target}: folder {folder} is not writable")


def _check_output_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise CliError(f"cannot write {what} {path}: it is a folder; give a file name")
    _check_dir_writable(path.parent, path, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise CliError(f"cannot write {what} {path}: the file exists and is read-only")


def _check_masks_dir(path: Path) -> None:
    if path.exists():
        if not path.is_dir():
            raise CliError(f"cannot write the masks folder {path}: it is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CliError(f"cannot write the masks folder {path}: it is not writable")
        return
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise CliError(f"cannot create the masks folder {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"cannot create the masks folder {path}: folder {existing} is not writable")


def _default_output(video: Path) -> Path:
    if video.is_dir():  # an image folder: <folder>.masks.mp4 beside it
        return video.parent / f"{video.name}.masks.mp4"
    return video.with_name(f"{video.stem}.masks.mp4")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------
# track
# ------------------------------------------------------------------------------------------


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
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Track ``prompts`` through ``video`` and write the outputs; returns the exit code.

    User errors (:class:`Sam3TrackError`, and OSError on outputs) are printed as
    ``error: <message>`` and give 2; a Ctrl-C gives 130 after finalising partial outputs.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        with _InterruptGuard() as guard:
            return _track(
                guard, Path(video), list(prompts), bundle, output, json_path, masks_dir,
                start_frame, max_frames, backend, device, out, err,
            )
    except KeyboardInterrupt:  # before any output was opened
        print("interrupted before any frame was processed; no outputs written", file=err)
        return EXIT_INTERRUPTED
    except Sam3TrackError as e:
        print(f"error: {e}", file=err)
        return EXIT_ERROR
    except OSError as e:
        print(f"error: {e}", file=err)
        return EXIT_ERROR


def _track(
    guard: _InterruptGuard,
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
    out: TextIO,
    err: TextIO,
) -> int:
    # 1. Arguments that need no file access.
    if not prompts:
        raise CliError("give at least one --prompt TEXT (e.g. --prompt person)")
    for text in prompts:
        if not text.strip():
            raise CliError("--prompt is empty; give the words to find, e.g. --prompt 'red car'")
    if max_frames is not None and max_frames < 1:
        raise CliError(f"--max-frames must be at least 1, got {max_frames}")
    if start_frame < 0:
        raise CliError(f"--start-frame must be 0 or more, got {start_frame}")

    # 2. The input video (missing, not a video, no frames, undecodable: VideoError here).
    reader = open_source(video)
    try:
        n_frames = len(reader)
        if start_frame >= n_frames:
            raise CliError(
                f"--start-frame {start_frame} is outside {video}, which has {n_frames} frames "
                f"(valid: 0..{n_frames - 1})"
            )
        stop = n_frames if max_frames is None else min(n_frames, start_frame + max_frames)

        # 3. Outputs, checked before any work so a typo doesn't cost a whole run.
        video_out = Path(output) if output is not None else _default_output(video)
        if video_out.suffix.lower() not in VIDEO_SUFFIXES:
            raise CliError(
                f"cannot write {video_out}: unknown video suffix {video_out.suffix!r}; "
                f"use one of {', '.join(VIDEO_SUFFIXES)}"
            )
        _check_output_file(video_out, "the video")
        json_out = Path(json_path) if json_path is not None else None
        if json_out is not None:
            _check_output_file(json_out, "the JSON")
        masks_out = Path(masks_dir) if masks_dir is not None else None
        if masks_out is not None:
            _check_masks_dir(masks_out)
        named = [("-o", video_out), ("--json", json_out), ("--masks-dir", masks_out)]
        for flag, path in named:
            if path is not None and _same_file(path, video):
                raise CliError(f"{flag} {path} is the input video; choose another output path")
        files = [(f, p) for f, p in named if p is not None]
        for i, (flag_a, a) in enumerate(files):
            for flag_b, b in files[i + 1:]:
                if _same_file(a, b):
                    raise CliError(f"{flag_a} and {flag_b} both name {a}; give them different paths")

        # 4. The bundle (the demo bundle, built on first use, when none is given).
        if bundle is None:
            from sam3track.demo import demo_bundle_path

            bundle_dir = demo_bundle_path(log=lambda line: print(line, file=err))
            print(
                f"note: no --bundle given; using the demo bundle {bundle_dir}, which has RANDOM "
                f"weights (the masks show the machinery, not the model); see `sam3track demo`",
                file=err,
            )
        else:
            bundle_dir = Path(bundle)
            if not bundle_dir.exists():
                raise CliError(
                    f"bundle folder not found: {bundle_dir}; export one with "
                    f"python -m graphs.export --checkpoint SNAPSHOT --out {bundle_dir}"
                )
            if not bundle_dir.is_dir():
                raise CliError(f"--bundle {bundle_dir} is a file; pass the bundle's folder")
        try:
            predictor = sam3track.load(bundle_dir, backend=backend, device=device)
        except (Sam3TrackError, KeyboardInterrupt):
            raise
        except Exception as e:  # a backend's own exception type: still the bundle's fault
            raise sam3track.BundleError(
                f"cannot load the bundle {bundle_dir} with {backend} on {device}: "
                f"{type(e).__name__}: {e}"
            ) from e
        try:
            with predictor.start_session(str(video)) as session:
                for text in prompts:
                    session.add_prompt(frame_index=start_frame, text=text)
                return _propagate(
                    guard, session, reader, video, prompts, start_frame, stop, max_frames,
                    video_out, json_out, masks_out, bundle_dir, out, err,
                )
        finally:
            predictor.close()
    finally:
        reader.close()


def _propagate(
    guard: _InterruptGuard,
    session: Any,
    reader: Any,
    video: Path,
    prompts: list[str],
    start: int,
    stop: int,
    max_frames: int | None,
    video_out: Path,
    json_out: Path | None,
    masks_out: Path | None,
    bundle_dir: Path,
    out: TextIO,
    err: TextIO,
) -> int:
    sinks: list[Any] = []
    written: list[Path] = []
    done = 0
    seen: set[int] = set()
    bar = None
    frames = None
    results = None
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
                "bundle": str(bundle_dir),
                "start_frame": start,
                "max_frames": max_frames,
                "width": reader.width,
                "height": reader.height,
                "fps": float(reader.frame_rate),
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
        frames = reader.frames(start, stop)
        results = session.propagate(direction="forward", start_frame=start, max_frames=max_frames)
        for result in results:
            frame = next(frames, None)
            if frame is None:
                raise Sam3TrackError(
                    f"the predictor returned frame {result.frame_index}, past the last frame "
                    f"asked for ({stop - 1}); this is a bug in sam3track, please report it"
                )
            if int(result.frame_index) != frame.index:
                raise Sam3TrackError(
                    f"the predictor returned frame {result.frame_index} where frame "
                    f"{frame.index} was expected; this is a bug in sam3track, please report it"
                )
            rendered = draw_objects(frame.rgb, result)
            with guard.atomic():  # all outputs get this frame, or none does
                writer.write(rendered, pts=frame.pts, time_base=frame.time_base)
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
    except KeyboardInterrupt:
        with guard.finalising():
            _close_bar(bar)
            kept = _close_all(sinks, written, complete=False, frames_done=done)
        where = f"partial outputs written to {', '.join(kept)}" if kept else "no outputs written"
        print(f"interrupted after {done} frames; {where}", file=err)
        return EXIT_INTERRUPTED
    except (Sam3TrackError, OSError) as e:
        with guard.finalising():
            _close_bar(bar)
            kept = _close_all(sinks, written, complete=False, frames_done=done)
        where = f"; partial outputs ({done} frames) written to {', '.join(kept)}" if kept else ""
        print(f"error: {e}{where}", file=err)
        return EXIT_ERROR
    finally:
        for generator in (frames, results):
            if generator is not None and hasattr(generator, "close"):
                generator.close()

    with guard.finalising():
        _close_bar(bar)
        try:
            for sink in sinks:
                sink.close(complete=True)
        except (Sam3TrackError, OSError):
            _close_all(sinks, written, complete=False, frames_done=done)
            raise
    elapsed = time.perf_counter() - started
    fps = done / elapsed if elapsed > 0 else float("inf")
    outputs = ", ".join(str(p) + ("/" if p == masks_out else "") for p in written)
    print(
        f"tracked {done} frames ({start}..{start + done - 1}) in {elapsed:.1f} s "
        f"({fps:.1f} frames/s), {len(seen)} object{'' if len(seen) == 1 else 's'} seen; "
        f"wrote {outputs}",
        file=out,
    )
    return EXIT_OK


def _close_bar(bar: Any) -> None:
    if bar is not None:
        try:
            bar.close()
        except Exception:
            pass


def _drop_interrupt_notes(record: logging.LogRecord) -> bool:
    # The sinks log "run interrupted: <file> holds N frames" each; the CLI says it in one line.
    return not str(record.msg).startswith("run interrupted")


def _close_all(
    sinks: list[Any], paths: list[Path], complete: bool, frames_done: int
) -> list[str]:
    """Close every sink (never raising); the paths that hold something afterwards.

    With no frame done, the JSON (valid but empty) is removed like the video, which the writer
    never creates without a frame, so a run stopped early leaves no empty outputs behind.
    """
    kept = []
    loggers = [logging.getLogger(name) for name in ("sam3track.video.writer", "sam3track.sinks")]
    for logger in loggers:
        logger.addFilter(_drop_interrupt_notes)
    try:
        for sink, path in zip(sinks, paths):
            try:
                result = sink.close(complete=complete)
            except Exception as e:  # finalising one output must not stop the others
                print(f"warning: could not finish {path}: {e}", file=sys.stderr)
                continue
            if frames_done == 0 or getattr(sink, "frames_written", 1) == 0:
                if isinstance(sink, JsonSink) and result is not None:
                    Path(result).unlink(missing_ok=True)
                continue
            if result is not None and Path(result).exists():
                kept.append(str(path) + ("/" if isinstance(sink, MasksDirSink) else ""))
    finally:
        for logger in loggers:
            logger.removeFilter(_drop_interrupt_notes)
    return kept


def _cmd_track(args: argparse.Namespace) -> int:
    return run_track(
        args.video, args.prompt, bundle=args.bundle, output=args.output, json_path=args.json,
        masks_dir=args.masks_dir, start_frame=args.start_frame, max_frames=args.max_frames,
        backend=args.backend, device=args.device,
    )


# ------------------------------------------------------------------------------------------
# demo
# ------------------------------------------------------------------------------------------


def demo_clip() -> Path:
    """``examples/clips/bikes.mp4`` of the repository checkout this package runs from."""
    return Path(__file__).resolve().parents[1] / "examples" / "clips" / "bikes.mp4"


def _cmd_demo(args: argparse.Namespace) -> int:
    print(RANDOM_WEIGHTS_NOTE, flush=True)
    clip = demo_clip()
    if not clip.is_file():
        _err(
            f"the demo clip {clip} is not here: it ships with the repository checkout, not the "
            f"installed package; run `sam3track track YOUR_VIDEO --prompt person` instead"
        )
        return EXIT_ERROR
    output = args.output if args.output is not None else Path.cwd() / "bikes.masks.mp4"
    try:
        from sam3track.demo import demo_bundle_path

        bundle = demo_bundle_path(log=lambda line: print(line, file=sys.stderr))
    except Sam3TrackError as e:
        _err(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted while building the demo bundle; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"tracking {', '.join(repr(p) for p in DEMO_PROMPTS)} in {clip} "
          f"(first {args.max_frames} frames) with {bundle}", flush=True)
    return run_track(
        clip, DEMO_PROMPTS, bundle=bundle, output=output, max_frames=args.max_frames,
        backend=args.backend, device=args.device,
    )


# ------------------------------------------------------------------------------------------
# info
# ------------------------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _fmt_shape(shape: Any) -> str:
    if not isinstance(shape, list):
        return str(shape)
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fmt_params(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "? parameters"
    if n >= 1e9:
        return f"{n / 1e9:.2f} B parameters"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M parameters"
    return f"{int(n)} parameters"


def _short_hashes(value: Any) -> str:
    if isinstance(value, str):
        return value[:12]
    if isinstance(value, dict) and value:
        return ", ".join(f"{str(h)[:12]} ({name})" for name, h in value.items())
    return "unknown"


def _backends_lines() -> list[str]:
    lines = []
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        lines.append(f"onnxruntime {onnxruntime.__version__}: providers {', '.join(providers)}")
    except Exception as e:  # not installed, or a broken build
        lines.append(f"onnxruntime: not available ({type(e).__name__}: {e}); pip install onnxruntime")
    lines.append("ascend OM: convert with om/ (not available here)")
    return lines


def _cmd_info(args: argparse.Namespace) -> int:
    bundle = Path(args.bundle)
    manifest_path = bundle / "manifest.json"
    try:
        if not bundle.exists():
            raise CliError(f"bundle folder not found: {bundle}")
        if not bundle.is_dir():
            raise CliError(f"{bundle} is a file; pass a bundle folder")
        if not manifest_path.is_file():
            raise CliError(
                f"{bundle} is not a bundle: it has no manifest.json; export one with "
                f"python -m graphs.export --checkpoint SNAPSHOT --out {bundle}"
            )
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CliError(f"{manifest_path} is not valid JSON ({e}); export the bundle again")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("graphs"), dict):
            raise CliError(f"{manifest_path} lists no graphs; export the bundle again")
    except CliError as e:
        _err(str(e))
        return EXIT_ERROR
    except OSError as e:
        _err(f"cannot read {manifest_path}: {e}")
        return EXIT_ERROR

    source = manifest.get("source") or {}
    lines = [f"bundle          {bundle.resolve()}"]
    lines.append(
        f"format version  {manifest.get('format_version', '?')}"
        + (f" (created {manifest['created']})" if manifest.get("created") else "")
    )
    src = [str(source.get("model_type", "unknown model")), _fmt_params(source.get("parameters"))]
    src.append(f"weights sha256 {_short_hashes(source.get('weights_sha256'))}")
    if source.get("tiny_seed") is not None:
        src.append(f"tiny seed {source['tiny_seed']}: RANDOM weights")
    lines.append("source          " + ", ".join(src))
    exporter = manifest.get("exporter") or {}
    if exporter:
        lines.append(
            "exported with   " + ", ".join(f"{k} {v}" for k, v in exporter.items()
                                           if k != "export_seconds")
        )
    graphs = manifest["graphs"]
    lines.append(f"graphs          {len(graphs)}")
    for name, g in graphs.items():
        g = g if isinstance(g, dict) else {}
        files = [g.get("file", f"{name}.onnx"), *(g.get("data_files") or [])]
        missing = [f for f in files if not (bundle / f).is_file()]
        size = g.get("bytes")
        if not isinstance(size, (int, float)):
            size = sum((bundle / f).stat().st_size for f in files if (bundle / f).is_file())
        status = f"  MISSING {', '.join(missing)}" if missing else ""
        lines.append(
            f"  {name:<22} {_fmt_bytes(size):>9}  {g.get('precision', '?'):<5} "
            f"{', '.join(files)}{status}"
        )
        for kind, key in (("in ", "inputs"), ("out", "outputs")):
            for t in g.get(key) or []:
                lines.append(
                    f"      {kind} {t.get('name', '?'):<28} {t.get('dtype', '?'):<8} "
                    f"{_fmt_shape(t.get('shape'))}"
                )
    lines.append("backends")
    lines.extend(f"  {line}" for line in _backends_lines())
    print("\n".join(lines))
    return EXIT_OK


# ------------------------------------------------------------------------------------------
# argument parsing
# ------------------------------------------------------------------------------------------


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sam3track",
        description="SAM 3 video tracking from exported graphs (no PyTorch at run time).",
        epilog=(
            "examples:\n"
            "  sam3track demo                                   # tiny random-weights bundle\n"
            "  python -m graphs.export --checkpoint SNAPSHOT --out sam3-bundle\n"
            "  sam3track track video.mp4 --prompt dog --bundle sam3-bundle --json dog.json\n"
            "  sam3track info sam3-bundle\n\n"
            "exit codes: 0 ok, 2 bad input, 130 interrupted (outputs hold the frames done)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sam3track {sam3track.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    track = sub.add_parser(
        "track",
        help="track text prompts through a video and write a mask video (and JSON / PNG masks)",
        description=(
            "Find every object matching the text prompts and track it through the video. Writes "
            "the video with tinted masks, boxes and labels (same size, frame count and timing "
            "as the input frames processed), plus optional JSON and PNG masks. Ctrl-C stops "
            "early and keeps valid outputs holding the frames done (exit code 130)."
        ),
    )
    track.add_argument("video", type=Path, metavar="VIDEO",
                       help="video file (mp4, mkv, mov, ...) or a folder of images")
    track.add_argument("--prompt", "-p", action="append", required=True, metavar="TEXT",
                       help="what to find, e.g. 'person' or 'red car'; repeat for several")
    track.add_argument("--bundle", "-b", type=Path, default=None, metavar="DIR",
                       help="exported bundle (python -m graphs.export); default: the demo bundle "
                            "with RANDOM weights, built in the cache on first use")
    track.add_argument("-o", "--output", type=Path, default=None, metavar="OUT.mp4",
                       help="mask video to write (.mp4, .m4v, .mov, .mkv); default: "
                            "<video stem>.masks.mp4 next to the input")
    track.add_argument("--json", type=Path, default=None, metavar="OUT.json",
                       help="also write every frame's objects (id, prompt, score, box, COCO RLE "
                            "mask; decode with sam3track.sinks.decode_rle) as JSON")
    track.add_argument("--masks-dir", type=Path, default=None, metavar="DIR",
                       help="also write one PNG per frame, DIR/<frame:06d>.png, whose pixel value "
                            "is object id + 1 (0 = background; 16-bit when an id exceeds 254); "
                            "read with cv2.imread(path, cv2.IMREAD_UNCHANGED)")
    track.add_argument("--start-frame", type=_int_at_least(0), default=0, metavar="N",
                       help="first frame to process (0-based; default 0)")
    track.add_argument("--max-frames", type=_int_at_least(1), default=None, metavar="N",
                       help="process at most N frames (default: to the end of the video)")
    track.add_argument("--backend", default="onnxruntime", metavar="NAME",
                       help="inference backend (default: onnxruntime)")
    track.add_argument("--device", default="cpu", metavar="NAME",
                       help="device for the backend, e.g. cpu or cuda (default: cpu)")
    track.set_defaults(func=_cmd_track)

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
    demo.set_defaults(func=_cmd_demo)

    info = sub.add_parser(
        "info",
        help="describe a bundle: source, graphs, tensors and the backends that can run it",
        description="Print a bundle's manifest in brief.",
    )
    info.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle folder")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sam3track`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (argparse prints it)
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
