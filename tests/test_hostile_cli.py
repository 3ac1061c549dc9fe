"""Hostile input on the command line (issue 25): bad videos, outputs, bundles, frames and options each
get one `error:` line naming what is at fault, exit 2, no traceback, and nothing written. The cases
that were in test_cli.py, moved here beside the other hostile-input tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from .conftest import run_child
from .test_cli import BIKES, _env, _run_error


def _zero_frame_mp4(path: Path) -> Path:
    import av

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        container.start_encoding()
    return path


def test_bad_videos(tmp_path: Path, tiny_bundle: Path, capsys) -> None:
    common = ["--prompt", "person", "--bundle", str(tiny_bundle), "-o", str(tmp_path / "o.mp4")]
    missing = tmp_path / "missing.mp4"
    err = _run_error(["track", str(missing), *common], capsys)
    assert "error:" in err and "missing.mp4" in err and "not found" in err

    text = tmp_path / "x.mp4"
    text.write_text("this is not a video\n")
    assert "x.mp4" in _run_error(["track", str(text), *common], capsys)

    empty = _zero_frame_mp4(tmp_path / "empty.mp4")
    assert "empty.mp4" in _run_error(["track", str(empty), *common], capsys)

    truncated = tmp_path / "truncated.mp4"
    data = BIKES.read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    assert "truncated.mp4" in _run_error(["track", str(truncated), *common], capsys)
    assert not (tmp_path / "o.mp4").exists()


def test_bad_outputs_bundles_and_frames(tmp_path: Path, tiny_bundle: Path, capsys) -> None:
    base = ["track", str(BIKES), "--prompt", "person"]
    bundle = ["--bundle", str(tiny_bundle)]
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file, not a folder")
    err = _run_error([*base, *bundle, "-o", str(blocker / "out.mp4")], capsys)
    assert "file.txt" in err and "not a folder" in err
    err = _run_error([*base, *bundle, "-o", str(tmp_path / "o.mp4"),
                      "--json", str(tmp_path / "nodir" / "o.json")], capsys)
    assert "nodir" in err and "does not exist" in err
    err = _run_error([*base, *bundle, "-o", str(tmp_path / "o.mp4"),
                      "--masks-dir", str(blocker / "masks")], capsys)
    assert "file.txt" in err

    out = ["-o", str(tmp_path / "o.mp4")]
    err = _run_error([*base, "--bundle", str(tmp_path / "no-bundle"), *out], capsys)
    assert "no-bundle" in err and "not found" in err
    not_a_bundle = tmp_path / "not-a-bundle"
    not_a_bundle.mkdir()
    assert "not-a-bundle" in _run_error([*base, "--bundle", str(not_a_bundle), *out], capsys)

    err = _run_error([*base, *bundle, *out, "--start-frame", "250"], capsys)
    assert "--start-frame 250" in err and "250 frames" in err
    assert "--start-frame" in _run_error([*base, *bundle, *out, "--start-frame", "-3"], capsys)
    assert "--max-frames" in _run_error([*base, *bundle, *out, "--max-frames", "0"], capsys)
    assert "--prompt" in _run_error([*base[:2], "--prompt", "  ", *bundle, *out], capsys)
    # Every check ran before any work: nothing was written.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "not-a-bundle"]


def test_errors_through_the_real_entry_point(tmp_path: Path) -> None:
    proc = run_child(
        [sys.executable, "-m", "sam3track.cli", "track", str(tmp_path / "nope.mp4"),
         "--prompt", "person", "--bundle", str(tmp_path)],
        "sam3track track on a missing file", env=_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "nope.mp4" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_track_needs_a_bundle(tmp_path: Path, monkeypatch, capsys) -> None:
    import sam3track.demo

    def no_demo(*args, **kwargs):
        raise AssertionError("track must not fall back to the random-weights demo bundle")

    monkeypatch.setattr(sam3track.demo, "demo_bundle_path", no_demo)
    err = _run_error(["track", str(BIKES), "--prompt", "person", "-o", str(tmp_path / "o.mp4")],
                     capsys)
    assert "--bundle" in err and "required" in err
    assert "python -m graphs.export --checkpoint SNAPSHOT --out BUNDLE" in err
    assert "sam3track demo" in err
    assert list(tmp_path.iterdir()) == []


def test_outputs_that_are_folders(tmp_path: Path, tiny_bundle: Path, capsys) -> None:
    base = ["track", str(BIKES), "--prompt", "person", "--bundle", str(tiny_bundle)]
    folder = tmp_path / "results"
    folder.mkdir()
    err = _run_error([*base, "-o", str(folder)], capsys)
    assert f"-o {folder} is a folder; give a file name" in err and "suffix" not in err
    err = _run_error([*base, "-o", str(tmp_path / "o.mp4"), "--json", str(folder)], capsys)
    assert f"the JSON {folder}: it is a folder; give a file name" in err
    assert [p.name for p in tmp_path.iterdir()] == ["results"] and not list(folder.iterdir())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX-only")
def test_fifo_input_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "camera.mp4"
    os.mkfifo(fifo)
    # A child process with a hang guard: a regression (FFmpeg waiting on the FIFO) fails, not hangs.
    proc = run_child(
        [sys.executable, "-m", "sam3track.cli", "track", str(fifo), "--prompt", "person",
         "--bundle", str(tmp_path), "-o", str(tmp_path / "o.mp4")],
        "sam3track track on a FIFO (FFmpeg waiting on it?)", env=_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {fifo} is not a regular file; pass a video file or a folder "
                           f"of images\n")
    assert [p.name for p in tmp_path.iterdir()] == ["camera.mp4"]


def test_usage_errors_are_one_line(capsys) -> None:
    for args, culprit in [
        (["track", str(BIKES), "--prompt", "person", "--set", "no-equals-sign"], "--set"),
        (["track", str(BIKES), "--prompt", "person", "--set", "=1"], "--set"),
        (["track", str(BIKES), "--prompt", "person", "--max-frames", "ten"], "--max-frames"),
        (["track", str(BIKES)], "--prompt"),
        (["tarck"], "tarck"),
    ]:
        err = _run_error(args, capsys)
        assert culprit in err and "--help" in err


@pytest.mark.parametrize(("option", "culprit"), [
    (["--point", "3:10"], "--point 3:10: X,Y"),
    (["--point", "3"], "--point 3: expected FRAME:X,Y[:LABEL]"),
    (["--point", "3:10,20:2"], "--point 3:10,20:2: LABEL"),
    (["--point", "3:10,20:1:0"], "--point 3:10,20:1:0: expected"),
    (["--point=-1:10,20"], "--point -1:10,20: FRAME"),
    (["--point", "a:10,20"], "--point a:10,20: FRAME"),
    (["--point", "3:nan,20"], "--point 3:nan,20: X,Y"),
    (["--box", "3:10,20,30"], "--box 3:10,20,30: X0,Y0,X1,Y1"),
    (["--box", "3:30,20,10,40"], "--box 3:30,20,10,40: the box needs X1 > X0"),
    (["--box", "10,20,30,40"], "--box 10,20,30,40: expected FRAME:X0,Y0,X1,Y1"),
    (["--obj-id", "-1", "--point", "0:1,1"], "--obj-id"),
    (["--obj-id", "x", "--point", "0:1,1"], "--obj-id"),
    ([], "--prompt"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_click_option_errors_name_the_option_and_value(option, culprit, capsys) -> None:
    err = _run_error(["track", str(BIKES), *option], capsys)
    assert culprit in err and "--help" in err


def test_click_errors_that_need_the_video(tmp_path: Path, capsys) -> None:
    (tmp_path / "bundle").mkdir()
    common = ["track", str(BIKES), "--bundle", str(tmp_path / "bundle"), "-o", str(tmp_path / "o.mp4")]
    for option, culprit in [
        (["--point", "250:10,10"], "--point 250:10,10: frame 250 is outside the frames processed (0..249)"),
        (["--start-frame", "10", "--max-frames", "5", "--box", "15:1,1,5,5"], "--box 15:1,1,5,5: frame 15"),
        (["--point", "3:641,10"], "--point 3:641,10: outside the 640x272 frame"),
        (["--box", "3:0,0,10,300"], "--box 3:0,0,10,300: outside the 640x272 frame"),
        (["--obj-id", "1", "--box", "3:0,0,10,10", "--box", "3:0,0,20,20"], "already has a box on frame 3"),
    ]:
        err = _run_error(common + option, capsys)
        assert culprit in err, err
    assert not (tmp_path / "o.mp4").exists()


def test_a_warning_reaches_a_cli_user_as_one_line(monkeypatch, capsys, tmp_path: Path) -> None:
    """A warning raised under a command (e.g. CapacityWarning when births pass the pool cap) is one
    ``warning:`` line on stderr, not Python's two-line form whose second line is ``warnings.warn(``."""
    import warnings

    import sam3track
    from sam3track import cli
    from sam3track.commands import info

    def warns(args):
        warnings.warn("frame 3: 2 new objects were not made; load with a larger pool_objects",
                      sam3track.CapacityWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(info, "cmd_info", warns)
    before = warnings.showwarning
    assert cli.main(["info", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err == "warning: frame 3: 2 new objects were not made; load with a larger pool_objects\n"
    assert warnings.showwarning is before  # put back for the caller of main()
