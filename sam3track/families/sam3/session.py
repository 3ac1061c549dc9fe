"""A tracking session: prompts, the frame source, object registry and memory bank for one video."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ...backends import DeviceTensor
from ...errors import (ArgumentError, FrameIndexError, ObjectIdError, PromptError, VideoError, frame_index_argument,
                       object_id_argument, shown)
from ...postprocess import build_result, to_pixel_values
from ...prompts import parse_clicks
from ...results import FrameResult
from ...session_base import (FrameCache, SessionBase, check_frame_size, check_direction,  # noqa: F401
                             check_max_frames, check_stream_frame, clicked_object_id)
from .clicks import ClickBook, use_multimask
from .frame_loop import ClickRequest, FrameLoop, FrameOutput
from .memory import MemoryBank
from .objects import ObjectRegistry, TrackedObject
from .text_prompts import TextPrompts


class Sam3Session(SessionBase):
    """A SAM 3 tracking session (sam3track.tracking_session.TrackingSession)."""

    box_prompts = "tracker"  # each box is an object of its own, decoded by the tracker

    def __init__(self, predictor, source=None, owns_source: bool = False, keep_history: bool = True):
        self.predictor = predictor
        self.config = predictor.config
        self.backend = predictor.backend
        self.source = source  # a FrameSource, or None for a live stream
        self._owns_source = owns_source
        # Results are held back hotstart_delay frames; the cache keeps the frames of results not yet
        # yielded, so a caller that draws on them (the CLI) never decodes a frame twice.
        cache_size = max(4, predictor.config.hotstart_delay + 2)
        self.frames = FrameCache(source, cache_size) if source is not None else None
        self.text = TextPrompts(self.backend, predictor.graphs, predictor.tokenizer, self.config.text_length)
        self._running = None  # the propagate() generator in progress, if any
        self._held: list[FrameOutput] = []  # outputs held back by that generator
        self.closed = False
        self.objects = ObjectRegistry()
        self.clicks = ClickBook()  # every object's clicks and boxes, per frame
        self._clicked = None  # (frame, tracker head) of the frame the user is clicking on
        self.bank = MemoryBank(self.backend, self.config, *self._pool_rows(predictor), keep_history=keep_history)
        self.loop = FrameLoop(self.backend, predictor.graphs, self.config, self.bank, self.objects)
        self.stream_index = 0
        self._stream_size: tuple[int, int] | None = None

    def _pool_rows(self, predictor) -> tuple[int, int]:
        """The memory bank's fixed pool sizes: the config's, or the sizes the propagation decoder was
        compiled for (an OM bundle's pools are part of its graphs)."""
        caps, graph = self.config.capacities(), predictor.graphs["propagation_decoder"]
        return (self.backend.plan(graph, "memory_rows", caps["memory_rows"]),
                self.backend.plan(graph, "pointer_rows", caps["pointer_rows"]))

    # ----------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Free the session's device memory and its video; idempotent. A propagate() generator still
        suspended raises SessionClosedError when resumed."""
        if self.closed:
            return
        self.closed = True
        self._held = []
        self._free_click_features()
        self.bank.close()
        self.text.clear()
        if self.frames is not None:
            self.frames.clear()
        if self.source is not None and self._owns_source:
            self.source.close()

    @property
    def num_frames(self) -> int | None:
        return len(self.source) if self.source is not None else None

    def frame(self, index: int) -> np.ndarray:
        """RGB frame `index` of the session's video, from the decode cache when it was just tracked."""
        self._check_open()
        if self.source is None:
            raise VideoError("this session has no video (live stream); it keeps no frames")
        self._check_frame(index)
        return self.frames.get(index)

    # ------------------------------------------------------------------------------- prompts
    def add_prompt(self, frame_index: int = 0, text: str | None = None, points=None, labels=None, boxes=None,
                   obj_id: int | None = None, clear_old_points: bool = True):
        """Add a text prompt, or clicks and a box for one object.

        Text (`text=`): found on every frame as in the reference; returns its prompt index.
        `frame_index` is the frame it is given on: `propagate()` without `start_frame` starts at the
        earliest prompted frame, as the reference does.

        Clicks and a box (`points=[[x, y], ...]`, `labels=[1, 0, ...]` (1 on the object, 0 not on it;
        default all 1), `boxes=[x0, y0, x1, y1]`, in video pixels) on frame `frame_index`:
        - `obj_id` None or an id not tracked: a new object (None takes the next free id);
        - the id of a tracked object (text-detected or clicked): refines it on that frame; the result
          becomes a conditioning memory that later frames follow. `clear_old_points=True` (the default,
          as the official request API and transformers' `clear_old_inputs`) replaces the object's
          earlier clicks on the frame; False adds to them.
        Returns that frame's FrameResult right away (every object on it), as the official predictor
        does; the prompted object is in it even when its mask is empty, so `r.object_ids[-1]` after
        a new object is that object. User-prompted objects are tracked by the tracker's own rules and
        never removed by the detector's heuristics.
        """
        self._check_open()
        if points is None and boxes is None and labels is None:
            return self._add_text(frame_index, text)
        if text is not None:
            raise PromptError("give either text= or points/boxes in one add_prompt call, not both; add the text "
                              "prompt with a separate call")
        return self._add_clicks(frame_index, points, labels, boxes, obj_id, clear_old_points)

    def _add_text(self, frame_index, text) -> int:
        if self.source is not None:
            self._check_frame(frame_index)
        elif frame_index_argument(frame_index) < 0:
            raise FrameIndexError(f"frame index {frame_index!r} must be a whole number >= 0")
        if text is None:
            raise PromptError("add_prompt needs text=, points= or boxes=, e.g. session.add_prompt(frame_index=0, "
                              "text='person')")
        if not isinstance(text, str):
            raise PromptError(f"prompt {shown(text)} is of type {type(text).__name__}; give the words as a str, "
                              "e.g. text='red car'")
        return self.text.add(text.strip(), int(frame_index))

    def _add_clicks(self, frame_index, points, labels, boxes, obj_id, clear_old) -> FrameResult:
        self._check_idle("add_prompt() with clicks or a box was called")
        if self.source is None:
            raise VideoError("clicks and boxes need a video session (start_session(video)): a live stream keeps no "
                             "frames to prompt on")
        self._check_frame(frame_index)
        where = f"add_prompt on frame {frame_index}"
        h, w = self.source.height, self.source.width
        click = parse_clicks(points, labels, boxes, h, w, where)
        if not isinstance(clear_old, bool):
            raise ArgumentError(f"{where}: clear_old_points must be True or False, not {shown(clear_old)}")
        objects = self.objects
        obj_id, new = clicked_object_id(obj_id, where, objects, objects.max_obj_id, self.config.max_num_objects,
                                        reuse_ids=False)
        merged = self.clicks.merged(obj_id, frame_index, click, clear_old, where)
        self.loop.check_points(len(merged), frame_index)
        self.loop.check_room(frame_index, *self.loop.click_rows(frame_index, obj_id))
        # everything is checked: from here on the session changes
        if new:
            objects.add(TrackedObject(obj_id=obj_id, prompt=-1, first_frame=frame_index, score=1.0,
                                      keep_alive=self.config.init_trk_keep_alive, last_visible=frame_index,
                                      interactive=True))
        obj = objects[obj_id]
        obj.interactive, obj.score = True, 1.0  # the official predictor scores user-prompted objects 1.0
        self.clicks.store(obj_id, frame_index, merged)
        is_init = frame_index not in obj.tracked_frames
        request = ClickRequest(obj_id, merged.model_coords(self.config.image_size, h, w), merged.labels,
                               use_memory=not is_init, multimask=use_multimask(self.config, is_init, len(merged)))
        out = self.loop.apply_clicks(self._click_features(frame_index), frame_index, [request], self.num_frames)
        # a text-detected object corrected by the user: the detector-made conditioning frames near the
        # correction yield to it (dropped after the correction, which read them, as the official
        # predictor does; a clicked object has none)
        self.bank.drop_detector_conditioning(obj_id, frame_index, self.config.refinement_cond_frame_window)
        return build_result(out, self.prompts, h, w, shown={obj_id})

    TRACKER_HEAD = ("tracker_feat_s0", "tracker_feat_s1", "tracker_feat")

    def _click_features(self, frame_index: int) -> dict[str, DeviceTensor]:
        """The tracker head of the frame being clicked on, kept on the device while the user clicks on
        that frame (one backbone call for a series of clicks; a graph's outputs are only valid until its
        next run, so they are copied into buffers the session owns)."""
        if self._clicked is not None and self._clicked[0] == frame_index:
            return self._clicked[1]
        self._free_click_features()
        b = self.backend
        out = self.loop.encode_frame(to_pixel_values(self.frames.get(frame_index), self.config))
        kept = {}
        for name in self.TRACKER_HEAD:
            kept[name] = b.empty(tuple(out[name].shape), out[name].dtype)
            b.copy(out[name], kept[name])
        self._clicked = (frame_index, kept)
        return kept

    def _free_click_features(self) -> None:
        if self._clicked is not None and not self.backend.closed:
            for tensor in self._clicked[1].values():
                self.backend.free(tensor)
        self._clicked = None

    def remove_prompt(self, text: str) -> None:
        """Stop looking for a text prompt: the objects it found go too, unless the user prompted them
        (refined by a click), which stay as user-prompted objects."""
        self._check_open()
        self._check_idle("remove_prompt() was called")
        key = text.strip() if isinstance(text, str) else text
        if key not in self.prompts:
            raise PromptError(f"prompt {shown(text)} is not in this session (prompts: {self.prompts})")
        k = self.prompts.index(key)
        for obj_id in self.objects.obj_ids:
            obj = self.objects[obj_id]
            if obj.prompt == k and not obj.interactive:
                self._forget_object(obj_id)
            elif obj.prompt >= k:  # indices shift down; a refined object of this prompt keeps no prompt
                obj.prompt = -1 if obj.prompt == k else obj.prompt - 1
        self.text.remove(k)

    # ---------------------------------------------------------------------------------- frames
    def _run_frame(self, index: int, rgb: np.ndarray, reverse: bool, streaming: bool, num_frames) -> FrameOutput:
        if not self.prompts and not len(self.objects):
            raise PromptError("no prompt in this session; call session.add_prompt(text=...) or add clicks or a box "
                              "first")
        text = self.text if self.prompts else None  # clicks and boxes only: the tracker alone
        out = self.loop.step(to_pixel_values(rgb, self.config), text, index, reverse, streaming, num_frames)
        self.bank.evict(index, reverse, streaming)
        return out

    def _result(self, out: FrameOutput, height: int, width: int, hidden: set[int] = frozenset()) -> FrameResult:
        return build_result(out, self.prompts, height, width, hidden)

    @property
    def prompts(self) -> list[str]:
        """The text prompts, in order: prompt k of FrameResult.prompts and of each object."""
        return self.text.texts

    @property
    def first_prompted_frame(self) -> int:
        """The earliest frame a text prompt, click or box was given on (0 without prompts)."""
        return min(self.text.frames + sorted(self.clicks.frames()), default=0)

    def propagate(self, direction: str = "forward", start_frame: int | None = None,
                  max_frames: int | None = None) -> Iterator[FrameResult]:
        """Track through the video, yielding one FrameResult per frame in processing order.

        Outputs are held back `hotstart_delay` frames (as the reference does) so that objects removed by
        the hotstart heuristics are never shown. `start_frame` defaults to the earliest frame a prompt
        was given on, whatever the direction (the reference tracker's rule). "backward" runs from
        start_frame down to 0, "both" runs forward then backward from start_frame - 1 on the same
        state (docs/api.md, "Where propagate() starts"). Arguments are checked here, before the first
        frame is asked for.
        """
        self._check_open()
        if self.source is None:
            raise VideoError("this session has no video (live stream); feed frames with session.track(frame)")
        check_direction(direction)
        n = self.num_frames
        if start_frame is None:
            start_frame = self.first_prompted_frame
        self._check_frame(start_frame, "start_frame")
        check_max_frames(max_frames)
        passes = []
        if direction in ("forward", "both"):
            stop = n if max_frames is None else min(n, start_frame + max_frames)
            passes.append((range(start_frame, stop), False))
        if direction in ("backward", "both"):
            first = start_frame if direction == "backward" else start_frame - 1
            stop = -1 if max_frames is None else max(-1, first - max_frames)
            passes.append((range(first, stop, -1), True))
        return self._propagate(passes, direction == "both", start_frame)

    def _propagate(self, passes, both: bool, start_frame: int) -> Iterator[FrameResult]:
        self._check_idle("propagate() was called again")
        self._free_click_features()
        token = object()
        self._running = token
        if both:  # the backward pass reads what the forward pass wrote next to start_frame
            cfg = self.config
            reach = max(cfg.num_maskmem, cfg.max_object_pointers_in_encoder)
            self.bank.pinned_frames |= set(range(start_frame, start_frame + reach))
        try:
            for order, reverse in passes:
                yield from self._propagate_pass(order, reverse)
        finally:
            if self._running is token:
                self._running = None
                self._held = []
                self.bank.pinned_frames.clear()

    def _propagate_pass(self, order: range, reverse: bool) -> Iterator[FrameResult]:
        # Held back for the hotstart rules, which only remove text-detected objects; the tracker alone
        # (clicks and boxes only) yields each frame at once, as the reference's tracker does.
        delay = self.config.hotstart_delay if self.prompts else 0
        h, w = self.source.height, self.source.width
        last = order[-1] if len(order) else None
        self._held = []
        for index in order:
            self._check_open()
            out = self._run_frame(index, self.frames.get(index), reverse, streaming=False, num_frames=self.num_frames)
            self._held.append(out)
            # objects removed now are hidden in the results still held back, as the reference does
            for earlier in self._held[:-1]:
                earlier.suppressed |= out.removed
            if index == last:
                ready, self._held = self._held, []
            elif len(self._held) >= max(delay, 1):  # the reference's rule (delay 0 or 1: no hold-back)
                ready, self._held = self._held[:1], self._held[1:]
            else:
                ready = []
            for item in ready:
                yield self._result(item, h, w)
                self._check_open()

    def run_frame(self, frame_index: int) -> FrameResult:
        """Track one frame now with every prompt and return its result, without hold-back (what the
        official predictor's add_prompt(text) returns). The state changes as in a propagate() over
        that one frame: objects can be born there."""
        self._check_open()
        self._check_idle("run_frame() was called")
        if self.source is None:
            raise VideoError("this session has no video (live stream); feed frames with session.track(frame)")
        self._check_frame(frame_index)
        out = self._run_frame(frame_index, self.frames.get(frame_index), reverse=False, streaming=False,
                              num_frames=self.num_frames)
        return self._result(out, self.source.height, self.source.width)

    def track(self, frame: np.ndarray) -> FrameResult:
        """Streaming: one RGB frame in, its result out, immediately.

        As in the reference's streaming mode, hotstart removals are off (no future frames to judge by),
        so objects the offline run would remove within `hotstart_delay` frames can appear here.
        New objects beyond what the pools hold (pool_objects) or max_num_objects are not made (one
        CapacityWarning per session); a frame that still raises CapacityError changes nothing.
        """
        self._check_open()
        self._check_idle("track() was called")
        if self.source is not None:
            raise VideoError("track() feeds a live stream; this session reads a video: use session.propagate()")
        frame, size = check_stream_frame(frame, self.stream_index, self._stream_size)
        index = self.stream_index
        out = self._run_frame(index, frame, reverse=False, streaming=True, num_frames=index + 1)
        # a frame that raised (CapacityError) changed nothing: the stream goes on from the same index
        self._stream_size = size
        self.stream_index += 1
        return self._result(out, *frame.shape[:2])

    # ------------------------------------------------------------------------------- objects
    @property
    def object_ids(self) -> list[int]:
        return self.objects.obj_ids

    def remove_object(self, obj_id: int) -> None:
        """Stop tracking an object; its id is never reused. Allowed between frames of a propagate()."""
        self._check_open()
        if object_id_argument(obj_id) not in self.objects:
            raise ObjectIdError(f"object {shown(obj_id)} is not tracked in this session "
                                f"(tracked: {self.objects.obj_ids})")
        self._forget_object(obj_id)
        for out in self._held:
            out.suppressed.add(obj_id)

    def _forget_object(self, obj_id: int) -> None:
        self.objects.drop(obj_id)
        self.bank.remove_object(obj_id)
        self.clicks.drop(obj_id)

    def reset(self) -> None:
        """Start over on the same video: forget every object, memory and prompt (text, clicks and
        boxes), as the official predictor's reset_session does."""
        self._check_open()
        self._check_idle("reset() was called")
        self.bank.clear()
        self.objects = ObjectRegistry()
        self.loop.objects = self.objects
        self.clicks.clear()
        self._free_click_features()
        self.text.clear()
        self.stream_index = 0
        self._stream_size = None

    def text_prompt_result(self, frame_index: int, text: str):
        """The official predictor's text add_prompt: start over, find `text` on `frame_index`, return that
        frame's result (the official request API's semantics, sam3track/compat.py)."""
        self.reset()
        self.add_prompt(frame_index=frame_index, text=text)
        return self.run_frame(frame_index)

    def memory_usage(self) -> dict[str, int]:
        return {"memory_rows": self.bank.memories.used, "pointer_rows": self.bank.pointers.used,
                "memory_capacity": self.bank.memories.capacity, "pointer_capacity": self.bank.pointers.capacity}


Session = Sam3Session  # the name before the families were split (sam3track.families.sam3.session.Session)
