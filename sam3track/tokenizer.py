"""Prompt text -> token ids and attention mask, padded like the reference processor (max_length 32)."""

from __future__ import annotations

import numpy as np

from .errors import PromptError, shown


class PromptTokenizer:
    def __init__(self, tokenizer_file, length: int, pad_id: int):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self._tok.no_padding()
        self._tok.no_truncation()
        self.length = length
        self.pad_id = pad_id

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"prompt {shown(text)} is empty; give a noun phrase such as 'person' or 'red car'")
        ids = self._tok.encode(text).ids
        if len(ids) > self.length:
            raise PromptError(f"prompt {shown(text)} is {len(ids)} tokens long; the text encoder takes at most "
                              f"{self.length}: shorten it")
        input_ids = np.full((1, self.length), self.pad_id, np.int32)
        mask = np.zeros((1, self.length), np.int32)
        input_ids[0, : len(ids)] = ids
        mask[0, : len(ids)] = 1
        return input_ids, mask
