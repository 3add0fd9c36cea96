"""Image ensembles (`portable`), served by the real tritonserver, against direct in-process runs of the same files.

The direct run reads the built repository's own artifacts — `model.dali` through DALI's Pipeline on the CPU,
then `model.pt` through torch, `model.graphdef` through TensorFlow or `model.onnx` through ONNX Runtime —
without any tritonpack code in between.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.images import bad_payloads, image_kinds
from tests.reliability.soak import QUIET_S
from tritonpack import proc
from tritonpack.client import classify, image_inputs, sample_image, scores
from tritonpack.spec import parse_config

pytestmark = pytest.mark.server
IMAGE_ENSEMBLES = ["dali_inception", "resnet_pt", "resnet_trt"]
MAX_REL_DIFF = 1e-4


def max_rel_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


class DirectRun:
    """The repository's preprocessing and classifier files run in this process with their own libraries."""

    def __init__(self, repository: Path, name: str):
        from nvidia.dali import Pipeline

        self.name = name
        pre = repository / f"{name}_preprocess"
        self.pipe = Pipeline.deserialize(serialized_pipeline=(pre / "1" / "model.dali").read_bytes(), batch_size=16,
                                         num_threads=2, device_id=None, prefetch_queue_depth=1, exec_async=False,
                                         exec_pipelined=False)
        self.pipe.build()
        folder = repository / f"{name}_classifier"
        config = parse_config((folder / "config.pbtxt").read_text())
        params = {k: v.string_value for k, v in config.parameters.items()}
        self.input_name, self.output_name = config.input[0].name, config.output[0].name
        self.labels = (folder / "labels.txt").read_text().splitlines()
        self.forward = getattr(self, f"_{params['framework']}")(folder / "1" / params["artifact"])

    def _torchscript(self, path: Path):
        import torch

        module = torch.jit.load(str(path)).eval()

        def forward(pixels):
            with torch.inference_mode():
                return module(torch.from_numpy(pixels)).numpy()

        return forward

    def _onnxruntime(self, path: Path):
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda pixels: session.run([self.output_name], {self.input_name: pixels})[0]

    def _tensorflow_graphdef(self, path: Path):
        import tensorflow as tf

        graph_def = tf.compat.v1.GraphDef.FromString(path.read_bytes())
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        fn = wrapped.prune(wrapped.graph.get_tensor_by_name(f"{self.input_name}:0"),
                           wrapped.graph.get_tensor_by_name(f"{self.output_name}:0"))
        return lambda pixels: fn(tf.constant(pixels)).numpy()

    def scores(self, images: list[bytes]) -> np.ndarray:
        self.pipe.feed_input("IMAGE", [np.frombuffer(d, dtype=np.uint8) for d in images])
        out = self.pipe.run()[0]
        pixels = np.stack([np.array(out[i]) for i in range(len(images))])
        return np.concatenate([self.forward(pixels[i:i + 4]) for i in range(0, len(pixels), 4)])


@pytest.fixture(scope="module")
def direct(build_ensemble):
    runs = {}

    def _direct(name: str) -> DirectRun:
        if name not in runs:
            runs[name] = DirectRun(build_ensemble(name, "portable").repository, name)
        return runs[name]

    return _direct


@pytest.fixture(scope="module")
def expected(direct):
    """name → {kind: direct SCORES row} for every image kind."""
    cache = {}

    def _expected(name: str) -> dict[str, np.ndarray]:
        if name not in cache:
            kinds = image_kinds()
            cache[name] = dict(zip(kinds, direct(name).scores(list(kinds.values())), strict=True))
        return cache[name]

    return _expected


@pytest.mark.parametrize("name", IMAGE_ENSEMBLES)
def test_served_scores_equal_direct_run_when_each_image_kind_is_its_own_request(name, served, expected):
    server = served(name)
    client = http.InferenceServerClient(server.url)
    try:
        for kind, data in image_kinds().items():
            row = scores(server.url, name, [data], client=client)[0]
            assert row.shape == expected(name)[kind].shape
            assert max_rel_diff(row, expected(name)[kind]) <= MAX_REL_DIFF, kind
    finally:
        client.close()


@pytest.mark.parametrize("name", IMAGE_ENSEMBLES)
def test_served_scores_equal_direct_run_when_images_of_different_sizes_share_a_request(name, served, expected):
    server = served(name)
    kinds = ["png_tiny_3x2", "jpeg_cmyk", "png_rgba", "jpeg_very_tall_24x1400", "jpeg_baseline"]
    rows = scores(server.url, name, [image_kinds()[k] for k in kinds])
    assert rows.shape[0] == len(kinds)
    for kind, row in zip(kinds, rows, strict=True):
        assert max_rel_diff(row, expected(name)[kind]) <= MAX_REL_DIFF, kind


def _infer_status(url: str, name: str, images: list[bytes]) -> tuple[str, np.ndarray | None]:
    client = http.InferenceServerClient(url)
    try:
        return "200", scores(url, name, images, client=client)
    except InferenceServerException as e:
        return str(e.status()), None
    finally:
        client.close()


@pytest.mark.parametrize("name", ["resnet_pt", "dali_inception"])
def test_served_ensemble_answers_400_only_for_bad_images_when_sent_concurrently_with_good_ones(name, served,
                                                                                             expected):
    server = served(name)
    good = image_kinds()["jpeg_progressive"]
    bad = list(bad_payloads().items())
    jobs = [("good", [good])] + [(kind, [data]) for kind, data in bad] + [("good", [good])] \
        + [("good_with_bad_in_same_request", [good, bad[0][1]])]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: _infer_status(server.url, name, job[1]), jobs))
    for (kind, _), (status, rows) in zip(jobs, results, strict=True):
        if kind == "good":
            assert status == "200", f"a good request failed next to bad ones: {status}"
            assert max_rel_diff(rows[0], expected(name)["jpeg_progressive"]) <= MAX_REL_DIFF
        else:
            assert status == "400", f"{kind}: got HTTP {status}"
    assert server.is_ready()
    assert _infer_status(server.url, name, [good])[0] == "200"


def test_served_preprocess_holds_no_more_memory_when_150_requests_carry_undecodable_images(served):
    # Rebuilding the DALI pipeline after each failed run (the classic executors leave it invalid) left the stub
    # 57-170 MB more anonymous memory after these requests, even once idle; the dynamic executor needs no rebuild.
    server = served("resnet_pt")
    stub = next(pid for pid in server.process_group_pids() if proc.process_name(pid) == "stub:resnet_pt_preprocess")

    def anonymous_mb_once_idle() -> float:
        time.sleep(QUIET_S)  # past the stub's idle heap return
        return proc.memory(stub).anonymous / 1024

    before = anonymous_mb_once_idle()
    bad = list(bad_payloads().values())
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda i: _infer_status(server.url, "resnet_pt", [bad[i % len(bad)]])[0],
                                 range(150)))
    assert set(statuses) == {"400"}
    assert anonymous_mb_once_idle() - before < 20
    assert _infer_status(server.url, "resnet_pt", [image_kinds()["jpeg_progressive"]])[0] == "200"


def test_served_ensemble_error_names_the_input_without_traceback_when_bytes_are_not_an_image(served):
    server = served("resnet_pt")
    client = http.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("resnet_pt", image_inputs([b"GIF89a but not really"]))
    finally:
        client.close()
    message = str(raised.value)
    assert "IMAGE: not an image DALI decodes" in message and "Traceback" not in message and ".py" not in message


@pytest.mark.parametrize("name", IMAGE_ENSEMBLES)
def test_classification_returns_label_strings_when_class_count_is_given(name, served, direct, build_ensemble):
    server = served(name)
    images = [sample_image(), image_kinds()["jpeg_real_file"]]
    top = classify(server.url, name, images, class_count=3)
    labels = (build_ensemble(name, "portable").repository / name / "labels.txt").read_text().splitlines()
    references = direct(name).scores(images)
    assert len(labels) == references.shape[1]
    assert len(top) == len(images) and all(len(entries) == 3 for entries in top)
    for entries, reference in zip(top, references, strict=True):
        tolerance = 1e-6 + MAX_REL_DIFF * np.abs(reference).max()  # Triton prints label scores with 6 decimals
        third = np.sort(reference)[::-1][2]
        parsed = [(float(score), int(index), label) for score, index, label in (e.split(":", 2) for e in entries)]
        assert [label for _, _, label in parsed] == [labels[index] for _, index, _ in parsed]
        assert not any(label.isdigit() for _, _, label in parsed)
        assert [score for score, _, _ in parsed] == sorted((score for score, _, _ in parsed), reverse=True)
        for score, index, _ in parsed:  # the direct run's top 3 (random weights: near-ties may swap places)
            assert abs(score - reference[index]) <= tolerance, (score, index)
            assert reference[index] >= third - tolerance, (score, index)


def test_served_repository_declares_labels_on_the_ensemble_output_when_built(build_ensemble):
    repository = build_ensemble("dali_inception", "portable").repository
    config = parse_config((repository / "dali_inception" / "config.pbtxt").read_text())
    assert config.output[0].name == "SCORES" and config.output[0].label_filename == "labels.txt"
    labels = (repository / "dali_inception" / "labels.txt").read_text().splitlines()
    assert len(labels) == 1001 and labels[0] == "background" and labels[1] == "tench"
    manifest = json.loads((repository / "manifest.json").read_text())
    assert "dali_inception_preprocess" in manifest["python_models"]
