"""Meta's SAM 3 video predictor request API on a sam3track bundle: :class:`OfficialPredictor`.

Code written for the official ``handle_request`` / ``handle_stream_request`` runs unchanged; outputs
are :meth:`FrameResult.to_official`, and a bad request raises one :class:`RequestError` naming the
field at fault, before the session changes::

    predictor = OfficialPredictor("sam3-bundle")          # or OfficialPredictor(sam3track.load(...))
    sid = predictor.handle_request({"type": "start_session", "resource_path": "video.mp4"})["session_id"]

Request types, fields and rules: docs/api.md, "Clicks, boxes and the official request API".
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import numpy as np

from .errors import ArgumentError, shown, whole_number_argument
from .prompts import box_rows
from .results import FrameResult

__all__ = ["OfficialPredictor", "RequestError", "REQUEST_FIELDS", "STREAM_REQUEST_FIELDS"]


class RequestError(ArgumentError):
    """A request of the official API is malformed: unknown type, missing or bad field, unknown session."""


class RequestTypeError(RequestError, TypeError):
    """A request field of the wrong type (a frame index or id that is not a whole number)."""


# Every field the official predictor reads, per request type (required ones first, in REQUIRED).
REQUEST_FIELDS = {
    "start_session": {"resource_path", "session_id", "offload_video_to_cpu", "offload_state_to_cpu"},
    "add_prompt": {"session_id", "frame_index", "text", "points", "point_labels", "clear_old_points",
                   "bounding_boxes", "bounding_box_labels", "clear_old_boxes", "output_prob_thresh", "obj_id",
                   "rel_coordinates"},
    "remove_object": {"session_id", "frame_index", "obj_id"},
    "reset_session": {"session_id"},
    "cancel_propagation": {"session_id"},
    "close_session": {"session_id", "run_gc_collect", "clear_cache_threshold"},
}
STREAM_REQUEST_FIELDS = {
    "propagate_in_video": {"session_id", "propagation_direction", "start_frame_index", "max_frame_num_to_track",
                           "output_prob_thresh"},
}
REQUIRED = {
    "start_session": ("resource_path",),
    "add_prompt": ("session_id", "frame_index"),
    "remove_object": ("session_id", "obj_id"),
    "reset_session": ("session_id",),
    "cancel_propagation": ("session_id",),
    "close_session": ("session_id",),
    "propagate_in_video": ("session_id",),
}


def empty_outputs(height: int, width: int) -> dict:
    """The official outputs of a frame with no object."""
    return FrameResult.empty(0, height, width).to_official()


class OfficialPredictor:
    """The official SAM 3 video predictor's request API over a sam3track predictor.

    ``bundle_or_predictor``: a bundle folder (loaded with ``sam3track.load(path, **load_options)``
    and closed by :meth:`shutdown`) or a loaded :class:`sam3track.Predictor` (left open).
    """

    def __init__(self, bundle_or_predictor, **load_options):
        from .predictor import Predictor

        if isinstance(bundle_or_predictor, Predictor):
            if load_options:
                raise ArgumentError(f"load options {sorted(load_options)} apply to a bundle path, not to a "
                                    "predictor that is already loaded")
            self.predictor, self._owns_predictor = bundle_or_predictor, False
        else:
            import sam3track

            self.predictor, self._owns_predictor = sam3track.load(bundle_or_predictor, **load_options), True
        self._sessions: dict[str, object] = {}
        self._streams: dict[str, Iterator] = {}  # session id -> its suspended propagate() generator

    # ------------------------------------------------------------------------------ dispatch
    def handle_request(self, request: dict) -> dict:
        """Dispatch one request (every type but ``propagate_in_video``), as the official predictor."""
        kind = self._check_request(request, REQUEST_FIELDS, "handle_request")
        return getattr(self, f"_{kind}")(request)

    def handle_stream_request(self, request: dict) -> Iterator[dict]:
        """``propagate_in_video``: a generator of ``{"frame_index", "outputs"}``, one per frame.

        The request is checked here, before the first frame is asked for."""
        self._check_request(request, STREAM_REQUEST_FIELDS, "handle_stream_request")
        session_id = request["session_id"]
        session = self._session(request)
        direction = request.get("propagation_direction", "both")
        start = request.get("start_frame_index")
        limit = request.get("max_frame_num_to_track")
        if start is not None:
            self._check_frame(session, start, "propagate_in_video: start_frame_index")
        what = "propagate_in_video: max_frame_num_to_track"
        if limit is not None and whole_number_argument(limit, what, RequestTypeError) < 0:
            raise RequestError(f"propagate_in_video: max_frame_num_to_track must be a whole number >= 0 or None, "
                               f"not {shown(limit)}")
        if direction not in ("both", "forward", "backward"):
            raise RequestError(f"propagate_in_video: invalid propagation_direction {shown(direction)}; one of "
                               "'both', 'forward', 'backward'")
        if direction == "backward":  # the official backward pass starts one frame before the start frame
            first = session.first_prompted_frame if start is None else start
            if first == 0 or limit == 0:
                return iter(())
            stream = session.propagate(direction="backward", start_frame=first - 1, max_frames=limit)
        else:  # forward: the start frame and M more; "both": then M frames before it (see _responses)
            stream = session.propagate(direction=direction, start_frame=start,
                                       max_frames=None if limit is None else int(limit) + 1)
        self._streams[session_id] = stream
        return self._responses(session_id, stream, limit if direction == "both" and limit is not None else None)

    def _check_request(self, request, fields: dict, method: str) -> str:
        if not isinstance(request, dict):
            raise RequestError(f"{method}() takes a request dict with a 'type', not {type(request).__name__}")
        if "type" not in request:
            raise RequestError(f"request {shown(request)} has no 'type'; one of: {', '.join(fields)}")
        kind = request["type"]
        if kind not in fields:
            other = STREAM_REQUEST_FIELDS if fields is REQUEST_FIELDS else REQUEST_FIELDS
            hint = (f"; {kind!r} is a request for "
                    f"{'handle_stream_request' if fields is REQUEST_FIELDS else 'handle_request'}()"
                    if isinstance(kind, str) and kind in other else "")
            raise RequestError(f"invalid request type: {shown(kind)} (valid for {method}(): "
                               f"{', '.join(fields)}){hint}")
        for name in REQUIRED[kind]:
            if name not in request:
                raise RequestError(f"{kind} request needs the field {name!r}")
        unknown = sorted(set(request) - fields[kind] - {"type"})
        if unknown:
            raise RequestError(f"{kind} request has unknown field(s) {', '.join(map(repr, unknown))}; "
                               f"its fields are: {', '.join(sorted(fields[kind]))}")
        return kind

    def session(self, session_id: str):
        """The :class:`~sam3track.TrackingSession` behind ``session_id`` (for frames and metadata the
        request API does not return, e.g. the web server's); RequestError when no such session is open."""
        return self._session({"session_id": session_id}, end_stream=False)

    def _session(self, request: dict, end_stream: bool = True):
        session_id = request["session_id"]
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise RequestError(f"Cannot find session {shown(session_id)}; start one with a start_session request "
                               f"(open sessions: {list(self._sessions)})")
        if end_stream:
            self._end_stream(session_id)
        return session

    def _end_stream(self, session_id: str) -> None:
        stream = self._streams.pop(session_id, None)
        if stream is not None:
            stream.close()

    # ------------------------------------------------------------------------------ requests
    def _start_session(self, request: dict) -> dict:
        path, session_id = request["resource_path"], request.get("session_id")
        if not isinstance(path, (str, os.PathLike)):
            raise RequestError(f"start_session: resource_path must be the path of a video file or a folder of "
                               f"frames, not {type(path).__name__}")
        if session_id is not None and not isinstance(session_id, str):
            raise RequestError(f"start_session: session_id must be a str, not {type(session_id).__name__}")
        if session_id in self._sessions:
            raise RequestError(f"start_session: session {session_id!r} is already open; close it first or "
                               "leave session_id out for a new one")
        session_id = session_id or str(uuid.uuid4())
        self._sessions[session_id] = self.predictor.start_session(path)
        return {"session_id": session_id}

    def _add_prompt(self, request: dict) -> dict:
        session = self._session(request)
        frame = request["frame_index"]
        self._check_frame(session, frame, "add_prompt: frame_index")
        text = request.get("text")
        points, labels = request.get("points"), request.get("point_labels")
        boxes, box_labels = request.get("bounding_boxes"), request.get("bounding_box_labels")
        obj_id = request.get("obj_id")
        if obj_id is not None and whole_number_argument(obj_id, "add_prompt: obj_id", RequestTypeError) < 0:
            raise RequestError(f"add_prompt: obj_id must be a whole number >= 0, not {shown(obj_id)}")
        rel = request.get("rel_coordinates", True)
        clear = request.get("clear_old_points", True)
        for name, flag in (("rel_coordinates", rel), ("clear_old_points", clear)):
            if not isinstance(flag, (bool, np.bool_)):
                raise RequestError(f"add_prompt: {name} must be True or False, not {shown(flag)}")

        if boxes is not None and session.box_prompts == "detector":
            return self._exemplar_prompt(session, frame, text, points, boxes, box_labels, rel)
        if text is not None:
            if points is not None:
                raise RequestError("add_prompt: give either text or points, not both (as the official predictor: "
                                   "points refine an object by obj_id, text starts over)")
            if boxes is not None:
                raise RequestError("add_prompt: bounding_boxes together with text are detector exemplars in the "
                                   "official SAM 3; sam3track does not support box exemplars. Send the text "
                                   "alone, or the boxes alone (tracker box prompts, one object per box)")
            if not isinstance(text, str) or not text.strip():
                raise RequestError(f"add_prompt: text must be the words to find, e.g. 'dog', not {shown(text)}")
            # as the official predictor: a text prompt starts over, then that frame is tracked
            return {"frame_index": frame, "outputs": session.text_prompt_result(frame, text).to_official()}

        if points is None and boxes is None:
            raise RequestError("add_prompt needs text, points (with obj_id) or bounding_boxes")
        h, w = session.source.height, session.source.width
        box_list = self._boxes(boxes, box_labels, rel, w, h) if boxes is not None else []
        if points is not None:
            if obj_id is None:
                raise RequestError("add_prompt: points need obj_id (as the official predictor): a new id starts a "
                                   "new object, the id of a tracked object refines it")
            xy = self._points(points, rel, w, h)
            if labels is not None:
                labels = np.asarray(labels).reshape(-1).tolist()
            if len(box_list) > 1:
                raise RequestError(f"add_prompt: points go with at most one box (of object {obj_id}); got "
                                   f"{len(box_list)} bounding_boxes")
            result = session.add_prompt(frame_index=frame, points=xy, labels=labels,
                                        boxes=box_list[0] if box_list else None, obj_id=int(obj_id),
                                        clear_old_points=bool(clear))
        else:
            if obj_id is not None and len(box_list) > 1:
                raise RequestError(f"add_prompt: obj_id {obj_id} names one object, but {len(box_list)} "
                                   "bounding_boxes would make one object each; send one box per obj_id")
            for box in box_list:
                result = session.add_prompt(frame_index=frame, boxes=box,
                                            obj_id=None if obj_id is None else int(obj_id),
                                            clear_old_points=bool(clear))
        return {"frame_index": frame, "outputs": result.to_official()}

    def _exemplar_prompt(self, session, frame, text, points, boxes, box_labels, rel: bool) -> dict:
        """SAM 3.1: bounding_boxes (with text or without) are detector exemplars for that frame, labels 1
        positive / 0 negative, and the prompt starts over, as Meta's SAM 3.1 predictor has them."""
        if points is not None:
            raise RequestError("add_prompt: points go alone (with obj_id) in SAM 3.1, as in Meta's predictor; "
                               "bounding_boxes (with or without text) start over with a detector prompt")
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise RequestError(f"add_prompt: text must be the words to find, e.g. 'dog', not {shown(text)}")
        xyxy = self._boxes(boxes, None, rel, session.source.width, session.source.height)
        labels = None
        if box_labels is not None:
            labels = np.asarray(box_labels).reshape(-1)
            if labels.shape[0] != len(xyxy) or not np.isin(labels, (0, 1)).all():
                raise RequestError(f"add_prompt: bounding_box_labels {shown(box_labels)} must give 1 (positive) or 0 "
                                   f"(negative) for each of the {len(xyxy)} bounding_boxes")
        result = session.add_prompt(frame_index=frame, text=text, boxes=xyxy, box_labels=labels)
        return {"frame_index": frame, "outputs": result.to_official()}

    @staticmethod
    def _check_frame(session, frame, what: str) -> None:
        n = session.num_frames
        if not 0 <= whole_number_argument(frame, what, RequestTypeError) < n:
            raise RequestError(f"{what} {shown(frame)} is out of range: the video has {n} frames (0..{n - 1})")

    @staticmethod
    def _points(points, rel: bool, w: int, h: int) -> list[list[float]]:
        try:
            xy = np.asarray(points, np.float64)
        except (TypeError, ValueError):
            xy = None
        if xy is None or xy.ndim not in (2, 3) or xy.shape[-1] != 2 or (xy.ndim == 3 and xy.shape[0] != 1):
            raise RequestError(f"add_prompt: points must be [[x, y], ...], not {shown(points)}")
        xy = xy.reshape(-1, 2)
        if not np.isfinite(xy).all():
            raise RequestError(f"add_prompt: points {shown(points)} are not all finite numbers")
        if rel:
            if (xy < 0).any() or (xy > 1).any():
                raise RequestError(f"add_prompt: points {shown(points)} are outside 0..1; with rel_coordinates=True "
                                   "(the default) they are fractions of the frame; send rel_coordinates=False for "
                                   "pixels")
            xy = xy * np.asarray([w, h], np.float64)
        return xy.tolist()

    @staticmethod
    def _boxes(boxes, labels, rel: bool, w: int, h: int) -> list[list[float]]:
        """[x, y, w, h] boxes (fractions of the frame when rel) as [x0, y0, x1, y1] video pixels."""
        xywh = box_rows(boxes, "add_prompt: bounding_boxes must be [[x, y, w, h], ...]", RequestError)
        if not np.isfinite(xywh).all() or (xywh[:, 2:] < 0).any():
            raise RequestError(f"add_prompt: bounding_boxes {shown(boxes)} need finite numbers and w, h >= 0")
        if labels is not None:
            flat = np.asarray(labels).reshape(-1)
            if flat.shape[0] != xywh.shape[0]:
                raise RequestError(f"add_prompt: {flat.shape[0]} bounding_box_labels for {xywh.shape[0]} "
                                   "bounding_boxes")
            if (flat != 1).any():
                raise RequestError(f"add_prompt: bounding_box_labels {shown(labels)}: only positive boxes (1) are "
                                   "supported; negative boxes are detector exemplars in the official SAM 3, which "
                                   "sam3track does not support")
        xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        if rel:
            if (xyxy < 0).any() or (xyxy > 1 + 1e-6).any():
                raise RequestError(f"add_prompt: bounding_boxes {shown(boxes)} reach outside 0..1; with "
                                   "rel_coordinates=True (the default) they are fractions of the frame")
            xyxy = xyxy * np.asarray([w, h, w, h], np.float64)
        return xyxy.tolist()

    def _remove_object(self, request: dict) -> dict:
        session = self._session(request, end_stream=False)  # allowed between frames of a propagation
        frame, obj_id = request.get("frame_index", 0), request["obj_id"]
        self._check_frame(session, frame, "remove_object: frame_index")
        session.remove_object(obj_id)
        return {"frame_index": frame, "outputs": empty_outputs(session.source.height, session.source.width)}

    def _reset_session(self, request: dict) -> dict:
        self._session(request).reset()
        return {"is_success": True}

    def _cancel_propagation(self, request: dict) -> dict:
        self._session(request)  # ends its propagation, if any
        return {"is_success": True}

    def _close_session(self, request: dict) -> dict:
        session_id = request["session_id"]
        session = self._sessions.pop(session_id, None) if isinstance(session_id, str) else None
        if session is not None:
            self._end_stream(session_id)
            session.close()
        return {"is_success": True}

    def _responses(self, session_id: str, stream, reach_back: int | None = None) -> Iterator[dict]:
        """reach_back: in "both", the backward pass ends M frames before the start frame (the first one
        yielded), as the official's does with max_frame_num_to_track=M."""
        start = None
        try:
            for result in stream:
                start = result.frame_index if start is None else start
                if reach_back is not None and result.frame_index < start - reach_back:
                    break
                yield {"frame_index": int(result.frame_index), "outputs": result.to_official()}
        finally:
            if self._streams.get(session_id) is stream:
                del self._streams[session_id]
            stream.close()

    # ----------------------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Close every session, and the predictor when this facade loaded it; idempotent."""
        for session_id in list(self._sessions):
            self._close_session({"session_id": session_id})
        if self._owns_predictor:
            self.predictor.close()

    close = shutdown

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
