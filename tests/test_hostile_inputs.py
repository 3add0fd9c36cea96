"""Hostile requests against every served ensemble on the real tritonserver (raw HTTP, crafted bodies).

Each case gets a client error (4xx) — or, where tritonserver 2.51's own front-end answers before any project
code runs, exactly the answer recorded in `tests/reliability/hostile.py` (README, "Reliability", lists them) — and
afterwards the server is ready, no process died or restarted, and a valid request gets the same answer as
before. `tritonpack.mme.request_guard` (what a gateway runs first) must refuse every case Triton gets wrong.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.reliability import hostile
from tests.reliability.soak import EMBEDDING_ATOL, outputs
from tests.texts import assert_embeddings_match
from tritonpack.ensembles.text import MAX_TEXT_BYTES
from tritonpack.mme.request_guard import infer_request_problem

TEXT_ENSEMBLES = ("bert", "bert_pt")
IMAGE_ENSEMBLES = ("dali_inception", "resnet_pt", "resnet_trt")
TEXT_CASES = hostile.text_cases(MAX_TEXT_BYTES, max_batch=64)
STATUS_CLASS = {"2xx": range(200, 300), "4xx": range(400, 500), "5xx": range(500, 600)}


def image_cases():
    return hostile.image_cases(hostile.sample_jpeg())


class Target:
    """One served ensemble, the valid request used as a health probe, and its answer before any hostile input."""

    def __init__(self, server, name: str, valid: hostile.RawRequest):
        self.server, self.name, self.valid = server, name, valid
        self.path = f"/v2/models/{name}/infer"
        status, text = hostile.send(server.url, self.path, valid)
        assert status == 200, text
        self.expected = outputs(text)

    def assert_still_serving(self, pids_before: set[int]) -> None:
        assert self.server.process.poll() is None, f"tritonserver died; log: {self.server.log_path}"
        assert self.server.is_ready(), f"server not ready after a hostile request; log: {self.server.log_path}"
        assert set(self.server.process_group_pids()) == pids_before, "a stub process died or was restarted"
        status, text = hostile.send(self.server.url, self.path, self.valid)
        assert status == 200, text
        for name, expected in self.expected.items():
            np.testing.assert_allclose(outputs(text)[name], expected, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def targets(served):
    made = {}

    def _target(name: str) -> Target:
        if name not in made:
            if name in IMAGE_ENSEMBLES:
                made[name] = Target(served(name), name, hostile.image_request(hostile.sample_jpeg()))
            else:
                made[name] = Target(served(name), name, hostile.text_request(["A valid sentence after abuse."]))
        return made[name]

    return _target


def check_case(target: Target, case: hostile.HostileCase) -> None:
    pids = set(target.server.process_group_pids())
    status, text = hostile.send(target.server.url, target.path, case.request)
    assert status in STATUS_CLASS[case.direct], f"{case.name}: expected {case.direct}, got {status}: {text[:300]}"
    if case.direct == "4xx":
        assert "error" in json.loads(text), text
    target.assert_still_serving(pids)


@pytest.mark.server
@pytest.mark.parametrize("case", TEXT_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("name", TEXT_ENSEMBLES)
def test_text_ensemble_answers_client_error_and_keeps_serving_when_request_is_hostile(targets, name, case):
    check_case(targets(name), case)


@pytest.mark.server
@pytest.mark.parametrize("case", image_cases(), ids=lambda c: c.name)
@pytest.mark.parametrize("name", IMAGE_ENSEMBLES)
def test_image_ensemble_answers_client_error_and_keeps_serving_when_request_is_hostile(targets, name, case):
    check_case(targets(name), case)


@pytest.mark.server
@pytest.mark.parametrize("name", TEXT_ENSEMBLES)
def test_text_ensemble_answers_other_requests_when_one_request_of_a_batch_is_hostile(targets, name):
    """Hostile and valid requests in flight together: the dynamic batcher merges them, errors stay per request."""
    from concurrent.futures import ThreadPoolExecutor

    target = targets(name)
    bad = hostile.text_request([b"\xff\xfe"])
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: hostile.send(target.server.url, target.path, bad if i % 2 else target.valid),
                                range(32)))
    assert all(status == 400 for status, _ in answers[1::2])
    for status, text in answers[::2]:
        assert status == 200, text
        got = outputs(text)["EMBEDDING"]  # co-batched with its neighbours: equal to bf16's batch-composition noise
        np.testing.assert_allclose(got, target.expected["EMBEDDING"], atol=EMBEDDING_ATOL)
        assert_embeddings_match(got, target.expected["EMBEDDING"])


@pytest.mark.parametrize("case", [c for c in TEXT_CASES + image_cases() if c.direct != "4xx"], ids=lambda c: c.name)
def test_request_guard_refuses_request_when_triton_would_not_answer_4xx(case):
    assert infer_request_problem(case.request.body, case.request.header_length) is not None


def _body(shape) -> bytes:
    return json.dumps({"inputs": [{"name": "TEXT", "shape": shape, "datatype": "BYTES", "data": []}]}).encode()


@pytest.mark.parametrize(("body", "header_length", "reason"), [
    (b"", None, "empty request body"),
    (_body([2**32, 0]), None, "'shape' must be a list of integers in [0, 2147483647], got [4294967296, 0]"),
    (_body([-1, 1]), None, "'shape' must be a list of integers in [0, 2147483647], got [-1, 1]"),
    (_body([65536, 65536]), None, "shape [65536, 65536] has more than 2147483647 elements"),
    (_body([1, 1]), "1000", "Inference-Header-Content-Length 1000 is outside the body's"),
    (_body([1, 1]), "ten", "Inference-Header-Content-Length 'ten' is not an integer"),
    (b"[1]", None, "request must be a JSON object, got list"),
    # Triton reads the first `shape` (it reserved 100,000,000 floats), json.loads the last, which passed
    (b'{"inputs": [{"name": "TEXT", "shape": [100000000, 1], "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}',
     None, "request header repeats the key 'shape' in one object"),
], ids=["empty", "dim_wraps_zero_elements", "negative_dim", "too_many_elements", "header_past_body",
        "header_not_a_number", "not_an_object", "repeated_key"])
def test_request_guard_names_the_rule_a_request_breaks_when_only_that_rule_catches_it(body, header_length, reason):
    """Each case breaks one rule alone: the hostile corpus's cases are caught by several, so a rule could go."""
    problem = infer_request_problem(body, header_length)
    assert problem is not None and reason in problem, problem


def test_gateway_names_the_content_type_field_a_sagemaker_client_set_when_it_is_past_the_body():
    from tritonpack.codec import BINARY_JSON
    from tritonpack.mme.gateway import request_problem

    body = _body([1, 1])
    problem = request_problem(body, f"{BINARY_JSON};json-header-size=99999")
    assert problem == f"content type's json-header-size 99999 is outside the body's {len(body)} bytes"


@pytest.mark.parametrize("request_", [hostile.text_request(["hello", "world"]),
                                      hostile.json_request([{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                                             "data": ["hello"]}]),
                                      hostile.image_request(b"\xff\xd8\xff" + bytes(100))])
def test_request_guard_accepts_request_when_it_is_well_formed(request_):
    assert infer_request_problem(request_.body, request_.header_length) is None


LOW_PIXEL_LIMIT = 100 * 100  # a 64×48 sample passes, a 128×96 one does not


@pytest.fixture(scope="module")
def low_limit_server(tmp_path_factory):
    """resnet_pt (portable) built with `max_image_pixels` lowered at build time, in its own small repository."""
    from tests.conftest import BUILD_CACHE
    from tritonpack.builder import BuildRequest, build
    from tritonpack.server import TritonServer

    dist = tmp_path_factory.mktemp("low-pixel-limit")
    (dist / "cache").symlink_to(BUILD_CACHE)  # the exports and the DALI pipeline are shared: only configs differ
    result = build(BuildRequest("resnet_pt", "portable", dist=dist,
                                serving=(("max_image_pixels", str(LOW_PIXEL_LIMIT)),)))
    server = TritonServer(result.repository).start()
    yield result.repository, server
    server.stop()


@pytest.mark.server
def test_image_ensemble_answers_400_naming_the_limit_when_image_exceeds_build_time_pixel_limit(low_limit_server):
    from tritonpack.spec import parse_config

    repository, server = low_limit_server
    config = parse_config((repository / "resnet_pt_preprocess" / "config.pbtxt").read_text())
    assert config.parameters["max_image_pixels"].string_value == str(LOW_PIXEL_LIMIT)
    path = "/v2/models/resnet_pt/infer"
    small = hostile.image_request(hostile.sample_jpeg((64, 48)))
    status, text = hostile.send(server.url, path, small)
    assert status == 200, text
    expected = outputs(text)
    pids = set(server.process_group_pids())
    for too_big in (hostile.sample_jpeg((128, 96)), hostile.jpeg_claiming(hostile.sample_jpeg((64, 48)), 101, 100)):
        status, text = hostile.send(server.url, path, hostile.image_request(too_big))
        assert status == 400, text
        assert f"more than the limit of {LOW_PIXEL_LIMIT}" in json.loads(text)["error"], text
    assert server.is_ready() and set(server.process_group_pids()) == pids
    status, text = hostile.send(server.url, path, small)
    assert status == 200, text
    np.testing.assert_allclose(outputs(text)["SCORES"], expected["SCORES"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("overrides", "message"), [
    ((("max_image_pixels", "-1"),), "max_image_pixels must be >= 0"),
    ((("max_image_pixel", "1"),), "unknown serving setting"),
    ((("max_image_pixels", "many"),), "takes an integer"),
])
def test_image_serving_rejects_override_when_setting_is_invalid(overrides, message):
    from tritonpack.ensembles.image import ImageServing
    from tritonpack.spec import SpecError

    with pytest.raises(SpecError, match=message):
        ImageServing().with_overrides(overrides)
