"""Tokenizer logic without a server: same ids as sentence-transformers, truncation, padding, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.texts import LONG, SENTENCES
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.components import load_model_module

tokenize_text = load_model_module("tokenizer", "tokenize_text")
ClientError, TextTokenizer, decode_texts = tokenize_text.ClientError, tokenize_text.TextTokenizer, \
    tokenize_text.decode_texts


@pytest.fixture(scope="module")
def source():
    return SentenceTransformerSource.resolve(None)


@pytest.fixture(scope="module")
def tokenizer(source):
    return TextTokenizer(str(source.path / "tokenizer.json"), source.max_seq_length, source.pad_token,
                         with_token_type_ids=True)


@pytest.fixture(scope="module")
def reference(source):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(source.path), device="cpu")


def test_tokenizer_matches_sentence_transformers_when_batch_is_varied(tokenizer, reference):
    ours = tokenizer(SENTENCES)
    theirs = reference.tokenize(SENTENCES)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours[name], theirs[name].numpy(), err_msg=name)


def test_tokenizer_truncates_at_max_sequence_length_when_text_is_long(tokenizer, source):
    ids = tokenizer([LONG])["input_ids"]
    assert source.max_seq_length == 256
    assert ids.shape == (1, 256)
    assert ids[0, -1] == tokenizer.tokenizer.token_to_id("[SEP]")


def test_tokenizer_pads_to_longest_when_lengths_differ(tokenizer):
    out = tokenizer(["short", "a much longer sentence than the first one"])
    mask = out["attention_mask"]
    assert mask.shape[1] == mask[1].sum()  # longest has no padding
    assert mask[0].sum() == 3  # [CLS] short [SEP]
    assert (out["input_ids"][0, 3:] == 0).all()


def test_tokenizer_gives_cls_sep_when_text_is_empty(tokenizer):
    out = tokenizer([""])
    assert out["input_ids"].tolist() == [[101, 102]]
    assert out["attention_mask"].tolist() == [[1, 1]]


def test_per_request_trims_each_request_to_its_own_longest_when_batched(tokenizer):
    requests = [["tiny"], ["one longer sentence here", "x"], [""]]
    parts = tokenizer.per_request(requests)
    whole = tokenizer([t for r in requests for t in r])
    assert [p["input_ids"].shape for p in parts] == [(1, 3), (2, 6), (1, 2)]
    np.testing.assert_array_equal(parts[1]["input_ids"], whole["input_ids"][1:3, :6])


def test_decode_texts_rejects_request_when_bytes_are_not_utf8():
    with pytest.raises(ClientError, match="not valid UTF-8"):
        decode_texts(np.array([[b"ok"], [b"\xff\xfe"]], dtype=object), max_text_bytes=100)


def test_decode_texts_rejects_request_when_text_exceeds_byte_limit():
    with pytest.raises(ClientError, match="exceeds the limit of 10"):
        decode_texts(np.array([[b"x" * 11]], dtype=object), max_text_bytes=10)


def test_decode_texts_keeps_unicode_when_bytes_are_utf8():
    texts = ["Ünïcödé 🚀", "中文", ""]
    array = np.array([[t.encode()] for t in texts], dtype=object)
    assert decode_texts(array, max_text_bytes=100) == texts
