"""Text → BERT-family token tensors with the `tokenizers` library (no transformers or torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from batched_requests import ClientError, read_input
from tokenizers import Tokenizer


def decode_texts(array: np.ndarray, max_text_bytes: int, max_batch: int | None = None) -> list[str]:
    """A TYPE_STRING tensor [batch, 1] of bytes → str, rejecting bytes that are not UTF-8 or too long.

    Limits are checked before any decoding or tokenizing: the element count first, then each element's size.
    """
    if array.size == 0:
        raise ClientError("TEXT has no elements")
    if max_batch is not None and array.size > max_batch:
        raise ClientError(f"TEXT has {array.size} elements, more than the limit of {max_batch}")
    texts = []
    for value in array.reshape(-1):
        raw = value if isinstance(value, bytes) else str(value).encode()
        if len(raw) > max_text_bytes:
            raise ClientError(f"TEXT element of {len(raw)} bytes exceeds the limit of {max_text_bytes}")
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ClientError(f"TEXT is not valid UTF-8 (byte {e.start})") from None
    return texts


@dataclass(frozen=True)
class TextInput:
    """How a step reads its TEXT input: the tensor's name and the limits its config sets (`max_batch_size`, the
    `max_text_bytes` parameter)."""

    name: str
    max_text_bytes: int
    max_batch: int

    @classmethod
    def from_config(cls, config: dict, params: dict[str, str]) -> TextInput:
        return cls(config["input"][0]["name"], int(params["max_text_bytes"]), int(config["max_batch_size"]))

    def read(self, pb_utils, request) -> list[str]:
        """The request's texts, or ClientError naming what is wrong with them."""
        return decode_texts(read_input(pb_utils, request, self.name), self.max_text_bytes, self.max_batch)


# A long text is tokenized from its start: characters per kept token that a start is given before the whole text is
# (a 64 KB text took ~45 ms to tokenize for the 256 tokens kept; its first 4,096 characters ~2 ms)
START_CHARS_PER_TOKEN = 16


class TextTokenizer:
    """Truncates at `max_length` and pads to the longest text of each call, as sentence-transformers does."""

    def __init__(self, tokenizer_file: str, max_length: int, pad_token: str, with_token_type_ids: bool):
        self.tokenizer = Tokenizer.from_file(tokenizer_file)
        pad_id = self.tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"pad token {pad_token!r} is not in the vocabulary of {tokenizer_file}")
        self.tokenizer.enable_truncation(max_length=max_length)
        self.start_chars = max_length * START_CHARS_PER_TOKEN
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        self.with_token_type_ids = with_token_type_ids

    @classmethod
    def from_parameters(cls, tokenizer_file: str, params: dict[str, str], with_token_type_ids: bool) -> TextTokenizer:
        """From the config parameters the build renders for the code that tokenizes (`max_sequence_length`,
        `pad_token`)."""
        return cls(tokenizer_file, max_length=int(params["max_sequence_length"]), pad_token=params["pad_token"],
                   with_token_type_ids=with_token_type_ids)

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        starts = [self._start(text) for text in texts]
        encodings = self.tokenizer.encode_batch(starts)
        if any(start is not text and not e.overflowing for start, text, e in zip(starts, texts, encodings)):
            # a start that did not fill max_length (long whitespace, characters the normaliser drops): whole texts
            encodings = self.tokenizer.encode_batch([start if e.overflowing else text
                                                     for start, text, e in zip(starts, texts, encodings)])
        tensors = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        if self.with_token_type_ids:
            tensors["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        return tensors

    def _start(self, text: str) -> str:
        """A long text up to a space past `start_chars` (`max_length * START_CHARS_PER_TOKEN`) characters, else the
        text itself. Cut at a space, the start's tokens are the whole text's first ones: where the start alone
        overflows `max_length`, both truncate to the same tokens."""
        cut = text.rfind(" ", self.start_chars // 2, self.start_chars) if len(text) > self.start_chars else -1
        return text[:cut] if cut > 0 else text

    def per_request(self, texts_per_request: list[list[str]]) -> list[dict[str, np.ndarray]]:
        """Tokenize all requests in one call, then give each request its rows trimmed to its own longest."""
        tensors = self([t for texts in texts_per_request for t in texts])
        mask = tensors["attention_mask"]
        results, start = [], 0
        for texts in texts_per_request:
            rows = slice(start, start + len(texts))
            length = max(int(mask[rows].sum(axis=1).max(initial=0)), 1)
            results.append({name: t[rows, :length] for name, t in tensors.items()})
            start += len(texts)
        return results
