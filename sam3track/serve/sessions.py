"""The open sessions of ``sam3track serve``: each owned by one client id, capped, closed when idle.

:class:`SessionRegistry` runs the official request API (:class:`~sam3track.compat.OfficialPredictor`)
for each client, keeps every frame's latest outputs (RLE) for the page and the downloads, and frees a
session's memory and files when it closes or expires. The model runs one call at a time: the graphs
are shared, and the CPU is the bottleneck anyway.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

from sam3track.compat import OfficialPredictor
from sam3track.errors import Sam3TrackError, is_whole_number, shown, whole_number_argument

from .wire import response_to_wire, without_object


class ServeError(Sam3TrackError):
    """A request the server refuses, with its HTTP status (4xx) and a message naming what is at fault."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one server takes at most (``sam3track serve --help`` names the options)."""

    max_sessions: int = 8  # open sessions, all clients together
    max_client_sessions: int = 4  # open sessions of one client
    max_upload_bytes: int = 512 * 2**20
    max_frames: int = 10_000  # frames of one video
    max_objects: int = 16  # objects tracked at once in one session (the load option max_num_objects)
    max_prompts: int = 8  # text prompts of one add_prompt
    idle_seconds: float = 600.0  # a session unused this long is closed

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ServedSession:
    """One client's session: the tracking session, its video, its files and every frame's outputs."""

    def __init__(self, session_id: str, client: str, session, video: Path, name: str, workdir: Path | None,
                 now: float):
        self.id, self.client, self.session, self.video, self.name = session_id, client, session, video, name
        self.workdir = workdir  # an upload's folder, removed on close
        self.lock = threading.Lock()  # one request at a time on a session
        self.last_used = now
        self.results: dict[int, dict] = {}  # frame -> latest outputs (JSON form)
        self.streams = 0  # propagations streaming now (kept alive while > 0)
        self.closed = False

    def info(self) -> dict:
        """What the page needs to show the video (start_session's answer beside the session id)."""
        if self.closed:
            raise closed_error(self)
        source = self.session.source
        return {"session_id": self.id, "name": self.name, "num_frames": int(self.session.num_frames),
                "width": int(source.width), "height": int(source.height), "fps": float(source.fps),
                "object_ids": [int(i) for i in self.session.object_ids], "frames_with_outputs": len(self.results)}

    def record(self, request: dict, response: dict) -> None:
        """Keep a response's outputs; a request that starts over first forgets the others."""
        kind = request["type"]
        if kind == "reset_session" or (kind == "add_prompt" and _starts_over(self.session, request)):
            self.results.clear()
        if kind == "remove_object":
            obj_id = int(request["obj_id"])
            self.results = {f: without_object(o, obj_id) for f, o in self.results.items()}
        elif "outputs" in response:
            self.results[int(response["frame_index"])] = response["outputs"]


def closed_error(entry: ServedSession) -> ServeError:
    """What a request on a session closed while it waited gets."""
    return ServeError(404, f"session {entry.id} was closed; start a new one")


def _starts_over(session, request: dict) -> bool:
    """A text add_prompt, or SAM 3.1's detector boxes, clear the session (the official rule)."""
    return request.get("text") is not None or (request.get("bounding_boxes") is not None
                                               and session.box_prompts == "detector")


class SessionRegistry:
    """Every open session of the server, by session id, each usable only by the client that opened it."""

    def __init__(self, official: OfficialPredictor, limits: Limits, clock=time.monotonic):
        self.official, self.limits, self.clock = official, limits, clock
        self._sessions: dict[str, ServedSession] = {}
        self._guard = threading.Lock()  # the session table and its caps
        self.model_lock = threading.Lock()  # one model call at a time, whichever session

    # ------------------------------------------------------------------------- open and find
    def count(self, client: str | None = None) -> int:
        return sum(1 for e in list(self._sessions.values()) if client is None or e.client == client)

    def check_room(self, client: str) -> None:
        """ServeError 429 when the server or this client has its cap of sessions open."""
        if self.count(client) >= self.limits.max_client_sessions:
            raise ServeError(429, f"this client has {self.count(client)} sessions open, the most it may "
                                  f"(--max-client-sessions {self.limits.max_client_sessions}); close one first")
        if self.count() >= self.limits.max_sessions:
            raise ServeError(429, f"the server has {self.count()} sessions open, the most it takes "
                                  f"(--max-sessions {self.limits.max_sessions}); try again when one closes")

    def start(self, client: str, video: Path, name: str, workdir: Path | None = None) -> ServedSession:
        """A new session of ``client`` on ``video`` (a checked path); its answer is ``.info()``."""
        with self._guard:  # the caps hold even when starts race
            self.check_room(client)
            try:
                session_id = self.official.handle_request({"type": "start_session",
                                                           "resource_path": str(video)})["session_id"]
            except Sam3TrackError as e:  # named as the client named it: the server's paths stay its own
                raise ServeError(400, str(e).replace(str(video), name)) from None
            session = self.official.session(session_id)
            frames = session.num_frames
            if frames > self.limits.max_frames:
                self.official.handle_request({"type": "close_session", "session_id": session_id})
                raise ServeError(413, f"{name} has {frames} frames; this server takes videos of at most "
                                      f"{self.limits.max_frames} (--max-frames); cut it shorter")
            entry = ServedSession(session_id, client, session, video, name, workdir, self.clock())
            self._sessions[session_id] = entry
        return entry

    def get(self, client: str, session_id) -> ServedSession:
        entry = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if entry is None or entry.client != client:
            raise ServeError(404, f"no open session {shown(session_id)} for this client: it was closed, expired "
                                  f"after {self.limits.idle_seconds:g} s unused, or was never opened here; start "
                                  "one with start_session")
        return entry

    def sessions_of(self, client: str) -> list[ServedSession]:
        return [e for e in list(self._sessions.values()) if e.client == client and not e.closed]

    # ------------------------------------------------------------------------------ requests
    def handle(self, client: str, request: dict) -> dict:
        """One request of the official API but start_session and propagate_in_video; JSON outputs."""
        if request.get("type") == "close_session":
            session_id = request.get("session_id")
            entry = self._sessions.get(session_id) if isinstance(session_id, str) else None
            if entry is not None and entry.client == client:
                self.close(entry)
            return {"is_success": True}  # closing twice is fine, as in the official API
        entry = self.get(client, request.get("session_id"))
        with entry.lock, self.model_lock:
            self._check_request(entry, request)
            if isinstance(request.get("text"), list):
                response = self._text_prompts(entry, request)
            else:
                response = self.official.handle_request(request)
            response = response_to_wire(response)
            entry.record(request, response)
            entry.last_used = self.clock()
        return response

    def _check_request(self, entry: ServedSession, request: dict) -> None:
        if entry.closed:
            raise closed_error(entry)
        if request.get("type") != "add_prompt" or request.get("obj_id") is None:
            return
        if request.get("points") is None and request.get("bounding_boxes") is None:
            return
        obj_id = request["obj_id"]
        if not is_whole_number(obj_id):
            return  # the request API names a bad obj_id itself
        tracked = entry.session.object_ids
        if obj_id not in tracked and len(tracked) >= self.limits.max_objects:
            raise ServeError(409, f"add_prompt: obj_id {shown(obj_id)} would be a new object, but the session "
                                  f"tracks {len(tracked)}, the most this server allows (--max-objects "
                                  f"{self.limits.max_objects}); remove one first")

    def _text_prompts(self, entry: ServedSession, request: dict) -> dict:
        """``text`` as a list (sam3track's extension): the session starts over, as with one text, and
        looks for every prompt; the answer is that frame with all their objects."""
        texts, session = request["text"], entry.session
        if not texts or len(texts) > self.limits.max_prompts or not all(isinstance(t, str) and t.strip()
                                                                        for t in texts):
            raise ServeError(400, f"add_prompt: text {shown(texts)} must be words to find, or a list of 1 to "
                                  f"{self.limits.max_prompts} of them, e.g. ['person', 'bike']")
        if len(texts) == 1:
            return self.official.handle_request({**request, "text": texts[0]})
        extra = sorted(set(request) - {"type", "session_id", "frame_index", "text", "output_prob_thresh"})
        if extra:
            raise ServeError(400, f"add_prompt: a list of texts goes alone; drop {', '.join(extra)} (send clicks "
                                  "and boxes in later requests)")
        if session.box_prompts == "detector":
            raise ServeError(400, "add_prompt: this is a SAM 3.1 bundle, which takes one text per add_prompt "
                                  "(as Meta's predictor); send a single text")
        frame = whole_number_argument(request.get("frame_index"), "add_prompt: frame_index")
        if not 0 <= frame < session.num_frames:
            raise ServeError(400, f"add_prompt: frame_index {frame} is out of range: the video has "
                                  f"{session.num_frames} frames (0..{session.num_frames - 1})")
        self.official.handle_request({"type": "cancel_propagation", "session_id": entry.id})
        session.reset()
        for text in texts:
            session.add_prompt(frame_index=frame, text=text.strip())
        return {"frame_index": frame, "outputs": session.run_frame(frame).to_official()}

    # ----------------------------------------------------------------------------- streaming
    def open_stream(self, client: str, request: dict) -> tuple[ServedSession, object, int]:
        """propagate_in_video checked and started: the session, the stream and its frame count."""
        entry = self.get(client, request.get("session_id"))
        with entry.lock:
            if entry.closed:
                raise closed_error(entry)
            stream = self.official.handle_stream_request(request)
            entry.streams += 1
        return entry, stream, _frames_to_track(entry.session, request)

    def next_frame(self, entry: ServedSession, stream) -> dict | None:
        """The stream's next frame (JSON form), or None when it ended (done, cancelled or closed)."""
        with entry.lock, self.model_lock:
            if entry.closed:
                return None
            response = next(stream, None)
            entry.last_used = self.clock()
            if response is None:
                return None
            response = response_to_wire(response)
            entry.record({"type": "propagate_in_video"}, response)
        return response

    def end_stream(self, entry: ServedSession, stream) -> None:
        with entry.lock:
            if hasattr(stream, "close"):
                stream.close()
            entry.streams -= 1
            entry.last_used = self.clock()

    # ------------------------------------------------------------------------------- closing
    def close(self, entry: ServedSession) -> None:
        """Close the session and free what it holds: graphs' memory, video, upload, outputs."""
        with entry.lock:
            with self._guard:
                self._sessions.pop(entry.id, None)
            if entry.closed:
                return
            entry.closed = True
            self.official.handle_request({"type": "close_session", "session_id": entry.id})
            entry.session = None
            entry.results = {}
            if entry.workdir is not None:
                shutil.rmtree(entry.workdir, ignore_errors=True)

    def expire_idle(self, now: float | None = None) -> list[str]:
        """Close every session unused for ``idle_seconds`` (none while it streams); their ids."""
        now = self.clock() if now is None else now
        idle = [e for e in list(self._sessions.values())
                if e.streams == 0 and now - e.last_used >= self.limits.idle_seconds]
        for entry in idle:
            self.close(entry)
        return [e.id for e in idle]

    def close_all(self) -> None:
        for entry in list(self._sessions.values()):
            self.close(entry)



def _frames_to_track(session, request: dict) -> int:
    """How many frames a propagate_in_video request yields (the page's progress bar), by the
    official rules of compat.OfficialPredictor.handle_stream_request."""
    n = int(session.num_frames)
    start = request.get("start_frame_index")
    start = int(getattr(session, "first_prompted_frame", 0)) if start is None else int(start)
    limit = request.get("max_frame_num_to_track")
    forward = n - start if limit is None else min(n - start, int(limit) + 1)
    backward = start if limit is None else min(start, int(limit))
    return {"forward": forward, "backward": backward}.get(request.get("propagation_direction"), forward + backward)


__all__ = ["Limits", "ServeError", "closed_error", "ServedSession", "SessionRegistry"]
