"""Hostile input (issue 25, item 4): each case gets one clear error naming what is at fault, the exit code
the CLI promises, and no partial output. The smaller defects a hostile user found: a missing export
extra, a corrupted bundle that `info` said nothing about, arguments of the wrong type, a negative frame in
--point, and progress redraws in log files."""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import sam3track
from sam3track.cli import main
from sam3track.progress import PlainProgress, progress_bar

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "sam3track" / "demo_bundle"
BIKES = REPO / "examples" / "clips" / "bikes.mp4"


# -------------------------------------------------------------------------- the export extra
@pytest.mark.parametrize("command", ["graphs.export", "graphs.check"])
def test_a_missing_export_extra_is_one_line_naming_it(command, monkeypatch, tmp_path, capsys):
    import importlib

    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # `import torch` now fails as on a runtime-only install
    cli = importlib.import_module(command)
    args = ["--tiny", "--out", str(tmp_path / "bundle")] if command == "graphs.export" else [str(DEMO)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[export]'" in err
    assert "torch is not installed" in err or "transformers is not installed" in err  # whichever loads first
    assert not list(tmp_path.iterdir())  # nothing half-written


# ----------------------------------------------------------------------------- info --verify
def test_info_verify_names_a_corrupted_graph(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO, bundle)
    assert main(["info", str(bundle), "--verify"]) == 0
    assert "checksums       verified" in capsys.readouterr().out
    graph = bundle / "backbone.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    assert main(["info", str(bundle), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "backbone.onnx" in err and "export the bundle again" in err
    # without --verify, info says it did not check
    assert main(["info", str(bundle)]) == 0
    assert "not verified (sam3track info --verify BUNDLE checks them)" in capsys.readouterr().out


# ------------------------------------------------------------------- arguments of the wrong type
@pytest.fixture(scope="module")
def session():
    predictor = sam3track.load(DEMO)
    with predictor.start_session(np.zeros((3, 64, 64, 3), np.uint8)) as s:
        yield s
    predictor.close()


@pytest.mark.parametrize("call, error, words", [
    (lambda s: s.add_prompt(frame_index="0", text="dog"), sam3track.FrameIndexError, "frame index must be a whole"),
    (lambda s: s.add_prompt(frame_index=1.5, text="dog"), sam3track.FrameIndexError, "not float 1.5"),
    (lambda s: s.frame(None), sam3track.FrameIndexError, "not NoneType None"),
    (lambda s: s.run_frame("1"), sam3track.FrameIndexError, "frame index must be a whole"),
    (lambda s: s.remove_object("x"), sam3track.ObjectIdError, "obj_id must be a whole number (int), not str"),
    (lambda s: s.remove_object(None), sam3track.ObjectIdError, "obj_id must be a whole number (int)"),
    (lambda s: s.add_prompt(0, points=[[1, 2]], labels=[1], obj_id="3"), sam3track.ObjectIdError, "obj_id"),
    (lambda s: s.add_prompt(0, points=[["a", "b"]], labels=[1]), sam3track.PromptError, "must be numbers"),
    (lambda s: s.add_prompt(0, points=[[1, 2]], labels=["x"]), sam3track.PromptError, "labels"),
    (lambda s: s.propagate(max_frames="2"), sam3track.ArgumentError, "max_frames must be a whole number"),
])
def test_a_wrong_type_is_a_type_error_naming_the_argument(session, call, error, words):
    with pytest.raises(error) as caught:
        call(session)
    assert isinstance(caught.value, TypeError), type(caught.value).__mro__
    assert words in str(caught.value)


def test_the_request_api_checks_types_the_same_way(tmp_path):
    from sam3track.compat import OfficialPredictor

    official = OfficialPredictor(DEMO)
    frames_dir = tmp_path / "frames"
    frames_dir.mkdir()
    import cv2

    for i in range(2):
        cv2.imwrite(str(frames_dir / f"{i:05d}.jpg"), np.zeros((32, 32, 3), np.uint8))
    sid = official.handle_request({"type": "start_session", "resource_path": str(frames_dir)})["session_id"]
    with pytest.raises(TypeError, match="frame_index"):
        official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": "0", "text": "dog"})
    with pytest.raises(TypeError, match="obj_id"):
        official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": 0, "obj_id": 1.5,
                                 "points": [[0.5, 0.5]], "point_labels": [1]})
    official.handle_request({"type": "close_session", "session_id": sid})


# -------------------------------------------------------------------------------- --point / --box
@pytest.mark.parametrize("argv, words", [
    (["--point", "-1:10,10"], "--point -1:10,10: FRAME '-1' must be a whole number >= 0"),
    (["--box", "-2:1,2,3,4"], "--box -2:1,2,3,4: FRAME '-2' must be a whole number >= 0"),
    (["--point"], "--point takes FRAME:X,Y[:LABEL], e.g. --point 0:320,180"),
    (["--point", "0:10"], "X,Y '10' must be two numbers"),
])
def test_a_malformed_point_says_what_a_point_looks_like(argv, words, tmp_path, capsys):
    out = tmp_path / "out.mp4"
    assert main(["track", str(BIKES), "--bundle", str(DEMO), "-o", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------ progress
def test_progress_in_a_log_is_plain_lines_every_few_seconds():
    now = [0.0]
    log = io.StringIO()
    bar = PlainProgress(100, "tracking", "frame", log, every=10.0, clock=lambda: now[0])
    for _ in range(30):  # 30 frames, 1 s each: a line at 10, 20 and 30 s, then one at close
        now[0] += 1.0
        bar.set_postfix(objects=3, refresh=False)
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines == [f"tracking: {n}/100 frames, 1.00 frame/s, objects=3" for n in (10, 20, 30, 30)]


def test_progress_is_tqdm_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(progress_bar(5, "tracking", "frame", io.StringIO()), PlainProgress)
    bar = progress_bar(5, "tracking", "frame", Terminal())
    assert not isinstance(bar, PlainProgress)
    bar.close()
