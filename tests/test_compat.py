"""sam3track.compat: a script written against Meta's SAM 3 request API runs on a bundle, with the
official keys, dtypes and shapes; bad requests are one clear error and leave the session usable."""

from __future__ import annotations

import numpy as np
import pytest

from sam3track.compat import OfficialPredictor, RequestError
from sam3track.errors import Sam3TrackError
from sam3track.results import FrameResult

from .conftest import CLIPS

BIKES = str(CLIPS / "bikes.mp4")
H, W, N_FRAMES = 272, 640, 250  # bikes.mp4
FRAME = 200  # the demo bundle's random weights find bikes around here
OFFICIAL_KEYS = {"out_obj_ids", "out_probs", "out_boxes_xywh", "out_binary_masks", "frame_stats"}


def check_outputs(outputs: dict, height: int = H, width: int = W) -> int:
    """The official _postprocess_output format; returns the number of objects."""
    assert set(outputs) == OFFICIAL_KEYS
    ids, probs = outputs["out_obj_ids"], outputs["out_probs"]
    boxes, masks = outputs["out_boxes_xywh"], outputs["out_binary_masks"]
    n = ids.shape[0]
    assert ids.dtype == np.int64 and ids.shape == (n,)
    assert probs.dtype == np.float32 and probs.shape == (n,)
    assert boxes.dtype == np.float32 and boxes.shape == (n, 4)
    assert masks.dtype == bool and masks.shape == (n, height, width)
    assert outputs["frame_stats"] is None
    assert (boxes >= 0).all() and (boxes[:, 0] + boxes[:, 2] <= 1).all() and (boxes[:, 1] + boxes[:, 3] <= 1).all()
    assert list(ids) == sorted(ids)
    return n


@pytest.fixture(scope="module")
def official():
    from sam3track.demo import demo_bundle_path

    with OfficialPredictor(demo_bundle_path(), hotstart_delay=0) as predictor:
        yield predictor


@pytest.fixture
def session_id(official):
    sid = official.handle_request({"type": "start_session", "resource_path": BIKES})["session_id"]
    yield sid
    official.handle_request({"type": "close_session", "session_id": sid})


# -- FrameResult.to_official --------------------------------------------------------------------


def test_to_official_keys_dtypes_and_normalised_boxes():
    masks = np.zeros((2, 10, 20), bool)
    masks[0, 2:5, 4:9] = True  # x 4..8, y 2..4 -> inclusive xyxy (4, 2, 8, 4)
    masks[1, 0, 0] = True
    result = FrameResult(7, np.asarray([3, 9]), np.asarray([0.9, 0.4]), np.asarray([[4, 2, 8, 4], [0, 0, 0, 0]]),
                         masks, ["bike", ""], np.asarray([0.8, 0.7], np.float32))
    out = result.to_official()
    assert check_outputs(out, 10, 20) == 2
    np.testing.assert_allclose(out["out_boxes_xywh"][0], [4 / 20, 2 / 10, 4 / 20, 2 / 10])
    np.testing.assert_allclose(out["out_boxes_xywh"][1], [0, 0, 0, 0])
    np.testing.assert_allclose(out["out_probs"], [0.9, 0.4])  # the object's score, not the tracker's
    assert out["out_obj_ids"].tolist() == [3, 9]
    out["out_binary_masks"][:] = False
    assert result.masks.any(), "to_official() hands out copies"
    assert check_outputs(FrameResult.empty(0, 10, 20).to_official(), 10, 20) == 0


# -- the official script: text only --------------------------------------------------------------


def test_text_script(official, session_id):
    sid = session_id
    response = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                        "text": "bike"})
    assert set(response) == {"frame_index", "outputs"} and response["frame_index"] == FRAME
    assert check_outputs(response["outputs"]) > 0
    frames = []
    for response in official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                                     "start_frame_index": FRAME, "max_frame_num_to_track": 3}):
        assert set(response) == {"frame_index", "outputs"}
        check_outputs(response["outputs"])
        frames.append(response["frame_index"])
    # "both" (the official default): forward from the start frame, then backward before it
    assert frames == [200, 201, 202, 203, 199, 198, 197]  # as the official: M frames each way
    forward = [r["frame_index"] for r in official.handle_stream_request(
        {"type": "propagate_in_video", "session_id": sid, "propagation_direction": "forward",
         "start_frame_index": FRAME, "max_frame_num_to_track": 1})]
    assert forward == [200, 201]
    backward = [r["frame_index"] for r in official.handle_stream_request(
        {"type": "propagate_in_video", "session_id": sid, "propagation_direction": "backward",
         "start_frame_index": 2})]
    assert backward == [1, 0]  # the official backward pass starts one frame before the start frame
    last = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME, "text": "bike"})
    obj_id = int(last["outputs"]["out_obj_ids"][0])
    removed = official.handle_request({"type": "remove_object", "session_id": sid, "obj_id": obj_id,
                                       "frame_index": FRAME})
    assert removed["frame_index"] == FRAME and check_outputs(removed["outputs"]) == 0
    after = next(official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                                  "propagation_direction": "forward", "start_frame_index": FRAME}))
    assert obj_id not in after["outputs"]["out_obj_ids"]
    assert official.handle_request({"type": "reset_session", "session_id": sid}) == {"is_success": True}
    assert official.handle_request({"type": "close_session", "session_id": sid}) == {"is_success": True}
    assert official.handle_request({"type": "close_session", "session_id": sid}) == {"is_success": True}
    with pytest.raises(RequestError, match="Cannot find session"):
        official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": 0, "text": "bike"})


def test_text_prompt_starts_over(official, session_id):
    """As the official SAM 3: a text add_prompt resets the session (objects, memory and prompts)."""
    sid = session_id
    official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME, "text": "bike"})
    first = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                     "text": "person"})["outputs"]
    session = official._sessions[sid]
    assert session.prompts == ["person"]
    assert set(first["out_obj_ids"].tolist()) == set(session.object_ids)


def test_reset_clears_prompts(official, session_id):
    sid = session_id
    official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME, "text": "bike"})
    official.handle_request({"type": "reset_session", "session_id": sid})
    with pytest.raises(Sam3TrackError):  # nothing left to propagate, as the official predictor
        list(official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                             "start_frame_index": FRAME, "max_frame_num_to_track": 1}))


def test_cancel_and_abandoned_streams_leave_the_session_usable(official, session_id):
    sid = session_id
    official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME, "text": "bike"})
    stream = official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                             "start_frame_index": FRAME})
    assert next(stream)["frame_index"] == FRAME
    assert official.handle_request({"type": "cancel_propagation", "session_id": sid}) == {"is_success": True}
    assert list(stream) == []  # cancelled: the stream ends
    held = official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                           "start_frame_index": FRAME})
    next(held)  # left suspended, as a client that breaks out of its loop and keeps the generator
    response = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                        "text": "bike"})
    check_outputs(response["outputs"])


# -- the official script with clicks (needs Session.add_prompt(points=..., boxes=...)) ------------


def test_click_script(official, session_id):
    sid = session_id
    text = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME, "text": "bike"})
    detected = text["outputs"]["out_obj_ids"].tolist()
    new_id = max(detected, default=-1) + 100
    # a click that adds an object the text missed (relative coordinates, the official default)
    added = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                     "points": [[0.25, 0.5]], "point_labels": [1], "obj_id": new_id})
    assert added["frame_index"] == FRAME
    check_outputs(added["outputs"])
    assert new_id in added["outputs"]["out_obj_ids"]
    # a correcting click on a text-detected object, with the earlier clicks resent (clear_old_points=True)
    if detected:
        refined = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                           "points": [[0.6, 0.4], [0.62, 0.45]], "point_labels": [1, 0],
                                           "obj_id": detected[0]})
        check_outputs(refined["outputs"])
    # pixels work too
    official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME + 2,
                             "points": [[320, 136]], "point_labels": [1], "obj_id": new_id,
                             "rel_coordinates": False, "clear_old_points": False})
    # a box (x, y, w, h) without text: a tracker box prompt, a new object
    boxed = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                     "bounding_boxes": [[0.1, 0.1, 0.2, 0.3]], "bounding_box_labels": [1]})
    check_outputs(boxed["outputs"])
    seen = {}
    for response in official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                                     "start_frame_index": FRAME, "max_frame_num_to_track": 4}):
        check_outputs(response["outputs"])
        seen[response["frame_index"]] = response["outputs"]["out_obj_ids"].tolist()
    assert sorted(seen) == list(range(FRAME - 4, FRAME + 5))
    assert all(new_id in ids for ids in seen.values()), "a clicked object is tracked on every frame"
    removed = official.handle_request({"type": "remove_object", "session_id": sid, "obj_id": new_id})
    check_outputs(removed["outputs"])
    for response in official.handle_stream_request({"type": "propagate_in_video", "session_id": sid,
                                                     "start_frame_index": FRAME, "max_frame_num_to_track": 2}):
        assert new_id not in response["outputs"]["out_obj_ids"]
    assert official.handle_request({"type": "reset_session", "session_id": sid}) == {"is_success": True}
    assert official.handle_request({"type": "close_session", "session_id": sid}) == {"is_success": True}
    assert official.handle_request({"type": "close_session", "session_id": sid}) == {"is_success": True}


def test_one_new_object_per_box(official, session_id):
    sid = session_id
    boxes = [[0.05, 0.1, 0.2, 0.3], [0.5, 0.4, 0.3, 0.3]]
    out = official.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": FRAME,
                                   "bounding_boxes": boxes})["outputs"]
    check_outputs(out)
    assert len(official._sessions[sid].object_ids) == 2


# -- bad requests: one clear error each, the session still usable --------------------------------


BAD = [
    ({"type": "add_promt"}, "add_promt"),
    ({"session_id": "?"}, "'type'"),
    ({"type": "propagate_in_video", "session_id": "S"}, "handle_stream_request"),
    ({"type": "add_prompt", "session_id": "S", "text": "bike"}, "frame_index"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "txt": "bike"}, "'txt'"),
    ({"type": "add_prompt", "session_id": "nope", "frame_index": 0, "text": "bike"}, "nope"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": N_FRAMES, "text": "bike"}, "out of range"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "text": " "}, "text"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0}, "needs text, points"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "text": "bike",
      "bounding_boxes": [[0.1, 0.1, 0.2, 0.2]], "bounding_box_labels": [1]}, "exemplars"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "text": "bike", "points": [[0.1, 0.1]],
      "obj_id": 1}, "either text or points"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "points": [[0.1, 0.1]]}, "obj_id"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "points": [[1.5, 0.1]], "obj_id": 1}, "0..1"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "points": [0.5], "obj_id": 1}, "points"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "points": [[0.5, 0.5]], "obj_id": -2}, "obj_id"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "bounding_boxes": [[0.1, 0.1, 0.2, 0.2]],
      "bounding_box_labels": [0]}, "negative boxes"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "bounding_boxes": [[0.9, 0.1, 0.2, 0.2]]},
     "0..1"),
    ({"type": "add_prompt", "session_id": "S", "frame_index": 0, "bounding_boxes": [[0.1, 0.1, 0.2, 0.2]] * 2,
      "obj_id": 4}, "one box per obj_id"),
    ({"type": "remove_object", "session_id": "S"}, "obj_id"),
    ({"type": "start_session"}, "resource_path"),
    ({"type": "start_session", "resource_path": 3}, "resource_path"),
]


def test_bad_requests_are_one_clear_error_and_the_session_stays_usable(official, session_id):
    for request, culprit in BAD:
        request = {k: (session_id if v == "S" else v) for k, v in request.items()}
        with pytest.raises(RequestError, match=None) as info:
            official.handle_request(request)
        assert culprit in str(info.value), (request, str(info.value))
    with pytest.raises(RequestError, match="handle_request"):
        official.handle_stream_request({"type": "add_prompt", "session_id": session_id, "frame_index": 0})
    for request, culprit in [({"propagation_direction": "sideways"}, "sideways"),
                             ({"start_frame_index": -1}, "start_frame_index"),
                             ({"max_frame_num_to_track": "all"}, "max_frame_num_to_track")]:
        with pytest.raises(RequestError, match=culprit):  # raised by the call, before any frame is asked for
            official.handle_stream_request({"type": "propagate_in_video", "session_id": session_id, **request})
    with pytest.raises(Sam3TrackError, match="not tracked"):  # the session's own error, as it is
        official.handle_request({"type": "remove_object", "session_id": session_id, "obj_id": 12345})
    response = official.handle_request({"type": "add_prompt", "session_id": session_id, "frame_index": FRAME,
                                        "text": "bike"})
    check_outputs(response["outputs"])
    assert [r["frame_index"] for r in official.handle_stream_request(
        {"type": "propagate_in_video", "session_id": session_id, "propagation_direction": "forward",
         "start_frame_index": FRAME, "max_frame_num_to_track": 1})] == [FRAME, FRAME + 1]


def test_session_ids(official):
    sid = official.handle_request({"type": "start_session", "resource_path": BIKES, "session_id": "mine"})
    assert sid == {"session_id": "mine"}
    with pytest.raises(RequestError, match="already open"):
        official.handle_request({"type": "start_session", "resource_path": BIKES, "session_id": "mine"})
    other = official.handle_request({"type": "start_session", "resource_path": BIKES})["session_id"]
    assert other != "mine" and len(other) == 36  # a uuid4
    for s in ("mine", other, "mine"):
        assert official.handle_request({"type": "close_session", "session_id": s}) == {"is_success": True}


# -- coordinates: what reaches Session.add_prompt ------------------------------------------------


class _RecordingSession:
    """Stands in for a Session: records the click/box calls the facade makes."""

    box_prompts = "tracker"  # a sam3track.TrackingSession member
    num_frames = 10

    class source:
        height, width = 100, 200

    def __init__(self):
        self.calls = []

    def add_prompt(self, **kwargs):
        self.calls.append(kwargs)
        return FrameResult.empty(kwargs["frame_index"], 100, 200)


def test_relative_coordinates_become_video_pixels():
    facade = OfficialPredictor.__new__(OfficialPredictor)
    facade._sessions, facade._streams = {"s": _RecordingSession()}, {}
    session = facade._sessions["s"]
    facade.handle_request({"type": "add_prompt", "session_id": "s", "frame_index": 3, "obj_id": 5,
                           "points": [[0.5, 0.25], [1.0, 1.0]], "point_labels": [1, 0]})
    facade.handle_request({"type": "add_prompt", "session_id": "s", "frame_index": 4, "obj_id": 6,
                           "points": [[10, 20]], "rel_coordinates": False, "clear_old_points": False})
    facade.handle_request({"type": "add_prompt", "session_id": "s", "frame_index": 5,
                           "bounding_boxes": [[0.1, 0.2, 0.5, 0.5], [0, 0, 1, 1]]})
    facade.handle_request({"type": "add_prompt", "session_id": "s", "frame_index": 6, "obj_id": 7,
                           "bounding_boxes": [10, 20, 30, 40], "rel_coordinates": False})
    assert session.calls == [
        dict(frame_index=3, points=[[100.0, 25.0], [200.0, 100.0]], labels=[1, 0], boxes=None, obj_id=5,
             clear_old_points=True),
        dict(frame_index=4, points=[[10.0, 20.0]], labels=None, boxes=None, obj_id=6, clear_old_points=False),
        dict(frame_index=5, boxes=[20.0, 20.0, 120.0, 70.0], obj_id=None, clear_old_points=True),
        dict(frame_index=5, boxes=[0.0, 0.0, 200.0, 100.0], obj_id=None, clear_old_points=True),
        dict(frame_index=6, boxes=[10.0, 20.0, 40.0, 60.0], obj_id=7, clear_old_points=True),
    ]
