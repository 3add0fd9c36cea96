"""Image tarballs (`portable`) through the local MME to an unmodified boto3 sagemaker-runtime client.

SCORES must equal a direct in-process run of the same repository's files (tests/test_image_served.py's `DirectRun`)
in both body formats, labels come back with `class_count`, and the image cases of `tests/reliability/hostile.py`
sent through the gateway get a 4xx while gateway, Triton and its stubs keep serving. One LocalMME serves every
test of the module.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests import mme_support, test_image_served
from tests.images import image_kinds
from tests.mme_support import HostileProbe, models_folder, runtime_for, timing
from tests.reliability import hostile
from tests.test_hostile_inputs import image_cases
from tests.test_image_served import MAX_REL_DIFF, max_rel_diff
from tritonpack import codec, payloads, proc

pytestmark = pytest.mark.server
aws_env, local_mme = mme_support.aws_env, mme_support.local_mme
# the direct in-process runs of tests/test_image_served.py (module-scoped: computed once here)
direct, expected = test_image_served.direct, test_image_served.expected
IMAGE_TARGETS = ("resnet_pt", "dali_inception")
# different sizes and kinds in one request (rows padded to the longest), small enough for a JSON body under 6 MB
KINDS = ("jpeg_baseline", "jpeg_grayscale", "png_tiny_3x2", "jpeg_very_tall_24x1400", "jpeg_progressive")


@pytest.fixture(scope="module")
def image_mme(tmp_path_factory, build_ensemble, local_mme):
    folder = models_folder(tmp_path_factory.mktemp("mme-images"),
                           {f"{name}.tar.gz": build_ensemble(name, "portable").tarball for name in IMAGE_TARGETS})
    return local_mme(folder, max_models=len(IMAGE_TARGETS))


@pytest.fixture(scope="module")
def runtime(image_mme):
    return runtime_for(image_mme)


def invoke(runtime, name: str, payload: payloads.Payload) -> tuple[bytes, str]:
    return payloads.invoke(payload, f"{name}.tar.gz", client=runtime)


@pytest.mark.parametrize("fmt", ["json", "binary"])
@pytest.mark.parametrize("name", IMAGE_TARGETS)
def test_local_mme_scores_equal_direct_run_when_image_tarball_is_invoked_through_boto3(image_mme, runtime, expected,
                                                                                      name, fmt):
    started = time.monotonic()
    body, content_type = invoke(runtime, name, payloads.image_payload([image_kinds()[k] for k in KINDS], fmt))
    timing(f"mme_{name}_{fmt}_call_s", time.monotonic() - started)  # the first format's call is the cold start
    assert content_type.startswith(codec.BINARY_JSON if fmt == "binary" else codec.JSON)
    rows = payloads.scores(body, content_type)
    assert rows.shape[0] == len(KINDS)
    for kind, row in zip(KINDS, rows, strict=True):
        assert row.shape == expected(name)[kind].shape
        assert max_rel_diff(row, expected(name)[kind]) <= MAX_REL_DIFF, kind


@pytest.mark.parametrize("fmt", ["json", "binary"])
@pytest.mark.parametrize("name", IMAGE_TARGETS)
def test_local_mme_returns_labels_when_class_count_is_given(image_mme, runtime, expected, build_ensemble, name, fmt):
    kinds = ["jpeg_baseline", "jpeg_progressive"]
    body, content_type = invoke(runtime, name, payloads.image_payload([image_kinds()[k] for k in kinds], fmt,
                                                                      class_count=3))
    labels = (build_ensemble(name, "portable").repository / name / "labels.txt").read_text().splitlines()
    top = payloads.labels(body, content_type)
    assert len(top) == len(kinds) and all(len(row) == 3 for row in top)
    for kind, row in zip(kinds, top, strict=True):
        reference = expected(name)[kind]
        tolerance = 1e-6 + MAX_REL_DIFF * np.abs(reference).max()  # Triton prints label scores with 6 decimals
        third = np.sort(reference)[::-1][2]
        assert [entry.label for entry in row] == [labels[entry.index] for entry in row]
        assert not any(entry.label.isdigit() for entry in row)
        assert [entry.score for entry in row] == sorted((entry.score for entry in row), reverse=True)
        for entry in row:  # the direct run's top 3 (random weights: near-ties may swap places)
            assert abs(entry.score - reference[entry.index]) <= tolerance, (kind, entry)
            assert reference[entry.index] >= third - tolerance, (kind, entry)


@pytest.fixture(scope="module")
def image_probe(image_mme):
    # dali_inception: its valid probe request costs ~0.15 s on 2 cores (TensorFlow), ResNet-50's ~1 s (TorchScript)
    return HostileProbe(image_mme, "dali_inception.tar.gz", hostile.image_request(hostile.sample_jpeg()))


@pytest.mark.parametrize("case", image_cases(), ids=lambda c: c.name)
def test_local_mme_answers_4xx_and_keeps_serving_when_an_image_request_is_hostile(image_probe, case):
    # bombs, undecodable bytes and malformed bodies, including those tritonserver 2.51 itself answers with 500
    image_probe.check(case)


def test_local_mme_refuses_16_concurrent_requests_whose_shape_would_exhaust_tritonservers_memory(image_probe):
    # straight to tritonserver 2.51, each makes its HTTP front-end allocate and fill the 12.9 GB the shape declares
    # (eight at once got it killed by the out-of-memory killer on a 23 GB machine); the gateway refuses them first
    (case,) = [c for c in image_cases() if c.name == "dim_wraps_at_2_32"]
    triton = image_probe.server.triton.server
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = [status for status, _ in pool.map(lambda _: image_probe.send(case.request), range(16))]
    assert statuses == [400] * 16
    assert proc.memory(triton.process.pid).rss < 2**20  # kB: nothing near the declared size was allocated
    image_probe.check(case)
