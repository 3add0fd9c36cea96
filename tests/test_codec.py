"""The codec and the SageMaker payload helpers: request/response bodies in JSON and binary+json, without a server."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tritonpack import codec, payloads
from tritonpack.codec import BINARY_JSON, JSON
from tritonpack.errors import PayloadError
from tritonpack.payloads import Label


def split_binary(body: bytes, content_type: str) -> tuple[dict, bytes]:
    size = codec.header_size(content_type)
    return json.loads(body[:size]), body[size:]


def binary_response(outputs: dict[str, np.ndarray]) -> tuple[bytes, str]:
    """A binary+json response body as Triton writes it."""
    header = {"model_name": "m", "outputs": []}
    blobs = []
    for name, array in outputs.items():
        if array.dtype == np.object_:
            raw = b"".join(struct.pack("<I", len(v)) + v for v in array.reshape(-1))
            datatype = "BYTES"
        else:
            raw, datatype = array.tobytes(), "FP32"
        header["outputs"].append({"name": name, "datatype": datatype, "shape": list(array.shape),
                                  "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    text = json.dumps(header).encode()
    return text + b"".join(blobs), f"{BINARY_JSON};json-header-size={len(text)}"


def test_text_payload_is_kserve_json_when_format_json():
    payload = payloads.text_payload(["héllo", b"raw"], "json")
    assert payload.content_type == JSON
    request = json.loads(payload.body)
    assert request["inputs"] == [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["héllo", "raw"]}]
    assert request["outputs"][0]["name"] == "EMBEDDING"
    assert not request["outputs"][0].get("parameters", {}).get("binary_data")


def test_text_payload_has_header_size_and_length_prefixed_bytes_when_format_binary():
    payload = payloads.text_payload(["héllo", "ab"], "binary")
    assert payload.content_type.startswith(BINARY_JSON + ";json-header-size=")
    header, raw = split_binary(payload.body, payload.content_type)
    (tensor,) = header["inputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("TEXT", "BYTES", [2, 1])
    expected = struct.pack("<I", 6) + "héllo".encode() + struct.pack("<I", 2) + b"ab"
    assert raw == expected and tensor["parameters"]["binary_data_size"] == len(expected)
    assert header["outputs"][0]["parameters"]["binary_data"] is True


def test_image_payload_pads_shorter_images_with_zeros_when_sizes_differ():
    images = [b"\xff\xd8abc\xff\xd9", b"\x89PNG"]
    payload = payloads.image_payload(images, "binary", class_count=3)
    header, raw = split_binary(payload.body, payload.content_type)
    assert header["inputs"][0]["datatype"] == "UINT8" and header["inputs"][0]["shape"] == [2, 7]
    assert raw == images[0] + images[1] + b"\0\0\0"
    assert header["outputs"][0] == {"name": "SCORES", "parameters": {"binary_data": True, "classification": 3}}
    request = json.loads(payloads.image_payload(images, "json").body)
    assert request["inputs"][0]["data"][:7] == list(images[0])


def test_embeddings_equal_float_rows_when_response_is_binary():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    body, content_type = binary_response({"EMBEDDING": rows})
    np.testing.assert_array_equal(payloads.embeddings(body, content_type), rows)


def test_embeddings_equal_float_rows_when_response_is_json():
    rows = [[0.5, -1.25], [3.0, 0.0]]
    body = json.dumps({"outputs": [{"name": "EMBEDDING", "datatype": "FP32", "shape": [2, 2],
                                    "data": [v for r in rows for v in r]}]}).encode()
    np.testing.assert_array_equal(payloads.embeddings(body, "application/json"), np.array(rows, np.float32))


def test_labels_parse_score_index_label_when_classification_was_asked():
    entries = np.array([[b"0.900000:3:tabby cat", b"0.050000:7:dog"], [b"0.6:1", b"0.3:0:a:b"]], dtype=np.object_)
    body, content_type = binary_response({"SCORES": entries})
    labels = payloads.labels(body, content_type)
    assert labels[0][0] == Label(0.9, 3, "tabby cat")
    assert labels[1] == [Label(0.6, 1, ""), Label(0.3, 0, "a:b")]


def test_parse_response_raises_with_reason_when_body_is_an_error():
    with pytest.raises(PayloadError, match="unknown model"):
        codec.parse_response(b'{"error": "unknown model"}', "application/json")
    with pytest.raises(PayloadError, match="no output 'EMBEDDING'"):
        payloads.embeddings(*binary_response({"OTHER": np.zeros((1, 2), np.float32)}))


@pytest.mark.parametrize("body", [
    b"[1, 2]",  # was AttributeError
    b'{"outputs": 3}',  # TypeError
    b'{"outputs": [{"name": "E", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0]}]}',  # ValueError (reshape)
])
def test_parse_response_raises_payload_error_when_the_body_is_malformed(body):
    with pytest.raises(PayloadError, match="not a KServe v2 response body"):
        codec.parse_response(body, "application/json")


@pytest.mark.parametrize("size", ["x", "", "+90", "9_0", "\u0669\u0660", "-5"])
def test_header_size_raises_when_size_is_not_decimal_digits(size):
    """int() took "+90", "9_0" and Arabic-Indic digits, which Triton's atoi reads otherwise."""
    with pytest.raises(PayloadError, match="decimal digits"):
        codec.header_size(f"{BINARY_JSON};json-header-size={size}")
    assert codec.header_size(f"{BINARY_JSON};json-header-size=90") == 90


def test_request_guard_reads_json_as_triton_does_utf8_with_or_without_a_byte_order_mark():
    """Triton 2.51 answers a UTF-16 body 500 and accepts a UTF-8 one with a BOM (both seen on the local Triton);
    json.loads takes both."""
    from tritonpack.mme.request_guard import infer_request_problem

    request = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]})
    assert infer_request_problem(b"\xef\xbb\xbf" + request.encode()) is None
    assert "not JSON" in infer_request_problem(request.encode("utf-16"))


def test_payload_builders_raise_when_input_is_empty_or_format_unknown():
    with pytest.raises(PayloadError):
        payloads.text_payload([], "json")
    with pytest.raises(PayloadError):
        payloads.image_payload([], "binary")
    with pytest.raises(PayloadError, match="format"):
        payloads.text_payload(["a"], "protobuf")


@pytest.mark.parametrize(("text", "fmt", "said"), [
    ("caf\udce9", "binary", "text 2 is not UTF-8"),  # a command-line argument given in Latin-1 (a surrogate)
    (b"\xff\xfeabc", "json", "TEXT element 2 is not UTF-8"),  # JSON carries BYTES as text
])
def test_payload_builders_refuse_text_that_is_not_utf8_naming_it(text, fmt, said):
    """A UnicodeEncodeError traceback and tritonclient's own exception before."""
    with pytest.raises(PayloadError, match=said):
        payloads.text_payload(["fine", text], fmt)
    assert payloads.text_payload(["fine", b"\xff\xfeabc"], "binary").body  # raw bytes: the client's to send


def test_error_message_reads_triton_and_sagemaker_error_bodies():
    assert codec.error_message(b'{"error": "boom"}') == "boom"
    assert codec.error_message(b'{"message": "nope"}') == "nope"
    assert codec.error_message(b"plain text") == "plain text"


def test_labels_show_scores_when_label_file_is_not_utf8_and_refuse_malformed_entries():
    body, content_type = binary_response({"SCORES": np.array([[b"0.5:2:caf\xe9"]], dtype=np.object_)})
    assert payloads.labels(body, content_type) == [[Label(0.5, 2, "caf\ufffd")]]
    for entry in (b"0.5", b"high:2", b"0.5:two:cat"):
        body, content_type = binary_response({"SCORES": np.array([[entry]], dtype=np.object_)})
        with pytest.raises(PayloadError, match="is not score:index"):
            payloads.labels(body, content_type)
