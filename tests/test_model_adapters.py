"""model.py adapters outside a server, with the API-faithful fake pb_utils: batching and error isolation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fake_pb_utils import InferenceRequest, Tensor, TritonError
from tests.reliability.soak import EMBEDDING_ATOL
from tests.texts import assert_embeddings_match


@pytest.fixture(scope="module")
def bert(model_folders):
    return model_folders("bert", "portable")


def _texts(*texts: bytes) -> InferenceRequest:
    return InferenceRequest([Tensor("TEXT", np.array([[t] for t in texts], dtype=object))])


def test_tokenizer_model_fails_only_the_bad_request_when_batch_mixes_valid_and_invalid(bert, python_model):
    model = python_model(bert["bert_tokenizer"])
    responses = model.execute([_texts(b"hello"), _texts(b"\xc3\x28"), _texts(b"a longer sentence", b"")])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    first = {t.name(): t.as_numpy() for t in responses[0].output_tensors()}
    third = {t.name(): t.as_numpy() for t in responses[2].output_tensors()}
    assert first["input_ids"].shape == (1, 3) and third["input_ids"].shape == (2, 5)
    assert set(first) == {"input_ids", "attention_mask", "token_type_ids"}


def test_tokenizer_model_reports_missing_input_when_request_lacks_text(bert, python_model):
    model = python_model(bert["bert_tokenizer"])
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
    for t, a, tok in zip(together, alone, tokens):
        assert t.shape == a.shape == (len(tok["input_ids"]), 384)  # the packed encoder pools: one row per text
        np.testing.assert_allclose(t, a, atol=EMBEDDING_ATOL)  # bf16: packed with others or alone, nearly equal
        assert_embeddings_match(t, a)


def test_packed_encoder_fails_only_the_request_whose_mask_is_not_right_padded(bert, python_model):
    encoder = python_model(bert["bert_encoder"])
    assert "max_pack_tokens" in dict(bert["bert_encoder"].spec.parameters)

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


def test_pooling_model_splits_results_per_request_when_batched(model_folders, python_model):
    model = python_model(model_folders("bert", "cpu")["bert_pooling"])  # portable bert pools in its encoder
    rng = np.random.default_rng(0)
    requests = [InferenceRequest([Tensor("token_embeddings", rng.normal(size=(b, s, 384)).astype(np.float32)),
                                  Tensor("attention_mask", np.ones((b, s), dtype=np.int64))])
                for b, s in ((1, 4), (3, 9))]
    together = [r.output_tensors()[0].as_numpy() for r in model.execute(requests)]
    alone = [model.execute([r])[0].output_tensors()[0].as_numpy() for r in requests]
    assert [t.shape for t in together] == [(1, 384), (3, 384)]
    for t, a in zip(together, alone):
        np.testing.assert_allclose(t, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, rtol=1e-5)
