"""A tracking session: prompts, the frame source, object registry and memory bank for one video."""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np

from .errors import FrameIndexError, ObjectIdError, PromptError, SessionClosedError, VideoError
from .frame_loop import FrameLoop, FrameOutput
from .memory_bank import MemoryBank
from .objects import ObjectRegistry
from .postprocess import build_result, to_pixel_values
from .results import FrameResult


class FrameCache:
    """A few decoded frames; frames are read lazily from the source and evicted oldest first."""

    def __init__(self, source, size: int = 4):
        self.source, self.size = source, size
        self._frames: OrderedDict[int, np.ndarray] = OrderedDict()

    def get(self, index: int) -> np.ndarray:
        if index not in self._frames:
            self._frames[index] = self.source.read(index)
            while len(self._frames) > self.size:
                self._frames.popitem(last=False)
        return self._frames[index]

    def clear(self) -> None:
        self._frames.clear()


class Session:
    def __init__(self, predictor, source=None):
        self.predictor = predictor
        self.config = predictor.config
        self.backend = predictor.backend
        self.source = source  # a FrameSource, or None for a live stream
        # Results are held back hotstart_delay frames; the cache keeps the frames of results not yet
        # yielded, so a caller that draws on them (the CLI) never decodes a frame twice.
        cache_size = max(4, predictor.config.hotstart_delay + 2)
        self.frames = FrameCache(source, cache_size) if source is not None else None
        self.prompts: list[str] = []
        self._text_pool = None  # device [M, T, D]: each prompt encoded once per session
        self._text_mask = np.zeros((0, self.config.text_length), np.int64)
        self._text_mask_device = None
        self.closed = False
        self._new_state()

    def _new_state(self) -> None:
        self.objects = ObjectRegistry()
        self.bank = MemoryBank(self.backend, self.config)
        self.loop = FrameLoop(self.backend, self.predictor.graphs, self.config, self.bank, self.objects)
        self.stream_index = 0
        self._stream_size: tuple[int, int] | None = None

    # ----------------------------------------------------------------------------- lifecycle
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.bank.clear()
        self._text_pool = self._text_mask_device = None
        if self.frames is not None:
            self.frames.clear()
        if self.source is not None and getattr(self, "_owns_source", False):
            self.source.close()

    def _check_open(self) -> None:
        if self.closed:
            raise SessionClosedError("this session is closed; start a new one with predictor.start_session()")
        if self.predictor.closed:
            raise SessionClosedError("the predictor of this session was closed; load the bundle again")

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
    def add_prompt(self, frame_index: int = 0, text: str | None = None, points=None, boxes=None) -> int:
        """Add a text prompt (detected on every frame, as in the reference); returns its prompt index."""
        self._check_open()
        if points is not None or boxes is not None:
            raise PromptError("point and box prompts are not supported yet; give text=")
        if self.source is not None:
            self._check_frame(frame_index)
        if text is None:
            raise PromptError("add_prompt needs text=, e.g. session.add_prompt(frame_index=0, text='person')")
        text = text.strip() if isinstance(text, str) else text
        if text in self.prompts:
            return self.prompts.index(text)
        ids, mask = self.predictor.tokenizer(text)
        b = self.backend
        features = b.run(self.predictor.graphs["text_encoder"], {"input_ids": b.upload(ids),
                                                                 "attention_mask": b.upload(mask)})["text_features"]
        m = len(self.prompts)
        pool = b.empty((m + 1,) + tuple(features.shape[1:]), features.dtype)
        if m:
            b.copy(self._text_pool, b.rows(pool, 0, m))  # device to device
        b.copy(features, b.rows(pool, m, 1))
        self._text_pool = pool
        self._text_mask = np.concatenate([self._text_mask, mask])
        self._text_mask_device = b.upload(self._text_mask)
        self.prompts.append(text)
        return m

    # ---------------------------------------------------------------------------------- frames
    def _check_frame(self, index: int) -> None:
        n = self.num_frames
        if not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise FrameIndexError(f"frame index {index} is out of range: the video has {n} frames (0..{n - 1})")

    def _run_frame(self, index: int, rgb: np.ndarray, reverse: bool, streaming: bool, num_frames) -> FrameOutput:
        if not self.prompts:
            raise PromptError("no prompt in this session; call session.add_prompt(text=...) first")
        features = self.loop.encode_frame(to_pixel_values(rgb, self.config))
        det = self.loop.detect(features, self._text_pool, self._text_mask_device, len(self.prompts))
        out = self.loop.step(features, det, index, reverse, streaming, num_frames)
        self.bank.evict(index, reverse)
        return out

    def _result(self, out: FrameOutput, height: int, width: int) -> FrameResult:
        return build_result(out, self.objects, self.prompts, height, width)

    def propagate(self, direction: str = "forward", start_frame: int | None = None,
                  max_frames: int | None = None) -> Iterator[FrameResult]:
        """Track through the video, yielding one FrameResult per frame in processing order.

        Outputs are held back `hotstart_delay` frames (as the reference does) so that objects removed by
        the hotstart heuristics are never shown. "backward" runs from start_frame down to 0, "both" runs
        forward then backward from start_frame - 1 on the same state.
        """
        self._check_open()
        if self.source is None:
            raise VideoError("this session has no video (live stream); feed frames with session.track(frame)")
        if direction not in ("forward", "backward", "both"):
            raise ValueError(f"direction must be 'forward', 'backward' or 'both', not {direction!r}")
        n = self.num_frames
        if start_frame is None:
            start_frame = 0 if direction != "backward" else n - 1
        self._check_frame(start_frame)
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, not {max_frames}")
        passes = []
        if direction in ("forward", "both"):
            stop = n if max_frames is None else min(n, start_frame + max_frames)
            passes.append((range(start_frame, stop), False))
        if direction in ("backward", "both"):
            first = start_frame if direction == "backward" else start_frame - 1
            stop = -1 if max_frames is None else max(-1, first - max_frames)
            passes.append((range(first, stop, -1), True))
        if direction == "both":
            cfg = self.config
            reach = max(cfg.num_maskmem, cfg.max_object_pointers_in_encoder)
            self.bank.pinned_frames |= set(range(start_frame, start_frame + reach))
            self.bank.keep_conditioning = True
        try:
            for order, reverse in passes:
                yield from self._propagate_pass(order, reverse)
        finally:
            self.bank.pinned_frames.clear()
            self.bank.keep_conditioning = False

    def _propagate_pass(self, order: range, reverse: bool) -> Iterator[FrameResult]:
        delay = self.config.hotstart_delay
        buffer: list[FrameOutput] = []
        h, w = self.source.height, self.source.width
        last = order[-1] if len(order) else None
        for index in order:
            out = self._run_frame(index, self.frames.get(index), reverse, streaming=False, num_frames=self.num_frames)
            self.objects.hidden |= out.removed
            if delay <= 0:
                yield self._result(out, h, w)
                continue
            buffer.append(out)
            if index == last:
                ready, buffer = buffer, []
            elif len(buffer) >= delay:
                ready, buffer = buffer[:1], buffer[1:]
            else:
                ready = []
            for item in ready:
                yield self._result(item, h, w)

    def track(self, frame: np.ndarray) -> FrameResult:
        """Streaming: one RGB frame in, its result out, immediately.

        As in the reference's streaming mode, hotstart removals are off (no future frames to judge by),
        so objects the offline run would remove within `hotstart_delay` frames can appear here.
        """
        self._check_open()
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise VideoError(f"track() takes one RGB uint8 frame of shape (H, W, 3); got {frame.dtype} {frame.shape}")
        if self._stream_size is None:
            self._stream_size = frame.shape[:2]
        elif frame.shape[:2] != self._stream_size:
            raise VideoError(f"frame {self.stream_index} is {frame.shape[1]}x{frame.shape[0]}, but the stream started "
                             f"at {self._stream_size[1]}x{self._stream_size[0]}; start a new session for a new size")
        index = self.stream_index
        out = self._run_frame(index, frame, reverse=False, streaming=True, num_frames=index + 1)
        self.stream_index += 1
        self.objects.hidden |= out.removed
        return self._result(out, *frame.shape[:2])

    # ------------------------------------------------------------------------------- objects
    @property
    def object_ids(self) -> list[int]:
        return list(self.objects.obj_ids)

    def remove_object(self, obj_id: int) -> None:
        self._check_open()
        if obj_id not in self.objects.obj_ids:
            raise ObjectIdError(f"object {obj_id} is not tracked in this session (tracked: {self.objects.obj_ids})")
        self.objects.forget(obj_id)
        self.bank.remove_object(obj_id)

    def reset(self) -> None:
        """Forget every object and memory; prompts and the video stay."""
        self._check_open()
        self.bank.clear()
        self._new_state()

    def memory_usage(self) -> dict[str, int]:
        return {"memory_rows": self.bank.memories.used, "pointer_rows": self.bank.pointers.used,
                "memory_capacity": self.bank.memories.capacity, "pointer_capacity": self.bank.pointers.capacity}
