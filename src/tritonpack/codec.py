"""KServe v2 inference bodies, built and parsed with tritonclient's own (de)serialisers, so they match Triton byte for
byte. Used by the client, the SageMaker payload helpers, the benchmarks and the tests.

Two body formats:
- JSON (`application/json`): tensors as JSON lists.
- binary: a JSON header followed by the raw tensor bytes. Triton's HTTP front-end reads the header's length from
  `Inference-Header-Content-Length`; its SageMaker front-end from the content type
  `application/vnd.sagemaker-triton.binary+json;json-header-size=N`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tritonpack.errors import PayloadError

JSON = "application/json"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
HEADER_SIZE = "json-header-size="
HEADER_LENGTH = "Inference-Header-Content-Length"
FORMATS = ("json", "binary")


@dataclass(frozen=True)
class Payload:
    body: bytes
    header_length: int | None = None  # binary format: length of the JSON header at the start of `body`

    @property
    def content_type(self) -> str:
        """As a SageMaker client sends it (InvokeEndpoint, the local MME)."""
        return JSON if self.header_length is None else f"{BINARY_JSON};{HEADER_SIZE}{self.header_length}"

    def triton_headers(self) -> dict[str, str]:
        """As a direct client of Triton's HTTP front-end sends it."""
        if self.header_length is None:
            return {"Content-Type": JSON}
        return {HEADER_LENGTH: str(self.header_length), "Content-Type": "application/octet-stream"}


def infer_inputs(arrays: Mapping[str, np.ndarray], binary: bool = True) -> list:
    """tritonclient HTTP inputs for named arrays (BYTES for object arrays)."""
    import tritonclient.http as http
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, array in arrays.items():
        tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    return tensors


def requested_outputs(names: Sequence[str], binary: bool = True, class_count: int = 0) -> list:
    import tritonclient.http as http

    return [http.InferRequestedOutput(name, binary_data=binary, class_count=class_count) for name in names]


def request_body(arrays: Mapping[str, np.ndarray], outputs: Sequence[str], fmt: str = "json",
                 class_count: int = 0, binary_outputs: bool | None = None) -> Payload:
    """A request body for named input arrays, asking for `outputs` (with top-`class_count` labels if > 0) in the
    body's format, or as JSON with `binary_outputs=False`."""
    import tritonclient.http as http

    if fmt not in FORMATS:
        raise PayloadError(f"unknown body format {fmt!r}; one of {', '.join(FORMATS)}")
    binary = fmt == "binary"
    if not binary:
        for name, array in arrays.items():
            if array.dtype == np.object_:
                _utf8_for_json(name, array)
    body, json_size = http.InferenceServerClient.generate_request_body(
        infer_inputs(arrays, binary),
        outputs=requested_outputs(outputs, binary if binary_outputs is None else binary_outputs, class_count))
    return Payload(body.encode() if isinstance(body, str) else bytes(body), json_size)


def _utf8_for_json(name: str, array: np.ndarray) -> None:
    """A JSON body carries BYTES elements as strings: each must be UTF-8 (binary bodies carry any bytes)."""
    for i, element in enumerate(array.ravel()):
        if isinstance(element, bytes):
            try:
                element.decode()
            except UnicodeDecodeError as e:
                raise PayloadError(f"{name} element {i + 1} is not UTF-8 ({e.reason} at byte {e.start}): a JSON body "
                                   f"carries BYTES as text; send it in the binary format") from None


def header_size(content_type: str | None) -> int | None:
    """N from `...binary+json;json-header-size=N`; None for plain JSON."""
    if not content_type or not content_type.startswith(BINARY_JSON):
        return None
    _, _, rest = content_type.partition(HEADER_SIZE)
    digits = rest.split(";")[0].strip()
    if not re.fullmatch(r"[0-9]{1,18}", digits):  # int() also takes "+9", "9_0" and other scripts' digits
        raise PayloadError(f"content type {content_type!r}: {HEADER_SIZE}N needs N in decimal digits")
    return int(digits)


def parse_response(body: bytes, content_type: str | None = None) -> dict[str, np.ndarray]:
    """Every output of a response body (either format) as a numpy array, by name."""
    import tritonclient.http as http

    size = header_size(content_type)
    try:
        result = http.InferenceServerClient.parse_response_body(body, header_length=size)
        response = result.get_response()
        if not isinstance(response, dict):
            raise TypeError(f"a JSON {type(response).__name__}, not an object")
        outputs = response.get("outputs", [])
        if not outputs and "error" in response:
            raise PayloadError(f"error response: {response['error']}")
        return {out["name"]: result.as_numpy(out["name"]) for out in outputs}
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # tritonclient's parsing trusts the body
        raise PayloadError(f"not a KServe v2 response body ({content_type}): {type(e).__name__}: {e}") from e


def output(body: bytes, content_type: str | None, name: str) -> np.ndarray:
    outputs = parse_response(body, content_type)
    if name not in outputs:
        raise PayloadError(f"response has no output {name!r}; it has {', '.join(outputs) or 'none'}")
    return outputs[name]


def error_message(body: bytes) -> str:
    """The reason inside an error body (Triton's `{"error": ...}` or SageMaker's `{"message": ...}`)."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return body.decode(errors="replace")[:500]
    if isinstance(data, dict):
        return str(data.get("error") or data.get("message") or data.get("Message") or data)
    return str(data)
