"""The ensembles' public tensors, defined once: what a client sends and what it gets back.

Text ensembles take `TEXT` (TYPE_STRING, dims [1], one text per batch row) and return `EMBEDDING` (TYPE_FP32,
[hidden]); image ensembles take `IMAGE` (TYPE_UINT8, dims [-1]: one encoded JPEG/PNG/BMP per row, zero-padded to
the longest) and return `SCORES` (TYPE_FP32, [classes]) with a label file. A build may rename the two public tensors
(`--io-names INPUT0:OUTPUT0`) so that existing client code keeps working; the dtypes and dims never change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tritonpack.errors import PayloadError, SpecError
from tritonpack.spec import Tensor

NOTEBOOK_TEXT_NAMES = "INPUT0:OUTPUT0"  # the AWS notebooks' text client's names, the usual --io-names
# Triton's refusal of a request naming a tensor its model does not have
UNEXPECTED_TENSOR = re.compile(r"unexpected inference (input|output) '([^']*)'")


@dataclass(frozen=True)
class IoNames:
    """The public input and output tensor names of an ensemble."""

    input: str
    output: str

    def __post_init__(self) -> None:
        for name in (self.input, self.output):
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                raise SpecError(f"tensor name {name!r}: use letters, digits, '_' or '-'")
        if self.input == self.output:
            raise SpecError(f"input and output are both named {self.input!r}")

    def __str__(self) -> str:
        return f"{self.input}:{self.output}"

    @classmethod
    def parse(cls, text: str) -> IoNames:
        """`INPUT0:OUTPUT0` → IoNames("INPUT0", "OUTPUT0")."""
        name_in, sep, name_out = str(text).partition(":")
        if not sep:
            raise SpecError(f"--io-names {text!r}: expected INPUT:OUTPUT, e.g. {NOTEBOOK_TEXT_NAMES}")
        return cls(name_in.strip(), name_out.strip())

    def renamed_hint(self, reason: str) -> str | None:
        """What to pass where Triton's `reason` refused a request because the model has no tensor of these names
        (a tarball built with `--io-names`, invoked through an MME, whose API has no metadata to read them from as
        `infer --url` does); None for any other reason."""
        match = UNEXPECTED_TENSOR.search(reason)
        if match is None or match[2] not in (self.input, self.output):
            return None
        return (f"the model has no {match[1]} {match[2]!r}: it was built with other names (--io-names): pass them "
                f"as --io-names INPUT:OUTPUT, e.g. --io-names {NOTEBOOK_TEXT_NAMES}")


TEXT = IoNames("TEXT", "EMBEDDING")
IMAGE = IoNames("IMAGE", "SCORES")


def text_input(name: str = TEXT.input) -> Tensor:
    return Tensor(name, "TYPE_STRING", (1,))


def embedding_output(hidden: int, name: str = TEXT.output) -> Tensor:
    return Tensor(name, "TYPE_FP32", (hidden,))


def image_input(name: str = IMAGE.input) -> Tensor:
    return Tensor(name, "TYPE_UINT8", (-1,))


def scores_output(classes: int, name: str = IMAGE.output) -> Tensor:
    return Tensor(name, "TYPE_FP32", (classes,))


def text_array(texts: Sequence[str | bytes]) -> np.ndarray:
    """Texts as a `TEXT` batch: BYTES elements shaped [n, 1]."""
    if not texts:
        raise PayloadError("no texts given")
    rows = []
    for i, text in enumerate(texts):
        try:  # bytes go as they are (a client may mean to send any); a str must encode
            rows.append([text.encode() if isinstance(text, str) else bytes(text)])
        except UnicodeError as e:  # a str Python made from undecodable bytes (a surrogate: a Latin-1 argument)
            raise PayloadError(f"text {i + 1} is not UTF-8 ({e.reason} at position {e.start}): TEXT carries UTF-8 "
                               f"text") from None
    return np.array(rows, dtype=np.object_)


def image_array(images: Sequence[bytes]) -> np.ndarray:
    """Encoded images as an `IMAGE` batch: UINT8 [n, longest]. A tensor must be rectangular, so shorter images are
    padded with zero bytes after their end; JPEG and PNG decoders stop at their end marker and ignore them."""
    if not images:
        raise PayloadError("no images given")
    batch = np.zeros((len(images), max(len(image) for image in images)), dtype=np.uint8)
    for row, image in zip(batch, images):
        row[:len(image)] = np.frombuffer(bytes(image), dtype=np.uint8)
    return batch
