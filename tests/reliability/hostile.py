"""Hostile KServe v2 requests, crafted byte by byte, for the reliability suites and the soak.

Each `HostileCase` carries the raw body and headers plus what tritonserver 2.51 answers to a direct client
(`direct`): "4xx" where Triton or project code refuses it with a client error, "5xx" where Triton's HTTP
front-end answers 500 before any project code runs, "2xx" where 2.51 wrongly accepts it. A gateway in front
of Triton (the local MME) must answer every case with 4xx (see `tritonpack.mme.request_guard`).
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonpack import contracts
from tritonpack.codec import HEADER_LENGTH, Payload, request_body

BOMB_SIDE = 20000
# what Triton 2.51's log shows when its python backend aborts because a stub died holding the lock of the queue they
# share (rare: the killed-stub tests allow for it)
STUB_LOCK_ABORT = "boost::interprocess::lock_exception"


@dataclass(frozen=True)
class RawRequest:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def header_length(self) -> str | None:
        return self.headers.get(HEADER_LENGTH)


@dataclass(frozen=True)
class HostileCase:
    name: str
    made: RawRequest | Callable[[], RawRequest]  # a factory for payloads that are slow to make (bombs)
    direct: str = "4xx"  # what tritonserver 2.51 answers a direct HTTP client: 4xx | 5xx | 2xx

    @functools.cached_property
    def request(self) -> RawRequest:
        return self.made if isinstance(self.made, RawRequest) else self.made()


def json_request(inputs: list[dict], outputs: list[dict] | None = None) -> RawRequest:
    body = {"inputs": inputs} | ({"outputs": outputs} if outputs else {})
    return RawRequest(json.dumps(body).encode(), {"Content-Type": "application/json"})


def binary_request(tensors: list[tuple[str, str, list[int], bytes]], header_length: int | None = None) -> RawRequest:
    """KServe binary extension: JSON header, then each tensor's raw bytes; `header_length` overrides the header."""
    inputs = [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(raw)}}
              for n, d, s, raw in tensors]
    header = json.dumps({"inputs": inputs}).encode()
    length = len(header) if header_length is None else header_length
    return RawRequest(header + b"".join(raw for *_, raw in tensors),
                      {HEADER_LENGTH: str(length), "Content-Type": "application/octet-stream"})


def bytes_elements(values: list[bytes]) -> bytes:
    """BYTES tensor wire format: each element as a 4-byte little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def valid_request(payload: Payload) -> RawRequest:
    """A well-formed request as a direct Triton client sends it (the codec's body and headers)."""
    return RawRequest(payload.body, payload.triton_headers())


def text_request(texts: list[str | bytes], io: contracts.IoNames = contracts.TEXT) -> RawRequest:
    """Binary inputs, the output asked for as JSON (what the reliability suites read back)."""
    return valid_request(request_body({io.input: contracts.text_array(texts)}, [io.output], "binary",
                                      binary_outputs=False))


def image_request(image: bytes, io: contracts.IoNames = contracts.IMAGE) -> RawRequest:
    return valid_request(request_body({io.input: contracts.image_array([image])}, [io.output], "binary",
                                      binary_outputs=False))


def structural_cases(input_name: str, datatype: str, valid_shape: list[int], valid_data: list) -> list[HostileCase]:
    """Cases Triton itself judges from the request: names, dtypes, ranks, counts and malformed bodies."""
    one = {"name": input_name, "shape": valid_shape, "datatype": datatype, "data": valid_data}
    wrong_dtype = "FP32" if datatype != "FP32" else "INT64"
    # Triton 2.51 checks JSON data against the shape for BYTES with 400, for numeric types in its parser (500);
    # an empty body reaches the model as an empty tensor (BYTES: one empty string, answered 200)
    numeric = datatype != "BYTES"
    return [
        HostileCase("wrong_dtype", json_request([one | {"datatype": wrong_dtype, "data": [1] * len(valid_data)}])),
        HostileCase("wrong_input_name", json_request([one | {"name": input_name + "_X"}])),
        HostileCase("missing_input", json_request([])),
        HostileCase("wrong_rank_low", json_request([one | {"shape": valid_shape[1:]}])),
        HostileCase("wrong_rank_high", json_request([one | {"shape": valid_shape + [1]}])),
        HostileCase("shape_data_disagree", json_request([one | {"shape": [3] + valid_shape[1:]}]),
                    "5xx" if numeric else "4xx"),
        HostileCase("unknown_datatype", json_request([one | {"datatype": "NOPE"}])),
        HostileCase("unknown_output", json_request([one], [{"name": "NOPE"}])),
        HostileCase("header_length_beyond_body", _with_header(json_request([one]), lambda n: n + 100)),
        HostileCase("not_json", RawRequest(b"this is not json", {"Content-Type": "application/json"}), "5xx"),
        HostileCase("truncated_json", RawRequest(json_request([one]).body[:25]), "5xx"),
        HostileCase("json_array", RawRequest(b"[1, 2, 3]"), "5xx"),
        HostileCase("json_without_inputs", RawRequest(b'{"foo": 1}'), "5xx"),
        HostileCase("negative_dim", json_request([one | {"shape": [-1] + valid_shape[1:]}]), "5xx"),
        HostileCase("header_length_short", _with_header(json_request([one]), lambda n: 5), "5xx"),
        HostileCase("empty_body", RawRequest(b""), "4xx" if numeric else "2xx"),
        HostileCase("dim_wraps_at_2_32", json_request([one | {"shape": [2**32] + valid_shape[1:]}]),
                    "5xx" if numeric else "2xx"),
    ]


def sagemaker_form(request: RawRequest) -> RawRequest:
    """The same request as a SageMaker client sends it (InvokeEndpoint, local MME): the JSON header length of a
    binary body goes in the content type (`application/vnd.sagemaker-triton.binary+json;json-header-size=N`) —
    Triton's SageMaker front-end reads no `Inference-Header-Content-Length`. Bodies are unchanged."""
    length = request.header_length
    if length is None:
        return request
    headers = {k: v for k, v in request.headers.items() if k not in (HEADER_LENGTH, "Content-Type")}
    headers["Content-Type"] = Payload(request.body, int(length)).content_type
    return RawRequest(request.body, headers)


def _with_header(request: RawRequest, length) -> RawRequest:
    return RawRequest(request.body, request.headers | {HEADER_LENGTH: str(length(len(request.body)))})


def text_cases(max_text_bytes: int = 65536, max_batch: int = 64,
               io: contracts.IoNames = contracts.TEXT) -> list[HostileCase]:
    input_name = io.input
    invalid = bytes_elements([b"\xff\xfe\xfa"])
    return structural_cases(input_name, "BYTES", [1, 1], ["hello"]) + [
        HostileCase("empty_batch", json_request([{"name": input_name, "shape": [0, 1], "datatype": "BYTES",
                                                  "data": []}])),
        HostileCase("invalid_utf8", binary_request([(input_name, "BYTES", [1, 1], invalid)])),
        HostileCase("text_over_limit", text_request(["x" * (max_text_bytes + 1)], io)),
        HostileCase("text_1mb", text_request(["x" * 1_000_000], io)),
        HostileCase("batch_over_max", text_request(["a"] * (max_batch + 1), io)),
        HostileCase("batch_100k", text_request(["a"] * 100_000, io)),
        HostileCase("truncated_binary", _truncate(binary_request([(input_name, "BYTES", [1, 1], invalid)]), 2)),
        HostileCase("bytes_length_overrun", binary_request([(input_name, "BYTES", [1, 1],
                                                             struct.pack("<I", 1000) + b"abc")])),
        HostileCase("binary_fewer_elements", binary_request([(input_name, "BYTES", [2, 1], bytes_elements([b"a"]))])),
    ]


def image_cases(valid_jpeg: bytes, io: contracts.IoNames = contracts.IMAGE) -> list[HostileCase]:
    input_name = io.input
    payloads = {
        "random_bytes": lambda: random.Random(6).randbytes(4096),
        "truncated_jpeg": lambda: valid_jpeg[: len(valid_jpeg) // 2],
        "one_byte": lambda: b"\xff",
        "text_not_image": lambda: b"hello, I am not an image" * 10,
        "jpeg_bomb_header": lambda: jpeg_claiming(valid_jpeg, BOMB_SIDE, BOMB_SIDE),
        "png_bomb": lambda: png_bomb(BOMB_SIDE, BOMB_SIDE),
    }
    cases = [HostileCase(name, functools.partial(lambda make: image_request(make(), io), make))
             for name, make in payloads.items()]
    cases.append(HostileCase("zero_size", binary_request([(input_name, "UINT8", [1, 0], b"")])))
    cases.append(HostileCase("truncated_binary", _truncate(image_request(valid_jpeg, io), 100)))
    return structural_cases(input_name, "UINT8", [1, 3], [1, 2, 3]) + cases


def _truncate(request: RawRequest, drop: int) -> RawRequest:
    return RawRequest(request.body[:-drop], request.headers)


def sample_jpeg(size: tuple[int, int] = (64, 48), seed: int = 0) -> bytes:
    """A small real JPEG (PIL), different per seed."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def jpeg_claiming(jpeg: bytes, width: int, height: int) -> bytes:
    """`jpeg` with its SOF header patched to claim width × height (the entropy data stays small)."""
    i = 2
    while i + 9 < len(jpeg):
        if jpeg[i] != 0xFF:
            raise ValueError("not a baseline JPEG marker stream")
        marker, length = jpeg[i + 1], struct.unpack(">H", jpeg[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            return jpeg[:i + 5] + struct.pack(">HH", height, width) + jpeg[i + 9:]
        i += 2 + length
    raise ValueError("no SOF marker found")


def damaged(data: bytes, count: int = 16) -> bytes:
    """`data` with `count` bytes inverted at its middle, as a broken download or disk leaves a file."""
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + count]) + data[middle + count:]


@functools.cache
def png_bomb(width: int, height: int) -> bytes:
    """A valid grayscale PNG of width × height zeros: a few hundred KB that decode to width*height bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    compressor = zlib.compressobj(9)
    row = b"\x00" * (width + 1)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def send(base_url: str, path: str, request: RawRequest, session=None, timeout: float = 120.0):
    """POST the raw body; returns (status, body as text)."""
    import requests

    poster = session or requests
    url = base_url if base_url.startswith("http") else f"http://{base_url}"
    response = poster.post(url + path, data=request.body, headers=request.headers, timeout=timeout)
    return response.status_code, response.content.decode(errors="replace")


def shm_regions() -> set[str]:
    """Names of the python backend's shared-memory regions in /dev/shm."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("triton_python_backend_shm")}
    except OSError:
        return set()
