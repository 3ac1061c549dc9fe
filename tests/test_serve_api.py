"""``sam3track serve``'s HTTP API against the real app on a loopback port (one server for the module, the
shipped demo bundle, the 120-frame carphone clip): the official request API's answers over JSON, the
downloads, and the safety rules (client isolation, caps, paths under --root, idle expiry, one JSON
error per bad request)."""

from __future__ import annotations

import io
import json
import shutil
import socket
import time
import zipfile
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest

import sam3track
from sam3track.cli import main
from sam3track.commands.demo import DEMO_OVERRIDES
from sam3track.compat import OfficialPredictor
from sam3track.demo import demo_bundle_path
from sam3track.serve import Limits, create_app
from sam3track.sinks import decode_rle
from sam3track.video import open_source

from .serve_helpers import CARPHONE, CLIPS, ServerThread, sse_events

LIMITS = Limits(max_sessions=3, max_client_sessions=2, max_upload_bytes=700_000, max_frames=130, max_objects=3,
                idle_seconds=3600)
ALICE, BOB, CAROL = "alice-0001", "bob-00002", "carol-0003"
CLICK = {"frame_index": 0, "points": [[0.3, 0.6]], "point_labels": [1], "obj_id": 7}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A --root with the carphone clip, the 250-frame bikes clip (over max_frames) and symlinks out."""
    base = tmp_path_factory.mktemp("serve")
    root = base / "root"
    (root / "clips").mkdir(parents=True)
    shutil.copy(CARPHONE, root / "clips" / "carphone.mp4")
    (root / "bikes.mp4").symlink_to(CLIPS / "bikes.mp4")  # a symlink out of the root: refused
    shutil.copy(CLIPS / "bikes.mp4", root / "long.mp4")
    (base / "secret.mp4").write_bytes(b"not for clients")
    (root / "escape.mp4").symlink_to(base / "secret.mp4")
    (root / "inside.mp4").symlink_to(root / "clips" / "carphone.mp4")  # a symlink that stays inside: fine
    return root


@pytest.fixture(scope="module")
def predictor():
    with sam3track.load(demo_bundle_path(), max_num_objects=LIMITS.max_objects, **DEMO_OVERRIDES) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def server(root, predictor):
    app = create_app(predictor, root=root, limits=LIMITS, bundle_name="demo")
    with ServerThread(app) as running:
        running.api = app.state.api
        yield running


def client(server, who: str | None = ALICE) -> httpx.Client:
    headers = {"X-Client-Id": who} if who else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=120)


def post(http: httpx.Client, route: str, body) -> httpx.Response:
    return http.post(route, json=body)


def start(http: httpx.Client, path: str = "clips/carphone.mp4") -> dict:
    response = post(http, "/api/start_session", {"resource_path": path})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def alice(server):
    """Alice's client; her sessions are closed after each test."""
    with client(server) as http:
        yield http
        for entry in http.get("/api/sessions").json()["sessions"]:
            post(http, "/api/close_session", {"session_id": entry["session_id"]})


def masks_of(outputs: dict) -> np.ndarray:
    return np.array([decode_rle(rle) for rle in outputs["out_binary_masks"]]).reshape(-1, 144, 176)


def same_outputs(wire: dict, official: dict) -> None:
    assert wire["out_obj_ids"] == official["out_obj_ids"].tolist()
    np.testing.assert_allclose(wire["out_probs"], official["out_probs"], rtol=1e-6)
    np.testing.assert_allclose(np.array(wire["out_boxes_xywh"]).reshape(-1, 4), official["out_boxes_xywh"], rtol=1e-6)
    np.testing.assert_array_equal(masks_of(wire), official["out_binary_masks"])


def test_the_api_answers_as_the_official_request_api(alice, server, predictor, root):
    """Each request over HTTP gives what OfficialPredictor.handle_request gives in process: the same ids,
    scores, boxes and masks (as RLE), and propagate_in_video streams the same frames as events."""
    info = start(alice, "clips/carphone.mp4")
    assert (info["num_frames"], info["width"], info["height"]) == (120, 176, 144)
    sid = info["session_id"]
    official = OfficialPredictor(predictor)
    ref = official.handle_request({"type": "start_session", "resource_path": str(root / "clips/carphone.mp4")})
    box = {"bounding_boxes": [[0.1, 0.1, 0.4, 0.5]], "bounding_box_labels": [1], "obj_id": 9}
    requests = [("add_prompt", {"frame_index": 0, "text": "person"}), ("add_prompt", CLICK),
                ("add_prompt", {"frame_index": 2, **box}),  # a box, then a negative click with it
                ("add_prompt", {"frame_index": 2, "points": [[0.2, 0.2]], "point_labels": [0], **box})]
    try:
        for kind, fields in requests:
            wire = post(alice, f"/api/{kind}", {"session_id": sid, **fields}).json()
            want = official.handle_request({"type": kind, "session_id": ref["session_id"], **fields})
            assert wire["frame_index"] == want["frame_index"]
            same_outputs(wire["outputs"], want["outputs"])
        stream = {"propagation_direction": "both", "start_frame_index": 2, "max_frame_num_to_track": 2}
        events = sse_events(post(alice, "/api/propagate_in_video", {"session_id": sid, **stream}).text)
        want = list(official.handle_stream_request({"type": "propagate_in_video", "session_id": ref["session_id"],
                                                    **stream}))
    finally:
        official.handle_request({"type": "close_session", "session_id": ref["session_id"]})
    assert [e for e, _ in events] == ["start"] + ["message"] * 5 + ["done"]
    assert events[0][1]["total"] == 5 and events[-1][1] == {"frames": 5}
    for (_, got), expected in zip(events[1:-1], want):
        assert got["frame_index"] == expected["frame_index"]
        same_outputs(got["outputs"], expected["outputs"])
    assert [got["frame_index"] for _, got in events[1:-1]] == [2, 3, 4, 1, 0]  # forward, then backward
    assert [got["done"] for _, got in events[1:-1]] == [1, 2, 3, 4, 5]
    assert {7, 9} <= set(events[-2][1]["outputs"]["out_obj_ids"])


def test_remove_reset_close_and_the_frames_of_a_session(alice):
    sid = start(alice)["session_id"]
    assert post(alice, "/api/add_prompt", {"session_id": sid, **CLICK}).status_code == 200
    removed = post(alice, "/api/request", {"type": "remove_object", "session_id": sid, "obj_id": 7}).json()
    assert removed["outputs"]["out_obj_ids"] == [] and removed["outputs"]["out_binary_masks"] == []
    assert alice.get(f"/api/sessions/{sid}/outputs/0").json()["outputs"]["out_obj_ids"] == []
    assert post(alice, "/api/reset_session", {"session_id": sid}).json() == {"is_success": True}
    assert alice.get(f"/api/sessions/{sid}").json()["frames_with_outputs"] == 0
    jpeg = alice.get(f"/api/sessions/{sid}/frames/119")
    assert jpeg.headers["content-type"] == "image/jpeg"
    assert cv2.imdecode(np.frombuffer(jpeg.content, np.uint8), cv2.IMREAD_COLOR).shape == (144, 176, 3)
    assert alice.get(f"/api/sessions/{sid}/frames/120").status_code == 404
    assert post(alice, "/api/close_session", {"session_id": sid}).json() == {"is_success": True}
    assert post(alice, "/api/close_session", {"session_id": sid}).json() == {"is_success": True}  # twice is fine
    gone = post(alice, "/api/add_prompt", {"session_id": sid, **CLICK})
    assert gone.status_code == 404 and "no open session" in gone.json()["error"]


def test_downloads_are_the_mask_video_json_and_pngs(alice, tmp_path):
    sid = start(alice)["session_id"]
    post(alice, "/api/add_prompt", {"session_id": sid, **CLICK})
    post(alice, "/api/propagate_in_video", {"session_id": sid, "propagation_direction": "forward",
                                            "max_frame_num_to_track": 2})
    video = alice.get(f"/api/sessions/{sid}/download/masks.mp4")
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    assert 'filename="carphone.masks.mp4"' in video.headers["content-disposition"]
    (tmp_path / "masks.mp4").write_bytes(video.content)
    with open_source(tmp_path / "masks.mp4") as reader:
        assert (len(reader), reader.width, reader.height) == (3, 176, 144)
    frames = json.loads(alice.get(f"/api/sessions/{sid}/download/results.json").content)
    assert frames["complete"] and [f["frame_index"] for f in frames["frames"]] == [0, 1, 2]
    mask = decode_rle(frames["frames"][2]["objects"][0])
    assert frames["frames"][2]["objects"][0]["object_id"] == 7 and mask.shape == (144, 176)
    with zipfile.ZipFile(io.BytesIO(alice.get(f"/api/sessions/{sid}/download/masks.zip").content)) as pngs:
        assert pngs.namelist() == ["masks/000000.png", "masks/000001.png", "masks/000002.png"]
        labels = cv2.imdecode(np.frombuffer(pngs.read("masks/000002.png"), np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(labels == 8, mask)  # pixel = object id + 1
    assert alice.get(f"/api/sessions/{sid}/download/masks.exe").status_code == 404
    post(alice, "/api/reset_session", {"session_id": sid})
    empty = alice.get(f"/api/sessions/{sid}/download/masks.mp4")
    assert empty.status_code == 409 and "no frame has outputs" in empty.json()["error"]


def test_several_text_prompts_in_one_add_prompt(alice):
    sid = start(alice)["session_id"]
    both = post(alice, "/api/add_prompt", {"session_id": sid, "frame_index": 3, "text": ["person", "car"]})
    assert both.status_code == 200 and both.json()["frame_index"] == 3
    for body, fragment in [({"text": []}, "a list of 1 to 8"), ({"text": ["person", 3]}, "must be words"),
                           ({"text": ["a", "b"], **{k: CLICK[k] for k in ("points", "obj_id")}}, "goes alone")]:
        refused = post(alice, "/api/add_prompt", {"session_id": sid, "frame_index": 0, **body})
        assert refused.status_code == 400 and fragment in refused.json()["error"]


@pytest.mark.parametrize("headers, body, status, fragment", [
    ({}, {"resource_path": "clips/carphone.mp4"}, 400, "no client id"),
    ({"X-Client-Id": "short"}, {"resource_path": "clips/carphone.mp4"}, 400, "8 to 64 letters"),
    ({"X-Client-Id": ALICE, "Content-Type": "text/plain"}, "x", 415, "Content-Type: application/json"),
    ({"X-Client-Id": ALICE, "Content-Type": "application/json"}, "{not json", 400, "not valid JSON"),
    ({"X-Client-Id": ALICE}, [1, 2], 400, "must be a JSON object"),
    ({"X-Client-Id": ALICE}, {"resource_path": "clips/carphone.mp4", "session_id": "mine"}, 400, "leave session_id"),
    ({"X-Client-Id": ALICE}, {"resource_path": "clips/carphone.mp4", "colour": 1}, 400, "unknown field(s) 'colour'"),
    ({"X-Client-Id": ALICE}, {}, 400, "needs the field 'resource_path'"),
], ids=["no-client", "bad-client", "not-json-type", "bad-json", "json-array", "session-id", "unknown-field",
        "no-path"])
def test_a_bad_start_session_gets_one_json_error(server, headers, body, status, fragment):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        kwargs = {"content": body} if isinstance(body, str) else {"json": body}
        response = http.post("/api/start_session", headers=headers, **kwargs)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"] and "Traceback" not in response.text


@pytest.mark.parametrize("route, body, status, fragment", [
    ("/api/request", {"type": "bogus"}, 400, "invalid request type: 'bogus'"),
    ("/api/bogus", {}, 404, "no route POST /api/bogus"),
    ("/api/add_prompt", {"type": "reset_session"}, 400, "differs from the route's 'add_prompt'"),
    ("/api/add_prompt", {"frame_index": 500, "text": "dog"}, 400, "out of range: the video has 120 frames"),
    ("/api/add_prompt", {"frame_index": 0, "points": [[0.5, 0.5]]}, 400, "points need obj_id"),
    ("/api/add_prompt", {"frame_index": 0, "points": [[5, 0.5]], "obj_id": 1}, 400, "outside 0..1"),
    ("/api/add_prompt", {"frame_index": 0, "text": "dog", "size": 3}, 400, "unknown field(s) 'size'"),
    ("/api/remove_object", {"obj_id": 99}, 400, "object 99 is not tracked"),
    ("/api/propagate_in_video", {"propagation_direction": "sideways"}, 400, "invalid propagation_direction"),
], ids=["type", "route", "type-clash", "frame", "no-obj-id", "point-range", "unknown-field", "object",
        "direction"])
def test_a_bad_request_gets_one_json_error_and_the_session_stays_usable(alice, route, body, status, fragment):
    sid = start(alice)["session_id"]
    response = post(alice, route, {"session_id": sid, **body})
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"] and "Traceback" not in response.text
    assert post(alice, "/api/add_prompt", {"session_id": sid, **CLICK}).status_code == 200


def test_unknown_routes_and_methods_say_so(server):
    with client(server) as http:
        assert http.get("/api/nope").status_code == 404 and "no route GET /api/nope" in http.get("/api/nope").text
        assert http.get("/api/add_prompt").status_code == 405
        assert http.get("/no/page").json() == {"error": "no such page or route: GET /no/page (docs/api.md lists "
                                                        "them)", "status": 404}


@pytest.mark.parametrize("path, status, fragment", [
    ("../secret.mp4", 403, "without '..'"),
    ("/etc/passwd", 403, "must be relative"),
    ("clips/../../secret.mp4", 403, "without '..'"),
    ("escape.mp4", 403, "leads outside the server's root"),
    ("bikes.mp4", 403, "leads outside the server's root"),
    ("clips/none.mp4", 404, "no such file"),
    ("", 400, "relative to the server's root"),
    (3, 400, "relative to the server's root"),
])
def test_server_side_paths_stay_under_the_root(alice, path, status, fragment):
    response = post(alice, "/api/start_session", {"resource_path": path})
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]


def test_the_video_list_holds_the_root_only(alice):
    listed = [v["path"] for v in alice.get("/api/videos").json()["videos"]]
    assert listed == ["clips/carphone.mp4", "inside.mp4", "long.mp4"]
    assert start(alice, "inside.mp4")["num_frames"] == 120  # a symlink within the root opens


def test_caps_on_sessions_frames_and_objects(server, alice):
    first = start(alice)["session_id"]
    start(alice)
    third = post(alice, "/api/start_session", {"resource_path": "clips/carphone.mp4"})
    assert third.status_code == 429 and "--max-client-sessions 2" in third.json()["error"]
    with client(server, BOB) as bob, client(server, CAROL) as carol:
        bobs = start(bob)["session_id"]
        full = post(carol, "/api/start_session", {"resource_path": "clips/carphone.mp4"})
        assert full.status_code == 429 and "--max-sessions 3" in full.json()["error"]
        post(bob, "/api/close_session", {"session_id": bobs})
        long = post(carol, "/api/start_session", {"resource_path": "long.mp4"})
        assert long.status_code == 413 and "long.mp4 has 250 frames" in long.json()["error"]
    for obj_id in (1, 2, 3):
        assert post(alice, "/api/add_prompt", {"session_id": first, **CLICK, "obj_id": obj_id}).status_code == 200
    fourth = post(alice, "/api/add_prompt", {"session_id": first, **CLICK, "obj_id": 4})
    assert fourth.status_code == 409 and "--max-objects 3" in fourth.json()["error"]
    assert post(alice, "/api/add_prompt", {"session_id": first, **CLICK, "obj_id": 2}).status_code == 200  # refine


def test_sessions_are_isolated_per_client(server, alice):
    sid = start(alice)["session_id"]
    with client(server, BOB) as bob:
        assert bob.get("/api/sessions").json() == {"sessions": []}
        for response in (post(bob, "/api/add_prompt", {"session_id": sid, **CLICK}),
                         bob.get(f"/api/sessions/{sid}/frames/0"), bob.get(f"/api/sessions/{sid}/download/masks.mp4"),
                         post(bob, "/api/propagate_in_video", {"session_id": sid})):
            assert response.status_code == 404 and "no open session" in response.json()["error"]
        assert post(bob, "/api/close_session", {"session_id": sid}).json() == {"is_success": True}
    assert post(alice, "/api/add_prompt", {"session_id": sid, **CLICK}).status_code == 200  # still Alice's


def test_an_upload_is_a_session_whose_file_goes_with_it(server, alice):
    workdir = server.api.workdir
    response = alice.post("/api/upload", params={"filename": "my clip.mp4"}, content=CARPHONE.read_bytes())
    assert response.status_code == 200, response.text
    info = response.json()
    assert (info["name"], info["num_frames"]) == ("my clip.mp4", 120)
    assert len(list(workdir.glob("upload-*/video.mp4"))) == 1
    post(alice, "/api/close_session", {"session_id": info["session_id"]})
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("params, content, status, fragment", [
    ({"filename": "notes.txt"}, b"x", 400, "must end in one of"),
    ({"filename": "clip.mp4"}, b"\0" * 700_001, 413, "over this server's limit of 700000 bytes"),
    ({"filename": "clip.mp4"}, iter([b"\0" * 400_000] * 2), 413, "(--max-upload-mb)"),  # chunked: no length
    ({"filename": "clip.mp4"}, b"", 400, "the upload is empty"),
    ({"filename": "clip.mp4"}, b"not a video at all", 400, "clip.mp4 is not a readable video"),
], ids=["suffix", "declared-size", "streamed-size", "empty", "not-a-video"])
def test_a_bad_upload_is_refused_and_leaves_nothing(server, alice, params, content, status, fragment):
    response = alice.post("/api/upload", params=params, content=content)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    assert str(server.api.workdir) not in response.text  # the server's own paths stay its own
    assert list(server.api.workdir.iterdir()) == []


def test_idle_sessions_are_closed_and_freed(server, alice):
    registry = server.api.registry
    sid = start(alice)["session_id"]
    session = registry.official.session(sid)
    assert registry.expire_idle(registry.clock() + 10) == []  # used just now
    assert registry.expire_idle(registry.clock() + LIMITS.idle_seconds + 1) == [sid]
    assert session.closed
    gone = post(alice, "/api/add_prompt", {"session_id": sid, **CLICK})
    assert gone.status_code == 404 and "expired after 3600 s unused" in gone.json()["error"]


def test_other_hosts_and_origins_get_nothing(server):
    with client(server) as http:
        rebound = http.get("/api/info", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400 and "not one this server answers" in rebound.json()["error"]
        answer = http.get("/api/info", headers={"Origin": "http://attacker.example"})
        assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers  # CORS off
        page = http.get("/")
        assert page.status_code == 200 and "<canvas" in page.text
        cookie = page.headers["set-cookie"].lower()
        assert "samesite=strict" in cookie and "httponly" in cookie


def test_an_internal_error_is_one_line_without_a_traceback(server, monkeypatch):
    def broken(*args):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(server.api.registry, "handle", broken)
    with client(server, "own-connection") as http:  # uvicorn closes a connection after an error
        response = post(http, "/api/reset_session", {"session_id": "x"})
    assert response.status_code == 500
    assert response.json()["error"] == "internal error (RuntimeError); the server's log has the details"


def test_the_command_line_refuses_a_bad_root_or_a_taken_port(capsys, tmp_path):
    assert main(["serve", "--root", str(tmp_path / "none")]) == 2
    assert "--root" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert main(["serve", "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_the_server_closes_idle_sessions_by_itself():
    """The app's reaper calls expire_idle every idle_seconds / 4 (0.5 s at least), on its own."""
    import asyncio

    from sam3track.serve.app import ServeApi
    from sam3track.serve.paths import VideoRoot

    class Registry:
        limits = Limits(idle_seconds=1)
        calls = 0

        def expire_idle(self):
            Registry.calls += 1
            return ["an-idle-session"]

    async def reap_twice():
        api = ServeApi(Registry(), VideoRoot(None), "stub")
        reaper = asyncio.create_task(api.expire_idle_sessions())
        try:
            for _ in range(600):  # 60 s at most: a reaper that never runs hangs here, and fails below
                if Registry.calls >= 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            reaper.cancel()
            shutil.rmtree(api.workdir)

    asyncio.run(reap_twice())
    assert Registry.calls >= 2, "the idle-session reaper did not run"


def test_a_client_that_leaves_mid_propagation_ends_it(server, alice):
    """The page's Stop closes the event stream: the server ends that propagation, and the session is free."""
    sid = start(alice)["session_id"]
    post(alice, "/api/add_prompt", {"session_id": sid, **CLICK})
    entry = server.api.registry.get(ALICE, sid)
    with alice.stream("POST", "/api/propagate_in_video", json={"session_id": sid, "propagation_direction": "forward"}) \
            as stream:
        lines = stream.iter_lines()
        assert next(lines) == "event: start"
        assert next(line for line in lines if line.startswith("data: {\"frame_index\""))
    for _ in range(600):  # 60 s at most for the server to see the stream gone
        if entry.streams == 0:
            break
        time.sleep(0.1)
    assert entry.streams == 0, "the propagation went on after its client left"
    assert len(entry.results) < 120  # stopped early: the 120 frames take seconds, the disconnect is seen at once
    assert post(alice, "/api/add_prompt", {"session_id": sid, **CLICK, "obj_id": 8}).status_code == 200
