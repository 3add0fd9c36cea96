"""Request and response bodies for SageMaker Triton endpoints, in both formats the container accepts.

- JSON: the KServe v2 inference protocol as JSON (`application/json`).
- binary+json: a KServe v2 JSON header followed by the raw tensor bytes, with the header length in the content
  type (`application/vnd.sagemaker-triton.binary+json;json-header-size=N`). Smaller and faster for
  embeddings and images; this is what the SageMaker Triton front-end expects for binary tensors.

Bodies are built and parsed with tritonclient's own (de)serialisers, so they match Triton byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tritonpack.errors import PayloadError

JSON = "application/json"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
HEADER_SIZE = "json-header-size="
FORMATS = ("json", "binary")


@dataclass(frozen=True)
class Payload:
    body: bytes
    content_type: str

    @property
    def header_size(self) -> int | None:
        return header_size(self.content_type)


@dataclass(frozen=True)
class Label:
    """One entry of Triton's classification extension: `score:index[:label]`."""

    score: float
    index: int
    label: str

    @classmethod
    def parse(cls, entry: bytes | str) -> Label:
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        score, index, *label = text.split(":", 2)
        return cls(float(score), int(index), label[0] if label else "")


def header_size(content_type: str | None) -> int | None:
    """N from `...binary+json;json-header-size=N`; None for plain JSON."""
    if not content_type or not content_type.startswith(BINARY_JSON):
        return None
    _, _, rest = content_type.partition(HEADER_SIZE)
    try:
        return int(rest.split(";")[0].strip())
    except ValueError as e:
        raise PayloadError(f"content type {content_type!r}: {HEADER_SIZE}N needs an integer N") from e


def _check_format(fmt: str) -> bool:
    if fmt not in FORMATS:
        raise PayloadError(f"unknown body format {fmt!r}; one of {', '.join(FORMATS)}")
    return fmt == "binary"


def build_payload(inputs: dict[str, np.ndarray], outputs: Sequence[str], fmt: str = "json",
                  class_count: int = 0) -> Payload:
    """A request body for named input arrays, asking for `outputs` (with top-`class_count` labels if > 0)."""
    import tritonclient.http as http
    from tritonclient.utils import np_to_triton_dtype

    binary = _check_format(fmt)
    tensors = []
    for name, array in inputs.items():
        tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    requested = [http.InferRequestedOutput(name, binary_data=binary, class_count=class_count) for name in outputs]
    body, json_size = http.InferenceServerClient.generate_request_body(tensors, outputs=requested)
    body = body.encode() if isinstance(body, str) else bytes(body)
    if json_size is None:
        return Payload(body, JSON)
    return Payload(body, f"{BINARY_JSON};{HEADER_SIZE}{json_size}")


def text_payload(texts: Sequence[str | bytes], fmt: str = "json", input_name: str = "TEXT",
                 output_name: str = "EMBEDDING") -> Payload:
    """Texts as a batch of `TEXT` (BYTES, shape [n, 1]) asking for `EMBEDDING`."""
    if not texts:
        raise PayloadError("no texts given")
    values = np.array([[t.encode() if isinstance(t, str) else bytes(t)] for t in texts], dtype=np.object_)
    return build_payload({input_name: values}, [output_name], fmt)


def image_payload(images: Sequence[bytes], fmt: str = "json", input_name: str = "IMAGE",
                  output_name: str = "SCORES", class_count: int = 0) -> Payload:
    """Encoded images as a batch of `IMAGE` (UINT8, shape [n, longest]).

    A tensor must be rectangular, so shorter images are padded with zero bytes after their end, as DALI's own
    examples do; JPEG and PNG decoders stop at the end-of-image marker and ignore them.
    """
    if not images:
        raise PayloadError("no images given")
    longest = max(len(image) for image in images)
    batch = np.zeros((len(images), longest), dtype=np.uint8)
    for row, image in enumerate(images):
        batch[row, : len(image)] = np.frombuffer(bytes(image), dtype=np.uint8)
    return build_payload({input_name: batch}, [output_name], fmt, class_count=class_count)


def parse_response(body: bytes, content_type: str | None = None) -> dict[str, np.ndarray]:
    """Every output of a response body (either format) as a numpy array, by name."""
    import tritonclient.http as http

    size = header_size(content_type)
    try:
        result = http.InferenceServerClient.parse_response_body(body, header_length=size)
    except (ValueError, UnicodeDecodeError) as e:
        raise PayloadError(f"not a KServe v2 response body ({content_type}): {e}") from e
    outputs = result.get_response().get("outputs", [])
    if not outputs and "error" in result.get_response():
        raise PayloadError(f"error response: {result.get_response()['error']}")
    return {out["name"]: result.as_numpy(out["name"]) for out in outputs}


def output(body: bytes, content_type: str | None, name: str) -> np.ndarray:
    outputs = parse_response(body, content_type)
    if name not in outputs:
        raise PayloadError(f"response has no output {name!r}; it has {', '.join(outputs) or 'none'}")
    return outputs[name]


def embeddings(body: bytes, content_type: str | None = None, name: str = "EMBEDDING") -> np.ndarray:
    """The `EMBEDDING` rows (float32, [n, hidden]) of a response."""
    return np.asarray(output(body, content_type, name), dtype=np.float32)


def scores(body: bytes, content_type: str | None = None, name: str = "SCORES") -> np.ndarray:
    return np.asarray(output(body, content_type, name), dtype=np.float32)


def labels(body: bytes, content_type: str | None = None, name: str = "SCORES") -> list[list[Label]]:
    """Top-k labels per image of a response to a request made with `class_count` > 0."""
    values = output(body, content_type, name)
    values = values.reshape(values.shape[0], -1) if values.ndim > 1 else values.reshape(1, -1)
    return [[Label.parse(entry) for entry in row] for row in values]


def error_message(body: bytes) -> str:
    """The reason inside an error body (Triton's `{"error": ...}` or SageMaker's `{"message": ...}`)."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return body.decode(errors="replace")[:500]
    if isinstance(data, dict):
        return str(data.get("error") or data.get("message") or data.get("Message") or data)
    return str(data)


def invoke(payload: Payload, target: str, endpoint_name: str = "local", endpoint_url: str | None = None,
           client=None, region: str | None = None) -> tuple[bytes, str]:
    """InvokeEndpoint on a multi-model endpoint with boto3's sagemaker-runtime; (body, content type) back."""
    if client is None:
        import boto3

        client = boto3.client("sagemaker-runtime", endpoint_url=endpoint_url,
                              region_name=region or boto3.session.Session().region_name or "us-east-1")
    response = client.invoke_endpoint(EndpointName=endpoint_name, TargetModel=target, Body=payload.body,
                                      ContentType=payload.content_type)
    return response["Body"].read(), response["ContentType"]


def embed_texts(texts: Sequence[str], target: str, fmt: str = "binary", **invoke_options) -> np.ndarray:
    """Texts → EMBEDDING rows from `target` on a (local or real) SageMaker multi-model endpoint."""
    body, content_type = invoke(text_payload(texts, fmt), target, **invoke_options)
    return embeddings(body, content_type)
