"""model.py adapters outside a server, with the API-faithful fake pb_utils: batching and error isolation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.fake_pb_utils import InferenceRequest, Logger, Tensor, TritonError
from tests.model_folders import config_json, link_files
from tests.reliability.soak import EMBEDDING_ATOL
from tests.texts import GUARDED, assert_embeddings_match
from tritonpack.build.export_text_encoder import CHECK_TEXTS
from tritonpack.components import ModelFolder


@pytest.fixture(scope="module")
def bert(model_folders):
    """portable bert as two steps: the tokenizer, and the packed encoder reading token tensors."""
    return model_folders("bert", "portable", serving=(("encoder_tokenizes", "false"),))


def _texts(*texts: bytes) -> InferenceRequest:
    return InferenceRequest([Tensor("TEXT", np.array([[t] for t in texts], dtype=object))])


@pytest.fixture(scope="module")
def tokenizer(bert):
    return bert["bert_tokenizer"]


@pytest.fixture(scope="module")
def text_encoder(model_folders):
    """portable bert's encoder, which reads the text itself (`encoder_tokenizes`, the default)."""
    return model_folders("bert", "portable")["bert_encoder"]


def test_tokenizer_model_fails_only_the_bad_request_when_batch_mixes_valid_and_invalid(tokenizer, python_model):
    model = python_model(tokenizer)
    responses = model.execute([_texts(b"hello"), _texts(b"\xc3\x28"), _texts(b"a longer sentence", b"")])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    first = {t.name(): t.as_numpy() for t in responses[0].output_tensors()}
    third = {t.name(): t.as_numpy() for t in responses[2].output_tensors()}
    assert first["input_ids"].shape == (1, 3) and third["input_ids"].shape == (2, 5)
    assert set(first) == {"input_ids", "attention_mask", "token_type_ids"}


def test_tokenizer_model_refuses_a_text_tensor_without_elements_as_the_clients_mistake(tokenizer, python_model):
    model = python_model(tokenizer)  # Triton passes a batch of 0 on (it checks only the upper bound)
    empty = InferenceRequest([Tensor("TEXT", np.empty((0, 1), dtype=object))])
    responses = model.execute([_texts(b"hello"), empty])
    assert not responses[0].has_error()
    assert (responses[1].error().code(), responses[1].error().message()) == (TritonError.INVALID_ARG,
                                                                             "TEXT has no elements")


def test_tokenizer_model_reports_missing_input_when_request_lacks_text(tokenizer, python_model):
    model = python_model(tokenizer)
    (response,) = model.execute([InferenceRequest([])])
    assert response.error().code() == TritonError.INVALID_ARG
    assert "input TEXT is missing" in response.error().message()


def test_encoder_runner_equals_separate_runs_when_requests_have_different_lengths(bert, python_model):
    tokenizer, encoder = python_model(bert["bert_tokenizer"]), python_model(bert["bert_encoder"])
    tokens = [{t.name(): t.as_numpy() for t in r.output_tensors()}
              for r in tokenizer.execute([_texts(b"short"), _texts(b"a much longer sentence than that", b"x")])]
    requests = [InferenceRequest([Tensor(n, a) for n, a in t.items()]) for t in tokens]
    together = [r.output_tensors()[0].as_numpy() for r in encoder.execute(requests)]
    alone = [encoder.execute([r])[0].output_tensors()[0].as_numpy() for r in requests]
    for t, a, tok in zip(together, alone, tokens, strict=True):
        assert t.shape == a.shape == (len(tok["input_ids"]), 384)  # the packed encoder pools: one row per text
        np.testing.assert_allclose(t, a, atol=EMBEDDING_ATOL)  # bf16: packed with others or alone, nearly equal
        assert_embeddings_match(t, a)


def _answers(model, requests: list[InferenceRequest]) -> list:
    """The responses a model that answers through each request's sender gives (its execute returns None)."""
    assert model.execute(requests) is None
    return [r.get_response_sender().wait() for r in requests]


def _embedding(response) -> np.ndarray:
    assert not response.has_error(), response.error().message()
    return response.output_tensors()[0].as_numpy()


def test_text_encoder_equals_separate_runs_when_requests_of_different_lengths_batch_together(text_encoder,
                                                                                            python_model):
    encoder = python_model(text_encoder)
    texts = [(b"short",), (b"a much longer sentence than that", b"x"), (b"",)]
    together = [_embedding(r) for r in _answers(encoder, [_texts(*t) for t in texts])]
    alone = [_embedding(_answers(encoder, [_texts(*t)])[0]) for t in texts]
    for t, a, request in zip(together, alone, texts, strict=True):
        assert t.shape == a.shape == (len(request), 384)  # the packed encoder pools: one row per text
        np.testing.assert_allclose(t, a, atol=EMBEDDING_ATOL)  # bf16: packed with others or alone, nearly equal
        assert_embeddings_match(t, a)


class _HeldBatches:
    """Wraps a runner's packed path: the first batch waits until `release`; records each batch's request count."""

    def __init__(self, model):
        import threading

        self.sizes, self.entered, self._release = [], threading.Event(), threading.Event()
        run = model._run_packed

        def held(items):
            self.sizes.append(len(items))
            self.entered.set()
            assert self._release.wait(60)
            return run(items)

        model._run_packed = held

    def release(self):
        self._release.set()


def test_text_encoder_runs_requests_queued_while_it_computes_as_one_batch_when_they_arrive_one_by_one(
        text_encoder, python_model):
    """Triton hands the encoder one request per execute (the step reading client bytes runs each request alone); the
    runner batches them itself: eight requests that arrive while a batch runs are embedded together next."""
    encoder = python_model(text_encoder)
    held = _HeldBatches(encoder)
    first = _texts(b"the first request")
    assert encoder.execute([first]) is None
    assert held.entered.wait(60)
    later = [_texts(f"sentence number {i}".encode()) for i in range(8)]
    for request in later:
        assert encoder.execute([request]) is None  # returns at once: queued
    held.release()
    embeddings = [_embedding(r.get_response_sender().wait()) for r in [first, *later]]
    assert held.sizes == [1, 8]
    assert_embeddings_match(np.concatenate(embeddings[1:]),
                            np.concatenate([_embedding(_answers(encoder, [r])[0])
                                            for r in [_texts(f"sentence number {i}".encode()) for i in range(8)]]))


def test_text_encoder_fails_only_the_bad_request_when_queued_with_valid_ones(text_encoder, python_model):
    encoder = python_model(text_encoder)
    responses = _answers(encoder, [_texts(b"hello"), _texts(b"\xc3\x28"), InferenceRequest([]),
                                   _texts(b"x" * 70000), _texts(b"a longer sentence", b"")])
    assert [r.has_error() for r in responses] == [False, True, True, True, False]
    assert {r.error().code() for r in responses[1:4]} == {TritonError.INVALID_ARG}
    assert "not valid UTF-8" in responses[1].error().message()
    assert "input TEXT is missing" in responses[2].error().message()
    assert "exceeds the limit of 65536" in responses[3].error().message()
    assert _embedding(responses[4]).shape == (2, 384)


def test_text_encoder_answers_each_request_alone_when_its_batch_fails(text_encoder, python_model):
    """A batch that fails in the framework is run again request by request, so only the culprit gets the error."""
    encoder = python_model(text_encoder)
    run = encoder._run_packed

    def failing_on_poison(items):
        if any(len(item["input_ids"]) == 2 for item in items):  # the request of two texts
            raise RuntimeError("the framework failed")
        return run(items)

    encoder._run_packed = failing_on_poison
    held = _HeldBatches(encoder)
    first = _texts(b"the first request")
    encoder.execute([first])
    assert held.entered.wait(60)
    queued = [_texts(b"hello there"), _texts(b"poison", b"pill"), _texts(b"goodbye")]
    for request in queued:
        encoder.execute([request])
    held.release()
    responses = [r.get_response_sender().wait() for r in [first, *queued]]
    assert [r.has_error() for r in responses] == [False, False, True, False]
    assert responses[2].error().code() == TritonError.INTERNAL
    # the client learns the kind of failure; its text (paths, tracebacks) goes to the server log only
    assert responses[2].error().message() == "internal error (RuntimeError); the server log has the details"
    assert any("RuntimeError: the framework failed" in message for _, message in Logger.messages)


def test_text_encoder_answers_what_is_queued_before_it_unloads(text_encoder, python_model):
    encoder = python_model(text_encoder)
    held = _HeldBatches(encoder)
    requests = [_texts(b"the first request")] + [_texts(f"queued {i}".encode()) for i in range(3)]
    encoder.execute(requests[:1])
    assert held.entered.wait(60)
    encoder.execute(requests[1:])
    held.release()
    encoder.finalize()
    assert all(_embedding(r.get_response_sender().wait(timeout=0)).shape == (1, 384) for r in requests)
    late = _texts(b"after unloading")
    encoder.execute([late])
    assert late.get_response_sender().wait().error().code() == TritonError.UNAVAILABLE


@pytest.mark.parametrize(("deployment_sets", "stub_tokenizes_with"), [(None, "false"), ("true", "true")])
def test_text_encoder_tokenizes_without_the_tokenizers_thread_pool_unless_the_deployment_chose_one(
        text_encoder, python_model, monkeypatch, deployment_sets, stub_tokenizes_with):
    if deployment_sets is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", deployment_sets)
    python_model(text_encoder)
    assert os.environ["TOKENIZERS_PARALLELISM"] == stub_tokenizes_with


def test_respond_all_answers_a_failing_item_with_its_error_type_only_and_the_others_with_their_results():
    from tests import fake_pb_utils
    from tritonpack.components import load_model_module

    batched = load_model_module("shared", "batched_requests")

    def compute(items):
        if "torchscript" in items:  # what a TorchScript error's text looks like: source paths and a traceback
            raise RuntimeError('The following operation failed in the TorchScript interpreter.\nTraceback of '
                               'TorchScript (most recent call last):\n  File "/home/builder/model.py", line 12')
        return [np.array([len(item)]) for item in items]

    def parse(request):
        if request == "bad":
            raise batched.ClientError("TEXT must be BYTES")
        return request

    responses = batched.respond_all(fake_pb_utils.module(), ["ok", "bad", "torchscript", "fine"], parse, compute,
                                    lambda result: [Tensor("N", result)], Logger)
    assert [r.has_error() for r in responses] == [False, True, True, False]
    assert (responses[1].error().code(), responses[1].error().message()) == (TritonError.INVALID_ARG,
                                                                             "TEXT must be BYTES")
    assert responses[2].error().code() == TritonError.INTERNAL
    assert responses[2].error().message() == "internal error (RuntimeError); the server log has the details"
    assert any("/home/builder/model.py" in message for _, message in Logger.messages)  # the log keeps it all
    assert [r.output_tensors()[0].as_numpy()[0] for r in (responses[0], responses[3])] == [2, 4]


def test_respond_all_fails_only_the_request_whose_answer_cannot_be_built():
    """`to_tensors` raising for one result left `execute` (every request of the batch failed, with the raw text)."""
    from tests import fake_pb_utils
    from tritonpack.components import load_model_module

    batched = load_model_module("shared", "batched_requests")

    def to_tensors(result):
        return [Tensor("N", result["N"])]

    responses = batched.respond_all(fake_pb_utils.module(), [1, 2, 3], lambda request: request,
                                    lambda items: [{"N": np.array([i])} if i != 2 else {} for i in items],
                                    to_tensors, Logger)
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().message() == "internal error (KeyError); the server log has the details"


@pytest.fixture(scope="module")
def token_encoder(bert):
    """portable bert's encoder, reading token tensors from its tokenizer step."""
    return bert["bert_encoder"]


def test_packed_encoder_fails_only_the_request_whose_mask_is_not_right_padded(token_encoder, python_model):
    encoder = python_model(token_encoder)
    assert "max_pack_tokens" in dict(token_encoder.spec.parameters)

    def request(ids, mask):
        ids = np.array([ids], dtype=np.int64)
        return InferenceRequest([Tensor("input_ids", ids), Tensor("attention_mask", np.array([mask], dtype=np.int64)),
                                 Tensor("token_type_ids", np.zeros_like(ids))])

    responses = encoder.execute([request([101, 7592, 102], [1, 1, 1]), request([0, 101, 102], [0, 1, 1]),
                                 request([101, 102, 0], [1, 1, 0])])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert "right padding" in responses[1].error().message()
    assert responses[2].output_tensors()[0].as_numpy().shape == (1, 384)


def test_packed_encoder_fails_only_the_request_without_tokens_and_its_neighbours_keep_their_embeddings(
        token_encoder, python_model):
    """A [1, 0] request (Triton passes zero-length dimensions on) was packed as one token long: every later
    sentence in its pack was read one token off."""
    encoder = python_model(token_encoder)

    def request(ids):
        ids = np.array([ids], dtype=np.int64).reshape(1, len(ids))
        return InferenceRequest([Tensor("input_ids", ids), Tensor("attention_mask", np.ones_like(ids)),
                                 Tensor("token_type_ids", np.zeros_like(ids))])

    first, second = [101, 7592, 2088, 102], [101, 2023, 2003, 1037, 6251, 102]
    alone = [encoder.execute([request(ids)])[0].output_tensors()[0].as_numpy() for ids in (first, second)]
    responses = encoder.execute([request(first), request([]), request(second)])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert "1 to 256 tokens long" in responses[1].error().message()
    for response, expected in zip((responses[0], responses[2]), alone, strict=True):
        np.testing.assert_allclose(response.output_tensors()[0].as_numpy(), expected, atol=EMBEDDING_ATOL)


def _token_request(ids, mask=None, token_types=None):
    ids = np.asarray(ids, dtype=np.int64)
    return InferenceRequest([Tensor("input_ids", ids),
                             Tensor("attention_mask", np.ones_like(ids) if mask is None else np.asarray(mask)),
                             Tensor("token_type_ids", np.zeros_like(ids) if token_types is None
                                    else np.asarray(token_types, dtype=np.int64))])


@pytest.mark.parametrize(("bad", "reason"), [
    (_token_request(np.zeros((0, 4))), "every input needs at least one row"),  # was a KeyError failing the batch
    (_token_request(np.full((1, 300), 1037)), "1 to 256 tokens long"),  # each new length compiled new state
    (_token_request([[101, -5, 102]]), "token inputs cannot be negative"),
    # OpenVINO's Gather answered an id past the vocabulary with a row of zeros: a wrong embedding, no error
    (_token_request([[101, 30522, 102]]), "input_ids indexes a table of 30522 rows: ids 0 to 30521, got 101 to 30522"),
    (_token_request([[101, 102]], token_types=[[0, 2]]), "token_type_ids indexes a table of 2 rows: ids 0 to 1, got"),
    # a row without real tokens was embedded as its first token alone (a unit vector; sentence-transformers: zeros)
    (_token_request([[101, 102], [101, 102]], mask=[[1, 1], [0, 0]]), "at least one real token per row"),
    (_token_request([[101, 7592, 102]], mask=[[1, 1, 1, 0]]), "every token input must be shaped like attention_mask"),
])
def test_packed_encoder_fails_only_the_request_it_cannot_read_and_answers_its_neighbours(token_encoder, python_model,
                                                                                       bad, reason):
    encoder = python_model(token_encoder)
    first, second = _token_request([[101, 7592, 2088, 102]]), _token_request([[101, 2023, 102]])
    alone = [encoder.execute([r])[0].output_tensors()[0].as_numpy() for r in (first, second)]
    responses = encoder.execute([first, bad, second])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG and reason in responses[1].error().message()
    for response, expected in zip((responses[0], responses[2]), alone, strict=True):
        np.testing.assert_allclose(response.output_tensors()[0].as_numpy(), expected, atol=EMBEDDING_ATOL)


@pytest.mark.parametrize(("bad", "reason"), [
    (_token_request([[101, 30522, 102]]), "input_ids indexes a table of 30522 rows: ids 0 to 30521, got 101 to 30522"),
    (_token_request([[101, -1, 102]]), "input_ids indexes a table of 30522 rows: ids 0 to 30521, got -1 to 102"),
    (_token_request([[101, 102]], token_types=[[0, 2]]), "token_type_ids indexes a table of 2 rows: ids 0 to 1, got"),
    # the ids were padded to the mask's length: the padding embedded as real tokens (cosine 0.63 to the real one)
    (_token_request([[101, 7592, 102]], mask=[[1, 1, 1, 1, 1, 1]]), "every token input must be shaped like"),
])
def test_torchscript_encoder_refuses_ids_outside_its_tables_and_answers_its_neighbours(model_folders, python_model,
                                                                                      bad, reason):
    """torch's embedding raised on such an id: the request got INTERNAL ("internal error (RuntimeError)")."""
    encoder = python_model(model_folders("bert_pt", "portable")["bert_pt_encoder"])
    good = _token_request([[101, 7592, 2088, 102]])
    alone = encoder.execute([good])[0].output_tensors()[0].as_numpy()
    responses = encoder.execute([good, bad, good])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG and reason in responses[1].error().message()
    np.testing.assert_allclose(responses[2].output_tensors()[0].as_numpy(), alone, atol=1e-5)


def test_runner_hands_back_its_sessions_cached_device_memory_once_idle_and_not_between_calls(model_folders,
                                                                                             python_model):
    """On a GPU the TorchScript session names `torch.cuda.empty_cache` as what it caches for the next call; the runner
    calls it with the idle heap return, so an idle model on an MME leaves its GPU's memory to the others. No GPU
    here: the CPU session names nothing, and a counting stand-in takes the CUDA session's place."""
    encoder = python_model(model_folders("bert_pt", "portable")["bert_pt_encoder"])
    from resident_memory import IDLE_S  # models/shared, on the path while the model is loaded
    assert not hasattr(encoder.session, "release_cached_memory")  # a CPU session caches nothing on a device
    released = []
    encoder.session.release_cached_memory = lambda: released.append(time.monotonic())
    for _ in range(int(IDLE_S / 0.2) + 2):  # calls keep coming for longer than IDLE_S
        encoder.execute([_token_request([[101, 7592, 2088, 102]])])
        time.sleep(0.2)
    last_ended = time.monotonic()
    assert released == []
    time.sleep(IDLE_S + 2.0)
    assert len(released) == 1 and released[0] - last_ended >= IDLE_S - 0.2, (released, last_ended)


def test_pooling_model_refuses_a_mask_that_does_not_fit_its_embeddings_alone_or_batched(model_folders, python_model):
    """Batched with a longer request, the short embeddings were padded to fit and the request answered with a
    diluted embedding; alone it failed as INTERNAL."""
    model = python_model(model_folders("bert", "cpu")["bert_pooling"])
    rng = np.random.default_rng(0)
    good = InferenceRequest([Tensor("token_embeddings", rng.normal(size=(1, 7, 384)).astype(np.float32)),
                             Tensor("attention_mask", np.ones((1, 7), dtype=np.int64))])
    bad = InferenceRequest([Tensor("token_embeddings", rng.normal(size=(1, 5, 384)).astype(np.float32)),
                            Tensor("attention_mask", np.ones((1, 7), dtype=np.int64))])
    for requests, position in (([bad], 0), ([good, bad], 1)):
        responses = model.execute(requests)
        assert responses[position].error().code() == TritonError.INVALID_ARG
        assert "must be [rows, tokens, hidden]" in responses[position].error().message()
    assert not model.execute([good, bad])[0].has_error()


def test_pooling_model_splits_results_per_request_when_batched(model_folders, python_model):
    model = python_model(model_folders("bert", "cpu")["bert_pooling"])  # portable bert pools in its encoder
    rng = np.random.default_rng(0)
    requests = [InferenceRequest([Tensor("token_embeddings", rng.normal(size=(b, s, 384)).astype(np.float32)),
                                  Tensor("attention_mask", np.ones((b, s), dtype=np.int64))])
                for b, s in ((1, 4), (3, 9))]
    together = [r.output_tensors()[0].as_numpy() for r in model.execute(requests)]
    alone = [model.execute([r])[0].output_tensors()[0].as_numpy() for r in requests]
    assert [t.shape for t in together] == [(1, 384), (3, 384)]
    for t, a in zip(together, alone, strict=True):
        np.testing.assert_allclose(t, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, rtol=1e-5)


def short_reference_texts(encoder: ModelFolder) -> int:
    """How many of the encoder's reference texts the load-time check counts as short."""
    from tritonpack.components import load_model_module

    with np.load(encoder.files["1/reference.npz"]) as data:
        tokens = data["attention_mask"].sum(1)
    short = int((tokens <= load_model_module("framework_runner", "runner_batching").SHORT_REFERENCE_TOKENS).sum())
    assert 0 < short < len(CHECK_TEXTS)
    return short


def test_encoder_runner_checks_itself_against_the_build_reference_when_loaded(bert, python_model):
    """Where the session computes f32 (nothing to fall back to) only the short texts are embedded; a session that can
    still fall back embeds them all."""
    from tests.fake_pb_utils import Logger

    Logger.messages.clear()
    python_model(bert["bert_encoder"])
    (line,) = [m for level, m in Logger.messages if level == "info" and "reference texts: min cosine" in m]
    checked, total, cosine, computes = re.fullmatch(r"(\d+) of (\d+) reference texts: min cosine ([\d.]+) to the "
                                                    r"build's \((.+)\)", line).groups()
    assert 0.9999 <= float(cosine) <= 1.000001  # fp16 weights, this CPU's precision, against PyTorch in fp32
    short = short_reference_texts(bert["bert_encoder"])
    assert (int(checked), int(total)) == (short if computes == "f32" else len(CHECK_TEXTS), len(CHECK_TEXTS))


def test_encoder_runner_at_f32_embeds_only_the_short_reference_texts_when_loaded(token_encoder, tmp_path):
    """An f32 session has no precision to fall back to, so what its check can still find is an artifact that is not
    the one the build checked on every text; the short texts find that, and the long ones are not computed."""
    from tests.fake_pb_utils import module
    from tritonpack.components import load_model_module

    runner = load_model_module("framework_runner", "runner_batching")
    openvino = load_model_module("framework_runner", "openvino_session")
    link_files(token_encoder, tmp_path)
    longest = []

    class CountingRunner(runner.FrameworkRunnerModel):
        pb_utils = module()

        def open_session(self, path, params):
            session = openvino.open_session(path, {**params, "precision": "fp32"})

            def counted(inputs, *args):
                longest.append(int(inputs["position_ids"].max()) + 1)  # a pack's longest sentence
                return session(inputs, *args)
            return counted

    Logger.messages.clear()
    model = CountingRunner()
    model.initialize({"model_config": config_json(token_encoder), "model_repository": str(tmp_path),
                      "model_version": "1"})
    checked = list(longest)
    model.finalize()
    assert checked and max(checked) <= runner.SHORT_REFERENCE_TOKENS
    assert any(re.fullmatch(rf"{short_reference_texts(token_encoder)} of {len(CHECK_TEXTS)} reference texts: min "
                            r"cosine (0\.9999\d+|1\.0+) to the build's \(f32\)", m) for _, m in Logger.messages)


def test_encoder_runner_refuses_to_load_when_its_artifact_is_not_what_the_reference_was_built_from(
        bert, python_model, tmp_path):
    folder = bert["bert_encoder"]
    with np.load(folder.files["1/reference.npz"]) as data:
        reference = {name: data[name] for name in data.files}
    reference["embedding"] = np.roll(reference["embedding"], 1, axis=0)  # another model's embeddings, in effect
    np.savez(tmp_path / "reference.npz", **reference)
    tampered = ModelFolder(folder.spec, {**folder.files, "1/reference.npz": tmp_path / "reference.npz"})
    with pytest.raises(RuntimeError, match=rf"reference\.npz: embeddings of {short_reference_texts(folder)} of its "
                                           rf"{len(CHECK_TEXTS)} reference texts reach min cosine -?0\.\d+ < 0\.9999 "
                                           r"\(f32 on this CPU\): model\.xml is not the artifact the build checked; "
                                           r"rebuild"):
        python_model(tampered)


@pytest.mark.parametrize("drifting", [("bf16",), ("bf16", "bf16-guarded"), ("bf16", "bf16-guarded", "mixed")])
def test_encoder_runner_reopens_at_the_sessions_fall_back_when_its_precision_drifts_below_the_floor(
        token_encoder, tmp_path, drifting):
    """Stand-in drifting sessions (the real session plus noise, reporting the precision a CPU with bf16 computes):
    no CPU here is known to drift on the reference texts every time. The session each falls back to is real. A
    session below the floor on the short texts falls back without embedding the long ones."""
    from tests.fake_pb_utils import Logger, module
    from tritonpack.components import load_model_module

    runner = load_model_module("framework_runner", "runner_batching")
    openvino = load_model_module("framework_runner", "openvino_session")
    link_files(token_encoder, tmp_path)
    short = short_reference_texts(token_encoder)
    opened, drifted_tokens = [], []

    class DriftingRunner(runner.FrameworkRunnerModel):
        pb_utils = module()

        def open_session(self, path, params):
            opened.append(params["precision"])
            session = openvino.open_session(path, params)
            if params["precision"] not in drifting:
                return session

            def drifting_session(inputs):
                drifted_tokens.append(int(inputs["position_ids"].max()) + 1)  # a pack's longest sentence
                return {name: value + 0.05 for name, value in session(inputs).items()}
            drifting_session.computes = {"bf16": "bf16", "bf16-guarded": GUARDED,
                                         "mixed": "bf16+f32"}[params["precision"]]
            drifting_session.fallback = openvino.FALLBACK[params["precision"]]
            drifting_session.reopened = lambda precision: self.open_session(path, {**params, "precision": precision})
            return drifting_session

    Logger.messages.clear()
    model = DriftingRunner()
    model.initialize({"model_config": config_json(token_encoder), "model_repository": str(tmp_path),
                      "model_version": "1"})
    model.finalize()
    assert opened == ["bf16", "bf16-guarded", "mixed", "fp32"][:len(drifting) + 1]
    *warnings, info = [m for level, m in Logger.messages if m.startswith("bf16") or "reference texts: min" in m]
    fell_back_to = ["bf16, and the second half again in fp32 for sentences of at most 16 tokens whose token states "
                    "nearly cancel", "bf16 up to the middle layer and fp32 after", "fp32"]
    computes = ["bf16", re.escape(GUARDED), r"bf16\+f32"]
    for warning, computed, instead in zip(warnings, computes, fell_back_to, strict=False):
        assert re.fullmatch(rf"{computed} on this CPU: min cosine 0\.\d+ < 0\.9999 on {short} of the build's "
                            rf"{len(CHECK_TEXTS)} reference texts; running {instead} instead", warning)
    assert len(warnings) == len(drifting)
    assert drifted_tokens and max(drifted_tokens) <= runner.SHORT_REFERENCE_TOKENS
    # what the CPU served where nothing drifted: f32 throughout without native bf16
    served = [rf"({re.escape(GUARDED)}|f32)", r"(bf16\+f32|f32)", "f32"][len(drifting) - 1]
    checked = short if info.endswith("(f32)") else len(CHECK_TEXTS)  # f32 has nothing to fall back to
    assert re.fullmatch(rf"{checked} of {len(CHECK_TEXTS)} reference texts: min cosine (0\.9999\d+|1\.0+) to the "
                        rf"build's \({served}\)", info)


FREED_HEAP_PROBE = """
import json, sys

folder, config = sys.argv[1:]
sys.path.insert(0, folder + "/1")
import openvino_session
import runner_batching
from tests import fake_pb_utils

messages = []


class Runner(runner_batching.FrameworkRunnerModel):
    pb_utils = fake_pb_utils.module()

    def open_session(self, path, params):
        return openvino_session.open_session(path, params)

    def _log(self, level, message):
        messages.append(message)


runner = Runner()
runner.initialize({"model_config": config, "model_repository": folder, "model_version": "1"})
runner.warming.join()
print(json.dumps({"messages": messages, "trimmed_after_mb": runner_batching.return_freed_heap() / 2**20}))
"""


def test_encoder_runner_hands_back_freed_heap_and_load_only_pages_once_every_pack_length_warmed(bert, tmp_path):
    """In a fresh process, as a stub loads it: opening the session (twice where bf16 falls back), checking it and
    warming every pack length on a thread of its own free MBs of heap that glibc would keep (6-19 MB measured);
    the runner hands them back, so a malloc_trim after it finds nothing left to return. It also unmaps the library
    pages only loading read."""
    folder = bert["bert_encoder"]
    link_files(folder, tmp_path, sources=True)
    probe = json.loads(subprocess.run([sys.executable, "-c", FREED_HEAP_PROBE, str(tmp_path), config_json(folder)],
                                      capture_output=True, text=True, check=True).stdout)
    (line,) = [m for m in probe["messages"] if m.startswith("every pack length warmed")]
    returned = re.fullmatch(r"every pack length warmed; [\d.]+ MB of weights file pages released, "
                            r"([\d.]+) MB of freed heap returned, ([\d.]+) MB of library pages unmapped", line)
    assert returned and float(returned[1]) >= 1, line
    # OpenVINO's compiler and graph passes ran at load only (MiniLM: 30-40 MB of its code and data, twenty-fourth
    # round of docs/performance.md)
    assert float(returned[2]) >= 10, line
    assert probe["trimmed_after_mb"] < 0.5, probe
