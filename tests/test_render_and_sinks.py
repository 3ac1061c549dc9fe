"""Rendering objects onto frames and saving results (JSON with RLE masks, PNG id masks)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from sam3track.errors import VideoError
from sam3track.render import PALETTE, color_for, draw_objects, label_for
from sam3track.results import FrameResult
from sam3track.sinks import JsonSink, MasksDirSink, decode_rle, encode_rle

H, W = 240, 320


def _result(frame_index: int = 0, ids: tuple[int, ...] = (3, 25)) -> FrameResult:
    """Two overlapping objects in the top-left quarter of a 320x240 frame."""
    masks = np.zeros((len(ids), H, W), bool)
    boxes = []
    for k, _ in enumerate(ids):
        y0, x0 = 30 + 20 * k, 20 + 30 * k
        cv2.circle(masks[k].view(np.uint8), (x0 + 30, y0 + 30), 30, 1, -1)
        ys, xs = np.nonzero(masks[k])
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    return FrameResult(
        frame_index=frame_index,
        object_ids=np.asarray(ids, np.int64),
        scores=np.linspace(0.9, 0.6, len(ids)).astype(np.float32),
        boxes_xyxy=np.asarray(boxes, np.float32).reshape(-1, 4),
        masks=masks,
        prompts=["person", "bike"][: len(ids)],
    )


# -- rendering ---------------------------------------------------------------------------------


def test_draw_objects_tints_masks_and_leaves_far_pixels_alone() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    before = frame.copy()
    res = _result()
    out = draw_objects(frame, res)
    assert np.array_equal(frame, before), "the input frame must not be modified"
    assert out.shape == frame.shape and out.dtype == np.uint8

    # Deep inside object 25, away from every outline and box line: an exact 50/50 blend.
    lines = np.zeros((H, W), np.uint8)
    for x0, y0, x1, y1 in res.boxes_xyxy.astype(int):
        cv2.rectangle(lines, (x0, y0), (x1, y1), 1, thickness=5)
    inner = cv2.erode(res.masks[1].astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    inner &= ~cv2.dilate(res.masks[0].astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    inner &= ~lines.astype(bool)
    assert inner.sum() > 100
    expected = np.rint(before[inner] * 0.5 + np.asarray(color_for(25)) * 0.5)
    assert np.array_equal(out[inner], expected.astype(np.uint8))
    # Where both masks overlap, both tints were applied (object 3 first, then 25).
    both = res.masks[0] & res.masks[1]
    both &= cv2.erode(both.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    both &= ~lines.astype(bool)
    c3, c25 = np.asarray(color_for(3)), np.asarray(color_for(25))
    twice = np.rint(np.rint(before[both] * 0.5 + c3 * 0.5) * 0.5 + c25 * 0.5)
    assert both.any() and np.array_equal(out[both], twice.astype(np.uint8))

    # Far from masks, boxes and labels (right half, lower part): untouched.
    assert np.array_equal(out[140:, 180:], before[140:, 180:])
    # Something was drawn outside the masks too: outlines/boxes/labels.
    outside = ~(res.masks[0] | res.masks[1])
    assert (out[outside] != before[outside]).any()


def test_draw_objects_label_and_colours() -> None:
    res = _result()
    assert label_for(res, 0) == "id 3 person 0.90"
    assert label_for(res, 1) == "id 25 bike 0.60"
    assert len(PALETTE) == 20
    assert color_for(3) == color_for(23) != color_for(4)  # palette[id % 20]
    assert len({color_for(i) for i in range(20)}) == 20
    # The label is drawn just above the first box, in the object's colour.
    frame = np.zeros((H, W, 3), np.uint8)
    out = draw_objects(frame, res, draw_boxes=False)
    x0, y0 = int(res.boxes_xyxy[0, 0]), int(res.boxes_xyxy[0, 1])
    tag = out[y0 - 8 : y0, x0 + 1 : x0 + 20].reshape(-1, 3)
    assert (tag == np.asarray(color_for(3), np.uint8)).all(axis=1).mean() > 0.5


def test_draw_objects_empty_and_mismatched() -> None:
    frame = np.full((H, W, 3), 7, np.uint8)
    out = draw_objects(frame, FrameResult.empty(0, H, W))
    assert np.array_equal(out, frame) and out is not frame
    with pytest.raises(VideoError, match="frame 0"):
        draw_objects(frame[:100], _result())


# -- RLE ---------------------------------------------------------------------------------------


def test_rle_round_trip_random_masks() -> None:
    rng = np.random.default_rng(4)
    for shape in [(37, 53), (1, 1), (64, 48)]:
        mask = rng.random(shape) > 0.6
        rle = encode_rle(mask)
        assert rle["size"] == list(shape) and isinstance(rle["counts"], str)
        json.dumps(rle)
        back = decode_rle(json.loads(json.dumps(rle)))
        assert back.dtype == bool and np.array_equal(back, mask)
    assert not decode_rle(encode_rle(np.zeros((5, 6), bool))).any()


# -- JSON sink ---------------------------------------------------------------------------------


def test_json_sink_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "tracks.json"
    results = [_result(0), FrameResult.empty(1, H, W), _result(2, ids=(7,))]
    with JsonSink(path, metadata={"video": "bikes.mp4"}) as sink:
        for r in results:
            sink.write(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tracks.json"]
    data = json.loads(path.read_text())
    assert data["complete"] is True and data["num_frames"] == 3
    assert data["metadata"] == {"video": "bikes.mp4"}
    assert [f["frame_index"] for f in data["frames"]] == [0, 1, 2]
    for r, f in zip(results, data["frames"]):
        assert (f["height"], f["width"]) == (H, W)
        assert [o["object_id"] for o in f["objects"]] == r.object_ids.tolist()
        assert [o["prompt"] for o in f["objects"]] == r.prompts
        for i, o in enumerate(f["objects"]):
            assert np.array_equal(decode_rle(o), r.masks[i])
            assert np.array_equal(decode_rle(o["mask"]), r.masks[i])
            assert np.float32(o["score"]) == r.scores[i]
            assert np.array_equal(np.asarray(o["box_xyxy"], np.float32), r.boxes_xyxy[i])


def test_json_sink_interrupted_is_still_valid(tmp_path: Path) -> None:
    path = tmp_path / "tracks.json"
    with pytest.raises(KeyboardInterrupt):
        with JsonSink(path) as sink:
            sink.write(_result(0))
            sink.write(_result(1))
            raise KeyboardInterrupt
    # Beside the name asked for, never under it; no temp file left.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tracks.interrupted.json"]
    assert sink.close(complete=False) == tmp_path / "tracks.interrupted.json"
    data = json.loads((tmp_path / "tracks.interrupted.json").read_text())
    assert data["complete"] is False and data["num_frames"] == 2
    assert [f["frame_index"] for f in data["frames"]] == [0, 1]
    assert np.array_equal(decode_rle(data["frames"][1]["objects"][1]), _result().masks[1])


def test_json_sink_interrupted_keeps_the_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "tracks.json"
    with JsonSink(path) as sink:
        for i in range(3):
            sink.write(_result(i))
    complete = path.read_bytes()
    for frames in (2, 1):  # a later interrupted run replaces an earlier one's leftovers
        with pytest.raises(RuntimeError):
            with JsonSink(path) as sink:
                for i in range(frames):
                    sink.write(_result(i))
                raise RuntimeError("disk full")
    assert path.read_bytes() == complete
    assert json.loads((tmp_path / "tracks.interrupted.json").read_text())["num_frames"] == 1
    # Stopped before any frame: nothing is written, and the older leftovers stay as they were.
    with pytest.raises(KeyboardInterrupt):
        with JsonSink(path):
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tracks.interrupted.json", "tracks.json"]
    assert json.loads((tmp_path / "tracks.interrupted.json").read_text())["num_frames"] == 1


def test_json_sink_non_finite_values_stay_valid_json(tmp_path: Path) -> None:
    r = _result()
    r.scores[0] = np.nan
    with JsonSink(tmp_path / "t.json") as sink:
        sink.write(r)
    text = (tmp_path / "t.json").read_text()
    assert "NaN" not in text
    assert json.loads(text)["frames"][0]["objects"][0]["score"] is None


# -- PNG masks folder --------------------------------------------------------------------------


def _read_png(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


def test_masks_dir_pixel_values_are_object_ids(tmp_path: Path) -> None:
    out = tmp_path / "masks"
    res = _result(12)
    with MasksDirSink(out) as sink:
        sink.write(res)
        sink.write(FrameResult.empty(13, H, W))
    assert sorted(p.name for p in out.iterdir()) == ["000012.png", "000013.png"]
    img = _read_png(out / "000012.png")
    assert img.dtype == np.uint8 and img.shape == (H, W)
    only3 = res.masks[0] & ~res.masks[1]
    assert (img[only3] == 3).all()
    assert (img[res.masks[1]] == 25).all()  # later object wins the overlap
    assert (img[~(res.masks[0] | res.masks[1])] == 0).all()
    assert set(np.unique(img).tolist()) == {0, 3, 25}
    assert not _read_png(out / "000013.png").any()


def test_masks_dir_uint16_and_id_zero(tmp_path: Path) -> None:
    sink = MasksDirSink(tmp_path / "masks")
    res = _result(0, ids=(300, 70000 - 69999))  # 300 and 1
    sink.write(res)
    assert sink.staging.parent == tmp_path and sink.staging.name.startswith("masks.")
    img = _read_png(sink.staging / "000000.png")  # staged beside the folder until the run ends
    assert img.dtype == np.uint16
    assert (img[res.masks[0] & ~res.masks[1]] == 300).all() and (img[res.masks[1]] == 1).all()

    with pytest.raises(VideoError, match="object id 0.*id_offset=1"):
        sink.write(_result(1, ids=(0, 5)))
    shifted = MasksDirSink(tmp_path / "shifted", id_offset=1)
    shifted.write(_result(1, ids=(0, 5)))
    shifted.close()
    img = _read_png(tmp_path / "shifted" / "000001.png")
    assert set(np.unique(img).tolist()) == {0, 1, 6}
    with pytest.raises(VideoError, match="65535"):
        sink.write(_result(2, ids=(70000,)))


def test_masks_dir_is_staged_and_keeps_unrelated_files(tmp_path: Path) -> None:
    out = tmp_path / "masks"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "000005.png").write_bytes(b"an older run's mask")
    with MasksDirSink(out) as sink:
        sink.write(_result(5))
        sink.write(_result(6))
        # Nothing lands in the folder asked for before the run completes.
        assert sorted(p.name for p in out.iterdir()) == ["000005.png", "notes.txt"]
        assert sorted(p.name for p in sink.staging.iterdir()) == ["000005.png", "000006.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks"]  # staging folder and lock gone
    assert sorted(p.name for p in out.iterdir()) == ["000005.png", "000006.png", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    assert _read_png(out / "000005.png").max() == 25  # replaced by this run's mask


def test_masks_dir_interrupted_goes_beside_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "masks"
    with MasksDirSink(out) as sink:
        for i in range(3):
            sink.write(_result(i))
    complete = {p.name: p.read_bytes() for p in out.iterdir()}
    for frames in (2, 1):  # a later interrupted run replaces an earlier one's folder
        with pytest.raises(KeyboardInterrupt):
            with MasksDirSink(out) as sink:
                for i in range(frames):
                    sink.write(_result(i, ids=(9,)))
                raise KeyboardInterrupt
        assert sink.close(complete=False) == tmp_path / "masks.interrupted"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "masks.interrupted"]
    kept = tmp_path / "masks.interrupted"
    assert [p.name for p in kept.iterdir()] == ["000000.png"]
    assert set(np.unique(_read_png(kept / "000000.png"))) == {0, 9}
    # Stopped before any frame: the staging folder goes, older leftovers stay.
    with pytest.raises(KeyboardInterrupt):
        with MasksDirSink(out):
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "masks.interrupted"]


def test_masks_dir_stale_staging_folder(tmp_path: Path) -> None:
    out = tmp_path / "masks"
    stale = tmp_path / "masks.4242.0badcafe.partial"  # the staging folder of a killed run
    stale.mkdir()
    (stale / "000001.png").write_bytes(b"left by a killed run")
    (stale / "000002.png.4242.00c0ffee.partial").write_bytes(b"half")
    with MasksDirSink(out) as sink:
        sink.write(_result(3))
    assert sorted(p.name for p in out.iterdir()) == ["000003.png"]  # the stale ones are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks"]
    # A folder of that name holding anything else is not ours to delete; it is in no run's way.
    stale.mkdir()
    (stale / "thesis.tex").write_text("precious")
    with MasksDirSink(out) as sink:
        sink.write(_result(4))
    assert (stale / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["000003.png", "000004.png"]


def test_masks_dir_given_as_dot(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with MasksDirSink(".") as sink:
        sink.write(_result(4))
        assert sink.staging.parent == tmp_path  # staged beside the folder, not in it
        assert (sink.staging / "000004.png").is_file() and sink.staging.name.startswith("work.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert [p.name for p in work.iterdir()] == ["000004.png"]
    with pytest.raises(KeyboardInterrupt):
        with MasksDirSink(".") as sink:
            sink.write(_result(5))
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work", "work.interrupted"]
