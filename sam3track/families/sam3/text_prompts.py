"""A session's text prompts: each encoded once, kept on the device in the layout the grounding head reads."""

from __future__ import annotations

import numpy as np

from ...backends import DeviceTensor
from ...call_sizes import chunks, fixed_size, pad_rows


class TextPrompts:
    """The prompts in order (prompt k is index k everywhere), the frame each was given on, and their
    features in one device pool [rows, T, D] laid out for the grounding head's planned calls, with the
    attention masks on the host row for row."""

    def __init__(self, backend, graphs, tokenizer, text_length: int):
        self.backend, self.graphs, self.tokenizer = backend, graphs, tokenizer
        self.text_length = text_length
        self.texts: list[str] = []
        self.frames: list[int] = []  # the frame each prompt was given on (propagate starts there)
        self.pool: DeviceTensor | None = None
        self.mask = np.zeros((0, text_length), np.int32)

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, text: str, frame: int) -> int:
        """The prompt's index; a prompt given again keeps its index and its earliest frame."""
        if text in self.texts:
            k = self.texts.index(text)
            self.frames[k] = min(self.frames[k], frame)
            return k
        features, mask = self._encode(text)
        self._append(features, mask)
        self.backend.free(features)
        self.texts.append(text)
        self.frames.append(frame)
        return len(self.texts) - 1

    def remove(self, k: int) -> None:
        """Drop prompt k; the later ones move down one index (encoded again into a fresh pool)."""
        kept = [(t, f) for i, (t, f) in enumerate(zip(self.texts, self.frames)) if i != k]
        self.clear()
        for text, frame in kept:
            self.add(text, frame)

    def clear(self) -> None:
        if self.pool is not None and not self.backend.closed:
            self.backend.free(self.pool)
        self.pool = None
        self.mask = np.zeros((0, self.text_length), np.int32)
        self.texts, self.frames = [], []

    def _encode(self, text: str) -> tuple[DeviceTensor, np.ndarray]:
        """One prompt's text features [1, T, D] on the device and its attention mask [1, T]."""
        b, graph = self.backend, self.graphs["text_encoder"]
        ids, mask = self.tokenizer(text)
        size = fixed_size(b, graph, "prompts", 1, f"prompt {text!r}", "convert the bundle with --gears prompts=1,...")
        out = b.run(graph, {"input_ids": pad_rows(ids, size), "attention_mask": pad_rows(mask, size)})
        return b.rows(out["text_features"], 0, 1), mask

    def _append(self, features: DeviceTensor, mask: np.ndarray) -> None:
        """Add one prompt to the pool. Prompt k sits at row k in any layout `chunks` gives (every chunk
        but the last is full); the last chunk's padding rows copy its first prompt. Copies stay on the
        device."""
        b, graph = self.backend, self.graphs["grounding_head"]
        m = len(self.texts)  # the new prompt's index
        last = chunks(b, graph, "prompts", m + 1)[-1]
        rows = last.start + last.size
        pool = b.empty((rows,) + tuple(features.shape[1:]), features.dtype)
        masks = np.zeros((rows, mask.shape[1]), np.int32)
        if m:
            b.copy(b.rows(self.pool, 0, m), b.rows(pool, 0, m))
            masks[:m] = self.mask[:m]
            b.free(self.pool)
        b.copy(features, b.rows(pool, m, 1))
        masks[m] = mask[0]
        for row in range(m + 1, rows):
            b.copy(b.rows(pool, last.start, 1), b.rows(pool, row, 1))
            masks[row] = masks[last.start]
        self.pool, self.mask = pool, masks
