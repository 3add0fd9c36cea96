"""Request and response bodies for SageMaker Triton endpoints (InvokeEndpoint on a multi-model endpoint, real or
the local MME), in both formats the container accepts: JSON, and binary+json (smaller and faster for embeddings and
images). Bodies are made and read by `tritonpack.codec`; tensors follow `tritonpack.contracts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tritonpack import contracts
from tritonpack.codec import Payload, output, request_body
from tritonpack.errors import PayloadError


@dataclass(frozen=True)
class Label:
    """One entry of Triton's classification extension: `score:index[:label]`."""

    score: float
    index: int
    label: str

    @classmethod
    def parse(cls, entry: bytes | str) -> Label:
        # a label file the model's author wrote in another encoding still shows its scores and indexes
        text = entry.decode(errors="replace") if isinstance(entry, bytes) else str(entry)
        try:
            score, index, *label = text.split(":", 2)
            return cls(float(score), int(index), label[0] if label else "")
        except ValueError:
            raise PayloadError(f"classification entry {text[:80]!r} is not score:index[:label]") from None


def text_payload(texts: Sequence[str | bytes], fmt: str = "json", io: contracts.IoNames = contracts.TEXT) -> Payload:
    """Texts as a batch of the text contract's input, asking for its output."""
    return request_body({io.input: contracts.text_array(texts)}, [io.output], fmt)


def image_payload(images: Sequence[bytes], fmt: str = "json", io: contracts.IoNames = contracts.IMAGE,
                  class_count: int = 0) -> Payload:
    """Encoded images as a batch of the image contract's input (zero-padded rows)."""
    return request_body({io.input: contracts.image_array(images)}, [io.output], fmt, class_count=class_count)


def embeddings(body: bytes, content_type: str | None = None, name: str = contracts.TEXT.output) -> np.ndarray:
    """The `EMBEDDING` rows (float32, [n, hidden]) of a response."""
    return np.asarray(output(body, content_type, name), dtype=np.float32)


def scores(body: bytes, content_type: str | None = None, name: str = contracts.IMAGE.output) -> np.ndarray:
    return np.asarray(output(body, content_type, name), dtype=np.float32)


def labels(body: bytes, content_type: str | None = None, name: str = contracts.IMAGE.output) -> list[list[Label]]:
    """Top-k labels per image of a response to a request made with `class_count` > 0."""
    values = output(body, content_type, name)
    values = values.reshape(values.shape[0], -1) if values.ndim > 1 else values.reshape(1, -1)
    return [[Label.parse(entry) for entry in row] for row in values]


def invoke(payload: Payload, target: str, endpoint_name: str = "local", endpoint_url: str | None = None,
           client=None, region: str | None = None) -> tuple[bytes, str]:
    """InvokeEndpoint on a multi-model endpoint with boto3's sagemaker-runtime; (body, content type) back."""
    if client is None:
        import boto3

        session = boto3.session.Session()
        placeholders = {}
        if endpoint_url is not None and session.get_credentials() is None:
            # boto3 signs every request and refuses to without credentials; the local MME checks no signature
            placeholders = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
        client = session.client("sagemaker-runtime", endpoint_url=endpoint_url,
                                region_name=region or session.region_name or "us-east-1", **placeholders)
    response = client.invoke_endpoint(EndpointName=endpoint_name, TargetModel=target, Body=payload.body,
                                      ContentType=payload.content_type)
    return response["Body"].read(), response["ContentType"]


def embed_texts(texts: Sequence[str], target: str, fmt: str = "binary", io: contracts.IoNames = contracts.TEXT,
                **invoke_options) -> np.ndarray:
    """Texts → embedding rows from `target` on a (local or real) SageMaker multi-model endpoint."""
    body, content_type = invoke(text_payload(texts, fmt, io), target, **invoke_options)
    return embeddings(body, content_type, io.output)
